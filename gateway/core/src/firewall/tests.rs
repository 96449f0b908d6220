use super::*;
use crate::config::PeerConfig;
use crate::key::Key;

fn c(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn peer(n: u8, ips: &[&str]) -> PeerConfig {
    PeerConfig {
        allowed_ips: ips.iter().map(|s| c(s).network()).collect(),
        ..PeerConfig::new(Key([n; 32]))
    }
}

/// The factory configuration with a phone, one-armed.
fn factory() -> Config {
    let mut cfg = Config::default();
    cfg.interface.listen_port = Some(51820);
    cfg.interface.addresses = vec![c("10.100.0.1/24")];
    cfg.peers = vec![peer(1, &["10.100.0.2/32"])];
    cfg
}

fn ports(uplink: &[&str]) -> Ports {
    Ports {
        tunnel: "wg0".into(),
        lan: None,
        uplink_nets: uplink.iter().map(|s| c(s)).collect(),
        uplink_addrs: Vec::new(),
        lan_nets: Vec::new(),
        listen_port: Some(51820),
    }
}

fn two_armed() -> (Config, Ports) {
    let mut cfg = factory();
    cfg.gateway.lan = "eth1".into();
    cfg.gateway.lan_addresses = vec![c("192.168.88.1/24")];
    let mut p = ports(&["192.0.2.0/24"]);
    p.lan = Some("eth1".into());
    p.lan_nets = vec![c("192.168.88.0/24")];
    (cfg, p)
}

fn chain<'a>(rs: &'a Ruleset, name: &str) -> &'a Chain {
    rs.chains.iter().find(|ch| ch.name == name).unwrap()
}

/// The first rule of `chain` whose matches all hold for a packet described by `pred`
/// (a tiny evaluator over the vocabulary, enough to check the policy's verdicts).
#[derive(Default, Clone)]
struct Pkt {
    iif: &'static str,
    oif: &'static str,
    src: Option<std::net::IpAddr>,
    /// The destination (`None`: no `Daddr` match holds, as before the per-client rules).
    dst: Option<std::net::IpAddr>,
    l4: Option<L4>,
    sport: u16,
    dport: u16,
    icmp: u8,
    ct: u32,
    /// What the destination is to the appliance (`None`: an address elsewhere).
    to: Option<AddrType>,
    /// For an ICMP error: the protocol and source port of the packet it quotes.
    quotes: Option<(L4, u16)>,
    /// The TCP header's flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10).
    tcp_flags: u8,
}

fn holds(m: &Match, k: &Pkt) -> bool {
    let fam = |v4: bool| k.src.is_some_and(|a| a.is_ipv4() == v4);
    match m {
        Match::Iif { name, eq } => (k.iif == name) == *eq,
        Match::Oif { name, eq } => (k.oif == name) == *eq,
        Match::Family(Family::V4) => fam(true),
        Match::Family(Family::V6) => fam(false),
        Match::L4(l) => k.l4 == Some(*l),
        Match::Saddr { net, eq } => k.src.is_some_and(|a| net.contains(a) == *eq),
        Match::Daddr { net, eq } => k.dst.is_some_and(|a| net.contains(a) == *eq),
        Match::Sport(p) => k.sport == *p,
        Match::Dport(p) => k.dport == *p,
        Match::SportIn(lo, hi) => (*lo..=*hi).contains(&k.sport),
        Match::IcmpType(t) => k.icmp == *t,
        Match::DaddrType(t) => k.to == Some(*t),
        Match::Quotes { family, l4, sport } => {
            fam(*family == Family::V4) && k.quotes == Some((*l4, *sport))
        }
        Match::Ct(s) => k.ct & s.0 != 0,
        Match::Limit { .. } => true,
        Match::TcpFlags { mask, value } => k.l4 == Some(L4::Tcp) && k.tcp_flags & mask == *value,
    }
}

/// What a base chain did with a packet: the verdict and the counter of the rule that
/// gave it (`Return`: the chain, and the chains it jumped to, let it through to the
/// policy), and whether a rule clamped its MSS on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    action: Action,
    counter: Option<String>,
    clamped: bool,
}

fn run(rs: &Ruleset, ch: &str, k: &Pkt) -> Outcome {
    let mut clamped = false;
    let (action, counter) = walk(rs, ch, k, &mut clamped, 0).unwrap_or((Action::Return, None));
    Outcome {
        action,
        counter,
        clamped,
    }
}

/// The rules of `ch` in turn, as the kernel runs them: `Some` ends the walk with a
/// verdict; `None`, the chain returned (a `Return` in a chain jumped to, or its end) and
/// the rule after the jump follows. `ClampMss` is no verdict: it marks a TCP packet
/// (the kernel leaves others alone) and the next rule follows.
fn walk(
    rs: &Ruleset,
    ch: &str,
    k: &Pkt,
    clamped: &mut bool,
    depth: usize,
) -> Option<(Action, Option<String>)> {
    assert!(
        depth < nft::JUMP_STACK,
        "jumps nest deeper than the kernel allows at {ch}"
    );
    for r in &chain(rs, ch).rules {
        if !r.matches.iter().all(|m| holds(m, k)) {
            continue;
        }
        let to = match &r.action {
            Action::Jump(c) => c,
            Action::SourceMap(m) => match map_target(rs, m, k) {
                Some(c) => c,
                None => continue,
            },
            Action::ClampMss => {
                *clamped |= k.l4 == Some(L4::Tcp);
                continue;
            }
            Action::Return if depth > 0 => return None,
            a => return Some((a.clone(), r.counter.clone())),
        };
        if let Some(v) = walk(rs, to, k, clamped, depth + 1) {
            return Some(v);
        }
    }
    None
}

