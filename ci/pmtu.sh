#!/usr/bin/env bash
# Path MTU discovery through the appliance's firewall, end to end with the release binary
# (`riceguard up --config FILE`, Firewall on by default) and stock wireguard-go peers in
# network namespaces rgt<pid>-29<x> (ci/lib/wgnet.py's sweep_stale() removes them if a
# run dies without cleaning up).
#
#   ns G appliance `upl` 192.0.2.2/24, ──── ns R router ─┬─ rs ═══ MTU 1400 (IPv6: 1280) ═══ ns S
#        2001:db8:2::2/64                 forwards, sends │      198.51.100.2, 2001:db8:5::2    two wireguard-go:
#        tunnel 10.100.0.1/24             frag-needed/PTB │                                     s4 (outer IPv4) 10.100.0.2
#        iperf3 server on 10.100.0.1                      │                                     s6 (outer IPv6) 10.100.0.4
#                                                         └─ rf ─── MTU 1500 ───────────────── ns F
#                                                                203.0.113.2                   wireguard-go f 10.100.0.3
#
# The far link's MTU is the link's own on both ends (as on a real link): S's kernel
# fragments its own full-size datagrams toward G, and R refuses G's DF datagrams above
# it with an ICMP "fragmentation needed" (MTU 1400) or ICMPv6 "packet too big" (1280),
# which G's firewall must let in (they quote untracked WireGuard datagrams).
#   (1) outer IPv4 (s4), then outer IPv6 (s6): iperf3 -n 8M through the tunnel in both
#       directions completes (bounded by a timeout); G learnt the path MTU (`ip route
#       get` shows 1400 / 1280); R sent ICMP errors; a 1420-byte inner packet (ping -s
#       1392 -M do from G, DF inside) is answered, and how it crossed the far link is
#       counted (fragments of G's datagram, or one datagram).
#   (2) F on a full-MTU path afterwards: iperf3 -n 32M from G to F completes, G's uplink
#       capture shows UDP super-datagrams (GSO, longer than the link MTU) toward F, and
#       `riceguard status` says `udp gso: on` on every socket after it.
# What fails without what this checks (measured on 6.18 when the lab was written):
#   - the input chain's accept rules for ICMP errors quoting our udp/51820 datagrams
#     deleted by hand (nft delete rule ... handle) after start: G never learns the path
#     MTU, the errors count as `invalid`, the 1420-byte pings are lost (1480/1500-byte
#     DF datagrams) and the transfers toward S move nothing after the first segments;
#   - the io_uring engine dropping a GSO batch the kernel refused (EMSGSIZE since 6.14:
#     segments above the learnt path MTU): every batch toward S lost, the G -> S
#     transfers stall in both families (IoUring = off passed).
# RG_PMTU_GATEWAY adds a line to the appliance's [Gateway] (e.g. "IoUring = off").
#
# Needs root, wireguard-go, wireguard-tools, iperf3, iproute2, tcpdump, ping.
# riceguard is $RG_BIN (default target/release/riceguard). About 15 s.
# Prints "pmtu: N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.." || exit 1
. ci/lib/harness.sh
h_init pmtu
require_rg
require_tools wireguard-go wg ip iperf3 tcpdump ping ss python3

ID=$$
G=rgt$ID-29g R=rgt$ID-29r S=rgt$ID-29s F=rgt$ID-29f
TG=rgm${ID}g WS4=rgm${ID}s4 WS6=rgm${ID}s6 WF=rgm${ID}f
WORK=$(mktemp -d /tmp/rgm-pmtu.XXXXXX)
STATUS=/run/riceguard/$TG.status
XFER=$((8 << 20)) BULK=$((32 << 20))

