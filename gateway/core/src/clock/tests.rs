use super::*;
use std::net::{Ipv4Addr, SocketAddr};

const DAY: i64 = 86_400;
/// 2026-12-01T00:00:00Z
const T0: i64 = 1_796_083_200;

fn addr(n: u8) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(192, 0, 2, n), PORT))
}

fn secs(s: i64) -> i64 {
    s * NANOS
}

/// A server's answer to `cookie` saying it is `server` (both timestamps).
fn answer(cookie: u64, server: UnixTime) -> [u8; PACKET_LEN] {
    let mut b = [0u8; PACKET_LEN];
    let mut p = Packet::new_unchecked(&mut b[..]);
    p.set_header(0, 4, 4);
    p.set_stratum(2);
    p.set_ref_id(*b"GPS\0");
    p.set_originate(cookie);
    p.set_receive(unix_to_ntp(server));
    p.set_transmit(unix_to_ntp(server));
    b
}

#[test]
fn iso8601_and_civil_round_trip() {
    assert_eq!(UnixTime::EPOCH.to_string(), "1970-01-01T00:00:00Z");
    assert_eq!(UnixTime::from_secs(T0).to_string(), "2026-12-01T00:00:00Z");
    assert_eq!(
        UnixTime::from_secs(978_307_200).to_string(),
        "2001-01-01T00:00:00Z"
    );
    assert_eq!(
        UnixTime::from_secs(951_825_599).to_string(),
        "2000-02-29T11:59:59Z"
    );
    assert_eq!(UnixTime::from_nanos(-1).to_string(), "1969-12-31T23:59:59Z");
    for s in [
        0,
        1,
        951_825_599,
        T0,
        4_102_444_800,
        LATEST_PLAUSIBLE,
        -86_401,
    ] {
        assert_eq!(Civil::from_unix(s).to_unix(), Some(s), "{s}");
    }
    let bad = Civil {
        month: 13,
        ..Civil::from_unix(T0)
    };
    assert_eq!(bad.to_unix(), None);
}

#[test]
fn floor_is_the_latest_and_names_its_source() {
    let d = boot_decision(1_000, Some(978_307_200), Some(T0), Some(T0 - DAY));
    assert_eq!(d.set_to, Some(T0));
    assert_eq!(d.source, BootSource::Saved);
    let d = boot_decision(1_000, Some(978_307_200), None, Some(T0));
    assert_eq!((d.set_to, d.source), (Some(T0), BootSource::Build));
    // The kernel already set the clock from a good RTC: kept, the source is the RTC.
    let d = boot_decision(T0 + 50, Some(T0 + 50), Some(T0), Some(T0 - DAY));
    assert_eq!(
        (d.set_to, d.source, d.floor),
        (None, BootSource::Rtc, Some(T0 + 50))
    );
    // RTC wins a tie; nothing known leaves the clock.
    let d = boot_decision(5, Some(T0), Some(T0), None);
    assert_eq!((d.set_to, d.source), (Some(T0), BootSource::Rtc));
    assert_eq!(boot_decision(5, None, None, None).set_to, None);
    // Implausible candidates are ignored, not believed.
    let d = boot_decision(5, Some(LATEST_PLAUSIBLE + 1), Some(-3), Some(T0));
    assert_eq!((d.set_to, d.source), (Some(T0), BootSource::Build));
}

#[test]
fn saved_time_text() {
    assert_eq!(parse_time_text(&time_text(T0)), Some(T0));
    for bad in ["", "12x", "-5", "99999999999999999999", "\0\0"] {
        assert_eq!(parse_time_text(bad), None, "{bad:?}");
    }
    let r = BootRecord {
        source: BootSource::Saved,
        wall: UnixTime::from_secs(T0),
        boot: Duration::from_millis(3210),
        back_to: None,
    };
    assert_eq!(BootRecord::from_text(&r.to_text()), Some(r));
    let r = BootRecord {
        back_to: Some((UnixTime::from_secs(T0 - 60), secs(7))),
        ..r
    };
    assert_eq!(BootRecord::from_text(&r.to_text()), Some(r));
    assert_eq!(
        BootRecord::from_text("source moon\nwall_ns 1\nboot_ns 1\n"),
        None
    );
}

#[test]
fn request_is_v4_client_with_the_cookie() {
    let b = emit_request(0x1122_3344_5566_7788);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!((p.leap(), p.version(), p.mode()), (0, 4, 3));
    assert_eq!(p.transmit(), 0x1122_3344_5566_7788);
    assert!(b[..40].iter().skip(1).all(|&x| x == 0));
}

