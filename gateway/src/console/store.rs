//! What the console keeps in the `perm` directory (`--root DIR`), and nothing else:
//!
//! ```text
//! DIR/riceguard.conf              the saved (= running) configuration, INI as `riceguard up --config` reads;
//!                                 schema-2 settings on `#+` lines, which older firmware
//!                                 skips (`core::ini::emit_compat`): after a rollback to
//!                                 it, the same file loads, without them
//! DIR/history/riceguard.conf.N    the 10 previous versions, 1 = the one before the last commit
//! DIR/console.argon2id            optional console password: an Argon2id PHC string, mode 0600
//! DIR/console.passwd              the previous firmware's password file (iterated BLAKE2s):
//!                                 read while no console.argon2id exists, removed when one
//!                                 is written (upgrade at a good login, or a new password).
//!                                 Firmware before Argon2id reads only this name, and an
//!                                 Argon2id line in it as damaged (locked console): see
//!                                 [`Store::password_v1`] for what it sees after a rollback
//! DIR/commit-confirm              present while a `commit-confirm` waits for `confirm`: the
//!                                 unix time of its deadline (a restarted console resumes it)
//! DIR/commit-confirm.boot         beside it: `BOOT_ID SECS`, the same deadline on this boot's
//!                                 `CLOCK_BOOTTIME`, which an NTP step does not move; used
//!                                 while the boot id matches, else the unix time (after a
//!                                 reboot). A file of its own: older firmware reads the
//!                                 first one as one number and never sees this one
//! DIR/clients/NAME.key            the private key of client NAME (`add client NAME keep-key`),
//!                                 base64, mode 0600; only while the saved configuration has
//!                                 a peer named NAME with the matching public key
//! DIR/.lock                       flock()ed while a commit checks and replaces the files
//! DIR/.riceguard.conf.tmp         only between the steps of an atomic write
//! ```
//!
//! Every file is replaced through [`crate::store::write()`] (secrets mode 0600 from
//! creation) and removed through [`crate::store::remove()`], so a power cut leaves the old or
//! the new version and a removal stays removed. The text format is behind [`Format`] so the history and fallback logic is
//! tested without depending on the INI code.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use std::time::SystemTime;

use super::validate::validate_candidate;
use crate::core::config::Config;
use crate::core::key::Key;
use crate::store::{self as durable, SECRET};

pub const CONF: &str = "riceguard.conf";
pub const HISTORY: &str = "history";
/// How many previous versions are kept.
pub const KEEP: usize = 10;
/// The console password of the firmware before Argon2id (still read, never written).
pub const PASSWD: &str = "console.passwd";
/// The console password: an Argon2id PHC string.
pub const PASSWD_ARGON2ID: &str = "console.argon2id";
// The commit-confirm record is read by init too: its files and format are `run::confirm`'s.
pub use crate::run::confirm::{confirm_left, ConfirmBoot, CONFIRM, CONFIRM_BOOT};
use crate::run::confirm::{marker_text, parse_marker};
pub const LOCK: &str = ".lock";
/// The console a pending `commit-confirm` belongs to (its terminal's name), beside
/// [`CONFIRM`]; older firmware ignores it.
pub const CONFIRM_OWNER: &str = "commit-confirm.console";
/// How the last pending `commit-confirm` was settled from a console other than its
/// owner (`confirmed NAME UNIX` or `rolled-back NAME UNIX`), for the owner to say so.
pub const CONFIRM_SETTLED: &str = ".commit-confirm.settled";
/// Which console made the last commit: `NAME UNIX HASH` (HASH: of the saved file, so a
/// file changed since by hand is not blamed on a console).
pub const COMMITTED_BY: &str = ".committed-by";
/// Kept client private keys (`add client NAME keep-key`).
pub const CLIENTS: &str = "clients";

