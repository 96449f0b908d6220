//! Drivers: the loops that move bytes between `sys` handles and the `core` device, and
//! the process around them (the drop-in `riceguard IFNAME` and the appliance daemon
//! `riceguard up --config FILE`).

pub mod netconf;
pub mod offload_io;
pub mod status;
pub mod uapi;
pub mod uring_worker;
pub mod worker;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{self as nsock, sockopt};

use crate::core::config::OffloadMode;
use crate::core::config::{Config, Endpoint};
use crate::core::device::{Device, Io, PeerAddr, SCRATCH_SIZE};
use crate::core::uapi::{SetRequest, UapiError};
use crate::sys::tun::Tun;
use crate::sys::udp::{UdpOptions, UdpSocket};
use worker::{Shared, SocketSet};

const PIDFILE: &str = "/run/riceguard.pid";

/// Options of both daemon forms.
#[derive(Debug, Clone)]
struct Opts {
    ifname: String,
    foreground: bool,
    config_file: Option<String>,
    workers: Option<usize>,
    /// Command-line overrides of the `[Gateway]` data-plane settings.
    io_uring: Option<bool>,
    offload: Option<OffloadMode>,
    tun_offload: Option<bool>,
    poll: Option<crate::core::config::PollMode>,
    hugepages: Option<bool>,
    /// Test images only: SIGUSR2 freezes the worker heartbeats (see `Heartbeats`).
    selftest_hang: bool,
}

const USAGE: &str = "usage: riceguard [-f|--foreground] [OPTIONS] IFNAME
       riceguard up --config FILE [OPTIONS]
options (override [Gateway]): --workers N  --io-uring on|off  --offload auto|gso|mmsg|off
                              --tun-offload on|off  --hugepages on|off";

pub mod tcp;
pub mod tcp_link;
pub mod udptcp;

/// `riceguard [-f] IFNAME` and `riceguard up --config FILE`.
pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let opts = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rc = match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(1)
        }
    };
    // The last lines (often the reason for exiting) reach the console first.
    crate::logger::flush();
    rc
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        ifname: String::new(),
        foreground: false,
        config_file: None,
        workers: None,
        io_uring: None,
        offload: None,
        tun_offload: None,
        poll: None,
        hugepages: None,
        selftest_hang: false,
    };
    let mut it = args.iter();
    let mut up = false;
    if std::env::var("WG_PROCESS_FOREGROUND").as_deref() == Ok("1") {
        o.foreground = true;
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "up" if !up && o.ifname.is_empty() => {
                up = true;
                o.foreground = true;
            }
            "-f" | "--foreground" => o.foreground = true,
            "--config" | "-c" => {
                o.config_file = Some(it.next().ok_or("--config needs a file")?.clone())
            }
            "--workers" => {
                let n = it.next().ok_or("--workers needs a number")?;
                o.workers = Some(
                    n.parse()
                        .ok()
                        .filter(|&n: &usize| (1..=256).contains(&n))
                        .ok_or("--workers takes 1-256")?,
                );
            }
            "--io-uring" => o.io_uring = Some(on_off(it.next(), "--io-uring")?),
            "--tun-offload" => o.tun_offload = Some(on_off(it.next(), "--tun-offload")?),
            "--poll" => {
                o.poll = Some(
                    it.next()
                        .and_then(|v| crate::core::config::PollMode::parse(v))
                        .ok_or("--poll takes sleep, adaptive or busy")?,
                )
            }
            "--hugepages" => o.hugepages = Some(on_off(it.next(), "--hugepages")?),
            // Not in USAGE: init passes it on test images (`riceguard.selftest=hang`).
            "--selftest-hang" => o.selftest_hang = true,
            "--offload" => {
                o.offload = Some(match it.next().map(String::as_str) {
                    Some("auto") => OffloadMode::Auto,
                    Some("gso") => OffloadMode::Gso,
                    Some("mmsg") => OffloadMode::Mmsg,
                    Some("off") => OffloadMode::Off,
                    _ => return Err("--offload takes auto, gso, mmsg or off".into()),
                })
            }
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
            s if o.ifname.is_empty() && !up => o.ifname = s.to_string(),
            s => return Err(format!("unexpected argument `{s}`")),
        }
    }
    if up {
        if o.config_file.is_none() {
            return Err("`up` needs --config FILE".into());
        }
    } else if o.ifname.is_empty() {
        return Err("missing interface name".into());
    }
    Ok(o)
}

fn on_off(v: Option<&String>, flag: &str) -> Result<bool, String> {
    match v.map(String::as_str) {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => Err(format!("{flag} takes on or off")),
    }
}

/// The running daemon's handles, shared by the UAPI server and the signal loop.
pub struct Runtime {
    pub shared: Arc<Shared>,
    pub ifname: String,
    workers: usize,
    /// Serialises configuration changes (UAPI sets, reloads). Held only while applying:
    /// name lookups happen before it is taken.
    apply_lock: Mutex<()>,
    /// The TCP-fallback transport and the ports it was started for.
    tcp: Mutex<Option<TcpRun>>,
    tcp_sink: Option<Arc<tcp_link::DeviceSink>>,
    tcp_slot: Arc<tcp_link::TcpSlot>,
    /// Drop-in mode: TCP listens on the UDP port; appliance mode: the configured ports.
    tcp_follows_udp: bool,
    /// The offload level and the start-up decision, applied to rebound sockets too.
    offload_mode: OffloadMode,
    offload: Mutex<Option<crate::core::offload::OffloadDecision>>,
}

