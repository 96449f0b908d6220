//! The boot counter [`BOOTS`]: one decimal number and a newline, mode 0644, counted up by
//! init each time perm mounts.

use std::io;
use std::path::Path;

/// The boot counter, under perm.
pub const BOOTS: &str = "log/boots";

/// The count in [`BOOTS`]'s text (0 when it does not read).
pub fn parse(text: &str) -> u64 {
    text.trim().parse::<u64>().unwrap_or(0)
}

/// [`BOOTS`]'s text for count `n`.
pub fn text(n: u64) -> String {
    format!("{n}\n")
}

/// The count this boot has (0 when nothing counted yet).
pub fn count(dir: &Path) -> u64 {
    parse(&std::fs::read_to_string(dir.join(BOOTS)).unwrap_or_default())
}

/// Count this boot in `dir`'s [`BOOTS`]; returns the new count (written or not).
pub fn count_boot(dir: &Path) -> (u64, io::Result<()>) {
    let p = dir.join(BOOTS);
    if let Some(parent) = p.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let n = parse(&std::fs::read_to_string(&p).unwrap_or_default()) + 1;
    let r = crate::durable::write(&p, text(n).as_bytes(), crate::durable::PUBLIC);
    (n, r)
}
