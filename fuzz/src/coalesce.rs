//! The GRO coalescer of the TUN write side (`core::gso::Coalescer`), fed decrypted
//! packets described by the fuzz input.
//!
//! Random bytes almost never make a TCP/UDP packet with valid checksums, so the input
//! *describes* packets (flow, protocol, IP version, payload length, sequence step, TCP
//! flags, window, IPv4 ID) which are built with correct lengths and checksums, and then
//! optionally corrupted (a byte flipped, with or without fixing the checksums again).
//! Raw packets from the input are mixed in too.
//!
//! Invariants:
//! - `plan` partitions the packets it looked at: every input index is in exactly one
//!   group, groups are in order of their first packet, members ascend.
//! - `write` produces exactly `Group::len` bytes, at most a virtio header plus 65535.
//! - A group of one is the input packet unchanged behind an all-zero virtio header.
//! - A merged group has a consistent `virtio_net_hdr` (NEEDS_CSUM, the GSO type of its
//!   protocol and IP version, `csum_start`/`csum_offset`/`hdr_len` of its headers,
//!   `gso_size` = the first member's payload, every member but the last exactly that
//!   long, the last not longer) and what the kernel makes of it — the `Splitter` does
//!   what the kernel's GSO does — is exactly the members again, up to the fields
//!   segmentation rewrites by design: the IPv4 ID (incrementing from the first
//!   member's), the IPv4 header checksum and the L4 checksum (recomputed; both must be
//!   valid on every re-split segment and must have been valid on every member) and
//!   the TCP urgent pointer (meaningless: URG is never set on a merged segment).

use riceguard::core::gso::{
    checksum, CoalesceOptions, Coalescer, GsoType, Splitter, VirtioNetHdr, VirtioNetHdrRepr,
    FLAG_NEEDS_CSUM, MAX_BATCH, MAX_IP_PACKET, VIRTIO_NET_HDR_LEN,
};

use crate::Bytes;

const TCP: u8 = 6;
const UDP: u8 = 17;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// IP version, L3 header length and L4 protocol of a packet the builder made (or that
/// at least looks like one); `None` for anything else.
fn layout(p: &[u8]) -> Option<(bool, usize, u8)> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            (20..=p.len()).contains(&ihl).then_some((false, ihl, p[9]))
        }
        6 if p.len() >= 40 => Some((true, 40, p[6])),
        _ => None,
    }
}

fn ipv4_header_ok(p: &[u8], ihl: usize) -> bool {
    p.len() >= ihl && checksum::fold(checksum::sum(&p[..ihl], 0)) == 0xffff
}

fn l4_ok(p: &[u8], v6: bool, l3: usize, proto: u8) -> bool {
    let (s, d) = if v6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    };
    let ph = checksum::pseudo_header(&p[s], &p[d], proto, p.len() - l3);
    checksum::fold(checksum::sum(&p[l3..], ph)) == 0xffff
}

fn fix_checksums(p: &mut [u8]) {
    let Some((v6, l3, proto)) = layout(p) else {
        return;
    };
    if !v6 {
        put16(p, 10, 0);
        let c = !checksum::fold(checksum::sum(&p[..l3], 0));
        put16(p, 10, c);
    }
    let at = match proto {
        TCP if p.len() >= l3 + 20 => l3 + 16,
        UDP if p.len() >= l3 + 8 => l3 + 6,
        _ => return,
    };
    put16(p, at, 0);
    let (s, d) = if v6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    };
    let ph = checksum::pseudo_header(&p[s], &p[d], proto, p.len() - l3);
    let mut c = !checksum::fold(checksum::sum(&p[l3..], ph));
    if proto == UDP && c == 0 {
        c = 0xffff;
    }
    put16(p, at, c);
}

/// Per-flow sender state, so consecutive descriptions make mergeable trains.
#[derive(Clone, Copy, Default)]
struct Flow {
    seq: u32,
    id: u16,
}

