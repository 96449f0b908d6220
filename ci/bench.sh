#!/usr/bin/env bash
# Benchmark (not a test): riceguard<->riceguard against wireguard-go<->wireguard-go,
# boringtun<->boringtun and the plain veth ceiling, in throwaway network namespaces.
# TCP 1 and 4 streams, UDP at 1 Gbit/s offered, 64-byte UDP packets/s, ping RTT idle and
# under load, daemon CPU seconds per Gbit; median of --reps rounds (each round runs every
# setup once, odd rounds in reverse order, so the host's changing load falls on all rows
# alike) with min-max and ratios (throughputs against wireguard-go and boringtun of the same
# core layout). Markdown on stdout, JSON in out/bench/bench-<UTC time>.json and next to it an
# SVG plot (.svg: single-stream TCP, daemon CPU per Gbit/s, idle RTT; a bar per setup).
# Needs root.
#
# Setups, as each implementation starts: veth, wireguard-go, boringtun, riceguard,
# riceguard-busy (--poll busy --workers 1, side a's worker on core 0, side b's on core 1).
# One core per end (end A = side a's daemon and the iperf3 client on core 0, end B = side
# b's daemon and the iperf3 server on core 1; with the default layout one flow's hash can put
# both ends' busy worker on one core): wireguard-go-1core and boringtun-1core (taskset -c),
# riceguard-1core (--workers 1 --cores N), and the appliance: side b runs `riceguard up
# --config` (Cores = 1) and forwards to a host behind it, so the inner traffic crosses
# conntrack, the forward chain and the masquerade (appliance-1core, Firewall = on) or no
# firewall at all (appliance-nofw-1core, Firewall = off); their ratio, round by round, is what
# the firewall and conntrack cost.
#
#   ci/bench.sh                 3 rounds of 4 s runs (about 10 minutes)
#   ci/bench.sh --quick         1 round of 3 s runs (about 3 minutes)
#   ci/bench.sh --setups appliance-1core,appliance-nofw-1core --reps 5
#   RG_BASE_BIN=old/riceguard ci/bench.sh --setups riceguard-1core,riceguard-base-1core
#                               before/after: an older build against this one, same rounds
#   ci/bench.sh --with-tcp-fallback    add riceguard over TCP (UDP dropped by nftables)
#   ci/bench.sh --setups appliance-1core,appliance-scraped-1core
#                               the appliance with Metrics = on and /metrics scraped every
#                               second from the host behind it, against unscraped
#   ci/bench.sh --setups appliance-1core,appliance-peers500-1core,appliance-acl500-1core
#                               the appliance with 500 more peers, each with an Access of
#                               its own, and the measured client restricted too (Access =
#                               lan, H's subnet), against no Access anywhere, and against the
#                               same 500 peers without Access: what the per-client firewall
#                               costs (a source-map lookup per new flow) apart from the peers
#   ci/bench.sh --cores-per-end N
#                               instead of the default setups, N cores per end: end A (side
#                               a's daemon, the iperf3 client) on cores 0..N-1, end B (side
#                               b's daemon, the iperf3 server) on cores N..2N-1, one peer:
#                               riceguard-Nc (--workers N --cores <end's list>: one-peer
#                               spreading as the daemon defaults), riceguard-Nc-w1 (--workers
#                               1 --cores <end's first core>, iperf3 still on the N cores),
#                               riceguard-Nc-nospread (--workers N --cores <list> --spread
#                               off; fails with the daemon's message on a build without the
#                               flag) and wireguard-go-Nc (taskset -c <list>, GOMAXPROCS
#                               unset); riceguard-Nc's ratios (every metric, and round by
#                               round) against the other three. Cores are counted modulo the
#                               machine's: when 2N is more, the two sets overlap and the
#                               report and the JSON ("cores" of each setup, "core_groups",
#                               ends_share_cores) say that the ends share cores. With
#                               --setups too, the group runs after those; the names also
#                               work alone in --setups (e.g. riceguard-2c,riceguard-2c-w1).
#   ci/bench.sh --plot-only out/bench/bench-X.json    redraw that run's SVG (no root)
#
# Every daemon's CPU is also recorded thread by thread (/proc/PID/task/TID/stat, keyed by
# the thread's name, name#index where several share one, as wireguard-go's do) during the
# single-stream TCP run and the UDP run: "threads_cpu_s" and "threads_cpu_s_udp" of each
# round and (median of the rounds) of each setup, {"a": {"rg-worker-0": s, ...}, "b": ...};
# the markdown shows each riceguard row with more than one worker as the workers' shares of
# their CPU on each side (is one peer's work spread over every worker at both ends?).
#
# riceguard is $RG_BIN (default target/release/riceguard), extra flags in $RG_ARGS
# ($RG_TCP_ARGS too for the TCP row).
set -euo pipefail
exec python3 "$(dirname "$0")/lib/bench.py" "$@"
