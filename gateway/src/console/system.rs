//! The console's side effects on the system, behind traits so the session logic is
//! tested without a daemon, a clock or a terminal:
//!
//! - [`Clock`]: monotonic time (commit-confirm deadlines) and wall time (the deadline
//!   marker that survives a console restart, handshake ages).
//! - [`Hooks`]: reload the daemon (SIGHUP to the pid in `--pidfile`, then wait briefly
//!   for the `reload:` generation of its status file to move, and say what it did with
//!   the file: applied, refused and why, or no answer), ask it for peers
//!   (UAPI `get=1` on its socket), status lines, reboot, and long work (update,
//!   rollback-slot) as a [`Job`]: its own process with an overall deadline, so the console
//!   keeps answering and its commit-confirm deadline fires on time meanwhile.
//! - [`RawMode`]: the serial terminal in character mode while the console runs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::core::config::Config;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub trait Clock {
    fn now(&self) -> Instant;
    /// Seconds since the Unix epoch.
    fn unix(&self) -> u64;
    /// This boot's id and `CLOCK_BOOTTIME` in seconds: deadlines recorded on it do not
    /// move with the wall clock. `None`: unknown (then the unix time is used).
    fn boot(&self) -> Option<(String, u64)> {
        None
    }
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn unix(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
    fn boot(&self) -> Option<(String, u64)> {
        Some((
            crate::sys::kernel_clocks::boot_id()?,
            crate::sys::kernel_clocks::boottime().as_secs(),
        ))
    }
}

/// How a background job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobReport {
    pub text: String,
    pub ok: bool,
}

/// The uplink and its current addresses (DHCP may have given them), for `add client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    pub name: String,
    pub addresses: Vec<crate::core::net::Cidr>,
    /// The DNS servers of its DHCP lease (none without one): what a full-tunnel client
    /// is given when no `ClientDns` is set.
    pub dns: Vec<std::net::IpAddr>,
    /// Addresses the network uses, which `add client` must not hand out: routers (every
    /// route's next hop, the lease's router), the appliance's own addresses on every
    /// interface, and the neighbour table's answered entries.
    pub in_use: Vec<std::net::IpAddr>,
}

/// [`Uplink::in_use`] as the kernel has it now (best effort: what cannot be read is
/// left out), plus the router of uplink `name`'s lease under `dir`.
pub fn addresses_in_use(dir: &Path, name: &str) -> Vec<std::net::IpAddr> {
    let mut v: Vec<std::net::IpAddr> = Vec::new();
    v.extend(lease_router(dir, name));
    if let Ok(list) = nix::ifaddrs::getifaddrs() {
        for ifa in list {
            let a = ifa.address.as_ref();
            if let Some(s) = a.and_then(|a| a.as_sockaddr_in()) {
                v.push(std::net::IpAddr::V4(s.ip()));
            } else if let Some(s) = a.and_then(|a| a.as_sockaddr_in6()) {
                v.push(std::net::IpAddr::V6(s.ip()));
            }
        }
    }
    if let Ok(mut nl) = crate::sys::netlink::Netlink::open() {
        if let Ok(routes) = nl.routes() {
            v.extend(routes.iter().filter_map(|r| r.gateway));
        }
        if let Ok(ns) = nl.neighbours() {
            v.extend(ns.iter().filter(|n| n.in_use()).map(|n| n.addr));
        }
    }
    v.sort();
    v.dedup();
    v
}

// Where `riceguard dhcp` keeps its leases: `run::run_dir()`, as the DHCP client and
// `riceguard status` have it.
use crate::run::lease::{lease_dns, lease_router};
use crate::run::{reload, run_dir};

