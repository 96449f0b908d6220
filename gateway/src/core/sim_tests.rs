//! Two devices talking through an in-memory network with simulated time (boringtun's
//! `mock-instant` clock, advanced by hand): handshake, data both ways, rekey, keepalive,
//! roaming, a lost handshake retried, and hostile input.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use mock_instant::MockClock;

use crate::core::config::{Config, Endpoint, PeerConfig};
use crate::core::device::{Device, PeerAddr, SCRATCH_SIZE};
use crate::core::key::Key;

use crate::testutil::Wire;

struct Node {
    dev: Device,
    addr: SocketAddr,
    wire: Wire,
    key: Key,
}

fn ipv4_packet(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p[20..].copy_from_slice(payload);
    p
}

fn msg_type(d: &[u8]) -> u8 {
    d[0]
}

fn pair(keepalive: Option<u16>) -> (Node, Node) {
    let ka = Key::generate_private();
    let kb = Key::generate_private();
    let a_addr: SocketAddr = "192.0.2.1:51820".parse().unwrap();
    let b_addr: SocketAddr = "192.0.2.2:51820".parse().unwrap();
    let mk = |own: Key, peer: Key, inner: &str, ep: SocketAddr, keepalive| {
        crate::testutil::one_peer_device(own, peer, inner, ep, keepalive)
    };
    let a = Node {
        dev: mk(ka, kb, "10.0.0.2/32", b_addr, keepalive),
        addr: a_addr,
        wire: Wire::default(),
        key: ka,
    };
    let b = Node {
        dev: mk(kb, ka, "10.0.0.1/32", a_addr, None),
        addr: b_addr,
        wire: Wire::default(),
        key: kb,
    };
    (a, b)
}

/// Deliver everything `from` has queued for `to`'s address; returns how many.
fn deliver(from: &mut Node, to: &mut Node, src_addr: SocketAddr) -> usize {
    let msgs: Vec<_> = from.wire.sent.drain(..).collect();
    let mut n = 0;
    let mut scratch = vec![0u8; SCRATCH_SIZE];
    for (dst, d) in msgs {
        if dst.socket_addr() == to.addr {
            let t = to.dev.snapshot();
            to.dev
                .handle_datagram(&t, PeerAddr::Udp(src_addr), &d, &mut scratch, &mut to.wire);
            n += 1;
        }
    }
    n
}

fn pump(a: &mut Node, b: &mut Node) {
    for _ in 0..10 {
        let (aa, ba) = (a.addr, b.addr);
        let x = deliver(a, b, aa);
        let y = deliver(b, a, ba);
        if x + y == 0 {
            break;
        }
    }
}

fn send_tun(n: &mut Node, pkt: &[u8]) {
    let mut scratch = vec![0u8; SCRATCH_SIZE];
    let t = n.dev.snapshot();
    n.dev.handle_tun_packet(&t, pkt, &mut scratch, &mut n.wire);
}

fn timers(n: &mut Node) {
    let mut scratch = vec![0u8; SCRATCH_SIZE];
    n.dev
        .update_timers(MockClock::time(), &mut scratch, &mut n.wire);
}

#[test]
fn handshake_and_data_both_ways() {
    let (mut a, mut b) = pair(None);
    let p1 = ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"hello b");
    send_tun(&mut a, &p1);
    assert_eq!(a.wire.sent.len(), 1);
    assert_eq!(
        msg_type(&a.wire.sent[0].1),
        1,
        "first packet triggers a handshake initiation"
    );
    pump(&mut a, &mut b);
    assert_eq!(
        b.wire.tun,
        vec![p1.clone()],
        "queued packet delivered after the handshake"
    );
    let p2 = ipv4_packet([10, 0, 0, 2], [10, 0, 0, 1], b"hello a");
    send_tun(&mut b, &p2);
    pump(&mut a, &mut b);
    assert_eq!(a.wire.tun, vec![p2]);
    let sa = a.dev.peer_stats();
    assert!(sa[0].last_handshake.is_some());
    assert!(sa[0].tx_bytes > 0 && sa[0].rx_bytes > 0);
}

#[test]
fn rekey_after_rekey_after_time() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    pump(&mut a, &mut b);
    MockClock::advance(Duration::from_secs(121));
    timers(&mut a); // drivers tick timers several times a second; this one moves boringtun's clock
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"y"));
    timers(&mut a);
    let types: Vec<u8> = a.wire.sent.iter().map(|(_, d)| msg_type(d)).collect();
    assert!(
        types.contains(&1),
        "a new handshake starts after REKEY_AFTER_TIME, got {types:?}"
    );
    pump(&mut a, &mut b);
    b.wire.tun.clear();
    let p = ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"after rekey");
    send_tun(&mut a, &p);
    pump(&mut a, &mut b);
    assert_eq!(b.wire.tun, vec![p]);
}

#[test]
fn persistent_keepalive_is_sent() {
    let (mut a, mut b) = pair(Some(25));
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    pump(&mut a, &mut b);
    a.wire.sent.clear();
    MockClock::advance(Duration::from_secs(26));
    timers(&mut a);
    let keepalives = a
        .wire
        .sent
        .iter()
        .filter(|(_, d)| msg_type(d) == 4 && d.len() == 32)
        .count();
    assert!(
        keepalives >= 1,
        "expected a 32-byte keepalive after 26 s, got {:?}",
        a.wire.sent.len()
    );
    // The keepalive decrypts to nothing on the TUN.
    b.wire.tun.clear();
    pump(&mut a, &mut b);
    assert!(b.wire.tun.is_empty());
}

