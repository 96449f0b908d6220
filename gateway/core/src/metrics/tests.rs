use super::*;

fn text(g: &GatewayMetrics, peers: &[PeerMetrics]) -> String {
    String::from_utf8(write_exposition(Vec::new(), g, peers).unwrap()).unwrap()
}

/// Every family's name is a valid Prometheus name with `riceguard_` first, counters end in
/// `_total` and gauges do not; no name twice.
#[test]
fn family_names_follow_the_conventions() {
    let mut seen = std::collections::HashSet::new();
    for f in FAMILIES {
        assert!(valid_name(f.name), "{}", f.name);
        assert!(f.name.starts_with("riceguard_"), "{}", f.name);
        assert_eq!(
            f.name.ends_with("_total"),
            f.kind == Kind::Counter,
            "{}",
            f.name
        );
        assert!(seen.insert(f.name), "{} twice", f.name);
        assert!(!f.help.is_empty());
    }
    for bad in ["", "1x", "a-b", "a b", "é"] {
        assert!(!valid_name(bad), "{bad:?}");
    }
}

/// `\`, `"` and newline in a label value are escaped; in HELP text `\` and newline.
#[test]
fn label_values_and_help_are_escaped() {
    let mut w = Writer::new(Vec::new());
    w.sample("m", &[("name", "a\\b\"c\nd"), ("k", "")], Value::U(7))
        .unwrap();
    w.sample("m", &[], Value::F(f64::NAN)).unwrap();
    w.sample("m", &[], Value::F(f64::NEG_INFINITY)).unwrap();
    w.sample("m", &[], Value::I(-3)).unwrap();
    w.sample("m", &[], Value::F(0.25)).unwrap();
    w.family(&Family {
        name: "m",
        kind: Kind::Gauge,
        help: "a\\b\n\"c\"",
    })
    .unwrap();
    let t = String::from_utf8(w.into_inner()).unwrap();
    assert_eq!(
        t,
        "m{name=\"a\\\\b\\\"c\\nd\",k=\"\"} 7\nm NaN\nm -Inf\nm -3\nm 0.25\n\
         # HELP m a\\\\b\\n\"c\"\n# TYPE m gauge\n"
    );
}

fn phone() -> PeerMetrics {
    let mut p = PeerMetrics::new("phone", "AAAA+/=".into(), true);
    p.rx_bytes = 1234;
    p.tx_bytes = 99;
    p.latest_handshake = 1_700_000_000;
    p.handshake_attempts = 3;
    p.transport = Some(Transport::Tcp);
    p
}

