//! One peer on every core: what the workers share to spread one peer's received
//! trains ([`Spread`]) — the trains' storage ([`Job`]s, moved between workers by
//! number), each worker's inbox of lane roles handed to it, and the counts.
//!
//! The rule (carried out by `Pipeline`): a worker that receives a train of one
//! peer's data messages takes a ticket in the peer's `core::lane`. If another worker is
//! idle (asleep in its wait) and the train is worth a wake-up, the train is copied into a
//! job, queued, and the lane's decrypt role (when free) is handed to that worker; else the
//! receiving worker opens it itself (without a copy) if the decrypt role is free, or
//! queues it for the role's holder (and then writes what that one finished, if nobody
//! is writing: receiving and writing on one worker, opening on the other). Whoever
//! completes a train and finds the write role free hands that role to an idle worker
//! too, or writes itself: the trains go to the TUN in ticket order from one thread at a
//! time, through the TUN queue of the worker that received them (plain `write(2)`s,
//! finished when they return), the role held to the end of the writer's round and let
//! go only after its writes. Many peers keep every worker busy: nobody is idle, nothing
//! is handed over, and each peer's trains stay on the worker that received them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::core::device::{LaneJob, Peer};
use crate::core::lane::Ticket;
use crate::sys::cmsg::RecvMeta;
use crate::sys::tun::TunQueue;

/// Bytes a job holds: a GRO train (at most 64 KiB), and its packets once opened.
pub const JOB_BYTES: usize = 65536;
/// Packets a job holds (a UDP GRO train has at most 64 datagrams).
pub const JOB_PACKETS: usize = 128;
/// A smaller train is opened where it was received unless the lane's role is taken: a
/// wake-up (an eventfd write, another thread scheduled) costs more than it spreads.
/// `RG_SPREAD_MIN_BYTES` (read once at start) sets another: the order lab sets 0, so
/// every train of a stock peer (which sends no GSO trains) is handed over.
pub const HANDOFF_MIN_BYTES: usize = 16 * 1024;
/// Jobs per worker in the shared pool (each up to 128 KiB, allocated on first use).
const JOBS_PER_WORKER: usize = 24;

/// One train between the workers.
pub struct Job {
    pub peer: Option<Arc<Peer>>,
    pub ticket: Option<Ticket>,
    /// How it was received (`len`: bytes in `cipher` when it was copied).
    pub meta: Option<RecvMeta>,
    /// The train, when it was handed over (copied out of the receiving worker's buffer).
    pub cipher: Vec<u8>,
    /// Its packets once opened.
    pub opened: Opened,
    /// The worker that received it.
    pub received_by: usize,
}

/// A train's packets once opened: `plain[at..at + len]` for each span, in order.
pub struct Opened {
    plain: Vec<u8>,
    used: usize,
    spans: heapless::Vec<(u32, u32), JOB_PACKETS>,
}

impl Opened {
    /// Room for a packet of up to `max` bytes, after the ones opened so far.
    pub fn slot(&mut self, max: usize) -> Option<&mut [u8]> {
        if self.spans.is_full() || self.used + max > self.plain.len() {
            return None;
        }
        Some(&mut self.plain[self.used..self.used + max])
    }

    /// The first `len` bytes of the last [`Self::slot`] are a packet.
    pub fn commit(&mut self, len: usize) {
        if self.used + len <= self.plain.len()
            && self.spans.push((self.used as u32, len as u32)).is_ok()
        {
            self.used += len;
        }
    }

    /// The packets opened, in order.
    pub fn packets(&self) -> impl Iterator<Item = &[u8]> {
        self.spans
            .iter()
            .map(|&(at, len)| &self.plain[at as usize..(at + len) as usize])
    }
}

impl Job {
    fn new() -> Job {
        Job {
            peer: None,
            ticket: None,
            meta: None,
            cipher: Vec::new(),
            opened: Opened {
                plain: Vec::new(),
                used: 0,
                spans: heapless::Vec::new(),
            },
            received_by: 0,
        }
    }
}

