#!/usr/bin/env bash
# TCP-fallback helpers, end to end: `riceguard udp2tcp` and `riceguard tcp2udp` on the
# loopback of a namespace of their own (UDP echo, garbage framing refused), then two stock
# wireguard-go peers in two network namespaces whose only path is TCP:
#
#   ns A: wireguard-go IA (10.77.0.1) -> udp2tcp 127.0.0.1:51900 --TCP--+
#                                                (UDP dropped on the veth) |
#   ns B: wireguard-go IB (10.77.0.2) <- tcp2udp 192.168.77.2:443 <------+
#
# Namespaces and interface names carry this run's PID (wireguard-go's UAPI sockets are
# shared by all namespaces), so the lab can run beside any other.
#
# Checks: ping and a 5 s iperf3 through the tunnel; a tcpdump capture of the TCP path
# shows no segment carrying a bare 2-byte payload and bulk segments at the MSS.
# Needs root, wireguard-go, wireguard-tools, iperf3, tcpdump, nftables, ethtool.
# Prints "N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init tcp-helpers

RG=${RG_BIN:-target/release/riceguard}
if [ ! -x "$RG" ]; then
    cargo build --release -p riceguard >&2 || h_abort "build failed"
fi
RG=$(realpath "$RG")
WORK=$(mktemp -d /tmp/rg-tcp-helpers.XXXXXX)
A=rgthA$$ B=rgthB$$ LO=rgthL$$
IA=rgth$$a IB=rgth$$b
# Until something listens on port $2 in namespace $1 (10 s); $3: ss's -t (default) or -u.
listening() { ip netns exec "$1" ss -Hln "${3:--t}" "sport = :$2" | grep -q .; }
wait_listen() { wait_for 10 listening "$@"; }