/// The chain map `name` sends the packet's source to (`None`: no element holds it, or
/// it is of the other family).
fn map_target<'a>(rs: &'a Ruleset, name: &str, k: &Pkt) -> Option<&'a str> {
    let map = rs.maps.iter().find(|m| m.name == name).unwrap();
    let a = k.src?;
    if a.is_ipv4() != (map.family == Family::V4) {
        return None;
    }
    let e = map.elements.iter().find(|e| e.first <= a && a <= e.last)?;
    Some(&e.chain)
}

fn verdict(rs: &Ruleset, ch: &str, k: &Pkt) -> (Action, Option<String>) {
    let o = run(rs, ch, k);
    (o.action, o.counter)
}

fn ip(s: &str) -> Option<std::net::IpAddr> {
    Some(s.parse().unwrap())
}

const NEW: u32 = 1 << 3;
const EST: u32 = 1 << 1;

#[test]
fn factory_one_armed_masquerades_the_tunnel_on_the_uplink() {
    let cfg = factory();
    let rs = ruleset(&cfg, &ports(&["192.168.1.0/24"]));
    let k = Pkt {
        iif: "wg0",
        oif: "eth0",
        src: ip("10.100.0.2"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "forward", &k).0, Action::Accept);
    assert_eq!(verdict(&rs, "postrouting", &k).0, Action::Masquerade);
    // From the tunnel to another client: no NAT.
    let k2 = Pkt {
        oif: "wg0",
        ..k.clone()
    };
    assert_eq!(verdict(&rs, "postrouting", &k2).0, Action::Return);
}

