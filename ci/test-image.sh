#!/usr/bin/env bash
# Image tests: build each QEMU board's image twice (identical sha256), check the disk
# layout and contents, boot the real disk images under TCG with UEFI firmware and fresh
# variable stores, and watch the serial console:
#   - both boards: slot booted, perm mounted, gateway up, console prompt, boot marked good
#     (the ESP entry renamed, read back with mtools after QEMU exits); every module of
#     MODULES and its modules.dep dependencies loaded (init's count), the netfilter ones
#     among them, each in the initramfs (the image has no modprobe: nothing autoloads)
#   - each board on a tap in a namespace with a pre-seeded perm: uplink address over
#     netlink, WireGuard through the image with a wireguard-go peer, a killed gateway
#     restarted by the supervisor, a hung gateway (worker heartbeats frozen by
#     riceguard.selftest=hang) seen unhealthy and restarted by init's health watch,
#     USO on (boot 1) and off (boot 2), perm surviving the
#     second boot, `show status` with the firewall's line, `show log` listing the boot
#     events of boots 1 and 2 (both ended by a kill) and 3 and the clock steps before
#     those kills, `reboot` typed on the serial
#     console (clean unmount of perm); init's `firewall: table inet riceguard in place`
#     before the uplink's address;
#     the clock (never back): every net boot starts with the RTC at 2001 (-rtc base=), and
#     the namespace runs an SNTP server (ci/lib/sntp_server.py) on two addresses, both in
#     `Ntp`: boot 1 starts at the image's build time (source: build), then NTP steps it;
#     boot 2 (after boot 1 was killed: a power cut) starts from the saved time (source:
#     saved, past the build time, up to 11 min ahead), and as boot 1 agreed with NTP its
#     first answer steps it back once, to the server's time (never further: no other step
#     back), the gateway held back by init until then; boot 3's `show status` begins with `clock: <ISO 8601> (source: ntp ...)`;
#     while each boots, closed TCP/UDP ports of the uplink probed from the namespace ten
#     times a second: none ever answers (no RST, no ICMP port unreachable), from the
#     moment the address answers ARP, through the gateway's kill and restarts: the
#     firewall is there before the uplink passes a packet and stays when the daemon dies.
# Any "Kernel panic|Oops|BUG:|Call Trace" on the console fails that boot at once.
#
# usage: ci/test-image.sh [BOARD...]   (default: qemu-x86_64 qemu-aarch64)
# env:   RG_IMAGE_BOOT_TIMEOUT (s per boot, default 240), RG_IMAGE_KEEP=1 keeps out/test-image
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
h_init test-image
boards=("$@")
[ ${#boards[@]} -gt 0 ] || boards=(qemu-x86_64 qemu-aarch64)
T=${RG_IMAGE_BOOT_TIMEOUT:-240}
work=$PWD/out/test-image
rm -rf "$work"
mkdir -p "$work"
t_all=$SECONDS
missing=()
for t in qemu-system-x86_64 qemu-system-aarch64 jq sfdisk mdir unsquashfs dumpe2fs file setsid; do
    command -v "$t" >/dev/null || missing+=("$t")
done
[ -f /usr/share/OVMF/OVMF_CODE_4M.fd ] && [ -f /usr/share/AAVMF/AAVMF_CODE.fd ] || missing+=(ovmf/qemu-efi-aarch64)
if [ ${#missing[@]} -gt 0 ]; then
    echo "image tests need: ${missing[*]} (ci/deps.sh installs them)"
    echo "0 passed, 1 failed"
    exit 1
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}

# sha256 lines of a manifest (what must match between two builds).
shas() { awk 'length($1) == 64 {print $1, $3}' "$1"; }

# boot NAME DISK BOARD UNTIL_FN [qemu env...]: boot in the background, poll the serial
# log until the function UNTIL_FN says done, a panic shows, or the timeout. Sets
# boot_status (0 done, 3 panic, 4 timeout) and the log in $work/NAME.log.
boot() {
    local name=$1 disk=$2 board=$3 until=$4; shift 4
    local log=$work/$name.log t0=$SECONDS tl=$SECONDS restarted="" pid
    : >"$log"
    env "$@" RG_QEMU_DISK="$disk" RG_QEMU_LOG="$log" RG_QEMU_TIMEOUT="$T" RG_QEMU_UNTIL='^RG-NEVER$' \
        image/qemu.sh "$board" >"$work/$name.qemu" 2>&1 &
    pid=$!
    boot_status=4
    while kill -0 "$pid" 2>/dev/null; do
        if serial_panicked "$log"; then boot_status=3; break; fi
        if "$until" "$log"; then boot_status=0; break; fi
        if [ -z "$restarted" ] && qemu_restarted "$log"; then restarted=1 tl=$SECONDS; fi
        if [ $((SECONDS - tl)) -gt $((T + 10)) ]; then break; fi
        sleep 0.5
        # Seconds from QEMU start to the first `gateway up`, for the report.
        if [ -z "${up_at[$name]:-}" ] && grep -qa 'riceguard-init: gateway up' "$log"; then
            up_at[$name]=$((SECONDS - t0))
        fi
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    tr -d '\r' <"$log" >"$log.txt"
    echo "     $name: $((SECONDS - t0))s${restarted:+ (the guest kernel stalled before init; started once more)}, serial log $log.txt"
}
declare -A up_at nko

have() { grep -qaE "$2" "$1"; }
count() { grep -caE "$2" "$1"; }
# The module files of an initramfs, one path a line.
ird_kos() { zstd -dc "$1" | cpio -it --quiet 2>/dev/null | grep -a '\.ko$'; }
# ird_loadable INITRAMFS BOARD: how many module files init loads from it: the board's
# MODULES and their dependencies in the initramfs's modules.dep (a softdep's file that
# image/build.sh copies too, such as crc32c-intel for libcrc32c, is not loaded by init).
ird_loadable() {
    local dep
    dep=$(zstd -dc "$1" | cpio -i --quiet --to-stdout '*modules.dep' 2>/dev/null)
    (. "board/$2/board.conf" && printf '%s\n' "$dep" | awk -v mods="$MODULES" '
        BEGIN { n = split(mods, m, " "); for (i = 1; i <= n; i++) { x = m[i]; gsub("-", "_", x); want[x] = 1 } }
        { p = $1; sub(":$", "", p); b = p; sub(".*/", "", b); sub("[.]ko.*", "", b); gsub("-", "_", b)
          if (b in want) { got[p] = 1; for (i = 2; i <= NF; i++) got[$i] = 1 } }
        END { c = 0; for (k in got) c++; print c }')
}
# The netfilter modules a board's MODULES names.
nf_modules() { (. "board/$1/board.conf" && printf '%s\n' $MODULES | grep -E '^nft?_'); }
# modules_all_loaded LOG NKO: init's "N modules loaded[, A without their hardware]" says
# all NKO modules it had to load did, and no "module ...:" error or "N failed" is on the
# serial line.
modules_all_loaded() {
    local line n a
    line=$(grep -aoE 'riceguard-init: [0-9]+ modules loaded.*' "$1" | head -1)
    [ -n "$line" ] || return 1
    case $line in *failed*) return 1 ;; esac
    grep -qaE 'riceguard-init: module [^ ]+: ' "$1" && return 1
    n=$(printf '%s' "$line" | sed -E 's/riceguard-init: ([0-9]+) modules loaded.*/\1/')
    a=$(printf '%s' "$line" | sed -nE 's/.*, ([0-9]+) without their hardware.*/\1/p')
    [ $((n + ${a:-0})) -eq "$2" ]
}
# before LOG RE1 RE2: the first line matching RE1 comes before the first matching RE2.
before() {
    local a b
    a=$(grep -naE "$2" "$1" | head -1 | cut -d: -f1)
    b=$(grep -naE "$3" "$1" | head -1 | cut -d: -f1)
    [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]
}
basic_done() { have "$1" 'riceguard-init: (boot marked good|FATAL)' && have "$1" 'riceguard(\(edit\))?# '; }

# ---------------------------------------------------------------------------------------
echo "== build: each board twice, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
for b in "${boards[@]}"; do
    for i in 1 2; do
        t0=$SECONDS
        if RG_OUT=$work/$b-$i image/build.sh "$b" >"$work/$b-$i.build" 2>&1; then
            echo "     $b build $i: $((SECONDS - t0))s"
        else
            tail -20 "$work/$b-$i.build"
            ko "$b: image build $i"
            continue 2
        fi
    done
    ok "$b: image builds"
    if diff <(shas "$work/$b-1/manifest.txt") <(shas "$work/$b-2/manifest.txt"); then
        ok "$b: two builds byte-identical (sha256 of image, UKIs, root, initramfs)"
    else
        ko "$b: two builds differ"
    fi
    img=$work/$b-1/riceguard-$b.img
    labels=$(sfdisk --json "$img" | jq -r '[.partitiontable.partitions[].name] | join(",")')
    check "$b: GPT labels esp,root-a,root-b,perm ($labels)" test "$labels" = "esp,root-a,root-b,perm"
    esp_type=$(sfdisk --json "$img" | jq -r '.partitiontable.partitions[0].type')
    check "$b: esp has the EFI System type" test "$esp_type" = C12A7328-F81F-11D2-BA4B-00A0C93EC93B
    aligned=$(sfdisk --json "$img" | jq '[.partitiontable.partitions[].start % 2048] | add')
    check "$b: partitions 1 MiB aligned" test "$aligned" = 0
    magic=$(dd if="$img" bs=1 skip="$(part_off "$img" root-a)" count=4 status=none)
    check "$b: root-a holds a squashfs" test "$magic" = hsqs
    magic=$(dd if="$img" bs=1 skip="$(part_off "$img" root-b)" count=4 status=none)
    check "$b: root-b holds a squashfs" test "$magic" = hsqs
    unsquashfs -q -cat "$work/$b-1/root.squashfs" usr/bin/riceguard >"$work/$b.bin" 2>/dev/null
    check "$b: riceguard in the root is a static binary" sh -c "file '$work/$b.bin' | grep -q 'statically linked'"
    check "$b: factory boot entry riceguard-a+3.conf" test "$(esp_entries "$img")" = "riceguard-a+3.conf"
    kos=$(ird_kos "$work/$b-1/initramfs-$b.cpio.zst")
    nko[$b]=$(ird_loadable "$work/$b-1/initramfs-$b.cpio.zst" "$b")
    nfm=$(nf_modules "$b" | tr '\n' ' ')
    check "$b: MODULES names netfilter modules ($nfm)" test -n "$nfm"
    for m in $nfm; do
        check "$b: initramfs holds $m.ko" sh -c 'printf "%s\n" "$1" | grep -qE "/$2\.ko$"' _ "$kos" "$m"
    done
    sz=$(awk -v f="riceguard-$b.img" '$3 == f {print $2}' "$work/$b-1/manifest.txt")
    note "$b: image $((sz / 1048576)) MiB ($(du -m "$img" | cut -f1) MiB allocated), UKI $(( $(stat -c %s "$work/$b-1/slot-a.efi") / 1048576 )) MiB, root $(( $(stat -c %s "$work/$b-1/root.squashfs") / 1024 )) KiB"
done

# ---------------------------------------------------------------------------------------
echo "== boot: each board's factory image, user networking"
for b in "${boards[@]}"; do
    [ -f "$work/$b-1/riceguard-$b.img" ] || continue
    disk=$work/$b-boot.img
    cp --sparse=always "$work/$b-1/riceguard-$b.img" "$disk"
    boot "$b" "$disk" "$b" basic_done
    log=$work/$b.log.txt
    check "$b: no kernel panic/oops" test "$boot_status" != 3
    check "$b: 'slot a booted'" have "$log" 'riceguard-init: slot a booted'
    check "$b: all ${nko[$b]:-?} modules of MODULES and their modules.dep dependencies loaded, netfilter's among them (init's count, none failed)" \
        modules_all_loaded "$log" "${nko[$b]:-0}"
    note "$b: $(grep -aoE 'riceguard-init: [0-9]+ modules loaded.*' "$log" | head -1)"
    check "$b: 'perm mounted'" have "$log" 'riceguard-init: perm mounted'
    check "$b: init put table inet riceguard in place before the uplink came up" \
        before "$log" 'riceguard-init: firewall: table inet riceguard in place' 'riceguard-init: uplink [^ ]+ up'
    check "$b: first-boot public key printed" have "$log" '^riceguard: public key [A-Za-z0-9+/]{43}='
    check "$b: 'gateway up'" have "$log" 'riceguard-init: gateway up'
    check "$b: console prompt on the serial line" have "$log" 'riceguard(\(edit\))?# '
    check "$b: 'boot marked good'" have "$log" 'riceguard-init: boot marked good'
    check "$b: ESP entry renamed to riceguard-a.conf" test "$(esp_entries "$disk")" = "riceguard-a.conf"
    # The fast path the product is named for, by default: io_uring workers whose buffer
    # pools sit on the hugepages init reserved for exactly them.
    check "$b: hugepages reserved for the configured pools" have "$log" 'hugepages: [1-9][0-9]* of [1-9][0-9]* reserved \(the gateway'"'"'s buffer pools\)'
    check "$b: io_uring worker pool on hugepages" have "$log" 'worker [0-9]+: buffer pool: .* on [0-9]+ hugepages'
    if have "$log" 'gateway: .*(offload|USO|GSO|sendmmsg)'; then
        note "$b: offload: $(grep -aE 'gateway: .*(offload|USO|GSO|sendmmsg)' "$log" | head -3 | tr '\n' ' ')"
    fi
    note "$b: gateway up ${up_at[$b]:-never} s after QEMU start (TCG)"
    [ "$boot_status" = 0 ] || { echo "---- last serial lines ($b)"; tail -25 "$log"; }
done

# probe_silent STATUS: labtool.py boot-probe saw the address come up, sent at least 100
# probes after that (10 s), and got no answer of any kind.
probe_silent() {
    local st
    st=$(cat "$1" 2>/dev/null) || return 1
    v() { printf '%s\n' "$st" | awk -v k="$1" '{for (i = 1; i < NF; i += 2) if ($i == k) print $(i + 1)}'; }
    [ "$(v up_at)" != - ] && [ "$(v after_up)" -ge 100 ] && [ "$(v rst)" = 0 ] &&
        [ "$(v unreach)" = 0 ] && [ "$(v open)" = 0 ] && [ "$(v reply)" = 0 ]
}

# ---------------------------------------------------------------------------------------
# Each board on a tap in a namespace: uplink by netlink, WireGuard with a wireguard-go
# peer, supervisor restart, USO on then off, second boot keeps perm, console reboot.
net_tests() {
    local b=$1
    echo "== boot: $b on a tap, WireGuard peer, restart, USO on/off, second boot, reboot"
    seed=$work/perm-seed-$b
    mkdir -p "$seed"
    gpriv=$(wg genkey) hpriv=$(wg genkey)
    gpub=$(echo "$gpriv" | wg pubkey) hpub=$(echo "$hpriv" | wg pubkey)
    cat >"$seed/riceguard.conf" <<EOF
[Interface]
PrivateKey = $gpriv
ListenPort = 51820
Address = 10.100.0.1/24

[Peer]
PublicKey = $hpub
AllowedIPs = 10.100.0.2/32

[Gateway]
InterfaceName = wg0
Ntp = 192.0.2.1, 192.0.2.3
EOF
    chmod 600 "$seed/riceguard.conf"
    if RG_OUT=$work/$b-net RG_PERM_SEED=$seed \
        RG_CMDLINE_EXTRA="riceguard.uplink=192.0.2.2/24,gw=192.0.2.1 riceguard.selftest=restart riceguard.selftest=hang" \
        image/build.sh "$b" >"$work/$b-net.build" 2>&1; then
        # The peer, inside the namespace qemu.sh makes; its result lands in a file.
        netn=$((${netn:-0} + 1)); wgif=rgi$$n$netn
        echo "$hpriv" >"$work/peer.key"
        peer=$work/peer-$b.sh
        cat >"$peer" <<EOF
#!/bin/sh
res=\$1
# Closed ports of the uplink (TCP and UDP 9: nothing listens there), from QEMU's start.
python3 $PWD/ci/lib/labtool.py boot-probe 192.0.2.2 9 9 $((T + 30)) \$res.probe & pp=\$!
# Two NTP server addresses with the true time (the guest starts at the build time,
# possibly days behind: a step over 24 h needs two servers agreeing).
ip addr add 192.0.2.3/24 dev rgtap0
python3 $PWD/ci/lib/sntp_server.py --log \$res.sntp 192.0.2.1=offset=0 192.0.2.3=offset=0 >/dev/null 2>&1 & sp=\$!
WG_PROCESS_FOREGROUND=1 wireguard-go $wgif >/dev/null 2>&1 & wgp=\$!
trap 'kill \$wgp \$pp \$sp 2>/dev/null; rm -f /var/run/wireguard/$wgif.sock; exit 0' TERM INT EXIT
for i in \$(seq 50); do [ -S /var/run/wireguard/$wgif.sock ] && break; sleep 0.1; done
wg set $wgif private-key $work/peer.key peer $gpub endpoint 192.0.2.2:51820 allowed-ips 10.100.0.1/32 persistent-keepalive 5
ip addr add 10.100.0.2/24 dev $wgif
ip link set $wgif up
: >\$res.uplink; : >\$res.wg
while :; do
    [ -s \$res.uplink ] || { ping -c1 -W1 192.0.2.2 >/dev/null 2>&1 && echo ok >\$res.uplink; }
    [ -s \$res.wg ] || { ping -c1 -W1 10.100.0.1 >/dev/null 2>&1 && echo ok >\$res.wg; }
    sleep 1
done
EOF
        chmod +x "$peer"
        disk=$work/$b-net.img
        cp --sparse=always "$work/$b-net/riceguard-$b.img" "$disk"
        net_done() {
            # Up three times: first start, after the selftest kill, after the hang restart.
            [ -s "$res.wg" ] && [ "$(count "$1" 'riceguard-init: gateway up')" -ge 3 ] && have "$1" 'boot marked good'
        }
        for run in 1 2; do
            uso=on; [ $run = 2 ] && uso=off
            res=$work/$b-net$run
            boot "$b-net$run" "$disk" "$b" net_done RG_QEMU_NET=tap RG_QEMU_USO=$uso \
                RG_QEMU_NS_HOOK="$peer $res" RG_QEMU_EXTRA="-rtc base=2001-01-01T00:00:00"
            log=$work/$b-net$run.log.txt
            grep -aE 'riceguard-init: clock: |ntp: .*(stepped|slewing|refused)' "$log" | head -3 | sed "s/^/     $b net $run: /"
            if [ $run = 1 ]; then
                check "$b net boot 1: RTC at 2001, the clock starts at the image's build time" \
                    have "$log" "riceguard-init: clock: set to $(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ) \(source: build\)"
            else
                saved_at=$(sed -n 's/.*riceguard-init: clock: set to \([0-9T:-]*Z\) (source: saved).*/\1/p' "$log" | head -1)
                check "$b net boot 2: RTC at 2001, the clock starts at the saved time ($saved_at), past the build time" \
                    test -n "$saved_at" -a "$(date -u -d "$saved_at" +%s 2>/dev/null || echo 0)" -gt "$SOURCE_DATE_EPOCH"
            fi
            if [ $run = 1 ]; then
                check "$b net boot 1: the SNTP server in the namespace set the clock" \
                    have "$log" 'ntp: 192\.0\.2\.[13]:123: stepped the clock \+'
            else
                # Boot 1 ended by a kill (a power cut): the saved floor is up to 11 min
                # ahead of the true time; boot 1 agreed with NTP when it saved, so its
                # stamps are behind the server's time now and the first answer may step
                # the clock back to it, once.
                check "$b net boot 2: init allows the first answer to step back (boot 1 agreed with NTP)" \
                    have "$log" 'riceguard-init: clock: the last boot agreed with NTP'
                check "$b net boot 2: the first NTP answer stepped the clock back to the server's time" \
                    have "$log" 'ntp: 192\.0\.2\.[13]:123: stepped the clock -[0-9.]+ (s|min) to '
                check "$b net boot 2: init held the gateway back for that answer, and started it after" \
                    sh -c "$(declare -f have before); have '$log' 'riceguard-init: clock: the gateway starts after the first NTP answer' && before '$log' 'stepped the clock -' 'riceguard-init: gateway up'"
            fi
            back=$(count "$log" 'stepped the clock -')
            check "$b net boot $run: the clock stepped back $([ $run = 1 ] && echo never || echo 'once, at the first answer') ($back)" \
                test "$back" = "$([ $run = 1 ] && echo 0 || echo 1)"
            check "$b net boot $run (USO $uso): no kernel panic/oops" test "$boot_status" != 3
            check "$b net boot $run: uplink 192.0.2.2/24 set over netlink" have "$log" 'uplink eth0 up 192.0.2.2/24 via 192.0.2.1'
            check "$b net boot $run: init put table inet riceguard in place before the uplink got its address" \
                before "$log" 'riceguard-init: firewall: table inet riceguard in place' 'riceguard-init: uplink eth0 up 192\.0\.2\.2/24'
            check "$b net boot $run: guest answers ping on the tap" test -s "$res.uplink"
            # boot-probe's status: the address came up (ARP), probes went on for a while
            # after, and none was answered, through boot, the kill and the hang restart.
            note "$b net boot $run: uplink closed-port probes: $(cat "$res.probe" 2>/dev/null)"
            check "$b net boot $run: closed TCP/UDP ports of the uplink never answered, from the address's first ARP answer through the restarts (no RST, no ICMP port unreachable)" \
                probe_silent "$res.probe"
            check "$b net boot $run: WireGuard ping through the image (wireguard-go peer)" test -s "$res.wg"
            check "$b net boot $run: killed gateway restarted by the supervisor" \
                test "$(count "$log" 'riceguard-init: gateway up')" -ge 2
            # The watchdog watches the gateway: frozen heartbeats (UAPI still answers) are
            # unhealthy; a few seconds later init restarts it, and it comes back up.
            check "$b net boot $run: hung gateway seen unhealthy (heartbeats stuck)" \
                have "$log" 'riceguard-init: gateway unhealthy: worker [0-9]+ heartbeat stuck'
            check "$b net boot $run: hung gateway restarted by init, reason said" \
                have "$log" 'riceguard-init: gateway unhealthy \(worker [0-9]+ heartbeat stuck.*\): restarting it'
            check "$b net boot $run: hung gateway back up after the restart" \
                test "$(count "$log" 'riceguard-init: gateway up')" -ge 3
            # QEMU 10 host_uso=on: virtio-net offers USO, off but changeable; off: [fixed].
            want='tx-udp-segmentation: off \[fixed\]'
            [ $uso = on ] && want='tx-udp-segmentation: (on|off \(changeable\))'
            check "$b net boot $run: guest NIC reports USO as QEMU host_uso=$uso offers it" have "$log" "$want"
            # The daemon's one-line decision: a changeable USO is switched on and used.
            dec='offload: .*-> software GSO'
            [ $uso = on ] && dec='offload: .*-> hardware USO'
            grep -aE 'offload: ' "$log" | head -2 | sed "s/^/     $b net $run (USO $uso): /"
            check "$b net boot $run: gateway's offload decision matches (USO $uso)" have "$log" "$dec"

            [ "$boot_status" = 0 ] || { echo "---- last serial lines"; tail -25 "$log"; }
        done
        l1=$work/$b-net1.log.txt l2=$work/$b-net2.log.txt
        check "$b: perm survived the second boot (boot 2)" have "$l2" 'perm mounted \(.*, boot 2\)'
        k1=$(grep -a '^riceguard: public key' "$l1" | head -1) k2=$(grep -a '^riceguard: public key' "$l2" | head -1)
        check "$b: pre-seeded key kept ($gpub)" test "$k1" = "riceguard: public key $gpub" -a "$k2" = "$k1"
        check "$b: entry stays good after the second boot" test "$(esp_entries "$disk")" = "riceguard-a.conf"

        # Boot 3: `show status` (the firewall's line), then `reboot` typed on the serial
        # console; init stops the services, unmounts perm and reboots (QEMU runs with
        # -no-reboot, so it exits).
        sin=$work/serial-in sent=0 t_status=0
        reboot_typed() {
            local l=$1
            if [ $sent = 0 ] && have "$l" 'boot marked good' && have "$l" 'riceguard(\(edit\))?# ' &&
                { have "$l" 'ntp: .*(stepped|slewing|refused)' || [ $((SECONDS - t0)) -gt 150 ]; }; then
                timeout 5 sh -c "printf 'show status\r' >'$sin'" && sent=1 t_status=$SECONDS
            elif [ $sent = 1 ] && { have "$l" 'firewall: (on|off)' || [ $((SECONDS - t_status)) -gt 15 ]; }; then
                sleep 1 # the rest of the status
                timeout 5 sh -c "printf 'show log\r' >'$sin'" && sent=2 t_status=$SECONDS
            elif [ $sent = 2 ] && { have "$l" 'Z init boot 3: slot' || [ $((SECONDS - t_status)) -gt 15 ]; }; then
                sleep 1
                timeout 5 sh -c "printf 'reboot\r' >'$sin'" && sent=3
            elif [ $sent = 3 ] && have "$l" 'Type yes to continue'; then
                timeout 5 sh -c "printf 'yes\r' >'$sin'" && sent=4
            fi
            return 1 # wait for QEMU to exit by itself
        }
        t0=$SECONDS
        res=$work/$b-reboot
        boot "$b-reboot" "$disk" "$b" reboot_typed RG_QEMU_SERIAL_IN="$sin" RG_QEMU_NET=tap \
            RG_QEMU_NS_HOOK="$peer $res" RG_QEMU_EXTRA="-rtc base=2001-01-01T00:00:00"
        log=$work/$b-reboot.log.txt
        # The reply as the serial line has it (what the next checks read, shown whole).
        grep -aA3 'show status' "$log" | head -4 | cat -v | sed "s/^/     $b show status: /"
        # Boot 2 held its gateway until its step back, so it left no stamps ahead of its
        # clock: boot 3's first answer steps back to the server's time, and the other
        # server then agrees (no "ahead" refusal: the clock is not carried ahead).
        check "$b boot 3 (after boot 2's power cut): stepped back to the server's time, the other server agrees" \
            sh -c "$(declare -f have); have '$log' 'stepped the clock -' && ! have '$log' 'refused: our clock is .* ahead'"
        check "$b: \`show status\` begins with the clock line (source: ntp SERVER, last sync)" \
            sh -c "grep -aA2 'show status' '$log' | grep -aqE '^clock: [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z \(source: ntp 192\.0\.2\.[13]:123, last sync [0-9]+ s ago\)'"
        grep -aE '^(firewall|nat): ' "$log" | sed "s/^/     $b show status: /"
        check "$b: \`show status\` says the firewall is on, table inet riceguard" have "$log" '^firewall: on \(table inet riceguard[;)]'
        # The event log on perm: boots 1 and 2 ended by power cuts (QEMU killed), their
        # events are there, in order, before this boot's.
        boots=$(sed -n '/show log/,$p' "$log" | tr -d '\r' | sed -n 's/^[0-9T:-]*Z init boot \([0-9]*\): slot a\b.*/\1/p' | tr '\n' ' ')
        check "$b: \`show log\` lists boots 1 and 2 (ended by power cuts) and 3, in order ($boots)" test "$boots" = "1 2 3 "
        # The clock steps of boots 1 and 2 (riceguard ntp writes them at once): events
        # from before those power cuts.
        steps=$(sed -n '/show log/,$p' "$log" | tr -d '\r' | grep -c '^[0-9T:-]*Z ntp clock stepped ')
        check "$b: \`show log\` lists the clock steps of the boots before the power cuts ($steps)" test "${steps:-0}" -ge 2
        cuts=$(sed -n '/show log/,$p' "$log" | tr -d '\r' | grep -c "init boot [23]: slot a.*; the previous boot's shutdown: not recorded: a power cut")
        check "$b: boots 2 and 3 say the boot before ended without a shutdown (killed: a power cut)" test "$cuts" = 2
        check "$b reboot: typed on the console, init stopped services and rebooted" \
            have "$log" 'riceguard-init: rebooting'
        check "$b reboot: QEMU exited (guest reset) before the timeout" test $((SECONDS - t0)) -lt "$T"
        poff=$(part_off "$disk" perm)
        pfs=$work/$b-perm.ext4
        dd if="$disk" of="$pfs" bs=1M skip=$((poff / 1048576)) count=64 status=none
        check "$b reboot: perm was unmounted cleanly (no journal recovery needed)" \
            sh -c "dumpe2fs -h '$pfs' 2>/dev/null | grep -q '^Filesystem features:' && ! dumpe2fs -h '$pfs' 2>/dev/null | grep -q needs_recovery"
        check "$b reboot: third boot counted on perm" have "$log" 'perm mounted \(.*, boot 3\)'
    else
        tail -20 "$work/$b-net.build"
        ko "$b: net test image build"
    fi
}
if command -v wireguard-go >/dev/null && command -v wg >/dev/null; then
    for b in "${boards[@]}"; do
        [ -f "$work/$b-1/riceguard-$b.img" ] && net_tests "$b"
    done
else
    note "skipped the tap/WireGuard boots (needs wireguard-go and wg)"
fi

echo
for n in "${notes[@]}"; do echo "note: $n"; done
echo "image tests took $((SECONDS - t_all))s"
[ -n "${RG_IMAGE_KEEP:-}" ] || rm -f "$work"/*.img "$work"/*/riceguard-*.img
h_finish
