use std::net::SocketAddr;

use super::checksum::{addr_ranges, be16, be32, fill_l4_checksum, fix_ipv4_checksum, put16};
use super::*;

/// Independent checksum: 16-bit words one by one, folded at every step.
fn naive_csum(parts: &[&[u8]]) -> u16 {
    let mut bytes = Vec::new();
    for p in parts {
        bytes.extend_from_slice(p);
    }
    if bytes.len() % 2 == 1 {
        bytes.push(0);
    }
    let mut s: u32 = 0;
    for w in bytes.chunks(2) {
        s += u32::from(w[0]) << 8 | u32::from(w[1]);
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn pseudo(ip: &[u8], v6: bool, proto: u8, l4_len: usize) -> Vec<u8> {
    let mut v = Vec::new();
    if v6 {
        v.extend_from_slice(&ip[8..40]);
        v.extend_from_slice(&(l4_len as u32).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, proto]);
    } else {
        v.extend_from_slice(&ip[12..20]);
        v.extend_from_slice(&[0, proto]);
        v.extend_from_slice(&(l4_len as u16).to_be_bytes());
    }
    v
}

/// Assert `ip` is a well-formed packet with correct IP and L4 checksums.
fn assert_valid(ip: &[u8]) {
    let v6 = ip[0] >> 4 == 6;
    let (l3, proto) = if v6 {
        assert_eq!(usize::from(be16(ip, 4)) + 40, ip.len(), "v6 payload len");
        (40, ip[6])
    } else {
        assert_eq!(usize::from(be16(ip, 2)), ip.len(), "v4 total len");
        let ihl = usize::from(ip[0] & 15) * 4;
        assert_eq!(naive_csum(&[&ip[..ihl]]), 0, "v4 header checksum");
        (ihl, ip[9])
    };
    if proto == PROTO_UDP {
        assert_eq!(usize::from(be16(ip, l3 + 4)), ip.len() - l3, "udp len");
    }
    let ph = pseudo(ip, v6, proto, ip.len() - l3);
    assert_eq!(naive_csum(&[&ph, &ip[l3..]]), 0, "l4 checksum");
}

struct Pkt {
    v6: bool,
    proto: u8,
    payload: Vec<u8>,
    seq: u32,
    ack: u32,
    flags: u8,
    tcp_opts: Vec<u8>,
    id: u16,
    sport: u16,
}

impl Pkt {
    fn tcp(v6: bool, seq: u32, payload: Vec<u8>) -> Self {
        Pkt {
            v6,
            proto: PROTO_TCP,
            payload,
            seq,
            ack: 1000,
            flags: TCP_ACK,
            tcp_opts: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], // NOP NOP TS
            id: 0x4242,
            sport: 40000,
        }
    }
    fn udp(v6: bool, payload: Vec<u8>) -> Self {
        Pkt {
            proto: PROTO_UDP,
            tcp_opts: Vec::new(),
            ..Pkt::tcp(v6, 0, payload)
        }
    }
    fn l4h(&self) -> usize {
        if self.proto == PROTO_TCP {
            20 + self.tcp_opts.len()
        } else {
            8
        }
    }
    /// A complete packet with valid checksums.
    fn build(&self) -> Vec<u8> {
        let l3 = if self.v6 { 40 } else { 20 };
        let total = l3 + self.l4h() + self.payload.len();
        let mut p = vec![0u8; total];
        if self.v6 {
            p[0] = 0x60;
            p[1] = 0x01; // flow label bits, must survive
            put16(&mut p, 4, (total - 40) as u16);
            p[6] = self.proto;
            p[7] = 64;
            p[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            p[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        } else {
            p[0] = 0x45;
            put16(&mut p, 2, total as u16);
            put16(&mut p, 4, self.id);
            p[6] = 0x40; // DF
            p[8] = 64;
            p[9] = self.proto;
            p[12..16].copy_from_slice(&[10, 0, 0, 1]);
            p[16..20].copy_from_slice(&[10, 0, 0, 2]);
            fix_ipv4_checksum(&mut p, 20);
        }
        put16(&mut p, l3, self.sport);
        put16(&mut p, l3 + 2, 443);
        if self.proto == PROTO_TCP {
            p[l3 + 4..l3 + 8].copy_from_slice(&self.seq.to_be_bytes());
            p[l3 + 8..l3 + 12].copy_from_slice(&self.ack.to_be_bytes());
            p[l3 + 12] = ((self.l4h() / 4) as u8) << 4;
            p[l3 + 13] = self.flags;
            put16(&mut p, l3 + 14, 502);
            p[l3 + 20..l3 + self.l4h()].copy_from_slice(&self.tcp_opts);
        } else {
            put16(&mut p, l3 + 4, (total - l3) as u16);
        }
        let h = l3 + self.l4h();
        p[h..].copy_from_slice(&self.payload);
        fill_l4_checksum(&mut p, self.v6, l3, self.proto);
        p
    }
    /// As the kernel hands it to a TUN: vnet header + super-packet with a partial
    /// (pseudo-header) checksum.
    fn build_gso(&self, gso_size: u16) -> Vec<u8> {
        let mut ip = self.build();
        let l3 = if self.v6 { 40 } else { 20 };
        let off = if self.proto == PROTO_TCP { 16 } else { 6 };
        let (s, d) = addr_ranges(self.v6);
        let ph = checksum::pseudo_header(&ip[s], &ip[d], self.proto, ip.len() - l3);
        put16(&mut ip, l3 + off, checksum::fold(ph));
        let gso_type = match (self.proto, self.v6) {
            (PROTO_TCP, false) => GsoType::TcpV4,
            (PROTO_TCP, true) => GsoType::TcpV6,
            _ => GsoType::UdpL4,
        };
        let mut out = vec![0u8; VIRTIO_NET_HDR_LEN];
        VirtioNetHdrRepr {
            flags: FLAG_NEEDS_CSUM,
            gso_type,
            ecn: false,
            hdr_len: (l3 + self.l4h()) as u16,
            gso_size,
            csum_start: l3 as u16,
            csum_offset: off as u16,
        }
        .emit_into(&mut out)
        .expect("room");
        out.extend_from_slice(&ip);
        out
    }
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

fn split_all(buf: &[u8]) -> Result<Vec<Vec<u8>>, GsoError> {
    let mut s = Splitter::new(buf)?;
    let mut out = Vec::new();
    let mut seg = vec![0u8; 65536];
    while let Some(r) = s.next_into(&mut seg) {
        let n = r?;
        out.push(seg[..n].to_vec());
    }
    Ok(out)
}

#[test]
fn checksum_matches_naive_on_odd_lengths() {
    let all_ff = vec![0xffu8; 4096];
    for n in (0..200).chain([1501, 4095, 65535]) {
        let d = payload(n);
        assert_eq!(
            !checksum::fold(checksum::sum(&d, 0)),
            naive_csum(&[&d]),
            "len {n}"
        );
        // With a starting sum (a pseudo header) and data that carries a lot.
        let ph = [0xffu8, 0xff, 0xff, 0xfe, 0, 17, 0x12, 0x34];
        let start = checksum::sum(&ph, 0);
        assert_eq!(
            !checksum::fold(checksum::sum(&d, start)),
            naive_csum(&[&ph, &d])
        );
        let f = &all_ff[..n.min(all_ff.len())];
        let pre = &all_ff[..64];
        let start = checksum::sum(pre, 0);
        assert_eq!(
            !checksum::fold(checksum::sum(f, start)),
            naive_csum(&[pre, f]),
            "ff {n}"
        );
    }
}

#[test]
fn header_round_trip_and_checks() {
    let repr = VirtioNetHdrRepr {
        flags: FLAG_NEEDS_CSUM,
        gso_type: GsoType::TcpV6,
        ecn: true,
        hdr_len: 72,
        gso_size: 1428,
        csum_start: 40,
        csum_offset: 16,
    };
    let mut b = [0u8; 10];
    repr.emit_into(&mut b).expect("room");
    assert_eq!(b[1], 4 | GSO_ECN);
    let h = VirtioNetHdr::new_checked(&b[..]).expect("len");
    assert_eq!(VirtioNetHdrRepr::parse(&h), Ok(repr));
    assert!(matches!(
        VirtioNetHdr::new_checked(&b[..9]),
        Err(GsoError::Truncated)
    ));
    b[1] = 3; // UFO: not supported
    let h = VirtioNetHdr::new_checked(&b[..]).expect("len");
    assert_eq!(
        VirtioNetHdrRepr::parse(&h),
        Err(GsoError::UnknownGsoType(3))
    );
    assert!(repr.emit_into(&mut [0u8; 4]).is_err());
}

#[test]
fn split_tcp_v4_with_short_last() {
    let mut p = Pkt::tcp(false, 0xffff_f000, payload(1448 * 3 + 100));
    p.flags = TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR;
    let segs = split_all(&p.build_gso(1448)).expect("split");
    assert_eq!(segs.len(), 4);
    let l4 = 20 + 20 + 12;
    for (i, s) in segs.iter().enumerate() {
        assert_valid(s);
        let last = i == 3;
        assert_eq!(s.len(), l4 + if last { 100 } else { 1448 });
        assert_eq!(be16(s, 4), 0x4242 + i as u16, "ip id");
        assert_eq!(
            be32(s, 24),
            0xffff_f000u32.wrapping_add(1448 * i as u32),
            "seq wraps"
        );
        let flags = s[33];
        assert_eq!(flags & (TCP_FIN | TCP_PSH) != 0, last);
        assert_eq!(flags & TCP_CWR != 0, i == 0);
        assert_eq!(
            &s[l4..],
            &p.payload[i * 1448..(i * 1448 + 1448).min(p.payload.len())]
        );
    }
}

#[test]
fn split_tcp_v6_and_udp_both_versions() {
    let p = Pkt::tcp(true, 7, payload(1000 * 5));
    let segs = split_all(&p.build_gso(1000)).expect("split v6");
    assert_eq!(segs.len(), 5);
    segs.iter().for_each(|s| assert_valid(s));
    for v6 in [false, true] {
        let p = Pkt::udp(v6, payload(1200 * 9 + 1));
        let segs = split_all(&p.build_gso(1200)).expect("split udp");
        assert_eq!(segs.len(), 10);
        assert_eq!(segs[9].len(), if v6 { 40 } else { 20 } + 8 + 1);
        segs.iter().for_each(|s| assert_valid(s));
    }
}

#[test]
fn plain_packet_with_partial_checksum_is_finished() {
    for (v6, proto) in [
        (false, PROTO_TCP),
        (true, PROTO_TCP),
        (false, PROTO_UDP),
        (true, PROTO_UDP),
    ] {
        let p = if proto == PROTO_TCP {
            Pkt::tcp(v6, 1, payload(333))
        } else {
            Pkt::udp(v6, payload(333))
        };
        let mut buf = p.build_gso(2000); // payload below gso_size...
        buf[1] = 0; // ...and GSO_NONE: just "finish my checksum"
        let segs = split_all(&buf).expect("plain");
        assert_eq!(segs.len(), 1);
        assert_valid(&segs[0]);
        assert_eq!(segs[0], p.build(), "same as a fully checksummed packet");
    }
    // No NEEDS_CSUM: passed through untouched.
    let p = Pkt::udp(false, payload(10));
    let mut buf = vec![0u8; 10];
    buf.extend_from_slice(&p.build());
    assert_eq!(split_all(&buf).expect("plain"), vec![p.build()]);
}

#[test]
fn plain_packets_are_finished_in_place_as_next_into_would() {
    for v6 in [false, true] {
        for p in [Pkt::tcp(v6, 7, payload(500)), Pkt::udp(v6, payload(333))] {
            let mut buf = p.build_gso(2000);
            buf[1] = 0; // GSO_NONE with NEEDS_CSUM
            let s = Splitter::new(&buf).expect("plain");
            let csum = s.plain().expect("not GSO");
            assert!(csum.is_some());
            let mut ip = buf[VIRTIO_NET_HDR_LEN..].to_vec();
            finish_checksum(&mut ip, csum);
            assert_valid(&ip);
            assert_eq!(ip, p.build());
        }
    }
    // A super-packet is not plain.
    let gso = Pkt::tcp(false, 1, payload(3000)).build_gso(1000);
    assert_eq!(Splitter::new(&gso).expect("gso").plain(), None);
}

#[test]
fn malformed_headers_are_errors() {
    let good = Pkt::tcp(false, 1, payload(3000)).build_gso(1000);
    let bad = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        split_all(&b).expect_err("must be rejected")
    };
    assert_eq!(bad(&|b| b.truncate(5)), GsoError::Truncated);
    assert_eq!(bad(&|b| b.truncate(10)), GsoError::Truncated);
    assert_eq!(bad(&|b| b[1] = 9), GsoError::UnknownGsoType(9));
    assert_eq!(bad(&|b| b[1] = 4), GsoError::IpVersion); // TCPV6 on a v4 packet
    assert_eq!(
        bad(&|b| b[4..6].copy_from_slice(&0u16.to_ne_bytes())),
        GsoError::ZeroGsoSize
    );
    assert!(matches!(
        bad(&|b| b[6..8].copy_from_slice(&60000u16.to_ne_bytes())),
        GsoError::ChecksumOffsets { .. }
    ));
    assert!(matches!(
        bad(&|b| b[8..10].copy_from_slice(&6u16.to_ne_bytes())),
        GsoError::ChecksumOffsets { .. }
    ));
    assert_eq!(bad(&|b| b[10 + 9] = 17), GsoError::Protocol);
    assert_eq!(bad(&|b| b[10 + 32] = 0x30), GsoError::TcpHeaderLen);
    assert_eq!(bad(&|b| b.truncate(10 + 52)), GsoError::EmptyPayload);
    assert_eq!(bad(&|b| b.truncate(10 + 30)), GsoError::Truncated);
    assert_eq!(bad(&|b| b[10] = 0x75), GsoError::IpVersion);
    // Plain packet whose checksum offset points past the end.
    let mut plain = vec![1u8, 0, 0, 0, 0, 0];
    plain.extend_from_slice(&500u16.to_ne_bytes());
    plain.extend_from_slice(&16u16.to_ne_bytes());
    plain.extend_from_slice(&Pkt::udp(false, payload(10)).build());
    assert!(matches!(
        split_all(&plain),
        Err(GsoError::ChecksumOffsets { .. })
    ));
    // Too small an output buffer is an error, and the splitter stops.
    let mut s = Splitter::new(&good).expect("ok");
    assert!(matches!(
        s.next_into(&mut [0u8; 100]),
        Some(Err(GsoError::BufferTooSmall { .. }))
    ));
    assert!(s.next_into(&mut [0u8; 2000]).is_none());
}

#[test]
fn fuzzish_garbage_never_panics() {
    // Deterministic pseudo-random bytes through the splitter and the coalescer.
    let mut x: u32 = 0x1234_5678;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let good = Pkt::tcp(false, 1, payload(3000)).build_gso(1000);
    let mut out = vec![0u8; 70_000];
    let mut c = Coalescer::new(CoalesceOptions {
        tcp: true,
        udp: true,
    });
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..(next() % 6) {
            let at = next() as usize % b.len();
            b[at] = next() as u8;
        }
        b.truncate(next() as usize % (b.len() + 1));
        if let Ok(mut s) = Splitter::new(&b) {
            while let Some(r) = s.next_into(&mut out) {
                if r.is_err() {
                    break;
                }
            }
        }
        let pkts = [&b[10.min(b.len())..], &b[..]];
        c.plan(&pkts);
        for g in c.groups().collect::<Vec<_>>() {
            let _ = c.write(&g, &pkts, &mut out);
        }
    }
}

fn coalesce(opts: CoalesceOptions, pkts: &[Vec<u8>]) -> Vec<(Vec<usize>, Vec<u8>)> {
    let mut c = Coalescer::new(opts);
    assert_eq!(c.plan(pkts), pkts.len());
    let mut out = Vec::new();
    let mut buf = vec![0u8; VIRTIO_NET_HDR_LEN + MAX_IP_PACKET];
    for g in c.groups().collect::<Vec<_>>() {
        let n = c.write(&g, pkts, &mut buf).expect("write");
        assert_eq!(n, g.len);
        out.push((c.members(&g).collect(), buf[..n].to_vec()));
    }
    out
}

const BOTH: CoalesceOptions = CoalesceOptions {
    tcp: true,
    udp: true,
};

#[test]
fn split_then_coalesce_round_trips() {
    for v6 in [false, true] {
        for (p, gso) in [
            (Pkt::tcp(v6, 99, payload(1448 * 7 + 5)), 1448u16),
            (Pkt::tcp(v6, 99, payload(1448 * 7)), 1448),
            (Pkt::udp(v6, payload(1200 * 4 + 1)), 1200),
        ] {
            let orig = p.build_gso(gso);
            let segs = split_all(&orig).expect("split");
            let merged = coalesce(BOTH, &segs);
            assert_eq!(merged.len(), 1, "one super-packet");
            let (members, buf) = &merged[0];
            assert_eq!(members.len(), segs.len());
            // Same header values and the same bytes (the IPv4 ID is the first one's).
            let h = VirtioNetHdrRepr::parse(&VirtioNetHdr::new_checked(&buf[..]).expect("h"))
                .expect("p");
            let o = VirtioNetHdrRepr::parse(&VirtioNetHdr::new_checked(&orig[..]).expect("h"))
                .expect("p");
            assert_eq!(h, o);
            assert_eq!(buf[10..], orig[10..], "v6={v6} proto={}", p.proto);
            // And what the kernel would do with it gives the same segments back.
            assert_eq!(split_all(buf).expect("resplit"), segs);
        }
    }
}

#[test]
fn coalesce_rules() {
    let tcp = |seq: u32, n: usize| Pkt::tcp(false, seq, payload(n));
    // Gap in sequence numbers: two groups.
    let pk = vec![
        tcp(0, 100).build(),
        tcp(100, 100).build(),
        tcp(300, 100).build(),
    ];
    let g = coalesce(BOTH, &pk);
    assert_eq!(
        g.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
        vec![vec![0, 1], vec![2]]
    );
    // A short segment ends the group; a larger one after it starts a new one.
    let pk = vec![
        tcp(0, 100).build(),
        tcp(100, 50).build(),
        tcp(150, 100).build(),
    ];
    assert_eq!(coalesce(BOTH, &pk).len(), 2);
    // PSH ends the group (and is kept on the merged packet).
    let mut psh = tcp(100, 100);
    psh.flags |= TCP_PSH;
    let pk = vec![tcp(0, 100).build(), psh.build(), tcp(200, 100).build()];
    let g = coalesce(BOTH, &pk);
    assert_eq!(g[0].0, vec![0, 1]);
    assert_ne!(g[0].1[10 + 33] & TCP_PSH, 0);
    // Different ACK, options, TTL or flow: separate.
    let mut other_ack = tcp(100, 100);
    other_ack.ack += 1;
    let mut other_opts = tcp(100, 100);
    other_opts.tcp_opts[11] = 9;
    let mut other_port = tcp(100, 100);
    other_port.sport = 1;
    for q in [other_ack, other_opts, other_port] {
        assert_eq!(coalesce(BOTH, &[tcp(0, 100).build(), q.build()]).len(), 2);
    }
    // A window update is not merged away (found by the coalesce fuzz target: the
    // re-split segment carried the head's window).
    let mut win = tcp(100, 100).build();
    win[20 + 14..20 + 16].copy_from_slice(&512u16.to_be_bytes());
    fill_l4_checksum(&mut win, false, 20, PROTO_TCP);
    let g = coalesce(BOTH, &[tcp(0, 100).build(), win.clone()]);
    assert_eq!(g.len(), 2);
    assert_eq!(&g[1].1[10..], &win[..]);
    // Nor are the reserved/AE bits of one segment (also found by the fuzz target).
    let mut ae = tcp(100, 100).build();
    ae[20 + 12] |= 0x01;
    fill_l4_checksum(&mut ae, false, 20, PROTO_TCP);
    let g = coalesce(BOTH, &[tcp(0, 100).build(), ae.clone()]);
    assert_eq!(g.len(), 2);
    assert_eq!(&g[1].1[10..], &ae[..]);
    let mut ttl = tcp(100, 100).build();
    ttl[8] = 3;
    fix_ipv4_checksum(&mut ttl, 20);
    assert_eq!(coalesce(BOTH, &[tcp(0, 100).build(), ttl]).len(), 2);
    // A SYN/FIN or pure ACK passes through and closes the flow's group, so later
    // segments never jump ahead of it.
    let mut fin = tcp(200, 0);
    fin.flags = TCP_ACK | TCP_FIN;
    let pk = vec![
        tcp(0, 100).build(),
        tcp(100, 100).build(),
        fin.build(),
        tcp(200, 100).build(),
    ];
    let g = coalesce(BOTH, &pk);
    assert_eq!(
        g.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
        vec![vec![0, 1], vec![2], vec![3]]
    );
    // Bad checksum: passed through untouched for the kernel to drop.
    let mut badsum = tcp(100, 100).build();
    badsum[60] ^= 0xff;
    let g = coalesce(BOTH, &[tcp(0, 100).build(), badsum.clone()]);
    assert_eq!(g.len(), 2);
    assert_eq!(&g[1].1[10..], &badsum[..]);
    assert_eq!(&g[1].1[..10], &[0u8; 10], "GSO_NONE header");
    // So is a bad IPv4 header checksum, at the head of a train or after it: merged,
    // the head's header would have been rewritten with a valid checksum (found by
    // the coalesce fuzz target).
    let mut badhdr = tcp(0, 100).build();
    badhdr[10] ^= 0x01;
    let g = coalesce(
        BOTH,
        &[badhdr.clone(), tcp(100, 100).build(), tcp(200, 100).build()],
    );
    assert_eq!(
        g.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![1, 2]]
    );
    assert_eq!(&g[0].1[10..], &badhdr[..]);
    let mut badhdr = tcp(100, 100).build();
    badhdr[10] ^= 0x01;
    assert_eq!(coalesce(BOTH, &[tcp(0, 100).build(), badhdr]).len(), 2);
    // TCP off: nothing merges.
    let off = CoalesceOptions {
        tcp: false,
        udp: true,
    };
    assert_eq!(
        coalesce(off, &[tcp(0, 100).build(), tcp(100, 100).build()]).len(),
        2
    );
}

