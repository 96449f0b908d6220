//! The lane under arbitrary interleavings: a receiver taking tickets, decrypt and write
//! roles handed between simulated workers, trains completing in any order, some empty
//! (nothing in them authenticated). Whatever the schedule: every train is written once,
//! in ticket order, nothing stays behind, and no schedule needs a wait.

use super::*;

use crate::testutil::Rng;

/// A job: the train's number and whether anything in it authenticated.
type Job = (u64, bool);

/// A simulated worker's task, advanced one lane call at a time.
enum Task {
    /// Holds the decrypt role: decrypting `busy` (if any), then the queue.
    Decrypt { busy: Option<(Ticket, Job)> },
    /// Holds the write role: `taken` is what it took and has not flushed yet.
    Write { taken: Vec<Job>, flushing: bool },
}

struct Sim {
    lane: Lane<Job>,
    tasks: Vec<Task>,
    written: Vec<u64>,
    /// Trains that got a ticket and had something authenticated.
    expected: Vec<u64>,
    received: u64,
}

impl Sim {
    /// The receiver's step: one train, handed to the lane one of the driver's ways.
    fn receive(&mut self, rng: &mut Rng) {
        let n = self.received;
        self.received += 1;
        let Some(t) = self.lane.ticket(1 + rng.below(64) as usize) else {
            return; // full: dropped, as the driver counts it
        };
        let good = rng.below(5) != 0;
        if good {
            self.expected.push(n);
        }
        let job = (n, good);
        match rng.below(3) {
            // Inline: the receiver decrypts its own train if the role is free.
            0 if self.lane.try_decrypt() => self.tasks.push(Task::Decrypt {
                busy: Some((t, job)),
            }),
            // Queued; the role, when it was free, goes to whoever the receiver picks
            // (itself or an idle worker: the same to the lane).
            _ => {
                if self.lane.queue(t, job) {
                    self.tasks.push(Task::Decrypt { busy: None });
                }
            }
        }
    }

    /// One step of task `i`; returns false when the task ended.
    fn step(&mut self, i: usize, rng: &mut Rng) -> bool {
        match &mut self.tasks[i] {
            Task::Decrypt { busy } => {
                if let Some((t, job)) = busy.take() {
                    if self.lane.complete(t, job) {
                        self.tasks.push(Task::Write {
                            taken: Vec::new(),
                            flushing: false,
                        });
                    }
                    return true;
                }
                match self.lane.next_to_decrypt() {
                    Some(next) => {
                        *busy = Some(next);
                        true
                    }
                    None => false,
                }
            }
            Task::Write { taken, flushing } => {
                if !*flushing {
                    match self.lane.next_to_write() {
                        // Sometimes flush before taking everything ready (a full batch).
                        Some(j) => {
                            taken.push(j);
                            *flushing = rng.below(4) == 0;
                        }
                        None => *flushing = true,
                    }
                    return true;
                }
                self.written
                    .extend(taken.drain(..).filter(|j| j.1).map(|j| j.0));
                *flushing = false;
                self.lane.release_write()
            }
        }
    }
}

fn run_case(seed: u64, trains: u64) {
    let mut rng = Rng(seed | 1);
    let mut sim = Sim {
        lane: Lane::default(),
        tasks: Vec::new(),
        written: Vec::new(),
        expected: Vec::new(),
        received: 0,
    };
    let mut steps = 0u64;
    loop {
        let busy_roles = |s: &Sim| {
            let d = s
                .tasks
                .iter()
                .filter(|t| matches!(t, Task::Decrypt { .. }))
                .count();
            let w = s
                .tasks
                .iter()
                .filter(|t| matches!(t, Task::Write { .. }))
                .count();
            (d, w)
        };
        let (d, w) = busy_roles(&sim);
        assert!(d <= 1 && w <= 1, "seed {seed}: {d} decrypters, {w} writers");
        let can_receive = sim.received < trains;
        if sim.tasks.is_empty() && !can_receive {
            break;
        }
        let pick = rng.below(sim.tasks.len() as u64 + u64::from(can_receive));
        if pick as usize == sim.tasks.len() {
            sim.receive(&mut rng);
        } else {
            let i = pick as usize;
            if !sim.step(i, &mut rng) {
                sim.tasks.swap_remove(i);
            }
        }
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: no progress");
    }
    assert_eq!(sim.written, sim.expected, "seed {seed}: order or loss");
    assert_eq!(sim.lane.in_flight(), 0, "seed {seed}: trains left behind");
    assert!(
        sim.lane.try_decrypt() && sim.lane.try_write(),
        "roles let go"
    );
    let st = sim.lane.stats();
    assert_eq!(st.tickets + st.full, trains);
}

#[test]
fn any_schedule_writes_every_train_once_in_order() {
    for seed in 0..3000u64 {
        run_case(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1 + seed % 97);
    }
}

/// Completions in every order of one full window: written in ticket order, the last
/// one to complete releasing all that waited behind the first.
#[test]
fn completions_in_reverse_wait_for_the_first() {
    let lane: Lane<u64> = Lane::default();
    let tickets: Vec<Ticket> = (0..IN_FLIGHT / 64)
        .map(|_| lane.ticket(64).unwrap())
        .collect();
    assert_eq!(
        lane.ticket(1),
        None,
        "960 packets in flight: the next train waits"
    );
    assert_eq!(lane.stats().full, 1);
    let small: Lane<()> = Lane::default();
    for _ in 0..TRAINS {
        assert!(small.ticket(1).is_some());
    }
    assert_eq!(small.ticket(1), None, "and so it does after 63 trains");
    let mut writing = false;
    for (i, t) in tickets.iter().enumerate().skip(1).rev() {
        writing |= lane.complete(*t, i as u64);
        // Nothing is ready while the first is missing.
        assert_eq!(lane.next_to_write(), None);
    }
    assert!(writing);
    assert!(!lane.release_write(), "nothing ready: the role goes");
    assert!(lane.complete(tickets[0], 0), "the first takes the role");
    let mut out = Vec::new();
    loop {
        while let Some(j) = lane.next_to_write() {
            out.push(j);
        }
        if !lane.release_write() {
            break;
        }
    }
    assert_eq!(out, (0..(IN_FLIGHT / 64) as u64).collect::<Vec<_>>());
    assert_eq!(lane.in_flight(), 0);
    assert!(lane.ticket(64).is_some(), "room again");
}

/// A train queued while the holder drains is seen before the role goes, and one
/// queued after it went gives the role to the one who queued it.
#[test]
fn queue_never_strands_a_train() {
    let lane: Lane<u32> = Lane::default();
    let a = lane.ticket(1).unwrap();
    let b = lane.ticket(1).unwrap();
    assert!(lane.queue(a, 1), "the role was free: the queuer holds it");
    assert!(!lane.queue(b, 2), "held: the holder will take it");
    assert_eq!(lane.next_to_decrypt(), Some((a, 1)));
    assert_eq!(lane.next_to_decrypt(), Some((b, 2)));
    assert_eq!(lane.next_to_decrypt(), None, "empty: role let go");
    let c = lane.ticket(1).unwrap();
    assert!(lane.queue(c, 3));
}
