#!/usr/bin/env bash
# The console over SSH (`riceguard ssh --root DIR`) with Debian's OpenSSH client: the
# server in one namespace over a saved configuration written by `riceguard console` in a
# temporary DIR, the client in another over a veth pair (sources 10.124.0.2, .3, .4):
#   - with a console password set, a key login is not asked for it: it runs `show status`
#     as a command and exits 0; a script on stdin with a
#     failing command (`frobnicate`) exits non-zero with the good commands' output there;
#   - an unknown key is refused and the server logs its fingerprint and source; password
#     authentication is refused (publickey is all that is offered); a login name other
#     than admin is refused and logged;
#   - a session's console is killed when its client's connection goes;
#   - two SSH sessions at once: B commits while A edits, A's
#     commit is refused naming B's console and source, A discards and redoes it;
#     `show status` says which session saved the file, from where;
#   - `add client x` over SSH prints a wg-quick configuration; a plain `commit` of the
#     SSH port over SSH is refused (the console knows it serves an SSH session);
#   - a script ending with `commit-confirm 5` exits at once (0) saying when it rolls back,
#     and `ssh box confirm` confirms it; a `commit-confirm 1` that moves the port (cutting
#     the operator off) rolls back by itself at the deadline plus the 10 s grace, done by
#     the server's watcher with no console left, and the old port takes a login again;
#   - `export configuration` over SSH prints an age text that Debian's `age -d` opens;
#   - the README's Ansible playbook (raw module) runs as written and commits;
#   - a source neither in the tunnel nor in the server's own subnet is refused at accept
#     (the server's own check, core::firewall::services; no firewall in this lab);
#   - a `--deny-source` address is closed at once, and counted in the log;
#   - the host key the server prints is ssh-keygen's fingerprint of what ssh-keyscan
#     sees, and stays the same after a restart (StrictHostKeyChecking=yes passes);
#   - 200 half-open connections from one source: 4 are held, the rest closed at accept,
#     and a key login from another source works meanwhile; a connection that never logs
#     in is closed after the 20 s grace;
#   - the server runs niced (10) and off the configuration's `Cores`;
#   - no key in the saved configuration: nothing listens; a committed key starts it, a
#     deleted one stops it (the file is re-read every 2 s); a logged-in session whose key
#     is deleted ends; the export imported on another box's console and committed gives
#     that box's running server the first one's host key (known_hosts passes), no restart.
# About 75 s (the commit-confirm's minute runs beside the other checks). Needs root, iproute2, python3, openssh-client, age. Names are prefixed `rgs`.
# Ends with "ssh: N passed, N failed"; exit 1 on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init ssh

require_rg
require_tools ip python3 ssh ssh-keygen ssh-keyscan ss age ansible-playbook

SRV=rgs-srv-$$ CLI=rgs-cli-$$
S=10.124.0.1 PORT=2222
tmp=$(mktemp -d /tmp/rgs-ssh.XXXXXX)
at_exit rm -rf "$tmp"

netns_add $SRV $CLI
veth_pair $SRV rgsv0 $S/24 $CLI rgsv1 10.124.0.2/24
ip -n $CLI addr add 10.124.0.3/24 dev rgsv1
ip -n $CLI addr add 10.124.0.4/24 dev rgsv1

ssh-keygen -q -t ed25519 -N '' -C alice@lab -f "$tmp/alice"
ssh-keygen -q -t ed25519 -N '' -C mallory@lab -f "$tmp/mallory"
fp_of() { ssh-keygen -lf "$1" | awk '{print $2}'; }

# console DIR < commands: the configuration console over DIR; commits signal no daemon.
console() {
    "$RG" console --root "$1" --pidfile "$tmp/none.pid" --status-file "$tmp/none.status" \
        --socket "$tmp/none.sock"
}
root=$tmp/root
mkdir -p "$root"
# The data plane's cores (`Cores`): the last online CPU; the server keeps off it.
DP=$(($(nproc) - 1))
printf '%s\n' "set interface address 10.100.0.1/24" "set interface listen-port 51820" \
    "set gateway public-endpoint $S:51820" "set system ssh-key alice $(cat "$tmp/alice.pub")" "set gateway ssh-port $PORT" \
    "set gateway cores $DP" commit |
    console "$root" >"$tmp/setup.out" 2>&1
check "the saved configuration has the key (written by the console)" \
    grep -q "^#4+ SshKey = alice ssh-ed25519" "$root/riceguard.conf"
