//! The DHCPv4 client of the uplink (RFC 2131), sans-IO: the state machine, the lease and
//! its text form. Messages are built and parsed with `dhcproto`; time is passed in
//! (`Instant`), randomness comes from a seed, and the driver (`driver/appliance/dhcp.rs`) owns the
//! socket, the clock, netlink and the files.
//!
//! States: INIT → SELECTING (DISCOVER, first acceptable OFFER) → REQUESTING (REQUEST,
//! broadcast) → BOUND → RENEWING at T1 (REQUEST unicast to the server; only its answers
//! count: its server identifier, from its address) → REBINDING at T2 (REQUEST broadcast;
//! any server may answer) → expiry back to INIT. INIT-REBOOT asks for the previous address
//! after a restart or a link flap; unanswered, the client keeps the unexpired lease it has
//! (RFC 2131 3.2) — a lost server never takes the address away before the lease ends.
//! Retransmissions back off exponentially (4 s doubling to 64 s, ±1 s jitter); a REQUEST
//! gives up after 4 tries and starts over. A lease that cannot be used (network or
//! broadcast address of its subnet, the router's address, a router that is not on-link)
//! or that the driver's [`LeaseCheck`] refuses (a conflict with the tunnel's routes) is
//! not requested when offered and DECLINEd when acknowledged; the same server's same
//! lease is refused again only after 10 s, 20 s, ... up to [`MAX_REFUSE_WAIT`] (no
//! DISCOVER meanwhile; other servers' offers still count), so there is no decline loop.
//! A NAK drops the address at once.
//!
//! Replies that are not for us or make no sense (wrong xid or chaddr, missing options,
//! absurd lease times, a /0 or /32 subnet, ...) are ignored with an [`Ignored`] reason;
//! nothing received can panic this module (see `fuzz/fuzz_targets/dhcp.rs`).
//!
//! Owns: the client's states, their one transition table and one retransmission clock,
//! and the lease. Invariant: every RFC 2131 rule above is applied by that table, from
//! the state and the time passed in, and nowhere else. Tests are in `dhcp/tests.rs`.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dhcproto::v4::{
    Decodable, Decoder, DhcpOption, DhcpOptions, Encodable, Encoder, Flags, Message, MessageType,
    Opcode, OptionCode,
};

/// The shortest lease accepted: anything shorter is a misconfigured or hostile server.
pub const MIN_LEASE: Duration = Duration::from_secs(10);
/// `0xffffffff` seconds: an infinite lease (RFC 2132 9.2).
pub const INFINITE: u32 = u32::MAX;
/// The client's UDP port and the server's.
pub const CLIENT_PORT: u16 = 68;
pub const SERVER_PORT: u16 = 67;

const FIRST_RETRY: Duration = Duration::from_secs(4);
const MAX_RETRY: Duration = Duration::from_secs(64);
/// Tries of a REQUEST (SELECTING's) and of INIT-REBOOT before giving up on them.
const REQUEST_TRIES: u32 = 4;
const REBOOT_TRIES: u32 = 3;
/// Shortest wait between REQUESTs while RENEWING/REBINDING (RFC 2131 4.4.5 says 60 s;
/// shorter here so that short leases get more than one try before T2 or expiry).
const MIN_RENEW_RETRY: Duration = Duration::from_secs(10);
/// After a DECLINE, wait this long before starting again (RFC 2131 3.1 step 5).
pub const DECLINE_WAIT: Duration = Duration::from_secs(10);
/// The longest wait before asking again after declining a server's lease: a refused
/// lease is offered again at 10 s, 20 s, 40 s, ... up to this (no decline loop).
pub const MAX_REFUSE_WAIT: Duration = Duration::from_secs(300);
/// Refusals remembered (server, lease) for their back-off; a new one replaces only a
/// refusal whose wait is over (see `Client::refuse`).
const MAX_REFUSALS: usize = 8;
/// NTP servers kept from option 42: enough to compare answers, too few to be a flood list.
pub const MAX_NTP: usize = 4;

/// An address lease as the server gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    /// Prefix length of the subnet mask, 1..=31.
    pub prefix: u8,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    /// NTP servers (option 42): unicast addresses only, at most [`MAX_NTP`]. The lease
    /// file's `ntp` line; the SNTP client's source after the configured servers.
    pub ntp: Vec<Ipv4Addr>,
    /// The server identifier (option 54): where renewals go.
    pub server: Ipv4Addr,
    /// Lease, T1 and T2 in seconds ([`INFINITE`] for an infinite lease; T1 < T2 < lease).
    pub lease_secs: u32,
    pub t1_secs: u32,
    pub t2_secs: u32,
    /// Unix seconds when the lease was obtained or last renewed; set by whoever has a
    /// wall clock (the driver), 0 when unknown.
    pub obtained: u64,
}

impl Lease {
    pub fn is_infinite(&self) -> bool {
        self.lease_secs == INFINITE
    }

