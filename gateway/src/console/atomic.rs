//! Atomic file replacement for the saved configuration: a reader (or the next boot after
//! a power cut) sees either the whole old file or the whole new one, never a torn or
//! missing file.
//!
//! The recipe: write a temporary file in the same directory (same filesystem, so the
//! rename is atomic), fsync it (data on disk before the name points at it), rename it
//! over the target, fsync the directory (the rename itself is durable). Each step has a
//! hook so tests can simulate a crash between any two steps.
//!
//! One writer at a time is assumed (the console is the only writer of `perm`): the
//! temporary name is fixed per target, and a stale one left by a crash is truncated by
//! the next write.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The steps of an atomic write, in order. A hook sees each one before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    CreateTemp,
    /// Half of the data is in the temporary file (a crash here leaves it torn).
    WriteHalf,
    WriteRest,
    SyncTemp,
    Rename,
    SyncDir,
}

impl Step {
    pub const ALL: [Step; 6] = [
        Step::CreateTemp,
        Step::WriteHalf,
        Step::WriteRest,
        Step::SyncTemp,
        Step::Rename,
        Step::SyncDir,
    ];
}

/// The temporary file used while replacing `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Replace `path` with `data` atomically and durably. Files are created mode 0600:
/// the configuration holds the private key.
pub fn write(path: &Path, data: &[u8]) -> io::Result<()> {
    write_with(path, data, &mut |_| Ok(()))
}

/// [`write()`] with a hook called before each [`Step`]; an error from the hook stops the
/// write there, as a crash would (nothing is cleaned up, so tests see what a crash leaves).
pub fn write_with(
    path: &Path,
    data: &[u8],
    hook: &mut dyn FnMut(Step) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = temp_path(path);
    hook(Step::CreateTemp)?;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let half = data.len() / 2;
    f.write_all(&data[..half])?;
    hook(Step::WriteHalf)?;
    f.write_all(&data[half..])?;
    hook(Step::WriteRest)?;
    hook(Step::SyncTemp)?;
    f.sync_all()?;
    drop(f);
    hook(Step::Rename)?;
    std::fs::rename(&tmp, path)?;
    hook(Step::SyncDir)?;
    File::open(&dir)?.sync_all()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh empty directory under the system temp dir (removed by [`TempDir`]'s drop).
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "riceguard-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("create temp dir");
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn crash_at(at: Step) -> impl FnMut(Step) -> io::Result<()> {
        move |s| {
            if s == at {
                Err(io::Error::other("simulated crash"))
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn writes_and_replaces() {
        let d = TempDir::new("atomic");
        let p = d.0.join("riceguard.conf");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!temp_path(&p).exists());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn crash_at_any_step_leaves_old_or_new_never_torn() {
        let old = b"[Interface]\nListenPort = 1\n".repeat(50);
        let new = b"[Interface]\nListenPort = 2\n".repeat(70);
        for step in Step::ALL {
            let d = TempDir::new("crash");
            let p = d.0.join("riceguard.conf");
            write(&p, &old).unwrap();
            assert!(write_with(&p, &new, &mut crash_at(step)).is_err());
            let got = std::fs::read(&p).expect("target must never be missing");
            assert!(
                got == old || got == new,
                "torn file after crash at {step:?}"
            );
            // Before the rename the old file must still be there; after it, the new one.
            let expect_new = matches!(step, Step::SyncDir);
            assert_eq!(got == new, expect_new, "crash at {step:?}");
            // Recovery: the next write succeeds over whatever the crash left.
            write(&p, &new).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), new);
        }
    }

    #[test]
    fn crash_on_first_write_leaves_nothing_or_new() {
        for step in Step::ALL {
            let d = TempDir::new("crash0");
            let p = d.0.join("riceguard.conf");
            let _ = write_with(&p, b"new", &mut crash_at(step));
            match std::fs::read(&p) {
                Ok(b) => assert_eq!(b, b"new"),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            }
        }
    }
}
