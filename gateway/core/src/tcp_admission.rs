//! The TCP listener's admission and expiry policy, without sockets or clocks: which
//! inbound connection is admitted, refused or makes room by evicting another
//! ([`Admission`]), and when the timers close one ([`expiry`], time passed in).
//!
//! Invariants: unauthenticated inbound connections are limited per source prefix (/64
//! IPv6, /32 IPv4) and are the only ones ever evicted; `max_conns - reserved_outbound`
//! is all inbound may take, so an inbound flood never blocks our own connects; only
//! authenticated messages count as life.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

pub use crate::device::ConnId;

/// How long an inbound connection may stay unauthenticated. WireGuard retries an
/// unanswered handshake after REKEY_TIMEOUT (5 s) plus up to 1/3 s of jitter, and a
/// first initiation that meets a device under load gets only a cookie reply (which
/// proves nothing), so the retry carrying the cookie must still fit: 5.33 s, plus a
/// round trip, plus the moment a relay such as udp2tcp connects before the client
/// behind it speaks. Any longer only lets silent and slow-loris connections hold slots;
/// floods are bounded by the per-prefix limit and eviction, not by this.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(8);

/// The source a connection is counted against: the /64 of an IPv6 address (one
/// subscriber's allocation), the /32 of an IPv4 address (v4-mapped IPv6 included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourcePrefix {
    V4(u32),
    V6(u64),
}

impl SourcePrefix {
    pub fn of(ip: IpAddr) -> SourcePrefix {
        match ip.to_canonical() {
            IpAddr::V4(a) => SourcePrefix::V4(u32::from(a)),
            IpAddr::V6(a) => SourcePrefix::V6((u128::from(a) >> 64) as u64),
        }
    }
}

impl fmt::Display for SourcePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SourcePrefix::V4(a) => write!(f, "{}/32", std::net::Ipv4Addr::from(a)),
            SourcePrefix::V6(p) => {
                write!(f, "{}/64", std::net::Ipv6Addr::from(u128::from(p) << 64))
            }
        }
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source prefix already has `max_per_source` unauthenticated connections.
    PerPrefix,
    /// The table is full of authenticated (and outbound) connections.
    Full,
}

/// What to do with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Admit after closing this unauthenticated inbound connection.
    Evict(ConnId),
    Refuse(Refusal),
}

/// The listener's admission policy, without sockets or clocks: counts of inbound and
/// outbound connections and, per source prefix, the unauthenticated inbound ones in
/// arrival order (ids only grow, so the front of each list is its oldest).
///
/// Eviction, when the table is full, takes the oldest unauthenticated connection of
/// the prefix holding the most of them: with equal shares that is the oldest overall;
/// a flood from a few prefixes churns its own connections before touching a lone
/// newcomer from elsewhere. Authenticated and outbound connections are never evicted
/// for a newcomer.
#[derive(Debug)]
pub struct Admission {
    max_conns: usize,
    reserved_outbound: usize,
    per_prefix: usize,
    inbound: usize,
    outbound: usize,
    unauth: HashMap<SourcePrefix, VecDeque<ConnId>>,
    unauth_total: usize,
}

impl Admission {
    pub fn new(max_conns: usize, reserved_outbound: usize, per_prefix: usize) -> Admission {
        Admission {
            max_conns,
            reserved_outbound: reserved_outbound.min(max_conns / 2),
            per_prefix: per_prefix.max(1),
            inbound: 0,
            outbound: 0,
            unauth: HashMap::new(),
            unauth_total: 0,
        }
    }

    /// Decide on an inbound connection from `p` (changes nothing).
    pub fn admit_inbound(&self, p: SourcePrefix) -> Decision {
        if self.unauth.get(&p).map_or(0, VecDeque::len) >= self.per_prefix {
            return Decision::Refuse(Refusal::PerPrefix);
        }
        let inbound_cap = self.max_conns - self.reserved_outbound;
        if self.inbound < inbound_cap && self.total() < self.max_conns {
            return Decision::Admit;
        }
        self.victim()
            .map_or(Decision::Refuse(Refusal::Full), Decision::Evict)
    }

    /// Decide on one of our own outbound connections (changes nothing).
    pub fn admit_outbound(&self) -> Decision {
        if self.total() < self.max_conns {
            return Decision::Admit;
        }
        self.victim()
            .map_or(Decision::Refuse(Refusal::Full), Decision::Evict)
    }

