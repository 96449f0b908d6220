//! The console's handle on the `perm` directory (`--root DIR`): what a session reads
//! and writes there, through [`crate::perm`], which owns every file's name, format and
//! mode (the saved configuration and its history, the password files, the commit-confirm
//! record, kept client keys). What this adds: the directory a console was given, the
//! format it uses, whether perm is mounted (init's `--perm-unmounted`: no password file
//! on an empty tmpfs proves nothing), and the wrong-password count every console shares.

use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::fcntl::Flock;

use crate::core::config::Config;
use crate::core::key::Key;
use crate::perm::{clients, config, confirm, password};

pub use crate::perm::clients::CLIENTS;
pub use crate::perm::config::{Format, Ini, Loaded, CONF, HISTORY, KEEP, LOCK};
pub use crate::perm::confirm::{
    confirm_left, console_name, ConfirmBoot, COMMITTED_BY, CONFIRM, CONFIRM_BOOT, CONFIRM_OWNER,
    CONFIRM_SETTLED,
};
pub use crate::perm::password::{Password, FAILSAFE_NOTE, PASSWD, PASSWD_ARGON2ID};
pub use crate::perm::StoreError;

/// The configuration files under one `perm` directory.
#[derive(Debug, Clone)]
pub struct Store<F: Format> {
    dir: PathBuf,
    pub format: F,
    /// False when init could not mount `perm` (DIR is then an empty tmpfs): its files
    /// say nothing, so no password file there cannot mean "no password".
    perm_mounted: bool,
    /// Wrong console passwords, shared by every console (under `/run`, not DIR).
    failures: super::password::FailureLog,
}

impl<F: Format> Store<F> {
    pub fn new(dir: impl Into<PathBuf>, format: F) -> Self {
        let dir = dir.into();
        // Unit tests never touch the host's /run: their count lives in their own DIR.
        let failures = if cfg!(test) {
            dir.join(".console-failures")
        } else {
            PathBuf::from(super::password::FAILURES)
        };
        Store {
            dir,
            format,
            perm_mounted: true,
            failures: super::password::FailureLog::new(failures),
        }
    }

    /// The wrong-password count every console shares.
    pub fn failure_log(&self) -> &super::password::FailureLog {
        &self.failures
    }

