//! The UAPI socket server: `/var/run/wireguard/IFNAME.sock`, wireguard-go's protocol,
//! so `wg`, `wg setconf` and wg-quick drive us unchanged. A `set` is validated whole
//! against a copy of the configuration before anything is applied (`Runtime::apply_set`).
//!
//! Each client has its own thread, and each request a deadline: a client that connects
//! and says nothing, or trickles half a request, ties up only its own thread, and only
//! for [`REQUEST_DEADLINE`]. At most [`MAX_CLIENTS`] are served at once; one more
//! closes the oldest, so a pile of silent clients cannot keep `wg show` out either.
//! The socket is created under umask 0077 (as wireguard-go does): only root may talk.

use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::runtime::Runtime;
use crate::core::uapi::{self, DeviceStatus, PeerStatus, Request, SetRequest, UapiError};

pub use crate::run::UAPI_DIR as SOCKET_DIR;
/// A request (from waiting for its first line to its blank line) must arrive within
/// this; `wg` sends its whole request at once, even `wg setconf` with thousands of
/// peers takes milliseconds on a local socket.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// An answer must be taken within this.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients served at once; one more closes the oldest.
pub const MAX_CLIENTS: usize = 16;

pub use crate::run::uapi_socket as socket_path;

/// Bind the UAPI socket, replacing a stale one (no listener behind it) but refusing to
/// steal one that answers.
pub fn bind(ifname: &str) -> std::io::Result<UnixListener> {
    bind_in(Path::new(SOCKET_DIR), ifname)
}

fn bind_in(dir: &Path, ifname: &str) -> std::io::Result<UnixListener> {
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    let path = dir.join(format!("{ifname}.sock"));
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is in use by a running daemon", path.display()),
            ));
        }
        let _ = std::fs::remove_file(&path);
    }
    // Created without group or world access from the start: a chmod after bind would
    // leave a moment in which anyone could connect. Process-wide, but at this point no
    // other thread creates files.
    let old = crate::sys::process::umask(0o077);
    let l = UnixListener::bind(&path);
    crate::sys::process::umask(old);
    let l = l?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// What the server asks of the device.
pub trait Handler: Send + Sync + 'static {
    fn get(&self) -> DeviceStatus;
    fn set(&self, req: &SetRequest) -> Result<(), UapiError>;
}

impl Handler for Runtime {
    fn get(&self) -> DeviceStatus {
        status(self)
    }

    fn set(&self, req: &SetRequest) -> Result<(), UapiError> {
        self.apply_set(req)
    }
}

/// The clients being served, oldest first, each with a handle to close it and a flag
/// saying it was closed by us.
#[derive(Default)]
struct Clients {
    next: u64,
    live: VecDeque<(u64, UnixStream, Arc<AtomicBool>)>,
}

/// Serve until `stop` is set (checked at each connection) or the listener fails.
pub fn serve(listener: UnixListener, handler: Arc<dyn Handler>, stop: Arc<AtomicBool>) {
    let clients = Arc::new(Mutex::new(Clients::default()));
    for conn in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                log::warn!("uapi accept: {e}");
                // EMFILE and the like: do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(closer) = s.try_clone() else { continue };
        let evicted = Arc::new(AtomicBool::new(false));
        let id = {
            let mut c = clients.lock().unwrap_or_else(|p| p.into_inner());
            while c.live.len() >= MAX_CLIENTS {
                if let Some((_, oldest, flag)) = c.live.pop_front() {
                    // Its thread sees its reads fail and exits; the flag keeps the end
                    // of input we caused from ending a half-sent `set` (which a real
                    // end of input does, as in wireguard-go).
                    flag.store(true, Ordering::SeqCst);
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            c.next += 1;
            let id = c.next;
            c.live.push_back((id, closer, evicted.clone()));
            id
        };
        let h = handler.clone();
        let cl = clients.clone();
        let spawned = std::thread::Builder::new()
            .name("rg-uapi-conn".into())
            .spawn(move || {
                handle_conn(s, &*h, evicted);
                cl.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .live
                    .retain(|(i, _, _)| *i != id);
            });
        if let Err(e) = spawned {
            log::warn!("uapi: cannot start a client thread: {e}");
            clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .live
                .retain(|(i, _, _)| *i != id);
        }
    }
}

/// A reader whose reads all end by one deadline (reset per request), and fail once the
/// server closed the connection.
struct DeadlineReader {
    s: UnixStream,
    deadline: Instant,
    evicted: Arc<AtomicBool>,
}

impl Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request not complete within the deadline",
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        let n = match self.s.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "request not complete within the deadline",
                ))
            }
            r => r?,
        };
        if self.evicted.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "closed for a newer client",
            ));
        }
        Ok(n)
    }
}

