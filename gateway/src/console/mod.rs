//! The serial-console configuration CLI (`riceguard console --root DIR`), in the
//! candidate-configuration model of VyOS/Junos: `set`/`delete` edit a candidate,
//! `commit` validates, saves and applies it, `commit-confirm` undoes itself unless
//! confirmed, `rollback N` brings back one of the 10 saved versions.
//!
//! Module map:
//! - [`line`](mod@line): bytes from a serial line -> command lines (editing, CR/LF, noise, bounds)
//! - [`command`]: the command language, `help`, and `set`/`delete` as edits of a `Config`
//! - [`validate`]: field parsers and the whole-config gate [`validate::validate_candidate`]
//! - [`session`]: candidate/running/commit-confirm/questions; no I/O of its own
//! - [`store`]: the console's handle on DIR (saved config, history, password, confirm
//!   deadline, client keys), whose files are [`crate::perm`]'s
//! - saving goes through [`crate::durable`] (crash-safe replacement and removal)
//! - [`system`]: reload signal, UAPI peers, status, reboot, clock, terminal mode
//! - [`peers`], [`password`]: `show peers` formatting, the password hash (Argon2id) and
//!   the wrong-password wait every console shares
//! - [`remote`]: what an SSH session depends on (no remote lock-out)
//! - [`vpn_client`], [`qr`]: `add client` (address allocation, keys, the client's wg-quick
//!   configuration) and its QR code in Unicode half blocks
//!
//! When stdin is a terminal the console prompts, echoes and edits; otherwise it reads
//! one command per line, answers on stdout, and exits non-zero if any command failed.
//!
//! Decisions (user-visible):
//! - `commit` saves (atomically, previous version to `history/`) and applies (SIGHUP to
//!   the daemon); `save` is kept only to say so, and fails if changes are uncommitted.
//! - `commit-confirm N`: the deadline is also written to `DIR/commit-confirm`, so a
//!   console restarted by init (serial hang-up) still rolls back in time; at end of
//!   input the console waits for the deadline rather than leave it unguarded.
//! - A new appliance (nothing ever saved in DIR) starts with a generated private key in
//!   the candidate; `factory-reset` gives the same state, keeps the history (so it can be
//!   undone with `rollback 1`) unless `factory-reset erase-history`, and removes the
//!   console password.
//! - Console password: off by default, checked for every session (tty or script: the
//!   first line is then the password), set/removed at once, not through commit. Fail
//!   closed: only a password file that does not exist on a mounted `perm` means "no
//!   password"; an unreadable, non-text, empty or damaged file, or a `perm` init could
//!   not mount (`--perm-unmounted`), locks the console (failsafe mode at boot still works
//!   without it, and the lock message says so).
//! - Several consoles (the serial line and the screen, `--name` says which): each has its
//!   own candidate; commits are serialised with `flock(DIR/.lock)`, refuse to overwrite a
//!   configuration another console saved meanwhile (the refusal names it; `discard`
//!   reloads), and wait while another console's `commit-confirm` is pending. That one
//!   belongs to the console that made it (`DIR/commit-confirm.console`): it rolls it back;
//!   any console may `confirm` it (the owner is told); another console rolls it back only
//!   if the owner has not, 10 s after the deadline.

pub mod command;
pub mod export;
pub mod line;
pub mod password;
pub mod peers;
pub mod qr;
pub mod remote;
pub mod session;
pub mod store;
pub mod system;
pub mod validate;
pub mod vpn_client;

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use line::{Event, LineEditor, MAX_LINE};
use session::{Reply, Session};
use store::{Format, Ini, Store};
use system::{Clock, RawMode, SystemClock, SystemHooks};

const USAGE: &str = "usage: riceguard console --root DIR [--name NAME] [--socket PATH] [--pidfile PATH] [--status-file PATH] [--perm-unmounted]
  DIR          the appliance's perm partition (riceguard.conf, history/, console.argon2id)
  --name       this console's name in what the other consoles are told (init gives its
               terminal: ttyS0, tty1; default: the terminal on stdin, else `script`)
  --perm-unmounted  DIR is not the perm partition (init could not mount it): the console
               stays locked, since its password cannot be checked
  --authenticated ssh  the user logged in with an SSH key (`riceguard ssh` passes it for its
               sessions): the console password is not asked. Refused unless --name is an
               SSH session's (`ssh-N:KEY`) and stdin is a pipe or a pseudo-terminal
               (/dev/pts/N): a console on a serial line or screen always asks
  --source ADDR  with --authenticated ssh: the session's peer address (what a plain commit
               must not cut: the session's own peer, see `commit-confirm`)
  --socket     the daemon's UAPI socket (default /var/run/wireguard/IFNAME.sock)
  --pidfile    the daemon's pid file, signalled with SIGHUP after a commit (default /run/riceguard.pid)
  --status-file  data-plane status written by the daemon (default /run/riceguard.status)";

