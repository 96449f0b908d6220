#!/usr/bin/env bash
# The UAPI socket under hostile or clumsy local clients, in two network namespaces:
#
#   ns rgauA<pid>: riceguard -f rgau<pid>a (10.96.1.1)  --- veth ---  ns rgauB<pid>: wireguard-go (10.96.1.2)
#
# 1. The socket file is private: mode 0600-ish, no group or world access.
# 2. Silent clients, half-request clients and slow-loris clients (one byte a second),
#    more of them than the server serves at once, hold the socket: `timeout 5 wg show`
#    still answers, every time, quickly; the daemon's thread count stays bounded; a
#    set cut off inside a line is not applied.
# 3. `wg set listen-port P` with UDP P held by another program fails (errno, like
#    wireguard-go); the old port keeps working (ping through the tunnel, same session:
#    no new handshake), the peer is intact.
# 4. The same with only TCP P held (drop-in mode listens for the TCP fallback on the
#    UDP port): refused, nothing changed.
# 5. A set to a free port works (the failures above did not wedge anything).
# Needs root, wireguard-tools, wireguard-go, python3. Prints "N passed, N failed";
# exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init adversarial-uapi

require_rg
WORK=$(mktemp -d /tmp/rg-adv-uapi.XXXXXX)
A=rgauA$$ B=rgauB$$
IA=rgau$$a IB=rgau$$b
SOCK=/var/run/wireguard/$IA.sock
PORT=51830 PORT_UDP_BUSY=51899 PORT_TCP_BUSY=51898 PORT_FREE=51897

cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
    rm -f "$SOCK" /var/run/wireguard/$IB.sock
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

netns_add $A $B
veth_pair $A va$$ 10.96.0.1/24 $B vb$$ 10.96.0.2/24

RG_LOG=info ip netns exec $A "$RG" -f $IA >"$WORK/rg.log" 2>&1 & RGPID=$!; PIDS+=($RGPID)
ip netns exec $B env WG_PROCESS_FOREGROUND=1 wireguard-go $IB >"$WORK/wg-go.log" 2>&1 & PIDS+=($!)
wait_for 5 eval '[ -S "$SOCK" ] && [ -S /var/run/wireguard/$IB.sock ]'
ka=$(wg genkey); kb=$(wg genkey)
PA=$(echo "$ka" | wg pubkey); PB=$(echo "$kb" | wg pubkey)
ip netns exec $A wg set $IA private-key <(echo "$ka") listen-port $PORT \
    peer "$PB" allowed-ips 10.96.1.2/32
ip netns exec $B wg set $IB private-key <(echo "$kb") \
    peer "$PA" allowed-ips 10.96.1.1/32 endpoint 10.96.0.1:$PORT
ip -n $A addr add 10.96.1.1/24 dev $IA; ip -n $A link set $IA up
ip -n $B addr add 10.96.1.2/24 dev $IB; ip -n $B link set $IB up

ping_ok() { ip netns exec $B ping -c 3 -i 0.2 -W 2 10.96.1.1 >/dev/null 2>&1; }
handshake() { ip netns exec $A wg show $IA latest-handshakes | awk '{print $2}'; }
threads() { awk '/^Threads:/ {print $2}' /proc/$RGPID/status 2>/dev/null; }

if ping_ok; then ok "tunnel up: wireguard-go -> riceguard ping"; else bad "tunnel not up"; tail -5 "$WORK/rg.log"; fi

