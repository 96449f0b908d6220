//! The one grammar of configuration values: every setting's value, whether it comes from
//! a line of the configuration file (`ini`) or from the console's `set`, is read by the
//! function here for that setting, so the two faces accept exactly the same values.
//!
//! Where the file and the console used to differ, the file's grammar won: it is what the
//! firmware writes and reads back, so every file written so far stays readable. Booleans
//! are `on`/`off` (also `true`/`false`, `yes`/`no`), a core list keeps its order (worker
//! N runs on the N-th core listed) and refuses a core listed twice, lists skip empty
//! items, `off` and 0 turn a fwmark or a keepalive off, and ranges are the file's.

use std::fmt;
use std::net::IpAddr;

use crate::config::{
    valid_ifname, valid_peer_name, Endpoint, MasqueradeMode, NtpServer, OffloadMode, OverlapPolicy,
    PollMode, MIN_MTU,
};
use crate::key::Key;
use crate::net::Cidr;

/// Highest core number a `Cores` list may name.
pub const MAX_CORE: usize = 4095;
/// Most buffers a pool may have (`Buffers`).
pub const MAX_BUFFERS: u32 = 1 << 20;

/// The numeric values' ranges, lowest and highest accepted: the parsers below check
/// them and the console's `help` prints them, so the two cannot disagree.
pub const PORT_RANGE: (u16, u16) = (1, u16::MAX);
pub const MTU_RANGE: (u16, u16) = (MIN_MTU, u16::MAX);
pub const KEEPALIVE_RANGE: (u16, u16) = (0, u16::MAX);
pub const BUFFERS_RANGE: (u32, u32) = (1, MAX_BUFFERS);
pub const BBR_RTT_MS_RANGE: (u32, u32) = (0, u32::MAX);

/// A range as `help` and the error messages write it: `576-65535`.
pub fn range_text<T: fmt::Display>(r: (T, T)) -> String {
    format!("{}-{}", r.0, r.1)
}

/// A value that does not read: what was given (cut for echoing) and what is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    /// The input, cut to 64 characters.
    pub value: String,
    /// What would have been accepted, e.g. `on or off`.
    pub expected: String,
}

impl BadValue {
    pub fn new(value: &str, expected: impl Into<String>) -> BadValue {
        let mut s: String = value.chars().take(64).collect();
        if value.chars().count() > 64 {
            s.push('…');
        }
        BadValue {
            value: s,
            expected: expected.into(),
        }
    }
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {}, got `{}`", self.expected, self.value)
    }
}

impl std::error::Error for BadValue {}

impl From<BadValue> for String {
    fn from(e: BadValue) -> String {
        e.to_string()
    }
}

type R<T> = Result<T, BadValue>;

fn digits(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())
}

/// A decimal number in `lo..=hi`.
pub fn number<T>(v: &str, lo: T, hi: T, expected: &str) -> R<T>
where
    T: std::str::FromStr + PartialOrd,
{
    match v.parse::<T>() {
        Ok(n) if digits(v) && n >= lo && n <= hi => Ok(n),
        _ => Err(BadValue::new(v, expected)),
    }
}

/// The items of a comma-separated list, trimmed; empty items are skipped.
pub fn items(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// `on`, `true`, `yes` / `off`, `false`, `no`, any case.
pub fn boolean(v: &str) -> R<bool> {
    match v.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(BadValue::new(v, "on or off")),
    }
}

/// A key as `wg genkey`/`wg pubkey` print it.
pub fn key(v: &str) -> R<Key> {
    Key::from_base64(v)
        .map_err(|_| BadValue::new(v, "a key: 44 characters of base64, as `genkey` prints"))
}

/// A preshared key; the all-zero key is WireGuard's "none".
pub fn preshared_key(v: &str) -> R<Option<Key>> {
    let k = key(v)?;
    Ok((!k.is_zero()).then_some(k))
}

