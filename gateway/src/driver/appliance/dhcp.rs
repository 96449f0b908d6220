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
//! With `--config FILE` (init passes the configuration the gateway runs), every lease
//! offered or acknowledged, and the one restored at start, is judged against the tunnel's
//! routes (`core::uplink_overlap`): a conflicting one is not requested or is DECLINEd, with
//! a back-off; a kept overlap with a wide summary route is written to the lease file as a
//! `shadow` line for `riceguard status`. A lease file whose address is not on the
//! interface any more at start is not believed: the client asks for it again at once.
//!
//! The lease's age counts on CLOCK_BOOTTIME (an NTP step of the wall clock does not make
//! it look expired or fresh): the lease file's `boot BOOT_ID SECS` line; a file from an
//! earlier boot, or without that line, falls back to the wall-clock `obtained`.
//!
//! Log lines start with `dhcp IFACE: `; tests match `bound`, `renewed`, `rebinding`,
//! `lease expired: address removed`, `link down`, `link up: re-acquiring`, `declined`,
//! `is not on IFACE`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType};
use rand_core::RngCore;

use crate::core::dhcp::{
    Client, Event, Ignored, Lease, CLIENT_PORT, DECLINE_WAIT, INFINITE, MAX_REFUSE_WAIT,
    SERVER_PORT,
};
use crate::core::net::Cidr;
use crate::sys::netlink::{Lifetime, Netlink, Route};

// The lease files and resolv.conf go to `run::run_dir()` (`RG_RUN_DIR` moves it, for
// tests that run the client on a host).
use crate::run::lease::{cidr, join, lease_path, valid_ifname, Clocks, LeaseFile};
use crate::run::run_dir;
const CARRIER_POLL: Duration = Duration::from_secs(1);
const USAGE: &str = "usage: riceguard dhcp [--run-dir DIR] [--config FILE] [--event-log DIR] IFACE";

pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let mut dir = run_dir();
    let mut iface = None;
    let mut config = None;
    let mut events = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--run-dir" => match it.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage(),
            },
            "--config" => match it.next() {
                Some(f) => config = Some(PathBuf::from(f)),
                None => return usage(),
            },
            "--event-log" => match it.next() {
                Some(d) => events = Some(PathBuf::from(d)),
                None => return usage(),
            },
            s if iface.is_none() && !s.starts_with('-') && valid_ifname(s) => {
                iface = Some(s.to_string())
            }
            _ => return usage(),
        }
    }
    let Some(iface) = iface else { return usage() };
    let events = crate::perm::event_log::Rare::new(events, "dhcp");
    let rc = match run(&iface, &dir, config, events) {
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
    config: Option<PathBuf>,
    nl: Netlink,
    client: Client,
    /// Bound and lost leases, for perm's event log (`--event-log DIR`).
    events: crate::perm::event_log::Rare,
}

/// Said once while the configuration does not read (and again after it read once).
static CONFIG_UNREADABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The verdict of the configuration at `path` on `lease` for uplink `iface`
/// (`core::uplink_overlap`). A file that does not read decides nothing: `Ok(no lines)`,
/// said once.
fn overlap(iface: &str, path: Option<&Path>, lease: &Lease) -> Result<Vec<String>, String> {
    use std::sync::atomic::Ordering;
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let Some(subnet) = cidr(lease) else {
        return Ok(Vec::new());
    };
    let cfg = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            crate::core::ini::parse(&path.to_string_lossy(), &t).map_err(|e| e.to_string())
        });
    match cfg {
        Ok(cfg) => {
            CONFIG_UNREADABLE.store(false, Ordering::Relaxed);
            crate::core::uplink_overlap::judge_config(iface, subnet, &cfg.running())
        }
        Err(e) => {
            if !CONFIG_UNREADABLE.swap(true, Ordering::Relaxed) {
                log::warn!("dhcp {iface}: {}: {e}: leases are not checked against the tunnel's routes until it reads", path.display());
            }
            Ok(Vec::new())
        }
    }
}