/// A running TCP transport and the listen ports it was asked for (empty: client only).
struct TcpRun {
    transport: tcp::TcpTransport,
    ports: Vec<u16>,
}

/// Why a configuration change could not be applied. Nothing live changed.
#[derive(Debug)]
pub enum ApplyError {
    Bind(u16, std::io::Error),
    TcpBind(Vec<u16>, std::io::Error),
    Mark(u32, std::io::Error),
    Device(crate::core::device::DeviceError),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Bind(p, e) => write!(f, "cannot listen on UDP port {p}: {e}"),
            ApplyError::TcpBind(p, e) => write!(f, "cannot listen on TCP port(s) {p:?}: {e}"),
            ApplyError::Mark(m, e) => write!(f, "cannot set fwmark {m}: {e}"),
            ApplyError::Device(e) => write!(f, "{e}"),
        }
    }
}

impl ApplyError {
    /// The UAPI answer, as wireguard-go gives it: a failed bind or fwmark is
    /// `EADDRINUSE` whatever the cause.
    fn to_uapi(&self) -> UapiError {
        match self {
            ApplyError::Bind(..) | ApplyError::TcpBind(..) | ApplyError::Mark(..) => {
                UapiError::PortInUse(self.to_string())
            }
            ApplyError::Device(_) => UapiError::Io(self.to_string()),
        }
    }
}

/// How a TCP-fallback transport must change with a new configuration.
enum TcpPlan {
    /// Leave it as it is.
    Keep,
    /// None wanted any more: stop it.
    Stop,
    /// Started already (its ports were free): swap it in.
    Started(tcp::TcpTransport, Vec<u16>),
    /// Shares ports with the running one, so it can only start once that one stops;
    /// the new ports were checked free (and are held until then).
    Restart(Vec<u16>, Vec<std::net::TcpListener>),
}

/// Everything a change allocated before any live state moved.
struct Prepared {
    udp: Option<(Vec<Arc<UdpSocket>>, u16)>,
    mark: Option<Option<u32>>,
    tcp: TcpPlan,
}

/// Tries at finding a random port free for both UDP and TCP (drop-in mode).
const RANDOM_PORT_TRIES: usize = 8;

impl Runtime {
    /// A UAPI `set`: computed on a copy, checked and allocated, then applied whole; on
    /// error nothing changed.
    pub fn apply_set(&self, req: &SetRequest) -> Result<(), UapiError> {
        // Named endpoints come only from a configuration file; look them up before
        // taking the lock (a slow resolver must not hold up other changes).
        let names = lookup_names(&self.shared.device.config());
        let _g = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.shared.device.config();
        let new = crate::core::uapi::apply_set(&old, req)?;
        let new = with_names(&new, &names);
        self.apply_locked(&old, &new, false)
            .map_err(|e| e.to_uapi())
    }

    /// Apply a whole new configuration (reload from file); on error nothing changed.
    pub fn apply_config(&self, new: &Config) -> Result<(), ApplyError> {
        self.apply_config_as(new, false)
    }

    fn apply_config_as(&self, new: &Config, startup: bool) -> Result<(), ApplyError> {
        let names = lookup_names(new);
        let _g = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.shared.device.config();
        let new = with_names(new, &names);
        self.apply_locked(&old, &new, startup)
    }

    /// Allocate, reconfigure the device, then swap the allocations in (cannot fail).
    /// `startup`: a TCP listener that cannot bind is a warning (UDP still works), not
    /// a refusal — there is no previous state to keep.
    fn apply_locked(&self, old: &Config, new: &Config, startup: bool) -> Result<(), ApplyError> {
        let prepared = self.prepare(old, new, startup)?;
        self.shared
            .device
            .reconfigure(new)
            .map_err(ApplyError::Device)?;
        self.commit(prepared, new);
        let mut scratch = vec![0u8; SCRATCH_SIZE];
        let mut io = TimerIo::new(&self.shared.sockets, self.shared.tcp.as_deref());
        self.shared
            .device
            .initiate_keepalive_peers(&mut scratch, &mut io);
        io.send_all();
        Ok(())
    }

    /// Check and allocate what `new` needs; no live state changes here.
    fn prepare(&self, old: &Config, new: &Config, startup: bool) -> Result<Prepared, ApplyError> {
        let want_port = new.interface.listen_port.unwrap_or(0);
        let cur_port = self.shared.sockets.port.load(Ordering::Relaxed);
        let mut udp = None;
        let mut mark = None;
        if new.interface.listen_port != old.interface.listen_port
            && (want_port == 0 || want_port != cur_port)
        {
            udp = Some(self.bind_udp_for(want_port, new.interface.fwmark)?);
        } else if new.interface.fwmark != old.interface.fwmark {
            let m = new.interface.fwmark.unwrap_or(0);
            check_mark(m).map_err(|e| ApplyError::Mark(m, e))?;
            mark = Some(new.interface.fwmark);
        }

        let tcp = if self.tcp_follows_udp {
            self.plan_tcp_follow(new, want_port, &mut udp, startup)?
        } else {
            let want = wanted_tcp(new);
            match self.plan_tcp(new, want.clone()) {
                Ok(p) => p,
                Err(e) if startup => {
                    log::warn!("{}: {e}; UDP only", self.ifname);
                    // Still a client if the configuration wants one.
                    match want {
                        Some(p) if !p.is_empty() && client_wanted(new) => self
                            .plan_tcp(new, Some(Vec::new()))
                            .unwrap_or(TcpPlan::Keep),
                        _ => TcpPlan::Keep,
                    }
                }
                Err(e) => return Err(e),
            }
        };
        Ok(Prepared { udp, mark, tcp })
    }

