//! The cross-platform userspace API of wireguard-go (the text protocol `wg` speaks on
//! `/var/run/wireguard/IFNAME.sock`): reading requests, applying a `set` to a
//! [`Config`], writing `get` answers and errnos, reading them back (the console does),
//! and computing the minimal `set` between two configurations.
//!
//! Pure: the driver owns the socket and the live state; it calls [`read_request`] on a
//! buffered reader, [`apply_set`] on its current configuration, and writes what
//! [`emit_get`] / [`emit_errno`] return.
//!
//! Behaviour follows wireguard-go's `device/uapi.go` with these deliberate differences:
//! - a `set` is parsed in full before anything changes and applied whole or not at all
//!   (wireguard-go applies line by line and leaves earlier lines applied on error);
//! - after a bad line the rest of the request is still read up to its blank line, so
//!   the answer `errno=-22` arrives and the connection stays usable;
//! - a `set` whose input ends inside a line (the client went away mid-request) is
//!   refused (`EIO`): the cut line may be the front of another value; wireguard-go's
//!   scanner would apply it;
//! - an endpoint with port 0 is refused (`EINVAL`): nothing can be sent there and the
//!   configuration file could not hold it;
//! - within one peer block, order between lines is summarised: `replace_allowed_ips`
//!   after `allowed_ip` lines drops those earlier prefixes without first taking them
//!   from other peers, and `update_only` after other lines for a new peer drops the
//!   whole block (wireguard-go would briefly create the peer and move prefixes to it).
//!   `wg` never sends either order.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io::BufRead;
use std::net::SocketAddr;

use crate::core::config::{Config, Endpoint, PeerConfig};
use crate::core::key::Key;
use crate::core::net::Cidr;

/// errno values as wireguard-go's `ipc` package names them (Linux numbering; the wire
/// carries them negated: `errno=-22`).
pub const EIO: i32 = 5;
pub const EINVAL: i32 = 22;
pub const ENOANO: i32 = 55;
pub const EPROTO: i32 = 71;
pub const EADDRINUSE: i32 = 98;

/// Largest request read from the socket (about 20 000 peers as `wg setconf` writes them).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Longest line; the longest legitimate one (an IPv6 endpoint) is under 100 bytes.
pub const MAX_LINE_BYTES: usize = 4096;
/// wireguard-go's limit on peers per device.
pub const MAX_PEERS: usize = 1 << 16;

/// Why a UAPI exchange failed. [`UapiError::errno`] is the value to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UapiError {
    /// The peer closed the connection before a request began: nothing to answer.
    Closed,
    /// The first line was not `get=1` or `set=1`. wireguard-go closes the connection
    /// without an answer; so should the driver.
    UnknownOperation(String),
    /// Reading failed, the input ended inside a request or exceeded the limits (EIO).
    Io(String),
    /// A line without `=` (EPROTO).
    Protocol(String),
    /// An unknown key or a bad value (EINVAL).
    Invalid(String),
    /// The listen port could not be bound (EADDRINUSE; raised by the driver).
    PortInUse(String),
    /// A `get`/`set` answer carried this (wire, usually negative) errno.
    Remote(i32),
}

impl UapiError {
    /// The errno to put on the wire, as wireguard-go does: negative.
    pub fn errno(&self) -> i32 {
        match self {
            UapiError::Io(_) => -EIO,
            UapiError::Protocol(_) | UapiError::Closed | UapiError::UnknownOperation(_) => -EPROTO,
            UapiError::Invalid(_) => -EINVAL,
            UapiError::PortInUse(_) => -EADDRINUSE,
            UapiError::Remote(e) => *e,
        }
    }

    /// Whether the driver should answer with `errno=` (false: just close).
    pub fn answers(&self) -> bool {
        !matches!(self, UapiError::Closed | UapiError::UnknownOperation(_))
    }
}

impl fmt::Display for UapiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UapiError::Closed => f.write_str("UAPI connection closed"),
            UapiError::UnknownOperation(l) => {
                write!(f, "invalid UAPI operation {l:?} (expected get=1 or set=1)")
            }
            UapiError::Io(m)
            | UapiError::Protocol(m)
            | UapiError::Invalid(m)
            | UapiError::PortInUse(m) => {
                write!(f, "UAPI error {}: {m}", self.errno())
            }
            UapiError::Remote(e) => write!(f, "the device answered errno={e}"),
        }
    }
}

impl std::error::Error for UapiError {}

/// One request read from the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(SetRequest),
}

/// A parsed `set=1` request. `None` fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetRequest {
    /// The all-zero key removes the private key.
    pub private_key: Option<Key>,
    /// 0 means "pick a port".
    pub listen_port: Option<u16>,
    /// 0 means off.
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    /// Peer blocks in request order; one key may appear in several blocks.
    pub peers: Vec<PeerSet>,
}

/// One `public_key=` block of a set request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSet {
    pub public_key: Key,
    pub remove: bool,
    pub update_only: bool,
    /// The all-zero key means "no preshared key".
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    /// 0 means off.
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    /// Masked prefixes, in request order.
    pub allowed_ips: Vec<Cidr>,
    pub protocol_version: Option<u32>,
}

impl PeerSet {
    pub fn new(public_key: Key) -> PeerSet {
        PeerSet {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
            protocol_version: None,
        }
    }
}

/// Read one line (without its `\n`) of at most [`MAX_LINE_BYTES`], charging `budget`.
/// `Ok(None)` at end of input before any byte; `Ok(Some((line, terminated)))` otherwise.
fn read_line(
    r: &mut impl BufRead,
    budget: &mut usize,
) -> Result<Option<(String, bool)>, UapiError> {
    let mut line: Vec<u8> = Vec::new();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(UapiError::Io(format!("failed to read input: {e}"))),
        };
        if buf.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            return Ok(Some((String::from_utf8_lossy(&line).into_owned(), false)));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(p) => (p + 1, true),
            None => (buf.len(), false),
        };
        if take > *budget {
            return Err(UapiError::Io(format!(
                "request longer than {MAX_REQUEST_BYTES} bytes"
            )));
        }
        *budget -= take;
        let body = if done { &buf[..take - 1] } else { &buf[..take] };
        if line.len() + body.len() > MAX_LINE_BYTES {
            return Err(UapiError::Io(format!(
                "line longer than {MAX_LINE_BYTES} bytes"
            )));
        }
        line.extend_from_slice(body);
        r.consume(take);
        if done {
            return Ok(Some((String::from_utf8_lossy(&line).into_owned(), true)));
        }
    }
}

