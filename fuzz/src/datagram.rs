//! The gateway's network input under attack: the fuzz input is a script of operations
//! on a gateway device `G` and a real second device `P` (its peer, in memory):
//! genuine traffic from `P` (handshakes, data, keepalives) delivered in order, late,
//! or from other addresses; replays of anything captured on the wire; captured
//! messages mutated (with mac1 recomputed, so they pass the limiter and reach the
//! noise code); handshake messages forged with a valid mac1 over captured or guessed
//! indexes; cookie replies forged correctly (anyone who knows a peer's public key and
//! saw our handshake's mac1 can); floods that put the device under load (cookies);
//! raw bytes; timer ticks. `G` has a second peer `Q` whose key nobody holds.
//!
//! Checked on every message into `G` (`handle_datagram` says whether it authenticated):
//! - not authenticated: no peer's endpoint, rx bytes, last handshake or transport
//!   counters moved, nothing reached the TUN, and at most one cookie reply went back,
//!   to the sender only;
//! - authenticated: it is a message `P` really sent (nothing forged or mutated ever
//!   authenticates — up to what the protocol leaves unauthenticated: a handshake
//!   message's sender index and macs, see [`authenticated_part`]), of a type that
//!   proves keys (initiation, response, data), authenticating for the first time (no
//!   replay), only `P` changed, `P` is now at the sender's address, and whatever `G`
//!   sent in answer went there;
//! - every packet `G` writes to its TUN is one `P` sent from an address `P` owns.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use blake2::digest::consts::U16;
use blake2::digest::{Digest, Mac};
use blake2::{Blake2s256, Blake2sMac};
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305};

use riceguard::core::config::{Config, Endpoint, PeerConfig};
use riceguard::core::device::{Device, Io, PeerAddr, TransportEvents, SCRATCH_SIZE};
use riceguard::core::key::Key;

use crate::Bytes;

/// Most operations one input runs (a flood counts as one).
const MAX_OPS: usize = 64;

#[derive(Default)]
struct Wire {
    sent: Vec<(PeerAddr, Vec<u8>)>,
    tun: Vec<Vec<u8>>,
}

impl Io for Wire {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        assert!(
            !d.is_empty() && d.len() <= SCRATCH_SIZE,
            "send of {} bytes",
            d.len()
        );
        self.sent.push((to, d.to_vec()));
    }
    fn tun_write(&mut self, p: &[u8]) {
        self.tun.push(p.to_vec());
    }
}

/// What must not move on unauthenticated input, per peer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Watched {
    endpoint: Option<PeerAddr>,
    rx_bytes: u64,
    last_handshake: Option<SystemTime>,
    events: TransportEvents,
}

fn udp(s: &str) -> SocketAddr {
    s.parse().expect("address literal")
}

fn hash(a: &[u8], b: &[u8]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    Digest::update(&mut h, a);
    Digest::update(&mut h, b);
    h.finalize().into()
}

fn mac16(key: &[u8], data: &[u8]) -> [u8; 16] {
    let mut m = <Blake2sMac<U16> as blake2::digest::KeyInit>::new_from_slice(key)
        .expect("32-byte blake2s key");
    Mac::update(&mut m, data);
    m.finalize().into_bytes().into()
}

/// Offset of mac1 in a handshake message of this type (and its full length).
fn mac1_at(kind: u8) -> Option<(usize, usize)> {
    match kind {
        1 => Some((116, 148)),
        2 => Some((60, 92)),
        _ => None,
    }
}

/// Recompute mac1 as the receiver `to_pub` checks it (the msg must have its full length).
fn fix_mac1(msg: &mut [u8], to_pub: &Key) {
    let Some((at, len)) = msg.first().and_then(|&k| mac1_at(k)) else {
        return;
    };
    if msg.len() != len {
        return;
    }
    let key = hash(b"mac1----", &to_pub.0);
    let m = mac16(&key, &msg[..at]);
    msg[at..at + 16].copy_from_slice(&m);
}

