//! Rollback safety: a `/perm` written by the firmware before `perm/` existed
//! (`gateway/tests/fixtures/perm/`, see its README) is read by today's parsers and
//! written back by today's writers byte for byte and mode for mode; and no file but
//! `perm/mod.rs` names a `/perm` path.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::config::Format;
use super::*;
use crate::core::clock::SavedTime;
use crate::testutil::TempDir;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/perm")
}

fn bytes(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The mode the previous firmware wrote `name` with (fixtures' `MODES`).
fn old_mode(name: &str) -> u32 {
    let modes = std::fs::read_to_string(fixtures().join("MODES")).unwrap();
    let line = modes
        .lines()
        .find(|l| l.split_once(' ').is_some_and(|(_, n)| n == name))
        .unwrap_or_else(|| panic!("{name} not in MODES"));
    u32::from_str_radix(line.split_once(' ').unwrap().0, 8).unwrap()
}

/// `name` as written in `new` is the fixture, in bytes and mode.
fn same(new: &Path, name: &str) {
    let old = fixtures();
    assert_eq!(
        String::from_utf8_lossy(&bytes(new, name)),
        String::from_utf8_lossy(&bytes(&old, name)),
        "{name}: bytes"
    );
    assert_eq!(
        format!("{:o}", mode(&new.join(name))),
        format!("{:o}", old_mode(name)),
        "{name}: mode"
    );
}

#[test]
fn saved_configuration_and_history_round_trip() {
    let old = fixtures();
    let loaded = config::load(&old, &config::Ini);
    assert_eq!(loaded.warning, None, "the saved file loads");
    let text = String::from_utf8(bytes(&old, "riceguard.conf")).unwrap();
    assert!(
        text.contains("\n#+ ") && text.contains("\n#3+ "),
        "the fixture has guarded lines"
    );
    // Written back the same, settings and guarded lines byte for byte; only the note at
    // the top changed since (it names schema 4's `#4+` lines now).
    let body = |t: &str| {
        t.lines()
            .skip_while(|l| l.starts_with("# "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let again = config::Ini.emit_saved(&loaded.config);
    assert_eq!(body(&again), body(&text));
    assert!(again.starts_with(crate::core::ini::COMPAT_NOTE), "{again}");
    // Firmware of schema 1 still loads it (its `#+`/`#3+` lines are comments there).
    assert!(crate::core::ini::parse_as_schema1("riceguard.conf", &text).is_ok());
    let h1 = config::history(&old, &config::Ini, 1).unwrap();
    let h1_text = String::from_utf8(bytes(&old, "history/riceguard.conf.1")).unwrap();
    assert_eq!(body(&config::Ini.emit_saved(&h1)), body(&h1_text));

    let new = TempDir::new("perm-conf");
    config::save_text(&new.0, &h1_text).unwrap();
    config::save_text(&new.0, &text).unwrap();
    same(&new.0, "riceguard.conf");
    same(&new.0, "history/riceguard.conf.1");
    assert_eq!(config::read_text(&new.0), text);
}

#[test]
fn password_files_round_trip() {
    use crate::console::password::{legacy, well_formed};
    let old = fixtures();
    let line = match password::read(&old, password::PASSWD_ARGON2ID, true, well_formed) {
        password::Password::Set(l) => l,
        other => panic!("{other:?}"),
    };
    // The previous firmware's file still reads as it did (never written again).
    assert!(matches!(
        password::read(&old, password::PASSWD, true, legacy::well_formed),
        password::Password::Set(_)
    ));
    let new = TempDir::new("perm-pw");
    std::fs::copy(old.join(password::PASSWD), new.0.join(password::PASSWD)).unwrap();
    password::write(&new.0, Some(&line)).unwrap();
    same(&new.0, password::PASSWD_ARGON2ID);
    assert!(!new.0.join(password::PASSWD).exists());
}

#[test]
fn commit_confirm_records_round_trip() {
    let old = fixtures();
    let new = TempDir::new("perm-confirm");
    let d = confirm::pending(&old).unwrap();
    confirm::set_pending(&new.0, Some(d)).unwrap();
    same(&new.0, confirm::CONFIRM);
    let b = confirm::pending_boot(&old).unwrap();
    confirm::set_pending_boot(&new.0, &b).unwrap();
    same(&new.0, confirm::CONFIRM_BOOT);
    let o = confirm::owner(&old).unwrap();
    confirm::set_owner(&new.0, &o).unwrap();
    same(&new.0, confirm::CONFIRM_OWNER);
    let (how, by) = confirm::settled(&old).unwrap();
    let settled = String::from_utf8(bytes(&old, confirm::CONFIRM_SETTLED)).unwrap();
    let unix: u64 = settled.split_whitespace().nth(2).unwrap().parse().unwrap();
    confirm::set_settled(&new.0, &how, &by, unix);
    same(&new.0, confirm::CONFIRM_SETTLED);
    let saved = bytes(&old, config::CONF);
    let c = confirm::committed_by(&old, &saved).unwrap();
    assert_eq!(c.source, None, "the fixture's record has three fields");
    confirm::record_commit(
        &new.0,
        &c.name,
        None,
        c.unix,
        std::str::from_utf8(&saved).unwrap(),
    );
    same(&new.0, confirm::COMMITTED_BY);
}

/// An SSH session's commit records its source as a fourth field: read back here, and
/// the fields before it are the old record's, so a reader that takes three (the firmware
/// before it) still names the console.
#[test]
fn committed_by_keeps_an_ssh_sessions_source() {
    let d = TempDir::new("perm-committed-by");
    let text = "[Interface]\nListenPort = 1\n";
    let src: std::net::IpAddr = "192.168.77.10".parse().unwrap();
    confirm::record_commit(&d.0, "ssh-17:alice", Some(src), 1_700_000_000, text);
    let c = confirm::committed_by(&d.0, text.as_bytes()).unwrap();
    assert_eq!(
        (c.name.as_str(), c.unix, c.source),
        ("ssh-17:alice", 1_700_000_000, Some(src))
    );
    let line = std::fs::read_to_string(d.0.join(confirm::COMMITTED_BY)).unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (w[0], w[1], w.len()),
        ("ssh-17:alice", "1700000000", 4),
        "{line}"
    );
    assert!(confirm::committed_by(&d.0, b"another text").is_none());
}

#[test]
fn client_keys_clock_boots_and_update_request_round_trip() {
    let old = fixtures();
    let new = TempDir::new("perm-misc");
    let k = clients::key(&old, "phone").unwrap();
    assert_eq!(clients::names(&old), ["phone"]);
    clients::set_key(&new.0, "phone", Some(&k)).unwrap();
    same(&new.0, "clients/phone.key");
    assert_eq!(mode(&new.0.join(clients::CLIENTS)), 0o700);

    let rec: SavedTime = clock::read_saved(&old.join(clock::SAVED)).unwrap();
    assert!(rec.agreed.is_some());
    clock::write(&new.0.join(clock::SAVED), &rec).unwrap();
    same(&new.0, clock::SAVED);

    let n = boot_log::parse(&String::from_utf8(bytes(&old, boot_log::BOOTS)).unwrap());
    assert_eq!(n, 7);
    std::fs::create_dir_all(new.0.join("log")).unwrap();
    std::fs::write(new.0.join(boot_log::BOOTS), boot_log::text(n - 1)).unwrap();
    let (counted, written) = boot_log::count_boot(&new.0);
    written.unwrap();
    assert_eq!(counted, n);
    same(&new.0, boot_log::BOOTS);

    let req = bytes(&old, update::REQUEST);
    std::fs::write(new.0.join(update::REQUEST), &req).unwrap();
    assert_eq!(
        update::take(&new.0).unwrap(),
        ["http://192.0.2.1:8080/riceguard.bundle"]
    );
    assert!(!new.0.join(update::REQUEST).exists());
    assert_eq!(bytes(&new.0, update::DONE), req);
    assert_eq!(update::take(&new.0), None, "taken once");
}

/// Every file in the fixtures is one this folder reads (a new file on perm gets a
/// fixture and a round trip here).
#[test]
fn fixtures_cover_every_file() {
    let modes = std::fs::read_to_string(fixtures().join("MODES")).unwrap();
    let names: Vec<&str> = modes
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|x| x.1)
        .collect();
    let known = [
        confirm::COMMITTED_BY,
        confirm::CONFIRM_SETTLED,
        "clients/phone.key",
        clock::SAVED,
        confirm::CONFIRM,
        confirm::CONFIRM_BOOT,
        confirm::CONFIRM_OWNER,
        password::PASSWD_ARGON2ID,
        password::PASSWD,
        "history/riceguard.conf.1",
        boot_log::BOOTS,
        config::CONF,
        update::REQUEST,
    ];
    let mut a = names.clone();
    let mut b = known.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("a source folder is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Lines of the Rust files under `roots` (but `except`) holding a string literal that
/// begins with `dir`, as `file:line`.
fn literals(dir: &str, roots: &[PathBuf], except: &Path) -> Vec<String> {
    // Built, so this file does not hold what it looks for.
    let needle = format!("{}{}", '"', dir);
    let mut files = Vec::new();
    for r in roots {
        rust_files(r, &mut files);
    }
    let mut found = Vec::new();
    for f in files.iter().filter(|f| f.as_path() != except) {
        let src = std::fs::read_to_string(f).unwrap();
        for (i, line) in src.lines().enumerate() {
            if line.contains(&needle) {
                found.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    found
}

#[test]
fn perm_paths_are_named_only_in_perm_mod() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR"));
    let roots = [m.join("src"), m.join("core/src"), m.join("sys/src")];
    let found = literals(DIR, &roots, &m.join("src/perm/mod.rs"));
    assert!(
        found.is_empty(),
        "a /perm path outside perm/mod.rs (name it there, once): {found:?}"
    );
    // The check sees one: perm/mod.rs itself has them.
    assert!(!literals(DIR, &[m.join("src/perm")], Path::new("")).is_empty());
}

/// The image's read-only files are named once too, in `image_paths.rs`.
#[test]
fn image_paths_are_named_only_in_image_paths() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR"));
    let roots = [m.join("src"), m.join("core/src"), m.join("sys/src")];
    // The folder of the image's files, from the one place that names it.
    let etc = Path::new(crate::image_paths::BOARD_CONF).parent().unwrap();
    let etc = etc.to_str().unwrap();
    let found = literals(etc, &roots, &m.join("src/image_paths.rs"));
    assert!(
        found.is_empty(),
        "an /etc/riceguard path outside image_paths.rs (name it there, once): {found:?}"
    );
    assert!(!literals(etc, &[m.join("src")], Path::new("")).is_empty());
}
