#!/usr/bin/env bash
# One peer on every core keeps each flow in order: the receiving riceguard (--workers 2,
# --spread on) hands a peer's received GRO trains to its other worker for decryption and
# the TUN write, and its sequencer must restore the receive order. Two namespaces joined
# by a veth, a tunnel A -> B, pairs riceguard -> riceguard (both --workers 2, spreading)
# and wireguard-go -> riceguard; while measuring, iperf3 -P 4 TCP A -> B through the same
# tunnel keeps both of the receiver's workers busy. Per pair:
#   1. 40000 sequence-numbered 1200-byte UDP datagrams A -> B, as fast as the sender goes
#      for at most 3 s (ci/lib/sequdp.py): 0 reordered required (loss reported);
#   2. one TCP stream A -> B (iperf3 -t 3): the kernel's reordering counters (nstat) of the
#      run, against the same run with the receiving riceguard at --workers 1: no more than
#      that + a small slack;
#   3. B's status says trains were handed off (> 0), else the checks above prove nothing
#      about spreading; at --workers 1, none were. With the stock peer (no GSO trains) B
#      runs with RG_SPREAD_MIN_BYTES=0: every train handed over, however small.
# RG_SPREAD_ARGS (default "--spread on") are the spreading daemons' extra arguments.
# Needs root, wg, wireguard-go, iperf3, nstat, ss. About 40 s. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.." || exit 1
. ci/lib/harness.sh
h_init order

require_rg
require_tools wg wireguard-go iperf3 nstat ss python3 timeout
read -r -a SPREAD <<<"${RG_SPREAD_ARGS---spread on}"
WORK=$(mktemp -d /tmp/rg-order.XXXXXX)
A=rgoA$$ B=rgoB$$
IA=rgo$$a IB=rgo$$b
AB=10.97.1.2 # B's tunnel address: every measured flow goes to it
at_exit rm -rf "$WORK"
at_exit rm -f /var/run/wireguard/$IA.sock /var/run/wireguard/$IB.sock

netns_add $A $B
veth_pair $A voa 10.97.0.1/24 $B vob 10.97.0.2/24
ka=$(wg genkey); kb=$(wg genkey)

# iperf3 servers in B for the whole lab: 5201 takes the load, 5202 the measured stream.
spawn ip netns exec $B iperf3 -s -p 5201 >"$WORK/iperf-load-server.log" 2>&1
spawn ip netns exec $B iperf3 -s -p 5202 >"$WORK/iperf-tcp-server.log" 2>&1
listening() { inns $B ss -Hltn "sport = :$1" | grep -q .; }
wait_for 5 listening 5201 && wait_for 5 listening 5202 || h_abort "iperf3 servers did not start"

# start_pair IMPL_A B-ARGS...: IMPL_A (riceguard or wireguard-go) in A, riceguard with
# B-ARGS in B, keyed with wg; true when a ping crosses the tunnel (within 10 s).
DA="" DB=""
start_pair() {
    local impl=$1; shift
    if [ "$impl" = riceguard ]; then
        spawn ip netns exec $A "$RG" -f --workers 2 "${SPREAD[@]}" $IA >"$WORK/a.log" 2>&1
    else
        spawn ip netns exec $A wireguard-go -f $IA >"$WORK/a.log" 2>&1
    fi
    DA=$!
    spawn ip netns exec $B env RG_SPREAD_MIN_BYTES="${B_MIN:-}" "$RG" -f "$@" $IB >"$WORK/b.log" 2>&1
    DB=$!
    wait_for 5 eval '[ -S /var/run/wireguard/$IA.sock ] && [ -S /var/run/wireguard/$IB.sock ]' || return 1
    inns $A timeout 5 wg set $IA private-key <(echo "$ka") listen-port 51820 \
        peer "$(echo "$kb" | wg pubkey)" allowed-ips 10.97.1.2/32 endpoint 10.97.0.2:51821 || return 1
    inns $B timeout 5 wg set $IB private-key <(echo "$kb") listen-port 51821 \
        peer "$(echo "$ka" | wg pubkey)" allowed-ips 10.97.1.1/32 endpoint 10.97.0.1:51820 || return 1
    ip -n $A addr add 10.97.1.1/24 dev $IA && ip -n $A link set $IA mtu 1420 up || return 1
    ip -n $B addr add 10.97.1.2/24 dev $IB && ip -n $B link set $IB mtu 1420 up || return 1
    wait_for 10 inns $A ping -c1 -W1 $AB
}
gone() { ! ip -n $A link show $IA && ! ip -n $B link show $IB; }
stop_pair() {
    [ -n "$DA" ] && stop_pid "$DA"
    [ -n "$DB" ] && stop_pid "$DB"
    DA="" DB=""
    wait_for 5 gone || true
    rm -f /var/run/wireguard/$IA.sock /var/run/wireguard/$IB.sock
}

