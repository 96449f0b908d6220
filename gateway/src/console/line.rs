//! The console's line discipline: turns the raw bytes of a serial line into command
//! lines, with the realities of serial terminals handled here and nowhere else.
//!
//! Owns: backspace/DEL editing, CR, LF and CRLF line ends, a hard bound on line length
//! (a `heapless` buffer, so a stuck sender cannot grow memory), rejection of lines that
//! carried binary garbage (line noise, a wrong baud rate), ANSI escape sequences (arrow
//! keys) swallowed silently, Ctrl-C/Ctrl-U to drop the line and Ctrl-D on an empty line
//! as end of input. It does no I/O: the caller feeds bytes and writes the echo.

use heapless::Vec as HVec;

/// Longest accepted command line, in bytes.
pub const MAX_LINE: usize = 1024;

/// What one input byte caused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Echo this printable byte (only when the terminal does not echo itself).
    Echo(u8),
    /// The last character was erased: the echo is `"\x08 \x08"`.
    Erase,
    /// A complete line (without its line end), ready to execute.
    Line(String),
    /// An empty line was entered: show the prompt again.
    Empty,
    /// The line was dropped on purpose (Ctrl-C, Ctrl-U).
    Cancelled,
    /// The line was dropped: longer than [`MAX_LINE`].
    TooLong,
    /// The line was dropped: it held this many bytes that are not printable ASCII.
    Garbage(usize),
    /// Ctrl-D on an empty line: the user is done.
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    /// Seen ESC.
    Start,
    /// Inside `ESC [` (CSI) or `ESC O` (SS3): wait for the final byte.
    Seq,
}

/// The line editor's state. Feed it bytes with [`LineEditor::feed`].
#[derive(Debug)]
pub struct LineEditor {
    buf: HVec<u8, MAX_LINE>,
    /// Bytes lost to the length bound in the current line.
    overflow: bool,
    /// Non-text bytes seen in the current line.
    garbage: usize,
    /// The previous byte was CR, so a following LF belongs to the same line end.
    after_cr: bool,
    esc: Esc,
}

impl Default for LineEditor {
    fn default() -> Self {
        Self::new()
    }
}

impl LineEditor {
    pub fn new() -> Self {
        LineEditor {
            buf: HVec::new(),
            overflow: false,
            garbage: 0,
            after_cr: false,
            esc: Esc::None,
        }
    }

