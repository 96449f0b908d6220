//! The running daemon's configuration changes: a UAPI `set` or a reloaded file is
//! computed on a copy, checked, its sockets and listeners allocated, and only then
//! applied whole (`Runtime`); on error nothing live changed. Also the UDP socket binding
//! both start-up and changes use.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::key::Key;

use nix::sys::socket::{self as nsock, sockopt};

use crate::core::config::OffloadMode;
use crate::core::config::{Config, Endpoint};
use crate::core::device::SCRATCH_SIZE;
use crate::core::uapi::{SetRequest, UapiError};
use crate::driver::appliance::netconf;
use crate::driver::dataplane::outbox::{Outbox, Outlets};
use crate::driver::dataplane::shared::Shared;
use crate::driver::dataplane::sockets::{bind_udp, BindError};
use crate::driver::tcp::link as tcp_link;
use crate::driver::tcp::transport as tcp;
use crate::sys::udp::UdpSocket;

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
    /// The peers whose `Endpoint` the file gives as a name, and that name: resolved
    /// again when handshakes to them go unanswered ([`Runtime::reresolve_unanswered`]).
    named: Mutex<HashMap<Key, (String, u16)>>,
    /// Per named peer: when its name was last resolved again, and the handshake failures
    /// counted then.
    reresolved: Mutex<HashMap<Key, (Option<Instant>, u64)>>,
}

