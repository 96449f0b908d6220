#!/usr/bin/env bash
# The appliance's firewall and NAT (zones, anti-spoofing, fail closed), end to end with the release binary
# (`riceguard up --config FILE`, `riceguard console --root DIR`) in network namespaces.
# Names rgf<X><pid>; traffic only between the lab's namespaces.
#
# A. one-armed, the README's first client ("First boot on hardware"):
#
#   ns P phone 203.0.113.20 ─┐                      ┌─ ns G appliance `upl` 192.168.1.2/24,
#   ns Q laptop 203.0.113.30 ┴─ wan0 ── ns R ── br0 ┤   2001:db8:1::2/64, factory config
#   (the internet side)    203.0.113.1  home  .1    └─ ns L LAN host 192.168.1.10 (default
#   ns I "internet host" 198.51.100.10 ── R   router     via R, no route to the tunnel)
#        2001:db8:ff::10
#   R masquerades its LAN toward the internet, forwards udp/51820 to G and has no route
#   to 10.100.0.0/24 (nor fd00:100::/64); I has a route to 2001:db8:1::/64 only.
#   (1) factory default.conf (real key), `set gateway public-endpoint`, `add client
#       phone`, `commit`; the printed config in stock wireguard-go: the phone pings L
#       (3/3) and opens a TCP connection to it; L sees the appliance's uplink address.
#   (2) `set interface address fd00:100::1/64`, `add client laptop full-tunnel`, `commit`:
#       the laptop reaches I over IPv4 and IPv6 (ping, TCP); the uplink capture shows no
#       10.100.0.x or fd00:100:: source (NAT, NAT66).
#   (5) 20000 datagrams from 1000 source ports at the WireGuard port leave conntrack's
#       count where it was (notrack; a control flood of 300 tracked flows shows the count
#       does move), and the phone completes a new handshake afterwards; L (on-link, given
#       a route) reaches the phone, a source off the uplink's subnets does not.
#   (6) closed ports, spoofed tunnel sources (IPv4, IPv6) and a SYN+FIN segment from L:
#       dropped and counted; echo from the uplink rate-limited (5/s, burst 10) with a new
#       ICMP id per request and with one id; `riceguard status` shows the `firewall:`
#       and `nat:` lines and the counts.
#   (7) R sends an ICMP "fragmentation needed" (MTU 1400) and an ICMPv6 "packet too big"
#       (MTU 1280) quoting datagrams from G's WireGuard port: accepted (not `invalid`),
#       and `ip route get` shows the learnt MTU; an MLD query from R's link-local
#       address is answered with a listener report.
#   (4) a host table `inet hostfw` survives start, reloads and exit; the table is there
#       when the tunnel is up; `Firewall = off` + SIGHUP removes it, back on restores it;
#       after `kill -9` it stays and still drops; a clean exit leaves it.
# B. two-armed (`Lan = lanp`, `LanAddress = 192.168.88.1/24`, `TcpListen = 443`):
#
#   ns U uplink host 192.0.2.10 (routes to 192.168.88.0/24 and 10.100.0.0/24 via H) ─ br0
#     ├─ ns H appliance `upl` 192.0.2.2/24, `lanp` ── ns M LAN host 192.168.88.10
#     └─ ns S phone 192.0.2.20 (wireguard-go over UDP; a second one through udp2tcp)
#   (3) from U: ping, TCP and UDP to M, to the phone's tunnel address and to closed ports
#       of the appliance: no reply, no RST, no ICMP error; no handshake and no data toward
#       the phone; a spoofed 10.100.0.2 never reaches M and counts as `spoof`; the phone
#       and M reach each other; M reaches U (masqueraded) and gets the replies; the
#       WireGuard and TCP-fallback ports work from the uplink; the LAN and the tunnel
#       reach the appliance itself (a closed port answers with a RST).
#   (7) M sends UDP 67->68, 547->546 (from fd00:100::3) and 68->67 from a tunnel source
#       to a client: each dropped and counted as `spoof` (DHCP is exempt only from the
#       uplink to the appliance), the phone receives none. M's UDP from source port
#       51820 (the WireGuard port) to U gets U's reply (masqueraded off that port, so
#       its replies are tracked and de-NATed).
#   (4) a reload adding a peer adds its prefix to the anti-spoof rules; `kill -9`: the
#       table stays and U still reaches neither M nor, spoofed, anything.
#   (6) `riceguard status` in H: the counts of spoof, uplink-forward, uplink-in.
# C. a stale table is not ours (issue 29): the appliance in ns X (uplink `upl`
#   198.18.0.2/24 to ns Y) runs with `InterfaceName = rgfc<pid>` (table in place,
#   forwarding on), exits cleanly (its table stays, forwarding stays on). Another
#   firewall on the host then fills the forward hook (1024 base chains of table
#   `inet rgfill`: the kernel's limit per hook), so the next install is refused (E2BIG:
#   the new table's chains register before the old one's go). Restarted with
#   `InterfaceName = rgfd<pid>`: the old table (old interface name) is still there, and
#   IPv4 and IPv6 forwarding must be off, the log and `riceguard status` saying why;
#   once `rgfill` is gone the watch installs the table for rgfd<pid> and forwarding is
#   on again.
#
# Client set-up: no wg-quick (it needs resolvconf for the DNS line and a kernel
# WireGuard link type first): `wg-quick strip`, `wg setconf`, then Address, MTU and one
# route per allowed IP by hand as wg-quick does (a /0 through table 51820 with its
# fwmark and suppress_prefixlength rules), as ci/test-generic-board.sh does.
#
# Needs root, wireguard-go, wireguard-tools, iproute2, nftables, tcpdump, python3.
# riceguard is $RG_BIN (default target/release/riceguard). About 70 s.
# Prints "firewall: N passed, N failed"; exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
. ci/lib/harness.sh
h_init firewall
require_rg
require_tools wireguard-go wg wg-quick ip nft tcpdump python3 ping ss

ID=$$
R=rgfR$ID G=rgfG$ID L=rgfL$ID I=rgfI$ID P=rgfP$ID Q=rgfQ$ID
U=rgfU$ID H=rgfH$ID S=rgfS$ID M=rgfM$ID
X=rgfX$ID Y=rgfY$ID
TA=rgfa$ID TB=rgfb$ID TC=rgfc$ID TD=rgfd$ID   # the appliances' tunnels
WP=rgfp$ID WL=rgfl$ID WS=rgfs$ID WT=rgft$ID   # clients: phone, laptop (A); phone, TCP phone (B)
WORK=$(mktemp -d /tmp/rgf-firewall.XXXXXX)
FWP="python3 ci/lib/fwprobe.py"
T0=$SECONDS

