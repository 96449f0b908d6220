#!/usr/bin/env bash
# Serial-console tests in QEMU (qemu-x86_64 board, TCG): a script types on the
# appliance's serial console (image/qemu.sh RG_QEMU_SERIAL_IN) and reads the serial log.
#   boot 1 (factory disk):  set a peer, commit, and SIGKILL QEMU as soon as `commit`
#                           answers (no clean shutdown, perm's journal not flushed)
#   boot 2 (same disk):     the committed peer is there (`show`); an invalid `set` is
#                           refused and changes nothing (`show`, `compare`, prompt);
#                           commit a second peer, `rollback 1` + commit removes it again;
#                           `export configuration to usb` and `import configuration from
#                           usb` say the board has no USB stick (cloud kernel, virtio only);
#                           `commit-confirm 1` left unconfirmed rolls back by itself
#                           (~60 s; RG_CONSOLE_CONFIRM=0 skips it), on time although an
#                           `update` whose source never answers is running meanwhile (it
#                           runs in the background; the console keeps answering)
#   boot 3 (failsafe):      the gateway runs with no peers; a commit then must make it
#                           run the committed file: the console says "applied" (the
#                           daemon's reload generation moved, result ok) and `show
#                           peers` lists the saved and the new peer
# Any "Kernel panic|Oops|BUG:|Call Trace" on the serial line fails the run.
#
# usage: ci/test-console-qemu.sh
# env:   RG_CONSOLE_TIMEOUT (s per wait for a boot, default 180), RG_CONSOLE_KEEP=1 keeps
#        the disk copy; logs and the typed transcript stay in out/test-console-qemu/;
#        RG_CONSOLE_REBUILD=1 rebuilds out/qemu-x86_64 first (else it is reused if
#        present: it may be older than the working tree); RG_OUT: another image dir
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
. ci/lib/qemu.sh
. ci/lib/console.sh
h_init console-qemu
board=qemu-x86_64
T=${RG_CONSOLE_TIMEOUT:-180}
work=$PWD/out/test-console-qemu
export RG_OUT=${RG_OUT:-out/$board}
img=$RG_OUT/riceguard-$board.img
t_all=$SECONDS

finish() {
    echo
    echo "console-qemu: serial logs and transcript in $work (took $((SECONDS - t_all)) s)"
    h_finish
}

for t in qemu-system-x86_64 wg mkfifo; do
    command -v "$t" >/dev/null || { ko "missing tool $t (ci/deps.sh installs it)"; finish; }
done
rm -rf "$work"
mkdir -p "$work"
if [ ! -f "$img" ] || [ -n "${RG_CONSOLE_REBUILD:-}" ]; then
    echo "== building $img"
    image/build.sh "$board" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; ko "image build"; finish; }
fi
disk=$work/disk.img
cp --sparse=always "$img" "$disk"
sin=$work/serial-in
transcript=$work/transcript.txt
: >"$transcript"

wpid="" log="" boot_name=""
# Stop the running boot (qemu_stop: QEMU first, then qemu.sh).
stop_qemu() {
    [ -n "$wpid" ] || return 0
    exec 9>&- 2>/dev/null
    qemu_stop "$wpid" "${1:-TERM}"
    wpid=""
}
cleanup() {
    stop_qemu KILL
    [ -n "${RG_CONSOLE_KEEP:-}" ] || rm -f "$disk"
    rm -f "$sin"
}
at_exit cleanup

