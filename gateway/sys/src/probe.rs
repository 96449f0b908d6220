//! Is an address in use on a link? One probe per address, sent and read without
//! blocking, so the caller (driver/appliance/netconf.rs's watch) never waits on the network:
//!
//! - IPv4: an ARP probe (RFC 5227 §2.1.1: sender IP 0.0.0.0, target the address, to the
//!   broadcast MAC), so no host's ARP cache learns anything from it;
//! - IPv6: a duplicate-address-detection neighbour solicitation (RFC 4862 §5.4.2: source
//!   `::`, to the target's solicited-node group, no link-layer option), which the owner
//!   answers with a neighbour advertisement to all nodes.
//!
//! Both go out on an `AF_PACKET` datagram socket bound to the link (the IPv6 one is built
//! whole here: a raw ICMPv6 socket cannot send from `::`). An answer is: an ARP packet
//! (request or reply) whose sender address is the target, or another host's probe for it;
//! a neighbour advertisement for the target, or another host's DAD solicitation for it —
//! from a link-layer address that is not the port's own. Packets are parsed by the pure
//! functions at the bottom (unit-tested); the socket calls are the `unsafe` part.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const ARPHRD_ETHER: u16 = 1;
const IFF_LOOPBACK: u32 = 0x8;
const IFF_NOARP: u32 = 0x80;
const PACKET_OUTGOING: u8 = 4;
const ICMPV6: u8 = 58;
const ND_NS: u8 = 135;
const ND_NA: u8 = 136;

/// A probe in flight for one address on one link.
pub struct Probe {
    fd: OwnedFd,
    ifindex: u32,
    target: IpAddr,
    own: [u8; 6],
}

/// The link's Ethernet address, or `None` when it resolves no neighbours (loopback,
/// `NOARP`, not Ethernet: a point-to-point uplink has no one to ask or to fool).
fn link_mac(ifname: &str) -> io::Result<Option<[u8; 6]>> {
    let dir = std::path::Path::new("/sys/class/net").join(ifname);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
    let flags = u32::from_str_radix(read("flags")?.trim_start_matches("0x"), 16).unwrap_or(0);
    let kind: u16 = read("type")?.parse().unwrap_or(0);
    if flags & (IFF_LOOPBACK | IFF_NOARP) != 0 || kind != ARPHRD_ETHER {
        return Ok(None);
    }
    Ok(parse_mac(&read("address")?))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    (parts.next().is_none() && m != [0; 6]).then_some(m)
}

fn sockaddr_ll(ifindex: u32, protocol: u16, dst: Option<[u8; 6]>) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value of it.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = protocol.to_be();
    sa.sll_ifindex = ifindex as i32;
    if let Some(d) = dst {
        sa.sll_halen = 6;
        sa.sll_addr[..6].copy_from_slice(&d);
    }
    sa
}

impl Probe {
    /// Send a probe for `target` on link `ifname` (index `ifindex`). `Ok(None)`: the link
    /// has no neighbours to ask ([`link_mac`]), so nothing there can be in use.
    pub fn start(ifname: &str, ifindex: u32, target: IpAddr) -> io::Result<Option<Probe>> {
        let Some(own) = link_mac(ifname)? else {
            return Ok(None);
        };
        let proto = if target.is_ipv4() {
            ETH_P_ARP
        } else {
            ETH_P_IPV6
        };
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto.to_be()),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let sa = sockaddr_ll(ifindex, proto, None);
        // SAFETY: `sa` is a valid sockaddr_ll that outlives the call; its size is given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let p = Probe {
            fd,
            ifindex,
            target,
            own,
        };
        p.send()?;
        Ok(Some(p))
    }

    /// Send the probe (again: RFC 5227 sends more than one).
    pub fn send(&self) -> io::Result<()> {
        let (frame, proto, dst) = match self.target {
            IpAddr::V4(t) => (arp_probe(&self.own, t), ETH_P_ARP, [0xff; 6]),
            IpAddr::V6(t) => (dad_solicitation(t), ETH_P_IPV6, solicited_mac(t)),
        };
        let sa = sockaddr_ll(self.ifindex, proto, Some(dst));
        // SAFETY: `frame` and `sa` are valid for the lengths given and outlive the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Read what has arrived since, without waiting: `Some(mac)` when another host
    /// claims the target. At most a bounded number of packets per call (a flood on the
    /// link cannot keep the caller here).
    pub fn answer(&mut self) -> io::Result<Option<[u8; 6]>> {
        let mut buf = [0u8; 1600];
        for _ in 0..1024 {
            // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value of it.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `from` are valid for writes of the sizes given; `len`
            // holds the size of `from` and is updated by the kernel.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    std::ptr::addr_of_mut!(from).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if from.sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            let mut src = [0u8; 6];
            src.copy_from_slice(&from.sll_addr[..6]);
            let pkt = &buf[..n as usize];
            let claim = match self.target {
                IpAddr::V4(t) => arp_claim(pkt, t),
                IpAddr::V6(t) => nd_claim(pkt, t, src),
            };
            if let Some(mac) = claim.filter(|m| *m != self.own && src != self.own) {
                return Ok(Some(mac));
            }
        }
        Ok(None)
    }
}

