//! Durable file changes, the one implementation for every writer on the appliance
//! (console saves and history on `perm`, init's first-boot key and `/run` copies, the
//! updater's boot entries on the ESP): after a power cut a reader sees the whole old file
//! or the whole new one, never a torn or missing one, and a change that returned `Ok`
//! stays done.
//!
//! Replacing a file: create a temporary file next to it (same filesystem, so the rename is
//! atomic) with its final mode from the start (`O_CREAT|O_EXCL` with `mode`: a secret is
//! never readable by others, not even for an instant, and a stale temporary left by a
//! crash is removed first rather than reused with whatever mode it had), write, fsync,
//! rename over the target, fsync the directory (the rename itself is durable). On any
//! failure the temporary file is removed. Removing and renaming fsync the directory too,
//! so a deleted marker (a confirmed `commit-confirm`, a removed password) cannot come back
//! after a power cut.
//!
//! One writer per target is assumed (the temporary name is fixed per target). Every step
//! has a hook so tests can fail it (as an I/O error or a crash would) and observe the
//! order.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Mode for files holding secrets (private keys, the console password, configuration).
pub const SECRET: u32 = 0o600;
/// Mode for files anyone on the appliance may read (counters, markers).
pub const PUBLIC: u32 = 0o644;

/// The steps of a change, in order. A hook sees each one before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    CreateTemp,
    /// Half of the data is in the temporary file (a crash here leaves it torn).
    WriteHalf,
    WriteRest,
    SyncTemp,
    Rename,
    /// Removing a file ([`remove_with`]).
    Remove,
    SyncDir,
}

impl Step {
    /// The steps of [`write_with`], in order.
    pub const WRITE: [Step; 6] = [
        Step::CreateTemp,
        Step::WriteHalf,
        Step::WriteRest,
        Step::SyncTemp,
        Step::Rename,
        Step::SyncDir,
    ];
}

type Hook<'a> = &'a mut dyn FnMut(Step) -> io::Result<()>;

/// The temporary file used while replacing `path`: `.NAME.tmp` in the same directory
/// (never `*.conf`, so systemd-boot does not mistake one on the ESP for an entry).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// fsync a directory, making the names created, renamed or removed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replace `path` with `data` atomically and durably; a new file gets `mode` (narrowed by
/// the umask, never widened) from its creation on.
pub fn write(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    write_with(path, data, mode, &mut |_| Ok(()))
}

