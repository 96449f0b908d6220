//! The per-core worker loop on io_uring: the same job as [`worker::run`] (one UDP socket
//! and one TUN queue per worker, drained into the [`Device`]), with the I/O done by one
//! ring per worker and packet memory from one (hugepage) buffer pool per worker.
//!
//! - `K` TUN reads stay in flight (`ReadFixed` into pool buffers); each completion is
//!   handed to `handle_tun_packet` and the buffer goes straight back into a new read.
//! - One multishot `RecvMsg` on the UDP socket with a provided buffer ring; each datagram
//!   (or each segment of a GRO batch) goes to `handle_datagram`, then the buffer is
//!   recycled to the kernel.
//! - The device's answers ([`Io`]) are copied into a free pool buffer and queued as
//!   `SendMsg` / `WriteFixed`; nothing is allocated per packet. All queued SQEs go to the
//!   kernel with one `io_uring_enter` per loop iteration (the wait).
//!
//! When the ring or the pool cannot be set up, [`run`] gives the TUN queue back with the
//! reason, and the caller runs the portable worker instead.

use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::cqueue;
use nix::errno::Errno;

use crate::core::config::{GatewayConfig, PollMode};
use std::net::SocketAddr;

use crate::core::device::{PeerAddr, SCRATCH_SIZE};
use crate::core::gso::CoalesceOptions;
use crate::driver::offload_io::{split_tun_read, Backend, OffloadIo, TcpQueue, TunBatch, TxBatch};
#[cfg(doc)]
use crate::driver::worker;
use crate::driver::worker::Shared;
use crate::sys::hugepage::{BufId, BufPool, PoolConfig, PoolError};
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::UdpSocket;
use crate::sys::uring::{self, Completion, Rejected, Ring, RingConfig, UringError};

#[cfg(doc)]
use crate::core::device::Device;

/// How long one wait may block, so `stop` and socket changes are noticed.
const WAIT: Duration = Duration::from_millis(100);
/// `Poll = adaptive`: after a round with traffic, keep polling without sleeping this
/// long: an answer (a ping reply from the stack, the next packet of a burst) usually
/// comes within it, and a sleeping worker costs a wake-up per packet. Bounded, so an idle
/// worker sleeps. Not the default: on cores shared with other work (our 2-core bench,
/// where both tunnel ends and iperf3 run) the spinning took the time the other side
/// needed — single-stream TCP fell from ~4000 to ~2500 Mbit/s and idle RTT rose from
/// 0.37 to 0.82 ms.
pub const ADAPTIVE_SPIN: Duration = Duration::from_micros(200);

/// `SqPoll = on`: how long the kernel's submission-polling thread spins idle before it
/// sleeps (and the next submit wakes it with one `io_uring_enter`).
const SQPOLL_IDLE_MS: u32 = 50;

/// Whether a worker polls without sleeping now.
pub fn spin_now(mode: PollMode, hot_until: Instant) -> bool {
    match mode {
        PollMode::Busy => true,
        PollMode::Adaptive => Instant::now() < hot_until,
        PollMode::Sleep => false,
    }
}
/// Completions handled per reap (more stay in the CQ for the next round).
const REAP: usize = 256;
/// After this many receive errors in a row, pause re-arming for [`RECV_BACKOFF`].
const RECV_ERRORS_BEFORE_BACKOFF: u32 = 8;
const RECV_BACKOFF: Duration = Duration::from_millis(100);

/// Sizes of one io_uring worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringWorkerConfig {
    pub pool: PoolConfig,
    pub ring: RingConfig,
    /// TUN reads kept in flight.
    pub tun_reads: u32,
    /// How the worker waits (`Poll =`).
    pub poll: PollMode,
}

impl UringWorkerConfig {
    /// From `[Gateway]`: `Buffers =` buffers per worker, `Hugepages =`.
    pub fn from_gateway(g: &GatewayConfig) -> UringWorkerConfig {
        let mut pool = PoolConfig::new(g.buffers);
        pool.hugepages = g.hugepages;
        // A quarter of the pool each for receives and TUN reads (capped), the rest for
        // sends and TUN writes in flight.
        let quarter = (g.buffers / 4).max(1);
        let recv = prev_power_of_two(quarter.min(256));
        let ring = RingConfig {
            recv_buffers: recv,
            max_in_flight: g.buffers.clamp(16, 4096),
            // The kernel thread sleeps after this long without submissions.
            sqpoll_idle_ms: g.sqpoll.then_some(SQPOLL_IDLE_MS),
            ..RingConfig::default()
        };
        UringWorkerConfig {
            pool,
            ring,
            tun_reads: quarter.min(64),
            poll: g.poll,
        }
    }
}