/// An ARP probe for `target` from `own` (sender IP 0.0.0.0, target MAC zero).
pub fn arp_probe(own: &[u8; 6], target: Ipv4Addr) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    p.extend_from_slice(&ARPHRD_ETHER.to_be_bytes());
    p.extend_from_slice(&0x0800u16.to_be_bytes());
    p.extend_from_slice(&[6, 4]);
    p.extend_from_slice(&1u16.to_be_bytes()); // request
    p.extend_from_slice(own);
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&target.octets());
    p
}

/// The sender MAC of an ARP packet that claims `target`: its sender IP is the target
/// (a reply, an announcement, a request from its owner), or it is another host's probe
/// for it (sender IP 0.0.0.0, target IP the target).
pub fn arp_claim(p: &[u8], target: Ipv4Addr) -> Option<[u8; 6]> {
    if p.len() < 28 || p[0..2] != ARPHRD_ETHER.to_be_bytes() || p[2..4] != [8, 0] {
        return None;
    }
    if p[4] != 6 || p[5] != 4 {
        return None;
    }
    let op = u16::from_be_bytes([p[6], p[7]]);
    let sha: [u8; 6] = p[8..14].try_into().ok()?;
    let spa = Ipv4Addr::new(p[14], p[15], p[16], p[17]);
    let tpa = Ipv4Addr::new(p[24], p[25], p[26], p[27]);
    let claims = spa == target || (op == 1 && spa.is_unspecified() && tpa == target);
    claims.then_some(sha)
}

