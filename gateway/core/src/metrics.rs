//! Prometheus metrics without I/O: the text exposition format (version 0.0.4) written
//! family by family into any `io::Write` as it goes (the daemon hands it a `BufWriter`
//! over the socket, so 20 000 peers are never one string), the figures it is written
//! from ([`Snapshot`]), counters kept from going back ([`Monotonic`]), and the one HTTP
//! request head the endpoint reads ([`parse_request`], fuzz target `metrics_http`).
//!
//! Names follow Prometheus' guide: `riceguard_` first, base units in the name
//! (`_bytes`, `_seconds`), `_total` on counters, labels for what varies. A peer is
//! named by its `Name` and public key, never by its endpoint address.

use std::collections::HashMap;
use std::io::{self, Write};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest request head read (request line and headers).
pub const MAX_HEAD: usize = 8192;

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A metric family: its name, type and `HELP` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    U(u64),
    I(i64),
    F(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::U(u64::from(v))
    }
}

/// The exposition writer: a family's `HELP` and `TYPE` lines, then its samples. The
/// caller writes each family's samples together, as the format asks.
pub struct Writer<W: Write> {
    out: W,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Writer<W> {
        Writer { out }
    }

    /// The `# HELP` and `# TYPE` lines of `f`.
    pub fn family(&mut self, f: &Family) -> io::Result<()> {
        debug_assert!(valid_name(f.name), "{}", f.name);
        self.out.write_all(b"# HELP ")?;
        self.out.write_all(f.name.as_bytes())?;
        self.out.write_all(b" ")?;
        escape(&mut self.out, f.help, false)?;
        write!(self.out, "\n# TYPE {} {}\n", f.name, f.kind.name())
    }

