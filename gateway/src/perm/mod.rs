//! What the boots share on disk: every file on the `perm` partition (mounted at [`DIR`]),
//! the on-disk twin of [`crate::run`]. Each file is named here once and has one writer
//! and one parser, in this folder; init, the consoles, the updater, `riceguard ntp` and
//! the daemon read and write through them, so no two of them can drift apart.
//!
//! **Rollback:** firmware before this one reads the same directory after a rollback, so
//! no file here changes name, format or mode; `tests.rs` holds today's writers to the
//! fixtures in `gateway/tests/fixtures/perm/`, written by the firmware before `perm/`.
//!
//! ```text
//! riceguard.conf              the saved (= running) configuration: INI, schema-2/3 settings
//!                             on `#+`/`#3+` lines older firmware skips           config.rs
//! history/riceguard.conf.N    the KEEP previous versions, 1 = the one before     config.rs
//! .lock                       flock()ed while a commit checks and replaces them  config.rs
//! console.argon2id            the console password (Argon2id PHC line), 0600     password.rs
//! console.passwd              the previous firmware's password file (read only)  password.rs
//! commit-confirm              a pending commit-confirm's unix deadline           confirm.rs
//! commit-confirm.boot         the same deadline on this boot's CLOCK_BOOTTIME    confirm.rs
//! commit-confirm.console      the console that made it                           confirm.rs
//! .commit-confirm.settled     how another console settled it                     confirm.rs
//! .committed-by               which console saved the file as it is now          confirm.rs
//! clients/NAME.key            kept client private keys, 0600 (dir 0700)          clients.rs
//! clock                       the saved time (the boot floor), 0644              clock.rs
//! .clock.lock                 flock()ed while the saved time is written          clock.rs
//! update-on-boot(.done)       bundles to install once after a good boot          update.rs
//! log/boots                   the boot counter, 0644                             boot_log.rs
//! log/events, log/events.1    the event log (two halves of 512 KiB), 0600        event_log.rs
//! log/.events.lock            flock()ed: shared to append, exclusive to rotate   event_log.rs
//! ssh_host_ed25519_key        `riceguard ssh`'s host key (ed25519 seed), 0600    ssh_host_key.rs
//! import.undo                 what an import's commit replaced (password, host   import_undo.rs
//!                             key) until it is confirmed or rolled back, 0600
//! ```
//!
//! Paths are [`DIR`] joined with a file's name: a console with `--root DIR` and tests use
//! another directory with the same names. The image's own read-only files
//! (`/etc/riceguard/*`) are not shared boot state: [`crate::image_paths`] names them.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub mod boot_log;
pub mod clients;
pub mod clock;
pub mod config;
pub mod confirm;
pub mod event_log;
pub mod import_undo;
pub mod password;
pub mod ssh_host_key;
pub mod update;

#[cfg(test)]
mod tests;

/// Where init mounts the perm partition (ext4; a tmpfs when it does not mount).
pub const DIR: &str = "/perm";
/// The saved configuration on the appliance ([`DIR`]/[`config::CONF`]).
pub const CONFIG: &str = "/perm/riceguard.conf";

/// `name` (one of this folder's file names) under [`DIR`].
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(DIR).join(name)
}

/// How many previous versions of the saved configuration are kept (`config.rs`'s
/// `history/`; here because [`StoreError`] says it too).
pub const KEEP: usize = 10;

/// Why a file on perm could not be read or written as asked. Nothing was changed unless
/// said.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A file operation failed.
    Io { path: PathBuf, err: io::Error },
    /// `rollback N` for a version that is not kept.
    NoVersion(usize),
    /// A stored version exists but does not read back as a valid configuration.
    Unusable { path: PathBuf, msg: String },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Io { path, err } => write!(f, "{}: {err}", path.display()),
            StoreError::NoVersion(n) => {
                write!(
                    f,
                    "no saved version {n} (versions 1 to {} are kept; see `show history`)",
                    KEEP
                )
            }
            StoreError::Unusable { path, msg } => {
                write!(f, "{} is not usable: {msg}", path.display())
            }
        }
    }
}

impl std::error::Error for StoreError {}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |err| StoreError::Io {
        path: path.to_path_buf(),
        err,
    }
}
