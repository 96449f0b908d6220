//! The `perm` partition and the configuration the gateway runs: mount perm, load and
//! check the saved configuration (falling back to the last good one from history), the
//! commit-confirm guard, the early failsafe prompt (the gateway without peers), and
//! the console's arguments.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::core::config::GatewayConfig;
use crate::core::key::Key;
use crate::image_paths::DEFAULT_CONFIG;
use crate::perm::{config as perm_config, confirm, CONFIG, DIR as PERM};
use crate::sys::os;
use crate::{durable, slots};

use super::common::{mkdir, BIN, CONSOLE_SERVICE};
use super::supervise;
use super::supervise::Supervisor;

pub(super) fn mount_perm() -> bool {
    mkdir(PERM);
    // Only the boot disk's perm (the disk of the running root): never a USB stick's.
    let dev = match slots::locate("perm", slots::Ambiguous::Refuse) {
        Ok(f) => f.dev,
        Err(e) => {
            say!("perm: {e}; configuration will not survive a reboot");
            return false;
        }
    };
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
    match os::mount(&dev, PERM, "ext4", flags, None) {
        Ok(()) => {
            let (n, _) = crate::perm::boot_log::count_boot(Path::new(PERM));
            say!("perm mounted ({dev}, boot {n})");
            true
        }
        Err(e) => {
            // No mkfs on the appliance: the image builder formats perm; a damaged one
            // needs re-flashing or `factory-reset` from a host. Keep running without it.
            say!(
                "perm: mounting {dev} as ext4 failed: {e}; configuration will not survive a reboot"
            );
            false
        }
    }
}

/// Make sure `/perm/riceguard.conf` exists (first boot: from the default config with a new
/// private key), print the public key, and return the `[Gateway]` settings if it parses.
pub(super) fn load_config(perm_ok: bool) -> Option<GatewayConfig> {
    if !perm_ok {
        // Run from a tmpfs copy so the gateway still starts; nothing is kept.
        mkdir("/run/perm");
        let _ = os::mount(
            "tmpfs",
            PERM,
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0700"),
        );
    }
    let dir = Path::new(PERM);
    if !perm_config::conf_path(dir).exists() {
        let key = Key::generate_private(&mut rand_core::OsRng);
        let template = std::fs::read_to_string(DEFAULT_CONFIG).unwrap_or_else(|_| {
            "[Interface]\nPrivateKey = @PRIVATE_KEY@\nListenPort = 51820\n".into()
        });
        match perm_config::write_first(dir, &template, &key) {
            Ok(_) => say!("first boot: generated a private key into {CONFIG}"),
            Err(e) => say!("first boot: writing {CONFIG}: {e}"),
        }
    }
    let text = perm_config::read_text(dir);
    if let Some(k) = private_key_line(&text) {
        crate::logger::console_line(&format!("riceguard: public key {}", k.public().to_base64()));
    }
    match crate::core::ini::parse(CONFIG, &text) {
        Ok(c) => {
            // The console saves newer settings on `#+`/`#3+` lines, which the previous
            // slot's firmware (an earlier schema) skips; a plain one written by hand would make it refuse
            // the file after a rollback, [Gateway] settings and all.
            if let Some((n, e)) = crate::core::ini::earlier_refusal(CONFIG, &text) {
                say!("config: {e}: firmware before configuration schema {n} could not load {CONFIG} after a rollback; `commit` on the console saves it in the form both read");
            }
            Some(c.gateway)
        }
        Err(e) => {
            say!("config: {e}; uplink from the kernel command line only, gateway will report the same");
            None
        }
    }
}

/// How long past a `commit-confirm` deadline init waits for the console to roll back
/// before it restarts the console (a console that starts after the deadline rolls back
/// at once).
pub(super) const CONFIRM_GRACE_SECS: u64 = 15;

