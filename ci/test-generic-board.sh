#!/usr/bin/env bash
# A generic board tested as hardware: x86_64-generic (the default) or
# aarch64-generic (EDK2; BOARD=aarch64-generic, below). The board's image, with
# the Debian generic kernel, is flashed by flash-scripts/flash onto a disk file that QEMU
# (q35, OVMF, TCG) shows as NVMe; two emulated Intel igb ports (82576, multi-queue) sit on
# taps in bridges of a "switch" namespace; the i6300esb watchdog; the serial console is
# driven by this script. Around it, namespaces:
#
#   phone 203.0.113.2 ── router ──(rgb-lan 192.168.77.0/24)── gateway eth0 (DHCP) ── lanhost .10
#   (wireguard-go)       .1 / 203.0.113.1                     gateway eth1 ──(rgb-lan2)── lanhost2
#                        dnsmasq (DHCP, lease 2m)                192.168.88.1     192.168.88.10
#                        DNAT udp 203.0.113.1:51820 -> the gateway's lease (the port forward)
#
#   boot      from NVMe, the watchdog, what the igb offers (init's USO line) and the
#             gateway's offload decision, which must be about eth0; a DHCP lease
#             (`dhcp eth0: bound`) with dnsmasq's router and DNS; `show status` names it
#   boot probe from lanhost (the uplink segment), a TCP SYN and a UDP datagram to closed
#             ports of the lease address ten times a second from before QEMU starts until
#             after the daemon is up: the address comes up (it answers ARP) and no probe is
#             ever answered (no RST, no ICMP port unreachable): the ruleset is there from
#             the first packet the uplink passes; init's `firewall: table inet riceguard in
#             place` comes before `uplink eth0 up`, `show status` says `firewall: on (table
#             inet riceguard...` and its uplink-in drop counter counted the probes
#   one-armed the README's first client (flash-scripts/README.md "First boot on hardware"),
#             literally: the factory configuration (tunnel 10.100.0.1/24, nothing
#             renumbered), `set gateway public-endpoint 203.0.113.1:51820` (the box is
#             behind the router), `add client phone`, `commit`; the printed wg-quick config
#             (between the BEGIN/END lines) runs in the phone namespace on stock
#             wireguard-go exactly as wg-quick would set it up; the phone pings the tunnel
#             address and lanhost, and opens a TCP connection to lanhost, which has no
#             route to 10.100.0.0/24 (nor has the router): lanhost sees the gateway's
#             uplink address as the source (NAT)
#   ssh       (issue 31) `set system ssh-key lab ssh-ed25519 AAAA... lab@board`, `commit` on the
#             serial console; lanhost (the one-armed box's LAN) reaches port 22 of the lease
#             address: ssh-keyscan's key, in a known_hosts, has the fingerprint the serial
#             line (`ssh: host key SHA256:... (ED25519)`, printed by riceguard ssh at start)
#             and `show status`'s ssh line name; then Debian's OpenSSH with
#             StrictHostKeyChecking=yes logs in as admin (console ssh-N:lab); `add client
#             laptop` + `commit` from a script on stdin: its wg-quick config on wireguard-go
#             in the phone namespace pings lanhost and opens TCP to it; `export
#             configuration` over SSH (the passphrase twice from the script): an age text,
#             and its `key derivation: scrypt 2^16 (64 MiB); this console's peak memory: N
#             MiB` line (N noted, >= 64)
#   restore   Debian's `age -d` opens the ssh phase's export (the gateway's configuration,
#             the phone client, the SSH key, the host key); over SSH `import configuration`
#             with a wrong passphrase, then with one byte flipped, is refused ("not
#             imported: ...; nothing changed") and `compare` says no changes; the phone's
#             wireguard-go (phone.conf) brought up and left alone; QEMU stopped, a fresh
#             disk flashed from the same image (a new box: its own gateway key and host
#             key, `ssh: off`), booted; on its serial console `import configuration`, the
#             text pasted line by line, the passphrase, `compare` (the SSH key added),
#             `commit`: the old gateway public key, the untouched phone handshakes again
#             and pings lanhost, the old host key (serial line, `show status`,
#             ssh-keyscan) and a key login with the old known_hosts
#             (StrictHostKeyChecking=yes). The phases after it run on the restored box
#   two-armed `set gateway lan eth1`, `set gateway lan-address 192.168.88.1/24`,
#             `add client phone2`, commit; the phone (with phone2's config) reaches
#             lanhost2 by ping and TCP; from lanhost on the uplink segment, with a route to
#             192.168.88.0/24 via the gateway, ping and TCP to lanhost2 are dropped
#             (lanhost2 counts no packet from it: the firewall closes uplink -> LAN; its
#             uplink-forward drop counter in `show status` counted them); with the ssh
#             phase's key set, lanhost's SSH to the uplink address gets no answer (ssh's
#             5 s ConnectTimeout) and the uplink-in drop counter grows
#   flap      eth0's carrier off and on (QEMU monitor set_link): the lease is re-acquired
#   lease     a renewal seen, then dnsmasq stopped: the address stays past the next renewal
#             attempt and into rebinding (no `lease expired`, the router still pings it)
#   power cut the appliance as the initiator towards a stock wireguard-go peer (stamps must rise:
#             a peer drops an initiation whose TAI64N stamp is not newer than the last it
#             saw): the phone's keys on a wireguard-go that cannot initiate (no endpoint, no
#             keepalive, nothing routed into it); `set peer PHONE endpoint
#             203.0.113.2:PORT`, `persistent-keepalive 5`, commit; a capture in the phone
#             namespace tells who sent which message (type 1 initiation, 148 B; type 2
#             response, 92 B, to the initiation's sender index). The appliance initiates and
#             the peer answers; a clean `reboot`, QEMU started again with `-rtc
#             base=2001-01-01T00:00:00`; then the power cut: QEMU killed (SIGKILL) and
#             started again on the same disk, the RTC at 2001 again. After each: `clock: set
#             to ... (source: saved)` on the serial line (boot 3's later than boot 2's),
#             `show status`'s clock not in 2001, and the peer answers the appliance's new
#             initiation (it took the stamp as newer); the peer never initiated and
#             wireguard-go logged no `handshake replay`. After the reboot, the SSH host key
#             is the ssh phase's (serial line, `show status`)
#   update    (aarch64-generic) a signed bundle (image/bundle.sh) served over HTTP from
#             lanhost, installed from the serial console (`update http://...`) into slot b;
#             `reboot`: slot b on trial, marked good, the new version, the key and the phone
#             client kept, the phone reaches lanhost again; with the ssh phase's key set,
#             init marked it good once riceguard ssh listened, and the host key is the same
#             (serial line, `show status`, ssh-keyscan from lanhost) and a key login works
#   rollback  (aarch64-generic) a bundle whose root cannot boot (no /sbin/init, as
#             ci/test-update.sh's QEMU 4) installed from slot b into slot a; `reboot`: slot
#             a fails its 3 tries by itself (stage 1 reboots), the firmware's boot manager
#             falls back to slot b, which says FALLBACK and is marked good again; the
#             same SSH host key and a key login from lanhost
# Any "Kernel panic|Oops|BUG:|Call Trace" on the serial line (of any boot) fails the run.
#
# aarch64-generic: the same machine on QEMU virt (cortex-a72, TCG; not -cpu max: pointer
# authentication is slow under TCG) with AAVMF, the same NVMe disk, igb ports (each behind
# a PCIe root port) and i6300esb, the console on the PL011 (ttyAMA0). Its phases: boot,
# boot probe, DHCP, one-armed, ssh (the export's scrypt peak memory there is the figure
# the issue asked for), renewal, update, rollback; restore, two-armed, link flap, the lost
# server and the power cut are the x86_64 run's (nothing in them is board-specific; they
# cost minutes under TCG). The update's v2 and the bad v3 are v1's outputs with another
# root (version and build number changed; for v3 a root without /sbin/init) and the same
# UKIs, signed by image/bundle.sh: one image build, not three.
# The firmware is the board's UEFI (OVMF/AAVMF pflash, board.conf's FIRMWARE_CODE/VARS);
# the U-Boot boot path and its rollback are ci/test-uboot-rollback.sh's.
# usage: [BOARD=aarch64-generic] ci/test-generic-board.sh   (as root; x86_64
#        about 7 min under TCG, 410 s measured without the image build, of which ssh
#        11 s and restore 71 s; aarch64 about 5, 302 s, ssh 11 s; plus 2-3 min per image build)
# env:   RG_BOARD_PHASES (space-separated, default per board as above: probe one-armed
#        ssh restore two-armed flap renewal lease-lost powercut update rollback; restore
#        needs one-armed and ssh);
#        RG_BOARD_REBUILD=1 rebuilds out/$BOARD first (else reused if present: it
#        may be older than the working tree); RG_OUT another image dir; RG_BIN passes a
#        prebuilt static riceguard to image/build.sh; RG_BOARD_TIMEOUT (s per boot wait,
#        default 240); RG_BOARD_SMP (vCPUs, default 2), RG_BOARD_QUEUES (tap queues per
#        igb, default 2); RG_BOARD_KEEP=1 keeps the disk (and the update's bundles).
#        Serial log (serial.log the last boot's, serial-old-box.log the box before the
#        restore's fresh flash, serial-boot1.log and serial-boot2.log the ones before the
#        power cut's boots), console transcript, phone configs, the SSH client's key,
#        known_hosts and session outputs (ssh/; the export and the test's passphrase: test
#        keys, thrown away with the run), dnsmasq's log, the power
#        cut's capture (powercut.pcap; ci/lib/wgpcap.py lists its messages) and
#        wireguard-go's log (wireguard-go-powercut.log) stay in out/test-generic-board/
#        (aarch64: out/test-generic-board-aarch64-generic/, every boot's serial log kept).
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
. ci/lib/console.sh
h_init generic-board
board=${BOARD:-x86_64-generic}
case $board in x86_64-generic | aarch64-generic) ;; *) echo "BOARD=$board: x86_64-generic or aarch64-generic" >&2; exit 2 ;; esac
# shellcheck source=/dev/null
. "board/$board/board.conf"
case $board in
    x86_64-generic) phases=${RG_BOARD_PHASES:-probe one-armed ssh restore usb two-armed flap renewal lease-lost powercut} ;;
    aarch64-generic) phases=${RG_BOARD_PHASES:-probe one-armed ssh renewal update rollback} ;;
esac
want() { case " $phases " in *" $1 "*) return 0 ;; esac; return 1; }
T=${RG_BOARD_TIMEOUT:-240}
work=$PWD/out/test-generic-board
[ "$board" = x86_64-generic ] || work=$work-$board
export RG_OUT=${RG_OUT:-out/$board}
img=$RG_OUT/riceguard-$board.img
t_all=$SECONDS

finish() {
    echo
    for n in "${notes[@]}"; do echo "note: $n"; done
    echo "generic-board: serial log, transcript and configs in $work (took $((SECONDS - t_all)) s)"
    h_finish
}

[ "$(id -u)" = 0 ] || { ko "needs root (network namespaces)"; finish; }
require_tools "$QEMU" wireguard-go wg wg-quick dnsmasq nft python3 mkfifo sfdisk jq ssh ssh-keygen ssh-keyscan age
[ -f "$FIRMWARE_CODE" ] || { ko "missing $FIRMWARE_CODE (the board's UEFI firmware; ci/deps.sh installs it)"; finish; }

rm -rf "$work"
mkdir -p "$work"
if [ ! -f "$img" ] || [ -n "${RG_BOARD_REBUILD:-}" ]; then
    echo "== building $img"
    t0=$SECONDS
    image/build.sh "$board" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; ko "image build"; finish; }
    t_build=$((SECONDS - t0))
    note "image built in $t_build s"
fi

# --- names: everything carries rgb and this run's PID ------------------------------------
id=$$
SW=rgb-$id-sw R=rgb-$id-router P=rgb-$id-phone H1=rgb-$id-lanhost H2=rgb-$id-lanhost2
NSS=("$SW" "$R" "$P" "$H1" "$H2")
MAC0=52:54:00:b0:0b:01 MAC1=52:54:00:b0:0b:02
LEASE=192.168.77.60        # dnsmasq's fixed lease for MAC0
LANHOST=192.168.77.10 LANHOST2=192.168.88.10
WGIF=rgbwg$id              # wireguard-go's UAPI sockets are shared by all namespaces
log=$work/serial.log
sin=$work/serial
transcript=$work/transcript.txt
: >"$log"
: >"$transcript"

