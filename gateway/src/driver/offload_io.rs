//! The offload pipeline both worker backends run: a [`TxBatch`] that gathers the WireGuard
//! datagrams of one round into `UDP_SEGMENT` sends, a [`TunBatch`] that gathers the
//! decrypted packets of one round and coalesces them into `virtio_net_hdr` super-packets,
//! and [`OffloadIo`], the device's `Io` sink over both.
//!
//! What to batch with what is decided here and in `core::gso` (plain data: `GsoBatch`,
//! the coalescer's groups); *how* bytes reach the kernel is the [`Backend`]'s: the poll
//! backend ([`SyscallBackend`]: `sendmsg`/`sendmmsg`/`write`, waiting for room when the
//! socket is full) or the io_uring backend (`driver::uring_worker`: registered pool
//! buffers, one `SendMsg` per batch, `WriteFixed` to the TUN). Both therefore split TSO
//! super-packets, send GSO batches, receive GRO trains and coalesce TUN writes alike.
//!
//! [`Pipeline`] is the backend-independent half of a worker (batches, buffers, sticky
//! sources); the one worker loop (`driver::worker::run_loop`) hands it what its backend
//! received and flushes it when the round ends.
//!
//! Both batches also flush themselves when full, so `flush` at the end of a round only
//! bounds latency. No syscall happens under a peer lock: the device's `Io` calls only
//! copy into the batch buffers, a full batch is only queued by the backend (a `Vec`
//! entry, or an SQE), and queues are handed to the kernel between packets
//! ([`Backend::relieve`]) or when the round ends.
//!
//! Why ~890 lines of code: `TxBatch`, `TunBatch`, `OffloadIo` and `Pipeline` share the
//! slot/commit protocol with the device and the backend's buffer ownership; apart, each
//! would need the others' internals. The pure planning they execute is `core::gso`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::device::{Device, Io, PeerAddr, Table, SCRATCH_SIZE};
use crate::core::gso::{
    finish_checksum, CoalesceOptions, Coalescer, GsoBatch, GsoError, Splitter, MAX_BATCH,
    VIRTIO_NET_HDR_LEN,
};
use crate::driver::worker::TcpOut;
use crate::sys::cmsg::{PktInfo, RecvMeta};
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::{UdpSocket, MAX_GSO_SEGMENTS};

/// Largest send one GSO batch carries (also the biggest single datagram we send).
pub const GSO_BUF: usize = 65536;
/// Bytes of decrypted packets a [`TunBatch`] holds before it must flush.
const ARENA: usize = 512 * 1024;
/// How long a send may wait in total for room in a full socket before the rest of the
/// batch is dropped (backpressure for the tunnel's TCP flows; bounded so a dead route
/// cannot stall the worker).
const SEND_WAIT: Duration = Duration::from_millis(200);

/// How a worker's bytes reach the kernel. Buffers come from the backend so the batch is
/// built where the kernel will read it (a registered pool buffer under io_uring).
pub trait Backend {
    /// A buffer of at least [`GSO_BUF`] bytes the backend lends out.
    type Buf;
    /// A free buffer, or `None` when none is left (the packet is dropped and counted).
    fn alloc(&mut self) -> Option<Self::Buf>;
    /// The bytes of a buffer this backend lent out.
    fn bytes<'b>(&'b self, b: &'b mut Self::Buf) -> &'b mut [u8];
    /// Give back a buffer that was not used.
    fn release(&mut self, b: Self::Buf);
    /// Datagrams one batch may carry (GSO segments, or datagrams of one `sendmmsg`).
    fn max_segments(&self) -> usize;
    /// Send the first `len` bytes of `b` to `dst` as datagrams of `seg` bytes (the last
    /// may be shorter), from the local address `src` when given (else routing picks).
    /// Takes the buffer back.
    fn send(&mut self, b: Self::Buf, len: usize, to: Dst, seg: usize);
    /// Write the first `len` bytes of `b` to the TUN as one (super-)packet.
    fn write_tun(&mut self, b: Self::Buf, len: usize);
    /// Write one plain packet to the TUN (no `vnet_hdr`).
    fn write_tun_plain(&mut self, p: &[u8]) {
        if let Some(mut b) = self.alloc() {
            let n = p.len().min(GSO_BUF);
            self.bytes(&mut b)[..n].copy_from_slice(&p[..n]);
            self.write_tun(b, n);
        }
    }
    /// Drops for lack of a buffer, a ring slot or room in the socket.
    fn dropped(&self) -> u64;
    /// Hand everything queued to the kernel. Called at the end of a round, never under a
    /// peer lock; `send` and `write_tun` only queue (see [`Self::relieve`]).
    fn submit(&mut self) {}
    /// Called by the drain between packets (outside any peer lock): hand what is queued
    /// to the kernel early when the queue is long, which bounds memory.
    fn relieve(&mut self) {}
}

/// Where a datagram goes: the peer, and the local address to send from (the one the
/// peer last reached us at, `IP_PKTINFO`; `None`: routing picks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dst {
    pub addr: SocketAddr,
    pub src: Option<PktInfo>,
}

impl Dst {
    pub fn to(addr: SocketAddr) -> Dst {
        Dst { addr, src: None }
    }
}

/// Gathers datagrams to one destination at a time into one batch (a `UDP_SEGMENT` send,
/// or one `sendmmsg`), built in a backend buffer.
pub struct TxBatch<B> {
    cur: Option<(B, GsoBatch, Option<PktInfo>)>,
    /// Sends that carried more than one datagram.
    pub batched_sends: u64,
}