#[test]
fn interleaved_flows_and_udp_rules() {
    let a = |seq| Pkt::tcp(true, seq, payload(500)).build();
    let b = |seq| {
        let mut p = Pkt::tcp(true, seq, payload(500));
        p.sport = 5;
        p.build()
    };
    let pk = vec![a(0), b(0), a(500), b(500), a(1000)];
    let g = coalesce(BOTH, &pk);
    assert_eq!(
        g.iter().map(|g| g.0.clone()).collect::<Vec<_>>(),
        vec![vec![0, 2, 4], vec![1, 3]]
    );
    for (_, buf) in &g {
        assert_eq!(split_all(buf).expect("resplit").len(), buf.len() / 500);
    }
    // UDP: only with USO; a zero checksum never merges.
    let u = |n| Pkt::udp(false, payload(n)).build();
    assert_eq!(
        coalesce(
            CoalesceOptions {
                tcp: true,
                udp: false
            },
            &[u(100), u(100)]
        )
        .len(),
        2
    );
    assert_eq!(coalesce(BOTH, &[u(100), u(100), u(40)])[0].0, vec![0, 1, 2]);
    let mut nosum = u(100);
    nosum[26] = 0;
    nosum[27] = 0;
    assert_eq!(coalesce(BOTH, &[u(100), nosum]).len(), 2);
    // Non-IP junk and fragments pass through.
    let mut frag = u(100);
    frag[6] |= 0x20;
    fix_ipv4_checksum(&mut frag, 20);
    assert_eq!(coalesce(BOTH, &[vec![0x45, 1, 2], frag, vec![]]).len(), 3);
}

