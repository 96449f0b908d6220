//! Writes to the TUN, the one path every decrypted packet takes: [`TunBatch`] gathers
//! the packets of a round and writes them coalesced into `virtio_net_hdr` super-packets
//! (`core::gso`'s coalescer) through a [`TunSink`] — a worker's backend, or
//! [`DirectTun`] (immediate writes, for the TCP thread).

use crate::core::gso::{CoalesceOptions, Coalescer, MAX_BATCH};
use crate::driver::dataplane::backend::{TunSink, GSO_BUF};
use crate::sys::tun::{TunOffload, TunQueue};

/// A [`TunSink`] that writes at once to one TUN queue from one reused buffer: for a
/// thread that is not a worker (the TCP transport's), called only once the device has
/// returned, never under a peer lock.
pub struct DirectTun<'a> {
    pub queue: &'a TunQueue,
    pub buf: &'a mut Vec<u8>,
    /// Writes the TUN refused.
    pub errors: &'a mut u64,
}

impl DirectTun<'_> {
    fn write(&mut self, p: &[u8]) {
        if let Err(e) = self.queue.write(p) {
            *self.errors += 1;
            log::trace!("tun write: {e}");
        }
    }
}

impl TunSink for DirectTun<'_> {
    type Buf = Vec<u8>;
    fn alloc(&mut self) -> Option<Vec<u8>> {
        let mut b = std::mem::take(self.buf);
        b.resize(GSO_BUF, 0);
        Some(b)
    }
    fn bytes<'b>(&'b self, b: &'b mut Vec<u8>) -> &'b mut [u8] {
        b
    }
    fn release(&mut self, b: Vec<u8>) {
        *self.buf = b;
    }
    fn write_tun(&mut self, b: Vec<u8>, len: usize) {
        self.write(&b[..len.min(b.len())]);
        *self.buf = b;
    }
    fn write_tun_plain(&mut self, p: &[u8]) {
        self.write(p);
    }
}

/// What the coalescer may merge on a TUN created with `vnet_hdr` whose `TUNSETOFFLOAD`
/// left `offload` (TCP with TSO, UDP with USO; nothing without `vnet_hdr`).
pub fn coalesce_options(offload: TunOffload, vnet_hdr: bool) -> CoalesceOptions {
    CoalesceOptions {
        tcp: vnet_hdr && offload.tso(),
        udp: vnet_hdr && offload.uso(),
    }
}

/// Bytes of decrypted packets a [`TunBatch`] holds before it must flush.
const ARENA: usize = 512 * 1024;
/// Gathers decrypted packets and writes them to the TUN coalesced.
pub struct TunBatch {
    arena: Vec<u8>,
    used: usize,
    spans: heapless::Vec<(u32, u32), MAX_BATCH>,
    coalescer: Coalescer,
    vnet_hdr: bool,
    /// Groups the coalescer could not write.
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
            vnet_hdr,
            write_errors: 0,
            coalesced: 0,
        }
    }

    /// What the coalescer merges.
    pub fn options(&self) -> CoalesceOptions {
        self.coalescer.options()
    }

    /// Queue one plain IP packet.
    pub fn push<K: TunSink>(&mut self, be: &mut K, p: &[u8]) {
        if !self.vnet_hdr {
            be.write_tun_plain(p);
            return;
        }
        if p.len() > ARENA {
            return;
        }
        if self.spans.is_full() || self.used + p.len() > ARENA {
            self.flush(be);
        }
        self.arena[self.used..self.used + p.len()].copy_from_slice(p);
        // Cannot fail: flushed above when full.
        let _ = self.spans.push((self.used as u32, p.len() as u32));
        self.used += p.len();
    }

    /// Room for the next decrypted packet (at least `max` bytes) in the arena, where the
    /// device decrypts it; [`Self::commit`] queues it. `None` without `vnet_hdr` (plain
    /// writes go straight from the device's buffer) or for a packet that cannot fit.
    pub fn slot<K: TunSink>(&mut self, be: &mut K, max: usize) -> Option<&mut [u8]> {
        if !self.vnet_hdr || max > ARENA {
            return None;
        }
        if self.spans.is_full() || self.used + max > ARENA {
            self.flush(be);
        }
        Some(&mut self.arena[self.used..self.used + max])
    }

    /// The first `len` bytes of the last [`Self::slot`] are a packet to write.
    pub fn commit(&mut self, len: usize) {
        if self.used + len <= ARENA && self.spans.push((self.used as u32, len as u32)).is_ok() {
            self.used += len;
        }
    }

    /// Coalesce and write what is queued: each group straight into a backend buffer.
    pub fn flush<K: TunSink>(&mut self, be: &mut K) {
        if self.spans.is_empty() {
            return;
        }
        let mut pkts: heapless::Vec<&[u8], MAX_BATCH> = heapless::Vec::new();
        for &(at, len) in &self.spans {
            let _ = pkts.push(&self.arena[at as usize..(at + len) as usize]);
        }
        self.coalescer.plan(&pkts);
        for g in self.coalescer.groups() {
            let Some(mut buf) = be.alloc() else { break };
            match self.coalescer.write(&g, &pkts, be.bytes(&mut buf)) {
                Ok(n) => {
                    if g.count > 1 {
                        self.coalesced += 1;
                    }
                    be.write_tun(buf, n);
                }
                Err(e) => {
                    be.release(buf);
                    self.write_errors += 1;
                    log::trace!("coalesce: {e}");
                }
            }
        }
        self.spans.clear();
        self.used = 0;
    }
}
