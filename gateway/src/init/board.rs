//! The board file `/etc/riceguard/board.conf`: shell-style `KEY=VALUE` lines written by
//! the image builder from `board/<board>/board.conf`, read by init at boot. Only the keys
//! init acts on are kept; the parser is bounded and never fails on an unknown key.

use std::fmt;

/// What init needs from the board.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Board {
    pub name: String,
    /// Kernel modules to load, in order (dependencies come from `modules.dep`).
    pub modules: Vec<String>,
    /// Data-plane cores (RPS target of the uplink queues). Empty: leave steering alone.
    pub dataplane_cores: Vec<usize>,
    /// 2 MiB hugepages to reserve.
    pub hugepages: u32,
    /// Terminals the configuration console runs on, without `/dev/`, in order (e.g.
    /// `ttyS0`, the serial line, and `tty1`, the screen and keyboard). `CONSOLE=ttyS0` (the
    /// old single form) and `CONSOLE="ttyS0 tty1"` (or `CONSOLES=`) both give the list;
    /// `kernel` names the serial line the kernel's own console is on (resolved at boot).
    pub consoles: Vec<String>,
    /// Watchdog device; empty: none.
    pub watchdog: String,
    /// Watchdog timeout in seconds.
    pub watchdog_timeout: u32,
}

impl Default for Board {
    fn default() -> Self {
        Board {
            name: "unknown".into(),
            modules: Vec::new(),
            dataplane_cores: Vec::new(),
            hugepages: 0,
            consoles: Vec::new(),
            watchdog: String::new(),
            watchdog_timeout: 30,
        }
    }
}

/// A line that could not be used, with its number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoardError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for BoardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "board.conf line {}: {}", self.line, self.msg)
    }
}

/// Most lines and bytes a board file may have: it is ours, small, and read by PID 1.
const MAX_BYTES: usize = 64 * 1024;
const MAX_LIST: usize = 256;

/// Parse a board file. Bad values are reported per line and leave the default for that
/// key; the rest of the file still applies (a typo must not stop the appliance booting).
pub fn parse(text: &str) -> (Board, Vec<BoardError>) {
    let mut b = Board::default();
    let mut errs = Vec::new();
    let text = if text.len() > MAX_BYTES {
        errs.push(BoardError {
            line: 0,
            msg: format!("file longer than {MAX_BYTES} bytes; rest ignored"),
        });
        let mut end = MAX_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        &text[..end]
    } else {
        text
    };
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            errs.push(BoardError {
                line: n,
                msg: "expected KEY=VALUE".into(),
            });
            continue;
        };
        let v = unquote(v.trim());
        let mut bad = |m: String| {
            errs.push(BoardError {
                line: n,
                msg: format!("{}: {m}", k.trim()),
            })
        };
        match k.trim() {
            "BOARD" => b.name = v.to_string(),
            "MODULES" => {
                b.modules = v
                    .split_whitespace()
                    .take(MAX_LIST)
                    .map(str::to_string)
                    .collect()
            }
            "DATAPLANE_CORES" => match parse_cpus(v) {
                Ok(c) => b.dataplane_cores = c,
                Err(m) => bad(m),
            },
            "HUGEPAGES" => match v.parse() {
                Ok(h) => b.hugepages = h,
                Err(_) => bad(format!("`{v}` is not a number of hugepages")),
            },
            "CONSOLE" | "CONSOLES" => match parse_consoles(v) {
                Ok(c) => b.consoles = c,
                Err(m) => bad(m),
            },
            "WATCHDOG" => b.watchdog = v.to_string(),
            "WATCHDOG_TIMEOUT" => match v.parse::<u32>() {
                Ok(t) if (1..=3600).contains(&t) => b.watchdog_timeout = t,
                _ => bad(format!("`{v}` is not a timeout in seconds (1..3600)")),
            },
            _ => {} // build-time keys (KERNEL_PKG, QEMU_ARGS, ...) are not init's business
        }
    }
    (b, errs)
}

/// Most consoles a board may list (a serial line, a screen, a spare: more is a typo).
const MAX_CONSOLES: usize = 4;

