//! The DNS forwarder of `riceguard up --config`: one thread (`rg-dns`) that answers on
//! port 53, UDP and TCP, of the tunnel's addresses and, two-armed, the LAN port's (never a
//! wildcard: nothing listens on the uplink), with `core::dns`'s decisions.
//!
//! Started like the metrics endpoint: [`Dns::follow`] at start and after each reload
//! (settings replaced, the sockets moved when the addresses changed), niced and off the
//! workers' cores, each source checked by `core::firewall::services::dns_source_allowed`
//! whatever the firewall does (so `Firewall = off` does not open it to the uplink).
//! An address not on its interface yet is bound again every [`REBIND`].
//!
//! Upstreams: the configuration's, else the uplink's DHCP lease's, read again every
//! [`REFRESH`]. A forwarded query leaves from a fresh UDP socket (a fresh random source
//! port, connected to the upstream: the kernel drops datagrams from anyone else) with a
//! fresh random ID; its answer is checked by the core. Over TCP a connection thread (at
//! most [`MAX_TCP`], [`MAX_TCP_PER_SOURCE`] from one address, idle for at most
//! [`TCP_IDLE`]) forwards each query the same way and waits for its answer; an answer
//! the upstream truncated over UDP is asked again over TCP.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand_core::OsRng;

use crate::core::config::Config;
use crate::core::dns::{Outcome, Resolver, Settings, FORWARD_TIMEOUT_MS, TCP_MAX};
use crate::core::firewall::ports::Ports;
use crate::core::firewall::services::{dns_listen_addrs, dns_source_allowed, DNS_PORT};

/// Addresses that could not be bound are tried again this often.
pub const REBIND: Duration = Duration::from_secs(2);
/// The lease's resolvers and the interfaces' subnets (the source check) are read again
/// this often.
pub const REFRESH: Duration = Duration::from_secs(5);
/// TCP connections at once, and from one source.
pub const MAX_TCP: usize = 16;
pub const MAX_TCP_PER_SOURCE: usize = 4;
/// A TCP connection with no complete query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// Datagrams read from one listening socket per round (the others get their turn).
const BATCH: usize = 64;

/// The resolver: its shared state and the running thread.
pub struct Dns {
    ctx: Ctx,
    running: Mutex<Option<Running>>,
}

