//! The lines of the daemon's status file that other processes read: `heartbeat: N N ...`
//! (init's health watch) and `reload: generation N ok|failed REASON` (the console's
//! commit). The daemon (`driver::daemon::status`) writes them with [`heartbeat_line`] and
//! [`Reload::line`]; readers use [`parse_heartbeats`] and [`parse_reload`].

/// The last reload (SIGHUP) of the configuration file and how it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reload {
    /// 0 is the start-up file; each SIGHUP adds one.
    pub generation: u64,
    /// `Err(reason)`: refused; the previous configuration keeps running.
    pub result: Result<(), String>,
}

impl Reload {
    /// The `reload:` line (a reason's line breaks become spaces: one line).
    pub fn line(&self) -> String {
        match &self.result {
            Ok(()) => format!("reload: generation {} ok", self.generation),
            Err(r) => format!(
                "reload: generation {} failed {}",
                self.generation,
                r.replace('\n', " ")
            ),
        }
    }
}

/// The `reload:` line of a status file, if there is a well-formed one.
pub fn parse_reload(text: &str) -> Option<Reload> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("reload: generation "))?;
    let (n, rest) = rest.split_once(' ')?;
    let generation = n.parse().ok()?;
    let result = if rest == "ok" {
        Ok(())
    } else {
        Err(rest.strip_prefix("failed ")?.to_string())
    };
    Some(Reload { generation, result })
}

/// The `heartbeat:` line for the workers' counters.
pub fn heartbeat_line(beats: &[u64]) -> String {
    let beats: Vec<String> = beats.iter().map(u64::to_string).collect();
    format!("heartbeat: {}", beats.join(" "))
}

/// The worker heartbeats of a status file (`heartbeat: N N ...`), if there is such a line.
pub fn parse_heartbeats(text: &str) -> Option<Vec<u64>> {
    let rest = text.lines().find_map(|l| l.strip_prefix("heartbeat:"))?;
    rest.split_whitespace().map(|n| n.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse() {
        let t = "interface: wg0\nheartbeat: 1 2 3\nreload: generation 0 ok\n";
        assert_eq!(parse_heartbeats(t), Some(vec![1, 2, 3]));
        assert_eq!(
            parse_reload(t),
            Some(Reload {
                generation: 0,
                result: Ok(())
            })
        );
        assert_eq!(parse_heartbeats("heartbeat: 1 x\n"), None);
        assert_eq!(parse_heartbeats("interface: wg0\n"), None);
        assert_eq!(parse_heartbeats("heartbeat: \n"), Some(vec![]));
        assert_eq!(parse_reload("reload: generation 2 maybe\n"), None);
        assert_eq!(parse_reload("reload: generation x ok\n"), None);
    }

    /// What the writer makes, the readers read back; bad input is `None`, never a panic.
    #[test]
    fn lines_round_trip() {
        for beats in [vec![], vec![0], vec![7, 12, u64::MAX]] {
            let l = heartbeat_line(&beats);
            assert_eq!(parse_heartbeats(&format!("x\n{l}\n")), Some(beats));
        }
        assert_eq!(heartbeat_line(&[7, 12]), "heartbeat: 7 12");
        for r in [
            Reload {
                generation: 0,
                result: Ok(()),
            },
            Reload {
                generation: 9,
                result: Err("line 4: bad key".into()),
            },
            Reload {
                generation: u64::MAX,
                result: Err(String::new()),
            },
        ] {
            assert_eq!(parse_reload(&r.line()), Some(r));
        }
        let multi = Reload {
            generation: 3,
            result: Err("a\nb".into()),
        };
        assert_eq!(multi.line(), "reload: generation 3 failed a b");
        for bad in [
            "",
            "reload:",
            "reload: generation ",
            "reload: generation 1",
            "reload: generation -1 ok",
            "heartbeat: 99999999999999999999999",
        ] {
            let _ = parse_reload(bad);
            assert_eq!(parse_reload(bad), None, "{bad:?}");
            assert!(
                parse_heartbeats(bad).is_none_or(|v| v.is_empty()),
                "{bad:?}"
            );
        }
    }
}
