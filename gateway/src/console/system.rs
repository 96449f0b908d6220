//! The console's side effects on the system, behind traits so the session logic is
//! tested without a daemon, a clock or a terminal:
//!
//! - [`Clock`]: monotonic time (commit-confirm deadlines) and wall time (the deadline
//!   marker that survives a console restart, handshake ages).
//! - [`Hooks`]: reload the daemon (SIGHUP to the pid in `--pidfile`), ask it for peers
//!   (UAPI `get=1` on its socket), status lines, reboot.
//! - [`RawMode`]: the serial terminal in character mode while the console runs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};
use nix::unistd::Pid;

pub trait Clock {
    fn now(&self) -> Instant;
    /// Seconds since the Unix epoch.
    fn unix(&self) -> u64;
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
}

/// What the console asks of the rest of the appliance.
pub trait Hooks {
    /// Tell the running daemon to re-read `riceguard.conf`. `Ok` says it was told;
    /// `Err` says why not (typically: no daemon running).
    fn reload(&mut self) -> Result<String, String>;
    /// The daemon's raw UAPI `get=1` answer for interface `ifname`.
    fn peers(&mut self, ifname: &str) -> Result<String, String>;
    /// Lines for `show status`.
    fn status(&mut self) -> Vec<String>;
    /// Restart the appliance; the text says what happened.
    fn reboot(&mut self) -> String;
    /// Verify and install an update bundle into the inactive slot (`allow_downgrade`: also
    /// a build not newer than the running one); the text is the updater's report.
    fn update(&mut self, _source: &str, _allow_downgrade: bool) -> String {
        "updates are not available in this mode".into()
    }
    /// Make the other slot the default boot entry.
    fn rollback_slot(&mut self) -> String {
        "slot rollback is not available in this mode".into()
    }
}

/// Run this binary with `args` (the updater runs in its own process, so a failure there
/// cannot take the console down) and return what it printed.
fn run_self(args: &[&str]) -> String {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/riceguard"));
    match std::process::Command::new(exe).args(args).output() {
        Ok(o) => {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            if !o.status.success() {
                t.push_str(&format!("({} failed: {})", args[0], o.status));
            }
            t.trim_end().to_string()
        }
        Err(e) => format!("could not run the updater: {e}"),
    }
}

/// The real hooks.
#[derive(Debug, Clone)]
pub struct SystemHooks {
    /// The daemon's pid file (`--pidfile`, default `/run/riceguard.pid`).
    pub pidfile: PathBuf,
    /// UAPI socket (`--socket`); `None`: `/var/run/wireguard/IFNAME.sock`.
    pub socket: Option<PathBuf>,
    /// DAEMON HOOK: a text file the daemon keeps up to date with data-plane state
    /// (offload path chosen, workers and their cores, TCP fallback state), one
    /// `name: value` per line. `show status` prints it as it is.
    pub status_file: PathBuf,
}

pub const DEFAULT_PIDFILE: &str = "/run/riceguard.pid";
pub const DEFAULT_STATUS_FILE: &str = "/run/riceguard.status";

impl Default for SystemHooks {
    fn default() -> Self {
        SystemHooks {
            pidfile: DEFAULT_PIDFILE.into(),
            socket: None,
            status_file: DEFAULT_STATUS_FILE.into(),
        }
    }
}

impl SystemHooks {
    /// The daemon's pid, checked to be a live riceguard process (a stale pid file must not
    /// make us signal whatever process reused the number).
    fn daemon_pid(&self) -> Result<i32, String> {
        let p = &self.pidfile;
        let text = std::fs::read_to_string(p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("no daemon running (no {})", p.display()),
            _ => format!("cannot read the daemon's pid from {}: {e}", p.display()),
        })?;
        let pid: i32 = match text.trim().parse() {
            Ok(n) if n > 1 => n,
            _ => return Err(format!("{} does not hold a daemon pid", p.display())),
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|_| format!("the daemon (pid {pid} from {}) is not running", p.display()))?;
        if !String::from_utf8_lossy(&cmdline).contains("riceguard") {
            return Err(format!(
                "pid {pid} from {} is not a riceguard process (stale pid file)",
                p.display()
            ));
        }
        Ok(pid)
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
    fn reload(&mut self) -> Result<String, String> {
        let pid = self.daemon_pid()?;
        kill(Pid::from_raw(pid), Signal::SIGHUP)
            .map_err(|e| format!("could not signal the daemon (pid {pid}): {e}"))?;
        Ok(format!(
            "the running daemon (pid {pid}) was told to apply it (SIGHUP)"
        ))
    }

    fn peers(&mut self, ifname: &str) -> Result<String, String> {
        let path = self
            .socket
            .clone()
            .unwrap_or_else(|| Path::new("/var/run/wireguard").join(format!("{ifname}.sock")));
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
        let mut out = vec![format!("version: riceguard {}", env!("CARGO_PKG_VERSION"))];
        if let Ok(v) = std::fs::read_to_string("/etc/riceguard/version") {
            let build =
                crate::update::parse_build_file(std::fs::read_to_string(crate::update::BUILD_FILE));
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
        out.push(match self.daemon_pid() {
            Ok(pid) => format!("daemon: running (pid {pid})"),
            Err(e) => format!("daemon: {e}"),
        });
        match std::fs::read_to_string(&self.status_file) {
            Ok(t) => out.extend(t.lines().take(64).map(|l| l.chars().take(200).collect())),
            Err(_) => out.push(format!(
                "data plane: no status from the daemon ({} not present)",
                self.status_file.display()
            )),
        }
        out
    }

    fn update(&mut self, source: &str, allow_downgrade: bool) -> String {
        if !on_appliance() {
            return "host mode: updates are installed on the appliance (`riceguard update SOURCE` there)".into();
        }
        if allow_downgrade {
            run_self(&["update", "--allow-downgrade", source])
        } else {
            run_self(&["update", source])
        }
    }

    fn rollback_slot(&mut self) -> String {
        if !on_appliance() {
            return "host mode: no boot slots here".into();
        }
        run_self(&["rollback-slot"])
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

    #[test]
    fn no_daemon_is_reported_not_fatal() {
        let mut h = SystemHooks {
            pidfile: "/nonexistent/riceguard.pid".into(),
            socket: Some("/nonexistent/x.sock".into()),
            status_file: "/nonexistent/status".into(),
        };
        assert!(h.reload().unwrap_err().contains("no daemon running"));
        assert!(h
            .peers("wg0")
            .unwrap_err()
            .contains("no answer from the daemon"));
        assert!(h
            .status()
            .iter()
            .any(|l| l.starts_with("daemon: no daemon running")));
    }
}