/// A message with the fields nothing authenticates blanked: a handshake message's
/// sender index and macs (mac1 anyone can compute from a public key; mac2 is only
/// checked under load, and only ties the message to a source address). WireGuard's
/// handshake hash does not cover the sender index, so a captured initiation or
/// response that was not yet accepted is still accepted with another index: the same
/// handshake, as far as authentication goes.
fn authenticated_part(m: &[u8]) -> Vec<u8> {
    let mut m = m.to_vec();
    if let Some((at, len)) = m.first().and_then(|&k| mac1_at(k)) {
        if m.len() == len {
            m[4..8].fill(0);
            m[at..].fill(0);
        }
    }
    m
}

fn le32(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn inner_packet(b: &mut Bytes<'_>) -> Vec<u8> {
    let spec = b.u8();
    let n = usize::from(b.u8() % 64);
    let mut p;
    if spec & 1 == 0 {
        let total = 20 + 8 + n;
        p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        // Source: P's own address, or one P does not own (Q's).
        p[12..16].copy_from_slice(&[10, 0, 0, if spec & 2 == 0 { 2 } else { 3 }]);
        p[16..20].copy_from_slice(&[10, 0, 0, 1]);
    } else {
        let total = 40 + 8 + n;
        p = vec![0u8; total];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        p[6] = 17;
        p[7] = 64;
        p[8] = 0xfd;
        p[23] = if spec & 2 == 0 { 2 } else { 9 };
        p[24] = 0xfd;
        p[39] = 1;
    }
    let hl = p.len() - n;
    p[hl - 8..hl - 6].copy_from_slice(&[0x30, 0x39]);
    p[hl - 4..hl - 2].copy_from_slice(&((8 + n) as u16).to_be_bytes());
    for (i, x) in p[hl..].iter_mut().enumerate() {
        *x = spec.wrapping_add(i as u8);
    }
    p
}

/// Whether an inner packet's source is one of P's allowed IPs at G.
fn from_p(p: &[u8]) -> bool {
    match p.first().map(|b| b >> 4) {
        Some(4) => p.get(12..16) == Some(&[10, 0, 0, 2][..]),
        Some(6) => {
            p.get(8) == Some(&0xfd)
                && p.get(9..16).is_some_and(|z| z.iter().all(|&x| x == 0))
                && p.get(16..24) == Some(&[0, 0, 0, 0, 0, 0, 0, 2][..])
        }
        _ => false,
    }
}

struct Sim {
    g: Device,
    p: Device,
    g_pub: Key,
    p_pub: Key,
    q_pub: Key,
    g_wire: Wire,
    p_wire: Wire,
    /// P's messages not yet delivered to G, in order.
    to_g: Vec<Vec<u8>>,
    /// G's messages for addresses P owns, not yet delivered.
    to_p: Vec<Vec<u8>>,
    /// Everything seen on the wire, with where it went.
    history: Vec<(PeerAddr, Vec<u8>)>,
    /// Every message P ever sent, as [`authenticated_part`].
    genuine: HashSet<Vec<u8>>,
    /// Messages that authenticated at G, as [`authenticated_part`].
    authenticated: HashSet<Vec<u8>>,
    /// Inner packets P was given to send.
    inner: HashSet<Vec<u8>>,
    /// Sender indexes seen on the wire: G's (what messages to G name as receiver) and P's.
    g_indexes: Vec<u32>,
    p_indexes: Vec<u32>,
    scratch: Vec<u8>,
    now: Duration,
    stats: Stats,
}

/// What one run reached (so tests can tell the checks are not vacuous).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    /// Messages into G that authenticated / did not.
    pub authenticated: usize,
    pub rejected: usize,
    /// Authenticated messages by type (1 initiation, 2 response, 4 data).
    pub by_type: [usize; 5],
    /// Packets G wrote to its TUN.
    pub tun: usize,
    /// Cookie replies G sent.
    pub cookies: usize,
}

const G_ADDR: &str = "192.0.2.1:51820";
const P_ADDR: &str = "192.0.2.2:51820";
const Q_ADDR: &str = "192.0.2.3:51820";

fn p_owned() -> [PeerAddr; 3] {
    [
        PeerAddr::Udp(udp(P_ADDR)),
        PeerAddr::Udp(udp("[2001:db8::2]:40000")),
        PeerAddr::Tcp {
            conn: 7,
            remote: udp("192.0.2.2:40001"),
        },
    ]
}