/// Build one packet from its description.
fn build(b: &mut Bytes<'_>, flows: &mut [Flow; 4]) -> Vec<u8> {
    let kind = b.u8();
    if kind & 0xe0 == 0xe0 {
        // Raw bytes from the input, length-prefixed.
        let n = usize::from(b.u8()) * 4;
        return b.take(n).to_vec();
    }
    let v6 = kind & 1 != 0;
    let proto = if kind & 2 != 0 { UDP } else { TCP };
    let fi = usize::from((kind >> 2) & 3);
    // Payload: mostly the same size within a flow (mergeable), sometimes other sizes.
    let plen = match b.u8() {
        0..=159 => 1000 + fi * 8,
        160..=199 => usize::from(b.u8()) * 4,
        200..=239 => usize::from(b.u8()),
        240..=249 => usize::from(u16::from_be_bytes([b.u8(), b.u8()])) % 9000,
        _ => 0,
    };
    let step = b.u8();
    let tcp_opts: &[u8] = if kind & 0x10 != 0 {
        &[]
    } else {
        &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]
    };
    let l3 = if v6 { 40 } else { 20 };
    let l4h = if proto == TCP { 20 + tcp_opts.len() } else { 8 };
    let total = l3 + l4h + plen;
    if total > MAX_IP_PACKET {
        return Vec::new();
    }
    let mut p = vec![0u8; total];
    let f = &mut flows[fi];
    if v6 {
        p[0] = 0x60;
        p[1] = if step & 0x40 != 0 { 0x02 } else { 0x01 };
        put16(&mut p, 4, (total - 40) as u16);
        p[6] = proto;
        p[7] = if step & 0x20 != 0 { 63 } else { 64 };
        p[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        p[0] = 0x45;
        p[1] = if step & 0x40 != 0 { 0x10 } else { 0 };
        put16(&mut p, 2, total as u16);
        // IPv4 ID: incrementing per flow, or anything.
        let id = if step & 0x10 != 0 {
            u16::from(b.u8())
        } else {
            f.id
        };
        f.id = f.id.wrapping_add(1);
        put16(&mut p, 4, id);
        p[6] = if step & 0x08 != 0 { 0 } else { 0x40 }; // DF
        p[8] = if step & 0x20 != 0 { 63 } else { 64 };
        p[9] = proto;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    }
    put16(&mut p, l3, 40000 + fi as u16);
    put16(&mut p, l3 + 2, 443);
    if proto == TCP {
        // Sequence: the flow's next (mergeable), a gap, or a repeat.
        let seq = match step & 3 {
            0 | 1 => f.seq,
            2 => f.seq.wrapping_add(u32::from(b.u8()) + 1),
            _ => f.seq.wrapping_sub(plen as u32),
        };
        f.seq = seq.wrapping_add(plen as u32);
        p[l3 + 4..l3 + 8].copy_from_slice(&seq.to_be_bytes());
        let ack: u32 = if step & 0x04 != 0 { 2000 } else { 1000 };
        p[l3 + 8..l3 + 12].copy_from_slice(&ack.to_be_bytes());
        p[l3 + 12] = ((l4h / 4) as u8) << 4;
        let flags = match b.u8() {
            0..=199 => ACK,
            200..=229 => ACK | PSH,
            x => x,
        };
        p[l3 + 13] = flags;
        // Window: usually steady, sometimes updated.
        let win = if step & 0x80 != 0 {
            u16::from(b.u8()) << 4
        } else {
            502
        };
        put16(&mut p, l3 + 14, win);
        p[l3 + 20..l3 + l4h].copy_from_slice(tcp_opts);
    } else {
        put16(&mut p, l3 + 4, (total - l3) as u16);
    }
    for (i, x) in p[l3 + l4h..].iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(7).wrapping_add(fi as u8);
    }
    fix_checksums(&mut p);
    // Corruption: a byte set after the checksums (a bad packet), or before a fix-up
    // (a valid packet with an odd header).
    let c = b.u8();
    if c >= 0xf0 && !p.is_empty() {
        let at = usize::from(u16::from_be_bytes([b.u8(), b.u8()])) % p.len();
        p[at] = b.u8();
        if c & 1 != 0 {
            fix_checksums(&mut p);
        }
    }
    p
}

/// What a member should look like after the kernel re-split the merged packet.
fn normalized(p: &[u8]) -> Vec<u8> {
    let mut p = p.to_vec();
    if let Some((v6, l3, proto)) = layout(&p) {
        if !v6 {
            put16(&mut p, 4, 0);
            put16(&mut p, 10, 0);
        }
        match proto {
            TCP if p.len() >= l3 + 20 => {
                put16(&mut p, l3 + 16, 0);
                put16(&mut p, l3 + 18, 0);
            }
            UDP if p.len() >= l3 + 8 => put16(&mut p, l3 + 6, 0),
            _ => {}
        }
    }
    p
}

