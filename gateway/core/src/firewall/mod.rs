//! The appliance's firewall and NAT policy, computed as plain data ([`Ruleset`]) from the
//! configuration and the subnets its ports have now; `nft` encodes it as nf_tables
//! messages and `sys::nftables` installs it as one table, `inet riceguard`, replaced whole
//! in one transaction.
//!
//! Zones, after OpenWrt's fw4 (a default per zone pair, safe without a user's touch):
//! - **tunnel**: the WireGuard interface. The device already checks each decrypted
//!   packet's inner source against the sending peer's allowed IPs.
//! - **LAN port**: `Lan =` when two-armed.
//! - **uplink**: every other interface but `lo` (the uplink is found at run time and may
//!   change; one-armed, the uplink *is* the LAN).
//!
//! | from → to | appliance (input) | tunnel | LAN port | uplink |
//! |---|---|---|---|---|
//! | tunnel | all | yes (clients reach each other, as on a LAN) | yes | yes, NATed where needed |
//! | LAN port | all | yes | yes | yes, NATed |
//! | uplink | WireGuard and `TcpListen` ports, one-armed the services (SSH, metrics) from the uplink's own subnets (`services`), DHCP/DHCPv6 replies, ICMP errors about our own sockets' packets (PMTU discovery), neighbour discovery, MLD from link-local sources, echo at 5/s | one-armed: only from the uplink's own subnets; two-armed: no | no | not ours to judge |
//!
//! Replies to allowed traffic pass everywhere (`ct state established,related`).
//!
//! Anti-spoofing: a packet arriving on the uplink or the LAN port with a source inside
//! the tunnel's subnets or an enabled peer's allowed IPs is dropped — except `/0` and
//! prefixes that overlap that port's own subnets (a hub peer with `0.0.0.0/0`, or
//! `10.0.0.0/8` over a 10.x uplink, must not make every uplink packet a "spoof"; a
//! tunnel numbered from the LAN's subnet is answered for by proxy ARP there). DHCP
//! replies (and our own DHCP broadcasts, looped back) are not judged by source only
//! when they come from the uplink addressed to the appliance itself (its address or a
//! broadcast): before the lease the uplink's subnet is unknown. On the LAN port, or
//! forwarded anywhere, UDP 67/68 and 547/546 are judged like everything else.
//!
//! NAT, where the network cannot route back (`Masquerade = auto`): what arrives from the
//! tunnel or the LAN port and leaves by the uplink is translated to the uplink's address
//! unless its source is inside one of the uplink's own subnets (those hosts are
//! on-link or proxied there, so the uplink's network reaches them), or it comes from a
//! peer with `Masquerade = off` (a site whose router routes back). `on` translates
//! regardless of the uplink's subnets; `off` never.
//!
//! Conntrack: datagrams to the WireGuard port of the appliance's own addresses, and
//! those it sends from it, are exempt (`notrack`), so a flood cannot fill the
//! connection table; they are accepted by port instead. Forwarded traffic to that port
//! is tracked, and NAT never translates a UDP flow to that source port (the replies to
//! it would be taken for WireGuard datagrams, untracked, and never de-NATed).
//! Untracked, an ICMP error quoting one of our datagrams is `invalid` to conntrack, so
//! the errors about our own sockets' packets (fragmentation needed, packet too big,
//! unreachable) are accepted by what they quote, before the invalid drop: PMTU
//! discovery works for the tunnel's outer datagrams.
//!
//! Only our own traffic is judged: base chains have policy accept and drop only packets
//! that enter or leave by the tunnel or the LAN port, or are addressed to the appliance
//! from the uplink; another table's rules (Docker's, a distribution's) still see
//! everything and may drop more.

pub mod clients;
pub mod forwarding;
pub mod nft;
pub mod ports;
pub mod rules;
pub mod services;

use crate::config::{Config, MasqueradeMode};
use crate::net::{subtract, Cidr};
pub use ports::Ports;
pub use rules::*;

/// The table's name (family `inet`).
pub const TABLE: &str = "riceguard";

