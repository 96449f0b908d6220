//! PID 1 of the appliance image, in two stages.
//!
//! Stage 1 runs from the initramfs inside the slot's UKI: mount /dev, /proc, /sys, /run,
//! load the board's modules, find `root-<slot>` by GPT label, mount its squashfs and
//! switch into it (the initramfs is emptied first), then exec the root's own
//! `/sbin/init --stage2`. Switching (rather than staying in the initramfs with the root
//! mounted aside) makes the slot's read-only root the whole system: the binary, /etc and
//! sysctl files that run are the ones the update wrote, and the initramfs memory is freed.
//!
//! Stage 2 (the long-lived PID 1): sysctl, hugepages, `perm` (ext4, pre-formatted at image
//! build: the appliance carries no mkfs), first-boot key, lo + uplink over netlink, RPS,
//! the supervised gateway daemon and serial console, the gateway's health watch (UAPI
//! answers, worker heartbeats move; restarted when unhealthy, see `health.rs`), the
//! watchdog (fed only while that watch is satisfied), marking the boot good once the
//! gateway is healthy, and clean reboot/poweroff on signals.
//!
//! Every step prints one `riceguard-init:` line on the console; tests grep for them.

pub mod board;
pub mod cmdline;
pub mod health;
pub mod supervise;
pub mod sysctl;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::core::config::GatewayConfig;
use crate::core::key::Key;
use crate::core::net::Cidr;
use crate::slots;
use crate::store;
use crate::sys::netlink::{Netlink, Route};
use crate::sys::os;

use self::board::Board;
use self::cmdline::Cmdline;
use self::supervise::{Spec, Supervisor};

const NEWROOT: &str = "/newroot";
const BOARD_FILE: &str = "/etc/riceguard/board.conf";
const PERM: &str = "/perm";
const CONFIG: &str = "/perm/riceguard.conf";
const DEFAULT_CONFIG: &str = "/etc/riceguard/default.conf";
const ESP_MNT: &str = "/run/esp";
const BIN: &str = "/usr/bin/riceguard";
/// First delay before a service that exited is started again (gokrazy: 1 s); it doubles
/// up to 60 s while the service keeps failing, so a gateway that fails at once does not
/// flood the serial line (`supervise::Backoff`).
const RESTART_DELAY: Duration = Duration::from_secs(1);
/// How long the gateway has to answer on its UAPI socket before this boot is left
/// unmarked (systemd-boot then counts it down and eventually falls back).
const HEALTH_DEADLINE: Duration = Duration::from_secs(180);

macro_rules! say {
    ($($t:tt)*) => { eprintln!("riceguard-init: {}", format_args!($($t)*)) };
}

pub fn main(args: &[String]) -> ExitCode {
    if std::process::id() != 1 {
        eprintln!("riceguard init: must run as PID 1 (the image's /init); for a shell, see `riceguard --help`");
        return ExitCode::from(1);
    }
    if args.iter().any(|a| a == "--stage2") {
        stage2();
    } else {
        let e = stage1();
        say!("FATAL: {e}");
        emergency();
    }
}

