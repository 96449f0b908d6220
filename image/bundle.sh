#!/usr/bin/env bash
# Package a built image's slot contents as one signed update bundle:
#
#   out/<board>/riceguard-<board>-<version>.bundle
#
# = header (magic, manifest length, ed25519 signature of the manifest) + manifest
# (format, board, arch, version, compat, min-compat, sha256 and size of each part) +
# root.squashfs + slot-a.efi + slot-b.efi. Format: gateway/core/src/bundle.rs. Only the
# manifest is signed (openssl pkeyutl -rawin, ed25519); it binds each part by its sha256.
# `build` (from the image's manifest.txt, RG_BUILD at image/build.sh time) is the signed,
# monotonic build number: a device refuses a bundle not newer than its running slot.
# The device writes the root and the UKI of the slot it installs into.
#
# usage: image/bundle.sh BOARD        (after image/build.sh BOARD; `make bundle` does both)
# env:   RG_OUT (default out/<board>), RG_UPDATE_KEY (default keys/update.key, see
#        image/keys.sh), RG_BUNDLE_COMPAT / RG_BUNDLE_MIN_COMPAT (configuration schema
#        range this firmware handles; default COMPAT / MIN_COMPAT of
#        gateway/core/src/bundle.rs, the tree the image was built from: a device accepts
#        the bundle when its own schema is in that range), RG_BUNDLE_BOARD / RG_BUNDLE_ARCH
#        (override, for tests of refusals), RG_BUNDLE_BUILD (override the build number, for
#        tests; RG_BUNDLE_BUILD=none leaves it out, as bundles made before build numbers:
#        the only kind that devices running firmware from before build numbers accept)
set -euo pipefail
cd "$(dirname "$0")/.."
board=${1:?usage: image/bundle.sh BOARD}
# shellcheck source=/dev/null
. "board/$board/board.conf"
out=${RG_OUT:-out/$board}
for f in root.squashfs slot-a.efi slot-b.efi manifest.txt; do
    [ -s "$out/$f" ] || { echo "bundle: no $out/$f: run image/build.sh $board first (or make bundle)" >&2; exit 1; }
done
version=$(awk '$1 == "version" {print $2}' "$out/manifest.txt")
build=${RG_BUNDLE_BUILD:-$(awk '$1 == "build" {print $2}' "$out/manifest.txt")}
case $build in
    none) build= ;;
    ''|*[!0-9]*) echo "bundle: no build number in $out/manifest.txt (${build:-empty}): rebuild the image with image/build.sh" >&2; exit 1 ;;
esac
# The schema range the firmware handles: its own COMPAT, down to the oldest it reads.
schema() {
    sed -n "s/^pub const $1: u32 = \([0-9][0-9]*\);\$/\1/p" gateway/core/src/bundle.rs
}
compat=${RG_BUNDLE_COMPAT:-$(schema COMPAT)}
min_compat=${RG_BUNDLE_MIN_COMPAT:-$(schema MIN_COMPAT)}
# An explicit RG_BUNDLE_COMPAT alone: a bundle of that one schema (tests of refusals).
[ -z "${RG_BUNDLE_COMPAT:-}" ] || [ -n "${RG_BUNDLE_MIN_COMPAT:-}" ] || min_compat=$compat
case $compat$min_compat in
    ''|*[!0-9]*) echo "bundle: no COMPAT/MIN_COMPAT in gateway/core/src/bundle.rs (or RG_BUNDLE_COMPAT/RG_BUNDLE_MIN_COMPAT)" >&2; exit 1 ;;
esac
[ "$min_compat" -le "$compat" ] || { echo "bundle: min-compat $min_compat above compat $compat" >&2; exit 1; }
key=$(image/keys.sh key)
# The image must carry the public key of the key that signs (else its devices refuse).
if ! unsquashfs -q -cat "$out/root.squashfs" etc/riceguard/update.pub 2>/dev/null | grep -qxF "$(grep -v '^#' "$(image/keys.sh pub)")"; then
    echo "bundle: warning: $out/root.squashfs does not carry $(image/keys.sh pub): devices built from it will refuse bundles signed by its successor" >&2
fi
bundle=$out/riceguard-$board-$version.bundle
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
    echo "format 1"
    echo "board ${RG_BUNDLE_BOARD:-$board}"
    echo "arch ${RG_BUNDLE_ARCH:-$ARCH}"
    echo "version $version"
    [ -z "$build" ] || echo "build $build"
    echo "compat $compat"
    echo "min-compat $min_compat"
    for p in root:root.squashfs uki-a:slot-a.efi uki-b:slot-b.efi; do
        f=$out/${p#*:}
        echo "part ${p%%:*} $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
    done
} >"$tmp/manifest"
openssl pkeyutl -sign -inkey "$key" -rawin -in "$tmp/manifest" -out "$tmp/sig"
[ "$(stat -c %s "$tmp/sig")" = 64 ] || { echo "bundle: openssl made no ed25519 signature" >&2; exit 1; }
n=$(stat -c %s "$tmp/manifest")
le32() { printf "\\x%02x\\x%02x\\x%02x\\x%02x" $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
{
    printf 'RGBUNDL1'
    printf "$(le32 "$n")"
    cat "$tmp/sig" "$tmp/manifest" "$out/root.squashfs" "$out/slot-a.efi" "$out/slot-b.efi"
} >"$bundle.tmp"
mv "$bundle.tmp" "$bundle"
echo "== bundle $bundle ($(stat -c %s "$bundle") bytes, signed with $key)"
sed 's/^/   /' "$tmp/manifest"
