#!/usr/bin/env bash
# Build the flashable disk image of one board, offline from Debian packages (kept in
# .cache/) and the static riceguard:
#
#   out/<board>/riceguard-<board>.img   GPT: esp, root-a, root-b, perm
#   out/<board>/slot-{a,b}.efi           UKIs (systemd-stub + kernel + initramfs + cmdline)
#   out/<board>/root.squashfs            the read-only root of a slot
#   out/<board>/manifest.txt             sha256 and size of each, package versions
#
# No root, no loop mounts: filesystems are made as files (mkfs.vfat -C + mtools,
# mksquashfs, mke2fs -d) and written into the disk file with dd. Reproducible: every
# timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), inputs are sorted,
# every UUID/serial is derived from the board name.
#
# usage: image/build.sh BOARD
# env:   SOURCE_DATE_EPOCH, RG_OUT (output dir, default out/<board>), RG_BIN (riceguard
#        binary; default: build it), RG_CMDLINE_EXTRA (appended to the kernel command
#        line, e.g. riceguard.uplink=192.0.2.2/24,gw=192.0.2.1), RG_PERM_SEED (a dir
#        whose contents pre-seed the perm filesystem, e.g. riceguard.conf for tests),
#        RG_VERSION (image version; default git describe), RG_BUILD (monotonic build number,
#        signed into update bundles: a device refuses bundles not newer than its own; default
#        SOURCE_DATE_EPOCH, the commit time), RG_UPDATE_KEY (image/keys.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
board=${1:?usage: image/build.sh BOARD (one of: $(ls board | grep -v README | tr '\n' ' '))}
bdir=board/$board
[ -f "$bdir/board.conf" ] || { echo "build: no $bdir/board.conf (see board/README.md)" >&2; exit 2; }
# shellcheck source=/dev/null
. "$bdir/board.conf"

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export TZ=UTC LC_ALL=C
umask 022
E=$SOURCE_DATE_EPOCH
out=${RG_OUT:-out/$board}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$out/work
rm -rf "$work"
mkdir -p "$work"
version=${RG_VERSION:-$(git describe --always --dirty 2>/dev/null || echo unknown)}
build=${RG_BUILD:-$E}
case $build in ''|*[!0-9]*) echo "build: RG_BUILD=$build is not a whole number" >&2; exit 2 ;; esac
t_start=$(date +%s)
step=0
STEP() { step=$((step + 1)); printf '[%s %2d] %s\n' "$board" "$step" "$*"; }
need() { for t in "$@"; do command -v "$t" >/dev/null || { echo "build: missing tool $t (run ci/deps.sh)" >&2; exit 1; }; done; }
need dpkg-deb depmod modprobe cpio zstd xz mksquashfs mkfs.vfat mmd mcopy mke2fs sfdisk objcopy sha256sum
case $ARCH in
    x86_64) OBJCOPY=objcopy OBJDUMP=objdump ;;
    aarch64) OBJCOPY=aarch64-linux-gnu-objcopy OBJDUMP=aarch64-linux-gnu-objdump; need $OBJCOPY ;;
esac

# Deterministic UUIDs: a hash of the board and the object's name, in UUID form.
uuid_for() {
    local h
    h=$(printf 'riceguard/%s/%s' "$board" "$1" | sha256sum | cut -c1-32)
    echo "${h:0:8}-${h:8:4}-4${h:13:3}-8${h:17:3}-${h:20:12}"
}
touch_tree() { find "$1" -exec touch -h -d "@$E" {} +; }

# ---- U-Boot A/B boot script (owner: the U-Boot rollback work; image/uboot/) ---------
# aarch64 images carry /boot.scr on the ESP: U-Boot's distro boot runs it before the
# EFI removable path and it does the boot counting systemd-boot cannot do there
# (image/uboot/boot.cmd, flash-scripts/README.md "U-Boot boards"). EDK2 ignores it.
# mkimage stamps the legacy image header with the time: SOURCE_DATE_EPOCH keeps it fixed.
uboot_boot_script() { # ESP_TREE
    [ "$ARCH" = aarch64 ] || return 0
    need mkimage
    SOURCE_DATE_EPOCH=$E mkimage -A arm64 -O linux -T script -C none -n "riceguard A/B boot" \
        -d image/uboot/boot.cmd "$1/boot.scr" >/dev/null
}
# The ESP is U-Boot's boot partition: mark it LegacyBIOSBootable (distro boot's
# `part list -bootable`; without any such partition it tries partition 1 only).
uboot_esp_bootable() { # DISK
    [ "$ARCH" = aarch64 ] || return 0
    sfdisk -q --no-reread --no-tell-kernel --part-attrs "$1" 1 LegacyBIOSBootable
}
# ---- end of the U-Boot block ------------------------------------------------------

