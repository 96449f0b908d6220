//! `TcpTransport`: the WireGuard-over-TCP fallback transport as a self-contained
//! component. One thread runs an epoll loop that listens (v4 + v6), accepts within
//! limits, connects, reads and checks frames, and hands each WireGuard message to a
//! [`TcpSink`]; any thread sends through a cloneable [`TcpHandle`].
//!
//! Invariants:
//! - A frame that cannot be a WireGuard message closes that connection only.
//! - Sends never block and never grow memory: each connection has one fixed
//!   [`OutQueue`]; when it is full whole packets are dropped. A header and its message
//!   always leave in the same `sendmsg`; a batch leaves in one `sendmsg` (up to the
//!   write budget, a multiple of the MSS).
//! - The connection table lock is never held while calling the sink, and the sink may
//!   call back into the handle (send a reply, close) from `on_message`.
//! - `ConnId`s are never reused. No heap allocation per packet once connections exist.
//!
//! Wiring with the WireGuard device: the device implements [`TcpSink`] and treats
//! `(ConnId, remote)` as one more kind of endpoint: `on_message` feeds the message to
//! the same path as a UDP datagram, and a peer whose latest authenticated packet came
//! over a connection is answered with [`TcpHandle::send`] (one packet) or
//! [`TcpHandle::queue`] + [`TcpHandle::flush`] (a batch from one TUN read), on
//! `SendError::Full` counting a drop as for a full UDP socket. `on_closed` forgets the
//! endpoint. For peers with an `Endpoint`, `core::fallback::Fallback` decides when to
//! [`TcpHandle::connect`] (to the endpoint's IP and `TcpPort`) and `on_connected` /
//! `on_closed` become its `tcp_connected` / `tcp_failed`.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSlice, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::core::congestion::{apply_with_fallback, Algo, CcPolicy};
use crate::core::framing::{
    check_message, tail_split, CoalescePolicy, FrameDecoder, FrameError, OutQueue, MAX_MESSAGE_LEN,
};
use crate::sys::tcp::{self as systcp, TcpTuning};

/// A connection's identity; never reused within a process.
pub type ConnId = u64;

/// Where received messages go. Implemented by the WireGuard device.
pub trait TcpSink: Send + Sync + 'static {
    /// One checked WireGuard message from `remote` on `conn`. Called on the transport's
    /// thread; may call [`TcpHandle::send`]/[`TcpHandle::close`] synchronously.
    fn on_message(&self, conn: ConnId, remote: SocketAddr, msg: &[u8]);
    /// `conn` is gone (peer closed, error, bad frame, timeout, limit, or `close`).
    fn on_closed(&self, conn: ConnId);
    /// An outgoing connection from [`TcpHandle::connect`] is established.
    fn on_connected(&self, _conn: ConnId) {}
}

/// Settings; the defaults are meant for the appliance.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Addresses to listen on; `[::]:port` also covers IPv4.
    pub listen: Vec<SocketAddr>,
    pub tuning: TcpTuning,
    pub cc: CcPolicy,
    /// All connections, in and out.
    pub max_conns: usize,
    /// Inbound connections from one source address.
    pub max_per_source: usize,
    /// No frame received for this long: close.
    pub idle_timeout: Duration,
    /// An outbound connection must be established within this.
    pub connect_timeout: Duration,
    /// An inbound connection must deliver a complete valid frame within this (silent
    /// and half-open connections). Not shorter: Mullvad's udp2tcp connects when it
    /// starts, before the WireGuard client behind it says anything.
    pub first_message_timeout: Duration,
    /// A frame once started must complete within this (slowloris).
    pub partial_timeout: Duration,
    /// Bytes of each connection's send queue.
    pub send_queue: usize,
    /// Bytes that may be queued while a connection is still connecting.
    pub connecting_queue: usize,
    /// Largest message accepted from the network.
    pub max_message: usize,
    pub coalesce: CoalescePolicy,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            listen: Vec::new(),
            tuning: TcpTuning::default(),
            cc: CcPolicy::default(),
            max_conns: 256,
            max_per_source: 8,
            idle_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            first_message_timeout: Duration::from_secs(60),
            partial_timeout: Duration::from_secs(10),
            send_queue: 128 * 1024,
            connecting_queue: 16 * 1024,
            max_message: MAX_MESSAGE_LEN,
            coalesce: CoalescePolicy::default(),
        }
    }
}

impl TcpConfig {
    /// The transport for a `[Gateway]` section: listen on `[::]:port` (IPv4 and IPv6)
    /// for each `TcpListen` port, bbr above `BbrRttMs`.
    pub fn from_gateway(g: &crate::core::config::GatewayConfig) -> Self {
        TcpConfig {
            listen: g
                .tcp_listen
                .iter()
                .map(|p| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, *p)))
                .collect(),
            cc: CcPolicy::with_threshold_ms(g.bbr_rtt_ms),
            ..TcpConfig::default()
        }
    }
}

