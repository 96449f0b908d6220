//! One console session: the running and candidate configurations, the pending
//! `commit-confirm`, questions waiting for an answer (password, `yes`), and every
//! command's effect. No terminal I/O here: lines come in, [`Reply`]s go out, time comes
//! from the injected [`Clock`], and the daemon is reached through [`Hooks`].
//!
//! Invariants: `running` is what `DIR/riceguard.conf` holds; a command that fails
//! changes neither `candidate`, `running` nor any file.
//!
//! Owns: commit, commit-confirm, rollback, history and the daemon report, every command
//! that moves the candidate/running pair; the invariants above hold for each of them.
//! Tests are in `session/tests.rs`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::command::{self, Command, Show};
use super::password;
use super::peers;
use super::store::{Format, Password, Store};
use super::system::{Clock, Hooks};
use super::validate::{check_consistency, validate_candidate};
use super::vpn_client;
use crate::core::config::Config;
use crate::core::key::Key;

/// The answer to one input line (or to the passing of time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub text: String,
    /// False when the command failed (scripts exit non-zero if any failed).
    pub ok: bool,
    /// The console should end.
    pub exit: bool,
}

impl Reply {
    fn ok(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            ok: true,
            exit: false,
        }
    }
    fn err(text: impl Into<String>) -> Reply {
        Reply {
            text: format!("error: {}", text.into()),
            ok: false,
            exit: false,
        }
    }
}

impl From<Result<String, String>> for Reply {
    fn from(r: Result<String, String>) -> Reply {
        match r {
            Ok(s) => Reply::ok(s),
            Err(e) => Reply::err(e),
        }
    }
}

#[derive(Debug, Clone)]
enum Question {
    Login {
        tries: u32,
    },
    FactoryReset {
        erase_history: bool,
    },
    Reboot,
    NewPassword,
    RepeatPassword(String),
    /// `export configuration [to usb]`: the passphrase, then again; `to_usb`: the text goes
    /// onto the USB stick.
    ExportPassphrase {
        to_usb: bool,
    },
    ExportRepeat {
        first: String,
        to_usb: bool,
    },
    /// `import configuration`: the armoured lines so far, then the passphrase.
    ImportText(String),
    ImportPassphrase(String),
}

#[derive(Debug, Clone)]
struct PendingConfirm {
    deadline: Instant,
    revert_to: Config,
    /// The deadline is in `DIR/commit-confirm` (this unix time); its disappearance or
    /// change then means another console settled it.
    recorded: Option<u64>,
}

/// How long past a commit-confirm deadline a console that did not make it waits for
/// its owner to roll it back before doing so itself (the owner's terminal may have no
/// console any more: unplugged screen, a board.conf without it after an update).
pub const BACKUP_GRACE_SECS: i64 = 10;

/// Why a save did not happen.
enum SaveErr {
    /// Refused or failed; the text says why and what to do.
    Refused(String),
    /// A rollback found its commit-confirm already settled by another console.
    Settled,
}

/// What a save is for: a user's change, or the rollback of the commit-confirm recorded
/// with this unix deadline (`None`: not recorded).
#[derive(Clone, Copy)]
enum Save {
    Commit,
    ConfirmRollback {
        recorded: Option<u64>,
        foreign: bool,
    },
}

pub struct Session {
    store: Store<Box<dyn Format>>,
    hooks: Box<dyn Hooks>,
    clock: Box<dyn Clock>,
    running: Config,
    candidate: Config,
    pending: Option<PendingConfirm>,
    question: Option<Question>,
    /// Why the console refuses every command (the password cannot be checked). A pending
    /// `commit-confirm` still rolls back on time.
    locked: Option<String>,
    /// Private keys of clients added with `keep-key` and not committed yet, by name: like
    /// the candidate they live in memory until `commit` stores them.
    kept_pending: HashMap<String, Key>,
    /// Lines of the saved file that loaded but are not honoured (wg-quick's `PostUp`, ...):
    /// shown by `show` until a commit writes the file without them.
    file_notes: Vec<String>,
    /// This console's name (its terminal: `ttyS0`, `tty1`), told to the other consoles.
    name: String,
    /// When a failed backup rollback of another console's commit-confirm is tried again.
    backup_retry: Option<Instant>,
    /// The SSH session this console serves (`None`: a terminal of the box): what a plain
    /// commit may not cut ([`super::remote`]).
    remote: Option<super::remote::Remote>,
    /// An import's console password and host key, installed by the next commit.
    import_pending: Option<super::export::Extras>,
}

const MIN_PASSWORD: usize = 8;

/// What the passphrase's key derivation cost, for an operator of a small board: scrypt's
/// work factor and memory, and this console process's peak resident memory so far (it
/// includes the scrypt buffer: checked on aarch64-generic in the board test).
fn scrypt_cost(log_n: u8) -> String {
    let mib = (128u64 * 8) << log_n >> 20;
    match crate::sys::process::peak_rss_kib() {
        Some(k) => format!(
            "key derivation: scrypt 2^{log_n} ({mib} MiB); this console's peak memory: {} MiB",
            k.div_ceil(1024)
        ),
        None => format!("key derivation: scrypt 2^{log_n} ({mib} MiB)"),
    }
}

/// How long until the next password is checked, as the console says it.
fn wait_note(left: Duration) -> String {
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    format!("too many wrong passwords: the next one is checked in {secs} s")
}

/// Lines whose key holds a secret, masked unless `private` is asked for.
fn mask_secrets(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once('=') {
            // Diff lines carry a `+ `/`- ` mark before the key.
            Some((k, _))
                if ["PrivateKey", "PresharedKey"].iter().any(|s| {
                    k.trim_start_matches(['+', '-', ' '])
                        .trim()
                        .eq_ignore_ascii_case(s)
                }) =>
            {
                format!("{} = (hidden)\n", k.trim_end())
            }
            _ => format!("{l}\n"),
        })
        .collect()
}

/// Line diff of two INI texts (longest common subsequence; configs are small). Changed
/// lines are shown with `-`/`+`; the section header and `PublicKey` of each section with
/// changes are shown as context, so it is clear which peer changed.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let mut ctx: Vec<&str> = Vec::new();
    let mut shown = false;
    let emit = |out: &mut String, ctx: &mut Vec<&str>, shown: &mut bool, sign: char, line: &str| {
        if !*shown {
            for c in ctx.iter() {
                let _ = writeln!(out, "  {c}");
            }
            *shown = true;
        }
        let _ = writeln!(out, "{}", format!("{sign} {line}").trim_end());
    };
    let is_ctx = |l: &str| {
        l.trim_start().starts_with('[')
            || l.trim_start().to_ascii_lowercase().starts_with("publickey")
    };
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            if a[i].trim_start().starts_with('[') {
                ctx = vec![a[i]];
                shown = false;
            } else if is_ctx(a[i]) && !shown {
                ctx.push(a[i]);
            }
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            emit(&mut out, &mut ctx, &mut shown, '-', a[i]);
            i += 1;
        } else {
            emit(&mut out, &mut ctx, &mut shown, '+', b[j]);
            j += 1;
        }
    }
    out
}

/// How the user of a session was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// On a console of the box: the console password, when one is set.
    Password,
    /// By an SSH key `riceguard ssh` checked (`riceguard console --authenticated ssh`).
    Key,
}

impl Session {
    /// Start a session on `store`: load the saved configuration (with fallback), resume a
    /// pending `commit-confirm`, and ask for the password if one is set. Call
    /// [`Session::poll`] right after: a resumed deadline may already have passed.
    pub fn open(
        store: Store<Box<dyn Format>>,
        hooks: Box<dyn Hooks>,
        clock: Box<dyn Clock>,
    ) -> (Session, Reply) {
        Session::open_as(store, hooks, clock, "console")
    }

    /// [`Session::open`] for the console named `name` (its terminal): a pending
    /// `commit-confirm` is resumed as this session's own only when this console made it
    /// (or nobody recorded which did); another console's is shown, confirmable, and rolled
    /// back from here only if its owner has not done so [`BACKUP_GRACE_SECS`] after the
    /// deadline.
    pub fn open_as(
        store: Store<Box<dyn Format>>,
        hooks: Box<dyn Hooks>,
        clock: Box<dyn Clock>,
        name: &str,
    ) -> (Session, Reply) {
        Session::open_with(store, hooks, clock, name, Login::Password)
    }

