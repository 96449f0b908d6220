//! Socket addresses and control messages of UDP messages, for both ways the data plane
//! talks to its socket: `sendmmsg`/`recvmmsg` (`sys::udp`) and io_uring `SendMsg` /
//! multishot `RecvMsg` (`sys::uring`). One parser and one writer of each, so the two
//! backends agree on what a received message says (source, local address from
//! `IP_PKTINFO`/`IPV6_PKTINFO`, GRO segment size checked to 1..=65535) and on what a send
//! carries (`UDP_SEGMENT`, a source address).
//!
//! Received bytes are parsed without trusting a single length (fuzz targets `udp_cmsg`
//! and `uring_recv`). Addresses come back canonical: v4-mapped IPv6 as IPv4.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub(crate) const SOL_UDP: libc::c_int = 17;
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
pub(crate) const UDP_GRO: libc::c_int = 104;

/// Map a v4 destination to the v4-mapped v6 form a dual-stack (v6) socket needs.
pub fn to_socket_family(a: SocketAddr, v6_socket: bool) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) if v6_socket => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        other => other,
    }
}

/// The canonical form of a received address (v4-mapped v6 back to v4), so the same peer
/// always has the same endpoint whatever socket family carried it.
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// What one received datagram (or GRO train) was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes in the buffer.
    pub len: usize,
    /// Sender.
    pub src: SocketAddr,
    /// With GRO: every `segment_size` bytes of the buffer is one datagram of the sender's
    /// (the last may be shorter). Equal to `len` for a single datagram.
    pub segment_size: usize,
    /// Where it was sent to (with `pktinfo`): reply with this as [`crate::udp::Transmit::src`].
    pub dst: Option<PktInfo>,
}

/// A local address and interface, as `IP_PKTINFO`/`IPV6_PKTINFO` carry them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PktInfo {
    pub ip: IpAddr,
    /// Interface index (0: let routing choose).
    pub ifindex: u32,
}

impl RecvMeta {
    pub const EMPTY: RecvMeta = RecvMeta {
        len: 0,
        src: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
        segment_size: 0,
        dst: None,
    };

    /// Number of datagrams in this buffer.
    pub fn segments(&self) -> usize {
        if self.segment_size == 0 {
            0
        } else {
            self.len.div_ceil(self.segment_size)
        }
    }
}

impl Default for RecvMeta {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Room for any socket address we send to or receive from.
#[repr(C)]
#[derive(Clone, Copy)]
pub union RawAddr {
    pub v4: libc::sockaddr_in,
    pub v6: libc::sockaddr_in6,
}

/// Control-message space for one message (`UDP_SEGMENT`/`UDP_GRO` plus a pktinfo),
/// aligned as cmsgs must be. Each io_uring `SendMsg` owns one in its slot.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug)]
pub struct CmsgBuf(pub [u8; 128]);

impl Default for CmsgBuf {
    fn default() -> Self {
        CmsgBuf([0; 128])
    }
}

pub(crate) fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// What one received message says, for both receive paths (a `recvmmsg` header, an
/// io_uring multishot buffer): `len` bytes received with `msg_flags`, from `src`
/// (`None`: an address family we do not know), with `control` bytes. Rejects
/// truncation (payload or control), unknown families and bad cmsgs (a GRO size outside
/// 1..=65535 included); a valid GRO segment size is clamped to `1..=len`.
pub fn recv_meta(
    len: usize,
    msg_flags: libc::c_int,
    src: Option<SocketAddr>,
    control: &[u8],
) -> io::Result<RecvMeta> {
    if msg_flags & libc::MSG_TRUNC != 0 {
        return Err(invalid("UDP datagram larger than the receive buffer"));
    }
    if msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(invalid("UDP control data truncated"));
    }
    let src = src.ok_or_else(|| invalid("unknown UDP source address family"))?;
    let c = parse_control(control)?;
    let segment_size = match c.gro {
        Some(s) => s.min(len.max(1)),
        None => len,
    };
    Ok(RecvMeta {
        len,
        src,
        segment_size,
        dst: c.dst,
    })
}

/// `struct cmsghdr` as the kernel lays it out: `size_t cmsg_len; int level; int type;`,
/// data aligned to `size_t`.
const CMSG_ALIGN_TO: usize = size_of::<usize>();
pub(crate) const CMSG_HDR: usize = (size_of::<usize>() + 8).next_multiple_of(CMSG_ALIGN_TO);