qpid="" dpid=""
cleanup() {
    exec 9>&- 2>/dev/null
    rm -f "/var/run/wireguard/$WGIF.sock" "$sin.in" "$sin.out"
    [ -n "${RG_BOARD_KEEP:-}" ] || rm -rf "$work/nvme.img" "$work/www" "$work/v2" "$work/v3"
}
# (at exit the harness stops what `spawn` started, runs this, deletes the namespaces)
at_exit cleanup
# nspawn NS CMD...: run CMD in namespace NS in the background, owned by the harness
# (`ip netns exec` execs CMD itself, so the PID is CMD's); its PID in $lastpid.
nspawn() { local ns=$1; shift; spawn ip netns exec "$ns" "$@"; lastpid=$!; }

# --- usb: export to and import from a USB stick (functions; called after one-armed) --------
#   usb       a USB controller (qemu-xhci) from boot, the sticks hot-plugged on QEMU's
#             monitor (device_add usb-storage,removable=on): with none attached
#             `import configuration from usb` says so; a stick whose one FAT partition is
#             GPT-named `perm` (the image's label) is refused; a stick made on the host
#             (MBR, one FAT32 partition, a notes.txt of the user's) gets
#             `export configuration to usb`'s file, which mtools finds on the host and
#             Debian's `age -d` opens with the passphrase, notes.txt untouched; then
#             `set gateway public-endpoint 203.0.113.9:51820`, `commit`, `import
#             configuration from usb`: `compare` shows 203.0.113.9 going back to
#             203.0.113.1, `commit` applies it. (Not ListenPort: moving it back to 51820
#             is refused by the daemon's reload, 'Address in use': the daemon's, seen
#             here first, to be looked at on its own.)
usb_qargs=(-device qemu-xhci,id=xhci)
USB_PASS='usb lab passphrase'
# usb_stick_image FILE LABEL: a 64 MiB stick, one FAT32 partition at 1 MiB (LABEL: GPT
# with that partition name, else MBR), made on the host without mounting.
usb_stick_image() {
    rm -f "$1" && truncate -s 64M "$1" || return 1
    if [ -n "$2" ]; then
        printf 'label: gpt\nstart=2048, size=120000, name=%s\n' "$2" | sfdisk -q "$1" || return 1
        mkfs.vfat -F 32 --offset 2048 "$1" 60000 >/dev/null 2>&1
    else
        printf 'label: dos\nstart=2048, type=c\n' | sfdisk -q "$1" || return 1
        mkfs.vfat -F 32 -n RGSTICK --offset 2048 "$1" $(((131072 - 2048) / 2)) >/dev/null
    fi
}
# usb_plug FILE ID / usb_unplug ID: the stick on the guest's xHCI, by QEMU's monitor (a
# new ID each time: the old drive may still be going away).
usb_plug() {
    hmp "drive_add 0 if=none,id=$2,format=raw,file=$1" &&
        hmp "device_add usb-storage,bus=xhci.0,drive=$2,removable=on,id=$2dev"
}
usb_unplug() { hmp "device_del $1dev"; }
# usb_seen REGEX SECONDS: `import configuration from usb` (asks nothing while no export is
# read) answers a line matching REGEX within SECONDS: the hot-plugged stick was probed.
usb_seen() {
    local end=$((SECONDS + $2))
    while :; do
        cmd "import configuration from usb" 60 "$CON_PROMPT|Passphrase of the export: "
        has "$1" && return 0
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 2
    done
}
usb_phase() {
    local t0=$SECONDS good=$work/stick.img bad=$work/stick-perm.img f
    echo "== usb: export configuration to usb, import configuration from usb (hot-plugged sticks)"
    for f in mkfs.vfat mcopy mdir mtype age; do
        command -v $f >/dev/null || { ko "usb: $f is missing on the host (ci/deps.sh: dosfstools, mtools, age)"; return 1; }
    done
    usb_stick_image "$bad" perm && usb_stick_image "$good" "" &&
        printf 'the user'"'"'s own file\n' >"$work/notes.txt" && mcopy -i "$good@@1M" "$work/notes.txt" :: ||
        { ko "usb: the stick images (sfdisk, mkfs.vfat, mcopy)"; return 1; }
    cmd "import configuration from usb" 60
    check "usb: no stick attached: 'no USB stick is attached', nothing changed" has 'no USB stick is attached.*nothing changed'
    usb_plug "$bad" stick1
    check "usb: a stick whose FAT partition is named perm: refused as a RiceGuard disk" \
        usb_seen 'a RiceGuard disk \(partitions perm\)' 60
    answer | sed 's/^/     /'
    cmd "export configuration to usb" 30
    check "usb: export to the perm-labelled stick refused before any passphrase ('error: not exported: no usable USB stick')" \
        has '^error: not exported: no usable USB stick'
    check "usb: the refusal lists the stick and why ('sda: a RiceGuard disk (partitions perm)')" \
        has '^ *sda: a RiceGuard disk \(partitions perm\)'
    check "usb: nothing written on the perm-labelled stick" sh -c '[ -z "$(mdir -b -i "$1@@1M" :: 2>/dev/null)" ]' _ "$bad"
    usb_unplug stick1
    usb_plug "$good" stick2
    check "usb: the host's stick found and mounted read-only (no riceguard-*.age file yet, 1 other file)" \
        usb_seen 'no riceguard-\*\.age file in the stick.s top folder \(1 other' 60
    cmd "export configuration to usb" 30 'Export passphrase: '
    check "usb: export names the stick before the passphrase ('the file goes onto the USB stick sda1 (FAT32)')" \
        has '^the file goes onto the USB stick sda1 \(FAT32\)'
    cmd "$USB_PASS" 30 'Repeat the passphrase: ' && cmd "$USB_PASS" 180
    answer | grep -aE '^(wrote|exported|error)' | sed 's/^/     /'
    check "usb: 'wrote riceguard-x86_64-generic-<UTC>.age to the USB stick sda1 (FAT32): synced and unmounted'" \
        has '^wrote riceguard-x86_64-generic-[0-9]{8}T[0-9]{6}Z\.age to the USB stick sda1 \(FAT32\): synced and unmounted'
    f=$(mdir -b -i "$good@@1M" :: 2>/dev/null | grep -aoE 'riceguard-[^/]*\.age$' | head -1)
    check "usb: the file is on the stick (mdir on the host: ${f:-none}), only it and notes.txt" \
        sh -c '[ -n "$1" ] && [ "$(mdir -b -i "$2@@1M" :: | wc -l)" = 2 ]' _ "$f" "$good"
    mtype -i "$good@@1M" ::notes.txt >"$work/notes.back" 2>/dev/null
    check "usb: notes.txt untouched" cmp -s "$work/notes.txt" "$work/notes.back"
    rm -f "$work/usb-export.age" "$work/usb-export.txt"
    [ -n "$f" ] && mcopy -i "$good@@1M" "::$f" "$work/usb-export.age" 2>/dev/null
    AGE_TTY_PASSPHRASE=$USB_PASS timeout 60 python3 gateway/core/tests/fixtures/age/age_tty.py \
        age -d -o "$work/usb-export.txt" "$work/usb-export.age" >"$work/usb-age.out" 2>&1
    check "usb: Debian's age -d opens the stick's file with the passphrase (riceguard-export 1, PublicEndpoint = 203.0.113.1:51820)" \
        sh -c 'grep -q "^riceguard-export 1$" "$1" && grep -qE "^PublicEndpoint = 203\.0\.113\.1:51820$" "$1"' _ "$work/usb-export.txt"
    rm -f "$work/usb-export.txt"
    cmd "set gateway public-endpoint 203.0.113.9:51820"
    cmd commit 60
    check "usb: a change committed after the export (public endpoint 203.0.113.9)" has 'the gateway applied it'
    cmd "import configuration from usb" 60 'Passphrase of the export: '
    check "usb: import says which file it read (read $f)" has "^read ${f//./\\.} from the USB stick sda1"
    cmd "$USB_PASS" 180
    check "usb: the export became the candidate" has 'the candidate is its configuration'
    cmd compare
    check "usb: \`compare\` shows the change reverted (- PublicEndpoint = 203.0.113.9:51820, + PublicEndpoint = 203.0.113.1:51820)" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^- *PublicEndpoint = 203\.0\.113\.9:51820" && printf "%s\n" "$1" | grep -qaE "^\+ *PublicEndpoint = 203\.0\.113\.1:51820"' _ "$(answer)"
    cmd commit 60
    check "usb: commit applies the import ('the gateway applied it')" has 'the gateway applied it'
    cmd show
    check "usb: PublicEndpoint = 203.0.113.1:51820 again" has '^PublicEndpoint = 203\.0\.113\.1:51820( |$)'
    usb_unplug stick2
    [ -n "${RG_BOARD_KEEP:-}" ] || rm -f "$good" "$bad"
    note "usb phase: $((SECONDS - t0)) s"
}

# --- the flashed disk ----------------------------------------------------------------------
echo "== flash: flash-scripts/flash onto a 1 GiB disk file (the NVMe drive)"
disk=$work/nvme.img
flash() {
    rm -f "$disk"
    truncate -s 1G "$disk"
    flash-scripts/flash "$img" "$disk" --yes >"$work/flash.log" 2>&1
}
if flash; then
    ok "flash: image written, verified and perm grown (flash-scripts/flash)"
else
    tail -10 "$work/flash.log"
    ko "flash: flash-scripts/flash failed"
    finish
fi
perm_mb=$(($(part_size "$disk" perm) / 1048576))
note "flashed disk: perm is $perm_mb MiB after the flash script grew it"

# --- namespaces ----------------------------------------------------------------------------
echo "== network: switch (bridges rgb-lan, rgb-lan2, the guest's taps), router, phone, lanhost, lanhost2"
setup_net() {
    netns_add "${NSS[@]}"
    ip -n "$SW" link add rgb-lan type bridge && ip -n "$SW" link set rgb-lan up || return 1
    ip -n "$SW" link add rgb-lan2 type bridge && ip -n "$SW" link set rgb-lan2 up || return 1
    # The guest's two igb ports: multi-queue taps with virtio-net headers.
    ip -n "$SW" tuntap add dev rgbt0 mode tap vnet_hdr multi_queue || return 1
    ip -n "$SW" tuntap add dev rgbt1 mode tap vnet_hdr multi_queue || return 1
    ip -n "$SW" link set rgbt0 master rgb-lan up && ip -n "$SW" link set rgbt1 master rgb-lan2 up || return 1
    # veths into the bridges: the router's LAN leg and each LAN host
    ip link add sw-r netns "$SW" type veth peer name lan0 netns "$R" || return 1
    ip link add sw-h1 netns "$SW" type veth peer name eth0 netns "$H1" || return 1
    ip link add sw-h2 netns "$SW" type veth peer name eth0 netns "$H2" || return 1
    ip -n "$SW" link set sw-r master rgb-lan up && ip -n "$SW" link set sw-h1 master rgb-lan up &&
        ip -n "$SW" link set sw-h2 master rgb-lan2 up || return 1
    veth_pair "$R" wan0 203.0.113.1/24 "$P" wan0 203.0.113.2/24
    ip -n "$R" addr add 192.168.77.1/24 dev lan0 && ip -n "$R" link set lan0 up || return 1
    ip -n "$H1" addr add "$LANHOST/24" dev eth0 && ip -n "$H1" link set eth0 up &&
        ip -n "$H1" route add default via 192.168.77.1 || return 1
    ip -n "$H2" addr add "$LANHOST2/24" dev eth0 && ip -n "$H2" link set eth0 up &&
        ip -n "$H2" route add default via 192.168.88.1 || return 1
    inns "$R" sysctl -qw net.ipv4.ip_forward=1 || return 1
    # The ISP router: LAN hosts masqueraded to the WAN, UDP 51820 forwarded to the gateway.
    inns "$R" nft -f - <<EOF || return 1
table ip rgb {
    chain pre { type nat hook prerouting priority dstnat; iifname "wan0" udp dport 51820 dnat to $LEASE:51820; }
    chain post { type nat hook postrouting priority srcnat; oifname "wan0" masquerade; }
}
EOF
}
if setup_net; then ok "network: namespaces, bridges, taps, router with the port forward"; else ko "network setup"; finish; fi

