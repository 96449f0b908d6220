//! `sysctl.d` files: `key = value` lines applied by writing `/proc/sys/<key with / for .>`.
//! Parsing is pure; [`apply`] does the writes and reports each failure without stopping.

use std::path::{Path, PathBuf};

/// One setting from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub key: String,
    pub value: String,
    /// A leading `-` in the file: a missing key is not an error (as systemd-sysctl).
    pub optional: bool,
}

/// Parse one file's text. Lines that are not `key = value` come back as errors (with
/// their line number); keys with `..` or `/` are refused, so nothing outside /proc/sys is written.
pub fn parse(text: &str) -> (Vec<Setting>, Vec<String>) {
    let mut out = Vec::new();
    let mut errs = Vec::new();
    for (i, raw) in text.lines().take(10_000).enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            errs.push(format!("line {}: expected key = value", i + 1));
            continue;
        };
        let mut key = k.trim();
        let optional = key.starts_with('-');
        key = key.trim_start_matches('-');
        let ok = !key.is_empty()
            && !key.contains("..")
            && !key.contains('/')
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            errs.push(format!("line {}: `{key}` is not a sysctl name", i + 1));
            continue;
        }
        out.push(Setting {
            key: key.to_string(),
            value: v.trim().to_string(),
            optional,
        });
    }
    (out, errs)
}

pub fn proc_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// Apply every `*.conf` in `dir`, in name order. Returns (applied, problems).
pub fn apply(dir: &Path) -> (usize, Vec<String>) {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect(),
        Err(_) => return (0, Vec::new()),
    };
    files.sort();
    let mut n = 0;
    let mut problems = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            problems.push(format!("{}: unreadable", f.display()));
            continue;
        };
        let (set, errs) = parse(&text);
        problems.extend(errs.into_iter().map(|e| format!("{}: {e}", f.display())));
        for s in set {
            match std::fs::write(proc_path(&s.key), &s.value) {
                Ok(()) => n += 1,
                Err(e) if s.optional && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => problems.push(format!("{} = {}: {e}", s.key, s.value)),
            }
        }
    }
    (n, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysctl_d() {
        let (s, e) = parse(
            "# c\nnet.core.rmem_max = 7340032\n-net.core.busy_poll=50\nbad line\nx/../y = 1\n",
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].key, "net.core.rmem_max");
        assert_eq!(s[0].value, "7340032");
        assert!(s[1].optional);
        assert_eq!(e.len(), 2);
        assert_eq!(
            proc_path("net.ipv4.ip_forward"),
            Path::new("/proc/sys/net/ipv4/ip_forward")
        );
    }
}
