//! Checks on configuration values before anything is applied: one parser per field with
//! a message saying what is expected, and whole-configuration checks.
//!
//! [`validate_candidate`] is the single gate `commit` and boot-time loading go through.
//! It runs the console's own checks, then core's `Config::validate_consistency`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use crate::core::config::{Config, Endpoint, OffloadMode};
use crate::core::key::Key;
use crate::core::net::Cidr;

/// A value the console refused: what was typed (cut for echoing), what it was meant to
/// be, and what is expected instead. Every field parser here returns it; the message is
/// `` `VALUE` is not a valid WHAT: expected EXPECTED ``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// The input as typed, cut with [`short`].
    pub value: String,
    /// What the value was for (`listen port`, `fwmark`, ...).
    pub what: String,
    /// What would have been accepted.
    pub expected: String,
}

impl ValueError {
    pub fn new(value: &str, what: impl Into<String>, expected: impl Into<String>) -> Self {
        ValueError {
            value: short(value),
            what: what.into(),
            expected: expected.into(),
        }
    }
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` is not a valid {}: expected {}",
            self.value, self.what, self.expected
        )
    }
}

impl std::error::Error for ValueError {}

/// The console's commands answer with text; a refused value becomes its message.
impl From<ValueError> for String {
    fn from(e: ValueError) -> String {
        e.to_string()
    }
}

pub fn key(s: &str, what: &str) -> Result<Key, ValueError> {
    Key::from_base64(s)
        .map_err(|_| ValueError::new(s, what, "44 characters of base64, as `genkey` prints"))
}

/// Cut untrusted input for echoing in a message.
pub fn short(s: &str) -> String {
    if s.chars().count() > 48 {
        format!("{}…", s.chars().take(48).collect::<String>())
    } else {
        s.to_string()
    }
}

pub fn port(s: &str, what: &str) -> Result<u16, ValueError> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 && s.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(ValueError::new(s, what, "a port number from 1 to 65535")),
    }
}

pub fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy>(
    s: &str,
    what: &str,
    min: T,
    max: T,
) -> Result<T, ValueError> {
    match s.parse::<T>() {
        Ok(v) if s.bytes().all(|b| b.is_ascii_digit()) && v >= min && v <= max => Ok(v),
        _ => Err(ValueError::new(
            s,
            what,
            format!("a number from {min} to {max}"),
        )),
    }
}

/// Decimal or `0x` hexadecimal, as `wg` accepts for fwmark.
pub fn fwmark(s: &str) -> Result<u32, ValueError> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if !h.is_empty() => u32::from_str_radix(h, 16).ok(),
        Some(_) => None,
        None if s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        None => None,
    };
    r.ok_or_else(|| ValueError::new(s, "fwmark", "a number (decimal or 0x hex) up to 0xffffffff"))
}

pub fn cidr(s: &str) -> Result<Cidr, ValueError> {
    s.parse::<Cidr>()
        .map_err(|_| ValueError::new(s, "address or prefix", "e.g. 10.0.0.1/24 or fd00::1/64"))
}

/// `CIDR[,CIDR...]`; empty items are an error (a stray comma usually hides a typo).
pub fn cidr_list(s: &str) -> Result<Vec<Cidr>, ValueError> {
    s.split(',').map(|p| cidr(p.trim())).collect()
}

/// [`cidr_list`] with host bits cleared: allowed IPs are prefixes, not addresses.
pub fn prefix_list(s: &str) -> Result<Vec<Cidr>, ValueError> {
    Ok(cidr_list(s)?.iter().map(Cidr::network).collect())
}

pub fn port_list(s: &str, what: &str) -> Result<Vec<u16>, ValueError> {
    s.split(',').map(|p| port(p.trim(), what)).collect()
}

/// `0,1,2` or ranges `0-3,6`.
pub fn core_list(s: &str) -> Result<Vec<usize>, ValueError> {
    let bad = || ValueError::new(s, "core list", "numbers or ranges such as 0,1 or 0-3");
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let a: usize = number(a, "core", 0, 4095).map_err(|_| bad())?;
        let b: usize = number(b, "core", 0, 4095).map_err(|_| bad())?;
        if a > b {
            return Err(bad());
        }
        for c in a..=b {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    Ok(out)
}

pub fn boolean(s: &str, what: &str) -> Result<bool, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "enable" | "enabled" | "1" => Ok(true),
        "off" | "false" | "no" | "disable" | "disabled" | "0" => Ok(false),
        _ => Err(ValueError::new(s, what, "on or off")),
    }
}

pub fn offload(s: &str) -> Result<OffloadMode, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(OffloadMode::Auto),
        "gso" => Ok(OffloadMode::Gso),
        "mmsg" => Ok(OffloadMode::Mmsg),
        "off" => Ok(OffloadMode::Off),
        _ => Err(ValueError::new(
            s,
            "offload mode",
            "one of auto, gso, mmsg, off",
        )),
    }
}

/// A Linux interface name: 1 to 15 characters, no `/`, whitespace, or `:`.
pub fn ifname(s: &str, what: &str) -> Result<String, ValueError> {
    let ok = !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+=".contains(&b));
    if ok {
        Ok(s.to_string())
    } else {
        Err(ValueError::new(
            s,
            what,
            "1 to 15 letters, digits or - _ . (e.g. wg0, eth0)",
        ))
    }
}

pub fn ip(s: &str, what: &str) -> Result<IpAddr, ValueError> {
    s.parse()
        .map_err(|_| ValueError::new(s, what, "an IP address such as 192.0.2.1"))
}

/// `IP[,IP...]`; empty items are an error.
pub fn ip_list(s: &str, what: &str) -> Result<Vec<IpAddr>, ValueError> {
    s.split(',').map(|p| ip(p.trim(), what)).collect()
}

/// `1.2.3.4:51820`, `[fd00::1]:51820` or `vpn.example.com:51820`.
pub fn endpoint(s: &str) -> Result<Endpoint, ValueError> {
    let bad = || {
        ValueError::new(
            s,
            "endpoint",
            "HOST:PORT, e.g. 192.0.2.7:51820, [2001:db8::7]:51820 or vpn.example.com:51820",
        )
    };
    if let Ok(sa) = s.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(bad());
        }
        return Ok(Endpoint::Addr(sa));
    }
    let (host, p) = s.rsplit_once(':').ok_or_else(bad)?;
    let port = port(p, "endpoint port").map_err(|_| bad())?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        // All-numeric dotted names are mistyped IPv4 addresses, not host names.
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if host_ok {
        Ok(Endpoint::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    } else {
        Err(bad())
    }
}

/// Checks that hold for any candidate, even an unfinished one (run after every `set`).
pub fn check_consistency(cfg: &Config) -> Vec<String> {
    let mut errs = Vec::new();
    let ours = cfg.interface.private_key.map(|k| k.public());
    let mut seen_keys: Vec<&Key> = Vec::new();
    let mut owner: HashMap<Cidr, &Key> = HashMap::new();
    for p in &cfg.peers {
        let pk = p.public_key.to_base64();
        if p.public_key.is_zero() {
            errs.push("a peer's public key is all zeros".to_string());
        }
        if Some(p.public_key) == ours {
            errs.push(format!("peer {pk} is this gateway's own public key"));
        }
        if seen_keys.contains(&&p.public_key) {
            errs.push(format!("peer {pk} appears twice"));
        }
        seen_keys.push(&p.public_key);
        for a in &p.allowed_ips {
            // The same prefix on two peers is ambiguous (WireGuard would silently move it
            // to the last one). Nested prefixes of different lengths are fine: longest match.
            let net = a.network();
            match owner.get(&net) {
                Some(other) if **other != p.public_key => errs.push(format!(
                    "allowed IP {net} is on two peers ({} and {pk}): remove it from one",
                    other.to_base64()
                )),
                _ => {
                    owner.insert(net, &p.public_key);
                }
            }
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for p in &cfg.peers {
        if let Some(n) = &p.name {
            if names.contains(&n.as_str()) {
                errs.push(format!(
                    "two peers are named {}: peer names must differ",
                    short(n)
                ));
            }
            names.push(n);
        }
    }
    if let Err(e) = ifname(&cfg.gateway.interface_name, "gateway interface-name") {
        errs.push(e.to_string());
    }
    let g = &cfg.gateway;
    if !g.lan.is_empty() && g.lan == g.uplink {
        errs.push(format!(
            "the LAN port {} is the uplink too: for a one-armed gateway leave `gateway lan` unset",
            g.lan
        ));
    }
    if cfg.gateway.buffers == 0 {
        errs.push("gateway buffers must be at least 1".into());
    }
    errs
}

/// The gate before a configuration is committed or used at boot: everything in
/// [`check_consistency`] plus what a runnable configuration needs.
pub fn validate_candidate(cfg: &Config) -> Result<(), Vec<String>> {
    let mut errs = check_consistency(cfg);
    match cfg.interface.private_key {
        None => errs.push(
            "the interface has no private key: run `genkey` (or `set interface private-key KEY`)"
                .into(),
        ),
        Some(k) if k.is_zero() => {
            errs.push("the interface private key is all zeros: run `genkey`".into())
        }
        Some(_) => {}
    }
    // The same consistency rules the daemon applies to a config file, so the console
    // never commits something `riceguard up` would refuse.
    if errs.is_empty() {
        if let Err(e) = cfg.validate_consistency() {
            errs.push(e.to_string());
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::PeerConfig;

    fn peer(k: Key, ips: &str) -> PeerConfig {
        PeerConfig {
            public_key: k,
            preshared_key: None,
            allowed_ips: cidr_list(ips).unwrap(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
        }
    }

    #[test]
    fn field_parsers() {
        assert_eq!(port("51820", "p"), Ok(51820));
        assert!(port("0", "p").is_err() && port("65536", "p").is_err() && port("+1", "p").is_err());
        assert_eq!(fwmark("0x10"), Ok(16));
        assert_eq!(fwmark("10"), Ok(10));
        assert!(fwmark("0x").is_err() && fwmark("-1").is_err());
        assert_eq!(core_list("0-2,5,1"), Ok(vec![0, 1, 2, 5]));
        assert!(core_list("3-1").is_err() && core_list("a").is_err());
        assert!(matches!(endpoint("192.0.2.7:51820"), Ok(Endpoint::Addr(_))));
        assert!(matches!(
            endpoint("[2001:db8::7]:51820"),
            Ok(Endpoint::Addr(_))
        ));
        assert_eq!(
            endpoint("VPN.example.com:443"),
            Ok(Endpoint::Name {
                host: "vpn.example.com".into(),
                port: 443
            })
        );
        for bad in [
            "192.0.2.7",
            "1.2.3.4.5:1",
            "host:0",
            ":1",
            "a b:1",
            "-x.com:1",
            "1.2.3.4:99999",
            "[::1]:0",
        ] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
        let e = key("nope", "public key").unwrap_err();
        assert_eq!((e.value.as_str(), e.what.as_str()), ("nope", "public key"));
        assert!(e.to_string().contains("44 characters"), "{e}");
        let long = "y".repeat(100);
        assert!(key(&long, "k").unwrap_err().value.chars().count() <= 49);
        assert!(
            ifname("wg0", "n").is_ok()
                && ifname("a/b", "n").is_err()
                && ifname(&"x".repeat(16), "n").is_err()
        );
        assert_eq!(boolean("OFF", "x"), Ok(false));
        assert!(offload("fast")
            .unwrap_err()
            .to_string()
            .contains("auto, gso, mmsg, off"));
    }

    #[test]
    fn whole_config_checks() {
        let mut c = Config::default();
        assert!(validate_candidate(&c).unwrap_err()[0].contains("genkey"));
        let sk = Key::generate_private(&mut rand_core::OsRng);
        c.interface.private_key = Some(sk);
        assert_eq!(validate_candidate(&c), Ok(()));
        let a = Key::generate_private(&mut rand_core::OsRng).public();
        let b = Key::generate_private(&mut rand_core::OsRng).public();
        c.peers.push(peer(a, "10.0.0.2/32,0.0.0.0/0"));
        c.peers.push(peer(b, "10.0.0.0/24"));
        assert_eq!(
            validate_candidate(&c),
            Ok(()),
            "nested prefixes are allowed"
        );
        c.peers[1].allowed_ips.push(cidr("10.0.0.2").unwrap());
        assert!(validate_candidate(&c).unwrap_err()[0].contains("two peers"));
        c.peers[1] = peer(a, "10.9.0.0/24");
        assert!(validate_candidate(&c).unwrap_err()[0].contains("twice"));
        c.peers[1] = peer(sk.public(), "10.9.0.0/24");
        assert!(validate_candidate(&c).unwrap_err()[0].contains("own public key"));
        c.peers[1] = peer(b, "10.9.0.0/24");
        c.peers[0].name = Some("phone".into());
        c.peers[1].name = Some("phone".into());
        assert!(check_consistency(&c)[0].contains("two peers are named phone"));
        c.peers[1].name = Some("laptop".into());
        assert_eq!(validate_candidate(&c), Ok(()));
        c.gateway.uplink = "eth0".into();
        c.gateway.lan = "eth0".into();
        assert!(check_consistency(&c)[0].contains("is the uplink too"));
    }
}
