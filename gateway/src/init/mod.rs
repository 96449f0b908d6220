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
//!
//! One file per concern, as gokrazy splits its init: `stage1.rs` (mounts, switch root),
//! `modules.rs`, `stage2.rs` (boot sequence and the supervision loop), `perm.rs` (perm,
//! the configuration and its fallbacks, failsafe prompt, commit-confirm guard),
//! `hugepages.rs`, `network.rs` (lo, uplink by static address or DHCP, USO report,
//! RPS/XPS), `watch.rs` (health probes, hardware watchdog, marking the boot good),
//! `supervise.rs` (services, restarts with backoff, output relay), `health.rs` (the pure
//! health policy), `board.rs`, `cmdline.rs`, `sysctl.rs` (their file formats).

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
use nix::unistd::Pid;

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
use crate::image_paths::{BOARD_CONF as BOARD_FILE, DEFAULT_CONFIG};
use crate::perm::{CONFIG, DIR as PERM};
const ESP_MNT: &str = "/run/esp";
const BIN: &str = "/usr/bin/riceguard";
/// Console services are named `console-TTY` (one per terminal of the board).
const CONSOLE_SERVICE: &str = "console";
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

// One file per concern (declared after `say!`, which they use).
mod clock;
mod hugepages;
mod modules;
mod network;
mod perm;
mod stage1;
mod stage2;
mod watch;

use self::hugepages::*;
use self::modules::*;
use self::network::*;
use self::perm::*;
use self::stage1::*;
use self::stage2::*;
use self::watch::*;

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