/// Why a send did not queue anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// No such connection (never existed or already closed and reported).
    UnknownConn,
    /// The connection is closing.
    Closed,
    /// The send queue is full: the packet was dropped whole.
    Full,
    /// Not a WireGuard message; it would make the peer close the connection.
    Invalid(FrameError),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::UnknownConn => f.write_str("no such TCP connection"),
            SendError::Closed => f.write_str("TCP connection is closing"),
            SendError::Full => f.write_str("TCP send queue full: packet dropped"),
            SendError::Invalid(e) => write!(f, "refusing to send: {e}"),
        }
    }
}

impl std::error::Error for SendError {}

/// A snapshot of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnStats {
    pub remote: SocketAddr,
    pub inbound: bool,
    pub connecting: bool,
    pub srtt: Option<Duration>,
    pub cc: Option<Algo>,
    pub snd_mss: u32,
    pub bytes_sent: u64,
    /// Write syscalls that sent something (bytes_sent / writes: bytes per syscall).
    pub writes: u64,
    pub bytes_received: u64,
    pub messages_received: u64,
    /// Packets dropped because the send queue was full.
    pub dropped: u64,
    /// Bytes waiting in our send queue.
    pub queued: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Connecting,
    Open,
    Closed,
}

/// The send side, shared by all senders.
struct Out {
    q: OutQueue,
    state: State,
    want_out: bool,
    mss: usize,
    cc: Option<Algo>,
    dropped: u64,
    bytes_sent: u64,
    writes: u64,
    last_write: Option<Instant>,
    /// The connection is on the loop's list of deferred flushes.
    flush_pending: bool,
}

struct Conn {
    id: ConnId,
    remote: SocketAddr,
    inbound: bool,
    stream: TcpStream,
    out: Mutex<Out>,
    bytes_received: AtomicU64,
    messages_received: AtomicU64,
}

/// Loop-only state of a connection.
struct Local {
    conn: Arc<Conn>,
    dec: FrameDecoder,
    created: Instant,
    last_rx: Instant,
    partial_since: Option<Instant>,
    got_frame: bool,
    cc_checked: bool,
}

struct Shared {
    cfg: TcpConfig,
    sink: Arc<dyn TcpSink>,
    epoll: Epoll,
    wake: EventFd,
    conns: RwLock<HashMap<ConnId, Arc<Conn>>>,
    next_id: AtomicU64,
    adopt: Mutex<Vec<Arc<Conn>>>,
    closing: Mutex<Vec<ConnId>>,
    /// Connections with bulk packets waiting for the loop to write them.
    dirty: Mutex<Vec<ConnId>>,
    stop: AtomicBool,
}

const WAKE_TOKEN: u64 = u64::MAX;
const LISTENER_BASE: u64 = 1 << 63;
const READ_BUF: usize = 64 * 1024;
/// Reads per readiness event, so one busy connection cannot starve the others.
const READS_PER_EVENT: usize = 8;
const TICK: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the transport down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running transport; stops its thread when dropped.
pub struct TcpTransport {
    handle: TcpHandle,
    thread: Option<JoinHandle<()>>,
    local: Vec<SocketAddr>,
}

/// Cloneable, thread-safe access to the transport's connections.
#[derive(Clone)]
pub struct TcpHandle {
    shared: Arc<Shared>,
}

impl TcpTransport {
    /// Bind the listeners and start the thread.
    pub fn start(cfg: TcpConfig, sink: Arc<dyn TcpSink>) -> io::Result<TcpTransport> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let wake =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        epoll.add(&wake, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))?;
        let mut listeners = Vec::new();
        let mut local = Vec::new();
        for (i, addr) in cfg.listen.iter().enumerate() {
            let l = systcp::listen(*addr, 1024).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot listen on {addr}/TCP: {e}"))
            })?;
            local.push(l.local_addr()?);
            epoll.add(
                &l,
                EpollEvent::new(EpollFlags::EPOLLIN, LISTENER_BASE | i as u64),
            )?;
            listeners.push(l);
        }
        let shared = Arc::new(Shared {
            cfg,
            sink,
            epoll,
            wake,
            conns: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            adopt: Mutex::new(Vec::new()),
            closing: Mutex::new(Vec::new()),
            dirty: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rg-tcp".into())
            .spawn(move || EventLoop::new(s, listeners).run())?;
        Ok(TcpTransport {
            handle: TcpHandle { shared },
            thread: Some(thread),
            local,
        })
    }

    pub fn handle(&self) -> TcpHandle {
        self.handle.clone()
    }

    /// The bound listen addresses (ports resolved).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local
    }

    /// Close every connection (reporting each to the sink) and stop the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.handle.shared.stop.store(true, Ordering::SeqCst);
        self.handle.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop();
    }
}

impl TcpHandle {
    fn wake(&self) {
        let _ = self.shared.wake.write(1);
    }

    fn get(&self, id: ConnId) -> Result<Arc<Conn>, SendError> {
        let t = self.shared.conns.read().unwrap_or_else(|p| p.into_inner());
        t.get(&id).cloned().ok_or(SendError::UnknownConn)
    }