/// Nothing more can be done: leave the message readable, then reboot so the boot counter
/// goes down and systemd-boot can fall back to the other slot.
fn emergency() -> ! {
    say!("rebooting in 10s");
    std::thread::sleep(Duration::from_secs(10));
    os::sync();
    let e = os::halt(os::Halt::Reboot);
    say!("reboot failed: {e}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn mkdir(p: &str) {
    let _ = std::fs::create_dir_all(p);
}

fn mount_basics() {
    mkdir("/dev");
    let _ = os::mount(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    );
    // The kernel opened no console if the initramfs had no /dev/console; open it now.
    if let Ok(c) = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/console")
    {
        let _ = os::set_stdio(&c);
    }
    mkdir("/proc");
    mkdir("/sys");
    mkdir("/run");
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let _ = os::mount("proc", "/proc", "proc", nodev, None);
    let _ = os::mount("sysfs", "/sys", "sysfs", nodev, None);
    let _ = os::mount(
        "tmpfs",
        "/run",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    );
}

fn read_board() -> Board {
    let text = std::fs::read_to_string(BOARD_FILE).unwrap_or_default();
    let (b, errs) = board::parse(&text);
    for e in errs {
        say!("{e}");
    }
    b
}

fn read_cmdline() -> Cmdline {
    let c = cmdline::parse(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default());
    for e in &c.errors {
        say!("kernel command line: {e}");
    }
    c
}

fn stage1() -> String {
    mount_basics();
    say!("initramfs: riceguard {}", env!("CARGO_PKG_VERSION"));
    let board = read_board();
    load_modules(&board.modules);
    let cmd = read_cmdline();
    let slot = cmd.slot.unwrap_or_else(|| {
        say!("no riceguard.slot= on the kernel command line; using slot a");
        'a'
    });
    let label = format!("root-{slot}");
    // virtio/NVMe/USB probing may finish after the module loads return.
    let deadline = Instant::now() + Duration::from_secs(15);
    let dev = loop {
        if let Some(d) = slots::find_partition(&label) {
            break d;
        }
        if Instant::now() > deadline {
            return format!("no partition labelled {label} appeared within 15s (is the storage driver in MODULES?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    mkdir(NEWROOT);
    if let Err(e) = os::mount(&dev, NEWROOT, "squashfs", MsFlags::MS_RDONLY, None) {
        return format!("mounting {dev} ({label}) as squashfs: {e}");
    }
    if !Path::new(NEWROOT).join("sbin/init").exists() {
        return format!("{dev} ({label}) has no /sbin/init");
    }
    for m in ["/dev", "/proc", "/sys", "/run"] {
        if let Err(e) = os::mount_move(m, &format!("{NEWROOT}{m}")) {
            return format!("moving {m} into the new root: {e}");
        }
    }
    let _ = std::fs::write(format!("{NEWROOT}/run/riceguard-root"), format!("{dev}\n"));
    empty_initramfs();
    if let Err(e) = os::switch_root(NEWROOT) {
        return format!("switching to the root on {dev}: {e}");
    }
    let e = Command::new("/sbin/init").arg("--stage2").exec();
    format!("exec /sbin/init on {dev}: {e}")
}

/// Delete the initramfs's files (it is RAM that nothing will use again), staying on its
/// filesystem so mounts below it (the new root) are not touched.
fn empty_initramfs() {
    let Ok(root) = std::fs::metadata("/") else {
        return;
    };
    fn rm(dir: &Path, dev: u64, depth: u32) {
        if depth > 32 {
            return;
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if md.dev() != dev {
                continue;
            }
            if md.is_dir() {
                rm(&p, dev, depth + 1);
                let _ = std::fs::remove_dir(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    rm(Path::new("/"), root.dev(), 0);
}

/// Load each module with its dependencies first, as `modules.dep` lists them.
fn load_modules(names: &[String]) {
    let rel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = PathBuf::from(format!("/lib/modules/{rel}"));
    let dep = std::fs::read_to_string(base.join("modules.dep")).unwrap_or_default();
    let builtin = std::fs::read_to_string(base.join("modules.builtin")).unwrap_or_default();
    let db = ModDeps::parse(&dep);
    let mut loaded: Vec<String> = Vec::new();
    let mut failed = 0;
    let mut absent = 0;
    for name in names {
        let Some(order) = db.order(name) else {
            if ModDeps::is_builtin(&builtin, name) {
                continue;
            }
            say!("module {name}: not in this kernel's modules.dep (board MODULES?)");
            failed += 1;
            continue;
        };
        for path in order {
            if loaded.iter().any(|l| l == path) {
                continue;
            }
            match os::load_module(&base.join(path), "") {
                Ok(()) => loaded.push(path.to_string()),
                // A driver whose hardware is absent (a board lists every watchdog or
                // NIC it may have) refuses to load with ENODEV: not a fault.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    absent += 1;
                    loaded.push(path.to_string());
                }
                Err(e) => {
                    say!("module {path}: {e}");
                    failed += 1;
                }
            }
        }
    }
    say!(
        "{} modules loaded{}{}",
        loaded.len() - absent,
        if absent > 0 {
            format!(", {absent} without their hardware")
        } else {
            String::new()
        },
        if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        }
    );
}

/// `modules.dep`: `kernel/x/y.ko: dep1.ko dep2.ko` (deps listed dependents-first).
struct ModDeps<'a> {
    lines: Vec<(&'a str, Vec<&'a str>)>,
}

fn mod_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

impl<'a> ModDeps<'a> {
    fn parse(text: &'a str) -> Self {
        let lines = text
            .lines()
            .take(100_000)
            .filter_map(|l| {
                let (m, deps) = l.split_once(':')?;
                Some((m.trim(), deps.split_whitespace().collect()))
            })
            .collect();
        ModDeps { lines }
    }

    /// Paths to load for `name`, dependencies first.
    fn order(&self, name: &str) -> Option<Vec<&'a str>> {
        let want = name.replace('-', "_");
        let (path, deps) = self.lines.iter().find(|(p, _)| mod_name(p) == want)?;
        let mut v: Vec<&str> = deps.iter().rev().copied().collect();
        v.push(path);
        Some(v)
    }

    fn is_builtin(builtin: &str, name: &str) -> bool {
        let want = name.replace('-', "_");
        builtin.lines().any(|l| mod_name(l) == want)
    }
}

fn stage2() -> ! {
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mkdir("/dev/pts");
    let _ = os::mount(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("gid=5,mode=620,ptmxmode=666"),
    );
    mkdir("/dev/shm");
    let _ = os::mount("tmpfs", "/dev/shm", "tmpfs", nodev, None);
    let _ = os::mount("tmpfs", "/tmp", "tmpfs", nodev, Some("mode=1777"));
    mkdir("/run/riceguard");
    mkdir("/run/wireguard");
    let cmd = read_cmdline();
    let board = read_board();
    let slot = cmd.slot.unwrap_or('a');
    let rootdev = std::fs::read_to_string("/run/riceguard-root").unwrap_or_default();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    say!(
        "slot {slot} booted (board {}, root {} squashfs, kernel {kernel})",
        board.name,
        rootdev.trim()
    );
    let _ = nix::unistd::sethostname("riceguard");
    os::soft_ctrl_alt_del();

    // Signals are taken synchronously from a signalfd; block them before any thread
    // starts so every thread inherits the mask (children get a clean mask from std).
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGPWR,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    let _ = mask.thread_block();
    let mut sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok();

    let (n, problems) = sysctl::apply(Path::new("/etc/sysctl.d"));
    say!(
        "sysctl: {n} settings applied{}",
        if problems.is_empty() {
            String::new()
        } else {
            format!(", {} problems", problems.len())
        }
    );
    for p in problems.iter().take(20) {
        say!("sysctl: {p}");
    }
    let perm_ok = mount_perm();
    let gw = load_config(perm_ok);
    reserve_hugepages(hugepages_needed(gw.as_ref(), &board), board.hugepages);
    let failsafe = failsafe_prompt(FAILSAFE_WAIT);
    let gateway_conf = gateway_config(failsafe);
    uplink(gw.as_ref(), &cmd);
    steer_rps(gw.as_ref(), &board);
    let mut dog = Watchdog::open(&board);

    let ifname = gw
        .as_ref()
        .map(|g| g.interface_name.clone())
        .unwrap_or_else(|| "wg0".into());
    let mut sup = Supervisor::default();
    let now = Instant::now();
    let mut argv: Vec<String> = vec![
        BIN.into(),
        "up".into(),
        "--config".into(),
        gateway_conf.clone(),
    ];
    if cmd.selftest_hang {
        argv.push("--selftest-hang".into());
    }
    sup.add(
        Spec {
            name: "gateway".into(),
            argv,
            tty: None,
            restart_delay: RESTART_DELAY,
            health_checked: true,
        },
        now,
    );
    if !board.console.is_empty() && Path::new("/dev").join(&board.console).exists() {
        if !perm_ok {
            say!("perm not mounted: the console stays locked (its password cannot be checked); failsafe mode still works");
        }
        sup.add(
            Spec {
                name: "console".into(),
                argv: console_argv(perm_ok),
                tty: Some(format!("/dev/{}", board.console)),
                restart_delay: RESTART_DELAY,
                health_checked: false,
            },
            now,
        );
    }

    let started = Instant::now();
    let health_deadline = if cmd.selftest_unhealthy {
        say!("selftest: the gateway is never seen healthy on this boot");
        Duration::from_secs(20)
    } else {
        HEALTH_DEADLINE
    };
    let mut watch = health::GatewayHealth::new(health::LIMITS);
    let mut watched_start = 0u32; // the gateway start the watch follows
    let mut starving = false; // the watchdog is not being fed (said once)
    let mut warned_unhealthy = false;
    let mut marked = false; // boot marked good (once per boot, whichever start got there)
    let mut selftest_done = false;
    let mut hang_done = false;
    let mut next_health = Instant::now();
    let mut confirm_guard = ConfirmGuard::default();
    let mut halt: Option<os::Halt> = None;
    loop {
        let now = Instant::now();
        let next_start = sup.tick(now);
        confirm_guard.check(&sup);
        let (starts, running) = match sup.find("gateway") {
            Some(s) => match s.state {
                supervise::State::Running(pid) => (s.starts, Some(pid)),
                _ => (s.starts, None),
            },
            None => (0, None),
        };
        match running {
            Some(_) if starts != watched_start => {
                watched_start = starts;
                watch.started(now);
            }
            Some(_) => {}
            None => watch.exited(),
        }
        if let (Some(pid), None, true) = (running, halt, now >= next_health) {
            next_health = now + Duration::from_millis(500);
            let probe = if cmd.selftest_unhealthy {
                health::Probe {
                    uapi: Err("selftest: never seen healthy".into()),
                    beats: Err("selftest".into()),
                }
            } else {
                probe_gateway(&ifname)
            };
            match watch.observe(now, &probe) {
                health::Verdict::Up => {
                    sup.health("gateway", true, now);
                    say!("gateway up (UAPI /var/run/wireguard/{ifname}.sock answers, worker heartbeats move)");
                    if !marked {
                        marked = true;
                        mark_boot_good(slot);
                        crate::update::boot_request(BIN, &mut |l| say!("{l}"));
                    }
                    // With both selftests: the kill first, the hang on the next start.
                    if cmd.selftest_restart && !selftest_done {
                        selftest_done = true;
                        say!("selftest: killing the gateway (pid {pid}) to check it is restarted");
                        let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
                    } else if cmd.selftest_hang && !hang_done {
                        hang_done = true;
                        say!("selftest: freezing the gateway's worker heartbeats (pid {pid}) to check it is restarted");
                        let _ = nix::sys::signal::kill(pid, Signal::SIGUSR2);
                    }
                }
                health::Verdict::Down(why) => {
                    sup.health("gateway", false, now);
                    say!("gateway unhealthy: {why}");
                }
                health::Verdict::Restart(why) => {
                    sup.health("gateway", false, now);
                    say!("gateway unhealthy ({why}): restarting it");
                    let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
                }
                health::Verdict::Same => {}
            }
            if !marked
                && !watch.is_healthy()
                && !warned_unhealthy
                && now.duration_since(started) > health_deadline
            {
                warned_unhealthy = true;
                if slot_on_trial(slot) {
                    // A new slot that cannot run the gateway: reboot so its tries count
                    // down and systemd-boot falls back to the previous slot.
                    say!(
                        "gateway not healthy after {}s on slot {slot} (on trial): rebooting to count down its tries",
                        health_deadline.as_secs()
                    );
                    halt = Some(os::Halt::Reboot);
                } else {
                    say!(
                        "gateway not healthy after {}s; boot left unmarked (it counts down)",
                        health_deadline.as_secs()
                    );
                }
            }
        }
        // Fed only while the gateway is healthy or being handled on schedule; if this
        // loop itself stops (init wedged), nothing feeds it.
        if watch.feed(now) {
            dog.pet(now);
            starving = false;
        } else if !starving {
            starving = true;
            say!("the gateway could not be restarted: the watchdog is no longer fed");
        }
        // Wait for a signal, a due restart, the watchdog or the next health probe.
        let mut wait = Duration::from_millis(500);
        if let Some(t) = next_start {
            wait = wait.min(t.saturating_duration_since(now));
        }
        wait_signal(&mut sfd, wait, &mut halt);
        reap(&mut sup);
        if let Some(h) = halt {
            shutdown(&mut sup, &mut sfd, h, &mut dog);
        }
    }
}

/// Sleep until a signal or `wait` passes; note a requested halt.
fn wait_signal(sfd: &mut Option<SignalFd>, wait: Duration, halt: &mut Option<os::Halt>) {
    let Some(fd) = sfd.as_mut() else {
        std::thread::sleep(wait);
        return;
    };
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
    {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
    while let Ok(Some(info)) = fd.read_signal() {
        let sig = Signal::try_from(info.ssi_signo as i32).ok();
        match sig {
            Some(Signal::SIGTERM) | Some(Signal::SIGINT) | Some(Signal::SIGUSR1) => {
                *halt = Some(os::Halt::Reboot)
            }
            Some(Signal::SIGUSR2) | Some(Signal::SIGPWR) => *halt = Some(os::Halt::PowerOff),
            _ => {}
        }
    }
}

/// PID 1 reaps every child (orphans included) and tells the supervisor about its own.
fn reap(sup: &mut Supervisor) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(st) => {
                sup.on_exit(st, Instant::now());
            }
        }
    }
}

fn shutdown(
    sup: &mut Supervisor,
    sfd: &mut Option<SignalFd>,
    how: os::Halt,
    dog: &mut Watchdog,
) -> ! {
    say!(
        "{} requested: stopping services",
        if how == os::Halt::Reboot {
            "reboot"
        } else {
            "poweroff"
        }
    );
    sup.stop_all(Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ignore = None;
    while sup.running() > 0 && Instant::now() < deadline {
        wait_signal(sfd, Duration::from_millis(100), &mut ignore);
        reap(sup);
        dog.pet(Instant::now());
    }
    if sup.running() > 0 {
        sup.stop_all(Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(200));
        reap(sup);
    }
    // Whatever else runs (a console's background update: safe to interrupt, the new slot
    // is enabled only at its end) must not keep perm busy.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(100));
    reap(sup);
    os::sync();
    for m in [ESP_MNT, PERM] {
        if os::umount(m).is_err() {
            let _ = os::remount_ro(m);
        }
    }
    os::sync();
    say!(
        "{}",
        if how == os::Halt::Reboot {
            "rebooting"
        } else {
            "powering off"
        }
    );
    let e = os::halt(how);
    say!("halt failed: {e}");
    emergency();
}

/// Hugepages the gateway's buffer pools take: one pool per worker (`Cores`, else every
/// online core), `Buffers` buffers each; none when io_uring or hugepages are off. Without
/// a loadable configuration the board's number stands.
fn hugepages_needed(gw: Option<&GatewayConfig>, board: &Board) -> u32 {
    let Some(g) = gw else {
        return board.hugepages;
    };
    let workers = if g.cores.is_empty() {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        g.cores.len()
    };
    let page = crate::sys::hugepage::huge_info()
        .map(|h| h.page_size)
        .filter(|&p| p > 0)
        .unwrap_or(2 << 20);
    pool_hugepages(g, workers, page)
}

/// The arithmetic of [`hugepages_needed`], apart for tests.
fn pool_hugepages(g: &GatewayConfig, workers: usize, page_size: usize) -> u32 {
    if !g.io_uring || !g.hugepages {
        return 0;
    }
    let pool = crate::driver::uring_worker::UringWorkerConfig::from_gateway(g).pool;
    let n = pool.hugepages_needed(page_size) * workers as u64;
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reserve `need` hugepages, at most the board's budget `cap` (0: no cap).
fn reserve_hugepages(need: u32, cap: u32) {
    let n = if cap > 0 && need > cap {
        say!("hugepages: the configured pools need {need}, the board allows {cap}; the rest of the pools use ordinary pages");
        cap
    } else {
        need
    };
    if n == 0 {
        return;
    }
    let p = "/proc/sys/vm/nr_hugepages";
    if let Err(e) = std::fs::write(p, n.to_string()) {
        say!("hugepages: cannot reserve {n}: {e}");
        return;
    }
    let got = std::fs::read_to_string(p).unwrap_or_default();
    say!(
        "hugepages: {} of {n} reserved (the gateway's buffer pools)",
        got.trim()
    );
}

fn mount_perm() -> bool {
    mkdir(PERM);
    let Some(dev) = slots::find_partition("perm") else {
        say!("perm: no partition labelled perm; configuration will not survive a reboot");
        return false;
    };
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
    match os::mount(&dev, PERM, "ext4", flags, None) {
        Ok(()) => {
            mkdir("/perm/log");
            let boots = std::fs::read_to_string("/perm/log/boots").unwrap_or_default();
            let n = boots.trim().parse::<u64>().unwrap_or(0) + 1;
            let _ = store::write(
                Path::new("/perm/log/boots"),
                format!("{n}\n").as_bytes(),
                store::PUBLIC,
            );
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
fn load_config(perm_ok: bool) -> Option<GatewayConfig> {
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
    let path = Path::new(CONFIG);
    if !path.exists() {
        let key = Key::generate_private();
        let template = std::fs::read_to_string(DEFAULT_CONFIG).unwrap_or_else(|_| {
            "[Interface]\nPrivateKey = @PRIVATE_KEY@\nListenPort = 51820\n".into()
        });
        let text = template.replace("@PRIVATE_KEY@", &key.to_base64());
        // 0600 from creation: the file holds the private key.
        match store::write(path, text.as_bytes(), store::SECRET) {
            Ok(()) => say!("first boot: generated a private key into {CONFIG}"),
            Err(e) => say!("first boot: writing {CONFIG}: {e}"),
        }
    }
    let mut text = String::new();
    if let Ok(f) = File::open(path) {
        let _ = f.take(1 << 20).read_to_string(&mut text);
    }
    if let Some(k) = private_key_line(&text) {
        eprintln!("riceguard: public key {}", k.public().to_base64());
    }
    match crate::core::ini::parse(CONFIG, &text) {
        Ok(c) => Some(c.gateway),
        Err(e) => {
            say!("config: {e}; uplink from the kernel command line only, gateway will report the same");
            None
        }
    }
}

/// How long past a `commit-confirm` deadline init waits for the console to roll back
/// before it restarts the console (a console that starts after the deadline rolls back
/// at once).
const CONFIRM_GRACE_SECS: u64 = 15;

/// The deadline (unix seconds) in the text of `/perm/commit-confirm`, if the console is
/// more than [`CONFIRM_GRACE_SECS`] late with it at wall time `now`.
fn confirm_overdue(marker: &str, now: u64) -> Option<u64> {
    let d: u64 = marker.trim().parse().ok()?;
    (now > d.saturating_add(CONFIRM_GRACE_SECS)).then_some(d)
}

/// The commit-confirm deadline holds whatever the console does: the console rolls back
/// on time itself (long work runs in its own process), and if it is ever stuck past the
/// deadline (a blocked write to the serial line, say), init restarts it, once per
/// deadline, and the new console rolls back.
#[derive(Default)]
struct ConfirmGuard {
    next: Option<Instant>,
    acted_on: Option<u64>,
}

impl ConfirmGuard {
    fn check(&mut self, sup: &Supervisor) {
        let now = Instant::now();
        if self.next.is_some_and(|t| now < t) {
            return;
        }
        self.next = Some(now + Duration::from_secs(1));
        let Some(supervise::State::Running(pid)) = sup.find("console").map(|s| s.state) else {
            return;
        };
        let path = Path::new(PERM).join(crate::console::store::CONFIRM);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let Some(deadline) = confirm_overdue(&text, unix) else {
            return;
        };
        if self.acted_on == Some(deadline) {
            return;
        }
        self.acted_on = Some(deadline);
        say!(
            "console: the commit-confirm deadline passed {} s ago and it has not rolled back: restarting the console (it rolls back at once)",
            unix.saturating_sub(deadline)
        );
        let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
    }
}

/// The console's command line; a `perm` that did not mount (an empty tmpfs is there
/// instead) locks it: no password file there proves nothing.
fn console_argv(perm_ok: bool) -> Vec<String> {
    let mut v: Vec<String> = vec![BIN.into(), "console".into(), "--root".into(), PERM.into()];
    if !perm_ok {
        v.push("--perm-unmounted".into());
    }
    v
}

/// How long the early-boot failsafe prompt waits for a key (OpenWrt-style).
const FAILSAFE_WAIT: Duration = Duration::from_secs(2);
/// The configuration the gateway runs when it is not `/perm/riceguard.conf` itself.
/// A commit on the console replaces it with the committed file (`console::system::hand_over`).
const RUN_CONFIG: &str = crate::console::system::BOOT_CONFIG;

/// Offer failsafe mode on the console: `f` (then Enter) within `wait` starts the gateway
/// with no peers and leaves the saved configuration alone. Anything else typed is ignored.
fn failsafe_prompt(wait: Duration) -> bool {
    use std::os::fd::AsFd;
    say!(
        "press f and Enter within {} s for failsafe mode (no peers; saved configuration untouched)",
        wait.as_secs()
    );
    let stdin = std::io::stdin();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 64];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            stdin.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) => return false,
            Ok(_) => match nix::unistd::read(0, &mut buf) {
                Ok(0) | Err(_) => return false, // no console input (EOF or error)
                Ok(n) if buf[..n].iter().any(|&b| b == b'f' || b == b'F') => {
                    say!("failsafe mode");
                    return true;
                }
                Ok(_) => {}
            },
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
    false
}

/// The file the gateway starts from: `/perm/riceguard.conf` when it loads and validates;
/// otherwise the newest saved version that does (said on the console); in failsafe mode
/// a copy without peers. Copies go to a tmpfs, so `/perm` is never rewritten here.
fn gateway_config(failsafe: bool) -> String {
    let mut text = String::new();
    if let Ok(f) = File::open(CONFIG) {
        let _ = f.take(1 << 20).read_to_string(&mut text);
    }
    let saved_ok = crate::core::ini::parse(CONFIG, &text).is_ok_and(|c| c.validate().is_ok());
    if saved_ok && !failsafe {
        return CONFIG.into();
    }
    let (mut cfg, warning) = crate::console::load_with_fallback(Path::new(PERM));
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
        cfg.interface.private_key =
            Some(private_key_line(&text).unwrap_or_else(Key::generate_private));
    }
    let out = crate::core::ini::emit(&cfg);
    match store::write(Path::new(RUN_CONFIG), out.as_bytes(), store::SECRET) {
        Ok(()) => RUN_CONFIG.into(),
        Err(e) => {
            say!("config: cannot write {RUN_CONFIG}: {e}; starting from {CONFIG}");
            CONFIG.into()
        }
    }
}

/// The `PrivateKey =` of an `[Interface]`, read directly so the public key is printed even
/// when the full parser refuses the file.
fn private_key_line(text: &str) -> Option<Key> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("privatekey")).then(|| Key::from_base64(v.trim()).ok())?
    })
}

