#!/usr/bin/env bash
# TCP MSS clamping (issue 33 part 3) end to end: `riceguard up --config` two-armed, a LAN
# host at MTU 1500 that never hears "fragmentation needed", and a host at MTU 1500 behind a
# site-to-site peer (stock wireguard-go) across the appliance's 1420-byte tunnel. Names
# rgk<X><pid>; traffic only between the lab's namespaces.
#
#   ns U br0 ─┬─ ns G appliance `upl` 192.0.2.2/24, tunnel 10.100.0.1/24, fd00:100::1/64
#             │    (MTU 1420), `lanp` 192.168.1.1/24, fd00:1::1/64
#             │      └─ ns L LAN host 192.168.1.10, fd00:1::10, MTU 1500; its own nft drops
#             │         ICMP "fragmentation needed" and ICMPv6 "packet too big"
#             └─ ns S site peer 192.0.2.20, wireguard-go (MTU 1420), routes 10.200.0.0/24
#                  and fd00:200::/64 └─ ns B 10.200.0.5, fd00:200::5, MTU 1500, default via S
#
# The tunnel is the small hop (every veth carries 1500: the outer path has room for the
# 1420-byte inner packets plus WireGuard's 60 or 80 bytes). B and L both start from an MSS
# of 1460 (IPv6 1440); a 1500-byte segment from L (DF set: Linux's default for TCP; IPv6
# routers never fragment) meets G's 1420-byte tunnel route, G answers with an ICMP error,
# and L never hears it. For IPv4, then IPv6:
#   - B fetches 2 MiB from L (B connects, L sends) within 15 s: the SYN seen on L and the
#     SYN-ACK seen on B carry MSS <= 1380 (IPv6 <= 1360: the clamp rewrote both), no ICMP
#     error reached L's filter; `riceguard status` says the clamp is on;
#   - the clamp's rules deleted from G's table by handle (`nft -a list table inet
#     riceguard`, `nft delete rule`): the SYN seen on L carries 1460 (1440), and the same
#     fetch, both families at once, stalls (less than 2 MiB within 6 s) while L's filter
#     drops G's errors: the clamp is what made the first transfers work.
# Needs root, wireguard-go, wireguard-tools, iproute2, nftables, tcpdump, python3.
# riceguard is $RG_BIN (default target/release/riceguard). About 12 s.
# Prints "mss: N passed, N failed"; exit status 1 when anything failed.
# shellcheck disable=SC2317 # the helpers are called through check and wait_for
set -u
cd "$(dirname "$0")/.." || exit 1
. ci/lib/harness.sh
h_init mss
require_rg
require_tools wireguard-go wg ip nft tcpdump python3 ping ss