# dnsmasq: DHCP only (--port=0), 2-minute leases (its minimum), a fixed address for eth0.
start_dnsmasq() {
    nspawn "$R" dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --user=root --group=root \
        --interface=lan0 --bind-interfaces --except-interface=lo \
        --dhcp-range=192.168.77.50,192.168.77.99,255.255.255.0,2m \
        --dhcp-host="$MAC0,$LEASE,2m" \
        --dhcp-option=option:router,192.168.77.1 --dhcp-option=option:dns-server,192.168.77.1 \
        --dhcp-leasefile="$work/dnsmasq.leases" --pid-file= --log-dhcp --log-facility="$work/dnsmasq.log"
    dpid=$lastpid
}
start_dnsmasq
sleep 0.5
check "dnsmasq: serving DHCP in the router namespace" kill -0 "$dpid"

# --- boot ----------------------------------------------------------------------------------
case $ARCH in
    x86_64) machine=(-machine q35 -cpu max) mname="q35 + OVMF" ;;
    aarch64) machine=(-machine virt -cpu cortex-a72) mname="virt (cortex-a72) + AAVMF" ;;
esac
# The UEFI variable store: a fresh copy per boot (start_qemu).
fw=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$FIRMWARE_CODE"
    -drive "if=pflash,format=raw,unit=1,file=$work/vars.fd")
echo "== boot: $mname (TCG), NVMe disk, 2 x igb, i6300esb, serial console driven here"
mkfifo "$sin.in" "$sin.out"
# Read-write: opening never blocks and QEMU never sees the writer go away.
exec 9<>"$sin.in"
# QEMU's igb takes one tap queue per netdev queue; the guest sees the 82576's own queues.
# Each igb behind its own PCIe root port, as on a board (on the root bus, a second igb's
# SR-IOV functions collide with the first's).
Q=${RG_BOARD_QUEUES:-2}
qargs=(-accel tcg "${machine[@]}" -smp "${RG_BOARD_SMP:-2}" -m 1024 -nodefaults -display none
    -monitor "unix:$work/monitor.sock,server=on,wait=off" -device i6300esb -no-reboot "${fw[@]}"
    -drive "if=none,id=disk0,format=raw,file=$disk" -device "nvme,drive=disk0,serial=rg0"
    -device pcie-root-port,id=rp0,chassis=1,slot=1 -device pcie-root-port,id=rp1,chassis=2,slot=2
    -netdev "tap,id=n0,ifname=rgbt0,script=no,downscript=no,vhost=off,queues=$Q" -device "igb,netdev=n0,mac=$MAC0,bus=rp0"
    -netdev "tap,id=n1,ifname=rgbt1,script=no,downscript=no,vhost=off,queues=$Q" -device "igb,netdev=n1,mac=$MAC1,bus=rp1"
    -chardev "pipe,id=ser0,path=$sin" -serial chardev:ser0)
want usb && qargs+=("${usb_qargs[@]}")
rpid=""
start_qemu() {
    cp "$FIRMWARE_VARS" "$work/vars.fd"
    rm -f "$work/monitor.sock"
    : >"$log"
    # The serial reader first (QEMU opens the .out FIFO for writing), then QEMU.
    spawn cat "$sin.out" >>"$log"
    rpid=$!
    nspawn "$SW" "$QEMU" "${qargs[@]}" >"$work/qemu.out" 2>&1 </dev/null
    qpid=$lastpid
    con_use "$log" "$qpid" "$transcript"
    t_boot=$SECONDS
}
stop_qemu() {
    stop_pid "$qpid"
    stop_pid "$rpid"
}

have() { con_clean | grep -qaE -- "$1"; }
# hmp LINE: a command on QEMU's human monitor (set_link: the guest sees the carrier go).
hmp() {
    timeout 10 python3 ci/lib/labtool.py hmp "$work/monitor.sock" "$1"
}
# The first line after byte OFFSET matching REGEX.
line_of() { tail -c +$((${2:-0} + 1)) "$log" | tr -d '\r' | grep -aE -m1 -- "$1"; }


# A guest kernel whose second vCPU stops taking timer interrupts under TCG (seen here:
# "rcu: INFO: rcu_preempt detected stalls", "timer wakeup didn't happen" on cpu 1, before
# init runs) is QEMU's, not the image's: the disk is flashed again and booted once more.
stalled() { grep -qaE 'rcu: INFO: .*detected stalls' "$log" && ! grep -qa 'riceguard-init: ' "$log"; }
boot_wait() {
    local left=$((T * 4))
    while [ $left -gt 0 ]; do
        con_clean | grep -qaE 'riceguard-init: (boot marked good|FATAL)' && break
        serial_panicked "$log" || stalled && return 1
        kill -0 "$qpid" 2>/dev/null || return 1
        sleep 0.25
        left=$((left - 1))
    done
    [ $left -gt 0 ] && con_wait 'riceguard(\(edit\))?# ' 30
}
# --- reboots (the restore's fresh box, the power cut, update and rollback) ----------------
boot_logs=()
# boot_again NAME: QEMU (ended) started again on the same disk; the serial log so far kept
# as serial-NAME.log; waits for the prompt. A guest kernel that stalls before init (see
# `stalled`) is started once more: it touched nothing. Host time of the start: $boot_since.
boot_again() {
    cp "$log" "$work/serial-$1.log"
    boot_logs+=("$work/serial-$1.log")
    boot_since=$(date +%s.%N)
    start_qemu
    if ! boot_wait; then
        stalled || return 1
        note "the guest kernel stalled under TCG before init after $1; started once more"
        stop_qemu
        cp "$log" "$work/serial-stalled-after-$1.log"
        start_qemu
        boot_wait || return 1
    fi
    have 'riceguard-init: boot marked good'
}
# console_reboot: the console's `reboot` (confirmed); true when the guest rebooted within
# 60 s (QEMU runs with -no-reboot: it exits). QEMU is stopped either way.
console_reboot() {
    local left=240 rc=0
    cmd reboot 20 'Type yes'
    printf 'yes\r' >&9
    while [ $left -gt 0 ] && kill -0 "$qpid" 2>/dev/null; do sleep 0.25; left=$((left - 1)); done
    kill -0 "$qpid" 2>/dev/null && rc=1
    stop_qemu
    return $rc
}

# The boot probe: from lanhost, on the uplink segment, closed ports of the address the
# gateway will lease (TCP and UDP 9: nothing listens there), from before QEMU starts.
if want probe; then
    probe=$work/boot-probe.status
    nspawn "$H1" python3 ci/lib/labtool.py boot-probe "$LEASE" 9 9 $((2 * T + 120)) "$probe"
    probe_pid=$lastpid
fi
start_qemu
if ! boot_wait && stalled; then
    note "boot 1: the guest kernel stalled under TCG before init ($(grep -aom1 'rcu: .*stall.*' "$log")); serial log kept as serial-stalled.log, disk flashed again, booting once more"
    stop_qemu
    cp "$log" "$work/serial-stalled.log"
    flash || { ko "flash: flash-scripts/flash failed the second time"; finish; }
    start_qemu
    boot_wait
fi
if con_clean | grep -qaE 'riceguard-init: boot marked good' && con_clean | grep -qaE 'riceguard(\(edit\))?# '; then
    ok "boot: console prompt, boot marked good ($((SECONDS - t_boot)) s after QEMU start)"
else
    serial_panicked "$log" && ko "boot: kernel panic/oops on the serial line"
    stalled && ko "boot: the guest kernel stalled (RCU) before init, twice"
    kill -0 "$qpid" 2>/dev/null || ko "boot: QEMU exited"
    ko "boot: no console prompt within $T s"
    echo "---- last serial lines"; con_clean | tail -30
    [ -s "$work/qemu.out" ] && sed 's/^/qemu: /' "$work/qemu.out"
    finish
fi
check "boot: slot a from the NVMe disk (root /dev/nvme0n1p2)" have 'slot a booted .*root /dev/nvme0n1p2'
check "boot: perm mounted from NVMe" have 'perm mounted \(/dev/nvme0n1p4'
check "boot: the watchdog opened (no 'running without')" sh -c '! grep -qa "watchdog.*running without" "$1"' _ "$log"
check "boot: igb uplink eth0 came up" have 'uplink eth0 up'
# What the igb driver offers, and what the gateway chose.
if have 'uplink eth0 tx-udp-segmentation: '; then
    ok "boot: the igb driver's UDP segmentation offer on the serial line"
    note "igb offers: $(con_clean | grep -aoE 'uplink eth0 tx-udp-segmentation: .*' | head -1)"
else
    ko "boot: the igb driver's offloads are not shown on the serial line"
fi
if have 'uplink eth0 offers: .*tx-tcp-segmentation'; then
    ok "boot: the igb driver's offload list on the serial line"
    note "$(con_clean | grep -aoE 'uplink eth0 offers: .*' | head -1)"
else
    ko "boot: no offload list for eth0 (init's 'uplink eth0 offers:')"
fi
if have 'gateway: .*offload: '; then
    ok "boot: the gateway's offload decision on the serial line"
    note "gateway chose: $(con_clean | grep -aoE 'offload: .*' | head -1)"
else
    ko "boot: no offload decision from the gateway"
fi
# The decision must be about the igb uplink (`offload: eth0: tx-udp-segmentation ... ->`),
# not made before the gateway knew its egress NIC (`offload: egress: NIC features unknown`,
# what a decision taken before the DHCP lease's default route says).
check "boot: the gateway's offload decision is about the igb uplink eth0" have 'gateway: .*offload: eth0: '
note "igb rx queues: $(con_clean | grep -aoE 'rps: [0-9]+ eth0 rx queues' | head -1 | grep -oE '[0-9]+ eth0') ; $(con_clean | grep -aoE 'xps: [0-9]+ of [0-9]+ eth0 tx queues' | head -1)"
# The data-plane setup init and the gateway do on every board (DATAPLANE_CORES, HUGEPAGES):
# hugepages for the buffer pools, RPS and XPS on the uplink's queues, workers pinned.
check "boot: hugepages reserved for the buffer pools ($(con_clean | grep -aoE -m1 'hugepages: [0-9]+ of [0-9]+ reserved'))" \
    have 'riceguard-init: hugepages: [1-9][0-9]* of [0-9]+ reserved'
check "boot: RPS: eth0's rx queues pointed at the data-plane cores ($(con_clean | grep -aoE -m1 'rps: [0-9]+ eth0 rx queues -> cpus [^ ]+'))" \
    have 'riceguard-init: rps: [1-9][0-9]* eth0 rx queues -> cpus \[[0-9]'
check "boot: XPS: one data-plane core per eth0 tx queue ($(con_clean | grep -aoE -m1 'xps: [0-9]+ of [0-9]+ eth0 tx queues'))" \
    have 'riceguard-init: xps: [1-9][0-9]* of [0-9]+ eth0 tx queues'
check "boot: the gateway's workers pinned to cores ($(con_clean | grep -aoE -m1 '[0-9]+ worker\(s\) on cores \[[0-9, ]*\]'))" \
    have 'gateway: .* [0-9]+ worker\(s\) on cores \[[0-9]'

# --- DHCP ----------------------------------------------------------------------------------
echo "== DHCP: a lease from dnsmasq"
if con_wait 'dhcp eth0: bound ' 90; then
    bound=$(line_of 'dhcp eth0: bound ')
    ok "dhcp: bound ($bound)"
    t_bound=$SECONDS
    check "dhcp: the fixed lease $LEASE/24 with router and DNS from dnsmasq" \
        sh -c 'printf "%s" "$1" | grep -qE "bound $2/24 router 192\.168\.77\.1 dns 192\.168\.77\.1 lease 120s"' _ "$bound" "$LEASE"
else
    ko "dhcp: no 'dhcp eth0: bound' within 90 s"
fi
check "dhcp: the router pings the gateway's lease address" inns "$R" ping -c2 -W2 -i0.3 "$LEASE"
cmd "show status"
# (the lease line of `riceguard status`: "uplink eth0: DHCP 192.168.77.60/24 router ...")
check "dhcp: \`show status\` names the lease (uplink eth0: DHCP $LEASE/24)" has "eth0: DHCP ${LEASE//./\\.}/24"

