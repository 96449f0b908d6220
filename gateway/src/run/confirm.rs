//! The pending commit-confirm record on perm, written by a console and read by every
//! console and by init (which restarts a console stuck past the deadline):
//! [`CONFIRM`] holds the unix deadline (its presence alone says a confirm is pending),
//! [`CONFIRM_BOOT`] the same deadline on this boot's `CLOCK_BOOTTIME`, so a clock step
//! moves nothing. One writer and one parser of each.

/// The pending commit-confirm's unix deadline, in the configuration directory.
pub const CONFIRM: &str = "commit-confirm";
/// Its deadline on one boot's clock ([`ConfirmBoot`]), beside [`CONFIRM`].
pub const CONFIRM_BOOT: &str = "commit-confirm.boot";

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