    /// Send one message. Interactive packets (nothing queued, a pause since the last
    /// write) are written at once; packets following closely are bulk: they gather in
    /// the queue and the transport's thread writes them together moments later (or at
    /// once when a write budget has gathered). Callers that know their batches can use
    /// [`TcpHandle::send_batch`] or [`TcpHandle::queue`] + [`TcpHandle::flush`].
    pub fn send(&self, conn: ConnId, msg: &[u8]) -> Result<(), SendError> {
        let c = self.get(conn)?;
        let mut out = lock(&c.out);
        let before = out.q.len();
        self.enqueue(&c, &mut out, &[msg])?;
        let policy = self.shared.cfg.coalesce;
        let since = out.last_write.map(|t| t.elapsed());
        if policy.is_interactive(before, since) || policy.flush_now(out.q.len(), false, out.mss) {
            self.flush_locked(&c, &mut out);
        } else if !out.flush_pending && !out.want_out {
            // Bulk: one wake-up per batch, not per packet; while the socket is full
            // (want_out) the writability event flushes anyway.
            out.flush_pending = true;
            lock(&self.shared.dirty).push(conn);
            self.wake();
        }
        Ok(())
    }

    /// Queue a batch and write it with one `sendmsg` (more only past the write
    /// budget). Returns how many messages were queued; packets that did not fit are
    /// dropped whole (`Full` when none fitted). Invalid messages are skipped.
    pub fn send_batch(&self, conn: ConnId, msgs: &[&[u8]]) -> Result<usize, SendError> {
        let c = self.get(conn)?;
        let mut out = lock(&c.out);
        let n = self.enqueue(&c, &mut out, msgs)?;
        self.flush_locked(&c, &mut out);
        Ok(n)
    }

    /// Queue without writing (bulk); written by [`TcpHandle::flush`] or as soon as a
    /// write budget has gathered.
    pub fn queue(&self, conn: ConnId, msg: &[u8]) -> Result<(), SendError> {
        let c = self.get(conn)?;
        let mut out = lock(&c.out);
        self.enqueue(&c, &mut out, &[msg])?;
        if self
            .shared
            .cfg
            .coalesce
            .flush_now(out.q.len(), false, out.mss)
        {
            self.flush_locked(&c, &mut out);
        }
        Ok(())
    }

    /// Write what [`TcpHandle::queue`] gathered.
    pub fn flush(&self, conn: ConnId) -> Result<(), SendError> {
        let c = self.get(conn)?;
        let mut out = lock(&c.out);
        self.flush_locked(&c, &mut out);
        Ok(())
    }

    fn enqueue(&self, c: &Conn, out: &mut Out, msgs: &[&[u8]]) -> Result<usize, SendError> {
        let limit = match out.state {
            State::Closed => return Err(SendError::Closed),
            State::Connecting => self.shared.cfg.connecting_queue,
            State::Open => usize::MAX,
        };
        let (mut queued, mut dropped, mut invalid) = (0, 0, None);
        let coalesce = self.shared.cfg.coalesce;
        for m in msgs {
            if let Err(e) = check_message(m, MAX_MESSAGE_LEN) {
                invalid = Some(e);
                continue;
            }
            // A write budget's worth gathered: write it before queueing more, so a
            // large batch streams instead of overflowing the queue.
            if coalesce.flush_now(out.q.len() + 2 + m.len(), false, out.mss) {
                self.flush_locked(c, out);
            }
            if out.q.len() + 2 + m.len() > limit || out.q.push(m).is_err() {
                dropped += 1;
                continue;
            }
            queued += 1;
        }
        out.dropped += dropped;
        match (queued, invalid) {
            (0, Some(e)) if dropped == 0 => Err(SendError::Invalid(e)),
            (0, _) if dropped > 0 => Err(SendError::Full),
            _ => Ok(queued),
        }
    }

    /// Write queued bytes: one `sendmsg` per write budget until the queue is empty or
    /// the socket is full; then watch for writability only while bytes remain.
    fn flush_locked(&self, c: &Conn, out: &mut Out) {
        if out.state != State::Open {
            return;
        }
        let budget = self.shared.cfg.coalesce.write_budget(out.mss);
        while !out.q.is_empty() {
            let mut limit = budget;
            if out.q.len() <= budget {
                if let Some(first) = tail_split(out.q.len(), out.q.last_frame(), out.mss) {
                    limit = first;
                }
            }
            let (a, b) = out.q.slices(limit);
            let want = a.len() + b.len();
            match systcp::send_slices(&c.stream, &[IoSlice::new(a), IoSlice::new(b)]) {
                Ok(n) => {
                    out.q.consume(n);
                    out.bytes_sent += n as u64;
                    out.writes += 1;
                    out.last_write = Some(Instant::now());
                    if n < want {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("tcp conn {} to {}: write failed: {e}", c.id, c.remote);
                    out.state = State::Closed;
                    lock(&self.shared.closing).push(c.id);
                    self.wake();
                    return;
                }
            }
        }
        let want_out = !out.q.is_empty();
        if want_out != out.want_out {
            let mut flags = EpollFlags::EPOLLIN;
            if want_out {
                flags |= EpollFlags::EPOLLOUT;
            }
            let mut ev = EpollEvent::new(flags, c.id);
            if self.shared.epoll.modify(&c.stream, &mut ev).is_ok() {
                out.want_out = want_out;
            }
        }
    }

    /// Open a connection to `remote`. Returns at once; the sink hears `on_connected`
    /// or `on_closed`. Messages sent meanwhile are queued (up to `connecting_queue`).
    pub fn connect(&self, remote: SocketAddr) -> io::Result<ConnId> {
        let sh = &self.shared;
        if sh.conns.read().unwrap_or_else(|p| p.into_inner()).len() >= sh.cfg.max_conns {
            return Err(io::Error::other("TCP connection limit reached"));
        }
        let stream = systcp::connect_nonblocking(remote, &sh.cfg.tuning)?;
        let cc = set_cc(&stream, sh.cfg.cc.choose(None));
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(new_conn(
            &sh.cfg,
            id,
            remote,
            false,
            stream,
            State::Connecting,
            cc,
        ));
        sh.conns
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, conn.clone());
        lock(&sh.adopt).push(conn);
        self.wake();
        Ok(id)
    }

