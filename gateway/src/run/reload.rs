//! The reload handshake between a console and the daemon: SIGHUP in (to the pid in the
//! pid file, checked to be a riceguard process), a polled status file out (the `reload:`
//! generation of [`super::status`] moves once the daemon has applied or refused the
//! file), with a deadline, and one sentence saying what happened.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::status::{parse_reload, Reload};

/// How long a commit waits for the daemon to say what it did with the file.
pub const RELOAD_WAIT: Duration = Duration::from_secs(5);

/// The daemon's pid from `p`, checked to be a live riceguard process (a stale pid file
/// must not make us signal whatever process reused the number).
pub fn daemon_pid(p: &Path) -> Result<i32, String> {
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

/// SIGHUP to daemon `pid`, then wait up to `wait` for its answer in `status_file`.
/// `Err`: it could not be signalled.
pub fn signal(pid: i32, status_file: &Path, wait: Duration) -> Result<String, String> {
    let before = last_reload(status_file).map(|r| r.generation);
    kill(Pid::from_raw(pid), Signal::SIGHUP)
        .map_err(|e| format!("could not signal the daemon (pid {pid}): {e}"))?;
    Ok(wait_reload(status_file, before, wait))
}

/// The `reload:` line of the daemon's status file, if readable.
pub fn last_reload(status_file: &Path) -> Option<Reload> {
    let t = std::fs::read_to_string(status_file).ok()?;
    parse_reload(&t)
}

/// Wait up to `wait` for the reload generation in `status_file` to move past `before`
/// (`None`: there was none), and say what the daemon did.
pub fn wait_reload(status_file: &Path, before: Option<u64>, wait: Duration) -> String {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(r) = last_reload(status_file) {
            if before.map_or(r.generation > 0, |b| r.generation > b) {
                return match r.result {
                    Ok(()) => format!(
                        "the gateway applied it (reload generation {})",
                        r.generation
                    ),
                    Err(why) => format!(
                        "the gateway refused it: {why}; it keeps running the previous configuration"
                    ),
                };
            }
        }
        if Instant::now() >= deadline {
            return format!(
                "no answer from the gateway within {} s: it may not have applied it \
                 (`show status` shows its last reload)",
                wait.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commit's answer follows the daemon's `reload:` line: applied, refused with
    /// its reason, or no answer when the generation does not move.
    #[test]
    fn reload_answer_follows_the_status_file() {
        let dir = std::env::temp_dir().join(format!("rg-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let st = dir.join("riceguard.status");
        std::fs::write(&st, "interface: wg0\nreload: generation 2 ok\n").unwrap();
        let short = Duration::from_millis(300);
        let t0 = Instant::now();
        let a = wait_reload(&st, Some(2), short);
        assert!(a.starts_with("no answer from the gateway"), "{a}");
        assert!(t0.elapsed() >= short);
        // The daemon answers while the console waits.
        let st2 = st.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            std::fs::write(&st2, "reload: generation 3 ok\n").unwrap();
        });
        let a = wait_reload(&st, Some(2), Duration::from_secs(5));
        t.join().unwrap();
        assert_eq!(a, "the gateway applied it (reload generation 3)");
        std::fs::write(
            &st,
            "reload: generation 4 failed cannot listen on UDP port 53: Address in use\n",
        )
        .unwrap();
        let a = wait_reload(&st, Some(3), short);
        assert!(
            a.starts_with("the gateway refused it: cannot listen on UDP port 53: Address in use;"),
            "{a}"
        );
        // No status before: any reload after the start-up one counts.
        std::fs::write(&st, "reload: generation 0 ok\n").unwrap();
        assert!(wait_reload(&st, None, short).starts_with("no answer"));
        std::fs::write(&st, "reload: generation 1 ok\n").unwrap();
        assert!(wait_reload(&st, None, short).contains("applied"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pid_file_checked() {
        let d = crate::testutil::TempDir::new("reload-pid");
        std::fs::create_dir_all(&d.0).unwrap();
        let p = d.0.join("riceguard.pid");
        assert!(daemon_pid(&p).unwrap_err().contains("no daemon running"));
        for bad in ["", "x", "1", "-5", "99999999999"] {
            std::fs::write(&p, bad).unwrap();
            assert!(daemon_pid(&p).is_err(), "{bad:?}");
        }
    }
}
