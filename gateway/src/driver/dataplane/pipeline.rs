//! The backend-independent half of a worker ([`Pipeline`]): what a backend received
//! goes through the device (TUN reads split by `core::gso`, GRO trains cut into
//! datagrams), and what the device answers goes into the round's batches through
//! [`OffloadIo`], the device's `Io` sink. The loop flushes it when the round ends.
//!
//! Both batches also flush themselves when full, so `flush` at the end of a round only
//! bounds latency. No syscall happens under a peer lock: the device's `Io` calls only
//! copy into the batch buffers, a full batch is only queued by the backend (a `Vec`
//! entry, or an SQE), and queues are handed to the kernel between packets
//! ([`Backend::relieve`]) or when the round ends.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::core::device::{Device, Io, PeerAddr, Table, SCRATCH_SIZE};
use crate::core::gso::{finish_checksum, GsoError, Splitter, VIRTIO_NET_HDR_LEN};
use crate::driver::dataplane::backend::{Backend, Dst};
use crate::driver::dataplane::outbox::{Outbox, Outlets};
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::sticky::{Sticky, StickyTable};
use crate::driver::dataplane::tun_batch::{coalesce_options, TunBatch};
use crate::driver::dataplane::tx_batch::TxBatch;
use crate::sys::cmsg::{PktInfo, RecvMeta};
use crate::sys::tun::TunOffload;

/// The device's `Io` sink for a worker: the two batches over a backend.
pub struct OffloadIo<'a, K: Backend> {
    pub be: &'a mut K,
    pub tcp: Option<&'a dyn TcpOut>,
    /// The round's TCP-carried messages, recorded in the [`Outbox`] the other threads
    /// use too and carried out when the round ends (the transport's send may write to the
    /// socket).
    pub outbox: &'a mut Outbox,
    /// The round's sends to peers over UDP.
    pub tx: &'a mut TxBatch<K::Buf>,
    /// The round's writes to the TUN, coalesced (what the device decrypted).
    pub tun_writes: &'a mut TunBatch,
    pub sticky: &'a Sticky,
    /// While the device handles one received datagram: its sender and the local address
    /// it came to. Answers to that sender (a handshake response, a cookie reply) leave
    /// from that address even before it authenticated.
    pub reply: Option<(SocketAddr, PktInfo)>,
}

impl<K: Backend> OffloadIo<'_, K> {
    /// Send and write everything queued (end of a round, outside any peer lock).
    pub fn flush(&mut self) {
        self.tx.flush(self.be);
        self.tun_writes.flush(self.be);
        self.be.submit();
        if !self.outbox.is_empty() {
            self.outbox.flush(&mut Outlets {
                tcp: self.tcp,
                ..Outlets::default()
            });
        }
    }

    pub(super) fn dst(&self, a: SocketAddr) -> Dst {
        let src = match self.reply {
            Some((peer, local)) if peer == a => Some(local),
            _ => self.sticky.get(a),
        };
        Dst { addr: a, src }
    }
}

impl<K: Backend> Io for OffloadIo<'_, K> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        match to {
            PeerAddr::Udp(a) => {
                let to = self.dst(a);
                self.tx.push(self.be, to, d)
            }
            PeerAddr::Tcp { .. } => {
                if self.tcp.is_some() {
                    self.outbox.send(to, d);
                }
            }
        }
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.tun_writes.push(self.be, p);
    }

    fn send_slot(&mut self, to: PeerAddr, expected: usize, max: usize) -> Option<&mut [u8]> {
        match to {
            PeerAddr::Udp(a) => {
                let to = self.dst(a);
                self.tx.slot(self.be, to, expected, max)
            }
            PeerAddr::Tcp { .. } => None,
        }
    }

    fn send_commit(&mut self, to: PeerAddr, len: usize) {
        if let PeerAddr::Udp(a) = to {
            let to = self.dst(a);
            self.tx.commit(self.be, to, len);
        }
    }

    fn tun_slot(&mut self, max: usize) -> Option<&mut [u8]> {
        self.tun_writes.slot(self.be, max)
    }

    fn tun_commit(&mut self, len: usize) {
        self.tun_writes.commit(len);
    }
}

/// What the device sees of one round: the device, its table snapshot, the TCP transport.
#[derive(Clone, Copy)]
pub struct Cx<'a> {
    pub dev: &'a Device,
    pub table: &'a Table,
    pub tcp: Option<&'a dyn TcpOut>,
}

/// The backend-independent half of a worker: the batches, the device's buffers and
/// the sticky sources, allocated once. A backend hands it each received buffer
/// ([`Self::datagrams`]) and each TUN read ([`Self::tun_read`]) with its executor, and
/// the loop calls [`Self::flush`] when the round ends.
pub struct Pipeline<B> {
    /// Sends to peers over UDP.
    pub tx: TxBatch<B>,
    /// Writes to the TUN, coalesced (not what was received: that comes in as arguments).
    pub tun_writes: TunBatch,
    outbox: Outbox,
    pub sticky: Sticky,
    vnet_hdr: bool,
    /// The TSO/USO splitter's output (one segment at a time, before encryption).
    seg: Vec<u8>,
    scratch: Vec<u8>,
    /// TUN reads the splitter rejected.
    pub malformed_reads: u64,
}