/// The deadline (unix seconds) in the text of `/perm/commit-confirm`, if the console is
/// more than [`CONFIRM_GRACE_SECS`] late with it at wall time `now` (no boot-time record).
#[cfg(test)]
pub(super) fn confirm_overdue(marker: &str, now: u64) -> Option<u64> {
    confirm_overdue_at(marker, None, now, None, 0).map(|(d, _)| d)
}

/// [`confirm_overdue`] by boot time when `boot` (the text of `commit-confirm.boot`) was
/// recorded on this boot (`boot_id`, `now_boot` seconds): a clock step then changes
/// nothing. Returns the unix deadline and how late the console is (s).
pub(super) fn confirm_overdue_at(
    marker: &str,
    boot: Option<&str>,
    now: u64,
    boot_id: Option<&str>,
    now_boot: u64,
) -> Option<(u64, u64)> {
    let d = confirm::parse_marker(marker)?;
    let rec = boot.and_then(confirm::ConfirmBoot::parse);
    let left = confirm::confirm_left(d, rec.as_ref(), now, boot_id, now_boot);
    let late = left.checked_neg()?.max(0).unsigned_abs();
    (late > CONFIRM_GRACE_SECS).then_some((d, late))
}

/// The commit-confirm deadline holds whatever the console does: the console rolls back
/// on time itself (long work runs in its own process), and if it is ever stuck past the
/// deadline (a blocked write to the serial line, say), init restarts it, once per
/// deadline, and the new console rolls back.
#[derive(Default)]
pub(super) struct ConfirmGuard {
    next: Option<Instant>,
    acted_on: Option<u64>,
}

impl ConfirmGuard {
    pub(super) fn check(&mut self, sup: &Supervisor) {
        let now = Instant::now();
        if self.next.is_some_and(|t| now < t) {
            return;
        }
        self.next = Some(now + Duration::from_secs(1));
        let running: Vec<Pid> = sup
            .services
            .iter()
            .filter(|s| s.spec.name.starts_with(CONSOLE_SERVICE))
            .filter_map(|s| match s.state {
                supervise::State::Running(pid) => Some(pid),
                _ => None,
            })
            .collect();
        if running.is_empty() {
            return;
        }
        let path = Path::new(PERM).join(confirm::CONFIRM);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let boot = std::fs::read_to_string(Path::new(PERM).join(confirm::CONFIRM_BOOT)).ok();
        let Some((deadline, late)) = confirm_overdue_at(
            &text,
            boot.as_deref(),
            unix,
            crate::sys::kernel_clocks::boot_id().as_deref(),
            crate::sys::kernel_clocks::boottime().as_secs(),
        ) else {
            return;
        };
        if self.acted_on == Some(deadline) {
            return;
        }
        self.acted_on = Some(deadline);
        say!(
            "console: the commit-confirm deadline passed {late} s ago and it has not rolled back: restarting the consoles (the one that made it rolls back at once, another one 10 s later)"
        );
        for pid in running {
            let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
        }
    }
}

/// The console's command line on terminal `tty` (its name in messages to the other
/// consoles); a `perm` that did not mount (an empty tmpfs is there instead) locks it:
/// no password file there proves nothing.
pub(super) fn console_argv(perm_ok: bool, tty: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![
        BIN.into(),
        "console".into(),
        "--root".into(),
        PERM.into(),
        "--name".into(),
        tty.into(),
    ];
    if !perm_ok {
        v.push("--perm-unmounted".into());
    }
    v
}

/// How long the early-boot failsafe prompt waits for a key (OpenWrt-style).
pub(super) const FAILSAFE_WAIT: Duration = Duration::from_secs(2);
/// The configuration the gateway runs when it is not `/perm/riceguard.conf` itself.
/// A commit on the console replaces it with the committed file (`console::system::hand_over`).
pub(super) const RUN_CONFIG: &str = crate::run::BOOT_CONFIG;

