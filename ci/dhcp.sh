#!/usr/bin/env bash
# The uplink by DHCP (the appliance numbers its uplink itself, no dhclient): `riceguard dhcp VETH` in a client namespace
# against dnsmasq in a server namespace (2-minute leases, dnsmasq's minimum):
#   - bound: address (with a finite lifetime), default route, resolv.conf, lease file,
#     the lease line of `riceguard status`;
#   - renewed at T1 (about 60 s);
#   - dnsmasq killed: the next renewal fails and the address stays;
#   - link flap (veth down/up) with the server back: re-acquired (INIT-REBOOT), route back;
#   - expiry, against a scripted server (ci/lib/dhcp_expiry_server.py) that answers once
#     with a 20 s lease and then stays silent: rebinding, then the address and route go.
# While dnsmasq serves (bound, renewal, server lost, link flap) the appliance daemon
# (`riceguard up --config`, uplink = the client's veth) runs in the client namespace, so
# all of that happens with its firewall in place (DHCP/RA must still pass it), and dnsmasq also sends
# router advertisements: the uplink must still get its SLAAC address and default route
# with forwarding on (the daemon sets accept_ra 2) and ICMPv6 filtered.
# The untrusted uplink (about 45 s more), `riceguard dhcp --config FILE` against dnsmasq:
#   - a lease equal to a peer's AllowedIPs is not requested, said with its reason, and not
#     asked for in a loop (DISCOVERs counted on the server's side in a 15 s window);
#   - two-armed, a lease over the LAN port's subnet (`LanAddress`) is declined;
#   - `UplinkOverlap = refuse` declines an overlap with a wide summary route; `auto` keeps
#     it and `riceguard status` says which part of which peer the uplink shadows;
#   - restarted with a lease file whose address is gone: a DHCP packet within 3 s and the
#     address back;
#   - `riceguard status` shows no lease left in the run directory by something else;
#   - against a scripted server (ci/lib/dhcp_rogue_server.py), a rogue server's ACK to a
#     renewal is ignored and the real server's taken.
# Leases from the tunnel's own subnet (about 30 s), the appliance daemon running:
#   - the factory tunnel (10.100.0.1/24, phone .2, laptop .3) and a rogue server leasing
#     from 10.100.0.0/24: kept (it looks like the tunnel numbered from the LAN), but the
#     clients' /32s stay anti-spoof rules and the phone's source from the uplink is
#     dropped and counted; a lease of exactly the phone's address is declined;
#   - the tunnel numbered from the LAN (Address = 192.168.77.250/24) over dnsmasq's real
#     lease: kept, and a stock wireguard-go phone behind the server pings the LAN host
#     192.168.77.1 through the tunnel, untranslated, answered by proxy ARP.
# RGD_ONLY=untrusted runs only the untrusted-uplink checks and these (a quick run while working on them).
# About 4 minutes. Needs root, iproute2, nftables, dnsmasq, python3. riceguard is $RG_BIN (default
# target/release/riceguard). Names are prefixed `rgd`.
# Ends with "dhcp: N passed, N failed"; exit 1 on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init dhcp

require_rg
require_tools ip nft dnsmasq python3

SRV=rgd-srv-$$ CLI=rgd-cli-$$ VS=rgdv0 VC=rgdv1 TUN=rgdw$$
tmp=$(mktemp -d /tmp/rgd-dhcp.XXXXXX)
at_exit rm -rf "$tmp"
at_exit rm -f "/var/run/wireguard/$TUN.sock" "/run/riceguard/$TUN.status"


count() { grep -c -- "$2" "$1" 2>/dev/null || true; }
log_has() { grep -q -- "$2" "$1"; }
log_count_ge() { [ "$(count "$1" "$2")" -ge "$3" ]; }
cli() { ip netns exec $CLI "$@"; }
has_addr() { ip -n $CLI -4 addr show dev $VC | grep -q "inet $1"; }
no_addr() { ! has_addr "$1"; }
has_default() { ip -n $CLI -4 route show default | grep -q "via $1 dev $VC"; }
no_default() { [ -z "$(ip -n $CLI -4 route show default)" ]; }
valid_lft() { ip -n $CLI -4 addr show dev $VC | sed -n 's/.*valid_lft \([0-9a-z]*\)sec.*/\1/p' | head -1; }

