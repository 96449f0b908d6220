#!/usr/bin/env bash
# The built-in TCP fallback, end to end, in two network namespaces joined by a veth:
#
#   ns rgfA: riceguard client (endpoint = B)      ns rgfB: riceguard gateway
#            10.97.1.1 in the tunnel  ---- veth ----  10.97.1.2, UDP+TCP port 51821
#
# 1. nftables in B drops UDP to 51821 from the start: the client falls back to TCP
#    within 15 s; ping and a 5 s iperf3 pass; `ss -tni` shows the congestion control
#    chosen; a capture of the TCP path has no segment with a bare 2-byte payload.
# 2. The drop rule goes: the client is back on UDP within the first probe interval
#    (30 s + jitter).
# 3. Hostile TCP input to the gateway (random bytes, u32-LE framing, a silent
#    connection): each is closed, and the tunnel still carries traffic afterwards.
# 4. A stock wireguard-go client reaches the gateway through `riceguard udp2tcp`.
# 5. A config-file client (`riceguard up --config`, TcpFallback = on, Endpoint and
#    TcpPort, no TcpListen) falls back to TCP without listening on TCP, against a
#    gateway that is not riceguard: stock wireguard-go behind `riceguard tcp2udp`, UDP
#    to it dropped by nftables.
# Needs root, wireguard-tools, wireguard-go, iperf3, nftables, tcpdump, python3.
# Prints "N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init tcp-fallback

require_rg
WORK=$(mktemp -d /tmp/rg-tcp-fallback.XXXXXX)
A=rgfA$$ B=rgfB$$ C=rgfC$$
IA=rgf$$a IB=rgf$$b IC=rgf$$c ID=rgf$$d IE=rgf$$e

cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
    rm -f /var/run/wireguard/$IA.sock /var/run/wireguard/$IB.sock /var/run/wireguard/$IC.sock \
        /var/run/wireguard/$ID.sock /var/run/wireguard/$IE.sock
    rm -rf "$WORK"
}
at_exit cleanup
ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null

netns_add $A $B
veth_pair $A vfa 10.97.0.1/24 $B vfb 10.97.0.2/24

block_udp() {
    ip netns exec $B nft add table inet rgftest
    ip netns exec $B nft add chain inet rgftest input '{ type filter hook input priority 0; }'
    ip netns exec $B nft add rule inet rgftest input udp dport 51821 drop
}
unblock_udp() { ip netns exec $B nft delete table inet rgftest; }

ka=$(wg genkey); kb=$(wg genkey)
block_udp
RG_LOG=info ip netns exec $A "$RG" -f $IA >"$WORK/a.log" 2>&1 & PIDS+=($!)
RG_LOG=info ip netns exec $B "$RG" -f $IB >"$WORK/b.log" 2>&1 & PIDS+=($!)
wait_for 5 eval '[ -S /var/run/wireguard/$IA.sock ] && [ -S /var/run/wireguard/$IB.sock ]'
ip netns exec $A wg set $IA private-key <(echo "$ka") listen-port 51820 \
    peer "$(echo "$kb" | wg pubkey)" allowed-ips 10.97.1.2/32 endpoint 10.97.0.2:51821 persistent-keepalive 25
ip netns exec $B wg set $IB private-key <(echo "$kb") listen-port 51821 \
    peer "$(echo "$ka" | wg pubkey)" allowed-ips 10.97.1.1/32
ip -n $A addr add 10.97.1.1/24 dev $IA; ip -n $A link set $IA up
ip -n $B addr add 10.97.1.2/24 dev $IB; ip -n $B link set $IB up

# --- 1. fall back to TCP --------------------------------------------------------------
t0=$SECONDS
up=0
for i in $(seq 20); do
    if ip netns exec $A ping -c1 -W1 10.97.1.2 >/dev/null 2>&1; then up=1; break; fi
done
took=$((SECONDS - t0))
if [ $up = 1 ] && [ $took -le 15 ] && grep -q "transport now TCP" "$WORK/a.log"; then
    ok "fallback: tunnel over TCP after ${took} s with UDP dropped"
else
    bad "fallback: tunnel not up over TCP within 15 s (took ${took} s, up=$up)"; tail -5 "$WORK/a.log"
fi
loss=$(ip netns exec $A ping -c 10 -i 0.2 -W 2 10.97.1.2 | grep -o '[0-9.]*% packet loss' | cut -d% -f1)
[ "${loss:-100}" = 0 ] && ok "ping over TCP: 0% loss" || bad "ping over TCP: ${loss:-?}% loss"

