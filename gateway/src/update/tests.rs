//! The whole update against a disk image file (root partitions at offsets) and an ESP
//! directory: good bundles land in the inactive slot, bad ones change no byte.
use super::*;
use crate::slots::{entry_tries, is_slot_entry, read_entries, uboot_plan, BootPath};
use crate::testutil::bundle::{make_bundle, manifest_for, slot_uki, test_key};
use ed25519_dalek::SigningKey;

const MIB: u64 = 1 << 20;
const ROOT_A: u64 = MIB;
const ROOT_B: u64 = 2 * MIB;
const ROOT_LEN: u64 = MIB;

struct FilePlatform {
    disk: PathBuf,
    esp: PathBuf,
    key: VerifyingKey,
    running: char,
    build: Option<u64>,
    /// The configuration schema the running firmware reports (`bundle::COMPAT` there).
    compat: u32,
}

impl Platform for FilePlatform {
    fn device_info(&self) -> Result<DeviceInfo, UpdateError> {
        Ok(DeviceInfo {
            board: "qemu-x86_64".into(),
            arch: "x86_64".into(),
            compat: self.compat,
            build: self.build,
        })
    }
    fn verifying_key(&self) -> Result<VerifyingKey, UpdateError> {
        Ok(self.key)
    }
    fn running_slot(&self) -> Result<char, UpdateError> {
        Ok(self.running)
    }
    fn root_region(&mut self, slot: char) -> Result<Region, UpdateError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.disk)
            .map_err(dev_err("disk"))?;
        Ok(Region {
            file,
            offset: if slot == 'a' { ROOT_A } else { ROOT_B },
            len: ROOT_LEN,
        })
    }
    fn esp_dir(&mut self) -> Result<PathBuf, UpdateError> {
        Ok(self.esp.clone())
    }
}

