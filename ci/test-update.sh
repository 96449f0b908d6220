#!/usr/bin/env bash
# Flashing and A/B update tests (qemu-x86_64):
#
# host (no QEMU):
#   - unit tests of the bundle parser/verifier and of the update engine on a disk file
#   - flash-scripts/flash: into a bigger image file (table verified, backup GPT at the
#     end, perm grown, fsck clean), into an unmounted loop device; refusals (exit 2, no
#     byte written): too small, mounted loop device, file attached to a loop device, a
#     partition, the host's own system disk, no confirmation
#   - bundles: make, sign, and the refused variants (bad signature, wrong board, a
#     newer configuration schema, an older one only (schema 1), corrupted body, not newer:
#     a downgrade); the good one spans schema 1 (devices of two releases ago) to this
#     tree's COMPAT
# QEMU (TCG, OVMF; bundles reach the guest as extra virtio disks, the request as a file
# seeded into perm, see gateway/src/update/mod.rs BOOT_REQUEST):
#   0. today's firmware (RG_UPDATE_OLD, default 31a60ec: the release in the field, of
#      configuration schema 2; 7cd04a5 is the last of schema 1), built from its own tree
#      in a git worktree, cached in out/test-update-old/) boots with a saved configuration
#      (two named peers), installs v2 (this tree's schema); v2 boots on trial, is marked
#      good, keeps the peers, has its firewall in place; the console saves settings of
#      schema 2 (masquerade off, a disabled client: `#+` lines) and 3 (Ntp,
#      UplinkOverlap: `#3+` lines) and `rollback-slot` + `reboot` go back to slot A: the
#      old firmware loads the saved file (no fallback), is healthy and runs the peer that
#      is not disabled
#   1. flashed v1 (build 1) boots, refuses 6 bad bundles naming the check (one of them
#      v2's content signed as build 1: a downgrade), installs v2 (build 2) into slot B
#   2. reboots into slot B running v2: on trial, marked good, perm (key) kept
#   3. QEMU killed in the middle of writing an update: the old slot still boots
#   4. a broken v3 (root without /sbin/init) installed into slot A fails 3 boots, then
#      systemd-boot falls back to B, and the console says FALLBACK
#   5. the same with a v3 that boots but whose gateway never becomes healthy (test image
#      with riceguard.selftest=unhealthy: init gives up after 20 s and reboots)
#
# usage: ci/test-update.sh [host]     (host: skip the QEMU part)
# env:   RG_UPDATE_BOOT_TIMEOUT (s per boot, default 240), RG_UPDATE_KEEP=1 keeps out/test-update,
#        RG_UPDATE_WORK (work directory, default out/test-update), RG_UPDATE_ONLY=compat
#        (no unit tests, no v3, QEMU 0 only), RG_UPDATE_OLD (the old firmware's commit)
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
. ci/lib/console.sh
h_init test-update
top=$PWD
board=qemu-x86_64
T=${RG_UPDATE_BOOT_TIMEOUT:-240}
work=${RG_UPDATE_WORK:-$top/out/test-update}
rm -rf "$work"
mkdir -p "$work"
have() { grep -qaE "$2" "$1"; }
t_all=$SECONDS
only=${RG_UPDATE_ONLY:-}
case $only in ''|compat) ;; *) echo "RG_UPDATE_ONLY is compat or empty" >&2; exit 2 ;; esac
loops=() mnts=() old_tree="" cpid=""
cleanup() {
    local i
    for ((i = ${#mnts[@]} - 1; i >= 0; i--)); do umount "${mnts[i]}" 2>/dev/null; done
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
    [ -z "$cpid" ] || cstop 0
    [ -z "$old_tree" ] || git worktree remove --force "$old_tree" 2>/dev/null
}
at_exit cleanup
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
perm_cat() { debugfs -R "cat $2" "$1?offset=$(part_off "$1" perm)" 2>/dev/null; }
# perm_replay DISK: replay perm's journal (e2fsck on a loop device over the partition). A
# guest killed or reset with perm mounted leaves its last transactions to the next mount's
# journal replay, which would overwrite what debugfs writes offline into the same blocks
# (seen: the request file lost, "bad block bitmap checksum" at the next boot).
perm_replay() {
    local dev rc
    dev=$(losetup -f --show -o "$(part_off "$1" perm)" --sizelimit "$(part_size "$1" perm)" "$1") || return 1
    e2fsck -fy "$dev" >/dev/null 2>&1
    rc=$?
    losetup -d "$dev"
    [ "$rc" -lt 4 ]
}
perm_put() { perm_replay "$1" && debugfs -w -R "write $2 $3" "$1?offset=$(part_off "$1" perm)" >/dev/null 2>&1; }
# sha256 of the first N bytes of partition NAME of DISK.
part_sha() {
    dd if="$1" bs=1M iflag=skip_bytes,count_bytes skip="$(part_off "$1" "$2")" count="$3" status=none | sha256sum | cut -d' ' -f1
}

# ---------------------------------------------------------------------------------------
echo "== host: unit tests (bundle format, update engine on a disk file, http)"
if [ -n "$only" ]; then
    skip "unit tests (RG_UPDATE_ONLY=$only)"
elif out=$(cargo test -q -p riceguard --lib -- core::bundle update:: 2>&1); then
    n=$(echo "$out" | grep -oE '[0-9]+ passed' | head -1)
    ok "unit tests: $n (bad signature/board/arch/compat/truncated/corrupt/oversized/trailing refused with the disk unchanged, seeded garbage, http, rollback)"
else
    echo "$out" | tail -30
    ko "unit tests"
fi

echo "== host: build v1 and v2 images, bundles"
t0=$SECONDS
if ! ci/build-static.sh x86_64 >"$work/static.log" 2>&1; then tail -20 "$work/static.log"; ko "static build"; exit 1; fi
bin=$top/target/x86_64-unknown-linux-musl/release/riceguard
seed=$work/seed
mkdir -p "$seed"
# The guest installs the first of these that verifies, once, after its first good boot.
printf '/dev/vdb\n/dev/vdc\n/dev/vdd\n/dev/vde\n/dev/vdf\n/dev/vdg\n/dev/vdh\n' >"$seed/update-on-boot"
build() { # NAME VERSION [env...]
    local name=$1 v=$2; shift 2
    env "$@" RG_OUT="$work/$name" RG_VERSION="$v" RG_BIN="$bin" image/build.sh "$board" >"$work/$name.build" 2>&1 \
        || { tail -20 "$work/$name.build"; return 1; }
}
# QEMU user networking: the guest reaches the host's loopback as 10.0.2.2 (HTTP source).
net=riceguard.uplink=10.0.2.15/24,gw=10.0.2.2
# QEMU 0 (today's firmware and back) runs its uplink by DHCP from QEMU's built-in server
# (10.0.2.15/24, router 10.0.2.2), as a box in the field does: no static uplink.
net0=
# Configuration schemas (core::bundle::COMPAT): this tree's, and today's firmware's.
schema() { sed -n 's/^pub const COMPAT: u32 = \([0-9][0-9]*\);$/\1/p'; }
compat=$(schema <gateway/core/src/bundle.rs)
old_rev=${RG_UPDATE_OLD:-31a60ec}
old_commit=$(git rev-parse --verify -q "$old_rev^{commit}") || { ko "RG_UPDATE_OLD=$old_rev: no such commit"; exit 1; }
old_compat=$( { git show "$old_commit:gateway/core/src/bundle.rs" 2>/dev/null ||
    git show "$old_commit:gateway/src/core/bundle.rs"; } | schema)
# Build numbers (signed into bundles; a device takes only newer ones): v1 1, v2 2, v3 3;
# today's firmware (QEMU 0) 1.
if build v1 v1 RG_BUILD=1 RG_PERM_SEED="$seed" RG_CMDLINE_EXTRA=$net && build v2 v2 RG_BUILD=2 RG_CMDLINE_EXTRA=$net \
    && { [ -n "$only" ] || build v3u v3-unhealthy RG_BUILD=3 RG_CMDLINE_EXTRA=riceguard.selftest=unhealthy; }; then
    ok "images v1, v2$([ -n "$only" ] || echo " and v3-unhealthy") built ($((SECONDS - t0))s)"
else
    ko "image builds"; exit 1
fi
v1img=$work/v1/riceguard-$board.img
check "v1 root carries the update public key" sh -c "unsquashfs -q -cat '$work/v1/root.squashfs' etc/riceguard/update.pub | grep -qxF \"\$(grep -v '^#' keys/update.pub)\""
mkb() { # NAME [env...]: bundle of v2 with overrides, copied to $work/NAME.bundle
    local name=$1; shift
    env "$@" RG_OUT="$work/v2" image/bundle.sh "$board" >"$work/$name.bundle.log" 2>&1 || { cat "$work/$name.bundle.log"; return 1; }
    cp "$work/v2/riceguard-$board-v2.bundle" "$work/$name.bundle"
}
openssl genpkey -algorithm ed25519 -out "$work/other.key" 2>/dev/null
mkb badsig RG_UPDATE_KEY="$work/other.key" && mkb board RG_BUNDLE_BOARD=qemu-aarch64 \
    && mkb compat RG_BUNDLE_COMPAT=$((compat + 2)) RG_BUNDLE_MIN_COMPAT=$((compat + 1)) \
    && mkb compat1 RG_BUNDLE_COMPAT=1 RG_BUNDLE_MIN_COMPAT=1 && mkb old RG_BUNDLE_BUILD=1 && mkb good \
    && ok "bundles made: good v2 ($(stat -c %s "$work/good.bundle") bytes) and 5 refused variants" || ko "bundle making"
# What bundle.sh writes by default must span the schemas in the field: a device of today's
# firmware (schema 1) takes it, and it declares the schema it writes (this tree's COMPAT).
mf() { grep -a -m1 -oE "^$2 [0-9]+\$" "$1" | cut -d' ' -f2; }
gc=$(mf "$work/good.bundle" compat) gm=$(mf "$work/good.bundle" min-compat)
if [ "$gc" = "$compat" ] && [ -n "$gm" ] && [ "$gm" -le "$old_compat" ]; then
    ok "good bundle (bundle.sh defaults) declares compat $gc min-compat $gm: this schema, and devices of schema $old_compat take it"
else
    ko "PRODUCT: bundle.sh's defaults give compat ${gc:-none} min-compat ${gm:-none}: a device of schema $old_compat (today's firmware) would refuse it, or it does not declare COMPAT $compat; QEMU 0 uses RG_BUNDLE_COMPAT=$compat RG_BUNDLE_MIN_COMPAT=$old_compat"
    mkb good RG_BUNDLE_COMPAT="$compat" RG_BUNDLE_MIN_COMPAT="$old_compat"
fi
check "v1 root records its build number (etc/riceguard/build = 1)" sh -c "unsquashfs -q -cat '$work/v1/root.squashfs' etc/riceguard/build | grep -qx 1"
check "good bundle's signed manifest carries build 2, the downgrade one build 1" sh -c "grep -aqx 'build 2' '$work/good.bundle' && grep -aqx 'build 1' '$work/old.bundle'"
cp "$work/good.bundle" "$work/corrupt.bundle"
# Flip one byte in the root part: 76 header bytes, the manifest, then the root.
mlen=$(od -An -tu4 -j8 -N4 "$work/good.bundle" | tr -d ' ')
mid=$((76 + mlen + 4096))
printf '\xff' | dd of="$work/corrupt.bundle" bs=1 seek=$mid conv=notrunc status=none
check "bundle header: magic RGBUNDL1" test "$(head -c 8 "$work/good.bundle")" = RGBUNDL1

# ---------------------------------------------------------------------------------------
echo "== host: flash-scripts/flash"
F=flash-scripts/flash
isz=$(stat -c %s "$v1img")
truncate -s 1G "$work/big.img"
if $F "$v1img" "$work/big.img" --yes >"$work/flash-big.log" 2>&1; then
    ok "flash into a 1 GiB image file ($(grep -o 'done in [0-9]*s' "$work/flash-big.log"))"
else
    cat "$work/flash-big.log"; ko "flash into a 1 GiB image file"
fi
check "flash: read-back sha256 verified" have "$work/flash-big.log" 'verified sha256 [0-9a-f]{64}'
check "flash: GPT verifies (sfdisk --verify)" sh -c "sfdisk --verify '$work/big.img' 2>&1 | grep -q 'No errors detected'"
last=$(sfdisk --json "$work/big.img" | jq '.partitiontable.lastlba')
check "flash: backup GPT at the end (last usable LBA $last = 1 GiB - 34 sectors)" test "$last" = $((1024 * 2048 - 34))
psz=$(part_size "$work/big.img" perm)
check "flash: perm partition grown to the end ($((psize = psz / 1048576)) MiB)" test "$psz" -gt $((800 * 1048576))
fsb() { dumpe2fs -h "$1" 2>/dev/null | awk -F: '/^Block count/ {c = $2 + 0} /^Block size/ {b = $2 + 0} END {print c * b}'; }
fsz=$(fsb "$work/big.img?offset=$(part_off "$work/big.img" perm)")
check "flash: perm ext4 grown to its partition ($((fsz / 1048576)) MiB)" test "$fsz" -gt $((psz - 4 * 1048576))
check "flash: perm ext4 clean (e2fsck -fn)" e2fsck -fn "$work/big.img?offset=$(part_off "$work/big.img" perm)"
check "flash: perm seed still there (update-on-boot)" sh -c "debugfs -R 'cat update-on-boot' '$work/big.img?offset=$(part_off "$work/big.img" perm)' 2>/dev/null | grep -q vdb"
check "flash: image bytes before perm unchanged (root-b sha256)" test "$(part_sha "$work/big.img" root-b 67108864)" = "$(part_sha "$v1img" root-b 67108864)"

refused() { # NAME LOG PATTERN: exit status 2 and the message
    local st=$1 name=$2 log=$3 pat=$4
    if [ "$st" = 2 ] && grep -qE "$pat" "$log"; then ok "$name: $(grep -o 'refused: .*' "$log" | head -1 | cut -c1-100)"; else cat "$log"; ko "$name (status $st)"; fi
}
truncate -s 100M "$work/small.img"
$F "$v1img" "$work/small.img" --yes >"$work/f-small.log" 2>&1; st=$?
refused $st "flash refuses a too-small target" "$work/f-small.log" 'smaller than the image'
check "flash: too-small target untouched (all zeros)" cmp -n 104857600 "$work/small.img" /dev/zero
$F "$v1img" "$work/big2.img" --yes >"$work/f-missing.log" 2>&1; st=$?
check "flash refuses a missing target file" test "$st" != 0 -a ! -e "$work/big2.img"
truncate -s 1G "$work/nc.img"
setsid $F "$v1img" "$work/nc.img" </dev/null >"$work/f-noconfirm.log" 2>&1; st=$?
refused $st "flash asks for confirmation (no --yes, no terminal)" "$work/f-noconfirm.log" 'no terminal to confirm|not confirmed'
check "flash: unconfirmed target untouched" cmp -n 1073741824 "$work/nc.img" /dev/zero
sysdisk=$(findmnt -n -o SOURCE /)
if [ -b "$sysdisk" ]; then
    # Without --yes and without a terminal: even a failed check could not write.
    timeout 30 setsid $F "$v1img" "$sysdisk" </dev/null >"$work/f-sys.log" 2>&1; st=$?
    refused $st "flash refuses the disk of the running system ($sysdisk)" "$work/f-sys.log" 'holds the running system|in use'
else
    note "skipped the system-disk refusal: / is on $sysdisk (not a block device)"
fi
if losetup -f >/dev/null 2>&1; then
    truncate -s 400M "$work/loop.img"
    mkfs.ext4 -q -F "$work/loop.img"
    lo=$(losetup -f --show -P "$work/loop.img") && loops+=("$lo")
    # The mount sits under a shared bind mount of $work/mp. Every `ip netns exec` (labs side
    # by side with this one start their daemons with it) copies the mount table into a new
    # mount namespace; a copy under the private / would keep $lo mounted, so "in use", for
    # that daemon's life after our umount (seen: "mount namespace of pid N"); under a shared
    # parent the copies are its slaves and our umount takes them away too.
    mkdir -p "$work/mp"
    mount --bind "$work/mp" "$work/mp" && mount --make-shared "$work/mp" && mnts+=("$work/mp")
    mkdir -p "$work/mp/mnt"
    mount "$lo" "$work/mp/mnt" && mnts+=("$work/mp/mnt")
    $F "$v1img" "$lo" --yes >"$work/f-mounted.log" 2>&1; st=$?
    refused $st "flash refuses a mounted block device ($lo)" "$work/f-mounted.log" 'in use'
    check "flash: mounted device still mounted and clean" sh -c "mountpoint -q '$work/mp/mnt' && ls '$work/mp/mnt/lost+found'"
    $F "$v1img" "$work/loop.img" --yes >"$work/f-attached.log" 2>&1; st=$?
    refused $st "flash refuses a file attached to a loop device" "$work/f-attached.log" 'attached to loop'
    umount "$work/mp/mnt" && umount "$work/mp" && mnts=()
    if $F "$v1img" "$lo" --yes >"$work/f-dev.log" 2>&1; then
        ok "flash into an unmounted block device ($lo, 400 MiB)"
        grep -a 'perm ext4 grown\|is now' "$work/f-dev.log" | sed 's/^/     /'
        dsz=$(fsb "$work/loop.img?offset=$(part_off "$work/loop.img" perm)")
        check "flash: device perm ext4 grown ($((dsz / 1048576)) MiB, was 64)" test "$dsz" -gt $((100 * 1048576))
        check "flash: device GPT verifies" sh -c "sfdisk --verify '$lo' 2>&1 | grep -q 'No errors detected'"
        pn=$(ls /sys/block/"${lo#/dev/}"/ | grep -m1 "${lo#/dev/}p" || true)
        if [ -n "$pn" ]; then
            $F "$v1img" "/dev/$pn" --yes >"$work/f-part.log" 2>&1; st=$?
            refused $st "flash refuses a partition" "$work/f-part.log" 'is a partition'
        else
            note "the kernel shows no partitions of $lo: grown by copy, partition refusal not tested"
        fi
    else
        cat "$work/f-dev.log"; ko "flash into an unmounted block device"
    fi
    losetup -d "$lo"; loops=()
else
    note "no loop devices: skipped the mounted-device refusals"
fi

[ "${1:-}" = host ] && { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit; }

# ---------------------------------------------------------------------------------------
# boot NAME DISK UNTIL_FN [qemu env...]: boot until UNTIL_FN says done, QEMU exits (the
# guest rebooted: qemu.sh uses -no-reboot), a panic, or the timeout.
boot() {
    local name=$1 disk=$2 until=$3; shift 3
    local log=$work/$name.log t0=$SECONDS tl=$SECONDS restarted="" pid
    : >"$log"
    local t=${BOOT_T:-$T}
    env "$@" RG_QEMU_DISK="$disk" RG_QEMU_LOG="$log" RG_QEMU_TIMEOUT="$t" RG_QEMU_UNTIL='^RG-NEVER$' \
        image/qemu.sh "$board" >"$work/$name.qemu" 2>&1 &
    pid=$!
    boot_status=4
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then boot_status=0; break; fi
        if serial_panicked "$log"; then boot_status=3; break; fi
        if "$until" "$log"; then boot_status=0; break; fi
        if [ -z "$restarted" ] && qemu_restarted "$log"; then restarted=1 tl=$SECONDS; fi
        if [ $((SECONDS - tl)) -gt $((t + 10)) ]; then break; fi
        sleep 0.5
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    tr -d '\r' <"$log" >"$log.txt"
    echo "     $name: $((SECONDS - t0))s${restarted:+ (the guest kernel stalled before init; started once more)}, serial log $log.txt"
}
never() { return 1; }
good_boot() { have "$1" 'riceguard-init: boot marked good|FATAL|rebooting'; }
pad() { # bundle as a disk: whole sectors (the bundle ends where its manifest says)
    cp "$1" "$2"; truncate -s %512 "$2"
}

# ---------------------------------------------------------------------------------------
# The serial console of a boot (image/qemu.sh RG_QEMU_SERIAL_IN): cboot NAME DISK starts
# QEMU and waits for init's verdict and the prompt; cmd LINE [SECONDS] [REGEX] types a
# line and waits for the next prompt (or REGEX), the output since in $out (and in
# console.txt); cstop [SECONDS] waits that long for the guest to end by itself (a reboot:
# QEMU exits, cstatus=exited), else stops QEMU by its PID (cstatus=killed).
sin=$work/serial-in clog="" ctime=0 cstatus="" out=""
cboot() {
    clog=$work/$1.log ctime=$SECONDS
    : >"$clog"
    printf '==== %s\n' "$1" >>"$work/console.txt"
    RG_QEMU_DISK="$2" RG_QEMU_LOG="$clog" RG_QEMU_TIMEOUT=$((T + 300)) RG_QEMU_UNTIL='^RG-NEVER$' \
        RG_QEMU_SERIAL_IN="$sin" image/qemu.sh "$board" >"$work/$1.qemu" 2>&1 &
    cpid=$!
    con_use "$clog" "$cpid" "$work/console.txt"
    wait_for 10 eval '[ -e "$sin" ]'
    # Read-write: opening never blocks and QEMU never sees the writer go away.
    exec 9<>"$sin" || return 1
    con_wait 'riceguard-init: (boot marked good|FATAL|rebooting)' "$T" && con_wait 'riceguard(\(edit\))?# ' 30
}
cstop() {
    wait_for "${1:-0}" eval '! kill -0 "$cpid"'
    cstatus=exited
    kill -0 "$cpid" 2>/dev/null && cstatus=killed
    qemu_stop "$cpid"
    exec 9>&- 2>/dev/null
    cpid=""
    tr -d '\r' <"$clog" >"$clog.txt"
    echo "     $(basename "$clog" .log): $((SECONDS - ctime))s ($cstatus), serial log $clog.txt"
}

# Today's firmware, from its own tree (a git worktree; the Debian packages of .cache/ and
# this tree's signing key, so it takes v2's bundles), with a lower build number than v2.
# Its own cargo target directory under out/ (a target shared with this tree would replace
# this tree's binary), seeded from this tree's musl build when new: the registry
# dependencies' artifacts do not depend on the workspace, so only riceguard itself is
# compiled (about half the time of a cold build); its image cached by commit, key and
# command line.
old_dir() {
    local k
    k=$(printf '%s\n' "$old_commit" "$board" "$net0" "$(grep -v '^#' "$(image/keys.sh pub)")" | sha256sum | cut -c1-12)
    echo "$top/out/test-update-old/${old_commit:0:12}-$k"
}
old_build() {
    local dst=$1 src=$work/old-src tgt=$top/out/test-update-old/target tmp=$1.tmp key pub
    key=$(realpath "$(image/keys.sh key)") pub=$(realpath "$(image/keys.sh pub)")
    git worktree prune
    git worktree add --detach "$src" "$old_commit" >"$work/old-src.log" 2>&1 || { cat "$work/old-src.log"; return 1; }
    old_tree=$src
    ln -s "$top/.cache" "$src/.cache"
    if [ ! -d "$tgt" ] && [ -d "$top/target/x86_64-unknown-linux-musl" ]; then
        mkdir -p "$tgt" && cp -a "$top/target/x86_64-unknown-linux-musl" "$tgt/"
    fi
    mkdir -p "$tgt"
    ln -s "$tgt" "$src/target"
    (cd "$src" && CARGO_TARGET_DIR=$tgt ci/build-static.sh x86_64) >"$work/old-static.log" 2>&1 \
        || { tail -20 "$work/old-static.log"; return 1; }
    rm -rf "$tmp"
    mkdir -p "$tmp"
    cp "$tgt/x86_64-unknown-linux-musl/release/riceguard" "$tmp/riceguard"
    (cd "$src" && RG_OUT=$tmp RG_BIN=$tmp/riceguard RG_VERSION="today-${old_commit:0:7}" RG_BUILD=1 \
        RG_CMDLINE_EXTRA=$net0 RG_UPDATE_KEY=$key RG_UPDATE_PUB=$pub \
        SOURCE_DATE_EPOCH="$(git log -1 --format=%ct "$old_commit")" image/build.sh "$board") >"$work/old.build" 2>&1 \
        || { tail -20 "$work/old.build"; return 1; }
    rm -rf "$dst"
    mv "$tmp" "$dst"
    git worktree remove --force "$src" && old_tree=""
}

qemu_compat() {
    local t0=$SECONDS od img d l pp pl k0 f
    od=$(old_dir)
    img=$od/riceguard-$board.img
    carries_key() { unsquashfs -q -cat "$od/root.squashfs" etc/riceguard/update.pub 2>/dev/null | grep -qxF "$(grep -v '^#' "$(image/keys.sh pub)")"; }
    if [ -s "$img" ] && carries_key; then
        ok "today's firmware ${old_commit:0:7} (schema $old_compat, build 1): cached image ${od#"$top/"}"
    elif old_build "$od"; then
        ok "today's firmware ${old_commit:0:7} (schema $old_compat, build 1) built from its own tree ($((SECONDS - t0))s)"
    else
        ko "today's firmware ${old_commit:0:7}: build (logs in $work/old-static.log, $work/old.build)"
        return
    fi
    check "today's firmware root carries the update public key" carries_key
    d=$work/disk0.img
    cp --sparse=always "$img" "$d"
    # The saved configuration of a device in the field: two named peers, written as the
    # console of today's firmware writes it; and the request to install v2 from /dev/vdb.
    # A hub peer's summary route covers the uplink's DHCP subnet (10.0.0.0/12 over QEMU's
    # 10.0.2.0/24): v2 checks leases against the tunnel's routes and must keep this one.
    pp=$("$bin" genkey | "$bin" pubkey) pl=$("$bin" genkey | "$bin" pubkey) ph=$("$bin" genkey | "$bin" pubkey)
    f=$work/saved.conf
    (umask 077 && printf '[Interface]\nPrivateKey = %s\nListenPort = 51820\nAddress = 10.100.0.1/24\n\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.100.0.2/32\nName = phone\n\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.100.0.3/32\nName = laptop\n\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.0.0.0/12\nName = hub\n\n[Gateway]\nInterfaceName = wg0\n' \
        "$("$bin" genkey)" "$pp" "$pl" "$ph" >"$f")
    printf '/dev/vdb\n' >"$work/req0"
    perm_put "$d" "$f" riceguard.conf && perm_put "$d" "$work/req0" update-on-boot
    check "q0: perm seeded (riceguard.conf with peers phone and laptop, update-on-boot)" bash -c "$(declare -f perm_cat part_off); perm_cat '$d' riceguard.conf | grep -qxF 'PublicKey = $pl'"

    boot q0-old "$d" never RG_QEMU_DISKS="$work/good0.disk"
    l=$work/q0-old.log.txt
    check "q0: today's firmware booted from slot a" have "$l" 'riceguard-init: slot a booted'
    check "q0: it loads the saved configuration (no fallback, no config error)" bash -c "! grep -qaE 'does not load|uplink from the kernel command line only|config: /perm' '$l'"
    check "q0: gateway up, boot marked good" bash -c "grep -qa 'riceguard-init: gateway up' '$l' && grep -qa 'riceguard-init: boot marked good' '$l'"
    check "q0: it takes v2's bundle (compat $gm..=$gc; this device: schema $old_compat, build 1)" have "$l" "update: verified v2 \\(build 2\\) .*compat $gm\\.\\.=$gc"
    check "q0: installed v2 into slot b, rebooting" have "$l" 'rebooting into slot b'
    check "q0: the guest rebooted (QEMU exited by itself)" test "$boot_status" = 0
    check "q0: ESP entries: a good, b with 3 tries" test "$(esp_entries "$d")" = "riceguard-a.conf riceguard-b+3.conf"
    k0=$(grep -a '^riceguard: public key' "$l" | head -1)
    grep -aE "^update: (verified|installed)|bundle refused" "$l" | sed 's/^/     guest: /'

    echo "     q0: v2 on slot b: peers kept, firewall in place; the console saves schema-2 settings, rollback-slot"
    if ! cboot q0-new "$d"; then
        cstop 0
        ko "q0: v2 gave no console prompt after its boot verdict"
        tail -25 "$clog.txt"
        return
    fi
    cmd 'show status'
    check "q0: v2 runs from slot b (show status: firmware v2 (build 2), boot slot b)" bash -c "$(declare -f said); out=\$1; said '^firmware: riceguard v2 .*\\(build 2\\)$' && said '^boot slot: b$'" _ "$out"
    check "q0: v2's firewall in place (show status: firewall: on)" said '^firewall: on \(table inet riceguard'
    check "q0: v2 kept the uplink's DHCP lease (show status: uplink eth0: DHCP 10.0.2.15/24)" said '^uplink eth0: DHCP 10\.0\.2\.15/24 '
    check "q0: v2 says what the lease shadows of the hub's summary route" said "uplink eth0 10\.0\.2\.0/24 shadows 10\.0\.2\.0/24 of peer hub's 10\.0\.0\.0/12"
    cmd 'show peers'
    check "q0: v2 runs both saved peers (show peers: phone, laptop)" bash -c "$(declare -f said_line); out=\$1; said_line 'peer: $pp (phone)' && said_line 'peer: $pl (laptop)'" _ "$out"
    cmd 'set gateway masquerade off'
    cmd "set peer $pp masquerade off"
    cmd 'disable client laptop'
    cmd 'set gateway ntp 10.0.2.2,ntp.example.net'
    cmd 'set gateway uplink-overlap refuse'
    cmd commit 60
    check "q0: v2 commits schema-2 and schema-3 settings (gateway masquerade off, phone masquerade off, laptop disabled, ntp, uplink-overlap)" said '^committed and saved'
    check "q0: the gateway applied it" said 'applied it'
    check "q0: commit says what an earlier schema's firmware leaves out" said 'firmware of an earlier configuration schema .* reads this file without: Masquerade = off; Ntp = 10.0.2.2, ntp.example.net; UplinkOverlap = refuse; peer phone Masquerade = off; peer laptop disabled'
    cmd rollback-slot 60 'is the default from the next boot|rollback-slot: .*(error|failed|no boot entry)'
    check "q0: rollback-slot: slot a is the default from the next boot" said 'slot a \(riceguard-a.conf\) is the default from the next boot'
    cmd reboot 20 'Type yes'
    printf 'yes\r' >&9
    cstop 120
    l=$clog.txt
    check "q0: v2 on trial in slot b (2 tries left), marked good" bash -c "grep -qa 'slot b on trial (riceguard-b+2-1.conf: 2 tries left, 1 used)' '$l' && grep -qa 'boot marked good (riceguard-b+2-1.conf -> riceguard-b.conf)' '$l'"
    check "q0: v2 loads the saved configuration (no fallback)" bash -c "! grep -qaE 'does not load|uplink from the kernel command line only|config: /perm' '$l'"
    check "q0: v2's boot firewall in place (init: firewall: table inet riceguard in place)" have "$l" 'riceguard-init: firewall: table inet riceguard in place'
    check "q0: key kept across the update" bash -c "test -n '$k0' && grep -qaxF '$k0' '$l'"
    check "q0: the guest rebooted after \`reboot\` (QEMU exited by itself)" test "$cstatus" = exited
    check "q0: v2 does not run the consumed update request again" test "$(grep -ca 'update requested' "$l")" = 0
    check "q0: the saved file has the schema-2 settings on #+ lines (Masquerade, the laptop's whole section), the schema-3 ones on #3+ lines" bash -c "$(declare -f perm_cat part_off); t=\$(perm_cat '$d' riceguard.conf); grep -qx '#+ Masquerade = off' <<<\"\$t\" && grep -qxF '#+ PublicKey = $pl' <<<\"\$t\" && grep -qxF 'PublicKey = $pp' <<<\"\$t\" && grep -qxF '#3+ Ntp = 10.0.2.2, ntp.example.net' <<<\"\$t\" && grep -qxF '#3+ UplinkOverlap = refuse' <<<\"\$t\" && ! grep -qE '^[^#].*(Masquerade|Enabled|Ntp|UplinkOverlap)' <<<\"\$t\""
    check "q0: ESP entries: a and b good, a the default" bash -c "$(declare -f esp_cat part_off esp_entries); test \"\$(esp_entries '$d')\" = 'riceguard-a.conf riceguard-b.conf' && esp_cat '$d' ::/loader/entries/riceguard-a.conf | grep -q 'sort-key riceguard-0'"

    echo "     q0: back on today's firmware in slot a"
    if ! cboot q0-back "$d"; then
        cstop 0
        ko "q0: today's firmware gave no console prompt after the rollback"
        tail -25 "$clog.txt"
        return
    fi
    cmd 'show peers'
    check "q0: back: today's firmware runs the enabled peer (show peers: phone)" said_line "peer: $pp (phone)"
    check "q0: back: the disabled client is left out (no laptop)" bash -c "! grep -qaF '$pl' <<<\"\$1\"" _ "$out"
    cmd 'show status'
    check "q0: back: slot a runs today's firmware (show status: build 1, boot slot a)" bash -c "$(declare -f said); out=\$1; said '^firmware: riceguard today-${old_commit:0:7} .*\\(build 1\\)$' && said '^boot slot: a$'" _ "$out"
    check "q0: back: today's firmware has its DHCP lease again (show status: uplink eth0: DHCP 10.0.2.15/24)" said '^uplink eth0: DHCP 10\.0\.2\.15/24 '
    cstop 0
    l=$clog.txt
    check "q0: back: slot a booted from its good entry" have "$l" 'slot a booted from its good entry riceguard-a.conf'
    check "q0: back: the saved file loads (no 'does not load' fallback, no config error)" bash -c "! grep -qaE 'does not load|uplink from the kernel command line only|config: /perm' '$l'"
    check "q0: back: gateway up (UAPI answers), boot marked good" bash -c "grep -qa 'riceguard-init: gateway up' '$l' && grep -qa 'riceguard-init: boot marked good' '$l'"
    check "q0: back: key kept" bash -c "test -n '$k0' && grep -qaxF '$k0' '$l'"
    grep -aE 'config: |does not load' "$l" | head -5 | sed 's/^/     guest: /'
    note "QEMU 0 took $((SECONDS - t0))s"
}

echo "== QEMU 0: today's firmware (${old_commit:0:7}, schema $old_compat) with a saved configuration, v2 (schema $compat) and back"
# v2 as a DHCP box gets it: the same tree and build number, no static uplink.
if build v2d v2 RG_BUILD=2 RG_CMDLINE_EXTRA=$net0 && env RG_OUT="$work/v2d" image/bundle.sh "$board" >"$work/good0.bundle.log" 2>&1 \
    && cp "$work/v2d/riceguard-$board-v2.bundle" "$work/good0.bundle"; then
    pad "$work/good0.bundle" "$work/good0.disk"
    qemu_compat
else
    tail -5 "$work/good0.bundle.log" 2>/dev/null
    ko "QEMU 0: v2 without a static uplink (image v2d, bundle good0)"
fi
if [ -n "$only" ]; then
    echo
    for n in "${notes[@]}"; do echo "note: $n"; done
    echo "update tests took $((SECONDS - t_all))s"
    [ -n "${RG_UPDATE_KEEP:-}" ] || rm -f "$work"/*.img "$work"/*.disk
    h_finish
fi

echo "== QEMU 1: flashed v1 refuses bad bundles, installs v2 into slot B, reboots"
disk=$work/disk.img
cp --sparse=always "$work/big.img" "$disk"
for b in badsig board compat compat1 corrupt old good; do pad "$work/$b.bundle" "$work/$b.disk"; done
boot q1 "$disk" never RG_QEMU_DISKS="$work/badsig.disk $work/board.disk $work/compat.disk $work/compat1.disk $work/corrupt.disk $work/old.disk $work/good.disk"
l=$work/q1.log.txt
check "q1: v1 booted from slot a" have "$l" 'riceguard-init: slot a booted'
check "q1: boot marked good" have "$l" 'riceguard-init: boot marked good'
check "q1: update requested from perm" have "$l" 'update requested in /perm/update-on-boot'
check "q1: bad signature refused" have "$l" 'vdb: bundle refused, nothing written: signature check failed'
check "q1: wrong board refused" have "$l" 'vdc: bundle refused, nothing written: board check failed'
check "q1: newer schema refused" have "$l" "vdd: bundle refused, nothing written: compatibility check failed: bundle takes configuration schema $((compat + 1))..=$((compat + 2)), this device has $compat"
check "q1: schema 1 only refused (schema $compat here)" have "$l" "vde: bundle refused, nothing written: compatibility check failed: bundle takes configuration schema 1..=1, this device has $compat"
check "q1: corrupted body refused" have "$l" 'vdf: bundle refused, nothing written: hash check failed: part root'
check "q1: downgrade (build 1 on build 1) refused" have "$l" 'vdg: bundle refused, nothing written: downgrade check failed: bundle v2 \(build 1\) is not newer than the running slot.s build 1'
check "q1: good bundle verified" have "$l" 'update: verified v2 \(build 2\)'
check "q1: read back checked" have "$l" 'read back: root and UKI match'
check "q1: installed v2 into slot b, rebooting" have "$l" 'rebooting into slot b'
check "q1: guest rebooted (QEMU exited by itself)" test "$boot_status" = 0
k1=$(grep -a '^riceguard: public key' "$l" | head -1)
check "q1: ESP entries: a good, b with 3 tries" test "$(esp_entries "$disk")" = "riceguard-a.conf riceguard-b+3.conf"
check "q1: b's entry is the default (sort-key riceguard-0), a second" bash -c "$(declare -f esp_cat part_off); esp_cat '$disk' ::/loader/entries/riceguard-b+3.conf | grep -q 'sort-key riceguard-0' && esp_cat '$disk' ::/loader/entries/riceguard-a.conf | grep -q 'sort-key riceguard-1'"
check "q1: root-b holds v2's root.squashfs" test "$(part_sha "$disk" root-b "$(stat -c %s "$work/v2/root.squashfs")")" = "$(sha256sum <"$work/v2/root.squashfs" | cut -d' ' -f1)"
check "q1: root-a untouched (v1)" test "$(part_sha "$disk" root-a 67108864)" = "$(part_sha "$v1img" root-a 67108864)"
grep -aE '^update: ' "$l" | head -12 | sed 's/^/     guest: /'

echo "== QEMU 2: slot B runs v2, on trial, marked good, perm kept"
boot q2 "$disk" good_boot
l=$work/q2.log.txt
check "q2: slot b booted" have "$l" 'riceguard-init: slot b booted'
check "q2: on trial with 2 tries left" have "$l" 'slot b on trial \(riceguard-b\+2-1.conf: 2 tries left, 1 used\)'
check "q2: marked good (riceguard-b+2-1.conf -> riceguard-b.conf)" have "$l" 'boot marked good \(riceguard-b\+2-1.conf -> riceguard-b.conf\)'
check "q2: gateway up" have "$l" 'riceguard-init: gateway up'
k2=$(grep -a '^riceguard: public key' "$l" | head -1)
check "q2: configuration/key kept across the update ($k2)" test -n "$k1" -a "$k1" = "$k2"
check "q2: ESP entries: a and b good" test "$(esp_entries "$disk")" = "riceguard-a.conf riceguard-b.conf"
check "q2: the request was consumed (update-on-boot.done)" bash -c "$(declare -f perm_cat part_off); perm_cat '$disk' update-on-boot.done | grep -q vdh"
check "q2: no update requested again" test "$(grep -ca 'update requested' "$l")" = 0

echo "== QEMU 3: QEMU killed while an update is being written: the old slot boots"
disk3=$work/disk3.img
cp --sparse=always "$work/big.img" "$disk3"
writing() { have "$1" 'update: verified'; }
boot q3 "$disk3" writing RG_QEMU_DISKS="$work/good.disk $work/good.disk $work/good.disk $work/good.disk $work/good.disk"
check "q3: killed after verification, during the write" have "$work/q3.log.txt" 'update: verified v2'
check "q3: never enabled slot b" sh -c "! grep -qa 'slot b enabled' '$work/q3.log.txt'"
e3=$(esp_entries "$disk3")
check "q3: ESP has only slot a's entry ($e3)" test "$e3" = "riceguard-a.conf"
boot q3b "$disk3" good_boot
check "q3: next boot: slot a booted" have "$work/q3b.log.txt" 'riceguard-init: slot a booted'
check "q3: next boot: marked good" have "$work/q3b.log.txt" 'riceguard-init: boot marked good'

echo "== QEMU 4: a broken v3 fails its 3 tries, systemd-boot falls back to slot B"
mkdir -p "$work/v3"
cp "$work/v2/slot-a.efi" "$work/v2/slot-b.efi" "$work/v3/"
sed 's/^version .*/version v3-broken/; s/^build .*/build 3/' "$work/v2/manifest.txt" >"$work/v3/manifest.txt"
mkdir -p "$work/v3root/etc/riceguard"
echo "broken: no /sbin/init" >"$work/v3root/etc/riceguard/version"
mksquashfs "$work/v3root" "$work/v3/root.squashfs" -quiet -noappend -comp zstd >/dev/null
RG_OUT=$work/v3 image/bundle.sh "$board" >"$work/v3.bundle.log" 2>&1 || cat "$work/v3.bundle.log"
pad "$work/v3/riceguard-$board-v3-broken.bundle" "$work/v3.disk"
# This one comes over HTTP from a server on the host's loopback (10.0.2.2 in the guest).
mkdir -p "$work/www"
cp "$work/v3/riceguard-$board-v3-broken.bundle" "$work/www/v3.bundle"
python3 -u -m http.server --bind 127.0.0.1 --directory "$work/www" 0 >"$work/http.log" 2>&1 &
httpd=$!
port=""
for _ in $(seq 50); do
    port=$(grep -oE 'port [0-9]+' "$work/http.log" | head -1 | cut -d' ' -f2)
    [ -n "$port" ] && break
    sleep 0.1
done
printf 'http://10.0.2.2:%s/v3.bundle\n' "$port" >"$work/req"
perm_put "$disk" "$work/req" update-on-boot
boot q4 "$disk" never
kill "$httpd" 2>/dev/null; wait "$httpd" 2>/dev/null
check "q4: bundle fetched over HTTP (http://10.0.2.2:$port)" bash -c "grep -qa 'from http://10.0.2.2:$port/v3.bundle' '$work/q4.log.txt' && grep -q 'GET /v3.bundle' '$work/http.log'"
check "q4: slot b installs v3 into slot a" have "$work/q4.log.txt" 'installed v3-broken into slot a'
check "q4: ESP: a on trial, b good" test "$(esp_entries "$disk")" = "riceguard-a+3.conf riceguard-b.conf"
# fail_boots NAME PATTERN: boot until slot a's tries are used up (at most 5 boots). A boot
# that reached init must show PATTERN; a guest kernel that stalls before init (TCG on a
# loaded host) is noted: it still used one of the tries.
fail_boots() {
    local name=$1 pat=$2 i good=0 stalls=0 other=0
    for i in 1 2 3 4 5; do
        [ "$(esp_entries "$disk")" = "riceguard-a+0-3.conf riceguard-b.conf" ] && break
        BOOT_T=150 boot "$name-fail$i" "$disk" never
        l=$work/$name-fail$i.log.txt
        if grep -qaE "$pat" "$l" && ! grep -qa 'boot marked good' "$l"; then good=$((good + 1))
        elif ! grep -qa 'riceguard-init' "$l"; then stalls=$((stalls + 1)); note "$name boot $i: guest kernel stalled before init (TCG under host load); counted as a failed try"
        else other=$((other + 1)); fi
    done
    check "$name: slot a failed $((good + stalls)) boots ($good with the expected reason, $stalls stalled, $other other)" test "$good" -ge 1 -a "$other" = 0 -a $((good + stalls)) = 3
}
fail_boots q4 'has no /sbin/init|as squashfs'
check "q4: a's tries used up" test "$(esp_entries "$disk")" = "riceguard-a+0-3.conf riceguard-b.conf"
boot q4-back "$disk" good_boot
l=$work/q4-back.log.txt
check "q4: fallback boot runs slot b" have "$l" 'riceguard-init: slot b booted'
check "q4: console says FALLBACK and why" have "$l" 'FALLBACK: slot a \(riceguard-a\+0-3.conf\) failed 3 boots'
check "q4: gateway up and marked good on b" have "$l" 'boot marked good'
k4=$(grep -a '^riceguard: public key' "$l" | head -1)
check "q4: key still the same" test "$k4" = "$k1"

echo "== QEMU 5: v3 whose gateway fails its health check: 3 tries, then back to slot B"
RG_OUT=$work/v3u image/bundle.sh "$board" >"$work/v3u.bundle.log" 2>&1 || cat "$work/v3u.bundle.log"
pad "$work/v3u/riceguard-$board-v3-unhealthy.bundle" "$work/v3u.disk"
rm -f "$work/req"; printf '/dev/vdb\n' >"$work/req"
perm_replay "$disk" && debugfs -w -R "rm update-on-boot" "$disk?offset=$(part_off "$disk" perm)" >/dev/null 2>&1
perm_put "$disk" "$work/req" update-on-boot
boot q5 "$disk" never RG_QEMU_DISKS="$work/v3u.disk"
check "q5: slot b installs v3-unhealthy into slot a (replacing the failed entry)" have "$work/q5.log.txt" 'removed old entry riceguard-a\+0-3.conf'
check "q5: ESP: a on trial, b good" test "$(esp_entries "$disk")" = "riceguard-a+3.conf riceguard-b.conf"
fail_boots q5 'gateway not healthy after 20s on slot a \(on trial\): rebooting to count down its tries'
check "q5: a's tries used up" test "$(esp_entries "$disk")" = "riceguard-a+0-3.conf riceguard-b.conf"
boot q5-back "$disk" good_boot
l=$work/q5-back.log.txt
check "q5: fallback boot runs slot b, says FALLBACK" bash -c "grep -qa 'slot b booted' '$l' && grep -qa 'FALLBACK: slot a (riceguard-a+0-3.conf) failed 3 boots' '$l'"
check "q5: marked good on b, key kept" bash -c "grep -qa 'boot marked good' '$l' && grep -qaF '$k1' '$l'"

echo
for n in "${notes[@]}"; do echo "note: $n"; done
echo "update tests took $((SECONDS - t_all))s"
[ -n "${RG_UPDATE_KEEP:-}" ] || rm -f "$work"/*.img "$work"/*.disk
h_finish
