//! The appliance's firewall, kept in step with the configuration and the ports' subnets
//! (appliance mode and init only; the drop-in `riceguard IFNAME` touches no firewall, as
//! wireguard-go does not).
//!
//! [`crate::core::firewall`] computes the table; this file gathers what it is computed
//! over (interface names, the uplink zone's subnets, the listen port), installs it with
//! `sys::nftables` only when it changed, and carries the drop counters across a
//! replacement. The table stays when the daemon exits or crashes (fail closed: the
//! uplink still reaches neither the LAN nor the tunnel's routes); `Firewall = off`
//! removes it. Whether the gateway may forward is [`Firewall::forwarding`]: only while
//! the kernel's table carries the tag of the ruleset asked for now
//! ([`crate::core::firewall::forwarding`]), so a table left by a run with other
//! interface names or peers never stands in for ours.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::core::config::Config;
use crate::core::firewall::forwarding::{self as fwd, Forwarding, Installed};
use crate::core::firewall::{self, Ports, Ruleset, TABLE};
use crate::core::net::Cidr;
use crate::sys::netlink::Netlink;
use crate::sys::nftables::{self, NftError};

/// The firewall's state in the daemon: the ruleset last installed.
#[derive(Default)]
pub struct Firewall {
    installed: Mutex<Option<Ruleset>>,
    /// The tag of the ruleset the last [`Firewall::apply`] asked for (`None`: off by
    /// choice, or not applied yet).
    want: Mutex<Option<String>>,
    /// Why the gateway does not forward (or the last error), first in the status.
    problem: Mutex<Option<String>>,
    /// What `riceguard status` shows (the `firewall:` and `nat:` lines).
    summary: Mutex<Vec<String>>,
    /// The per-client access counters of the ruleset asked for, with the peer each
    /// belongs to as the status names it (its `Name`, else its key's start).
    access_counters: Mutex<Vec<(String, String)>>,
}

/// What happened on [`Firewall::apply`].
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The table was installed or replaced.
    Installed,
    /// The table was already what the configuration asks for.
    Unchanged,
    /// `Firewall = off`: the table is gone (it was removed, or was not there).
    Off,
}

impl Firewall {
    /// Bring the kernel's table to what `cfg` asks for over `ports`. An error leaves the
    /// table as it was (one transaction) — and the gateway must then not forward.
    pub fn apply(&self, cfg: &Config, ports: &Ports) -> Result<Outcome, NftError> {
        let mut inst = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        let mut want = self.want.lock().unwrap_or_else(|p| p.into_inner());
        if !cfg.gateway.firewall {
            *want = None;
            self.set_summary(vec![
                "firewall: off (Firewall = off): nothing filtered or translated".into(),
            ]);
            let was = inst.take().is_some();
            if nftables::remove(TABLE)? || was {
                log::warn!("firewall: off (Firewall = off), table inet {TABLE} removed");
            }
            return Ok(Outcome::Off);
        }
        let rs = firewall::ruleset(cfg, ports);
        let tag = fwd::tag(&rs);
        *want = Some(tag.clone());
        let mut summary = vec![format!(
            "firewall: on (table inet {TABLE}; uplink {}, LAN port {}, tunnel {})",
            uplink_text(ports),
            ports.lan.as_deref().unwrap_or("none (one-armed)"),
            ports.tunnel
        )];
        summary.extend(firewall::nat_summary(cfg, ports));
        summary.push(
            "mss clamp: on (TCP SYNs into and out of the tunnel: MSS set to the route's MTU)"
                .into(),
        );
        // The restricted clients' counters are the table's own (no second computation).
        let restricted = access_counters(cfg, &rs.counters);
        summary.extend(access_summary(cfg, &restricted));
        *self
            .access_counters
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = restricted;
        if inst.as_ref() == Some(&rs) {
            let kernel = nftables::installed(TABLE);
            if fwd::forwarding(Some(&tag), &kernel) == Forwarding::On {
                self.set_summary(summary);
                return Ok(Outcome::Unchanged);
            }
            // Removed or replaced behind our back (`nft flush ruleset`, another tool).
            log::warn!("firewall: table inet {TABLE} is not as installed ({kernel:?}): installing it again");
        }
        // Counts survive the replacement: the new counters start where the old ones are.
        let initial: HashMap<String, (u64, u64)> = nftables::counters(TABLE)
            .unwrap_or_default()
            .into_iter()
            .map(|(n, p, b)| (n, (p, b)))
            .collect();
        if let Err(e) = nftables::replace(&rs, &initial) {
            // What is asked for is not in place: the status says what is (the problem line).
            self.set_summary(Vec::new());
            return Err(e);
        }
        let first = inst.is_none();
        *inst = Some(rs);
        self.set_summary(summary);
        if first {
            log::info!("firewall: table inet {TABLE} in place");
        } else {
            log::info!("firewall: table inet {TABLE} replaced");
        }
        Ok(Outcome::Installed)
    }