/// A UDP or TCP port, 1-65535.
pub fn port(v: &str) -> R<u16> {
    let (lo, hi) = PORT_RANGE;
    number(
        v,
        lo,
        hi,
        &format!("a port number {}", range_text(PORT_RANGE)),
    )
}

/// `FwMark`: decimal or `0x` hex; `off` or 0 is none.
pub fn fwmark(v: &str) -> R<Option<u32>> {
    let expected = "a number (decimal or 0x hex) or off";
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) if !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u32::from_str_radix(h, 16).ok()
        }
        Some(_) => None,
        None if digits(v) => v.parse().ok(),
        None => None,
    };
    let n = n.ok_or_else(|| BadValue::new(v, expected))?;
    Ok((n != 0).then_some(n))
}

/// `MTU`: 576-65535.
pub fn mtu(v: &str) -> R<u16> {
    let (lo, hi) = MTU_RANGE;
    number(v, lo, hi, &format!("a number {}", range_text(MTU_RANGE)))
}

/// A list of addresses with prefixes (`10.0.0.1/24, fd00::1/64`).
pub fn cidrs(v: &str) -> R<Vec<Cidr>> {
    items(v)
        .map(|s| {
            s.parse::<Cidr>().map_err(|_| {
                BadValue::new(
                    s,
                    "an address with its prefix, e.g. 10.0.0.1/24 or fd00::1/64",
                )
            })
        })
        .collect()
}

/// [`cidrs`] with host bits cleared: allowed IPs are prefixes, not addresses.
pub fn prefixes(v: &str) -> R<Vec<Cidr>> {
    Ok(cidrs(v)?.iter().map(Cidr::network).collect())
}

/// `Endpoint`, `PublicEndpoint`: `1.2.3.4:51820`, `[fd00::1]:51820`, `host.example:51820`.
pub fn endpoint(v: &str) -> R<Endpoint> {
    v.parse::<Endpoint>().map_err(|_| {
        BadValue::new(
            v,
            "HOST:PORT (IPv4:PORT, [IPv6]:PORT or HOSTNAME:PORT, a port 1-65535), e.g. 192.0.2.7:51820, [2001:db8::7]:51820 or vpn.example.com:51820",
        )
    })
}

/// `PersistentKeepalive`: seconds 0-65535 or `off`; 0 and `off` are none.
pub fn keepalive(v: &str) -> R<Option<u16>> {
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let (lo, hi) = KEEPALIVE_RANGE;
    let n = number(
        v,
        lo,
        hi,
        &format!("seconds {} or off", range_text(KEEPALIVE_RANGE)),
    )?;
    Ok((n != 0).then_some(n))
}

/// A peer's `Name`: 1-32 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`.
pub fn peer_name(v: &str) -> R<String> {
    if valid_peer_name(v) {
        Ok(v.to_string())
    } else {
        Err(BadValue::new(
            v,
            "1-32 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`",
        ))
    }
}

/// A Linux interface name: 1-15 characters, no spaces, `/` or `:`.
pub fn ifname(v: &str) -> R<String> {
    if valid_ifname(v) {
        Ok(v.to_string())
    } else {
        Err(BadValue::new(
            v,
            "an interface name (1-15 characters, no spaces, `/` or `:`)",
        ))
    }
}

