//! Init's figures for the metrics endpoint: the slot this boot runs, whether init has
//! marked the boot good, and per supervised service its starts and whether it runs.
//! Init writes [`SERVICES`] in the run directory when one of them changes
//! ([`write_figures`]); the daemon reads it at each scrape ([`read_figures`]). Missing
//! (a host, a drop-in daemon): nothing of init's is exported.
//!
//! The format, one item a line (unknown and bad lines are skipped; names have no space):
//! ```text
//! slot a
//! marked no
//! service gateway 2 running
//! service ntp 1 stopped
//! ```

use std::path::Path;

/// The file, in the run directory.
pub const SERVICES: &str = "services";

/// At most this many services are read back.
const MAX_SERVICES: usize = 64;

/// A supervised service: how often it was started this boot and whether it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceState {
    pub name: String,
    pub starts: u64,
    pub running: bool,
}

impl ServiceState {
    /// Restarts: every start after the first.
    pub fn restarts(&self) -> u64 {
        self.starts.saturating_sub(1)
    }
}

/// What init knows that the daemon does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitFigures {
    pub slot: Option<char>,
    /// The boot was marked good (healthy; an update's trial is over).
    pub marked: bool,
    pub services: Vec<ServiceState>,
}

impl InitFigures {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if let Some(c) = self.slot {
            s.push_str(&format!("slot {c}\n"));
        }
        s.push_str(if self.marked {
            "marked yes\n"
        } else {
            "marked no\n"
        });
        for v in &self.services {
            // A name is one word: init's names are ("console-ttyS0"), this keeps it so.
            let name: String = v
                .name
                .chars()
                .map(|c| if c.is_whitespace() { '_' } else { c })
                .collect();
            s.push_str(&format!(
                "service {name} {} {}\n",
                v.starts,
                if v.running { "running" } else { "stopped" }
            ));
        }
        s
    }

    pub fn from_text(text: &str) -> InitFigures {
        let mut f = InitFigures::default();
        for l in text.lines().take(MAX_SERVICES + 8) {
            let w: Vec<&str> = l.split(' ').collect();
            match w.as_slice() {
                ["slot", s] => {
                    let mut c = s.chars();
                    if let (Some(c @ ('a' | 'b')), None) = (c.next(), c.next()) {
                        f.slot = Some(c);
                    }
                }
                ["marked", "yes"] => f.marked = true,
                ["marked", "no"] => f.marked = false,
                ["service", name, starts, state]
                    if !name.is_empty() && f.services.len() < MAX_SERVICES =>
                {
                    let (Ok(starts), Some(running)) = (
                        starts.parse(),
                        match *state {
                            "running" => Some(true),
                            "stopped" => Some(false),
                            _ => None,
                        },
                    ) else {
                        continue;
                    };
                    f.services.push(ServiceState {
                        name: name.chars().take(64).collect(),
                        starts,
                        running,
                    });
                }
                _ => {}
            }
        }
        f
    }
}

/// Init: write [`SERVICES`] in `dir` when it differs from `last` (what it wrote, or tried
/// to, before).
pub fn write_figures(dir: &Path, f: &InitFigures, last: &mut String) {
    let text = f.to_text();
    if text == *last {
        return;
    }
    let p = dir.join(SERVICES);
    if let Err(e) = crate::durable::write(&p, text.as_bytes(), crate::durable::PUBLIC) {
        log::warn!("{}: {e}", p.display());
    }
    // Tried once per change: a run directory that cannot be written is said once, not
    // at every turn of init's loop.
    *last = text;
}

/// The daemon: init's figures in `dir`, if init wrote them.
pub fn read_figures(dir: &Path) -> Option<InitFigures> {
    let t = std::fs::read(dir.join(SERVICES)).ok()?;
    // Bounded: a file init wrote is a few hundred bytes.
    let t = String::from_utf8_lossy(&t[..t.len().min(16 * 1024)]).into_owned();
    Some(InitFigures::from_text(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_round_trip_and_bad_lines_are_skipped() {
        let f = InitFigures {
            slot: Some('b'),
            marked: true,
            services: vec![
                ServiceState {
                    name: "gateway".into(),
                    starts: 3,
                    running: true,
                },
                ServiceState {
                    name: "console-ttyS0".into(),
                    starts: 0,
                    running: false,
                },
            ],
        };
        assert_eq!(InitFigures::from_text(&f.to_text()), f);
        assert_eq!(f.services[0].restarts(), 2);
        assert_eq!(f.services[1].restarts(), 0);
        let t = "slot c\nslot ab\nmarked maybe\nservice x -1 running\nservice y 1 dead\n\
                 service  1 running\nservice z 2 running extra\nservice ok 4 stopped\n\0\n";
        assert_eq!(
            InitFigures::from_text(t),
            InitFigures {
                slot: None,
                marked: false,
                services: vec![ServiceState {
                    name: "ok".into(),
                    starts: 4,
                    running: false
                }],
            }
        );
        let spaced = InitFigures {
            services: vec![ServiceState {
                name: "a b".into(),
                starts: 1,
                running: true,
            }],
            ..InitFigures::default()
        };
        assert_eq!(
            InitFigures::from_text(&spaced.to_text()).services[0].name,
            "a_b"
        );
    }

    #[test]
    fn written_only_when_changed_and_read_back() {
        let d = crate::testutil::TempDir::new("run-services");
        assert_eq!(read_figures(&d.0), None);
        let mut last = String::new();
        let mut f = InitFigures {
            slot: Some('a'),
            ..InitFigures::default()
        };
        write_figures(&d.0, &f, &mut last);
        assert_eq!(read_figures(&d.0), Some(f.clone()));
        // Unchanged: not written again (a file removed behind init's back stays gone).
        std::fs::remove_file(d.0.join(SERVICES)).unwrap();
        write_figures(&d.0, &f, &mut last);
        assert_eq!(read_figures(&d.0), None);
        f.marked = true;
        write_figures(&d.0, &f, &mut last);
        assert_eq!(read_figures(&d.0), Some(f));
    }
}
