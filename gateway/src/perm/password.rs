//! The console password files: [`PASSWD_ARGON2ID`] (an Argon2id PHC line, mode 0600) and
//! [`PASSWD`], the previous firmware's (iterated BLAKE2s): read while no Argon2id file
//! exists, removed when one is written, so no fast hash of the same password stays beside
//! it. Firmware before Argon2id reads only [`PASSWD`], and an Argon2id line in it as
//! damaged (a locked console): this firmware never writes it. Which lines are well formed
//! is the console's (`console::password`), passed in.

use std::io;
use std::path::Path;

use super::{io_err, StoreError};
use crate::durable::{self, SECRET};

/// The console password of the firmware before Argon2id (still read, never written).
pub const PASSWD: &str = "console.passwd";
/// The console password: an Argon2id PHC string.
pub const PASSWD_ARGON2ID: &str = "console.argon2id";

/// Said whenever the console is locked: failsafe mode does not need the console.
pub const FAILSAFE_NOTE: &str =
    "failsafe mode still works on purpose (press f and Enter at the early boot prompt: \
the gateway starts without peers, the saved configuration is untouched)";

/// What a console password file says. Only a password file that does not exist on a
/// mounted `perm` means "no password"; anything unreadable keeps the console locked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Password {
    /// No password is set.
    Off,
    /// The stored hash line.
    Set(String),
    /// The console stays locked; the text says why and how to recover.
    Locked(String),
}

/// Whether `name` in `dir` exists (a read error counts as existing: fail closed).
pub fn present(dir: &Path, name: &str) -> bool {
    !matches!(std::fs::symlink_metadata(dir.join(name)),
        Err(e) if e.kind() == io::ErrorKind::NotFound)
}

/// The password file `name` in `dir`, fail-closed: a perm that is not `mounted`, a read
/// error, non-UTF-8, an empty line or one `well_formed` refuses all lock the console.
pub fn read(dir: &Path, name: &str, mounted: bool, well_formed: fn(&str) -> bool) -> Password {
    let p = dir.join(name);
    if !mounted {
        return Password::Locked(format!(
            "the perm partition is not mounted, so the console password ({}) cannot be checked: \
             the console stays locked; {FAILSAFE_NOTE}; repair or re-flash the disk",
            p.display()
        ));
    }
    let fix = |what: String| {
        Password::Locked(format!(
            "{what}: the console stays locked; fix or remove {} on the perm partition from another machine; {FAILSAFE_NOTE}",
            p.display()
        ))
    };
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Password::Off,
        Err(e) => {
            return fix(format!(
                "cannot read the console password {}: {e}",
                p.display()
            ))
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return fix(format!("the console password {} is not text", p.display()));
    };
    let line = text.trim();
    if line.is_empty() {
        return fix(format!("the console password {} is empty", p.display()));
    }
    if !well_formed(line) {
        return fix(format!("the console password {} is damaged", p.display()));
    }
    Password::Set(line.to_string())
}

/// Store a password hash line in [`PASSWD_ARGON2ID`] (then [`PASSWD`] goes), or remove
/// the password with `None` (both files).
pub fn write(dir: &Path, hash: Option<&str>) -> Result<(), StoreError> {
    let p = dir.join(PASSWD_ARGON2ID);
    let old = dir.join(PASSWD);
    match hash {
        Some(h) => {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            durable::write(&p, format!("{h}\n").as_bytes(), SECRET).map_err(io_err(&p))?;
        }
        None => {
            durable::remove(&p).map_err(io_err(&p))?;
        }
    }
    durable::remove(&old).map(|_| ()).map_err(io_err(&old))
}