    /// Close a connection; the sink hears `on_closed` from the transport's thread.
    pub fn close(&self, conn: ConnId) {
        if let Ok(c) = self.get(conn) {
            lock(&c.out).state = State::Closed;
        }
        lock(&self.shared.closing).push(conn);
        self.wake();
    }

    /// A snapshot of one connection (reads `TCP_INFO`).
    pub fn stats(&self, conn: ConnId) -> Option<ConnStats> {
        let c = self.get(conn).ok()?;
        let info = systcp::tcp_info(&c.stream).ok();
        let out = lock(&c.out);
        Some(ConnStats {
            remote: c.remote,
            inbound: c.inbound,
            connecting: out.state == State::Connecting,
            srtt: info.map(|i| i.srtt).filter(|d| !d.is_zero()),
            cc: out.cc,
            snd_mss: info.map_or(0, |i| i.snd_mss),
            bytes_sent: out.bytes_sent,
            writes: out.writes,
            bytes_received: c.bytes_received.load(Ordering::Relaxed),
            messages_received: c.messages_received.load(Ordering::Relaxed),
            dropped: out.dropped,
            queued: out.q.len(),
        })
    }

    /// Ids of all open connections.
    pub fn connections(&self) -> Vec<ConnId> {
        self.shared
            .conns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }
}

fn new_conn(
    cfg: &TcpConfig,
    id: ConnId,
    remote: SocketAddr,
    inbound: bool,
    stream: TcpStream,
    state: State,
    cc: Option<Algo>,
) -> Conn {
    Conn {
        id,
        remote,
        inbound,
        stream,
        out: Mutex::new(Out {
            q: OutQueue::new(cfg.send_queue),
            state,
            want_out: state == State::Connecting,
            mss: 1448,
            cc,
            dropped: 0,
            bytes_sent: 0,
            writes: 0,
            last_write: None,
            flush_pending: false,
        }),
        bytes_received: AtomicU64::new(0),
        messages_received: AtomicU64::new(0),
    }
}

static CC_FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// Set `want` (or the first available fallback); one log line per process when an
/// algorithm is missing.
pub(crate) fn set_cc(fd: &impl AsFd, want: Algo) -> Option<Algo> {
    let (got, fell_back) = apply_with_fallback(want, |a| systcp::set_congestion(fd, a.name()))?;
    if fell_back && !CC_FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
        log::warn!(
            "TCP congestion control {want} unavailable (load tcp_{want} or allow it in \
             net.ipv4.tcp_allowed_congestion_control); using {got}"
        );
    }
    Some(got)
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

struct EventLoop {
    sh: Arc<Shared>,
    listeners: Vec<TcpListener>,
    paused_until: Option<Instant>,
    local: HashMap<ConnId, Local>,
    per_source: HashMap<IpAddr, usize>,
    rbuf: Box<[u8]>,
    scratch_ids: Vec<ConnId>,
}

impl EventLoop {
    fn new(sh: Arc<Shared>, listeners: Vec<TcpListener>) -> Self {
        EventLoop {
            sh,
            listeners,
            paused_until: None,
            local: HashMap::new(),
            per_source: HashMap::new(),
            rbuf: vec![0; READ_BUF].into_boxed_slice(),
            scratch_ids: Vec::new(),
        }
    }

    fn handle(&self) -> TcpHandle {
        TcpHandle {
            shared: self.sh.clone(),
        }
    }

    fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); 256];
        let mut last_tick = Instant::now();
        while !self.sh.stop.load(Ordering::SeqCst) {
            let n = match self
                .sh
                .epoll
                .wait(&mut events, EpollTimeout::from(TICK.as_millis() as u16))
            {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    log::error!("TCP transport: epoll_wait failed: {e}; stopping");
                    break;
                }
            };
            for ev in &events[..n] {
                let (token, flags) = (ev.data(), ev.events());
                if token == WAKE_TOKEN {
                    let _ = self.sh.wake.read();
                } else if token & LISTENER_BASE != 0 {
                    self.accept((token & !LISTENER_BASE) as usize);
                } else {
                    self.conn_event(token, flags);
                }
            }
            self.adopt();
            self.flush_dirty();
            self.drain_close_requests();
            let now = Instant::now();
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                self.tick(now);
            }
        }
        let ids: Vec<ConnId> = self.local.keys().copied().collect();
        for id in ids {
            self.close(id, "transport stopped");
        }
    }

    fn adopt(&mut self) {
        let new = std::mem::take(&mut *lock(&self.sh.adopt));
        for conn in new {
            let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT, conn.id);
            if let Err(e) = self.sh.epoll.add(&conn.stream, ev) {
                log::warn!(
                    "TCP transport: cannot watch connection to {}: {e}",
                    conn.remote
                );
            }
            let id = conn.id;
            self.local.insert(id, self.new_local(conn));
        }
    }

    fn new_local(&self, conn: Arc<Conn>) -> Local {
        let now = Instant::now();
        Local {
            conn,
            dec: FrameDecoder::new(self.sh.cfg.max_message),
            created: now,
            last_rx: now,
            partial_since: None,
            got_frame: false,
            cc_checked: false,
        }
    }

    /// Write the bulk packets `send` left for us: everything gathered since goes in
    /// one write per connection.
    fn flush_dirty(&mut self) {
        std::mem::swap(&mut self.scratch_ids, &mut *lock(&self.sh.dirty));
        let mut ids = std::mem::take(&mut self.scratch_ids);
        let h = self.handle();
        for id in ids.drain(..) {
            if let Some(l) = self.local.get(&id) {
                let mut out = lock(&l.conn.out);
                out.flush_pending = false;
                h.flush_locked(&l.conn, &mut out);
            }
        }
        self.scratch_ids = ids;
    }

    fn drain_close_requests(&mut self) {
        std::mem::swap(&mut self.scratch_ids, &mut *lock(&self.sh.closing));
        let mut ids = std::mem::take(&mut self.scratch_ids);
        for id in ids.drain(..) {
            self.close(id, "closed");
        }
        self.scratch_ids = ids;
    }

    fn accept(&mut self, i: usize) {
        loop {
            let Some(l) = self.listeners.get(i) else {
                return;
            };
            let (stream, remote) = match l.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors: stop accepting for a moment rather than spin.
                    log::warn!("TCP transport: accept failed: {e}; pausing accepts");
                    for l in &self.listeners {
                        let _ = self.sh.epoll.delete(l);
                    }
                    self.paused_until = Some(Instant::now() + Duration::from_millis(500));
                    return;
                }
            };
            let remote = canonical(remote);
            let count = self.per_source.get(&remote.ip()).copied().unwrap_or(0);
            if self.local.len() >= self.sh.cfg.max_conns || count >= self.sh.cfg.max_per_source {
                log::debug!("TCP transport: refusing {remote}: connection limit");
                drop(stream);
                continue;
            }
            if let Err(e) = stream
                .set_nonblocking(true)
                .map_err(|e| e.to_string())
                .and_then(|_| {
                    systcp::apply(&stream, &self.sh.cfg.tuning).map_err(|e| e.to_string())
                })
            {
                log::warn!("TCP transport: dropping {remote}: {e}");
                continue;
            }
            let cc = set_cc(&stream, self.sh.cfg.cc.choose(None));
            let id = self.sh.next_id.fetch_add(1, Ordering::Relaxed);
            let conn = Arc::new(new_conn(
                &self.sh.cfg,
                id,
                remote,
                true,
                stream,
                State::Open,
                cc,
            ));
            if self
                .sh
                .epoll
                .add(&conn.stream, EpollEvent::new(EpollFlags::EPOLLIN, id))
                .is_err()
            {
                continue;
            }
            update_mss(&conn);
            *self.per_source.entry(remote.ip()).or_insert(0) += 1;
            self.sh
                .conns
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, conn.clone());
            self.local.insert(id, self.new_local(conn));
            log::debug!("TCP transport: conn {id} from {remote}");
        }
    }

    fn conn_event(&mut self, id: ConnId, flags: EpollFlags) {
        let Some(l) = self.local.get(&id) else { return };
        let conn = l.conn.clone();
        if flags.contains(EpollFlags::EPOLLOUT) {
            let mut out = lock(&conn.out);
            if out.state == State::Connecting {
                match systcp::take_error(&conn.stream) {
                    Ok(()) => {
                        out.state = State::Open;
                        drop(out);
                        update_mss(&conn);
                        if let Some(l) = self.local.get_mut(&id) {
                            l.created = Instant::now();
                            l.last_rx = l.created;
                        }
                        self.sh.sink.on_connected(id);
                        out = lock(&conn.out);
                        // Make the flush below re-arm epoll to what is needed.
                        out.want_out = true;
                    }
                    Err(e) => {
                        drop(out);
                        self.close(id, &format!("connect failed: {e}"));
                        return;
                    }
                }
            }
            self.handle().flush_locked(&conn, &mut out);
        }
        if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            self.read(id, &conn);
        }
    }

    fn read(&mut self, id: ConnId, conn: &Arc<Conn>) {
        let sink = self.sh.sink.clone();
        let Some(l) = self.local.get_mut(&id) else {
            return;
        };
        let mut reason = None;
        for _ in 0..READS_PER_EVENT {
            let n = match (&conn.stream).read(&mut self.rbuf) {
                Ok(0) => {
                    reason = Some("peer closed".to_string());
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    reason = Some(format!("read failed: {e}"));
                    break;
                }
            };
            conn.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
            let remote = conn.remote;
            match l
                .dec
                .feed(&self.rbuf[..n], |m| sink.on_message(id, remote, m))
            {
                Ok(frames) => {
                    let now = Instant::now();
                    if frames > 0 {
                        l.got_frame = true;
                        l.last_rx = now;
                        conn.messages_received
                            .fetch_add(frames as u64, Ordering::Relaxed);
                        l.partial_since = None;
                    }
                    if l.dec.buffered() > 0 && (frames > 0 || l.partial_since.is_none()) {
                        l.partial_since = Some(now);
                    }
                }
                Err(e) => {
                    reason = Some(format!("bad frame: {e}"));
                    break;
                }
            }
            if n < self.rbuf.len() {
                break;
            }
        }
        if let Some(r) = reason {
            self.close(id, &r);
        }
    }

    fn tick(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|t| now >= t) {
            self.paused_until = None;
            for (i, l) in self.listeners.iter().enumerate() {
                let _ = self.sh.epoll.add(
                    l,
                    EpollEvent::new(EpollFlags::EPOLLIN, LISTENER_BASE | i as u64),
                );
            }
        }
        let cfg = &self.sh.cfg;
        let mut expired: Vec<(ConnId, &'static str)> = Vec::new();
        for (id, l) in self.local.iter_mut() {
            let state = lock(&l.conn.out).state;
            let age = now.duration_since(l.created);
            let why = if state == State::Connecting && age > cfg.connect_timeout {
                Some("connect timed out")
            } else if l.conn.inbound && !l.got_frame && age > cfg.first_message_timeout {
                Some("no WireGuard message after connecting")
            } else if l
                .partial_since
                .is_some_and(|t| now.duration_since(t) > cfg.partial_timeout)
            {
                Some("frame incomplete for too long")
            } else if now.duration_since(l.last_rx) > cfg.idle_timeout {
                Some("idle")
            } else {
                None
            };
            if let Some(w) = why {
                expired.push((*id, w));
                continue;
            }
            // Re-check congestion control once the kernel has an RTT sample from data.
            if state == State::Open && !l.cc_checked && age >= Duration::from_secs(1) {
                if let Ok(info) = systcp::tcp_info(&l.conn.stream) {
                    if info.bytes_acked > 0 || info.bytes_received > 0 {
                        l.cc_checked = true;
                        let mut out = lock(&l.conn.out);
                        if info.snd_mss > 0 {
                            out.mss = info.snd_mss as usize;
                        }
                        let current = out.cc.unwrap_or(cfg.cc.low);
                        if let Some(want) = cfg.cc.recheck(current, info.srtt) {
                            out.cc = set_cc(&l.conn.stream, want).or(out.cc);
                            log::debug!(
                                "TCP conn {id}: srtt {:?} -> congestion control {:?}",
                                info.srtt,
                                out.cc
                            );
                        }
                    }
                }
            }
        }
        for (id, why) in expired {
            self.close(id, why);
        }
    }

    fn close(&mut self, id: ConnId, why: &str) {
        let Some(l) = self.local.remove(&id) else {
            // Never adopted or already gone; make sure the table forgets it too.
            self.sh
                .conns
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return;
        };
        self.sh
            .conns
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        lock(&l.conn.out).state = State::Closed;
        let _ = self.sh.epoll.delete(&l.conn.stream);
        let _ = l.conn.stream.shutdown(std::net::Shutdown::Both);
        if l.conn.inbound {
            let ip = l.conn.remote.ip();
            if let Some(c) = self.per_source.get_mut(&ip) {
                *c -= 1;
                if *c == 0 {
                    self.per_source.remove(&ip);
                }
            }
        }
        {
            let out = lock(&l.conn.out);
            log::debug!(
                "TCP conn {id} ({}): {why}; sent {} bytes in {} writes, {} packets dropped",
                l.conn.remote,
                out.bytes_sent,
                out.writes,
                out.dropped
            );
        }
        self.sh.sink.on_closed(id);
    }
}

