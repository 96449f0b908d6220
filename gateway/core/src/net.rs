//! Address types shared by the configuration, the UAPI and the allowed-IPs table.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP prefix such as `10.0.0.0/24` or `fd00::1/128`.
///
/// Host bits are kept as written (wg-quick's `Address = 10.0.0.1/24` means "address
/// 10.0.0.1 on a /24"); use [`Cidr::network`] where the masked prefix is wanted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError(pub String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an address or prefix (expected e.g. 10.0.0.1/24 or fd00::1/64)",
            self.0
        )
    }
}

impl std::error::Error for CidrError {}

impl Cidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Cidr> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    pub fn max_prefix(&self) -> u8 {
        if self.addr.is_ipv4() {
            32
        } else {
            128
        }
    }

    /// The order lists of prefixes are kept in: by address (IPv4 first), then length.
    pub fn sort_key(&self) -> (IpAddr, u8) {
        (self.addr, self.prefix)
    }

    /// The prefix with its host bits cleared.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
            }
            IpAddr::V6(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
            }
        };
        Cidr {
            addr,
            prefix: self.prefix,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let (first, last) = self.span();
        ip.is_ipv4() == self.addr.is_ipv4() && (first..=last).contains(&ip_bits(ip))
    }

    /// Whether the two prefixes share an address (one contains the other).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.addr.is_ipv4() == other.addr.is_ipv4() && {
            let (a0, a1) = self.span();
            let (b0, b1) = other.span();
            a0 <= b1 && b0 <= a1
        }
    }

    /// Whether `other` lies inside this prefix (equal counts).
    pub fn covers(&self, other: &Cidr) -> bool {
        self.addr.is_ipv4() == other.addr.is_ipv4()
            && self.prefix <= other.prefix
            && self.contains(other.addr)
    }

    /// The two halves of the prefix (`None` for a host prefix).
    pub fn halves(&self) -> Option<(Cidr, Cidr)> {
        if self.prefix >= self.max_prefix() {
            return None;
        }
        let n = self.network();
        let p = n.prefix + 1;
        let bit = 1u128 << u32::from(self.max_prefix() - p);
        let hi = ip_from_bits(n.addr.is_ipv4(), ip_bits(n.addr) | bit);
        Some((
            Cidr {
                addr: n.addr,
                prefix: p,
            },
            Cidr {
                addr: hi,
                prefix: p,
            },
        ))
    }

    /// The first and last address of the prefix, as numbers ([`ip_bits`]).
    pub fn span(&self) -> (u128, u128) {
        let host_bits = u32::from(self.max_prefix() - self.prefix);
        let host_mask = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let first = ip_bits(self.network().addr);
        (first, first | host_mask)
    }
}

/// `p` (network form) minus every address of `holes`, as the fewest prefixes, in address
/// order: `10.0.0.0/8` minus `10.1.0.0/16` is eight prefixes (10.0.0.0/16, 10.2.0.0/15,
/// ... 10.128.0.0/9). Holes of the other family change nothing.
pub fn subtract(p: Cidr, holes: &[Cidr]) -> Vec<Cidr> {
    let p = p.network();
    if holes.iter().any(|h| h.covers(&p)) {
        return Vec::new();
    }
    if !holes.iter().any(|h| h.overlaps(&p)) {
        return vec![p];
    }
    // A hole overlaps p without covering it: it lies inside, so p is not a host prefix.
    match p.halves() {
        Some((a, b)) => {
            let mut v = subtract(a, holes);
            v.extend(subtract(b, holes));
            v
        }
        None => Vec::new(),
    }
}