/// What the console asks of the rest of the appliance.
pub trait Hooks {
    /// Make the running daemon apply `saved` (the file just committed). `Ok` says what
    /// the daemon did with it (applied, refused and why, or no answer); `Err` says why it
    /// could not be told (typically: no daemon running).
    fn reload(&mut self, saved: &Path) -> Result<String, String>;
    /// The daemon's raw UAPI `get=1` answer for interface `ifname`.
    fn peers(&mut self, ifname: &str) -> Result<String, String>;
    /// Lines for `show status`.
    fn status(&mut self) -> Vec<String>;
    /// Whether the kernel takes the firewall table `cfg` asks for over the ports as they
    /// are now (a dry run: nothing changes). `Err`: the kernel's refusal.
    fn check_firewall(&mut self, _cfg: &Config) -> Result<(), String> {
        Ok(())
    }
    /// Restart the appliance; the text says what happened.
    fn reboot(&mut self) -> String;
    /// Start verifying and installing an update bundle into the inactive slot
    /// (`allow_downgrade`: also a build not newer than the running one) as a background
    /// job; `Ok` says it started, its report comes from [`Hooks::job_done`].
    fn update(&mut self, _source: &str, _allow_downgrade: bool) -> Result<String, String> {
        Err("updates are not available in this mode".into())
    }
    /// Start making the other slot the default boot entry, as a background job.
    fn rollback_slot(&mut self) -> Result<String, String> {
        Err("slot rollback is not available in this mode".into())
    }
    /// The background job still running, described (`None`: none is).
    fn job_running(&self) -> Option<String> {
        None
    }
    /// The report of a background job that ended since the last call.
    fn job_done(&mut self) -> Option<JobReport> {
        None
    }
    /// The uplink's name and current addresses: `configured` (`[Gateway] Uplink`) or,
    /// when that is empty, the interface of the default route, else the first Ethernet
    /// NIC (as init picks it). `Err` says why it is not known.
    fn uplink(&mut self, _configured: &str) -> Result<Uplink, String> {
        Err("the uplink's addresses are not available in this mode".into())
    }
    /// Before `export configuration to usb` asks the passphrase: the stick it would use
    /// (found again when writing), or why there is none.
    fn usb_check(&mut self) -> Result<String, String> {
        Err("USB sticks are not available in this mode".into())
    }
    /// `export configuration to usb`: write the armoured `text` as the new file `name` on
    /// the one USB stick attached ([`crate::usb_stick`]); `Ok` says where.
    fn usb_export(&mut self, _name: &str, _text: &str) -> Result<String, String> {
        Err("USB sticks are not available in this mode".into())
    }
    /// `import configuration from usb [FILE]`: the file read (`file`, else the newest
    /// export), its text, and the stick it came from.
    fn usb_import(&mut self, _file: Option<&str>) -> Result<(String, String, String), String> {
        Err("USB sticks are not available in this mode".into())
    }
}

/// The addresses on interface `name` now, with their prefix lengths.
pub fn interface_addresses(name: &str) -> Result<Vec<crate::core::net::Cidr>, String> {
    use crate::core::net::Cidr;
    use std::net::IpAddr;
    let list = nix::ifaddrs::getifaddrs().map_err(|e| format!("cannot list addresses: {e}"))?;
    let mut out = Vec::new();
    let mut found = false;
    for ifa in list {
        if ifa.interface_name != name {
            continue;
        }
        found = true;
        let Some(a) = ifa.address else { continue };
        let m = ifa.netmask;
        let c = if let Some(v4) = a.as_sockaddr_in() {
            let prefix = m
                .as_ref()
                .and_then(|m| m.as_sockaddr_in())
                .map_or(32, |m| u32::from(m.ip()).count_ones());
            Cidr::new(IpAddr::V4(v4.ip()), prefix as u8)
        } else if let Some(v6) = a.as_sockaddr_in6() {
            let prefix = m
                .as_ref()
                .and_then(|m| m.as_sockaddr_in6())
                .map_or(128, |m| u128::from(m.ip()).count_ones());
            Cidr::new(IpAddr::V6(v6.ip()), prefix as u8)
        } else {
            None
        };
        if let Some(c) = c {
            out.push(c);
        }
    }
    if !found && !Path::new("/sys/class/net").join(name).exists() {
        return Err(format!("there is no interface {name}"));
    }
    Ok(out)
}

/// The longest an update may take, download included (the HTTP client only bounds each
/// read); then it is killed (harmless: the new slot is only enabled at its very end).
pub const UPDATE_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// The longest `rollback-slot` may take.
pub const ROLLBACK_SLOT_DEADLINE: Duration = Duration::from_secs(120);
/// Output of a job kept for its report (the rest is read and dropped).
const JOB_OUTPUT: u64 = 64 * 1024;

