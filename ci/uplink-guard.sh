#!/usr/bin/env bash
# The uplink cannot redirect the tunnel (a lease or RA never shadows a tunnel route), end to end with the release
# binary (`riceguard up --config FILE`, `riceguard console --root DIR`) in namespaces:
#
#   ns R "router" br0 192.168.1.1/24, fd00:251::1/64, fd00:99::1/64 (dnsmasq: RAs only)
#     ├─ ns G appliance `upl` 192.168.1.2/24 (as a lease gives it) + 10.251.1.50/24 (an
#     │    old address in a remote site's subnet), default via 192.168.1.1; tunnel
#     │    `Address = 192.168.1.250/24`: numbered from the LAN's own subnet
#     ├─ ns L LAN host 192.168.1.10 (a peer in the configuration claims it too)
#     └─ ns K LAN host 192.168.1.3 (talked to the appliance: in its neighbour table)
#   Peers: rtr 192.168.1.1/32 (the router's address), squat 192.168.1.10/32, site-b
#   10.251.1.0/24 + fd00:251::/64.
#
# (1) proxy entries: none for the router's address (the probe finds it in use; the status
#     and the log say so) and ARP from L for 192.168.1.1 is answered by the router's MAC
#     only; none for L's address until L lets it go, then it is proxied (re-probed every
#     RG_PROBE_RECHECK_SECS=4 s here, 60 s on the appliance).
# (2) `add client phone` + `commit` through the console: the client gets neither .1
#     (router), .2 (the appliance), .3 (a neighbour), .10 (taken) nor .250; its address is
#     proxied after its probe, and answered by the appliance's MAC.
# (3) route 10.251.1.0/24 (site-b) cannot go in while the uplink has 10.251.1.50/24: the
#     start succeeds, the status says why; once the address goes, it is installed.
# (4) RAs for fd00:251::/64 (site-b's) and fd00:99::/64: the kernel's SLAAC address and
#     on-link route of fd00:251::/64 are removed and said; fd00:99::/64 is kept; the
#     tunnel route fd00:251::/64 is the one in use.
#
# (5) the factory tunnel (10.100.0.1/24, fd00:100::1/64, clients .2/::2 and .3/::3) and a
#     rogue RA for fd00:100::/64: the prefix is kept (it looks like the tunnel numbered
#     from the LAN) but the clients' /128s stay anti-spoof rules, and L's ping from
#     fd00:100::2 to fd00:100::3 is dropped and counted as `spoof`.
#
# Needs root, iproute2, nftables, dnsmasq, python3. riceguard is $RG_BIN (default
# target/release/riceguard). About 55 s. Prints "uplink-guard: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init uplink-guard
require_rg
require_tools ip nft dnsmasq python3

R=rguR$$ G=rguG$$ L=rguL$$ K=rguK$$
TUN=rguw$$
WORK=$(mktemp -d /tmp/rgu-uplink-guard.XXXXXX)
STATUS=/run/riceguard/$TUN.status
at_exit "rm -rf '$WORK' /var/run/wireguard/$TUN.sock '$STATUS'"

has_proxy() { ip -n $G neigh show proxy | grep -q "^$1 dev upl"; }
no_proxy() { ! ip -n $G neigh show proxy | grep -q "^$1 "; }
status_has() { inns $G "$RG" status $TUN 2>/dev/null | grep -qF -- "$1"; }
status_lacks() { ! status_has "$1"; }
mac_of() { ip -n "$1" -o link show "$2" | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2; }
arpwho() { inns $L python3 ci/lib/arpwho.py eth0 "$1" 1.2; }

netns_add $R $G $L $K
for n in $R $G $L $K; do
    inns $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
