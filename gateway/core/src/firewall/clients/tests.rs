use super::*;
use crate::access::parse_list;

fn with_access(mut p: PeerConfig, a: &str) -> PeerConfig {
    p.access = Some(parse_list(a).unwrap());
    p
}

/// A new TCP flow from `src` to `dst` port `dport` arriving on the tunnel, leaving by `oif`.
fn tcp(src: &str, dst: &str, dport: u16, oif: &'static str) -> Pkt {
    Pkt {
        iif: "wg0",
        oif,
        src: ip(src),
        dst: ip(dst),
        l4: Some(L4::Tcp),
        dport,
        ct: NEW,
        tcp_flags: 0x02,
        ..Pkt::default()
    }
}

fn accepted(rs: &Ruleset, ch: &str, k: &Pkt) -> bool {
    let (a, _) = verdict(rs, ch, k);
    assert!(
        matches!(a, Action::Accept | Action::Drop | Action::Return),
        "{a:?}"
    );
    a != Action::Drop
}

#[test]
fn a_lan_only_client_reaches_the_lan_not_the_internet() {
    let (mut cfg, p) = two_armed();
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "lan");
    cfg.peers.push(peer(2, &["10.100.0.3/32"]));
    let rs = ruleset(&cfg, &p);
    nft::validate(&rs).unwrap();
    let counter = crate::firewall::clients::counter_name(&cfg.peers[0].public_key);
    assert!(rs.counters.contains(&counter));
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.88.10", 22, "eth1")
    ));
    // Whatever the client routes (its AllowedIPs 0.0.0.0/0): its source is its own.
    let out = tcp("10.100.0.2", "198.51.100.10", 443, "eth0");
    assert_eq!(
        verdict(&rs, "forward", &out),
        (Action::Drop, Some(counter.clone()))
    );
    // Other clients: not its to start.
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "10.100.0.3", 22, "wg0")
    ));
    // The unrestricted client next to it reaches everything.
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.3", "198.51.100.10", 443, "eth0")
    ));
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.3", "10.100.0.2", 22, "wg0")
    ));
    // Replies to what others started pass; the LAN starts towards it by the LAN's rule.
    let reply = Pkt {
        ct: EST,
        tcp_flags: 0x12,
        ..out.clone()
    };
    assert!(accepted(&rs, "forward", &reply));
    let from_lan = Pkt {
        iif: "eth1",
        oif: "wg0",
        src: ip("192.168.88.10"),
        dst: ip("10.100.0.2"),
        ..out.clone()
    };
    assert!(accepted(&rs, "forward", &from_lan));
    // The appliance: ping and its resolver (lan), not SSH (no `appliance`).
    let to_box = |l4, dport, icmp| Pkt {
        iif: "wg0",
        src: ip("10.100.0.2"),
        dst: ip("10.100.0.1"),
        l4: Some(l4),
        dport,
        icmp,
        ct: NEW,
        to: Some(AddrType::Local),
        ..Pkt::default()
    };
    assert!(accepted(&rs, "input", &to_box(L4::Icmp, 0, 8)));
    assert!(accepted(&rs, "input", &to_box(L4::Udp, 53, 0)));
    assert!(accepted(&rs, "input", &to_box(L4::Tcp, 53, 0)));
    assert_eq!(
        verdict(&rs, "input", &to_box(L4::Tcp, 22, 0)),
        (Action::Drop, Some(counter))
    );
    assert!(accepted(
        &rs,
        "input",
        &Pkt {
            src: ip("10.100.0.3"),
            ..to_box(L4::Tcp, 22, 0)
        }
    ));
}

