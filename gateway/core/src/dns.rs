//! The appliance's DNS forwarder without I/O (`riceguard up --config` runs it as a thread:
//! `driver::daemon::dns`): what a query gets, decided here, with time (milliseconds of a
//! monotonic clock) and randomness (the forwarded queries' IDs) handed in.
//!
//! - [`Zone`]: the names it answers itself, under `[Gateway] Domain` (`home.arpa`): the
//!   appliance (`gateway.DOMAIN`, its tunnel and LAN addresses) and each enabled peer whose
//!   `Name` is one DNS label ([`publishable`]), from the peer's host addresses (`/32`,
//!   `/128`) in its allowed IPs; reverse lookups (PTR) for the tunnel's subnets.
//! - [`Cache`]: upstream answers kept within their TTLs (the smallest of the records',
//!   at most [`MAX_TTL`]), bounded by [`CACHE_ENTRIES`] and [`CACHE_BYTES`].
//! - [`RateLimit`]: a token bucket per source address, the table itself bounded.
//! - [`Resolver`]: a query in, an answer or a forward out; a forward goes out with a fresh
//!   random ID (the driver sends it from a fresh socket: a fresh source port), and an
//!   upstream datagram is taken only from the upstream it was sent to, with that ID and
//!   the same question ([`Resolver::upstream_answer`]); anything else is ignored and the
//!   query still waits for the real answer until [`FORWARD_TIMEOUT_MS`].
//! - The rebinding filter ([`Resolver::upstream_answer`]): an upstream's address records
//!   (A, AAAA) that name a tunnel address (the tunnel's subnets, the enabled peers'
//!   allowed IPs) are dropped, counted in [`Stats::rebinding_dropped`]: the names the
//!   tunnel has are this zone's, never an outside resolver's (lease resolvers come from
//!   the untrusted uplink).
//!
//! Bad input never panics: every message is parsed by `hickory-proto` and a query that does
//! not parse is dropped (no answer to a datagram that may be forged).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, PTR};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use rand_core::RngCore;

use crate::config::Config;
use crate::firewall::services::dns_listen_addrs;
use crate::net::Cidr;

/// The domain when `[Gateway] Domain` is unset (RFC 8375).
pub use crate::config::DEFAULT_DOMAIN;
/// The appliance's own name under the domain.
pub const APPLIANCE_NAME: &str = "gateway";
/// The TTL of the names the appliance answers itself.
pub const LOCAL_TTL: u32 = 60;
/// Upstream TTLs are kept at most this long (a day).
pub const MAX_TTL: u32 = 86_400;
/// Cache bounds: entries, and bytes of their wire form.
pub const CACHE_ENTRIES: usize = 2048;
pub const CACHE_BYTES: usize = 2 << 20;
/// A source may send this many queries at once, then [`RATE_PER_SEC`] a second.
pub const RATE_BURST: u32 = 100;
pub const RATE_PER_SEC: u32 = 50;
/// Sources the rate limiter remembers (the one least recently heard is forgotten first).
pub const RATE_SOURCES: usize = 1024;
/// Forwarded queries outstanding at once, in all and from one source.
pub const MAX_PENDING: usize = 256;
pub const MAX_PENDING_PER_SOURCE: usize = 32;
/// An upstream that has not answered by then: the client gets SERVFAIL.
pub const FORWARD_TIMEOUT_MS: u64 = 2500;
/// The largest UDP answer without EDNS (RFC 1035).
pub const UDP_PLAIN: usize = 512;
/// The largest UDP answer the resolver sends, whatever EDNS offers.
pub const UDP_MAX: usize = 1232;
/// The largest DNS message (TCP).
pub const TCP_MAX: usize = 65_535;

