#!/usr/bin/env bash
# The gateway's LAN side and its network reload, end to end, with the release binary
# (`riceguard up --config FILE`) in network namespaces:
#
#   ns P (stock wireguard-go "phone", tunnel 192.168.77.202, fd77::202)
#      | 10.55.0.2/24                    nothing but namespaces; names rgn<X><pid>
#   ns R "router": 10.55.0.1, port forward udp/51820 -> 192.168.77.2, bridge br0
#      | 192.168.77.1/24 on br0  --- bridge ---  ns L "lanhost" 192.168.77.10/24, fd77::10/64
#   ns G "gw": uplink `upl` 192.168.77.2/24 (static; fd77::2/64 added later, as SLAAC would),
#      default via 192.168.77.1; LAN port `lan` --- ns M "lanhost2" 192.168.88.10/24
#      (default via 192.168.88.1); riceguard tunnel 192.168.77.201/29 with two peers:
#      the phone and a second peer (no daemon) 192.168.77.203, 10.66.2.0/24, fd77::203.
#
# (a) one-armed (Lan unset, uplink found by the default route): proxy entries for the
#     peers' host addresses inside the tunnel's subnets (a /29 and a /125 carved out of
#     the uplink's) on the uplink, each after its probe, routes tagged proto 91, forwarding and
#     rp_filter; the phone and L ping each other (IPv4 and IPv6) with no route on L; the
#     IPv6 entries follow the uplink's IPv6 address when it appears later.
# (b) reload to two-armed (Lan, LanAddress): the LAN port gets its address, the uplink
#     publishes no tunnel address any more; the phone and
#     M ping each other and a TCP exchange works.
# (c) reload removing the second peer: its routes and proxy entries are gone, the phone's
#     stay; then one changing the tunnel addresses: the removed one goes, the kept one is
#     not touched (a route using it as source survives), nor a hand-made route or address;
#     the phone still reaches the uplink's hosts, which no longer reach it (two-armed, the
#     firewall closes uplink -> tunnel).
#     SSH (`riceguard ssh --root` over the same file, with a key): a login from the phone
#     through the tunnel and from L (one-armed: the uplink's subnet is the LAN) works; in
#     (b) from M works and from L (now the uplink) is dropped: connect times out, the
#     firewall's uplink-in counter grows; during a connection flood from M (plain connects
#     and ssh-keyscan key exchanges, bounded) the phone's pings lose nothing, a TCP
#     exchange through the tunnel completes and a key login from the phone works.
# (d) the uplink loses its IPv6 address: the IPv6 entry goes; (e) stop: no proxy entry left.
#
# Needs root, wireguard-go, wireguard-tools, iproute2, nftables, python3.
# riceguard is $RG_BIN (default target/release/riceguard). Run: sudo ci/gateway-lan.sh
# Prints "gateway-lan: N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init gateway-lan
require_rg
require_tools wireguard-go wg ip nft python3 ssh ssh-keygen

P=rgnP$$ R=rgnR$$ G=rgnG$$ L=rgnL$$ M=rgnM$$
TUN=rgnw$$ PHONE=rgnp$$
WORK=$(mktemp -d /tmp/rgn-gateway-lan.XXXXXX)
STATUS=/run/riceguard/$TUN.status
RGPID=

cleanup() {
    local p
    for p in "${PIDS[@]}" $RGPID; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}" $RGPID; do
        for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    for n in $P $R $G $L $M; do ip netns del $n 2>/dev/null; done
    rm -f /var/run/wireguard/$TUN.sock /var/run/wireguard/$PHONE.sock "$STATUS"
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup


# ---- namespaces and links -----------------------------------------------------------------
for n in $P $R $G $L $M; do
    ip netns add $n
    ip -n $n link set lo up
    ip netns exec $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