# A console password: the consoles on the box ask for it, a key login does not.
printf '%s\n' "set system console-password" "lab-console-pass-1" "lab-console-pass-1" |
    console "$root" >>"$tmp/setup.out" 2>&1
echo "show history" | console "$root" >"$tmp/local.out" 2>&1
[ $? != 0 ] && grep -q "wrong password" "$tmp/local.out" &&
    ok "the console password is set (a local script without it is refused)" ||
    ko "console password: $(cat "$tmp/setup.out" "$tmp/local.out")"

# server DIR LOG [ARGS]: `riceguard ssh` in the server namespace (its PID in $!).
server() {
    local dir=$1 log=$2; shift 2
    spawn ip netns exec $SRV "$RG" ssh --root "$dir" --pidfile "$tmp/none.pid" \
        --status-file "$tmp/none.status" --socket "$tmp/none.sock" "$@" >"$log" 2>&1
}
listening() { inns $SRV ss -Hltn "sport = :$1" | grep -q LISTEN; }
server "$root" "$tmp/server1.log" --deny-source 10.124.0.4/32
srv=$!
check "the server listens on [::]:$PORT" wait_for 10 listening $PORT
# Niced and off the data plane's cores (with more than one CPU online).
nice_of=$(ps -o ni= -p $srv | tr -d ' ')
cpus_of=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$srv/status)
if [ "$DP" -ge 1 ]; then
    [ "$nice_of" = 10 ] && [ "$cpus_of" = "0-$((DP - 1))" -o "$cpus_of" = "0" ] &&
        ok "the server runs niced (10) on CPU $cpus_of, off the data plane's $DP" ||
        ko "server nice $nice_of, CPUs $cpus_of (data plane: $DP)"
else
    [ "$nice_of" = 10 ] && ok "the server runs niced (10) (one CPU: nowhere else to go)" || ko "server nice $nice_of"
fi

# A commit-confirm that cuts the session rolls back on time, with no console left: over SSH,
# the port moved and `commit-confirm 1` on a third box (root3, port 2225); the session ends
# at once, the server follows the saved port (2226: the operator is cut off); 60 s later
# plus the consoles' 10 s grace, the server's own watcher rolls it back, and 2225 takes a
# login again. Started here, checked at the end (the other checks run meanwhile).
root3=$tmp/root3
mkdir -p "$root3"
printf '%s\n' "set interface listen-port 51820" "set system ssh-key alice $(cat "$tmp/alice.pub")" \
    "set gateway ssh-port 2225" commit | console "$root3" >"$tmp/setup3.out" 2>&1
server "$root3" "$tmp/server4.log"
srv4=$!
if wait_for 10 listening 2225; then
    t_cut=$SECONDS
    printf 'set gateway ssh-port 2226\ncommit-confirm 1\n' |
        timeout 15 ip netns exec $CLI ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
            -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o ConnectTimeout=5 -p 2225 -T \
            -i "$tmp/alice" admin@$S >"$tmp/cut.out" 2>&1
    check_rc $? "over SSH: the port moved with commit-confirm 1 (the session exits at once)"
    check "the server follows the saved port: the operator is cut off from 2225" wait_for 6 listening 2226
else
    ko "the third server did not listen: $(cat "$tmp/server4.log")"
fi

# The 20 s login grace, measured beside the other checks: one connection that reads the
# banner and sends nothing.
cat >"$tmp/grace.py" <<'EOF'
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.settimeout(40)
t0 = time.monotonic()
banner = s.recv(256)
try:
    while s.recv(256):
        pass
except OSError:
    pass
print("banner=%r closed_after=%.1f" % (banner[:20], time.monotonic() - t0))
EOF
spawn ip netns exec $CLI python3 "$tmp/grace.py" "$S" "$PORT" >"$tmp/grace.out" 2>&1
grace=$!

