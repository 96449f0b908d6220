//! `riceguard ntp`: the SNTP client, a process supervised by init (like `riceguard dhcp`),
//! not a thread of PID 1: it parses what the network sends, so a bug in it must not take
//! init down, and as its own process it runs on a host against test servers
//! (`--dry-run`) without touching the host's clock. The policy is `core::clock`'s; this
//! file joins it to sockets and to the system clock.
//!
//! Servers: `[Gateway] Ntp` of the configuration file (re-read every 10 s: a commit
//! changes it; host names resolved through the system resolver, again every 30 min: the
//! uplink's DNS, so their addresses are [`Origin::Name`], one source all together),
//! else the NTP servers (DHCP option 42, an `ntp A.B.C.D ...` line) of the lease files
//! given with `--lease`. No shipped defaults: the NTP Pool asks vendors for their own
//! zone. One connected UDP socket per query (a fresh source port each time, and the
//! kernel delivers only the server's datagrams to it).
//!
//! After a sync: a step saves the time (ahead of the new clock) before it is made, so a
//! power cut right after still boots at or past any handshake stamped after the step;
//! then the RTC is written. Slews change the clock by under a second, which the saved
//! time's lead covers. The state goes to `RUN_DIR/clock` for `show status` and
//! `riceguard status` (`run::clock::clock_line`).
//!
//! Log lines start with `ntp: `; tests match `stepped the clock`, `slewing`, `refused:`,
//! `kiss-o'-death`, `unsynchronised`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use rand_core::RngCore;

use crate::core::clock::{
    self as policy, fmt_offset, BootRecord, Decision, Event, NtpState, Origin, Policy, Poller,
    ServerId, SntpError, UnixTime,
};
use crate::sys::kernel_clocks;
// The clock's files (their names and formats, the `clock:` and `ntp:` lines) are
// `run::clock`'s: init and the console read them too.
use crate::perm::clock::{save_time, saved_path};
use crate::run::clock::{stamps_in, write_stamps, write_state, BOOT_RECORD};

const REFRESH: Duration = Duration::from_secs(10);
const RESOLVE_OK: Duration = Duration::from_secs(1800);
const RESOLVE_FAILED: Duration = Duration::from_secs(30);
const USAGE: &str = "usage: riceguard ntp [--config FILE] [--lease FILE]... [--server HOST[:PORT]]... [--run-dir DIR] [--dry-run] [--event-log DIR]";

use crate::run::run_dir;

struct Args {
    config: Option<PathBuf>,
    leases: Vec<PathBuf>,
    servers: Vec<crate::core::config::NtpServer>,
    dir: PathBuf,
    dry_run: bool,
    /// `--event-log DIR`: clock steps recorded in DIR's event log.
    event_log: Option<PathBuf>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        config: None,
        leases: Vec::new(),
        servers: Vec::new(),
        dir: run_dir(),
        dry_run: false,
        event_log: None,
    };
    let mut it = args.iter();
    while let Some(x) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{x} needs a value"))
        };
        match x.as_str() {
            "--config" => a.config = Some(val()?.into()),
            "--lease" => a.leases.push(val()?.into()),
            "--server" => a
                .servers
                .push(crate::core::config::NtpServer::parse(&val()?)?),
            "--run-dir" => a.dir = val()?.into(),
            "--dry-run" => a.dry_run = true,
            "--event-log" => a.event_log = Some(val()?.into()),
            _ => return Err(format!("unknown argument `{x}`")),
        }
    }
    Ok(a)
}

pub fn main(args: &[String]) -> ExitCode {
    crate::logger::init();
    let a = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("riceguard ntp: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rc = match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("ntp: {e}");
            ExitCode::from(1)
        }
    };
    crate::logger::flush();
    rc
}

/// The system clock, or (dry run) a virtual one: the host's clock plus what we would have
/// stepped or slewed, so the run behaves as the real one would and changes nothing.
struct Clock {
    dry_run: bool,
    virtual_offset: i64,
    /// The run directory, for [`STAMPS`].
    dir: PathBuf,
    stamps: policy::Stamps,
    /// Init holds the gateway back for the first answer until this boot time at the
    /// earliest (its record's boot time plus `GATEWAY_WAIT`, less a margin): `None` when
    /// it does not hold it.
    held_until: Option<Duration>,
    /// Clock steps, for perm's event log (at most six an hour).
    events: crate::perm::event_log::Rare,
}

