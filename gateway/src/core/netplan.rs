//! What the appliance daemon changes on the network, computed as plain data: the tunnel's
//! addresses and routes and the LAN side's proxy neighbour entries, each as a diff (what to
//! add, what to delete) between what a configuration wants and what the kernel has.
//!
//! `driver/netconf.rs` dumps the kernel's state over rtnetlink, asks this module for the
//! diff and executes it. Nothing here does I/O; the kernel's answers come in as values.
//!
//! Ownership rules, so a reload never removes what someone else put there:
//! - addresses: only those the previous configuration listed are deleted (never a flush);
//! - routes: only those on the tunnel interface, in the main table, with our protocol
//!   number (the driver tags every route it adds);
//! - proxy neighbour entries: only those tagged with our protocol (or that we remember
//!   adding).

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::core::config::{Config, PeerConfig};
use crate::core::net::Cidr;

/// The kernel's main routing table (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = 254;

/// Additions and deletions that take the current state to the wanted one. Deletions are
/// executed first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff<T> {
    pub add: Vec<T>,
    pub delete: Vec<T>,
}

impl<T> Default for Diff<T> {
    fn default() -> Self {
        Diff {
            add: Vec::new(),
            delete: Vec::new(),
        }
    }
}

impl<T> Diff<T> {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.delete.is_empty()
    }
}

/// Address changes on one link. Deleted: what `old` (the configuration applied before)
/// listed, the new one does not, and the link still has. Added: what `new` lists and the
/// link lacks. Addresses in both are not touched (no lifetime reset, no route flush);
/// addresses `old` never listed (added by hand, the kernel's link-local) are never deleted.
pub fn address_diff(old: &[Cidr], new: &[Cidr], present: &[Cidr]) -> Diff<Cidr> {
    let mut d = Diff::default();
    for a in old {
        if !new.contains(a) && present.contains(a) && !d.delete.contains(a) {
            d.delete.push(*a);
        }
    }
    for a in new {
        if !present.contains(a) && !d.add.contains(a) {
            d.add.push(*a);
        }
    }
    d
}

/// The tunnel routes a configuration asks for, as wg-quick adds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelRoutes {
    /// Every peer's allowed IPs, masked, sorted, without duplicates, except those below.
    pub routes: Vec<Cidr>,
    /// Default routes (`/0`) not installed: the appliance's own default route stays on
    /// its uplink (use narrower prefixes or policy routing to send everything through).
    pub skipped_default: Vec<Cidr>,
}

/// The routes through the tunnel for `cfg`: each peer's allowed IPs that the tunnel's own
/// addresses do not already cover (their connected route carries those).
pub fn tunnel_routes(cfg: &Config) -> TunnelRoutes {
    let mut t = TunnelRoutes::default();
    for p in &cfg.peers {
        for c in &p.allowed_ips {
            let c = c.network();
            if c.prefix == 0 {
                if !t.skipped_default.contains(&c) {
                    t.skipped_default.push(c);
                }
                continue;
            }
            let covered = cfg
                .interface
                .addresses
                .iter()
                .any(|a| a.prefix <= c.prefix && a.contains(c.addr));
            if !covered {
                t.routes.push(c);
            }
        }
    }
    t.routes.sort_by_key(Cidr::sort_key);
    t.routes.dedup();
    t
}

/// A route as the kernel lists it (the fields the planner looks at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub dst: Cidr,
    /// Output interface (`RTA_OIF`); `None` for multipath or blackhole routes.
    pub oif: Option<u32>,
    pub table: u32,
    pub protocol: u8,
    /// The metric (`RTA_PRIORITY`), 0 when absent.
    pub priority: u32,
    /// `RTN_UNICAST` (not local, broadcast, blackhole, ...).
    pub unicast: bool,
}

/// The tunnel routes we own among `routes`: on `tunnel` (ifindex), main table, unicast,
/// tagged with `protocol`. Routes anyone else put on the tunnel are not ours to delete.
pub fn owned_routes(routes: &[KernelRoute], tunnel: u32, protocol: u8) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = routes
        .iter()
        .filter(|r| {
            r.oif == Some(tunnel) && r.table == MAIN_TABLE && r.unicast && r.protocol == protocol
        })
        .map(|r| r.dst.network())
        .collect();
    v.sort_by_key(Cidr::sort_key);
    v.dedup();
    v
}