pub fn check(data: &[u8]) {
    let mut b = Bytes(data);
    let o = b.u8();
    let opts = CoalesceOptions {
        tcp: o & 1 == 0,
        udp: o & 2 == 0,
    };
    let mut flows = [Flow::default(); 4];
    let mut pkts: Vec<Vec<u8>> = Vec::new();
    while !b.0.is_empty() && pkts.len() < MAX_BATCH + 8 {
        pkts.push(build(&mut b, &mut flows));
    }
    let mut c = Coalescer::new(opts);
    let n = c.plan(&pkts);
    assert_eq!(n, pkts.len().min(MAX_BATCH));

    let mut seen = vec![false; n];
    let mut last_first = None;
    let mut out = vec![0u8; VIRTIO_NET_HDR_LEN + MAX_IP_PACKET];
    let mut seg = vec![0u8; MAX_IP_PACKET];
    for g in c.groups().collect::<Vec<_>>() {
        let members: Vec<usize> = c.members(&g).collect();
        assert_eq!(members.len(), g.count, "group count");
        assert_eq!(members.first(), Some(&g.first), "first member");
        assert!(members.windows(2).all(|w| w[0] < w[1]), "members ascend");
        assert!(
            last_first < Some(g.first),
            "groups in order of their first packet"
        );
        last_first = Some(g.first);
        for &m in &members {
            assert!(m < n, "member {m} beyond the planned {n}");
            assert!(!seen[m], "packet {m} in two groups");
            seen[m] = true;
        }
        let len = c
            .write(&g, &pkts, &mut out)
            .expect("a planned group writes");
        assert_eq!(len, g.len, "write length = planned length");
        assert!(len <= VIRTIO_NET_HDR_LEN + MAX_IP_PACKET);
        let (vh, ip) = out[..len].split_at(VIRTIO_NET_HDR_LEN);
        if g.count == 1 {
            assert_eq!(vh, &[0u8; VIRTIO_NET_HDR_LEN], "pass-through header");
            assert_eq!(ip, &pkts[g.first][..], "pass-through packet changed");
            continue;
        }
        check_merged(&out[..len], &members, &pkts, opts, &mut seg);
    }
    assert!(seen.iter().all(|&s| s), "a packet is in no group");
}

fn check_merged(
    buf: &[u8],
    members: &[usize],
    pkts: &[Vec<u8>],
    opts: CoalesceOptions,
    seg: &mut [u8],
) {
    let h = VirtioNetHdrRepr::parse(&VirtioNetHdr::new_checked(buf).expect("room"))
        .expect("known GSO type");
    let head = &pkts[members[0]];
    let (v6, l3, proto) = layout(head).expect("a merged head is IP");
    let l4h = if proto == TCP {
        usize::from(head[l3 + 12] >> 4) * 4
    } else {
        8
    };
    let want_type = match (proto, v6) {
        (TCP, false) => GsoType::TcpV4,
        (TCP, true) => GsoType::TcpV6,
        (UDP, _) => GsoType::UdpL4,
        _ => panic!("merged protocol {proto}"),
    };
    assert!(
        if proto == TCP { opts.tcp } else { opts.udp },
        "merged {proto} with that offload off"
    );
    assert_eq!(h.gso_type, want_type);
    assert_eq!(h.flags, FLAG_NEEDS_CSUM);
    assert!(!h.ecn);
    assert_eq!(usize::from(h.csum_start), l3);
    assert_eq!(
        usize::from(h.csum_offset),
        if proto == TCP { 16 } else { 6 }
    );
    assert_eq!(usize::from(h.hdr_len), l3 + l4h);
    let gso = usize::from(h.gso_size);
    for (k, &m) in members.iter().enumerate() {
        let p = &pkts[m];
        let payload = p.len() - l3 - l4h;
        if k + 1 < members.len() {
            assert_eq!(payload, gso, "member {m}: only the last may be short");
        } else {
            assert!(
                payload > 0 && payload <= gso,
                "last member {m} longer than gso_size"
            );
        }
        // What the kernel would have dropped must not be merged into something valid.
        assert!(l4_ok(p, v6, l3, proto), "member {m} had a bad L4 checksum");
        if !v6 {
            assert!(
                ipv4_header_ok(p, l3),
                "member {m} had a bad IPv4 header checksum"
            );
        }
    }
    let mut sp = Splitter::new(buf).expect("a merged packet splits");
    assert_eq!(sp.count(), members.len(), "segments = members");
    let mut k = 0;
    while let Some(r) = sp.next_into(seg) {
        let len = r.expect("segment fits");
        let s = &seg[..len];
        let m = members[k];
        assert!(
            l4_ok(s, v6, l3, proto),
            "re-split segment {k}: bad L4 checksum"
        );
        if !v6 {
            assert!(
                ipv4_header_ok(s, l3),
                "re-split segment {k}: bad IPv4 checksum"
            );
            assert_eq!(
                be16(s, 4),
                be16(head, 4).wrapping_add(k as u16),
                "IPv4 ID increments from the head's"
            );
        }
        assert_eq!(
            normalized(s),
            normalized(&pkts[m]),
            "re-split segment {k} differs from member {m} (of {members:?})"
        );
        k += 1;
    }
    assert_eq!(k, members.len());
}
