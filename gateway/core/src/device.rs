//! The WireGuard device: peers, cryptokey routing and the packet decisions, with no I/O.
//!
//! Drivers hand it buffers (a packet read from the TUN, a datagram from a socket) and an
//! [`Io`] sink; it answers by calling the sink (send this datagram to that endpoint, write
//! this packet to the TUN). The noise protocol is boringtun's `Tunn`, one per peer behind
//! its own mutex, so workers on different cores only meet when they touch the same peer.
//!
//! The peer table is an immutable snapshot ([`Table`]) swapped whole on reconfiguration;
//! workers keep a [`TableCache`] and reload it only when the generation counter moves, so
//! the packet path takes no global lock.
//!
//! Authentication (the invariant ARCHITECTURE.md states): a peer's endpoint, rx counters,
//! keepalive debt and TCP-fallback events move only on a message that proved the peer's
//! keys — a decrypted data packet (keepalives included) or a completed handshake (an
//! initiation we answered, a response we accepted). [`classify`] is the one place that
//! decides; cookie replies (sent or received), rate-limited, replayed and forged
//! messages are never authenticated.
//!
//! Time: boringtun's `Tunn` reads its own monotonic clock (the one place this core does;
//! tests drive it with boringtun's `mock-instant` feature). Everything of ours that needs
//! wall time (the UAPI's last-handshake time) takes it as an argument.
//!
//! Owns: the peer table, each peer's state and the message verdict (`classify`).
//! Invariant: only a message `classify` calls authenticated moves a peer's state; the
//! tests in `sim_tests.rs` hold it to that.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519;
use rand_core::RngCore;

use crate::allowed_ips::AllowedIps;
use crate::config::{Config, Endpoint};
use crate::key::Key;
use crate::lane::Lane;
use crate::net::Cidr;

/// Identifies one TCP connection of the fallback transport; never reused.
pub type ConnId = u64;

/// Where a peer is reached: a UDP address, or a TCP-fallback connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerAddr {
    Udp(SocketAddr),
    Tcp { conn: ConnId, remote: SocketAddr },
}

impl PeerAddr {
    pub fn ip(&self) -> IpAddr {
        self.socket_addr().ip()
    }

    pub fn socket_addr(&self) -> SocketAddr {
        match *self {
            PeerAddr::Udp(a) => a,
            PeerAddr::Tcp { remote, .. } => remote,
        }
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, PeerAddr::Tcp { .. })
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Udp(a) => write!(f, "{a}"),
            PeerAddr::Tcp { remote, .. } => write!(f, "{remote} (tcp)"),
        }
    }
}

/// What the device asks its driver to do. Calls happen while a peer's lock is held:
/// implementations must only queue or write, never call back into the device.
///
/// A sink that batches can also lend the device its buffers, so a packet is encrypted
/// straight into its slot of the send batch and decrypted straight into the coalescing
/// buffer (no copy after boringtun's own): `send_slot` + `send_commit`, `tun_slot` +
/// `tun_commit`. A slot is scratch until committed; the defaults lend nothing.
pub trait Io {
    /// Send one WireGuard message to a peer address.
    fn send(&mut self, to: PeerAddr, datagram: &[u8]);
    /// Write one decrypted IP packet to the TUN.
    fn tun_write(&mut self, packet: &[u8]);
    /// Room for the next message to `to`, at least `max` bytes, where it will be sent
    /// from; `expected` is the size it will most likely have (the data packet's), which
    /// decides whether it can join a batch. `None`: the device uses its scratch buffer
    /// and [`Io::send`].
    fn send_slot(&mut self, _to: PeerAddr, _expected: usize, _max: usize) -> Option<&mut [u8]> {
        None
    }
    /// The first `len` bytes of the last `send_slot` are a message for `to`.
    fn send_commit(&mut self, _to: PeerAddr, _len: usize) {}
    /// Room for the next decrypted packet, at least `max` bytes; `None`: scratch and
    /// [`Io::tun_write`].
    fn tun_slot(&mut self, _max: usize) -> Option<&mut [u8]> {
        None
    }
    /// The first `len` bytes of the last `tun_slot` are a packet for the TUN.
    fn tun_commit(&mut self, _len: usize) {}
}

/// Size of a handshake initiation, the largest message `encapsulate` may write instead
/// of the data packet (when no session exists yet).
const HANDSHAKE_INIT_LEN: usize = 148;

/// Largest datagram we handle; buffers passed in must be at least this plus overhead.
pub const MAX_PACKET: usize = 65535;
/// Scratch buffer size a driver should give the device per call.
pub const SCRATCH_SIZE: usize = MAX_PACKET + 64;

/// Handshake messages the whole device accepts per second before it answers with cookies.
/// One limiter serves the device and every peer's `Tunn` (one cookie secret): an
/// initiation is counted twice (once before the DH that finds its peer, once inside the
/// peer's `Tunn`), a response once, so this is about 100 initiations a second.
const HANDSHAKE_RATE_LIMIT: u64 = 200;

/// WireGuard's KEEPALIVE_TIMEOUT: after a data packet from a peer, an authenticated
/// packet back is owed within this long.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Local peer indexes are random in 1..2^24 (boringtun shifts them left by 8).
const INDEX_SPACE: u32 = 1 << 24;

/// Counters of dropped input, by cause. Plain atomics: cheap and lock-free.
#[derive(Default, Debug)]
pub struct DropCounters {
    /// Not a WireGuard message (bad type or length).
    pub malformed: AtomicU64,
    /// Failed authentication, replay, or otherwise rejected by the noise layer.
    pub rejected: AtomicU64,
    /// Handshake for a public key we do not know.
    pub unknown_peer: AtomicU64,
    /// Receiver index that names no peer.
    pub unknown_index: AtomicU64,
    /// Decrypted packet whose source is not in the sending peer's allowed IPs.
    pub not_allowed_src: AtomicU64,
    /// TUN packet whose destination matches no peer.
    pub no_route: AtomicU64,
    /// TUN packet for a peer with no known endpoint.
    pub no_endpoint: AtomicU64,
    /// Cookie replies sent because handshakes came in too fast.
    pub cookies_sent: AtomicU64,
    /// TUN packet boringtun refused to encapsulate.
    pub encapsulate: AtomicU64,
    /// Timer errors other than an expired connection.
    pub timers: AtomicU64,
}

impl DropCounters {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> [(&'static str, u64); 10] {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("malformed", l(&self.malformed)),
            ("rejected", l(&self.rejected)),
            ("unknown_peer", l(&self.unknown_peer)),
            ("unknown_index", l(&self.unknown_index)),
            ("not_allowed_src", l(&self.not_allowed_src)),
            ("no_route", l(&self.no_route)),
            ("no_endpoint", l(&self.no_endpoint)),
            ("cookies_sent", l(&self.cookies_sent)),
            ("encapsulate", l(&self.encapsulate)),
            ("timers", l(&self.timers)),
        ]
    }
}

