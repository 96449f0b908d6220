//! The `log` backend: one line per record on stderr (the serial console under init, or
//! `RG_LOG_FILE` once the daemon detached), with a monotonic timestamp and the level.
//!
//! Logging never stalls the caller. A record is formatted and put on a bounded queue;
//! one writer thread drains the queue to stderr, however slowly the console takes it.
//! When the queue is full the record is dropped and counted, and the writer later says
//! "N log lines dropped (console too slow)".
//!
//! Records whose target starts with `net::` are caused by packets from the network
//! (`net::roam` "endpoint changed", `net::cookie`, `net::frame`, `net::handshake`) and
//! are rate-limited per target here, so the rest of the code logs plainly: a token bucket
//! per target, and a "suppressed N similar messages (TARGET)" line once it reopens.
//!
//! The writer thread and `fork` do not mix: [`pause`] before daemonizing (records are
//! then written synchronously) and [`resume`] in the child.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One line to the console in a single `write`: init, its services' relayed output and
/// the console itself share one terminal, and the kernel's tty layer keeps a single write
/// whole, while `eprintln!` writes the text and its newline separately: a console reply
/// written between the two lands mid-line (a CI run once found no line starting with
/// `clock: ` after `show status` while the restarted gateway's lines were relayed).
pub fn console_line(text: &str) {
    let _ = write_line(&mut std::io::stderr().lock(), text);
    if CONSOLE_SYSLOG.load(Ordering::Relaxed) {
        crate::syslog::process().console_line(text, Some(std::process::id()));
    }
}

/// A service's line init relays (`NAME: line`), as [`console_line`], sent to syslog with
/// the service's pid.
pub fn relayed_line(text: &str, pid: u32) {
    let _ = write_line(&mut std::io::stderr().lock(), text);
    if CONSOLE_SYSLOG.load(Ordering::Relaxed) {
        crate::syslog::process().console_line(text, Some(pid));
    }
}

/// Init's console lines (its own and its services') also go to this process's syslog
/// sender (`crate::syslog::process`), which sends them once a collector is set.
static CONSOLE_SYSLOG: AtomicBool = AtomicBool::new(false);
/// The app-name of this process's own records when it sends them to syslog itself (a
/// daemon not under init); `None`: it does not. Read only while [`RECORD_SYSLOG_ON`]:
/// a record costs no lock otherwise.
static RECORD_SYSLOG: Mutex<Option<&'static str>> = Mutex::new(None);
static RECORD_SYSLOG_ON: AtomicBool = AtomicBool::new(false);

/// The environment variable init sets for its services: their output reaches syslog
/// through init's relay, so they do not send it themselves.
pub const UNDER_INIT_ENV: &str = "RG_UNDER_INIT";

/// Init: send every console line to syslog (see [`console_line`]); the lines before
/// the configuration said where are kept for that collector (`syslog::Sender::hold`).
pub fn console_to_syslog() {
    if !CONSOLE_SYSLOG.swap(true, Ordering::Relaxed) {
        crate::syslog::process().hold();
    }
}

/// Whether this process runs under init (which relays its output to syslog).
pub fn under_init() -> bool {
    std::env::var_os(UNDER_INIT_ENV).is_some_and(|v| v == "1")
}

/// A process not under init that has a collector configured sends its own records there
/// as `app` (the daemon: `gateway`, as init names it); `None` stops. Under init nothing
/// changes: init's relay sends the process's output. Called at start-up and at every
/// reload of the configuration.
pub fn syslog(app: &'static str, target: Option<&crate::core::config::SyslogTarget>) {
    if under_init() {
        return;
    }
    *RECORD_SYSLOG.lock().unwrap_or_else(|p| p.into_inner()) = target.map(|_| app);
    RECORD_SYSLOG_ON.store(target.is_some(), Ordering::Release);
    if crate::syslog::process().set_target(target.cloned()) {
        match target {
            Some(t) => log::info!("syslog: sending log lines to {t} (in clear)"),
            None => log::info!("syslog: no longer sending log lines"),
        }
    }
}

