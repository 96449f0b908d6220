#!/usr/bin/env bash
# The Prometheus endpoint (`[Gateway] Metrics = on`) of `riceguard up --config`, scraped by
# Debian's prometheus server, in network namespaces:
#
#   ns P phone 192.0.2.20 (stock wireguard-go) ─┐
#   ns U uplink host 192.0.2.10 ── br0 ─────────┴─ ns G appliance `upl` 192.0.2.2/24,
#                                                   `lanp` 192.168.88.1/24 (two-armed)
#                                                   └─ ns M LAN host 192.168.88.10: prometheus
#                                                      (scrape 192.168.88.1:9586 every 1 s)
#   - the phone's traffic through the tunnel to M; Prometheus's HTTP API then gives
#     riceguard_peer_receive_bytes_total{name="phone"} equal to the appliance's own UAPI
#     rx_bytes for the phone (read before and after a scrape taken after the traffic:
#     r1 <= value <= r2), its health `up` (one-hot) and its packets counted, and the
#     disabled peer `old` is exported with enabled 0;
#   - from the uplink (U) the endpoint does not answer (curl times out) and the firewall's
#     uplink-in counter (riceguard_firewall_drops_total, read from the LAN side) rises;
#   - a malformed request gets 400, a POST 405, another path 404; a client that sends
#     nothing gets 408 after the 5 s head deadline and the endpoint serves meanwhile;
#   - `Metrics = off` + SIGHUP: nothing listens on 9586 and Prometheus marks the target
#     down; back on: it listens again;
#   - `Firewall = off` + SIGHUP: the uplink's connection is accepted by the kernel but closed
#     by the endpoint's own source check (core::firewall::services) without an answer; the
#     LAN side still scrapes;
#   - the daemon stopped: connection refused, Prometheus's `up` is 0.
# Needs root, wireguard-go, wireguard-tools, iproute2, curl, python3, prometheus. Names
# are prefixed rgm. About 25 s.
# Ends with "metrics: N passed, N failed"; exit 1 on failure.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init metrics
require_rg
require_tools wireguard-go wg ip curl python3 prometheus ss

ID=$$
U=rgmU$ID G=rgmG$ID P=rgmP$ID M=rgmM$ID
TUN=rgmt$ID WP=rgmp$ID
PORT=9586
WORK=$(mktemp -d /tmp/rgm-metrics.XXXXXX)
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
ip -n $U addr add 192.0.2.10/24 dev br0
ip -n $M route add default via 192.168.88.1
inns $G sysctl -qw net.ipv4.ip_forward=0

kg=$("$RG" genkey); pg=$(echo "$kg" | "$RG" pubkey)
kp=$(wg genkey); pp=$(echo "$kp" | wg pubkey)
po=$(wg genkey | wg pubkey)
CONF=$WORK/g.conf
# conf METRICS FIREWALL: the appliance's file.
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

[Peer]
Name = old
PublicKey = $po
AllowedIPs = 10.100.0.3/32
Enabled = off

[Gateway]
InterfaceName = $TUN
HugePages = off
Lan = lanp
LanAddress = 192.168.88.1/24
Firewall = $2
Metrics = $1
MetricsPort = $PORT
EOF
    chmod 600 "$CONF.new" && mv "$CONF.new" "$CONF"
}
# reload METRICS FIREWALL: rewrite the file, SIGHUP, the next `reload:` line says ok.
reload() {
    conf "$1" "$2"
    gw_reload "$STATUS" "$GWPID"
}
listening() { [ -n "$(inns $G ss -Hltn "sport = :$PORT")" ]; }

conf on on
spawn env RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 >"$WORK/g.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN 2>/dev/null | grep -q ',UP'"; then
    ok "riceguard up --config is up (pid $GWPID)"
else
    tail -20 "$WORK/g.log"; h_abort "the appliance did not come up"
fi
check "Metrics = on: the endpoint listens on port $PORT" wait_for 5 listening

# The phone: stock wireguard-go on the uplink segment, through the tunnel to M.
spawn ip netns exec $P wireguard-go -f $WP >"$WORK/$WP.log" 2>&1
wait_for 5 test -S /var/run/wireguard/$WP.sock
inns $P wg set $WP private-key <(echo "$kp") peer "$pg" endpoint 192.0.2.2:51820 \
    allowed-ips 10.100.0.0/24,192.168.88.0/24
ip -n $P addr add 10.100.0.2/32 dev $WP
ip -n $P link set $WP mtu 1420 up
ip -n $P route add 10.100.0.0/24 dev $WP
ip -n $P route add 192.168.88.0/24 dev $WP

# Prometheus on the LAN side, scraping the appliance every second.
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: riceguard
    static_configs:
      - targets: ['192.168.88.1:$PORT']
EOF
spawn ip netns exec $M prometheus --config.file="$WORK/prometheus.yml" \
    --storage.tsdb.path="$WORK/tsdb" --web.listen-address=127.0.0.1:9090 >"$WORK/prometheus.log" 2>&1
