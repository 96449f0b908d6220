//! The service supervisor of PID 1, after gokrazy's `supervise.go`: each service runs in
//! its own session/process group, is restarted after a back-off when it exits (see
//! [`Backoff`]: 1 s doubling to 60 s, back to 1 s after a healthy minute), keeps a
//! ring buffer of its last output lines, and exit code [`DONT_RESTART`] means "leave me
//! stopped". Reaping is the caller's job (PID 1 reaps everything and hands statuses here).
//!
//! Output relay: a service's stdout/stderr is read line by line and copied to the
//! console; a line longer than [`MAX_RELAY_LINE`] bytes is cut there and the rest of it
//! is read and discarded (the cut line says how much), so a service that prints a huge
//! or endless line cannot make PID 1 allocate without bound.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

/// Exit code with which a service asks not to be restarted (gokrazy uses the same).
pub const DONT_RESTART: i32 = 125;

/// Lines kept per service, and the longest line kept (longer ones are cut).
const RING_LINES: usize = 100;
const MAX_LINE: usize = 1024;
/// The longest line relayed to the console; the rest of a longer line is discarded.
pub const MAX_RELAY_LINE: usize = 4096;

/// Read one line (without its `\n`) into `buf`, keeping at most `max` bytes of it; the
/// rest of a longer line is read and thrown away. `Ok(None)` at the end of input, else
/// `Ok(Some(n))` with `n` the bytes discarded. Memory use is `max` plus the reader's buffer
/// whatever the input.
pub fn read_line_capped(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<u64>> {
    buf.clear();
    let mut dropped = 0u64;
    let mut any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(any.then_some(dropped));
        }
        any = true;
        let nl = chunk.iter().position(|&b| b == b'\n');
        let part = &chunk[..nl.unwrap_or(chunk.len())];
        let keep = part.len().min(max.saturating_sub(buf.len()));
        buf.extend_from_slice(&part[..keep]);
        dropped += (part.len() - keep) as u64;
        let used = nl.map_or(chunk.len(), |i| i + 1);
        r.consume(used);
        if nl.is_some() {
            return Ok(Some(dropped));
        }
    }
}

/// Hand a service's output to `out` as `NAME: line` and into its ring, line by line,
/// each line capped at [`MAX_RELAY_LINE`] bytes. Returns at the end of input (the
/// service and everything it started closed the pipe) or on a read error.
pub fn relay(input: impl io::Read, name: &str, ring: &Mutex<LogRing>, out: &mut dyn FnMut(&str)) {
    let mut rd = BufReader::with_capacity(8192, input);
    let mut buf = Vec::with_capacity(256);
    while let Ok(Some(dropped)) = read_line_capped(&mut rd, &mut buf, MAX_RELAY_LINE) {
        let text = String::from_utf8_lossy(&buf);
        let mut line = text.trim_end().to_string();
        if dropped > 0 {
            line.push_str(&format!(
                " [... {dropped} more bytes of this line discarded]"
            ));
        }
        out(&format!("{name}: {line}"));
        if let Ok(mut g) = ring.lock() {
            g.push(&line);
        }
    }
}

/// The last lines a service printed.
#[derive(Debug, Default)]
pub struct LogRing {
    lines: VecDeque<String>,
}

impl LogRing {
    pub fn push(&mut self, line: &str) {
        if self.lines.len() == RING_LINES {
            self.lines.pop_front();
        }
        if line.len() <= MAX_LINE {
            self.lines.push_back(line.to_string());
            return;
        }
        // Keep the end too: it says how much the relay discarded.
        const MARK: &str = " [...] ";
        let tail_len = 100;
        let mut end = MAX_LINE - tail_len - MARK.len();
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let mut start = line.len() - tail_len;
        while !line.is_char_boundary(start) {
            start += 1;
        }
        self.lines
            .push_back(format!("{}{MARK}{}", &line[..end], &line[start..]));
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(String::as_str)
    }
}

/// The longest wait before a restart, and how long a service must stay healthy for the
/// back-off to start again from its first delay.
pub const MAX_RESTART_DELAY: Duration = Duration::from_secs(60);
pub const HEALTHY_RESET: Duration = Duration::from_secs(60);

