//! The minimal `set` that turns one configuration into another (what the console sends
//! the running daemon after a commit).

use std::collections::HashMap;

use crate::config::{Config, Endpoint, PeerConfig};
use crate::key::Key;
use crate::net::Cidr;

use super::*;

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
