#!/usr/bin/env bash
# A/B rollback on U-Boot boards (qemu-aarch64 image, QEMU virt, TCG, cortex-a57), under
# Debian's u-boot-qemu and, for the same disk, under AAVMF:
#
#   S1 evidence of the problem: the image without /boot.scr under U-Boot: systemd-boot's
#      rename is refused (the trial is never counted) and init's report warns
#   U1 flashed v1 under U-Boot: distro boot runs the ESP's /boot.scr, which counts slot a's
#      try itself (a+3 -> a+2-1: fatwrite + fatrm), bootefi starts the UKI; init says the
#      U-Boot script booted it, marks good (a.conf), installs v2 (bundle on /dev/vdb)
#   U2 v2 boots on trial in slot b (b+3 -> b+2-1), is marked good (b.conf)
#   U3 b (good, default) installs v3-unhealthy (its gateway never becomes healthy:
#      riceguard.selftest=unhealthy) into slot a: a+3, the default
#   U4-6 three trials of a, each counted by the script before the kernel, each ended by
#      init (not healthy after 20 s: reboot); the ESP then holds a+0-3
#   U7 the script boots b by itself (a has no tries left), init says FALLBACK, b marked good
#   E1-4 the disk as it was after U3, under AAVMF: systemd-boot (not /boot.scr) counts a
#      down 3 times by renames and falls back to b: the EDK2 path of the same image
#
# Evidence is the serial logs (out/test-uboot-rollback/*.log) and the ESP's entries after
# each boot (mdir). Firmware setup: ci/lib/firmware.sh (shared with other aarch64 tests).
# usage: ci/test-uboot-rollback.sh
# env:   RG_UBR_WORK (default out/test-uboot-rollback), RG_UBR_KEEP=1 keeps the disks,
#        RG_UBR_BOOT_TIMEOUT (s per boot, default 300), RG_UBR_AAVMF=0 leaves the AAVMF
#        part (E1-4) out (make test does: aarch64-generic's board test rolls back under AAVMF)
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
. ci/lib/firmware.sh
h_init test-uboot-rollback
require_tools qemu-system-aarch64 mkimage mdir mtype mdel sfdisk jq debugfs e2fsck losetup
[ -f "$FW_UBOOT" ] || h_abort "no $FW_UBOOT (u-boot-qemu; ci/deps.sh)"
board=qemu-aarch64
T=${RG_UBR_BOOT_TIMEOUT:-300}
work=${RG_UBR_WORK:-$PWD/out/test-uboot-rollback}
rm -rf "$work"
mkdir -p "$work"
t_all=$SECONDS
loops=()
cleanup() { for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done; }
at_exit cleanup
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}

# perm_put DISK FILE NAME: write FILE into perm as NAME, offline. The journal is replayed
# first (a guest that rebooted leaves its last transactions there: see ci/test-update.sh).
perm_put() {
    local dev rc
    dev=$(losetup -f --show -o "$(part_off "$1" perm)" --sizelimit "$(part_size "$1" perm)" "$1") || return 1
    loops+=("$dev")
    e2fsck -fy "$dev" >/dev/null 2>&1
    rc=$?
    losetup -d "$dev"
    [ "$rc" -lt 4 ] || return 1
    debugfs -w -R "rm $3" "$1?offset=$(part_off "$1" perm)" >/dev/null 2>&1
    debugfs -w -R "write $2 $3" "$1?offset=$(part_off "$1" perm)" >/dev/null 2>&1
}
have() { grep -qaE -- "$2" "$1"; }
never() { return 1; }
good_boot() { grep -qaE 'riceguard-init: (boot marked good|FATAL|rebooting)' "$1"; }
# boot FW NAME DISK UNTIL [QEMU args]: one boot, log in $work/NAME.log.txt (CR dropped).
boot() {
    local fw=$1 name=$2 disk=$3 until=$4
    shift 4
    fw_boot "$fw" "$disk" "$work/$name.log" "$T" "$until" "$@"
    tr -d '\r' <"$work/$name.log" >"$work/$name.log.txt"
    l=$work/$name.log.txt
    echo "     $name ($fw): ${FW_SECS}s, status $FW_STATUS, ESP entries now: $(esp_entries "$disk")"
    boots+=("$name ${FW_SECS}s")
}
boots=()