/// A small exposition, line by line: each family's HELP and TYPE once, before its
/// samples, the samples of a family together; a disabled peer exported with enabled 0.
#[test]
fn an_exposition_in_full() {
    let g = GatewayMetrics {
        version: "1.2".into(),
        build: "abc".into(),
        uptime_seconds: 12.5,
        device_drops: vec![("malformed", 2), ("rejected", 0)],
        firewall_drops: Some(vec![("uplink-in".into(), 5)]),
        offload: "gso".into(),
        tcp: Some((1, 4)),
        workers: vec![(10, Some(0.5)), (11, None)],
        leases: vec![("eth0".into(), 3600)],
        ntp_servers: Some(2),
        ntp_sync_age: Some(30.0),
        clock_source: Some("ntp".into()),
        boot: Some(("a".into(), true)),
        services: vec![ServiceFigures {
            name: "gateway".into(),
            restarts: 1,
            running: true,
        }],
        dns: Some(vec![("query", 9), ("rebinding_dropped", 1)]),
    };
    let off = PeerMetrics::new("", "BBBB".into(), false);
    let t = text(&g, &[phone(), off]);
    for want in [
        "riceguard_build_info{version=\"1.2\",build=\"abc\"} 1\n",
        "riceguard_daemon_uptime_seconds 12.5\n",
        "riceguard_peers 2\n",
        "riceguard_device_drops_total{cause=\"malformed\"} 2\n",
        "riceguard_firewall_table_present 1\n",
        "riceguard_firewall_drops_total{counter=\"uplink-in\"} 5\n",
        "riceguard_dns_events_total{event=\"query\"} 9\n",
        "riceguard_dns_events_total{event=\"rebinding_dropped\"} 1\n",
        "riceguard_offload_info{chain=\"gso\"} 1\n",
        "riceguard_tcp_fallback_connections 1\n",
        "riceguard_tcp_fallback_accepted_total 4\n",
        "riceguard_worker_rounds_total{worker=\"1\"} 11\n",
        "riceguard_worker_cpu_seconds_total{worker=\"0\"} 0.5\n",
        "riceguard_dhcp_lease_remaining_seconds{interface=\"eth0\"} 3600\n",
        "riceguard_ntp_servers 2\n",
        "riceguard_ntp_last_sync_age_seconds 30\n",
        "riceguard_clock_source_info{source=\"ntp\"} 1\n",
        "riceguard_boot_slot_info{slot=\"a\"} 1\n",
        "riceguard_boot_marked_good 1\n",
        "riceguard_service_restarts_total{service=\"gateway\"} 1\n",
        "riceguard_service_running{service=\"gateway\"} 1\n",
        "riceguard_peer_receive_bytes_total{name=\"phone\",public_key=\"AAAA+/=\"} 1234\n",
        "riceguard_peer_transmit_bytes_total{name=\"phone\",public_key=\"AAAA+/=\"} 99\n",
        "riceguard_peer_latest_handshake_seconds{name=\"phone\",public_key=\"AAAA+/=\"} 1700000000\n",
        "riceguard_peer_handshake_attempts_total{name=\"phone\",public_key=\"AAAA+/=\"} 3\n",
        "riceguard_peer_transport{name=\"phone\",public_key=\"AAAA+/=\",transport=\"udp\"} 0\n",
        "riceguard_peer_transport{name=\"phone\",public_key=\"AAAA+/=\",transport=\"tcp\"} 1\n",
        "riceguard_peer_enabled{name=\"phone\",public_key=\"AAAA+/=\"} 1\n",
        "riceguard_peer_enabled{name=\"\",public_key=\"BBBB\"} 0\n",
        "riceguard_peer_receive_bytes_total{name=\"\",public_key=\"BBBB\"} 0\n",
        "riceguard_peer_transport{name=\"\",public_key=\"BBBB\",transport=\"udp\"} 0\n",
    ] {
        assert!(t.contains(want), "{want} missing from:\n{t}");
    }
    // The peers' extra families are left out when the device does not count them.
    assert!(!t.contains("riceguard_peer_health"), "{t}");
    assert!(!t.contains("riceguard_peer_receive_packets_total"), "{t}");
    check_grouped(&t);
}

/// Each family: HELP, TYPE, then its samples with no other family in between.
fn check_grouped(t: &str) {
    let mut done = std::collections::HashSet::new();
    let mut current = String::new();
    for l in t.lines() {
        if let Some(r) = l.strip_prefix("# HELP ") {
            let name = r.split(' ').next().unwrap().to_string();
            assert!(done.insert(name.clone()), "{name} written twice");
            current = name;
        } else if let Some(r) = l.strip_prefix("# TYPE ") {
            assert!(r.starts_with(&format!("{current} ")), "{l}");
        } else {
            let name = l.split(['{', ' ']).next().unwrap();
            assert_eq!(name, current, "a sample outside its family: {l}");
        }
    }
}

/// With the device's newer figures, their families appear; health is one-hot.
#[test]
fn extra_peer_figures_and_one_hot_health() {
    let mut p = phone();
    p.extra = PeerExtra {
        rx_packets: Some(10),
        tx_packets: Some(11),
        endpoint_changes: Some(1),
        handshake_failures: Some(2),
        last_rx_age: Some(Some(4.0)),
        health: Some("idle"),
        shared_key_devices: Some(false),
        access_drops: Some(7),
    };
    let mut never = PeerMetrics::new("x", "K".into(), true);
    never.extra.last_rx_age = Some(None);
    never.extra.health = Some("never");
    let t = text(&GatewayMetrics::default(), &[p, never]);
    check_grouped(&t);
    for want in [
        "riceguard_peer_receive_packets_total{name=\"phone\",public_key=\"AAAA+/=\"} 10\n",
        "riceguard_peer_transmit_packets_total{name=\"phone\",public_key=\"AAAA+/=\"} 11\n",
        "riceguard_peer_endpoint_changes_total{name=\"phone\",public_key=\"AAAA+/=\"} 1\n",
        "riceguard_peer_handshake_failures_total{name=\"phone\",public_key=\"AAAA+/=\"} 2\n",
        "riceguard_peer_last_receive_age_seconds{name=\"phone\",public_key=\"AAAA+/=\"} 4\n",
        "riceguard_peer_shared_key_devices{name=\"phone\",public_key=\"AAAA+/=\"} 0\n",
        "riceguard_peer_health{name=\"phone\",public_key=\"AAAA+/=\",state=\"idle\"} 1\n",
        "riceguard_peer_health{name=\"phone\",public_key=\"AAAA+/=\",state=\"up\"} 0\n",
        "riceguard_peer_health{name=\"x\",public_key=\"K\",state=\"never\"} 1\n",
        "riceguard_peer_access_drops_total{name=\"phone\",public_key=\"AAAA+/=\"} 7\n",
    ] {
        assert!(t.contains(want), "{want} missing from:\n{t}");
    }
    // Not restricted: no access-drops sample for it.
    assert!(!t.contains("riceguard_peer_access_drops_total{name=\"x\""));
    // Never heard from: no age sample for it.
    assert!(!t.contains("riceguard_peer_last_receive_age_seconds{name=\"x\""));
    let ones = t
        .lines()
        .filter(|l| l.starts_with("riceguard_peer_health{name=\"phone\"") && l.ends_with(" 1"))
        .count();
    assert_eq!(ones, 1);
}

