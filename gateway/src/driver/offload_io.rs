//! Batching adapters that put the offload building blocks under a worker loop without
//! changing the device: a [`TxBatch`] that gathers the WireGuard datagrams of one TUN
//! read into `UDP_SEGMENT` sends, a [`TunBatch`] that gathers the decrypted packets of one
//! UDP receive batch and coalesces them into `virtio_net_hdr` super-packets, and
//! [`OffloadIo`], the device's `Io` sink over both.
//!
//! Call sequence in a worker (everything allocated once, before the loop):
//!
//! ```text
//! let tun = Tun::create(name, workers, true)?;                 // vnet_hdr on
//! let sock = UdpSocket::bind("[::]:port", &UdpOptions::default())?;  // one per worker
//! sys::offload::decide_and_apply(egress.as_deref(), mode, &[&sock, ...]);  // once
//! let mut w = OffloadWorker::new(tun.offload(), true);
//! loop {
//!     poll(queue, sock);
//!     let table = cache.get(&device);
//!     w.pump_udp(&device, table, queue, &sock, tcp, 4);       // Err: log, go on
//!     w.pump_tun(&device, table, queue, &sock, tcp, 64)?;     // Err: the TUN is gone
//! }
//! ```
//!
//! Or by hand: `split_tun_read` each TUN read into the device, `datagrams` each received
//! buffer into it, with an [`OffloadIo`] as the device's sink and `flush` after each batch.
//! Both batches also flush themselves when full, so `flush` only bounds latency.

use std::io;
use std::net::SocketAddr;

use crate::core::device::{Device, Io, PeerAddr, Table, SCRATCH_SIZE};
use crate::core::gso::{
    CoalesceOptions, Coalescer, GsoBatch, GsoError, Splitter, MAX_BATCH, VIRTIO_NET_HDR_LEN,
};
use crate::driver::worker::TcpOut;
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::{RecvMeta, UdpSocket};

/// Largest send one GSO batch carries (also the biggest single datagram we send).
const GSO_BUF: usize = 65536;
/// Bytes of decrypted packets a [`TunBatch`] holds before it must flush.
const ARENA: usize = 512 * 1024;

/// Gathers datagrams to one destination at a time into a `UDP_SEGMENT` send.
pub struct TxBatch {
    buf: Vec<u8>,
    batch: Option<GsoBatch>,
    /// Sends the kernel refused (counted, not retried: UDP is lossy anyway).
    pub send_errors: u64,
    /// Sends that carried more than one datagram.
    pub gso_sends: u64,
}

impl Default for TxBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl TxBatch {
    pub fn new() -> Self {
        TxBatch {
            buf: vec![0; GSO_BUF],
            batch: None,
            send_errors: 0,
            gso_sends: 0,
        }
    }

    /// Queue one datagram for `dst`; sends what was queued first when `dst` changes or
    /// the datagram cannot join (bigger than the segment size, batch full).
    pub fn push(&mut self, sock: &UdpSocket, dst: SocketAddr, d: &[u8]) {
        if d.is_empty() || d.len() > GSO_BUF {
            return;
        }
        let joins = self
            .batch
            .as_ref()
            .is_some_and(|b| b.destination() == dst && b.can_push(d.len()));
        if !joins {
            self.flush(sock);
            let b = GsoBatch::new(dst, sock.max_gso_segments());
            if !b.can_push(d.len()) {
                // Too big for any batch (a 65507+ byte datagram): let the kernel judge it.
                self.send(sock, dst, d, d.len());
                return;
            }
            self.batch = Some(b);
        }
        if let Some(b) = self.batch.as_mut() {
            let at = b.size();
            self.buf[at..at + d.len()].copy_from_slice(d);
            b.push(d.len());
        }
    }

    /// Send what is queued.
    pub fn flush(&mut self, sock: &UdpSocket) {
        let Some(t) = self.batch.take().and_then(|mut b| b.finish()) else {
            return;
        };
        let buf = std::mem::take(&mut self.buf);
        self.send(sock, t.destination, &buf[..t.size], t.segment_size);
        self.buf = buf;
    }

    fn send(&mut self, sock: &UdpSocket, dst: SocketAddr, d: &[u8], seg: usize) {
        if d.len() > seg {
            self.gso_sends += 1;
        }
        let seg = u16::try_from(seg).unwrap_or(u16::MAX);
        if let Err(e) = sock.send_segmented(dst, d, seg) {
            self.send_errors += 1;
            log::trace!("send to {dst}: {e}");
        }
    }
}