# ---------------------------------------------------------------------------------------
echo "== images v1, v2, v3-unhealthy ($board) and bundles"
t0=$SECONDS
seed=$work/seed
mkdir -p "$seed"
printf '/dev/vdb\n' >"$seed/update-on-boot"
printf '/dev/vdb\n' >"$work/req"
build() { # NAME VERSION [env...]
    local name=$1 v=$2; shift 2
    env "$@" RG_OUT="$work/$name" RG_VERSION="$v" ${bin:+RG_BIN=$bin} image/build.sh "$board" >"$work/$name.build" 2>&1 \
        || { tail -20 "$work/$name.build"; return 1; }
}
bin=""
build v1 v1 RG_BUILD=1 RG_PERM_SEED="$seed" || h_abort "image v1 build"
bin=$PWD/target/aarch64-unknown-linux-musl/release/riceguard
if build v2 v2 RG_BUILD=2 && build v3u v3-unhealthy RG_BUILD=3 RG_CMDLINE_EXTRA=riceguard.selftest=unhealthy \
    && RG_OUT=$work/v2 image/bundle.sh "$board" >"$work/v2.bundle.log" 2>&1 \
    && RG_OUT=$work/v3u image/bundle.sh "$board" >"$work/v3u.bundle.log" 2>&1; then
    ok "images and bundles built ($((SECONDS - t0))s)"
else
    h_abort "image/bundle builds (logs in $work)"
fi
for b in v2/riceguard-$board-v2 v3u/riceguard-$board-v3-unhealthy; do
    cp "$work/$b.bundle" "$work/${b%%/*}.disk" && truncate -s %512 "$work/${b%%/*}.disk"
done
disk=$work/disk.img
cp "$work/v1/riceguard-$board.img" "$disk"
check "ESP carries /boot.scr (a U-Boot script image of image/uboot/boot.cmd)" \
    bash -c "$(declare -f esp_cat part_off); esp_cat '$disk' ::/boot.scr | head -c 4 | od -An -tx1 | grep -q '27 05 19 56'"
check "ESP is partition 1 and LegacyBIOSBootable (distro boot's part list -bootable)" \
    sh -c "sfdisk --json '$disk' | jq -e '.partitiontable.partitions[0] | (.name == \"esp\") and (.attrs | test(\"LegacyBIOSBootable\"))'"
check "factory entry: a+3 only" test "$(esp_entries "$disk")" = riceguard-a+3.conf
check "factory entry: sort-key is its last line" bash -c "$(declare -f esp_cat part_off); esp_cat '$disk' ::/loader/entries/riceguard-a+3.conf | tail -1 | grep -qx 'sort-key riceguard-0'"

# ---------------------------------------------------------------------------------------
echo "== U-Boot without /boot.scr: systemd-boot cannot count (the problem the script solves)"
cp --sparse=always "$disk" "$work/disk-sdboot.img"
mdel -i "$work/disk-sdboot.img@@$(part_off "$disk" esp)" ::/boot.scr
boot uboot s1 "$work/disk-sdboot.img" good_boot
check "s1: U-Boot fell through to systemd-boot, whose rename is refused" have "$l" "Failed to rename '.loader.entries.riceguard-a\+3.conf' to 'riceguard-a\+2-1.conf', ignoring: Access denied"
check "s1: so the trial entry is not counted (still a+3 at init)" have "$l" 'slot a on trial \(riceguard-a\+3.conf: 3 tries left, 0 used\)'
check "s1: init warns that this boot path cannot roll back" have "$l" 'WARNING: systemd-boot on U-Boot cannot count tries'
rm -f "$work/disk-sdboot.img"

# ---------------------------------------------------------------------------------------
echo "== U-Boot: first boot marked good, update to slot b, its trial marked good"
boot uboot u1 "$disk" never -drive "if=none,id=x1,format=raw,readonly=on,file=$work/v2.disk" -device virtio-blk-pci,drive=x1
check "u1: distro boot ran /boot.scr from the ESP" have "$l" 'Found U-Boot script /boot.scr'
check "u1: the script counted slot a's try (a+3 -> a+2-1) before the kernel" have "$l" 'riceguard-uboot: slot a on trial: riceguard-a\+3.conf -> riceguard-a\+2-1.conf'
check "u1: systemd-boot was not run (no rename attempt)" bash -c "! grep -qa 'Failed to rename' '$l'"
check "u1: init knows the U-Boot script booted it" have "$l" 'booted by the U-Boot boot script: slot a from riceguard-a\+2-1.conf'
check "u1: first boot marked good (a+2-1 -> a.conf)" have "$l" 'boot marked good \(riceguard-a\+2-1.conf -> riceguard-a.conf\)'
check "u1: v2 installed into slot b" have "$l" 'installed v2 into slot b'
check "u1: ESP: a good, b on trial" test "$(esp_entries "$disk")" = "riceguard-a.conf riceguard-b+3.conf"
k1=$(grep -a '^riceguard: public key' "$l" | head -1)

