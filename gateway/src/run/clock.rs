//! The clock's files in the run directory: init's boot-floor record ([`BOOT_RECORD`]),
//! the NTP client's state ([`STATE`]) and this boot's stamps ([`STAMPS`]), written by init
//! and `riceguard ntp` and read by both, the console and `riceguard status` (the saved
//! time on perm is `perm::clock`'s). The formats themselves are `core::clock`'s
//! (`BootRecord`, `NtpState`, `Stamps`, `SavedTime`, each with its text form and reader);
//! this file names the files, reads and writes them, and makes the `clock:` and `ntp:`
//! lines shown from them.

use std::path::Path;

use crate::core::clock::{self as policy, BootRecord, NtpState};
use crate::sys::kernel_clocks;

use super::run_dir;

/// Where the state files are (`RG_RUN_DIR` or `--run-dir` override it).
pub use crate::run::RUN_DIR;
/// The client's state, in [`RUN_DIR`].
pub const STATE: &str = "clock";
/// Init's boot-floor record, in [`RUN_DIR`].
pub const BOOT_RECORD: &str = "clock.boot";
/// This boot's stamps against its clock ([`policy::Stamps`]), in [`RUN_DIR`]: written by
/// the client, read by every save.
pub const STAMPS: &str = "clock.stamps";

/// [`STAMPS`] in `dir` (nothing known when it is missing or unreadable).
pub fn stamps_in(dir: &Path) -> policy::Stamps {
    std::fs::read_to_string(dir.join(STAMPS))
        .map(|t| policy::Stamps::from_text(&t))
        .unwrap_or_default()
}

/// Write [`STAMPS`] in `dir` (the NTP client; a failure is logged).
pub fn write_stamps(dir: &Path, st: policy::Stamps) {
    let p = dir.join(STAMPS);
    if let Err(e) = crate::durable::write(&p, st.to_text().as_bytes(), crate::durable::PUBLIC) {
        log::warn!("ntp: {}: {e}", p.display());
    }
}

/// The `clock:` line of `show status` and `riceguard status`, from init's record and the
/// client's state in the run directory.
pub fn clock_line() -> String {
    clock_line_in(&run_dir())
}

pub fn clock_line_in(dir: &Path) -> String {
    let boot = std::fs::read_to_string(dir.join(BOOT_RECORD))
        .ok()
        .and_then(|t| BootRecord::from_text(&t));
    let ntp = std::fs::read_to_string(dir.join(STATE))
        .ok()
        .map(|t| NtpState::from_text(&t));
    policy::status_line(
        kernel_clocks::realtime(),
        kernel_clocks::boottime(),
        boot.as_ref(),
        ntp.as_ref(),
    )
}

/// The client's notes (per server, refusals), for `show status` after the clock line.
pub fn note_lines() -> Vec<String> {
    std::fs::read_to_string(run_dir().join(STATE))
        .map(|t| {
            NtpState::from_text(&t)
                .notes
                .into_iter()
                .map(|n| format!("ntp: {n}"))
                .collect()
        })
        .unwrap_or_default()
}

/// Write the NTP client's [`STATE`] in `dir` (a failure is logged).
pub fn write_state(dir: &Path, state: &NtpState) {
    let p = dir.join(STATE);
    if let Err(e) = crate::durable::write(&p, state.to_text().as_bytes(), crate::durable::PUBLIC) {
        log::warn!("ntp: {}: {e}", p.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perm::clock::{read_saved, save_time};

    #[test]
    fn saved_time_round_trip_and_clock_line() {
        let d = crate::testutil::TempDir::new("ntp-saved");
        let p = d.0.join("clock");
        let t = save_time(&p, policy::SAVE_AHEAD, policy::Stamps::default()).unwrap();
        assert_eq!(
            read_saved(&p),
            Some(policy::SavedTime {
                floor: t,
                agreed: None
            })
        );
        let st = policy::Stamps {
            ahead: 5_000_000_000,
            agrees: true,
            settled: true,
        };
        let t = save_time(&p, policy::SAVE_AHEAD, st).unwrap();
        let back = read_saved(&p).unwrap();
        assert_eq!(back.floor, t);
        // The floor covers the stamps' lead and the save's.
        let (w, a) = back.agreed.unwrap();
        assert_eq!(a, 5_000_000_000);
        assert!(t >= w + 5 + policy::SAVE_AHEAD.as_secs() as i64 - 1);
        assert_eq!(stamps_in(&d.0), policy::Stamps::default());
        assert!(t > kernel_clocks::realtime().secs());
        // No boot record, no client: a host's clock.
        assert!(clock_line_in(&d.0).contains("(source: host clock"));
        let rec = BootRecord {
            source: policy::BootSource::Saved,
            wall: kernel_clocks::realtime(),
            boot: kernel_clocks::boottime(),
            back_to: None,
        };
        std::fs::write(d.0.join(BOOT_RECORD), rec.to_text()).unwrap();
        std::fs::write(d.0.join(STATE), "servers 0\n").unwrap();
        assert!(clock_line_in(&d.0)
            .ends_with("(source: saved, no NTP server: set gateway ntp or get one from DHCP)"));
    }
}
