//! The UAPI socket server: `/var/run/wireguard/IFNAME.sock`, wireguard-go's protocol,
//! so `wg`, `wg setconf` and wg-quick drive us unchanged. Requests are handled one at a
//! time; a `set` is validated whole against a copy of the configuration before anything
//! is applied.

use std::io::{BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::core::uapi::{self, DeviceStatus, PeerStatus, Request};
use crate::driver::Runtime;

pub const SOCKET_DIR: &str = "/var/run/wireguard";

pub fn socket_path(ifname: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{ifname}.sock"))
}

/// Bind the UAPI socket, replacing a stale one (no listener behind it) but refusing to
/// steal one that answers.
pub fn bind(ifname: &str) -> std::io::Result<UnixListener> {
    std::fs::create_dir_all(SOCKET_DIR)?;
    let _ = std::fs::set_permissions(SOCKET_DIR, std::fs::Permissions::from_mode(0o755));
    let path = socket_path(ifname);
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is in use by a running daemon", path.display()),
            ));
        }
        let _ = std::fs::remove_file(&path);
    }
    let l = UnixListener::bind(&path)?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    Ok(l)
}

/// Serve until the listener fails (the process is exiting).
pub fn serve(listener: UnixListener, rt: Arc<Runtime>) {
    for conn in listener.incoming() {
        if rt.shared.stop.load(Ordering::Relaxed) {
            break;
        }
        match conn {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                handle_conn(s, &rt);
            }
            Err(e) => log::warn!("uapi accept: {e}"),
        }
    }
}

fn handle_conn(stream: UnixStream, rt: &Runtime) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    // A connection may carry several requests in a row (wireguard-go allows it).
    loop {
        let reply = match uapi::read_request(&mut reader) {
            Ok(Request::Get) => uapi::emit_get(&status(rt)),
            Ok(Request::Set(req)) => match rt.apply_set(&req) {
                Ok(()) => uapi::emit_errno(0),
                Err(e) => {
                    log::warn!("uapi set rejected: {e}");
                    uapi::emit_errno(e.errno())
                }
            },
            Err(e) if !e.answers() => return,
            Err(e) => {
                log::warn!("uapi request rejected: {e}");
                let _ = out.write_all(uapi::emit_errno(e.errno()).as_bytes());
                return;
            }
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The device's state in the UAPI's terms.
pub fn status(rt: &Runtime) -> DeviceStatus {
    let cfg = rt.shared.device.config();
    let peers = rt
        .shared
        .device
        .peer_stats()
        .into_iter()
        .map(|p| PeerStatus {
            public_key: p.public_key,
            preshared_key: p.preshared_key,
            endpoint: p.endpoint.map(|e| e.socket_addr()),
            last_handshake: p
                .last_handshake
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| (d.as_secs(), d.subsec_nanos())),
            rx_bytes: p.rx_bytes,
            tx_bytes: p.tx_bytes,
            persistent_keepalive: p.persistent_keepalive,
            allowed_ips: p.allowed_ips,
            protocol_version: 1,
        })
        .collect();
    // Peers configured while no private key is set are not in the device table yet;
    // list them from the config so `wg show` still shows what was set.
    let mut peers: Vec<PeerStatus> = peers;
    for pc in &cfg.peers {
        if !peers.iter().any(|p| p.public_key == pc.public_key) {
            peers.push(PeerStatus {
                public_key: pc.public_key,
                preshared_key: pc.preshared_key,
                endpoint: match &pc.endpoint {
                    Some(crate::core::config::Endpoint::Addr(a)) => Some(*a),
                    _ => None,
                },
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
                persistent_keepalive: pc.persistent_keepalive,
                allowed_ips: pc.allowed_ips.clone(),
                protocol_version: 1,
            });
        }
    }
    DeviceStatus {
        private_key: cfg.interface.private_key,
        listen_port: rt.shared.sockets.port.load(Ordering::Relaxed),
        fwmark: cfg.interface.fwmark,
        peers,
    }
}
