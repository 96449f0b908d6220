//! [`SyscallBackend`], the poll engine's executor: plain syscalls on a socket and a TUN
//! queue (`sendmsg` with `UDP_SEGMENT`, `sendmmsg`, `write`), made when the round ends,
//! waiting a bounded time for room when the socket is full.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::driver::dataplane::backend::{Backend, Dst, TunSink, GSO_BUF};
use crate::sys::tun::TunQueue;
use crate::sys::udp::{UdpSocket, MAX_GSO_SEGMENTS};

/// How long a send may wait in total for room in a full socket before the rest of the
/// batch is dropped (backpressure for the tunnel's TCP flows; bounded so a dead route
/// cannot stall the worker).
const SEND_WAIT: Duration = Duration::from_millis(200);
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

impl TunSink for SyscallBackend<'_> {
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
}

impl Backend for SyscallBackend<'_> {
    fn max_segments(&self, _to: SocketAddr) -> usize {
        // Without GSO (or while it rests toward `_to`) the batch goes out as one
        // sendmmsg: sys::udp splits it.
        MAX_GSO_SEGMENTS
    }

    fn send(&mut self, buf: Vec<u8>, len: usize, to: Dst, seg: usize) {
        self.queue(Pending::Send { buf, len, to, seg });
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
