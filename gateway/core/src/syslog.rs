//! Remote syslog without I/O: RFC 5424 messages from the appliance's log lines, their
//! framing (RFC 6587 octet counting over TCP, one datagram per message over UDP, RFC
//! 5426), and the bounded backlog of messages waiting for the collector.
//!
//! The appliance's lines come in two shapes: the logger's own
//! (`[   12.345] riceguard INFO  message`, `logger.rs`) and init's relay of a service's
//! output (`gateway: [   12.345] riceguard WARN  message`, `dhcp: ...`), beside init's
//! own `riceguard-init: ...` lines. [`parse_console_line`] and [`parse_logger_line`]
//! take them apart; they accept any text (fuzz target `syslog_line`).
//!
//! Time comes in as an argument ([`UnixTime`]); the caller owns the clock and the socket.

use std::collections::VecDeque;
use std::fmt::Write as _;

use crate::clock::{Civil, UnixTime};

/// Facility `daemon` (RFC 5424 table 1).
pub const FACILITY_DAEMON: u8 = 3;
/// The longest APP-NAME, HOSTNAME and PROCID (RFC 5424 section 6).
pub const MAX_APP_NAME: usize = 48;
pub const MAX_HOSTNAME: usize = 255;
pub const MAX_PROCID: usize = 128;
/// The longest message kept whole (header included); the logger's lines are at most
/// 2 KiB and init's relay cuts a service's lines at 4 KiB, so this cuts nothing real.
pub const MAX_MESSAGE: usize = 8192;
/// The longest datagram sent over UDP: RFC 5426 asks collectors to take 480 bytes
/// (IPv4) and recommends 2048; longer messages are cut there.
pub const MAX_UDP: usize = 2048;
/// The backlog's default budget in bytes (messages as they will be sent).
pub const BACKLOG_BYTES: usize = 256 * 1024;
/// The app-name of the messages the backlog itself makes (the drop notice).
pub const SELF_APP: &str = "syslog";
/// Marks the MSG as UTF-8 (RFC 5424 section 6.4); sent only when the text is not ASCII.
const BOM: &str = "\u{feff}";
const INIT_PREFIX: &str = "riceguard-init: ";
/// Init's few lines without its prefix (`riceguard: public key ...`).
const INIT_PLAIN_PREFIX: &str = "riceguard: ";

/// RFC 5424 severities (table 2); lower is more severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Emergency = 0,
    Alert = 1,
    Critical = 2,
    Error = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
    Debug = 7,
}

impl Severity {
    /// The logger's level word (`ERROR`, `WARN`, `INFO`, `DEBUG`, `TRACE`); `None` for
    /// anything else.
    pub fn from_level(word: &str) -> Option<Severity> {
        Some(match word {
            "ERROR" => Severity::Error,
            "WARN" => Severity::Warning,
            "INFO" => Severity::Info,
            "DEBUG" | "TRACE" => Severity::Debug,
            _ => return None,
        })
    }

    /// `<PRI>`'s value with facility daemon.
    pub fn pri(self) -> u8 {
        FACILITY_DAEMON * 8 + self as u8
    }
}

/// One log line taken apart: who said it, how severe, and the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    /// The service (`gateway`, `dhcp`, `ntp`, `ssh`, ...), `init` for init's own lines.
    pub app: &'a str,
    pub severity: Severity,
    pub msg: &'a str,
}

/// A logger line, `[   12.345] riceguard INFO  message`: its severity and the message
/// without the monotonic stamp, the program and the level. Text of any other shape is
/// kept whole at severity notice (RFC 5424's "normal but significant").
pub fn parse_logger_line(line: &str) -> (Severity, &str) {
    let unknown = (Severity::Notice, line.trim());
    let Some(rest) = line.trim_start().strip_prefix('[') else {
        return unknown;
    };
    let Some((stamp, rest)) = rest.split_once(']') else {
        return unknown;
    };
    if !stamp
        .trim()
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.')
    {
        return unknown;
    }
    let rest = rest.trim_start_matches(' ');
    let Some((_program, rest)) = rest.split_once(' ') else {
        return unknown;
    };
    let rest = rest.trim_start_matches(' ');
    let (word, msg) = rest.split_once(' ').unwrap_or((rest, ""));
    match Severity::from_level(word) {
        Some(s) => (s, msg.trim()),
        None => unknown,
    }
}

