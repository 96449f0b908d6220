//! Whether an uplink prefix (a DHCP lease's subnet, a router advertisement's prefix) may
//! share addresses with the tunnel's routes: the pure verdict `riceguard dhcp` asks
//! before it requests or keeps a lease ([`judge`]) and the daemon's watch asks of each RA
//! prefix ([`verdict`]); one rule for both.
//!
//! The tunnel's routes are every enabled peer's AllowedIPs (a `/0` is never one: it is
//! not installed as a route) and the subnets of the tunnel's own addresses. Against an
//! uplink prefix `L` and a tunnel route `R` of the same family:
//! - `L == R`: the two routes cannot both be installed (`EEXIST`) and the lease's would
//!   win: a conflict — your remote site and your uplink cannot be the same network;
//! - `L` inside `R` where `R` is /16 (IPv6: /48) or longer: a site-sized route the uplink
//!   would cut a piece out of: a conflict;
//! - `L` inside a wider `R` (a hub's `10.0.0.0/8` over a 10.1.2.0/24 uplink): normal; kept
//!   and said (`uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8`);
//! - `R` inside `L` (a /24 lease over a peer's /28): the uplink's subnet covers the
//!   tunnel's addresses, so its hosts there are unreachable and the router or a rogue
//!   server may sit on them: a conflict. Except the proxy-ARP layout (`ProxyArp = on`, the
//!   default): peer host routes (/32, /128) inside the uplink's subnet, and the tunnel numbered
//!   from the uplink's own prefix, are how peers are published on a one-armed LAN; their
//!   more specific routes keep winning, so nothing is diverted.
//!
//! `UplinkOverlap = refuse` makes every overlap a conflict, the proxy-ARP layout too.
//!
//! A lease whose own address is one of the tunnel's (the appliance's `Address`, a peer's
//! /32 or /128) is declined under either policy: the layout cannot tell a tunnel numbered
//! from the LAN from a rogue server leasing the tunnel's subnet, but that address would
//! become local on the uplink. The firewall does the rest: on the uplink, every peer's
//! allowed IPs stay spoofs, whatever the lease (`firewall::spoof_prefixes`).
//!
//! Two-armed (`Lan =`), the subnets of the LAN port's `LanAddress` count as routes too,
//! and any overlap with one (equal, inside, containing), under either policy, is a
//! conflict: the uplink's subnet would take the LAN's hosts (NAT, replies) off the LAN
//! port, e.g. a 192.168.5.57/16 lease over `LanAddress = 192.168.88.1/24`.
#![forbid(unsafe_code)]

use crate::config::{Config, OverlapPolicy};
use crate::net::Cidr;

/// The shortest IPv4 tunnel route an uplink prefix may not lie inside: a remote site's
/// network and the uplink cannot be one network (`OverlapPolicy::Auto`).
pub const SITE_PREFIX_V4: u8 = 16;
/// The same bound for IPv6 (a site's /48).
pub const SITE_PREFIX_V6: u8 = 48;

/// One route of the tunnel, as its network prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelRoute {
    /// Whose route it is, for messages: `peer site-b`, `the tunnel`.
    pub owner: String,
    pub prefix: Cidr,
    /// Part of the proxy-ARP layout: may lie inside the uplink's subnet (see above).
    pub proxied: bool,
    /// The LAN port's subnet (two-armed): no overlap with the uplink is ever kept.
    pub lan_port: bool,
    /// An address in it that is never the uplink's: the tunnel's own (`Address`), a
    /// peer's (its /32 or /128).
    pub taken: Option<std::net::IpAddr>,
}