#[test]
fn good_answer_parses_and_gives_the_offset() {
    let cookie = 42;
    let t = UnixTime::from_secs(T0);
    let a = answer(cookie, t);
    let r = Reply::parse(&a, cookie).unwrap();
    assert_eq!(r.stratum, 2);
    // Sent at T0 - 10 s by our clock, 20 ms round trip, server stamped T0 for both.
    let s = Sample::new(UnixTime::from_secs(T0 - 10), Duration::from_millis(20), &r);
    assert!((s.offset - (secs(10) - 10_000_000)).abs() < 1_000, "{s:?}");
    assert!((s.delay - 20_000_000).abs() < 1_000, "{s:?}");
    // Extension fields after the header are ignored; a v3 server is fine.
    let mut long = a.to_vec();
    long.extend_from_slice(&[0xaa; 20]);
    assert!(Reply::parse(&long, cookie).is_ok());
    let mut v3 = a;
    Packet::new_unchecked(&mut v3[..]).set_header(0, 3, 4);
    assert!(Reply::parse(&v3, cookie).is_ok());
}

#[test]
fn bad_answers_are_refused_with_their_reason() {
    let c = 7;
    let t = UnixTime::from_secs(T0);
    let with = |f: &dyn Fn(&mut Packet<&mut [u8]>)| {
        let mut b = answer(c, t);
        f(&mut Packet::new_unchecked(&mut b[..]));
        Reply::parse(&b, c)
    };
    assert_eq!(
        Reply::parse(&answer(c, t)[..47], c),
        Err(SntpError::Truncated { len: 47 })
    );
    assert_eq!(
        with(&|p| p.set_header(0, 4, 3)),
        Err(SntpError::NotServer { mode: 3 })
    );
    assert_eq!(
        with(&|p| p.set_header(0, 2, 4)),
        Err(SntpError::Version { version: 2 })
    );
    assert_eq!(
        Reply::parse(&answer(c, t), c + 1),
        Err(SntpError::WrongOriginate)
    );
    assert_eq!(
        with(&|p| p.set_header(3, 4, 4)),
        Err(SntpError::Unsynchronised)
    );
    assert_eq!(
        with(&|p| p.set_stratum(16)),
        Err(SntpError::Stratum { stratum: 16 })
    );
    assert_eq!(with(&|p| p.set_transmit(0)), Err(SntpError::ZeroTimestamp));
    assert_eq!(with(&|p| p.set_receive(0)), Err(SntpError::ZeroTimestamp));
    for (code, kiss) in [
        (*b"RATE", Kiss::Rate),
        (*b"DENY", Kiss::Deny),
        (*b"RSTR", Kiss::Rstr),
        (*b"XYZ\x01", Kiss::Other(*b"XYZ\x01")),
    ] {
        let r = with(&|p| {
            p.set_header(3, 4, 4);
            p.set_stratum(0);
            p.set_ref_id(code);
        });
        assert_eq!(r, Err(SntpError::KissOfDeath(kiss)));
    }
    // A kiss must carry our cookie too: otherwise anyone could make us drop a server.
    let mut b = answer(c, t);
    Packet::new_unchecked(&mut b[..]).set_stratum(0);
    assert_eq!(Reply::parse(&b, c + 1), Err(SntpError::WrongOriginate));
    assert!(SntpError::KissOfDeath(Kiss::Other(*b"A\0\xffB"))
        .to_string()
        .ends_with("A??B"));
}

#[test]
fn ntp_eras_are_read_around_our_clock() {
    let t = UnixTime::from_secs(T0).add_nanos(250_000_000);
    let back = ntp_to_unix(unix_to_ntp(t), t);
    assert!((back.since(t)).abs() < 2, "{back:?}");
    // After the 2036 wrap (era 1), read from a clock still in 2035 or from 1970.
    let after = UnixTime::from_secs(2_085_978_496 + 1000);
    assert_eq!(
        ntp_to_unix(unix_to_ntp(after), UnixTime::from_secs(2_085_978_496 - DAY)).secs(),
        after.secs()
    );
    assert_eq!(unix_to_ntp(after) >> 32, 1000);
    // A clock at 1970 reads a 2026 time right (within the 68-year half window).
    assert_eq!(
        ntp_to_unix(unix_to_ntp(UnixTime::from_secs(T0)), UnixTime::EPOCH).secs(),
        T0
    );
}

