//! The saved configuration and its history: [`CONF`] (the saved = running configuration,
//! INI as `riceguard up --config` reads; schema-2/3 settings on `#+`/`#3+` lines, which
//! older firmware skips: `core::ini::emit_compat`), `history/riceguard.conf.N` (the
//! [`KEEP`] previous versions, 1 = the one before the last commit) and [`LOCK`]. The one
//! loader ([`load`]: the saved file, else the newest history version that reads and
//! validates, else defaults, with a warning saying which), the one writer ([`save_text`],
//! rotating the history), for init at boot and the consoles.
//!
//! Every file is replaced through [`crate::durable::write()`] (mode 0600 from creation: it
//! holds the private key). The text format is behind [`Format`], so the history and
//! fallback logic is tested without the INI code.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::fcntl::{Flock, FlockArg};

use super::{io_err, StoreError};
use crate::core::config::{Config, ValidationError};
use crate::core::key::Key;
use crate::durable::{self, SECRET};

pub const CONF: &str = "riceguard.conf";
pub const HISTORY: &str = "history";
pub use super::KEEP;
/// flock()ed while a commit checks and replaces the files.
pub const LOCK: &str = ".lock";
/// The most of the saved file init reads.
const MAX_TEXT: u64 = 1 << 20;

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

impl<F: Format + ?Sized> Format for Box<F> {
    fn emit(&self, cfg: &Config) -> String {
        (**self).emit(cfg)
    }
    fn emit_saved(&self, cfg: &Config) -> String {
        (**self).emit_saved(cfg)
    }
    fn parse(&self, file: &str, text: &str) -> Result<Config, String> {
        (**self).parse(file, text)
    }
    fn parse_noting(&self, file: &str, text: &str) -> Result<(Config, Vec<String>), String> {
        (**self).parse_noting(file, text)
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

/// The whole-configuration gate every saved version goes through (a commit, boot-time
/// loading): every problem found, a line each.
pub fn validate_candidate(cfg: &Config) -> Result<(), Vec<String>> {
    let errs: Vec<String> = cfg
        .all_problems()
        .iter()
        .map(|e| match e {
            ValidationError::MissingPrivateKey => {
                "the interface has no private key: run `genkey` (or `set interface private-key KEY`)"
                    .to_string()
            }
            e => e.to_string(),
        })
        .collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// What [`load`] found.
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

pub fn conf_path(dir: &Path) -> PathBuf {
    dir.join(CONF)
}

pub fn history_path(dir: &Path, n: usize) -> PathBuf {
    dir.join(HISTORY).join(format!("{CONF}.{n}"))
}

/// The saved file's text, at most 1 MiB of it; empty when it does not read.
pub fn read_text(dir: &Path) -> String {
    let mut text = String::new();
    if let Ok(f) = File::open(conf_path(dir)) {
        let _ = f.take(MAX_TEXT).read_to_string(&mut text);
    }
    text
}

/// First boot: when `dir` has no saved configuration, write `template` with
/// `@PRIVATE_KEY@` replaced by `key` (0600 from creation). `Ok(false)`: one was there.
pub fn write_first(dir: &Path, template: &str, key: &Key) -> Result<bool, StoreError> {
    let path = conf_path(dir);
    if path.exists() {
        return Ok(false);
    }
    let text = template.replace("@PRIVATE_KEY@", &key.to_base64());
    durable::write(&path, text.as_bytes(), SECRET).map_err(io_err(&path))?;
    Ok(true)
}

/// The configuration in `path`, validated, and the notes on lines it does not honour.
fn read_config<F: Format>(format: &F, path: &Path) -> Result<(Config, Vec<String>), StoreError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let name = path.display().to_string();
    let (cfg, notes) = format
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

/// The saved configuration in `dir`; when it is missing or unusable, the newest history
/// version that reads and validates, with a warning saying so; defaults as the last resort.
pub fn load<F: Format>(dir: &Path, format: &F) -> Loaded {
    let conf = conf_path(dir);
    let first = match read_config(format, &conf) {
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
        if let Ok((config, notes)) = read_config(format, &history_path(dir, n)) {
            let warning = format!(
                "{first}; using saved version {n} ({})",
                history_path(dir, n).display()
            );
            return Loaded {
                config,
                warning: Some(warning),
                notes,
                fresh: false,
            };
        }
    }
    let any_history = (1..=KEEP).any(|n| history_path(dir, n).exists());
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

/// Boot-time loading (init): [`load`] in the INI format, and its warning.
pub fn load_with_fallback(dir: &Path) -> (Config, Option<String>) {
    let l = load(dir, &Ini);
    (l.config, l.warning)
}

/// Version `n` of the history (1 = the previous one), read and validated.
pub fn history<F: Format>(dir: &Path, format: &F, n: usize) -> Result<Config, StoreError> {
    if n == 0 || n > KEEP {
        return Err(StoreError::NoVersion(n));
    }
    let p = history_path(dir, n);
    match read_config(format, &p) {
        Err(StoreError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
            Err(StoreError::NoVersion(n))
        }
        r => r.map(|(c, _)| c),
    }
}

/// The kept versions and when each was saved.
pub fn history_list(dir: &Path) -> Vec<(usize, Option<SystemTime>)> {
    (1..=KEEP)
        .filter_map(|n| {
            let m = std::fs::metadata(history_path(dir, n)).ok()?;
            Some((n, m.modified().ok()))
        })
        .collect()
}

/// Save `text` as the new configuration, moving the current file into the history
/// (its oldest version falls off). The text must already have been checked.
pub fn save_text(dir: &Path, text: &str) -> Result<(), StoreError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let conf = conf_path(dir);
    if conf.exists() {
        rotate(dir)?;
        let h1 = history_path(dir, 1);
        // A hard link keeps the old inode's content: the atomic write below replaces
        // the name, not the file. Fall back to a copy where links are not supported.
        if std::fs::hard_link(&conf, &h1).is_err() {
            let old = std::fs::read(&conf).map_err(io_err(&conf))?;
            durable::write(&h1, &old, SECRET).map_err(io_err(&h1))?;
        }
        let hdir = dir.join(HISTORY);
        std::fs::File::open(&hdir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&hdir))?;
    }
    durable::write(&conf, text.as_bytes(), SECRET).map_err(io_err(&conf))
}

/// history/N -> N+1 for N = KEEP-1..1; the oldest is dropped.
fn rotate(dir: &Path) -> Result<(), StoreError> {
    let hdir = dir.join(HISTORY);
    std::fs::create_dir_all(&hdir).map_err(io_err(&hdir))?;
    let oldest = history_path(dir, KEEP);
    match std::fs::remove_file(&oldest) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&oldest)(e)),
        _ => {}
    }
    for n in (1..KEEP).rev() {
        let from = history_path(dir, n);
        if from.exists() {
            let to = history_path(dir, n + 1);
            std::fs::rename(&from, &to).map_err(io_err(&from))?;
        }
    }
    Ok(())
}