    /// [`Session::open_as`], saying how the user was authenticated: [`Login::Key`] (an SSH
    /// key login, checked by `riceguard ssh`) skips the console password.
    pub fn open_with(
        store: Store<Box<dyn Format>>,
        hooks: Box<dyn Hooks>,
        clock: Box<dyn Clock>,
        name: &str,
        login: Login,
    ) -> (Session, Reply) {
        let loaded = store.load();
        let mut text = String::new();
        if let (Some(w), false) = (&loaded.warning, loaded.fresh) {
            let _ = writeln!(text, "warning: {w}");
        }
        if !loaded.notes.is_empty() {
            let _ = writeln!(
                text,
                "warning: the saved configuration has {} line(s) the appliance does not honour \
                 (`show` lists them; the next `commit` writes the file without them)",
                loaded.notes.len()
            );
        }
        let mut s = Session {
            store,
            hooks,
            clock,
            running: loaded.config.clone(),
            candidate: loaded.config,
            pending: None,
            question: None,
            locked: None,
            kept_pending: HashMap::new(),
            file_notes: loaded.notes,
            name: name.to_string(),
            backup_retry: None,
            remote: None,
            import_pending: None,
        };
        if loaded.fresh {
            // A new appliance starts as after factory-reset: with its own key, so the
            // first `commit` works without knowing about `genkey`.
            let k = Key::generate_private(&mut rand_core::OsRng);
            s.candidate.interface.private_key = Some(k);
            let _ = writeln!(
                text,
                "new appliance: the candidate has a newly generated private key (public key {});\n`commit` saves it",
                k.public().to_base64()
            );
        }
        let owner = s.store.pending_confirm_owner();
        if let (Some(deadline_unix), Some(o)) = (
            s.store.pending_confirm(),
            owner.as_ref().filter(|o| **o != s.name),
        ) {
            let left = s.confirm_left_secs(deadline_unix).max(0);
            let _ = writeln!(
                text,
                "a commit-confirm made on {o} is pending: it rolls back in {left} s unless confirmed \
                 (`confirm` here keeps it; commits wait until it is settled)"
            );
        } else if let Some(deadline_unix) = s.store.pending_confirm() {
            match s.store.history(1) {
                Ok(prev) => {
                    // Bounded by the longest commit-confirm: a wall clock set backwards must
                    // not postpone the rollback for ever (set forwards, it rolls back early,
                    // the safe side).
                    // By this boot's boot time when recorded on it: an NTP step since
                    // must not make it roll back at once.
                    let boot = s.clock.boot();
                    let left = super::store::confirm_left(
                        deadline_unix,
                        s.store.pending_confirm_boot().as_ref(),
                        s.clock.unix(),
                        boot.as_ref().map(|b| b.0.as_str()),
                        boot.as_ref().map_or(0, |b| b.1),
                    )
                    .max(0)
                    .unsigned_abs()
                    .min(u64::from(command::MAX_CONFIRM_MINUTES) * 60);
                    s.pending = Some(PendingConfirm {
                        deadline: s.clock.now() + Duration::from_secs(left),
                        revert_to: prev,
                        recorded: Some(deadline_unix),
                    });
                    let _ = writeln!(text, "a commit-confirm is pending: it rolls back in {left} s unless you `confirm`");
                }
                Err(e) => {
                    let _ = s.store.set_pending_confirm(None);
                    let _ = writeln!(text, "warning: a commit-confirm was pending but the version to roll back to is unusable ({e}); keeping the current configuration");
                }
            }
        }
        match (login, s.store.password()) {
            // The key login was the authentication; the password is for the consoles on
            // the box. (A damaged password file does not lock a key login out either:
            // the lock is there because that password cannot be checked.)
            (Login::Key, _) => {}
            (Login::Password, Password::Off) => {}
            (Login::Password, Password::Set(_)) => {
                s.question = Some(Question::Login { tries: 0 });
                if let Some(w) = s.store.failure_log().wait_left(password::boot_time()) {
                    let _ = writeln!(text, "{}", wait_note(w));
                }
            }
            (Login::Password, Password::Locked(why)) => {
                let _ = writeln!(text, "console locked: {why}");
                s.locked = Some(why);
            }
        }
        let reply = Reply::ok(text.trim_end());
        (s, reply)
    }

    pub fn running(&self) -> &Config {
        &self.running
    }

    pub fn candidate(&self) -> &Config {
        &self.candidate
    }

