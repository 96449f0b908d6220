//! The client's whole life with time passed in, against a scripted server.
use super::*;

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];
const SRV: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
const ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn decode(t: &Outgoing) -> Message {
    Message::decode(&mut Decoder::new(&t.payload)).unwrap()
}

/// What a server answers, with knobs for the broken variants.
#[derive(Clone)]
struct Reply {
    kind: MessageType,
    xid: u32,
    chaddr: [u8; 6],
    yiaddr: Ipv4Addr,
    server: Option<Ipv4Addr>,
    mask: Option<Ipv4Addr>,
    lease: Option<u32>,
    t1: Option<u32>,
    t2: Option<u32>,
    router: Option<Ipv4Addr>,
    /// Option 42 as raw bytes (so broken lengths can be sent).
    ntp: Option<Vec<u8>>,
}

impl Reply {
    fn to(req: &Message, kind: MessageType) -> Reply {
        Reply {
            kind,
            xid: req.xid(),
            chaddr: MAC,
            yiaddr: ADDR,
            server: Some(SRV),
            mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
            lease: Some(120),
            t1: None,
            t2: None,
            router: Some(SRV),
            ntp: None,
        }
    }
    fn bytes(&self) -> Vec<u8> {
        let mut m = blank().unwrap();
        m.set_opcode(Opcode::BootReply);
        m.set_xid(self.xid);
        m.set_chaddr(&self.chaddr);
        m.set_yiaddr(self.yiaddr);
        let o = m.opts_mut();
        o.insert(DhcpOption::MessageType(self.kind));
        if let Some(s) = self.server {
            o.insert(DhcpOption::ServerIdentifier(s));
        }
        if let Some(x) = self.mask {
            o.insert(DhcpOption::SubnetMask(x));
        }
        if let Some(l) = self.lease {
            o.insert(DhcpOption::AddressLeaseTime(l));
        }
        if let Some(l) = self.t1 {
            o.insert(DhcpOption::Renewal(l));
        }
        if let Some(l) = self.t2 {
            o.insert(DhcpOption::Rebinding(l));
        }
        if let Some(r) = self.router {
            o.insert(DhcpOption::Router(vec![r]));
        }
        o.insert(DhcpOption::DomainNameServer(vec![
            SRV,
            Ipv4Addr::new(9, 9, 9, 9),
        ]));
        let mut b = Vec::new();
        m.encode(&mut Encoder::new(&mut b)).unwrap();
        if let Some(n) = &self.ntp {
            // Before the end mark, raw: dhcproto would refuse to encode a broken one.
            let end = b.iter().rposition(|&x| x == 255).unwrap();
            let mut o = vec![42, n.len() as u8];
            o.extend_from_slice(n);
            b.splice(end..end, o);
        }
        b
    }
}

/// Run timers and return the next transmission at or before `until`, advancing `now`.
fn next_tx(c: &mut Client, now: &mut Instant, until: Instant) -> Option<Outgoing> {
    for _ in 0..1000 {
        c.handle_timeout(*now);
        if let Some(t) = c.poll_transmit(*now) {
            return Some(t);
        }
        match c.poll_timeout() {
            Some(t) if t <= until => *now = t.max(*now),
            _ => {
                *now = until;
                c.handle_timeout(*now);
                return c.poll_transmit(*now);
            }
        }
    }
    panic!("timer loop did not settle");
}

fn tx_in(c: &mut Client, now: &mut Instant, within: Duration) -> Option<Outgoing> {
    let until = *now + within;
    next_tx(c, now, until)
}

fn events(c: &mut Client) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// DISCOVER → OFFER → REQUEST → ACK; returns the client bound at `now`.
fn bound(now: &mut Instant) -> Client {
    let mut c = Client::new(MAC, 42, *now);
    c.start(*now);
    let d = next_tx(&mut c, now, *now + secs(2)).expect("discover");
    assert_eq!(d.to, None, "DISCOVER is broadcast");
    let dm = decode(&d);
    assert_eq!(dm.opts().msg_type(), Some(MessageType::Discover));
    assert!(dm.flags().broadcast(), "BROADCAST flag: no address yet");
    assert_eq!(&dm.chaddr()[..6], &MAC);
    assert_eq!(c.state(), State::Selecting);
    c.handle_reply(*now, &Reply::to(&dm, MessageType::Offer).bytes())
        .unwrap();
    assert_eq!(c.state(), State::Requesting);
    let r = next_tx(&mut c, now, *now).expect("request");
    let rm = decode(&r);
    assert_eq!(rm.opts().msg_type(), Some(MessageType::Request));
    assert_eq!(rm.xid(), dm.xid());
    assert_eq!(
        rm.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(ADDR))
    );
    assert_eq!(
        rm.opts().get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SRV))
    );
    c.handle_reply(*now, &Reply::to(&rm, MessageType::Ack).bytes())
        .unwrap();
    match events(&mut c).as_slice() {
        [Event::Bound {
            lease,
            replaces: None,
        }] => {
            assert_eq!((lease.address, lease.prefix), (ADDR, 24));
            assert_eq!(lease.router, Some(SRV));
            assert_eq!(lease.dns, vec![SRV, Ipv4Addr::new(9, 9, 9, 9)]);
            assert_eq!(
                (lease.lease_secs, lease.t1_secs, lease.t2_secs),
                (120, 60, 105)
            );
        }
        e => panic!("expected Bound, got {e:?}"),
    }
    assert_eq!(c.state(), State::Bound);
    c
}