impl Clock {
    fn wall(&self) -> UnixTime {
        kernel_clocks::realtime().add_nanos(self.virtual_offset)
    }
    fn step(&mut self, by: i64) -> io::Result<()> {
        if self.dry_run {
            self.virtual_offset = self.virtual_offset.saturating_add(by);
            return Ok(());
        }
        // Saved first: see the module comment. A step back keeps the floor (the stamps
        // already sent run on from the clock before it).
        let ahead = Duration::from_nanos(by.max(0) as u64) + policy::SAVE_AHEAD;
        let st = policy::Stamps {
            agrees: false,
            ..self.stamps
        };
        if let Err(e) = save_time(&saved_path(), ahead, st) {
            log::warn!("ntp: saving the time to {}: {e}", saved_path().display());
        }
        kernel_clocks::step(by)
    }
    fn slew(&mut self, by: i64) -> io::Result<()> {
        if self.dry_run {
            self.virtual_offset = self.virtual_offset.saturating_add(by);
            return Ok(());
        }
        kernel_clocks::slew(by)
    }
    /// Save now that the clock agrees (so a power cut soon after leaves a floor the next
    /// boot may step back from).
    fn save_agreed(&self) {
        if self.dry_run {
            return;
        }
        if let Err(e) = save_time(&saved_path(), policy::SAVE_AHEAD, self.stamps) {
            log::warn!("ntp: saving the time to {}: {e}", saved_path().display());
        }
    }
    fn synced(&self) {
        if self.dry_run {
            return;
        }
        if let Err(e) =
            kernel_clocks::rtc_write(kernel_clocks::RTC, kernel_clocks::realtime().secs())
        {
            log::warn!("ntp: writing the RTC ({}): {e}", kernel_clocks::RTC);
        }
    }
}

/// The NTP servers of a lease file: its `ntp A.B.C.D ...` line (DHCP option 42).
/// Read as the DHCP client wrote it (`core::dhcp::Lease`, which bounds and filters the
/// list); a file that does not read names none.
pub fn lease_ntp(text: &str) -> Vec<Ipv4Addr> {
    crate::core::dhcp::Lease::from_text(text).map_or_else(|_| Vec::new(), |l| l.ntp)
}

/// Gathers the server list: configured names resolved (cached), else DHCP's.
struct Sources {
    resolved: Vec<(crate::core::config::NtpServer, Vec<SocketAddr>, Duration)>,
}

impl Sources {
    fn gather(&mut self, a: &Args, now: Duration) -> Vec<ServerId> {
        let mut configured = a.servers.clone();
        if let Some(c) = &a.config {
            match std::fs::read_to_string(c)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    crate::core::ini::parse(&c.to_string_lossy(), &t).map_err(|e| e.to_string())
                }) {
                Ok(cfg) => configured.extend(cfg.gateway.ntp),
                Err(e) => log::debug!("ntp: {}: {e}", c.display()),
            }
        }
        let mut out = Vec::new();
        for s in configured {
            let name = s.to_string();
            if let Ok(ip) = s.host.parse::<IpAddr>() {
                out.push(ServerId {
                    name,
                    addr: SocketAddr::new(ip, s.port),
                    origin: Origin::Address,
                });
                continue;
            }
            let fresh = self
                .resolved
                .iter()
                .find(|(k, _, due)| *k == s && now < *due)
                .map(|(_, v, _)| v.clone());
            let addrs = match fresh {
                Some(v) => v,
                None => {
                    let r = (s.host.as_str(), s.port).to_socket_addrs();
                    let (v, due) = match r {
                        Ok(it) => {
                            let v: Vec<SocketAddr> = it.take(4).collect();
                            log::info!(
                                "ntp: {name} is {}",
                                v.iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            );
                            (v, now + RESOLVE_OK)
                        }
                        Err(e) => {
                            log::info!(
                                "ntp: resolving {name}: {e}; trying again in {} s",
                                RESOLVE_FAILED.as_secs()
                            );
                            (Vec::new(), now + RESOLVE_FAILED)
                        }
                    };
                    self.resolved.retain(|(k, _, _)| *k != s);
                    self.resolved.push((s.clone(), v.clone(), due));
                    v
                }
            };
            // Through the uplink's resolver: one source with every other name's addresses.
            out.extend(addrs.into_iter().map(|addr| ServerId {
                name: name.clone(),
                addr,
                origin: Origin::Name,
            }));
        }
        if out.is_empty() {
            for l in &a.leases {
                let Ok(t) = std::fs::read_to_string(l) else {
                    continue;
                };
                for ip in lease_ntp(&t) {
                    out.push(ServerId {
                        name: "dhcp".into(),
                        addr: SocketAddr::new(IpAddr::V4(ip), policy::PORT),
                        origin: Origin::Dhcp,
                    });
                }
            }
        }
        out
    }
}