ip netns exec $B iperf3 -s -1 -D -B 10.97.1.2 >/dev/null 2>&1
wait_for 5 eval "ip netns exec $B ss -Hltn 'sport = :5201' | grep -q ."
timeout 20 ip netns exec $A tcpdump -i vfa -nn -s 96 -w "$WORK/tcp.pcap" 'tcp port 51821' >/dev/null 2>"$WORK/tcpdump.err" & TD=$!
wait_for 5 grep -q 'listening on' "$WORK/tcpdump.err"
mbit=$(timeout 30 ip netns exec $A iperf3 -c 10.97.1.2 -t 5 -J 2>/dev/null |
    python3 ci/lib/labtool.py iperf-mbit)
sleep 0.3; kill -INT $TD 2>/dev/null; wait $TD 2>/dev/null
[ "${mbit:-0}" -gt 0 ] && ok "iperf3 over TCP fallback: ${mbit} Mbit/s" || bad "iperf3 over TCP fallback failed"
cc=$(ip netns exec $B ss -tni "sport = :51821" | grep -oE '\b(cubic|bbr|reno)\b' | head -1)
[ -n "$cc" ] && ok "ss -tni shows congestion control '$cc' on the gateway's connection" || bad "no congestion control shown by ss"
read -r total bare small <<<"$(tcpdump -r "$WORK/tcp.pcap" -nn 2>/dev/null | python3 ci/lib/labtool.py pcap-segments)"
if [ "${total:-0}" -gt 100 ] && [ "${bare:-1}" = 0 ]; then
    ok "capture: $total data segments, none with a bare 2-byte payload ($small under 1000 bytes)"
else
    bad "capture: total=${total:-?} bare-header segments=${bare:-?}"
fi

# --- 2. back to UDP ---------------------------------------------------------------------
unblock_udp
t1=$SECONDS
back=0
for i in $(seq 50); do
    if grep -q "transport now UDP" "$WORK/a.log"; then back=1; break; fi
    sleep 1
done
if [ $back = 1 ]; then ok "back on UDP $((SECONDS - t1)) s after the drop rule went"; else bad "still on TCP 50 s after UDP was unblocked"; fi
loss=$(ip netns exec $A ping -c 5 -i 0.2 -W 2 10.97.1.2 | grep -o '[0-9.]*% packet loss' | cut -d% -f1)
[ "${loss:-100}" = 0 ] && ok "ping after return to UDP: 0% loss" || bad "ping after return to UDP: ${loss:-?}% loss"

# --- 3. hostile TCP input -------------------------------------------------------------------
ip netns exec $A python3 ci/lib/labtool.py tcp-garbage 10.97.0.2 51821 >"$WORK/garbage.out" 2>&1
grep -q "closed [34]" "$WORK/garbage.out" && ok "garbage TCP input: connections closed ($(cat "$WORK/garbage.out"))" ||
    bad "garbage TCP input: $(cat "$WORK/garbage.out")"
loss=$(ip netns exec $A ping -c 5 -i 0.2 -W 2 10.97.1.2 | grep -o '[0-9.]*% packet loss' | cut -d% -f1)
[ "${loss:-100}" = 0 ] && ok "tunnel unaffected by the garbage" || bad "tunnel after garbage: ${loss:-?}% loss"
kill -0 "${PIDS[1]}" 2>/dev/null && ok "gateway process still running" || bad "gateway died"

# --- 4. stock wireguard-go through riceguard udp2tcp ---------------------------------------
kc=$(wg genkey)
# C (wireguard-go in A) is 10.97.2.3; the gateway answers it as 10.97.2.2.
ip netns exec $B wg set $IB peer "$(echo "$kc" | wg pubkey)" allowed-ips 10.97.2.3/32
ip -n $B addr add 10.97.2.2/32 dev $IB
ip -n $B route add 10.97.2.3/32 dev $IB
ip netns exec $A "$RG" udp2tcp --udp-listen 127.0.0.1:51900 --tcp-forward 10.97.0.2:51821 --nodelay >"$WORK/u2t.log" 2>&1 & PIDS+=($!)
ip netns exec $A env WG_PROCESS_FOREGROUND=1 wireguard-go $IC >"$WORK/c.log" 2>&1 & PIDS+=($!)
wait_for 5 eval '[ -S /var/run/wireguard/$IC.sock ]'
ip netns exec $A wg set $IC private-key <(echo "$kc") \
    peer "$(echo "$kb" | wg pubkey)" allowed-ips 10.97.2.2/32 endpoint 127.0.0.1:51900 persistent-keepalive 25
