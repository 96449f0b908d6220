#!/usr/bin/env bash
# The `cross` stage: riceguard built by cross-rs (Cross.toml) in the image from Debian
# packages that `make deps` builds (ci/cross/build-image.sh), for both musl targets, into
# target/cross/ so the default build's target/<triple>/ stays untouched. For each: ring's C
# went through the image's compiler for the target; the binary is static (file: "statically
# linked", no PT_INTERP), for its architecture (ELF machine), and works: --version as the
# native build says it, `genkey | pubkey` gives a 44-character base64 key equal to what the
# native riceguard and wireguard-tools' `wg pubkey` compute from the same private key (the
# aarch64 binary runs under qemu-aarch64-static).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/cross/env.sh
. ci/cross/env.sh

fail() { echo "cross: FAIL: $*" >&2; exit 1; }
need_deps() { echo "cross: $* — run \`make deps\` (ci/deps.sh builds it)" >&2; exit 1; }

command -v podman >/dev/null || need_deps "podman is not installed"
command -v qemu-aarch64-static >/dev/null || need_deps "qemu-aarch64-static is not installed"
command -v wg >/dev/null || need_deps "wg (wireguard-tools) is not installed"
cargo install --list | grep -qx "cross v$CROSS_VERSION:" || need_deps "cross $CROSS_VERSION is not installed"
ci/cross/build-image.sh --check >/dev/null || need_deps "$(ci/cross/build-image.sh --check || true)"

# The native build: the reference for --version and pubkey.
cargo build --locked --release -p riceguard
native=target/release/riceguard
want_version=$("$native" --version)

# Fingerprints of the default build's binaries, to show cross leaves them alone.
declare -A before
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    f=target/$t/release/riceguard
    before[$t]=$( [ -f "$f" ] && sha256sum < "$f" || echo none)
done

is_key() { [[ "$1" =~ ^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$ ]]; }

sizes=()
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    case "$t" in
        x86_64-*) machine="Advanced Micro Devices X86-64"; run=(); cc=musl-gcc ;;
        aarch64-*) machine="AArch64"; run=(qemu-aarch64-static); cc=aarch64-linux-musl-gcc ;;
    esac
    echo "--- cross build --release --target $t"
    t0=$SECONDS
    cross build --release --locked --target "$t" -p riceguard --target-dir target/cross
    echo "cross: built $t in $((SECONDS - t0)) s"
    bin=target/cross/$t/release/riceguard
    [ -x "$bin" ] || fail "$bin missing"
    # ring's C went through the image's compiler (its build script's output says which).
    grep -qx "CC_${t//-/_} = Some($cc)" target/cross/"$t"/release/build/ring-*/output 2>/dev/null ||
        fail "ring for $t was not compiled with the image's $cc"

    desc=$(file -b "$bin")
    echo "cross: $bin: $desc"
    grep -q "statically linked" <<<"$desc" || fail "$bin is not statically linked"
    if readelf -lW "$bin" | grep -q INTERP; then fail "$bin has a PT_INTERP (program interpreter)"; fi
    got=$(readelf -hW "$bin" | sed -n 's/^ *Machine: *//p')
    [ "$got" = "$machine" ] || fail "$bin is for '$got', not '$machine'"

    v=$("${run[@]}" "$bin" --version) || fail "$bin --version failed"
    [ "$v" = "$want_version" ] || fail "$bin --version says '$v', native says '$want_version'"
    priv=$("${run[@]}" "$bin" genkey) || fail "$bin genkey failed"
    is_key "$priv" || fail "$bin genkey gave '$priv', not a 44-character base64 key"
    pub=$(printf '%s\n' "$priv" | "${run[@]}" "$bin" pubkey) || fail "$bin pubkey failed"
    is_key "$pub" || fail "$bin pubkey gave '$pub', not a 44-character base64 key"
    native_pub=$(printf '%s\n' "$priv" | "$native" pubkey)
    wg_pub=$(printf '%s\n' "$priv" | wg pubkey)
    [ "$pub" = "$native_pub" ] || fail "$t pubkey $pub, native riceguard says $native_pub"
    [ "$pub" = "$wg_pub" ] || fail "$t pubkey $pub, wg pubkey says $wg_pub"
    echo "cross: $t: static, $got, '$v', genkey | pubkey = $pub (= native, = wg)"

    f=target/$t/release/riceguard
    now=$( [ -f "$f" ] && sha256sum < "$f" || echo none)
    [ "$now" = "${before[$t]}" ] || fail "the default build's $f changed"
    default_size=$( [ -f "$f" ] && stat -c %s "$f" || echo "not built")
    sizes+=("$(printf '%-28s cross %9s bytes   default (ci/build-static.sh) %9s' "$t" "$(stat -c %s "$bin")" "$default_size")")
done
printf 'cross: %s\n' "${sizes[@]}"
echo "cross: both targets ok"