/// Go's `strconv.ParseUint(v, 10, bits)`: decimal digits only, no sign, must fit.
fn parse_uint<T: std::str::FromStr>(v: &str) -> Option<T> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

fn invalid(what: &str, value: &str) -> UapiError {
    let v: String = value.chars().take(80).collect();
    UapiError::Invalid(format!("{what}: {v:?}"))
}

fn hex_key(v: &str, what: &str) -> Result<Key, UapiError> {
    Key::from_hex(v)
        .map_err(|_| invalid(&format!("failed to set {what} (expected 64 hex digits)"), v))
}

/// `netip.ParsePrefix`: an address, `/`, a length; the prefix is stored masked.
fn parse_prefix(v: &str) -> Result<Cidr, UapiError> {
    let bad = || invalid("failed to set allowed ip (expected ADDRESS/LENGTH)", v);
    if !v.contains('/') || v.trim() != v {
        return Err(bad());
    }
    v.parse::<Cidr>().map(|c| c.network()).map_err(|_| bad())
}

fn parse_endpoint(v: &str) -> Result<SocketAddr, UapiError> {
    match v.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        _ => Err(invalid(
            "failed to set endpoint (expected IPv4:PORT or [IPv6]:PORT, port 1-65535)",
            v,
        )),
    }
}

/// Parse one `key=value` line of a set request into `req`. `ignoring` is true after a
/// `remove=true` in the current peer block: later lines are checked but have no effect.
fn set_line(req: &mut SetRequest, ignoring: &mut bool, line: &str) -> Result<(), UapiError> {
    let (key, value) = line.split_once('=').ok_or_else(|| {
        UapiError::Protocol(format!(
            "failed to parse line {:?}",
            line.chars().take(80).collect::<String>()
        ))
    })?;
    if key == "public_key" {
        let k = hex_key(value, "public_key")?;
        req.peers.push(PeerSet::new(k));
        *ignoring = false;
        return Ok(());
    }
    let Some(peer) = req.peers.last_mut() else {
        match key {
            "private_key" => req.private_key = Some(hex_key(value, "private_key")?),
            "listen_port" => {
                req.listen_port = Some(
                    parse_uint(value)
                        .ok_or_else(|| invalid("failed to parse listen_port", value))?,
                )
            }
            "fwmark" => {
                req.fwmark =
                    Some(parse_uint(value).ok_or_else(|| invalid("invalid fwmark", value))?)
            }
            "replace_peers" => {
                if value != "true" {
                    return Err(invalid("failed to set replace_peers, invalid value", value));
                }
                req.replace_peers = true;
            }
            _ => return Err(invalid("invalid UAPI device key", key)),
        }
        return Ok(());
    };
    match key {
        "update_only" => {
            if value != "true" {
                return Err(invalid("failed to set update only, invalid value", value));
            }
            if !*ignoring {
                peer.update_only = true;
            }
        }
        "remove" => {
            if value != "true" {
                return Err(invalid("failed to set remove, invalid value", value));
            }
            if !*ignoring {
                peer.remove = true;
            }
            *ignoring = true;
        }
        "preshared_key" => {
            let k = hex_key(value, "preshared key")?;
            if !*ignoring {
                peer.preshared_key = Some(k);
            }
        }
        "endpoint" => {
            let a = parse_endpoint(value)?;
            if !*ignoring {
                peer.endpoint = Some(a);
            }
        }
        "persistent_keepalive_interval" => {
            let s = parse_uint(value)
                .ok_or_else(|| invalid("failed to set persistent keepalive interval", value))?;
            if !*ignoring {
                peer.persistent_keepalive = Some(s);
            }
        }
        "replace_allowed_ips" => {
            if value != "true" {
                return Err(invalid(
                    "failed to replace allowedips, invalid value",
                    value,
                ));
            }
            if !*ignoring {
                peer.replace_allowed_ips = true;
                peer.allowed_ips.clear();
            }
        }
        "allowed_ip" => {
            let c = parse_prefix(value)?;
            if !*ignoring {
                peer.allowed_ips.push(c);
            }
        }
        "protocol_version" => {
            if value != "1" {
                return Err(invalid("invalid protocol version", value));
            }
            if !*ignoring {
                peer.protocol_version = Some(1);
            }
        }
        _ => return Err(invalid("invalid UAPI peer key", key)),
    }
    Ok(())
}

