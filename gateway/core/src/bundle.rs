//! Update bundle format: the signed header (manifest) and the checks that decide whether a
//! bundle may be installed on this device. Sans-IO: callers feed bytes, the streaming of
//! the parts and their hashing is `update/`'s job.
//!
//! Layout (integers little-endian):
//!
//! | offset | size | content |
//! |---|---|---|
//! | 0 | 8 | magic `RGBUNDL1` |
//! | 8 | 4 | manifest length M (at most [`MAX_MANIFEST`]) |
//! | 12 | 64 | ed25519 signature of the M manifest bytes |
//! | 76 | M | manifest, UTF-8 text, one `key value` per line |
//! | 76+M | ... | the parts, in manifest order, back to back, nothing after |
//!
//! Manifest keys: `format 1`, `board B`, `arch A`, `version V`, `build N`, `compat N`,
//! `min-compat N`, and per part `part NAME SIZE SHA256HEX` with NAME `root` (the
//! squashfs root), `uki-a` and `uki-b` (the unified kernel images of the two slots: they
//! differ only in the `riceguard.slot=` baked into their command line, and the device
//! installs the one of the slot it writes). Only the manifest is signed; each part is
//! bound to it by its sha256 and size.
//!
//! `build` is the monotonic build number (a u64; `image/build.sh` uses `RG_BUILD`, by
//! default the commit time). It is signed with the rest of the manifest, and a device
//! refuses a bundle whose build is not greater than the running slot's
//! (`/etc/riceguard/build` in its root) unless the user allows a downgrade: an older
//! bundle, although signed by us, is old firmware with its old bugs, and over plain HTTP
//! anyone on the path could offer one. A bundle without `build` (made before build numbers
//! existed) counts as build 0: refused as a downgrade by default, installable on purpose
//! with `allow-downgrade` (it is still ours, and going back to a known release is a
//! legitimate choice).
use core::fmt;

use ed25519_dalek::{Signature, VerifyingKey};

pub const MAGIC: &[u8; 8] = b"RGBUNDL1";
/// Bytes before the manifest: magic, length, signature.
pub const HEADER_LEN: usize = 8 + 4 + 64;
pub const MAX_MANIFEST: usize = 16 * 1024;
/// No part of a bundle is bigger than this (root partitions and UKIs are far smaller).
pub const MAX_PART: u64 = 1 << 30;
/// The perm/configuration schema this firmware reads and writes (see flash-scripts/README.md,
/// "compat"): what the device reports to an update. 2 added `Firewall` and `Masquerade` in
/// `[Gateway]`, `Masquerade` and `Enabled` per `[Peer]`, saved on `#+` lines; 3 added
/// `Ntp` and `UplinkOverlap`, saved on `#3+` lines; 4 added `SshKey` and `SshPort`, saved
/// on `#4+` lines; 5 added `Metrics`, `MetricsPort` and `Syslog`, saved on `#5+` lines; 6
/// added `ClientIsolation`, `Dns` and `Domain`, saved on `#6+` lines, and `[Peer] Access`,
/// whose peer is saved wholly on `#6+` lines. Firmware of an earlier schema reads
/// those lines as comments (`core::ini::emit_compat`), so the previous slot still loads
/// the file after a rollback. Equal to `core::ini::SCHEMA`. `image/bundle.sh` reads this line.
pub const COMPAT: u32 = 6;
/// The oldest schema this firmware reads (its bundles' `min-compat`, so a device of that
/// schema takes the update): a schema-1 or schema-2 file is a valid schema-3 file,
/// nothing to migrate. `image/bundle.sh` reads this line.
pub const MIN_COMPAT: u32 = 1;
/// The parts every bundle has.
pub const PART_NAMES: [&str; 3] = ["root", "uki-a", "uki-b"];

