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
    l4: Option<L4>,
    sport: u16,
    dport: u16,
    icmp: u8,
    ct: u32,
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
        Match::Daddr { .. } => false,
        Match::Sport(p) => k.sport == *p,
        Match::Dport(p) => k.dport == *p,
        Match::IcmpType(t) => k.icmp == *t,
        Match::Ct(s) => k.ct & s.0 != 0,
        Match::Limit { .. } => true,
    }
}

fn verdict(rs: &Ruleset, ch: &str, k: &Pkt) -> (Action, Option<String>) {
    for r in &chain(rs, ch).rules {
        if r.matches.iter().all(|m| holds(m, k)) {
            return (r.action, r.counter.clone());
        }
    }
    (Action::Return, None)
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
    assert!(spoof_prefixes(&cfg, &p.uplink_nets).is_empty());
    // A LAN host (on the uplink, one-armed) reaches the client.
    let back = Pkt {
        iif: "eth0",
        oif: "wg0",
        src: ip("192.168.1.10"),
        ct: NEW,
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "forward", &back).0, Action::Accept);
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
    // 10/8 overlaps the 10.1.x uplink: excluded with it the tunnel's /24 inside it.
    let p = ports(&["10.1.0.0/16"]);
    assert!(spoof_prefixes(&cfg, &p.uplink_nets).is_empty());
    let rs = ruleset(&cfg, &p);
    let dhcp_server = Pkt {
        iif: "eth0",
        src: ip("10.1.0.1"),
        l4: Some(L4::Udp),
        sport: 67,
        dport: 68,
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
    assert_eq!(
        verdict(&rs, "prerouting", &from(L4::Udp, 51820, 0)).0,
        Action::Notrack
    );
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
        ..Pkt::default()
    };
    assert_eq!(verdict(&rs, "prerouting", &discover).0, Action::Return);
}
