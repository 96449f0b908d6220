//! Start-up glue for the offload decision: find the egress NIC, read its features,
//! let `core::offload::decide` choose (switching USO on where it can), apply the result
//! to the worker sockets and log it once.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::core::config::OffloadMode;
use crate::core::offload::{decide, OffloadDecision};
use crate::sys::ethtool::{self, NicFeatures};
use crate::sys::udp::UdpSocket;

/// The interface the kernel would route `toward` through, found without sending
/// anything: connect a UDP socket (no packet leaves), read its source address and find
/// the interface holding it. `None` without a route or an address match.
pub fn egress_interface(toward: IpAddr) -> Option<String> {
    let bind: SocketAddr = match toward {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect((toward, 9)).ok()?;
    let local = s.local_addr().ok()?.ip();
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    for a in addrs {
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if ip == local {
            return Some(a.interface_name);
        }
    }
    None
}

/// Decide for `egress` (e.g. from [`egress_interface`] toward a peer or a public
/// address), apply it to every worker socket and log the one line. `sockets[0]` is the
/// one probed; all were bound with the same options.
pub fn decide_and_apply(
    egress: Option<&str>,
    mode: OffloadMode,
    sockets: &[&UdpSocket],
) -> OffloadDecision {
    let probe = sockets.first().map(|s| s.probe()).unwrap_or_default();
    let nic = egress.and_then(|ifname| match NicFeatures::read(ifname) {
        Ok(f) => Some(f.offloads()),
        Err(e) => {
            log::info!("offload: {e}");
            None
        }
    });
    let name = egress.unwrap_or("egress");
    let d = decide(name, mode, nic.as_ref(), probe, |feature| {
        ethtool::enable(name, feature).map_err(|e| e.to_string())
    });
    for s in sockets {
        s.apply(&d);
    }
    log::info!("offload: {}", d.reason);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tun::tests::{can_net_admin, in_new_netns, ip};
    use crate::sys::udp::UdpOptions;

    #[test]
    fn veth_with_uso_switched_off_gets_it_back() {
        if !can_net_admin() {
            eprintln!("skipped: needs root");
            return;
        }
        in_new_netns(|| {
            ip(&[
                "link", "add", "rgoa", "type", "veth", "peer", "name", "rgob",
            ]);
            ip(&["addr", "add", "10.80.0.1/24", "dev", "rgoa"]);
            ip(&["link", "set", "rgoa", "up"]);
            ip(&["link", "set", "rgob", "up"]);
            ip(&["route", "add", "default", "via", "10.80.0.2"]);
            let egress = egress_interface("192.0.2.7".parse().expect("ip"));
            assert_eq!(egress.as_deref(), Some("rgoa"));
            ethtool::set_feature("rgoa", "tx-udp-segmentation", false).expect("off");
            ethtool::set_feature("rgoa", "generic-receive-offload", true).expect("gro");

            let s = UdpSocket::bind("10.80.0.1:0".parse().expect("addr"), &UdpOptions::default())
                .expect("bind");
            let d = decide_and_apply(Some("rgoa"), OffloadMode::Auto, &[&s]);
            assert_eq!(
                d.udp_tx,
                crate::core::offload::UdpTx::HardwareUso,
                "{}",
                d.reason
            );
            assert!(d
                .reason
                .starts_with("rgoa: tx-udp-segmentation off, switched on"));
            assert!(s.gso_enabled() && s.gro_enabled());

            let d = decide_and_apply(Some("rgoa"), OffloadMode::Mmsg, &[&s]);
            assert_eq!(d.udp_tx, crate::core::offload::UdpTx::Mmsg);
            assert!(!s.gso_enabled() && !s.gro_enabled());
        });
    }
}
