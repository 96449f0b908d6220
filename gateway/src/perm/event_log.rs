//! The event log on perm: [`EVENTS`] and the older half [`EVENTS_OLD`], records as
//! `core::event` writes them (one line each, checksummed), mode 0600 in `log/` — what
//! `show log` and `riceguard log` list after a reboot or a power cut.
//!
//! - **Bounded**: when [`EVENTS`] reaches [`HALF`] bytes it becomes [`EVENTS_OLD`] (the one
//!   before is dropped) and a new one starts: at most 2 × [`HALF`] = 1 MiB on flash.
//! - **Several writers** (init, the consoles, the updater): each append is one `write` to
//!   a file opened `O_APPEND`, so records never interleave; the rotation is done under
//!   `flock(log/.events.lock)`, and every append takes the same lock shared.
//! - **Durable**: commit, rollback, update and boot events are fsynced as they are
//!   written ([`append`] with `sync`); a record torn by a power cut is skipped by the
//!   reader (`core::event::parse_all`), never the log.

use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::core::event::{self, Event};

/// The current half of the event log, under perm.
pub const EVENTS: &str = "log/events";
/// The older half.
pub const EVENTS_OLD: &str = "log/events.1";
/// Taken (shared to append, exclusive to rotate) by every writer.
const LOCK: &str = "log/.events.lock";
/// Size at which the current half is rotated: two halves, at most 1 MiB on flash.
pub const HALF: u64 = 512 * 1024;

/// Append `events` to `dir`'s log in one write; `sync`: fsync before returning (the
/// events an operator must find after a power cut). Rotates first when the current half is
/// full.
pub fn append(dir: &Path, events: &[Event], sync: bool) -> io::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let log = dir.join(EVENTS);
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(LOCK))?;
    let full = std::fs::metadata(&log)
        .map(|m| m.len() >= HALF)
        .unwrap_or(false);
    let _held = if full {
        let l = Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
        // Another writer may have rotated it meanwhile.
        if std::fs::metadata(&log)
            .map(|m| m.len() >= HALF)
            .unwrap_or(false)
        {
            std::fs::rename(&log, dir.join(EVENTS_OLD))?;
            if let Some(parent) = log.parent() {
                crate::durable::sync_dir(parent)?;
            }
        }
        l
    } else {
        Flock::lock(lock, FlockArg::LockShared).map_err(|(_, e)| io::Error::from(e))?
    };
    let mut text: String = events.iter().map(Event::record).collect();
    // A record torn by a power cut has no newline: end its line first, so it costs
    // itself only, not the record written after it.
    if !ends_with_newline(&log) {
        text.insert(0, '\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)?;
    f.write_all(text.as_bytes())?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

/// Whether the file is empty, missing, or ends with a newline.
fn ends_with_newline(p: &Path) -> bool {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut f) = std::fs::File::open(p) else {
        return true;
    };
    let mut last = [b'\n'];
    if f.seek(SeekFrom::End(-1)).is_ok() {
        let _ = f.read_exact(&mut last);
    }
    last[0] == b'\n'
}

/// Say one event now (fsynced), from `source`, at the clock's time; a failure is only
/// logged: the event log must never stop what it records.
pub fn say(dir: &Path, source: &str, text: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    say_at(dir, now, source, text);
}

/// [`say`] at `unix` (a console's clock).
pub fn say_at(dir: &Path, unix: u64, source: &str, text: &str) {
    if let Err(e) = append(dir, &[Event::new(unix, source, text)], true) {
        log::warn!("event log: {}: {e}", dir.join(EVENTS).display());
    }
}

/// Every whole record, oldest first, and how many lines were skipped (torn or garbled).
/// Reads at most 2 × [`HALF`] per file (a file grown past that by hand is read in part).
pub fn read(dir: &Path) -> (Vec<Event>, usize) {
    let mut all = Vec::new();
    let mut skipped = 0;
    for name in [EVENTS_OLD, EVENTS] {
        let Ok(bytes) = read_bounded(&dir.join(name), 2 * HALF) else {
            continue;
        };
        let (ev, s) = event::parse_all(&bytes);
        all.extend(ev);
        skipped += s;
    }
    (all, skipped)
}

fn read_bounded(p: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut b = Vec::new();
    std::fs::File::open(p)?.take(max).read_to_end(&mut b)?;
    Ok(b)
}

/// The last `n` events (of those about peer `peer`, when given: its name as a word of
/// the text), as lines: `2026-12-04T04:06:10Z console:ttyS0 commit: ...`. Says how
/// many torn records were skipped.
pub fn show(dir: &Path, n: usize, peer: Option<&str>) -> Vec<String> {
    let (ev, skipped) = read(dir);
    let want = |e: &&Event| {
        peer.is_none_or(|p| {
            let needle = format!("peer {p}");
            e.text.match_indices(&needle).any(|(i, _)| {
                !e.text[i + needle.len()..]
                    .starts_with(|c: char| c.is_alphanumeric() || c == '-' || c == '_')
            })
        })
    };
    let chosen: Vec<&Event> = ev.iter().filter(want).collect();
    let from = chosen.len().saturating_sub(n);
    let mut out: Vec<String> = chosen[from..]
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                crate::core::clock::UnixTime::from_secs(i64::try_from(e.unix).unwrap_or(i64::MAX)),
                e.source,
                e.text
            )
        })
        .collect();
    if out.is_empty() {
        out.push("no events recorded yet".into());
    }
    if skipped > 0 {
        out.push(format!(
            "({skipped} torn or unreadable record(s) skipped: a power cut during a write, or a bad block)"
        ));
    }
    out
}

