#!/usr/bin/env bash
# The SNTP client (the clock never goes back, nor far ahead on one server's word): `riceguard ntp --dry-run` in a client namespace
# against scripted servers (ci/lib/sntp_server.py) in a server namespace. Dry run: the
# client keeps a virtual clock and never sets the host's, so each case reads its
# decisions from its log and state file:
#   - a good answer 5 min ahead: stepped (the first sync), `riceguard status` says
#     `source: ntp ...`; two servers saying the same: one step, the other slewed;
#   - kiss-o'-death DENY: that server is not asked again; RATE: polled less often; nothing
#     stepped;
#   - LI = 3 (unsynchronised): not used;
#   - one server 30 days ahead: refused (a far step needs two servers);
#   - two configured servers 30 days ahead agreeing: stepped;
#   - a server 1 h behind us: refused (never backward);
#   - the same far answer from DHCP's servers (option 42 in a lease file): refused;
#   - a configured name whose two addresses (or two names, one address each: all come
#     from the uplink's resolver, here /etc/netns/CLI/hosts) both say ten years ahead:
#     refused, one source however many addresses, and `riceguard status` says why.
# The host clock is checked unchanged. About 40 s. Needs root, iproute2, python3. Names
# are prefixed `rgn`. Ends with "ntp: N passed, N failed"; exit 1 on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init ntp

require_rg
require_tools ip python3

SRV=rgn-srv-$$ CLI=rgn-cli-$$
tmp=$(mktemp -d /tmp/rgn-ntp.XXXXXX)
at_exit rm -rf "$tmp"

log_has() { grep -q -- "$2" "$1"; }
queries() { grep -c "^query $1 " "$tmp/server.log" 2>/dev/null || true; }

netns_add $SRV $CLI
veth_pair $SRV rgnv0 10.123.0.1/24 $CLI rgnv1 10.123.0.2/24
for i in 11 12 13 14 15 16 17 18 19; do ip -n $SRV addr add 10.123.0.$i/24 dev rgnv0; done

spawn ip netns exec $SRV python3 ci/lib/sntp_server.py --log "$tmp/server.log" \
    10.123.0.1=offset=300 10.123.0.11=kiss=DENY 10.123.0.12=kiss=RATE 10.123.0.13=li=3 \
    10.123.0.14=offset=2592000 10.123.0.15=offset=2592000.5 10.123.0.16=offset=-3600 10.123.0.17=offset=300 \
    10.123.0.18=offset=315360000 10.123.0.19=offset=315360000.5 \
    >"$tmp/server.out" 2>&1
check "SNTP server ready" wait_for 10 log_has "$tmp/server.out" ready

# The client's resolver: `ip netns exec` binds /etc/netns/CLI/hosts over /etc/hosts.
mkdir -p /etc/netns/$CLI
at_exit "rm -rf /etc/netns/$CLI"
printf '127.0.0.1 localhost\n10.123.0.18 ntp.example\n10.123.0.19 ntp.example\n10.123.0.18 ntp-a.example\n10.123.0.19 ntp-b.example\n' \
    >/etc/netns/$CLI/hosts

host_before=$(date +%s)
# run_case NAME SECONDS ARGS...: the client until it logs a decision (at most SECONDS).
run_case() {
    local name=$1 secs=$2; shift 2
    mkdir -p "$tmp/$name"
    spawn env RG_LOG=debug ip netns exec $CLI "$RG" ntp --dry-run --run-dir "$tmp/$name" "$@" \
        >"$tmp/$name.log" 2>&1
    local pid=$!
    wait_for "$secs" grep -qE "stepped the clock|slewing|refused:|not used|kiss-o'-death" "$tmp/$name.log"
    sleep 1
    stop_pid $pid
    note "$name: $(grep -E "stepped|slewing|refused|not used|kiss" "$tmp/$name.log" | head -2 | tr '\n' ' ')"
}

run_case good 10 --server 10.123.0.1 --event-log "$tmp/good"
check "good answer: the first sync steps the clock +300 s" log_has "$tmp/good.log" "ntp: 10.123.0.1:123: stepped the clock +5 min to "
check "dry run says the clock is not changed" log_has "$tmp/good.log" "dry run: the clock is not changed"
check "the step is in the event log" bash -c "'$RG' log --root '$tmp/good' | grep -q ' ntp clock stepped +5 min by 10.123.0.1:123 (dry run'"
check "state file names the server of the last sync" log_has "$tmp/good/clock" "^sync [0-9]* 10.123.0.1:123"
st=$(RG_RUN_DIR="$tmp/good" "$RG" status 2>/dev/null | head -1)
note "status: $st"
check "riceguard status begins with the clock line, source ntp" bash -c "[[ '$st' == 'clock: '*'(source: ntp 10.123.0.1:123, last sync '*' s ago)' ]]"

