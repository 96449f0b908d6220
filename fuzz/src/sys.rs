//! The receive-side parsers of `sys/`: control messages and socket addresses
//! (`sys::cmsg`: `parse_control`, `recv_meta`, `parse_sockaddr`, shared by the recvmmsg
//! and io_uring paths), and the io_uring multishot-recvmsg buffer
//! (`uring::parse_recv_buffer`, whose message is then checked by the same `recv_meta`).
//! The bytes come from the kernel, so nothing here is attacker-controlled in practice;
//! the parsers still must not trust a single length.
//!
//! The cmsg parser is checked against a straightforward reference walk written here
//! with the CMSG rules (`size_t cmsg_len; int level; int type;` then data, each cmsg
//! aligned to `size_t`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use riceguard::sys::cmsg;
use riceguard::sys::udp::{self, PktInfo};
use riceguard::sys::uring;

use crate::Bytes;

// Linux values (asm-generic), spelled out so the reference does not share constants
// with the code under test.
const SOL_IP: i32 = 0;
const IP_PKTINFO: i32 = 8;
const SOL_IPV6: i32 = 41;
const IPV6_PKTINFO: i32 = 50;
const SOL_UDP: i32 = 17;
const UDP_SEGMENT: i32 = 103;
const UDP_GRO: i32 = 104;
const MSG_TRUNC: i32 = 0x20;
const MSG_CTRUNC: i32 = 0x08;

const W: usize = std::mem::size_of::<usize>();
const HDR: usize = (W + 8).next_multiple_of(W);

struct Cmsg<'a> {
    level: i32,
    ty: i32,
    data: &'a [u8],
}

/// Walk the cmsgs; the second value is false when the walk stopped at a malformed one
/// (length below the header or past the end). Trailing bytes shorter than a header
/// are ignored, as the kernel's CMSG_NXTHDR does.
fn walk(c: &[u8]) -> (Vec<Cmsg<'_>>, bool) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while c.len() - at >= HDR {
        let mut lb = [0u8; W];
        lb.copy_from_slice(&c[at..at + W]);
        let clen = usize::from_ne_bytes(lb);
        let i32_at = |o: usize| i32::from_ne_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]]);
        if clen < HDR || clen > c.len() - at {
            return (out, false);
        }
        out.push(Cmsg {
            level: i32_at(at + W),
            ty: i32_at(at + W + 4),
            data: &c[at + HDR..at + clen],
        });
        // clen <= len - at, so this cannot overflow; it may step past the end.
        at = (at + clen).next_multiple_of(W).min(c.len());
    }
    (out, true)
}