fn attacker() -> [PeerAddr; 3] {
    [
        PeerAddr::Udp(udp("198.51.100.1:4242")),
        PeerAddr::Udp(udp("[2001:db8:bad::1]:53")),
        PeerAddr::Tcp {
            conn: 9,
            remote: udp("198.51.100.9:443"),
        },
    ]
}

/// A sender address: mostly P's own ones for genuine traffic, attackers' otherwise;
/// `spoof` allows P's addresses for anything (source addresses are not proof).
fn pick_addr(sel: u8, genuine: bool) -> PeerAddr {
    let own = p_owned();
    let att = attacker();
    if genuine {
        match sel {
            0..=159 => own[0],
            160..=199 => own[1],
            200..=219 => own[2],
            x => att[usize::from(x) % 3],
        }
    } else {
        match sel % 8 {
            x @ 0..=2 => att[usize::from(x)],
            x @ 3..=5 => own[usize::from(x - 3)],
            _ => att[0],
        }
    }
}

impl Sim {
    fn new() -> Sim {
        // Public keys cost a scalar multiplication each, slow under the fuzzer's
        // instrumentation: once per process.
        static KEYS: OnceLock<[(Key, Key); 3]> = OnceLock::new();
        let [(gk, g_pub), (pk, p_pub), (_, q_pub)] = *KEYS.get_or_init(|| {
            [0x41, 0x42, 0x43].map(|b| {
                let k = Key([b; 32]);
                (k, k.public())
            })
        });
        let peer = |public_key: Key, ips: &[&str], ep: &str| PeerConfig {
            public_key,
            preshared_key: None,
            allowed_ips: ips
                .iter()
                .map(|s| s.parse().expect("CIDR literal"))
                .collect(),
            endpoint: Some(Endpoint::Addr(udp(ep))),
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        };
        let dev = |own: Key, peers: Vec<PeerConfig>| {
            let mut c = Config::default();
            c.interface.private_key = Some(own);
            c.peers = peers;
            let d = Device::new(Box::new(riceguard_core::testutil::Rng(0xf022)));
            d.reconfigure(&c).expect("fixed config");
            d
        };
        let g = dev(
            gk,
            vec![
                peer(p_pub, &["10.0.0.2/32", "fd00::2/128"], P_ADDR),
                peer(q_pub, &["10.0.0.3/32"], Q_ADDR),
            ],
        );
        let p = dev(pk, vec![peer(g_pub, &["10.0.0.0/24", "fd00::/64"], G_ADDR)]);
        Sim {
            g,
            p,
            g_pub,
            p_pub,
            q_pub,
            g_wire: Wire::default(),
            p_wire: Wire::default(),
            to_g: Vec::new(),
            to_p: Vec::new(),
            history: Vec::new(),
            genuine: HashSet::new(),
            authenticated: HashSet::new(),
            inner: HashSet::new(),
            g_indexes: Vec::new(),
            p_indexes: Vec::new(),
            scratch: vec![0u8; SCRATCH_SIZE],
            now: Duration::ZERO,
            stats: Stats::default(),
        }
    }

    fn watched(&self) -> Vec<Watched> {
        self.g
            .peer_stats()
            .into_iter()
            .map(|s| Watched {
                endpoint: s.endpoint,
                rx_bytes: s.rx_bytes,
                last_handshake: s.last_handshake,
                events: self
                    .g
                    .peer_events(&s.public_key)
                    .map(|e| e.0)
                    .unwrap_or_default(),
            })
            .collect()
    }

    fn learn_index(&mut self, m: &[u8], g: bool) {
        let list = if g {
            &mut self.g_indexes
        } else {
            &mut self.p_indexes
        };
        if matches!(m.first(), Some(1 | 2)) {
            if let Some(i) = le32(m, 4) {
                if !list.contains(&i) && list.len() < 64 {
                    list.push(i);
                }
            }
        }
    }