/// Mutable per-peer state, behind the peer's mutex.
pub struct PeerState {
    tunn: Tunn,
    pub endpoint: Option<PeerAddr>,
    pub preshared_key: Option<Key>,
    pub persistent_keepalive: Option<u16>,
    /// When the last handshake completed, on the device's monotonic clock (the `now` of
    /// `update_timers`); `peer_stats` dates it with the wall-clock time the last
    /// `update_timers` was given (UAPI `last_handshake_time`): core reads no clock.
    pub last_handshake: Option<Duration>,
    /// Bytes of WireGuard messages sent and received (UAPI `tx_bytes`/`rx_bytes`).
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// WireGuard messages sent, and authenticated ones received (the metrics' packets).
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// Handshake initiations sent while an earlier one was still unanswered (each such
    /// retry is a failed attempt), and sessions boringtun gave up on.
    pub handshake_failures: u64,
    /// Times an authenticated packet moved the endpoint from one address to another.
    pub endpoint_changes: u64,
    /// The latest endpoint moves, for telling two devices on one key from a roaming one.
    roams: RoamHistory,
    /// Whether the last `update_timers` saw an established session (for the log line).
    had_session: bool,
    /// A data packet arrived and nothing has gone back since: a passive keepalive is
    /// owed. The value is the device tick time (see [`Device::update_timers`]) at the
    /// receive. Kept here rather than trusted to boringtun 0.7.1, whose timers compare
    /// tick-granular timestamps with a strict `>` and so never send it when the data
    /// arrived in the same 250 ms tick as our last send.
    keepalive_owed_since: Option<Duration>,
    /// Device time of the last authenticated message from the peer.
    last_heard: Option<Duration>,
    /// Device time of the last message sent to the peer (data or handshake).
    last_sent: Option<Duration>,
    /// Device time of the first data message sent since the peer was last heard: the
    /// start of WireGuard's "data sent, nothing back for KEEPALIVE + REKEY_TIMEOUT"
    /// countdown (see [`PeerState::hold_timers`]).
    unanswered_since: Option<Duration>,
    /// We sent a handshake initiation that no response has completed yet.
    initiating: bool,
    /// Transport events for the TCP-fallback client (index 0 UDP, 1 TCP), counted here
    /// and turned into state-machine inputs by the driver.
    pub events: TransportEvents,
}

impl PeerState {
    /// A peer's state before anything happened: no endpoint, no traffic, no handshake.
    fn fresh(tunn: Tunn) -> PeerState {
        PeerState {
            tunn,
            endpoint: None,
            preshared_key: None,
            persistent_keepalive: None,
            last_handshake: None,
            tx_bytes: 0,
            rx_bytes: 0,
            tx_packets: 0,
            rx_packets: 0,
            handshake_failures: 0,
            endpoint_changes: 0,
            roams: RoamHistory::default(),
            had_session: false,
            keepalive_owed_since: None,
            last_heard: None,
            last_sent: None,
            unanswered_since: None,
            initiating: false,
            events: TransportEvents::default(),
        }
    }

    /// Whether boringtun's timers must wait this tick. boringtun 0.7.1 starts a handshake
    /// when data was sent after the last receive and that receive is 15 s old — timed from
    /// the receive, where WireGuard times it from the send. After 15 s of quiet, a tick
    /// between a send and its answer would start a needless handshake. While our own
    /// countdown (from `unanswered_since`) is short of 15 s and boringtun's is about to
    /// fire, its timers wait; they run as soon as the peer is heard or the 15 s are up. No
    /// handshake is in progress then (that branch of boringtun's timers does not judge
    /// this rule), and the other timers it skips (rekey, expiry, persistent keepalive
    /// while we are sending anyway) tolerate that delay.
    fn hold_timers(&self, now: Duration) -> bool {
        match (self.unanswered_since, self.last_heard) {
            (Some(sent), Some(heard)) => {
                !self.initiating
                    && now.saturating_sub(sent) < NEW_HANDSHAKE_AFTER_SILENCE
                    // A second of slack: boringtun reads its own clock a moment later.
                    && now.saturating_sub(heard) + Duration::from_secs(1)
                        >= NEW_HANDSHAKE_AFTER_SILENCE
            }
            _ => false,
        }
    }

    /// Data has gone unanswered for KEEPALIVE + REKEY_TIMEOUT and no handshake is under
    /// way: time for a new one. boringtun 0.7.1 misses this when the data went out in the
    /// same 250 ms tick as the last receive (its timestamps are tick-granular and the
    /// comparison strict), so the device judges it too.
    /// Traffic to send that goes unanswered: something went out within the last 180 s
    /// after the peer was last heard (data waiting for a session makes handshakes).
    fn wants_to_send(&self, now: Duration) -> bool {
        self.initiating
            || self.unanswered_since.is_some()
            || self.last_sent.is_some_and(|s| {
                now.saturating_sub(s) <= SESSION_USABLE && self.last_heard.is_none_or(|h| s > h)
            })
    }

    fn handshake_overdue(&self, now: Duration) -> bool {
        !self.initiating
            && self
                .unanswered_since
                .is_some_and(|sent| now.saturating_sub(sent) >= NEW_HANDSHAKE_AFTER_SILENCE)
    }
}

/// Monotonic per-transport counters of what happened to a peer (index: 0 UDP, 1 TCP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportEvents {
    pub handshakes_sent: [u64; 2],
    pub handshakes_answered: [u64; 2],
    pub authenticated_rx: [u64; 2],
}

fn tidx(a: &PeerAddr) -> usize {
    usize::from(a.is_tcp())
}

/// Send a message of this peer's session to `to` (see [`note_sent`]).
fn send_counted(st: &mut PeerState, now: Duration, to: PeerAddr, d: &[u8], io: &mut impl Io) {
    note_sent(st, now, to, d.first().copied(), d.len());
    io.send(to, d);
}

/// Account for a message of this peer's session going to `to`: counts handshake
/// initiations for the fallback client, settles a keepalive debt (any authenticated
/// packet does) and starts the unanswered-data countdown. `now` is device time.
fn note_sent(st: &mut PeerState, now: Duration, to: PeerAddr, kind: Option<u8>, len: usize) {
    if kind == Some(MSG_INIT) {
        st.events.handshakes_sent[tidx(&to)] += 1;
        if st.initiating {
            st.handshake_failures += 1;
        }
        st.initiating = true;
        // The countdown has done its work; the next data sent starts another.
        st.unanswered_since = None;
    }
    if kind == Some(MSG_DATA) && len > KEEPALIVE_LEN && st.unanswered_since.is_none() {
        st.unanswered_since = Some(now);
    }
    st.keepalive_owed_since = None;
    st.tx_bytes += len as u64;
    st.tx_packets += 1;
    st.last_sent = Some(now);
}

const MSG_INIT: u8 = 1;
const MSG_RESPONSE: u8 = 2;
const MSG_COOKIE: u8 = 3;
const MSG_DATA: u8 = 4;
/// A data message with no payload: header (16) and tag (16).
const KEEPALIVE_LEN: usize = 32;
/// WireGuard's KEEPALIVE_TIMEOUT + REKEY_TIMEOUT: data unanswered this long starts a
/// new handshake.
const NEW_HANDSHAKE_AFTER_SILENCE: Duration = Duration::from_secs(15);

/// What one message from the network did, decided from its type and boringtun's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageOutcome {
    /// An initiation we answered with a response: the sender holds the peer's key.
    HandshakeAnswered,
    /// A response to our initiation that completed the handshake.
    HandshakeCompleted,
    /// A decrypted data packet (`keepalive`: empty).
    Data { keepalive: bool },
    /// Answered with a cookie reply (we are under load): proves nothing.
    CookieSent,
    /// A cookie reply we received: proves nothing about the peer.
    CookieReceived,
    /// Rejected: bad MAC, replay, no session, failed decryption.
    Rejected,
}

impl MessageOutcome {
    /// Whether this message proved the peer's keys (the only thing that may move its
    /// endpoint, counters or fallback state).
    pub fn authenticated(self) -> bool {
        matches!(
            self,
            MessageOutcome::HandshakeAnswered
                | MessageOutcome::HandshakeCompleted
                | MessageOutcome::Data { .. }
        )
    }
}

/// The single place that decides whether a message authenticated. `kind` is the type of
/// the message received; `result` what the peer's `Tunn` made of it. boringtun answers an
/// initiation with a response (type 2) but a rate-limited one with a cookie reply
/// (type 3), and a response with a keepalive (type 4) — so the *type of what it wrote*
/// tells them apart, never the mere fact that it wrote something.
fn classify(kind: u8, result: &TunnResult<'_>) -> MessageOutcome {
    match (kind, result) {
        (_, TunnResult::Err(_)) => MessageOutcome::Rejected,
        (_, TunnResult::WriteToNetwork(d)) if d.first() == Some(&MSG_COOKIE) => {
            MessageOutcome::CookieSent
        }
        (MSG_INIT, TunnResult::WriteToNetwork(d)) if d.first() == Some(&MSG_RESPONSE) => {
            MessageOutcome::HandshakeAnswered
        }
        (MSG_RESPONSE, TunnResult::WriteToNetwork(d)) if d.first() == Some(&MSG_DATA) => {
            MessageOutcome::HandshakeCompleted
        }
        (MSG_COOKIE, _) => MessageOutcome::CookieReceived,
        (MSG_DATA, TunnResult::Done) => MessageOutcome::Data { keepalive: true },
        (MSG_DATA, TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..)) => {
            MessageOutcome::Data { keepalive: false }
        }
        _ => MessageOutcome::Rejected,
    }
}