#[test]
fn whole_lifecycle_renew_rebind_expire() {
    let t0 = Instant::now();
    let mut now = t0;
    let mut c = bound(&mut now);
    let bound_at = c.held.as_ref().unwrap().at;
    // Nothing is sent while bound; the next wake-up is T1.
    assert_eq!(c.poll_transmit(now), None);
    assert_eq!(c.poll_timeout(), Some(bound_at + secs(60)));
    // T1: RENEWING, unicast to the server with ciaddr set, no BROADCAST flag.
    let r = next_tx(&mut c, &mut now, bound_at + secs(61)).expect("renew");
    assert_eq!(c.state(), State::Renewing);
    assert_eq!(now, bound_at + secs(60));
    assert_eq!(r.to, Some(SRV));
    let rm = decode(&r);
    assert_eq!(rm.ciaddr(), ADDR);
    assert!(!rm.flags().broadcast());
    assert_eq!(events(&mut c), vec![Event::Renewing]);
    c.handle_reply(now, &Reply::to(&rm, MessageType::Ack).bytes())
        .unwrap();
    assert!(matches!(events(&mut c).as_slice(), [Event::Renewed(l)] if l.address == ADDR));
    assert_eq!(c.state(), State::Bound);
    // The renewed lease counts from the renewal.
    let renewed_at = now;
    assert_eq!(c.poll_timeout(), Some(renewed_at + secs(60)));

    // Now the server is gone: renewals go unanswered.
    let r1 = next_tx(&mut c, &mut now, renewed_at + secs(200)).unwrap();
    assert_eq!(r1.to, Some(SRV));
    assert_eq!(now, renewed_at + secs(60));
    // Retransmission while renewing: half the time left to T2 (45 s), at least 10 s.
    let r2 = next_tx(&mut c, &mut now, renewed_at + secs(200)).unwrap();
    assert_eq!(r2.to, Some(SRV));
    assert!(now > renewed_at + secs(60) && now < renewed_at + secs(105));
    assert_eq!(
        events(&mut c),
        vec![Event::Renewing],
        "one Renewing, no loss"
    );
    // At T2: REBINDING, broadcast.
    let mut saw_rebind = false;
    let mut address_dropped_before_expiry = false;
    for _ in 0..20 {
        let Some(t) = next_tx(&mut c, &mut now, renewed_at + secs(119)) else {
            break;
        };
        for e in events(&mut c) {
            match e {
                Event::Rebinding => saw_rebind = true,
                Event::Expired(_) | Event::Nak { .. } => address_dropped_before_expiry = true,
                _ => {}
            }
        }
        if saw_rebind {
            assert_eq!(t.to, None, "REBINDING is broadcast");
            assert_eq!(decode(&t).ciaddr(), ADDR);
        }
    }
    assert!(saw_rebind);
    assert!(
        !address_dropped_before_expiry,
        "a lost server never removes the address early"
    );
    assert_eq!(c.state(), State::Rebinding);
    assert!(c.lease().is_some());
    // Expiry: the address goes, INIT starts over (asking for the old address).
    let d = next_tx(&mut c, &mut now, renewed_at + secs(125)).expect("discover after expiry");
    assert!(matches!(events(&mut c).as_slice(), [Event::Expired(l)] if l.address == ADDR));
    assert!(now >= renewed_at + secs(120));
    assert!(c.lease().is_none());
    let dm = decode(&d);
    assert_eq!(dm.opts().msg_type(), Some(MessageType::Discover));
    assert_eq!(
        dm.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(ADDR))
    );
}

