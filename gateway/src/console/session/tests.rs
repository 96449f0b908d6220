//! Session tests: commands driven line by line, time driven by a fake clock, the daemon
//! replaced by a recorder, and the files in a temporary directory (text format stubbed
//! by the store's table format so these tests do not depend on the INI code).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;
use crate::console::system::{Clock, Hooks, JobReport, Uplink};
use crate::perm::config::tests::TableFormat;
use crate::testutil::TempDir;

#[derive(Clone)]
struct FakeClock {
    base: Instant,
    secs: Rc<Cell<u64>>,
}

thread_local! {
    /// How far the fake wall clock was stepped (an NTP step); boot time is not.
    static WALL_STEP: Cell<u64> = const { Cell::new(0) };
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_secs(self.secs.get())
    }
    fn unix(&self) -> u64 {
        1_700_000_000 + self.secs.get() + WALL_STEP.with(Cell::get)
    }
    fn boot(&self) -> Option<(String, u64)> {
        Some(("fake-boot".into(), 10 + self.secs.get()))
    }
}

/// A background job of the fake hooks: what runs, and its report once it "ended".
type FakeJob = Rc<RefCell<Option<(String, Option<JobReport>)>>>;

/// The uplink the fake hooks report (`None`: not known).
type FakeUplink = Rc<RefCell<Option<Uplink>>>;

#[derive(Clone, Default)]
struct Recorder {
    log: Rc<RefCell<Vec<String>>>,
    daemon: bool,
    job: FakeJob,
    uplink: FakeUplink,
}

thread_local! {
    /// What the fake kernel says of a firewall table whose configuration has
    /// `ClientIsolation = on` (`None`: it takes every table).
    static KERNEL_REFUSES: RefCell<Option<String>> = const { RefCell::new(None) };
}

impl Hooks for Recorder {
    fn check_firewall(&mut self, cfg: &Config) -> Result<(), String> {
        match KERNEL_REFUSES.with(|k| k.borrow().clone()) {
            Some(why) if cfg.gateway.client_isolation => Err(why),
            _ => Ok(()),
        }
    }
    fn reload(&mut self, _saved: &std::path::Path) -> Result<String, String> {
        self.log.borrow_mut().push("reload".into());
        if self.daemon {
            Ok("daemon told".into())
        } else {
            Err("no daemon".into())
        }
    }
    fn peers(&mut self, ifname: &str) -> Result<String, String> {
        self.log.borrow_mut().push(format!("peers {ifname}"));
        Err("no answer from the daemon".into())
    }
    fn status(&mut self) -> Vec<String> {
        vec!["version: test".into()]
    }
    fn reboot(&mut self) -> String {
        self.log.borrow_mut().push("reboot".into());
        "rebooting".into()
    }
    fn update(&mut self, source: &str, allow_downgrade: bool) -> Result<String, String> {
        self.log
            .borrow_mut()
            .push(format!("update {source} {allow_downgrade}"));
        *self.job.borrow_mut() = Some((format!("update {source}"), None));
        Ok("update started in the background".into())
    }
    fn job_running(&self) -> Option<String> {
        self.job.borrow().as_ref().map(|j| j.0.clone())
    }
    fn job_done(&mut self) -> Option<JobReport> {
        let mut j = self.job.borrow_mut();
        let r = j.as_mut()?.1.take()?;
        *j = None;
        Some(r)
    }
    fn uplink(&mut self, configured: &str) -> Result<Uplink, String> {
        self.log.borrow_mut().push(format!("uplink {configured}"));
        self.uplink
            .borrow()
            .clone()
            .ok_or_else(|| "no uplink found (test)".to_string())
    }
    fn usb_check(&mut self) -> Result<String, String> {
        STICK
            .with(|s| s.borrow().clone())
            .map(|_| "test stick".to_string())
            .ok_or_else(|| "no USB stick is attached (test)".to_string())
    }
    fn usb_export(&mut self, name: &str, text: &str) -> Result<String, String> {
        let dir = STICK
            .with(|s| s.borrow().clone())
            .ok_or("no USB stick is attached (test)")?;
        crate::usb_stick::write_in(&dir, name, text)?;
        Ok(format!("wrote {name} to the test stick"))
    }
    fn usb_import(&mut self, file: Option<&str>) -> Result<(String, String, String), String> {
        let dir = STICK
            .with(|s| s.borrow().clone())
            .ok_or("no USB stick is attached (test)")?;
        let (name, text) = crate::usb_stick::read_in(&dir, file)?;
        Ok((name, text, "test stick".into()))
    }
}

thread_local! {
    /// The fake hooks' USB stick: a directory (`None`: no stick attached).
    static STICK: RefCell<Option<std::path::PathBuf>> = const { RefCell::new(None) };
}

struct Rig {
    dir: TempDir,
    secs: Rc<Cell<u64>>,
    log: Rc<RefCell<Vec<String>>>,
    uplink: FakeUplink,
    s: Session,
}

impl Rig {
    fn new() -> Rig {
        let dir = TempDir::new("session");
        let secs = Rc::new(Cell::new(0));
        let log = Rc::new(RefCell::new(Vec::new()));
        let uplink = FakeUplink::default();
        let s = Rig::open_with(&dir, &secs, &log, &uplink);
        Rig {
            dir,
            secs,
            log,
            uplink,
            s,
        }
    }

    fn open_at(dir: &TempDir, secs: &Rc<Cell<u64>>, log: &Rc<RefCell<Vec<String>>>) -> Session {
        Rig::open_with(dir, secs, log, &FakeUplink::default())
    }

    /// A session on console `name` (a terminal) over the same directory and clock.
    fn open_named(&self, name: &str) -> Session {
        let store = Store::new(&self.dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: self.secs.clone(),
        };
        let hooks = Recorder {
            log: self.log.clone(),
            daemon: true,
            job: FakeJob::default(),
            uplink: self.uplink.clone(),
        };
        Session::open_as(store, Box::new(hooks), Box::new(clock), name).0
    }

    /// A session of an SSH key login (`--authenticated ssh`) over the same directory.
    fn open_key_login(&self, name: &str) -> Session {
        let store = Store::new(&self.dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: self.secs.clone(),
        };
        let hooks = Recorder {
            log: self.log.clone(),
            daemon: true,
            job: FakeJob::default(),
            uplink: self.uplink.clone(),
        };
        Session::open_with(store, Box::new(hooks), Box::new(clock), name, Login::Key).0
    }

    fn open_with(
        dir: &TempDir,
        secs: &Rc<Cell<u64>>,
        log: &Rc<RefCell<Vec<String>>>,
        uplink: &FakeUplink,
    ) -> Session {
        let store = Store::new(&dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: secs.clone(),
        };
        let hooks = Recorder {
            log: log.clone(),
            daemon: true,
            job: FakeJob::default(),
            uplink: uplink.clone(),
        };
        Session::open(store, Box::new(hooks), Box::new(clock)).0
    }

    /// A new console process on the same directory (as after init restarts it).
    fn restart(&mut self) {
        self.s = Rig::open_with(&self.dir, &self.secs, &self.log, &self.uplink);
    }

    fn ok(&mut self, line: &str) -> String {
        let r = self.s.handle_line(line);
        assert!(r.ok, "`{line}` failed: {}", r.text);
        r.text
    }

    fn err(&mut self, line: &str) -> String {
        let r = self.s.handle_line(line);
        assert!(!r.ok, "`{line}` should fail: {}", r.text);
        r.text
    }

    fn advance(&mut self, secs: u64) -> Option<Reply> {
        self.secs.set(self.secs.get() + secs);
        self.s.poll()
    }

    fn saved(&self) -> Config {
        let store = Store::new(&self.dir.0, TableFormat);
        store.load().config
    }

    fn reloads(&self) -> usize {
        self.log.borrow().iter().filter(|l| *l == "reload").count()
    }
}

fn peer_key() -> String {
    Key::generate_private(&mut rand_core::OsRng)
        .public()
        .to_base64()
}

#[test]
fn a_table_the_kernel_refuses_is_not_committed() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 51820");
    r.ok("commit");
    let before = r.saved();
    KERNEL_REFUSES
        .with(|k| *k.borrow_mut() = Some("add chain forward: Argument list too long".into()));
    r.ok("set gateway client-isolation on");
    let e = r.err("commit");
    KERNEL_REFUSES.with(|k| *k.borrow_mut() = None);
    assert!(
        e.contains("the kernel refuses the firewall table")
            && e.contains("Argument list too long")
            && e.contains("nothing changed"),
        "{e}"
    );
    assert_eq!(r.saved(), before);
    assert_eq!(r.reloads(), 1, "the daemon was not told");
    // The kernel takes it now: the same candidate commits.
    assert!(r.ok("commit").contains("committed"));
    assert!(r.saved().gateway.client_isolation);
}

#[test]
fn set_commit_saves_and_signals() {
    let mut r = Rig::new();
    // A new appliance: the candidate already holds a generated key.
    assert_eq!(r.s.prompt(), "riceguard(edit)# ");
    assert!(r.s.candidate().interface.private_key.is_some());
    assert!(r.s.running().interface.private_key.is_none());
    r.ok("set interface listen-port 51820");
    assert_eq!(r.s.prompt(), "riceguard(edit)# ");
    assert!(r.ok("show candidate").starts_with("[edit]"));
    let out = r.ok("commit");
    assert!(
        out.contains("committed") && out.contains("daemon told"),
        "{out}"
    );
    assert_eq!(r.reloads(), 1);
    assert_eq!(r.s.prompt(), "riceguard# ");
    assert_eq!(r.saved().interface.listen_port, Some(51820));
    assert_eq!(r.ok("commit"), "no changes to commit");
    assert_eq!(r.reloads(), 1);
}