PROM=$!
# q EXPR: the value of Prometheus's instant query (empty when there is no sample).
q() {
    inns $M curl -s -m 3 -G http://127.0.0.1:9090/api/v1/query --data-urlencode "query=$1" |
        python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null
}
# q_ts EXPR: "TIMESTAMP VALUE" of the sample (scrape time), empty without one.
q_ts() {
    inns $M curl -s -m 3 -G http://127.0.0.1:9090/api/v1/query --data-urlencode "query=timestamp($1)" |
        python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null
}
is_val() { [ "$(q "$1")" = "$2" ]; }
check "Prometheus marks the appliance up (up == 1)" wait_for 20 is_val 'up{job="riceguard"}' 1

n=$(inns $P ping -n -q -c 200 -i 0.005 -s 1200 -W 2 192.168.88.10 2>/dev/null | sed -n 's/.* \([0-9]*\) received.*/\1/p')
[ "${n:-0}" -ge 190 ] && ok "the phone's traffic through the tunnel to M ($n/200 pings of 1200 bytes)" ||
    ko "the phone reaches M: ${n:-0}/200 replies"

# The appliance's own figure (UAPI get, as wg show reads it) around a scrape taken after
# the traffic: the exported value lies between the two readings.
uapi_rx() { inns $G wg show $TUN transfer | awk -v k="$pp" '$1 == k {print $2}'; }
r1=$(uapi_rx); t1=$(date +%s.%N)
after_t1() { local ts; ts=$(q_ts 'riceguard_peer_receive_bytes_total{name="phone"}'); [ -n "$ts" ] && python3 -c "import sys; sys.exit(0 if $ts > $t1 else 1)"; }
wait_for 10 after_t1
v=$(q 'riceguard_peer_receive_bytes_total{name="phone"}')
r2=$(uapi_rx)
phone_tx=$(inns $P wg show $WP transfer | awk '{print $3}')
if [ -n "$v" ] && [ "${r1:-x}" -le "$v" ] 2>/dev/null && [ "$v" -le "${r2:-0}" ] && [ "$v" -ge 240000 ]; then
    ok "Prometheus: riceguard_peer_receive_bytes_total{name=\"phone\"} = $v, the appliance's UAPI rx_bytes $r1..$r2 (the phone's wg show tx: $phone_tx)"
else
    ko "receive bytes: Prometheus '$v', UAPI before $r1 after $r2, the phone's tx $phone_tx"
fi
v=$(q 'riceguard_peer_transmit_bytes_total{name="phone"}')
[ -n "$v" ] && [ "$v" -ge 240000 ] && ok "Prometheus: the phone's transmit bytes ($v)" || ko "transmit bytes: '$v'"
v=$(q 'riceguard_peer_latest_handshake_seconds{name="phone"}')
[ -n "$v" ] && [ "$v" -gt 1600000000 ] && [ "$v" -le "$(date +%s)" ] &&
    ok "Prometheus: the phone's latest handshake is a Unix time ($v)" || ko "latest handshake: '$v'"
check "Prometheus: the phone's transport is udp" is_val 'riceguard_peer_transport{name="phone",transport="udp"}' 1
check "Prometheus: the disabled peer old is exported with enabled 0" is_val 'riceguard_peer_enabled{name="old"}' 0
check "Prometheus: the phone is enabled" is_val 'riceguard_peer_enabled{name="phone"}' 1
check "Prometheus: the phone's health is up (one-hot)" is_val 'riceguard_peer_health{name="phone",state="up"}' 1
check "Prometheus: one health state at a time" is_val 'sum(riceguard_peer_health{name="phone"})' 1
v=$(q 'riceguard_peer_receive_packets_total{name="phone"}')
[ -n "$v" ] && [ "$v" -ge 200 ] && ok "Prometheus: the phone's receive packets ($v)" || ko "receive packets: '$v'"
check "Prometheus: no endpoint address in any label" sh -c "! ip netns exec $M curl -s -m 3 http://192.168.88.1:$PORT/metrics | grep -q '192\\.0\\.2\\.20'"

# ---- the uplink side ------------------------------------------------------------------------
scrape_lan() { inns $M curl -s -m 3 "http://192.168.88.1:$PORT/metrics"; }
# The gateway's own families, read straight from the endpoint.
scrape_lan >"$WORK/scrape.txt"
for re in '^riceguard_worker_cpu_seconds_total\{worker="0"\} [0-9.e+-]+$' \
    '^riceguard_worker_rounds_total\{worker="0"\} [1-9][0-9]*$' \
    '^riceguard_offload_info\{chain="(uso|gso|sendmmsg|single)"\} 1$' \
    '^riceguard_firewall_table_present 1$' '^riceguard_device_drops_total\{cause="malformed"\} [0-9]+$' \
    '^# TYPE riceguard_peer_receive_bytes_total counter$'; do
    grep -Eq "$re" "$WORK/scrape.txt" && ok "the endpoint serves a line matching $re" || ko "no line matching $re"