/// The tunnel's routes (both families) in the configuration `cfg` runs (its enabled peers).
pub fn tunnel_routes(cfg: &Config) -> Vec<TunnelRoute> {
    let proxy = cfg.gateway.proxy_arp;
    let mut out = Vec::new();
    for p in cfg.peers.iter().filter(|p| p.enabled) {
        let owner = match &p.name {
            Some(n) if !n.is_empty() => format!("peer {n}"),
            _ => {
                let k = p.public_key.to_base64();
                format!("peer {}…", k.get(..8).unwrap_or(&k))
            }
        };
        for c in p.allowed_ips.iter().filter(|c| c.prefix > 0) {
            let host = c.prefix == c.max_prefix();
            out.push(TunnelRoute {
                owner: owner.clone(),
                prefix: c.network(),
                proxied: proxy && host,
                lan_port: false,
                taken: host.then_some(c.addr),
            });
        }
    }
    for a in cfg.interface.addresses.iter().filter(|c| c.prefix > 0) {
        out.push(TunnelRoute {
            owner: "the tunnel".into(),
            prefix: a.network(),
            proxied: proxy,
            lan_port: false,
            taken: Some(a.addr),
        });
    }
    // One-armed (no `Lan`), the uplink is the LAN: no port of its own to protect.
    let lan = &cfg.gateway.lan;
    if !lan.is_empty() {
        for a in cfg.gateway.lan_addresses.iter().filter(|c| c.prefix > 0) {
            out.push(TunnelRoute {
                owner: format!("the LAN port {lan}"),
                prefix: a.network(),
                proxied: false,
                lan_port: true,
                taken: Some(a.addr),
            });
        }
    }
    out
}

/// How uplink prefix `l` (masked) stands to tunnel route `r`: `None` when they do not
/// overlap (or are of different families), `Some(Ok(()))` for an overlap that is kept,
/// `Some(Err(why))` for a conflict.
fn relation(l: Cidr, r: &TunnelRoute, policy: OverlapPolicy) -> Option<Result<(), String>> {
    let (rp, owner) = (r.prefix, &r.owner);
    if l.addr.is_ipv4() != rp.addr.is_ipv4() || rp.prefix == 0 {
        return None;
    }
    let l_in_r = rp.prefix <= l.prefix && rp.contains(l.addr);
    let r_in_l = l.prefix <= rp.prefix && l.contains(rp.addr);
    if !l_in_r && !r_in_l {
        return None;
    }
    let same_site = "(your remote site and your uplink cannot be the same network)";
    let site = if rp.addr.is_ipv4() {
        SITE_PREFIX_V4
    } else {
        SITE_PREFIX_V6
    };
    Some(if r.lan_port {
        Err(format!(
            "it overlaps {owner}'s {rp} (LanAddress: the uplink and the LAN port cannot share a network)"
        ))
    } else if policy == OverlapPolicy::Refuse {
        Err(format!(
            "it overlaps {owner}'s {rp} (UplinkOverlap = refuse)"
        ))
    } else if r_in_l && r.proxied {
        Ok(())
    } else if l == rp {
        Err(format!("it is {owner}'s {rp} {same_site}"))
    } else if r_in_l {
        Err(format!(
            "it contains {owner}'s {rp} (the uplink's subnet would cover that tunnel route)"
        ))
    } else if rp.prefix >= site {
        Err(format!("it lies inside {owner}'s {rp} {same_site}"))
    } else {
        Ok(())
    })
}

/// What the watch does with an uplink prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// No tunnel route overlaps it.
    Clear,
    /// It overlaps `route` and is kept (a narrower part of a wide summary route, or the
    /// proxy-ARP layout); `show status` says which part is shadowed.
    Kept { route: &'a TunnelRoute },
    /// It conflicts with `route`, for the reason `why`: not used.
    Conflict { route: &'a TunnelRoute, why: String },
}

/// The verdict on `uplink` (host bits may be set) against `routes`: a conflict with any
/// route wins over a kept overlap with another.
pub fn verdict(uplink: Cidr, routes: &[TunnelRoute], policy: OverlapPolicy) -> Verdict<'_> {
    let l = uplink.network();
    let mut kept = None;
    for r in routes {
        match relation(l, r, policy) {
            None => {}
            Some(Ok(())) => {
                kept.get_or_insert(r);
            }
            Some(Err(why)) => return Verdict::Conflict { route: r, why },
        }
    }
    kept.map_or(Verdict::Clear, |route| Verdict::Kept { route })
}