/// The receiver index of a data message (type 4, at least a keepalive long).
fn data_receiver(d: &[u8]) -> Option<u32> {
    if d.len() < KEEPALIVE_LEN || d[0] != MSG_DATA {
        return None;
    }
    Some(u32::from_le_bytes([d[4], d[5], d[6], d[7]]))
}

/// A handle on one train in a [`Peer::lane`]: the driver's job number.
pub type LaneJob = u32;

/// See [`Device::tun_burst`].
pub struct TunBurst<'t> {
    dev: &'t Device,
    table: &'t Table,
    held: Option<(&'t Arc<Peer>, MutexGuard<'t, PeerState>)>,
}

impl TunBurst<'_> {
    /// One packet of the burst, as [`Device::handle_tun_packet`] takes it.
    pub fn packet(&mut self, buf: &mut [u8], len: usize, scratch: &mut [u8], io: &mut impl Io) {
        let dev = self.dev;
        let len = len.min(buf.len());
        let Some(dst) = Tunn::dst_address(&buf[..len]) else {
            DropCounters::bump(&dev.drops.malformed);
            return;
        };
        let Some(peer) = self.table.route(dst) else {
            DropCounters::bump(&dev.drops.no_route);
            return;
        };
        if !self
            .held
            .as_ref()
            .is_some_and(|(p, _)| Arc::ptr_eq(p, peer))
        {
            self.held = None; // the previous peer's lock first
            self.held = Some((peer, peer.lock()));
        }
        if let Some((_, st)) = &mut self.held {
            dev.seal(st, buf, len, scratch, io);
        }
    }
}

/// One configured peer.
pub struct Peer {
    pub public_key: Key,
    /// Our local index for this peer (boringtun shifts it left by 8 for session ids).
    pub index: u32,
    pub allowed_ips: Vec<Cidr>,
    /// TCP port for the fallback transport, if configured.
    pub tcp_port: Option<u16>,
    /// Its received trains spread over the workers and put back in order
    /// (`core::lane`; used by the driver when more than one worker runs).
    pub lane: Lane<LaneJob>,
    state: Mutex<PeerState>,
}

impl Peer {
    /// Lock this peer's state. A poisoned lock (a panic elsewhere) is recovered: the
    /// state is plain data and boringtun keeps its own invariants per call.
    pub fn lock(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Our static identity.
struct Identity {
    private: x25519::StaticSecret,
    public: x25519::PublicKey,
    rate_limiter: Arc<RateLimiter>,
}

/// An immutable snapshot of the peer table.
pub struct Table {
    identity: Option<Identity>,
    peers: Vec<Arc<Peer>>,
    by_key: HashMap<Key, usize>,
    by_index: HashMap<u32, usize>,
    routes: AllowedIps<usize>,
    pub generation: u64,
}

impl Table {
    pub fn peers(&self) -> &[Arc<Peer>] {
        &self.peers
    }

    pub fn peer_by_key(&self, k: &Key) -> Option<&Arc<Peer>> {
        self.by_key.get(k).map(|&i| &self.peers[i])
    }

    fn peer_by_receiver(&self, receiver_idx: u32) -> Option<&Arc<Peer>> {
        self.by_index
            .get(&(receiver_idx >> 8))
            .map(|&i| &self.peers[i])
    }

    /// The peer whose allowed IPs hold `ip` (longest prefix).
    pub fn route(&self, ip: IpAddr) -> Option<&Arc<Peer>> {
        self.routes.lookup(ip).map(|&i| &self.peers[i])
    }
}

/// Why a configuration could not be applied to the device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// More peers than local indices (2^24).
    TooManyPeers,
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::TooManyPeers => f.write_str("too many peers (at most 16777215)"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// The device: the current table plus counters.
pub struct Device {
    table: RwLock<Arc<Table>>,
    generation: AtomicU64,
    config: Mutex<Config>,
    /// The TUN's MTU (0: unknown), the cap for data-packet padding.
    mtu: AtomicU32,
    /// The `now` of the latest `update_timers`, in milliseconds.
    tick_ms: AtomicU64,
    /// The wall-clock time given to the latest `update_timers`, in ms since the epoch.
    tick_wall_ms: AtomicU64,
    /// Where new peers' local indices come from (the caller's random source).
    index_rng: Mutex<Box<dyn RngCore + Send>>,
    pub drops: DropCounters,
    /// What happened to peers since the driver last asked ([`Device::take_events`]):
    /// rare (sessions, endpoint moves), never per data packet; bounded.
    events: Mutex<EventQueue>,
}

/// Peer events waiting for the driver, at most [`MAX_PENDING_EVENTS`]; the rest counted.
#[derive(Default)]
struct EventQueue {
    queue: std::collections::VecDeque<PeerEvent>,
    dropped: u64,
}

/// Peer events kept between two `take_events` (the timer thread asks every 250 ms).
pub const MAX_PENDING_EVENTS: usize = 1024;

/// Something that happened to a peer, for the event log and the log lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEvent {
    pub key: Key,
    /// Device time (the `now` of `update_timers`).
    pub at: Duration,
    pub kind: PeerEventKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEventKind {
    /// A session came up (a handshake completed where there was none).
    SessionEstablished,
    /// The session expired (no new handshake for REJECT_AFTER_TIME x 3, as boringtun
    /// judges) — the peer is gone, or unreachable.
    SessionExpired,
    /// An authenticated packet came from a new address (`old` none: the first).
    EndpointChanged {
        old: Option<PeerAddr>,
        new: PeerAddr,
    },
    /// The endpoint keeps flipping between two addresses: two devices share this key
    /// (see [`RoamHistory`]).
    SharedKey { a: PeerAddr, b: PeerAddr },
}

/// How a peer is doing, as `show peers`, `show status` and the metrics say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// A handshake within 180 s and, when a persistent keepalive is set, a packet
    /// received within that interval (and a tick's slack).
    Up,
    /// A handshake happened, nothing says it is broken: no traffic, or quiet beyond the
    /// keepalive.
    Idle,
    /// No handshake for more than 180 s while there is traffic to send.
    Stale,
    /// Never a handshake.
    Never,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Idle => "idle",
            Health::Stale => "stale",
            Health::Never => "never",
        }
    }

    /// The rule, from device times (`now` and the peer's last handshake and packet).
    pub fn judge(
        now: Duration,
        last_handshake: Option<Duration>,
        last_heard: Option<Duration>,
        keepalive: Option<u16>,
        wants_to_send: bool,
    ) -> Health {
        let Some(hs) = last_handshake else {
            return Health::Never;
        };
        let hs_age = now.saturating_sub(hs);
        if hs_age > SESSION_USABLE {
            return if wants_to_send {
                Health::Stale
            } else {
                Health::Idle
            };
        }
        let heard_recently = match keepalive.filter(|&k| k > 0) {
            None => true,
            Some(k) => last_heard.is_some_and(|h| {
                now.saturating_sub(h) <= Duration::from_secs(u64::from(k)) + HEALTH_SLACK
            }),
        };
        if heard_recently {
            Health::Up
        } else {
            Health::Idle
        }
    }
}

/// What a keepalive may be late by and the peer still `up`: the timer tick of both ends
/// and a round trip.
const HEALTH_SLACK: Duration = Duration::from_secs(2);

