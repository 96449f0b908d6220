//! The daemon's side of the UAPI: read one request (bounded lines and bytes), apply a
//! `set` to a configuration whole or not at all, and write `get` answers and errnos.

use super::{
    hex_key, invalid, parse_endpoint, parse_prefix, parse_uint, read_line, DeviceStatus, PeerSet,
    Request, SetRequest, UapiError, MAX_PEERS, MAX_REQUEST_BYTES,
};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::BufRead;

use crate::config::{Config, Endpoint, PeerConfig};
use crate::key::Key;
use crate::net::Cidr;

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
                peers.push(Some(PeerConfig::new(ps.public_key)));
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
