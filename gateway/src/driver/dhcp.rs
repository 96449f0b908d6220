//! `riceguard dhcp IFACE`: the uplink's DHCPv4 client process (init supervises it when no
//! static `UplinkAddress` is set). It runs `core::dhcp::Client` over a UDP socket on port
//! 68 bound to the device (`SO_BINDTODEVICE`, `SO_BROADCAST`; the BROADCAST flag makes
//! servers broadcast their answers until we have an address, so no raw socket is needed),
//! applies each lease over rtnetlink — the address with the lease's remaining lifetime
//! (the kernel itself drops it when the lease ends, a renewal moves that end), the
//! default route via the router — and writes `/run/riceguard/resolv.conf` (the image's
//! `/etc/resolv.conf` points there) and the lease file `/run/riceguard/lease.IFACE`. The
//! carrier is watched once a second; after a flap the client re-acquires (INIT-REBOOT).
//!
//! Log lines start with `dhcp IFACE: `; tests match `bound`, `renewed`, `rebinding`,
//! `lease expired: address removed`, `link down`, `link up: re-acquiring`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::socket::{setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType};
use rand_core::RngCore;

use crate::core::dhcp::{Client, Event, Ignored, Lease, CLIENT_PORT, INFINITE, SERVER_PORT};
use crate::core::net::Cidr;
use crate::sys::netlink::{Lifetime, Netlink, Route};

/// Where the lease files and resolv.conf go (`RG_RUN_DIR` overrides it, for tests that
/// run the client on a host).
pub const RUN_DIR: &str = "/run/riceguard";

fn run_dir() -> PathBuf {
    std::env::var_os("RG_RUN_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(RUN_DIR), PathBuf::from)
}
const CARRIER_POLL: Duration = Duration::from_secs(1);
const USAGE: &str = "usage: riceguard dhcp [--run-dir DIR] IFACE";

pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let mut dir = run_dir();
    let mut iface = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--run-dir" => match it.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage(),
            },
            s if iface.is_none() && !s.starts_with('-') && valid_ifname(s) => {
                iface = Some(s.to_string())
            }
            _ => return usage(),
        }
    }
    let Some(iface) = iface else { return usage() };
    let rc = match run(&iface, &dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("dhcp {iface}: {e}");
            ExitCode::from(1)
        }
    };
    crate::logger::flush();
    rc
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

fn valid_ifname(s: &str) -> bool {
    !s.is_empty() && s.len() < 16 && !s.contains('/') && s != "." && s != ".."
}

fn wall_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn lease_path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("lease.{iface}"))
}

/// The interface's MAC address, from sysfs.
fn mac_address(iface: &str) -> Result<[u8; 6], String> {
    let p = format!("/sys/class/net/{iface}/address");
    let t = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    let bytes: Vec<u8> = t
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{p}: `{}` is not a MAC address", t.trim()))?;
    <[u8; 6]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{iface} has no Ethernet address (`{}`)", t.trim()))
}

/// Carrier from sysfs; reading fails (EINVAL) while the link is administratively down.
fn carrier(iface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/carrier"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

fn open_socket(iface: &str) -> Result<UdpSocket, String> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("UDP socket: {e}"))?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    setsockopt(&fd, sockopt::Broadcast, &true).map_err(|e| format!("SO_BROADCAST: {e}"))?;
    setsockopt(&fd, sockopt::BindToDevice, &std::ffi::OsString::from(iface))
        .map_err(|e| format!("SO_BINDTODEVICE {iface}: {e}"))?;
    let sock = UdpSocket::from(fd);
    sock.set_broadcast(true)
        .map_err(|e| format!("SO_BROADCAST: {e}"))?;
    // std's bind takes an address only on a new socket: bind through nix on the fd.
    nix::sys::socket::bind(
        sock.as_raw_fd(),
        &nix::sys::socket::SockaddrIn::new(0, 0, 0, 0, CLIENT_PORT),
    )
    .map_err(|e| {
        format!("bind UDP port {CLIENT_PORT} on {iface}: {e} (another DHCP client running?)")
    })?;
    Ok(sock)
}

/// The effective `rp_filter` of the uplink (the larger of `all` and the device's).
fn rp_filter(iface: &str) -> u32 {
    let read = |k: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{k}/rp_filter"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    read("all").max(read(iface))
}