drops() { answer | grep -aoE "^firewall drops: .*" | grep -oE "$1 [0-9]+" | cut -d' ' -f2; }
# --- the boot probe's verdict --------------------------------------------------------------
# It ran from before QEMU started, through boot, the DHCP lease and the daemon's start; 10 s
# more after the lease so the address has been up a while.
if want probe; then
    [ -n "${t_bound:-}" ] && while [ $((SECONDS - t_bound)) -lt 10 ]; do sleep 1; done
    stop_pid "$probe_pid"
    pv() { awk -v k="$1" '{for (i = 1; i < NF; i += 2) if ($i == k) print $(i + 1)}' "$probe" 2>/dev/null; }
    note "boot probe: $(cat "$probe" 2>/dev/null)"
    check "boot probe: the lease address came up while probed (it answered lanhost's ARP)" \
        sh -c '[ "$1" != - ] && [ -n "$1" ] && [ "$2" -ge 100 ]' _ "$(pv up_at)" "$(pv after_up)"
    check "boot probe: no closed-port probe answered with a RST, from before boot to after the daemon was up" test "$(pv rst)" = 0
    check "boot probe: no closed-port probe answered with an ICMP port unreachable" test "$(pv unreach)" = 0
    check "boot probe: nothing else answered either (no open port, no UDP reply)" \
        sh -c '[ "$1" = 0 ] && [ "$2" = 0 ]' _ "$(pv open)" "$(pv reply)"
    # Dropped by our ruleset, not lost on the way: init installed it before the uplink came up,
    # and its uplink-in counter counted the probes.
    first_line() { con_clean | grep -naE -m1 -- "$1" | cut -d: -f1; }
    fw_at=$(first_line 'riceguard-init: firewall: table inet riceguard in place') up_at=$(first_line 'riceguard-init: uplink eth0 up')
    check "boot probe: init put table inet riceguard in place before the uplink came up (serial lines ${fw_at:-none} < ${up_at:-none})" \
        sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$1" -lt "$2" ]' _ "$fw_at" "$up_at"
    cmd "show status"
    printf '%s\n' "$out" | grep -aE '^(firewall|nat)' | sed 's/^/     show status: /'
    check "firewall: \`show status\` says it is on, table inet riceguard" has '^firewall: on \(table inet riceguard[;)]'
    n=$(drops uplink-in)
    check "boot probe: the firewall's uplink-in drop counter counted the probes (${n:-no counter})" test "${n:-0}" -gt 0
fi