/// [`write()`] with a hook called before each [`Step`]; an error from the hook fails the
/// write there (and the temporary file is removed, as for any error).
pub fn write_with(path: &Path, data: &[u8], mode: u32, hook: Hook<'_>) -> io::Result<()> {
    let tmp = temp_path(path);
    let r = write_steps(path, &tmp, data, mode, hook);
    if r.is_err() {
        // Nothing half-written stays behind (after the rename there is no temp any more).
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn write_steps(path: &Path, tmp: &Path, data: &[u8], mode: u32, hook: Hook<'_>) -> io::Result<()> {
    hook(Step::CreateTemp)?;
    // O_CREAT on an existing file keeps that file's mode: a stale temporary (a crash
    // between create and rename) must not pass its mode on to a secret.
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)?;
    let half = data.len() / 2;
    f.write_all(&data[..half])?;
    hook(Step::WriteHalf)?;
    f.write_all(&data[half..])?;
    hook(Step::WriteRest)?;
    hook(Step::SyncTemp)?;
    f.sync_all()?;
    drop(f);
    hook(Step::Rename)?;
    std::fs::rename(tmp, path)?;
    hook(Step::SyncDir)?;
    sync_dir(&parent(path))
}

/// Remove `path` durably (the directory is fsynced). `Ok(false)`: there was nothing to
/// remove.
pub fn remove(path: &Path) -> io::Result<bool> {
    remove_with(path, &mut |_| Ok(()))
}

/// [`remove()`] with a hook before [`Step::Remove`] and [`Step::SyncDir`].
pub fn remove_with(path: &Path, hook: Hook<'_>) -> io::Result<bool> {
    hook(Step::Remove)?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    hook(Step::SyncDir)?;
    sync_dir(&parent(path))?;
    Ok(true)
}

/// Rename `from` to `to` durably (both directories are fsynced).
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)?;
    let (a, b) = (parent(from), parent(to));
    sync_dir(&b)?;
    if a != b {
        sync_dir(&a)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::os::unix::fs::PermissionsExt;

    fn fail_at(at: Step) -> impl FnMut(Step) -> io::Result<()> {
        move |s| {
            if s == at {
                Err(io::Error::other("simulated failure"))
            } else {
                Ok(())
            }
        }
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn writes_and_replaces_with_the_mode() {
        let d = TempDir::new("durable");
        let p = d.0.join("riceguard.conf");
        write(&p, b"one", SECRET).unwrap();
        write(&p, b"two", SECRET).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!temp_path(&p).exists());
        assert_eq!(mode_of(&p), 0o600);
        let q = d.0.join("boots");
        write(&q, b"1\n", PUBLIC).unwrap();
        assert_eq!(mode_of(&q), 0o644);
        // A bare file name lives in the current directory; the dir fsync uses ".".
        assert_eq!(parent(Path::new("x")), PathBuf::from("."));
    }

    /// The secret is in a file that was 0600 from its creation on, even when a stale
    /// temporary with a wider mode was left by a crash.
    #[test]
    fn temp_file_is_secret_from_creation() {
        let d = TempDir::new("mode");
        let p = d.0.join("riceguard.conf");
        let tmp = temp_path(&p);
        std::fs::write(&tmp, b"stale").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut seen = Vec::new();
        write_with(&p, b"PrivateKey = secret\n", SECRET, &mut |s| {
            if matches!(s, Step::WriteHalf | Step::WriteRest | Step::SyncTemp) {
                seen.push(mode_of(&tmp));
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [0o600; 3]);
        assert_eq!(mode_of(&p), 0o600);
    }

    /// Every step runs, in order, the directory fsync last; removal fsyncs it as well.
    #[test]
    fn directory_is_fsynced_after_rename_and_removal() {
        let d = TempDir::new("dirsync");
        let p = d.0.join("commit-confirm");
        let mut steps = Vec::new();
        write_with(&p, b"123\n", SECRET, &mut |s| {
            steps.push(s);
            Ok(())
        })
        .unwrap();
        assert_eq!(steps, Step::WRITE);
        let mut steps = Vec::new();
        assert!(remove_with(&p, &mut |s| {
            steps.push(s);
            Ok(())
        })
        .unwrap());
        assert_eq!(steps, [Step::Remove, Step::SyncDir]);
        assert!(!p.exists());
        // Nothing to remove: no directory change, nothing to sync.
        let mut steps = Vec::new();
        assert!(!remove_with(&p, &mut |s| {
            steps.push(s);
            Ok(())
        })
        .unwrap());
        assert_eq!(steps, [Step::Remove]);
        // A failed dir fsync is reported, not swallowed.
        write(&p, b"1", SECRET).unwrap();
        assert!(remove_with(&p, &mut fail_at(Step::SyncDir)).is_err());
        // Rename: the file moves, both directories are synced without error.
        let sub = d.0.join("sub");
        std::fs::create_dir(&sub).unwrap();
        write(&p, b"x", SECRET).unwrap();
        rename(&p, &sub.join("y")).unwrap();
        assert_eq!(std::fs::read(sub.join("y")).unwrap(), b"x");
    }

    #[test]
    fn no_leftover_temp_on_failure() {
        for step in Step::WRITE {
            let d = TempDir::new("fail");
            let p = d.0.join("riceguard.conf");
            write(&p, b"old", SECRET).unwrap();
            assert!(write_with(&p, b"new", SECRET, &mut fail_at(step)).is_err());
            assert!(
                leftovers(&d.0).is_empty(),
                "temp left after failing {step:?}"
            );
            let got = std::fs::read(&p).unwrap();
            assert_eq!(got == b"new", step == Step::SyncDir, "{step:?}");
        }
        // A real I/O failure: the target is a non-empty directory, the rename fails.
        let d = TempDir::new("failio");
        let p = d.0.join("target");
        std::fs::create_dir_all(p.join("inside")).unwrap();
        assert!(write(&p, b"data", SECRET).is_err());
        assert!(leftovers(&d.0).is_empty());
        // And a directory that does not exist: nothing created anywhere.
        assert!(write(&d.0.join("nodir/file"), b"x", SECRET).is_err());
    }

    #[test]
    fn failure_at_any_step_leaves_old_or_new_never_torn() {
        let old = b"[Interface]\nListenPort = 1\n".repeat(50);
        let new = b"[Interface]\nListenPort = 2\n".repeat(70);
        for step in Step::WRITE {
            let d = TempDir::new("crash");
            let p = d.0.join("riceguard.conf");
            write(&p, &old, SECRET).unwrap();
            assert!(write_with(&p, &new, SECRET, &mut fail_at(step)).is_err());
            let got = std::fs::read(&p).expect("target must never be missing");
            assert!(got == old || got == new, "torn file after {step:?}");
            assert_eq!(got == new, step == Step::SyncDir, "{step:?}");
            write(&p, &new, SECRET).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), new);
        }
        // First write of a file: nothing or the whole new file.
        for step in Step::WRITE {
            let d = TempDir::new("crash0");
            let p = d.0.join("riceguard.conf");
            let _ = write_with(&p, b"new", SECRET, &mut fail_at(step));
            match std::fs::read(&p) {
                Ok(b) => assert_eq!(b, b"new"),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            }
        }
    }
}