KH=$tmp/known_hosts
# sshc ARGS...: the OpenSSH client in the client namespace, non-interactive, 10 s at most.
sshc() {
    timeout 15 ip netns exec $CLI ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
        -o UserKnownHostsFile="$KH" -o ConnectTimeout=5 -p $PORT "$@"
}
fp=$(sed -n 's/^ssh: host key \(SHA256:[^ ]*\) (ED25519).*/\1/p' "$tmp/server1.log")
[ -n "$fp" ] && ok "the server said its host key ($fp)" || ko "no host key line in the server log"
inns $CLI ssh-keyscan -T 5 -p $PORT -t ed25519 $S 2>/dev/null >"$tmp/keyscan"
[ -n "$fp" ] && [ "$(fp_of "$tmp/keyscan")" = "$fp" ] &&
    ok "ssh-keygen -lf of the scanned host key is the fingerprint the server said" ||
    ko "host key: server said '$fp', ssh-keyscan gives '$(fp_of "$tmp/keyscan")'"

sshc -o StrictHostKeyChecking=accept-new -i "$tmp/alice" admin@$S 'show status' >"$tmp/status.out" 2>&1
rc=$?
check_rc $rc "a key login runs 'show status' and exits 0"
grep -q "^console: ssh-[0-9]*:alice" "$tmp/status.out" &&
    ok "the session is a console named ssh-N:alice" || ko "no 'console: ssh-N:alice' in: $(head -c 600 "$tmp/status.out")"

printf 'show candidate\nfrobnicate\nshow history\n' |
    sshc -T -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S >"$tmp/script.out" 2>&1
rc=$?
[ $rc != 0 ] && ok "a script with a failing command exits non-zero ($rc)" || ko "a script with 'frobnicate' exited 0"
grep -q "^Address = 10.100.0.1/24" "$tmp/script.out" && grep -q "no saved versions yet" "$tmp/script.out" &&
    grep -q "unknown command .frobnicate." "$tmp/script.out" &&
    ok "the script's good commands answered around the failing one" || ko "script output: $(head -c 600 "$tmp/script.out")"

# Interactive: a terminal (ssh -tt), the console's prompt and line editing; `exit` ends it.
(printf 'show history\r'; sleep 1; printf 'exit\r') |
    sshc -tt -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S >"$tmp/tty.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "no saved versions yet" "$tmp/tty.out" && grep -q "riceguard console: .help. lists the commands" "$tmp/tty.out" &&
    ok "on a terminal: the console's greeting, a command, exit ends the session (0)" ||
    ko "terminal session: rc $rc: $(head -c 600 "$tmp/tty.out")"

sshc -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S 'add client x' >"$tmp/client.out" 2>&1
grep -q '^\[Interface\]' "$tmp/client.out" && grep -q '^PrivateKey = ' "$tmp/client.out" &&
    grep -q '^\[Peer\]' "$tmp/client.out" &&
    ok "'add client x' over SSH prints a wg-quick configuration" || ko "add client over SSH: $(head -c 600 "$tmp/client.out")"

# Two SSH sessions editing at once, under the consoles' rules (the serial console's side of
# them: console::session's tests): A (held open, fed line by line) edits; B commits
# meanwhile; A's commit is refused naming B's console and source; `show status` says who
# saved the file, from where.
mkfifo "$tmp/a.in"
# Read-write: opening never blocks, and closing it is A's end of input.
exec 7<>"$tmp/a.in"
# (not `spawn`: a function's background command gets /dev/null as its standard input)
ip netns exec $CLI timeout 40 ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
    -o UserKnownHostsFile="$KH" -o StrictHostKeyChecking=yes -p $PORT -T -b 10.124.0.2 -i "$tmp/alice" \
    admin@$S <"$tmp/a.in" >"$tmp/a.out" 2>&1 7>&- &
sa=$!
PIDS+=($sa)
printf 'set gateway client-dns 192.0.2.11\nshow candidate\n' >&7
if wait_for 10 grep -q "^ClientDns = 192.0.2.11" "$tmp/a.out"; then
    printf 'set gateway client-dns 192.0.2.22\ncommit\n' |
        sshc -T -o StrictHostKeyChecking=yes -b 10.124.0.3 -i "$tmp/alice" admin@$S >"$tmp/b.out" 2>&1
    check_rc $? "session B commits while session A has uncommitted edits"
    echo commit >&7
    check "A's commit is refused, naming B's console and source" \
        wait_for 10 grep -q "not committed: the saved configuration changed since this console loaded it: console ssh-[0-9]*:alice from 10.124.0.3 committed" "$tmp/a.out"
    printf 'discard\nset gateway client-dns 192.0.2.11\ncommit\n' >&7
