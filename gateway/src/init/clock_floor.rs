//! The clock's floor, init's part of timekeeping (rules and figures: `core::clock`; the
//! syscalls: `sys::kernel_clocks`): before the firewall, the uplink and the gateway
//! start, the clock is set to the latest of the RTC, `/perm/clock` and the image's build
//! time; then the time is saved ahead of the clock every `SAVE_EVERY` from the
//! supervision loop, and at reboot/poweroff, so the next boot's floor is past every
//! timestamp this one sent.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::core::clock::{self as policy, BootRecord, UnixTime};
use crate::durable;
/// Written by the image builder: the image's `SOURCE_DATE_EPOCH`.
use crate::image_paths::BUILD_TIME as BUILD_TIME_FILE;
use crate::perm::clock::{read_saved, save_time, saved_path};
use crate::run::clock as files;
use crate::sys::kernel_clocks;

/// The image's build time: [`BUILD_TIME_FILE`], else the binary's own modification time
/// (the image builder sets every file's to `SOURCE_DATE_EPOCH`; a host build has its
/// build's), else none.
pub(super) fn build_time() -> Option<i64> {
    if let Some(t) = std::fs::read_to_string(BUILD_TIME_FILE)
        .ok()
        .and_then(|t| policy::parse_time_text(&t))
    {
        return Some(t);
    }
    std::fs::metadata("/proc/self/exe")
        .ok()
        .map(|m| m.mtime())
        .filter(|&t| t > 0)
}

/// Set the clock to the boot floor if it is behind, say so in one line, record the
/// decision for status readers and the NTP client, and save the time at once (the floor
/// may be the RTC, ahead of what perm held). True when the first NTP answer may set the
/// clock back (after a power cut of a box that agreed with NTP: `core::clock`).
pub(super) fn set_at_boot(perm_ok: bool) -> bool {
    let rtc = match kernel_clocks::rtc_read(kernel_clocks::RTC) {
        Ok(t) => t,
        Err(e) => {
            say!("clock: no RTC ({}: {e})", kernel_clocks::RTC);
            None
        }
    };
    let saved = if perm_ok {
        read_saved(&saved_path())
    } else {
        None
    };
    let now = kernel_clocks::realtime();
    let build = build_time();
    let d = policy::boot_decision(now.secs(), rtc, saved.map(|s| s.floor), build);
    match d.set_to {
        Some(t) => match kernel_clocks::set_realtime(UnixTime::from_secs(t)) {
            Ok(()) => say!(
                "clock: set to {} (source: {})",
                UnixTime::from_secs(t),
                d.source.name()
            ),
            Err(e) => say!(
                "clock: setting it to {} ({}) failed: {e}",
                UnixTime::from_secs(t),
                d.source.name()
            ),
        },
        None => say!("clock: {} from the RTC", kernel_clocks::realtime()),
    }
    let rec = BootRecord {
        source: d.source,
        wall: kernel_clocks::realtime(),
        boot: kernel_clocks::boottime(),
        back_to: policy::back_floor(d.source, saved, build),
    };
    if let Some((b, _)) = rec.back_to {
        say!("clock: the last boot agreed with NTP: its first answer may set the clock back to {b} at the earliest");
    }
    let path = Path::new(files::RUN_DIR).join(files::BOOT_RECORD);
    if let Err(e) = durable::write(&path, rec.to_text().as_bytes(), durable::PUBLIC) {
        say!("clock: {}: {e}", path.display());
    }
    if perm_ok {
        save(policy::SAVE_AHEAD);
    }
    rec.back_to.is_some()
}

/// Whether `riceguard ntp` has acted on (or refused) its first answer of this boot.
pub(super) fn first_answer_settled() -> bool {
    files::stamps_in(Path::new(files::RUN_DIR)).settled
}

fn save(ahead: Duration) {
    let stamps = files::stamps_in(Path::new(files::RUN_DIR));
    if let Err(e) = save_time(&saved_path(), ahead, stamps) {
        say!("clock: saving the time to {}: {e}", saved_path().display());
    }
}

/// Saves the time ahead of the clock every `SAVE_EVERY` (boot time, so a step of the
/// clock does not bunch or skip saves).
pub(super) struct Saver {
    on: bool,
    next: Instant,
}

impl Saver {
    pub(super) fn new(perm_ok: bool) -> Saver {
        Saver {
            on: perm_ok,
            next: Instant::now() + policy::SAVE_EVERY,
        }
    }

    pub(super) fn tick(&mut self, now: Instant) {
        if self.on && now >= self.next {
            self.next = now + policy::SAVE_EVERY;
            save(policy::SAVE_AHEAD);
        }
    }
}

/// At reboot/poweroff, after the services stopped (the gateway sends no more
/// handshakes): the time plus a little.
pub(super) fn save_at_halt() {
    // Perm mounted (or its tmpfs stand-in): its directory is there.
    if Path::new(crate::perm::DIR).exists() {
        save(policy::SAVE_AT_HALT);
    }
}