/// A line init wrote to the console: its own (`riceguard-init: ...`, `riceguard: ...`
/// and anything else not from a service: app `init`, severity notice, or error for a
/// `FATAL`), or a service's line
/// it relayed as `NAME: line` (app `NAME`, the rest read by [`parse_logger_line`]).
pub fn parse_console_line(line: &str) -> Line<'_> {
    if let Some(rest) = line.strip_prefix(INIT_PREFIX) {
        let severity = if rest.starts_with("FATAL") {
            Severity::Error
        } else {
            Severity::Notice
        };
        return Line {
            app: "init",
            severity,
            msg: rest.trim(),
        };
    }
    if let Some(rest) = line.strip_prefix(INIT_PLAIN_PREFIX) {
        return Line {
            app: "init",
            severity: Severity::Notice,
            msg: rest.trim(),
        };
    }
    if let Some((name, rest)) = line.split_once(": ") {
        if is_service_name(name) {
            let (severity, msg) = parse_logger_line(rest);
            return Line {
                app: name,
                severity,
                msg,
            };
        }
    }
    Line {
        app: "init",
        severity: Severity::Notice,
        msg: line.trim(),
    }
}

/// A name init gives a service: 1-48 of `A-Z a-z 0-9 . _ -`.
fn is_service_name(s: &str) -> bool {
    (1..=MAX_APP_NAME).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Who sends: the HOSTNAME field, kept as it will be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    hostname: String,
}

impl Origin {
    /// `hostname` made a valid field: PRINTUSASCII, at most 255 bytes, `-` when empty.
    pub fn new(hostname: &str) -> Origin {
        Origin {
            hostname: field(hostname, MAX_HOSTNAME),
        }
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// One RFC 5424 message, `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID - - MSG`, with
    /// MSGID and STRUCTURED-DATA nil, at most [`MAX_MESSAGE`] bytes.
    pub fn message(
        &self,
        now: UnixTime,
        app: &str,
        procid: Option<u32>,
        severity: Severity,
        msg: &str,
    ) -> Vec<u8> {
        let mut out = String::with_capacity(64 + msg.len());
        let _ = write!(out, "<{}>1 ", severity.pri());
        timestamp(&mut out, now);
        out.push(' ');
        out.push_str(&self.hostname);
        out.push(' ');
        out.push_str(&field(app, MAX_APP_NAME));
        out.push(' ');
        match procid {
            Some(p) => {
                let _ = write!(out, "{p}");
            }
            None => out.push('-'),
        }
        // MSGID and STRUCTURED-DATA: nil.
        out.push_str(" - -");
        let text = msg.trim();
        if !text.is_empty() {
            out.push(' ');
            if !text.is_ascii() {
                out.push_str(BOM);
            }
            out.extend(text.chars().map(clean_char));
        }
        truncate(&mut out, MAX_MESSAGE);
        out.into_bytes()
    }
}

/// A control character (C0, DEL, C1) becomes `?`, a tab a space: a message is one line.
fn clean_char(c: char) -> char {
    match c {
        '\t' => ' ',
        c if c.is_control() => '?',
        c => c,
    }
}

/// A header field: PRINTUSASCII (33-126; others become `_`), at most `max` bytes, `-`
/// (NILVALUE) when empty.
fn field(s: &str, max: usize) -> String {
    let mut f: String = s
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .take(max)
        .collect();
    if f.is_empty() {
        f.push('-');
    }
    f
}

/// `2026-12-04T12:34:56.123456Z`; `-` outside the years 0000-9999 RFC 5424 can write.
fn timestamp(out: &mut String, t: UnixTime) {
    let c = Civil::from_unix(t.secs());
    if !(0..=9999).contains(&c.year) {
        out.push('-');
        return;
    }
    let micros = t.nanos().rem_euclid(1_000_000_000) / 1000;
    let _ = write!(
        out,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second, micros
    );
}

/// Cut `s` to at most `max` bytes on a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// A message framed for TCP by octet counting (RFC 6587 section 3.4.1): `LEN SP MSG`.
pub fn frame_tcp(msg: &[u8]) -> Vec<u8> {
    let mut out = format!("{} ", msg.len()).into_bytes();
    out.extend_from_slice(msg);
    out
}

/// A message as one UDP datagram: cut to [`MAX_UDP`] bytes, on a UTF-8 boundary (the
/// header is ASCII, so only the MSG is ever cut).
pub fn datagram(msg: &[u8]) -> &[u8] {
    if msg.len() <= MAX_UDP {
        return msg;
    }
    let mut cut = MAX_UDP;
    // Not in the middle of a UTF-8 sequence: back up over continuation bytes.
    while cut > 0 && (msg[cut] & 0xC0) == 0x80 {
        cut -= 1;
    }
    &msg[..cut]
}

/// The text of the notice the backlog sends first when messages were dropped.
pub fn drop_notice(n: u64) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{n} message{s} dropped while the collector was unreachable")
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    bytes: Vec<u8>,
    /// A drop notice: the messages it speaks for (counted again if it is dropped).
    notice: u64,
}