/// What init records when it stops the box on purpose (the text starts so).
pub const SHUTDOWN: &str = "shutdown:";

/// How the boot before this one ended, read from the log before this boot's record is
/// written: `clean (reboot)` when init's last record is its shutdown; else, when there was
/// a boot before, `not recorded: a power cut, a crash or a watchdog reset`. None on the
/// first boot (an empty log).
pub fn previous_shutdown(dir: &Path) -> Option<String> {
    let (ev, _) = read(dir);
    let last_init = ev.iter().rev().find(|e| e.source == "init")?;
    Some(match last_init.text.strip_prefix(SHUTDOWN) {
        Some(how) => format!("clean ({})", how.trim()),
        None => "not recorded: a power cut, a crash or a watchdog reset".into(),
    })
}

/// A process's rare events (DHCP bound or lost, a clock step), written as they happen with
/// an fsync, at most [`RARE_PER_HOUR`] an hour: beyond that they are only logged, and the
/// count is recorded with the next one written — a flapping uplink cannot wear the flash.
pub struct Rare {
    dir: Option<std::path::PathBuf>,
    source: &'static str,
    /// Boot-clock seconds of the writes in the last hour.
    written: std::collections::VecDeque<u64>,
    held_back: u64,
}

/// Immediate writes one process makes in an hour at most.
pub const RARE_PER_HOUR: usize = 6;

impl Rare {
    /// Events of `source` into `dir`'s log (none: log lines only).
    pub fn new(dir: Option<std::path::PathBuf>, source: &'static str) -> Rare {
        Rare {
            dir,
            source,
            written: std::collections::VecDeque::new(),
            held_back: 0,
        }
    }

    /// Record `text` now, unless this hour's writes are used up (`now`: a monotonic
    /// clock's seconds); the log line is the caller's.
    pub fn say(&mut self, now: u64, text: &str) {
        let Some(dir) = &self.dir else {
            return;
        };
        while self
            .written
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= 3600)
        {
            self.written.pop_front();
        }
        if self.written.len() >= RARE_PER_HOUR {
            self.held_back += 1;
            return;
        }
        self.written.push_back(now);
        let text = match std::mem::take(&mut self.held_back) {
            0 => text.to_string(),
            n => format!("{text} ({n} earlier event(s) of {} not recorded: more than {RARE_PER_HOUR} an hour)", self.source),
        };
        say(dir, self.source, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn append_read_and_a_torn_tail() {
        let d = TempDir::new("events");
        append(&d.0, &[Event::new(100, "init", "boot 1: slot a")], true).unwrap();
        append(
            &d.0,
            &[Event::new(
                200,
                "console:ttyS0",
                "commit: changed [Gateway] Ntp",
            )],
            false,
        )
        .unwrap();
        let mode = std::fs::metadata(d.0.join(EVENTS))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A power cut in the middle of the next record.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.0.join(EVENTS))
            .unwrap();
        f.write_all(b"300 init boot 2: sl").unwrap();
        let (ev, skipped) = read(&d.0);
        assert_eq!(ev.len(), 2);
        assert_eq!(skipped, 1);
        let shown = show(&d.0, 10, None);
        assert_eq!(shown[0], "1970-01-01T00:01:40Z init boot 1: slot a");
        assert!(shown[2].contains("1 torn or unreadable"), "{shown:?}");
        // The next append ends the torn line first: the torn record is the only loss.
        append(&d.0, &[Event::new(400, "init", "boot 3: slot a")], true).unwrap();
        let (ev, skipped) = read(&d.0);
        assert_eq!((ev.len(), skipped), (3, 1));
        assert_eq!(ev.last().unwrap().text, "boot 3: slot a");
    }

