//! The commit-confirm record and the notes around it, written by a console and read by
//! every console and by init (which restarts a console stuck past the deadline):
//! [`CONFIRM`] holds the unix deadline (its presence alone says a confirm is pending),
//! [`CONFIRM_BOOT`] the same deadline on this boot's `CLOCK_BOOTTIME`, so a clock step
//! moves nothing; [`CONFIRM_OWNER`] the console that made it, [`CONFIRM_SETTLED`] how
//! another console settled it, [`COMMITTED_BY`] which console saved the file as it is.
//! One writer and one parser of each. Older firmware reads [`CONFIRM`] as one number and
//! never looks at the others.

use std::net::IpAddr;
use std::path::Path;

use super::{io_err, StoreError};
use crate::durable::{self, SECRET};

/// The pending commit-confirm's unix deadline, in the configuration directory.
pub const CONFIRM: &str = "commit-confirm";
/// Its deadline on one boot's clock ([`ConfirmBoot`]), beside [`CONFIRM`].
pub const CONFIRM_BOOT: &str = "commit-confirm.boot";
/// The console a pending `commit-confirm` belongs to (its terminal's name), beside
/// [`CONFIRM`]; older firmware ignores it.
pub const CONFIRM_OWNER: &str = "commit-confirm.console";
/// How the last pending `commit-confirm` was settled from a console other than its
/// owner (`confirmed NAME UNIX` or `rolled-back NAME UNIX`), for the owner to say so.
pub const CONFIRM_SETTLED: &str = ".commit-confirm.settled";
/// Which console made the last commit: `NAME UNIX HASH` (HASH: of the saved file, so a
/// file changed since by hand is not blamed on a console).
pub const COMMITTED_BY: &str = ".committed-by";

/// [`CONFIRM`]'s text for the unix deadline `t`.
pub fn marker_text(t: u64) -> String {
    format!("{t}\n")
}

/// The unix deadline in [`CONFIRM`]'s text, if it reads.
pub fn parse_marker(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A commit-confirm deadline on one boot's `CLOCK_BOOTTIME` (whole seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmBoot {
    pub boot_id: String,
    pub deadline: u64,
}

impl ConfirmBoot {
    pub fn to_text(&self) -> String {
        format!("{} {}\n", self.boot_id, self.deadline)
    }
    pub fn parse(text: &str) -> Option<ConfirmBoot> {
        let (id, d) = text.trim().split_once(' ')?;
        (!id.is_empty() && id.len() <= 64).then_some(())?;
        Some(ConfirmBoot {
            boot_id: id.to_string(),
            deadline: d.trim().parse().ok()?,
        })
    }
}

