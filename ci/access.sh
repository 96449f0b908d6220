#!/usr/bin/env bash
# Per-client access (`[Peer] Access =`, `[Gateway] ClientIsolation = on`; issue 33 part 1)
# end to end: `riceguard up --config` two-armed, then a second one one-armed, in
# namespaces; stock wireguard-go clients in theirs. Names rgac<X><pid>; traffic only
# between the lab's namespaces.
#
#   ns U uplink router 192.0.2.1 ── br0 ─┬─ ns G appliance `upl` 192.0.2.2/24, tunnel
#     "internet host" 198.51.100.10      │    10.100.0.1/24, `lanp` 192.168.1.1/24 (Lan =)
#     (on U's lo; no route to the        │    └─ ns L LAN host 192.168.1.10: TCP 8096 and
#     tunnel: G masquerades)             │       22 served, answers ping, default via G
#     ns N lanonly  192.0.2.21 ──────────┤  wg 10.100.0.2  Access = lan
#     ns K kiosk    192.0.2.22 ──────────┤  wg 10.100.0.3  Access = 192.168.1.10/32 tcp 8096
#     ns P phone    192.0.2.23 ──────────┤  wg 10.100.0.4  (default Access)
#     ns Q laptop   192.0.2.24 ──────────┤  wg 10.100.0.5  (default Access)
#     ns S site     192.0.2.25 ──────────┘  wg 10.100.0.6  Access = lan, AllowedIPs on G
#          └─ ns B 10.200.0.5 (default via S)               10.100.0.6/32, 10.200.0.0/24
#
#   - every client pings the appliance (ping to the box is always allowed); the resolver on
#     the box (TCP 53) answers the phone and lanonly (it goes with lan), not kiosk;
#   - the phone (default: every zone) reaches L (ping, 8096, 22), the internet host, the
#     metrics endpoint on the box and the laptop: the controls the denials are read against;
#   - lanonly reaches L, and not the internet host even after it sets its own AllowedIPs
#     to 0.0.0.0/0 (`wg set`) and routes it into the tunnel; nor the box's metrics endpoint
#     (no `appliance`), on its tunnel address or its LAN address; nor the phone, while the
#     phone's ping to lanonly is answered (replies always pass); its drop counter rises in
#     `riceguard status` and as riceguard_peer_access_drops_total{name="lanonly"};
#   - kiosk reaches 192.168.1.10:8096 and nothing else there (not 22, not ping), nor the
#     phone; its counter rises; L starts traffic to kiosk (ping, TCP) and gets the answers
#     (what the LAN starts follows the LAN's zone rule);
#   - site: B (10.200.0.5, routed behind the site's wireguard-go) reaches L and not the
#     internet host; L reaches B; the site's counter rises;
#   - `ClientIsolation = on` + SIGHUP: the phone and the laptop no longer reach each other
#     (ping, TCP) either way, each still reaches L, the phone still the internet host; the
#     laptop given `Access = lan, clients` reaches the isolated phone, not the reverse;
#   - one-armed: a second appliance H, uplink 192.168.50.2/24 on a second segment of U
#     (U forwards udp/51821 to it) with LAN host M 192.168.50.10 there; lanonly and the
#     phone move to H (`wg set`): lanonly reaches M (ping, TCP) and not the internet host,
#     the phone both; lanonly's counters on H rise.
# Needs root, wireguard-go, wireguard-tools, iproute2, curl, python3, ping.
# riceguard is $RG_BIN (default target/release/riceguard). About 35 s.
# Prints "access: N passed, N failed"; exit status 1 when anything failed.
# shellcheck disable=SC2317 # the helpers are called through check and wait_for
set -u
cd "$(dirname "$0")/.." || exit 1
. ci/lib/harness.sh
h_init access
require_rg
require_tools wireguard-go wg ip curl python3 ping ss