# Background load: iperf3 -P 4 TCP A -> B for $1 s (bounded twice: -t and timeout),
# returned once its 4 connections are up (within 5 s). LOAD is its PID.
LOAD=""
load_start() {
    spawn ip netns exec $A timeout $(($1 + 10)) iperf3 -c $AB -p 5201 -P 4 -t "$1" >"$WORK/load.log" 2>&1
    LOAD=$!
    wait_for 5 eval "[ \$(inns $A ss -Htn state established 'dport = :5201' | wc -l) -ge 4 ]"
}
load_end() {
    [ -n "$LOAD" ] || return 0
    wait_for 15 eval '! kill -0 $LOAD 2>/dev/null' || true
    stop_pid "$LOAD"
    LOAD=""
}

# The counters by which a namespace's kernel sees TCP reordering (nstat -as: absolute,
# the history files untouched), printed as "NAME VALUE" lines.
COUNTERS="TcpExtTCPSACKReorder TcpExtTCPTSReorder TcpExtTCPRenoReorder TcpExtTCPDSACKRecv
TcpExtTCPDSACKOldSent TcpExtTCPDSACKOfoSent TcpExtTCPOFOQueue TcpExtTCPRetransFail TcpRetransSegs"
counters() { inns "$1" nstat -asz 2>/dev/null | awk -v want="$COUNTERS" '
    BEGIN { n = split(want, w, /[ \n]+/); for (i = 1; i <= n; i++) keep[w[i]] = 1 }
    ($1 in keep) { print $1, $2 }'; }
# delta BEFORE AFTER NAME: the change of one counter between two counters() files.
delta() { awk -v k="$3" 'FNR == NR && $1 == k { b = $2 } FNR != NR && $1 == k { a = $2 }
    END { print a - b }' "$1" "$2"; }

# status_num LABEL: the number after LABEL in B's spreading status line (empty if none).
status_num() { grep -m1 -oE "$1: [0-9]+" "$WORK/status" | grep -oE '[0-9]+$'; }

# measure NAME: the UDP order check, then the TCP stream, each under the load; leaves
# the UDP figures in U_*, the TCP stream's Mbit/s in T_MBIT and its reorder figure (see
# REORDER_COUNTERS) in T_REORD (empty when nstat gave no counters).
U_SENT="" U_LOST="" U_DUP="" U_REORD="" U_DISP="" U_SECS="" T_REORD="" T_MBIT=""
measure() {
    local name=$1 r
    U_SENT="" U_LOST="" U_DUP="" U_REORD="" U_DISP="" U_SECS="" T_REORD="" T_MBIT=""
    # 1. sequence-numbered UDP
    rm -f "$WORK/recv.json" "$WORK/send.json"
    spawn ip netns exec $B timeout 30 python3 ci/lib/sequdp.py recv $AB 7000 --idle 1.5 --deadline 20 \
        >"$WORK/recv.json" 2>"$WORK/recv.err"
    r=$!
    wait_for 5 eval "inns $B ss -Hlun 'sport = :7000' | grep -q ." || echo "  ($name: UDP receiver not listening)"
    load_start 4 || echo "  ($name: the load's 4 connections were not all up)"
    inns $A timeout 10 python3 ci/lib/sequdp.py send $AB 7000 --count 40000 --size 1200 --seconds 3 \
        >"$WORK/send.json" 2>"$WORK/send.err"
    wait_for 10 eval '! kill -0 $r 2>/dev/null' || true
    stop_pid "$r"
    load_end
    read -r U_SENT _ U_LOST U_DUP U_REORD U_DISP U_SECS < <(python3 ci/lib/sequdp.py summary "$WORK/send.json" "$WORK/recv.json")

    # 2. one TCP stream; the counters of both ends over the load's whole life
    counters $A >"$WORK/nA0"; counters $B >"$WORK/nB0"
    load_start 4 || echo "  ($name: the load's 4 connections were not all up)"
    inns $A timeout 15 iperf3 -c $AB -p 5202 -t 3 -J >"$WORK/tcp.json" 2>/dev/null
    T_MBIT=$(python3 ci/lib/labtool.py iperf-mbit "$WORK/tcp.json")
    load_end
    counters $A >"$WORK/nA1"; counters $B >"$WORK/nB1"
    local c v all=""
    for c in $COUNTERS; do
        v=$(delta "$WORK/nA0" "$WORK/nA1" $c); [ "$v" = 0 ] || all="$all A.${c#TcpExt}=$v"
        v=$(delta "$WORK/nB0" "$WORK/nB1" $c); [ "$v" = 0 ] || all="$all B.${c#TcpExt}=$v"
    done
    echo "  $name: TCP counters of the run (A sends, B receives; the rest 0):${all:- all 0}"
    T_REORD=0
    for c in $REORDER_COUNTERS; do
        grep -q "^$c " "$WORK/nA0" && grep -q "^$c " "$WORK/nA1" || { T_REORD=""; return; }
        T_REORD=$((T_REORD + $(delta "$WORK/nA0" "$WORK/nA1" $c)))
    done
}
# udp_ok: the UDP figures of the last measure() show an ordered flow: no datagram
# reordered or duplicated, and at least 1000 received (loss is allowed, but a check on a
# handful of datagrams would prove nothing).
udp_ok() {
    [ -n "$U_SENT" ] && [ "$U_REORD" = 0 ] && [ "$U_DUP" = 0 ] && [ $((U_SENT - U_LOST)) -ge 1000 ]
}
udp_figures() {
    echo "${U_SENT:-?} sent in ${U_SECS:-?} s, $((${U_SENT:-0} - ${U_LOST:-0})) received, ${U_REORD:-?} reordered (max displacement ${U_DISP:-?}), ${U_DUP:-?} duplicated, ${U_LOST:-?} lost"
}

# The reorder figure of a TCP run: the reordering the data's sender A learns from B's
# acknowledgements (SACK blocks, timestamps): the kernel counts TCPSACKReorder when B
# reports an original, never retransmitted segment arriving after a later one, so loss
# (holes filled by retransmissions) does not count. B's own counters are no such figure:
# TCPOFOQueue counts every hole, lost or late, and the DSACKs count spurious timer
# retransmissions too; wireguard-go -> riceguard loses thousands of segments under the
# load (B.TCPOFOQueue 4192 vs 11632 in two runs without any spreading), so they are
# printed, not compared.
REORDER_COUNTERS="TcpExtTCPSACKReorder TcpExtTCPTSReorder TcpExtTCPRenoReorder"

# The slack: the figure counts the whole namespace (the load's 4 connections and the
# measured one), and a few detections can come from what is not B's receive order: A's
# own riceguard (the same, at --workers 2 spreading, in both runs) delivers B's ACKs, and
# an ACK overtaken by a later one carries SACK blocks the kernel may take for reordering
# (one run of wireguard-go -> riceguard at --workers 1, no spreading anywhere in B, counted
# A.TCPSACKReorder=1).
# A sequencer that fails should not hide under it: under this load a handed-off train
# races the receiving worker's own trains all the time, and each lost race shows (a
# single late segment already makes TCPSACKReorder count). ORDER_TCP_SLACK overrides.
SLACK=${ORDER_TCP_SLACK:-2}

run_pair() {
    local impl=$1 label="$1 -> riceguard"
    local s_reord s_mbit w_reord w_mbit handed other full
    # A stock peer sends no GSO trains: B's trains are small and would stay on the
    # receiving worker (the 16 KiB hand-off threshold); at 0 every train is handed over,
    # the hardest case for the order.
    B_MIN=""; [ "$impl" = riceguard ] || B_MIN=0
    # --- spreading: the receiver at --workers 2 ---
    if start_pair "$impl" --workers 2 "${SPREAD[@]}"; then
        measure "$label (spread)"
        inns $B timeout 5 "$RG" status $IB >"$WORK/status" 2>&1
        handed=$(status_num "handed off") other=$(status_num "tun writes by another worker")
        full=$(status_num "lane full")
        if udp_ok; then
            ok "$label, spreading, under load: UDP in order: $(udp_figures); trains handed off ${handed:-?}"
        else
            bad "$label, spreading, under load: UDP: $(udp_figures)"
        fi
        if [ -n "$handed" ] && [ "$handed" -gt 0 ]; then
            ok "$label: B's status: trains handed off $handed, tun writes by another worker ${other:-?}, lane full ${full:-?}${B_MIN:+ (hand-off threshold $B_MIN bytes)}"
        else
            bad "$label: B's status shows no trains handed off (spreading line: $(grep -m1 'handed off' "$WORK/status" || echo none))"
        fi
        s_reord=$T_REORD s_mbit=$T_MBIT
    else
        bad "$label, spreading: tunnel did not come up: $(tail -n 2 "$WORK/a.log" "$WORK/b.log" | tr '\n' ' ')"
        s_reord="" s_mbit=0
    fi
    stop_pair
    # --- the baseline: the receiver at --workers 1 (no spreading) ---
    if start_pair "$impl" --workers 1; then
        measure "$label (workers 1)"
        inns $B timeout 5 "$RG" status $IB >"$WORK/status" 2>&1
        handed=$(status_num "handed off")
        # The baseline must be one: in order, and nothing handed off (no status line, or 0).
        if udp_ok && [ "${handed:-0}" = 0 ]; then
            ok "$label at --workers 1 (the baseline), under load: UDP in order: $(udp_figures); trains handed off ${handed:-0}"
        else
            bad "$label at --workers 1 (the baseline), under load: UDP: $(udp_figures); trains handed off ${handed:-0}"
        fi
        w_reord=$T_REORD w_mbit=$T_MBIT
    else
        bad "$label at --workers 1: tunnel did not come up: $(tail -n 2 "$WORK/a.log" "$WORK/b.log" | tr '\n' ' ')"
        w_reord=""
    fi
    stop_pair
    if [ -n "$s_reord" ] && [ -n "$w_reord" ] && [ "${s_mbit:-0}" -gt 0 ] && [ "${w_mbit:-0}" -gt 0 ] &&
        [ "$s_reord" -le $((w_reord + SLACK)) ]; then
        ok "$label: one TCP stream under load: reorder detections $s_reord spreading ($s_mbit Mbit/s) <= $w_reord at --workers 1 ($w_mbit Mbit/s) + slack $SLACK"
    else
        bad "$label: one TCP stream under load: reorder detections ${s_reord:-?} spreading (${s_mbit:-0} Mbit/s) vs ${w_reord:-?} at --workers 1 (${w_mbit:-0} Mbit/s) + slack $SLACK"
    fi
}

t0=$SECONDS
run_pair riceguard
run_pair wireguard-go
echo "  (lab ran $((SECONDS - t0)) s; spreading arguments: ${SPREAD[*]:-none})"

echo
h_finish
