//! The USB stick of `export configuration to usb` and `import configuration from usb`,
//! without I/O: which disk qualifies ([`choose`]), what a FAT boot sector looks like
//! ([`fat_kind`]), the export's file name ([`export_file_name`]) and which file an import
//! reads ([`newest_export`], [`plain_file_name`]). The gateway's `usb_stick` reads sysfs
//! and the first sectors into a [`Disk`] list and mounts what this module chose.
//!
//! **The rule.** A stick qualifies when it is a removable disk on USB with exactly one
//! FAT file system: one partition, or none and FAT on the whole disk (a "superfloppy"),
//! and no partition carrying one of the image's labels ([`crate::slots::PARTITION_LABELS`]).
//! A disk with those labels is an appliance disk (the boot disk may be a USB stick):
//! only the boot disk's partitions are the appliance's, and no other disk's are written
//! by a guess either. None or several qualifying sticks: refused, each disk found listed
//! with why it was not taken.

use crate::clock::Civil;

/// The FAT variant a boot sector describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatKind {
    Fat12,
    Fat16,
    Fat32,
}

impl FatKind {
    pub fn name(self) -> &'static str {
        match self {
            FatKind::Fat12 => "FAT12",
            FatKind::Fat16 => "FAT16",
            FatKind::Fat32 => "FAT32",
        }
    }
}

/// What the first sector of a partition (or a whole disk) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    Fat(FatKind),
    /// Readable, but not a FAT boot sector.
    Other,
    /// Could not be read (no device node, an I/O error, a short read).
    Unreadable,
}

/// The boot sector's fields checked, at their offsets (Microsoft's FAT specification,
/// "BPB"): a sector that is an MBR or another file system's fails one of them.
mod field {
    pub const JUMP: usize = 0;
    pub const BYTES_PER_SECTOR: usize = 11;
    pub const SECTORS_PER_CLUSTER: usize = 13;
    pub const RESERVED_SECTORS: usize = 14;
    pub const NUM_FATS: usize = 16;
    pub const ROOT_ENTRIES: usize = 17;
    pub const FAT_SIZE_16: usize = 22;
    pub const FAT_SIZE_32: usize = 36;
    /// `FilSysType` of FAT12/16 (informational, but every formatter writes it).
    pub const TYPE_16: usize = 54;
    /// `BS_FilSysType` of FAT32.
    pub const TYPE_32: usize = 82;
    pub const SIGNATURE: usize = 510;
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The FAT variant of a boot sector (its first 512 bytes or more), `None` when it is not
/// one: the 0x55AA signature, a jump instruction, a power-of-two sector size of 512 to
/// 4096 and cluster size, reserved sectors, one or more FATs of non-zero size, and the
/// type string formatters write (`FAT12   `, `FAT16   `, `FAT32   `).
pub fn fat_kind(sector: &[u8]) -> Option<FatKind> {
    use field::*;
    if sector.len() < 512 || sector[SIGNATURE] != 0x55 || sector[SIGNATURE + 1] != 0xAA {
        return None;
    }
    if !matches!(sector[JUMP], 0xEB | 0xE9) {
        return None;
    }
    let bps = le16(sector, BYTES_PER_SECTOR);
    let spc = sector[SECTORS_PER_CLUSTER];
    if !(512..=4096).contains(&bps) || !bps.is_power_of_two() || !spc.is_power_of_two() {
        return None;
    }
    if le16(sector, RESERVED_SECTORS) == 0 || sector[NUM_FATS] == 0 {
        return None;
    }
    let fat16 = le16(sector, FAT_SIZE_16);
    if fat16 == 0 {
        // FAT32: no fixed root directory, the FAT's size in the extended BPB.
        if le16(sector, ROOT_ENTRIES) != 0 || le32(sector, FAT_SIZE_32) == 0 {
            return None;
        }
        return (&sector[TYPE_32..TYPE_32 + 8] == b"FAT32   ").then_some(FatKind::Fat32);
    }
    match &sector[TYPE_16..TYPE_16 + 8] {
        b"FAT12   " => Some(FatKind::Fat12),
        b"FAT16   " | b"FAT     " => Some(FatKind::Fat16),
        _ => None,
    }
}

/// A partition as found on a candidate disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Kernel name (`sdb1`).
    pub name: String,
    /// Its GPT name (sysfs `PARTNAME`), if any.
    pub label: Option<String>,
    pub fs: Fs,
}

