//! The gateway's health as init sees it (the UAPI answers, worker heartbeats move; the
//! policy is `health.rs`), the hardware watchdog, marking the boot good, and init's
//! figures for the metrics endpoint (`run::services`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;

use crate::slots;
use crate::sys::os;

use super::board::Board;
use super::common::{mkdir, ESP_MNT};
use super::health;
use super::supervise::{State, Supervisor};
use crate::run::services::{write_figures, InitFigures, ServiceState};

/// One look at the gateway for the health watch: its UAPI answer and the worker
/// heartbeats of its status file.
pub(super) fn probe_gateway(ifname: &str) -> health::Probe {
    let status = crate::run::status_file(ifname);
    let beats = match std::fs::read_to_string(&status) {
        Ok(t) => crate::run::status::parse_heartbeats(&t)
            .ok_or_else(|| format!("no heartbeat line in {}", status.display())),
        Err(e) => Err(format!("{}: {e}", status.display())),
    };
    health::Probe {
        uapi: uapi_answers(ifname),
        beats,
    }
}

/// Does the gateway answer `get=1` on its UAPI socket with `errno=0`? Bounded: 1 s.
pub(super) fn uapi_answers(ifname: &str) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let mut s = UnixStream::connect(crate::run::uapi_socket(ifname))
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
pub(super) fn slot_on_trial(slot: char) -> bool {
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

pub(super) fn mark_boot_good(slot: char) {
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
        if l.starts_with("FALLBACK") {
            crate::perm::event_log::say(Path::new(crate::perm::DIR), "init", &l);
        }
        say!("{l}");
    }
    match slots::mark_good(Path::new(ESP_MNT), slot) {
        Ok(slots::Marked::Renamed { from, to }) => {
            crate::perm::event_log::say(
                Path::new(crate::perm::DIR),
                "init",
                &format!("update: slot {slot} passed its trial: marked good ({from} -> {to})"),
            );
            say!("boot marked good ({from} -> {to})")
        }
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
pub(super) struct Watchdog {
    f: Option<File>,
    every: Duration,
    last: Instant,
}

impl Watchdog {
    pub(super) fn open(board: &Board) -> Watchdog {
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

    pub(super) fn pet(&mut self, now: Instant) {
        if let Some(f) = self.f.as_mut() {
            if now.duration_since(self.last) >= self.every {
                let _ = f.write_all(b"\0");
                self.last = now;
            }
        }
    }
}

/// Write init's figures (slot, boot marked good, each service's starts) to the run
/// directory for the daemon's metrics, when they changed since `last`.
pub(super) fn publish_figures(sup: &Supervisor, slot: char, marked: bool, last: &mut String) {
    let f = InitFigures {
        slot: Some(slot),
        marked,
        services: sup
            .services
            .iter()
            .map(|s| ServiceState {
                name: s.spec.name.clone(),
                starts: u64::from(s.starts),
                running: matches!(s.state, State::Running(_)),
            })
            .collect(),
    };
    write_figures(&crate::run::run_dir(), &f, last);
}