/// Whether `name` (a peer's `Name`) can be published: one DNS label of letters, digits
/// and hyphens, 1 to 63 bytes, not starting or ending with a hyphen (`x.y`, spaces, `_`
/// are not).
pub fn publishable(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The names the appliance answers itself.
#[derive(Clone, Debug, Default)]
pub struct Zone {
    /// The domain, lowercase, fully qualified.
    domain: Option<Name>,
    /// Label (lowercase) → addresses.
    hosts: HashMap<String, Vec<IpAddr>>,
    /// Address → the name a PTR gives.
    reverse: HashMap<IpAddr, Name>,
    /// The subnets whose reverse lookups are answered here.
    reverse_nets: Vec<Cidr>,
}

impl Zone {
    /// The zone for `domain` (a domain that does not parse gives [`DEFAULT_DOMAIN`]):
    /// the appliance's `addrs`, `tunnel` subnets (reverse lookups) and the peers' names
    /// with their allowed IPs (host prefixes only are published; unpublishable names and
    /// a name given twice are left out; the appliance's name wins).
    pub fn new<'a>(
        domain: &str,
        appliance: &[IpAddr],
        tunnel: &[Cidr],
        peers: impl IntoIterator<Item = (&'a str, &'a [Cidr])>,
    ) -> Zone {
        let domain = parse_domain(domain)
            .or_else(|| parse_domain(DEFAULT_DOMAIN))
            .map(|n| n.to_lowercase());
        let mut z = Zone {
            domain,
            reverse_nets: tunnel.iter().map(Cidr::network).collect(),
            ..Zone::default()
        };
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut list: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (name, ips) in peers {
            if !publishable(name) {
                continue;
            }
            let l = name.to_ascii_lowercase();
            *seen.entry(l.clone()).or_default() += 1;
            let hosts = ips
                .iter()
                .filter(|c| c.prefix == if c.addr.is_ipv4() { 32 } else { 128 })
                .map(|c| c.addr)
                .collect();
            list.push((l, hosts));
        }
        for (l, hosts) in list {
            if seen.get(&l) == Some(&1) && l != APPLIANCE_NAME {
                z.add(&l, hosts);
            }
        }
        z.add(APPLIANCE_NAME, appliance.to_vec());
        z
    }

    fn add(&mut self, label: &str, addrs: Vec<IpAddr>) {
        let Some(fqdn) = self.fqdn(label) else { return };
        for a in &addrs {
            self.reverse.entry(*a).or_insert_with(|| fqdn.clone());
        }
        if label == APPLIANCE_NAME {
            // The appliance's addresses take the PTR even when a peer listed one.
            for a in &addrs {
                self.reverse.insert(*a, fqdn.clone());
            }
        }
        self.hosts.insert(label.to_string(), addrs);
    }

    fn fqdn(&self, label: &str) -> Option<Name> {
        Name::from_ascii(label)
            .ok()?
            .append_domain(self.domain.as_ref()?)
            .ok()
    }

    /// The domain, as text without the final dot.
    pub fn domain(&self) -> String {
        let s = self.domain.as_ref().map(Name::to_ascii).unwrap_or_default();
        s.trim_end_matches('.').to_string()
    }

    /// The published labels and their addresses (sorted: for `show` and tests).
    pub fn hosts(&self) -> Vec<(String, Vec<IpAddr>)> {
        let mut v: Vec<_> = self
            .hosts
            .iter()
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        v.sort();
        v
    }

    /// Whether the name is one this zone answers for (under the domain, or a reverse name
    /// inside the tunnel's subnets). `None`: forward it.
    pub fn answer(&self, q: &Query) -> Option<(ResponseCode, Vec<Record>)> {
        let name = q.name.to_lowercase();
        if let Some(d) = &self.domain {
            if d.zone_of(&name) {
                return Some(self.forward_answer(q, &name, d));
            }
        }
        let arpa = parse_domain("arpa")?;
        if !arpa.zone_of(&name) {
            return None;
        }
        let net = name.parse_arpa_name().ok()?;
        let (addr, len) = (net.addr(), net.prefix_len());
        let inside = self
            .reverse_nets
            .iter()
            .find(|n| n.contains(addr) && n.addr.is_ipv4() == addr.is_ipv4())?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        if len < full {
            // A zone cut between the subnet and a host: an empty answer when it lies
            // inside the subnet, else not ours.
            return (len >= inside.prefix).then(|| (ResponseCode::NoError, Vec::new()));
        }
        match self.reverse.get(&addr) {
            Some(n) if matches!(q.query_type, RecordType::PTR | RecordType::ANY) => Some((
                ResponseCode::NoError,
                vec![Record::from_rdata(
                    q.name.clone(),
                    LOCAL_TTL,
                    RData::PTR(PTR(n.clone())),
                )],
            )),
            Some(_) => Some((ResponseCode::NoError, Vec::new())),
            None => Some((ResponseCode::NXDomain, Vec::new())),
        }
    }

    fn forward_answer(&self, q: &Query, name: &Name, d: &Name) -> (ResponseCode, Vec<Record>) {
        if name.num_labels() == d.num_labels() {
            return (ResponseCode::NoError, Vec::new());
        }
        if name.num_labels() != d.num_labels() + 1 {
            return (ResponseCode::NXDomain, Vec::new());
        }
        let label = name
            .iter()
            .next()
            .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
            .unwrap_or_default();
        let Some(addrs) = self.hosts.get(&label) else {
            return (ResponseCode::NXDomain, Vec::new());
        };
        let want = |a: &IpAddr| match q.query_type {
            RecordType::A => a.is_ipv4(),
            RecordType::AAAA => a.is_ipv6(),
            RecordType::ANY => true,
            _ => false,
        };
        let records = addrs
            .iter()
            .filter(|a| want(a))
            .map(|a| {
                let data = match a {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(q.name.clone(), LOCAL_TTL, data)
            })
            .collect();
        (ResponseCode::NoError, records)
    }
}

fn parse_domain(s: &str) -> Option<Name> {
    let s = s.trim().trim_end_matches('.');
    if s.is_empty() || !s.split('.').all(publishable) {
        return None;
    }
    let mut n = Name::from_ascii(s).ok()?;
    n.set_fqdn(true);
    Some(n)
}

/// What a cache entry is found by: the question, its name lowercase.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    name: String,
    qtype: u16,
    qclass: u16,
}

