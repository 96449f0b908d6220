//! What the appliance daemon changes on the network, computed as plain data: the tunnel's
//! addresses and routes and the LAN side's proxy neighbour entries, each as a diff (what to
//! add, what to delete) between what a configuration wants and what the kernel has.
//!
//! `driver/appliance/netconf.rs` dumps the kernel's state over rtnetlink, asks this module for the
//! diff and executes it. Nothing here does I/O; the kernel's answers come in as values.
//!
//! Ownership rules, so a reload never removes what someone else put there:
//! - addresses: only those the previous configuration listed are deleted (never a flush);
//! - routes: only those on the tunnel interface, in the main table, with our protocol
//!   number (the driver tags every route it adds);
//! - proxy neighbour entries: only those tagged with our protocol (or that we remember
//!   adding).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::net::Cidr;

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

/// The metric of the prefix routes of the tunnel's own addresses (`Address`): above the
/// kernel's for an uplink or LAN address (IPv4 0, IPv6 256), so where the tunnel is
/// numbered from the uplink's subnet (`Address = 192.168.1.250/24` over a 192.168.1.0/24
/// lease) the uplink's connected route carries the subnet whichever address came first.
/// A DHCP lease arrives after the tunnel is up: with equal metrics the tunnel's older
/// route won, and the appliance sent its clients' traffic for LAN hosts back into the
/// tunnel. The proxied clients keep their host routes ([`proxy_host_routes`]).
pub const TUNNEL_SUBNET_METRIC: u32 = 1024;

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
    /// The next hop (`RTA_GATEWAY`): a router of the network.
    pub gateway: Option<IpAddr>,
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

/// Which port a [`Port`] is: what the configuration names for it differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Uplink,
    Lan,
}

/// The subnets the configuration names for proxy entries on a port of `role`; `None`
/// when that port publishes no tunnel address at all.
///
/// - the uplink: the tunnel's `Address` subnets and the `UplinkAddress` subnets. A DHCP
///   lease or SLAAC prefix is never named: with no `UplinkAddress` (the one-armed factory
///   default) only the tunnel's own subnets count, so a peer is proxied on the uplink
///   only where the tunnel is numbered from the uplink's subnet (`Address =
///   192.168.1.250/24` on a 192.168.1.0/24 LAN, or a /29 carved out of it). The factory
///   tunnel `10.100.0.1/24` is not inside a typical LAN's subnet, so its clients are not
///   proxied (they are reached through NAT to the uplink's address) — as before. A lease
///   wider than these subnets publishes nothing beyond them.
/// - two-armed (`Lan` set): nothing on the uplink — the firewall drops uplink → tunnel,
///   so an answer there would only attract traffic it then drops.
/// - the LAN port: the tunnel's `Address` subnets and the `LanAddress` subnets.
pub fn named_subnets(cfg: &Config, role: Role) -> Option<Vec<Cidr>> {
    let two_armed = !cfg.gateway.lan.is_empty();
    let own = match role {
        Role::Uplink if two_armed => return None,
        Role::Uplink => &cfg.gateway.uplink_addresses,
        Role::Lan => &cfg.gateway.lan_addresses,
    };
    let mut v: Vec<Cidr> = cfg
        .interface
        .addresses
        .iter()
        .chain(own.iter())
        .map(Cidr::network)
        .collect();
    v.sort_by_key(Cidr::sort_key);
    v.dedup();
    Some(v)
}