/// The restart back-off of one service (pure; time passed in): the first delay, doubled
/// after each restart up to [`MAX_RESTART_DELAY`], back to the first after the service
/// was healthy for [`HEALTHY_RESET`]. A service without a health check is healthy while it
/// runs; the gateway's health is said by init's health watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    healthy_since: Option<Instant>,
}

impl Backoff {
    pub fn new(first: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            healthy_since: None,
        }
    }

    /// Healthy at `now` (the first of a run of calls counts).
    pub fn healthy(&mut self, now: Instant) {
        if self.healthy_since.is_none() {
            self.healthy_since = Some(now);
        }
    }

    pub fn unhealthy(&mut self) {
        self.healthy_since = None;
    }

    /// The service ended (or failed to start) at `now`: how long to wait before the next
    /// start.
    pub fn delay(&mut self, now: Instant) -> Duration {
        if self
            .healthy_since
            .is_some_and(|t| now.duration_since(t) >= HEALTHY_RESET)
        {
            self.next = self.first;
        }
        self.healthy_since = None;
        let d = self.next;
        self.next = (self.next * 2).min(MAX_RESTART_DELAY.max(self.first));
        d
    }
}

/// How to run one service.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub argv: Vec<String>,
    /// Serial device for stdin/stdout/stderr (an interactive service, e.g. the console);
    /// `None`: output is captured line by line to the console and the ring.
    pub tty: Option<String>,
    /// The first restart delay (the back-off doubles it from there).
    pub restart_delay: Duration,
    /// Its health is said by the caller ([`Supervisor::health`]); otherwise running
    /// counts as healthy.
    pub health_checked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running(Pid),
    /// Waiting to be (re)started at this time.
    Waiting(Instant),
    /// Exited with [`DONT_RESTART`], or stopping for shutdown.
    Stopped,
}

/// What to do after a service ended: the policy, kept apart from the mechanism.
pub fn after_exit(status: &WaitStatus, delay: Duration, now: Instant) -> State {
    match status {
        WaitStatus::Exited(_, code) if *code == DONT_RESTART => State::Stopped,
        _ => State::Waiting(now + delay),
    }
}

pub struct Service {
    pub spec: Spec,
    pub state: State,
    pub starts: u32,
    pub ring: Arc<Mutex<LogRing>>,
    pub last_status: Option<String>,
    pub backoff: Backoff,
}

#[derive(Default)]
pub struct Supervisor {
    pub services: Vec<Service>,
    stopping: bool,
}

fn describe(st: &WaitStatus) -> String {
    match st {
        WaitStatus::Exited(_, c) => format!("exit status {c}"),
        WaitStatus::Signaled(_, s, core) => format!(
            "killed by {s:?}{}",
            if *core { " (core dumped)" } else { "" }
        ),
        other => format!("{other:?}"),
    }
}

impl Supervisor {
    /// Add a service; it starts at the next [`Supervisor::tick`].
    pub fn add(&mut self, spec: Spec, now: Instant) {
        let ring = Arc::new(Mutex::new(LogRing::default()));
        let backoff = Backoff::new(spec.restart_delay);
        self.services.push(Service {
            backoff,
            spec,
            state: State::Waiting(now),
            starts: 0,
            ring,
            last_status: None,
        });
    }

