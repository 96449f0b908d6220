#!/usr/bin/env bash
# The DNS forwarder of `riceguard up --config` (a thread of the daemon, port 53 of the
# tunnel's and the LAN port's addresses), asked with Debian's dig, in network namespaces:
#
#   ns P phone 192.0.2.20 (stock wireguard-go) ─┐
#   ns U uplink host 192.0.2.10 ── br0 ─────────┴─ ns G appliance `upl` 192.0.2.2/24,
#        dnsmasq 192.0.2.53 (upstream)              `lanp` 192.168.88.1/24 (two-armed)
#        dnslab.py 192.0.2.54 (forging upstream)    └─ ns M LAN host 192.168.88.10
#   - through the tunnel, `dig @10.100.0.1` resolves an upstream name (dnsmasq's), the
#     phone's own name phone.home.arpa, the reverse of 10.100.0.2; over TCP too; an
#     answer too large for UDP comes truncated over UDP and whole over TCP (asked of
#     dnsmasq over TCP); the LAN host asks 192.168.88.1;
#   - an upstream answer naming a tunnel address (rebind.example -> 10.100.0.2) is not
#     passed;
#   - from the uplink: no answer, on the uplink address or routed to the tunnel address,
#     and with `Firewall = off` the resolver's own source check still refuses;
#   - `Dns =` moved to a fake upstream (reload) that answers each query with a forged
#     reply first (a wrong ID, then the right ID from another port) and the real one
#     after: dig gets the real one, and two queries left from two source ports;
#   - a flood of 2 s from the LAN host is cut to its rate while the phone, asking every
#     0.1 s meanwhile, is answered every time.
# Needs root, wireguard-go, wireguard-tools, iproute2, dig (dnsutils), dnsmasq
# (dnsmasq-base), python3. Names are prefixed rgd. About 10 s.
# Ends with "dns: N passed, N failed"; exit 1 on failure.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init dns
require_rg
require_tools wireguard-go wg ip dig dnsmasq python3 curl