fi
exec 7>&-
wait_for 10 bash -c "! kill -0 $sa 2>/dev/null"
grep -q "^ClientDns = 192.0.2.11" "$root/riceguard.conf" &&
    ok "after discard, A's redone edit commits" || ko "two sessions: A: $(tail -c 600 "$tmp/a.out") B: $(tail -c 300 "$tmp/b.out")"
forget_pid $sa
# (asked over SSH: the box's console is in its wrong-password delay from the check above)
sshc -o StrictHostKeyChecking=yes -b 10.124.0.3 -i "$tmp/alice" admin@$S 'show status' >"$tmp/both.out" 2>&1
grep -q "^saved: committed on ssh-[0-9]*:alice from 10.124.0.2 " "$tmp/both.out" &&
    grep -q "^console: ssh-[0-9]*:alice (over SSH from 10.124.0.3)" "$tmp/both.out" &&
    ok "show status says which session saved the file and from where, and its own source" ||
    ko "show status on the box: $(head -c 800 "$tmp/both.out")"

# A session's console ends with its connection: a terminal session whose client is killed.
terminals() { grep -c "(terminal) for" "$tmp/server1.log"; }
more_terminals() { [ "$(terminals)" -gt "$n0" ]; }
no_console() { ! pgrep -f -- "--name $1 " >/dev/null; }
n0=$(terminals)
spawn ip netns exec $CLI ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile="$KH" \
    -o StrictHostKeyChecking=yes -p $PORT -tt -i "$tmp/alice" admin@$S >"$tmp/killed.out" 2>&1
client=$!
if wait_for 10 more_terminals; then
    name=$(grep "(terminal) for" "$tmp/server1.log" | tail -1 | sed -n 's/.*console \(ssh-[^ ]*\) .*/\1/p')
    check "its console runs ($name)" wait_for 5 pgrep -f -- "--name $name "
    stop_pid $client
    check "the console is gone once the client's connection is" wait_for 5 no_console "$name"
else
    ko "no terminal session started: $(cat "$tmp/killed.out")"
    stop_pid $client
fi

# No remote lock-out: over SSH a plain commit of the SSH port is refused (the console
# knows it serves an SSH session, and from where).
printf 'set gateway ssh-port 2224\ncommit\n' |
    sshc -T -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S >"$tmp/lockout.out" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "commit-confirm" "$tmp/lockout.out" && grep -q "^#4+ SshPort = $PORT" "$root/riceguard.conf" &&
    ok "over SSH a plain commit of the SSH port is refused (use commit-confirm)" ||
    ko "remote lock-out: rc $rc: $(head -c 600 "$tmp/lockout.out")"

# A commit-confirm from a script: the session does not wait for the deadline, says it,
# and a later `ssh box confirm` confirms it.
t0=$SECONDS
printf 'set gateway client-dns 192.0.2.53\ncommit-confirm 5\n' |
    sshc -T -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S >"$tmp/cc.out" 2>&1
rc=$?
[ $rc = 0 ] && [ $((SECONDS - t0)) -le 10 ] && grep -q "commit-confirm pending: it rolls back in" "$tmp/cc.out" &&
    ok "a script ending with a commit-confirm pending exits at once (0) and says when it rolls back" ||
    ko "commit-confirm over SSH: rc $rc after $((SECONDS - t0)) s: $(head -c 600 "$tmp/cc.out")"
sshc -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S confirm >"$tmp/confirm.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "confirmed" "$tmp/confirm.out" && grep -q "^ClientDns = 192.0.2.53" "$root/riceguard.conf" &&
    ok "'ssh box confirm' confirms it from another session" || ko "confirm over SSH: rc $rc: $(head -c 600 "$tmp/confirm.out")"

# A backup over SSH that Debian's age opens (the passphrase typed on a pty by age_tty.py).
EXPORT_PASS='lab export passphrase'
printf 'export configuration\n%s\n%s\n' "$EXPORT_PASS" "$EXPORT_PASS" |
    sshc -T -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S >"$tmp/export.out" 2>&1