/// The verdict on uplink `iface` getting `subnet` (host bits may be set): `Ok` with the
/// lines saying which part of which tunnel route it shadows (none when it overlaps
/// nothing), or `Err` with the reason it must be declined.
pub fn judge(
    iface: &str,
    subnet: Cidr,
    routes: &[TunnelRoute],
    policy: OverlapPolicy,
) -> Result<Vec<String>, String> {
    // The proxy-ARP layout keeps a lease from the tunnel's subnet, but never one that
    // makes an address of the tunnel's (a client's, the appliance's own) the uplink's:
    // it would become local here and the client unreachable.
    if let Some(r) = routes.iter().find(|r| r.taken == Some(subnet.addr)) {
        let whose = if r.owner == "the tunnel" {
            "the tunnel's own address".to_string()
        } else {
            format!("{}'s address", r.owner)
        };
        return Err(format!(
            "its address {} is {whose} (a rogue or misconfigured DHCP server)",
            subnet.addr
        ));
    }
    let l = subnet.network();
    let mut shadows = Vec::new();
    for r in routes {
        match relation(l, r, policy) {
            None => {}
            Some(Err(why)) => return Err(why),
            Some(Ok(())) if r.prefix.prefix < l.prefix => shadows.push(format!(
                "uplink {iface} {l} shadows {l} of {}'s {}",
                r.owner, r.prefix
            )),
            // The proxy-ARP layout: the tunnel's more specific routes win.
            Some(Ok(())) => {}
        }
    }
    Ok(shadows)
}

