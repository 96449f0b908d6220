#!/usr/bin/env bash
# Remote syslog from a daemon run by hand (`riceguard up --config FILE`, not under init:
# it sends its own log lines), to a Python RFC 5424 collector (ci/lib/syslog_collector.py,
# UDP and TCP octet counting on one port) in a namespace on the gateway's LAN side:
#
#   ns P "phone" (stock wireguard-go, tunnel 10.127.0.2)  10.126.0.2/24
#      | veth
#   ns G "gw": 10.126.0.1/24, riceguard tunnel 10.127.0.1/24, peer `phone` with an
#      endpoint (the gateway initiates: its side logs the handshake), 10.126.1.1/24
#      | veth
#   ns C "collector" 10.126.1.2/24, port 5514
#
# (a) UDP (`Syslog = 10.126.1.2:5514`): the gateway's start-up line and the phone's
#     session line (`session established`, or today's `handshake completed` at the
#     initiator) arrive with a valid RFC 5424 header, app-name `gateway`, the daemon's pid
#     as PROCID, severity info (<30>, facility daemon);
# (b) a reload to `/tcp`: lines now arrive octet-counted over TCP;
# (c) the collector stops; 40 reloads log lines meanwhile into a backlog made small for
#     this test (RG_SYSLOG_BUFFER=4096 bytes instead of 256 KiB); the collector comes back
#     on the same port: first the notice `N messages dropped while the collector was
#     unreachable` (<28>, app-name `syslog`), then the buffered reload lines, the last one
#     included;
# (d) no private key of the lab appears in anything the collector got; every message it
#     got had a valid header.
#
# About 10 s. Needs root, wireguard-go, wireguard-tools, iproute2, python3. Names are
# prefixed `rgy`. riceguard is $RG_BIN (default target/release/riceguard).
# Prints "syslog: N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init syslog
require_rg
require_tools wireguard-go wg ip python3

P=rgyP$$ G=rgyG$$ C=rgyC$$
TUN=rgyw$$ PHONE=rgyp$$
WORK=$(mktemp -d /tmp/rgy-syslog.XXXXXX)
STATUS=/run/riceguard/$TUN.status
CAP=$WORK/capture
at_exit "rm -rf '$WORK'"
at_exit "rm -f /var/run/wireguard/$TUN.sock /var/run/wireguard/$PHONE.sock '$STATUS'"

netns_add $P $G $C
veth_pair $G rgyu0 10.126.0.1/24 $P eth0 10.126.0.2/24
veth_pair $G rgyc0 10.126.1.1/24 $C eth0 10.126.1.2/24
ip -n $G route add default via 10.126.0.2

kg=$(wg genkey) kp=$(wg genkey)
pg=$(echo "$kg" | wg pubkey) pp=$(echo "$kp" | wg pubkey)
CONF=$WORK/riceguard.conf
write_conf() { # write_conf SYSLOG
    cat >"$CONF.new" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.127.0.1/24

[Peer]
Name = phone
PublicKey = $pp
AllowedIPs = 10.127.0.2/32
Endpoint = 10.126.0.2:51820

[Gateway]
InterfaceName = $TUN
Hugepages = off
TcpFallback = off
#5+ Syslog = $1
EOF
    chmod 600 "$CONF.new" && mv "$CONF.new" "$CONF"
}

# ---- the collector ------------------------------------------------------------------------
COLLECTOR=
listening() { inns $C ss -Hltn 'sport = :5514' | grep -q 5514; }
collector_start() {
    spawn ip netns exec $C python3 ci/lib/syslog_collector.py 10.126.1.2 5514 "$CAP"
    COLLECTOR=$!
    check "the collector listens (UDP and TCP 5514)" wait_for 5 listening
}
collector_start

# ---- the phone: stock wireguard-go ------------------------------------------------------
spawn ip netns exec $P env WG_PROCESS_FOREGROUND=1 wireguard-go $PHONE
wait_for 5 test -S /var/run/wireguard/$PHONE.sock
inns $P wg set $PHONE private-key <(echo "$kp") listen-port 51820 \
    peer "$pg" endpoint 10.126.0.1:51820 allowed-ips 10.127.0.0/24
ip -n $P addr add 10.127.0.2/24 dev $PHONE
ip -n $P link set $PHONE up

# ---- the gateway ---------------------------------------------------------------------------
write_conf 10.126.1.2:5514
RG_SYSLOG_BUFFER=4096 RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 \
    >"$WORK/gw.log" 2>&1 &