/// Offer failsafe mode on every console: `f` (then Enter) within `wait` on any of them
/// starts the gateway with no peers and leaves the saved configuration alone. The first
/// console to answer wins; every console is told which one did. Anything else typed is
/// ignored. `consoles` are the board's terminals that exist (names under `/dev`); with
/// none that opens, init's own stdin (`/dev/console`) is asked, as before.
pub(super) fn failsafe_prompt(wait: Duration, consoles: &[String]) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let text = format!(
        "press f and Enter within {} s for failsafe mode (no peers; saved configuration untouched)",
        wait.as_secs()
    );
    // `say!` reaches /dev/console (the kernel's last `console=`); the board's other
    // consoles are written to directly, so each terminal shows every line once.
    let kernel = kernel_console();
    let mut ttys: Vec<(String, File)> = Vec::new();
    for name in consoles {
        let path = Path::new("/dev").join(name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => ttys.push((name.clone(), f)),
            Err(e) => say!("failsafe prompt: {}: {e}", path.display()),
        }
    }
    let tell = |ttys: &mut Vec<(String, File)>, line: &str| {
        say!("{line}");
        for (name, f) in ttys.iter_mut() {
            if kernel.as_deref() != Some(name.as_str()) {
                let _ = writeln!(f, "riceguard-init: {line}");
            }
        }
    };
    tell(&mut ttys, &text);
    let use_stdin = ttys.is_empty();
    let stdin = std::io::stdin();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 64];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds: Vec<nix::poll::PollFd> = if use_stdin {
            vec![nix::poll::PollFd::new(
                stdin.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )]
        } else {
            ttys.iter()
                .map(|(_, f)| nix::poll::PollFd::new(f.as_fd(), nix::poll::PollFlags::POLLIN))
                .collect()
        };
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
        let ready: Vec<usize> = fds
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
            .map(|(i, _)| i)
            .collect();
        drop(fds);
        let mut gone = Vec::new();
        for i in ready {
            let (name, n) = match ttys.get_mut(i) {
                Some((name, f)) if !use_stdin => (name.clone(), f.read(&mut buf)),
                _ => ("console".to_string(), stdin.lock().read(&mut buf)),
            };
            match n {
                Ok(n) if n > 0 && answers_failsafe(&buf[..n]) => {
                    if ttys.len() > 1 {
                        tell(
                            &mut ttys,
                            &format!("failsafe mode (chosen on {name}; the other consoles are not asked any more)"),
                        );
                    } else {
                        tell(&mut ttys, "failsafe mode");
                    }
                    return true;
                }
                Ok(n) if n > 0 => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // EOF or an error: no input from this one (a hung-up line).
                _ => gone.push(i),
            }
        }
        if use_stdin && !gone.is_empty() {
            return false; // no console input (EOF or error)
        }
        for i in gone.into_iter().rev() {
            ttys.remove(i);
        }
        if !use_stdin && ttys.is_empty() {
            return false; // every console hung up
        }
    }
    false
}

/// Typed input that asks for failsafe mode.
pub(super) fn answers_failsafe(input: &[u8]) -> bool {
    input.iter().any(|&b| b == b'f' || b == b'F')
}

/// The terminal `/dev/console` writes to: the last of the kernel's active consoles
/// (`tty0`, the current virtual terminal, is `tty1` at boot).
pub(super) fn kernel_console() -> Option<String> {
    let active = std::fs::read_to_string("/sys/class/tty/console/active").ok()?;
    last_console(&active)
}

/// The board's console names as terminals: `kernel` is the serial line the kernel itself
/// uses as its console (the last of its active consoles that is not a virtual terminal:
/// from `console=`, else the firmware's device tree `stdout-path` or ACPI SPCR), for
/// boards whose UART differs from box to box (`ttyS2` on Rockchip, `ttyAMA0`, `ttyMV0`).
/// Duplicates are dropped; `kernel` with no serial console is dropped.
pub(super) fn resolve_consoles(names: &[String], active: &str) -> Vec<String> {
    let serial = active
        .split_whitespace()
        .rev()
        .find(|c| !is_vt(c))
        .map(str::to_string);
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let t = if n == "kernel" {
            serial.clone()
        } else {
            Some(n.clone())
        };
        if let Some(t) = t.filter(|t| !out.contains(t)) {
            out.push(t);
        }
    }
    out
}