/// A lane role handed to a worker: it holds it now and must drain it.
pub enum Role {
    Decrypt(Arc<Peer>),
    Write(Arc<Peer>),
}

struct Inbox {
    /// Asleep in its wait with nothing to do: may be handed a role.
    idle: AtomicBool,
    roles: Mutex<heapless::Deque<Role, 32>>,
    /// A role was handed over since the worker last looked (and `wake` written).
    woken: AtomicBool,
    wake: EventFd,
}

/// What spreading did since the start (the status line).
#[derive(Default)]
pub struct SpreadStats {
    /// Trains of data messages that went through a lane.
    pub trains: AtomicU64,
    /// Trains opened by a worker other than the one that received them.
    pub handed_off: AtomicU64,
    /// Trains written to the TUN by a worker other than the one that received them.
    pub written_elsewhere: AtomicU64,
    /// Trains dropped: the peer had [`crate::core::lane::IN_FLIGHT`] packets in flight.
    pub lane_full: AtomicU64,
    /// Trains dropped: every job of the pool was in use.
    pub no_job: AtomicU64,
    /// Time spent opening trains (under the peer's one lock: the serial part of a
    /// peer's inbound work) and the bytes opened, for the status line's cost per 64 KiB.
    pub open_ns: AtomicU64,
    pub opened_bytes: AtomicU64,
}

/// What the workers share to spread one peer (see the module documentation).
pub struct Spread {
    jobs: Vec<Mutex<Job>>,
    free: Mutex<Vec<LaneJob>>,
    inboxes: Vec<Inbox>,
    /// Each worker's second handle on its TUN queue: a train is written through the
    /// queue of the worker that received it, whoever writes it. The kernel steers a
    /// flow's packets from the TUN to the queue its packets were last written to, so
    /// the flow's other direction stays on one worker (and in order) too.
    queues: Vec<OnceLock<TunQueue>>,
    /// Trains below this many bytes stay where they are ([`HANDOFF_MIN_BYTES`]).
    pub min_bytes: usize,
    next_helper: AtomicUsize,
    pub stats: SpreadStats,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Spread {
    /// For `workers` workers (each needs its own wake-up file).
    pub fn new(workers: usize) -> std::io::Result<Spread> {
        let jobs = JOBS_PER_WORKER * workers.max(1);
        let mut inboxes = Vec::with_capacity(workers);
        for _ in 0..workers {
            inboxes.push(Inbox {
                idle: AtomicBool::new(false),
                roles: Mutex::new(heapless::Deque::new()),
                woken: AtomicBool::new(false),
                wake: EventFd::from_value_and_flags(
                    0,
                    EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
                )?,
            });
        }
        Ok(Spread {
            jobs: (0..jobs).map(|_| Mutex::new(Job::new())).collect(),
            free: Mutex::new((0..jobs as LaneJob).rev().collect()),
            queues: (0..workers).map(|_| OnceLock::new()).collect(),
            inboxes,
            min_bytes: std::env::var("RG_SPREAD_MIN_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(HANDOFF_MIN_BYTES),
            next_helper: AtomicUsize::new(0),
            stats: SpreadStats::default(),
        })
    }

    /// A free job, its buffers sized (allocated the first time only).
    pub fn take_job(&self) -> Option<LaneJob> {
        let id = lock(&self.free).pop();
        if id.is_none() {
            bump(&self.stats.no_job);
        }
        id
    }

    /// A job back to the pool, emptied (its peer reference dropped).
    pub fn free_job(&self, id: LaneJob) {
        {
            let mut j = self.job(id);
            j.peer = None;
            j.ticket = None;
            j.meta = None;
            j.opened.used = 0;
            j.opened.spans.clear();
        }
        lock(&self.free).push(id);
    }

    /// A job's storage. Only the one worker that holds its number locks it.
    pub fn job(&self, id: LaneJob) -> MutexGuard<'_, Job> {
        let mut j = lock(&self.jobs[id as usize]);
        if j.opened.plain.len() < JOB_BYTES {
            j.opened.plain.resize(JOB_BYTES, 0);
        }
        j
    }

    /// Worker `me` takes part, writing its trains through `tun` (another handle on its
    /// queue).
    pub fn join(&self, me: usize, tun: TunQueue) -> bool {
        self.queues.get(me).is_some_and(|q| q.set(tun).is_ok())
    }

    /// The TUN queue the trains received by worker `by` are written through.
    pub fn queue(&self, by: usize) -> Option<&TunQueue> {
        self.queues.get(by)?.get()
    }

    /// Worker `me` is about to sleep (`true`) or woke (`false`).
    pub fn set_idle(&self, me: usize, idle: bool) {
        if let Some(b) = self.inboxes.get(me) {
            b.idle.store(idle, Ordering::Release);
        }
    }

    /// Hand `role` to an idle worker other than `me` (claimed, so two senders do not
    /// both pick it) and wake it. `Err(role)`: nobody idle, the caller drains it.
    pub fn hand_off(&self, me: usize, role: Role) -> Result<(), Role> {
        let n = self.inboxes.len();
        let start = self.next_helper.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            let i = (start + k) % n;
            let b = &self.inboxes[i];
            if i == me
                || b.idle
                    .compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // An idle worker's inbox is drained by its next round; full (a wait that kept
            // timing out between hand-overs), the sender keeps the role.
            lock(&b.roles).push_back(role)?;
            b.woken.store(true, Ordering::Release);
            let _ = b.wake.write(1);
            return Ok(());
        }
        Err(role)
    }

