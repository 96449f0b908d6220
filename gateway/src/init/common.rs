//! What both stages use: the paths and delays of init, the board file and the kernel
//! command line read with their errors said, and the last resort (`emergency`). Here and
//! not in `mod.rs`, so the stages import it without importing the module that starts
//! them.

use std::time::Duration;

use crate::image_paths::BOARD_CONF as BOARD_FILE;
use crate::sys::os;

use super::board::{self, Board};
use super::cmdline::{self, Cmdline};

pub(super) const NEWROOT: &str = "/newroot";
pub(super) const ESP_MNT: &str = "/run/esp";
pub(super) const BIN: &str = "/usr/bin/riceguard";
/// Console services are named `console-TTY` (one per terminal of the board).
pub(super) const CONSOLE_SERVICE: &str = "console";
/// First delay before a service that exited is started again (gokrazy: 1 s); it doubles
/// up to 60 s while the service keeps failing, so a gateway that fails at once does not
/// flood the serial line (`supervise::Backoff`).
pub(super) const RESTART_DELAY: Duration = Duration::from_secs(1);
/// How long the gateway has to answer on its UAPI socket before this boot is left
/// unmarked (systemd-boot then counts it down and eventually falls back).
pub(super) const HEALTH_DEADLINE: Duration = Duration::from_secs(180);

/// Nothing more can be done: leave the message readable, then reboot so the boot counter
/// goes down and systemd-boot can fall back to the other slot.
pub(super) fn emergency() -> ! {
    say!("rebooting in 10s");
    std::thread::sleep(Duration::from_secs(10));
    os::sync();
    let e = os::halt(os::Halt::Reboot);
    say!("reboot failed: {e}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

pub(super) fn mkdir(p: &str) {
    let _ = std::fs::create_dir_all(p);
}

pub(super) fn read_board() -> Board {
    let text = std::fs::read_to_string(BOARD_FILE).unwrap_or_default();
    let (b, errs) = board::parse(&text);
    for e in errs {
        say!("{e}");
    }
    b
}

pub(super) fn read_cmdline() -> Cmdline {
    let c = cmdline::parse(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default());
    for e in &c.errors {
        say!("kernel command line: {e}");
    }
    c
}
