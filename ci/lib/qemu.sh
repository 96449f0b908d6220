# QEMU test helpers shared by the image, console, update, board and U-Boot tests
# (sourced, not run; needs nothing else sourced). It owns:
#   - what a serial log counts as a crash (QEMU_PANIC_RE, serial_panicked),
#   - waiting on a serial log while the guest runs (serial_wait),
#   - reading a disk image from the host with QEMU stopped: a partition's byte offset
#     and size by GPT label (part_off, part_size), the ESP's boot entries (esp_entries)
#     and one ESP file (esp_cat).
#   - stopping a QEMU that image/qemu.sh started (qemu_stop).
# Starting QEMU stays with each test (image/qemu.sh, a tap lab, firmware.sh): each stops
# only the PIDs it started.
#
#   serial_panicked LOG                 # LOG shows a kernel panic/oops
#   qemu_restarted LOG                  # image/qemu.sh started the guest once more after
#                                       # its kernel stalled before init (TCG; the disk
#                                       # as before): a caller's own boot deadline starts
#                                       # again from there
#   serial_wait LOG PID REGEX SECONDS [OFFSET]
#                                       # until LOG after byte OFFSET (CRs dropped) matches
#                                       # REGEX: false on a panic, when PID has ended, or
#                                       # after SECONDS (polled every 0.25 s)
#   part_off DISK NAME / part_size DISK NAME      # bytes, from the GPT (sfdisk, jq)
#   esp_entries DISK                    # "riceguard-a+0-3.conf riceguard-b.conf" (mtools)
#   esp_cat DISK PATH                   # an ESP file, e.g. ::/loader/entries/riceguard-a.conf
#
#   qemu_stop WRAPPER_PID [SIGNAL]      # stop image/qemu.sh (WRAPPER_PID, ours) and its
#                                       # QEMU: QEMU first, by its PID (SIGNAL, default
#                                       # TERM; KILL for a power cut), then the wrapper,
#                                       # which notices within 0.5 s and cleans up
#
# Checks that run these in a `bash -c` take them along with "$(declare -f NAME...)".

QEMU_PANIC_RE='Kernel panic|Oops|BUG:|Call Trace'

serial_panicked() { grep -qaE "$QEMU_PANIC_RE" "$1"; }

qemu_restarted() { grep -qa '^rg-qemu: the guest kernel stalled before init' "$1"; }

serial_wait() { # LOG PID REGEX SECONDS [OFFSET]
    local log=$1 pid=$2 re=$3 left=$(($4 * 4)) off=${5:-0}
    while [ "$left" -gt 0 ]; do
        # (grep reads to the end: with -q, tail and tr die of SIGPIPE on a log longer than a
        # pipe's buffer, and under pipefail the match would not count.)
        tail -c +$((off + 1)) "$log" | tr -d '\r' | grep -aE -- "$re" >/dev/null && return 0
        serial_panicked "$log" && return 1
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.25
        left=$((left - 1))
    done
    return 1
}

# The GPT's sector size where sfdisk names one (every image here has 512).
part_off() {
    sfdisk --json "$1" | jq -r --arg n "$2" '.partitiontable as $t | $t.partitions[] | select(.name == $n) | .start * ($t.sectorsize // 512)'
}
part_size() {
    sfdisk --json "$1" | jq -r --arg n "$2" '.partitiontable as $t | $t.partitions[] | select(.name == $n) | .size * ($t.sectorsize // 512)'
}
# Lower case, sorted, one line: FAT keeps the case of the name systemd-boot wrote.
esp_entries() {
    mdir -b -i "$1@@$(part_off "$1" esp)" ::/loader/entries 2>/dev/null | sed 's|.*/||' | tr 'A-Z' 'a-z' | sort | tr '\n' ' ' | sed 's/ $//'
}
esp_cat() { mtype -i "$1@@$(part_off "$1" esp)" "$2" 2>/dev/null; }

qemu_stop() {
    local w=$1 sig=${2:-TERM} q
    [ -n "$w" ] || return 0
    q=$(ps -o pid=,comm= --ppid "$w" 2>/dev/null | awk '$2 ~ /^qemu-system/ {print $1; exit}')
    [ -n "$q" ] && kill "-$sig" "$q" 2>/dev/null
    local end=$((SECONDS + 10))
    while kill -0 "$w" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.25; done
    kill "$w" 2>/dev/null
    wait "$w" 2>/dev/null
}