/// A write error (a client gone) is returned, never a panic.
#[test]
fn a_failing_writer_ends_the_write_with_its_error() {
    struct Broken(usize);
    impl Write for Broken {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.0 < b.len() {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            self.0 -= b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let peers: Vec<PeerMetrics> = (0..100).map(|_| phone()).collect();
    for room in [0, 10, 500, 5000] {
        let r = write_exposition(Broken(room), &GatewayMetrics::default(), &peers);
        assert!(r.is_err());
    }
}

/// A source that restarts from 0 goes on from where it was; series are pruned only
/// beyond the limit.
#[test]
fn counters_never_go_back() {
    let mut m = Monotonic::default();
    assert_eq!(m.get("a", 5), 5);
    assert_eq!(m.get("a", 7), 7);
    assert_eq!(m.get("a", 0), 7); // reset
    assert_eq!(m.get("a", 3), 10);
    assert_eq!(m.get("a", 2), 12); // reset again
    assert_eq!(m.get("b", u64::MAX), u64::MAX);
    assert_eq!(m.get("b", 1), u64::MAX); // saturates, never wraps
    m.prune(5, |_| false);
    assert_eq!(m.len(), 2);
    m.prune(1, |k| k == "a");
    assert_eq!(m.len(), 1);
    assert_eq!(m.get("a", 2), 12);
}

#[test]
fn head_ends_at_the_empty_line() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
    assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    assert_eq!(head_end(b""), None);
    assert_eq!(head_end(b"\n"), None);
}

#[test]
fn requests() {
    let ok = |s: &str| parse_request(s.as_bytes());
    assert_eq!(
        ok("GET /metrics HTTP/1.1\r\nHost: x:9586\r\n\r\n"),
        Ok(Route::Metrics)
    );
    assert_eq!(ok("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Ok(Route::Metrics));
    assert_eq!(ok("GET / HTTP/1.1\n\n"), Ok(Route::Index));
    assert_eq!(
        ok("GET /metrics HTTP/1.1\r\nAccept: text/plain;q=0.9,\t*/*\r\n\r\n"),
        Ok(Route::Metrics)
    );
    assert_eq!(ok("GET /other HTTP/1.1\r\n\r\n"), Err(HttpError::NotFound));
    assert_eq!(
        ok("POST /metrics HTTP/1.1\r\n\r\n"),
        Err(HttpError::MethodNotAllowed)
    );
    assert_eq!(
        ok("HEAD / HTTP/1.1\r\n\r\n"),
        Err(HttpError::MethodNotAllowed)
    );
    for bad in [
        "",
        "\r\n\r\n",
        "GET /metrics\r\n\r\n",
        "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/2\r\n\r\n",
        "GET metrics HTTP/1.1\r\n\r\n",
        "GET http://x/metrics HTTP/1.1\r\n\r\n",
        "GET /met rics HTTP/1.1\r\n\r\n",
        "G(T /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nA: b\x00c\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n: empty name\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: x\r\n",
        "GET /metrics HTTP/1.1\r\n\r\nbody",
        "GET /\u{e9} HTTP/1.1\r\n\r\n",
    ] {
        assert_eq!(ok(bad), Err(HttpError::BadRequest), "{bad:?}");
    }
    assert_eq!(
        parse_request(b"GET /\xff HTTP/1.1\r\n\r\n"),
        Err(HttpError::BadRequest)
    );
    let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    assert_eq!(ok(&long), Err(HttpError::TooLarge));
    assert_eq!(HttpError::TooLarge.status().0, 431);
}

#[test]
fn a_response_head_closes_the_connection() {
    let h = response_head(405, "Method Not Allowed", "text/plain", true);
    assert!(h.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
    assert!(h.contains("\r\nAllow: GET\r\n") && h.contains("\r\nConnection: close\r\n"));
    assert!(h.ends_with("\r\n\r\n"));
}