/// A link-local address (169.254.0.0/16, fe80::/10): it says nothing about routes.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// An address as a number (IPv4 in the low 32 bits), for range arithmetic.
pub fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of family `v4` numbered `n` ([`ip_bits`] back).
pub fn ip_from_bits(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `ADDR/PREFIX`, or a bare address meaning a host prefix (/32 or /128).
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = || CidrError(s.chars().take(64).collect());
        let t = s.trim();
        let (a, p) = match t.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (t, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| err())?
            }
            Some(_) => return Err(err()),
        };
        Cidr::new(addr, prefix).ok_or_else(err)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The local ports of the TCP sockets in LISTEN state in a `/proc/net/tcp` or
/// `/proc/net/tcp6` text (init asks whether `riceguard ssh` listens before it marks a boot
/// good). Lines that do not read are skipped.
pub fn tcp_listen_ports(proc_net_tcp: &str) -> Vec<u16> {
    const LISTEN: &str = "0A";
    let mut v: Vec<u16> = proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let state = f.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let (_, port) = local.rsplit_once(':')?;
            if port.len() != 4 {
                return None;
            }
            u16::from_str_radix(port, 16).ok()
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_mask() {
        let c: Cidr = "10.1.2.3/24".parse().unwrap();
        assert_eq!(c.network().to_string(), "10.1.2.0/24");
        assert!(c.contains("10.1.2.200".parse().unwrap()));
        assert!(!c.contains("10.1.3.1".parse().unwrap()));
        let h: Cidr = "fd00::1".parse().unwrap();
        assert_eq!(h.prefix, 128);
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0.0/".parse::<Cidr>().is_err());
        assert!("10.0.0.0/+1".parse::<Cidr>().is_err());
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
    }

    fn cs(v: &[Cidr]) -> Vec<String> {
        v.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn subtract_leaves_the_fewest_prefixes() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        assert_eq!(
            cs(&subtract(c("10.0.0.0/8"), &[c("10.1.0.0/16")])),
            [
                "10.0.0.0/16",
                "10.2.0.0/15",
                "10.4.0.0/14",
                "10.8.0.0/13",
                "10.16.0.0/12",
                "10.32.0.0/11",
                "10.64.0.0/10",
                "10.128.0.0/9"
            ]
        );
        // Two holes, one inside the other: the wider one counts.
        assert_eq!(
            cs(&subtract(
                c("10.0.0.0/30"),
                &[c("10.0.0.0/31"), c("10.0.0.1/32")]
            )),
            ["10.0.0.2/31"]
        );
        // Covered, disjoint, the other family, host bits.
        assert!(subtract(c("10.1.2.0/24"), &[c("10.0.0.0/8")]).is_empty());
        assert_eq!(
            cs(&subtract(c("10.1.2.9/24"), &[c("10.1.3.0/24")])),
            ["10.1.2.0/24"]
        );
        assert_eq!(
            cs(&subtract(c("10.1.2.0/24"), &[c("fd00::/8")])),
            ["10.1.2.0/24"]
        );
        assert_eq!(
            cs(&subtract(c("fd00::/126"), &[c("fd00::2/128")])),
            ["fd00::/127", "fd00::3/128"]
        );
        // What is left and the holes cover p exactly, without overlap.
        let p = c("192.168.0.0/16");
        let holes = [c("192.168.88.0/24"), c("192.168.200.7/32")];
        let left = subtract(p, &holes);
        let size = |c: &Cidr| 1u128 << (32 - c.prefix);
        assert_eq!(left.iter().chain(&holes).map(size).sum::<u128>(), size(&p));
        assert!(left.iter().all(|l| holes.iter().all(|h| !l.overlaps(h))));
    }

    #[test]
    fn listen_ports_from_proc_net_tcp() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1569 1 0 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 1570 1 0 100 0 0 10 0\n\
   2: garbage\n";
        assert_eq!(tcp_listen_ports(v4), vec![22]);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue\n\
   0: 00000000000000000000000000000000:08AE 00000000000000000000000000000000:0000 0A 00000000:00000000\n";
        assert_eq!(tcp_listen_ports(v6), vec![2222]);
        assert!(tcp_listen_ports("").is_empty());
    }
}