/// A SCSI disk (`sd*`) as sysfs and its first sectors show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Kernel name (`sdb`).
    pub name: String,
    pub removable: bool,
    /// Its sysfs device path goes through a USB bus.
    pub usb: bool,
    /// The whole disk's first sector (FAT there: a stick without a partition table).
    pub whole: Fs,
    pub parts: Vec<Partition>,
}

/// The stick chosen: the device (`sdb1`, or `sdb` without partitions) to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stick {
    pub disk: String,
    pub dev: String,
    pub fat: FatKind,
}

impl std::fmt::Display for Stick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.dev, self.fat.name())
    }
}

/// Whether `disk` qualifies, else why not (one line, for the refusal's list).
pub fn judge(disk: &Disk) -> Result<Stick, String> {
    let name = &disk.name;
    if !disk.usb {
        return Err(format!("{name}: not on USB"));
    }
    if !disk.removable {
        return Err(format!("{name}: not a removable disk"));
    }
    let ours: Vec<&str> = disk
        .parts
        .iter()
        .filter_map(|p| p.label.as_deref())
        .filter(|l| crate::slots::PARTITION_LABELS.contains(l))
        .collect();
    if !ours.is_empty() {
        return Err(format!(
            "{name}: a RiceGuard disk (partitions {}), never used for exports",
            ours.join(", ")
        ));
    }
    let (dev, fs) = match disk.parts.as_slice() {
        [] => (name, disk.whole),
        [p] => (&p.name, p.fs),
        more => {
            return Err(format!(
                "{name}: {} partitions (a stick with one FAT partition is needed)",
                more.len()
            ))
        }
    };
    match fs {
        Fs::Fat(fat) => Ok(Stick {
            disk: name.clone(),
            dev: dev.clone(),
            fat,
        }),
        Fs::Other if disk.parts.is_empty() => {
            Err(format!("{name}: no partition and no FAT file system"))
        }
        Fs::Other => Err(format!("{dev}: not a FAT file system")),
        Fs::Unreadable => Err(format!("{dev}: could not be read")),
    }
}