/// Two devices on one key: the endpoint moved [`SHARED_KEY_FLIPS`] times within
/// [`SHARED_KEY_WINDOW`], each time back to where it was two moves before, between the
/// same two addresses (A→B→A→B→A→B→A). Each device's handshake breaks the other's
/// session, so they take turns at the rate of WireGuard's retries (seconds). A phone
/// moving from Wi-Fi to LTE and back is two moves; even flapping at the edge of a Wi-Fi
/// it moves far less often than this. Said once per episode; the episode ends after a
/// window with no move.
pub const SHARED_KEY_FLIPS: usize = 6;
pub const SHARED_KEY_WINDOW: Duration = Duration::from_secs(600);

/// The latest endpoint moves of one peer (see [`SHARED_KEY_FLIPS`]).
#[derive(Clone, Debug, Default)]
pub struct RoamHistory {
    /// (device time, new address), oldest first, at most `SHARED_KEY_FLIPS + 1`.
    moves: std::collections::VecDeque<(Duration, PeerAddr)>,
    /// The two addresses of the episode under way, once said.
    said: Option<(PeerAddr, PeerAddr)>,
}

impl RoamHistory {
    /// Record a move to `to` at `now`; the two addresses the first time the moves show
    /// two devices in this episode.
    pub fn moved(&mut self, now: Duration, to: PeerAddr) -> Option<(PeerAddr, PeerAddr)> {
        if self
            .moves
            .back()
            .is_some_and(|&(t, _)| now.saturating_sub(t) > SHARED_KEY_WINDOW)
        {
            // A quiet window: the episode is over.
            self.moves.clear();
            self.said = None;
        }
        self.moves.push_back((now, to));
        while self.moves.len() > SHARED_KEY_FLIPS + 1 {
            self.moves.pop_front();
        }
        let pair = self.flipping(now)?;
        if self.said.is_some() {
            return None;
        }
        self.said = Some(pair);
        Some(pair)
    }

    /// The two addresses, if the last moves alternate between them within the window.
    fn flipping(&self, now: Duration) -> Option<(PeerAddr, PeerAddr)> {
        if self.moves.len() < SHARED_KEY_FLIPS {
            return None;
        }
        let recent: Vec<_> = self.moves.iter().rev().take(SHARED_KEY_FLIPS).collect();
        let oldest = recent.last()?.0;
        if now.saturating_sub(oldest) > SHARED_KEY_WINDOW {
            return None;
        }
        let (a, b) = (recent[0].1, recent[1].1);
        let alternating = a != b
            && recent
                .iter()
                .enumerate()
                .all(|(i, &&(_, x))| x == if i % 2 == 0 { a } else { b });
        alternating.then_some((b, a))
    }

    /// The episode's two addresses while it lasts (for `show status` and the metrics).
    pub fn shared(&self, now: Duration) -> Option<(PeerAddr, PeerAddr)> {
        let last = self.moves.back()?.0;
        (now.saturating_sub(last) <= SHARED_KEY_WINDOW)
            .then_some(self.said)
            .flatten()
    }
}

/// A worker's cached view of the table, refreshed only when the generation moves.
pub struct TableCache {
    table: Arc<Table>,
}

impl TableCache {
    /// The current table; one atomic load when nothing changed.
    pub fn get<'a>(&'a mut self, dev: &Device) -> &'a Table {
        if self.table.generation != dev.generation.load(Ordering::Acquire) {
            self.table = dev.snapshot();
        }
        &self.table
    }
}

impl Device {
    /// An empty device; `index_rng` draws the local session indices of new peers (the
    /// gateway passes the OS random source, tests a seeded one).
    pub fn new(index_rng: Box<dyn RngCore + Send>) -> Device {
        Device {
            table: RwLock::new(Arc::new(Table {
                identity: None,
                peers: Vec::new(),
                by_key: HashMap::new(),
                by_index: HashMap::new(),
                routes: AllowedIps::new(),
                generation: 0,
            })),
            generation: AtomicU64::new(0),
            config: Mutex::new(Config::default()),
            mtu: AtomicU32::new(0),
            tick_ms: AtomicU64::new(0),
            tick_wall_ms: AtomicU64::new(0),
            index_rng: Mutex::new(index_rng),
            drops: DropCounters::default(),
            events: Mutex::new(EventQueue::default()),
        }
    }

    /// Queue a peer event for the driver (never under a peer lock: the queue's lock is
    /// taken alone).
    fn push_event(&self, key: Key, at: Duration, kind: PeerEventKind) {
        let mut q = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if q.queue.len() >= MAX_PENDING_EVENTS {
            q.dropped += 1;
            return;
        }
        q.queue.push_back(PeerEvent { key, at, kind });
    }

    /// The peer events since the last call, oldest first, and how many did not fit.
    pub fn take_events(&self) -> (Vec<PeerEvent>, u64) {
        let mut q = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let dropped = std::mem::take(&mut q.dropped);
        (q.queue.drain(..).collect(), dropped)
    }