    /// Say that `perm` is not mounted (init's `--perm-unmounted`): the console stays locked.
    pub fn perm_unmounted(mut self) -> Self {
        self.perm_mounted = false;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn conf_path(&self) -> PathBuf {
        config::conf_path(&self.dir)
    }

    pub fn history_path(&self, n: usize) -> PathBuf {
        config::history_path(&self.dir, n)
    }

    /// [`config::load`]: the saved configuration, else the newest usable version.
    pub fn load(&self) -> Loaded {
        config::load(&self.dir, &self.format)
    }

    /// Version `n` of the history (1 = the previous one), read and validated.
    pub fn history(&self, n: usize) -> Result<Config, StoreError> {
        config::history(&self.dir, &self.format, n)
    }

    /// The kept versions and when each was saved.
    pub fn history_list(&self) -> Vec<(usize, Option<SystemTime>)> {
        config::history_list(&self.dir)
    }

    /// [`config::save_text`]: the new saved file, the old one into the history.
    pub fn save_text(&self, text: &str) -> Result<(), StoreError> {
        config::save_text(&self.dir, text)
    }

    /// [`config::lock`], held while checking and replacing the saved configuration.
    pub fn lock(&self) -> Result<Flock<File>, StoreError> {
        config::lock(&self.dir)
    }

    /// Delete every history version (used by `factory-reset erase-history`).
    pub fn erase_history(&self) -> Result<(), StoreError> {
        config::erase_history(&self.dir)
    }

    /// Whether a console password is set, fail-closed: a perm that is not mounted, a
    /// read error, non-UTF-8, an empty or a damaged file all lock the console. The
    /// Argon2id file wins; without one, the previous firmware's file is read as it read
    /// it ([`Store::password_v1`]).
    pub fn password(&self) -> Password {
        if password::present(&self.dir, PASSWD_ARGON2ID) {
            password::read(
                &self.dir,
                PASSWD_ARGON2ID,
                self.perm_mounted,
                super::password::well_formed,
            )
        } else {
            self.password_v1()
        }
    }

    /// What firmware before Argon2id makes of this directory: its reader, kept as it
    /// was (only `console.passwd`, `blake2s-iter` lines). After a rollback to it: no
    /// `console.passwd` (removed when the Argon2id file was written) is
    /// [`Password::Off`], an unupgraded one still works.
    pub fn password_v1(&self) -> Password {
        password::read(
            &self.dir,
            PASSWD,
            self.perm_mounted,
            super::password::legacy::well_formed,
        )
    }

    /// [`password::write`]: a new hash line, or no password (`None`).
    pub fn set_password(&self, hash: Option<&str>) -> Result<(), StoreError> {
        password::write(&self.dir, hash)
    }

    pub fn client_key_path(&self, name: &str) -> PathBuf {
        clients::key_path(&self.dir, name)
    }

    /// The kept private key of client `name`, if there is one that reads as a key.
    pub fn client_key(&self, name: &str) -> Option<Key> {
        clients::key(&self.dir, name)
    }

    /// Keep (mode 0600) or remove (`None`) the private key of client `name`.
    pub fn set_client_key(&self, name: &str, key: Option<&Key>) -> Result<(), StoreError> {
        clients::set_key(&self.dir, name, key)
    }

    /// The names of the clients whose key is kept.
    pub fn client_key_names(&self) -> Vec<String> {
        clients::names(&self.dir)
    }

    /// The deadline (unix seconds) of a pending `commit-confirm`, if one is recorded.
    pub fn pending_confirm(&self) -> Option<u64> {
        confirm::pending(&self.dir)
    }

    /// Record (or clear, with `None`) a pending `commit-confirm` deadline.
    pub fn set_pending_confirm(&self, deadline_unix: Option<u64>) -> Result<(), StoreError> {
        confirm::set_pending(&self.dir, deadline_unix)
    }

    /// The console a pending `commit-confirm` belongs to, if recorded.
    pub fn pending_confirm_owner(&self) -> Option<String> {
        confirm::owner(&self.dir)
    }

    /// Record the console a pending `commit-confirm` belongs to.
    pub fn set_pending_confirm_owner(&self, name: &str) -> Result<(), StoreError> {
        confirm::set_owner(&self.dir, name)
    }

    /// Say how a pending `commit-confirm` was settled by a console that did not make it.
    pub fn set_confirm_settled(&self, how: &str, by: &str, unix: u64) {
        confirm::set_settled(&self.dir, how, by, unix)
    }

    /// `(how, by)` of the last settling by another console, if one is recorded.
    pub fn confirm_settled(&self) -> Option<(String, String)> {
        confirm::settled(&self.dir)
    }

    /// Record that console `name` saved `text` at `unix` (call under [`Store::lock`]).
    pub fn record_commit(&self, name: &str, source: Option<IpAddr>, unix: u64, text: &str) {
        confirm::record_commit(&self.dir, name, source, unix, text)
    }

    /// The console that saved the configuration file as it is now, and when (unix), if
    /// the last record matches the file (else it was changed since by something else).
    pub fn committed_by(&self) -> Option<confirm::Committer> {
        confirm::committed_by(&self.dir, &std::fs::read(self.conf_path()).ok()?)
    }

    /// The boot-time form of the pending deadline, if one was recorded.
    pub fn pending_confirm_boot(&self) -> Option<ConfirmBoot> {
        confirm::pending_boot(&self.dir)
    }

    /// Record the boot-time form beside [`Store::set_pending_confirm`]'s.
    pub fn set_pending_confirm_boot(&self, b: &ConfirmBoot) -> Result<(), StoreError> {
        confirm::set_pending_boot(&self.dir, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::Key;
    use crate::perm::config::tests::TableFormat;
    use crate::testutil::TempDir;

    #[test]
    fn password_and_confirm_marker() {
        let d = TempDir::new("pw");
        let s = Store::new(&d.0, TableFormat);
        assert_eq!(s.password(), Password::Off);
        let h = crate::console::password::hash("a password").unwrap();
        s.set_password(Some(&h)).unwrap();
        assert_eq!(s.password(), Password::Set(h));
        s.set_password(None).unwrap();
        s.set_password(None).unwrap();
        assert_eq!(s.password(), Password::Off);
        s.set_pending_confirm(Some(1234)).unwrap();
        assert_eq!(s.pending_confirm(), Some(1234));
        let b = ConfirmBoot {
            boot_id: "id-1".into(),
            deadline: 300,
        };
        s.set_pending_confirm_boot(&b).unwrap();
        assert_eq!(s.pending_confirm_boot(), Some(b));
        s.set_pending_confirm(None).unwrap();
        assert_eq!(s.pending_confirm(), None);
        assert_eq!(s.pending_confirm_boot(), None);
    }

    #[test]
    fn client_keys_kept_0600_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let d = TempDir::new("clientkeys");
        let s = Store::new(&d.0, TableFormat);
        assert_eq!(s.client_key("phone"), None);
        assert!(s.client_key_names().is_empty());
        let k = Key::generate_private(&mut rand_core::OsRng);
        s.set_client_key("phone", Some(&k)).unwrap();
        assert_eq!(s.client_key("phone"), Some(k));
        let mode = std::fs::metadata(s.client_key_path("phone"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(d.0.join(CLIENTS).join("README"), "x").unwrap();
        std::fs::write(d.0.join(CLIENTS).join(".hidden.key"), "x").unwrap();
        assert_eq!(s.client_key_names(), vec!["phone".to_string()]);
        assert!(s.set_client_key("../x", Some(&k)).is_err());
        assert_eq!(s.client_key("../phone"), None);
        std::fs::write(s.client_key_path("phone"), "garbage\n").unwrap();
        assert_eq!(s.client_key("phone"), None);
        s.set_client_key("phone", None).unwrap();
        s.set_client_key("phone", None).unwrap();
        assert!(s.client_key_names().is_empty());
    }

    /// The two password files: the Argon2id one wins, the previous firmware's is read
    /// without it and removed once the Argon2id one is written; and what the previous
    /// firmware's reader (`password_v1`, kept as it was) then finds: never a lock.
    #[test]
    fn password_files_and_rollback_reader() {
        use crate::console::password::{self, legacy};
        let d = TempDir::new("pwfiles");
        let s = Store::new(&d.0, TableFormat);
        let old = legacy::hash_with("old password", b"0123456789abcdef", 10);
        std::fs::write(d.0.join(PASSWD), format!("{old}\n")).unwrap();
        // Before any upgrade both firmwares read the old file alike.
        assert_eq!(s.password(), Password::Set(old.clone()));
        assert_eq!(s.password_v1(), Password::Set(old.clone()));
        // Written by the new firmware (an upgrade or a new password).
        let new = password::hash("old password").unwrap();
        s.set_password(Some(&new)).unwrap();
        assert_eq!(s.password(), Password::Set(new.clone()));
        assert!(
            !d.0.join(PASSWD).exists(),
            "no fast hash left beside Argon2id"
        );
        // Today's reader after a rollback: no console.passwd, so no password, not locked.
        assert_eq!(s.password_v1(), Password::Off);
        // Had the Argon2id line gone into console.passwd, today's reader would lock.
        std::fs::write(d.0.join(PASSWD), format!("{new}\n")).unwrap();
        assert!(matches!(s.password_v1(), Password::Locked(w) if w.contains("damaged")));
        std::fs::remove_file(d.0.join(PASSWD)).unwrap();
        // A password set on the old firmware after the rollback: the Argon2id file, if
        // still there, wins (it is the newer firmware's); removing it brings the old back.
        std::fs::write(d.0.join(PASSWD), format!("{old}\n")).unwrap();
        assert_eq!(s.password(), Password::Set(new.clone()));
        std::fs::remove_file(d.0.join(PASSWD_ARGON2ID)).unwrap();
        assert_eq!(s.password(), Password::Set(old.clone()));
        // Removing the password removes both files.
        s.set_password(Some(&new)).unwrap();
        std::fs::write(d.0.join(PASSWD), format!("{old}\n")).unwrap();
        s.set_password(None).unwrap();
        assert_eq!(s.password(), Password::Off);
        assert_eq!(s.password_v1(), Password::Off);
        // A damaged Argon2id file locks (no fallback to the old file).
        std::fs::write(d.0.join(PASSWD), format!("{old}\n")).unwrap();
        for bad in [
            "garbage\n",
            "$argon2id$v=19$m=99999999,t=1,p=1$c2FsdHNhbHRzYWx0$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",
            "\n",
        ] {
            std::fs::write(d.0.join(PASSWD_ARGON2ID), bad).unwrap();
            assert!(
                matches!(s.password(), Password::Locked(ref w) if w.contains(PASSWD_ARGON2ID)),
                "{bad:?}"
            );
        }
    }

    /// Only a missing file on a mounted perm means no password.
    #[test]
    fn password_fails_closed() {
        let d = TempDir::new("pwlock");
        let s = Store::new(&d.0, TableFormat);
        let p = d.0.join(PASSWD);
        for (what, bytes) in [
            ("empty", &b""[..]),
            ("empty", b" \n\n"),
            ("not text", b"\xff\xfeblake2s-iter$1$AA$AA\n"),
            ("damaged", b"hunter2\n"),
        ] {
            std::fs::write(&p, bytes).unwrap();
            match s.password() {
                Password::Locked(why) => assert!(
                    why.contains(what) && why.contains("locked") && why.contains("failsafe"),
                    "{why}"
                ),
                other => panic!("{what}: {other:?}"),
            }
        }
        // A read error (here: the name is a directory).
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(
            matches!(s.password(), Password::Locked(w) if w.contains("cannot read")),
            "directory"
        );
        std::fs::remove_dir(&p).unwrap();
        assert_eq!(s.password(), Password::Off);
        // perm not mounted: locked, with or without a file.
        let u = Store::new(&d.0, TableFormat).perm_unmounted();
        match u.password() {
            Password::Locked(why) => {
                assert!(
                    why.contains("not mounted") && why.contains("failsafe"),
                    "{why}"
                )
            }
            other => panic!("unmounted: {other:?}"),
        }
    }
}