struct Fixture {
    dir: PathBuf,
    p: FilePlatform,
    key: SigningKey,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rg-update-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let esp = dir.join("esp");
        std::fs::create_dir_all(esp.join("loader/entries")).unwrap();
        std::fs::create_dir_all(esp.join("EFI/riceguard")).unwrap();
        std::fs::write(
            esp.join("loader/entries/riceguard-a.conf"),
            "title RiceGuard v1 (slot a)\nversion v1\nsort-key riceguard\nefi /EFI/riceguard/slot-a.efi\n",
        )
        .unwrap();
        std::fs::write(esp.join("EFI/riceguard/slot-a.efi"), b"uki v1").unwrap();
        // The disk: 4 MiB, root-a filled with 'A', root-b with 'B'.
        let disk = dir.join("disk.img");
        let mut d = vec![0u8; 4 * MIB as usize];
        d[ROOT_A as usize..(ROOT_A + ROOT_LEN) as usize].fill(b'A');
        d[ROOT_B as usize..(ROOT_B + ROOT_LEN) as usize].fill(b'B');
        std::fs::write(&disk, d).unwrap();
        let key = test_key(42);
        Fixture {
            p: FilePlatform {
                disk,
                esp,
                key: key.verifying_key(),
                running: 'a',
                build: Some(1),
                compat: 1,
            },
            dir,
            key,
        }
    }

    fn bundle(&self, name: &str, bytes: &[u8]) -> Source {
        let p = self.dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        Source::File(p)
    }

    /// Every byte the update may touch: the disk and each ESP file.
    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let mut v = vec![("disk".to_string(), std::fs::read(&self.p.disk).unwrap())];
        for sub in ["loader/entries", "EFI/riceguard"] {
            let mut names: Vec<_> = std::fs::read_dir(self.p.esp.join(sub))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            for n in names {
                v.push((n.display().to_string(), std::fs::read(&n).unwrap()));
            }
        }
        v
    }

    fn entry(&self, name: &str) -> String {
        std::fs::read_to_string(self.p.esp.join("loader/entries").join(name)).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn good_parts() -> (Vec<u8>, Vec<u8>) {
    let root: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let uki: Vec<u8> = (0..100_000u32).map(|i| (i * 13 % 241) as u8).collect();
    (root, uki)
}

#[test]
fn installs_into_the_inactive_slot() {
    let mut f = Fixture::new("good");
    let (root, uki) = good_parts();
    let m = manifest_for("qemu-x86_64", &root, &uki, "");
    let src = f.bundle("v2.bundle", &make_bundle(&f.key, &m, &root, &uki));
    let mut lines = Vec::new();
    let i = install(&mut f.p, &src, false, &mut |s| lines.push(s.to_string())).unwrap();
    assert_eq!((i.slot, i.version.as_str()), ('b', "v2"));
    assert_eq!(i.entry, "riceguard-b+3.conf");
    let disk = std::fs::read(&f.p.disk).unwrap();
    assert_eq!(
        &disk[ROOT_B as usize..ROOT_B as usize + root.len()],
        &root[..]
    );
    assert!(disk[ROOT_A as usize..(ROOT_A + ROOT_LEN) as usize]
        .iter()
        .all(|&b| b == b'A'));
    assert!(
        std::fs::read(f.p.esp.join("EFI/riceguard/slot-b.efi")).unwrap() == slot_uki(&uki, b'b')
    );
    assert!(!f.p.esp.join("EFI/riceguard/slot-b.efi.new").exists());
    let b = f.entry("riceguard-b+3.conf");
    assert!(b.contains("sort-key riceguard-0\n") && b.contains("efi /EFI/riceguard/slot-b.efi"));
    let a = f.entry("riceguard-a.conf");
    assert!(
        a.contains("sort-key riceguard-1\n") && !a.contains("sort-key riceguard\n"),
        "{a}"
    );
    assert!(lines.iter().any(|l| l.contains("read back")), "{lines:?}");
    // The U-Boot boot script reads the same entries: it tries b and counts it down.
    let plan = |f: &Fixture| uboot_plan(&read_entries(&f.p.esp)).map(|p| (p.slot, p.count_to));
    assert_eq!(plan(&f), Some(('b', Some("riceguard-b+2-1.conf".into()))));

    // Booted into b (marked good by init), update again: a is written, b stays.
    std::fs::rename(
        f.p.esp.join("loader/entries/riceguard-b+3.conf"),
        f.p.esp.join("loader/entries/riceguard-b.conf"),
    )
    .unwrap();
    f.p.running = 'b';
    let i = install(&mut f.p, &src, false, &mut |_| {}).unwrap();
    assert_eq!(i.slot, 'a');
    assert!(
        std::fs::read(f.p.esp.join("EFI/riceguard/slot-a.efi")).unwrap() == slot_uki(&uki, b'a')
    );
    assert!(!f.p.esp.join("loader/entries/riceguard-a.conf").exists());
    assert!(f
        .entry("riceguard-a+3.conf")
        .contains("sort-key riceguard-0"));
    assert!(f.entry("riceguard-b.conf").contains("sort-key riceguard-1"));
    assert_eq!(plan(&f), Some(('a', Some("riceguard-a+2-1.conf".into()))));

    // Manual rollback from a (running) to b.
    f.p.running = 'a';
    assert_eq!(rollback(&mut f.p, &mut |_| {}).unwrap(), 'b');
    assert_eq!(plan(&f), Some(('b', None)));
    assert!(f.entry("riceguard-b.conf").contains("sort-key riceguard-0"));
    assert!(f
        .entry("riceguard-a+3.conf")
        .contains("sort-key riceguard-1"));
}

#[test]
fn installs_over_http() {
    use std::io::Write as _;
    let mut f = Fixture::new("http");
    let (root, uki) = good_parts();
    let m = manifest_for("qemu-x86_64", &root, &uki, "");
    let b = make_bundle(&f.key, &m, &root, &uki);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 2048];
            let _ = c.read(&mut buf).unwrap();
            let _ = write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", b.len());
            let _ = c.write_all(&b);
        }
    });
    let src = Source::parse(&format!("http://127.0.0.1:{port}/v2.bundle")).unwrap();
    let i = install(&mut f.p, &src, false, &mut |_| {}).unwrap();
    assert_eq!(i.slot, 'b');
    t.join().unwrap();
}