# --- one-armed -----------------------------------------------------------------------------
# The wg-quick config printed between the markers, as a file.
client_conf() { # NAME FILE: from $out
    printf '%s\n' "$out" | awk -v b="----- BEGIN WIREGUARD CONFIG $1 -----" -v e="----- END WIREGUARD CONFIG $1 -----" '
        $0 == b { on = 1; next } $0 == e { on = 0; found = 1; exit } on { print }
        END { exit !found }' | grep -avE '^(gateway|riceguard-init|dhcp)[ :]|^\[ *[0-9]+\.[0-9]+\]' >"$2" &&
        chmod 600 "$2" && [ -s "$2" ]
}
# phone_up CONF: stock wireguard-go in the phone namespace, set up as wg-quick does it:
# `wg setconf` with the wg-quick-only keys stripped (by `wg-quick strip` itself), the
# Address lines, MTU (the config's, or the route's minus 80), up, then a route per allowed
# IP (most specific first; a /0 through the fwmark table and suppress_prefixlength rule).
phone_pid=""
phone_up() {
    local conf=$1 f=$work/$WGIF.conf a mtu dev ip table
    install -m 0600 "$conf" "$f"
    wg-quick strip "$f" >"$work/$WGIF.stripped" || return 1
    nspawn "$P" wireguard-go -f "$WGIF" >"$work/wireguard-go.log" 2>&1
    phone_pid=$lastpid
    wait_for 5 eval '[ -S "/var/run/wireguard/$WGIF.sock" ]'
    inns "$P" wg setconf "$WGIF" "$work/$WGIF.stripped" || return 1
    for a in $(awk -F= 'tolower($1) ~ /^ *address *$/ {gsub(/[ \t]/, "", $2); gsub(/,/, " ", $2); print $2}' "$f"); do
        case $a in *:*) inns "$P" ip -6 address add "$a" dev "$WGIF" ;; *) inns "$P" ip -4 address add "$a" dev "$WGIF" ;; esac || return 1
    done
    mtu=$(awk -F= 'tolower($1) ~ /^ *mtu *$/ {gsub(/[ \t]/, "", $2); print $2}' "$f")
    if [ -z "$mtu" ]; then
        dev=$(inns "$P" ip route get 203.0.113.1 | grep -oE 'dev [^ ]+' | cut -d' ' -f2)
        mtu=$(( $(inns "$P" cat "/sys/class/net/$dev/mtu") - 80 ))
    fi
    inns "$P" ip link set mtu "$mtu" up dev "$WGIF" || return 1
    for ip in $(inns "$P" wg show "$WGIF" allowed-ips | awk '{for (i = 2; i <= NF; i++) print $i}' | sort -nr -k 2 -t /); do
        case $ip in
            */0)
                table=51820
                inns "$P" wg set "$WGIF" fwmark $table
                case $ip in *:*) v=-6 ;; *) v=-4 ;; esac
                inns "$P" ip $v rule add not fwmark $table table $table
                inns "$P" ip $v rule add table main suppress_prefixlength 0
                inns "$P" ip $v route add "$ip" dev "$WGIF" table $table
                inns "$P" sysctl -qw net.ipv4.conf.all.src_valid_mark=1 ;;
            *:*) [ -n "$(inns "$P" ip -6 route show dev "$WGIF" match "$ip")" ] || inns "$P" ip -6 route add "$ip" dev "$WGIF" ;;
            *) [ -n "$(inns "$P" ip -4 route show dev "$WGIF" match "$ip")" ] || inns "$P" ip -4 route add "$ip" dev "$WGIF" ;;
        esac
    done
}
phone_down() {
    [ -n "$phone_pid" ] && stop_pid "$phone_pid"
    phone_pid=""
    inns "$P" ip -4 rule del table main suppress_prefixlength 0 2>/dev/null
    inns "$P" ip -4 rule del not fwmark 51820 table 51820 2>/dev/null
    rm -f "/var/run/wireguard/$WGIF.sock"
}
# tcp_echo NS_SERVER ADDR NS_CLIENT: a one-shot server (bounded: 30 s) that sends back what
# it got, reversed; the client sends 30 kB through it and must read them back.
tcp_echo() {
    local srv=$1 addr=$2 cli=$3 spid got
    nspawn "$srv" timeout 30 python3 ci/lib/labtool.py tcp-reverse-once 0.0.0.0 7777
    spid=$lastpid
    sleep 0.5
    got=$(inns "$cli" timeout 20 python3 ci/lib/labtool.py tcp-reverse-check "$addr" 7777 2>&1)
    stop_pid "$spid"
    [ "$got" = ok ]
}
# wait_ping NS ADDR SECONDS: pings until one answers (the handshake comes first).
wait_ping() {
    local end=$((SECONDS + $3))
    while [ $SECONDS -lt $end ]; do
        inns "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

if want one-armed; then
    echo "== one-armed: the README's first client, the factory configuration (flash-scripts/README.md)"
    # "the default configuration already has a key, ListenPort = 51820 and the tunnel subnet
    # Address = 10.100.0.1/24": read, not changed.
    cmd "show"
    answer | grep -aE '^(Address|ListenPort) ' | sed 's/^/     factory: /'
    check "one-armed: factory configuration: Address = 10.100.0.1/24" has '^Address = 10\.100\.0\.1/24( |$)'
    check "one-armed: factory configuration: ListenPort = 51820" has '^ListenPort = 51820( |$)'
    # The LAN host and the router have no route to the tunnel subnet: only NAT brings replies back.
    check "one-armed: lanhost routes 10.100.0.2 to its default router, not to the gateway" \
        sh -c 'ip -n "$1" route get 10.100.0.2 | grep -q "via 192\.168\.77\.1 "' _ "$H1"
    check "one-armed: the router has no route to 10.100.0.0/24" sh -c '! ip -n "$1" route get 10.100.0.2 >/dev/null 2>&1' _ "$R"
    # 1. the box sits behind a router: the public address and the forwarded UDP port
    cmd "set gateway public-endpoint 203.0.113.1:51820"
    check "one-armed: \`set gateway public-endpoint 203.0.113.1:51820\` accepted" sh -c '! printf "%s\n" "$1" | grep -qaE "^error"' _ "$(answer)"
    # 2. add client phone
    cmd "add client phone" 60
    add_out=$out
    if client_conf phone "$work/phone.conf"; then
        ok "add client phone: wg-quick config printed between the BEGIN/END lines"
        sed 's/^PrivateKey = .*/PrivateKey = (hidden)/; s/^/     phone.conf: /' "$work/phone.conf"
    else
        ko "add client phone: no config between '----- BEGIN WIREGUARD CONFIG phone -----' and END"
        bad_answer
    fi
    echo "---- console transcript: add client phone (test keys, thrown away with the disk)"
    printf '%s\n' "$add_out" | grep -avE '^(gateway|riceguard-init|dhcp)[ :]|^\[ *[0-9]+\.[0-9]+\]'
    echo "----"
    check "add client phone: 'client phone added to the candidate: address 10.100.0.2/32' (the README's line)" \
        sh -c 'printf "%s\n" "$1" | grep -qaF "client phone added to the candidate: address 10.100.0.2/32"' _ "$add_out"
    check "add client phone: a QR code (Unicode blocks) follows the config" \
        sh -c 'printf "%s\n" "$1" | sed -n "/END WIREGUARD CONFIG phone/,\$p" | grep -qa "█\|▀\|▄"' _ "$add_out"
    check "add client phone: Address = 10.100.0.2/32" grep -qxE 'Address *= *10\.100\.0\.2/32' "$work/phone.conf"
    check "add client phone: AllowedIPs = the tunnel and the uplink's subnet (10.100.0.0/24, 192.168.77.0/24)" \
        grep -qxE 'AllowedIPs *= *10\.100\.0\.0/24, *192\.168\.77\.0/24' "$work/phone.conf"
    check "add client phone: Endpoint is the public endpoint 203.0.113.1:51820" grep -qxE 'Endpoint *= *203\.0\.113\.1:51820' "$work/phone.conf"
    check "add client phone: PersistentKeepalive = 25" grep -qxE 'PersistentKeepalive *= *25' "$work/phone.conf"
    # 3. commit
    cmd commit 60
    check "one-armed: commit: 'committed and saved to /perm/riceguard.conf'" has 'committed and saved to /perm/riceguard\.conf'
    check "one-armed: commit: 'the gateway applied it (reload generation N)'" has 'the gateway applied it \(reload generation [0-9]+\)'
    phone_addr=$(awk -F= 'tolower($1) ~ /^ *address *$/ {gsub(/[ \t]/, "", $2); split($2, a, ","); print a[1]; exit}' "$work/phone.conf" 2>/dev/null)
    # tcp_peer NS_SERVER ADDR NS_CLIENT: as tcp_echo; the server's view of the client's address
    # in $peer_seen.
    tcp_peer() {
        local srv=$1 addr=$2 cli=$3 spid got
        peer_seen=""
        nspawn "$srv" timeout 30 python3 ci/lib/labtool.py tcp-peer-once 0.0.0.0 7777 >"$work/tcp-peer.out" 2>&1
        spid=$lastpid
        sleep 0.5
        got=$(inns "$cli" timeout 20 python3 ci/lib/labtool.py tcp-reverse-check "$addr" 7777 2>&1)
        for _ in $(seq 20); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
        stop_pid "$spid"
        peer_seen=$(head -1 "$work/tcp-peer.out")
        [ "$got" = ok ]
    }
    if [ -s "$work/phone.conf" ] && phone_up "$work/phone.conf"; then
        ok "phone: wireguard-go up with the printed config ($WGIF, Address $phone_addr)"
        check "one-armed: phone pings the gateway's tunnel address 10.100.0.1" wait_ping "$P" 10.100.0.1 30
        check "one-armed: phone pings lanhost $LANHOST (no route back to the tunnel on lanhost or the router)" \
            wait_ping "$P" "$LANHOST" 30
        check "one-armed: phone opens a TCP connection to lanhost (echo)" tcp_peer "$H1" "$LANHOST" "$P"
        check "one-armed: lanhost saw the gateway's uplink address $LEASE as the source (masquerade), not ${phone_addr%%/*} (seen: ${peer_seen:-nothing})" \
            test "$peer_seen" = "$LEASE"
        inns "$P" wg show "$WGIF" | sed 's/^/     phone: /' | grep -E 'handshake|transfer|endpoint'
    else
        ko "phone: could not bring up wireguard-go with the printed config"
    fi
    phone_down
fi

# --- SSH: the console from the LAN host -------------------------------------------------
# (issue 31) A key set on the serial console; lanhost, on the uplink segment (the LAN of a
# one-armed box), logs in with Debian's OpenSSH client as admin@LEASE, the host key checked
# against the fingerprint the serial console printed (ssh-keyscan's key in a known_hosts
# whose `ssh-keygen -lf` fingerprint must be the serial one; then StrictHostKeyChecking=yes).
SSHD=$work/ssh KH=$work/ssh/known_hosts SSHKEY=$work/ssh/admin
EXPORT_PASS='board lab export passphrase'
ssh_fp="" gw_pub=""
# bssh ARGS...: OpenSSH from lanhost to the gateway's lease, key login, the saved known_hosts
# checked strictly; 90 s at most (TCG).
bssh() {
    timeout 90 ip netns exec "$H1" ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
        -o UserKnownHostsFile="$KH" -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes \
        -o ConnectTimeout=20 -i "$SSHKEY" "admin@$LEASE" "$@"
}
# keyscan FILE: the gateway's ED25519 host key as ssh-keyscan sees it from lanhost.
keyscan() { inns "$H1" ssh-keyscan -T 10 -t ed25519 "$LEASE" 2>/dev/null >"$1" && [ -s "$1" ]; }
fp_of() { ssh-keygen -lf "$1" 2>/dev/null | awk '{print $2}'; }
# The host key fingerprint in `show status`'s ssh line (after `cmd "show status"`).
status_ssh_fp() { answer | grep -aE '^ssh: ' | grep -aoE 'host key SHA256:[A-Za-z0-9+/]+' | cut -d' ' -f3; }
# gw_pubkey: the console's `pubkey` (the running gateway's public key).
gw_pubkey() { cmd pubkey >/dev/null && answer | grep -aoE -m1 '[A-Za-z0-9+/]{43}=' | head -1; }
# ssh_same LABEL: after a reboot or a restore, the SSH host key is the one saved at the ssh
# phase: this boot's serial line, `show status`, ssh-keyscan from lanhost; and a key login
# with the old known_hosts (StrictHostKeyChecking=yes) works.
ssh_same() {
    local f=$SSHD/keyscan-$1 got
    [ -n "$ssh_fp" ] || { skip "$1: SSH host key (the ssh phase did not run)"; return; }
    check "$1: riceguard ssh said the same host key on the serial line (ssh: host key $ssh_fp)" \
        con_wait "ssh: host key ${ssh_fp//+/\\+} \(ED25519\)" 30
    cmd "show status"
    check "$1: \`show status\`: ssh listening, host key $ssh_fp ($(answer | grep -aE '^ssh: ' | head -1))" \
        sh -c '[ "$1" = "$2" ] && printf "%s\n" "$3" | grep -qaE "^ssh: port 22 \(listening\)"' _ "$(status_ssh_fp)" "$ssh_fp" "$(answer)"
    wait_for 30 keyscan "$f"
    check "$1: ssh-keyscan from lanhost: the same host key ($(fp_of "$f"))" test "$(fp_of "$f")" = "$ssh_fp"
    got=$(bssh 'show status' 2>&1)
    check "$1: a key login from lanhost with the old known_hosts (StrictHostKeyChecking=yes) runs \`show status\`" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^ssh: port 22 "' _ "$got"
}
ssh_phase() {
    local pub got rc t0=$SECONDS
    echo "== ssh: a key on the serial console, the console over SSH from lanhost"
    mkdir -p "$SSHD"
    ssh-keygen -q -t ed25519 -N '' -C lab@board -f "$SSHKEY" || { ko "ssh: ssh-keygen"; return 1; }
    pub=$(cat "$SSHKEY.pub")
    # The gateway's public key, as the phone's config has it (for the restore).
    gw_pub=$(gw_pubkey)
    [ -s "$work/phone.conf" ] &&
        check "ssh: \`pubkey\`: the gateway's public key $gw_pub is the one in phone.conf's [Peer]" \
            sh -c '[ -n "$1" ] && grep -qxF "PublicKey = $1" "$2"' _ "$gw_pub" "$work/phone.conf"
    cmd "show status"
    check "ssh: \`show status\` before a key: 'ssh: off'" has '^ssh: off '
    cmd "set system ssh-key lab $pub"
    check "ssh: serial \`set system ssh-key lab ssh-ed25519 AAAA... lab@board\`: 'SSH key lab added'" has '^SSH key lab added: SHA256:'
    cmd commit 60
    check "ssh: commit: 'committed and saved'" has 'committed and saved'
    if wait_for 40 keyscan "$KH"; then
        ok "ssh: the gateway answers on port 22 from lanhost (ssh-keyscan)"
    else
        ko "ssh: nothing answers on $LEASE:22 from lanhost within 40 s of the commit"
        return 1
    fi
    cmd "show status"
    ssh_fp=$(status_ssh_fp)
    answer | grep -aE '^ssh: ' | sed 's/^/     show status: /'
    check "ssh: \`show status\`: 'ssh: port 22 (listening), keys lab; host key SHA256:...'" has '^ssh: port 22 \(listening\), keys lab; host key SHA256:'
    # The serial line riceguard ssh printed when it started (at boot: it makes the host key).
    check "ssh: the serial line's 'ssh: host key $ssh_fp (ED25519)' is the one \`show status\` names" \
        sh -c '[ -n "$1" ] && tr -d "\r" <"$2" | grep -qaF "ssh: host key $1 (ED25519)"' _ "$ssh_fp" "$log"
    check "ssh: ssh-keygen -lf of ssh-keyscan's key is the serial console's fingerprint ($(fp_of "$KH"))" \
        sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$ssh_fp" "$(fp_of "$KH")"
    got=$(bssh 'show status' 2>&1)
    rc=$?
    check "ssh: lanhost logs in (ssh admin@$LEASE 'show status', StrictHostKeyChecking=yes): rc $rc, console ssh-N:lab" \
        sh -c '[ "$1" = 0 ] && printf "%s\n" "$2" | grep -qaE "^console: ssh-[0-9]+:lab"' _ "$rc" "$got"
    # A client added over SSH, from a script on stdin; its config on stock wireguard-go.
    printf 'add client laptop\ncommit\n' | bssh -T >"$SSHD/add-laptop.out" 2>&1
    rc=$?
    out=$(cat "$SSHD/add-laptop.out")
    if [ "$rc" = 0 ] && client_conf laptop "$work/laptop.conf"; then
        ok "ssh: \`add client laptop\` + \`commit\` over SSH (a script on stdin): exit 0, wg-quick config printed"
    else
        ko "ssh: add client laptop over SSH: rc $rc: $(head -c 400 "$SSHD/add-laptop.out")"
    fi
    check "ssh: the SSH session's commit was saved" grep -qa 'committed and saved' "$SSHD/add-laptop.out"
    if [ -s "$work/laptop.conf" ] && phone_up "$work/laptop.conf"; then
        check "ssh: laptop's config (from SSH) on wireguard-go in the phone namespace pings lanhost $LANHOST" wait_ping "$P" "$LANHOST" 40
        check "ssh: laptop's tunnel opens a TCP connection to lanhost (echo)" tcp_echo "$H1" "$LANHOST" "$P"
    else
        ko "ssh: could not bring up wireguard-go with laptop's config"
    fi
    phone_down
    # A backup over SSH (the passphrase twice from the script): what scrypt cost the console.
    printf 'export configuration\n%s\n%s\n' "$EXPORT_PASS" "$EXPORT_PASS" | bssh -T >"$SSHD/export.out" 2>&1
    rc=$?
    sed -n '/^-----BEGIN AGE ENCRYPTED FILE-----$/,/^-----END AGE ENCRYPTED FILE-----$/p' "$SSHD/export.out" | tr -d '\r' >"$SSHD/backup.age"
    if [ "$rc" = 0 ] && [ -s "$SSHD/backup.age" ]; then
        ok "ssh: \`export configuration\` over SSH: an age text ($(wc -l <"$SSHD/backup.age") lines); $(grep -aoE '^exported: [^;]*' "$SSHD/export.out")"
    else
        ko "ssh: export over SSH: rc $rc: $(head -c 400 "$SSHD/export.out")"
    fi
    check "ssh: the export holds the SSH host key" grep -qaE '^exported: .*the SSH host key' "$SSHD/export.out"
    local kd peak
    kd=$(grep -aoE 'key derivation: scrypt .*' "$SSHD/export.out" | tr -d '\r')
    peak=$(printf '%s\n' "$kd" | sed -n 's/.*peak memory: \([0-9]*\) MiB.*/\1/p')
    note "$board: export over SSH: '$kd'"
    check "ssh: the export's console peak memory ${peak:-?} MiB >= scrypt's 64 MiB ('$kd')" \
        sh -c '[ -n "$1" ] && [ "$1" -ge 64 ]' _ "$peak"
    note "ssh phase: $((SECONDS - t0)) s"
}
if want ssh; then ssh_phase; else skip "ssh (RG_BOARD_PHASES: $phases)"; fi

# --- restore: export, a freshly flashed box, import -------------------------------------
# The ssh phase's export (over SSH) opened by Debian's age -d; refused imports (wrong
# passphrase, one byte flipped) change nothing; then QEMU stopped, the disk flashed afresh
# (a new box: new gateway key, new host key), the export imported on its serial console
# (pasted, then the passphrase), compare, commit: the same gateway key (the phone's
# wireguard-go, running all along and not touched, handshakes again), the same SSH host key
# (the old known_hosts, StrictHostKeyChecking=yes) and the SSH key login back.
# paste_line LINE: typed on the serial console, waiting for its echo.
echoed() { tail -c +$(($1 + 1)) "$log" | tr -d '\r' | grep -aF -- "$2" >/dev/null; }
paste_line() { local off; off=$(con_size); printf '%s\r' "$1" >&9; wait_for 10 echoed "$off" "$1"; }
# import_over_ssh FILE PASSPHRASE OUT: `import configuration`, the text, the passphrase and
# `compare` from a script on stdin.
import_over_ssh() {
    { echo 'import configuration'; cat "$1"; printf '%s\ncompare\n' "$2"; } | bssh -T >"$3" 2>&1
}
restore_phase() {
    local t0=$SECONDS txt=$SSHD/backup.txt phone_pub line off rc l n
    echo "== restore: export opened by age -d, refused imports, a freshly flashed box, import on its serial console"
    [ -s "$SSHD/backup.age" ] && [ -n "$ssh_fp" ] || { ko "restore: no export from the ssh phase: phase skipped"; return 1; }
    [ -s "$work/phone.conf" ] || { ko "restore: no phone config (one-armed did not run): phase skipped"; return 1; }
    AGE_TTY_PASSPHRASE=$EXPORT_PASS timeout 60 python3 gateway/core/tests/fixtures/age/age_tty.py \
        age -d -o "$txt" "$SSHD/backup.age" >"$SSHD/age.out" 2>&1
    phone_pub=$(awk -F' = ' '$1 == "PrivateKey" {print $2}' "$work/phone.conf" | wg pubkey)
    check "restore: Debian's age -d opens the export with the passphrase (riceguard-export 1)" grep -qax 'riceguard-export 1' "$txt"
    check "restore: its plaintext holds the gateway's configuration (Address = 10.100.0.1/24, PublicEndpoint 203.0.113.1:51820)" \
        sh -c 'grep -qaE "^Address = 10\.100\.0\.1/24" "$1" && grep -qaF "203.0.113.1:51820" "$1"' _ "$txt"
    check "restore: its plaintext names the phone client (its public key, the name phone)" \
        sh -c 'grep -qaF -- "$2" "$1" && grep -qawF phone "$1"' _ "$txt" "$phone_pub"
    check "restore: its plaintext holds the SSH key lab and the host key" \
        sh -c 'grep -qaE "SshKey = lab ssh-ed25519 " "$1" && grep -qaE "^host-key ed25519 " "$1"' _ "$txt"
    rm -f "$txt"
    # Refused imports (over SSH, on the old box): the candidate stays as it was.
    import_over_ssh "$SSHD/backup.age" 'not the right passphrase' "$SSHD/import-wrong.out"
    rc=$?
    line=$(grep -aE -m1 'not imported' "$SSHD/import-wrong.out")
    check "restore: a wrong passphrase is refused: '$line' (exit $rc)" \
        sh -c '[ "$1" != 0 ] && printf "%s\n" "$2" | grep -qaE "^error: not imported: wrong passphrase.*; nothing changed$"' _ "$rc" "$line"
    check "restore: after it \`compare\`: 'no changes: the candidate equals the running configuration'" \
        grep -qaF 'no changes: the candidate equals the running configuration' "$SSHD/import-wrong.out"
    # One byte flipped in the middle of the payload's base64 (the second body line from the end).
    n=$(($(wc -l <"$SSHD/backup.age") - 2))
    awk -v n="$n" 'NR == n { c = substr($0, 30, 1); $0 = substr($0, 1, 29) (c == "A" ? "B" : "A") substr($0, 31) } { print }' \
        "$SSHD/backup.age" >"$SSHD/flipped.age"
    check "restore: the flipped copy differs from the export in one byte" \
        sh -c '[ "$(cmp -l "$1" "$2" | wc -l)" = 1 ]' _ "$SSHD/backup.age" "$SSHD/flipped.age"
    import_over_ssh "$SSHD/flipped.age" "$EXPORT_PASS" "$SSHD/import-flipped.out"
    rc=$?
    line=$(grep -aE -m1 'not imported' "$SSHD/import-flipped.out")
    check "restore: a text with one byte flipped is refused: '$line' (exit $rc)" \
        sh -c '[ "$1" != 0 ] && printf "%s\n" "$2" | grep -qaE "^error: not imported: .*(altered|cut|not canonical).*; nothing changed$"' _ "$rc" "$line"
    check "restore: after it \`compare\`: no changes" grep -qaF 'no changes: the candidate equals the running configuration' "$SSHD/import-flipped.out"
    # The phone, up before the box goes and left alone until the end of the phase.
    if phone_up "$work/phone.conf" && wait_ping "$P" "$LANHOST" 40; then
        ok "restore: the phone's wireguard-go (phone.conf) reaches lanhost before the old box goes"
    else
        ko "restore: the phone does not reach lanhost before the restore"
    fi
    # A new box: QEMU stopped, the disk flashed afresh from the same image.
    stop_qemu
    if flash; then ok "restore: a fresh disk flashed from the same image (flash-scripts/flash)"; else ko "restore: flash failed"; return 1; fi
    if boot_again old-box; then
        ok "restore: the fresh box boots, marked good ($((SECONDS - t_boot)) s after QEMU start)"
    else
        ko "restore: the fresh box: no prompt within $T s"
        con_clean | tail -20
        return 1
    fi
    line=$(con_clean | grep -aoE -m1 'ssh: host key SHA256:[^ ]+ \(ED25519\), made now')
    check "restore: the fresh box made its own SSH host key ('${line:-none}')" sh -c '[ -n "$1" ] && ! printf "%s" "$1" | grep -qF -- "$2"' _ "$line" "$ssh_fp"
    check "restore: a DHCP lease on the fresh box" con_wait 'dhcp eth0: bound ' 90
    l=$(gw_pubkey)
    check "restore: the fresh box has a gateway key of its own ($l)" sh -c '[ -n "$1" ] && [ "$1" != "$2" ]' _ "$l" "$gw_pub"
    cmd "show status"
    check "restore: the fresh box: 'ssh: off' (no key)" has '^ssh: off '
    # The import, pasted on the serial console.
    cmd "import configuration" 30 'paste the export'
    check "restore: serial \`import configuration\` asks for the text" has 'paste the export'
    n=0 off=$(con_size)
    while IFS= read -r l; do paste_line "$l" && n=$((n + 1)); done <"$SSHD/backup.age"
    check "restore: $n of $(wc -l <"$SSHD/backup.age") armoured lines pasted (each echoed)" test "$n" = "$(wc -l <"$SSHD/backup.age")"
    check "restore: then it asks 'Passphrase of the export: '" con_wait 'Passphrase of the export: ' 20 "$off"
    cmd "$EXPORT_PASS" 180
    line=$(answer | grep -aE -m1 'imported an export|not imported')
    check "restore: the passphrase: '${line:0:160}...'" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^imported an export of riceguard .*the SSH host key"' _ "$line"
    cmd compare
    answer | grep -aE '^[-+]' | grep -avE 'PrivateKey|PresharedKey' | head -8 | sed 's/^/     compare: /'
    check "restore: \`compare\` shows the change (the SSH key lab added)" has '^\+.*SshKey = lab ssh-ed25519 '
    cmd commit 60
    check "restore: commit: 'committed and saved'" has 'committed and saved'
    check "restore: commit: the imported SSH host key installed ($ssh_fp)" said "SSH host key: the imported one, ${ssh_fp//+/\\+}"
    t_restored=$(date +%s)
    l=$(gw_pubkey)
    check "restore: \`pubkey\`: the gateway's public key is the old box's ($l)" sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$l" "$gw_pub"
    # The phone: the same wireguard-go process, its config untouched since before the flash.
    check "restore: the phone's wireguard-go ran all along (pid $phone_pid)" kill -0 "$phone_pid"
    check "restore: the untouched phone reaches lanhost through the restored box (ping)" wait_ping "$P" "$LANHOST" 90
    l=$(inns "$P" wg show "$WGIF" latest-handshakes | awk '{print $2}')
    check "restore: the phone's latest handshake is after the import's commit ($l >= $t_restored)" test "${l:-0}" -ge "$t_restored"
    phone_down
    ssh_same "restore"
    note "restore phase (age -d, refused imports, fresh flash and boot, import, checks): $((SECONDS - t0)) s"
}
if want restore; then restore_phase; else skip "restore (RG_BOARD_PHASES: $phases)"; fi
if want usb; then usb_phase; fi

# --- two-armed -----------------------------------------------------------------------------
if want two-armed; then
    echo "== two-armed: routed between eth1 (192.168.88.1/24) and the tunnel"
    cmd "set gateway lan eth1"
    check "two-armed: \`set gateway lan eth1\` accepted" sh -c '! printf "%s\n" "$1" | grep -qaE "^error"' _ "$(answer)"
    cmd "set gateway lan-address 192.168.88.1/24"
    check "two-armed: \`set gateway lan-address 192.168.88.1/24\` accepted" sh -c '! printf "%s\n" "$1" | grep -qaE "^error"' _ "$(answer)"
    cmd "add client phone2" 60
    if client_conf phone2 "$work/phone2.conf"; then
        ok "add client phone2: config printed"
        sed 's/^PrivateKey = .*/PrivateKey = (hidden)/; s/^/     phone2.conf: /' "$work/phone2.conf"
    else
        ko "add client phone2: no config between the markers"
        bad_answer
    fi
    cmd commit 60
    check "two-armed: commit applied" has 'committed and saved'
    check "two-armed: lanhost2 pings the gateway's LAN port 192.168.88.1" wait_ping "$H2" 192.168.88.1 15
    if [ -s "$work/phone2.conf" ] && phone_up "$work/phone2.conf"; then
        ok "phone: wireguard-go up with phone2's printed config"
        check "two-armed: phone pings lanhost2 $LANHOST2" wait_ping "$P" "$LANHOST2" 30
        check "two-armed: phone opens a TCP connection to lanhost2 (echo)" tcp_echo "$H2" "$LANHOST2" "$P"
    else
        ko "phone: could not bring up wireguard-go with phone2's config"
    fi
    phone_down

    echo "== two-armed: from the uplink segment, the LAN behind eth1 is closed"
    # lanhost sits on the uplink segment; given a route to the LAN via the gateway's uplink
    # address, it tries lanhost2, which listens and counts in its own namespace every packet
    # that arrives from lanhost: dropped means none arrives (not merely unanswered).
    inns "$H2" nft -f - <<EOF
table inet rgbcount {
    counter from_uplink {}
    chain pre { type filter hook prerouting priority -400; ip saddr $LANHOST counter name "from_uplink"; }
}
EOF
    ip -n "$H1" route add 192.168.88.0/24 via "$LEASE"
    nspawn "$H2" timeout 30 python3 ci/lib/labtool.py tcp-reverse-once 0.0.0.0 7777
    spid=$lastpid
    sleep 0.5
    check "uplink -> LAN: lanhost still reaches the gateway's uplink address (ping $LEASE)" wait_ping "$H1" "$LEASE" 5
    check "uplink -> LAN: lanhost's ping to lanhost2 $LANHOST2 via the gateway is dropped (0 of 3)" \
        sh -c '! ip netns exec "$1" ping -c3 -W1 -i0.3 "$2"' _ "$H1" "$LANHOST2"
    check "uplink -> LAN: lanhost's TCP connection to lanhost2:7777 (listening) is dropped" \
        sh -c '! ip netns exec "$1" timeout 10 python3 ci/lib/labtool.py tcp-reverse-check "$2" 7777' _ "$H1" "$LANHOST2"
    arrived=$(inns "$H2" nft list counter inet rgbcount from_uplink 2>/dev/null | grep -oE 'packets [0-9]+' | cut -d' ' -f2)
    check "uplink -> LAN: lanhost2 counted no packet from lanhost (${arrived:-no counter})" test "${arrived:-x}" = 0
    cmd "show status"
    n=$(drops uplink-forward)
    check "uplink -> LAN: the firewall's uplink-forward drop counter counted them (${n:-no counter})" test "${n:-0}" -gt 0
    stop_pid "$spid"
    ip -n "$H1" route del 192.168.88.0/24 via "$LEASE"
    inns "$H2" nft delete table inet rgbcount
fi
# Two-armed, SSH from the uplink: lanhost's connection to the uplink address gets no answer
# (dropped, not refused: ssh times out) and the firewall's uplink-in counter counts it.
if want two-armed && [ -n "$ssh_fp" ]; then
    cmd "show status"
    n0=$(drops uplink-in)
    got=$(timeout 30 ip netns exec "$H1" ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
        -o UserKnownHostsFile="$KH" -o StrictHostKeyChecking=yes -o ConnectTimeout=5 -i "$SSHKEY" \
        "admin@$LEASE" 'show status' 2>&1)
    rc=$?
    check "two-armed: SSH from lanhost to the uplink address $LEASE gets no answer (rc $rc: ${got:0:120})" \
        sh -c '[ "$1" = 255 ] && printf "%s\n" "$2" | grep -qi "timed out"' _ "$rc" "$got"
    cmd "show status"
    n=$(drops uplink-in)
    check "two-armed: the firewall's uplink-in drop counter counted it (${n0:-none} -> ${n:-none})" \
        sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$2" -gt "$1" ]' _ "$n0" "$n"
fi

# --- the lease without a server ------------------------------------------------------------
# --- link flap -----------------------------------------------------------------------------
# reach_within NS ADDR SECONDS: ADDR answers a ping from NS within SECONDS (one probe a
# second); REACH_SECS says after how long.
reach_within() {
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$3" ]; do
        if inns "$1" ping -c1 -W1 "$2" >/dev/null 2>&1; then
            REACH_SECS=$((SECONDS - t0))
            return 0
        fi
        sleep 0.5
    done
    return 1
}
if want flap; then
    echo "== link flap: eth0's carrier off and on again (QEMU set_link): the lease is re-acquired"
    if [ -n "${t_bound:-}" ]; then
        off=$(con_size)
        if hmp "set_link n0 off" && con_wait 'dhcp eth0: link down' 20 "$off"; then
            ok "link flap: the DHCP client saw eth0's carrier go"
            sleep 2
            hmp "set_link n0 on"
            if con_wait 'dhcp eth0: link up' 20 "$off" && con_wait 'dhcp eth0: (bound|renewed) ' 40 "$off"; then
                ok "link flap: lease re-acquired after the link came back ($(line_of 'dhcp eth0: (bound|renewed) ' "$off"))"
            else
                ko "link flap: no lease within 40 s of the link coming back"
            fi
            # The igb port passes DHCP at once but may drop a moment after coming up: the
            # address must answer again within 10 s (how long it took is in the line).
            if reach_within "$R" "$LEASE" 10; then
                ok "link flap: the router pings $LEASE again ($REACH_SECS s after the lease was back)"
            else
                ko "link flap: the router does not reach $LEASE within 10 s of the lease coming back"
            fi
        else
            ko "link flap: no 'dhcp eth0: link down' after set_link off"
            hmp "set_link n0 on"
        fi
    fi
fi

echo "== lease: renewed$(want lease-lost && echo ", then dnsmasq stopped; the address stays past the next renewal attempt")"
# With a 2-minute lease the client renews every 60 s (T1) while the server answers; the
# last renewal is less than 60 s old when dnsmasq stops. The next renewal attempt gets no
# answer, rebinding starts at T2 (105 s after it), the lease would end at 120 s.
if [ -z "${t_bound:-}" ]; then
    ko "dhcp: renewal and lost-server tests skipped: never bound"
elif want renewal; then
    if con_wait 'dhcp eth0: renewed ' 90; then
        ok "dhcp: lease renewed ($(line_of 'dhcp eth0: renewed '))"
    else
        ko "dhcp: no 'dhcp eth0: renewed' within 90 s"
    fi
fi
if [ -n "${t_bound:-}" ] && want lease-lost; then
    off=$(con_size)
    stop_pid "$dpid"
    t_stop=$SECONDS
    echo "     dnsmasq stopped $((t_stop - t_bound)) s after the first lease"
    if con_wait 'dhcp eth0: rebinding' 115 "$off"; then
        ok "dhcp: no server: rebinding $((SECONDS - t_stop)) s after the stop"
    else
        ko "dhcp: no 'rebinding' line within 115 s of stopping dnsmasq"
    fi
    check "dhcp: no server: a renewal was tried meanwhile ('renewing with') and got no answer (no 'renewed')" \
        sh -c 'tail -c +$(($2 + 1)) "$1" | grep -qa "dhcp eth0: renewing" && ! tail -c +$(($2 + 1)) "$1" | grep -qa "dhcp eth0: renewed"' _ "$log" "$off"
    check "dhcp: no server: the lease did not end early (no 'lease expired')" \
        sh -c '! tail -c +$(($2 + 1)) "$1" | grep -qa "lease expired"' _ "$log" "$off"
    check "dhcp: no server: the router still pings $LEASE $((SECONDS - t_stop)) s after the stop" \
        inns "$R" ping -c2 -W2 -i0.3 "$LEASE"
fi

# --- power cut -----------------------------------------------------------------------------
# Stamps must rise: a peer drops an initiation whose TAI64N timestamp is not newer than the last it
# saw from us; the boot floor (RTC, the time saved ahead on perm, the build time) keeps the
# appliance's stamps increasing when it loses power and its RTC is reset. Only an
# initiation carries the stamp, so the appliance initiates here: the phone's keys on a
# wireguard-go that cannot initiate (no endpoint, no keepalive, nothing routed into it),
# and the appliance's peer entry for it given the peer's address and a keepalive. The
# capture is in the phone namespace; a response whose receiver index is the sender index
# of the appliance's initiation says the peer took that stamp as newer. Without the floor
# the clock would be the RTC's 2001 after the reboot and after the cut: wireguard-go logs
# "handshake replay" for each initiation and answers none (the checks on a type 2 fail).
PC_RTC=2001-01-01T00:00:00
pcap=$work/powercut.pcap
GW_EP=203.0.113.1:51820 # the appliance as the phone sees it (the router's masquerade keeps the port)
pc_port="" pc_peer="" tpid="" log1=$log
matches() { printf '%s\n' "$1" | grep -qaE -- "$2"; }
later() { [ -n "$2" ] && [[ $1 > $2 ]]; } # ISO 8601 times, UTC, same form
wg_msgs() { python3 ci/lib/wgpcap.py "$pcap" 2>/dev/null; }
# answered SINCE: the appliance's first initiation (type 1, 148 B) sent after host time SINCE
# that the peer answered (type 2, 92 B, receiver index = the initiation's sender index):
# "INIT_TIME RESPONSE_TIME INDEX".
answered() {
    wg_msgs | awk -v t="$1" -v gw="$GW_EP" -v ph="203.0.113.2:$pc_port" '
        $1 >= t && $2 == gw && $3 == ph && $4 == 1 && $5 == 148 && !($6 in init) { init[$6] = $1 }
        $2 == ph && $3 == gw && $4 == 2 && $5 == 92 && ($7 in init) { print init[$7], $1, $7; exit }'
}
# wait_answered SINCE SECONDS: until `answered SINCE` has it (in $hs).
wait_answered() {
    local end=$((SECONDS + $2))
    hs=""
    while [ $SECONDS -lt $end ]; do
        hs=$(answered "$1")
        [ -n "$hs" ] && return 0
        sleep 0.5
    done
    return 1
}
# count_msgs SRC TYPE [SINCE]: messages of TYPE from SRC in the capture.
count_msgs() { wg_msgs | awk -v s="$1" -v ty="$2" -v t="${3:-0}" '$1 >= t && $2 == s && $4 == ty { n++ } END { print n + 0 }'; }
# pc_clock LABEL: `show status`'s clock line is not the RTC's 2001: not before this run began.
pc_clock() {
    local line t
    cmd "show status"
    line=$(answer | grep -am1 '^clock: ')
    t=$(date -ud "$(printf '%s\n' "$line" | awk '{print $2}')" +%s 2>/dev/null)
    check "power cut: $1: \`show status\`: '${line:-no clock line}': not in ${PC_RTC%%-*}, not before this run began ($(date -ud "@$t_run" +%FT%TZ))" \
        sh -c '[ -n "$1" ] && [ "$1" -ge "$2" ]' _ "$t" "$t_run"
}
power_cut() {
    local conf=$work/$WGIF.conf pub t0 left set2 set3 n
    echo "== power cut: the appliance initiates to a stock wireguard-go peer; a clean reboot, then QEMU killed, the RTC at 2001 both times"
    t_pc=$SECONDS
    t_run=$(($(date +%s) - (SECONDS - t_all)))
    [ -s "$work/phone.conf" ] || { ko "power cut: no phone config (add client phone failed): phase skipped"; return; }
    # The boots to come need a lease: dnsmasq again (the lease phase stopped it).
    if [ -n "${t_stop:-}" ]; then
        start_dnsmasq
        sleep 0.5
    fi
    check "power cut: dnsmasq serving DHCP again (the boots to come need a lease)" kill -0 "$dpid"
    # The peer: the phone's keys and the appliance's key and preshared key from the printed
    # config, without Endpoint and PersistentKeepalive: it learns the appliance's address
    # from its initiation, and a responder that sends no data sends only responses and
    # keepalives. No address, no route, no IPv6 on its TUN: nothing makes it initiate.
    install -m 0600 "$work/phone.conf" "$conf"
    wg-quick strip "$conf" 2>/dev/null | grep -viE '^ *(endpoint|persistentkeepalive) *=' >"$work/$WGIF.stripped"
    nspawn "$P" env LOG_LEVEL=verbose wireguard-go -f "$WGIF" >"$work/wireguard-go-powercut.log" 2>&1
    pc_peer=$lastpid
    wait_for 5 eval '[ -S "/var/run/wireguard/$WGIF.sock" ]'
    inns "$P" wg setconf "$WGIF" "$work/$WGIF.stripped" &&
        inns "$P" sysctl -qw "net.ipv6.conf.$WGIF.disable_ipv6=1" &&
        inns "$P" ip link set "$WGIF" up
    pc_port=$(inns "$P" wg show "$WGIF" listen-port 2>/dev/null)
    pub=$(inns "$P" wg show "$WGIF" public-key 2>/dev/null)
    if [ -n "$pc_port" ] && [ -n "$pub" ] && ! inns "$P" wg show "$WGIF" endpoints | grep -q ':[0-9]'; then
        ok "power cut: a stock wireguard-go peer with the phone's keys in the phone namespace, listening on 203.0.113.2:$pc_port, no endpoint, no keepalive"
    else
        ko "power cut: the wireguard-go peer did not come up (port '${pc_port}', key '${pub}')"
        return
    fi
    : >"$work/tcpdump-powercut.err"
    nspawn "$P" tcpdump -i wan0 -nn -U -Z root -s 200 -c 5000 -w "$pcap" udp 2>"$work/tcpdump-powercut.err"
    tpid=$lastpid
    wait_for 5 eval 'grep -q "listening on" "$work/tcpdump-powercut.err"'
    check "power cut: capturing UDP on the phone's wan0 (tcpdump -c 5000)" grep -q 'listening on' "$work/tcpdump-powercut.err"
    # 1. the appliance's entry for the phone: where to reach it, and a keepalive (boringtun
    # initiates when the first keepalive is due and there is no session).
    cmd "set peer $pub endpoint 203.0.113.2:$pc_port"
    check "power cut: \`set peer PHONE endpoint 203.0.113.2:$pc_port\` accepted" sh -c '! printf "%s\n" "$1" | grep -qaE "^error"' _ "$(answer)"
    cmd "set peer $pub persistent-keepalive 5"
    check "power cut: \`set peer PHONE persistent-keepalive 5\` accepted" sh -c '! printf "%s\n" "$1" | grep -qaE "^error"' _ "$(answer)"
    t0=$(date +%s.%N)
    cmd commit 60
    check "power cut: commit applied" has 'committed and saved'
    if wait_answered "$t0" 30; then
        ok "power cut: boot 1: the appliance initiates (type 1 from $GW_EP, sender ${hs##* }) and the peer answers it (type 2): the peer's last stamp is boot 1's"
    else
        ko "power cut: boot 1: no initiation of the appliance answered within 30 s of the commit ($(count_msgs "$GW_EP" 1 "$t0") initiations)"
    fi
    # 2. a clean reboot (the time saved at halt), QEMU started again with the RTC at 2001.
    check "power cut: clean \`reboot\`: the guest rebooted (QEMU exited by itself) within 60 s" console_reboot
    qargs+=(-rtc "base=$PC_RTC")
    if boot_again boot1; then
        ok "power cut: boot 2 (after the reboot, RTC at $PC_RTC): console prompt, boot marked good ($((SECONDS - t_boot)) s after QEMU start)"
    else
        ko "power cut: boot 2 (RTC at $PC_RTC): no console prompt within $T s"
        echo "---- last serial lines"; con_clean | tail -20
        return
    fi
    set2=$(con_clean | grep -aoE -m1 'riceguard-init: clock: .*')
    check "power cut: boot 2: '${set2#riceguard-init: }' (the time saved at halt, not the RTC)" \
        matches "$set2" '^riceguard-init: clock: set to [^ ]+ \(source: saved\)$'
    if wait_answered "$boot_since" 60; then
        ok "power cut: boot 2: the peer answers the appliance's new initiation (sender ${hs##* }): its stamp is newer than boot 1's"
    else
        ko "power cut: boot 2: no initiation of the appliance answered within 60 s ($(count_msgs "$GW_EP" 1 "$boot_since") initiations since QEMU started; wireguard-go: $(grep -c 'handshake replay' "$work/wireguard-go-powercut.log") replays)"
    fi
    pc_clock "boot 2"
    # The SSH host key survives the reboot (its serial line and `show status`; two-armed by
    # now, so not from lanhost).
    if [ -n "$ssh_fp" ]; then
        check "power cut: boot 2: riceguard ssh said the same host key (ssh: host key $ssh_fp)" \
            con_wait "ssh: host key ${ssh_fp//+/\\+} \(ED25519\)" 30
        cmd "show status"
        check "power cut: boot 2: \`show status\`'s ssh line names the same host key" test "$(status_ssh_fp)" = "$ssh_fp"
    fi
    # 3. the power cut: QEMU killed, nothing runs at halt; started again, RTC at 2001.
    { # (stderr: not bash's "Killed" notice for its job)
        kill -9 "$qpid"
        left=40
        while [ $left -gt 0 ] && kill -0 "$qpid"; do sleep 0.25; left=$((left - 1)); done
        kill -0 "$qpid" || wait "$qpid"
    } 2>/dev/null
    check "power cut: QEMU killed (SIGKILL, no shutdown)" sh -c '! kill -0 "$1" 2>/dev/null' _ "$qpid"
    stop_qemu
    if boot_again boot2; then
        ok "power cut: boot 3 (after the power cut, RTC at $PC_RTC): console prompt, boot marked good ($((SECONDS - t_boot)) s after QEMU start)"
    else
        ko "power cut: boot 3 (RTC at $PC_RTC): no console prompt within $T s"
        echo "---- last serial lines"; con_clean | tail -20
        return
    fi
    set3=$(con_clean | grep -aoE -m1 'riceguard-init: clock: .*')
    check "power cut: boot 3: '${set3#riceguard-init: }' (the time saved ahead at boot 2, not the RTC)" \
        matches "$set3" '^riceguard-init: clock: set to [^ ]+ \(source: saved\)$'
    t2=$(printf '%s\n' "$set2" | awk '{print $5}') t3=$(printf '%s\n' "$set3" | awk '{print $5}')
    check "power cut: boot 3's clock starts after boot 2's ($t3 > $t2)" later "$t3" "$t2"
    if wait_answered "$boot_since" 60; then
        ok "power cut: boot 3: the peer answers the appliance's new initiation (sender ${hs##* }, $(awk '{printf "%.1f", $1 - s}' s="$boot_since" <<<"$hs") s after QEMU started): it accepted its timestamp"
    else
        ko "power cut: boot 3: no initiation of the appliance answered within 60 s ($(count_msgs "$GW_EP" 1 "$boot_since") initiations since QEMU started; wireguard-go: $(grep -c 'handshake replay' "$work/wireguard-go-powercut.log") replays)"
    fi
    pc_clock "boot 3"
    # Who initiated: only the appliance; and wireguard-go dropped none of its initiations.
    n=$(count_msgs "203.0.113.2:$pc_port" 1)
    check "power cut: the peer never initiated ($n type 1 from 203.0.113.2:$pc_port in the capture; $(count_msgs "$GW_EP" 1) from the appliance, $(count_msgs "203.0.113.2:$pc_port" 2) responses)" test "$n" = 0
    n=$(grep -c 'handshake replay' "$work/wireguard-go-powercut.log")
    check "power cut: wireguard-go dropped no initiation as a replay (no 'handshake replay' in its log; $(grep -c 'Received handshake initiation' "$work/wireguard-go-powercut.log") initiations received, $(grep -c 'Sending handshake response' "$work/wireguard-go-powercut.log") responses sent)" test "$n" = 0
    stop_pid "$tpid"
    stop_pid "$pc_peer"
    rm -f "/var/run/wireguard/$WGIF.sock"
    note "power cut phase: $((SECONDS - t_pc)) s; the run before it: $((t_pc - t_all)) s (the image build ${t_build:-0} s of them)"
}
if want powercut; then power_cut; else skip "power cut (RG_BOARD_PHASES: $phases)"; fi

# --- update and rollback -------------------------------------------------------------------
# The bundles: v1's outputs (the flashed image's UKIs) with another root, signed by
# image/bundle.sh with this tree's key: v2 (version and build number changed) and v3-broken
# (a root without /sbin/init: stage 1 fails and reboots, as in ci/test-update.sh QEMU 4).
# lanhost serves them over HTTP on the uplink segment; the console's `update` fetches one.
www=$work/www
build1=$(awk '$1 == "build" {print $2}' "$RG_OUT/manifest.txt" 2>/dev/null)
# derive NAME VERSION BUILD [broken]: $www/NAME.bundle
derive() {
    local d=$work/$1 r=$work/$1-root
    rm -rf "$d" "$r"
    mkdir -p "$d" "$www"
    cp "$RG_OUT/slot-a.efi" "$RG_OUT/slot-b.efi" "$d/"
    if [ -z "${4:-}" ]; then
        unsquashfs -q -n -d "$r" "$RG_OUT/root.squashfs" >/dev/null || return 1
        printf 'riceguard %s %s\n' "$2" "$board" >"$r/etc/riceguard/version"
        printf '%s\n' "$3" >"$r/etc/riceguard/build"
    else
        mkdir -p "$r/etc/riceguard"
        echo "broken: no /sbin/init" >"$r/etc/riceguard/version"
    fi
    mksquashfs "$r" "$d/root.squashfs" -quiet -no-progress -noappend -comp zstd -all-root >/dev/null || return 1
    sed "s/^version .*/version $2/; s/^build .*/build $3/" "$RG_OUT/manifest.txt" >"$d/manifest.txt"
    RG_OUT=$d image/bundle.sh "$board" >"$d.bundle.log" 2>&1 || { tail -5 "$d.bundle.log"; return 1; }
    mv "$d/riceguard-$board-$2.bundle" "$www/$1.bundle"
    rm -rf "$r"
}
# The ESP's boot entries, from the host (QEMU stopped): "riceguard-a+0-3.conf riceguard-b.conf".
board_entries() { esp_entries "$disk"; }
# install_from_lanhost NAME VERSION SLOT: `update http://lanhost/NAME.bundle` on the console;
# true when the report says VERSION was installed into SLOT.
install_from_lanhost() {
    local off
    cmd "update http://$LANHOST:8080/$1.bundle" 30
    off=$(con_size)
    has 'update started in the background' || { bad_answer; return 1; }
    local re="update: installed $2 into slot $3|update: .*(refused|failed|error)"
    con_wait "$re" 600 "$off" && line_of "$re" "$off" | grep -qaF "update: installed $2 into slot $3"
}
# phone_reaches LABEL: the phone's printed config (one-armed) still reaches lanhost.
phone_reaches() {
    [ -s "$work/phone.conf" ] || { skip "$1: the phone (no phone.conf: one-armed did not run)"; return; }
    if phone_up "$work/phone.conf"; then
        check "$1: the phone client (its config from boot 1) pings lanhost $LANHOST through the tunnel" wait_ping "$P" "$LANHOST" 40
    else
        ko "$1: could not bring up wireguard-go with the phone's config"
    fi
    phone_down
}
key1=$(con_clean | grep -aE -m1 '^riceguard: public key ')
update_phase() {
    local t0=$SECONDS
    if derive v2 v2 $((build1 + 1)) && { ! want rollback || derive v3 v3-broken $((build1 + 2)) broken; }; then
        ok "update: bundles signed by image/bundle.sh: v2 (build $((build1 + 1)), $(stat -c %s "$www/v2.bundle") bytes)$(want rollback && echo ", v3-broken (build $((build1 + 2)))")"
    else
        ko "update: making the bundles"
        return 1
    fi
    nspawn "$H1" python3 -m http.server --bind "$LANHOST" --directory "$www" 8080 >"$work/http.log" 2>&1
    httpd=$lastpid
    wait_for 10 eval 'inns "$H1" ss -ltn | grep -q ":8080 "'
    if install_from_lanhost v2 v2 b; then
        ok "update: console \`update http://$LANHOST:8080/v2.bundle\`: $(line_of 'update: installed ')"
    else
        ko "update: v2 was not installed into slot b ($(con_clean | grep -aE 'update: ' | tail -1))"
        return 1
    fi
    check "update: \`reboot\`: the guest rebooted" console_reboot
    check "update: ESP entries: a good, b with 3 tries ($(board_entries))" test "$(board_entries)" = "riceguard-a.conf riceguard-b+3.conf"
    if boot_again boot1; then
        ok "update: slot b boots v2 and is marked good ($((SECONDS - t_boot)) s after QEMU start)"
    else
        ko "update: slot b: no prompt or not marked good within $T s"
        con_clean | tail -20
        return 1
    fi
    check "update: slot b booted from the NVMe disk (root /dev/nvme0n1p3)" have 'slot b booted .*root /dev/nvme0n1p3'
    check "update: on trial (riceguard-b+2-1.conf: 2 tries left, 1 used)" have 'slot b on trial \(riceguard-b\+2-1\.conf: 2 tries left, 1 used\)'
    check "update: marked good (riceguard-b+2-1.conf -> riceguard-b.conf)" have 'boot marked good \(riceguard-b\+2-1\.conf -> riceguard-b\.conf\)'
    check "update: the key kept (${key1:-no key line at boot 1})" sh -c '[ -n "$1" ] && tr -d "\r" <"$2" | grep -qaxF -- "$1"' _ "$key1" "$log"
    cmd "show status"
    check "update: \`show status\`: firmware v2 (build $((build1 + 1))), boot slot b" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^firmware: riceguard v2 .*\(build $2\)$" && printf "%s\n" "$1" | grep -qax "boot slot: b"' _ "$(answer)" $((build1 + 1))
    check "update: a DHCP lease again on v2" con_wait 'dhcp eth0: bound ' 90
    if [ -n "$ssh_fp" ]; then
        check "update: with SSH keys set, slot b marked good once riceguard ssh listened ('ssh listens on port 22')" have 'riceguard-init: .*ssh listens on port 22'
        ssh_same update
    fi
    phone_reaches update
    note "update phase (bundles, install over HTTP, reboot, checks): $((SECONDS - t0)) s"
}
rollback_phase() {
    local t0=$SECONDS i fails=0 stalls=0 other=0 l
    if install_from_lanhost v3 v3-broken a; then
        ok "rollback: v3-broken (root without /sbin/init) installed into slot a from slot b"
    else
        ko "rollback: v3-broken was not installed into slot a ($(con_clean | grep -aE 'update: ' | tail -1))"
        return 1
    fi
    check "rollback: \`reboot\`: the guest rebooted" console_reboot
    check "rollback: ESP entries: a with 3 tries, b good ($(board_entries))" test "$(board_entries)" = "riceguard-a+3.conf riceguard-b.conf"
    # Slot a's tries, with nobody touching the box: each boot ends in a reboot (QEMU exits),
    # until the boot manager runs slot b again and init marks it good.
    local names=(v2 try1 try2 try3 try4)
    for i in 1 2 3 4 5; do
        cp "$log" "$work/serial-${names[i - 1]}.log"
        boot_logs+=("$work/serial-${names[i - 1]}.log")
        start_qemu
        l=$((T * 4))
        while [ $l -gt 0 ] && kill -0 "$qpid" 2>/dev/null && ! have 'riceguard-init: boot marked good'; do sleep 0.25; l=$((l - 1)); done
        if have 'riceguard-init: boot marked good'; then break; fi
        stop_qemu
        if have 'FATAL: .*has no /sbin/init'; then fails=$((fails + 1))
        elif stalled || ! have 'riceguard-init: '; then stalls=$((stalls + 1)); note "rollback: boot $i stalled before init (TCG): counted as a used try"
        else other=$((other + 1)); fi
    done
    check "rollback: slot a failed $((fails + stalls)) boots by itself ($fails 'has no /sbin/init' then a reboot, $stalls stalled, $other other)" \
        test "$fails" -ge 1 -a "$other" = 0 -a $((fails + stalls)) = 3
    if have 'riceguard-init: boot marked good' && con_wait 'riceguard(\(edit\))?# ' 30; then
        ok "rollback: back on slot b without help, marked good"
    else
        ko "rollback: no good boot after slot a's tries"
        con_clean | tail -20
        return 1
    fi
    check "rollback: slot b booted (root /dev/nvme0n1p3)" have 'slot b booted .*root /dev/nvme0n1p3'
    check "rollback: init says FALLBACK and why (slot a (riceguard-a+0-3.conf) failed 3 boots)" \
        have 'FALLBACK: slot a \(riceguard-a\+0-3\.conf\) failed 3 boots'
    cmd "show status"
    check "rollback: \`show status\`: firmware v2, boot slot b" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^firmware: riceguard v2 " && printf "%s\n" "$1" | grep -qax "boot slot: b"' _ "$(answer)"
    check "rollback: a DHCP lease again" con_wait 'dhcp eth0: bound ' 90
    [ -n "$ssh_fp" ] && ssh_same rollback
    phone_reaches rollback
    note "rollback phase (install, 3 failed tries, fallback): $((SECONDS - t0)) s"
}
if want update; then
    if update_phase && want rollback; then rollback_phase; fi
    [ -n "${httpd:-}" ] && stop_pid "$httpd"
elif want rollback; then
    ko "rollback: needs the update phase (slot b running v2)"
fi

check "no kernel panic/oops on the serial line (every boot)" eval '! grep -qaE "$QEMU_PANIC_RE" "${boot_logs[@]}" "$log"'
[ ${#boot_logs[@]} -gt 0 ] && log1=${boot_logs[0]}
grep -aE 'dhcp eth0: ' "$log1" | tr -d '\r' | sed 's/^/     serial: /'
finish
