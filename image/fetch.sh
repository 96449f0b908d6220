#!/usr/bin/env bash
# Fetch the Debian packages one board's image is made of, into .cache/debs/<debarch>/,
# with a private apt state under .cache/apt/<debarch>/ (the host's apt configuration and
# dpkg database are never touched, no root needed). Sources: the URIs of the host's own
# /etc/apt/sources.list.d/debian.sources (no mirror is written into the repository),
# suites bookworm and bookworm-backports (components main and non-free-firmware), backports preferred (APT::Default-Release:
# the 6.12 kernel and systemd-boot 254). Offline: a package already in the cache is not
# fetched again; with all of them present, apt is not run at all. The cached .debs pin the
# image's inputs; RG_APT_UPDATE=1 refreshes the lists and downloads the packages again.
#
# usage: image/fetch.sh DEBARCH PKG...     prints one .deb path per PKG (in order)
set -euo pipefail
cd "$(dirname "$0")/.."
debarch=$1; shift
cache=$PWD/.cache
debs=$cache/debs/$debarch
aptd=$cache/apt/$debarch
mkdir -p "$debs"

need=()
for p in "$@"; do
    if [ ! -s "$debs/$p.deb" ] || [ -n "${RG_APT_UPDATE:-}" ]; then need+=("$p"); fi
done

apt_opts() {
    echo -o "Dir::State=$aptd/state" -o "Dir::State::Lists=$aptd/lists" \
        -o "Dir::State::status=$aptd/status" -o "Dir::Cache=$aptd/cache" \
        -o "Dir::Etc::SourceList=$aptd/sources.list" -o "Dir::Etc::SourceParts=$aptd/empty" \
        -o "APT::Default-Release=bookworm-backports" -o "APT::Sandbox::User=root" \
        -o "APT::Architecture=$debarch" -o "APT::Architectures=$debarch" \
        -o "Debug::NoLocking=1" -o "APT::Get::List-Cleanup=0" -o "Acquire::Languages=none"
}

if [ ${#need[@]} -gt 0 ]; then
    src=/etc/apt/sources.list.d/debian.sources
    uri=$(awk '/^URIs:/ {print $2; exit}' "$src" 2>/dev/null || true)
    if [ -z "$uri" ]; then
        echo "fetch: no URIs: line in $src and packages missing from $debs: ${need[*]}" >&2
        exit 1
    fi
    mkdir -p "$aptd"/{state,lists/partial,cache/archives/partial,empty}
    : > "$aptd/status"
    key=/usr/share/keyrings/debian-archive-keyring.gpg
    # non-free-firmware: NIC firmware (firmware-realtek for r8169, aarch64-generic's FIRMWARE_PKGS).
    printf 'deb [signed-by=%s] %s bookworm main non-free-firmware\ndeb [signed-by=%s] %s bookworm-backports main non-free-firmware\n' \
        "$key" "$uri" "$key" "$uri" > "$aptd/sources.list.new"
    # Lists fetched for other sources (an older cache: main only) are refreshed once.
    if ! cmp -s "$aptd/sources.list.new" "$aptd/sources.list"; then rm -f "$aptd/updated"; fi
    mv "$aptd/sources.list.new" "$aptd/sources.list"
    # shellcheck disable=SC2046
    if [ ! -s "$aptd/updated" ] || [ -n "${RG_APT_UPDATE:-}" ]; then
        echo "fetch: apt-get update ($debarch, $uri)" >&2
        apt-get $(apt_opts) -q update >&2
        date -u > "$aptd/updated"
    fi
    for p in "${need[@]}"; do
        real=$p
        # Metapackages (linux-image-cloud-amd64) name the real kernel package in Depends.
        # shellcheck disable=SC2046
        dep=$(apt-cache $(apt_opts) show --no-all-versions "$p" 2>/dev/null \
            | awk -F': ' '/^Depends:/ {print $2; exit}' | sed 's/[ (].*//; s/,.*//')
        case "$p" in linux-image-*) [ -n "$dep" ] && real=$dep ;; esac
        echo "fetch: $p -> $real ($debarch)" >&2
        tmp=$(mktemp -d "$debs/.dl.XXXXXX")
        # shellcheck disable=SC2046
        (cd "$tmp" && apt-get $(apt_opts) -q download "$real" >&2)
        mv "$tmp"/*.deb "$debs/$p.deb"
        rmdir "$tmp"
    done
fi
for p in "$@"; do echo "$debs/$p.deb"; done