#[test]
fn nak_while_renewing_removes_the_address() {
    let mut now = Instant::now();
    let mut c = bound(&mut now);
    let until = now + secs(70);
    let r = next_tx(&mut c, &mut now, until).unwrap();
    let rm = decode(&r);
    // A NAK from another server is not the one we asked: ignored.
    let mut other = Reply::to(&rm, MessageType::Nak);
    other.server = Some(Ipv4Addr::new(192, 168, 77, 99));
    assert_eq!(
        c.handle_reply(now, &other.bytes()),
        Err(Ignored::OtherServer(Ipv4Addr::new(192, 168, 77, 99)))
    );
    c.handle_reply(now, &Reply::to(&rm, MessageType::Nak).bytes())
        .unwrap();
    match events(&mut c).as_slice() {
        [Event::Renewing, Event::Nak {
            server,
            removed: Some(l),
            ..
        }] => {
            assert_eq!((*server, l.address), (SRV, ADDR));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(c.state(), State::Init);
    let d = tx_in(&mut c, &mut now, secs(2)).unwrap();
    // After a NAK the old address is not asked for again.
    assert!(decode(&d)
        .opts()
        .get(OptionCode::RequestedIpAddress)
        .is_none());
}

#[test]
fn link_flap_reacquires_with_init_reboot() {
    let mut now = Instant::now();
    let mut c = bound(&mut now);
    now += secs(5);
    c.link_down(now);
    assert_eq!(c.state(), State::Down);
    assert_eq!(
        c.poll_transmit(now + secs(30)),
        None,
        "nothing is sent without carrier"
    );
    now += secs(10);
    c.link_up(now);
    assert_eq!(c.state(), State::InitReboot);
    let r = tx_in(&mut c, &mut now, secs(0)).unwrap();
    assert_eq!(r.to, None);
    let rm = decode(&r);
    assert_eq!(rm.opts().msg_type(), Some(MessageType::Request));
    assert!(rm.flags().broadcast());
    assert_eq!(rm.ciaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        rm.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(ADDR))
    );
    assert!(rm.opts().get(OptionCode::ServerIdentifier).is_none());
    c.handle_reply(now, &Reply::to(&rm, MessageType::Ack).bytes())
        .unwrap();
    match events(&mut c).as_slice() {
        [Event::Bound {
            lease,
            replaces: Some(old),
        }] => {
            assert_eq!(lease.address, ADDR);
            assert_eq!(old.address, ADDR);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(c.state(), State::Bound);
}

#[test]
fn unanswered_init_reboot_keeps_the_lease_until_it_ends() {
    let mut now = Instant::now();
    let mut c = bound(&mut now);
    let at = c.held.as_ref().unwrap().at;
    c.link_down(now);
    c.link_up(now);
    let mut sends = Vec::new();
    while let Some(_t) = next_tx(&mut c, &mut now, at + secs(59)) {
        sends.push(now);
        if c.state() != State::InitReboot {
            break;
        }
    }
    // Three INIT-REBOOT tries, backing off (4 s, 8 s, jittered by ±1 s).
    assert_eq!(sends.len(), 3, "{sends:?}");
    let gap1 = sends[1] - sends[0];
    let gap2 = sends[2] - sends[1];
    assert!(gap1 >= secs(3) && gap1 <= secs(5), "{gap1:?}");
    assert!(gap2 >= secs(7) && gap2 <= secs(9), "{gap2:?}");
    assert!(events(&mut c).contains(&Event::RebootUnanswered {
        keeping: Some(ADDR)
    }));
    assert_eq!(c.state(), State::Bound);
    assert_eq!(c.lease().map(|l| l.address), Some(ADDR));
}

#[test]
fn foreign_and_broken_replies_are_ignored_with_a_reason() {
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 7, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    let good = Reply::to(&d, MessageType::Offer);
    let cases: Vec<(Reply, Ignored)> = vec![
        (
            Reply {
                xid: d.xid() ^ 1,
                ..good.clone()
            },
            Ignored::ForeignXid,
        ),
        (
            Reply {
                chaddr: [2, 0, 0, 0, 0, 8],
                ..good.clone()
            },
            Ignored::ForeignChaddr,
        ),
        (
            Reply {
                server: None,
                ..good.clone()
            },
            Ignored::Missing("server identifier"),
        ),
        (
            Reply {
                mask: None,
                ..good.clone()
            },
            Ignored::Missing("subnet mask"),
        ),
        (
            Reply {
                lease: None,
                ..good.clone()
            },
            Ignored::Missing("lease time"),
        ),
        (
            Reply {
                lease: Some(3),
                ..good.clone()
            },
            Ignored::BadLease("3 s is shorter than 10 s".into()),
        ),
        (
            Reply {
                mask: Some(Ipv4Addr::new(0, 0, 0, 0)),
                ..good.clone()
            },
            Ignored::BadAddress("prefix /0 is unusable".into()),
        ),
        (
            Reply {
                mask: Some(Ipv4Addr::new(255, 255, 255, 255)),
                ..good.clone()
            },
            Ignored::BadAddress("prefix /32 is unusable".into()),
        ),
        (
            Reply {
                mask: Some(Ipv4Addr::new(255, 0, 255, 0)),
                ..good.clone()
            },
            Ignored::BadAddress("subnet mask 255.0.255.0 is not contiguous".into()),
        ),
        (
            Reply {
                yiaddr: Ipv4Addr::new(224, 0, 0, 1),
                ..good.clone()
            },
            Ignored::BadAddress("224.0.0.1 cannot be ours".into()),
        ),
        (
            Reply {
                kind: MessageType::Ack,
                ..good.clone()
            },
            Ignored::Unexpected("Ack".into()),
        ),
    ];
    for (r, why) in cases {
        assert_eq!(c.handle_reply(now, &r.bytes()), Err(why));
        assert_eq!(c.state(), State::Selecting);
    }
    assert!(matches!(
        c.handle_reply(now, &[1, 2, 3]),
        Err(Ignored::Malformed(_))
    ));
    let mut req = good.bytes();
    req[0] = 1; // BOOTREQUEST: another client's broadcast
    assert_eq!(c.handle_reply(now, &req), Err(Ignored::NotAReply));
    assert!(events(&mut c).is_empty());
    // Absurd T1/T2 (T1 past the lease) fall back to the RFC's defaults.
    let mut odd = good.clone();
    odd.t1 = Some(500);
    odd.t2 = Some(400);
    c.handle_reply(now, &odd.bytes()).unwrap();
    assert_eq!(c.state(), State::Requesting);
}

#[test]
fn unusable_ack_is_declined_then_init_after_a_wait() {
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 9, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes())
        .unwrap();
    let r = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    // The ACK names a router that is not on-link: its default route cannot be installed.
    let mut ack = Reply::to(&r, MessageType::Ack);
    ack.router = Some(Ipv4Addr::new(10, 9, 9, 9));
    c.handle_reply(now, &ack.bytes()).unwrap();
    match events(&mut c).as_slice() {
        [Event::Declined {
            removed: None,
            reason,
            retry_in,
            repeat: 1,
            ..
        }] => {
            assert!(
                reason.starts_with("router 10.9.9.9 is not on-link in 192.168.77.0/24"),
                "{reason}"
            );
            assert_eq!(*retry_in, DECLINE_WAIT);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(c.state(), State::Declining);
    assert!(c.lease().is_none());
    let t0 = now;
    let dec = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    assert_eq!(dec.opts().msg_type(), Some(MessageType::Decline));
    assert_eq!(
        dec.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(ADDR))
    );
    let again = decode(&next_tx(&mut c, &mut now, t0 + secs(20)).unwrap());
    assert_eq!(again.opts().msg_type(), Some(MessageType::Discover));
    assert!(now >= t0 + DECLINE_WAIT);
    assert!(again.opts().get(OptionCode::RequestedIpAddress).is_none());
}

#[test]
fn offer_with_an_unusable_address_or_off_link_router_is_not_requested() {
    for (yiaddr, router) in [
        (Ipv4Addr::new(192, 168, 77, 0), Some(SRV)),
        (Ipv4Addr::new(192, 168, 77, 255), Some(SRV)),
        (ADDR, Some(Ipv4Addr::new(192, 168, 78, 1))),
        (ADDR, Some(ADDR)),
    ] {
        let mut now = Instant::now();
        let mut c = Client::new(MAC, 19, now);
        c.start(now);
        let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
        let mut offer = Reply::to(&d, MessageType::Offer);
        offer.yiaddr = yiaddr;
        offer.router = router;
        c.handle_reply(now, &offer.bytes()).unwrap();
        assert_eq!(c.state(), State::Selecting, "{yiaddr} via {router:?}");
        assert!(matches!(
            events(&mut c).as_slice(),
            [Event::OfferRefused { repeat: 1, .. }]
        ));
        // The same offer again within its wait: ignored, not reported again.
        assert!(matches!(
            c.handle_reply(now, &offer.bytes()),
            Err(Ignored::Refused(_))
        ));
        assert!(events(&mut c).is_empty());
    }
    // No router at all is fine (no default route).
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 19, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    let mut offer = Reply::to(&d, MessageType::Offer);
    offer.router = None;
    c.handle_reply(now, &offer.bytes()).unwrap();
    assert_eq!(c.state(), State::Requesting);
}

const SITE_B: &str =
    "it is peer site-b's 192.168.77.0/24 (your remote site and your uplink cannot be the same network)";

fn conflicting(seed: u64, now: Instant) -> Client {
    let mut c = Client::new(MAC, seed, now);
    c.set_lease_check(Box::new(|l| {
        if l.address.octets()[2] == 77 {
            Err(SITE_B.into())
        } else {
            Ok(())
        }
    }));
    c
}

#[test]
fn conflicting_offer_backs_off_exponentially_and_prefers_other_servers() {
    let t0 = Instant::now();
    let mut now = t0;
    let mut c = conflicting(31, now);
    c.start(now);
    let mut waits = Vec::new();
    let mut discovers = 0;
    // An hour of a server that offers only the conflicting lease.
    while let Some(t) = next_tx(&mut c, &mut now, t0 + secs(3600)) {
        let m = decode(&t);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Discover));
        discovers += 1;
        c.handle_reply(now, &Reply::to(&m, MessageType::Offer).bytes())
            .unwrap();
        match events(&mut c).as_slice() {
            [Event::OfferRefused {
                reason,
                retry_in,
                repeat,
                server,
                ..
            }] => {
                assert_eq!((reason.as_str(), *server), (SITE_B, SRV));
                assert_eq!(*repeat as usize, waits.len() + 1);
                waits.push(retry_in.as_secs());
            }
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(&waits[..6], &[10, 20, 40, 80, 160, 300], "{waits:?}");
    assert!(waits[6..].iter().all(|w| *w == 300));
    assert!(discovers <= 18, "no DISCOVER loop: {discovers} in an hour");
    // Meanwhile another server's offer to the same DISCOVER is taken.
    let d = decode(&tx_in(&mut c, &mut now, secs(400)).unwrap());
    c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes())
        .unwrap();
    let _ = events(&mut c);
    let mut good = Reply::to(&d, MessageType::Offer);
    good.server = Some(ROGUE);
    good.router = Some(Ipv4Addr::new(192, 168, 78, 1));
    good.yiaddr = Ipv4Addr::new(192, 168, 78, 9);
    c.handle_reply(now, &good.bytes()).unwrap();
    assert_eq!(c.state(), State::Requesting);
    let r = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    assert_eq!(
        r.opts().get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(ROGUE))
    );
}

#[test]
fn a_server_cycling_identities_cannot_reset_another_servers_back_off() {
    let t0 = Instant::now();
    let mut now = t0;
    let mut c = conflicting(29, now);
    c.start(now);
    // The real server's lease refused three times in a row: 40 s before the next.
    let mut d = None;
    for (n, want) in [(1, 10), (2, 20), (3, 40)] {
        let m = decode(&next_tx(&mut c, &mut now, t0 + secs(400)).expect("discover"));
        c.handle_reply(now, &Reply::to(&m, MessageType::Offer).bytes())
            .unwrap();
        match events(&mut c).as_slice() {
            [Event::OfferRefused {
                server,
                repeat,
                retry_in,
                ..
            }] => assert_eq!((*server, *repeat, retry_in.as_secs()), (SRV, n, want)),
            e => panic!("{e:?}"),
        }
        d = Some(m);
    }
    let d = d.unwrap();
    // Within that wait, one host on the uplink offers conflicting leases under many
    // server identities (and addresses): each is refused, memory stays bounded.
    for i in 0..64u8 {
        let mut r = Reply::to(&d, MessageType::Offer);
        r.server = Some(Ipv4Addr::new(10, 9, 0, i));
        r.yiaddr = Ipv4Addr::new(192, 168, 77, 100 + i);
        c.handle_reply(now, &r.bytes()).unwrap();
        assert!(c.refused.len() <= MAX_REFUSALS);
    }
    let _ = events(&mut c);
    // The real server is still within its wait: not reported again, not reset.
    assert!(matches!(
        c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes()),
        Err(Ignored::Refused(_))
    ));
    assert!(events(&mut c).is_empty());
    // After it, its back-off goes on from where it was: the fourth refusal, 80 s.
    let m = decode(&tx_in(&mut c, &mut now, secs(400)).expect("discover"));
    assert!(
        now >= t0 + secs(70),
        "no DISCOVER before the real server's wait"
    );
    c.handle_reply(now, &Reply::to(&m, MessageType::Offer).bytes())
        .unwrap();
    match events(&mut c).as_slice() {
        [Event::OfferRefused {
            server,
            repeat,
            retry_in,
            ..
        }] => assert_eq!((*server, *repeat, retry_in.as_secs()), (SRV, 4, 80)),
        e => panic!("{e:?}"),
    }
}

