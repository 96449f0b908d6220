//! The A/B slot layout's policy, without I/O: GPT partition GUIDs, the choice of a
//! partition by label on the boot disk ([`choose`], [`boot_disk`]), the systemd-boot
//! entry names of the two slots (`riceguard-a.conf`, or `riceguard-a+2-1.conf` while on
//! trial: tries left and done), their text and sort keys, the U-Boot boot script's
//! choice ([`uboot_plan`]) and the boot variables' text. The gateway's `slots` reads the
//! disks, sysfs, efivarfs and the ESP and passes what it read in.

/// The text of an efivarfs variable file: 4 attribute bytes, then UTF-16LE text up to a
/// NUL (systemd writes them NUL-terminated).
pub fn efivar_utf16(bytes: &[u8]) -> Option<String> {
    let units: Vec<u16> = bytes
        .get(4..)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

/// The GPT names of the image's partitions (`image/build.sh`, `flash-scripts/flash`):
/// every flashed disk carries them, and a disk with one of them is an appliance disk.
pub const PARTITION_LABELS: [&str; 4] = ["esp", "root-a", "root-b", "perm"];

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
    let s = efivar_utf16(bytes)?;
    let s = s.trim();
    (s.len() == 36).then(|| s.to_ascii_uppercase())
}

/// What the boot loader's variable tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoaderSays {
    /// No variable (or not a GUID).
    Nothing,
    /// The one disk whose GPT has that partition GUID.
    Disk(String),
    /// No disk has it (yet: stage 1 may run before the disk is probed).
    Nowhere(String),
    /// Several disks have it (copied with `dd`, not flashed): no help.
    Several,
}

/// The boot disk, when it can be told (see the gateway's `slots` for the rules), from what
/// the boot loader's variable tells and `running_root`, rule 2's disk. An error while the
/// boot loader names a partition no disk has and there is no running root (stage 1
/// before its disk appeared: wait rather than guess).
pub fn boot_disk(
    loader: LoaderSays,
    running_root: Option<String>,
) -> Result<Option<BootDisk>, String> {
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

/// Choose the partition labelled `label`: on the boot disk if known, else by `policy`
/// among the disks that have it; `is_fixed` tells whether a disk is neither removable
/// nor on USB (asked only for [`Ambiguous::PreferFixed`] among several disks).
pub fn choose(
    parts: &[Part],
    label: &str,
    boot: Option<&BootDisk>,
    policy: Ambiguous,
    is_fixed: impl Fn(&str) -> bool,
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
            let fixed: Vec<&str> = many.iter().copied().filter(|d| is_fixed(d)).collect();
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

/// An entry's `text` with its `sort-key` set to `key`, as its last line (see
/// [`entry_text`]), the other lines kept.
pub fn with_sort_key(text: &str, key: &str) -> String {
    let mut out: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("sort-key"))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("sort-key {key}\n"));
    out
}

/// An entry's text. `sort-key` is the last line: the U-Boot boot script reads the key's
/// digit as the byte before the final newline ([`sort_key_digit`]).
pub fn entry_text(version: &str, slot: char, sort_key: &str) -> String {
    format!(
        "title RiceGuard {version} (slot {slot})\nversion {version}\nefi /EFI/riceguard/slot-{slot}.efi\nsort-key {sort_key}\n"
    )
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
pub const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

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

#[cfg(test)]
mod tests;