    fn bind_udp_for(
        &self,
        port: u16,
        fwmark: Option<u32>,
    ) -> Result<(Vec<Arc<UdpSocket>>, u16), ApplyError> {
        let (socks, port) =
            bind_udp(self.workers, port, fwmark, self.offload_mode).map_err(|e| match e {
                BindError::Udp(e) => ApplyError::Bind(port, e),
                BindError::Mark(e) => ApplyError::Mark(fwmark.unwrap_or(0), e),
            })?;
        if let Some(d) = self
            .offload
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            for s in &socks {
                s.apply(d);
            }
        }
        Ok((socks, port))
    }

    /// Drop-in mode: TCP listens on the UDP port. With a random port (0) a port free
    /// for both is searched.
    fn plan_tcp_follow(
        &self,
        new: &Config,
        want_port: u16,
        udp: &mut Option<(Vec<Arc<UdpSocket>>, u16)>,
        startup: bool,
    ) -> Result<TcpPlan, ApplyError> {
        if self.tcp_sink.is_none() {
            return Ok(TcpPlan::Keep);
        }
        let mut tries = 0;
        loop {
            let port = udp
                .as_ref()
                .map_or(self.shared.sockets.port.load(Ordering::Relaxed), |u| u.1);
            match self.plan_tcp(new, Some(vec![port])) {
                Ok(p) => return Ok(p),
                Err(e) => {
                    tries += 1;
                    let random = want_port == 0;
                    let in_use = matches!(&e, ApplyError::TcpBind(_, io)
                        if io.kind() == std::io::ErrorKind::AddrInUse);
                    if random && in_use && tries < RANDOM_PORT_TRIES {
                        *udp = Some(self.bind_udp_for(0, new.interface.fwmark)?);
                        continue;
                    }
                    if startup {
                        log::warn!("{}: {e}; TCP fallback off", self.ifname);
                        return Ok(TcpPlan::Keep);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// What to do about the TCP transport to have `want` (None: no transport; an empty
    /// list: client only). Listeners are bound here, so a port in use is an error now.
    fn plan_tcp(&self, cfg: &Config, want: Option<Vec<u16>>) -> Result<TcpPlan, ApplyError> {
        let Some(sink) = &self.tcp_sink else {
            return Ok(TcpPlan::Keep);
        };
        let g = self.tcp.lock().unwrap_or_else(|p| p.into_inner());
        let cur = g.as_ref().map(|r| r.ports.clone());
        drop(g);
        let Some(want) = want else {
            return Ok(if cur.is_some() {
                TcpPlan::Stop
            } else {
                TcpPlan::Keep
            });
        };
        if cur.as_ref() == Some(&want) {
            return Ok(TcpPlan::Keep);
        }
        let shared: Vec<u16> = match &cur {
            Some(c) => want.iter().copied().filter(|p| c.contains(p)).collect(),
            None => Vec::new(),
        };
        if shared.is_empty() {
            let t = tcp_link::start_transport(cfg, &want, sink.clone())
                .map_err(|e| ApplyError::TcpBind(want.clone(), e))?;
            return Ok(TcpPlan::Started(t, want));
        }
        // Ports the running transport holds cannot be bound twice; check the others.
        let mut held = Vec::new();
        for &p in want.iter().filter(|p| !shared.contains(p)) {
            let a = SocketAddr::from((Ipv6Addr::UNSPECIFIED, p));
            let l = crate::sys::tcp::listen(a, 1).map_err(|e| ApplyError::TcpBind(vec![p], e))?;
            held.push(l);
        }
        Ok(TcpPlan::Restart(want, held))
    }

    /// Swap in what `prepare` allocated. Cannot fail.
    fn commit(&self, p: Prepared, new: &Config) {
        if let Some((socks, port)) = p.udp {
            self.shared.sockets.replace(socks, port);
            log::info!("{}: listening on UDP port {port}", self.ifname);
        }
        if let Some(m) = p.mark {
            for s in self.shared.sockets.get().1.iter() {
                if let Err(e) = set_mark(s, m) {
                    log::warn!("{}: fwmark: {e}", self.ifname);
                }
            }
        }
        let mut g = self.tcp.lock().unwrap_or_else(|p| p.into_inner());
        match p.tcp {
            TcpPlan::Keep => {}
            TcpPlan::Stop => {
                self.tcp_slot.set(None);
                if let Some(old) = g.take() {
                    old.transport.shutdown();
                }
                log::info!("{}: TCP fallback transport stopped", self.ifname);
            }
            TcpPlan::Started(t, ports) => {
                self.tcp_slot.set(Some(t.handle()));
                self.log_tcp(&t, &ports);
                if let Some(old) = g.replace(TcpRun {
                    transport: t,
                    ports,
                }) {
                    old.transport.shutdown();
                }
            }
            TcpPlan::Restart(ports, held) => {
                self.tcp_slot.set(None);
                let old = g.take();
                let old_ports = old.as_ref().map(|r| r.ports.clone());
                if let Some(old) = old {
                    old.transport.shutdown();
                }
                drop(held);
                let Some(sink) = &self.tcp_sink else { return };
                // The ports were checked free a moment ago; only a race with another
                // program can fail this. Then the old ports are tried again.
                let started = tcp_link::start_transport(new, &ports, sink.clone())
                    .map(|t| (t, ports.clone()))
                    .or_else(|e| {
                        log::error!(
                            "{}: TCP fallback cannot listen on {ports:?}: {e}",
                            self.ifname
                        );
                        let old_ports = old_ports.ok_or(e)?;
                        tcp_link::start_transport(new, &old_ports, sink.clone())
                            .map(|t| (t, old_ports))
                    });
                match started {
                    Ok((t, ports)) => {
                        self.tcp_slot.set(Some(t.handle()));
                        self.log_tcp(&t, &ports);
                        *g = Some(TcpRun {
                            transport: t,
                            ports,
                        });
                    }
                    Err(e) => log::error!("{}: TCP fallback off: {e}", self.ifname),
                }
            }
        }
    }

    fn log_tcp(&self, t: &tcp::TcpTransport, ports: &[u16]) {
        if ports.is_empty() {
            log::info!(
                "{}: TCP fallback client ready (no TCP listener)",
                self.ifname
            );
        } else {
            log::info!(
                "{}: TCP fallback listening on {:?}",
                self.ifname,
                t.local_addrs()
            );
        }
    }

    /// Stop the TCP transport (process exit).
    fn stop_tcp(&self) {
        if let Some(r) = self.tcp.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.tcp_slot.set(None);
            r.transport.shutdown();
        }
    }
}

/// Whether the fallback client has anyone to reach: on, and some peer has an endpoint.
fn client_wanted(cfg: &Config) -> bool {
    cfg.gateway.tcp_fallback && cfg.peers.iter().any(|p| p.endpoint.is_some())
}

/// Appliance mode: the TCP transport a configuration asks for. Listening on the
/// `TcpListen` ports, or with none of them a client-only transport when the fallback has
/// peers to reach (it needs no listener), or nothing.
fn wanted_tcp(cfg: &Config) -> Option<Vec<u16>> {
    let mut ports = cfg.gateway.tcp_listen.clone();
    ports.sort_unstable();
    ports.dedup();
    if !ports.is_empty() {
        Some(ports)
    } else if client_wanted(cfg) {
        Some(Vec::new())
    } else {
        None
    }
}

/// Whether the process may set `mark` on a socket (`SO_MARK` needs `CAP_NET_ADMIN`),
/// checked on a scratch socket so live ones are touched only once it is known to work.
fn check_mark(mark: u32) -> std::io::Result<()> {
    let fd = nsock::socket(
        nsock::AddressFamily::Inet,
        nsock::SockType::Datagram,
        nsock::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    nsock::setsockopt(&fd, sockopt::Mark, &mark)?;
    Ok(())
}

/// Addresses found for `HOST:PORT` endpoints.
type Names = std::collections::HashMap<(String, u16), SocketAddr>;

/// Look up the named endpoints of `cfg` (the core does no I/O). Called without the
/// apply lock: a resolver can take seconds.
fn lookup_names(cfg: &Config) -> Names {
    use std::net::ToSocketAddrs;
    let mut names = Names::new();
    for p in &cfg.peers {
        let Some(Endpoint::Name { host, port }) = &p.endpoint else {
            continue;
        };
        if names.contains_key(&(host.clone(), *port)) {
            continue;
        }
        match (host.as_str(), *port)
            .to_socket_addrs()
            .map(|mut a| a.next())
        {
            Ok(Some(a)) => {
                names.insert((host.clone(), *port), a);
            }
            _ => {
                log::warn!("peer endpoint {host}:{port} does not resolve; will retry on reload")
            }
        }
    }
    names
}

/// `cfg` with named endpoints replaced by the addresses found for them; names not found
/// stay names (the peer has no endpoint until a reload resolves it).
fn with_names(cfg: &Config, names: &Names) -> Config {
    let mut c = cfg.clone();
    for p in &mut c.peers {
        if let Some(Endpoint::Name { host, port }) = &p.endpoint {
            if let Some(a) = names.get(&(host.clone(), *port)) {
                p.endpoint = Some(Endpoint::Addr(*a));
            }
        }
    }
    c
}

/// Sends from outside the workers (timer-driven handshakes and keepalives).
/// The device's sink for timer work (handshake retries, keepalives): it records, and
/// [`TimerIo::send_all`] sends once the device has returned (no syscall under a peer
/// lock). Timer messages are few; a small allocation each is fine here.
struct TimerIo<'a> {
    sockets: &'a SocketSet,
    tcp: Option<&'a dyn worker::TcpOut>,
    queued: Vec<(PeerAddr, Vec<u8>)>,
}

impl<'a> TimerIo<'a> {
    fn new(sockets: &'a SocketSet, tcp: Option<&'a dyn worker::TcpOut>) -> Self {
        TimerIo {
            sockets,
            tcp,
            queued: Vec::new(),
        }
    }

    fn send_all(&mut self) {
        for (to, d) in self.queued.drain(..) {
            match to {
                PeerAddr::Udp(a) => {
                    if let Some(s) = self.sockets.any() {
                        let _ = s.send_to(&d, a);
                    }
                }
                PeerAddr::Tcp { conn, .. } => {
                    if let Some(t) = self.tcp {
                        t.send(conn, &d);
                    }
                }
            }
        }
    }
}

impl Io for TimerIo<'_> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.queued.push((to, d.to_vec()));
    }

    fn tun_write(&mut self, _p: &[u8]) {}
}

/// Why [`bind_udp`] failed.
#[derive(Debug)]
pub enum BindError {
    Udp(std::io::Error),
    Mark(std::io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::Udp(e) => write!(f, "{e}"),
            BindError::Mark(e) => write!(f, "cannot set fwmark: {e}"),
        }
    }
}