/// Turns a [`Config`] into file text and back.
pub trait Format {
    /// The text the console shows (`show`, `compare`).
    fn emit(&self, cfg: &Config) -> String;
    /// The text saved to the file: what [`Format::emit`] shows, in the form older firmware
    /// reads too (after a rollback).
    fn emit_saved(&self, cfg: &Config) -> String {
        self.emit(cfg)
    }
    fn parse(&self, file: &str, text: &str) -> Result<Config, String>;
    /// [`Format::parse`], and what in the text loads but is not honoured, a line each
    /// (`line 7: PostUp: ignored: ...`).
    fn parse_noting(&self, file: &str, text: &str) -> Result<(Config, Vec<String>), String> {
        self.parse(file, text).map(|c| (c, Vec::new()))
    }
}

/// The one real format: `core::ini`, the same reader `riceguard up --config` uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ini;

impl Format for Ini {
    fn emit(&self, cfg: &Config) -> String {
        crate::core::ini::emit(cfg)
    }
    fn emit_saved(&self, cfg: &Config) -> String {
        crate::core::ini::emit_compat(cfg)
    }
    fn parse(&self, file: &str, text: &str) -> Result<Config, String> {
        crate::core::ini::parse(file, text).map_err(|e| e.to_string())
    }
    fn parse_noting(&self, file: &str, text: &str) -> Result<(Config, Vec<String>), String> {
        let (c, w) =
            crate::core::ini::parse_with_warnings(file, text).map_err(|e| e.to_string())?;
        let mut notes: Vec<String> = w
            .into_iter()
            .map(|w| format!("line {}: {}: {}", w.line, w.key, w.msg))
            .collect();
        // Written by hand in the plain form: the previous slot's firmware could not load it.
        if let Some((n, e)) = crate::core::ini::earlier_refusal(file, text) {
            notes.push(format!(
                "line {}: {}: firmware before configuration schema {n} cannot read this line, so after \
                 a rollback to it the file would not load; it is saved on a guarded line (`#+`, `#3+`), which that \
                 firmware skips",
                e.line, e.key
            ));
        }
        Ok((c, notes))
    }
}

/// Why the store could not do what was asked. Nothing was changed unless said.
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
                    "no saved version {n} (versions 1 to {KEEP} are kept; see `show history`)"
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

/// What the console password file says. Only a password file that does not exist on a
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

/// Said whenever the console is locked: failsafe mode does not need the console.
pub const FAILSAFE_NOTE: &str =
    "failsafe mode still works on purpose (press f and Enter at the early boot prompt: \
the gateway starts without peers, the saved configuration is untouched)";

