//! Threads that never take a signal: started with every signal blocked (a thread inherits
//! its creator's mask), so signals reach the threads that wait for them (the daemon's
//! `sigwait`, init's signalfd) and a SIGTERM is never delivered to, say, the log writer,
//! where its default action would end the process.

use std::thread::JoinHandle;

/// Spawn `f` on a thread named `name` with every signal blocked; the caller's mask is
/// restored before returning.
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    let mut old = SigSet::empty();
    let blocked = pthread_sigmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    )
    .is_ok();
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    spawned
}

#[cfg(test)]
mod tests {
    /// The new thread has every signal blocked; the caller's mask is as before.
    #[test]
    fn the_thread_blocks_every_signal_and_the_caller_keeps_its_mask() {
        use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
        let mine = || {
            let mut m = SigSet::empty();
            pthread_sigmask(SigmaskHow::SIG_BLOCK, None, Some(&mut m)).unwrap();
            m
        };
        let before = mine();
        let theirs = super::spawn("rg-test-quiet", move || mine().contains(Signal::SIGTERM))
            .unwrap()
            .join()
            .unwrap();
        assert!(theirs);
        assert_eq!(mine(), before);
    }
}
