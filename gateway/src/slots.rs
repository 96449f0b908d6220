//! The A/B slot layout on disk, shared by init (mounting, marking a boot good) and the
//! updater (installing into the other slot, rollback): partitions found by GPT label,
//! and the systemd-boot entries of the two slots — their names (`riceguard-a.conf`, or
//! `riceguard-a+2-1.conf` while on trial: tries left and done), text and sort keys.
//! Marking a boot good renames the counted entry this slot booted from to the plain
//! name; an entry without a `+` counter is never counted down again.

use std::io;
use std::path::Path;

use crate::store;

/// The block device (`/dev/vda2`) whose GPT partition name is `label`, from sysfs uevents.
pub fn find_partition(label: &str) -> Option<String> {
    let rd = std::fs::read_dir("/sys/class/block").ok()?;
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for n in names {
        let Ok(ue) = std::fs::read_to_string(format!("/sys/class/block/{n}/uevent")) else {
            continue;
        };
        if uevent_partname(&ue) == Some(label) {
            return Some(format!("/dev/{n}"));
        }
    }
    None
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

pub fn entry_text(version: &str, slot: char, sort_key: &str) -> String {
    format!(
        "title RiceGuard {version} (slot {slot})\nversion {version}\nsort-key {sort_key}\nefi /EFI/riceguard/slot-{slot}.efi\n"
    )
}

/// Set `sort-key` of an entry file (added when missing), keeping the other lines.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