/// The syslog severity of a log level (`core::syslog` maps the written word the same).
pub fn severity(level: log::Level) -> crate::core::syslog::Severity {
    use crate::core::syslog::Severity;
    match level {
        log::Level::Error => Severity::Error,
        log::Level::Warn => Severity::Warning,
        log::Level::Info => Severity::Info,
        log::Level::Debug | log::Level::Trace => Severity::Debug,
    }
}

/// `text` and its newline as one buffer, handed to `w` in one `write_all`.
pub fn write_line(w: &mut impl std::io::Write, text: &str) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(text.len() + 1);
    buf.extend_from_slice(text.as_bytes());
    buf.push(b'\n');
    w.write_all(&buf)
}

/// Lines the queue holds: at 115200 baud a console writes about 100 lines a second, so
/// this is ten seconds of backlog; a burst beyond that is dropped and counted.
pub const QUEUE_LINES: usize = 1024;
/// Longest line kept; the rest is cut (a record is a sentence, not a dump).
const MAX_LINE: usize = 2048;
/// Rate limit of `net::` targets: a burst of 5 lines, then one line per 10 s. Enough to
/// see that something happens and to whom, too little for a packet flood to fill the
/// console (the kernel's `net_ratelimit` is 10 per 5 s for the same reason).
pub const NET_BURST: u32 = 5;
pub const NET_REFILL: Duration = Duration::from_secs(10);
/// Targets with their own bucket; more (there are a handful in the code) share one.
const MAX_TARGETS: usize = 64;
const OVERFLOW_TARGET: &str = "net::*";
/// How long [`flush`] waits for the writer at most: exit paths must not hang on a
/// stuck console.
pub const FLUSH_WAIT: Duration = Duration::from_millis(500);
/// How often the writer looks for rate-limit windows that reopened with nothing logged.
const SWEEP: Duration = Duration::from_secs(1);

/// Whether a record passes the rate limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Log it; `suppressed` records of the same target were held back before it.
    Pass { suppressed: u64 },
    /// Hold it back (counted).
    Suppress,
}

#[derive(Debug)]
struct Bucket {
    tokens: u32,
    /// When the last token was credited.
    credited: Duration,
    suppressed: u64,
}

/// Token buckets per target. Time is passed in (monotonic time since start).
#[derive(Debug)]
pub struct RateLimiter {
    burst: u32,
    refill: Duration,
    buckets: HashMap<String, Bucket>,
}

impl RateLimiter {
    pub fn new(burst: u32, refill: Duration) -> RateLimiter {
        RateLimiter {
            burst: burst.max(1),
            refill: refill.max(Duration::from_millis(1)),
            buckets: HashMap::new(),
        }
    }

    /// Whether `target` is rate-limited at all.
    pub fn applies(target: &str) -> bool {
        target.starts_with("net::")
    }

    fn bucket(&mut self, target: &str, now: Duration) -> &mut Bucket {
        let key = if self.buckets.contains_key(target) || self.buckets.len() < MAX_TARGETS {
            target
        } else {
            OVERFLOW_TARGET
        };
        let (burst, refill) = (self.burst, self.refill);
        let b = self
            .buckets
            .entry(key.to_string())
            .or_insert_with(|| Bucket {
                tokens: burst,
                credited: now,
                suppressed: 0,
            });
        // Credit whole refill periods since the last credit.
        let elapsed = now.saturating_sub(b.credited);
        let periods = elapsed.as_nanos() / refill.as_nanos().max(1);
        if periods > 0 {
            let add = u32::try_from(periods).unwrap_or(u32::MAX);
            b.tokens = b.tokens.saturating_add(add).min(burst);
            b.credited = if b.tokens == burst {
                now
            } else {
                b.credited + refill * add
            };
        }
        b
    }

    /// Take a token for one record of `target` at `now`.
    pub fn admit(&mut self, target: &str, now: Duration) -> Admit {
        let b = self.bucket(target, now);
        if b.tokens == 0 {
            b.suppressed += 1;
            return Admit::Suppress;
        }
        b.tokens -= 1;
        Admit::Pass {
            suppressed: std::mem::take(&mut b.suppressed),
        }
    }