#[test]
fn bad_bundles_change_nothing() {
    let mut f = Fixture::new("bad");
    let (root, uki) = good_parts();
    let good_m = manifest_for("qemu-x86_64", &root, &uki, "");
    let good = make_bundle(&f.key, &good_m, &root, &uki);
    let before = f.snapshot();
    let other = test_key(43);
    let big_root = vec![1u8; ROOT_LEN as usize + 1];
    let mut corrupt = good.clone();
    let last = corrupt.len() - 10;
    corrupt[last] ^= 0x40;
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"x");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "badsig",
            make_bundle(&other, &good_m, &root, &uki),
            "signature check failed",
        ),
        (
            "board",
            make_bundle(
                &f.key,
                &manifest_for("qemu-aarch64", &root, &uki, ""),
                &root,
                &uki,
            ),
            "board check failed",
        ),
        (
            "arch",
            make_bundle(
                &f.key,
                &good_m.replace("arch x86_64", "arch aarch64"),
                &root,
                &uki,
            ),
            "arch check failed",
        ),
        (
            "compat",
            make_bundle(
                &f.key,
                &good_m.replace("compat 1\nmin-compat 1", "compat 3\nmin-compat 2"),
                &root,
                &uki,
            ),
            "compatibility check failed",
        ),
        ("truncated", good[..good.len() - 1000].to_vec(), "truncated"),
        ("header-cut", good[..40].to_vec(), "truncated"),
        ("corrupt", corrupt, "hash check failed: part uki-b"),
        ("trailing", trailing, "extra bytes"),
        (
            "oversized",
            make_bundle(
                &f.key,
                &manifest_for("qemu-x86_64", &big_root, &uki, ""),
                &big_root,
                &uki,
            ),
            "size check failed: part root",
        ),
        (
            "garbage",
            b"not a bundle at all, just text".to_vec(),
            "bad magic",
        ),
    ];
    for (name, bytes, want) in cases {
        let src = f.bundle(&format!("{name}.bundle"), &bytes);
        let e = install(&mut f.p, &src, false, &mut |_| {}).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        assert!(msg.contains("nothing written"), "{name}: {msg}");
        assert!(f.snapshot() == before, "{name} changed the disk or the ESP");
    }
}

/// Seeded random corruption of a good bundle: refused or (if only padding moved) never a
/// partial write; never a panic.
#[test]
fn seeded_corruption_never_half_installs() {
    let mut f = Fixture::new("fuzz");
    let root = vec![7u8; 5000];
    let uki = vec![9u8; 3000];
    let m = manifest_for("qemu-x86_64", &root, &uki, "");
    let good = make_bundle(&f.key, &m, &root, &uki);
    let before = f.snapshot();
    let mut rng = crate::testutil::Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..200 {
        let s = rng.next();
        let mut b = good.clone();
        let at = (s as usize) % b.len();
        b[at] ^= 1 << ((s >> 32) % 8);
        if i % 5 == 0 {
            b.truncate(at);
        }
        let src = f.bundle("fz.bundle", &b);
        assert!(
            install(&mut f.p, &src, false, &mut |_| {}).is_err(),
            "mutation {i} at {at} accepted"
        );
        assert!(f.snapshot() == before, "mutation {i} changed the disk");
    }
}

#[test]
fn entry_names_and_boot_report() {
    assert_eq!(entry_tries("riceguard-b+3.conf"), Some((3, 0)));
    assert_eq!(entry_tries("riceguard-b+2-1.conf"), Some((2, 1)));
    assert_eq!(entry_tries("riceguard-b+0-3.conf"), Some((0, 3)));
    assert_eq!(entry_tries("riceguard-b.conf"), None);
    assert!(is_slot_entry("RICEGUARD-B+0-3.CONF", 'b'));
    assert!(!is_slot_entry("riceguard-bx.conf", 'b'));
    assert!(!is_slot_entry("riceguard-a.conf", 'b'));
    assert_eq!(
        cmdline_slot("console=ttyS0 riceguard.slot=b quiet"),
        Some('b')
    );
    assert_eq!(cmdline_slot("riceguard.slot=c"), None);

    let f = Fixture::new("report");
    let e = f.p.esp.join("loader/entries");
    std::fs::write(e.join("riceguard-b+0-3.conf"), "title x\n").unwrap();
    let r = boot_report(&f.p.esp, 'a');
    assert!(
        r.iter()
            .any(|l| l.starts_with("slot a booted from its good entry")),
        "{r:?}"
    );
    assert!(r.iter().any(|l| l.starts_with("FALLBACK: slot b")), "{r:?}");
    std::fs::rename(e.join("riceguard-a.conf"), e.join("riceguard-a+2-1.conf")).unwrap();
    let r = boot_report(&f.p.esp, 'a');
    assert!(
        r.iter()
            .any(|l| l.contains("on trial") && l.contains("2 tries left")),
        "{r:?}"
    );
    // Which path booted: the U-Boot script says so; systemd-boot on U-Boot firmware
    // cannot count a trial and is called out; on EDK2 it is not.
    let ub = BootPath::UbootScript {
        slot: 'a',
        entry: "riceguard-a+2-1.conf".into(),
    };
    let r = boot_report_with(&f.p.esp, 'a', &ub);
    assert!(
        r[0].starts_with("booted by the U-Boot boot script: slot a from riceguard-a+2-1.conf"),
        "{r:?}"
    );
    let sd = |fw: &str| BootPath::SystemdBoot {
        loader: "systemd-boot 254".into(),
        firmware: fw.into(),
    };
    let r = boot_report_with(&f.p.esp, 'a', &sd("Das U-Boot 8215.1"));
    assert!(
        r.iter()
            .any(|l| l.starts_with("WARNING: systemd-boot on U-Boot cannot count")),
        "{r:?}"
    );
    let r = boot_report_with(&f.p.esp, 'a', &sd("EDK II 65536.0"));
    assert!(!r.iter().any(|l| l.starts_with("WARNING")), "{r:?}");
}

