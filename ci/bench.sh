#!/usr/bin/env bash
# Benchmark (not a test): riceguard<->riceguard against wireguard-go<->wireguard-go,
# boringtun<->boringtun and the plain veth ceiling, in throwaway network namespaces.
# TCP 1 and 4 streams, UDP at 1 Gbit/s offered, 64-byte UDP packets/s, ping RTT idle and
# under load, daemon CPU seconds per Gbit; median of --reps runs with min-max and ratios.
# Markdown on stdout, JSON in out/bench/bench-<UTC time>.json and next to it an SVG plot
# (.svg: single-stream TCP, daemon CPU per Gbit/s, idle RTT; a bar per setup). Needs root.
# Setups: veth, wireguard-go, boringtun, riceguard, riceguard-busy (--poll busy --workers 1,
# side a's worker on core 0, side b's on core 1).
#
#   ci/bench.sh                 3 repetitions of 10 s runs (about 15 minutes)
#   ci/bench.sh --quick         1 repetition of 3 s runs
#   ci/bench.sh --setups veth,wireguard-go --reps 5
#   ci/bench.sh --with-tcp-fallback    add riceguard over TCP (UDP dropped by nftables)
#   ci/bench.sh --plot-only out/bench/bench-X.json    redraw that run's SVG (no root)
#
# riceguard is $RG_BIN (default target/release/riceguard), extra flags in $RG_ARGS
# ($RG_TCP_ARGS too for the TCP row).
set -euo pipefail
exec python3 "$(dirname "$0")/lib/bench.py" "$@"