# The gateway starts with forwarding off and strict reverse-path filtering: the daemon
# must turn on what it needs (a new namespace inherits the host's IPv4 settings).
inns $G sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 \
    net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=1
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
ip -n $R link add br0 type bridge
ip -n $R link set br0 up
ip link add rp netns $R type veth peer name eth0 netns $P
ip link add rg netns $R type veth peer name upl netns $G
ip link add rl netns $R type veth peer name eth0 netns $L
ip link add lan netns $G type veth peer name eth0 netns $M
for i in rg rl; do ip -n $R link set $i master br0 up; done
ip -n $R link set rp up
ip -n $R addr add 192.168.77.1/24 dev br0
ip -n $R addr add 10.55.0.1/24 dev rp
ip -n $P addr add 10.55.0.2/24 dev eth0
ip -n $P link set eth0 up
ip -n $P route add default via 10.55.0.1
ip -n $G addr add 192.168.77.2/24 dev upl
ip -n $G link set upl up
ip -n $G route add default via 192.168.77.1
ip -n $L addr add 192.168.77.10/24 dev eth0
ip -n $L addr add fd77::10/64 dev eth0 nodad
ip -n $L link set eth0 up
ip -n $M addr add 192.168.88.10/24 dev eth0
ip -n $M link set eth0 up
ip -n $M route add default via 192.168.88.1
ip -n $M addr add fd88::10/64 dev eth0 nodad
ip -n $M route add default via fd88::1
# The ISP router's port forward to the one-armed appliance.
ip netns exec $R nft add table ip rgnnat
ip netns exec $R nft add chain ip rgnnat pre '{ type nat hook prerouting priority -100; }'
ip netns exec $R nft add chain ip rgnnat post '{ type nat hook postrouting priority 100; }'
ip netns exec $R nft add rule ip rgnnat pre iifname rp udp dport 51820 dnat to 192.168.77.2

# ---- keys, configurations ------------------------------------------------------------------
kg=$(wg genkey); kp=$(wg genkey); k2=$(wg genkey)
pg=$(echo "$kg" | wg pubkey); pp=$(echo "$kp" | wg pubkey); p2=$(echo "$k2" | wg pubkey)
conf() { # conf ADDRESSES WITH_PEER2 LAN_LINES
    cat <<EOF
[Interface]
PrivateKey = $kg
ListenPort = 51820
Address = $1
MTU = 1420

[Peer]
Name = phone
PublicKey = $pp
AllowedIPs = 192.168.77.202/32, fd77::202/128, 10.66.1.0/24
EOF
    if [ "$2" = yes ]; then
        cat <<EOF

[Peer]
Name = laptop
PublicKey = $p2
AllowedIPs = 192.168.77.203/32, fd77::203/128, 10.66.2.0/24
Endpoint = laptop.rgn.test:51999
EOF
    fi
    cat <<EOF

[Gateway]
InterfaceName = $TUN
Hugepages = off
TcpFallback = off
ProxyArp = on
#4+ SshKey = alice $(cat "$WORK/alice.pub")
#4+ SshPort = $SSHPORT
$3
EOF
}
# The console over SSH beside the daemon, over the same file (as on the image: perm's
# riceguard.conf): a key login from the tunnel's phone and from the LAN side works, from
# the uplink (two-armed) it is dropped by the firewall (counted as uplink-in).
SSHPORT=2222
mkdir -p "$WORK/perm"
ssh-keygen -q -t ed25519 -N '' -C alice@lab -f "$WORK/alice"
CONF=$WORK/perm/riceguard.conf
write_conf() { conf "$@" >"$CONF.new" && chmod 600 "$CONF.new" && mv "$CONF.new" "$CONF"; }
write_conf "192.168.77.201/29, 10.66.8.1/24, fd77:1::1/64, fd77::201/125" yes ""

# ---- the phone: stock wireguard-go, as a WireGuard app on a phone would be set up -----------
ip netns exec $P env WG_PROCESS_FOREGROUND=1 wireguard-go $PHONE >"$WORK/phone.log" 2>&1 &
PIDS+=($!)
wait_for 5 eval '[ -S /var/run/wireguard/$PHONE.sock ]'
ip netns exec $P wg set $PHONE private-key <(echo "$kp") peer "$pg" endpoint 10.55.0.1:51820 \
    allowed-ips 192.168.77.0/24,192.168.88.0/24,fd77::/64,fd88::/64 persistent-keepalive 25
ip -n $P addr add 192.168.77.202/32 dev $PHONE
ip -n $P addr add fd77::202/128 dev $PHONE nodad
ip -n $P link set $PHONE mtu 1420 up
for r in 192.168.77.0/24 192.168.88.0/24; do ip -n $P route add $r dev $PHONE; done
for r in fd77::/64 fd88::/64; do ip -n $P -6 route add $r dev $PHONE; done