/// Gathers decrypted packets and writes them to the TUN coalesced.
pub struct TunBatch {
    arena: Vec<u8>,
    used: usize,
    spans: heapless::Vec<(u32, u32), MAX_BATCH>,
    coalescer: Coalescer,
    out: Vec<u8>,
    vnet_hdr: bool,
    /// Writes the TUN refused.
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
            out: vec![0; VIRTIO_NET_HDR_LEN + 65535],
            vnet_hdr,
            write_errors: 0,
            coalesced: 0,
        }
    }

    /// Queue one plain IP packet.
    pub fn push(&mut self, tun: &TunQueue, p: &[u8]) {
        if !self.vnet_hdr {
            if let Err(e) = tun.write(p) {
                self.write_errors += 1;
                log::trace!("tun write: {e}");
            }
            return;
        }
        if p.len() > ARENA {
            return;
        }
        if self.spans.is_full() || self.used + p.len() > ARENA {
            self.flush(tun);
        }
        self.arena[self.used..self.used + p.len()].copy_from_slice(p);
        // Cannot fail: flushed above when full.
        let _ = self.spans.push((self.used as u32, p.len() as u32));
        self.used += p.len();
    }

    /// Coalesce and write what is queued.
    pub fn flush(&mut self, tun: &TunQueue) {
        if self.spans.is_empty() {
            return;
        }
        let mut pkts: heapless::Vec<&[u8], MAX_BATCH> = heapless::Vec::new();
        for &(at, len) in &self.spans {
            let _ = pkts.push(&self.arena[at as usize..(at + len) as usize]);
        }
        self.coalescer.plan(&pkts);
        let mut errors = 0;
        for g in self.coalescer.groups() {
            match self.coalescer.write(&g, &pkts, &mut self.out) {
                Ok(n) => {
                    if g.count > 1 {
                        self.coalesced += 1;
                    }
                    if let Err(e) = tun.write(&self.out[..n]) {
                        errors += 1;
                        log::trace!("tun write: {e}");
                    }
                }
                Err(e) => {
                    errors += 1;
                    log::trace!("coalesce: {e}");
                }
            }
        }
        self.write_errors += errors;
        self.spans.clear();
        self.used = 0;
    }
}

/// The device's `Io` sink for an offloading worker.
pub struct OffloadIo<'a> {
    pub sock: &'a UdpSocket,
    pub tun: &'a TunQueue,
    pub tcp: Option<&'a dyn TcpOut>,
    pub tx: &'a mut TxBatch,
    pub rx: &'a mut TunBatch,
}

impl OffloadIo<'_> {
    /// Send and write everything queued (end of a TUN read or a UDP receive batch).
    pub fn flush(&mut self) {
        self.tx.flush(self.sock);
        self.rx.flush(self.tun);
    }
}

impl Io for OffloadIo<'_> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        match to {
            PeerAddr::Udp(a) => self.tx.push(self.sock, a, d),
            PeerAddr::Tcp { conn, .. } => {
                if let Some(t) = self.tcp {
                    t.send(conn, d);
                }
            }
        }
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.rx.push(self.tun, p);
    }
}

/// Datagram buffers per receive batch (64 KiB each: a GRO train can be that long).
pub const RECV_BATCH: usize = 16;

/// Everything one offloading worker owns: the batches and every buffer, allocated once.
/// Its two `pump_*` calls replace a worker's TUN and UDP drain loops.
pub struct OffloadWorker {
    pub tx: TxBatch,
    pub rx: TunBatch,
    vnet_hdr: bool,
    rbuf: Vec<u8>,
    seg: Vec<u8>,
    scratch: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    /// TUN reads the splitter rejected.
    pub malformed_reads: u64,
}

impl OffloadWorker {
    /// For a TUN created with `vnet_hdr` whose `TUNSETOFFLOAD` left `offload`.
    pub fn new(offload: TunOffload, vnet_hdr: bool) -> Self {
        let co = CoalesceOptions {
            tcp: vnet_hdr && offload.tso(),
            udp: vnet_hdr && offload.uso(),
        };
        OffloadWorker {
            tx: TxBatch::new(),
            rx: TunBatch::new(co, vnet_hdr),
            vnet_hdr,
            rbuf: vec![0; VIRTIO_NET_HDR_LEN + 65535],
            seg: vec![0; 65535],
            scratch: vec![0; SCRATCH_SIZE],
            bufs: vec![vec![0; 65536]; RECV_BATCH],
            metas: vec![RecvMeta::default(); RECV_BATCH],
            malformed_reads: 0,
        }
    }