boot uboot u2 "$disk" good_boot
check "u2: the script tries b (b+3 -> b+2-1)" have "$l" 'riceguard-uboot: slot b on trial: riceguard-b\+3.conf -> riceguard-b\+2-1.conf'
check "u2: slot b booted, by the U-Boot script, on trial" bash -c "grep -qa 'slot b booted' '$l' && grep -qa 'booted by the U-Boot boot script: slot b from riceguard-b+2-1.conf' '$l'"
check "u2: the trial is marked good (b+2-1 -> b.conf)" have "$l" 'boot marked good \(riceguard-b\+2-1.conf -> riceguard-b.conf\)'
check "u2: ESP: both good" test "$(esp_entries "$disk")" = "riceguard-a.conf riceguard-b.conf"

# ---------------------------------------------------------------------------------------
echo "== U-Boot: a bad update (gateway never healthy) is tried 3 times, then slot b again"
check "u3: update request written into perm" perm_put "$disk" "$work/req" update-on-boot
boot uboot u3 "$disk" never -drive "if=none,id=x1,format=raw,readonly=on,file=$work/v3u.disk" -device virtio-blk-pci,drive=x1
check "u3: b (good, the default) booted uncounted" have "$l" 'riceguard-uboot: booting slot b \(riceguard-b.conf\)'
check "u3: v3-unhealthy installed into slot a" have "$l" 'installed v3-unhealthy into slot a'
check "u3: ESP: a on trial, b good" test "$(esp_entries "$disk")" = "riceguard-a+3.conf riceguard-b.conf"
cp --sparse=always "$disk" "$work/disk-aavmf.img"
for i in 1 2 3; do
    boot uboot "u-fail$i" "$disk" never
    left=$((3 - i))
    check "u-fail$i: the script counted a's try $i (left $left) before the kernel" have "$l" "riceguard-uboot: slot a on trial: .* -> riceguard-a\+$left-$i.conf"
    check "u-fail$i: init gave up on the unhealthy gateway and rebooted, not marked good" \
        bash -c "grep -qa 'gateway not healthy after 20s on slot a (on trial)' '$l' && ! grep -qa 'boot marked good' '$l'"
done
check "u: ESP after 3 failed trials: a+0-3, b good" test "$(esp_entries "$disk")" = "riceguard-a+0-3.conf riceguard-b.conf"
boot uboot u-back "$disk" good_boot
check "u-back: the script passed over a (no tries left) for b" bash -c "grep -qa 'slot a: riceguard-a+0-3.conf (score 4); slot b: riceguard-b.conf (score 1)' '$l' && grep -qa 'riceguard-uboot: booting slot b (riceguard-b.conf)' '$l'"
check "u-back: slot b runs, console says FALLBACK" bash -c "grep -qa 'slot b booted' '$l' && grep -qa 'FALLBACK: slot a (riceguard-a+0-3.conf) failed 3 boots' '$l'"
check "u-back: marked good on b, perm kept (same key)" bash -c "grep -qa 'boot marked good' '$l' && grep -qaF '$k1' '$l'"
check "u-back: ESP unchanged by the fallback boot" test "$(esp_entries "$disk")" = "riceguard-a+0-3.conf riceguard-b.conf"

# ---------------------------------------------------------------------------------------
if [ "${RG_UBR_AAVMF:-1}" = 0 ]; then
    echo "== AAVMF part left out (RG_UBR_AAVMF=0)"
else
echo "== AAVMF, the same disk after the bad update: systemd-boot counts and rolls back"
d2=$work/disk-aavmf.img
for i in 1 2 3; do
    boot aavmf "e-fail$i" "$d2" never
    check "e-fail$i: systemd-boot (not /boot.scr) booted a on trial, init rebooted" \
        bash -c "! grep -qa 'riceguard-uboot' '$l' && grep -qa 'slot a booted' '$l' && grep -qa 'gateway not healthy after 20s on slot a (on trial)' '$l'"
done
check "e: ESP after 3 failed trials: a+0-3 (systemd-boot's renames), b good" test "$(esp_entries "$d2")" = "riceguard-a+0-3.conf riceguard-b.conf"
boot aavmf e-back "$d2" good_boot
check "e-back: systemd-boot fell back to b, FALLBACK, marked good" bash -c "grep -qa 'booted by systemd-boot' '$l' && grep -qa 'slot b booted' '$l' && grep -qa 'FALLBACK: slot a (riceguard-a+0-3.conf) failed 3 boots' '$l' && grep -qa 'boot marked good' '$l'"
fi

echo
for n in "${notes[@]}"; do echo "note: $n"; done
echo "boots: ${boots[*]}"
echo "test-uboot-rollback took $((SECONDS - t_all))s"
[ -n "${RG_UBR_KEEP:-}" ] || rm -f "$work"/*.img "$work"/*.disk
h_finish
