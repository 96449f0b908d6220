//! Start-up glue for the offload decision: find the egress NIC, read its features,
//! let `core::offload::decide` choose (switching USO on where it can), apply the result
//! to the worker sockets and log it once.
//!
//! # How a data-plane worker uses the offload pieces
//!
//! Start-up (once, before the workers run):
//! 1. `Tun::create(name, workers, vnet_hdr)`; `tun.offload()` says what stuck
//!    (`tso()`/`uso()`). Give queue `i` to worker `i` (`into_queues()`).
//! 2. One `UdpSocket::bind([::]:port, &UdpOptions::default())` per worker
//!    (`SO_REUSEPORT` spreads flows over them).
//! 3. `decide_and_apply(egress_interface(peer_or_public_ip).as_deref(), mode, &sockets)`.
//!
//! TUN -> UDP (per worker, buffers from the worker's pool):
//! 1. `q.read(&mut rbuf)` with `rbuf` of `VIRTIO_NET_HDR_LEN + 65535` bytes when
//!    `vnet_hdr` (else MTU-sized, and no splitter: the read is the packet).
//! 2. `Splitter::new(&rbuf[..n])` (an error: count and drop); `next_into(&mut seg)` for
//!    each segment -> plain IP packet; route it to a peer and encrypt.
//! 3. Per peer endpoint a `GsoBatch::new(dst, sock.max_gso_segments_to(dst))`: `can_push(len)`
//!    else flush; encrypt into `gso_buf[b.size()..]`, `push(len)`; flush on the last
//!    packet of the read: `t = b.finish()` then
//!    `sock.send_segmented(t.destination, &gso_buf[..t.size], t.segment_size as u16)`
//!    (GSO when on toward it, `sendmmsg` otherwise, demotion and rests handled inside).
//!
//! UDP -> TUN:
//! 1. `sock.recv_batch(&mut bufs, &mut metas)` (64 KiB buffers when `gro_enabled()`); each
//!    `meta` holds `len / segment_size` datagrams: `buf[..len].chunks(segment_size)`.
//! 2. Decrypt each into its own buffer; collect the plain packets of the batch.
//! 3. `Coalescer::new(CoalesceOptions { tcp: tun.offload().tso(), udp:
//!    tun.offload().uso() })` once; per batch `plan(&pkts)` then for each
//!    `groups()` entry `write(&g, &pkts, &mut out)` and `q.write(&out[..len])`.
//!    Without `vnet_hdr`, write the plain packets directly.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::ethtool::{self, NicFeatures};
use crate::udp::UdpSocket;
use riceguard_core::config::OffloadMode;
use riceguard_core::offload::{decide, OffloadDecision};

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
    use crate::testutil::{in_new_netns, ip};
    use crate::udp::UdpOptions;

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn veth_with_uso_switched_off_gets_it_back() {
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
                riceguard_core::offload::UdpTx::HardwareUso,
                "{}",
                d.reason
            );
            assert!(d
                .reason
                .starts_with("rgoa: tx-udp-segmentation off, switched on"));
            assert!(s.gso_enabled() && s.gro_enabled());

            let d = decide_and_apply(Some("rgoa"), OffloadMode::Mmsg, &[&s]);
            assert_eq!(d.udp_tx, riceguard_core::offload::UdpTx::Mmsg);
            assert!(!s.gso_enabled() && !s.gro_enabled());
        });
    }
}