fn i32_of(d: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

/// What `udp::parse_control` must answer: `None` for an error.
fn expect_udp(c: &[u8]) -> Option<udp::RecvControl> {
    let (msgs, clean) = walk(c);
    let mut out = udp::RecvControl::default();
    for m in &msgs {
        match (m.level, m.ty) {
            (SOL_UDP, UDP_GRO) => {
                let v = i32_of(m.data.get(..4)?, 0);
                if !(1..=65535).contains(&v) {
                    return None;
                }
                out.gro = Some(v as usize);
            }
            (SOL_IP, IP_PKTINFO) => {
                let d = m.data.get(..12)?;
                out.dst = Some(PktInfo {
                    ip: IpAddr::V4(Ipv4Addr::new(d[4], d[5], d[6], d[7])),
                    ifindex: i32_of(d, 0) as u32,
                });
            }
            (SOL_IPV6, IPV6_PKTINFO) => {
                let d = m.data.get(..20)?;
                let mut a = [0u8; 16];
                a.copy_from_slice(&d[..16]);
                let ip = Ipv6Addr::from(a);
                out.dst = Some(PktInfo {
                    ip: ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
                    ifindex: i32_of(d, 16) as u32,
                });
            }
            _ => {}
        }
    }
    clean.then_some(out)
}

/// Append one cmsg with a possibly lying length.
fn push(c: &mut Vec<u8>, level: i32, ty: i32, data: &[u8], len_override: Option<usize>) {
    let clen = HDR + data.len();
    let start = c.len();
    c.extend_from_slice(&len_override.unwrap_or(clen).to_ne_bytes());
    c.extend_from_slice(&level.to_ne_bytes());
    c.extend_from_slice(&ty.to_ne_bytes());
    c.resize(start + HDR, 0);
    c.extend_from_slice(data);
    c.resize(start + clen.next_multiple_of(W), 0);
}

/// Control bytes from the input: raw, or a list of cmsgs of the kinds the kernel
/// sends, with sizes and values from the input (some of them lies).
fn control(b: &mut Bytes<'_>) -> Vec<u8> {
    let mode = b.u8();
    if mode & 0x80 != 0 {
        let n = usize::from(b.u8());
        return b.take(n).to_vec();
    }
    let mut c = Vec::new();
    for _ in 0..(mode & 7) {
        let kind = b.u8();
        let lie = match b.u8() {
            0..=199 => None,
            200..=219 => Some(usize::from(b.u8())),
            220..=239 => Some(usize::MAX - usize::from(b.u8())),
            _ => Some(0x1_0000_0000 + usize::from(b.u8())),
        };
        let (level, ty, data): (i32, i32, Vec<u8>) = match kind % 6 {
            0 => {
                let v = match b.u8() {
                    0..=199 => 1200 + i32::from(b.u8()),
                    200..=229 => i32::from(b.u8()) * 300 - 2,
                    _ => i32::from_ne_bytes([b.u8(), b.u8(), b.u8(), b.u8()]),
                };
                (SOL_UDP, UDP_GRO, v.to_ne_bytes().to_vec())
            }
            1 => (SOL_IP, IP_PKTINFO, b.take(12).to_vec()),
            2 => (SOL_IPV6, IPV6_PKTINFO, b.take(20).to_vec()),
            3 => (SOL_UDP, UDP_SEGMENT, b.take(2).to_vec()),
            4 => {
                let n = usize::from(b.u8() % 24);
                (SOL_UDP, UDP_GRO, b.take(n).to_vec())
            }
            _ => {
                let level = i32::from(b.u8());
                let ty = i32::from(b.u8());
                let n = usize::from(b.u8() % 40);
                (level, ty, b.take(n).to_vec())
            }
        };
        push(&mut c, level, ty, &data, lie);
    }
    // Sometimes cut (the kernel's MSG_CTRUNC case, or a short controllen).
    if mode & 0x40 != 0 {
        let keep = usize::from(b.u8()) % (c.len() + 1);
        c.truncate(keep);
    }
    c
}

fn check_sockaddr(name: &[u8]) {
    let Some(a) = cmsg::parse_sockaddr(name) else {
        return;
    };
    assert_eq!(cmsg::canonical(a), a, "decoded addresses are canonical");
    // Encoding it again (as a dual-stack socket would, and natively) decodes the same.
    for v6_socket in [false, true] {
        let (raw, len) = cmsg::sockaddr_bytes(a, v6_socket);
        let bytes = &raw[..len];
        let back = cmsg::parse_sockaddr(bytes).expect("own encoding decodes");
        assert_eq!(back.ip(), a.ip(), "round trip");
        assert_eq!(back.port(), a.port(), "round trip");
    }
}

/// A received message's control bytes and metadata (`sys::udp`).
pub fn check_cmsg(data: &[u8]) {
    let mut b = Bytes(data);
    let c = control(&mut b);

    let got = udp::parse_control(&c).ok();
    assert_eq!(got, expect_udp(&c), "udp::parse_control vs reference");
    assert_eq!(
        udp::gro_segment_size(&c).ok(),
        got.map(|g| g.gro),
        "gro_segment_size = parse_control().gro"
    );

    // recvmmsg metadata: length, flags and source as the kernel reports them.
    let len = usize::from(u16::from_be_bytes([b.u8(), b.u8()]));
    let fl = b.u8();
    let flags =
        (if fl & 1 != 0 { MSG_TRUNC } else { 0 }) | (if fl & 2 != 0 { MSG_CTRUNC } else { 0 });
    let src: Option<SocketAddr> = match fl >> 6 {
        0 => None,
        1 => Some(SocketAddr::from(([192, 0, 2, b.u8()], 51820))),
        _ => Some(SocketAddr::from((
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(b.u8())],
            443,
        ))),
    };
    match udp::recv_meta(len, flags, src, &c) {
        Ok(m) => {
            assert!(
                flags == 0 && src.is_some() && got.is_some(),
                "accepted a bad message"
            );
            assert_eq!(m.len, len);
            assert_eq!(Some(m.src), src);
            assert_eq!(Some(m.dst), got.map(|g| g.dst));
            if len > 0 {
                assert!(
                    (1..=len).contains(&m.segment_size),
                    "segment size in 1..=len"
                );
                assert_eq!(m.segments(), len.div_ceil(m.segment_size));
                if got.and_then(|g| g.gro).is_none() {
                    assert_eq!(m.segment_size, len, "no GRO: one datagram");
                }
            } else {
                assert_eq!(m.segments(), 0);
            }
        }
        Err(_) => assert!(
            flags != 0 || src.is_none() || got.is_none(),
            "rejected a good message"
        ),
    }

    // Send cmsgs read back: the source address survives, UDP_SEGMENT is skipped.
    let seg = match b.u8() {
        0..=127 => None,
        x => Some(u16::from(x) * 11),
    };
    let spec = b.u8();
    let src = match spec & 3 {
        0 => None,
        1 => Some(PktInfo {
            ip: IpAddr::V4(Ipv4Addr::new(10, b.u8(), b.u8(), 1)),
            ifindex: u32::from(b.u8()),
        }),
        2 => Some(PktInfo {
            ip: IpAddr::V6(Ipv6Addr::new(
                0x2001,
                0xdb8,
                0,
                0,
                0,
                0,
                0,
                u16::from(b.u8()),
            )),
            ifindex: u32::from(b.u8()) << 24,
        }),
        _ => Some(PktInfo {
            ip: IpAddr::V6(Ipv4Addr::new(192, 0, 2, b.u8()).to_ipv6_mapped()),
            ifindex: 3,
        }),
    };
    let room = [8usize, 24, 40, 64, 128][usize::from(spec >> 2) % 5];
    let mut buf = udp::CmsgBuf::default();
    let n = udp::write_send_cmsgs(&mut buf.0[..room], seg, src);
    let need = seg.map_or(0, |_| (HDR + 2).next_multiple_of(W))
        + src.map_or(0, |s| {
            (HDR + if s.ip.is_ipv4() { 12 } else { 20 }).next_multiple_of(W)
        });
    assert_eq!(n, if need <= room { need } else { 0 }, "send cmsg length");
    if n > 0 {
        let back = udp::parse_control(&buf.0[..n]).expect("own cmsgs parse");
        assert_eq!(back.gro, None, "UDP_SEGMENT is not GRO");
        let canon = |p: PktInfo| PktInfo {
            ip: match p.ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(p.ip, IpAddr::V4),
                v4 => v4,
            },
            ..p
        };
        assert_eq!(back.dst, src.map(canon), "pktinfo round trip");
    }

    check_sockaddr(b.0);
}