fn sample(offset_s: i64) -> Sample {
    Sample {
        offset: secs(offset_s),
        delay: 1_000_000,
    }
}

#[test]
fn first_sync_steps_then_slews_and_steps_forward_only() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    assert_eq!(
        p.decide(addr(1), Origin::Address, wall, boot, &sample(30)),
        Decision::Step {
            by: secs(30),
            agreed: false
        }
    );
    assert!(p.synced());
    let small = Sample {
        offset: 20_000_000,
        delay: 0,
    };
    assert_eq!(
        p.decide(addr(1), Origin::Address, wall, boot, &small),
        Decision::Slew { by: 20_000_000 }
    );
    assert_eq!(
        p.decide(addr(1), Origin::Address, wall, boot, &sample(5)),
        Decision::Step {
            by: secs(5),
            agreed: false
        }
    );
    let back = Sample {
        offset: -800_000_000,
        delay: 0,
    };
    assert_eq!(
        p.decide(addr(1), Origin::Address, wall, boot, &back),
        Decision::Slew { by: -800_000_000 }
    );
}

/// The saved time's two lines: the floor covers this boot's stamp lead and the save's
/// lead; the `agreed` line only when the clock agreed with NTP; a torn or inconsistent
/// one reads as absent (no step back), never as a lower floor.
#[test]
fn saved_time_records_the_stamp_lead_and_agreement() {
    let now = UnixTime::from_secs(T0);
    let st = Stamps {
        ahead: secs(90),
        agrees: true,
        settled: false,
    };
    let s = SavedTime::at(now, st, SAVE_AHEAD);
    assert_eq!(s.floor, T0 + 90 + 660);
    assert_eq!(s.agreed, Some((T0, secs(90))));
    assert_eq!(SavedTime::from_text(&s.to_text()), Some(s));
    let plain = SavedTime::at(now, Stamps::default(), SAVE_AHEAD);
    assert_eq!(plain.to_text(), time_text(T0 + 660));
    assert_eq!(SavedTime::from_text(&plain.to_text()), Some(plain));
    for bad in [
        format!("{}\nagreed {} 0\n", T0, T0 + 1),
        format!("{}\nagreed x 0\n", T0),
        format!("{}\nagreed {} -5\n", T0, T0 - 10),
        format!("{}\nagreed {}\n", T0, T0 - 10),
    ] {
        assert_eq!(
            SavedTime::from_text(&bad),
            Some(SavedTime {
                floor: T0,
                agreed: None
            }),
            "{bad:?}"
        );
    }
    assert_eq!(Stamps::from_text(&st.to_text()), st);
    let settled = Stamps {
        settled: true,
        ..Stamps::default()
    };
    assert_eq!(Stamps::from_text(&settled.to_text()), settled);
    assert_eq!(
        Stamps::from_text("ahead_ns -4\nagrees yes\n"),
        Stamps::default()
    );
    // Only a boot whose floor is that save may step back, never below its stamps or the
    // build time.
    assert_eq!(
        back_floor(BootSource::Saved, Some(s), None),
        Some((UnixTime::from_secs(T0 + 90), secs(90)))
    );
    assert_eq!(
        back_floor(BootSource::Saved, Some(s), Some(T0 + 500)),
        Some((UnixTime::from_secs(T0 + 500), secs(90)))
    );
    assert_eq!(back_floor(BootSource::Rtc, Some(s), None), None);
    assert_eq!(back_floor(BootSource::Saved, Some(plain), None), None);
}

