//! The daemon's peer health file, `RUN_DIR/IFNAME.peers`, for `show peers`: one line per
//! peer, `KEY HEALTH` (`up`, `idle`, `stale`, `never`) and, while two devices share the
//! key, ` shared IP IP`. The daemon's timer thread rewrites it whole (temp file, rename)
//! every 5 s when it changed; health changes seldom, so with 20 000 peers the file (about
//! 1 MiB) is rarely written. The consoles read it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::core::key::Key;

/// The file for interface `ifname`.
pub fn path(ifname: &str) -> PathBuf {
    Path::new(super::RUN_DIR).join(format!("{ifname}.peers"))
}

/// One peer's health as the file says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHealth {
    pub key: Key,
    pub health: String,
    /// Two devices on this key: the addresses it flips between.
    pub shared: Option<(IpAddr, IpAddr)>,
}

/// The file's text for these peers.
pub fn text(peers: &[PeerHealth]) -> String {
    let mut s = String::with_capacity(peers.len() * 56);
    for p in peers {
        s.push_str(&p.key.to_base64());
        s.push(' ');
        s.push_str(&p.health);
        if let Some((a, b)) = p.shared {
            s.push_str(&format!(" shared {a} {b}"));
        }
        s.push('\n');
    }
    s
}

/// Replace the file whole.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("peers.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Every well-formed line; others are skipped (a reader never fails on the file).
pub fn parse(text: &str) -> Vec<PeerHealth> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            let key = Key::from_base64(w.next()?).ok()?;
            let health = w.next()?;
            if !matches!(health, "up" | "idle" | "stale" | "never") {
                return None;
            }
            let shared = match (w.next(), w.next(), w.next()) {
                (Some("shared"), Some(a), Some(b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                (None, _, _) => None,
                _ => return None,
            };
            Some(PeerHealth {
                key,
                health: health.to_string(),
                shared,
            })
        })
        .collect()
}

/// The file for `ifname` read (empty when there is none: no daemon, or an older one).
pub fn read(ifname: &str) -> Vec<PeerHealth> {
    std::fs::read_to_string(path(ifname))
        .map(|t| parse(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_lines_skipped() {
        let ps = vec![
            PeerHealth {
                key: Key([1; 32]),
                health: "up".into(),
                shared: None,
            },
            PeerHealth {
                key: Key([2; 32]),
                health: "stale".into(),
                shared: Some(("192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap())),
            },
        ];
        let t = text(&ps);
        assert_eq!(parse(&t), ps);
        let noisy = format!(
            "garbage\n{t}AAAA up\n{} sick\n{} up shared x y\n",
            Key([3; 32]).to_base64(),
            Key([4; 32]).to_base64()
        );
        assert_eq!(parse(&noisy), ps);
    }
}