/// Hold this while checking and replacing the saved configuration, so two consoles
/// (serial line and a script, say) cannot interleave their history rotations.
pub fn lock(dir: &Path) -> Result<Flock<File>, StoreError> {
    let p = dir.join(LOCK);
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
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
pub fn erase_history(dir: &Path) -> Result<(), StoreError> {
    let hdir = dir.join(HISTORY);
    match std::fs::remove_dir_all(&hdir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&hdir)(e)),
        _ => durable::sync_dir(dir).map_err(io_err(dir)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::config::Config;
    use crate::perm::StoreError;
    use crate::testutil::TempDir;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    /// The functions of this file over one directory and format, as the console's
    /// store holds them.
    struct Store<F> {
        dir: PathBuf,
        format: F,
    }

    impl<F: Format> Store<F> {
        fn new(dir: &Path, format: F) -> Self {
            Store {
                dir: dir.to_path_buf(),
                format,
            }
        }
        fn conf_path(&self) -> PathBuf {
            conf_path(&self.dir)
        }
        fn history_path(&self, n: usize) -> PathBuf {
            history_path(&self.dir, n)
        }
        fn load(&self) -> Loaded {
            load(&self.dir, &self.format)
        }
        fn history(&self, n: usize) -> Result<Config, StoreError> {
            history(&self.dir, &self.format, n)
        }
        fn history_list(&self) -> Vec<(usize, Option<SystemTime>)> {
            history_list(&self.dir)
        }
        fn save_text(&self, text: &str) -> Result<(), StoreError> {
            save_text(&self.dir, text)
        }
    }

    /// A stand-in for the INI format so the store's logic is tested on its own: the file
    /// text is an index into a process-wide table of configurations; anything else fails
    /// to parse.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct TableFormat;

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

    pub(crate) fn cfg_with_port(port: u16) -> Config {
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

    #[test]
    fn first_boot_file_written_once_0600() {
        let d = TempDir::new("perm-first");
        let k = Key::generate_private(&mut rand_core::OsRng);
        let t = "[Interface]\nPrivateKey = @PRIVATE_KEY@\n";
        assert!(write_first(&d.0, t, &k).unwrap());
        let text = read_text(&d.0);
        assert_eq!(
            text,
            format!("[Interface]\nPrivateKey = {}\n", k.to_base64())
        );
        let mode = std::fs::metadata(conf_path(&d.0))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = Key::generate_private(&mut rand_core::OsRng);
        assert!(
            !write_first(&d.0, t, &other).unwrap(),
            "never over a saved file"
        );
        assert_eq!(read_text(&d.0), text);
        let l = load(&d.0, &Ini);
        assert_eq!(l.warning, None);
        assert_eq!(l.config.interface.private_key, Some(k));
    }
}