/// After a power cut the clock starts at the saved floor, up to a lead ahead; when the
/// boot before agreed with NTP, the first answer steps it back to the server's time plus
/// that boot's stamp lead and the margin, never below the floor given, and only once.
#[test]
fn first_answer_after_a_power_cut_may_step_back_once() {
    let boot = Duration::from_secs(5);
    // The previous boot saved at T0 (agreeing, stamps 30 s ahead of its clock); this boot
    // starts at its floor, T0 + 30 + 660.
    let saved = SavedTime::at(
        UnixTime::from_secs(T0),
        Stamps {
            ahead: secs(30),
            agrees: true,
            settled: false,
        },
        SAVE_AHEAD,
    );
    let back = back_floor(BootSource::Saved, Some(saved), None);
    let wall = UnixTime::from_secs(saved.floor);
    let mut p = Policy::new(wall, boot).back_to(back);
    // The true time: 4 min after the save (a power cut 3 min after it, 1 min down).
    let truth = T0 + 240;
    let d = p.decide(
        addr(1),
        Origin::Address,
        wall,
        boot,
        &sample(truth - saved.floor),
    );
    let want = secs(truth + 30 - saved.floor) + BACK_MARGIN;
    assert_eq!(
        d,
        Decision::Step {
            by: want,
            agreed: false
        }
    );
    assert!(want < -MAX_BACKWARD);
    // Later answers never step back again.
    let later = wall.add_nanos(want);
    assert_eq!(
        p.decide(addr(1), Origin::Address, later, boot, &sample(-60)),
        Decision::Refused(Refusal::Backward { by: secs(-60) })
    );
    // Never below the floor given (the previous save's stamps).
    let mut p = Policy::new(wall, boot).back_to(back);
    let d = p.decide(addr(1), Origin::Address, wall, boot, &sample(-3600));
    assert_eq!(
        d,
        Decision::Step {
            by: secs(T0 + 30 - saved.floor),
            agreed: false
        }
    );
    // Without an agreeing previous boot: refused, as ever.
    let mut p = Policy::new(wall, boot);
    assert!(matches!(
        p.decide(addr(1), Origin::Address, wall, boot, &sample(-600)),
        Decision::Refused(Refusal::Backward { .. })
    ));
}

#[test]
fn backward_over_a_second_is_refused_even_at_the_first_sync() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    let d = p.decide(addr(1), Origin::Address, wall, boot, &sample(-600));
    assert_eq!(d, Decision::Refused(Refusal::Backward { by: secs(-600) }));
    assert!(!p.synced());
    let Decision::Refused(r) = d else {
        unreachable!()
    };
    assert!(r.to_string().contains("10 min ahead"), "{r}");
    // A small backward offset at the first sync is slewed, never stepped.
    let d = p.decide(
        addr(1),
        Origin::Address,
        wall,
        boot,
        &Sample {
            offset: -300_000_000,
            delay: 0,
        },
    );
    assert_eq!(d, Decision::Slew { by: -300_000_000 });
}

#[test]
fn one_far_future_server_is_refused() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    let d = p.decide(addr(1), Origin::Address, wall, boot, &sample(30 * DAY));
    assert!(
        matches!(
            d,
            Decision::Refused(Refusal::FarFuture {
                origin: Origin::Address,
                ..
            })
        ),
        "{d:?}"
    );
    // The same server again does not agree with itself.
    let later = boot + Duration::from_secs(64);
    let d = p.decide(
        addr(1),
        Origin::Address,
        wall.add_nanos(secs(64)),
        later,
        &sample(30 * DAY),
    );
    assert!(
        matches!(d, Decision::Refused(Refusal::FarFuture { .. })),
        "{d:?}"
    );
    // A second server that disagrees (a day apart) does not help either.
    let d = p.decide(
        addr(2),
        Origin::Address,
        wall.add_nanos(secs(64)),
        later,
        &sample(31 * DAY),
    );
    assert!(
        matches!(d, Decision::Refused(Refusal::FarFuture { .. })),
        "{d:?}"
    );
    let Decision::Refused(r) = d else {
        unreachable!()
    };
    assert!(r.to_string().contains("31 d past the boot floor"), "{r}");
}

#[test]
fn two_agreeing_configured_servers_make_a_far_step() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    assert!(matches!(
        p.decide(addr(1), Origin::Address, wall, boot, &sample(30 * DAY)),
        Decision::Refused(_)
    ));
    // 1 s later by both clocks, the second says the same time (within 2 s).
    let t = boot + Duration::from_secs(1);
    let w = wall.add_nanos(secs(1));
    let agreeing = Sample {
        offset: secs(30 * DAY) + 1_500_000_000,
        delay: 0,
    };
    assert_eq!(
        p.decide(addr(2), Origin::Address, w, t, &agreeing),
        Decision::Step {
            by: agreeing.offset,
            agreed: true
        }
    );
    // The agreed time is the new base: the servers may then keep it within 24 h alone.
    let w2 = w.add_nanos(agreeing.offset + secs(64));
    let t2 = t + Duration::from_secs(64);
    assert_eq!(
        p.decide(addr(1), Origin::Address, w2, t2, &sample(3600)),
        Decision::Step {
            by: secs(3600),
            agreed: false
        }
    );
}

