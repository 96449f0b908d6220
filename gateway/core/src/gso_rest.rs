//! Which destinations UDP GSO rests toward, per socket: the table behind
//! `sys::udp`'s per-destination rest after an `EINVAL`.
//!
//! Before Linux 6.14 a `UDP_SEGMENT` send whose segment size is above the path MTU learnt
//! toward its destination fails with `EINVAL`. That says nothing about other
//! destinations, and the path MTU can be lowered by anyone who can send one ICMP
//! "fragmentation needed", so the rest is for that destination only: one by one for
//! [`REST_MIN`], doubling up to [`REST_MAX`] while GSO sends to it keep failing; a GSO
//! send to it that goes through forgets it.
//!
//! Pure: the caller passes the time (`now`, milliseconds of any monotonic clock) and keeps
//! the table behind its own lock. At most [`CAPACITY`] destinations are held, so a flood
//! of forged ICMP errors for many destinations costs a fixed amount of memory.

use std::net::SocketAddr;
use std::time::Duration;

/// The first rest toward a destination.
pub const REST_MIN: Duration = Duration::from_secs(1);
/// The longest rest; also how long after its rest ended a destination is remembered
/// (so its next failure rests longer) when no GSO send to it went through meanwhile.
pub const REST_MAX: Duration = Duration::from_secs(64);
/// Most destinations one table holds.
pub const CAPACITY: usize = 16;

const MIN_MS: u64 = REST_MIN.as_millis() as u64;
const MAX_MS: u64 = REST_MAX.as_millis() as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    dst: SocketAddr,
    /// GSO toward `dst` rests while `now < until`.
    until: u64,
    /// The length of the next rest after another failure, in ms.
    next: u64,
}

/// Destinations GSO rests toward (at most [`CAPACITY`]).
#[derive(Clone, Debug, Default)]
pub struct GsoRests {
    entries: Vec<Entry>,
}

impl GsoRests {
    /// An empty table; its memory is taken here, never on a send.
    pub fn new() -> Self {
        GsoRests {
            entries: Vec::with_capacity(CAPACITY),
        }
    }

    /// Destinations held: resting, or remembered after their rest for the doubling.
    /// 0 tells a caller it need not ask about any destination.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether GSO toward `dst` rests at `now`. Also forgets destinations whose rest
    /// ended more than [`REST_MAX`] ago without another failure, so the table empties
    /// (and callers stop asking) once the failures stop.
    pub fn resting(&mut self, dst: SocketAddr, now: u64) -> bool {
        self.entries
            .retain(|e| now < e.until.saturating_add(MAX_MS));
        self.entries.iter().any(|e| e.dst == dst && now < e.until)
    }

    /// A GSO send to `dst` failed with `EINVAL` at `now`: rest GSO toward it. Returns
    /// how long it rests from `now`. A failure while already resting (a send that was
    /// in flight when the rest began) changes nothing: the rest doubles per episode,
    /// not per refused send.
    pub fn failed(&mut self, dst: SocketAddr, now: u64) -> Duration {
        let rest = if let Some(e) = self.entries.iter_mut().find(|e| e.dst == dst) {
            if now < e.until {
                return Duration::from_millis(e.until - now);
            }
            let rest = e.next;
            e.until = now.saturating_add(rest);
            e.next = rest.saturating_mul(2).min(MAX_MS);
            rest
        } else {
            let e = Entry {
                dst,
                until: now.saturating_add(MIN_MS),
                next: (MIN_MS * 2).min(MAX_MS),
            };
            if self.entries.len() < CAPACITY {
                self.entries.push(e);
            } else if let Some(old) = self.entries.iter_mut().min_by_key(|e| e.until) {
                // Full: reuse the entry whose rest ended first, which is one whose rest
                // is over when there is any, else the one ending soonest. Harmless
                // either way: the evicted destination just tries GSO once more, that
                // send fails once (its batch is resent one by one, nothing is lost) and
                // it rests again from the shortest rest.
                *old = e;
            }
            MIN_MS
        };
        Duration::from_millis(rest)
    }

    /// A GSO send to `dst` went through: forget it (its next failure rests the
    /// shortest time).
    pub fn worked(&mut self, dst: SocketAddr) {
        self.entries.retain(|e| e.dst != dst);
    }