ip -n $A addr add 10.97.2.3/32 dev $IC
ip -n $A link set $IC mtu 1366 up
ip -n $A route add 10.97.2.2/32 dev $IC
up=0
for i in $(seq 15); do
    ip netns exec $A ping -c1 -W1 -I 10.97.2.3 10.97.2.2 >/dev/null 2>&1 && { up=1; break; }
done
[ $up = 1 ] && ok "wireguard-go -> riceguard udp2tcp -> TCP -> riceguard gateway: ping" ||
    bad "wireguard-go through udp2tcp: no ping"

# --- 5. config-file client, no TcpListen, gateway = wireguard-go behind tcp2udp -------------
kd=$(wg genkey); ke=$(wg genkey)
ip netns exec $B nft add table inet rgftest5
ip netns exec $B nft add chain inet rgftest5 input '{ type filter hook input priority 0; }'
ip netns exec $B nft add rule inet rgftest5 input iifname vfb udp dport 51822 counter drop
ip netns exec $B env WG_PROCESS_FOREGROUND=1 wireguard-go $IE >"$WORK/e.log" 2>&1 & PIDS+=($!)
wait_for 5 eval '[ -S /var/run/wireguard/$IE.sock ]'
ip netns exec $B wg set $IE private-key <(echo "$ke") listen-port 51822 \
    peer "$(echo "$kd" | wg pubkey)" allowed-ips 10.97.4.1/32
ip -n $B addr add 10.97.4.2/24 dev $IE
ip -n $B link set $IE mtu 1366 up
ip netns exec $B "$RG" tcp2udp --tcp-listen 10.97.0.2:51823 --udp-forward 127.0.0.1:51822 --nodelay \
    >"$WORK/t2u.log" 2>&1 & PIDS+=($!)
cat >"$WORK/d.conf" <<EOF
[Interface]
PrivateKey = $kd
Address = 10.97.4.1/24
MTU = 1366

[Peer]
PublicKey = $(echo "$ke" | wg pubkey)
AllowedIPs = 10.97.4.2/32
Endpoint = 10.97.0.2:51822
TcpPort = 51823
PersistentKeepalive = 25

[Gateway]
InterfaceName = $ID
TcpFallback = on
EOF
t0=$SECONDS
RG_LOG=info ip netns exec $A "$RG" up --config "$WORK/d.conf" >"$WORK/d.log" 2>&1 & DPID=$!; PIDS+=($DPID)
up=0
for i in $(seq 40); do
    if ip netns exec $A ping -c1 -W1 10.97.4.2 >/dev/null 2>&1; then up=1; break; fi
done
took=$((SECONDS - t0))
if [ $up = 1 ] && grep -q "transport now TCP" "$WORK/d.log"; then
    ok "config client (no TcpListen) -> wireguard-go behind tcp2udp: ping over TCP after ${took} s, log says 'transport now TCP'"
else
    bad "config client without TcpListen: no tunnel over TCP within ${took} s (up=$up)"; tail -5 "$WORK/d.log"
fi
grep -q "TCP fallback client ready (no TCP listener)" "$WORK/d.log" &&
    ok "config client started a client-only TCP transport" || bad "no client-only TCP transport in the log"
# `ip netns exec` runs riceguard as the child it waits for: look for sockets of either.
dpids=" $DPID $(pgrep -P $DPID | tr '\n' ' ')"
# The resolver on the box (TCP 53 on the tunnel's own address) is not a TCP-fallback
# listener: left out.
listening=$(ip netns exec $A ss -Hltnp 'not sport = :53' | grep -o 'pid=[0-9]*' | cut -d= -f2 | while read -r p; do
    case "$dpids" in *" $p "*) echo "$p";; esac; done)
[ -z "$listening" ] && ok "config client has no TCP listener" ||
    bad "config client listens on TCP (other than the resolver's 53): $(ip netns exec $A ss -Hltnp)"
drops=$(ip netns exec $B nft list chain inet rgftest5 input | grep -o 'packets [0-9]*' | awk '{print $2}')
conn=$(ip netns exec $A ss -Htn state established "dport = :51823" | wc -l)
if [ "${drops:-0}" -gt 0 ] && [ "$conn" -ge 1 ]; then
    ok "UDP handshakes dropped by nftables ($drops packets), tunnel on an established TCP connection to tcp2udp"
else
    bad "drops=${drops:-?} established TCP connections to 51823: $conn"
fi
loss=$(ip netns exec $A ping -c 10 -i 0.2 -W 2 10.97.4.2 | grep -o '[0-9.]*% packet loss' | cut -d% -f1)
[ "${loss:-100}" = 0 ] && ok "config client over TCP: ping 0% loss" || bad "config client over TCP: ${loss:-?}% loss"

echo
h_finish