/// What [`Store::load`] found.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// Set when the saved file was missing or unusable and something else was used.
    pub warning: Option<String>,
    /// Lines of the file used that loaded but are not honoured (wg-quick's `PostUp`, ...),
    /// as [`Format::parse_noting`] says them; a save writes the file without them.
    pub notes: Vec<String>,
    /// Nothing was ever saved here (no file, no history): a new appliance.
    pub fresh: bool,
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
        self.dir.join(CONF)
    }

    pub fn history_path(&self, n: usize) -> PathBuf {
        self.dir.join(HISTORY).join(format!("{CONF}.{n}"))
    }

    /// The configuration in `path`, validated, and the notes on lines it does not honour.
    fn read_config(&self, path: &Path) -> Result<(Config, Vec<String>), StoreError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        let name = path.display().to_string();
        let (cfg, notes) =
            self.format
                .parse_noting(&name, &text)
                .map_err(|msg| StoreError::Unusable {
                    path: path.to_path_buf(),
                    msg,
                })?;
        validate_candidate(&cfg).map_err(|errs| StoreError::Unusable {
            path: path.to_path_buf(),
            msg: errs.join("; "),
        })?;
        Ok((cfg, notes))
    }

    /// The saved configuration; when it is missing or unusable, the newest history version
    /// that reads and validates, with a warning saying so; defaults as the last resort.
    pub fn load(&self) -> Loaded {
        let conf = self.conf_path();
        let first = match self.read_config(&conf) {
            Ok((config, notes)) => {
                return Loaded {
                    config,
                    warning: None,
                    notes,
                    fresh: false,
                }
            }
            Err(StoreError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                format!("no saved configuration at {}", conf.display())
            }
            Err(e) => e.to_string(),
        };
        for n in 1..=KEEP {
            if let Ok((config, notes)) = self.read_config(&self.history_path(n)) {
                let warning = format!(
                    "{first}; using saved version {n} ({})",
                    self.history_path(n).display()
                );
                return Loaded {
                    config,
                    warning: Some(warning),
                    notes,
                    fresh: false,
                };
            }
        }
        let any_history = (1..=KEEP).any(|n| self.history_path(n).exists());
        let warning = if any_history {
            format!("{first}; no usable saved version either; starting from defaults")
        } else {
            format!("{first}; starting from defaults")
        };
        Loaded {
            config: Config::default(),
            warning: Some(warning),
            notes: Vec::new(),
            fresh: !any_history && !conf.exists(),
        }
    }

    /// Version `n` of the history (1 = the previous one), read and validated.
    pub fn history(&self, n: usize) -> Result<Config, StoreError> {
        if n == 0 || n > KEEP {
            return Err(StoreError::NoVersion(n));
        }
        let p = self.history_path(n);
        match self.read_config(&p) {
            Err(StoreError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::NoVersion(n))
            }
            r => r.map(|(c, _)| c),
        }
    }

    /// The kept versions and when each was saved.
    pub fn history_list(&self) -> Vec<(usize, Option<SystemTime>)> {
        (1..=KEEP)
            .filter_map(|n| {
                let m = std::fs::metadata(self.history_path(n)).ok()?;
                Some((n, m.modified().ok()))
            })
            .collect()
    }

    /// Save `cfg` as the new configuration, moving the current file into the history
    /// (its oldest version falls off). The text must already have been checked.
    pub fn save_text(&self, text: &str) -> Result<(), StoreError> {
        std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let conf = self.conf_path();
        if conf.exists() {
            self.rotate()?;
            let h1 = self.history_path(1);
            // A hard link keeps the old inode's content: the atomic write below replaces
            // the name, not the file. Fall back to a copy where links are not supported.
            if std::fs::hard_link(&conf, &h1).is_err() {
                let old = std::fs::read(&conf).map_err(io_err(&conf))?;
                durable::write(&h1, &old, SECRET).map_err(io_err(&h1))?;
            }
            let hdir = self.dir.join(HISTORY);
            std::fs::File::open(&hdir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&hdir))?;
        }
        durable::write(&conf, text.as_bytes(), SECRET).map_err(io_err(&conf))
    }

    /// history/N -> N+1 for N = KEEP-1..1; the oldest is dropped.
    fn rotate(&self) -> Result<(), StoreError> {
        let hdir = self.dir.join(HISTORY);
        std::fs::create_dir_all(&hdir).map_err(io_err(&hdir))?;
        let oldest = self.history_path(KEEP);
        match std::fs::remove_file(&oldest) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&oldest)(e)),
            _ => {}
        }
        for n in (1..KEEP).rev() {
            let from = self.history_path(n);
            if from.exists() {
                let to = self.history_path(n + 1);
                std::fs::rename(&from, &to).map_err(io_err(&from))?;
            }
        }
        Ok(())
    }

    /// Hold this while checking and replacing the saved configuration, so two consoles
    /// (serial line and a script, say) cannot interleave their history rotations.
    pub fn lock(&self) -> Result<Flock<File>, StoreError> {
        let p = self.dir.join(LOCK);
        std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&p)
            .map_err(io_err(&p))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| StoreError::Io {
            path: p,
            err: io::Error::from(e),
        })
    }

    /// Delete every history version (used by `factory-reset erase-history`).
    pub fn erase_history(&self) -> Result<(), StoreError> {
        let hdir = self.dir.join(HISTORY);
        match std::fs::remove_dir_all(&hdir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&hdir)(e)),
            _ => durable::sync_dir(&self.dir).map_err(io_err(&self.dir)),
        }
    }

    /// Whether a console password is set, fail-closed: a perm that is not mounted, a
    /// read error, non-UTF-8, an empty or a damaged file all lock the console. The
    /// Argon2id file wins; without one, the previous firmware's file is read as it read
    /// it ([`Store::password_v1`]).
    pub fn password(&self) -> Password {
        let p = self.dir.join(PASSWD_ARGON2ID);
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.password_v1(),
            _ => self.read_password(&p, super::password::well_formed),
        }
    }

    /// What firmware before Argon2id makes of this directory: its reader, kept as it
    /// was (only `console.passwd`, `blake2s-iter` lines). After a rollback to it: no
    /// `console.passwd` (removed when the Argon2id file was written) is
    /// [`Password::Off`], an unupgraded one still works.
    pub fn password_v1(&self) -> Password {
        self.read_password(&self.dir.join(PASSWD), super::password::legacy::well_formed)
    }

    fn read_password(&self, p: &Path, well_formed: fn(&str) -> bool) -> Password {
        if !self.perm_mounted {
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
        let bytes = match std::fs::read(p) {
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

    /// Store a password hash line (Argon2id, in `console.argon2id`; then the previous
    /// firmware's `console.passwd` goes, so no fast hash of the same password stays
    /// beside it), or remove the password with `None` (both files).
    pub fn set_password(&self, hash: Option<&str>) -> Result<(), StoreError> {
        let p = self.dir.join(PASSWD_ARGON2ID);
        let old = self.dir.join(PASSWD);
        match hash {
            Some(h) => {
                std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
                durable::write(&p, format!("{h}\n").as_bytes(), SECRET).map_err(io_err(&p))?;
            }
            None => {
                durable::remove(&p).map_err(io_err(&p))?;
            }
        }
        durable::remove(&old).map(|_| ()).map_err(io_err(&old))
    }

    /// Where the kept private key of client `name` (a valid peer name: no `/`, no
    /// leading `.`) is stored.
    pub fn client_key_path(&self, name: &str) -> PathBuf {
        self.dir.join(CLIENTS).join(format!("{name}.key"))
    }

    /// The kept private key of client `name`, if there is one that reads as a key.
    pub fn client_key(&self, name: &str) -> Option<Key> {
        if !crate::core::config::valid_peer_name(name) {
            return None;
        }
        let text = std::fs::read_to_string(self.client_key_path(name)).ok()?;
        Key::from_base64(text.trim()).ok()
    }

    /// Keep (mode 0600) or remove (`None`) the private key of client `name`.
    pub fn set_client_key(&self, name: &str, key: Option<&Key>) -> Result<(), StoreError> {
        let p = self.client_key_path(name);
        if !crate::core::config::valid_peer_name(name) {
            return Err(StoreError::Unusable {
                path: p,
                msg: "not a client name".into(),
            });
        }
        match key {
            Some(k) => {
                let d = self.dir.join(CLIENTS);
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
    pub fn client_key_names(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.dir.join(CLIENTS)) else {
            return Vec::new();
        };
        let mut v: Vec<String> = rd
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let stem = n.strip_suffix(".key")?;
                crate::core::config::valid_peer_name(stem).then(|| stem.to_string())
            })
            .collect();
        v.sort();
        v
    }

    /// The deadline (unix seconds) of a pending `commit-confirm`, if one is recorded.
    pub fn pending_confirm(&self) -> Option<u64> {
        parse_marker(&std::fs::read_to_string(self.dir.join(CONFIRM)).ok()?)
    }

    /// Record (or clear, with `None`) a pending `commit-confirm` deadline. Clearing
    /// removes the unix-time marker first: it alone says a confirm is pending.
    pub fn set_pending_confirm(&self, deadline_unix: Option<u64>) -> Result<(), StoreError> {
        let p = self.dir.join(CONFIRM);
        match deadline_unix {
            Some(t) => durable::write(&p, marker_text(t).as_bytes(), SECRET).map_err(io_err(&p)),
            // fsyncs the directory: after `confirm` and a power cut the rollback stays off.
            None => {
                durable::remove(&p).map_err(io_err(&p))?;
                let o = self.dir.join(CONFIRM_OWNER);
                let _ = durable::remove(&o);
                let b = self.dir.join(CONFIRM_BOOT);
                durable::remove(&b).map(|_| ()).map_err(io_err(&b))
            }
        }
    }

    /// The console a pending `commit-confirm` belongs to; `None` when not recorded (made
    /// by firmware before consoles had names: it belongs to whichever console resumes it).
    pub fn pending_confirm_owner(&self) -> Option<String> {
        let t = std::fs::read_to_string(self.dir.join(CONFIRM_OWNER)).ok()?;
        console_name(t.trim())
    }

    /// Record the console a pending `commit-confirm` belongs to.
    pub fn set_pending_confirm_owner(&self, name: &str) -> Result<(), StoreError> {
        let p = self.dir.join(CONFIRM_OWNER);
        durable::write(&p, format!("{name}\n").as_bytes(), SECRET).map_err(io_err(&p))
    }

    /// Say how a pending `commit-confirm` was settled by a console that did not make it.
    pub fn set_confirm_settled(&self, how: &str, by: &str, unix: u64) {
        let p = self.dir.join(CONFIRM_SETTLED);
        let _ = durable::write(&p, format!("{how} {by} {unix}\n").as_bytes(), SECRET);
    }

    /// `(how, by)` of the last settling by another console, if one is recorded.
    pub fn confirm_settled(&self) -> Option<(String, String)> {
        let t = std::fs::read_to_string(self.dir.join(CONFIRM_SETTLED)).ok()?;
        let mut w = t.split_whitespace();
        let how = w
            .next()
            .filter(|h| *h == "confirmed" || *h == "rolled-back")?;
        Some((how.to_string(), console_name(w.next()?)?))
    }

    /// Record that console `name` saved `text` at `unix` (call under [`Store::lock`]).
    pub fn record_commit(&self, name: &str, unix: u64, text: &str) {
        let p = self.dir.join(COMMITTED_BY);
        let line = format!("{name} {unix} {:016x}\n", text_hash(text.as_bytes()));
        let _ = durable::write(&p, line.as_bytes(), SECRET);
    }

    /// The console that saved the configuration file as it is now, and when (unix), if
    /// the last record matches the file (else it was changed since by something else).
    pub fn committed_by(&self) -> Option<(String, u64)> {
        let t = std::fs::read_to_string(self.dir.join(COMMITTED_BY)).ok()?;
        let mut w = t.split_whitespace();
        let name = console_name(w.next()?)?;
        let unix: u64 = w.next()?.parse().ok()?;
        let hash = u64::from_str_radix(w.next()?, 16).ok()?;
        let now = std::fs::read(self.conf_path()).ok()?;
        (text_hash(&now) == hash).then_some((name, unix))
    }

    /// The boot-time form of the pending deadline, if one was recorded.
    pub fn pending_confirm_boot(&self) -> Option<ConfirmBoot> {
        ConfirmBoot::parse(&std::fs::read_to_string(self.dir.join(CONFIRM_BOOT)).ok()?)
    }

    /// Record the boot-time form beside [`Store::set_pending_confirm`]'s.
    pub fn set_pending_confirm_boot(&self, b: &ConfirmBoot) -> Result<(), StoreError> {
        let p = self.dir.join(CONFIRM_BOOT);
        durable::write(&p, b.to_text().as_bytes(), SECRET).map_err(io_err(&p))
    }
}

/// A console's name as files record it: a terminal's name (`ttyS0`, `tty1`, `hvc0`) or a
/// script's; bounded, plain characters only (it is printed to other consoles).
pub fn console_name(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.:".contains(&b));
    ok.then(|| s.to_string())
}

/// FNV-1a: tells whether the file is still the one a console saved (not a security
/// check: anything that can write the file can write the record too).
fn text_hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Boot-time loading of `DIR/riceguard.conf` for init and the daemon: the saved
/// configuration, or the newest history version that parses and validates, with a
/// warning that says which was used and why.
pub fn load_with_fallback(dir: &Path) -> (Config, Option<String>) {
    let l = Store::new(dir, Ini).load();
    (l.config, l.warning)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::key::Key;
    use crate::testutil::TempDir;
    use std::sync::Mutex;

    /// A stand-in for the INI format so the store's logic is tested on its own: the file
    /// text is an index into a process-wide table of configurations; anything else fails
    /// to parse.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct TableFormat;

    static TABLE: Mutex<Vec<Config>> = Mutex::new(Vec::new());

    impl Format for TableFormat {
        fn emit(&self, cfg: &Config) -> String {
            let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
            t.push(cfg.clone());
            format!("config#{}\n", t.len() - 1)
        }
        fn parse(&self, file: &str, text: &str) -> Result<Config, String> {
            let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
            text.trim()
                .strip_prefix("config#")
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| t.get(n).cloned())
                .ok_or_else(|| format!("{file}: line 1: not a configuration"))
        }
    }

    pub fn cfg_with_port(port: u16) -> Config {
        let mut c = Config::default();
        c.interface.private_key = Some(Key::generate_private(&mut rand_core::OsRng));
        c.interface.listen_port = Some(port);
        c
    }

    fn save(s: &Store<TableFormat>, c: &Config) {
        s.save_text(&s.format.emit(c)).unwrap();
    }

    #[test]
    fn save_keeps_ten_previous_versions() {
        let d = TempDir::new("store");
        let s = Store::new(&d.0, TableFormat);
        for port in 1..=13 {
            save(&s, &cfg_with_port(port));
        }
        assert_eq!(s.load().config.interface.listen_port, Some(13));
        assert!(s.load().warning.is_none());
        for n in 1..=KEEP {
            assert_eq!(
                s.history(n).unwrap().interface.listen_port,
                Some(13 - n as u16)
            );
        }
        assert!(matches!(s.history(11), Err(StoreError::NoVersion(11))));
        assert_eq!(s.history_list().len(), KEEP);
    }

    #[test]
    fn fallback_to_newest_usable_history() {
        let d = TempDir::new("fallback");
        let s = Store::new(&d.0, TableFormat);
        save(&s, &cfg_with_port(1));
        save(&s, &cfg_with_port(2));
        save(&s, &cfg_with_port(3));
        // Corrupt the saved file and the newest history version.
        std::fs::write(s.conf_path(), "garbage").unwrap();
        std::fs::write(s.history_path(1), "garbage").unwrap();
        let l = s.load();
        assert_eq!(l.config.interface.listen_port, Some(1));
        let w = l.warning.unwrap();
        assert!(w.contains("not usable") && w.contains("version 2"), "{w}");
    }

    #[test]
    fn missing_or_hopeless_gives_defaults_with_warning() {
        let d = TempDir::new("empty");
        let s = Store::new(&d.0, TableFormat);
        let l = s.load();
        assert_eq!(l.config, Config::default());
        assert!(l.fresh);
        assert!(l.warning.unwrap().contains("no saved configuration"));
        std::fs::write(s.conf_path(), "garbage").unwrap();
        assert!(!s.load().fresh);
        assert!(s.load().warning.unwrap().contains("defaults"));
        // A config without a private key does not validate: fall back past it.
        save(&s, &Config::default());
        assert_eq!(s.load().config, Config::default());
    }

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

    /// Firmware of configuration schema 1 (before Firewall, Masquerade, Enabled) as a
    /// format: `#+` lines are comments, the new keys unknown (errors), as its `ini.rs` has it.
    #[derive(Debug, Clone, Copy, Default)]
    struct Schema1Ini;

    impl Format for Schema1Ini {
        fn emit(&self, cfg: &Config) -> String {
            crate::core::ini::emit(cfg)
        }
        fn parse(&self, file: &str, text: &str) -> Result<Config, String> {
            crate::core::ini::parse_as_schema1(file, text).map_err(|e| e.to_string())
        }
    }

    /// A rollback to schema-1 firmware after this one saved schema-2 settings: its loader
    /// (and init, which reads the `[Gateway]` settings from the same file) still reads the
    /// saved file itself, not an old version: the same gateway, uplink and interface name,
    /// without the firewall settings and without the disabled client.
    #[test]
    fn schema1_firmware_reads_what_this_one_saves() {
        use crate::core::config::{MasqueradeMode, PeerConfig};
        let d = TempDir::new("schema1");
        let s = Store::new(&d.0, Ini);
        let mut c = cfg_with_port(51820);
        c.interface.addresses = vec!["10.100.0.1/24".parse().unwrap()];
        c.gateway.interface_name = "wg7".into();
        c.gateway.uplink = "eth1".into();
        c.gateway.uplink_addresses = vec!["192.0.2.2/24".parse().unwrap()];
        let mut phone = PeerConfig::new(Key::generate_private(&mut rand_core::OsRng).public());
        phone.name = Some("phone".into());
        phone.allowed_ips = vec!["10.100.0.2/32".parse().unwrap()];
        let mut laptop = PeerConfig::new(Key::generate_private(&mut rand_core::OsRng).public());
        laptop.name = Some("laptop".into());
        laptop.allowed_ips = vec!["10.100.0.3/32".parse().unwrap()];
        c.peers = vec![phone.clone(), laptop.clone()];
        // Version 1: nothing of schema 2 yet (as the file an update starts from).
        s.save_text(&s.format.emit_saved(&c)).unwrap();
        // Version 2 uses schema 2: the laptop disabled, no NAT, the phone's sources kept.
        let mut c2 = c.clone();
        c2.peers[1].enabled = false;
        c2.peers[0].masquerade = false;
        c2.gateway.masquerade = MasqueradeMode::Off;
        c2.gateway.firewall = false;
        s.save_text(&s.format.emit_saved(&c2)).unwrap();
        assert_eq!(s.load().config, c2);

        let old = Store::new(&d.0, Schema1Ini).load();
        assert_eq!(old.warning, None, "the saved file itself loads");
        let want = crate::core::ini::schema1_view(&c2);
        assert_eq!(old.config, want);
        assert_eq!(old.config.peers, vec![phone.clone()]);
        assert_eq!(old.config.gateway.interface_name, "wg7");
        assert_eq!(
            old.config.gateway.uplink_addresses,
            c.gateway.uplink_addresses
        );
        assert!(old.config.validate().is_ok());
        // What schema-1 init does with the file: parse it whole for its [Gateway] settings,
        // and start the gateway from it when it validates (init/perm.rs).
        let text = std::fs::read_to_string(s.conf_path()).unwrap();
        let booted = crate::core::ini::parse_as_schema1("riceguard.conf", &text).unwrap();
        assert!(booted.validate().is_ok());
        assert_eq!(booted.gateway, want.gateway);
        // The history versions read too (`rollback N` there).
        assert_eq!(Store::new(&d.0, Schema1Ini).history(1).unwrap(), c);

        // Why the `#+` form: the plain form would make schema 1 refuse the file, fall back
        // to the version before (losing every change since) and, in init, lose the uplink
        // settings (it reads them from the refused file only).
        let plain = crate::core::ini::emit(&c2);
        assert!(crate::core::ini::parse_as_schema1("p", &plain).is_err());
        s.save_text(&plain).unwrap();
        let old = Store::new(&d.0, Schema1Ini).load();
        assert!(old.warning.unwrap().contains("using saved version 1"));
    }

    #[test]
    fn notes_on_lines_not_honoured() {
        let d = TempDir::new("notes");
        let s = Store::new(&d.0, Ini);
        let k = Key::generate_private(&mut rand_core::OsRng).to_base64();
        std::fs::create_dir_all(&d.0).unwrap();
        std::fs::write(
            s.conf_path(),
            format!("[Interface]\nPrivateKey = {k}\nPostUp = iptables -A x\nDNS = 1.1.1.1\n"),
        )
        .unwrap();
        let l = s.load();
        assert!(l.warning.is_none());
        assert_eq!(l.notes.len(), 2, "{:?}", l.notes);
        assert!(
            l.notes[0].starts_with("line 3: PostUp: ignored"),
            "{:?}",
            l.notes
        );
        assert!(
            l.notes[1].starts_with("line 4: DNS: ignored"),
            "{:?}",
            l.notes
        );
        s.save_text(&s.format.emit_saved(&l.config)).unwrap();
        assert!(s.load().notes.is_empty());
        // A schema-2 key written plainly by hand: noted, so `commit` saves it on `#+`.
        std::fs::write(
            s.conf_path(),
            format!("[Interface]\nPrivateKey = {k}\n[Gateway]\nFirewall = off\n"),
        )
        .unwrap();
        let l = s.load();
        assert!(!l.config.gateway.firewall);
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
        assert!(
            l.notes[0].starts_with("line 4: Firewall: firmware before configuration schema 2"),
            "{:?}",
            l.notes
        );
        s.save_text(&s.format.emit_saved(&l.config)).unwrap();
        let l = s.load();
        assert!(l.notes.is_empty() && !l.config.gateway.firewall);
    }
}