/// A name whose peer does not answer is resolved again at most this often.
pub const REARESOLVE_EVERY: Duration = Duration::from_secs(120);

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
    /// The runtime of a daemon whose workers share `shared`; nothing is applied yet (the
    /// first [`Runtime::apply_config_as`] with `startup` starts the TCP transport).
    #[allow(clippy::too_many_arguments)] // one call site (`run`); each is a distinct handle
    pub(super) fn new(
        shared: Arc<Shared>,
        ifname: String,
        workers: usize,
        tcp_sink: Option<Arc<tcp_link::DeviceSink>>,
        tcp_slot: Arc<tcp_link::TcpSlot>,
        tcp_follows_udp: bool,
        offload_mode: OffloadMode,
        offload: crate::core::offload::OffloadDecision,
    ) -> Runtime {
        Runtime {
            shared,
            ifname,
            workers,
            apply_lock: Mutex::new(()),
            tcp: Mutex::new(None),
            tcp_sink,
            tcp_slot,
            tcp_follows_udp,
            offload_mode,
            offload: Mutex::new(Some(offload)),
            named: Mutex::new(HashMap::new()),
            reresolved: Mutex::new(HashMap::new()),
        }
    }

    /// Resolve again the names of peers whose handshakes go unanswered (more failures
    /// than at the last look, or `stale`), each at most every [`REARESOLVE_EVERY`], and
    /// send a handshake initiation to a new address. The endpoint itself moves only when
    /// the peer answers from there (an authenticated packet: ARCHITECTURE's invariant),
    /// so a name pointing elsewhere never takes a working peer away. The sentences to
    /// record, one per name that now resolves elsewhere.
    pub fn reresolve_unanswered(&self, now: Instant) -> Vec<String> {
        use crate::core::device::{Health, PeerAddr};
        let named = self.named.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if named.is_empty() {
            return Vec::new();
        }
        let mut due = Vec::new();
        {
            let mut seen = self.reresolved.lock().unwrap_or_else(|p| p.into_inner());
            seen.retain(|k, _| named.contains_key(k));
            for s in self.shared.device.peer_stats() {
                let Some(name) = named.get(&s.public_key) else {
                    continue;
                };
                let e = seen
                    .entry(s.public_key)
                    .or_insert((None, s.handshake_failures));
                // Keepalives going out with nothing heard for 15 s past one: unanswered too
                // (keepalives alone start no handshake until the 2-minute rekey).
                let silent = s.persistent_keepalive.is_some_and(|k| {
                    s.last_rx_age
                        .is_some_and(|a| a > Duration::from_secs(u64::from(k) + 15))
                });
                let unanswered = s.handshake_failures > e.1 || s.health == Health::Stale || silent;
                e.1 = s.handshake_failures;
                let may =
                    e.0.is_none_or(|t| now.duration_since(t) >= REARESOLVE_EVERY);
                if unanswered && may && !s.endpoint.is_some_and(|a| a.is_tcp()) {
                    e.0 = Some(now);
                    due.push((s.public_key, name.clone(), s.endpoint, s.name.clone()));
                }
            }
        }
        let mut said = Vec::new();
        let mut scratch = vec![0u8; SCRATCH_SIZE];
        let mut io = Outbox::default();
        for (key, (host, port), current, pname) in due {
            let one = with_names_of(&host, port);
            let Some(addr) = one else {
                log::warn!("peer endpoint {host}:{port} does not resolve (handshakes unanswered)");
                continue;
            };
            let to = PeerAddr::Udp(addr);
            if current == Some(to) {
                continue;
            }
            self.shared
                .device
                .force_handshake(&key, to, &mut scratch, &mut io);
            let who = match pname {
                Some(n) => format!("peer {n}"),
                None => format!("peer {}", crate::core::device::short(&key)),
            };
            said.push(format!(
                "{who}: handshakes to {} unanswered; its name {host} now resolves to {addr}: handshake sent there",
                current.map_or("(none)".into(), |c| c.to_string())
            ));
        }
        io.flush(&mut Outlets {
            udp: Some(&self.shared.sockets),
            tcp: None,
            tun: None,
        });
        said
    }

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

    pub(super) fn apply_config_as(&self, new: &Config, startup: bool) -> Result<(), ApplyError> {
        let names = lookup_names(new);
        let named: HashMap<Key, (String, u16)> = new
            .peers
            .iter()
            .filter_map(|p| match &p.endpoint {
                Some(Endpoint::Name { host, port }) => Some((p.public_key, (host.clone(), *port))),
                _ => None,
            })
            .collect();
        let _g = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.shared.device.config();
        let new = with_names(new, &names);
        self.apply_locked(&old, &new, startup)?;
        *self.named.lock().unwrap_or_else(|p| p.into_inner()) = named;
        Ok(())
    }

    /// Resolve again the peer endpoints whose names did not resolve when the configuration
    /// was applied (on the appliance the daemon starts before the DHCP lease brings a
    /// resolver). Names are looked up outside the apply lock; under it, only endpoints
    /// still holding that name are replaced. `Ok(n)`: how many peers got an address.
    pub fn retry_names(&self) -> Result<usize, ApplyError> {
        let cfg = self.shared.device.config();
        if !cfg
            .peers
            .iter()
            .any(|p| matches!(p.endpoint, Some(Endpoint::Name { .. })))
        {
            return Ok(0);
        }
        let names = lookup_names(&cfg);
        if names.is_empty() {
            return Ok(0);
        }
        let _g = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.shared.device.config();
        let new = with_names(&old, &names);
        let n = old
            .peers
            .iter()
            .zip(&new.peers)
            .filter(|(a, b)| a.endpoint != b.endpoint)
            .count();
        if n > 0 {
            self.apply_locked(&old, &new, false)?;
        }
        Ok(n)
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
        let mut io = Outbox::default();
        self.shared
            .device
            .initiate_keepalive_peers(&mut scratch, &mut io);
        io.flush(&mut Outlets {
            udp: Some(&self.shared.sockets),
            tcp: self.shared.tcp.as_deref(),
            tun: None,
        });
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
                if let Err(e) = crate::sys::set_mark(&**s, m) {
                    log::warn!("{}: fwmark: {e}", self.ifname);
                }
            }
        }
        let mut g = self.tcp.lock().unwrap_or_else(|p| p.into_inner());
        self.commit_tcp(&mut g, p.tcp, new);
        // A transport kept across a fwmark change takes the new one (a new transport
        // started from `new` has it already).
        if let Some(run) = g.as_ref() {
            let h = run.transport.handle();
            if h.mark() != new.interface.fwmark {
                h.set_mark(new.interface.fwmark);
            }
        }
    }

    /// Carry out the TCP part of a plan, under the transport lock.
    fn commit_tcp(&self, g: &mut Option<TcpRun>, plan: TcpPlan, new: &Config) {
        match plan {
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
    pub(super) fn stop_tcp(&self) {
        if let Some(r) = self.tcp.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.tcp_slot.set(None);
            r.transport.shutdown();
        }
    }
}