#[test]
fn a_tunnel_inside_the_uplink_subnet_is_not_translated_nor_a_spoof() {
    let mut cfg = factory();
    cfg.interface.addresses = vec![c("192.168.1.201/29")];
    cfg.peers = vec![peer(1, &["192.168.1.202/32"])];
    let p = ports(&["192.168.1.0/24"]);
    let rs = ruleset(&cfg, &p);
    let k = Pkt {
        iif: "wg0",
        oif: "eth0",
        src: ip("192.168.1.202"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "postrouting", &k).0, Action::Return);
    // The tunnel's own subnet is the LAN's; the client's /32 inside it is still a spoof
    // when it arrives from the uplink.
    assert_eq!(
        spoof_prefixes(&cfg, &p.uplink_nets),
        vec![c("192.168.1.202/32")]
    );
    // A LAN host (on the uplink, one-armed) reaches the client.
    let back = Pkt {
        iif: "eth0",
        oif: "wg0",
        src: ip("192.168.1.10"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_ne!(verdict(&rs, "prerouting", &back).0, Action::Drop);
    assert_eq!(verdict(&rs, "forward", &back).0, Action::Accept);
    let forged = Pkt {
        src: ip("192.168.1.202"),
        ..back
    };
    assert_eq!(
        verdict(&rs, "prerouting", &forged),
        (Action::Drop, Some(COUNTER_SPOOF.to_string()))
    );
}

/// Issue 29, 1: a rogue DHCP server leases from the tunnel's own subnet (10.100.0.58/24
/// over `Address = 10.100.0.1/24`) and the overlap rule keeps it as the proxy-ARP layout.
/// The clients' addresses stay spoofs on the uplink: a packet from 10.100.0.2 to
/// 10.100.0.3 never enters the tunnel. (Before: no anti-spoof rule was left.)
#[test]
fn a_lease_of_the_tunnel_subnet_leaves_the_clients_spoofs_on_the_uplink() {
    let mut cfg = factory();
    cfg.interface.addresses = vec![c("10.100.0.1/24"), c("fd00:100::1/64")];
    cfg.peers = vec![
        peer(1, &["10.100.0.2/32", "fd00:100::2/128"]),
        peer(2, &["10.100.0.3/32", "fd00:100::3/128"]),
    ];
    let p = ports(&["10.100.0.0/24", "fd00:100::/64"]);
    assert_eq!(
        spoof_prefixes(&cfg, &p.uplink_nets),
        vec![
            c("10.100.0.2/32"),
            c("10.100.0.3/32"),
            c("fd00:100::2/128"),
            c("fd00:100::3/128")
        ]
    );
    let rs = ruleset(&cfg, &p);
    let spoof = (Action::Drop, Some(COUNTER_SPOOF.to_string()));
    for src in ["10.100.0.2", "fd00:100::3"] {
        let forged = Pkt {
            iif: "eth0",
            oif: "wg0",
            src: ip(src),
            ct: NEW,
            ..Pkt::default()
        };
        assert_eq!(verdict(&rs, "prerouting", &forged), spoof, "{src}");
    }
}

#[test]
fn one_armed_uplink_reaches_clients_only_from_its_own_subnet() {
    let rs = ruleset(&factory(), &ports(&["192.168.1.0/24"]));
    let far = Pkt {
        iif: "eth0",
        oif: "wg0",
        src: ip("203.0.113.9"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(
        verdict(&rs, "forward", &far),
        (Action::Drop, Some(COUNTER_UPLINK_FWD.into()))
    );
    let near = Pkt {
        src: ip("192.168.1.7"),
        ..far.clone()
    };
    assert_eq!(verdict(&rs, "forward", &near).0, Action::Accept);
    let reply = Pkt { ct: EST, ..far };
    assert_eq!(verdict(&rs, "forward", &reply).0, Action::Accept);
}

#[test]
fn two_armed_closes_uplink_to_lan_and_tunnel_and_masquerades_the_lan() {
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    for (oif, dst_zone) in [("eth1", "LAN"), ("wg0", "tunnel")] {
        let k = Pkt {
            iif: "eth0",
            oif,
            src: ip("192.0.2.50"),
            ct: NEW,
            ..Pkt::default()
        };
        assert_eq!(
            verdict(&rs, "forward", &k),
            (Action::Drop, Some(COUNTER_UPLINK_FWD.into())),
            "uplink to the {dst_zone}"
        );
    }
    let lan_out = Pkt {
        iif: "eth1",
        oif: "eth0",
        src: ip("192.168.88.10"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "forward", &lan_out).0, Action::Accept);
    assert_eq!(verdict(&rs, "postrouting", &lan_out).0, Action::Masquerade);
    // LAN to the tunnel: forwarded, not translated.
    let lan_tun = Pkt {
        oif: "wg0",
        ..lan_out
    };
    assert_eq!(verdict(&rs, "forward", &lan_tun).0, Action::Accept);
    assert_eq!(verdict(&rs, "postrouting", &lan_tun).0, Action::Return);
}

#[test]
fn spoofed_tunnel_sources_are_dropped_on_uplink_and_lan() {
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    for iif in ["eth0", "eth1", "docker0"] {
        let k = Pkt {
            iif,
            src: ip("10.100.0.2"),
            ..Pkt::default()
        };
        assert_eq!(
            verdict(&rs, "prerouting", &k),
            (Action::Drop, Some(COUNTER_SPOOF.into())),
            "{iif}"
        );
    }
    let from_tunnel = Pkt {
        iif: "wg0",
        src: ip("10.100.0.2"),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &from_tunnel).0, Action::Return);
}

#[test]
fn hub_and_overlapping_prefixes_are_not_spoofs() {
    let mut cfg = factory();
    cfg.peers.push(peer(2, &["0.0.0.0/0", "::/0"]));
    cfg.peers.push(peer(3, &["10.0.0.0/8"]));
    // 10/8 over the 10.1.x uplink: the uplink's hosts are not spoofs, the rest of 10/8
    // (the tunnel's 10.100.0.0/24 and the phone in it) still is.
    let p = ports(&["10.1.0.0/16"]);
    let sp = spoof_prefixes(&cfg, &p.uplink_nets);
    assert_eq!(sp.len(), 8, "{sp:?}");
    assert_eq!(sp.first(), Some(&c("10.0.0.0/16")));
    assert!(!sp.iter().any(|s| s.overlaps(&c("10.1.0.0/16"))));
    assert!(sp.iter().any(|s| s.covers(&c("10.100.0.2/32"))));
    let rs = ruleset(&cfg, &p);
    let from = |a: &'static str| Pkt {
        iif: "eth0",
        src: ip(a),
        ct: NEW,
        ..Pkt::default()
    };
    assert_ne!(
        verdict(&rs, "prerouting", &from("10.1.0.9")).0,
        Action::Drop
    );
    assert_eq!(
        verdict(&rs, "prerouting", &from("10.100.0.2")).0,
        Action::Drop
    );
    assert_eq!(
        verdict(&rs, "prerouting", &from("10.200.0.2")).0,
        Action::Drop
    );
    let dhcp_server = Pkt {
        iif: "eth0",
        src: ip("10.1.0.1"),
        l4: Some(L4::Udp),
        sport: 67,
        dport: 68,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &dhcp_server).0, Action::Return);
    // Over an uplink elsewhere, 10/8 covers the tunnel's /24: one prefix, not two.
    assert_eq!(
        spoof_prefixes(&cfg, &[c("192.168.1.0/24")]),
        vec![c("10.0.0.0/8")]
    );
}

#[test]
fn dhcp_replies_pass_before_the_uplink_has_a_subnet() {
    let mut cfg = factory();
    cfg.peers.push(peer(3, &["10.0.0.0/8"]));
    let rs = ruleset(&cfg, &Ports::from_config(&cfg));
    let offer = Pkt {
        iif: "eth0",
        src: ip("10.1.0.1"),
        l4: Some(L4::Udp),
        sport: 67,
        dport: 68,
        to: Some(AddrType::Broadcast),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &offer).0, Action::Return);
    assert_eq!(verdict(&rs, "input", &offer).0, Action::Accept);
    // Anything else from 10/8 is a spoof until the lease says it is on-link.
    let other = Pkt {
        dport: 53,
        sport: 53,
        ..offer
    };
    assert_eq!(verdict(&rs, "prerouting", &other).0, Action::Drop);
}

