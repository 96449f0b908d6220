//! Per-client access (`[Peer] Access =`): where a peer's traffic may go through the
//! appliance, as the configuration says it, and which sources are whose.
//!
//! A rule is keyed on the packet's source address. That key is sound because the device
//! drops every decrypted packet whose inner source is not inside the sending peer's
//! `AllowedIPs` by longest prefix (`Device::source_allowed`): a client holding its
//! configuration file can change where its packets go, never which peer they come from
//! as the gateway sees it (only the peer's private key makes the packet decrypt as
//! that peer's). The firewall's key must therefore pick the same owner the device
//! does: [`owners`] partitions the peers' prefixes by longest prefix, so a hub's
//! `10.0.0.0/8` is the hub's minus each client's /32 inside it.

use std::fmt;
use std::net::IpAddr;

use crate::net::{subtract, Cidr};

/// One item of `Access =`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessItem {
    /// The LAN side: one-armed the uplink's own subnets, two-armed the LAN port.
    Lan,
    /// Out of the uplink beyond `lan`.
    Internet,
    /// Other tunnel peers.
    Clients,
    /// The appliance's own management services (SSH, metrics). Ping is always allowed;
    /// the resolver goes with `lan` or `internet`.
    Appliance,
    /// A destination prefix, optionally only one protocol and (TCP, UDP) one port.
    Prefix {
        net: Cidr,
        proto: Option<Proto>,
        port: Option<u16>,
    },
}

/// The protocol of a prefix item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    /// ICMP for an IPv4 prefix, ICMPv6 for an IPv6 one.
    Icmp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
        }
    }
}

/// The four zones, in the order they are written.
pub const ZONES: [AccessItem; 4] = [
    AccessItem::Lan,
    AccessItem::Internet,
    AccessItem::Clients,
    AccessItem::Appliance,
];

impl fmt::Display for AccessItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccessItem::Lan => f.write_str("lan"),
            AccessItem::Internet => f.write_str("internet"),
            AccessItem::Clients => f.write_str("clients"),
            AccessItem::Appliance => f.write_str("appliance"),
            AccessItem::Prefix { net, proto, port } => {
                write!(f, "{net}")?;
                if let Some(p) = proto {
                    write!(f, " {}", p.as_str())?;
                }
                if let Some(p) = port {
                    write!(f, " {p}")?;
                }
                Ok(())
            }
        }
    }
}

/// The most items one `Access` may have (each is a firewall rule in the peer's chain).
pub const MAX_ITEMS: usize = 64;

/// What `Access =` accepts, for error messages.
pub const EXPECTED: &str = "a comma-separated list of lan, internet, clients, appliance and prefixes with an optional protocol and port (`192.168.1.10/32 tcp 8096`, `192.168.1.0/24 icmp`), or none";

impl AccessItem {
    /// One item: a keyword, or `PREFIX [tcp|udp [PORT] | icmp]`.
    pub fn parse(s: &str) -> Result<AccessItem, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let kw = match words.as_slice() {
            [w] => match w.to_ascii_lowercase().as_str() {
                "lan" => Some(AccessItem::Lan),
                "internet" => Some(AccessItem::Internet),
                "clients" => Some(AccessItem::Clients),
                "appliance" => Some(AccessItem::Appliance),
                _ => None,
            },
            _ => None,
        };
        if let Some(k) = kw {
            return Ok(k);
        }
        let Some((first, rest)) = words.split_first() else {
            return Err("an empty item".into());
        };
        let net: Cidr = first.parse().map_err(|_| {
            format!("`{first}` is neither lan, internet, clients, appliance nor a prefix")
        })?;
        let net = net.network();
        let (proto, port) = match rest {
            [] => (None, None),
            [p, more @ ..] => {
                let proto = match p.to_ascii_lowercase().as_str() {
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    "icmp" | "icmpv6" => Proto::Icmp,
                    _ => return Err(format!("`{p}`: the protocol is tcp, udp or icmp")),
                };
                match more {
                    [] => (Some(proto), None),
                    [port] if proto != Proto::Icmp => {
                        let n: u16 = port
                            .parse()
                            .ok()
                            .filter(|&n| n > 0)
                            .ok_or_else(|| format!("`{port}`: a port is 1 to 65535"))?;
                        (Some(proto), Some(n))
                    }
                    [_] => return Err("icmp takes no port".into()),
                    _ => return Err(format!("`{s}`: expected PREFIX [tcp|udp [PORT] | icmp]")),
                }
            }
        };
        Ok(AccessItem::Prefix { net, proto, port })
    }

    /// Whether traffic of this item may reach the resolver on the box (DNS follows
    /// `lan` and `internet`, not `appliance`).
    pub fn grants_dns(self) -> bool {
        matches!(self, AccessItem::Lan | AccessItem::Internet)
    }
}

