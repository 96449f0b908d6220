//! The A/B slot layout on disk, shared by init (mounting, marking a boot good) and the
//! updater (installing into the other slot, rollback): partitions found by GPT label on
//! the boot disk only, and the systemd-boot entries of the two slots — their names
//! (`riceguard-a.conf`, or `riceguard-a+2-1.conf` while on trial: tries left and done),
//! text and sort keys. Marking a boot good renames the counted entry this slot booted
//! from to the plain name; an entry without a `+` counter is never counted down again.
//!
//! **The boot disk.** Every flashed disk carries the same labels (`esp`, `root-a`,
//! `root-b`, `perm`), so a USB stick with an image on it must not become the root, the
//! perm or the update target. Partitions count only on the boot disk, found in this
//! order ([`boot_disk`]):
//! 1. the disk whose GPT has the partition the boot loader started from: systemd-boot's
//!    `LoaderDevicePartUUID` EFI variable (efivarfs; stage 1 mounts it read-only) against
//!    each disk's GPT partition GUIDs (the flash script makes them unique per disk). While
//!    it names a GUID no disk has, stage 1 waits (its disk may not be probed yet; after
//!    15 s it goes on without the variable, and says so); a GUID on several disks (`dd`
//!    copies) tells nothing;
//! 2. the disk holding the running root (`/` of stage 2 is the slot's squashfs on it), so
//!    perm, the ESP and the update target follow the root stage 1 chose;
//! 3. neither (no variable: a boot loader other than systemd-boot, or QEMU's direct
//!    kernel boot; in stage 1 before the root is mounted): the label's partition when
//!    exactly one disk has it. Several disks: [`Ambiguous::Refuse`] (the update target,
//!    perm, the ESP) says so and takes none; [`Ambiguous::PreferFixed`] (the root in
//!    stage 1, which must boot something) takes the one disk that is neither removable
//!    nor on USB, else the first by kernel name, and says which and why.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::store;

/// systemd-boot's variable: the partition GUID of the ESP it was started from.
pub const LOADER_DEVICE_PART_UUID: &str =
    "/sys/firmware/efi/efivars/LoaderDevicePartUUID-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// Where the boot disk is looked for: the real system's paths, or a fake tree in tests.
#[derive(Debug, Clone)]
pub struct Sys {
    /// `/sys/class/block`: one entry per disk and partition.
    pub class_block: PathBuf,
    /// `/sys/dev/block`: `MAJOR:MINOR` links.
    pub dev_block: PathBuf,
    /// The `LoaderDevicePartUUID` variable file.
    pub loader_var: PathBuf,
    /// `/dev`: disks are read here for their GPT (regular files in tests).
    pub dev: PathBuf,
}

impl Default for Sys {
    fn default() -> Sys {
        Sys {
            class_block: "/sys/class/block".into(),
            dev_block: "/sys/dev/block".into(),
            loader_var: LOADER_DEVICE_PART_UUID.into(),
            dev: "/dev".into(),
        }
    }
}

/// A partition as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Kernel name (`vda2`, `nvme0n1p4`).
    pub name: String,
    /// The whole disk it is on (`vda`).
    pub disk: String,
    /// Its number in the partition table (1-based).
    pub number: u32,
    /// Its GPT name, if any.
    pub label: Option<String>,
}

/// Every partition under `class_block`, by kernel name.
pub fn scan(sys: &Sys) -> Vec<Part> {
    let Ok(rd) = std::fs::read_dir(&sys.class_block) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| {
            let dir = sys.class_block.join(&name);
            let number = std::fs::read_to_string(dir.join("partition"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            // A partition's sysfs directory sits inside its disk's.
            let real = std::fs::canonicalize(&dir).ok()?;
            let disk = real.parent()?.file_name()?.to_string_lossy().into_owned();
            let label = std::fs::read_to_string(dir.join("uevent"))
                .ok()
                .and_then(|ue| uevent_partname(&ue).map(str::to_string));
            Some(Part {
                name,
                disk,
                number,
                label,
            })
        })
        .collect()
}

/// Which disk is the boot disk, and how that is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootDisk {
    pub disk: String,
    pub how: &'static str,
}

/// What to do when the boot disk is unknown and several disks have the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguous {
    /// Take none (the update target, perm, the ESP).
    Refuse,
    /// Take the one fixed disk (not removable, not on USB), else the first by name (the
    /// root in stage 1: something must boot).
    PreferFixed,
}

/// A partition found for a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `/dev/vda2`.
    pub dev: String,
    pub disk: String,
    /// How its disk was chosen, for the log.
    pub how: String,
}

/// The GUID text of 16 bytes in GPT order (the first three fields little-endian).
pub fn guid_text(b: &[u8; 16]) -> String {
    format!(
        "{:02X}{:02X}{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}-{:02X}{:02X}{:02X}{:02X}{:02X}{:02X}",
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15]
    )
}

/// The unique partition GUIDs of a GPT, with partition numbers, from the start of a
/// disk (the header at LBA 1 for 512- or 4096-byte sectors; entries past `disk` are not
/// seen). Anything malformed gives fewer or none; never panics.
pub fn gpt_partition_guids(disk: &[u8]) -> Vec<(u32, String)> {
    let u32_at = |b: &[u8], o: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
    };
    let u64_at = |b: &[u8], o: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
    };
    for sector in [512usize, 4096] {
        let Some(h) = disk.get(sector..sector + 92) else {
            continue;
        };
        if &h[..8] != b"EFI PART" {
            continue;
        }
        let (Some(lba), Some(count), Some(size)) = (u64_at(h, 72), u32_at(h, 80), u32_at(h, 84))
        else {
            return Vec::new();
        };
        let size = size as usize;
        if !(128..=4096).contains(&size) {
            return Vec::new();
        }
        let Some(start) = usize::try_from(lba)
            .ok()
            .and_then(|l| l.checked_mul(sector))
        else {
            return Vec::new();
        };
        return (0..count.min(1024))
            .filter_map(|i| {
                let o = start.checked_add((i as usize).checked_mul(size)?)?;
                let e = disk.get(o..o.checked_add(32)?)?;
                // An unused entry has a zero type GUID.
                if e[..16].iter().all(|&b| b == 0) {
                    return None;
                }
                let g: [u8; 16] = e[16..32].try_into().ok()?;
                Some((i + 1, guid_text(&g)))
            })
            .collect();
    }
    Vec::new()
}