    /// Up to `max_reads` TUN reads through the device, then the GSO sends. Returns the
    /// reads done; `Err` only for a TUN error other than `WouldBlock`/`EINTR` (gone).
    #[allow(clippy::too_many_arguments)]
    pub fn pump_tun(
        &mut self,
        dev: &Device,
        table: &Table,
        q: &TunQueue,
        sock: &UdpSocket,
        tcp: Option<&dyn TcpOut>,
        max_reads: usize,
    ) -> io::Result<usize> {
        let OffloadWorker {
            tx,
            rx,
            vnet_hdr,
            rbuf,
            seg,
            scratch,
            malformed_reads,
            ..
        } = self;
        let mut io = OffloadIo {
            sock,
            tun: q,
            tcp,
            tx,
            rx,
        };
        let mut reads = 0;
        let mut result = Ok(());
        while reads < max_reads {
            let n = match q.read(rbuf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            reads += 1;
            let r = split_tun_read(&rbuf[..n], *vnet_hdr, seg, |p| {
                dev.handle_tun_packet(table, p, scratch, &mut io)
            });
            if let Err(e) = r {
                *malformed_reads += 1;
                log::trace!("tun read: {e}");
            }
        }
        io.flush();
        result.map(|()| reads)
    }

    /// Up to `max_batches` receive batches through the device, then the coalesced TUN
    /// writes. Returns the datagrams handled. A receive error ends the pump; it is
    /// returned only when nothing was handled, and is not fatal (ICMP errors such as
    /// `ECONNREFUSED` surface here): log it and go on.
    #[allow(clippy::too_many_arguments)]
    pub fn pump_udp(
        &mut self,
        dev: &Device,
        table: &Table,
        q: &TunQueue,
        sock: &UdpSocket,
        tcp: Option<&dyn TcpOut>,
        max_batches: usize,
    ) -> io::Result<usize> {
        let OffloadWorker {
            tx,
            rx,
            scratch,
            bufs,
            metas,
            ..
        } = self;
        let mut io = OffloadIo {
            sock,
            tun: q,
            tcp,
            tx,
            rx,
        };
        let mut handled = 0;
        let mut result = Ok(());
        for _ in 0..max_batches {
            let received = {
                let mut slices: heapless::Vec<&mut [u8], RECV_BATCH> = heapless::Vec::new();
                for b in bufs.iter_mut() {
                    let _ = slices.push(&mut b[..]);
                }
                sock.recv_batch(&mut slices, metas)
            };
            let k = match received {
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if handled == 0 {
                        result = Err(e);
                    }
                    break;
                }
            };
            for (m, b) in metas[..k].iter().zip(bufs.iter()) {
                for d in datagrams(b, m) {
                    dev.handle_datagram(table, PeerAddr::Udp(m.src), d, scratch, &mut io);
                    handled += 1;
                }
            }
            if k < RECV_BATCH {
                break;
            }
        }
        io.flush();
        result.map(|()| handled)
    }
}

/// Hand each plain IP packet of one TUN read to `f`: the read itself without
/// `vnet_hdr`, else its segments (split into `seg`, which needs 65535 bytes).
/// Returns the number of packets; a malformed read is an error (count and drop it).
pub fn split_tun_read(
    read: &[u8],
    vnet_hdr: bool,
    seg: &mut [u8],
    mut f: impl FnMut(&[u8]),
) -> Result<usize, GsoError> {
    if !vnet_hdr {
        f(read);
        return Ok(1);
    }
    let mut s = Splitter::new(read)?;
    let mut n = 0;
    while let Some(r) = s.next_into(seg) {
        let len = r?;
        f(&seg[..len]);
        n += 1;
    }
    Ok(n)
}