impl CacheKey {
    pub fn of(q: &Query) -> CacheKey {
        CacheKey {
            name: q.name.to_lowercase().to_ascii(),
            qtype: u16::from(q.query_type),
            qclass: u16::from(q.query_class),
        }
    }
}

#[derive(Clone, Debug)]
struct CacheEntry {
    code: ResponseCode,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
    stored_ms: u64,
    expires_ms: u64,
    bytes: usize,
}

/// Upstream answers within their TTLs, bounded in entries and bytes: when full, expired
/// entries go first, then the one closest to expiry.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<CacheKey, CacheEntry>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(CACHE_ENTRIES, CACHE_BYTES)
    }
}

impl Cache {
    pub fn new(max_entries: usize, max_bytes: usize) -> Cache {
        Cache {
            entries: HashMap::new(),
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keep `answer` (NOERROR or NXDOMAIN, not truncated) for the smallest TTL of its
    /// records; an answer without records, or a TTL of 0, is not kept.
    pub fn insert(&mut self, answer: &Message, now_ms: u64) {
        let code = answer.metadata.response_code;
        if answer.metadata.truncation
            || !matches!(code, ResponseCode::NoError | ResponseCode::NXDomain)
            || answer.queries.len() != 1
        {
            return;
        }
        let ttl = answer
            .answers
            .iter()
            .chain(&answer.authorities)
            .map(|r| r.ttl)
            .min();
        let Some(ttl) = ttl.map(|t| t.min(MAX_TTL)).filter(|t| *t > 0) else {
            return;
        };
        let bytes = answer.to_vec().map(|v| v.len()).unwrap_or(usize::MAX);
        if bytes > self.max_bytes / 8 || self.max_entries == 0 {
            return;
        }
        let key = CacheKey::of(&answer.queries[0]);
        self.remove(&key);
        self.expire(now_ms);
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            let Some(k) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.expires_ms)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&k);
        }
        let strip = |v: &[Record]| -> Vec<Record> {
            v.iter()
                .filter(|r| r.record_type() != RecordType::OPT)
                .cloned()
                .collect()
        };
        self.entries.insert(
            key,
            CacheEntry {
                code,
                answers: strip(&answer.answers),
                authorities: strip(&answer.authorities),
                additionals: strip(&answer.additionals),
                stored_ms: now_ms,
                expires_ms: now_ms + u64::from(ttl) * 1000,
                bytes,
            },
        );
        self.bytes += bytes;
    }

    fn remove(&mut self, k: &CacheKey) {
        if let Some(e) = self.entries.remove(k) {
            self.bytes -= e.bytes;
        }
    }

    /// Forget every entry whose TTL has run out.
    pub fn expire(&mut self, now_ms: u64) {
        let gone: Vec<CacheKey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.expires_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The answer to `q`, its TTLs lowered by the time it was kept; `None` when not
    /// cached or expired.
    pub fn get(&mut self, q: &Query, now_ms: u64) -> Option<(ResponseCode, [Vec<Record>; 3])> {
        let key = CacheKey::of(q);
        let e = self.entries.get(&key)?;
        if e.expires_ms <= now_ms {
            self.remove(&key);
            return None;
        }
        // Threads read the clock before taking the lock: `now_ms` may be a little behind
        // the time the entry was stored.
        let age = u32::try_from(now_ms.saturating_sub(e.stored_ms) / 1000).unwrap_or(u32::MAX);
        let aged = |v: &[Record]| -> Vec<Record> {
            v.iter()
                .cloned()
                .map(|mut r| {
                    r.ttl = r.ttl.min(MAX_TTL).saturating_sub(age);
                    r
                })
                .collect()
        };
        Some((
            e.code,
            [aged(&e.answers), aged(&e.authorities), aged(&e.additionals)],
        ))
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens_milli: u64,
    last_ms: u64,
}

/// A token bucket per source address: [`RATE_BURST`] at once, [`RATE_PER_SEC`] a second
/// after; at most [`RATE_SOURCES`] sources remembered (the one heard least recently is
/// forgotten, which gives it a full bucket again: a flood from many addresses is the
/// firewall's and the pending limit's business).
#[derive(Debug)]
pub struct RateLimit {
    buckets: HashMap<IpAddr, Bucket>,
    burst: u32,
    per_sec: u32,
    max_sources: usize,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new(RATE_BURST, RATE_PER_SEC, RATE_SOURCES)
    }
}