/// The GUID in an efivarfs variable file: 4 attribute bytes, then UTF-16LE text
/// (systemd writes it NUL-terminated).
pub fn efivar_text(bytes: &[u8]) -> Option<String> {
    let units: Vec<u16> = bytes
        .get(4..)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    let s = String::from_utf16(&units).ok()?;
    let s = s.trim();
    (s.len() == 36).then(|| s.to_ascii_uppercase())
}

/// The first bytes of a disk, enough for its GPT (header and 128 entries).
fn read_disk_start(path: &Path) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(64 * 1024).read_to_end(&mut buf);
    }
    buf
}

/// What the boot loader's variable tells.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LoaderSays {
    /// No variable (or not a GUID).
    Nothing,
    /// The one disk whose GPT has that partition GUID.
    Disk(String),
    /// No disk has it (yet: stage 1 may run before the disk is probed).
    Nowhere(String),
    /// Several disks have it (copied with `dd`, not flashed): no help.
    Several,
}

fn loader_disk(sys: &Sys, parts: &[Part]) -> LoaderSays {
    let Some(want) = std::fs::read(&sys.loader_var)
        .ok()
        .and_then(|b| efivar_text(&b))
    else {
        return LoaderSays::Nothing;
    };
    let mut disks: Vec<&str> = parts.iter().map(|p| p.disk.as_str()).collect();
    disks.sort();
    disks.dedup();
    let mut with: Vec<String> = disks
        .into_iter()
        .filter(|d| {
            gpt_partition_guids(&read_disk_start(&sys.dev.join(d)))
                .iter()
                .any(|(n, g)| *g == want && parts.iter().any(|p| p.disk == *d && p.number == *n))
        })
        .map(str::to_string)
        .collect();
    match with.len() {
        0 => LoaderSays::Nowhere(want),
        1 => LoaderSays::Disk(with.remove(0)),
        _ => LoaderSays::Several,
    }
}

/// The disk of the block device `major:minor` when it is a partition.
pub fn disk_of_devno(sys: &Sys, major: u64, minor: u64) -> Option<String> {
    let dir = sys.dev_block.join(format!("{major}:{minor}"));
    std::fs::metadata(dir.join("partition")).ok()?;
    let real = std::fs::canonicalize(&dir).ok()?;
    Some(real.parent()?.file_name()?.to_string_lossy().into_owned())
}

/// The disk holding the running root (`/` on a partition), if it is one.
fn running_root_disk(sys: &Sys) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata("/").ok()?.dev();
    disk_of_devno(sys, nix::sys::stat::major(dev), nix::sys::stat::minor(dev))
}

/// The boot disk, when it can be told (see the module documentation); `running_root`
/// is rule 2's disk. An error while the boot loader names a partition no disk has and
/// there is no running root (stage 1 before its disk appeared: wait rather than guess).
pub fn boot_disk(
    sys: &Sys,
    parts: &[Part],
    running_root: Option<String>,
) -> Result<Option<BootDisk>, String> {
    let loader = loader_disk(sys, parts);
    if let LoaderSays::Disk(disk) = loader {
        return Ok(Some(BootDisk {
            disk,
            how: "it holds the partition the boot loader started from (LoaderDevicePartUUID)",
        }));
    }
    if let Some(disk) = running_root {
        return Ok(Some(BootDisk {
            disk,
            how: "it holds the running root",
        }));
    }
    match loader {
        LoaderSays::Nowhere(g) => Err(format!(
            "no disk has the partition the boot loader started from (LoaderDevicePartUUID {g})"
        )),
        // Duplicated GUIDs say nothing: the label decides as without the variable.
        LoaderSays::Several | LoaderSays::Nothing | LoaderSays::Disk(_) => Ok(None),
    }
}

