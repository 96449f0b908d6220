#!/usr/bin/env bash
# Two consoles at once in QEMU (qemu-x86_64 board, TCG, one boot of a factory disk): the
# serial line (ttyS0) and a virtio console (hvc0: `-device virtio-serial-pci -device
# virtconsole`), which stands in for a real box's screen and keyboard (tty1) — same
# console program, same rules; only the terminal differs (no VT keyboard map, no fbcon).
# ci/lib/console2.py drives both and QMP:
#   - an NMI (QMP inject-nmi: the guest kernel's KERN_EMERG "NMI received for unknown
#     reason") before the consoles run reaches the serial line (the trigger is real);
#   - the early failsafe prompt shows on both, `f` on hvc0 wins, both are told;
#   - a console password set on ttyS0; both log in with it after a wrong try;
#   - two edits at once: the second commit is refused naming ttyS0, `compare` still
#     shows its edit, `discard` + redo commits;
#   - `commit-confirm 1` on hvc0: ttyS0's `show status` names it, ttyS0 cannot commit
#     over it, may `confirm` it, and hvc0 is told;
#   - another NMI once the consoles run: no kernel text on either console's lines.
# usage: ci/test-console2-qemu.sh   (reuses out/qemu-x86_64's image; RG_CONSOLE_REBUILD=1
#        rebuilds it first; RG_CONSOLE_TIMEOUT seconds per boot wait, default 180)
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
h_init console2-qemu
board=qemu-x86_64
work=$PWD/out/test-console2-qemu
export RG_OUT=${RG_OUT:-out/$board}
img=$RG_OUT/riceguard-$board.img
t_all=$SECONDS
for t in qemu-system-x86_64 python3; do
    command -v "$t" >/dev/null || h_abort "missing tool $t (ci/deps.sh installs it)"
done
rm -rf "$work"
mkdir -p "$work"
if [ ! -f "$img" ] || [ -n "${RG_CONSOLE_REBUILD:-}" ]; then
    image/build.sh "$board" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; h_abort "image build"; }
fi
# Unix socket paths must be short: under /tmp, named for this run.
sock=$(mktemp -d /tmp/rgt-console2.XXXXXX)
disk=$work/disk.img
cp --sparse=always "$img" "$disk"
qsh=""
cleanup() {
    qemu_stop "$qsh"
    rm -rf "$sock" "$disk"
}
at_exit cleanup

# No second start after a stall (RG_QEMU_STALL_RETRY=0): the driver's virtio console and
# QMP connections are to this QEMU.
RG_QEMU_DISK="$disk" RG_QEMU_LOG="$work/serial.log" RG_QEMU_TIMEOUT=900 RG_QEMU_STALL_RETRY=0 \
    RG_QEMU_UNTIL='^RG-NEVER$' RG_QEMU_SERIAL_IN="$sock/serial-in" \
    RG_QEMU_EXTRA="-device virtio-serial-pci -chardev socket,id=rgtcon,path=$sock/hvc,server=on,wait=off -device virtconsole,chardev=rgtcon -qmp unix:$sock/qmp,server=on,wait=off" \
    image/qemu.sh "$board" >"$work/qemu.out" 2>&1 &
qsh=$!
wait_for 10 eval '[ -e "$sock/serial-in" ] && [ -S "$sock/qmp" ]'
finished=""
while IFS= read -r line; do
    case $line in
        DONE) finished=1 ;;
        PASS\ *) ok "${line#PASS }" ;;
        FAIL\ *) ko "${line#FAIL }" ;;
        *) echo "$line" ;;
    esac
done < <(QEMU_PANIC_RE=$QEMU_PANIC_RE python3 ci/lib/console2.py "$sock/serial-in" "$work/serial.log" "$sock/hvc" "$sock/qmp" "$work/transcript.txt" 2>&1)
[ -n "$finished" ] || ko "the two-console driver did not run to its end"
[ "$failed" -eq 0 ] || { echo "---- last serial lines"; tr -d '\r' <"$work/serial.log" | tail -25; }
echo "console2-qemu: transcript in $work/transcript.txt (took $((SECONDS - t_all)) s)"
h_finish