pub(crate) fn cmsg_align(n: usize) -> usize {
    n.next_multiple_of(CMSG_ALIGN_TO)
}

/// What the control messages of one received datagram said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvControl {
    /// `UDP_GRO` segment size.
    pub gro: Option<usize>,
    /// `IP_PKTINFO`/`IPV6_PKTINFO` local address.
    pub dst: Option<PktInfo>,
}

/// Parse received control bytes (`msg_control[..msg_controllen]`, e.g. from an io_uring
/// recvmsg completion) without trusting them: a cmsg that overruns the buffer, a short
/// payload or a GRO size outside 1..=65535 is `InvalidData`.
pub fn parse_control(control: &[u8]) -> io::Result<RecvControl> {
    let mut at = 0;
    let mut out = RecvControl::default();
    while at + CMSG_HDR <= control.len() {
        let h = &control[at..at + CMSG_HDR];
        let (lenb, rest) = h.split_at(size_of::<usize>());
        let clen = usize::from_ne_bytes(lenb.try_into().map_err(|_| invalid("cmsg"))?);
        let level = i32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let ty = i32::from_ne_bytes([rest[4], rest[5], rest[6], rest[7]]);
        // `at + clen` could wrap on a huge length; the loop condition keeps `len - at`
        // from underflowing.
        if clen < CMSG_HDR || clen > control.len() - at {
            return Err(invalid("malformed control message"));
        }
        let d = &control[at + CMSG_HDR..at + clen];
        let int_at = |o: usize| i32::from_ne_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
        match (level, ty) {
            (SOL_UDP, UDP_GRO) => {
                if d.len() < 4 {
                    return Err(invalid("short UDP_GRO control message"));
                }
                let v = int_at(0);
                if !(1..=65535).contains(&v) {
                    return Err(invalid("bogus UDP_GRO segment size"));
                }
                out.gro = Some(v as usize);
            }
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                // struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
                if d.len() < 12 {
                    return Err(invalid("short IP_PKTINFO control message"));
                }
                out.dst = Some(PktInfo {
                    ip: IpAddr::V4(Ipv4Addr::new(d[4], d[5], d[6], d[7])),
                    ifindex: int_at(0) as u32,
                });
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                // struct in6_pktinfo { in6_addr addr; int ifindex; }
                if d.len() < 20 {
                    return Err(invalid("short IPV6_PKTINFO control message"));
                }
                let mut a = [0u8; 16];
                a.copy_from_slice(&d[..16]);
                let ip = Ipv6Addr::from(a);
                out.dst = Some(PktInfo {
                    ip: ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
                    ifindex: int_at(16) as u32,
                });
            }
            _ => {}
        }
        at += cmsg_align(clen);
    }
    Ok(out)
}

/// Parse a `sockaddr_in`/`sockaddr_in6` from raw bytes (e.g. the name an io_uring
/// multishot recvmsg completion carries); v4-mapped IPv6 comes back as IPv4.
pub fn parse_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    if family == libc::AF_INET && b.len() >= size_of::<libc::sockaddr_in>() {
        let a = b.get(4..8)?;
        Some(SocketAddr::from(([a[0], a[1], a[2], a[3]], port)))
    } else if family == libc::AF_INET6 && b.len() >= size_of::<libc::sockaddr_in6>() {
        let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
        let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
        let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
        let ip = Ipv6Addr::from(ip);
        Some(match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, port)),
            None => SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope)),
        })
    } else {
        None
    }
}

/// The `UDP_GRO` segment size in received control bytes; `Ok(None)`: a single datagram.
pub fn gro_segment_size(control: &[u8]) -> io::Result<Option<usize>> {
    Ok(parse_control(control)?.gro)
}

/// Append one cmsg at `at`; returns the new end, or `None` when it does not fit.
pub(crate) fn push_cmsg(
    control: &mut [u8],
    at: usize,
    level: i32,
    ty: i32,
    data: &[u8],
) -> Option<usize> {
    let clen = CMSG_HDR + data.len();
    let end = at + cmsg_align(clen);
    let c = control.get_mut(at..end)?;
    c.fill(0);
    c[..size_of::<usize>()].copy_from_slice(&clen.to_ne_bytes());
    let rest = &mut c[size_of::<usize>()..];
    rest[..4].copy_from_slice(&level.to_ne_bytes());
    rest[4..8].copy_from_slice(&ty.to_ne_bytes());
    c[CMSG_HDR..clen].copy_from_slice(data);
    Some(end)
}

