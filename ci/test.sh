#!/usr/bin/env bash
# The test command (README, `make test`, .ci/run). Stages and their labs:
#   unit     cargo fmt check, clippy -D warnings, cargo test of the three crates (riceguard-core:
#            simulation, parsers, policy; riceguard-sys: kernel interfaces; riceguard: driver,
#            init, console)
#   fuzz     each fuzz target for a bounded time
#   interop  real-peer matrix in network namespaces (wireguard-go, boringtun, riceguard, wg-quick)
#   fastpath the matrix on every forced data-plane path, pinning, GSO demotion and rest, GRO on/off
#            (ci/fastpath.sh); one peer spread over every worker keeps each flow in order
#            under load: sequence-numbered UDP, and a TCP stream's reordering against the
#            receiver at --workers 1, riceguard and wireguard-go senders, trains handed
#            off (ci/order.sh)
#   tcp      TCP-fallback helpers in namespaces
#   adversarial  the data plane under attack in namespaces: forged responses/cookies,
#            initiation floods, replays (ci/adversarial.sh), TCP listener floods and
#            slow clients (ci/adversarial-tcp.sh), slow UAPI clients and failing sets
#            (ci/adversarial-uapi.sh), passive keepalive and padding with a stock peer
#            (ci/keepalive.sh), timer-made sends from the peer's sticky source on a
#            two-address uplink (ci/sticky-source.sh)
#   gateway  the appliance's network role in namespaces: one-armed (proxy ARP/NDP) and
#            two-armed LAN with a stock peer, reloads applied as diffs (ci/gateway-lan.sh);
#            the uplink cannot redirect the tunnel: no proxy entry for the router or an
#            address in use, `add client` skips them, a shadowed route said and installed
#            later, a conflicting RA prefix not used (ci/uplink-guard.sh);
#            the DHCP uplink client against dnsmasq and a short-lease server, with the
#            daemon's firewall in place, and SLAAC; leases that would take a tunnel
#            route's place declined with a back-off, summary overlaps kept and shown, a
#            rogue server's renewal ACK ignored, a stale lease file re-acquired at once
#            (ci/dhcp.sh); the firewall and NAT: the
#            README's first client from the factory configuration, full-tunnel clients
#            (NAT, NAT66), the uplink shut out two-armed, anti-spoofing, notrack under a
#            flood, the table across reloads, Firewall = off and a crash (ci/firewall.sh);
#            path MTU discovery through the firewall: bulk TCP both ways to a stock peer
#            behind a 1400/1280-byte hop, outer IPv4 and IPv6, and a peer on a full-MTU
#            path still sent GSO super-datagrams afterwards (ci/pmtu.sh);
#            the SNTP client against scripted servers in a dry run: a good answer steps,
#            kisses, LI=3, one far-future server, backward answers and DHCP's servers
#            change nothing, two agreeing configured servers step (ci/ntp.sh);
#            the console over SSH with Debian's OpenSSH client: key logins for a command
#            and a script (exit status), unknown keys, passwords and other login names
#            refused and logged, `add client` over SSH, a refused source, the host key
#            across a restart, 200 half-open connections, the 20 s login grace, nothing
#            listening without a key (ci/ssh.sh); peer health, two devices on one key, an
#            endpoint name resolved again when unanswered, the daemon's event log (ci/peer-health.sh);
#            remote syslog from a daemon run by hand to an RFC 5424 collector, UDP then
#            TCP octet counting: the session line's app-name and severity, a collector
#            away and back (the backlog, its drop notice first), no private key sent
#            (ci/syslog.sh); Debian's Prometheus scraping the appliance from the LAN
#            side (the phone's bytes as the UAPI says), the uplink refused and counted,
#            bad and slow requests, Metrics = off, Firewall = off (ci/metrics.sh); the
#            resolver on the box asked with dig through the tunnel (stock wireguard-go)
#            and from the LAN: an upstream name (dnsmasq), phone.home.arpa, reverse
#            lookups, TCP; nothing for the uplink, Firewall = off too; a tunnel address
#            in an upstream answer dropped; forged answers (wrong ID, wrong port) ignored;
#            a flood from one client cut while another is answered (ci/dns.sh);
#            per-client access with stock clients, two-armed: a lan-only client that sets
#            its own AllowedIPs to 0.0.0.0/0, a one-port kiosk, a site-to-site peer's
#            subnet, ClientIsolation by reload, the per-peer drop counter in status and
#            metrics, the LAN starting traffic to a restricted client; one-armed, lan
#            being the uplink's own subnet (ci/access.sh);
#            the MSS clamp, IPv4 and IPv6: a 2 MiB fetch across the 1420-byte tunnel
#            from a LAN host that drops "fragmentation needed" / "packet too big"
#            completes, and stalls with the clamp's rules deleted (ci/mss.sh)
#   cross    riceguard built by cross-rs (Cross.toml) in the local image `make deps` made
#            from Debian packages, for both musl targets: static, right ELF machine,
#            --version and genkey | pubkey (aarch64 under qemu-aarch64-static) agreeing
#            with the native build and wg (ci/test-cross.sh)
#   image    build both QEMU boards' images twice, boot them under TCG, check the gateway
#            and the clock (RTC at 2001: the build time, the saved time after a power
#            cut, an SNTP server in the namespace); then drive the x86_64 serial console
#            (ci/test-console-qemu.sh) and two consoles at once, serial + virtio
#            (ci/test-console2-qemu.sh)
#   board    the x86_64-generic board as hardware: flashed NVMe, 2 x igb, DHCP uplink,
#            clients added on the serial console reach LAN hosts one- and two-armed, the
#            console over SSH from the LAN host, an export imported onto a freshly
#            flashed box (ci/test-generic-board.sh); then aarch64-generic the same way on
#            QEMU virt + AAVMF (one-armed, SSH), with an update into slot b and a rollback
#            from a bad slot a (the SSH host key kept);
#            then the U-Boot boot path: the qemu-aarch64 image under u-boot-qemu, whose
#            /boot.scr counts a bad update's tries and falls back (ci/test-uboot-rollback.sh)
#   update   the flash script refuses disks with anything stacked on them in use
#            (ci/test-flash-stacking.sh), then signed A/B updates: host checks, then QEMU
#            (ci/test-update.sh)
#
# How a full run is scheduled (`ci/test.sh` with no stage named). First `build`: every
# binary the labs run (the host riceguard, both static musl builds) and the update signing
# key. Then the LANES side by side, each running its stages in order:
#   image update      QEMU under TCG (a boot mostly waits on the guest: about 0.6 of a core)
#   board fuzz tcp    QEMU, the generic boards as hardware and U-Boot; then the fuzz build;
#                     then the TCP fallback's labs (moved here from the third lane, the
#                     longest, when the board stage grew the SSH and restore phases; unit
#                     has long finished by then, see below)
#   unit interop ... cross
#                     unit first (in target/unit, so cargo's lock on target/ is free for the
#                     image builds; before the namespace labs, because its hugepage tests
#                     change vm.nr_hugepages, which those labs' daemons would see), then the
#                     namespace labs (they mostly wait on timers), then the cross build
# Measured, not guessed: the per-lab CPU seconds in out/test/times.json say how much of
# the 2 cores each lane takes. Labs side by side share nothing: namespaces, interfaces,
# UAPI sockets and status files carry the lab's PID, each lab has its own out/ directory,
# cargo builds are done before (fuzz, cross and the update test's old firmware use target
# directories of their own), the Debian packages are in .cache before (ci/deps.sh), loop
# devices are allocated by losetup -f (atomic) and each lab detaches only its own.
# RG_TEST_SERIAL=1 runs the same stages one after another instead.
#
#   ci/test.sh                    everything, as above
#   ci/test.sh unit interop       the named stages, one after another
#   ci/test.sh --lab ci/dhcp.sh   one lab alone (any ci/*.sh lab), timed like a stage's
#   ci/test.sh --list             the stages and their labs
#
# Each stage's output goes to out/test/STAGE.log and is printed whole when the stage ends
# (so lanes side by side never interleave), with a line per lab and per stage:
#   === lab ci/dhcp.sh: ok (wall 61 s, cpu 12.3 s)
#   === stage gateway: ok (wall 303 s, cpu 80.1 s)
# At the end: a table of stages (wall and CPU seconds, checks passed), the total, and the
# same as JSON in out/test/times.json. Ends with one line `stages: N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
ALL=(unit fuzz interop fastpath tcp adversarial gateway cross image board update)
# The lanes of a full run (after build and unit), each a list of stages run in order,
# balanced by their measured walls (2026-12-04: image+update 1646 s; board+fuzz+tcp 1595 s
# plus interop 187 s; unit, fastpath, adversarial, the gateway's labs (about 550 s with
# the metrics, syslog and peer-health labs; access and mss add about 50 s) and cross
# about 1720 s).
LANES=("image update" "board fuzz tcp interop" "unit fastpath adversarial gateway cross")
OUT=$top/out/test