    /// One sample line: `name{label="value",...} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: Value) -> io::Result<()> {
        self.out.write_all(name.as_bytes())?;
        if !labels.is_empty() {
            self.out.write_all(b"{")?;
            for (i, (k, val)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k) && !k.contains(':'), "{k}");
                if i > 0 {
                    self.out.write_all(b",")?;
                }
                self.out.write_all(k.as_bytes())?;
                self.out.write_all(b"=\"")?;
                escape(&mut self.out, val, true)?;
                self.out.write_all(b"\"")?;
            }
            self.out.write_all(b"}")?;
        }
        match v {
            Value::U(n) => writeln!(self.out, " {n}"),
            Value::I(n) => writeln!(self.out, " {n}"),
            Value::F(x) if x.is_nan() => self.out.write_all(b" NaN\n"),
            Value::F(x) if x.is_infinite() => {
                self.out
                    .write_all(if x > 0.0 { b" +Inf\n" } else { b" -Inf\n" })
            }
            Value::F(x) => writeln!(self.out, " {x}"),
        }
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, f: &Family, v: Value) -> io::Result<()> {
        self.family(f)?;
        self.sample(f.name, &[], v)
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Escape `s` as the format asks: `\` and newline in `HELP` text, and `"` too in a
/// label value.
fn escape(out: &mut impl Write, s: &str, label: bool) -> io::Result<()> {
    let b = s.as_bytes();
    let mut from = 0;
    for (i, &c) in b.iter().enumerate() {
        let rep: &[u8] = match c {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'"' if label => b"\\\"",
            _ => continue,
        };
        out.write_all(&b[from..i])?;
        out.write_all(rep)?;
        from = i + 1;
    }
    out.write_all(&b[from..])
}

/// A metric or label name as Prometheus accepts it: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn valid_name(s: &str) -> bool {
    let mut it = s.bytes();
    matches!(it.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && it.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

// ---- the families ----------------------------------------------------------------------

pub const PEER_RX_BYTES: Family = counter(
    "riceguard_peer_receive_bytes_total",
    "Bytes of WireGuard messages received from the peer (UAPI rx_bytes).",
);
pub const PEER_TX_BYTES: Family = counter(
    "riceguard_peer_transmit_bytes_total",
    "Bytes of WireGuard messages sent to the peer (UAPI tx_bytes).",
);
pub const PEER_HANDSHAKE: Family = gauge(
    "riceguard_peer_latest_handshake_seconds",
    "Unix time of the peer's latest completed handshake, 0 if none.",
);
pub const PEER_HANDSHAKE_ATTEMPTS: Family = counter(
    "riceguard_peer_handshake_attempts_total",
    "Handshake initiations sent to the peer (UDP and TCP).",
);
pub const PEER_TRANSPORT: Family = gauge(
    "riceguard_peer_transport",
    "1 for the transport of the peer's latest authenticated packet (udp or tcp); both 0 without an endpoint.",
);
pub const PEER_ENABLED: Family = gauge(
    "riceguard_peer_enabled",
    "1 for a peer the device runs, 0 for one the configuration lists as disabled.",
);
pub const PEER_RX_PACKETS: Family = counter(
    "riceguard_peer_receive_packets_total",
    "WireGuard messages received from the peer.",
);
pub const PEER_TX_PACKETS: Family = counter(
    "riceguard_peer_transmit_packets_total",
    "WireGuard messages sent to the peer.",
);
pub const PEER_ENDPOINT_CHANGES: Family = counter(
    "riceguard_peer_endpoint_changes_total",
    "Times the peer's endpoint moved (roaming).",
);
pub const PEER_ACCESS_DROPS: Family = counter(
    "riceguard_peer_access_drops_total",
    "Packets the peer started towards what its Access does not allow, dropped by the firewall (restricted peers only).",
);
pub const PEER_HANDSHAKE_FAILURES: Family = counter(
    "riceguard_peer_handshake_failures_total",
    "Handshakes with the peer that failed.",
);
pub const PEER_LAST_RX_AGE: Family = gauge(
    "riceguard_peer_last_receive_age_seconds",
    "Seconds since the last packet received from the peer (absent: never).",
);
pub const PEER_HEALTH: Family = gauge(
    "riceguard_peer_health",
    "1 for the peer's health state now (up, idle, stale, never), 0 for the others.",
);
pub const PEER_SHARED_KEY: Family = gauge(
    "riceguard_peer_shared_key_devices",
    "1 when two devices seem to use the peer's key at once.",
);

pub const DEVICE_DROPS: Family = counter(
    "riceguard_device_drops_total",
    "Input the WireGuard device dropped, by cause.",
);
pub const DNS_EVENTS: Family = counter(
    "riceguard_dns_events_total",
    "The resolver on the box: queries, how they were answered (local, cache_hit, forwarded), refused (rate_limited, malformed), upstream datagrams ignored (upstream_mismatched), forwards unanswered (upstream_timeout), and address records dropped as DNS rebinding (rebinding_dropped).",
);
pub const FIREWALL_DROPS: Family = counter(
    "riceguard_firewall_drops_total",
    "Packets the appliance's firewall dropped, by counter (the nftables counters).",
);
pub const FIREWALL_ON: Family = gauge(
    "riceguard_firewall_table_present",
    "1 while the firewall's table inet riceguard is in the kernel.",
);
pub const OFFLOAD: Family = gauge(
    "riceguard_offload_info",
    "1, labelled with the UDP send offload chosen at start (uso, gso, sendmmsg).",
);
pub const TCP_OPEN: Family = gauge(
    "riceguard_tcp_fallback_connections",
    "TCP-fallback connections open now.",
);
pub const TCP_ACCEPTED: Family = counter(
    "riceguard_tcp_fallback_accepted_total",
    "Inbound TCP-fallback connections admitted.",
);
pub const UPTIME: Family = gauge(
    "riceguard_daemon_uptime_seconds",
    "Seconds since the daemon started.",
);
pub const BUILD_INFO: Family = gauge(
    "riceguard_build_info",
    "1, labelled with the firmware version and build.",
);
pub const WORKER_ROUNDS: Family = counter(
    "riceguard_worker_rounds_total",
    "Rounds of each data-plane worker's loop (its heartbeat).",
);
pub const WORKER_CPU: Family = counter(
    "riceguard_worker_cpu_seconds_total",
    "CPU time of each data-plane worker thread (user and system).",
);
pub const LEASE_LEFT: Family = gauge(
    "riceguard_dhcp_lease_remaining_seconds",
    "Seconds left of the uplink's DHCP lease, per interface.",
);
pub const NTP_SERVERS: Family = gauge(
    "riceguard_ntp_servers",
    "NTP servers in use by the SNTP client.",
);
pub const NTP_SYNC_AGE: Family = gauge(
    "riceguard_ntp_last_sync_age_seconds",
    "Seconds since the clock was last set from an NTP answer (absent: never this boot).",
);
pub const CLOCK_SOURCE: Family = gauge(
    "riceguard_clock_source_info",
    "1, labelled with where the clock came from at boot (rtc, saved, build, host).",
);
pub const BOOT_SLOT: Family = gauge(
    "riceguard_boot_slot_info",
    "1, labelled with the slot this boot runs (a or b).",
);
pub const BOOT_GOOD: Family = gauge(
    "riceguard_boot_marked_good",
    "1 once init marked this boot good (the gateway healthy: an update's trial is over), 0 before.",
);
pub const SERVICE_RESTARTS: Family = counter(
    "riceguard_service_restarts_total",
    "Restarts of each service init supervises, this boot.",
);
pub const SERVICE_UP: Family = gauge(
    "riceguard_service_running",
    "1 while the supervised service runs.",
);
pub const SCRAPE_PEERS: Family = gauge(
    "riceguard_peers",
    "Peers in the configuration (enabled or not).",
);

/// Every family, for tests and the README's list.
pub const FAMILIES: &[Family] = &[
    PEER_RX_BYTES,
    PEER_TX_BYTES,
    PEER_HANDSHAKE,
    PEER_HANDSHAKE_ATTEMPTS,
    PEER_TRANSPORT,
    PEER_ENABLED,
    PEER_RX_PACKETS,
    PEER_TX_PACKETS,
    PEER_ENDPOINT_CHANGES,
    PEER_HANDSHAKE_FAILURES,
    PEER_LAST_RX_AGE,
    PEER_HEALTH,
    PEER_SHARED_KEY,
    PEER_ACCESS_DROPS,
    DEVICE_DROPS,
    FIREWALL_DROPS,
    DNS_EVENTS,
    FIREWALL_ON,
    OFFLOAD,
    TCP_OPEN,
    TCP_ACCEPTED,
    UPTIME,
    BUILD_INFO,
    WORKER_ROUNDS,
    WORKER_CPU,
    LEASE_LEFT,
    NTP_SERVERS,
    NTP_SYNC_AGE,
    CLOCK_SOURCE,
    BOOT_SLOT,
    BOOT_GOOD,
    SERVICE_RESTARTS,
    SERVICE_UP,
    SCRAPE_PEERS,
];

// ---- what is written ---------------------------------------------------------------------

/// How a peer was last reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// The figures the device has per peer beyond bytes (`None`: this firmware's device does
/// not count it, the family is left out).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerExtra {
    pub rx_packets: Option<u64>,
    pub tx_packets: Option<u64>,
    pub endpoint_changes: Option<u64>,
    pub handshake_failures: Option<u64>,
    /// Seconds since the last packet received (`Some(None)`: never).
    pub last_rx_age: Option<Option<f64>>,
    /// One of [`HEALTH_STATES`].
    pub health: Option<&'static str>,
    pub shared_key_devices: Option<bool>,
    /// The firewall's drops of what this peer may not start (`None`: not restricted, or
    /// no table).
    pub access_drops: Option<u64>,
}

/// The health states `riceguard_peer_health` is one-hot over.
pub const HEALTH_STATES: [&str; 4] = ["up", "idle", "stale", "never"];

/// One peer's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerMetrics {
    /// `Name`, or empty.
    pub name: String,
    /// Base64.
    pub public_key: String,
    /// In the device (a disabled peer is only in the configuration: all zero).
    pub enabled: bool,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Unix seconds, 0 if none.
    pub latest_handshake: u64,
    pub handshake_attempts: u64,
    pub transport: Option<Transport>,
    pub extra: PeerExtra,
}