/// The drop counters, one per cause, as `riceguard status` names them.
pub const COUNTER_SPOOF: &str = "spoof";
pub const COUNTER_UPLINK_IN: &str = "uplink-in";
pub const COUNTER_UPLINK_FWD: &str = "uplink-forward";
pub const COUNTER_INVALID: &str = "invalid";
pub const COUNTERS: [&str; 4] = [
    COUNTER_SPOOF,
    COUNTER_UPLINK_IN,
    COUNTER_UPLINK_FWD,
    COUNTER_INVALID,
];

/// TCP flags (the header's 14th byte).
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

/// Echo requests answered from the uplink: a second, and burst.
pub const ECHO_PER_SECOND: u64 = 5;
pub const ECHO_BURST: u32 = 10;

/// ICMP types accepted from the uplink (PMTU discovery and errors): destination
/// unreachable (fragmentation needed), time exceeded, parameter problem.
const ICMP_ERRORS: [u8; 3] = [3, 11, 12];
const ICMP_ECHO_REQUEST: u8 = 8;
/// ICMPv6: destination unreachable, packet too big, time exceeded, parameter problem;
/// router advertisement, neighbour solicitation and advertisement (SLAAC, NDP).
const ICMPV6_NEEDED: [u8; 7] = [1, 2, 3, 4, 134, 135, 136];
const ICMPV6_ECHO_REQUEST: u8 = 128;
/// ICMP errors accepted when they quote a packet our own sockets sent, even though
/// conntrack calls them invalid: destination unreachable (fragmentation needed is one);
/// ICMPv6 destination unreachable and packet too big.
const ICMP_ABOUT_OURS: [u8; 1] = [3];
const ICMPV6_ABOUT_OURS: [u8; 2] = [1, 2];
/// MLD: query, v1 report, done, v2 report. A snooping switch that hears no report for
/// our solicited-node groups stops forwarding them (neighbour discovery fails).
const MLD: [u8; 4] = [130, 131, 132, 143];
/// fe80::/10: MLD is only valid from a link-local source (RFC 3810 5.1.14).
const LINK_LOCAL: Cidr = Cidr {
    addr: std::net::IpAddr::V6(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)),
    prefix: 10,
};

/// `v` in network form, without duplicates and prefixes another one covers, sorted.
fn minimal(v: impl IntoIterator<Item = Cidr>) -> Vec<Cidr> {
    let mut all: Vec<Cidr> = v.into_iter().map(|c| c.network()).collect();
    all.sort_by_key(Cidr::sort_key);
    all.dedup();
    // A shorter prefix that overlaps a longer one contains it.
    let covered = |c: &Cidr| all.iter().any(|o| o.prefix < c.prefix && o.overlaps(c));
    all.iter().filter(|c| !covered(c)).copied().collect()
}

/// The tunnel's own subnets and every enabled peer's allowed IPs, minus `/0`: the
/// sources that may only ever arrive from the tunnel.
pub fn tunnel_sources(cfg: &Config) -> Vec<Cidr> {
    minimal(
        cfg.interface
            .addresses
            .iter()
            .copied()
            .chain(
                cfg.peers
                    .iter()
                    .filter(|p| p.enabled)
                    .flat_map(|p| p.allowed_ips.iter().copied()),
            )
            .filter(|c| c.prefix > 0),
    )
}

/// The anti-spoof prefixes of a port whose own subnets are `nets`: every enabled peer's
/// allowed IPs (`/0` aside) minus the port's subnets that lie inside them (a hub's
/// `10.0.0.0/8` over a 10.1.0.0/16 uplink drops the rest of 10/8 there, not the uplink's
/// own hosts); a peer's prefix inside the port's subnet (the proxy-ARP layout's /32 and
/// /128, or what a rogue lease equal to the tunnel's subnet would cover) stays whole: a
/// peer's address never arrives from outside the tunnel. The tunnel's own subnets
/// (`Address`) count only where they do not overlap the port's (a tunnel numbered from
/// the LAN's subnet shares it with the LAN's hosts).
pub fn spoof_prefixes(cfg: &Config, nets: &[Cidr]) -> Vec<Cidr> {
    let own = cfg
        .interface
        .addresses
        .iter()
        .filter(|c| c.prefix > 0 && !nets.iter().any(|n| n.overlaps(c)))
        .map(Cidr::network);
    let peers = peer_prefixes(cfg).into_iter().flat_map(|(_, c)| {
        let inside: Vec<Cidr> = nets.iter().filter(|n| c.covers(n)).copied().collect();
        subtract(c, &inside)
    });
    minimal(own.chain(peers))
}

