#!/usr/bin/env bash
# The test command (README, `make test`, .ci/run). Stages, in order:
#   unit     cargo fmt check, clippy -D warnings, cargo test (core simulation, parsers, sys)
#   fuzz     each fuzz target for a bounded time
#   interop  real-peer matrix in network namespaces (wireguard-go, boringtun, riceguard, wg-quick)
#   fastpath the matrix on every forced data-plane path, pinning, GSO demotion, GRO on/off
#   tcp      TCP-fallback helpers in namespaces
#   image    build both QEMU boards' images twice, boot them under TCG, check the gateway;
#            then drive the x86_64 serial console (ci/test-console-qemu.sh)
#   update   flash script and signed A/B updates: host checks, then QEMU (ci/test-update.sh)
# `ci/test.sh` runs all; `ci/test.sh unit interop` runs the named ones.
# Ends with one line `N passed, N failed` counting stages.
set -uo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(unit fuzz interop fastpath tcp image update)

passed=0; failed=0; failed_names=()
run_stage() {
    local name=$1; shift
    echo
    echo "=================== stage: $name ==================="
    local t0=$SECONDS
    if "$@"; then
        passed=$((passed + 1)); echo "=== stage $name: ok ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1)); failed_names+=("$name"); echo "=== stage $name: FAILED ($((SECONDS - t0)) s)"
    fi
}

stage_unit() {
    cargo fmt --all -- --check &&
    cargo clippy --locked -p riceguard --all-targets -- -D warnings &&
    cargo test --locked -p riceguard
}

# Release binary for the network tests (host target; static musl for the image).
build_release() {
    cargo build --locked --release -p riceguard
}

for s in "${stages[@]}"; do
    case "$s" in
        unit) run_stage unit stage_unit ;;
        fuzz) run_stage fuzz ci/fuzz.sh "${FUZZ_SECONDS:-20}" ;;
        interop) run_stage interop bash -c 'cargo build --locked --release -p riceguard && ci/interop.sh' ;;
        fastpath) run_stage fastpath bash -c 'cargo build --locked --release -p riceguard && ci/fastpath.sh' ;;
        tcp) run_stage tcp bash -c 'cargo build --locked --release -p riceguard && ci/tcp-helpers.sh && ci/tcp-fallback.sh' ;;
        image) run_stage image bash -c 'ci/test-image.sh; r=$?; RG_CONSOLE_REBUILD=1 ci/test-console-qemu.sh && [ $r = 0 ]' ;;
        update) run_stage update ci/test-update.sh ;;
        *) echo "unknown stage $s (unit fuzz interop fastpath tcp image update)"; exit 2 ;;
    esac
done

echo
[ $failed -eq 0 ] || echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, $failed failed"
[ $failed -eq 0 ]
