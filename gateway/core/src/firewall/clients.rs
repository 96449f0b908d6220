//! Per-client access (`[Peer] Access`, `ClientIsolation`) as firewall rules: what a
//! tunnel peer may *start* through the appliance (`core::access` has the grammar and the
//! owner partition).
//!
//! Cost: one verdict-map lookup per family, keyed by the packet's source address, for
//! the first packet of each flow from the tunnel (replies and established flows are
//! accepted before it), then the rules of that one peer's chain: a packet never walks
//! other peers' rules, however many there are. Peers with every zone (the default
//! without isolation) have no element in the maps and no chain: with none restricted
//! the maps are not there at all and the tunnel's forward rule is today's one accept.
//!
//! Zones, as the rules see a forwarded packet from the tunnel: `clients` leaves by the
//! tunnel; `lan` leaves by the LAN port (two-armed) or is addressed to one of the
//! uplink's own subnets (one-armed); `internet` is the rest, what leaves by the uplink
//! beyond `lan`. One-armed that includes the other private networks behind the site's
//! router (they are beyond the uplink's own subnets: reach them with a prefix item).
//! Two-armed, the uplink's own subnet (the ISP side) is `internet`. Traffic the LAN
//! starts towards a client is not the client's to allow: it follows the LAN's zone rule,
//! and the client's replies pass as replies.
//!
//! The input chain: ping (ICMP, ICMPv6) always; the resolver on the box (port 53) with
//! `lan` or `internet`; the rest of the appliance (SSH, metrics) with `appliance`.

use std::net::IpAddr;

use super::ports::Ports;
use super::rules::*;
use crate::access::{self, AccessItem, Proto};
use crate::config::Config;
use crate::key::Key;
use crate::net::Cidr;

/// The verdict maps: forward and input, IPv4 and IPv6.
pub const MAP_FORWARD_V4: &str = "client-fwd4";
pub const MAP_FORWARD_V6: &str = "client-fwd6";
pub const MAP_INPUT_V4: &str = "client-in4";
pub const MAP_INPUT_V6: &str = "client-in6";

/// The resolver on the box.
pub const DNS_PORT: u16 = 53;

/// A peer's tag in the table's names: the first 8 bytes of its public key in hex (stable
/// across reorderings and renames, so its counter carries over a reload).
fn tag(k: &Key) -> String {
    k.to_hex()[..16].to_string()
}

/// The drop counter of a restricted peer (`access-` and its key's tag).
pub fn counter_name(k: &Key) -> String {
    format!("access-{}", tag(k))
}

/// Whether `name` is a per-peer access counter, and the key tag in it.
pub fn counter_tag(name: &str) -> Option<&str> {
    name.strip_prefix("access-")
}

/// The tag [`counter_name`] gives `k`, to match a counter read back to its peer.
pub fn key_tag(k: &Key) -> String {
    tag(k)
}

/// What the per-client access adds to the ruleset.
#[derive(Debug, Default)]
pub struct ClientRules {
    pub maps: Vec<VerdictMap>,
    pub chains: Vec<Chain>,
    pub counters: Vec<String>,
    /// Before the forward chain's accept of the tunnel.
    pub forward: Vec<Rule>,
    /// Before the input chain's accept of the tunnel.
    pub input: Vec<Rule>,
}

/// Accept or a counted drop, as `granted` says.
fn zone(matches: Vec<Match>, granted: bool, counter: &str, comment: &'static str) -> Rule {
    if granted {
        Rule::new(matches, Action::Accept, comment)
    } else {
        Rule::counted(matches, counter, Action::Drop, comment)
    }
}