/// Seconds left (negative: overdue) of a pending commit-confirm whose unix deadline is
/// `unix`: by boot time when `boot` is this boot's (`boot_id`, `now_boot`), so a clock
/// step changes nothing; else (another boot, or no record) by the wall clock.
pub fn confirm_left(
    unix: u64,
    boot: Option<&ConfirmBoot>,
    now_unix: u64,
    boot_id: Option<&str>,
    now_boot: u64,
) -> i64 {
    let diff =
        |a: u64, b: u64| (a as i128 - b as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    match (boot, boot_id) {
        (Some(b), Some(id)) if b.boot_id == id => diff(b.deadline, now_boot),
        _ => diff(unix, now_unix),
    }
}

/// The deadline (unix seconds) of a pending `commit-confirm` in `dir`, if one is recorded.
pub fn pending(dir: &Path) -> Option<u64> {
    parse_marker(&std::fs::read_to_string(dir.join(CONFIRM)).ok()?)
}

/// Record (or clear, with `None`) a pending `commit-confirm` deadline. Clearing
/// removes the unix-time marker first: it alone says a confirm is pending.
pub fn set_pending(dir: &Path, deadline_unix: Option<u64>) -> Result<(), StoreError> {
    let p = dir.join(CONFIRM);
    match deadline_unix {
        Some(t) => durable::write(&p, marker_text(t).as_bytes(), SECRET).map_err(io_err(&p)),
        // fsyncs the directory: after `confirm` and a power cut the rollback stays off.
        None => {
            durable::remove(&p).map_err(io_err(&p))?;
            let o = dir.join(CONFIRM_OWNER);
            let _ = durable::remove(&o);
            let b = dir.join(CONFIRM_BOOT);
            durable::remove(&b).map(|_| ()).map_err(io_err(&b))
        }
    }
}

/// The boot-time form of the pending deadline, if one was recorded.
pub fn pending_boot(dir: &Path) -> Option<ConfirmBoot> {
    ConfirmBoot::parse(&std::fs::read_to_string(dir.join(CONFIRM_BOOT)).ok()?)
}

/// Record the boot-time form beside [`set_pending`]'s.
pub fn set_pending_boot(dir: &Path, b: &ConfirmBoot) -> Result<(), StoreError> {
    let p = dir.join(CONFIRM_BOOT);
    durable::write(&p, b.to_text().as_bytes(), SECRET).map_err(io_err(&p))
}

/// The console a pending `commit-confirm` belongs to; `None` when not recorded (made
/// by firmware before consoles had names: it belongs to whichever console resumes it).
pub fn owner(dir: &Path) -> Option<String> {
    let t = std::fs::read_to_string(dir.join(CONFIRM_OWNER)).ok()?;
    console_name(t.trim())
}

/// Record the console a pending `commit-confirm` belongs to.
pub fn set_owner(dir: &Path, name: &str) -> Result<(), StoreError> {
    let p = dir.join(CONFIRM_OWNER);
    durable::write(&p, format!("{name}\n").as_bytes(), SECRET).map_err(io_err(&p))
}

/// Say how a pending `commit-confirm` was settled by a console that did not make it.
pub fn set_settled(dir: &Path, how: &str, by: &str, unix: u64) {
    let p = dir.join(CONFIRM_SETTLED);
    let _ = durable::write(&p, format!("{how} {by} {unix}\n").as_bytes(), SECRET);
}

/// `(how, by)` of the last settling by another console, if one is recorded.
pub fn settled(dir: &Path) -> Option<(String, String)> {
    let t = std::fs::read_to_string(dir.join(CONFIRM_SETTLED)).ok()?;
    let mut w = t.split_whitespace();
    let how = w
        .next()
        .filter(|h| *h == "confirmed" || *h == "rolled-back")?;
    Some((how.to_string(), console_name(w.next()?)?))
}

/// Record that console `name` (an SSH session's: from `source`) saved `text` at `unix`
/// (under the configuration's lock). The source is a fourth field, which readers before
/// it ignore.
pub fn record_commit(dir: &Path, name: &str, source: Option<IpAddr>, unix: u64, text: &str) {
    let p = dir.join(COMMITTED_BY);
    let from = source.map(|s| format!(" {s}")).unwrap_or_default();
    let line = format!("{name} {unix} {:016x}{from}\n", text_hash(text.as_bytes()));
    let _ = durable::write(&p, line.as_bytes(), SECRET);
}

/// Who saved a configuration file, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committer {
    /// The console's name (`ttyS0`, `ssh-17:alice`).
    pub name: String,
    pub unix: u64,
    /// An SSH session's source address.
    pub source: Option<IpAddr>,
}

/// The console that saved `saved` (the configuration file's bytes as they are now), and
/// when (unix), if the last record matches it (else it was changed since by something else).
pub fn committed_by(dir: &Path, saved: &[u8]) -> Option<Committer> {
    let t = std::fs::read_to_string(dir.join(COMMITTED_BY)).ok()?;
    let mut w = t.split_whitespace();
    let name = console_name(w.next()?)?;
    let unix: u64 = w.next()?.parse().ok()?;
    let hash = u64::from_str_radix(w.next()?, 16).ok()?;
    let source = w.next().and_then(|s| s.parse().ok());
    (text_hash(saved) == hash).then_some(Committer { name, unix, source })
}

/// A console's name as files record it: a terminal's name (`ttyS0`, `tty1`, `hvc0`) or a
/// script's; bounded, plain characters only (it is printed to other consoles).
pub fn console_name(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.:".contains(&b));
    ok.then(|| s.to_string())
}

/// FNV-1a: tells whether the file is still the one a console saved (not a security
/// check: anything that can write the file can write the record too).
fn text_hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_input_is_none() {
        for t in [0, 1234, u64::MAX] {
            assert_eq!(parse_marker(&marker_text(t)), Some(t));
        }
        let b = ConfirmBoot {
            boot_id: "0f3e-id".into(),
            deadline: 300,
        };
        assert_eq!(b.to_text(), "0f3e-id 300\n");
        assert_eq!(ConfirmBoot::parse(&b.to_text()), Some(b));
        for bad in ["", " ", "x", "-1", "1 2", "18446744073709551616", "\u{0}"] {
            assert_eq!(parse_marker(bad), None, "{bad:?}");
        }
        let long = format!("{} 5", "i".repeat(65));
        for bad in ["", "id", " 5", "id x", "id -1", long.as_str()] {
            assert_eq!(ConfirmBoot::parse(bad), None, "{bad:?}");
        }
        // By boot time on this boot, by the wall clock otherwise.
        let r = ConfirmBoot {
            boot_id: "b".into(),
            deadline: 100,
        };
        assert_eq!(confirm_left(1000, Some(&r), 990, Some("b"), 40), 60);
        assert_eq!(confirm_left(1000, Some(&r), 990, Some("c"), 40), 10);
        assert_eq!(confirm_left(0, None, u64::MAX, None, 0), i64::MIN);
    }
}
