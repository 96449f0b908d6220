#!/usr/bin/env bash
# The gateway's WireGuard-over-TCP listener under attack, in three network namespaces
# created and removed here:
#
#   ns C: wireguard-go (10.98.9.2) -> riceguard udp2tcp --TCP--+
#         10.98.1.2                                            |
#   ns G: riceguard -f (drop-in, `wg set`), UDP+TCP 51830 <----+---- ns X: attacker
#         10.98.1.1 | 10.98.2.1, fd98:2::1     10.98.2.2 + 200 IPv4 addresses,
#         tunnel 10.98.9.1                     fd98:2::2 + 50 addresses in one /64
#
# Attacks (ci/lib/tcp_attack.py in ns X, each bounded in count and time):
#   a1  3000 connections from one IPv6 /64 (50 addresses)
#   a2  3000 connections from 200 IPv4 addresses
#   b   silent connections and slow-loris clients (one byte a second)
#   c   random bytes, well-framed garbage, 65535-byte length prefixes and the largest
#       accepted frames (65507 bytes, then a partial one)
# During each attack the legitimate client opens a new TCP connection (udp2tcp
# restarted) and pings through the tunnel; after it, it pings again. Checked: the
# client connects and passes traffic, the gateway refused/evicted/closed as designed
# (its counters, from the "TCP transport counters" log line), its RSS stays below
# 2 x before + 16 MB. Prints per attack what was sent and what the gateway did.
# Needs root, wireguard-go, wireguard-tools, python3. About 2 minutes.
# Prints "N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init adversarial-tcp

require_rg
for t in wireguard-go wg python3 ss; do
    command -v $t >/dev/null || h_abort "missing tool $t"
done
WORK=$(mktemp -d /tmp/rg-adv-tcp.XXXXXX)
G=rgxG$$ C=rgxC$$ X=rgxX$$
IG=rgx$$g IC=rgx$$c
PORT=51830
ATTACK="python3 $(pwd)/ci/lib/tcp_attack.py"

cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    ip netns del $G 2>/dev/null; ip netns del $C 2>/dev/null; ip netns del $X 2>/dev/null
    rm -f /var/run/wireguard/$IG.sock /var/run/wireguard/$IC.sock
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

# --- namespaces and addresses ---------------------------------------------------------
netns_add $G $C $X
veth_pair $G gc 10.98.1.1/24 $C cg 10.98.1.2/24
veth_pair $G gx 10.98.2.1/24 $X xg -
ip -n $G addr add fd98:2::1/64 dev gx nodad
{
    echo "addr add 10.98.2.2/24 dev xg"
    echo "addr add fd98:2::2/64 dev xg nodad"
    for i in $(seq 10 209); do echo "addr add 10.98.2.$i/24 dev xg"; done
    for i in $(seq 0 49); do printf 'addr add fd98:2::%x/64 dev xg nodad\n' $((0x1000 + i)); done
} | ip -n $X -batch -
V4_MANY=$(seq -s, -f '10.98.2.%g' 10 209)
V6_ONE64=$(for i in $(seq 0 49); do printf 'fd98:2::%x,' $((0x1000 + i)); done)
v4_first() { seq -s, -f '10.98.2.%g' 10 $((9 + $1)); }   # the first N of the 200

# --- gateway and legitimate client ------------------------------------------------------
kg=$(wg genkey); kc=$(wg genkey)
RG_LOG=info ip netns exec $G "$RG" -f $IG >"$WORK/g.log" 2>&1 & GPID=$!; PIDS+=($GPID)
wait_for 5 eval '[ -S /var/run/wireguard/$IG.sock ]'
ip netns exec $G wg set $IG private-key <(echo "$kg") listen-port $PORT \
    peer "$(echo "$kc" | wg pubkey)" allowed-ips 10.98.9.2/32
ip -n $G addr add 10.98.9.1/24 dev $IG; ip -n $G link set $IG up
wait_for 5 eval 'ip netns exec $G ss -Hltn "sport = :$PORT" | grep -q .'

U2T=
start_u2t() {
    ip netns exec $C "$RG" udp2tcp --udp-listen 127.0.0.1:51900 --tcp-forward 10.98.1.1:$PORT \
        --nodelay >>"$WORK/u2t.log" 2>&1 & U2T=$!; PIDS+=($U2T)
    local i
    wait_for 5 eval 'ip netns exec $C ss -Hlun "sport = :51900" | grep -q .' && return 0
    return 1
}
# A new TCP connection from the legitimate client: the old relay goes, a new one connects.
legit_reconnect() {
    [ -n "$U2T" ] && stop_pid "$U2T"
    start_u2t
}
# Ping through the tunnel: prints the loss in percent.
ping_loss() {
    ip netns exec $C ping -c "$1" -i 0.2 -W 2 10.98.9.1 2>/dev/null |
        grep -o '[0-9.]*% packet loss' | cut -d% -f1 | grep . || echo 100
}