# ---- the gateway ---------------------------------------------------------------------------
# The gateway's resolver: `ip netns exec` binds /etc/netns/G/hosts over /etc/hosts. It starts
# without the laptop's name (as the appliance starts before its DHCP lease brings DNS).
mkdir -p /etc/netns/$G
printf '127.0.0.1 localhost\n' >/etc/netns/$G/hosts
at_exit "rm -rf /etc/netns/$G"
RG_LOG=info ip netns exec $G "$RG" up --config "$CONF" --workers 1 >"$WORK/gw.log" 2>&1 &
STARTED=$!
sleep 0.2
# `ip netns exec` may exec riceguard (same PID) or run it as its child.
if [ "$(readlink /proc/$STARTED/exe)" = "$RG" ]; then RGPID=$STARTED
else RGPID=$(pgrep -P $STARTED | head -1); PIDS+=($STARTED); fi
up=0
for _ in $(seq 100); do
    if [ -S /var/run/wireguard/$TUN.sock ] && ip -n $G -o link show $TUN 2>/dev/null | grep -q ',UP'; then up=1; break; fi
    sleep 0.1
done
if [ $up = 1 ] && [ -n "$RGPID" ]; then ok "gateway up (riceguard pid $RGPID)"
else bad "gateway did not come up"; tail -20 "$WORK/gw.log"; h_finish; fi

# A peer endpoint name that did not resolve at start is retried until it does.
laptop_ep() { ip netns exec $G wg show $TUN endpoints | awk -v k="$p2" '$1 == k {print $2}'; }
ep=$(laptop_ep)
[ "$ep" = "(none)" ] && ok "laptop.rgn.test unresolvable at start: the peer has no endpoint yet" ||
    bad "laptop's endpoint at start: '$ep'"
echo "10.55.0.99 laptop.rgn.test" >>/etc/netns/$G/hosts   # in place: the bind mount follows
laptop_at() { [ "$(laptop_ep)" = "$1" ]; }
if wait_for 30 laptop_at 10.55.0.99:51999; then
    ok "the name resolved on a retry once the resolver knew it (no reload): 10.55.0.99:51999"
else
    bad "laptop's endpoint after the name became resolvable: '$(laptop_ep)'"
fi
# First reply within N one-second pings (the first packet waits for the handshake).
ping_ok() { # ping_ok NS DST
    local i
    for i in $(seq 8); do ip netns exec $1 ping -n -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    return 1
}
ping_loss0() { # three in a row, none lost
    ip netns exec $1 ping -n -c3 -i0.2 -W2 "$2" 2>/dev/null | grep -q ' 0% packet loss'
}
has_proxy() { ip -n $G neigh show proxy | grep -q "^$1 dev $2\b"; }
no_proxy() { ! ip -n $G neigh show proxy | grep -q "^$1 "; }
route_of() { ip -n $G "${@:2}" route show proto 91 dev $TUN | grep -q "^$1\b"; }
no_route() { ! ip -n $G "${@:2}" route show dev $TUN | grep -q "^$1\b"; }
sysctl_is() { [ "$(inns $G sysctl -n "$1")" = "$2" ]; }
reload_to() { # reload_to GENERATION: SIGHUP, wait for the status file's reload line
    kill -HUP "$RGPID"
    wait_for 10 grep -q "^reload: generation $1 ok" "$STATUS"
}

# ---- (a) one-armed ---------------------------------------------------------------------------
echo "--- (a) one-armed: proxy ARP on the uplink"
# Proxied once a probe found the address free (about a second after the start).
check "proxy ARP entry 192.168.77.202 on the uplink (after its probe)" wait_for 5 has_proxy 192.168.77.202 upl
check "proxy ARP entry 192.168.77.203 on the uplink (second peer)" wait_for 5 has_proxy 192.168.77.203 upl
check "no IPv6 entry while the uplink has no IPv6 address" no_proxy fd77::202
check "route 10.66.1.0/24 dev tunnel proto 91" route_of 10.66.1.0/24
check "route 10.66.2.0/24 dev tunnel proto 91" route_of 10.66.2.0/24
check "no route for fd77::202: inside the tunnel's own /125" no_route fd77::202 -6
check "no route for a host inside the tunnel's own /29" no_route 192.168.77.202
check "ip_forward turned on" sysctl_is net.ipv4.ip_forward 1
check "rp_filter of the uplink left as the system set it (DHCP must hear servers it has no route to)" sysctl_is net.ipv4.conf.upl.rp_filter 1
check "rp_filter loose on the tunnel" sysctl_is net.ipv4.conf.$TUN.rp_filter 2
check "phone pings LAN host 192.168.77.10" ping_ok $P 192.168.77.10
check "LAN host pings phone 192.168.77.202 (proxy ARP)" ping_loss0 $L 192.168.77.202
mac_up=$(ip -n $G -o link show upl | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2)
check "LAN host learned 192.168.77.202 at the gateway's uplink MAC" \
    sh -c "ip -n $L neigh show 192.168.77.202 | grep -q '$mac_up'"