    pub fn snapshot(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn cache(&self) -> TableCache {
        TableCache {
            table: self.snapshot(),
        }
    }

    /// The configuration the device runs (endpoints as last set, not as roamed).
    pub fn config(&self) -> Config {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Apply a whole configuration. Peers whose public key stays keep their sessions,
    /// counters and roamed endpoint unless the config changes the endpoint; a changed
    /// private key or preshared key restarts the affected sessions.
    ///
    /// Endpoints given as names must have been resolved by the caller (`Endpoint::Addr`);
    /// unresolved names are ignored here.
    ///
    /// New peers get random 24-bit local indexes (as kernel WireGuard and wireguard-go
    /// do), so a receiver index cannot be guessed from the number of peers.
    pub fn reconfigure(&self, new: &Config) -> Result<(), DeviceError> {
        let mut cfg_guard = self.config.lock().unwrap_or_else(|p| p.into_inner());
        let old_table = self.snapshot();
        let old_cfg = cfg_guard.clone();
        if new.peers.len() >= (INDEX_SPACE / 2) as usize {
            // Random picks stay cheap only while the index space is mostly free.
            return Err(DeviceError::TooManyPeers);
        }
        // Indexes of the old table stay reserved (kept peers keep theirs; a removed
        // peer's may still be in flight).
        let mut used: HashSet<u32> = old_table.by_index.keys().copied().collect();
        let mut index_rng = self.index_rng.lock().unwrap_or_else(|p| p.into_inner());
        let mut logs: Vec<String> = Vec::new();

        let identity = new.interface.private_key.filter(|k| !k.is_zero()).map(|k| {
            let private = x25519::StaticSecret::from(k.0);
            let public = x25519::PublicKey::from(&private);
            Identity {
                rate_limiter: Arc::new(RateLimiter::new(&public, HANDSHAKE_RATE_LIMIT)),
                private,
                public,
            }
        });
        let key_changed = old_cfg.interface.private_key != new.interface.private_key;
        let own_public = identity.as_ref().map(|i| Key(i.public.to_bytes()));

        let mut peers: Vec<Arc<Peer>> = Vec::with_capacity(new.peers.len());
        let mut by_key = HashMap::with_capacity(new.peers.len());
        let mut by_index = HashMap::with_capacity(new.peers.len());
        let mut routes = AllowedIps::new();

        for pc in &new.peers {
            if by_key.contains_key(&pc.public_key) || Some(pc.public_key) == own_public {
                // Duplicates and ourselves are rejected by validation before we get here;
                // skip rather than build an inconsistent table.
                continue;
            }
            let old_peer = old_table.peer_by_key(&pc.public_key);
            let old_pc = old_cfg.peers.iter().find(|p| p.public_key == pc.public_key);
            let cfg_endpoint = match &pc.endpoint {
                Some(Endpoint::Addr(a)) => Some(*a),
                _ => None,
            };
            let peer = match (old_peer, &identity) {
                (Some(op), Some(id))
                    if op.allowed_ips == pc.allowed_ips && op.tcp_port == pc.tcp_port =>
                {
                    // Same peer, same routing: update in place and keep the Arc so workers'
                    // in-flight references stay valid.
                    let mut st = op.lock();
                    update_peer_state(&mut st, pc, old_pc, cfg_endpoint, id, key_changed, op.index);
                    drop(st);
                    op.clone()
                }
                (Some(op), Some(id)) => {
                    // Routing changed: new Peer object (allowed IPs are immutable per Peer)
                    // carrying the old state across.
                    let mut st = op.lock();
                    update_peer_state(&mut st, pc, old_pc, cfg_endpoint, id, key_changed, op.index);
                    let moved =
                        std::mem::replace(&mut *st, placeholder_state(id, op.public_key, op.index));
                    drop(st);
                    Arc::new(Peer {
                        public_key: pc.public_key,
                        index: op.index,
                        allowed_ips: pc.allowed_ips.clone(),
                        tcp_port: pc.tcp_port,
                        lane: Lane::default(),
                        state: Mutex::new(moved),
                    })
                }
                (_, Some(id)) => {
                    let index = random_index(&mut **index_rng, &mut used);
                    let tunn = Tunn::new(
                        id.private.clone(),
                        x25519::PublicKey::from(pc.public_key.0),
                        pc.preshared_key.map(|k| k.0),
                        pc.persistent_keepalive.filter(|&k| k > 0),
                        index,
                        Some(id.rate_limiter.clone()),
                    );
                    logs.push(format!("peer {} added", short(&pc.public_key)));
                    Arc::new(Peer {
                        public_key: pc.public_key,
                        index,
                        allowed_ips: pc.allowed_ips.clone(),
                        tcp_port: pc.tcp_port,
                        lane: Lane::default(),
                        state: Mutex::new(PeerState {
                            endpoint: cfg_endpoint.map(PeerAddr::Udp),
                            preshared_key: pc.preshared_key,
                            persistent_keepalive: pc.persistent_keepalive.filter(|&k| k > 0),
                            ..PeerState::fresh(tunn)
                        }),
                    })
                }
                // Without a private key no peer can have a tunnel; keep none in the table
                // (the config still lists them, like wireguard-go's device that is down).
                (_, None) => continue,
            };
            let i = peers.len();
            by_key.insert(pc.public_key, i);
            by_index.insert(peer.index, i);
            for c in &pc.allowed_ips {
                routes.insert(*c, i);
            }
            peers.push(peer);
        }
        for op in old_table.peers() {
            if !by_key.contains_key(&op.public_key) {
                logs.push(format!("peer {} removed", short(&op.public_key)));
            }
        }

        let generation = self.generation.load(Ordering::Relaxed) + 1;
        let table = Table {
            identity,
            peers,
            by_key,
            by_index,
            routes,
            generation,
        };
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
        self.generation.store(generation, Ordering::Release);
        *cfg_guard = new.clone();
        if let Some(mtu) = new.interface.mtu {
            self.set_mtu(u32::from(mtu));
        }
        drop(cfg_guard);
        for l in logs {
            log::info!("{l}");
        }
        Ok(())
    }

    /// Tell the device the TUN's MTU (the cap for padding; 0 if unknown). Drivers call
    /// this when they learn it (config, or by reading the interface).
    pub fn set_mtu(&self, mtu: u32) {
        self.mtu.store(mtu, Ordering::Relaxed);
    }

    /// A packet read from the TUN: route it to its peer, pad, encrypt, send.
    ///
    /// `buf[..len]` is the packet; the bytes after it are the caller's room for the
    /// zero padding WireGuard asks for (a multiple of 16, never past the MTU), so padding
    /// costs no copy. With less room the packet goes out padded as far as the room allows.
    /// The ciphertext goes straight into the sink's send slot when it lends one.
    pub fn handle_tun_packet(
        &self,
        table: &Table,
        buf: &mut [u8],
        len: usize,
        scratch: &mut [u8],
        io: &mut impl Io,
    ) {
        self.tun_burst(table).packet(buf, len, scratch, io);
    }

    /// A burst of packets read from the TUN (the segments of one TSO super-packet):
    /// [`Self::handle_tun_packet`] for each, the peer's lock taken once for as long as
    /// consecutive packets go to the same peer. Drop it to let the lock go.
    pub fn tun_burst<'t>(&'t self, table: &'t Table) -> TunBurst<'t> {
        TunBurst {
            dev: self,
            table,
            held: None,
        }
    }

    /// Pad, encrypt and send `buf[..len]` under the peer's lock (`st`).
    fn seal(
        &self,
        st: &mut PeerState,
        buf: &mut [u8],
        len: usize,
        scratch: &mut [u8],
        io: &mut impl Io,
    ) {
        let padded = padded_len(len, self.mtu.load(Ordering::Relaxed) as usize).min(buf.len());
        buf[len..padded].fill(0);
        let src = &buf[..padded];
        let Some(ep) = st.endpoint else {
            // No endpoint: boringtun still queues the packet for when a handshake makes
            // one known; nothing goes out now.
            let _ = st.tunn.encapsulate(src, scratch);
            DropCounters::bump(&self.drops.no_endpoint);
            return;
        };
        let expected = padded + 32;
        if let Some(slot) = io.send_slot(ep, expected, expected.max(HANDSHAKE_INIT_LEN)) {
            let written = match st.tunn.encapsulate(src, slot) {
                TunnResult::WriteToNetwork(d) => Some((d.first().copied(), d.len())),
                TunnResult::Err(_) => {
                    DropCounters::bump(&self.drops.encapsulate);
                    None
                }
                _ => None,
            };
            if let Some((kind, n)) = written {
                note_sent(st, self.device_now(), ep, kind, n);
                io.send_commit(ep, n);
            }
            return;
        }
        match st.tunn.encapsulate(src, scratch) {
            TunnResult::WriteToNetwork(d) => send_counted(st, self.device_now(), ep, d, io),
            TunnResult::Err(_) => DropCounters::bump(&self.drops.encapsulate),
            _ => {}
        }
    }

    /// A datagram (or TCP-framed message) from the network. Returns whether it
    /// authenticated (see [`classify`]): only then may the caller treat the sender as the
    /// peer (e.g. reset a TCP connection's idle timer).
    pub fn handle_datagram(
        &self,
        table: &Table,
        from: PeerAddr,
        datagram: &[u8],
        scratch: &mut [u8],
        io: &mut impl Io,
    ) -> bool {
        let Some(id) = &table.identity else {
            DropCounters::bump(&self.drops.unknown_peer);
            return false;
        };
        let kind = datagram.first().copied().unwrap_or(0);
        // Initiations are rate-limited (and answered with cookies under load) before the
        // DH that finds their peer; the other handshake messages are checked by the same
        // limiter inside the peer's Tunn.
        let peer = if kind == MSG_INIT {
            let packet = match id
                .rate_limiter
                .verify_packet(Some(from.ip()), datagram, scratch)
            {
                Ok(p) => p,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    DropCounters::bump(&self.drops.cookies_sent);
                    io.send(from, cookie);
                    log::debug!(target: "net::cookie", "cookie reply sent to {from}");
                    return false;
                }
                Err(_) => {
                    DropCounters::bump(&self.drops.malformed);
                    return false;
                }
            };
            let Packet::HandshakeInit(ref p) = packet else {
                DropCounters::bump(&self.drops.malformed);
                return false;
            };
            match parse_handshake_anon(&id.private, &id.public, p) {
                Ok(half) => match table.peer_by_key(&Key(half.peer_static_public)) {
                    Some(peer) => peer,
                    None => {
                        DropCounters::bump(&self.drops.unknown_peer);
                        return false;
                    }
                },
                Err(_) => {
                    DropCounters::bump(&self.drops.rejected);
                    return false;
                }
            }
        } else {
            let receiver = match Tunn::parse_incoming_packet(datagram) {
                Ok(Packet::HandshakeResponse(p)) => p.receiver_idx,
                Ok(Packet::PacketCookieReply(p)) => p.receiver_idx,
                Ok(Packet::PacketData(p)) => p.receiver_idx,
                Ok(Packet::HandshakeInit(_)) | Err(_) => {
                    DropCounters::bump(&self.drops.malformed);
                    return false;
                }
            };
            match table.peer_by_receiver(receiver) {
                Some(peer) => peer,
                None => {
                    DropCounters::bump(&self.drops.unknown_index);
                    return false;
                }
            }
        };

        let mut st = peer.lock();
        let verdict = self.open(table, peer, &mut st, from, kind, datagram, scratch, io);
        if !verdict.authenticated() {
            return false;
        }
        self.authenticated(peer, st, from, verdict, datagram.len(), 1, scratch, io);
        true
    }

    /// The peer a data message is for (by its receiver index), if any: what a worker
    /// asks before it hands a train of them to the peer's [`Peer::lane`].
    pub fn data_peer<'t>(&self, table: &'t Table, datagram: &[u8]) -> Option<&'t Arc<Peer>> {
        table.peer_by_receiver(data_receiver(datagram)?)
    }

    /// Whether `datagram` is a data message for `peer` (its receiver index names it, as
    /// the table's index map does): the rest of a train after [`Self::data_peer`]
    /// found the first one's, without a lookup each.
    pub fn is_data_for(peer: &Peer, datagram: &[u8]) -> bool {
        data_receiver(datagram).is_some_and(|r| r >> 8 == peer.index)
    }

    /// The data messages of one received train for `peer` (see [`Self::data_peer`]),
    /// opened under ONE lock of the peer: workers contend per train (up to 64 KiB), not
    /// per packet. A message of another kind or for another receiver is dropped and
    /// counted (the caller cut the train by receiver). Returns how many authenticated;
    /// the bookkeeping of [`Self::handle_datagram`] (counters, roaming, queued packets)
    /// happens once for them all.
    pub fn handle_data_train<'d>(
        &self,
        table: &Table,
        peer: &Arc<Peer>,
        from: PeerAddr,
        datagrams: impl Iterator<Item = &'d [u8]>,
        scratch: &mut [u8],
        io: &mut impl Io,
    ) -> usize {
        let mut st = peer.lock();
        let (mut ok, mut bytes, mut keepalives_only) = (0usize, 0usize, true);
        for d in datagrams {
            if !Self::is_data_for(peer, d) {
                DropCounters::bump(&self.drops.unknown_index);
                continue;
            }
            let verdict = self.open(table, peer, &mut st, from, MSG_DATA, d, scratch, io);
            if verdict.authenticated() {
                ok += 1;
                bytes += d.len();
                keepalives_only &= verdict == MessageOutcome::Data { keepalive: true };
            }
        }
        if ok > 0 {
            let verdict = MessageOutcome::Data {
                keepalive: keepalives_only,
            };
            self.authenticated(peer, st, from, verdict, bytes, ok, scratch, io);
        }
        ok
    }

    /// Open one message under the peer's lock: a data packet straight into the sink's
    /// TUN slot when it lends one, anything else through `scratch`. The verdict.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        table: &Table,
        peer: &Arc<Peer>,
        st: &mut PeerState,
        from: PeerAddr,
        kind: u8,
        datagram: &[u8],
        scratch: &mut [u8],
        io: &mut impl Io,
    ) -> MessageOutcome {
        if kind == MSG_DATA {
            if let Some(slot) = io.tun_slot(datagram.len()) {
                let r = st.tunn.decapsulate(Some(from.ip()), datagram, slot);
                let verdict = classify(kind, &r);
                let packet = match r {
                    TunnResult::WriteToTunnelV4(p, s) => Some((p.len(), IpAddr::V4(s))),
                    TunnResult::WriteToTunnelV6(p, s) => Some((p.len(), IpAddr::V6(s))),
                    _ => None,
                };
                if !verdict.authenticated() {
                    DropCounters::bump(&self.drops.rejected);
                } else if let Some((n, src)) = packet.filter(|&(n, _)| n > 0) {
                    if self.source_allowed(table, peer, src) {
                        io.tun_commit(n);
                    }
                }
                return verdict;
            }
        }
        self.decapsulate_to_scratch(table, peer, st, from, kind, datagram, scratch, io)
    }

    /// Decapsulate into `scratch` and act on the result (send, deliver); the verdict.
    #[allow(clippy::too_many_arguments)]
    fn decapsulate_to_scratch(
        &self,
        table: &Table,
        peer: &Arc<Peer>,
        st: &mut PeerState,
        from: PeerAddr,
        kind: u8,
        datagram: &[u8],
        scratch: &mut [u8],
        io: &mut impl Io,
    ) -> MessageOutcome {
        let result = st.tunn.decapsulate(Some(from.ip()), datagram, scratch);
        let verdict = classify(kind, &result);
        match result {
            TunnResult::WriteToNetwork(d) if verdict == MessageOutcome::CookieSent => {
                // Not the peer's packet: the sender gets the cookie, the peer's
                // counters and endpoint stay.
                DropCounters::bump(&self.drops.cookies_sent);
                io.send(from, d);
            }
            TunnResult::WriteToNetwork(d) if verdict.authenticated() => {
                send_counted(st, self.device_now(), from, d, io);
            }
            TunnResult::WriteToTunnelV4(p, src) if verdict.authenticated() => {
                self.deliver(table, peer, IpAddr::V4(src), p, io);
            }
            TunnResult::WriteToTunnelV6(p, src) if verdict.authenticated() => {
                self.deliver(table, peer, IpAddr::V6(src), p, io);
            }
            TunnResult::Done if verdict.authenticated() => {}
            TunnResult::Done if verdict == MessageOutcome::CookieReceived => {}
            _ => DropCounters::bump(&self.drops.rejected),
        }
        verdict
    }

    /// Bookkeeping after an authenticated message: counters, keepalive debt, roaming,
    /// queued packets; logs after the peer lock is released.
    #[allow(clippy::too_many_arguments)]
    fn authenticated(
        &self,
        peer: &Arc<Peer>,
        mut st: MutexGuard<'_, PeerState>,
        from: PeerAddr,
        verdict: MessageOutcome,
        n: usize,
        packets: usize,
        scratch: &mut [u8],
        io: &mut impl Io,
    ) {
        let mut note = None;
        let mut shared = None;
        let mut quiet = false;
        let now = self.device_now();
        st.rx_bytes += n as u64;
        st.rx_packets += packets as u64;
        st.last_heard = Some(now);
        st.unanswered_since = None;
        st.events.authenticated_rx[tidx(&from)] += packets as u64;
        match verdict {
            MessageOutcome::HandshakeCompleted => {
                st.events.handshakes_answered[tidx(&from)] += 1;
                st.last_handshake = Some(now);
                st.initiating = false;
                note = Some(Note::HandshakeCompleted);
            }
            MessageOutcome::HandshakeAnswered => {
                // Answering the peer's initiation replaces ours.
                st.last_handshake = Some(now);
                st.initiating = false;
            }
            MessageOutcome::Data { keepalive: false } if st.keepalive_owed_since.is_none() => {
                st.keepalive_owed_since = Some(now);
            }
            _ => {}
        }
        // Roaming: the latest authenticated packet decides where the peer is.
        if st.endpoint != Some(from) {
            let old = st.endpoint.replace(from);
            if old.map(|o| o.socket_addr() != from.socket_addr() || o.is_tcp() != from.is_tcp())
                != Some(false)
            {
                if old.is_some() {
                    st.endpoint_changes += 1;
                }
                note = Some(Note::Roamed { old, new: from });
                shared = st.roams.moved(now, from);
                quiet = shared.is_none() && st.roams.shared(now).is_some();
            }
        }
        // Packets queued while the handshake was pending go out now.
        while let TunnResult::WriteToNetwork(d) = st.tunn.decapsulate(None, &[], scratch) {
            send_counted(&mut st, now, from, d, io);
        }
        drop(st);
        // While two devices take turns, their moves are one event, said once.
        if let (Some(Note::Roamed { old, new }), false) = (&note, quiet) {
            self.push_event(
                peer.public_key,
                now,
                PeerEventKind::EndpointChanged {
                    old: *old,
                    new: *new,
                },
            );
        }
        if let Some((a, b)) = shared {
            self.push_event(peer.public_key, now, PeerEventKind::SharedKey { a, b });
        }
        // Logged after the peer lock is released; targets under `net::` are rate-limited
        // by the logger (the network decides how often these happen).
        match note {
            Some(Note::Roamed {
                old: Some(old),
                new,
            }) => log::info!(
                target: "net::roam",
                "peer {} endpoint changed {old} -> {new}",
                short(&peer.public_key)
            ),
            Some(Note::Roamed { old: None, new }) => log::info!(
                target: "net::roam",
                "peer {} endpoint {new}",
                short(&peer.public_key)
            ),
            Some(Note::HandshakeCompleted) => log::info!(
                target: "net::handshake",
                "peer {} handshake completed (we initiated)",
                short(&peer.public_key)
            ),
            None => {}
        }
    }

    /// Cryptokey routing on the way in: the inner source must belong to this peer.
    fn source_allowed(&self, table: &Table, peer: &Arc<Peer>, src: IpAddr) -> bool {
        let ok = table.route(src).is_some_and(|p| Arc::ptr_eq(p, peer));
        if !ok {
            DropCounters::bump(&self.drops.not_allowed_src);
        }
        ok
    }

    fn deliver(
        &self,
        table: &Table,
        peer: &Arc<Peer>,
        src: IpAddr,
        packet: &[u8],
        io: &mut impl Io,
    ) {
        if packet.is_empty() {
            return; // keepalive
        }
        if self.source_allowed(table, peer, src) {
            io.tun_write(packet);
        }
    }

    /// Drive every peer's timers: retransmit handshakes, rekey, keepalives. Call a few
    /// times a second (boringtun's timers have one-second granularity). `now` is a
    /// monotonic time (any origin, never going back); it times the passive keepalive.
    /// `wall` is the wall-clock time at `now`, which dates handshakes for `peer_stats`.
    pub fn update_timers(
        &self,
        now: Duration,
        wall: SystemTime,
        scratch: &mut [u8],
        io: &mut impl Io,
    ) {
        self.tick_ms
            .store(now.as_millis() as u64, Ordering::Relaxed);
        let wall_ms = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.tick_wall_ms.store(wall_ms, Ordering::Relaxed);
        let table = self.snapshot();
        if let Some(id) = &table.identity {
            id.rate_limiter.reset_count();
        }
        let mut established_now = Vec::new();
        let mut expired_now = Vec::new();
        for peer in table.peers() {
            let mut st = peer.lock();
            let endpoint = st.endpoint;
            let result = if st.hold_timers(now) {
                TunnResult::Done
            } else {
                st.tunn.update_timers(scratch)
            };
            match result {
                TunnResult::WriteToNetwork(d) => {
                    if let Some(ep) = endpoint {
                        send_counted(&mut st, now, ep, d, io);
                    }
                }
                TunnResult::Err(WireGuardError::ConnectionExpired) => {
                    if st.initiating {
                        st.handshake_failures += 1;
                    }
                    st.initiating = false
                }
                TunnResult::Err(_) => DropCounters::bump(&self.drops.timers),
                _ => {}
            }
            let session_age = st.tunn.time_since_last_handshake();
            if let (true, Some(ep), Some(_)) = (st.handshake_overdue(now), endpoint, session_age) {
                if let TunnResult::WriteToNetwork(d) =
                    st.tunn.format_handshake_initiation(scratch, false)
                {
                    send_counted(&mut st, now, ep, d, io);
                }
                st.unanswered_since = None;
            }
            // The passive keepalive boringtun may have missed (see keepalive_owed_since).
            if let (Some(since), Some(ep), Some(age)) =
                (st.keepalive_owed_since, endpoint, session_age)
            {
                if now.saturating_sub(since) >= KEEPALIVE_TIMEOUT && age < SESSION_USABLE {
                    if let TunnResult::WriteToNetwork(d) = st.tunn.encapsulate(&[], scratch) {
                        send_counted(&mut st, now, ep, d, io);
                    }
                }
            }
            let established = session_age.is_some();
            if established != st.had_session {
                st.had_session = established;
                if established {
                    established_now.push(peer.public_key);
                } else {
                    expired_now.push(peer.public_key);
                }
            }
            if let Some(age) = session_age {
                // Keep the handshake time in step with boringtun's view.
                st.last_handshake = Some(now.saturating_sub(age));
            }
        }
        for k in established_now {
            self.push_event(k, now, PeerEventKind::SessionEstablished);
        }
        for k in expired_now {
            self.push_event(k, now, PeerEventKind::SessionExpired);
        }
    }

    /// Start a handshake with every peer that has an endpoint and a persistent
    /// keepalive (as wireguard-go does when the interface comes up).
    pub fn initiate_keepalive_peers(&self, scratch: &mut [u8], io: &mut impl Io) {
        let table = self.snapshot();
        for peer in table.peers() {
            let mut st = peer.lock();
            if let (Some(ep), Some(_)) = (st.endpoint, st.persistent_keepalive) {
                if let TunnResult::WriteToNetwork(d) =
                    st.tunn.format_handshake_initiation(scratch, false)
                {
                    send_counted(&mut st, self.device_now(), ep, d, io);
                }
            }
        }
    }

    /// Point a peer at `to` (the TCP-fallback client switching transports).
    pub fn set_endpoint(&self, key: &Key, to: PeerAddr) {
        if let Some(p) = self.snapshot().peer_by_key(key) {
            let mut st = p.lock();
            let old = st.endpoint.replace(to);
            if old.is_some() && old != Some(to) {
                st.endpoint_changes += 1;
            }
            drop(st);
            if old != Some(to) {
                self.push_event(
                    *key,
                    self.device_now(),
                    PeerEventKind::EndpointChanged { old, new: to },
                );
                let old = old.map(|e| e.to_string());
                log::info!(
                    "peer {} endpoint {} -> {to}",
                    short(key),
                    old.as_deref().unwrap_or("(none)")
                );
            }
        }
    }

    /// Send a fresh handshake initiation to `to` now (a fallback probe, or the first
    /// handshake over a new TCP connection), whatever handshake is in progress.
    pub fn force_handshake(&self, key: &Key, to: PeerAddr, scratch: &mut [u8], io: &mut impl Io) {
        if let Some(p) = self.snapshot().peer_by_key(key) {
            let mut st = p.lock();
            if let TunnResult::WriteToNetwork(d) =
                st.tunn.format_handshake_initiation(scratch, true)
            {
                send_counted(&mut st, self.device_now(), to, d, io);
            }
        }
    }

    /// The transport event counters and current endpoint of one peer.
    pub fn peer_events(&self, key: &Key) -> Option<(TransportEvents, Option<PeerAddr>)> {
        let t = self.snapshot();
        let p = t.peer_by_key(key)?;
        let st = p.lock();
        Some((st.events, st.endpoint))
    }

    /// The device's monotonic time: the `now` of the last `update_timers` (a tick old at
    /// most).
    fn device_now(&self) -> Duration {
        Duration::from_millis(self.tick_ms.load(Ordering::Relaxed))
    }

    /// Per-peer figures for `wg show` and the console.
    pub fn peer_stats(&self) -> Vec<PeerStats> {
        let table = self.snapshot();
        // Both from the same tick, so a handshake's date does not move between calls.
        let dev_now = self.device_now();
        let wall_now = SystemTime::UNIX_EPOCH
            + Duration::from_millis(self.tick_wall_ms.load(Ordering::Relaxed));
        let names: HashMap<Key, String> = self
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peers
            .iter()
            .filter_map(|p| Some((p.public_key, p.name.clone()?)))
            .collect();
        table
            .peers()
            .iter()
            .map(|p| {
                let st = p.lock();
                PeerStats {
                    name: names.get(&p.public_key).cloned(),
                    rx_packets: st.rx_packets,
                    tx_packets: st.tx_packets,
                    handshake_attempts: st.events.handshakes_sent.iter().sum(),
                    handshake_failures: st.handshake_failures,
                    endpoint_changes: st.endpoint_changes,
                    last_rx_age: st.last_heard.map(|h| dev_now.saturating_sub(h)),
                    health: Health::judge(
                        dev_now,
                        st.last_handshake,
                        st.last_heard,
                        st.persistent_keepalive,
                        st.wants_to_send(dev_now),
                    ),
                    shared_key: st.roams.shared(dev_now),
                    public_key: p.public_key,
                    preshared_key: st.preshared_key,
                    endpoint: st.endpoint,
                    last_handshake: st
                        .last_handshake
                        .and_then(|t| wall_now.checked_sub(dev_now.saturating_sub(t))),
                    tx_bytes: st.tx_bytes,
                    rx_bytes: st.rx_bytes,
                    persistent_keepalive: st.persistent_keepalive,
                    allowed_ips: p.allowed_ips.clone(),
                    session_age: st.tunn.time_since_last_handshake(),
                }
            })
            .collect()
    }
}

