//! A/B updates on the device: `riceguard update SOURCE` installs a signed bundle
//! (`core::bundle`) into the slot that is not running, `riceguard rollback-slot` makes
//! the other slot the default again. Owns the systemd-boot entries of the two slots.
//!
//! Order, so that a power cut at any point leaves a bootable device:
//! 1. read the whole bundle once: signature, board, arch, compatibility, build number
//!    (newer than the running slot's, unless a downgrade is allowed), sizes, sha256 of
//!    every part. Nothing is written before all of that passed.
//! 2. remove the inactive slot's boot entries (it must not be booted half-written);
//! 3. read the bundle again and write the root partition and `slot-X.efi.new` on the ESP,
//!    hashing what is written; fsync; drop the cached pages and read both back, hashing;
//! 4. rename the UKI into place, add `riceguard-X+3.conf` (3 tries) with the sort key that
//!    makes it the default, and only once that entry is on the disk give the running
//!    slot's entry the second sort key; sync. The running slot's entry is never rewritten
//!    while it is the only bootable one: a power cut between the two leaves two bootable
//!    entries (either boots; the new one is on trial), never none.
//!
//! Files on the ESP are changed through [`crate::durable`] (temp, fsync, rename, fsync dir).
//!
//! systemd-boot (no `default` line in loader.conf) boots the first entry in sort order;
//! on U-Boot boards the ESP's `/boot.scr` makes the same choice and counts the same
//! entry files (U-Boot refuses systemd-boot's renames; see `slots::uboot_plan`), so
//! nothing here depends on which of the two booted the device;
//! an entry with no tries left sorts last, so a new slot that never gets marked good
//! (init marks it when the gateway is healthy) falls back to the old one after 3 boots.
//! Block devices and the ESP are reached through [`Platform`], so tests run the whole
//! update against a disk image file and a directory.

pub mod http;

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::core::bundle::{self, BundleError, DeviceInfo, Manifest, HEADER_LEN};
use crate::durable;
use crate::slots::{entry_text, entry_tries, set_sort_key, slot_entries, slot_on_trial};

/// Tries a freshly installed slot gets before systemd-boot gives up on it.
pub const TRIES: u32 = 3;
// The U-Boot boot script (image/uboot/boot.cmd) probes counters up to 3 only: more tries
// would make a fresh entry invisible to it. Raise both together.
const _: () = assert!(TRIES <= crate::slots::UBOOT_MAX_TRIES);
/// Sort keys: the default entry sorts first.
const KEY_DEFAULT: &str = "riceguard-0";
const KEY_OTHER: &str = "riceguard-1";
/// A UKI bigger than this is refused (arm64 UKIs with an uncompressed Image are ~40 MiB).
pub const MAX_UKI: u64 = 256 << 20;
/// The running root's build number (`image/build.sh` writes it; see `core::bundle`).
use crate::image_paths::BUILD as BUILD_FILE;
use crate::image_paths::UPDATE_PUB as PUBLIC_KEY;
use crate::run::ESP_UPDATE_MNT as ESP_MNT;

#[derive(Debug)]
#[non_exhaustive]
pub enum UpdateError {
    /// The bundle was refused; nothing was written.
    Refused(BundleError),
    /// Reading the bundle failed (what, error).
    Source(String, io::Error),
    /// The device could not be read or written (what, error).
    Device(String, io::Error),
    /// The bundle read on the second pass differs from the verified one.
    SourceChanged,
    /// What was written does not read back as it should (bad medium).
    ReadBack(String),
    Setup(String),
}

