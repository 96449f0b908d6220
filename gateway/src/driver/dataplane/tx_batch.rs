//! [`TxBatch`]: the WireGuard datagrams of one round to one destination and source
//! address, gathered into one `UDP_SEGMENT` send (or one `sendmmsg` without GSO) in a
//! backend buffer, as `core::gso`'s batch planner says. Flushes itself when full.

use crate::core::gso::GsoBatch;
use crate::driver::dataplane::backend::{Backend, Dst, GSO_BUF};
use crate::sys::cmsg::PktInfo;

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
            let b = GsoBatch::new(to.addr, be.max_segments(to.addr));
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
            self.cur = Some((
                buf,
                GsoBatch::new(to.addr, be.max_segments(to.addr)),
                to.src,
            ));
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