/// Say when reverse-path filtering (strict or loose) would drop the server's answers
/// while the uplink has no address and no route to the server: the kernel checks the
/// source of a broadcast before any socket sees it. Said again only when it changes.
fn check_rp_filter(iface: &str, last: &mut u32) {
    let v = rp_filter(iface);
    if v != *last && v != 0 {
        log::warn!("dhcp {iface}: rp_filter is {v}: while the uplink has no address, the server's answers are dropped by the kernel; set net.ipv4.conf.all.rp_filter and net.ipv4.conf.{iface}.rp_filter to 0");
    }
    *last = v;
}

struct Runner<'a> {
    iface: &'a str,
    dir: &'a Path,
    nl: Netlink,
    client: Client,
}

fn run(iface: &str, dir: &Path) -> Result<(), String> {
    let mac = mac_address(iface)?;
    let sock = open_socket(iface)?;
    let nl = Netlink::open().map_err(|e| e.to_string())?;
    let _ = std::fs::create_dir_all(dir);
    let mut rp_seen = 0;
    check_rp_filter(iface, &mut rp_seen);
    let now = Instant::now();
    let mut client = Client::new(mac, rand_core::OsRng.next_u64(), now);
    if let Ok(h) = nix::unistd::gethostname() {
        client.set_hostname(&h.to_string_lossy());
    }
    // A lease from before a restart: confirm it (INIT-REBOOT), keep it meanwhile.
    if let Ok(text) = std::fs::read_to_string(lease_path(dir, iface)) {
        match Lease::from_text(&text) {
            Ok(l) => {
                let age = Duration::from_secs(wall_secs().saturating_sub(l.obtained));
                log::info!(
                    "dhcp {iface}: previous lease {}/{} obtained {} s ago",
                    l.address,
                    l.prefix,
                    age.as_secs()
                );
                client.restore(now, l, age);
            }
            Err(e) => log::warn!("dhcp {iface}: ignoring the old lease file: {e}"),
        }
    }
    let mut r = Runner {
        iface,
        dir,
        nl,
        client,
    };
    let mut up = carrier(iface);
    if up {
        log::info!("dhcp {iface}: link up: acquiring");
        r.client.start(now);
    } else {
        log::info!("dhcp {iface}: link down: waiting for carrier");
        r.client.link_down(now);
    }
    let mut next_carrier = now + CARRIER_POLL;
    let mut buf = vec![0u8; 1500];
    loop {
        let now = Instant::now();
        if now >= next_carrier {
            next_carrier = now + CARRIER_POLL;
            let c = carrier(iface);
            if c != up {
                up = c;
                if c {
                    log::info!("dhcp {iface}: link up: re-acquiring");
                    r.client.link_up(now);
                } else {
                    log::info!("dhcp {iface}: link down");
                    r.client.link_down(now);
                }
            }
        }
        r.client.handle_timeout(now);
        while let Some(tx) = r.client.poll_transmit(now) {
            if r.client.lease().is_none() {
                check_rp_filter(iface, &mut rp_seen);
            }
            let to = SocketAddrV4::new(tx.to.unwrap_or(Ipv4Addr::BROADCAST), SERVER_PORT);
            if let Err(e) = sock.send_to(&tx.payload, to) {
                log::warn!(target: "net::dhcp", "dhcp {iface}: send to {to}: {e}");
            }
        }
        while let Some(ev) = r.client.poll_event() {
            r.apply(now, ev);
        }
        let wake = r
            .client
            .poll_timeout()
            .map_or(next_carrier, |t| t.min(next_carrier));
        let wait = wake
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(wait))
            .map_err(|e| format!("socket timeout: {e}"))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                let now = Instant::now();
                let src = match from {
                    SocketAddr::V4(a) => Some(*a.ip()),
                    SocketAddr::V6(_) => None,
                };
                if let Err(why) = r.client.handle_reply_from(now, &buf[..n], src) {
                    note_ignored(iface, from, &why);
                }
                while let Some(ev) = r.client.poll_event() {
                    r.apply(now, ev);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                log::warn!(target: "net::dhcp", "dhcp {iface}: receive: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn note_ignored(iface: &str, from: SocketAddr, why: &Ignored) {
    match why {
        // Other clients' transactions on a shared segment: normal, not worth a line.
        Ignored::ForeignXid | Ignored::ForeignChaddr | Ignored::NotAReply => {
            log::debug!(target: "net::dhcp", "dhcp {iface}: ignored a message from {from}: {why}")
        }
        _ => log::warn!(target: "net::dhcp", "dhcp {iface}: ignored a message from {from}: {why}"),
    }
}

fn join(v: &[Ipv4Addr]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn cidr(l: &Lease) -> Option<Cidr> {
    Cidr::new(l.address.into(), l.prefix)
}

fn default_route(l: &Lease, ifindex: Option<u32>) -> Option<Route> {
    Some(Route {
        dst: Cidr::new(Ipv4Addr::UNSPECIFIED.into(), 0)?,
        gateway: Some(l.router?.into()),
        ifindex,
    })
}

impl Runner<'_> {
    fn apply(&mut self, now: Instant, ev: Event) {
        let iface = self.iface;
        match ev {
            Event::Bound { lease, replaces } => {
                if let Some(old) = replaces {
                    if (old.address, old.prefix) != (lease.address, lease.prefix) {
                        self.remove(&old);
                    } else if old.router != lease.router {
                        self.remove_route(&old);
                    }
                }
                let lease = self.install(now, lease);
                log::info!(
                    "dhcp {iface}: bound {}/{} router {} dns {} lease {}s",
                    lease.address,
                    lease.prefix,
                    lease.router.map_or("none".into(), |r| r.to_string()),
                    join(&lease.dns),
                    lease.lease_secs
                );
            }
            Event::Renewed(lease) => {
                let lease = self.install(now, lease);
                log::info!(
                    "dhcp {iface}: renewed {}/{} lease {}s",
                    lease.address,
                    lease.prefix,
                    lease.lease_secs
                );
            }
            Event::Renewing => match self.client.lease() {
                Some(l) => log::info!("dhcp {iface}: renewing with {}", l.server),
                None => log::info!("dhcp {iface}: renewing"),
            },
            Event::Rebinding => log::info!("dhcp {iface}: rebinding"),
            Event::Expired(lease) => {
                self.remove(&lease);
                self.forget();
                log::info!(
                    "dhcp {iface}: lease expired: address removed ({}/{})",
                    lease.address,
                    lease.prefix
                );
            }
            Event::Nak {
                server,
                message,
                removed,
            } => {
                let m = if message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", message.escape_debug())
                };
                match removed {
                    Some(l) => {
                        self.remove(&l);
                        self.forget();
                        log::info!(
                            "dhcp {iface}: NAK from {server}{m}: address {}/{} removed",
                            l.address,
                            l.prefix
                        );
                    }
                    None => log::info!("dhcp {iface}: NAK from {server}{m}: starting over"),
                }
            }
            Event::Declined {
                address,
                reason,
                removed,
            } => {
                if let Some(l) = removed {
                    self.remove(&l);
                    self.forget();
                }
                log::warn!("dhcp {iface}: declined {address}: {reason}");
            }
            Event::RebootUnanswered { keeping } => match keeping {
                Some(a) => log::info!(
                    "dhcp {iface}: no answer to INIT-REBOOT: keeping {a} until the lease ends"
                ),
                None => log::info!("dhcp {iface}: no answer to INIT-REBOOT: discovering"),
            },
        }
    }

    /// Put the lease on the link and in the files; returns it with `obtained` set.
    fn install(&mut self, now: Instant, mut lease: Lease) -> Lease {
        let iface = self.iface;
        let age = self.client.lease_age(now).unwrap_or_default();
        lease.obtained = wall_secs().saturating_sub(age.as_secs());
        let valid = if lease.lease_secs == INFINITE {
            INFINITE
        } else {
            let left = self.client.lease_remaining(now).unwrap_or_default();
            (left.as_secs().clamp(1, u64::from(INFINITE - 1))) as u32
        };
        if let Some(c) = cidr(&lease) {
            let life = Lifetime {
                valid,
                preferred: valid,
            };
            if let Err(e) = self.nl.add_address_lifetime(iface, c, life) {
                log::warn!("dhcp {iface}: {e}");
            }
        }
        let idx = Netlink::ifindex(iface).ok();
        if let Some(r) = default_route(&lease, idx) {
            if let Err(e) = self.nl.add_route(r) {
                log::warn!("dhcp {iface}: default route: {e}");
            }
        }
        let path = lease_path(self.dir, iface);
        if let Err(e) = crate::store::write(&path, lease.to_text().as_bytes(), 0o644) {
            log::warn!("dhcp {iface}: {}: {e}", path.display());
        }
        let mut resolv = format!("# from the DHCP lease of {iface} (riceguard dhcp)\n");
        for d in &lease.dns {
            resolv.push_str(&format!("nameserver {d}\n"));
        }
        let rp = self.dir.join("resolv.conf");
        if let Err(e) = crate::store::write(&rp, resolv.as_bytes(), 0o644) {
            log::warn!("dhcp {iface}: {}: {e}", rp.display());
        }
        lease
    }

    fn remove_route(&mut self, lease: &Lease) {
        let idx = Netlink::ifindex(self.iface).ok();
        if let Some(r) = default_route(lease, idx) {
            if let Err(e) = self.nl.delete_route(r) {
                log::warn!("dhcp {}: {e}", self.iface);
            }
        }
    }

    /// Take a lease's route and address off the link.
    fn remove(&mut self, lease: &Lease) {
        self.remove_route(lease);
        if let Some(c) = cidr(lease) {
            if let Err(e) = self.nl.delete_address(self.iface, c) {
                log::warn!("dhcp {}: {e}", self.iface);
            }
        }
    }

    /// No lease any more: the lease file and resolv.conf go.
    fn forget(&mut self) {
        let _ = crate::store::remove(&lease_path(self.dir, self.iface));
        let _ = crate::store::remove(&self.dir.join("resolv.conf"));
    }
}

/// One line per lease file in `/run/riceguard`, for `riceguard status` and the
/// console's `show status`.
pub fn lease_lines() -> Vec<String> {
    lease_lines_in(&run_dir(), wall_secs())
}

/// [`lease_lines`] for a directory and a wall-clock time (unix seconds).
pub fn lease_lines_in(dir: &Path, now: u64) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with("lease.") && n.len() > 6)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .take(16)
        .map(|n| {
            let iface = &n[6..];
            match std::fs::read_to_string(dir.join(&n))
                .map_err(|e| e.to_string())
                .and_then(|t| Lease::from_text(&t))
            {
                Ok(l) => format_lease(iface, &l, now),
                Err(e) => format!("uplink {iface}: DHCP lease file unreadable: {e}"),
            }
        })
        .collect()
}