#[test]
fn conflicting_ack_is_declined_with_back_off_in_every_state() {
    // REQUESTING: the check changed its mind between OFFER and ACK.
    let mut now = Instant::now();
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut c = Client::new(MAC, 41, now);
    let f = flag.clone();
    c.set_lease_check(Box::new(move |_| {
        if f.load(std::sync::atomic::Ordering::Relaxed) {
            Err(SITE_B.into())
        } else {
            Ok(())
        }
    }));
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes())
        .unwrap();
    let r = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    c.handle_reply(now, &Reply::to(&r, MessageType::Ack).bytes())
        .unwrap();
    assert!(matches!(
        events(&mut c).as_slice(),
        [Event::Declined { reason, repeat: 1, removed: None, .. }] if reason == SITE_B
    ));
    let dec = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    assert_eq!(dec.opts().msg_type(), Some(MessageType::Decline));
    // RENEWING: the configuration now conflicts with the bound lease: declined, dropped.
    flag.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut now = Instant::now();
    let mut c = bound(&mut now);
    let f = flag.clone();
    c.set_lease_check(Box::new(move |_| {
        if f.load(std::sync::atomic::Ordering::Relaxed) {
            Err(SITE_B.into())
        } else {
            Ok(())
        }
    }));
    let r = decode(&tx_in(&mut c, &mut now, secs(70)).unwrap());
    let _ = events(&mut c);
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    c.handle_reply_from(now, &Reply::to(&r, MessageType::Ack).bytes(), Some(SRV))
        .unwrap();
    assert!(matches!(
        events(&mut c).as_slice(),
        [Event::Declined { removed: Some(l), .. }] if l.address == ADDR
    ));
    assert!(c.lease().is_none());
}

