//! The appliance daemon's network configuration (`riceguard up --config FILE` only; the
//! drop-in `riceguard IFNAME` configures no network, wg-quick does that).
//!
//! What it owns, each applied as a diff ([`crate::core::netplan`] computes it from the
//! configuration and the kernel's dump; this file executes it over rtnetlink):
//! - the tunnel: MTU (when it changed), `Address =` entries added and removed one by one
//!   (never a flush: addresses both configurations list are not touched), the link up,
//!   a device route per peer allowed IP, tagged with our protocol number, so the routes of
//!   a removed peer or allowed IP are deleted on reload and no one else's are;
//! - the LAN port of a two-armed gateway (`Lan =`, `LanAddress =`): up, its addresses;
//! - proxy ARP / NDP proxy entries (`ProxyArp = on`): an entry on a port for each peer
//!   host address inside one of that port's subnets and a subnet the configuration names
//!   ([`netplan::named_subnets`]: for a DHCP uplink with no `UplinkAddress`, only the
//!   tunnel's own `Address` subnets; two-armed, nothing on the uplink), and only after a
//!   probe ([`crate::sys::probe`]) found the address free: one in use (the router, a LAN
//!   host) is said in the log and the status and probed again every minute; a host
//!   route through the tunnel where the port's connected route would win;
//! - tunnel routes another interface holds (the uplink's subnet): said and retried each
//!   watch round, never failing the start or a reload; IPv6 RA prefixes that would take
//!   a tunnel route's place ([`uplink_overlap::verdict`]): their SLAAC addresses and on-link
//!   routes removed each round (the kernel has no per-prefix switch);
//! - the firewall (`driver::firewall`, `Firewall = on`): installed before the tunnel is
//!   up, replaced when the configuration or the ports' subnets change;
//! - forwarding on and `rp_filter` loose (2) on the tunnel and LAN port once the firewall
//!   is in place (or `Firewall = off`): the appliance always forwards (tunnel to LAN,
//!   full-tunnel clients to the internet). When the firewall cannot be installed and no
//!   table of ours is there, forwarding is turned off (fail closed). The
//!   uplink's `rp_filter` is left as the system set it (the image: 0): a DHCP client
//!   without an address must hear a server it has no route to yet, which strict and
//!   loose filtering both drop.
//!
//! At start and on each reload [`NetConf::apply`] runs; the uplink's address can come
//! later (DHCP) or change, so a watch thread re-evaluates the proxy entries every
//! [`WATCH_INTERVAL`] (three dumps, cheap) and retries a LAN port that was missing. On
//! exit [`NetConf::shutdown`] removes the proxy entries we added; the tunnel's routes go
//! with the tunnel.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::firewall::{self, Firewall};
use crate::core::config::{Config, DEFAULT_MTU};
use crate::core::firewall::forwarding::Forwarding;
use crate::core::firewall::TABLE;
use crate::core::net::Cidr;
use crate::core::netplan::{
    self, KernelRoute, Port, ProbeBook, ProbeResult, ProxyEntry, Role, MAIN_TABLE,
};
use crate::core::uplink_overlap::{self, TunnelRoute};
use crate::sys::netlink::{Netlink, NetlinkError, RTPROT_RICEGUARD};
use crate::sys::probe::Probe;

/// How often the watch re-evaluates the proxy entries.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(3);

/// How long a probe waits for an answer (RFC 5227's ANNOUNCE_WAIT is 2 s, its probes
/// 1-2 s apart; a LAN host answers ARP in milliseconds). A second probe goes out halfway.
pub const PROBE_WAIT: Duration = Duration::from_millis(1000);

/// How often the watch thread looks at probes in flight.
const PROBE_STEP: Duration = Duration::from_millis(250);

/// The kernel's route protocols for what it makes itself: `kernel` (an address's or an
/// RA prefix's on-link route) and `ra` (routes from router advertisements).
const RTPROT_KERNEL: u8 = 2;
const RTPROT_RA: u8 = 9;

/// A probe out for one wanted proxy entry.
struct InFlight {
    entry: ProxyEntry,
    probe: Probe,
    sent: Instant,
    resent: bool,
}

/// Why the tunnel's configuration could not be applied (the LAN side and the proxy
/// entries are reported in the log and retried, they never stop the tunnel).
#[derive(Debug)]
pub struct NetconfError {
    pub ifname: String,
    pub source: NetlinkError,
}

impl fmt::Display for NetconfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "network configuration of {}: {}",
            self.ifname, self.source
        )
    }
}

impl std::error::Error for NetconfError {}

/// The network configuration of one tunnel and its LAN side.
pub struct NetConf {
    tunnel: String,
    state: Mutex<State>,
    firewall: Firewall,
    /// The UDP port the data plane listens on (the firewall lets it in).
    port: AtomicU16,
}

#[derive(Default)]
struct State {
    /// The configuration last applied (its addresses are what a reload may delete).
    applied: Option<Config>,
    /// The LAN port could not be configured (missing, refused): the watch retries.
    lan_pending: bool,
    /// Proxy entries we added (or adopted at start: tagged with our protocol, left by an
    /// earlier run). Only these are ever deleted.
    proxies: BTreeSet<ProxyEntry>,
    /// The watch's last problem, so a persisting one is logged once.
    last_problem: Option<String>,
    /// `shutdown` ran: the watch does nothing more.
    stopped: bool,
    /// The firewall's last problem (logged once while it persists): an install that
    /// failed, or a table that is not the one for the running configuration.
    firewall_problem: Option<String>,
    /// Forwarding may be on: the kernel's table is the one for the running
    /// configuration and ports, or the firewall is off by choice.
    may_forward: bool,
    /// Which wanted proxy entries were probed free, in use or not probed yet.
    book: ProbeBook,
    /// Probes out (results picked up by [`NetConf::probe_round`]).
    probes: Vec<InFlight>,
    /// The message said (status, log) for each proxy entry held back.
    held: BTreeMap<ProxyEntry, String>,
    /// Tunnel routes that could not be installed, or are shadowed, and why (status, log,
    /// retried every watch round).
    unrouted: BTreeMap<(IpAddr, u8), String>,
    /// Uplink RA prefixes refused (or kept though overlapping) and what was said.
    ra: BTreeMap<(IpAddr, u8), String>,
    /// The ports proxy entries were computed for (names for messages).
    ports: Vec<(String, u32)>,
    /// Host routes installed for proxied addresses the tunnel's connected route does not
    /// carry (kept out of `sync_routes`' deletions).
    host_routes: Vec<Cidr>,
}

