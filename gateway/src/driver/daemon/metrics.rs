//! The Prometheus endpoint of `riceguard up --config` (`Metrics = on`): a thread that
//! listens on `[::]:MetricsPort` and answers `GET /metrics` with `core::metrics`'s text
//! format, written into the socket through a `BufWriter` as it is made.
//!
//! Small and robust: at most [`MAX_CONNS`] connections at once (more are closed at
//! accept), the whole request head within [`HEAD_DEADLINE`] and [`MAX_HEAD`] bytes,
//! `Connection: close`, a client that stops reading cut after [`WRITE_TIMEOUT`] and any
//! after [`ANSWER_DEADLINE`]. Who may connect is `core::firewall::services`' judgement on
//! the running configuration and the interfaces' addresses now, checked after accept as
//! `riceguard ssh` does, so `Firewall = off` does not open it to the uplink. Its threads
//! are niced and kept off the workers' cores when another core is online.
//!
//! [`Metrics::follow`] starts, stops or moves it when a reload changes `Metrics` or
//! `MetricsPort`. A scrape reads the peers through `Device::peer_stats` (each peer's
//! lock taken briefly, as `wg show` does); nothing a worker takes per packet is held
//! longer.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::config::Config;
use crate::core::device::Device;
use crate::core::metrics::{
    self as m, GatewayMetrics, HttpError, Monotonic, PeerExtra, PeerMetrics, Route, Transport,
    MAX_HEAD,
};
use crate::core::offload::UdpTx;
use crate::driver::dataplane::heartbeat::Heartbeats;
use crate::driver::tcp::link::TcpSlot;

/// Connections served at once; more are closed at accept.
pub const MAX_CONNS: usize = 4;
/// The request head must arrive within this.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// A client that reads nothing for this long is cut off.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole answer must be read within this (a client reading a byte now and then).
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(60);

/// What a scrape reads, shared with the daemon.
pub struct Sources {
    pub device: Arc<Device>,
    pub heartbeats: Arc<Heartbeats>,
    pub tcp: Arc<TcpSlot>,
    pub udp_tx: UdpTx,
    pub started: Instant,
    /// The workers' cores: the endpoint's threads run off them when others are online.
    pub worker_cores: Vec<usize>,
    /// The resolver on the box's counts now (appliance mode; a closure, so this file
    /// does not import the resolver's, which uses this one's niceness rule).
    pub dns: Option<DnsStats>,
}

/// How the endpoint reads the resolver's counts.
pub type DnsStats = Arc<dyn Fn() -> crate::core::dns::Stats + Send + Sync>;

/// The endpoint: the configuration it follows and the running listener thread.
pub struct Metrics {
    sources: Arc<Sources>,
    /// The configuration file as read (disabled peers included), for the disabled
    /// peers' series and the source check.
    config: Arc<Mutex<Arc<Config>>>,
    counters: Arc<Mutex<Monotonic>>,
    running: Mutex<Option<Listener>>,
}

struct Listener {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Metrics {
    pub fn new(sources: Sources) -> Metrics {
        Metrics {
            sources: Arc::new(sources),
            config: Arc::new(Mutex::new(Arc::new(Config::default()))),
            counters: Arc::new(Mutex::new(Monotonic::default())),
            running: Mutex::new(None),
        }
    }

    /// Follow `cfg` (the file as read, at start and after each reload): listen on its
    /// `MetricsPort` while `Metrics = on`, move when the port changed, stop when off. A
    /// port that cannot be bound is said; nothing listens then.
    pub fn follow(&self, cfg: &Config) {
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg.clone());
        let mut run = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let want = cfg.gateway.metrics.then_some(cfg.gateway.metrics_port);
        if run.as_ref().map(|l| l.port) == want {
            return;
        }
        if let Some(old) = run.take() {
            old.stop.store(true, Ordering::Relaxed);
            let _ = old.thread.join();
            log::info!("metrics: stopped listening on port {}", old.port);
        }
        let Some(port) = want else { return };
        match self.start(port) {
            Ok(l) => {
                log::info!("metrics: listening on [::]:{port} (GET /metrics)");
                *run = Some(l);
            }
            Err(e) => log::error!("metrics: cannot listen on TCP port {port}: {e}"),
        }
    }

