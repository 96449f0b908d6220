use super::*;
use crate::core::config::PeerConfig;
use crate::core::key::Key;
use crate::core::net::Cidr;

fn key(i: u32) -> Key {
    let mut k = [7u8; 32];
    k[..4].copy_from_slice(&i.to_be_bytes());
    Key(k)
}

/// A configuration of `n` enabled peers (10.x.y.z/32 each) and one disabled one.
fn config(n: u32) -> Config {
    let mut cfg = Config::default();
    cfg.interface.private_key = Some(crate::core::testutil::private_key());
    for i in 0..n {
        let mut p = PeerConfig::new(key(i));
        let [_, a, b, c] = (i + 1).to_be_bytes();
        p.allowed_ips = vec![Cidr::new(IpAddr::from([10, a, b, c]), 32).unwrap()];
        p.name = (i == 0).then(|| "phone".into());
        cfg.peers.push(p);
    }
    let mut off = PeerConfig::new(key(u32::MAX));
    off.name = Some("old \"laptop\"".into());
    off.enabled = false;
    cfg.peers.push(off);
    cfg
}

fn sources(cfg: &Config) -> Sources {
    let device = Arc::new(Device::new(Box::new(crate::core::testutil::Rng(1))));
    device.reconfigure(&cfg.running()).unwrap();
    Sources {
        device,
        heartbeats: Arc::new(Heartbeats::new(2)),
        tcp: Arc::new(TcpSlot::default()),
        udp_tx: UdpTx::SoftwareGso,
        started: Instant::now(),
        worker_cores: vec![0],
        dns: None,
    }
}

/// Every configured peer has its series, a disabled one with enabled 0 and zeros; the
/// labels are the name and the key, never an address.
#[test]
fn peers_enabled_and_disabled() {
    let cfg = config(2);
    let src = sources(&cfg);
    let (g, peers) = collect(&src, &cfg, &mut Monotonic::default());
    assert_eq!(peers.len(), 3);
    assert_eq!(peers[0].name, "phone");
    assert_eq!(peers[0].public_key, key(0).to_base64());
    assert!(peers[0].enabled && peers[1].enabled && !peers[2].enabled);
    assert_eq!(peers[2].name, "old \"laptop\"");
    assert_eq!(g.offload, "gso");
    assert_eq!(g.workers.len(), 2);
    assert_eq!(g.device_drops.len(), 10);
    let t = String::from_utf8(m::write_exposition(Vec::new(), &g, &peers).unwrap()).unwrap();
    assert!(t.contains(&format!(
        "riceguard_peer_enabled{{name=\"old \\\"laptop\\\"\",public_key=\"{}\"}} 0\n",
        key(u32::MAX).to_base64()
    )));
    assert!(t.contains("riceguard_peer_receive_bytes_total{name=\"phone\""));
    // The device's health and packet counts; a peer never heard has no receive age.
    assert!(t.contains("riceguard_peer_health{name=\"phone\""));
    assert!(t.contains(&format!(
        "riceguard_peer_health{{name=\"phone\",public_key=\"{}\",state=\"never\"}} 1\n",
        key(0).to_base64()
    )));
    assert!(t.contains("riceguard_peer_receive_packets_total{name=\"phone\""));
    assert!(t.contains("riceguard_peer_shared_key_devices{name=\"phone\""));
    assert!(!t.contains("riceguard_peer_last_receive_age_seconds{name=\"phone\""));
    assert!(!t.contains("10.0.0.1"), "an address in the exposition");
}