#[test]
fn rejected_changes_touch_nothing() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("commit");
    let before_file = std::fs::read(r.dir.0.join("riceguard.conf")).unwrap();
    let cand = r.s.candidate().clone();
    r.err("set interface listen-port 99999");
    r.err("set peer short allowed-ips 10.0.0.2/32");
    let (a, b) = (peer_key(), peer_key());
    r.ok(&format!("set peer {a} allowed-ips 10.0.0.2/32"));
    let e = r.err(&format!("set peer {b} allowed-ips 10.0.0.2/32"));
    assert!(e.contains("two peers"), "{e}");
    assert_eq!(
        r.s.candidate().peers.len(),
        1,
        "the failed set must not add peer b"
    );
    r.ok("discard");
    assert_eq!(*r.s.candidate(), cand);
    // A commit that fails validation leaves running and the file as they were.
    r.ok("delete interface private-key");
    let e = r.err("commit");
    assert!(e.contains("genkey"), "{e}");
    assert_eq!(
        std::fs::read(r.dir.0.join("riceguard.conf")).unwrap(),
        before_file
    );
    assert!(r.s.running().interface.private_key.is_some());
}

#[test]
fn commit_confirm_reverts_unless_confirmed() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 1000");
    r.ok("commit");
    r.ok("set interface listen-port 2000");
    let out = r.ok("commit-confirm 2");
    assert!(out.contains("rolls back in 2 min"), "{out}");
    assert_eq!(r.saved().interface.listen_port, Some(2000));
    assert!(r.err("exit").contains("commit-confirm is pending"));
    assert!(r.advance(119).is_none());
    let rb = r.advance(1).expect("rollback at the deadline");
    assert!(rb.text.contains("restored"), "{}", rb.text);
    assert_eq!(r.s.running().interface.listen_port, Some(1000));
    assert_eq!(r.s.candidate().interface.listen_port, Some(1000));
    assert_eq!(r.saved().interface.listen_port, Some(1000));
    assert_eq!(
        r.reloads(),
        3,
        "commit, commit-confirm, rollback each signal the daemon"
    );
    assert!(r.advance(1000).is_none());
    // The unconfirmed configuration is still in the history.
    r.ok("rollback 1");
    assert_eq!(r.s.candidate().interface.listen_port, Some(2000));

    // Confirmed in time: stays.
    r.ok("commit-confirm 1");
    assert!(r.advance(30).is_none());
    r.ok("confirm");
    assert!(r.advance(3600).is_none());
    assert_eq!(r.saved().interface.listen_port, Some(2000));
    r.err("confirm");
}

/// Commits, a commit-confirm's rollback and a confirm land in the event log on perm with
/// the console's name and the changed keys (never their values); `show log` lists them.
#[test]
fn commits_and_rollbacks_are_events() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 1000");
    r.ok("commit");
    r.ok("set gateway client-dns 192.0.2.53");
    r.ok("commit-confirm 1");
    assert!(r.advance(60).is_some(), "rolled back at the deadline");
    r.ok("set interface listen-port 3000");
    r.ok("commit-confirm 1");
    r.ok("confirm");
    let log = r.ok("show log");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 5, "{log}");
    assert!(
        lines[0].ends_with(" console:console commit: changed [Interface] PrivateKey, ListenPort"),
        "{log}"
    );
    assert!(
        lines[1].ends_with("commit-confirm 1 min: changed [Gateway] ClientDns"),
        "{log}"
    );
    assert!(
        lines[2].ends_with(
            "commit-confirm not confirmed in time: rolled back: changed [Gateway] ClientDns"
        ),
        "{log}"
    );
    assert!(
        lines[3].ends_with("commit-confirm 1 min: changed [Interface] ListenPort"),
        "{log}"
    );
    assert!(
        lines[4].ends_with("confirm: the commit-confirm's configuration stays"),
        "{log}"
    );
    for secret in ["192.0.2.53", "3000", "1000"] {
        assert!(!log.contains(secret), "{secret} in {log}");
    }
    assert!(!log.contains(&r.s.running().interface.private_key.unwrap().to_base64()));
    assert_eq!(r.ok("show log 2").lines().count(), 2);
    assert!(r.err("show log 0").contains("usage: show log"));
    assert!(r.err("show log peer").contains("usage: show log"));
}

#[test]
fn commit_confirm_survives_console_restart() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 1000");
    r.ok("commit");
    r.ok("set interface listen-port 2000");
    r.ok("commit-confirm 5");
    r.advance(100);
    r.restart();
    assert!(r.s.confirm_deadline().is_some());
    assert!(r.advance(199).is_none());
    assert!(r.advance(1).is_some());
    assert_eq!(r.saved().interface.listen_port, Some(1000));
    r.restart();
    assert!(r.s.confirm_deadline().is_none());
}

#[test]
fn commit_confirm_survives_a_clock_step_and_a_console_restart() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 1000");
    r.ok("commit");
    r.ok("set interface listen-port 2000");
    r.ok("commit-confirm 5");
    r.advance(100);
    // NTP steps the clock a day forward, then the console restarts: by the unix marker
    // the deadline passed long ago, by boot time 200 s are left.
    WALL_STEP.with(|w| w.set(86_400));
    r.restart();
    WALL_STEP.with(|w| w.set(0));
    assert!(r.s.confirm_deadline().is_some());
    assert!(r.advance(199).is_none());
    assert_eq!(r.saved().interface.listen_port, Some(2000));
    assert!(r.advance(1).is_some());
    assert_eq!(r.saved().interface.listen_port, Some(1000));
    assert!(!r.dir.0.join(crate::console::store::CONFIRM_BOOT).exists());
}

#[test]
fn plain_commit_confirms_a_pending_commit_confirm() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("commit");
    r.ok("set interface mtu 1400");
    r.ok("commit-confirm 1");
    r.ok("commit");
    assert!(r.advance(120).is_none());
    assert_eq!(r.saved().interface.mtu, Some(1400));
}

#[test]
fn rollback_loads_history_into_candidate() {
    let mut r = Rig::new();
    r.ok("genkey");
    for p in 1..=12 {
        r.ok(&format!("set interface listen-port {p}"));
        r.ok("commit");
    }
    let h = r.ok("show history");
    assert!(
        h.contains("10  committed") && h.contains("listen port 2"),
        "{h}"
    );
    r.ok("rollback 3");
    assert_eq!(r.s.candidate().interface.listen_port, Some(9));
    assert_eq!(r.s.running().interface.listen_port, Some(12));
    r.ok("rollback 0");
    assert_eq!(r.s.candidate().interface.listen_port, Some(12));
    r.err("rollback 11");
    r.ok("rollback 10");
    r.ok("commit");
    assert_eq!(r.saved().interface.listen_port, Some(2));
}

#[test]
fn factory_reset_asks_and_keeps_history() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 7");
    r.ok("commit");
    let old_pub = r.ok("pubkey");
    r.ok("factory-reset");
    assert_eq!(r.s.prompt(), "Type yes to continue: ");
    assert_eq!(r.ok("no"), "cancelled");
    assert_eq!(r.saved().interface.listen_port, Some(7));
    r.ok("factory-reset");
    assert!(r.ok("yes").contains("factory reset done"));
    let saved = r.saved();
    assert_eq!(saved.interface.listen_port, None);
    assert!(saved.interface.private_key.is_some());
    assert_ne!(r.ok("pubkey"), old_pub);
    r.ok("rollback 1");
    assert_eq!(r.s.candidate().interface.listen_port, Some(7));
    r.ok("discard");
    r.ok("factory-reset erase-history");
    r.ok("yes");
    r.err("rollback 1");
}

#[test]
fn password_set_login_and_remove() {
    let mut r = Rig::new();
    r.ok("commit");
    r.ok("set system console-password");
    assert!(r.s.secret_input());
    r.err("short");
    assert!(!r.s.secret_input());
    r.ok("set system console-password");
    r.ok("correct horse battery");
    r.err("correct horse batterY");
    r.ok("set system console-password");
    r.ok("correct horse battery");
    r.ok("correct horse battery");
    r.restart();
    assert_eq!(r.s.prompt(), "Password: ");
    r.err("wrong one");
    assert_eq!(r.s.prompt(), "Password: ");
    r.ok("correct horse battery");
    assert_eq!(r.s.prompt(), "riceguard# ");
    r.ok("delete system console-password");
    r.restart();
    assert_eq!(r.s.prompt(), "riceguard# ");
    // Three wrong tries end the session.
    r.ok("set system console-password");
    r.ok("abcdefghij");
    r.ok("abcdefghij");
    r.restart();
    r.err("x");
    r.err("y");
    assert!(r.s.handle_line("z").exit);
}

/// A key login (`riceguard ssh`) is the authentication: the console password is not
/// asked, and a password file that cannot be checked does not lock it either; the
/// consoles on the box still ask or stay locked.
#[test]
fn key_login_skips_the_console_password() {
    let mut r = Rig::new();
    r.ok("commit");
    r.ok("set system console-password");
    r.ok("correct horse battery");
    r.ok("correct horse battery");
    r.restart();
    assert_eq!(r.s.prompt(), "Password: ");
    let mut k = r.open_key_login("ssh-1:alice");
    assert_eq!(k.prompt(), "riceguard# ");
    assert!(k.handle_line("show").ok);
    let pw = r.dir.0.join(crate::console::store::PASSWD_ARGON2ID);
    std::fs::write(&pw, b"damaged\n").unwrap();
    r.restart();
    assert_eq!(r.s.prompt(), "locked> ");
    let mut k = r.open_key_login("ssh-2:alice");
    assert_eq!(k.prompt(), "riceguard# ");
    assert!(k.handle_line("show").ok);
}

