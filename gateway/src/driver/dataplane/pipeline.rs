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

use crate::core::device::{Device, Io, LaneJob, Peer, PeerAddr, Table, SCRATCH_SIZE};
use crate::core::gso::{finish_checksum, GsoError, Splitter, VIRTIO_NET_HDR_LEN};
use crate::driver::dataplane::backend::{Backend, Dst};
use crate::driver::dataplane::outbox::{Outbox, Outlets};
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::spread::{Job, Opened, Role, Spread, JOB_BYTES};
use crate::driver::dataplane::sticky::{Sticky, StickyTable};
use crate::driver::dataplane::tun_batch::{coalesce_options, DirectTun, TunBatch};
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

impl Lanes {
    /// Write what the coalescer holds to its queue, now.
    fn flush_writes(&mut self) {
        let Some(q) = self.current.and_then(|c| self.sp.queue(c)) else {
            return;
        };
        self.writes.flush(&mut DirectTun {
            queue: q,
            buf: &mut self.buf,
            errors: &mut self.write_errors,
        });
    }

    /// With `peer`'s write role: its finished trains in ticket order into the
    /// coalescer, each for the TUN queue of the worker that received it (what the
    /// coalescer held for another queue written first).
    fn take_ready(&mut self, peer: &Arc<Peer>) {
        let sp = self.sp.clone();
        while let Some(id) = peer.lane.next_to_write() {
            {
                let j = sp.job(id);
                let by = j.received_by;
                if self.current != Some(by) {
                    self.flush_writes();
                    self.current = Some(by);
                }
                if let Some(q) = sp.queue(by) {
                    let mut d = DirectTun {
                        queue: q,
                        buf: &mut self.buf,
                        errors: &mut self.write_errors,
                    };
                    for p in j.opened.packets() {
                        self.writes.push(&mut d, p);
                    }
                }
                if by != self.me {
                    sp.note_written_elsewhere();
                }
            }
            sp.free_job(id);
        }
    }

    /// Write what was gathered for `peer` and let its role go (or, if its next train
    /// finished meanwhile, take that too and try again).
    fn finish_one(&mut self, peer: Arc<Peer>) {
        loop {
            self.flush_writes();
            if !peer.lane.release_write() {
                return;
            }
            self.take_ready(&peer);
        }
    }

    /// End of the round: everything gathered written, every held write role let go
    /// (each only after its trains reached the TUN).
    fn finish(&mut self) {
        while !self.held.is_empty() {
            self.flush_writes();
            let held = std::mem::take(&mut self.held);
            for peer in held {
                if peer.lane.release_write() {
                    // Finished meanwhile: taken, and held until the next pass writes it.
                    self.take_ready(&peer);
                    let _ = self.held.push(peer);
                }
            }
        }
    }
}

/// The device's `Io` sink while it opens a lane's train: sends go to the worker's
/// batches as usual, decrypted packets into the job (written later, in lane order).
struct LaneIo<'a, 'j, K: Backend> {
    out: OffloadIo<'a, K>,
    opened: &'j mut Opened,
}

impl<K: Backend> Io for LaneIo<'_, '_, K> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.out.send(to, d)
    }
    fn tun_write(&mut self, p: &[u8]) {
        if let Some(s) = self.opened.slot(p.len()) {
            s.copy_from_slice(p);
            self.opened.commit(p.len());
        }
    }
    fn send_slot(&mut self, to: PeerAddr, expected: usize, max: usize) -> Option<&mut [u8]> {
        self.out.send_slot(to, expected, max)
    }
    fn send_commit(&mut self, to: PeerAddr, len: usize) {
        self.out.send_commit(to, len)
    }
    fn tun_slot(&mut self, max: usize) -> Option<&mut [u8]> {
        self.opened.slot(max)
    }
    fn tun_commit(&mut self, len: usize) {
        self.opened.commit(len)
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
    /// One peer on every core (with more than one worker): see `spread`.
    spread: Option<Lanes>,
}

