//! The DHCP client's lease files, `RUN_DIR/lease.IFACE`: written by `riceguard dhcp`
//! and read by it at start, by `riceguard ntp` (option 42), by the console (`add
//! client`) and by `riceguard status` / `show status`. [`LeaseFile`] is the format (the
//! core's `Lease` text plus the lines only the appliance writes and older readers skip),
//! [`lease_lines`] what is shown of them, [`lease_dns`] and [`lease_router`] what the
//! console takes from them.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::core::dhcp::Lease;
use crate::core::net::Cidr;
use crate::sys::netlink::Netlink;

use super::run_dir;

/// Whether `s` can name an interface (and so a lease file).
pub fn valid_ifname(s: &str) -> bool {
    !s.is_empty() && s.len() < 16 && !s.contains('/') && s != "." && s != ".."
}

fn wall_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Seconds on CLOCK_BOOTTIME (monotonic, counts suspend, never stepped).
fn boot_secs() -> Option<u64> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .ok()
        .and_then(|t| u64::try_from(t.tv_sec()).ok())
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_string())
}

/// The clocks a lease's age is told by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clocks {
    pub wall: u64,
    pub boot: Option<(String, u64)>,
}

impl Clocks {
    pub fn now() -> Clocks {
        Clocks {
            wall: wall_secs(),
            boot: boot_id().zip(boot_secs()),
        }
    }
}

/// A lease file: the lease (`core::dhcp::Lease`'s text form) and the lines only this
/// driver writes and reads (older readers skip them): `boot BOOT_ID SECS` (CLOCK_BOOTTIME
/// when the lease's times began) and `shadow TEXT` (a kept overlap with a tunnel route).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFile {
    pub lease: Lease,
    pub boot: Option<(String, u64)>,
    pub shadows: Vec<String>,
}

impl LeaseFile {
    pub fn to_text(&self) -> String {
        let mut s = self.lease.to_text();
        if let Some((id, secs)) = &self.boot {
            s.push_str(&format!("boot {id} {secs}\n"));
        }
        for l in &self.shadows {
            s.push_str(&format!("shadow {}\n", l.replace('\n', " ")));
        }
        s
    }

    pub fn from_text(text: &str) -> Result<LeaseFile, String> {
        let lease = Lease::from_text(text)?;
        let mut boot = None;
        let mut shadows = Vec::new();
        for line in text.lines().take(64) {
            if let Some(v) = line.strip_prefix("boot ") {
                let mut w = v.split_whitespace();
                if let (Some(id), Some(Ok(n)), None) =
                    (w.next(), w.next().map(str::parse), w.next())
                {
                    boot = Some((id.to_string(), n));
                }
            } else if let Some(v) = line.strip_prefix("shadow ") {
                if shadows.len() < 8 {
                    shadows.push(v.chars().take(200).collect());
                }
            }
        }
        Ok(LeaseFile {
            lease,
            boot,
            shadows,
        })
    }

    /// Seconds since the lease's times began: on the boot-time clock within the boot
    /// that wrote it, else (an earlier boot, an older file) by the wall clock.
    pub fn age(&self, now: &Clocks) -> u64 {
        match (&self.boot, &now.boot) {
            (Some((id, at)), Some((nid, n))) if id == nid => n.saturating_sub(*at),
            _ => now.wall.saturating_sub(self.lease.obtained),
        }
    }
}
/// A lease file's path: `dir/lease.IFACE`.
pub fn lease_path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("lease.{iface}"))
}

/// The lease's address with its prefix.
pub fn cidr(l: &Lease) -> Option<Cidr> {
    Cidr::new(l.address.into(), l.prefix)
}

/// Addresses as the lease lines list them (`none` for none).
pub fn join(v: &[Ipv4Addr]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The lines of the uplink leases in `/run/riceguard` for `riceguard status` and the
/// console's `show status`: a lease and its `shadow` lines.
///
/// Only a lease of an uplink this run directory's DHCP client serves is shown: its file
/// names an interface that exists and holds the lease's address (the client puts it on
/// with the lease's lifetime, so the kernel drops it when the lease ends). A file left by
/// something else — another namespace, a stopped client whose lease ran out — says
/// nothing about this appliance's uplink.
pub fn lease_lines() -> Vec<String> {
    let mut nl = Netlink::open().ok();
    let mut held = |iface: &str, c: Cidr| -> bool {
        nl.as_mut()
            .and_then(|n| n.addresses(iface).ok())
            .is_some_and(|a| a.contains(&c))
    };
    lease_lines_in(&run_dir(), &Clocks::now(), &mut held)
}

/// [`lease_lines`] for a directory, the clocks now, and whether an interface holds an
/// address.
pub fn lease_lines_in(
    dir: &Path,
    now: &Clocks,
    held: &mut dyn FnMut(&str, Cidr) -> bool,
) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with("lease.") && n.len() > 6 && valid_ifname(&n[6..]))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut out = Vec::new();
    for n in names.into_iter().take(16) {
        let iface = &n[6..];
        let f = std::fs::read_to_string(dir.join(&n))
            .map_err(|e| e.to_string())
            .and_then(|t| LeaseFile::from_text(&t));
        match f {
            Ok(f) if cidr(&f.lease).is_some_and(|c| held(iface, c)) => {
                out.push(format_lease(iface, &f.lease, f.age(now)));
                out.extend(f.shadows.iter().cloned());
            }
            Ok(_) => {}
            Err(e) => out.push(format!("uplink {iface}: DHCP lease file unreadable: {e}")),
        }
    }
    out
}