#[test]
fn uplink_input_is_wireguard_tcp_fallback_dhcp_icmp_only() {
    let mut cfg = factory();
    cfg.gateway.tcp_listen = vec![443];
    let rs = ruleset(&cfg, &ports(&["192.0.2.0/24"]));
    let from = |l4, dport, icmp| Pkt {
        iif: "eth0",
        src: ip("198.51.100.7"),
        l4: Some(l4),
        dport,
        icmp,
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(
        verdict(&rs, "input", &from(L4::Udp, 51820, 0)).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &from(L4::Tcp, 443, 0)).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &from(L4::Icmp, 0, 3)).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &from(L4::Icmp, 0, 8)).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &from(L4::Icmpv6, 0, 135)).0,
        Action::Accept
    );
    for closed in [
        from(L4::Tcp, 22, 0),
        from(L4::Udp, 53, 0),
        from(L4::Icmp, 0, 13),
    ] {
        assert_eq!(
            verdict(&rs, "input", &closed),
            (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
        );
    }
    // The tunnel reaches the appliance.
    let client = Pkt {
        iif: "wg0",
        ..from(L4::Tcp, 22, 0)
    };
    assert_eq!(verdict(&rs, "input", &client).0, Action::Accept);
    // WireGuard is not tracked, both ways.
    let wg_in = Pkt {
        to: Some(AddrType::Local),
        ..from(L4::Udp, 51820, 0)
    };
    assert_eq!(verdict(&rs, "prerouting", &wg_in).0, Action::Notrack);
    let ours = Pkt {
        l4: Some(L4::Udp),
        sport: 51820,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "output", &ours).0, Action::Notrack);
}

#[test]
fn masquerade_modes_and_per_peer_off() {
    let mut cfg = factory();
    cfg.peers.push(PeerConfig {
        masquerade: false,
        ..peer(2, &["192.168.50.0/24"])
    });
    let p = ports(&["192.168.1.0/24"]);
    let site = Pkt {
        iif: "wg0",
        oif: "eth0",
        src: ip("192.168.50.9"),
        ..Pkt::default()
    };
    let rs = ruleset(&cfg, &p);
    assert_eq!(verdict(&rs, "postrouting", &site).0, Action::Return);
    cfg.gateway.masquerade = MasqueradeMode::On;
    let on_link = Pkt {
        src: ip("192.168.1.77"),
        ..site.clone()
    };
    assert_eq!(
        verdict(&ruleset(&cfg, &p), "postrouting", &on_link).0,
        Action::Masquerade
    );
    cfg.gateway.masquerade = MasqueradeMode::Off;
    assert!(!ruleset(&cfg, &p)
        .chains
        .iter()
        .any(|ch| ch.name == "postrouting"));
}

#[test]
fn ipv6_gets_the_same_policy() {
    let mut cfg = factory();
    cfg.interface.addresses.push(c("fd00:100::1/64"));
    cfg.peers[0].allowed_ips.push(c("fd00:100::2/128"));
    let p = ports(&["192.168.1.0/24", "2001:db8:1::/64"]);
    let rs = ruleset(&cfg, &p);
    let out = Pkt {
        iif: "wg0",
        oif: "eth0",
        src: ip("fd00:100::2"),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "postrouting", &out).0, Action::Masquerade);
    let spoof = Pkt {
        iif: "eth0",
        src: ip("fd00:100::2"),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &spoof).0, Action::Drop);
    let on_link = Pkt {
        src: ip("2001:db8:1::5"),
        ..out
    };
    assert_eq!(verdict(&rs, "postrouting", &on_link).0, Action::Return);
}

#[test]
fn disabled_peers_are_not_tunnel_sources() {
    let mut cfg = factory();
    cfg.peers.push(PeerConfig {
        enabled: false,
        ..peer(2, &["172.16.0.0/16"])
    });
    assert_eq!(tunnel_sources(&cfg), vec![c("10.100.0.0/24")]);
}

#[test]
fn nat_summary_says_what_and_why() {
    let s = nat_summary(&factory(), &ports(&["192.168.1.0/24"])).join("\n");
    assert!(s.contains("10.100.0.0/24 translated"), "{s}");
    assert!(s.contains("192.168.1.0/24"), "{s}");
    let mut cfg = factory();
    cfg.interface.addresses = vec![c("192.168.1.201/29")];
    cfg.peers = vec![peer(1, &["192.168.1.202/32"])];
    let s = nat_summary(&cfg, &ports(&["192.168.1.0/24"])).join("\n");
    assert!(
        s.contains("not translated") && s.contains("proxy ARP"),
        "{s}"
    );
    cfg.gateway.firewall = false;
    assert!(nat_summary(&cfg, &ports(&[]))[0].contains("Firewall = off"));
}

#[test]
fn every_counter_a_rule_names_exists() {
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    for ch in &rs.chains {
        for r in &ch.rules {
            if let Some(n) = &r.counter {
                assert!(rs.counters.contains(n), "{n}");
            }
        }
    }
}

#[test]
fn an_established_echo_flood_meets_the_limit() {
    let rs = ruleset(&factory(), &ports(&["192.0.2.0/24"]));
    let input = &chain(&rs, "input").rules;
    let limited = input
        .iter()
        .position(|r| r.matches.iter().any(|m| matches!(m, Match::Limit { .. })))
        .unwrap();
    let over = input
        .iter()
        .position(|r| {
            r.action == Action::Drop && r.matches.contains(&Match::IcmpType(ICMP_ECHO_REQUEST))
        })
        .unwrap();
    let established = input
        .iter()
        .position(|r| {
            r.matches
                .iter()
                .any(|m| matches!(m, Match::Ct(s) if s.0 & EST != 0))
        })
        .unwrap();
    assert!(limited < over && over < established);
    // The tunnel's pings are not limited.
    let client = Pkt {
        iif: "wg0",
        src: ip("10.100.0.2"),
        l4: Some(L4::Icmp),
        icmp: ICMP_ECHO_REQUEST,
        ct: EST,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "input", &client).0, Action::Accept);
    assert!(input[..limited].iter().any(|r| r.matches
        == vec![Match::Iif {
            name: "wg0".into(),
            eq: true
        }]));
}

