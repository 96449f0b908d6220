//! Session tests: commands driven line by line, time driven by a fake clock, the daemon
//! replaced by a recorder, and the files in a temporary directory (text format stubbed
//! by the store's table format so these tests do not depend on the INI code).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;
use crate::console::store::tests::TableFormat;
use crate::console::system::{Clock, Hooks, JobReport};
use crate::store::tests::TempDir;

#[derive(Clone)]
struct FakeClock {
    base: Instant,
    secs: Rc<Cell<u64>>,
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_secs(self.secs.get())
    }
    fn unix(&self) -> u64 {
        1_700_000_000 + self.secs.get()
    }
}

/// A background job of the fake hooks: what runs, and its report once it "ended".
type FakeJob = Rc<RefCell<Option<(String, Option<JobReport>)>>>;

#[derive(Clone, Default)]
struct Recorder {
    log: Rc<RefCell<Vec<String>>>,
    daemon: bool,
    job: FakeJob,
}

impl Hooks for Recorder {
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
}

struct Rig {
    dir: TempDir,
    secs: Rc<Cell<u64>>,
    log: Rc<RefCell<Vec<String>>>,
    s: Session,
}

impl Rig {
    fn new() -> Rig {
        let dir = TempDir::new("session");
        let secs = Rc::new(Cell::new(0));
        let log = Rc::new(RefCell::new(Vec::new()));
        let s = Rig::open_at(&dir, &secs, &log);
        Rig { dir, secs, log, s }
    }

    fn open_at(dir: &TempDir, secs: &Rc<Cell<u64>>, log: &Rc<RefCell<Vec<String>>>) -> Session {
        let store = Store::new(&dir.0, Box::new(TableFormat) as Box<dyn Format>);
        let clock = FakeClock {
            base: Instant::now(),
            secs: secs.clone(),
        };
        let hooks = Recorder {
            log: log.clone(),
            daemon: true,
            job: FakeJob::default(),
        };
        Session::open(store, Box::new(hooks), Box::new(clock)).0
    }

    /// A new console process on the same directory (as after init restarts it).
    fn restart(&mut self) {
        self.s = Rig::open_at(&self.dir, &self.secs, &self.log);
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
    Key::generate_private().public().to_base64()
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
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
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
    assert!(r.err("commit").contains("changed by someone else"));
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
