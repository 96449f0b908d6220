//! What the daemon tells the event log (`perm::event_log`, given by `--event-log DIR`):
//! peers' sessions established and expired, endpoints changed, two devices on one key,
//! endpoint names resolved anew. Each is also a log line (init relays those to syslog).
//!
//! **Flash wear**: events are kept in RAM and appended with one fsync at most every
//! [`FLUSH_EVERY`] (as the clock saver does), and when the daemon stops; a power cut loses
//! at most the last [`FLUSH_EVERY`] of them. At most [`MAX_BATCH`] wait; more are counted
//! and the count recorded.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::core::device::{short, Device, PeerEvent, PeerEventKind};
use crate::core::event::Event;
use crate::core::key::Key;

/// How often the batch is written out (one append, one fsync).
pub const FLUSH_EVERY: Duration = Duration::from_secs(600);
/// Events kept between two flushes; beyond it they are counted only.
pub const MAX_BATCH: usize = 1000;
/// The source the daemon's records carry.
const SOURCE: &str = "gateway";

/// The daemon's events waiting to be written.
pub struct EventBatch {
    dir: Option<PathBuf>,
    inner: Mutex<Pending>,
}

struct Pending {
    events: Vec<Event>,
    dropped: u64,
    last_flush: Instant,
}

impl EventBatch {
    /// `dir`: the perm directory whose event log gets the records (none: log lines only).
    pub fn new(dir: Option<PathBuf>) -> EventBatch {
        EventBatch {
            dir,
            inner: Mutex::new(Pending {
                events: Vec::new(),
                dropped: 0,
                last_flush: Instant::now(),
            }),
        }
    }

    /// Log `text` and keep it for the event log.
    pub fn say(&self, text: &str) {
        log::info!("{text}");
        if self.dir.is_none() {
            return;
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if p.events.len() >= MAX_BATCH {
            p.dropped += 1;
        } else {
            p.events.push(Event::new(unix, SOURCE, text));
        }
    }

    /// The device's peer events since the last call, said with the peers' names.
    pub fn take_from(&self, device: &Device) {
        let (events, dropped) = device.take_events();
        if events.is_empty() && dropped == 0 {
            return;
        }
        let cfg = device.config();
        let name = |k: &Key| peer_label(&cfg, k);
        for e in &events {
            if let Some(t) = describe(e, &name(&e.key)) {
                self.say(&t);
            }
        }
        if dropped > 0 {
            self.say(&format!(
                "{dropped} peer event(s) not recorded (more than {} within a tick)",
                crate::core::device::MAX_PENDING_EVENTS
            ));
        }
    }

    /// Write the batch out when [`FLUSH_EVERY`] has passed since the last time.
    pub fn tick(&self, now: Instant) {
        let due = {
            let p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            now.duration_since(p.last_flush) >= FLUSH_EVERY
        };
        if due {
            self.flush(now);
        }
    }

    /// Write the batch out now (one append, one fsync): at a flush time and at shutdown.
    pub fn flush(&self, now: Instant) {
        let Some(dir) = &self.dir else {
            return;
        };
        let (mut events, dropped) = {
            let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            p.last_flush = now;
            (
                std::mem::take(&mut p.events),
                std::mem::take(&mut p.dropped),
            )
        };
        if dropped > 0 {
            let unix = events.last().map_or(0, |e| e.unix);
            events.push(Event::new(
                unix,
                SOURCE,
                &format!(
                    "{dropped} event(s) not recorded: more than {MAX_BATCH} within {} minutes",
                    FLUSH_EVERY.as_secs() / 60
                ),
            ));
        }
        if let Err(e) = crate::perm::event_log::append(dir, &events, true) {
            log::warn!("event log: {}: {e}", dir.display());
        }
    }

    /// Events waiting (tests).
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .events
            .len()
    }
}

/// `peer phone` (its `Name`), else `peer AbCdEfGh` (the key's start): the form `show log
/// peer NAME` finds.
pub fn peer_label(cfg: &crate::core::config::Config, k: &Key) -> String {
    match cfg
        .peers
        .iter()
        .find(|p| p.public_key == *k)
        .and_then(|p| p.name.as_deref())
    {
        Some(n) => format!("peer {n}"),
        None => format!("peer {}", short(k)),
    }
}

