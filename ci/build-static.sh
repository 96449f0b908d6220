#!/usr/bin/env bash
# Build the static (musl) riceguard for each architecture named on the command line
# (x86_64, aarch64). Linker and C compiler choices: ../shared/ENVIRONMENT.md —
# rust-lld for both, gcc (x86_64) / clang+llvm-ar (aarch64) for ring's C code.
#
# Both architectures' compiler variables are set on every call, whichever arch it builds:
# ring's build script reruns when one of them changes, so `build-static.sh x86_64 aarch64`
# followed by `build-static.sh aarch64` (image/build.sh) must see the same environment or
# the second call rebuilds ring and riceguard for nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- x86_64 aarch64
export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-gcc}
export CC_aarch64_unknown_linux_musl=${CC_aarch64_unknown_linux_musl:-clang}
export AR_aarch64_unknown_linux_musl=${AR_aarch64_unknown_linux_musl:-llvm-ar}
export CFLAGS_aarch64_unknown_linux_musl=${CFLAGS_aarch64_unknown_linux_musl:---target=aarch64-linux-musl}
for arch in "$@"; do
    triple="$arch-unknown-linux-musl"
    case "$arch" in
        x86_64 | aarch64) ;;
        *) echo "unknown arch $arch (x86_64, aarch64)" >&2; exit 2 ;;
    esac
    echo "== riceguard for $triple"
    cargo build --release --locked --target "$triple" -p riceguard
    bin="target/$triple/release/riceguard"
    file "$bin" 2>/dev/null || true
    if command -v file >/dev/null && ! file "$bin" | grep -q "statically linked"; then
        echo "error: $bin is not statically linked" >&2
        exit 1
    fi
done