impl<B> Default for TxBatch<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> TxBatch<B> {
    pub fn new() -> Self {
        TxBatch {
            cur: None,
            batched_sends: 0,
        }
    }

    /// Whether a datagram of `len` bytes to `to` joins the batch being built.
    fn joins(&self, to: Dst, len: usize) -> bool {
        self.cur.as_ref().is_some_and(|(_, b, src)| {
            b.destination() == to.addr && *src == to.src && b.can_push(len)
        })
    }

    /// Queue one datagram for `to`; sends what was queued first when `to` changes or
    /// the datagram cannot join (bigger than the segment size, batch full).
    pub fn push<K: Backend<Buf = B>>(&mut self, be: &mut K, to: Dst, d: &[u8]) {
        if d.is_empty() || d.len() > GSO_BUF {
            return;
        }
        if !self.joins(to, d.len()) {
            self.flush(be);
            let b = GsoBatch::new(to.addr, be.max_segments());
            if !b.can_push(d.len()) {
                // Too big for any batch (a 65507+ byte datagram): let the kernel judge it.
                if let Some(mut buf) = be.alloc() {
                    be.bytes(&mut buf)[..d.len()].copy_from_slice(d);
                    be.send(buf, d.len(), to, d.len());
                }
                return;
            }
            let Some(buf) = be.alloc() else { return };
            self.cur = Some((buf, b, to.src));
        }
        if let Some((buf, b, _)) = self.cur.as_mut() {
            let at = b.size();
            be.bytes(buf)[at..at + d.len()].copy_from_slice(d);
            b.push(d.len());
        }
    }

    /// Room for the next datagram to `to` (at least `max` bytes) at the end of the
    /// batch, starting a new batch when one of `expected` bytes cannot join; the device
    /// encrypts into it and then calls [`Self::commit`]. `None` when no buffer is left.
    pub fn slot<'s, K: Backend<Buf = B>>(
        &'s mut self,
        be: &'s mut K,
        to: Dst,
        expected: usize,
        max: usize,
    ) -> Option<&'s mut [u8]> {
        if max > GSO_BUF {
            return None;
        }
        let room = self
            .cur
            .as_ref()
            .is_some_and(|(_, b, _)| b.size() + max <= GSO_BUF);
        if !(room && self.joins(to, expected)) {
            self.flush(be);
            let buf = be.alloc()?;
            self.cur = Some((buf, GsoBatch::new(to.addr, be.max_segments()), to.src));
        }
        let (buf, b, _) = self.cur.as_mut()?;
        let at = b.size();
        Some(&mut be.bytes(buf)[at..at + max])
    }

    /// The datagram of `len` bytes written into the last [`Self::slot`] for `to`
    /// joins the batch. One that cannot (a handshake initiation where the batch holds
    /// data of another size) goes out on its own, after what was queued.
    pub fn commit<K: Backend<Buf = B>>(&mut self, be: &mut K, to: Dst, len: usize) {
        if self.joins(to, len) {
            if let Some((_, b, _)) = self.cur.as_mut() {
                b.push(len);
            }
            return;
        }
        let Some((buf, b, _)) = self.cur.as_mut() else {
            return;
        };
        // Rare (a handshake initiation written where a data packet was expected): move
        // the bytes to a buffer of their own, send the batch, then them.
        let at = b.size();
        let Some(mut own) = be.alloc() else {
            return;
        };
        be.bytes(&mut own)[..len].copy_from_slice(&be.bytes(buf)[at..at + len]);
        self.flush(be);
        be.send(own, len, to, len);
    }

    /// Send what is queued.
    pub fn flush<K: Backend<Buf = B>>(&mut self, be: &mut K) {
        let Some((buf, mut b, src)) = self.cur.take() else {
            return;
        };
        match b.finish() {
            Some(t) => {
                if t.size > t.segment_size {
                    self.batched_sends += 1;
                }
                let to = Dst {
                    addr: t.destination,
                    src,
                };
                be.send(buf, t.size, to, t.segment_size);
            }
            None => be.release(buf),
        }
    }
}

/// Gathers decrypted packets and writes them to the TUN coalesced.
pub struct TunBatch {
    arena: Vec<u8>,
    used: usize,
    spans: heapless::Vec<(u32, u32), MAX_BATCH>,
    coalescer: Coalescer,
    vnet_hdr: bool,
    /// Groups the coalescer could not write.
    pub write_errors: u64,
    /// Super-packets written (each merged two or more packets).
    pub coalesced: u64,
}

impl TunBatch {
    /// `opts` from the TUN's offload (`tso()`, `uso()`); `vnet_hdr` as the TUN was created.
    pub fn new(opts: CoalesceOptions, vnet_hdr: bool) -> Self {
        TunBatch {
            arena: vec![0; ARENA],
            used: 0,
            spans: heapless::Vec::new(),
            coalescer: Coalescer::new(opts),
            vnet_hdr,
            write_errors: 0,
            coalesced: 0,
        }
    }

    /// Queue one plain IP packet.
    pub fn push<K: Backend>(&mut self, be: &mut K, p: &[u8]) {
        if !self.vnet_hdr {
            be.write_tun_plain(p);
            return;
        }
        if p.len() > ARENA {
            return;
        }
        if self.spans.is_full() || self.used + p.len() > ARENA {
            self.flush(be);
        }
        self.arena[self.used..self.used + p.len()].copy_from_slice(p);
        // Cannot fail: flushed above when full.
        let _ = self.spans.push((self.used as u32, p.len() as u32));
        self.used += p.len();
    }