# boot NAME: start QEMU on $disk with the serial FIFO, wait for the console prompt.
boot() {
    boot_name=$1
    log=$work/$1.log
    : >"$log"
    local t0=$SECONDS
    RG_QEMU_DISK="$disk" RG_QEMU_LOG="$log" RG_QEMU_TIMEOUT=$((T + 240)) \
        RG_QEMU_UNTIL='^RG-NEVER$' RG_QEMU_SERIAL_IN="$sin" \
        image/qemu.sh "$board" >"$work/$1.qemu" 2>&1 &
    wpid=$!
    con_use "$log" "$wpid" "$transcript"
    wait_for 10 eval '[ -e "$sin" ]'
    # Read-write: opening never blocks and QEMU never sees the writer go away.
    if ! exec 9<>"$sin"; then
        ko "$1: serial input FIFO did not appear"
        return 1
    fi
    # boot NAME failsafe: answer init's early failsafe prompt with `f`.
    if [ "${2:-}" = failsafe ]; then
        con_wait 'press f and Enter' "$T" && printf 'f\r' >&9
    fi
    if con_wait 'riceguard-init: (boot marked good|FATAL)' "$T" && con_wait 'riceguard(\(edit\))?# ' 30; then
        echo "     $1: console prompt after $((SECONDS - t0)) s"
        printf '==== %s (console prompt after %s s)\n' "$1" "$((SECONDS - t0))" >>"$transcript"
        return 0
    fi
    serial_panicked "$log" && ko "$1: kernel panic/oops on the serial line"
    ko "$1: no console prompt within $T s"
    echo "---- last serial lines ($1)"
    con_clean | tail -25
    return 1
}

# The configuration as `show` prints it, without prompt and echo lines.
show_conf() {
    cmd show || return 1
    answer | grep -avE 'riceguard(\(edit\))?# |^show$'
}

pub1=$(wg genkey | wg pubkey) pub2=$(wg genkey | wg pubkey) pub3=$(wg genkey | wg pubkey)

# ---------------------------------------------------------------------------------------
echo "== boot 1: set a peer, commit, kill QEMU as soon as commit answers"
if boot boot1; then
    cmd "set peer $pub1 allowed-ips 10.100.0.2/32"
    check "boot 1: set peer accepted, prompt shows uncommitted edits" \
        sh -c "! printf '%s' \"\$1\" | grep -q '^error:' && printf '%s' \"\$1\" | grep -q 'riceguard(edit)# '" _ "$out"
    # Kill on the commit's first answer line, before the prompt even comes back.
    off=$(con_size)
    printf 'commit\r' >&9
    if con_wait 'committed and saved|error: ' 60 "$off"; then
        stop_qemu KILL
        out=$(tail -c +$((off + 1)) "$log" | tr -d '\r')
        printf '%s\n[QEMU killed with SIGKILL here]\n' "$out" >>"$transcript"
        check "boot 1: commit answered 'committed and saved'" has 'committed and saved'
    else
        ko "boot 1: commit did not answer"
        stop_qemu KILL
    fi
fi
stop_qemu KILL

