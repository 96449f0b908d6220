#!/usr/bin/env bash
# Adversarial UDP tests (nothing unauthenticated may move a peer's state): an attacker who knows only the gateway's public
# key sprays forged handshake responses and cookie replies over guessed receiver indexes,
# floods handshake initiations from 200 addresses, and replays a peer's captured packets;
# riceguard (drop-in, configured by stock `wg`) must keep the legitimate wireguard-go
# peer's endpoint, session and traffic, answer the flood with cookies, and keep its RSS
# and CPU bounded. Three throwaway namespaces; needs root, wg, wireguard-go, tcpdump.
# Prints per-attack figures and a table, then "N passed, N failed"; exit 1 on failure.
#
#   ci/adversarial.sh              riceguard is $RG_BIN (default target/release/riceguard)
#   ADV_RATE=2000 ci/adversarial.sh   slower spray (default 4000 forged messages/s)
#
# See ci/lib/adversarial.py (the checks) and ci/lib/forge.py (the forged messages).
set -euo pipefail
exec python3 "$(dirname "$0")/lib/adversarial.py" "$@"