fn solicited_node(t: Ipv6Addr) -> Ipv6Addr {
    let o = t.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

fn solicited_mac(t: Ipv6Addr) -> [u8; 6] {
    let g = solicited_node(t).octets();
    [0x33, 0x33, g[12], g[13], g[14], g[15]]
}

/// The ICMPv6 checksum over the pseudo-header and `icmp`.
fn icmpv6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, icmp: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from(c[0]) << 8
            };
            sum += u32::from(w);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(icmp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A DAD neighbour solicitation for `target`: an IPv6 packet from `::` to its
/// solicited-node group, hop limit 255, no options.
pub fn dad_solicitation(target: Ipv6Addr) -> Vec<u8> {
    let dst = solicited_node(target);
    let mut icmp = vec![ND_NS, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    let ck = icmpv6_checksum(&Ipv6Addr::UNSPECIFIED, &dst, &icmp);
    icmp[2..4].copy_from_slice(&ck.to_be_bytes());
    let mut p = Vec::with_capacity(40 + icmp.len());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    p.extend_from_slice(&[ICMPV6, 255]);
    p.extend_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&icmp);
    p
}

/// The link-layer address of an IPv6 packet that claims `target`: a neighbour
/// advertisement for it (its target link-layer option, else the frame's source `src`),
/// or another host's DAD solicitation for it (from `::`: the frame's source).
pub fn nd_claim(p: &[u8], target: Ipv6Addr, src: [u8; 6]) -> Option<[u8; 6]> {
    if p.len() < 40 + 24 || p[0] >> 4 != 6 || p[6] != ICMPV6 || p[7] != 255 {
        return None;
    }
    let icmp = &p[40..];
    let t = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).ok()?);
    if t != target || icmp[1] != 0 {
        return None;
    }
    match icmp[0] {
        ND_NA => {
            let mut opts = &icmp[24..];
            while opts.len() >= 8 {
                let len = usize::from(opts[1]) * 8;
                if len == 0 || len > opts.len() {
                    break;
                }
                if opts[0] == 2 && len == 8 {
                    return opts[2..8].try_into().ok();
                }
                opts = &opts[len..];
            }
            Some(src)
        }
        ND_NS if p[8..24] == [0; 16] => Some(src),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const OTHER: [u8; 6] = [0xaa, 0xbb, 0xcc, 0, 0, 9];

    #[test]
    fn arp_probe_layout_and_claims() {
        let t = Ipv4Addr::new(192, 168, 1, 1);
        let p = arp_probe(&OWN, t);
        assert_eq!(p.len(), 28);
        assert_eq!(&p[14..18], &[0; 4], "sender IP 0.0.0.0 (RFC 5227)");
        assert_eq!(&p[24..28], &t.octets());
        // Our own probe seen again is a probe for the target: the caller filters our MAC.
        assert_eq!(arp_claim(&p, t), Some(OWN));
        // A reply from the router.
        let mut r = p.clone();
        r[7] = 2;
        r[8..14].copy_from_slice(&OTHER);
        r[14..18].copy_from_slice(&t.octets());
        r[24..28].copy_from_slice(&[0; 4]);
        assert_eq!(arp_claim(&r, t), Some(OTHER));
        // Someone asking for the target (sender IP theirs) says nothing about the target.
        let mut q = p.clone();
        q[14..18].copy_from_slice(&[192, 168, 1, 10]);
        assert_eq!(arp_claim(&q, t), None);
        assert_eq!(arp_claim(&r, Ipv4Addr::new(192, 168, 1, 2)), None);
        // Short or not Ethernet/IPv4: ignored.
        assert_eq!(arp_claim(&r[..27], t), None);
        let mut bad = r.clone();
        bad[1] = 6;
        assert_eq!(arp_claim(&bad, t), None);
    }

    #[test]
    fn dad_solicitation_layout_checksum_and_claims() {
        let t: Ipv6Addr = "fd00:251::1234:5678".parse().unwrap();
        let p = dad_solicitation(t);
        assert_eq!(p.len(), 64);
        assert_eq!(&p[8..24], &[0; 16], "from ::");
        let dst: Ipv6Addr = "ff02::1:ff34:5678".parse().unwrap();
        assert_eq!(&p[24..40], &dst.octets());
        assert_eq!(solicited_mac(t), [0x33, 0x33, 0xff, 0x34, 0x56, 0x78]);
        // The checksum verifies: summing again with it in place gives zero.
        assert_eq!(icmpv6_checksum(&Ipv6Addr::UNSPECIFIED, &dst, &p[40..]), 0);
        // Another host's DAD for the same target claims it.
        assert_eq!(nd_claim(&p, t, OTHER), Some(OTHER));
        // An advertisement with a target link-layer option: that MAC.
        let mut na = p.clone();
        na[40] = ND_NA;
        na[8..24].copy_from_slice(&"fe80::9".parse::<Ipv6Addr>().unwrap().octets());
        na.extend_from_slice(&[2, 1]);
        na.extend_from_slice(&OTHER);
        assert_eq!(nd_claim(&na, t, [9; 6]), Some(OTHER));
        // Without the option: the frame's source.
        assert_eq!(nd_claim(&na[..64], t, [9; 6]), Some([9; 6]));
        // Another target, a hop limit not 255, a normal NS (from a real address): no.
        let other: Ipv6Addr = "fd00:251::1".parse().unwrap();
        assert_eq!(nd_claim(&na, other, OTHER), None);
        let mut hop = na.clone();
        hop[7] = 64;
        assert_eq!(nd_claim(&hop, t, OTHER), None);
        let mut ns = na.clone();
        ns[40] = ND_NS;
        assert_eq!(nd_claim(&ns, t, OTHER), None);
        // Truncations never panic.
        for i in 0..na.len() {
            let _ = nd_claim(&na[..i], t, OTHER);
        }
        // A zero-length option ends the walk.
        let mut z = na[..64].to_vec();
        z.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(nd_claim(&z, t, [9; 6]), Some([9; 6]));
    }

    #[test]
    fn macs_and_links_without_neighbours() {
        assert_eq!(parse_mac("aa:bb:cc:00:00:09"), Some(OTHER));
        assert_eq!(parse_mac("00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("aa:bb"), None);
        assert_eq!(parse_mac("aa:bb:cc:00:00:09:01"), None);
        // Loopback resolves no neighbours: nothing to probe.
        assert!(Probe::start("lo", 1, "127.0.0.9".parse().unwrap())
            .unwrap()
            .is_none());
    }
}