impl PeerMetrics {
    /// A peer with nothing counted yet (a disabled one, or just added).
    pub fn new(name: &str, public_key: String, enabled: bool) -> PeerMetrics {
        PeerMetrics {
            name: name.to_string(),
            public_key,
            enabled,
            rx_bytes: 0,
            tx_bytes: 0,
            latest_handshake: 0,
            handshake_attempts: 0,
            transport: None,
            extra: PeerExtra::default(),
        }
    }
}

/// A service init supervises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFigures {
    pub name: String,
    pub restarts: u64,
    pub running: bool,
}

/// The gateway's own figures. `None` or empty: not known here (a host without init, a
/// drop-in daemon), the family is left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GatewayMetrics {
    pub version: String,
    pub build: String,
    pub uptime_seconds: f64,
    pub device_drops: Vec<(&'static str, u64)>,
    /// The nftables counters by name (`None`: no table).
    pub firewall_drops: Option<Vec<(String, u64)>>,
    pub offload: String,
    /// TCP-fallback transport: (open now, accepted in all); `None`: no transport.
    pub tcp: Option<(u64, u64)>,
    /// Per worker: rounds, and CPU seconds when read.
    pub workers: Vec<(u64, Option<f64>)>,
    /// Per uplink interface: seconds left of its lease.
    pub leases: Vec<(String, u64)>,
    pub ntp_servers: Option<u64>,
    pub ntp_sync_age: Option<f64>,
    pub clock_source: Option<String>,
    /// Init's figures: the slot, and whether the boot was marked good.
    pub boot: Option<(String, bool)>,
    pub services: Vec<ServiceFigures>,
    /// The resolver's counts by event (`None`: no resolver in this daemon).
    pub dns: Option<Vec<(&'static str, u64)>>,
}

fn peer_family<W: Write>(
    w: &mut Writer<W>,
    f: &Family,
    peers: &[PeerMetrics],
    v: impl Fn(&PeerMetrics) -> Option<Value>,
) -> io::Result<()> {
    let mut head = false;
    for p in peers {
        let Some(x) = v(p) else { continue };
        if !head {
            w.family(f)?;
            head = true;
        }
        w.sample(
            f.name,
            &[("name", &p.name), ("public_key", &p.public_key)],
            x,
        )?;
    }
    Ok(())
}

/// Write the whole exposition: the gateway's families, then the peers' (each family's
/// samples together, as the format asks: one pass over `peers` per family).
pub fn write_exposition<W: Write>(
    out: W,
    g: &GatewayMetrics,
    peers: &[PeerMetrics],
) -> io::Result<W> {
    let mut w = Writer::new(out);
    w.family(&BUILD_INFO)?;
    w.sample(
        BUILD_INFO.name,
        &[("version", &g.version), ("build", &g.build)],
        Value::U(1),
    )?;
    w.single(&UPTIME, Value::F(g.uptime_seconds))?;
    w.single(&SCRAPE_PEERS, Value::U(peers.len() as u64))?;
    w.family(&DEVICE_DROPS)?;
    for (cause, n) in &g.device_drops {
        w.sample(DEVICE_DROPS.name, &[("cause", cause)], Value::U(*n))?;
    }
    w.single(&FIREWALL_ON, g.firewall_drops.is_some().into())?;
    if let Some(fw) = &g.firewall_drops {
        w.family(&FIREWALL_DROPS)?;
        for (cause, n) in fw {
            w.sample(FIREWALL_DROPS.name, &[("counter", cause)], Value::U(*n))?;
        }
    }
    if let Some(dns) = &g.dns {
        w.family(&DNS_EVENTS)?;
        for (event, n) in dns {
            w.sample(DNS_EVENTS.name, &[("event", event)], Value::U(*n))?;
        }
    }
    w.family(&OFFLOAD)?;
    w.sample(OFFLOAD.name, &[("chain", &g.offload)], Value::U(1))?;
    if let Some((open, accepted)) = g.tcp {
        w.single(&TCP_OPEN, Value::U(open))?;
        w.single(&TCP_ACCEPTED, Value::U(accepted))?;
    }
    if !g.workers.is_empty() {
        w.family(&WORKER_ROUNDS)?;
        for (i, (rounds, _)) in g.workers.iter().enumerate() {
            w.sample(
                WORKER_ROUNDS.name,
                &[("worker", &i.to_string())],
                Value::U(*rounds),
            )?;
        }
        if g.workers.iter().any(|(_, c)| c.is_some()) {
            w.family(&WORKER_CPU)?;
            for (i, (_, cpu)) in g.workers.iter().enumerate() {
                if let Some(c) = cpu {
                    w.sample(WORKER_CPU.name, &[("worker", &i.to_string())], Value::F(*c))?;
                }
            }
        }
    }
    if !g.leases.is_empty() {
        w.family(&LEASE_LEFT)?;
        for (iface, left) in &g.leases {
            w.sample(LEASE_LEFT.name, &[("interface", iface)], Value::U(*left))?;
        }
    }
    if let Some(n) = g.ntp_servers {
        w.single(&NTP_SERVERS, Value::U(n))?;
    }
    if let Some(a) = g.ntp_sync_age {
        w.single(&NTP_SYNC_AGE, Value::F(a))?;
    }
    if let Some(s) = &g.clock_source {
        w.family(&CLOCK_SOURCE)?;
        w.sample(CLOCK_SOURCE.name, &[("source", s)], Value::U(1))?;
    }
    if let Some((slot, marked)) = &g.boot {
        w.family(&BOOT_SLOT)?;
        w.sample(BOOT_SLOT.name, &[("slot", slot)], Value::U(1))?;
        w.single(&BOOT_GOOD, (*marked).into())?;
    }
    if !g.services.is_empty() {
        w.family(&SERVICE_RESTARTS)?;
        for s in &g.services {
            w.sample(
                SERVICE_RESTARTS.name,
                &[("service", &s.name)],
                Value::U(s.restarts),
            )?;
        }
        w.family(&SERVICE_UP)?;
        for s in &g.services {
            w.sample(SERVICE_UP.name, &[("service", &s.name)], s.running.into())?;
        }
    }

    peer_family(&mut w, &PEER_ENABLED, peers, |p| Some(p.enabled.into()))?;
    peer_family(&mut w, &PEER_RX_BYTES, peers, |p| Some(p.rx_bytes.into()))?;
    peer_family(&mut w, &PEER_TX_BYTES, peers, |p| Some(p.tx_bytes.into()))?;
    peer_family(&mut w, &PEER_HANDSHAKE, peers, |p| {
        Some(p.latest_handshake.into())
    })?;
    peer_family(&mut w, &PEER_HANDSHAKE_ATTEMPTS, peers, |p| {
        Some(p.handshake_attempts.into())
    })?;
    if !peers.is_empty() {
        w.family(&PEER_TRANSPORT)?;
        for p in peers {
            for (t, label) in [(Transport::Udp, "udp"), (Transport::Tcp, "tcp")] {
                w.sample(
                    PEER_TRANSPORT.name,
                    &[
                        ("name", &p.name),
                        ("public_key", &p.public_key),
                        ("transport", label),
                    ],
                    (p.transport == Some(t)).into(),
                )?;
            }
        }
    }
    peer_family(&mut w, &PEER_RX_PACKETS, peers, |p| {
        p.extra.rx_packets.map(Value::U)
    })?;
    peer_family(&mut w, &PEER_TX_PACKETS, peers, |p| {
        p.extra.tx_packets.map(Value::U)
    })?;
    peer_family(&mut w, &PEER_ENDPOINT_CHANGES, peers, |p| {
        p.extra.endpoint_changes.map(Value::U)
    })?;
    peer_family(&mut w, &PEER_HANDSHAKE_FAILURES, peers, |p| {
        p.extra.handshake_failures.map(Value::U)
    })?;
    peer_family(&mut w, &PEER_LAST_RX_AGE, peers, |p| {
        p.extra.last_rx_age.flatten().map(Value::F)
    })?;
    peer_family(&mut w, &PEER_SHARED_KEY, peers, |p| {
        p.extra.shared_key_devices.map(Value::from)
    })?;
    peer_family(&mut w, &PEER_ACCESS_DROPS, peers, |p| {
        p.extra.access_drops.map(Value::U)
    })?;
    if peers.iter().any(|p| p.extra.health.is_some()) {
        w.family(&PEER_HEALTH)?;
        for p in peers {
            let Some(h) = p.extra.health else { continue };
            for s in HEALTH_STATES {
                w.sample(
                    PEER_HEALTH.name,
                    &[
                        ("name", &p.name),
                        ("public_key", &p.public_key),
                        ("state", s),
                    ],
                    (h == s).into(),
                )?;
            }
        }
    }
    Ok(w.into_inner())
}

// ---- counters that never go back -------------------------------------------------------

/// Keeps counters from going back while the daemon runs: a source that restarts from 0
/// (a firewall table removed and installed again, a peer removed and added back) goes on
/// from where it was. Per series: the last raw value and what is added to it.
#[derive(Debug, Default)]
pub struct Monotonic {
    series: HashMap<String, (u64, u64)>,
}

impl Monotonic {
    /// The value to export for series `key` whose source says `raw` now.
    pub fn get(&mut self, key: &str, raw: u64) -> u64 {
        let e = match self.series.get_mut(key) {
            Some(e) => e,
            None => self.series.entry(key.to_string()).or_insert((raw, 0)),
        };
        if raw < e.0 {
            e.1 = e.1.saturating_add(e.0);
        }
        e.0 = raw;
        raw.saturating_add(e.1)
    }

    /// Forget series not `kept` once there are more than `limit` (peers removed long
    /// ago): memory stays bounded by the configuration.
    pub fn prune(&mut self, limit: usize, kept: impl Fn(&str) -> bool) {
        if self.series.len() > limit {
            self.series.retain(|k, _| kept(k));
        }
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

// ---- the HTTP request ----------------------------------------------------------------------

/// What a well-formed request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics`.
    Metrics,
    /// `GET /`: a page with a link.
    Index,
}

/// Why a request is refused, with the status it is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpError {
    /// Not HTTP/1.x as RFC 9112 writes it.
    BadRequest,
    /// Another path.
    NotFound,
    /// Another method than GET.
    MethodNotAllowed,
    /// The head is longer than [`MAX_HEAD`].
    TooLarge,
}

impl HttpError {
    /// The status code and reason phrase.
    pub fn status(self) -> (u16, &'static str) {
        match self {
            HttpError::BadRequest => (400, "Bad Request"),
            HttpError::NotFound => (404, "Not Found"),
            HttpError::MethodNotAllowed => (405, "Method Not Allowed"),
            HttpError::TooLarge => (431, "Request Header Fields Too Large"),
        }
    }
}

/// Where the head in `buf` ends (just past its empty line: `\r\n\r\n`, or `\n\n` from
/// a lenient client), if it has ended.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Judge a request head (request line, headers, the empty line; at most [`MAX_HEAD`]).
/// Methods other than GET are 405 whatever the path; the query string is ignored.
pub fn parse_request(head: &[u8]) -> Result<Route, HttpError> {
    if head.len() > MAX_HEAD {
        return Err(HttpError::TooLarge);
    }
    // One head, ending with its empty line, and nothing after it (a GET has no body).
    if head_end(head) != Some(head.len()) {
        return Err(HttpError::BadRequest);
    }
    let text = std::str::from_utf8(head).map_err(|_| HttpError::BadRequest)?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request = lines.next().ok_or(HttpError::BadRequest)?;
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequest);
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(HttpError::BadRequest);
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::BadRequest);
    }
    if !target.starts_with('/') || !target.bytes().all(|c| c.is_ascii_graphic()) {
        return Err(HttpError::BadRequest);
    }
    let mut ended = false;
    for l in lines {
        if ended {
            // Only the empty line's own end may follow it.
            if !l.is_empty() {
                return Err(HttpError::BadRequest);
            }
            continue;
        }
        if l.is_empty() {
            ended = true;
            continue;
        }
        let (name, value) = l.split_once(':').ok_or(HttpError::BadRequest)?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(HttpError::BadRequest);
        }
        if value.bytes().any(|c| c.is_ascii_control() && c != b'\t') {
            return Err(HttpError::BadRequest);
        }
    }
    if !ended {
        return Err(HttpError::BadRequest);
    }
    if method != "GET" {
        return Err(HttpError::MethodNotAllowed);
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    match path {
        "/metrics" => Ok(Route::Metrics),
        "/" => Ok(Route::Index),
        _ => Err(HttpError::NotFound),
    }
}

/// A response head: status line, `Content-Type`, `Connection: close` (the body runs to
/// the end of the connection, so no length is needed: the exposition is streamed).
pub fn response_head(code: u16, reason: &str, content_type: &str, allow_get: bool) -> String {
    let allow = if allow_get { "Allow: GET\r\n" } else { "" };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
}

/// The index page's body.
pub const INDEX_PAGE: &str = "<html><head><title>RiceGuard</title></head><body><h1>RiceGuard</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

#[cfg(test)]
mod tests;