/// Read one request. `get=1` must be followed by an empty line; `set=1` by `key=value`
/// lines ending with an empty line (or the end of input after a whole line, as
/// wireguard-go accepts). Input that ends inside a line (a client gone mid-request) is
/// refused whole: `listen_port=4` may be the front of `listen_port=48000`.
/// Bounded by [`MAX_REQUEST_BYTES`] and [`MAX_LINE_BYTES`]. After a bad line the rest of
/// the set request is consumed, so the connection can carry the next request; after an
/// [`UapiError::Io`] (limits, read failure) the stream position is unknown: answer and
/// close the connection.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, UapiError> {
    let mut budget = MAX_REQUEST_BYTES;
    let (op, terminated) = match read_line(r, &mut budget)? {
        None => return Err(UapiError::Closed),
        Some(l) => l,
    };
    if !terminated {
        return Err(UapiError::Closed);
    }
    match op.as_str() {
        "get=1" => match read_line(r, &mut budget)? {
            None => Err(UapiError::Closed),
            Some((l, _)) if l.is_empty() => Ok(Request::Get),
            Some((l, _)) => Err(invalid("trailing characters in UAPI get", &l)),
        },
        "set=1" => {
            let mut req = SetRequest::default();
            let mut ignoring = false;
            let mut first_err: Option<UapiError> = None;
            while let Some((line, terminated)) = read_line(r, &mut budget)? {
                if !terminated {
                    return Err(UapiError::Io(format!(
                        "set request cut off inside a line ({:?})",
                        line.chars().take(40).collect::<String>()
                    )));
                }
                if line.is_empty() {
                    break;
                }
                if first_err.is_none() {
                    if let Err(e) = set_line(&mut req, &mut ignoring, &line) {
                        first_err = Some(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(Request::Set(req)),
            }
        }
        _ => Err(UapiError::UnknownOperation(op.chars().take(80).collect())),
    }
}

/// Write a set request as `wg` would send it (with `set=1` and the closing blank line).
pub fn emit_set(req: &SetRequest) -> String {
    let mut s = String::from("set=1\n");
    if let Some(k) = &req.private_key {
        let _ = writeln!(s, "private_key={}", k.to_hex());
    }
    if let Some(p) = req.listen_port {
        let _ = writeln!(s, "listen_port={p}");
    }
    if let Some(m) = req.fwmark {
        let _ = writeln!(s, "fwmark={m}");
    }
    if req.replace_peers {
        s.push_str("replace_peers=true\n");
    }
    for p in &req.peers {
        let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
        if p.update_only {
            s.push_str("update_only=true\n");
        }
        if let Some(v) = p.protocol_version {
            let _ = writeln!(s, "protocol_version={v}");
        }
        if let Some(k) = &p.preshared_key {
            let _ = writeln!(s, "preshared_key={}", k.to_hex());
        }
        if let Some(e) = &p.endpoint {
            let _ = writeln!(s, "endpoint={e}");
        }
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(s, "persistent_keepalive_interval={k}");
        }
        if p.replace_allowed_ips {
            s.push_str("replace_allowed_ips=true\n");
        }
        for c in &p.allowed_ips {
            let _ = writeln!(s, "allowed_ip={}", c.network());
        }
        // Last, so the fields above (which a removed peer ignores) still read back.
        if p.remove {
            s.push_str("remove=true\n");
        }
    }
    s.push('\n');
    s
}

/// Apply a set request to `cfg` and return the new whole configuration; `cfg` is not
/// touched, so an error leaves everything as it was. Semantics as wireguard-go:
/// - a new private key removes any peer whose public key is the new own public key; a
///   peer block for our own public key is ignored;
/// - `replace_peers` drops every peer first; `remove` drops the peer (after its
///   earlier lines, which may have moved prefixes to it, have been applied);
/// - `update_only` skips a peer that does not exist yet;
/// - an allowed IP given to one peer is taken away from whichever peer had it;
/// - zero keys, keepalive 0, fwmark 0 and listen port 0 mean "none"/"off"/"pick".
///
/// Settings the UAPI does not know (addresses, MTU, `TcpPort`, `[Gateway]`) are kept.
pub fn apply_set(cfg: &Config, req: &SetRequest) -> Result<Config, UapiError> {
    let mut new = cfg.clone();
    if let Some(k) = req.private_key {
        if k.is_zero() {
            new.interface.private_key = None;
        } else {
            new.interface.private_key = Some(k);
            let own = k.public();
            new.peers.retain(|p| p.public_key != own);
        }
    }
    if let Some(p) = req.listen_port {
        new.interface.listen_port = (p != 0).then_some(p);
    }
    if let Some(m) = req.fwmark {
        new.interface.fwmark = (m != 0).then_some(m);
    }
    if req.replace_peers {
        new.peers.clear();
    }
    let own = new.interface.private_key.map(|k| k.public());

    // Work on a tombstoned list so indices stay valid while peers are removed.
    let mut peers: Vec<Option<PeerConfig>> = std::mem::take(&mut new.peers)
        .into_iter()
        .map(Some)
        .collect();
    let mut index: HashMap<Key, usize> = HashMap::with_capacity(peers.len());
    let mut owner: HashMap<Cidr, usize> = HashMap::new();
    let mut live = 0usize;
    // Peers that lost a prefix to another peer; their lists are cleaned at the end.
    let mut dirty: Vec<usize> = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        if let Some(p) = p {
            index.insert(p.public_key, i);
            live += 1;
            for c in &p.allowed_ips {
                owner.insert(c.network(), i);
            }
        }
    }

    for ps in &req.peers {
        if own == Some(ps.public_key) {
            continue;
        }
        let i = match index.get(&ps.public_key) {
            Some(&i) => i,
            None if ps.update_only => continue,
            None => {
                if live >= MAX_PEERS {
                    return Err(UapiError::Invalid(format!(
                        "failed to create new peer: a device holds at most {MAX_PEERS} peers"
                    )));
                }
                peers.push(Some(PeerConfig {
                    public_key: ps.public_key,
                    preshared_key: None,
                    allowed_ips: Vec::new(),
                    endpoint: None,
                    persistent_keepalive: None,
                    tcp_port: None,
                    name: None,
                }));
                live += 1;
                let i = peers.len() - 1;
                index.insert(ps.public_key, i);
                i
            }
        };
        {
            // `index` only holds live slots.
            let Some(p) = peers[i].as_mut() else { continue };
            if let Some(k) = ps.preshared_key {
                p.preshared_key = (!k.is_zero()).then_some(k);
            }
            if let Some(a) = ps.endpoint {
                p.endpoint = Some(Endpoint::Addr(a));
            }
            if let Some(k) = ps.persistent_keepalive {
                p.persistent_keepalive = (k != 0).then_some(k);
            }
            if ps.replace_allowed_ips {
                for c in p.allowed_ips.drain(..) {
                    let c = c.network();
                    if owner.get(&c) == Some(&i) {
                        owner.remove(&c);
                    }
                }
            }
            for c in &ps.allowed_ips {
                let c = c.network();
                match owner.insert(c, i) {
                    Some(o) if o == i => {}
                    prev => {
                        // The previous owner's list keeps a stale entry until the
                        // clean-up below: removing it now would cost a scan per move.
                        // This peer is cleaned too: it may hold a stale copy of a
                        // prefix that moved away earlier in this request.
                        if let Some(o) = prev {
                            dirty.push(o);
                            dirty.push(i);
                        }
                        p.allowed_ips.push(c);
                    }
                }
            }
        }
        if ps.remove {
            if let Some(p) = peers[i].take() {
                for c in &p.allowed_ips {
                    let c = c.network();
                    if owner.get(&c) == Some(&i) {
                        owner.remove(&c);
                    }
                }
                index.remove(&p.public_key);
                live -= 1;
            }
        }
    }
    // Drop entries that moved to another peer. A prefix that moved away and back sits
    // in the list twice; wireguard-go puts a re-added prefix last, so keep the last.
    dirty.sort_unstable();
    dirty.dedup();
    for o in dirty {
        if let Some(p) = peers[o].as_mut() {
            let mut seen = std::collections::HashSet::new();
            let mut keep: Vec<Cidr> = p
                .allowed_ips
                .iter()
                .rev()
                .filter(|c| owner.get(&c.network()) == Some(&o) && seen.insert(c.network()))
                .copied()
                .collect();
            keep.reverse();
            p.allowed_ips = keep;
        }
    }
    new.peers = peers.into_iter().flatten().collect();
    Ok(new)
}