/// `Access =`'s value: `None` for the keyword `none` (nothing but ping to the appliance).
pub fn parse_list(v: &str) -> Result<Vec<AccessItem>, String> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out: Vec<AccessItem> = Vec::new();
    for s in v.split(',').map(str::trim) {
        if s.is_empty() {
            return Err("an empty item (two commas, or one at an end)".into());
        }
        let item = AccessItem::parse(s)?;
        if out.contains(&item) {
            return Err(format!("`{item}` is given twice"));
        }
        out.push(item);
    }
    if out.is_empty() {
        return Err("empty: say `none` for nothing".into());
    }
    if out.len() > MAX_ITEMS {
        return Err(format!("{} items: at most {MAX_ITEMS}", out.len()));
    }
    Ok(out)
}

/// How a list is written back (`none` when empty).
pub fn list_text(v: &[AccessItem]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The default access: every zone, less `clients` with `ClientIsolation = on`.
pub fn default_access(client_isolation: bool) -> Vec<AccessItem> {
    ZONES
        .iter()
        .copied()
        .filter(|z| !(client_isolation && *z == AccessItem::Clients))
        .collect()
}

/// Whether `v` is the unrestricted access (every zone): such a peer needs no rule.
pub fn unrestricted(v: &[AccessItem]) -> bool {
    ZONES.iter().all(|z| v.contains(z))
}

/// Which owner owns which address: `prefixes` (an owner's index and a prefix in network
/// form, `/0` included) cut into prefixes that do not overlap, each with the owner that
/// has it by longest prefix, as the device's source check decides: an owner's prefix
/// minus every more specific prefix of another owner inside it. Sorted by address. The
/// firewall's per-client maps and `Masquerade = off` key on it (`firewall::clients::owners`).
pub fn owners(prefixes: &[(usize, Cidr)]) -> Vec<(usize, Cidr)> {
    let all = prefixes;
    let mut out: Vec<(usize, Cidr)> = all
        .iter()
        .flat_map(|&(i, c)| {
            let specific: Vec<Cidr> = all
                .iter()
                .filter(|&&(j, o)| j != i && o.prefix > c.prefix && c.covers(&o))
                .map(|&(_, o)| o)
                .collect();
            subtract(c, &specific).into_iter().map(move |p| (i, p))
        })
        .collect();
    out.sort_by_key(|(i, c)| (c.sort_key(), *i));
    // Two owners of one prefix (the configuration refuses that; a map must never hold
    // it twice): the first keeps it.
    out.dedup_by(|later, first| later.1 == first.1);
    // One owner's own prefixes may nest (10.0.0.0/8 and 10.1.0.0/16 both its own): keep
    // the outer one.
    let nested = |k: usize, (i, c): &(usize, Cidr)| {
        out.iter()
            .enumerate()
            .any(|(m, (j, o))| m != k && j == i && o.prefix < c.prefix && o.covers(c))
    };
    let keep: Vec<bool> = out.iter().enumerate().map(|(k, e)| !nested(k, e)).collect();
    out.into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(e, _)| e)
        .collect()
}