ID=$$
U=rgacU$ID G=rgacG$ID L=rgacL$ID B=rgacB$ID H=rgacH$ID M=rgacM$ID
N=rgacN$ID K=rgacK$ID P=rgacP$ID Q=rgacQ$ID S=rgacS$ID
TUN=rgacw$ID TUNH=rgach$ID WN=rgacn$ID WK=rgack$ID WP=rgacp$ID WQ=rgacq$ID WS=rgacs$ID
LANH=192.168.1.10 NET=198.51.100.10 BOX=10.100.0.1 PORT=9586
WORK=$(mktemp -d /tmp/rgac-access.XXXXXX)
STATUS=/run/riceguard/$TUN.status
FWP=(python3 ci/lib/fwprobe.py)
T0=$SECONDS
cleanup() {
    local i
    for i in $TUN $TUNH $WN $WK $WP $WQ $WS; do rm -f "/var/run/wireguard/$i.sock"; done
    rm -f "$STATUS" "/run/riceguard/$TUNH.status"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

# ping_ok NS DST: a reply within 8 one-second tries (the first may wait for a handshake).
ping_ok() {
    local i
    for i in $(seq 8); do inns "$1" ping -n -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    return 1
}
# no_ping NS DST: none of 3 echo requests answered (the tunnel is up: the peer answered
# before, so a silence here is the firewall's).
no_ping() { ! inns "$1" ping -n -c3 -i0.3 -W1 "$2" >/dev/null 2>&1; }
listening() { [ -n "$(inns "$1" ss -Hltn "sport = :$2")" ]; }
# serve NS PORT: fwprobe's TCP/UDP echo on [::]:PORT for 100 s.
serve() {
    spawn ip netns exec "$1" timeout 110 "${FWP[@]}" serve "$2" 100 "$WORK/peers.$1.$2"
    wait_for 5 listening "$1" "$2"
}
# probe NS SPEC...: TCP connects all at once, 3 s each; "SPEC RESULT" lines into PROBED
# (open | refused | timeout: dropped | unreachable:ERRNO).
PROBED=
probe() {
    local ns=$1; shift
    PROBED=$(inns "$ns" timeout 20 "${FWP[@]}" probe 3 "$@" 2>&1)
    local l
    while read -r l; do echo "     probe $l"; done <<<"$PROBED"
}
result_of() { awk -v s="$1" '$1 == s {print $2}' <<<"$PROBED"; }
# expect WHO SPEC WANT: one check on a probe's result.
expect() {
    local got; got=$(result_of "$2")
    if [ "$got" = "$3" ]; then ok "$1: $2 $got"; else ko "$1: $2 $got (wanted $3)"; fi
}

# The drop counters of a restricted peer (NAME): the table's own, `access-` and the first
# 8 bytes of its public key in hex (what the firewall counts), and the two the user reads
# by name: riceguard_peer_access_drops_total{name=NAME} and `riceguard status`.
# AP_NS, AP_TUN: the appliance being checked; AP_LAN, AP_ADDR: where its metrics are
# scraped from (its LAN side may) and its address there.
declare -A PEERKEY
key_tag() { echo "$1" | base64 -d | od -An -tx1 | tr -d ' \n' | cut -c1-16; }
nft_drops() {
    inns "$AP_NS" nft list counter inet riceguard "access-$(key_tag "${PEERKEY[$1]}")" 2>/dev/null |
        sed -n 's/.*packets \([0-9]*\).*/\1/p' | head -1
}
# From the metrics endpoint:
scrape_drops() {
    inns "$AP_LAN" curl -s -m 3 "http://$AP_ADDR:$PORT/metrics" |
        sed -nE "s/^riceguard_peer_access_drops_total\{(.*,)?name=\"$1\"(,.*)?\} ([0-9]+)$/\3/p" | head -1
}
# From `riceguard status`: "client access drops: N (kiosk 17, phone 3)", the daemon's
# status file, rewritten about once a second.
status_drops() {
    inns "$AP_NS" "$RG" status "$AP_TUN" 2>/dev/null | grep '^client access drops:' |
        grep -oE "[(, ]$1 [0-9]+" | grep -oE '[0-9]+$' | head -1
}
above() { local v; v=$("$1" "$2"); [ -n "$v" ] && [ "$v" -gt "$3" ]; }
# drops_before NAME: its three counts now, for `rises`.
declare -A D0
drops_before() {
    local c
    for c in nft_drops scrape_drops status_drops; do D0[$c.$1]=$("$c" "$1"); done
    note "$1's drops before: table '${D0[nft_drops.$1]}', metrics '${D0[scrape_drops.$1]}', status '${D0[status_drops.$1]}'"
}
# rises NAME: each of its counts went above what drops_before saw (absent counts as 0).
rises() {
    local c what v
    for c in nft_drops scrape_drops status_drops; do
        case $c in
            nft_drops) what="the table's counter access-$(key_tag "${PEERKEY[$1]}")" ;;
            scrape_drops) what="riceguard_peer_access_drops_total{name=\"$1\"}" ;;
            status_drops) what="riceguard status, its count in 'client access drops:'" ;;
        esac
        if wait_for 5 above "$c" "$1" "${D0[$c.$1]:-0}"; then
            ok "$1: $what rose (${D0[$c.$1]:-none} -> $("$c" "$1"))"
        else
            v=$("$c" "$1")
            [ "$c" = status_drops ] && v="$v; its drop lines: $(inns "$AP_NS" "$RG" status "$AP_TUN" 2>&1 | grep -iE 'drop|access' | head -3 | tr '\n' '|')"
            ko "$1: $what did not rise: '${D0[$c.$1]:-}' -> '$v'"
        fi
    done
}