/// Route changes: delete our routes the configuration no longer asks for (a removed peer
/// or allowed IP), add the wanted ones we do not have yet.
pub fn route_diff(want: &[Cidr], owned: &[Cidr]) -> Diff<Cidr> {
    Diff {
        add: want
            .iter()
            .filter(|c| !owned.contains(c))
            .copied()
            .collect(),
        delete: owned
            .iter()
            .filter(|c| !want.contains(c))
            .copied()
            .collect(),
    }
}

/// One proxy neighbour entry: answer ARP (IPv4) or NDP (IPv6) for `addr` on the port
/// with index `ifindex`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProxyEntry {
    pub ifindex: u32,
    pub addr: IpAddr,
}

/// A LAN-facing port (the uplink, the LAN port) and its current addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub ifindex: u32,
    pub addresses: Vec<Cidr>,
}

/// The proxy entries for `peers` on `ports`: every peer host address (a `/32` or `/128`
/// allowed IP) inside the subnet of one of a port's addresses gets an entry on that port,
/// so LAN hosts reach peers numbered from the LAN subnet with no route of their own.
/// Not proxied: wider allowed IPs (a subnet is routed, not proxied), link-local and
/// multicast addresses, a port's own address, and the IPv4 network and broadcast
/// addresses of the subnet.
pub fn proxy_set(peers: &[PeerConfig], ports: &[Port]) -> BTreeSet<ProxyEntry> {
    let mut out = BTreeSet::new();
    for p in peers {
        for c in &p.allowed_ips {
            if c.prefix != c.max_prefix() || !proxiable(c.addr) {
                continue;
            }
            for port in ports {
                if port
                    .addresses
                    .iter()
                    .any(|a| subnet_holds(a, c.addr) && a.addr != c.addr)
                    && !port.addresses.iter().any(|a| a.addr == c.addr)
                {
                    out.insert(ProxyEntry {
                        ifindex: port.ifindex,
                        addr: c.addr,
                    });
                }
            }
        }
    }
    out
}

fn proxiable(ip: IpAddr) -> bool {
    let special = match ip {
        IpAddr::V4(a) => a.is_broadcast(),
        IpAddr::V6(_) => false,
    };
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || special
        || crate::core::net::is_link_local(ip))
}

/// Whether the subnet of port address `a` holds the host `ip` as a usable address: a
/// real subnet (not a host prefix), and for IPv4 up to /30 neither its network nor its
/// broadcast address.
fn subnet_holds(a: &Cidr, ip: IpAddr) -> bool {
    if a.prefix >= a.max_prefix() || !a.contains(ip) || !proxiable(a.addr) {
        return false;
    }
    if let (IpAddr::V4(net), IpAddr::V4(host)) = (a.network().addr, ip) {
        if a.prefix <= 30 {
            let host_bits = u32::MAX >> a.prefix;
            let h = u32::from(host);
            return h != u32::from(net) && h != (u32::from(net) | host_bits);
        }
    }
    true
}