    /// The lease's text form, one `key value` a line, for `/run/riceguard/lease.IFACE`.
    pub fn to_text(&self) -> String {
        let join = |v: &[Ipv4Addr]| {
            v.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut s = format!("address {}/{}\n", self.address, self.prefix);
        if let Some(r) = self.router {
            s.push_str(&format!("router {r}\n"));
        }
        if !self.dns.is_empty() {
            s.push_str(&format!("dns {}\n", join(&self.dns)));
        }
        if !self.ntp.is_empty() {
            s.push_str(&format!("ntp {}\n", join(&self.ntp)));
        }
        s.push_str(&format!(
            "server {}\nlease {}\nt1 {}\nt2 {}\nobtained {}\n",
            self.server, self.lease_secs, self.t1_secs, self.t2_secs, self.obtained
        ));
        s
    }

    /// Parse [`Lease::to_text`]'s form; unknown keys are skipped (a newer writer), a
    /// missing or bad required one is an error.
    pub fn from_text(text: &str) -> Result<Lease, String> {
        let mut address = None;
        let mut router = None;
        let mut dns = Vec::new();
        let mut ntp = Vec::new();
        let mut server = None;
        let (mut lease, mut t1, mut t2, mut obtained) = (None, None, None, None);
        for (i, line) in text.lines().take(64).enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            let v = v.trim();
            let bad = |what: &str| format!("line {}: {what} `{v}`", i + 1);
            let ip = |s: &str| s.parse::<Ipv4Addr>().map_err(|_| bad("bad address"));
            let num = |s: &str| s.parse::<u32>().map_err(|_| bad("bad number"));
            match k {
                "address" => {
                    let (a, p) = v
                        .split_once('/')
                        .ok_or_else(|| bad("expected ADDR/PREFIX"))?;
                    let p: u8 = p.parse().map_err(|_| bad("bad prefix"))?;
                    if !(1..=31).contains(&p) {
                        return Err(bad("prefix out of 1..31"));
                    }
                    address = Some((ip(a)?, p));
                }
                "router" => router = Some(ip(v)?),
                "dns" => {
                    dns = v
                        .split_whitespace()
                        .take(8)
                        .map(ip)
                        .collect::<Result<_, _>>()?
                }
                // Filtered as a received option 42 is: a hand-edited file is no wider door.
                "ntp" => {
                    ntp = v
                        .split_whitespace()
                        .take(MAX_NTP)
                        .map(ip)
                        .collect::<Result<Vec<_>, _>>()?
                        .into_iter()
                        .filter(|a| is_unicast(*a))
                        .collect()
                }
                "server" => server = Some(ip(v)?),
                "lease" => lease = Some(num(v)?),
                "t1" => t1 = Some(num(v)?),
                "t2" => t2 = Some(num(v)?),
                "obtained" => obtained = Some(v.parse::<u64>().map_err(|_| bad("bad time"))?),
                _ => {}
            }
        }
        let (address, prefix) = address.ok_or("no `address` line")?;
        let lease_secs = lease.ok_or("no `lease` line")?;
        let (t1_secs, t2_secs) = timers(lease_secs, t1, t2);
        Ok(Lease {
            address,
            prefix,
            router,
            dns,
            ntp,
            server: server.ok_or("no `server` line")?,
            lease_secs,
            t1_secs,
            t2_secs,
            obtained: obtained.ok_or("no `obtained` line")?,
        })
    }
}

/// T1 and T2 as the server sent them when they make sense (T1 < T2 < lease), else the
/// RFC 2131 defaults (0.5 and 0.875 of the lease).
fn timers(lease: u32, t1: Option<u32>, t2: Option<u32>) -> (u32, u32) {
    if lease == INFINITE {
        return (INFINITE, INFINITE);
    }
    let d1 = lease / 2;
    let d2 = (lease as u64 * 7 / 8) as u32;
    match (t1, t2) {
        (Some(a), Some(b)) if a > 0 && a < b && b < lease => (a, b),
        (Some(a), None) if a > 0 && a < d2 => (a, d2),
        (None, Some(b)) if b > d1 && b < lease => (d1, b),
        _ => (d1, d2),
    }
}

/// A DHCP message to send, and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// `None`: the limited broadcast 255.255.255.255; else unicast to the server.
    pub to: Option<Ipv4Addr>,
    pub payload: Vec<u8>,
}

/// What the driver must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A lease for a (new or re-confirmed) address: put it on the link with the lease's
    /// lifetime and route via its router. `replaces` is the lease held before, whose
    /// address must go if it differs.
    Bound {
        lease: Lease,
        replaces: Option<Lease>,
    },
    /// The same address renewed (RENEWING or REBINDING): refresh its lifetime.
    Renewed(Lease),
    /// T1 passed: asking the lease's server to extend it.
    Renewing,
    /// T2 passed without a renewal: asking any server now.
    Rebinding,
    /// The lease ended: remove its address and route.
    Expired(Lease),
    /// The server refused the address; `removed` is the lease to take off the link.
    Nak {
        server: Ipv4Addr,
        message: String,
        removed: Option<Lease>,
    },
    /// An acknowledged lease was unusable (its address, its router, or a conflict with
    /// the tunnel's routes) and was DECLINEd; `removed` is the lease to take off the link,
    /// if one was held. INIT follows after `retry_in`; `repeat` counts how often this
    /// server's same lease has been refused in a row (1: the first time).
    Declined {
        address: Ipv4Addr,
        prefix: u8,
        server: Ipv4Addr,
        reason: String,
        removed: Option<Lease>,
        retry_in: Duration,
        repeat: u32,
    },
    /// An OFFER that would be declined was not requested; no DISCOVER goes out for
    /// `retry_in` (other servers' offers to the last one still count). Not repeated for
    /// the same offer within its wait.
    OfferRefused {
        address: Ipv4Addr,
        prefix: u8,
        server: Ipv4Addr,
        reason: String,
        retry_in: Duration,
        repeat: u32,
    },
    /// INIT-REBOOT got no answer; the unexpired lease is kept until its own timers.
    RebootUnanswered { keeping: Option<Ipv4Addr> },
}

