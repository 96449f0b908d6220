//! The event log's records: what an operator asks about after the fact (a commit, a
//! rollback, a boot, an update's outcome), one line each, as `perm::event_log` keeps them
//! on flash:
//!
//! ```text
//! 1764822370 console:ttyS0 commit: changed [Gateway] ClientDns; added peer laptop ~9c1d03a7
//! ```
//!
//! unix time, the source (a service, or `console:NAME`), the text, and `~` with an FNV-1a
//! checksum of everything before it. A record torn by a power cut (no newline, or cut
//! anywhere before it) or garbled on flash fails the checksum and is skipped by the
//! reader, never the records around it. Pure: no I/O.
//!
//! **No secret** reaches a record: callers pass names of changed keys, never their values
//! (`summary` below builds a commit's line that way); the text is cut to [`MAX_TEXT`]
//! bytes and stripped of control characters.

/// The longest text a record keeps (bytes, on a character boundary).
pub const MAX_TEXT: usize = 400;
/// The longest source name (bytes, on a character boundary).
pub const MAX_SOURCE: usize = 40;
/// The longest line the reader looks at (a longer one is not a record of ours).
pub const MAX_LINE: usize = 20 + 1 + MAX_SOURCE + 1 + MAX_TEXT + 11;

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Seconds since the epoch when it happened (the box's clock then).
    pub unix: u64,
    /// Who says it: `init`, `update`, `console:ttyS0`, `console:ssh-17:alice`.
    pub source: String,
    pub text: String,
}

impl Event {
    /// An event with its source and text made fit for a record (bounded, one line,
    /// printable; a source's spaces become `_`).
    pub fn new(unix: u64, source: &str, text: &str) -> Event {
        let mut src = String::new();
        for c in source.chars().filter(|c| !c.is_control()) {
            let c = if c.is_whitespace() { '_' } else { c };
            if src.len() + c.len_utf8() > MAX_SOURCE {
                break;
            }
            src.push(c);
        }
        let source = src;
        let mut t = String::new();
        for c in text.chars() {
            let c = if c.is_control() { ' ' } else { c };
            if t.len() + c.len_utf8() > MAX_TEXT {
                break;
            }
            t.push(c);
        }
        Event {
            unix,
            source: if source.is_empty() {
                "?".into()
            } else {
                source
            },
            text: t.trim().to_string(),
        }
    }

    /// The record: one line, newline included.
    pub fn record(&self) -> String {
        let body = format!("{} {} {}", self.unix, self.source, self.text);
        format!("{body} ~{:08x}\n", checksum(body.as_bytes()))
    }

    /// A record line (without its newline) back, if it is whole and ours.
    pub fn parse(line: &str) -> Option<Event> {
        if line.len() > MAX_LINE {
            return None;
        }
        let (body, sum) = line.rsplit_once(" ~")?;
        if sum.len() != 8 || u32::from_str_radix(sum, 16).ok()? != checksum(body.as_bytes()) {
            return None;
        }
        let mut w = body.splitn(3, ' ');
        let unix: u64 = w.next()?.parse().ok()?;
        let source = w.next()?;
        let text = w.next().unwrap_or("");
        let e = Event::new(unix, source, text);
        // Only what `new` would have written: anything else was not made by us.
        (e.source == source && e.text == text).then_some(e)
    }
}

/// All whole records of a log file's bytes, oldest first, and how many lines were skipped
/// (torn, garbled, not ours). A last line without its newline is a torn write: skipped.
pub fn parse_all(bytes: &[u8]) -> (Vec<Event>, usize) {
    let mut out = Vec::new();
    let mut skipped = 0;
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            skipped += 1;
            break;
        };
        let (line, after) = rest.split_at(nl);
        rest = &after[1..];
        // An empty line is the newline two writers put after the same torn record.
        if line.is_empty() {
            continue;
        }
        match std::str::from_utf8(line).ok().and_then(Event::parse) {
            Some(e) => out.push(e),
            None => skipped += 1,
        }
    }
    (out, skipped)
}