ip -n $R link add br0 type bridge
ip -n $R link set br0 up
veth_pair $R rg - $G upl 192.168.1.2/24
veth_pair $R rl - $L eth0 192.168.1.10/24
veth_pair $R rk - $K eth0 192.168.1.3/24
for i in rg rl rk; do ip -n $R link set $i master br0; done
ip -n $R addr add 192.168.1.1/24 dev br0
ip -n $R addr add fd00:251::1/64 dev br0 nodad
ip -n $R addr add fd00:99::1/64 dev br0 nodad
ip -n $G addr add 10.251.1.50/24 dev upl
ip -n $G route add default via 192.168.1.1
# The uplink takes RAs (SLAAC) as init sets it up; the daemon keeps that (accept_ra 2).
inns $G sysctl -qw net.ipv6.conf.upl.accept_ra=1 net.ipv6.conf.upl.autoconf=1
RMAC=$(mac_of $R br0) GMAC=$(mac_of $G upl) LMAC=$(mac_of $L eth0)

# ---- the configuration: README-like, but the tunnel numbered from the LAN ----------------
PERM=$WORK/perm
mkdir -p "$PERM"
kg=$(wg genkey 2>/dev/null || "$RG" genkey)
key() { "$RG" genkey | "$RG" pubkey; }
cat >"$PERM/riceguard.conf" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 192.168.1.250/24

[Peer]
Name = rtr
PublicKey = $(key)
AllowedIPs = 192.168.1.1/32

[Peer]
Name = squat
PublicKey = $(key)
AllowedIPs = 192.168.1.10/32

[Peer]
Name = site-b
PublicKey = $(key)
AllowedIPs = 10.251.1.0/24, fd00:251::/64

[Gateway]
InterfaceName = $TUN
Uplink = upl
HugePages = off
TcpFallback = off
PublicEndpoint = 203.0.113.1:51820
EOF
chmod 600 "$PERM/riceguard.conf"

# K talks to the appliance first, so its neighbour table knows K.
inns $K ping -c1 -W1 192.168.1.2 >/dev/null 2>&1
spawn env RG_LOG=info RG_PROBE_RECHECK_SECS=4 ip netns exec $G "$RG" up --config "$PERM/riceguard.conf" \
    --workers 1 >"$WORK/gw.log" 2>&1
GWPID=$!
if wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN | grep -q ',UP'"; then
    ok "the appliance is up (tunnel numbered from the LAN, a remote site's subnet on the uplink)"
else
    tail -20 "$WORK/gw.log"; h_abort "the appliance did not come up"
fi
# The daemon's pid for the console's reload (ip netns exec may exec or fork).
RGPID=$GWPID
[ "$(readlink /proc/$GWPID/exe)" = "$RG" ] || RGPID=$(pgrep -P $GWPID | head -1)
echo "$RGPID" >"$WORK/gw.pid"

# ---- (1) the router's and a LAN host's addresses ----------------------------------------------
echo "--- (1) probes before proxy entries"
check "(1) the router's address in use: said in riceguard status" \
    wait_for 5 status_has "proxy: 192.168.1.1 (peer rtr) is in use on upl by $RMAC: not answered for"
check "(1) ... and in the log" grep -qF "proxy: 192.168.1.1 (peer rtr) is in use on upl by $RMAC" "$WORK/gw.log"
check "(1) no proxy entry for the router's address 192.168.1.1" no_proxy 192.168.1.1
who=$(arpwho 192.168.1.1 | tr '\n' ' ')
[ "$who" = "$RMAC " ] && ok "(1) ARP for 192.168.1.1 from L: answered by the router's MAC only ($RMAC)" ||
    ko "(1) ARP for 192.168.1.1 from L answered by: '$who' (router $RMAC, appliance $GMAC)"
check "(1) L's address 192.168.1.10 in use: said" \
    wait_for 5 status_has "proxy: 192.168.1.10 (peer squat) is in use on upl by $LMAC: not answered for"
check "(1) no proxy entry for L's address" no_proxy 192.168.1.10

# ---- (2) add client through the console --------------------------------------------------------
echo "--- (2) add client phone, commit"
printf '%s\n' "add client phone" "commit" |
    inns $G timeout 30 "$RG" console --root "$PERM" --pidfile "$WORK/gw.pid" \
        --status-file "$STATUS" --socket "/var/run/wireguard/$TUN.sock" >"$WORK/console.txt" 2>&1