#[test]
fn dhcp_servers_never_make_a_far_step() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    for a in [1, 2, 3] {
        let d = p.decide(addr(a), Origin::Dhcp, wall, boot, &sample(30 * DAY));
        assert_eq!(
            d,
            Decision::Refused(Refusal::FarFuture {
                ahead: secs(30 * DAY),
                origin: Origin::Dhcp
            })
        );
    }
    // Within the bound, a DHCP server is used like any other.
    assert!(matches!(
        p.decide(addr(1), Origin::Dhcp, wall, boot, &sample(3600)),
        Decision::Step { .. }
    ));
}

/// Every address a configured name resolves to comes through the uplink's resolver (the
/// one DHCP names): all of them, however many names, are one source, which never makes a
/// far step, neither together nor with a configured IP address.
#[test]
fn addresses_of_names_never_make_a_far_step() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    let far = secs(3650 * DAY);
    for a in [1, 2, 3] {
        let d = p.decide(addr(a), Origin::Name, wall, boot, &sample(3650 * DAY));
        assert_eq!(
            d,
            Decision::Refused(Refusal::FarFuture {
                ahead: far,
                origin: Origin::Name
            })
        );
        let Decision::Refused(r) = d else {
            unreachable!()
        };
        assert!(
            r.to_string()
                .contains("addresses from the uplink's DNS are one source"),
            "{r}"
        );
    }
    // A configured IP address agreeing with them is still alone among addresses.
    assert!(matches!(
        p.decide(addr(4), Origin::Address, wall, boot, &sample(3650 * DAY)),
        Decision::Refused(Refusal::FarFuture {
            origin: Origin::Address,
            ..
        })
    ));
    // Within the bound, a name's address is used like any other.
    assert!(matches!(
        p.decide(addr(1), Origin::Name, wall, boot, &sample(3600)),
        Decision::Step { .. }
    ));
}

/// Two ports of one address are one server: they do not agree with each other.
#[test]
fn two_ports_of_one_address_do_not_agree() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    let other_port = SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 1123));
    for a in [addr(1), other_port] {
        assert!(matches!(
            p.decide(a, Origin::Address, wall, boot, &sample(30 * DAY)),
            Decision::Refused(Refusal::FarFuture { .. })
        ));
    }
}

/// No answer sets the clock past 2200 (less a day for the saved time's lead), however
/// many configured servers agree, nor a single one within 24 h of the floor: the next
/// boot would not believe a saved time or RTC past 2200 and fall back to the build time.
#[test]
fn no_answer_sets_the_clock_past_2200() {
    let boot = Duration::from_secs(5);
    // The floor: 2199-12-30T23:00:00Z, an hour short of the latest an answer may set.
    let wall = UnixTime::from_secs(LATEST_NTP - 3600);
    assert_eq!(wall.to_string(), "2199-12-30T23:00:00Z");
    let refused = |d: Decision| {
        assert!(
            matches!(d, Decision::Refused(Refusal::PastLatest { .. })),
            "{d:?}"
        );
        let Decision::Refused(r) = d else {
            unreachable!()
        };
        assert!(r.to_string().contains("is far-future"), "{r}");
    };
    // One server 2 h ahead (within its 24 h): refused, nothing used.
    let mut p = Policy::new(wall, boot);
    refused(p.decide(addr(1), Origin::Address, wall, boot, &sample(7200)));
    assert!(!p.synced());
    // 2200-01-02 from two agreeing configured servers: both refused.
    for a in [1, 2] {
        refused(p.decide(addr(a), Origin::Address, wall, boot, &sample(2 * DAY)));
    }
    // 2300 from two agreeing servers, from a 2026 floor (a far step they could make to
    // any time before 2200).
    let w = UnixTime::from_secs(T0);
    let mut p = Policy::new(w, boot);
    let to_2300 = LATEST_PLAUSIBLE + 100 * 365 * DAY - T0;
    for a in [1, 2] {
        refused(p.decide(addr(a), Origin::Address, w, boot, &sample(to_2300)));
    }
    assert!(!p.synced());
    // Up to the latest is still a time: a step of 30 min from the 2199 floor.
    let mut p = Policy::new(wall, boot);
    assert!(matches!(
        p.decide(addr(1), Origin::Address, wall, boot, &sample(1800)),
        Decision::Step { .. }
    ));
}