    /// Whether some worker other than `me` is idle now (a hint: [`Self::hand_off`]
    /// decides).
    pub fn anyone_idle(&self, me: usize) -> bool {
        self.inboxes
            .iter()
            .enumerate()
            .any(|(i, b)| i != me && b.idle.load(Ordering::Acquire))
    }

    /// The next role handed to worker `me`.
    pub fn next_role(&self, me: usize) -> Option<Role> {
        let b = self.inboxes.get(me)?;
        lock(&b.roles).pop_front()
    }

    /// Worker `me`'s wake-up file (its engine polls it) and a reset after a wake-up.
    pub fn wake_fd(&self, me: usize) -> Option<&EventFd> {
        self.inboxes.get(me).map(|b| &b.wake)
    }

    /// Whether a role was handed to worker `me` since it last asked; if so its wake-up
    /// file is read (emptied) too, so the portable engine's `poll` does not see it
    /// readable for ever. A role handed after this writes it again.
    pub fn take_wake(&self, me: usize) -> bool {
        let Some(b) = self.inboxes.get(me) else {
            return false;
        };
        if !b.woken.swap(false, Ordering::AcqRel) {
            return false;
        }
        let _ = b.wake.read();
        true
    }

    /// One train of `bytes` opened in `took`.
    pub fn note_open(&self, took: std::time::Duration, bytes: usize) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.stats.open_ns.fetch_add(ns, Ordering::Relaxed);
        self.stats
            .opened_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn note_trains(&self) {
        bump(&self.stats.trains);
    }
    pub fn note_full(&self) {
        bump(&self.stats.lane_full);
    }
    pub fn note_handed_off(&self) {
        bump(&self.stats.handed_off);
    }
    pub fn note_written_elsewhere(&self) {
        bump(&self.stats.written_elsewhere);
    }

    /// The status line.
    pub fn status_line(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        let (ns, bytes) = (g(&s.open_ns), g(&s.opened_bytes));
        let per_64k = if bytes > 0 {
            ns as f64 / 1000.0 * 65536.0 / bytes as f64
        } else {
            0.0
        };
        format!(
            "spread: on; trains: {}; trains handed off: {}; tun writes by another worker: {}; lane full: {}; no job free: {}; opening: {:.1} s, {:.1} us per 64 KiB",
            g(&s.trains),
            g(&s.handed_off),
            g(&s.written_elsewhere),
            g(&s.lane_full),
            g(&s.no_job),
            ns as f64 / 1e9,
            per_64k
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "spread/tests.rs"]
mod tests;