/// The first physical (has a `device`) network interface, by name.
fn first_ethernet() -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo" && Path::new("/sys/class/net").join(n).join("device").exists())
        .collect();
    names.sort();
    names.into_iter().next()
}

fn uplink(gw: Option<&GatewayConfig>, cmd: &Cmdline) {
    let mut nl = match Netlink::open() {
        Ok(n) => n,
        Err(e) => {
            say!("network: {e}");
            return;
        }
    };
    if let Err(e) = nl.set_link_up("lo", true) {
        say!("network: lo: {e}");
    }
    let spec = cmd.uplink.as_ref();
    let named = spec
        .and_then(|s| s.dev.clone())
        .or_else(|| gw.map(|g| g.uplink.clone()).filter(|u| !u.is_empty()));
    let deadline = Instant::now() + Duration::from_secs(5);
    let dev = loop {
        let d = named
            .clone()
            .filter(|n| Path::new("/sys/class/net").join(n).exists())
            .or_else(|| {
                if named.is_none() {
                    first_ethernet()
                } else {
                    None
                }
            });
        if let Some(d) = d {
            break d;
        }
        if Instant::now() > deadline {
            say!(
                "network: no uplink interface{} found",
                named.map(|n| format!(" `{n}`")).unwrap_or_default()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Err(e) = nl.set_link_up(&dev, true) {
        say!("network: {dev}: {e}");
        return;
    }
    let (addrs, gateway): (Vec<Cidr>, _) = match spec {
        Some(s) => (vec![s.address], s.gateway),
        None => gw
            .map(|g| (g.uplink_addresses.clone(), g.uplink_gateway))
            .unwrap_or_default(),
    };
    for a in &addrs {
        if let Err(e) = nl.add_address(&dev, *a) {
            say!("network: {e}");
        }
    }
    if let Some(g) = gateway {
        let any = if g.is_ipv4() {
            Cidr::new([0, 0, 0, 0].into(), 0)
        } else {
            Cidr::new([0u16; 8].into(), 0)
        };
        let idx = Netlink::ifindex(&dev).ok();
        if let Some(dst) = any {
            if let Err(e) = nl.add_route(Route {
                dst,
                gateway: Some(g),
                ifindex: idx,
            }) {
                say!("network: default route: {e}");
            }
        }
    }
    let list: Vec<String> = addrs
        .iter()
        .map(|a| format!("{}/{}", a.addr, a.prefix))
        .collect();
    say!(
        "uplink {dev} up{}{}",
        if list.is_empty() {
            " (no address configured: set UplinkAddress)".to_string()
        } else {
            format!(" {}", list.join(" "))
        },
        gateway.map(|g| format!(" via {g}")).unwrap_or_default()
    );
    report_uso(&dev);
}

/// Say once whether the uplink offers UDP segmentation offload (USO): the data plane's
/// offload decision starts from this, and the image test checks it per QEMU `host_uso`.
fn report_uso(dev: &str) {
    match crate::sys::ethtool::NicFeatures::read(dev) {
        Ok(f) => match f.get("tx-udp-segmentation") {
            Some(b) => say!(
                "uplink {dev} tx-udp-segmentation: {}{}",
                if b.active { "on" } else { "off" },
                if b.fixed() {
                    " [fixed]"
                } else {
                    " (changeable)"
                }
            ),
            None => say!("uplink {dev}: this kernel has no tx-udp-segmentation feature"),
        },
        Err(e) => say!("uplink {dev}: {e}"),
    }
}

/// Steer the uplink's receive queues (RPS) to the data-plane cores that are online.
fn steer_rps(gw: Option<&GatewayConfig>, board: &Board) {
    let cores = match gw {
        Some(g) if !g.cores.is_empty() => g.cores.clone(),
        _ => board.dataplane_cores.clone(),
    };
    if cores.is_empty() {
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| board::parse_cpus(s.trim()).ok())
        .unwrap_or_default();
    let cores: Vec<usize> = cores.into_iter().filter(|c| online.contains(c)).collect();
    let dev = gw
        .map(|g| g.uplink.clone())
        .filter(|u| !u.is_empty())
        .or_else(first_ethernet);
    let (Some(dev), false) = (dev, cores.is_empty()) else {
        return;
    };
    let mask = board::cpu_mask(&cores);
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/sys/class/net/{dev}/queues")) {
        for q in rd.flatten() {
            if q.file_name().to_string_lossy().starts_with("rx-")
                && std::fs::write(q.path().join("rps_cpus"), &mask).is_ok()
            {
                n += 1;
            }
        }
    }
    say!("rps: {n} {dev} rx queues -> cpus {cores:?} (mask {mask})");
    // XPS: each transmit queue is used by one data-plane core, so a worker's sends stay
    // on its own queue (no lock shared with another core's transmits).
    let mut txq: Vec<usize> = std::fs::read_dir(format!("/sys/class/net/{dev}/queues"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|q| {
                    q.file_name()
                        .to_string_lossy()
                        .strip_prefix("tx-")
                        .and_then(|i| i.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    txq.sort_unstable();
    let mut set = 0;
    for (q, m) in xps_plan(&txq, &cores) {
        let path = format!("/sys/class/net/{dev}/queues/tx-{q}/xps_cpus");
        if std::fs::write(path, &m).is_ok() {
            set += 1;
        }
    }
    say!(
        "xps: {set} of {} {dev} tx queues -> one data-plane core each",
        txq.len()
    );
}

/// Transmit queue -> the CPU mask of the data-plane core that sends on it: queues in
/// order, cores taken round-robin (with more cores than queues, a queue gets several).
fn xps_plan(queues: &[usize], cores: &[usize]) -> Vec<(usize, String)> {
    if queues.is_empty() || cores.is_empty() {
        return Vec::new();
    }
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); queues.len()];
    for (i, &c) in cores.iter().enumerate() {
        per[i % queues.len()].push(c);
    }
    queues
        .iter()
        .zip(per)
        .enumerate()
        .map(|(i, (&q, mut cs))| {
            if cs.is_empty() {
                cs.push(cores[i % cores.len()]);
            }
            (q, board::cpu_mask(&cs))
        })
        .collect()
}

/// One look at the gateway for the health watch: its UAPI answer and the worker
/// heartbeats of its status file.
fn probe_gateway(ifname: &str) -> health::Probe {
    let status = format!("/run/riceguard/{ifname}.status");
    let beats = match std::fs::read_to_string(&status) {
        Ok(t) => crate::driver::status::parse_heartbeats(&t)
            .ok_or_else(|| format!("no heartbeat line in {status}")),
        Err(e) => Err(format!("{status}: {e}")),
    };
    health::Probe {
        uapi: uapi_answers(ifname),
        beats,
    }
}

/// Does the gateway answer `get=1` on its UAPI socket with `errno=0`? Bounded: 1 s.
fn uapi_answers(ifname: &str) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let mut s = UnixStream::connect(format!("/var/run/wireguard/{ifname}.sock"))
        .map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    s.write_all(b"get=1\n\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while buf.len() < (1 << 20) {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.ends_with(b"\n\n") {
                    break;
                }
            }
        }
    }
    if String::from_utf8_lossy(&buf)
        .lines()
        .any(|l| l == "errno=0")
    {
        Ok(())
    } else if buf.is_empty() {
        Err("no answer within 1 s".into())
    } else {
        Err("no errno=0 in its answer".into())
    }
}