    /// Room for the next decrypted packet (at least `max` bytes) in the arena, where the
    /// device decrypts it; [`Self::commit`] queues it. `None` without `vnet_hdr` (plain
    /// writes go straight from the device's buffer) or for a packet that cannot fit.
    pub fn slot<K: Backend>(&mut self, be: &mut K, max: usize) -> Option<&mut [u8]> {
        if !self.vnet_hdr || max > ARENA {
            return None;
        }
        if self.spans.is_full() || self.used + max > ARENA {
            self.flush(be);
        }
        Some(&mut self.arena[self.used..self.used + max])
    }

    /// The first `len` bytes of the last [`Self::slot`] are a packet to write.
    pub fn commit(&mut self, len: usize) {
        if self.used + len <= ARENA && self.spans.push((self.used as u32, len as u32)).is_ok() {
            self.used += len;
        }
    }

    /// Coalesce and write what is queued: each group straight into a backend buffer.
    pub fn flush<K: Backend>(&mut self, be: &mut K) {
        if self.spans.is_empty() {
            return;
        }
        let mut pkts: heapless::Vec<&[u8], MAX_BATCH> = heapless::Vec::new();
        for &(at, len) in &self.spans {
            let _ = pkts.push(&self.arena[at as usize..(at + len) as usize]);
        }
        self.coalescer.plan(&pkts);
        for g in self.coalescer.groups() {
            let Some(mut buf) = be.alloc() else { break };
            match self.coalescer.write(&g, &pkts, be.bytes(&mut buf)) {
                Ok(n) => {
                    if g.count > 1 {
                        self.coalesced += 1;
                    }
                    be.write_tun(buf, n);
                }
                Err(e) => {
                    be.release(buf);
                    self.write_errors += 1;
                    log::trace!("coalesce: {e}");
                }
            }
        }
        self.spans.clear();
        self.used = 0;
    }
}

/// TCP-fallback messages gathered during a round, sent when it ends (the transport's
/// send may write to the socket: not under a peer lock).
#[derive(Default)]
pub struct TcpQueue {
    bytes: Vec<u8>,
    msgs: Vec<(u64, u32, u32)>,
}

impl TcpQueue {
    fn push(&mut self, conn: u64, d: &[u8]) {
        self.msgs
            .push((conn, self.bytes.len() as u32, d.len() as u32));
        self.bytes.extend_from_slice(d);
    }

    fn send(&mut self, tcp: Option<&dyn TcpOut>) {
        if let Some(t) = tcp {
            for &(conn, at, len) in &self.msgs {
                t.send(conn, &self.bytes[at as usize..(at + len) as usize]);
            }
        }
        self.msgs.clear();
        self.bytes.clear();
    }
}

/// Sticky source addresses, shared by all workers: for each peer address, the local
/// address its last *authenticated* datagram came to (`IP_PKTINFO`), so replies leave
/// from it — a multi-homed gateway answers from the address the client used, as
/// wireguard-go's sticky sockets do. Shared because the peer's datagrams arrive on one
/// worker (`SO_REUSEPORT` hashes the 4-tuple) while the TUN flows to it are read by any.
/// Only authenticated datagrams teach it (a forged one cannot move our source); bounded
/// (cleared when full, relearned from the next datagrams). Changes are rare (a new peer,
/// a roam): each replaces the map whole and moves a generation, and workers reload
/// their snapshot once per round when it moved — no lock on the packet path.
#[derive(Debug, Default)]
pub struct StickyTable {
    generation: AtomicU64,
    map: Mutex<Arc<HashMap<SocketAddr, PktInfo>>>,
}

/// Peer addresses [`StickyTable`] remembers before it starts over.
const STICKY_MAX: usize = 4096;

impl StickyTable {
    fn snapshot(&self) -> (u64, Arc<HashMap<SocketAddr, PktInfo>>) {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        (self.generation.load(Ordering::Acquire), m.clone())
    }

    fn publish(&self, peer: SocketAddr, local: PktInfo) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(&peer) == Some(&local) {
            return;
        }
        let mut next = if m.len() >= STICKY_MAX {
            HashMap::new()
        } else {
            (**m).clone()
        };
        next.insert(peer, local);
        *m = Arc::new(next);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The local address `peer` last reached us at, read under the lock: for the rare
    /// sends from outside the workers (timers, the TCP thread).
    pub fn source_for(&self, peer: SocketAddr) -> Option<PktInfo> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&peer).copied()
    }

    /// Forget every source (one was gone: the next datagrams teach them again).
    pub fn clear(&self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !m.is_empty() {
            *m = Arc::new(HashMap::new());
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// One worker's view of the [`StickyTable`]: a snapshot read without locking.
#[derive(Debug)]
pub struct Sticky {
    table: Arc<StickyTable>,
    generation: u64,
    map: Arc<HashMap<SocketAddr, PktInfo>>,
}

impl Sticky {
    pub fn new(table: Arc<StickyTable>) -> Sticky {
        let (generation, map) = table.snapshot();
        Sticky {
            table,
            generation,
            map,
        }
    }

    /// Take in what other workers learnt (once per round; a lock only when it moved).
    pub fn refresh(&mut self) {
        if self.table.generation.load(Ordering::Acquire) != self.generation {
            (self.generation, self.map) = self.table.snapshot();
        }
    }

    /// The local address to answer `peer` from.
    pub fn get(&self, peer: SocketAddr) -> Option<PktInfo> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&peer).copied()
    }

    /// An authenticated datagram from `peer` came to `local`.
    pub fn learn(&mut self, peer: SocketAddr, local: Option<PktInfo>) {
        let Some(local) = local else { return };
        if self.map.get(&peer) == Some(&local) {
            return;
        }
        self.table.publish(peer, local);
        self.refresh();
    }

    /// A send from a remembered address failed as if the address were gone: forget
    /// them all (rare; the next authenticated datagrams teach them again).
    pub fn forget(&mut self) {
        self.table.clear();
        self.refresh();
    }
}