/// A snapshot of one peer's state.
#[derive(Clone, Debug)]
pub struct PeerStats {
    pub public_key: Key,
    /// The peer's `Name` in the running configuration.
    pub name: Option<String>,
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Handshake initiations sent (UDP and TCP).
    pub handshake_attempts: u64,
    pub handshake_failures: u64,
    pub endpoint_changes: u64,
    /// Since the last authenticated packet from the peer (none: never heard).
    pub last_rx_age: Option<Duration>,
    pub health: Health,
    /// Two devices on this key: the two addresses its endpoint flips between.
    pub shared_key: Option<(PeerAddr, PeerAddr)>,
    pub preshared_key: Option<Key>,
    pub endpoint: Option<PeerAddr>,
    pub last_handshake: Option<SystemTime>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub persistent_keepalive: Option<u16>,
    pub allowed_ips: Vec<Cidr>,
    pub session_age: Option<Duration>,
}

fn update_peer_state(
    st: &mut PeerState,
    pc: &crate::config::PeerConfig,
    old_pc: Option<&crate::config::PeerConfig>,
    cfg_endpoint: Option<SocketAddr>,
    id: &Identity,
    key_changed: bool,
    index: u32,
) {
    let ka = pc.persistent_keepalive.filter(|&k| k > 0);
    if st.preshared_key != pc.preshared_key || st.persistent_keepalive != ka {
        // boringtun fixes both at construction: a new Tunn (new session) is the only way.
        st.tunn = Tunn::new(
            id.private.clone(),
            x25519::PublicKey::from(pc.public_key.0),
            pc.preshared_key.map(|k| k.0),
            ka,
            index,
            Some(id.rate_limiter.clone()),
        );
        st.preshared_key = pc.preshared_key;
        st.persistent_keepalive = ka;
    } else if key_changed {
        st.tunn
            .set_static_private(id.private.clone(), id.public, Some(id.rate_limiter.clone()));
    }
    // A configured endpoint that changed wins over a roamed one; an unchanged config
    // endpoint leaves the roamed address alone.
    let old_ep = old_pc.and_then(|p| match &p.endpoint {
        Some(Endpoint::Addr(a)) => Some(*a),
        _ => None,
    });
    if cfg_endpoint.is_some() && cfg_endpoint != old_ep {
        st.endpoint = cfg_endpoint.map(PeerAddr::Udp);
    }
}

