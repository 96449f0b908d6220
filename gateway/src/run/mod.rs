//! Where the appliance's processes meet at run time: every path under `/run` that one
//! process writes and another reads (init, the daemon, `riceguard dhcp`/`ntp`, the
//! consoles, `riceguard status`), and what is in them: each file's format has one
//! writer and one parser here, so a writer and its readers cannot drift apart.
//!
//! - this file: the paths;
//! - [`status`]: the daemon's status file lines (`heartbeat:`, `reload:`);
//! - [`reload`]: the reload handshake (SIGHUP to the pid in the pid file, then the
//!   `reload:` generation polled until it moves or a deadline passes);
//! - [`lease`]: the DHCP client's lease files and the lines shown from them;
//! - [`peers`]: the daemon's per-peer health file, for `show peers`;
//! - [`clock`]: the clock's files (init's boot record, the NTP client's state and
//!   stamps) and the `clock:` / `ntp:` lines shown from them;
//! - [`services`]: init's figures for the metrics endpoint (slot, boot marked good,
//!   starts of each supervised service).
//!
//! What the boots share on the perm partition is [`crate::perm`]'s, the same way.
//!
//! `RG_RUN_DIR` moves [`run_dir`] for tests on a host (the daemon-side files then land in
//! a test's own directory, never in the host's `/run`).

use std::path::{Path, PathBuf};

pub mod clock;
pub mod lease;
pub mod peers;
pub mod reload;
pub mod services;
pub mod status;

/// The appliance's run-time directory (tmpfs, made by init at boot).
pub const RUN_DIR: &str = "/run/riceguard";
/// The daemon's pid file: the console sends SIGHUP to this pid to reload.
pub const PIDFILE: &str = "/run/riceguard.pid";
/// The status file the daemon writes when run without an interface-named one (the
/// console's default reload answer; `RUN_DIR/IFNAME.status` is the per-interface one).
pub const STATUS_FILE: &str = "/run/riceguard.status";
/// wireguard-go's and wg(8)'s UAPI socket directory, so stock `wg` finds ours.
pub const UAPI_DIR: &str = "/var/run/wireguard";
/// The configuration the daemon runs after a failsafe or fallback boot.
pub const BOOT_CONFIG: &str = "/run/riceguard/boot.conf";
/// Wrong console passwords, counted for every console together.
pub const CONSOLE_FAILURES: &str = "/run/riceguard/console-failures";
/// Where `export configuration to usb` and `import configuration from usb` make their
/// private mount point (`usb.PID`, mode 0700) for the stick.
pub fn usb_mount_base() -> PathBuf {
    run_dir()
}
/// Where an update mounts the ESP it writes.
pub const ESP_UPDATE_MNT: &str = "/run/riceguard/esp-update";
/// Stage 1's note of the root device it mounted, for stage 2.
pub const ROOT_DEVICE: &str = "/run/riceguard-root";

/// [`RUN_DIR`], or `RG_RUN_DIR` when set (tests on a host).
pub fn run_dir() -> PathBuf {
    std::env::var_os("RG_RUN_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(RUN_DIR), PathBuf::from)
}

/// The daemon's status file for interface `ifname`.
pub fn status_file(ifname: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{ifname}.status"))
}

/// The daemon's UAPI socket for interface `ifname`.
pub fn uapi_socket(ifname: &str) -> PathBuf {
    Path::new(UAPI_DIR).join(format!("{ifname}.sock"))
}

/// The log init keeps of supervised service `name`'s output.
pub fn service_log(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{name}.log"))
}
