//! Checks on configuration values before anything is applied: one parser per field with
//! a message saying what is expected, and whole-configuration checks.
//!
//! [`validate_candidate`] is the single gate `commit` and boot-time loading go through:
//! core's rules, every problem they find. The values' grammar is core's too
//! (`core::value`); here they only get the console's wording.

use std::net::IpAddr;

use crate::core::config::{
    Config, Endpoint, MasqueradeMode, NtpServer, OffloadMode, OverlapPolicy,
};
use crate::core::key::Key;
use crate::core::net::Cidr;
use crate::core::value::{self, BadValue};

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

/// Cut untrusted input for echoing in a message.
pub fn short(s: &str) -> String {
    if s.chars().count() > 48 {
        format!("{}…", s.chars().take(48).collect::<String>())
    } else {
        s.to_string()
    }
}

/// A number given to a command (`commit-confirm MINUTES`, `rollback N`), not a setting.
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

/// `what` names the setting in the message; the grammar is `core::value`'s.
fn at(what: &str) -> impl Fn(BadValue) -> ValueError + '_ {
    move |b| ValueError {
        value: short(&b.value),
        what: what.to_string(),
        expected: b.expected,
    }
}

// The settings' values, read by the grammar the configuration file uses (`core::value`):
// what `set` accepts is exactly what a file line accepts. Only the message's wording
// (`VALUE is not a valid WHAT`) is the console's.

pub fn key(s: &str, what: &str) -> Result<Key, ValueError> {
    value::key(s).map_err(at(what))
}

pub fn preshared_key(s: &str) -> Result<Option<Key>, ValueError> {
    value::preshared_key(s).map_err(at("preshared key"))
}

pub fn port(s: &str, what: &str) -> Result<u16, ValueError> {
    value::port(s).map_err(at(what))
}

pub fn fwmark(s: &str) -> Result<Option<u32>, ValueError> {
    value::fwmark(s).map_err(at("fwmark"))
}

pub fn mtu(s: &str) -> Result<u16, ValueError> {
    value::mtu(s).map_err(at("MTU"))
}

pub fn cidr(s: &str) -> Result<Cidr, ValueError> {
    match value::cidrs(s).map_err(at("address or prefix"))?.as_slice() {
        [c] => Ok(*c),
        _ => Err(ValueError::new(
            s,
            "address or prefix",
            "one address with its prefix, e.g. 10.0.0.1/24 or fd00::1/64",
        )),
    }
}

pub fn cidr_list(s: &str) -> Result<Vec<Cidr>, ValueError> {
    value::cidrs(s).map_err(at("address or prefix"))
}

pub fn prefix_list(s: &str) -> Result<Vec<Cidr>, ValueError> {
    value::prefixes(s).map_err(at("prefix"))
}

pub fn tcp_listen(s: &str) -> Result<Vec<u16>, ValueError> {
    value::tcp_listen(s).map_err(at("TCP listen ports"))
}

pub fn core_list(s: &str) -> Result<Vec<usize>, ValueError> {
    value::cores(s).map_err(at("core list"))
}

pub fn boolean(s: &str, what: &str) -> Result<bool, ValueError> {
    value::boolean(s).map_err(at(what))
}

pub fn offload(s: &str) -> Result<OffloadMode, ValueError> {
    value::offload(s).map_err(at("offload mode"))
}

pub fn ifname(s: &str, what: &str) -> Result<String, ValueError> {
    value::ifname(s).map_err(at(what))
}

pub fn ip(s: &str, what: &str) -> Result<IpAddr, ValueError> {
    value::ip(s).map_err(at(what))
}

pub fn ip_list(s: &str, what: &str) -> Result<Vec<IpAddr>, ValueError> {
    value::ips(s).map_err(at(what))
}

pub fn endpoint(s: &str) -> Result<Endpoint, ValueError> {
    value::endpoint(s).map_err(at("endpoint"))
}

pub fn keepalive(s: &str) -> Result<Option<u16>, ValueError> {
    value::keepalive(s).map_err(at("keepalive interval"))
}

pub fn buffers(s: &str) -> Result<u32, ValueError> {
    value::buffers(s).map_err(at("number of buffers"))
}

pub fn bbr_rtt_ms(s: &str) -> Result<u32, ValueError> {
    value::bbr_rtt_ms(s).map_err(at("BBR RTT in milliseconds"))
}

pub fn peer_name(s: &str) -> Result<String, ValueError> {
    value::peer_name(s).map_err(at("peer name"))
}

pub fn masquerade(s: &str) -> Result<MasqueradeMode, ValueError> {
    value::masquerade(s).map_err(at("masquerade mode"))
}

pub fn ntp_servers(s: &str) -> Result<Vec<NtpServer>, ValueError> {
    value::ntp_servers(s).map_err(at("NTP server list"))
}

/// `Syslog`: the collector, `HOST[:PORT][/tcp]`.
pub fn syslog(s: &str) -> Result<crate::core::config::SyslogTarget, ValueError> {
    value::syslog(s).map_err(at("syslog collector"))
}

pub fn access(s: &str) -> Result<Vec<crate::core::access::AccessItem>, ValueError> {
    value::access(s).map_err(at("access list"))
}

pub fn domain(s: &str) -> Result<String, ValueError> {
    value::domain(s).map_err(at("domain"))
}

pub fn uplink_overlap(s: &str) -> Result<OverlapPolicy, ValueError> {
    value::uplink_overlap(s).map_err(at("uplink overlap policy"))
}

/// Checks that hold for any candidate, even an unfinished one (run after every `set`):
/// core's rules (`Config::problems`), every one it finds.
pub fn check_consistency(cfg: &Config) -> Vec<String> {
    cfg.problems().iter().map(ToString::to_string).collect()
}

/// The whole-configuration gate: `perm::config`'s, which boot-time loading goes through too.
pub use crate::perm::config::validate_candidate;

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
            access: None,
        }
    }

    #[test]
    fn field_parsers() {
        assert_eq!(port("51820", "p"), Ok(51820));
        assert!(port("0", "p").is_err() && port("65536", "p").is_err() && port("+1", "p").is_err());
        assert_eq!(fwmark("0x10"), Ok(Some(16)));
        assert_eq!(fwmark("10"), Ok(Some(10)));
        assert_eq!(fwmark("0"), Ok(None));
        assert!(fwmark("0x").is_err() && fwmark("-1").is_err());
        // The order assigns cores to workers; a repeat is refused, not dropped.
        assert_eq!(core_list("1,0"), Ok(vec![1, 0]));
        assert_eq!(core_list("5,0-2"), Ok(vec![5, 0, 1, 2]));
        assert!(core_list("0-2,5,1").is_err());
        assert!(core_list("3-1").is_err() && core_list("a").is_err());
        assert!(matches!(endpoint("192.0.2.7:51820"), Ok(Endpoint::Addr(_))));
        assert!(matches!(
            endpoint("[2001:db8::7]:51820"),
            Ok(Endpoint::Addr(_))
        ));
        assert_eq!(
            endpoint("VPN.example.com:443"),
            Ok(Endpoint::Name {
                host: "VPN.example.com".into(),
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
            .contains("auto, gso, mmsg or off"));
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