impl std::fmt::Display for UpdateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(e) => write!(f, "bundle refused, nothing written: {e}"),
            Self::Source(what, e) => write!(f, "reading the bundle ({what}): {e}"),
            Self::Device(what, e) => write!(f, "{what}: {e} (the running slot is untouched)"),
            Self::SourceChanged => write!(
                f,
                "the bundle changed between verification and writing; the new slot was not enabled"
            ),
            Self::ReadBack(what) => write!(
                f,
                "read-back check failed for {what} (bad medium?); the new slot was not enabled"
            ),
            Self::Setup(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for UpdateError {}

impl From<BundleError> for UpdateError {
    fn from(e: BundleError) -> Self {
        Self::Refused(e)
    }
}

/// Part of a file or block device: where a slot's root partition lives.
pub struct Region {
    pub file: File,
    pub offset: u64,
    pub len: u64,
}

/// What the update needs from the machine. The device implementation finds partitions by
/// GPT label and mounts the ESP; tests use a disk image file and a directory.
pub trait Platform {
    fn device_info(&self) -> Result<DeviceInfo, UpdateError>;
    fn verifying_key(&self) -> Result<VerifyingKey, UpdateError>;
    /// `a` or `b`: the slot the running system booted from.
    fn running_slot(&self) -> Result<char, UpdateError>;
    /// The root partition of `slot`, opened read-write.
    fn root_region(&mut self, slot: char) -> Result<Region, UpdateError>;
    /// The ESP's root directory (mounted on demand).
    fn esp_dir(&mut self) -> Result<PathBuf, UpdateError>;
}

/// Where a bundle comes from; opened once to verify and once to write.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Http(http::Url),
}

impl Source {
    pub fn parse(s: &str) -> Result<Self, UpdateError> {
        if s.starts_with("http://") {
            return http::Url::parse(s)
                .map(Source::Http)
                .map_err(UpdateError::Setup);
        }
        if s.contains("://") {
            return Err(UpdateError::Setup(format!(
                "{s}: only http:// URLs and file paths are supported (the signature protects the content)"
            )));
        }
        Ok(Source::File(PathBuf::from(s)))
    }

    /// A reader and, when known, the exact length of the bundle (`None` for block
    /// devices: the bundle ends where its manifest says, the rest is padding).
    fn open(&self) -> Result<(Box<dyn Read>, Option<u64>), UpdateError> {
        match self {
            Source::File(p) => {
                let f =
                    File::open(p).map_err(|e| UpdateError::Source(p.display().to_string(), e))?;
                let md = f
                    .metadata()
                    .map_err(|e| UpdateError::Source(p.display().to_string(), e))?;
                let len = md.is_file().then_some(md.len());
                Ok((Box::new(io::BufReader::with_capacity(1 << 20, f)), len))
            }
            Source::Http(u) => {
                let (r, len) = http::get(u).map_err(|e| UpdateError::Source(u.to_string(), e))?;
                Ok((r, len))
            }
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Http(u) => write!(f, "{u}"),
        }
    }
}

/// The result of a successful install.
#[derive(Debug)]
pub struct Installed {
    pub slot: char,
    pub version: String,
    pub entry: String,
}

fn other(slot: char) -> char {
    if slot == 'a' {
        'b'
    } else {
        'a'
    }
}

/// Read exactly `buf.len()` bytes; a short read is a truncated bundle.
fn read_full(r: &mut dyn Read, buf: &mut [u8], at: u64, want: u64) -> Result<(), UpdateError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(BundleError::Truncated {
                    want,
                    got: at + got as u64,
                }
                .into())
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(UpdateError::Source("read".into(), e)),
        }
    }
    Ok(())
}

/// Read and verify the header; returns its bytes and the manifest.
fn read_header(r: &mut dyn Read, key: &VerifyingKey) -> Result<(Vec<u8>, Manifest), UpdateError> {
    let mut head = vec![0u8; 12];
    read_full(r, &mut head, 0, HEADER_LEN as u64)?;
    let m = bundle::manifest_len(&head)?;
    head.resize(HEADER_LEN + m, 0);
    read_full(r, &mut head[12..], 12, (HEADER_LEN + m) as u64)?;
    let man = bundle::verify_header(&head, key)?;
    Ok((head, man))
}

/// Stream `size` bytes from `r` to `out` (if any) and return their sha256.
fn copy_hash(
    r: &mut dyn Read,
    mut out: Option<&mut dyn Write>,
    size: u64,
    at: u64,
    total: u64,
) -> Result<[u8; 32], UpdateError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        read_full(r, &mut buf[..n], at + (size - left), total)?;
        h.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n])
                .map_err(|e| UpdateError::Device("writing".into(), e))?;
        }
        left -= n as u64;
    }
    Ok(h.finalize().into())
}