/// Whether a disk is neither removable nor attached through USB.
fn fixed_disk(sys: &Sys, disk: &str) -> bool {
    let dir = sys.class_block.join(disk);
    let removable = std::fs::read_to_string(dir.join("removable"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    let usb = std::fs::canonicalize(&dir)
        .map(|p| {
            p.components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with("usb"))
        })
        .unwrap_or(false);
    !removable && !usb
}

/// Choose the partition labelled `label` (pure but for reading `sys`'s disk
/// properties): on the boot disk if known, else by `policy` among the disks that have it.
pub fn choose(
    sys: &Sys,
    parts: &[Part],
    label: &str,
    boot: Option<&BootDisk>,
    policy: Ambiguous,
) -> Result<Found, String> {
    let found = |p: &Part, how: String| Found {
        dev: format!("/dev/{}", p.name),
        disk: p.disk.clone(),
        how,
    };
    let with: Vec<&Part> = parts
        .iter()
        .filter(|p| p.label.as_deref() == Some(label))
        .collect();
    if let Some(b) = boot {
        return match with.iter().find(|p| p.disk == b.disk) {
            Some(p) => Ok(found(p, format!("on the boot disk {} ({})", b.disk, b.how))),
            None => Err(format!(
                "no partition labelled {label} on the boot disk {} ({}){}",
                b.disk,
                b.how,
                if with.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; ignoring the one(s) on {}",
                        with.iter()
                            .map(|p| p.disk.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            )),
        };
    }
    let mut disks: Vec<&str> = with.iter().map(|p| p.disk.as_str()).collect();
    disks.sort();
    disks.dedup();
    match (disks.as_slice(), policy) {
        ([], _) => Err(format!("no partition labelled {label}")),
        ([_], _) => {
            // Two partitions with one label on one disk: the first by number.
            let p = with
                .iter()
                .min_by_key(|p| p.number)
                .expect("one disk has it");
            Ok(found(
                p,
                format!("the only disk with {label}: the boot disk is not known otherwise"),
            ))
        }
        (many, Ambiguous::Refuse) => Err(format!(
            "partitions labelled {label} on several disks ({}) and the boot disk is not known \
             (no LoaderDevicePartUUID, root not mounted from one): refusing to guess",
            many.join(", ")
        )),
        (many, Ambiguous::PreferFixed) => {
            let fixed: Vec<&str> = many
                .iter()
                .copied()
                .filter(|d| fixed_disk(sys, d))
                .collect();
            let (disk, why) = match fixed.as_slice() {
                [one] => (*one, "the only one that is neither removable nor on USB"),
                _ => (
                    many[0],
                    "the first by name: none or several are fixed disks",
                ),
            };
            let p = with
                .iter()
                .filter(|p| p.disk == disk)
                .min_by_key(|p| p.number)
                .expect("disk is among those with the label");
            Ok(found(
                p,
                format!(
                    "{label} is on several disks ({}) and the boot disk is not known: took {disk}, {why}",
                    many.join(", ")
                ),
            ))
        }
    }
}

/// The partition labelled `label` on the boot disk of this system.
pub fn locate(label: &str, policy: Ambiguous) -> Result<Found, String> {
    locate_in(&Sys::default(), label, policy)
}

/// [`locate`] in `sys` (stage 1's last try passes one without the loader variable).
pub fn locate_in(sys: &Sys, label: &str, policy: Ambiguous) -> Result<Found, String> {
    let parts = scan(sys);
    let boot = boot_disk(sys, &parts, running_root_disk(sys))?;
    choose(sys, &parts, label, boot.as_ref(), policy)
}

/// The block device (`/dev/vda2`) labelled `label` on the boot disk, refusing to guess
/// between disks ([`locate`] with [`Ambiguous::Refuse`]; the reason is dropped).
pub fn find_partition(label: &str) -> Option<String> {
    locate(label, Ambiguous::Refuse).ok().map(|f| f.dev)
}

/// `PARTNAME=` of a uevent file.
pub fn uevent_partname(ue: &str) -> Option<&str> {
    ue.lines().find_map(|l| l.strip_prefix("PARTNAME="))
}

/// The boot-counted entry of `slot` among file names, and the name it gets once good.
/// Matching is case-insensitive: systemd-boot writes entry ids back lowercased.
pub fn counted_entry<'a>(
    names: impl IntoIterator<Item = &'a str>,
    slot: char,
) -> Option<(&'a str, String)> {
    names
        .into_iter()
        .find(|n| is_slot_entry(n, slot) && n.contains('+'))
        .map(|n| (n, format!("riceguard-{slot}.conf")))
}

/// What marking the boot good did.
#[derive(Debug, PartialEq, Eq)]
pub enum Marked {
    Renamed { from: String, to: String },
    AlreadyGood,
}

/// Rename the slot's counted entry in `<esp>/loader/entries`, then sync.
pub fn mark_good(esp: &Path, slot: char) -> std::io::Result<Marked> {
    let dir = esp.join("loader/entries");
    let names: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let Some((from, to)) = counted_entry(names.iter().map(String::as_str), slot) else {
        return Ok(Marked::AlreadyGood);
    };
    store::rename(&dir.join(from), &dir.join(&to))?;
    crate::sys::os::sync();
    Ok(Marked::Renamed {
        from: from.to_string(),
        to,
    })
}

/// Entry file names in `<esp>/loader/entries` that belong to `slot`.
pub fn slot_entries(esp: &Path, slot: char) -> io::Result<Vec<String>> {
    let dir = esp.join("loader/entries");
    let mut v: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_slot_entry(n, slot))
        .collect();
    v.sort();
    Ok(v)
}

pub fn is_slot_entry(name: &str, slot: char) -> bool {
    let l = name.to_ascii_lowercase();
    let Some(rest) = l.strip_prefix(&format!("riceguard-{slot}")) else {
        return false;
    };
    rest == ".conf" || (rest.starts_with('+') && rest.ends_with(".conf"))
}

/// Tries left and done of a counted entry name (`riceguard-b+2-1.conf` -> (2, 1)).
pub fn entry_tries(name: &str) -> Option<(u32, u32)> {
    let stem = name.strip_suffix(".conf").or(name.strip_suffix(".CONF"))?;
    let (_, counter) = stem.split_once('+')?;
    match counter.split_once('-') {
        Some((l, d)) => Some((l.parse().ok()?, d.parse().ok()?)),
        None => Some((counter.parse().ok()?, 0)),
    }
}

/// An entry's text. `sort-key` is the last line: the U-Boot boot script reads the key's
/// digit as the byte before the final newline ([`sort_key_digit`]).
pub fn entry_text(version: &str, slot: char, sort_key: &str) -> String {
    format!(
        "title RiceGuard {version} (slot {slot})\nversion {version}\nefi /EFI/riceguard/slot-{slot}.efi\nsort-key {sort_key}\n"
    )
}

/// Set `sort-key` of an entry file, as its last line (see [`entry_text`]), keeping the
/// other lines.
pub fn set_sort_key(path: &Path, key: &str) -> io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    let mut out: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("sort-key"))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("sort-key {key}\n"));
    store::write(path, out.as_bytes(), store::PUBLIC)
}

/// Whether `slot` booted from a boot-counted entry (not yet marked good).
pub fn slot_on_trial(esp: &Path, slot: char) -> bool {
    slot_entries(esp, slot)
        .unwrap_or_default()
        .iter()
        .any(|n| entry_tries(n).is_some())
}

// ---------------------------------------------------------------------------------------
// U-Boot boards. U-Boot's EFI file protocol refuses renames, so systemd-boot cannot count
// tries there; the ESP's `/boot.scr` (image/uboot/boot.cmd) does the same counting on the
// same entry files before any kernel runs. The entry names stay the one source of truth
// for both firmware paths: init marks good and the updater installs exactly as under
// systemd-boot. The functions below are the script's rules in Rust (tests, the fuzz
// target `uboot_entries`, and the boot report), kept in step with boot.cmd by hand.