    /// Move what G sent (from `from_idx` on) onto the wire.
    fn route_g(&mut self, from_idx: usize) {
        let own = p_owned();
        let sent: Vec<_> = self.g_wire.sent.drain(from_idx..).collect();
        for (to, m) in sent {
            self.learn_index(&m, true);
            if own.contains(&to) {
                self.to_p.push(m.clone());
            }
            self.history.push((to, m));
        }
    }

    /// Move what P sent onto the wire (all of it is for G).
    fn route_p(&mut self) {
        let sent: Vec<_> = self.p_wire.sent.drain(..).collect();
        for (to, m) in sent {
            self.learn_index(&m, false);
            self.genuine.insert(authenticated_part(&m));
            self.to_g.push(m.clone());
            self.history.push((to, m));
        }
    }

    /// One message into G, with every check.
    fn g_recv(&mut self, from: PeerAddr, msg: &[u8]) -> bool {
        let before = self.watched();
        let tun0 = self.g_wire.tun.len();
        let sent0 = self.g_wire.sent.len();
        let table = self.g.snapshot();
        let ok = self
            .g
            .handle_datagram(&table, from, msg, &mut self.scratch, &mut self.g_wire);
        let after = self.watched();
        let sent = &self.g_wire.sent[sent0..];
        if ok {
            let core = authenticated_part(msg);
            assert!(
                self.genuine.contains(&core),
                "a message P never sent authenticated (from {from}): {msg:02x?}"
            );
            assert!(
                self.authenticated.insert(core),
                "a message authenticated twice (replayed from {from}): type {}",
                msg[0]
            );
            assert!(matches!(msg[0], 1 | 2 | 4), "type {} authenticated", msg[0]);
            assert_eq!(before[1], after[1], "Q changed on P's message");
            assert_eq!(
                after[0].endpoint,
                Some(from),
                "P is not where it last spoke"
            );
            assert!(
                after[0].rx_bytes > before[0].rx_bytes,
                "rx bytes did not grow"
            );
            assert!(
                sent.iter().all(|(to, _)| *to == from),
                "answer to an authenticated message went elsewhere: {sent:?}"
            );
        } else {
            assert_eq!(
                before,
                after,
                "unauthenticated message (type {:?}, {} bytes, from {from}) moved a peer",
                msg.first(),
                msg.len()
            );
            assert_eq!(
                self.g_wire.tun.len(),
                tun0,
                "unauthenticated input reached the TUN"
            );
            assert!(
                sent.len() <= 1,
                "unauthenticated input got {} answers",
                sent.len()
            );
            for (to, m) in sent {
                assert_eq!(*to, from, "unauthenticated input made G send elsewhere");
                assert_eq!((m[0], m.len()), (3, 64), "only a cookie reply may answer");
            }
        }
        for p in &self.g_wire.tun[tun0..] {
            assert!(self.inner.contains(p), "G wrote a packet P never sent");
            assert!(from_p(p), "G wrote a packet from outside P's allowed IPs");
        }
        if ok {
            self.stats.authenticated += 1;
            self.stats.by_type[usize::from(msg[0])] += 1;
        } else {
            self.stats.rejected += 1;
        }
        self.stats.tun += self.g_wire.tun.len() - tun0;
        self.stats.cookies += self.g_wire.sent[sent0..]
            .iter()
            .filter(|(_, m)| m[0] == 3)
            .count();
        self.g_wire.tun.truncate(tun0);
        self.route_g(sent0);
        ok
    }

    fn deliver_to_p(&mut self) {
        let msgs: Vec<_> = self.to_p.drain(..).collect();
        let table = self.p.snapshot();
        for m in msgs {
            self.p.handle_datagram(
                &table,
                PeerAddr::Udp(udp(G_ADDR)),
                &m,
                &mut self.scratch,
                &mut self.p_wire,
            );
        }
        self.p_wire.tun.clear();
        self.route_p();
    }

    fn captured(&self, sel: u8) -> Option<(PeerAddr, Vec<u8>)> {
        if self.history.is_empty() {
            return None;
        }
        // Recent messages are the interesting ones: index from the end.
        let i = self.history.len() - 1 - usize::from(sel) % self.history.len();
        self.history.get(i).cloned()
    }