    /// The unauthenticated inbound connection to evict: the oldest of the prefix
    /// with the most; ties go to the older one.
    pub fn victim(&self) -> Option<ConnId> {
        self.unauth
            .values()
            .filter_map(|q| q.front().map(|&id| (q.len(), id)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, id)| id)
    }

    /// An admitted inbound connection (unauthenticated).
    pub fn add_inbound(&mut self, id: ConnId, p: SourcePrefix) {
        self.inbound += 1;
        self.unauth.entry(p).or_default().push_back(id);
        self.unauth_total += 1;
    }

    pub fn add_outbound(&mut self) {
        self.outbound += 1;
    }

    /// An inbound connection delivered an authenticated message: it no longer counts
    /// against its prefix and can no longer be evicted.
    pub fn authenticated(&mut self, id: ConnId, p: SourcePrefix) {
        self.forget_unauth(id, p);
    }

    /// A connection is gone. `inbound`: the prefix it was counted against.
    pub fn remove(&mut self, id: ConnId, inbound: Option<SourcePrefix>) {
        match inbound {
            Some(p) => {
                self.inbound = self.inbound.saturating_sub(1);
                self.forget_unauth(id, p);
            }
            None => self.outbound = self.outbound.saturating_sub(1),
        }
    }

    fn forget_unauth(&mut self, id: ConnId, p: SourcePrefix) {
        if let Some(q) = self.unauth.get_mut(&p) {
            if let Some(i) = q.iter().position(|&x| x == id) {
                q.remove(i);
                self.unauth_total -= 1;
            }
            if q.is_empty() {
                self.unauth.remove(&p);
            }
        }
    }

    pub fn total(&self) -> usize {
        self.inbound + self.outbound
    }

    pub fn unauthenticated(&self) -> usize {
        self.unauth_total
    }
}

/// What the timers know about one connection (all instants from one clock).
#[derive(Clone, Copy, Debug)]
pub struct ConnTimes {
    pub inbound: bool,
    pub connecting: bool,
    /// Accepted, or (outbound) established / started connecting.
    pub since: Instant,
    /// The latest authenticated message (`None`: none yet).
    pub last_auth: Option<Instant>,
    /// A frame has been in progress since.
    pub partial_since: Option<Instant>,
}

/// Why the timers close a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    ConnectTimeout,
    /// Inbound, and no authenticated message within `auth_timeout`.
    AuthDeadline,
    /// A frame started and did not complete within `partial_timeout` (slowloris).
    PartialFrame,
    /// No authenticated message for `idle_timeout`.
    Idle,
}

impl Expiry {
    /// What the close is logged with.
    pub fn reason(self) -> &'static str {
        match self {
            Expiry::ConnectTimeout => "connect timed out",
            Expiry::AuthDeadline => "no authenticated WireGuard message in time",
            Expiry::PartialFrame => "frame incomplete for too long",
            Expiry::Idle => "idle (no authenticated message)",
        }
    }
}

/// The listener's deadlines, from the transport's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// An outbound connection must be established within this.
    pub connect: Duration,
    /// An inbound connection must deliver an authenticated message within this.
    pub auth: Duration,
    /// A frame once started must complete within this (slowloris).
    pub partial: Duration,
    /// No authenticated message for this long: close.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            auth: AUTH_DEADLINE,
            partial: Duration::from_secs(10),
            idle: Duration::from_secs(600),
        }
    }
}