    pub fn find(&self, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.spec.name == name)
    }

    /// The caller's health check of a `health_checked` service says it is (not) healthy.
    pub fn health(&mut self, name: &str, healthy: bool, now: Instant) {
        if let Some(s) = self.services.iter_mut().find(|s| s.spec.name == name) {
            if healthy {
                s.backoff.healthy(now);
            } else {
                s.backoff.unhealthy();
            }
        }
    }

    /// Start whatever is due. Returns the earliest future start time, if any.
    pub fn tick(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for s in &mut self.services {
            if let State::Waiting(at) = s.state {
                if self.stopping {
                    s.state = State::Stopped;
                } else if at <= now {
                    s.state = match spawn(&s.spec, &s.ring) {
                        Ok(pid) => {
                            s.starts += 1;
                            crate::logger::console_line(&format!(
                                "riceguard-init: {} started (pid {pid})",
                                s.spec.name
                            ));
                            if !s.spec.health_checked {
                                s.backoff.healthy(now);
                            }
                            State::Running(pid)
                        }
                        Err(e) => {
                            let d = s.backoff.delay(now);
                            crate::logger::console_line(&format!(
                                "riceguard-init: {} could not start: {e}; retrying in {}s",
                                s.spec.name,
                                d.as_secs()
                            ));
                            State::Waiting(now + d)
                        }
                    };
                } else {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        next
    }

    /// A child ended; returns true if it was one of ours.
    pub fn on_exit(&mut self, status: WaitStatus, now: Instant) -> bool {
        let Some(pid) = status.pid() else {
            return false;
        };
        let stopping = self.stopping;
        let Some(s) = self
            .services
            .iter_mut()
            .find(|s| s.state == State::Running(pid))
        else {
            return false;
        };
        let why = describe(&status);
        let delay = s.backoff.delay(now);
        s.state = if stopping {
            State::Stopped
        } else {
            after_exit(&status, delay, now)
        };
        match s.state {
            State::Waiting(_) => crate::logger::console_line(&format!(
                "riceguard-init: {} exited ({why}); restarting in {}s",
                s.spec.name,
                delay.as_secs()
            )),
            _ => crate::logger::console_line(&format!(
                "riceguard-init: {} exited ({why}); not restarting",
                s.spec.name
            )),
        }
        s.last_status = Some(why);
        if let Ok(r) = s.ring.lock() {
            // Kept for `riceguard status` and post-mortems; /run is a tmpfs.
            if let Ok(mut f) = std::fs::File::create(crate::run::service_log(&s.spec.name)) {
                for l in r.lines() {
                    let _ = writeln!(f, "{l}");
                }
            }
        }
        true
    }

    /// Ask every running service to stop (SIGTERM to its process group).
    pub fn stop_all(&mut self, sig: Signal) -> usize {
        self.stopping = true;
        let mut n = 0;
        for s in &mut self.services {
            match s.state {
                State::Running(pid) => {
                    let _ = killpg(pid, sig);
                    n += 1;
                }
                _ => s.state = State::Stopped,
            }
        }
        n
    }

    pub fn running(&self) -> usize {
        self.services
            .iter()
            .filter(|s| matches!(s.state, State::Running(_)))
            .count()
    }
}

fn spawn(spec: &Spec, ring: &Arc<Mutex<LogRing>>) -> std::io::Result<Pid> {
    let Some((prog, args)) = spec.argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ));
    };
    let mut cmd = Command::new(prog);
    cmd.args(args);
    // Its output reaches syslog through the relay: the service does not send it itself.
    cmd.env(crate::logger::UNDER_INIT_ENV, "1");
    let reader: Option<OwnedFd> = match &spec.tty {
        Some(tty) => {
            let f = OpenOptions::new().read(true).write(true).open(tty)?;
            cmd.stdin(Stdio::from(f.try_clone()?))
                .stdout(Stdio::from(f.try_clone()?))
                .stderr(Stdio::from(f));
            crate::sys::os::new_session(&mut cmd, true);
            None
        }
        None => {
            let (r, w) = nix::unistd::pipe().map_err(std::io::Error::from)?;
            let w2 = w.try_clone()?;
            cmd.stdin(Stdio::null())
                .stdout(Stdio::from(w))
                .stderr(Stdio::from(w2));
            crate::sys::os::new_session(&mut cmd, false);
            Some(r)
        }
    };
    let child = cmd.spawn()?;
    drop(cmd); // closes our copies of the pipe's write end, so the reader sees EOF on exit
    let pid = Pid::from_raw(child.id() as i32);
    if let Some(r) = reader {
        let ring = Arc::clone(ring);
        let name = spec.name.clone();
        std::thread::spawn(move || {
            let id = u32::try_from(pid.as_raw()).unwrap_or(0);
            relay(std::fs::File::from(r), &name, &ring, &mut |l| {
                crate::logger::relayed_line(l, id)
            });
        });
    }
    Ok(pid)
}

/// How often init looks at the saved configuration for a changed `Syslog`.
pub const SYSLOG_RECHECK: Duration = Duration::from_secs(2);