/// Whether this slot booted from a boot-counted entry (an update on trial).
fn slot_on_trial(slot: char) -> bool {
    let Some(dev) = slots::find_partition("esp") else {
        return false;
    };
    mkdir(ESP_MNT);
    if os::mount(
        &dev,
        ESP_MNT,
        "vfat",
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )
    .is_err()
    {
        return false;
    }
    let r = crate::slots::slot_on_trial(Path::new(ESP_MNT), slot);
    let _ = os::umount(ESP_MNT);
    r
}

fn mark_boot_good(slot: char) {
    let Some(dev) = slots::find_partition("esp") else {
        say!("no esp partition: boot not marked");
        return;
    };
    mkdir(ESP_MNT);
    if let Err(e) = os::mount(
        &dev,
        ESP_MNT,
        "vfat",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("umask=0077"),
    ) {
        say!("mounting esp {dev}: {e}; boot not marked");
        return;
    }
    for l in crate::update::boot_report(Path::new(ESP_MNT), slot) {
        say!("{l}");
    }
    match slots::mark_good(Path::new(ESP_MNT), slot) {
        Ok(slots::Marked::Renamed { from, to }) => say!("boot marked good ({from} -> {to})"),
        Ok(slots::Marked::AlreadyGood) => {
            say!("boot marked good (entry riceguard-{slot}.conf already had no counter)")
        }
        Err(e) => say!("marking boot good on {dev}: {e}"),
    }
    os::sync();
    if let Err(e) = os::umount(ESP_MNT) {
        say!("unmounting esp: {e}");
    }
}

