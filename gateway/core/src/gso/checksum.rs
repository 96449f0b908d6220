//! Internet checksums (RFC 1071) and the IPv4 header / TCP-UDP checksum fixes the
//! splitter and coalescer need.

use super::{checksum, PROTO_TCP, PROTO_UDP, TCP_CSUM_OFFSET, UDP_CSUM_OFFSET};
use std::ops::Range;

/// Add `data` (big-endian 16-bit words, odd byte padded) to `sum`, unfolded.
///
/// Ones'-complement addition is the same at any word width once folded, so the bulk
/// goes as 64-bit words with end-around carry in two independent lanes (about 1.6x
/// the speed of 32-bit words here); the tail goes 4, 2, 1 bytes at a time.
pub fn sum(data: &[u8], sum: u64) -> u64 {
    let mut a = sum;
    let mut b: u64 = 0;
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        let (w1, w2) = c.split_at(8);
        let w1 = u64::from_be_bytes(w1.try_into().unwrap_or_default());
        let w2 = u64::from_be_bytes(w2.try_into().unwrap_or_default());
        let (s, o) = a.overflowing_add(w1);
        a = s + u64::from(o);
        let (s, o) = b.overflowing_add(w2);
        b = s + u64::from(o);
    }
    let (s, o) = a.overflowing_add(b);
    let s = s + u64::from(o);
    // Down to 33 bits so the tail additions below cannot overflow.
    let mut sum = (s >> 32) + (s & 0xffff_ffff);
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(4);
    for c in &mut words {
        sum += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = words.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        sum += u64::from(u16::from_be_bytes([rest[i], rest[i + 1]]));
        i += 2;
    }
    if i < rest.len() {
        sum += u64::from(rest[i]) << 8;
    }
    sum
}

/// Fold an unfolded sum to 16 bits (not complemented).
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The TCP/UDP pseudo-header sum for `src`/`dst` (4 or 16 bytes each).
pub fn pseudo_header(src: &[u8], dst: &[u8], proto: u8, l4_len: usize) -> u64 {
    let s = sum(src, 0);
    let s = sum(dst, s);
    s + u64::from(proto) + l4_len as u64
}

pub(super) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(super) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(super) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Source and destination address ranges of an IP header.
pub(super) fn addr_ranges(v6: bool) -> (Range<usize>, Range<usize>) {
    if v6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    }
}

/// Recompute the IPv4 header checksum over `ip[..ihl]`.
pub(super) fn fix_ipv4_checksum(ip: &mut [u8], ihl: usize) {
    put16(ip, 10, 0);
    let c = !checksum::fold(checksum::sum(&ip[..ihl], 0));
    put16(ip, 10, c);
}

/// Compute and store the full L4 checksum of `ip[l3..]` (the field is zeroed first).
pub(super) fn fill_l4_checksum(ip: &mut [u8], v6: bool, l3: usize, proto: u8) {
    let at = l3
        + if proto == PROTO_TCP {
            TCP_CSUM_OFFSET
        } else {
            UDP_CSUM_OFFSET
        };
    put16(ip, at, 0);
    let (s, d) = addr_ranges(v6);
    let ph = checksum::pseudo_header(&ip[s], &ip[d], proto, ip.len() - l3);
    let mut c = !checksum::fold(checksum::sum(&ip[l3..], ph));
    if proto == PROTO_UDP && c == 0 {
        c = 0xffff; // 0 means "no checksum" for UDP
    }
    put16(ip, at, c);
}

/// Whether the L4 checksum of `ip[l3..]` verifies.
pub(super) fn l4_checksum_ok(ip: &[u8], v6: bool, l3: usize, proto: u8) -> bool {
    let (s, d) = addr_ranges(v6);
    let ph = checksum::pseudo_header(&ip[s], &ip[d], proto, ip.len() - l3);
    checksum::fold(checksum::sum(&ip[l3..], ph)) == 0xffff
}
