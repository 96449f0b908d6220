use super::*;

fn t(secs: i64, micros: i64) -> UnixTime {
    UnixTime::from_nanos(secs * 1_000_000_000 + micros * 1000)
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap()
}

/// 2026-12-04T12:34:56Z
const NOW: i64 = 1_796_387_696;

#[test]
fn severity_from_the_logger_level() {
    let cases = [
        ("[   12.345] riceguard ERROR boom", Severity::Error, "boom"),
        (
            "[   12.345] riceguard WARN  careful",
            Severity::Warning,
            "careful",
        ),
        (
            "[12345.678] riceguard INFO  peer phone (AbCdEfGh): session established",
            Severity::Info,
            "peer phone (AbCdEfGh): session established",
        ),
        ("[    0.001] riceguard DEBUG d", Severity::Debug, "d"),
        ("[    0.001] riceguard TRACE t", Severity::Debug, "t"),
        ("[    0.001] riceguard INFO ", Severity::Info, ""),
        (
            "[    0.001] riceguard LOUD  x",
            Severity::Notice,
            "[    0.001] riceguard LOUD  x",
        ),
        ("plain text", Severity::Notice, "plain text"),
        (
            "[abc] riceguard INFO x",
            Severity::Notice,
            "[abc] riceguard INFO x",
        ),
        ("[1.0]", Severity::Notice, "[1.0]"),
        ("", Severity::Notice, ""),
    ];
    for (line, sev, msg) in cases {
        assert_eq!(parse_logger_line(line), (sev, msg), "{line}");
    }
    assert_eq!(Severity::Error.pri(), 27);
    assert_eq!(Severity::Warning.pri(), 28);
    assert_eq!(Severity::Notice.pri(), 29);
    assert_eq!(Severity::Info.pri(), 30);
    assert_eq!(Severity::Debug.pri(), 31);
}

#[test]
fn console_lines_name_their_service() {
    let l = parse_console_line("gateway: [   3.100] riceguard WARN  reload: x");
    assert_eq!(
        l,
        Line {
            app: "gateway",
            severity: Severity::Warning,
            msg: "reload: x"
        }
    );
    let l = parse_console_line("console-ttyS0: [   3.100] riceguard INFO  hello");
    assert_eq!((l.app, l.severity), ("console-ttyS0", Severity::Info));
    let l = parse_console_line("riceguard-init: gateway started (pid 7)");
    assert_eq!(
        (l.app, l.severity, l.msg),
        ("init", Severity::Notice, "gateway started (pid 7)")
    );
    let l = parse_console_line("riceguard-init: FATAL: no root");
    assert_eq!((l.app, l.severity), ("init", Severity::Error));
    // A service printing something that is not a logger line: notice, kept whole.
    let l = parse_console_line("ntp: hello there");
    assert_eq!(
        (l.app, l.severity, l.msg),
        ("ntp", Severity::Notice, "hello there")
    );
    // Init's own lines without its prefix, and text not from a service.
    let l = parse_console_line("riceguard: public key abc");
    assert_eq!((l.app, l.msg), ("init", "public key abc"));
    let l = parse_console_line("two words: x");
    assert_eq!((l.app, l.msg), ("init", "two words: x"));
}

#[test]
fn rfc5424_header() {
    let o = Origin::new("gw-1");
    let m = o.message(
        t(NOW, 123_456),
        "gateway",
        Some(42),
        Severity::Info,
        "hi there",
    );
    assert_eq!(
        text(&m),
        "<30>1 2026-12-04T12:34:56.123456Z gw-1 gateway 42 - - hi there"
    );
    let m = o.message(t(NOW, 0), "", None, Severity::Warning, "");
    assert_eq!(text(&m), "<28>1 2026-12-04T12:34:56.000000Z gw-1 - - - -");
    // UnixTime spans 1678..2262: always a four-digit year.
    let m = o.message(
        UnixTime::from_nanos(i64::MIN),
        "x",
        None,
        Severity::Info,
        "m",
    );
    assert!(text(&m).starts_with("<30>1 1677-"), "{}", text(&m));
}