/// A long command in its own process (and process group), with an overall deadline.
/// The console only polls it, so it never waits for it.
pub struct Job {
    what: String,
    pid: i32,
    started: Instant,
    deadline: Duration,
    rx: mpsc::Receiver<JobReport>,
}

impl Job {
    /// Start `program args`, stdout and stderr captured together, stdin closed.
    pub fn spawn(
        what: &str,
        program: &Path,
        args: &[&str],
        deadline: Duration,
    ) -> std::io::Result<Job> {
        let (r, w) = nix::unistd::pipe()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(w.try_clone()?))
            .stderr(Stdio::from(w))
            // Its own group: the deadline kills it and whatever it started, nothing else.
            .process_group(0);
        let mut child = cmd.spawn()?;
        drop(cmd); // our copies of the pipe's write end: EOF once the job's side closes
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let (tx, rx) = mpsc::channel();
        let name = what.to_string();
        let started = Instant::now();
        std::thread::spawn(move || {
            let reader = std::thread::spawn(move || {
                let mut f = std::fs::File::from(r);
                let mut out = Vec::new();
                let _ = (&mut f).take(JOB_OUTPUT).read_to_end(&mut out);
                let _ = std::io::copy(&mut f, &mut std::io::sink());
                out
            });
            let group = nix::unistd::Pid::from_raw(pid);
            let mut timed_out = false;
            loop {
                // Exited? (WNOWAIT: not reaped yet, so its pid still names its group.)
                let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
                match waitid(Id::Pid(group), flags) {
                    Ok(WaitStatus::StillAlive) => {}
                    _ => break,
                }
                if started.elapsed() >= deadline {
                    timed_out = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // Anything left in its group goes too (its output pipe then closes).
            let _ = killpg(group, Signal::SIGKILL);
            let status = child.wait();
            let out = reader.join().unwrap_or_default();
            let mut text = String::from_utf8_lossy(&out).trim_end().to_string();
            let ok = !timed_out && status.as_ref().is_ok_and(|s| s.success());
            if !text.is_empty() {
                text.push('\n');
            }
            if timed_out {
                text.push_str(&format!(
                    "{name}: stopped after {} s, its overall deadline",
                    deadline.as_secs()
                ));
            } else {
                match status {
                    Ok(s) if s.success() => text.push_str(&format!("{name}: done")),
                    Ok(s) => text.push_str(&format!("{name}: failed ({s})")),
                    Err(e) => text.push_str(&format!("{name}: {e}")),
                }
            }
            let _ = tx.send(JobReport { text, ok });
        });
        Ok(Job {
            what: what.to_string(),
            pid,
            started,
            deadline,
            rx,
        })
    }

    /// What runs, since when, until when at most.
    pub fn describe(&self) -> String {
        format!(
            "{} (pid {}) running for {} s, stopped after {} s at most",
            self.what,
            self.pid,
            self.started.elapsed().as_secs(),
            self.deadline.as_secs()
        )
    }

    /// The report, once the job ended.
    pub fn try_done(&self) -> Option<JobReport> {
        match self.rx.try_recv() {
            Ok(r) => Some(r),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(JobReport {
                text: format!("{}: lost track of it", self.what),
                ok: false,
            }),
        }
    }
}

/// The real hooks.
pub struct SystemHooks {
    /// The daemon's pid file (`--pidfile`, default `/run/riceguard.pid`).
    pub pidfile: PathBuf,
    /// UAPI socket (`--socket`); `None`: `/var/run/wireguard/IFNAME.sock`.
    pub socket: Option<PathBuf>,
    /// DAEMON HOOK: a text file the daemon keeps up to date with data-plane state
    /// (offload path chosen, workers and their cores, TCP fallback state), one
    /// `name: value` per line. `show status` prints it as it is.
    pub status_file: PathBuf,
    /// The update or rollback-slot running in the background, if any.
    pub job: Option<Job>,
}

pub use crate::run::reload::RELOAD_WAIT;
/// The file init starts the gateway from on a failsafe or fallback boot (a copy in
/// /run; `/perm/riceguard.conf` itself otherwise).
pub use crate::run::BOOT_CONFIG;
pub use crate::run::{PIDFILE as DEFAULT_PIDFILE, STATUS_FILE as DEFAULT_STATUS_FILE};

/// The `--config FILE` of a daemon's NUL-separated command line.
pub fn config_arg(cmdline: &[u8]) -> Option<PathBuf> {
    let mut args = cmdline.split(|&b| b == 0);
    while let Some(a) = args.next() {
        if a == b"--config" || a == b"-c" {
            let v = args.next()?;
            return Some(PathBuf::from(String::from_utf8_lossy(v).into_owned()));
        }
    }
    None
}

/// After a failsafe or fallback boot the daemon runs from `runs` ([`BOOT_CONFIG`]), so
/// a SIGHUP alone would re-read that copy, not the committed file. The committed file
/// is copied over it (created 0600 from the start: it holds the private key) and then
/// the daemon reloads it. Chosen over telling the daemon another path: the daemon's
/// command line is also what init restarts it with (a crash, the health watch), so the
/// committed configuration keeps running for the rest of this boot instead of the
/// failsafe one coming back at the next restart; the next boot starts from /perm anyway.
/// Only ever [`BOOT_CONFIG`] (`boot_config`) is written, never a path merely read
/// from another process. `Ok(Some(note))` when it was replaced.
pub fn hand_over(saved: &Path, runs: &Path, boot_config: &Path) -> Result<Option<String>, String> {
    if runs == saved || runs != boot_config {
        return Ok(None);
    }
    let text = std::fs::read(saved).map_err(|e| format!("cannot read {}: {e}", saved.display()))?;
    crate::durable::write(runs, &text, crate::durable::SECRET).map_err(|e| {
        format!(
            "this boot's gateway runs from {} (failsafe or fallback boot) and it could not be replaced: {e}; \
             the committed file applies at the next boot",
            runs.display()
        )
    })?;
    Ok(Some(format!(
        "this boot ran a failsafe/fallback copy ({}): replaced by the committed file",
        runs.display()
    )))
}

impl Default for SystemHooks {
    fn default() -> Self {
        SystemHooks {
            pidfile: DEFAULT_PIDFILE.into(),
            socket: None,
            status_file: DEFAULT_STATUS_FILE.into(),
            job: None,
        }
    }
}

impl SystemHooks {
    /// Run this binary with `args` as a background [`Job`] (in its own process, so a
    /// failure there cannot take the console down, and the console does not wait for it).
    pub fn start_job(
        &mut self,
        what: &str,
        args: &[&str],
        deadline: Duration,
    ) -> Result<String, String> {
        if let Some(j) = &self.job {
            return Err(format!(
                "{} is still running: wait for its report",
                j.describe()
            ));
        }
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/bin/riceguard"));
        let job = Job::spawn(what, &exe, args, deadline)
            .map_err(|e| format!("could not start {what}: {e}"))?;
        let t = format!(
            "{what} started in the background (pid {}, stopped after {} min at most); the console stays usable \
             and prints its report when it ends (`show status` shows it meanwhile)",
            job.pid,
            deadline.as_secs() / 60
        );
        self.job = Some(job);
        Ok(t)
    }
}

/// `riceguard.slot=X` from a kernel command line.
pub fn slot_from_cmdline(cmdline: &str) -> Option<&str> {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("riceguard.slot="))
}