impl RateLimit {
    pub fn new(burst: u32, per_sec: u32, max_sources: usize) -> RateLimit {
        RateLimit {
            buckets: HashMap::new(),
            burst,
            per_sec,
            max_sources: max_sources.max(1),
        }
    }

    pub fn sources(&self) -> usize {
        self.buckets.len()
    }

    /// Whether a query from `src` now may be served (taking a token if so).
    pub fn allow(&mut self, src: IpAddr, now_ms: u64) -> bool {
        let full = u64::from(self.burst) * 1000;
        if !self.buckets.contains_key(&src) && self.buckets.len() >= self.max_sources {
            if let Some(old) = self
                .buckets
                .iter()
                .min_by_key(|(_, b)| b.last_ms)
                .map(|(k, _)| *k)
            {
                self.buckets.remove(&old);
            }
        }
        let b = self.buckets.entry(src).or_insert(Bucket {
            tokens_milli: full,
            last_ms: now_ms,
        });
        let gained = now_ms.saturating_sub(b.last_ms) * u64::from(self.per_sec);
        b.tokens_milli = (b.tokens_milli.saturating_add(gained)).min(full);
        b.last_ms = b.last_ms.max(now_ms);
        if b.tokens_milli >= 1000 {
            b.tokens_milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// What to do with a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send these bytes back to the client.
    Answer(Vec<u8>),
    /// Send `bytes` to `upstream` from a fresh socket, and hand what comes back to
    /// [`Resolver::upstream_answer`] with `token`.
    Forward {
        token: u64,
        upstream: SocketAddr,
        bytes: Vec<u8>,
    },
    /// Nothing goes back (not a query, did not parse, over its rate).
    Drop(Dropped),
}

/// Why a datagram got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    Malformed,
    NotAQuery,
    RateLimited,
    TooManyPending,
}

/// The resolver's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub queries: u64,
    pub local: u64,
    pub cache_hits: u64,
    pub forwarded: u64,
    pub rate_limited: u64,
    pub malformed: u64,
    /// Upstream datagrams ignored: wrong source, ID or question, or unreadable.
    pub mismatched: u64,
    pub timeouts: u64,
    /// Address records dropped by the rebinding filter.
    pub rebinding_dropped: u64,
}

