//! The per-core worker loop (portable path): one UDP socket and one TUN queue per
//! worker, `poll(2)` for readiness, drain each side in bounded batches into the device.
//!
//! Sockets can be replaced at run time (a UAPI `listen_port` change): the shared
//! [`SocketSet`] carries a generation and workers pick up new sockets at their next wake.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::core::config::PollMode;
use crate::core::device::Device;
use crate::driver::offload_io::OffloadWorker;
use crate::driver::uring_worker::{spin_now, ADAPTIVE_SPIN};
use crate::sys::tun::{TunOffload, TunQueue};
use crate::sys::udp::UdpSocket;

/// How many packets one side may process before the loop looks at the other side.
const BATCH: usize = 64;

/// The UDP sockets of all workers, all bound to the listen port (`SO_REUSEPORT`).
pub struct SocketSet {
    inner: RwLock<Arc<Vec<Arc<UdpSocket>>>>,
    generation: AtomicU64,
    pub port: std::sync::atomic::AtomicU16,
}

impl SocketSet {
    pub fn new(socks: Vec<Arc<UdpSocket>>, port: u16) -> SocketSet {
        SocketSet {
            inner: RwLock::new(Arc::new(socks)),
            generation: AtomicU64::new(1),
            port: std::sync::atomic::AtomicU16::new(port),
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
}

/// Where outgoing TCP-fallback messages go; implemented by the TCP transport.
pub trait TcpOut: Send + Sync {
    fn send(&self, conn: u64, msg: &[u8]);
}

/// The canonical form of a received address (v4-mapped v6 back to v4), so the same peer
/// always has the same endpoint whatever socket family carried it.
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
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

/// Run one worker until `stop` is set. `index` picks this worker's socket. The TUN side
/// reads (and, with `vnet_hdr`, splits) super-packets and sends the ciphertexts as GSO
/// batches; the UDP side receives in batches (GRO) and coalesces into the TUN.
pub fn run(
    index: usize,
    tun: TunQueue,
    offload: TunOffload,
    vnet_hdr: bool,
    poll_mode: PollMode,
    shared: Arc<Shared>,
) {
    let mut w = OffloadWorker::new(offload, vnet_hdr);
    let mut cache = shared.device.cache();
    let (mut gen, mut socks) = shared.sockets.get();
    let mut sock = socks[index % socks.len()].clone();
    let tcp = shared.tcp.clone();
    // The wait, as in the io_uring loop: `Poll = adaptive` polls without sleeping for a
    // moment after traffic, `busy` always, `sleep` (the default) never.
    let mut hot_until = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        // Every round, idle ones too (the wait below is at most 100 ms).
        shared.heartbeats.beat(index);
        if shared.sockets.generation() != gen {
            (gen, socks) = shared.sockets.get();
            sock = socks[index % socks.len()].clone();
        }
        let (udp_ready, tun_ready) = {
            let mut fds = [
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
                PollFd::new(tun.as_fd(), PollFlags::POLLIN),
            ];
            let timeout = if spin_now(poll_mode, hot_until) {
                PollTimeout::ZERO
            } else {
                PollTimeout::from(100u16)
            };
            match poll(&mut fds, timeout) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::error!("worker {index}: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            let r = |f: &PollFd| f.revents().unwrap_or(PollFlags::empty());
            let tr = r(&fds[1]);
            if tr.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) {
                log::info!("worker {index}: TUN closed");
                shared.tun_gone.store(true, Ordering::Relaxed);
                return;
            }
            (
                r(&fds[0]).contains(PollFlags::POLLIN),
                tr.contains(PollFlags::POLLIN),
            )
        };
        // After the wait, not before it: a listen-port change while we slept must not
        // send this batch's answers from the old socket (the peer would roam to a port
        // that is about to close).
        if shared.sockets.generation() != gen {
            continue; // the top of the loop picks up the new socket
        }
        let table = cache.get(&shared.device);
        if udp_ready || tun_ready {
            hot_until = Instant::now() + ADAPTIVE_SPIN;
        }
        if udp_ready {
            if let Err(e) = w.pump_udp(
                &shared.device,
                table,
                &tun,
                &sock,
                tcp.as_deref(),
                BATCH / 16,
            ) {
                // ICMP errors (ECONNREFUSED, ...) surface on UDP sockets; not fatal.
                log::trace!("worker {index}: recv: {e}");
            }
        }
        if tun_ready {
            if let Err(e) = w.pump_tun(&shared.device, table, &tun, &sock, tcp.as_deref(), BATCH) {
                // EBADFD/EIO: the interface was deleted under us (wg-quick down).
                log::info!("worker {index}: TUN read failed ({e}); interface gone");
                shared.tun_gone.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}