fn prev_power_of_two(n: u32) -> u16 {
    let n = n.clamp(1, 1 << 15);
    // n >= 1, so leading_zeros <= 31.
    (1u32 << (31 - n.leading_zeros())) as u16
}

/// Why the io_uring worker did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// io_uring is unusable on this system ([`uring::check`] has said why, once).
    Unavailable(UringError),
    Pool(PoolError),
    Uring(UringError),
    /// The shared socket set is empty.
    NoSocket,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(e) => e.fmt(f),
            Self::Pool(e) => e.fmt(f),
            Self::Uring(e) => e.fmt(f),
            Self::NoSocket => f.write_str("no UDP socket to serve"),
        }
    }
}

impl std::error::Error for SetupError {}

impl SetupError {
    /// Whether the reason was already logged (the process-wide probe); the caller then
    /// need not repeat it for every worker.
    pub fn already_logged(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// [`run`] could not start: the reason, and the TUN queue back for the portable worker.
#[derive(Debug)]
pub struct NotStarted {
    pub error: SetupError,
    pub tun: TunQueue,
}

fn socket_of(shared: &Shared, index: usize) -> Option<(u64, Arc<UdpSocket>)> {
    let (gen, socks) = shared.sockets.get();
    let s = socks.get(index % socks.len().max(1))?.clone();
    Some((gen, s))
}

/// The io_uring backend of the offload pipeline: batches are built in registered pool
/// buffers and handed to the kernel as SQEs (`SendMsg` with `UDP_SEGMENT`,
/// `WriteFixed`); nothing here makes a syscall (the loop submits once per round).
struct UringBackend<'r, 'p> {
    ring: &'r mut Ring<'p>,
    pool: &'p BufPool,
    sock: &'r UdpSocket,
    v6: bool,
    /// Packets dropped for lack of a buffer or a slot.
    dropped: u64,
}

impl UringBackend<'_, '_> {
    fn rejected(&mut self, r: Result<(), Rejected>) {
        if let Err(Rejected(buf, _)) = r {
            self.pool.free(buf);
            self.dropped += 1;
        }
    }
}

impl Backend for UringBackend<'_, '_> {
    type Buf = BufId;

    fn alloc(&mut self) -> Option<BufId> {
        let b = self.pool.alloc();
        if b.is_none() {
            self.dropped += 1;
        }
        b
    }

    fn bytes<'b>(&'b self, b: &'b mut BufId) -> &'b mut [u8] {
        self.pool.buf_mut(b)
    }

    fn release(&mut self, b: BufId) {
        self.pool.free(b);
    }

    fn max_segments(&self) -> usize {
        // One SendMsg per batch: without GSO a batch is one datagram (the ring still
        // submits many SendMsg per io_uring_enter).
        self.sock.max_gso_segments()
    }

    fn send(&mut self, b: BufId, len: usize, dst: SocketAddr, seg: usize) {
        let segment = (len > seg).then(|| u16::try_from(seg).unwrap_or(u16::MAX));
        let r = self
            .ring
            .send_udp(b, len, uring::to_socket_family(dst, self.v6), segment);
        self.rejected(r);
    }

    fn write_tun(&mut self, b: BufId, len: usize) {
        let r = self.ring.write_tun(b, len);
        self.rejected(r);
    }

    fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Run one worker on io_uring until `shared.stop` is set (`Ok`), or give the TUN queue
/// back when io_uring (or the pool) cannot be set up. `index` picks this worker's socket,
/// as in [`worker::run`].
pub fn run(
    index: usize,
    tun: TunQueue,
    offload: TunOffload,
    vnet_hdr: bool,
    shared: Arc<Shared>,
    cfg: &UringWorkerConfig,
    started: impl FnOnce(String),
) -> Result<(), NotStarted> {
    // Probe first (logged once per process), so an unusable io_uring costs no pool.
    if let Err(e) = uring::check() {
        return Err(NotStarted {
            error: SetupError::Unavailable(e),
            tun,
        });
    }
    let pool = match BufPool::new(&cfg.pool) {
        Ok(p) => p,
        Err(e) => {
            return Err(NotStarted {
                error: SetupError::Pool(e),
                tun,
            })
        }
    };
    // `_sock` is held for clarity only: the registered file table keeps its own reference.
    let Some((mut gen, mut _sock)) = socket_of(&shared, index) else {
        return Err(NotStarted {
            error: SetupError::NoSocket,
            tun,
        });
    };
    let mut ring = match Ring::new(&cfg.ring, &pool, _sock.as_raw_fd(), tun.as_raw_fd()) {
        Ok(r) => r,
        Err(e) => {
            return Err(NotStarted {
                error: SetupError::Uring(e),
                tun,
            })
        }
    };
    let (level, pool_line) = pool.summary();
    log::log!(level, "worker {index}: {pool_line}");
    started(format!(
        "io_uring ({} wait{}{}), {} TUN reads in flight, {pool_line}",
        cfg.poll.as_str(),
        if ring.sqpoll() { ", SQPOLL" } else { "" },
        if ring.defer_taskrun() {
            ", deferred task work"
        } else {
            ""
        },
        cfg.tun_reads
    ));

    let mut scratch = vec![0u8; SCRATCH_SIZE];
    // The TSO/USO splitter's output (one segment at a time, before encryption).
    let mut seg = vec![0u8; 65535];
    let mut tx: TxBatch<BufId> = TxBatch::new();
    let mut rx = TunBatch::new(
        CoalesceOptions {
            tcp: vnet_hdr && offload.tso(),
            udp: vnet_hdr && offload.uso(),
        },
        vnet_hdr,
    );
    let mut malformed_reads: u64 = 0;
    let mut tcp_queue = TcpQueue::default();
    let mut cache = shared.device.cache();
    let tcp = shared.tcp.clone();
    let mut v6 = _sock.local_addr().is_ipv6();
    let mut cqes: heapless::Vec<cqueue::Entry, REAP> = heapless::Vec::new();
    let mut reads: u32 = 0;
    let mut recv_errors: u32 = 0;
    let mut recv_paused_until: Option<Instant> = None;
    let mut dropped_total: u64 = 0;
    let mut hot_until = Instant::now();

    while !shared.stop.load(Ordering::Relaxed) {
        // Every round, idle ones too (one wait is at most WAIT).
        shared.heartbeats.beat(index);
        if shared.sockets.generation() != gen {
            if let Some((g, s)) = socket_of(&shared, index) {
                // In-flight sends keep the old socket alive in the kernel; the receive is
                // cancelled and re-armed on the new one when its last completion arrives.
                match ring.set_udp(s.as_raw_fd()) {
                    Ok(()) => {
                        let _ = ring.cancel_recv();
                        v6 = s.local_addr().is_ipv6();
                        (gen, _sock) = (g, s);
                    }
                    Err(e) => log::warn!("worker {index}: {e}"),
                }
            }
        }
        // Top up TUN reads (some may have been dropped when the ring was full).
        while reads < cfg.tun_reads {
            let Some(b) = pool.alloc() else { break };
            match ring.read_tun(b) {
                Ok(()) => reads += 1,
                Err(Rejected(b, _)) => {
                    pool.free(b);
                    break;
                }
            }
        }
        if !ring.recv_armed() && recv_paused_until.map_or(true, |t| Instant::now() >= t) {
            recv_paused_until = None;
            if let Err(e) = ring.arm_recv() {
                log::warn!("worker {index}: cannot arm UDP receive: {e}");
            }
        }
        // Adaptive wait: poll (a zero-timeout enter, which also runs deferred task work)
        // while traffic is recent or the core is dedicated; otherwise sleep.
        let wait = if spin_now(cfg.poll, hot_until) {
            Duration::ZERO
        } else {
            WAIT
        };
        if let Err(e) = ring.submit_and_wait(wait) {
            log::error!("worker {index}: {e}");
            std::thread::sleep(WAIT);
            continue;
        }

        let table = cache.get(&shared.device);
        let mut be = UringBackend {
            ring: &mut ring,
            pool: &pool,
            sock: &_sock,
            v6,
            dropped: 0,
        };
        let mut io = OffloadIo {
            be: &mut be,
            tcp: tcp.as_deref(),
            tcp_queue: &mut tcp_queue,
            tx: &mut tx,
            rx: &mut rx,
        };
        // A few rounds at most, so queued SQEs (re-armed reads) reach the kernel soon.
        let mut handled = 0usize;
        for _ in 0..4 {
            let n = io.be.ring.reap(&mut cqes);
            if n == 0 {
                break;
            }
            handled += n;
            for c in cqes.iter() {
                match io.be.ring.complete(c) {
                    Completion::Recv { res: Ok(tok), .. } => {
                        recv_errors = 0;
                        match tok.parse() {
                            Some(m) if !m.truncated => {
                                if let Some(from) = m.from {
                                    let from = PeerAddr::Udp(uring::canonical(from));
                                    // A GRO batch carries several datagrams of `seg`
                                    // bytes (the last may be shorter).
                                    let seg = uring::gro_segment_size(m.control)
                                        .unwrap_or(m.payload.len())
                                        .max(1);
                                    for d in m.payload.chunks(seg) {
                                        shared.device.handle_datagram(
                                            table,
                                            from,
                                            d,
                                            &mut scratch,
                                            &mut io,
                                        );
                                    }
                                }
                            }
                            _ => log::trace!(
                                "worker {index}: truncated or malformed datagram dropped"
                            ),
                        }
                        io.be.ring.recycle(tok);
                    }
                    Completion::Recv { res: Err(e), .. } => match e {
                        // Out of receive buffers, or cancelled for a socket change: re-armed above.
                        Errno::ENOBUFS | Errno::ECANCELED => {}
                        e => {
                            recv_errors += 1;
                            log::trace!("worker {index}: recv: {e}");
                            if recv_errors >= RECV_ERRORS_BEFORE_BACKOFF {
                                recv_paused_until = Some(Instant::now() + RECV_BACKOFF);
                                recv_errors = 0;
                            }
                        }
                    },
                    Completion::TunRead {
                        mut buf,
                        res: Ok(n),
                    } => {
                        let frame = pool.buf_mut(&mut buf);
                        let r = split_tun_read(frame, n, vnet_hdr, &mut seg, |p, len| {
                            shared
                                .device
                                .handle_tun_packet(table, p, len, &mut scratch, &mut io)
                        });
                        if let Err(e) = r {
                            malformed_reads += 1;
                            log::trace!("worker {index}: tun read: {e} ({malformed_reads} so far)");
                        }
                        if let Err(Rejected(b, _)) = io.be.ring.read_tun(buf) {
                            pool.free(b);
                            reads -= 1;
                        }
                    }
                    Completion::TunRead {
                        buf,
                        res: Err(Errno::EAGAIN),
                    } => {
                        // Kernels before 6.4 answer a non-blocking TUN read this way.
                        if let Err(Rejected(b, _)) = io.be.ring.read_tun_after_poll(buf) {
                            pool.free(b);
                            reads -= 1;
                        }
                    }
                    Completion::TunRead {
                        buf,
                        res: Err(Errno::ECANCELED | Errno::EINTR),
                    } => {
                        if let Err(Rejected(b, _)) = io.be.ring.read_tun(buf) {
                            pool.free(b);
                            reads -= 1;
                        }
                    }
                    Completion::TunRead { buf, res: Err(e) } => {
                        pool.free(buf);
                        // EBADFD/EIO: the interface was deleted under us (wg-quick down).
                        log::info!("worker {index}: TUN read failed ({e}); interface gone");
                        shared.tun_gone.store(true, Ordering::Relaxed);
                        return Ok(());
                    }
                    Completion::TunWrite { buf, res } => {
                        pool.free(buf);
                        if let Err(e) = res {
                            log::trace!("worker {index}: tun write: {e}");
                        }
                    }
                    Completion::UdpSend { buf, res } => {
                        pool.free(buf);
                        match res {
                            // No checksum offload on the route: this socket sends one
                            // datagram per SendMsg from now on (the batch is lost).
                            Err(Errno::EIO | Errno::EINVAL) if _sock.gso_enabled() => {
                                _sock.disable_gso();
                            }
                            // ICMP errors (ECONNREFUSED) and the like: not fatal.
                            Err(e) => log::trace!("worker {index}: send: {e}"),
                            Ok(_) => {}
                        }
                    }
                    Completion::Internal => {}
                }
            }
        }
        // The round's batches become SQEs; the next submit_and_wait hands them over.
        io.flush();
        if handled > 0 {
            hot_until = Instant::now() + ADAPTIVE_SPIN;
        }
        let dropped = be.dropped();
        if dropped > 0 {
            dropped_total += dropped;
            log::debug!("worker {index}: {dropped} packets dropped (no free buffer or ring slot; {dropped_total} total)");
        }
    }
    // `ring` drops first (cancels and reaps everything in flight), then `pool`.
    drop(ring);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::device::Device;
    use crate::core::key::Key;
    use crate::driver::worker::{Heartbeats, SocketSet};
    use crate::sys::tun::tests::{can_net_admin, in_new_netns, ip};
    use crate::sys::tun::Tun;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn config_from_gateway() {
        let mut g = GatewayConfig::default();
        let c = UringWorkerConfig::from_gateway(&g);
        assert_eq!(c.pool.count, g.buffers);
        assert!(c.pool.hugepages);
        assert_eq!(c.ring.recv_buffers, 256);
        assert_eq!(c.tun_reads, 64);
        assert_eq!(c.ring.sqpoll_idle_ms, None, "SQPOLL only when asked for");
        g.sqpoll = true;
        assert_eq!(
            UringWorkerConfig::from_gateway(&g).ring.sqpoll_idle_ms,
            Some(SQPOLL_IDLE_MS)
        );
        g.buffers = 20;
        g.hugepages = false;
        let c = UringWorkerConfig::from_gateway(&g);
        assert_eq!(
            (c.ring.recv_buffers, c.tun_reads, c.pool.hugepages),
            (4, 5, false)
        );
        assert_eq!(prev_power_of_two(1), 1);
        assert_eq!(prev_power_of_two(300), 256);
    }

    fn ipv4_udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        let mut sum: u32 = p[..20]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        p
    }

    use crate::testutil::Wire;

    fn device(own: Key, peer: Key, allowed: &str, ep: SocketAddr) -> Device {
        crate::testutil::one_peer_device(own, peer, allowed, ep, None)
    }

    /// Let peer B (driven by hand over a plain socket) answer everything that arrives
    /// until `done(wire)` holds.
    fn pump_b(
        b: &Device,
        sock: &std::net::UdpSocket,
        wire: &mut Wire,
        done: impl Fn(&Wire) -> bool,
    ) {
        let mut scratch = vec![0u8; SCRATCH_SIZE];
        let mut buf = vec![0u8; 65536];
        for _ in 0..200 {
            if done(wire) {
                return;
            }
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let mut cache = b.cache();
            b.handle_datagram(
                cache.get(b),
                PeerAddr::Udp(from),
                &buf[..n],
                &mut scratch,
                wire,
            );
            for (to, d) in wire.sent.drain(..) {
                sock.send_to(&d, to.socket_addr()).expect("b send");
            }
        }
        panic!("peer B never got what it waited for");
    }

    /// A WireGuard tunnel end to end through the io_uring worker: an app in the
    /// namespace sends through the TUN, the worker encrypts to peer B over loopback
    /// (handshake first), B answers, the worker decrypts and writes to the TUN.
    #[test]
    fn tunnel_through_the_uring_worker() {
        tunnel_through_uring(false);
    }

    /// The same with `IFF_VNET_HDR` (the default): reads are split, writes coalesced.
    #[test]
    fn tunnel_through_the_uring_worker_with_tun_offload() {
        tunnel_through_uring(true);
    }

    fn tunnel_through_uring(vnet_hdr: bool) {
        if uring::probe().is_err() || !can_net_admin() {
            eprintln!("skipped: needs io_uring with multishot recvmsg, root and /dev/net/tun");
            return;
        }
        in_new_netns(move || {
            ip(&["link", "set", "lo", "up"]);
            let tun = Tun::create("rguw0", 1, vnet_hdr).expect("tun");
            assert_eq!(tun.vnet_hdr(), vnet_hdr);
            ip(&["addr", "add", "10.79.0.1/24", "dev", "rguw0"]);
            ip(&["link", "set", "rguw0", "up"]);
            let (ka, kb) = (Key::generate_private(), Key::generate_private());
            let sock_a = UdpSocket::bind(
                "127.0.0.1:0".parse().expect("literal"),
                &crate::sys::udp::UdpOptions {
                    reuse_port: false, // no port shared with another test
                    ..crate::sys::udp::UdpOptions::default()
                },
            )
            .expect("bind a");
            let sock_b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind b");
            sock_b
                .set_read_timeout(Some(Duration::from_millis(50)))
                .expect("timeout");
            let (addr_a, addr_b) = (sock_a.local_addr(), sock_b.local_addr().expect("b"));
            let dev_a = Arc::new(device(ka, kb, "10.79.0.2/32", addr_b));
            let dev_b = device(kb, ka, "10.79.0.1/32", addr_a);
            let shared = Arc::new(Shared {
                device: dev_a,
                sockets: Arc::new(SocketSet::new(vec![Arc::new(sock_a)], addr_a.port())),
                stop: Arc::new(AtomicBool::new(false)),
                tcp: None,
                tun_gone: Arc::new(AtomicBool::new(false)),
                heartbeats: Arc::new(Heartbeats::new(1)),
            });
            let g = GatewayConfig {
                buffers: 64,
                hugepages: false,
                ..GatewayConfig::default()
            };
            let cfg = UringWorkerConfig::from_gateway(&g);
            let (off, vnet) = (tun.offload(), tun.vnet_hdr());
            let q = tun.into_queues().into_iter().next().expect("queue");
            let sh = shared.clone();
            let worker = std::thread::spawn(move || {
                run(0, q, off, vnet, sh, &cfg, |_| {}).map_err(|n| n.error.to_string())
            });

            // App -> TUN -> worker -> (handshake) -> B.
            let app = std::net::UdpSocket::bind("10.79.0.1:0").expect("app");
            app.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            app.send_to(b"hello-b", "10.79.0.2:5555").expect("app send");
            let mut wire = Wire::default();
            pump_b(&dev_b, &sock_b, &mut wire, |w| {
                w.tun.iter().any(|p| p.ends_with(b"hello-b"))
            });

            // B -> worker -> TUN -> app.
            let app_port = app.local_addr().expect("app addr").port();
            let reply = ipv4_udp([10, 79, 0, 2], 5555, [10, 79, 0, 1], app_port, b"hello-a");
            let mut scratch = vec![0u8; SCRATCH_SIZE];
            let mut cache = dev_b.cache();
            let mut reply_buf = reply.clone();
            dev_b.handle_tun_packet(
                cache.get(&dev_b),
                &mut reply_buf,
                reply.len(),
                &mut scratch,
                &mut wire,
            );
            assert!(!wire.sent.is_empty(), "B encrypted the reply");
            for (to, d) in wire.sent.drain(..) {
                sock_b.send_to(&d, to.socket_addr()).expect("b send");
            }
            let mut rb = [0u8; 64];
            let (n, from) = app.recv_from(&mut rb).expect("reply through the tunnel");
            assert_eq!(&rb[..n], b"hello-a");
            assert_eq!(from.to_string(), "10.79.0.2:5555");

            shared.stop.store(true, Ordering::Relaxed);
            assert_eq!(worker.join().expect("worker thread"), Ok(()));
            assert!(!shared.tun_gone.load(Ordering::Relaxed));
        });
    }

    #[test]
    fn setup_failure_gives_the_queue_back() {
        if !can_net_admin() {
            eprintln!("skipped: needs root and /dev/net/tun");
            return;
        }
        in_new_netns(|| {
            let tun = Tun::create("rguw1", 1, false).expect("tun");
            let shared = Arc::new(Shared {
                device: Arc::new(Device::new()),
                sockets: Arc::new(SocketSet::new(Vec::new(), 0)),
                stop: Arc::new(AtomicBool::new(false)),
                tcp: None,
                tun_gone: Arc::new(AtomicBool::new(false)),
                heartbeats: Arc::new(Heartbeats::new(1)),
            });
            let mut cfg = UringWorkerConfig::from_gateway(&GatewayConfig::default());
            cfg.pool.count = 8;
            cfg.pool.hugepages = false;
            let (off, vnet) = (tun.offload(), tun.vnet_hdr());
            let q = tun.into_queues().into_iter().next().expect("queue");
            let fd = q.as_raw_fd();
            let e = run(0, q, off, vnet, shared, &cfg, |_| {}).expect_err("no socket");
            assert!(matches!(
                e.error,
                SetupError::NoSocket | SetupError::Unavailable(_)
            ));
            assert_eq!(e.tun.as_raw_fd(), fd, "the same queue comes back");
        });
    }
}