fn handle_conn(stream: UnixStream, h: &dyn Handler, evicted: Arc<AtomicBool>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let _ = out.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut reader = BufReader::new(DeadlineReader {
        s: stream,
        deadline: Instant::now() + REQUEST_DEADLINE,
        evicted,
    });
    // A connection may carry several requests in a row (wireguard-go allows it).
    loop {
        reader.get_mut().deadline = Instant::now() + REQUEST_DEADLINE;
        let reply = match uapi::read_request(&mut reader) {
            Ok(Request::Get) => uapi::emit_get(&h.get()),
            Ok(Request::Set(req)) => match h.set(&req) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::fs::FileTypeExt;
    use std::path::PathBuf;

    struct Fake {
        port: Mutex<u16>,
    }

    impl Handler for Fake {
        fn get(&self) -> DeviceStatus {
            DeviceStatus {
                private_key: None,
                listen_port: *self.port.lock().unwrap(),
                fwmark: None,
                peers: Vec::new(),
            }
        }

        fn set(&self, req: &SetRequest) -> Result<(), UapiError> {
            match req.listen_port {
                Some(1) => Err(UapiError::PortInUse("taken".into())),
                Some(p) => {
                    *self.port.lock().unwrap() = p;
                    Ok(())
                }
                None => Ok(()),
            }
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rg-uapi-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn start(tag: &str) -> (PathBuf, PathBuf, Arc<AtomicBool>) {
        let dir = temp_dir(tag);
        let l = bind_in(&dir, "t0").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h: Arc<dyn Handler> = Arc::new(Fake {
            port: Mutex::new(51820),
        });
        let s = stop.clone();
        std::thread::spawn(move || serve(l, h, s));
        let path = dir.join("t0.sock");
        (dir, path, stop)
    }

    fn stop_server(dir: &Path, path: &Path, stop: &AtomicBool) {
        stop.store(true, Ordering::Relaxed);
        let _ = UnixStream::connect(path);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `get=1` on a fresh connection: the answer, and how long it took.
    fn get(path: &Path) -> (String, Duration) {
        let t = Instant::now();
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(b"get=1\n\n").unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut out = String::new();
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\n" {
                break;
            }
            out.push_str(&l);
        }
        (out, t.elapsed())
    }

    #[test]
    fn socket_is_private() {
        let dir = temp_dir("mode");
        let _l = bind_in(&dir, "m0").unwrap();
        let md = std::fs::metadata(dir.join("m0.sock")).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(md.permissions().mode() & 0o077, 0, "no group/world access");
        // A second daemon does not steal a live socket.
        let e = bind_in(&dir, "m0").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn silent_and_slow_clients_do_not_block_get() {
        let (dir, path, stop) = start("slow");
        // Connected, silent; one that stops halfway through a request.
        let _silent = UnixStream::connect(&path).unwrap();
        let mut half = UnixStream::connect(&path).unwrap();
        half.write_all(b"set=1\nlisten_port=4").unwrap();
        let (answer, took) = get(&path);
        assert!(answer.contains("listen_port=51820"), "{answer}");
        assert!(answer.contains("errno=0"), "{answer}");
        assert!(took < Duration::from_secs(1), "get took {took:?}");
        stop_server(&dir, &path, &stop);
    }

    #[test]
    fn more_silent_clients_than_slots_still_let_get_through() {
        let (dir, path, stop) = start("flood");
        // The oldest are halfway through a set; closing them for newer clients must not
        // end (and apply) their requests.
        let mut silent: Vec<UnixStream> = (0..MAX_CLIENTS)
            .map(|_| {
                let mut s = UnixStream::connect(&path).unwrap();
                s.write_all(b"set=1\nlisten_port=4").unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        silent.extend((0..MAX_CLIENTS * 2).map(|_| UnixStream::connect(&path).unwrap()));
        std::thread::sleep(Duration::from_millis(100));
        let (answer, took) = get(&path);
        assert!(answer.contains("listen_port=51820"), "{answer}");
        assert!(answer.contains("errno=0"), "{answer}");
        assert!(took < Duration::from_secs(1), "get took {took:?}");
        drop(silent);
        stop_server(&dir, &path, &stop);
    }

    #[test]
    fn set_answers_errno_and_the_connection_goes_on() {
        let (dir, path, stop) = start("set");
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        s.write_all(b"set=1\nlisten_port=1\n\n").unwrap();
        assert_eq!(uapi::read_set_response(&mut r).unwrap_err().errno(), -98);
        s.write_all(b"set=1\nlisten_port=4000\n\n").unwrap();
        uapi::read_set_response(&mut r).unwrap();
        assert!(get(&path).0.contains("listen_port=4000"));
        stop_server(&dir, &path, &stop);
    }

    #[test]
    fn a_request_trickled_past_the_deadline_is_cut() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut reader = BufReader::new(DeadlineReader {
            s: a,
            deadline: Instant::now() + Duration::from_millis(100),
            evicted: Arc::new(AtomicBool::new(false)),
        });
        let mut w = b;
        w.write_all(b"get=1\n").unwrap();
        // The blank line never comes.
        let t = Instant::now();
        let e = uapi::read_request(&mut reader).unwrap_err();
        assert_eq!(e.errno(), -uapi::EIO, "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