#[test]
fn header_fields_are_printable_ascii_and_bounded() {
    let o = Origin::new(&format!("bad host\u{e9}{}", "h".repeat(300)));
    assert!(o.hostname().len() == MAX_HOSTNAME);
    assert!(o.hostname().starts_with("bad_host_h"));
    assert_eq!(Origin::new("").hostname(), "-");
    let app = format!("a p\tp{}", "x".repeat(100));
    let m = o.message(t(NOW, 0), &app, Some(u32::MAX), Severity::Info, "m");
    let s = text(&m);
    let fields: Vec<&str> = s.splitn(8, ' ').collect();
    assert_eq!(fields.len(), 8, "{s}");
    assert_eq!(fields[2].len(), MAX_HOSTNAME);
    assert_eq!(fields[3].len(), MAX_APP_NAME);
    assert!(fields[3].starts_with("a_p_p"));
    assert_eq!(fields[4], "4294967295");
    for f in &fields[..7] {
        assert!(f.bytes().all(|b| (33..=126).contains(&b)), "{f}");
    }
}

#[test]
fn message_text_is_one_line_of_utf8() {
    let o = Origin::new("gw");
    let m = o.message(
        t(NOW, 0),
        "gateway",
        None,
        Severity::Info,
        "a\nb\rc\td\u{1b}[31me\u{7f}f\u{85}g ünï",
    );
    let s = text(&m);
    assert!(s.ends_with(" - - \u{feff}a?b?c d?[31me?f?g ünï"), "{s}");
    // ASCII text carries no BOM.
    let m = o.message(t(NOW, 0), "gateway", None, Severity::Info, "plain");
    assert!(text(&m).ends_with(" - - plain"));
    // Too long: cut on a character boundary.
    let m = o.message(
        t(NOW, 0),
        "g",
        None,
        Severity::Info,
        &"é".repeat(MAX_MESSAGE),
    );
    assert!(m.len() <= MAX_MESSAGE && m.len() > MAX_MESSAGE - 4);
    assert!(std::str::from_utf8(&m).is_ok());
}

#[test]
fn tcp_octet_counting_and_udp_datagrams() {
    assert_eq!(
        frame_tcp(b"<30>1 - - - - - -"),
        b"17 <30>1 - - - - - -".to_vec()
    );
    assert_eq!(frame_tcp(b""), b"0 ".to_vec());
    let o = Origin::new("gw");
    let m = o.message(t(NOW, 0), "g", None, Severity::Info, &"é".repeat(3000));
    let d = datagram(&m);
    assert!(d.len() <= MAX_UDP && d.len() >= MAX_UDP - 1);
    assert!(std::str::from_utf8(d).is_ok());
    assert_eq!(datagram(b"short"), b"short");
}

/// The formatting only ever carries the text it is given: a key the log line does not
/// hold does not appear in the message, whichever line of the appliance it is.
#[test]
fn messages_carry_no_more_than_the_line() {
    let secret = "cGhvbmUtcHJpdmF0ZS1rZXktZm9yLXRlc3RzLTEyMzQ=";
    let o = Origin::new("gw");
    for line in [
        "gateway: [   1.000] riceguard INFO  peer phone (AbCdEfGh): session established",
        "riceguard-init: gateway started (pid 7)",
        "[   2.000] riceguard WARN  reload: keeping the running configuration",
    ] {
        let l = parse_console_line(line);
        let m = o.message(t(NOW, 0), l.app, Some(1), l.severity, l.msg);
        let s = text(&m);
        assert!(!s.contains(secret) && !s.contains("PrivateKey"), "{s}");
        assert!(s.ends_with(l.msg), "the text is kept as it was: {s}");
    }
    let mut b = Backlog::new(64);
    for _ in 0..10 {
        b.push(vec![b'x'; 40]);
    }
    let n = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(!text(n.bytes()).contains(secret));
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("{i} ").into_bytes();
    v.resize(len.max(v.len()), b'.');
    v
}

