//! Coalescing (TUN write side, GRO): the [`Coalescer`] plans which decrypted TCP/UDP
//! segments of one flow merge back into one `virtio_net_hdr` super-packet.

use super::checksum::{addr_ranges, be16, be32, fix_ipv4_checksum, l4_checksum_ok, put16};
use super::{
    checksum, GsoError, GsoType, VirtioNetHdrRepr, FLAG_NEEDS_CSUM, MAX_BATCH, MAX_IP_PACKET,
    PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_CSUM_OFFSET, TCP_PSH, UDP_CSUM_OFFSET, VIRTIO_NET_HDR_LEN,
};

/// Which protocols the TUN accepts as super-packets (from `TUNSETOFFLOAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CoalesceOptions {
    /// TSO4/6 are on: TCP segments may be merged.
    pub tcp: bool,
    /// USO4/6 are on: UDP datagrams may be merged.
    pub udp: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct FlowKey {
    v6: bool,
    proto: u8,
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    /// TCP segments with different ACKs are never merged (as wireguard-go does).
    ack: u32,
}

/// What [`parse_candidate`] learnt about one packet.
#[derive(Clone, Copy, Debug)]
pub(super) struct Parsed {
    key: FlowKey,
    v6: bool,
    proto: u8,
    l3: usize,
    l4h: usize,
    payload: usize,
    seq: u32,
    psh: bool,
    /// Meets every rule for merging (else it passes through and closes its flow).
    candidate: bool,
}

pub(super) const NIL: u16 = u16::MAX;

#[derive(Clone, Copy, Debug)]
pub(super) struct GroupState {
    first: u16,
    last: u16,
    count: u16,
    /// Payload of the first (and every but the last) member.
    gso_size: u16,
    /// IP bytes of the merged packet.
    total: u32,
    next_seq: u32,
    /// Nothing may be appended (PSH seen, short segment seen, or not a candidate).
    closed: bool,
    proto: u8,
    v6: bool,
    l3: u8,
    l4h: u8,
    psh: bool,
}

/// One output packet of a [`Coalescer`] plan: `count` input packets merged (or 1 passed
/// through), `len` bytes including the virtio header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    index: u16,
    /// Input index of the first packet of the group.
    pub first: usize,
    /// Input packets in the group.
    pub count: usize,
    /// Bytes [`Coalescer::write`] will produce (virtio header included).
    pub len: usize,
}

/// GRO for the TUN write side. Reuse one per worker; [`Coalescer::plan`] resets it.
///
/// ```text
/// let n = c.plan(&pkts);                   // looks at pkts[..n], n = min(len, MAX_BATCH)
/// for g in c.groups() {                     // in order of their first packet
///     let len = c.write(&g, &pkts, &mut out)?;  // vnet hdr + (super-)packet
///     tun.write(&out[..len]);
/// }
/// ```
#[derive(Debug)]
pub struct Coalescer {
    opts: CoalesceOptions,
    groups: heapless::Vec<GroupState, MAX_BATCH>,
    /// Next member of the same group, by input index.
    next: [u16; MAX_BATCH],
    /// The open group of each flow.
    open: heapless::FnvIndexMap<FlowKey, u16, MAX_BATCH>,
}

impl Coalescer {
    pub fn new(opts: CoalesceOptions) -> Self {
        Coalescer {
            opts,
            groups: heapless::Vec::new(),
            next: [NIL; MAX_BATCH],
            open: heapless::FnvIndexMap::new(),
        }
    }

    pub fn options(&self) -> CoalesceOptions {
        self.opts
    }

    /// Group `pkts` (plain IP packets, in arrival order); returns how many were looked at
    /// (at most [`MAX_BATCH`]; plan the rest in another round).
    pub fn plan<P: AsRef<[u8]>>(&mut self, pkts: &[P]) -> usize {
        self.groups.clear();
        self.open.clear();
        let n = pkts.len().min(MAX_BATCH);
        for (i, p) in pkts[..n].iter().enumerate() {
            self.next[i] = NIL;
            self.add(i, p.as_ref(), pkts);
        }
        n
    }