lroutes=$(ip -n $L -4 route show | wc -l)
[ "$lroutes" = 1 ] && ok "LAN host has no route but its connected /24" ||
    bad "LAN host routes: $(ip -n $L -4 route show | tr '\n' ';')"
# IPv6 arrives later (as SLAAC would): the watch adds the NDP proxy entries.
ip -n $G addr add fd77::2/64 dev upl nodad
if wait_for 10 has_proxy fd77::202 upl; then ok "NDP proxy entry fd77::202 follows the uplink's new IPv6 address"
else bad "no NDP proxy entry for fd77::202 10 s after the uplink got fd77::2/64"; fi
check "proxy_ndp on the uplink" sysctl_is net.ipv6.conf.upl.proxy_ndp 1
check "IPv6 forwarding turned on" sysctl_is net.ipv6.conf.all.forwarding 1
check "phone pings LAN host fd77::10" ping_ok $P fd77::10
check "LAN host pings phone fd77::202 (NDP proxy)" ping_ok $L fd77::202

# The console over SSH (`riceguard ssh --root`, as init runs it) in G.
ip netns exec $G "$RG" ssh --root "$WORK/perm" --pidfile "$WORK/none.pid" --status-file "$WORK/none.status" \
    --socket "$WORK/none.sock" >"$WORK/ssh.log" 2>&1 &
PIDS+=($!)
ssh_listening() { ip netns exec $G ss -Hltn "sport = :$SSHPORT" | grep -q LISTEN; }
check "riceguard ssh listens on $SSHPORT (the file has a key)" wait_for 10 ssh_listening
# ssh_from NS ADDR: a key login running `show status` (exit status: ssh's).
ssh_from() {
    timeout 20 ip netns exec "$1" ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile=/dev/null \
        -o StrictHostKeyChecking=no -o ConnectTimeout=4 -p $SSHPORT -i "$WORK/alice" admin@"$2" 'show status' 2>&1
}
out=$(ssh_from $P 192.168.77.201)
[ $? = 0 ] && echo "$out" | grep -q "^console: ssh-[0-9]*:alice (over SSH from 192.168.77.202)" &&
    ok "SSH from the tunnel's phone (192.168.77.202) to the tunnel address: logged in" || bad "SSH from the phone: $(echo "$out" | tail -3)"
out=$(ssh_from $L 192.168.77.2)
[ $? = 0 ] && echo "$out" | grep -q "over SSH from 192.168.77.10)" &&
    ok "SSH from the LAN host on the uplink's own subnet (one-armed: the LAN): logged in" || bad "SSH from L one-armed: $(echo "$out" | tail -3)"