#[test]
fn small_steps_cannot_creep_past_the_bound() {
    let boot = Duration::from_secs(5);
    let wall = UnixTime::from_secs(T0);
    let mut p = Policy::new(wall, boot);
    let mut w = wall;
    let mut t = boot;
    let mut stepped = 0;
    // 20 h forward each poll: the first is taken, the second would pass floor + 24 h.
    for _ in 0..3 {
        match p.decide(addr(1), Origin::Address, w, t, &sample(20 * 3600)) {
            Decision::Step { by, .. } => {
                w = w.add_nanos(by);
                stepped += 1;
            }
            Decision::Refused(Refusal::FarFuture { .. }) => {}
            d => panic!("{d:?}"),
        }
        t += Duration::from_secs(64);
        w = w.add_nanos(secs(64));
    }
    assert_eq!(stepped, 1);
    // Time that really passed (boot time) moves the bound with it.
    let t = boot + Duration::from_secs(20 * 3600);
    let w = wall.add_nanos(secs(40 * 3600));
    assert!(matches!(
        p.decide(addr(1), Origin::Address, w, t, &sample(3 * 3600)),
        Decision::Step { .. }
    ));
}

#[test]
fn slow_answers_are_refused() {
    let mut p = Policy::new(UnixTime::from_secs(T0), Duration::ZERO);
    let s = Sample {
        offset: secs(1),
        delay: secs(6),
    };
    assert!(matches!(
        p.decide(
            addr(1),
            Origin::Address,
            UnixTime::from_secs(T0),
            Duration::ZERO,
            &s
        ),
        Decision::Refused(Refusal::Delay { .. })
    ));
}

fn ids(n: u8) -> Vec<ServerId> {
    (1..=n)
        .map(|i| ServerId {
            name: format!("ntp{i}"),
            addr: addr(i),
            origin: Origin::Address,
        })
        .collect()
}

fn cookie_of(b: &[u8; PACKET_LEN]) -> u64 {
    Packet::new_unchecked(&b[..]).transmit()
}

#[test]
fn poller_asks_each_server_and_backs_off() {
    let mut p = Poller::default();
    let t0 = Duration::from_secs(10);
    let w = UnixTime::from_secs(T0);
    p.set_servers(t0, ids(2));
    assert_eq!(p.poll_timeout(), Some(t0));
    let (a1, q1) = p.poll_transmit(t0, w, 11).unwrap();
    let (a2, _) = p.poll_transmit(t0, w, 12).unwrap();
    assert_eq!((a1, a2), (addr(1), addr(2)));
    assert!(p.poll_transmit(t0, w, 13).is_none());
    assert_eq!(p.poll_timeout(), Some(t0 + REPLY_TIMEOUT));
    // Server 1 answers (after a forged one with the wrong cookie, ignored).
    let t1 = t0 + Duration::from_millis(30);
    assert_eq!(p.handle_reply(t1, addr(1), &answer(99, w)), None);
    assert_eq!(p.handle_reply(t1, addr(3), &answer(11, w)), None);
    let e = p.handle_reply(t1, addr(1), &answer(cookie_of(&q1), w));
    assert!(matches!(e, Some(Event::Sample { .. })), "{e:?}");
    // Server 2 does not: a timeout, retried after 16 s, then 32 s.
    let ev = p.handle_timeout(t0 + REPLY_TIMEOUT);
    assert_eq!(ev.len(), 1);
    let t2 = t0 + REPLY_TIMEOUT;
    assert_eq!(p.poll_timeout(), Some(t2 + RETRY_FIRST));
    let (a, _) = p.poll_transmit(t2 + RETRY_FIRST, w, 14).unwrap();
    assert_eq!(a, addr(2));
    let t3 = t2 + RETRY_FIRST + REPLY_TIMEOUT;
    p.handle_timeout(t3);
    // Server 1 is next polled 64 s after its answer, server 2 32 s after its timeout.
    assert_eq!(p.poll_timeout(), Some(t3 + RETRY_FIRST * 2));
    assert_eq!(
        p.poll_transmit(t3 + RETRY_FIRST * 2, w, 5).unwrap().0,
        addr(2)
    );
    assert!(p
        .poll_transmit(t1 + MIN_POLL - Duration::from_millis(1), w, 1)
        .is_none());
    assert_eq!(p.poll_transmit(t1 + MIN_POLL, w, 15).unwrap().0, addr(1));
}

