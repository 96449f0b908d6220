//! Writes to the TUN: [`TunBatch`] gathers the decrypted packets of one round and
//! writes them coalesced into `virtio_net_hdr` super-packets (`core::gso`'s coalescer);
//! [`write_plain`] writes one packet as it is (the TCP thread's path).

use std::io;

use crate::core::gso::{CoalesceOptions, Coalescer, MAX_BATCH};
use crate::driver::dataplane::backend::Backend;
use crate::sys::tun::TunQueue;

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

    /// Queue one plain IP packet.
    pub fn push<K: Backend>(&mut self, be: &mut K, p: &[u8]) {
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
    pub fn slot<K: Backend>(&mut self, be: &mut K, max: usize) -> Option<&mut [u8]> {
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
    pub fn flush<K: Backend>(&mut self, be: &mut K) {
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