/// The smallest set request that turns `old` into `new` as far as the UAPI can express
/// it: removed peers get `remove=true`, new peers are added in full, changed peers get
/// only the changed fields (`replace_allowed_ips` only when their prefixes changed), and
/// unchanged peers are not mentioned, so their sessions survive.
///
/// The UAPI cannot unset an endpoint: a peer whose endpoint goes away is removed and
/// added again. Endpoints given as names cannot be sent: resolve them first (a `Name`
/// in `new` is left out). Addresses, MTU, `TcpPort` and `[Gateway]` are not UAPI
/// settings and are ignored.
pub fn set_from_diff(old: &Config, new: &Config) -> SetRequest {
    let mut req = SetRequest::default();
    if old.interface.private_key != new.interface.private_key {
        req.private_key = Some(new.interface.private_key.unwrap_or_default());
    }
    if old.interface.listen_port != new.interface.listen_port {
        req.listen_port = Some(new.interface.listen_port.unwrap_or(0));
    }
    if old.interface.fwmark != new.interface.fwmark {
        req.fwmark = Some(new.interface.fwmark.unwrap_or(0));
    }
    let old_by_key: HashMap<Key, &PeerConfig> =
        old.peers.iter().map(|p| (p.public_key, p)).collect();
    let new_keys: std::collections::HashSet<Key> = new.peers.iter().map(|p| p.public_key).collect();
    for p in &old.peers {
        if !new_keys.contains(&p.public_key) {
            let mut ps = PeerSet::new(p.public_key);
            ps.remove = true;
            req.peers.push(ps);
        }
    }
    let addr = |e: &Option<Endpoint>| match e {
        Some(Endpoint::Addr(a)) => Some(*a),
        _ => None,
    };
    let full = |p: &PeerConfig| {
        let mut ps = PeerSet::new(p.public_key);
        ps.preshared_key = p.preshared_key;
        ps.endpoint = addr(&p.endpoint);
        ps.persistent_keepalive = p.persistent_keepalive;
        ps.replace_allowed_ips = true;
        ps.allowed_ips = p.allowed_ips.iter().map(|c| c.network()).collect();
        ps
    };
    for p in &new.peers {
        let Some(o) = old_by_key.get(&p.public_key) else {
            req.peers.push(full(p));
            continue;
        };
        let endpoint_unset = matches!(o.endpoint, Some(Endpoint::Addr(_))) && p.endpoint.is_none();
        if endpoint_unset {
            let mut rm = PeerSet::new(p.public_key);
            rm.remove = true;
            req.peers.push(rm);
            req.peers.push(full(p));
            continue;
        }
        let mut ps = PeerSet::new(p.public_key);
        let mut changed = false;
        if o.preshared_key != p.preshared_key {
            ps.preshared_key = Some(p.preshared_key.unwrap_or_default());
            changed = true;
        }
        if o.endpoint != p.endpoint {
            if let Some(a) = addr(&p.endpoint) {
                ps.endpoint = Some(a);
                changed = true;
            }
        }
        if o.persistent_keepalive != p.persistent_keepalive {
            ps.persistent_keepalive = Some(p.persistent_keepalive.unwrap_or(0));
            changed = true;
        }
        let on: Vec<Cidr> = o.allowed_ips.iter().map(|c| c.network()).collect();
        let nn: Vec<Cidr> = p.allowed_ips.iter().map(|c| c.network()).collect();
        if on != nn {
            ps.replace_allowed_ips = true;
            ps.allowed_ips = nn;
            changed = true;
        }
        if changed {
            req.peers.push(ps);
        }
    }
    req
}

/// What a `get` reports about the device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStatus {
    pub private_key: Option<Key>,
    /// 0 when not bound.
    pub listen_port: u16,
    pub fwmark: Option<u32>,
    pub peers: Vec<PeerStatus>,
}

/// What a `get` reports about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub public_key: Key,
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    /// Seconds and nanoseconds since the UNIX epoch; `None` if never.
    pub last_handshake: Option<(u64, u32)>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: Option<u16>,
    pub allowed_ips: Vec<Cidr>,
    pub protocol_version: u32,
}

impl PeerStatus {
    pub fn new(public_key: Key) -> PeerStatus {
        PeerStatus {
            public_key,
            preshared_key: None,
            endpoint: None,
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
            persistent_keepalive: None,
            allowed_ips: Vec::new(),
            protocol_version: 1,
        }
    }
}