/// Why a bundle was refused. Every check runs before anything is written.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BundleError {
    /// Shorter than its header says (download cut, file truncated).
    Truncated {
        want: u64,
        got: u64,
    },
    /// Bytes after the last part.
    TrailingData,
    BadMagic,
    ManifestTooLong(usize),
    /// The signature does not verify with the device's update key.
    BadSignature,
    /// The manifest is signed but unreadable (line number, what is wrong).
    Manifest(usize, String),
    WrongBoard {
        bundle: String,
        device: String,
    },
    WrongArch {
        bundle: String,
        device: String,
    },
    Incompatible {
        min: u32,
        max: u32,
        device: u32,
    },
    /// Not newer than the running slot (`running` is `None` when its build number is
    /// unreadable) and no downgrade was allowed.
    Downgrade {
        version: String,
        bundle: Option<u64>,
        running: Option<u64>,
    },
    PartTooBig {
        part: String,
        size: u64,
        limit: u64,
    },
    /// A part's sha256 differs from the manifest (corrupted body).
    HashMismatch {
        part: String,
    },
    BadKey(String),
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { want, got } => write!(
                f,
                "bundle is truncated: {got} bytes, its manifest says {want} (download again)"
            ),
            Self::TrailingData => write!(f, "bundle has extra bytes after its last part"),
            Self::BadMagic => write!(f, "not a RiceGuard update bundle (bad magic)"),
            Self::ManifestTooLong(n) => {
                write!(f, "bundle manifest length {n} exceeds {MAX_MANIFEST} bytes")
            }
            Self::BadSignature => write!(
                f,
                "signature check failed: the bundle is not signed by this device's update key"
            ),
            Self::Manifest(line, what) => write!(f, "bundle manifest line {line}: {what}"),
            Self::WrongBoard { bundle, device } => {
                write!(f, "board check failed: bundle is for {bundle}, this device is {device}")
            }
            Self::WrongArch { bundle, device } => {
                write!(f, "arch check failed: bundle is for {bundle}, this device is {device}")
            }
            Self::Incompatible { min, max, device } => write!(
                f,
                "compatibility check failed: bundle takes configuration schema {min}..={max}, this device has {device}"
            ),
            Self::Downgrade {
                version,
                bundle,
                running,
            } => {
                let b = match bundle {
                    Some(b) => format!("bundle {version} (build {b})"),
                    None => format!(
                        "bundle {version} (no build number: made before build numbers, counts as 0)"
                    ),
                };
                let r = match running {
                    Some(r) => format!("is not newer than the running slot's build {r}"),
                    None => "cannot be compared: the running slot's build number is unreadable"
                        .to_string(),
                };
                write!(
                    f,
                    "downgrade check failed: {b} {r}; to install it anyway: `update SOURCE allow-downgrade` on the console (riceguard update --allow-downgrade)"
                )
            }
            Self::PartTooBig { part, size, limit } => write!(
                f,
                "size check failed: part {part} is {size} bytes, its place holds {limit}"
            ),
            Self::HashMismatch { part } => write!(
                f,
                "hash check failed: part {part} does not match its sha256 in the manifest (corrupted)"
            ),
            Self::BadKey(e) => write!(f, "update public key: {e}"),
        }
    }
}

impl std::error::Error for BundleError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub size: u64,
    pub sha256: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub board: String,
    pub arch: String,
    pub version: String,
    /// The signed, monotonic build number; `None` for bundles made before it existed.
    pub build: Option<u64>,
    pub compat: u32,
    pub min_compat: u32,
    pub parts: Vec<Part>,
}

impl Manifest {
    pub fn part(&self, name: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.name == name)
    }
    /// Bytes of the parts (what follows the manifest).
    pub fn body_len(&self) -> u64 {
        self.parts.iter().map(|p| p.size).sum()
    }
}

/// The manifest length from the first 12 bytes, after the magic check.
pub fn manifest_len(head: &[u8]) -> Result<usize, BundleError> {
    if head.len() < 12 {
        return Err(BundleError::Truncated {
            want: HEADER_LEN as u64,
            got: head.len() as u64,
        });
    }
    if &head[..8] != MAGIC {
        return Err(BundleError::BadMagic);
    }
    let n = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if n > MAX_MANIFEST || n == 0 {
        return Err(BundleError::ManifestTooLong(n));
    }
    Ok(n)
}