# ---------------------------------------------------------------------------
STEP "riceguard static binary ($RUST_TARGET)"
if [ -n "${RG_BIN:-}" ]; then
    bin=$RG_BIN
else
    ci/build-static.sh "$ARCH" >"$work/cargo.log" 2>&1 || { cat "$work/cargo.log" >&2; exit 1; }
    bin=target/$RUST_TARGET/release/riceguard
fi
file "$bin" | grep -q "statically linked" || { echo "build: $bin is not a static binary" >&2; exit 1; }

STEP "Debian packages ($DEBARCH: $KERNEL_PKG systemd-boot-efi)"
# FIRMWARE_PKGS (board.conf, optional): packages the modules' firmware files come from.
read -ra fwpkgs <<<"${FIRMWARE_PKGS:-}"
mapfile -t debs < <(image/fetch.sh "$DEBARCH" "$KERNEL_PKG" systemd-boot-efi "${fwpkgs[@]}")
pkgs=()
for d in "${debs[@]}"; do
    pkgs+=("$(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version)")
done
dpkg-deb -x "${debs[0]}" "$work/kernel"
dpkg-deb -x "${debs[1]}" "$work/sdboot"
kver=$(ls "$work/kernel/lib/modules")
vmlinuz=$work/kernel/boot/vmlinuz-$kver
echo "    kernel $kver"

STEP "initramfs: /init + ${MODULES// /, }"
ird=$work/initramfs
mkdir -p "$ird"/{dev,proc,sys,run,newroot,etc/riceguard} "$ird/lib/modules/$kver"
# The arm64 package ships no modules.dep (ENVIRONMENT.md): index the full tree first.
depmod -b "$work/kernel" "$kver"
for m in $MODULES; do
    deps=$(modprobe -S "$kver" -d "$work/kernel" --show-depends "$m" 2>&1) || {
        echo "build: module $m (board MODULES) is not in $kver: $deps" >&2; exit 1; }
    while read -r kind path _; do
        [ "$kind" = insmod ] || continue
        rel=${path#"$work/kernel/lib/modules/$kver/"}
        dst=$ird/lib/modules/$kver/${rel%.xz}
        dst=${dst%.zst}
        [ -e "$dst" ] && continue
        mkdir -p "$(dirname "$dst")"
        # Init loads with finit_module and no decompressor: store the plain .ko.
        case $path in
            *.xz) xz -dc "$path" >"$dst" ;;
            *.zst) zstd -qdc "$path" >"$dst" ;;
            *) cp "$path" "$dst" ;;
        esac
    done <<<"$deps"
done
for f in modules.builtin modules.builtin.modinfo modules.order; do
    cp "$work/kernel/lib/modules/$kver/$f" "$ird/lib/modules/$kver/"