/// The messages waiting for the collector, at most `budget` bytes: a new message pushes
/// out the oldest ones, which are counted; the next message taken after drops is a
/// notice saying how many (severity warning, app-name [`SELF_APP`]).
#[derive(Debug)]
pub struct Backlog {
    queue: VecDeque<Entry>,
    bytes: usize,
    budget: usize,
    dropped: u64,
}

impl Backlog {
    pub fn new(budget: usize) -> Backlog {
        Backlog {
            queue: VecDeque::new(),
            bytes: 0,
            budget,
            dropped: 0,
        }
    }

    /// Bytes held now (never more than the budget).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.dropped == 0
    }

    /// Messages dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.queue.iter().map(|e| e.notice).sum::<u64>()
    }

    fn drop_front(&mut self) {
        if let Some(e) = self.queue.pop_front() {
            self.bytes -= e.bytes.len();
            self.dropped += e.notice.max(1);
        }
    }

    /// Make room for `n` bytes by dropping the oldest; false if `n` exceeds the budget.
    fn room(&mut self, n: usize) -> bool {
        if n > self.budget {
            return false;
        }
        while self.bytes + n > self.budget {
            self.drop_front();
        }
        true
    }

    /// Queue a message, dropping the oldest while it does not fit (a message larger than
    /// the whole budget is dropped itself). Each drop is counted.
    pub fn push(&mut self, msg: Vec<u8>) {
        self.insert(msg, false);
    }

    fn insert(&mut self, bytes: Vec<u8>, front: bool) {
        self.insert_entry(Entry { bytes, notice: 0 }, front);
    }

    fn insert_entry(&mut self, e: Entry, front: bool) {
        if !self.room(e.bytes.len()) {
            self.dropped += e.notice.max(1);
            return;
        }
        self.bytes += e.bytes.len();
        if front {
            self.queue.push_front(e);
        } else {
            self.queue.push_back(e);
        }
    }

    /// The next message to send: after drops, first the notice saying how many (made
    /// with `origin` at `now`), then the oldest message. Hand it back with
    /// [`Backlog::unsend`] if it could not be sent.
    pub fn take(&mut self, origin: &Origin, now: UnixTime, procid: Option<u32>) -> Option<Taken> {
        if self.dropped > 0 {
            let mut n = std::mem::take(&mut self.dropped);
            // A notice that went back unsent says its count in this one.
            while self.queue.front().is_some_and(|e| e.notice > 0) {
                if let Some(e) = self.queue.pop_front() {
                    self.bytes -= e.bytes.len();
                    n += e.notice;
                }
            }
            let bytes = origin.message(now, SELF_APP, procid, Severity::Warning, &drop_notice(n));
            return Some(Taken(Entry { bytes, notice: n }));
        }
        let e = self.queue.pop_front()?;
        self.bytes -= e.bytes.len();
        Some(Taken(e))
    }

    /// A taken message that was not sent goes back in front, unless the messages queued
    /// since fill the budget (then it is dropped and counted).
    pub fn unsend(&mut self, t: Taken) {
        let e = t.0;
        if self.bytes + e.bytes.len() > self.budget {
            self.dropped += e.notice.max(1);
            return;
        }
        self.insert_entry(e, true);
    }

    /// Forget everything (the collector was removed from the configuration).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
        self.dropped = 0;
    }
}

/// A message taken from the [`Backlog`] to be sent.
#[derive(Debug)]
pub struct Taken(Entry);

impl Taken {
    pub fn bytes(&self) -> &[u8] {
        &self.0.bytes
    }
}

#[cfg(test)]
#[path = "syslog/tests.rs"]
mod tests;