/// Proxy entry changes. `present`: every proxy entry the kernel has (on any interface);
/// `ours`: those among them that we added (tagged with our protocol, or remembered).
/// Entries someone else added are neither deleted nor added again.
pub fn proxy_diff(
    want: &BTreeSet<ProxyEntry>,
    present: &BTreeSet<ProxyEntry>,
    ours: &BTreeSet<ProxyEntry>,
) -> Diff<ProxyEntry> {
    Diff {
        add: want.difference(present).copied().collect(),
        delete: ours
            .intersection(present)
            .filter(|e| !want.contains(e))
            .copied()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::Key;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn cs(s: &[&str]) -> Vec<Cidr> {
        s.iter().map(|x| c(x)).collect()
    }

    fn peer(n: u8, ips: &[&str]) -> PeerConfig {
        PeerConfig {
            public_key: Key([n; 32]),
            preshared_key: None,
            allowed_ips: cs(ips),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
        }
    }

    fn cfg(addrs: &[&str], peers: Vec<PeerConfig>) -> Config {
        let mut c = Config::default();
        c.interface.addresses = cs(addrs);
        c.peers = peers;
        c
    }

    const TUN: u32 = 7;
    const OURS: u8 = 91;

    fn kroute(dst: &str, oif: u32, proto: u8) -> KernelRoute {
        KernelRoute {
            dst: c(dst),
            oif: Some(oif),
            table: MAIN_TABLE,
            protocol: proto,
            priority: 0,
            unicast: true,
        }
    }

    /// What the kernel would have after executing `d` on `owned`.
    fn apply(owned: &[Cidr], d: &Diff<Cidr>) -> Vec<Cidr> {
        let mut v: Vec<Cidr> = owned
            .iter()
            .filter(|x| !d.delete.contains(x))
            .copied()
            .collect();
        v.extend(d.add.iter().copied());
        v.sort_by_key(Cidr::sort_key);
        v
    }

    #[test]
    fn removed_peer_loses_its_routes() {
        let old = cfg(
            &["10.0.0.1/24"],
            vec![
                peer(1, &["10.0.0.2/32", "10.1.0.0/16"]),
                peer(2, &["10.0.0.3/32", "10.2.0.0/16", "fd02::/64"]),
            ],
        );
        let want_old = tunnel_routes(&old).routes;
        // 10.0.0.x are covered by the tunnel's own /24: no route.
        assert_eq!(want_old, cs(&["10.1.0.0/16", "10.2.0.0/16", "fd02::/64"]));
        let kernel: Vec<KernelRoute> = want_old
            .iter()
            .map(|r| kroute(&r.to_string(), TUN, OURS))
            .collect();
        let new = cfg(
            &["10.0.0.1/24"],
            vec![peer(1, &["10.0.0.2/32", "10.1.0.0/16"])],
        );
        let want = tunnel_routes(&new).routes;
        let d = route_diff(&want, &owned_routes(&kernel, TUN, OURS));
        assert_eq!(d.delete, cs(&["10.2.0.0/16", "fd02::/64"]));
        assert!(d.add.is_empty());
        assert_eq!(apply(&owned_routes(&kernel, TUN, OURS), &d), want);
    }

    #[test]
    fn changed_allowed_ips_add_and_delete() {
        let kernel = vec![
            kroute("10.1.0.0/16", TUN, OURS),
            kroute("10.3.0.0/16", TUN, OURS),
        ];
        let new = cfg(
            &["10.0.0.1/24"],
            vec![peer(1, &["10.1.0.0/16", "10.4.0.0/16"])],
        );
        let d = route_diff(
            &tunnel_routes(&new).routes,
            &owned_routes(&kernel, TUN, OURS),
        );
        assert_eq!(d.add, cs(&["10.4.0.0/16"]));
        assert_eq!(d.delete, cs(&["10.3.0.0/16"]));
    }

    #[test]
    fn only_our_routes_are_deleted() {
        let mut other_table = kroute("10.5.0.0/16", TUN, OURS);
        other_table.table = 100;
        let kernel = vec![
            kroute("10.5.0.0/16", TUN, 3),  // `ip route add` by hand (proto boot)
            kroute("10.6.0.0/16", TUN, 2),  // kernel: the connected route
            kroute("10.7.0.0/16", 2, OURS), // another interface
            other_table,
            kroute("10.8.0.0/16", TUN, OURS), // ours, no longer wanted
        ];
        let d = route_diff(&[], &owned_routes(&kernel, TUN, OURS));
        assert_eq!(d.delete, cs(&["10.8.0.0/16"]));
    }

    #[test]
    fn routes_skip_default_and_covered_and_dedup() {
        let t = tunnel_routes(&cfg(
            &["10.0.0.1/24", "fd00::1/64"],
            vec![
                peer(1, &["0.0.0.0/0", "::/0", "10.0.0.0/16", "10.9.1.7/24"]),
                peer(2, &["10.9.1.0/24", "fd00::5/128", "fd01::5/128"]),
            ],
        ));
        assert_eq!(t.skipped_default, cs(&["0.0.0.0/0", "::/0"]));
        // 10.0.0.0/16 is wider than the tunnel's /24: routed; host bits masked; fd00::5 covered.
        assert_eq!(t.routes, cs(&["10.0.0.0/16", "10.9.1.0/24", "fd01::5/128"]));
    }

    #[test]
    fn address_diff_touches_only_changes() {
        let old = cs(&["10.0.0.1/24", "10.0.1.1/24", "fd00::1/64"]);
        let new = cs(&["10.0.0.1/24", "fd00::1/64", "10.0.2.1/24"]);
        let present = cs(&[
            "10.0.0.1/24",
            "10.0.1.1/24",
            "fd00::1/64",
            "fe80::1/64",
            "10.7.0.1/24",
        ]);
        let d = address_diff(&old, &new, &present);
        assert_eq!(d.delete, cs(&["10.0.1.1/24"]));
        assert_eq!(d.add, cs(&["10.0.2.1/24"]));
        // A changed prefix is a delete and an add; unlisted (hand-added, link-local) stay.
        let d = address_diff(&cs(&["10.0.0.1/24"]), &cs(&["10.0.0.1/16"]), &present);
        assert_eq!(d.delete, cs(&["10.0.0.1/24"]));
        assert_eq!(d.add, cs(&["10.0.0.1/16"]));
        // First start: nothing old; what is already there is not added again.
        let d = address_diff(&[], &new, &present);
        assert!(d.delete.is_empty());
        assert_eq!(d.add, cs(&["10.0.2.1/24"]));
        assert!(address_diff(&new, &new, &new).is_empty());
    }

    fn port(ifindex: u32, addrs: &[&str]) -> Port {
        Port {
            ifindex,
            addresses: cs(addrs),
        }
    }

    fn entries(v: &[(u32, &str)]) -> BTreeSet<ProxyEntry> {
        v.iter()
            .map(|(i, a)| ProxyEntry {
                ifindex: *i,
                addr: a.parse().unwrap(),
            })
            .collect()
    }

    #[test]
    fn proxy_set_inside_subnet_hosts_only() {
        let peers = vec![
            peer(1, &["192.168.77.202/32", "fd77::202/128", "10.66.1.0/24"]),
            peer(2, &["192.168.77.203/32", "192.168.78.5/32", "fd78::5/128"]),
            // Subnets are routed, not proxied; network, broadcast, the port's own address,
            // link-local and multicast are never proxied.
            peer(
                3,
                &[
                    "192.168.77.0/28",
                    "192.168.77.0/32",
                    "192.168.77.255/32",
                    "192.168.77.2/32",
                ],
            ),
            peer(4, &["fe80::5/128", "224.0.0.5/32"]),
        ];
        let uplink = port(2, &["192.168.77.2/24", "fd77::2/64", "fe80::2/64"]);
        let lan = port(3, &["192.168.88.1/24"]);
        let got = proxy_set(&peers, &[uplink.clone(), lan]);
        assert_eq!(
            got,
            entries(&[
                (2, "192.168.77.202"),
                (2, "192.168.77.203"),
                (2, "fd77::202")
            ])
        );
        // The uplink has no address yet (DHCP pending): nothing to proxy.
        assert!(proxy_set(&peers, &[port(2, &[])]).is_empty());
        // A host-prefix port address has no subnet to share.
        assert!(proxy_set(&peers, &[port(2, &["192.168.77.2/32"])]).is_empty());
        // The address changes (a new DHCP lease in another subnet): the set follows.
        let moved = proxy_set(&peers, &[port(2, &["192.168.78.9/24"])]);
        assert_eq!(moved, entries(&[(2, "192.168.78.5")]));
        // IPv6 only on the port: only v6 hosts.
        let v6 = proxy_set(&peers, &[port(2, &["fd78::1/64"])]);
        assert_eq!(v6, entries(&[(2, "fd78::5")]));
    }

    #[test]
    fn proxy_diff_keeps_foreign_entries() {
        let want = entries(&[(2, "192.168.77.202"), (2, "fd77::202")]);
        let present = entries(&[
            (2, "192.168.77.202"),
            (2, "192.168.77.203"),
            (2, "192.168.77.50"),
            (9, "192.168.77.202"),
        ]);
        let ours = entries(&[
            (2, "192.168.77.202"),
            (2, "192.168.77.203"),
            (9, "192.168.77.202"),
            (2, "192.168.77.99"),
        ]);
        let d = proxy_diff(&want, &present, &ours);
        assert_eq!(
            d.add,
            vec![ProxyEntry {
                ifindex: 2,
                addr: "fd77::202".parse().unwrap()
            }]
        );
        // Ours and unwanted (a removed peer, an old port); .50 is someone else's; .99 is
        // remembered but already gone.
        assert_eq!(
            d.delete,
            entries(&[(2, "192.168.77.203"), (9, "192.168.77.202")])
                .into_iter()
                .collect::<Vec<_>>()
        );
    }
}