/// The answer to `get=1`, byte for byte as wireguard-go writes it, including the
/// closing `errno=0` and blank line.
pub fn emit_get(st: &DeviceStatus) -> String {
    let mut s = String::with_capacity(128 + st.peers.len() * 400);
    if let Some(k) = st.private_key.filter(|k| !k.is_zero()) {
        let _ = writeln!(s, "private_key={}", k.to_hex());
    }
    if st.listen_port != 0 {
        let _ = writeln!(s, "listen_port={}", st.listen_port);
    }
    if let Some(m) = st.fwmark.filter(|m| *m != 0) {
        let _ = writeln!(s, "fwmark={m}");
    }
    for p in &st.peers {
        let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
        let _ = writeln!(
            s,
            "preshared_key={}",
            p.preshared_key.unwrap_or_default().to_hex()
        );
        let _ = writeln!(s, "protocol_version={}", p.protocol_version);
        if let Some(e) = p.endpoint {
            let _ = writeln!(s, "endpoint={e}");
        }
        let (sec, nsec) = p.last_handshake.unwrap_or((0, 0));
        let _ = writeln!(s, "last_handshake_time_sec={sec}");
        let _ = writeln!(s, "last_handshake_time_nsec={nsec}");
        let _ = writeln!(s, "tx_bytes={}", p.tx_bytes);
        let _ = writeln!(s, "rx_bytes={}", p.rx_bytes);
        let _ = writeln!(
            s,
            "persistent_keepalive_interval={}",
            p.persistent_keepalive.unwrap_or(0)
        );
        for c in &p.allowed_ips {
            let _ = writeln!(s, "allowed_ip={}", c.network());
        }
    }
    s.push_str("errno=0\n\n");
    s
}

/// The status answer of a request: `errno=E` and a blank line (wireguard-go writes
/// negative values for errors).
pub fn emit_errno(e: i32) -> String {
    format!("errno={e}\n\n")
}

/// Parse the answer to `get=1` (up to and including `errno=`). Unknown keys are skipped
/// so newer daemons' extra fields do not break the console; a nonzero errno is
/// returned as [`UapiError::Remote`].
pub fn parse_get_response(text: &str) -> Result<DeviceStatus, UapiError> {
    let mut st = DeviceStatus::default();
    let mut errno: Option<i32> = None;
    for line in text.split('\n') {
        if line.is_empty() {
            if errno.is_some() {
                break;
            }
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            UapiError::Protocol(format!(
                "failed to parse line {:?}",
                line.chars().take(80).collect::<String>()
            ))
        })?;
        let num = |what: &str| parse_uint::<u64>(v).ok_or_else(|| invalid(what, v));
        match k {
            "private_key" => {
                st.private_key = Some(hex_key(v, "private_key")?).filter(|k| !k.is_zero())
            }
            "listen_port" => {
                st.listen_port = parse_uint(v).ok_or_else(|| invalid("bad listen_port", v))?
            }
            "fwmark" => {
                st.fwmark = Some(parse_uint::<u32>(v).ok_or_else(|| invalid("bad fwmark", v))?)
                    .filter(|m| *m != 0)
            }
            "public_key" => st.peers.push(PeerStatus::new(hex_key(v, "public_key")?)),
            "errno" => {
                let e = v.parse::<i32>().map_err(|_| invalid("bad errno", v))?;
                if e != 0 {
                    return Err(UapiError::Remote(e));
                }
                errno = Some(e);
            }
            _ => {
                let Some(p) = st.peers.last_mut() else {
                    continue;
                };
                match k {
                    "preshared_key" => {
                        p.preshared_key =
                            Some(hex_key(v, "preshared_key")?).filter(|k| !k.is_zero())
                    }
                    "protocol_version" => {
                        p.protocol_version =
                            parse_uint(v).ok_or_else(|| invalid("bad protocol_version", v))?
                    }
                    "endpoint" => {
                        p.endpoint = Some(v.parse().map_err(|_| invalid("bad endpoint", v))?)
                    }
                    "last_handshake_time_sec" => {
                        let s = num("bad last_handshake_time_sec")?;
                        let n = p.last_handshake.map_or(0, |(_, n)| n);
                        p.last_handshake = Some((s, n));
                    }
                    "last_handshake_time_nsec" => {
                        let n = parse_uint::<u32>(v)
                            .filter(|n| *n < 1_000_000_000)
                            .ok_or_else(|| invalid("bad last_handshake_time_nsec", v))?;
                        let s = p.last_handshake.map_or(0, |(s, _)| s);
                        p.last_handshake = Some((s, n));
                    }
                    "tx_bytes" => p.tx_bytes = num("bad tx_bytes")?,
                    "rx_bytes" => p.rx_bytes = num("bad rx_bytes")?,
                    "persistent_keepalive_interval" => {
                        let k: u16 = parse_uint(v)
                            .ok_or_else(|| invalid("bad persistent_keepalive_interval", v))?;
                        p.persistent_keepalive = (k != 0).then_some(k);
                    }
                    "allowed_ip" => p.allowed_ips.push(parse_prefix(v)?),
                    _ => {}
                }
            }
        }
    }
    if errno.is_none() {
        return Err(UapiError::Protocol("answer ended without errno=".into()));
    }
    for p in &mut st.peers {
        if p.last_handshake == Some((0, 0)) {
            p.last_handshake = None;
        }
    }
    Ok(st)
}

/// Read a `get` answer from a socket (bounded like requests) and parse it.
pub fn read_get_response(r: &mut impl BufRead) -> Result<DeviceStatus, UapiError> {
    let mut budget = MAX_REQUEST_BYTES;
    let mut text = String::new();
    let mut seen_errno = false;
    while let Some((line, _)) = read_line(r, &mut budget)? {
        if line.is_empty() && seen_errno {
            break;
        }
        seen_errno |= line.starts_with("errno=");
        text.push_str(&line);
        text.push('\n');
    }
    parse_get_response(&text)
}