pub fn format_uptime(secs: u64) -> String {
    let (d, h, m) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60);
    if d > 0 {
        format!("{d} d {h} h {m} min")
    } else if h > 0 {
        format!("{h} h {m} min")
    } else {
        format!("{m} min {} s", secs % 60)
    }
}

/// Whether PID 1 is this same program, i.e. we run on the appliance under our own init.
fn on_appliance() -> bool {
    match (
        std::fs::read_link("/proc/1/exe"),
        std::fs::read_link("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl Hooks for SystemHooks {
    fn check_firewall(&mut self, cfg: &Config) -> Result<(), String> {
        use crate::sys::nftables::{self, NftError};
        if !cfg.gateway.firewall {
            return Ok(());
        }
        let Ok(mut nl) = crate::sys::netlink::Netlink::open() else {
            return Ok(()); // no rtnetlink here: nothing the kernel could judge either
        };
        let port = cfg.interface.listen_port.unwrap_or(0);
        let ports = crate::driver::appliance::firewall::ports_now(
            &mut nl,
            &cfg.gateway.interface_name,
            cfg,
            port,
        );
        match nftables::check(&crate::core::firewall::ruleset(cfg, &ports)) {
            // No nf_tables, or no right to ask it (a console run by hand as a user): the
            // daemon's reload still fails closed.
            Ok(()) | Err(NftError::Unavailable(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn reload(&mut self, saved: &Path) -> Result<String, String> {
        let pid = reload::daemon_pid(&self.pidfile)?;
        let runs = std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|c| config_arg(&c));
        let note = match runs.map(|r| hand_over(saved, &r, Path::new(BOOT_CONFIG))) {
            Some(Ok(n)) => n,
            // Not signalled: it would only re-read the failsafe copy. Said as it is (the
            // session's "applies when the gateway next starts" would not hold this boot).
            Some(Err(e)) => return Ok(e),
            None => None,
        };
        let answer = reload::signal(pid, &self.status_file, RELOAD_WAIT)?;
        Ok(match note {
            Some(n) => format!("{n}\n{answer}"),
            None => answer,
        })
    }

    fn peers(&mut self, ifname: &str) -> Result<String, String> {
        let path = self
            .socket
            .clone()
            .unwrap_or_else(|| crate::run::uapi_socket(ifname));
        let fail =
            |e: std::io::Error| format!("no answer from the daemon on {}: {e}", path.display());
        let mut s = UnixStream::connect(&path).map_err(fail)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(fail)?;
        s.set_write_timeout(Some(Duration::from_secs(3)))
            .map_err(fail)?;
        s.write_all(b"get=1\n\n").map_err(fail)?;
        // The answer ends with an empty line; bound it so a confused peer cannot fill memory.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.ends_with(b"\n\n") && buf.len() < (1 << 20) {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(fail(e)),
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn status(&mut self) -> Vec<String> {
        // The clock first: a wrong one explains failed handshakes and odd dates.
        let mut out = vec![crate::run::clock::clock_line()];
        out.extend(crate::run::clock::note_lines());
        out.push(format!("version: riceguard {}", env!("CARGO_PKG_VERSION")));
        if let Ok(v) = std::fs::read_to_string(crate::image_paths::VERSION) {
            let build =
                crate::update::parse_build_file(std::fs::read_to_string(crate::image_paths::BUILD));
            out.push(format!(
                "firmware: {} (build {})",
                v.trim().chars().take(100).collect::<String>(),
                build.map_or_else(|e| format!("unknown: {e}"), |b| b.to_string())
            ));
        }
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        out.push(match slot_from_cmdline(&cmdline) {
            Some(s) => format!("boot slot: {s}"),
            None => "boot slot: unknown (no riceguard.slot= on the kernel command line)".into(),
        });
        let up = std::fs::read_to_string("/proc/uptime").ok();
        let secs = up
            .as_deref()
            .and_then(|u| u.split('.').next())
            .and_then(|s| s.parse().ok());
        out.push(match secs {
            Some(s) => format!("uptime: {}", format_uptime(s)),
            None => "uptime: unknown".into(),
        });
        // The uplink's DHCP lease (address, router, DNS, expiry), when it has one.
        out.extend(crate::run::lease::lease_lines());
        out.push(match reload::daemon_pid(&self.pidfile) {
            Ok(pid) => format!("daemon: running (pid {pid})"),
            Err(e) => format!("daemon: {e}"),
        });
        if let Some(j) = &self.job {
            out.push(format!("background: {}", j.describe()));
        }
        match std::fs::read_to_string(&self.status_file) {
            Ok(t) => out.extend(t.lines().take(64).map(|l| l.chars().take(200).collect())),
            Err(_) => out.push(format!(
                "data plane: no status from the daemon ({} not present)",
                self.status_file.display()
            )),
        }
        out
    }

    fn update(&mut self, source: &str, allow_downgrade: bool) -> Result<String, String> {
        if !on_appliance() {
            return Err("host mode: updates are installed on the appliance (`riceguard update SOURCE` there)".into());
        }
        let mut args = vec!["update"];
        if allow_downgrade {
            args.push("--allow-downgrade");
        }
        args.push(source);
        self.start_job("update", &args, UPDATE_DEADLINE)
    }

    fn rollback_slot(&mut self) -> Result<String, String> {
        if !on_appliance() {
            return Err("host mode: no boot slots here".into());
        }
        self.start_job("rollback-slot", &["rollback-slot"], ROLLBACK_SLOT_DEADLINE)
    }

    fn job_running(&self) -> Option<String> {
        self.job.as_ref().map(Job::describe)
    }

    fn job_done(&mut self) -> Option<JobReport> {
        let r = self.job.as_ref()?.try_done()?;
        self.job = None;
        Some(r)
    }

    fn uplink(&mut self, configured: &str) -> Result<Uplink, String> {
        let name = crate::sys::nic::uplink(configured).ok_or(
            "no uplink: no `gateway uplink` is set, there is no default route and no Ethernet NIC",
        )?;
        let addresses = interface_addresses(&name).map_err(|e| format!("uplink {name}: {e}"))?;
        let dns = lease_dns(&run_dir(), &name);
        let in_use = addresses_in_use(&run_dir(), &name);
        Ok(Uplink {
            name,
            addresses,
            dns,
            in_use,
        })
    }

    fn reboot(&mut self) -> String {
        if !on_appliance() {
            return "host mode: not rebooting (on the appliance this asks init, PID 1, to reboot)"
                .into();
        }
        match kill(Pid::from_raw(1), Signal::SIGTERM) {
            Ok(()) => "rebooting...".into(),
            Err(e) => format!("could not ask init to reboot: {e}"),
        }
    }

    fn usb_check(&mut self) -> Result<String, String> {
        if !on_appliance() {
            return Err("host mode: USB sticks are used only on the appliance".into());
        }
        crate::usb_stick::find(&crate::usb_stick::Root::default()).map(|s| s.to_string())
    }

    fn usb_export(&mut self, name: &str, text: &str) -> Result<String, String> {
        if !on_appliance() {
            return Err("host mode: USB sticks are used only on the appliance".into());
        }
        crate::usb_stick::export(name, text)
    }

    fn usb_import(&mut self, file: Option<&str>) -> Result<(String, String, String), String> {
        if !on_appliance() {
            return Err("host mode: USB sticks are used only on the appliance".into());
        }
        crate::usb_stick::import(file)
    }
}

/// Character-at-a-time input without echo (the console echoes itself); output
/// processing (LF -> CRLF) stays on. Restores the previous settings when dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub fn enter() -> nix::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut t = saved.clone();
        // No line editing, echo or signal keys from the kernel: Ctrl-C only cancels the
        // line, it must not kill the console.
        t.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG | LocalFlags::IEXTEN);
        // Keep CR as CR so CR, LF and CRLF are told apart by the line editor.
        t.input_flags.remove(
            termios::InputFlags::ICRNL | termios::InputFlags::INLCR | termios::InputFlags::IGNCR,
        );
        t.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        t.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &t)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_and_uptime() {
        assert_eq!(
            slot_from_cmdline("quiet riceguard.slot=b console=ttyS0"),
            Some("b")
        );
        assert_eq!(slot_from_cmdline("quiet"), None);
        assert_eq!(format_uptime(59), "0 min 59 s");
        assert_eq!(format_uptime(3 * 86400 + 7200 + 60), "3 d 2 h 1 min");
    }

    /// The loopback interface always exists: its addresses are read with prefixes.
    #[test]
    fn loopback_addresses() {
        let a = interface_addresses("lo").unwrap();
        assert!(a.iter().any(|c| c.to_string() == "127.0.0.1/8"), "{a:?}");
        assert!(interface_addresses("rgc-nonexist0")
            .unwrap_err()
            .contains("no interface"));
    }

    #[test]
    fn daemon_config_from_cmdline() {
        assert_eq!(
            config_arg(b"/usr/bin/riceguard\0up\0--config\0/run/riceguard/boot.conf\0"),
            Some(PathBuf::from(BOOT_CONFIG))
        );
        assert_eq!(config_arg(b"riceguard\0wg0\0"), None);
        assert_eq!(config_arg(b"riceguard\0up\0--config"), None);
    }

    /// After a failsafe boot the gateway runs the /run copy: a commit replaces it (mode
    /// 0600) with the committed file; when it runs the committed file itself, or any
    /// other file, nothing is written.
    #[test]
    fn commit_after_failsafe_hands_the_file_over() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rg-handover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let saved = dir.join("riceguard.conf");
        let boot = dir.join("boot.conf");
        let other = dir.join("other.conf");
        std::fs::write(&saved, "committed\n").unwrap();
        std::fs::write(&boot, "failsafe, no peers\n").unwrap();
        std::fs::write(&other, "other\n").unwrap();
        assert_eq!(hand_over(&saved, &saved, &boot), Ok(None));
        assert_eq!(hand_over(&saved, &other, &boot), Ok(None));
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "other\n");
        let note = hand_over(&saved, &boot, &boot).unwrap().unwrap();
        assert!(note.contains("replaced by the committed file"), "{note}");
        assert_eq!(std::fs::read_to_string(&boot).unwrap(), "committed\n");
        let mode = std::fs::metadata(&boot).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let e = hand_over(&dir.join("gone.conf"), &boot, &boot).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_daemon_is_reported_not_fatal() {
        let mut h = SystemHooks {
            pidfile: "/nonexistent/riceguard.pid".into(),
            socket: Some("/nonexistent/x.sock".into()),
            status_file: "/nonexistent/status".into(),
            job: None,
        };
        assert!(h
            .reload(Path::new("/nonexistent/riceguard.conf"))
            .unwrap_err()
            .contains("no daemon running"));
        assert!(h
            .peers("wg0")
            .unwrap_err()
            .contains("no answer from the daemon"));
        assert!(h
            .status()
            .iter()
            .any(|l| l.starts_with("daemon: no daemon running")));
    }

    fn wait_report(j: &Job, within: Duration) -> Option<JobReport> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Some(r) = j.try_done() {
                return Some(r);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// A job that outlives its overall deadline is killed with everything it started, and
    /// says so; the caller never waits for it.
    #[test]
    fn job_has_an_overall_deadline() {
        let t0 = Instant::now();
        let sh = Path::new("/bin/sh");
        // The grandchild (sleep) holds the output pipe too: it must go as well.
        let j = Job::spawn(
            "update",
            sh,
            &["-c", "echo fetching; sleep 30 & sleep 30"],
            Duration::from_millis(500),
        )
        .unwrap();
        assert!(t0.elapsed() < Duration::from_millis(400), "spawn waited");
        assert!(j.try_done().is_none());
        assert!(j.describe().starts_with("update (pid "));
        let r = wait_report(&j, Duration::from_secs(10)).expect("no report");
        assert!(!r.ok);
        assert!(
            r.text.starts_with("fetching\n")
                && r.text.contains("stopped after 0 s, its overall deadline"),
            "{}",
            r.text
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(
            kill(nix::unistd::Pid::from_raw(j.pid), None).is_err(),
            "job still alive"
        );
        // Ends in time: its output and status.
        let j = Job::spawn(
            "update",
            sh,
            &["-c", "echo installed; exit 0"],
            Duration::from_secs(10),
        )
        .unwrap();
        let r = wait_report(&j, Duration::from_secs(10)).expect("no report");
        assert_eq!(
            r,
            JobReport {
                text: "installed\nupdate: done".into(),
                ok: true
            }
        );
        let j = Job::spawn(
            "update",
            sh,
            &["-c", "echo refused >&2; exit 1"],
            Duration::from_secs(10),
        )
        .unwrap();
        let r = wait_report(&j, Duration::from_secs(10)).expect("no report");
        assert!(
            !r.ok && r.text.starts_with("refused\nupdate: failed"),
            "{}",
            r.text
        );
        // A second job is refused while one runs.
        let mut h = SystemHooks {
            job: Some(
                Job::spawn("update", sh, &["-c", "sleep 5"], Duration::from_millis(300)).unwrap(),
            ),
            ..SystemHooks::default()
        };
        assert!(h
            .start_job("update", &[], UPDATE_DEADLINE)
            .unwrap_err()
            .contains("still running"));
        assert!(h.job_running().is_some());
        assert!(h
            .status()
            .iter()
            .any(|l| l.starts_with("background: update")));
        let t0 = Instant::now();
        while h.job_done().is_none() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(h.job_running().is_none());
    }
}