#[test]
fn stale_lease_only_asks_for_its_address_again() {
    let now = Instant::now() + secs(1000);
    let lease = Lease {
        address: ADDR,
        prefix: 24,
        router: Some(SRV),
        dns: vec![],
        ntp: vec![],
        server: SRV,
        lease_secs: 120,
        t1_secs: 60,
        t2_secs: 105,
        obtained: 0,
    };
    let mut c = Client::new(MAC, 3, now);
    c.restore(now, lease, secs(5));
    c.remember(ADDR);
    assert!(c.lease().is_none());
    c.start(now);
    assert_eq!(c.state(), State::InitReboot);
    let mut t = now;
    // At once, for the old address.
    let r = decode(&next_tx(&mut c, &mut t, now).unwrap());
    assert_eq!(t, now);
    assert_eq!(
        r.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(ADDR))
    );
    // Unanswered: DISCOVER, not a lease believed without its address.
    let mut kinds = Vec::new();
    while let Some(x) = next_tx(&mut c, &mut t, now + secs(30)) {
        kinds.push(decode(&x).opts().msg_type().unwrap());
        if kinds.last() == Some(&MessageType::Discover) {
            break;
        }
    }
    assert_eq!(kinds.last(), Some(&MessageType::Discover), "{kinds:?}");
    assert!(events(&mut c).contains(&Event::RebootUnanswered { keeping: None }));
}

