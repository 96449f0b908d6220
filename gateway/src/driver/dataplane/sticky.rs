//! Sticky source addresses: [`StickyTable`], shared by all workers, remembers for each
//! peer the local address its last *authenticated* datagram came to; [`Sticky`] is one
//! worker's lock-free snapshot of it, refreshed once per round when it moved.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sys::cmsg::PktInfo;

/// Sticky source addresses, shared by all workers: for each peer address, the local
/// address its last *authenticated* datagram came to (`IP_PKTINFO`), so replies leave
/// from it — a multi-homed gateway answers from the address the client used, as
/// wireguard-go's sticky sockets do. Shared because the peer's datagrams arrive on one
/// worker (`SO_REUSEPORT` hashes the 4-tuple) while the TUN flows to it are read by any.
/// Only authenticated datagrams teach it (a forged one cannot move our source); bounded
/// (cleared when full, relearned from the next datagrams). Changes are rare (a new peer,
/// a roam): each replaces the map whole and moves a generation, and workers reload
/// their snapshot once per round when it moved — no lock on the packet path.
#[derive(Debug, Default)]
pub struct StickyTable {
    pub(super) generation: AtomicU64,
    map: Mutex<Arc<HashMap<SocketAddr, PktInfo>>>,
}

/// Peer addresses [`StickyTable`] remembers before it starts over.
pub(super) const STICKY_MAX: usize = 4096;

impl StickyTable {
    pub(super) fn snapshot(&self) -> (u64, Arc<HashMap<SocketAddr, PktInfo>>) {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        (self.generation.load(Ordering::Acquire), m.clone())
    }

    fn publish(&self, peer: SocketAddr, local: PktInfo) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(&peer) == Some(&local) {
            return;
        }
        let mut next = if m.len() >= STICKY_MAX {
            HashMap::new()
        } else {
            (**m).clone()
        };
        next.insert(peer, local);
        *m = Arc::new(next);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The local address `peer` last reached us at, read under the lock: for the rare
    /// sends from outside the workers (timers, the TCP thread).
    pub fn source_for(&self, peer: SocketAddr) -> Option<PktInfo> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&peer).copied()
    }

    /// Forget every source (one was gone: the next datagrams teach them again).
    pub fn clear(&self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !m.is_empty() {
            *m = Arc::new(HashMap::new());
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// One worker's view of the [`StickyTable`]: a snapshot read without locking.
#[derive(Debug)]
pub struct Sticky {
    table: Arc<StickyTable>,
    generation: u64,
    map: Arc<HashMap<SocketAddr, PktInfo>>,
}

impl Sticky {
    pub fn new(table: Arc<StickyTable>) -> Sticky {
        let (generation, map) = table.snapshot();
        Sticky {
            table,
            generation,
            map,
        }
    }

    /// Take in what other workers learnt (once per round; a lock only when it moved).
    pub fn refresh(&mut self) {
        if self.table.generation.load(Ordering::Acquire) != self.generation {
            (self.generation, self.map) = self.table.snapshot();
        }
    }

    /// The local address to answer `peer` from.
    pub fn get(&self, peer: SocketAddr) -> Option<PktInfo> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&peer).copied()
    }

    /// An authenticated datagram from `peer` came to `local`.
    pub fn learn(&mut self, peer: SocketAddr, local: Option<PktInfo>) {
        let Some(local) = local else { return };
        if self.map.get(&peer) == Some(&local) {
            return;
        }
        self.table.publish(peer, local);
        self.refresh();
    }

    /// A send from a remembered address failed as if the address were gone: forget
    /// them all (rare; the next authenticated datagrams teach them again).
    pub fn forget(&mut self) {
        self.table.clear();
        self.refresh();
    }
}