cleanup() {
    local i
    for i in $TA $TB $TC $TD $WP $WL $WS $WT; do rm -f "/var/run/wireguard/$i.sock"; done
    for i in $TA $TB $TC $TD; do rm -f "/run/riceguard/$i.status"; done
    if [ -n "${RG_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
at_exit cleanup

# replies NS DST COUNT: how many of COUNT echo requests were answered.
replies() {
    local n
    n=$(inns "$1" ping -n -c "$3" -i 0.3 -W 2 "$2" 2>/dev/null | sed -n 's/.* \([0-9]*\) received.*/\1/p')
    echo "${n:-0}"
}
# ping_ok NS DST: a reply within 8 one-second tries (the first may wait for a handshake).
ping_ok() {
    local i
    for i in $(seq 8); do inns "$1" ping -n -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    return 1
}
listening() { [ -n "$(inns "$1" ss -Hltn "sport = :$2")" ]; }
# serve NS PORT PEERS: fwprobe's TCP/UDP echo on [::]:PORT for 100 s; TCP peers to PEERS.
serve() {
    : >"$3"
    spawn ip netns exec "$1" timeout 110 $FWP serve "$2" 100 "$3"
    wait_for 5 listening "$1" "$2"
}
# probe NS SECONDS SPEC...: fwprobe's probes, "SPEC RESULT" lines into $PROBED.
PROBED=
probe() {
    local ns=$1; shift
    PROBED=$(inns "$ns" timeout 30 $FWP probe "$@" 2>&1)
    echo "$PROBED" | sed 's/^/     probe /'
}
result_of() { echo "$PROBED" | awk -v s="$1" '$1 == s {print $2}'; }
# Captures: tcpdump text into $WORK/NAME.cap, at most 150 s.
declare -A CAP
cap_start() { # NAME NS IFACE FILTER [TCPDUMP OPTION...]
    local name=$1 ns=$2 ifc=$3 filter=$4
    shift 4
    : >"$WORK/$name.err"
    spawn ip netns exec "$ns" timeout 150 tcpdump -i "$ifc" -nn -l -U "$@" "$filter" >"$WORK/$name.cap" 2>"$WORK/$name.err"
    CAP[$name]=$!
    wait_for 5 grep -q "listening on" "$WORK/$name.err"
}
cap_stop() { sleep 0.5; stop_pid "${CAP[$1]}"; }
cap_lines() { grep -c . "$WORK/$1.cap" 2>/dev/null || true; }

has_table() { inns "$1" nft list table inet riceguard >/dev/null 2>&1; }
no_table() { ! has_table "$1"; }
# counter NS NAME: packets counted by the named counter of our table (0 if none).
counter() {
    local n
    n=$(inns "$1" nft list counter inet riceguard "$2" 2>/dev/null | sed -n 's/.*packets \([0-9]*\).*/\1/p' | head -1)
    echo "${n:-0}"
}
hostfw_ok() { inns "$1" nft list table inet hostfw 2>/dev/null | grep -q 'counter packets'; }
sysctl_is() { [ "$(inns "$1" sysctl -n "$2" 2>/dev/null)" = "$3" ]; }
conntrack_count() { inns "$1" cat /proc/sys/net/netfilter/nf_conntrack_count 2>/dev/null || echo 0; }
# handshake NS TUN PUBKEY: the peer's latest handshake (unix seconds, 0 = none).
handshake() {
    local t
    t=$(inns "$1" wg show "$2" latest-handshakes 2>/dev/null | awk -v k="$3" '$1 == k {print $2}')
    echo "${t:-0}"
}
hs_after() { [ "$(handshake "$1" "$2" "$3")" -gt "$4" ]; }
# status_count TEXT NAME: the number after NAME in `riceguard status` output.
status_count() {
    local n
    n=$(printf '%s\n' "$1" | grep -oE "(^|[^a-z-])$2[ :=]+[0-9]+" | grep -oE '[0-9]+$' | head -1)
    echo "${n:-0}"
}
# status_wait NS TUN COUNTER...: `riceguard status` into ST, until it shows each counter
# at least at what nft counts now (the daemon rewrites its status file about once a
# second), at most 5 s. WANT[COUNTER] keeps those counts: a check compares with them,
# not with nft's count read later (a stray drop in between is not the status's fault).
ST=
declare -A WANT
status_wait() {
    local ns=$1 tun=$2 c all end=$((SECONDS + 5))
    shift 2
    for c; do WANT[$c]=$(counter "$ns" "$c"); done
    while :; do
        ST=$(inns "$ns" "$RG" status "$tun" 2>&1)
        all=1
        for c; do
            [ "$(status_count "$ST" "$c")" -ge "${WANT[$c]}" ] || all=0
        done
        [ $all = 1 ] && return 0
        [ $SECONDS -ge "$end" ] && return 1
        sleep 0.3
    done
}

# ---- the appliance daemon -------------------------------------------------------------------
# gw_start NS CONF TUN LOG: `riceguard up --config` (a foreground process) in NS; GWPID.
GWPID=
gw_start() {
    local ns=$1 conf=$2 tun=$3 log=$4
    spawn env RG_LOG=info ip netns exec "$ns" "$RG" up --config "$conf" --workers 1 >>"$log" 2>&1
    GWPID=$!
    wait_for 10 sh -c "[ -S /var/run/wireguard/$tun.sock ] && ip -n $ns -o link show $tun 2>/dev/null | grep -q ',UP'"
}

# ---- clients: stock wireguard-go set up as wg-quick would --------------------------------
declare -A WGPID
client_conf() { # NAME TRANSCRIPT FILE: the wg-quick text printed between the markers
    awk -v b="----- BEGIN WIREGUARD CONFIG $1 -----" -v e="----- END WIREGUARD CONFIG $1 -----" '
        $0 == b { on = 1; next } $0 == e { on = 0; found = 1; exit } on { print }
        END { exit !found }' "$2" >"$3" && chmod 600 "$3" && [ -s "$3" ]
}
conf_val() { awk -F= -v k="$2" 'tolower($1) ~ "^ *" k " *$" {sub(/^[^=]*= */, ""); print; exit}' "$1"; }
client_up() { # NS IF CONF
    local ns=$1 wgif=$2 f=$WORK/$2.conf a mtu ip v table=51820
    install -m 0600 "$3" "$f"
    wg-quick strip "$f" >"$WORK/$wgif.stripped" || return 1
    spawn ip netns exec "$ns" wireguard-go -f "$wgif" >"$WORK/$wgif.log" 2>&1
    WGPID[$wgif]=$!
    wait_for 5 test -S "/var/run/wireguard/$wgif.sock" || return 1
    inns "$ns" wg setconf "$wgif" "$WORK/$wgif.stripped" || return 1
    for a in $(conf_val "$f" address | tr ',' ' '); do
        case $a in
            *:*) inns "$ns" ip -6 address add "$a" dev "$wgif" nodad ;;
            *) inns "$ns" ip -4 address add "$a" dev "$wgif" ;;
        esac || return 1
    done
    mtu=$(conf_val "$f" mtu | tr -d ' ')
    inns "$ns" ip link set mtu "${mtu:-1420}" up dev "$wgif" || return 1
    for ip in $(inns "$ns" wg show "$wgif" allowed-ips | awk '{for (i = 2; i <= NF; i++) print $i}' | sort -nr -k 2 -t /); do
        case $ip in *:*) v=-6 ;; *) v=-4 ;; esac
        case $ip in
            */0)
                inns "$ns" wg set "$wgif" fwmark $table
                inns "$ns" ip $v rule add not fwmark $table table $table
                inns "$ns" ip $v rule add table main suppress_prefixlength 0
                inns "$ns" ip $v route add "$ip" dev "$wgif" table $table
                inns "$ns" sysctl -qw net.ipv4.conf.all.src_valid_mark=1 ;;
            *) inns "$ns" ip $v route add "$ip" dev "$wgif" ;;
        esac || return 1
    done
}
client_down() { # NS IF
    [ -n "${WGPID[$2]:-}" ] && stop_pid "${WGPID[$2]}"
    WGPID[$2]=
    rm -f "/var/run/wireguard/$2.sock"
}

# =========================================================================================
# A. one-armed: the factory configuration and the README's first client
# =========================================================================================
echo "--- A: one-armed appliance, factory configuration"
netns_add $R $G $L $I $P $Q
for n in $R $G $L $I $P $Q; do
    inns $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
inns $R sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
# The appliance starts with forwarding off: the daemon must turn it on. rp_filter off, so
# only the firewall can stop a spoofed source.
inns $G sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 \
    net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
for b in br0 wan0; do ip -n $R link add $b type bridge && ip -n $R link set $b up; done
veth_pair $R rg - $G upl 192.168.1.2/24
veth_pair $R rl - $L eth0 192.168.1.10/24
veth_pair $R rp - $P eth0 203.0.113.20/24
veth_pair $R rq - $Q eth0 203.0.113.30/24
veth_pair $R ri 198.51.100.1/24 $I eth0 198.51.100.10/24
for i in rg rl; do ip -n $R link set $i master br0; done
for i in rp rq; do ip -n $R link set $i master wan0; done
ip -n $R addr add 192.168.1.1/24 dev br0
ip -n $R addr add 2001:db8:1::1/64 dev br0 nodad
ip -n $R addr add 203.0.113.1/24 dev wan0
ip -n $R addr add 2001:db8:ff::1/64 dev ri nodad
ip -n $G addr add 2001:db8:1::2/64 dev upl nodad
ip -n $G route add default via 192.168.1.1
ip -n $G -6 route add default via 2001:db8:1::1
ip -n $L route add default via 192.168.1.1
ip -n $L addr add 2001:db8:1::10/64 dev eth0 nodad
ip -n $I addr add 2001:db8:ff::10/64 dev eth0 nodad
ip -n $I -6 route add 2001:db8:1::/64 via 2001:db8:ff::1
inns $R nft -f - <<'EOF'
table ip rgfnat {
    chain pre { type nat hook prerouting priority -100; iifname "wan0" udp dport 51820 dnat to 192.168.1.2; }
    chain post { type nat hook postrouting priority 100; ip saddr 192.168.1.0/24 oifname != "br0" masquerade; }
}
EOF
# Someone else's firewall on the appliance's host.
inns $G nft add table inet hostfw
inns $G nft add chain inet hostfw input '{ type filter hook input priority 0; }'
inns $G nft add rule inet hostfw input counter

