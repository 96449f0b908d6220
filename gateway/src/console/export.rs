//! `export configuration` and `import configuration`: a box's identity (the saved
//! configuration, the kept client keys, the console password hash, the SSH host key) as
//! one passphrase-encrypted `age` text (`core::age`, scrypt at 2^16; Debian's `age -d`
//! opens it), and back as the **candidate**.
//!
//! How an import is applied: the configuration becomes the candidate (`compare` shows it),
//! the kept client keys wait with it as `add client ... keep-key`'s do, and the password
//! hash and host key wait in the session; `commit` (or `commit-confirm N`) saves the
//! configuration, then installs them, after keeping what they replace in
//! `perm::import_undo`. A commit-confirm that rolls back restores those too; `confirm` or a
//! plain commit drops the undo. `rollback N` restores the configuration only (the password
//! and host key are not versioned).

use std::path::Path;

use crate::core::age;
use crate::core::identity::Identity;
use crate::perm::{import_undo, password, ssh_host_key};

/// The shortest passphrase accepted for an export.
pub const MIN_PASSPHRASE: usize = 12;
/// The armour's last line: the end of a pasted import.
pub const END_LINE: &str = "-----END AGE ENCRYPTED FILE-----";

/// What an import installs besides the configuration and the kept client keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    pub password: Option<String>,
    pub host_key: Option<[u8; 32]>,
}

/// The firmware and board lines of an export: the image's version file when there is
/// one (`riceguard 31baa27 qemu-x86_64`), else the program's version.
fn firmware_and_board() -> (String, String) {
    let version = std::fs::read_to_string(crate::image_paths::VERSION)
        .ok()
        .map(|v| v.trim().chars().take(100).collect::<String>())
        .filter(|v| !v.is_empty() && !v.chars().any(char::is_control));
    let firmware = match &version {
        Some(v) => format!("riceguard {} ({v})", env!("CARGO_PKG_VERSION")),
        None => format!("riceguard {} (not an image)", env!("CARGO_PKG_VERSION")),
    };
    // The version file is `riceguard COMMIT BOARD`.
    let board = match version
        .as_deref()
        .map(|v| v.split_whitespace().collect::<Vec<_>>())
    {
        Some(w) if w.len() >= 3 => w[w.len() - 1].to_string(),
        _ => "unknown".into(),
    };
    (firmware, board)
}

/// The identity of the box whose perm directory is `dir`, with `saved` its saved
/// configuration's text.
pub fn gather(
    dir: &Path,
    saved: &str,
    clients: Vec<(String, crate::core::key::Key)>,
) -> Result<Identity, String> {
    let (firmware, board) = firmware_and_board();
    let password = match std::fs::read_to_string(dir.join(password::PASSWD_ARGON2ID)) {
        Ok(t) => Some(t.trim().to_string()).filter(|l| !l.is_empty()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("the console password file: {e}")),
    };
    let host_key = ssh_host_key::read(dir).map_err(|e| e.to_string())?;
    Ok(Identity {
        schema: crate::core::ini::SCHEMA,
        firmware,
        board,
        host_key,
        password,
        clients,
        config: saved.to_string(),
    })
}

/// Encrypt an identity with `passphrase` (checked by the caller) to the armoured text.
pub fn seal(id: &Identity, passphrase: &str) -> Result<String, String> {
    age::encrypt(
        id.to_text().as_bytes(),
        passphrase,
        age::WRITE_LOG_N,
        &mut rand_core::OsRng,
    )
    .map_err(|e| format!("could not encrypt the export: {e}"))
}

/// Open an armoured export with `passphrase`: its identity, every part checked.
pub fn open(armoured: &str, passphrase: &str) -> Result<Identity, String> {
    let plain =
        age::decrypt(armoured, passphrase, age::MAX_READ_LOG_N).map_err(|e| e.to_string())?;
    let text =
        String::from_utf8(plain).map_err(|_| "the export's content is not text".to_string())?;
    Identity::parse(&text, crate::core::ini::SCHEMA)
}

/// Install `x` in `dir`, first keeping what it replaces in the undo file. Says what it
/// did, a line each.
pub fn install(dir: &Path, x: &Extras) -> Result<Vec<String>, String> {
    let mut said = Vec::new();
    if x.password.is_none() && x.host_key.is_none() {
        return Ok(said);
    }
    let before = gather(dir, "", Vec::new())?;
    import_undo::save(dir, &before).map_err(|e| e.to_string())?;
    put(dir, x, &mut said)?;
    Ok(said)
}