start_u2t
ip netns exec $C env WG_PROCESS_FOREGROUND=1 wireguard-go $IC >"$WORK/c.log" 2>&1 & PIDS+=($!)
wait_for 5 eval '[ -S /var/run/wireguard/$IC.sock ]'
ip netns exec $C wg set $IC private-key <(echo "$kc") \
    peer "$(echo "$kg" | wg pubkey)" allowed-ips 10.98.9.1/32 endpoint 127.0.0.1:51900 persistent-keepalive 25
ip -n $C addr add 10.98.9.2/24 dev $IC
ip -n $C link set $IC mtu 1366 up
up=0
for i in $(seq 10); do ip netns exec $C ping -c1 -W1 10.98.9.1 >/dev/null 2>&1 && { up=1; break; }; done
if [ $up = 1 ]; then ok "setup: wireguard-go -> udp2tcp -> TCP -> riceguard: tunnel up"
else bad "setup: tunnel over TCP not up"; tail -5 "$WORK/g.log"; h_finish; fi
l=$(ping_loss 10)
[ "$l" = 0 ] && ok "baseline ping over TCP: 0% loss" || bad "baseline ping over TCP: $l% loss"

# --- helpers for the attacks -----------------------------------------------------------
rss() { awk '/^VmRSS/{print $2}' /proc/$GPID/status; }
hwm() { awk '/^VmHWM/{print $2}' /proc/$GPID/status; }
# The latest counter line, as "key=value ..." (zeros before the first one).
counters() {
    local l
    l=$(grep -o 'TCP transport counters: .*' "$WORK/g.log" | tail -1 | sed 's/^TCP transport counters: //')
    echo "${l:-accepted=0}"
}
# counter KEY LINE
counter() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | grep . || echo 0; }
delta() { echo $(($(counter "$1" "$3") - $(counter "$1" "$2"))); }
# field KEY attacker-line
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

RSS0=$(rss)
echo "gateway RSS at start: ${RSS0} kB (peak so far $(hwm) kB)"

# run_attack NAME: starts the attacker commands given in ATTACKERS (one per line, each
# "name mode count rate sources target"), reconnects the legitimate client during the
# attack, waits for the attackers, pings again and reports.
run_attack() {
    local name=$1 before rss_before hwm_before apids=() line n mode count rate src tgt p
    before=$(counters); rss_before=$(rss); hwm_before=$(hwm)
    local log0; log0=$(wc -l <"$WORK/g.log")
    echo
    echo "=== attack $name ==="
    while read -r n mode count rate src tgt; do
        [ -n "$n" ] || continue
        ip netns exec $X $ATTACK --name "$n" --mode "$mode" --count "$count" --rate "$rate" \
            --sources "$src" --target "$tgt" --duration 25 >"$WORK/$n.out" 2>&1 &
        apids+=($!); PIDS+=($!)
    done <<<"$ATTACKERS"
    sleep 1
    local t0=$SECONDS during after
    legit_reconnect || echo "     (udp2tcp did not bind in time)"
    during=$(ping_loss 10)
    for p in "${apids[@]}"; do forget_pid "$p"; done
    after=$(ping_loss 5)
    # The counter line is logged at most every 5 s: let the last changes show.
    sleep 5.5
    local now_c rss_after hwm_after
    now_c=$(counters); rss_after=$(rss); hwm_after=$(hwm)
    while read -r n _; do
        [ -n "$n" ] || continue
        echo "  sent:   $(cat "$WORK/$n.out")"
    done <<<"$ATTACKERS"
    echo "  gateway: refused_per_prefix=$(delta refused_per_prefix "$before" "$now_c")" \
        "refused_full=$(delta refused_full "$before" "$now_c")" \
        "evicted=$(delta evicted "$before" "$now_c")" \
        "accepted=$(delta accepted "$before" "$now_c")" \
        "deadline_closed=$(delta deadline_closed "$before" "$now_c")" \
        "partial_closed=$(delta partial_closed "$before" "$now_c")" \
        "bad_frame=$(delta bad_frame "$before" "$now_c")" \
        "open_now=$(counter open "$now_c") unauthenticated_now=$(counter unauthenticated "$now_c")"
    echo "  log:    $(( $(wc -l <"$WORK/g.log") - log0 )) gateway log lines during the attack"
    echo "  RSS:    before ${rss_before} kB, after ${rss_after} kB (peak ${hwm_before} -> ${hwm_after} kB)"
    echo "  legit:  new TCP connection during the attack, ping loss ${during}% (10 pings); after: ${after}% (5 pings)"
    LAST_BEFORE=$before LAST_NOW=$now_c
    if [ "${during%.*}" -le 20 ] && [ "$after" = 0 ]; then
        ok "$name: legitimate client connected during the attack and passed traffic (loss ${during}% during, ${after}% after)"
    else
        bad "$name: legitimate traffic: loss ${during}% during, ${after}% after"
    fi
    if [ "$rss_after" -lt $((2 * rss_before + 16384)) ] && [ "$hwm_after" -lt $((2 * RSS0 + 16384)) ]; then
        ok "$name: gateway RSS bounded (${rss_before} -> ${rss_after} kB, peak ${hwm_after} kB)"
    else
        bad "$name: gateway RSS ${rss_before} -> ${rss_after} kB, peak ${hwm_after} kB (limit 2x+16 MB)"
    fi
    kill -0 $GPID 2>/dev/null || bad "$name: gateway died"
}