only=${RGD_ONLY:-}
netns_add $SRV $CLI
# The client end has no address: DHCP gives it one.
veth_pair $SRV $VS 192.168.77.1/24 $CLI $VC -
ip -n $SRV addr add 192.168.78.1/24 dev $VS
ip -n $SRV addr add 2001:db8:77::1/64 dev $VS nodad
for ns in $SRV $CLI; do ip netns exec $ns sysctl -qw net.ipv4.conf.all.rp_filter=0; done

start_dnsmasq() {
    spawn ip netns exec $SRV dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
        --interface=$VS --bind-interfaces --dhcp-authoritative \
        --dhcp-range=192.168.77.10,192.168.77.50,255.255.255.0,2m \
        --dhcp-option=option:router,192.168.77.1 --dhcp-option=option:dns-server,192.168.77.1 \
        --enable-ra --dhcp-range=2001:db8:77::,ra-only,64 --ra-param=$VS,4 \
        --dhcp-leasefile="$tmp/dnsmasq.leases" --pid-file="$tmp/dnsmasq.pid" \
        --log-dhcp >>"$tmp/dnsmasq.log" 2>&1
    dnsmasq_pid=$!
}

start_client() { # RUNDIR LOG: the event log under RUNDIR/perm, as init passes /perm
    mkdir -p "$1/perm"
    spawn env RG_RUN_DIR="$1" ip netns exec $CLI "$RG" dhcp --event-log "$1/perm" $VC >"$2" 2>&1
    client_pid=$!
}

has_table() { ip netns exec $CLI nft list table inet riceguard >/dev/null 2>&1; }
sysctl_is() { [ "$(ip netns exec $CLI sysctl -n "$1" 2>/dev/null)" = "$2" ]; }
tun_up() { [ -S "/var/run/wireguard/$TUN.sock" ] && ip -n $CLI -o link show $TUN 2>/dev/null | grep -q ',UP'; }
# The kernel unregisters a stopped daemon's TUN a moment after the process is gone; the
# next daemon with that name waits for it (else: EBUSY).
tun_gone() { ! ip -n $CLI link show $TUN >/dev/null 2>&1; }
if [ "$only" != untrusted ]; then
# ---- the appliance daemon in the client namespace, its firewall in place first ---------
has_addr6() { ip -n $CLI -6 addr show dev $VC scope global | grep -q "inet6 2001:db8:77:"; }
has_default6() { ip -n $CLI -6 route show default | grep -q "dev $VC"; }
printf '[Interface]\nPrivateKey = %s\nListenPort = 51820\nAddress = 10.100.0.1/24\n\n[Gateway]\nInterfaceName = %s\nHugePages = off\nUplink = %s\n' \
    "$("$RG" genkey)" "$TUN" "$VC" >"$tmp/gw.conf"
chmod 600 "$tmp/gw.conf"
spawn env RG_LOG=info ip netns exec $CLI "$RG" up --config "$tmp/gw.conf" --workers 1 >"$tmp/gw.log" 2>&1
gw_pid=$!
check "appliance daemon up in the client namespace (before DHCP)" wait_for 10 tun_up
check "its firewall is in place before the DHCP client starts" has_table
check "forwarding on (the daemon's)" sysctl_is net.ipv4.ip_forward 1
check "the uplink keeps accepting router advertisements while forwarding (accept_ra 2)" sysctl_is net.ipv6.conf.$VC.accept_ra 2