#[test]
fn poller_obeys_kisses() {
    let mut p = Poller::default();
    let t0 = Duration::from_secs(10);
    let w = UnixTime::from_secs(T0);
    p.set_servers(t0, ids(2));
    let (_, q1) = p.poll_transmit(t0, w, 1).unwrap();
    let (_, q2) = p.poll_transmit(t0, w, 2).unwrap();
    let kiss = |cookie, code| {
        let mut b = answer(cookie, w);
        let mut k = Packet::new_unchecked(&mut b[..]);
        k.set_stratum(0);
        k.set_ref_id(code);
        b
    };
    let e = p.handle_reply(t0, addr(1), &kiss(cookie_of(&q1), *b"RATE"));
    assert!(matches!(
        e,
        Some(Event::Bad {
            error: SntpError::KissOfDeath(Kiss::Rate),
            ..
        })
    ));
    let e = p.handle_reply(t0, addr(2), &kiss(cookie_of(&q2), *b"DENY"));
    assert!(matches!(
        e,
        Some(Event::Bad {
            error: SntpError::KissOfDeath(Kiss::Deny),
            ..
        })
    ));
    // DENY: never asked again; RATE: the interval doubled (64 -> 128 s).
    assert_eq!(p.usable(), 1);
    assert_eq!(p.poll_timeout(), Some(t0 + MIN_POLL * 2));
    assert!(p
        .poll_transmit(t0 + Duration::from_secs(127), w, 3)
        .is_none());
    assert_eq!(p.poll_transmit(t0 + MIN_POLL * 2, w, 4).unwrap().0, addr(1));
    assert!(
        p.report()[1].contains("DENY: not asked again"),
        "{:?}",
        p.report()
    );
    // A changed server list keeps what is known of the servers that stay.
    p.set_servers(t0, ids(3));
    assert_eq!(p.usable(), 2);
}

#[test]
fn unsent_queries_are_retried_soon() {
    let mut p = Poller::default();
    let w = UnixTime::from_secs(T0);
    p.set_servers(Duration::ZERO, ids(1));
    let (a, _) = p.poll_transmit(Duration::ZERO, w, 1).unwrap();
    p.send_failed(Duration::ZERO, a, "Network is unreachable");
    assert_eq!(p.poll_timeout(), Some(RETRY_UNSENT));
}

#[test]
fn status_lines() {
    let w = UnixTime::from_secs(T0);
    let boot = BootRecord {
        source: BootSource::Build,
        wall: w,
        boot: Duration::from_secs(3),
        back_to: None,
    };
    let now = Duration::from_secs(100);
    let none = NtpState::default();
    assert_eq!(
        status_line(w, now, Some(&boot), Some(&none)),
        "clock: 2026-12-01T00:00:00Z (source: build, no NTP server: set gateway ntp or get one from DHCP)"
    );
    let synced = NtpState {
        servers: 2,
        last_sync: Some(("10.0.2.2:123".into(), Duration::from_secs(88))),
        notes: vec!["x".into()],
        behind: None,
    };
    assert_eq!(
        status_line(w, now, Some(&boot), Some(&synced)),
        "clock: 2026-12-01T00:00:00Z (source: ntp 10.0.2.2:123, last sync 12 s ago)"
    );
    assert_eq!(NtpState::from_text(&synced.to_text()), synced);
    let waiting = NtpState {
        servers: 1,
        ..NtpState::default()
    };
    assert!(status_line(w, now, Some(&boot), Some(&waiting))
        .ends_with("(source: build, no sync yet from 1 NTP server)"));
    // Behind its servers: the line says why (the refusal that keeps it there).
    let behind = NtpState {
        servers: 2,
        behind: Some("192.0.2.1:123 (ntp.example) refused: its time is 3650 d past".into()),
        ..NtpState::default()
    };
    assert_eq!(NtpState::from_text(&behind.to_text()), behind);
    assert!(status_line(w, now, Some(&boot), Some(&behind)).ends_with(
        "(source: build, no sync yet from 2 NTP servers: 192.0.2.1:123 (ntp.example) refused: its time is 3650 d past)"
    ));
    assert!(status_line(w, now, None, None)
        .starts_with("clock: 2026-12-01T00:00:00Z (source: host clock"));
}

#[test]
fn offsets_read_well() {
    assert_eq!(fmt_offset(1_234_000_000), "+1.234 s");
    assert_eq!(fmt_offset(-secs(600)), "-10 min");
    assert_eq!(fmt_offset(secs(5 * 3600)), "+5 h");
    assert_eq!(fmt_offset(secs(30 * DAY)), "+30 d");
    assert_eq!(fmt_offset(secs(30 * DAY) - 5_000_000_000), "+30 d");
    assert_eq!(fmt_offset(secs(299)), "+5 min");
    assert_eq!(fmt_offset(i64::MIN), "-106752 d");
}