#[test]
fn our_looped_back_dhcp_broadcast_is_not_a_spoof() {
    let cfg = factory();
    let rs = ruleset(&cfg, &Ports::from_config(&cfg));
    let discover = Pkt {
        iif: "eth0",
        src: ip("10.100.0.1"),
        l4: Some(L4::Udp),
        sport: 68,
        dport: 67,
        to: Some(AddrType::Broadcast),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &discover).0, Action::Return);
}

/// UDP 67/68 and 547/546 from a tunnel source: only what comes from the uplink to the
/// appliance itself escapes the anti-spoofing; from the LAN port, or on its way to a
/// client, it is a spoof.
#[test]
fn dhcp_ports_are_exempt_only_from_the_uplink_to_the_appliance() {
    let (mut cfg, p) = two_armed();
    cfg.interface.addresses.push(c("fd00:100::1/64"));
    let rs = ruleset(&cfg, &p);
    let pairs = [
        ("10.100.0.3", 67, 68),
        ("fd00:100::3", 547, 546),
        ("10.100.0.3", 68, 67),
    ];
    let spoof = (Action::Drop, Some(COUNTER_SPOOF.to_string()));
    for (src, sport, dport) in pairs {
        let k = Pkt {
            iif: "eth1",
            src: ip(src),
            l4: Some(L4::Udp),
            sport,
            dport,
            ..Pkt::default()
        };
        for to in [None, Some(AddrType::Local), Some(AddrType::Broadcast)] {
            let lan = Pkt { to, ..k.clone() };
            assert_eq!(
                verdict(&rs, "prerouting", &lan),
                spoof,
                "LAN {sport}->{dport} {to:?}"
            );
        }
        let forwarded = Pkt {
            iif: "eth0",
            ..k.clone()
        };
        assert_eq!(
            verdict(&rs, "prerouting", &forwarded),
            spoof,
            "uplink {sport}->{dport}, forwarded"
        );
    }
    // From the uplink to the appliance: not judged by source.
    for (src, sport, dport, to) in [
        ("10.100.0.3", 67, 68, AddrType::Local),
        ("10.100.0.3", 67, 68, AddrType::Broadcast),
        ("fd00:100::3", 547, 546, AddrType::Local),
        ("10.100.0.1", 68, 67, AddrType::Broadcast),
    ] {
        let k = Pkt {
            iif: "eth0",
            src: ip(src),
            l4: Some(L4::Udp),
            sport,
            dport,
            to: Some(to),
            ..Pkt::default()
        };
        assert_eq!(
            verdict(&rs, "prerouting", &k).0,
            Action::Return,
            "{sport}->{dport} {to:?}"
        );
    }
    // A looped-back DHCPDISCOVER is a broadcast; unicast 68 -> 67 from a tunnel source is
    // a spoof.
    let unicast = Pkt {
        iif: "eth0",
        src: ip("10.100.0.3"),
        l4: Some(L4::Udp),
        sport: 68,
        dport: 67,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &unicast), spoof);
}

/// ICMP errors quoting our WireGuard or TCP-fallback packets pass although conntrack
/// calls them invalid (WireGuard is not tracked); others meet the invalid drop.
#[test]
fn icmp_errors_about_our_sockets_pass_before_the_invalid_drop() {
    let mut cfg = factory();
    cfg.gateway.tcp_listen = vec![443];
    let rs = ruleset(&cfg, &ports(&["192.0.2.0/24"]));
    const INVALID: u32 = 1;
    for (src, l4, t) in [
        ("192.0.2.1", L4::Icmp, 3),
        ("2001:db8::1", L4::Icmpv6, 2),
        ("2001:db8::1", L4::Icmpv6, 1),
    ] {
        for quotes in [(L4::Udp, 51820), (L4::Tcp, 443)] {
            let k = Pkt {
                iif: "eth0",
                src: ip(src),
                l4: Some(l4),
                icmp: t,
                ct: INVALID,
                quotes: Some(quotes),
                ..Pkt::default()
            };
            assert_eq!(
                verdict(&rs, "input", &k).0,
                Action::Accept,
                "{l4:?} {t} {quotes:?}"
            );
        }
        // Quoting someone else's packet (a port we do not send from): invalid.
        let other = Pkt {
            iif: "eth0",
            src: ip(src),
            l4: Some(l4),
            icmp: t,
            ct: INVALID,
            quotes: Some((L4::Udp, 53)),
            ..Pkt::default()
        };
        assert_eq!(
            verdict(&rs, "input", &other),
            (Action::Drop, Some(COUNTER_INVALID.into()))
        );
    }
    // The family of the quoted header is the ICMP's: an IPv4 error never takes the
    // IPv6 offsets' rule.
    for r in &chain(&rs, "input").rules {
        if let Some(Match::Quotes { family, .. }) = r.matches.last() {
            let v6 = r.matches.contains(&Match::L4(L4::Icmpv6));
            assert_eq!(*family == Family::V6, v6, "{r:?}");
        }
    }
}

#[test]
fn mld_from_link_local_sources_is_accepted() {
    let rs = ruleset(&factory(), &ports(&["192.0.2.0/24"]));
    let untracked = CtStates::UNTRACKED.0;
    let query = Pkt {
        iif: "eth0",
        src: ip("fe80::1"),
        l4: Some(L4::Icmpv6),
        icmp: 130,
        ct: untracked,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "input", &query).0, Action::Accept);
    for t in [131, 132, 143] {
        let k = Pkt {
            icmp: t,
            ..query.clone()
        };
        assert_eq!(verdict(&rs, "input", &k).0, Action::Accept, "{t}");
    }
    let global = Pkt {
        src: ip("2001:db8::1"),
        ..query
    };
    assert_eq!(
        verdict(&rs, "input", &global),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
}

