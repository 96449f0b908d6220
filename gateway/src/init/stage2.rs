//! Stage 2, the long-lived PID 1: the boot sequence (sysctl, perm and configuration,
//! hugepages, uplink, RPS/XPS, watchdog) and then the supervision loop: services started
//! and restarted, the gateway's health watched, signals, reboot and poweroff.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::perm::DIR as PERM;
use crate::sys::os;

use super::common::{
    emergency, mkdir, read_board, read_cmdline, BIN, CONSOLE_SERVICE, ESP_MNT, HEALTH_DEADLINE,
    RESTART_DELAY,
};
use super::hugepages::{hugepages_needed, reserve_hugepages};
use super::network::{steer_rps, uplink};
use super::perm::{
    console_argv, failsafe_prompt, gateway_config, load_config, mount_perm, quiet_kernel_console,
    resolve_consoles, ConfirmGuard, FAILSAFE_WAIT,
};
use super::supervise::{Spec, Supervisor};
use super::watch::{mark_boot_good, probe_gateway, publish_figures, slot_on_trial, Watchdog};
use super::{clock_floor, health, supervise, sysctl};

pub(super) fn stage2() -> ! {
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
    mkdir(crate::run::RUN_DIR);
    mkdir(crate::run::UAPI_DIR);
    let cmd = read_cmdline();
    let board = read_board();
    let slot = cmd.slot.unwrap_or('a');
    let rootdev = std::fs::read_to_string(crate::run::ROOT_DEVICE).unwrap_or_default();
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
    // Before anything makes a handshake or stamps a log: the clock at its floor.
    let may_step_back = clock_floor::set_at_boot(perm_ok);
    let mut time_saver = clock_floor::Saver::new(perm_ok);
    if perm_ok {
        // After the clock: the event's time is the floor's, not the RTC's 2001.
        let n = crate::perm::boot_log::count(Path::new(PERM));
        let before = crate::perm::event_log::previous_shutdown(Path::new(PERM))
            .map(|p| format!("; the previous boot's shutdown: {p}"))
            .unwrap_or_default();
        let version = std::fs::read_to_string(crate::image_paths::VERSION).unwrap_or_default();
        let version = version.trim();
        let version = if version.is_empty() {
            String::new()
        } else {
            format!(", {version}")
        };
        crate::perm::event_log::say(
            Path::new(PERM),
            "init",
            &format!("boot {n}: slot {slot}{version}{before}"),
        );
    }
    let gw = load_config(perm_ok);
    let mut syslog = supervise::SyslogFollow::new(Path::new(PERM), Instant::now());
    reserve_hugepages(hugepages_needed(gw.as_ref(), &board), board.hugepages);
    // The board's consoles whose terminal exists (a screen-less box has no tty1, a box
    // without a COM port no ttyS0): the failsafe prompt asks on all of them.
    let active = std::fs::read_to_string("/sys/class/tty/console/active").unwrap_or_default();
    let consoles: Vec<String> = resolve_consoles(&board.consoles, &active)
        .iter()
        .filter(|c| {
            let there = Path::new("/dev").join(c).exists();
            if !there {
                say!("console: /dev/{c} does not exist: no console there");
            }
            there
        })
        .cloned()
        .collect();
    let failsafe = failsafe_prompt(FAILSAFE_WAIT, &consoles);
    let gateway_conf = gateway_config(failsafe);
    // Before any interface but lo is up: the uplink passes no packet unfiltered.
    boot_firewall(&gateway_conf);
    let dhcp_dev = uplink(gw.as_ref(), &cmd);
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
        "--event-log".into(),
        PERM.into(),
    ];
    if cmd.selftest_hang {
        argv.push("--selftest-hang".into());
    }
    let gateway_spec = Spec {
        name: "gateway".into(),
        argv,
        tty: None,
        restart_delay: RESTART_DELAY,
        health_checked: true,
    };
    // After a power cut the first NTP answer may step the clock back (core::clock): the
    // gateway's sessions read the wall clock once, so they start after that answer.
    let mut held_gateway = if may_step_back {
        say!(
            "clock: the gateway starts after the first NTP answer (at most {} s): it may set the clock back",
            crate::core::clock::GATEWAY_WAIT.as_secs()
        );
        Some((gateway_spec, now + crate::core::clock::GATEWAY_WAIT))
    } else {
        sup.add(gateway_spec, now);
        None
    };
    // No static uplink address: the uplink is configured by DHCP (riceguard dhcp DEV),
    // supervised like the gateway but not health-checked (it has no UAPI).
    let sup_dhcp_dev = dhcp_dev.clone();
    if let Some(dev) = dhcp_dev {
        sup.add(
            Spec {
                name: "dhcp".into(),
                // The configuration the gateway runs: leases are judged against its routes.
                argv: vec![
                    BIN.into(),
                    "dhcp".into(),
                    "--config".into(),
                    gateway_conf.clone(),
                    "--event-log".into(),
                    PERM.into(),
                    dev,
                ],
                tty: None,
                restart_delay: RESTART_DELAY,
                health_checked: false,
            },
            now,
        );
    }
    // The SNTP client (servers: the running configuration's `Ntp`, else the lease's).
    let mut ntp_argv: Vec<String> = vec![
        BIN.into(),
        "ntp".into(),
        "--config".into(),
        gateway_conf.clone(),
        "--event-log".into(),
        PERM.into(),
    ];
    if let Some(dev) = sup_dhcp_dev.as_ref() {
        ntp_argv.push("--lease".into());
        ntp_argv.push(format!("{}/lease.{dev}", crate::run::RUN_DIR));
    }
    sup.add(
        Spec {
            name: "ntp".into(),
            argv: ntp_argv,
            tty: None,
            restart_delay: RESTART_DELAY,
            health_checked: false,
        },
        now,
    );
    // The console over SSH. It listens only while the saved configuration has an SSH key
    // (it re-reads the file itself), lowers its own priority and leaves the data plane's
    // cores; without perm there are no keys and no host key, so it does not run.
    if perm_ok {
        sup.add(
            Spec {
                name: "ssh".into(),
                argv: vec![BIN.into(), "ssh".into(), "--root".into(), PERM.into()],
                tty: None,
                restart_delay: RESTART_DELAY,
                health_checked: false,
            },
            now,
        );
    }
    if !consoles.is_empty() {
        if !perm_ok {
            say!("perm not mounted: the console stays locked (its password cannot be checked); failsafe mode still works");
        }
        quiet_kernel_console();
    }
    for tty in &consoles {
        sup.add(
            Spec {
                name: format!("{CONSOLE_SERVICE}-{tty}"),
                argv: console_argv(perm_ok, tty),
                tty: Some(format!("/dev/{tty}")),
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
                            // With SSH keys set, a boot is good only once `riceguard ssh` listens too: a firmware
                            // whose SSH is broken must roll back by itself rather than strand a remote box.
    let ssh_needed: Option<u16> = gw
        .as_ref()
        .filter(|g| perm_ok && !g.ssh_keys.is_empty())
        .map(|g| g.ssh_port);
    let mut gateway_was_up = false;
    let mut said_ssh_wait = false;
    let mut selftest_done = false;
    let mut hang_done = false;
    let mut next_health = Instant::now();
    let mut confirm_guard = ConfirmGuard::default();
    let mut halt: Option<os::Halt> = None;
    let mut published = String::new(); // init's figures last written (run::services)
    loop {
        let now = Instant::now();
        if let Some((_, until)) = &held_gateway {
            let settled = clock_floor::first_answer_settled();
            if settled || now >= *until {
                if !settled {
                    say!("clock: no NTP answer yet: starting the gateway");
                }
                if let Some((spec, _)) = held_gateway.take() {
                    sup.add(spec, now);
                }
            }
        }
        let next_start = sup.tick(now);
        confirm_guard.check(&sup);
        time_saver.tick(now);
        syslog.tick(now);
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
                health::HealthChange::Up => {
                    sup.health("gateway", true, now);
                    say!(
                        "gateway up (UAPI {} answers, worker heartbeats move)",
                        crate::run::uapi_socket(&ifname).display()
                    );
                    gateway_was_up = true;
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
                health::HealthChange::Down(why) => {
                    sup.health("gateway", false, now);
                    say!("gateway unhealthy: {why}");
                }
                health::HealthChange::Restart(why) => {
                    sup.health("gateway", false, now);
                    say!("gateway unhealthy ({why}): restarting it");
                    let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
                }
                health::HealthChange::Same => {}
            }
            let ssh_ok = ssh_needed.is_none_or(crate::sys::os::tcp_listening);
            if gateway_was_up && !marked {
                if ssh_ok {
                    marked = true;
                    if let Some(port) = ssh_needed {
                        say!("ssh listens on port {port}");
                    }
                    mark_boot_good(slot);
                    crate::update::boot_request(BIN, &mut |l| say!("{l}"));
                } else if !said_ssh_wait {
                    said_ssh_wait = true;
                    say!(
                        "boot not marked good until riceguard ssh listens on port {} (SSH keys are set)",
                        ssh_needed.unwrap_or_default()
                    );
                }
            }
            if !marked
                && (!watch.is_healthy() || !ssh_ok)
                && !warned_unhealthy
                && now.duration_since(started) > health_deadline
            {
                warned_unhealthy = true;
                if slot_on_trial(slot) {
                    // A new slot that cannot run the gateway: reboot so its tries count
                    // down and systemd-boot falls back to the previous slot.
                    say!(
                        "{} after {}s on slot {slot} (on trial): rebooting to count down its tries",
                        if ssh_ok {
                            "gateway not healthy"
                        } else {
                            "riceguard ssh not listening"
                        },
                        health_deadline.as_secs()
                    );
                    halt = Some(os::Halt::Reboot);
                } else {
                    say!(
                        "{} after {}s; boot left unmarked (it counts down)",
                        if ssh_ok {
                            "gateway not healthy"
                        } else {
                            "riceguard ssh not listening"
                        },
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
        let mut wait = Duration::from_millis(if held_gateway.is_some() { 100 } else { 500 });
        if let Some(t) = next_start {
            wait = wait.min(t.saturating_duration_since(now));
        }
        wait_signal(&mut sfd, wait, &mut halt);
        reap(&mut sup);
        publish_figures(&sup, slot, marked, &mut published);
        if let Some(h) = halt {
            shutdown(&mut sup, &mut sfd, h, &mut dog);
        }
    }
}

/// Sleep until a signal or `wait` passes; note a requested halt.
pub(super) fn wait_signal(sfd: &mut Option<SignalFd>, wait: Duration, halt: &mut Option<os::Halt>) {
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
pub(super) fn reap(sup: &mut Supervisor) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(st) => {
                sup.on_exit(st, Instant::now());
            }
        }
    }
}

pub(super) fn shutdown(
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
    // The gateway is stopped (its batched events written): no handshake is stamped after
    // this, and the next boot's record says this one ended cleanly.
    clock_floor::save_at_halt();
    crate::perm::event_log::say(
        Path::new(PERM),
        "init",
        &format!(
            "{} {}",
            crate::perm::event_log::SHUTDOWN,
            if how == os::Halt::Reboot {
                "reboot"
            } else {
                "poweroff"
            }
        ),
    );
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

/// The firewall of the configuration the gateway will run, installed before the network
/// comes up (the daemon refines it once the ports have addresses). Nothing to load or an
/// error: said, and the daemon tries again (and forwards nothing without it).
fn boot_firewall(conf: &str) {
    let text = match std::fs::read_to_string(conf) {
        Ok(t) => t,
        Err(e) => {
            say!("firewall: {conf}: {e}");
            return;
        }
    };
    let cfg = match crate::core::ini::parse(conf, &text) {
        Ok(c) => c.running(),
        Err(e) => {
            say!("firewall: {e}");
            return;
        }
    };
    match crate::driver::appliance::firewall::install_at_boot(&cfg) {
        Ok(crate::driver::appliance::firewall::Outcome::Off) => {
            say!("firewall: off (Firewall = off)")
        }
        Ok(_) => say!(
            "firewall: table inet {} in place",
            crate::core::firewall::TABLE
        ),
        Err(e) => say!("firewall: {e}"),
    }
}