fn placeholder_state(id: &Identity, public: Key, index: u32) -> PeerState {
    PeerState::fresh(Tunn::new(
        id.private.clone(),
        x25519::PublicKey::from(public.0),
        None,
        None,
        index,
        Some(id.rate_limiter.clone()),
    ))
}

/// Why a log line is due after a peer's lock is released.
enum Note {
    Roamed {
        old: Option<PeerAddr>,
        new: PeerAddr,
    },
    HandshakeCompleted,
}

/// A session older than this cannot carry a keepalive (REJECT_AFTER_TIME).
const SESSION_USABLE: Duration = Duration::from_secs(180);

/// Largest plaintext padded through a copy in scratch (kernel TUN MTUs are below this;
/// larger packets go unpadded, as the kernel leaves GSO packets).
const MAX_PAD_SOURCE: usize = 16 * 1024;

/// WireGuard's padding: round the plaintext up to a multiple of 16, but never past the
/// MTU (kernel `calculate_skb_padding`). With the MTU unknown (0) nothing is padded: a
/// full-sized packet padded past the path MTU would fragment.
fn padded_len(len: usize, mtu: usize) -> usize {
    if len == 0 || len > MAX_PAD_SOURCE || len >= mtu {
        return len;
    }
    (len.div_ceil(16) * 16).min(mtu)
}