/// Forwarded traffic to the WireGuard port (a LAN host's flow) is tracked like any
/// other, so its replies are de-NATed; only the appliance's own datagrams are not.
#[test]
fn notrack_is_for_the_appliances_own_wireguard_datagrams_only() {
    let rs = ruleset(&factory(), &ports(&["192.168.1.0/24"]));
    let to_client = Pkt {
        iif: "eth0",
        src: ip("192.168.1.10"),
        l4: Some(L4::Udp),
        sport: 40000,
        dport: 51820,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &to_client).0, Action::Return);
    let to_us = Pkt {
        to: Some(AddrType::Local),
        ..to_client
    };
    assert_eq!(verdict(&rs, "prerouting", &to_us).0, Action::Notrack);
}

/// A client's UDP flow leaving by the uplink is never translated to the WireGuard port:
/// the replies to it would be taken for WireGuard datagrams (not tracked, not de-NATed).
#[test]
fn masquerade_never_picks_the_wireguard_port() {
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    for (iif, src) in [("wg0", "10.100.0.2"), ("eth1", "192.168.88.10")] {
        for (sport, lo, hi) in [
            (51820, 51821, 65535),
            (60000, 51821, 65535),
            (40000, 1, 51819),
            (123, 1, 51819),
        ] {
            let k = Pkt {
                iif,
                oif: "eth0",
                src: ip(src),
                l4: Some(L4::Udp),
                sport,
                ..Pkt::default()
            };
            let a = verdict(&rs, "postrouting", &k).0;
            assert_eq!(a, Action::MasqueradePorts(lo, hi), "{iif} {sport}");
            assert!(!(lo..=hi).contains(&51820));
        }
        let tcp = Pkt {
            iif,
            oif: "eth0",
            src: ip(src),
            l4: Some(L4::Tcp),
            sport: 51820,
            ..Pkt::default()
        };
        assert_eq!(verdict(&rs, "postrouting", &tcp).0, Action::Masquerade);
    }
    assert_eq!(avoiding(1), vec![((1, 65535), (2, 65535))]);
    assert_eq!(
        avoiding(65535),
        vec![((0, 65534), (1, 65534)), ((65535, 65535), (1, 65534))]
    );
}

/// Issue 29, 4: the uplink's subnet exempts tunnel sources from NAT (proxied there), not
/// the LAN port's hosts: two-armed, a LAN host inside that subnet is still translated,
/// and `show status` says so. (Before: the return matched any interface.)
#[test]
fn the_uplink_subnet_exempts_only_tunnel_sources_from_nat() {
    let (cfg, mut p) = two_armed();
    p.uplink_nets = vec![c("192.168.0.0/16")];
    let rs = ruleset(&cfg, &p);
    let lan_host = Pkt {
        iif: "eth1",
        oif: "eth0",
        src: ip("192.168.88.20"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "postrouting", &lan_host).0, Action::Masquerade);
    let proxied_client = Pkt {
        iif: "wg0",
        src: ip("192.168.7.7"),
        ..lan_host.clone()
    };
    assert_eq!(
        verdict(&rs, "postrouting", &proxied_client).0,
        Action::Return
    );
    let s = nat_summary(&cfg, &p).join("\n");
    assert!(
        s.contains("nat: the LAN port eth1's hosts translated on the uplink"),
        "{s}"
    );
}

/// `[Peer] Masquerade = off` exempts the sources that peer owns by longest prefix, and
/// only what arrived on the tunnel: a 10.0.0.0/8 site does not un-NAT the phone's
/// 10.100.0.2/32 (another peer's), nor a LAN host in 10/8.
#[test]
fn masquerade_off_exempts_what_the_peer_owns_by_longest_prefix() {
    let (mut cfg, p) = two_armed();
    cfg.gateway.lan_addresses = vec![c("10.200.0.1/24")];
    cfg.peers.push(PeerConfig {
        masquerade: false,
        ..peer(2, &["10.0.0.0/8"])
    });
    let off = masquerade_off_sources(&cfg);
    // 10/8 minus the phone's /32: 24 prefixes, none holding 10.100.0.2.
    assert_eq!(off.len(), 24, "{off:?}");
    assert!(off
        .iter()
        .all(|o| !o.contains("10.100.0.2".parse().unwrap())));
    let size = |c: &Cidr| 1u64 << (32 - c.prefix);
    assert_eq!(off.iter().map(size).sum::<u64>(), (1 << 24) - 1);
    let mut p2 = p.clone();
    p2.lan_nets = vec![c("10.200.0.0/24")];
    let rs = ruleset(&cfg, &p2);
    let from = |iif: &'static str, a: &str| Pkt {
        iif,
        oif: "eth0",
        src: ip(a),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(
        verdict(&rs, "postrouting", &from("wg0", "10.7.7.7")).0,
        Action::Return
    );
    assert_eq!(
        verdict(&rs, "postrouting", &from("wg0", "10.100.0.2")).0,
        Action::Masquerade
    );
    assert_eq!(
        verdict(&rs, "postrouting", &from("eth1", "10.200.0.9")).0,
        Action::Masquerade
    );
    // A peer with Masquerade = off inside another one's wider prefix keeps its own.
    cfg.peers[0].masquerade = false;
    cfg.peers[1].masquerade = true;
    assert_eq!(masquerade_off_sources(&cfg), vec![c("10.100.0.2/32")]);
}