fn run(
    iface: &str,
    dir: &Path,
    config: Option<PathBuf>,
    events: crate::perm::event_log::Rare,
) -> Result<(), String> {
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
    {
        let (i, c) = (iface.to_string(), config.clone());
        client.set_lease_check(Box::new(move |l| overlap(&i, c.as_deref(), l).map(drop)));
    }
    let mut r = Runner {
        iface,
        dir,
        config,
        nl,
        client,
        events,
    };
    r.restore(now);
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
        // Other clients' transactions on a shared segment: normal, not worth a line. A
        // lease refused again within its back-off was said when it was first refused.
        Ignored::ForeignXid | Ignored::ForeignChaddr | Ignored::NotAReply | Ignored::Refused(_) => {
            log::debug!(target: "net::dhcp", "dhcp {iface}: ignored a message from {from}: {why}")
        }
        _ => log::warn!(target: "net::dhcp", "dhcp {iface}: ignored a message from {from}: {why}"),
    }
}

fn default_route(l: &Lease, ifindex: Option<u32>) -> Option<Route> {
    Some(Route {
        dst: Cidr::new(Ipv4Addr::UNSPECIFIED.into(), 0)?,
        gateway: Some(l.router?.into()),
        ifindex,
    })
}

/// The line for a refused lease: the first refusal with its reason, then only when the
/// back-off reaches its cap (a server that keeps offering it).
fn refusal_line(
    iface: &str,
    what: &str,
    lease: String,
    server: Ipv4Addr,
    reason: &str,
    wait: Duration,
    repeat: u32,
) {
    let secs = wait.as_secs();
    // The wait before this one (they double from DECLINE_WAIT).
    let before = DECLINE_WAIT.saturating_mul(1 << repeat.saturating_sub(2).min(16));
    if repeat <= 1 {
        log::warn!("dhcp {iface}: {what} {lease} from {server}: {reason}; retrying in {secs} s");
    } else if wait >= MAX_REFUSE_WAIT && before < MAX_REFUSE_WAIT {
        log::warn!("dhcp {iface}: {server} keeps offering {lease} ({repeat} times): still refused; retrying every {secs} s");
    } else {
        log::debug!(
            "dhcp {iface}: {what} {lease} from {server} again ({repeat} times); retrying in {secs} s"
        );
    }
}