#[test]
fn request_gives_up_after_four_tries_and_discover_backs_off_bounded() {
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 11, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes())
        .unwrap();
    let mut requests = 0;
    let end = now + secs(3600);
    let mut discovers = Vec::new();
    while let Some(t) = next_tx(&mut c, &mut now, end) {
        match decode(&t).opts().msg_type() {
            Some(MessageType::Request) => requests += 1,
            Some(MessageType::Discover) => discovers.push(now),
            k => panic!("{k:?}"),
        }
        if discovers.len() == 10 {
            break;
        }
    }
    assert_eq!(requests, 4);
    let gaps: Vec<Duration> = discovers.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= secs(3) && gaps[0] <= secs(5), "{gaps:?}");
    assert!(gaps.iter().all(|g| *g <= secs(65)), "{gaps:?}");
    assert!(gaps[6] >= secs(63), "capped at 64 s: {gaps:?}");
}

#[test]
fn restored_lease_is_confirmed_with_init_reboot() {
    let now = Instant::now() + secs(1000);
    let lease = Lease {
        address: ADDR,
        prefix: 24,
        router: Some(SRV),
        dns: vec![SRV],
        ntp: vec![],
        server: SRV,
        lease_secs: 120,
        t1_secs: 60,
        t2_secs: 105,
        obtained: 1_700_000_000,
    };
    let mut c = Client::new(MAC, 1, now);
    c.restore(now, lease.clone(), secs(30));
    c.start(now);
    assert_eq!(c.state(), State::InitReboot);
    assert_eq!(c.lease().map(|l| l.address), Some(ADDR));
    assert!(c.poll_timeout().is_some_and(|t| t <= now + secs(90)));
    // An expired lease only names the address to ask for.
    let mut c = Client::new(MAC, 1, now);
    c.restore(now, lease, secs(500));
    c.start(now);
    assert_eq!(c.state(), State::InitReboot);
    assert!(c.lease().is_none());
}