addr=$(awk '/BEGIN WIREGUARD CONFIG phone/ {on=1} on && /^Address/ {print $3; exit}' "$WORK/console.txt")
case $addr in
    192.168.1.1/32 | 192.168.1.2/32 | 192.168.1.3/32 | 192.168.1.10/32 | 192.168.1.250/32 | "")
        ko "(2) add client phone got '$addr' (router .1, appliance .2, neighbour .3, taken .10)"
        sed 's/^/     | /' "$WORK/console.txt" | head -30 ;;
    *) ok "(2) add client phone got $addr: not the router, the appliance, a neighbour or a taken one" ;;
esac
check "(2) commit applied" grep -q "the gateway applied it" "$WORK/console.txt"
ph=${addr%/32}
if [ -n "$ph" ] && wait_for 5 has_proxy "$ph"; then
    ok "(2) the phone's $ph is proxied after its probe"
    who=$(arpwho "$ph" | tr '\n' ' ')
    [ "$who" = "$GMAC " ] && ok "(2) ARP for $ph answered by the appliance ($GMAC)" ||
        ko "(2) ARP for $ph answered by '$who' (appliance $GMAC)"
else
    ko "(2) no proxy entry for the phone's '$ph' within 5 s"
fi

# ---- (1b) the squatted address freed -----------------------------------------------------------
echo "--- (1b) L lets 192.168.1.10 go"
ip -n $L addr del 192.168.1.10/24 dev eth0
check "(1b) 192.168.1.10 proxied once free (re-probed)" wait_for 12 has_proxy 192.168.1.10
check "(1b) its in-use line is gone from the status" wait_for 3 status_lacks "proxy: 192.168.1.10"
check "(1b) the router's address is still not proxied" no_proxy 192.168.1.1

# ---- (3) the route the uplink shadows ------------------------------------------------------------
echo "--- (3) tunnel route 10.251.1.0/24 against the uplink's 10.251.1.50/24"
route_in() { ip -n $G route show proto 91 dev $TUN | grep -q "^$1"; }
check "(3) status: route not installed, the uplink shadows it" \
    status_has "route 10.251.1.0/24 (peer site-b) not installed: upl has 10.251.1.0/24 (the uplink shadows it)"
check "(3) ... and the log" grep -qF "route 10.251.1.0/24 (peer site-b) not installed" "$WORK/gw.log"
check "(3) no tunnel route 10.251.1.0/24 meanwhile" sh -c "! ip -n $G route show proto 91 dev $TUN | grep -q '^10.251.1.0/24'"
ip -n $G addr del 10.251.1.50/24 dev upl
check "(3) installed within a watch round once the uplink's address went" wait_for 5 route_in 10.251.1.0/24
check "(3) its status line is gone" wait_for 3 status_lacks "route 10.251.1.0/24"

# ---- (4) RA prefixes ---------------------------------------------------------------------------
echo "--- (4) RAs for fd00:251::/64 (site-b's) and fd00:99::/64"
# `ip netns exec` itself, not the `inns` function: spawned in the background, a function
# is a subshell whose PID is not dnsmasq's, and cleanup would leave dnsmasq running.
spawn ip netns exec $R dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
    --interface=br0 --bind-interfaces --enable-ra \
    --dhcp-range=fd00:251::,ra-only,64 --dhcp-range=fd00:99::,ra-only,64 --ra-param=br0,3 \
    --pid-file="$WORK/dnsmasq.pid" >"$WORK/dnsmasq.log" 2>&1
RA_PID=$!
has6() { ip -n $G -6 -o addr show dev upl | grep -q "inet6 $1"; }
check "(4) fd00:99::/64 (no conflict): a SLAAC address" wait_for 15 has6 fd00:99:
check "(4) status: fd00:251::/64 not used, it is site-b's" \
    wait_for 6 status_has "uplink upl: RA prefix fd00:251::/64 not used: it is peer site-b's fd00:251::/64 (your remote site and your uplink cannot be the same network)"
