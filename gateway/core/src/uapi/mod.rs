//! The cross-platform userspace API of wireguard-go (the text protocol `wg` speaks on
//! `/var/run/wireguard/IFNAME.sock`): reading requests, applying a `set` to a
//! [`Config`], writing `get` answers and errnos, reading them back (the console does),
//! and computing the minimal `set` between two configurations.
//!
//! Files: `server.rs` (the daemon's side: read a request, apply a `set` whole or not at
//! all, write `get` answers and errnos), `client.rs` (the console's side: write a `set`,
//! read `get`/`set` answers), `diff.rs` (the minimal `set` between two configurations),
//! `tests.rs`; the request and status types both sides share are here.
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

use std::fmt;
use std::io::BufRead;
use std::net::SocketAddr;

use crate::key::Key;
use crate::net::Cidr;

mod client;
mod server;
#[cfg(any(test, feature = "testutil"))]
mod set_writer;
#[cfg(test)]
mod tests;

pub use client::{parse_get_response, read_get_response, read_set_response};
pub use server::{apply_set, emit_errno, emit_get, read_request};
#[cfg(any(test, feature = "testutil"))]
pub use set_writer::{emit_set, set_from_diff};

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

// Line reading and value parsers both sides use.

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
