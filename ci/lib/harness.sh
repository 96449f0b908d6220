# The Bash labs' one harness (sourced, not run): results, the processes a lab starts,
# the namespaces it creates, and what runs at exit. Every lab in ci/ that is written in
# Bash sources it instead of carrying its own copy:
#
#     . "$(dirname "$0")/lib/harness.sh"
#     h_init fastpath            # the label of the summary line
#     ...
#     spawn ip netns exec "$A" "$RG" -f wg0    # started in the background, PID kept
#     ok "what passed"; ko "what failed"; check "name" cmd args...
#     check "bound" wait_for 20 grep -q bound "$log"   # poll until true, with a deadline
#     inns "$A" ip addr                                 # a command inside a namespace
#     h_finish                   # prints "fastpath: N passed, N failed", exits 0/1
#
# At exit (normal end, error or signal) the harness stops the processes it started, by
# PID only (TERM, then KILL after 2 s), runs the lab's own `at_exit` commands in reverse
# order, and deletes the namespaces made with `netns_add`. Nothing else is touched.

passed=0 failed=0
fails=() notes=() PIDS=() _h_netns=() _h_at_exit=()
_h_label=${0##*/}
_h_label=${_h_label%.sh}

h_init() { _h_label=$1; }

ok() { passed=$((passed + 1)); echo "PASS $*"; }
ko() { failed=$((failed + 1)); fails+=("$*"); echo "FAIL $*"; }
bad() { ko "$@"; }
# check NAME CMD...: PASS when CMD succeeds (its output hidden), else FAIL.
check() { local name=$1; shift; if "$@" >/dev/null 2>&1; then ok "$name"; else ko "$name"; fi; }
# check_rc RC NAME: PASS when RC (a status already taken, e.g. $?) is 0, else FAIL.
check_rc() { if [ "$1" = 0 ]; then ok "$2"; else ko "$2"; fi; }
note() { notes+=("$*"); echo "     $*"; }
skip() { echo "SKIP $*"; }

# The summary line and the exit status; `h_abort MSG` for a lab that cannot go on.
h_summary() {
    local f
    for f in "${fails[@]}"; do echo "failed: $f"; done
    echo "$_h_label: $passed passed, $failed failed"
}
h_finish() { h_summary; [ "$failed" -eq 0 ]; exit; }
h_abort() { ko "$*"; h_finish; }

# require_tools TOOL...: abort naming the missing ones (ci/deps.sh installs them).
require_tools() {
    local t missing=()
    for t in "$@"; do command -v "$t" >/dev/null || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] || h_abort "missing tools: ${missing[*]} (ci/deps.sh installs them)"
}
# require_rg: RG is the release binary (RG_BIN overrides), or abort.
require_rg() {
    RG=$(realpath "${RG_BIN:-target/release/riceguard}" 2>/dev/null)
    [ -x "$RG" ] || h_abort "build riceguard first (cargo build --release -p riceguard)"
}

# wait_for SECONDS CMD...: the one way a lab waits for something to happen: CMD (its
# output hidden) every 0.2 s until it succeeds or SECONDS have passed, then once more at
# the deadline; true when it succeeded. Never a fixed sleep in its place.
wait_for() {
    local end=$((SECONDS + $1))
    shift
    while [ "$SECONDS" -lt "$end" ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    "$@" >/dev/null 2>&1
}
# The daemon's reload generation in its status file $1 (empty before the first reload).
reload_gen() { sed -n 's/^reload: generation \([0-9]*\) .*/\1/p' "$1" 2>/dev/null | tail -1; }
reload_gen_above() { local g; g=$(reload_gen "$1"); [ "${g:-0}" -gt "$2" ]; }
# gw_reload STATUSFILE PID: SIGHUP the daemon PID, then its next `reload:` line within
# 10 s; true when that line says ok.
gw_reload() {
    local before; before=$(reload_gen "$1")
    kill -HUP "$2"
    wait_for 10 reload_gen_above "$1" "${before:-0}" && grep -q '^reload: generation [0-9]* ok' "$1"
}
# inns NS CMD...: CMD inside network namespace NS.
inns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# spawn CMD...: run in the background and own it (PID in PIDS; $! as usual).
spawn() { "$@" & PIDS+=($!); }
# Stop one process we started and forget it (so cleanup never signals a reused PID).
stop_pid() {
    local p=$1 keep=() q
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    PIDS=("${keep[@]}")
}
# A process of ours that ended by itself: reap it and forget it.
forget_pid() {
    local p=$1 keep=() q
    wait "$p" 2>/dev/null
    for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    PIDS=("${keep[@]}")
}
# Stop every process we started (TERM, KILL after 2 s for the ones still there).
stop_all() {
    local p i
    [ ${#PIDS[@]} -gt 0 ] || return 0
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for i in $(seq 20); do
        local alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    PIDS=()
}

# netns_add NAME...: create namespaces (lo up), deleted at exit; aborts if one exists.
netns_add() {
    local n
    for n in "$@"; do
        ip netns add "$n" || h_abort "cannot create namespace $n"
        _h_netns+=("$n")
        ip -n "$n" link set lo up
    done
}
# veth_pair NS1 IF1 CIDR1 NS2 IF2 CIDR2: a veth between two namespaces, addressed and up
# (a CIDR of - leaves that end without an address).
veth_pair() {
    ip link add "$2" netns "$1" type veth peer name "$5" netns "$4" ||
        h_abort "cannot create veth $2/$5"
    [ "$3" = - ] || ip -n "$1" addr add "$3" dev "$2"
    [ "$6" = - ] || ip -n "$4" addr add "$6" dev "$5"
    ip -n "$1" link set "$2" up
    ip -n "$4" link set "$5" up
}
# at_exit CMD...: run CMD at exit (after our processes are stopped), last added first.
at_exit() { _h_at_exit+=("$*"); }

_h_exit() {
    local rc=$? i n
    trap - EXIT
    stop_all
    for ((i = ${#_h_at_exit[@]} - 1; i >= 0; i--)); do
        eval "${_h_at_exit[i]}" >/dev/null 2>&1 || true
    done
    for n in "${_h_netns[@]}"; do ip netns del "$n" 2>/dev/null; done
    exit $rc
}
trap _h_exit EXIT
trap 'exit 130' INT TERM