/// A password the previous firmware set (iterated BLAKE2s) still logs in, and the good
/// login re-hashes it as Argon2id; the wrong-password wait is shared by every console
/// and survives a restart, a good login clears it, a damaged count file is no wait.
/// No time is asserted: the counts are written or read, the waits are minutes long.
#[test]
fn password_upgrade_and_shared_wait() {
    use crate::console::password::{self, legacy};
    use crate::console::store::{PASSWD, PASSWD_ARGON2ID};
    let mut r = Rig::new();
    r.ok("commit");
    let pw = "correct horse battery";
    let old = legacy::hash_with(pw, b"0123456789abcdef", 10);
    std::fs::write(r.dir.0.join(PASSWD), format!("{old}\n")).unwrap();
    r.restart();
    assert_eq!(r.s.prompt(), "Password: ");
    r.err("wrong one");
    assert!(r.ok(pw).contains("now stored as Argon2id"));
    assert_eq!(r.s.prompt(), "riceguard# ");
    let stored = std::fs::read_to_string(r.dir.0.join(PASSWD_ARGON2ID)).unwrap();
    assert_eq!(password::stored_cost(&stored), Some(password::COST));
    assert!(!r.dir.0.join(PASSWD).exists());
    r.restart();
    assert_eq!(r.ok(pw), "", "upgraded once");

    // Three wrong passwords on one console...
    let failures = r.dir.0.join(".console-failures");
    r.restart();
    r.err("a");
    r.err("b");
    let third = r.s.handle_line("c");
    assert!(
        third.exit && third.text.contains("next one is checked in"),
        "{}",
        third.text
    );
    // ...make the next try wait, on a restarted console and on a second one alike: the
    // right password is not even checked, nor counted.
    let count = std::fs::read_to_string(&failures).unwrap();
    r.restart();
    let e = r.err(pw);
    assert!(
        e.contains("not checked") && e.contains("too many wrong passwords"),
        "{e}"
    );
    assert_eq!(r.s.prompt(), "Password: ");
    let (mut second, hello) = {
        let store = Store::new(&r.dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: r.secs.clone(),
        };
        Session::open(store, Box::new(Recorder::default()), Box::new(clock))
    };
    assert!(
        hello.text.contains("too many wrong passwords"),
        "{}",
        hello.text
    );
    assert!(second.handle_line(pw).text.contains("not checked"));
    assert_eq!(
        std::fs::read_to_string(&failures).unwrap(),
        count,
        "not counted"
    );
    // Once the wait is over (the last failure at boot time 0), a good login clears it.
    std::fs::write(&failures, "3 0\n").unwrap();
    assert!(second.handle_line(pw).ok);
    // Cleared in place (under the lock, not unlinked: a console waiting for the lock
    // counts into the same file).
    assert_eq!(std::fs::read_to_string(&failures).unwrap(), "0 0\n");
    // A damaged count is no wait.
    std::fs::write(&failures, "\u{0}garbage").unwrap();
    r.restart();
    r.ok(pw);
}

#[test]
fn reboot_exit_save_pubkey() {
    let mut r = Rig::new();
    r.ok("discard");
    r.err("pubkey");
    r.ok("genkey");
    assert!(r.ok("pubkey").contains("candidate (after commit)"));
    r.err("save");
    assert!(r.err("exit").contains("uncommitted"));
    r.ok("reboot");
    r.ok("nope");
    r.ok("reboot");
    assert_eq!(r.ok("yes"), "rebooting");
    assert!(r.log.borrow().contains(&"reboot".to_string()));
    r.ok("commit");
    assert!(r.ok("save").contains("nothing to do"));
    assert!(r.s.handle_line("exit").exit);
    assert!(r.err("show peers").contains("no answer from the daemon"));
    assert!(r.log.borrow().contains(&"peers wg0".to_string()));
    assert!(r.ok("show status").contains("version: test"));
    r.ok("# a comment");
    r.err("frobnicate");
}

#[test]
fn diff_shows_section_context() {
    let old = "[Interface]\nListenPort = 1\n\n[Peer]\nPublicKey = A\nAllowedIPs = 10.0.0.2/32\n\n[Peer]\nPublicKey = B\nAllowedIPs = 10.0.0.3/32\n";
    let new = "[Interface]\nListenPort = 1\n\n[Peer]\nPublicKey = A\nAllowedIPs = 10.0.0.2/32\n\n[Peer]\nPublicKey = B\nAllowedIPs = 10.0.0.4/32\n";
    let d = diff(old, new);
    assert_eq!(
        d,
        "  [Peer]\n  PublicKey = B\n- AllowedIPs = 10.0.0.3/32\n+ AllowedIPs = 10.0.0.4/32\n"
    );
    assert_eq!(diff(old, old), "");
    assert_eq!(
        mask_secrets("[Interface]\nPrivateKey = abc\nListenPort = 1"),
        "[Interface]\nPrivateKey = (hidden)\nListenPort = 1\n"
    );
    assert_eq!(
        mask_secrets("+ PrivateKey = abc\n-  PresharedKey=x\n+ Endpoint = a:1"),
        "+ PrivateKey = (hidden)\n-  PresharedKey = (hidden)\n+ Endpoint = a:1\n"
    );
}

/// Seeded random command lines, built from real words, real values and junk: the session
/// never panics, and a command that fails leaves candidate and running as they were.
#[test]
fn random_commands_never_panic_and_failures_change_nothing() {
    let mut rng = crate::testutil::Rng(0x2545_f491_4f6c_dd1d);
    let mut next = move || rng.next();
    let peers = [peer_key(), peer_key()];
    let mut words: Vec<String> = [
        "set",
        "delete",
        "show",
        "commit",
        "compare",
        "discard",
        "rollback",
        "genkey",
        "pubkey",
        "help",
        "commit-confirm",
        "confirm",
        "save",
        "exit",
        "interface",
        "peer",
        "gateway",
        "system",
        "private-key",
        "listen-port",
        "address",
        "mtu",
        "fwmark",
        "allowed-ips",
        "endpoint",
        "persistent-keepalive",
        "preshared-key",
        "tcp-port",
        "cores",
        "offload",
        "io-uring",
        "tcp-listen",
        "uplink-address",
        "uplink-gateway",
        "interface-name",
        "buffers",
        "1",
        "0",
        "65536",
        "51820",
        "10.0.0.2/32",
        "10.0.0.0/8,fd00::/64",
        "0.0.0.0/0",
        "192.0.2.7:51820",
        "host.example:1",
        "on",
        "off",
        "gso",
        "0-3",
        "wg0",
        "-1",
        "",
        ",",
        "candidate",
        "private",
        "history",
        "status",
        "x/y",
        "[::1]:0",
        "0x10",
        "yes",
        "add",
        "client",
        "clients",
        "keep-key",
        "phone",
        "name",
        "lan",
        "lan-address",
        "proxy-arp",
        "public-endpoint",
        "client-dns",
        "192.0.2.1,fd00::1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    words.extend(peers.iter().cloned());
    let mut r = Rig::new();
    r.ok("commit");
    for _ in 0..3000 {
        let n = 1 + (next() % 6) as usize;
        let line: Vec<&str> = (0..n)
            .map(|_| words[(next() % words.len() as u64) as usize].as_str())
            .collect();
        let line = line.join(" ");
        let (cand, run) = (r.s.candidate().clone(), r.s.running().clone());
        let rep = r.s.handle_line(&line);
        if !rep.ok {
            assert_eq!(
                *r.s.candidate(),
                cand,
                "`{line}` failed but changed the candidate"
            );
            assert_eq!(*r.s.running(), run, "`{line}` failed but changed running");
        }
        if let Some(rep) = r.advance(next() % 30) {
            assert!(rep.ok, "{}", rep.text);
        }
    }
}

#[test]
fn a_commit_from_elsewhere_is_not_overwritten() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 1");
    r.ok("commit");
    // A second console on the same directory commits first.
    let mut other = Rig::open_at(&r.dir, &r.secs, &r.log);
    other.handle_line("set interface listen-port 2");
    assert!(other.handle_line("commit").ok);
    r.ok("set interface mtu 1400");
    assert!(r
        .err("commit")
        .contains("changed since this console loaded it"));
    assert_eq!(r.saved().interface.listen_port, Some(2));
    assert!(r.ok("discard").contains("reloaded"));
    assert_eq!(r.s.running().interface.listen_port, Some(2));
    r.ok("set interface mtu 1400");
    r.ok("commit");
    assert_eq!(r.saved().interface.mtu, Some(1400));
}

#[test]
fn commit_confirm_settled_by_another_console() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 1");
    r.ok("commit");
    r.ok("set interface listen-port 2");
    r.ok("commit-confirm 1");
    let mut other = Rig::open_at(&r.dir, &r.secs, &r.log);
    assert!(
        other.confirm_deadline().is_some(),
        "the second console resumes the deadline"
    );
    assert!(other.handle_line("confirm").ok);
    let rep = r.advance(61).expect("settles");
    assert!(rep.text.contains("another console"), "{}", rep.text);
    assert_eq!(r.saved().interface.listen_port, Some(2));
    assert!(r.s.confirm_deadline().is_none());
}

/// Two consoles (the serial line and the screen) editing at once: each has its own
/// candidate; the second commit is refused, names the console that committed, and says
/// what to do; nothing it had is lost until it `discard`s.
#[test]
fn two_consoles_editing_at_once() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 1");
    r.ok("commit");
    r.s = r.open_named("ttyS0");
    let mut tty1 = r.open_named("tty1");
    r.ok("set interface listen-port 2");
    assert!(tty1.handle_line("set interface mtu 1300").ok);
    r.ok("commit");
    r.secs.set(r.secs.get() + 90);
    let e = tty1.handle_line("commit");
    assert!(!e.ok);
    assert!(
        e.text.contains("console ttyS0 committed 1 min 30 s ago"),
        "{}",
        e.text
    );
    assert!(
        e.text.contains("`compare`") && e.text.contains("`discard`"),
        "{}",
        e.text
    );
    assert_eq!(r.saved().interface.listen_port, Some(2));
    assert_eq!(r.saved().interface.mtu, None);
    // Its edits are still there to review, against what it started from.
    assert!(!tty1.handle_line("compare").text.starts_with("no changes"));
    assert!(tty1.handle_line("discard").text.contains("reloaded"));
    assert_eq!(tty1.running().interface.listen_port, Some(2));
    assert!(tty1.handle_line("set interface mtu 1300").ok);
    assert!(tty1.handle_line("commit").ok);
    assert_eq!(r.saved().interface.mtu, Some(1300));
    assert_eq!(r.saved().interface.listen_port, Some(2));
    // A file changed by hand (no console's record matches it) is not blamed on one.
    r.ok("discard");
    r.ok("set interface listen-port 3");
    let mut by_hand = r.saved();
    by_hand.interface.listen_port = Some(9);
    let st = Store::new(&r.dir.0, TableFormat);
    st.save_text(&st.format.emit(&by_hand)).unwrap();
    let e = r.err("commit");
    assert!(e.contains("outside this console session"), "{e}");
}

