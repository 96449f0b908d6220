//! The slot policy on data: GPTs built in memory, entry names and texts.

use super::*;
use crate::testutil::{efivar_bytes as efivar, gpt_disk as gpt, part_guid as guid};

#[test]
fn gpt_guids_and_efivar() {
    // The ESP type GUID as it lies on disk.
    let esp = [
        0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9,
        0x3B,
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
    // with_sort_key keeps it last whatever order the file had.
    let t = with_sort_key("title x\nsort-key riceguard-1\nefi /x.efi\n", "riceguard-0");
    assert_eq!(t, "title x\nefi /x.efi\nsort-key riceguard-0\n");
    assert_eq!(sort_key_digit(t.as_bytes()), Some(0));
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
    let plan =
        |e: &[(String, Vec<u8>)]| uboot_plan(e).map(|p| (p.slot, p.entry, p.count_to, p.exhausted));
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
fn boot_var_text() {
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

#[test]
fn boot_disk_and_choice_without_io() {
    let part = |name: &str, disk: &str, number: u32, label: &str| Part {
        name: name.into(),
        disk: disk.into(),
        number,
        label: Some(label.into()),
    };
    let parts = [
        part("vda4", "vda", 4, "perm"),
        part("sda4", "sda", 4, "perm"),
        part("sda2", "sda", 2, "root-a"),
    ];
    // The loader's disk wins over the running root; no disk: wait; duplicates: no help.
    let b = boot_disk(LoaderSays::Disk("vda".into()), Some("sda".into())).unwrap();
    assert_eq!(b.as_ref().map(|b| b.disk.as_str()), Some("vda"));
    let r = boot_disk(LoaderSays::Several, Some("sda".into())).unwrap();
    assert_eq!(r.as_ref().map(|b| b.disk.as_str()), Some("sda"));
    assert!(boot_disk(LoaderSays::Nowhere("G".into()), None).is_err());
    assert_eq!(boot_disk(LoaderSays::Several, None), Ok(None));
    let never = |_: &str| -> bool { panic!("fixed asked with a known boot disk") };
    let f = choose(&parts, "perm", b.as_ref(), Ambiguous::Refuse, never).unwrap();
    assert_eq!(f.dev, "/dev/vda4");
    assert!(
        choose(&parts, "root-a", b.as_ref(), Ambiguous::Refuse, never)
            .unwrap_err()
            .contains("ignoring the one(s) on sda")
    );
    // Unknown boot disk: one disk has it, or several and the policy decides.
    assert_eq!(
        choose(&parts, "root-a", None, Ambiguous::Refuse, |_| true)
            .unwrap()
            .dev,
        "/dev/sda2"
    );
    assert!(choose(&parts, "perm", None, Ambiguous::Refuse, |_| true).is_err());
    let f = choose(&parts, "perm", None, Ambiguous::PreferFixed, |d| d == "vda").unwrap();
    assert_eq!(f.dev, "/dev/vda4");
    let f = choose(&parts, "perm", None, Ambiguous::PreferFixed, |_| true).unwrap();
    assert_eq!(f.dev, "/dev/sda4", "several fixed: the first by name");
    assert!(choose(&parts, "esp", None, Ambiguous::PreferFixed, |_| true).is_err());
}