/// The device's `Io` sink for a worker: the two batches over a backend.
pub struct OffloadIo<'a, K: Backend> {
    pub be: &'a mut K,
    pub tcp: Option<&'a dyn TcpOut>,
    pub tcp_queue: &'a mut TcpQueue,
    pub tx: &'a mut TxBatch<K::Buf>,
    pub rx: &'a mut TunBatch,
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
        self.rx.flush(self.be);
        self.be.submit();
        self.tcp_queue.send(self.tcp);
    }

    fn dst(&self, a: SocketAddr) -> Dst {
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
            PeerAddr::Tcp { conn, .. } => {
                if self.tcp.is_some() {
                    self.tcp_queue.push(conn, d);
                }
            }
        }
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.rx.push(self.be, p);
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
        self.rx.slot(self.be, max)
    }

    fn tun_commit(&mut self, len: usize) {
        self.rx.commit(len);
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
    pub tx: TxBatch<B>,
    pub rx: TunBatch,
    tcp_queue: TcpQueue,
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
        let co = CoalesceOptions {
            tcp: vnet_hdr && offload.tso(),
            udp: vnet_hdr && offload.uso(),
        };
        Pipeline {
            tx: TxBatch::new(),
            rx: TunBatch::new(co, vnet_hdr),
            tcp_queue: TcpQueue::default(),
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
            rx,
            tcp_queue,
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
                tcp_queue,
                tx,
                rx,
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
            rx,
            tcp_queue,
            sticky,
            vnet_hdr,
            seg,
            scratch,
            malformed_reads,
        } = self;
        let mut io = OffloadIo {
            be,
            tcp: cx.tcp,
            tcp_queue,
            tx,
            rx,
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
            tcp_queue: &mut self.tcp_queue,
            tx: &mut self.tx,
            rx: &mut self.rx,
            sticky: &self.sticky,
            reply: None,
        }
        .flush();
    }
}

/// The poll backend: plain syscalls on a socket and a TUN queue, made when the round
/// ends ([`Backend::submit`]). Its buffers are reusable vectors: the batches of one round
/// (about [`MAX_PENDING`] before the drain submits early) and two being built.
pub struct SyscallBackend<'a> {
    pub sock: &'a UdpSocket,
    /// `None` for a send-only use (tests).
    pub tun: Option<&'a TunQueue>,
    pub spare: &'a mut Vec<Vec<u8>>,
    pub pending: &'a mut Vec<Pending>,
    pub stats: &'a mut SendStats,
}

/// Most batches the poll backend holds before it must submit (bounds its memory to
/// about this many 64 KiB buffers).
pub const MAX_PENDING: usize = 16;

/// A send or TUN write the poll backend will make at the end of the round.
pub enum Pending {
    Send {
        buf: Vec<u8>,
        len: usize,
        to: Dst,
        seg: usize,
    },
    Tun {
        buf: Vec<u8>,
        len: usize,
    },
}

/// What the poll backend counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendStats {
    /// Datagrams dropped: the socket stayed full for `SEND_WAIT` (200 ms), or refused them.
    pub dropped: u64,
    /// Times a send waited for room in the socket (backpressure).
    pub waits: u64,
    /// TUN writes refused.
    pub tun_errors: u64,
}

impl SyscallBackend<'_> {
    fn queue(&mut self, p: Pending) {
        // No early submit here: this may run under a peer lock (a batch filled while
        // the device encrypts). The drain calls `relieve` between packets instead.
        self.pending.push(p);
    }

    fn write_now(&mut self, p: &[u8]) {
        let r = match self.tun {
            Some(t) => t.write(p),
            None => Err(io::ErrorKind::NotConnected.into()),
        };
        if let Err(e) = r {
            self.stats.tun_errors += 1;
            log::trace!("tun write: {e}");
        }
    }

    fn wait_writable(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        self.stats.waits += 1;
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut pfd = [nix::poll::PollFd::new(
            self.sock.as_fd(),
            nix::poll::PollFlags::POLLOUT,
        )];
        matches!(nix::poll::poll(&mut pfd, ms), Ok(n) if n > 0)
    }
}

impl Backend for SyscallBackend<'_> {
    type Buf = Vec<u8>;

    fn alloc(&mut self) -> Option<Vec<u8>> {
        Some(self.spare.pop().unwrap_or_else(|| vec![0; GSO_BUF]))
    }

    fn bytes<'b>(&'b self, b: &'b mut Vec<u8>) -> &'b mut [u8] {
        b
    }

    fn release(&mut self, b: Vec<u8>) {
        self.spare.push(b);
    }

    fn max_segments(&self) -> usize {
        // Without GSO the batch goes out as one sendmmsg (sys::udp splits it).
        MAX_GSO_SEGMENTS
    }

    fn send(&mut self, buf: Vec<u8>, len: usize, to: Dst, seg: usize) {
        self.queue(Pending::Send { buf, len, to, seg });
    }

    fn write_tun(&mut self, buf: Vec<u8>, len: usize) {
        self.queue(Pending::Tun { buf, len });
    }

    fn write_tun_plain(&mut self, p: &[u8]) {
        // A copy, so the write can wait for the end of the round (plain TUN only; with
        // vnet_hdr packets are decrypted straight into the coalescing arena).
        if let Some(mut b) = self.alloc() {
            let n = p.len().min(b.len());
            b[..n].copy_from_slice(&p[..n]);
            self.queue(Pending::Tun { buf: b, len: n });
        }
    }

    fn submit(&mut self) {
        let pending = std::mem::take(self.pending);
        for p in pending {
            match p {
                Pending::Send { buf, len, to, seg } => {
                    self.send_now(&buf, len, to, seg);
                    self.spare.push(buf);
                }
                Pending::Tun { buf, len } => {
                    self.write_now(&buf[..len]);
                    self.spare.push(buf);
                }
            }
        }
    }

    fn dropped(&self) -> u64 {
        self.stats.dropped
    }

    fn relieve(&mut self) {
        if self.pending.len() >= MAX_PENDING {
            self.submit();
        }
    }
}