    /// Targets whose window reopened while records were held back and nothing of theirs
    /// has been logged since: their suppressed counts (reset), to be reported now.
    pub fn reopened(&mut self, now: Duration) -> Vec<(String, u64)> {
        let keys: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, b)| b.suppressed > 0)
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for k in keys {
            let b = self.bucket(&k, now);
            if b.tokens > 0 {
                out.push((k, std::mem::take(&mut b.suppressed)));
            }
        }
        out.sort();
        out
    }
}

/// The bounded queue between callers and the writer.
struct Queue {
    lines: VecDeque<String>,
    /// The writer holds a batch it has taken but not yet written.
    writing: bool,
    stop: bool,
}

pub struct Pipe {
    q: Mutex<Queue>,
    /// Signals the writer: lines queued or stop.
    more: Condvar,
    /// Signals flushers: a batch was written.
    written: Condvar,
    dropped: AtomicU64,
    cap: usize,
}

impl Pipe {
    pub fn new(cap: usize) -> Pipe {
        Pipe {
            q: Mutex::new(Queue {
                lines: VecDeque::new(),
                writing: false,
                stop: false,
            }),
            more: Condvar::new(),
            written: Condvar::new(),
            dropped: AtomicU64::new(0),
            cap: cap.max(1),
        }
    }

    /// Queue a line, or drop and count it when the queue is full. Never waits for the
    /// writer (the lock is held only to push or to take a whole batch).
    pub fn push(&self, line: String) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.lines.len() >= self.cap {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.lines.push_back(line);
        drop(q);
        self.more.notify_one();
        true
    }

    /// The writer's side: wait up to `wait` for lines, take them all. `None` when the
    /// writer should stop (stop asked and nothing left).
    fn take(&self, wait: Duration) -> Option<VecDeque<String>> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.writing = false;
        self.written.notify_all();
        if q.lines.is_empty() && !q.stop {
            q = self
                .more
                .wait_timeout(q, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if q.lines.is_empty() && q.stop {
            return None;
        }
        q.writing = !q.lines.is_empty();
        Some(std::mem::take(&mut q.lines))
    }

    /// Lines dropped since the last call.
    fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }

    /// Wait until everything queued so far is written, at most `wait`. True if it was.
    pub fn flush(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        while !q.lines.is_empty() || q.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .written
                .wait_timeout(q, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }

    fn set_stop(&self, stop: bool) {
        self.q.lock().unwrap_or_else(|p| p.into_inner()).stop = stop;
        self.more.notify_all();
    }
}

/// `[    12.345] riceguard INFO  message`
fn format_line(out: &mut String, t: Duration, level: log::Level, args: &dyn std::fmt::Display) {
    let start = out.len();
    let _ = writeln!(
        out,
        "[{:>5}.{:03}] riceguard {:<5} {}",
        t.as_secs(),
        t.subsec_millis(),
        level,
        args
    );
    if out.len() - start > MAX_LINE {
        let mut cut = start + MAX_LINE - 4;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...\n");
    }
}

fn suppressed_line(out: &mut String, t: Duration, target: &str, n: u64) {
    let msg = format!("suppressed {n} similar messages ({target})");
    format_line(out, t, log::Level::Info, &msg);
}

fn dropped_line(out: &mut String, t: Duration, n: u64) {
    let msg = format!("{n} log lines dropped (console too slow)");
    format_line(out, t, log::Level::Warn, &msg);
}

struct Logger {
    start: Instant,
    level: log::LevelFilter,
    pipe: Pipe,
    limiter: Mutex<RateLimiter>,
    /// Records go through the queue (a writer runs); otherwise straight to stderr.
    queued: AtomicBool,
    writer: Mutex<Option<JoinHandle<()>>>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

impl Logger {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn emit(&self, line: String) {
        if self.queued.load(Ordering::Acquire) {
            self.pipe.push(line);
        } else {
            write_stderr(line.as_bytes());
        }
    }