/// FNV-1a, 32 bits: tells a torn or garbled record from a whole one (not a security
/// check: whoever can write the file can write a checksum).
fn checksum(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    })
}

/// A commit's one line: which keys changed, by section, never their values. `old` and
/// `new` are the configuration texts (INI) before and after; peers are named by `Name`,
/// else by the start of their public key.
pub fn summary(old: &str, new: &str) -> String {
    let a = keys_by_section(old);
    let b = keys_by_section(new);
    let none: Vec<(String, String)> = Vec::new();
    let mut names: Vec<&String> = a.iter().map(|(s, _)| s).collect();
    for (s, _) in &b {
        if !names.contains(&s) {
            names.push(s);
        }
    }
    let mut parts: Vec<String> = Vec::new();
    for sec in names {
        let kv = a.iter().find(|(s, _)| s == sec).map(|(_, kv)| kv);
        let kv2 = b.iter().find(|(s, _)| s == sec).map(|(_, kv)| kv);
        // A peer comes or goes as a whole; other sections by their keys.
        if sec.starts_with("peer ") {
            match (kv, kv2) {
                (Some(_), None) => {
                    parts.push(format!("removed {sec}"));
                    continue;
                }
                (None, Some(_)) => {
                    parts.push(format!("added {sec}"));
                    continue;
                }
                _ => {}
            }
        }
        let (kv, kv2) = (kv.unwrap_or(&none), kv2.unwrap_or(&none));
        let mut changed: Vec<&str> = Vec::new();
        for (k, v) in kv {
            if kv2.iter().find(|(k2, _)| k2 == k).map(|(_, v2)| v2) != Some(v)
                && !changed.contains(&k.as_str())
            {
                changed.push(k);
            }
        }
        for (k, _) in kv2 {
            if !kv.iter().any(|(k1, _)| k1 == k) && !changed.contains(&k.as_str()) {
                changed.push(k);
            }
        }
        if !changed.is_empty() {
            parts.push(format!("{sec} {}", changed.join(", ")));
        }
    }
    if parts.is_empty() {
        return "no change".into();
    }
    format!("changed {}", parts.join("; "))
}

