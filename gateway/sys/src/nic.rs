//! Which NIC is the uplink, found the same way by init, the console and the daemon:
//! `[Gateway] Uplink` when set, else the interface of the IPv4 default route, else the
//! first physical Ethernet NIC by name (on the appliance: the port init brings up and
//! runs DHCP on, before any default route exists).

use std::path::Path;

/// The uplink for a configured name (empty: not configured).
pub fn uplink(configured: &str) -> Option<String> {
    if !configured.is_empty() {
        return Some(configured.to_string());
    }
    std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| default_route_dev(&t))
        .or_else(first_ethernet)
}

/// The first physical (has a `device`) network interface by name.
pub fn first_ethernet() -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo" && Path::new("/sys/class/net").join(n).join("device").exists())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// The interface of the IPv4 default route in `/proc/net/route` text (the lowest metric
/// of the routes that are up).
pub fn default_route_dev(proc_net_route: &str) -> Option<String> {
    proc_net_route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (dev, dst, flags, metric, mask) =
                (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
            let up = u32::from_str_radix(flags, 16).ok()? & 1 == 1;
            if !(up && *dst == "00000000" && *mask == "00000000") {
                return None;
            }
            Some((metric.parse::<u32>().ok()?, dev.to_string()))
        })
        .min()
        .map(|(_, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_from_proc() {
        let t =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
                 eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                 eth2\t00000000\t010200C0\t0002\t0\t0\t1\t00000000\t0\t0\t0\n\
                 eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_route_dev(t).as_deref(), Some("eth0"));
        assert_eq!(default_route_dev("Iface\tDestination\n"), None);
        assert_eq!(default_route_dev("junk\n\nx y\n"), None);
    }

    #[test]
    fn a_configured_uplink_wins() {
        assert_eq!(uplink("eth7").as_deref(), Some("eth7"));
    }
}