/// `uplink eth0: DHCP 192.168.77.2/24 router 192.168.77.1 dns 192.168.77.1 server
/// 192.168.77.1, expires in 113 s (renews in 53 s)`, for a lease obtained `age` s ago.
pub fn format_lease(iface: &str, l: &Lease, age: u64) -> String {
    let mut s = format!("uplink {iface}: DHCP {}/{}", l.address, l.prefix);
    if let Some(r) = l.router {
        s.push_str(&format!(" router {r}"));
    }
    if !l.dns.is_empty() {
        s.push_str(&format!(" dns {}", join(&l.dns)));
    }
    s.push_str(&format!(" server {}", l.server));
    if l.is_infinite() {
        s.push_str(", never expires");
        return s;
    }
    let at = |secs: u32| i128::from(secs) - i128::from(age);
    let (exp, t1, t2) = (at(l.lease_secs), at(l.t1_secs), at(l.t2_secs));
    if exp <= 0 {
        s.push_str(&format!(", expired {} s ago", -exp));
    } else if t1 > 0 {
        s.push_str(&format!(", expires in {exp} s (renews in {t1} s)"));
    } else if t2 > 0 {
        s.push_str(&format!(", expires in {exp} s (renewing)"));
    } else {
        s.push_str(&format!(", expires in {exp} s (rebinding)"));
    }
    s
}

/// The router in the DHCP lease of interface `name` (`dir/lease.NAME`), if any.
pub fn lease_router(dir: &Path, name: &str) -> Option<std::net::IpAddr> {
    if name.is_empty() || name.contains('/') {
        return None;
    }
    std::fs::read_to_string(dir.join(format!("lease.{name}")))
        .ok()
        .and_then(|t| Lease::from_text(&t).ok())
        .and_then(|l| l.router)
        .map(std::net::IpAddr::V4)
}