impl NetConf {
    /// Apply `cfg` to the tunnel `tunnel` (which exists, just created) and its LAN side.
    /// An error is about the tunnel itself; the LAN side's problems are logged.
    /// `port`: the UDP port the data plane listens on.
    pub fn start(tunnel: &str, cfg: &Config, port: u16) -> Result<NetConf, NetconfError> {
        let mut state = State::default();
        // Labs shorten the re-probe interval (ci/uplink-guard.sh); the appliance never
        // sets it.
        if let Some(secs) = std::env::var("RG_PROBE_RECHECK_SECS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
        {
            state.book = ProbeBook::with_recheck(Duration::from_secs(secs));
        }
        let nc = NetConf {
            tunnel: tunnel.to_string(),
            state: Mutex::new(state),
            firewall: Firewall::default(),
            port: AtomicU16::new(port),
        };
        nc.apply_as(cfg, true)?;
        Ok(nc)
    }

    /// A reload: take the network from the configuration applied before to `new`, by
    /// diff. Everything that can be done is done; the first tunnel error is returned.
    pub fn apply(&self, new: &Config, port: u16) -> Result<(), NetconfError> {
        self.port.store(port, Ordering::Relaxed);
        self.apply_as(new, false)
    }

    /// The `firewall:`, `firewall drops:` and `nat:` lines for the status file (written
    /// about once a second; the counters are read from the kernel each time).
    pub fn firewall_summary(&self) -> Vec<String> {
        let mut v = self.firewall.summary();
        let at = 1.min(v.len());
        v.splice(at..at, self.firewall.counters_lines());
        v
    }

    /// Bring the firewall to `cfg` over the ports as they are now; say a change of state.
    /// Fail closed: forwarding is turned off unless the kernel's table is the one for
    /// `cfg` over these ports (a table left by an earlier run, with other interface
    /// names or peers, does not count), or the firewall is off by choice.
    fn firewall(&self, nl: &mut Netlink, st: &mut State, cfg: &Config) {
        let ports = firewall::ports_now(nl, &self.tunnel, cfg, self.port.load(Ordering::Relaxed));
        let applied = self.firewall.apply(cfg, &ports);
        let verdict = self.firewall.forwarding(cfg);
        let problem = match (&applied, &verdict) {
            (Ok(_), Forwarding::On) => None,
            (Err(e), Forwarding::On) => Some(format!(
                "firewall: {e}; still forwarding: the table in place is the one for this configuration"
            )),
            (Ok(_), Forwarding::Off(why)) => Some(format!("firewall: NOT forwarding: {why}")),
            (Err(e), Forwarding::Off(why)) => {
                Some(format!("firewall: NOT forwarding: {why}; installing ours failed: {e}"))
            }
        };
        if problem != st.firewall_problem {
            match &problem {
                Some(m) => log::error!("{m}"),
                None => log::info!("firewall: table inet {TABLE} for this configuration in place; forwarding allowed"),
            }
        }
        st.firewall_problem = problem.clone();
        self.firewall.set_problem(problem);
        st.may_forward = verdict == Forwarding::On;
        if !st.may_forward {
            set_sysctl("net/ipv4/ip_forward", "0");
            if std::path::Path::new("/proc/sys/net/ipv6").exists() {
                set_sysctl("net/ipv6/conf/all/forwarding", "0");
            }
        }
    }

    fn apply_as(&self, new: &Config, first: bool) -> Result<(), NetconfError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.stopped {
            return Ok(());
        }
        let err = |source| NetconfError {
            ifname: self.tunnel.clone(),
            source,
        };
        let mut nl = Netlink::open().map_err(err)?;
        // The ruleset first: in place before the tunnel or a new LAN port passes a packet.
        self.firewall(&mut nl, &mut st, new);
        let old = st.applied.take();
        // The uplink's RA prefixes are judged again against the new routes.
        st.ra.clear();
        self.guard_ra(&mut nl, &mut st, new);
        let tunnel = self.tunnel(&mut nl, old.as_ref(), new);
        if tunnel.is_ok() {
            if let Err(e) = self.sync_routes(&mut nl, &mut st, new) {
                log::warn!("{}: routes: {e}", self.tunnel);
            }
        }
        st.lan_pending = match lan(&mut nl, old.as_ref(), new) {
            Ok(()) => false,
            Err(e) => {
                log::error!(
                    "LAN port {}: {e}; retrying every {WATCH_INTERVAL:?}",
                    new.gateway.lan
                );
                true
            }
        };
        st.applied = Some(new.clone());
        if let Err(e) = self.refresh(&mut nl, &mut st, first) {
            log::warn!("{}: proxy ARP/NDP: {e}", self.tunnel);
        }
        tunnel.map_err(err)
    }

