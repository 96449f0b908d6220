#!/usr/bin/env bash
# Fuzz the core parsers: each cargo-fuzz target in fuzz/ runs for SECONDS (default 30).
#
#   ci/fuzz.sh [SECONDS]
#
# Exits non-zero if any target crashes (reproducer under fuzz/artifacts/TARGET/).
# Installs cargo-fuzz into ~/.cargo/bin when missing. Uses a nightly toolchain if
# rustup has one, else stable with RUSTC_BOOTSTRAP=1 (stable ships the ASan runtime);
# if the sanitizer build fails it retries with `-s none`. If cargo-fuzz cannot be
# installed or built at all, it runs the same checks as `cargo test` over the seed
# corpus and seeded mutations (no coverage guidance) and says so.
# Env: FUZZ_TOOLCHAIN=nightly|stable to force one.
set -euo pipefail

SECS="${1:-30}"
case "$SECS" in ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
TARGETS=(ini uapi allowed_ips datagram console_line framing gso_split)

fallback() {
    echo "fuzz: $1; running the fuzz checks as seeded cargo tests instead (no coverage guidance, no sanitizer)"
    cargo test --release --no-default-features
    exit $?
}

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install cargo-fuzz --locked || fallback "cargo-fuzz could not be installed"
fi

TC=()
want="${FUZZ_TOOLCHAIN:-}"
if [ "$want" != stable ] && rustup run nightly rustc --version >/dev/null 2>&1; then
    TC=(+nightly)
    echo "fuzz: toolchain $(rustup run nightly rustc --version)"
else
    export RUSTC_BOOTSTRAP=1
    echo "fuzz: toolchain $(rustc --version) with RUSTC_BOOTSTRAP=1"
fi

SAN=()
if ! cargo "${TC[@]}" fuzz build "${SAN[@]}"; then
    SAN=(-s none)
    echo "fuzz: sanitizer build failed; retrying without a sanitizer"
    cargo "${TC[@]}" fuzz build "${SAN[@]}" || fallback "cargo fuzz build failed"
fi

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t"
    log="$(mktemp)"
    echo "fuzz: $t for ${SECS}s"
    # libFuzzer stops itself after -max_total_time; `timeout` is the backstop.
    if timeout --kill-after=10 $((SECS + 60)) \
        cargo "${TC[@]}" fuzz run "${SAN[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 >"$log" 2>&1; then
        :
    else
        failed+=("$t")
        grep -E -A8 "panicked at|ERROR: (libFuzzer|AddressSanitizer)" "$log" | head -n 40 || true
        tail -n 25 "$log"
    fi
    done_line="$(grep -E '^Done [0-9]+ runs in' "$log" | tail -n 1 || true)"
    summary+=("$t: ${done_line:-no result (see above)}")
    rm -f "$log"
done

printf 'fuzz: %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (reproducers in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: all targets ran clean"