# ---- the namespaces --------------------------------------------------------------------------
netns_add $U $G $L $N $K $P $Q $S $B $H $M
ip -n $U link add br0 type bridge && ip -n $U link set br0 up
ip -n $U addr add 192.0.2.1/24 dev br0
ip -n $U addr add $NET/32 dev lo
veth_pair $U ug - $G upl 192.0.2.2/24
ip -n $U link set ug master br0
ip -n $G route add default via 192.0.2.1
# Forwarding off and rp_filter off: the daemon must turn forwarding on, and only the
# firewall can stop anything.
inns $G sysctl -qw net.ipv4.ip_forward=0 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
veth_pair $G lanp - $L eth0 $LANH/24
ip -n $L route add default via 192.168.1.1
i=21
for n in $N $K $P $Q $S; do
    veth_pair $U u$i - "$n" eth0 192.0.2.$i/24
    ip -n $U link set u$i master br0
    i=$((i + 1))
done
veth_pair $S sb 10.200.0.1/24 $B eth0 10.200.0.5/24
ip -n $B route add default via 10.200.0.1
inns $S sysctl -qw net.ipv4.ip_forward=1

# ---- the appliance ------------------------------------------------------------------------
kg=$("$RG" genkey); pg=$(echo "$kg" | "$RG" pubkey)
declare -A KEY PUB
for w in $WN $WK $WP $WQ $WS; do KEY[$w]=$(wg genkey); PUB[$w]=$(echo "${KEY[$w]}" | wg pubkey); done
PEERKEY=([lanonly]=${PUB[$WN]} [kiosk]=${PUB[$WK]} [phone]=${PUB[$WP]} [laptop]=${PUB[$WQ]} [site]=${PUB[$WS]})
CONF=$WORK/g.conf
# conf ISOLATION [LAPTOP_ACCESS]: the appliance's file.
conf() {
    cat >"$CONF.new" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = $BOX/24

[Peer]
Name = lanonly
PublicKey = ${PUB[$WN]}
AllowedIPs = 10.100.0.2/32
Access = lan

[Peer]
Name = kiosk
PublicKey = ${PUB[$WK]}
AllowedIPs = 10.100.0.3/32
Access = $LANH/32 tcp 8096

[Peer]
Name = phone
PublicKey = ${PUB[$WP]}
AllowedIPs = 10.100.0.4/32

[Peer]
Name = laptop
PublicKey = ${PUB[$WQ]}
AllowedIPs = 10.100.0.5/32
${2:+Access = $2}

[Peer]
Name = site
PublicKey = ${PUB[$WS]}
AllowedIPs = 10.100.0.6/32, 10.200.0.0/24
Access = lan

[Gateway]
InterfaceName = $TUN
HugePages = off
Lan = lanp
LanAddress = 192.168.1.1/24
Metrics = on
MetricsPort = $PORT
ClientIsolation = $1
EOF
    chmod 600 "$CONF.new" && mv "$CONF.new" "$CONF"
}
# reload ISOLATION [LAPTOP_ACCESS]: rewrite the file, SIGHUP, the next `reload:` line
# says ok.
reload() {
    conf "$@"
    gw_reload "$STATUS" "$GWPID"
}