/// A pending commit-confirm belongs to the console that made it: the other console sees
/// it (on opening and in `show status`), cannot commit over it, may `confirm` it, and the
/// owner is told; it is rolled back once, by its owner.
#[test]
fn commit_confirm_belongs_to_its_console() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 1");
    r.ok("commit");
    r.s = r.open_named("ttyS0");
    r.ok("set interface listen-port 2");
    r.ok("commit-confirm 1");
    let (mut tty1, hello) = {
        let store = Store::new(&r.dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: r.secs.clone(),
        };
        Session::open_as(
            store,
            Box::new(Recorder::default()),
            Box::new(clock),
            "tty1",
        )
    };
    assert!(
        hello
            .text
            .contains("commit-confirm made on ttyS0 is pending"),
        "{}",
        hello.text
    );
    assert!(tty1.confirm_deadline().is_none(), "not tty1's own");
    let st = tty1.handle_line("show status").text;
    assert!(
        st.contains("commit-confirm: pending, made on ttyS0, rolls back in 60 s"),
        "{st}"
    );
    assert!(r.ok("show status").contains("made on this console (ttyS0)"));
    assert!(tty1.handle_line("set interface mtu 1300").ok);
    let e = tty1.handle_line("commit");
    assert!(
        !e.ok && e.text.contains("commit-confirm made on ttyS0 is pending"),
        "{}",
        e.text
    );
    // Confirmed from tty1: ttyS0 is told at its next poll and rolls nothing back.
    tty1.handle_line("discard");
    let c = tty1.handle_line("confirm");
    assert!(c.ok && c.text.contains("made on ttyS0"), "{}", c.text);
    let told = r.advance(1).expect("told at once");
    assert!(
        told.text.contains("confirmed from another console (tty1)"),
        "{}",
        told.text
    );
    assert!(r.s.confirm_deadline().is_none());
    let reloads = r.reloads();
    assert!(r.advance(120).is_none());
    assert_eq!(r.reloads(), reloads, "nothing rolled back");
    assert_eq!(r.saved().interface.listen_port, Some(2));
    // Unconfirmed: the owner rolls back at the deadline, the other console does not again.
    r.ok("set interface listen-port 3");
    r.ok("commit-confirm 1");
    assert!(tty1.poll().is_none());
    let rb = r.advance(60).expect("rolls back");
    assert!(rb.text.contains("not confirmed in time"), "{}", rb.text);
    let reloads = r.reloads();
    r.secs.set(r.secs.get() + 30);
    assert!(tty1.poll().is_none(), "settled: nothing for tty1 to do");
    assert_eq!(r.reloads(), reloads);
    assert_eq!(r.saved().interface.listen_port, Some(2));
}

/// The owner's console is gone or stuck (a screen unplugged, a board without it after an
/// update): the other console rolls the commit-confirm back 10 s after the deadline, and
/// the owner, if it comes back, is told and does not roll back again.
#[test]
fn commit_confirm_backup_rollback_from_the_other_console() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 1");
    r.ok("commit");
    r.s = r.open_named("tty1");
    r.ok("set interface listen-port 2");
    r.ok("commit-confirm 1");
    let mut serial = r.open_named("ttyS0");
    r.secs.set(r.secs.get() + 60);
    assert!(serial.poll().is_none(), "the owner's turn first");
    r.secs.set(r.secs.get() + BACKUP_GRACE_SECS as u64 + 1);
    let rb = serial.poll().expect("backup rollback");
    assert!(
        rb.ok && rb.text.contains("made on tty1 was not confirmed in time"),
        "{}",
        rb.text
    );
    assert_eq!(r.saved().interface.listen_port, Some(1));
    assert_eq!(serial.running().interface.listen_port, Some(1));
    let reloads = r.reloads();
    let told = r.s.poll().expect("owner told");
    assert!(
        told.text
            .contains("rolled back from another console (ttyS0)"),
        "{}",
        told.text
    );
    assert_eq!(r.reloads(), reloads, "rolled back once");
    assert_eq!(r.s.running().interface.listen_port, Some(1));
    assert!(r.s.confirm_deadline().is_none());
    // The owner's commit now starts from the rolled-back configuration.
    r.ok("set interface listen-port 5");
    r.ok("commit");
    assert_eq!(r.saved().interface.listen_port, Some(5));
}

/// The password fails closed: an empty, non-text or unreadable password file, or a perm
/// that did not mount, keeps the console locked. Every command is refused and nothing
/// changes, the message names failsafe mode, and a pending commit-confirm still rolls
/// back on time.
#[test]
fn password_fails_closed() {
    let mut r = Rig::new();
    r.ok("genkey");
    r.ok("set interface listen-port 1000");
    r.ok("commit");
    let pw = r.dir.0.join(crate::console::store::PASSWD);
    for bytes in [&b""[..], b" \n", b"\xff\xfe\xfd\n", b"garbage\n"] {
        std::fs::write(&pw, bytes).unwrap();
        r.restart();
        assert_eq!(r.s.prompt(), "locked> ", "{bytes:?}");
        for l in [
            "show",
            "correct horse battery",
            "delete system console-password",
            "set system console-password",
            "set interface listen-port 7",
            "factory-reset",
            "yes",
        ] {
            let e = r.err(l);
            assert!(
                e.contains("console locked") && e.contains("failsafe"),
                "{l}: {e}"
            );
        }
        assert_eq!(std::fs::read(&pw).unwrap(), bytes, "password file changed");
        assert_eq!(r.saved().interface.listen_port, Some(1000));
    }
    // A read error (the name is a directory) locks too.
    std::fs::remove_file(&pw).unwrap();
    std::fs::create_dir(&pw).unwrap();
    r.restart();
    assert!(r.err("show").contains("cannot read"));
    std::fs::remove_dir(&pw).unwrap();
    // Missing on a mounted perm: no password.
    r.restart();
    assert_eq!(r.s.prompt(), "riceguard# ");
    // A commit-confirm pending while the console is locked still rolls back in time.
    r.ok("set interface listen-port 2000");
    r.ok("commit-confirm 1");
    std::fs::write(&pw, b"").unwrap();
    r.restart();
    assert_eq!(r.s.prompt(), "locked> ");
    assert!(r.advance(59).is_none());
    assert!(r.advance(1).expect("rollback while locked").ok);
    assert_eq!(r.saved().interface.listen_port, Some(1000));
    std::fs::remove_file(&pw).unwrap();

    // perm not mounted (init's --perm-unmounted): locked although no file exists.
    let store = Store::new(&r.dir.0, Box::new(TableFormat) as Box<dyn Format>).perm_unmounted();
    let clock = FakeClock {
        base: Instant::now(),
        secs: r.secs.clone(),
    };
    let (mut s, hello) = Session::open(store, Box::<Recorder>::default(), Box::new(clock));
    assert!(
        hello.text.contains("not mounted") && hello.text.contains("failsafe"),
        "{}",
        hello.text
    );
    assert_eq!(s.prompt(), "locked> ");
    assert!(!s.handle_line("show").ok);
}

/// A long update does not hold up the console: it runs as a background job, the
/// commit-confirm deadline fires on time meanwhile, the job's report arrives when it ends,
/// and a second update is refused while one runs.
#[test]
fn commit_confirm_fires_on_time_during_an_update() {
    let dir = TempDir::new("job");
    let secs = Rc::new(Cell::new(0));
    let job = FakeJob::default();
    let hooks = Recorder {
        daemon: true,
        job: job.clone(),
        ..Recorder::default()
    };
    let store = Store::new(&dir.0, Box::new(TableFormat) as Box<dyn Format>);
    let clock = FakeClock {
        base: Instant::now(),
        secs: secs.clone(),
    };
    let (mut s, _) = Session::open(store, Box::new(hooks), Box::new(clock));
    let ok = |s: &mut Session, l: &str| {
        let r = s.handle_line(l);
        assert!(r.ok, "{l}: {}", r.text);
        r.text
    };
    ok(&mut s, "genkey");
    ok(&mut s, "set interface listen-port 1000");
    ok(&mut s, "commit");
    ok(&mut s, "set interface listen-port 2000");
    ok(&mut s, "commit-confirm 1");
    let t = ok(&mut s, "update http://192.0.2.1/v2.bundle allow-downgrade");
    assert!(t.contains("started in the background"), "{t}");
    let again = s.handle_line("update http://192.0.2.1/v3.bundle");
    assert!(
        !again.ok && again.text.contains("still running"),
        "{}",
        again.text
    );
    assert!(!s.handle_line("rollback-slot").ok);
    assert!(s.handle_line("reboot").text.contains("rebooting stops it"));
    ok(&mut s, "no");
    secs.set(59);
    assert!(s.poll().is_none());
    secs.set(60);
    let rb = s.poll().expect("rollback on time while the update runs");
    assert!(rb.ok && rb.text.contains("restored"), "{}", rb.text);
    assert_eq!(s.running().interface.listen_port, Some(1000));
    assert!(s.job_running().is_some());
    // The update ends: its report comes through poll, once.
    job.borrow_mut().as_mut().unwrap().1 = Some(JobReport {
        text: "update: installed v2 into slot b".into(),
        ok: true,
    });
    let r = s.poll().expect("job report");
    assert_eq!(r.text, "update: installed v2 into slot b");
    assert!(s.poll().is_none() && s.job_running().is_none());
    ok(&mut s, "update /dev/vdb");
}