/// `Cores` (and the daemon's `--cores`): `0,1`, `0-3`, `all`; empty is all. The order is
/// kept — worker N runs on the N-th core listed — and a core listed twice is refused.
pub fn cores(v: &str) -> R<Vec<usize>> {
    if v.is_empty() || v.eq_ignore_ascii_case("all") {
        return Ok(Vec::new());
    }
    let expected = format!("core numbers 0-{MAX_CORE} as a list or ranges (`0,1` or `0-3`) or all");
    let mut out: Vec<usize> = Vec::new();
    for it in items(v) {
        let (a, b) = it.split_once('-').unwrap_or((it, it));
        let lo =
            number(a.trim(), 0, MAX_CORE, &expected).map_err(|_| BadValue::new(it, &expected))?;
        let hi =
            number(b.trim(), 0, MAX_CORE, &expected).map_err(|_| BadValue::new(it, &expected))?;
        if lo > hi {
            return Err(BadValue::new(it, &expected));
        }
        for c in lo..=hi {
            if out.contains(&c) {
                return Err(BadValue::new(
                    v,
                    format!("each core at most once (core {c} is listed twice)"),
                ));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// `TcpListen`: ports, or `off` for none; a port listed twice is refused.
pub fn tcp_listen(v: &str) -> R<Vec<u16>> {
    if v.eq_ignore_ascii_case("off") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for it in items(v) {
        let p = number(it, 1, u16::MAX, "port numbers 1-65535 or off")?;
        if out.contains(&p) {
            return Err(BadValue::new(
                v,
                format!("each port at most once (port {p} is listed twice)"),
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// `Buffers`: 1-1048576.
pub fn buffers(v: &str) -> R<u32> {
    let (lo, hi) = BUFFERS_RANGE;
    number(
        v,
        lo,
        hi,
        &format!("a number of buffers {}", range_text(BUFFERS_RANGE)),
    )
}

/// `BbrRttMs`: milliseconds, 0 (the built-in estimate) to 4294967295.
pub fn bbr_rtt_ms(v: &str) -> R<u32> {
    let (lo, hi) = BBR_RTT_MS_RANGE;
    number(
        v,
        lo,
        hi,
        &format!("milliseconds {}", range_text(BBR_RTT_MS_RANGE)),
    )
}

/// One IP address.
pub fn ip(v: &str) -> R<IpAddr> {
    v.parse()
        .map_err(|_| BadValue::new(v, "an IP address such as 192.0.2.1"))
}

/// A list of IP addresses (`ClientDns`); an address listed twice is refused.
pub fn ips(v: &str) -> R<Vec<IpAddr>> {
    let mut out = Vec::new();
    for a in items(v) {
        let x = a
            .parse::<IpAddr>()
            .map_err(|_| BadValue::new(a, "IP addresses such as 192.168.1.1"))?;
        if out.contains(&x) {
            return Err(BadValue::new(
                v,
                format!("each address at most once ({x} is listed twice)"),
            ));
        }
        out.push(x);
    }
    Ok(out)
}

/// `Syslog`: one collector, `HOST[:PORT][/tcp]`.
pub fn syslog(v: &str) -> R<crate::config::SyslogTarget> {
    crate::config::SyslogTarget::parse(v).map_err(|_| {
        BadValue::new(
            v,
            "a syslog collector: a host name or an IP address, optionally :PORT and /tcp (192.0.2.9, logs.example.net:1514/tcp)",
        )
    })
}

/// `Ntp`: NTP servers (host names or addresses, optionally `:PORT`); none twice.
pub fn ntp_servers(v: &str) -> R<Vec<NtpServer>> {
    let mut out = Vec::new();
    for a in items(v) {
        let n = NtpServer::parse(a).map_err(|_| {
            BadValue::new(
                a,
                "NTP servers: host names or IP addresses, optionally :PORT",
            )
        })?;
        if out.contains(&n) {
            return Err(BadValue::new(
                v,
                format!("each server at most once ({n} is listed twice)"),
            ));
        }
        out.push(n);
    }
    Ok(out)
}

/// `Offload`: auto, gso, mmsg or off.
pub fn offload(v: &str) -> R<OffloadMode> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Ok(OffloadMode::Auto),
        "gso" => Ok(OffloadMode::Gso),
        "mmsg" => Ok(OffloadMode::Mmsg),
        "off" => Ok(OffloadMode::Off),
        _ => Err(BadValue::new(v, "auto, gso, mmsg or off")),
    }
}

/// `Poll`: sleep, adaptive or busy.
pub fn poll(v: &str) -> R<PollMode> {
    PollMode::parse(v).ok_or_else(|| BadValue::new(v, "sleep, adaptive or busy"))
}

/// `[Gateway] Masquerade`: auto, on or off.
pub fn masquerade(v: &str) -> R<MasqueradeMode> {
    MasqueradeMode::parse(v).ok_or_else(|| BadValue::new(v, "auto, on or off"))
}

/// `UplinkOverlap`: auto or refuse.
pub fn uplink_overlap(v: &str) -> R<OverlapPolicy> {
    OverlapPolicy::parse(v).ok_or_else(|| BadValue::new(v, "auto or refuse"))
}

/// `SshKey`: `NAME TYPE BASE64 [COMMENT]`.
pub fn ssh_key(v: &str) -> R<crate::config::SshKey> {
    let v = v.trim();
    let (name, rest) = v.split_once([' ', '\t']).unwrap_or((v, ""));
    if !crate::config::valid_ssh_key_name(name) {
        return Err(BadValue::new(
            name,
            "a key name (1-16 of A-Z a-z 0-9 . _ -, not starting with - or .) and then the key: NAME ssh-ed25519 AAAA... [COMMENT]",
        ));
    }
    let key = crate::ssh_key::PublicKey::parse(rest)
        .map_err(|e| BadValue::new(rest, format!("an SSH public key ({e})")))?;
    Ok(crate::config::SshKey {
        name: name.to_string(),
        key,
    })
}

/// `Access = lan, internet, 192.168.1.10/32 tcp 8096` or `none` (`core::access`).
pub fn access(v: &str) -> R<Vec<crate::access::AccessItem>> {
    crate::access::parse_list(v)
        .map_err(|why| BadValue::new(v, format!("{} ({why})", crate::access::EXPECTED)))
}

/// `Domain = home.arpa`: a DNS name of letter-digit-hyphen labels (RFC 1123), 1 to 63
/// bytes each, at most 200 in all (room for a client's name in front), lowercased.
pub fn domain(v: &str) -> R<String> {
    let d = v.trim_end_matches('.').to_ascii_lowercase();
    if crate::config::valid_dns_name(&d) && d.len() <= 200 {
        Ok(d)
    } else {
        Err(BadValue::new(
            v,
            "a domain name of letters, digits and hyphens, such as home.arpa",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_keep_their_order_and_refuse_repeats() {
        assert_eq!(cores("1,0").unwrap(), vec![1, 0]);
        assert_eq!(
            cores("0-2,5,1").unwrap_err().expected,
            "each core at most once (core 1 is listed twice)"
        );
        assert_eq!(cores("3-1").unwrap_err().value, "3-1");
        assert_eq!(cores("all").unwrap(), Vec::<usize>::new());
        assert_eq!(cores("4096").unwrap_err().value, "4096");
    }

    #[test]
    fn booleans_are_the_files_words() {
        for (v, b) in [
            ("on", true),
            ("YES", true),
            ("true", true),
            ("off", false),
            ("No", false),
        ] {
            assert_eq!(boolean(v), Ok(b));
        }
        for v in ["enable", "1", "0", "disabled", ""] {
            assert!(boolean(v).is_err(), "{v}");
        }
    }

    #[test]
    fn off_and_zero_are_none() {
        assert_eq!(fwmark("0"), Ok(None));
        assert_eq!(fwmark("off"), Ok(None));
        assert_eq!(fwmark("0x1f"), Ok(Some(31)));
        assert!(fwmark("0x").is_err() && fwmark("-1").is_err());
        assert_eq!(keepalive("0"), Ok(None));
        assert_eq!(keepalive("25"), Ok(Some(25)));
        assert!(keepalive("65536").is_err());
    }

    #[test]
    fn a_long_value_is_cut_in_the_message() {
        let e = boolean(&"x".repeat(500)).unwrap_err();
        assert_eq!(e.value.chars().count(), 65);
        assert!(e.to_string().starts_with("expected on or off, got `xxx"));
    }
}