# ---- the labs of each stage: one command line each, run in order, every one even when
# an earlier one failed (a stage fails if any of its labs did) ----------------------------
labs_of() {
    case $1 in
        # The update signing key too: image builds in two lanes must not both make one.
        build) printf '%s\n' 'cargo build --locked --release -p riceguard' 'ci/build-static.sh x86_64 aarch64' \
            'image/keys.sh pub' ;;
        unit)
            # Tests that need root (namespaces, TUN) are #[ignore = "needs root ..."], so a run
            # without root reports them as ignored; here (CI runs as root) they run too. A test
            # whose kernel feature is missing says "not run" and passes elsewhere, but fails here
            # (RG_TEST_STRICT). Tests named bench_* are measurements, not checks: left out.
            # In a target directory of its own: its compile never holds cargo's lock on
            # target/, which the image builds of the QEMU lanes take (for a no-op build).
            printf '%s\n' 'cargo fmt --all -- --check' \
                'env CARGO_TARGET_DIR=target/unit cargo clippy --locked --workspace --all-targets -- -D warnings' \
                'env CARGO_TARGET_DIR=target/unit RG_TEST_STRICT=1 cargo test --locked --workspace -- --include-ignored --skip bench_' ;;
        fuzz) echo "ci/fuzz.sh ${FUZZ_SECONDS:-6}" ;;
        interop) echo ci/interop.sh ;;
        fastpath) printf '%s\n' ci/fastpath.sh ci/order.sh ;;
        tcp) printf '%s\n' ci/tcp-helpers.sh ci/tcp-fallback.sh ;;
        adversarial) printf '%s\n' ci/adversarial.sh ci/adversarial-tcp.sh ci/adversarial-uapi.sh ci/keepalive.sh ci/sticky-source.sh ;;
        gateway) printf '%s\n' ci/gateway-lan.sh ci/uplink-guard.sh ci/dhcp.sh ci/firewall.sh ci/pmtu.sh ci/ntp.sh ci/ssh.sh ci/peer-health.sh ci/syslog.sh ci/metrics.sh ci/dns.sh ci/access.sh ci/mss.sh ;;
        cross) echo ci/test-cross.sh ;;
        # The console tests boot copies of the qemu-x86_64 image test-image.sh built (and
        # checked as reproducible) rather than building it a third time.
        image) printf '%s\n' 'env RG_IMAGE_KEEP=1 ci/test-image.sh' \
            "env RG_OUT=$top/out/test-image/qemu-x86_64-1 ci/test-console-qemu.sh" \
            "env RG_OUT=$top/out/test-image/qemu-x86_64-1 ci/test-console2-qemu.sh" ;;
        # U-Boot's rollback on the qemu-aarch64 image; its AAVMF half is left out here:
        # aarch64-generic's own test rolls back under AAVMF.
        board) printf '%s\n' 'env RG_BOARD_REBUILD=1 ci/test-generic-board.sh' \
            'env BOARD=aarch64-generic RG_BOARD_REBUILD=1 ci/test-generic-board.sh' \
            'env RG_UBR_AAVMF=0 ci/test-uboot-rollback.sh' ;;
        update) printf '%s\n' ci/test-flash-stacking.sh ci/test-update.sh ;;
        *) return 1 ;;
    esac
}
# What a stage leaves behind that nothing reads again (disk images are big).
after_stage() {
    case $1 in
        image) rm -f out/test-image/*.img out/test-image/*/riceguard-*.img ;;
    esac
}

