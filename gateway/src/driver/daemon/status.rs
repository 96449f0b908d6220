//! The daemon's status file (`riceguard status`, the console's `show status`): the
//! start-up decisions, then one line per worker as each one starts (which backend it
//! runs, its ring, where its buffer pool lives) and the hugepages used of those reserved.
//!
//! Two lines say the daemon is alive and what it did with its configuration, for init's
//! health watch and the console's `commit`:
//! - `heartbeat: N N ...`: each worker's heartbeat counter (rewritten about once a second
//!   by the timer thread; a counter that stops moving is a stuck worker);
//! - `reload: generation N ok` / `reload: generation N failed REASON`: the last
//!   configuration reload (SIGHUP) and its result; generation 0 is the start-up file.
//!
//! The file is replaced whole (temp file, rename), so a reader never sees half of it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::uapi;
use crate::run::lease;
use std::sync::Mutex;

/// The lines of the status report; rewritten whole whenever a worker reports.
pub struct StatusBoard {
    /// Files written (none for a detached board, as in tests).
    paths: Vec<PathBuf>,
    base: Vec<String>,
    workers: Mutex<Vec<Option<String>>>,
    heartbeats: Mutex<Vec<u64>>,
    reload: Mutex<Reload>,
    /// More lines, asked for at each write (the firewall's `firewall:` and `nat:`).
    extra: Mutex<Option<ExtraLines>>,
    /// The peers' health (`peers:` and the peers that are not up), from the timer thread.
    peers: Mutex<Vec<String>>,
    writing: Mutex<()>,
}

/// A source of status lines that change at run time.
pub type ExtraLines = Box<dyn Fn() -> Vec<String> + Send + Sync>;

// The `heartbeat:` and `reload:` lines' format is `run::status`'s (their readers' too).
use crate::run::status::heartbeat_line;
pub use crate::run::status::Reload;

impl StatusBoard {
    /// A board written to `paths`, with `workers` worker lines to come.
    pub fn new(paths: Vec<PathBuf>, base: Vec<String>, workers: usize) -> StatusBoard {
        let b = StatusBoard {
            paths,
            base,
            workers: Mutex::new(vec![None; workers]),
            heartbeats: Mutex::new(vec![0; workers]),
            reload: Mutex::new(Reload {
                generation: 0,
                result: Ok(()),
            }),
            extra: Mutex::new(None),
            peers: Mutex::new(Vec::new()),
            writing: Mutex::new(()),
        };
        b.write();
        b
    }

    /// A board that writes nowhere.
    pub fn detached() -> StatusBoard {
        StatusBoard::new(Vec::new(), Vec::new(), 0)
    }

    /// Worker `i` says what it runs.
    pub fn worker(&self, i: usize, line: String) {
        {
            let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
            if i >= w.len() {
                w.resize(i + 1, None);
            }
            w[i] = Some(line);
        }
        self.write();
    }

    /// The workers' heartbeat counters now (the timer thread, about once a second).
    pub fn heartbeats(&self, beats: Vec<u64>) {
        *self.heartbeats.lock().unwrap_or_else(|p| p.into_inner()) = beats;
        self.write();
    }

    /// Lines from `f` join the report (evaluated at each write, about once a second).
    pub fn extra(&self, f: ExtraLines) {
        *self.extra.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        self.write();
    }

    /// The peers' health lines now (see [`peer_lines`]); written with the next heartbeat.
    pub fn peers(&self, lines: Vec<String>) {
        *self.peers.lock().unwrap_or_else(|p| p.into_inner()) = lines;
    }

    /// A reload happened, with this result.
    pub fn reload(&self, r: Reload) {
        *self.reload.lock().unwrap_or_else(|p| p.into_inner()) = r;
        self.write();
    }