/// Bind `n` UDP sockets to one port with `SO_REUSEPORT` (dual-stack where IPv6 exists).
/// Port 0 picks a port no one holds and binds all to it. `gro`/`gso`
/// follow the configured offload level; the decision made at start is applied after.
/// A port another program holds is refused even if that program also set
/// `SO_REUSEPORT` (same user): the sockets would silently share its traffic.
pub fn bind_udp(
    n: usize,
    port: u16,
    fwmark: Option<u32>,
    mode: OffloadMode,
) -> Result<(Vec<Arc<UdpSocket>>, u16), BindError> {
    let opts = UdpOptions {
        gro: matches!(mode, OffloadMode::Auto | OffloadMode::Gso),
        gso: matches!(mode, OffloadMode::Auto | OffloadMode::Gso),
        ..UdpOptions::default()
    };
    let udp_err = |e: crate::sys::udp::UdpError| {
        BindError::Udp(match e {
            crate::sys::udp::UdpError::Bind { source, .. } => source,
            e => std::io::Error::other(e.to_string()),
        })
    };
    let probe = UdpOptions {
        reuse_port: false,
        gro: false,
        gso: false,
        pktinfo: false,
        buffer_bytes: 0,
    };
    let mut port = port;
    if port == 0 {
        // Choose the port with an exclusive bind: the kernel may give a SO_REUSEPORT
        // socket's port 0 the port of another program's SO_REUSEPORT socket (same user),
        // and the two would split the traffic.
        let s = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)), &probe)
            .or_else(|_| UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), &probe))
            .map_err(udp_err)?;
        port = s.local_addr().port();
    }
    {
        // An exclusive bind (no SO_REUSEPORT) fails if anyone holds the port; dropped
        // at once, so our own sockets can take it.
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        if let Err(e) = UdpSocket::bind(any6, &probe) {
            let free_v4 = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), &probe);
            match (e, free_v4) {
                // The v6 failure was about the port: report it.
                (e @ crate::sys::udp::UdpError::Bind { .. }, _) => return Err(udp_err(e)),
                (_, Err(e)) => return Err(udp_err(e)),
                (_, Ok(_)) => {}
            }
        }
    }
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let s = match UdpSocket::bind(any6, &opts) {
            Ok(s) => s,
            // No IPv6 in this kernel or namespace: IPv4 only.
            Err(_) => UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), &opts)
                .map_err(udp_err)?,
        };
        if fwmark.is_some() {
            set_mark(&s, fwmark).map_err(BindError::Mark)?;
        }
        if std::env::var("RG_FAULT_GSO").as_deref() == Ok("einval") {
            if let Err(e) = s.inject_gso_failure() {
                log::warn!("RG_FAULT_GSO: {e}");
            }
        }
        port = s.local_addr().port();
        socks.push(Arc::new(s));
    }
    Ok((socks, port))
}