# (the harness stops our processes and deletes the namespaces first)
cleanup() {
    rm -f "/var/run/wireguard/$IA.sock" "/var/run/wireguard/$IB.sock"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

# ---- 1. loopback: UDP echo through udp2tcp -> tcp2udp and back -------------------------
if command -v python3 >/dev/null; then
    netns_add $LO
    spawn ip netns exec $LO python3 ci/lib/labtool.py udp-echo >"$WORK/echo.port"
    # The echo server prints its port once it is bound (a loaded machine takes a while).
    wait_for 10 test -s "$WORK/echo.port" || bad "loopback: the UDP echo server did not start"
    EPORT=$(cat "$WORK/echo.port")
    spawn ip netns exec $LO "$RG" tcp2udp --tcp-listen 127.0.0.1:47443 --udp-forward 127.0.0.1:"$EPORT" --nodelay \
        2>"$WORK/t2u-lo.log"
    wait_listen $LO 47443
    spawn ip netns exec $LO "$RG" udp2tcp --udp-listen 127.0.0.1:47900 --tcp-forward 127.0.0.1:47443 --nodelay \
        2>"$WORK/u2t-lo.log"
    wait_listen $LO 47900 -u
    if ip netns exec $LO python3 ci/lib/labtool.py udp-echo-check 47900
    then ok "loopback: WireGuard-shaped datagrams echoed through udp2tcp -> tcp2udp"
    else bad "loopback: echo through udp2tcp -> tcp2udp"; fi
    # crates.io udp-over-tcp's u32 little-endian framing must be refused at once.
    if ip netns exec $LO python3 ci/lib/labtool.py u32le-refused 47443
    then ok "loopback: u32-LE framed input closes the connection"
    else bad "loopback: u32-LE framed input not refused"; fi
else
    echo "SKIP loopback checks: python3 missing"
fi

# ---- 2. wireguard-go <-> (udp2tcp -> tcp2udp) <-> wireguard-go in two namespaces ----------
for t in wireguard-go wg iperf3 tcpdump nft ethtool; do
    command -v $t >/dev/null || { h_abort "missing tool $t"; }
done
netns_add $A $B
veth_pair $A rgta0 192.168.77.1/24 $B rgtb0 192.168.77.2/24
# Real segment sizes on the wire: no TSO/GSO super-segments, no GRO merging.
ip netns exec $A ethtool -K rgta0 tso off gso off gro off >/dev/null 2>&1
ip netns exec $B ethtool -K rgtb0 tso off gso off gro off >/dev/null 2>&1
# The network blocks UDP: only TCP crosses.
ip netns exec $A nft -f - <<'EOF'
table inet rgt {
    chain out {
        type filter hook output priority 0;
        oifname "rgta0" meta l4proto udp counter drop
    }
}
EOF

RG_LOG=debug ip netns exec $B "$RG" tcp2udp --tcp-listen 192.168.77.2:443 --udp-forward 127.0.0.1:51820 --nodelay \
    2>"$WORK/t2u.log" &
PIDS+=($!)
wait_listen $B 443
ip netns exec $A "$RG" udp2tcp --udp-listen 127.0.0.1:51900 --tcp-forward 192.168.77.2:443 --nodelay \
    2>"$WORK/u2t.log" &
U2T_PID=$!
PIDS+=($U2T_PID)

KA=$(wg genkey) KB=$(wg genkey)
PA=$(echo "$KA" | wg pubkey) PB=$(echo "$KB" | wg pubkey)
echo "$KA" >"$WORK/ka"; echo "$KB" >"$WORK/kb"
ip netns exec $A wireguard-go -f $IA >"$WORK/wga.log" 2>&1 &
PIDS+=($!)
ip netns exec $B wireguard-go -f $IB >"$WORK/wgb.log" 2>&1 &
PIDS+=($!)
wait_for 10 test -S "/var/run/wireguard/$IA.sock" -a -S "/var/run/wireguard/$IB.sock" ||
    bad "wireguard-go's UAPI sockets did not appear"
# MTU over TCP: 54 bytes below the UDP default (config.rs DEFAULT_TCP_MTU).
ip netns exec $B wg set $IB private-key "$WORK/kb" listen-port 51820 peer "$PA" allowed-ips 10.77.0.1/32
ip netns exec $A wg set $IA private-key "$WORK/ka" peer "$PB" allowed-ips 10.77.0.2/32 \
    endpoint 127.0.0.1:51900 persistent-keepalive 25
ip -n $A addr add 10.77.0.1/24 dev $IA; ip -n $A link set $IA mtu 1366 up
ip -n $B addr add 10.77.0.2/24 dev $IB; ip -n $B link set $IB mtu 1366 up

if ip netns exec $A ping -c 3 -W 5 -i 0.3 10.77.0.2 >"$WORK/ping.log" 2>&1; then
    ok "ping through wireguard-go <-> udp2tcp/tcp2udp <-> wireguard-go ($(grep -o 'rtt.*' "$WORK/ping.log"))"
else
    bad "ping through the TCP-carried tunnel"; cat "$WORK/ping.log" "$WORK/u2t.log" "$WORK/t2u.log"
fi

if ip netns exec $A nft list chain inet rgt out >/dev/null 2>&1; then
    ok "UDP is blocked on the path (the tunnel can only use TCP)"
else
    bad "could not install the UDP-blocking rule"
fi

mbps_of() {
    python3 ci/lib/labtool.py iperf-mbit "$1"
}

# ---- 3. 5 s of iperf3 each way, captured on the path ------------------------------------
# $1: name, $2: bulk direction in the capture (c2s: written by udp2tcp's relay; s2c:
# written by the gateway's TcpTransport inside tcp2udp), $3: extra iperf3 flags.
iperf_capture() {
    local name=$1 d=$2 flags=${3:-} tp mbps
    ip netns exec $B tcpdump -i rgtb0 -nn -s 128 -w "$WORK/$name.pcap" tcp port 443 2>"$WORK/tcpdump-$name.log" &
    tp=$!   # `ip netns exec` execs tcpdump: this is tcpdump's own PID
    PIDS+=($tp)
    ip netns exec $B iperf3 -s -1 -B 10.77.0.2 >"$WORK/iperf-s-$name.log" 2>&1 &
    PIDS+=($!)
    wait_for 5 grep -q 'listening on' "$WORK/tcpdump-$name.log"
    wait_listen $B 5201
    if ip netns exec $A iperf3 -c 10.77.0.2 -t 5 $flags -J >"$WORK/iperf-$name.json" 2>&1; then
        mbps=$(mbps_of "$WORK/iperf-$name.json")
        eval "mbps_$name=$mbps"
        ok "iperf3 5 s through the TCP-carried tunnel, $name: $mbps Mbit/s"
    else
        bad "iperf3 through the TCP-carried tunnel, $name"; tail -5 "$WORK/iperf-$name.json"
    fi
    sleep 0.5
    kill -INT "$tp" 2>/dev/null   # flush the capture file
    wait "$tp" 2>/dev/null
    python3 ci/tcp-capture-stats.py "$WORK/$name.pcap" 192.168.77.1 >"$WORK/stats-$name" ||
        echo "segs_c2s=0" >"$WORK/stats-$name"
    sed 's/^/     /' "$WORK/stats-$name"
    local segs_c2s=0 segs_s2c=0 bare_headers=1 two_byte_tails=0 nearmss_c2s=0 nearmss_s2c=0 \
        max_c2s=0 max_s2c=0 mean_c2s=0 mean_s2c=0 bytes_c2s=0 bytes_s2c=0
    eval "$(tr ' ' '\n' <"$WORK/stats-$name" | grep -E '^[a-z_0-9]+=[0-9]+$')"
    if [ $((segs_c2s + segs_s2c)) -gt 100 ] && [ "$bare_headers" -eq 0 ]; then
        ok "capture $name: $((segs_c2s + segs_s2c)) data segments, no length header alone in a segment" \
            "(2-byte message tails cut by TCP segmentation: $two_byte_tails)"
    else
        bad "capture $name: segments carrying only a 2-byte length header: $bare_headers"
    fi
    local segs=$((segs_$d)) near=$((nearmss_$d)) max=$((max_$d)) mean=$((mean_$d))
    if [ "$segs" -gt 0 ] && [ $((100 * near / segs)) -ge 80 ]; then
        ok "capture $name: bulk ($d) $((100 * near / segs))% of $segs data segments within 48 bytes of the MSS ($max), mean $mean"
    else
        bad "capture $name: bulk ($d) segments near the MSS: $near of $segs (max $max, mean $mean)"
    fi
}
iperf_capture upload c2s
iperf_capture download s2c -R

# The gateway-side writer's syscall count: closing the client makes tcp2udp log it.
kill "$U2T_PID" 2>/dev/null
sleep 1
w=$(grep -o 'sent [0-9]* bytes in [0-9]* writes.*' "$WORK/t2u.log" | tail -1)
if [ -n "$w" ]; then
    set -- $w
    ok "TcpTransport writer (tcp2udp, per-packet send): $2 bytes in $5 writes = $(( $2 / ($5 > 0 ? $5 : 1) )) bytes per syscall"
else
    bad "tcp2udp did not report its write count"; tail -5 "$WORK/t2u.log"
fi

# ---- 4. reference: the same pair over plain UDP, for the TCP/UDP throughput ratio -------
ip netns exec $A nft delete table inet rgt
ip netns exec $A wg set $IA peer "$PB" endpoint 192.168.77.2:51820
ip netns exec $A ping -c 2 -W 5 -i 0.3 10.77.0.2 >/dev/null 2>&1
ip netns exec $B iperf3 -s -1 -B 10.77.0.2 >"$WORK/iperf-s2.log" 2>&1 &
PIDS+=($!)
wait_listen $B 5201
if ip netns exec $A iperf3 -c 10.77.0.2 -t 5 -J >"$WORK/iperf-udp.json" 2>&1; then
    umbps=$(mbps_of "$WORK/iperf-udp.json")
    ok "reference: same wireguard-go pair over plain UDP (MTU 1366): $umbps Mbit/s (TCP path: ${mbps_upload:-?} Mbit/s)"
else
    bad "reference iperf3 over plain UDP"
fi

h_finish