/// The DNS servers in the DHCP lease of interface `name`, read from `dir/lease.NAME`
/// (written by `riceguard dhcp`, format `core::dhcp::Lease::to_text`). None when there is
/// no lease (a static uplink) or it does not read.
pub fn lease_dns(dir: &Path, name: &str) -> Vec<std::net::IpAddr> {
    if name.is_empty() || name.contains('/') {
        return Vec::new();
    }
    std::fs::read_to_string(dir.join(format!("lease.{name}")))
        .ok()
        .and_then(|t| Lease::from_text(&t).ok())
        .map(|l| l.dns.into_iter().map(std::net::IpAddr::V4).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::lease;

    #[test]
    fn lease_line_says_address_router_dns_and_times() {
        assert_eq!(
            format_lease("eth0", &lease(), 7),
            "uplink eth0: DHCP 192.168.77.2/24 router 192.168.77.1 dns 192.168.77.1 server 192.168.77.1, expires in 113 s (renews in 53 s)"
        );
        assert!(format_lease("eth0", &lease(), 70).ends_with("expires in 50 s (renewing)"));
        assert!(format_lease("eth0", &lease(), 110).ends_with("(rebinding)"));
        assert!(format_lease("eth0", &lease(), 130).ends_with("expired 10 s ago"));
    }

    fn clocks(wall: u64, boot: Option<(&str, u64)>) -> Clocks {
        Clocks {
            wall,
            boot: boot.map(|(i, n)| (i.to_string(), n)),
        }
    }

    #[test]
    fn lease_age_counts_on_the_boot_clock_within_a_boot() {
        let f = LeaseFile {
            lease: lease(),
            boot: Some(("b1".into(), 500)),
            shadows: vec![
                "uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8".into(),
            ],
        };
        let t = f.to_text();
        assert!(t.ends_with("obtained 1000\nboot b1 500\nshadow uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8\n"), "{t}");
        assert_eq!(LeaseFile::from_text(&t), Ok(f.clone()));
        // The older reader still reads it.
        assert_eq!(Lease::from_text(&t), Ok(lease()));
        // An NTP step of the wall clock (a year forward, or back to 1970) changes nothing.
        assert_eq!(f.age(&clocks(1000 + 31_536_000, Some(("b1", 507)))), 7);
        assert_eq!(f.age(&clocks(5, Some(("b1", 507)))), 7);
        // Another boot, or no boot clock: the wall clock.
        assert_eq!(f.age(&clocks(1030, Some(("b2", 3)))), 30);
        assert_eq!(f.age(&clocks(1030, None)), 30);
        // An older file without the line: the wall clock.
        let old = LeaseFile::from_text(&lease().to_text()).unwrap();
        assert_eq!(old.boot, None);
        assert_eq!(old.age(&clocks(1040, Some(("b1", 9)))), 40);
        // A broken boot line is skipped, not fatal.
        let bad = LeaseFile::from_text(&format!("{}boot b1\n", lease().to_text())).unwrap();
        assert_eq!(bad.boot, None);
        assert!(boot_secs().is_some(), "CLOCK_BOOTTIME readable");
    }

    #[test]
    fn lease_lines_only_for_an_uplink_holding_the_lease() {
        let dir = std::env::temp_dir().join(format!("rg-dhcp-lines-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = LeaseFile {
            lease: lease(),
            boot: Some(("b1".into(), 100)),
            shadows: vec![
                "uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8".into(),
            ],
        };
        std::fs::write(dir.join("lease.eth0"), f.to_text()).unwrap();
        // Left by something else: an expired lease of an interface without its address.
        std::fs::write(dir.join("lease.eth2"), lease().to_text()).unwrap();
        std::fs::write(dir.join("lease.eth1"), "garbage").unwrap();
        std::fs::write(dir.join("resolv.conf"), "nameserver 1.1.1.1\n").unwrap();
        let now = clocks(9999, Some(("b1", 107)));
        let mut held = |i: &str, c: Cidr| i == "eth0" && c.to_string() == "192.168.77.2/24";
        let lines = lease_lines_in(&dir, &now, &mut held);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("uplink eth0: DHCP 192.168.77.2/24"));
        assert!(
            lines[0].ends_with("expires in 113 s (renews in 53 s)"),
            "{lines:?}"
        );
        assert_eq!(
            lines[1],
            "uplink eth0 10.1.2.0/24 shadows 10.1.2.0/24 of peer hub's 10.0.0.0/8"
        );
        assert!(lines[2].starts_with("uplink eth1: DHCP lease file unreadable"));
        assert!(!lines.iter().any(|l| l.contains("eth2")), "{lines:?}");
        // Nothing holds it: nothing shown (the drop-in interface's status).
        assert!(lease_lines_in(&dir, &now, &mut |_, _| false)
            .iter()
            .all(|l| l.contains("unreadable")));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(lease_lines_in(&dir, &now, &mut held).is_empty());
    }

    #[test]
    fn dns_from_the_uplink_lease() {
        let d = crate::testutil::TempDir::new("lease-dns");
        std::fs::create_dir_all(&d.0).unwrap();
        assert!(lease_dns(&d.0, "eth0").is_empty(), "no lease: none");
        let l = crate::core::dhcp::Lease {
            address: "192.168.1.20".parse().unwrap(),
            prefix: 24,
            router: Some("192.168.1.1".parse().unwrap()),
            dns: vec!["192.168.1.1".parse().unwrap(), "9.9.9.9".parse().unwrap()],
            ntp: vec![],
            server: "192.168.1.1".parse().unwrap(),
            lease_secs: 3600,
            t1_secs: 1800,
            t2_secs: 3150,
            obtained: 1_700_000_000,
        };
        std::fs::write(d.0.join("lease.eth0"), l.to_text()).unwrap();
        let want: Vec<std::net::IpAddr> =
            vec!["192.168.1.1".parse().unwrap(), "9.9.9.9".parse().unwrap()];
        assert_eq!(lease_dns(&d.0, "eth0"), want);
        assert!(lease_dns(&d.0, "eth1").is_empty());
        assert!(lease_dns(&d.0, "../eth0").is_empty());
        std::fs::write(d.0.join("lease.eth0"), "garbage\n").unwrap();
        assert!(lease_dns(&d.0, "eth0").is_empty(), "unreadable: none");
    }

    /// Bad lease files read as an error or nothing, never a panic.
    #[test]
    fn bad_lease_files() {
        for bad in [
            "",
            "garbage",
            "address\n",
            "address 1.2.3.4/99\n",
            "boot\nshadow\n",
            "\u{0}\u{ffff}",
        ] {
            assert!(LeaseFile::from_text(bad).is_err(), "{bad:?}");
        }
        let t = format!("{}boot b1 x\nboot\nshadow \n", lease().to_text());
        let f = LeaseFile::from_text(&t).unwrap();
        assert_eq!((f.boot, f.shadows), (None, vec![String::new()]));
    }
}