    /// Tunnel MTU, addresses, link up, routes.
    fn tunnel(
        &self,
        nl: &mut Netlink,
        old: Option<&Config>,
        new: &Config,
    ) -> Result<(), NetlinkError> {
        let name = &self.tunnel;
        let idx = Netlink::ifindex(name)?;
        let mtu = |c: &Config| c.interface.mtu.unwrap_or(DEFAULT_MTU);
        if !matches!(old, Some(o) if mtu(o) == mtu(new)) {
            nl.set_mtu(name, u32::from(mtu(new)))?;
        }
        let old_addrs = old.map_or(&[][..], |o| &o.interface.addresses[..]);
        sync_addresses(
            nl,
            name,
            idx,
            old_addrs,
            &new.interface.addresses,
            Some(netplan::TUNNEL_SUBNET_METRIC),
        )?;
        nl.set_link_up(name, true)?;

        let want = netplan::tunnel_routes(new);
        let was = old.map(netplan::tunnel_routes).unwrap_or_default();
        for c in want
            .skipped_default
            .iter()
            .filter(|c| !was.skipped_default.contains(c))
        {
            log::warn!("{name}: not routing {c} through the tunnel (the default route stays on the uplink)");
        }
        Ok(())
    }

    /// The uplink as init and the console find it (`sys::nic`), never the tunnel.
    fn uplink_name(&self, cfg: &Config) -> Option<String> {
        crate::sys::nic::uplink(&cfg.gateway.uplink).filter(|u| *u != self.tunnel)
    }

    /// The tunnel's routes by diff: ours no longer wanted deleted, the wanted ones added.
    /// A route that cannot go in (another interface has the prefix: typically the
    /// uplink's subnet from a static address, an old lease or SLAAC) or is shadowed by a
    /// better route to the same prefix is said in the log and the status and retried
    /// every watch round; it never fails the start or the reload (a DHCP server would
    /// then hold the trigger of a rollback).
    fn sync_routes(
        &self,
        nl: &mut Netlink,
        st: &mut State,
        cfg: &Config,
    ) -> Result<(), NetlinkError> {
        let name = &self.tunnel;
        let idx = Netlink::ifindex(name)?;
        let mut want = netplan::tunnel_routes(cfg);
        want.routes.extend(st.host_routes.iter().copied());
        want.routes.sort_by_key(Cidr::sort_key);
        want.routes.dedup();
        let kernel = nl.routes()?;
        let owned = netplan::owned_routes(&kernel, idx, RTPROT_RICEGUARD);
        let d = netplan::route_diff(&want.routes, &owned);
        for c in &d.delete {
            match nl.delete_owned_route(*c, idx) {
                Ok(_) => log::info!("{name}: route {c} removed"),
                Err(e) => log::warn!("{name}: {e}"),
            }
        }
        let uplink = self.uplink_name(cfg);
        let mut now_unrouted = BTreeMap::new();
        for c in &want.routes {
            let owner = netplan::route_owner(cfg, *c);
            let problem = if d.add.contains(c) {
                // A route another interface has for the same prefix is not taken over.
                match nl.add_owned_route(*c, idx) {
                    Ok(()) => None,
                    Err(NetlinkError::Kernel {
                        errno: nix::Error::EEXIST,
                        ..
                    }) => Some(format!(
                        "not installed: {}",
                        holder(&kernel, *c, idx, uplink.as_deref())
                    )),
                    Err(e) => Some(format!("not installed: {e}")),
                }
            } else {
                shadowed(&kernel, *c, idx).map(|r| {
                    format!(
                        "shadowed: {} (metric {} beats ours)",
                        holder(&kernel, *c, idx, uplink.as_deref()),
                        r.priority
                    )
                })
            };
            match problem {
                Some(p) => {
                    let msg = format!("route {c} ({owner}) {p}");
                    if st.unrouted.get(&c.sort_key()) != Some(&msg) {
                        log::warn!("{name}: {msg}; retrying every {WATCH_INTERVAL:?}");
                    }
                    now_unrouted.insert(c.sort_key(), msg);
                }
                None => {
                    if st.unrouted.contains_key(&c.sort_key()) {
                        log::info!("{name}: route {c} ({owner}) installed: the conflict is gone");
                    }
                }
            }
        }
        st.unrouted = now_unrouted;
        Ok(())
    }