    /// The text typed so far on the current line.
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.overflow = false;
        self.garbage = 0;
        self.esc = Esc::None;
    }

    /// Process one input byte.
    pub fn feed(&mut self, b: u8) -> Option<Event> {
        let after_cr = std::mem::replace(&mut self.after_cr, false);
        match self.esc {
            Esc::Start => {
                if b == b'[' || b == b'O' {
                    self.esc = Esc::Seq;
                    return None;
                }
                self.esc = Esc::None;
                // Alt+key sends ESC key: drop the key; a control byte is handled as itself.
                if (0x20..=0x7e).contains(&b) {
                    return None;
                }
            }
            Esc::Seq => {
                // Parameters and intermediates are 0x20..=0x3f; the final byte ends it.
                if !(0x20..=0x3f).contains(&b) {
                    self.esc = Esc::None;
                }
                if (0x20..=0x7e).contains(&b) {
                    return None;
                }
                // A control byte inside a sequence: handle it as itself below.
            }
            Esc::None => {}
        }
        match b {
            b'\r' => {
                self.after_cr = true;
                Some(self.finish())
            }
            b'\n' if after_cr => None,
            b'\n' => Some(self.finish()),
            0x08 | 0x7f => {
                if self.overflow || self.garbage > 0 {
                    return None;
                }
                self.buf.pop().map(|_| Event::Erase)
            }
            0x03 | 0x15 => {
                self.reset();
                Some(Event::Cancelled)
            }
            0x04 => {
                if self.buf.is_empty() && !self.overflow && self.garbage == 0 {
                    Some(Event::Eof)
                } else {
                    None
                }
            }
            0x1b => {
                self.esc = Esc::Start;
                None
            }
            b'\t' => self.push(b' '),
            0x20..=0x7e => self.push(b),
            _ => {
                self.garbage = self.garbage.saturating_add(1);
                None
            }
        }
    }

    fn push(&mut self, b: u8) -> Option<Event> {
        if self.overflow || self.garbage > 0 {
            return None;
        }
        match self.buf.push(b) {
            Ok(()) => Some(Event::Echo(b)),
            Err(_) => {
                self.overflow = true;
                None
            }
        }
    }

    fn finish(&mut self) -> Event {
        let ev = if self.garbage > 0 {
            Event::Garbage(self.garbage)
        } else if self.overflow {
            Event::TooLong
        } else {
            // Only printable ASCII was pushed, so this is valid UTF-8.
            let s: String = self.buf.iter().map(|&c| c as char).collect();
            if s.trim().is_empty() {
                Event::Empty
            } else {
                Event::Line(s)
            }
        };
        self.reset();
        ev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<Event> {
        let mut e = LineEditor::new();
        input
            .iter()
            .filter_map(|&b| e.feed(b))
            .filter(|ev| !matches!(ev, Event::Echo(_) | Event::Erase))
            .collect()
    }

    fn line(s: &str) -> Event {
        Event::Line(s.into())
    }

    #[test]
    fn line_ends_cr_lf_crlf() {
        assert_eq!(lines(b"show\nshow\rshow\r\nshow\n"), vec![line("show"); 4]);
        // LF CR is two line ends (the second empty), CR CR too.
        assert_eq!(
            lines(b"a\n\rb\r\r"),
            vec![line("a"), Event::Empty, line("b"), Event::Empty]
        );
    }

    #[test]
    fn backspace_and_del_edit() {
        assert_eq!(lines(b"shoq\x08w\n"), vec![line("show")]);
        assert_eq!(lines(b"shoqq\x7f\x7fw\n"), vec![line("show")]);
        // Erasing past the start does nothing.
        assert_eq!(lines(b"\x08\x7fx\n"), vec![line("x")]);
        let mut e = LineEditor::new();
        assert_eq!(e.feed(b'a'), Some(Event::Echo(b'a')));
        assert_eq!(e.feed(0x7f), Some(Event::Erase));
        assert_eq!(e.feed(0x7f), None);
    }

    #[test]
    fn long_lines_are_dropped_whole() {
        let mut input = vec![b'x'; MAX_LINE + 10];
        input.extend_from_slice(b"\nshow\n");
        assert_eq!(lines(&input), vec![Event::TooLong, line("show")]);
        let mut exact = vec![b'y'; MAX_LINE];
        exact.push(b'\n');
        assert_eq!(lines(&exact), vec![line(&"y".repeat(MAX_LINE))]);
    }

    #[test]
    fn garbage_drops_the_line() {
        assert_eq!(
            lines(b"set \xff\xfe peer\nshow\n"),
            vec![Event::Garbage(2), line("show")]
        );
        assert_eq!(lines(b"\x00\x01\x02\n"), vec![Event::Garbage(3)]);
    }

    #[test]
    fn arrows_are_ignored_and_controls_work() {
        assert_eq!(lines(b"sh\x1b[Aow\x1b[1;5C\n"), vec![line("show")]);
        assert_eq!(
            lines(b"junk\x03show\n"),
            vec![Event::Cancelled, line("show")]
        );
        assert_eq!(
            lines(b"junk\x15show\n"),
            vec![Event::Cancelled, line("show")]
        );
        assert_eq!(lines(b"\x04"), vec![Event::Eof]);
        assert_eq!(lines(b"a\x04\n"), vec![line("a")]);
        assert_eq!(lines(b"a\tb\n"), vec![line("a b")]);
    }

    /// Seeded garbage in, never a panic out, and the editor always recovers: after any
    /// input, a clean line after a line end is read back exactly.
    #[test]
    fn random_garbage_never_panics_and_recovers() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let len = (next() % 3000) as usize;
            let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            input.extend_from_slice(b"\x03\nshow peers\n");
            let evs = lines(&input);
            assert_eq!(evs.last(), Some(&line("show peers")));
            for ev in &evs {
                if let Event::Line(l) = ev {
                    assert!(l.len() <= MAX_LINE);
                    assert!(l.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                }
            }
        }
    }
}