#[test]
fn lease_text_round_trip_and_errors() {
    let l = Lease {
        address: ADDR,
        prefix: 24,
        router: Some(SRV),
        dns: vec![SRV, Ipv4Addr::new(9, 9, 9, 9)],
        ntp: vec![SRV],
        server: SRV,
        lease_secs: 120,
        t1_secs: 60,
        t2_secs: 105,
        obtained: 1_764_531_234,
    };
    let t = l.to_text();
    assert_eq!(
        t,
        "address 192.168.77.2/24\nrouter 192.168.77.1\ndns 192.168.77.1 9.9.9.9\nntp 192.168.77.1\nserver 192.168.77.1\nlease 120\nt1 60\nt2 105\nobtained 1764531234\n"
    );
    assert_eq!(Lease::from_text(&t), Ok(l.clone()));
    let no_router = Lease {
        router: None,
        dns: vec![],
        ntp: vec![],
        ..l.clone()
    };
    assert_eq!(Lease::from_text(&no_router.to_text()), Ok(no_router));
    assert!(Lease::from_text("").is_err());
    assert!(Lease::from_text(&t.replace("/24", "/32")).is_err());
    assert!(Lease::from_text(&t.replace("lease 120", "lease x")).is_err());
    assert!(Lease::from_text(&t.replace("server 192.168.77.1\n", "")).is_err());
    assert_eq!(Lease::from_text(&format!("{t}future 1\n")), Ok(l));
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 5, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    let base = Reply::to(&d, MessageType::Offer).bytes();
    let mut x = 0x1234_5678_9abc_def0u64;
    for i in 0..5000 {
        let mut b = base.clone();
        for _ in 0..(i % 8 + 1) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x as usize) % b.len();
            b[at] = (x >> 32) as u8;
        }
        b.truncate(b.len() - (x as usize >> 40) % 40);
        let _ = c.handle_reply(now, &b);
        let _ = Lease::from_text(&String::from_utf8_lossy(&b));
    }
}

#[test]
fn ntp_servers_from_option_42_unicast_only_and_bounded() {
    let mut now = Instant::now();
    let mut c = Client::new(MAC, 21, now);
    c.start(now);
    let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
    // Option 42 is asked for.
    match d.opts().get(OptionCode::ParameterRequestList) {
        Some(DhcpOption::ParameterRequestList(l)) => {
            assert!(l.contains(&OptionCode::NtpServers), "{l:?}")
        }
        o => panic!("{o:?}"),
    }
    c.handle_reply(now, &Reply::to(&d, MessageType::Offer).bytes())
        .unwrap();
    let r = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
    let mut ack = Reply::to(&r, MessageType::Ack);
    let list: [[u8; 4]; 9] = [
        [0, 0, 0, 0],
        [192, 168, 77, 1],
        [255, 255, 255, 255],
        [224, 0, 1, 1],
        [127, 0, 0, 1],
        [0, 1, 2, 3],
        [240, 0, 0, 1],
        [10, 0, 0, 1],
        [10, 0, 0, 2],
    ];
    let mut raw: Vec<u8> = list.concat();
    raw.extend_from_slice(&[10, 0, 0, 3, 10, 0, 0, 4, 10, 0, 0, 5]);
    ack.ntp = Some(raw);
    c.handle_reply(now, &ack.bytes()).unwrap();
    let want: Vec<Ipv4Addr> = vec![
        Ipv4Addr::new(192, 168, 77, 1),
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        Ipv4Addr::new(10, 0, 0, 3),
    ];
    assert_eq!(MAX_NTP, 4);
    assert_eq!(c.lease().unwrap().ntp, want);
    let text = c.lease().unwrap().to_text();
    assert!(
        text.contains("\nntp 192.168.77.1 10.0.0.1 10.0.0.2 10.0.0.3\n"),
        "{text}"
    );
    assert_eq!(Lease::from_text(&text).unwrap().ntp, want);
}

#[test]
fn broken_option_42_costs_the_ntp_list_not_the_lease() {
    for raw in [vec![10, 0, 0], vec![], vec![10, 0, 0, 1, 10]] {
        let mut now = Instant::now();
        let mut c = Client::new(MAC, 22, now);
        c.start(now);
        let d = decode(&tx_in(&mut c, &mut now, secs(2)).unwrap());
        let mut offer = Reply::to(&d, MessageType::Offer);
        offer.ntp = Some(raw.clone());
        c.handle_reply(now, &offer.bytes()).unwrap();
        let r = decode(&tx_in(&mut c, &mut now, secs(0)).unwrap());
        let mut ack = Reply::to(&r, MessageType::Ack);
        ack.ntp = Some(raw);
        c.handle_reply(now, &ack.bytes()).unwrap();
        assert_eq!(c.state(), State::Bound);
        assert!(c.lease().unwrap().ntp.is_empty());
    }
}

#[test]
fn lease_files_without_ntp_still_load_and_bad_ntp_lines_are_filtered() {
    let old = "address 192.168.77.2/24\nrouter 192.168.77.1\ndns 192.168.77.1\nserver 192.168.77.1\nlease 120\nt1 60\nt2 105\nobtained 1764531234\n";
    let l = Lease::from_text(old).unwrap();
    assert!(l.ntp.is_empty());
    assert!(!l.to_text().contains("ntp"), "no line when empty");
    let l = Lease::from_text(&format!("{old}ntp 127.0.0.1 10.1.1.1 255.255.255.255\n")).unwrap();
    assert_eq!(l.ntp, vec![Ipv4Addr::new(10, 1, 1, 1)]);
    assert!(Lease::from_text(&format!("{old}ntp 10.1.1\n")).is_err());
}