/// Put the password and host key of `x` in place (no undo).
fn put(dir: &Path, x: &Extras, said: &mut Vec<String>) -> Result<(), String> {
    if let Some(p) = &x.password {
        password::write(dir, Some(p.as_str())).map_err(|e| e.to_string())?;
        said.push("console password: the imported one".into());
    }
    if let Some(k) = &x.host_key {
        ssh_host_key::write(dir, k).map_err(|e| e.to_string())?;
        said.push(format!(
            "SSH host key: the imported one, {} (riceguard ssh gives it to new connections within 2 s)",
            ssh_host_key::fingerprint(k)
        ));
    }
    Ok(())
}

/// A commit-confirm of an import rolled back: put the password and host key back as they
/// were. Nothing to do without an undo file.
pub fn undo(dir: &Path) -> Result<Vec<String>, String> {
    let Some(prev) = import_undo::read(dir) else {
        return Ok(Vec::new());
    };
    match &prev.password {
        Some(p) => password::write(dir, Some(p.as_str())),
        None => password::write(dir, None),
    }
    .map_err(|e| e.to_string())?;
    if let Some(k) = &prev.host_key {
        ssh_host_key::write(dir, k).map_err(|e| e.to_string())?;
    }
    let _ = import_undo::remove(dir);
    Ok(vec![
        "the console password and SSH host key are back as they were before the import".into(),
    ])
}

/// The import is settled (confirmed, or committed plainly): forget the undo.
pub fn settled(dir: &Path) {
    let _ = import_undo::remove(dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::Key;
    use crate::testutil::TempDir;

    #[test]
    fn seal_open_round_trip_and_refusals() {
        let d = TempDir::new("export");
        ssh_host_key::write(&d.0, &[9; 32]).unwrap();
        let id = gather(
            &d.0,
            "[Interface]\nListenPort = 1\n",
            vec![("phone".into(), Key([1; 32]))],
        )
        .unwrap();
        assert_eq!(id.host_key, Some([9; 32]));
        assert_eq!(id.password, None);
        let text = seal(&id, "correct horse battery").unwrap();
        assert!(
            text.starts_with("-----BEGIN AGE ENCRYPTED FILE-----\n"),
            "{text}"
        );
        assert!(text.trim_end().ends_with(END_LINE));
        assert_eq!(open(&text, "correct horse battery").unwrap(), id);
        let e = open(&text, "wrong horse battery").unwrap_err();
        assert!(e.contains("passphrase"), "{e}");
        // A flipped character in the middle: an error, never another identity.
        let mut b = text.clone().into_bytes();
        let i = b.len() / 2;
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        assert!(open(&String::from_utf8(b).unwrap(), "correct horse battery").is_err());
    }

    #[test]
    fn install_keeps_an_undo_and_undo_puts_it_back() {
        let d = TempDir::new("import-undo");
        ssh_host_key::write(&d.0, &[1; 32]).unwrap();
        password::write(
            &d.0,
            Some("$argon2id$v=19$m=19456,t=2,p=1$b2xkc2FsdA$b2xkaGFzaA"),
        )
        .unwrap();
        let x = Extras {
            password: Some("$argon2id$v=19$m=19456,t=2,p=1$bmV3c2FsdA$bmV3aGFzaA".into()),
            host_key: Some([2; 32]),
        };
        let said = install(&d.0, &x).unwrap();
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(ssh_host_key::read(&d.0).unwrap(), Some([2; 32]));
        assert!(import_undo::read(&d.0).is_some());
        undo(&d.0).unwrap();
        assert_eq!(ssh_host_key::read(&d.0).unwrap(), Some([1; 32]));
        let pw = std::fs::read_to_string(d.0.join(password::PASSWD_ARGON2ID)).unwrap();
        assert!(pw.contains("b2xkaGFzaA"), "{pw}");
        assert!(import_undo::read(&d.0).is_none());
        // Settled: the undo goes, the import stays.
        install(&d.0, &x).unwrap();
        settled(&d.0);
        assert!(undo(&d.0).unwrap().is_empty());
        assert_eq!(ssh_host_key::read(&d.0).unwrap(), Some([2; 32]));
    }
}
