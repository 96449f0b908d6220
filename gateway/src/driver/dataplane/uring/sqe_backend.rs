//! [`UringBackend`], the io_uring engine's executor: batches are built in registered
//! pool buffers and handed to the kernel as SQEs (`SendMsg` with `UDP_SEGMENT` and the
//! sticky source, `WriteFixed`); nothing here makes a syscall except `relieve`.

use std::net::SocketAddr;

use crate::driver::dataplane::backend::{Backend, Dst, TunSink};
use crate::sys::hugepage::{BufId, BufPool};
use crate::sys::udp::UdpSocket;
use crate::sys::uring::{self, Rejected, Ring};

/// Sends short of this much room in the submission queue are handed to the kernel
/// between packets (outside any peer lock), so a full queue never forces a submit while
/// the device holds one.
const SQ_HEADROOM: usize = 64;

/// The io_uring executor of one round: batches are built in registered pool buffers
/// and handed to the kernel as SQEs (`SendMsg` with `UDP_SEGMENT` and the sticky
/// source, `WriteFixed`); nothing here makes a syscall except `relieve`, between packets.
pub(super) struct UringBackend<'r, 'p> {
    pub(super) ring: &'r mut Ring<'p>,
    pub(super) pool: &'p BufPool,
    pub(super) sock: &'r UdpSocket,
    pub(super) v6: bool,
    /// Packets dropped for lack of a buffer or a slot.
    pub(super) dropped: &'r mut u64,
}

impl UringBackend<'_, '_> {
    fn rejected(&mut self, r: Result<(), Rejected>) {
        if let Err(Rejected(buf, _)) = r {
            self.pool.free(buf);
            *self.dropped += 1;
        }
    }
}

impl TunSink for UringBackend<'_, '_> {
    type Buf = BufId;

    fn alloc(&mut self) -> Option<BufId> {
        let b = self.pool.alloc();
        if b.is_none() {
            *self.dropped += 1;
        }
        b
    }

    fn bytes<'b>(&'b self, b: &'b mut BufId) -> &'b mut [u8] {
        self.pool.buf_mut(b)
    }

    fn release(&mut self, b: BufId) {
        self.pool.free(b);
    }

    fn write_tun(&mut self, b: BufId, len: usize) {
        let r = self.ring.write_tun(b, len);
        self.rejected(r);
    }
}

impl Backend for UringBackend<'_, '_> {
    fn max_segments(&self, to: SocketAddr) -> usize {
        // One SendMsg per batch: without GSO toward `to` a batch is one datagram (the
        // ring still submits many SendMsg per io_uring_enter).
        self.sock.max_gso_segments_to(to)
    }

    fn send(&mut self, b: BufId, len: usize, to: Dst, seg: usize) {
        let segment = (len > seg).then(|| u16::try_from(seg).unwrap_or(u16::MAX));
        let dst = uring::to_socket_family(to.addr, self.v6);
        let r = self.ring.send_udp(b, len, dst, segment, to.src);
        self.rejected(r);
    }

    fn dropped(&self) -> u64 {
        *self.dropped
    }

    fn relieve(&mut self) {
        if self.ring.sq_room() < SQ_HEADROOM {
            if let Err(e) = self.ring.submit() {
                log::trace!("submit: {e}");
            }
        }
    }
}