cleanup() {
    local i
    for i in $TG $WS4 $WS6 $WF; do rm -f "/var/run/wireguard/$i.sock"; done
    rm -f "$STATUS"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

listening() { [ -n "$(inns "$1" ss -Hltn "sport = :$2")" ]; }
ping_ok() { # NS DST: a reply within 8 one-second tries (the first may wait for a handshake)
    local i
    for i in $(seq 8); do inns "$1" ping -n -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    return 1
}
# xfer NS SERVER PORT BYTES: a bounded iperf3 transfer of BYTES from SERVER:PORT to NS
# (`-R`: the client in NS receives, so its count is all that arrived); true when all of
# it arrived within 25 s. The bytes received go into $WORK/last.
xfer() {
    : >"$WORK/last"
    inns "$1" timeout 25 iperf3 -c "$2" -p "$3" -R -n "$4" --connect-timeout 3000 -J >"$WORK/iperf.json" 2>&1 || return 1
    received >"$WORK/last"
    # At least what was asked: the sender may overshoot -n by part of a write (seen:
    # 8389944 for 8388608 under load).
    [ "$(cat "$WORK/last")" -ge "$4" ] 2>/dev/null
}
# received: the bytes iperf3's receiving side counted in $WORK/iperf.json.
received() {
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(int(j["end"]["sum_received"]["bytes"]))' "$WORK/iperf.json" 2>/dev/null
}
# pmtu_is NS DST MTU: the kernel's route to DST carries the learnt MTU.
pmtu_is() { ip -n "$1" route get "$2" 2>/dev/null | grep -q "mtu $3"; }
# Captures: tcpdump text, at most 60 s.
declare -A CAP
cap_start() { # NAME NS IFACE FILTER
    : >"$WORK/$1.err"
    spawn ip netns exec "$2" timeout 60 tcpdump -i "$3" -nn -l -U -v "$4" >"$WORK/$1.cap" 2>"$WORK/$1.err"
    CAP[$1]=$!
    wait_for 5 grep -q "listening on" "$WORK/$1.err"
}
cap_stop() { sleep 0.5; stop_pid "${CAP[$1]}"; }
# frags CAPTURE: the IP packets of a `tcpdump -v` capture: how many, how many of them
# fragments, and their IP lengths.
frags() {
    awk '/ IP6? \(/ {
            n++
            if (/flags \[\+\]|offset [1-9]|frag \(/) f++
            if (match($0, /(payload length: |, length )[0-9]+/)) l[substr($0, RSTART, RLENGTH)]++
        }
        END {
            printf "%d IP packet(s), %d of them fragments; sizes:", n, f
            for (k in l) printf " %s x%d", k, l[k]
        }' "$1"
}
# gso_line: the `udp gso:` line of the daemon's status.
gso_line() { inns $G "$RG" status "$TG" 2>/dev/null | grep '^udp gso:'; }
gso_on() { gso_line | grep -qx "udp gso: on"; }

# ---- the namespaces ---------------------------------------------------------------------
netns_add $G $R $S $F
for n in $G $R $S $F; do
    inns "$n" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
inns $R sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
veth_pair $G upl 192.0.2.2/24 $R rg 192.0.2.1/24
veth_pair $R rs 198.51.100.1/24 $S eth0 198.51.100.2/24
veth_pair $R rf 203.0.113.1/24 $F eth0 203.0.113.2/24
# The small hop: MTU 1400 on both ends, IPv6's own 1280 (net.ipv6.conf.IF.mtu).
ip -n $R link set rs mtu 1400
ip -n $S link set eth0 mtu 1400
inns $R sysctl -qw net.ipv6.conf.rs.mtu=1280
inns $S sysctl -qw net.ipv6.conf.eth0.mtu=1280
ip -n $G addr add 2001:db8:2::2/64 dev upl nodad
ip -n $R addr add 2001:db8:2::1/64 dev rg nodad
ip -n $R addr add 2001:db8:5::1/64 dev rs nodad
ip -n $S addr add 2001:db8:5::2/64 dev eth0 nodad
ip -n $R addr add 2001:db8:6::1/64 dev rf nodad
ip -n $F addr add 2001:db8:6::2/64 dev eth0 nodad
ip -n $G route add default via 192.0.2.1
ip -n $G -6 route add default via 2001:db8:2::1
for n in $S $F; do
    gw4=198.51.100.1 gw6=2001:db8:5::1
    [ "$n" = "$F" ] && gw4=203.0.113.1 gw6=2001:db8:6::1
    ip -n "$n" route add default via "$gw4"
    ip -n "$n" -6 route add default via "$gw6"
done
check "outer IPv4: G reaches S through R" ping_ok $G 198.51.100.2
check "outer IPv6: G reaches S through R" ping_ok $G 2001:db8:5::2

# ---- the appliance -----------------------------------------------------------------------
kg=$("$RG" genkey); pg=$(echo "$kg" | "$RG" pubkey)
ks4=$(wg genkey) ks6=$(wg genkey) kf=$(wg genkey)
cat >"$WORK/g.conf" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.100.0.1/24

[Peer]
Name = small4
PublicKey = $(echo "$ks4" | wg pubkey)
AllowedIPs = 10.100.0.2/32

[Peer]
Name = small6
PublicKey = $(echo "$ks6" | wg pubkey)
AllowedIPs = 10.100.0.4/32

[Peer]
Name = full
PublicKey = $(echo "$kf" | wg pubkey)
AllowedIPs = 10.100.0.3/32

[Gateway]
InterfaceName = $TG
HugePages = off
${RG_PMTU_GATEWAY:-}
EOF
chmod 600 "$WORK/g.conf"
spawn env RG_LOG="${RG_PMTU_LOG:-info}" ip netns exec $G "$RG" up --config "$WORK/g.conf" --workers 1 >"$WORK/g.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TG.sock ] && ip -n $G -o link show $TG 2>/dev/null | grep -q ',UP'"; then
    ok "riceguard up --config is up (pid $GWPID)"
else
    tail -20 "$WORK/g.log"
    h_abort "the appliance did not come up"
fi
check "the firewall is on (table inet riceguard)" inns $G nft list table inet riceguard
note "$(grep -E '^(offload|io|udp gso|udp gso rest):' "$STATUS" | tr '\n' ';')"

# peer_up NS IF KEY ADDR ENDPOINT [TABLE]: a stock wireguard-go peer, tunnel MTU 1420;
# with TABLE its route to G is there, for sources ADDR (S has two tunnels to G).
peer_up() {
    local t=()
    [ -n "${6:-}" ] && t=(table "$6")
    spawn ip netns exec "$1" wireguard-go -f "$2" >"$WORK/$2.log" 2>&1
    wait_for 5 test -S "/var/run/wireguard/$2.sock" || return 1
    inns "$1" wg set "$2" private-key <(echo "$3") peer "$pg" endpoint "$5" \
        allowed-ips 10.100.0.1/32 persistent-keepalive 25 || return 1
    ip -n "$1" addr add "$4/32" dev "$2" &&
        ip -n "$1" link set "$2" mtu 1420 up &&
        ip -n "$1" route add 10.100.0.1/32 dev "$2" "${t[@]}" || return 1
    [ -z "${6:-}" ] || ip -n "$1" rule add from "$4" table "$6"
}
check "wireguard-go s4 (endpoint 192.0.2.2:51820) up" peer_up $S $WS4 "$ks4" 10.100.0.2 192.0.2.2:51820
check "wireguard-go s6 (endpoint [2001:db8:2::2]:51820) up" peer_up $S $WS6 "$ks6" 10.100.0.4 "[2001:db8:2::2]:51820" 46
check "wireguard-go f (endpoint 192.0.2.2:51820) up" peer_up $F $WF "$kf" 10.100.0.3 192.0.2.2:51820
# iperf3 servers: G's on its tunnel address, S's on all (for both of its tunnels).
spawn ip netns exec $G timeout 100 iperf3 -s -B 10.100.0.1 -p 5201 >"$WORK/iperf-g.log" 2>&1
spawn ip netns exec $S timeout 100 iperf3 -s -p 5202 >"$WORK/iperf-s.log" 2>&1
wait_for 5 listening $G 5201 || h_abort "iperf3 server in G not listening"
wait_for 5 listening $S 5202 || h_abort "iperf3 server in S not listening"

# ---- (1) the small hop, outer IPv4 then outer IPv6 ------------------------------------------
small() { # FAMILY NS-IF PEER-TUNNEL-ADDR G-OUTER-DST MTU ICMP-FILTER
    local fam=$1 wif=$2 addr=$3 dst=$4 mtu=$5 icmpf=$6 n
    echo "--- (1) outer $fam: the $mtu-byte hop between G and $wif"
    check "(1) $fam: G pings $addr through the tunnel" ping_ok $G "$addr"
    cap_start "icmp$fam" $R rg "$icmpf"
    # S's source address picks the tunnel: -B for iperf3 in S (G answers to it).
    if inns $S timeout 25 iperf3 -c 10.100.0.1 -p 5201 -B "$addr" -R -n $XFER --connect-timeout 3000 -J >"$WORK/iperf.json" 2>&1 &&
        [ "$(received)" -ge "$XFER" ] 2>/dev/null; then
        ok "(1) $fam: $XFER bytes G -> $wif over the $mtu-byte hop (iperf3 -R -n) all arrived"
    else
        ko "(1) $fam: $XFER bytes G -> $wif over the $mtu-byte hop did not all arrive in 25 s: $(tail -c 200 "$WORK/iperf.json" | tr '\n' ' ')"
    fi
    if xfer $G "$addr" 5202 $XFER; then
        ok "(1) $fam: $XFER bytes $wif -> G over the $mtu-byte hop (iperf3 -R -n) all arrived"
    else
        ko "(1) $fam: $XFER bytes $wif -> G over the $mtu-byte hop: $(cat "$WORK/last") arrived in 25 s: $(tail -c 200 "$WORK/iperf.json" | tr '\n' ' ')"
    fi
    # A 1420-byte inner packet with DF (the tunnel's MTU): delivered, and how it crossed
    # the far link (S's side of it).
    cap_start "big$fam" $G upl "dst host $dst"
    if inns $G ping -n -c3 -i 0.3 -W2 -s 1392 -M "do" "$addr" >"$WORK/big$fam.ping" 2>&1; then
        ok "(1) $fam: 1420-byte inner packets (ping -s 1392 -M do) G -> $wif answered"
    else ko "(1) $fam: 1420-byte inner packets G -> $wif: $(tail -2 "$WORK/big$fam.ping" | tr '\n' ' ')"; fi
    cap_stop "big$fam"
    note "(1) $fam: 3 pings of 1420 bytes inner left G as: $(frags "$WORK/big$fam.cap")"
    # The ICMP error and the learnt MTU are checked after the DF pings: during the bulk
    # transfers an IPv4 GSO send longer than the route's MTU leaves without DF (the kernel
    # sets DF only on what fits) and R may fragment it instead of answering, so whether
    # the transfers alone draw an error depends on how the sends were batched.
    cap_stop "icmp$fam"
    n=$(grep -cE 'need to frag|packet too big' "$WORK/icmp$fam.cap")
    if [ "$n" -ge 1 ]; then ok "(1) $fam: R sent G $n ICMP error(s) about its datagrams ($(grep -m1 -oE 'mtu [0-9]+' "$WORK/icmp$fam.cap"))"
    else ko "(1) $fam: R sent G no ICMP error"; fi
    if pmtu_is $G "$dst" "$mtu"; then ok "(1) $fam: G learnt the path MTU: $(ip -n $G route get "$dst" | grep -oE 'mtu [0-9]+' | head -1)"
    else ko "(1) $fam: G did not learn MTU $mtu: $(ip -n $G route get "$dst" | head -1)"; fi
}
small IPv4 $WS4 10.100.0.2 198.51.100.2 1400 "icmp and icmp[0] == 3 and icmp[1] == 4"
small IPv6 $WS6 10.100.0.4 2001:db8:5::2 1280 "icmp6 and ip6[40] == 2"
check "invalid drops did not take the ICMP errors (counter invalid stays 0)" \
    sh -c "! ip netns exec $G nft list counter inet riceguard invalid | grep -q 'packets [1-9]'"

# ---- (2) the full-MTU peer keeps GSO ------------------------------------------------------------
echo "--- (2) F on a full-MTU path after the small hop's ICMP errors"
note "(2) before: $(gso_line)"
cap_start gso $G upl "udp and src port 51820 and dst host 203.0.113.2 and greater 1600"
check "(2) F: the tunnel carries a ping" ping_ok $F 10.100.0.1
if xfer $F 10.100.0.1 5201 $BULK; then ok "(2) $BULK bytes G -> F (iperf3 -R -n) all arrived"
else ko "(2) $BULK bytes G -> F: $(cat "$WORK/last") arrived in 25 s: $(tail -c 200 "$WORK/iperf.json" | tr '\n' ' ')"; fi
cap_stop gso
n=$(grep -c 'length' "$WORK/gso.cap")
if [ "$n" -ge 1 ]; then ok "(2) G sent F $n UDP super-datagram(s) (GSO), e.g. $(grep -m1 -oE 'length [0-9]+' "$WORK/gso.cap" | tail -1)"
else ko "(2) no UDP super-datagram toward F: GSO not in use"; fi
if wait_for 3 gso_on; then ok "(2) status: $(gso_line)"
else ko "(2) status: $(gso_line || echo no udp gso line)"; fi
grep -E 'GSO|warn' "$WORK/g.log" | head -5 | sed 's/^/     log: /'

h_finish