/// The address ranges (first, last) of `c`.
pub fn range(c: &Cidr) -> (IpAddr, IpAddr) {
    let n = c.network();
    match n.addr {
        IpAddr::V4(a) => {
            let host = if n.prefix >= 32 {
                0
            } else {
                u32::MAX >> n.prefix
            };
            (IpAddr::V4(a), IpAddr::V4((u32::from(a) | host).into()))
        }
        IpAddr::V6(a) => {
            let host = if n.prefix >= 128 {
                0
            } else {
                u128::MAX >> n.prefix
            };
            (IpAddr::V6(a), IpAddr::V6((u128::from(a) | host).into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn items_parse_and_print_back() {
        let v = parse_list(
            "lan, Internet, 192.168.1.10/32 tcp 8096, 192.168.1.0/24 icmp, fd00::/64 udp, 10.1.2.3/16",
        )
        .unwrap();
        assert_eq!(
            list_text(&v),
            "lan, internet, 192.168.1.10/32 tcp 8096, 192.168.1.0/24 icmp, fd00::/64 udp, 10.1.0.0/16"
        );
        assert_eq!(parse_list(&list_text(&v)).unwrap(), v);
        assert_eq!(parse_list("none").unwrap(), Vec::new());
        assert_eq!(list_text(&[]), "none");
        for (bad, why) in [
            ("", "empty"),
            ("lan,,internet", "empty item"),
            ("lan, lan", "twice"),
            ("everything", "neither"),
            ("10.0.0.0/8 sctp", "tcp, udp or icmp"),
            ("10.0.0.0/8 tcp 0", "1 to 65535"),
            ("10.0.0.0/8 tcp 70000", "1 to 65535"),
            ("10.0.0.0/8 icmp 8", "no port"),
            ("10.0.0.0/8 tcp 1 2", "expected"),
            ("10.0.0.0/33", "neither"),
        ] {
            let e = parse_list(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("10.0.{i}.0/24")).collect();
        assert!(parse_list(&many.join(",")).unwrap_err().contains("at most"));
    }

    #[test]
    fn default_is_every_zone_isolation_takes_clients() {
        assert!(unrestricted(&default_access(false)));
        let iso = default_access(true);
        assert!(!unrestricted(&iso));
        assert!(!iso.contains(&AccessItem::Clients));
        assert!(iso.contains(&AccessItem::Lan));
    }

    #[test]
    fn owners_are_longest_prefix_and_never_overlap() {
        let p: Vec<(usize, Cidr)> = [
            (0, "0.0.0.0/0"),
            (1, "10.100.0.2/32"),
            (2, "10.0.0.0/8"),
            (2, "10.5.0.0/16"),
            (3, "10.100.0.3/32"),
        ]
        .iter()
        .map(|&(i, s)| (i, c(s)))
        .collect();
        let o = owners(&p);
        for (k, (_, a)) in o.iter().enumerate() {
            for (_, b) in &o[k + 1..] {
                assert!(!a.overlaps(b), "{a} and {b}");
            }
        }
        let owner = |ip: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            let v: Vec<usize> = o
                .iter()
                .filter(|(_, c)| c.contains(ip))
                .map(|(i, _)| *i)
                .collect();
            assert_eq!(v.len(), 1, "{ip}: {v:?}");
            v[0]
        };
        assert_eq!(owner("10.100.0.2"), 1);
        assert_eq!(owner("10.100.0.3"), 3);
        assert_eq!(owner("10.100.0.4"), 2);
        assert_eq!(owner("10.5.1.1"), 2);
        assert_eq!(owner("8.8.8.8"), 0);
        assert_eq!(owner("11.0.0.1"), 0);
        // One prefix twice: the first owner keeps it, once.
        let twice = owners(&[(4, c("10.0.0.0/8")), (5, c("10.0.0.0/8"))]);
        assert_eq!(twice, vec![(4, c("10.0.0.0/8"))]);
    }

    #[test]
    fn ranges() {
        let (a, b) = range(&c("10.1.2.0/23"));
        assert_eq!(
            (a.to_string(), b.to_string()),
            ("10.1.2.0".into(), "10.1.3.255".into())
        );
        let (a, b) = range(&c("0.0.0.0/0"));
        assert_eq!(b.to_string(), "255.255.255.255");
        assert_eq!(a.to_string(), "0.0.0.0");
        let (a, b) = range(&c("fd00::1/128"));
        assert_eq!(a, b);
        let (_, b) = range(&c("fd00::/64"));
        assert_eq!(b.to_string(), "fd00::ffff:ffff:ffff:ffff");
    }
}
