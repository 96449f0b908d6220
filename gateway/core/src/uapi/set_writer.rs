//! The writing side of a UAPI client, as `wg` is one: a `set` request on the wire, and
//! the minimal `set` that turns one configuration into another. The appliance's own faces
//! never send `set` (a commit reaches the daemon as the saved file and SIGHUP), so this is
//! test equipment, built for this crate's tests and with the `testutil` feature: the
//! server's and the fuzz target's round trips.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{PeerSet, SetRequest};
use crate::config::{Config, Endpoint, PeerConfig};
use crate::key::Key;
use crate::net::Cidr;

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
