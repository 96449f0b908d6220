//! The update-on-boot request [`REQUEST`]: bundles (one source a line; blank lines and
//! `#` comments skipped, at most 8) to install once after a good boot; written by a user
//! or a test, taken by init, which renames it to [`DONE`] first, so a bundle that fails
//! can never loop.

use std::path::{Path, PathBuf};

/// The request, under perm.
pub const REQUEST: &str = "update-on-boot";
/// What [`REQUEST`] becomes once taken.
pub const DONE: &str = "update-on-boot.done";
/// The most sources one request names.
const MAX_SOURCES: usize = 8;

/// [`REQUEST`] on the appliance's perm.
pub fn request_path() -> PathBuf {
    super::path(REQUEST)
}

/// The bundle sources in a request's text.
pub fn parse(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(MAX_SOURCES)
        .map(str::to_string)
        .collect()
}

/// Take the request in `dir`, once: `None` when there is none or it could not be
/// renamed to [`DONE`] (then it is not acted on).
pub fn take(dir: &Path) -> Option<Vec<String>> {
    let p = dir.join(REQUEST);
    let text = std::fs::read_to_string(&p).ok()?;
    crate::durable::rename(&p, &dir.join(DONE)).ok()?;
    Some(parse(&text))
}