# ---- (b) two-armed ---------------------------------------------------------------------------
echo "--- (b) reload to two-armed: Lan = lan, LanAddress = 192.168.88.1/24"
write_conf "192.168.77.201/29, 10.66.8.1/24, fd77:1::1/64, fd77::201/125" yes "Lan = lan
LanAddress = 192.168.88.1/24, fd88::1/64"
if reload_to 1; then ok "reload 1 applied"; else bad "reload 1: $(grep reload: "$STATUS")"; fi
check "LAN port has 192.168.88.1/24" sh -c "ip -n $G -o addr show dev lan | grep -q 'inet 192.168.88.1/24'"
check "LAN port is up" sh -c "ip -n $G -o link show lan | grep -q ',UP'"
check "rp_filter loose on the LAN port" sysctl_is net.ipv4.conf.lan.rp_filter 2
check "phone pings LAN host 192.168.88.10" ping_ok $P 192.168.88.10
check "LAN host 192.168.88.10 pings the phone" ping_loss0 $M 192.168.77.202
check "phone pings LAN host fd88::10" ping_ok $P fd88::10
# tcp_exchange PORT: one TCP exchange from the phone through the tunnel to a one-shot echo
# server on M (192.168.88.10:PORT), bounded by timeouts; $got: ok or what went wrong.
tcp_exchange() {
    timeout 20 ip netns exec $M python3 ci/lib/labtool.py tcp-reverse-once 192.168.88.10 "$1" &
    PIDS+=($!)
    wait_for 5 sh -c "ip netns exec $M ss -Hltn 'sport = :$1' | grep -q ."
    got=$(timeout 15 ip netns exec $P python3 ci/lib/labtool.py tcp-reverse-check 192.168.88.10 "$1" 2>&1)
}
tcp_exchange 7777
[ "$got" = ok ] && ok "TCP phone -> 192.168.88.10:7777: 30 kB echoed reversed" || bad "TCP exchange: $got"
# Two-armed, SSH from the LAN port's host works and from the uplink's is dropped (no answer
# at all: the firewall's input policy, counted).
out=$(ssh_from $M 192.168.88.1)
[ $? = 0 ] && echo "$out" | grep -q "over SSH from 192.168.88.10)" &&
    ok "two-armed: SSH from the LAN port's host (192.168.88.10): logged in" || bad "SSH from M: $(echo "$out" | tail -3)"
# A connection flood from the LAN (ssh-keyscan: full key exchanges, and plain connects,
# bounded: 8 s or 20000 attempts): meanwhile the phone's pings through the tunnel lose
# nothing, a TCP exchange through it completes, and a key login from the phone works.
cat >"$WORK/flood.py" <<'EOF'
import socket, subprocess, sys, time
host, port, stop = sys.argv[1], int(sys.argv[2]), time.monotonic() + 8
n = scans = 0
while time.monotonic() < stop and n < 20000:
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((host, port))
        n += 1
    except OSError:
        pass
    s.close()
    if n % 20 == 0:
        subprocess.run(["ssh-keyscan", "-T", "2", "-p", str(port), host, host, host, host],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)
        scans += 4
print("connects=%d keyscans=%d" % (n, scans), flush=True)
EOF
timeout 20 ip netns exec $M python3 "$WORK/flood.py" 192.168.88.1 $SSHPORT >"$WORK/flood.out" 2>&1 &
flood=$!
PIDS+=($flood)
sleep 1
check "during an SSH connection flood from the LAN: the phone's pings to 192.168.88.10 lose nothing" ping_loss0 $P 192.168.88.10
tcp_exchange 7778
[ "$got" = ok ] && ok "during the flood: TCP phone -> 192.168.88.10 through the tunnel, 30 kB echoed" || bad "TCP during the flood: $got"
out=$(ssh_from $P 192.168.77.201)
[ $? = 0 ] && ok "during the flood: a key login from the phone works" || bad "SSH from the phone during the flood: $(echo "$out" | tail -2)"
kill -0 $flood 2>/dev/null && during=yes || during=no
wait_for 15 bash -c "! kill -0 $flood 2>/dev/null"
[ $during = yes ] && grep -q "^connects=[1-9]" "$WORK/flood.out" &&
    ok "the flood ran all along those checks: $(cat "$WORK/flood.out")" || bad "flood (still running after the checks: $during): $(cat "$WORK/flood.out")"
uin() { n=$(ip netns exec $G nft list counter inet riceguard uplink-in 2>/dev/null | sed -n 's/.*packets \([0-9]*\).*/\1/p'); echo "${n:-0}"; }
u0=$(uin)
out=$(ssh_from $L 192.168.77.2)
rc=$?
u1=$(uin)
[ $rc = 255 ] && echo "$out" | grep -q "timed out" && [ "$u1" -gt "$u0" ] &&
    ok "two-armed: SSH from the uplink's host is dropped (connect timed out; uplink-in $u0 -> $u1)" ||
    bad "SSH from the uplink two-armed: rc $rc, uplink-in $u0 -> $u1: $(echo "$out" | tail -2)"