# ---- dnsmasq: bound, renewed, server lost, link flap -----------------------------------
start_dnsmasq
run1=$tmp/run1 log1=$tmp/client1.log
start_client "$run1" "$log1"
check "bound within 20 s" wait_for 20 log_has "$log1" "dhcp $VC: bound 192.168.77."
addr=$(sed -n "s/.*dhcp $VC: bound \(192\.168\.77\.[0-9]*\)\/24 .*/\1/p" "$log1" | head -1)
note "$(grep -m1 "bound " "$log1")"
check "bound line says router, dns and lease" log_has "$log1" "bound $addr/24 router 192.168.77.1 dns 192.168.77.1 lease 120s"
check "address $addr/24 on $VC" has_addr "$addr/24"
lft=$(valid_lft)
check "address lifetime is the lease's (valid_lft $lft s, not forever)" test -n "$lft" -a "$lft" != forever -a "${lft:-0}" -le 120 2>/dev/null
check "default route via 192.168.77.1" has_default 192.168.77.1
check "resolv.conf has the lease's DNS" grep -q "^nameserver 192.168.77.1$" "$run1/resolv.conf"
check "lease file written" grep -q "^address $addr/24$" "$run1/lease.$VC"
status=$(cli env RG_RUN_DIR="$run1" "$RG" status 2>/dev/null)
note "status: $(echo "$status" | head -1)"
check "status prints the lease" grep -q "^uplink $VC: DHCP $addr/24 router 192.168.77.1 dns 192.168.77.1 server 192.168.77.1, expires in [0-9]* s (renews in [0-9]* s)$" <<<"$status"
check "the router answers ping over the leased address" cli ping -c1 -W2 192.168.77.1 >/dev/null

check "SLAAC with the firewall on: a 2001:db8:77::/64 address from dnsmasq's RA" wait_for 20 has_addr6
check "SLAAC with the firewall on: IPv6 default route from the RA" wait_for 5 has_default6
check "renewed at T1 (within 75 s)" wait_for 75 log_has "$log1" "dhcp $VC: renewed $addr/24 lease 120s"
check "renewed with the firewall in place" has_table
lft=$(valid_lft)
check "renewal refreshed the lifetime (valid_lft $lft s > 100)" test "${lft:-0}" -gt 100 2>/dev/null

stop_pid "$dnsmasq_pid"
note "dnsmasq stopped; waiting for the next renewal to fail"
renews=$(count "$log1" "renewed ")
asks=$(count "$log1" "renewing with 192.168.77.1")
# The next T1 is 60 s after the renewal; 70 s covers it and its first unanswered tries.
sleep 70
check "a renewal was tried" test "$(count "$log1" "renewing with 192.168.77.1")" -gt "$asks"
check "no renewal without the server" test "$(count "$log1" "renewed ")" -eq "$renews"
check "address kept after the failed renewal" has_addr "$addr/24"
check "default route kept" has_default 192.168.77.1
check "lease not declared expired" bash -c "! grep -q 'lease expired' '$log1'"

start_dnsmasq
sleep 1
ip -n $CLI link set $VC down
check "link down seen" wait_for 5 log_has "$log1" "dhcp $VC: link down"
ip -n $CLI link set $VC up
check "link up: re-acquiring" wait_for 5 log_has "$log1" "dhcp $VC: link up: re-acquiring"
check "re-acquired after the flap" wait_for 20 log_count_ge "$log1" "dhcp $VC: bound $addr/24" 2
check "address present after the flap" has_addr "$addr/24"
check "default route back after the flap" wait_for 5 has_default 192.168.77.1
check "the firewall is still in place after the link flap" has_table
"$RG" log --root "$run1/perm" >"$tmp/events1.txt" 2>&1
check "event log: the lease bound once (a renewal and the same address again after the flap are not events)" \
    bash -c "[ \$(grep -c 'dhcp $VC: bound $addr/24 router 192.168.77.1' '$tmp/events1.txt') = 1 ] && [ \$(grep -c ' dhcp ' '$tmp/events1.txt') = 1 ]"
stop_pid "$client_pid"
stop_pid "$dnsmasq_pid"
stop_pid "$gw_pid"
ip -n $CLI addr flush dev $VC

# ---- expiry: a server that answers once with a 20 s lease, then never again ------------
spawn ip netns exec $SRV python3 ci/lib/dhcp_expiry_server.py $VS 192.168.78.1 192.168.78.20 20 60 \
    >"$tmp/server.log" 2>&1