/// The services' input rule: SSH (a key set) from the tunnel and the LAN port; one-armed
/// from the uplink's own subnet, cut to /16 around our address; two-armed never from the
/// uplink (dropped and counted). No key: nothing let in for the port from the uplink.
#[test]
fn ssh_from_the_tunnel_and_lan_side_only() {
    let ssh = |cfg: &mut Config| {
        cfg.gateway.ssh_keys = vec![crate::value::ssh_key(
            "alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC",
        )
        .unwrap()];
    };
    let syn = |iif: &'static str, src: &str| Pkt {
        iif,
        src: ip(src),
        l4: Some(L4::Tcp),
        dport: 22,
        ct: NEW,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    // One-armed, a /8 lease.
    let mut cfg = factory();
    ssh(&mut cfg);
    let mut p = ports(&["10.0.0.0/8"]);
    p.uplink_addrs = vec![c("10.7.3.4/8")];
    let rs = ruleset(&cfg, &p);
    assert_eq!(
        verdict(&rs, "input", &syn("wg0", "10.100.0.2")).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "10.7.9.9")).0,
        Action::Accept
    );
    let far = verdict(&rs, "input", &syn("eth0", "10.9.0.1"));
    assert_eq!(far, (Action::Drop, Some(COUNTER_UPLINK_IN.into())));
    // Without a key the port is closed from the uplink (the tunnel's accept-all aside).
    let plain = ruleset(&factory(), &p);
    assert_eq!(
        verdict(&plain, "input", &syn("eth0", "10.7.9.9")).0,
        Action::Drop
    );
    // Two-armed: the LAN port yes, the uplink never (even from its own subnet).
    let (mut cfg, mut p) = two_armed();
    ssh(&mut cfg);
    p.uplink_addrs = vec![c("192.0.2.2/24")];
    let rs = ruleset(&cfg, &p);
    assert_eq!(
        verdict(&rs, "input", &syn("eth1", "192.168.88.7")).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "192.0.2.7")),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
}

/// The metrics port, as SSH's: with `Metrics = on` from the tunnel and the LAN port,
/// one-armed from the uplink's own subnet; two-armed never from the uplink (dropped and
/// counted as uplink-in). With `Metrics = off` nothing is let in for it from the uplink.
#[test]
fn metrics_from_the_tunnel_and_lan_side_only() {
    let port = crate::config::DEFAULT_METRICS_PORT;
    let syn = |iif: &'static str, src: &str| Pkt {
        iif,
        src: ip(src),
        l4: Some(L4::Tcp),
        dport: port,
        ct: NEW,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    let on = |mut cfg: Config| {
        cfg.gateway.metrics = true;
        cfg
    };
    // One-armed, a /24.
    let mut p = ports(&["192.168.1.0/24"]);
    p.uplink_addrs = vec![c("192.168.1.2/24")];
    let rs = ruleset(&on(factory()), &p);
    assert_eq!(
        verdict(&rs, "input", &syn("wg0", "10.100.0.2")).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "192.168.1.50")).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "198.51.100.7")),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
    // Off: the port is closed from the uplink's own subnet too.
    let off = ruleset(&factory(), &p);
    assert_eq!(
        verdict(&off, "input", &syn("eth0", "192.168.1.50")),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
    // Another port: the rule follows MetricsPort.
    let mut moved = on(factory());
    moved.gateway.metrics_port = 9100;
    let rs = ruleset(&moved, &p);
    let mut s = syn("eth0", "192.168.1.50");
    s.dport = 9100;
    assert_eq!(verdict(&rs, "input", &s).0, Action::Accept);
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "192.168.1.50")).0,
        Action::Drop
    );
    // Two-armed: the LAN port yes, the uplink never (even from its own subnet).
    let (cfg, mut p) = two_armed();
    p.uplink_addrs = vec![c("192.0.2.2/24")];
    let rs = ruleset(&on(cfg), &p);
    assert_eq!(
        verdict(&rs, "input", &syn("eth1", "192.168.88.7")).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &syn("eth0", "192.0.2.7")),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
}

/// A table for the evaluator's own tests: `forward` jumps to `clients` and looks the
/// source up in map `who` (two regular chains, `c1` and `c2`), then clamps SYNs.
fn jumps_and_maps() -> Ruleset {
    use crate::testutil::nft::{filter, rule_};
    let regular = |name: &str, rules| Chain {
        name: name.into(),
        base: None,
        rules,
    };
    let from = |s: &str| Match::Saddr {
        net: c(s),
        eq: true,
    };
    let syn = Match::TcpFlags {
        mask: 0x06,
        value: 0x02,
    };
    let forward = vec![
        rule_(
            vec![Match::Iif {
                name: "wg0".into(),
                eq: true,
            }],
            None,
            Action::Jump("clients".into()),
        ),
        rule_(vec![], None, Action::SourceMap("who".into())),
        rule_(vec![Match::L4(L4::Tcp), syn], None, Action::ClampMss),
        rule_(vec![from("10.0.0.0/8")], Some("tail"), Action::Drop),
    ];
    let clients = vec![
        rule_(vec![from("10.100.0.2/32")], None, Action::Return),
        rule_(vec![from("10.100.0.0/24")], Some("clients"), Action::Accept),
    ];
    let ip = |s: &str| s.parse().unwrap();
    let element = |first: &str, last: &str, chain: &str| MapElement {
        first: ip(first),
        last: ip(last),
        chain: chain.into(),
    };
    Ruleset {
        table: "t".into(),
        counters: vec!["tail".into(), "clients".into(), "c2".into()],
        chains: vec![
            filter("forward", Hook::Forward, PRIO_FILTER, forward),
            regular("clients", clients),
            regular("c1", vec![rule_(vec![], None, Action::Accept)]),
            regular(
                "c2",
                vec![rule_(vec![from("10.1.2.0/24")], Some("c2"), Action::Drop)],
            ),
        ],
        maps: vec![VerdictMap {
            name: "who".into(),
            family: Family::V4,
            elements: vec![
                element("10.0.0.2", "10.0.0.2", "c1"),
                element("10.1.0.0", "10.1.255.255", "c2"),
            ],
        }],
    }
}