/// Why a received datagram was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ignored {
    Malformed(String),
    NotAReply,
    ForeignXid,
    ForeignChaddr,
    NoMessageType,
    /// A message of this type is not expected in the current state.
    Unexpected(String),
    /// From another server than the one being talked to.
    OtherServer(Ipv4Addr),
    Missing(&'static str),
    BadLease(String),
    BadAddress(String),
    /// A lease refused again within its back-off (already reported by an event).
    Refused(String),
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ignored::Malformed(e) => write!(f, "malformed message: {e}"),
            Ignored::NotAReply => f.write_str("not a BOOTREPLY"),
            Ignored::ForeignXid => f.write_str("transaction id is not ours"),
            Ignored::ForeignChaddr => f.write_str("client hardware address is not ours"),
            Ignored::NoMessageType => f.write_str("no DHCP message type"),
            Ignored::Unexpected(t) => write!(f, "{t} not expected now"),
            Ignored::OtherServer(s) => write!(f, "from server {s}, not the one asked"),
            Ignored::Missing(o) => write!(f, "no {o} option"),
            Ignored::BadLease(e) => write!(f, "lease time: {e}"),
            Ignored::BadAddress(e) => write!(f, "address: {e}"),
            Ignored::Refused(e) => write!(f, "lease refused again: {e}"),
        }
    }
}

/// The client's state (RFC 2131 figure 5), plus `Down` while the link has no carrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Init,
    Selecting,
    Requesting,
    InitReboot,
    Bound,
    Renewing,
    Rebinding,
    /// A DECLINE was sent; INIT follows after [`DECLINE_WAIT`].
    Declining,
    Down,
}

/// A held lease and the instant its times count from (when its REQUEST was first sent).
#[derive(Clone, Debug)]
struct Held {
    lease: Lease,
    at: Instant,
}

impl Held {
    fn deadline(&self, secs: u32) -> Option<Instant> {
        if secs == INFINITE {
            return None;
        }
        self.at.checked_add(Duration::from_secs(secs.into()))
    }
    fn t1(&self) -> Option<Instant> {
        self.deadline(self.lease.t1_secs)
    }
    fn t2(&self) -> Option<Instant> {
        self.deadline(self.lease.t2_secs)
    }
    fn expiry(&self) -> Option<Instant> {
        self.deadline(self.lease.lease_secs)
    }
}

/// The driver's verdict on a lease before it is requested or kept (the tunnel's routes,
/// `core::uplink_overlap`): `Err` says why it must be declined.
pub type LeaseCheck = Box<dyn FnMut(&Lease) -> Result<(), String> + Send>;

/// One server's lease refused, and until when it is not asked for again.
#[derive(Clone, Debug)]
struct Refusal {
    server: Ipv4Addr,
    address: Ipv4Addr,
    prefix: u8,
    count: u32,
    until: Instant,
}

/// The DHCPv4 client of one interface.
pub struct Client {
    chaddr: [u8; 6],
    hostname: Option<String>,
    state: State,
    rng: u64,
    xid: u32,
    /// When the current exchange began (its first message; `secs` and lease times count
    /// from it).
    started: Instant,
    /// The next transmission, the number sent in this exchange, and when the state
    /// gives up waiting (REQUESTING, INIT-REBOOT, DECLINE).
    next_send: Option<Instant>,
    sent: u32,
    give_up: Option<Instant>,
    /// SELECTING's chosen offer: (address, server).
    offer: Option<(Ipv4Addr, Ipv4Addr)>,
    held: Option<Held>,
    /// The last address leased, asked for again by INIT-REBOOT.
    previous: Option<Ipv4Addr>,
    events: VecDeque<Event>,
    check: Option<LeaseCheck>,
    refused: Vec<Refusal>,
}

impl Client {
    /// A client for the interface with this MAC address, in INIT, sending nothing until
    /// [`Client::start`]. `seed` feeds xids and jitter (give it real randomness).
    pub fn new(chaddr: [u8; 6], seed: u64, now: Instant) -> Client {
        Client {
            chaddr,
            hostname: None,
            state: State::Init,
            rng: seed | 1,
            xid: 0,
            started: now,
            next_send: None,
            sent: 0,
            give_up: None,
            offer: None,
            held: None,
            previous: None,
            events: VecDeque::new(),
            check: None,
            refused: Vec::new(),
        }
    }

    /// Ask `check` about every lease offered or acknowledged: a lease it refuses is not
    /// requested (an OFFER) or is DECLINEd (an ACK), with the back-off of a refusal.
    pub fn set_lease_check(&mut self, check: LeaseCheck) {
        self.check = Some(check);
    }

    /// Why `l` cannot be used, if it cannot: [`usable`], then the driver's check.
    fn vet(&mut self, l: &Lease) -> Result<(), String> {
        usable(l)?;
        match &mut self.check {
            Some(f) => f(l),
            None => Ok(()),
        }
    }