/// Read the `errno=N` answer to a set request; `Ok(())` for 0.
pub fn read_set_response(r: &mut impl BufRead) -> Result<(), UapiError> {
    let mut budget = MAX_REQUEST_BYTES;
    while let Some((line, _)) = read_line(r, &mut budget)? {
        if let Some(v) = line.strip_prefix("errno=") {
            let e = v.parse::<i32>().map_err(|_| invalid("bad errno", v))?;
            return if e == 0 {
                Ok(())
            } else {
                Err(UapiError::Remote(e))
            };
        }
    }
    Err(UapiError::Io("connection closed before errno=".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ini::tests::{random_config, Rng};
    use std::io::Cursor;

    fn k(b: u8) -> Key {
        Key([b; 32])
    }

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn read(s: &str) -> Result<Request, UapiError> {
        read_request(&mut Cursor::new(s.as_bytes()))
    }

    fn set(s: &str) -> SetRequest {
        match read(s) {
            Ok(Request::Set(r)) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_get_and_set() {
        assert_eq!(read("get=1\n\n"), Ok(Request::Get));
        assert_eq!(read(""), Err(UapiError::Closed));
        assert!(matches!(read("get=1\nx\n"), Err(UapiError::Invalid(_))));
        let e = read("hello\n").unwrap_err();
        assert!(matches!(e, UapiError::UnknownOperation(_)) && !e.answers());
        let r = set(&format!(
            "set=1\nprivate_key={}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\
             public_key={}\nprotocol_version=1\npreshared_key={}\nendpoint=[::1]:5\n\
             persistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.7/24\n\
             allowed_ip=fd00::/64\npublic_key={}\nremove=true\n\n",
            k(1).to_hex(),
            k(2).to_hex(),
            k(3).to_hex(),
            k(4).to_hex()
        ));
        assert_eq!(r.private_key, Some(k(1)));
        assert_eq!(r.listen_port, Some(51820));
        assert_eq!(r.fwmark, Some(0));
        assert!(r.replace_peers);
        assert_eq!(r.peers.len(), 2);
        let p = &r.peers[0];
        assert_eq!(p.public_key, k(2));
        assert_eq!(p.preshared_key, Some(k(3)));
        assert_eq!(p.endpoint, Some("[::1]:5".parse().unwrap()));
        assert_eq!(p.persistent_keepalive, Some(25));
        assert!(p.replace_allowed_ips);
        assert_eq!(p.allowed_ips, vec![c("10.0.0.0/24"), c("fd00::/64")]);
        assert_eq!(p.protocol_version, Some(1));
        assert!(r.peers[1].remove);
        // The emitted form reads back to the same request.
        assert_eq!(set(&emit_set(&r)), r);
        // End of input after whole lines ends a set, as in wireguard-go; inside a line
        // (a client gone mid-request) it refuses the whole set.
        assert_eq!(set("set=1\nlisten_port=4000\n").listen_port, Some(4000));
        let e = read("set=1\nlisten_port=4").unwrap_err();
        assert_eq!(e.errno(), -EIO, "{e}");
    }

    #[test]
    fn set_errors_have_wireguard_go_errnos() {
        let pk = k(9).to_hex();
        let cases: &[(&str, i32)] = &[
            ("set=1\nbogus=1\n\n", -EINVAL),
            ("set=1\nlisten_port=65536\n\n", -EINVAL),
            ("set=1\nlisten_port=+1\n\n", -EINVAL),
            ("set=1\nfwmark=-1\n\n", -EINVAL),
            ("set=1\nreplace_peers=yes\n\n", -EINVAL),
            ("set=1\nprivate_key=abc\n\n", -EINVAL),
            ("set=1\nnoequals\n\n", -EPROTO),
            ("set=1\nendpoint=1.2.3.4:5\n\n", -EINVAL), // peer key before any public_key
            ("set=1\nallowed_ip=10.0.0.0/8\n\n", -EINVAL),
        ];
        for (text, errno) in cases {
            let e = read(text).unwrap_err();
            assert_eq!(e.errno(), *errno, "{text:?}: {e}");
            assert!(e.answers());
        }
        for bad in [
            "protocol_version=2",
            "allowed_ip=10.0.0.1",
            "allowed_ip=10.0.0.0/33",
            "endpoint=1.2.3.4",
            "endpoint=1.2.3.4:0",
            "endpoint=fd00::1:5",
            "persistent_keepalive_interval=65536",
            "remove=false",
            "update_only=1",
            "replace_allowed_ips=false",
            "preshared_key=00",
            "listen_port=1",
        ] {
            let e = read(&format!("set=1\npublic_key={pk}\n{bad}\n\n")).unwrap_err();
            assert_eq!(e.errno(), -EINVAL, "{bad}: {e}");
        }
        // After an error the rest of the request is consumed: the next one reads fine.
        let mut cur = Cursor::new(b"set=1\nbogus=1\nlisten_port=5\n\nget=1\n\n".to_vec());
        assert!(read_request(&mut cur).is_err());
        assert_eq!(read_request(&mut cur), Ok(Request::Get));
    }

    #[test]
    fn limits() {
        let long = format!("set=1\nlisten_port={}\n\n", "1".repeat(MAX_LINE_BYTES));
        assert_eq!(read(&long).unwrap_err().errno(), -EIO);
        let mut big = String::from("set=1\n");
        while big.len() <= MAX_REQUEST_BYTES {
            big.push_str("listen_port=1\n");
        }
        assert_eq!(read(&big).unwrap_err().errno(), -EIO);
        // End of input after a whole line ends a set as wireguard-go's scanner does;
        // inside a line it does not (see `reads_get_and_set`).
        assert_eq!(
            set("set=1\nlisten_port=7\n"),
            SetRequest {
                listen_port: Some(7),
                ..Default::default()
            }
        );
    }

    fn base() -> Config {
        let mut cfg = Config::default();
        cfg.interface.private_key = Some(k(50));
        cfg.interface.listen_port = Some(51820);
        cfg.peers = vec![
            PeerConfig {
                public_key: k(1),
                preshared_key: Some(k(11)),
                allowed_ips: vec![c("10.0.0.1/32"), c("10.1.0.0/16")],
                endpoint: Some(Endpoint::Addr("192.0.2.1:51820".parse().unwrap())),
                persistent_keepalive: Some(25),
                tcp_port: Some(443),
                name: None,
            },
            PeerConfig {
                public_key: k(2),
                preshared_key: None,
                allowed_ips: vec![c("10.0.0.2/32")],
                endpoint: None,
                persistent_keepalive: None,
                tcp_port: None,
                name: None,
            },
        ];
        cfg
    }

    #[test]
    fn apply_moves_allowed_ips_and_follows_flags() {
        let b = base();
        let r = set(&format!(
            "set=1\nlisten_port=0\nfwmark=7\npublic_key={}\nallowed_ip=10.1.0.0/16\npersistent_keepalive_interval=0\n\
             public_key={}\nupdate_only=true\nallowed_ip=10.9.0.0/16\n\
             public_key={}\npreshared_key={}\nendpoint=1.2.3.4:9\n\n",
            k(2).to_hex(),
            k(3).to_hex(),
            k(1).to_hex(),
            Key::default().to_hex()
        ));
        let n = apply_set(&b, &r).unwrap();
        assert_eq!(n.interface.listen_port, None);
        assert_eq!(n.interface.fwmark, Some(7));
        assert_eq!(n.peers.len(), 2, "update_only must not create peer 3");
        assert_eq!(n.peers[0].allowed_ips, vec![c("10.0.0.1/32")]);
        assert_eq!(n.peers[0].preshared_key, None);
        assert_eq!(
            n.peers[0].endpoint,
            Some(Endpoint::Addr("1.2.3.4:9".parse().unwrap()))
        );
        assert_eq!(n.peers[0].tcp_port, Some(443), "non-UAPI settings are kept");
        assert_eq!(
            n.peers[1].allowed_ips,
            vec![c("10.0.0.2/32"), c("10.1.0.0/16")]
        );
        assert_eq!(n.peers[1].persistent_keepalive, None);

        // replace_allowed_ips + remove + replace_peers + new peers.
        let r = set(&format!(
            "set=1\npublic_key={}\nreplace_allowed_ips=true\nallowed_ip=10.7.0.0/16\n\
             public_key={}\nremove=true\npublic_key={}\nallowed_ip=10.0.0.2/32\n\n",
            k(1).to_hex(),
            k(2).to_hex(),
            k(3).to_hex()
        ));
        let n = apply_set(&b, &r).unwrap();
        let keys: Vec<Key> = n.peers.iter().map(|p| p.public_key).collect();
        assert_eq!(keys, vec![k(1), k(3)]);
        assert_eq!(n.peers[0].allowed_ips, vec![c("10.7.0.0/16")]);
        assert_eq!(n.peers[1].allowed_ips, vec![c("10.0.0.2/32")]);
        n.validate().unwrap();

        let r = set("set=1\nreplace_peers=true\n\n");
        assert!(apply_set(&b, &r).unwrap().peers.is_empty());

        // Our own public key as a peer is ignored; a new private key drops a peer that
        // has its public key.
        let r = set(&format!(
            "set=1\npublic_key={}\nallowed_ip=10.5.0.0/16\n\n",
            k(50).public().to_hex()
        ));
        assert_eq!(apply_set(&b, &r).unwrap(), b);
        let mut with_self = b.clone();
        with_self.peers[1].public_key = k(60).public();
        let r = set(&format!("set=1\nprivate_key={}\n\n", k(60).to_hex()));
        let n = apply_set(&with_self, &r).unwrap();
        assert_eq!(n.peers.len(), 1);
        assert_eq!(n.interface.private_key, Some(k(60)));
        let r = set(&format!(
            "set=1\nprivate_key={}\n\n",
            Key::default().to_hex()
        ));
        assert_eq!(apply_set(&b, &r).unwrap().interface.private_key, None);

        // A prefix that moves away and back ends up last in its list, once.
        let r = set(&format!(
            "set=1\npublic_key={}\nallowed_ip=10.0.0.1/32\npublic_key={}\nallowed_ip=10.0.0.1/32\n\n",
            k(2).to_hex(),
            k(1).to_hex()
        ));
        let n = apply_set(&b, &r).unwrap();
        assert_eq!(
            n.peers[0].allowed_ips,
            vec![c("10.1.0.0/16"), c("10.0.0.1/32")]
        );
        assert_eq!(n.peers[1].allowed_ips, vec![c("10.0.0.2/32")]);

        // allowed_ip then remove: the prefix is taken from its owner and then dropped.
        let r = set(&format!(
            "set=1\npublic_key={}\nallowed_ip=10.0.0.1/32\nremove=true\nallowed_ip=10.1.0.0/16\n\n",
            k(2).to_hex()
        ));
        let n = apply_set(&b, &r).unwrap();
        assert_eq!(n.peers.len(), 1);
        assert_eq!(n.peers[0].allowed_ips, vec![c("10.1.0.0/16")]);
    }

    #[test]
    fn get_output_matches_wireguard_go() {
        let mut p = PeerStatus::new(k(2));
        p.endpoint = Some("[fd00::1]:51820".parse().unwrap());
        p.last_handshake = Some((1_700_000_000, 42));
        p.rx_bytes = 10;
        p.tx_bytes = 20;
        p.persistent_keepalive = Some(25);
        p.allowed_ips = vec![c("10.0.0.2/32"), c("fd00::2/128")];
        let q = PeerStatus::new(k(3));
        let st = DeviceStatus {
            private_key: Some(k(1)),
            listen_port: 51820,
            fwmark: None,
            peers: vec![p, q],
        };
        let want = format!(
            "private_key={}\nlisten_port=51820\n\
             public_key={}\npreshared_key={}\nprotocol_version=1\nendpoint=[fd00::1]:51820\n\
             last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=42\ntx_bytes=20\nrx_bytes=10\n\
             persistent_keepalive_interval=25\nallowed_ip=10.0.0.2/32\nallowed_ip=fd00::2/128\n\
             public_key={}\npreshared_key={}\nprotocol_version=1\n\
             last_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n\
             persistent_keepalive_interval=0\nerrno=0\n\n",
            k(1).to_hex(),
            k(2).to_hex(),
            Key::default().to_hex(),
            k(3).to_hex(),
            Key::default().to_hex()
        );
        let got = emit_get(&st);
        assert_eq!(got, want);
        assert_eq!(parse_get_response(&got).unwrap(), st);
        assert_eq!(
            read_get_response(&mut Cursor::new(got.as_bytes())).unwrap(),
            st
        );
        assert_eq!(
            parse_get_response("errno=-22\n\n"),
            Err(UapiError::Remote(-22))
        );
        assert!(parse_get_response("listen_port=1\n").is_err());
        assert_eq!(emit_errno(-EINVAL), "errno=-22\n\n");
        assert_eq!(
            read_set_response(&mut Cursor::new(b"errno=0\n\n".to_vec())),
            Ok(())
        );
        assert_eq!(
            read_set_response(&mut Cursor::new(b"errno=-98\n\n".to_vec())),
            Err(UapiError::Remote(-98))
        );
        // Unknown keys are skipped.
        assert!(parse_get_response("jc=4\nerrno=0\n\n").is_ok());
    }

    /// What `wg setconf` (wireguard-tools) writes to the socket, captured with a fake
    /// listener; keys replaced by fixed bytes.
    const WG_SETCONF: &str = "set=1\nprivate_key=2121212121212121212121212121212121212121212121212121212121212121\nlisten_port=51820\nfwmark=32\nreplace_peers=true\n\
        public_key=2222222222222222222222222222222222222222222222222222222222222222\nendpoint=192.0.2.1:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
        allowed_ip=10.0.0.2/32\nallowed_ip=fd00::2/128\npublic_key=2323232323232323232323232323232323232323232323232323232323232323\nreplace_allowed_ips=true\n\
        allowed_ip=10.0.0.3/32\n\n";

    #[test]
    fn real_wg_setconf_request_applies_like_the_config_file() {
        let Ok(Request::Set(req)) = read(WG_SETCONF) else {
            panic!("not a set")
        };
        let got = apply_set(&base(), &req).unwrap();
        let conf = format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51820\nFwMark = 0x20\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.2/32, fd00::2/128\nEndpoint = 192.0.2.1:51820\nPersistentKeepalive = 25\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.3/32\n",
            k(0x21).to_base64(),
            k(0x22).to_base64(),
            k(0x23).to_base64()
        );
        assert_eq!(got, crate::core::ini::parse("wg.conf", &conf).unwrap());
    }

    /// A `get=1` answer captured from Debian's wireguard-go (keys replaced by fixed
    /// bytes) after `wg set ... fwmark 0x20 peer A preshared-key ... endpoint
    /// [2001:db8::1]:51820 persistent-keepalive 25 allowed-ips 10.9.0.1/24,fd00::9/128
    /// peer B allowed-ips 10.9.1.0/24 endpoint 192.0.2.7:1234`.
    const WIREGUARD_GO_GET: &str = "private_key=1111111111111111111111111111111111111111111111111111111111111111\nlisten_port=51999\nfwmark=32\npublic_key=1212121212121212121212121212121212121212121212121212121212121212\npreshared_key=1313131313131313131313131313131313131313131313131313131313131313\nprotocol_version=1\nendpoint=[2001:db8::1]:51820\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=25\nallowed_ip=10.9.0.0/24\nallowed_ip=fd00::9/128\npublic_key=1414141414141414141414141414141414141414141414141414141414141414\npreshared_key=0000000000000000000000000000000000000000000000000000000000000000\nprotocol_version=1\nendpoint=192.0.2.7:1234\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=0\nallowed_ip=10.9.1.0/24\nerrno=0\n\n";

    #[test]
    fn real_wireguard_go_answer_parses_and_reemits_identically() {
        let st = parse_get_response(WIREGUARD_GO_GET).unwrap();
        assert_eq!(st.listen_port, 51999);
        assert_eq!(st.fwmark, Some(32));
        assert_eq!(st.peers.len(), 2);
        assert_eq!(st.peers[0].persistent_keepalive, Some(25));
        assert_eq!(st.peers[1].preshared_key, None);
        assert_eq!(st.peers[0].last_handshake, None);
        assert_eq!(emit_get(&st), WIREGUARD_GO_GET);
    }

    /// The UAPI-visible parts of a config, peers sorted by key.
    type VisiblePeer = (Key, Option<Key>, Option<Endpoint>, Option<u16>, Vec<Cidr>);
    type Visible = (Option<Key>, Option<u16>, Option<u32>, Vec<VisiblePeer>);

    fn visible(c: &Config) -> Visible {
        let mut peers: Vec<_> = c
            .peers
            .iter()
            .map(|p| {
                let ep = match &p.endpoint {
                    Some(Endpoint::Addr(a)) => Some(Endpoint::Addr(*a)),
                    _ => None,
                };
                (
                    p.public_key,
                    p.preshared_key,
                    ep,
                    p.persistent_keepalive,
                    p.allowed_ips.clone(),
                )
            })
            .collect();
        peers.sort_by_key(|p| p.0 .0);
        (
            c.interface.private_key,
            c.interface.listen_port,
            c.interface.fwmark,
            peers,
        )
    }

    fn only_addr_endpoints(c: &mut Config) {
        for p in &mut c.peers {
            if matches!(p.endpoint, Some(Endpoint::Name { .. })) {
                p.endpoint = None;
            }
        }
    }

    #[test]
    fn diff_then_apply_reaches_new() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut old = random_config(&mut rng);
            let mut new = if rng.chance(3) {
                random_config(&mut rng)
            } else {
                old.clone()
            };
            // Share some peers between old and new, then mutate a few fields.
            for p in old.peers.iter().take(2) {
                if !new.peers.iter().any(|q| q.public_key == p.public_key) && rng.chance(2) {
                    let mut q = p.clone();
                    q.allowed_ips
                        .retain(|c| !new.peers.iter().any(|r| r.allowed_ips.contains(c)));
                    new.peers.push(q);
                }
            }
            for q in &mut new.peers {
                match rng.below(6) {
                    0 => q.persistent_keepalive = None,
                    1 => q.preshared_key = Some(rng.key()),
                    2 => q.endpoint = None,
                    3 => q.allowed_ips.clear(),
                    _ => {}
                }
            }
            only_addr_endpoints(&mut old);
            only_addr_endpoints(&mut new);
            let d = set_from_diff(&old, &new);
            // The request survives the wire.
            assert_eq!(set(&emit_set(&d)), d, "seed {seed}");
            let got = apply_set(&old, &d).unwrap();
            assert_eq!(
                visible(&got),
                visible(&new),
                "seed {seed}\n{}",
                emit_set(&d)
            );
            // Unchanged peers are not mentioned.
            for p in &new.peers {
                if old.peers.contains(p) {
                    assert!(
                        !d.peers.iter().any(|s| s.public_key == p.public_key),
                        "seed {seed}"
                    );
                }
            }
        }
        let c = base();
        assert_eq!(set_from_diff(&c, &c), SetRequest::default());
    }
}