    /// A receiver index for a message to G: mostly one of G's (seen on the wire), the
    /// newest first; sometimes P's, sometimes a guess.
    fn index(&self, sel: u8, b: &mut Bytes<'_>) -> u32 {
        let list = if sel & 0x80 == 0 {
            &self.g_indexes
        } else {
            &self.p_indexes
        };
        if sel < 0xf0 && !list.is_empty() {
            list[list.len() - 1 - usize::from(sel & 0x7f) % list.len()]
        } else {
            // A guess: small integers, or any.
            u32::from_le_bytes([
                b.u8(),
                b.u8(),
                b.u8(),
                if sel & 1 == 0 { 0 } else { b.u8() },
            ])
        }
    }

    /// The public key of whoever `to` is (for mac1 of forged messages *to G* it is
    /// G's; for cookie replies it is the peer G sent the handshake to).
    fn peer_pub_at(&self, to: &PeerAddr) -> Key {
        if to.socket_addr() == udp(Q_ADDR) {
            self.q_pub
        } else {
            self.p_pub
        }
    }

    fn mutate(&mut self, b: &mut Bytes<'_>) {
        let Some((_, mut m)) = self.captured(b.u8()) else {
            return;
        };
        for _ in 0..1 + b.u8() % 3 {
            let pos = usize::from(b.u8());
            match b.u8() % 8 {
                0 if !m.is_empty() => {
                    let i = pos % m.len();
                    m[i] ^= 1 << (b.u8() % 8);
                }
                1 if !m.is_empty() => {
                    let i = pos % m.len();
                    m[i] = b.u8();
                }
                2 => m.truncate(pos),
                3 => m.extend_from_slice(b.take(pos % 32)),
                4 if m.len() >= 8 => {
                    let i = self.index(b.u8(), b);
                    m[4..8].copy_from_slice(&i.to_le_bytes());
                }
                5 if !m.is_empty() => m[0] = 1 + b.u8() % 4,
                6 if m.len() >= 16 => {
                    // Data: another counter.
                    let c = u64::from(b.u8());
                    m[8..16].copy_from_slice(&c.to_le_bytes());
                }
                _ => {}
            }
        }
        if b.u8() & 1 == 0 {
            fix_mac1(&mut m, &self.g_pub);
        }
        let from = pick_addr(b.u8(), false);
        self.g_recv(from, &m);
    }

    fn forge_handshake(&mut self, b: &mut Bytes<'_>) -> Vec<u8> {
        let spec = b.u8();
        let kind = if spec & 1 == 0 { 2u8 } else { 1 };
        let (_, len) = mac1_at(kind).unwrap_or((60, 92));
        let mut m = vec![0u8; len];
        m[0] = kind;
        let sender = u32::from_le_bytes([b.u8(), b.u8(), b.u8(), 0]);
        m[4..8].copy_from_slice(&sender.to_le_bytes());
        let body_at = if kind == 2 {
            let r = self.index(b.u8(), b);
            m[8..12].copy_from_slice(&r.to_le_bytes());
            12
        } else {
            8
        };
        let fill = b.take(len - 32 - body_at).to_vec();
        m[body_at..body_at + fill.len()].copy_from_slice(&fill);
        fix_mac1(&mut m, &self.g_pub);
        if spec & 2 != 0 {
            let mac2 = b.take(16).to_vec();
            m[len - 16..len - 16 + mac2.len()].copy_from_slice(&mac2);
        }
        m
    }