impl<B> Pipeline<B> {
    /// For a TUN created with `vnet_hdr` whose `TUNSETOFFLOAD` left `offload`; `sticky`
    /// is shared by all workers.
    pub fn new(offload: TunOffload, vnet_hdr: bool, sticky: Arc<StickyTable>) -> Self {
        let co = coalesce_options(offload, vnet_hdr);
        Pipeline {
            tx: TxBatch::new(),
            tun_writes: TunBatch::new(co, vnet_hdr),
            outbox: Outbox::default(),
            sticky: Sticky::new(sticky),
            vnet_hdr,
            seg: vec![0; 65535],
            scratch: vec![0; SCRATCH_SIZE],
            malformed_reads: 0,
        }
    }

    /// Start of a round: take in what the other workers learnt.
    pub fn begin_round(&mut self) {
        self.sticky.refresh();
    }

    /// The datagrams of one received buffer (several for a GRO train) through the
    /// device; returns how many. Authenticated ones teach the sticky source.
    pub fn datagrams<K: Backend<Buf = B>>(
        &mut self,
        be: &mut K,
        cx: &Cx<'_>,
        buf: &[u8],
        m: &RecvMeta,
    ) -> usize {
        let Pipeline {
            tx,
            tun_writes,
            outbox,
            sticky,
            scratch,
            ..
        } = self;
        let from = PeerAddr::Udp(m.src);
        let mut n = 0;
        for d in datagrams(buf, m) {
            let mut io = OffloadIo {
                be,
                tcp: cx.tcp,
                outbox,
                tx,
                tun_writes,
                sticky,
                reply: m.dst.map(|d| (m.src, d)),
            };
            let authenticated = cx.dev.handle_datagram(cx.table, from, d, scratch, &mut io);
            // Outside the peer lock again: a long queue may go to the kernel now.
            io.be.relieve();
            if authenticated {
                sticky.learn(m.src, m.dst);
            }
            n += 1;
        }
        n
    }

    /// One TUN read (`frame[..n]`, split when it is a super-packet) through the device;
    /// returns the packets. A malformed read is counted and dropped.
    pub fn tun_read<K: Backend<Buf = B>>(
        &mut self,
        be: &mut K,
        cx: &Cx<'_>,
        frame: &mut [u8],
        n: usize,
    ) -> usize {
        let Pipeline {
            tx,
            tun_writes,
            outbox,
            sticky,
            vnet_hdr,
            seg,
            scratch,
            malformed_reads,
        } = self;
        let mut io = OffloadIo {
            be,
            tcp: cx.tcp,
            outbox,
            tx,
            tun_writes,
            sticky,
            reply: None,
        };
        let r = split_tun_read(frame, n, *vnet_hdr, seg, |p, len| {
            cx.dev.handle_tun_packet(cx.table, p, len, scratch, &mut io);
            io.be.relieve();
        });
        match r {
            Ok(k) => k,
            Err(e) => {
                *malformed_reads += 1;
                log::trace!("tun read: {e} ({malformed_reads} so far)");
                0
            }
        }
    }

    /// End of a round: send and write what is queued, hand it to the kernel, then the
    /// TCP-fallback messages. Outside any peer lock.
    pub fn flush<K: Backend<Buf = B>>(&mut self, be: &mut K, cx: &Cx<'_>) {
        OffloadIo {
            be,
            tcp: cx.tcp,
            outbox: &mut self.outbox,
            tx: &mut self.tx,
            tun_writes: &mut self.tun_writes,
            sticky: &self.sticky,
            reply: None,
        }
        .flush();
    }
}
/// Hand each plain IP packet of one TUN read (`read[..n]`) to `f` as `(buffer, len)`:
/// the packet is `buffer[..len]` and the rest of the buffer is room the device may pad
/// into. Without `vnet_hdr` that is the read buffer itself (no copy), else each segment
/// split into `seg` (which needs 65535 bytes; the split is the one copy this direction
/// makes before boringtun's). Returns the number of packets; a malformed read is an
/// error (count and drop it).
pub fn split_tun_read(
    read: &mut [u8],
    n: usize,
    vnet_hdr: bool,
    seg: &mut [u8],
    mut f: impl FnMut(&mut [u8], usize),
) -> Result<usize, GsoError> {
    let n = n.min(read.len());
    if !vnet_hdr {
        f(read, n);
        return Ok(1);
    }
    let mut s = Splitter::new(&read[..n])?;
    if let Some(csum) = s.plain() {
        // Not a super-packet: finished in place and handed on where it was read, no copy.
        let ip = &mut read[VIRTIO_NET_HDR_LEN..];
        let len = n - VIRTIO_NET_HDR_LEN;
        finish_checksum(&mut ip[..len], csum);
        f(ip, len);
        return Ok(1);
    }
    let mut count = 0;
    while let Some(r) = s.next_into(seg) {
        let len = r?;
        f(seg, len);
        count += 1;
    }
    Ok(count)
}

/// The datagrams of one received buffer (several when GRO coalesced them).
pub fn datagrams<'b>(buf: &'b [u8], m: &RecvMeta) -> impl Iterator<Item = &'b [u8]> {
    let len = m.len.min(buf.len());
    buf[..len].chunks(m.segment_size.max(1))
}