# --- 1. socket file mode ---------------------------------------------------------------
mode=$(stat -c %a "$SOCK")
if [ -S "$SOCK" ] && [ $((8#$mode & 8#077)) = 0 ] && [ "$(stat -c %u "$SOCK")" = 0 ]; then
    ok "UAPI socket $SOCK is mode $mode, owned by root (no group/world access)"
else
    bad "UAPI socket mode $mode owner $(stat -c %u "$SOCK")"
fi

# --- 2. silent, half and slow-loris clients ------------------------------------------------
base_threads=$(threads)
python3 ci/lib/labtool.py uapi-clients "$SOCK" "$WORK/clients.ready" >"$WORK/clients.log" 2>&1 &
CLIENTS=$!; PIDS+=($CLIENTS)
wait_for 5 eval '[ -s "$WORK/clients.ready" ]'
sleep 1
worst=0 answered=0
for i in $(seq 8); do
    t0=$(date +%s%N)
    if timeout 5 ip netns exec $A wg show $IA >/dev/null 2>&1; then answered=$((answered + 1)); fi
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ $ms -gt $worst ] && worst=$ms
    sleep 1
done
if [ $answered = 8 ] && [ $worst -lt 2000 ]; then
    ok "wg show answered 8/8 with 60 silent/half/slow clients holding the socket (slowest ${worst} ms)"
else
    bad "wg show answered $answered/8 under slow clients (slowest ${worst} ms)"
fi
flood_threads=$(threads)
if [ -n "$flood_threads" ] && [ "$flood_threads" -le $((base_threads + 20)) ]; then
    ok "daemon threads bounded under the client flood: $base_threads -> $flood_threads"
else
    bad "daemon threads: $base_threads -> ${flood_threads:-gone}"
fi
# A `set` goes through too.
if timeout 5 ip netns exec $A wg set $IA peer "$PB" persistent-keepalive 0; then
    ok "wg set answered while the slow clients hold the socket"
else
    bad "wg set blocked by slow clients"
fi
kill $CLIENTS 2>/dev/null; wait $CLIENTS 2>/dev/null
kill -0 $RGPID 2>/dev/null && ok "daemon alive after the client flood" || bad "daemon died under the client flood"
# A client gone in the middle of a line: its set is not applied (`listen_port=4` could
# be the front of `listen_port=48000`).
python3 ci/lib/labtool.py uapi-cut "$SOCK" >"$WORK/cut.out" 2>&1
lp=$(ip netns exec $A wg show $IA listen-port)
[ "$lp" = $PORT ] && ok "set cut off inside a line: not applied ($(tr '\n' ' ' <"$WORK/cut.out"))" ||
    bad "set cut off inside a line moved the port to $lp"

# --- 3. listen-port already in use (UDP) -------------------------------------------------
hold() { # $1 = udp|tcp, $2 = port: hold it in namespace A until killed
    ip netns exec $A python3 ci/lib/labtool.py hold "$1" "$2" "$WORK/hold.$1.ready" &
    HOLD=$!; PIDS+=($HOLD)
    wait_for 5 eval '[ -s "$WORK/hold.$1.ready" ]'
}

failed_set() { # $1 = what is held, $2 = the busy port
    local hs_before peers_before out rc
    hs_before=$(handshake)
    peers_before=$(ip netns exec $A wg show $IA dump | tail -n +2 | cut -f1,4)
    out=$(timeout 5 ip netns exec $A wg set $IA listen-port "$2" 2>&1); rc=$?
    if [ $rc != 0 ] && [ $rc != 124 ]; then
        ok "$1 port $2 in use: wg set refused (rc=$rc: $(echo "$out" | tr '\n' ' '))"
    else
        bad "$1 port $2 in use: wg set rc=$rc $out"
    fi
    local lp; lp=$(ip netns exec $A wg show $IA listen-port)
    [ "$lp" = $PORT ] && ok "$1: listen port still $PORT" || bad "$1: listen port now $lp"
    if ip netns exec $A ss -Hlun "sport = :$PORT" | grep -q . && ip netns exec $A ss -Hltn "sport = :$PORT" | grep -q .; then
        ok "$1: riceguard still bound to UDP and TCP $PORT"
    else
        bad "$1: old sockets gone: $(ip netns exec $A ss -Hluntp | tr '\n' ' ')"
    fi
    [ "$(ip netns exec $A wg show $IA dump | tail -n +2 | cut -f1,4)" = "$peers_before" ] &&
        ok "$1: peer and allowed IPs unchanged" || bad "$1: peers changed"
    if ping_ok && [ "$(handshake)" = "$hs_before" ]; then
        ok "$1: old port carries traffic, same session (no new handshake)"
    else
        bad "$1: traffic after the failed set (handshake $hs_before -> $(handshake))"
    fi
}

hold udp $PORT_UDP_BUSY
failed_set UDP $PORT_UDP_BUSY
kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null

# --- 4. TCP port in use ----------------------------------------------------------------------
hold tcp $PORT_TCP_BUSY
failed_set TCP $PORT_TCP_BUSY
kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null

# --- 5. a set to a free port still works --------------------------------------------------------
if timeout 5 ip netns exec $A wg set $IA listen-port $PORT_FREE &&
    [ "$(ip netns exec $A wg show $IA listen-port)" = $PORT_FREE ]; then
    ip netns exec $B wg set $IB peer "$PA" endpoint 10.96.0.1:$PORT_FREE
    if ping_ok && ! ip netns exec $A ss -Hlun "sport = :$PORT" | grep -q .; then
        ok "listen-port $PORT -> $PORT_FREE: applied, old port released, ping over the new one"
    else
        bad "after moving to $PORT_FREE: no ping or old port still bound"
    fi
else
    bad "wg set listen-port $PORT_FREE (free) failed"
fi
kill -0 $RGPID 2>/dev/null && ok "daemon still running" || bad "daemon died"

echo
h_finish
