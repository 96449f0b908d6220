//! `show peers`: ask the running daemon over the stock UAPI (`get=1`) and print what it
//! says, the way `wg show` does. The text is parsed here; the socket is opened by the
//! [`super::system`] hooks.

use std::fmt::Write as _;

use crate::core::key::Key;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Peer {
    public_key: String,
    endpoint: Option<String>,
    allowed_ips: Vec<String>,
    handshake_sec: u64,
    rx: u64,
    tx: u64,
    keepalive: u64,
}

fn b64_of_hex(h: &str) -> String {
    Key::from_hex(h)
        .map(|k| k.to_base64())
        .unwrap_or_else(|_| format!("(bad key {})", super::validate::short(h)))
}

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

/// Format a UAPI `get=1` answer. `now_unix` dates the handshakes; `names`: peer names
/// (`Name =`, which UAPI does not carry) by public key, shown after the key. An `errno=N`
/// other than 0, or a reply that is not UAPI at all, is an error.
pub fn format_uapi(reply: &str, now_unix: u64, names: &[(Key, String)]) -> Result<String, String> {
    let mut listen = None;
    let mut has_key = false;
    let mut peers: Vec<Peer> = Vec::new();
    let mut errno = None;
    for line in reply.lines() {
        if line.is_empty() {
            break;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "the daemon's answer is not UAPI (line `{}`)",
                super::validate::short(line)
            ));
        };
        let num = || v.parse::<u64>().unwrap_or(0);
        match (k, peers.last_mut()) {
            ("errno", _) => errno = Some(num()),
            ("public_key", _) => peers.push(Peer {
                public_key: b64_of_hex(v),
                ..Peer::default()
            }),
            ("private_key", None) => has_key = true,
            ("listen_port", None) => listen = Some(num()),
            ("endpoint", Some(p)) => p.endpoint = Some(v.to_string()),
            ("allowed_ip", Some(p)) => p.allowed_ips.push(v.to_string()),
            ("last_handshake_time_sec", Some(p)) => p.handshake_sec = num(),
            ("rx_bytes", Some(p)) => p.rx = num(),
            ("tx_bytes", Some(p)) => p.tx = num(),
            ("persistent_keepalive_interval", Some(p)) => p.keepalive = num(),
            _ => {}
        }
    }
    match errno {
        Some(0) => {}
        Some(e) => return Err(format!("the daemon answered errno={e}")),
        None => return Err("the daemon's answer ended early (no errno line)".into()),
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "interface: listening on port {}{}",
        listen
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(none)".into()),
        if has_key { "" } else { ", no private key" }
    );
    if peers.is_empty() {
        s.push_str("no peers\n");
    }
    for p in &peers {
        let name = names
            .iter()
            .find(|(k, _)| k.to_base64() == p.public_key)
            .map(|(_, n)| format!(" ({n})"))
            .unwrap_or_default();
        let _ = writeln!(s, "\npeer: {}{name}", p.public_key);
        if let Some(e) = &p.endpoint {
            let _ = writeln!(s, "  endpoint: {e}");
        }
        let ips = if p.allowed_ips.is_empty() {
            "(none)".to_string()
        } else {
            p.allowed_ips.join(", ")
        };
        let _ = writeln!(s, "  allowed ips: {ips}");
        let hs = if p.handshake_sec == 0 {
            "never".to_string()
        } else {
            ago(now_unix.saturating_sub(p.handshake_sec))
        };
        let _ = writeln!(s, "  latest handshake: {hs}");
        let _ = writeln!(
            s,
            "  transfer: {} received, {} sent",
            bytes(p.rx),
            bytes(p.tx)
        );
        if p.keepalive > 0 {
            let _ = writeln!(s, "  persistent keepalive: every {} s", p.keepalive);
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
        let s = format_uapi(&reply, 1042, &[(pk, "phone".into())]).unwrap();
        assert!(
            s.contains(&format!("peer: {} (phone)\n", pk.to_base64())),
            "{s}"
        );
        let unnamed = format_uapi(&reply, 1042, &[]).unwrap();
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
        assert!(format_uapi("errno=2\n\n", 0, &[])
            .unwrap_err()
            .contains("errno=2"));
        assert!(format_uapi("HTTP/1.1 400\n", 0, &[]).is_err());
        assert!(format_uapi("listen_port=1\n", 0, &[]).is_err());
        assert!(format_uapi("listen_port=1\nerrno=0\n\n", 0, &[])
            .unwrap()
            .contains("no peers"));
    }
}
