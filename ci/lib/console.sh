# The one driver of a guest's serial console (sourced, after ci/lib/qemu.sh, by the QEMU
# tests that type on it: test-console-qemu.sh, test-generic-board.sh, test-update.sh).
# The console's input is file descriptor 9 (each test opens its FIFO there read-write:
# opening never blocks and QEMU never sees the writer go away); its output is the serial
# log QEMU writes. Which log and which QEMU (or its wrapper) a test drives now:
#
#   con_use LOG PID [TRANSCRIPT]     after each start of QEMU; TRANSCRIPT gets every
#                                    command's output (default: none)
#   con_clean                        the log without CRs (the tty's output processing adds them)
#   con_size                         the log's size in bytes (an offset for con_wait)
#   con_wait REGEX SECONDS [OFFSET]  the log after byte OFFSET matches REGEX (serial_wait:
#                                    false on a panic, when PID ends, or after SECONDS)
#   cmd LINE [SECONDS] [REGEX]       type LINE, wait for the next prompt (or REGEX), the
#                                    output since typing in $out (and the transcript)
#   answer                           $out without the daemon's, init's, DHCP's and the
#                                    kernel's interleaved lines
#   has REGEX / has_line LINE        the answer has a line matching REGEX / equal to LINE
#                                    (LINE as typed: keys hold base64 `+` and `/`)
#   said REGEX / said_line LINE      the same over all of $out, interleaved lines included
#   bad_answer                       the answer's first error or refusal lines
#
# The tests run with `set -o pipefail`, and `grep -q` stops reading at its first match: a
# writer before it with more than a pipe's worth still to write (a serial log, a long
# answer) then dies of SIGPIPE and fails the pipeline although grep matched. So con_clean
# ignores its SIGPIPE and the matchers below read their input to the end.
CON_LOG="" CON_PID="" CON_TRANSCRIPT=/dev/null out=""
CON_PROMPT='riceguard(\(edit\))?# '

con_use() { CON_LOG=$1 CON_PID=$2 CON_TRANSCRIPT=${3:-/dev/null}; }
con_clean() { tr -d '\r' <"$CON_LOG" 2>/dev/null || true; }
con_size() { stat -c %s "$CON_LOG" 2>/dev/null || echo 0; }
con_wait() { serial_wait "$CON_LOG" "$CON_PID" "$@"; }

cmd() {
    local line=$1 secs=${2:-30} re=${3:-$CON_PROMPT} off rc
    off=$(con_size)
    printf '%s\r' "$line" >&9
    con_wait "$re" "$secs" "$off"
    rc=$?
    # The prompt is written before the rest of its line settles (the echo of what the
    # console redraws): a moment for it, so $out ends where the next command starts.
    sleep 0.3
    out=$(tail -c +$((off + 1)) "$CON_LOG" | tr -d '\r')
    printf '%s\n' "$out" >>"$CON_TRANSCRIPT"
    return $rc
}
answer() { printf '%s\n' "$out" | grep -avE '^(gateway|riceguard-init): |^dhcp [^ ]+: |^\[ *[0-9]+\.[0-9]+\]'; }
has() { answer | grep -aE -- "$1" >/dev/null; }
has_line() { answer | grep -axF -- "$1" >/dev/null; }
said() { printf '%s\n' "$out" | grep -aE -- "$1" >/dev/null; }
said_line() { printf '%s\n' "$out" | grep -axF -- "$1" >/dev/null; }
bad_answer() { answer | grep -aE '^error|refused' | head -3; }