# CPU_NOW: children's CPU seconds (user + system) of this shell so far, from `times` (run
# in this shell, not in a $(...) subshell, whose own children are none).
cpu_now() {
    local f=$OUT/.times.$BASHPID
    times >"$f"
    CPU_NOW=$(sed -n 2p "$f" | awk '{
        t = 0
        for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] }
        printf "%.1f", t }')
    rm -f "$f"
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", b - a + 0.5 }'; }

# A lab's number of checks that passed: the last "N passed, N failed" it printed, or for
# cargo test the sum of its "test result: ok. N passed;" lines.
checks_in() {
    if grep -qa '^test result: ' "$1"; then
        grep -aoE '^test result: [a-zA-Z]+\. [0-9]+ passed' "$1" | awk '{ s += $4 } END { print s + 0 }'
    else
        grep -aoE '[0-9]+ passed, [0-9]+ failed' "$1" | tail -1 | cut -d' ' -f1
    fi
}

# run_lab STAGE LABLINE: run one lab in the foreground, its timing appended to the stage's
# record. Output goes where the caller's stdout goes.
run_lab() {
    local stage=$1 line=$2 t0 c0 rc lablog cpu wall n
    lablog=$OUT/$stage.lab.$(printf '%s' "$line" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-80).log
    echo "--- lab $line"
    t0=$(now)
    cpu_now; c0=$CPU_NOW
    bash -c "$line" 2>&1 | tee "$lablog"
    rc=${PIPESTATUS[0]}
    wall=$(secs "$t0" "$(now)")
    cpu_now; cpu=$(awk -v a="$c0" -v b="$CPU_NOW" 'BEGIN { printf "%.1f", b - a }')
    n=$(checks_in "$lablog")
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$stage" "$line" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" "$wall" "$cpu" "${n:-}" >>"$OUT/$stage.labs"
    echo "=== lab $line: $([ "$rc" = 0 ] && echo ok || echo FAILED) (wall $wall s, cpu $cpu s${n:+, $n checks passed})"
    rm -f "$lablog"
    return "$rc"
}

