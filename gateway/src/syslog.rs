//! The remote syslog sender: one thread per process that sends `core::syslog` messages
//! to the configured collector, over UDP or TCP (octet counting).
//!
//! Callers never wait for the network: [`Sender::send`] formats the message and puts it
//! in the bounded backlog (`core::syslog::Backlog`, [`BACKLOG_BYTES`] unless
//! `RG_SYSLOG_BUFFER` says otherwise: tests use it to overflow a small one), which drops
//! the oldest message when full and says how many were dropped once sending resumes.
//! The lock is held only to push or to take one message. The sender thread resolves the
//! host through the system resolver (again at most every 30 s after a failure), connects
//! with a 5 s deadline, writes with a 5 s timeout, and backs off 1 s doubling to 30 s
//! after a failure, so a dead collector stalls nothing but its own thread.
//!
//! Syslog leaves the box in clear: the messages say which peers connect and when.
//!
//! One process tree has one sender: init's ([`process`] in PID 1) carries its services'
//! relayed output; a daemon run by hand (`riceguard up --config`, not under init) sends
//! its own lines.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::core::clock::UnixTime;
use crate::core::config::SyslogTarget;
use crate::core::syslog::{self, Backlog, Origin, Severity, Taken};

pub use crate::core::syslog::BACKLOG_BYTES;

/// The first delay after a failed send or connection; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A name that did not resolve is tried again after this long.
pub const RESOLVE_RETRY: Duration = Duration::from_secs(30);
/// Deadlines of a TCP connect and of one write.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment variable that sets the backlog's budget in bytes (tests only).
pub const BUFFER_ENV: &str = "RG_SYSLOG_BUFFER";

struct State {
    target: Option<SyslogTarget>,
    /// Bumped at every change of target: the thread drops its socket and resolution.
    generation: u64,
    /// No target decided yet: messages are kept for the first one (init's boot lines
    /// before it read the configuration); see [`Sender::hold`].
    undecided: bool,
    backlog: Backlog,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    more: Condvar,
    origin: Origin,
}

/// A handle on the sender thread (cheap to clone).
#[derive(Clone)]
pub struct Sender {
    shared: Arc<Shared>,
    started: Arc<Mutex<bool>>,
}

fn now_unix() -> UnixTime {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => UnixTime::from_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        Err(_) => UnixTime::EPOCH,
    }
}

/// The box's host name (the kernel's; `-` when unknown).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn budget_from_env() -> usize {
    std::env::var(BUFFER_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(BACKLOG_BYTES)
}

impl Sender {
    /// A sender with no collector yet; the thread starts with the first target.
    pub fn new(hostname: &str, budget: usize) -> Sender {
        Sender {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    target: None,
                    generation: 0,
                    undecided: false,
                    backlog: Backlog::new(budget),
                    stop: false,
                }),
                more: Condvar::new(),
                origin: Origin::new(hostname),
            }),
            started: Arc::new(Mutex::new(false)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a collector is set (callers skip formatting otherwise).
    pub fn active(&self) -> bool {
        self.lock().target.is_some()
    }

    /// Send to `target` from now on; `None` stops sending and forgets the backlog.
    /// Returns true when the target changed.
    pub fn set_target(&self, target: Option<SyslogTarget>) -> bool {
        let mut s = self.lock();
        let held = std::mem::take(&mut s.undecided);
        if s.target == target {
            if held && target.is_none() {
                s.backlog.clear();
            }
            return false;
        }
        if target.is_none() {
            s.backlog.clear();
        }
        s.target = target;
        s.generation += 1;
        let start = s.target.is_some();
        drop(s);
        self.shared.more.notify_all();
        if start {
            self.start_thread();
        }
        true
    }

    fn start_thread(&self) {
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if *started {
            return;
        }
        // Every signal blocked in the thread (it inherits its creator's mask): signals
        // are for the threads that wait for them, as for the logger's writer.
        use nix::sys::signal::{SigSet, SigmaskHow};
        let mut old = SigSet::empty();
        let blocked = nix::sys::signal::pthread_sigmask(
            SigmaskHow::SIG_SETMASK,
            Some(&SigSet::all()),
            Some(&mut old),
        )
        .is_ok();
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name("rg-syslog".into())
            .spawn(move || run(&shared));
        if blocked {
            let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
        *started = spawned.is_ok();
    }

    /// Keep messages (within the budget) until the first [`Sender::set_target`]: sent
    /// to the collector it names, forgotten if it names none.
    pub fn hold(&self) {
        let mut s = self.lock();
        if s.target.is_none() && s.generation == 0 {
            s.undecided = true;
        }
    }

    /// Queue one message (dropped unsent while no collector is set). Never waits for
    /// the network.
    pub fn send(&self, app: &str, procid: Option<u32>, severity: Severity, msg: &str) {
        let mut s = self.lock();
        if s.target.is_none() && !s.undecided {
            return;
        }
        let m = self
            .shared
            .origin
            .message(now_unix(), app, procid, severity, msg);
        s.backlog.push(m);
        drop(s);
        self.shared.more.notify_one();
    }

    /// Queue a line init wrote on the console (its own, or a service's it relayed as
    /// `NAME: line`): app-name, severity and text from `core::syslog::parse_console_line`.
    pub fn console_line(&self, line: &str, procid: Option<u32>) {
        let l = syslog::parse_console_line(line);
        self.send(l.app, procid, l.severity, l.msg);
    }

    /// Stop the thread (tests).
    pub fn stop(&self) {
        self.lock().stop = true;
        self.shared.more.notify_all();
    }

    /// Messages held now and dropped not yet said (tests).
    pub fn pending(&self) -> (usize, u64) {
        let s = self.lock();
        (s.backlog.len(), s.backlog.dropped())
    }
}

/// This process's sender: the host name the kernel has, the budget from
/// [`BUFFER_ENV`] or [`BACKLOG_BYTES`].
pub fn process() -> &'static Sender {
    static SENDER: OnceLock<Sender> = OnceLock::new();
    SENDER.get_or_init(|| Sender::new(&hostname(), budget_from_env()))
}