# ---- (c) reload removing the second peer, then one changing the tunnel addresses ----------
echo "--- (c1) reload: second peer removed (addresses unchanged)"
write_conf "192.168.77.201/29, 10.66.8.1/24, fd77:1::1/64, fd77::201/125" no "Lan = lan
LanAddress = 192.168.88.1/24, fd88::1/64"
if reload_to 2; then ok "reload 2 applied"; else bad "reload 2: $(grep reload: "$STATUS")"; fi
check "removed peer's route 10.66.2.0/24 is gone" no_route 10.66.2.0/24
check "removed peer's route fd77::203 is gone" no_route fd77::203 -6
check "removed peer's proxy entry 192.168.77.203 is gone" no_proxy 192.168.77.203
check "removed peer's NDP entry fd77::203 is gone" no_proxy fd77::203
check "the phone's route 10.66.1.0/24 stays" route_of 10.66.1.0/24
# Two-armed: the firewall drops uplink -> tunnel, so nothing is published on the uplink.
check "two-armed: no proxy entry 192.168.77.202 on the uplink" wait_for 5 no_proxy 192.168.77.202
check "two-armed: no NDP entry fd77::202 on the uplink" no_proxy fd77::202

echo "--- (c2) reload: tunnel address 10.66.8.1/24 replaced by 10.66.9.1/24"
# Things the reload must not touch: a route using a kept address as its source (gone if
# that address were flushed), a hand-made route and a hand-made address on the tunnel.
ip -n $G route add 10.99.9.0/24 dev $TUN src 192.168.77.201
ip -n $G route add 10.98.0.0/24 dev $TUN
ip -n $G addr add 10.97.7.1/32 dev $TUN
write_conf "192.168.77.201/29, 10.66.9.1/24, fd77:1::1/64, fd77::201/125" no "Lan = lan
LanAddress = 192.168.88.1/24, fd88::1/64"
if reload_to 3; then ok "reload 3 applied"; else bad "reload 3: $(grep reload: "$STATUS")"; fi
check "removed address 10.66.8.1/24 is gone" sh -c "! ip -n $G -o addr show dev $TUN | grep -q 'inet 10.66.8.1/'"
check "new address 10.66.9.1/24 is there" sh -c "ip -n $G -o addr show dev $TUN | grep -q 'inet 10.66.9.1/24'"
check "kept address 192.168.77.201/29 is there" sh -c "ip -n $G -o addr show dev $TUN | grep -q 'inet 192.168.77.201/29'"
check "route with src 192.168.77.201 survived (the address was not flushed)" \
    sh -c "ip -n $G route show dev $TUN | grep -q '^10.99.9.0/24 .*src 192.168.77.201'"
check "hand-made route 10.98.0.0/24 on the tunnel survived" sh -c "ip -n $G route show dev $TUN | grep -q '^10.98.0.0/24'"
check "hand-made address 10.97.7.1 on the tunnel survived" sh -c "ip -n $G -o addr show dev $TUN | grep -q 'inet 10.97.7.1/32'"
check "the phone's route 10.66.1.0/24 untouched" route_of 10.66.1.0/24
check "LAN port address untouched" sh -c "ip -n $G -o addr show dev lan | grep -q 'inet 192.168.88.1/24'"
check "phone still reaches 192.168.77.10 after the reloads" ping_loss0 $P 192.168.77.10
# Two-armed since (b): the uplink is the outside, and the firewall (fail closed) lets it into
# neither the LAN nor the tunnel, even for a peer address proxied on the uplink's subnet;
# the phone's own connections to the uplink (above) still get their replies.
check "two-armed: LAN host 192.168.77.10 on the uplink no longer reaches the phone (uplink -> tunnel closed)" \
    sh -c "! ip netns exec $L ping -n -c2 -i0.3 -W1 192.168.77.202"

# ---- (d) the uplink's address goes ----------------------------------------------------------
echo "--- (d) the uplink loses its IPv6 address"
ip -n $G addr del fd77::2/64 dev upl
if wait_for 10 no_proxy fd77::202; then ok "NDP proxy entry fd77::202 removed with the uplink's IPv6 address"
else bad "NDP proxy entry fd77::202 still there 10 s after fd77::2 went"; fi

# ---- (e) stop -------------------------------------------------------------------------------
echo "--- (e) stop"
kill -TERM "$RGPID"
for _ in $(seq 50); do kill -0 "$RGPID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$RGPID" 2>/dev/null; then bad "riceguard still running 5 s after SIGTERM"
else
    RGPID=
    left=$(ip -n $G neigh show proxy)
    [ -z "$left" ] && ok "no proxy entry left after stop" || bad "proxy entries left after stop: $left"
fi
if [ $failed -gt 0 ]; then echo "--- gateway log (tail)"; tail -30 "$WORK/gw.log"; fi
h_finish