fn set_uplink(r: &Rig, addrs: &[&str]) {
    set_uplink_dns(r, addrs, &[]);
}

/// The uplink with addresses and the resolvers of its DHCP lease.
fn set_uplink_dns(r: &Rig, addrs: &[&str], dns: &[&str]) {
    *r.uplink.borrow_mut() = Some(Uplink {
        name: "eth0".into(),
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        dns: dns.iter().map(|a| a.parse().unwrap()).collect(),
        in_use: Vec::new(),
    });
}

/// The configuration between the marker lines of client `name`, and the lines after.
fn cut(out: &str, name: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = out.lines().collect();
    let b = lines
        .iter()
        .position(|l| *l == format!("----- BEGIN WIREGUARD CONFIG {name} -----"))
        .unwrap_or_else(|| panic!("no BEGIN line: {out}"));
    let e = lines
        .iter()
        .position(|l| *l == format!("----- END WIREGUARD CONFIG {name} -----"))
        .unwrap_or_else(|| panic!("no END line: {out}"));
    let conf = lines[b + 1..e].join("\n") + "\n";
    (conf, lines[e + 1..].iter().map(|l| l.to_string()).collect())
}

/// The QR code right after the END line: equal-width lines of half blocks only, as many
/// as the module count plus the quiet zone needs.
fn check_qr(after: &[String], conf: &str) {
    use crate::console::qr;
    let (w, _) = qr::size(conf).unwrap();
    let side = w + 2 * qr::QUIET;
    let n = side.div_ceil(2);
    assert!(after.len() >= n, "QR code cut short");
    for l in &after[..n] {
        assert_eq!(l.chars().count(), side, "{l}");
        assert!(
            l.chars()
                .all(|c| [qr::FULL, qr::UPPER, qr::LOWER, qr::NONE].contains(&c)),
            "{l}"
        );
    }
    assert_eq!(after[..n].join("\n") + "\n", qr::render(conf).unwrap());
    assert!(
        !matches!(after.get(n), Some(l) if l.starts_with(qr::FULL)),
        "more QR lines than expected"
    );
}

#[test]
fn gateway_and_peer_name_set_forms() {
    let mut r = Rig::new();
    r.ok("set gateway lan eth1");
    r.ok("set gateway lan-address 192.168.50.1/24");
    r.ok("set gateway lan-address 192.168.50.1/24,fd50::1/64");
    r.ok("set gateway proxy-arp off");
    r.ok("set gateway public-endpoint vpn.example.net:51820");
    r.ok("set gateway client-dns 192.168.50.1,fd50::1");
    let g = r.s.candidate().gateway.clone();
    assert_eq!(g.lan, "eth1");
    assert_eq!(g.lan_addresses.len(), 2, "added, not repeated");
    assert!(!g.proxy_arp);
    assert_eq!(
        g.public_endpoint
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("vpn.example.net:51820")
    );
    assert_eq!(g.client_dns.len(), 2);
    r.ok("set gateway client-dns 9.9.9.9");
    assert_eq!(
        r.s.candidate().gateway.client_dns,
        vec!["9.9.9.9".parse::<std::net::IpAddr>().unwrap()],
        "client-dns replaces the list"
    );
    // Bad values: a clear error, nothing changes.
    let cand = r.s.candidate().clone();
    for (line, says) in [
        ("set gateway lan eth/1", "not a valid LAN interface name"),
        (
            "set gateway lan-address 192.168.50.300/24",
            "expected an address with its prefix",
        ),
        ("set gateway proxy-arp maybe", "on or off"),
        ("set gateway public-endpoint vpn.example.net", "HOST:PORT"),
        ("set gateway public-endpoint 1.2.3.4:0", "HOST:PORT"),
        ("set gateway client-dns 1.2.3.4,1.2.3.4", "listed twice"),
        ("set gateway client-dns 1.2.3.4,nine", "IP address"),
        ("set gateway client-dns", "needs a value"),
        ("set gateway uplink eth1", "is the uplink too"),
    ] {
        let e = r.err(line);
        assert!(e.contains(says), "{line}: {e}");
        assert_eq!(*r.s.candidate(), cand, "{line} changed the candidate");
    }
    // Peer names.
    let (a, b) = (peer_key(), peer_key());
    r.ok(&format!("set peer {a} allowed-ips 10.0.0.2/32"));
    r.ok(&format!("set peer {a} name phone"));
    r.ok(&format!("set peer {b} allowed-ips 10.0.0.3/32"));
    let e = r.err(&format!("set peer {b} name phone"));
    assert!(e.contains("two peers are named phone"), "{e}");
    let e = r.err(&format!("set peer {b} name .hidden"));
    assert!(e.contains("not a valid peer name"), "{e}");
    assert_eq!(r.s.candidate().peers[1].name, None);
    r.ok(&format!("set peer {b} name laptop"));
    r.ok(&format!("delete peer {b} name"));
    assert_eq!(r.s.candidate().peers[1].name, None);
    assert!(r.err(&format!("delete peer {b} name")).contains("not set"));
    r.ok("commit");
    assert_eq!(r.saved().gateway.lan, "eth1");
    assert_eq!(r.saved().peers[0].name.as_deref(), Some("phone"));
    // Delete forms go back to the defaults.
    for f in [
        "lan",
        "lan-address",
        "proxy-arp",
        "public-endpoint",
        "client-dns",
    ] {
        r.ok(&format!("delete gateway {f}"));
    }
    let d = crate::core::config::GatewayConfig::default();
    let g = &r.s.candidate().gateway;
    assert_eq!(
        (
            &g.lan,
            &g.lan_addresses,
            g.proxy_arp,
            &g.public_endpoint,
            &g.client_dns
        ),
        (
            &d.lan,
            &d.lan_addresses,
            d.proxy_arp,
            &d.public_endpoint,
            &d.client_dns
        )
    );
    assert!(r.err("delete gateway lan eth1").contains("takes no value"));
    let h = r.ok("help set");
    for f in [
        "lan-address",
        "proxy-arp",
        "public-endpoint",
        "client-dns",
        "name NAME",
    ] {
        assert!(h.contains(f), "{f}");
    }
    assert!(r.ok("help delete").contains("delete client NAME"));
    assert!(r.ok("help add").contains("keep-key"));
    assert!(r
        .ok("help")
        .contains("add client NAME [full-tunnel] [keep-key]"));
}

#[test]
fn add_client_prints_config_and_qr_and_needs_commit() {
    let mut r = Rig::new();
    set_uplink(&r, &["192.0.2.10/24", "fe80::5/64"]);
    r.ok("set interface listen-port 51820");
    r.ok("set interface address 10.100.0.1/24");
    r.ok("set gateway client-dns 192.0.2.1");
    r.ok("commit");
    let gw_pub = r.s.running().interface.private_key.unwrap().public();
    let out = r.ok("add client phone");
    assert!(out.contains("address 10.100.0.2/32"), "{out}");
    assert!(out.contains("`commit` to apply"), "{out}");
    assert!(out.contains("shown once and not stored"), "{out}");
    assert!(r.log.borrow().contains(&"uplink ".to_string()));
    let (conf, after) = cut(&out, "phone");
    check_qr(&after, &conf);
    let c = crate::core::ini::parse("phone", &conf).unwrap();
    let k = c.interface.private_key.unwrap();
    assert_eq!(
        c.interface.addresses,
        vec!["10.100.0.2/32".parse().unwrap()]
    );
    assert_eq!(c.peers[0].public_key, gw_pub);
    assert_eq!(
        c.peers[0].endpoint.as_ref().unwrap().to_string(),
        "192.0.2.10:51820"
    );
    assert_eq!(
        c.peers[0]
            .allowed_ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.100.0.0/24", "192.0.2.0/24"]
    );
    assert!(conf.contains("\nDNS = 192.0.2.1\n"));
    // Only in the candidate until commit.
    assert_eq!(r.s.running().peers.len(), 0);
    let p = &r.s.candidate().peers[0];
    assert_eq!(p.name.as_deref(), Some("phone"));
    assert_eq!(p.public_key, k.public());
    assert_eq!(p.preshared_key, c.peers[0].preshared_key);
    assert!(r.ok("show clients").contains("not committed yet"));
    r.ok("commit");
    assert_eq!(r.saved().peers[0].name.as_deref(), Some("phone"));
    // The next one gets the next address.
    let out2 = r.ok("add client laptop");
    assert!(out2.contains("address 10.100.0.3/32"), "{out2}");
    r.ok("discard");
    // Reprint: no private key (not kept), same everything else.
    let again = r.ok("show client phone");
    let (conf2, after2) = cut(&again, "phone");
    check_qr(&after2, &conf2);
    assert_eq!(
        conf2.replace(crate::console::vpn_client::NOT_STORED, &k.to_base64()),
        conf
    );
    assert!(again.contains("was not kept"), "{again}");
    let l = r.ok("show clients");
    assert!(
        l.contains("phone") && l.contains("10.100.0.2/32") && l.contains("not kept"),
        "{l}"
    );
    assert!(!l.contains("not committed"), "{l}");
    assert!(r
        .err("show client nobody")
        .contains("no client named nobody"));
    // Deleting the client by name.
    r.ok("delete client phone");
    assert!(r.s.candidate().peers.is_empty());
    assert!(r.err("delete client phone").contains("no client named"));
    r.ok("commit");
    assert!(r.saved().peers.is_empty());
}