    /// A cookie reply that decrypts: for the handshake message G sent most recently (or
    /// an older one), encrypted under the key of the peer it went to.
    fn forge_cookie(&mut self, b: &mut Bytes<'_>) -> Option<Vec<u8>> {
        let skip = usize::from(b.u8() % 4);
        let (to, hs) = self
            .history
            .iter()
            .rev()
            .filter(|(_, m)| {
                matches!(m.first(), Some(1 | 2)) && !self.genuine.contains(&authenticated_part(m))
            })
            .nth(skip)
            .cloned()?;
        let (at, len) = mac1_at(hs[0])?;
        if hs.len() != len {
            return None;
        }
        let key = hash(b"cookie--", &self.peer_pub_at(&to).0);
        let mut nonce = [0u8; 24];
        let n = b.take(24).to_vec();
        nonce[..n.len()].copy_from_slice(&n);
        let cookie = b.take(16).to_vec();
        let mut c16 = [0u8; 16];
        c16[..cookie.len()].copy_from_slice(&cookie);
        let enc = XChaCha20Poly1305::new_from_slice(&key)
            .expect("32-byte key")
            .encrypt(
                (&nonce).into(),
                Payload {
                    msg: &c16,
                    aad: &hs[at..at + 16],
                },
            )
            .expect("encrypt");
        let mut m = vec![3u8, 0, 0, 0];
        m.extend_from_slice(&hs[4..8]);
        m.extend_from_slice(&nonce);
        m.extend_from_slice(&enc);
        Some(m)
    }

    fn op(&mut self, b: &mut Bytes<'_>) {
        match b.u8() % 13 {
            0 | 1 => {
                let p = inner_packet(b);
                self.inner.insert(p.clone());
                let t = self.p.snapshot();
                self.p.handle_tun_packet(
                    &t,
                    &mut padded(&p),
                    p.len(),
                    &mut self.scratch,
                    &mut self.p_wire,
                );
                self.route_p();
            }
            2 | 3 => {
                if self.to_g.is_empty() {
                    return;
                }
                let sel = b.u8();
                let i = if sel < 200 {
                    0
                } else {
                    usize::from(sel) % self.to_g.len()
                };
                let m = self.to_g.remove(i);
                let from = pick_addr(b.u8(), true);
                self.g_recv(from, &m);
            }
            4 => self.deliver_to_p(),
            5 => {
                if let Some((_, m)) = self.captured(b.u8()) {
                    let from = pick_addr(b.u8(), false);
                    self.g_recv(from, &m);
                }
            }
            6 => self.mutate(b),
            7 => {
                let n = usize::from(b.u8());
                let m = b.take(n).to_vec();
                let from = pick_addr(b.u8(), false);
                self.g_recv(from, &m);
            }
            8 => {
                let m = self.forge_handshake(b);
                let from = pick_addr(b.u8(), false);
                self.g_recv(from, &m);
            }
            9 => {
                if let Some(m) = self.forge_cookie(b) {
                    let from = pick_addr(b.u8(), false);
                    self.g_recv(from, &m);
                }
            }
            10 => {
                // A flood of forged handshakes with valid mac1: past ~200 the device is
                // under load and answers with cookie replies.
                let n = usize::from(b.u8()) + if b.u8() >= 0x80 { 200 } else { 0 };
                let tmpl = self.forge_handshake(b);
                let from = pick_addr(b.u8(), false);
                for i in 0..n {
                    let mut m = tmpl.clone();
                    m[5..8].copy_from_slice(&(i as u32).to_le_bytes()[..3]);
                    fix_mac1(&mut m, &self.g_pub);
                    self.g_recv(from, &m);
                }
            }
            11 => {
                // Time passes: timers on both (resets the handshake limiter).
                self.now += Duration::from_millis(250 * u64::from(b.u8() % 16 + 1));
                let n0 = self.g_wire.sent.len();
                self.g.update_timers(
                    self.now,
                    wall(self.now),
                    &mut self.scratch,
                    &mut self.g_wire,
                );
                self.route_g(n0);
                self.p.update_timers(
                    self.now,
                    wall(self.now),
                    &mut self.scratch,
                    &mut self.p_wire,
                );
                self.route_p();
            }
            _ => match b.u8() % 4 {
                // G sends to P (or to Q, whom nobody answers).
                0 | 1 => {
                    let mut p = inner_packet(b);
                    if p[0] >> 4 == 4 {
                        p[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2 + b.u8() % 2]);
                    } else {
                        p.swap(23, 39);
                    }
                    let t = self.g.snapshot();
                    let n0 = self.g_wire.sent.len();
                    self.g.handle_tun_packet(
                        &t,
                        &mut padded(&p),
                        p.len(),
                        &mut self.scratch,
                        &mut self.g_wire,
                    );
                    self.route_g(n0);
                }
                // P starts a new handshake (e.g. with a cookie it got).
                2 => {
                    self.p.force_handshake(
                        &self.g_pub,
                        PeerAddr::Udp(udp(G_ADDR)),
                        &mut self.scratch,
                        &mut self.p_wire,
                    );
                    self.route_p();
                }
                // Anything from G's TUN.
                _ => {
                    let n = usize::from(b.u8()) * 2;
                    let p = b.take(n).to_vec();
                    let t = self.g.snapshot();
                    let n0 = self.g_wire.sent.len();
                    self.g.handle_tun_packet(
                        &t,
                        &mut padded(&p),
                        p.len(),
                        &mut self.scratch,
                        &mut self.g_wire,
                    );
                    self.route_g(n0);
                }
            },
        }
    }
}