fn send_query(addr: SocketAddr, pkt: &[u8]) -> io::Result<UdpSocket> {
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(local)?;
    s.connect(addr)?;
    s.set_nonblocking(true)?;
    s.send(pkt)?;
    Ok(s)
}

fn run(a: Args) -> Result<(), String> {
    let mut clock = Clock {
        dry_run: a.dry_run,
        virtual_offset: 0,
        dir: a.dir.clone(),
        // A restarted client keeps this boot's lead; it agrees only after an answer.
        stamps: policy::Stamps {
            agrees: false,
            ..stamps_in(&a.dir)
        },
        held_until: None,
        events: crate::perm::event_log::Rare::new(a.event_log.clone(), "ntp"),
    };
    write_stamps(&a.dir, clock.stamps);
    let dry = if a.dry_run {
        " (dry run: the clock is not changed)"
    } else {
        ""
    };
    let boot = std::fs::read_to_string(a.dir.join(BOOT_RECORD))
        .ok()
        .and_then(|t| BootRecord::from_text(&t));
    let mut pol = match boot {
        Some(b) => Policy::new(b.wall, b.boot).back_to(b.back_to),
        None => Policy::new(clock.wall(), kernel_clocks::boottime()),
    };
    clock.held_until = boot
        .filter(|b| b.back_to.is_some())
        .map(|b| (b.boot + policy::GATEWAY_WAIT).saturating_sub(Duration::from_millis(500)));
    log::info!("ntp: started{dry}");
    let mut poller = Poller::default();
    let mut sources = Sources {
        resolved: Vec::new(),
    };
    let mut queries: Vec<(SocketAddr, UdpSocket)> = Vec::new();
    let mut state = NtpState::default();
    let mut next_refresh = Duration::ZERO;
    let mut said_none = false;
    let mut buf = [0u8; 512];
    loop {
        let now = kernel_clocks::boottime();
        if now >= next_refresh {
            next_refresh = now + REFRESH;
            let ids = sources.gather(&a, now);
            let before: Vec<SocketAddr> = poller.servers().map(|s| s.addr).collect();
            let after: Vec<SocketAddr> = ids.iter().map(|s| s.addr).collect();
            if before != after {
                if ids.is_empty() {
                    if !said_none {
                        log::info!(
                            "ntp: no NTP server (set gateway ntp, or get one from DHCP option 42)"
                        );
                    }
                    said_none = true;
                } else {
                    said_none = false;
                    log::info!(
                        "ntp: servers {}",
                        ids.iter()
                            .map(|s| format!("{} ({})", s.addr, s.name))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                queries.retain(|(q, _)| after.contains(q));
            }
            poller.set_servers(now, ids);
            publish(&a.dir, &mut state, &poller);
        }
        let wall = clock.wall();
        while let Some((addr, pkt)) = poller.poll_transmit(now, wall, rand_core::OsRng.next_u64()) {
            match send_query(addr, &pkt) {
                Ok(s) => queries.push((addr, s)),
                Err(e) => poller.send_failed(now, addr, &e.to_string()),
            }
        }
        let due = poller
            .poll_timeout()
            .unwrap_or(next_refresh)
            .min(next_refresh);
        let wait = due.saturating_sub(kernel_clocks::boottime()).min(REFRESH);
        wait_readable(&queries, wait);
        let mut done = Vec::new();
        for (addr, s) in &queries {
            while let Ok(n) = s.recv(&mut buf) {
                // Each answer is acted on before the next is read: a step it makes
                // shifts the other open queries (`Poller::clock_stepped`).
                if let Some(e) = poller.handle_reply(kernel_clocks::boottime(), *addr, &buf[..n]) {
                    handle(e, &mut pol, &mut poller, &mut clock, &mut state, dry);
                    done.push(*addr);
                    break;
                }
            }
        }
        let tevents = poller.handle_timeout(kernel_clocks::boottime());
        let changed = !done.is_empty() || !tevents.is_empty();
        for e in tevents {
            if let Event::Timeout { server } = &e {
                done.push(server.addr);
            }
            handle(e, &mut pol, &mut poller, &mut clock, &mut state, dry);
        }
        queries.retain(|(q, _)| !done.contains(q));
        if changed {
            publish(&a.dir, &mut state, &poller);
        }
    }
}

fn handle(
    e: Event,
    pol: &mut Policy,
    poller: &mut Poller,
    clock: &mut Clock,
    state: &mut NtpState,
    dry: &str,
) {
    match e {
        Event::Sample { server, sample } => {
            let wall = clock.wall();
            let now = kernel_clocks::boottime();
            let who = server.addr;
            let decision = pol.decide(who, server.origin, wall, now, &sample);
            // While init holds the gateway for this first answer, no session stamps from
            // the clock before a step back: it adds no lead.
            let held = !clock.stamps.settled && clock.held_until.is_some_and(|u| now < u);
            match decision {
                Decision::Step { by, agreed } => match clock.step(by) {
                    Ok(()) => {
                        log::info!(
                            "ntp: {who}: stepped the clock {} to {}{}{dry}",
                            fmt_offset(by),
                            clock.wall(),
                            if agreed { " (two servers agree)" } else { "" }
                        );
                        clock.events.say(
                            now.as_secs(),
                            &format!(
                                "clock stepped {} by {who}{}{dry}",
                                fmt_offset(by),
                                if agreed { " (two servers agree)" } else { "" }
                            ),
                        );
                        clock.synced();
                        if !held {
                            clock.stamps.ahead = clock.stamps.ahead.saturating_add((-by).max(0));
                        }
                        clock.stamps.agrees = true;
                        write_stamps(&clock.dir, clock.stamps);
                        clock.save_agreed();
                        poller.clock_stepped(by);
                        poller.note(who, "stepped");
                        state.last_sync = Some((who.to_string(), now));
                        state.behind = None;
                    }
                    Err(e) => log::warn!("ntp: {who}: stepping the clock {}: {e}", fmt_offset(by)),
                },
                Decision::Slew { by } => match clock.slew(by) {
                    Ok(()) => {
                        log::info!("ntp: {who}: slewing the clock {}{dry}", fmt_offset(by));
                        clock.synced();
                        if !clock.stamps.agrees {
                            clock.stamps.agrees = true;
                            write_stamps(&clock.dir, clock.stamps);
                            clock.save_agreed();
                        }
                        poller.note(who, "slewed");
                        state.last_sync = Some((who.to_string(), now));
                        state.behind = None;
                    }
                    Err(e) => log::warn!("ntp: {who}: slewing the clock {}: {e}", fmt_offset(by)),
                },
                Decision::Refused(r) => {
                    if matches!(r, policy::Refusal::Backward { .. }) && clock.stamps.agrees {
                        clock.stamps.agrees = false;
                        write_stamps(&clock.dir, clock.stamps);
                    }
                    log::warn!(target: "net::ntp", "ntp: {who}: refused: {r}");
                    poller.note(who, &format!("refused: {r}"));
                    if matches!(
                        r,
                        policy::Refusal::FarFuture { .. } | policy::Refusal::PastLatest { .. }
                    ) {
                        // `show status` says why the clock stays behind its servers.
                        state.behind = Some(format!("{who} ({}) refused: {r}", server.name));
                    }
                }
            }
            if !clock.stamps.settled {
                // The first answer is acted on: init may start the gateway now.
                clock.stamps.settled = true;
                write_stamps(&clock.dir, clock.stamps);
            }
        }
        Event::Bad { server, error } => {
            let what = match error {
                SntpError::KissOfDeath(policy::Kiss::Deny | policy::Kiss::Rstr) => {
                    format!("{error}: not asking it again")
                }
                SntpError::KissOfDeath(policy::Kiss::Rate) => {
                    format!("{error}: polling it less often")
                }
                e => format!("answer not used: {e}"),
            };
            log::warn!(target: "net::ntp", "ntp: {}: {what}", server.addr);
        }
        Event::Timeout { server } => {
            log::debug!("ntp: {}: no answer", server.addr);
        }
    }
}

fn publish(dir: &Path, state: &mut NtpState, poller: &Poller) {
    state.servers = poller.usable() as u32;
    state.notes = poller.report();
    write_state(dir, state);
}

fn wait_readable(queries: &[(SocketAddr, UdpSocket)], wait: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
    if queries.is_empty() {
        std::thread::sleep(wait);
        return;
    }
    let mut fds: Vec<PollFd> = queries
        .iter()
        .map(|(_, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN))
        .collect();
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ntp_line() {
        let l = crate::core::dhcp::Lease {
            address: Ipv4Addr::new(10, 0, 0, 5),
            prefix: 24,
            router: None,
            dns: Vec::new(),
            ntp: vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)],
            server: Ipv4Addr::new(10, 0, 0, 1),
            lease_secs: 600,
            t1_secs: 300,
            t2_secs: 525,
            obtained: 0,
        };
        let t = l.to_text();
        assert_eq!(
            lease_ntp(&t),
            vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]
        );
        assert!(lease_ntp("address 10.0.0.5/24\n").is_empty());
    }
}
