//! The per-core worker: ONE loop ([`run_loop`]) over a backend ([`Engine`]), and the
//! portable backend ([`PollEngine`]).
//!
//! A round of the loop: heartbeat, pick up a replaced socket, let the backend re-arm,
//! wait as `Poll =` says, then drain — the backend hands every received buffer and
//! every TUN read to the shared [`Pipeline`] (device, TSO split, GSO batches, GRO
//! coalescing) — and flush the round's batches to the kernel, outside any peer lock.
//! What differs between backends is only how they receive, submit and wait:
//! [`PollEngine`] (`poll(2)`, `recvmmsg`, `read`, `sendmsg`/`sendmmsg` and `write` made
//! when the round ends, waiting for room when the socket is full) and the io_uring
//! engine in `uring_worker` (completions in, SQEs out, one `io_uring_enter` per round).
//!
//! Sockets can be replaced at run time (a UAPI `listen_port` change): the shared
//! [`SocketSet`] carries a generation and workers pick up new sockets at their next wake.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::core::config::PollMode;
use crate::core::device::Device;
use crate::driver::offload_io::{
    Backend, Cx, Pending, Pipeline, SendStats, StickyTable, SyscallBackend, GSO_BUF, MAX_PENDING,
    RECV_BATCH,
};
use crate::sys::cmsg::RecvMeta;
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::UdpSocket;

pub use crate::sys::cmsg::canonical;

/// TUN reads one poll round may make before the loop looks at the socket again.
const TUN_READS: usize = 64;
/// `recvmmsg` batches one poll round may receive.
const RECV_BATCHES: usize = 4;
/// How long one wait may block, so `stop` and socket changes are noticed (and the
/// heartbeat moves while idle).
pub const WAIT: Duration = Duration::from_millis(100);
/// `Poll = adaptive`: after a round with traffic, keep polling without sleeping this
/// long: an answer (a ping reply from the stack, the next packet of a burst) usually
/// comes within it, and a sleeping worker costs a wake-up per packet. Bounded, so an idle
/// worker sleeps. Not the default: on cores shared with other work (our 2-core bench,
/// where both tunnel ends and iperf3 run) the spinning took the time the other side
/// needed — single-stream TCP fell from ~4000 to ~2500 Mbit/s and idle RTT rose from
/// 0.37 to 0.82 ms.
pub const ADAPTIVE_SPIN: Duration = Duration::from_micros(200);

/// Whether a worker polls without sleeping now.
pub fn spin_now(mode: PollMode, hot_until: Instant) -> bool {
    match mode {
        PollMode::Busy => true,
        PollMode::Adaptive => Instant::now() < hot_until,
        PollMode::Sleep => false,
    }
}

/// The UDP sockets of all workers, all bound to the listen port (`SO_REUSEPORT`), and
/// the local address each peer reaches them at ([`StickyTable`]).
pub struct SocketSet {
    inner: RwLock<Arc<Vec<Arc<UdpSocket>>>>,
    generation: AtomicU64,
    pub port: std::sync::atomic::AtomicU16,
    pub sticky: Arc<StickyTable>,
}

impl SocketSet {
    pub fn new(socks: Vec<Arc<UdpSocket>>, port: u16) -> SocketSet {
        SocketSet {
            inner: RwLock::new(Arc::new(socks)),
            generation: AtomicU64::new(1),
            port: std::sync::atomic::AtomicU16::new(port),
            sticky: Arc::default(),
        }
    }