    /// IPv6 router advertisements on the uplink: a prefix that would take a tunnel
    /// route's place ([`uplink_overlap::verdict`], `UplinkOverlap`) is not used. The kernel does
    /// SLAAC itself and has no per-prefix switch (`accept_ra_pinfo`/`autoconf` would
    /// drop the uplink's good prefixes too), so each round the kernel-made (SLAAC)
    /// addresses in such a prefix and its on-link route are removed; an advertisement
    /// brings them back and the next round (within [`WATCH_INTERVAL`]) removes them
    /// again. Addresses someone configured (permanent) are never touched: a static
    /// conflict shows as an uninstallable route instead.
    fn guard_ra(&self, nl: &mut Netlink, st: &mut State, cfg: &Config) {
        let Some(up) = self.uplink_name(cfg) else {
            return;
        };
        let Ok(ui) = Netlink::ifindex(&up) else {
            return;
        };
        let routes: Vec<TunnelRoute> = uplink_overlap::tunnel_routes(cfg)
            .into_iter()
            .filter(|r| r.prefix.addr.is_ipv6())
            .collect();
        if routes.is_empty() {
            return;
        }
        let (addrs, kernel) = match (nl.address_details(ui), nl.routes()) {
            (Ok(a), Ok(r)) => (a, r),
            (Err(e), _) | (_, Err(e)) => {
                log::warn!("uplink {up}: RA prefixes: {e}");
                return;
            }
        };
        let configured: Vec<Cidr> = addrs
            .iter()
            .filter(|a| a.cidr.addr.is_ipv6() && !a.slaac())
            .map(|a| a.cidr.network())
            .collect();
        let mut prefixes: Vec<Cidr> = addrs
            .iter()
            .filter(|a| a.slaac())
            .map(|a| a.cidr.network())
            .chain(
                kernel
                    .iter()
                    .filter(|r| {
                        r.oif == Some(ui)
                            && r.table == MAIN_TABLE
                            && r.unicast
                            && r.gateway.is_none()
                            && matches!(r.protocol, RTPROT_KERNEL | RTPROT_RA)
                            && r.dst.addr.is_ipv6()
                            && r.dst.prefix > 0
                            && r.dst.prefix < 128
                            && !crate::core::net::is_link_local(r.dst.addr)
                    })
                    .map(|r| r.dst.network()),
            )
            .filter(|p| !configured.contains(p))
            .collect();
        prefixes.sort_by_key(Cidr::sort_key);
        prefixes.dedup();
        for p in prefixes {
            match uplink_overlap::verdict(p, &routes, cfg.gateway.uplink_overlap) {
                uplink_overlap::Verdict::Clear => {}
                uplink_overlap::Verdict::Kept { route } => {
                    let msg = format!(
                        "uplink {up}: RA prefix {p} overlaps {}'s {}: kept ({})",
                        route.owner,
                        route.prefix,
                        if route.prefix.prefix < p.prefix {
                            "the uplink shadows that part of it"
                        } else {
                            "the tunnel's more specific route wins"
                        }
                    );
                    if st.ra.get(&p.sort_key()) != Some(&msg) {
                        log::info!("{msg}");
                    }
                    st.ra.insert(p.sort_key(), msg);
                }
                uplink_overlap::Verdict::Conflict { why, .. } => {
                    for a in addrs
                        .iter()
                        .filter(|a| a.slaac() && p.contains(a.cidr.addr))
                    {
                        if let Err(e) = nl.delete_address(&up, a.cidr) {
                            log::warn!("uplink {up}: {e}");
                        }
                    }
                    if let Err(e) = nl.delete_kernel_route(p, ui) {
                        log::warn!("uplink {up}: {e}");
                    }
                    let msg = format!("uplink {up}: RA prefix {p} not used: {why}");
                    if st.ra.get(&p.sort_key()) != Some(&msg) {
                        log::warn!(
                            "{msg} (its SLAAC address and on-link route are removed each time an advertisement brings them back)"
                        );
                    }
                    st.ra.insert(p.sort_key(), msg);
                }
            }
        }
    }

    /// Re-evaluate the proxy entries (and the forwarding they need) for the configuration
    /// applied and the ports' current addresses. `adopt`: entries tagged with our
    /// protocol that exist now are leftovers of an earlier run of ours.
    fn refresh(&self, nl: &mut Netlink, st: &mut State, adopt: bool) -> Result<(), NetlinkError> {
        let Some(cfg) = st.applied.clone() else {
            return Ok(());
        };
        let mut ports: Vec<(String, u32)> = Vec::new();
        // The uplink as init and the console find it (`sys::nic`), never the tunnel.
        if let Some(u) = crate::sys::nic::uplink(&cfg.gateway.uplink).filter(|u| *u != self.tunnel)
        {
            if let Ok(i) = Netlink::ifindex(&u) {
                ports.push((u, i));
            }
        }
        if !cfg.gateway.lan.is_empty() {
            if let Ok(i) = Netlink::ifindex(&cfg.gateway.lan) {
                if !ports.iter().any(|p| p.1 == i) {
                    ports.push((cfg.gateway.lan.clone(), i));
                }
            }
        }
        let mut want = BTreeSet::new();
        let mut with_addrs = Vec::new();
        if cfg.gateway.proxy_arp {
            for (name, i) in &ports {
                let role = if *name == cfg.gateway.lan {
                    Role::Lan
                } else {
                    Role::Uplink
                };
                with_addrs.push((
                    role,
                    Port {
                        ifindex: *i,
                        addresses: nl.link_addresses(*i)?,
                    },
                ));
            }
            want = netplan::proxy_set(&cfg, &with_addrs);
        }
        if st.may_forward {
            let uplink = if cfg.gateway.uplink.is_empty() {
                ports
                    .first()
                    .filter(|p| p.0 != cfg.gateway.lan)
                    .map(|p| p.0.as_str())
            } else {
                Some(cfg.gateway.uplink.as_str())
            };
            routing_on(&self.tunnel, uplink, &cfg.gateway.lan);
        }
        for (name, i) in &ports {
            if want.iter().any(|e| e.ifindex == *i && e.addr.is_ipv6()) {
                set_sysctl(&format!("net/ipv6/conf/{name}/proxy_ndp"), "1");
            }
        }

        let dump = nl.proxy_neighbours()?;
        let present: BTreeSet<ProxyEntry> = dump
            .iter()
            .map(|n| ProxyEntry {
                ifindex: n.ifindex,
                addr: n.addr,
            })
            .collect();
        if adopt {
            st.proxies.extend(
                dump.iter()
                    .filter(|n| n.protocol == RTPROT_RICEGUARD)
                    .map(|n| ProxyEntry {
                        ifindex: n.ifindex,
                        addr: n.addr,
                    }),
            );
        }
        // Probe what is wanted and not known yet (or due again); only entries found
        // free go in, and one found in use later is withdrawn.
        let now = Instant::now();
        st.probes.retain(|p| want.contains(&p.entry));
        st.ports.clone_from(&ports);
        for e in st.book.due(&want, now) {
            let name = port_of(&ports, e.ifindex);
            match Probe::start(&name, e.ifindex, e.addr) {
                Ok(Some(probe)) => st.probes.push(InFlight {
                    entry: e,
                    probe,
                    sent: now,
                    resent: false,
                }),
                Ok(None) => st.book.record(e, ProbeResult::Free, now),
                Err(err) => {
                    st.book
                        .record(e, ProbeResult::Failed(format!("probe: {err}")), now);
                }
            }
        }
        self.say_held(st, &cfg);
        let want = st.book.usable(&want);
        self.host_routes(nl, st, netplan::proxy_host_routes(&cfg, &with_addrs, &want))?;
        let d = netplan::proxy_diff(&want, &present, &st.proxies);
        let port_name = |i: u32| port_of(&ports, i);
        for e in &d.delete {
            nl.delete_proxy_neighbour(e.ifindex, e.addr)?;
            st.proxies.remove(e);
            log::info!(
                "proxy ARP/NDP: no longer answering for {} on {}",
                e.addr,
                port_name(e.ifindex)
            );
        }
        // Remembered entries someone else removed: forgotten (re-added below if wanted).
        st.proxies.retain(|e| present.contains(e));
        for e in &d.add {
            nl.add_proxy_neighbour(e.ifindex, e.addr)?;
            st.proxies.insert(*e);
            log::info!(
                "proxy ARP/NDP: answering for {} on {}",
                e.addr,
                port_name(e.ifindex)
            );
        }
        Ok(())
    }

