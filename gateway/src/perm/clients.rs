//! Kept client private keys (`add client NAME keep-key`): `clients/NAME.key`, the key in
//! base64 and a newline, mode 0600 in a 0700 directory; only while the saved
//! configuration has a peer named NAME with the matching public key (the console keeps
//! that true).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::{io_err, StoreError};
use crate::core::config::valid_peer_name;
use crate::core::key::Key;
use crate::durable::{self, SECRET};

/// The directory of kept client keys.
pub const CLIENTS: &str = "clients";

/// Where the kept private key of client `name` (a valid peer name: no `/`, no leading
/// `.`) is stored.
pub fn key_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(CLIENTS).join(format!("{name}.key"))
}

/// The kept private key of client `name`, if there is one that reads as a key.
pub fn key(dir: &Path, name: &str) -> Option<Key> {
    if !valid_peer_name(name) {
        return None;
    }
    let text = std::fs::read_to_string(key_path(dir, name)).ok()?;
    Key::from_base64(text.trim()).ok()
}

/// Keep (mode 0600) or remove (`None`) the private key of client `name`.
pub fn set_key(dir: &Path, name: &str, key: Option<&Key>) -> Result<(), StoreError> {
    let p = key_path(dir, name);
    if !valid_peer_name(name) {
        return Err(StoreError::Unusable {
            path: p,
            msg: "not a client name".into(),
        });
    }
    match key {
        Some(k) => {
            let d = dir.join(CLIENTS);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(io_err(&d))?;
            durable::write(&p, format!("{}\n", k.to_base64()).as_bytes(), SECRET)
                .map_err(io_err(&p))
        }
        None => durable::remove(&p).map(|_| ()).map_err(io_err(&p)),
    }
}

/// The names of the clients whose key is kept (files `clients/NAME.key`).
pub fn names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir.join(CLIENTS)) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().into_string().ok()?;
            let stem = n.strip_suffix(".key")?;
            valid_peer_name(stem).then(|| stem.to_string())
        })
        .collect();
    v.sort();
    v
}