# The factory configuration as init puts it on perm at first boot: default.conf with a
# fresh key (and this lab's interface name: UAPI sockets and status files are global).
PERM=$WORK/perm STATUS_A=/run/riceguard/$TA.status
mkdir -p "$PERM"
ka=$("$RG" genkey)
sed -e "s|@PRIVATE_KEY@|$ka|" -e "s|^InterfaceName = wg0$|InterfaceName = $TA|" \
    rootfs-overlay/etc/riceguard/default.conf >"$PERM/riceguard.conf"
chmod 600 "$PERM/riceguard.conf"
grep -q "^InterfaceName = $TA$" "$PERM/riceguard.conf" || h_abort "default.conf changed shape: no InterfaceName = wg0"

if gw_start $G "$PERM/riceguard.conf" $TA "$WORK/a.log"; then
    ok "A: riceguard up --config (factory configuration) is up (pid $GWPID)"
else
    tail -20 "$WORK/a.log"; h_abort "A: the appliance did not come up"
fi
GWA=$GWPID
echo "$GWA" >"$WORK/a.pid"
check "(4) A: table inet riceguard in place as soon as the tunnel is up" has_table $G
check "(4) A: the host's table inet hostfw survived up --config" hostfw_ok $G
fw_line=$(grep -n 'firewall: table inet riceguard in place' "$WORK/a.log" | head -1 | cut -d: -f1)
up_line=$(grep -n "$TA: up," "$WORK/a.log" | head -1 | cut -d: -f1)
[ -n "$fw_line" ] && [ -n "$up_line" ] && [ "$fw_line" -lt "$up_line" ] &&
    ok "(4) A: the log says the table was in place before the tunnel came up" ||
    ko "(4) A: log order: 'table in place' at line ${fw_line:-none}, '$TA: up' at line ${up_line:-none}"
check "A: the daemon turned IPv4 forwarding on" sysctl_is $G net.ipv4.ip_forward 1
check "A: the daemon turned IPv6 forwarding on" sysctl_is $G net.ipv6.conf.all.forwarding 1
if has_table $G; then
    inns $G nft list table inet riceguard >"$WORK/a-ruleset-0.txt"
    check "A: chains prerouting input forward output postrouting" sh -c \
        "for c in prerouting input forward output postrouting; do grep -q \"chain \$c \" '$WORK/a-ruleset-0.txt' || exit 1; done"
    check "A: named counters spoof uplink-in uplink-forward invalid" sh -c \
        "for c in spoof uplink-in uplink-forward invalid; do grep -q \"counter \$c \" '$WORK/a-ruleset-0.txt' || exit 1; done"
fi

# console_a: `riceguard console` on the perm directory, commands on stdin (in G, so it
# finds the uplink as the appliance's console does).
console_a() {
    inns $G timeout 60 "$RG" console --root "$PERM" --pidfile "$WORK/a.pid" \
        --status-file "$STATUS_A" --socket "/var/run/wireguard/$TA.sock" 2>&1
}

# ---- (1) the first client --------------------------------------------------------------------
echo "--- (1) set gateway public-endpoint, add client phone, commit"
printf '%s\n' "set gateway public-endpoint 203.0.113.1:51820" "add client phone" "commit" |
    console_a >"$WORK/console1.txt"
check "(1) commit: the gateway applied it" grep -q "the gateway applied it (reload generation" "$WORK/console1.txt"
if client_conf phone "$WORK/console1.txt" "$WORK/phone.conf"; then
    ok "(1) add client phone printed a wg-quick config"
    echo "     $(tr '\n' ';' <"$WORK/phone.conf" | sed 's/PrivateKey = [^;]*/PrivateKey = (hidden)/; s/PresharedKey = [^;]*/PresharedKey = (hidden)/')"
else
    sed 's/^/     | /' "$WORK/console1.txt" | head -40
    h_abort "(1) add client phone: no config between the BEGIN/END markers"
fi
check "(1) phone: Address 10.100.0.2/32" grep -qxE 'Address *= *10\.100\.0\.2/32' "$WORK/phone.conf"
check "(1) phone: Endpoint 203.0.113.1:51820 (the public endpoint)" grep -qxE 'Endpoint *= *203\.0\.113\.1:51820' "$WORK/phone.conf"
check "(1) phone: AllowedIPs has the tunnel and the LAN (the uplink's subnet)" \
    sh -c "grep -E '^AllowedIPs' '$WORK/phone.conf' | grep -q '10.100.0.0/24' && grep -E '^AllowedIPs' '$WORK/phone.conf' | grep -q '192.168.1.0/24'"
pk_phone=$(conf_val "$WORK/phone.conf" privatekey | tr -d ' ' | wg pubkey)
if client_up $P $WP "$WORK/phone.conf"; then ok "(1) phone: stock wireguard-go runs the printed config"
else h_abort "(1) phone: could not set up wireguard-go with the printed config"; fi
if wait_for 10 hs_after $G $TA "$pk_phone" 0; then ok "(1) phone: handshake with the appliance (through R's port forward)"
else ko "(1) phone: no handshake within 10 s"; fi
lr=$(ip -n $L -4 route show | grep -v '^default via 192\.168\.1\.1 ' | grep -v '^192\.168\.1\.0/24 ')
[ -z "$lr" ] && ok "(1) L has no route to the tunnel (only its /24 and the default via R)" || ko "(1) L's routes: $lr"
serve $L 7777 "$WORK/l.peers"
cap_start lcap $L eth0 'icmp or tcp port 7777'
n=$(replies $P 192.168.1.10 3)
[ "$n" = 3 ] && ok "(1) the phone pings LAN host 192.168.1.10: 3/3" || ko "(1) the phone pings LAN host 192.168.1.10: $n/3"
got=$(inns $P timeout 10 $FWP tcp-check 192.168.1.10 7777)
[ "$got" = ok ] && ok "(1) TCP phone -> 192.168.1.10:7777: line echoed" || ko "(1) TCP phone -> L: $got"
cap_stop lcap
check "(1) L saw the echo requests from the appliance's uplink address 192.168.1.2" \
    grep -q 'IP 192.168.1.2 > 192.168.1.10: ICMP echo request' "$WORK/lcap.cap"
check "(1) L saw no 10.100.0.x address" sh -c "! grep -q '10\.100\.0\.' '$WORK/lcap.cap'"
peers=$(sort -u "$WORK/l.peers" | tr '\n' ' ')
[ "$peers" = "192.168.1.2 " ] && ok "(1) L's TCP server saw the peer 192.168.1.2 (NAT to the uplink's address)" ||
    ko "(1) L's TCP server saw peers: '$peers'"

# ---- (2) full tunnel, IPv4 and IPv6 ------------------------------------------------------------
echo "--- (2) set interface address fd00:100::1/64, add client laptop full-tunnel, commit"
printf '%s\n' "set interface address fd00:100::1/64" "add client laptop full-tunnel" "commit" |
    console_a >"$WORK/console2.txt"
check "(2) commit: the gateway applied it" grep -q "the gateway applied it (reload generation" "$WORK/console2.txt"
if client_conf laptop "$WORK/console2.txt" "$WORK/laptop.conf"; then
    ok "(2) add client laptop full-tunnel printed a config"
else
    note "(2) \`add client laptop full-tunnel\` printed no config (option not there yet?):"
    grep -i 'full\|error\|unknown' "$WORK/console2.txt" | head -3 | sed 's/^/     | /'
    printf '%s\n' "add client laptop" "commit" | console_a >"$WORK/console3.txt"
    if client_conf laptop "$WORK/console3.txt" "$WORK/laptop.conf"; then
        sed -i 's|^AllowedIPs *=.*|AllowedIPs = 0.0.0.0/0, ::/0|' "$WORK/laptop.conf"
        ko "(2) full-tunnel: \`add client laptop full-tunnel\` missing; made with \`add client laptop\` and AllowedIPs = 0.0.0.0/0, ::/0 set on the client by hand"
    else
        h_abort "(2) add client laptop: no config"
    fi