out() { cat "$WORK/$1.out"; }
d() { delta "$1" "$LAST_BEFORE" "$LAST_NOW"; }

# --- a1: thousands of connections from one /64 ----------------------------------------
ATTACKERS="a1-one64 silent 3000 1000 $V6_ONE64 [fd98:2::1]:$PORT"
run_attack a1
o=$(out a1-one64)
# Held = kept open until the deadline; the refused are reset right after accept.
[ "$(d refused_per_prefix)" -ge 2900 ] && [ "$(field still_open "$o")" = 0 ] && [ "$(field closed_5_12s "$o")" -le 8 ]
check_rc $? "a1: one /64 (50 addresses) got $(field closed_5_12s "$o") connections held (limit 8 unauthenticated per /64), $(d refused_per_prefix) refused, none left open"

# --- a2: thousands of connections from 200 addresses -----------------------------------
ATTACKERS="a2-many silent 3000 1000 $V4_MANY 10.98.2.1:$PORT"
run_attack a2
o=$(out a2-many)
# Held to the deadline = what the table kept when the flood stopped (the attacker's own
# peak_open also counts connections whose RST it has not read yet).
[ "$(d evicted)" -gt 0 ] && [ "$(field still_open "$o")" = 0 ] && [ "$(field closed_5_12s "$o")" -le 240 ]
check_rc $? "a2: 200 addresses got $(field closed_5_12s "$o") connections held (240 inbound slots of 256), $(d evicted) evicted, $(d refused_per_prefix) refused per prefix, none left open"

# --- b: silent and slow-loris clients ---------------------------------------------------
ATTACKERS="b-silent silent 80 200 $(v4_first 10) 10.98.2.1:$PORT
b-loris loris 40 200 fd98:2::2 [fd98:2::1]:$PORT
b-loris4 loris 40 200 $(seq -s, -f '10.98.2.%g' 100 104) 10.98.2.1:$PORT"
run_attack b
s=$(out b-silent) l6=$(out b-loris) l4=$(out b-loris4)
est=$(( $(field established "$s") + $(field established "$l4") ))
dl=$(( $(field closed_5_12s "$s") + $(field closed_5_12s "$l4") ))
[ "$est" -gt 0 ] && [ "$dl" = "$est" ] && [ "$(field closed_lt1s "$l6")" -ge 30 ] &&
    [ "$(field still_open "$s")$(field still_open "$l6")$(field still_open "$l4")" = 000 ]
check_rc $? "b: $dl of $est silent/slow-loris connections closed at the authentication deadline (median life $(field median_life_s "$s") s / $(field median_life_s "$l4") s); from one address $(field closed_lt1s "$l6") of 40 refused at once"

# --- c: garbage and maximum-length frames -----------------------------------------------
ATTACKERS="c-random random 100 200 $(v4_first 20) 10.98.2.1:$PORT
c-framed framed 50 200 $(seq -s, -f '10.98.2.%g' 30 39) 10.98.2.1:$PORT
c-toolong toolong 50 200 $(seq -s, -f '10.98.2.%g' 40 49) 10.98.2.1:$PORT
c-maxframe maxframe 150 200 $(seq -s, -f '10.98.2.%g' 50 199) 10.98.2.1:$PORT"
run_attack c
r=$(out c-random) f=$(out c-framed) t=$(out c-toolong) m=$(out c-maxframe)
[ "$(field closed_lt1s "$r")" = "$(field established "$r")" ] && [ "$(field closed_lt1s "$t")" = "$(field established "$t")" ]
check_rc $? "c: random bytes and 65535-byte length prefixes closed within 1 s ($(field closed_lt1s "$r")/$(field established "$r"), $(field closed_lt1s "$t")/$(field established "$t"); bad_frame +$(d bad_frame))"
[ "$(field closed_5_12s "$f")" = "$(field established "$f")" ] && [ "$(field established "$f")" -gt 0 ]
check_rc $? "c: well-framed garbage ($(field bytes "$f") bytes sent) did not keep connections open: $(field closed_5_12s "$f")/$(field established "$f") closed at the deadline (median life $(field median_life_s "$f") s)"
[ "$(field still_open "$m")" = 0 ] && [ "$(field established "$m")" -gt 0 ]
check_rc $? "c: largest accepted frames: $(field established "$m") connections, $(field bytes "$m") bytes, all closed (median life $(field median_life_s "$m") s)"

# --- after everything ---------------------------------------------------------------------
echo
final=$(counters)
echo "gateway counters at the end: $final"
echo "gateway RSS: start ${RSS0} kB, end $(rss) kB, peak $(hwm) kB"
l=$(ping_loss 10)
[ "$l" = 0 ] && ok "after all attacks: ping over TCP 0% loss" || bad "after all attacks: ping loss $l%"
[ "$(counter unauthenticated "$final")" = 0 ] && ok "no unauthenticated connection left on the gateway" ||
    bad "unauthenticated connections left: $(counter unauthenticated "$final")"

echo
h_finish
