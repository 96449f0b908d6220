//! The gateway's health, as init sees it: the policy as a small pure state machine (time
//! passed in), the probing (UAPI `get=1`, heartbeats in the status file) in `init/mod.rs`.
//!
//! Healthy means: the UAPI socket answers `get=1` (with a short timeout) and every
//! worker's heartbeat counter moved within [`Limits::stall`]. A gateway unhealthy for
//! [`Limits::grace`] is restarted (init kills it; the supervisor starts it again after
//! its back-off), and so is one not healthy [`Limits::start`] after it started.
//!
//! The hardware watchdog is fed only while [`GatewayHealth::feed`] says so: the gateway is
//! healthy, or init is handling it on schedule (starting it, waiting out a back-off, in
//! the grace before a restart, or a kill not yet [`Limits::kill`] old). Feeding also
//! while the gateway is down keeps a back-off (up to 60 s) from resetting the board (the
//! watchdog times out sooner); a gateway that cannot even be killed, or an init that stops
//! running this check, lets the watchdog fire.

use std::time::{Duration, Instant};

/// The policy's time limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A heartbeat that has not moved for this long is a stuck worker (the status file
    /// is rewritten about once a second; workers beat at least every 100 ms).
    pub stall: Duration,
    /// Unhealthy this long: restart.
    pub grace: Duration,
    /// Not healthy this long after a start: restart.
    pub start: Duration,
    /// A killed gateway not gone after this long: stop feeding the watchdog.
    pub kill: Duration,
}

pub const LIMITS: Limits = Limits {
    stall: Duration::from_secs(3),
    grace: Duration::from_secs(5),
    start: Duration::from_secs(60),
    kill: Duration::from_secs(10),
};

/// One look at the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// `Err(why)`: the UAPI socket did not answer `get=1` with `errno=0`.
    pub uapi: Result<(), String>,
    /// The `heartbeat:` counters of the status file; `Err(why)` when unreadable.
    pub beats: Result<Vec<u64>, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Not running (waiting for its restart, or stopped).
    Down,
    Starting(Instant),
    Healthy,
    Unhealthy {
        since: Instant,
        why: String,
    },
    /// Restart asked for (killed) at this time.
    Killing(Instant),
}

/// What init should do after a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthChange {
    /// Nothing new.
    Same,
    /// Healthy now (after a start, or again).
    Up,
    /// Unhealthy now, for this reason (a restart follows if it lasts).
    Down(String),
    /// Kill it: it has been unhealthy too long, for this reason.
    Restart(String),
}

#[derive(Clone, Debug)]
pub struct GatewayHealth {
    limits: Limits,
    phase: Phase,
    /// Per worker: the last counter seen, when it last moved, and whether it was ever
    /// seen moving (a start is healthy only once every worker was).
    beats: Vec<(u64, Instant, bool)>,
}

impl GatewayHealth {
    pub fn new(limits: Limits) -> GatewayHealth {
        GatewayHealth {
            limits,
            phase: Phase::Down,
            beats: Vec::new(),
        }
    }

    /// The gateway (re)started.
    pub fn started(&mut self, now: Instant) {
        self.phase = Phase::Starting(now);
        self.beats.clear();
    }

    /// The gateway exited.
    pub fn exited(&mut self) {
        self.phase = Phase::Down;
        self.beats.clear();
    }

    pub fn is_healthy(&self) -> bool {
        self.phase == Phase::Healthy
    }

    /// Why the probe says unhealthy, if it does.
    fn problem(&mut self, now: Instant, p: &Probe) -> Option<String> {
        if let Err(e) = &p.uapi {
            return Some(format!("UAPI does not answer: {e}"));
        }
        let beats = match &p.beats {
            Ok(b) if b.is_empty() => return Some("no worker heartbeats".into()),
            Ok(b) => b,
            Err(e) => return Some(e.clone()),
        };
        if beats.len() != self.beats.len() {
            // First sight (or a different gateway): the clock starts now.
            self.beats = beats.iter().map(|&b| (b, now, false)).collect();
            return Some("worker heartbeats not seen moving yet".into());
        }
        let mut stuck = Vec::new();
        let mut waiting = false;
        for (i, (&b, seen)) in beats.iter().zip(self.beats.iter_mut()).enumerate() {
            if b != seen.0 {
                *seen = (b, now, true);
            } else if now.duration_since(seen.1) >= self.limits.stall {
                stuck.push(format!(
                    "worker {i} heartbeat stuck at {b} for {} s",
                    now.duration_since(seen.1).as_secs()
                ));
            } else if !seen.2 {
                waiting = true;
            }
        }
        if !stuck.is_empty() {
            return Some(stuck.join(", "));
        }
        waiting.then(|| "worker heartbeats not seen moving yet".into())
    }

    /// Take one probe of the running gateway into account.
    pub fn observe(&mut self, now: Instant, p: &Probe) -> HealthChange {
        let problem = self.problem(now, p);
        match (self.phase.clone(), problem) {
            (Phase::Down | Phase::Killing(_), _) => HealthChange::Same,
            (Phase::Healthy, None) => HealthChange::Same,
            (_, None) => {
                self.phase = Phase::Healthy;
                HealthChange::Up
            }
            (Phase::Starting(t), Some(why)) => {
                if now.duration_since(t) >= self.limits.start {
                    self.phase = Phase::Killing(now);
                    HealthChange::Restart(format!(
                        "not healthy {} s after it started ({why})",
                        self.limits.start.as_secs()
                    ))
                } else {
                    HealthChange::Same
                }
            }
            (Phase::Healthy, Some(why)) => {
                self.phase = Phase::Unhealthy {
                    since: now,
                    why: why.clone(),
                };
                HealthChange::Down(why)
            }
            (Phase::Unhealthy { since, .. }, Some(why)) => {
                if now.duration_since(since) >= self.limits.grace {
                    self.phase = Phase::Killing(now);
                    HealthChange::Restart(format!(
                        "{why}; unhealthy for {} s",
                        now.duration_since(since).as_secs()
                    ))
                } else {
                    self.phase = Phase::Unhealthy { since, why };
                    HealthChange::Same
                }
            }
        }
    }

