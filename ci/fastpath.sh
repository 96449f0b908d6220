#!/usr/bin/env bash
# Fast-path behaviour of riceguard, in two network namespaces joined by a veth:
#   1. every forced data-plane level carries traffic against riceguard and wireguard-go
#      (ci/interop.sh with RG_ARGS per level);
#   2. workers are pinned: each rg-worker-N thread's Cpus_allowed_list is the configured core;
#   3. GSO failures: with tx checksumming off on the veth a GSO send fails (EIO: GSO off
#      on that socket), or the fault hook makes every one fail with EINVAL (GSO rests
#      toward that peer only, and the log line names it); traffic goes on and the
#      failure is logged once;
#   4. GRO on and off on the receiving veth: traffic is correct both ways.
# Needs root, wireguard-tools, wireguard-go, iperf3, ethtool. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init fastpath

require_rg
WORK=$(mktemp -d /tmp/rg-fastpath.XXXXXX)
A=rgpA$$ B=rgpB$$
IA=rgp$$a IB=rgp$$b

stop_daemons() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    PIDS=()
}
cleanup() {
    stop_daemons
    ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null
    rm -f /var/run/wireguard/$IA.sock /var/run/wireguard/$IB.sock
    rm -rf "$WORK"
}
at_exit cleanup

# --- 1. the interop matrix on every forced path ------------------------------------------
if [ -z "${FASTPATH_SKIP_MATRIX:-}" ]; then
    for args in "--io-uring on --tun-offload off" "--io-uring off --tun-offload off" "--io-uring off" \
                "--offload mmsg" "--offload off --tun-offload off --io-uring off"; do
        out="$WORK/matrix.log"
        if RG_ARGS="$args" ci/interop.sh --pairs riceguard:wireguard-go,riceguard:riceguard --quick >"$out" 2>&1; then
            ok "interop on path [$args]: $(tail -1 "$out")"
        else
            bad "interop on path [$args]: $(tail -1 "$out")"; grep FAIL "$out" | head -5
        fi
    done
fi

# --- namespaces for the rest ------------------------------------------------------------
netns_add $A $B
veth_pair $A vpa 10.95.0.1/24 $B vpb 10.95.0.2/24
ka=$(wg genkey); kb=$(wg genkey)

# start NAME-SUFFIX ARGS...: both daemons, configured with wg, addresses 10.95.1.1/.2.
start_pair() {
    RG_LOG=info RG_FAULT_GSO=${RG_FAULT_GSO:-} ip netns exec $A "$RG" -f "$@" $IA >"$WORK/a.log" 2>&1 & PIDS+=($!)
    RG_LOG=info ip netns exec $B "$RG" -f "$@" $IB >"$WORK/b.log" 2>&1 & PIDS+=($!)
    wait_for 5 eval '[ -S /var/run/wireguard/$IA.sock ] && [ -S /var/run/wireguard/$IB.sock ]'
    ip netns exec $A wg set $IA private-key <(echo "$ka") listen-port 51820 \
        peer "$(echo "$kb" | wg pubkey)" allowed-ips 10.95.1.2/32 endpoint 10.95.0.2:51821
    ip netns exec $B wg set $IB private-key <(echo "$kb") listen-port 51821 \
        peer "$(echo "$ka" | wg pubkey)" allowed-ips 10.95.1.1/32 endpoint 10.95.0.1:51820
    ip -n $A addr add 10.95.1.1/24 dev $IA; ip -n $A link set $IA mtu 1420 up
    ip -n $B addr add 10.95.1.2/24 dev $IB; ip -n $B link set $IB mtu 1420 up
    for i in $(seq 10); do ip netns exec $A ping -c1 -W1 10.95.1.2 >/dev/null 2>&1 && return 0; done
    return 1
}

# iperf3 A -> B for 3 s; prints Mbit/s (0 on failure).
iperf_ab() {
    ip netns exec $B iperf3 -s -1 -D -B 10.95.1.2 >/dev/null 2>&1
    wait_for 5 eval "ip netns exec $B ss -Hltn 'sport = :5201' | grep -q ."
    timeout 20 ip netns exec $A iperf3 -c 10.95.1.2 -t 3 -J 2>/dev/null |
        python3 ci/lib/labtool.py iperf-mbit
}