/// The datagrams of one received buffer (several when GRO coalesced them).
pub fn datagrams<'b>(buf: &'b [u8], m: &RecvMeta) -> impl Iterator<Item = &'b [u8]> {
    let len = m.len.min(buf.len());
    buf[..len].chunks(m.segment_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::gso::checksum;
    use crate::sys::tun::tests::{can_net_admin, in_new_netns, ip};
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

    #[test]
    fn tx_batch_groups_by_destination_and_size() {
        let opts = UdpOptions {
            gro: false,
            ..UdpOptions::default()
        };
        let a = UdpSocket::bind("127.0.0.1:0".parse().expect("a"), &opts).expect("a");
        let b = UdpSocket::bind("127.0.0.1:0".parse().expect("b"), &opts).expect("b");
        let c = UdpSocket::bind("127.0.0.1:0".parse().expect("c"), &opts).expect("c");
        let mut tx = TxBatch::new();
        for _ in 0..5 {
            tx.push(&a, b.local_addr(), &[1; 1200]);
        }
        tx.push(&a, b.local_addr(), &[2; 300]); // short last: closes the batch
        tx.push(&a, b.local_addr(), &[3; 1200]); // starts a new one
        tx.push(&a, c.local_addr(), &[4; 80]); // other destination
        tx.flush(&a);
        assert_eq!(
            recv_all(&b, 1200 * 6 + 300),
            [1200, 1200, 1200, 1200, 1200, 300, 1200]
        );
        assert_eq!(recv_all(&c, 80), [80]);
        assert_eq!(tx.send_errors, 0);
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
        let total = 28 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&[10, 81, 0, 1]);
        let c = !checksum::fold(checksum::sum(&p[..20], 0));
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p[20..22].copy_from_slice(&7u16.to_be_bytes());
        p[22..24].copy_from_slice(&port.to_be_bytes());
        p[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        let ph = checksum::pseudo_header(&p[12..16], &p[16..20], 17, total - 20);
        let c = !checksum::fold(checksum::sum(&p[20..], ph));
        p[26..28].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn tun_batch_writes_coalesced_packets_the_kernel_accepts() {
        if !can_net_admin() {
            eprintln!("skipped: needs root and /dev/net/tun");
            return;
        }
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
            let mut rx = TunBatch::new(co, true);
            for i in 0..10u8 {
                rx.push(q, &udp4(5000, &[i; 1000]));
            }
            rx.push(q, &udp4(5000, &[10; 400]));
            rx.flush(q);
            assert_eq!(rx.write_errors, 0);
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
            rx.push(plain.queue(0).expect("q"), &p);
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
    fn wireguard_tunnel_with_offloads_end_to_end() {
        if !can_net_admin() {
            eprintln!("skipped: needs root and /dev/net/tun");
            return;
        }
        tunnel(true, 4 << 20);
    }

    /// The same without any offload (plain TUN, no GSO/GRO): the fallback path.
    #[test]
    fn wireguard_tunnel_without_offloads_end_to_end() {
        if !can_net_admin() {
            eprintln!("skipped: needs root and /dev/net/tun");
            return;
        }
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
            ..UdpOptions::default()
        };
        let sock_a = UdpSocket::bind("127.0.0.1:0".parse().expect("a"), &opts).expect("a");
        let sock_b = UdpSocket::bind("127.0.0.1:0".parse().expect("b"), &opts).expect("b");
        let (ka, kb) = (Key::generate_private(), Key::generate_private());
        let dev_a = device(ka, kb, "10.82.1.0/24", sock_b.local_addr());
        let dev_b = device(kb, ka, "10.82.0.0/24", sock_a.local_addr());
        let (qa, qb) = (tun_a.queue(0).expect("qa"), tun_b.queue(0).expect("qb"));
        let mut wa = OffloadWorker::new(tun_a.offload(), offload);
        let mut wb = OffloadWorker::new(tun_b.offload(), offload);
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
            let (ta, tb) = (ca.get(&dev_a), cb.get(&dev_b));
            wa.pump_tun(&dev_a, ta, qa, &sock_a, None, 64)
                .expect("tun a");
            wb.pump_udp(&dev_b, tb, qb, &sock_b, None, 4)
                .expect("udp b");
            wb.pump_tun(&dev_b, tb, qb, &sock_b, None, 64)
                .expect("tun b");
            wa.pump_udp(&dev_a, ta, qa, &sock_a, None, 4)
                .expect("udp a");
        }
        let (got, ok, burst) = server.join().expect("server");
        let took = start.elapsed();
        client.join().expect("client");
        assert_eq!(got, bytes, "every TCP byte through the tunnel");
        assert!(ok, "TCP bytes intact");
        assert_eq!(burst, vec![1200; 10], "UDP burst as 10 datagrams");
        assert_eq!(wa.malformed_reads + wb.malformed_reads, 0);
        assert_eq!(wa.tx.send_errors + wb.rx.write_errors, 0);
        if offload && tun_a.offload().tso() && sock_a.gso_enabled() {
            assert!(wa.tx.gso_sends > 0, "A sent GSO batches");
            assert!(wb.rx.coalesced > 0, "B wrote coalesced super-packets");
        }
        eprintln!(
            "A: {} GSO sends; B: {} coalesced TUN writes; B acks: {} GSO sends",
            wa.tx.gso_sends, wb.rx.coalesced, wb.tx.gso_sends
        );
        took
    }

    #[test]
    fn split_tun_read_plain_and_malformed() {
        let p = udp4(1, &[1; 10]);
        let mut seg = vec![0u8; 65535];
        let mut seen = Vec::new();
        assert_eq!(
            split_tun_read(&p, false, &mut seg, |x| seen.push(x.len())),
            Ok(1)
        );
        let mut v = vec![0u8; VIRTIO_NET_HDR_LEN];
        v.extend_from_slice(&p);
        assert_eq!(
            split_tun_read(&v, true, &mut seg, |x| seen.push(x.len())),
            Ok(1)
        );
        assert_eq!(seen, [38, 38]);
        assert!(split_tun_read(&v[..5], true, &mut seg, |_| {}).is_err());
    }
}