    #[test]
    fn bounded_by_two_halves() {
        let d = TempDir::new("events-rotate");
        let text = "x".repeat(300);
        let batch: Vec<Event> = (0..100).map(|i| Event::new(i, "test", &text)).collect();
        for _ in 0..50 {
            append(&d.0, &batch, false).unwrap();
        }
        let cur = std::fs::metadata(d.0.join(EVENTS)).unwrap().len();
        let old = std::fs::metadata(d.0.join(EVENTS_OLD)).unwrap().len();
        let one = batch.iter().map(|e| e.record().len() as u64).sum::<u64>();
        assert!(cur < HALF + one && old < HALF + one, "{cur} {old}");
        let (ev, skipped) = read(&d.0);
        assert_eq!(skipped, 0);
        assert!(
            ev.len() as u64 * 300 > HALF,
            "both halves read: {}",
            ev.len()
        );
    }

    #[test]
    fn show_picks_the_last_n_and_a_peer() {
        let d = TempDir::new("events-show");
        let ev = [
            Event::new(1, "daemon", "peer phone: session established"),
            Event::new(2, "daemon", "peer phone2: session established"),
            Event::new(3, "console:ttyS0", "commit: changed peer phone AllowedIPs"),
            Event::new(4, "init", "boot 2: slot a"),
        ];
        append(&d.0, &ev, true).unwrap();
        let s = show(&d.0, 2, None);
        assert_eq!(s.len(), 2);
        assert!(s[1].ends_with("boot 2: slot a"));
        let p = show(&d.0, 10, Some("phone"));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().all(|l| !l.contains("phone2")));
        assert_eq!(show(&d.0, 10, Some("nobody")), ["no events recorded yet"]);
    }

    /// Rare events: written at once, at most six an hour per process, the rest counted
    /// into the next record written.
    #[test]
    fn rare_events_are_bounded_per_hour() {
        let dir = TempDir::new("event-rare");
        let mut r = Rare::new(Some(dir.0.clone()), "dhcp");
        for i in 0..10 {
            r.say(100 + i, &format!("eth0: bound 192.0.2.{i}/24"));
        }
        assert_eq!(read(&dir.0).0.len(), RARE_PER_HOUR);
        r.say(100 + 3600, "eth0: lease expired");
        let (ev, _) = read(&dir.0);
        assert_eq!(ev.len(), RARE_PER_HOUR + 1);
        assert_eq!(
            ev.last().unwrap().text,
            "eth0: lease expired (4 earlier event(s) of dhcp not recorded: more than 6 an hour)"
        );
        let mut none = Rare::new(None, "ntp");
        none.say(1, "ntp: stepped");
    }

    /// The boot record says how the boot before ended: init's shutdown record last, or
    /// none after a boot (a power cut); nothing on the first boot.
    #[test]
    fn previous_shutdown_from_the_log() {
        let dir = TempDir::new("event-shutdown");
        assert_eq!(previous_shutdown(&dir.0), None);
        say_at(&dir.0, 1, "init", "boot 1: slot a");
        say_at(&dir.0, 2, "console:ttyS0", "commit: changed [Gateway] Ntp");
        assert_eq!(
            previous_shutdown(&dir.0).as_deref(),
            Some("not recorded: a power cut, a crash or a watchdog reset")
        );
        say_at(&dir.0, 3, "init", "shutdown: reboot");
        say_at(&dir.0, 4, "gateway", "peer phone: session expired");
        assert_eq!(previous_shutdown(&dir.0).as_deref(), Some("clean (reboot)"));
    }
}
