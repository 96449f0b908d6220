#!/usr/bin/env bash
# The ed25519 key pair that signs update bundles. The private key never enters an image;
# the public key is installed in every root as /etc/riceguard/update.pub, so a device
# accepts only bundles signed by the key its running image was built with.
#
#   keys/update.key   private key (PEM, PKCS#8), made on the first build; keys/ is gitignored
#   keys/update.pub   public key: base64 of the 32 raw bytes (the format riceguard reads)
#
# A vendor uses its own key by putting it at keys/update.key before building, or by
# pointing RG_UPDATE_KEY at it (any ed25519 PEM openssl reads; an HSM-held key works too
# as long as RG_UPDATE_PUB names its public key file and signing is done with it).
#
# usage: image/keys.sh pub    ensure the pair exists, print the public key file's path
#        image/keys.sh key    ensure the pair exists, print the private key file's path
set -euo pipefail
cd "$(dirname "$0")/.."
key=${RG_UPDATE_KEY:-keys/update.key}
pub=${RG_UPDATE_PUB:-${key%.key}.pub}
if [ ! -s "$key" ] && [ -z "${RG_UPDATE_PUB:-}" ]; then
    mkdir -p "$(dirname "$key")"
    (umask 077 && openssl genpkey -algorithm ed25519 -out "$key" 2>/dev/null)
    echo "keys: generated a new update signing key $key (keep it safe: devices built now accept only bundles it signs)" >&2
fi
if [ ! -s "$pub" ] || { [ -s "$key" ] && [ "$key" -nt "$pub" ]; }; then
    # The DER SubjectPublicKeyInfo of an ed25519 key ends with the 32 raw key bytes.
    { echo "# riceguard update public key (ed25519, base64 of 32 bytes)"
      openssl pkey -in "$key" -pubout -outform DER | tail -c 32 | base64 -w0; echo; } >"$pub"
fi
case ${1:-pub} in
    pub) echo "$pub" ;;
    key) echo "$key" ;;
    *) echo "usage: image/keys.sh pub|key" >&2; exit 2 ;;
esac
