#!/usr/bin/env bash
# Boot a board's disk image in QEMU (TCG: this host's KVM is unusable, ENVIRONMENT.md)
# with UEFI firmware and a fresh copy of its variable store, serial on this terminal.
# Builds the image first if it is missing.
#
# usage: image/qemu.sh BOARD
# env:   RG_QEMU_DISK   disk image to boot (default out/<board>/riceguard-<board>.img;
#                       booting changes it: systemd-boot counts tries, init marks good)
#        RG_QEMU_NET    user (default: QEMU's slirp) | tap (a tap with vnet_hdr in a
#                       network namespace this script creates: rgq<pid>, host side
#                       192.0.2.1/24 on tap rgtap0; guest uses riceguard.uplink=)
#        RG_QEMU_USO    on|off: virtio-net host_uso/guest_uso4/6 (tap only)
#        RG_QEMU_NS_HOOK  command run inside the namespace once the tap is up (tap only;
#                       e.g. start a wireguard-go peer), killed at exit
#        RG_QEMU_LOG    non-interactive mode: serial output goes to this file, no stdin
#        RG_QEMU_TIMEOUT  seconds before a non-interactive run is stopped (default 300)
#        RG_QEMU_UNTIL  extended regex: stop successfully once the serial log matches
#        RG_QEMU_SERIAL_IN  non-interactive: also create the FIFO PATH; what is written
#                       to it is typed on the guest's serial line (the console)
#        RG_QEMU_STALL_RETRY  1 (default): a guest kernel that stalls before init is
#                       started once more on the disk as it was (below); 0: not
#        RG_QEMU_ACCEL  tcg (default) | kvm
#        RG_QEMU_EXTRA  more QEMU arguments, split on spaces (e.g. -rtc base=2001-01-01T00:00:00)
#        RG_QEMU_DISKS  extra raw disk files (space-separated), attached read-only as
#                       virtio-blk after the boot disk (/dev/vdb, /dev/vdc...: e.g. bundles)
# exit:  0 (interactive: QEMU's status; non-interactive: RG_QEMU_UNTIL seen or QEMU
#        exited), 3 kernel panic/oops seen, 4 timeout
set -euo pipefail
cd "$(dirname "$0")/.."
board=${1:?usage: image/qemu.sh BOARD}
# shellcheck source=/dev/null
. "board/$board/board.conf"
disk=${RG_QEMU_DISK:-out/$board/riceguard-$board.img}
if [ ! -f "$disk" ]; then
    image/build.sh "$board"
fi
command -v "$QEMU" >/dev/null || { echo "qemu: $QEMU missing (ci/deps.sh installs it)" >&2; exit 1; }
run=$(mktemp -d /tmp/rg-qemu.XXXXXX)
ns="" qpid="" hookpid=""
cleanup() {
    [ -n "$hookpid" ] && kill -TERM -- "-$hookpid" 2>/dev/null || true
    [ -n "$qpid" ] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null || true
    [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null || true
    [ -n "${RG_QEMU_SERIAL_IN:-}" ] && rm -f "$RG_QEMU_SERIAL_IN"
    rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$FIRMWARE_VARS" "$run/vars.fd"
args=(-accel "${RG_QEMU_ACCEL:-tcg}" $QEMU_ARGS -nographic -no-reboot
      -drive "if=pflash,format=raw,unit=0,readonly=on,file=$FIRMWARE_CODE"
      -drive "if=pflash,format=raw,unit=1,file=$run/vars.fd"
      -drive "if=none,id=disk0,format=raw,file=$disk" -device "${QEMU_DISK:-virtio-blk-pci},drive=disk0")
# shellcheck disable=SC2206
[ -n "${RG_QEMU_EXTRA:-}" ] && args+=(${RG_QEMU_EXTRA})
i=1
for d in ${RG_QEMU_DISKS:-}; do
    args+=(-drive "if=none,id=xdisk$i,format=raw,readonly=on,file=$d" -device "virtio-blk-pci,drive=xdisk$i")
    i=$((i + 1))
done
# AAVMF's pflash images must be exactly 64 MiB (they are, as shipped).
nic="$QEMU_NIC,netdev=n0,mac=52:54:00:12:34:56"
case ${RG_QEMU_NET:-user} in
    user) args+=(-netdev user,id=n0 -device "$nic") ;;
    tap)
        ns=rgq$$
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" tuntap add dev rgtap0 mode tap vnet_hdr
        ip -n "$ns" addr add 192.0.2.1/24 dev rgtap0
        ip -n "$ns" link set rgtap0 up
        if [ -n "${RG_QEMU_USO:-}" ] && [ "$QEMU_NIC" = virtio-net-pci ]; then
            u=$RG_QEMU_USO
            nic="$nic,host_uso=$u,guest_uso4=$u,guest_uso6=$u"
        fi
        args+=(-netdev tap,id=n0,ifname=rgtap0,script=no,downscript=no,vhost=off -device "$nic")
        if [ -n "${RG_QEMU_NS_HOOK:-}" ]; then
            # Own process group (setsid), so cleanup ends the hook and all it started.
            setsid ip netns exec "$ns" sh -c "$RG_QEMU_NS_HOOK" &
            hookpid=$!
        fi
        ;;
    *) echo "qemu: RG_QEMU_NET is user or tap" >&2; exit 2 ;;