    fn start(&self, port: u16) -> std::io::Result<Listener> {
        let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let listener = crate::sys::tcp::listen(addr, 16)
            .or_else(|_| crate::sys::tcp::listen(SocketAddr::from(([0, 0, 0, 0], port)), 16))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let ctx = Ctx {
            sources: self.sources.clone(),
            config: self.config.clone(),
            counters: self.counters.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("rg-metrics".into())
            .spawn(move || accept_loop(listener, ctx, st))?;
        Ok(Listener { port, stop, thread })
    }

    /// The port it listens on now (`None`: off, or the port could not be bound).
    pub fn port(&self) -> Option<u16> {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.port)
    }

    /// Stop listening (process exit).
    pub fn stop(&self) {
        let mut c = self
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .clone();
        c.gateway.metrics = false;
        self.follow(&c);
    }
}

#[derive(Clone)]
struct Ctx {
    sources: Arc<Sources>,
    config: Arc<Mutex<Arc<Config>>>,
    counters: Arc<Mutex<Monotonic>>,
}

/// The endpoint's threads (this one and the connections it starts, which inherit it; the
/// DNS forwarder's too) run behind the data plane: niced (Linux's nice is per thread) and off the workers' cores
/// when another core is online, as `riceguard ssh` does.
pub(super) fn stay_out_of_the_way(who: &str, worker_cores: &[usize]) {
    if let Err(e) = crate::sys::process::set_nice(NICE) {
        log::warn!("{who}: cannot lower the thread's priority: {e}");
    }
    let pid = nix::unistd::Pid::from_raw(0);
    let Ok(set) = nix::sched::sched_getaffinity(pid) else {
        return;
    };
    let mut to = nix::sched::CpuSet::new();
    let mut any = false;
    for c in 0..nix::sched::CpuSet::count() {
        if set.is_set(c).unwrap_or(false) && !worker_cores.contains(&c) {
            any = to.set(c).is_ok() || any;
        }
    }
    if any {
        let _ = nix::sched::sched_setaffinity(pid, &to);
    }
}

/// The endpoint threads' niceness.
const NICE: i32 = 10;

fn accept_loop(listener: TcpListener, ctx: Ctx, stop: Arc<AtomicBool>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    stay_out_of_the_way("metrics", &ctx.sources.worker_cores);
    let busy = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(200u16)), Ok(n) if n > 0) {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(_) => continue,
        };
        let ip = peer.ip().to_canonical();
        let cfg = ctx.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Err(why) = source_allowed(&cfg, ip) {
            log::info!(target: "net::metrics", "metrics: {ip} refused: {why}");
            continue; // dropped: closed
        }
        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
            busy.fetch_sub(1, Ordering::AcqRel);
            log::info!(target: "net::metrics", "metrics: {ip} refused: {MAX_CONNS} connections already");
            continue;
        }
        let ctx = ctx.clone();
        let b = busy.clone();
        let spawned = std::thread::Builder::new()
            .name("rg-metrics-conn".into())
            .spawn(move || {
                serve(stream, &ctx);
                b.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Who may reach the appliance's services: `core::firewall::services` over the running
/// configuration and the interfaces' addresses now (loopback allowed); fail closed.
fn source_allowed(cfg: &Config, ip: IpAddr) -> Result<(), String> {
    if ip.is_loopback() {
        return Ok(());
    }
    let mut nl = crate::sys::netlink::Netlink::open()
        .map_err(|e| format!("the interfaces' addresses cannot be read ({e})"))?;
    let ports =
        crate::driver::appliance::firewall::ports_now(&mut nl, &cfg.gateway.interface_name, cfg, 0);
    use crate::core::firewall::services::{source, Source};
    match source(cfg, &ports, ip) {
        Source::Outside => Err("not from the tunnel or the LAN side".into()),
        _ => Ok(()),
    }
}

/// Read one request head within [`HEAD_DEADLINE`] and [`MAX_HEAD`] bytes; `None`: the
/// client went away or took too long (answered 408 when it can be).
fn read_head(s: &mut TcpStream) -> Option<Result<Route, HttpError>> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut n = 0;
    loop {
        if let Some(end) = m::head_end(&buf[..n]) {
            return Some(m::parse_request(&buf[..end]));
        }
        if n == buf.len() {
            return Some(Err(HttpError::TooLarge));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            let _ = respond_error(s, 408, "Request Timeout", false);
            return None;
        }
        match s.read(&mut buf[n..]) {
            Ok(0) => {
                // Closed before its head ended: a bare request line with no empty line
                // is still judged (and refused).
                return (n > 0).then(|| m::parse_request(&buf[..n]));
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                let _ = respond_error(s, 408, "Request Timeout", false);
                return None;
            }
        }
    }
}

fn respond_error(
    s: &mut TcpStream,
    code: u16,
    reason: &str,
    allow_get: bool,
) -> std::io::Result<()> {
    let body = format!("{code} {reason}\n");
    let head = m::response_head(code, reason, "text/plain; charset=utf-8", allow_get);
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())
}