enum Link {
    Udp(UdpSocket),
    Tcp(TcpStream),
}

impl Link {
    fn open(addr: SocketAddr, tcp: bool) -> io::Result<Link> {
        if tcp {
            let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
            s.set_write_timeout(Some(WRITE_TIMEOUT))?;
            let _ = s.set_nodelay(true);
            Ok(Link::Tcp(s))
        } else {
            let local: SocketAddr = if addr.is_ipv4() {
                "0.0.0.0:0".parse().map_err(io::Error::other)?
            } else {
                "[::]:0".parse().map_err(io::Error::other)?
            };
            let s = UdpSocket::bind(local)?;
            // Connected: a collector's port unreachable comes back as an error.
            s.connect(addr)?;
            s.set_write_timeout(Some(WRITE_TIMEOUT))?;
            Ok(Link::Udp(s))
        }
    }

    /// Send one message whole, or fail (a TCP connection is then dropped: a partly
    /// written frame cannot be continued on another).
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        match self {
            Link::Udp(s) => s.send(syslog::datagram(msg)).map(|_| ()),
            Link::Tcp(s) => {
                // The collector sends nothing: readable means it closed (or reset) the
                // connection, and what we would write now would be lost.
                let mut b = [0u8; 1];
                use nix::sys::socket::{recv, MsgFlags};
                match recv(
                    s.as_raw_fd(),
                    &mut b,
                    MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
                ) {
                    Ok(_) => return Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                    Err(nix::errno::Errno::EAGAIN) => {}
                    Err(e) => return Err(io::Error::from(e)),
                }
                let frame = syslog::frame_tcp(msg);
                let mut rest: &[u8] = &frame;
                while !rest.is_empty() {
                    // MSG_NOSIGNAL: a reset connection is an error, not SIGPIPE.
                    match nix::sys::socket::send(s.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
                        Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                        Ok(n) => rest = &rest[n.min(rest.len())..],
                        Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(io::Error::from(e)),
                    }
                }
                s.flush()
            }
        }
    }
}