fn set_mark(s: &UdpSocket, mark: Option<u32>) -> std::io::Result<()> {
    nsock::setsockopt(s, sockopt::Mark, &mark.unwrap_or(0)).map_err(std::io::Error::from)
}

fn cores_for(cfg: &Config, n: usize) -> Vec<usize> {
    if !cfg.gateway.cores.is_empty() {
        return cfg.gateway.cores.clone();
    }
    (0..n).collect()
}

fn run(opts: Opts) -> Result<(), String> {
    let appliance = opts.config_file.is_some();
    let mut cfg = Config::default();
    if let Some(path) = &opts.config_file {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        cfg = crate::core::ini::parse(path, &text).map_err(|e| e.to_string())?;
        // validate() also requires the private key `up` needs.
        cfg.validate().map_err(|e| format!("{path}: {e}"))?;
    }
    let ifname = if appliance {
        cfg.gateway.interface_name.clone()
    } else {
        opts.ifname.clone()
    };
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cores = cores_for(&cfg, ncpu);
    let workers = opts.workers.unwrap_or(cores.len()).max(1);
    let g = &mut cfg.gateway;
    g.io_uring = opts.io_uring.unwrap_or(g.io_uring);
    g.offload = opts.offload.unwrap_or(g.offload);
    g.tun_offload = opts.tun_offload.unwrap_or(g.tun_offload);
    g.poll = opts.poll.unwrap_or(g.poll);
    g.hugepages = opts.hugepages.unwrap_or(g.hugepages);
    let gw = cfg.gateway.clone();

    let tun =
        Tun::create(&ifname, workers, gw.tun_offload).map_err(|e| format!("{ifname}: {e}"))?;
    let ifname = tun.name().to_string();
    let (socks, port) = bind_udp(
        workers,
        cfg.interface.listen_port.unwrap_or(0),
        cfg.interface.fwmark,
        gw.offload,
    )
    .map_err(|e| format!("UDP: {e}"))?;
    let egress = if gw.uplink.is_empty() {
        crate::sys::offload::egress_interface(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)))
    } else {
        Some(gw.uplink.clone())
    };
    let refs: Vec<&UdpSocket> = socks.iter().map(|s| &**s).collect();
    let decision = crate::sys::offload::decide_and_apply(egress.as_deref(), gw.offload, &refs);
    let tun_offload = tun.offload();
    log::info!(
        "{ifname}: TUN {}",
        if tun.vnet_hdr() {
            format!("virtio_net_hdr, offloads {tun_offload}")
        } else {
            "without offload".to_string()
        }
    );
    let listener = uapi::bind(&ifname).map_err(|e| format!("UAPI socket: {e}"))?;
    // Appliance mode only: the drop-in form leaves the network to wg-quick.
    let netconf = if appliance {
        Some(Arc::new(
            netconf::NetConf::start(&ifname, &cfg).map_err(|e| e.to_string())?,
        ))
    } else {
        None
    };
    if !opts.foreground {
        // The log goes to $RG_LOG_FILE when set (wireguard-go's daemon is silent too).
        let log_file = std::env::var("RG_LOG_FILE").ok();
        // No thread may run across fork: the log writer stops and restarts in the child.
        crate::logger::pause();
        let r = crate::sys::process::daemonize(log_file.as_deref());
        crate::logger::resume();
        r.map_err(|e| format!("daemonize: {e}"))?;
    }
    // Block the signals we handle before any thread exists, so only sigwait sees them.
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        sigs.add(s);
    }
    if opts.selftest_hang {
        // Only then: otherwise SIGUSR2 keeps its default action. A local signal from
        // init, never anything the network can cause.
        sigs.add(Signal::SIGUSR2);
    }
    sigs.thread_block().map_err(|e| format!("signals: {e}"))?;

    let device = Arc::new(Device::new());
    if let Some(mtu) = read_mtu(&ifname) {
        device.set_mtu(mtu); // before any worker encrypts: padding is capped by it
    }
    let tcp_slot = Arc::new(tcp_link::TcpSlot::default());
    let sockets = Arc::new(SocketSet::new(socks, port));
    let vnet_hdr = tun.vnet_hdr();
    let tcp_sink = match tun.queue(0).map(|q| q.try_clone()) {
        Some(Ok(q)) => Some(Arc::new(tcp_link::DeviceSink::new(
            device.clone(),
            sockets.clone(),
            tcp_slot.clone(),
            q,
            vnet_hdr,
        ))),
        _ => {
            log::warn!(
                "{ifname}: cannot share a TUN queue with the TCP transport; TCP fallback off"
            );
            None
        }
    };
    let shared = Arc::new(Shared {
        device: device.clone(),
        sockets,
        stop: Arc::new(AtomicBool::new(false)),
        tcp: Some(tcp_slot.clone() as Arc<dyn worker::TcpOut>),
        tun_gone: Arc::new(AtomicBool::new(false)),
        heartbeats: Arc::new(worker::Heartbeats::new(workers)),
    });
    let rt = Arc::new(Runtime {
        shared: shared.clone(),
        ifname: ifname.clone(),
        workers,
        apply_lock: Mutex::new(()),
        tcp: Mutex::new(None),
        tcp_sink: tcp_sink.clone(),
        tcp_slot,
        tcp_follows_udp: !appliance,
        offload_mode: gw.offload,
        offload: Mutex::new(Some(decision.clone())),
    });
    // The first apply also starts the TCP transport (listening, or client only).
    rt.apply_config_as(&cfg, true).map_err(|e| e.to_string())?;
    // Drop-in mode may have moved to a port free for TCP too.
    let port = rt.shared.sockets.port.load(Ordering::Relaxed);
    log::info!("{ifname}: up, {workers} worker(s) on cores {cores:?}, UDP port {port}");
    // Probe once for the whole process: a kernel without io_uring (or with it disabled by
    // sysctl or seccomp) is said once, and every worker takes the portable loop.
    let use_uring = gw.io_uring && crate::sys::uring::check().is_ok();
    let report = vec![
        format!("interface: {ifname}"),
        format!("mode: {}", if appliance { "appliance" } else { "drop-in" }),
        format!("workers: {workers} on cores {cores:?}"),
        format!("offload: {}", decision.reason),
        format!(
            "tun: {}",
            if vnet_hdr {
                format!("virtio_net_hdr, offloads {tun_offload}")
            } else {
                "plain (no offload)".into()
            }
        ),
        format!("io: {}", io_path(gw.io_uring, use_uring)),
    ];
    let mut status_paths = vec![status_path(&ifname)];
    if appliance {
        // The console's `show status` reads this one.
        status_paths.push("/run/riceguard.status".into());
    }
    let board = Arc::new(status::StatusBoard::new(status_paths, report, workers));

    let mut handles = Vec::new();
    let ucfg = uring_worker::UringWorkerConfig::from_gateway(&gw);
    let poll_mode = gw.poll;
    for (i, q) in tun.into_queues().into_iter().enumerate() {
        let sh = shared.clone();
        let board = board.clone();
        let core = cores[i % cores.len()];
        handles.push(
            std::thread::Builder::new()
                .name(format!("rg-worker-{i}"))
                .spawn(move || {
                    pin_to(core);
                    let q = if use_uring {
                        let started =
                            |line: String| board.worker(i, format!("core {core}, {line}"));
                        match uring_worker::run(
                            i,
                            q,
                            tun_offload,
                            vnet_hdr,
                            sh.clone(),
                            &ucfg,
                            started,
                        ) {
                            Ok(()) => None,
                            Err(ns) => {
                                log::warn!(
                                    "worker {i}: io_uring not used ({}); portable loop",
                                    ns.error
                                );
                                board.worker(
                                    i,
                                    format!(
                                        "core {core}, poll loop (io_uring not used: {})",
                                        ns.error
                                    ),
                                );
                                Some(ns.tun)
                            }
                        }
                    } else {
                        board.worker(i, format!("core {core}, poll loop"));
                        Some(q)
                    };
                    if let Some(q) = q {
                        worker::run(i, q, tun_offload, vnet_hdr, poll_mode, sh.clone());
                    }
                    if sh.tun_gone.load(Ordering::Relaxed) {
                        let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
                    }
                })
                .map_err(|e| e.to_string())?,
        );
    }
    {
        let sh = shared.clone();
        let sink = tcp_sink.clone();
        let ifname = ifname.clone();
        let board = board.clone();
        std::thread::Builder::new()
            .name("rg-timers".into())
            .spawn(move || {
                let mut scratch = vec![0u8; SCRATCH_SIZE];
                let mut fallback = tcp_link::FallbackManager::new();
                let start = std::time::Instant::now();
                let mut ticks = 0u64;
                loop {
                    // wg-quick (or anyone) may change the MTU at any time; padding must
                    // never push a packet past it (and needs it known from the start).
                    if let Some(mtu) = read_mtu(&ifname) {
                        sh.device.set_mtu(mtu);
                    }
                    if sh.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                    if ticks % 4 == 0 {
                        // Once a second: the workers' heartbeats for init's health
                        // watch (a stuck timer thread stops them moving too).
                        // Not once stopping: the file is removed on the way out.
                        if !sh.stop.load(Ordering::Relaxed) {
                            board.heartbeats(sh.heartbeats.snapshot());
                        }
                    }
                    ticks += 1;
                    let mut io = TimerIo::new(&sh.sockets, sh.tcp.as_deref());
                    sh.device.update_timers(
                        start.elapsed(),
                        std::time::SystemTime::now(),
                        &mut scratch,
                        &mut io,
                    );
                    io.send_all();
                    if let Some(sink) = &sink {
                        fallback.tick(std::time::Instant::now(), &sh.device, sink, &sh.sockets);
                    }
                }
            })
            .map_err(|e| e.to_string())?;
    }
    {
        let rt = rt.clone();
        std::thread::Builder::new()
            .name("rg-uapi".into())
            .spawn(move || {
                let stop = rt.shared.stop.clone();
                uapi::serve(listener, rt, stop)
            })
            .map_err(|e| e.to_string())?;
    }
    if let Some(nc) = &netconf {
        // Proxy entries follow the uplink's address (a DHCP lease may come later).
        nc.spawn_watch(shared.stop.clone())
            .map_err(|e| e.to_string())?;
    }
    if appliance {
        let _ = std::fs::write(PIDFILE, format!("{}\n", std::process::id()));
    }

    // Reloads so far; the console waits for this to move after a commit.
    let mut generation = 0u64;
    loop {
        match sigs.wait() {
            Ok(Signal::SIGHUP) if appliance => {
                let Some(path) = opts.config_file.as_deref() else {
                    continue;
                };
                generation += 1;
                let result = reload(&rt, netconf.as_deref(), path, &ifname);
                board.reload(status::Reload { generation, result });
            }
            Ok(Signal::SIGUSR2) => {
                log::warn!("{ifname}: selftest: the workers stop their heartbeats");
                shared.heartbeats.freeze();
            }
            Ok(Signal::SIGHUP) | Ok(Signal::SIGUSR1) => {
                for (name, n) in device.drops.snapshot() {
                    log::info!("drops {name}: {n}");
                }
            }
            Ok(s) => {
                log::info!("{ifname}: {s:?}, shutting down");
                break;
            }
            Err(e) => {
                log::error!("sigwait: {e}");
                break;
            }
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(nc) = &netconf {
        nc.shutdown();
    }
    let _ = std::fs::remove_file(uapi::socket_path(&ifname));
    let _ = std::fs::remove_file(status_path(&ifname));
    if appliance {
        let _ = std::fs::remove_file(PIDFILE);
    }
    rt.stop_tcp();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Which loop the workers run, for the status report: the decision actually taken.
fn io_path(requested: bool, use_uring: bool) -> &'static str {
    // Both backends run the same offload pipeline (TSO split, GSO batches, GRO receive,
    // coalesced TUN writes); they differ only in how bytes reach the kernel.
    match (use_uring, requested) {
        (true, _) => "io_uring workers (multishot recvmsg, registered buffers, GSO batches)",
        (false, true) => "poll workers (io_uring asked for but unavailable; see the log)",
        (false, false) => "poll workers (IoUring = off)",
    }
}

const STATUS_DIR: &str = "/run/riceguard";

fn status_path(ifname: &str) -> std::path::PathBuf {
    std::path::Path::new(STATUS_DIR).join(format!("{ifname}.status"))
}

/// The data-plane decisions made at start, for `riceguard status` and the console.
/// `riceguard status [IFNAME]`: the start-up decisions and the live peer table.
pub fn status_main(args: &[String]) -> ExitCode {
    let names: Vec<String> = match args.first() {
        Some(n) => vec![n.clone()],
        None => std::fs::read_dir(uapi::SOCKET_DIR)
            .map(|d| {
                let mut v: Vec<String> = d
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(|n| n.strip_suffix(".sock"))
                            .map(String::from)
                    })
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default(),
    };
    if names.is_empty() {
        eprintln!(
            "no running riceguard interface (no sockets in {})",
            uapi::SOCKET_DIR
        );
        return ExitCode::from(1);
    }
    // Collected and written once: a closed pipe (`status | head`) ends the write, not
    // the process with a panic.
    let mut rc = ExitCode::SUCCESS;
    let mut out = String::new();
    for n in names {
        match std::fs::read_to_string(status_path(&n)) {
            Ok(t) => out.push_str(&t),
            Err(_) => out.push_str(&format!("interface: {n}\n")),
        }
        match query(&n) {
            Ok(st) => out.push_str(&format_status(&st)),
            Err(e) => {
                out.push_str(&format!("  (daemon not answering: {e})\n"));
                rc = ExitCode::from(1);
            }
        }
        out.push('\n');
    }
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    rc
}

fn query(ifname: &str) -> Result<crate::core::uapi::DeviceStatus, String> {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(uapi::socket_path(ifname))
        .map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    s.write_all(b"get=1\n\n").map_err(|e| e.to_string())?;
    let mut r = std::io::BufReader::new(s);
    crate::core::uapi::read_get_response(&mut r).map_err(|e| e.to_string())
}

fn format_status(st: &crate::core::uapi::DeviceStatus) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if let Some(k) = st.private_key {
        let _ = writeln!(o, "public key: {}", k.public().to_base64());
    }
    let _ = writeln!(o, "listening port: {}", st.listen_port);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for p in &st.peers {
        let _ = writeln!(o, "peer: {}", p.public_key.to_base64());
        if let Some(e) = p.endpoint {
            let _ = writeln!(o, "  endpoint: {e}");
        }
        let ips: Vec<String> = p.allowed_ips.iter().map(|c| c.to_string()).collect();
        let _ = writeln!(
            o,
            "  allowed ips: {}",
            if ips.is_empty() {
                "(none)".into()
            } else {
                ips.join(", ")
            }
        );
        match p.last_handshake {
            Some((s, _)) if s > 0 => {
                let _ = writeln!(o, "  latest handshake: {} s ago", now.saturating_sub(s));
            }
            _ => {}
        }
        let _ = writeln!(
            o,
            "  transfer: {} B received, {} B sent",
            p.rx_bytes, p.tx_bytes
        );
    }
    o
}

