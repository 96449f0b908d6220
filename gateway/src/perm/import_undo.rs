//! What an `import configuration` replaced besides the configuration ([`IMPORT_UNDO`]):
//! the console password hash and the SSH host key as they were before the import's
//! commit, mode 0600, in the export text format (`core::identity`, with no configuration:
//! the configuration has its own history). Written at the import's commit; a
//! commit-confirm that rolls back puts them back from it; `confirm`, or a plain commit,
//! removes it. Firmware before this one never reads it.

use std::path::{Path, PathBuf};

use super::{io_err, StoreError};
use crate::core::identity::Identity;
use crate::durable::{self, SECRET};

/// The undo file.
pub const IMPORT_UNDO: &str = "import.undo";

pub fn path(dir: &Path) -> PathBuf {
    dir.join(IMPORT_UNDO)
}

/// Keep `previous` (its password and host key; `None` in either: there was none).
pub fn save(dir: &Path, previous: &Identity) -> Result<(), StoreError> {
    let p = path(dir);
    durable::write(&p, previous.to_text().as_bytes(), SECRET).map_err(io_err(&p))
}

/// The kept state, if there is one that reads.
pub fn read(dir: &Path) -> Option<Identity> {
    let text = std::fs::read_to_string(path(dir)).ok()?;
    Identity::parse(&text, crate::core::ini::SCHEMA).ok()
}

/// Forget it (the import stays).
pub fn remove(dir: &Path) -> Result<(), StoreError> {
    let p = path(dir);
    durable::remove(&p).map(|_| ()).map_err(io_err(&p))
}