    /// One round of the watch: a LAN port that failed is retried, proxy entries follow
    /// the ports' addresses. A problem is logged when it first appears.
    pub fn tick(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.stopped {
            return;
        }
        let r = Netlink::open().and_then(|mut nl| {
            if st.lan_pending {
                let cfg = st.applied.clone();
                if let Some(cfg) = cfg {
                    lan(&mut nl, Some(&cfg), &cfg)?;
                    log::info!("LAN port {}: configured", cfg.gateway.lan);
                    st.lan_pending = false;
                }
            }
            // The uplink's subnets may have changed (DHCP, SLAAC): RA prefixes are judged,
            // the ruleset follows, routes that could not go in are retried.
            if let Some(cfg) = st.applied.clone() {
                self.guard_ra(&mut nl, &mut st, &cfg);
                self.firewall(&mut nl, &mut st, &cfg);
                self.sync_routes(&mut nl, &mut st, &cfg)?;
            }
            self.refresh(&mut nl, &mut st, false)
        });
        match r {
            Ok(()) => st.last_problem = None,
            Err(e) => {
                let msg = e.to_string();
                if st.last_problem.as_deref() != Some(&msg) {
                    log::warn!("{}: network watch: {msg}", self.tunnel);
                    st.last_problem = Some(msg);
                }
            }
        }
    }

    /// Run [`NetConf::tick`] every [`WATCH_INTERVAL`] on a thread of its own until `stop`.
    pub fn spawn_watch(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
        let nc = self.clone();
        let steps = (WATCH_INTERVAL.as_millis() / PROBE_STEP.as_millis()).max(1);
        std::thread::Builder::new()
            .name("rg-netconf".into())
            .spawn(move || loop {
                for _ in 0..steps {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(PROBE_STEP);
                    nc.probe_round();
                }
                nc.tick();
            })?;
        Ok(())
    }

    /// Pick up probe answers (never waiting): an answer from another host means in use;
    /// silence for [`PROBE_WAIT`] means free. When a probe settled, the proxy entries
    /// are brought up to date at once (not at the next round).
    pub fn probe_round(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.stopped || st.probes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut settled = false;
        let mut i = 0;
        while i < st.probes.len() {
            let f = &mut st.probes[i];
            let result = match f.probe.answer() {
                Ok(Some(mac)) => Some(ProbeResult::InUse { mac }),
                Err(e) => Some(ProbeResult::Failed(format!("probe: {e}"))),
                Ok(None) if now.duration_since(f.sent) >= PROBE_WAIT => Some(ProbeResult::Free),
                Ok(None) => {
                    if !f.resent && now.duration_since(f.sent) >= PROBE_WAIT / 2 {
                        f.resent = true;
                        let _ = f.probe.send();
                    }
                    None
                }
            };
            match result {
                Some(r) => {
                    let f = st.probes.swap_remove(i);
                    st.book.record(f.entry, r, now);
                    settled = true;
                }
                None => i += 1,
            }
        }
        if settled {
            let r = Netlink::open().and_then(|mut nl| self.refresh(&mut nl, &mut st, false));
            if let Err(e) = r {
                log::warn!("{}: proxy ARP/NDP: {e}", self.tunnel);
            }
        }
    }

    /// Install the host routes proxied addresses need ([`netplan::proxy_host_routes`]) and
    /// remove the ones no longer needed (unless the configuration routes them anyway).
    fn host_routes(
        &self,
        nl: &mut Netlink,
        st: &mut State,
        hosts: Vec<Cidr>,
    ) -> Result<(), NetlinkError> {
        if hosts == st.host_routes {
            return Ok(());
        }
        let idx = Netlink::ifindex(&self.tunnel)?;
        let routed = st
            .applied
            .as_ref()
            .map(|c| netplan::tunnel_routes(c).routes)
            .unwrap_or_default();
        let owned = netplan::owned_routes(&nl.routes()?, idx, RTPROT_RICEGUARD);
        for c in st
            .host_routes
            .iter()
            .filter(|c| !hosts.contains(c) && !routed.contains(c))
        {
            nl.delete_owned_route(*c, idx)?;
        }
        for c in hosts.iter().filter(|c| !owned.contains(c)) {
            nl.add_owned_route(*c, idx)?;
            log::info!(
                "{}: route {c} (a proxied client inside the port's subnet)",
                self.tunnel
            );
        }
        st.host_routes = hosts;
        Ok(())
    }

