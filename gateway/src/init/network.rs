//! Network bring-up: lo, the uplink (a static address, or the supervised DHCP client
//! with SLAAC), what its NIC offers (USO), and RPS/XPS steering to the data-plane cores.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::core::config::GatewayConfig;
use crate::core::net::Cidr;
use crate::sys::netlink::{Netlink, Route};

use super::board;
use super::board::Board;
use super::cmdline::Cmdline;

/// Bring up `lo` and the uplink with its static address (`riceguard.uplink=` on the
/// kernel command line, else `UplinkAddress`). Without one the uplink is left to DHCP
/// (and IPv6 SLAAC): the device name is returned for the supervised `riceguard dhcp`.
pub(super) fn uplink(gw: Option<&GatewayConfig>, cmd: &Cmdline) -> Option<String> {
    let mut nl = match Netlink::open() {
        Ok(n) => n,
        Err(e) => {
            say!("network: {e}");
            return None;
        }
    };
    if let Err(e) = nl.set_link_up("lo", true) {
        say!("network: lo: {e}");
    }
    let spec = cmd.uplink.as_ref();
    let named = spec
        .and_then(|s| s.dev.clone())
        .or_else(|| gw.map(|g| g.uplink.clone()).filter(|u| !u.is_empty()));
    let deadline = Instant::now() + Duration::from_secs(5);
    let dev = loop {
        let d = named
            .clone()
            .filter(|n| Path::new("/sys/class/net").join(n).exists())
            .or_else(|| {
                if named.is_none() {
                    crate::sys::nic::first_ethernet()
                } else {
                    None
                }
            });
        if let Some(d) = d {
            break d;
        }
        if Instant::now() > deadline {
            say!(
                "network: no uplink interface{} found",
                named.map(|n| format!(" `{n}`")).unwrap_or_default()
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Err(e) = nl.set_link_up(&dev, true) {
        say!("network: {dev}: {e}");
        return None;
    }
    let (addrs, gateway): (Vec<Cidr>, _) = match spec {
        Some(s) => (vec![s.address], s.gateway),
        None => gw
            .map(|g| (g.uplink_addresses.clone(), g.uplink_gateway))
            .unwrap_or_default(),
    };
    if addrs.is_empty() {
        // SLAAC while forwarding: accept_ra=2 (1 is ignored when forwarding is on).
        for (k, v) in [("accept_ra", "2"), ("autoconf", "1")] {
            let p = format!("/proc/sys/net/ipv6/conf/{dev}/{k}");
            if let Err(e) = std::fs::write(&p, v) {
                say!("network: {p}: {e}");
            }
        }
        say!(
            "uplink {dev} up (DHCP; IPv6 by SLAAC){}",
            if gateway.is_some() {
                " (UplinkGateway ignored without UplinkAddress)"
            } else {
                ""
            }
        );
        report_uso(&dev);
        return Some(dev);
    }
    for a in &addrs {
        if let Err(e) = nl.add_address(&dev, *a) {
            say!("network: {e}");
        }
    }
    if let Some(g) = gateway {
        let any = if g.is_ipv4() {
            Cidr::new([0, 0, 0, 0].into(), 0)
        } else {
            Cidr::new([0u16; 8].into(), 0)
        };
        let idx = Netlink::ifindex(&dev).ok();
        if let Some(dst) = any {
            if let Err(e) = nl.add_route(Route {
                dst,
                gateway: Some(g),
                ifindex: idx,
            }) {
                say!("network: default route: {e}");
            }
        }
    }
    let list: Vec<String> = addrs
        .iter()
        .map(|a| format!("{}/{}", a.addr, a.prefix))
        .collect();
    say!(
        "uplink {dev} up {}{}",
        list.join(" "),
        gateway.map(|g| format!(" via {g}")).unwrap_or_default()
    );
    report_uso(&dev);
    None
}

/// Say once whether the uplink offers UDP segmentation offload (USO): the data plane's
/// offload decision starts from this, and the image test checks it per QEMU `host_uso`.
pub(super) fn report_uso(dev: &str) {
    match crate::sys::ethtool::NicFeatures::read(dev) {
        Ok(f) => match f.get("tx-udp-segmentation") {
            Some(b) => say!(
                "uplink {dev} tx-udp-segmentation: {}{}",
                if b.active { "on" } else { "off" },
                if b.fixed() {
                    " [fixed]"
                } else {
                    " (changeable)"
                }
            ),
            None => say!("uplink {dev}: this kernel has no tx-udp-segmentation feature"),
        },
        Err(e) => say!("uplink {dev}: {e}"),
    }
    if let Ok(f) = crate::sys::ethtool::NicFeatures::read(dev) {
        say!("uplink {dev} offers: {}", offers(&f));
    }
}

/// The offloads the data plane cares about, as the NIC's driver reports them: `name on`,
/// `name off` (changeable) or `name fixed-off`; absent features are left out.
fn offers(f: &crate::sys::ethtool::NicFeatures) -> String {
    const SHOWN: [&str; 9] = [
        "tx-checksum-ip-generic",
        "tx-checksum-ipv4",
        "tx-checksum-ipv6",
        "tx-tcp-segmentation",
        "tx-tcp6-segmentation",
        "tx-udp-segmentation",
        "rx-gro",
        "rx-gro-hw",
        "rx-udp-gro-forwarding",
    ];
    let list: Vec<String> = SHOWN
        .iter()
        .filter_map(|n| {
            let b = f.get(n)?;
            Some(match (b.active, b.fixed()) {
                (true, _) => format!("{n} on"),
                (false, true) => format!("{n} fixed-off"),
                (false, false) => format!("{n} off"),
            })
        })
        .collect();
    if list.is_empty() {
        "none of the offloads riceguard uses".into()
    } else {
        list.join(", ")
    }
}

/// Steer the uplink's receive queues (RPS) to the data-plane cores that are online.
pub(super) fn steer_rps(gw: Option<&GatewayConfig>, board: &Board) {
    let cores = match gw {
        Some(g) if !g.cores.is_empty() => g.cores.clone(),
        _ => board.dataplane_cores.clone(),
    };
    if cores.is_empty() {
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| board::parse_cpus(s.trim()).ok())
        .unwrap_or_default();
    let cores: Vec<usize> = cores.into_iter().filter(|c| online.contains(c)).collect();
    let dev = gw
        .map(|g| g.uplink.clone())
        .filter(|u| !u.is_empty())
        .or_else(crate::sys::nic::first_ethernet);
    let (Some(dev), false) = (dev, cores.is_empty()) else {
        return;
    };
    let mask = board::cpu_mask(&cores);
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/sys/class/net/{dev}/queues")) {
        for q in rd.flatten() {
            if q.file_name().to_string_lossy().starts_with("rx-")
                && std::fs::write(q.path().join("rps_cpus"), &mask).is_ok()
            {
                n += 1;
            }
        }
    }
    say!("rps: {n} {dev} rx queues -> cpus {cores:?} (mask {mask})");
    // XPS: each transmit queue is used by one data-plane core, so a worker's sends stay
    // on its own queue (no lock shared with another core's transmits).
    let mut txq: Vec<usize> = std::fs::read_dir(format!("/sys/class/net/{dev}/queues"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|q| {
                    q.file_name()
                        .to_string_lossy()
                        .strip_prefix("tx-")
                        .and_then(|i| i.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    txq.sort_unstable();
    let mut set = 0;
    for (q, m) in xps_plan(&txq, &cores) {
        let path = format!("/sys/class/net/{dev}/queues/tx-{q}/xps_cpus");
        if std::fs::write(path, &m).is_ok() {
            set += 1;
        }
    }
    say!(
        "xps: {set} of {} {dev} tx queues -> one data-plane core each",
        txq.len()
    );
}

/// Transmit queue -> the CPU mask of the data-plane core that sends on it: queues in
/// order, cores taken round-robin (with more cores than queues, a queue gets several).
pub(super) fn xps_plan(queues: &[usize], cores: &[usize]) -> Vec<(usize, String)> {
    if queues.is_empty() || cores.is_empty() {
        return Vec::new();
    }
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); queues.len()];
    for (i, &c) in cores.iter().enumerate() {
        per[i % queues.len()].push(c);
    }
    queues
        .iter()
        .zip(per)
        .enumerate()
        .map(|(i, (&q, mut cs))| {
            if cs.is_empty() {
                cs.push(cores[i % cores.len()]);
            }
            (q, board::cpu_mask(&cs))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xps_one_core_per_queue() {
        let m = |c: &[usize]| board::cpu_mask(c);
        assert_eq!(
            xps_plan(&[0, 1, 2, 3], &[1, 2]),
            vec![(0, m(&[1])), (1, m(&[2])), (2, m(&[1])), (3, m(&[2]))]
        );
        assert_eq!(xps_plan(&[0], &[0, 1]), vec![(0, m(&[0, 1]))]);
        assert!(xps_plan(&[], &[1]).is_empty());
    }
}