#[test]
fn backlog_drops_oldest_and_says_so_first() {
    let o = Origin::new("gw");
    let mut b = Backlog::new(100);
    for i in 0..10 {
        b.push(msg(i, 20));
    }
    // 5 fit; 0-4 were pushed out.
    assert_eq!((b.len(), b.bytes(), b.dropped()), (5, 100, 5));
    let n = b.take(&o, t(NOW, 0), Some(9)).unwrap();
    assert_eq!(
        text(n.bytes()),
        "<28>1 2026-12-04T12:34:56.000000Z gw syslog 9 - - 5 messages dropped while the collector was unreachable"
    );
    assert_eq!(b.dropped(), 0);
    let first = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(first.bytes().starts_with(b"5 "));
    // Not sent: back in front, and taken again first.
    b.unsend(first);
    assert!(b
        .take(&o, t(NOW, 0), None)
        .unwrap()
        .bytes()
        .starts_with(b"5 "));
    for want in 6..10 {
        let m = b.take(&o, t(NOW, 0), None).unwrap();
        assert!(m.bytes().starts_with(format!("{want} ").as_bytes()));
    }
    assert!(b.take(&o, t(NOW, 0), None).is_none());
    assert!(b.is_empty());
}

#[test]
fn an_unsent_notice_is_merged_not_lost() {
    let o = Origin::new("gw");
    let mut b = Backlog::new(60);
    for i in 0..5 {
        b.push(msg(i, 20));
    }
    let notice = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(
        text(notice.bytes()).ends_with(" 2 messages dropped while the collector was unreachable")
    );
    b.unsend(notice); // does not fit beside the three: dropped, counted as its two
    assert_eq!(b.dropped(), 2);
    b.push(msg(5, 20)); // pushes out message 2
    let n = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(
        text(n.bytes()).ends_with(" 3 messages dropped while the collector was unreachable"),
        "{}",
        text(n.bytes())
    );
    // A notice put back in front, then more drops: one notice with the sum.
    let mut b = Backlog::new(1000);
    b.push(vec![b'a'; 2000]); // larger than the budget: dropped itself
    let n = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(text(n.bytes()).ends_with(" 1 message dropped while the collector was unreachable"));
    b.unsend(n);
    b.push(vec![b'b'; 2000]);
    let n = b.take(&o, t(NOW, 0), None).unwrap();
    assert!(text(n.bytes()).ends_with(" 2 messages dropped while the collector was unreachable"));
    assert!(b.take(&o, t(NOW, 0), None).is_none());
    b.clear();
    assert!(b.is_empty());
}

/// Whatever the sizes and the order of pushes, takes and returns: the backlog never
/// holds more than its budget, and every message pushed is either taken once or counted
/// as dropped (and said in a notice) — none vanishes, none is counted twice.
#[test]
fn backlog_bound_and_accounting_hold_for_random_runs() {
    let o = Origin::new("gw");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _run in 0..200 {
        let budget = 1 + rnd(2000) as usize;
        let mut b = Backlog::new(budget);
        let (mut pushed, mut taken, mut said) = (0u64, 0u64, 0u64);
        let mut held: Option<Taken> = None;
        for _ in 0..500 {
            match rnd(10) {
                0..=5 => {
                    b.push(msg(pushed as usize, 1 + rnd(300) as usize));
                    pushed += 1;
                }
                6 | 7 => {
                    if let Some(h) = held.take() {
                        b.unsend(h);
                    }
                    held = b.take(&o, t(NOW, 0), None);
                }
                _ => {
                    // The held message was sent.
                    if let Some(h) = held.take() {
                        let s = text(h.bytes());
                        match s.strip_suffix(" dropped while the collector was unreachable") {
                            Some(head) => {
                                let n = head.rsplit(' ').nth(1).unwrap();
                                said += n.parse::<u64>().unwrap();
                            }
                            None => taken += 1,
                        }
                    }
                }
            }
            assert!(b.bytes() <= budget, "{} > {budget}", b.bytes());
        }
        if let Some(h) = held.take() {
            b.unsend(h);
        }
        // Drain: everything left is taken (the collector came back).
        while let Some(h) = b.take(&o, t(NOW, 0), None) {
            let s = text(h.bytes());
            match s.strip_suffix(" dropped while the collector was unreachable") {
                Some(head) => said += head.rsplit(' ').nth(1).unwrap().parse::<u64>().unwrap(),
                None => taken += 1,
            }
        }
        assert_eq!(taken + said, pushed, "budget {budget}");
    }
}