/// A random local index in 1..2^24 not in `used`; it is added to `used`.
fn random_index(rng: &mut dyn RngCore, used: &mut HashSet<u32>) -> u32 {
    loop {
        let i = rng.next_u32() % INDEX_SPACE;
        if i != 0 && used.insert(i) {
            return i;
        }
    }
}

/// A short, log-friendly form of a public key.
pub fn short(k: &Key) -> String {
    let b = k.to_base64();
    b[..8].to_string()
}

#[cfg(test)]
mod health_tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// The rule, case by case (device times in seconds).
    #[test]
    fn health_rule() {
        use Health::*;
        // (now, last handshake, last heard, keepalive, traffic to send) → health
        let cases = [
            (1000, None, None, None, true, Never),
            (1000, None, Some(999), Some(25), false, Never),
            (1000, Some(900), Some(900), None, false, Up),
            (1000, Some(900), Some(980), Some(25), false, Up),
            (1000, Some(900), Some(973), Some(25), false, Up), // 27 s: within the slack
            (1000, Some(900), Some(960), Some(25), false, Idle), // a keepalive missed
            (1000, Some(810), Some(810), None, true, Stale),
            (1000, Some(810), Some(810), None, false, Idle),
            (1000, Some(820), Some(820), None, true, Up), // 180 s exactly
        ];
        for (now, hs, heard, ka, send, want) in cases {
            assert_eq!(
                Health::judge(S(now), hs.map(S), heard.map(S), ka, send),
                want,
                "{now} {hs:?} {heard:?} {ka:?} {send}"
            );
        }
    }

    /// Moves alternate between two addresses six times within ten minutes: said once.
    /// Three addresses in turn, or moves spread wider than the window, are not two devices.
    #[test]
    fn roam_history_rule() {
        let a = PeerAddr::Udp("192.0.2.1:1".parse().unwrap());
        let b = PeerAddr::Udp("192.0.2.1:2".parse().unwrap());
        let c = PeerAddr::Udp("198.51.100.1:1".parse().unwrap());
        let run = |moves: &[(u64, PeerAddr)]| {
            let mut h = RoamHistory::default();
            moves
                .iter()
                .filter_map(|&(t, to)| h.moved(S(t), to))
                .collect::<Vec<_>>()
        };
        let flips: Vec<_> = (0..8)
            .map(|i| (i * 5, if i % 2 == 0 { b } else { a }))
            .collect();
        assert_eq!(run(&flips), vec![(b, a)]);
        assert_eq!(run(&flips[..5]), vec![], "five moves");
        let three: Vec<_> = (0..9).map(|i| (i * 5, [a, b, c][i as usize % 3])).collect();
        assert!(run(&three).is_empty());
        let slow: Vec<_> = (0..8)
            .map(|i| (i * 130, if i % 2 == 0 { b } else { a }))
            .collect();
        assert!(run(&slow).is_empty(), "six moves over 650 s");
        // A second episode after a quiet window is said again.
        let mut again = flips.clone();
        again.extend(flips.iter().map(|&(t, x)| (t + 1000, x)));
        assert_eq!(run(&again).len(), 2);
    }
}