/// Every enabled peer's allowed IPs but `/0`, each with the index of its peer.
fn peer_prefixes(cfg: &Config) -> Vec<(usize, Cidr)> {
    cfg.peers
        .iter()
        .enumerate()
        .filter(|(_, p)| p.enabled)
        .flat_map(|(i, p)| p.allowed_ips.iter().map(move |c| (i, c.network())))
        .filter(|(_, c)| c.prefix > 0)
        .collect()
}

/// The sources `[Peer] Masquerade = off` exempts from NAT: the parts of the owner
/// partition ([`clients::owners_with`], the one the per-client access keys on) that
/// belong to such a peer, without the peers' `/0`. A source belongs to the peer that owns it by longest prefix
/// (as the device's source check decides), so a `10.0.0.0/8` site with `Masquerade =
/// off` does not exempt a client's 10.100.0.2/32 of another peer. NAT applies it only to
/// what arrived on the tunnel interface.
pub fn masquerade_off_sources(cfg: &Config) -> Vec<Cidr> {
    minimal(
        clients::owners_with(cfg, false)
            .into_iter()
            .filter(|(i, _)| !cfg.peers[*i].masquerade)
            .map(|(_, c)| c),
    )
}

fn rule(matches: Vec<Match>, action: Action, comment: &'static str) -> Rule {
    Rule::new(matches, action, comment)
}

fn counted(matches: Vec<Match>, counter: &str, action: Action, comment: &'static str) -> Rule {
    Rule::counted(matches, counter, action, comment)
}

fn iif(name: &str) -> Match {
    Match::Iif {
        name: name.to_string(),
        eq: true,
    }
}

fn not_iif(name: &str) -> Match {
    Match::Iif {
        name: name.to_string(),
        eq: false,
    }
}

fn oif(name: &str) -> Match {
    Match::Oif {
        name: name.to_string(),
        eq: true,
    }
}

fn not_oif(name: &str) -> Match {
    Match::Oif {
        name: name.to_string(),
        eq: false,
    }
}

fn saddr(net: Cidr) -> Match {
    Match::Saddr { net, eq: true }
}

fn base(name: &str, kind: ChainKind, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.to_string(),
        base: Some(BaseChain {
            kind,
            hook,
            priority,
            policy_drop: false,
        }),
        rules,
    }
}

/// "Not from the tunnel, the LAN port or lo": the uplink zone, as matches.
fn from_uplink(p: &Ports) -> Vec<Match> {
    let mut m = vec![not_iif("lo"), not_iif(&p.tunnel)];
    if let Some(l) = &p.lan {
        m.push(not_iif(l));
    }
    m
}

fn to_uplink(p: &Ports) -> Vec<Match> {
    let mut m = vec![not_oif("lo"), not_oif(&p.tunnel)];
    if let Some(l) = &p.lan {
        m.push(not_oif(l));
    }
    m
}

fn with(mut a: Vec<Match>, b: impl IntoIterator<Item = Match>) -> Vec<Match> {
    a.extend(b);
    a
}

/// DHCP (v4 and v6) replies to the client on the uplink.
fn dhcp_replies() -> [Vec<Match>; 2] {
    [
        vec![
            Match::Family(Family::V4),
            Match::L4(L4::Udp),
            Match::Sport(67),
            Match::Dport(68),
        ],
        vec![
            Match::Family(Family::V6),
            Match::L4(L4::Udp),
            Match::Sport(547),
            Match::Dport(546),
        ],
    ]
}