esac
prefix=()
[ -n "$ns" ] && prefix=(ip netns exec "$ns")

if [ -z "${RG_QEMU_LOG:-}" ]; then
    echo "qemu: booting $disk ($board, ${RG_QEMU_ACCEL:-tcg}); quit with Ctrl-A X" >&2
    "${prefix[@]}" "$QEMU" "${args[@]}"
    exit $?
fi

# Non-interactive: serial to the log file, watch it.
# A guest kernel that stalls before init (RCU: "rcu_preempt kthread timer wakeup didn't
# happen" on the second vCPU: TCG on a loaded host, never seen on hardware) is started once
# more, on the disk as it was before (systemd-boot had counted a try on the ESP), with a
# line in the log saying so; its time does not count against RG_QEMU_TIMEOUT. A second
# stall is the result (timeout).
log=$RG_QEMU_LOG
: >"$log"
cp --sparse=always "$disk" "$run/disk.before"
stall_re='rcu: INFO: .*detected stalls'
catpid=""
start_qemu() {
    # append=on: a second start keeps what the first one wrote.
    serial=(-chardev "file,id=ser0,path=$log,append=on" -serial chardev:ser0)
    if [ -n "${RG_QEMU_SERIAL_IN:-}" ]; then
        # A QEMU pipe chardev: it reads PATH.in and writes PATH.out; a reader copies the
        # output into the log, and the caller writes to PATH (a link to PATH.in).
        sp=$run/serial
        [ -p "$sp.in" ] || mkfifo "$sp.in" "$sp.out"
        ln -sf "$sp.in" "$RG_QEMU_SERIAL_IN"
        serial=(-chardev "pipe,id=ser0,path=$sp" -serial chardev:ser0)
        cat "$sp.out" >>"$log" &
        catpid=$!
    fi
    "${prefix[@]}" "$QEMU" "${args[@]}" "${serial[@]}" -monitor none -display none \
        </dev/null >>"$run/qemu.out" 2>&1 &
    qpid=$!
}
start_qemu
deadline=$(( $(date +%s) + ${RG_QEMU_TIMEOUT:-300} ))
started=$(date +%s)
status=4 restarted=""
while :; do
    if grep -qaE 'Kernel panic|Oops|BUG:|Call Trace' "$log"; then status=3; break; fi
    if [ -n "${RG_QEMU_UNTIL:-}" ] && grep -qaE "$RG_QEMU_UNTIL" "$log"; then status=0; break; fi
    if ! kill -0 "$qpid" 2>/dev/null; then
        wait "$qpid" || true
        qpid=""
        status=0
        [ -n "${RG_QEMU_UNTIL:-}" ] && status=4
        break
    fi
    if [ -z "$restarted" ] && [ "${RG_QEMU_STALL_RETRY:-1}" = 1 ] && grep -qaE "$stall_re" "$log" && ! grep -qa 'riceguard-init: ' "$log"; then
        restarted=1
        kill "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null || true
        [ -n "$catpid" ] && wait "$catpid" 2>/dev/null || true
        cp --sparse=always "$run/disk.before" "$disk"
        cp "$FIRMWARE_VARS" "$run/vars.fd"
        line=$(grep -aoEm1 "rcu: .*timer wakeup didn't happen[^!]*|$stall_re" "$log" || true)
        printf '\nrg-qemu: the guest kernel stalled before init (%s); disk restored, started once more\n' "$line" >>"$log"
        echo "qemu: the guest kernel stalled before init ($line); disk restored, started once more" >&2
        deadline=$((deadline + $(date +%s) - started))
        start_qemu
    fi
    [ "$(date +%s)" -ge "$deadline" ] && break
    sleep 0.5
done
[ -s "$run/qemu.out" ] && sed 's/^/qemu: /' "$run/qemu.out" >&2
exit $status