#[test]
fn a_jump_runs_the_chain_and_comes_back_on_return_or_its_end() {
    let rs = jumps_and_maps();
    let k = |src| Pkt {
        iif: "wg0",
        src: ip(src),
        ..Pkt::default()
    };
    // The chain decides.
    let o = run(&rs, "forward", &k("10.100.0.7"));
    assert_eq!(
        (o.action, o.counter.as_deref()),
        (Action::Accept, Some("clients"))
    );
    // Its `Return`, and its end, come back to the rule after the jump (here: the map,
    // which has no element for these, then the last rule).
    for src in ["10.100.0.2", "10.9.0.1"] {
        assert_eq!(
            verdict(&rs, "forward", &k(src)),
            (Action::Drop, Some("tail".into())),
            "{src}"
        );
    }
    // Nothing holds: the base chain's end, its policy.
    assert_eq!(run(&rs, "forward", &k("192.0.2.1")).action, Action::Return);
}

#[test]
fn a_source_map_jumps_by_range_and_otherwise_does_nothing() {
    let rs = jumps_and_maps();
    let k = |src| Pkt {
        iif: "eth0",
        src: ip(src),
        ..Pkt::default()
    };
    assert_eq!(run(&rs, "forward", &k("10.0.0.2")).action, Action::Accept);
    // A range: inside it the chain's rules decide; where they do not, back in `forward`.
    assert_eq!(
        verdict(&rs, "forward", &k("10.1.2.3")),
        (Action::Drop, Some("c2".into()))
    );
    assert_eq!(
        verdict(&rs, "forward", &k("10.1.255.255")),
        (Action::Drop, Some("tail".into()))
    );
    // Between and outside the elements, and the other family: the next rule.
    for src in ["10.0.0.3", "10.0.0.1", "10.2.0.0"] {
        assert_eq!(
            verdict(&rs, "forward", &k(src)).1,
            Some("tail".into()),
            "{src}"
        );
    }
    assert_eq!(run(&rs, "forward", &k("fd00::2")).action, Action::Return);
}

#[test]
fn clamping_the_mss_is_no_verdict() {
    let rs = jumps_and_maps();
    let k = |flags, l4| Pkt {
        iif: "eth0",
        src: ip("192.0.2.1"),
        l4: Some(l4),
        tcp_flags: flags,
        ..Pkt::default()
    };
    let syn = run(&rs, "forward", &k(0x02, L4::Tcp));
    assert_eq!((syn.action, syn.clamped), (Action::Return, true));
    // SYN+ACK is clamped too (mask SYN|RST); SYN+RST and a plain ACK are not.
    assert!(run(&rs, "forward", &k(0x12, L4::Tcp)).clamped);
    assert!(!run(&rs, "forward", &k(0x06, L4::Tcp)).clamped);
    assert!(!run(&rs, "forward", &k(0x10, L4::Tcp)).clamped);
    assert!(!run(&rs, "forward", &k(0x02, L4::Udp)).clamped);
    // The rules after it still run.
    let from10 = Pkt {
        src: ip("10.9.0.1"),
        ..k(0x02, L4::Tcp)
    };
    let o = run(&rs, "forward", &from10);
    assert_eq!((o.action, o.clamped), (Action::Drop, true));
}

/// DNS (port 53, UDP and TCP): from the tunnel and the LAN port, never from the uplink,
/// one-armed from its own subnet included (SSH is let in from there, DNS is not).
#[test]
fn dns_never_from_the_uplink() {
    let q = |iif: &'static str, src: &str, l4: L4| Pkt {
        iif,
        src: ip(src),
        l4: Some(l4),
        dport: crate::firewall::services::DNS_PORT,
        ct: NEW,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    let mut p = ports(&["192.168.1.0/24"]);
    p.uplink_addrs = vec![c("192.168.1.2/24")];
    let rs = ruleset(&factory(), &p);
    for l4 in [L4::Udp, L4::Tcp] {
        assert_eq!(
            verdict(&rs, "input", &q("wg0", "10.100.0.2", l4)).0,
            Action::Accept
        );
        assert_eq!(
            verdict(&rs, "input", &q("eth0", "192.168.1.50", l4)),
            (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
        );
    }
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    assert_eq!(p.lan.as_deref(), Some("eth1"));
    assert_eq!(
        verdict(&rs, "input", &q("eth1", "192.168.88.20", L4::Udp)).0,
        Action::Accept
    );
    assert_eq!(
        verdict(&rs, "input", &q("eth0", "192.0.2.50", L4::Udp)),
        (Action::Drop, Some(COUNTER_UPLINK_IN.into()))
    );
}

/// Per-client access (`firewall::clients`) through the evaluator.
#[path = "clients/tests.rs"]
mod clients;
