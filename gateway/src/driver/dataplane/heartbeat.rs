//! [`Heartbeats`]: one counter per worker, bumped every round; the status file carries
//! them and init's health watch reads them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