    /// The prompt to show before the next line.
    pub fn prompt(&self) -> &'static str {
        if self.locked.is_some() {
            return "locked> ";
        }
        match &self.question {
            Some(Question::Login { .. }) => "Password: ",
            Some(Question::FactoryReset { .. } | Question::Reboot) => "Type yes to continue: ",
            Some(Question::NewPassword) => "New console password: ",
            Some(Question::RepeatPassword(_)) => "Repeat the new password: ",
            Some(Question::ExportPassphrase { .. }) => "Export passphrase: ",
            Some(Question::ExportRepeat { .. }) => "Repeat the passphrase: ",
            Some(Question::ImportText(_)) => "",
            Some(Question::ImportPassphrase(_)) => "Passphrase of the export: ",
            None if self.candidate != self.running => "riceguard(edit)# ",
            None => "riceguard# ",
        }
    }

    /// The next line is a password: do not echo it.
    pub fn secret_input(&self) -> bool {
        matches!(
            self.question,
            Some(
                Question::Login { .. }
                    | Question::NewPassword
                    | Question::RepeatPassword(_)
                    | Question::ExportPassphrase { .. }
                    | Question::ExportRepeat { .. }
                    | Question::ImportPassphrase(_)
            )
        )
    }

    /// Whether a `commit-confirm` waits, and until when.
    pub fn confirm_deadline(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.deadline)
    }

    /// A background job (update, rollback-slot) still running, described.
    pub fn job_running(&self) -> Option<String> {
        self.hooks.job_running()
    }

    /// Let time pass: roll back an unconfirmed `commit-confirm` whose deadline is over,
    /// else report a background job that ended.
    pub fn poll(&mut self) -> Option<Reply> {
        if let Some(r) = self.poll_confirm() {
            return Some(r);
        }
        self.hooks.job_done().map(|j| Reply {
            text: j.text,
            ok: j.ok,
            exit: false,
        })
    }

    fn poll_confirm(&mut self) -> Option<Reply> {
        let now = self.clock.now();
        let Some(p) = self.pending.as_ref() else {
            return self.poll_foreign_confirm();
        };
        if let Some(unix) = p.recorded {
            if self.store.pending_confirm() != Some(unix) {
                // Another console confirmed it, or rolled it back as a backup.
                self.pending = None;
                return Some(self.settled_elsewhere());
            }
        }
        if now < p.deadline {
            return None;
        }
        let (revert_to, recorded) = (p.revert_to.clone(), p.recorded);
        self.roll_back_confirm(revert_to, recorded, None)
    }

    /// Seconds left (negative: overdue) of the pending commit-confirm recorded with unix
    /// deadline `unix`, by boot time when it was recorded on this boot.
    fn confirm_left_secs(&self, unix: u64) -> i64 {
        let boot = self.clock.boot();
        super::store::confirm_left(
            unix,
            self.store.pending_confirm_boot().as_ref(),
            self.clock.unix(),
            boot.as_ref().map(|b| b.0.as_str()),
            boot.as_ref().map_or(0, |b| b.1),
        )
    }

    /// Another console's commit-confirm: rolled back from here only when its owner has
    /// not done it [`BACKUP_GRACE_SECS`] after the deadline.
    fn poll_foreign_confirm(&mut self) -> Option<Reply> {
        let unix = self.store.pending_confirm()?;
        let owner = self.store.pending_confirm_owner()?;
        if owner == self.name || self.confirm_left_secs(unix) > -BACKUP_GRACE_SECS {
            return None;
        }
        let now = self.clock.now();
        if self.backup_retry.is_some_and(|t| now < t) {
            return None;
        }
        match self.store.history(1) {
            Ok(prev) => self.roll_back_confirm(prev, Some(unix), Some(owner)),
            Err(e) => {
                self.backup_retry = Some(now + Duration::from_secs(60));
                Some(Reply::err(format!(
                    "the commit-confirm made on {owner} is overdue and the version to roll back to is unusable ({e}); retrying in 60 s"
                )))
            }
        }
    }

    /// Roll back a commit-confirm (this console's, or `foreign`'s as a backup).
    fn roll_back_confirm(
        &mut self,
        revert_to: Config,
        recorded: Option<u64>,
        foreign: Option<String>,
    ) -> Option<Reply> {
        let now = self.clock.now();
        let had_edits = self.candidate != self.running;
        let save = Save::ConfirmRollback {
            recorded,
            foreign: foreign.is_some(),
        };
        let what = match &foreign {
            None => "commit-confirm not confirmed in time: rolled back".to_string(),
            Some(o) => format!("the commit-confirm made on {o} not confirmed in time: rolled back"),
        };
        match self.save_as(revert_to, save, &what) {
            Ok(msg) => {
                self.pending = None;
                self.candidate = self.running.clone();
                let mut t = match &foreign {
                    None => format!(
                        "commit-confirm was not confirmed in time: the previous configuration is restored; {msg}\n\
                         (the unconfirmed one is `rollback 1`)"
                    ),
                    Some(o) => format!(
                        "the commit-confirm made on {o} was not confirmed in time and {o} did not roll it back \
                         within {BACKUP_GRACE_SECS} s: rolled back from here; the previous configuration is restored; {msg}\n\
                         (the unconfirmed one is `rollback 1`)"
                    ),
                };
                if had_edits {
                    t.push_str("\nuncommitted edits were dropped");
                }
                Some(Reply::ok(t))
            }
            Err(SaveErr::Settled) => {
                self.pending = None;
                foreign.is_none().then(|| self.settled_elsewhere())
            }
            Err(SaveErr::Refused(e)) => {
                // Try again in a minute rather than on every poll.
                if let Some(p) = self.pending.as_mut() {
                    p.deadline = now + Duration::from_secs(60);
                } else {
                    self.backup_retry = Some(now + Duration::from_secs(60));
                }
                Some(Reply::err(format!(
                    "commit-confirm rollback failed, retrying in 60 s: {e}"
                )))
            }
        }
    }

    /// This console's commit-confirm was settled by another one: say how, and take the
    /// saved configuration as the running one (the candidate too, unless it has edits).
    fn settled_elsewhere(&mut self) -> Reply {
        let had_edits = self.candidate != self.running;
        let loaded = self.store.load();
        if !loaded.fresh {
            self.running = loaded.config;
            self.file_notes = loaded.notes;
        }
        if !had_edits {
            self.candidate = self.running.clone();
        }
        Reply::ok(match self.store.confirm_settled() {
            Some((how, who)) if how == "rolled-back" => format!(
                "the pending commit-confirm was rolled back from another console ({who}) after its deadline: \
                 the previous configuration runs again"
            ),
            Some((_, who)) => format!(
                "the pending commit-confirm was confirmed from another console ({who}): the configuration stays"
            ),
            None => "the pending commit-confirm was settled from another console: nothing rolled back here".into(),
        })
    }

    /// `confirm` on a console that did not make the pending commit-confirm: allowed (the
    /// consoles are on the box itself and share one password); the owner is told.
    fn confirm_foreign(&mut self) -> Reply {
        let _lock = match self.store.lock() {
            Ok(l) => l,
            Err(e) => return Reply::err(format!("not confirmed: {e}")),
        };
        if self.store.pending_confirm().is_none() {
            return Reply::err("nothing to confirm: no commit-confirm is pending");
        }
        let owner = self
            .store
            .pending_confirm_owner()
            .unwrap_or_else(|| "another console".into());
        if let Err(e) = self.store.set_pending_confirm(None) {
            return Reply::err(format!("not confirmed: {e}"));
        }
        self.store
            .set_confirm_settled("confirmed", &self.name, self.clock.unix());
        if self.candidate == self.running {
            let loaded = self.store.load();
            if !loaded.fresh {
                self.running = loaded.config;
                self.candidate = self.running.clone();
                self.file_notes = loaded.notes;
            }
        }
        Reply::ok(format!(
            "confirmed the commit-confirm made on {owner}: its configuration stays ({owner} is told)"
        ))
    }

    /// Execute one input line.
    pub fn handle_line(&mut self, line: &str) -> Reply {
        if let Some(why) = &self.locked {
            return Reply::err(format!("console locked: {why}"));
        }
        if let Some(q) = self.question.take() {
            return self.answer(q, line);
        }
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            return Reply::ok("");
        }
        match command::parse(t) {
            Err(e) => Reply::err(e),
            Ok(cmd) => self.run(cmd),
        }
    }

    fn run(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Help(topic) => command::help(&topic).into(),
            Command::Show { what, private } => self.show(what, private),
            Command::Set(args) if args.first().map(String::as_str) == Some("system") => {
                self.system(true, &args[1..])
            }
            Command::Delete(args) if args.first().map(String::as_str) == Some("system") => {
                self.system(false, &args[1..])
            }
            Command::Set(args) => self.edit(|c| command::apply_set(c, &args)),
            Command::AddClient {
                name,
                keep_key,
                tunnel,
                access,
            } => self.add_client(&name, keep_key, tunnel, access),
            Command::ShowClient { name, tunnel } => self.show_client(&name, tunnel),
            Command::ShowLog { n, peer } => Reply::ok(
                crate::perm::event_log::show(self.store.dir(), n, peer.as_deref()).join("\n"),
            ),
            Command::EnableClient { name, enabled } => {
                self.edit(|c| vpn_client::set_enabled(c, &name, enabled))
            }
            Command::Delete(args) => self.edit(|c| command::apply_delete(c, &args)),
            Command::Compare => {
                let d = diff(
                    &self.store.format.emit(&self.running),
                    &self.store.format.emit(&self.candidate),
                );
                if d.is_empty() {
                    Reply::ok("no changes: the candidate equals the running configuration")
                } else {
                    Reply::ok(mask_secrets(&d).trim_end())
                }
            }
            Command::Commit => {
                // Unchanged but for lines not honoured: the commit writes the file without them.
                if self.candidate == self.running && self.file_notes.is_empty() {
                    return match self.pending.take() {
                        Some(_) => {
                            let _ = self.store.set_pending_confirm(None);
                            Reply::ok("no changes; the pending commit-confirm is confirmed")
                        }
                        None => Reply::ok("no changes to commit"),
                    };
                }
                if let Some(why) = self.remote_refusal(true) {
                    return Reply::err(why);
                }
                let r = self.save_and_apply(self.candidate.clone(), "commit");
                if r.is_ok() {
                    // Nothing to roll back to: an import's undo is not needed any more.
                    super::export::settled(self.store.dir());
                }
                if r.is_ok() && self.pending.take().is_some() {
                    let _ = self.store.set_pending_confirm(None);
                }
                r.into()
            }
            Command::CommitConfirm(minutes) => self.commit_confirm(minutes),
            Command::Confirm => match self.pending.take() {
                Some(_) => {
                    let _ = self.store.set_pending_confirm(None);
                    super::export::settled(self.store.dir());
                    self.store
                        .set_confirm_settled("confirmed", &self.name, self.clock.unix());
                    self.event("confirm: the commit-confirm's configuration stays");
                    Reply::ok("confirmed: the configuration stays")
                }
                None => self.confirm_foreign(),
            },
            Command::Discard => {
                // Re-read the saved file: it may have been committed from elsewhere.
                let loaded = self.store.load();
                let mut text = String::from("uncommitted changes discarded");
                if loaded.config != self.running && !loaded.fresh {
                    text.push_str(
                        "; the saved configuration changed since this console loaded it: reloaded",
                    );
                    self.running = loaded.config;
                    self.file_notes = loaded.notes;
                }
                self.candidate = self.running.clone();
                self.kept_pending.clear();
                self.import_pending = None;
                Reply::ok(text)
            }
            Command::Rollback(0) => {
                self.candidate = self.running.clone();
                self.import_pending = None;
                Reply::ok("loaded the running configuration into the candidate")
            }
            Command::Rollback(n) => match self.store.history(n) {
                Ok(c) => {
                    self.candidate = c;
                    self.import_pending = None;
                    Reply::ok(format!("loaded saved version {n} into the candidate: `compare` to review, `commit` to apply"))
                }
                Err(e) => Reply::err(e.to_string()),
            },
            Command::Save => {
                if self.candidate == self.running {
                    Reply::ok(format!(
                        "nothing to do: `commit` already saved {}",
                        self.store.conf_path().display()
                    ))
                } else {
                    Reply::err("there are uncommitted changes: `commit` saves and applies them (save alone does nothing)")
                }
            }
            Command::Genkey => {
                let k = Key::generate_private(&mut rand_core::OsRng);
                self.candidate.interface.private_key = Some(k);
                Reply::ok(format!(
                    "new private key in the candidate; its public key (give it to your peers):\n{}\n`commit` to use it",
                    k.public().to_base64()
                ))
            }
            Command::Pubkey => {
                let run = self
                    .running
                    .interface
                    .private_key
                    .map(|k| k.public().to_base64());
                let cand = self
                    .candidate
                    .interface
                    .private_key
                    .map(|k| k.public().to_base64());
                match (run, cand) {
                    (Some(r), c) if c.as_ref() == Some(&r) => Reply::ok(r),
                    (r, Some(c)) => Reply::ok(format!(
                        "{}\ncandidate (after commit): {c}",
                        r.unwrap_or_else(|| "running: none yet".into())
                    )),
                    (Some(r), None) => {
                        Reply::ok(format!("{r}\n(the candidate has no private key)"))
                    }
                    (None, None) => Reply::err("no private key yet: run `genkey`, then `commit`"),
                }
            }
            Command::FactoryReset { .. } if self.remote.is_some() => Reply::err(
                "factory-reset removes the SSH keys, which would lock every remote operator out: run it on the serial console",
            ),
            Command::FactoryReset { erase_history } => {
                self.question = Some(Question::FactoryReset { erase_history });
                Reply::ok(format!(
                    "factory-reset replaces the whole configuration with defaults and a new private key,\n\
                     applies it now and removes the console password. {}\nType yes to continue:",
                    if erase_history {
                        "The saved history is ERASED too."
                    } else {
                        "The old configuration stays in the history (`rollback 1`)."
                    }
                ))
            }
            // Long work runs as a background job: the console (and a pending
            // commit-confirm's deadline) does not wait for it.
            Command::Update { .. } | Command::RollbackSlot if self.hooks.job_running().is_some() => {
                Reply::err(format!(
                    "{} is still running: wait for its report",
                    self.hooks.job_running().unwrap_or_default()
                ))
            }
            Command::Update {
                source,
                allow_downgrade,
            } => match self.hooks.update(&source, allow_downgrade) {
                Ok(t) => Reply::ok(format!(
                    "{t}\n(the configuration in /perm is kept; after the update `reboot` starts the new slot on trial)"
                )),
                Err(e) => Reply::err(e),
            },
            Command::RollbackSlot => self.hooks.rollback_slot().into(),
            Command::Export { to_usb } => {
                // The stick is looked for before the passphrase is asked (and again when
                // the file is written: it may have been pulled meanwhile).
                let stick = if to_usb {
                    match self.hooks.usb_check() {
                        Ok(s) => format!("\nthe file goes onto the USB stick {s}"),
                        Err(e) => return Reply::err(format!("not exported: {e}")),
                    }
                } else {
                    String::new()
                };
                self.question = Some(Question::ExportPassphrase { to_usb });
                Reply::ok(format!(
                    "the export holds every private key of this box: choose a passphrase of {} characters or more (asked twice); an empty line cancels{stick}",
                    super::export::MIN_PASSPHRASE
                ))
            }
            Command::ImportUsb { file } => match self.hooks.usb_import(file.as_deref()) {
                Ok((name, text, stick)) => {
                    self.question = Some(Question::ImportPassphrase(text));
                    Reply::ok(format!(
                        "read {name} from the USB stick {stick} (unmounted again); the passphrase of the export:"
                    ))
                }
                Err(e) => Reply::err(format!("not imported: {e}; nothing changed")),
            },
            Command::Import => {
                self.question = Some(Question::ImportText(String::new()));
                Reply::ok("paste the export, from its -----BEGIN AGE ENCRYPTED FILE----- line to its -----END AGE ENCRYPTED FILE----- line (a line `cancel` cancels):")
            }
            Command::Reboot => {
                self.question = Some(Question::Reboot);
                let mut warn = if self.candidate != self.running {
                    "\nuncommitted changes will be lost.".to_string()
                } else {
                    String::new()
                };
                if let Some(j) = self.hooks.job_running() {
                    warn.push_str(&format!(
                        "\n{j}: rebooting stops it (the running slot stays the default)."
                    ));
                }
                Reply::ok(format!(
                    "reboot the appliance now?{warn}\nType yes to continue:"
                ))
            }
            Command::Exit { discard } => {
                if let Some(p) = &self.pending {
                    let left = p
                        .deadline
                        .saturating_duration_since(self.clock.now())
                        .as_secs();
                    return Reply::err(format!(
                        "a commit-confirm is pending: `confirm` it first, or wait {left} s for it to roll back"
                    ));
                }
                if self.candidate != self.running && !discard {
                    return Reply::err(
                        "there are uncommitted changes: `commit`, `discard`, or `exit discard`",
                    );
                }
                Reply {
                    text: String::new(),
                    ok: true,
                    exit: true,
                }
            }
        }
    }

    /// Apply an edit to a copy of the candidate; keep it only if it parses and stays consistent.
    fn edit(&mut self, f: impl FnOnce(&mut Config) -> command::EditResult) -> Reply {
        let mut c = self.candidate.clone();
        let msg = match f(&mut c) {
            Ok(m) => m,
            Err(e) => return Reply::err(e),
        };
        let errs = check_consistency(&c);
        if !errs.is_empty() {
            return Reply::err(errs.join("\n  "));
        }
        self.candidate = c;
        Reply::ok(msg)
    }

    fn show(&mut self, what: Show, private: bool) -> Reply {
        let text = |s: &Self, c: &Config| {
            let t = s.store.format.emit(c);
            let t = if private { t } else { mask_secrets(&t) };
            if s.file_notes.is_empty() {
                return t;
            }
            let mut w = format!(
                "# warning: {} has lines the appliance does not honour; `commit` writes it without them:\n",
                s.store.conf_path().display()
            );
            for n in &s.file_notes {
                let _ = writeln!(w, "# warning: {n}");
            }
            w + &t
        };
        match what {
            Show::Running => Reply::ok(text(self, &self.running).trim_end()),
            Show::Candidate => {
                let mut t = text(self, &self.candidate);
                if self.candidate != self.running {
                    t = format!("[edit] (uncommitted changes: `compare` shows them)\n{t}");
                }
                Reply::ok(t.trim_end())
            }
            Show::Peers => {
                let ifname = self.running.gateway.interface_name.clone();
                match self.hooks.peers(&ifname) {
                    Ok(reply) => peers::format_uapi(
                        &reply,
                        self.clock.unix(),
                        &self.peer_names(),
                        &crate::run::peers::read(&ifname),
                        &self.peer_access(),
                    )
                    .map(|s| s.trim_end().to_string())
                    .into(),
                    Err(e) => Reply::err(format!(
                        "{e}\n(is the gateway running? the configuration is in `show`)"
                    )),
                }
            }
            Show::Status => {
                let mut lines = self.hooks.status();
                match &self.remote {
                    Some(r) => lines.push(format!(
                        "console: {} (over SSH from {})",
                        self.name, r.source
                    )),
                    None => lines.push(format!("console: {}", self.name)),
                }
                if let Some(c) = self.store.committed_by() {
                    let ago =
                        super::system::format_uptime(self.clock.unix().saturating_sub(c.unix));
                    let from = c.source.map(|s| format!(" from {s}")).unwrap_or_default();
                    lines.push(format!("saved: committed on {}{from} {ago} ago", c.name));
                }
                lines.push(self.ssh_status());
                if let Some(p) = &self.pending {
                    let left = p
                        .deadline
                        .saturating_duration_since(self.clock.now())
                        .as_secs();
                    lines.push(format!(
                        "commit-confirm: pending, made on this console ({}), rolls back in {left} s unless `confirm`",
                        self.name
                    ));
                } else if let Some(unix) = self.store.pending_confirm() {
                    let left = self.confirm_left_secs(unix).max(0);
                    let owner = self
                        .store
                        .pending_confirm_owner()
                        .unwrap_or_else(|| "another console".into());
                    lines.push(format!(
                        "commit-confirm: pending, made on {owner}, rolls back in {left} s unless `confirm` (here or there)"
                    ));
                }
                if self.candidate != self.running {
                    lines.push("candidate: uncommitted changes (`compare`)".into());
                }
                Reply::ok(lines.join("\n"))
            }
            Show::Clients => {
                let running = &self.running;
                let committed = |p: &crate::core::config::PeerConfig| {
                    running.peers.iter().any(|r| {
                        r.public_key == p.public_key && r.name == p.name && r.enabled == p.enabled
                    })
                };
                let kept = |p: &crate::core::config::PeerConfig| self.kept_key(p).is_some();
                Reply::ok(vpn_client::list(&self.candidate, kept, committed))
            }
            Show::History => {
                let list = self.store.history_list();
                if list.is_empty() {
                    return Reply::ok("no saved versions yet (each commit keeps the previous one)");
                }
                let now = self.clock.unix();
                let lines: Vec<String> = list
                    .iter()
                    .map(|(n, t)| {
                        let age = t
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|t| super::system::format_uptime(now.saturating_sub(t.as_secs())));
                        // A short summary helps pick the version to roll back to.
                        let what = match self.store.history(*n) {
                            Ok(c) => format!(
                                "{} peer(s), listen port {}",
                                c.peers.len(),
                                c.interface
                                    .listen_port
                                    .map_or("any".into(), |p| p.to_string())
                            ),
                            Err(e) => format!("unusable: {e}"),
                        };
                        format!(
                            "{n:>2}  committed {} ago: {what}",
                            age.unwrap_or_else(|| "?".into())
                        )
                    })
                    .collect();
                Reply::ok(format!(
                    "version  (`rollback N` loads one into the candidate)\n{}",
                    lines.join("\n")
                ))
            }
        }
    }

    /// Names of the running peers, for `show peers`.
    /// The restricted peers' access and the firewall's refusals of each (read from the
    /// kernel's table now; none without it).
    fn peer_access(&self) -> Vec<peers::PeerAccess> {
        use crate::core::firewall::{clients, TABLE};
        let counters = crate::sys::nftables::counters(TABLE).ok();
        let restricted = clients::client_rules(
            &self.running,
            &crate::core::firewall::Ports::from_config(&self.running),
        )
        .counters;
        self.running
            .peers
            .iter()
            .filter(|p| restricted.contains(&clients::counter_name(&p.public_key)))
            .map(|p| {
                let name = clients::counter_name(&p.public_key);
                peers::PeerAccess {
                    key: p.public_key,
                    text: crate::core::access::list_text(&p.access_under(&self.running.gateway)),
                    drops: counters
                        .as_ref()
                        .and_then(|c| c.iter().find(|(n, _, _)| *n == name).map(|(_, n, _)| *n)),
                }
            })
            .collect()
    }

    fn peer_names(&self) -> Vec<(Key, String)> {
        self.running
            .peers
            .iter()
            .filter_map(|p| Some((p.public_key, p.name.clone()?)))
            .collect()
    }

    /// The kept private key of client `p` (pending or stored), if it matches its public key.
    fn kept_key(&self, p: &crate::core::config::PeerConfig) -> Option<Key> {
        let name = p.name.as_deref()?;
        self.kept_pending
            .get(name)
            .copied()
            .or_else(|| self.store.client_key(name))
            .filter(|k| k.public() == p.public_key)
    }

    fn add_client(
        &mut self,
        name: &str,
        keep_key: bool,
        tunnel: vpn_client::Tunnel,
        access: Option<Vec<crate::core::access::AccessItem>>,
    ) -> Reply {
        let uplink = self.hooks.uplink(&self.candidate.gateway.uplink);
        let mut c = self.candidate.clone();
        let added = match vpn_client::add(&mut c, name, &uplink, tunnel, access) {
            Ok(a) => a,
            Err(e) => return Reply::err(e),
        };
        let errs = check_consistency(&c);
        if !errs.is_empty() {
            return Reply::err(errs.join("\n  "));
        }
        let shown = match vpn_client::framed(name, &added.text.config) {
            Ok(t) => t,
            Err(e) => return Reply::err(e),
        };
        self.candidate = c;
        if keep_key {
            self.kept_pending
                .insert(name.to_string(), added.private_key);
        } else {
            self.kept_pending.remove(name);
        }
        let mut t = format!(
            "client {name} added to the candidate: address {}, keys generated here{}\n",
            added
                .peer
                .allowed_ips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if tunnel == vpn_client::Tunnel::Full {
                "; full tunnel: all its traffic goes through this gateway"
            } else {
                ""
            }
        );
        let _ = writeln!(
            t,
            "{}",
            vpn_client::describe_access(&self.candidate, &added.peer)
        );
        t.push_str(&shown);
        for n in &added.text.notes {
            let _ = writeln!(t, "note: {n}");
        }
        if keep_key {
            let _ = writeln!(
                t,
                "the private key is kept ({} once committed): `show client {name}` reprints all of this",
                self.store.client_key_path(name).display()
            );
        } else {
            let _ = writeln!(
                t,
                "the private key above is shown once and not stored: scan or copy it now \
                 (`add client {name} keep-key` keeps it)"
            );
        }
        t.push_str("`commit` to apply: the client can connect after that");
        Reply::ok(t)
    }

    fn show_client(&mut self, name: &str, tunnel: vpn_client::Tunnel) -> Reply {
        let Some(p) = vpn_client::find(&self.candidate, name).cloned() else {
            return Reply::err(format!(
                "there is no client named {} (`show clients` lists them)",
                super::validate::short(name)
            ));
        };
        let key = self.kept_key(&p);
        let uplink = self.hooks.uplink(&self.candidate.gateway.uplink);
        let text =
            match vpn_client::client_config(&self.candidate, &p, key.as_ref(), &uplink, tunnel) {
                Ok(t) => t,
                Err(e) => return Reply::err(e),
            };
        let mut t = match vpn_client::framed(name, &text.config) {
            Ok(f) => f,
            Err(e) => return Reply::err(e),
        };
        for n in &text.notes {
            let _ = writeln!(t, "note: {n}");
        }
        if key.is_none() {
            let _ = writeln!(
                t,
                "note: the private key was not kept, so this configuration cannot connect as it is; \
                 `delete client {name}` and `add client {name}` make a new one"
            );
        }
        if !p.enabled {
            let _ = writeln!(
                t,
                "note: client {name} is disabled: it cannot connect until `enable client {name}` and `commit`"
            );
        }
        let _ = writeln!(t, "{}", vpn_client::describe_access(&self.candidate, &p));
        let committed = self.running.peers.iter().any(|r| {
            r.public_key == p.public_key
                && r.name == p.name
                && r.enabled == p.enabled
                && r.access == p.access
        });
        if !committed {
            let _ = writeln!(t, "note: not committed yet: `commit` to apply");
        }
        Reply::ok(t.trim_end())
    }

    /// After a commit: store the kept keys of clients the saved configuration now has,
    /// remove those of clients it no longer has (deleted, or rolled back). Says what it did.
    fn sync_client_keys(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let has = |cfg: &Config, name: &str, k: &Key| {
            cfg.peers
                .iter()
                .any(|p| p.name.as_deref() == Some(name) && p.public_key == k.public())
        };
        let pending: Vec<(String, Key)> = self.kept_pending.drain().collect();
        for (name, k) in pending {
            if !has(&self.running, &name, &k) {
                // Not committed (yet): keep waiting, as the candidate does.
                self.kept_pending.insert(name, k);
                continue;
            }
            match self.store.set_client_key(&name, Some(&k)) {
                Ok(()) => out.push(format!(
                    "kept the private key of client {name} in {}",
                    self.store.client_key_path(&name).display()
                )),
                Err(e) => out.push(format!(
                    "warning: the private key of client {name} could not be kept ({e}): \
                     it was shown by `add client`; without it, add the client again"
                )),
            }
        }
        for name in self.store.client_key_names() {
            let keep = self
                .store
                .client_key(&name)
                .is_some_and(|k| has(&self.running, &name, &k));
            if keep {
                continue;
            }
            match self.store.set_client_key(&name, None) {
                Ok(()) => out.push(format!(
                    "removed the kept private key of client {name} (no longer a peer)"
                )),
                Err(e) => out.push(format!(
                    "warning: the kept private key of removed client {name} could not be deleted: {e}"
                )),
            }
        }
        out
    }

    fn system(&mut self, set: bool, args: &[String]) -> Reply {
        match (set, args.first().map(String::as_str), args.len()) {
            (true, Some("console-password"), 1) => {
                self.question = Some(Question::NewPassword);
                Reply::ok(format!("enter the new console password ({MIN_PASSWORD} characters or more); an empty line cancels"))
            }
            (false, Some("console-password"), 1) => match self.store.set_password(None) {
                Ok(()) => Reply::ok("console password removed"),
                Err(e) => Reply::err(e.to_string()),
            },
            (_, Some("console-password"), _) => Reply::err(
                "`console-password` takes no value on the command line (you are asked for it)",
            ),
            (true, Some("ssh-key"), n) if n >= 3 => {
                self.edit(|c| command::set_ssh_key(c, &args[1..]))
            }
            (false, Some("ssh-key"), 2)
                if self.remote.is_some()
                    && self.candidate.gateway.ssh_keys.len() == 1
                    && self.candidate.gateway.ssh_keys[0].name == args[1] =>
            {
                Reply::err("that is the last SSH key: deleting it over SSH would lock every remote operator out; delete it on the serial console")
            }
            (false, Some("ssh-key"), 2) => {
                let name = args[1].clone();
                self.edit(|c| command::delete_ssh_key(c, &name))
            }
            (true, Some("ssh-key"), _) => Reply::err(
                "`set system ssh-key` needs a name and the key: set system ssh-key NAME ssh-ed25519 AAAA... [COMMENT] (the line of a .pub file)",
            ),
            (false, Some("ssh-key"), _) => {
                Reply::err("`delete system ssh-key` takes the key's name: delete system ssh-key NAME")
            }
            (_, Some(w), _) => Reply::err(format!(
                "unknown word `{}` after `system`: expected console-password or ssh-key",
                super::validate::short(w)
            )),
            (_, None, _) => Reply::err("`system` needs more: expected console-password or ssh-key"),
        }
    }

    fn answer(&mut self, q: Question, line: &str) -> Reply {
        let yes = line.trim().eq_ignore_ascii_case("yes");
        match q {
            Question::Login { tries } => {
                let stored = match self.store.password() {
                    Password::Set(h) => h,
                    // Removed or damaged since the console started: never fail open.
                    Password::Off => String::new(),
                    Password::Locked(why) => {
                        let r = Reply::err(format!("console locked: {why}"));
                        self.locked = Some(why);
                        return r;
                    }
                };
                // The wait check, the hash and the count under one lock: N consoles
                // get one guess per wait, not N.
                let wait = match self
                    .store
                    .failure_log()
                    .attempt(password::boot_time, || password::verify(line, &stored))
                {
                    password::Attempt::Wait(w) => {
                        // Not checked, not counted: the wait is shared by every console.
                        self.question = Some(Question::Login { tries });
                        return Reply::err(format!("password not checked: {}", wait_note(w)));
                    }
                    password::Attempt::Good => {
                        return Reply::ok(self.upgrade_password(line, &stored));
                    }
                    password::Attempt::Wrong(wait) => wait,
                };
                let why = match wait {
                    Some(w) => format!("wrong password; {}", wait_note(w)),
                    None => "wrong password".to_string(),
                };
                if tries + 1 >= 3 {
                    return Reply {
                        text: format!("error: {why}; too many tries"),
                        ok: false,
                        exit: true,
                    };
                }
                self.question = Some(Question::Login { tries: tries + 1 });
                Reply::err(why)
            }
            Question::FactoryReset { erase_history } if yes => self.factory_reset(erase_history),
            Question::Reboot if yes => Reply::ok(self.hooks.reboot()),
            Question::FactoryReset { .. } | Question::Reboot => Reply::ok("cancelled"),
            Question::ExportPassphrase { .. } if line.is_empty() => {
                Reply::ok("cancelled; nothing exported")
            }
            Question::ExportPassphrase { .. }
                if line.chars().count() < super::export::MIN_PASSPHRASE =>
            {
                Reply::err(format!(
                    "the passphrase is shorter than {} characters; nothing exported",
                    super::export::MIN_PASSPHRASE
                ))
            }
            Question::ExportPassphrase { to_usb } => {
                self.question = Some(Question::ExportRepeat {
                    first: line.to_string(),
                    to_usb,
                });
                Reply::ok("")
            }
            Question::ExportRepeat { first, .. } if first != line => {
                Reply::err("the two entries differ; nothing exported")
            }
            Question::ExportRepeat { first, to_usb } => self.export(&first, to_usb),
            Question::ImportText(_) if line.trim().eq_ignore_ascii_case("cancel") => {
                Reply::ok("cancelled; nothing imported")
            }
            Question::ImportText(mut text) => {
                text.push_str(line.trim_end());
                text.push('\n');
                if text.len() > crate::core::age::MAX_ARMOURED {
                    return Reply::err("that is longer than any export; nothing imported");
                }
                if line.trim() == super::export::END_LINE {
                    self.question = Some(Question::ImportPassphrase(text));
                } else if text.trim().is_empty() {
                    // Blank lines before the text are not part of it.
                    self.question = Some(Question::ImportText(String::new()));
                } else {
                    self.question = Some(Question::ImportText(text));
                }
                Reply::ok("")
            }
            Question::ImportPassphrase(text) => self.import(&text, line),
            Question::NewPassword if line.is_empty() => {
                Reply::ok("cancelled; the password is unchanged")
            }
            Question::NewPassword if line.chars().count() < MIN_PASSWORD => Reply::err(format!(
                "too short: use {MIN_PASSWORD} characters or more; the password is unchanged"
            )),
            Question::NewPassword => {
                self.question = Some(Question::RepeatPassword(line.to_string()));
                Reply::ok("")
            }
            Question::RepeatPassword(first) if first == line => {
                let hashed = match password::hash(line) {
                    Ok(h) => h,
                    Err(e) => return Reply::err(format!("{e}; the password is unchanged")),
                };
                match self.store.set_password(Some(&hashed)) {
                    Ok(()) => {
                        Reply::ok("console password set: it is asked for when the console starts")
                    }
                    Err(e) => Reply::err(e.to_string()),
                }
            }
            Question::RepeatPassword(_) => {
                Reply::err("the two entries differ; the password is unchanged")
            }
        }
    }

    /// After a good login: re-hash a password stored in the previous firmware's form (or
    /// with a lower cost) as Argon2id. What to say about it; a failure keeps the old
    /// hash, which still works.
    fn upgrade_password(&mut self, line: &str, stored: &str) -> String {
        if !password::needs_upgrade(stored) {
            return String::new();
        }
        let upgraded = password::hash(line)
            .and_then(|h| self.store.set_password(Some(&h)).map_err(|e| e.to_string()));
        match upgraded {
            Ok(()) => "note: the console password is now stored as Argon2id \
                 (console.argon2id); firmware older than this one does not read it and, after \
                 a rollback to it, asks for no console password until one is set"
                .to_string(),
            Err(e) => format!("warning: the console password was not upgraded to Argon2id: {e}"),
        }
    }

    /// `show status`'s SSH line: off, or the port, whether something listens on it, the
    /// keys by name and the host key's fingerprint (to check on a first login).
    fn ssh_status(&self) -> String {
        let g = &self.running.gateway;
        if g.ssh_keys.is_empty() {
            return "ssh: off (no SSH key set: `set system ssh-key NAME ssh-ed25519 AAAA...`)"
                .into();
        }
        let listening = crate::sys::os::tcp_listening(g.ssh_port);
        let names: Vec<&str> = g.ssh_keys.iter().map(|k| k.name.as_str()).collect();
        let host = match crate::perm::ssh_host_key::read(self.store.dir()) {
            Ok(Some(k)) => format!(
                "host key {} (ED25519)",
                crate::perm::ssh_host_key::fingerprint(&k)
            ),
            Ok(None) => "host key not made yet (riceguard ssh makes it when it starts)".into(),
            Err(e) => format!("host key unreadable: {e}"),
        };
        format!(
            "ssh: port {} ({}), keys {}; {host}",
            g.ssh_port,
            if listening {
                "listening"
            } else {
                "not listening"
            },
            names.join(", ")
        )
    }

    /// `export configuration [to usb]`, the passphrase given twice: the armoured text,
    /// printed or written onto the USB stick.
    fn export(&mut self, passphrase: &str, to_usb: bool) -> Reply {
        let dir = self.store.dir().to_path_buf();
        let saved = crate::perm::config::read_text(&dir);
        if saved.trim().is_empty() {
            return Reply::err(
                "nothing is saved yet: `commit` a configuration first; nothing exported",
            );
        }
        let clients: Vec<(String, Key)> = self
            .store
            .client_key_names()
            .into_iter()
            .filter_map(|n| self.store.client_key(&n).map(|k| (n, k)))
            .collect();
        let n_clients = clients.len();
        let id = match super::export::gather(&dir, &saved, clients) {
            Ok(i) => i,
            Err(e) => return Reply::err(format!("not exported: {e}")),
        };
        match super::export::seal(&id, passphrase) {
            Ok(text) if to_usb => {
                let name = crate::core::usb_stick::export_file_name(
                    &id.board,
                    i64::try_from(self.clock.unix()).unwrap_or(i64::MAX),
                );
                match self.hooks.usb_export(&name, &text) {
                    Ok(said) => Reply::ok(format!(
                        "{said}\nexported: the saved configuration, {n_clients} kept client key(s){}{}; keep the stick and the passphrase apart (`import configuration from usb` restores it; Debian's `age -d` opens the file)\n{}",
                        if id.password.is_some() { ", the console password" } else { "" },
                        if id.host_key.is_some() { ", the SSH host key" } else { "" },
                        scrypt_cost(crate::core::age::WRITE_LOG_N),
                    )),
                    Err(e) => Reply::err(format!("not exported: {e}")),
                }
            }
            Ok(text) => Reply::ok(format!(
                "{}\nexported: the saved configuration, {n_clients} kept client key(s){}{}; keep this text and its passphrase apart (`import configuration` on any box of this firmware or later restores it; Debian's `age -d` opens it)\n{}",
                text.trim_end(),
                if id.password.is_some() { ", the console password" } else { "" },
                if id.host_key.is_some() { ", the SSH host key" } else { "" },
                scrypt_cost(crate::core::age::WRITE_LOG_N),
            )),
            Err(e) => Reply::err(format!("not exported: {e}")),
        }
    }

    /// `import configuration`: the pasted text and its passphrase. The configuration
    /// becomes the candidate; the rest waits for the commit.
    fn import(&mut self, text: &str, passphrase: &str) -> Reply {
        let id = match super::export::open(text, passphrase) {
            Ok(i) => i,
            Err(e) => return Reply::err(format!("not imported: {e}; nothing changed")),
        };
        let cfg = match self
            .store
            .format
            .parse_noting("the export's configuration", &id.config)
        {
            Ok((c, _)) => c,
            Err(e) => return Reply::err(format!("not imported: {e}; nothing changed")),
        };
        if let Err(errs) = validate_candidate(&cfg) {
            return Reply::err(format!(
                "not imported: the export's configuration does not pass this firmware's checks:\n  {}\nnothing changed",
                errs.join("\n  ")
            ));
        }
        let peers = cfg.peers.len();
        self.candidate = cfg;
        self.kept_pending = id.clients.iter().cloned().collect();
        self.import_pending = Some(super::export::Extras {
            password: id.password.clone(),
            host_key: id.host_key,
        });
        Reply::ok(format!(
            "imported an export of {} (board {}): the candidate is its configuration ({peers} peer(s)); `compare` shows what changes, `commit` (over SSH: `commit-confirm N`) applies it with {} kept client key(s){}{}; `discard` drops it",
            id.firmware,
            id.board,
            id.clients.len(),
            if id.password.is_some() { ", the console password" } else { "" },
            if id.host_key.is_some() { ", the SSH host key" } else { "" },
        ))
    }

    fn factory_reset(&mut self, erase_history: bool) -> Reply {
        let mut fresh = Config::default();
        self.kept_pending.clear();
        self.import_pending = None;
        let k = Key::generate_private(&mut rand_core::OsRng);
        fresh.interface.private_key = Some(k);
        let msg = match self.save_and_apply(fresh, "factory-reset") {
            Ok(m) => m,
            Err(e) => return Reply::err(e),
        };
        self.candidate = self.running.clone();
        self.pending = None;
        let mut notes = Vec::new();
        for r in [
            self.store.set_pending_confirm(None),
            self.store.set_password(None),
        ] {
            if let Err(e) = r {
                notes.push(format!("warning: {e}"));
            }
        }
        if erase_history {
            if let Err(e) = self.store.erase_history() {
                notes.push(format!("warning: history not erased: {e}"));
            }
        }
        Reply::ok(format!(
            "factory reset done; new public key: {}\n{msg}{}{}",
            k.public().to_base64(),
            if notes.is_empty() { "" } else { "\n" },
            notes.join("\n")
        ))
    }

    /// Say an event in the event log on perm, as this console (an SSH session's with its
    /// source). Never fails what it records.
    fn event(&self, text: &str) {
        let text = match &self.remote {
            Some(r) => format!("{text} (over SSH from {})", r.source),
            None => text.to_string(),
        };
        crate::perm::event_log::say_at(
            self.store.dir(),
            self.clock.unix(),
            &format!("console:{}", self.name),
            &text,
        );
    }

    /// The SSH session this console serves, if it serves one.
    pub fn remote(&self) -> Option<&super::remote::Remote> {
        self.remote.as_ref()
    }

    /// This console serves an SSH session: commits that could cut it need `commit-confirm`.
    pub fn set_remote(&mut self, r: super::remote::Remote) {
        self.remote = Some(r);
    }

    /// Over SSH: why committing the candidate is refused. `plain`: a `commit` (no
    /// deadline to roll back by), which may not change what the session depends on.
    fn remote_refusal(&self, plain: bool) -> Option<String> {
        let r = self.remote.as_ref()?;
        if let Some(why) = super::remote::locks_out(&self.running, &self.candidate) {
            return Some(format!("not committed: {why}"));
        }
        let risks = super::remote::risks(&self.running, &self.candidate, r);
        (plain && !risks.is_empty()).then(|| {
            format!(
                "not committed: over SSH this changes what this session depends on ({}): use `commit-confirm N`, which rolls back by itself after N minutes unless confirmed, so a cut session cannot strand the box",
                risks.join("; ")
            )
        })
    }

    fn commit_confirm(&mut self, minutes: u32) -> Reply {
        if let Some(why) = self.remote_refusal(false) {
            return Reply::err(why);
        }
        let revert_to = match &self.pending {
            Some(p) => p.revert_to.clone(),
            None if self.candidate == self.running => {
                return Reply::err("no changes to commit: commit-confirm needs a change to guard");
            }
            None => self.running.clone(),
        };
        let msg = if self.candidate != self.running {
            match self.save_and_apply(
                self.candidate.clone(),
                &format!("commit-confirm {minutes} min"),
            ) {
                Ok(m) => m,
                Err(e) => return Reply::err(e),
            }
        } else {
            "no new changes".to_string()
        };
        let secs = u64::from(minutes) * 60;
        let mut t = format!("{msg}\nrolls back in {minutes} min unless you `confirm`");
        let unix = self.clock.unix() + secs;
        let recorded = match self.store.set_pending_confirm(Some(unix)) {
            Ok(()) => {
                let _ = self.store.set_pending_confirm_owner(&self.name);
                if let Some((boot_id, now)) = self.clock.boot() {
                    let b = super::store::ConfirmBoot {
                        boot_id,
                        deadline: now + secs,
                    };
                    // Without it the unix time is used, as before.
                    let _ = self.store.set_pending_confirm_boot(&b);
                }
                Some(unix)
            }
            Err(e) => {
                let _ = write!(t, "\nwarning: the deadline could not be recorded ({e}): it is lost if the console restarts");
                None
            }
        };
        self.pending = Some(PendingConfirm {
            deadline: self.clock.now() + Duration::from_secs(secs),
            revert_to,
            recorded,
        });
        Reply::ok(t)
    }

    /// The one path to change what runs: validate, check the file reads back identically,
    /// save atomically (the previous version goes to the history), then tell the daemon.
    fn save_and_apply(&mut self, cfg: Config, what: &str) -> Result<String, String> {
        self.save_as(cfg, Save::Commit, what).map_err(|e| match e {
            SaveErr::Refused(t) => t,
            SaveErr::Settled => "not committed: settled meanwhile".into(),
        })
    }

    /// [`Session::save_and_apply`] for a commit or a commit-confirm's rollback. Under the
    /// store's lock: a commit is refused while another console's commit-confirm is
    /// pending, or when the saved configuration is no longer the one this session started
    /// from (the message names the console that changed it); a rollback happens only if
    /// its commit-confirm is still the pending one, and clears it.
    fn save_as(&mut self, cfg: Config, why: Save, what: &str) -> Result<String, SaveErr> {
        let refused = SaveErr::Refused;
        validate_candidate(&cfg)
            .map_err(|errs| refused(format!("not committed:\n  {}", errs.join("\n  "))))?;
        // The saved form: older firmware reads it too (schema-2 settings on `#+` lines).
        let text = self.store.format.emit_saved(&cfg);
        match self.store.format.parse("candidate", &text) {
            Ok(back) if back == cfg => {}
            Ok(_) => return Err(refused("not committed: the configuration file would not read back as entered (a bug; please report)".into())),
            Err(e) => return Err(refused(format!("not committed: the configuration file would not read back: {e}"))),
        }
        // The kernel judges the firewall table before anything is saved: a dry run of the
        // daemon's own transaction (a commit-confirm's rollback goes back to what ran).
        if matches!(why, Save::Commit) {
            self.hooks.check_firewall(&cfg).map_err(|e| {
                refused(format!(
                    "not committed: the kernel refuses the firewall table for it: {e}; nothing changed"
                ))
            })?;
        }
        let _lock = self
            .store
            .lock()
            .map_err(|e| refused(format!("not committed: {e}")))?;
        match why {
            Save::Commit => self.may_commit().map_err(refused)?,
            Save::ConfirmRollback {
                recorded: Some(unix),
                ..
            } if self.store.pending_confirm() != Some(unix) => return Err(SaveErr::Settled),
            Save::ConfirmRollback { .. } => {}
        }
        self.store.save_text(&text).map_err(|e| {
            refused(format!(
                "not committed: could not save: {e}; nothing changed"
            ))
        })?;
        let source = self.remote.as_ref().map(|r| r.source);
        self.store
            .record_commit(&self.name, source, self.clock.unix(), &text);
        // Named in the INI form whatever the store's format: keys, never values.
        self.event(&format!(
            "{what}: {}",
            crate::core::event::summary(
                &crate::core::ini::emit(&self.running),
                &crate::core::ini::emit(&cfg)
            )
        ));
        if let Save::ConfirmRollback { foreign, .. } = why {
            // Under the lock, so no other console rolls the same one back again.
            let _ = self.store.set_pending_confirm(None);
            if foreign {
                self.store
                    .set_confirm_settled("rolled-back", &self.name, self.clock.unix());
            }
        }
        let schema2 = crate::core::ini::schema2_settings(&cfg);
        let schema2_changed = schema2 != crate::core::ini::schema2_settings(&self.running);
        // Settings of schema 2 itself (firewall, NAT, disabled peers), not only later ones.
        let has_schema2 =
            crate::core::ini::schema1_view(&cfg) != crate::core::ini::schema2_view(&cfg);
        self.running = cfg;
        let mut notes = String::new();
        if !self.file_notes.is_empty() {
            let _ = write!(
                notes,
                "\nwritten without the lines the appliance did not honour:\n  {}",
                std::mem::take(&mut self.file_notes).join("\n  ")
            );
        }
        if schema2_changed && !schema2.is_empty() {
            let _ = write!(
                notes,
                "\nnote: firmware of an earlier configuration schema (the previous slot after an update) \
                 reads this file without: {}{}",
                schema2.join("; "),
                if has_schema2 {
                    " (firmware before schema 2 has no firewall)"
                } else {
                    ""
                }
            );
        }
        let applied = match self.hooks.reload(&self.store.conf_path()) {
            Ok(m) => m,
            Err(e) => format!("{e}; the saved configuration applies when the gateway next starts"),
        };
        let mut extras = match why {
            Save::Commit => match self.import_pending.take() {
                Some(x) => super::export::install(self.store.dir(), &x)
                    .unwrap_or_else(|e| vec![format!("warning: the import's console password and host key were not installed: {e}")]),
                None => Vec::new(),
            },
            // A commit-confirm rolled back: an import's password and host key too.
            Save::ConfirmRollback { .. } => super::export::undo(self.store.dir())
                .unwrap_or_else(|e| vec![format!("warning: the console password and host key from before the import were not put back: {e}")]),
        };
        extras.extend(self.sync_client_keys());
        let mut keys = extras.join("\n");
        if !keys.is_empty() {
            keys.insert(0, '\n');
        }
        Ok(format!(
            "committed and saved to {}\n{applied}{keys}{notes}",
            self.store.conf_path().display()
        ))
    }

    /// The two-console rule for a commit (under the store's lock). Edits are never
    /// locked: each console has its own candidate. A commit must start from the saved
    /// configuration (another console's commit since makes this one's base stale), and
    /// waits while another console's commit-confirm is pending.
    fn may_commit(&self) -> Result<(), String> {
        if let (Some(unix), Some(owner), None) = (
            self.store.pending_confirm(),
            self.store.pending_confirm_owner(),
            self.pending.as_ref(),
        ) {
            if owner != self.name {
                let left = self.confirm_left_secs(unix).max(0);
                return Err(format!(
                    "not committed: a commit-confirm made on {owner} is pending (it rolls back in {left} s unless confirmed).\n  \
                     `confirm` keeps it (from either console), or wait for it to roll back; then `discard` loads \
                     the result (`compare` first to see your edits) and redo them"
                ));
            }
        }
        if self.store.load().config == self.running {
            return Ok(());
        }
        let who = match self.store.committed_by() {
            Some(c) => {
                let ago = super::system::format_uptime(self.clock.unix().saturating_sub(c.unix));
                let n = c.name;
                let from = c.source.map(|s| format!(" from {s}")).unwrap_or_default();
                if n == self.name {
                    format!("an earlier session on this console ({n}{from}) committed {ago} ago")
                } else {
                    format!("console {n}{from} committed {ago} ago")
                }
            }
            None => "it was changed outside this console session (by hand, a script, or firmware that does not record consoles)".into(),
        };
        Err(format!(
            "not committed: the saved configuration changed since this console loaded it: {who}.\n  \
             `compare` shows your edits against the configuration you started from; `discard` loads \
             the new one (your edits are dropped), then redo them and `commit`"
        ))
    }
}

#[cfg(test)]
mod tests;