    /// Whether init may feed the hardware watchdog now.
    pub fn feed(&self, now: Instant) -> bool {
        match &self.phase {
            Phase::Down | Phase::Healthy => true,
            Phase::Starting(t) => now.duration_since(*t) < self.limits.start + self.limits.kill,
            Phase::Unhealthy { since, .. } => {
                now.duration_since(*since) < self.limits.grace + self.limits.kill
            }
            Phase::Killing(t) => now.duration_since(*t) < self.limits.kill,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(beats: &[u64]) -> Probe {
        Probe {
            uapi: Ok(()),
            beats: Ok(beats.to_vec()),
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn healthy_then_stuck_worker_restarts_after_grace() {
        let t0 = Instant::now();
        let mut h = GatewayHealth::new(LIMITS);
        assert!(h.feed(t0));
        h.started(t0);
        // Healthy only once every worker was seen moving.
        assert_eq!(h.observe(t0, &ok(&[0, 0])), HealthChange::Same);
        assert_eq!(h.observe(t0, &ok(&[1, 0])), HealthChange::Same);
        assert_eq!(h.observe(t0, &ok(&[1, 1])), HealthChange::Up);
        assert_eq!(h.observe(t0 + s(1), &ok(&[5, 9])), HealthChange::Same);
        // Worker 1 stops; worker 0 goes on. Stuck only once `stall` has passed.
        assert_eq!(h.observe(t0 + s(3), &ok(&[9, 9])), HealthChange::Same);
        let HealthChange::Down(why) = h.observe(t0 + s(4), &ok(&[12, 9])) else {
            panic!("not seen stuck")
        };
        assert!(why.contains("worker 1 heartbeat stuck at 9"), "{why}");
        assert!(h.feed(t0 + s(5)));
        assert_eq!(h.observe(t0 + s(8), &ok(&[20, 9])), HealthChange::Same);
        let HealthChange::Restart(why) = h.observe(t0 + s(9), &ok(&[25, 9])) else {
            panic!("no restart")
        };
        assert!(why.contains("unhealthy for 5 s"), "{why}");
        // Killed: fed while the kill takes effect, not after.
        assert!(h.feed(t0 + s(18)));
        assert!(!h.feed(t0 + s(19)));
        assert_eq!(h.observe(t0 + s(19), &ok(&[30, 31])), HealthChange::Same);
        h.exited();
        assert!(h.feed(t0 + s(100)));
    }

    #[test]
    fn recovering_within_grace_is_no_restart() {
        let t0 = Instant::now();
        let mut h = GatewayHealth::new(LIMITS);
        h.started(t0);
        assert_eq!(h.observe(t0, &ok(&[0])), HealthChange::Same);
        assert_eq!(h.observe(t0, &ok(&[1])), HealthChange::Up);
        let down = Probe {
            uapi: Err("timed out".into()),
            beats: Ok(vec![2]),
        };
        let HealthChange::Down(why) = h.observe(t0 + s(1), &down) else {
            panic!()
        };
        assert!(why.contains("UAPI does not answer: timed out"), "{why}");
        assert_eq!(h.observe(t0 + s(4), &down), HealthChange::Same);
        assert_eq!(h.observe(t0 + s(5), &ok(&[3])), HealthChange::Up);
        assert!(h.is_healthy());
        // A status file without heartbeats is unhealthy too.
        let none = Probe {
            uapi: Ok(()),
            beats: Err("no heartbeat line".into()),
        };
        assert_eq!(
            h.observe(t0 + s(6), &none),
            HealthChange::Down("no heartbeat line".into())
        );
        assert_eq!(
            h.observe(t0 + s(11), &none),
            HealthChange::Restart("no heartbeat line; unhealthy for 5 s".into())
        );
    }

    #[test]
    fn never_healthy_after_start_is_restarted_and_then_starves_the_watchdog() {
        let t0 = Instant::now();
        let mut h = GatewayHealth::new(LIMITS);
        h.started(t0);
        let down = Probe {
            uapi: Err("connection refused".into()),
            beats: Err("no status file".into()),
        };
        assert_eq!(h.observe(t0 + s(30), &down), HealthChange::Same);
        assert!(h.feed(t0 + s(30)));
        let HealthChange::Restart(why) = h.observe(t0 + s(60), &down) else {
            panic!()
        };
        assert!(
            why.starts_with("not healthy 60 s after it started"),
            "{why}"
        );
        assert!(h.feed(t0 + s(65)));
        // The kill never takes effect (init wedged on it, or the process cannot die).
        assert!(!h.feed(t0 + s(70)));
        // A new start with a different number of workers starts its clocks afresh.
        h.exited();
        h.started(t0 + s(80));
        assert_eq!(h.observe(t0 + s(81), &ok(&[3, 3, 3])), HealthChange::Same);
        assert_eq!(h.observe(t0 + s(81), &ok(&[4, 4, 4])), HealthChange::Up);
        assert_eq!(h.observe(t0 + s(83), &ok(&[4, 5, 6])), HealthChange::Same);
        assert_eq!(h.observe(t0 + s(84), &ok(&[5, 6, 7])), HealthChange::Same);
    }
}
