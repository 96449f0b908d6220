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
//! One file per concern, as gokrazy splits its init: `common.rs` (the paths, delays and
//! helpers both stages use), `stage1.rs` (mounts, switch root),
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

use std::process::ExitCode;

macro_rules! say {
    ($($t:tt)*) => { $crate::logger::console_line(&format!("riceguard-init: {}", format_args!($($t)*))) };
}

// One file per concern (declared after `say!`, which they use).
mod clock_floor;
mod common;
mod hugepages;
mod modules;
mod network;
mod perm;
mod stage1;
mod stage2;
mod watch;

use self::common::emergency;
use self::stage1::stage1;
use self::stage2::stage2;

pub fn main(args: &[String]) -> ExitCode {
    if std::process::id() != 1 {
        crate::logger::console_line("riceguard init: must run as PID 1 (the image's /init); for a shell, see `riceguard --help`");
        return ExitCode::from(1);
    }
    if args.iter().any(|a| a == "--stage2") {
        // Its console lines go to syslog once the saved configuration names a collector
        // (kept until then; `supervise::SyslogFollow`).
        crate::logger::console_to_syslog();
        stage2();
    } else {
        let e = stage1();
        say!("FATAL: {e}");
        emergency();
    }
}