/// Whether the fallback client has anyone to reach: on, and some peer has an endpoint.
pub(super) fn client_wanted(cfg: &Config) -> bool {
    cfg.gateway.tcp_fallback && cfg.peers.iter().any(|p| p.endpoint.is_some())
}

/// Appliance mode: the TCP transport a configuration asks for. Listening on the
/// `TcpListen` ports, or with none of them a client-only transport when the fallback has
/// peers to reach (it needs no listener), or nothing.
pub(super) fn wanted_tcp(cfg: &Config) -> Option<Vec<u16>> {
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
pub(super) fn check_mark(mark: u32) -> std::io::Result<()> {
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
pub(super) fn lookup_names(cfg: &Config) -> Names {
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
                log::warn!("peer endpoint {host}:{port} does not resolve; retried every 15 s and on reload")
            }
        }
    }
    names
}

/// The first address `host` resolves to (the system resolver: on the appliance the
/// uplink lease's DNS servers, bounded by its timeouts and attempts).
fn with_names_of(host: &str, port: u16) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port).to_socket_addrs().ok()?.next()
}

/// `cfg` with named endpoints replaced by the addresses found for them; names not found
/// stay names (the peer has no endpoint until a reload resolves it).
pub(super) fn with_names(cfg: &Config, names: &Names) -> Config {
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

/// SIGHUP in appliance mode: re-read the file; a bad file changes nothing. `Ok`: the
/// file as read (disabled peers included, for the metrics endpoint); `Err` says why it
/// was refused (for the status file's `reload:` line; the console reports it).
pub(super) fn reload(
    rt: &Runtime,
    netconf: Option<&netconf::NetConf>,
    path: &str,
    ifname: &str,
) -> Result<Config, String> {
    let r = reload_file(rt, netconf, path, ifname);
    if let Err(e) = &r {
        log::error!("reload: {e}; keeping the running configuration");
    }
    r.map_err(|e| e.to_string())
}

/// Why a reload was refused; the running configuration stayed.
#[derive(Debug)]
pub enum ReloadError {
    /// The file could not be read.
    Read(String, std::io::Error),
    /// It is not a valid configuration file (the message names the line).
    Parse(crate::core::ini::ConfigError),
    /// It parses but is not consistent.
    Invalid(String, crate::core::config::ValidationError),
    /// It is valid, but the daemon could not take it (a port, a fwmark, the device).
    Apply(ApplyError),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::Read(p, e) => write!(f, "{p}: {e}"),
            ReloadError::Parse(e) => write!(f, "{e}"),
            ReloadError::Invalid(p, e) => write!(f, "{p}: {e}"),
            ReloadError::Apply(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReloadError {}

pub(super) fn reload_file(
    rt: &Runtime,
    netconf: Option<&netconf::NetConf>,
    path: &str,
    ifname: &str,
) -> Result<Config, ReloadError> {
    let text = std::fs::read_to_string(path).map_err(|e| ReloadError::Read(path.into(), e))?;
    let (cfg, warnings) =
        crate::core::ini::parse_with_warnings(path, &text).map_err(ReloadError::Parse)?;
    for w in &warnings {
        log::warn!("reload: {w}");
    }
    cfg.validate()
        .map_err(|e| ReloadError::Invalid(path.into(), e))?;
    let file = cfg;
    let cfg = file.running();
    rt.apply_config(&cfg).map_err(ReloadError::Apply)?;
    crate::logger::syslog("gateway", cfg.gateway.syslog.as_ref());
    // The device runs the new configuration; the network follows it as a diff. An
    // address or route that netlink refused is said, but the reload counts as applied.
    if let Some(nc) = netconf {
        let port = rt
            .shared
            .sockets
            .port
            .load(std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = nc.apply(&cfg, port) {
            log::error!("reload: {e}");
        }
    }
    log::info!("{ifname}: configuration reloaded from {path}");
    Ok(file)
}