    pub fn get(&self) -> (u64, Arc<Vec<Arc<UdpSocket>>>) {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (self.generation.load(Ordering::Acquire), g.clone())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn replace(&self, socks: Vec<Arc<UdpSocket>>, port: u16) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(socks);
        self.port.store(port, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Any socket, for sends from outside the workers (timers).
    pub fn any(&self) -> Option<Arc<UdpSocket>> {
        self.get().1.first().cloned()
    }

    /// One datagram to `to` from outside the workers (timer-made handshakes and
    /// keepalives, the TCP thread's fallback probes), from the local address `to` last
    /// reached us at, as the workers answer it: on a multi-homed uplink a keepalive from
    /// another address would reach a peer that does not know it (wireguard-go keeps the
    /// source on the endpoint). A source that is gone is forgotten and routing picks.
    pub fn send_sticky(&self, d: &[u8], to: std::net::SocketAddr) {
        let Some(s) = self.any() else { return };
        let src = self.sticky.source_for(to);
        if let Err(e) = s.send_from(src, d, to) {
            if src.is_some()
                && e.raw_os_error()
                    .is_some_and(crate::sys::udp::stale_source_errno)
            {
                self.sticky.clear();
                let _ = s.send_to(d, to);
            }
        }
    }
}

/// Where outgoing TCP-fallback messages go; implemented by the TCP transport.
pub trait TcpOut: Send + Sync {
    fn send(&self, conn: u64, msg: &[u8]);
}

/// Write one plain IP packet to a TUN queue, prefixing an all-zero virtio_net_hdr
/// (no offload, checksum complete) when the device was opened with `IFF_VNET_HDR`.
pub fn write_plain(q: &TunQueue, vnet_hdr: bool, p: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    if !vnet_hdr {
        return q.write(p);
    }
    let h = crate::core::gso::VIRTIO_NET_HDR_LEN;
    let Some(dst) = buf.get_mut(..h + p.len()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "packet larger than the TUN buffer",
        ));
    };
    dst[..h].fill(0);
    dst[h..].copy_from_slice(p);
    q.write(dst)
}

/// Shared state the workers watch.
pub struct Shared {
    pub device: Arc<Device>,
    pub sockets: Arc<SocketSet>,
    pub stop: Arc<AtomicBool>,
    pub tcp: Option<Arc<dyn TcpOut>>,
    /// Set when the TUN went away (interface deleted): the process should exit.
    pub tun_gone: Arc<AtomicBool>,
    /// One heartbeat per worker, bumped every round (idle rounds too).
    pub heartbeats: Arc<Heartbeats>,
}

/// The workers' heartbeats: each worker loop bumps its counter every round, and a round
/// ends at least every 100 ms even when idle, so a counter that stops moving for seconds
/// means a stuck worker. Written into the status file, where init watches them.
#[derive(Debug, Default)]
pub struct Heartbeats {
    beats: Vec<AtomicU64>,
    /// Test images only (`--selftest-hang`, then SIGUSR2): the workers stop bumping,
    /// as a deadlocked worker would, so the image test sees init restart the gateway.
    frozen: AtomicBool,
}

impl Heartbeats {
    pub fn new(workers: usize) -> Heartbeats {
        Heartbeats {
            beats: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            frozen: AtomicBool::new(false),
        }
    }