struct Running {
    addrs: Vec<IpAddr>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

#[derive(Clone)]
struct Ctx {
    resolver: Arc<Mutex<Resolver>>,
    /// The configuration file as read (the source check, the upstreams).
    config: Arc<Mutex<Arc<Config>>>,
    /// The interfaces as last read: who is on the LAN port.
    ports: Arc<Mutex<Ports>>,
    /// The upstreams the settings were made with (a change of lease makes new ones).
    upstreams: Arc<Mutex<Vec<IpAddr>>>,
    tcp: Arc<Mutex<HashMap<IpAddr, usize>>>,
    epoch: Instant,
    worker_cores: Arc<Vec<usize>>,
}

impl Ctx {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn resolver(&self) -> std::sync::MutexGuard<'_, Resolver> {
        self.resolver.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn config(&self) -> Arc<Config> {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn allowed(&self, src: IpAddr) -> bool {
        let cfg = self.config();
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        dns_source_allowed(&cfg, &ports, src)
    }

    /// An upstream's datagram for forward `token`: the client's answer, or `None`
    /// (ignored). Records the rebinding filter dropped are said.
    fn answer(&self, token: u64, from: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut r = self.resolver();
        let before = r.stats.rebinding_dropped;
        let reply = r.upstream_answer(token, from, bytes, self.now_ms());
        let dropped = r.stats.rebinding_dropped - before;
        drop(r);
        if dropped > 0 {
            log::info!(target: "net::dns", "dns: {dropped} address record(s) from {from} named a tunnel address: dropped (DNS rebinding)");
        }
        reply
    }

    /// Read the interfaces and the upstreams again; new settings when the upstreams
    /// changed (or `force`).
    fn refresh(&self, force: bool) {
        let cfg = self.config();
        if let Ok(mut nl) = crate::sys::netlink::Netlink::open() {
            let p = crate::driver::appliance::firewall::ports_now(
                &mut nl,
                &cfg.gateway.interface_name,
                &cfg,
                0,
            );
            *self.ports.lock().unwrap_or_else(|p| p.into_inner()) = p;
        }
        let ups = upstreams(&cfg);
        let mut last = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        if force || *last != ups {
            if *last != ups {
                log::info!("dns: upstreams now {}", list(&ups));
            }
            self.resolver()
                .set(Settings::for_config(&cfg, cfg.gateway.domain_name(), &ups));
            *last = ups;
        }
    }
}

/// The upstreams: `[Gateway] Dns`, else the uplink's DHCP lease's resolvers.
fn upstreams(cfg: &Config) -> Vec<IpAddr> {
    if !cfg.gateway.dns.is_empty() {
        return cfg.gateway.dns.clone();
    }
    let Some(uplink) = crate::sys::nic::uplink(&cfg.gateway.uplink) else {
        return Vec::new();
    };
    crate::run::lease::lease_dns(&crate::run::run_dir(), &uplink)
}

fn list(v: &[IpAddr]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Dns {
    pub fn new(worker_cores: Vec<usize>) -> Dns {
        Dns {
            ctx: Ctx {
                resolver: Arc::new(Mutex::new(Resolver::default())),
                config: Arc::new(Mutex::new(Arc::new(Config::default()))),
                ports: Arc::new(Mutex::new(Ports::default())),
                upstreams: Arc::new(Mutex::new(Vec::new())),
                tcp: Arc::new(Mutex::new(HashMap::new())),
                epoch: Instant::now(),
                worker_cores: Arc::new(worker_cores),
            },
            running: Mutex::new(None),
        }
    }

    /// Follow `cfg` (the file as read, at start and after each reload): new names,
    /// upstreams and source rule; the sockets moved when the addresses changed.
    pub fn follow(&self, cfg: &Config) {
        *self.ctx.config.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg.clone());
        self.ctx.refresh(true);
        let want = dns_listen_addrs(cfg);
        self.listen(want);
    }

    fn listen(&self, want: Vec<IpAddr>) {
        let mut run = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if run.as_ref().map(|r| &r.addrs) == Some(&want) {
            return;
        }
        if let Some(old) = run.take() {
            old.stop.store(true, Ordering::Relaxed);
            let _ = old.thread.join();
        }
        if want.is_empty() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (ctx, st, addrs) = (self.ctx.clone(), stop.clone(), want.clone());
        match std::thread::Builder::new()
            .name("rg-dns".into())
            .spawn(move || serve(ctx, addrs, st))
        {
            Ok(thread) => {
                log::info!("dns: answering on port {DNS_PORT} of {}", list(&want));
                *run = Some(Running {
                    addrs: want,
                    stop,
                    thread,
                })
            }
            Err(e) => log::error!("dns: cannot start: {e}"),
        }
    }

    /// The resolver's counts.
    pub fn stats(&self) -> crate::core::dns::Stats {
        self.ctx.resolver().stats
    }

    /// Stop answering (process exit).
    pub fn stop(&self) {
        self.listen(Vec::new());
    }
}

/// One address's sockets.
struct Bound {
    addr: IpAddr,
    udp: UdpSocket,
    tcp: TcpListener,
}

/// A forwarded query waiting for its answer.
struct Forward {
    token: u64,
    sock: UdpSocket,
    client: SocketAddr,
    /// The address (its listening socket) the query came in on: the answer leaves from it.
    via: IpAddr,
}

fn bind(addr: IpAddr) -> std::io::Result<Bound> {
    let sa = SocketAddr::new(addr, DNS_PORT);
    let udp = UdpSocket::bind(sa)?;
    udp.set_nonblocking(true)?;
    let tcp = crate::sys::tcp::listen(sa, 32)?;
    Ok(Bound { addr, udp, tcp })
}

fn serve(ctx: Ctx, addrs: Vec<IpAddr>, stop: Arc<AtomicBool>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    super::metrics::stay_out_of_the_way("dns", &ctx.worker_cores);
    let mut bound: Vec<Bound> = Vec::new();
    let mut said: HashMap<IpAddr, String> = HashMap::new();
    let mut next_bind = Instant::now();
    let mut next_refresh = Instant::now() + REFRESH;
    let mut forwards: Vec<Forward> = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_bind && bound.len() < addrs.len() {
            for a in &addrs {
                if bound.iter().any(|b| b.addr == *a) {
                    continue;
                }
                match bind(*a) {
                    Ok(b) => {
                        if said.remove(a).is_some() {
                            log::info!("dns: answering on {a} port {DNS_PORT} now");
                        }
                        bound.push(b);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        if said.get(a) != Some(&e) {
                            log::warn!("dns: cannot bind {a} port {DNS_PORT} ({e}): trying again every {} s", REBIND.as_secs());
                            said.insert(*a, e);
                        }
                    }
                }
            }
            next_bind = now + REBIND;
        }
        if now >= next_refresh {
            ctx.refresh(false);
            next_refresh = now + REFRESH;
        }
        // Forwards whose upstream did not answer: SERVFAIL.
        let late = ctx.resolver().expire(ctx.now_ms());
        for (token, reply) in late {
            if let Some(i) = forwards.iter().position(|f| f.token == token) {
                let f = forwards.swap_remove(i);
                reply_udp(&bound, &f, &reply);
            }
        }
        let mut fds: Vec<PollFd> = Vec::with_capacity(bound.len() * 2 + forwards.len());
        for b in &bound {
            fds.push(PollFd::new(b.udp.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(b.tcp.as_fd(), PollFlags::POLLIN));
        }
        for f in &forwards {
            fds.push(PollFd::new(f.sock.as_fd(), PollFlags::POLLIN));
        }
        if !matches!(poll(&mut fds, PollTimeout::from(200u16)), Ok(n) if n > 0) {
            continue;
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let nb = bound.len();
        // Answers first: they free pending slots.
        let mut done = Vec::new();
        for (i, f) in forwards.iter().enumerate() {
            if !ready[2 * nb + i] {
                continue;
            }
            loop {
                match f.sock.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if let Some(reply) = ctx.answer(f.token, from, &buf[..n]) {
                            reply_udp(&bound, f, &reply);
                            done.push(i);
                            break;
                        }
                        log::debug!(target: "net::dns", "dns: ignored a datagram from {from} (not the answer)");
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // ICMP unreachable from the upstream, and the like.
                        log::debug!(target: "net::dns", "dns: upstream socket: {e}");
                        if let Some(reply) = ctx.resolver().abandon(f.token) {
                            reply_udp(&bound, f, &reply);
                        }
                        done.push(i);
                        break;
                    }
                }
            }
        }
        for i in done.into_iter().rev() {
            forwards.swap_remove(i);
        }
        for (i, b) in bound.iter().enumerate() {
            if ready[2 * i] {
                read_queries(&ctx, b, &mut buf, &mut forwards);
            }
            if ready[2 * i + 1] {
                accept(&ctx, &b.tcp);
            }
        }
    }
    let mut r = ctx.resolver();
    for f in forwards {
        let _ = r.abandon(f.token);
    }
}

fn reply_udp(bound: &[Bound], f: &Forward, reply: &[u8]) {
    if let Some(b) = bound.iter().find(|b| b.addr == f.via) {
        let _ = b.udp.send_to(reply, f.client);
    }
}

fn read_queries(ctx: &Ctx, b: &Bound, buf: &mut [u8], forwards: &mut Vec<Forward>) {
    for _ in 0..BATCH {
        let (n, client) = match b.udp.recv_from(buf) {
            Ok(x) => x,
            Err(_) => return,
        };
        let src = client.ip().to_canonical();
        if !ctx.allowed(src) {
            log::info!(target: "net::dns", "dns: {src} refused: not from the tunnel or the LAN port");
            continue;
        }
        let out = ctx
            .resolver()
            .query(src, &buf[..n], false, ctx.now_ms(), &mut OsRng);
        match out {
            Outcome::Answer(reply) => {
                let _ = b.udp.send_to(&reply, client);
            }
            Outcome::Forward {
                token,
                upstream,
                bytes,
            } => match send_upstream(upstream, &bytes) {
                Ok(sock) => forwards.push(Forward {
                    token,
                    sock,
                    client,
                    via: b.addr,
                }),
                Err(e) => {
                    log::info!(target: "net::dns", "dns: cannot ask {upstream}: {e}");
                    if let Some(reply) = ctx.resolver().abandon(token) {
                        let _ = b.udp.send_to(&reply, client);
                    }
                }
            },
            Outcome::Drop(why) => {
                log::debug!(target: "net::dns", "dns: {src}: dropped ({why:?})");
            }
        }
    }
}

/// A fresh socket (a fresh random source port) connected to `upstream`, the query sent.
fn send_upstream(upstream: SocketAddr, bytes: &[u8]) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = if upstream.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    s.connect(upstream)?;
    s.set_nonblocking(true)?;
    s.send(bytes)?;
    Ok(s)
}