AP_NS=$G AP_TUN=$TUN AP_LAN=$L AP_ADDR=192.168.1.1
conf off
spawn env RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 >"$WORK/g.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN 2>/dev/null | grep -q ',UP'"; then
    ok "riceguard up --config is up, two-armed (pid $GWPID)"
else
    tail -20 "$WORK/g.log"; h_abort "the appliance did not come up"
fi

# ---- the clients: stock wireguard-go, AllowedIPs the tunnel and the LAN (as `add client`
# gives a two-armed box's clients), routes as wg-quick would make them -----------------------
# client NS IF ADDR [ALLOWED]: up, with a route for each allowed prefix.
client() {
    local ns=$1 wif=$2 addr=$3 allowed=${4:-10.100.0.0/24,192.168.1.0/24} a
    spawn ip netns exec "$ns" wireguard-go -f "$wif" >"$WORK/$wif.log" 2>&1
    wait_for 5 test -S "/var/run/wireguard/$wif.sock" || return 1
    inns "$ns" wg set "$wif" private-key <(echo "${KEY[$wif]}") peer "$pg" \
        endpoint 192.0.2.2:51820 allowed-ips "$allowed" || return 1
    ip -n "$ns" addr add "$addr/32" dev "$wif" &&
        ip -n "$ns" link set "$wif" mtu 1420 up || return 1
    for a in ${allowed//,/ }; do ip -n "$ns" route add "$a" dev "$wif" || return 1; done
}
check "client lanonly up (wireguard-go)" client $N $WN 10.100.0.2
check "client kiosk up" client $K $WK 10.100.0.3
check "client phone up, also routing the internet host's subnet" client $P $WP 10.100.0.4 10.100.0.0/24,192.168.1.0/24,198.51.100.0/24
check "client laptop up" client $Q $WQ 10.100.0.5
check "site peer up, AllowedIPs 0.0.0.0/0, routing the LAN and the internet host for B" \
    client $S $WS 10.100.0.6 10.100.0.0/24,192.168.1.0/24,198.51.100.0/24
inns $S wg set $WS peer "$pg" allowed-ips 0.0.0.0/0

serve $L 8096; serve $L 22; serve $U 8096; serve $Q 8096; serve $K 7000; serve $P 7000
for w in lanonly:$N kiosk:$K phone:$P laptop:$Q site:$S; do
    check "${w%%:*}: pings the appliance $BOX (ping to the box is always allowed)" ping_ok "${w#*:}" $BOX
done

# ---- the controls: a default client reaches every zone ----------------------------------------
echo "--- the phone (default Access)"
check "phone: pings LAN host $LANH" ping_ok $P $LANH
check "phone: pings the internet host $NET (masqueraded out of the uplink)" ping_ok $P $NET
check "phone: pings the laptop" ping_ok $P 10.100.0.5
probe $P tcp:$LANH:8096 tcp:$LANH:22 tcp:$NET:8096 tcp:$BOX:$PORT tcp:$BOX:53 tcp:10.100.0.5:8096
for s in tcp:$LANH:8096 tcp:$LANH:22 tcp:$NET:8096 tcp:$BOX:$PORT tcp:$BOX:53 tcp:10.100.0.5:8096; do expect phone "$s" open; done

# ---- lanonly: Access = lan --------------------------------------------------------------------
echo "--- lanonly (Access = lan)"
drops_before lanonly
check "lanonly: pings LAN host $LANH" ping_ok $N $LANH
inns $N wg set $WN peer "$pg" allowed-ips 0.0.0.0/0
ip -n $N route add 198.51.100.0/24 dev $WN
check "lanonly with its own AllowedIPs 0.0.0.0/0: no reply from the internet host $NET" no_ping $N $NET
check "lanonly: no reply from the phone 10.100.0.4 (no clients)" no_ping $N 10.100.0.4
check "the phone's ping to lanonly is answered (replies pass)" ping_ok $P 10.100.0.2
probe $N tcp:$LANH:8096 tcp:$LANH:22 tcp:$NET:8096 tcp:$BOX:$PORT tcp:192.168.1.1:$PORT tcp:10.100.0.4:7000 tcp:$BOX:53
expect lanonly tcp:$LANH:8096 open
expect lanonly tcp:$LANH:22 open
expect "lanonly, the box's resolver (goes with lan)" tcp:$BOX:53 open
expect "lanonly (AllowedIPs 0.0.0.0/0)" tcp:$NET:8096 timeout
expect "lanonly, the box's metrics (no appliance)" tcp:$BOX:$PORT timeout
expect "lanonly, the box's metrics on its LAN address" tcp:192.168.1.1:$PORT timeout
expect "lanonly, the phone (no clients)" tcp:10.100.0.4:7000 timeout
rises lanonly

# ---- kiosk: Access = 192.168.1.10/32 tcp 8096 --------------------------------------------------
echo "--- kiosk (Access = $LANH/32 tcp 8096)"
drops_before kiosk
probe $K tcp:$LANH:8096 tcp:$LANH:22 tcp:10.100.0.4:7000 tcp:$BOX:$PORT tcp:$BOX:53
expect kiosk tcp:$LANH:8096 open
expect "kiosk, the box's resolver (neither lan nor internet)" tcp:$BOX:53 timeout
expect kiosk tcp:$LANH:22 timeout
expect "kiosk, the phone" tcp:10.100.0.4:7000 timeout
expect "kiosk, the box's metrics" tcp:$BOX:$PORT timeout
check "kiosk: no reply from LAN host $LANH to ping (only tcp 8096)" no_ping $K $LANH
rises kiosk
echo "--- the LAN starts traffic to the restricted kiosk"
check "L pings kiosk 10.100.0.3 (the LAN's zone rule; kiosk's replies pass)" ping_ok $L 10.100.0.3
got=$(inns $L timeout 10 "${FWP[@]}" tcp-check 10.100.0.3 7000)
if [ "$got" = ok ]; then ok "TCP L -> kiosk 10.100.0.3:7000: line echoed"; else ko "TCP L -> kiosk: $got"; fi

# ---- site: Access = lan, a subnet behind the peer ---------------------------------------------
echo "--- site (Access = lan, 10.200.0.0/24 behind it)"
drops_before site
check "B 10.200.0.5 (behind the site peer) pings LAN host $LANH" ping_ok $B $LANH
check "L pings B 10.200.0.5" ping_ok $L 10.200.0.5
check "B: no reply from the internet host $NET" no_ping $B $NET
probe $B tcp:$LANH:8096 tcp:$NET:8096
expect "B (site)" tcp:$LANH:8096 open
expect "B (site)" tcp:$NET:8096 timeout
rises site

# ---- ClientIsolation = on ----------------------------------------------------------------------
echo "--- ClientIsolation = on"
if reload on; then
    ok "ClientIsolation = on: reloaded"
else
    ko "ClientIsolation = on: reload failed: $(grep '^reload:' "$STATUS")"
fi
drops_before phone
check "isolated: no reply from the laptop to the phone" no_ping $P 10.100.0.5
check "isolated: no reply from the phone to the laptop" no_ping $Q 10.100.0.4
probe $P tcp:10.100.0.5:8096 tcp:$LANH:8096 tcp:$NET:8096
expect "phone, isolated" tcp:10.100.0.5:8096 timeout
expect "phone, isolated" tcp:$LANH:8096 open
expect "phone, isolated" tcp:$NET:8096 open
probe $Q tcp:10.100.0.4:7000 tcp:$LANH:8096
expect "laptop, isolated" tcp:10.100.0.4:7000 timeout
expect "laptop, isolated" tcp:$LANH:8096 open
check "isolated: the phone pings LAN host $LANH" ping_ok $P $LANH
check "isolated: the laptop pings LAN host $LANH" ping_ok $Q $LANH
rises phone
# A client granted `clients` may start a connection to an isolated one, which answers.
if reload on "lan, clients"; then
    ok "the laptop gets Access = lan, clients (isolation on): reloaded"
else
    ko "the laptop's Access = lan, clients: reload failed: $(grep '^reload:' "$STATUS")"
fi
check "the laptop (Access clients) pings the isolated phone" ping_ok $Q 10.100.0.4
check "the isolated phone still gets no reply from the laptop" no_ping $P 10.100.0.5
probe $Q tcp:10.100.0.4:7000
expect "laptop (Access clients) to the isolated phone" tcp:10.100.0.4:7000 open

note "riceguard status (access lines):"
inns $G "$RG" status $TUN 2>&1 | grep -iE 'access|isolat|lanonly|kiosk|site' | sed 's/^/     | /'

# ---- one-armed: the uplink's own subnet is the LAN -------------------------------------------
# A second appliance H on U's second segment 192.168.50.0/24 (U routes it and forwards
# udp/51821 on its client side to H's WireGuard port); M 192.168.50.10 is a host of that LAN
# (default via U, no route to the tunnel). lanonly and the phone move to H by `wg set`.
echo "--- one-armed: lan is the uplink's own subnet 192.168.50.0/24"
LANM=192.168.50.10
ip -n $U link add br1 type bridge && ip -n $U link set br1 up
ip -n $U addr add 192.168.50.1/24 dev br1
veth_pair $U uh - $H upl 192.168.50.2/24
veth_pair $U um - $M eth0 $LANM/24
for i in uh um; do ip -n $U link set $i master br1; done
ip -n $H route add default via 192.168.50.1
ip -n $M route add default via 192.168.50.1
inns $U sysctl -qw net.ipv4.ip_forward=1
inns $U nft -f - <<'EOF'
table ip rgacnat {
    chain pre { type nat hook prerouting priority -100; iifname "br0" udp dport 51821 dnat to 192.168.50.2:51820; }
}
EOF
kh=$("$RG" genkey); ph=$(echo "$kh" | "$RG" pubkey)
cat >"$WORK/h.conf" <<EOF
[Interface]
PrivateKey = $kh
ListenPort = 51820
Address = $BOX/24

[Peer]
Name = lanonly
PublicKey = ${PUB[$WN]}
AllowedIPs = 10.100.0.2/32
Access = lan

[Peer]
Name = phone
PublicKey = ${PUB[$WP]}
AllowedIPs = 10.100.0.4/32

[Gateway]
InterfaceName = $TUNH
HugePages = off
Metrics = on
MetricsPort = $PORT
EOF
chmod 600 "$WORK/h.conf"
spawn env RG_LOG=info ip netns exec $H "$RG" up --config "$WORK/h.conf" --workers 1 >"$WORK/h.log" 2>&1
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUNH.sock ] && ip -n $H -o link show $TUNH 2>/dev/null | grep -q ',UP'"; then
    ok "one-armed: riceguard up --config is up (pid $!)"