impl Stats {
    /// Each count with the event name the metrics give it.
    pub fn events(&self) -> [(&'static str, u64); 9] {
        [
            ("query", self.queries),
            ("local", self.local),
            ("cache_hit", self.cache_hits),
            ("forwarded", self.forwarded),
            ("rate_limited", self.rate_limited),
            ("malformed", self.malformed),
            ("upstream_mismatched", self.mismatched),
            ("upstream_timeout", self.timeouts),
            ("rebinding_dropped", self.rebinding_dropped),
        ]
    }
}

#[derive(Clone, Debug)]
struct Pending {
    src: IpAddr,
    client_id: u16,
    id: u16,
    upstream: SocketAddr,
    query: Query,
    recursion_desired: bool,
    edns: Option<Edns>,
    max_reply: usize,
    deadline_ms: u64,
}

/// The settings a reload changes.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub zone: Zone,
    /// Where queries the zone does not answer go (port 53 unless said).
    pub upstreams: Vec<SocketAddr>,
    /// Addresses no upstream answer may name: the tunnel's subnets, the peers' allowed IPs.
    pub protected: Vec<Cidr>,
}

impl Settings {
    /// The settings for `cfg` (the file as read): the zone under `domain` with the
    /// appliance's listening addresses and the enabled peers' names, `upstreams` (port
    /// 53; the appliance's own addresses left out: no loop), the protected subnets.
    pub fn for_config(cfg: &Config, domain: &str, upstreams: &[IpAddr]) -> Settings {
        let own = dns_listen_addrs(cfg);
        let enabled = || cfg.peers.iter().filter(|p| p.enabled);
        let peers = enabled().filter_map(|p| Some((p.name.as_deref()?, &p.allowed_ips[..])));
        let zone = Zone::new(domain, &own, &cfg.interface.addresses, peers);
        let mut ups: Vec<SocketAddr> = Vec::new();
        for ip in upstreams {
            let sa = SocketAddr::new(ip.to_canonical(), 53);
            if !own.contains(&sa.ip()) && !sa.ip().is_unspecified() && !ups.contains(&sa) {
                ups.push(sa);
            }
        }
        let peer_nets: Vec<Cidr> = enabled()
            .flat_map(|p| p.allowed_ips.iter().copied())
            .collect();
        Settings {
            zone,
            upstreams: ups,
            protected: protected_nets(&cfg.interface.addresses, &peer_nets),
        }
    }
}

/// The forwarder's state: settings, cache, rate limits and the queries out upstream.
#[derive(Debug, Default)]
pub struct Resolver {
    settings: Settings,
    pub cache: Cache,
    pub rate: RateLimit,
    pending: HashMap<u64, Pending>,
    next_token: u64,
    next_upstream: usize,
    pub stats: Stats,
}

/// The subnets an upstream answer may not name: the tunnel's subnets and the enabled
/// peers' allowed IPs (a `/0`, a hub's route, is left out: it would name everything).
pub fn protected_nets(tunnel: &[Cidr], peers: &[Cidr]) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = tunnel
        .iter()
        .chain(peers)
        .filter(|c| c.prefix > 0)
        .map(Cidr::network)
        .collect();
    v.sort_by_key(Cidr::sort_key);
    v.dedup();
    v
}

impl Resolver {
    pub fn new(settings: Settings) -> Resolver {
        Resolver {
            settings,
            ..Resolver::default()
        }
    }