#[test]
fn coalesce_stops_at_64k() {
    let pk: Vec<Vec<u8>> = (0..60u32)
        .map(|i| Pkt::tcp(false, i * 1400, payload(1400)).build())
        .collect();
    let g = coalesce(BOTH, &pk);
    assert_eq!(g.len(), 2);
    assert!(g
        .iter()
        .all(|(_, b)| b.len() <= VIRTIO_NET_HDR_LEN + MAX_IP_PACKET));
    assert_eq!(g[0].0.len(), (65535 - 52) / 1400);
    let mut buf = [0u8; 100];
    let mut c = Coalescer::new(BOTH);
    c.plan(&pk);
    let first = c.groups().next().expect("group");
    assert!(matches!(
        c.write(&first, &pk, &mut buf),
        Err(GsoError::BufferTooSmall { .. })
    ));
}

#[test]
fn gso_batch_planning() {
    let dst: SocketAddr = "192.0.2.1:51820".parse().expect("addr");
    let mut b = GsoBatch::new(dst, 64);
    assert!(b.finish().is_none());
    for _ in 0..3 {
        assert!(b.push(1200));
    }
    assert!(!b.can_push(1300), "larger than the segment size");
    assert!(b.push(700));
    assert!(!b.can_push(700), "nothing after a short one");
    let t = b.finish().expect("planned");
    assert_eq!(
        t,
        PlannedSend {
            destination: dst,
            size: 4300,
            segment_size: 1200
        }
    );
    assert_eq!(t.segments(), 4);
    assert!(b.is_empty());
    // 64 segments at most.
    for _ in 0..64 {
        assert!(b.push(100));
    }
    assert!(!b.can_push(100));
    // 65507 bytes at most for IPv4.
    let mut b = GsoBatch::new(dst, 64);
    let mut n = 0;
    while b.push(1500) {
        n += 1;
    }
    assert_eq!(n, 65507 / 1500);
    assert!(b.size() <= 65507);
    // Without GSO every send is one datagram.
    let mut b = GsoBatch::new(dst, 1);
    assert!(b.push(1200) && !b.can_push(1200));
    assert!(!GsoBatch::new(dst, 64).can_push(0));
    assert!(!GsoBatch::new(dst, 64).can_push(70_000));
}