/// One event's sentence; none for the first endpoint a peer is seen at (a log line
/// only: every session start has one).
fn describe(e: &PeerEvent, who: &str) -> Option<String> {
    Some(match &e.kind {
        PeerEventKind::SessionEstablished => format!("{who}: session established"),
        PeerEventKind::SessionExpired => {
            format!("{who}: session expired (no handshake for 9 minutes)")
        }
        PeerEventKind::EndpointChanged { old: Some(old), new } if !old.is_tcp() && new.is_tcp() => {
            format!("{who}: TCP fallback on (UDP handshakes unanswered): {old} -> {new}")
        }
        PeerEventKind::EndpointChanged { old: Some(old), new } if old.is_tcp() && !new.is_tcp() => {
            format!("{who}: TCP fallback off, back on UDP: {old} -> {new}")
        }
        PeerEventKind::EndpointChanged { old: Some(old), new } => {
            format!("{who}: endpoint changed {old} -> {new}")
        }
        PeerEventKind::EndpointChanged { old: None, new } => {
            log::info!("{who}: endpoint {new}");
            return None;
        }
        PeerEventKind::SharedKey { a, b } => format!(
            "{who} is used from {} and {}: two devices share its key (each breaks the other's session; give each device a client of its own)",
            a.ip(),
            b.ip()
        ),
    })
}

/// Firewall drop bursts for the event log: the drop counters looked at every minute; a
/// minute with at least [`BURST_PACKETS`] drops is a burst, said at most once per
/// [`BURST_EVERY`] (a sustained flood is one record every 10 minutes, its total since the
/// last record, by cause).
pub struct DropBursts {
    last: Vec<(String, u64)>,
    /// Drops by cause since the last record, while a burst is under way.
    pending: Vec<(String, u64)>,
    since: Option<Instant>,
    last_said: Option<Instant>,
}

/// Drops in one minute that make a burst.
pub const BURST_PACKETS: u64 = 1000;
/// At most one burst record this often.
pub const BURST_EVERY: Duration = Duration::from_secs(600);

impl DropBursts {
    pub fn new() -> DropBursts {
        DropBursts {
            last: Vec::new(),
            pending: Vec::new(),
            since: None,
            last_said: None,
        }
    }

    /// The counters now (cause, packets; from the firewall's table); a sentence when a
    /// burst is due to be recorded.
    pub fn observe(&mut self, now: Instant, counters: &[(String, u64)]) -> Option<String> {
        let first = self.last.is_empty();
        let delta: Vec<(String, u64)> = counters
            .iter()
            .map(|(n, p)| {
                let before = self.last.iter().find(|(m, _)| m == n).map_or(*p, |x| x.1);
                // A table replaced from scratch restarts its counters: no negative drops.
                (n.clone(), p.saturating_sub(before))
            })
            .collect();
        self.last = counters.to_vec();
        if first {
            return None;
        }
        let total: u64 = delta.iter().map(|d| d.1).sum();
        if total >= BURST_PACKETS || (self.since.is_some() && total > 0) {
            self.since.get_or_insert(now);
            for (n, p) in delta {
                match self.pending.iter_mut().find(|(m, _)| *m == n) {
                    Some(x) => x.1 += p,
                    None => self.pending.push((n, p)),
                }
            }
        }
        let since = self.since?;
        if self
            .last_said
            .is_some_and(|t| now.duration_since(t) < BURST_EVERY)
        {
            return None;
        }
        self.last_said = Some(now);
        self.since = None;
        let mut causes: Vec<(String, u64)> = std::mem::take(&mut self.pending)
            .into_iter()
            .filter(|c| c.1 > 0)
            .collect();
        causes.sort_by_key(|c| std::cmp::Reverse(c.1));
        let sum: u64 = causes.iter().map(|c| c.1).sum();
        let by: Vec<String> = causes.iter().map(|(n, p)| format!("{n} {p}")).collect();
        Some(format!(
            "firewall drop burst: {sum} packets dropped in {} s ({})",
            now.duration_since(since).as_secs().max(60),
            by.join(", ")
        ))
    }
}