    /// Whether the gateway may forward now: the kernel's table (read now) against the
    /// ruleset the last [`Firewall::apply`] asked for, whether or not it got installed.
    /// Before any `apply`: off.
    pub fn forwarding(&self, cfg: &Config) -> Forwarding {
        let want = self.want.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if cfg.gateway.firewall && want.is_none() {
            return Forwarding::Off(fwd::NotForwarding::NoTable);
        }
        let kernel = match &want {
            Some(_) => nftables::installed(TABLE),
            None => Installed::Absent, // off by choice: not looked at
        };
        fwd::forwarding(want.as_deref(), &kernel)
    }

    /// What the status shows first while the firewall has a problem (`None`: none).
    pub fn set_problem(&self, p: Option<String>) {
        *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = p;
    }

    fn set_summary(&self, lines: Vec<String>) {
        *self.summary.lock().unwrap_or_else(|p| p.into_inner()) = lines;
    }

    /// The `firewall:` and `nat:` lines for the status file; a problem comes first.
    pub fn summary(&self) -> Vec<String> {
        let mut v = self
            .summary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(p) = self
            .problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            v.insert(0, p);
        }
        v
    }
}

fn uplink_text(p: &Ports) -> String {
    if p.uplink_nets.is_empty() {
        "every other interface (no subnet yet)".into()
    } else {
        let nets: Vec<String> = p.uplink_nets.iter().map(|c| c.to_string()).collect();
        format!("every other interface ({})", nets.join(", "))
    }
}

/// The ports as they are now: names from the configuration, the uplink zone's subnets
/// (every interface but `lo`, the tunnel and the LAN port) and the LAN port's from the
/// kernel. Interfaces that vanish while being read are skipped.
pub fn ports_now(nl: &mut Netlink, tunnel: &str, cfg: &Config, listen_port: u16) -> Ports {
    let lan = (!cfg.gateway.lan.is_empty()).then(|| cfg.gateway.lan.clone());
    let mut uplink_nets = Vec::new();
    let mut uplink_addrs = Vec::new();
    let mut lan_nets: Vec<Cidr> = cfg
        .gateway
        .lan_addresses
        .iter()
        .map(Cidr::network)
        .collect();
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for n in names {
        if n == "lo" || n == tunnel {
            continue;
        }
        let Ok(i) = Netlink::ifindex(&n) else {
            continue;
        };
        let Ok(addrs) = nl.link_addresses(i) else {
            continue;
        };
        let nets = addrs
            .iter()
            .map(Cidr::network)
            // Link-local subnets say nothing about who routes back.
            .filter(|c| !crate::core::net::is_link_local(c.addr));
        if lan.as_deref() == Some(n.as_str()) {
            lan_nets.extend(nets);
        } else {
            uplink_nets.extend(nets);
            uplink_addrs.extend(addrs.iter().copied());
        }
    }
    let dedup = |v: &mut Vec<Cidr>| {
        v.sort_by_key(Cidr::sort_key);
        v.dedup();
    };
    dedup(&mut uplink_nets);
    dedup(&mut lan_nets);
    Ports {
        tunnel: tunnel.to_string(),
        lan,
        uplink_nets,
        uplink_addrs,
        lan_nets,
        listen_port: (listen_port != 0).then_some(listen_port),
    }
}