/// The sections of an INI text with their `Key = value` pairs (`#N+ ` marks taken off);
/// a `[Peer]` is named `peer NAME` (or `peer KEY…` by the start of its public key).
fn keys_by_section(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for line in text.lines() {
        let mut l = line.trim();
        // `#+ ` and `#3+ ` lines are settings older firmware skips; other comments are not.
        if let Some(r) = l.strip_prefix('#') {
            let digits = r.trim_start_matches(|c: char| c.is_ascii_digit());
            match digits.strip_prefix('+') {
                Some(x) => l = x.trim(),
                None => continue,
            }
        }
        if l.starts_with('[') {
            let name = l.trim_matches(['[', ']']).trim().to_string();
            out.push((name, Vec::new()));
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            continue;
        };
        if out.is_empty() {
            out.push((String::new(), Vec::new()));
        }
        if let Some(last) = out.last_mut() {
            last.1.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    // Name the peers, and number what is still ambiguous (two peers without a name).
    let mut named = Vec::with_capacity(out.len());
    for (sec, kv) in out {
        let sec = if sec.eq_ignore_ascii_case("peer") {
            let get = |key: &str| {
                kv.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v.clone())
            };
            match (get("Name"), get("PublicKey")) {
                (Some(n), _) => format!("peer {n}"),
                (None, Some(k)) => format!("peer {}…", k.chars().take(8).collect::<String>()),
                (None, None) => "peer ?".into(),
            }
        } else {
            format!("[{sec}]")
        };
        named.push((sec, kv));
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_checks() {
        let e = Event::new(
            1_764_822_370,
            "console:ssh-17:alice",
            "commit: changed [Gateway] ClientDns",
        );
        let r = e.record();
        assert!(r.ends_with('\n') && r.matches('\n').count() == 1, "{r}");
        assert_eq!(Event::parse(r.trim_end_matches('\n')), Some(e.clone()));
        // Any one byte changed: not a record.
        let line = r.trim_end_matches('\n');
        for i in 0..line.len() {
            let mut b = line.as_bytes().to_vec();
            b[i] ^= 0x01;
            if let Ok(s) = std::str::from_utf8(&b) {
                assert_ne!(Event::parse(s).as_ref(), Some(&e), "byte {i} flipped: {s}");
            }
        }
    }

    #[test]
    fn new_makes_any_input_fit() {
        let e = Event::new(1, "a b\nc", &format!("x\ny\u{7}{}", "é".repeat(400)));
        assert_eq!(e.source, "a_bc", "spaces become _, control characters go");
        assert!(!e.text.contains('\n') && e.text.len() <= MAX_TEXT);
        assert_eq!(Event::parse(e.record().trim_end()), Some(e));
        assert_eq!(Event::new(1, "", "").source, "?");
    }

    #[test]
    fn a_torn_last_record_is_skipped_not_the_log() {
        let a = Event::new(10, "init", "boot 3: slot a");
        let b = Event::new(11, "console:ttyS0", "commit: changed [Gateway] Ntp");
        let mut bytes = (a.record() + &b.record()).into_bytes();
        assert_eq!(parse_all(&bytes), (vec![a.clone(), b.clone()], 0));
        let mut blank = bytes.clone();
        blank.push(b'\n');
        assert_eq!(
            parse_all(&blank),
            (vec![a.clone(), b.clone()], 0),
            "an empty line is no record lost"
        );
        // A power cut in the middle of the third record.
        let c = Event::new(12, "init", "boot 4: slot b");
        let rc = c.record();
        bytes.extend_from_slice(&rc.as_bytes()[..rc.len() / 2]);
        assert_eq!(parse_all(&bytes), (vec![a.clone(), b.clone()], 1));
        // Garbage in the middle (a block of flash gone bad) costs that line only.
        let mut g = a.record().into_bytes();
        g.extend_from_slice(b"\xff\xff\x00 not ours\n");
        g.extend_from_slice(b.record().as_bytes());
        assert_eq!(parse_all(&g), (vec![a, b], 1));
    }

    #[test]
    fn summary_names_keys_never_values() {
        let old = "[Interface]\nPrivateKey = c2VjcmV0c2VjcmV0\nListenPort = 51820\n\n[Peer]\nName = phone\nPublicKey = AAAA\nAllowedIPs = 10.0.0.2/32\n\n[Gateway]\n#4+ SshPort = 22\n";
        let new = "[Interface]\nPrivateKey = bmV3c2VjcmV0bmV3\nListenPort = 51820\n\n[Peer]\nName = phone\nPublicKey = AAAA\nAllowedIPs = 10.0.0.2/32, 10.0.1.0/24\n\n[Peer]\nPublicKey = BBBBBBBBBBBB\nAllowedIPs = 10.0.0.3/32\n\n[Gateway]\n#4+ SshPort = 2222\nClientDns = 192.0.2.53\n";
        let s = summary(old, new);
        assert_eq!(
            s,
            "changed [Interface] PrivateKey; peer phone AllowedIPs; [Gateway] SshPort, ClientDns; added peer BBBBBBBB…"
        );
        for secret in ["c2VjcmV0", "bmV3c2Vj", "2222", "192.0.2.53", "10.0.1.0"] {
            assert!(!s.contains(secret), "{secret} in {s}");
        }
        assert_eq!(summary(old, old), "no change");
        assert!(summary(new, old).contains("removed peer BBBBBBBB…"));
        // A section that appears (the defaults wrote none) is named by its keys.
        assert_eq!(
            summary(
                "[Interface]\nListenPort = 1\n",
                "[Interface]\nListenPort = 1\n\n[Gateway]\nClientDns = 192.0.2.1\n"
            ),
            "changed [Gateway] ClientDns"
        );
    }
}