/// The highest tries-left and tries-done the boot script probes for (`+L-D`, 0..=3):
/// entry names outside this range are invisible to it.
pub const UBOOT_MAX_TRIES: u32 = 3;

/// One slot's entry as the U-Boot boot script sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UbootEntry {
    pub name: String,
    /// Tries (left, done); `None`: no counter (a good slot).
    pub tries: Option<(u32, u32)>,
    /// The sort key's digit (`riceguard-0` -> 0), when the file ends with one.
    pub key: Option<u8>,
}

/// What the boot script does with a set of entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UbootPlan {
    pub slot: char,
    pub entry: String,
    /// The name a trial entry is renamed to before its kernel runs.
    pub count_to: Option<String>,
    /// No slot has tries left: the script boots this one anyway (as systemd-boot does).
    pub exhausted: bool,
}

/// The digit of `sort-key riceguard-N` when it is the file's last line: the byte before
/// the final newline, as the boot script reads it (one byte at `size - 2`).
pub fn sort_key_digit(text: &[u8]) -> Option<u8> {
    let n = text.len();
    if n < 2 || text[n - 1] != b'\n' {
        return None;
    }
    match text[n - 2] {
        b @ (b'0' | b'1')
            if text[..n - 1].ends_with(b"sort-key riceguard-0")
                || text[..n - 1].ends_with(b"sort-key riceguard-1") =>
        {
            Some(b - b'0')
        }
        _ => None,
    }
}

/// The entry of `slot` the boot script finds among `names` (case-insensitive, as FAT
/// is): counters with the most tries left first (so after a power cut between its
/// write and its delete the old name is taken and the same step redone), then the
/// plain name.
pub fn uboot_entry_name<'a>(names: &[&'a str], slot: char) -> Option<&'a str> {
    let find = |want: &str| names.iter().copied().find(|n| n.eq_ignore_ascii_case(want));
    for l in (0..=UBOOT_MAX_TRIES).rev() {
        for d in 0..=UBOOT_MAX_TRIES {
            let c = if d == 0 {
                format!("{l}")
            } else {
                format!("{l}-{d}")
            };
            if let Some(n) = find(&format!("riceguard-{slot}+{c}.conf")) {
                return Some(n);
            }
        }
    }
    find(&format!("riceguard-{slot}.conf"))
}

/// Lower boots first: usable (tries left or no counter) before used up, then sort key
/// 0, 1, none.
fn uboot_score(e: &UbootEntry) -> u32 {
    let key = match e.key {
        Some(0) => 0,
        Some(1) => 1,
        _ => 2,
    };
    key + if matches!(e.tries, Some((0, _))) {
        4
    } else {
        0
    }
}

/// The boot script's choice among `entries` (file name, contents) of
/// `<esp>/loader/entries`. `None` only when neither slot has an entry the script can
/// see; then U-Boot goes on to the EFI removable path (systemd-boot, uncounted).
pub fn uboot_plan(entries: &[(String, Vec<u8>)]) -> Option<UbootPlan> {
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let slot_entry = |slot: char| -> Option<UbootEntry> {
        let name = uboot_entry_name(&names, slot)?;
        let text = &entries.iter().find(|(n, _)| n == name)?.1;
        Some(UbootEntry {
            name: name.to_string(),
            tries: entry_tries(name),
            key: sort_key_digit(text),
        })
    };
    let (a, b) = (slot_entry('a'), slot_entry('b'));
    let (slot, e) = match (a, b) {
        (Some(a), Some(b)) if uboot_score(&b) < uboot_score(&a) => ('b', b),
        (Some(a), _) => ('a', a),
        (None, Some(b)) => ('b', b),
        (None, None) => return None,
    };
    let count_to = match e.tries {
        // Tries done stops at the highest the script probes for, so the counted name
        // stays one it finds (`+2-3` by hand would otherwise become an invisible `+1-4`).
        Some((left, done)) if left > 0 => Some(format!(
            "riceguard-{slot}+{}-{}.conf",
            left - 1,
            (done + 1).min(UBOOT_MAX_TRIES)
        )),
        _ => None,
    };
    Some(UbootPlan {
        slot,
        exhausted: matches!(e.tries, Some((0, _))),
        entry: e.name,
        count_to,
    })
}

/// RiceGuard's EFI vendor GUID (boot.cmd's `rg_guid`).
pub const RICEGUARD_GUID: &str = "8e4b3f5a-1c2d-4e6f-9a0b-52696365476d";
/// The GUID of systemd-boot's variables.
const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// What started the running kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootPath {
    /// The U-Boot boot script chose `slot` from `entry` (its volatile `RiceGuardBoot`
    /// variable).
    UbootScript { slot: char, entry: String },
    /// systemd-boot (`LoaderInfo`), on firmware `firmware` (`LoaderFirmwareInfo`).
    SystemdBoot { loader: String, firmware: String },
    /// Neither variable (no EFI, or another loader).
    Unknown,
}

/// The `RiceGuardBoot` variable as efivarfs shows it: 4 attribute bytes, then the text
/// `uboot SLOT ENTRY` (U-Boot stores the ASCII of `env set -e`; NULs are dropped).
pub fn parse_boot_var(bytes: &[u8]) -> Option<(char, String)> {
    let text: String = std::str::from_utf8(bytes.get(4..)?)
        .ok()?
        .trim_matches(char::from(0))
        .to_string();
    let mut w = text.split_whitespace();
    if w.next()? != "uboot" {
        return None;
    }
    let slot = match w.next()? {
        "a" => 'a',
        "b" => 'b',
        _ => return None,
    };
    let entry = w.next()?;
    if w.next().is_some() || !is_slot_entry(entry, slot) {
        return None;
    }
    Some((slot, entry.to_string()))
}