run_case two 8 --server 10.123.0.1 --server 10.123.0.17
sleep 1
check "two servers asked at once, 5 min ahead: one step, the other answer slewed (the step is not made twice)" \
    bash -c "[ \$(grep -c 'stepped the clock' '$tmp/two.log') = 1 ] && grep -q 'slewing the clock [-+]0\.' '$tmp/two.log'"

run_case kiss 6 --server 10.123.0.11 --server 10.123.0.12
sleep 2
check "DENY: said, and the server not asked again" log_has "$tmp/kiss.log" "10.123.0.11:123: kiss-o'-death DENY: not asking it again"
check "DENY server asked exactly once" [ "$(queries 10.123.0.11)" = 1 ]
check "RATE: polled less often (once in the run)" log_has "$tmp/kiss.log" "10.123.0.12:123: kiss-o'-death RATE: polling it less often"
check "RATE server asked once (next in 128 s)" [ "$(queries 10.123.0.12)" = 1 ]
check "kisses change nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/kiss.log'"
check "state: the DENY server is dropped (1 server in use)" log_has "$tmp/kiss/clock" "^servers 1$"

run_case unsync 6 --server 10.123.0.13
check "LI=3: answer not used" log_has "$tmp/unsync.log" "10.123.0.13:123: answer not used: the server says its clock is unsynchronised"
check "LI=3 changes nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/unsync.log'"

run_case far1 6 --server 10.123.0.14
check "one server 30 days ahead: refused, saying why" log_has "$tmp/far1.log" "10.123.0.14:123: refused: its time is 30 d past the boot floor: a step over 24 h needs two"
check "far single server changes nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/far1.log'"
st=$(RG_RUN_DIR="$tmp/far1" "$RG" status 2>/dev/null | head -1)
check "status: no sync (source not ntp)" bash -c "[[ '$st' == *'no sync yet from 1 NTP server'* ]]"

run_case far2 8 --server 10.123.0.14 --server 10.123.0.15
wait_for 5 log_has "$tmp/far2.log" "stepped the clock"
check "two configured servers agreeing 30 days ahead: stepped" log_has "$tmp/far2.log" "stepped the clock +30 d .*(two servers agree)"

run_case back 6 --server 10.123.0.16
check "a server 1 h behind: refused (never backward)" log_has "$tmp/back.log" "10.123.0.16:123: refused: our clock is 60 min ahead of it"

printf 'address 10.123.0.2/24\nserver 10.123.0.1\nntp 10.123.0.14 10.123.0.15\nlease 120\nt1 60\nt2 105\nobtained 1\n' >"$tmp/lease.rgnv1"
run_case dhcp 8 --lease "$tmp/lease.rgnv1"
sleep 2
check "option 42 servers are asked" bash -c "grep -q 'servers 10.123.0.14:123 (dhcp)' '$tmp/dhcp.log'"
check "DHCP's servers 30 days ahead, even agreeing: refused" log_has "$tmp/dhcp.log" "refused: its time is 30 d past the boot floor: servers from DHCP may not step"
check "DHCP's far answers change nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/dhcp.log'"

# Both answers of a case are in when two decisions are logged.
two_decisions() { [ "$(grep -cE 'stepped the clock|slewing|refused:' "$1")" -ge 2 ]; }
run_case dns1 8 --server ntp.example
wait_for 5 two_decisions "$tmp/dns1.log"
check "a name resolving to two addresses (ntp.example is 10.123.0.18:123, 10.123.0.19:123)" \
    bash -c "grep -q 'ntp.example is 10.123.0.1[89]:123, 10.123.0.1[89]:123' '$tmp/dns1.log'"
check "one name, two addresses ten years ahead agreeing: both refused, the uplink's DNS is one source" \
    bash -c "[ \$(grep -c 'refused: its time is 3650 d past the boot floor: addresses from the uplink.s DNS are one source' '$tmp/dns1.log') = 2 ]"
check "one name's far answers change nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/dns1.log'"
st=$(RG_RUN_DIR="$tmp/dns1" "$RG" status 2>/dev/null | head -1)
note "status: $st"
behind_why() { [[ $1 == *'no sync yet from 2 NTP servers: 10.123.0.1'[89]':123 (ntp.example) refused: '*'give two `gateway ntp` servers as IP addresses'* ]]; }
check "status: behind, and why (a far step needs two \`gateway ntp\` IP addresses)" behind_why "$st"

run_case dns2 8 --server ntp-a.example --server ntp-b.example
wait_for 5 two_decisions "$tmp/dns2.log"
check "two names, one address each, ten years ahead agreeing: both refused" \
    bash -c "[ \$(grep -c 'refused: its time is 3650 d past the boot floor: addresses from the uplink.s DNS are one source' '$tmp/dns2.log') = 2 ]"
check "two names' far answers change nothing" bash -c "! grep -q 'stepped\|slewing' '$tmp/dns2.log'"

host_after=$(date +%s)
check "the host clock was not touched" [ $((host_after - host_before)) -ge 0 -a $((host_after - host_before)) -lt 300 ]
h_finish
