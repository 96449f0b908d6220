//! Disk and boot-loader facts: partitions found by GPT label, and marking a boot good
//! by renaming the systemd-boot entry this slot booted from (`riceguard-a+2-1.conf` ->
//! `riceguard-a.conf`: an entry without a `+` counter is never counted down again).

use std::path::Path;

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
    let prefix = format!("riceguard-{slot}+");
    names.into_iter().find_map(|n| {
        let l = n.to_ascii_lowercase();
        (l.starts_with(&prefix) && l.ends_with(".conf"))
            .then(|| (n, format!("riceguard-{slot}.conf")))
    })
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
    crate::store::rename(&dir.join(from), &dir.join(&to))?;
    crate::sys::os::sync();
    Ok(Marked::Renamed {
        from: from.to_string(),
        to,
    })
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