expiry_pid=$!
sleep 0.5
run2=$tmp/run2 log2=$tmp/client2.log
start_client "$run2" "$log2"
check "expiry case: bound to the short lease" wait_for 10 log_has "$log2" "dhcp $VC: bound 192.168.78.20/24 router 192.168.78.1 dns 192.168.78.1 lease 20s"
check "expiry case: rebinding after T2 (15 s)" wait_for 20 log_has "$log2" "dhcp $VC: rebinding"
check "expiry case: address still there while rebinding" has_addr 192.168.78.20/24
check "expiry case: lease expired" wait_for 10 log_has "$log2" "dhcp $VC: lease expired: address removed"
check "expiry case: address removed at expiry" no_addr 192.168.78.20/24
check "expiry case: default route removed" no_default
check "expiry case: lease file removed" test ! -e "$run2/lease.$VC"
check "expiry case: the event log says the lease was lost" bash -c "'$RG' log --root '$run2/perm' | grep -q 'dhcp $VC: lease lost (expired, no server answered): 192.168.78.20/24 removed'"
stop_pid "$client_pid"
stop_pid "$expiry_pid"
check "client never panicked" bash -c "! grep -qi panick '$log1' '$log2'"
fi

# ---- the untrusted uplink: leases against the tunnel's routes, stale lease files, status, rogue ACKs
# A configuration as init passes it (`riceguard dhcp --config`): peers whose AllowedIPs
# overlap dnsmasq's 192.168.77.0/24 in different ways.
gwconf() { # FILE ALLOWEDIPS [UplinkOverlap]
    printf '[Interface]\nPrivateKey = %s\nAddress = 10.100.0.1/24\n\n[Peer]\nName = %s\nPublicKey = %s\nAllowedIPs = %s\n' \
        "$("$RG" genkey)" "$4" "$("$RG" genkey | "$RG" pubkey)" "$2" >"$1"
    [ -z "$3" ] || printf '\n[Gateway]\nUplinkOverlap = %s\n' "$3" >>"$1"
}
start_client_cfg() { # RUNDIR LOG CONFIG
    mkdir -p "$1"
    spawn env RG_RUN_DIR="$1" ip netns exec $CLI "$RG" dhcp --config "$3" $VC >"$2" 2>&1
    client_pid=$!
}
dlog=$tmp/dnsmasq.log
lines_of() { wc -l <"$1" 2>/dev/null || echo 0; }
since() { tail -n +$(($2 + 1)) "$1" 2>/dev/null; } # FILE LINE: what was logged after LINE
mac=$(ip -n $CLI link show $VC | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
ip -n $CLI addr flush dev $VC
start_dnsmasq
sleep 0.5

gwconf "$tmp/site.conf" 192.168.77.0/24 "" site-b
base=$(lines_of "$dlog")
t20=$SECONDS
run3=$tmp/run3 log3=$tmp/client3.log
start_client_cfg "$run3" "$log3" "$tmp/site.conf"
check "a lease equal to peer site-b's AllowedIPs is not requested, with the reason" \
    wait_for 10 log_has "$log3" "dhcp $VC: declined the offer of 192.168.77.[0-9]*/24 from 192.168.77.1: it is peer site-b's 192.168.77.0/24 (your remote site and your uplink cannot be the same network); retrying in 10 s"
note "$(grep -m1 'declined the offer' "$log3")"
sleep $((t20 + 15 - SECONDS))
discovers=$(since "$dlog" "$base" | grep -c "DHCPDISCOVER.*$mac")
requests=$(since "$dlog" "$base" | grep -c "DHCPREQUEST.*$mac")
note "server side, 15 s after the start: $discovers DISCOVER, $requests REQUEST"
check "no decline loop: at most 2 DISCOVERs in 15 s (10 s back-off, then 20 s)" test "$discovers" -ge 1 -a "$discovers" -le 2
check "the conflicting lease was never requested" test "$requests" -eq 0
check "said once (repeats are not logged)" test "$(count "$log3" "declined the offer")" -eq 1
check "no address from the conflicting lease" bash -c "! ip -n $CLI -4 addr show dev $VC | grep -q 'inet 192.168.77.'"
stop_pid "$client_pid"

gwconf "$tmp/refuse.conf" 192.0.0.0/8 refuse hub
log4=$tmp/client4.log
start_client_cfg "$tmp/run4" "$log4" "$tmp/refuse.conf"
check "UplinkOverlap = refuse declines an overlap with a wide summary route" \
    wait_for 10 log_has "$log4" "declined the offer of 192.168.77.[0-9]*/24 from 192.168.77.1: it overlaps peer hub's 192.0.0.0/8 (UplinkOverlap = refuse)"
stop_pid "$client_pid"

# Two-armed, a lease over the LAN port's subnet (issue 29, 4): declined, whatever the policy.
printf '[Interface]\nPrivateKey = %s\nAddress = 10.100.0.1/24\n\n[Gateway]\nLan = rgdlan\nLanAddress = 192.168.77.129/25\n' "$("$RG" genkey)" >"$tmp/lanport.conf"
log12=$tmp/client12.log
start_client_cfg "$tmp/run12" "$log12" "$tmp/lanport.conf"
check "two-armed: a lease over the LAN port's subnet (192.168.77.x/24 over LanAddress 192.168.77.129/25) is declined, with the reason" \
    wait_for 10 log_has "$log12" "declined the offer of 192.168.77.[0-9]*/24 from 192.168.77.1: it overlaps the LAN port rgdlan's 192.168.77.128/25 (LanAddress: the uplink and the LAN port cannot share a network)"
stop_pid "$client_pid"

gwconf "$tmp/hub.conf" 192.0.0.0/8 "" hub
run5=$tmp/run5 log5=$tmp/client5.log
start_client_cfg "$run5" "$log5" "$tmp/hub.conf"
check "a wide summary route (hub's 192.0.0.0/8) keeps the lease (auto)" wait_for 10 log_has "$log5" "dhcp $VC: bound 192.168.77."
addr5=$(sed -n "s/.*dhcp $VC: bound \(192\.168\.77\.[0-9]*\)\/24 .*/\1/p" "$log5" | head -1)
shadow="uplink $VC 192.168.77.0/24 shadows 192.168.77.0/24 of peer hub's 192.0.0.0/8"
check "the lease file records the shadow" grep -qF "shadow $shadow" "$run5/lease.$VC"
status=$(cli env RG_RUN_DIR="$run5" "$RG" status 2>/dev/null)
check "riceguard status shows the lease and which part of which peer it shadows" \
    bash -c 'grep -q "^uplink '$VC': DHCP '$addr5'/24 " <<<"$1" && grep -qxF "$2" <<<"$1"' _ "$status" "$shadow"

# Restart with a stale lease file: the address was removed while the client was away.
stop_pid "$client_pid"
ip -n $CLI addr del "$addr5/24" dev $VC
base=$(lines_of "$dlog")
log6=$tmp/client6.log
start_client_cfg "$run5" "$log6" "$tmp/hub.conf"
check "stale lease file: the client says the address is gone" wait_for 3 log_has "$log6" "previous lease $addr5/24 is not on $VC any more: asking for it again now"
check "stale lease file: a DHCP packet at the server within 3 s of the restart" \
    wait_for 3 bash -c "tail -n +$((base + 1)) '$dlog' | grep -q 'DHCP\(REQUEST\|DISCOVER\).*$mac'"
check "stale lease file: the address is back within 5 s" wait_for 5 has_addr "$addr5/24"
stop_pid "$client_pid"
stop_pid "$dnsmasq_pid"

# A lease file left in the run directory by something else: status says nothing of it.
ip -n $CLI addr flush dev $VC
mkdir -p "$tmp/run7"
printf 'address 192.168.99.9/24\nrouter 192.168.99.1\nserver 192.168.99.1\nlease 120\nt1 60\nt2 105\nobtained 1000\n' >"$tmp/run7/lease.$VC"
status=$(cli env RG_RUN_DIR="$tmp/run7" "$RG" status 2>&1)
check "status shows no lease the interface does not hold (drop-in, stale file)" bash -c '! grep -q "^uplink " <<<"$1"' _ "$status"

# A rogue server's ACK to a renewal (20 s lease, T1 10 s) is ignored; the bound server's taken.
ip -n $SRV addr add 192.168.78.66/24 dev $VS 2>/dev/null
spawn ip netns exec $SRV python3 ci/lib/dhcp_rogue_server.py $VS 192.168.78.1 192.168.78.66 192.168.78.20 20 30 \
    >"$tmp/rogue.log" 2>&1
rogue_pid=$!
sleep 0.5
log8=$tmp/client8.log
start_client "$tmp/run8" "$log8"
check "rogue case: bound to the real server's lease" wait_for 10 log_has "$log8" "dhcp $VC: bound 192.168.78.20/24 router 192.168.78.1"
check "rogue case: renewed at T1 (10 s)" wait_for 15 log_has "$log8" "dhcp $VC: renewed 192.168.78.20/24"
check "rogue case: the rogue's ACK was sent" grep -q "rogue ACK sent" "$tmp/rogue.log"
check "rogue case: the rogue's ACK was ignored while renewing" log_has "$log8" "ignored a message from 192.168.78.66:67: from server 192.168.78.66, not the one asked"
check "rogue case: the default route still goes via the real router" has_default 192.168.78.1
check "rogue case: no rebinding to the rogue" bash -c "! grep -q 'router 192.168.78.66' '$log8'"
stop_pid "$client_pid"
stop_pid "$rogue_pid"
check "untrusted-uplink clients never panicked" bash -c "! cat '$log3' '$log4' '$log5' '$log6' '$log8' '$log12' | grep -qi panick"

# ---- leases from the tunnel's own subnet (issue 29, 1) ---------------------------------
# The factory tunnel (Address = 10.100.0.1/24, clients phone .2 and laptop .3, ProxyArp
# default) with the appliance daemon running, and a rogue DHCP server leasing from
# 10.100.0.0/24: the subnet looks like the tunnel numbered from the LAN and is kept, but
# a packet from the uplink with the phone's source never enters the tunnel (dropped,
# counted as `spoof`); a lease of exactly the phone's address is declined. Then that very
# layout for real (Address = 192.168.77.250/24 over dnsmasq's 192.168.77.0/24, a stock
# wireguard-go phone behind the server): the lease is kept and the phone reaches the LAN
# host through the tunnel, answered by proxy ARP.
start_dnsmasq_range() { # FIRST LAST ROUTER
    : >"$tmp/dnsmasq.leases"
    spawn ip netns exec $SRV dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
        --interface=$VS --bind-interfaces --dhcp-authoritative \
        --dhcp-range="$1,$2,255.255.255.0,2m" --dhcp-option=option:router,"$3" \
        --dhcp-leasefile="$tmp/dnsmasq.leases" --pid-file="$tmp/dnsmasq.pid" \
        --log-dhcp >>"$tmp/dnsmasq.log" 2>&1
    dnsmasq_pid=$!
}
spoofs() { inns $CLI nft list counter inet riceguard spoof 2>/dev/null | sed -n 's/.*packets \([0-9]*\).*/\1/p'; }
spoof_rule() { inns $CLI nft list chain inet riceguard prerouting 2>/dev/null | grep -q "ip saddr $1 .*drop"; }
k_phone=$("$RG" genkey) k_gw=$("$RG" genkey)
pub_phone=$("$RG" pubkey <<<"$k_phone") pub_gw=$("$RG" pubkey <<<"$k_gw")
factory_conf() { # FILE ADDRESS PHONE_IP LAPTOP_IP
    printf '[Interface]\nPrivateKey = %s\nListenPort = 51820\nAddress = %s\n\n[Peer]\nName = phone\nPublicKey = %s\nAllowedIPs = %s/32\n\n[Peer]\nName = laptop\nPublicKey = %s\nAllowedIPs = %s/32\n\n[Gateway]\nInterfaceName = %s\nHugePages = off\nUplink = %s\n' \
        "$k_gw" "$2" "$pub_phone" "$3" "$("$RG" genkey | "$RG" pubkey)" "$4" "$TUN" "$VC" >"$1"
    chmod 600 "$1"
}
ip -n $CLI addr flush dev $VC
ip -n $SRV addr add 10.100.0.254/24 dev $VS
factory_conf "$tmp/factory.conf" 10.100.0.1/24 10.100.0.2 10.100.0.3
wait_for 10 tun_gone
spawn env RG_LOG=info ip netns exec $CLI "$RG" up --config "$tmp/factory.conf" --workers 1 >"$tmp/gw-rogue.log" 2>&1
gw_pid=$!
check "rogue lease: the appliance daemon up with the factory tunnel 10.100.0.1/24" wait_for 10 spoof_rule 10.100.0.0/24
start_dnsmasq_range 10.100.0.50 10.100.0.60 10.100.0.254
log9=$tmp/client9.log
start_client_cfg "$tmp/run9" "$log9" "$tmp/factory.conf"
check "rogue lease: 10.100.0.5x/24 from the tunnel's subnet is kept (it looks like the tunnel numbered from the LAN)" \
    wait_for 10 log_has "$log9" "dhcp $VC: bound 10.100.0.[56][0-9]/24"
note "$(grep -m1 'bound ' "$log9")"
check "rogue lease: the phone's and the laptop's /32 stay anti-spoof rules on the uplink" \
    wait_for 10 eval 'spoof_rule 10.100.0.2 && spoof_rule 10.100.0.3'
mac_gw=$(ip -n $CLI link show $VC | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
ip -n $SRV addr add 10.100.0.2/32 dev $VS
ip -n $SRV neigh replace 10.100.0.3 lladdr "$mac_gw" dev $VS
s0=$(spoofs)
inns $SRV ping -c 3 -i 0.2 -W 1 -I 10.100.0.2 10.100.0.3 >/dev/null 2>&1
s1=$(spoofs)
check "rogue lease: 3 pings from the uplink with the phone's source 10.100.0.2 to the laptop dropped as spoofs (spoof ${s0:-?} -> ${s1:-?})" \
    test "${s1:-0}" -ge $((${s0:-0} + 3))
ip -n $SRV addr del 10.100.0.2/32 dev $VS
stop_pid "$client_pid"
stop_pid "$dnsmasq_pid"
ip -n $CLI addr flush dev $VC
start_dnsmasq_range 10.100.0.2 10.100.0.2 10.100.0.254
log10=$tmp/client10.log
start_client_cfg "$tmp/run10" "$log10" "$tmp/factory.conf"
check "a lease of the phone's own address 10.100.0.2 is declined, with the reason" \
    wait_for 10 log_has "$log10" "dhcp $VC: declined the offer of 10.100.0.2/24 from 10.100.0.254: its address 10.100.0.2 is peer phone's address"
check "no address 10.100.0.2 on the uplink" bash -c "! ip -n $CLI -4 addr show dev $VC | grep -q 'inet 10.100.0.2/'"
stop_pid "$client_pid"
stop_pid "$dnsmasq_pid"
stop_pid "$gw_pid"
ip -n $SRV addr del 10.100.0.254/24 dev $VS

# The tunnel numbered from the LAN: the phone (wireguard-go) sits behind the server
# (203.0.113.0/24, routed by it) and reaches the LAN host 192.168.77.1 through the tunnel.
PH=rgd-ph-$$ WP=rgdp$$
netns_add $PH
veth_pair $SRV rgdv2 203.0.113.1/24 $PH rgdv3 203.0.113.20/24
ip -n $PH route add default via 203.0.113.1
inns $SRV sysctl -qw net.ipv4.ip_forward=1
at_exit rm -f "/var/run/wireguard/$WP.sock"
ip -n $CLI addr flush dev $VC
factory_conf "$tmp/fromlan.conf" 192.168.77.250/24 192.168.77.251 192.168.77.252
wait_for 10 tun_gone
spawn env RG_LOG=info ip netns exec $CLI "$RG" up --config "$tmp/fromlan.conf" --workers 1 >"$tmp/gw-fromlan.log" 2>&1
gw_pid=$!
check "tunnel from the LAN: the appliance daemon up (Address = 192.168.77.250/24)" wait_for 10 tun_up
start_dnsmasq
log11=$tmp/client11.log
start_client_cfg "$tmp/run11" "$log11" "$tmp/fromlan.conf"
check "tunnel from the LAN: the real 192.168.77.0/24 lease is kept" wait_for 10 log_has "$log11" "dhcp $VC: bound 192.168.77."
lease=$(sed -n "s/.*dhcp $VC: bound \(192\.168\.77\.[0-9]*\)\/24 .*/\1/p" "$log11" | head -1)
check "tunnel from the LAN: the phone's /32 is an anti-spoof rule on the uplink" wait_for 10 spoof_rule 192.168.77.251
spawn ip netns exec $PH wireguard-go -f $WP >"$tmp/$WP.log" 2>&1
wp_pid=$!
if wait_for 5 test -S "/var/run/wireguard/$WP.sock"; then
    printf '%s\n' "$k_phone" >"$tmp/phone.key"
    inns $PH wg set $WP private-key "$tmp/phone.key" peer "$pub_gw" endpoint "${lease:-192.168.77.9}:51820" allowed-ips 192.168.77.0/24
    ip -n $PH addr add 192.168.77.251/32 dev $WP
    ip -n $PH link set mtu 1420 up dev $WP
    ip -n $PH route add 192.168.77.0/24 dev $WP
    ip -n $PH route add "${lease:-192.168.77.9}/32" via 203.0.113.1
    check "tunnel from the LAN: the phone (wireguard-go) reaches the LAN host 192.168.77.1 through the tunnel (ping)" \
        wait_for 10 inns $PH ping -c 1 -W 1 192.168.77.1
    ping_out=$(inns $PH ping -c 3 -i 0.2 -W 2 192.168.77.1 2>&1)
    check "tunnel from the LAN: 3/3 replies ($(grep -o '[0-9]* received' <<<"$ping_out"))" grep -q ' 3 received' <<<"$ping_out"
    check "tunnel from the LAN: untranslated, answered by proxy ARP (the LAN host resolved 192.168.77.251 to the appliance's $mac_gw)" \
        bash -c "ip -n $SRV neigh show 192.168.77.251 dev $VS | grep -q 'lladdr $mac_gw'"
    if ! grep -q ' 3 received' <<<"$ping_out"; then
        echo "---- appliance routes, the server's neighbours, the phone's wg"
        ip -n $CLI route; ip -n $CLI -4 addr; ip -n $SRV neigh; ip -n $SRV route; inns $PH wg show $WP
        inns $CLI nft list ruleset | grep -E 'counter|policy' | head -40
        inns $CLI sysctl net.ipv4.conf.all.proxy_arp net.ipv4.conf.$VC.proxy_arp net.ipv4.ip_forward
    fi
else
    ko "tunnel from the LAN: wireguard-go did not start ($(tail -3 "$tmp/$WP.log"))"
fi
stop_pid "$wp_pid"
stop_pid "$client_pid"
stop_pid "$dnsmasq_pid"
stop_pid "$gw_pid"
check "the appliance daemons never panicked" bash -c "! cat '$tmp/gw-rogue.log' '$tmp/gw-fromlan.log' '$log9' '$log10' '$log11' | grep -qi panick"

if [ "$failed" -gt 0 ]; then
    for f in "$tmp"/client*.log "$tmp/rogue.log"; do [ -e "$f" ] && { echo "---- $f"; tail -n 15 "$f"; }; done
    echo "---- dnsmasq log"; tail -n 20 "$tmp/dnsmasq.log" 2>/dev/null
    for f in "$tmp"/gw*.log; do echo "---- appliance daemon log $f"; tail -n 20 "$f"; done
fi
h_finish