#[test]
fn add_client_keep_key_stores_it_from_commit_until_deleted() {
    let mut r = Rig::new();
    set_uplink(&r, &["203.0.113.5/24"]);
    r.ok("set interface listen-port 51820");
    r.ok("set interface address 10.100.0.1/24,fd10::1/64");
    r.ok("commit");
    let out = r.ok("add client tablet keep-key");
    assert!(out.contains("kept"), "{out}");
    let (conf, _) = cut(&out, "tablet");
    let k = crate::core::ini::parse("t", &conf)
        .unwrap()
        .interface
        .private_key
        .unwrap();
    assert!(
        conf.contains("Address = 10.100.0.2/32, fd10::2/128\n"),
        "{conf}"
    );
    let path = r.dir.0.join("clients").join("tablet.key");
    assert!(!path.exists(), "stored before commit");
    // Before the commit the key is reprinted from memory.
    assert!(r.ok("show client tablet").contains(&k.to_base64()));
    let c = r.ok("commit");
    assert!(c.contains("kept the private key of client tablet"), "{c}");
    {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(m & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", k.to_base64())
        );
    }
    // A new console reprints it from the file: the same configuration.
    r.restart();
    let again = r.ok("show client tablet");
    assert_eq!(cut(&again, "tablet").0, conf);
    assert!(r.ok("show clients").contains("kept"));
    // Deleted: the key goes at commit.
    r.ok("delete client tablet");
    assert!(path.exists());
    let c = r.ok("commit");
    assert!(c.contains("removed the kept private key"), "{c}");
    assert!(!path.exists());
    // keep-key, then discard: nothing stored at the next commit.
    r.ok("add client tablet keep-key");
    r.ok("discard");
    r.ok("set interface mtu 1400");
    r.ok("commit");
    assert!(!path.exists());
    // keep-key under commit-confirm: removed again when it rolls back.
    r.ok("add client tablet keep-key");
    r.ok("commit-confirm 1");
    assert!(path.exists());
    let rb = r.advance(60).expect("rollback");
    assert!(
        rb.text.contains("removed the kept private key"),
        "{}",
        rb.text
    );
    assert!(!path.exists());
    assert!(r.s.running().peers.is_empty());
}

#[test]
fn add_client_errors_change_nothing() {
    let mut r = Rig::new();
    r.ok("set interface listen-port 51820");
    r.ok("commit");
    let check = |r: &mut Rig, line: &str, says: &str| {
        let cand = r.s.candidate().clone();
        let e = r.err(line);
        assert!(e.contains(says), "{line}: {e}");
        assert_eq!(*r.s.candidate(), cand, "{line} changed the candidate");
        assert!(!r.dir.0.join("clients").exists());
    };
    // No [Interface] Address.
    set_uplink(&r, &["192.0.2.10/24"]);
    check(&mut r, "add client phone keep-key", "set interface address");
    r.ok("set interface address 10.9.0.1/30");
    // Invalid names, and the usage.
    check(&mut r, "add client -phone", "not a valid client name");
    check(&mut r, "add client a/b", "not a valid client name");
    check(
        &mut r,
        &format!("add client {}", "x".repeat(33)),
        "not a valid client name",
    );
    check(&mut r, "add client", "usage: add client NAME");
    check(&mut r, "add client phone now", "keep-key");
    check(&mut r, "add phone", "expected one of client");
    // No usable endpoint: the uplink unknown or without an address, no public endpoint.
    *r.uplink.borrow_mut() = None;
    check(&mut r, "add client phone", "public-endpoint");
    set_uplink(&r, &["fe80::1/64"]);
    check(&mut r, "add client phone", "public-endpoint");
    // A public endpoint is enough.
    r.ok("set gateway public-endpoint vpn.example.net:443");
    r.ok("add client phone");
    // Name in use; no free address left in the /30.
    check(&mut r, "add client phone", "already a client");
    check(
        &mut r,
        "add client laptop",
        "no free address left in 10.9.0.0/30",
    );
    // No private key.
    r.ok("delete client phone");
    r.ok("delete interface private-key");
    check(&mut r, "add client laptop", "no private key");
    r.ok("discard");
    assert!(r.s.candidate().peers.is_empty());
}

#[test]
fn full_tunnel_clients_and_disable_enable() {
    let mut r = Rig::new();
    set_uplink_dns(&r, &["192.168.1.20/24"], &["192.168.1.1"]);
    r.ok("set interface listen-port 51820");
    r.ok("set interface address 10.100.0.1/24");
    r.ok("commit");
    let out = r.ok("add client phone full-tunnel");
    assert!(out.contains("full tunnel"), "{out}");
    let (conf, after) = cut(&out, "phone");
    check_qr(&after, &conf);
    assert!(conf.contains("\nAllowedIPs = 0.0.0.0/0, ::/0\n"), "{conf}");
    assert!(
        conf.contains("\nDNS = 10.100.0.1\n"),
        "the resolver on the box, not the lease's: {conf}"
    );
    assert!(conf.contains("IPv6 is blocked"), "{conf}");
    // The gateway's peer is a split-tunnel client's.
    let p = r.s.candidate().peers[0].clone();
    assert_eq!(p.allowed_ips, vec!["10.100.0.2/32".parse().unwrap()]);
    r.ok("commit");
    let split = r.ok("show client phone");
    assert!(
        split.contains("AllowedIPs = 10.100.0.0/24, 192.168.1.0/24"),
        "{split}"
    );
    let full = r.ok("show client phone full-tunnel");
    assert!(full.contains("AllowedIPs = 0.0.0.0/0, ::/0"), "{full}");
    // keep-key in either order.
    let out = r.ok("add client tab keep-key full-tunnel");
    let (tab_conf, _) = cut(&out, "tab");
    let tab_key = crate::core::ini::parse("tab", &tab_conf)
        .unwrap()
        .interface
        .private_key
        .unwrap();
    r.ok("commit");
    let key_file = r.dir.0.join("clients").join("tab.key");
    assert!(key_file.exists());

    // Disable: only Enabled changes, the kept key stays, `commit` applies it.
    let before = r.s.candidate().clone();
    let t = r.ok("disable client tab");
    assert!(t.contains("disabled") && t.contains("`commit`"), "{t}");
    let mut want = before.clone();
    want.peers[1].enabled = false;
    assert_eq!(*r.s.candidate(), want);
    let l = r.ok("show clients");
    let tab_line = l.lines().find(|l| l.starts_with("tab")).unwrap();
    assert!(
        tab_line.contains("disabled") && tab_line.contains("not committed"),
        "{l}"
    );
    let reloads = r.reloads();
    r.ok("commit");
    assert_eq!(r.reloads(), reloads + 1);
    assert!(!r.saved().peers[1].enabled);
    assert!(key_file.exists(), "a disabled client keeps its kept key");
    let l = r.ok("show clients");
    let tab_line = l.lines().find(|l| l.starts_with("tab")).unwrap();
    assert!(
        tab_line.contains("disabled") && !tab_line.contains("not committed"),
        "{l}"
    );
    let shown = r.ok("show client tab");
    assert!(shown.contains(&tab_key.to_base64()), "{shown}");
    assert!(shown.contains("is disabled"), "{shown}");
    assert!(r.ok("disable client tab").contains("already disabled"));
    // Its address and name stay taken.
    let out = r.ok("add client laptop");
    assert!(out.contains("address 10.100.0.4/32"), "{out}");
    r.err("add client tab");
    r.ok("discard");
    // Bad input: an error, nothing changed.
    let cand = r.s.candidate().clone();
    assert!(r.err("disable client nobody").contains("no client named"));
    assert!(r.err("enable client").contains("usage"));
    assert!(r.err("disable client -x").contains("not a valid"));
    assert!(r
        .err("add client x full-tunnel full-tunnel")
        .contains("twice"));
    assert_eq!(*r.s.candidate(), cand);
    r.ok("enable client tab");
    r.ok("commit");
    assert!(r.saved().peers[1].enabled);
    assert!(key_file.exists());
}

/// A session on the real INI format (the tests above use the table format).
fn ini_session(dir: &TempDir) -> (Session, Reply) {
    ini_session_clocked(dir, &Rc::new(Cell::new(0)))
}

/// [`ini_session`] with a clock the test moves.
fn ini_session_clocked(dir: &TempDir, secs: &Rc<Cell<u64>>) -> (Session, Reply) {
    let store = Store::new(
        &dir.0,
        Box::new(crate::console::store::Ini) as Box<dyn Format>,
    );
    let clock = FakeClock {
        base: Instant::now(),
        secs: secs.clone(),
    };
    let hooks = Recorder {
        daemon: true,
        ..Recorder::default()
    };
    Session::open(store, Box::new(hooks), Box::new(clock))
}

#[test]
fn ignored_wg_quick_lines_are_shown_and_dropped_at_commit() {
    let dir = TempDir::new("session-notes");
    let k = Key::generate_private(&mut rand_core::OsRng).to_base64();
    std::fs::write(
        dir.0.join("riceguard.conf"),
        format!(
            "[Interface]\nPrivateKey = {k}\nListenPort = 51820\nPostUp = iptables -t nat -A POSTROUTING -j MASQUERADE\nSaveConfig = true\n"
        ),
    )
    .unwrap();
    let (mut s, hello) = ini_session(&dir);
    assert!(hello.text.contains("2 line(s)"), "{}", hello.text);
    let shown = s.handle_line("show").text;
    let first: Vec<&str> = shown.lines().take(3).collect();
    assert!(first[0].starts_with("# warning:"), "{shown}");
    assert!(first[1].contains("line 4: PostUp: ignored"), "{shown}");
    assert!(first[2].contains("line 5: SaveConfig"), "{shown}");
    assert!(s.handle_line("show candidate").text.contains("# warning:"));
    // Nothing edited, yet `commit` rewrites the file without them, and says which went.
    let c = s.handle_line("commit");
    assert!(c.ok, "{}", c.text);
    assert!(
        c.text.contains("without the lines") && c.text.contains("line 4: PostUp"),
        "{}",
        c.text
    );
    let saved = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(
        !saved.contains("PostUp") && !saved.contains("SaveConfig"),
        "{saved}"
    );
    assert!(!s.handle_line("show").text.contains("warning"));
    assert_eq!(s.handle_line("commit").text, "no changes to commit");
    // `Table = off` is refused: the console falls back and says why.
    std::fs::write(
        dir.0.join("riceguard.conf"),
        format!("[Interface]\nPrivateKey = {k}\nTable = off\n"),
    )
    .unwrap();
    let (_, hello) = ini_session(&dir);
    assert!(
        hello.text.contains("Table = off") && hello.text.contains("using saved version 1"),
        "{}",
        hello.text
    );
}