impl Default for DropBursts {
    fn default() -> Self {
        DropBursts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::device::PeerAddr;

    fn ev(kind: PeerEventKind) -> PeerEvent {
        PeerEvent {
            key: Key([7; 32]),
            at: Duration::ZERO,
            kind,
        }
    }

    #[test]
    fn sentences_name_the_peer_and_never_a_key() {
        let a = PeerAddr::Udp("203.0.113.5:51820".parse().unwrap());
        let b = PeerAddr::Udp("198.51.100.9:4500".parse().unwrap());
        assert_eq!(
            describe(&ev(PeerEventKind::SessionEstablished), "peer phone").unwrap(),
            "peer phone: session established"
        );
        assert_eq!(
            describe(
                &ev(PeerEventKind::EndpointChanged {
                    old: Some(a),
                    new: b
                }),
                "peer phone"
            )
            .unwrap(),
            "peer phone: endpoint changed 203.0.113.5:51820 -> 198.51.100.9:4500"
        );
        assert!(describe(
            &ev(PeerEventKind::EndpointChanged { old: None, new: b }),
            "p"
        )
        .is_none());
        let s = describe(&ev(PeerEventKind::SharedKey { a, b }), "peer phone").unwrap();
        assert!(
            s.starts_with("peer phone is used from 203.0.113.5 and 198.51.100.9: two devices"),
            "{s}"
        );
    }

    /// Kept in RAM until a flush (none written before), bounded, the overflow counted in
    /// the log; nothing kept without a directory.
    #[test]
    fn batched_bounded_and_flushed_once() {
        let dir = crate::testutil::TempDir::new("daemon-events");
        let b = EventBatch::new(Some(dir.0.clone()));
        let t0 = Instant::now();
        for i in 0..MAX_BATCH + 5 {
            b.say(&format!("peer p{i}: session established"));
        }
        assert_eq!(b.pending(), MAX_BATCH);
        b.tick(t0);
        assert!(
            crate::perm::event_log::read(&dir.0).0.is_empty(),
            "not yet due"
        );
        b.tick(t0 + FLUSH_EVERY + Duration::from_secs(1));
        let (got, skipped) = crate::perm::event_log::read(&dir.0);
        assert_eq!((got.len(), skipped), (MAX_BATCH + 1, 0));
        assert_eq!(got[0].source, "gateway");
        assert!(
            got[MAX_BATCH].text.starts_with("5 event(s) not recorded"),
            "{:?}",
            got[MAX_BATCH]
        );
        assert_eq!(b.pending(), 0);
        b.flush(t0);
        assert_eq!(
            crate::perm::event_log::read(&dir.0).0.len(),
            MAX_BATCH + 1,
            "nothing twice"
        );
        let none = EventBatch::new(None);
        none.say("peer x: session established");
        assert_eq!(none.pending(), 0);
    }

    /// A quiet minute is nothing; a minute of 5000 uplink drops is a burst, said at once;
    /// the flood going on is said again, as one total, only after ten minutes.
    #[test]
    fn drop_bursts_are_summarised_and_rate_limited() {
        let t0 = Instant::now();
        let min = |m: u64| t0 + Duration::from_secs(60 * m);
        let c = |up: u64, other: u64| {
            vec![
                ("uplink-in".to_string(), up),
                ("invalid".to_string(), other),
            ]
        };
        let mut b = DropBursts::new();
        assert_eq!(
            b.observe(min(0), &c(100, 5)),
            None,
            "the first look is the baseline"
        );
        assert_eq!(b.observe(min(1), &c(300, 6)), None, "201 drops: no burst");
        assert_eq!(
            b.observe(min(2), &c(5300, 16)).as_deref(),
            Some("firewall drop burst: 5010 packets dropped in 60 s (uplink-in 5000, invalid 10)")
        );
        let mut said = Vec::new();
        for m in 3..13 {
            said.extend(b.observe(min(m), &c(5300 + (m - 2) * 2000, 16)));
        }
        assert_eq!(
            said,
            vec![
                "firewall drop burst: 20000 packets dropped in 540 s (uplink-in 20000)".to_string()
            ],
            "one record for the ten minutes after"
        );
        assert_eq!(
            b.observe(min(13), &c(10, 0)),
            None,
            "a replaced table restarts at zero"
        );
    }
}
