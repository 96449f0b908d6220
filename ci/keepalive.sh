#!/usr/bin/env bash
# Passive keepalive and padding (what a stock peer expects on the wire): riceguard <-> stock wireguard-go in two
# namespaces, one ping every KA_INTERVAL s (default 20) from riceguard's side for
# KA_DURATION s (default 120), outer UDP captured with tcpdump. Asserts exactly one
# handshake in the run, a keepalive from riceguard after each data message it received,
# and data messages padded to a multiple of 16 bytes. About DURATION - INTERVAL + 20 s.
# Needs root, wg, wireguard-go, tcpdump; riceguard is $RG_BIN (default
# target/release/riceguard). Ends with "N passed, N failed"; exit 1 on failure.
set -euo pipefail
exec python3 "$(dirname "$0")/lib/keepalive.py" "$@"