/// Verify a bundle completely without writing anything: signature, policy, sizes, hashes.
pub fn verify(
    src: &Source,
    key: &VerifyingKey,
    dev: &DeviceInfo,
    root_capacity: u64,
    allow_downgrade: bool,
) -> Result<(Vec<u8>, Manifest), UpdateError> {
    let (mut r, len) = src.open()?;
    let (head, man) = read_header(&mut *r, key)?;
    bundle::check_policy(
        &man,
        dev,
        &[
            ("root", root_capacity),
            ("uki-a", MAX_UKI),
            ("uki-b", MAX_UKI),
        ],
        allow_downgrade,
    )?;
    let total = head.len() as u64 + man.body_len();
    if let Some(len) = len {
        if len < total {
            return Err(BundleError::Truncated {
                want: total,
                got: len,
            }
            .into());
        }
        if len > total {
            return Err(BundleError::TrailingData.into());
        }
    }
    let mut at = head.len() as u64;
    for p in &man.parts {
        let h = copy_hash(&mut *r, None, p.size, at, total)?;
        if h != p.sha256 {
            return Err(BundleError::HashMismatch {
                part: p.name.clone(),
            }
            .into());
        }
        at += p.size;
    }
    if len.is_none() && matches!(src, Source::Http(_)) {
        let mut one = [0u8; 1];
        if matches!(r.read(&mut one), Ok(n) if n > 0) {
            return Err(BundleError::TrailingData.into());
        }
    }
    Ok((head, man))
}

fn dev_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> UpdateError {
    let w = what.into();
    move |e| UpdateError::Device(w, e)
}