#[test]
fn roaming_moves_the_endpoint() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    pump(&mut a, &mut b);
    // A moves to a new address and sends from there.
    a.addr = "198.51.100.7:40000".parse().unwrap();
    send_tun(
        &mut a,
        &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"from new place"),
    );
    let new = a.addr;
    deliver(&mut a, &mut b, new);
    let ep = b.dev.peer_stats()[0].endpoint;
    assert_eq!(ep, Some(PeerAddr::Udp(new)));
    // B's reply goes to the new address.
    send_tun(&mut b, &ipv4_packet([10, 0, 0, 2], [10, 0, 0, 1], b"reply"));
    assert_eq!(b.wire.sent.last().unwrap().0, PeerAddr::Udp(new));
}

#[test]
fn lost_handshake_is_retried() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    a.wire.sent.clear(); // the initiation is lost
    MockClock::advance(Duration::from_secs(6));
    timers(&mut a);
    assert!(
        a.wire.sent.iter().any(|(_, d)| msg_type(d) == 1),
        "retransmitted after REKEY_TIMEOUT"
    );
    pump(&mut a, &mut b);
    assert_eq!(
        b.wire.tun.len(),
        1,
        "the queued packet arrives after the retried handshake"
    );
}

#[test]
fn hostile_datagrams_are_dropped_and_counted() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    let init = a.wire.sent[0].1.clone();
    pump(&mut a, &mut b);
    let mut scratch = vec![0u8; SCRATCH_SIZE];
    let t = b.dev.snapshot();
    let from = PeerAddr::Udp(a.addr);
    // Garbage, truncated, and every prefix of a real handshake.
    for len in 0..init.len() {
        b.dev
            .handle_datagram(&t, from, &init[..len], &mut scratch, &mut b.wire);
    }
    let mut rng = 0x1234_5678_u64;
    for _ in 0..2000 {
        let mut buf = vec![0u8; (rng % 200) as usize];
        for x in buf.iter_mut() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            *x = rng as u8;
        }
        if let Some(f) = buf.first_mut() {
            *f = (rng % 5) as u8; // hit every message type
        }
        b.dev
            .handle_datagram(&t, from, &buf, &mut scratch, &mut b.wire);
    }
    // Replay of a data packet is rejected.
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"once"));
    let data = a.wire.sent.last().unwrap().1.clone();
    b.wire.tun.clear();
    b.dev
        .handle_datagram(&t, from, &data, &mut scratch, &mut b.wire);
    b.dev
        .handle_datagram(&t, from, &data, &mut scratch, &mut b.wire);
    assert_eq!(
        b.wire.tun.len(),
        1,
        "a replayed packet is not delivered twice"
    );
    // A handshake from a key B doesn't know.
    let (mut stranger, _) = pair(None);
    stranger.key = Key::generate_private();
    let mut c = Config::default();
    c.interface.private_key = Some(stranger.key);
    c.peers.push(PeerConfig {
        public_key: b.key.public(),
        preshared_key: None,
        allowed_ips: vec!["10.0.0.2/32".parse().unwrap()],
        endpoint: Some(Endpoint::Addr(b.addr)),
        persistent_keepalive: None,
        tcp_port: None,
    });
    stranger.dev.reconfigure(&c).unwrap();
    send_tun(
        &mut stranger,
        &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"),
    );
    let sinit = stranger.wire.sent.last().unwrap().1.clone();
    b.dev.handle_datagram(
        &t,
        PeerAddr::Udp("203.0.113.9:1".parse().unwrap()),
        &sinit,
        &mut scratch,
        &mut b.wire,
    );
    let drops: u64 = b.dev.drops.snapshot().iter().map(|x| x.1).sum();
    assert!(
        drops > 100,
        "drops were counted: {:?}",
        b.dev.drops.snapshot()
    );
    assert!(
        b.dev
            .drops
            .unknown_peer
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // B still talks to A afterwards.
    b.wire.tun.clear();
    let p = ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"still fine");
    send_tun(&mut a, &p);
    pump(&mut a, &mut b);
    assert_eq!(b.wire.tun, vec![p]);
}

#[test]
fn spoofed_inner_source_is_dropped() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    pump(&mut a, &mut b);
    b.wire.tun.clear();
    // A sends a packet claiming a source outside its allowed IPs (10.0.0.1/32 on B).
    send_tun(&mut a, &ipv4_packet([10, 9, 9, 9], [10, 0, 0, 2], b"spoof"));
    pump(&mut a, &mut b);
    assert!(b.wire.tun.is_empty());
    assert_eq!(
        b.dev
            .drops
            .not_allowed_src
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn reconfigure_keeps_sessions_of_unchanged_peers() {
    let (mut a, mut b) = pair(None);
    send_tun(&mut a, &ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"x"));
    pump(&mut a, &mut b);
    // Add an unrelated peer on B: A's session must keep working without a handshake.
    let mut c = b.dev.config();
    c.peers.push(PeerConfig {
        public_key: Key::generate_private().public(),
        preshared_key: None,
        allowed_ips: vec!["10.0.0.3/32".parse().unwrap()],
        endpoint: None,
        persistent_keepalive: None,
        tcp_port: None,
    });
    b.dev.reconfigure(&c).unwrap();
    b.wire.tun.clear();
    let p = ipv4_packet([10, 0, 0, 1], [10, 0, 0, 2], b"same session");
    send_tun(&mut a, &p);
    assert_eq!(msg_type(&a.wire.sent.last().unwrap().1), 4);
    pump(&mut a, &mut b);
    assert_eq!(b.wire.tun, vec![p]);
    assert!(
        !b.wire.sent.iter().any(|(_, d)| msg_type(d) == 2),
        "no new handshake was needed"
    );
    let _ = IpAddr::V4(Ipv4Addr::LOCALHOST);
}