ID=$$
U=rgdU$ID G=rgdG$ID P=rgdP$ID M=rgdM$ID
TUN=rgdt$ID WP=rgdp$ID
WORK=$(mktemp -d /tmp/rgd-dns.XXXXXX)
STATUS=/run/riceguard/$TUN.status
T0=$SECONDS
cleanup() {
    rm -f "/var/run/wireguard/$TUN.sock" "/var/run/wireguard/$WP.sock" "$STATUS"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

netns_add $U $G $P $M
ip -n $U link add br0 type bridge && ip -n $U link set br0 up
veth_pair $U ugw - $G upl 192.0.2.2/24
veth_pair $U uph - $P eth0 192.0.2.20/24
veth_pair $G lanp - $M eth0 192.168.88.10/24
for i in ugw uph; do ip -n $U link set $i master br0; done
for a in 192.0.2.10/24 192.0.2.53/24 192.0.2.54/24; do ip -n $U addr add $a dev br0; done
ip -n $M route add default via 192.168.88.1
inns $G sysctl -qw net.ipv4.ip_forward=0

# The upstream: dnsmasq answering two names of its own and nothing else.
spawn ip netns exec $U dnsmasq --keep-in-foreground --no-resolv --no-hosts --bind-interfaces \
    --listen-address=192.0.2.53 --port=53 --conf-file=/dev/null --pid-file="$WORK/dnsmasq.pid" \
    --dhcp-leasefile="$WORK/dnsmasq.leases" --log-facility=- --log-queries \
    --address=/up.example/198.51.100.7 --address=/rebind.example/10.100.0.2 \
    --txt-record=big.example,"$(printf 'a%.0s' $(seq 250))","$(printf 'b%.0s' $(seq 250))","$(printf 'c%.0s' $(seq 250))","$(printf 'd%.0s' $(seq 250))","$(printf 'e%.0s' $(seq 250))","$(printf 'f%.0s' $(seq 250))" \
    >"$WORK/dnsmasq.log" 2>&1
spawn ip netns exec $U python3 ci/lib/dnslab.py upstream 192.0.2.54 "$WORK/fake.log" \
    >"$WORK/fake.out" 2>&1

kg=$("$RG" genkey); pg=$(echo "$kg" | "$RG" pubkey)
kp=$(wg genkey); pp=$(echo "$kp" | wg pubkey)
CONF=$WORK/g.conf
# conf UPSTREAM FIREWALL: the appliance's file.
conf() {
    cat >"$CONF.new" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.100.0.1/24

[Peer]
Name = phone
PublicKey = $pp
AllowedIPs = 10.100.0.2/32

[Gateway]
InterfaceName = $TUN
HugePages = off
Lan = lanp
LanAddress = 192.168.88.1/24
Firewall = $2
Dns = $1
Metrics = on
EOF
    chmod 600 "$CONF.new" && mv "$CONF.new" "$CONF"
}
# reload UPSTREAM FIREWALL: rewrite the file, SIGHUP, the next `reload:` line says ok.
reload() {
    conf "$1" "$2"
    gw_reload "$STATUS" "$GWPID"
}

conf 192.0.2.53 on
spawn env RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 >"$WORK/g.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN 2>/dev/null | grep -q ',UP'"; then
    ok "riceguard up --config is up (pid $GWPID)"
else
    tail -20 "$WORK/g.log"; h_abort "the appliance did not come up"
fi

# The phone: stock wireguard-go on the uplink segment, the tunnel subnet routed into it.
spawn ip netns exec $P wireguard-go -f $WP >"$WORK/$WP.log" 2>&1
wait_for 5 test -S /var/run/wireguard/$WP.sock
inns $P wg set $WP private-key <(echo "$kp") peer "$pg" endpoint 192.0.2.2:51820 \
    allowed-ips 10.100.0.0/24 persistent-keepalive 1
ip -n $P addr add 10.100.0.2/32 dev $WP
ip -n $P link set $WP mtu 1420 up
ip -n $P route add 10.100.0.0/24 dev $WP

# dig_in NS ARGS...: dig's short answer, one try of 1 s.
dig_in() { local ns=$1; shift; inns "$ns" dig +short +time=1 +tries=1 "$@" 2>/dev/null; }
answers() { [ "$(dig_in $P @10.100.0.1 "$1" ${3:-})" = "$2" ]; }
check "the phone, through the tunnel: phone.home.arpa is 10.100.0.2" wait_for 10 answers phone.home.arpa 10.100.0.2
v=$(dig_in $P @10.100.0.1 up.example)
[ "$v" = 198.51.100.7 ] && ok "the phone: up.example from the upstream (dnsmasq): $v" || ko "up.example: '$v'"
v=$(dig_in $P @10.100.0.1 -x 10.100.0.2)
[ "$v" = phone.home.arpa. ] && ok "the phone: the reverse of 10.100.0.2 is $v" || ko "reverse of 10.100.0.2: '$v'"
v=$(dig_in $P @10.100.0.1 -x 10.100.0.1)
[ "$v" = gateway.home.arpa. ] && ok "the phone: the reverse of 10.100.0.1 is $v" || ko "reverse of 10.100.0.1: '$v'"
v=$(dig_in $P @10.100.0.1 +tcp up.example)
[ "$v" = 198.51.100.7 ] && ok "the phone, over TCP: up.example is $v" || ko "TCP up.example: '$v'"
v=$(dig_in $P @10.100.0.1 +tcp phone.home.arpa)
[ "$v" = 10.100.0.2 ] && ok "the phone, over TCP: phone.home.arpa is $v" || ko "TCP phone.home.arpa: '$v'"
# A TXT answer of about 1.5 KB: over UDP the appliance says truncated (the client's 1232
# bytes at most), over TCP it asks dnsmasq again over TCP and passes it whole.
out=$(inns $P dig +time=1 +tries=1 +ignore @10.100.0.1 big.example TXT 2>/dev/null)
echo "$out" | grep -q 'flags: qr[a-z ]* tc' && ok "big.example over UDP: truncated (TC)" ||
    ko "big.example over UDP: $(echo "$out" | grep flags)"
v=$(dig_in $P @10.100.0.1 +tcp big.example TXT | tr -d '" \n' | wc -c)
[ "$v" = 1500 ] && ok "big.example over TCP: all $v characters of its six strings" || ko "big.example over TCP: $v characters"
v=$(inns $P dig +time=1 +tries=1 @10.100.0.1 nobody.home.arpa 2>/dev/null | grep -o 'status: [A-Z]*')
[ "$v" = "status: NXDOMAIN" ] && ok "the phone: nobody.home.arpa is $v" || ko "nobody.home.arpa: '$v'"
v=$(dig_in $M @192.168.88.1 phone.home.arpa)
[ "$v" = 10.100.0.2 ] && ok "the LAN host asks the LAN port's address: phone.home.arpa is $v" || ko "from the LAN: '$v'"

# ---- rebinding ----------------------------------------------------------------------------
out=$(inns $P dig +time=1 +tries=1 @10.100.0.1 rebind.example 2>/dev/null)
if echo "$out" | grep -q 'status: NOERROR' && ! echo "$out" | grep -q '10\.100\.0\.2'; then
    ok "rebind.example: dnsmasq's answer 10.100.0.2 (a tunnel address) is not passed"
else
    ko "rebind.example: $(echo "$out" | grep -E 'status|^rebind')"
fi
grep -q 'rebind.example is 10.100.0.2' "$WORK/dnsmasq.log" && ok "(dnsmasq did answer it with 10.100.0.2)" ||
    ko "dnsmasq's log has no answer for rebind.example"
check "the appliance says so" grep -q 'dns: 1 address record(s) from 192.0.2.53:53 named a tunnel address: dropped' "$WORK/g.log"
# The resolver's counts in the metrics, scraped from the LAN host.
dns_metric() { inns $M curl -s --max-time 3 http://192.168.88.1:9586/metrics | grep -q "^riceguard_dns_events_total{event=\"$1\"} [1-9]"; }
check "metrics: riceguard_dns_events_total counts the rebinding drop" dns_metric rebinding_dropped
check "metrics: ... and the forwarded queries" dns_metric forwarded

# ---- the uplink ---------------------------------------------------------------------------
ip -n $U route add 10.100.0.0/24 via 192.0.2.2
no_answer() { ! inns $U dig +time=1 +tries=1 "$@" >/dev/null 2>&1; }
check "from the uplink: no answer on the uplink address (nothing listens there)" no_answer @192.0.2.2 up.example
check "from the uplink: no answer on the tunnel address (routed to it)" no_answer @10.100.0.1 up.example
check "from the uplink: no answer over TCP" no_answer +tcp @10.100.0.1 up.example
if reload 192.0.2.53 off; then
    ok "Firewall = off: reloaded"
    check "Firewall = off: still no answer from the uplink (the resolver's own source check)" \
        no_answer @10.100.0.1 up.example
    grep -q 'dns: 192.0.2.10 refused' "$WORK/g.log" && ok "the refusal is logged with its source" ||
        ko "no refusal in the log"
    check "Firewall = off: the phone is still answered" answers phone.home.arpa 10.100.0.2
else
    ko "Firewall = off: reload failed: $(grep '^reload:' "$STATUS")"
fi

# ---- forged answers -----------------------------------------------------------------------
if reload 192.0.2.54 on; then
    ok "Dns = 192.0.2.54 (the forging upstream): reloaded"
    v=$(dig_in $P @10.100.0.1 forged.example)
    [ "$v" = 198.51.100.8 ] &&
        ok "a forged reply with a wrong ID, then one from port 5353, then the real one: dig gets $v" ||
        ko "forged.example: '$v' (6.6.6.6: a wrong ID taken; 6.6.6.7: a wrong source taken)"
    v=$(dig_in $P @10.100.0.1 forged2.example)
    [ "$v" = 198.51.100.8 ] && ok "a second name: $v" || ko "forged2.example: '$v'"
    ports=$(sed -n 's/^query port=\([0-9]*\) .*/\1/p' "$WORK/fake.log" | sort -u | wc -l)
    [ "$ports" -ge 2 ] && ok "the forwards left from $ports source ports: $(tr '\n' ' ' <"$WORK/fake.log")" ||
        ko "source ports: $(cat "$WORK/fake.log")"
else
    ko "Dns = 192.0.2.54: reload failed: $(grep '^reload:' "$STATUS")"
fi

# ---- a flood from one client --------------------------------------------------------------
spawn ip netns exec $M timeout 10 python3 ci/lib/dnslab.py flood 192.168.88.1 2 >"$WORK/flood.out" 2>&1
FLOOD=$!
v=$(inns $P timeout 10 python3 ci/lib/dnslab.py ask 10.100.0.1 15 0.1)
wait "$FLOOD" 2>/dev/null; forget_pid $FLOOD
[ "$v" = "answered 15 of 15" ] && ok "during a flood from the LAN host the phone is $v" || ko "the phone during the flood: '$v'"
read -r _ sent _ answered <"$WORK/flood.out"
if [ "${sent:-0}" -gt 1000 ] && [ "${answered:-9999}" -le 300 ]; then
    ok "the flood: $answered answers to $sent queries in 2 s (100 at once, 50 a second)"
else
    ko "the flood: '$(cat "$WORK/flood.out")'"
fi

stop_pid $GWPID
note "took $((SECONDS - T0)) s"
h_finish