/// Write the send cmsgs (a `UDP_SEGMENT` size and/or a source address) into `control`
/// (aligned to `size_t`, as [`CmsgBuf`] is); returns the `msg_controllen` to use (0 when
/// nothing fits). For io_uring sendmsg as well as `send_batch`.
pub fn write_send_cmsgs(
    control: &mut [u8],
    segment_size: Option<u16>,
    src: Option<PktInfo>,
) -> usize {
    let mut at = 0;
    if let Some(seg) = segment_size {
        match push_cmsg(control, at, SOL_UDP, UDP_SEGMENT, &seg.to_ne_bytes()) {
            Some(end) => at = end,
            None => return 0,
        }
    }
    let pushed = match src.map(|s| (s.ip, s.ifindex)) {
        Some((IpAddr::V4(ip), ifindex)) => {
            let mut d = [0u8; 12];
            d[..4].copy_from_slice(&(ifindex as i32).to_ne_bytes());
            d[4..8].copy_from_slice(&ip.octets());
            push_cmsg(control, at, libc::IPPROTO_IP, libc::IP_PKTINFO, &d)
        }
        Some((IpAddr::V6(ip), ifindex)) => {
            let mut d = [0u8; 20];
            d[..16].copy_from_slice(&ip.octets());
            d[16..].copy_from_slice(&(ifindex as i32).to_ne_bytes());
            push_cmsg(control, at, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &d)
        }
        None => Some(at),
    };
    pushed.unwrap_or(0)
}

/// Write a `UDP_SEGMENT` cmsg; see [`write_send_cmsgs`].
pub fn write_gso_cmsg(control: &mut [u8], segment_size: u16) -> usize {
    write_send_cmsgs(control, Some(segment_size), None)
}

pub fn to_raw(addr: SocketAddr, v6_socket: bool) -> (RawAddr, libc::socklen_t) {
    let v6 = match addr {
        SocketAddr::V4(a) if !v6_socket => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            return (
                RawAddr { v4: sin },
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
        }
        SocketAddr::V4(a) => SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
        SocketAddr::V6(a) => a,
    };
    let sin6 = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: v6.port().to_be(),
        sin6_flowinfo: v6.flowinfo().to_be(),
        sin6_addr: libc::in6_addr {
            s6_addr: v6.ip().octets(),
        },
        sin6_scope_id: v6.scope_id(),
    };
    (
        RawAddr { v6: sin6 },
        size_of::<libc::sockaddr_in6>() as libc::socklen_t,
    )
}

/// The bytes of `to_raw(addr, v6_socket)` as the kernel would read them (tests, fuzz).
pub fn sockaddr_bytes(addr: SocketAddr, v6_socket: bool) -> ([u8; size_of::<RawAddr>()], usize) {
    let (raw, len) = to_raw(addr, v6_socket);
    let mut out = [0u8; size_of::<RawAddr>()];
    let len = (len as usize).min(out.len());
    // SAFETY: RawAddr is plain old data, initialised by to_raw for at least `len` bytes
    // (the member it wrote); `out` has room for all of it.
    let bytes = unsafe { std::slice::from_raw_parts((&raw as *const RawAddr).cast::<u8>(), len) };
    out[..len].copy_from_slice(bytes);
    (out, len)
}