impl Runner<'_> {
    /// A lease from before a restart: confirm it (INIT-REBOOT) and keep it meanwhile —
    /// if its address is still on the interface and the tunnel's routes allow it. Else
    /// only its address is asked for, at once.
    fn restore(&mut self, now: Instant) {
        let iface = self.iface;
        let Ok(text) = std::fs::read_to_string(lease_path(self.dir, iface)) else {
            return;
        };
        let f = match LeaseFile::from_text(&text) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("dhcp {iface}: ignoring the old lease file: {e}");
                return;
            }
        };
        let l = f.lease.clone();
        let age = Duration::from_secs(f.age(&Clocks::now()));
        log::info!(
            "dhcp {iface}: previous lease {}/{} obtained {} s ago",
            l.address,
            l.prefix,
            age.as_secs()
        );
        if let Err(why) = overlap(iface, self.config.as_deref(), &l) {
            log::warn!(
                "dhcp {iface}: previous lease {}/{} not kept: {why}",
                l.address,
                l.prefix
            );
            self.remove(&l);
            self.forget();
            return;
        }
        let on_link = match (self.nl.addresses(iface), cidr(&l)) {
            (Ok(have), Some(c)) => have.contains(&c),
            // Unknown: believe the file, as before.
            _ => true,
        };
        if on_link {
            self.client.restore(now, l, age);
        } else {
            log::info!(
                "dhcp {iface}: previous lease {}/{} is not on {iface} any more: asking for it again now",
                l.address,
                l.prefix
            );
            self.client.remember(l.address);
        }
    }

    /// Record a lease bound or lost in the event log (rare: at most six an hour).
    fn event(&mut self, text: &str) {
        let now = crate::sys::kernel_clocks::boottime().as_secs();
        self.events.say(now, text);
    }

    fn apply(&mut self, now: Instant, ev: Event) {
        let iface = self.iface;
        match ev {
            Event::Bound { lease, replaces } => {
                let new_address = replaces
                    .as_ref()
                    .is_none_or(|o| (o.address, o.prefix) != (lease.address, lease.prefix));
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
                if new_address {
                    self.event(&format!(
                        "{iface}: bound {}/{} router {}",
                        lease.address,
                        lease.prefix,
                        lease.router.map_or("none".into(), |r| r.to_string())
                    ));
                }
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
                self.event(&format!(
                    "{iface}: lease lost (expired, no server answered): {}/{} removed",
                    lease.address, lease.prefix
                ));
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
                prefix,
                server,
                reason,
                removed,
                retry_in,
                repeat,
            } => {
                if let Some(l) = removed {
                    self.remove(&l);
                    self.forget();
                }
                let l = format!("{address}/{prefix}");
                refusal_line(iface, "declined", l, server, &reason, retry_in, repeat);
            }
            Event::OfferRefused {
                address,
                prefix,
                server,
                reason,
                retry_in,
                repeat,
            } => {
                let l = format!("{address}/{prefix}");
                refusal_line(
                    iface,
                    "declined the offer of",
                    l,
                    server,
                    &reason,
                    retry_in,
                    repeat,
                )
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
        let age = self.client.lease_age(now).unwrap_or_default().as_secs();
        let clocks = Clocks::now();
        lease.obtained = clocks.wall.saturating_sub(age);
        let boot = clocks.boot.map(|(id, n)| (id, n.saturating_sub(age)));
        // Checked already; the kept overlaps are what is said here.
        let shadows = overlap(iface, self.config.as_deref(), &lease).unwrap_or_default();
        for l in &shadows {
            log::info!("dhcp {iface}: {l}");
        }
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
        let file = LeaseFile {
            lease: lease.clone(),
            boot,
            shadows,
        };
        if let Err(e) = crate::durable::write(&path, file.to_text().as_bytes(), 0o644) {
            log::warn!("dhcp {iface}: {}: {e}", path.display());
        }
        let mut resolv = format!("# from the DHCP lease of {iface} (riceguard dhcp)\n");
        for d in &lease.dns {
            resolv.push_str(&format!("nameserver {d}\n"));
        }
        let rp = self.dir.join("resolv.conf");
        if let Err(e) = crate::durable::write(&rp, resolv.as_bytes(), 0o644) {
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
        let _ = crate::durable::remove(&lease_path(self.dir, self.iface));
        let _ = crate::durable::remove(&self.dir.join("resolv.conf"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::lease;

    #[test]
    fn overlap_reads_the_configuration_each_time() {
        let dir = std::env::temp_dir().join(format!("rg-dhcp-overlap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("gw.conf");
        let mut l = lease();
        l.address = Ipv4Addr::new(10, 251, 1, 50);
        // No configuration, or one that does not read: nothing decided against the lease.
        assert_eq!(overlap("eth0", None, &l), Ok(vec![]));
        assert_eq!(overlap("eth0", Some(&conf), &l), Ok(vec![]));
        std::fs::write(&conf, "[Peer\n").unwrap();
        assert_eq!(overlap("eth0", Some(&conf), &l), Ok(vec![]));
        let key = "[Interface]\nPrivateKey = 8MHEF0dG1zt34BIRzjr7BDtpU0BjZPKuSyDVoEnTcmc=\nAddress = 10.100.0.1/24\n\n[Peer]\nPublicKey = HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=\n";
        std::fs::write(
            &conf,
            format!("{key}# Name = site-b\nAllowedIPs = 10.251.1.0/24\n"),
        )
        .unwrap();
        let e = overlap("eth0", Some(&conf), &l).unwrap_err();
        assert!(
            e.contains("10.251.1.0/24 (your remote site and your uplink"),
            "{e}"
        );
        std::fs::write(&conf, format!("{key}AllowedIPs = 10.0.0.0/8\n")).unwrap();
        let s = overlap("eth0", Some(&conf), &l).unwrap();
        assert_eq!(s.len(), 1);
        assert!(
            s[0].starts_with("uplink eth0 10.251.1.0/24 shadows 10.251.1.0/24 of peer "),
            "{s:?}"
        );
        std::fs::write(
            &conf,
            format!("{key}AllowedIPs = 10.0.0.0/8\n[Gateway]\nUplinkOverlap = refuse\n"),
        )
        .unwrap();
        assert!(overlap("eth0", Some(&conf), &l)
            .unwrap_err()
            .contains("UplinkOverlap = refuse"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
