#!/usr/bin/env bash
# Peer health, two devices on one key, an endpoint name resolved again, and the daemon's
# event log, with the release binary (`riceguard up --config FILE --event-log DIR`) and
# stock wireguard-go peers in network namespaces on one switch (ns R, bridge br0,
# 10.78.0.0/24; names rgh<X><pid>):
#
#   G  the gateway, uplink 10.78.0.1, tunnel 10.99.0.1/24; peers `phone` (10.99.0.2) and
#      `site` (10.99.0.3, Endpoint = site.rgh.test:51820 from /etc/netns/G/hosts,
#      PersistentKeepalive = 2: the gateway dials the site)
#   P1 the phone, 10.78.0.11 (and, moving, 10.78.0.13); P2 a second phone with the SAME
#      key, 10.78.0.12; S the site, 10.78.0.20 then 10.78.0.21, with no endpoint for the
#      gateway (it only answers, as a site behind a dynamic address does)
#
# (a) up: both peers `up` in the status file's `peers:` line; the phone's session
#     established is a log line naming it;
# (b) the phone moves to .13 and back to .11 (Wi-Fi -> LTE -> Wi-Fi): two endpoint
#     changes, no "two devices";
# (c) P2 with the phone's key pings too: "peer phone is used from 10.78.0.1x and
#     10.78.0.1y: two devices share its key" in the log, the status file, once;
# (d) the site's address moves to .21 and its name with it: handshakes to .20 go
#     unanswered, the name is resolved again, a handshake goes to .21, the site answers
#     and pings cross again — without a restart or reload;
# (e) the daemon stops: its batch is written, and `riceguard log --root DIR` lists the
#     sessions, the endpoint changes, the two devices and the name resolved anew; no
#     private key is in the log or the event log.
# About 40 s. Needs root, wireguard-go, wireguard-tools, iproute2, python3.
# Prints "peer-health: N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init peer-health
require_rg
require_tools wireguard-go wg ip

R=rghR$$ G=rghG$$ P1=rghA$$ P2=rghB$$ S=rghS$$
TUN=rghw$$ PH1=rgha$$ PH2=rghb$$ SITE=rghs$$
WORK=$(mktemp -d /tmp/rgh-peer-health.XXXXXX)
STATUS=/run/riceguard/$TUN.status
at_exit "[ -n \"${RG_KEEP:-}\" ] || rm -rf $WORK; rm -f /var/run/wireguard/$TUN.sock /var/run/wireguard/$PH1.sock /var/run/wireguard/$PH2.sock /var/run/wireguard/$SITE.sock $STATUS /run/riceguard/$TUN.peers"