fn accept(ctx: &Ctx, l: &TcpListener) {
    let Ok((stream, peer)) = l.accept() else {
        return;
    };
    let src = peer.ip().to_canonical();
    if !ctx.allowed(src) {
        log::info!(target: "net::dns", "dns: {src} refused (TCP): not from the tunnel or the LAN port");
        return;
    }
    {
        let mut t = ctx.tcp.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = t.values().sum();
        let mine = t.entry(src).or_default();
        if total >= MAX_TCP || *mine >= MAX_TCP_PER_SOURCE {
            log::info!(target: "net::dns", "dns: {src} refused (TCP): too many connections");
            if *mine == 0 {
                t.remove(&src);
            }
            return;
        }
        *mine += 1;
    }
    let c = ctx.clone();
    let spawned = std::thread::Builder::new()
        .name("rg-dns-tcp".into())
        .spawn(move || {
            serve_tcp(&c, stream, src);
            let mut t = c.tcp.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = t.get_mut(&src) {
                *n -= 1;
                if *n == 0 {
                    t.remove(&src);
                }
            }
        });
    if spawned.is_err() {
        let mut t = ctx.tcp.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = t.get_mut(&src) {
            *n = n.saturating_sub(1);
        }
    }
}

/// One TCP connection: queries (u16 length, message) answered in turn until the client
/// closes, sends something unreadable or is idle for [`TCP_IDLE`].
fn serve_tcp(ctx: &Ctx, mut s: TcpStream, src: IpAddr) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(TCP_IDLE));
    let _ = s.set_write_timeout(Some(TCP_IDLE));
    let mut msg = vec![0u8; TCP_MAX];
    loop {
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let n = usize::from(u16::from_be_bytes(len));
        if n == 0 || s.read_exact(&mut msg[..n]).is_err() {
            return;
        }
        let out = ctx
            .resolver()
            .query(src, &msg[..n], true, ctx.now_ms(), &mut OsRng);
        let reply = match out {
            Outcome::Answer(r) => r,
            Outcome::Forward {
                token,
                upstream,
                bytes,
            } => {
                let reply = exchange(ctx, token, upstream, &bytes);
                if truncated(&reply) {
                    // The upstream's UDP answer was cut: ask it again over TCP (a new
                    // forward: a new ID, a new connection).
                    let again =
                        ctx.resolver()
                            .query(src, &msg[..n], true, ctx.now_ms(), &mut OsRng);
                    match again {
                        Outcome::Forward {
                            token,
                            upstream,
                            bytes,
                        } => exchange_tcp(ctx, token, upstream, &bytes).unwrap_or(reply),
                        Outcome::Answer(r) => r,
                        Outcome::Drop(_) => reply,
                    }
                } else {
                    reply
                }
            }
            Outcome::Drop(_) => continue,
        };
        // Empty: the forward timed out and another thread took it; the client asks again.
        let Ok(l) =
            u16::try_from(reply.len()).map_err(drop).and_then(
                |l| {
                    if l == 0 {
                        Err(())
                    } else {
                        Ok(l)
                    }
                },
            )
        else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&l.to_be_bytes());
        framed.extend_from_slice(&reply);
        if s.write_all(&framed).is_err() {
            return;
        }
    }
}