/// Init at boot, before any interface but `lo` is up: the table for the saved
/// configuration, with no subnets known yet (the daemon refines it within seconds).
pub fn install_at_boot(cfg: &Config) -> Result<Outcome, NftError> {
    Firewall::default().apply(cfg, &Ports::from_config(cfg))
}

impl Firewall {
    /// `riceguard status`: the drop counters of the table (`firewall drops:`), then what
    /// each restricted client tried and was refused (`client access drops:`, the most
    /// first, at most 20 named). Empty: no table.
    pub fn counters_lines(&self) -> Vec<String> {
        let Ok(c) = nftables::counters(TABLE) else {
            return Vec::new();
        };
        if c.is_empty() {
            return Vec::new();
        }
        let (access, global): (Vec<_>, Vec<_>) = c
            .into_iter()
            .partition(|(n, _, _)| firewall::clients::counter_tag(n).is_some());
        let parts: Vec<String> = global.iter().map(|(n, p, _)| format!("{n} {p}")).collect();
        let mut v = vec![format!("firewall drops: {}", parts.join(", "))];
        let names = self
            .access_counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(l) = access_drops_line(&names, &access) {
            v.push(l);
        }
        v
    }
}

/// The per-client access counters among the ruleset's `counters`, and whose they are.
fn access_counters(cfg: &Config, counters: &[String]) -> Vec<(String, String)> {
    cfg.peers
        .iter()
        .filter(|p| counters.contains(&firewall::clients::counter_name(&p.public_key)))
        .map(|p| {
            let who = p
                .name
                .clone()
                .unwrap_or_else(|| p.public_key.to_base64()[..8].to_string());
            (firewall::clients::counter_name(&p.public_key), who)
        })
        .collect()
}

/// `client access: ...`: how many clients are restricted and whether isolation is on.
fn access_summary(cfg: &Config, restricted: &[(String, String)]) -> Option<String> {
    if restricted.is_empty() && !cfg.gateway.client_isolation {
        return None;
    }
    let names: Vec<&str> = restricted
        .iter()
        .take(20)
        .map(|(_, n)| n.as_str())
        .collect();
    let more = restricted.len().saturating_sub(names.len());
    Some(format!(
        "client access: {} restricted ({}{}){}",
        restricted.len(),
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
        if cfg.gateway.client_isolation {
            "; ClientIsolation on: clients without an Access of their own cannot reach each other"
        } else {
            ""
        }
    ))
}

/// `client access drops: kiosk 17, tv 3` (the most first; at most 20; those at 0 left
/// out); `None` when no restricted client dropped anything.
fn access_drops_line(names: &[(String, String)], counts: &[(String, u64, u64)]) -> Option<String> {
    let mut hits: Vec<(&str, u64)> = counts
        .iter()
        .filter(|(_, p, _)| *p > 0)
        .map(|(n, p, _)| {
            let who = names
                .iter()
                .find(|(c, _)| c == n)
                .map_or(n.as_str(), |(_, w)| w.as_str());
            (who, *p)
        })
        .collect();
    if hits.is_empty() {
        return None;
    }
    hits.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let total: u64 = hits.iter().map(|h| h.1).sum();
    let shown: Vec<String> = hits
        .iter()
        .take(20)
        .map(|(w, p)| format!("{w} {p}"))
        .collect();
    let more = hits.len().saturating_sub(shown.len());
    Some(format!(
        "client access drops: {total} ({}{})",
        shown.join(", "),
        if more > 0 {
            format!(", {more} more")
        } else {
            String::new()
        }
    ))
}