/// The timer rule. Only authenticated messages count as life: an inbound connection
/// that never authenticates is closed `auth` after it arrived however much
/// well-framed traffic it sends; the idle clock runs from the latest authenticated
/// message (or from `since` for an outbound connection that has none yet).
pub fn expiry(t: &ConnTimes, now: Instant, cfg: &Timeouts) -> Option<Expiry> {
    let age = now.saturating_duration_since(t.since);
    if t.connecting {
        return (age > cfg.connect).then_some(Expiry::ConnectTimeout);
    }
    if t.inbound && t.last_auth.is_none() && age > cfg.auth {
        return Some(Expiry::AuthDeadline);
    }
    if t.partial_since
        .is_some_and(|p| now.saturating_duration_since(p) > cfg.partial)
    {
        return Some(Expiry::PartialFrame);
    }
    let life = t.last_auth.unwrap_or(t.since);
    (now.saturating_duration_since(life) > cfg.idle).then_some(Expiry::Idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> SourcePrefix {
        SourcePrefix::of(s.parse().unwrap())
    }

    #[test]
    fn source_prefixes() {
        assert_eq!(v4("192.0.2.1"), v4("::ffff:192.0.2.1"), "v4-mapped is v4");
        assert_ne!(v4("192.0.2.1"), v4("192.0.2.2"), "IPv4: /32");
        assert_eq!(
            v4("2001:db8:1:2::1"),
            v4("2001:db8:1:2:ffff::9"),
            "IPv6: /64"
        );
        assert_ne!(v4("2001:db8:1:2::1"), v4("2001:db8:1:3::1"));
        assert_eq!(v4("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(v4("::ffff:10.0.0.1").to_string(), "10.0.0.1/32");
    }

    #[test]
    fn admission_per_prefix_limit_counts_only_unauthenticated() {
        let mut a = Admission::new(100, 10, 2);
        let (p, q) = (v4("2001:db8::1"), v4("2001:db8:0:1::1"));
        assert_eq!(a.admit_inbound(p), Decision::Admit);
        a.add_inbound(1, p);
        a.add_inbound(2, p);
        assert_eq!(a.admit_inbound(p), Decision::Refuse(Refusal::PerPrefix));
        assert_eq!(a.admit_inbound(q), Decision::Admit, "another /64");
        // An authenticated connection frees its prefix's share but stays counted.
        a.authenticated(1, p);
        assert_eq!(a.admit_inbound(p), Decision::Admit);
        assert_eq!((a.total(), a.unauthenticated()), (2, 1));
        a.remove(2, Some(p));
        a.remove(1, Some(p));
        assert_eq!((a.total(), a.unauthenticated()), (0, 0));
        assert!(a.unauth.is_empty(), "no empty per-prefix lists left behind");
    }

    #[test]
    fn admission_evicts_oldest_unauthenticated_of_the_biggest_prefix() {
        // 6 slots, 2 reserved for outbound: inbound may hold 4.
        let mut a = Admission::new(6, 2, 3);
        let (attacker, lone, other) = (v4("198.51.100.7"), v4("203.0.113.9"), v4("192.0.2.5"));
        a.add_inbound(1, lone);
        a.add_inbound(2, attacker);
        a.add_inbound(3, attacker);
        a.add_inbound(4, other);
        // Full for inbound: the attacker's prefix has the most; its oldest goes, not
        // the older connection of the lone client.
        assert_eq!(a.admit_inbound(other), Decision::Evict(2));
        a.remove(2, Some(attacker));
        a.add_inbound(5, other);
        // Now attacker 1, lone 1, other 2: other's oldest.
        assert_eq!(a.admit_inbound(lone), Decision::Evict(4));
        // Equal shares: the oldest overall.
        let mut b = Admission::new(3, 0, 8);
        b.add_inbound(10, v4("10.0.0.1"));
        b.add_inbound(11, v4("10.0.0.2"));
        b.add_inbound(12, v4("10.0.0.3"));
        assert_eq!(b.admit_inbound(v4("10.0.0.4")), Decision::Evict(10));
    }

    #[test]
    fn admission_never_evicts_authenticated_and_keeps_outbound_slots() {
        let mut a = Admission::new(4, 1, 8);
        for id in 1..=3 {
            let p = v4(&format!("10.0.0.{id}"));
            assert_eq!(a.admit_inbound(p), Decision::Admit);
            a.add_inbound(id, p);
            a.authenticated(id, p);
        }
        // Inbound has its 3; all authenticated: a newcomer is refused, not admitted
        // into the reserved slot and not given an authenticated victim.
        assert_eq!(
            a.admit_inbound(v4("10.9.9.9")),
            Decision::Refuse(Refusal::Full)
        );
        // Our own connect still gets the reserved slot.
        assert_eq!(a.admit_outbound(), Decision::Admit);
        a.add_outbound();
        assert_eq!(a.admit_outbound(), Decision::Refuse(Refusal::Full));
        // With an unauthenticated inbound in the table, outbound evicts it.
        let mut b = Admission::new(2, 1, 8);
        b.add_inbound(1, v4("10.0.0.1"));
        b.add_outbound();
        assert_eq!(b.admit_outbound(), Decision::Evict(1));
        b.remove(1, Some(v4("10.0.0.1")));
        b.remove(99, None);
        assert_eq!(b.total(), 0);
        // A small table (a relay with --max-connections 1) still takes inbound.
        assert_eq!(
            Admission::new(1, 16, 8).admit_inbound(v4("10.0.0.1")),
            Decision::Admit
        );
    }

    #[test]
    fn admission_flood_stays_bounded() {
        // 3000 connections from 200 addresses against a 256-slot table: the table
        // never exceeds its inbound share and no prefix exceeds its limit.
        let mut a = Admission::new(256, 16, 8);
        let mut open: std::collections::VecDeque<(ConnId, SourcePrefix)> = Default::default();
        let (mut refused, mut evicted) = (0, 0);
        for id in 0..3000u64 {
            let p = v4(&format!("10.1.{}.{}", id % 200 / 100, id % 100));
            match a.admit_inbound(p) {
                Decision::Admit => {}
                Decision::Evict(v) => {
                    let i = open.iter().position(|&(x, _)| x == v).unwrap();
                    let (_, vp) = open.remove(i).unwrap();
                    a.remove(v, Some(vp));
                    evicted += 1;
                }
                Decision::Refuse(_) => {
                    refused += 1;
                    continue;
                }
            }
            a.add_inbound(id, p);
            open.push_back((id, p));
            assert!(a.total() <= 240);
            assert!(a.unauth.values().all(|q| q.len() <= 8));
        }
        assert!(evicted > 2000 && refused == 0, "{evicted} {refused}");
        // Same from one /64: refused past 8.
        let mut b = Admission::new(256, 16, 8);
        let p = v4("2001:db8:1:1::1");
        let mut admitted = 0;
        for id in 0..3000u64 {
            if b.admit_inbound(p) == Decision::Admit {
                b.add_inbound(id, p);
                admitted += 1;
            }
        }
        assert_eq!(admitted, 8);
    }

    #[test]
    fn expiry_rule() {
        let cfg = Timeouts::default();
        let t0 = Instant::now();
        let s = |d: u64| t0 + Duration::from_millis(d);
        let fresh = ConnTimes {
            inbound: true,
            connecting: false,
            since: t0,
            last_auth: None,
            partial_since: None,
        };
        let deadline = cfg.auth.as_millis() as u64;
        assert_eq!(expiry(&fresh, s(deadline - 1), &cfg), None);
        assert_eq!(
            expiry(&fresh, s(deadline + 1), &cfg),
            Some(Expiry::AuthDeadline),
            "silent, or talking garbage: the deadline runs from arrival regardless"
        );
        let authed = ConnTimes {
            last_auth: Some(s(100)),
            ..fresh
        };
        assert_eq!(expiry(&authed, s(deadline + 1), &cfg), None);
        let idle = cfg.idle.as_millis() as u64;
        assert_eq!(expiry(&authed, s(100 + idle - 1), &cfg), None);
        assert_eq!(
            expiry(&authed, s(100 + idle + 1), &cfg),
            Some(Expiry::Idle),
            "only authenticated messages reset the idle clock"
        );
        // Slowloris: a frame started and never finished.
        let slow = ConnTimes {
            partial_since: Some(s(200)),
            ..authed
        };
        let partial = cfg.partial.as_millis() as u64;
        assert_eq!(
            expiry(&slow, s(200 + partial + 1), &cfg),
            Some(Expiry::PartialFrame)
        );
        // Outbound: no auth deadline; connect timeout while connecting; idle from
        // establishment.
        let out = ConnTimes {
            inbound: false,
            ..fresh
        };
        assert_eq!(expiry(&out, s(deadline * 10), &cfg), None);
        assert_eq!(
            expiry(
                &ConnTimes {
                    connecting: true,
                    ..out
                },
                s(10_001),
                &cfg
            ),
            Some(Expiry::ConnectTimeout)
        );
        assert_eq!(expiry(&out, s(idle + 1), &cfg), Some(Expiry::Idle));
        assert!(
            AUTH_DEADLINE > Duration::from_millis(5333),
            "a cookie retry fits"
        );
    }
}