/// The proxy entries for the peers of `cfg` on its ports: every peer host address (a
/// `/32` or `/128` allowed IP) inside the subnet of one of a port's addresses (the port's
/// hosts resolve it there) *and* inside a subnet the configuration names for that port
/// ([`named_subnets`]) gets an entry on that port, so LAN hosts reach peers numbered from
/// the LAN subnet with no route of their own. Not proxied: wider allowed IPs (a subnet
/// is routed, not proxied), link-local and multicast addresses, a port's own address,
/// and the IPv4 network and broadcast addresses of the subnet. Whether an address is in
/// use on the port is the probe's question ([`ProbeBook`]), asked before an entry goes in.
pub fn proxy_set(cfg: &Config, ports: &[(Role, Port)]) -> BTreeSet<ProxyEntry> {
    let mut out = BTreeSet::new();
    for (role, port) in ports {
        let Some(named) = named_subnets(cfg, *role) else {
            continue;
        };
        for p in &cfg.peers {
            for c in &p.allowed_ips {
                if c.prefix != c.max_prefix() || !proxiable(c.addr) {
                    continue;
                }
                if port
                    .addresses
                    .iter()
                    .any(|a| subnet_holds(a, c.addr) && a.addr != c.addr)
                    && !port.addresses.iter().any(|a| a.addr == c.addr)
                    && named.iter().any(|n| n.contains(c.addr))
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

/// Host routes through the tunnel for proxied peer addresses its connected route does
/// not carry: where a port's subnet holding the address is as long as the tunnel subnet
/// holding it or longer (`Address = 192.168.1.250/24` on a 192.168.1.0/24 LAN: two
/// equal connected routes, and the port's wins ([`TUNNEL_SUBNET_METRIC`]) — the proxy entry would
/// answer for a client its own routing sends back to the LAN). A tunnel subnet carved
/// out of the port's (a /29 in a /24) is more specific and needs none; a peer address
/// outside the tunnel's subnets is routed by [`tunnel_routes`] already.
pub fn proxy_host_routes(
    cfg: &Config,
    ports: &[(Role, Port)],
    entries: &BTreeSet<ProxyEntry>,
) -> Vec<Cidr> {
    let longest = |v: &mut dyn Iterator<Item = &Cidr>, ip: IpAddr| {
        v.filter(|a| a.prefix < a.max_prefix() && a.contains(ip))
            .map(|a| a.prefix)
            .max()
    };
    let mut out: Vec<Cidr> = entries
        .iter()
        .filter(|e| {
            let Some(tunnel) = longest(&mut cfg.interface.addresses.iter(), e.addr) else {
                return false;
            };
            ports
                .iter()
                .filter(|(_, p)| p.ifindex == e.ifindex)
                .filter_map(|(_, p)| longest(&mut p.addresses.iter(), e.addr))
                .any(|port| port >= tunnel)
        })
        .map(|e| Cidr {
            addr: e.addr,
            prefix: if e.addr.is_ipv4() { 32 } else { 128 },
        })
        .collect();
    out.sort_by_key(Cidr::sort_key);
    out.dedup();
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
        || crate::net::is_link_local(ip))
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

/// The peer that owns tunnel route `route` (the first whose allowed IP masks to it), by
/// its `Name`, else its key's first characters; for messages.
pub fn route_owner(cfg: &Config, route: Cidr) -> String {
    cfg.peers
        .iter()
        .find(|p| p.allowed_ips.iter().any(|c| c.network() == route.network()))
        .map_or_else(
            || "no peer".to_string(),
            |p| match &p.name {
                Some(n) => format!("peer {n}"),
                None => format!("peer {}", &p.public_key.to_base64()[..8]),
            },
        )
}

/// How long a probe answer counts: an address in use is probed again after this long,
/// and one proxied is checked again (a host may have taken it since).
pub const PROBE_RECHECK: Duration = Duration::from_secs(60);

/// What a probe found out about an address on a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// No one answered (or the port has no neighbours to ask: no ARP there).
    Free,
    /// Another host answered, with this link-layer address.
    InUse { mac: [u8; 6] },
    /// The probe could not be sent; the address is not proxied until one can.
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ProbeState {
    /// A probe is out; `before`: what the last one found (a re-check keeps it meanwhile:
    /// a free entry stays proxied, a held one stays held and said once).
    Pending { before: Option<ProbeResult> },
    /// Settled at `at`.
    Known { result: ProbeResult, at: Instant },
}

/// Which wanted proxy entries may go in: an address is probed (ARP probe, DAD-style
/// neighbour solicitation: the driver sends them) before it is proxied, and only a free
/// one is. An address in use is probed again every [`PROBE_RECHECK`], so it is proxied
/// once freed; one proxied is checked as often and withdrawn when a host shows up with
/// it. Sans-IO: the driver asks [`ProbeBook::due`] what to probe, reports each outcome
/// with [`ProbeBook::record`] and installs [`ProbeBook::usable`].
#[derive(Clone, Debug, Default)]
pub struct ProbeBook {
    states: BTreeMap<ProxyEntry, ProbeState>,
    /// [`PROBE_RECHECK`] unless set ([`ProbeBook::with_recheck`]: tests).
    recheck: Option<Duration>,
}

impl ProbeBook {
    /// A book that probes again after `recheck` instead of [`PROBE_RECHECK`].
    pub fn with_recheck(recheck: Duration) -> ProbeBook {
        ProbeBook {
            states: BTreeMap::new(),
            recheck: Some(recheck),
        }
    }

    /// How long an answer counts.
    pub fn recheck(&self) -> Duration {
        self.recheck.unwrap_or(PROBE_RECHECK)
    }

    /// The entries of `want` to probe now (then marked pending); entries no longer wanted
    /// are forgotten.
    pub fn due(&mut self, want: &BTreeSet<ProxyEntry>, now: Instant) -> Vec<ProxyEntry> {
        self.states.retain(|e, _| want.contains(e));
        let recheck = self.recheck();
        let mut out = Vec::new();
        for e in want {
            let next = match self.states.get(e) {
                None => Some(None),
                Some(ProbeState::Pending { .. }) => None,
                Some(ProbeState::Known { result, at }) => {
                    (now.saturating_duration_since(*at) >= recheck).then(|| Some(result.clone()))
                }
            };
            if let Some(before) = next {
                self.states.insert(*e, ProbeState::Pending { before });
                out.push(*e);
            }
        }
        out
    }

    /// The outcome of the probe of `e`.
    pub fn record(&mut self, e: ProxyEntry, result: ProbeResult, now: Instant) {
        if self.states.contains_key(&e) {
            self.states.insert(e, ProbeState::Known { result, at: now });
        }
    }

    /// The entries of `want` found free (and those being re-checked after that).
    pub fn usable(&self, want: &BTreeSet<ProxyEntry>) -> BTreeSet<ProxyEntry> {
        want.iter()
            .filter(|e| {
                matches!(
                    self.states.get(e),
                    Some(ProbeState::Pending {
                        before: Some(ProbeResult::Free)
                    }) | Some(ProbeState::Known {
                        result: ProbeResult::Free,
                        ..
                    })
                )
            })
            .copied()
            .collect()
    }

    /// The entries held back, with why (in use by a MAC, or the probe failed).
    pub fn held(&self) -> Vec<(ProxyEntry, ProbeResult)> {
        self.states
            .iter()
            .filter_map(|(e, s)| match s {
                ProbeState::Known { result, .. }
                | ProbeState::Pending {
                    before: Some(result),
                } if *result != ProbeResult::Free => Some((*e, result.clone())),
                _ => None,
            })
            .collect()
    }

    /// Whether any probe is out.
    pub fn pending(&self) -> bool {
        self.states
            .values()
            .any(|s| matches!(s, ProbeState::Pending { .. }))
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PeerConfig;
    use crate::key::Key;

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
            access: None,
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
            gateway: None,
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

    fn up(p: Port) -> (Role, Port) {
        (Role::Uplink, p)
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
        // The configuration names the LAN's whole subnets (the tunnel numbered from them).
        let cf = cfg(
            &[
                "192.168.77.250/24",
                "192.168.78.250/24",
                "fd77::250/64",
                "fd78::250/64",
            ],
            peers,
        );
        let uplink = port(2, &["192.168.77.2/24", "fd77::2/64", "fe80::2/64"]);
        let got = proxy_set(&cf, &[up(uplink.clone())]);
        assert_eq!(
            got,
            entries(&[
                (2, "192.168.77.202"),
                (2, "192.168.77.203"),
                (2, "fd77::202")
            ])
        );
        // The uplink has no address yet (DHCP pending): nothing to proxy.
        assert!(proxy_set(&cf, &[up(port(2, &[]))]).is_empty());
        // A host-prefix port address has no subnet to share.
        assert!(proxy_set(&cf, &[up(port(2, &["192.168.77.2/32"]))]).is_empty());
        // The address changes (a new DHCP lease in another subnet): the set follows.
        let moved = proxy_set(&cf, &[up(port(2, &["192.168.78.9/24"]))]);
        assert_eq!(moved, entries(&[(2, "192.168.78.5")]));
        // IPv6 only on the port: only v6 hosts.
        let v6 = proxy_set(&cf, &[up(port(2, &["fd78::1/64"]))]);
        assert_eq!(v6, entries(&[(2, "fd78::5")]));
    }

    /// Only inside subnets the configuration names: a lease wider than them publishes
    /// nothing more, and a DHCP uplink's own subnet is not named.
    #[test]
    fn proxy_set_only_inside_named_subnets() {
        let peers = vec![
            peer(1, &["192.168.1.2/32", "fd01::2/128"]),
            peer(2, &["192.168.5.7/32", "10.100.0.2/32"]),
        ];
        // Address = 192.168.1.250/24 on a 192.168.1.0/24 LAN, DHCP uplink.
        let cf = cfg(&["192.168.1.250/24"], peers.clone());
        let lease = port(2, &["192.168.1.20/24", "fd01::20/64"]);
        assert_eq!(
            proxy_set(&cf, &[up(lease)]),
            entries(&[(2, "192.168.1.2")]),
            "fd01::/64 (SLAAC) is not named"
        );
        // A rogue lease of 192.168.0.0/16: still only the tunnel's /24.
        let wide = port(2, &["192.168.3.3/16"]);
        assert_eq!(
            proxy_set(&cf, &[up(wide.clone())]),
            entries(&[(2, "192.168.1.2")])
        );
        // The factory tunnel (10.100.0.1/24) on a DHCP LAN: nothing proxied.
        let mut factory = cfg(&["10.100.0.1/24"], peers.clone());
        assert!(proxy_set(&factory, &[up(port(2, &["192.168.1.20/24"]))]).is_empty());
        assert!(proxy_set(&factory, &[up(wide.clone())]).is_empty());
        // A static UplinkAddress names its subnet.
        factory.gateway.uplink_addresses = vec![c("192.168.5.2/24")];
        assert_eq!(
            proxy_set(&factory, &[up(port(2, &["192.168.5.2/24"]))]),
            entries(&[(2, "192.168.5.7")])
        );
        assert_eq!(
            named_subnets(&factory, Role::Uplink).unwrap(),
            cs(&["10.100.0.0/24", "192.168.5.0/24"])
        );
    }

    /// Two-armed: nothing on the uplink (the firewall drops uplink -> tunnel), the LAN
    /// port publishes inside its LanAddress and the tunnel's subnets.
    #[test]
    fn proxy_set_two_armed_not_on_the_uplink() {
        let mut cf = cfg(
            &["192.168.77.201/29"],
            vec![peer(1, &["192.168.77.202/32", "192.168.88.7/32"])],
        );
        cf.gateway.lan = "eth1".into();
        cf.gateway.lan_addresses = vec![c("192.168.88.1/24")];
        let ports = [
            up(port(2, &["192.168.77.2/24"])),
            (Role::Lan, port(3, &["192.168.88.1/24"])),
        ];
        assert_eq!(named_subnets(&cf, Role::Uplink), None);
        assert_eq!(proxy_set(&cf, &ports), entries(&[(3, "192.168.88.7")]));
        // One-armed again: the uplink publishes the tunnel's /29 host.
        cf.gateway.lan.clear();
        assert_eq!(
            proxy_set(&cf, &ports[..1]),
            entries(&[(2, "192.168.77.202")])
        );
    }

    #[test]
    fn proxied_hosts_get_a_route_where_the_port_route_would_win() {
        let peers = vec![peer(1, &["192.168.1.4/32"]), peer(2, &["10.66.0.9/32"])];
        let e = entries(&[(2, "192.168.1.4"), (2, "10.66.0.9")]);
        // The tunnel's /24 equals the uplink's: a host route.
        let cf = cfg(&["192.168.1.250/24"], peers.clone());
        let ports = [up(port(2, &["192.168.1.2/24", "10.66.0.2/16"]))];
        assert_eq!(
            proxy_host_routes(&cf, &ports, &e),
            cs(&["192.168.1.4/32"]),
            "10.66.0.9 is outside the tunnel's subnets: tunnel_routes routes it"
        );
        // A /29 carved out of the uplink's /24: its connected route wins, none needed.
        let cf = cfg(&["192.168.1.249/29"], peers);
        assert!(proxy_host_routes(&cf, &ports, &e).is_empty());
    }

    #[test]
    fn route_owner_names_the_peer() {
        // The owner of a route, for messages.
        let mut p = peer(1, &["10.251.1.0/24"]);
        p.name = Some("site-b".into());
        let cf = cfg(&[], vec![p]);
        assert_eq!(route_owner(&cf, c("10.251.1.0/24")), "peer site-b");
    }

    #[test]
    fn probe_book_probes_before_proxying_and_rechecks() {
        let t0 = Instant::now();
        let want = entries(&[(2, "192.168.1.1"), (2, "192.168.1.2")]);
        let [a, b]: [ProxyEntry; 2] = want.iter().copied().collect::<Vec<_>>().try_into().unwrap();
        let mut book = ProbeBook::default();
        // Nothing is usable before its probe answered.
        assert_eq!(book.due(&want, t0), vec![a, b]);
        assert!(book.usable(&want).is_empty() && book.pending());
        assert!(
            book.due(&want, t0).is_empty(),
            "a pending probe is not sent again"
        );
        let mac = [0xaa, 0xbb, 0xcc, 0, 0, 1];
        book.record(a, ProbeResult::InUse { mac }, t0);
        book.record(b, ProbeResult::Free, t0);
        assert_eq!(book.usable(&want), entries(&[(2, "192.168.1.2")]));
        assert_eq!(book.held(), vec![(a, ProbeResult::InUse { mac })]);
        assert!(!book.pending());
        // Within the recheck interval nothing is probed again.
        assert!(book.due(&want, t0 + Duration::from_secs(59)).is_empty());
        // After it both are: the free one stays proxied meanwhile, the used one does not.
        let t1 = t0 + PROBE_RECHECK;
        assert_eq!(book.due(&want, t1), vec![a, b]);
        assert_eq!(book.usable(&want), entries(&[(2, "192.168.1.2")]));
        assert_eq!(
            book.held(),
            vec![(a, ProbeResult::InUse { mac })],
            "still held (and said once) while probed again"
        );
        // The router went away: .1 is free now; a host took .2: withdrawn.
        book.record(a, ProbeResult::Free, t1);
        book.record(b, ProbeResult::InUse { mac }, t1);
        assert_eq!(book.usable(&want), entries(&[(2, "192.168.1.1")]));
        // A failed probe holds the address back; an entry no longer wanted is forgotten.
        let only_a: BTreeSet<ProxyEntry> = [a].into();
        assert!(book.due(&only_a, t1).is_empty());
        book.record(b, ProbeResult::Free, t1); // stale answer for a forgotten entry
        assert_eq!(book.usable(&want), only_a);
        let t2 = t1 + PROBE_RECHECK;
        assert_eq!(book.due(&only_a, t2), vec![a]);
        book.record(a, ProbeResult::Failed("no socket".into()), t2);
        assert!(book.usable(&only_a).is_empty());
        assert_eq!(mac_text(&mac), "aa:bb:cc:00:00:01");
        let mut quick = ProbeBook::with_recheck(Duration::from_secs(5));
        assert_eq!(quick.due(&only_a, t0), vec![a]);
        quick.record(a, ProbeResult::InUse { mac }, t0);
        assert_eq!(quick.due(&only_a, t0 + Duration::from_secs(5)), vec![a]);
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
