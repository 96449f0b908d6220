//! [`PollEngine`], the portable engine of the worker loop: `poll(2)` for readiness,
//! `recvmmsg` (GRO trains) and TUN `read`s drained in bounded batches, sends through
//! [`SyscallBackend`]; and [`run`], a worker on it.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::core::config::PollMode;
use crate::driver::dataplane::backend::GSO_BUF;
use crate::driver::dataplane::pipeline::{Cx, Pipeline};
use crate::driver::dataplane::poll::syscall_backend::{
    Pending, SendStats, SyscallBackend, MAX_PENDING,
};
use crate::driver::dataplane::shared::{socket_of, Shared};
use crate::driver::dataplane::spread::Spread;
use crate::driver::dataplane::worker::{run_loop, spread_into, Drained, Engine, Waited};
use crate::sys::cmsg::RecvMeta;
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::UdpSocket;

/// Datagram buffers per receive batch (64 KiB each: a GRO train can be that long).
pub const RECV_BATCH: usize = 16;
/// TUN reads one poll round may make before the loop looks at the socket again.
const TUN_READS: usize = 64;
/// `recvmmsg` batches one poll round may receive.
const RECV_BATCHES: usize = 4;

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
    /// Spreading: the pool whose wake-up file for this worker the wait watches too.
    wake: Option<(Arc<Spread>, usize)>,
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
            wake: None,
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
        let wake = self.wake.as_ref().and_then(|(sp, me)| sp.wake_fd(*me));
        let mut fds: heapless::Vec<PollFd<'_>, 3> = heapless::Vec::new();
        let _ = fds.push(PollFd::new(self.sock.as_fd(), PollFlags::POLLIN));
        let _ = fds.push(PollFd::new(self.tun.as_fd(), PollFlags::POLLIN));
        if let Some(w) = wake {
            // Readable when another worker handed this one a lane role: the round serves it.
            let _ = fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
        }
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
    let mut p = Pipeline::new(offload, vnet_hdr, shared.sockets.sticky.clone());
    let spread = spread_into(&mut p, index, &tun, &shared);
    let mut e = PollEngine::new(tun, sock);
    e.wake = spread.map(|sp| (sp, index));
    run_loop(index, &mut e, &mut p, poll_mode, &shared, gen);
}
