//! The daemon's status file (`riceguard status`, the console's `show status`): the
//! start-up decisions, then one line per worker as each one starts (which backend it
//! runs, its ring, where its buffer pool lives) and the hugepages used of those reserved.

use std::path::PathBuf;
use std::sync::Mutex;

/// The lines of the status report; rewritten whole whenever a worker reports.
pub struct StatusBoard {
    /// Files written (none for a detached board, as in tests).
    paths: Vec<PathBuf>,
    base: Vec<String>,
    workers: Mutex<Vec<Option<String>>>,
}

impl StatusBoard {
    /// A board written to `paths`, with `workers` worker lines to come.
    pub fn new(paths: Vec<PathBuf>, base: Vec<String>, workers: usize) -> StatusBoard {
        let b = StatusBoard {
            paths,
            base,
            workers: Mutex::new(vec![None; workers]),
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

    fn write(&self) {
        if self.paths.is_empty() {
            return;
        }
        let text = self.text();
        for p in &self.paths {
            if let Some(d) = p.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            if let Err(e) = std::fs::write(p, &text) {
                log::warn!("cannot write {}: {e}", p.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let _ = std::fs::remove_dir_all(dir);
    }
}
