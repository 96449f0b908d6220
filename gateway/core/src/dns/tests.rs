use super::*;
use crate::testutil::Rng;
use hickory_proto::rr::rdata::CNAME;

fn c(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn zone() -> Zone {
    let phone = [c("10.100.0.2/32"), c("fd10::2/128")];
    let site = [c("192.168.50.0/24")];
    let bad = [c("10.100.0.9/32")];
    Zone::new(
        "home.arpa",
        &[ip("10.100.0.1"), ip("fd10::1")],
        &[c("10.100.0.1/24"), c("fd10::1/64")],
        [
            ("Phone", &phone[..]),
            ("site", &site[..]),
            ("x.y", &bad[..]),
            ("has space", &bad[..]),
        ],
    )
}

fn settings() -> Settings {
    Settings {
        zone: zone(),
        upstreams: vec![sa("192.0.2.53:53")],
        protected: protected_nets(
            &[c("10.100.0.1/24"), c("fd10::1/64")],
            &[c("10.100.0.2/32"), c("192.168.50.0/24"), c("0.0.0.0/0")],
        ),
    }
}

fn query(id: u16, name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

fn answer_of(id: u16, name: &str, t: RecordType, recs: Vec<Record>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Response, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.answers = recs;
    m.to_vec().unwrap()
}

fn a(name: &str, ttl: u32, addr: &str) -> Record {
    let data = match ip(addr) {
        IpAddr::V4(v) => RData::A(A(v)),
        IpAddr::V6(v) => RData::AAAA(AAAA(v)),
    };
    Record::from_rdata(Name::from_ascii(name).unwrap(), ttl, data)
}

fn parse(o: &Outcome) -> Message {
    match o {
        Outcome::Answer(b) => Message::from_vec(b).unwrap(),
        other => panic!("not an answer: {other:?}"),
    }
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    m.answers.iter().filter_map(|r| r.data.ip_addr()).collect()
}

const SRC: &str = "10.100.0.2";

#[test]
fn names_that_are_labels_are_published() {
    assert!(publishable("phone") && publishable("a-1") && publishable("X9"));
    for bad in [
        "",
        "x.y",
        "has space",
        "-a",
        "a-",
        "under_score",
        &"a".repeat(64),
        "é",
    ] {
        assert!(!publishable(bad), "{bad:?}");
    }
    let hosts: Vec<String> = zone().hosts().into_iter().map(|(n, _)| n).collect();
    assert_eq!(hosts, ["gateway", "phone", "site"]);
}

#[test]
fn local_names_and_reverse() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(1);
    let m = parse(&r.query(
        ip(SRC),
        &query(7, "PHONE.home.arpa.", RecordType::A),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(m.metadata.id, 7);
    assert!(m.metadata.authoritative);
    assert_eq!(addrs(&m), [ip("10.100.0.2")]);
    assert_eq!(
        m.queries[0].name.to_ascii(),
        "PHONE.home.arpa.",
        "the question as asked"
    );
    let m = parse(&r.query(
        ip(SRC),
        &query(8, "phone.home.arpa.", RecordType::AAAA),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(addrs(&m), [ip("fd10::2")]);
    let m = parse(&r.query(
        ip(SRC),
        &query(9, "gateway.home.arpa.", RecordType::A),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(addrs(&m), [ip("10.100.0.1")]);
    // A site peer has no host address: published without records; unknown: NXDOMAIN.
    let m = parse(&r.query(
        ip(SRC),
        &query(10, "site.home.arpa.", RecordType::A),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(
        (m.metadata.response_code, m.answers.len()),
        (ResponseCode::NoError, 0)
    );
    for n in ["nope.home.arpa.", "x.y.home.arpa.", "a.phone.home.arpa."] {
        let m = parse(&r.query(ip(SRC), &query(11, n, RecordType::A), false, 0, &mut rng));
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{n}");
    }
    let m = parse(&r.query(
        ip(SRC),
        &query(12, "2.0.100.10.in-addr.arpa.", RecordType::PTR),
        false,
        0,
        &mut rng,
    ));
    match &m.answers[0].data {
        RData::PTR(p) => assert_eq!(p.0.to_ascii(), "phone.home.arpa."),
        other => panic!("{other:?}"),
    }
    let m = parse(&r.query(
        ip(SRC),
        &query(13, "1.0.100.10.in-addr.arpa.", RecordType::PTR),
        false,
        0,
        &mut rng,
    ));
    assert!(matches!(&m.answers[0].data, RData::PTR(p) if p.0.to_ascii() == "gateway.home.arpa."));
    let m = parse(&r.query(
        ip(SRC),
        &query(14, "77.0.100.10.in-addr.arpa.", RecordType::PTR),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    let v6 = format!("2.{}0.1.d.f.ip6.arpa.", "0.".repeat(27));
    let m = parse(&r.query(
        ip(SRC),
        &query(15, &v6, RecordType::PTR),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(m.answers.len(), 1, "{m:?}");
    // Outside the tunnel: forwarded.
    let o = r.query(
        ip(SRC),
        &query(16, "1.2.0.192.in-addr.arpa.", RecordType::PTR),
        false,
        0,
        &mut rng,
    );
    assert!(matches!(o, Outcome::Forward { .. }), "{o:?}");
    assert_eq!(r.stats.local, 11);
}

#[test]
fn a_domain_that_does_not_parse_is_the_default() {
    for d in ["", "bad domain", "x..y", "-a.b"] {
        assert_eq!(Zone::new(d, &[], &[], []).domain(), DEFAULT_DOMAIN, "{d:?}");
    }
    assert_eq!(
        Zone::new("Lab.Example.", &[], &[], []).domain(),
        "lab.example"
    );
}

/// Forward one query and return the token, the ID it went out with and its question.
fn forward(r: &mut Resolver, rng: &mut Rng, id: u16, name: &str, now: u64) -> (u64, u16) {
    match r.query(ip(SRC), &query(id, name, RecordType::A), false, now, rng) {
        Outcome::Forward {
            token,
            upstream,
            bytes,
        } => {
            assert_eq!(upstream, sa("192.0.2.53:53"));
            let m = Message::from_vec(&bytes).unwrap();
            assert_eq!(m.queries[0].name.to_ascii(), name);
            (token, m.metadata.id)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn forwards_with_fresh_ids_and_takes_only_the_matching_answer() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(2);
    let (t1, id1) = forward(&mut r, &mut rng, 100, "example.com.", 0);
    let (_, id2) = forward(&mut r, &mut rng, 100, "example.org.", 0);
    assert_ne!((id1, id2), (100, 100), "the client's ID is not reused");
    assert_ne!(id1, id2);
    let good = answer_of(
        id1,
        "example.com.",
        RecordType::A,
        vec![a("example.com.", 300, "93.184.216.34")],
    );
    let up = sa("192.0.2.53:53");
    // A wrong ID, a wrong source (address or port), another question: ignored.
    let wrong_id = answer_of(
        id1 ^ 1,
        "example.com.",
        RecordType::A,
        vec![a("example.com.", 300, "6.6.6.6")],
    );
    assert_eq!(r.upstream_answer(t1, up, &wrong_id, 10), None);
    assert_eq!(r.upstream_answer(t1, sa("192.0.2.54:53"), &good, 10), None);
    assert_eq!(
        r.upstream_answer(t1, sa("192.0.2.53:5353"), &good, 10),
        None
    );
    let other_q = answer_of(
        id1,
        "evil.com.",
        RecordType::A,
        vec![a("evil.com.", 300, "6.6.6.6")],
    );
    assert_eq!(r.upstream_answer(t1, up, &other_q, 10), None);
    let other_t = answer_of(id1, "example.com.", RecordType::AAAA, vec![]);
    assert_eq!(r.upstream_answer(t1, up, &other_t, 10), None);
    assert_eq!(r.upstream_answer(t1, up, b"\x00garbage", 10), None);
    assert_eq!(r.stats.mismatched, 6);
    // The real one (its name in another case) still arrives.
    let good_case = answer_of(
        id1,
        "EXAMPLE.com.",
        RecordType::A,
        vec![a("example.com.", 300, "93.184.216.34")],
    );
    let b = r
        .upstream_answer(t1, up, &good_case, 20)
        .expect("the answer");
    let m = Message::from_vec(&b).unwrap();
    assert_eq!(m.metadata.id, 100, "the client's ID again");
    assert_eq!(addrs(&m), [ip("93.184.216.34")]);
    // Taken once.
    assert_eq!(r.upstream_answer(t1, up, &good, 30), None);
    assert_eq!(r.pending(), 1);
}

#[test]
fn rebinding_into_the_tunnel_is_dropped() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(3);
    let (t, id) = forward(&mut r, &mut rng, 1, "rebind.example.", 0);
    let recs = vec![
        a("rebind.example.", 60, "10.100.0.2"),
        a("rebind.example.", 60, "192.168.50.7"),
        a("rebind.example.", 60, "fd10::9"),
        a("rebind.example.", 60, "198.51.100.1"),
    ];
    let b = r
        .upstream_answer(
            t,
            sa("192.0.2.53:53"),
            &answer_of(id, "rebind.example.", RecordType::A, recs),
            0,
        )
        .unwrap();
    let m = Message::from_vec(&b).unwrap();
    assert_eq!(
        addrs(&m),
        [ip("198.51.100.1")],
        "the hub's 0.0.0.0/0 does not protect everything"
    );
    assert_eq!(r.stats.rebinding_dropped, 3);
    // The cache holds what was passed.
    let m = parse(&r.query(
        ip(SRC),
        &query(2, "rebind.example.", RecordType::A),
        false,
        1000,
        &mut rng,
    ));
    assert_eq!(addrs(&m), [ip("198.51.100.1")]);
    // A CNAME is no address: kept.
    let (t, id) = forward(&mut r, &mut rng, 3, "c.example.", 0);
    let cname = Record::from_rdata(
        Name::from_ascii("c.example.").unwrap(),
        60,
        RData::CNAME(CNAME(Name::from_ascii("d.example.").unwrap())),
    );
    let b = r
        .upstream_answer(
            t,
            sa("192.0.2.53:53"),
            &answer_of(id, "c.example.", RecordType::A, vec![cname]),
            0,
        )
        .unwrap();
    assert_eq!(Message::from_vec(&b).unwrap().answers.len(), 1);
}

#[test]
fn cache_keeps_answers_within_their_ttl() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(4);
    let (t, id) = forward(&mut r, &mut rng, 1, "ttl.example.", 0);
    let recs = vec![
        a("ttl.example.", 30, "198.51.100.1"),
        a("ttl.example.", 10, "198.51.100.2"),
    ];
    r.upstream_answer(
        t,
        sa("192.0.2.53:53"),
        &answer_of(id, "ttl.example.", RecordType::A, recs),
        1_000,
    )
    .unwrap();
    // 4 s later: from the cache, TTLs lowered by 4.
    let m = parse(&r.query(
        ip(SRC),
        &query(2, "TTL.example.", RecordType::A),
        false,
        5_000,
        &mut rng,
    ));
    assert_eq!(m.metadata.id, 2);
    let ttls: Vec<u32> = m.answers.iter().map(|r| r.ttl).collect();
    assert_eq!(ttls, [26, 6]);
    assert_eq!(r.stats.cache_hits, 1);
    // A reader whose clock is a little behind the store sees the full TTLs.
    let m = parse(&r.query(
        ip(SRC),
        &query(4, "ttl.example.", RecordType::A),
        false,
        900,
        &mut rng,
    ));
    assert_eq!(m.answers[0].ttl, 30);
    // The smallest TTL (10 s) ends the entry.
    assert!(matches!(
        r.query(
            ip(SRC),
            &query(3, "ttl.example.", RecordType::A),
            false,
            11_000,
            &mut rng
        ),
        Outcome::Forward { .. }
    ));
}

#[test]
fn cache_is_bounded() {
    let mut cache = Cache::new(3, 1 << 20);
    for (i, ttl) in [50u32, 10, 40, 30].iter().enumerate() {
        let name = format!("n{i}.example.");
        let b = answer_of(
            1,
            &name,
            RecordType::A,
            vec![a(&name, *ttl, "198.51.100.1")],
        );
        cache.insert(&Message::from_vec(&b).unwrap(), 0);
    }
    assert_eq!(cache.len(), 3);
    let q = |n: &str| Query::query(Name::from_ascii(n).unwrap(), RecordType::A);
    assert!(
        cache.get(&q("n1.example."), 0).is_none(),
        "closest to expiry went first"
    );
    assert!(cache.get(&q("n3.example."), 0).is_some());
    // Bytes bound: nothing larger than an eighth of it is kept, and the total stays under.
    let mut small = Cache::new(100, 800);
    for i in 0..50 {
        let name = format!("b{i}.example.");
        let b = answer_of(1, &name, RecordType::A, vec![a(&name, 60, "198.51.100.1")]);
        small.insert(&Message::from_vec(&b).unwrap(), 0);
        assert!(small.bytes() <= 800);
    }
    assert!(small.len() < 50 && !small.is_empty());
    // No records, TTL 0, SERVFAIL: not kept.
    let mut c0 = Cache::default();
    let b = answer_of(
        1,
        "z.example.",
        RecordType::A,
        vec![a("z.example.", 0, "198.51.100.1")],
    );
    c0.insert(&Message::from_vec(&b).unwrap(), 0);
    let b = answer_of(1, "e.example.", RecordType::A, vec![]);
    c0.insert(&Message::from_vec(&b).unwrap(), 0);
    let mut sf = Message::from_vec(&answer_of(
        1,
        "s.example.",
        RecordType::A,
        vec![a("s.example.", 60, "198.51.100.1")],
    ))
    .unwrap();
    sf.metadata.response_code = ResponseCode::ServFail;
    c0.insert(&sf, 0);
    assert!(c0.is_empty());
    c0.expire(u64::MAX);
}

#[test]
fn rate_limit_per_source() {
    let mut rl = RateLimit::new(10, 5, 2);
    let (x, y) = (ip("10.100.0.2"), ip("10.100.0.3"));
    assert_eq!((0..20).filter(|_| rl.allow(x, 0)).count(), 10);
    assert!(rl.allow(y, 0), "another source has its own bucket");
    assert!(!rl.allow(x, 100));
    assert!(rl.allow(x, 200), "5 a second: one token per 200 ms");
    assert_eq!(
        (0..20).filter(|_| rl.allow(x, 10_000)).count(),
        10,
        "refilled to the burst, no more"
    );
    // The table is bounded: a third source forgets the least recently heard.
    assert!(rl.allow(ip("10.100.0.4"), 10_000));
    assert_eq!(rl.sources(), 2);
    // Through the resolver: a flood is cut, counted.
    let mut r = Resolver::new(settings());
    let mut rng = Rng(5);
    let q = query(1, "phone.home.arpa.", RecordType::A);
    let served = (0..1000)
        .filter(|_| matches!(r.query(ip(SRC), &q, false, 0, &mut rng), Outcome::Answer(_)))
        .count();
    assert_eq!(served, RATE_BURST as usize);
    assert!(matches!(
        r.query(ip("10.100.0.3"), &q, false, 0, &mut rng),
        Outcome::Answer(_)
    ));
    assert_eq!(r.stats.rate_limited, 1000 - RATE_BURST as u64);
}

#[test]
fn timeouts_servfail_and_pending_bounds() {
    let mut r = Resolver::new(settings());
    r.rate = RateLimit::new(10_000, 10_000, 16);
    let mut rng = Rng(6);
    let (t, _) = forward(&mut r, &mut rng, 42, "slow.example.", 0);
    assert_eq!(r.next_deadline(), Some(FORWARD_TIMEOUT_MS));
    assert!(r.expire(FORWARD_TIMEOUT_MS - 1).is_empty());
    let late = r.expire(FORWARD_TIMEOUT_MS);
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].0, t);
    let m = Message::from_vec(&late[0].1).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (42, ResponseCode::ServFail)
    );
    for i in 0..MAX_PENDING_PER_SOURCE {
        forward(&mut r, &mut rng, 1, &format!("p{i}.example."), 0);
    }
    assert_eq!(
        r.query(
            ip(SRC),
            &query(1, "one-more.example.", RecordType::A),
            false,
            0,
            &mut rng
        ),
        Outcome::Drop(Dropped::TooManyPending)
    );
    assert!(matches!(
        r.query(
            ip("10.100.0.3"),
            &query(1, "other.example.", RecordType::A),
            false,
            0,
            &mut rng
        ),
        Outcome::Forward { .. }
    ));
}

#[test]
fn odd_messages() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(7);
    assert_eq!(
        r.query(ip(SRC), b"", false, 0, &mut rng),
        Outcome::Drop(Dropped::Malformed)
    );
    assert_eq!(
        r.query(ip(SRC), &[0xff; 11], false, 0, &mut rng),
        Outcome::Drop(Dropped::Malformed)
    );
    let resp = answer_of(1, "x.example.", RecordType::A, vec![]);
    assert_eq!(
        r.query(ip(SRC), &resp, false, 0, &mut rng),
        Outcome::Drop(Dropped::NotAQuery)
    );
    let mut two = Message::from_vec(&query(5, "a.example.", RecordType::A)).unwrap();
    two.add_query(Query::query(
        Name::from_ascii("b.example.").unwrap(),
        RecordType::A,
    ));
    let m = parse(&r.query(ip(SRC), &two.to_vec().unwrap(), false, 0, &mut rng));
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    let mut chaos = Message::from_vec(&query(6, "version.bind.", RecordType::TXT)).unwrap();
    chaos.queries[0].query_class = DNSClass::CH;
    let m = parse(&r.query(ip(SRC), &chaos.to_vec().unwrap(), false, 0, &mut rng));
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    // No upstream: SERVFAIL at once.
    let mut none = settings();
    none.upstreams.clear();
    let mut r = Resolver::new(none);
    let m = parse(&r.query(
        ip(SRC),
        &query(8, "example.com.", RecordType::A),
        false,
        0,
        &mut rng,
    ));
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}

#[test]
fn big_answers_are_truncated_over_udp() {
    let mut r = Resolver::new(settings());
    let mut rng = Rng(8);
    let (t, id) = forward(&mut r, &mut rng, 9, "big.example.", 0);
    let recs = (0..60)
        .map(|i| a("big.example.", 60, &format!("198.51.100.{i}")))
        .collect();
    let b = r
        .upstream_answer(
            t,
            sa("192.0.2.53:53"),
            &answer_of(id, "big.example.", RecordType::A, recs),
            0,
        )
        .unwrap();
    assert!(b.len() <= UDP_PLAIN);
    let m = Message::from_vec(&b).unwrap();
    assert!(m.metadata.truncation && m.answers.is_empty());
    // Over TCP the cached answer comes whole.
    let m = match r.query(
        ip(SRC),
        &query(10, "big.example.", RecordType::A),
        true,
        0,
        &mut rng,
    ) {
        Outcome::Answer(b) => Message::from_vec(&b).unwrap(),
        o => panic!("{o:?}"),
    };
    assert_eq!(m.answers.len(), 60);
}

#[test]
fn settings_from_the_configuration() {
    use crate::config::{Config, PeerConfig};
    use crate::key::Key;
    let mut cfg = Config::default();
    cfg.interface.addresses = vec![c("10.100.0.1/24")];
    let mut phone = PeerConfig::new(Key([1; 32]));
    phone.name = Some("phone".into());
    phone.allowed_ips = vec![c("10.100.0.2/32")];
    let mut off = PeerConfig::new(Key([2; 32]));
    off.name = Some("old".into());
    off.allowed_ips = vec![c("10.100.0.3/32")];
    off.enabled = false;
    let mut dotted = PeerConfig::new(Key([3; 32]));
    dotted.name = Some("x.y".into());
    dotted.allowed_ips = vec![c("10.100.0.4/32")];
    cfg.peers = vec![phone, off, dotted];
    let s = Settings::for_config(
        &cfg,
        "lab.test",
        &[ip("192.0.2.53"), ip("10.100.0.1"), ip("192.0.2.53")],
    );
    assert_eq!(
        s.upstreams,
        [sa("192.0.2.53:53")],
        "our own address is no upstream, nor a repeat"
    );
    assert_eq!(s.zone.domain(), "lab.test");
    let names: Vec<String> = s.zone.hosts().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["gateway", "phone"],
        "disabled and unpublishable peers are not named"
    );
    assert_eq!(
        s.protected,
        [c("10.100.0.0/24"), c("10.100.0.2/32"), c("10.100.0.4/32")]
    );
}
