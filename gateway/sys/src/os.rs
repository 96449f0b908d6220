//! Small OS operations init needs that `std` lacks: mounting, module loading, the root
//! switch, sessions for supervised children, reboot. Thin wrappers, one per kernel call;
//! the policy (what to mount where, in which order) lives in the gateway's `init/`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::mount::{MntFlags, MsFlags};

/// `mount(2)`; `data` is the filesystem's option string.
pub fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> io::Result<()> {
    nix::mount::mount(Some(src), target, Some(fstype), flags, data).map_err(io::Error::from)
}

/// Move an existing mount (`mount --move`).
pub fn mount_move(from: &str, to: &str) -> io::Result<()> {
    nix::mount::mount(Some(from), to, None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(io::Error::from)
}

pub fn umount(target: &str) -> io::Result<()> {
    nix::mount::umount2(target, MntFlags::empty()).map_err(io::Error::from)
}

/// Remount read-only so the filesystem is clean before a reboot (fails if files are open
/// for writing; then `sync` has still flushed it).
pub fn remount_ro(target: &str) -> io::Result<()> {
    nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Load a kernel module from an (uncompressed) `.ko` file with `finit_module(2)`.
/// `EEXIST` (already loaded or built in) counts as success.
pub fn load_module(path: &Path, params: &str) -> io::Result<()> {
    let f = File::open(path)?;
    let p = CString::new(params).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: finit_module reads the open fd and a NUL-terminated string that both outlive
    // the call; it writes no user memory.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), p.as_ptr(), 0) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        Ok(())
    } else {
        Err(e)
    }
}

/// The root switch after `newroot` is mounted: make it `/` (as `switch_root` does: move
/// the mount over `/`, then chroot into it). The caller has moved /dev, /proc, /sys and
/// /run under `newroot` first and emptied the old initramfs.
pub fn switch_root(newroot: &str) -> io::Result<()> {
    nix::unistd::chdir(newroot).map_err(io::Error::from)?;
    mount_move(".", "/")?;
    nix::unistd::chroot(".").map_err(io::Error::from)?;
    nix::unistd::chdir("/").map_err(io::Error::from)
}

/// Run the child in a new session (own process group, so the supervisor can signal the
/// whole service), optionally with `tty` as its controlling terminal.
pub fn new_session(cmd: &mut Command, controlling_tty: bool) {
    // SAFETY: the closure runs between fork and exec and calls only setsid(2) and
    // ioctl(2), both async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 1) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Make `fd` 0, 1 and 2 of this process (init's console after it opened `/dev/console`).
pub fn set_stdio(f: &File) -> io::Result<()> {
    for target in 0..3 {
        // SAFETY: dup2 on a valid open fd onto 0..2 only replaces this process's standard
        // descriptors; std's handles to them keep working because they refer to the numbers.
        if unsafe { libc::dup2(f.as_raw_fd(), target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// How init ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Halt {
    Reboot,
    PowerOff,
}

/// Reboot or power off now (after the caller synced and unmounted).
pub fn halt(how: Halt) -> io::Error {
    use nix::sys::reboot::{reboot, RebootMode};
    let mode = match how {
        Halt::Reboot => RebootMode::RB_AUTOBOOT,
        Halt::PowerOff => RebootMode::RB_POWER_OFF,
    };
    match reboot(mode) {
        Ok(never) => match never {},
        Err(e) => io::Error::from(e),
    }
}

/// Ctrl-Alt-Del sends SIGINT to init instead of rebooting at once, so shutdown is clean.
pub fn soft_ctrl_alt_del() {
    let _ = nix::sys::reboot::set_cad_enabled(false);
}

pub fn sync() {
    nix::unistd::sync();
}

/// Set a terminal's window size (`TIOCSWINSZ`; the kernel then signals SIGWINCH to its
/// foreground group): an SSH session's pseudo-terminal follows the client's window. nix
/// has no safe wrapper.
pub fn set_window_size(fd: std::os::fd::BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which points at `ws`,
    // alive for the whole call; `fd` is an open descriptor (borrowed for the call).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Is a TCP socket listening on `port` here (IPv6 or IPv4, this network namespace)? Read
/// from `/proc/net/tcp6` and `/proc/net/tcp`: whether `riceguard ssh` listens, for init
/// before it marks a boot good and for `show status`.
pub fn tcp_listening(port: u16) -> bool {
    ["/proc/net/tcp6", "/proc/net/tcp"].iter().any(|f| {
        std::fs::read_to_string(f)
            .is_ok_and(|t| riceguard_core::net::tcp_listen_ports(&t).contains(&port))
    })
}