else
    tail -20 "$WORK/h.log"; ko "one-armed: the appliance did not come up"
fi
AP_NS=$H AP_TUN=$TUNH AP_LAN=$M AP_ADDR=192.168.50.2
for w in $WN:$N $WP:$P; do
    inns "${w#*:}" wg set "${w%%:*}" peer "$pg" remove peer "$ph" endpoint 192.0.2.1:51821 allowed-ips 0.0.0.0/0
    ip -n "${w#*:}" route add 192.168.50.0/24 dev "${w%%:*}"
done
serve $M 8096
check "one-armed: the phone pings the appliance" ping_ok $P $BOX
check "one-armed: lanonly pings the appliance" ping_ok $N $BOX
drops_before lanonly
check "one-armed: the phone pings LAN host $LANM" ping_ok $P $LANM
check "one-armed: the phone pings the internet host $NET" ping_ok $P $NET
check "one-armed: lanonly pings LAN host $LANM" ping_ok $N $LANM
check "one-armed: lanonly (AllowedIPs 0.0.0.0/0): no reply from the internet host $NET" no_ping $N $NET
probe $P tcp:$LANM:8096 tcp:$NET:8096
expect "phone, one-armed" tcp:$LANM:8096 open
expect "phone, one-armed" tcp:$NET:8096 open
probe $N tcp:$LANM:8096 tcp:$NET:8096
expect "lanonly, one-armed" tcp:$LANM:8096 open
expect "lanonly, one-armed" tcp:$NET:8096 timeout
rises lanonly
note "took $((SECONDS - T0)) s"
h_finish