    /// The report as written.
    pub fn text(&self) -> String {
        let mut lines = self.base.clone();
        let w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        for (i, l) in w.iter().enumerate() {
            lines.push(format!(
                "worker {i}: {}",
                l.as_deref().unwrap_or("starting")
            ));
        }
        drop(w);
        let beats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        lines.push(heartbeat_line(&beats));
        drop(beats);
        lines.push(self.reload.lock().unwrap_or_else(|p| p.into_inner()).line());
        if let Some(f) = &*self.extra.lock().unwrap_or_else(|p| p.into_inner()) {
            lines.extend(f());
        }
        lines.extend(
            self.peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        if let Some(h) = crate::sys::hugepage::huge_info() {
            lines.push(format!(
                "hugepages: {} used of {} reserved ({} KiB pages)",
                h.total.saturating_sub(h.free),
                h.total,
                h.page_size >> 10
            ));
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }

    /// Replace each file whole: readers (init every half second, the console) never see
    /// a truncated one. Serialised, so two writers never share a temp file. No fsync: /run
    /// is a tmpfs and the file means nothing after a reboot.
    fn write(&self) {
        if self.paths.is_empty() {
            return;
        }
        let _g = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let text = self.text();
        for p in &self.paths {
            if let Some(d) = p.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            let mut tmp = p.clone().into_os_string();
            tmp.push(".tmp");
            let r = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, p));
            if let Err(e) = r {
                let _ = std::fs::remove_file(&tmp);
                log::warn!("cannot write {}: {e}", p.display());
            }
        }
    }
}

// ---- `riceguard status`: the reader of the file above, and the live peer table ----

pub(super) use crate::run::status_file as status_path;

/// The data-plane decisions made at start, for `riceguard status` and the console.
/// `riceguard status [IFNAME]`: the start-up decisions and the live peer table.
pub fn status_main(args: &[String]) -> ExitCode {
    let names: Vec<String> = match args.first() {
        Some(n) => vec![n.clone()],
        None => std::fs::read_dir(uapi::SOCKET_DIR)
            .map(|d| {
                let mut v: Vec<String> = d
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(|n| n.strip_suffix(".sock"))
                            .map(String::from)
                    })
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default(),
    };
    // Collected and written once: a closed pipe (`status | head`) ends the write, not
    // the process with a panic.
    let mut out = crate::run::clock::clock_line();
    out.push('\n');
    // The uplink's DHCP lease(s) next: they say how the appliance is reached.
    let leases = lease::lease_lines();
    for l in &leases {
        out.push_str(l);
        out.push('\n');
    }
    if names.is_empty() {
        use std::io::Write as _;
        let _ = std::io::stdout().lock().write_all(out.as_bytes());
        eprintln!(
            "no running riceguard interface (no sockets in {})",
            uapi::SOCKET_DIR
        );
        return ExitCode::from(1);
    }
    if !leases.is_empty() {
        out.push('\n');
    }
    let mut rc = ExitCode::SUCCESS;
    for n in names {
        match std::fs::read_to_string(status_path(&n)) {
            Ok(t) => out.push_str(&t),
            Err(_) => out.push_str(&format!("interface: {n}\n")),
        }
        match query(&n) {
            Ok(st) => out.push_str(&format_status(&st)),
            Err(e) => {
                out.push_str(&format!("  (daemon not answering: {e})\n"));
                rc = ExitCode::from(1);
            }
        }
        out.push('\n');
    }
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    rc
}

fn query(ifname: &str) -> Result<crate::core::uapi::DeviceStatus, String> {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(uapi::socket_path(ifname))
        .map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    s.write_all(b"get=1\n\n").map_err(|e| e.to_string())?;
    let mut r = std::io::BufReader::new(s);
    crate::core::uapi::read_get_response(&mut r).map_err(|e| e.to_string())
}