impl SyscallBackend<'_> {
    fn send_now(&mut self, b: &[u8], len: usize, to: Dst, seg: usize) {
        let dst = to.addr;
        let seg = seg.clamp(1, usize::from(u16::MAX));
        let total = len.div_ceil(seg);
        let mut done = 0;
        let mut deadline = None;
        while done < total {
            let from = done * seg;
            // A stale source (the address is gone) is retried without it inside.
            match self
                .sock
                .send_segmented_from(to.src, dst, &b[from..len], seg as u16)
            {
                Ok(k) => {
                    done += k;
                    if k == 0 {
                        break;
                    }
                    if done < total {
                        // Partly taken: the socket is full; wait for room.
                        let d = *deadline.get_or_insert_with(|| Instant::now() + SEND_WAIT);
                        if !self.wait_writable(d) {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + SEND_WAIT);
                    if !self.wait_writable(d) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::trace!("send to {dst}: {e}");
                    break;
                }
            }
        }
        self.stats.dropped += (total - done.min(total)) as u64;
    }
}

/// Datagram buffers per receive batch (64 KiB each: a GRO train can be that long).
pub const RECV_BATCH: usize = 16;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::gso::VIRTIO_NET_HDR_LEN;
    use crate::driver::worker::{round, PollEngine};
    use crate::sys::tun::tests::{in_new_netns, ip};
    use crate::sys::tun::Tun;
    use crate::sys::udp::UdpOptions;
    use std::os::fd::AsFd;

    fn wait_readable(s: &UdpSocket) -> bool {
        let mut pfd = [nix::poll::PollFd::new(
            s.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut pfd, 5000u16).unwrap_or(0) == 1
    }

    fn recv_all(s: &UdpSocket, want: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while out.iter().sum::<usize>() < want && wait_readable(s) {
            let m = s.recv_gro(&mut buf).expect("recv");
            out.extend(datagrams(&buf, &m).map(<[u8]>::len));
        }
        out
    }

    /// `n` loopback sockets without GRO (so each datagram is received on its own) and
    /// without `SO_REUSEPORT` (which lets the kernel give another test the same port).
    fn loopback(n: usize) -> Vec<UdpSocket> {
        let opts = UdpOptions {
            gro: false,
            reuse_port: false,
            ..UdpOptions::default()
        };
        (0..n)
            .map(|_| UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind"))
            .collect()
    }

    #[test]
    fn tx_batch_groups_by_destination_and_size() {
        let s = loopback(3);
        let (a, b, c) = (&s[0], &s[1], &s[2]);
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            sock: a,
            tun: None,
            spare: &mut spare,
            pending: &mut pending,
            stats: &mut stats,
        };
        let mut tx = TxBatch::new();
        for _ in 0..5 {
            tx.push(&mut be, Dst::to(b.local_addr()), &[1; 1200]);
        }
        tx.push(&mut be, Dst::to(b.local_addr()), &[2; 300]); // short last: closes the batch
        tx.push(&mut be, Dst::to(b.local_addr()), &[3; 1200]); // starts a new one
        tx.push(&mut be, Dst::to(c.local_addr()), &[4; 80]); // other destination
        tx.flush(&mut be);
        be.submit();
        assert_eq!(
            recv_all(b, 1200 * 6 + 300),
            [1200, 1200, 1200, 1200, 1200, 300, 1200]
        );
        assert_eq!(recv_all(c, 80), [80]);
        assert_eq!(be.dropped(), 0);
        assert_eq!(tx.batched_sends, 1);
        // One buffer per batch of the round (3), given back and reused next round.
        assert_eq!(
            spare.len(),
            3,
            "buffers are reused, not allocated per batch"
        );
    }

    /// The device writes into batch slots: small datagrams, then a larger one to the same
    /// place, then one bigger than the device expected (a handshake where data was due).
    /// Each must arrive; the larger one may not join a batch of smaller segments.
    #[test]
    fn tx_batch_slots_of_mixed_sizes_all_arrive() {
        let s = loopback(2);
        let (a, b) = (&s[0], &s[1]);
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            sock: a,
            tun: None,
            spare: &mut spare,
            pending: &mut pending,
            stats: &mut stats,
        };
        let mut tx = TxBatch::new();
        let dst = Dst::to(b.local_addr());
        for (expected, actual, fill) in [(80, 80, 1u8), (80, 80, 2), (1000, 1000, 3), (80, 148, 4)]
        {
            let slot = tx
                .slot(&mut be, dst, expected, 148.max(expected))
                .expect("slot");
            slot[..actual].fill(fill);
            tx.commit(&mut be, dst, actual);
        }
        tx.flush(&mut be);
        be.submit();
        assert_eq!(recv_all(b, 80 + 80 + 1000 + 148), [80, 80, 1000, 148]);
        assert_eq!(be.dropped(), 0);
    }

    /// Without GSO (demoted, or `Offload = mmsg`) a batch still carries many datagrams:
    /// one sendmmsg, not one syscall each.
    #[test]
    fn tx_batch_without_gso_still_batches() {
        let s = loopback(2);
        let (a, b) = (&s[0], &s[1]);
        a.disable_gso();
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            sock: a,
            tun: None,
            spare: &mut spare,
            pending: &mut pending,
            stats: &mut stats,
        };
        let mut tx = TxBatch::new();
        for i in 0..20u8 {
            tx.push(&mut be, Dst::to(b.local_addr()), &[i; 1000]);
        }
        tx.flush(&mut be);
        be.submit();
        assert_eq!(tx.batched_sends, 1, "20 datagrams, one batch");
        assert_eq!(recv_all(b, 20_000), [1000; 20]);
        assert_eq!(be.dropped(), 0);
    }

    #[test]
    fn sticky_sources_learn_answer_and_forget() {
        let peer: SocketAddr = "192.0.2.1:51820".parse().expect("a");
        let local = PktInfo {
            ip: "198.51.100.7".parse().expect("ip"),
            ifindex: 2,
        };
        let table = Arc::new(StickyTable::default());
        let (mut st, mut other) = (Sticky::new(table.clone()), Sticky::new(table.clone()));
        assert_eq!(st.get(peer), None);
        st.learn(peer, None);
        assert_eq!(st.get(peer), None, "no pktinfo, nothing learnt");
        st.learn(peer, Some(local));
        assert_eq!(st.get(peer), Some(local));
        // Another worker sees it from its next round on.
        assert_eq!(other.get(peer), None);
        other.refresh();
        assert_eq!(other.get(peer), Some(local));
        let g = table.generation.load(Ordering::Relaxed);
        other.learn(peer, Some(local));
        assert_eq!(
            table.generation.load(Ordering::Relaxed),
            g,
            "known: no change"
        );
        // Bounded: full, it starts over.
        for i in 0..STICKY_MAX as u16 {
            st.learn(SocketAddr::from(([10, 0, 0, 1], i)), Some(local));
        }
        assert!(table.snapshot().1.len() <= STICKY_MAX);
        st.forget();
        assert_eq!(st.get(peer), None);
        other.refresh();
        assert_eq!(other.get(peer), None, "forgotten for all workers");
        // While answering a datagram, its sender gets the address it used, others the
        // sticky one (none here).
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let s = loopback(1);
        let mut be = SyscallBackend {
            sock: &s[0],
            tun: None,
            spare: &mut spare,
            pending: &mut pending,
            stats: &mut stats,
        };
        let (mut tq, mut tx, mut rx) = (
            TcpQueue::default(),
            TxBatch::new(),
            TunBatch::new(CoalesceOptions::default(), false),
        );
        let io = OffloadIo {
            be: &mut be,
            tcp: None,
            tcp_queue: &mut tq,
            tx: &mut tx,
            rx: &mut rx,
            sticky: &st,
            reply: Some((peer, local)),
        };
        assert_eq!(io.dst(peer).src, Some(local));
        assert_eq!(io.dst("192.0.2.2:1".parse().expect("a")).src, None);
    }

    /// Datagrams to one peer from two local addresses never share a batch (one
    /// sendmsg has one source).
    #[test]
    fn tx_batch_splits_on_source_address() {
        let s = loopback(2);
        let (a, b) = (&s[0], &s[1]);
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            sock: a,
            tun: None,
            spare: &mut spare,
            pending: &mut pending,
            stats: &mut stats,
        };
        let lo = |ip: [u8; 4]| {
            Some(PktInfo {
                ip: ip.into(),
                ifindex: 0,
            })
        };
        let mut tx = TxBatch::new();
        for src in [lo([127, 0, 0, 1]), lo([127, 0, 0, 1]), None, None] {
            let to = Dst {
                addr: b.local_addr(),
                src,
            };
            tx.push(&mut be, to, &[1; 500]);
        }
        tx.flush(&mut be);
        assert_eq!(be.pending.len(), 2, "two batches: one per source");
        be.submit();
        assert_eq!(recv_all(b, 2000), [500; 4]);
        assert_eq!(be.dropped(), 0);
    }

    #[test]
    fn datagrams_of_a_gro_buffer() {
        let buf = [0u8; 2500];
        let m = RecvMeta {
            len: 2500,
            segment_size: 1000,
            ..RecvMeta::default()
        };
        let lens: Vec<usize> = datagrams(&buf, &m).map(<[u8]>::len).collect();
        assert_eq!(lens, [1000, 1000, 500]);
        let bogus = RecvMeta {
            len: 9000,
            segment_size: 0,
            ..m
        };
        assert_eq!(
            datagrams(&buf, &bogus).map(<[u8]>::len).sum::<usize>(),
            2500
        );
    }

    /// An IPv4/UDP packet 10.81.0.2:7 -> 10.81.0.1:port with valid checksums.
    fn udp4(port: u16, payload: &[u8]) -> Vec<u8> {
        udp4_from([10, 81, 0, 2], port, payload)
    }

    fn udp4_from(src: [u8; 4], port: u16, payload: &[u8]) -> Vec<u8> {
        crate::testutil::ipv4_udp(src, 7, [10, 81, 0, 1], port, payload)
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn tun_batch_writes_coalesced_packets_the_kernel_accepts() {
        in_new_netns(|| {
            let tun = Tun::create("rgob0", 1, true).expect("tun");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", "10.81.0.1/24", "dev", "rgob0"]);
            ip(&["link", "set", "rgob0", "up"]);
            let opts = UdpOptions {
                gro: false,
                ..UdpOptions::default()
            };
            let s = UdpSocket::bind("10.81.0.1:5000".parse().expect("addr"), &opts).expect("bind");
            let q = tun.queue(0).expect("q");
            let co = CoalesceOptions {
                tcp: tun.offload().tso(),
                udp: tun.offload().uso(),
            };
            let (mut spare, mut pending, mut stats) =
                (Vec::new(), Vec::new(), SendStats::default());
            let mut be = SyscallBackend {
                pending: &mut pending,
                sock: &s,
                tun: Some(q),
                spare: &mut spare,
                stats: &mut stats,
            };
            let mut rx = TunBatch::new(co, true);
            for i in 0..10u8 {
                rx.push(&mut be, &udp4(5000, &[i; 1000]));
            }
            rx.push(&mut be, &udp4(5000, &[10; 400]));
            rx.flush(&mut be);
            be.submit();
            assert_eq!(rx.write_errors, 0);
            assert_eq!(be.stats.tun_errors, 0);
            assert_eq!(
                rx.coalesced,
                u64::from(tun.offload().uso()),
                "one USO super-packet"
            );
            let got = recv_all(&s, 10_400);
            assert_eq!(got.len(), 11, "{got:?}");
            assert_eq!(got.iter().sum::<usize>(), 10_400);

            // Without vnet_hdr the packets go straight through.
            let plain = Tun::create("rgob1", 1, false).expect("tun");
            ip(&["addr", "add", "10.81.1.1/24", "dev", "rgob1"]);
            ip(&["link", "set", "rgob1", "up"]);
            let mut rx = TunBatch::new(CoalesceOptions::default(), false);
            let p = udp4_from([10, 81, 1, 2], 5000, &[1; 100]);
            let (mut spare, mut pending, mut stats) =
                (Vec::new(), Vec::new(), SendStats::default());
            let mut be = SyscallBackend {
                pending: &mut pending,
                sock: &s,
                tun: Some(plain.queue(0).expect("q")),
                spare: &mut spare,
                stats: &mut stats,
            };
            rx.push(&mut be, &p);
            be.submit();
            assert_eq!(recv_all(&s, 100), [100]);
        });
    }

    fn device(
        own: crate::core::key::Key,
        peer: crate::core::key::Key,
        allowed: &str,
        ep: SocketAddr,
    ) -> Device {
        crate::testutil::one_peer_device(own, peer, allowed, ep, None)
    }

    /// Two WireGuard devices, each behind a vnet_hdr TUN in its own namespace, joined
    /// over loopback by `OffloadWorker`s: a TCP transfer and a UDP burst from A's
    /// namespace to B's must arrive intact, with TSO super-packets split before
    /// encryption, GSO sends between the devices and coalesced writes into B's TUN.
    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn wireguard_tunnel_with_offloads_end_to_end() {
        tunnel(true, 4 << 20);
    }

    /// The same without any offload (plain TUN, no GSO/GRO): the fallback path.
    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn wireguard_tunnel_without_offloads_end_to_end() {
        tunnel(false, 1 << 20);
    }

    /// Throughput of both paths (one thread drives both devices, so only the ratio
    /// means anything): `cargo test --release -p riceguard --lib bench_tunnel -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bench_tunnel_offload_vs_plain() {
        for offload in [false, true] {
            let t = tunnel(offload, 256 << 20);
            eprintln!(
                "offload={offload}: 256 MiB in {:.2?} = {:.2} Gbit/s",
                t,
                (256u64 << 23) as f64 / t.as_secs_f64() / 1e9
            );
        }
    }

    /// Run one transfer through the tunnel; returns how long the TCP part took.
    fn tunnel(offload: bool, bytes: usize) -> std::time::Duration {
        use crate::core::key::Key;
        use std::io::{Read, Write};
        use std::sync::mpsc;
        use std::time::{Duration, Instant};

        let pattern = |i: usize| (i % 253) as u8;
        let ns = |name: &'static str, addr: &'static str, route: &'static str| {
            move || {
                let tun = Tun::create(name, 1, offload).expect("tun");
                ip(&["link", "set", "lo", "up"]);
                ip(&["addr", "add", addr, "dev", name]);
                ip(&["link", "set", name, "up"]);
                ip(&["route", "add", route, "dev", name]);
                tun
            }
        };

        let (tx_b, rx_b) = mpsc::channel();
        let setup_b = ns("rgwgb0", "10.82.1.1/24", "10.82.0.0/24");
        let server = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let tun = setup_b();
            let l = std::net::TcpListener::bind("10.82.1.1:6001").expect("listen");
            let u = UdpSocket::bind(
                "10.82.1.1:6002".parse().expect("addr"),
                &UdpOptions {
                    gro: false,
                    ..UdpOptions::default()
                },
            )
            .expect("udp");
            tx_b.send(tun).expect("send");
            let (mut c, _) = l.accept().expect("accept");
            c.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            let (mut got, mut ok) = (0usize, true);
            let mut buf = vec![0u8; 65536];
            loop {
                let n = c.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                ok &= buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(k, b)| *b == pattern(got + k));
                got += n;
            }
            (got, ok, recv_all(&u, 12_000))
        });
        let tun_b: Tun = rx_b.recv().expect("tun b");

        let (tx_a, rx_a) = mpsc::channel();
        let setup_a = ns("rgwga0", "10.82.0.1/24", "10.82.1.0/24");
        let client = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let tun = setup_a();
            let u = UdpSocket::bind("10.82.0.1:0".parse().expect("addr"), &UdpOptions::default())
                .expect("udp");
            tx_a.send(tun).expect("send");
            let dst = "10.82.1.1:6001".parse().expect("addr");
            let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(10))
                .expect("connect");
            let data: Vec<u8> = (0..bytes).map(pattern).collect();
            s.write_all(&data).expect("write");
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            u.send_segmented(
                "10.82.1.1:6002".parse().expect("addr"),
                &[7u8; 12_000],
                1200,
            )
            .expect("udp burst");
        });
        let tun_a: Tun = rx_a.recv().expect("tun a");

        // The WireGuard side: both devices' sockets on loopback in this namespace.
        let opts = UdpOptions {
            gso: offload,
            gro: offload,
            reuse_port: false,
            ..UdpOptions::default()
        };
        let sock_a = UdpSocket::bind("127.0.0.1:0".parse().expect("a"), &opts).expect("a");
        let sock_b = UdpSocket::bind("127.0.0.1:0".parse().expect("b"), &opts).expect("b");
        let (ka, kb) = (
            Key::generate_private(&mut rand_core::OsRng),
            Key::generate_private(&mut rand_core::OsRng),
        );
        let dev_a = device(ka, kb, "10.82.1.0/24", sock_b.local_addr());
        let dev_b = device(kb, ka, "10.82.0.0/24", sock_a.local_addr());
        let (qa, qb) = (tun_a.queue(0).expect("qa"), tun_b.queue(0).expect("qb"));
        // Each side is the worker loop's poll engine and pipeline, driven by hand here
        // (one thread for both devices): the round is the loop's own `worker::round`.
        let (sock_a, sock_b) = (std::sync::Arc::new(sock_a), std::sync::Arc::new(sock_b));
        let dup = |q: &TunQueue| q.try_clone().expect("dup queue");
        let mut ea = PollEngine::new(dup(qa), sock_a.clone());
        let mut eb = PollEngine::new(dup(qb), sock_b.clone());
        let mut pa: Pipeline<Vec<u8>> = Pipeline::new(tun_a.offload(), offload, Arc::default());
        let mut pb: Pipeline<Vec<u8>> = Pipeline::new(tun_b.offload(), offload, Arc::default());
        let start = Instant::now();
        let (mut ca, mut cb) = (dev_a.cache(), dev_b.cache());

        let deadline =
            Instant::now() + Duration::from_secs(if bytes > 64 << 20 { 600 } else { 60 });
        while !server.is_finished() && Instant::now() < deadline {
            let mut pfd = [
                nix::poll::PollFd::new(qa.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(sock_a.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(qb.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(sock_b.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            let _ = nix::poll::poll(&mut pfd, 20u16);
            let cxa = Cx {
                dev: &dev_a,
                table: ca.get(&dev_a),
                tcp: None,
            };
            let cxb = Cx {
                dev: &dev_b,
                table: cb.get(&dev_b),
                tcp: None,
            };
            ea.assume_ready();
            assert!(round(&mut ea, &mut pa, &cxa).tun_gone.is_none(), "tun a");
            eb.assume_ready();
            assert!(round(&mut eb, &mut pb, &cxb).tun_gone.is_none(), "tun b");
        }
        let (got, ok, burst) = server.join().expect("server");
        let took = start.elapsed();
        client.join().expect("client");
        assert_eq!(got, bytes, "every TCP byte through the tunnel");
        assert!(ok, "TCP bytes intact");
        assert_eq!(burst, vec![1200; 10], "UDP burst as 10 datagrams");
        assert_eq!(pa.malformed_reads + pb.malformed_reads, 0);
        assert_eq!(ea.stats.dropped + eb.stats.dropped + pb.rx.write_errors, 0);
        if offload && tun_a.offload().tso() && sock_a.gso_enabled() {
            assert!(pa.tx.batched_sends > 0, "A sent GSO batches");
            assert!(pb.rx.coalesced > 0, "B wrote coalesced super-packets");
        }
        eprintln!(
            "A: {} GSO sends; B: {} coalesced TUN writes; B acks: {} GSO sends",
            pa.tx.batched_sends, pb.rx.coalesced, pb.tx.batched_sends
        );
        took
    }

    #[test]
    fn split_tun_read_plain_and_malformed() {
        let mut p = udp4(1, &[1; 10]);
        let n = p.len();
        p.resize(n + 16, 0);
        let mut seg = vec![0u8; 65535];
        let mut seen = Vec::new();
        assert_eq!(
            split_tun_read(&mut p, n, false, &mut seg, |x, len| seen
                .push((len, x.len()))),
            Ok(1)
        );
        let mut v = vec![0u8; VIRTIO_NET_HDR_LEN];
        v.extend_from_slice(&p[..n]);
        let vn = v.len();
        v.resize(vn + 16, 0);
        let at = v.as_ptr() as usize + VIRTIO_NET_HDR_LEN;
        let mut in_place = false;
        assert_eq!(
            split_tun_read(&mut v, vn, true, &mut seg, |x, len| {
                in_place = x.as_ptr() as usize == at;
                seen.push((len, x.len()))
            }),
            Ok(1)
        );
        // The packet, and the room after it for padding; a plain packet behind a
        // virtio_net_hdr is handed on where it was read (no copy).
        assert_eq!(seen, [(38, 54), (38, 54)]);
        assert!(in_place);
        assert!(split_tun_read(&mut v, 5, true, &mut seg, |_, _| {}).is_err());
    }
}