/// [`judge`] for a configuration: its running peers, its policy.
pub fn judge_config(iface: &str, subnet: Cidr, cfg: &Config) -> Result<Vec<String>, String> {
    let routes = tunnel_routes(&cfg.running());
    judge(iface, subnet, &routes, cfg.gateway.uplink_overlap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PeerConfig;
    use crate::key::Key;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn cfg(peers: &[(&str, &[&str])], tunnel: &[&str]) -> Config {
        let mut cfg = Config::default();
        for (i, (name, ips)) in peers.iter().enumerate() {
            let mut p = PeerConfig::new(Key([i as u8 + 1; 32]));
            p.name = Some(name.to_string());
            p.allowed_ips = ips.iter().map(|s| c(s)).collect();
            cfg.peers.push(p);
        }
        cfg.interface.addresses = tunnel.iter().map(|s| c(s)).collect();
        cfg
    }

    fn verdict(cfg: &Config, lease: &str) -> Result<Vec<String>, String> {
        judge_config("eth0", c(lease), cfg)
    }

    #[test]
    fn equal_to_a_peer_route_is_a_conflict() {
        let k = cfg(&[("site-b", &["10.251.1.0/24"])], &["10.100.0.1/24"]);
        assert_eq!(
            verdict(&k, "10.251.1.50/24"),
            Err("it is peer site-b's 10.251.1.0/24 (your remote site and your uplink cannot be the same network)".into())
        );
        // Another subnet beside it is fine, and says nothing.
        assert_eq!(verdict(&k, "10.251.2.50/24"), Ok(vec![]));
        assert_eq!(verdict(&k, "192.168.1.20/24"), Ok(vec![]));
    }

    #[test]
    fn inside_a_site_sized_route_is_a_conflict() {
        for r in ["10.251.0.0/16", "10.251.0.0/20"] {
            let k = cfg(&[("site-b", &[r])], &[]);
            let e = verdict(&k, "10.251.1.50/24").unwrap_err();
            assert!(
                e.starts_with(&format!("it lies inside peer site-b's {r} ")),
                "{e}"
            );
        }
    }

    #[test]
    fn inside_a_wide_summary_route_is_kept_and_said() {
        let k = cfg(&[("hub", &["10.0.0.0/8"])], &["10.100.0.1/24"]);
        assert_eq!(
            verdict(&k, "10.1.2.7/24"),
            Ok(vec![
                "uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8".into()
            ])
        );
        let mut refuse = k.clone();
        refuse.gateway.uplink_overlap = OverlapPolicy::Refuse;
        assert_eq!(
            verdict(&refuse, "10.1.2.7/24"),
            Err("it overlaps peer hub's 10.0.0.0/8 (UplinkOverlap = refuse)".into())
        );
        // Refuse declines only overlaps.
        assert_eq!(verdict(&refuse, "192.168.1.20/24"), Ok(vec![]));
    }

    #[test]
    fn containing_a_tunnel_route_is_a_conflict_unless_proxied() {
        let mut k = cfg(&[("office", &["192.168.1.16/28", "192.168.1.5/32"])], &[]);
        k.gateway.proxy_arp = false;
        assert!(verdict(&k, "192.168.1.50/24")
            .unwrap_err()
            .starts_with("it contains peer office's 192.168.1.16/28"));
        // A /32 too, without proxy ARP (nobody publishes it on the uplink).
        let mut host = cfg(&[("phone", &["192.168.1.5/32"])], &["192.168.1.250/24"]);
        host.gateway.proxy_arp = false;
        assert!(verdict(&host, "192.168.1.50/24").is_err());
        // The proxy-ARP layout: peers numbered from the uplink's subnet, the tunnel
        // numbered from its prefix.
        host.gateway.proxy_arp = true;
        assert_eq!(verdict(&host, "192.168.1.50/24"), Ok(vec![]));
        // But a subnet route inside it still conflicts with proxy ARP on.
        k.gateway.proxy_arp = true;
        assert!(verdict(&k, "192.168.1.50/24").is_err());
        host.gateway.uplink_overlap = OverlapPolicy::Refuse;
        assert!(verdict(&host, "192.168.1.50/24").is_err());
    }

    #[test]
    fn default_routes_disabled_peers_and_ipv6_are_no_conflict() {
        let mut k = cfg(
            &[
                ("full", &["0.0.0.0/0", "::/0"]),
                ("off", &["10.9.9.0/24"]),
                ("v6", &["fd00::/8"]),
            ],
            &["fd00::1/64"],
        );
        k.peers[1].enabled = false;
        assert_eq!(verdict(&k, "10.9.9.5/24"), Ok(vec![]));
        k.gateway.uplink_overlap = OverlapPolicy::Refuse;
        assert_eq!(verdict(&k, "10.9.9.5/24"), Ok(vec![]));
    }

    /// The RA side: IPv6 prefixes by the same rule, /48 as the site bound; a conflict
    /// with one route wins over a kept overlap with another.
    #[test]
    fn ipv6_prefixes_by_the_same_rule() {
        use OverlapPolicy::{Auto, Refuse};
        let k = cfg(
            &[
                ("site-b", &["fd00:251::/64", "10.251.1.0/24"]),
                ("site-c", &["fd10::/48"]),
                ("hub", &["fd00::/16", "10.0.0.0/8"]),
                ("phone", &["2001:db8:1::5/128"]),
            ],
            &[],
        );
        let routes = tunnel_routes(&k);
        let v = |u: &str, p| super::verdict(c(u), &routes, p);
        let owner = |v: Verdict<'_>| match v {
            Verdict::Conflict { route, .. } | Verdict::Kept { route } => route.owner.clone(),
            Verdict::Clear => String::new(),
        };
        assert!(matches!(v("fd00:251::/64", Auto), Verdict::Conflict { .. }));
        assert_eq!(owner(v("fd00:251::/64", Auto)), "peer site-b");
        assert!(matches!(
            v("fd10:0:0:5::/64", Auto),
            Verdict::Conflict { .. }
        ));
        // Inside only the hub's /16: kept; refused under refuse.
        assert_eq!(owner(v("fd00:5::/64", Auto)), "peer hub");
        assert!(matches!(v("fd00:5::/64", Auto), Verdict::Kept { .. }));
        assert!(matches!(v("fd00:5::/64", Refuse), Verdict::Conflict { .. }));
        // Inside a /24 (>= /16) and the /8: the conflict wins.
        assert!(matches!(
            v("10.251.1.128/25", Auto),
            Verdict::Conflict { .. }
        ));
        // A proxied /128 inside the prefix: the proxy-ARP layout, kept.
        assert!(matches!(v("2001:db8:1::/64", Auto), Verdict::Kept { .. }));
        assert!(matches!(
            v("2001:db8:1::/64", Refuse),
            Verdict::Conflict { .. }
        ));
        assert_eq!(v("2001:db8:9::/64", Refuse), Verdict::Clear);
        let full = cfg(&[("full", &["0.0.0.0/0", "::/0"])], &[]);
        assert_eq!(
            super::verdict(c("fd00::/64"), &tunnel_routes(&full), Refuse),
            Verdict::Clear
        );
    }

    #[test]
    fn overlapping_the_lan_ports_subnet_is_a_conflict() {
        let mut k = cfg(&[("phone", &["10.100.0.2/32"])], &["10.100.0.1/24"]);
        k.gateway.lan = "eth1".into();
        k.gateway.lan_addresses = vec![c("192.168.88.1/24"), c("fd88::1/64")];
        let lan = "it overlaps the LAN port eth1's 192.168.88.0/24 (LanAddress: the uplink and the LAN port cannot share a network)";
        // The lease: a /16 over the LAN's /24, under either policy, proxy ARP
        // on or off; also an equal and a narrower one.
        for lease in ["192.168.5.57/16", "192.168.88.20/24", "192.168.88.130/25"] {
            for policy in [OverlapPolicy::Auto, OverlapPolicy::Refuse] {
                for proxy in [true, false] {
                    k.gateway.uplink_overlap = policy;
                    k.gateway.proxy_arp = proxy;
                    assert_eq!(verdict(&k, lease), Err(lan.into()), "{lease}");
                }
            }
        }
        k.gateway.uplink_overlap = OverlapPolicy::Auto;
        k.gateway.proxy_arp = true;
        // A lease beside it is fine.
        assert_eq!(verdict(&k, "192.168.1.20/24"), Ok(vec![]));
        assert_eq!(verdict(&k, "192.168.89.20/24"), Ok(vec![]));
        // RA prefixes by the same rule.
        let routes = tunnel_routes(&k);
        assert!(matches!(
            super::verdict(c("fd88::/48"), &routes, OverlapPolicy::Auto),
            Verdict::Conflict { route, .. } if route.owner == "the LAN port eth1"
        ));
        // One-armed, a stray LanAddress names no port: nothing to protect.
        k.gateway.lan.clear();
        assert_eq!(verdict(&k, "192.168.5.57/16"), Ok(vec![]));
    }

    #[test]
    fn tunnel_address_subnet_counts() {
        let mut k = cfg(&[], &["10.100.0.1/24"]);
        k.gateway.proxy_arp = false;
        assert!(verdict(&k, "10.100.0.7/24")
            .unwrap_err()
            .starts_with("it is the tunnel's 10.100.0.0/24"));
        assert!(verdict(&k, "10.100.0.7/25")
            .unwrap_err()
            .starts_with("it lies inside the tunnel's 10.100.0.0/24"));
        // Unnamed peers are named by their key.
        let mut p = PeerConfig::new(Key([9; 32]));
        p.allowed_ips = vec![c("10.7.0.0/16")];
        k.peers.push(p);
        let e = verdict(&k, "10.7.3.3/24").unwrap_err();
        assert!(e.contains("peer CQkJCQkJ…'s 10.7.0.0/16"), "{e}");
    }

    /// Issue 29, 1: the factory tunnel (`10.100.0.1/24`, two clients) and a DHCP server
    /// leasing from 10.100.0.0/24. The subnet looks like the tunnel-from-LAN layout and is
    /// kept (the firewall keeps the clients' /32s spoofs on the uplink); a lease of a
    /// client's address or the appliance's own is declined.
    #[test]
    fn a_lease_of_a_tunnel_address_is_declined() {
        let k = cfg(
            &[
                ("phone", &["10.100.0.2/32", "fd00:100::2/128"]),
                ("laptop", &["10.100.0.3/32"]),
            ],
            &["10.100.0.1/24", "fd00:100::1/64"],
        );
        assert_eq!(verdict(&k, "10.100.0.58/24"), Ok(vec![]));
        assert_eq!(
            verdict(&k, "10.100.0.2/24"),
            Err("its address 10.100.0.2 is peer phone's address (a rogue or misconfigured DHCP server)".into())
        );
        assert_eq!(
            verdict(&k, "10.100.0.1/24"),
            Err("its address 10.100.0.1 is the tunnel's own address (a rogue or misconfigured DHCP server)".into())
        );
        // Whatever the prefix length, and under either policy.
        let mut refuse = k.clone();
        refuse.gateway.uplink_overlap = OverlapPolicy::Refuse;
        assert!(verdict(&refuse, "10.100.0.3/32")
            .unwrap_err()
            .contains("peer laptop's address"));
        // The tunnel numbered from the LAN (netplan.rs): the real lease is kept.
        let lan = cfg(&[("phone", &["192.168.1.251/32"])], &["192.168.1.250/24"]);
        assert_eq!(verdict(&lan, "192.168.1.57/24"), Ok(vec![]));
    }
}
