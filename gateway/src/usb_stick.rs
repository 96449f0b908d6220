//! The USB stick's I/O for `export configuration to usb` and `import configuration from
//! usb`: sysfs and the first sectors read into `core::usb_stick`'s [`Disk`] list ([`scan`],
//! over a sysfs-like root so tests build a fake tree), the one stick it chose mounted on a
//! private directory under `/run` (vfat, `nosuid,nodev,noexec`, `iocharset=ascii`: the
//! boards load `nls_ascii` and `nls_cp437` for the ESP already), the export written
//! durably ([`crate::durable`]: temp name, fsync, rename, fsync the directory) or the newest
//! export read (read-only mount, at most `core::age::MAX_ARMOURED` bytes), and unmounted
//! on every path, an unmount failure said. Nothing else on the stick is touched: a file of
//! the export's name already there is not replaced.

use std::io::Read;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::core::usb_stick::{fat_kind, newest_export, plain_file_name};
pub use crate::core::usb_stick::{Disk, Fs, Partition, Stick};

/// Where disks are looked for: the real system's paths, or a fake tree in tests.
#[derive(Debug, Clone)]
pub struct Root {
    /// `/sys/block`: one entry per disk (a link into `/sys/devices`).
    pub sys_block: PathBuf,
    /// `/sys/bus/usb`: absent when the kernel has no USB (the qemu-* boards' kernels).
    pub sys_bus_usb: PathBuf,
    /// `/dev`: device nodes, read for their first sector (regular files in tests).
    pub dev: PathBuf,
}

impl Default for Root {
    fn default() -> Root {
        Root {
            sys_block: "/sys/block".into(),
            sys_bus_usb: "/sys/bus/usb".into(),
            dev: "/dev".into(),
        }
    }
}

/// What the first 512 bytes of `path` hold.
fn first_sector(path: &Path) -> Fs {
    let mut buf = [0u8; 512];
    match std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut buf)) {
        Ok(()) => fat_kind(&buf).map_or(Fs::Other, Fs::Fat),
        Err(_) => Fs::Unreadable,
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Every SCSI disk (`sd*`) under `root`, by kernel name. Only removable USB disks have
/// their sectors read.
pub fn scan(root: &Root) -> Vec<Disk> {
    let Ok(rd) = std::fs::read_dir(&root.sys_block) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sd"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let dir = root.sys_block.join(&name);
            let real = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
            let removable = read_trim(&dir.join("removable")).as_deref() == Some("1");
            let usb = real
                .components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with("usb"));
            let candidate = removable && usb;
            let mut parts: Vec<Partition> = std::fs::read_dir(&real)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter(|e| e.path().join("partition").is_file())
                        .map(|e| {
                            let pname = e.file_name().to_string_lossy().into_owned();
                            let label = read_trim(&e.path().join("uevent")).and_then(|ue| {
                                crate::slots::uevent_partname(&ue).map(str::to_string)
                            });
                            let fs = if candidate {
                                first_sector(&root.dev.join(&pname))
                            } else {
                                Fs::Unreadable
                            };
                            Partition {
                                name: pname,
                                label,
                                fs,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            parts.sort_by(|a, b| a.name.cmp(&b.name));
            let whole = if candidate && parts.is_empty() {
                first_sector(&root.dev.join(&name))
            } else {
                Fs::Unreadable
            };
            Disk {
                name,
                removable,
                usb,
                whole,
                parts,
            }
        })
        .collect()
}

/// The one stick to use under `root`, or why none is.
pub fn find(root: &Root) -> Result<Stick, String> {
    let disks = scan(root);
    if disks.is_empty() && !root.sys_bus_usb.exists() {
        return Err(
            "this board has no USB (its kernel has no USB bus): no USB stick can be attached"
                .into(),
        );
    }
    crate::core::usb_stick::choose(&disks)
}

/// `dev` mounted on a fresh private directory under `base` while `f` runs, unmounted
/// after it whatever it returned; an unmount failure is part of the error.
fn with_mounted<T>(
    dev: &Path,
    base: &Path,
    read_only: bool,
    f: impl FnOnce(&Path) -> Result<T, String>,
) -> Result<T, String> {
    let dir = base.join(format!("usb.{}", std::process::id()));
    // A directory left by a console that died while mounted: unmount and reuse it.
    if dir.exists() {
        let _ = crate::sys::os::umount(&dir.to_string_lossy());
        let _ = std::fs::remove_dir(&dir);
    }
    std::fs::create_dir_all(base).map_err(|e| format!("{}: {e}", base.display()))?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make the mount point {}: {e}", dir.display()))?;
    }
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    let target = dir.to_string_lossy().into_owned();
    if let Err(e) = crate::sys::os::mount(
        &dev.to_string_lossy(),
        &target,
        "vfat",
        flags,
        Some("iocharset=ascii,umask=0077"),
    ) {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("cannot mount {} (vfat): {e}", dev.display()));
    }
    let r = f(&dir);
    let un = crate::sys::os::umount(&target);
    let _ = std::fs::remove_dir(&dir);
    match (r, un) {
        (Ok(v), Ok(())) => Ok(v),
        (Ok(_), Err(e)) => Err(format!(
            "could not unmount {} ({e}): do not pull the stick yet, `sync` is not certain",
            dev.display()
        )),
        (Err(e), Ok(())) => Err(format!("{e} (the stick is unmounted)")),
        (Err(e), Err(u)) => Err(format!("{e}; and the stick could not be unmounted: {u}")),
    }
}