rc=$?
sed -n '/^-----BEGIN AGE ENCRYPTED FILE-----$/,/^-----END AGE ENCRYPTED FILE-----$/p' "$tmp/export.out" >"$tmp/backup.age"
if [ $rc = 0 ] && [ -s "$tmp/backup.age" ]; then
    ok "'export configuration' over SSH prints an age text ($(wc -l <"$tmp/backup.age") lines)"
    AGE_TTY_PASSPHRASE=$EXPORT_PASS timeout 30 python3 gateway/core/tests/fixtures/age/age_tty.py \
        age -d -o "$tmp/backup.txt" "$tmp/backup.age" >"$tmp/age.out" 2>&1
    grep -q "^riceguard-export 1$" "$tmp/backup.txt" 2>/dev/null &&
        grep -q "^#4+ SshKey = alice ssh-ed25519" "$tmp/backup.txt" && grep -q "^host-key ed25519 " "$tmp/backup.txt" &&
        ok "Debian's age -d opens it: the saved configuration and the host key are in it" ||
        ko "age -d: $(cat "$tmp/age.out") $(head -c 300 "$tmp/backup.txt" 2>/dev/null)"
else
    ko "export over SSH: rc $rc: $(head -c 600 "$tmp/export.out")"
fi

# Ansible's raw module, with the README's playbook as written (the inventory names this
# lab's server and port): the change is committed.
if command -v ansible-playbook >/dev/null; then
    mkdir -p "$tmp/ansible"
    printf '[gateways]\n%s ansible_user=admin ansible_port=%s\n' "$S" "$PORT" >"$tmp/ansible/inventory"
    sed -n '/^    - hosts: gateways$/,/^            commit$/p' README.md | sed 's/^    //' >"$tmp/ansible/play.yml"
    grep -q "ansible.builtin.raw" "$tmp/ansible/play.yml" || ko "the README's playbook was not found"
    HOME=$tmp/ansible ANSIBLE_HOST_KEY_CHECKING=False timeout 60 ip netns exec $CLI ansible-playbook \
        -i "$tmp/ansible/inventory" --private-key "$tmp/alice" \
        --ssh-common-args "-F /dev/null -o IdentitiesOnly=yes -o UserKnownHostsFile=$KH" \
        "$tmp/ansible/play.yml" >"$tmp/ansible.out" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q "^ClientDns = 192.168.88.1" "$root/riceguard.conf" &&
        ok "the README's Ansible playbook (raw module) runs as written and commits" ||
        ko "ansible: rc $rc: $(tail -c 800 "$tmp/ansible.out")"
else
    ko "ansible-playbook is not installed (ci/deps.sh installs ansible-core)"
fi

# The server's own source check: an address of neither the tunnel nor the server's
# subnet (routed to it, no firewall here) is refused at accept.
ip -n $CLI addr add 10.125.0.9/32 dev rgsv1
ip -n $SRV route add 10.125.0.9/32 dev rgsv0
sshc -o StrictHostKeyChecking=yes -b 10.125.0.9 -i "$tmp/alice" admin@$S 'show status' >"$tmp/outside.out" 2>&1
[ $? = 255 ] && ok "a source outside the tunnel and the uplink's own subnet is refused" ||
    ko "outside source: $(cat "$tmp/outside.out")"
check "the server says why" wait_for 5 grep -q "connection from 10.125.0.9 refused: .*not from the tunnel or the uplink's own subnet" "$tmp/server1.log"

sshc -o StrictHostKeyChecking=yes -i "$tmp/mallory" admin@$S 'show status' >"$tmp/mallory.out" 2>&1
[ $? = 255 ] && grep -q "Permission denied (publickey)" "$tmp/mallory.out" &&
    ok "an unknown key is refused" || ko "unknown key: $(cat "$tmp/mallory.out")"
mfp=$(fp_of "$tmp/mallory.pub")
check "the server logged the refused key's fingerprint and source" \
    wait_for 5 grep -q "key $mfp (ssh-ed25519) from 10.124.0.2 refused" "$tmp/server1.log"

sshc -o StrictHostKeyChecking=yes -o PreferredAuthentications=password -o PubkeyAuthentication=no \
    admin@$S 'show status' >"$tmp/password.out" 2>&1
[ $? = 255 ] && grep -q "Permission denied (publickey)" "$tmp/password.out" &&
    ok "password authentication is refused (publickey is the only method)" || ko "password: $(cat "$tmp/password.out")"

sshc -o StrictHostKeyChecking=yes -i "$tmp/alice" root@$S 'show status' >"$tmp/root.out" 2>&1
[ $? = 255 ] && ok "a login name other than admin is refused" || ko "root login: $(cat "$tmp/root.out")"
check "the server logged the refused login name" grep -q "login as .root. from 10.124.0.2 refused" "$tmp/server1.log"