const ROGUE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 66);

/// A bound client at T1, with the first RENEWING REQUEST sent.
fn renewing(now: &mut Instant) -> (Client, Message) {
    let mut c = bound(now);
    let until = *now + secs(70);
    let r = next_tx(&mut c, now, until).unwrap();
    assert_eq!(c.state(), State::Renewing);
    assert_eq!(events(&mut c), vec![Event::Renewing]);
    (c, decode(&r))
}

#[test]
fn renewing_counts_only_the_bound_server() {
    let mut now = Instant::now();
    let (mut c, rm) = renewing(&mut now);
    // Another server's ACK (its own server identifier) is not the one asked.
    let mut rogue = Reply::to(&rm, MessageType::Ack);
    rogue.server = Some(ROGUE);
    rogue.router = Some(ROGUE);
    assert_eq!(
        c.handle_reply_from(now, &rogue.bytes(), Some(ROGUE)),
        Err(Ignored::OtherServer(ROGUE))
    );
    // Nor one that claims the bound server's identifier from another source...
    let spoof = Reply {
        server: Some(SRV),
        ..rogue.clone()
    };
    assert_eq!(
        c.handle_reply_from(now, &spoof.bytes(), Some(ROGUE)),
        Err(Ignored::OtherServer(ROGUE))
    );
    // ...or one without option 54 from another source; its NAK neither.
    let bare = Reply {
        server: None,
        ..rogue.clone()
    };
    assert_eq!(
        c.handle_reply_from(now, &bare.bytes(), Some(ROGUE)),
        Err(Ignored::OtherServer(ROGUE))
    );
    let nak = Reply {
        kind: MessageType::Nak,
        ..rogue.clone()
    };
    assert_eq!(
        c.handle_reply_from(now, &nak.bytes(), Some(ROGUE)),
        Err(Ignored::OtherServer(ROGUE))
    );
    assert_eq!(c.state(), State::Renewing);
    assert!(events(&mut c).is_empty());
    assert_eq!(c.lease().unwrap().router, Some(SRV));
    // The bound server's ACK, over the unicast path: renewed.
    c.handle_reply_from(now, &Reply::to(&rm, MessageType::Ack).bytes(), Some(SRV))
        .unwrap();
    assert!(matches!(events(&mut c).as_slice(), [Event::Renewed(l)] if l.server == SRV));
    assert_eq!(c.state(), State::Bound);
}

#[test]
fn rebinding_takes_any_servers_answer() {
    let mut now = Instant::now();
    let (mut c, _) = renewing(&mut now);
    let at = c.held.as_ref().unwrap().at;
    // Unanswered until T2 (105 s): REBINDING, broadcast.
    let mut t = None;
    while c.state() != State::Rebinding {
        t = next_tx(&mut c, &mut now, at + secs(119));
        assert!(t.is_some());
    }
    assert!(events(&mut c).contains(&Event::Rebinding));
    let rm = decode(&t.unwrap());
    assert_eq!(rm.ciaddr(), ADDR);
    let mut other = Reply::to(&rm, MessageType::Ack);
    other.server = Some(ROGUE);
    other.router = Some(ROGUE);
    c.handle_reply_from(now, &other.bytes(), Some(ROGUE))
        .unwrap();
    // Its router is new: a new binding, replacing the old one's route.
    match events(&mut c).as_slice() {
        [Event::Bound {
            lease: l,
            replaces: Some(old),
        }] => {
            assert_eq!((l.server, l.router), (ROGUE, Some(ROGUE)));
            assert_eq!(old.router, Some(SRV));
        }
        e => panic!("{e:?}"),
    }
    // Renewals now go to the server that answered.
    let r = tx_in(&mut c, &mut now, secs(70)).unwrap();
    assert_eq!(r.to, Some(ROGUE));
}

#[test]
fn rebinding_accepts_another_servers_nak() {
    let mut now = Instant::now();
    let (mut c, _) = renewing(&mut now);
    let at = c.held.as_ref().unwrap().at;
    let mut t = None;
    while c.state() != State::Rebinding {
        t = next_tx(&mut c, &mut now, at + secs(119));
    }
    let mut nak = Reply::to(&decode(&t.unwrap()), MessageType::Nak);
    nak.server = Some(ROGUE);
    c.handle_reply_from(now, &nak.bytes(), Some(ROGUE)).unwrap();
    assert!(events(&mut c)
        .iter()
        .any(|e| matches!(e, Event::Nak { server, removed: Some(_), .. } if *server == ROGUE)));
    assert_eq!(c.state(), State::Init);
}
