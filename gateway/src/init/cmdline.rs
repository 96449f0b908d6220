//! The `riceguard.*` options on the kernel command line: which slot booted (set by the
//! slot's UKI) and an optional uplink override (tests and first-boot bring-up use it).

use std::net::IpAddr;

use crate::core::net::Cidr;

/// What init reads from `/proc/cmdline`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cmdline {
    /// `riceguard.slot=a|b`.
    pub slot: Option<char>,
    /// `riceguard.uplink=ADDR/PFX[,gw=GW][,dev=IF]`.
    pub uplink: Option<UplinkSpec>,
    /// `riceguard.selftest=restart`: once the gateway is up, kill it once so the image
    /// test sees the supervisor restart it (never set on a shipped image).
    pub selftest_restart: bool,
    /// `riceguard.selftest=unhealthy`: never see the gateway as healthy and give up after
    /// 20 s, so the update test sees a slot on trial fail its health check (test images only).
    pub selftest_unhealthy: bool,
    /// `riceguard.selftest=hang`: once the gateway is up, freeze its worker heartbeats
    /// once (SIGUSR2; the gateway gets `--selftest-hang`), so the image test sees the
    /// health watch restart it (test images only).
    pub selftest_hang: bool,
    /// Problems found, for the console; a bad option is ignored, never fatal.
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UplinkSpec {
    pub address: Cidr,
    pub gateway: Option<IpAddr>,
    pub dev: Option<String>,
}

pub fn parse(s: &str) -> Cmdline {
    let mut c = Cmdline::default();
    for word in s.split_whitespace().take(512) {
        if let Some(v) = word.strip_prefix("riceguard.slot=") {
            match v {
                "a" | "A" => c.slot = Some('a'),
                "b" | "B" => c.slot = Some('b'),
                _ => c
                    .errors
                    .push(format!("riceguard.slot=`{v}`: expected a or b")),
            }
        } else if word == "riceguard.selftest=restart" {
            c.selftest_restart = true;
        } else if word == "riceguard.selftest=unhealthy" {
            c.selftest_unhealthy = true;
        } else if word == "riceguard.selftest=hang" {
            c.selftest_hang = true;
        } else if let Some(v) = word.strip_prefix("riceguard.uplink=") {
            match parse_uplink(v) {
                Ok(u) => c.uplink = Some(u),
                Err(e) => c.errors.push(format!("riceguard.uplink=`{v}`: {e}")),
            }
        }
    }
    c
}

fn parse_uplink(v: &str) -> Result<UplinkSpec, String> {
    let mut parts = v.split(',');
    let addr = parts.next().unwrap_or_default();
    let address = parse_cidr(addr)?;
    let mut u = UplinkSpec {
        address,
        gateway: None,
        dev: None,
    };
    for p in parts {
        if let Some(g) = p.strip_prefix("gw=") {
            u.gateway = Some(
                g.parse()
                    .map_err(|_| format!("gateway `{g}` is not an IP address"))?,
            );
        } else if let Some(d) = p.strip_prefix("dev=") {
            if d.is_empty() || d.len() > 15 || d.contains('/') {
                return Err(format!("`{d}` is not an interface name"));
            }
            u.dev = Some(d.to_string());
        } else {
            return Err(format!("unknown part `{p}` (expected gw=GW or dev=IF)"));
        }
    }
    Ok(u)
}

pub fn parse_cidr(s: &str) -> Result<Cidr, String> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` needs a prefix length (ADDR/PFX)"))?;
    let ip: IpAddr = a
        .parse()
        .map_err(|_| format!("`{a}` is not an IP address"))?;
    let pfx: u8 = p
        .parse()
        .map_err(|_| format!("`{p}` is not a prefix length"))?;
    Cidr::new(ip, pfx).ok_or_else(|| format!("prefix /{pfx} is too long for {ip}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_and_uplink() {
        let c = parse("console=ttyS0 riceguard.slot=b quiet riceguard.uplink=192.0.2.2/24,gw=192.0.2.1,dev=eth0");
        assert_eq!(c.slot, Some('b'));
        let u = c.uplink.unwrap();
        assert_eq!(u.address, parse_cidr("192.0.2.2/24").unwrap());
        assert_eq!(u.gateway, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(u.dev.as_deref(), Some("eth0"));
        assert!(c.errors.is_empty());
        assert!(!c.selftest_restart);
        assert!(parse("riceguard.selftest=restart").selftest_restart);
        assert!(!c.selftest_hang);
        assert!(parse("riceguard.selftest=hang").selftest_hang);
    }

    #[test]
    fn bad_options_are_reported_not_fatal() {
        let c = parse("riceguard.slot=c riceguard.uplink=1.2.3.4 riceguard.uplink=fd00::2/129");
        assert_eq!(c.slot, None);
        assert_eq!(c.uplink, None);
        assert_eq!(c.errors.len(), 3);
        let c = parse("riceguard.uplink=10.0.0.2/8,gw=x");
        assert!(c.errors[0].contains("gateway"));
    }
}
