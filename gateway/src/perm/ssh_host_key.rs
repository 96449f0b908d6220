//! The SSH server's host key ([`HOST_KEY`]): the 32-byte ed25519 seed in base64 and a
//! newline, mode 0600. Made by `riceguard ssh` at its first start and kept from then on
//! (across restarts, updates and rollbacks), so the fingerprint a client checked once
//! stays the one it sees. A file that is there but does not read as a key is never
//! replaced silently: the server refuses to start and says so (a new key would look like
//! a man in the middle to every client).

use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::{io_err, StoreError};
use crate::durable::{self, SECRET};

/// The host key file.
pub const HOST_KEY: &str = "ssh_host_ed25519_key";

pub fn path(dir: &Path) -> PathBuf {
    dir.join(HOST_KEY)
}

/// The host key's fingerprint as `ssh-keygen -lf` prints it (`SHA256:...`), from its
/// seed: what `riceguard ssh` says at start, for a client's first connection.
pub fn fingerprint(seed: &[u8; 32]) -> String {
    let public = ed25519_dalek::SigningKey::from_bytes(seed)
        .verifying_key()
        .to_bytes();
    crate::core::ssh_key::fingerprint(&crate::core::ssh_key::ed25519_blob(&public))
}

/// The stored seed; `Ok(None)` when there is no file.
pub fn read(dir: &Path) -> Result<Option<[u8; 32]>, StoreError> {
    let p = path(dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::Io { path: p, err: e }),
    };
    parse(text.trim())
        .map(Some)
        .ok_or_else(|| StoreError::Unusable {
            path: p,
            msg: "not an ed25519 host key (base64 of 32 bytes); remove it to make a new one".into(),
        })
}

fn parse(s: &str) -> Option<[u8; 32]> {
    let b = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    b.try_into().ok()
}

/// Store `seed` (0600 from creation, atomically).
pub fn write(dir: &Path, seed: &[u8; 32]) -> Result<(), StoreError> {
    let p = path(dir);
    let line = format!(
        "{}\n",
        base64::engine::general_purpose::STANDARD.encode(seed)
    );
    durable::write(&p, line.as_bytes(), SECRET).map_err(io_err(&p))
}

/// The stored seed, or a new one from `fresh` written first (`true`: it was made now).
pub fn get_or_create(
    dir: &Path,
    fresh: impl FnOnce() -> [u8; 32],
) -> Result<([u8; 32], bool), StoreError> {
    if let Some(s) = read(dir)? {
        return Ok((s, false));
    }
    let s = fresh();
    write(dir, &s)?;
    Ok((s, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn made_once_then_kept_secret() {
        let d = TempDir::new("ssh-host-key");
        assert!(read(&d.0).unwrap().is_none());
        let (a, made) = get_or_create(&d.0, || [7; 32]).unwrap();
        assert!(made);
        assert_eq!(a, [7; 32]);
        let (b, made) = get_or_create(&d.0, || [9; 32]).unwrap();
        assert!(!made);
        assert_eq!(b, [7; 32]);
        let mode = std::fs::metadata(path(&d.0)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_damaged_file_is_refused_not_replaced() {
        let d = TempDir::new("ssh-host-key-bad");
        std::fs::write(path(&d.0), "not a key\n").unwrap();
        assert!(matches!(
            get_or_create(&d.0, || [1; 32]),
            Err(StoreError::Unusable { .. })
        ));
        assert_eq!(std::fs::read_to_string(path(&d.0)).unwrap(), "not a key\n");
    }
}