#[test]
fn a_client_limited_to_one_port_of_one_host() {
    let (mut cfg, p) = two_armed();
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "192.168.88.10/32 tcp 8096");
    let rs = ruleset(&cfg, &p);
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.88.10", 8096, "eth1")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.88.10", 22, "eth1")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.88.11", 8096, "eth1")
    ));
    let ping = Pkt {
        l4: Some(L4::Icmp),
        icmp: 8,
        dport: 0,
        ..tcp("10.100.0.2", "192.168.88.10", 0, "eth1")
    };
    assert!(!accepted(&rs, "forward", &ping));
    let udp = Pkt {
        l4: Some(L4::Udp),
        ..tcp("10.100.0.2", "192.168.88.10", 8096, "eth1")
    };
    assert!(!accepted(&rs, "forward", &udp));
    // No lan nor internet: no resolver either; ping to the box still.
    let dns = Pkt {
        iif: "wg0",
        src: ip("10.100.0.2"),
        dst: ip("10.100.0.1"),
        l4: Some(L4::Udp),
        dport: 53,
        ct: NEW,
        ..Pkt::default()
    };
    assert!(!accepted(&rs, "input", &dns));
    let icmp = Pkt {
        l4: Some(L4::Icmp),
        icmp: 8,
        dport: 0,
        ..dns.clone()
    };
    assert!(accepted(&rs, "input", &icmp));
    // `icmp` on a prefix: that host's ping only.
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "192.168.88.0/24 icmp, fd88::/64 icmp");
    let rs = ruleset(&cfg, &p);
    assert!(accepted(&rs, "forward", &ping));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.88.10", 8096, "eth1")
    ));
}

#[test]
fn isolation_keeps_clients_apart_and_each_on_the_lan() {
    let (mut cfg, p) = two_armed();
    cfg.peers.push(peer(2, &["10.100.0.3/32"]));
    cfg.gateway.client_isolation = true;
    let rs = ruleset(&cfg, &p);
    nft::validate(&rs).unwrap();
    for (a, b) in [("10.100.0.2", "10.100.0.3"), ("10.100.0.3", "10.100.0.2")] {
        assert!(
            !accepted(&rs, "forward", &tcp(a, b, 22, "wg0")),
            "{a} -> {b}"
        );
        assert!(accepted(
            &rs,
            "forward",
            &tcp(a, "192.168.88.10", 22, "eth1")
        ));
        assert!(accepted(
            &rs,
            "forward",
            &tcp(a, "198.51.100.1", 443, "eth0")
        ));
    }
    // An Access of its own with `clients` overrides the isolation for that client.
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "lan, clients");
    let rs = ruleset(&cfg, &p);
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "10.100.0.3", 22, "wg0")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.3", "10.100.0.2", 22, "wg0")
    ));
    // Isolated default clients keep the appliance (SSH, metrics, DNS): no input chain.
    assert!(!rs.chains.iter().any(|c| c.name.starts_with("in-")
        && c.name
            .ends_with(&crate::firewall::clients::key_tag(&cfg.peers[1].public_key))));
}

#[test]
fn a_site_subnet_follows_its_peer_and_longest_prefix_decides_the_owner() {
    let (mut cfg, p) = two_armed();
    // A site behind a peer: its subnet is the peer's; a hub /0 restricted to the LAN with
    // a client's /32 inside it that is not.
    cfg.peers
        .push(with_access(peer(3, &["10.200.0.0/24"]), "lan"));
    cfg.peers.push(with_access(peer(4, &["0.0.0.0/0"]), "lan"));
    let rs = ruleset(&cfg, &p);
    nft::validate(&rs).unwrap();
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.200.0.5", "198.51.100.1", 443, "eth0")
    ));
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.200.0.5", "192.168.88.10", 22, "eth1")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("172.16.9.9", "198.51.100.1", 443, "eth0")
    ));
    // The phone's /32 inside the hub's /0 is the phone's (unrestricted).
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "198.51.100.1", 443, "eth0")
    ));
    // Counted on the right peer.
    let (_, c) = verdict(
        &rs,
        "forward",
        &tcp("10.200.0.5", "198.51.100.1", 443, "eth0"),
    );
    assert_eq!(
        c,
        Some(crate::firewall::clients::counter_name(
            &cfg.peers[1].public_key
        ))
    );
}

#[test]
fn one_armed_lan_is_the_uplinks_own_subnet() {
    let mut cfg = factory();
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "lan");
    let rs = ruleset(&cfg, &ports(&["192.168.1.0/24"]));
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.1.10", 22, "eth0")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.7.10", 22, "eth0")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "198.51.100.10", 22, "eth0")
    ));
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "internet");
    let rs = ruleset(&cfg, &ports(&["192.168.1.0/24"]));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.1.10", 22, "eth0")
    ));
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.0.2", "192.168.7.10", 22, "eth0")
    ));
}

