//! `show peers`: ask the running daemon over the stock UAPI (`get=1`) and print what it
//! says, the way `wg show` does. The answer is read by core's UAPI client; the socket is
//! opened by the [`super::system`] hooks.

use std::fmt::Write as _;

use crate::core::key::Key;
use crate::core::uapi::{self, UapiError};

fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

fn ago(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s} s ago"),
        (0, _) => format!("{m} min {s} s ago"),
        _ => format!("{h} h {m} min ago"),
    }
}

/// A restricted peer's access for `show peers`: its list and how many packets the
/// firewall refused it (`None`: no table to ask).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAccess {
    pub key: Key,
    pub text: String,
    pub drops: Option<u64>,
}

/// Format a UAPI `get=1` answer, read by core's UAPI client (`parse_get_response`, the
/// one `riceguard status` uses too). `now_unix` dates the handshakes; `names`: peer names
/// (`Name =`, which UAPI does not carry) by public key, shown after the key. An `errno=N`
/// other than 0, or a reply that is not UAPI at all, is an error.
pub fn format_uapi(
    reply: &str,
    now_unix: u64,
    names: &[(Key, String)],
    health: &[crate::run::peers::PeerHealth],
    access: &[PeerAccess],
) -> Result<String, String> {
    let st = uapi::parse_get_response(reply).map_err(|e| match e {
        UapiError::Remote(n) => format!("the daemon answered errno={n}"),
        e => format!("the daemon's answer is not UAPI: {e}"),
    })?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "interface: listening on port {}{}",
        if st.listen_port == 0 {
            "(none)".to_string()
        } else {
            st.listen_port.to_string()
        },
        if st.private_key.is_some() {
            ""
        } else {
            ", no private key"
        }
    );
    if st.peers.is_empty() {
        s.push_str("no peers\n");
    }
    for p in &st.peers {
        let name = names
            .iter()
            .find(|(k, _)| *k == p.public_key)
            .map(|(_, n)| format!(" ({n})"))
            .unwrap_or_default();
        let _ = writeln!(s, "\npeer: {}{name}", p.public_key.to_base64());
        if let Some(e) = &p.endpoint {
            let _ = writeln!(s, "  endpoint: {e}");
        }
        let ips = if p.allowed_ips.is_empty() {
            "(none)".to_string()
        } else {
            p.allowed_ips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(s, "  allowed ips: {ips}");
        let hs = match p.last_handshake {
            None => "never".to_string(),
            Some((sec, _)) => ago(now_unix.saturating_sub(sec)),
        };
        let _ = writeln!(s, "  latest handshake: {hs}");
        if let Some(h) = health.iter().find(|h| h.key == p.public_key) {
            let _ = writeln!(s, "  health: {}", h.health);
            if let Some((a, b)) = h.shared {
                let _ = writeln!(
                    s,
                    "  two devices share this key: used from {a} and {b} (give each its own client)"
                );
            }
        }
        if let Some(a) = access.iter().find(|a| a.key == p.public_key) {
            let _ = match a.drops {
                Some(n) => writeln!(s, "  access: {} ({n} packets refused)", a.text),
                None => writeln!(s, "  access: {}", a.text),
            };
        }
        let _ = writeln!(
            s,
            "  transfer: {} received, {} sent",
            bytes(p.rx_bytes),
            bytes(p.tx_bytes)
        );
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(s, "  persistent keepalive: every {k} s");
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_a_wireguard_go_reply() {
        let pk = Key::generate_private(&mut rand_core::OsRng).public();
        let reply = format!(
            "private_key={}\nlisten_port=51820\npublic_key={}\nendpoint=192.0.2.7:51820\n\
             last_handshake_time_sec=1000\nlast_handshake_time_nsec=0\ntx_bytes=2048\nrx_bytes=100\n\
             persistent_keepalive_interval=25\nallowed_ip=10.0.0.2/32\nprotocol_version=1\nerrno=0\n\n",
            Key::generate_private(&mut rand_core::OsRng).to_hex(),
            pk.to_hex()
        );
        let s = format_uapi(&reply, 1042, &[(pk, "phone".into())], &[], &[]).unwrap();
        assert!(
            s.contains(&format!("peer: {} (phone)\n", pk.to_base64())),
            "{s}"
        );
        assert!(!s.contains("health:"), "no health file: nothing said");
        let h = [crate::run::peers::PeerHealth {
            key: pk,
            health: "up".into(),
            shared: Some((
                "203.0.113.5".parse().unwrap(),
                "198.51.100.9".parse().unwrap(),
            )),
        }];
        let with = format_uapi(&reply, 1042, &[], &h, &[]).unwrap();
        assert!(
            with.contains(
                "  latest handshake: 42 s ago
  health: up
  two devices share this key: used from 203.0.113.5 and 198.51.100.9"
            ),
            "{with}"
        );
        let a = [PeerAccess {
            key: pk,
            text: "lan, 192.168.1.10/32 tcp 8096".into(),
            drops: Some(17),
        }];
        let limited = format_uapi(&reply, 1042, &[], &[], &a).unwrap();
        assert!(
            limited.contains("  access: lan, 192.168.1.10/32 tcp 8096 (17 packets refused)\n"),
            "{limited}"
        );
        let unnamed = format_uapi(&reply, 1042, &[], &[], &[]).unwrap();
        assert!(!unnamed.contains("access:"));
        assert!(unnamed.contains(&format!("peer: {}\n", pk.to_base64())));
        assert!(s.contains("listening on port 51820"), "{s}");
        assert!(s.contains(&pk.to_base64()));
        assert!(
            s.contains("42 s ago") && s.contains("2.00 KiB sent") && s.contains("every 25 s"),
            "{s}"
        );
        assert!(s.contains("allowed ips: 10.0.0.2/32"));
    }

    #[test]
    fn errors_and_garbage() {
        assert!(format_uapi("errno=2\n\n", 0, &[], &[], &[])
            .unwrap_err()
            .contains("errno=2"));
        assert!(format_uapi("HTTP/1.1 400\n", 0, &[], &[], &[]).is_err());
        assert!(format_uapi("listen_port=1\n", 0, &[], &[], &[]).is_err());
        assert!(format_uapi("listen_port=1\nerrno=0\n\n", 0, &[], &[], &[])
            .unwrap()
            .contains("no peers"));
    }
}