STARTED=$!
PIDS+=($STARTED)
sleep 0.2
# `ip netns exec` may exec riceguard (same PID) or run it as its child.
if [ "$(readlink /proc/$STARTED/exe)" = "$RG" ]; then RGPID=$STARTED
else RGPID=$(pgrep -P $STARTED | head -1); [ -n "$RGPID" ] && PIDS+=($RGPID); fi
gw_up() { [ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN | grep -q ',UP'; }
if wait_for 10 gw_up && [ -n "$RGPID" ]; then ok "gateway up (riceguard pid $RGPID)"
else ko "gateway did not come up"; tail -20 "$WORK/gw.log"; h_finish; fi

# got PROTO REGEX: the collector got a valid message over PROTO matching REGEX (ERE).
got() { grep -E "^$1 OK " "$CAP" | grep -Eq -- "$2"; }
HDR='<30>1 [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z [!-~]+ gateway '"$RGPID"' - - '

# ---- (a) UDP ---------------------------------------------------------------------------------
echo "--- (a) UDP"
check "UDP: the start-up line (app-name gateway, PROCID the pid, info)" \
    wait_for 10 got udp "$HDR$TUN: up, "
inns $G ping -n -c1 -W1 10.127.0.2 >/dev/null 2>&1 || true
check "the phone answers through the tunnel" wait_for 10 inns $G ping -n -c1 -W1 10.127.0.2
SESSION="$HDR"'peer (phone \()?[A-Za-z0-9+/]{8}\)?:? (session established|handshake completed)'
# `session established` (naming the peer) when the daemon says it, else today's
# initiator line `peer KEY8 handshake completed (we initiated)`.
if wait_for 10 got udp "$SESSION"; then
    line=$(grep -E "^udp OK $SESSION" "$CAP" | grep -m1 'session established' ||
        grep -E -m1 "^udp OK $SESSION" "$CAP")
    ok "UDP: the phone's session line: ${line#* - - }"
else ko "UDP: no session line for the phone"; grep -E 'peer ' "$CAP" | head -5; fi

# ---- (b) TCP -------------------------------------------------------------------------------
echo "--- (b) TCP"
write_conf 10.126.1.2:5514/tcp
kill -HUP "$RGPID"
check "reload to /tcp applied" wait_for 10 grep -q "^reload: generation 1 ok" "$STATUS"
check "TCP: the reload's line arrives octet-counted" \
    wait_for 10 got tcp "$HDR$TUN: configuration reloaded from "

# ---- (c) collector away, backlog, drop notice ---------------------------------------------------
echo "--- (c) the collector stops and comes back"
stop_pid "$COLLECTOR"
before=$(wc -l <"$CAP")
gen=1
for i in $(seq 40); do
    gen=$((gen + 1))
    kill -HUP "$RGPID"
    wait_for 10 grep -q "^reload: generation $gen ok" "$STATUS" || break
done
check "40 reloads while the collector was away (generation $gen)" [ "$gen" = 41 ]
[ "$(wc -l <"$CAP")" = "$before" ] && ok "nothing arrived while it was away" ||
    ko "lines arrived while the collector was stopped"
collector_start
DROPPED='<28>1 [^ ]+ [!-~]+ syslog [0-9]+ - - [0-9]+ messages? dropped while the collector was unreachable'
after() { tail -n +"$((before + 1))" "$CAP"; }
back() { after | grep -Eq "^tcp OK $DROPPED"; }
if wait_for 45 back; then ok "the notice first: $(after | grep -Eo '[0-9]+ messages? dropped.*' | head -1)"
else ko "no drop notice after the collector came back"; after | head -5; fi
first=$(after | grep -E '^tcp OK ' | head -1)
echo "$first" | grep -Eq "$DROPPED" && ok "the drop notice is the first message sent" ||
    ko "first message after the collector came back: $first"
buffered() { [ "$(after | grep -Ec "$HDR$TUN: configuration reloaded from ")" -ge 2 ]; }
check "the buffered reload lines arrive after it" wait_for 15 buffered
# The last reload's line too: the newest are kept, the oldest dropped.
n=$(after | grep -Ec "$HDR$TUN: configuration reloaded from ")
note "$n of the 40 reloads' lines were kept in the 4 KiB backlog"
[ "$n" -lt 40 ] && ok "the backlog stayed bounded (fewer than 40 reload lines kept)" ||
    ko "all 40 reload lines kept: the backlog did not overflow"
said=$(after | grep -Eo '[0-9]+ messages? dropped while' | head -1 | grep -Eo '^[0-9]+')
[ $((${said:-0} + n)) -ge 40 ] && ok "every reload line arrived or was counted ($n + ${said:-0} dropped)" ||
    ko "reload lines lost uncounted: $n arrived, ${said:-0} said dropped"

# ---- (d) secrets, headers -------------------------------------------------------------------------
echo "--- (d) secrets and headers"
if grep -qF -e "$kg" -e "$kp" "$CAP"; then ko "a private key reached the collector"
else ok "no private key of the lab in the $(wc -l <"$CAP") messages the collector got"; fi
if grep -q ' BAD ' "$CAP"; then ko "invalid messages: $(grep ' BAD ' "$CAP" | head -2)"
else ok "every message had a valid RFC 5424 header"; fi
h_finish