t0=$SECONDS
sshc -o StrictHostKeyChecking=yes -b 10.124.0.4 -i "$tmp/alice" admin@$S 'show status' >"$tmp/deny.out" 2>&1
rc=$?
[ $rc = 255 ] && [ $((SECONDS - t0)) -le 3 ] && ok "a --deny-source address is closed at once" ||
    ko "deny-source: rc $rc after $((SECONDS - t0)) s: $(cat "$tmp/deny.out")"
check "the refused source is counted in the log" \
    wait_for 5 grep -q "connection from 10.124.0.4 refused: .*a --deny-source range ([0-9]* refused so far)" "$tmp/server1.log"

# 200 half-open connections from .2 (connect, send nothing), held while .3 logs in.
cat >"$tmp/flood.py" <<'EOF'
import socket, sys, time, select
host, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
socks = []
deadline = time.monotonic() + 10
for _ in range(200):
    s = socket.socket()
    s.bind(("10.124.0.2", 0))
    s.settimeout(5)
    try:
        s.connect((host, port))
        socks.append(s)
    except OSError:
        s.close()
# Which ones the server closed (EOF before any banner) and which got a banner.
time.sleep(1)
closed = banner = 0
for s in socks:
    s.setblocking(False)
    try:
        d = s.recv(64)
        if d.startswith(b"SSH-"):
            banner += 1
        elif d == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("connected=%d banner=%d closed=%d" % (len(socks), banner, closed), flush=True)
open(ready, "w").close()
time.sleep(max(0, deadline - time.monotonic()))
EOF
spawn ip netns exec $CLI python3 "$tmp/flood.py" "$S" "$PORT" "$tmp/flood.ready" >"$tmp/flood.out" 2>&1
flood=$!
if wait_for 15 test -e "$tmp/flood.ready"; then
    read -r _ b c < <(tr '=' ' ' <"$tmp/flood.out" | awk '{print $2, $4, $6}')
    [ "${b:-0}" -le 4 ] && [ "${c:-0}" -ge 190 ] &&
        ok "200 half-open connections from one source: $b held, $c closed at accept" ||
        ko "flood: $(cat "$tmp/flood.out")"
    sshc -o StrictHostKeyChecking=yes -b 10.124.0.3 -i "$tmp/alice" admin@$S 'show history' >"$tmp/other.out" 2>&1
    check_rc $? "meanwhile a key login from another source works"
else
    ko "the flood did not finish: $(cat "$tmp/flood.out")"
fi
stop_pid $flood

# The grace connection, started first, was closed by the server at about 20 s.
if wait_for 25 grep -q closed_after "$tmp/grace.out"; then
    after=$(sed -n 's/.*closed_after=\([0-9]*\).*/\1/p' "$tmp/grace.out")
    grep -q "banner=b'SSH-2.0-riceguard" "$tmp/grace.out" && [ "$after" -ge 17 ] && [ "$after" -le 25 ] &&
        ok "a connection that does not log in is closed after the 20 s grace (${after} s)" ||
        ko "grace: $(cat "$tmp/grace.out")"
else
    ko "the idle connection was not closed within 25 s more: $(cat "$tmp/grace.out")"
fi
forget_pid $grace

# The host key across a restart: the known_hosts entry from the first run still matches.
stop_pid $srv
server "$root" "$tmp/server2.log"
srv=$!
check "the restarted server listens" wait_for 10 listening $PORT
grep -q "ssh: host key $fp (ED25519)" "$tmp/server2.log" && ! grep -q "made now" "$tmp/server2.log" &&
    ok "the restarted server has the same host key" || ko "server2: $(head -3 "$tmp/server2.log")"
sshc -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S 'show status' >/dev/null 2>&1
check_rc $? "StrictHostKeyChecking=yes passes after the restart"
stop_pid $srv

# No key: nothing listens; a committed key starts the listener, deleting it stops it.
root2=$tmp/root2
mkdir -p "$root2"
printf '%s\n' "set interface listen-port 51820" "set gateway ssh-port 2223" commit |
    console "$root2" >"$tmp/setup2.out" 2>&1
server "$root2" "$tmp/server3.log"
srv=$!
if wait_for 5 grep -q "no SSH key in the saved configuration: not listening" "$tmp/server3.log"; then
    ! listening 2223 && ok "no key in the configuration: nothing listens" || ko "port 2223 listens without a key"
else
    ko "server3 did not start: $(cat "$tmp/server3.log")"