/// A public key file: base64 of the 32 raw bytes, one line (`#` comments allowed).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, BundleError> {
    use base64::Engine;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| BundleError::BadKey("empty key file".into()))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(line)
        .map_err(|e| BundleError::BadKey(format!("not base64: {e}")))?;
    let arr: [u8; 32] = raw
        .try_into()
        .map_err(|_| BundleError::BadKey("not 32 bytes".into()))?;
    VerifyingKey::from_bytes(&arr).map_err(|_| BundleError::BadKey("not an ed25519 point".into()))
}

/// Check the header (`HEADER_LEN + M` bytes: magic, length, signature, manifest) and
/// parse the manifest. The signature is checked first: nothing unsigned is parsed.
pub fn verify_header(header: &[u8], key: &VerifyingKey) -> Result<Manifest, BundleError> {
    let m = manifest_len(header)?;
    if header.len() < HEADER_LEN + m {
        return Err(BundleError::Truncated {
            want: (HEADER_LEN + m) as u64,
            got: header.len() as u64,
        });
    }
    let mut sig = [0u8; 64];
    sig.copy_from_slice(&header[12..HEADER_LEN]);
    let manifest = &header[HEADER_LEN..HEADER_LEN + m];
    key.verify_strict(manifest, &Signature::from_bytes(&sig))
        .map_err(|_| BundleError::BadSignature)?;
    parse_manifest(manifest)
}

fn parse_manifest(bytes: &[u8]) -> Result<Manifest, BundleError> {
    let bad = |n: usize, s: &str| BundleError::Manifest(n, s.to_string());
    let text = core::str::from_utf8(bytes).map_err(|_| bad(0, "not UTF-8"))?;
    let (mut format, mut board, mut arch, mut version) = (None, None, None, None);
    let (mut compat, mut min_compat, mut build) = (None, None, None);
    let mut parts: Vec<Part> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once(' ').ok_or_else(|| bad(n, "no value"))?;
        let v = v.trim();
        let word = |v: &str| -> Result<String, BundleError> {
            if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(n, "value must be 1-64 printable characters"));
            }
            Ok(v.to_string())
        };
        let num = |v: &str| v.parse::<u32>().map_err(|_| bad(n, "not a number"));
        match k {
            "format" => format = Some(num(v)?),
            "board" => board = Some(word(v)?),
            "arch" => arch = Some(word(v)?),
            "version" => version = Some(word(v)?),
            "compat" => compat = Some(num(v)?),
            "build" => {
                if build.is_some() {
                    return Err(bad(n, "build listed twice"));
                }
                build = Some(
                    v.parse::<u64>()
                        .map_err(|_| bad(n, "build must be a whole number"))?,
                )
            }
            "min-compat" => min_compat = Some(num(v)?),
            "part" => {
                let f: Vec<&str> = v.split_whitespace().collect();
                let [name, size, hash] = f[..] else {
                    return Err(bad(n, "part needs NAME SIZE SHA256"));
                };
                if !PART_NAMES.contains(&name) {
                    return Err(bad(n, "unknown part (root, uki-a, uki-b)"));
                }
                if parts.iter().any(|p| p.name == name) {
                    return Err(bad(n, "part listed twice"));
                }
                let size: u64 = size.parse().map_err(|_| bad(n, "bad part size"))?;
                if size > MAX_PART {
                    return Err(BundleError::PartTooBig {
                        part: name.into(),
                        size,
                        limit: MAX_PART,
                    });
                }
                let sha256 = hex32(hash).ok_or_else(|| bad(n, "sha256 must be 64 hex digits"))?;
                parts.push(Part {
                    name: name.into(),
                    size,
                    sha256,
                });
            }
            _ => return Err(bad(n, "unknown key")),
        }
    }
    if format != Some(1) {
        return Err(bad(0, "format must be 1"));
    }
    let need = |o: Option<String>, k: &str| o.ok_or_else(|| bad(0, &format!("no {k}")));
    let compat = compat.ok_or_else(|| bad(0, "no compat"))?;
    let m = Manifest {
        board: need(board, "board")?,
        arch: need(arch, "arch")?,
        version: need(version, "version")?,
        build,
        compat,
        min_compat: min_compat.unwrap_or(compat),
        parts,
    };
    if let Some(missing) = PART_NAMES.iter().find(|n| m.part(n).is_none()) {
        return Err(bad(
            0,
            &format!("no part {missing} (a bundle has root, uki-a, uki-b)"),
        ));
    }
    Ok(m)
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the device is, for the policy checks.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub board: String,
    pub arch: String,
    pub compat: u32,
    /// The running slot's build number (`None`: unreadable, so only an allowed downgrade
    /// installs).
    pub build: Option<u64>,
}