done
uplink_in() { scrape_lan | sed -n 's/^riceguard_firewall_drops_total{counter="uplink-in"} //p'; }
u0=$(uplink_in)
inns $U curl -s -m 3 -o /dev/null "http://192.0.2.2:$PORT/metrics"
rc=$?
u1=$(uplink_in)
[ "$rc" = 28 ] && ok "from the uplink: the scrape times out (curl exit 28)" || ko "from the uplink: curl exit $rc"
[ -n "$u0" ] && [ "${u1:-0}" -gt "$u0" ] && ok "the uplink's tries count as uplink-in drops ($u0 -> $u1)" ||
    ko "uplink-in: '$u0' -> '$u1'"

# ---- bad requests and a slow client ---------------------------------------------------------
# raw REQUEST: send it from M, print the status line of the answer.
raw() {
    inns $M timeout 10 python3 - "$1" <<'EOF'
import socket, sys
s = socket.create_connection(("192.168.88.1", 9586), timeout=8)
s.sendall(sys.argv[1].encode().decode("unicode_escape").encode("latin-1"))
s.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    out += b
print(out.split(b"\r\n")[0].decode(errors="replace"))
EOF
}
for case in 'garbage\r\n\r\n|400' 'GET /metrics HTTP/9\r\n\r\n|400' 'POST /metrics HTTP/1.1\r\n\r\n|405' \
    'GET /admin HTTP/1.1\r\n\r\n|404'; do
    req=${case%|*} want=${case##*|}
    got=$(raw "$req")
    case $got in "HTTP/1.1 $want "*) ok "request '$req': $got" ;; *) ko "request '$req': '$got' (wanted $want)" ;; esac
done
cat >"$WORK/slow.py" <<'EOF'
import socket, time
s = socket.create_connection(("192.168.88.1", 9586), timeout=15)
t0 = time.monotonic()
s.sendall(b"GET /metr")
out = s.recv(4096)
print("%s after %.0f s" % (out.split(b"\r\n")[0].decode(errors="replace"), time.monotonic() - t0))
EOF
spawn ip netns exec $M timeout 20 python3 "$WORK/slow.py" >"$WORK/slow.out" 2>&1
SLOW=$!
check "a scrape while a slow client holds a connection" sh -c "ip netns exec $M curl -s -m 3 http://192.168.88.1:$PORT/metrics | grep -q '^riceguard_build_info'"
wait $SLOW 2>/dev/null; forget_pid $SLOW
grep -q '^HTTP/1.1 408 ' "$WORK/slow.out" && ok "the slow client: $(cat "$WORK/slow.out") (the 5 s head deadline)" ||
    ko "the slow client: $(cat "$WORK/slow.out")"
check "the endpoint still serves after the bad and slow clients" sh -c "ip netns exec $M curl -s -m 3 http://192.168.88.1:$PORT/metrics | grep -q '^riceguard_peer_receive_bytes_total{name=\"phone\"'"

# ---- Metrics = off, on again ----------------------------------------------------------------
if reload off on; then
    ok "Metrics = off: reloaded"
    check "Metrics = off: nothing listens on $PORT" wait_for 3 sh -c "! ip netns exec $G ss -Hltn 'sport = :$PORT' | grep -q ."
    check "Metrics = off: Prometheus marks the target down (up == 0)" wait_for 10 is_val 'up{job="riceguard"}' 0
else
    ko "Metrics = off: reload failed: $(grep '^reload:' "$STATUS")"
fi
reload on on && check "Metrics = on again: it listens" wait_for 3 listening || ko "Metrics = on: reload failed"

# ---- Firewall = off: the endpoint's own source check ------------------------------------------
if reload on off; then
    ok "Firewall = off: reloaded"
    out=$(inns $U curl -s -m 3 -o /dev/null -w '%{http_code}' "http://192.0.2.2:$PORT/metrics")
    rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 28 ] && [ "$out" = 000 ] &&
        ok "Firewall = off: the uplink's connection is closed at accept, no answer (curl exit $rc)" ||
        ko "Firewall = off: from the uplink curl exit $rc, status '$out'"
    grep -q "metrics: 192.0.2.10 refused" "$WORK/g.log" && ok "the refusal is logged with its source" || ko "no refusal in the log"
    check "Firewall = off: the LAN side still scrapes" sh -c "ip netns exec $M curl -s -m 3 http://192.168.88.1:$PORT/metrics | grep -q '^riceguard_build_info'"
else
    ko "Firewall = off: reload failed: $(grep '^reload:' "$STATUS")"
fi

# ---- the daemon stopped -----------------------------------------------------------------------
stop_pid $GWPID
out=$(inns $M curl -s -m 3 -o /dev/null "http://192.168.88.1:$PORT/metrics" 2>&1)
rc=$?
[ "$rc" = 7 ] && ok "the daemon stopped: connection refused (curl exit 7)" || ko "the daemon stopped: curl exit $rc"
check "the daemon stopped: Prometheus's up is 0" wait_for 10 is_val 'up{job="riceguard"}' 0
note "took $((SECONDS - T0)) s"
h_finish