struct Args {
    root: PathBuf,
    name: Option<String>,
    hooks: SystemHooks,
    perm_unmounted: bool,
    login: session::Login,
    /// `--source`: the SSH session's peer address.
    source: Option<std::net::IpAddr>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut root = None;
    let mut hooks = SystemHooks::default();
    let mut perm_unmounted = false;
    let mut name = None;
    let mut login = session::Login::Password;
    let mut source = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--root" => root = Some(PathBuf::from(val("--root")?)),
            "--socket" => hooks.socket = Some(PathBuf::from(val("--socket")?)),
            "--pidfile" => hooks.pidfile = PathBuf::from(val("--pidfile")?),
            "--status-file" => hooks.status_file = PathBuf::from(val("--status-file")?),
            "--perm-unmounted" => perm_unmounted = true,
            "--source" => {
                let v = val("--source")?;
                source =
                    Some(v.parse().map_err(|_| {
                        format!("--source `{}`: not an address", validate::short(&v))
                    })?);
            }
            "--authenticated" => match val("--authenticated")?.as_str() {
                "ssh" => login = session::Login::Key,
                v => {
                    return Err(format!(
                        "--authenticated `{}`: only `ssh` (a key login)",
                        validate::short(v)
                    ))
                }
            },
            "--name" => {
                let v = val("--name")?;
                name = Some(store::console_name(&v).ok_or_else(|| {
                    format!(
                        "--name `{}`: letters, digits and /_-.: only, at most 32",
                        validate::short(&v)
                    )
                })?);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{}`", validate::short(other))),
        }
    }
    let root = root.ok_or("--root DIR is required")?;
    if login == session::Login::Key {
        key_login_allowed(name.as_deref(), stdin_tty_path().as_deref())?;
    } else if source.is_some() {
        return Err("--source goes with --authenticated ssh".into());
    }
    Ok(Args {
        root,
        name,
        hooks,
        perm_unmounted,
        login,
        source,
    })
}

/// `--authenticated ssh` only where `riceguard ssh` starts a console: named as an SSH
/// session and on a pipe or a pseudo-terminal. Init's consoles are on serial lines and
/// screens (`/dev/ttyS0`, `/dev/tty1`, `/dev/hvc0`) named after them, so a console there
/// can never skip its password, whatever its command line says.
fn key_login_allowed(name: Option<&str>, tty: Option<&str>) -> Result<(), String> {
    if !name.is_some_and(|n| n.starts_with("ssh-")) {
        return Err("--authenticated ssh needs --name ssh-N:KEY (an SSH session's name)".into());
    }
    match tty {
        Some(t) if !t.starts_with("/dev/pts/") => Err(format!(
            "--authenticated ssh on the terminal {t}: only on a pipe or a pseudo-terminal"
        )),
        _ => Ok(()),
    }
}

/// The terminal on stdin (`/dev/ttyS0`, `/dev/pts/3`), `None` when stdin is no terminal.
fn stdin_tty_path() -> Option<String> {
    if !std::io::stdin().is_terminal() {
        return None;
    }
    Some(
        std::fs::read_link("/proc/self/fd/0")
            .ok()
            .and_then(|p| p.to_str().map(String::from))
            // A terminal we cannot name is not known to be a pseudo-terminal.
            .unwrap_or_else(|| "(unknown)".into()),
    )
}

/// Where replies go, with the terminal's needs (CRLF is done by the tty's output
/// processing, which raw mode leaves on).
struct Out {
    tty: bool,
}

impl Out {
    fn reply(&self, r: &Reply) {
        let mut o = std::io::stdout().lock();
        if !r.text.is_empty() {
            // Text and newline in one write: init's lines share this terminal, and a
            // line of theirs written between the two would glue onto our last line.
            let _ = crate::logger::write_line(&mut o, &r.text);
        }
        let _ = o.flush();
    }

    fn raw(&self, s: &[u8]) {
        if self.tty {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(s);
            let _ = o.flush();
        }
    }

    fn prompt(&self, session: &Session, pending: &[u8]) {
        if self.tty {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(session.prompt().as_bytes());
            if !session.secret_input() {
                let _ = o.write_all(pending);
            }
            let _ = o.flush();
        }
    }
}

/// A commit-confirm whose deadline passed with no console left to roll it back (an SSH
/// session that ended, a terminal that went away): `riceguard ssh` calls this every few
/// seconds while one is pending. A session named `name` over `root` rolls it back when its
/// owner has not, [`session::BACKUP_GRACE_SECS`] after the deadline, as any console would.
/// What it said, when it did something.
pub fn settle_overdue_confirm(
    root: &std::path::Path,
    name: &str,
    hooks: SystemHooks,
) -> Option<String> {
    let store = Store::new(root.to_path_buf(), Box::new(Ini) as Box<dyn Format>);
    let (mut session, _) = Session::open_with(
        store,
        Box::new(hooks),
        Box::new(SystemClock),
        name,
        session::Login::Key,
    );
    session.poll().map(|r| r.text)
}

pub fn main(args: &[String]) -> ExitCode {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let tty = std::io::stdin().is_terminal();
    let _raw = if tty {
        match RawMode::enter() {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("warning: could not set the terminal to character mode ({e}); line editing is the terminal's");
                None
            }
        }
    } else {
        None
    };
    let format: Box<dyn Format> = Box::new(Ini);
    let mut store = Store::new(args.root, format);
    if args.perm_unmounted {
        store = store.perm_unmounted();
    }
    let name = args.name.unwrap_or_else(|| stdin_name(tty));
    let (mut session, hello) = Session::open_with(
        store,
        Box::new(args.hooks),
        Box::new(SystemClock),
        &name,
        args.login,
    );
    if let (session::Login::Key, Some(source)) = (args.login, args.source) {
        // `ssh-N:KEY`: key_login_allowed checked the prefix; the key's name follows `:`.
        let key_name = name.split_once(':').map_or("", |(_, k)| k).to_string();
        session.set_remote(remote::Remote { key_name, source });
    }
    run(session, hello, tty)
}

/// The terminal on stdin (`/dev/ttyS0` -> `ttyS0`), or `script` when it is none.
fn stdin_name(tty: bool) -> String {
    let link = std::fs::read_link("/proc/self/fd/0").ok();
    let name = link
        .as_ref()
        .and_then(|p| p.to_str())
        .map(|p| p.trim_start_matches("/dev/").to_string());
    match name.and_then(|n| store::console_name(&n)) {
        Some(n) if tty => n,
        _ => "script".into(),
    }
}

fn run(mut session: Session, hello: Reply, tty: bool) -> ExitCode {
    let out = Out { tty };
    let mut failed = false;
    out.reply(&hello);
    if tty {
        out.reply(&Reply {
            text: "riceguard console: `help` lists the commands".into(),
            ok: true,
            exit: false,
        });
    }
    let mut editor = LineEditor::new();
    let mut buf = [0u8; 512];
    let clock = SystemClock;
    out.prompt(&session, editor.pending());
    'outer: loop {
        if let Some(r) = session.poll() {
            out.raw(b"\n");
            out.reply(&r);
            failed |= !r.ok;
            out.prompt(&session, editor.pending());
        }
        // Wake up for the commit-confirm deadline even when nobody types.
        let wait = session
            .confirm_deadline()
            .map(|d| {
                d.saturating_duration_since(clock.now())
                    .min(Duration::from_secs(1))
            })
            .unwrap_or(Duration::from_secs(1));
        let stdin = std::io::stdin();
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(1000);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let n = match nix::unistd::read(stdin.as_fd(), &mut buf) {
            Ok(0) => break, // end of input, or the serial line hung up
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
            Err(_) => break, // EIO: the terminal went away
        };
        for &b in &buf[..n] {
            let Some(ev) = editor.feed(b) else { continue };
            match ev {
                Event::Echo(c) => {
                    if !session.secret_input() {
                        out.raw(&[c]);
                    }
                }
                Event::Erase => {
                    if !session.secret_input() {
                        out.raw(b"\x08 \x08");
                    }
                }
                Event::Line(l) => {
                    out.raw(b"\n");
                    let r = session.handle_line(&l);
                    out.reply(&r);
                    failed |= !r.ok;
                    if r.exit {
                        break 'outer;
                    }
                    out.prompt(&session, editor.pending());
                }
                Event::Empty => {
                    out.raw(b"\n");
                    if session.secret_input() {
                        // An empty answer is an answer (it cancels a new password).
                        let r = session.handle_line("");
                        out.reply(&r);
                        failed |= !r.ok;
                    }
                    out.prompt(&session, editor.pending());
                }
                Event::Cancelled => {
                    out.raw(b"^C\n");
                    out.prompt(&session, editor.pending());
                }
                Event::TooLong => {
                    failed = true;
                    out.raw(b"\n");
                    out.reply(&Reply {
                        text: format!("error: line longer than {MAX_LINE} characters ignored"),
                        ok: false,
                        exit: false,
                    });
                    out.prompt(&session, editor.pending());
                }
                Event::Garbage(k) => {
                    failed = true;
                    out.raw(b"\n");
                    out.reply(&Reply {
                        text: format!(
                            "error: line ignored: it held {k} byte(s) that are not plain text (line noise, or a wrong baud rate?)"
                        ),
                        ok: false,
                        exit: false,
                    });
                    out.prompt(&session, editor.pending());
                }
                Event::Eof => break 'outer,
            }
        }
    }
    // Input is over. An unconfirmed commit-confirm must still roll back on time: wait for
    // it here (on the appliance init restarts the console, which resumes it anyway). A
    // background job (a scripted update) is waited for too, so its report is printed.
    if let Some(j) = session.job_running() {
        out.reply(&Reply {
            text: format!("input ended while {j}: waiting for its report"),
            ok: true,
            exit: false,
        });
    }
    // An SSH session does not hold its client for the deadline: the rollback is carried
    // out without it (riceguard ssh, or a console of the box, 10 s after the deadline).
    let wait_confirm = session.remote().is_none();
    if let Some(deadline) = session.confirm_deadline() {
        let left = deadline.saturating_duration_since(clock.now()).as_secs();
        let text = if wait_confirm {
            format!(
                "input ended with a commit-confirm pending: waiting {left} s, then rolling back"
            )
        } else {
            format!(
                "commit-confirm pending: it rolls back in {left} s unless confirmed (`ssh admin@THIS-BOX confirm`, or `confirm` on any console)"
            )
        };
        out.reply(&Reply {
            text,
            ok: true,
            exit: false,
        });
    }
    while (wait_confirm && session.confirm_deadline().is_some()) || session.job_running().is_some()
    {
        let d = session
            .confirm_deadline()
            .map(|d| d.saturating_duration_since(clock.now()));
        std::thread::sleep(
            d.unwrap_or(Duration::from_millis(200))
                .min(Duration::from_secs(1)),
        );
        if let Some(r) = session.poll() {
            out.reply(&r);
            failed |= !r.ok;
        }
    }
    out.raw(b"\n");
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The invariants a fuzz target checks on arbitrary console input (used by
/// `fuzz/fuzz_targets/console_line.rs` and by the seeded test below): the line editor
/// yields only bounded, printable lines; parsing never panics; a `set`/`delete`/`add
/// client` that fails leaves the configuration unchanged, and one that succeeds leaves it
/// consistent; a client configuration `add client` prints reads back with the INI reader.
pub fn fuzz_check_input(data: &[u8]) {
    let mut editor = LineEditor::new();
    let mut cfg = crate::core::config::Config::default();
    for &b in data {
        let Some(Event::Line(l)) = editor.feed(b) else {
            continue;
        };
        assert!(l.len() <= MAX_LINE && l.bytes().all(|c| (0x20..=0x7e).contains(&c)));
        let edit: fn(&mut crate::core::config::Config, &[String]) -> command::EditResult =
            match command::parse(&l) {
                Ok(command::Command::Set(_)) => command::apply_set,
                Ok(command::Command::Delete(_)) => command::apply_delete,
                Ok(command::Command::Help(t)) => {
                    let _ = command::help(&t);
                    continue;
                }
                Ok(command::Command::EnableClient { name, enabled }) => {
                    let before = cfg.clone();
                    match vpn_client::set_enabled(&mut cfg, &name, enabled) {
                        Err(_) => {
                            assert_eq!(cfg, before, "a failed `{l}` changed the configuration")
                        }
                        Ok(_) => {
                            assert!(
                                validate::check_consistency(&cfg).len()
                                    <= validate::check_consistency(&before).len(),
                                "`{l}` made the configuration inconsistent"
                            );
                            let mut back = cfg.clone();
                            for p in &mut back.peers {
                                p.enabled = before
                                    .peers
                                    .iter()
                                    .find(|q| q.public_key == p.public_key)
                                    .is_none_or(|q| q.enabled);
                            }
                            assert_eq!(back, before, "`{l}` changed more than Enabled");
                        }
                    }
                    continue;
                }
                Ok(command::Command::AddClient {
                    name,
                    tunnel,
                    access,
                    ..
                }) => {
                    let before = cfg.clone();
                    let up = Ok(system::Uplink {
                        name: "eth0".into(),
                        addresses: vec![crate::core::net::Cidr {
                            addr: std::net::IpAddr::from([192, 0, 2, 10]),
                            prefix: 24,
                        }],
                        dns: vec![std::net::IpAddr::from([192, 0, 2, 1])],
                        in_use: vec![std::net::IpAddr::from([192, 0, 2, 1])],
                    });
                    match vpn_client::add(&mut cfg, &name, &up, tunnel, access) {
                        Err(_) => {
                            assert_eq!(cfg, before, "a failed `{l}` changed the configuration")
                        }
                        Ok(a) => {
                            let back = crate::core::ini::parse("client", &a.text.config);
                            assert!(back.is_ok(), "`{l}` printed {:?}: {back:?}", a.text.config);
                            // Fits a QR code (40-L holds 2953 bytes); drawing it is
                            // tested in `qr` (too slow to repeat here).
                            assert!(a.text.config.len() <= 2953);
                            if !validate::check_consistency(&cfg).is_empty() {
                                cfg = before;
                            }
                        }
                    }
                    continue;
                }
                _ => continue,
            };
        let args: Vec<String> = l.split_whitespace().skip(1).map(String::from).collect();
        if args.first().map(String::as_str) == Some("system") {
            continue;
        }
        let before = cfg.clone();
        match edit(&mut cfg, &args) {
            Err(_) => assert_eq!(cfg, before, "a failed `{l}` changed the configuration"),
            Ok(_) => {
                if !validate::check_consistency(&cfg).is_empty() {
                    // The session refuses such a change; do the same here.
                    cfg = before;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_login_only_for_ssh_sessions_off_real_terminals() {
        use super::key_login_allowed as ok;
        assert!(ok(Some("ssh-17:alice"), None).is_ok());
        assert!(ok(Some("ssh-17:alice"), Some("/dev/pts/3")).is_ok());
        assert!(ok(Some("ttyS0"), None).is_err());
        assert!(ok(None, None).is_err());
        assert!(ok(Some("ssh-1:a"), Some("/dev/ttyS0")).is_err());
        assert!(ok(Some("ssh-1:a"), Some("/dev/tty1")).is_err());
        assert!(ok(Some("ssh-1:a"), Some("(unknown)")).is_err());
        assert!(super::parse_args(&[
            "--root".into(),
            "/x".into(),
            "--name".into(),
            "ttyS0".into(),
            "--authenticated".into(),
            "ssh".into()
        ])
        .is_err());
    }

    /// Stand-in for the fuzz target where `fuzz/` is not built: seeded random bytes and
    /// byte-level mutations of real command lines.
    #[test]
    fn seeded_random_input_keeps_the_invariants() {
        let seeds: &[&[u8]] = &[
            b"set interface listen-port 51820\nset interface address 10.0.0.1/24\n",
            b"set peer xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg= allowed-ips 10.0.0.2/32,fd00::2/128\r\n",
            b"set gateway cores 0-3\rset gateway tcp-listen 443,8443\r\ndelete gateway cores\n",
            b"delete peer xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg= allowed-ips 10.0.0.2/32\n",
            b"help set\nshow candidate private\ncommit-confirm 5\n",
            b"set interface private-key yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\nset interface listen-port 51820\n\
              set interface address 10.0.0.1/29,fd00::1/126\nadd client phone\nadd client tab keep-key\n\
              set gateway client-dns 10.0.0.1\nset gateway public-endpoint vpn.example:443\nadd client x.y\n",
            b"set gateway lan eth1\nset gateway lan-address 192.168.1.1/24\nset gateway proxy-arp off\n\
              delete client phone\ndelete gateway lan\nshow client phone\nshow clients\n",
            b"set interface private-key yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\nset interface listen-port 51820\n\
              set interface address 10.100.0.1/24\nadd client phone full-tunnel\nadd client tab keep-key full-tunnel\n\
              disable client phone\nenable client phone\ndisable client tab\nset gateway firewall off\n\
              set gateway masquerade on\nshow client tab full-tunnel\n",
        ];
        let mut x: u64 = 0xdead_beef_cafe_f00d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..2000 {
            let mut d: Vec<u8> = seeds[i % seeds.len()].to_vec();
            for _ in 0..(next() % 8) {
                let pos = (next() as usize) % (d.len() + 1);
                match next() % 4 {
                    0 => d.insert(pos, next() as u8),
                    1 if pos < d.len() => {
                        d.remove(pos);
                    }
                    2 if pos < d.len() => {
                        d[pos] = b"0123456789,./:- \n\x7f"[(next() % 17) as usize]
                    }
                    _ => d.extend((0..next() % 64).map(|_| next() as u8)),
                }
            }
            super::fuzz_check_input(&d);
        }
    }
}