#[test]
fn rollback_needs_the_other_slot() {
    let mut f = Fixture::new("rb");
    let e = rollback(&mut f.p, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("no boot entry"), "{e}");
    // A counted-out slot gets one more try when rolled back to by hand.
    let d = f.p.esp.join("loader/entries");
    std::fs::write(
        d.join("riceguard-b+0-3.conf"),
        "title x\nsort-key riceguard-1\n",
    )
    .unwrap();
    assert_eq!(rollback(&mut f.p, &mut |_| {}).unwrap(), 'b');
    assert!(f
        .entry("riceguard-b+1.conf")
        .contains("sort-key riceguard-0"));
}

/// A bundle must carry a build number greater than the running slot's; an equal, older or
/// missing one (bundles made before build numbers count as 0) is refused with nothing
/// written, unless the downgrade is allowed.
#[test]
fn downgrade_refused_unless_allowed() {
    let mut f = Fixture::new("downgrade");
    let (root, uki) = good_parts();
    let m2 = manifest_for("qemu-x86_64", &root, &uki, "");
    let before = f.snapshot();
    f.p.build = Some(2);
    for (name, m) in [
        ("same", m2.clone()),
        ("older", m2.replace("build 2\n", "build 1\n")),
        ("unnumbered", m2.replace("build 2\n", "")),
    ] {
        let src = f.bundle(
            &format!("{name}.bundle"),
            &make_bundle(&f.key, &m, &root, &uki),
        );
        let e = install(&mut f.p, &src, false, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nothing written: downgrade check failed") && e.contains("allow-downgrade"),
            "{name}: {e}"
        );
        assert!(f.snapshot() == before, "{name} changed the disk or the ESP");
    }
    // An unreadable running build refuses too.
    f.p.build = None;
    let src = f.bundle("v2.bundle", &make_bundle(&f.key, &m2, &root, &uki));
    assert!(install(&mut f.p, &src, false, &mut |_| {}).is_err());
    assert!(f.snapshot() == before);
    // The user allows it: installed, and the log says it was a downgrade.
    f.p.build = Some(2);
    let old = m2.replace("build 2\n", "build 1\n");
    let src = f.bundle("v1.bundle", &make_bundle(&f.key, &old, &root, &uki));
    let mut lines = Vec::new();
    let i = install(&mut f.p, &src, true, &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(i.slot, 'b');
    assert!(
        lines.iter().any(|l| l.contains("DOWNGRADE allowed")),
        "{lines:?}"
    );
    // A newer one needs nothing special.
    f.p.build = Some(1);
    let src = f.bundle("v2.bundle", &make_bundle(&f.key, &m2, &root, &uki));
    let mut lines = Vec::new();
    install(&mut f.p, &src, false, &mut |l| lines.push(l.to_string())).unwrap();
    assert!(!lines.iter().any(|l| l.contains("DOWNGRADE")), "{lines:?}");
}

#[test]
fn build_file() {
    use std::io::{Error, ErrorKind};
    assert_eq!(
        parse_build_file(Ok("1732982400\n".into())),
        Ok(1_732_982_400)
    );
    assert_eq!(
        parse_build_file(Err(Error::from(ErrorKind::NotFound))),
        Ok(0)
    );
    assert!(parse_build_file(Ok("v2\n".into())).is_err());
    assert!(parse_build_file(Ok(String::new())).is_err());
    assert!(parse_build_file(Err(Error::from(ErrorKind::PermissionDenied))).is_err());
}

/// If the new entry cannot be written, the running slot's entry is untouched: it is only
/// rewritten (to sort second) once the new entry exists, so a failure or power cut in
/// between never leaves the ESP without an entry that sorts first and boots.
#[test]
fn running_entry_untouched_until_the_new_entry_exists() {
    let mut f = Fixture::new("order");
    let (root, uki) = good_parts();
    let m = manifest_for("qemu-x86_64", &root, &uki, "");
    let src = f.bundle("v2.bundle", &make_bundle(&f.key, &m, &root, &uki));
    let entries = f.p.esp.join("loader/entries");
    let a_before = f.entry("riceguard-a.conf");
    // Writing riceguard-b+3.conf fails: its temporary name is taken by a non-empty
    // directory (both the store's name and the one an older updater used).
    for t in [".riceguard-b+3.conf.tmp", "riceguard-b+3.tmp"] {
        std::fs::create_dir_all(entries.join(t).join("x")).unwrap();
    }
    let e = install(&mut f.p, &src, false, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("riceguard-b+3.conf"), "{e}");
    assert_eq!(
        f.entry("riceguard-a.conf"),
        a_before,
        "running entry rewritten"
    );
    assert!(!entries.join("riceguard-b+3.conf").exists());
    for t in [".riceguard-b+3.conf.tmp", "riceguard-b+3.tmp"] {
        std::fs::remove_dir_all(entries.join(t)).unwrap();
    }
    install(&mut f.p, &src, false, &mut |_| {}).unwrap();
    assert!(f.entry("riceguard-a.conf").contains("sort-key riceguard-1"));
    assert!(f
        .entry("riceguard-b+3.conf")
        .contains("sort-key riceguard-0"));
    let stray: Vec<_> = std::fs::read_dir(&entries)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

/// The update from today's firmware (schema 1) to this one (schema 2) and back: this
/// firmware's bundles (compat COMPAT, min-compat MIN_COMPAT, as image/bundle.sh makes
/// them) install on a schema-1 device and on a schema-2 one; on a schema-2 device a
/// bundle of schema 1 only is refused with nothing written, even as an allowed
/// downgrade: the previous slot (`rollback-slot`) is the way back, and it reads the
/// saved configuration (see `console::store` tests, `schema1_firmware_reads_...`).
#[test]
fn schema_1_devices_take_this_firmware() {
    use crate::core::bundle::{COMPAT, MIN_COMPAT};
    let mut f = Fixture::new("schema");
    let (root, uki) = good_parts();
    let m = manifest_for("qemu-x86_64", &root, &uki, "").replace(
        "compat 1\nmin-compat 1",
        &format!("compat {COMPAT}\nmin-compat {MIN_COMPAT}"),
    );
    let src = f.bundle("v2.bundle", &make_bundle(&f.key, &m, &root, &uki));
    assert_eq!(f.p.compat, 1);
    let i = install(&mut f.p, &src, false, &mut |_| {}).unwrap();
    assert_eq!(i.slot, 'b');
    // Now running the new firmware in b (marked good).
    std::fs::rename(
        f.p.esp.join("loader/entries/riceguard-b+3.conf"),
        f.p.esp.join("loader/entries/riceguard-b.conf"),
    )
    .unwrap();
    f.p.running = 'b';
    f.p.compat = COMPAT;
    let old_m = manifest_for("qemu-x86_64", &root, &uki, "");
    let old = f.bundle("v1.bundle", &make_bundle(&f.key, &old_m, &root, &uki));
    let before = f.snapshot();
    let e = install(&mut f.p, &old, true, &mut |_| {}).unwrap_err();
    assert!(
        e.to_string().contains("compatibility check failed")
            && e.to_string().contains(&format!("this device has {COMPAT}")),
        "{e}"
    );
    assert!(f.snapshot() == before, "a refused bundle wrote something");
    // The way back: the previous slot, still there.
    assert_eq!(rollback(&mut f.p, &mut |_| {}).unwrap(), 'a');
    assert!(f.entry("riceguard-a.conf").contains("sort-key riceguard-0"));
}