fn format_status(st: &crate::core::uapi::DeviceStatus) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if let Some(k) = st.private_key {
        let _ = writeln!(o, "public key: {}", k.public().to_base64());
    }
    let _ = writeln!(o, "listening port: {}", st.listen_port);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for p in &st.peers {
        let _ = writeln!(o, "peer: {}", p.public_key.to_base64());
        if let Some(e) = p.endpoint {
            let _ = writeln!(o, "  endpoint: {e}");
        }
        let ips: Vec<String> = p.allowed_ips.iter().map(|c| c.to_string()).collect();
        let _ = writeln!(
            o,
            "  allowed ips: {}",
            if ips.is_empty() {
                "(none)".into()
            } else {
                ips.join(", ")
            }
        );
        match p.last_handshake {
            Some((s, _)) if s > 0 => {
                let _ = writeln!(o, "  latest handshake: {} s ago", now.saturating_sub(s));
            }
            _ => {}
        }
        let _ = writeln!(
            o,
            "  transfer: {} B received, {} B sent",
            p.rx_bytes, p.tx_bytes
        );
    }
    o
}

/// Peers listed one by one in the status file beyond the `peers:` count (the file is
/// rewritten every second: it must stay small with 20 000 peers).
const PEER_LINES: usize = 20;

/// The status file's health lines: `peers: N up, N idle, N stale, N never`, then the
/// peers that share a key between two devices and those that are stale, at most
/// [`PEER_LINES`] (the metrics have every peer).
pub fn peer_lines(stats: &[crate::core::device::PeerStats]) -> Vec<String> {
    use crate::core::device::Health;
    let count = |h: Health| stats.iter().filter(|s| s.health == h).count();
    let mut out = vec![format!(
        "peers: {} up, {} idle, {} stale, {} never",
        count(Health::Up),
        count(Health::Idle),
        count(Health::Stale),
        count(Health::Never)
    )];
    let who = |s: &crate::core::device::PeerStats| match &s.name {
        Some(n) => format!("peer {n}"),
        None => format!("peer {}", crate::core::device::short(&s.public_key)),
    };
    let mut listed: Vec<String> = Vec::new();
    for s in stats {
        if let Some((a, b)) = s.shared_key {
            listed.push(format!(
                "{} is used from {} and {}: two devices share its key",
                who(s),
                a.ip(),
                b.ip()
            ));
        }
    }
    for s in stats.iter().filter(|s| s.health == Health::Stale) {
        listed.push(format!(
            "{}: stale (traffic waits, no handshake for {})",
            who(s),
            s.last_handshake
                .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
                .map_or("ever".into(), |d| format!("{} s", d.as_secs()))
        ));
    }
    let more = listed.len().saturating_sub(PEER_LINES);
    listed.truncate(PEER_LINES);
    out.extend(listed);
    if more > 0 {
        out.push(format!("(and {more} more: see the metrics)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::status::{parse_heartbeats, parse_reload};

    #[test]
    fn worker_lines_fill_in() {
        let dir = std::env::temp_dir().join(format!("rg-status-{}", std::process::id()));
        let p = dir.join("wg9.status");
        let b = StatusBoard::new(vec![p.clone()], vec!["interface: wg9".into()], 2);
        let t = std::fs::read_to_string(&p).expect("written at start");
        assert!(t.contains("worker 1: starting"), "{t}");
        b.worker(1, "io_uring".into());
        let t = std::fs::read_to_string(&p).expect("rewritten");
        assert!(
            t.starts_with("interface: wg9\nworker 0: starting\nworker 1: io_uring\n"),
            "{t}"
        );
        b.heartbeats(vec![7, 12]);
        b.reload(Reload {
            generation: 3,
            result: Err("wg9.conf: line 4: bad key\nmore".into()),
        });
        let t = std::fs::read_to_string(&p).expect("rewritten");
        assert!(t.contains("\nheartbeat: 7 12\n"), "{t}");
        assert_eq!(parse_heartbeats(&t), Some(vec![7, 12]));
        assert_eq!(
            parse_reload(&t),
            Some(Reload {
                generation: 3,
                result: Err("wg9.conf: line 4: bad key more".into())
            })
        );
        assert!(!dir.join("wg9.status.tmp").exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
