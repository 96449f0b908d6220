//! The A/B slot layout on disk, shared by init (mounting, marking a boot good) and the
//! updater (installing into the other slot, rollback): partitions found by GPT label on
//! the boot disk only, and the systemd-boot entries of the two slots — their names
//! (`riceguard-a.conf`, or `riceguard-a+2-1.conf` while on trial: tries left and done),
//! text and sort keys. Marking a boot good renames the counted entry this slot booted
//! from to the plain name; an entry without a `+` counter is never counted down again.
//! The policy, with no I/O (GPT parsing, [`choose_among`], entry names, [`uboot_plan`],
//! [`parse_boot_var`]), is `core::slots`'s; this file reads the disks, sysfs, efivarfs
//! and the ESP, passes what it read in, and writes the entries.
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

use crate::durable;

// The policy half (no I/O) is the core's; what it decides is used through this module.
pub use crate::core::slots::{
    choose as choose_among, counted_entry, efivar_text, entry_text, entry_tries,
    gpt_partition_guids, guid_text, is_slot_entry, parse_boot_var, sort_key_digit,
    uboot_entry_name, uboot_plan, uevent_partname, Ambiguous, BootDisk, BootPath, Found,
    LoaderSays, Part, UbootEntry, UbootPlan, RICEGUARD_GUID, UBOOT_MAX_TRIES,
};
use crate::core::slots::{efivar_utf16, with_sort_key, LOADER_GUID};

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

/// The first bytes of a disk, enough for its GPT (header and 128 entries).
fn read_disk_start(path: &Path) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(64 * 1024).read_to_end(&mut buf);
    }
    buf
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
    crate::core::slots::boot_disk(loader_disk(sys, parts), running_root)
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

/// [`choose_among`] the partitions of `sys`, asking `sys` which disks are fixed.
pub fn choose(
    sys: &Sys,
    parts: &[Part],
    label: &str,
    boot: Option<&BootDisk>,
    policy: Ambiguous,
) -> Result<Found, String> {
    choose_among(parts, label, boot, policy, |d| fixed_disk(sys, d))
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
    durable::rename(&dir.join(from), &dir.join(&to))?;
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

/// Set `sort-key` of an entry file, as its last line (see [`entry_text`]), keeping the
/// other lines.
pub fn set_sort_key(path: &Path, key: &str) -> io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    durable::write(path, with_sort_key(&text, key).as_bytes(), durable::PUBLIC)
}

/// Whether `slot` booted from a boot-counted entry (not yet marked good).
pub fn slot_on_trial(esp: &Path, slot: char) -> bool {
    slot_entries(esp, slot)
        .unwrap_or_default()
        .iter()
        .any(|n| entry_tries(n).is_some())
}

/// [`BootPath`] from the variables in `efivars` (`/sys/firmware/efi/efivars`).
pub fn boot_path(efivars: &Path) -> BootPath {
    let var = |name: &str, guid: &str| std::fs::read(efivars.join(format!("{name}-{guid}"))).ok();
    if let Some((slot, entry)) =
        var("RiceGuardBoot", RICEGUARD_GUID).and_then(|b| parse_boot_var(&b))
    {
        return BootPath::UbootScript { slot, entry };
    }
    let utf16 = |b: Vec<u8>| efivar_utf16(&b);
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
    use crate::core::testutil::{efivar_bytes as efivar, gpt_disk as gpt, part_guid as guid};
    use crate::testutil::TempDir;
    use std::os::unix::fs::symlink;

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

    #[test]
    fn set_sort_key_rewrites_the_file_with_the_key_last() {
        let d = TempDir::new("sortkey");
        let p = d.0.join("e.conf");
        std::fs::write(&p, "title x\nsort-key riceguard-1\nefi /x.efi\n").unwrap();
        set_sort_key(&p, "riceguard-0").unwrap();
        assert_eq!(sort_key_digit(&std::fs::read(&p).unwrap()), Some(0));
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
    }
}
