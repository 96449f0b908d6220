//! The executor interface of a worker round: [`Backend`] lends the buffers batches are
//! built in, queues sends and TUN writes, and hands them to the kernel between packets
//! ([`Backend::relieve`]) or at the end of the round ([`Backend::submit`]), never under a
//! peer lock; [`Dst`] is where a datagram goes (peer and local source address).

use std::net::SocketAddr;

use crate::sys::cmsg::PktInfo;

/// Largest send one GSO batch carries (also the biggest single datagram we send).
pub const GSO_BUF: usize = 65536;

/// The TUN half of an executor: lends the buffers a (super-)packet is built in and
/// writes them. Every [`Backend`] is one; `tun_batch::DirectTun` is one without sockets.
pub trait TunSink {
    /// A buffer of at least [`GSO_BUF`] bytes the sink lends out.
    type Buf;
    /// A free buffer, or `None` when none is left (the packet is dropped and counted).
    fn alloc(&mut self) -> Option<Self::Buf>;
    /// The bytes of a buffer this sink lent out.
    fn bytes<'b>(&'b self, b: &'b mut Self::Buf) -> &'b mut [u8];
    /// Give back a buffer that was not used.
    fn release(&mut self, b: Self::Buf);
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
}

/// How a worker's bytes reach the kernel: its TUN half ([`TunSink`]) and the sends.
/// Buffers come from the backend so the batch is built where the kernel will read it
/// (a registered pool buffer under io_uring).
pub trait Backend: TunSink {
    /// Datagrams one batch to `to` may carry (GSO segments, or datagrams of one
    /// `sendmmsg`): GSO may rest toward one destination and not another.
    fn max_segments(&self, to: SocketAddr) -> usize;
    /// Send the first `len` bytes of `b` to `dst` as datagrams of `seg` bytes (the last
    /// may be shorter), from the local address `src` when given (else routing picks).
    /// Takes the buffer back.
    fn send(&mut self, b: Self::Buf, len: usize, to: Dst, seg: usize);
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