    /// New settings (a reload); the cache is emptied (the upstreams may have changed).
    pub fn set(&mut self, settings: Settings) {
        self.settings = settings;
        self.cache = Cache::new(self.cache.max_entries, self.cache.max_bytes);
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// A query from `src`. `tcp`: it came over TCP (answers up to 64 KiB, else as large as
    /// its EDNS offers, at most [`UDP_MAX`]).
    pub fn query(
        &mut self,
        src: IpAddr,
        bytes: &[u8],
        tcp: bool,
        now_ms: u64,
        rng: &mut impl RngCore,
    ) -> Outcome {
        if !self.rate.allow(src, now_ms) {
            self.stats.rate_limited += 1;
            return Outcome::Drop(Dropped::RateLimited);
        }
        let Ok(msg) = Message::from_vec(bytes) else {
            self.stats.malformed += 1;
            return Outcome::Drop(Dropped::Malformed);
        };
        if msg.metadata.message_type != MessageType::Query {
            return Outcome::Drop(Dropped::NotAQuery);
        }
        self.stats.queries += 1;
        let max_reply = if tcp {
            TCP_MAX
        } else {
            msg.edns
                .as_ref()
                .map(|e| usize::from(e.max_payload()).clamp(UDP_PLAIN, UDP_MAX))
                .unwrap_or(UDP_PLAIN)
        };
        let reply = |code: ResponseCode, recs: [Vec<Record>; 3], aa: bool| {
            let mut r = response(&msg, code, aa);
            [r.answers, r.authorities, r.additionals] = recs;
            encode(r, max_reply)
        };
        if msg.metadata.op_code != OpCode::Query {
            return Outcome::Answer(reply(ResponseCode::NotImp, Default::default(), false));
        }
        let [q] = msg.queries.as_slice() else {
            return Outcome::Answer(reply(ResponseCode::FormErr, Default::default(), false));
        };
        if !matches!(q.query_class, DNSClass::IN | DNSClass::ANY) {
            return Outcome::Answer(reply(ResponseCode::Refused, Default::default(), false));
        }
        if let Some((code, recs)) = self.settings.zone.answer(q) {
            self.stats.local += 1;
            return Outcome::Answer(reply(code, [recs, Vec::new(), Vec::new()], true));
        }
        if let Some((code, recs)) = self.cache.get(q, now_ms) {
            self.stats.cache_hits += 1;
            return Outcome::Answer(reply(code, recs, false));
        }
        if self.settings.upstreams.is_empty() {
            return Outcome::Answer(reply(ResponseCode::ServFail, Default::default(), false));
        }
        if self.pending.len() >= MAX_PENDING
            || self.pending.values().filter(|p| p.src == src).count() >= MAX_PENDING_PER_SOURCE
        {
            return Outcome::Drop(Dropped::TooManyPending);
        }
        let upstream = self.settings.upstreams[self.next_upstream % self.settings.upstreams.len()];
        self.next_upstream = self.next_upstream.wrapping_add(1);
        let id = (rng.next_u32() & 0xffff) as u16;
        let mut out = Message::new(id, MessageType::Query, OpCode::Query);
        out.metadata.recursion_desired = true;
        out.metadata.checking_disabled = msg.metadata.checking_disabled;
        out.add_query(q.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_MAX as u16);
        if let Some(e) = &msg.edns {
            edns.flags_mut().dnssec_ok = e.flags().dnssec_ok;
        }
        out.set_edns(edns);
        let Ok(bytes) = out.to_vec() else {
            return Outcome::Answer(reply(ResponseCode::FormErr, Default::default(), false));
        };
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(
            token,
            Pending {
                src,
                client_id: msg.metadata.id,
                id,
                upstream,
                query: q.clone(),
                recursion_desired: msg.metadata.recursion_desired,
                edns: msg.edns.clone(),
                max_reply,
                deadline_ms: now_ms + FORWARD_TIMEOUT_MS,
            },
        );
        self.stats.forwarded += 1;
        Outcome::Forward {
            token,
            upstream,
            bytes,
        }
    }

    /// A datagram from `from` on the socket of forward `token`: the client's answer when
    /// it is the answer (from the upstream asked, with the ID sent and the same question),
    /// `None` otherwise (ignored: the query waits on). The answer's address records that
    /// name a protected address are dropped; the rest is cached.
    pub fn upstream_answer(
        &mut self,
        token: u64,
        from: SocketAddr,
        bytes: &[u8],
        now_ms: u64,
    ) -> Option<Vec<u8>> {
        let p = self.pending.get(&token)?;
        let same_source = from.ip().to_canonical() == p.upstream.ip().to_canonical()
            && from.port() == p.upstream.port();
        let msg = Message::from_vec(bytes).ok();
        let ok = same_source
            && msg.as_ref().is_some_and(|m| {
                m.metadata.id == p.id
                    && m.metadata.message_type == MessageType::Response
                    && matches!(m.queries.as_slice(), [q] if same_question(q, &p.query))
            });
        if !ok {
            self.stats.mismatched += 1;
            return None;
        }
        let (p, mut m) = (self.pending.remove(&token)?, msg?);
        let protected = &self.settings.protected;
        let mut dropped = 0u64;
        let mut keep = |r: &Record| {
            let bad = r
                .data
                .ip_addr()
                .is_some_and(|a| protected.iter().any(|n| n.contains(a)));
            dropped += u64::from(bad);
            !bad
        };
        m.answers.retain(&mut keep);
        m.additionals.retain(&mut keep);
        m.authorities.retain(&mut keep);
        self.stats.rebinding_dropped += dropped;
        self.cache.insert(&m, now_ms);
        let mut r = Message::new(p.client_id, MessageType::Response, OpCode::Query);
        r.metadata = m.metadata;
        r.metadata.id = p.client_id;
        r.metadata.recursion_desired = p.recursion_desired;
        r.metadata.recursion_available = true;
        r.metadata.authoritative = false;
        r.add_query(p.query);
        r.answers = m.answers;
        r.authorities = m.authorities;
        r.additionals = m.additionals;
        if let Some(e) = p.edns {
            r.set_edns(reply_edns(&e));
        }
        Some(encode(r, p.max_reply))
    }

    /// The forwards whose upstream did not answer in time, each with the SERVFAIL its
    /// client gets; they are forgotten.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(u64, Vec<u8>)> {
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline_ms <= now_ms)
            .map(|(t, _)| *t)
            .collect();
        let out: Vec<(u64, Vec<u8>)> = late
            .into_iter()
            .filter_map(|t| Some((t, self.abandon(t)?)))
            .collect();
        self.stats.timeouts += out.len() as u64;
        out
    }

    /// Give up forward `token` (its socket failed): the SERVFAIL its client gets.
    pub fn abandon(&mut self, token: u64) -> Option<Vec<u8>> {
        let p = self.pending.remove(&token)?;
        let mut r = Message::new(p.client_id, MessageType::Response, OpCode::Query);
        r.metadata.recursion_desired = p.recursion_desired;
        r.metadata.recursion_available = true;
        r.metadata.response_code = ResponseCode::ServFail;
        r.add_query(p.query);
        Some(encode(r, p.max_reply))
    }

    /// When the next forward times out.
    pub fn next_deadline(&self) -> Option<u64> {
        self.pending.values().map(|p| p.deadline_ms).min()
    }
}