/// [`BootPath`] from the variables in `efivars` (`/sys/firmware/efi/efivars`).
pub fn boot_path(efivars: &Path) -> BootPath {
    let var = |name: &str, guid: &str| std::fs::read(efivars.join(format!("{name}-{guid}"))).ok();
    if let Some((slot, entry)) =
        var("RiceGuardBoot", RICEGUARD_GUID).and_then(|b| parse_boot_var(&b))
    {
        return BootPath::UbootScript { slot, entry };
    }
    let utf16 = |b: Vec<u8>| -> Option<String> {
        let units: Vec<u16> = b
            .get(4..)?
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&u| u != 0)
            .collect();
        String::from_utf16(&units).ok()
    };
    match var("LoaderInfo", LOADER_GUID).and_then(utf16) {
        Some(loader) => BootPath::SystemdBoot {
            loader,
            firmware: var("LoaderFirmwareInfo", LOADER_GUID)
                .and_then(utf16)
                .unwrap_or_default(),
        },
        None => BootPath::Unknown,
    }
}

/// The entries of `<esp>/loader/entries` with their contents (at most 4 KiB each), for
/// [`uboot_plan`].
pub fn read_entries(esp: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(esp.join("loader/entries")) else {
        return Vec::new();
    };
    let mut v: Vec<(String, Vec<u8>)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let mut buf = Vec::new();
            std::fs::File::open(e.path())
                .ok()?
                .take(4096)
                .read_to_end(&mut buf)
                .ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), buf))
        })
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::os::unix::fs::symlink;

    /// 16 GPT-order bytes of a GUID text (the inverse of [`guid_text`]).
    fn guid_bytes(t: &str) -> [u8; 16] {
        let h: Vec<u8> = t
            .replace('-', "")
            .as_bytes()
            .chunks(2)
            .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap())
            .collect();
        let mut b: [u8; 16] = h.try_into().unwrap();
        b[..4].reverse();
        b[4..6].reverse();
        b[6..8].reverse();
        b
    }

    /// A disk's first bytes with a GPT: partition `n` has unique GUID `g`.
    fn gpt(sector: usize, parts: &[(u32, &str)]) -> Vec<u8> {
        let mut d = vec![0u8; sector * 2 + 128 * 128];
        d[sector..sector + 8].copy_from_slice(b"EFI PART");
        d[sector + 72..sector + 80].copy_from_slice(&2u64.to_le_bytes());
        d[sector + 80..sector + 84].copy_from_slice(&128u32.to_le_bytes());
        d[sector + 84..sector + 88].copy_from_slice(&128u32.to_le_bytes());
        for (n, g) in parts {
            let o = sector * 2 + (*n as usize - 1) * 128;
            d[o..o + 16].copy_from_slice(&[0xAA; 16]);
            d[o + 16..o + 32].copy_from_slice(&guid_bytes(g));
        }
        d
    }

    fn efivar(g: &str) -> Vec<u8> {
        let mut v = vec![6, 0, 0, 0];
        for u in g.encode_utf16().chain([0]) {
            v.extend(u.to_le_bytes());
        }
        v
    }

    /// A fake /sys (class/block, dev/block, devices) and /dev with GPT "disks".
    struct Fake {
        _d: TempDir,
        sys: Sys,
        devices: PathBuf,
        minor: std::cell::Cell<u32>,
    }

    const LABELS: [&str; 4] = ["esp", "root-a", "root-b", "perm"];

    impl Fake {
        fn new() -> Fake {
            let d = TempDir::new("sysfs");
            let sys = Sys {
                class_block: d.0.join("sys/class/block"),
                dev_block: d.0.join("sys/dev/block"),
                loader_var: d.0.join("sys/firmware/efi/efivars/LoaderDevicePartUUID-x"),
                dev: d.0.join("dev"),
            };
            for p in [&sys.class_block, &sys.dev_block, &sys.dev] {
                std::fs::create_dir_all(p).unwrap();
            }
            std::fs::create_dir_all(sys.loader_var.parent().unwrap()).unwrap();
            let devices = d.0.join("sys/devices");
            Fake {
                _d: d,
                sys,
                devices,
                minor: std::cell::Cell::new(0),
            }
        }

        /// A disk at `bus` (a sysfs device path) with the image's four partitions, the
        /// GUIDs `<tag>-N`.
        fn disk(&self, name: &str, bus: &str, removable: bool, tag: u8) {
            let real = self.devices.join(bus).join("block").join(name);
            std::fs::create_dir_all(&real).unwrap();
            std::fs::write(
                real.join("removable"),
                if removable { "1\n" } else { "0\n" },
            )
            .unwrap();
            symlink(&real, self.sys.class_block.join(name)).unwrap();
            let mut guids = Vec::new();
            for (i, label) in LABELS.iter().enumerate() {
                let n = i as u32 + 1;
                let pname = format!("{name}{n}");
                let pdir = real.join(&pname);
                std::fs::create_dir_all(&pdir).unwrap();
                std::fs::write(pdir.join("partition"), format!("{n}\n")).unwrap();
                std::fs::write(
                    pdir.join("uevent"),
                    format!("MAJOR=254\nDEVNAME={pname}\nDEVTYPE=partition\nPARTN={n}\nPARTNAME={label}\n"),
                )
                .unwrap();
                symlink(&pdir, self.sys.class_block.join(&pname)).unwrap();
                self.minor.set(self.minor.get() + 1);
                symlink(
                    &pdir,
                    self.sys.dev_block.join(format!("254:{}", self.minor.get())),
                )
                .unwrap();
                guids.push((n, guid(tag, n)));
            }
            let g: Vec<(u32, &str)> = guids.iter().map(|(n, g)| (*n, g.as_str())).collect();
            std::fs::write(self.sys.dev.join(name), gpt(512, &g)).unwrap();
        }

        fn pick(
            &self,
            label: &str,
            root: Option<&str>,
            policy: Ambiguous,
        ) -> Result<Found, String> {
            let parts = scan(&self.sys);
            let boot = boot_disk(&self.sys, &parts, root.map(str::to_string))?;
            choose(&self.sys, &parts, label, boot.as_ref(), policy)
        }

        fn loader(&self, g: &str) {
            std::fs::write(&self.sys.loader_var, efivar(g)).unwrap();
        }
    }

    fn guid(tag: u8, n: u32) -> String {
        format!("{tag:02X}{n:06X}-1111-4222-8333-444455556666")
    }

    #[test]
    fn gpt_guids_and_efivar() {
        // The ESP type GUID as it lies on disk.
        let esp = [
            0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E,
            0xC9, 0x3B,
        ];
        assert_eq!(guid_text(&esp), "C12A7328-F81F-11D2-BA4B-00A0C93EC93B");
        let parts = [(1, guid(1, 1).as_str().to_owned()), (4, guid(1, 4))];
        let p: Vec<(u32, &str)> = parts.iter().map(|(n, g)| (*n, g.as_str())).collect();
        for sector in [512, 4096] {
            let want: Vec<(u32, String)> = parts.to_vec();
            assert_eq!(gpt_partition_guids(&gpt(sector, &p)), want, "{sector}");
        }
        // Malformed: never a panic, no GUIDs.
        let good = gpt(512, &p);
        let mut bad_size = good.clone();
        bad_size[512 + 84..512 + 88].copy_from_slice(&7u32.to_le_bytes());
        let mut far = good.clone();
        far[512 + 72..512 + 80].copy_from_slice(&u64::MAX.to_le_bytes());
        for d in [&b""[..], &good[..600], &bad_size, &far, &[0xff; 8192]] {
            assert!(gpt_partition_guids(d).is_empty());
        }
        // Entries cut off by the end of what was read: only the whole ones.
        assert_eq!(gpt_partition_guids(&good[..1024 + 128]).len(), 1);
        let g = "6f9d0e1a-aaaa-4bbb-8ccc-0123456789ab";
        assert_eq!(
            efivar_text(&efivar(g)).as_deref(),
            Some(&*g.to_ascii_uppercase())
        );
        assert_eq!(efivar_text(b"\x06\0\0\0x\0"), None);
        assert_eq!(efivar_text(b""), None);
    }

    /// The image's disk (virtio, fixed) and a USB stick flashed with the same image.
    #[test]
    fn partitions_only_on_the_boot_disk() {
        let f = Fake::new();
        f.disk("vda", "pci0000:00/0000:00:04.0/virtio2", false, 1);
        f.disk(
            "sda",
            "pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/host0/target0:0:0/0:0:0:0",
            true,
            2,
        );
        let parts = scan(&f.sys);
        assert_eq!(parts.len(), 8);
        assert_eq!(
            parts[0],
            Part {
                name: "sda1".into(),
                disk: "sda".into(),
                number: 1,
                label: Some("esp".into())
            }
        );
        // No loader variable, no running root: the update target, perm and the ESP refuse;
        // the root takes the fixed disk and says so.
        for l in LABELS {
            let e = f.pick(l, None, Ambiguous::Refuse).unwrap_err();
            assert!(
                e.contains("several disks (sda, vda)") && e.contains("refusing"),
                "{e}"
            );
        }
        let r = f.pick("root-a", None, Ambiguous::PreferFixed).unwrap();
        assert_eq!(r.dev, "/dev/vda2");
        assert!(
            r.how.contains("took vda") && r.how.contains("neither removable nor on USB"),
            "{}",
            r.how
        );
        // Stage 2: the running root's disk decides for everything.
        assert_eq!(disk_of_devno(&f.sys, 254, 2).as_deref(), Some("vda"));
        assert_eq!(disk_of_devno(&f.sys, 254, 99), None);
        for (l, dev) in LABELS
            .iter()
            .zip(["/dev/vda1", "/dev/vda2", "/dev/vda3", "/dev/vda4"])
        {
            let got = f.pick(l, Some("vda"), Ambiguous::Refuse).unwrap();
            assert_eq!(got.dev, dev);
            assert!(got.how.contains("running root"));
        }
        // The boot loader named vda's ESP: vda, whatever else holds the labels.
        f.loader(&guid(1, 1));
        let got = f.pick("perm", None, Ambiguous::Refuse).unwrap();
        assert_eq!(got.dev, "/dev/vda4");
        assert!(got.how.contains("LoaderDevicePartUUID"), "{}", got.how);
        // It named the stick's: the firmware booted the stick, so its partitions count
        // (and the loader wins over a running root elsewhere).
        f.loader(&guid(2, 1));
        assert_eq!(
            f.pick("root-b", Some("vda"), Ambiguous::Refuse)
                .unwrap()
                .dev,
            "/dev/sda3"
        );
        // A GUID no disk has: stage 2 goes by its running root; stage 1 waits (an error
        // until the disk appears) rather than take the only disk probed so far.
        f.loader(&guid(9, 1));
        assert_eq!(
            f.pick("perm", Some("vda"), Ambiguous::Refuse).unwrap().dev,
            "/dev/vda4"
        );
        let e = f.pick("root-a", None, Ambiguous::PreferFixed).unwrap_err();
        assert!(
            e.contains("no disk has the partition the boot loader started from"),
            "{e}"
        );
        // A damaged variable is none.
        std::fs::write(&f.sys.loader_var, b"\x06\0\0\0garbage").unwrap();
        assert!(f
            .pick("perm", None, Ambiguous::Refuse)
            .unwrap_err()
            .contains("several disks"));
        assert_eq!(
            f.pick("root-a", None, Ambiguous::PreferFixed).unwrap().dev,
            "/dev/vda2"
        );
        // A label missing on the boot disk is missing: never taken from another disk.
        let e = f
            .pick("root-c", Some("vda"), Ambiguous::PreferFixed)
            .unwrap_err();
        assert!(
            e.contains("no partition labelled root-c on the boot disk vda"),
            "{e}"
        );
        std::fs::write(
            f.devices
                .join("pci0000:00/0000:00:04.0/virtio2/block/vda/vda4/uevent"),
            "PARTN=4\n",
        )
        .unwrap();
        let e = f.pick("perm", Some("vda"), Ambiguous::Refuse).unwrap_err();
        assert!(e.contains("ignoring the one(s) on sda"), "{e}");
    }

    #[test]
    fn one_disk_or_two_fixed_disks() {
        let f = Fake::new();
        f.disk("nvme0n1", "pci0000:00/0000:00:02.0/nvme/nvme0", false, 1);
        // One disk with the labels: today's behaviour, without any variable.
        let got = f.pick("perm", None, Ambiguous::Refuse).unwrap();
        assert_eq!(got.dev, "/dev/nvme0n14");
        assert!(got.how.contains("only disk"), "{}", got.how);
        assert!(f
            .pick("root-c", None, Ambiguous::Refuse)
            .unwrap_err()
            .contains("no partition labelled root-c"));
        // A second fixed disk with an image: the root takes the first by name, and says so.
        // It is a dd copy (the same GUIDs): the loader's GUID is on both, so no help.
        f.disk("nvme1n1", "pci0000:00/0000:00:03.0/nvme/nvme1", false, 1);
        f.loader(&guid(1, 1));
        let r = f.pick("root-a", None, Ambiguous::PreferFixed).unwrap();
        assert_eq!(r.disk, "nvme0n1");
        assert!(r.how.contains("first by name"), "{}", r.how);
        assert!(f.pick("root-a", None, Ambiguous::Refuse).is_err());
    }

    #[test]
    fn finds_counted_entry() {
        let names = ["riceguard-b.conf", "RICEGUARD-A+2-1.CONF", "other.conf"];
        assert_eq!(
            counted_entry(names, 'a'),
            Some(("RICEGUARD-A+2-1.CONF", "riceguard-a.conf".to_string()))
        );
        assert_eq!(counted_entry(names, 'b'), None);
        assert_eq!(
            uevent_partname("MAJOR=254\nDEVNAME=vda4\nPARTNAME=perm\n"),
            Some("perm")
        );
    }

    #[test]
    fn marks_good_by_rename() {
        let d = std::env::temp_dir().join(format!("rg-esp-{}", std::process::id()));
        let e = d.join("loader/entries");
        std::fs::create_dir_all(&e).unwrap();
        std::fs::write(e.join("riceguard-a+2-1.conf"), "title x\n").unwrap();
        assert_eq!(
            mark_good(&d, 'a').unwrap(),
            Marked::Renamed {
                from: "riceguard-a+2-1.conf".into(),
                to: "riceguard-a.conf".into()
            }
        );
        assert!(e.join("riceguard-a.conf").exists());
        assert_eq!(mark_good(&d, 'a').unwrap(), Marked::AlreadyGood);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn ent(name: &str, key: &str) -> (String, Vec<u8>) {
        let slot = if name.to_ascii_lowercase().starts_with("riceguard-b") {
            'b'
        } else {
            'a'
        };
        (name.to_string(), entry_text("v1", slot, key).into_bytes())
    }

    #[test]
    fn sort_key_is_the_last_byte_before_the_newline() {
        assert_eq!(
            sort_key_digit(entry_text("v", 'a', "riceguard-0").as_bytes()),
            Some(0)
        );
        assert_eq!(
            sort_key_digit(entry_text("v", 'a', "riceguard-1").as_bytes()),
            Some(1)
        );
        // set_sort_key keeps it last whatever order the file had.
        let d = TempDir::new("sortkey");
        let p = d.0.join("e.conf");
        std::fs::write(&p, "title x\nsort-key riceguard-1\nefi /x.efi\n").unwrap();
        set_sort_key(&p, "riceguard-0").unwrap();
        assert_eq!(sort_key_digit(&std::fs::read(&p).unwrap()), Some(0));
        for bad in [
            &b""[..],
            b"\n",
            b"sort-key riceguard-0",
            b"sort-key riceguard-7\n",
            b"efi 0\n",
            b"sort-key riceguard-0\r\n",
        ] {
            assert_eq!(sort_key_digit(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn uboot_plan_counts_like_systemd_boot() {
        let plan = |e: &[(String, Vec<u8>)]| {
            uboot_plan(e).map(|p| (p.slot, p.entry, p.count_to, p.exhausted))
        };
        // Factory: slot a on trial.
        assert_eq!(
            plan(&[ent("riceguard-a+3.conf", "riceguard-0")]),
            Some((
                'a',
                "riceguard-a+3.conf".into(),
                Some("riceguard-a+2-1.conf".into()),
                false
            ))
        );
        // An update on trial (key 0) over the good slot (key 1); counted names as FAT
        // gives them back (any case).
        let up = [
            ent("riceguard-a.conf", "riceguard-1"),
            ent("RICEGUARD-B+2-1.CONF", "riceguard-0"),
        ];
        assert_eq!(
            plan(&up),
            Some((
                'b',
                "RICEGUARD-B+2-1.CONF".into(),
                Some("riceguard-b+1-2.conf".into()),
                false
            ))
        );
        // Its tries used up: the good slot, uncounted.
        let back = [
            ent("riceguard-a.conf", "riceguard-1"),
            ent("riceguard-b+0-3.conf", "riceguard-0"),
        ];
        assert_eq!(
            plan(&back),
            Some(('a', "riceguard-a.conf".into(), None, false))
        );
        // Both good: the sort key decides (rollback-slot swaps keys).
        let both = [
            ent("riceguard-a.conf", "riceguard-1"),
            ent("riceguard-b.conf", "riceguard-0"),
        ];
        assert_eq!(uboot_plan(&both).unwrap().slot, 'b');
        let both = [
            ent("riceguard-a.conf", "riceguard-0"),
            ent("riceguard-b.conf", "riceguard-1"),
        ];
        assert_eq!(uboot_plan(&both).unwrap().slot, 'a');
        // Only used-up entries: boot one anyway (as systemd-boot does), say so.
        let p = uboot_plan(&[ent("riceguard-b+0-3.conf", "riceguard-0")]).unwrap();
        assert!(p.exhausted && p.slot == 'b' && p.count_to.is_none());
        // rollback-slot's fresh try (+1) counts to +0-1.
        assert_eq!(
            uboot_plan(&[
                ent("riceguard-a+1.conf", "riceguard-0"),
                ent("riceguard-b.conf", "riceguard-1")
            ])
            .unwrap()
            .count_to
            .as_deref(),
            Some("riceguard-a+0-1.conf")
        );
        // Power cut between the script's write and its delete: both names; the old one
        // (more tries left) is taken and the same step redone.
        let cut = [
            ent("riceguard-b+2-1.conf", "riceguard-0"),
            ent("riceguard-b+3.conf", "riceguard-0"),
            ent("riceguard-a.conf", "riceguard-1"),
        ];
        assert_eq!(
            uboot_plan(&cut).unwrap().count_to.as_deref(),
            Some("riceguard-b+2-1.conf")
        );
        // No entry the script can see (other names, counters past 3): nothing.
        assert_eq!(
            uboot_plan(&[
                ent("other.conf", "riceguard-0"),
                ent("riceguard-a+9.conf", "riceguard-0")
            ]),
            None
        );
        assert_eq!(uboot_plan(&[]), None);
    }

    /// Whatever the entries directory holds, the script boots a slot that has an entry it
    /// can see, a good entry is never passed over for a used-up one, and a counted name
    /// stays a name of the same slot that the script finds again.
    #[test]
    fn uboot_plan_never_loses_a_bootable_slot() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let counters = [
            "", "+3", "+2-1", "+1-2", "+0-3", "+1", "+0-1", "+2-3", "+3-3", "+9", "+x", "+2-",
        ];
        for _ in 0..20_000 {
            let mut es = Vec::new();
            for _ in 0..rnd(4) {
                let slot = if rnd(2) == 0 { 'a' } else { 'b' };
                let name = format!(
                    "riceguard-{slot}{}.conf",
                    counters[rnd(counters.len() as u64) as usize]
                );
                let text = match rnd(4) {
                    0 => b"garbage".to_vec(),
                    1 => entry_text("v", slot, "riceguard-1").into_bytes(),
                    _ => entry_text("v", slot, "riceguard-0").into_bytes(),
                };
                es.push((name, text));
            }
            let visible = |s: char| {
                let names: Vec<&str> = es.iter().map(|(n, _)| n.as_str()).collect();
                uboot_entry_name(&names, s).map(str::to_string)
            };
            let (va, vb) = (visible('a'), visible('b'));
            let Some(p) = uboot_plan(&es) else {
                assert!(va.is_none() && vb.is_none(), "{es:?}");
                continue;
            };
            assert_eq!(
                Some(&p.entry),
                if p.slot == 'a' {
                    va.as_ref()
                } else {
                    vb.as_ref()
                }
            );
            let other = if p.slot == 'a' { &vb } else { &va };
            if p.exhausted {
                // Used up is chosen only when the other slot is used up too, or absent.
                if let Some(o) = other {
                    assert!(matches!(entry_tries(o), Some((0, _))), "{es:?} -> {p:?}");
                }
            }
            if let Some(to) = &p.count_to {
                assert!(is_slot_entry(to, p.slot));
                let (l, d) = entry_tries(to).unwrap();
                assert!(l < UBOOT_MAX_TRIES && d <= UBOOT_MAX_TRIES, "{to}");
                // After the rename the slot still has an entry the script sees.
                let mut after: Vec<(String, Vec<u8>)> =
                    es.iter().filter(|(n, _)| *n != p.entry).cloned().collect();
                after.push((to.clone(), b"sort-key riceguard-0\n".to_vec()));
                let names: Vec<&str> = after.iter().map(|(n, _)| n.as_str()).collect();
                assert!(uboot_entry_name(&names, p.slot).is_some(), "{to}");
            }
        }
    }

    #[test]
    fn boot_path_from_efivars() {
        let d = TempDir::new("efivars");
        assert_eq!(boot_path(&d.0), BootPath::Unknown);
        let u16v = |s: &str| {
            let mut v = vec![6, 0, 0, 0];
            for u in s.encode_utf16().chain([0]) {
                v.extend(u.to_le_bytes());
            }
            v
        };
        std::fs::write(
            d.0.join(format!("LoaderInfo-{LOADER_GUID}")),
            u16v("systemd-boot 254"),
        )
        .unwrap();
        std::fs::write(
            d.0.join(format!("LoaderFirmwareInfo-{LOADER_GUID}")),
            u16v("Das U-Boot 8215.1"),
        )
        .unwrap();
        assert_eq!(
            boot_path(&d.0),
            BootPath::SystemdBoot {
                loader: "systemd-boot 254".into(),
                firmware: "Das U-Boot 8215.1".into()
            }
        );
        std::fs::write(
            d.0.join(format!("RiceGuardBoot-{RICEGUARD_GUID}")),
            b"\x06\0\0\0uboot b riceguard-b+2-1.conf",
        )
        .unwrap();
        assert_eq!(
            boot_path(&d.0),
            BootPath::UbootScript {
                slot: 'b',
                entry: "riceguard-b+2-1.conf".into()
            }
        );
        assert_eq!(
            parse_boot_var(b"\x06\0\0\0uboot a riceguard-a.conf\0"),
            Some(('a', "riceguard-a.conf".into()))
        );
        for bad in [
            &b""[..],
            b"\x06\0\0\0",
            b"\x06\0\0\0uboot c riceguard-c.conf",
            b"\x06\0\0\0uboot a riceguard-b.conf",
            b"\x06\0\0\0uboot a riceguard-a.conf extra",
            b"\x06\0\0\0\xff\xfe",
            b"\x06\0\0\0efi a riceguard-a.conf",
        ] {
            assert_eq!(parse_boot_var(bad), None, "{bad:?}");
        }
    }
}