done
depmod -b "$ird" "$kver"
# Keep only what init reads (the binary indexes would only be dead weight).
find "$ird/lib/modules/$kver" -maxdepth 1 -name 'modules.*' ! -name modules.dep ! -name modules.builtin -delete
echo "    $(find "$ird/lib/modules" -name '*.ko' | wc -l) module files"
# The firmware files the image's modules declare (modinfo -F firmware) that FIRMWARE_PKGS
# ship, under /lib/firmware where the kernel's loader looks (it reads .xz/.zst itself);
# the same files go into the root below (a NIC loads its firmware when brought up).
fwd=$work/firmware
if [ ${#fwpkgs[@]} -gt 0 ]; then
    for d in "${debs[@]:2}"; do dpkg-deb -x "$d" "$work/fwpkgs"; done
    find "$ird/lib/modules" -name '*.ko' | sort | while read -r ko; do
        modinfo -F firmware "$ko"
    done | sort -u | while read -r fw; do
        for f in "$work/fwpkgs/lib/firmware/$fw" "$work/fwpkgs/usr/lib/firmware/$fw"; do
            for c in "$f" "$f.xz" "$f.zst"; do
                [ -f "$c" ] || continue
                mkdir -p "$fwd/$(dirname "$fw")"
                cp "$c" "$fwd/$(dirname "$fw")/"
            done
        done
    done
    mkdir -p "$ird/lib/firmware"
    [ -d "$fwd" ] && cp -a "$fwd/." "$ird/lib/firmware/"
    echo "    $(find "$ird/lib/firmware" -type f | wc -l) firmware files (${fwpkgs[*]})"
fi
install -m 0755 "$bin" "$ird/init"
board_runtime() {
    # The keys init acts on (gateway/src/init/board.rs), nothing build-only.
    printf '# from board/%s/board.conf by image/build.sh\n' "$board"
    printf 'BOARD=%s\nMODULES="%s"\nDATAPLANE_CORES="%s"\nHUGEPAGES=%s\nCONSOLE="%s"\nWATCHDOG=%s\nWATCHDOG_TIMEOUT=%s\n' \
        "$BOARD" "$MODULES" "$DATAPLANE_CORES" "$HUGEPAGES" "$CONSOLE" "$WATCHDOG" "$WATCHDOG_TIMEOUT"
}
board_runtime >"$ird/etc/riceguard/board.conf"
touch_tree "$ird"
(cd "$ird" && find . -mindepth 1 | sort | cpio --quiet -o -H newc -R 0:0 --reproducible) \
    | zstd -q -19 -T1 >"$work/initramfs.cpio.zst"

STEP "root squashfs (rootfs-overlay + riceguard + board)"
rfs=$work/rootfs
mkdir -p "$rfs"/{dev,proc,sys,run,tmp,perm,usr/bin,sbin,var,etc/riceguard}
cp -a rootfs-overlay/. "$rfs/"
sed -i "s/@VERSION@/$version/g" "$rfs/etc/os-release"
printf 'riceguard %s %s\n' "$version" "$board" >"$rfs/etc/riceguard/version"
# The running slot's build number: the updater refuses bundles that are not newer.
printf '%s\n' "$build" >"$rfs/etc/riceguard/build"
# The clock's floor at boot (init/clock_floor.rs): never earlier than the image.
printf '%s\n' "$E" >"$rfs/etc/riceguard/build-time"
install -m 0755 "$bin" "$rfs/usr/bin/riceguard"
ln -s ../usr/bin/riceguard "$rfs/sbin/init"
ln -s ../run "$rfs/var/run"
if [ -d "$fwd" ]; then mkdir -p "$rfs/lib/firmware" && cp -a "$fwd/." "$rfs/lib/firmware/"; fi
# The resolver (musl, for Endpoint host names) reads the DNS servers of the uplink's DHCP lease.
ln -s ../run/riceguard/resolv.conf "$rfs/etc/resolv.conf"
board_runtime >"$rfs/etc/riceguard/board.conf"
# Update bundles must be signed by this key's private half (image/keys.sh, flash-scripts/README.md).
install -m 0644 "$(image/keys.sh pub)" "$rfs/etc/riceguard/update.pub"
chmod -R u+rwX,go+rX,go-w "$rfs"
touch_tree "$rfs"
# (mksquashfs refuses SOURCE_DATE_EPOCH together with explicit times: give them explicitly.)
env -u SOURCE_DATE_EPOCH mksquashfs "$rfs" "$out/root.squashfs" -noappend -quiet -no-progress -comp zstd -all-root \
    -mkfs-time "$E" -all-time "$E" -no-xattrs -processors 1 >/dev/null

STEP "UKIs (systemd-stub $(dpkg-deb -f "${debs[1]}" Version))"
stub=$work/sdboot/usr/lib/systemd/boot/efi/linux$EFI_ARCH.efi.stub
[ -f "$stub" ] || { echo "build: no $stub in systemd-boot-efi" >&2; exit 1; }
align=$((16#$($OBJDUMP -p "$stub" | awk '/SectionAlignment/ {print $2}')))
# First free address after the stub's last section (objdump -h: size, VMA).
end=0
while read -r _ _ size vma _; do
    e=$((16#$vma + 16#$size)); [ $e -gt $end ] && end=$e
done < <($OBJDUMP -h "$stub" | awk 'NF==7 && $1 ~ /^[0-9]+$/')
cp "$rfs/etc/os-release" "$work/os-release"
# objcopy stamps the PE header with the current time and recomputes its checksum: set
# TimeDateStamp (COFF header + 4) to SOURCE_DATE_EPOCH and CheckSum (optional header + 64)
# to 0 (UEFI firmware ignores it) so the UKI is byte-for-byte reproducible.
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
pe_fix() {
    local pe
    pe=$(od -An -tu4 -j 60 -N4 "$1" | tr -d ' ')
    printf "$(le32 "$E")" | dd of="$1" bs=1 seek=$((pe + 8)) conv=notrunc status=none
    printf "$(le32 0)" | dd of="$1" bs=1 seek=$((pe + 24 + 64)) conv=notrunc status=none
}
for slot in a b; do
    printf '%s riceguard.slot=%s%s' "$CMDLINE" "$slot" "${RG_CMDLINE_EXTRA:+ $RG_CMDLINE_EXTRA}" >"$work/cmdline-$slot"
    args=()
    at=$end
    for sec in osrel:"$work/os-release" cmdline:"$work/cmdline-$slot" initrd:"$work/initramfs.cpio.zst" linux:"$vmlinuz"; do
        name=${sec%%:*} f=${sec#*:}
        at=$(((at + align - 1) / align * align))
        args+=(--add-section ".$name=$f" --change-section-vma ".$name=$(printf 0x%x "$at")")
        at=$((at + $(stat -c %s "$f")))
    done
    $OBJCOPY "${args[@]}" "$stub" "$out/slot-$slot.efi"
    pe_fix "$out/slot-$slot.efi"
done

STEP "ESP (FAT32: systemd-boot, UKIs, boot-counted entry)"
# Sizes in MiB. ESP: two UKIs (~12 MiB each) with room for an update to write a third.
ESP_MB=${ESP_MB:-64} ROOT_MB=${ROOT_MB:-64} PERM_MB=${PERM_MB:-64}
esp=$work/esp.img
volid=$(uuid_for esp-volume | tr -d - | cut -c1-8)
mkfs.vfat -C -F 32 -n RGESP -i "$volid" --invariant "$esp" $((ESP_MB * 1024)) >/dev/null
ef=$work/espfiles
mkdir -p "$ef/EFI/BOOT" "$ef/EFI/systemd" "$ef/EFI/riceguard" "$ef/loader/entries"
EA=${EFI_ARCH^^}
cp "$work/sdboot/usr/lib/systemd/boot/efi/systemd-boot$EFI_ARCH.efi" "$ef/EFI/BOOT/BOOT$EA.EFI"
cp "$work/sdboot/usr/lib/systemd/boot/efi/systemd-boot$EFI_ARCH.efi" "$ef/EFI/systemd/systemd-boot$EFI_ARCH.efi"
cp "$out/slot-a.efi" "$out/slot-b.efi" "$ef/EFI/riceguard/"
# No `default` line: a counted-out entry must not stay pinned (ENVIRONMENT.md). The
# factory image has slot a's entry only, with 3 tries; an update adds the other slot's.
printf 'timeout 0\neditor no\nconsole-mode keep\n' >"$ef/loader/loader.conf"
# sort-key is the last line: the U-Boot boot script reads its digit there (slots.rs).
printf 'title RiceGuard %s (slot a)\nversion %s\nefi /EFI/riceguard/slot-a.efi\nsort-key riceguard-0\n' \
    "$version" "$version" >"$ef/loader/entries/riceguard-a+3.conf"
uboot_boot_script "$ef"
touch_tree "$ef"
# mtools: -m keeps the (fixed) mtimes; directories are made in sorted order.
(cd "$ef" && find . -mindepth 1 -type d | sort | while read -r d; do mmd -i "$esp" "::${d#.}"; done
 cd "$ef" && find . -type f | sort | while read -r f; do mcopy -m -i "$esp" "$f" "::${f#.}"; done)

STEP "perm (ext4${RG_PERM_SEED:+, seeded from $RG_PERM_SEED})"
pd=$work/perm
mkdir -p "$pd"
if [ -n "${RG_PERM_SEED:-}" ]; then cp -a "$RG_PERM_SEED/." "$pd/"; fi
touch_tree "$pd"
E2FSPROGS_FAKE_TIME=$E mke2fs -q -F -t ext4 -L perm -U "$(uuid_for perm)" \
    -E "hash_seed=$(uuid_for perm-hash),root_owner=0:0" -d "$pd" "$work/perm.img" "${PERM_MB}M" >/dev/null

STEP "GPT disk"
# Layout in 512-byte sectors. 2048 (1 MiB): the first partition starts on a 1 MiB
# boundary (erase blocks, 4K sectors; LBA 0-33 hold the protective MBR and primary GPT).
# Every partition is a whole number of MiB, so each following start stays 1 MiB aligned.
# The last 1 MiB holds the backup GPT (33 sectors); the flash script grows perm into
# the rest of the real disk.
S=2048
esp_start=2048;                       esp_size=$((ESP_MB * S))
ra_start=$((esp_start + esp_size));   ra_size=$((ROOT_MB * S))
rb_start=$((ra_start + ra_size));     rb_size=$((ROOT_MB * S))
pm_start=$((rb_start + rb_size));     pm_size=$((PERM_MB * S))
total=$((pm_start + pm_size + S))
case $ARCH in
    x86_64) roottype=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709 ;;  # Linux root (x86-64), DPS
    aarch64) roottype=B921B045-1DF0-41C3-AF44-4C6F280D3FAE ;; # Linux root (ARM64), DPS
esac
sq=$(stat -c %s "$out/root.squashfs")
[ "$sq" -le $((ra_size * 512)) ] || { echo "build: root.squashfs ($sq bytes) > root partition" >&2; exit 1; }
img=$out/riceguard-$board.img
rm -f "$img"
truncate -s $((total * 512)) "$img"
# GUIDs from uuid_for keep the image reproducible; flash-scripts/flash gives every flashed
# disk new random ones (init tells the boot disk by the ESP's GUID), so nothing may find a
# partition by GUID: partitions are found by label on the boot disk (slots.rs).
sfdisk -q --no-reread --no-tell-kernel "$img" <<SFDISK
label: gpt
label-id: $(uuid_for disk)
unit: sectors
first-lba: 2048
start=$esp_start, size=$esp_size, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, uuid=$(uuid_for esp), name="esp"
start=$ra_start, size=$ra_size, type=$roottype, uuid=$(uuid_for root-a), name="root-a"
start=$rb_start, size=$rb_size, type=$roottype, uuid=$(uuid_for root-b), name="root-b"
start=$pm_start, size=$pm_size, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, uuid=$(uuid_for perm), name="perm"
SFDISK
uboot_esp_bootable "$img"
put() { dd if="$1" of="$img" bs=512 seek="$2" conv=notrunc,sparse status=none; }
put "$esp" $esp_start
put "$out/root.squashfs" $ra_start
put "$out/root.squashfs" $rb_start   # factory: both slots hold the same root
put "$work/perm.img" $pm_start

STEP "manifest"
cp "$work/initramfs.cpio.zst" "$out/initramfs-$board.cpio.zst"
{
    echo "# riceguard image manifest"
    echo "board $board"
    echo "version $version"
    echo "build $build"
    echo "source_date_epoch $E"
    echo "kernel $kver"
    for p in "${pkgs[@]}"; do echo "package $p"; done
    echo "# sha256 bytes file"
    for f in "riceguard-$board.img" slot-a.efi slot-b.efi root.squashfs "initramfs-$board.cpio.zst"; do
        echo "$(sha256sum "$out/$f" | cut -d' ' -f1) $(stat -c %s "$out/$f") $f"
    done
    echo "$(sha256sum "$bin" | cut -d' ' -f1) $(stat -c %s "$bin") riceguard (static, $RUST_TARGET)"
} >"$out/manifest.txt"
rm -rf "$work"

t=$(( $(date +%s) - t_start ))
echo "== $board built in ${t}s: $out"
awk 'length($1) == 64 {printf "   %-34s %10d bytes  %s\n", $3, $2, substr($1, 1, 16)}' "$out/manifest.txt"