fn serve(mut s: TcpStream, ctx: &Ctx) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = s.set_nodelay(true);
    let Some(req) = read_head(&mut s) else {
        return;
    };
    let r = match req {
        Err(e) => {
            let (code, reason) = e.status();
            respond_error(&mut s, code, reason, e == HttpError::MethodNotAllowed)
        }
        Ok(Route::Index) => s
            .write_all(m::response_head(200, "OK", "text/html; charset=utf-8", false).as_bytes())
            .and_then(|()| s.write_all(m::INDEX_PAGE.as_bytes())),
        Ok(Route::Metrics) => scrape(&mut s, ctx),
    };
    if let Err(e) = r {
        log::debug!(target: "net::metrics", "metrics: answer cut: {e}");
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Read what the client still sends (briefly, at most 64 KiB) so closing does not
    // reset the answer before it is read.
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(s.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
}

fn scrape(s: &mut TcpStream, ctx: &Ctx) -> std::io::Result<()> {
    let cfg = ctx.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (g, peers) = {
        let mut mono = ctx.counters.lock().unwrap_or_else(|p| p.into_inner());
        collect(&ctx.sources, &cfg, &mut mono)
    };
    let deadline = Deadline {
        out: s,
        until: Instant::now() + ANSWER_DEADLINE,
    };
    let mut w = BufWriter::with_capacity(64 * 1024, deadline);
    w.write_all(m::response_head(200, "OK", m::CONTENT_TYPE, false).as_bytes())?;
    let mut w = m::write_exposition(w, &g, &peers)?;
    w.flush()
}

/// A writer that fails once its deadline has passed: a client that reads slowly enough
/// never to hit [`WRITE_TIMEOUT`] still cannot hold a connection for long.
struct Deadline<W> {
    out: W,
    until: Instant,
}

impl<W: Write> Write for Deadline<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.until {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.out.write(b)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The exposition's figures now: the gateway's, then one entry per configured peer (the
/// device's figures, or zeros for a disabled one), counters kept from going back.
pub fn collect(
    src: &Sources,
    cfg: &Config,
    mono: &mut Monotonic,
) -> (GatewayMetrics, Vec<PeerMetrics>) {
    // The table's counters, read once: the global drop causes and each restricted
    // client's access drops (`access-KEYTAG`).
    let counters = crate::sys::nftables::counters(crate::core::firewall::TABLE).ok();
    let mut peers = peer_metrics(&src.device, cfg, mono);
    if let Some(c) = &counters {
        for p in &mut peers {
            let Ok(k) = crate::core::key::Key::from_base64(&p.public_key) else {
                continue;
            };
            let name = crate::core::firewall::clients::counter_name(&k);
            if let Some((_, n, _)) = c.iter().find(|(cn, _, _)| *cn == name) {
                p.extra.access_drops = Some(mono.get(&format!("fw {name}"), *n));
            }
        }
    }
    let g = gateway_metrics(src, mono, counters);
    (g, peers)
}

fn peer_metrics(dev: &Device, cfg: &Config, mono: &mut Monotonic) -> Vec<PeerMetrics> {
    let mut out = Vec::with_capacity(cfg.peers.len());
    let mut seen = std::collections::HashSet::new();
    for st in dev.peer_stats() {
        let b64 = st.public_key.to_base64();
        let mut p = PeerMetrics::new(st.name.as_deref().unwrap_or(""), b64.clone(), true);
        let mut counter = |what: &str, raw: u64| mono.get(&format!("{what} {b64}"), raw);
        p.rx_bytes = counter("rx", st.rx_bytes);
        p.tx_bytes = counter("tx", st.tx_bytes);
        p.handshake_attempts = counter("hs", st.handshake_attempts);
        p.extra = PeerExtra {
            rx_packets: Some(counter("rxp", st.rx_packets)),
            tx_packets: Some(counter("txp", st.tx_packets)),
            endpoint_changes: Some(counter("ep", st.endpoint_changes)),
            handshake_failures: Some(counter("hsf", st.handshake_failures)),
            last_rx_age: Some(st.last_rx_age.map(|d| d.as_secs_f64())),
            health: Some(st.health.as_str()),
            shared_key_devices: Some(st.shared_key.is_some()),
            access_drops: None,
        };
        p.latest_handshake = st
            .last_handshake
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        p.transport = st.endpoint.map(|e| {
            if e.is_tcp() {
                Transport::Tcp
            } else {
                Transport::Udp
            }
        });
        seen.insert(st.public_key);
        out.push(p);
    }
    // Disabled peers: in the file, not in the device; their counters stay where the
    // device left them while they ran.
    for pc in cfg.peers.iter().filter(|p| !seen.contains(&p.public_key)) {
        let b64 = pc.public_key.to_base64();
        let mut p = PeerMetrics::new(pc.name.as_deref().unwrap_or(""), b64.clone(), false);
        let mut counter = |what: &str| mono.get(&format!("{what} {b64}"), 0);
        p.rx_bytes = counter("rx");
        p.tx_bytes = counter("tx");
        p.handshake_attempts = counter("hs");
        out.push(p);
    }
    // Series of peers gone from the file are forgotten once they outnumber the rest.
    let keys: std::collections::HashSet<String> =
        out.iter().map(|p| p.public_key.clone()).collect();
    mono.prune(8 * (out.len() + 64), |k| {
        k.split_once(' ').is_none_or(|(_, key)| keys.contains(key))
    });
    out
}

fn gateway_metrics(
    src: &Sources,
    mono: &mut Monotonic,
    counters: Option<Vec<(String, u64, u64)>>,
) -> GatewayMetrics {
    let run = crate::run::run_dir();
    let firewall_drops = counters.filter(|c| !c.is_empty()).map(|c| {
        c.into_iter()
            .filter(|(name, _, _)| crate::core::firewall::clients::counter_tag(name).is_none())
            .map(|(name, packets, _)| {
                let v = mono.get(&format!("fw {name}"), packets);
                (name, v)
            })
            .collect()
    });
    let tcp = src.tcp.get().map(|h| {
        let c = h.counters();
        (c.open, mono.get("tcp accepted", c.accepted))
    });
    let cpu = worker_cpu_seconds();
    let workers = src
        .heartbeats
        .snapshot()
        .into_iter()
        .enumerate()
        .map(|(i, beats)| (beats, cpu.get(&i).copied()))
        .collect();
    let init = crate::run::services::read_figures(&run);
    let (ntp_servers, ntp_sync_age, clock_source) = clock_figures(&run);
    let dns = src.dns.as_ref().map(|stats| {
        stats()
            .events()
            .into_iter()
            .map(|(e, n)| (e, mono.get(&format!("dns {e}"), n)))
            .collect()
    });
    GatewayMetrics {
        version: image_file(crate::image_paths::VERSION)
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string()),
        build: image_file(crate::image_paths::BUILD).unwrap_or_else(|| "unknown".into()),
        uptime_seconds: src.started.elapsed().as_secs_f64(),
        device_drops: src.device.drops.snapshot().to_vec(),
        firewall_drops,
        offload: match src.udp_tx {
            UdpTx::HardwareUso => "uso",
            UdpTx::SoftwareGso => "gso",
            UdpTx::Mmsg => "sendmmsg",
            UdpTx::Single => "single",
        }
        .into(),
        tcp,
        workers,
        leases: lease_left(&run),
        ntp_servers,
        ntp_sync_age,
        clock_source,
        boot: init
            .as_ref()
            .and_then(|f| f.slot.map(|s| (s.to_string(), f.marked))),
        services: init
            .map(|f| {
                f.services
                    .iter()
                    .map(|s| m::ServiceFigures {
                        name: s.name.clone(),
                        restarts: s.restarts(),
                        running: s.running,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        dns,
    }
}

/// The first line of one of the image's files, if there is one (not on a host).
fn image_file(path: &str) -> Option<String> {
    let t = std::fs::read(path).ok()?;
    let t = String::from_utf8_lossy(&t[..t.len().min(256)]).into_owned();
    let l = t.lines().next()?.trim();
    (!l.is_empty()).then(|| l.chars().take(64).collect())
}

/// CPU seconds of each worker thread (`rg-worker-N`), from `/proc/self/task/*/stat`.
fn worker_cpu_seconds() -> HashMap<usize, f64> {
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&t| t > 0)
        .unwrap_or(100) as f64;
    let mut out = HashMap::new();
    let Ok(d) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in d.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some((i, ticks)) = parse_task_stat(&stat) {
            out.insert(i, ticks as f64 / tck);
        }
    }
    out
}

/// A task's worker index and its user + system ticks, from its `stat` line.
fn parse_task_stat(stat: &str) -> Option<(usize, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let i = comm.strip_prefix("rg-worker-")?.parse().ok()?;
    // After the comm: state is field 3; utime and stime are fields 14 and 15.
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((i, utime.saturating_add(stime)))
}

/// Seconds left of each uplink lease in the run directory (infinite ones left out).
fn lease_left(run: &std::path::Path) -> Vec<(String, u64)> {
    use crate::run::lease::{valid_ifname, Clocks, LeaseFile};
    let Ok(d) = std::fs::read_dir(run) else {
        return Vec::new();
    };
    let now = Clocks::now();
    let mut v = Vec::new();
    for e in d.flatten() {
        let name = e.file_name();
        let Some(iface) = name.to_str().and_then(|n| n.strip_prefix("lease.")) else {
            continue;
        };
        if !valid_ifname(iface) {
            continue;
        }
        let Ok(t) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(lf) = LeaseFile::from_text(&t) else {
            continue;
        };
        if lf.lease.lease_secs == crate::core::dhcp::INFINITE {
            continue;
        }
        let left = u64::from(lf.lease.lease_secs).saturating_sub(lf.age(&now));
        v.push((iface.to_string(), left));
    }
    v.sort();
    v
}

/// The NTP client's servers, the age of its last sync, and where the clock came from
/// (`ntp` once an answer set it, else init's boot record, else `host`).
fn clock_figures(run: &std::path::Path) -> (Option<u64>, Option<f64>, Option<String>) {
    use crate::core::clock::{BootRecord, NtpState};
    use crate::run::clock::{BOOT_RECORD, STATE};
    let ntp = std::fs::read_to_string(run.join(STATE))
        .ok()
        .map(|t| NtpState::from_text(&t));
    let boot = std::fs::read_to_string(run.join(BOOT_RECORD))
        .ok()
        .and_then(|t| BootRecord::from_text(&t));
    let age = ntp
        .as_ref()
        .and_then(|n| n.last_sync.as_ref())
        .map(|(_, at)| {
            crate::sys::kernel_clocks::boottime()
                .saturating_sub(*at)
                .as_secs_f64()
        });
    let source = if age.is_some() {
        "ntp".to_string()
    } else if let Some(b) = &boot {
        b.source.name().to_string()
    } else {
        "host".to_string()
    };
    (
        ntp.as_ref().map(|n| u64::from(n.servers)),
        age,
        Some(source),
    )
}

#[cfg(test)]
mod tests;