/// Schema-2 settings are saved on `#+` lines (older firmware reads the file without
/// them), shown plainly, and the commit says what older firmware would not run.
#[test]
fn schema2_settings_are_saved_for_older_firmware_too() {
    let dir = TempDir::new("session-schema2");
    let (mut s, _) = ini_session(&dir);
    let pk = peer_key();
    for l in [
        "set interface listen-port 51820",
        &format!("set peer {pk} allowed-ips 10.100.0.2/32"),
        &format!("set peer {pk} name phone"),
    ] {
        assert!(s.handle_line(l).ok, "{l}");
    }
    let c = s.handle_line("commit").text;
    assert!(!c.contains("schema 2"), "nothing new yet: {c}");
    let v1 = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(!v1.contains("#+"), "{v1}");
    assert!(s.handle_line("set gateway firewall off").ok);
    assert!(s.handle_line("disable client phone").ok);
    let d = s.handle_line("compare").text;
    assert!(
        d.contains("+ Firewall = off") && d.contains("+ Enabled = off"),
        "{d}"
    );
    let c = s.handle_line("commit");
    assert!(c.ok, "{}", c.text);
    assert!(
        c.text.contains("schema 2") && c.text.contains("Firewall = off; peer phone disabled"),
        "{}",
        c.text
    );
    let saved = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(saved.contains("\n#+ Firewall = off\n"), "{saved}");
    assert!(saved.contains("\n#+ Enabled = off\n"), "{saved}");
    let old = crate::core::ini::parse_as_schema1("riceguard.conf", &saved).unwrap();
    assert!(old.peers.is_empty() && old.validate().is_ok());
    let shown = s.handle_line("show").text;
    assert!(
        shown.contains("\nFirewall = off") && !shown.contains("#+"),
        "{shown}"
    );
    // A new console reads it back whole.
    let (s2, hello) = ini_session(&dir);
    assert!(!hello.text.contains("warning"), "{}", hello.text);
    assert_eq!(s2.running(), s.running());
}

/// SSH keys are configuration: `set system ssh-key` edits the candidate, `commit` saves
/// them on `#4+` lines (the previous firmware, schema 3, reads the file without them), and
/// `delete system ssh-key` takes one out again; bad keys and names are refused, nothing
/// changed.
#[test]
fn ssh_keys_go_through_commit() {
    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC alice@laptop";
    let dir = TempDir::new("session-ssh-keys");
    let (mut s, _) = ini_session(&dir);
    assert!(s.handle_line("set interface listen-port 51820").ok);
    assert!(s.handle_line("commit").ok);
    let r = s.handle_line(&format!("set system ssh-key alice {ED}"));
    assert!(r.ok, "{}", r.text);
    assert!(
        r.text.contains("SSH key alice added: SHA256:PE4HyEn8ydoD8aTPUT2oLz0Bb9xqXZkJGkFKW+UiJps (ED25519 (256 bits))")
            && r.text.contains("the first key"),
        "{}",
        r.text
    );
    // Not yet saved: it is an edit of the candidate.
    let before = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(!before.contains("SshKey ="), "{before}");
    assert!(s
        .handle_line("compare")
        .text
        .contains(&format!("+ SshKey = alice {ED}")));
    // The same key under a second name, a bad key, a bad name, a port taken.
    for (line, want) in [
        (
            format!("set system ssh-key bob {ED}"),
            "already set as alice",
        ),
        (
            "set system ssh-key bob ssh-rsa AAAA".to_string(),
            "SSH public key",
        ),
        (format!("set system ssh-key -x {ED}"), "a key name"),
        (
            "set system ssh-key bob".to_string(),
            "needs a name and the key",
        ),
        (
            "set gateway ssh-port 51820".to_string(),
            "SshPort 51820 is the ListenPort port",
        ),
        (
            "delete system ssh-key carol".to_string(),
            "no SSH key named carol: set are alice",
        ),
    ] {
        let r = s.handle_line(&line);
        assert!(!r.ok && r.text.contains(want), "{line}: {}", r.text);
    }
    assert!(s.handle_line("set gateway ssh-port 2222").ok);
    let r = s.handle_line("commit");
    assert!(r.ok, "{}", r.text);
    let saved = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(
        saved.contains(&format!("\n#4+ SshKey = alice {ED}\n")),
        "{saved}"
    );
    assert!(saved.contains("\n#4+ SshPort = 2222\n"), "{saved}");
    let three = crate::core::ini::parse_as_schema(3, "riceguard.conf", &saved).unwrap();
    assert!(three.gateway.ssh_keys.is_empty() && three.validate().is_ok());
    assert_eq!(s.running().gateway.ssh_keys.len(), 1);
    let st = s.handle_line("show status").text;
    assert!(
        st.contains("\nssh: port 2222 (") && st.contains("keys alice; host key not made yet"),
        "{st}"
    );
    crate::perm::ssh_host_key::write(&dir.0, &[3; 32]).unwrap();
    let fp = crate::perm::ssh_host_key::fingerprint(&[3; 32]);
    assert!(s
        .handle_line("show status")
        .text
        .contains(&format!("host key {fp} (ED25519)")));
    // A new console reads it back whole; then the key goes again.
    let (mut s2, _) = ini_session(&dir);
    assert_eq!(s2.running(), s.running());
    let r = s2.handle_line("delete system ssh-key alice");
    assert!(r.ok && r.text.contains("it was the last"), "{}", r.text);
    assert!(s2.handle_line("commit").ok);
    assert!(s2
        .handle_line("show status")
        .text
        .contains("\nssh: off (no SSH key set"));
    let saved = std::fs::read_to_string(dir.0.join("riceguard.conf")).unwrap();
    assert!(!saved.contains("SshKey ="), "{saved}");
}

/// Over SSH a plain commit that changes what the session depends on is refused with
/// "use commit-confirm N"; commit-confirm goes through; the last key and factory-reset
/// are the serial console's.
#[test]
fn no_remote_lock_out() {
    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC alice@laptop";
    let mut r = Rig::new();
    let pk = peer_key();
    r.ok("set interface listen-port 51820");
    r.ok("set interface address 10.100.0.1/24");
    r.ok(&format!("set peer {pk} allowed-ips 10.100.0.2/32"));
    r.ok(&format!("set peer {pk} name laptop"));
    r.ok("commit");
    r.ok(&format!("set system ssh-key alice {ED}"));
    r.ok("commit");
    // The same directory, as a console serving alice's session from the laptop.
    let mut s = r.open_named("ssh-7:alice");
    s.set_remote(crate::console::remote::Remote {
        key_name: "alice".into(),
        source: "10.100.0.2".parse().unwrap(),
    });
    let say = |s: &mut Session, l: &str| s.handle_line(l);
    assert!(say(&mut s, "set gateway client-dns 192.168.1.1").ok);
    let c = say(&mut s, "commit");
    assert!(c.ok, "an unrelated change commits plainly: {}", c.text);
    assert!(say(&mut s, "disable client laptop").ok);
    let c = say(&mut s, "commit");
    assert!(
        !c.ok
            && c.text.contains("disables this session's peer laptop")
            && c.text.contains("use `commit-confirm N`"),
        "{}",
        c.text
    );
    assert!(r.saved().peers.iter().all(|p| p.enabled), "nothing saved");
    let c = say(&mut s, "commit-confirm 2");
    assert!(c.ok, "{}", c.text);
    assert!(!r.saved().peers[0].enabled);
    assert!(say(&mut s, "confirm").ok);
    let d = say(&mut s, "delete system ssh-key alice");
    assert!(!d.ok && d.text.contains("the last SSH key"), "{}", d.text);
    let f = say(&mut s, "factory-reset");
    assert!(!f.ok && f.text.contains("serial console"), "{}", f.text);
    // `rollback N` to the version before the key: refused at commit, commit-confirm too.
    let rb = say(&mut s, "rollback 3");
    assert!(rb.ok, "{}", rb.text);
    for cmd in ["commit", "commit-confirm 1"] {
        let c = say(&mut s, cmd);
        assert!(
            !c.ok && c.text.contains("last SSH key"),
            "{cmd}: {}",
            c.text
        );
    }
    // The serial console may.
    r.ok("delete system ssh-key alice");
    r.ok("discard");
}

/// A session on the real INI format whose clock the test moves.
fn ini_session_at(dir: &TempDir, secs: &Rc<Cell<u64>>) -> Session {
    ini_session_clocked(dir, secs).0
}

