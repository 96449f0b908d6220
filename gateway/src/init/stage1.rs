//! Stage 1, from the initramfs: mount /dev, /proc, /sys, /run, load the board's modules,
//! find `root-<slot>` by GPT label, mount its squashfs, empty the initramfs and switch
//! into the root (then exec its own `/sbin/init --stage2`).

use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;

use crate::slots;
use crate::sys::os;

use super::common::{mkdir, read_board, read_cmdline, NEWROOT};
use super::modules::load_modules;

pub(super) fn mount_basics() {
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

pub(super) fn stage1() -> String {
    mount_basics();
    say!("initramfs: riceguard {}", env!("CARGO_PKG_VERSION"));
    let board = read_board();
    load_modules(&board.modules);
    mount_efivars();
    let cmd = read_cmdline();
    let slot = cmd.slot.unwrap_or_else(|| {
        say!("no riceguard.slot= on the kernel command line; using slot a");
        'a'
    });
    let label = format!("root-{slot}");
    // virtio/NVMe/USB probing may finish after the module loads return.
    let deadline = Instant::now() + Duration::from_secs(15);
    // Only the boot disk's root counts (a USB stick with an image is not one): see slots.rs.
    let dev = loop {
        match slots::locate(&label, slots::Ambiguous::PreferFixed) {
            Ok(f) => {
                say!("{label}: {} ({})", f.dev, f.how);
                break f.dev;
            }
            Err(e) if Instant::now() > deadline => {
                // Last try without the boot loader's word (its disk never showed its
                // GUID): the label decides, preferring a fixed disk, and it is said.
                let sys = slots::Sys {
                    loader_var: PathBuf::new(),
                    ..slots::Sys::default()
                };
                match slots::locate_in(&sys, &label, slots::Ambiguous::PreferFixed) {
                    Ok(f) => {
                        say!("{e}; after 15 s: {label}: {} ({})", f.dev, f.how);
                        break f.dev;
                    }
                    Err(e2) => {
                        return format!("{e2} within 15s (is the storage driver in MODULES?)")
                    }
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
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
    let _ = std::fs::write(
        format!("{NEWROOT}{}", crate::run::ROOT_DEVICE),
        format!("{dev}\n"),
    );
    empty_initramfs();
    if let Err(e) = os::switch_root(NEWROOT) {
        return format!("switching to the root on {dev}: {e}");
    }
    let e = Command::new("/sbin/init").arg("--stage2").exec();
    format!("exec /sbin/init on {dev}: {e}")
}

/// Mount efivarfs read-only (the `efivarfs` module is in the board's MODULES where it is
/// not built in) so the boot loader's `LoaderDevicePartUUID` names the boot disk. Not
/// booted by UEFI, or no efivarfs: nothing (the boot disk is then found otherwise).
fn mount_efivars() {
    let dir = "/sys/firmware/efi/efivars";
    if !Path::new("/sys/firmware/efi").exists() {
        return;
    }
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY;
    if let Err(e) = os::mount("efivarfs", dir, "efivarfs", nodev, None) {
        say!("efivarfs: {e}; the boot disk is not known from the boot loader");
    }
}

/// Delete the initramfs's files (it is RAM that nothing will use again), staying on its
/// filesystem so mounts below it (the new root) are not touched.
pub(super) fn empty_initramfs() {
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