    /// Worker `i` finished a round.
    pub fn beat(&self, i: usize) {
        if self.frozen.load(Ordering::Relaxed) {
            return;
        }
        if let Some(b) = self.beats.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> Vec<u64> {
        self.beats
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// Selftest: stop every heartbeat from now on.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }
}

/// This worker's socket in the shared set, with the set's generation.
pub fn socket_of(shared: &Shared, index: usize) -> Option<(u64, Arc<UdpSocket>)> {
    let (gen, socks) = shared.sockets.get();
    let s = socks.get(index % socks.len().max(1))?.clone();
    Some((gen, s))
}

/// What a wait ended with.
#[derive(Debug)]
pub enum Waited {
    /// Something may be ready: drain.
    Ready,
    /// The timeout passed with nothing to do.
    Idle,
    /// The wait itself failed (logged; the loop pauses [`WAIT`] and goes on).
    Failed(String),
    /// The TUN was closed or deleted: the worker ends.
    TunGone(String),
}

/// What a drain did.
#[derive(Debug, Default)]
pub struct Drained {
    /// Events handled (datagram buffers, TUN reads, completions): traffic, for the
    /// adaptive wait.
    pub handled: usize,
    /// The TUN failed as a deleted interface does: the worker ends after this round.
    pub tun_gone: Option<String>,
}

/// A worker backend: only what differs between io_uring and the portable path — how
/// it waits, receives and submits. Everything else is [`run_loop`]'s and [`Pipeline`]'s.
pub trait Engine {
    /// The buffers its executor lends the batches.
    type Buf;
    /// The executor of one round's batches ([`Backend`]): queues sends and TUN writes,
    /// hands them to the kernel in `submit`.
    type Exec<'e>: Backend<Buf = Self::Buf>
    where
        Self: 'e;
    /// Serve this socket from now on (a listen-port change).
    fn set_socket(&mut self, sock: &Arc<UdpSocket>) -> Result<(), String>;
    /// Before the wait: keep what the backend has in flight armed (reads, receives).
    fn arm(&mut self) {}
    /// Wait for work, at most `timeout` (zero: only look).
    fn wait(&mut self, timeout: Duration) -> Waited;
    /// Hand everything ready to `p` (with [`Self::exec`]'s executor).
    fn drain(&mut self, p: &mut Pipeline<Self::Buf>, cx: &Cx<'_>) -> Drained;
    /// The executor, for the end-of-round flush.
    fn exec(&mut self) -> Self::Exec<'_>;
    /// Packets dropped (no buffer, ring slot or room in the socket) since the last call.
    fn take_dropped(&mut self) -> u64;
}

/// One round after the wait: drain into the pipeline, then flush it (the batches go
/// to the kernel here, outside any peer lock).
pub fn round<E: Engine>(e: &mut E, p: &mut Pipeline<E::Buf>, cx: &Cx<'_>) -> Drained {
    p.begin_round();
    let d = e.drain(p, cx);
    p.flush(&mut e.exec(), cx);
    d
}

/// THE worker loop, for every backend: until `shared.stop` is set, or the TUN goes
/// away (then `shared.tun_gone` is set). Every round, idle ones too, bumps this
/// worker's heartbeat (one wait is at most [`WAIT`]).
pub fn run_loop<E: Engine>(
    index: usize,
    e: &mut E,
    p: &mut Pipeline<E::Buf>,
    poll_mode: PollMode,
    shared: &Shared,
    mut gen: u64,
) {
    let mut cache = shared.device.cache();
    let tcp = shared.tcp.clone();
    let mut hot_until = Instant::now();
    let mut dropped_total: u64 = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        shared.heartbeats.beat(index);
        if shared.sockets.generation() != gen {
            if let Some((g, s)) = socket_of(shared, index) {
                // On failure the old socket goes on serving (said once, not every round).
                if let Err(err) = e.set_socket(&s) {
                    log::warn!("worker {index}: keeping the old UDP socket: {err}");
                }
                gen = g;
            }
        }
        e.arm();
        // `Poll = adaptive` polls without sleeping for a moment after traffic, `busy`
        // always, `sleep` (the default) never.
        let timeout = if spin_now(poll_mode, hot_until) {
            Duration::ZERO
        } else {
            WAIT
        };
        match e.wait(timeout) {
            Waited::Ready => {}
            Waited::Idle => continue,
            Waited::Failed(err) => {
                log::error!("worker {index}: {err}");
                std::thread::sleep(WAIT);
                continue;
            }
            Waited::TunGone(why) => {
                log::info!("worker {index}: {why}; interface gone");
                shared.tun_gone.store(true, Ordering::Relaxed);
                return;
            }
        }
        // After the wait, not before it: a listen-port change while we slept must not
        // send this round's answers from the old socket (the peer would roam to a port
        // that is about to close). The top of the loop picks up the new socket.
        if shared.sockets.generation() != gen {
            continue;
        }
        let cx = Cx {
            dev: &shared.device,
            table: cache.get(&shared.device),
            tcp: tcp.as_deref(),
        };
        let d = round(e, p, &cx);
        if d.handled > 0 {
            hot_until = Instant::now() + ADAPTIVE_SPIN;
        }
        let dropped = e.take_dropped();
        if dropped > 0 {
            dropped_total += dropped;
            log::debug!("worker {index}: {dropped} packets dropped (no free buffer, ring slot or socket room; {dropped_total} total)");
        }
        if let Some(why) = d.tun_gone {
            // EBADFD/EIO: the interface was deleted under us (wg-quick down).
            log::info!("worker {index}: {why}; interface gone");
            shared.tun_gone.store(true, Ordering::Relaxed);
            return;
        }
    }
}

/// The portable backend: `poll(2)` for readiness, `recvmmsg` (GRO trains) and TUN
/// `read`s drained in bounded batches, and [`SyscallBackend`] for the round's sends
/// (`sendmsg` with `UDP_SEGMENT`, or `sendmmsg`; waiting for room when the socket is
/// full) and TUN writes. Every buffer is allocated once.
pub struct PollEngine {
    tun: TunQueue,
    sock: Arc<UdpSocket>,
    spare: Vec<Vec<u8>>,
    pending: Vec<Pending>,
    pub stats: SendStats,
    reported_drops: u64,
    rbuf: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    udp_ready: bool,
    tun_ready: bool,
}

impl PollEngine {
    pub fn new(tun: TunQueue, sock: Arc<UdpSocket>) -> PollEngine {
        PollEngine {
            tun,
            sock,
            spare: vec![vec![0; GSO_BUF], vec![0; GSO_BUF]],
            pending: Vec::with_capacity(MAX_PENDING * 2),
            stats: SendStats::default(),
            reported_drops: 0,
            rbuf: vec![0; crate::core::gso::VIRTIO_NET_HDR_LEN + 65535],
            bufs: vec![vec![0; 65536]; RECV_BATCH],
            metas: vec![RecvMeta::default(); RECV_BATCH],
            udp_ready: false,
            tun_ready: false,
        }
    }

    /// Both sides ready, as if a wait said so (tests that drive several engines from
    /// one poll).
    #[cfg(test)]
    pub fn assume_ready(&mut self) {
        self.udp_ready = true;
        self.tun_ready = true;
    }
}

impl Engine for PollEngine {
    type Buf = Vec<u8>;
    type Exec<'e> = SyscallBackend<'e>;

    fn set_socket(&mut self, sock: &Arc<UdpSocket>) -> Result<(), String> {
        self.sock = sock.clone();
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Waited {
        let mut fds = [
            PollFd::new(self.sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.tun.as_fd(), PollFlags::POLLIN),
        ];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return Waited::Idle,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Waited::Idle,
            Err(e) => return Waited::Failed(format!("poll: {e}")),
        }
        let r = |f: &PollFd| f.revents().unwrap_or(PollFlags::empty());
        let tr = r(&fds[1]);
        if tr.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) {
            return Waited::TunGone("TUN closed".into());
        }
        self.udp_ready = r(&fds[0]).contains(PollFlags::POLLIN);
        self.tun_ready = tr.contains(PollFlags::POLLIN);
        Waited::Ready
    }

    fn drain(&mut self, p: &mut Pipeline<Vec<u8>>, cx: &Cx<'_>) -> Drained {
        let PollEngine {
            tun,
            sock,
            spare,
            pending,
            stats,
            rbuf,
            bufs,
            metas,
            udp_ready,
            tun_ready,
            ..
        } = self;
        let mut be = SyscallBackend {
            sock,
            tun: Some(tun),
            spare,
            pending,
            stats,
        };
        let mut d = Drained::default();
        if std::mem::take(udp_ready) {
            for _ in 0..RECV_BATCHES {
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
                        // ICMP errors (ECONNREFUSED, ...) surface on UDP sockets; not fatal.
                        log::trace!("recv: {e}");
                        break;
                    }
                };
                for (m, b) in metas[..k].iter().zip(bufs.iter()) {
                    p.datagrams(&mut be, cx, b, m);
                }
                d.handled += k;
                if k < RECV_BATCH {
                    break;
                }
            }
        }
        if std::mem::take(tun_ready) {
            let mut reads = 0;
            while reads < TUN_READS {
                let n = match tun.read(rbuf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        d.tun_gone = Some(format!("TUN read failed ({e})"));
                        break;
                    }
                };
                reads += 1;
                p.tun_read(&mut be, cx, rbuf, n);
            }
            d.handled += reads;
        }
        d
    }

    fn exec(&mut self) -> SyscallBackend<'_> {
        SyscallBackend {
            sock: &self.sock,
            tun: Some(&self.tun),
            spare: &mut self.spare,
            pending: &mut self.pending,
            stats: &mut self.stats,
        }
    }

    fn take_dropped(&mut self) -> u64 {
        let d = self.stats.dropped - self.reported_drops;
        self.reported_drops = self.stats.dropped;
        d
    }
}