/// SIGHUP in appliance mode: re-read the file; a bad file changes nothing. `Err` says
/// why it was refused (for the status file's `reload:` line; the console reports it).
fn reload(
    rt: &Runtime,
    netconf: Option<&netconf::NetConf>,
    path: &str,
    ifname: &str,
) -> Result<(), String> {
    let r = reload_file(rt, netconf, path, ifname);
    if let Err(e) = &r {
        log::error!("reload: {e}; keeping the running configuration");
    }
    r
}

fn reload_file(
    rt: &Runtime,
    netconf: Option<&netconf::NetConf>,
    path: &str,
    ifname: &str,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let cfg = crate::core::ini::parse(path, &text).map_err(|e| e.to_string())?;
    cfg.validate().map_err(|e| format!("{path}: {e}"))?;
    rt.apply_config(&cfg).map_err(|e| e.to_string())?;
    // The device runs the new configuration; the network follows it as a diff. An
    // address or route that netlink refused is said, but the reload counts as applied.
    if let Some(nc) = netconf {
        if let Err(e) = nc.apply(&cfg) {
            log::error!("reload: {e}");
        }
    }
    log::info!("{ifname}: configuration reloaded from {path}");
    Ok(())
}

fn pin_to(core: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(core).is_ok() {
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
            log::warn!("cannot pin worker to core {core}: {e}");
        }
    }
}

/// The interface's MTU from sysfs (None when it cannot be read).
fn read_mtu(ifname: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