# run_stage STAGE: its labs in order; the record in out/test/STAGE.{labs,time}.
run_stage() {
    local stage=$1 line rc=0 t0 c0 wall cpu
    local -a lines
    mapfile -t lines < <(labs_of "$stage")
    : >"$OUT/$stage.labs"
    echo "=================== stage: $stage ==================="
    t0=$(now)
    cpu_now; c0=$CPU_NOW
    for line in "${lines[@]}"; do
        run_lab "$stage" "$line" || rc=1
    done
    after_stage "$stage"
    wall=$(secs "$t0" "$(now)")
    cpu_now; cpu=$(awk -v a="$c0" -v b="$CPU_NOW" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$stage" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$wall" "$cpu" >"$OUT/$stage.time"
    echo "=== stage $stage: $([ $rc = 0 ] && echo ok || echo FAILED) (wall $wall s, cpu $cpu s)"
    return $rc
}

# A stage in a lane: its output to out/test/STAGE.log, printed whole when it ends (under a
# lock, so two lanes' stages never interleave).
lane_stage() {
    local stage=$1 rc
    run_stage "$stage" >"$OUT/$stage.log" 2>&1
    rc=$?
    (
        flock 8
        echo
        cat "$OUT/$stage.log"
    ) 8>"$OUT/.print.lock"
    return $rc
}
run_lane() {
    local s
    for s in "$@"; do lane_stage "$s"; done
}

report() {
    local stage st wall cpu n total_wall=$1 json sep=""
    shift
    echo
    printf '%-12s %-7s %8s %8s %8s\n' stage result wall_s cpu_s checks
    json="{\"total_wall_s\": $total_wall, \"mode\": \"$MODE\", \"stages\": ["
    for stage in "$@"; do
        [ -f "$OUT/$stage.time" ] || continue
        IFS=$'\t' read -r _ st wall cpu <"$OUT/$stage.time"
        n=$(awk -F'\t' '{ s += $6 } END { print s + 0 }' "$OUT/$stage.labs")
        printf '%-12s %-7s %8s %8s %8s\n' "$stage" "$st" "$wall" "$cpu" "$n"
        json+="$sep{\"stage\": \"$stage\", \"result\": \"$st\", \"wall_s\": $wall, \"cpu_s\": $cpu, \"checks_passed\": $n, \"labs\": ["
        local lsep="" l_stage line lst lwall lcpu ln
        while IFS=$'\t' read -r l_stage line lst lwall lcpu ln; do
            line=${line//\\/\\\\}
            json+="$lsep{\"lab\": \"${line//\"/\\\"}\", \"result\": \"$lst\", \"wall_s\": $lwall, \"cpu_s\": $lcpu, \"checks_passed\": ${ln:-null}}"
            lsep=", "
        done <"$OUT/$stage.labs"
        json+="]}"
        sep=", "
    done
    json+="]}"
    printf '%-12s %-7s %8s\n' total "" "$total_wall"
    printf '%s\n' "$json" >"$OUT/times.json"
    echo "(per-stage and per-lab times: $OUT/times.json)"
}

case ${1:-} in
    --list)
        for s in build "${ALL[@]}"; do echo "$s:"; labs_of "$s" | sed 's/^/    /'; done
        exit 0 ;;
    --lab)
        shift
        [ $# -ge 1 ] || { echo "usage: ci/test.sh --lab 'ci/LAB.sh [ARGS]'" >&2; exit 2; }
        mkdir -p "$OUT"
        : >"$OUT/lab.labs"
        run_lab lab "$*"
        exit ;;
esac

stages=("$@")
for s in "${stages[@]}"; do
    labs_of "$s" >/dev/null || { echo "unknown stage $s (${ALL[*]})"; exit 2; }
done
mkdir -p "$OUT"
rm -f "$OUT"/*.labs "$OUT"/*.time "$OUT"/*.log
T0=$(now)
failed_names=()
if [ ${#stages[@]} -gt 0 ] || [ -n "${RG_TEST_SERIAL:-}" ]; then
    MODE=serial
    [ ${#stages[@]} -gt 0 ] || stages=(build "${ALL[@]}")
    for s in "${stages[@]}"; do
        echo
        run_stage "$s" || failed_names+=("$s")
    done
else
    MODE=lanes
    # shellcheck disable=SC2206 # a lane is a space-separated list of stage names
    stages=(build ${LANES[*]})
    echo "== build, then ${#LANES[@]} lanes side by side:$(printf ' [%s]' "${LANES[@]}")"
    lane_stage build || failed_names+=(build)
    if [ ${#failed_names[@]} -eq 0 ]; then
        pids=()
        for lane in "${LANES[@]}"; do
            # shellcheck disable=SC2086
            run_lane $lane &
            pids+=($!)
        done
        wait "${pids[@]}"
        for s in "${stages[@]:1}"; do
            grep -q $'\tok\t' "$OUT/$s.time" 2>/dev/null || failed_names+=("$s")
        done
    else
        echo "build failed: no lab can run"
    fi
fi
report "$(secs "$T0" "$(now)")" "${stages[@]}"
passed=$(( ${#stages[@]} - ${#failed_names[@]} ))
echo
[ ${#failed_names[@]} -eq 0 ] || echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, ${#failed_names[@]} failed"
[ ${#failed_names[@]} -eq 0 ]
