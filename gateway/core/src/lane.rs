//! A peer's inbound lane: one peer's received trains spread over the workers and put
//! back in order before the TUN sees them.
//!
//! The worker that received a train (one socket's GRO train: its datagrams arrived in
//! this order) takes a [`Ticket`] for it. Whoever holds the lane's *decrypt* role opens
//! the trains queued for it (one `Tunn` lock per train); a train's decrypted packets
//! are then [`Lane::complete`]d under its ticket, in any order. Whoever holds the
//! *write* role takes the completed trains strictly in ticket order and writes them to
//! the TUN — so one flow's packets reach the TUN in the order one socket received them,
//! from one thread at a time. The order restored is the receive order, not the
//! counter order: a rekey (counters from 0 again) or a session change cannot confuse
//! it, and a train that failed authentication completes empty and never holds the
//! queue up.
//!
//! Neither role is ever waited for: a worker that finds a role taken leaves its work in
//! the lane and moves on; the holder, before it lets the role go, looks again under the
//! lane's lock ([`Lane::next_to_decrypt`], [`Lane::release_write`]), so nothing queued
//! is left behind. The lock guards only these few words (never a cipher or a write).
//!
//! Sans-IO: the jobs are the caller's handles (`J`), the lane only orders them.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// Packets in flight per lane (in trains taken, not yet written): inside boringtun's
/// 1024-packet replay window, so opening trains out of order never rejects one.
pub const IN_FLIGHT: usize = 960;
/// Trains in flight per lane (a UDP GRO train holds 1 to 64 datagrams).
pub const TRAINS: usize = 63;
const SLOTS: usize = TRAINS + 1;

/// A train's place in its lane's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// What a lane counted since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Tickets handed out.
    pub tickets: u64,
    /// Trains refused because [`IN_FLIGHT`] packets or [`TRAINS`] trains were in flight.
    pub full: u64,
}

struct State<J> {
    next_ticket: u64,
    next_write: u64,
    /// Packets in the trains taken and not written, and each one's count.
    packets: usize,
    counts: [u16; SLOTS],
    /// Completed trains waiting for their turn, at `ticket % SLOTS`.
    done: [Option<J>; SLOTS],
    /// Trains waiting for the decrypt role, with their tickets.
    queued: VecDeque<(Ticket, J)>,
    decrypting: bool,
    writing: bool,
    stats: LaneStats,
}

/// See the module documentation.
pub struct Lane<J> {
    state: Mutex<State<J>>,
}

impl<J> Default for Lane<J> {
    fn default() -> Self {
        Lane {
            state: Mutex::new(State {
                next_ticket: 0,
                next_write: 0,
                packets: 0,
                counts: [0; SLOTS],
                done: std::array::from_fn(|_| None),
                queued: VecDeque::with_capacity(SLOTS),
                decrypting: false,
                writing: false,
                stats: LaneStats::default(),
            }),
        }
    }
}

impl<J> Lane<J> {
    fn st(&self) -> MutexGuard<'_, State<J>> {
        // Plain words; a panic elsewhere leaves them consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next place in the order for a train of `packets`, or `None` when that would
    /// put more than [`IN_FLIGHT`] packets or [`TRAINS`] trains in flight (the caller
    /// drops the train and counts it, as a full socket would).
    pub fn ticket(&self, packets: usize) -> Option<Ticket> {
        let mut s = self.st();
        let packets = packets.clamp(1, IN_FLIGHT);
        if s.next_ticket - s.next_write >= TRAINS as u64 || s.packets + packets > IN_FLIGHT {
            s.stats.full += 1;
            return None;
        }
        let t = Ticket(s.next_ticket);
        s.counts[(t.0 % SLOTS as u64) as usize] = packets as u16;
        s.packets += packets;
        s.next_ticket += 1;
        s.stats.tickets += 1;
        Some(t)
    }

    /// Take the decrypt role if nobody holds it.
    pub fn try_decrypt(&self) -> bool {
        !std::mem::replace(&mut self.st().decrypting, true)
    }

    /// Leave a train for the decrypt role's holder. Returns whether the caller took the
    /// role on the way (nobody held it): then the caller must drain with
    /// [`Self::next_to_decrypt`].
    pub fn queue(&self, t: Ticket, job: J) -> bool {
        let mut s = self.st();
        s.queued.push_back((t, job));
        !std::mem::replace(&mut s.decrypting, true)
    }

    /// For the decrypt role's holder: the next queued train, or `None` — and then the
    /// role is let go in the same step, so a train queued a moment ago is never missed.
    pub fn next_to_decrypt(&self) -> Option<(Ticket, J)> {
        let mut s = self.st();
        let next = s.queued.pop_front();
        if next.is_none() {
            s.decrypting = false;
        }
        next
    }

    /// A train is decrypted (an empty job when nothing in it authenticated: it still
    /// takes its turn, so nothing waits for it). Returns whether the caller took the
    /// write role on the way: then it must drain with [`Self::next_to_write`] and
    /// [`Self::release_write`].
    pub fn complete(&self, t: Ticket, job: J) -> bool {
        let mut s = self.st();
        let i = (t.0 % SLOTS as u64) as usize;
        debug_assert!(s.done[i].is_none() && t.0 >= s.next_write && t.0 < s.next_ticket);
        s.done[i] = Some(job);
        !std::mem::replace(&mut s.writing, true)
    }

    /// Take the write role if nobody holds it.
    pub fn try_write(&self) -> bool {
        !std::mem::replace(&mut self.st().writing, true)
    }

    /// For the write role's holder: the next train in order, if it is decrypted.
    pub fn next_to_write(&self) -> Option<J> {
        let mut s = self.st();
        let i = (s.next_write % SLOTS as u64) as usize;
        let job = s.done[i].take()?;
        s.packets -= usize::from(s.counts[i]);
        s.next_write += 1;
        Some(job)
    }

    /// For the write role's holder once what it took is written (flushed to the TUN):
    /// `true` if the next train in order completed meanwhile (keep the role and write it),
    /// else the role is let go in the same step.
    pub fn release_write(&self) -> bool {
        let mut s = self.st();
        let i = (s.next_write % SLOTS as u64) as usize;
        if s.done[i].is_some() {
            return true;
        }
        s.writing = false;
        false
    }

    /// Trains taken and not yet written.
    pub fn in_flight(&self) -> usize {
        let s = self.st();
        (s.next_ticket - s.next_write) as usize
    }

    pub fn stats(&self) -> LaneStats {
        self.st().stats
    }
}

#[cfg(test)]
#[path = "lane/tests.rs"]
mod tests;
