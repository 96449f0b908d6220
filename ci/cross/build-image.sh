#!/usr/bin/env bash
# Build the image `cross` runs its builds in (Cross.toml: localhost/riceguard-cross:bookworm)
# from Debian bookworm packages: mmdebstrap makes a minimal root file system, podman imports
# it. Nothing is pulled from an image registry (none is reachable here). Run by ci/deps.sh;
# quick when the image in storage carries this recipe's hash (label riceguard.recipe).
#
# The image's C toolchains (ring compiles C; Rust itself comes from the host's toolchain,
# which cross mounts, and links with rust-lld as .cargo/config.toml says):
#   x86_64-unknown-linux-musl   musl-gcc (Debian musl-tools: gcc with musl's headers)
#   aarch64-unknown-linux-musl  aarch64-linux-musl-gcc (ci/cross/): Debian's aarch64 cross
#                               gcc with the spec file of musl-dev:arm64 (Debian has no
#                               aarch64 musl gcc package; these two together are one)
# plus gcc/libc6-dev for build scripts, which run on the host architecture.
#
#   ci/cross/build-image.sh           build it if missing or made from another recipe
#   ci/cross/build-image.sh --check   exit 1 (saying so) if it would build
#   ci/cross/build-image.sh --force   build it again
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=ci/cross/env.sh
. ci/cross/env.sh

mode=${1:-}
case "$mode" in --check|--force|"") ;; *) echo "usage: $0 [--check|--force]" >&2; exit 2 ;; esac

want=$(rg_cross_recipe_hash)
have=$(rg_cross_image_hash)
if [ "$mode" != --force ] && [ "$have" = "$want" ]; then
    echo "cross-image: $RG_CROSS_IMAGE present (recipe $want)"
    exit 0
fi
if [ "$mode" = --check ]; then
    echo "cross-image: $RG_CROSS_IMAGE ${have:+is from recipe $have, not $want}${have:-is missing (recipe $want)}"
    exit 1
fi

# Mirror: the URIs and suites of the host's own debian.sources (first, non-security entry),
# never a host name written into the repository.
src=/etc/apt/sources.list.d/debian.sources
uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$src" 2>/dev/null || true)
[ -n "$uri" ] || { echo "cross-image: no URIs: line in $src" >&2; exit 1; }
key=/usr/share/keyrings/debian-archive-keyring.gpg

mkdir -p "$RG_CROSS_STATE"
work=$(mktemp -d "$RG_CROSS_STATE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
echo "cross-image: mmdebstrap bookworm ($uri) for recipe $want"
# essential: dpkg's essential set only (no apt, no init); the build needs a shell,
# the compilers and binutils.
mmdebstrap --quiet --mode=root --variant=essential --architectures=amd64,arm64 \
    --include=gcc,libc6-dev,musl-tools,gcc-aarch64-linux-gnu,musl-dev:arm64 \
    --customize-hook="copy-in ci/cross/aarch64-linux-musl-gcc /usr/local/bin" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc "$1"/usr/share/man' \
    bookworm "$work/rootfs.tar" \
    "deb [signed-by=$key] $uri bookworm main" "deb [signed-by=$key] $uri bookworm-updates main"

# What cross-rs's own images set: the C compiler and archiver for each target's C code.
env_changes=(
    --change "ENV=CC_x86_64_unknown_linux_musl=musl-gcc"
    --change "ENV=AR_x86_64_unknown_linux_musl=ar"
    --change "ENV=CC_aarch64_unknown_linux_musl=aarch64-linux-musl-gcc"
    --change "ENV=AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar"
    --change "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
old_id=$(podman image inspect --format '{{.Id}}' "$RG_CROSS_IMAGE" 2>/dev/null || true)
podman import --quiet "${env_changes[@]}" --change "LABEL=riceguard.recipe=$want" \
    --message "riceguard cross image, recipe $want" "$work/rootfs.tar" "$RG_CROSS_IMAGE" >/dev/null
# The image this one replaces (a previous recipe) is untagged now: remove it.
if [ -n "$old_id" ] && [ "$old_id" != "$(podman image inspect --format '{{.Id}}' "$RG_CROSS_IMAGE")" ]; then
    podman rmi "$old_id" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$RG_CROSS_IMAGE")
echo "cross-image: built $RG_CROSS_IMAGE ($((size / 1048576)) MiB) in $((SECONDS - t0)) s"