netns_add $R $G $P1 $P2 $S
ip -n $R link add br0 type bridge
ip -n $R link set br0 up
ip -n $R addr add 10.78.0.254/24 dev br0
i=0
for pair in "$G:10.78.0.1" "$P1:10.78.0.11" "$P2:10.78.0.12" "$S:10.78.0.20"; do
    ns=${pair%%:*} addr=${pair#*:}
    i=$((i + 1))
    ip link add rgh$i netns $R type veth peer name eth0 netns $ns || h_abort "veth"
    ip -n $R link set rgh$i master br0 up
    ip -n $ns addr add $addr/24 dev eth0
    ip -n $ns link set eth0 up
done
ip -n $G route add default via 10.78.0.254

kg=$(wg genkey); kp=$(wg genkey); ks=$(wg genkey)
pg=$(echo "$kg" | wg pubkey); pp=$(echo "$kp" | wg pubkey); ps=$(echo "$ks" | wg pubkey)

mkdir -p /etc/netns/$G "$WORK/perm"
at_exit "rm -rf /etc/netns/$G"
printf '127.0.0.1 localhost\n10.78.0.20 site.rgh.test\n' >/etc/netns/$G/hosts
CONF=$WORK/perm/riceguard.conf
cat >"$CONF" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.99.0.1/24

[Peer]
Name = phone
PublicKey = $pp
AllowedIPs = 10.99.0.2/32

[Peer]
Name = site
PublicKey = $ps
AllowedIPs = 10.99.0.3/32
Endpoint = site.rgh.test:51820
PersistentKeepalive = 2

[Gateway]
InterfaceName = $TUN
HugePages = off
TcpFallback = off
Firewall = off
EOF
chmod 600 "$CONF"

# wgo NS IFACE KEY ADDR [wg set peer args...]: a stock wireguard-go peer.
wgo() {
    local ns=$1 ifc=$2 key=$3 addr=$4
    shift 4
    spawn ip netns exec "$ns" env WG_PROCESS_FOREGROUND=1 wireguard-go "$ifc" >>"$WORK/$ifc.log" 2>&1
    WGOPID=$!
    wait_for 5 test -S /var/run/wireguard/$ifc.sock || h_abort "wireguard-go $ifc did not start"
    ip netns exec "$ns" wg set "$ifc" private-key <(echo "$key") "$@"
    ip -n "$ns" addr add "$addr" dev "$ifc"
    ip -n "$ns" link set "$ifc" up
}
wgo $S $SITE "$ks" 10.99.0.3/24 listen-port 51820 peer "$pg" allowed-ips 10.99.0.0/24
wgo $P1 $PH1 "$kp" 10.99.0.2/24 peer "$pg" endpoint 10.78.0.1:51820 allowed-ips 10.99.0.0/24 persistent-keepalive 1
PH1PID=$WGOPID

RG_LOG=info spawn ip netns exec $G "$RG" up --config "$CONF" --workers 1 --event-log "$WORK/perm" >"$WORK/gw.log" 2>&1
GWPID=$!
check "gateway up" wait_for 10 test -S /var/run/wireguard/$TUN.sock

# ---- (a) both up ---------------------------------------------------------------------------
check "the phone pings the gateway through the tunnel" wait_for 10 ip netns exec $P1 ping -c1 -W1 10.99.0.1
check "the gateway reaches the site it dials by name" wait_for 10 ip netns exec $G ping -c1 -W1 10.99.0.3
check "the status file says both peers are up" wait_for 12 grep -q '^peers: 2 up, 0 idle, 0 stale, 0 never' $STATUS
check "show peers' health file says each is up" bash -c "grep -qx '$pp up' /run/riceguard/$TUN.peers && grep -qx '$ps up' /run/riceguard/$TUN.peers"
check "the log says the phone's session is established, by name" grep -q 'peer phone: session established' "$WORK/gw.log"

# ---- (b) one phone roaming: Wi-Fi -> LTE -> Wi-Fi --------------------------------------------
# A phone changing networks: its app's socket is new (wireguard-go started again, as
# a phone's app rebinds), its address and port too.
move_phone() {
    stop_pid "$PH1PID"
    ip -n $P1 addr del "$1/24" dev eth0
    ip -n $P1 addr add "$2/24" dev eth0
    wgo $P1 $PH1 "$kp" 10.99.0.2/24 peer "$pg" endpoint 10.78.0.1:51820 allowed-ips 10.99.0.0/24 persistent-keepalive 1
    PH1PID=$WGOPID
    wait_for 10 grep -q "peer phone: endpoint changed $1:[0-9]* -> $2:" "$WORK/gw.log"
}
check "the phone moves to 10.78.0.13: endpoint changed" move_phone 10.78.0.11 10.78.0.13
check "and back to 10.78.0.11: endpoint changed" move_phone 10.78.0.13 10.78.0.11
check "one phone moving away and back is not two devices" bash -c "! grep -q 'two devices' '$WORK/gw.log'"

# ---- (c) a second device with the phone's key -----------------------------------------------
wgo $P2 $PH2 "$kp" 10.99.0.2/24 peer "$pg" endpoint 10.78.0.1:51820 allowed-ips 10.99.0.0/24 persistent-keepalive 1
spawn ip netns exec $P2 ping -q -i 0.3 -c 60 -W 1 10.99.0.1
spawn ip netns exec $P1 ping -q -i 0.3 -c 60 -W 1 10.99.0.1
check "two devices on the phone's key are reported, with both addresses" \
    wait_for 20 grep -qE 'peer phone is used from 10\.78\.0\.1[12] and 10\.78\.0\.1[12]: two devices share its key' "$WORK/gw.log"
check "the status file names them" wait_for 6 grep -q '^peer phone is used from .* two devices share its key' $STATUS
check "show peers' health file names both addresses" wait_for 6 bash -c "grep -F '$pp ' /run/riceguard/$TUN.peers | grep -qE ' shared 10\.78\.0\.1[12] 10\.78\.0\.1[12]\$'"
check "said once for the episode" bash -c "[ \$(grep -c 'two devices share its key' '$WORK/gw.log') = 1 ]"

# ---- (d) the site's dynamic address moves, and its name with it --------------------------
ip -n $S addr del 10.78.0.20/24 dev eth0
ip -n $S addr add 10.78.0.21/24 dev eth0
printf '127.0.0.1 localhost\n10.78.0.21 site.rgh.test\n' >/etc/netns/$G/hosts
t0=$SECONDS
# Traffic for the site meanwhile, as a site-to-site link has (bounded).
spawn ip netns exec $G ping -q -i 0.5 -c 120 -W 1 10.99.0.3
check "the name is resolved again once handshakes to the old address go unanswered" \
    wait_for 60 grep -q 'peer site: handshakes to 10.78.0.20:51820 unanswered; its name site.rgh.test now resolves to 10.78.0.21:51820' "$WORK/gw.log"
check "the site answers at its new address and pings cross again, no restart" wait_for 20 ip netns exec $G ping -c1 -W1 10.99.0.3
note "site back after $((SECONDS - t0)) s"
check "its endpoint moved by its answer" wait_for 5 grep -q 'peer site: endpoint changed 10.78.0.20:51820 -> 10.78.0.21:51820' "$WORK/gw.log"
check "the same daemon all along" kill -0 $GWPID

# ---- (e) the event log, written at the stop -------------------------------------------------
check "nothing was written before the 10-minute flush" bash -c "[ ! -s '$WORK/perm/log/events' ]"
stop_pid $GWPID
"$RG" log --root "$WORK/perm" 100 >"$WORK/events.txt" 2>&1
note "event log: $(wc -l <"$WORK/events.txt") lines"
for want in 'gateway peer phone: session established' 'gateway peer site: session established' \
    'gateway peer phone: endpoint changed 10.78.0.11:' 'gateway peer phone is used from' \
    'gateway peer site: handshakes to 10.78.0.20:51820 unanswered; its name site.rgh.test now resolves to 10.78.0.21:51820'; do
    check "riceguard log lists: $want" grep -qF "$want" "$WORK/events.txt"
done
check "riceguard log peer site lists only the site's" bash -c "'$RG' log --root '$WORK/perm' 100 peer site | grep -q 'peer site' && ! '$RG' log --root '$WORK/perm' 100 peer site | grep -q 'peer phone'"
check "no private key in the log or the event log" bash -c "! grep -qF -e '$kg' -e '$kp' -e '$ks' '$WORK/gw.log' '$WORK/perm/log/events'"
h_finish
