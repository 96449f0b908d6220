#!/usr/bin/env bash
# Fuzz the parsers and the datagram path: every cargo-fuzz target in fuzz/ (as
# `cargo fuzz list` names them, so new targets are picked up) runs for SECONDS (default
# 30), FUZZ_JOBS targets at a time (default: the number of CPUs).
#
#   ci/fuzz.sh [SECONDS]
#
# Exits non-zero if any target crashes (reproducer under fuzz/artifacts/TARGET/; replay
# it with `cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...`).
# Installs cargo-fuzz into ~/.cargo/bin when missing. Uses a nightly toolchain if
# rustup has one, else stable with RUSTC_BOOTSTRAP=1 (stable ships the ASan runtime);
# if the sanitizer build fails it retries with `-s none`. If cargo-fuzz cannot be
# installed or built at all, it runs the same checks as `cargo test` over the seed
# corpus and seeded mutations (no coverage guidance) and says so.
# Env: FUZZ_TOOLCHAIN=nightly|stable to force one; FUZZ_JOBS=N targets in parallel.
#
# Time on a fresh 2-CPU machine: cargo-fuzz install ~45 s, build ~2 min (CPU time
# ~3 min, ASan + coverage, all targets at once), then ceil(targets / FUZZ_JOBS) rounds
# of SECONDS: 10 targets at 20 s on 2 CPUs is 100 s.
set -euo pipefail

SECS="${1:-30}"
case "$SECS" in ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac
JOBS="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}"
case "$JOBS" in ''|0|*[!0-9]*) echo "fuzz: FUZZ_JOBS must be a positive number" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
t0=$SECONDS

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
echo "fuzz: built in $((SECONDS - t0)) s"

mapfile -t TARGETS < <(cargo "${TC[@]}" fuzz list)
[ "${#TARGETS[@]}" -gt 0 ] || { echo "fuzz: cargo fuzz list named no targets" >&2; exit 1; }
echo "fuzz: ${#TARGETS[@]} targets (${TARGETS[*]}), ${SECS}s each, $JOBS at a time"

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# One target; its exit status lands in $logs/$t.rc.
run_one() {
    local t=$1 rc=0
    mkdir -p "corpus/$t"
    # libFuzzer stops itself after -max_total_time; `timeout` is the backstop.
    # -timeout: one input running this long is reported (with a reproducer) as a hang.
    timeout --kill-after=10 $((SECS + 60)) \
        cargo "${TC[@]}" fuzz run "${SAN[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -timeout=30 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"$logs/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/$t.rc"
}

running=0
for t in "${TARGETS[@]}"; do
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "fuzz: $t for ${SECS}s"
    run_one "$t" &
    running=$((running + 1))
done
wait || true

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    log="$logs/$t.log"
    rc="$(cat "$logs/$t.rc" 2>/dev/null || echo missing)"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        # Only the backstop: libFuzzer reports a hanging input itself (-timeout), so
        # this is a local corpus too big to replay within SECONDS + 60 (libFuzzer
        # replays it all before it looks at the clock). Not a finding.
        echo "fuzz: warning: $t was stopped by the backstop (a large corpus/$t? 'cargo fuzz cmin $t' shrinks it)"
    elif [ "$rc" != 0 ]; then
        failed+=("$t")
        echo "---- fuzz: $t failed (exit $rc)"
        grep -E -A8 "panicked at|ERROR: (libFuzzer|AddressSanitizer)" "$log" | head -n 40 || true
        tail -n 25 "$log" || true
    fi
    done_line="$(grep -E '^Done [0-9]+ runs in' "$log" 2>/dev/null | tail -n 1 || true)"
    summary+=("$t: ${done_line:-no result (see above)}")
done

printf 'fuzz: %s\n' "${summary[@]}"
echo "fuzz: stage took $((SECONDS - t0)) s"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (reproducers in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: all targets ran clean"