#[test]
fn task_stat_lines() {
    let l = "123 (rg-worker-1) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 5 6 7";
    assert_eq!(parse_task_stat(l), Some((1, 300)));
    // Another thread, short and bad lines.
    assert_eq!(
        parse_task_stat("9 (rg-timers) S 1 2 3 4 5 6 7 8 9 10 1 1"),
        None
    );
    assert_eq!(parse_task_stat("9 (a) b) S 1"), None);
    assert_eq!(parse_task_stat("9 (rg-worker-0) S 1 2"), None);
    assert_eq!(parse_task_stat(""), None);
    assert_eq!(parse_task_stat(")("), None);
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Follow `cfg` on a port free now (another test's socket may take one between the look
/// and the bind: then another port).
fn follow_on_a_free_port(mx: &Metrics, cfg: &mut Config) {
    for _ in 0..10 {
        cfg.gateway.metrics_port = free_port();
        mx.follow(cfg);
        if mx.port() == Some(cfg.gateway.metrics_port) {
            return;
        }
    }
    panic!("no free port bound");
}

fn ask(port: u16, req: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The endpoint answers GET /metrics and refuses the rest with the right status; at most
/// MAX_CONNS connections at once; a reload moves and stops it.
#[test]
fn the_endpoint_serves_refuses_and_follows_the_configuration() {
    let mut cfg = config(1);
    cfg.gateway.metrics = true;
    let mx = Metrics::new(sources(&cfg));
    follow_on_a_free_port(&mx, &mut cfg);
    let port = cfg.gateway.metrics_port;
    let r = ask(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("Content-Type: text/plain; version=0.0.4"), "{r}");
    assert!(r.contains("\r\n\r\n# HELP riceguard_build_info "), "{r}");
    assert!(
        r.contains("riceguard_peer_receive_bytes_total{name=\"phone\""),
        "{r}"
    );
    assert!(ask(port, b"GET / HTTP/1.0\r\n\r\n").contains("href=\"/metrics\""));
    for (req, status) in [
        (&b"GET /nope HTTP/1.1\r\n\r\n"[..], "404"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", "405"),
        (b"garbage\r\n\r\n", "400"),
        (b"GET /metrics HTTP/1.1\r\n", "400"), // the client closes before the head ends
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status} ")),
            "{req:?}: {out}"
        );
    }
    let huge = [b'a'; MAX_HEAD + 10];
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _ = s.write_all(&huge);
    let mut out = String::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431 "), "{out}");

    // MAX_CONNS idle clients are held; one more is closed at accept without an answer.
    let idle: Vec<TcpStream> = (0..MAX_CONNS)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut b = [0u8; 64];
    assert!(matches!(extra.read(&mut b), Ok(0) | Err(_)));
    drop(idle);
    // The idle ones go; the endpoint serves again.
    let mut served = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(250));
        if ask(port, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200") {
            served = true;
            break;
        }
    }
    assert!(served, "not served again after the idle clients");

    // Moved by a reload, then stopped.
    let mut moved = cfg.clone();
    follow_on_a_free_port(&mx, &mut moved);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(
        ask(moved.gateway.metrics_port, b"GET /metrics HTTP/1.1\r\n\r\n")
            .starts_with("HTTP/1.1 200")
    );
    moved.gateway.metrics = false;
    mx.follow(&moved);
    assert_eq!(mx.port(), None);
    assert!(TcpStream::connect(("127.0.0.1", moved.gateway.metrics_port)).is_err());
}

/// What a scrape of 20 000 peers costs: collect (each peer's lock taken briefly) and the
/// exposition written whole into a sink. A measurement: printed, never asserted.
#[test]
fn bench_scrape_20000_peers() {
    let cfg = config(20_000);
    let src = sources(&cfg);
    let mut mono = Monotonic::default();
    for round in 0..3 {
        let t0 = Instant::now();
        let (g, peers) = collect(&src, &cfg, &mut mono);
        let t1 = Instant::now();
        let mut counted = Counted(0);
        m::write_exposition(&mut counted, &g, &peers).unwrap();
        let t2 = Instant::now();
        println!(
            "scrape {round}: {} peers, collect {:.1} ms, write {:.1} ms, {} bytes",
            peers.len(),
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
            counted.0
        );
    }
}

struct Counted(usize);
impl Write for Counted {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer past its deadline fails (the answer is cut), never blocks.
#[test]
fn an_answer_past_its_deadline_is_cut() {
    let mut d = Deadline {
        out: Vec::new(),
        until: Instant::now() + Duration::from_secs(60),
    };
    assert_eq!(d.write(b"abc").unwrap(), 3);
    d.until = Instant::now();
    assert_eq!(
        d.write(b"x").unwrap_err().kind(),
        std::io::ErrorKind::TimedOut
    );
    assert_eq!(d.out, b"abc");
}