pub fn from_raw(addr: &RawAddr, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    // SAFETY: both union members start with the family field; RawAddr was zeroed or
    // filled by the kernel, so the bytes are initialised.
    let family = unsafe { addr.v4.sin_family } as libc::c_int;
    if family == libc::AF_INET && len >= size_of::<libc::sockaddr_in>() {
        // SAFETY: the kernel wrote a sockaddr_in (family AF_INET, length checked).
        let a = unsafe { addr.v4 };
        let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
        Some(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(a.sin_port),
        )))
    } else if family == libc::AF_INET6 && len >= size_of::<libc::sockaddr_in6>() {
        // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6, length checked).
        let a = unsafe { addr.v6 };
        let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
        let port = u16::from_be(a.sin6_port);
        Some(match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            None => SocketAddr::V6(SocketAddrV6::new(
                ip,
                port,
                u32::from_be(a.sin6_flowinfo),
                a.sin6_scope_id,
            )),
        })
    } else {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn cmsg_layout_matches_libc() {
        let mut ctrl = CmsgBuf([0; 128]);
        let n = write_gso_cmsg(&mut ctrl.0, 1200);
        // SAFETY: CMSG_SPACE only computes a size.
        assert_eq!(n, unsafe { libc::CMSG_SPACE(2) } as usize);
        // SAFETY: mmsghdr is plain old data.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_control = ctrl.0.as_mut_ptr().cast();
        h.msg_controllen = n as _;
        // SAFETY: the control buffer holds the cmsg we just wrote, within msg_controllen.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            assert!(!c.is_null());
            assert_eq!((*c).cmsg_level, SOL_UDP);
            assert_eq!((*c).cmsg_type, UDP_SEGMENT);
            assert_eq!((*c).cmsg_len as usize, libc::CMSG_LEN(2) as usize);
            assert_eq!(
                std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u16>()),
                1200
            );
        }
        assert_eq!(write_gso_cmsg(&mut [0u8; 8], 1200), 0, "too small");
    }

    /// A GRO cmsg built by hand: `size_t len; int level; int type; int value` + padding.
    pub(crate) fn gro_cmsg(value: i32, len_override: Option<usize>) -> Vec<u8> {
        let clen = CMSG_HDR + 4;
        let mut v = vec![0u8; cmsg_align(clen)];
        v[..size_of::<usize>()].copy_from_slice(&len_override.unwrap_or(clen).to_ne_bytes());
        let o = size_of::<usize>();
        v[o..o + 4].copy_from_slice(&SOL_UDP.to_ne_bytes());
        v[o + 4..o + 8].copy_from_slice(&UDP_GRO.to_ne_bytes());
        v[CMSG_HDR..CMSG_HDR + 4].copy_from_slice(&value.to_ne_bytes());
        v
    }

    #[test]
    fn gro_cmsg_parsing() {
        assert_eq!(gro_segment_size(&[]).expect("empty"), None);
        assert_eq!(
            gro_segment_size(&gro_cmsg(1200, None)).expect("ok"),
            Some(1200)
        );
        // Another cmsg first, then GRO.
        let mut two = gro_cmsg(5, None);
        two[size_of::<usize>() + 4] = 99; // not UDP_GRO
        two.extend_from_slice(&gro_cmsg(1400, None));
        assert_eq!(gro_segment_size(&two).expect("ok"), Some(1400));
        for bad in [0, -1, 70_000] {
            let e = gro_segment_size(&gro_cmsg(bad, None)).expect_err("bogus size");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
        // Lengths that run past the buffer or are shorter than a header.
        assert!(gro_segment_size(&gro_cmsg(1200, Some(500))).is_err());
        assert!(gro_segment_size(&gro_cmsg(1200, Some(3))).is_err());
        assert!(gro_segment_size(&gro_cmsg(1200, Some(CMSG_HDR + 2))).is_err());
        // A length that wraps `offset + length` (found by the udp_cmsg fuzz target: it
        // passed the bounds check and panicked slicing).
        let mut wrap = gro_cmsg(1400, None);
        let at = wrap.len();
        wrap.extend_from_slice(&gro_cmsg(1200, Some(usize::MAX - at + 1)));
        assert!(gro_segment_size(&wrap).is_err());
        wrap.truncate(at);
        wrap.extend_from_slice(&gro_cmsg(1200, Some(usize::MAX)));
        assert!(parse_control(&wrap).is_err());
    }

    #[test]
    fn send_cmsgs_round_trip_through_the_parser() {
        let mut c = CmsgBuf::default();
        let v4 = PktInfo {
            ip: IpAddr::from([10, 1, 2, 3]),
            ifindex: 7,
        };
        let n = write_send_cmsgs(&mut c.0, Some(1400), Some(v4));
        assert!(n > 0);
        // The parser skips UDP_SEGMENT (a send-side cmsg) and reads the pktinfo back.
        let p = parse_control(&c.0[..n]).expect("parse");
        assert_eq!(p.dst, Some(v4));
        let v6 = PktInfo {
            ip: "fd00::5".parse().expect("ip"),
            ifindex: 3,
        };
        let n = write_send_cmsgs(&mut c.0, None, Some(v6));
        assert_eq!(parse_control(&c.0[..n]).expect("parse").dst, Some(v6));
        assert_eq!(
            write_send_cmsgs(&mut [0u8; 30], Some(1), Some(v6)),
            0,
            "too small"
        );
        // Short pktinfo payloads are rejected.
        let mut short = vec![0u8; 64];
        let end = push_cmsg(
            &mut short,
            0,
            libc::IPPROTO_IPV6,
            libc::IPV6_PKTINFO,
            &[0; 8],
        )
        .expect("fits");
        assert!(parse_control(&short[..end]).is_err());
    }

    #[test]
    fn sockaddr_bytes_parse_like_the_kernel_writes_them() {
        for (addr, v6sock) in [
            ("192.0.2.1:51820", false),
            ("192.0.2.1:51820", true),
            ("[fd00::1]:443", true),
        ] {
            let a: SocketAddr = addr.parse().expect("addr");
            let (raw, len) = sockaddr_bytes(a, v6sock);
            let bytes = &raw[..len];
            assert_eq!(parse_sockaddr(bytes), Some(a));
            assert_eq!(parse_sockaddr(&bytes[..bytes.len() - 1]), None, "short");
        }
        assert_eq!(parse_sockaddr(&[0xff; 28]), None, "unknown family");
        assert_eq!(parse_sockaddr(&[]), None);
    }

    #[test]
    fn canonical_and_socket_family() {
        assert_eq!(
            canonical("[::ffff:10.0.0.1]:9".parse().expect("a")),
            "10.0.0.1:9".parse().expect("b")
        );
        let v6: SocketAddr = "[2001:db8::1]:9".parse().expect("a");
        assert_eq!(canonical(v6), v6);
        assert_eq!(
            to_socket_family("10.0.0.1:9".parse().expect("a"), true),
            "[::ffff:10.0.0.1]:9".parse().expect("b")
        );
        assert_eq!(to_socket_family(v6, false), v6);
        // A v4-mapped name as a dual-stack socket writes it decodes canonical.
        let (raw, len) = sockaddr_bytes("192.0.2.7:51820".parse().expect("a"), true);
        assert_eq!(len, size_of::<libc::sockaddr_in6>());
        assert_eq!(
            parse_sockaddr(&raw[..len]),
            Some("192.0.2.7:51820".parse().expect("b"))
        );
    }

    /// What one received message says, for either receive path: GRO size range-checked
    /// (not clamped into a bogus "one datagram"), the local address from PKTINFO.
    #[test]
    fn recv_meta_checks_gro_and_reads_pktinfo() {
        let from: SocketAddr = "192.0.2.1:4000".parse().expect("a");
        let m = recv_meta(3000, 0, Some(from), &gro_cmsg(1200, None)).expect("ok");
        assert_eq!(
            (m.len, m.segment_size, m.segments(), m.dst),
            (3000, 1200, 3, None)
        );
        // A GRO size larger than what arrived: one datagram.
        let m = recv_meta(500, 0, Some(from), &gro_cmsg(1200, None)).expect("ok");
        assert_eq!((m.segment_size, m.segments()), (500, 1));
        for bad in [0, -5, 65_536] {
            assert!(recv_meta(3000, 0, Some(from), &gro_cmsg(bad, None)).is_err());
        }
        assert!(recv_meta(3000, libc::MSG_TRUNC, Some(from), &[]).is_err());
        assert!(recv_meta(3000, libc::MSG_CTRUNC, Some(from), &[]).is_err());
        assert!(recv_meta(3000, 0, None, &[]).is_err(), "unknown family");
        // PKTINFO (v4, then v6 after a GRO cmsg).
        let local = PktInfo {
            ip: IpAddr::from([198, 51, 100, 1]),
            ifindex: 4,
        };
        let mut c = CmsgBuf::default();
        let n = write_send_cmsgs(&mut c.0, None, Some(local));
        let m = recv_meta(100, 0, Some(from), &c.0[..n]).expect("ok");
        assert_eq!((m.dst, m.segment_size), (Some(local), 100));
        let local6 = PktInfo {
            ip: IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 9]),
            ifindex: 2,
        };
        let mut both = gro_cmsg(1000, None);
        let n = write_send_cmsgs(&mut c.0, None, Some(local6));
        both.extend_from_slice(&c.0[..n]);
        let m = recv_meta(2500, 0, Some(from), &both).expect("ok");
        assert_eq!((m.dst, m.segment_size), (Some(local6), 1000));
    }
}