ID=$$
U=rgkU$ID G=rgkG$ID L=rgkL$ID S=rgkS$ID B=rgkB$ID
TUN=rgkw$ID WS=rgks$ID
LANH=192.168.1.10 LANH6=fd00:1::10 BHOST=10.200.0.5 PORT=8080 BYTES=$((2 << 20))
WORK=$(mktemp -d /tmp/rgk-mss.XXXXXX)
STATUS=/run/riceguard/$TUN.status
LT=(python3 ci/lib/labtool.py)
T0=$SECONDS
cleanup() {
    rm -f "/var/run/wireguard/$TUN.sock" "/var/run/wireguard/$WS.sock" "$STATUS"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

ping_ok() { # NS DST: a reply within 8 one-second tries (the first may wait for a handshake)
    local i
    for i in $(seq 8); do inns "$1" ping -n -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    return 1
}
listening() { [ -n "$(inns "$1" ss -Hltn "sport = :$2")" ]; }
# Captures: tcpdump text, at most 60 s.
declare -A CAP
cap_start() { # NAME NS IFACE FILTER
    : >"$WORK/$1.err"
    spawn ip netns exec "$2" timeout 60 tcpdump -i "$3" -nn -l -U "$4" >"$WORK/$1.cap" 2>"$WORK/$1.err"
    CAP[$1]=$!
    wait_for 5 grep -q "listening on" "$WORK/$1.err"
}
cap_stop() { sleep 0.5; stop_pid "${CAP[$1]}"; }
# syn_filter FAM: SYNs and SYN-ACKs of the lab's port, IPv4 or IPv6 (tcpdump's tcp[] does
# not reach into IPv6: its flags byte is at 40 + 13 without extension headers).
syn_filter() {
    if [ "$1" = 4 ]; then echo "ip and tcp port $PORT and tcp[tcpflags] & tcp-syn != 0"
    else echo "ip6 and tcp port $PORT and ip6[53] & 2 != 0"; fi
}
# syn_mss CAPTURE FLAGS: the MSS option of the first segment with tcpdump's FLAGS ("S" a
# SYN, "S." a SYN-ACK) in the capture.
syn_mss() {
    grep -F "Flags [$2]," "$WORK/$1.cap" | head -1 | sed -n 's/.*options \[mss \([0-9]*\).*/\1/p'
}
# fetch SECONDS HOST: B fetches from L's bulk server; prints the bytes received.
fetch() { inns $B timeout $(($1 + 5)) "${LT[@]}" bulk-fetch "$2" $PORT "$1" | sed -n 's/^received //p'; }
# icmp_drops FAM: the ICMP "fragmentation needed" (4) or ICMPv6 "packet too big" (6)
# packets L's own filter dropped; icmp_name FAM says which.
icmp_drops() { inns $L nft list counter inet rgkhost "toobig$1" | sed -n 's/.*packets \([0-9]*\).*/\1/p'; }
icmp_name() { if [ "$1" = 4 ]; then echo "'fragmentation needed'"; else echo "'packet too big'"; fi; }
# clamp_rules: "CHAIN HANDLE" of each rule of our table that sets the MSS.
clamp_rules() {
    inns $G nft -a list table inet riceguard | awk '
        $1 == "chain" { chain = $2 }
        /maxseg size set/ { for (i = 1; i < NF; i++) if ($i == "handle") print chain, $(i + 1) }'
}

# ---- the namespaces ---------------------------------------------------------------------
netns_add $U $G $L $S $B
for n in $G $L $S $B; do
    inns "$n" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
ip -n $U link add br0 type bridge && ip -n $U link set br0 up
veth_pair $U ug - $G upl 192.0.2.2/24
veth_pair $U us - $S eth0 192.0.2.20/24
for i in ug us; do ip -n $U link set $i master br0; done
inns $G sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0
veth_pair $G lanp - $L eth0 $LANH/24
ip -n $L addr add $LANH6/64 dev eth0 nodad
ip -n $L route add default via 192.168.1.1
ip -n $L -6 route add default via fd00:1::1
veth_pair $S sb 10.200.0.1/24 $B eth0 $BHOST/24
ip -n $S addr add fd00:200::1/64 dev sb nodad
ip -n $B addr add fd00:200::5/64 dev eth0 nodad
ip -n $B route add default via 10.200.0.1
ip -n $B -6 route add default via fd00:200::1
inns $S sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
# L: path MTU discovery as Linux does it by default (DF on TCP), no blackhole probing to
# rescue a stalled connection, and every "fragmentation needed" and "packet too big"
# dropped and counted.
inns $L sysctl -qw net.ipv4.ip_no_pmtu_disc=0 net.ipv4.tcp_mtu_probing=0
inns $L nft -f - <<'EOF'
table inet rgkhost {
    counter toobig4 { }
    counter toobig6 { }
    chain input {
        type filter hook input priority 0;
        icmp type destination-unreachable icmp code frag-needed counter name toobig4 drop
        icmpv6 type packet-too-big counter name toobig6 drop
    }
}
EOF

# ---- the appliance and the site peer ---------------------------------------------------------
kg=$("$RG" genkey); pg=$(echo "$kg" | "$RG" pubkey)
ks=$(wg genkey); ps=$(echo "$ks" | wg pubkey)
CONF=$WORK/g.conf
cat >"$CONF" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.100.0.1/24, fd00:100::1/64
MTU = 1420

[Peer]
Name = site
PublicKey = $ps
AllowedIPs = 10.100.0.2/32, 10.200.0.0/24, fd00:100::2/128, fd00:200::/64

[Gateway]
InterfaceName = $TUN
HugePages = off
Lan = lanp
LanAddress = 192.168.1.1/24, fd00:1::1/64
EOF
chmod 600 "$CONF"
spawn env RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 >"$WORK/g.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN 2>/dev/null | grep -q ',UP'"; then
    ok "riceguard up --config is up, two-armed (pid $GWPID)"
else
    tail -20 "$WORK/g.log"; h_abort "the appliance did not come up"
fi
spawn ip netns exec $S wireguard-go -f $WS >"$WORK/$WS.log" 2>&1
wait_for 5 test -S /var/run/wireguard/$WS.sock
inns $S wg set $WS private-key <(echo "$ks") peer "$pg" endpoint 192.0.2.2:51820 \
    allowed-ips 10.100.0.0/24,192.168.1.0/24,fd00:100::/64,fd00:1::/64
ip -n $S addr add 10.100.0.2/32 dev $WS
ip -n $S addr add fd00:100::2/128 dev $WS nodad
ip -n $S link set $WS mtu 1420 up
ip -n $S route add 10.100.0.0/24 dev $WS
ip -n $S route add 192.168.1.0/24 dev $WS
ip -n $S -6 route add fd00:100::/64 dev $WS
ip -n $S -6 route add fd00:1::/64 dev $WS
check "B (behind the site peer) pings L through the tunnel" ping_ok $B $LANH
check "B pings L over IPv6 through the tunnel" ping_ok $B $LANH6
mtus="G's tunnel $(ip -n $G -o link show $TUN | grep -o 'mtu [0-9]*'), L $(ip -n $L -o link show eth0 | grep -o 'mtu [0-9]*'), B $(ip -n $B -o link show eth0 | grep -o 'mtu [0-9]*')"
note "$mtus"

spawn ip netns exec $L timeout 60 "${LT[@]}" bulk-serve $PORT $BYTES 55
check "L serves 2 MiB on port $PORT" wait_for 5 listening $L $PORT

# ---- with the clamp ---------------------------------------------------------------------------
echo "--- with the clamp"
st=$(inns $G "$RG" status $TUN 2>&1)
if grep -qiE 'mss|clamp' <<<"$st"; then
    ok "riceguard status says the clamp: $(grep -iE 'mss|clamp' <<<"$st" | head -2 | tr '\n' ' ')"
else
    ko "riceguard status says nothing of an MSS clamp"
fi
mapfile -t rules < <(clamp_rules)
if [ ${#rules[@]} -gt 0 ]; then ok "the table clamps the MSS: ${#rules[@]} rule(s) (${rules[*]})"; else ko "no 'maxseg size set' rule in table inet riceguard"; fi
# clamped FAM HOST MAX: B fetches from L over FAM (4 or 6), both SYNs captured.
clamped() {
    local fam=$1 host=$2 max=$3 got m e0 e1
    cap_start "l$fam" $L eth0 "$(syn_filter "$fam")"
    cap_start "b$fam" $B eth0 "$(syn_filter "$fam")"
    e0=$(icmp_drops "$fam")
    got=$(fetch 15 "$host")
    cap_stop "l$fam"; cap_stop "b$fam"
    e1=$(icmp_drops "$fam")
    if [ "${got:-0}" -ge $BYTES ]; then ok "IPv$fam: B fetched 2 MiB from L ($got bytes)"; else ko "IPv$fam: B fetched ${got:-0} of $BYTES bytes from L within 15 s"; fi
    m=$(syn_mss "l$fam" S)
    if [ -n "$m" ] && [ "$m" -le "$max" ]; then ok "IPv$fam: B's SYN as L saw it: mss $m"; else ko "IPv$fam: B's SYN as L saw it: mss '$m' (wanted <= $max)"; fi
    m=$(syn_mss "b$fam" S.)
    if [ -n "$m" ] && [ "$m" -le "$max" ]; then ok "IPv$fam: L's SYN-ACK as B saw it: mss $m"; else ko "IPv$fam: L's SYN-ACK as B saw it: mss '$m' (wanted <= $max)"; fi
    if [ "${e1:-0}" = "${e0:-0}" ]; then ok "IPv$fam: no $(icmp_name "$fam") reached L (its counter stays ${e1:-0})"; else ko "IPv$fam: L dropped $((e1 - e0)) $(icmp_name "$fam") with the clamp on"; fi
}
clamped 4 $LANH 1380
clamped 6 $LANH6 1360

# ---- without it: the test shows what the clamp is for ------------------------------------------
echo "--- the clamp's rules deleted by hand"
for r in "${rules[@]}"; do inns $G nft delete rule inet riceguard "${r% *}" handle "${r#* }"; done
if [ -z "$(clamp_rules)" ]; then ok "no clamp rule left in G's table"; else ko "clamp rules left: $(clamp_rules | tr '\n' ' ')"; fi
# Both families at once: each fetch may stall for its 6 s.
cap_start l4x $L eth0 "$(syn_filter 4)"
cap_start l6x $L eth0 "$(syn_filter 6)"
e4=$(icmp_drops 4) e6=$(icmp_drops 6)
spawn sh -c "ip netns exec $B timeout 11 python3 ci/lib/labtool.py bulk-fetch $LANH $PORT 6 >'$WORK/stall4'"
f4=$!
spawn sh -c "ip netns exec $B timeout 11 python3 ci/lib/labtool.py bulk-fetch $LANH6 $PORT 6 >'$WORK/stall6'"
f6=$!
wait $f4 $f6; forget_pid $f4; forget_pid $f6
cap_stop l4x; cap_stop l6x
for fam in 4 6; do
    got=$(sed -n 's/^received //p' "$WORK/stall$fam")
    note "IPv$fam without the clamp: B's SYN as L saw it: mss $(syn_mss "l${fam}x" S)"
    if [ "${got:-0}" -lt $BYTES ]; then ok "IPv$fam without the clamp the fetch stalls: ${got:-0} of $BYTES bytes in 6 s"; else ko "IPv$fam without the clamp the fetch still completed ($got bytes): the lab shows nothing"; fi
    e=$([ $fam = 4 ] && echo "$e4" || echo "$e6")
    n=$(icmp_drops $fam)
    if [ "${n:-0}" -gt "${e:-0}" ]; then ok "IPv$fam without the clamp L dropped $((n - e)) $(icmp_name $fam) from G"; else ko "IPv$fam without the clamp no $(icmp_name $fam) reached L"; fi
done
check "the clamp's rules are still gone (the daemon did not put them back during the fetches)" test -z "$(clamp_rules)"
note "took $((SECONDS - T0)) s"
h_finish