/// `/dev/watchdog`, petted every third of its timeout; closed only by reboot, so a hung
/// init resets the machine.
struct Watchdog {
    f: Option<File>,
    every: Duration,
    last: Instant,
}

impl Watchdog {
    fn open(board: &Board) -> Watchdog {
        let every = Duration::from_secs(u64::from(board.watchdog_timeout / 3).max(1));
        let mut w = Watchdog {
            f: None,
            every,
            last: Instant::now(),
        };
        if board.watchdog.is_empty() {
            return w;
        }
        match OpenOptions::new().write(true).open(&board.watchdog) {
            Ok(f) => {
                say!(
                    "watchdog {} armed, petted every {}s",
                    board.watchdog,
                    every.as_secs()
                );
                w.f = Some(f);
            }
            Err(e) => say!("watchdog {}: {e}; running without", board.watchdog),
        }
        w
    }

    fn pet(&mut self, now: Instant) {
        if let Some(f) = self.f.as_mut() {
            if now.duration_since(self.last) >= self.every {
                let _ = f.write_all(b"\0");
                self.last = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xps_one_core_per_queue() {
        let m = |c: &[usize]| board::cpu_mask(c);
        assert_eq!(
            xps_plan(&[0, 1, 2, 3], &[1, 2]),
            vec![(0, m(&[1])), (1, m(&[2])), (2, m(&[1])), (3, m(&[2]))]
        );
        assert_eq!(xps_plan(&[0], &[0, 1]), vec![(0, m(&[0, 1]))]);
        assert!(xps_plan(&[], &[1]).is_empty());
    }

    /// The reservation follows Cores and Buffers: 1024 buffers of 68 KiB are 34 pages of
    /// 2 MiB per worker (the qemu board's fixed 32 was short by 2 for one worker).
    #[test]
    fn hugepages_follow_cores_and_buffers() {
        let mut g = GatewayConfig::default();
        let two_mib = 2 << 20;
        assert_eq!(pool_hugepages(&g, 1, two_mib), 34);
        assert_eq!(pool_hugepages(&g, 2, two_mib), 68);
        g.buffers = 256;
        assert_eq!(pool_hugepages(&g, 2, two_mib), 18);
        g.hugepages = false;
        assert_eq!(pool_hugepages(&g, 2, two_mib), 0);
        g.hugepages = true;
        g.io_uring = false;
        assert_eq!(
            pool_hugepages(&g, 2, two_mib),
            0,
            "the poll loop has no pool"
        );
        let b = Board {
            hugepages: 7,
            ..Board::default()
        };
        assert_eq!(
            hugepages_needed(None, &b),
            7,
            "no config: the board's number"
        );
    }

    #[test]
    fn modules_dep_order() {
        let dep = "kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n\
                   kernel/net/core/failover.ko:\nkernel/fs/nls/nls_iso8859-1.ko:\n";
        let db = ModDeps::parse(dep);
        assert_eq!(
            db.order("virtio_net").unwrap(),
            [
                "kernel/net/core/failover.ko",
                "kernel/drivers/net/net_failover.ko",
                "kernel/drivers/net/virtio_net.ko"
            ]
        );
        assert_eq!(
            db.order("nls_iso8859_1").unwrap(),
            ["kernel/fs/nls/nls_iso8859-1.ko"]
        );
        assert!(db.order("nope").is_none());
        assert!(ModDeps::is_builtin(
            "kernel/drivers/virtio/virtio_pci.ko\n",
            "virtio_pci"
        ));
    }

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
    fn console_locked_when_perm_did_not_mount() {
        assert!(!console_argv(true).contains(&"--perm-unmounted".to_string()));
        assert_eq!(
            console_argv(false).last().map(String::as_str),
            Some("--perm-unmounted")
        );
        assert_eq!(&console_argv(false)[1..4], ["console", "--root", PERM]);
    }

    #[test]
    fn private_key_from_text() {
        let k = Key::generate_private();
        let t = format!(
            "[Interface]\n PrivateKey = {}\nAddress = x\n",
            k.to_base64()
        );
        assert_eq!(private_key_line(&t), Some(k));
        assert_eq!(private_key_line("PrivateKey = junk"), None);
    }
}
