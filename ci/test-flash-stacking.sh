#!/usr/bin/env bash
# flash-scripts/flash must refuse a disk any part of which is in use, however it is stacked
# (so no host disk is lost): loop devices on sparse files, partitioned, stacked the ways a host's
# own disk is (dm-linear, LVM, btrfs subvolumes and multi-device btrfs, swap, a loop device
# on a partition, a mount in another mount namespace only, a partition that is / of a
# chroot, a loop-device target whose disk is in use), each case flashed with --yes: these
# are loop devices this test made, and a broken flash script would write them. A refusal
# must exit 2, name the mount point / swap / holder, and leave the target's first and last
# MiB (GPT and backup GPT: any flash write changes them, no file system on a partition
# touches them) unchanged.
# An unused partitioned loop device must still be accepted and flashed (a tiny fake image:
# a GPT with an `esp` and an ext4 `perm` partition; the real image is not built here), and
# two flashes of one image into files give each its own disk and partition GUIDs.
#
# Cases that need what the kernel or the host lacks (device mapper for dm-linear and LVM,
# btrfs, lvm2/btrfs-progs) are skipped with a note. Needs root, losetup, sfdisk, partx,
# mkfs.ext4, mkswap, unshare; apt: lvm2 (dmsetup), btrfs-progs for the optional cases.
# Touches only the loop devices, dm devices, VG, mounts and swap it creates; the trap undoes
# them in reverse order.
#
# usage: ci/test-flash-stacking.sh          (as root; about 15 s)
# env:   RG_FLASH=path   test another flash script (e.g. `git show HEAD~1:flash-scripts/flash`)
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init test-flash-stacking
F=${RG_FLASH:-$PWD/flash-scripts/flash}
[ "$(id -u)" = 0 ] || { echo "test-flash-stacking: needs root"; exit 1; }
for t in losetup sfdisk partx mkfs.ext4 mkswap swapon unshare sha256sum jq; do
    command -v $t >/dev/null || { echo "test-flash-stacking: missing $t"; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/rg-flash-stack.XXXXXX")
t_all=$SECONDS

# --- undo stack: every created thing pushes the command that removes it ------------------
undo=()
push() { local c; printf -v c '%q ' "$@"; undo+=("$c"); }
unwind() { # [DEPTH]: undo down to DEPTH entries (default: everything), newest first
    local keep=${1:-0} i
    for ((i = ${#undo[@]} - 1; i >= keep; i--)); do
        eval "${undo[i]}" >/dev/null 2>&1 || echo "     cleanup: '${undo[i]}' failed"
        unset 'undo[i]'
    done
}
cleanup() { unwind 0; rm -rf "$work"; }
at_exit cleanup
umount_or_lazy() { umount "$1" 2>/dev/null || umount -l "$1"; }
# An LV whose PV label a failing flash script overwrote cannot be lvremoved: remove its dm
# device directly then.
lv_remove() { lvremove -q -f --devices "$1" "$2/lv" || dmsetup remove --retry "$2-lv"; }
stop_pid() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 0; }

# --- a tiny fake image: GPT, esp (empty), perm (ext4) ------------------------------------
img=$work/fake.img
truncate -s 12M "$img"
printf 'label: gpt\nstart=2048, size=4096, name=esp\nstart=6144, size=16384, name=perm\n' | sfdisk -q "$img"
truncate -s 8M "$work/perm.ext4"
mkfs.ext4 -q -F -L perm "$work/perm.ext4"
dd if="$work/perm.ext4" of="$img" bs=1M seek=3 conv=notrunc status=none
rm -f "$work/perm.ext4"

# --- helpers --------------------------------------------------------------------------------
n=0
# mkloop [MIB]: a sparse file (256 MiB), GPT p1 (MIB - 56) + p2 (the rest), on a new loop
# device with its partition nodes (the kernel's own scan, else partx -a: some kernels have
# no GPT parser). Sets L (the loop device), P1, P2.
mkloop() {
    n=$((n + 1))
    local f=$work/disk$n.img i mib=${1:-256}
    truncate -s "${mib}M" "$f"
    printf 'label: gpt\nsize=%dMiB, name=p1\nname=p2\n' $((mib - 56)) | sfdisk -q "$f"
    L=$(losetup -f --show -P "$f") || return 1
    push losetup -d "$L"
    P1=${L}p1 P2=${L}p2
    [ -b "$P1" ] || partx -a "$L" 2>/dev/null
    wait_for 5 eval '[ -b "$P1" ] && [ -b "$P2" ]' && return 0
    echo "     no partition nodes for $L"
    return 1
}
# Mounts go under a shared bind mount of $work/mp: every `ip netns exec` of a lab running
# beside this one copies the mount table into a new mount namespace, and a copy under the
# private / would keep our loop devices busy after our umount, for that process's life; a
# copy under a shared parent is its slave and goes with our umount.
mkdir -p "$work/mp"
mount --bind "$work/mp" "$work/mp" && mount --make-shared "$work/mp" && push umount_or_lazy "$work/mp"
mkmnt() { local m=$work/mp/mnt-$1; mkdir -p "$m"; echo "$m"; }
mnt() { # DEV DIR [mount options...]
    local dev=$1 dir=$2; shift 2
    mount "$@" "$dev" "$dir" || return 1
    push umount_or_lazy "$dir"
}
# sha256 of the first and the last MiB of a device (GPT and backup GPT).
digest() {
    local mib=$(($(blockdev --getsize64 "$1") / 1048576))
    { dd if="$1" bs=1M count=1 iflag=direct status=none
      dd if="$1" bs=1M skip=$((mib - 1)) count=1 iflag=direct status=none; } | sha256sum | cut -d' ' -f1
}
# refuses NAME TARGET PATTERN: flash --yes must exit 2 naming PATTERN, target unchanged.
refuses() {
    local name=$1 target=$2 pat=$3 before after st log=$work/case$n.log
    sync
    before=$(digest "$target")
    timeout 60 "$F" "$img" "$target" --yes >"$log" 2>&1; st=$?
    after=$(digest "$target")
    local msg; msg=$(grep -A2 'refused: ' "$log" | sed 's/^flash: //; s/^ *//' | tr '\n' ' ' | cut -c1-300)
    if [ "$st" = 2 ] && grep -qF -- "$pat" "$log" && [ "$before" = "$after" ]; then
        ok "$name: ${msg:-refused}"
    else
        sed 's/^/     | /' "$log" | tail -15
        ko "$name (status $st, $( [ "$before" = "$after" ] && echo 'target unchanged' || echo 'TARGET WRITTEN'), wanted '$pat' in the message)"
    fi
}
case_start() { mark=${#undo[@]}; echo "== $*"; }
case_end() { unwind "$mark"; }
skip() { echo "SKIP $*"; }

have_dm=""
dmsetup version >/dev/null 2>&1 && have_dm=1
have_lvm=""
[ -n "$have_dm" ] && command -v lvcreate >/dev/null && have_lvm=1
have_btrfs=""
if command -v mkfs.btrfs >/dev/null; then
    grep -qw btrfs /proc/filesystems || modprobe btrfs 2>/dev/null
    grep -qw btrfs /proc/filesystems && have_btrfs=1
fi

# --- (a) dm-linear over a partition, ext4 on the dm device, mounted ------------------------
if [ -n "$have_dm" ]; then
    case_start "(a) partition -> dm-linear -> ext4 mounted"
    if mkloop; then
        dmn=rgflash-$$-lin
        if dmsetup create "$dmn" --table "0 $(blockdev --getsz "$P1") linear $P1 0"; then
            push dmsetup remove --retry "$dmn"
            udevadm settle 2>/dev/null
            [ -b "/dev/mapper/$dmn" ] || dmsetup mknodes "$dmn"   # no udev
            m=$(mkmnt a)
            if mkfs.ext4 -q -F "/dev/mapper/$dmn" && mnt "/dev/mapper/$dmn" "$m"; then
                refuses "(a) refuses: a dm-linear device on a partition is mounted" "$L" "$m"
                umount "$m" && unset 'undo[${#undo[@]}-1]'
                refuses "(a) refuses: a partition is held by an unmounted dm device" "$L" "$dmn"
            else ko "(a) setting up ext4 on $dmn"; fi
        else ko "(a) dmsetup create"; fi
    else ko "(a) loop device"; fi
    case_end
else
    skip "(a) dm-linear: the kernel has no device mapper (dmsetup version fails)"
fi

# --- (b) LVM on a partition, LV mounted ------------------------------------------------------
if [ -n "$have_lvm" ]; then
    case_start "(b) partition -> LVM PV -> LV -> ext4 mounted"
    if mkloop; then
        vg=rgflash$$x$RANDOM
        # Only this partition is visible to these lvm commands (no other PV is touched).
        lvmc=(--devices "$P1")
        export LVM_SUPPRESS_FD_WARNINGS=1
        if pvcreate -q "${lvmc[@]}" "$P1" >/dev/null && push pvremove -q -ff -y "${lvmc[@]}" "$P1" \
            && vgcreate -q "${lvmc[@]}" "$vg" "$P1" >/dev/null && push vgremove -q -f "${lvmc[@]}" "$vg" \
            && lvcreate -q "${lvmc[@]}" -y -Zn -L 32M -n lv "$vg" >/dev/null && push lv_remove "$P1" "$vg"; then
            udevadm settle 2>/dev/null
            [ -b "/dev/mapper/$vg-lv" ] || dmsetup mknodes "$vg-lv"   # no udev
            lvdev=$(lvs --noheadings -o lv_dm_path "${lvmc[@]}" "$vg/lv" 2>/dev/null | tr -d ' ')
            [ -b "$lvdev" ] || lvdev=/dev/mapper/$vg-lv
            m=$(mkmnt b)
            if mkfs.ext4 -q -F "$lvdev" && mnt "$lvdev" "$m"; then
                refuses "(b) refuses: an LVM logical volume on a partition is mounted" "$L" "$m"
            else ko "(b) setting up ext4 on $lvdev"; fi
        else ko "(b) pvcreate/vgcreate/lvcreate"; fi
    else ko "(b) loop device"; fi
    case_end
else
    skip "(b) LVM: $([ -z "$have_dm" ] && echo 'the kernel has no device mapper' || echo 'lvm2 not installed (apt-get install lvm2)')"
fi

# --- (c) btrfs on a partition, a subvolume mounted -------------------------------------------
if [ -n "$have_btrfs" ]; then
    case_start "(c) partition -> btrfs, only a subvolume mounted"
    if mkloop; then
        m=$(mkmnt c)
        if mkfs.btrfs -q -f "$P1" >/dev/null && mnt "$P1" "$m" && btrfs -q subvolume create "$m/sv" >/dev/null \
            && umount "$m" && unset 'undo[${#undo[@]}-1]' && mnt "$P1" "$m" -o subvol=sv; then
            refuses "(c) refuses: a btrfs subvolume of a partition is mounted" "$L" "$m"
        else ko "(c) setting up btrfs"; fi
    else ko "(c) loop device"; fi
    case_end

    case_start "(c2) btrfs over partitions of two disks, mounted through the other disk"
    if mkloop; then
        LA=$L PA=$P1
        if mkloop; then
            m=$(mkmnt c2)
            # raid1 metadata and data: mountinfo names only one device as the source; the
            # disk of the other one is flashed (a member all the same).
            if mkfs.btrfs -q -f -d raid1 -m raid1 "$PA" "$P1" >/dev/null && { btrfs -q device scan "$PA" "$P1" >/dev/null 2>&1; true; } \
                && mnt "$P1" "$m"; then
                shown=$(findmnt -n -o SOURCE "$m" | sed 's/\[.*//')
                other=$LA; [ "$(readlink -f "$shown")" = "$(readlink -f "$PA")" ] && other=$L
                note "mountinfo names $shown; flashing the disk of the other member, $other"
                refuses "(c2) refuses: a disk with a member of a mounted two-device btrfs (mountinfo names the other one)" "$other" "member of the mounted btrfs"
            else ko "(c2) setting up a two-device btrfs"; fi
        else ko "(c2) loop device"; fi
    else ko "(c2) loop device"; fi
    case_end
else
    skip "(c) btrfs: $(command -v mkfs.btrfs >/dev/null && echo 'no btrfs in the kernel' || echo 'btrfs-progs not installed (apt-get install btrfs-progs)')"
fi

# --- (d) swap on a partition -----------------------------------------------------------------
case_start "(d) partition -> active swap"
if mkloop; then
    if mkswap -q "$P2" >/dev/null 2>&1 || mkswap "$P2" >/dev/null; then
        if swapon "$P2"; then
            push swapoff "$P2"
            refuses "(d) refuses: a partition is active swap" "$L" "${P2#/dev/}"
        else ko "(d) swapon $P2"; fi
    else ko "(d) mkswap"; fi
else ko "(d) loop device"; fi
case_end

# --- (e) a plain mount of a partition -------------------------------------------------------
case_start "(e) partition -> ext4 mounted"
if mkloop; then
    m=$(mkmnt e)
    if mkfs.ext4 -q -F "$P1" && mnt "$P1" "$m"; then
        refuses "(e) refuses: a partition is mounted" "$L" "$m"
    else ko "(e) setting up ext4"; fi
else ko "(e) loop device"; fi
case_end

# --- (f) a loop device on a partition, mounted -------------------------------------------------
case_start "(f) partition -> loop device -> ext4 mounted"
if mkloop; then
    m=$(mkmnt f)
    if mkfs.ext4 -q -F "$P1" && L2=$(losetup -f --show "$P1") && push losetup -d "$L2" && mnt "$L2" "$m"; then
        refuses "(f) refuses: a loop device on a partition is mounted" "$L" "$m"
    else ko "(f) setting up a loop device on $P1"; fi
else ko "(f) loop device"; fi
case_end

# --- (g) mounted only in another mount namespace --------------------------------------------
case_start "(g) partition mounted in another mount namespace only"
if mkloop; then
    m=$(mkmnt g)
    mkfs.ext4 -q -F "$P1"
    unshare -m --propagation private sh -c 'mount "$1" "$2" && : >"$3" && exec sleep 300' sh "$P1" "$m" "$work/g.ready" &
    nspid=$!
    push stop_pid "$nspid"
    wait_for 5 eval '[ -e "$work/g.ready" ]'
    if [ -e "$work/g.ready" ] && ! mountpoint -q "$m"; then
        refuses "(g) refuses: a partition mounted in another mount namespace" "$L" "$m"
    else ko "(g) mounting in a private mount namespace"; fi
else ko "(g) loop device"; fi
case_end

# --- (h) the target is a loop device on a disk whose partition is mounted ----------------------
case_start "(h) disk with a mounted partition -> loop device (the target)"
if mkloop; then
    m=$(mkmnt h)
    if mkfs.ext4 -q -F "$P1" && mnt "$P1" "$m" && L2=$(losetup -f --show "$L") && push losetup -d "$L2"; then
        refuses "(h) refuses: a loop device whose backing disk has a mounted partition" "$L2" "$m"
    else ko "(h) setting up"; fi
else ko "(h) loop device"; fi
case_end

# --- (i) a partition is the root of a running system (a chroot in its own mount namespace) --
case_start "(i) partition -> ext4 that is / of a running process (container-like)"
if [ -L /bin ] && [ -L /lib ] && [ -d /usr/bin ]; then
    if mkloop; then
        m=$(mkmnt i)
        mkfs.ext4 -q -F "$P1"
        # Inside: the partition mounted, /usr bound in (merged-/usr host), then chroot: the
        # process's mountinfo shows the partition at /.
        unshare -m --propagation private sh -c 'mount "$1" "$2" && mkdir -p "$2/usr" && mount --bind /usr "$2/usr" \
            && for d in bin lib lib64 sbin; do [ -e "$2/$d" ] || ln -s "usr/$d" "$2/$d"; done && : >"$3" \
            && exec chroot "$2" /usr/bin/sleep 300' sh "$P1" "$m" "$work/i.ready" &
        nspid=$!
        push stop_pid "$nspid"
        wait_for 5 eval '[ -e "$work/i.ready" ]'
        sleep 0.2
        if [ -e "$work/i.ready" ] && grep -q " / / " "/proc/$nspid/mountinfo" 2>/dev/null; then
            refuses "(i) refuses: a partition is / of a running process (holds the running system)" "$L" "holds the running system"
        else ko "(i) chroot into a partition in a private mount namespace"; fi
    else ko "(i) loop device"; fi
    case_end
else
    skip "(i) running-system case: needs a merged-/usr host (/bin -> usr/bin)"
fi

# --- accepted: an unused partitioned loop device (an unmounted ext4 on p1) ---------------------
case_start "accept: unused partitioned loop device"
if mkloop 96; then
    mkfs.ext4 -q -F "$P1"
    if timeout 60 "$F" "$img" "$L" --yes >"$work/accept.log" 2>&1 && grep -q 'verified sha256' "$work/accept.log"; then
        ok "accepts and flashes an unused partitioned loop device ($(grep -o 'done in [0-9]*s' "$work/accept.log"))"
        got=$(sfdisk --json "$L" 2>/dev/null | jq -r '[.partitiontable.partitions[].name] | join(",")')
        if [ "$got" = esp,perm ]; then ok "flashed device carries the image's table (esp, perm)"; else ko "flashed table: '$got'"; fi
        if grep -qi 'mountpoint' "$work/accept.log"; then ok "the confirmation lists the target's mount points"; else sed 's/^/     | /' "$work/accept.log"; ko "no mount points column in the confirmation"; fi
    else
        sed 's/^/     | /' "$work/accept.log" | tail -20
        ko "accepts and flashes an unused partitioned loop device"
    fi
else ko "accept: loop device"; fi
case_end

# --- two flashes of one image: each disk gets its own GUIDs, the labels stay --------------
# The image is reproducible (one set of GUIDs per board); init tells the boot disk from a
# second flashed disk by the ESP's partition GUID, so the flash script gives each disk new
# ones. Two image files as targets (no loop device needed).
case_start "own GUIDs: two flashes of the same image"
guids() { sfdisk --json "$1" 2>/dev/null | jq -r '.partitiontable | [.id] + [.partitions[].uuid] | .[]'; }
truncate -s 64M "$work/g1.img" "$work/g2.img"
if timeout 60 "$F" "$img" "$work/g1.img" --yes >"$work/g1.log" 2>&1 && timeout 60 "$F" "$img" "$work/g2.img" --yes >"$work/g2.log" 2>&1; then
    all=$( { guids "$img"; guids "$work/g1.img"; guids "$work/g2.img"; } | tr a-f A-F)
    n_all=$(grep -c . <<<"$all"); n_uniq=$(sort -u <<<"$all" | grep -c .)
    names=$(for f in g1 g2; do sfdisk --json "$work/$f.img" | jq -r '[.partitiontable.partitions[].name] | join(",")'; done | sort -u | tr '\n' ' ')
    if [ "$n_all" = 9 ] && [ "$n_uniq" = 9 ]; then
        ok "two flashed disks: disk GUID and every partition GUID their own (9 GUIDs, all different, none the image's)"
    else
        echo "$all" | sed 's/^/     | /'; ko "GUIDs after two flashes: $n_uniq different of $n_all"
    fi
    if [ "$names" = "esp,perm " ]; then ok "both keep the image's labels (esp, perm)"; else ko "labels after the flash: '$names'"; fi
    if sfdisk --verify "$work/g1.img" 2>&1 | grep -q 'No errors detected' && sfdisk --verify "$work/g2.img" 2>&1 | grep -q 'No errors detected'; then
        ok "both tables verify (sfdisk --verify: primary and backup GPT agree)"
    else ko "sfdisk --verify of a flashed disk"; fi
else
    sed 's/^/     | /' "$work/g1.log" "$work/g2.log" | tail -20
    ko "flashing the image into two files"
fi
rm -f "$work/g1.img" "$work/g2.img"
case_end

unwind 0
# Nothing of ours is left (the trap would catch the rest, this says so).
# (a loop device detached while still open goes away at its last close: wait a little)
wait_for 5 eval 'left=$(losetup -a | grep -F "$work" || true); [ -z "$left" ]'
[ -z "$left" ] || ko "loop devices left behind: $left"
echo "== $((SECONDS - t_all))s"
h_finish