/// Whether a DNS message has its TC (truncated) bit set.
fn truncated(msg: &[u8]) -> bool {
    msg.get(2).is_some_and(|b| b & 0x02 != 0)
}

/// How long a TCP connection's thread waits for an upstream: a little less than the
/// core's timeout, so this thread, not the UDP loop's expiry, gives up and answers
/// SERVFAIL.
const TCP_FORWARD_WAIT: Duration = Duration::from_millis(FORWARD_TIMEOUT_MS - 300);

/// Ask `upstream` over TCP (the answer it cut over UDP); `None`: no answer (the forward
/// is given up).
fn exchange_tcp(ctx: &Ctx, token: u64, upstream: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let deadline = Instant::now() + TCP_FORWARD_WAIT;
    let r = (|| -> std::io::Result<Option<Vec<u8>>> {
        let mut s = TcpStream::connect_timeout(&upstream, TCP_FORWARD_WAIT)?;
        let left = deadline.saturating_duration_since(Instant::now());
        let left = left.max(Duration::from_millis(1));
        s.set_read_timeout(Some(left))?;
        s.set_write_timeout(Some(left))?;
        let l = u16::try_from(bytes.len()).map_err(std::io::Error::other)?;
        let mut framed = l.to_be_bytes().to_vec();
        framed.extend_from_slice(bytes);
        s.write_all(&framed)?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len)?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut buf)?;
        Ok(ctx.answer(token, s.peer_addr()?, &buf))
    })();
    match r {
        Ok(Some(reply)) => Some(reply),
        _ => {
            ctx.resolver().abandon(token);
            None
        }
    }
}

/// Forward one query for a TCP client and wait for its answer (SERVFAIL on timeout).
fn exchange(ctx: &Ctx, token: u64, upstream: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let deadline = Instant::now() + TCP_FORWARD_WAIT;
    if let Ok(sock) = send_upstream(upstream, bytes) {
        let _ = sock.set_nonblocking(false);
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || sock.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if let Some(reply) = ctx.answer(token, from, &buf[..n]) {
                        return reply;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    ctx.resolver().abandon(token).unwrap_or_default()
}

#[cfg(test)]
mod tests;