/// The sender thread's loop.
fn run(shared: &Shared) {
    let procid = Some(std::process::id());
    let mut generation = u64::MAX;
    let mut target: Option<SyslogTarget> = None;
    let mut addr: Option<SocketAddr> = None;
    let mut resolve_after: Option<Instant> = None;
    let mut link: Option<Link> = None;
    let mut backoff = FIRST_BACKOFF;
    let mut not_before: Option<Instant> = None;
    loop {
        // Wait for a message, a change of target or the end of a back-off.
        let taken: Taken = {
            let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop {
                    return;
                }
                if s.generation != generation {
                    generation = s.generation;
                    target = s.target.clone();
                    addr = None;
                    resolve_after = None;
                    link = None;
                    backoff = FIRST_BACKOFF;
                    not_before = None;
                }
                let now = Instant::now();
                let waiting = not_before.filter(|&t| t > now);
                if target.is_some() && waiting.is_none() {
                    if let Some(t) = s.backlog.take(&shared.origin, now_unix(), procid) {
                        break t;
                    }
                }
                let wait = waiting.map_or(Duration::from_secs(5), |t| t - now);
                s = shared
                    .more
                    .wait_timeout(s, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        };
        let Some(t) = target.as_ref() else {
            continue;
        };
        let result = deliver(t, &mut addr, &mut resolve_after, &mut link, taken.bytes());
        let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                backoff = FIRST_BACKOFF;
                not_before = None;
            }
            Err(wait) => {
                if s.generation == generation {
                    s.backlog.unsend(taken);
                }
                let wait = wait.unwrap_or(backoff);
                not_before = Some(Instant::now() + wait);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Resolve, connect and send one message. `Err(Some(wait))`: try again after `wait`
/// (the name did not resolve); `Err(None)`: after the back-off.
fn deliver(
    t: &SyslogTarget,
    addr: &mut Option<SocketAddr>,
    resolve_after: &mut Option<Instant>,
    link: &mut Option<Link>,
    msg: &[u8],
) -> Result<(), Option<Duration>> {
    if addr.is_none() {
        if let Some(at) = *resolve_after {
            let now = Instant::now();
            if at > now {
                return Err(Some(at - now));
            }
        }
        // An IP literal needs no resolver; a name goes through the system's.
        *addr = (t.host.as_str(), t.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next());
        if addr.is_none() {
            *resolve_after = Some(Instant::now() + RESOLVE_RETRY);
            return Err(Some(RESOLVE_RETRY));
        }
    }
    let Some(a) = *addr else {
        return Err(None);
    };
    if link.is_none() {
        *link = Some(Link::open(a, t.tcp).map_err(|_| None)?);
    }
    let Some(l) = link.as_mut() else {
        return Err(None);
    };
    if l.send(msg).is_err() {
        *link = None;
        // A name may point elsewhere now.
        if t.host.parse::<std::net::IpAddr>().is_err() {
            *addr = None;
        }
        return Err(None);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read};
    use std::net::TcpListener;

    fn target(addr: SocketAddr, tcp: bool) -> SyslogTarget {
        SyslogTarget {
            host: addr.ip().to_string(),
            port: addr.port(),
            tcp,
        }
    }

    /// Read one octet-counted frame.
    fn frame(r: &mut BufReader<TcpStream>) -> String {
        let mut len = Vec::new();
        r.read_until(b' ', &mut len).unwrap();
        let n: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
        let mut b = vec![0; n];
        r.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }

    /// Held before the first target: kept for it; forgotten if there is none.
    #[test]
    fn held_until_the_first_target() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let s = Sender::new("gw", 65536);
        s.hold();
        s.send("init", Some(1), Severity::Notice, "boot line");
        assert_eq!(s.pending(), (1, 0));
        s.set_target(Some(target(rx.local_addr().unwrap(), false)));
        let mut b = [0u8; 4096];
        let n = rx.recv(&mut b).unwrap();
        assert!(std::str::from_utf8(&b[..n])
            .unwrap()
            .ends_with(" gw init 1 - - boot line"));
        s.stop();
        let s = Sender::new("gw", 65536);
        s.hold();
        s.send("init", Some(1), Severity::Notice, "boot line");
        assert!(!s.set_target(None));
        assert_eq!(s.pending(), (0, 0));
        s.send("init", Some(1), Severity::Notice, "not kept");
        assert_eq!(s.pending(), (0, 0));
    }

    #[test]
    fn udp_one_message_per_datagram() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let s = Sender::new("gw", 65536);
        s.send(
            "gateway",
            Some(1),
            Severity::Info,
            "before any target: not kept",
        );
        assert!(s.set_target(Some(target(rx.local_addr().unwrap(), false))));
        assert!(!s.set_target(Some(target(rx.local_addr().unwrap(), false))));
        s.console_line("gateway: [   1.000] riceguard WARN  hello", Some(7));
        s.send("ntp", None, Severity::Info, &"é".repeat(5000));
        let mut b = [0u8; 65536];
        let n = rx.recv(&mut b).unwrap();
        let m = std::str::from_utf8(&b[..n]).unwrap();
        assert!(m.starts_with("<28>1 "), "{m}");
        assert!(m.ends_with(" gw gateway 7 - - hello"), "{m}");
        let n = rx.recv(&mut b).unwrap();
        assert!(n <= syslog::MAX_UDP && std::str::from_utf8(&b[..n]).is_ok());
        s.stop();
    }

    /// TCP: octet-counted frames; the collector goes away and comes back on the same
    /// port: what was logged meanwhile arrives, after the notice of what was dropped.
    #[test]
    fn tcp_frames_buffer_and_drop_notice() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let s = Sender::new("gw", 600);
        s.set_target(Some(target(addr, true)));
        s.send("gateway", Some(1), Severity::Info, "first");
        let (c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(c);
        assert!(frame(&mut r).ends_with(" gw gateway 1 - - first"));
        // The collector stops.
        drop(r);
        drop(l);
        // Wait until the sender has seen it: a message stays queued.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            s.send("gateway", Some(1), Severity::Info, "probe");
            std::thread::sleep(Duration::from_millis(50));
            if s.pending().0 > 0 || Instant::now() > deadline {
                break;
            }
        }
        for i in 0..40 {
            s.send(
                "gateway",
                Some(1),
                Severity::Info,
                &format!("while away {i}"),
            );
        }
        let (held, dropped) = s.pending();
        assert!(held > 0 && dropped > 0, "{held} {dropped}");
        // Back on the same port.
        let l = TcpListener::bind(addr).unwrap();
        let (c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(c);
        let first = frame(&mut r);
        assert!(first.starts_with("<28>1 "), "{first}");
        assert!(
            first.contains(" gw syslog ")
                && first.ends_with(" dropped while the collector was unreachable"),
            "{first}"
        );
        let mut last = String::new();
        while !last.ends_with("while away 39") {
            last = frame(&mut r);
        }
        s.set_target(None);
        assert_eq!(s.pending(), (0, 0));
        s.stop();
    }
}