    /// Count a refusal of `l`: how long not to ask for it again and how often in a row it
    /// was refused. `None` when it was refused already within its current wait.
    fn refuse(&mut self, now: Instant, l: &Lease) -> Option<(Duration, u32)> {
        let key = (l.server, l.address, l.prefix);
        let i = match self
            .refused
            .iter()
            .position(|r| (r.server, r.address, r.prefix) == key)
        {
            Some(i) if now < self.refused[i].until => return None,
            Some(i) => {
                self.refused[i].count = self.refused[i].count.saturating_add(1);
                i
            }
            None => {
                let fresh = Refusal {
                    server: l.server,
                    address: l.address,
                    prefix: l.prefix,
                    count: 1,
                    until: now,
                };
                if self.refused.len() < MAX_REFUSALS {
                    self.refused.push(fresh);
                    self.refused.len() - 1
                } else {
                    // Everything in an offer (server identifier, address, source) costs
                    // a host on the uplink nothing to vary, so no key stops a flood of
                    // identities. It may only take the place of a refusal whose wait
                    // is over, the least repeated first: one still waiting is never
                    // forgotten (that would reset its server's back-off). With none,
                    // the newcomer gets the first wait without being remembered.
                    let Some(i) = self
                        .refused
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.until <= now)
                        .min_by_key(|(_, r)| (r.count, r.until))
                        .map(|(i, _)| i)
                    else {
                        return Some((DECLINE_WAIT, 1));
                    };
                    self.refused[i] = fresh;
                    i
                }
            }
        };
        let r = &mut self.refused[i];
        let shift = r.count.saturating_sub(1).min(16);
        let wait = DECLINE_WAIT.saturating_mul(1 << shift).min(MAX_REFUSE_WAIT);
        r.until = now + wait;
        Some((wait, r.count))
    }

    /// Send option 12 (host name) with every request.
    pub fn set_hostname(&mut self, name: &str) {
        self.hostname = (!name.is_empty() && name.len() <= 63).then(|| name.to_string());
    }

    /// Take over a lease from before a restart, obtained `age` ago. Its expiry is kept
    /// (the kernel holds the address until then); [`Client::start`] confirms it with
    /// INIT-REBOOT. An already expired lease only gives the address to ask for.
    pub fn restore(&mut self, now: Instant, lease: Lease, age: Duration) {
        self.previous = Some(lease.address);
        let Some(at) = now.checked_sub(age) else {
            return;
        };
        let h = Held { lease, at };
        if h.expiry().is_none_or(|e| e > now) {
            self.held = Some(h);
        }
    }

    /// Only ask for `address` again (INIT-REBOOT, then DISCOVER if unanswered), keeping no
    /// lease: for a lease from before a restart whose address is not on the link any
    /// more, or that may no longer be used.
    pub fn remember(&mut self, address: Ipv4Addr) {
        self.held = None;
        self.previous = Some(address);
    }

    /// Begin: INIT-REBOOT when an address is known from before, else INIT (DISCOVER).
    pub fn start(&mut self, now: Instant) {
        if self.current_address().is_some() {
            self.enter_init_reboot(now);
        } else {
            self.enter_init(now);
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The lease in use (bound, renewing, rebinding, or kept while re-confirming).
    pub fn lease(&self) -> Option<&Lease> {
        self.held.as_ref().map(|h| &h.lease)
    }

    /// How long ago the held lease's times began (its REQUEST went out).
    pub fn lease_age(&self, now: Instant) -> Option<Duration> {
        self.held
            .as_ref()
            .map(|h| now.saturating_duration_since(h.at))
    }

    /// Time left until the held lease expires; `None` without a lease or for an
    /// infinite one.
    pub fn lease_remaining(&self, now: Instant) -> Option<Duration> {
        self.held
            .as_ref()
            .and_then(|h| h.expiry())
            .map(|e| e.saturating_duration_since(now))
    }

    fn current_address(&self) -> Option<Ipv4Addr> {
        self.held
            .as_ref()
            .map(|h| h.lease.address)
            .or(self.previous)
    }

    /// The link lost its carrier: stop sending; the lease's expiry still counts.
    pub fn link_down(&mut self, _now: Instant) {
        self.state = State::Down;
        self.next_send = None;
        self.give_up = None;
        self.offer = None;
    }

    /// The carrier is back: re-acquire, asking for the address held before (INIT-REBOOT).
    pub fn link_up(&mut self, now: Instant) {
        self.start(now);
    }

    /// The driver found the bound address in use by another host: DECLINE it.
    pub fn decline(&mut self, now: Instant, reason: &str) {
        if let Some(l) = self.lease().cloned() {
            self.enter_declining(now, &l, reason.to_string());
        }
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Client::handle_timeout`] or [`Client::poll_transmit`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = [self.next_send, self.give_up, None, None, None];
        if let Some(h) = &self.held {
            t[2] = h.expiry();
            match self.state {
                State::Bound => t[3] = h.t1(),
                State::Renewing => t[3] = h.t2(),
                _ => {}
            }
        }
        t.into_iter().flatten().min()
    }

    /// Move on timers: T1, T2, expiry, giving up on a REQUEST or INIT-REBOOT.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(h) = &self.held {
            if h.expiry().is_some_and(|e| now >= e) {
                let lease = h.lease.clone();
                self.held = None;
                self.events.push_back(Event::Expired(lease));
                if self.state != State::Down {
                    self.enter_init(now);
                }
                return;
            }
        }
        if self.give_up.is_some_and(|g| now >= g) {
            self.give_up = None;
            match self.state {
                State::Requesting | State::Declining => self.enter_init(now),
                State::InitReboot => {
                    self.events.push_back(Event::RebootUnanswered {
                        keeping: self.held.as_ref().map(|h| h.lease.address),
                    });
                    if self.held.is_some() {
                        self.resume_lease(now);
                    } else {
                        self.enter_init(now);
                    }
                }
                _ => {}
            }
            return;
        }
        let Some(h) = &self.held else { return };
        match self.state {
            State::Bound if h.t1().is_some_and(|t| now >= t) => self.resume_lease(now),
            State::Renewing if h.t2().is_some_and(|t| now >= t) => self.resume_lease(now),
            _ => {}
        }
    }

    /// The state a held lease is in at `now` (INIT-REBOOT unanswered, T1 or T2 passed).
    fn resume_lease(&mut self, now: Instant) {
        let Some(h) = &self.held else { return };
        let (t1, t2) = (h.t1(), h.t2());
        let prev = self.state;
        if t2.is_some_and(|t| now >= t) {
            self.state = State::Rebinding;
            if prev != State::Rebinding {
                self.events.push_back(Event::Rebinding);
                self.new_exchange(now);
                self.next_send = Some(now);
            }
        } else if t1.is_some_and(|t| now >= t) {
            self.state = State::Renewing;
            if prev != State::Renewing {
                self.events.push_back(Event::Renewing);
                self.new_exchange(now);
                self.next_send = Some(now);
            }
        } else {
            self.state = State::Bound;
            self.next_send = None;
        }
    }

    /// The next message to send, if one is due.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Outgoing> {
        if self.next_send.is_none_or(|t| now < t) {
            return None;
        }
        self.sent = self.sent.saturating_add(1);
        let (kind, to) = match self.state {
            State::Init => {
                self.state = State::Selecting;
                (MessageType::Discover, None)
            }
            State::Selecting => (MessageType::Discover, None),
            State::Requesting | State::InitReboot => (MessageType::Request, None),
            State::Renewing => (
                MessageType::Request,
                self.held.as_ref().map(|h| h.lease.server),
            ),
            State::Rebinding => (MessageType::Request, None),
            State::Declining => (MessageType::Decline, None),
            State::Bound | State::Down => {
                self.next_send = None;
                return None;
            }
        };
        self.next_send = self.retry_after(now);
        let tries = match self.state {
            State::Requesting => Some(REQUEST_TRIES),
            State::InitReboot => Some(REBOOT_TRIES),
            State::Declining => Some(1),
            _ => None,
        };
        if tries.is_some_and(|n| self.sent >= n) {
            // The last try: wait one more interval for its answer, then give up.
            if self.state != State::Declining {
                self.give_up = self.next_send;
            }
            self.next_send = None;
        }
        let payload = self.build(now, kind)?;
        Some(Outgoing { to, payload })
    }

    /// When to send again in the current state (None: not before a timer moves us on).
    fn retry_after(&mut self, now: Instant) -> Option<Instant> {
        match self.state {
            State::Selecting | State::Requesting | State::InitReboot => {
                let shift = self.sent.saturating_sub(1).min(4);
                let base = FIRST_RETRY.saturating_mul(1 << shift).min(MAX_RETRY);
                // ±1 s of jitter, so clients that lost power together do not stay in step.
                let j = Duration::from_millis(self.next_rand() % 2001);
                let d = (base + j).saturating_sub(Duration::from_secs(1));
                now.checked_add(d)
            }
            State::Renewing | State::Rebinding => {
                let h = self.held.as_ref()?;
                let end = if self.state == State::Renewing {
                    h.t2()
                } else {
                    h.expiry()
                }?;
                let left = end.saturating_duration_since(now);
                let wait = (left / 2).max(MIN_RENEW_RETRY);
                (wait < left).then(|| now + wait)
            }
            _ => None,
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: enough for xids and jitter; the seed is the driver's randomness.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn new_exchange(&mut self, now: Instant) {
        self.xid = (self.next_rand() >> 32) as u32;
        self.started = now;
        self.sent = 0;
        self.give_up = None;
    }

    fn enter_init(&mut self, now: Instant) {
        self.state = State::Init;
        self.offer = None;
        self.new_exchange(now);
        // A short random wait (RFC 2131 4.4.1 says 1-10 s; an appliance wants its uplink soon).
        self.next_send = Some(now + Duration::from_millis(self.next_rand() % 1000));
    }

    fn enter_init_reboot(&mut self, now: Instant) {
        self.state = State::InitReboot;
        self.offer = None;
        self.new_exchange(now);
        self.next_send = Some(now);
    }

    /// DECLINE `lease` (and drop the lease held, if any), then INIT after the refusal's
    /// back-off (at least 10 s, RFC 2131 3.1 step 5).
    fn enter_declining(&mut self, now: Instant, lease: &Lease, why: String) {
        let (retry_in, repeat) = self.refuse(now, lease).unwrap_or((DECLINE_WAIT, 1));
        let removed = self.held.take().map(|h| h.lease);
        self.events.push_back(Event::Declined {
            address: lease.address,
            prefix: lease.prefix,
            server: lease.server,
            reason: why,
            removed,
            retry_in,
            repeat,
        });
        self.state = State::Declining;
        self.offer = Some((lease.address, lease.server));
        self.previous = None;
        self.sent = 0;
        self.next_send = Some(now);
        self.give_up = Some(now + retry_in.max(DECLINE_WAIT));
    }

    /// A datagram that arrived on the client port, its source unknown.
    pub fn handle_reply(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Ignored> {
        self.handle_reply_from(now, bytes, None)
    }

    /// A datagram that arrived on the client port from `from` (its IPv4 source). While
    /// RENEWING only the bound server counts (RFC 2131 4.4.5): its server identifier, and
    /// the source of the unicast answer when known; any server may answer only while
    /// REBINDING.
    pub fn handle_reply_from(
        &mut self,
        now: Instant,
        bytes: &[u8],
        from: Option<Ipv4Addr>,
    ) -> Result<(), Ignored> {
        let bytes = keep_used_options(bytes)?;
        let msg = Message::decode(&mut Decoder::new(&bytes))
            .map_err(|e| Ignored::Malformed(e.to_string()))?;
        if msg.opcode() != Opcode::BootReply {
            return Err(Ignored::NotAReply);
        }
        if msg.xid() != self.xid {
            return Err(Ignored::ForeignXid);
        }
        // Checked before `chaddr()`, which slices by `hlen` and panics past 16 (dhcproto 0.15).
        if msg.hlen() != 6 || msg.chaddr().get(..6) != Some(&self.chaddr[..]) {
            return Err(Ignored::ForeignChaddr);
        }
        let opts = msg.opts();
        let kind = opts.msg_type().ok_or(Ignored::NoMessageType)?;
        let server = match opts.get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
            _ => None,
        };
        if self.state == State::Renewing && matches!(kind, MessageType::Ack | MessageType::Nak) {
            let bound = self.held.as_ref().map(|h| h.lease.server);
            if let Some(b) = bound {
                if let Some(s) = server.filter(|s| *s != b) {
                    return Err(Ignored::OtherServer(s));
                }
                if let Some(f) = from.filter(|f| *f != b) {
                    return Err(Ignored::OtherServer(f));
                }
            }
        }
        // Without option 54 the answer's source names its server (REBINDING: any).
        let server = server.or(from.filter(|_| self.state == State::Rebinding));
        match (kind, self.state) {
            (MessageType::Offer, State::Selecting) => {
                let lease = parse_lease(&msg, server)?;
                if let Err(why) = self.vet(&lease) {
                    let Some((retry_in, repeat)) = self.refuse(now, &lease) else {
                        return Err(Ignored::Refused(why));
                    };
                    // The same server would offer the same again: no DISCOVER before
                    // the wait. Other servers answer the DISCOVER already sent.
                    let at = now + retry_in;
                    self.next_send = Some(self.next_send.map_or(at, |t| t.max(at)));
                    self.events.push_back(Event::OfferRefused {
                        address: lease.address,
                        prefix: lease.prefix,
                        server: lease.server,
                        reason: why,
                        retry_in,
                        repeat,
                    });
                    return Ok(());
                }
                self.state = State::Requesting;
                self.offer = Some((lease.address, lease.server));
                // Same xid: the REQUEST belongs to the exchange the DISCOVER began.
                self.sent = 0;
                self.next_send = Some(now);
                self.give_up = None;
                Ok(())
            }
            (
                MessageType::Ack,
                State::Requesting | State::InitReboot | State::Renewing | State::Rebinding,
            ) => self.on_ack(now, &msg, server),
            (
                MessageType::Nak,
                State::Requesting | State::InitReboot | State::Renewing | State::Rebinding,
            ) => {
                let server = server.ok_or(Ignored::Missing("server identifier"))?;
                let asked = match self.state {
                    State::Requesting => self.offer.map(|o| o.1),
                    State::Renewing => self.held.as_ref().map(|h| h.lease.server),
                    _ => None,
                };
                if asked.is_some_and(|a| a != server) {
                    return Err(Ignored::OtherServer(server));
                }
                let message = match opts.get(OptionCode::Message) {
                    Some(DhcpOption::Message(m)) => m.chars().take(100).collect(),
                    _ => String::new(),
                };
                let removed = self.held.take().map(|h| h.lease);
                self.previous = None;
                self.events.push_back(Event::Nak {
                    server,
                    message,
                    removed,
                });
                self.enter_init(now);
                Ok(())
            }
            (k, _) => Err(Ignored::Unexpected(format!("{k:?}"))),
        }
    }

    fn on_ack(
        &mut self,
        now: Instant,
        msg: &Message,
        server: Option<Ipv4Addr>,
    ) -> Result<(), Ignored> {
        // RENEWING/REBINDING ACKs may omit the server id: the one of the lease stands.
        let server = server.or_else(|| match self.state {
            State::Renewing | State::Rebinding => self.held.as_ref().map(|h| h.lease.server),
            _ => None,
        });
        let mut lease = parse_lease(msg, server)?;
        match self.state {
            State::Requesting => {
                if let Some((addr, srv)) = self.offer {
                    if srv != lease.server {
                        return Err(Ignored::OtherServer(lease.server));
                    }
                    if addr != lease.address {
                        return Err(Ignored::BadAddress(format!(
                            "ACK for {} after asking for {addr}",
                            lease.address
                        )));
                    }
                }
            }
            State::InitReboot if Some(lease.address) != self.current_address() => {
                return Err(Ignored::BadAddress(format!(
                    "ACK for {} after asking for the previous address",
                    lease.address
                )));
            }
            _ => {}
        }
        if let Err(why) = usable(&lease) {
            if matches!(self.state, State::Requesting | State::InitReboot) {
                self.enter_declining(now, &lease, why);
                return Ok(());
            }
            // A renewal that went bad keeps the lease held (it ends by its own times).
            return Err(Ignored::BadAddress(why));
        }
        // A conflict with the tunnel's routes is declined in every state: the
        // configuration may have changed since the lease was bound.
        if let Err(why) = self.vet(&lease) {
            self.enter_declining(now, &lease, why);
            return Ok(());
        }
        self.refused.clear();
        lease.obtained = 0;
        let old = self.held.take();
        self.held = Some(Held {
            lease: lease.clone(),
            at: self.started,
        });
        self.previous = Some(lease.address);
        // A new router (another server answered while REBINDING) is a new binding: the
        // driver replaces the old default route.
        let same = old.as_ref().is_some_and(|o| {
            (o.lease.address, o.lease.prefix, o.lease.router)
                == (lease.address, lease.prefix, lease.router)
        });
        let event = match self.state {
            State::Renewing | State::Rebinding if same => Event::Renewed(lease),
            _ => Event::Bound {
                lease,
                replaces: old.map(|o| o.lease),
            },
        };
        self.events.push_back(event);
        self.state = State::Bound;
        self.next_send = None;
        self.give_up = None;
        self.offer = None;
        Ok(())
    }

    fn build(&mut self, now: Instant, kind: MessageType) -> Option<Vec<u8>> {
        let mut msg = blank()?;
        msg.set_xid(self.xid);
        msg.set_chaddr(&self.chaddr);
        let secs = now.saturating_duration_since(self.started).as_secs();
        msg.set_secs(secs.min(u16::MAX.into()) as u16);
        let ours = self.held.as_ref().map(|h| h.lease.address);
        let mut o = DhcpOptions::new();
        o.insert(DhcpOption::MessageType(kind));
        let mut cid = vec![1u8];
        cid.extend_from_slice(&self.chaddr);
        o.insert(DhcpOption::ClientIdentifier(cid));
        match (kind, self.state) {
            (MessageType::Decline, _) => {
                if let Some((addr, srv)) = self.offer {
                    o.insert(DhcpOption::RequestedIpAddress(addr));
                    o.insert(DhcpOption::ServerIdentifier(srv));
                }
            }
            (_, State::Requesting) => {
                msg.set_flags(Flags::default().set_broadcast());
                if let Some((addr, srv)) = self.offer {
                    o.insert(DhcpOption::RequestedIpAddress(addr));
                    o.insert(DhcpOption::ServerIdentifier(srv));
                }
            }
            (_, State::InitReboot) => {
                msg.set_flags(Flags::default().set_broadcast());
                o.insert(DhcpOption::RequestedIpAddress(self.current_address()?));
            }
            (_, State::Renewing | State::Rebinding) => {
                msg.set_ciaddr(ours?);
            }
            _ => {
                msg.set_flags(Flags::default().set_broadcast());
                if let Some(p) = self.previous {
                    o.insert(DhcpOption::RequestedIpAddress(p));
                }
            }
        }
        if kind != MessageType::Decline {
            o.insert(DhcpOption::MaxMessageSize(1500));
            o.insert(DhcpOption::ParameterRequestList(vec![
                OptionCode::SubnetMask,
                OptionCode::Router,
                OptionCode::DomainNameServer,
                OptionCode::AddressLeaseTime,
                OptionCode::Renewal,
                OptionCode::Rebinding,
                OptionCode::NtpServers,
            ]));
            if let Some(h) = &self.hostname {
                o.insert(DhcpOption::Hostname(h.clone()));
            }
        }
        msg.set_opts(o);
        let mut buf = Vec::with_capacity(300);
        msg.encode(&mut Encoder::new(&mut buf)).ok()?;
        // Some servers ignore messages shorter than a BOOTP packet (300 bytes).
        if buf.len() < 300 {
            buf.resize(300, 0);
        }
        Some(buf)
    }
}

/// An empty BOOTREQUEST, decoded from bytes: `dhcproto`'s constructors draw a random xid
/// from the OS, which this sans-IO module must not do (the xid is ours anyway).
fn blank() -> Option<Message> {
    let mut b = [0u8; 241];
    b[0] = 1; // BOOTREQUEST
    b[1] = 1; // Ethernet
    b[2] = 6; // hardware address length
    b[236..240].copy_from_slice(&dhcproto::v4::MAGIC);
    b[240] = 255; // end of options
    Message::decode(&mut Decoder::new(&b)).ok()
}

/// Options this client reads; the others are dropped before decoding.
const USED_OPTIONS: [u8; 10] = [1, 3, 6, 42, 51, 53, 54, 56, 58, 59];
/// Fixed BOOTP header and the magic cookie before the options.
const HEADER_LEN: usize = 240;

/// A copy of a received message with only the options in [`USED_OPTIONS`] (and an end
/// mark): `dhcproto` 0.15 has debug assertions and unchecked arithmetic on the lengths of
/// some other options (bulk leasequery, status codes), so a reply carrying a malformed
/// one of those must not reach its decoder. A broken option list is malformed as a whole.
fn keep_used_options(b: &[u8]) -> Result<Vec<u8>, Ignored> {
    if b.len() < HEADER_LEN {
        return Err(Ignored::Malformed(format!(
            "{} bytes, shorter than a header",
            b.len()
        )));
    }
    if b[236..240] != dhcproto::v4::MAGIC {
        return Err(Ignored::Malformed("no DHCP magic cookie".into()));
    }
    let mut out = Vec::with_capacity(b.len().min(1500) + 1);
    out.extend_from_slice(&b[..HEADER_LEN]);
    let mut i = HEADER_LEN;
    while i < b.len() {
        let code = b[i];
        match code {
            0 => i += 1,
            255 => break,
            _ => {
                let len = *b
                    .get(i + 1)
                    .ok_or_else(|| Ignored::Malformed(format!("option {code} cut short")))?
                    as usize;
                let data = b.get(i + 2..i + 2 + len).ok_or_else(|| {
                    Ignored::Malformed(format!("option {code} runs past the end"))
                })?;
                // A broken NTP list (not whole addresses) costs the list, not the lease:
                // the uplink matters more than the clock's third source.
                let broken_optional = code == 42 && (len == 0 || !len.is_multiple_of(4));
                if USED_OPTIONS.contains(&code) && !broken_optional {
                    out.push(code);
                    out.push(len as u8);
                    out.extend_from_slice(data);
                }
                i += 2 + len;
            }
        }
    }
    out.push(255);
    Ok(out)
}

/// The lease an OFFER or ACK describes, checked; `server` is the server identifier.
fn parse_lease(msg: &Message, server: Option<Ipv4Addr>) -> Result<Lease, Ignored> {
    let opts = msg.opts();
    let server = server.ok_or(Ignored::Missing("server identifier"))?;
    let address = msg.yiaddr();
    if address.is_unspecified()
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_loopback()
        || address.octets()[0] == 0
        || address.octets()[0] >= 240
    {
        return Err(Ignored::BadAddress(format!("{address} cannot be ours")));
    }
    let mask = match opts.get(OptionCode::SubnetMask) {
        Some(DhcpOption::SubnetMask(m)) => u32::from(*m),
        _ => return Err(Ignored::Missing("subnet mask")),
    };
    let prefix = mask.leading_ones();
    if mask.checked_shl(prefix).unwrap_or(0) != 0 {
        return Err(Ignored::BadAddress(format!(
            "subnet mask {} is not contiguous",
            Ipv4Addr::from(mask)
        )));
    }
    if !(1..=31).contains(&prefix) {
        return Err(Ignored::BadAddress(format!("prefix /{prefix} is unusable")));
    }
    let lease_secs = match opts.get(OptionCode::AddressLeaseTime) {
        Some(DhcpOption::AddressLeaseTime(l)) => *l,
        _ => return Err(Ignored::Missing("lease time")),
    };
    if u64::from(lease_secs) < MIN_LEASE.as_secs() {
        return Err(Ignored::BadLease(format!(
            "{lease_secs} s is shorter than {} s",
            MIN_LEASE.as_secs()
        )));
    }
    let t = |c| match opts.get(c) {
        Some(DhcpOption::Renewal(v)) | Some(DhcpOption::Rebinding(v)) => Some(*v),
        _ => None,
    };
    let (t1_secs, t2_secs) = timers(lease_secs, t(OptionCode::Renewal), t(OptionCode::Rebinding));
    let router = match opts.get(OptionCode::Router) {
        Some(DhcpOption::Router(r)) => r
            .iter()
            .copied()
            .find(|r| !r.is_unspecified() && !r.is_broadcast() && !r.is_multicast()),
        _ => None,
    };
    let dns = match opts.get(OptionCode::DomainNameServer) {
        Some(DhcpOption::DomainNameServer(d)) => d
            .iter()
            .copied()
            .filter(|a| !a.is_unspecified() && !a.is_broadcast() && !a.is_multicast())
            .take(3) // resolv.conf's MAXNS
            .collect(),
        _ => Vec::new(),
    };
    let ntp = match opts.get(OptionCode::NtpServers) {
        Some(DhcpOption::NtpServers(n)) => n
            .iter()
            .copied()
            .filter(|a| is_unicast(*a))
            .take(MAX_NTP)
            .collect(),
        _ => Vec::new(),
    };
    Ok(Lease {
        address,
        prefix: prefix as u8,
        router,
        dns,
        ntp,
        server,
        lease_secs,
        t1_secs,
        t2_secs,
        obtained: 0,
    })
}

/// A unicast address a server could be at: not in 0.0.0.0/8, loopback, multicast,
/// broadcast or class E (reserved).
pub fn is_unicast(a: Ipv4Addr) -> bool {
    let first = a.octets()[0];
    first != 0 && !a.is_loopback() && !a.is_multicast() && !a.is_broadcast() && first < 240
}

/// Whether an acknowledged address can be put on the link.
fn usable(l: &Lease) -> Result<(), String> {
    let a = u32::from(l.address);
    let host_bits = u32::MAX >> l.prefix;
    if l.prefix < 31 && (a & host_bits == 0 || a & host_bits == host_bits) {
        return Err(format!(
            "{} is the network or broadcast address of its /{} subnet",
            l.address, l.prefix
        ));
    }
    if l.router == Some(l.address) {
        return Err(format!("{} is the router's own address", l.address));
    }
    // The default route needs an on-link gateway; one elsewhere cannot be installed and
    // may be a redirect trick. (Classless static routes, option 121, are not used by this
    // client, so none can make it reachable.)
    if let Some(r) = l.router {
        let mask = !host_bits;
        if u32::from(r) & mask != a & mask {
            return Err(format!(
                "router {r} is not on-link in {}/{} (no classless static route, option 121, is used): the default route via it cannot be installed",
                Ipv4Addr::from(a & mask),
                l.prefix
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