fi
check "(2) laptop: AllowedIPs = 0.0.0.0/0, ::/0" grep -qxE 'AllowedIPs *= *0\.0\.0\.0/0, *::/0' "$WORK/laptop.conf"
check "(2) laptop: an IPv6 tunnel address in fd00:100::/64" grep -qE '^Address *=.*fd00:100::' "$WORK/laptop.conf"
grep -qE '^DNS *=' "$WORK/laptop.conf" && note "(2) laptop: $(grep -E '^DNS' "$WORK/laptop.conf")" ||
    note "(2) laptop: no DNS line (no ClientDns and no DHCP lease in this lab)"
pk_laptop=$(conf_val "$WORK/laptop.conf" privatekey | tr -d ' ' | wg pubkey)
if client_up $Q $WL "$WORK/laptop.conf"; then ok "(2) laptop: stock wireguard-go runs the printed config (with /0 routes)"
else ko "(2) laptop: could not set up wireguard-go"; fi
serve $I 7777 "$WORK/i.peers"
cap_start gcap $G upl 'not arp and not udp port 51820'
ping_ok $Q 198.51.100.10 >/dev/null
n=$(replies $Q 198.51.100.10 3)
[ "$n" = 3 ] && ok "(2) full tunnel: laptop pings internet host 198.51.100.10: 3/3" || ko "(2) laptop pings 198.51.100.10: $n/3"
got=$(inns $Q timeout 10 $FWP tcp-check 198.51.100.10 7777)
[ "$got" = ok ] && ok "(2) full tunnel: TCP laptop -> 198.51.100.10:7777" || ko "(2) TCP laptop -> I: $got"
n=$(replies $Q 2001:db8:ff::10 3)
[ "$n" = 3 ] && ok "(2) full tunnel IPv6: laptop pings 2001:db8:ff::10: 3/3" || ko "(2) laptop pings 2001:db8:ff::10: $n/3"
got=$(inns $Q timeout 10 $FWP tcp-check 2001:db8:ff::10 7777)
[ "$got" = ok ] && ok "(2) full tunnel IPv6: TCP laptop -> [2001:db8:ff::10]:7777" || ko "(2) TCP6 laptop -> I: $got"
cap_stop gcap
leak=$(grep -E 'IP6? (10\.100\.0\.|fd00:100:)' "$WORK/gcap.cap" | head -3)
[ -z "$leak" ] && ok "(2) uplink capture: no 10.100.0.x and no fd00:100:: source left ($(cap_lines gcap) packets seen)" ||
    ko "(2) uplink capture: tunnel sources leaving: $leak"
check "(2) uplink capture: the laptop's IPv4 traffic left as 192.168.1.2 (NAT)" grep -q 'IP 192.168.1.2 > 198.51.100.10: ICMP echo request' "$WORK/gcap.cap"
check "(2) uplink capture: the laptop's IPv6 traffic left as 2001:db8:1::2 (NAT66)" grep -q 'IP6 2001:db8:1::2 > 2001:db8:ff::10: ICMP6, echo request' "$WORK/gcap.cap"
peers=$(sort -u "$WORK/i.peers" | tr '\n' ' ')
[ "$peers" = "198.51.100.1 2001:db8:1::2 " ] && ok "(2) I's server saw 198.51.100.1 (R's NAT) and 2001:db8:1::2 (the appliance's NAT66)" ||
    ko "(2) I's server saw peers '$peers'"

# ---- (5) conntrack under a flood ---------------------------------------------------------------
echo "--- (5) a flood at the WireGuard port"
check "(5) prerouting has notrack for the WireGuard port (to the appliance's own addresses)" sh -c "ip netns exec $G nft list chain inet riceguard prerouting | grep -q 'udp dport 51820 fib daddr type local notrack'"
c0=$(conntrack_count $G)
fl=$(inns $L timeout 20 $FWP flood 192.168.1.2 51820 1000 20 10)
sleep 1
c1=$(conntrack_count $G)
note "(5) $fl; conntrack entries in G: $c0 before, $c1 after"
[ "$c1" -le $((c0 + 20)) ] && ok "(5) notrack: the flood left nf_conntrack_count about where it was ($c0 -> $c1)" ||
    ko "(5) the flood at the WireGuard port added conntrack entries: $c0 -> $c1"
hs0=$(handshake $G $TA "$pk_phone")
client_down $P $WP
sleep 1
client_up $P $WP "$WORK/phone.conf" || ko "(5) phone: restart failed"
if wait_for 15 hs_after $G $TA "$pk_phone" "$hs0"; then ok "(5) after the flood: a new handshake with the phone completed"
else ko "(5) after the flood: no new handshake with the phone within 15 s"; fi
n=$(replies $P 192.168.1.10 3)
[ "$n" = 3 ] && ok "(5) after the flood: the phone pings L 3/3" || ko "(5) after the flood: the phone pings L $n/3"
# Control: the same shape of flood at a forwarded (tracked) destination moves the count.
ip -n $L route add 10.100.0.0/24 via 192.168.1.2
n=$(replies $L 10.100.0.2 3)
[ "$n" = 3 ] && ok "(5) one-armed: L (an on-link host, given a route) pings the phone 10.100.0.2: 3/3" ||
    ko "(5) one-armed: L pings the phone with a route: $n/3"
c2=$(conntrack_count $G)
fl=$(inns $L timeout 20 $FWP flood 10.100.0.2 9 300 1 10)
sleep 1
c3=$(conntrack_count $G)
[ "$c3" -ge $((c2 + 250)) ] && ok "(5) control: 300 tracked flows through the appliance add entries ($c2 -> $c3)" ||
    ko "(5) control: 300 forwarded flows moved nf_conntrack_count only $c2 -> $c3 (is conntrack counting at all?)"
# One-armed, the uplink enters the tunnel only from its own subnets.
f0=$(counter $G uplink-forward)
cap_start pcap $P $WP 'src host 172.16.9.9'
inns $L $FWP spoof 172.16.9.9 10.100.0.2 udp:9 3 >/dev/null
cap_stop pcap
[ "$(cap_lines pcap)" = 0 ] && [ "$(counter $G uplink-forward)" -ge $((f0 + 3)) ] &&
    ok "(5) one-armed: a source off the uplink's subnets (172.16.9.9) does not enter the tunnel (uplink-forward)" ||
    ko "(5) one-armed: 172.16.9.9 -> phone: $(cap_lines pcap) reached it, uplink-forward $f0 -> $(counter $G uplink-forward)"
ip -n $L route del 10.100.0.0/24 via 192.168.1.2

# ---- (6) drops from the uplink, counted; status ------------------------------------------------
echo "--- (6) one-armed: closed ports, spoofed source, invalid segment from L"
s0=$(counter $G spoof) u0=$(counter $G uplink-in) v0=$(counter $G invalid)
probe $L 2 tcp:192.168.1.2:22 udp:192.168.1.2:53 tcp:192.168.1.2:8080 tcp:[2001:db8:1::2]:22
for p in tcp:192.168.1.2:22 tcp:192.168.1.2:8080 tcp:[2001:db8:1::2]:22; do
    r=$(result_of $p); [ "$r" = timeout ] && ok "(6) L -> $p closed port: dropped (no RST)" || ko "(6) L -> $p: $r (want timeout)"
done
r=$(result_of udp:192.168.1.2:53); [ "$r" = silent ] && ok "(6) L -> udp:192.168.1.2:53 closed port: dropped (no ICMP)" || ko "(6) L -> udp 53: $r"
inns $L $FWP spoof 10.100.0.9 192.168.1.2 udp:9 3 >/dev/null
inns $L $FWP tcp-flags 192.168.1.10 192.168.1.2 22 SF >/dev/null
sleep 0.3
s1=$(counter $G spoof) u1=$(counter $G uplink-in) v1=$(counter $G invalid)
[ "$s1" -ge $((s0 + 3)) ] && ok "(6) spoofed 10.100.0.9 from L counted as spoof ($s0 -> $s1)" || ko "(6) spoof counter $s0 -> $s1"
ip -n $L addr add fd00:100::9/128 dev eth0 nodad
n=$(inns $L ping -n -c2 -i0.3 -W1 -I fd00:100::9 2001:db8:1::2 2>/dev/null | sed -n 's/.* \([0-9]*\) received.*/\1/p')
ip -n $L addr del fd00:100::9/128 dev eth0
s2=$(counter $G spoof)
[ "${n:-0}" = 0 ] && [ "$s2" -ge $((s1 + 2)) ] && ok "(6) IPv6: spoofed fd00:100::9 from L dropped as spoof ($s1 -> $s2)" ||
    ko "(6) IPv6 spoof fd00:100::9: ${n:-0}/2 answered, spoof $s1 -> $s2"