    /// The writer thread: drain batches, report drops and reopened rate-limit windows.
    fn write_loop(&self) {
        let mut buf = String::new();
        while let Some(batch) = self.pipe.take(SWEEP) {
            buf.clear();
            for l in &batch {
                buf.push_str(l);
            }
            let now = self.now();
            let dropped = self.pipe.take_dropped();
            if dropped > 0 {
                dropped_line(&mut buf, now, dropped);
            }
            let reopened = self
                .limiter
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .reopened(now);
            for (target, n) in reopened {
                suppressed_line(&mut buf, now, &target, n);
            }
            if !buf.is_empty() {
                write_stderr(buf.as_bytes());
            }
        }
    }
}

/// Write all of `b` to fd 2 without std's stderr lock (a writer blocked on a slow
/// console must not hold a lock a forked child would inherit). Errors lose the line.
fn write_stderr(mut b: &[u8]) {
    let fd = std::io::stderr();
    while !b.is_empty() {
        match nix::unistd::write(&fd, b) {
            Ok(0) => return,
            Ok(n) => b = &b[n.min(b.len())..],
            Err(nix::errno::Errno::EINTR) => {}
            // A non-blocking console: wait a little rather than spin.
            Err(nix::errno::Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return,
        }
    }
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = self.now();
        let mut line = String::new();
        if RateLimiter::applies(r.target()) {
            let admit = self
                .limiter
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .admit(r.target(), t);
            match admit {
                Admit::Suppress => return,
                Admit::Pass { suppressed: 0 } => {}
                Admit::Pass { suppressed } => suppressed_line(&mut line, t, r.target(), suppressed),
            }
        }
        format_line(&mut line, t, r.level(), r.args());
        self.emit(line);
        if !RECORD_SYSLOG_ON.load(Ordering::Acquire) {
            return;
        }
        let app = *RECORD_SYSLOG.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(app) = app {
            crate::syslog::process().send(
                app,
                Some(std::process::id()),
                severity(r.level()),
                &r.args().to_string(),
            );
        }
    }

    fn flush(&self) {
        if self.queued.load(Ordering::Acquire) {
            self.pipe.flush(FLUSH_WAIT);
        }
    }
}

fn start_writer(l: &'static Logger) {
    let mut w = l.writer.lock().unwrap_or_else(|p| p.into_inner());
    if w.is_some() {
        return;
    }
    l.pipe.set_stop(false);
    // The writer starts with every signal blocked (a thread inherits its creator's
    // mask): signals are for the threads that wait for them (the daemon's sigwait), and
    // a SIGTERM delivered here would take the default action and end the process.
    use nix::sys::signal::{SigSet, SigmaskHow};
    let mut old = SigSet::empty();
    let blocked = nix::sys::signal::pthread_sigmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    )
    .is_ok();
    let spawned = std::thread::Builder::new()
        .name("rg-log".into())
        .spawn(move || l.write_loop());
    if blocked {
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    match spawned {
        Ok(h) => {
            *w = Some(h);
            l.queued.store(true, Ordering::Release);
        }
        // No thread: records are written synchronously, as before.
        Err(_) => l.queued.store(false, Ordering::Release),
    }
}

extern "C" fn flush_at_exit() {
    flush();
}

/// Install the logger once; the level comes from `RG_LOG` (error..trace), default info.
pub fn init() {
    let level = match std::env::var("RG_LOG")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "error" => log::LevelFilter::Error,
        "warn" => log::LevelFilter::Warn,
        "debug" => log::LevelFilter::Debug,
        "trace" => log::LevelFilter::Trace,
        "off" => log::LevelFilter::Off,
        _ => log::LevelFilter::Info,
    };
    let mut first = false;
    let l = LOGGER.get_or_init(|| {
        first = true;
        Logger {
            start: Instant::now(),
            level,
            pipe: Pipe::new(QUEUE_LINES),
            limiter: Mutex::new(RateLimiter::new(NET_BURST, NET_REFILL)),
            queued: AtomicBool::new(false),
            writer: Mutex::new(None),
        }
    });
    if !first {
        return;
    }
    if log::set_logger(l).is_ok() {
        log::set_max_level(level);
        start_writer(l);
        // Returning from main or `exit` waits (bounded) for queued lines.
        crate::sys::process::at_exit(flush_at_exit);
    }
}

/// Wait (at most [`FLUSH_WAIT`]) until queued lines are written; for exit paths.
pub fn flush() {
    if let Some(l) = LOGGER.get() {
        log::Log::flush(l);
    }
}

/// Stop the writer thread before `fork`: flush, stop, and write records synchronously
/// until [`resume`]. A writer stuck on the console past the flush bound is abandoned
/// (it holds no lock; the child will not have it anyway).
pub fn pause() {
    let Some(l) = LOGGER.get() else { return };
    l.queued.store(false, Ordering::Release);
    l.pipe.flush(FLUSH_WAIT);
    l.pipe.set_stop(true);
    let h = l.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(h) = h {
        let deadline = Instant::now() + FLUSH_WAIT;
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if h.is_finished() {
            let _ = h.join();
        }
        // else: dropping the handle detaches the thread.
    }
}

/// Start the writer again (in the forked child, or after a failed fork).
pub fn resume() {
    if let Some(l) = LOGGER.get() {
        start_writer(l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Records every `write` call it gets, as a terminal sees them.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl std::io::Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A console line reaches the terminal as one write, newline included (`eprintln!`
    /// makes two, and another writer's line can land between them).
    #[test]
    fn console_line_is_one_write() {
        let mut w = Writes::default();
        write_line(&mut w, "riceguard-init: gateway started (pid 7)").unwrap();
        write_line(
            &mut w,
            "clock: 2026-12-03T22:11:13Z\nversion: riceguard 0.1.0",
        )
        .unwrap();
        assert_eq!(
            w.0,
            [
                b"riceguard-init: gateway started (pid 7)\n".to_vec(),
                b"clock: 2026-12-03T22:11:13Z\nversion: riceguard 0.1.0\n".to_vec()
            ]
        );
        // What it replaces: the text and the newline as separate writes.
        let mut e = Writes::default();
        std::io::Write::write_fmt(&mut e, format_args!("{}\n", String::from("x"))).unwrap();
        assert!(e.0.len() > 1, "{:?}", e.0);
    }

    /// init writes to the shared terminal only through `console_line` (its `say!` and the
    /// relay), never with `eprintln!`/`println!`.
    #[test]
    fn init_writes_whole_lines() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/init");
        let mut found = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap();
            found += 1;
            for (n, l) in text.lines().enumerate() {
                let code = l.split("//").next().unwrap_or("");
                assert!(
                    !code.contains("eprintln!")
                        && !code.contains("println!")
                        && !code.contains("eprint!"),
                    "{}:{}: writes to the console in pieces: {l}",
                    p.display(),
                    n + 1
                );
            }
        }
        assert!(found > 5, "read {found} files of {}", dir.display());
    }

    /// A record's level and the level word `core::syslog` reads in a relayed line give
    /// the same severity: a line has one severity whichever way it reaches syslog.
    #[test]
    fn syslog_severity_matches_the_written_level() {
        for level in [
            log::Level::Error,
            log::Level::Warn,
            log::Level::Info,
            log::Level::Debug,
            log::Level::Trace,
        ] {
            let mut o = String::new();
            format_line(&mut o, s(3), level, &"text");
            let (sev, msg) = crate::core::syslog::parse_logger_line(o.trim_end());
            assert_eq!((sev, msg), (severity(level), "text"), "{o}");
        }
    }

    #[test]
    fn limiter_burst_then_one_per_period() {
        let mut r = RateLimiter::new(5, s(10));
        for _ in 0..5 {
            assert_eq!(r.admit("net::roam", s(0)), Admit::Pass { suppressed: 0 });
        }
        for _ in 0..100 {
            assert_eq!(r.admit("net::roam", s(1)), Admit::Suppress);
        }
        // Not yet a whole period.
        assert_eq!(
            r.admit("net::roam", Duration::from_millis(9_999)),
            Admit::Suppress
        );
        // The window reopens: one record, carrying the count held back.
        assert_eq!(r.admit("net::roam", s(10)), Admit::Pass { suppressed: 101 });
        assert_eq!(r.admit("net::roam", s(11)), Admit::Suppress);
        assert_eq!(r.admit("net::roam", s(20)), Admit::Pass { suppressed: 1 });
        // A long quiet spell refills to the burst, no more.
        for _ in 0..5 {
            assert_eq!(r.admit("net::roam", s(1000)), Admit::Pass { suppressed: 0 });
        }
        assert_eq!(r.admit("net::roam", s(1000)), Admit::Suppress);
    }

    #[test]
    fn limiter_is_per_target() {
        let mut r = RateLimiter::new(5, s(10));
        for _ in 0..5 {
            r.admit("net::roam", s(0));
        }
        assert_eq!(r.admit("net::roam", s(0)), Admit::Suppress);
        assert_eq!(r.admit("net::cookie", s(0)), Admit::Pass { suppressed: 0 });
        assert!(RateLimiter::applies("net::frame"));
        assert!(!RateLimiter::applies("riceguard::driver"));
        assert!(!RateLimiter::applies("network"));
    }

    #[test]
    fn limiter_partial_refill_keeps_the_remainder() {
        let mut r = RateLimiter::new(5, s(10));
        for _ in 0..5 {
            r.admit("net::x", s(0));
        }
        // 25 s: two tokens, and the next one is due at 30 s, not 35 s.
        assert!(matches!(r.admit("net::x", s(25)), Admit::Pass { .. }));
        assert!(matches!(r.admit("net::x", s(25)), Admit::Pass { .. }));
        assert_eq!(r.admit("net::x", s(29)), Admit::Suppress);
        assert_eq!(r.admit("net::x", s(30)), Admit::Pass { suppressed: 1 });
    }

    #[test]
    fn reopened_reports_held_back_counts_once() {
        let mut r = RateLimiter::new(1, s(10));
        r.admit("net::cookie", s(0));
        for _ in 0..7 {
            r.admit("net::cookie", s(1));
        }
        assert!(r.reopened(s(5)).is_empty(), "window still closed");
        assert_eq!(r.reopened(s(10)), vec![("net::cookie".to_string(), 7)]);
        assert!(r.reopened(s(11)).is_empty(), "reported once");
        // The reopened window still lets the next record through.
        assert_eq!(r.admit("net::cookie", s(12)), Admit::Pass { suppressed: 0 });
    }

    #[test]
    fn limiter_bounds_its_targets() {
        let mut r = RateLimiter::new(1, s(10));
        for i in 0..(MAX_TARGETS * 4) {
            r.admit(&format!("net::t{i}"), s(0));
        }
        assert!(r.buckets.len() <= MAX_TARGETS + 1);
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let p = Pipe::new(3);
        for i in 0..10 {
            let queued = p.push(format!("line {i}\n"));
            assert_eq!(queued, i < 3);
        }
        assert_eq!(p.take_dropped(), 7);
        assert_eq!(p.take_dropped(), 0, "counted once");
        let batch = p.take(Duration::ZERO).unwrap_or_default();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0], "line 0\n");
        // Room again after the writer took the batch.
        assert!(p.push("again\n".into()));
    }