sleep 1
check "(4) no fd00:251:: address on the uplink" sh -c "! ip -n $G -6 -o addr show dev upl | grep -q 'inet6 fd00:251:'"
check "(4) no on-link fd00:251::/64 route on the uplink" sh -c "! ip -n $G -6 route show dev upl | grep -q '^fd00:251::/64'"
check "(4) the route to fd00:251::5 goes through the tunnel" \
    sh -c "ip -n $G -6 route get fd00:251::5 | grep -q 'dev $TUN'"
check "(4) fd00:99::/64 kept" has6 fd00:99:

echo "--- stop"
stop_pid "$GWPID"
check "no proxy entry left after stop" sh -c "[ -z \"\$(ip -n $G neigh show proxy)\" ]"

# ---- (5) a rogue RA for the tunnel's own prefix ------------------------------------------------
echo "--- (5) the factory tunnel (10.100.0.1/24, fd00:100::1/64) and a rogue RA for fd00:100::/64"
stop_pid "$RA_PID"
# The kernel unregisters the first daemon's TUN after its last file closes, a moment after
# the process is gone; a new daemon with the same name before that gets EBUSY.
check "(5) the first daemon's $TUN is gone" wait_for 10 eval "! ip -n $G link show $TUN >/dev/null 2>&1"
cat >"$PERM/factory.conf" <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = 10.100.0.1/24, fd00:100::1/64

[Peer]
Name = phone
PublicKey = $(key)
AllowedIPs = 10.100.0.2/32, fd00:100::2/128

[Peer]
Name = laptop
PublicKey = $(key)
AllowedIPs = 10.100.0.3/32, fd00:100::3/128

[Gateway]
InterfaceName = $TUN
Uplink = upl
HugePages = off
TcpFallback = off
EOF
chmod 600 "$PERM/factory.conf"
ip -n $R addr add fd00:100::fe/64 dev br0 nodad
spawn env RG_LOG=info ip netns exec $G "$RG" up --config "$PERM/factory.conf" --workers 1 >"$WORK/gw5.log" 2>&1
GWPID=$!
check "(5) the appliance is up with the factory tunnel" wait_for 10 sh -c "[ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN | grep -q ',UP'"
spawn ip netns exec $R dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
    --interface=br0 --bind-interfaces --enable-ra --dhcp-range=fd00:100::,ra-only,64 --ra-param=br0,3 \
    --pid-file="$WORK/dnsmasq5.pid" >"$WORK/dnsmasq5.log" 2>&1
RA_PID=$!
check "(5) the rogue RA's fd00:100::/64 gives the uplink a SLAAC address (it looks like the tunnel numbered from the LAN)" wait_for 15 has6 fd00:100:
spoof_rule() { inns $G nft list chain inet riceguard prerouting 2>/dev/null | grep -q "ip6 saddr $1 .*drop"; }
check "(5) the phone's and the laptop's /128 stay anti-spoof rules on the uplink" \
    wait_for 10 eval 'spoof_rule fd00:100::2 && spoof_rule fd00:100::3'
spoofs() { inns $G nft list counter inet riceguard spoof 2>/dev/null | sed -n 's/.*packets \([0-9]*\).*/\1/p'; }
ip -n $L addr add fd00:100::2/128 dev eth0 nodad
ip -n $L -6 neigh replace fd00:100::3 lladdr "$GMAC" dev eth0
ip -n $L -6 route add fd00:100::3/128 dev eth0
s0=$(spoofs)
inns $L ping -6 -c 3 -i 0.2 -W 1 -I fd00:100::2 fd00:100::3 >/dev/null 2>&1
s1=$(spoofs)
check "(5) 3 pings from the uplink with the phone's source fd00:100::2 to the laptop dropped as spoofs (spoof ${s0:-?} -> ${s1:-?})" \
    test "${s1:-0}" -ge $((${s0:-0} + 3))
stop_pid "$RA_PID"
stop_pid "$GWPID"
if [ $failed -gt 0 ]; then for f in "$WORK"/gw*.log; do echo "--- gateway log $f (tail)"; tail -30 "$f"; done; fi
h_finish