# ---------------------------------------------------------------------------------------
# The qemu-* boards' cloud kernels have no USB (virtio only): the USB forms of export and
# import say that no stick can be attached, before any passphrase, and change nothing.
usb_without_usb() {
    cmd "export configuration to usb"
    check "usb: \`export configuration to usb\` without USB: refused at once ('no USB'), no passphrase asked" \
        sh -c 'printf "%s\n" "$1" | grep -qaE "^error: not exported: .*no USB" && ! printf "%s\n" "$1" | grep -qa "passphrase"' _ "$(answer)"
    cmd "import configuration from usb"
    check "usb: \`import configuration from usb\` without USB: refused ('no USB'), nothing changed" \
        has '^error: not imported: .*no USB.*nothing changed'
    answer | grep -a '^error' | sed 's/^/     /'
}
echo "== boot 2: committed peer kept; invalid set refused; rollback; commit-confirm"
if boot boot2; then
    check "boot 2: perm mounted again (boot 2)" grep -qaE 'perm mounted \(.*boot 2\)' "$log"
    conf=$(show_conf)
    check "boot 2: \`show\` has the peer committed before the kill" \
        sh -c 'printf "%s\n" "$1" | grep -qxF "PublicKey = $2" && printf "%s\n" "$1" | grep -qxF "AllowedIPs = 10.100.0.2/32"' _ "$conf" "$pub1"

    cmd "set interface listen-port 99999"
    check "invalid set: refused with an error" has '^error: .*99999'
    check "invalid set: prompt has no uncommitted edits" sh -c 'printf "%s" "$1" | tail -1 | grep -q "^riceguard# "' _ "$out"
    cmd compare
    check "invalid set: \`compare\` shows no changes" has '^no changes'
    conf2=$(show_conf)
    check "invalid set: \`show\` unchanged" test "$conf2" = "$conf"

    cmd "set peer $pub2 allowed-ips 10.100.0.3/32"
    cmd commit
    check "rollback: second peer committed" has 'committed and saved'
    conf3=$(show_conf)
    check "rollback: \`show\` has both peers" \
        sh -c 'printf "%s\n" "$1" | grep -qxF "PublicKey = $2" && printf "%s\n" "$1" | grep -qxF "PublicKey = $3"' _ "$conf3" "$pub1" "$pub2"
    cmd "rollback 1"
    check "rollback: \`rollback 1\` loads saved version 1" has '^loaded saved version 1'
    cmd compare
    check "rollback: \`compare\` shows the second peer removed" has_line "- PublicKey = $pub2"
    cmd commit
    check "rollback: commit of version 1" has 'committed and saved'
    conf4=$(show_conf)
    check "rollback: \`show\` equals the configuration before the second peer" test "$conf4" = "$conf"

    usb_without_usb
    if [ "${RG_CONSOLE_CONFIRM:-1}" != 0 ] && [ "$failed" -eq 0 ]; then
        cmd "set peer $pub3 allowed-ips 10.100.0.4/32"
        cmd "commit-confirm 1"
        check "commit-confirm: committed, rollback announced" has 'committed and saved'
        conf5=$(show_conf)
        check "commit-confirm: \`show\` has the new peer meanwhile" \
            sh -c 'printf "%s\n" "$1" | grep -qxF "PublicKey = $2"' _ "$conf5" "$pub3"
        # A long command meanwhile: an update whose source never answers (a pty master
        # nobody writes to: like a download stalled below the per-read timeout).
        cmd "update /dev/ptmx" 20
        check "commit-confirm: a stalled update runs in the background, the console answers at once" \
            has 'update started in the background'
        t0=$SECONDS off=$(con_size)
        if con_wait 'not confirmed in time' 100 "$off" && con_wait 'riceguard(\(edit\))?# ' 10 "$off"; then
            out=$(tail -c +$((off + 1)) "$log" | tr -d '\r')
            printf '%s\n' "$out" >>"$transcript"
            echo "     commit-confirm rolled back $((SECONDS - t0)) s after the last command"
            ok "commit-confirm: unconfirmed, rolled back by itself"
            conf6=$(show_conf)
            check "commit-confirm: \`show\` is the configuration before it again" test "$conf6" = "$conf"
            cmd "show status"
            check "commit-confirm: rolled back while the update was still running (show status)" \
                has '^background: update \(pid [0-9]+\) running'
        else
            ko "commit-confirm: no rollback within 100 s"
        fi
    elif [ "$failed" -ne 0 ]; then
        echo "     commit-confirm test skipped: earlier failures"
    fi
    check "boot 2: no kernel panic/oops" eval '! serial_panicked "$log"'
fi
stop_qemu TERM

# Failsafe (OpenWrt-style): `f` at the early prompt starts the gateway with no peers and
# leaves the saved configuration alone.
if [ "$failed" -eq 0 ] && boot boot3 failsafe; then
    check "failsafe: init entered failsafe mode" grep -qaE 'riceguard-init: failsafe: the gateway starts with no peers' "$log"
    check "failsafe: the gateway still came up" grep -qaE 'riceguard-init: gateway up' "$log"
    cmd "show peers"
    check "failsafe: the running gateway has no peers" sh -c '! printf "%s" "$1" | grep -q "^peer:"' _ "$out"
    cmd "show"
    check "failsafe: the saved configuration still has its peer" has "PublicKey = "
    # A commit after a failsafe boot applies the committed file (not the peerless copy).
    cmd "set peer $pub3 allowed-ips 10.100.0.4/32"
    cmd commit 30
    check "failsafe commit: the failsafe copy was replaced by the committed file" has 'replaced by the committed file'
    check "failsafe commit: the console says the gateway applied it" has '^the gateway applied it \(reload generation [0-9]+\)'
    cmd "show peers"
    check "failsafe commit: the running gateway has the saved and the new peer" \
        sh -c 'printf "%s\n" "$1" | grep -qF "$2" && printf "%s\n" "$1" | grep -qF "$3"' _ "$out" "$pub1" "$pub3"
    stop_qemu TERM
fi
finish