/// Drop cached pages so the read-back comes from the medium.
fn drop_cache(f: &File) {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    let _ = posix_fadvise(f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

fn hash_file_range(f: &mut File, offset: u64, size: u64) -> io::Result<[u8; 32]> {
    f.seek(SeekFrom::Start(offset))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(h.finalize().into())
}

/// `build N` of a manifest, for log lines.
fn build_str(b: Option<u64>) -> String {
    b.map_or_else(|| "no build number".to_string(), |b| format!("build {b}"))
}

/// The running slot's build number from the text of [`BUILD_FILE`]: `Ok(0)` when the file
/// does not exist (a root made before build numbers), `Err` when it is unreadable.
pub fn parse_build_file(text: io::Result<String>) -> Result<u64, String> {
    match text {
        Ok(t) => t
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{BUILD_FILE} holds no build number")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("{BUILD_FILE}: {e}")),
    }
}

/// Install `src` into the inactive slot. `log` gets one line per step.
/// Install `src` into the inactive slot. `allow_downgrade` skips the build-number check
/// (the user asked for an older or equal build). `log` gets one line per step.
pub fn install(
    p: &mut dyn Platform,
    src: &Source,
    allow_downgrade: bool,
    log: &mut dyn FnMut(&str),
) -> Result<Installed, UpdateError> {
    let key = p.verifying_key()?;
    let dev = p.device_info()?;
    let running = p.running_slot()?;
    let target = other(running);
    let mut region = p.root_region(target)?;
    log(&format!(
        "running slot {running}; installing into slot {target} ({} byte root partition) from {src}",
        region.len
    ));
    // 1. Verify everything before writing anything.
    let (head, man) = verify(src, &key, &dev, region.len, allow_downgrade)?;
    let newer = matches!((man.build, dev.build), (Some(b), Some(r)) if b > r);
    if !newer {
        log(&format!(
            "DOWNGRADE allowed by the user: bundle {} ({}) over the running slot's {}",
            man.version,
            build_str(man.build),
            build_str(dev.build)
        ));
    }
    log(&format!(
        "verified {} ({}) {} for {} ({}): signature, board, arch, compat {}..={}, build, sizes, sha256 of {}",
        man.version,
        build_str(man.build),
        bundle::hex(&man.part("root").map(|p| p.sha256).unwrap_or_default()[..4]),
        man.board,
        man.arch,
        man.min_compat,
        man.compat,
        man.parts
            .iter()
            .map(|p| format!("{} ({} bytes)", p.name, p.size))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // 2. The target slot is not bootable while it is being written.
    let esp = p.esp_dir()?;
    let entries = esp.join("loader/entries");
    for n in slot_entries(&esp, target).map_err(dev_err("listing ESP entries"))? {
        durable::remove(&entries.join(&n)).map_err(dev_err(format!("removing entry {n}")))?;
        log(&format!("removed old entry {n}"));
    }
    crate::sys::os::sync();
    // 3. Second pass: write while hashing.
    let (mut r, _) = src.open()?;
    let mut head2 = vec![0u8; head.len()];
    read_full(&mut *r, &mut head2, 0, head.len() as u64)?;
    if head2 != head {
        return Err(UpdateError::SourceChanged);
    }
    let uki_name = format!("uki-{target}");
    let uki_dir = esp.join("EFI/riceguard");
    std::fs::create_dir_all(&uki_dir).map_err(dev_err("creating EFI/riceguard"))?;
    let uki_new = uki_dir.join(format!("slot-{target}.efi.new"));
    let mut uki_file = File::create(&uki_new).map_err(dev_err("creating the UKI on the ESP"))?;
    let total = head.len() as u64 + man.body_len();
    let mut at = head.len() as u64;
    for part in &man.parts {
        let h = match part.name.as_str() {
            "root" => {
                region
                    .file
                    .seek(SeekFrom::Start(region.offset))
                    .map_err(dev_err("seeking the root partition"))?;
                copy_hash(&mut *r, Some(&mut region.file), part.size, at, total)?
            }
            n if n == uki_name => copy_hash(&mut *r, Some(&mut uki_file), part.size, at, total)?,
            // The other slot's UKI: read through (and check) without writing.
            _ => copy_hash(&mut *r, None, part.size, at, total)?,
        };
        if h != part.sha256 {
            return Err(UpdateError::SourceChanged);
        }
        at += part.size;
        if part.name == "root" || part.name == uki_name {
            log(&format!("wrote {} ({} bytes)", part.name, part.size));
        }
    }
    region
        .file
        .sync_all()
        .map_err(dev_err("fsync of the root partition"))?;
    uki_file.sync_all().map_err(dev_err("fsync of the UKI"))?;
    drop(uki_file);
    // Read back from the medium.
    drop_cache(&region.file);
    let root = man.part("root").ok_or(UpdateError::SourceChanged)?;
    let got = hash_file_range(&mut region.file, region.offset, root.size)
        .map_err(dev_err("reading back the root partition"))?;
    if got != root.sha256 {
        return Err(UpdateError::ReadBack(format!("root-{target}")));
    }
    let uki = man.part(&uki_name).ok_or(UpdateError::SourceChanged)?;
    let mut uf = File::open(&uki_new).map_err(dev_err("reading back the UKI"))?;
    drop_cache(&uf);
    let got = hash_file_range(&mut uf, 0, uki.size).map_err(dev_err("reading back the UKI"))?;
    if got != uki.sha256 {
        return Err(UpdateError::ReadBack(format!("slot-{target}.efi")));
    }
    log("read back: root and UKI match their sha256");
    // 4. Enable: UKI into place, the new entry first in sort order with tries; only then
    // (the new entry is durable) the running slot's entry gets the second sort key.
    durable::rename(&uki_new, &uki_dir.join(format!("slot-{target}.efi")))
        .map_err(dev_err("renaming the UKI"))?;
    let entry = format!("riceguard-{target}+{TRIES}.conf");
    durable::write(
        &entries.join(&entry),
        entry_text(&man.version, target, KEY_DEFAULT).as_bytes(),
        durable::PUBLIC,
    )
    .map_err(dev_err(format!("writing entry {entry}")))?;
    for n in slot_entries(&esp, running).map_err(dev_err("listing ESP entries"))? {
        set_sort_key(&entries.join(&n), KEY_OTHER)
            .map_err(dev_err(format!("updating entry {n}")))?;
    }
    crate::sys::os::sync();
    log(&format!(
        "slot {target} enabled: {entry} ({TRIES} tries), default from the next boot; slot {running} stays as the fallback"
    ));
    Ok(Installed {
        slot: target,
        version: man.version,
        entry,
    })
}

/// Make the other slot the default boot entry again.
pub fn rollback(p: &mut dyn Platform, log: &mut dyn FnMut(&str)) -> Result<char, UpdateError> {
    let running = p.running_slot()?;
    let target = other(running);
    let esp = p.esp_dir()?;
    let entries = esp.join("loader/entries");
    let theirs = slot_entries(&esp, target).map_err(dev_err("listing ESP entries"))?;
    let Some(n) = theirs.first() else {
        return Err(UpdateError::Setup(format!(
            "slot {target} has no boot entry (never installed, or its update did not finish): nothing to roll back to"
        )));
    };
    let mut name = n.clone();
    // A slot whose tries are used up would sort last anyway: give it one more try.
    if entry_tries(&name).map(|(left, _)| left) == Some(0) {
        let fresh = format!("riceguard-{target}+1.conf");
        durable::rename(&entries.join(&name), &entries.join(&fresh))
            .map_err(dev_err("renaming entry"))?;
        log(&format!("{name} had no tries left: renamed to {fresh}"));
        name = fresh;
    }
    set_sort_key(&entries.join(&name), KEY_DEFAULT).map_err(dev_err("updating entry"))?;
    for n in slot_entries(&esp, running).map_err(dev_err("listing ESP entries"))? {
        set_sort_key(&entries.join(&n), KEY_OTHER).map_err(dev_err("updating entry"))?;
    }
    crate::sys::os::sync();
    log(&format!(
        "slot {target} ({name}) is the default from the next boot; slot {running} stays as the fallback"
    ));
    Ok(target)
}

/// Lines for the console at boot: which entry booted, whether it is on trial, and whether
/// this boot is a fallback because the other slot used up its tries.
pub fn boot_report(esp: &Path, slot: char) -> Vec<String> {
    boot_report_with(
        esp,
        slot,
        &crate::slots::boot_path(Path::new("/sys/firmware/efi/efivars")),
    )
}

/// [`boot_report`] given what started the kernel: the U-Boot boot script or systemd-boot.
/// Both count tries on the same entry files, so marking good is the same rename either
/// way; systemd-boot on U-Boot firmware cannot count (renames refused) and is called out.
pub fn boot_report_with(esp: &Path, slot: char, path: &crate::slots::BootPath) -> Vec<String> {
    use crate::slots::BootPath;
    let mut out = Vec::new();
    match path {
        BootPath::UbootScript { slot: s, entry } => out.push(format!(
            "booted by the U-Boot boot script: slot {s} from {entry} (it counts tries on the ESP itself)"
        )),
        BootPath::SystemdBoot { loader, firmware } => {
            out.push(format!("booted by {loader} on {firmware}"));
            if firmware.contains("U-Boot") && slot_on_trial(esp, slot) {
                out.push(format!(
                    "WARNING: systemd-boot on U-Boot cannot count tries (U-Boot refuses renames) and /boot.scr was not used: a failing slot {slot} would not roll back"
                ));
            }
        }
        BootPath::Unknown => {}
    }
    for n in slot_entries(esp, slot).unwrap_or_default() {
        match entry_tries(&n) {
            Some((left, done)) => out.push(format!(
                "slot {slot} on trial ({n}: {left} tries left, {done} used); marked good once the gateway is healthy"
            )),
            None => out.push(format!("slot {slot} booted from its good entry {n}")),
        }
    }
    let o = other(slot);
    for n in slot_entries(esp, o).unwrap_or_default() {
        if let Some((0, done)) = entry_tries(&n) {
            out.push(format!(
                "FALLBACK: slot {o} ({n}) failed {done} boots without a healthy gateway; running the previous slot {slot}"
            ));
        }
    }
    out
}

/// The device: partitions by GPT label, ESP mounted under /run, key and board from the root.
pub struct DevicePlatform {
    mounted: bool,
}

impl DevicePlatform {
    pub fn new() -> Self {
        Self { mounted: false }
    }
}

impl Default for DevicePlatform {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for DevicePlatform {
    fn drop(&mut self) {
        if self.mounted {
            crate::sys::os::sync();
            let _ = crate::sys::os::umount(ESP_MNT);
        }
    }
}

/// `BOARD=` of the image's board file (`image_paths::BOARD_CONF`).
fn board_name() -> Option<String> {
    let t = std::fs::read_to_string(crate::image_paths::BOARD_CONF).ok()?;
    t.lines()
        .find_map(|l| l.trim().strip_prefix("BOARD="))
        .map(|s| s.trim().trim_matches('"').to_string())
}

/// `riceguard.slot=` of a kernel command line.
pub fn cmdline_slot(cmdline: &str) -> Option<char> {
    cmdline.split_whitespace().find_map(|w| match w {
        "riceguard.slot=a" => Some('a'),
        "riceguard.slot=b" => Some('b'),
        _ => None,
    })
}

impl Platform for DevicePlatform {
    fn device_info(&self) -> Result<DeviceInfo, UpdateError> {
        Ok(DeviceInfo {
            board: board_name().ok_or_else(|| {
                UpdateError::Setup(format!(
                    "no BOARD= in {}: not a RiceGuard image",
                    crate::image_paths::BOARD_CONF
                ))
            })?,
            arch: std::env::consts::ARCH.to_string(),
            compat: bundle::COMPAT,
            build: parse_build_file(std::fs::read_to_string(BUILD_FILE)).ok(),
        })
    }
    fn verifying_key(&self) -> Result<VerifyingKey, UpdateError> {
        let t = std::fs::read_to_string(PUBLIC_KEY).map_err(|e| {
            UpdateError::Setup(format!("{PUBLIC_KEY}: {e}: the image has no update key"))
        })?;
        Ok(bundle::parse_public_key(&t)?)
    }
    fn running_slot(&self) -> Result<char, UpdateError> {
        let c = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        cmdline_slot(&c).ok_or_else(|| {
            UpdateError::Setup(
                "no riceguard.slot= on the kernel command line: not booted from a RiceGuard slot"
                    .into(),
            )
        })
    }
    fn root_region(&mut self, slot: char) -> Result<Region, UpdateError> {
        let label = format!("root-{slot}");
        // The boot disk's slot only: a second disk with an image is never written.
        let dev = crate::slots::locate(&label, crate::slots::Ambiguous::Refuse)
            .map_err(UpdateError::Setup)?
            .dev;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
            .map_err(dev_err(format!("opening {dev}")))?;
        let len = file
            .seek(SeekFrom::End(0))
            .map_err(dev_err(format!("size of {dev}")))?;
        Ok(Region {
            file,
            offset: 0,
            len,
        })
    }
    fn esp_dir(&mut self) -> Result<PathBuf, UpdateError> {
        if !self.mounted {
            let dev = crate::slots::locate("esp", crate::slots::Ambiguous::Refuse)
                .map_err(UpdateError::Setup)?
                .dev;
            let _ = std::fs::create_dir_all(ESP_MNT);
            crate::sys::os::mount(
                &dev,
                ESP_MNT,
                "vfat",
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some("umask=0077"),
            )
            .map_err(dev_err(format!("mounting the ESP {dev}")))?;
            self.mounted = true;
        }
        Ok(PathBuf::from(ESP_MNT))
    }
}

const USAGE: &str = "usage:
  riceguard update SOURCE... [--reboot] [--allow-downgrade]
                                       install a signed bundle (file, block device or
                                       http:// URL) into the inactive slot; with several
                                       sources the first that verifies; --reboot boots it.
                                       A bundle whose build number is not newer than the
                                       running slot's is refused unless --allow-downgrade
  riceguard update --verify SOURCE     check a bundle without writing anything
  riceguard rollback-slot [--reboot]   make the other slot the default boot entry again";

fn reboot() {
    // PID 1 (riceguard init) reboots cleanly on SIGTERM: stops services, syncs, unmounts.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(1),
        nix::sys::signal::Signal::SIGTERM,
    );
}

/// `riceguard update ...` (also for the console: returns what a CLI would exit with).
/// With several sources, the first one that verifies and installs wins (a refused bundle
/// is reported and the next one tried).
pub fn update_main(args: &[String]) -> ExitCode {
    let mut reboot_after = false;
    let mut verify_only = false;
    let mut allow_downgrade = false;
    let mut srcs = Vec::new();
    for a in args {
        match a.as_str() {
            "--reboot" => reboot_after = true,
            "--allow-downgrade" => allow_downgrade = true,
            "--verify" => verify_only = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            s if !s.starts_with('-') => srcs.push(s.to_string()),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if srcs.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let mut log = |s: &str| println!("update: {s}");
    for src in &srcs {
        let r = Source::parse(src).and_then(|s| {
            let mut p = DevicePlatform::new();
            if verify_only {
                let key = p.verifying_key()?;
                let dev = p.device_info()?;
                let slot = other(p.running_slot()?);
                let cap = p.root_region(slot)?.len;
                let (_, m) = verify(&s, &key, &dev, cap, allow_downgrade)?;
                log(&format!(
                    "{src}: {} ({}) for {} verifies: signature, board, arch, compat, build, sizes, sha256",
                    m.version,
                    build_str(m.build),
                    m.board
                ));
                return Ok(None);
            }
            install(&mut p, &s, allow_downgrade, &mut log).map(Some)
        });
        match r {
            Ok(Some(i)) => {
                println!("update: installed {} into slot {}", i.version, i.slot);
                // On the appliance (perm mounted, with its configuration): an event too.
                if Path::new(crate::perm::CONFIG).exists() {
                    crate::perm::event_log::say(
                        Path::new(crate::perm::DIR),
                        "update",
                        &format!(
                            "update: {} installed into slot {} ({}); it runs on trial from the next boot",
                            i.version, i.slot, i.entry
                        ),
                    );
                }
                if reboot_after {
                    println!("update: rebooting into slot {}", i.slot);
                    reboot();
                }
                return ExitCode::SUCCESS;
            }
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => eprintln!("update: {src}: {e}"),
        }
    }
    ExitCode::from(1)
}

/// `riceguard rollback-slot [--reboot]`.
pub fn rollback_main(args: &[String]) -> ExitCode {
    let reboot_after = args.iter().any(|a| a == "--reboot");
    if let Some(a) = args.iter().find(|a| *a != "--reboot") {
        eprintln!("unknown argument {a}\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut p = DevicePlatform::new();
    match rollback(&mut p, &mut |s| println!("rollback-slot: {s}")) {
        Ok(_) => {
            drop(p);
            if reboot_after {
                reboot();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rollback-slot: {e}");
            ExitCode::from(1)
        }
    }
}

/// After a good boot: install the first bundle named in the update-on-boot request
/// (`perm::update`) that verifies, once (the request is renamed to `.done` first, so a
/// bundle that fails can never loop). Runs the update as a child process so its output
/// goes to the console and init keeps supervising.
pub fn boot_request(bin: &str, say: &mut dyn FnMut(&str)) {
    let Some(srcs) = crate::perm::update::take(Path::new(crate::perm::DIR)) else {
        return;
    };
    say(&format!(
        "update requested in {}: {}",
        crate::perm::update::request_path().display(),
        srcs.join(" ")
    ));
    match std::process::Command::new(bin)
        .arg("update")
        .args(&srcs)
        .arg("--reboot")
        .spawn()
    {
        Ok(_) => {}
        Err(e) => say(&format!("could not start the update: {e}")),
    }
}

#[cfg(test)]
mod tests;