# --- 2. pinning -------------------------------------------------------------------------
ncpu=$(nproc)
cat >"$WORK/pin.conf" <<EOF
[Interface]
PrivateKey = $ka
ListenPort = 51840
Address = 10.95.9.1/24

[Gateway]
InterfaceName = $IA
Cores = $((ncpu - 1)), 0
EOF
ip netns exec $A "$RG" up --config "$WORK/pin.conf" --workers 2 >"$WORK/pin.log" 2>&1 & pin=$!
sleep 1
want=("$((ncpu - 1))" "0")
pinned=0
for t in /proc/$pin/task/*; do
    name=$(cat "$t/comm" 2>/dev/null)
    case "$name" in
        rg-worker-*)
            i=${name#rg-worker-}
            got=$(awk '/Cpus_allowed_list/ {print $2}' "$t/status")
            if [ "$got" = "${want[$i]}" ]; then pinned=$((pinned + 1)); else echo "  $name on $got, want ${want[$i]}"; fi
            ;;
    esac
done
kill $pin; wait $pin 2>/dev/null
[ $pinned = 2 ] && ok "pinning: rg-worker-0 on core ${want[0]}, rg-worker-1 on core ${want[1]} (Cpus_allowed_list)" ||
    bad "pinning: $pinned of 2 workers on their configured cores"

# --- 3. GSO failures ---------------------------------------------------------------------
# First the issue's recipe: tx checksumming off on the egress veth (EIO: the socket is
# demoted). Kernels that segment in software anyway (6.18 does) never fail the send; then
# the daemon's fault hook (RG_FAULT_GSO=einval: SO_NO_CHECK, which the kernel answers
# with EINVAL on every GSO send, as kernels before 6.14 answer segments above a peer's
# path MTU) makes the failure real: GSO rests toward B's endpoint only, which the one
# log line names, and each refused batch goes again one datagram at a time.
ip netns exec $A ethtool -K vpa tx off >/dev/null 2>&1
demoted=""
for fault in "" einval; do
    if RG_FAULT_GSO=$fault start_pair; then
        m=$(iperf_ab)
        n=$(grep -c "GSO send failed" "$WORK/a.log")
        if [ -n "$fault" ]; then what="GSO rest toward the peer ($fault)"; named="toward 10.95.0.2:51821"
        else what="GSO demotion (tx csum off)"; named=""; fi
        if [ "$n" -ge 1 ]; then
            demoted=1
            [ "${m:-0}" -gt 0 ] && [ "$n" = 1 ] && grep -q "GSO send failed $named" "$WORK/a.log" &&
                ok "$what: logged once, traffic went on, iperf3 ${m} Mbit/s" ||
                bad "$what: iperf3 ${m:-0} Mbit/s, failure lines: $n: $(grep -m1 'GSO send failed' "$WORK/a.log")"
        else
            echo "  (${fault:-tx csum off}): no GSO send failed on this kernel; iperf3 ${m:-0} Mbit/s"
        fi
    else
        bad "GSO failure (${fault:-tx csum off}): tunnel did not come up"; tail -n 5 "$WORK/a.log" "$WORK/b.log"
    fi
    stop_daemons
    ip -n $A addr flush dev $IA 2>/dev/null; ip -n $B addr flush dev $IB 2>/dev/null
    [ -n "$demoted" ] && break
done
[ -n "$demoted" ] || bad "GSO failures: no path made a GSO send fail"
ip netns exec $A ethtool -K vpa tx on >/dev/null 2>&1

# --- 4. GRO on and off on the receiving side ------------------------------------------------
for gro in on off; do
    ip netns exec $B ethtool -K vpb gro $gro rx-udp-gro-forwarding $gro >/dev/null 2>&1
    if start_pair; then
        m=$(iperf_ab)
        loss=$(ip netns exec $A ping -c 5 -i 0.2 -W 2 10.95.1.2 | grep -o '[0-9.]*% packet loss' | cut -d% -f1)
        [ "${m:-0}" -gt 0 ] && [ "${loss:-100}" = 0 ] && ok "GRO $gro on the receiving veth: iperf3 ${m} Mbit/s, ping 0% loss" ||
            bad "GRO $gro: iperf3 ${m:-0} Mbit/s, ping loss ${loss:-?}%"
    else
        bad "GRO $gro: tunnel did not come up"
    fi
    stop_daemons
done

echo
h_finish