fi
echo "set system ssh-key alice $(cat "$tmp/alice.pub")
commit" | console "$root2" >>"$tmp/setup2.out" 2>&1
check "a committed key starts the listener (within the 2 s re-read)" wait_for 6 listening 2223

# A deleted key ends the sessions logged in with it (not only the next login): bob holds a
# terminal session open; his key is deleted on another console; his connection ends.
ssh-keygen -q -t ed25519 -N '' -C bob@lab -f "$tmp/bob"
echo "set system ssh-key bob $(cat "$tmp/bob.pub")
commit" | console "$root2" >>"$tmp/setup2.out" 2>&1
logged_in_bob() { grep -q "logged in from 10.124.0.2 with key bob" "$tmp/server3.log"; }
spawn ip netns exec $CLI timeout 30 ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
    -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -p 2223 -tt -i "$tmp/bob" admin@$S \
    < <(sleep 28) >"$tmp/bob.out" 2>&1
bob=$!
if wait_for 10 logged_in_bob; then
    echo "delete system ssh-key bob
commit" | console "$root2" >>"$tmp/setup2.out" 2>&1
    check "bob's session ends once his key is deleted (within the 2 s re-read)" wait_for 8 bash -c "! kill -0 $bob 2>/dev/null"
    check "the server says whose session it ended and why" \
        grep -q "the session of key bob from 10.124.0.2 ended: the key is no longer in the saved configuration" "$tmp/server3.log"
    timeout 15 ip netns exec $CLI ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o ConnectTimeout=5 \
        -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -p 2223 -i "$tmp/alice" admin@$S 'show history' \
        >"$tmp/alice2.out" 2>&1
    check_rc $? "alice, whose key stays, still logs in" || cat "$tmp/alice2.out"
else
    ko "bob did not log in: $(cat "$tmp/bob.out")"
fi
stop_pid $bob

echo "delete system ssh-key alice
commit" | console "$root2" >>"$tmp/setup2.out" 2>&1
check "deleting the last key stops it" wait_for 6 bash -c "! ip netns exec $SRV ss -Hltn 'sport = :2223' | grep -q LISTEN"

# An import's host key reaches the running server: the first box's export (above) imported
# into root2 and committed on a local console; without a restart, new connections get the
# first box's host key (the first known_hosts passes) on the imported port, with its key.
if [ -s "$tmp/backup.age" ]; then
    { echo "import configuration"; cat "$tmp/backup.age"; echo "$EXPORT_PASS"; echo commit; } |
        console "$root2" >"$tmp/import2.out" 2>&1
    grep -q "^#4+ SshPort = $PORT" "$root2/riceguard.conf" &&
        ok "the export imported and committed on another box's console" || ko "import: $(tail -c 600 "$tmp/import2.out")"
    check "the running server takes the imported host key (and says so)" \
        wait_for 8 grep -q "ssh: host key $fp (ED25519), replacing SHA256:" "$tmp/server3.log"
    check "it listens on the imported port" wait_for 6 listening $PORT
    sshc -o StrictHostKeyChecking=yes -i "$tmp/alice" admin@$S 'show status' >"$tmp/imported.out" 2>&1
    check_rc $? "StrictHostKeyChecking=yes with the first box's known_hosts passes"
else
    skip "import's host key: no export to import"
fi
stop_pid $srv

# The cut session's commit-confirm (started at the top): rolled back by the server's
# watcher at the deadline (60 s) plus the 10 s grace, re-read every 2 s.
if [ -n "${t_cut:-}" ]; then
    back_on_2225() { listening 2225 && grep -q "^#4+ SshPort = 2225" "$root3/riceguard.conf"; }
    if wait_for $((t_cut + 90 - SECONDS)) back_on_2225; then
        ok "the cut session's commit-confirm rolled back by itself $((SECONDS - t_cut)) s after it (1 min + 10 s grace)"
        check "the server says it rolled it back" grep -q "ssh: .*rolled back" "$tmp/server4.log"
        timeout 15 ip netns exec $CLI ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes \
            -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o ConnectTimeout=5 -p 2225 \
            -i "$tmp/alice" admin@$S 'show status' >"$tmp/back.out" 2>&1
        check_rc $? "the operator logs in on the old port again"
    else
        ko "no rollback 90 s after the cut: $(grep -a 'ssh:' "$tmp/server4.log" | tail -5)"
    fi
fi
stop_pid $srv4

h_finish