    /// The planned output packets, in order of their first input packet.
    pub fn groups(&self) -> impl Iterator<Item = Group> + '_ {
        self.groups.iter().enumerate().map(|(gi, g)| Group {
            index: gi as u16,
            first: usize::from(g.first),
            count: usize::from(g.count),
            len: VIRTIO_NET_HDR_LEN + g.total as usize,
        })
    }

    /// Input indices of the members of `g`, in order.
    pub fn members(&self, g: &Group) -> impl Iterator<Item = usize> + '_ {
        let mut cur = g.first as u16;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = usize::from(cur);
            cur = self.next.get(i).copied().unwrap_or(NIL);
            Some(i)
        })
    }

    fn add<P: AsRef<[u8]>>(&mut self, i: usize, pkt: &[u8], pkts: &[P]) {
        let parsed = parse_candidate(pkt, self.opts);
        let p = match parsed {
            Some(p) if p.candidate && l4_checksum_ok(pkt, p.v6, p.l3, p.proto) => p,
            other => {
                // Something in the flow that cannot merge (or a bad checksum the kernel
                // must see): later segments must not jump ahead of it.
                if let Some(p) = other {
                    self.open.remove(&p.key);
                }
                self.push_single(i, pkt.len(), true, None);
                return;
            }
        };
        if let Some(&gi) = self.open.get(&p.key) {
            if self.try_append(usize::from(gi), i, pkt, &p, pkts) {
                return;
            }
        }
        let gi = self.push_single(i, pkt.len(), false, Some(&p));
        // The map has room for MAX_BATCH flows, one per packet at most.
        let _ = self.open.insert(p.key, gi);
    }

    fn push_single(&mut self, i: usize, len: usize, closed: bool, p: Option<&Parsed>) -> u16 {
        let gi = self.groups.len() as u16;
        let g = GroupState {
            first: i as u16,
            last: i as u16,
            count: 1,
            gso_size: p.map_or(0, |p| p.payload as u16),
            total: len as u32,
            next_seq: p.map_or(0, |p| p.seq.wrapping_add(p.payload as u32)),
            closed: closed || p.is_some_and(|p| p.psh),
            proto: p.map_or(0, |p| p.proto),
            v6: p.is_some_and(|p| p.v6),
            l3: p.map_or(0, |p| p.l3 as u8),
            l4h: p.map_or(0, |p| p.l4h as u8),
            psh: p.is_some_and(|p| p.psh),
        };
        // Cannot fail: at most one group per packet and MAX_BATCH packets.
        let _ = self.groups.push(g);
        gi
    }

    fn try_append<P: AsRef<[u8]>>(
        &mut self,
        gi: usize,
        i: usize,
        pkt: &[u8],
        p: &Parsed,
        pkts: &[P],
    ) -> bool {
        let Some(g) = self.groups.get(gi).copied() else {
            return false;
        };
        if g.closed || g.proto != p.proto || usize::from(g.l4h) != p.l4h {
            return false;
        }
        if p.payload > usize::from(g.gso_size) {
            return false;
        }
        if g.total as usize + p.payload > MAX_IP_PACKET {
            return false;
        }
        if p.proto == PROTO_TCP && p.seq != g.next_seq {
            return false;
        }
        let head = pkts[usize::from(g.first)].as_ref();
        if !ip_headers_match(head, pkt, p.v6) {
            return false;
        }
        if p.proto == PROTO_TCP && head[p.l3 + 20..p.l3 + p.l4h] != pkt[p.l3 + 20..p.l3 + p.l4h] {
            return false; // TCP options differ
        }
        // The rest of the flag word must match too, as Linux GRO's `tcp_flag_word`
        // compare has it: a window update (merged, the receiver would only see the
        // head's window) and the reserved/AE bits next to the data offset.
        if p.proto == PROTO_TCP
            && (head[p.l3 + 12] != pkt[p.l3 + 12]
                || head[p.l3 + 14..p.l3 + 16] != pkt[p.l3 + 14..p.l3 + 16])
        {
            return false;
        }
        self.next[usize::from(g.last)] = i as u16;
        let g = &mut self.groups[gi];
        g.last = i as u16;
        g.count += 1;
        g.total += p.payload as u32;
        g.next_seq = p.seq.wrapping_add(p.payload as u32);
        // PSH ends a group; so does a short segment (only the last may be short).
        if p.psh || p.payload < usize::from(g.gso_size) {
            g.closed = true;
        }
        g.psh |= p.psh;
        true
    }

    /// Write group `g` (virtio header + packet) into `out`; returns its length.
    pub fn write<P: AsRef<[u8]>>(
        &self,
        g: &Group,
        pkts: &[P],
        out: &mut [u8],
    ) -> Result<usize, GsoError> {
        let st = *self
            .groups
            .get(usize::from(g.index))
            .ok_or(GsoError::Truncated)?;
        let need = VIRTIO_NET_HDR_LEN + st.total as usize;
        let have = out.len();
        let out = out
            .get_mut(..need)
            .ok_or(GsoError::BufferTooSmall { need, have })?;
        let (vh, ip) = out.split_at_mut(VIRTIO_NET_HDR_LEN);
        let head = pkts
            .get(usize::from(st.first))
            .map(AsRef::as_ref)
            .ok_or(GsoError::Truncated)?;
        if st.count == 1 {
            VirtioNetHdrRepr::NONE.emit_into(vh)?;
            ip.copy_from_slice(head.get(..ip.len()).ok_or(GsoError::Truncated)?);
            return Ok(need);
        }

        let (l3, l4h) = (usize::from(st.l3), usize::from(st.l4h));
        let hdr_len = l3 + l4h;
        let mut at = head.len();
        ip.get_mut(..at)
            .ok_or(GsoError::Truncated)?
            .copy_from_slice(head);
        let mut cur = self.next[usize::from(st.first)];
        while cur != NIL {
            let p = pkts
                .get(usize::from(cur))
                .map(AsRef::as_ref)
                .ok_or(GsoError::Truncated)?;
            let payload = p.get(hdr_len..).ok_or(GsoError::Truncated)?;
            ip.get_mut(at..at + payload.len())
                .ok_or(GsoError::Truncated)?
                .copy_from_slice(payload);
            at += payload.len();
            cur = self.next[usize::from(cur)];
        }
        // Only if `pkts` is not the slice the plan was made from.
        if at != ip.len() {
            return Err(GsoError::Truncated);
        }
        if st.v6 {
            put16(ip, 4, (ip.len() - 40) as u16);
        } else {
            put16(ip, 2, ip.len() as u16);
            fix_ipv4_checksum(ip, l3);
        }
        let (gso_type, csum_offset) = if st.proto == PROTO_TCP {
            if st.psh {
                ip[l3 + 13] |= TCP_PSH;
            }
            let t = if st.v6 {
                GsoType::TcpV6
            } else {
                GsoType::TcpV4
            };
            (t, TCP_CSUM_OFFSET)
        } else {
            put16(ip, l3 + 4, (ip.len() - l3) as u16);
            (GsoType::UdpL4, UDP_CSUM_OFFSET)
        };
        // CHECKSUM_PARTIAL as Linux expects: the field holds the folded pseudo-header sum.
        let (s, d) = addr_ranges(st.v6);
        let ph = checksum::pseudo_header(&ip[s], &ip[d], st.proto, ip.len() - l3);
        put16(ip, l3 + csum_offset, checksum::fold(ph));
        VirtioNetHdrRepr {
            flags: FLAG_NEEDS_CSUM,
            gso_type,
            ecn: false,
            hdr_len: hdr_len as u16,
            gso_size: st.gso_size,
            csum_start: l3 as u16,
            csum_offset: csum_offset as u16,
        }
        .emit_into(vh)?;
        Ok(need)
    }
}