/// The UDP that anti-spoofing does not judge, when it comes from the uplink addressed
/// to the appliance itself (its own address or a broadcast; never a forwarded packet),
/// with why.
fn dhcp_exempt() -> [(Vec<Match>, &'static str); 4] {
    let udp = |f, sport, dport, to| {
        vec![
            Match::Family(f),
            Match::L4(L4::Udp),
            Match::Sport(sport),
            Match::Dport(dport),
            Match::DaddrType(to),
        ]
    };
    let reply = "DHCP replies to the appliance (the subnet is not known before the lease)";
    [
        (udp(Family::V4, 67, 68, AddrType::Local), reply),
        (udp(Family::V4, 67, 68, AddrType::Broadcast), reply),
        (udp(Family::V6, 547, 546, AddrType::Local), reply),
        // Our own DHCPDISCOVER, looped back: a broadcast sent while the uplink has no
        // address leaves with a source the kernel took from another interface (the
        // tunnel's), and its local copy re-enters by the uplink.
        (
            udp(Family::V4, 68, 67, AddrType::Broadcast),
            "our DHCP broadcasts, looped back",
        ),
    ]
}

/// The whole table for `cfg` over `p`.
pub fn ruleset(cfg: &Config, p: &Ports) -> Ruleset {
    let established = Match::Ct(CtStates::ESTABLISHED.or(CtStates::RELATED));

    // prerouting (raw): anti-spoofing on the uplink and LAN port, then no conntrack for
    // WireGuard datagrams from the uplink.
    // After the first two rules only the uplink and the LAN port are left, so "from the
    // uplink" is just "not the LAN port" here. WireGuard datagrams, the bulk of what
    // arrives, leave the chain first: the daemon trusts only the peers' keys, so their
    // source addresses are not the firewall's to judge.
    let mut pre = vec![
        rule(vec![iif("lo")], Action::Return, "loopback"),
        rule(
            vec![iif(&p.tunnel)],
            Action::Return,
            "the tunnel checks inner sources itself",
        ),
    ];
    let not_lan: Vec<Match> = p.lan.iter().map(|l| not_iif(l)).collect();
    let mut out_raw = Vec::new();
    if let Some(port) = p.listen_port {
        // To the appliance only: a forwarded flow to that port (a LAN host's, say) is
        // tracked like any other.
        pre.push(rule(
            with(
                not_lan.clone(),
                [
                    Match::L4(L4::Udp),
                    Match::Dport(port),
                    Match::DaddrType(AddrType::Local),
                ],
            ),
            Action::Notrack,
            "WireGuard datagrams: no conntrack entry (a flood cannot fill the table)",
        ));
        out_raw.push(rule(
            vec![Match::L4(L4::Udp), Match::Sport(port)],
            Action::Notrack,
            "WireGuard datagrams we send",
        ));
    }
    // Only from the uplink: on the LAN port the DHCP server is the appliance, and a
    // LAN host's 67 -> 68 from a tunnel source is a spoof like any other.
    for (m, why) in dhcp_exempt() {
        pre.push(rule(with(not_lan.clone(), m), Action::Return, why));
    }
    if let Some(l) = &p.lan {
        for c in spoof_prefixes(cfg, &p.lan_nets) {
            pre.push(counted(
                vec![iif(l), saddr(c)],
                COUNTER_SPOOF,
                Action::Drop,
                "a tunnel source on the LAN port",
            ));
        }
    }
    for c in spoof_prefixes(cfg, &p.uplink_nets) {
        pre.push(counted(
            with(not_lan.clone(), [saddr(c)]),
            COUNTER_SPOOF,
            Action::Drop,
            "a tunnel source on the uplink",
        ));
    }

    // Per-client access: a restricted peer's new flows go to its own chain (one map
    // lookup by source), before the tunnel's accept.
    let cr = clients::client_rules(cfg, p);
    // input: the uplink reaches only what a gateway offers it.
    let mut input = vec![rule(vec![iif("lo")], Action::Accept, "loopback")];
    input.extend(cr.input);
    input.push(rule(
        vec![iif(&p.tunnel)],
        Action::Accept,
        "clients reach the appliance (unless their Access says otherwise, above)",
    ));
    if let Some(l) = &p.lan {
        input.push(rule(
            vec![iif(l)],
            Action::Accept,
            "the LAN reaches the appliance",
        ));
    }
    // Echo requests before `established`: conntrack calls every request after the first
    // of one echo id established, which would let a flood of one id past the limit.
    for (l4, echo) in [
        (L4::Icmp, ICMP_ECHO_REQUEST),
        (L4::Icmpv6, ICMPV6_ECHO_REQUEST),
    ] {
        let ping = vec![Match::L4(l4), Match::IcmpType(echo)];
        input.push(rule(
            with(
                ping.clone(),
                [Match::Limit {
                    per_second: ECHO_PER_SECOND,
                    burst: ECHO_BURST,
                }],
            ),
            Action::Accept,
            "ping, rate-limited",
        ));
        input.push(counted(
            ping,
            COUNTER_UPLINK_IN,
            Action::Drop,
            "ping beyond the rate limit",
        ));
    }
    input.push(rule(vec![established.clone()], Action::Accept, "replies"));
    // ICMP errors about what our own sockets sent, before the invalid drop: WireGuard
    // datagrams are not tracked, so conntrack cannot relate an error quoting one (a
    // "fragmentation needed", a "packet too big") and calls it invalid, and PMTU
    // discovery would never learn the path's MTU. Those about tracked traffic (TCP
    // fallback included) are `related` above; these rules take the rest.
    let ours: Vec<(L4, u16)> = p
        .listen_port
        .map(|port| (L4::Udp, port))
        .into_iter()
        .chain(cfg.gateway.tcp_listen.iter().map(|&port| (L4::Tcp, port)))
        .collect();
    for (family, icmp, types) in [
        (Family::V4, L4::Icmp, &ICMP_ABOUT_OURS[..]),
        (Family::V6, L4::Icmpv6, &ICMPV6_ABOUT_OURS[..]),
    ] {
        for &t in types {
            for &(l4, sport) in &ours {
                input.push(rule(
                    vec![
                        Match::L4(icmp),
                        Match::IcmpType(t),
                        Match::Quotes { family, l4, sport },
                    ],
                    Action::Accept,
                    "ICMP errors about our WireGuard and TCP-fallback sockets' packets (PMTU discovery)",
                ));
            }
        }
    }
    input.push(counted(
        vec![Match::Ct(CtStates::INVALID)],
        COUNTER_INVALID,
        Action::Drop,
        "not part of any connection",
    ));
    if let Some(port) = p.listen_port {
        input.push(rule(
            vec![Match::L4(L4::Udp), Match::Dport(port)],
            Action::Accept,
            "WireGuard",
        ));
    }
    for &port in &cfg.gateway.tcp_listen {
        input.push(rule(
            vec![Match::L4(L4::Tcp), Match::Dport(port)],
            Action::Accept,
            "TCP fallback",
        ));
    }
    // The appliance's services (SSH, metrics): from the tunnel and the LAN port (accepted above),
    // and one-armed from the uplink's own subnets; two-armed, the uplink's tries fall to
    // the counted drop below.
    for svc in services::services(cfg) {
        for net in services::uplink_service_nets(p) {
            input.push(rule(
                vec![Match::L4(L4::Tcp), Match::Dport(svc.port), saddr(net)],
                Action::Accept,
                "one-armed: LAN hosts on the uplink's subnet reach the appliance's services",
            ));
        }
    }
    for m in dhcp_replies() {
        input.push(rule(m, Action::Accept, "DHCP replies"));
    }
    for t in ICMP_ERRORS {
        input.push(rule(
            vec![Match::L4(L4::Icmp), Match::IcmpType(t)],
            Action::Accept,
            "ICMP errors (PMTU discovery)",
        ));
    }
    for t in ICMPV6_NEEDED {
        input.push(rule(
            vec![Match::L4(L4::Icmpv6), Match::IcmpType(t)],
            Action::Accept,
            "ICMPv6 errors, router advertisements, neighbour discovery",
        ));
    }
    for t in MLD {
        input.push(rule(
            vec![Match::L4(L4::Icmpv6), Match::IcmpType(t), saddr(LINK_LOCAL)],
            Action::Accept,
            "MLD from link-local sources (snooping switches keep forwarding our multicast)",
        ));
    }
    input.push(counted(
        Vec::new(),
        COUNTER_UPLINK_IN,
        Action::Drop,
        "anything else from the uplink to the appliance",
    ));

    // forward: our zones go anywhere; the uplink reaches the tunnel only one-armed, from
    // its own subnets, and the LAN port never.
    // MSS clamping first: a SYN (and SYN-ACK) into or out of the tunnel gets an MSS that
    // fits the route's MTU, so TCP works where ICMP "fragmentation needed" never comes
    // back (the tunnel's 1420 bytes is the smaller hop for a LAN host at 1500).
    let mut fwd = Vec::new();
    for m in [iif(&p.tunnel), oif(&p.tunnel)] {
        fwd.push(rule(
            vec![
                m,
                Match::L4(L4::Tcp),
                Match::TcpFlags {
                    mask: TCP_SYN | TCP_RST,
                    value: TCP_SYN,
                },
            ],
            Action::ClampMss,
            "TCP MSS clamped to the route's MTU (into and out of the tunnel)",
        ));
    }
    fwd.push(rule(vec![established], Action::Accept, "replies"));
    fwd.extend(cr.forward);
    fwd.push(rule(
        vec![iif(&p.tunnel)],
        Action::Accept,
        "tunnel to the LAN, the internet, other clients (unless their Access says otherwise, above)",
    ));
    if let Some(l) = &p.lan {
        fwd.push(rule(
            vec![iif(l)],
            Action::Accept,
            "LAN to the tunnel and the internet",
        ));
    }
    let up = from_uplink(p);
    if p.lan.is_none() {
        for n in &p.uplink_nets {
            fwd.push(rule(
                with(up.clone(), [oif(&p.tunnel), saddr(*n)]),
                Action::Accept,
                "one-armed: LAN hosts on the uplink reach the clients",
            ));
        }
    }
    fwd.push(counted(
        with(up.clone(), [oif(&p.tunnel)]),
        COUNTER_UPLINK_FWD,
        Action::Drop,
        "the uplink does not enter the tunnel",
    ));
    if let Some(l) = &p.lan {
        fwd.push(counted(
            with(up, [oif(l)]),
            COUNTER_UPLINK_FWD,
            Action::Drop,
            "the uplink does not reach the LAN",
        ));
    }

    let mut chains = vec![
        base(
            "prerouting",
            ChainKind::Filter,
            Hook::Prerouting,
            PRIO_RAW,
            pre,
        ),
        base("input", ChainKind::Filter, Hook::Input, PRIO_FILTER, input),
        base(
            "forward",
            ChainKind::Filter,
            Hook::Forward,
            PRIO_FILTER,
            fwd,
        ),
        base("output", ChainKind::Filter, Hook::Output, PRIO_RAW, out_raw),
    ];
    let nat = nat_rules(cfg, p);
    if !nat.is_empty() {
        chains.push(base(
            "postrouting",
            ChainKind::Nat,
            Hook::Postrouting,
            PRIO_SRCNAT,
            nat,
        ));
    }
    chains.extend(cr.chains);
    let mut counters: Vec<String> = COUNTERS.iter().map(|c| c.to_string()).collect();
    counters.extend(cr.counters);
    Ruleset {
        table: TABLE.to_string(),
        counters,
        chains,
        maps: cr.maps,
    }
}

/// The source NAT chain's rules (empty: no NAT chain at all).
fn nat_rules(cfg: &Config, p: &Ports) -> Vec<Rule> {
    let mode = cfg.gateway.masquerade;
    if mode == MasqueradeMode::Off {
        return Vec::new();
    }
    // Both exemptions are for tunnel sources only: the LAN port's hosts are always
    // translated (two-armed, the appliance is their router), whatever the uplink's subnet.
    let mut v = Vec::new();
    if mode == MasqueradeMode::Auto {
        for n in &p.uplink_nets {
            v.push(rule(
                vec![iif(&p.tunnel), saddr(*n)],
                Action::Return,
                "a tunnel source in the uplink's own subnet (proxied there): not translated",
            ));
        }
    }
    for c in masquerade_off_sources(cfg) {
        v.push(rule(
            vec![iif(&p.tunnel), saddr(c)],
            Action::Return,
            "a peer with Masquerade = off",
        ));
    }
    let mut from = vec![(iif(&p.tunnel), "tunnel sources leaving by the uplink")];
    if let Some(l) = &p.lan {
        from.push((iif(l), "the LAN port's hosts leaving by the uplink"));
    }
    for (zone, why) in from {
        let out = with(vec![zone], to_uplink(p));
        if let Some(port) = p.listen_port {
            for (sports, to) in avoiding(port) {
                v.push(rule(
                    with(
                        out.clone(),
                        [Match::L4(L4::Udp), Match::SportIn(sports.0, sports.1)],
                    ),
                    Action::MasqueradePorts(to.0, to.1),
                    "UDP never translated to the WireGuard port (its replies would not be tracked)",
                ));
            }
        }
        v.push(rule(out, Action::Masquerade, why));
    }
    v
}

/// Source ports and what they are translated into so that no translated UDP flow gets
/// the WireGuard port `port`: replies to that port of the appliance are not tracked
/// (so not de-NATed) and would reach the WireGuard socket. Below it stays below, the rest
/// goes above it (below, if it is the last port), so a free port is kept as it is.
fn avoiding(port: u16) -> Vec<((u16, u16), (u16, u16))> {
    let mut v = Vec::new();
    if port >= 2 {
        v.push(((0, port - 1), (1, port - 1)));
    }
    if port < u16::MAX {
        v.push(((port, u16::MAX), (port + 1, u16::MAX)));
    } else {
        v.push(((port, port), (1, port - 1)));
    }
    v
}

/// What `riceguard status` says about NAT: what is translated on the uplink and why.
pub fn nat_summary(cfg: &Config, p: &Ports) -> Vec<String> {
    if !cfg.gateway.firewall {
        return vec!["nat: off (Firewall = off)".into()];
    }
    let list = |v: &[Cidr]| {
        v.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let off = masquerade_off_sources(cfg);
    let sources = tunnel_sources(cfg);
    let mut out = Vec::new();
    match cfg.gateway.masquerade {
        MasqueradeMode::Off => out.push("nat: off (Masquerade = off)".into()),
        MasqueradeMode::On => out.push(
            "nat: everything from the tunnel and the LAN port leaving by the uplink (Masquerade = on)"
                .into(),
        ),
        MasqueradeMode::Auto => {
            // What the postrouting chain does to a tunnel source: returns for the
            // uplink's subnets and the Masquerade = off sources, translates the rest.
            let exempt: Vec<Cidr> = p
                .uplink_nets
                .iter()
                .copied()
                .chain(off.iter().copied())
                .collect();
            let translated = minimal(sources.iter().flat_map(|c| subtract(*c, &exempt)));
            let on_link: Vec<Cidr> = sources
                .iter()
                .filter(|c| p.uplink_nets.iter().any(|n| n.overlaps(c)))
                .copied()
                .collect();
            if translated.is_empty() {
                out.push("nat: no tunnel subnet needs translating".into());
            } else {
                out.push(format!(
                    "nat: {} translated to the uplink's address (the uplink's network {} has no route back to them)",
                    list(&translated),
                    if p.uplink_nets.is_empty() {
                        "(no address yet)".to_string()
                    } else {
                        list(&p.uplink_nets)
                    }
                ));
            }
            if !on_link.is_empty() {
                out.push(format!(
                    "nat: {} not translated (inside the uplink's subnet: proxy ARP/NDP answers for them)",
                    list(&on_link)
                ));
            }
            if let Some(l) = &p.lan {
                out.push(format!("nat: the LAN port {l}'s hosts translated on the uplink (two-armed: the appliance is the site's router)"));
            }
        }
    }
    if !off.is_empty() && cfg.gateway.masquerade != MasqueradeMode::Off {
        out.push(format!(
            "nat: {} not translated ([Peer] Masquerade = off)",
            list(&off)
        ));
    }
    out
}

#[cfg(test)]
mod tests;