/// One filled io_uring multishot-recvmsg buffer (`sys::uring`), and what the worker
/// makes of it (datagrams cut at the GRO size).
pub fn check_uring_recv(data: &[u8]) {
    let mut b = Bytes(data);
    let mode = b.u8();
    let fixed =
        uring::RECVMSG_OUT_LEN + uring::RECV_NAME_LEN as usize + uring::RECV_CONTROL_LEN as usize;
    let buf: Vec<u8> = if mode & 0x80 != 0 {
        b.0.to_vec()
    } else {
        // Structured: header fields (mostly sane), name, control, payload.
        let sane = mode & 0x40 == 0;
        let name = match b.u8() % 4 {
            0 => {
                let mut n = vec![0u8; 16];
                n[..2].copy_from_slice(&2u16.to_ne_bytes());
                n[2..4].copy_from_slice(&b.take(2).to_vec().try_into().unwrap_or([0, 1]));
                n[4..8].copy_from_slice(&[192, 0, 2, b.u8()]);
                n
            }
            1 => {
                let mut n = vec![0u8; 28];
                n[..2].copy_from_slice(&10u16.to_ne_bytes());
                n[2..4].copy_from_slice(&[0xca, 0x6c]);
                let mapped = b.u8();
                if mapped & 1 != 0 {
                    n[18..20].copy_from_slice(&[0xff, 0xff]);
                    n[20..24].copy_from_slice(&[10, 0, 0, mapped]);
                } else {
                    n[8..10].copy_from_slice(&[0x20, 0x01]);
                    n[23] = mapped;
                }
                n
            }
            _ => {
                let k = usize::from(b.u8() % 40);
                b.take(k).to_vec()
            }
        };
        let control = control(&mut b);
        let plen = usize::from(u16::from_be_bytes([b.u8(), b.u8()])) % 4096;
        let payload = b.take(plen).to_vec();
        let field = |sane: bool, real: usize, b: &mut Bytes<'_>| -> u32 {
            if sane {
                real as u32
            } else {
                u32::from_ne_bytes([b.u8(), b.u8(), b.u8(), b.u8()])
            }
        };
        let namelen = field(sane, name.len(), &mut b);
        let controllen = field(sane, control.len(), &mut b);
        let payloadlen = field(sane || mode & 1 != 0, payload.len(), &mut b);
        let flags = if mode & 2 != 0 { MSG_TRUNC as u32 } else { 0 };
        let mut v = Vec::with_capacity(fixed + payload.len());
        for x in [namelen, controllen, payloadlen, flags] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        let mut nf = name.clone();
        nf.resize(uring::RECV_NAME_LEN as usize, 0);
        v.extend_from_slice(&nf);
        let mut cf = control.clone();
        cf.truncate(uring::RECV_CONTROL_LEN as usize);
        cf.resize(uring::RECV_CONTROL_LEN as usize, 0);
        v.extend_from_slice(&cf);
        v.extend_from_slice(&payload);
        if mode & 4 != 0 {
            let keep = usize::from(b.u8()) * 2;
            v.truncate(keep.min(v.len()));
        }
        v
    };

    let Some(m) = uring::parse_recv_buffer(&buf) else {
        assert!(buf.len() < fixed, "a buffer holding the fixed part parses");
        return;
    };
    assert!(buf.len() >= fixed);
    let hdr = |i: usize| {
        u32::from_ne_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]]) as usize
    };
    let (namelen, controllen, payloadlen, flags) = (hdr(0), hdr(1), hdr(2), hdr(3));
    let name_at = uring::RECVMSG_OUT_LEN;
    let control_at = name_at + uring::RECV_NAME_LEN as usize;
    let name = &buf[name_at..name_at + namelen.min(uring::RECV_NAME_LEN as usize)];
    assert_eq!(
        m.from,
        cmsg::parse_sockaddr(name),
        "source from the name field"
    );
    check_sockaddr(name);
    let want_c = &buf[control_at..control_at + controllen.min(uring::RECV_CONTROL_LEN as usize)];
    assert_eq!(m.control, want_c, "control slice");
    let want_p = &buf[fixed..fixed + payloadlen.min(buf.len() - fixed)];
    assert_eq!(m.payload, want_p, "payload slice");
    assert_eq!(m.truncated, flags as i32 & MSG_TRUNC != 0);

    // The worker: the message checked exactly as a recvmmsg one (same function, same
    // verdict), then the payload cut at the GRO size into datagrams.
    let flags = flags as i32 & (MSG_TRUNC | MSG_CTRUNC);
    let meta = m.meta().ok();
    assert_eq!(
        meta,
        udp::recv_meta(m.payload.len(), flags, m.from, m.control).ok(),
        "io_uring and recvmmsg messages are judged alike"
    );
    let Some(meta) = meta else {
        return;
    };
    assert_eq!(meta.len, m.payload.len());
    let seg = meta.segment_size;
    if m.payload.is_empty() {
        return;
    }
    assert!(
        (1..=m.payload.len()).contains(&seg),
        "segment size in 1..=len"
    );
    let mut total = 0;
    let mut count = 0;
    for d in m.payload.chunks(seg) {
        assert!(!d.is_empty() && d.len() <= seg);
        total += d.len();
        count += 1;
    }
    assert_eq!(total, m.payload.len());
    assert_eq!(count, meta.segments());
}