fn is_vt(name: &str) -> bool {
    name.strip_prefix("tty")
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

pub(super) fn last_console(active: &str) -> Option<String> {
    let last = active.split_whitespace().last()?;
    Some(if last == "tty0" {
        "tty1".into()
    } else {
        last.into()
    })
}

/// Keep kernel messages off the console lines from now on: the consoles are running,
/// and a printk on a serial line or the screen lands in the middle of a prompt. Level 0
/// holds back every record, KERN_EMERG too; a panic still prints (the kernel raises
/// the level itself), and everything stays in the kernel's log buffer. This is the
/// `console_loglevel` of `/proc/sys/kernel/printk` (the first of its four numbers).
pub(super) fn quiet_kernel_console() {
    const PRINTK: &str = "/proc/sys/kernel/printk";
    let old = std::fs::read_to_string(PRINTK).unwrap_or_default();
    let new = quiet_printk(&old);
    match std::fs::write(PRINTK, new.as_bytes()) {
        Ok(()) => say!(
            "kernel messages kept off the consoles from here (console log level {} -> 0; a panic still prints)",
            old.split_whitespace().next().unwrap_or("?")
        ),
        Err(e) => say!("{PRINTK}: {e}: kernel messages may still appear on the console lines"),
    }
}

/// `/proc/sys/kernel/printk` with its console level set to 0, the other three kept.
pub(super) fn quiet_printk(old: &str) -> String {
    let mut v: Vec<&str> = old.split_whitespace().take(4).collect();
    if v.len() != 4 || v.iter().any(|x| x.parse::<i32>().is_err()) {
        // Unreadable: the kernel's defaults after the first.
        v = vec!["0", "4", "1", "7"];
    }
    v[0] = "0";
    v.join(" ")
}

/// The file the gateway starts from: the saved configuration when it loads and validates;
/// otherwise the newest saved version that does (said on the console); in failsafe mode
/// a copy without peers. Copies go to a tmpfs, so `/perm` is never rewritten here.
pub(super) fn gateway_config(failsafe: bool) -> String {
    // The one loader the consoles use too: no warning means the saved file itself.
    let (mut cfg, warning) = perm_config::load_with_fallback(Path::new(PERM));
    let saved_ok = warning.is_none();
    if saved_ok && !failsafe {
        return CONFIG.into();
    }
    if let Some(w) = warning {
        say!("config: {w}");
    }
    if !saved_ok {
        say!("config: {CONFIG} does not load; the gateway runs the last good version (fix it on the console, commit, reboot)");
    }
    if failsafe {
        cfg.peers.clear();
        say!("failsafe: the gateway starts with no peers; {CONFIG} is untouched");
    }
    if cfg.interface.private_key.is_none() {
        cfg.interface.private_key = Some(
            private_key_line(&perm_config::read_text(Path::new(PERM)))
                .unwrap_or_else(|| Key::generate_private(&mut rand_core::OsRng)),
        );
    }
    let out = crate::core::ini::emit(&cfg);
    match durable::write(Path::new(RUN_CONFIG), out.as_bytes(), durable::SECRET) {
        Ok(()) => RUN_CONFIG.into(),
        Err(e) => {
            say!("config: cannot write {RUN_CONFIG}: {e}; starting from {CONFIG}");
            CONFIG.into()
        }
    }
}

/// The `PrivateKey =` of an `[Interface]`, read directly so the public key is printed even
/// when the full parser refuses the file.
pub(super) fn private_key_line(text: &str) -> Option<Key> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("privatekey")).then(|| Key::from_base64(v.trim()).ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirm_deadline_guard() {
        assert_eq!(confirm_overdue("1000\n", 1000), None);
        assert_eq!(confirm_overdue("1000\n", 1000 + CONFIRM_GRACE_SECS), None);
        assert_eq!(
            confirm_overdue("1000\n", 1001 + CONFIRM_GRACE_SECS),
            Some(1000)
        );
        assert_eq!(confirm_overdue("", 5000), None);
        assert_eq!(confirm_overdue("garbage", 5000), None);
        assert_eq!(confirm_overdue(&u64::MAX.to_string(), u64::MAX), None);
    }

    #[test]
    fn confirm_deadline_by_boot_time_ignores_clock_steps() {
        // Recorded on this boot: due at boot time 400 s, unix 1000.
        let b = Some("boot-a 400\n");
        // The clock was stepped a day forward: by boot time it is not due yet.
        assert_eq!(
            confirm_overdue_at("1000\n", b, 1000 + 86_400, Some("boot-a"), 300),
            None
        );
        assert_eq!(
            confirm_overdue_at(
                "1000\n",
                b,
                1000 + 86_400,
                Some("boot-a"),
                401 + CONFIRM_GRACE_SECS
            ),
            Some((1000, 1 + CONFIRM_GRACE_SECS))
        );
        // After a reboot (another boot id) or without the file: the unix time, as before.
        assert_eq!(
            confirm_overdue_at("1000\n", b, 1001 + CONFIRM_GRACE_SECS, Some("boot-b"), 5),
            Some((1000, 1 + CONFIRM_GRACE_SECS))
        );
        assert_eq!(
            confirm_overdue_at("1000\n", None, 1000, Some("boot-a"), 10_000),
            None
        );
        assert_eq!(
            confirm_overdue_at("1000\n", Some("garbage"), 2000, Some("boot-a"), 0),
            Some((1000, 1000))
        );
    }

    #[test]
    fn console_locked_when_perm_did_not_mount() {
        assert!(!console_argv(true, "ttyS0").contains(&"--perm-unmounted".to_string()));
        assert_eq!(
            console_argv(false, "tty1").last().map(String::as_str),
            Some("--perm-unmounted")
        );
        assert_eq!(
            &console_argv(false, "tty1")[1..6],
            ["console", "--root", PERM, "--name", "tty1"]
        );
    }

    #[test]
    fn kernel_console_and_printk_level() {
        assert_eq!(last_console("tty0 ttyS0\n").as_deref(), Some("ttyS0"));
        assert_eq!(last_console("ttyS0 tty0\n").as_deref(), Some("tty1"));
        assert_eq!(last_console(""), None);
        let names: Vec<String> = ["kernel", "tty1", "ttyS2"].map(String::from).into();
        assert_eq!(resolve_consoles(&names, "tty0 ttyS2\n"), ["ttyS2", "tty1"]);
        assert_eq!(
            resolve_consoles(&names, "ttyAMA0"),
            ["ttyAMA0", "tty1", "ttyS2"]
        );
        assert_eq!(resolve_consoles(&names, "tty0"), ["tty1", "ttyS2"]);
        assert_eq!(quiet_printk("4\t4\t1\t7\n"), "0 4 1 7");
        assert_eq!(quiet_printk("7 4 1 7"), "0 4 1 7");
        assert_eq!(quiet_printk("garbage"), "0 4 1 7");
        assert!(answers_failsafe(b"f\n") && answers_failsafe(b"xF"));
        assert!(!answers_failsafe(b"\r\n") && !answers_failsafe(b""));
    }

    #[test]
    fn private_key_from_text() {
        let k = Key::generate_private(&mut rand_core::OsRng);
        let t = format!(
            "[Interface]\n PrivateKey = {}\nAddress = x\n",
            k.to_base64()
        );
        assert_eq!(private_key_line(&t), Some(k));
        assert_eq!(private_key_line("PrivateKey = junk"), None);
    }
}