/// Fields that must agree for two IP packets to be merged (Linux `inet_gro_receive` /
/// `ipv6_gro_receive`): v4 TOS, TTL, DF; v6 version/class/flow label and hop limit.
pub(super) fn ip_headers_match(a: &[u8], b: &[u8], v6: bool) -> bool {
    if v6 {
        a[..4] == b[..4] && a[7] == b[7]
    } else {
        a[1] == b[1] && a[8] == b[8] && (a[6] >> 5) == (b[6] >> 5)
    }
}

/// Parse a plain IP packet for coalescing; `None` when it is not TCP/UDP we can read.
pub(super) fn parse_candidate(pkt: &[u8], opts: CoalesceOptions) -> Option<Parsed> {
    let version = pkt.first()? >> 4;
    let (v6, l3, proto, len_ok, frag) = match version {
        4 => {
            if pkt.len() < 20 {
                return None;
            }
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            let frag = be16(pkt, 6) & 0x3fff != 0; // MF or an offset
                                                   // Options in the IP header: Linux GRO does not merge them either.
            if ihl != 20 {
                return None;
            }
            // A bad header checksum: the kernel drops the packet; merged, its header
            // would be replaced by a valid one (Linux GRO does not merge it either).
            let hdr_ok = checksum::fold(checksum::sum(&pkt[..20], 0)) == 0xffff;
            (
                false,
                ihl,
                pkt[9],
                hdr_ok && usize::from(be16(pkt, 2)) == pkt.len(),
                frag,
            )
        }
        6 => {
            if pkt.len() < 40 {
                return None;
            }
            (
                true,
                40,
                pkt[6],
                usize::from(be16(pkt, 4)) + 40 == pkt.len(),
                false,
            )
        }
        _ => return None,
    };
    let (s, d) = addr_ranges(v6);
    let mut key = FlowKey {
        v6,
        proto,
        src: [0; 16],
        dst: [0; 16],
        sport: 0,
        dport: 0,
        ack: 0,
    };
    key.src[..s.len()].copy_from_slice(&pkt[s]);
    key.dst[..d.len()].copy_from_slice(&pkt[d]);
    let (l4h, seq, psh, rules_ok, enabled) = match proto {
        PROTO_TCP => {
            if pkt.len() < l3 + 20 {
                return None;
            }
            let doff = usize::from(pkt[l3 + 12] >> 4) * 4;
            if !(20..=60).contains(&doff) || pkt.len() < l3 + doff {
                return None;
            }
            key.ack = be32(pkt, l3 + 8);
            let flags = pkt[l3 + 13];
            // Only plain data segments merge: ACK, optionally PSH (the Linux GRO selftests'
            // rules, as wireguard-go applies them).
            let flags_ok = flags == TCP_ACK || flags == TCP_ACK | TCP_PSH;
            (
                doff,
                be32(pkt, l3 + 4),
                flags & TCP_PSH != 0,
                flags_ok,
                opts.tcp,
            )
        }
        PROTO_UDP => {
            if pkt.len() < l3 + 8 {
                return None;
            }
            let udp_len_ok = usize::from(be16(pkt, l3 + 4)) == pkt.len() - l3;
            // A zero checksum (IPv4 "none") cannot be turned into a partial one safely.
            let csum_present = be16(pkt, l3 + 6) != 0;
            (8, 0, false, udp_len_ok && csum_present, opts.udp)
        }
        _ => return None,
    };
    key.sport = be16(pkt, l3);
    key.dport = be16(pkt, l3 + 2);
    let payload = pkt.len() - l3 - l4h;
    Some(Parsed {
        key,
        v6,
        proto,
        l3,
        l4h,
        payload,
        seq,
        psh,
        candidate: enabled
            && len_ok
            && !frag
            && rules_ok
            && payload > 0
            && pkt.len() <= MAX_IP_PACKET,
    })
}