/// The stamps boringtun sends are `wall at Tunn creation + monotonic time since`; with the
/// policy's decisions applied to a model clock (steps move the wall clock, slews move
/// wall and monotonic alike), every Tunn made later stamps at or past every stamp sent
/// before, across a power cut too, where the next boot's floor is the saved time.
#[test]
fn stamps_increase_across_steps_and_reboots() {
    struct Model {
        wall: i64, // ns
        mono: i64,
        tunns: Vec<(i64, i64)>, // (wall, mono) at creation
        sent_max: i64,
        saved: i64,
    }
    impl Model {
        fn stamp_all(&mut self) {
            for &(w, m) in &self.tunns {
                let s = w + (self.mono - m);
                self.sent_max = self.sent_max.max(s);
            }
        }
        fn new_tunn(&mut self) {
            // Its first stamp is at least this (time passes before it sends): not behind.
            let s = self.wall;
            assert!(
                s >= self.sent_max,
                "a new Tunn stamps {s}, behind {}",
                self.sent_max
            );
            self.tunns.push((self.wall, self.mono));
        }
        fn pass(&mut self, ns: i64) {
            self.wall += ns;
            self.mono += ns;
            self.stamp_all();
        }
        fn save(&mut self) {
            self.saved = self.wall + SAVE_AHEAD.as_nanos() as i64;
        }
    }
    let mut m = Model {
        wall: secs(T0),
        mono: secs(5),
        tunns: Vec::new(),
        sent_max: 0,
        saved: 0,
    };
    m.save();
    let mut p = Policy::new(
        UnixTime::from_nanos(m.wall),
        Duration::from_nanos(m.mono as u64),
    );
    m.new_tunn();
    // Answers: ahead 3 h (step), behind 0.4 s (slew), behind 1 h (refused), ahead 2 s.
    for off in [secs(3 * 3600), -400_000_000, secs(-3600), secs(2)] {
        m.pass(secs(64));
        let d = p.decide(
            addr(1),
            Origin::Address,
            UnixTime::from_nanos(m.wall),
            Duration::from_nanos(m.mono as u64),
            &Sample {
                offset: off,
                delay: 0,
            },
        );
        match d {
            Decision::Step { by, .. } => {
                assert!(by >= 0);
                m.save(); // saved before the step, ahead of the new clock
                m.saved = m.saved.max(m.wall + by + SAVE_AHEAD.as_nanos() as i64);
                m.wall += by;
            }
            // A slew moves both clocks: the difference (the stamps' base) is unchanged.
            Decision::Slew { .. } => {}
            Decision::Refused(_) => {}
        }
        m.pass(1_000_000);
        m.new_tunn();
    }
    // A power cut 5 min after the last save: the next boot starts at the saved time
    // (no RTC), ahead of every stamp sent.
    m.save();
    m.pass(secs(300));
    let floor = boot_decision(0, None, Some(m.saved / NANOS), Some(T0))
        .set_to
        .unwrap();
    m.wall = secs(floor);
    m.mono = secs(3);
    m.tunns.clear();
    m.new_tunn();
}

#[test]
fn a_step_is_not_applied_twice_by_answers_to_queries_sent_before_it() {
    let mut p = Poller::default();
    let t0 = Duration::from_secs(1);
    let w = UnixTime::from_secs(T0);
    p.set_servers(t0, ids(2));
    let (_, q1) = p.poll_transmit(t0, w, 1).unwrap();
    let (_, q2) = p.poll_transmit(t0, w, 2).unwrap();
    // Both servers say T0 + 180 s; the first answer steps the clock by it.
    let truth = UnixTime::from_secs(T0 + 180);
    let Some(Event::Sample { sample, .. }) =
        p.handle_reply(t0, addr(1), &answer(cookie_of(&q1), truth))
    else {
        panic!("no sample");
    };
    assert!((sample.offset - secs(180)).abs() < 1_000_000);
    p.clock_stepped(sample.offset);
    let Some(Event::Sample { sample, .. }) =
        p.handle_reply(t0, addr(2), &answer(cookie_of(&q2), truth))
    else {
        panic!("no sample");
    };
    assert!(sample.offset.abs() < 1_000_000, "{sample:?}");
}