# Echo from the uplink at 5/s, burst 10: 40 requests at 100/s, a new ICMP id each (40
# conntrack flows), then all with one id (one flow, as `ping -f` sends).
sleep 2.5   # the limiter's bucket refills (earlier pings of this lab)
for mode in vary same; do
    r=$(inns $L timeout 10 $FWP echo 192.168.1.2 40 100 $mode)
    n=$(echo "$r" | sed -n 's/^answered \([0-9]*\) .*/\1/p')
    [ "${n:-0}" -ge 5 ] && [ "${n:-0}" -le 16 ] && ok "(6) echo from the uplink rate-limited, $mode ICMP id: $r at 100/s (5/s, burst 10)" ||
        ko "(6) echo from the uplink, $mode ICMP id: $r at 100/s (want 5..16)"
    sleep 2.5
done
[ "$u1" -ge $((u0 + 3)) ] && ok "(6) closed ports counted as uplink-in ($u0 -> $u1)" || ko "(6) uplink-in counter $u0 -> $u1"
[ "$v1" -ge $((v0 + 1)) ] && ok "(6) SYN+FIN counted as invalid ($v0 -> $v1)" || ko "(6) invalid counter $v0 -> $v1"
status_wait $G $TA spoof uplink-in invalid || note "(6) status: counts still behind nft's after 5 s"
echo "$ST" | grep -E '^ *(firewall|nat)' | sed 's/^/     | /'
check "(6) status: a firewall: line saying on" grep -qE '^ *firewall: on' <<<"$ST"
for c in spoof uplink-in invalid; do
    n=$(status_count "$ST" $c)
    [ "$n" -gt 0 ] && [ "$n" -ge "${WANT[$c]}" ] && ok "(6) status: $c drops counted ($n)" ||
        ko "(6) status: $c count $n (nft counted ${WANT[$c]} before the wait)"
done
check "(6) status: nat: 10.100.0.0/24 translated" grep -qE '^ *nat: .*10\.100\.0\.0/24.*translated' <<<"$ST"
check "(6) status: nat: fd00:100::/64 translated" grep -qE '^ *nat: .*fd00:100::/64.*translated' <<<"$ST"
printf 'show status\n' | console_a >"$WORK/console-status.txt"
check "(6) the console's \`show status\` has the drop counts too" grep -qE 'firewall drops: .*spoof [1-9]' "$WORK/console-status.txt"

# ---- (7) PMTU discovery: ICMP errors about our WireGuard datagrams; MLD ------------------------
echo "--- (7) one-armed: ICMP frag-needed / packet-too-big quoting our datagrams; an MLD query"
# R, the router on the uplink, says a datagram G sent from its WireGuard port toward a far
# peer did not fit. WireGuard is not tracked, so conntrack calls such an error invalid; it
# must be accepted anyway, and the kernel must learn the path MTU from it.
v0=$(counter $G invalid)
inns $R $FWP icmp-error 192.168.1.2 192.168.1.2 51820 198.51.100.77 51820 1400 >/dev/null
inns $R $FWP icmp-error 2001:db8:1::2 2001:db8:1::2 51820 2001:db8:ff::77 51820 1280 >/dev/null
pmtu4() { ip -n $G route get 198.51.100.77 | grep -q 'mtu 1400'; }
pmtu6() { ip -n $G -6 route get 2001:db8:ff::77 | grep -q 'mtu 1280'; }
if wait_for 3 pmtu4; then ok "(7) IPv4: frag-needed (MTU 1400) quoting our udp/51820 datagram accepted, the kernel learnt the PMTU"
else ko "(7) IPv4: no PMTU learnt for 198.51.100.77: $(ip -n $G route get 198.51.100.77 | tr '\n' ' ')"; fi
if wait_for 3 pmtu6; then ok "(7) IPv6: packet-too-big (MTU 1280) quoting our udp/51820 datagram accepted, the kernel learnt the PMTU"
else ko "(7) IPv6: no PMTU learnt for 2001:db8:ff::77: $(ip -n $G -6 route get 2001:db8:ff::77 | tr '\n' ' ')"; fi
v1=$(counter $G invalid)
[ "$v1" = "$v0" ] && ok "(7) neither ICMP error counted as invalid ($v0 -> $v1)" || ko "(7) the ICMP errors were counted invalid ($v0 -> $v1)"
# A snooping switch forwards our solicited-node multicast only while we answer its MLD
# queries: a query from a link-local source is accepted and answered with a report.
cap_start mld $G upl 'ip6 dst ff02::16' -Q out   # G's own reports, not R's
inns $R $FWP mld-query br0 >/dev/null
if wait_for 3 grep -q 'multicast listener report' "$WORK/mld.cap"; then ok "(7) MLD query from R's link-local address answered with a listener report"
else ko "(7) MLD query from R's link-local address: no report from the appliance"; fi
cap_stop mld

# ---- (4) lifecycle ------------------------------------------------------------------------------
echo "--- (4) Firewall = off, on again, kill -9, restart, clean exit"
sed -i '/^\[Gateway\]/a Firewall = off' "$PERM/riceguard.conf"
if gw_reload "$STATUS_A" $GWA; then ok "(4) reload with Firewall = off applied"; else ko "(4) reload with Firewall = off: $(grep '^reload' "$STATUS_A")"; fi
check "(4) Firewall = off: table inet riceguard removed" wait_for 5 no_table $G
check "(4) Firewall = off: hostfw still there" hostfw_ok $G
check "(4) status says firewall: off (within 3 s)" wait_for 3 sh -c "ip netns exec $G '$RG' status $TA 2>&1 | grep -qE '^ *firewall: off'"
sed -i '/^Firewall = off$/d' "$PERM/riceguard.conf"
if gw_reload "$STATUS_A" $GWA; then ok "(4) reload with the firewall back on applied"; else ko "(4) reload (firewall on): $(grep '^reload' "$STATUS_A")"; fi
check "(4) firewall on again: table back" wait_for 5 has_table $G
check "(4) reloads: hostfw still there" hostfw_ok $G
kill -9 $GWA
forget_pid $GWA
check "(4) kill -9: the daemon is gone" sh -c "! kill -0 $GWA 2>/dev/null"
check "(4) kill -9: table inet riceguard still there (fail closed)" has_table $G
u0=$(counter $G uplink-in) s0=$(counter $G spoof)
probe $L 2 tcp:192.168.1.2:22
r=$(result_of tcp:192.168.1.2:22)
[ "$r" = timeout ] && ok "(4) kill -9: L -> tcp:192.168.1.2:22 still dropped" || ko "(4) after kill -9: L -> tcp 22: $r"
inns $L $FWP spoof 10.100.0.9 192.168.1.2 udp:9 2 >/dev/null
sleep 0.3
[ "$(counter $G uplink-in)" -gt "$u0" ] && [ "$(counter $G spoof)" -ge $((s0 + 2)) ] &&
    ok "(4) kill -9: the drops are still counted (uplink-in, spoof)" || ko "(4) kill -9: counters did not move"
if gw_start $G "$PERM/riceguard.conf" $TA "$WORK/a.log"; then GWA=$GWPID; echo "$GWA" >"$WORK/a.pid"; ok "(4) restarted after kill -9"
else ko "(4) no restart after kill -9"; tail -5 "$WORK/a.log"; fi
check "(4) restart: one table inet riceguard" sh -c "[ \"\$(ip netns exec $G nft list tables | grep -c '^table inet riceguard$')\" = 1 ]"
check "(4) restart: hostfw still there" hostfw_ok $G
stop_pid $GWA
check "(4) clean exit: hostfw still there" hostfw_ok $G
has_table $G && ok "(4) clean exit leaves table inet riceguard (fail closed, as driver/firewall.rs says)" ||
    ko "(4) clean exit removed table inet riceguard (driver/firewall.rs says it stays)"