    #[test]
    fn flush_waits_for_the_writer_and_is_bounded() {
        let p = Pipe::new(8);
        assert!(p.flush(Duration::ZERO), "nothing queued: flushed");
        p.push("x\n".into());
        assert!(!p.flush(Duration::from_millis(1)), "no writer: bounded");
        let _batch = p.take(Duration::ZERO);
        assert!(!p.flush(Duration::ZERO), "batch still being written");
        // The writer comes back for more: the batch is done.
        p.set_stop(true);
        assert!(p.take(Duration::ZERO).is_none());
        assert!(p.flush(Duration::ZERO));
    }

    #[test]
    fn lines_and_reports_format() {
        let mut o = String::new();
        format_line(
            &mut o,
            Duration::from_millis(12_345),
            log::Level::Info,
            &"hi",
        );
        assert_eq!(o, "[   12.345] riceguard INFO  hi\n");
        o.clear();
        dropped_line(&mut o, s(1), 42);
        assert!(
            o.ends_with("WARN  42 log lines dropped (console too slow)\n"),
            "{o}"
        );
        o.clear();
        suppressed_line(&mut o, s(1), "net::roam", 3);
        assert!(
            o.ends_with("suppressed 3 similar messages (net::roam)\n"),
            "{o}"
        );
        o.clear();
        format_line(&mut o, s(1), log::Level::Info, &"é".repeat(MAX_LINE));
        assert!(o.len() <= MAX_LINE && o.ends_with("...\n"));
    }
}