    /// Log each proxy entry newly held back (in use, or not probed), once.
    fn say_held(&self, st: &mut State, cfg: &Config) {
        let mut now = BTreeMap::new();
        for (e, r) in st.book.held() {
            let owner = netplan::route_owner(
                cfg,
                Cidr {
                    addr: e.addr,
                    prefix: if e.addr.is_ipv4() { 32 } else { 128 },
                },
            );
            let port = port_of(&st.ports, e.ifindex);
            let msg = match r {
                ProbeResult::InUse { mac } => format!(
                    "proxy: {} ({owner}) is in use on {port} by {}: not answered for",
                    e.addr,
                    netplan::mac_text(&mac)
                ),
                ProbeResult::Failed(why) => format!(
                    "proxy: {} ({owner}) on {port} could not be probed ({why}): not answered for",
                    e.addr
                ),
                ProbeResult::Free => continue,
            };
            if st.held.get(&e) != Some(&msg) {
                log::warn!("{msg}; probed again every {:?}", st.book.recheck());
            }
            now.insert(e, msg);
        }
        st.held = now;
    }

    /// The lines this file adds to the status file (`riceguard status`, `show status`):
    /// the firewall's, then tunnel routes not installed, proxy entries held back and
    /// the uplink's RA prefixes not used (or kept though overlapping).
    pub fn status_lines(&self) -> Vec<String> {
        let mut v = self.firewall_summary();
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        v.extend(st.unrouted.values().cloned());
        v.extend(st.held.values().cloned());
        v.extend(st.ra.values().cloned());
        v
    }

    /// The daemon stops: remove the proxy entries we added (the tunnel's routes and
    /// addresses go with the tunnel; the LAN port keeps its addresses).
    pub fn shutdown(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stopped = true;
        if st.proxies.is_empty() {
            return;
        }
        let mut nl = match Netlink::open() {
            Ok(nl) => nl,
            Err(e) => {
                log::warn!("proxy ARP/NDP entries left in place: {e}");
                return;
            }
        };
        for e in std::mem::take(&mut st.proxies) {
            if let Err(err) = nl.delete_proxy_neighbour(e.ifindex, e.addr) {
                log::warn!("proxy ARP/NDP {}: {err}", e.addr);
            }
        }
    }
}

/// The name of port `i` among `ports`, for messages.
fn port_of(ports: &[(String, u32)], i: u32) -> String {
    ports
        .iter()
        .find(|p| p.1 == i)
        .map_or_else(|| format!("interface #{i}"), |p| p.0.clone())
}

/// The name of interface index `i`.
fn ifname(i: u32) -> String {
    nix::net::if_::if_indextoname(i)
        .ok()
        .and_then(|c| c.into_string().ok())
        .unwrap_or_else(|| format!("interface #{i}"))
}

/// Who has `dst` besides the tunnel `tunnel`: `eth0 has 10.251.1.0/24 (the uplink shadows
/// it)`.
fn holder(kernel: &[KernelRoute], dst: Cidr, tunnel: u32, uplink: Option<&str>) -> String {
    let other = kernel.iter().find(|r| {
        r.dst.network() == dst.network() && r.table == MAIN_TABLE && r.oif != Some(tunnel)
    });
    match other.and_then(|r| r.oif) {
        Some(i) => {
            let n = ifname(i);
            let whose = if Some(n.as_str()) == uplink {
                " (the uplink shadows it)"
            } else {
                ""
            };
            format!("{n} has {dst}{whose}")
        }
        None => format!("another route to {dst} is in the way"),
    }
}

/// A route to the same prefix as our `dst` on another interface that wins over ours (a
/// lower metric: IPv6 keeps both and uses the better).
fn shadowed(kernel: &[KernelRoute], dst: Cidr, tunnel: u32) -> Option<KernelRoute> {
    let ours = kernel.iter().find(|r| {
        r.dst.network() == dst.network()
            && r.oif == Some(tunnel)
            && r.table == MAIN_TABLE
            && r.protocol == RTPROT_RICEGUARD
    })?;
    kernel
        .iter()
        .find(|r| {
            r.dst.network() == dst.network()
                && r.table == MAIN_TABLE
                && r.unicast
                && r.oif != Some(tunnel)
                && r.priority < ours.priority
        })
        .copied()
}

/// Two-armed: the LAN port up with its addresses (diff); a LAN port that changed name
/// loses the addresses we put on the old one.
fn lan(nl: &mut Netlink, old: Option<&Config>, new: &Config) -> Result<(), NetlinkError> {
    let (old_lan, old_addrs) = old.map_or(("", &[][..]), |o| {
        (o.gateway.lan.as_str(), &o.gateway.lan_addresses[..])
    });
    if !old_lan.is_empty() && old_lan != new.gateway.lan {
        if let Ok(i) = Netlink::ifindex(old_lan) {
            if let Err(e) = sync_addresses(nl, old_lan, i, old_addrs, &[], None) {
                log::warn!("former LAN port {old_lan}: {e}");
            }
        }
    }
    let name = &new.gateway.lan;
    if name.is_empty() {
        return Ok(());
    }
    let idx = Netlink::ifindex(name)?;
    nl.set_link_up(name, true)?;
    let before = if old_lan == name { old_addrs } else { &[] };
    sync_addresses(nl, name, idx, before, &new.gateway.lan_addresses, None)
}

/// Take the link's addresses from `old` to `new` (see [`netplan::address_diff`]), the
/// prefix routes of those it adds with `metric` (`None`: the kernel's).
fn sync_addresses(
    nl: &mut Netlink,
    name: &str,
    idx: u32,
    old: &[Cidr],
    new: &[Cidr],
    metric: Option<u32>,
) -> Result<(), NetlinkError> {
    let present = nl.link_addresses(idx)?;
    let d = netplan::address_diff(old, new, &present);
    if d.delete.iter().any(|a| a.addr.is_ipv4()) {
        // An IPv4 secondary would go with a deleted primary; promoted, it stays untouched.
        set_sysctl(&format!("net/ipv4/conf/{name}/promote_secondaries"), "1");
    }
    for a in &d.delete {
        if nl.delete_address(name, *a)? {
            log::info!("{name}: address {a} removed");
        }
    }
    // Read again after deleting: whatever went with a deleted address comes back.
    let present = if d.delete.is_empty() {
        present
    } else {
        nl.link_addresses(idx)?
    };
    for a in netplan::address_diff(&[], new, &present).add {
        nl.add_address_metric(name, a, metric)?;
        log::info!("{name}: address {a} added");
    }
    Ok(())
}