#[test]
fn without_restrictions_nothing_is_added_and_disabled_peers_own_nothing() {
    let (mut cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    assert!(rs.maps.is_empty());
    assert!(rs.chains.iter().all(|c| c.base.is_some()));
    assert_eq!(rs.counters.len(), COUNTERS.len());
    // Written out, the default is no restriction.
    cfg.peers[0].access = Some(crate::access::default_access(false));
    assert_eq!(ruleset(&cfg, &p), rs);
    cfg.peers[0] = with_access(cfg.peers[0].clone(), "none");
    cfg.peers[0].enabled = false;
    let rs = ruleset(&cfg, &p);
    assert!(rs.maps.is_empty(), "a disabled peer gets nothing");
}

#[test]
fn the_mss_is_clamped_into_and_out_of_the_tunnel() {
    let (cfg, p) = two_armed();
    let rs = ruleset(&cfg, &p);
    let syn = tcp("10.100.0.2", "192.168.88.10", 22, "eth1");
    assert!(run(&rs, "forward", &syn).clamped);
    let syn_ack_in = Pkt {
        iif: "eth1",
        oif: "wg0",
        src: ip("192.168.88.10"),
        dst: ip("10.100.0.2"),
        ct: EST,
        tcp_flags: 0x12,
        ..syn.clone()
    };
    let o = run(&rs, "forward", &syn_ack_in);
    assert!(o.clamped && o.action == Action::Accept, "{o:?}");
    let data = Pkt {
        tcp_flags: 0x10,
        ct: EST,
        ..syn.clone()
    };
    assert!(!run(&rs, "forward", &data).clamped);
    let rst = Pkt {
        tcp_flags: 0x06,
        ..syn.clone()
    };
    assert!(!run(&rs, "forward", &rst).clamped);
    // LAN to uplink: not the tunnel's business.
    let lan_out = Pkt {
        iif: "eth1",
        oif: "eth0",
        src: ip("192.168.88.10"),
        ..syn
    };
    assert!(!run(&rs, "forward", &lan_out).clamped);
}

#[test]
fn five_hundred_restricted_clients_are_one_lookup_and_encode() {
    let (mut cfg, p) = two_armed();
    cfg.interface.addresses = vec![c("10.100.0.1/22"), c("fd00:100::1/64")];
    cfg.peers.clear();
    for i in 0..500u32 {
        let a = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 100, 0, 2)) + i);
        let mut k = [0u8; 32];
        k[..4].copy_from_slice(&i.to_be_bytes());
        k[31] = 1;
        let mut pc = PeerConfig::new(Key(k));
        pc.allowed_ips = vec![
            c(&format!("{a}/32")),
            c(&format!("fd00:100::{:x}/128", i + 2)),
        ];
        pc.access = Some(parse_list("lan, 192.168.88.10/32 tcp 8096").unwrap());
        cfg.peers.push(pc);
    }
    let rs = ruleset(&cfg, &p);
    nft::validate(&rs).unwrap();
    // The tunnel's forward rules do not grow with the clients: one lookup per family.
    let fwd = chain(&rs, "forward");
    assert!(fwd.rules.len() < 12, "{}", fwd.rules.len());
    let m4 = rs
        .maps
        .iter()
        .find(|m| m.name == crate::firewall::clients::MAP_FORWARD_V4)
        .unwrap();
    assert_eq!(m4.elements.len(), 500);
    assert!(accepted(
        &rs,
        "forward",
        &tcp("10.100.1.200", "192.168.88.10", 8096, "eth1")
    ));
    assert!(!accepted(
        &rs,
        "forward",
        &tcp("10.100.1.200", "198.51.100.1", 443, "eth0")
    ));
    let b = nft::replace_batch(&rs, &std::collections::HashMap::new(), 1);
    assert!(b.bytes().len() < 4 << 20);
}