/// A worker's part in spreading one peer's trains: the shared pool and inboxes, and
/// its own TUN queue handle and coalescer for the trains it writes in lane order.
struct Lanes {
    sp: Arc<Spread>,
    me: usize,
    /// Finished trains gathered this round, coalesced, for the TUN queue `current`.
    writes: TunBatch,
    current: Option<usize>,
    /// The write roles this worker holds until the round's end.
    held: heapless::Vec<Arc<Peer>, 16>,
    buf: Vec<u8>,
    write_errors: u64,
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
            spread: None,
        }
    }

    /// Spread the peers' received trains over the workers (worker `me` of `sp`, whose
    /// TUN queue handle it has [`Spread::join`]ed).
    pub fn spread(&mut self, sp: Arc<Spread>, me: usize) {
        let writes = TunBatch::new(self.tun_writes.options(), self.vnet_hdr);
        self.spread = Some(Lanes {
            sp,
            me,
            writes,
            current: None,
            held: heapless::Vec::new(),
            buf: Vec::new(),
            write_errors: 0,
        });
    }

    /// Whether this worker spreads (then [`Self::serve_roles`] runs every round).
    pub fn spreading(&self) -> Option<(&Arc<Spread>, usize)> {
        self.spread.as_ref().map(|l| (&l.sp, l.me))
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
        if self.spread.is_some() {
            return self.datagrams_spread(be, cx, buf, m);
        }
        self.datagrams_direct(be, cx, buf, m)
    }

    /// [`Self::datagrams`] one at a time, each through the device on this worker.
    fn datagrams_direct<K: Backend<Buf = B>>(
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

    /// [`Self::datagrams`] with spreading: each run of data messages for one peer is a
    /// train of that peer's lane (see `spread`); anything else (handshakes, cookies,
    /// data for no peer) goes through the device here, one at a time.
    fn datagrams_spread<K: Backend<Buf = B>>(
        &mut self,
        be: &mut K,
        cx: &Cx<'_>,
        buf: &[u8],
        m: &RecvMeta,
    ) -> usize {
        let len = m.len.min(buf.len());
        let seg = m.segment_size.max(1);
        let mut n = 0;
        let mut at = 0;
        while at < len {
            let first = &buf[at..(at + seg).min(len)];
            let Some(peer) = cx.dev.data_peer(cx.table, first) else {
                let one = RecvMeta {
                    len: first.len(),
                    segment_size: first.len(),
                    ..*m
                };
                n += self.datagrams_direct(be, cx, first, &one);
                at += first.len();
                continue;
            };
            // The run: the following datagrams for the same peer.
            let mut end = at + first.len();
            while end < len {
                let d = &buf[end..(end + seg).min(len)];
                if !Device::is_data_for(peer, d) {
                    break;
                }
                end += d.len();
            }
            let run = RecvMeta {
                len: end - at,
                ..*m
            };
            n += (end - at).div_ceil(seg);
            self.train(be, cx, peer, &buf[at..end], run);
            at = end;
        }
        n
    }

    /// One train of `peer`'s data messages into its lane: handed to an idle worker,
    /// opened here, or queued for the decrypt role's holder (see `spread`).
    fn train<K: Backend<Buf = B>>(
        &mut self,
        be: &mut K,
        cx: &Cx<'_>,
        peer: &Arc<Peer>,
        bytes: &[u8],
        meta: RecvMeta,
    ) {
        let Some(l) = &self.spread else { return };
        let (sp, me) = (l.sp.clone(), l.me);
        sp.note_trains();
        let Some(id) = sp.take_job() else { return };
        let Some(t) = peer
            .lane
            .ticket(bytes.len().div_ceil(meta.segment_size.max(1)))
        else {
            sp.note_full();
            sp.free_job(id);
            return;
        };
        {
            let mut j = sp.job(id);
            j.peer = Some(peer.clone());
            j.ticket = Some(t);
            j.meta = Some(meta);
            j.received_by = me;
        }
        let copy = |j: &mut Job| {
            let n = bytes.len().min(JOB_BYTES);
            j.cipher.resize(JOB_BYTES, 0);
            j.cipher[..n].copy_from_slice(&bytes[..n]);
        };
        if bytes.len() >= sp.min_bytes && sp.anyone_idle(me) {
            copy(&mut sp.job(id));
            if peer.lane.queue(t, id) {
                // The decrypt role was free and is ours: an idle worker takes it.
                if let Err(Role::Decrypt(p) | Role::Write(p)) =
                    sp.hand_off(me, Role::Decrypt(peer.clone()))
                {
                    self.drain_decrypt(be, cx, &p);
                }
            } else {
                self.help_write(peer);
            }
            return;
        }
        if peer.lane.try_decrypt() {
            self.open_job(be, cx, id, Some(bytes));
            self.drain_decrypt(be, cx, peer);
        } else {
            copy(&mut sp.job(id));
            if peer.lane.queue(t, id) {
                self.drain_decrypt(be, cx, peer);
            } else {
                self.help_write(peer);
            }
        }
    }

    /// Another worker is opening `peer`'s trains: write what it finished if nobody is
    /// writing, so the receiving worker shares the work (it receives and writes, the
    /// other opens) instead of receiving faster than one worker can open and write.
    fn help_write(&mut self, peer: &Arc<Peer>) {
        if peer.lane.try_write() {
            self.write_lane(peer);
        }
    }

    /// Holding `peer`'s decrypt role: open every queued train, then let the role go.
    fn drain_decrypt<K: Backend<Buf = B>>(&mut self, be: &mut K, cx: &Cx<'_>, peer: &Arc<Peer>) {
        while let Some((_, id)) = peer.lane.next_to_decrypt() {
            self.open_job(be, cx, id, None);
        }
    }

    /// Open job `id` (its train is `inline`, still in the receive buffer, or the copy
    /// in the job) under one peer lock, complete it in its lane, and write or hand on
    /// the write role if that came with it.
    fn open_job<K: Backend<Buf = B>>(
        &mut self,
        be: &mut K,
        cx: &Cx<'_>,
        id: LaneJob,
        inline: Option<&[u8]>,
    ) {
        let Pipeline {
            tx,
            tun_writes,
            outbox,
            sticky,
            scratch,
            spread,
            ..
        } = self;
        let Some(l) = spread.as_ref() else { return };
        let (sp, me) = (l.sp.clone(), l.me);
        let mut guard = sp.job(id);
        let j: &mut Job = &mut guard;
        let (Some(peer), Some(t), Some(m)) = (j.peer.clone(), j.ticket, j.meta) else {
            return;
        };
        if j.received_by != me {
            sp.note_handed_off();
        }
        let Job { cipher, opened, .. } = j;
        let bytes = match inline {
            Some(b) => b,
            None => &cipher[..m.len.min(cipher.len())],
        };
        let mut io = LaneIo {
            out: OffloadIo {
                be,
                tcp: cx.tcp,
                outbox,
                tx,
                tun_writes,
                sticky,
                reply: m.dst.map(|d| (m.src, d)),
            },
            opened,
        };
        let seg = m.segment_size.max(1);
        // Timed: the peer's lock is held for all of it (the serial part of a peer's
        // inbound work, which the status line reports).
        let t_open = std::time::Instant::now();
        let ok = cx.dev.handle_data_train(
            cx.table,
            &peer,
            PeerAddr::Udp(m.src),
            bytes.chunks(seg),
            scratch,
            &mut io,
        );
        sp.note_open(t_open.elapsed(), bytes.len());
        io.out.be.relieve();
        if ok > 0 {
            sticky.learn(m.src, m.dst);
        }
        let big = m.len >= sp.min_bytes;
        drop(guard);
        if peer.lane.complete(t, id) {
            // The write role came with it: to an idle worker if this train is worth the
            // wake-up, else written here.
            let kept = if big {
                sp.hand_off(me, Role::Write(peer)).err()
            } else {
                Some(Role::Write(peer))
            };
            if let Some(Role::Write(p) | Role::Decrypt(p)) = kept {
                self.write_lane(&p);
            }
        }
    }

    /// Holding `peer`'s write role: its finished trains, in ticket order, into the
    /// lane coalescer. The role stays with this worker until the round's end
    /// ([`Self::flush`]), when what was gathered is written and the role let go — so the
    /// small trains of a round go out coalesced, in as few writes as the direct path's.
    fn write_lane(&mut self, peer: &Arc<Peer>) {
        let Some(l) = self.spread.as_mut() else {
            return;
        };
        l.take_ready(peer);
        if !l.held.iter().any(|p| Arc::ptr_eq(p, peer)) {
            if let Err(p) = l.held.push(peer.clone()) {
                // Holding as many as it may: this one is written and let go now.
                l.finish_one(p);
            }
        }
    }

    /// The lane roles other workers handed to this one (every round, and after a
    /// wake-up).
    pub fn serve_roles<K: Backend<Buf = B>>(&mut self, be: &mut K, cx: &Cx<'_>) {
        let Some((sp, me)) = self.spreading().map(|(s, m)| (s.clone(), m)) else {
            return;
        };
        if !sp.take_wake(me) {
            return;
        }
        while let Some(role) = sp.next_role(me) {
            match role {
                Role::Decrypt(p) => self.drain_decrypt(be, cx, &p),
                Role::Write(p) => self.write_lane(&p),
            }
        }
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
            ..
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
        // One lock of the peer for a super-packet's segments (per 64 KiB, not per
        // packet); the queue goes to the kernel after it, outside the lock.
        let mut burst = cx.dev.tun_burst(cx.table);
        let r = split_tun_read(frame, n, *vnet_hdr, seg, |p, len| {
            burst.packet(p, len, scratch, &mut io);
        });
        drop(burst);
        io.be.relieve();
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
        if let Some(l) = &mut self.spread {
            l.finish();
        }
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