/// Write `text` as `name` on the FAT file system `dev`, mounted under `base`: a new file
/// only (an existing one of that name is left alone and refused).
pub fn write_on(dev: &Path, base: &Path, name: &str, text: &str) -> Result<(), String> {
    let name = plain_file_name(name)?;
    with_mounted(dev, base, false, |dir| write_in(dir, name, text))
}

/// [`write_on`]'s work in the mounted directory `dir`.
pub fn write_in(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let name = plain_file_name(name)?;
    let path = dir.join(name);
    if path.exists() {
        return Err(format!("{name} is already on the stick: not replaced"));
    }
    crate::durable::write(&path, text.as_bytes(), crate::durable::SECRET)
        .map_err(|e| format!("writing {name}: {e}"))
}

/// The export file `file` (a plain name) or else the newest `riceguard-*.age` in the top
/// folder of `dev`, mounted read-only under `base`: its name and text.
pub fn read_from(dev: &Path, base: &Path, file: Option<&str>) -> Result<(String, String), String> {
    let file = file.map(plain_file_name).transpose()?;
    with_mounted(dev, base, true, |dir| read_in(dir, file))
}

/// [`read_from`]'s work in the mounted directory `dir`.
pub fn read_in(dir: &Path, file: Option<&str>) -> Result<(String, String), String> {
    let name = match file {
        Some(f) => plain_file_name(f)?.to_string(),
        None => {
            let entries: Vec<(String, Option<i64>)> = std::fs::read_dir(dir)
                .map_err(|e| format!("cannot list the stick: {e}"))?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| {
                    let mtime = e.metadata().ok().map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        m.mtime()
                    });
                    (e.file_name().to_string_lossy().into_owned(), mtime)
                })
                .collect();
            match newest_export(&entries) {
                Some(n) => n.to_string(),
                None => {
                    return Err(format!(
                    "no riceguard-*.age file in the stick's top folder ({} other file(s) there)",
                    entries.len()
                ))
                }
            }
        }
    };
    read_bounded(&dir.join(&name)).map(|t| (name, t))
}

/// A file's text, refused when larger than any export or not UTF-8.
fn read_bounded(path: &Path) -> Result<String, String> {
    let shown = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let f = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    if !f.metadata().map_err(|e| format!("{shown}: {e}"))?.is_file() {
        return Err(format!("{shown}: not a file"));
    }
    let max = crate::core::age::MAX_ARMOURED;
    let mut buf = Vec::new();
    f.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{shown}: {e}"))?;
    if buf.len() > max {
        return Err(format!(
            "{shown} is larger than any export ({max} bytes at most)"
        ));
    }
    String::from_utf8(buf).map_err(|_| format!("{shown} is not text: not an export"))
}

/// The mount base of the appliance ([`crate::run`]'s).
fn mount_base() -> PathBuf {
    crate::run::usb_mount_base()
}

/// `export configuration to usb`: find the stick, write `text` as `name`. Says what was
/// written where.
pub fn export(name: &str, text: &str) -> Result<String, String> {
    let stick = find(&Root::default())?;
    let dev = Root::default().dev.join(&stick.dev);
    write_on(&dev, &mount_base(), name, text).map_err(|e| format!("USB stick {stick}: {e}"))?;
    Ok(format!(
        "wrote {name} to the USB stick {stick}: synced and unmounted, it may be pulled"
    ))
}

/// `import configuration from usb [FILE]`: find the stick, read the export. The file's
/// name, its text, and the stick.
pub fn import(file: Option<&str>) -> Result<(String, String, String), String> {
    let stick = find(&Root::default())?;
    let dev = Root::default().dev.join(&stick.dev);
    let (name, text) =
        read_from(&dev, &mount_base(), file).map_err(|e| format!("USB stick {stick}: {e}"))?;
    Ok((name, text, stick.to_string()))
}

#[cfg(test)]
mod tests;
