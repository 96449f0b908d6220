#!/usr/bin/env bash
# Sends made outside the workers (timer keepalives and handshakes) leave from the
# address the peer uses, on an uplink with two addresses, IPv4 and IPv6: riceguard <->
# stock wireguard-go, the source checked in a capture (ci/lib/sticky.py says what and why).
# About 20 s. Needs root, wg, wireguard-go, tcpdump; riceguard is $RG_BIN (default
# target/release/riceguard). Ends with "N passed, N failed"; exit 1 on failure.
set -euo pipefail
exec python3 "$(dirname "$0")/lib/sticky.py" "$@"
