//! Splitting (TUN read side): the [`Splitter`] cuts the kernel's TSO/USO super-packets
//! into wire-sized segments with correct headers and checksums.

use super::checksum::{be16, be32, fill_l4_checksum, fix_ipv4_checksum, put16};
use super::{
    checksum, GsoError, GsoType, VirtioNetHdr, VirtioNetHdrRepr, MAX_IP_PACKET, PROTO_TCP,
    PROTO_UDP, TCP_CSUM_OFFSET, TCP_CWR, TCP_FIN, TCP_PSH, UDP_CSUM_OFFSET, VIRTIO_NET_HDR_LEN,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SplitKind {
    /// One packet; finish its checksum at `start`/`offset` when `Some`.
    Plain(Option<(usize, usize)>),
    Tcp,
    Udp,
}

/// Cuts one packet read from an `IFF_VNET_HDR` TUN into wire-sized IP packets.
///
/// ```text
/// let mut s = Splitter::new(&read_buf[..n])?;      // checks everything up front
/// while let Some(r) = s.next_into(&mut seg_buf) {  // one segment per call
///     let len = r?;                                  // seg_buf[..len] is a plain IP packet
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Splitter<'a> {
    ip: &'a [u8],
    kind: SplitKind,
    v6: bool,
    /// L3 header length (= csum_start for GSO packets).
    l3: usize,
    /// L3 + L4 header length.
    hdr_len: usize,
    gso_size: usize,
    count: usize,
    index: usize,
    seq0: u32,
    id0: u16,
}

impl<'a> Splitter<'a> {
    /// Check a TUN read (`virtio_net_hdr` + IP packet).
    pub fn new(buf: &'a [u8]) -> Result<Self, GsoError> {
        let h = VirtioNetHdr::new_checked(buf)?;
        let repr = VirtioNetHdrRepr::parse(&h)?;
        let ip = &buf[VIRTIO_NET_HDR_LEN..];
        if ip.len() > MAX_IP_PACKET {
            return Err(GsoError::TooLong);
        }
        let version = ip.first().map(|b| b >> 4).ok_or(GsoError::Truncated)?;
        let v6 = match version {
            4 => false,
            6 => true,
            _ => return Err(GsoError::IpVersion),
        };
        let bad_offsets = GsoError::ChecksumOffsets {
            start: repr.csum_start,
            offset: repr.csum_offset,
        };
        if repr.gso_type == GsoType::None {
            let csum = if repr.needs_csum() {
                let start = usize::from(repr.csum_start);
                let off = usize::from(repr.csum_offset);
                if start + off + 2 > ip.len() {
                    return Err(bad_offsets);
                }
                Some((start, off))
            } else {
                None
            };
            return Ok(Splitter {
                ip,
                kind: SplitKind::Plain(csum),
                v6,
                l3: 0,
                hdr_len: ip.len(),
                gso_size: ip.len(),
                count: 1,
                index: 0,
                seq0: 0,
                id0: 0,
            });
        }

        let (kind, proto) = match (repr.gso_type, v6) {
            (GsoType::TcpV4, false) | (GsoType::TcpV6, true) => (SplitKind::Tcp, PROTO_TCP),
            (GsoType::UdpL4, _) => (SplitKind::Udp, PROTO_UDP),
            _ => return Err(GsoError::IpVersion),
        };
        let l3 = usize::from(repr.csum_start);
        if v6 {
            if ip.len() < 40 || l3 < 40 {
                return Err(bad_offsets);
            }
            // Without extension headers the next header must be the GSO protocol.
            if l3 == 40 && ip[6] != proto {
                return Err(GsoError::Protocol);
            }
        } else {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 || ip.len() < ihl {
                return Err(GsoError::Truncated);
            }
            if l3 != ihl {
                return Err(bad_offsets);
            }
            if ip[9] != proto {
                return Err(GsoError::Protocol);
            }
        }
        let want_off = if proto == PROTO_TCP {
            TCP_CSUM_OFFSET
        } else {
            UDP_CSUM_OFFSET
        };
        if repr.needs_csum() && usize::from(repr.csum_offset) != want_off {
            return Err(bad_offsets);
        }
        // The kernel's hdr_len is only a hint; derive the real one as wireguard-go does.
        let l4h = if proto == PROTO_TCP {
            if ip.len() < l3 + 20 {
                return Err(GsoError::Truncated);
            }
            let doff = usize::from(ip[l3 + 12] >> 4) * 4;
            if !(20..=60).contains(&doff) {
                return Err(GsoError::TcpHeaderLen);
            }
            doff
        } else {
            8
        };
        let hdr_len = l3 + l4h;
        if ip.len() < hdr_len {
            return Err(GsoError::Truncated);
        }
        if repr.gso_size == 0 {
            return Err(GsoError::ZeroGsoSize);
        }
        let payload = ip.len() - hdr_len;
        if payload == 0 {
            return Err(GsoError::EmptyPayload);
        }
        let gso_size = usize::from(repr.gso_size);
        Ok(Splitter {
            ip,
            kind,
            v6,
            l3,
            hdr_len,
            gso_size,
            count: payload.div_ceil(gso_size),
            index: 0,
            seq0: if proto == PROTO_TCP {
                be32(ip, l3 + 4)
            } else {
                0
            },
            id0: if v6 { 0 } else { be16(ip, 4) },
        })
    }