/// The one qualifying stick among `disks`, else why none is taken, each disk with its
/// reason.
pub fn choose(disks: &[Disk]) -> Result<Stick, String> {
    if disks.is_empty() {
        return Err("no USB stick is attached (no USB mass-storage disk found)".into());
    }
    let mut ok = Vec::new();
    let mut not = Vec::new();
    for d in disks {
        match judge(d) {
            Ok(s) => ok.push(s),
            Err(why) => not.push(why),
        }
    }
    match ok.len() {
        1 => Ok(ok.remove(0)),
        0 => Err(format!(
            "no usable USB stick (one removable USB disk with one FAT partition and no RiceGuard labels is needed); found:\n  {}",
            not.join("\n  ")
        )),
        _ => Err(format!(
            "several USB sticks qualify ({}): attach only the one to use",
            ok.iter()
                .map(Stick::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The name prefix and suffix of an export file.
const PREFIX: &str = "riceguard-";
const SUFFIX: &str = ".age";
/// The longest FAT long file name.
pub const MAX_NAME: usize = 255;

/// The export's file name: `riceguard-BOARD-YYYYMMDDTHHMMSSZ.age`, the board reduced
/// to letters, digits, `-` and `_` (`box` when nothing is left), the time UTC.
pub fn export_file_name(board: &str, unix: i64) -> String {
    let b: String = board
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .take(64)
        .collect();
    let b = if b.is_empty() { "box".into() } else { b };
    let c = Civil::from_unix(unix);
    format!(
        "{PREFIX}{b}-{:04}{:02}{:02}T{:02}{:02}{:02}Z{SUFFIX}",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Whether `name` looks like an export: `riceguard-*.age` (case-insensitive, as FAT).
pub fn is_export_name(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.len() > PREFIX.len() + SUFFIX.len() && l.starts_with(PREFIX) && l.ends_with(SUFFIX)
}

/// The time in an export's name (`...-20261204T033000Z.age`), as Unix seconds.
pub fn name_time(name: &str) -> Option<i64> {
    let l = name.to_ascii_lowercase();
    let stem = l.strip_suffix(SUFFIX)?;
    let stamp = stem.rsplit('-').next()?;
    let b = stamp.as_bytes();
    if b.len() != 16 || b[8] != b't' || b[15] != b'z' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = stamp.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    Civil {
        year: i64::from(digits(0..4)?),
        month: digits(4..6)?,
        day: digits(6..8)?,
        hour: digits(9..11)?,
        minute: digits(11..13)?,
        second: digits(13..15)?,
    }
    .to_unix()
}

/// The newest export among a directory's `(name, modification time)` entries: by the
/// time in its name ([`name_time`]), else its modification time; the greater name on a
/// tie. Names that are not exports are ignored.
pub fn newest_export(entries: &[(String, Option<i64>)]) -> Option<&str> {
    entries
        .iter()
        .filter(|(n, _)| is_export_name(n))
        .max_by_key(|(n, m)| (name_time(n).or(*m), n.as_str()))
        .map(|(n, _)| n.as_str())
}

/// A file name given to `import configuration from usb FILE`: a plain name in the stick's
/// top directory, no path.
pub fn plain_file_name(name: &str) -> Result<&str, String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err("a file name of 1 to 255 characters is needed".into());
    }
    if name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(format!(
            "{name:?} is not a plain file name (no path: the file is read from the stick's top folder)"
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("the file name has control characters".into());
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FAT boot sector as mkfs.fat writes one.
    pub fn boot_sector(kind: FatKind) -> Vec<u8> {
        let mut s = vec![0u8; 512];
        s[0] = 0xEB;
        s[1] = 0x3C;
        s[2] = 0x90;
        s[11..13].copy_from_slice(&512u16.to_le_bytes());
        s[13] = 4;
        s[14..16].copy_from_slice(&4u16.to_le_bytes());
        s[16] = 2;
        match kind {
            FatKind::Fat32 => {
                s[36..40].copy_from_slice(&1000u32.to_le_bytes());
                s[82..90].copy_from_slice(b"FAT32   ");
            }
            k => {
                s[17..19].copy_from_slice(&512u16.to_le_bytes());
                s[22..24].copy_from_slice(&32u16.to_le_bytes());
                s[54..62].copy_from_slice(if k == FatKind::Fat12 {
                    b"FAT12   "
                } else {
                    b"FAT16   "
                });
            }
        }
        s[510] = 0x55;
        s[511] = 0xAA;
        s
    }

    #[test]
    fn fat_boot_sectors_and_others() {
        for k in [FatKind::Fat12, FatKind::Fat16, FatKind::Fat32] {
            assert_eq!(fat_kind(&boot_sector(k)), Some(k));
        }
        // What mkfs.fat 4.2 writes (the fuzz target's seeds).
        for (b, k) in [
            (
                &include_bytes!("../../../fuzz/seeds/usb_stick/fat12")[..],
                FatKind::Fat12,
            ),
            (
                &include_bytes!("../../../fuzz/seeds/usb_stick/fat16")[..],
                FatKind::Fat16,
            ),
            (
                &include_bytes!("../../../fuzz/seeds/usb_stick/fat32")[..],
                FatKind::Fat32,
            ),
        ] {
            assert_eq!(fat_kind(b), Some(k));
        }
        let good = boot_sector(FatKind::Fat32);
        // An MBR: the signature, no BPB.
        let mut mbr = vec![0u8; 512];
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        assert_eq!(fat_kind(&mbr), None);
        for (at, v) in [
            (510, 0),
            (0, 0),
            (12, 0),
            (12, 3),
            (13, 3),
            (16, 0),
            (82, b'X'),
        ] {
            let mut s = good.clone();
            s[at] = v;
            assert_eq!(fat_kind(&s), None, "byte {at} = {v}");
        }
        assert_eq!(fat_kind(&good[..511]), None);
        assert_eq!(fat_kind(&[]), None);
    }

    fn stick(name: &str, parts: &[(&str, Option<&str>, Fs)]) -> Disk {
        Disk {
            name: name.into(),
            removable: true,
            usb: true,
            whole: Fs::Other,
            parts: parts
                .iter()
                .map(|(n, l, fs)| Partition {
                    name: (*n).into(),
                    label: l.map(str::to_string),
                    fs: *fs,
                })
                .collect(),
        }
    }

    const FAT: Fs = Fs::Fat(FatKind::Fat32);

    #[test]
    fn one_stick_is_taken() {
        let boot = stick(
            "sda",
            &[
                ("sda1", Some("esp"), FAT),
                ("sda2", Some("root-a"), Fs::Other),
                ("sda3", Some("root-b"), Fs::Other),
                ("sda4", Some("perm"), Fs::Other),
            ],
        );
        let mut fixed = stick("sdc", &[("sdc1", None, FAT)]);
        fixed.removable = false;
        let good = stick("sdb", &[("sdb1", None, FAT)]);
        let got = choose(&[boot.clone(), good.clone(), fixed]).unwrap();
        assert_eq!(got.dev, "sdb1");
        assert_eq!(got.disk, "sdb");
        // Without a partition table: the whole disk.
        let mut floppy = stick("sdd", &[]);
        floppy.whole = Fs::Fat(FatKind::Fat16);
        assert_eq!(choose(&[floppy]).unwrap().dev, "sdd");
    }

    #[test]
    fn refusals_say_each_disk() {
        assert!(choose(&[])
            .unwrap_err()
            .contains("no USB stick is attached"));
        let labelled = stick("sda", &[("sda1", Some("perm"), FAT)]);
        let two = stick("sdb", &[("sdb1", None, FAT), ("sdb2", None, FAT)]);
        let ext4 = stick("sdc", &[("sdc1", None, Fs::Other)]);
        let mut sata = stick("sdd", &[("sdd1", None, FAT)]);
        sata.usb = false;
        let bad = stick("sde", &[("sde1", None, Fs::Unreadable)]);
        let e = choose(&[labelled, two, ext4, sata, bad]).unwrap_err();
        for want in [
            "sda: a RiceGuard disk (partitions perm)",
            "sdb: 2 partitions",
            "sdc1: not a FAT file system",
            "sdd: not on USB",
            "sde1: could not be read",
        ] {
            assert!(e.contains(want), "{want} in {e}");
        }
        let a = stick("sdb", &[("sdb1", None, FAT)]);
        let b = stick("sdc", &[("sdc1", None, FAT)]);
        let e = choose(&[a, b]).unwrap_err();
        assert!(
            e.contains("several USB sticks qualify (sdb1 (FAT32), sdc1 (FAT32))"),
            "{e}"
        );
    }

    #[test]
    fn file_names() {
        let n = export_file_name("x86_64-generic", 1_796_355_000);
        assert_eq!(n, "riceguard-x86_64-generic-20261204T033000Z.age");
        assert!(is_export_name(&n));
        assert_eq!(name_time(&n), Some(1_796_355_000));
        assert_eq!(
            export_file_name("a/../b c", 0),
            "riceguard-abc-19700101T000000Z.age"
        );
        assert_eq!(
            export_file_name("", 0),
            "riceguard-box-19700101T000000Z.age"
        );
        assert_eq!(name_time("RICEGUARD-BOX-19700101T000000Z.AGE"), Some(0));
        for bad in [
            "riceguard-x-2026.age",
            "riceguard-x-20261304T000000Z.age",
            "x.age",
            "riceguard-+0261204T033000Z.age",
        ] {
            assert_eq!(name_time(bad), None, "{bad}");
        }
        assert!(!is_export_name("riceguard-.age"));
        assert!(!is_export_name("notes.txt"));
    }

    #[test]
    fn newest_by_name_time_then_mtime() {
        let e = |n: &str, m: Option<i64>| (n.to_string(), m);
        let list = vec![
            e("riceguard-b-20261204T033000Z.age", Some(10)),
            e("riceguard-a-20261205T000000Z.age", Some(5)),
            e("riceguard-manual.age", Some(1_900_000_000)),
            e("other.age", Some(2_000_000_000)),
        ];
        assert_eq!(newest_export(&list), Some("riceguard-manual.age"));
        assert_eq!(
            newest_export(&list[..2]),
            Some("riceguard-a-20261205T000000Z.age")
        );
        assert_eq!(newest_export(&list[3..]), None);
        assert_eq!(newest_export(&[]), None);
    }

    #[test]
    fn plain_names_only() {
        assert_eq!(plain_file_name("riceguard-x.age"), Ok("riceguard-x.age"));
        for bad in ["", "a/b", "..", ".", "a\\b", "a\nb", &"x".repeat(256)] {
            assert!(plain_file_name(bad).is_err(), "{bad:?}");
        }
    }
}