/// Forwarding on, reverse-path filtering loose on the tunnel and the LAN port: replies to
/// a LAN host come back through the tunnel, not the way a strict check expects. The
/// uplink keeps accepting router advertisements (SLAAC) while forwarding; its rp_filter is
/// not touched (see the module doc: DHCP after a lost lease).
fn routing_on(tunnel: &str, uplink: Option<&str>, lan: &str) {
    if let Some(u) = uplink {
        let ra = format!("/proc/sys/net/ipv6/conf/{u}/accept_ra");
        if std::fs::read_to_string(&ra).is_ok_and(|v| v.trim() == "1") {
            set_sysctl(&format!("net/ipv6/conf/{u}/accept_ra"), "2");
        }
    }
    set_sysctl("net/ipv4/ip_forward", "1");
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        set_sysctl("net/ipv6/conf/all/forwarding", "1");
    }
    for i in [tunnel, lan] {
        if !i.is_empty() {
            set_sysctl(&format!("net/ipv4/conf/{i}/rp_filter"), "2");
        }
    }
}

/// Write `/proc/sys/KEY` when it differs; a change is logged, a failure warned about.
fn set_sysctl(key: &str, value: &str) {
    let path = format!("/proc/sys/{key}");
    match std::fs::read_to_string(&path) {
        Ok(v) if v.trim() == value => {}
        Ok(_) => match std::fs::write(&path, value) {
            Ok(()) => log::info!("sysctl {} = {value}", key.replace('/', ".")),
            Err(e) => log::warn!("sysctl {}: {e}", key.replace('/', ".")),
        },
        Err(e) => log::warn!("sysctl {}: {e}", key.replace('/', ".")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::{GatewayConfig, PeerConfig};
    use crate::core::key::Key;
    use crate::sys::netlink::Route;
    use std::net::IpAddr;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn peer(n: u8, ips: &[&str]) -> PeerConfig {
        PeerConfig {
            public_key: Key([n; 32]),
            preshared_key: None,
            allowed_ips: ips.iter().map(|s| c(s)).collect(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        }
    }

    fn config(addrs: &[&str], peers: Vec<PeerConfig>) -> Config {
        let mut cfg = Config {
            gateway: GatewayConfig {
                interface_name: "rgnt0".into(),
                uplink: "lo".into(),
                ..GatewayConfig::default()
            },
            ..Config::default()
        };
        cfg.interface.addresses = addrs.iter().map(|s| c(s)).collect();
        cfg.peers = peers;
        cfg
    }

    fn ours(nl: &mut Netlink, tun: u32) -> Vec<Cidr> {
        netplan::owned_routes(&nl.routes().unwrap(), tun, RTPROT_RICEGUARD)
    }

    fn proxies(nl: &mut Netlink) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = nl
            .proxy_neighbours()
            .unwrap()
            .iter()
            .map(|p| p.addr)
            .collect();
        v.sort();
        v
    }

    /// Start, reload, watch and stop against the real kernel, in a private network
    /// namespace of this test's thread: a TUN as the tunnel, `lo` as the uplink.
    #[test]
    #[ignore = "needs root (a private network namespace, a TUN device); run with --ignored as root"]
    fn reload_is_a_diff_in_a_private_netns() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let _tun = crate::sys::tun::Tun::create("rgnt0", 1, false).unwrap();
            let mut nl = Netlink::open().unwrap();
            nl.set_link_up("lo", true).unwrap();
            nl.add_address("lo", c("192.168.77.2/24")).unwrap();
            let tun = Netlink::ifindex("rgnt0").unwrap();
            let a = config(
                &["192.168.77.201/29", "10.66.8.1/24"],
                vec![
                    peer(1, &["192.168.77.202/32", "10.66.1.0/24"]),
                    peer(2, &["192.168.77.203/32", "10.66.2.0/24", "0.0.0.0/0"]),
                ],
            );
            let nc = NetConf::start("rgnt0", &a, 51820).unwrap();
            // The firewall went in before the tunnel, and forwarding with it.
            let table = crate::core::firewall::TABLE;
            assert!(crate::sys::nftables::exists(table).unwrap());
            assert!(nc.firewall_summary()[0].starts_with("firewall: on"));
            assert_eq!(
                ours(&mut nl, tun),
                vec![c("10.66.1.0/24"), c("10.66.2.0/24")]
            );
            let p202: IpAddr = "192.168.77.202".parse().unwrap();
            let p203: IpAddr = "192.168.77.203".parse().unwrap();
            assert_eq!(proxies(&mut nl), vec![p202, p203]);
            let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
            assert_eq!(fwd.trim(), "1");

            // Someone else's route and address on the tunnel.
            nl.add_route(Route {
                dst: c("10.98.0.0/24"),
                gateway: None,
                ifindex: Some(tun),
            })
            .unwrap();
            nl.add_address("rgnt0", c("10.97.7.1/32")).unwrap();

            // Reload: peer 2 removed, one address replaced.
            let b = config(
                &["192.168.77.201/29", "10.66.9.1/24"],
                vec![peer(1, &["192.168.77.202/32", "10.66.1.0/24"])],
            );
            nc.apply(&b, 51820).unwrap();
            assert_eq!(ours(&mut nl, tun), vec![c("10.66.1.0/24")]);
            let routes = nl.routes().unwrap();
            assert!(
                routes.iter().any(|r| r.dst == c("10.98.0.0/24")),
                "{routes:?}"
            );
            assert!(
                !routes.iter().any(|r| r.dst == c("10.66.2.0/24")),
                "{routes:?}"
            );
            let addrs = nl.link_addresses(tun).unwrap();
            for want in ["192.168.77.201/29", "10.66.9.1/24", "10.97.7.1/32"] {
                assert!(addrs.contains(&c(want)), "{want} missing: {addrs:?}");
            }
            assert!(!addrs.contains(&c("10.66.8.1/24")), "{addrs:?}");
            assert_eq!(proxies(&mut nl), vec![p202]);

            // Firewall = off removes the table and keeps forwarding; on puts it back.
            let mut off = b.clone();
            off.gateway.firewall = false;
            nc.apply(&off, 51820).unwrap();
            assert!(!crate::sys::nftables::exists(table).unwrap());
            assert!(nc.firewall_summary()[0].starts_with("firewall: off"));
            let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
            assert_eq!(fwd.trim(), "1");
            nc.apply(&b, 51820).unwrap();
            assert!(crate::sys::nftables::exists(table).unwrap());

            // Removed, or replaced by another configuration's table, behind our back: the
            // next watch round installs ours again and forwarding stays allowed.
            use crate::core::firewall::forwarding::{tag, Installed};
            let ours_now = crate::sys::nftables::installed(table);
            assert!(crate::sys::nftables::remove(table).unwrap());
            nc.tick();
            assert_eq!(crate::sys::nftables::installed(table), ours_now);
            let mut other = crate::core::firewall::Ports::from_config(&b);
            other.tunnel = "rgnt9".into();
            let stale = crate::core::firewall::ruleset(&b, &other);
            crate::sys::nftables::replace(&stale, &Default::default()).unwrap();
            let stale_tag = Installed::Present {
                comment: Some(tag(&stale)),
            };
            assert_eq!(crate::sys::nftables::installed(table), stale_tag);
            nc.tick();
            assert_eq!(crate::sys::nftables::installed(table), ours_now);
            let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
            assert_eq!(fwd.trim(), "1");
            assert!(nc.firewall_summary()[0].starts_with("firewall: on"));

            // The uplink moves to another subnet: the watch drops the entry, and adds it
            // back when the address returns.
            nl.delete_address("lo", c("192.168.77.2/24")).unwrap();
            nl.add_address("lo", c("192.168.78.2/24")).unwrap();
            nc.tick();
            assert!(proxies(&mut nl).is_empty());
            nl.add_address("lo", c("192.168.77.2/24")).unwrap();
            nc.tick();
            assert_eq!(proxies(&mut nl), vec![p202]);

            // An entry added after the start (even tagged like ours: only what is there at
            // the start is adopted) stays through ticks and the stop; ours go.
            let foreign: IpAddr = "192.168.77.50".parse().unwrap();
            nl.add_proxy_neighbour(Netlink::ifindex("lo").unwrap(), foreign)
                .unwrap();
            nc.tick();
            nc.shutdown();
            assert_eq!(proxies(&mut nl), vec![foreign]);
            nc.tick(); // stopped: does nothing
            assert_eq!(proxies(&mut nl), vec![foreign]);
            // The daemon's exit leaves the firewall (fail closed).
            assert!(crate::sys::nftables::exists(table).unwrap());
        })
        .join()
        .unwrap();
    }

    /// A tunnel route the uplink's subnet already holds: the start succeeds, the status
    /// says why the route is missing, and the watch installs it once the address goes.
    #[test]
    #[ignore = "needs root (a private network namespace, a TUN device); run with --ignored as root"]
    fn shadowed_route_is_said_and_retried_in_a_private_netns() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let _tun = crate::sys::tun::Tun::create("rgnt1", 1, false).unwrap();
            // A veth uplink (on lo a prefix route goes to the local table only; dummy links
            // need a module these machines do not have).
            let ok = std::process::Command::new("ip")
                .args(["link", "add", "rgup1", "type", "veth", "peer", "name", "rgup1p"])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                crate::testutil::not_run("no `ip` or no veth links");
                return;
            }
            let mut nl = Netlink::open().unwrap();
            nl.set_link_up("rgup1p", true).unwrap();
            nl.set_link_up("rgup1", true).unwrap();
            nl.add_address("rgup1", c("10.251.1.50/24")).unwrap();
            let tun = Netlink::ifindex("rgnt1").unwrap();
            let mut p = peer(1, &["10.251.1.0/24", "10.252.0.0/24"]);
            p.name = Some("site-b".into());
            let mut a = config(&["10.66.8.1/24"], vec![p]);
            a.gateway.interface_name = "rgnt1".into();
            a.gateway.uplink = "rgup1".into();
            let nc = NetConf::start("rgnt1", &a, 51820).expect("the start must not fail");
            assert_eq!(ours(&mut nl, tun), vec![c("10.252.0.0/24")]);
            let lines = nc.status_lines();
            let want = "route 10.251.1.0/24 (peer site-b) not installed: rgup1 has 10.251.1.0/24 (the uplink shadows it)";
            assert!(lines.iter().any(|l| l == want), "{lines:?}");
            // A reload keeps saying it, and succeeds.
            nc.apply(&a, 51820).unwrap();
            assert!(nc.status_lines().iter().any(|l| l == want));
            // The address goes (a lease ends, a static address is changed): installed.
            nl.delete_address("rgup1", c("10.251.1.50/24")).unwrap();
            nc.tick();
            assert_eq!(
                ours(&mut nl, tun),
                vec![c("10.251.1.0/24"), c("10.252.0.0/24")]
            );
            assert!(!nc.status_lines().iter().any(|l| l.starts_with("route ")));
            nc.shutdown();
        })
        .join()
        .unwrap();
    }
}