pub fn check(data: &[u8]) {
    run(data);
}

pub(crate) fn run(data: &[u8]) -> Stats {
    let mut sim = Sim::new();
    let mut b = Bytes(data);
    let mut ops = 0;
    while !b.0.is_empty() && ops < MAX_OPS {
        sim.op(&mut b);
        ops += 1;
    }
    // Q's key is nobody's: nothing about Q ever moves.
    let q = &sim.watched()[1];
    assert_eq!(
        q.endpoint,
        Some(PeerAddr::Udp(udp(Q_ADDR))),
        "Q's endpoint moved"
    );
    assert_eq!((q.rx_bytes, q.last_handshake), (0, None), "Q authenticated");
    sim.stats
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Stats {
        let path = format!("{}/seeds/datagram/{name}", env!("CARGO_MANIFEST_DIR"));
        let data = std::fs::read(&path).expect("seed file");
        let s = run(&data);
        eprintln!("{name}: {s:?}");
        s
    }

    /// The seeds reach the paths the invariant is about: handshakes both ways, data
    /// (delivered and refused by source), cookies under load — so "unchanged unless
    /// authenticated" is checked against a peer that really does authenticate.
    #[test]
    fn seeds_reach_authenticated_paths() {
        let s = seed("handshake_data");
        assert!(
            s.by_type[1] >= 1 && s.by_type[4] >= 3 && s.tun >= 3,
            "{s:?}"
        );
        let s = seed("replay_mutate");
        assert!(s.authenticated >= 3 && s.rejected >= 6, "{s:?}");
        let s = seed("roam_tcp");
        assert!(s.by_type[4] >= 4 && s.tun >= 3, "{s:?}");
        let s = seed("flood_then_cookie");
        assert!(s.cookies >= 1, "{s:?}");
        assert!(s.by_type[1] >= 2, "handshake after the cookie: {s:?}");
        let s = seed("g_initiates_cookie");
        assert!(s.by_type[2] >= 1 && s.rejected >= 4, "{s:?}");
    }
}

/// How much of what cargo-fuzz found locally (corpus/datagram) authenticates:
/// `cargo test --release --no-default-features -- --ignored --nocapture corpus_reach`.
#[cfg(test)]
#[test]
#[ignore]
fn corpus_reach() {
    let dir = format!("{}/corpus/datagram", env!("CARGO_MANIFEST_DIR"));
    let (mut files, mut with_auth, mut total) = (0, 0, Stats::default());
    for e in std::fs::read_dir(dir).expect("corpus/datagram").flatten() {
        let s = run(&std::fs::read(e.path()).expect("read"));
        files += 1;
        with_auth += usize::from(s.authenticated > 0);
        total.authenticated += s.authenticated;
        total.rejected += s.rejected;
        total.tun += s.tun;
        total.cookies += s.cookies;
        for (t, n) in s.by_type.iter().enumerate() {
            total.by_type[t] += n;
        }
    }
    eprintln!("{files} inputs, {with_auth} with an authenticated message; totals {total:?}");
}

/// The packet with room after it for WireGuard's padding, as the drivers' buffers have.
fn padded(p: &[u8]) -> Vec<u8> {
    let mut b = p.to_vec();
    b.resize(p.len() + 16, 0);
    b
}

/// The wall-clock time the fuzzed device is told at `now` (any fixed origin).
fn wall(now: std::time::Duration) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30) + now
}