/// A console list: names under `/dev` (`/dev/` prefixes dropped), separated by spaces or
/// commas, each a plain device name (no `/`, no `..`), duplicates dropped, at most
/// [`MAX_CONSOLES`]. Empty: no console.
pub fn parse_consoles(v: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for w in v.split([' ', ',', '\t']).filter(|w| !w.is_empty()) {
        let name = w.trim_start_matches("/dev/");
        let plain = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
            && name != "."
            && name != "..";
        if !plain {
            return Err(format!(
                "`{w}` is not a terminal under /dev (e.g. ttyS0, tty1, hvc0)"
            ));
        }
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    if out.len() > MAX_CONSOLES {
        return Err(format!("at most {MAX_CONSOLES} consoles"));
    }
    Ok(out)
}

fn unquote(v: &str) -> &str {
    let b = v.as_bytes();
    if b.len() >= 2 && (b[0] == b'"' || b[0] == b'\'') && b[b.len() - 1] == b[0] {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// A CPU list as the kernel writes them: `0-3,6,8-9` (also space separated). Bounded.
pub fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    const MAX_CPU: usize = 1023;
    let mut out = Vec::new();
    for part in s.split([',', ' ']).map(str::trim).filter(|p| !p.is_empty()) {
        let (a, z) = match part.split_once('-') {
            Some((a, z)) => (a, z),
            None => (part, part),
        };
        let (Ok(a), Ok(z)) = (a.parse::<usize>(), z.parse::<usize>()) else {
            return Err(format!(
                "`{part}` is not a CPU number or range (e.g. 1-3,5)"
            ));
        };
        if a > z || z > MAX_CPU {
            return Err(format!("`{part}` is not a CPU range within 0-{MAX_CPU}"));
        }
        for c in a..=z {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The hex mask `/sys/class/net/*/queues/rx-*/rps_cpus` takes, in 32-bit groups
/// separated by commas (most significant first), as the kernel prints it.
pub fn cpu_mask(cpus: &[usize]) -> String {
    let Some(&max) = cpus.iter().max() else {
        return "0".into();
    };
    let mut words = vec![0u32; max / 32 + 1];
    for &c in cpus {
        words[c / 32] |= 1 << (c % 32);
    }
    let parts: Vec<String> = words.iter().rev().map(|w| format!("{w:08x}")).collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_board_file() {
        let (b, errs) = parse(
            "# qemu\nBOARD=qemu-x86_64\nMODULES=\"virtio_blk squashfs\"\nDATAPLANE_CORES='1'\n\
             HUGEPAGES=32\nCONSOLE=/dev/ttyS0\nWATCHDOG=/dev/watchdog\nQEMU_ARGS=\"-m 1G\"\n",
        );
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(b.name, "qemu-x86_64");
        assert_eq!(b.modules, ["virtio_blk", "squashfs"]);
        assert_eq!(b.dataplane_cores, [1]);
        assert_eq!(b.hugepages, 32);
        assert_eq!(b.consoles, ["ttyS0"]);
        assert_eq!(b.watchdog, "/dev/watchdog");
    }

    #[test]
    fn bad_lines_are_reported_and_skipped() {
        let (b, errs) = parse(
            "HUGEPAGES=lots\nnonsense\nWATCHDOG_TIMEOUT=0\nDATAPLANE_CORES=3-1\nCONSOLE=ttyAMA0\n",
        );
        assert_eq!(errs.len(), 4);
        assert_eq!(errs[1].line, 2);
        assert_eq!(b.hugepages, 0);
        assert_eq!(b.consoles, ["ttyAMA0"]);
        let (_, errs) = parse(&"#".repeat(MAX_BYTES + 10));
        assert_eq!(errs.len(), 1);
    }

    /// The old single `CONSOLE=ttyS0` and the list forms give the same kind of list; a
    /// bad name is refused and leaves the default (no console), never a path.
    #[test]
    fn console_lists() {
        let (b, errs) = parse("CONSOLE=\"ttyS0 tty1\"\n");
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(b.consoles, ["ttyS0", "tty1"]);
        let (b, _) = parse("CONSOLES='/dev/ttyS2,hvc0, ttyS2'\n");
        assert_eq!(b.consoles, ["ttyS2", "hvc0"]);
        let (b, _) = parse("CONSOLE=\n");
        assert!(b.consoles.is_empty());
        for bad in ["../sda", "tty1 /etc/x", "a b c d e"] {
            let (b, errs) = parse(&format!("CONSOLE=\"{bad}\"\n"));
            assert_eq!(errs.len(), 1, "{bad}");
            assert!(b.consoles.is_empty(), "{bad}");
        }
    }

    #[test]
    fn cpu_lists_and_masks() {
        assert_eq!(parse_cpus("0-2,5 7").unwrap(), [0, 1, 2, 5, 7]);
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("0-5000").is_err());
        assert_eq!(cpu_mask(&[1]), "00000002");
        assert_eq!(cpu_mask(&[0, 33]), "00000002,00000001");
        assert_eq!(cpu_mask(&[]), "0");
    }
}
