#!/usr/bin/env bash
# Real-peer WireGuard interop in throwaway network namespaces: riceguard against
# wireguard-go, boringtun and itself (plus wireguard-go/boringtun baselines that prove the
# harness). Needs root. Prints a markdown table and a last line "N passed, N failed";
# exits non-zero when any check failed.
#
#   ci/interop.sh                         the whole matrix
#   ci/interop.sh --impls wireguard-go,boringtun   only pairs among these
#   ci/interop.sh --pairs riceguard:wireguard-go --quick
#   ci/interop.sh --list                  show the selected pairs
#
# riceguard is $RG_BIN (default target/release/riceguard), extra flags in $RG_ARGS.
# Daemon logs: out/interop/<UTC time>/. See ci/lib/interop.py for the checks.
set -euo pipefail
exec python3 "$(dirname "$0")/lib/interop.py" "$@"