/// `uplink eth0: DHCP 192.168.77.2/24 router 192.168.77.1 dns 192.168.77.1 server
/// 192.168.77.1, expires in 113 s (renews in 53 s)`.
pub fn format_lease(iface: &str, l: &Lease, now: u64) -> String {
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
    let at = |secs: u32| l.obtained.saturating_add(secs.into()) as i128 - now as i128;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            address: Ipv4Addr::new(192, 168, 77, 2),
            prefix: 24,
            router: Some(Ipv4Addr::new(192, 168, 77, 1)),
            dns: vec![Ipv4Addr::new(192, 168, 77, 1)],
            ntp: vec![],
            server: Ipv4Addr::new(192, 168, 77, 1),
            lease_secs: 120,
            t1_secs: 60,
            t2_secs: 105,
            obtained: 1000,
        }
    }

    #[test]
    fn lease_line_says_address_router_dns_and_times() {
        assert_eq!(
            format_lease("eth0", &lease(), 1007),
            "uplink eth0: DHCP 192.168.77.2/24 router 192.168.77.1 dns 192.168.77.1 server 192.168.77.1, expires in 113 s (renews in 53 s)"
        );
        assert!(format_lease("eth0", &lease(), 1070).ends_with("expires in 50 s (renewing)"));
        assert!(format_lease("eth0", &lease(), 1110).ends_with("(rebinding)"));
        assert!(format_lease("eth0", &lease(), 1130).ends_with("expired 10 s ago"));
    }

    #[test]
    fn lease_lines_read_every_lease_file() {
        let dir = std::env::temp_dir().join(format!("rg-dhcp-lines-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lease.eth0"), lease().to_text()).unwrap();
        std::fs::write(dir.join("lease.eth1"), "garbage").unwrap();
        std::fs::write(dir.join("resolv.conf"), "nameserver 1.1.1.1\n").unwrap();
        let lines = lease_lines_in(&dir, 1007);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("uplink eth0: DHCP 192.168.77.2/24"));
        assert!(lines[1].starts_with("uplink eth1: DHCP lease file unreadable"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(lease_lines_in(&dir, 0).is_empty());
    }
}