fn update_mss(conn: &Conn) {
    if let Ok(info) = systcp::tcp_info(&conn.stream) {
        if info.snd_mss > 0 {
            lock(&conn.out).mss = info.snd_mss as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;

    #[derive(Debug, PartialEq)]
    enum Ev {
        Msg(ConnId, Vec<u8>),
        Closed(ConnId),
        Connected(ConnId),
    }

    struct Chan(Mutex<mpsc::Sender<Ev>>);

    impl TcpSink for Chan {
        fn on_message(&self, conn: ConnId, _remote: SocketAddr, msg: &[u8]) {
            let _ = lock(&self.0).send(Ev::Msg(conn, msg.to_vec()));
        }
        fn on_closed(&self, conn: ConnId) {
            let _ = lock(&self.0).send(Ev::Closed(conn));
        }
        fn on_connected(&self, conn: ConnId) {
            let _ = lock(&self.0).send(Ev::Connected(conn));
        }
    }

    /// Echoes every message back on the connection it came from, from inside the
    /// callback (the deadlock case the design must allow).
    struct Echo(Mutex<Option<TcpHandle>>);

    impl TcpSink for Echo {
        fn on_message(&self, conn: ConnId, _remote: SocketAddr, msg: &[u8]) {
            if let Some(h) = lock(&self.0).as_ref() {
                let _ = h.send(conn, msg);
            }
        }
        fn on_closed(&self, _conn: ConnId) {}
    }

    fn msg(len: usize, fill: u8) -> Vec<u8> {
        let mut m = vec![fill; len];
        m[..4].copy_from_slice(&[4, 0, 0, 0]);
        m
    }

    fn listen_cfg() -> TcpConfig {
        TcpConfig {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            ..TcpConfig::default()
        }
    }

    fn recv(rx: &mpsc::Receiver<Ev>) -> Ev {
        rx.recv_timeout(Duration::from_secs(10)).expect("event")
    }

    #[test]
    fn connect_send_echo_close() {
        let echo = Arc::new(Echo(Mutex::new(None)));
        let server = TcpTransport::start(listen_cfg(), echo.clone()).unwrap();
        *lock(&echo.0) = Some(server.handle());
        let addr = server.local_addrs()[0];

        let (tx, rx) = mpsc::channel();
        let client =
            TcpTransport::start(TcpConfig::default(), Arc::new(Chan(Mutex::new(tx)))).unwrap();
        let h = client.handle();
        let id = h.connect(addr).unwrap();
        // Queued while connecting, delivered after.
        h.send(id, &msg(32, 1)).unwrap();
        assert_eq!(recv(&rx), Ev::Connected(id));
        assert_eq!(recv(&rx), Ev::Msg(id, msg(32, 1)));
        let batch: Vec<Vec<u8>> = (0..100).map(|i| msg(1400, i as u8)).collect();
        let refs: Vec<&[u8]> = batch.iter().map(|m| m.as_slice()).collect();
        assert_eq!(h.send_batch(id, &refs), Ok(100));
        for m in &batch {
            assert_eq!(recv(&rx), Ev::Msg(id, m.clone()));
        }
        let st = h.stats(id).unwrap();
        assert!(!st.connecting && st.cc.is_some() && st.bytes_sent > 140_000);
        assert_eq!(
            h.send(id, &[0u8; 8]),
            Err(SendError::Invalid(FrameError::TooShort { len: 8 }))
        );
        h.close(id);
        assert_eq!(recv(&rx), Ev::Closed(id));
        assert_eq!(h.send(id, &msg(32, 0)), Err(SendError::UnknownConn));
        let id2 = h.connect(addr).unwrap();
        assert!(id2 > id, "ids are never reused");
        client.shutdown();
        server.shutdown();
    }

    #[test]
    fn congestion_control_rechecked_once_rtt_known() {
        // A zero threshold: any measured RTT counts as "long", so the re-check must
        // move both ends from the initial cubic to bbr once data has flowed.
        let policy = CcPolicy {
            threshold: Duration::ZERO,
            ..CcPolicy::default()
        };
        let echo = Arc::new(Echo(Mutex::new(None)));
        let server = TcpTransport::start(
            TcpConfig {
                cc: policy,
                ..listen_cfg()
            },
            echo.clone(),
        )
        .unwrap();
        *lock(&echo.0) = Some(server.handle());
        let (tx, rx) = mpsc::channel();
        let client = TcpTransport::start(
            TcpConfig {
                cc: policy,
                ..TcpConfig::default()
            },
            Arc::new(Chan(Mutex::new(tx))),
        )
        .unwrap();
        let h = client.handle();
        let id = h.connect(server.local_addrs()[0]).unwrap();
        assert_eq!(recv(&rx), Ev::Connected(id));
        assert_eq!(
            h.stats(id).unwrap().cc,
            Some(Algo::Cubic),
            "before any RTT: the low one"
        );
        h.send(id, &msg(100, 1)).unwrap();
        assert_eq!(recv(&rx), Ev::Msg(id, msg(100, 1)));
        let mut cc = None;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(100));
            cc = h.stats(id).unwrap().cc;
            if cc == Some(Algo::Bbr) {
                break;
            }
        }
        let available =
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .unwrap_or_default();
        if available.split_whitespace().any(|a| a == "bbr") {
            assert_eq!(cc, Some(Algo::Bbr));
        } else {
            eprintln!("bbr not available here: fell back to {cc:?}");
            assert!(cc.is_some());
        }
    }

    #[test]
    fn per_packet_sends_coalesce_in_order() {
        let (tx, rx) = mpsc::channel();
        let server = TcpTransport::start(listen_cfg(), Arc::new(Chan(Mutex::new(tx)))).unwrap();
        let (ctx, crx) = mpsc::channel();
        let client =
            TcpTransport::start(TcpConfig::default(), Arc::new(Chan(Mutex::new(ctx)))).unwrap();
        let h = client.handle();
        let id = h.connect(server.local_addrs()[0]).unwrap();
        assert_eq!(recv(&crx), Ev::Connected(id));
        // Faster than any path: some packets may be dropped whole (as a full UDP socket
        // would); those accepted arrive complete and in order.
        let n = 2000;
        let mut accepted = Vec::new();
        for i in 0..n {
            match h.send(id, &msg(1200, i as u8)) {
                Ok(()) => accepted.push(i as u8),
                Err(e) => assert_eq!(e, SendError::Full),
            }
        }
        for (k, i) in accepted.iter().enumerate() {
            let Ev::Msg(_, m) = recv(&rx) else {
                panic!("expected a message")
            };
            assert_eq!(m, msg(1200, *i), "accepted message {k} in order");
        }
        let st = h.stats(id).unwrap();
        assert_eq!(st.bytes_sent, accepted.len() as u64 * 1202);
        assert_eq!(st.dropped, (n - accepted.len()) as u64);
        assert!(st.writes <= accepted.len() as u64);
        eprintln!(
            "{} of {n} packets accepted, sent in {} writes",
            accepted.len(),
            st.writes
        );
    }

    #[test]
    fn from_gateway_config() {
        let g = crate::core::config::GatewayConfig {
            tcp_listen: vec![443, 80],
            bbr_rtt_ms: 70,
            ..Default::default()
        };
        let c = TcpConfig::from_gateway(&g);
        assert_eq!(
            c.listen,
            vec!["[::]:443".parse().unwrap(), "[::]:80".parse().unwrap()]
        );
        assert_eq!(c.cc.threshold, Duration::from_millis(70));
    }

    #[test]
    fn bad_frames_close_only_that_connection() {
        let (tx, rx) = mpsc::channel();
        let server = TcpTransport::start(listen_cfg(), Arc::new(Chan(Mutex::new(tx)))).unwrap();
        let addr = server.local_addrs()[0];
        let mut good = std::net::TcpStream::connect(addr).unwrap();
        let mut bad = std::net::TcpStream::connect(addr).unwrap();
        let m = msg(40, 3);
        let mut f = vec![0, 40];
        f.extend_from_slice(&m);
        good.write_all(&f).unwrap();
        let Ev::Msg(good_id, got) = recv(&rx) else {
            panic!()
        };
        assert_eq!(got, m);
        // crates.io udp-over-tcp framing: u32 little-endian length.
        bad.write_all(&[40, 0, 0, 0, 4, 0, 0, 0]).unwrap();
        let Ev::Closed(bad_id) = recv(&rx) else {
            panic!()
        };
        assert_ne!(bad_id, good_id);
        let mut buf = [0u8; 1];
        bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(bad.read(&mut buf).unwrap_or(0), 0, "bad connection closed");
        good.write_all(&f).unwrap();
        assert_eq!(recv(&rx), Ev::Msg(good_id, m));
    }

    #[test]
    fn limits_and_slowloris() {
        let (tx, rx) = mpsc::channel();
        let cfg = TcpConfig {
            max_per_source: 2,
            first_message_timeout: Duration::from_millis(600),
            partial_timeout: Duration::from_millis(600),
            ..listen_cfg()
        };
        let server = TcpTransport::start(cfg, Arc::new(Chan(Mutex::new(tx)))).unwrap();
        let addr = server.local_addrs()[0];
        let a = std::net::TcpStream::connect(addr).unwrap();
        let mut b = std::net::TcpStream::connect(addr).unwrap();
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            c.read(&mut buf).unwrap_or(0),
            0,
            "third from one source refused"
        );
        // b starts a frame and never finishes it; a says nothing: both closed.
        b.write_all(&[0, 40, 4, 0, 0, 0]).unwrap();
        let mut closed = [recv(&rx), recv(&rx)];
        closed.sort_by_key(|e| format!("{e:?}"));
        assert!(closed.iter().all(|e| matches!(e, Ev::Closed(_))));
        drop(a);
    }

    #[test]
    fn full_queue_drops_whole_packets() {
        // A server that never reads: the client's queue fills and drops.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let cfg = TcpConfig {
            tuning: TcpTuning {
                send_buffer: Some(4096),
                ..TcpTuning::default()
            },
            ..TcpConfig::default()
        };
        let client = TcpTransport::start(cfg, Arc::new(Chan(Mutex::new(tx)))).unwrap();
        let h = client.handle();
        let id = h.connect(addr).unwrap();
        let (_s, _) = l.accept().unwrap();
        assert_eq!(recv(&rx), Ev::Connected(id));
        let m = msg(1400, 0);
        let mut full = 0;
        for _ in 0..20_000 {
            if h.send(id, &m) == Err(SendError::Full) {
                full += 1;
            }
        }
        let st = h.stats(id).unwrap();
        assert!(full > 0 && st.dropped == full);
        assert!(st.queued <= 128 * 1024, "bounded: {}", st.queued);
    }
}