/// Run one worker on the portable backend until `stop` is set. `index` picks this
/// worker's socket.
pub fn run(
    index: usize,
    tun: TunQueue,
    offload: TunOffload,
    vnet_hdr: bool,
    poll_mode: PollMode,
    shared: Arc<Shared>,
) {
    let Some((gen, sock)) = socket_of(&shared, index) else {
        log::error!("worker {index}: no UDP socket to serve");
        return;
    };
    let mut e = PollEngine::new(tun, sock);
    let mut p = Pipeline::new(offload, vnet_hdr, shared.sockets.sticky.clone());
    run_loop(index, &mut e, &mut p, poll_mode, &shared, gen);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::offload_io::Dst;
    use std::collections::VecDeque;

    /// A backend that lends vectors and records what it was asked to do.
    #[derive(Default)]
    struct FakeExec {
        sent: usize,
        submits: usize,
    }

    impl Backend for &mut FakeExec {
        type Buf = Vec<u8>;
        fn alloc(&mut self) -> Option<Vec<u8>> {
            Some(vec![0; GSO_BUF])
        }
        fn bytes<'b>(&'b self, b: &'b mut Vec<u8>) -> &'b mut [u8] {
            b
        }
        fn release(&mut self, _: Vec<u8>) {}
        fn max_segments(&self) -> usize {
            64
        }
        fn send(&mut self, _: Vec<u8>, _: usize, _: Dst, _: usize) {
            self.sent += 1;
        }
        fn write_tun(&mut self, _: Vec<u8>, _: usize) {}
        fn dropped(&self) -> u64 {
            0
        }
        fn submit(&mut self) {
            self.submits += 1;
        }
    }

    /// What the loop sees each round, in order.
    enum Step {
        /// The wait says ready; the drain reports `handled` events and `dropped` drops.
        Ready {
            handled: usize,
            dropped: u64,
        },
        Idle,
        Failed,
        /// The listen port changes while the engine waits.
        SocketChangesDuringWait,
        /// The drain finds the TUN gone.
        GoneInDrain,
    }

    struct FakeEngine<'s> {
        shared: &'s Shared,
        script: VecDeque<Step>,
        current: Option<Step>,
        exec: FakeExec,
        arms: usize,
        waits: Vec<Duration>,
        drains: usize,
        sockets_set: usize,
        dropped: u64,
    }

    impl Engine for FakeEngine<'_> {
        type Buf = Vec<u8>;
        type Exec<'e>
            = &'e mut FakeExec
        where
            Self: 'e;

        fn set_socket(&mut self, _: &Arc<UdpSocket>) -> Result<(), String> {
            self.sockets_set += 1;
            Ok(())
        }
        fn arm(&mut self) {
            self.arms += 1;
        }
        fn wait(&mut self, timeout: Duration) -> Waited {
            self.waits.push(timeout);
            let Some(step) = self.script.pop_front() else {
                self.shared.stop.store(true, Ordering::Relaxed);
                return Waited::Idle;
            };
            let w = match &step {
                Step::Idle => Waited::Idle,
                Step::Failed => Waited::Failed("test failure".into()),
                Step::SocketChangesDuringWait => {
                    let (_, socks) = self.shared.sockets.get();
                    self.shared.sockets.replace(socks.to_vec(), 0);
                    Waited::Ready
                }
                _ => Waited::Ready,
            };
            self.current = Some(step);
            w
        }
        fn drain(&mut self, _: &mut Pipeline<Vec<u8>>, _: &Cx<'_>) -> Drained {
            self.drains += 1;
            match self.current.take() {
                Some(Step::Ready { handled, dropped }) => {
                    self.dropped += dropped;
                    Drained {
                        handled,
                        tun_gone: None,
                    }
                }
                Some(Step::GoneInDrain) => Drained {
                    handled: 0,
                    tun_gone: Some("TUN read failed (test)".into()),
                },
                _ => Drained::default(),
            }
        }
        fn exec(&mut self) -> &mut FakeExec {
            &mut self.exec
        }
        fn take_dropped(&mut self) -> u64 {
            std::mem::take(&mut self.dropped)
        }
    }

    fn shared() -> Shared {
        let opts = crate::sys::udp::UdpOptions {
            reuse_port: false,
            gro: false,
            ..crate::sys::udp::UdpOptions::default()
        };
        let s = UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind");
        Shared {
            device: Arc::new(Device::new(Box::new(rand_core::OsRng))),
            sockets: Arc::new(SocketSet::new(vec![Arc::new(s)], 0)),
            stop: Arc::new(AtomicBool::new(false)),
            tcp: None,
            tun_gone: Arc::new(AtomicBool::new(false)),
            heartbeats: Arc::new(Heartbeats::new(1)),
        }
    }

    fn run_script(shared: &Shared, mode: PollMode, script: Vec<Step>) -> FakeEngine<'_> {
        let mut e = FakeEngine {
            shared,
            script: script.into(),
            current: None,
            exec: FakeExec::default(),
            arms: 0,
            waits: Vec::new(),
            drains: 0,
            sockets_set: 0,
            dropped: 0,
        };
        let mut p = Pipeline::new(TunOffload::default(), false, Arc::default());
        let gen = shared.sockets.generation();
        run_loop(0, &mut e, &mut p, mode, shared, gen);
        e
    }

    /// The one loop: every round beats and re-arms; an idle wait or a failed one drains
    /// nothing; a listen-port change during the wait skips that round's drain and the
    /// next round serves the new socket; every drained round is flushed (submitted);
    /// a gone TUN ends the loop and says so.
    #[test]
    fn the_loop_drives_any_engine() {
        let sh = shared();
        let e = run_script(
            &sh,
            PollMode::Sleep,
            vec![
                Step::Ready {
                    handled: 3,
                    dropped: 2,
                },
                Step::Idle,
                Step::SocketChangesDuringWait,
                Step::Ready {
                    handled: 0,
                    dropped: 0,
                },
                Step::Failed,
                Step::GoneInDrain,
            ],
        );
        assert_eq!(e.waits.len(), 6);
        assert_eq!(e.arms, 6, "armed before every wait");
        assert_eq!(e.drains, 3, "not after idle, failed or a socket change");
        assert_eq!(e.exec.submits, 3, "each drained round flushed once");
        assert_eq!(e.sockets_set, 1, "the new socket taken up once");
        assert_eq!(sh.heartbeats.snapshot(), [6], "a beat per round");
        assert!(sh.tun_gone.load(Ordering::Relaxed));
        assert!(
            e.waits.iter().all(|w| *w == WAIT),
            "Poll = sleep never spins"
        );
    }

    #[test]
    fn busy_never_sleeps_adaptive_sleeps_when_idle() {
        let sh = shared();
        let e = run_script(&sh, PollMode::Busy, vec![Step::Idle, Step::Idle]);
        assert!(e.waits.iter().all(|w| w.is_zero()), "{:?}", e.waits);
        assert!(!sh.tun_gone.load(Ordering::Relaxed));

        // Adaptive: asleep before any traffic (spinning after it is a matter of time,
        // which a test does not assert; `spin_now` is checked with times far apart).
        let sh = shared();
        let e = run_script(
            &sh,
            PollMode::Adaptive,
            vec![
                Step::Idle,
                Step::Ready {
                    handled: 1,
                    dropped: 0,
                },
            ],
        );
        assert_eq!(e.waits[0], WAIT, "idle: sleeps");
        assert!(!spin_now(PollMode::Adaptive, Instant::now()));
        assert!(spin_now(
            PollMode::Adaptive,
            Instant::now() + Duration::from_secs(60)
        ));
        assert!(spin_now(PollMode::Busy, Instant::now()));
        assert!(!spin_now(PollMode::Sleep, Instant::now() + WAIT));
    }
}
