//! The saved time ([`SAVED`]): a floor for the clock at the next boot, written by init's
//! saver and `riceguard ntp` (under [`LOCK`] beside it), read by init at boot. The text
//! form is `core::clock::SavedTime`'s; this file names the file, reads and writes it.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::core::clock as policy;
use crate::sys::kernel_clocks;

/// The saved time, mode 0644.
pub const SAVED: &str = "clock";
/// flock()ed while [`SAVED`] is written (init's saver and the NTP client both write it).
pub const LOCK: &str = ".clock.lock";

/// [`SAVED`] on the appliance's perm.
pub fn saved_path() -> PathBuf {
    super::path(SAVED)
}

/// The saved time in `path`, if it reads.
pub fn read_saved(path: &Path) -> Option<policy::SavedTime> {
    policy::SavedTime::from_text(&std::fs::read_to_string(path).ok()?)
}

/// Save the clock plus this boot's stamp lead plus `ahead` to `path`, atomically
/// (`durable::write`) and under [`LOCK`] beside it. With `stamps.agrees` the clock and the
/// lead are recorded too.
pub fn save_time(path: &Path, ahead: Duration, stamps: policy::Stamps) -> io::Result<i64> {
    use nix::fcntl::{Flock, FlockArg};
    let lock = path.with_file_name(LOCK);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)?;
    let _held = Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
    let rec = policy::SavedTime::at(kernel_clocks::realtime(), stamps, ahead);
    write(path, &rec)?;
    Ok(rec.floor)
}

/// Write `rec` to `path` (mode 0644): [`save_time`]'s last step.
pub fn write(path: &Path, rec: &policy::SavedTime) -> io::Result<()> {
    crate::durable::write(path, rec.to_text().as_bytes(), crate::durable::PUBLIC)
}
