//! Process-level OS calls: detaching into the background like wireguard-go does.

use std::io;
use std::os::fd::AsFd;

use nix::unistd::{dup2_stderr, dup2_stdin, dup2_stdout, fork, setsid, ForkResult};

/// Fork into the background. The parent exits with status 0 at once (everything the
/// caller needs to be ready — TUN, UAPI socket — must exist before this call); the
/// child starts a new session and points stdin and stdout at /dev/null, and stderr (the
/// log) at `log_file` or /dev/null — never at the caller's stderr, which may be a pipe
/// the caller reads to EOF (wg-quick's output captured by a script).
pub fn daemonize(log_file: Option<&str>) -> io::Result<()> {
    // SAFETY: called before any thread is spawned (the caller's contract), so the child
    // is a faithful copy with no other thread's locks held.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { .. } => std::process::exit(0),
        ForkResult::Child => {}
    }
    setsid().map_err(io::Error::from)?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    dup2_stdin(&null).map_err(io::Error::from)?;
    dup2_stdout(&null).map_err(io::Error::from)?;
    let log = log_file.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    });
    dup2_stderr(log.as_ref().map_or(null.as_fd(), |f| f.as_fd())).map_err(io::Error::from)?;
    Ok(())
}

/// Run `f` when the process exits normally (return from `main`, `exit`), as C's
/// `atexit`. False if the registration failed (the table is full).
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: atexit only records the pointer; `f` is a safe `extern "C" fn()` with no
    // arguments that lives for the whole program.
    unsafe { libc::atexit(f) == 0 }
}

/// Set the process's file-creation mask, returning the previous one. Process-wide: call
/// it only while no other thread creates files (wireguard-go binds its UAPI socket
/// under umask 0077 the same way).
pub fn umask(mask: u32) -> u32 {
    use nix::sys::stat::Mode;
    nix::sys::stat::umask(Mode::from_bits_truncate(mask as libc::mode_t)).bits() as u32
}

/// Set this process's scheduling niceness (`setpriority(PRIO_PROCESS, 0, nice)`): a
/// management process (`riceguard ssh`) runs behind the data plane. nix has no wrapper.
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours; `0` names
    // the calling process.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, nice) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's peak resident memory so far (`VmHWM` of `/proc/self/status`), in KiB:
/// what an export's scrypt costs on a small board, reported beside it.
pub fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod peak_tests {
    #[test]
    fn peak_rss_grows_with_what_was_touched() {
        let before = super::peak_rss_kib().expect("VmHWM");
        let v = vec![1u8; 32 << 20];
        std::hint::black_box(&v);
        let after = super::peak_rss_kib().expect("VmHWM");
        assert!(after >= before + 16 * 1024, "{before} -> {after} KiB");
    }
}
