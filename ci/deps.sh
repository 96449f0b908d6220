#!/usr/bin/env bash
# Install what a fresh Debian bookworm machine (rustup stable, gcc, python3, qemu-utils) lacks
# to build, test and benchmark RiceGuard. Idempotent and quick when everything is present:
# apt is touched only when a package is missing, rustup only when a target is missing, cargo
# only when boringtun-cli is missing.
#
#   ci/deps.sh            install everything
#   ci/deps.sh --check    list what is missing, change nothing (exit 1 if something is)
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=0
case "${1:-}" in
    --check) check_only=1 ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# Debian bookworm packages, by what needs them.
APT_PKGS=(
    # peers and tools for ci/interop.sh and ci/bench.sh
    wireguard-go wireguard-tools iperf3 iputils-ping iproute2 nftables ethtool tcpdump
    procps psmisc python3
    # the SSH client of ci/ssh.sh (ssh, ssh-keygen, ssh-keyscan)
    openssh-client
    # the metrics lab (ci/metrics.sh): Debian's Prometheus server scrapes the appliance;
    # curl asks its HTTP API and the endpoint itself (about 9 s to install, no recommends)
    prometheus curl
    # DHCP server for the uplink-by-DHCP test (ci/dhcp.sh), the upstream resolver of
    # ci/dns.sh; dig (dnsutils) asks the appliance's resolver there
    dnsmasq-base dnsutils
    # static builds (ci/build-static.sh): gcc's musl wrapper for x86_64 ring, clang/llvm-ar
    # for aarch64 ring; rust-lld ships with rustup, so no lld package is needed
    musl-tools clang llvm binutils file
    # update bundles: signing with openssl (image/bundle.sh, image/keys.sh)
    openssl
    # image builder: initramfs, squashfs roots, ESP, GPT, perm partition, module handling
    kmod cpio zstd xz-utils squashfs-tools dosfstools mtools fdisk e2fsprogs
    # flash-script safety test (ci/test-flash-stacking.sh): stacked devices to refuse
    lvm2 btrfs-progs
    # the console's QR code read back by a real decoder (console/qr.rs test)
    zbar-tools
    # the export format checked against the stock tool both ways (core/src/age.rs test,
    # which fails under RG_TEST_STRICT or CI when age is missing)
    age
    # the SSH console's README playbook run as written (ci/ssh.sh: the raw module)
    ansible-core
    # U-Boot boards: mkimage makes the ESP's boot.scr (image/uboot/); Debian's U-Boot for
    # QEMU virt is the test firmware of ci/test-uboot-rollback.sh (ci/lib/firmware.sh)
    u-boot-tools u-boot-qemu
)

# ---- image helper: packages from bookworm-backports ------------------------------------
# The image/QEMU helper adds its packages here (kernel 6.12 cloud images, QEMU 10, OVMF,
# systemd-boot-efi, ...). They are installed with `-t bookworm-backports` after a sources
# entry for bookworm-backports is added, its URIs copied from the machine's own
# debian.sources (no mirror host is written into the repository).
BACKPORTS_PKGS=(
    # QEMU 10 (USO on virtio-net over a tap: host_uso/guest_uso4/6) for make qemu and
    # ci/test-image.sh, with UEFI firmware for both boards
    qemu-system-x86 qemu-system-arm ovmf qemu-efi-aarch64
    # objcopy/objdump that know pei-aarch64-little (the arm64 UKI), GPT checks in tests
    binutils-aarch64-linux-gnu jq
)
# (Kernels and systemd-boot-efi are not installed on the host: image/fetch.sh downloads
# them into .cache/ with a private apt state.)
# ---- end of image helper's packages ----------------------------------------------------

# ---- cross build path (Cross.toml, ci/cross/, ci/test-cross.sh) -------------------------
# podman + runc run the containers cross-rs starts (ci/cross/containers.conf), mmdebstrap
# makes the cross image's root file system from Debian packages, qemu-user-static runs the
# aarch64 binary in the smoke test. cross itself comes from crates.io, pinned; the image is
# built at the end of this script (ci/cross/build-image.sh: quick when it is current).
APT_PKGS+=(podman runc mmdebstrap qemu-user-static)
CROSS_VERSION=$(. ci/cross/env.sh && echo "$CROSS_VERSION")   # pinned in ci/cross/env.sh
have_cross() { cargo install --list 2>/dev/null | grep -qx "cross v$CROSS_VERSION:"; }
cross_missing() {
    have_cross || echo "missing cross $CROSS_VERSION"
    if ! command -v podman >/dev/null || ! ci/cross/build-image.sh --check >/dev/null 2>&1; then
        echo "missing the cross image (ci/cross/build-image.sh)"
    fi
}
install_cross() {
    if ! have_cross; then
        echo "deps: cargo install cross $CROSS_VERSION"
        cargo install --locked --quiet cross --version "$CROSS_VERSION"
    fi
    ci/cross/build-image.sh
}
# ---- end of cross build path ----------------------------------------------------------