/// Board, arch, schema compatibility and the downgrade check (skipped when
/// `allow_downgrade`), then each part against the space it goes to.
pub fn check_policy(
    m: &Manifest,
    dev: &DeviceInfo,
    limits: &[(&str, u64)],
    allow_downgrade: bool,
) -> Result<(), BundleError> {
    if m.board != dev.board {
        return Err(BundleError::WrongBoard {
            bundle: m.board.clone(),
            device: dev.board.clone(),
        });
    }
    if m.arch != dev.arch {
        return Err(BundleError::WrongArch {
            bundle: m.arch.clone(),
            device: dev.arch.clone(),
        });
    }
    // The new firmware must read this device's schema (min-compat) and must not be older
    // than it (a downgrade could not read a configuration already migrated forward).
    if !(m.min_compat <= dev.compat && dev.compat <= m.compat) {
        return Err(BundleError::Incompatible {
            min: m.min_compat,
            max: m.compat,
            device: dev.compat,
        });
    }
    let newer = match (m.build, dev.build) {
        (b, Some(r)) => b.unwrap_or(0) > r,
        (_, None) => false,
    };
    if !newer && !allow_downgrade {
        return Err(BundleError::Downgrade {
            version: m.version.clone(),
            bundle: m.build,
            running: dev.build,
        });
    }
    for (name, limit) in limits {
        if let Some(p) = m.part(name) {
            if p.size > *limit {
                return Err(BundleError::PartTooBig {
                    part: p.name.clone(),
                    size: p.size,
                    limit: *limit,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::bundle::{make_bundle, manifest_for, test_key};

    fn dev() -> DeviceInfo {
        DeviceInfo {
            board: "qemu-x86_64".into(),
            arch: "x86_64".into(),
            compat: 1,
            build: Some(1),
        }
    }

    #[test]
    fn good_header_parses() {
        let k = test_key(7);
        let m = manifest_for("qemu-x86_64", b"rootfs", b"kernel", "");
        let b = make_bundle(&k, &m, b"rootfs", b"kernel");
        let man = verify_header(&b, &k.verifying_key()).unwrap();
        assert_eq!(man.version, "v2");
        assert_eq!(man.build, Some(2));
        assert_eq!(man.part("root").unwrap().size, 6);
        assert_eq!(man.body_len(), 20);
        check_policy(&man, &dev(), &[("root", 6), ("uki-a", 100)], false).unwrap();
    }

    #[test]
    fn refusals_name_the_check() {
        let k = test_key(7);
        let pk = k.verifying_key();
        let m = manifest_for("qemu-x86_64", b"r", b"u", "");
        let b = make_bundle(&k, &m, b"r", b"u");
        // Wrong key.
        let other = test_key(8).verifying_key();
        assert_eq!(verify_header(&b, &other), Err(BundleError::BadSignature));
        // One flipped manifest bit.
        let mut bad = b.clone();
        bad[HEADER_LEN + 3] ^= 1;
        assert_eq!(verify_header(&bad, &pk), Err(BundleError::BadSignature));
        // Magic.
        let mut bad = b.clone();
        bad[0] = b'X';
        assert_eq!(verify_header(&bad, &pk), Err(BundleError::BadMagic));
        // Board, arch, compat, size.
        let man = verify_header(&b, &pk).unwrap();
        let mut d = dev();
        d.board = "qemu-aarch64".into();
        assert!(matches!(
            check_policy(&man, &d, &[], false),
            Err(BundleError::WrongBoard { .. })
        ));
        let mut d = dev();
        d.arch = "aarch64".into();
        assert!(matches!(
            check_policy(&man, &d, &[], false),
            Err(BundleError::WrongArch { .. })
        ));
        let mut d = dev();
        d.compat = 2;
        let e = check_policy(&man, &d, &[], false).unwrap_err();
        assert!(e.to_string().contains("compatibility check failed"), "{e}");
        let e = check_policy(&man, &dev(), &[("root", 0)], false).unwrap_err();
        assert!(e.to_string().contains("size check failed"), "{e}");
        // A manifest part beyond MAX_PART is refused while parsing.
        let m = format!(
            "format 1\nboard b\narch a\nversion v\ncompat 1\npart root {} {}\npart uki-a 1 {}\n",
            MAX_PART + 1,
            "0".repeat(64),
            "0".repeat(64)
        );
        let b = make_bundle(&k, &m, b"", b"");
        assert!(matches!(
            verify_header(&b, &pk),
            Err(BundleError::PartTooBig { .. })
        ));
    }

    #[test]
    fn manifest_errors() {
        let k = test_key(1);
        let pk = k.verifying_key();
        for m in [
            "format 2\nboard b\narch a\nversion v\ncompat 1\n",
            "format 1\nboard b\narch a\nversion v\ncompat 1\n",
            "format 1\nboard\n",
            "format 1\nwhat 1\n",
            "format 1\nboard b\narch a\nversion v\ncompat x\n",
            "format 1\nboard b\narch a\nversion v\ncompat 1\npart root 1 zz\npart uki-a 1 00\n",
            "format 1\nboard b\narch a\nversion v\ncompat 1\npart kernel 1 00\n",
            "format 1\nboard b\narch a\nversion v\nbuild -1\ncompat 1\n",
            "format 1\nboard b\narch a\nversion v\nbuild 1.5\ncompat 1\n",
            "format 1\nboard b\narch a\nversion v\nbuild 2\nbuild 3\ncompat 1\n",
            "format 1\nboard b\narch a\nversion v\nbuild 99999999999999999999\ncompat 1\n",
        ] {
            let b = make_bundle(&k, m, b"", b"");
            assert!(
                matches!(verify_header(&b, &pk), Err(BundleError::Manifest(..))),
                "{m}"
            );
        }
    }

    /// The build number is signed and must be greater than the running slot's; equal,
    /// older, missing (old bundles: build 0) and an unreadable running build are refused
    /// unless the downgrade is allowed.
    #[test]
    fn downgrade_refused_unless_allowed() {
        let k = test_key(5);
        let pk = k.verifying_key();
        let with_build = |b: &str| {
            let m = manifest_for("qemu-x86_64", b"r", b"u", "").replace("build 2\n", b);
            verify_header(&make_bundle(&k, &m, b"r", b"u"), &pk).unwrap()
        };
        let at = |running: Option<u64>| DeviceInfo {
            build: running,
            ..dev()
        };
        let v2 = with_build("build 2\n");
        assert_eq!(check_policy(&v2, &at(Some(1)), &[], false), Ok(()));
        for (man, running) in [
            (&v2, Some(2)),
            (&v2, Some(3)),
            (&v2, None),
            (&with_build(""), Some(0)),
            (&with_build(""), Some(5)),
            (&with_build("build 0\n"), Some(0)),
        ] {
            let e = check_policy(man, &at(running), &[], false).unwrap_err();
            assert!(
                matches!(e, BundleError::Downgrade { .. }),
                "{running:?}: {e}"
            );
            let t = e.to_string();
            assert!(
                t.contains("downgrade check failed") && t.contains("allow-downgrade"),
                "{t}"
            );
            assert_eq!(check_policy(man, &at(running), &[], true), Ok(()));
        }
        assert!(with_build("").build.is_none());
        let t = check_policy(&with_build(""), &at(Some(7)), &[], false)
            .unwrap_err()
            .to_string();
        assert!(
            t.contains("no build number") && t.contains("build 7"),
            "{t}"
        );
        // The build line is covered by the signature: editing it breaks the signature.
        let m = manifest_for("qemu-x86_64", b"r", b"u", "");
        let mut b = make_bundle(&k, &m, b"r", b"u");
        let at_build = HEADER_LEN + m.find("build 2").unwrap() + 6;
        b[at_build] = b'9';
        assert_eq!(verify_header(&b, &pk), Err(BundleError::BadSignature));
        // Other checks still come first: a wrong board is reported as such.
        let mut d = at(Some(9));
        d.board = "other".into();
        assert!(matches!(
            check_policy(&v2, &d, &[], false),
            Err(BundleError::WrongBoard { .. })
        ));
    }

    #[test]
    fn public_key_file() {
        use base64::Engine;
        let pk = test_key(3).verifying_key();
        let text = format!(
            "# riceguard update key\n{}\n",
            base64::engine::general_purpose::STANDARD.encode(pk.to_bytes())
        );
        assert_eq!(parse_public_key(&text).unwrap(), pk);
        assert!(parse_public_key("").is_err());
        assert!(parse_public_key("AAAA\n").is_err());
    }

    /// Seeded garbage and mutations of a valid header never panic and never pass.
    #[test]
    fn fuzz_style_garbage() {
        let k = test_key(9);
        let pk = k.verifying_key();
        let m = manifest_for("qemu-x86_64", b"r", b"u", "");
        let good = make_bundle(&k, &m, b"r", b"u");
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..1000 {
            let mut b = if i % 2 == 0 {
                good.clone()
            } else {
                let n = (rnd() % 300) as usize;
                let mut v: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
                if n >= 8 && i % 3 == 0 {
                    v[..8].copy_from_slice(MAGIC);
                }
                v
            };
            if i % 2 == 0 {
                for _ in 0..1 + rnd() % 4 {
                    let at = (rnd() as usize) % b.len();
                    b[at] ^= 1 << (rnd() % 8);
                }
                if rnd() % 4 == 0 {
                    let cut = (rnd() as usize) % b.len();
                    b.truncate(cut);
                }
            }
            if let Ok(man) = verify_header(&b, &pk) {
                // Only flips after the manifest (in the parts) may leave the header valid.
                assert_eq!(man, verify_header(&good, &pk).unwrap());
            }
        }
    }

    /// Bundles of this firmware (compat COMPAT, min-compat MIN_COMPAT, as image/bundle.sh
    /// makes them) install on a device of every schema from 1 (firmware in the field) to
    /// this one; a bundle of schema 1 only is refused here (it could be given a file with
    /// newer keys written by hand; the previous slot is the way back).
    #[test]
    fn schema_2_bundles_take_schema_1_devices() {
        let k = test_key(7);
        let m = manifest_for("qemu-x86_64", b"r", b"u", "").replace(
            "compat 1\nmin-compat 1",
            &format!("compat {COMPAT}\nmin-compat {MIN_COMPAT}"),
        );
        let man = verify_header(&make_bundle(&k, &m, b"r", b"u"), &k.verifying_key()).unwrap();
        assert_eq!((man.compat, man.min_compat), (COMPAT, 1));
        for device in 1..=COMPAT {
            let d = DeviceInfo {
                compat: device,
                ..dev()
            };
            check_policy(&man, &d, &[], false).unwrap();
        }
        let old = manifest_for("qemu-x86_64", b"r", b"u", "");
        let old = verify_header(&make_bundle(&k, &old, b"r", b"u"), &k.verifying_key()).unwrap();
        let d = DeviceInfo {
            compat: COMPAT,
            ..dev()
        };
        let e = check_policy(&old, &d, &[], true).unwrap_err();
        assert!(
            e.to_string().contains(&format!("this device has {COMPAT}")),
            "{e}"
        );
    }

    /// image/bundle.sh takes its default compat/min-compat from these two lines.
    #[test]
    fn bundle_sh_finds_the_schema_lines() {
        let src = include_str!("bundle.rs");
        assert!(src.contains(&format!("\npub const COMPAT: u32 = {COMPAT};\n")));
        assert!(src.contains(&format!("\npub const MIN_COMPAT: u32 = {MIN_COMPAT};\n")));
        let sh = include_str!("../../../image/bundle.sh");
        assert!(
            sh.contains(r#"s/^pub const $1: u32 = "#)
                && sh.contains("$(schema COMPAT)")
                && sh.contains("$(schema MIN_COMPAT)")
        );
    }
}