    /// The destinations resting at `now`, with how long each rest has left (reads only).
    pub fn resting_at(&self, now: u64) -> impl Iterator<Item = (SocketAddr, Duration)> + '_ {
        self.entries
            .iter()
            .filter(move |e| now < e.until)
            .map(move |e| (e.dst, Duration::from_millis(e.until - now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([203, 0, 113, 5], 51820 + i))
    }

    const S: u64 = 1000;

    #[test]
    fn a_failure_rests_that_destination_only() {
        let mut t = GsoRests::new();
        assert!(t.is_empty() && !t.resting(addr(0), 0));
        assert_eq!(t.failed(addr(0), 10 * S), REST_MIN);
        assert!(t.resting(addr(0), 10 * S));
        assert!(!t.resting(addr(1), 10 * S), "others keep GSO");
        assert!(t.resting(addr(0), 11 * S - 1));
        assert!(!t.resting(addr(0), 11 * S), "the rest is over");
        assert_eq!(
            t.resting_at(10 * S + 250).collect::<Vec<_>>(),
            [(addr(0), Duration::from_millis(750))]
        );
        assert_eq!(t.resting_at(11 * S).count(), 0);
    }

    #[test]
    fn rests_double_while_failures_go_on_and_a_success_forgets() {
        let mut t = GsoRests::new();
        let mut now = 0;
        let mut got = Vec::new();
        for _ in 0..9 {
            let rest = t.failed(addr(0), now);
            got.push(rest.as_secs());
            now += rest.as_millis() as u64;
            assert!(!t.resting(addr(0), now));
        }
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        t.worked(addr(0));
        assert!(t.is_empty());
        assert_eq!(
            t.failed(addr(0), now),
            REST_MIN,
            "short again after a success"
        );
    }

    #[test]
    fn a_failure_while_resting_does_not_double() {
        let mut t = GsoRests::new();
        t.failed(addr(0), 0);
        // Sends that were in flight when the rest began fail too.
        assert_eq!(t.failed(addr(0), 400), Duration::from_millis(600));
        assert_eq!(t.failed(addr(0), 999), Duration::from_millis(1));
        assert_eq!(t.failed(addr(0), S), Duration::from_secs(2));
    }

    #[test]
    fn quiet_destinations_are_forgotten_after_the_longest_rest() {
        let mut t = GsoRests::new();
        t.failed(addr(0), 0);
        t.failed(addr(0), S); // 2 s, until 3 s
        assert!(!t.resting(addr(1), 3 * S + 63_999));
        assert_eq!(t.len(), 1, "still remembered for the doubling");
        assert_eq!(t.failed(addr(0), 3 * S + 63_999), Duration::from_secs(4));
        // Nothing for REST_MAX after that rest ended (at 71 s): forgotten.
        assert!(!t.resting(addr(1), 3 * S + 63_999 + 4 * S + MAX_MS));
        assert!(t.is_empty(), "the table empties once failures stop");
    }

    #[test]
    fn a_full_table_reuses_the_entry_ending_first() {
        let mut t = GsoRests::new();
        for i in 0..CAPACITY as u16 {
            t.failed(addr(i), u64::from(i) * 100);
        }
        assert_eq!(t.len(), CAPACITY);
        // Every rest still runs: the one ending soonest (addr 0, until 1 s) goes.
        t.failed(addr(100), 500);
        assert_eq!(t.len(), CAPACITY);
        assert!(!t.resting(addr(0), 600), "evicted: it tries GSO again");
        assert!(t.resting(addr(100), 600) && t.resting(addr(1), 600));
        // A rest that is over goes before any that still runs.
        let now = 1_250; // addr 1 (until 1.1 s) and 2 (1.2 s) are over
        t.failed(addr(0), now);
        assert!(t.resting(addr(0), now) && !t.resting(addr(1), now));
        assert!(t.resting_at(now).any(|(d, _)| d == addr(3)));
        assert_eq!(t.len(), CAPACITY);
    }

    #[test]
    fn time_near_the_end_of_the_clock_does_not_overflow() {
        let mut t = GsoRests::new();
        assert_eq!(t.failed(addr(0), u64::MAX - 10), REST_MIN);
        assert!(t.resting(addr(0), u64::MAX - 1));
    }
}