hf=$(inns $G nft list table inet hostfw | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
[ "${hf:-0}" -gt 0 ] && ok "(4) hostfw's own rule kept counting ($hf packets)" || ko "(4) hostfw's counter: ${hf:-none}"
client_down $P $WP
client_down $Q $WL
note "A took $((SECONDS - T0)) s"

# =========================================================================================
# B. two-armed
# =========================================================================================
echo "--- B: two-armed appliance (Lan = lanp, TcpListen = 443)"
TB0=$SECONDS
netns_add $U $H $S $M
for n in $U $H $S $M; do
    inns $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
inns $H sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 \
    net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
ip -n $U link add br0 type bridge && ip -n $U link set br0 up
veth_pair $U uh - $H upl 192.0.2.2/24
veth_pair $U us - $S eth0 192.0.2.20/24
veth_pair $H lanp - $M eth0 192.168.88.10/24
for i in uh us; do ip -n $U link set $i master br0; done
ip -n $U addr add 192.0.2.10/24 dev br0
ip -n $U addr add 2001:db8:2::10/64 dev br0 nodad
ip -n $H addr add 2001:db8:2::2/64 dev upl nodad
ip -n $U -6 route add fd88::/64 via 2001:db8:2::2
ip -n $H -6 route add default via 2001:db8:2::10
ip -n $M addr add fd88::10/64 dev eth0 nodad
ip -n $M -6 route add default via fd88::1
ip -n $U route add 192.168.88.0/24 via 192.0.2.2
ip -n $U route add 10.100.0.0/24 via 192.0.2.2
ip -n $H route add default via 192.0.2.10
ip -n $M route add default via 192.168.88.1

kb=$("$RG" genkey); pb=$(echo "$kb" | "$RG" pubkey)
ks=$(wg genkey); ps=$(echo "$ks" | wg pubkey)
kt=$(wg genkey); pt=$(echo "$kt" | wg pubkey)
ksite=$(wg genkey); psite=$(echo "$ksite" | wg pubkey)
CONFB=$WORK/b.conf STATUS_B=/run/riceguard/$TB.status
confb() { # with the site peer: yes|no
    cat <<EOF
[Interface]
PrivateKey = $kb
ListenPort = 51820
Address = 10.100.0.1/24, fd00:100::1/64

[Peer]
Name = phone
PublicKey = $ps
AllowedIPs = 10.100.0.2/32

[Peer]
Name = tcpphone
PublicKey = $pt
AllowedIPs = 10.100.0.3/32
EOF
    [ "$1" = yes ] && printf '\n[Peer]\nName = site\nPublicKey = %s\nAllowedIPs = 10.100.0.4/32, 10.66.0.0/24\n' "$psite"
    cat <<EOF

[Gateway]
InterfaceName = $TB
HugePages = off
TcpListen = 443
Lan = lanp
LanAddress = 192.168.88.1/24, fd88::1/64
EOF
}
confb no >"$CONFB.new" && chmod 600 "$CONFB.new" && mv "$CONFB.new" "$CONFB"
if gw_start $H "$CONFB" $TB "$WORK/b.log"; then ok "B: riceguard up --config (two-armed) is up (pid $GWPID)"
else tail -20 "$WORK/b.log"; h_abort "B: the appliance did not come up"; fi
GWB=$GWPID
check "(4) B: table inet riceguard in place as soon as the tunnel is up" has_table $H
check "B: LAN port lanp has 192.168.88.1/24" sh -c "ip -n $H -o addr show dev lanp | grep -q 'inet 192.168.88.1/24'"
check "B: IPv4 forwarding on" sysctl_is $H net.ipv4.ip_forward 1

# The phone over UDP, from the uplink segment.
spawn ip netns exec $S wireguard-go -f $WS >"$WORK/$WS.log" 2>&1
wait_for 5 test -S /var/run/wireguard/$WS.sock
inns $S wg set $WS private-key <(echo "$ks") peer "$pb" endpoint 192.0.2.2:51820 \
    allowed-ips 10.100.0.0/24,192.168.88.0/24
ip -n $S addr add 10.100.0.2/32 dev $WS
ip -n $S link set $WS mtu 1420 up
ip -n $S route add 10.100.0.0/24 dev $WS
ip -n $S route add 192.168.88.0/24 dev $WS
check "(3) WireGuard port from the uplink: the phone reaches M (handshake over UDP)" ping_ok $S 192.168.88.10
n=$(replies $S 192.168.88.10 3)
[ "$n" = 3 ] && ok "(3) phone -> M 192.168.88.10: 3/3" || ko "(3) phone -> M: $n/3"
n=$(replies $M 10.100.0.2 3)
[ "$n" = 3 ] && ok "(3) M -> phone 10.100.0.2: 3/3" || ko "(3) M -> phone: $n/3"
serve $M 7777 "$WORK/m.peers"
got=$(inns $S timeout 10 $FWP tcp-check 192.168.88.10 7777)
[ "$got" = ok ] && ok "(3) TCP phone -> M:7777" || ko "(3) TCP phone -> M: $got"
check "(3) M saw the phone's own address 10.100.0.2 (tunnel -> LAN is not translated)" grep -qx 10.100.0.2 "$WORK/m.peers"

# The TCP-fallback port: a second stock client through `riceguard udp2tcp`.
spawn ip netns exec $S "$RG" udp2tcp --udp-listen 127.0.0.1:51900 --tcp-forward 192.0.2.2:443 --nodelay >"$WORK/u2t.log" 2>&1
spawn ip netns exec $S wireguard-go -f $WT >"$WORK/$WT.log" 2>&1
wait_for 5 test -S /var/run/wireguard/$WT.sock
inns $S wg set $WT private-key <(echo "$kt") peer "$pb" endpoint 127.0.0.1:51900 allowed-ips 10.100.0.1/32
ip -n $S addr add 10.100.0.3/32 dev $WT
ip -n $S link set $WT mtu 1380 up
ip -n $S route add 10.100.0.1/32 dev $WT
if ping_ok $S 10.100.0.1; then ok "(3) TCP-fallback port 443 from the uplink: udp2tcp client pings 10.100.0.1"
else ko "(3) TCP-fallback port 443: no ping through udp2tcp"; tail -3 "$WORK/u2t.log"; fi
check "(3) the appliance holds a TCP connection on :443 from 192.0.2.20" \
    sh -c "ip netns exec $H ss -Htn state established '( sport = :443 )' | grep -q '192.0.2.20'"

# ---- (3) the drop window --------------------------------------------------------------------
echo "--- (3) from the uplink host U: everything but the appliance's ports is dropped"
serve $S 7777 "$WORK/s.peers"     # the phone listens (reachable on 10.100.0.2)
sleep 2                           # let the phone's traffic settle
cap_start ucap $U br0 '(icmp or tcp or (icmp6 and (ip6[40] < 5 or ip6[40] == 129))) and not host 192.0.2.20' -Q in
cap_start hcap $H upl 'udp and src host 192.0.2.2 and dst host 192.0.2.20'
cap_start mcap $M eth0 '(ip and not src host 192.168.88.10) or (ip6 and src host 2001:db8:2::10)'
hs0=$(handshake $H $TB "$ps")
s0=$(counter $H spoof) f0=$(counter $H uplink-forward) u0=$(counter $H uplink-in)
probe $U 3 tcp:192.168.88.10:7777 udp:192.168.88.10:7777 udp:192.168.88.10:9 \
    tcp:10.100.0.2:7777 udp:10.100.0.2:7777 \
    tcp:192.0.2.2:22 udp:192.0.2.2:53 tcp:192.168.88.1:22 udp:192.168.88.1:53 tcp:10.100.0.1:22 \
    tcp:[fd88::10]:7777 udp:[fd88::10]:7777 tcp:[2001:db8:2::2]:22 udp:[2001:db8:2::2]:53
for p in tcp:192.168.88.10:7777 tcp:10.100.0.2:7777 tcp:192.0.2.2:22 tcp:192.168.88.1:22 tcp:10.100.0.1:22 \
    tcp:[fd88::10]:7777 tcp:[2001:db8:2::2]:22; do
    r=$(result_of $p); [ "$r" = timeout ] && ok "(3) U -> $p: dropped (no SYN-ACK, no RST, no ICMP)" || ko "(3) U -> $p: $r (want timeout)"
done
for p in udp:192.168.88.10:7777 udp:192.168.88.10:9 udp:10.100.0.2:7777 udp:192.0.2.2:53 udp:192.168.88.1:53 \
    udp:[fd88::10]:7777 udp:[2001:db8:2::2]:53; do
    r=$(result_of $p); [ "$r" = silent ] && ok "(3) U -> $p: dropped (no reply, no ICMP)" || ko "(3) U -> $p: $r (want silent)"
done
n=$(replies $U 192.168.88.10 3)
[ "$n" = 0 ] && ok "(3) U pings M: 0/3" || ko "(3) U pings M: $n/3 answered"
n=$(replies $U 10.100.0.2 3)
[ "$n" = 0 ] && ok "(3) U pings the phone's tunnel address: 0/3" || ko "(3) U pings 10.100.0.2: $n/3 answered"
n=$(replies $U fd88::10 3)
[ "$n" = 0 ] && ok "(3) IPv6: U pings M fd88::10: 0/3" || ko "(3) U pings fd88::10: $n/3 answered"
inns $U $FWP spoof 10.100.0.2 192.168.88.10 udp:7777 3 >/dev/null
inns $U $FWP spoof 10.100.0.2 192.168.88.10 icmp 3 >/dev/null
sleep 0.5
cap_stop ucap; cap_stop hcap; cap_stop mcap
[ "$(cap_lines ucap)" = 0 ] && ok "(3) U received no reply, RST or ICMP error from anything behind the appliance" ||
    { ko "(3) U received: $(head -3 "$WORK/ucap.cap" | tr '\n' ';')"; }
[ "$(cap_lines mcap)" = 0 ] && ok "(3) M received nothing from the uplink (neither U's probes nor the spoofed 10.100.0.2)" ||
    ko "(3) M received: $(head -3 "$WORK/mcap.cap" | tr '\n' ';')"
sent=$(grep -vE 'UDP, length 32$' "$WORK/hcap.cap" | grep -c . || true)
[ "$sent" = 0 ] && ok "(3) no handshake initiation and no data left the uplink toward the phone ($(cap_lines hcap) keepalives)" ||
    ko "(3) toward the phone: $(grep -vE 'UDP, length 32$' "$WORK/hcap.cap" | head -3 | tr '\n' ';')"
hs1=$(handshake $H $TB "$ps")
[ "$hs1" = "$hs0" ] && ok "(3) the phone's latest handshake did not change ($hs0)" || ko "(3) handshake moved $hs0 -> $hs1"
s1=$(counter $H spoof) f1=$(counter $H uplink-forward) u1=$(counter $H uplink-in)
[ "$s1" -ge $((s0 + 6)) ] && ok "(3) spoof counter moved ($s0 -> $s1)" || ko "(3) spoof counter $s0 -> $s1"
[ "$f1" -ge $((f0 + 5)) ] && ok "(3) uplink-forward counter moved ($f0 -> $f1)" || ko "(3) uplink-forward counter $f0 -> $f1"
[ "$u1" -ge $((u0 + 4)) ] && ok "(3) uplink-in counter moved ($u0 -> $u1)" || ko "(3) uplink-in counter $u0 -> $u1"
n=$(replies $U 192.168.88.1 2)
note "(3) U pings the appliance's LAN address 192.168.88.1: $n/2 (echo is accepted on input from every zone, rate-limited)"

echo "--- (3) established replies: M reaches U (LAN -> uplink, masqueraded)"
serve $U 7777 "$WORK/u.peers"
n=$(replies $M 192.0.2.10 3)
[ "$n" = 3 ] && ok "(3) M pings U 192.0.2.10: 3/3" || ko "(3) M pings U: $n/3"
got=$(inns $M timeout 10 $FWP tcp-check 192.0.2.10 7777)
[ "$got" = ok ] && ok "(3) TCP M -> U:7777, replies pass" || ko "(3) TCP M -> U: $got"
probe $M 2 udp:192.0.2.10:7777
[ "$(result_of udp:192.0.2.10:7777)" = reply ] && ok "(3) UDP M -> U:7777, reply passes" || ko "(3) UDP M -> U: $(result_of udp:192.0.2.10:7777)"
n=$(replies $M 2001:db8:2::10 3)
[ "$n" = 3 ] && ok "(3) IPv6: M pings U 2001:db8:2::10: 3/3" || ko "(3) M pings U over IPv6: $n/3"
got=$(inns $M timeout 10 $FWP tcp-check 2001:db8:2::10 7777)
[ "$got" = ok ] && ok "(3) IPv6: TCP M -> [2001:db8:2::10]:7777, replies pass" || ko "(3) TCP6 M -> U: $got"
peers=$(sort -u "$WORK/u.peers" | tr '\n' ' ')
[ "$peers" = "192.0.2.2 2001:db8:2::2 " ] && ok "(3) U saw M as 192.0.2.2 and 2001:db8:2::2 (the LAN port's hosts are masqueraded, IPv4 and IPv6)" ||
    ko "(3) U saw M as '$peers'"
probe $U 2 tcp:192.0.2.2:443
[ "$(result_of tcp:192.0.2.2:443)" = open ] && ok "(3) U -> tcp:192.0.2.2:443 (TcpListen) open" || ko "(3) U -> 443: $(result_of tcp:192.0.2.2:443)"
# The LAN and the tunnel reach the appliance itself (a closed port answers with a RST).
probe $M 2 tcp:192.168.88.1:22
[ "$(result_of tcp:192.168.88.1:22)" = refused ] && ok "(3) LAN zone reaches the appliance: M -> tcp:192.168.88.1:22 refused (RST), not dropped" ||
    ko "(3) M -> the appliance's closed port: $(result_of tcp:192.168.88.1:22) (want refused)"
probe $S 2 tcp:10.100.0.1:22
[ "$(result_of tcp:10.100.0.1:22)" = refused ] && ok "(3) tunnel zone reaches the appliance: client -> tcp:10.100.0.1:22 refused (RST), not dropped" ||
    ko "(3) client -> the appliance's closed port: $(result_of tcp:10.100.0.1:22) (want refused)"

# ---- (7) DHCP ports are exempt from anti-spoofing only on the uplink ----------------------------
echo "--- (7) B: UDP 67->68, 547->546, 68->67 from a tunnel source on the LAN port"
cap_start scap $S $WS 'udp and src host 10.100.0.3'
for spec in "10.100.0.3 10.100.0.2 udp:67:68" "fd00:100::3 fd00:100::2 udp:547:546" "10.100.0.3 10.100.0.2 udp:68:67"; do
    set -- $spec
    s0=$(counter $H spoof)
    inns $M $FWP spoof "$1" "$2" "$3" 3 >/dev/null
    sleep 0.3
    s1=$(counter $H spoof)
    [ "$s1" -ge $((s0 + 3)) ] && ok "(7) LAN port: $3 from the tunnel source $1 dropped as spoof ($s0 -> $s1)" ||
        ko "(7) LAN port: $3 from the tunnel source $1 not counted as spoof ($s0 -> $s1)"
done
cap_stop scap
[ "$(cap_lines scap)" = 0 ] && ok "(7) the phone received none of them" || ko "(7) the phone received: $(head -2 "$WORK/scap.cap" | tr '\n' ';')"
# A LAN host's flow from the WireGuard port number, masqueraded: its replies come back to
# the appliance's port 51820 and must be de-NATed, not taken for WireGuard datagrams.
r=$(inns $M timeout 10 $FWP udp-from 51820 192.0.2.10 7777 3)
[ "$r" = reply ] && ok "(7) M's UDP from source port 51820 to U (masqueraded) gets its reply" ||
    ko "(7) M's UDP from source port 51820 to U: $r (its replies were not de-NATed)"

# ---- (4) a reload that adds a peer changes the anti-spoof rules ------------------------------
echo "--- (4) reload adding a site peer (10.66.0.0/24)"
pre0=$(inns $H nft list chain inet riceguard prerouting | grep -c '10\.66\.0\.0/24' || true)
sr0=$(counter $H spoof) fr0=$(counter $H uplink-forward)
confb yes >"$CONFB.new" && chmod 600 "$CONFB.new" && mv "$CONFB.new" "$CONFB"
if gw_reload "$STATUS_B" $GWB; then ok "(4) reload adding a peer applied"; else ko "(4) reload adding a peer: $(grep '^reload' "$STATUS_B")"; fi
pre1=$(inns $H nft list chain inet riceguard prerouting | grep -c '10\.66\.0\.0/24' || true)
[ "$pre0" = 0 ] && [ "$pre1" -ge 2 ] && ok "(4) anti-spoof rules for 10.66.0.0/24 added on the uplink and the LAN port ($pre0 -> $pre1 rules)" ||
    ko "(4) anti-spoof rules for 10.66.0.0/24: $pre0 -> $pre1"
[ "$(counter $H spoof)" -ge "$sr0" ] && [ "$(counter $H uplink-forward)" -ge "$fr0" ] &&
    ok "(4) the replaced table carried the drop counts over (spoof $sr0, uplink-forward $fr0)" ||
    ko "(4) counts after the replacement: spoof $sr0 -> $(counter $H spoof), uplink-forward $fr0 -> $(counter $H uplink-forward)"
s0=$(counter $H spoof)
inns $U $FWP spoof 10.66.0.5 192.168.88.10 udp:7777 2 >/dev/null
sleep 0.3
[ "$(counter $H spoof)" -ge $((s0 + 2)) ] && ok "(4) a 10.66.0.5 source from U now counts as spoof" || ko "(4) 10.66.0.5 spoof not counted"
check "(4) B: the phone still reaches M after the reload" ping_ok $S 192.168.88.10

# ---- (6) status, two-armed ------------------------------------------------------------------
status_wait $H $TB spoof uplink-forward uplink-in || note "(6) B status: counts still behind nft's after 5 s"
echo "$ST" | grep -E '^ *(firewall|nat)' | sed 's/^/     | /'
check "(6) B status: firewall: on, LAN port lanp" grep -qE '^ *firewall: on.*lanp' <<<"$ST"
for c in spoof uplink-forward uplink-in; do
    n=$(status_count "$ST" $c)
    [ "$n" -gt 0 ] && [ "$n" -ge "${WANT[$c]}" ] && ok "(6) B status: $c drops counted ($n)" ||
        ko "(6) B status: $c count $n (nft counted ${WANT[$c]} before the wait)"
done
check "(6) B status: nat: the LAN port's hosts translated" grep -qE '^ *nat: .*lanp' <<<"$ST"

# ---- (4) kill -9: fail closed -----------------------------------------------------------------
echo "--- (4) B: kill -9"
kill -9 $GWB
forget_pid $GWB
check "(4) B kill -9: table inet riceguard still there" has_table $H
cap_start mcap2 $M eth0 'ip and not src host 192.168.88.10'
f0=$(counter $H uplink-forward) s0=$(counter $H spoof)
probe $U 2 tcp:192.168.88.10:7777 udp:192.168.88.10:7777
[ "$(result_of tcp:192.168.88.10:7777)" = timeout ] && [ "$(result_of udp:192.168.88.10:7777)" = silent ] &&
    ok "(4) B kill -9: U still reaches no LAN host (TCP, UDP)" || ko "(4) B kill -9: U -> M: $(echo $PROBED)"
inns $U $FWP spoof 10.100.0.2 192.168.88.10 udp:7777 2 >/dev/null
sleep 0.3
cap_stop mcap2
[ "$(cap_lines mcap2)" = 0 ] && ok "(4) B kill -9: M received nothing from the uplink" || ko "(4) B kill -9: M received $(head -2 "$WORK/mcap2.cap" | tr '\n' ';')"
[ "$(counter $H uplink-forward)" -gt "$f0" ] && [ "$(counter $H spoof)" -ge $((s0 + 2)) ] &&
    ok "(4) B kill -9: drops still counted (uplink-forward, spoof)" || ko "(4) B kill -9: counters did not move"
note "B took $((SECONDS - TB0)) s"

# =========================================================================================
# C. a stale table after a restart with another interface name (issue 29)
# =========================================================================================
echo "--- C: restart with another InterfaceName, the install refused, the old table left"
TC0=$SECONDS
netns_add $X $Y
inns $X sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0
veth_pair $Y eth0 198.18.0.1/24 $X upl 198.18.0.2/24
ip -n $X route add default via 198.18.0.1
kc=$("$RG" genkey)
confc() { # TUNNEL
    cat <<EOF
[Interface]
PrivateKey = $kc
ListenPort = 51820
Address = 10.100.0.1/24

[Peer]
Name = phone
PublicKey = $ps
AllowedIPs = 10.100.0.2/32

[Gateway]
InterfaceName = $1
HugePages = off
EOF
}
fwd_is() { sysctl_is $X net.ipv4.ip_forward "$1" && sysctl_is $X net.ipv6.conf.all.forwarding "$1"; }
# table_names TUN: our table judges TUN (its chains match on that interface name).
table_names() { inns $X nft list table inet riceguard 2>/dev/null | grep -q "iifname \"$1\""; }
confc $TC >"$WORK/c.conf" && chmod 600 "$WORK/c.conf"
if gw_start $X "$WORK/c.conf" $TC "$WORK/c.log"; then ok "C: up as $TC"
else tail -20 "$WORK/c.log"; h_abort "C: the appliance did not come up"; fi
check "C: $TC: the table judges $TC" table_names $TC
check "C: $TC: IPv4 and IPv6 forwarding on" wait_for 5 fwd_is 1
stop_pid $GWPID
check "C: clean exit: the table for $TC stays" table_names $TC
check "C: clean exit: forwarding still on (nothing turns it off at exit)" fwd_is 1
# Another firewall fills the forward hook: add base chains in batches (an `nft -f` is
# one transaction, refused whole) until not even one more fits.
fill() { # FROM TO
    local i
    echo "table inet rgfill {"
    for i in $(seq "$1" "$2"); do echo "chain c$i { type filter hook forward priority 0; }"; done
    echo "}"
}
n=0
for step in 256 64 16 4 1; do
    while fill $((n + 1)) $((n + step)) | inns $X nft -f - 2>/dev/null; do n=$((n + step)); done
done
note "C: table inet rgfill holds $n forward base chains"
if inns $X nft add chain inet rgfill probe '{ type filter hook forward priority 0; }' 2>"$WORK/c-full.err"; then
    ko "C: the forward hook did not fill up (the install would not be refused)"
else
    ok "C: the forward hook is full ($(grep -m1 Error "$WORK/c-full.err"))"
fi
confc $TD >"$WORK/c.conf.new" && chmod 600 "$WORK/c.conf.new" && mv "$WORK/c.conf.new" "$WORK/c.conf"
if gw_start $X "$WORK/c.conf" $TD "$WORK/c.log"; then ok "C: restarted as $TD"
else tail -20 "$WORK/c.log"; ko "C: no restart as $TD"; fi
GWC=$GWPID
check "C: $TD: the install was refused (E2BIG, said in the log)" wait_for 5 grep -q "the kernel said E2BIG" "$WORK/c.log"
check "C: $TD: the stale table (judging $TC) is still there" table_names $TC
check "C: $TD with the stale table: IPv4 and IPv6 forwarding off" wait_for 5 fwd_is 0
check "C: $TD: the log says the table in place is not the one for this configuration" \
    grep -q "NOT forwarding: table inet riceguard in place is not the one for this configuration" "$WORK/c.log"
check "C: $TD: riceguard status says NOT forwarding and why" wait_for 3 sh -c \
    "ip netns exec $X '$RG' status $TD 2>&1 | grep -q 'firewall: NOT forwarding: table inet riceguard in place is not the one'"
inns $X nft delete table inet rgfill
check "C: $TD: rgfill gone: the watch installs the table for $TD" wait_for 10 table_names $TD
check "C: $TD: the table judges $TC no more" sh -c "! ip netns exec $X nft list table inet riceguard | grep -q 'iifname \"$TC\"'"
check "C: $TD: IPv4 and IPv6 forwarding back on" wait_for 5 fwd_is 1
check "C: $TD: the log says forwarding is allowed again" wait_for 3 grep -q "for this configuration in place; forwarding allowed" "$WORK/c.log"
stop_pid $GWC
note "C took $((SECONDS - TC0)) s; the lab $((SECONDS - T0)) s"

if [ "$failed" -gt 0 ]; then
    echo "--- appliance A log (tail)"; tail -15 "$WORK/a.log"
    echo "--- appliance B log (tail)"; tail -15 "$WORK/b.log"
    echo "--- appliance C log (tail)"; tail -15 "$WORK/c.log"
fi
h_finish