fn same_question(a: &Query, b: &Query) -> bool {
    a.query_type == b.query_type
        && a.query_class == b.query_class
        && a.name.to_lowercase().eq_ignore_root(&b.name.to_lowercase())
}

fn reply_edns(e: &Edns) -> Edns {
    let mut r = Edns::new();
    r.set_max_payload(UDP_MAX as u16);
    r.flags_mut().dnssec_ok = e.flags().dnssec_ok;
    r
}

/// The response skeleton to `q`: its ID, question, RD; RA set.
fn response(q: &Message, code: ResponseCode, authoritative: bool) -> Message {
    let mut r = Message::new(q.metadata.id, MessageType::Response, q.metadata.op_code);
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    r.metadata.authoritative = authoritative;
    r.metadata.response_code = code;
    r.queries = q.queries.clone();
    if let Some(e) = &q.edns {
        r.set_edns(reply_edns(e));
    }
    r
}

/// The wire form of `r`, truncated (TC set, records dropped) when over `max` bytes.
fn encode(r: Message, max: usize) -> Vec<u8> {
    match r.to_vec() {
        Ok(v) if v.len() <= max => v,
        Ok(_) => r.truncate().to_vec().unwrap_or_default(),
        Err(_) => {
            let mut e = Message::new(r.metadata.id, MessageType::Response, r.metadata.op_code);
            e.metadata.response_code = ResponseCode::ServFail;
            e.to_vec().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests;