RUST_TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
BORINGTUN_VERSION=0.7.1

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing_of() {
    local p
    for p in "$@"; do pkg_installed "$p" || echo "$p"; done
}

BACKPORTS_LIST=/etc/apt/sources.list.d/riceguard-backports.sources

# Write a deb822 entry for bookworm-backports using the URIs of the machine's debian.sources.
add_backports_source() {
    [ -f "$BACKPORTS_LIST" ] && return 0
    local src=/etc/apt/sources.list.d/debian.sources uris
    uris=$(sed -n 's/^URIs:[[:space:]]*//p' "$src" 2>/dev/null | grep -v security | head -n 1 || true)
    if [ -z "$uris" ]; then
        echo "deps: cannot find the Debian mirror's URIs in $src; add bookworm-backports by hand" >&2
        return 1
    fi
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uris" | as_root tee "$BACKPORTS_LIST" >/dev/null
    echo "deps: added $BACKPORTS_LIST"
}

cargo_bin_dir() { echo "${CARGO_HOME:-$HOME/.cargo}/bin"; }

# cargo-fuzz drives ci/fuzz.sh (the fuzz stage); installed here so the stage only builds and
# fuzzes. ci/fuzz.sh still installs it itself when run on a machine without it.
CARGO_FUZZ_VERSION=0.13.2
have_cargo_fuzz() { cargo install --list 2>/dev/null | grep -qx "cargo-fuzz v$CARGO_FUZZ_VERSION:"; }

have_boringtun() {
    local v
    v=$(PATH="$(cargo_bin_dir):$PATH" boringtun-cli --version 2>/dev/null || true)
    [ "$v" = "boringtun $BORINGTUN_VERSION" ]
}

missing_apt=$(missing_of "${APT_PKGS[@]}")
missing_bp=$(missing_of "${BACKPORTS_PKGS[@]}")
installed_targets=$(rustup target list --installed 2>/dev/null || true)
missing_targets=$(for t in "${RUST_TARGETS[@]}"; do grep -qx "$t" <<<"$installed_targets" || echo "$t"; done)
missing_bt=0
have_boringtun || missing_bt=1
missing_cf=0
have_cargo_fuzz || missing_cf=1

if [ "$check_only" = 1 ]; then
    status=0
    [ -n "$missing_apt$missing_bp" ] && { echo "missing apt packages:" $missing_apt $missing_bp; status=1; }
    [ -n "$missing_targets" ] && { echo "missing rust targets:" $missing_targets; status=1; }
    [ "$missing_bt" = 1 ] && { echo "missing boringtun-cli $BORINGTUN_VERSION"; status=1; }
    [ "$missing_cf" = 1 ] && { echo "missing cargo-fuzz $CARGO_FUZZ_VERSION"; status=1; }
    m=$(cross_missing); [ -n "$m" ] && { echo "$m"; status=1; }
    [ "$status" = 0 ] && echo "deps: all present"
    exit "$status"
fi

if [ -n "$missing_apt$missing_bp" ]; then
    export DEBIAN_FRONTEND=noninteractive
    [ -n "$missing_bp" ] && add_backports_source
    echo "deps: apt-get install" $missing_apt $missing_bp
    as_root apt-get update -q
    if [ -n "$missing_apt" ]; then
        # shellcheck disable=SC2086 # word splitting of the package list is intended
        as_root apt-get install -y -q --no-install-recommends $missing_apt
    fi
    if [ -n "$missing_bp" ]; then
        # shellcheck disable=SC2086
        as_root apt-get install -y -q --no-install-recommends -t bookworm-backports $missing_bp
    fi
fi

if [ -n "$missing_targets" ]; then
    # shellcheck disable=SC2086
    rustup target add $missing_targets
fi

# boringtun-cli is one of the interop peers; crates.io is its only distribution. It goes to
# cargo's own bin directory so every clone and worktree on the machine shares one build.
if [ "$missing_bt" = 1 ]; then
    echo "deps: cargo install boringtun-cli $BORINGTUN_VERSION"
    cargo install --locked --quiet boringtun-cli --version "$BORINGTUN_VERSION"
fi

if [ "$missing_cf" = 1 ]; then
    echo "deps: cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

install_cross

# The Debian packages every board's image is made of (kernel, systemd-boot-efi, firmware),
# into .cache/debs/ with image/fetch.sh's private apt state: quick when they are there. The
# image builds of `make image`, `make qemu` and the tests then start from the cache instead
# of each board's first build running apt-get update and downloading.
for conf in board/*/board.conf; do
    (
        # shellcheck source=/dev/null
        . "$conf"
        read -ra fwpkgs <<<"${FIRMWARE_PKGS:-}"
        image/fetch.sh "$DEBARCH" "$KERNEL_PKG" systemd-boot-efi "${fwpkgs[@]}" >/dev/null
    ) || { echo "deps: fetching the Debian packages of $conf failed" >&2; exit 1; }
done

echo "deps: all present (boringtun-cli $BORINGTUN_VERSION in $(cargo_bin_dir))"