/// Export on one box, import on a freshly set-up one: `commit` makes it the same box
/// (the configuration byte for byte, the private key, kept client keys, the console
/// password, the SSH host key); a wrong passphrase or an altered text changes nothing;
/// a commit-confirm of an import that rolls back puts the old password and host key back.
#[test]
fn export_then_import_restores_the_box() {
    use crate::perm::ssh_host_key;
    let a = TempDir::new("export-a");
    let (mut s, _) = ini_session(&a);
    for l in [
        "set interface listen-port 51820",
        "set interface address 10.100.0.1/24",
        "set gateway public-endpoint vpn.example.net:51820",
        "add client phone keep-key",
        "commit",
        "set system console-password",
        "a console password",
        "a console password",
    ] {
        let r = s.handle_line(l);
        assert!(r.ok, "{l}: {}", r.text);
    }
    ssh_host_key::write(&a.0, &[4; 32]).unwrap();
    assert!(s.handle_line("export configuration").ok);
    assert!(!s.handle_line("too short").ok, "12 characters at least");
    assert!(s.handle_line("export configuration").ok);
    assert!(s.secret_input());
    assert!(s.handle_line("twelve chars or more").ok);
    let r = s.handle_line("twelve chars or more");
    assert!(r.ok, "{}", r.text);
    let armour: Vec<&str> = r
        .text
        .lines()
        .take_while(|l| !l.starts_with("exported:"))
        .collect();
    assert_eq!(armour[0], "-----BEGIN AGE ENCRYPTED FILE-----");
    assert_eq!(*armour.last().unwrap(), "-----END AGE ENCRYPTED FILE-----");
    assert!(
        r.text
            .contains("1 kept client key(s), the console password, the SSH host key"),
        "{}",
        r.text
    );
    // What the key derivation cost, with this process's peak memory (at least scrypt's).
    let peak: u64 = r
        .text
        .split("key derivation: scrypt 2^16 (64 MiB); this console's peak memory: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", r.text));
    assert!(peak >= 64, "{peak} MiB");
    let saved_a = std::fs::read_to_string(a.0.join("riceguard.conf")).unwrap();

    let b = TempDir::new("export-b");
    let secs = Rc::new(Cell::new(0));
    let mut t = ini_session_at(&b, &secs);
    assert!(t.handle_line("commit").ok, "a fresh box's first commit");
    ssh_host_key::write(&b.0, &[5; 32]).unwrap();
    let feed = |t: &mut Session, pass: &str| {
        assert!(t.handle_line("import configuration").ok);
        for l in &armour {
            assert!(t.handle_line(l).ok, "{l}");
        }
        assert!(t.secret_input());
        t.handle_line(pass)
    };
    let before = t.candidate.clone();
    let r = feed(&mut t, "not the passphrase");
    assert!(!r.ok && r.text.contains("nothing changed"), "{}", r.text);
    assert_eq!(t.candidate, before);
    // An altered line: refused too.
    assert!(t.handle_line("import configuration").ok);
    for (i, l) in armour.iter().enumerate() {
        let l = if i == 2 {
            // Another base64 character in the first place: always a change.
            let first = if l.starts_with('A') { "B" } else { "A" };
            format!("{first}{}", &l[1..])
        } else {
            l.to_string()
        };
        t.handle_line(&l);
    }
    let r = t.handle_line("twelve chars or more");
    assert!(!r.ok, "{}", r.text);
    assert_eq!(t.candidate, before);

    // Under commit-confirm, then rolled back: the old password (none) and host key.
    let r = feed(&mut t, "twelve chars or more");
    assert!(
        r.ok && r.text.contains("the candidate is its configuration"),
        "{}",
        r.text
    );
    assert!(t.handle_line("compare").text.contains("ListenPort = 51820"));
    let r = t.handle_line("commit-confirm 1");
    assert!(r.ok, "{}", r.text);
    assert_eq!(ssh_host_key::read(&b.0).unwrap(), Some([4; 32]));
    assert!(b.0.join("console.argon2id").exists());
    secs.set(61);
    let rb = t.poll().expect("rolled back at the deadline");
    assert!(
        rb.text.contains("back as they were before the import"),
        "{}",
        rb.text
    );
    assert_eq!(ssh_host_key::read(&b.0).unwrap(), Some([5; 32]));
    assert!(!b.0.join("console.argon2id").exists());

    // Plainly committed: the same box.
    let r = feed(&mut t, "twelve chars or more");
    assert!(r.ok, "{}", r.text);
    let r = t.handle_line("commit");
    assert!(r.ok, "{}", r.text);
    assert_eq!(
        std::fs::read_to_string(b.0.join("riceguard.conf")).unwrap(),
        saved_a
    );
    assert_eq!(ssh_host_key::read(&b.0).unwrap(), Some([4; 32]));
    assert_eq!(
        std::fs::read_to_string(b.0.join("console.argon2id")).unwrap(),
        std::fs::read_to_string(a.0.join("console.argon2id")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(b.0.join("clients/phone.key")).unwrap(),
        std::fs::read_to_string(a.0.join("clients/phone.key")).unwrap()
    );
    assert!(!crate::perm::import_undo::path(&b.0).exists(), "settled");
}

/// A commit-confirm made over SSH whose session is gone: `riceguard ssh`'s watcher
/// (`settle_overdue_confirm`, a session of its own on the real clock) rolls it back once
/// the consoles' grace after its deadline has passed. The fake clock here runs in 2023, so
/// the recorded deadline is long past for the real one.
#[test]
fn an_overdue_commit_confirm_is_rolled_back_without_its_console() {
    let d = TempDir::new("confirm-watch");
    let secs = Rc::new(Cell::new(0));
    let mut s = ini_session_at(&d, &secs);
    for l in [
        "set interface listen-port 51820",
        "commit",
        "set interface listen-port 51821",
    ] {
        assert!(s.handle_line(l).ok, "{l}");
    }
    let r = s.handle_line("commit-confirm 1");
    assert!(r.ok, "{}", r.text);
    drop(s); // the SSH session ended
    let saved = || std::fs::read_to_string(d.0.join("riceguard.conf")).unwrap();
    assert!(saved().contains("ListenPort = 51821"));
    let hooks = crate::console::system::SystemHooks {
        pidfile: d.0.join("no-daemon.pid"),
        socket: Some(d.0.join("no-daemon.sock")),
        status_file: d.0.join("no-daemon.status"),
        job: None,
    };
    let said =
        crate::console::settle_overdue_confirm(&d.0, "ssh-server", hooks).expect("it rolls back");
    assert!(
        said.contains("rolled back") || said.contains("roll"),
        "{said}"
    );
    assert!(saved().contains("ListenPort = 51820"), "{}", saved());
    assert_eq!(crate::perm::confirm::pending(&d.0), None);
    // Nothing pending any more: nothing to do.
    let hooks = crate::console::system::SystemHooks::default();
    assert_eq!(
        crate::console::settle_overdue_confirm(&d.0, "ssh-server", hooks),
        None
    );
}

/// `export configuration to usb` writes the same armoured text as a file on the stick
/// (named for the board and UTC time), `import configuration from usb` reads the newest
/// back and asks its passphrase as the pasted import does; without a stick both refuse
/// and change nothing.
#[test]
fn export_to_and_import_from_a_usb_stick() {
    let a = TempDir::new("usb-a");
    let (mut s, _) = ini_session(&a);
    for l in ["set interface listen-port 51820", "commit"] {
        assert!(s.handle_line(l).ok, "{l}");
    }
    // No stick: said before any passphrase is asked, nothing written.
    STICK.with(|st| *st.borrow_mut() = None);
    let r = s.handle_line("export configuration to usb");
    assert!(
        !r.ok && r.text.contains("no USB stick is attached"),
        "{}",
        r.text
    );
    assert!(!s.secret_input());
    // A stick when asked, gone when written: said then.
    let gone = TempDir::new("usb-gone");
    STICK.with(|st| *st.borrow_mut() = Some(gone.0.clone()));
    let r = s.handle_line("export configuration to usb");
    assert!(
        r.ok && r.text.contains("onto the USB stick test stick"),
        "{}",
        r.text
    );
    assert!(s.secret_input());
    assert!(s.handle_line("twelve chars or more").ok);
    STICK.with(|st| *st.borrow_mut() = None);
    let r = s.handle_line("twelve chars or more");
    assert!(
        !r.ok && r.text.contains("not exported: no USB stick is attached"),
        "{}",
        r.text
    );
    let r = s.handle_line("import configuration from usb");
    assert!(!r.ok && r.text.contains("nothing changed"), "{}", r.text);

    let stick = TempDir::new("usb-stick");
    STICK.with(|st| *st.borrow_mut() = Some(stick.0.clone()));
    assert!(s.handle_line("export configuration to usb").ok);
    assert!(s.handle_line("twelve chars or more").ok);
    let r = s.handle_line("twelve chars or more");
    assert!(
        r.ok && r.text.contains("exported: the saved configuration"),
        "{}",
        r.text
    );
    assert!(
        !r.text.contains("BEGIN AGE"),
        "the text goes to the stick only"
    );
    let files: Vec<String> = std::fs::read_dir(&stick.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // 1_700_000_000 is 2023-11-14T22:13:20Z; no image here, so the board is unknown.
    assert_eq!(files, ["riceguard-unknown-20231114T221320Z.age"]);
    let text = std::fs::read_to_string(stick.0.join(&files[0])).unwrap();
    assert!(
        text.starts_with("-----BEGIN AGE ENCRYPTED FILE-----\n"),
        "{text}"
    );

    let b = TempDir::new("usb-b");
    let (mut t, _) = ini_session(&b);
    assert!(t.handle_line("commit").ok);
    assert!(t
        .handle_line("import configuration from usb ../x")
        .text
        .contains("not a plain file name"));
    let r = t.handle_line("import configuration from usb");
    assert!(
        r.ok && r.text.contains(&format!("read {}", files[0])),
        "{}",
        r.text
    );
    assert!(t.secret_input());
    let r = t.handle_line("twelve chars or more");
    assert!(
        r.ok && r.text.contains("the candidate is its configuration"),
        "{}",
        r.text
    );
    assert!(t.handle_line("compare").text.contains("ListenPort = 51820"));
    let r = t.handle_line(&format!("import configuration from usb {}", files[0]));
    assert!(r.ok, "{}", r.text);
    assert!(!t.handle_line("not the passphrase").ok);
    STICK.with(|st| *st.borrow_mut() = None);
}