fn family_of(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

/// The matches of a prefix item.
fn prefix_matches(net: Cidr, proto: Option<Proto>, port: Option<u16>) -> Vec<Match> {
    let mut m = vec![Match::Daddr { net, eq: true }];
    match proto {
        None => {}
        Some(Proto::Tcp) => m.push(Match::L4(L4::Tcp)),
        Some(Proto::Udp) => m.push(Match::L4(L4::Udp)),
        Some(Proto::Icmp) => m.push(Match::L4(match family_of(net.addr) {
            Family::V4 => L4::Icmp,
            Family::V6 => L4::Icmpv6,
        })),
    }
    if let Some(p) = port {
        m.push(Match::Dport(p));
    }
    m
}

/// The forward chain of a peer with access `a`.
fn forward_chain(name: String, a: &[AccessItem], p: &Ports, counter: &str) -> Chain {
    let mut rules = Vec::new();
    for item in a {
        if let AccessItem::Prefix { net, proto, port } = *item {
            rules.push(Rule::new(
                prefix_matches(net, proto, port),
                Action::Accept,
                "a destination this client may reach (Access)",
            ));
        }
    }
    let has = |z: AccessItem| a.contains(&z);
    rules.push(zone(
        vec![Match::Oif {
            name: p.tunnel.clone(),
            eq: true,
        }],
        has(AccessItem::Clients),
        counter,
        "to other clients (Access clients)",
    ));
    match &p.lan {
        Some(l) => rules.push(zone(
            vec![Match::Oif {
                name: l.clone(),
                eq: true,
            }],
            has(AccessItem::Lan),
            counter,
            "to the LAN port (Access lan)",
        )),
        None => {
            for n in &p.uplink_nets {
                rules.push(zone(
                    vec![Match::Daddr { net: *n, eq: true }],
                    has(AccessItem::Lan),
                    counter,
                    "one-armed: to the uplink's own subnet (Access lan)",
                ));
            }
        }
    }
    rules.push(zone(
        Vec::new(),
        has(AccessItem::Internet),
        counter,
        "beyond the LAN, out of the uplink (Access internet)",
    ));
    Chain {
        name,
        base: None,
        rules,
    }
}

/// Whether a peer with access `a` needs rules in the input chain.
fn input_restricted(a: &[AccessItem]) -> bool {
    !(a.contains(&AccessItem::Appliance) && a.iter().any(|i| i.grants_dns()))
}

/// The input chain of a peer with access `a`.
fn input_chain(name: String, a: &[AccessItem], counter: &str) -> Chain {
    let established = Match::Ct(CtStates::ESTABLISHED.or(CtStates::RELATED));
    let mut rules = vec![
        Rule::new(vec![established], Action::Accept, "replies"),
        Rule::new(
            vec![Match::L4(L4::Icmp)],
            Action::Accept,
            "ping and ICMP errors: always",
        ),
        Rule::new(
            vec![Match::L4(L4::Icmpv6)],
            Action::Accept,
            "ping and ICMPv6 errors: always",
        ),
    ];
    let dns = a.iter().any(|i| i.grants_dns());
    for l4 in [L4::Udp, L4::Tcp] {
        rules.push(zone(
            vec![Match::L4(l4), Match::Dport(DNS_PORT)],
            dns,
            counter,
            "the resolver on the box (Access lan or internet)",
        ));
    }
    rules.push(zone(
        Vec::new(),
        a.contains(&AccessItem::Appliance),
        counter,
        "the appliance's services: SSH, metrics (Access appliance)",
    ));
    Chain {
        name,
        base: None,
        rules,
    }
}

/// Elements of ranges owned by peers with a chain, per family, sorted; adjacent ranges
/// of one chain merged.
fn elements(owned: &[(IpAddr, IpAddr, String)], fam: Family) -> Vec<MapElement> {
    let mut v: Vec<&(IpAddr, IpAddr, String)> = owned
        .iter()
        .filter(|(a, _, _)| family_of(*a) == fam)
        .collect();
    v.sort_by_key(|(a, _, _)| *a);
    let mut out: Vec<MapElement> = Vec::new();
    for (first, last, chain) in v {
        if let Some(prev) = out.last_mut() {
            if &prev.chain == chain && next_addr(prev.last) == Some(*first) {
                prev.last = *last;
                continue;
            }
        }
        out.push(MapElement {
            first: *first,
            last: *last,
            chain: chain.clone(),
        });
    }
    out
}

/// The address after `a` (`None` after the family's last).
pub fn next_addr(a: IpAddr) -> Option<IpAddr> {
    match a {
        IpAddr::V4(x) => u32::from(x).checked_add(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(x) => u128::from(x).checked_add(1).map(|n| IpAddr::V6(n.into())),
    }
}

/// Which enabled peer owns which source: every enabled peer's allowed IPs (`/0`
/// included) as [`access::owners`] partitions them by longest prefix, with the peer's
/// index. The per-client maps and `Masquerade = off` key on this one partition.
pub fn owners(cfg: &Config) -> Vec<(usize, Cidr)> {
    owners_with(cfg, true)
}

/// [`owners`], with (`default_route`) or without the peers' `/0` prefixes: without, an
/// address only a `/0` covers belongs to nobody (`Masquerade = off` never exempts the
/// whole internet).
pub fn owners_with(cfg: &Config, default_route: bool) -> Vec<(usize, Cidr)> {
    let prefixes: Vec<(usize, Cidr)> = cfg
        .peers
        .iter()
        .enumerate()
        .filter(|(_, p)| p.enabled)
        .flat_map(|(i, p)| p.allowed_ips.iter().map(move |c| (i, c.network())))
        .filter(|(_, c)| default_route || c.prefix > 0)
        .collect();
    access::owners(&prefixes)
}

/// The per-client access of `cfg` over `p`.
pub fn client_rules(cfg: &Config, p: &Ports) -> ClientRules {
    let mut out = ClientRules::default();
    let owners = owners(cfg);
    let mut fwd_owned = Vec::new();
    let mut in_owned = Vec::new();
    for (i, peer) in cfg.peers.iter().enumerate() {
        if !peer.enabled {
            continue;
        }
        let a = peer.access_under(&cfg.gateway);
        let fwd = !access::unrestricted(&a);
        let inp = input_restricted(&a);
        if !fwd && !inp {
            continue;
        }
        let counter = counter_name(&peer.public_key);
        let t = tag(&peer.public_key);
        let ranges: Vec<(IpAddr, IpAddr)> = owners
            .iter()
            .filter(|(o, _)| *o == i)
            .map(|(_, c)| access::range(c))
            .collect();
        if fwd {
            let name = format!("fwd-{t}");
            out.chains
                .push(forward_chain(name.clone(), &a, p, &counter));
            fwd_owned.extend(ranges.iter().map(|&(f, l)| (f, l, name.clone())));
        }
        if inp {
            let name = format!("in-{t}");
            out.chains.push(input_chain(name.clone(), &a, &counter));
            in_owned.extend(ranges.iter().map(|&(f, l)| (f, l, name.clone())));
        }
        out.counters.push(counter);
    }
    for (owned, names, rules, what) in [
        (
            &fwd_owned,
            [MAP_FORWARD_V4, MAP_FORWARD_V6],
            &mut out.forward,
            "a client's Access: its own rules (by source address, as the device checks it)",
        ),
        (
            &in_owned,
            [MAP_INPUT_V4, MAP_INPUT_V6],
            &mut out.input,
            "a client's Access to the appliance (by source address)",
        ),
    ] {
        for (fam, name) in [Family::V4, Family::V6].into_iter().zip(names) {
            let el = elements(owned, fam);
            if el.is_empty() {
                continue;
            }
            out.maps.push(VerdictMap {
                name: name.to_string(),
                family: fam,
                elements: el,
            });
            rules.push(Rule::new(
                vec![
                    Match::Iif {
                        name: p.tunnel.clone(),
                        eq: true,
                    },
                    Match::Family(fam),
                ],
                Action::SourceMap(name.to_string()),
                what,
            ));
        }
    }
    out
}