/// Init's remote syslog: every console line (init's own and its services' relayed
/// output) goes to this process's sender (`crate::syslog::process`), whose collector is
/// the saved configuration's `Syslog`, read again whenever the file changes (a commit).
pub struct SyslogFollow {
    dir: std::path::PathBuf,
    /// The file as last read: modification time and length.
    seen: Option<(std::time::SystemTime, u64)>,
    next: Instant,
}

impl SyslogFollow {
    /// Start following `dir`'s saved configuration (read now).
    pub fn new(dir: &std::path::Path, now: Instant) -> SyslogFollow {
        crate::logger::console_to_syslog();
        let mut f = SyslogFollow {
            dir: dir.to_path_buf(),
            seen: None,
            next: now,
        };
        f.tick(now);
        f
    }

    /// At most every [`SYSLOG_RECHECK`]: read the file again if it changed, and follow
    /// its `Syslog`. A file that does not parse changes nothing (the console does not
    /// save one).
    pub fn tick(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        self.next = now + SYSLOG_RECHECK;
        let path = crate::perm::config::conf_path(&self.dir);
        let stamp = std::fs::metadata(&path)
            .ok()
            .map(|m| (m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len()));
        if stamp == self.seen {
            return;
        }
        self.seen = stamp;
        let text = crate::perm::config::read_text(&self.dir);
        let Ok(cfg) = crate::core::ini::parse(&path.to_string_lossy(), &text) else {
            return;
        };
        let target = cfg.gateway.syslog;
        let said = match &target {
            Some(t) => format!(
                "riceguard-init: syslog: sending every service's log lines to {t} (in clear)"
            ),
            None => "riceguard-init: syslog: no remote syslog".to_string(),
        };
        if crate::syslog::process().set_target(target) {
            crate::logger::console_line(&said);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitPidFlag};

    #[test]
    fn ring_keeps_last_lines_bounded() {
        let mut r = LogRing::default();
        for i in 0..(RING_LINES + 5) {
            r.push(&format!("line {i}"));
        }
        assert_eq!(r.lines().count(), RING_LINES);
        assert_eq!(r.lines().next(), Some("line 5"));
        r.push(&"é".repeat(MAX_LINE));
        assert!(r.lines().last().unwrap().len() <= MAX_LINE);
        let long = format!(
            "{} [... 7 more bytes of this line discarded]",
            "x".repeat(4096)
        );
        r.push(&long);
        let last = r.lines().last().unwrap();
        assert!(
            last.len() <= MAX_LINE && last.ends_with("discarded]"),
            "{last}"
        );
    }

    /// A line far longer than the cap (and one without any newline at all) is relayed cut
    /// to MAX_RELAY_LINE bytes with a marker; the lines around it are intact.
    #[test]
    fn relay_caps_huge_lines() {
        let mut input = b"first\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10 << 20));
        input.extend_from_slice(b"\nafter\n");
        input.extend(std::iter::repeat_n(b'y', 3 * MAX_RELAY_LINE));
        let ring = Mutex::new(LogRing::default());
        let mut out = String::new();
        relay(io::Cursor::new(input), "svc", &ring, &mut |l| {
            out.push_str(l);
            out.push('\n');
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{}", out.len());
        assert_eq!(lines[0], "svc: first");
        let want = format!(
            "svc: {} [... {} more bytes of this line discarded]",
            "x".repeat(MAX_RELAY_LINE),
            (10 << 20) - MAX_RELAY_LINE
        );
        assert!(lines[1] == want, "{}", &lines[1][..80]);
        assert_eq!(lines[2], "svc: after");
        assert!(lines[3].ends_with(&format!(
            "[... {} more bytes of this line discarded]",
            2 * MAX_RELAY_LINE
        )));
        let g = ring.lock().unwrap();
        let kept: Vec<&str> = g.lines().collect();
        assert_eq!(kept.len(), 4);
        assert!(kept[1].len() <= MAX_LINE && kept[1].ends_with("discarded]"));
        // The capped reader itself: exact lines, end of input, an unterminated last line.
        let mut rd = io::Cursor::new(b"ab\n\ncdefg".to_vec());
        let mut b = Vec::new();
        assert_eq!(read_line_capped(&mut rd, &mut b, 3).unwrap(), Some(0));
        assert_eq!(b, b"ab");
        assert_eq!(read_line_capped(&mut rd, &mut b, 3).unwrap(), Some(0));
        assert_eq!(b, b"");
        assert_eq!(read_line_capped(&mut rd, &mut b, 3).unwrap(), Some(2));
        assert_eq!(b, b"cde");
        assert_eq!(read_line_capped(&mut rd, &mut b, 3).unwrap(), None);
    }

    /// Through the supervisor: a service printing a 1 MiB line gets it relayed cut, with
    /// the marker, and its next line still arrives.
    #[test]
    fn supervised_service_huge_line_is_capped() {
        let mut sup = Supervisor::default();
        let t0 = Instant::now();
        sup.add(
            Spec {
                name: "big".into(),
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "head -c 1048576 /dev/zero | tr '\\0' z; echo; echo after-big".into(),
                ],
                tty: None,
                restart_delay: Duration::from_secs(60),
                health_checked: false,
            },
            t0,
        );
        sup.tick(t0);
        let State::Running(pid) = sup.services[0].state else {
            panic!("not started")
        };
        let _ = wait_for(pid);
        for _ in 0..250 {
            let g = sup.services[0].ring.lock().unwrap();
            let lines: Vec<&str> = g.lines().collect();
            if lines.contains(&"after-big") {
                let big = lines.iter().find(|l| l.starts_with("zzz")).unwrap();
                assert!(
                    big.ends_with(&format!(
                        "[... {} more bytes of this line discarded]",
                        (1 << 20) - MAX_RELAY_LINE
                    )),
                    "{big}"
                );
                return;
            }
            drop(g);
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("output not relayed");
    }

    #[test]
    fn restart_policy() {
        let now = Instant::now();
        let d = Duration::from_secs(5);
        let p = Pid::from_raw(10);
        assert_eq!(
            after_exit(&WaitStatus::Exited(p, 1), d, now),
            State::Waiting(now + d)
        );
        assert_eq!(
            after_exit(&WaitStatus::Exited(p, DONT_RESTART), d, now),
            State::Stopped
        );
        assert_eq!(
            after_exit(&WaitStatus::Signaled(p, Signal::SIGKILL, false), d, now),
            State::Waiting(now + d)
        );
    }

    /// 1 s doubling to 60 s; a healthy minute starts it again from 1 s; a service
    /// healthy for less than a minute keeps doubling.
    #[test]
    fn restart_backoff() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1));
        let delays: Vec<u64> = (0..9).map(|_| b.delay(t0).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        b.healthy(t0);
        b.healthy(t0 + s(30)); // the first call counts
        assert_eq!(b.delay(t0 + s(59)), s(60));
        b.healthy(t0 + s(100));
        assert_eq!(b.delay(t0 + s(160)), s(1));
        assert_eq!(b.delay(t0 + s(161)), s(2));
        b.healthy(t0 + s(200));
        b.unhealthy(); // the healthy minute must be unbroken
        b.healthy(t0 + s(230));
        assert_eq!(b.delay(t0 + s(261)), s(4));
        b.healthy(t0 + s(300));
        assert_eq!(b.delay(t0 + s(360)), s(1));
    }

    /// Through the supervisor: a service that exits at once waits 5 s, then 10 s.
    #[test]
    fn supervisor_backs_off() {
        let mut sup = Supervisor::default();
        let t0 = Instant::now();
        sup.add(
            Spec {
                name: "quick".into(),
                argv: vec!["/bin/sh".into(), "-c".into(), "exit 1".into()],
                tty: None,
                restart_delay: Duration::from_secs(5),
                health_checked: true,
            },
            t0,
        );
        let mut at = t0;
        for want in [5, 10, 20] {
            sup.tick(at);
            let State::Running(pid) = sup.services[0].state else {
                panic!("not started")
            };
            assert!(sup.on_exit(wait_for(pid), at));
            assert_eq!(
                sup.services[0].state,
                State::Waiting(at + Duration::from_secs(want))
            );
            at += Duration::from_secs(want);
        }
    }

    /// Init's syslog follows the saved configuration: its `Syslog` is used at once, a
    /// changed file is read again at the next check, and init's own console lines and a
    /// service's relayed ones arrive with their app-name, PROCID and severity.
    #[test]
    fn syslog_follows_the_saved_configuration() {
        let dir = std::env::temp_dir().join(format!("rg-syslog-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rx = |_: ()| {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        };
        let (a, b) = (rx(()), rx(()));
        let conf = |target: String| {
            let text =
                format!("[Interface]\nListenPort = 51820\n\n[Gateway]\n#5+ Syslog = {target}\n");
            std::fs::write(crate::perm::config::conf_path(&dir), text).unwrap();
        };
        // The next message ending with `tail` (other tests' console lines may come too).
        let recv = |s: &std::net::UdpSocket, tail: &str| loop {
            let mut buf = [0u8; 4096];
            let n = s.recv(&mut buf).unwrap();
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.ends_with(tail) {
                return m;
            }
        };
        conf(a.local_addr().unwrap().to_string());
        let t0 = Instant::now();
        let mut f = SyslogFollow::new(&dir, t0);
        // The line saying where syslog goes is the first one sent.
        let m = recv(&a, " (in clear)");
        let pid = std::process::id();
        assert!(
            m.starts_with("<29>1 ")
                && m.contains(&format!(
                    " init {pid} - - syslog: sending every service's log lines to 127.0.0.1:"
                )),
            "{m}"
        );
        crate::logger::relayed_line("gateway: [   1.000] riceguard WARN  careful", 4242);
        let m = recv(&a, " careful");
        assert!(
            m.starts_with("<28>1 ") && m.ends_with(" gateway 4242 - - careful"),
            "{m}"
        );
        // A commit: the file changes (another length), read again after the recheck.
        conf(format!("{}/udp", b.local_addr().unwrap()));
        f.tick(t0 + Duration::from_millis(10));
        f.tick(t0 + SYSLOG_RECHECK);
        crate::logger::console_line("riceguard-init: FATAL: test");
        let m = recv(&b, " - - FATAL: test");
        assert!(m.starts_with("<27>1 ") && m.contains(" init "), "{m}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn wait_for(pid: Pid) -> WaitStatus {
        waitpid(pid, Some(WaitPidFlag::empty())).unwrap()
    }

    #[test]
    fn restarts_and_captures_output() {
        let mut sup = Supervisor::default();
        let t0 = Instant::now();
        let spec = Spec {
            name: "t".into(),
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo hello-from-child; exit 3".into(),
            ],
            tty: None,
            restart_delay: Duration::from_secs(5),
            health_checked: false,
        };
        sup.add(spec, t0);
        assert_eq!(sup.tick(t0), None);
        let State::Running(pid) = sup.services[0].state else {
            panic!("not started")
        };
        assert!(sup.on_exit(wait_for(pid), t0));
        assert_eq!(
            sup.services[0].state,
            State::Waiting(t0 + Duration::from_secs(5))
        );
        assert_eq!(
            sup.services[0].last_status.as_deref(),
            Some("exit status 3")
        );
        // Not due yet; then due.
        assert_eq!(
            sup.tick(t0 + Duration::from_secs(1)),
            Some(t0 + Duration::from_secs(5))
        );
        sup.tick(t0 + Duration::from_secs(5));
        assert_eq!(sup.services[0].starts, 2);
        let State::Running(pid) = sup.services[0].state else {
            panic!("not restarted")
        };
        sup.stop_all(Signal::SIGTERM);
        assert!(sup.on_exit(wait_for(pid), t0));
        assert_eq!(sup.services[0].state, State::Stopped);
        // The reader thread may still be draining; the first run's line is there by now.
        for _ in 0..100 {
            if sup.services[0]
                .ring
                .lock()
                .unwrap()
                .lines()
                .any(|l| l == "hello-from-child")
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("output not captured");
    }

    #[test]
    fn dont_restart_code_is_honoured() {
        let mut sup = Supervisor::default();
        let t0 = Instant::now();
        sup.add(
            Spec {
                name: "once".into(),
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("exit {DONT_RESTART}"),
                ],
                tty: None,
                restart_delay: Duration::from_secs(1),
                health_checked: false,
            },
            t0,
        );
        sup.tick(t0);
        let State::Running(pid) = sup.services[0].state else {
            panic!()
        };
        sup.on_exit(wait_for(pid), t0);
        assert_eq!(sup.services[0].state, State::Stopped);
        assert!(!sup.on_exit(WaitStatus::Exited(Pid::from_raw(1), 0), t0));
    }
}