    /// Number of segments this packet yields.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Segments not yet produced.
    pub fn remaining(&self) -> usize {
        self.count - self.index
    }

    /// Length of the longest segment (what each output buffer must hold).
    pub fn max_segment_len(&self) -> usize {
        match self.kind {
            SplitKind::Plain(_) => self.ip.len(),
            _ => self.hdr_len + self.gso_size.min(self.ip.len() - self.hdr_len),
        }
    }

    /// A plain packet (not GSO): `Some` with where its checksum is to be finished (see
    /// [`finish_checksum`]), so the caller can finish it in place instead of copying it
    /// out with [`Self::next_into`]. `None` for a super-packet.
    pub fn plain(&self) -> Option<Option<(usize, usize)>> {
        match self.kind {
            SplitKind::Plain(csum) => Some(csum),
            _ => None,
        }
    }

    /// Whether the super-packet is TCP/UDP GSO (false for a plain packet).
    pub fn is_gso(&self) -> bool {
        !matches!(self.kind, SplitKind::Plain(_))
    }

    /// Write the next segment into `out`; its length, or `None` when all are done.
    pub fn next_into(&mut self, out: &mut [u8]) -> Option<Result<usize, GsoError>> {
        if self.index >= self.count {
            return None;
        }
        let r = self.write_segment(out);
        if r.is_ok() {
            self.index += 1;
        } else {
            // A caller that ignores the error must not loop forever.
            self.index = self.count;
        }
        Some(r)
    }

    fn write_segment(&self, out: &mut [u8]) -> Result<usize, GsoError> {
        let ip = self.ip;
        if let SplitKind::Plain(csum) = self.kind {
            let have = out.len();
            let out = out.get_mut(..ip.len()).ok_or(GsoError::BufferTooSmall {
                need: ip.len(),
                have,
            })?;
            out.copy_from_slice(ip);
            finish_checksum(out, csum);
            return Ok(ip.len());
        }

        let i = self.index;
        let start = self.hdr_len + i * self.gso_size;
        let end = (start + self.gso_size).min(ip.len());
        let seg_len = self.hdr_len + (end - start);
        let have = out.len();
        let out = out.get_mut(..seg_len).ok_or(GsoError::BufferTooSmall {
            need: seg_len,
            have,
        })?;
        out[..self.hdr_len].copy_from_slice(&ip[..self.hdr_len]);
        out[self.hdr_len..].copy_from_slice(&ip[start..end]);

        let last = i + 1 == self.count;
        if self.v6 {
            put16(out, 4, (seg_len - 40) as u16);
        } else {
            put16(out, 2, seg_len as u16);
            put16(out, 4, self.id0.wrapping_add(i as u16));
            fix_ipv4_checksum(out, self.l3);
        }
        let l3 = self.l3;
        let proto = if self.kind == SplitKind::Tcp {
            let seq = self.seq0.wrapping_add((i * self.gso_size) as u32);
            out[l3 + 4..l3 + 8].copy_from_slice(&seq.to_be_bytes());
            let mut flags = out[l3 + 13];
            if !last {
                flags &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                flags &= !TCP_CWR;
            }
            out[l3 + 13] = flags;
            PROTO_TCP
        } else {
            put16(out, l3 + 4, (seg_len - l3) as u16);
            PROTO_UDP
        };
        fill_l4_checksum(out, self.v6, l3, proto);
        Ok(seg_len)
    }
}

/// Finish a plain packet's checksum where the kernel left it partial (`csum` from
/// [`Splitter::plain`], checked by [`Splitter::new`] against this packet): the field holds
/// the pseudo-header sum; sum from `start` over it and complement.
pub fn finish_checksum(ip: &mut [u8], csum: Option<(usize, usize)>) {
    if let Some((start, off)) = csum {
        let Some(tail) = ip.get(start..) else { return };
        let mut c = !checksum::fold(checksum::sum(tail, 0));
        if off == UDP_CSUM_OFFSET && c == 0 {
            c = 0xffff;
        }
        if start + off + 2 <= ip.len() {
            put16(ip, start + off, c);
        }
    }
}
