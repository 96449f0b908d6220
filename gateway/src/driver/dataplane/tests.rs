//! The data plane's tests over real sockets and TUN queues: batches, sticky sources,
//! the TUN coalescer's writes, and a WireGuard tunnel through the pipeline end to end.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::device::Device;
use crate::core::gso::{CoalesceOptions, VIRTIO_NET_HDR_LEN};
use crate::driver::dataplane::backend::{Backend, Dst};
use crate::driver::dataplane::outbox::{Outbox, Outlets, TunOut, TunOutlet};
use crate::driver::dataplane::pipeline::{datagrams, split_tun_read, Cx, OffloadIo, Pipeline};
use crate::driver::dataplane::poll::engine::PollEngine;
use crate::driver::dataplane::poll::syscall_backend::{SendStats, SyscallBackend};
use crate::driver::dataplane::sticky::{Sticky, StickyTable};
use crate::driver::dataplane::tun_batch::coalesce_options;
use crate::driver::dataplane::tun_batch::TunBatch;
use crate::driver::dataplane::tx_batch::TxBatch;
use crate::driver::dataplane::worker::round;
use crate::sys::cmsg::{PktInfo, RecvMeta};
use crate::sys::tun::Tun;
use crate::sys::tun::TunQueue;
use crate::sys::udp::{UdpOptions, UdpSocket};
use crate::testutil::{in_new_netns, ip};

fn wait_readable(s: &UdpSocket) -> bool {
    let mut pfd = [nix::poll::PollFd::new(
        s.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut pfd, 5000u16).unwrap_or(0) == 1
}

fn recv_all(s: &UdpSocket, want: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while out.iter().sum::<usize>() < want && wait_readable(s) {
        let m = s.recv_gro(&mut buf).expect("recv");
        out.extend(datagrams(&buf, &m).map(<[u8]>::len));
    }
    out
}

/// `n` loopback sockets without GRO (so each datagram is received on its own) and
/// without `SO_REUSEPORT` (which lets the kernel give another test the same port).
fn loopback(n: usize) -> Vec<UdpSocket> {
    let opts = UdpOptions {
        gro: false,
        reuse_port: false,
        ..UdpOptions::default()
    };
    (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind"))
        .collect()
}

#[test]
fn tx_batch_groups_by_destination_and_size() {
    let s = loopback(3);
    let (a, b, c) = (&s[0], &s[1], &s[2]);
    let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
    let mut be = SyscallBackend {
        sock: a,
        tun: None,
        spare: &mut spare,
        pending: &mut pending,
        stats: &mut stats,
    };
    let mut tx = TxBatch::new();
    for _ in 0..5 {
        tx.push(&mut be, Dst::to(b.local_addr()), &[1; 1200]);
    }
    tx.push(&mut be, Dst::to(b.local_addr()), &[2; 300]); // short last: closes the batch
    tx.push(&mut be, Dst::to(b.local_addr()), &[3; 1200]); // starts a new one
    tx.push(&mut be, Dst::to(c.local_addr()), &[4; 80]); // other destination
    tx.flush(&mut be);
    be.submit();
    assert_eq!(
        recv_all(b, 1200 * 6 + 300),
        [1200, 1200, 1200, 1200, 1200, 300, 1200]
    );
    assert_eq!(recv_all(c, 80), [80]);
    assert_eq!(be.dropped(), 0);
    assert_eq!(tx.batched_sends, 1);
    // One buffer per batch of the round (3), given back and reused next round.
    assert_eq!(
        spare.len(),
        3,
        "buffers are reused, not allocated per batch"
    );
}

/// The device writes into batch slots: small datagrams, then a larger one to the same
/// place, then one bigger than the device expected (a handshake where data was due).
/// Each must arrive; the larger one may not join a batch of smaller segments.
#[test]
fn tx_batch_slots_of_mixed_sizes_all_arrive() {
    let s = loopback(2);
    let (a, b) = (&s[0], &s[1]);
    let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
    let mut be = SyscallBackend {
        sock: a,
        tun: None,
        spare: &mut spare,
        pending: &mut pending,
        stats: &mut stats,
    };
    let mut tx = TxBatch::new();
    let dst = Dst::to(b.local_addr());
    for (expected, actual, fill) in [(80, 80, 1u8), (80, 80, 2), (1000, 1000, 3), (80, 148, 4)] {
        let slot = tx
            .slot(&mut be, dst, expected, 148.max(expected))
            .expect("slot");
        slot[..actual].fill(fill);
        tx.commit(&mut be, dst, actual);
    }
    tx.flush(&mut be);
    be.submit();
    assert_eq!(recv_all(b, 80 + 80 + 1000 + 148), [80, 80, 1000, 148]);
    assert_eq!(be.dropped(), 0);
}

/// Without GSO (demoted, or `Offload = mmsg`) a batch still carries many datagrams:
/// one sendmmsg, not one syscall each.
#[test]
fn tx_batch_without_gso_still_batches() {
    let s = loopback(2);
    let (a, b) = (&s[0], &s[1]);
    a.disable_gso();
    let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
    let mut be = SyscallBackend {
        sock: a,
        tun: None,
        spare: &mut spare,
        pending: &mut pending,
        stats: &mut stats,
    };
    let mut tx = TxBatch::new();
    for i in 0..20u8 {
        tx.push(&mut be, Dst::to(b.local_addr()), &[i; 1000]);
    }
    tx.flush(&mut be);
    be.submit();
    assert_eq!(tx.batched_sends, 1, "20 datagrams, one batch");
    assert_eq!(recv_all(b, 20_000), [1000; 20]);
    assert_eq!(be.dropped(), 0);
}

#[test]
fn sticky_sources_learn_answer_and_forget() {
    let peer: SocketAddr = "192.0.2.1:51820".parse().expect("a");
    let local = PktInfo {
        ip: "198.51.100.7".parse().expect("ip"),
        ifindex: 2,
    };
    let table = Arc::new(StickyTable::default());
    let (mut st, mut other) = (Sticky::new(table.clone()), Sticky::new(table.clone()));
    assert_eq!(st.get(peer), None);
    st.learn(peer, None);
    assert_eq!(st.get(peer), None, "no pktinfo, nothing learnt");
    st.learn(peer, Some(local));
    assert_eq!(st.get(peer), Some(local));
    // Another worker sees it from its next round on.
    assert_eq!(other.get(peer), None);
    other.refresh();
    assert_eq!(other.get(peer), Some(local));
    let g = table.generation.load(Ordering::Relaxed);
    other.learn(peer, Some(local));
    assert_eq!(
        table.generation.load(Ordering::Relaxed),
        g,
        "known: no change"
    );
    // Bounded: full, it starts over.
    for i in 0..crate::driver::dataplane::sticky::STICKY_MAX as u16 {
        st.learn(SocketAddr::from(([10, 0, 0, 1], i)), Some(local));
    }
    assert!(table.snapshot().1.len() <= crate::driver::dataplane::sticky::STICKY_MAX);
    st.forget();
    assert_eq!(st.get(peer), None);
    other.refresh();
    assert_eq!(other.get(peer), None, "forgotten for all workers");
    // While answering a datagram, its sender gets the address it used, others the
    // sticky one (none here).
    let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
    let s = loopback(1);
    let mut be = SyscallBackend {
        sock: &s[0],
        tun: None,
        spare: &mut spare,
        pending: &mut pending,
        stats: &mut stats,
    };
    let (mut outbox, mut tx, mut tun_writes) = (
        Outbox::default(),
        TxBatch::new(),
        TunBatch::new(CoalesceOptions::default(), false),
    );
    let io = OffloadIo {
        be: &mut be,
        tcp: None,
        outbox: &mut outbox,
        tx: &mut tx,
        tun_writes: &mut tun_writes,
        sticky: &st,
        reply: Some((peer, local)),
    };
    assert_eq!(io.dst(peer).src, Some(local));
    assert_eq!(io.dst("192.0.2.2:1".parse().expect("a")).src, None);
}

/// Datagrams to one peer from two local addresses never share a batch (one
/// sendmsg has one source).
#[test]
fn tx_batch_splits_on_source_address() {
    let s = loopback(2);
    let (a, b) = (&s[0], &s[1]);
    let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
    let mut be = SyscallBackend {
        sock: a,
        tun: None,
        spare: &mut spare,
        pending: &mut pending,
        stats: &mut stats,
    };
    let lo = |ip: [u8; 4]| {
        Some(PktInfo {
            ip: ip.into(),
            ifindex: 0,
        })
    };
    let mut tx = TxBatch::new();
    for src in [lo([127, 0, 0, 1]), lo([127, 0, 0, 1]), None, None] {
        let to = Dst {
            addr: b.local_addr(),
            src,
        };
        tx.push(&mut be, to, &[1; 500]);
    }
    tx.flush(&mut be);
    assert_eq!(be.pending.len(), 2, "two batches: one per source");
    be.submit();
    assert_eq!(recv_all(b, 2000), [500; 4]);
    assert_eq!(be.dropped(), 0);
}

#[test]
fn datagrams_of_a_gro_buffer() {
    let buf = [0u8; 2500];
    let m = RecvMeta {
        len: 2500,
        segment_size: 1000,
        ..RecvMeta::default()
    };
    let lens: Vec<usize> = datagrams(&buf, &m).map(<[u8]>::len).collect();
    assert_eq!(lens, [1000, 1000, 500]);
    let bogus = RecvMeta {
        len: 9000,
        segment_size: 0,
        ..m
    };
    assert_eq!(
        datagrams(&buf, &bogus).map(<[u8]>::len).sum::<usize>(),
        2500
    );
}

/// An IPv4/UDP packet 10.81.0.2:7 -> 10.81.0.1:port with valid checksums.
fn udp4(port: u16, payload: &[u8]) -> Vec<u8> {
    udp4_from([10, 81, 0, 2], port, payload)
}

fn udp4_from(src: [u8; 4], port: u16, payload: &[u8]) -> Vec<u8> {
    crate::testutil::ipv4_udp(src, 7, [10, 81, 0, 1], port, payload)
}

#[test]
#[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
fn tun_batch_writes_coalesced_packets_the_kernel_accepts() {
    in_new_netns(|| {
        let tun = Tun::create("rgob0", 1, true).expect("tun");
        ip(&["link", "set", "lo", "up"]);
        ip(&["addr", "add", "10.81.0.1/24", "dev", "rgob0"]);
        ip(&["link", "set", "rgob0", "up"]);
        let opts = UdpOptions {
            gro: false,
            ..UdpOptions::default()
        };
        let s = UdpSocket::bind("10.81.0.1:5000".parse().expect("addr"), &opts).expect("bind");
        let q = tun.queue(0).expect("q");
        let co = CoalesceOptions {
            tcp: tun.offload().tso(),
            udp: tun.offload().uso(),
        };
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            pending: &mut pending,
            sock: &s,
            tun: Some(q),
            spare: &mut spare,
            stats: &mut stats,
        };
        let mut rx = TunBatch::new(co, true);
        for i in 0..10u8 {
            rx.push(&mut be, &udp4(5000, &[i; 1000]));
        }
        rx.push(&mut be, &udp4(5000, &[10; 400]));
        rx.flush(&mut be);
        be.submit();
        assert_eq!(rx.write_errors, 0);
        assert_eq!(be.stats.tun_errors, 0);
        assert_eq!(
            rx.coalesced,
            u64::from(tun.offload().uso()),
            "one USO super-packet"
        );
        let got = recv_all(&s, 10_400);
        assert_eq!(got.len(), 11, "{got:?}");
        assert_eq!(got.iter().sum::<usize>(), 10_400);

        // Without vnet_hdr the packets go straight through.
        let plain = Tun::create("rgob1", 1, false).expect("tun");
        ip(&["addr", "add", "10.81.1.1/24", "dev", "rgob1"]);
        ip(&["link", "set", "rgob1", "up"]);
        let mut rx = TunBatch::new(CoalesceOptions::default(), false);
        let p = udp4_from([10, 81, 1, 2], 5000, &[1; 100]);
        let (mut spare, mut pending, mut stats) = (Vec::new(), Vec::new(), SendStats::default());
        let mut be = SyscallBackend {
            pending: &mut pending,
            sock: &s,
            tun: Some(plain.queue(0).expect("q")),
            spare: &mut spare,
            stats: &mut stats,
        };
        rx.push(&mut be, &p);
        be.submit();
        assert_eq!(recv_all(&s, 100), [100]);
    });
}

fn device(
    own: crate::core::key::Key,
    peer: crate::core::key::Key,
    allowed: &str,
    ep: SocketAddr,
) -> Device {
    crate::testutil::one_peer_device(own, peer, allowed, ep, None)
}

/// Two WireGuard devices, each behind a vnet_hdr TUN in its own namespace, joined
/// over loopback by `OffloadWorker`s: a TCP transfer and a UDP burst from A's
/// namespace to B's must arrive intact, with TSO super-packets split before
/// encryption, GSO sends between the devices and coalesced writes into B's TUN.
#[test]
#[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
fn wireguard_tunnel_with_offloads_end_to_end() {
    tunnel(true, 4 << 20);
}

/// The same without any offload (plain TUN, no GSO/GRO): the fallback path.
#[test]
#[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
fn wireguard_tunnel_without_offloads_end_to_end() {
    tunnel(false, 1 << 20);
}

/// Throughput of both paths (one thread drives both devices, so only the ratio
/// means anything): `cargo test --release -p riceguard --lib bench_tunnel -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_tunnel_offload_vs_plain() {
    for offload in [false, true] {
        let t = tunnel(offload, 256 << 20);
        eprintln!(
            "offload={offload}: 256 MiB in {:.2?} = {:.2} Gbit/s",
            t,
            (256u64 << 23) as f64 / t.as_secs_f64() / 1e9
        );
    }
}

/// Run one transfer through the tunnel; returns how long the TCP part took.
fn tunnel(offload: bool, bytes: usize) -> std::time::Duration {
    use crate::core::key::Key;
    use std::io::{Read, Write};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let pattern = |i: usize| (i % 253) as u8;
    let ns = |name: &'static str, addr: &'static str, route: &'static str| {
        move || {
            let tun = Tun::create(name, 1, offload).expect("tun");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", addr, "dev", name]);
            ip(&["link", "set", name, "up"]);
            ip(&["route", "add", route, "dev", name]);
            tun
        }
    };

    let (tx_b, rx_b) = mpsc::channel();
    let setup_b = ns("rgwgb0", "10.82.1.1/24", "10.82.0.0/24");
    let server = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let tun = setup_b();
        let l = std::net::TcpListener::bind("10.82.1.1:6001").expect("listen");
        let u = UdpSocket::bind(
            "10.82.1.1:6002".parse().expect("addr"),
            &UdpOptions {
                gro: false,
                ..UdpOptions::default()
            },
        )
        .expect("udp");
        tx_b.send(tun).expect("send");
        let (mut c, _) = l.accept().expect("accept");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let (mut got, mut ok) = (0usize, true);
        let mut buf = vec![0u8; 65536];
        loop {
            let n = c.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            ok &= buf[..n]
                .iter()
                .enumerate()
                .all(|(k, b)| *b == pattern(got + k));
            got += n;
        }
        (got, ok, recv_all(&u, 12_000))
    });
    let tun_b: Tun = rx_b.recv().expect("tun b");

    let (tx_a, rx_a) = mpsc::channel();
    let setup_a = ns("rgwga0", "10.82.0.1/24", "10.82.1.0/24");
    let client = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let tun = setup_a();
        let u = UdpSocket::bind("10.82.0.1:0".parse().expect("addr"), &UdpOptions::default())
            .expect("udp");
        tx_a.send(tun).expect("send");
        let dst = "10.82.1.1:6001".parse().expect("addr");
        let mut s =
            std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(10)).expect("connect");
        let data: Vec<u8> = (0..bytes).map(pattern).collect();
        s.write_all(&data).expect("write");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        u.send_segmented(
            "10.82.1.1:6002".parse().expect("addr"),
            &[7u8; 12_000],
            1200,
        )
        .expect("udp burst");
    });
    let tun_a: Tun = rx_a.recv().expect("tun a");

    // The WireGuard side: both devices' sockets on loopback in this namespace.
    let opts = UdpOptions {
        gso: offload,
        gro: offload,
        reuse_port: false,
        ..UdpOptions::default()
    };
    let sock_a = UdpSocket::bind("127.0.0.1:0".parse().expect("a"), &opts).expect("a");
    let sock_b = UdpSocket::bind("127.0.0.1:0".parse().expect("b"), &opts).expect("b");
    let (ka, kb) = (
        Key::generate_private(&mut rand_core::OsRng),
        Key::generate_private(&mut rand_core::OsRng),
    );
    let dev_a = device(ka, kb, "10.82.1.0/24", sock_b.local_addr());
    let dev_b = device(kb, ka, "10.82.0.0/24", sock_a.local_addr());
    let (qa, qb) = (tun_a.queue(0).expect("qa"), tun_b.queue(0).expect("qb"));
    // Each side is the worker loop's poll engine and pipeline, driven by hand here
    // (one thread for both devices): the round is the loop's own `worker::round`.
    let (sock_a, sock_b) = (std::sync::Arc::new(sock_a), std::sync::Arc::new(sock_b));
    let dup = |q: &TunQueue| q.try_clone().expect("dup queue");
    let mut ea = PollEngine::new(dup(qa), sock_a.clone());
    let mut eb = PollEngine::new(dup(qb), sock_b.clone());
    let mut pa: Pipeline<Vec<u8>> = Pipeline::new(tun_a.offload(), offload, Arc::default());
    let mut pb: Pipeline<Vec<u8>> = Pipeline::new(tun_b.offload(), offload, Arc::default());
    let start = Instant::now();
    let (mut ca, mut cb) = (dev_a.cache(), dev_b.cache());

    let deadline = Instant::now() + Duration::from_secs(if bytes > 64 << 20 { 600 } else { 60 });
    while !server.is_finished() && Instant::now() < deadline {
        let mut pfd = [
            nix::poll::PollFd::new(qa.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(sock_a.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(qb.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(sock_b.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        let _ = nix::poll::poll(&mut pfd, 20u16);
        let cxa = Cx {
            dev: &dev_a,
            table: ca.get(&dev_a),
            tcp: None,
        };
        let cxb = Cx {
            dev: &dev_b,
            table: cb.get(&dev_b),
            tcp: None,
        };
        ea.assume_ready();
        assert!(round(&mut ea, &mut pa, &cxa).tun_gone.is_none(), "tun a");
        eb.assume_ready();
        assert!(round(&mut eb, &mut pb, &cxb).tun_gone.is_none(), "tun b");
    }
    let (got, ok, burst) = server.join().expect("server");
    let took = start.elapsed();
    client.join().expect("client");
    assert_eq!(got, bytes, "every TCP byte through the tunnel");
    assert!(ok, "TCP bytes intact");
    assert_eq!(burst, vec![1200; 10], "UDP burst as 10 datagrams");
    assert_eq!(pa.malformed_reads + pb.malformed_reads, 0);
    assert_eq!(
        ea.stats.dropped + eb.stats.dropped + pb.tun_writes.write_errors,
        0
    );
    if offload && tun_a.offload().tso() && sock_a.gso_enabled() {
        assert!(pa.tx.batched_sends > 0, "A sent GSO batches");
        assert!(
            pb.tun_writes.coalesced > 0,
            "B wrote coalesced super-packets"
        );
    }
    eprintln!(
        "A: {} GSO sends; B: {} coalesced TUN writes; B acks: {} GSO sends",
        pa.tx.batched_sends, pb.tun_writes.coalesced, pb.tx.batched_sends
    );
    took
}

#[test]
fn split_tun_read_plain_and_malformed() {
    let mut p = udp4(1, &[1; 10]);
    let n = p.len();
    p.resize(n + 16, 0);
    let mut seg = vec![0u8; 65535];
    let mut seen = Vec::new();
    assert_eq!(
        split_tun_read(&mut p, n, false, &mut seg, |x, len| seen
            .push((len, x.len()))),
        Ok(1)
    );
    let mut v = vec![0u8; VIRTIO_NET_HDR_LEN];
    v.extend_from_slice(&p[..n]);
    let vn = v.len();
    v.resize(vn + 16, 0);
    let at = v.as_ptr() as usize + VIRTIO_NET_HDR_LEN;
    let mut in_place = false;
    assert_eq!(
        split_tun_read(&mut v, vn, true, &mut seg, |x, len| {
            in_place = x.as_ptr() as usize == at;
            seen.push((len, x.len()))
        }),
        Ok(1)
    );
    // The packet, and the room after it for padding; a plain packet behind a
    // virtio_net_hdr is handed on where it was read (no copy).
    assert_eq!(seen, [(38, 54), (38, 54)]);
    assert!(in_place);
    assert!(split_tun_read(&mut v, 5, true, &mut seg, |_, _| {}).is_err());
}

#[test]
#[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
fn outbox_tun_writes_go_through_the_coalescer() {
    // The TCP thread's path: what the device decrypted from TCP-carried messages is
    // recorded, then written coalesced like a worker's (it was one write per packet).
    in_new_netns(|| {
        let tun = Tun::create("rgob2", 1, true).expect("tun");
        ip(&["link", "set", "lo", "up"]);
        ip(&["addr", "add", "10.81.0.1/24", "dev", "rgob2"]);
        ip(&["link", "set", "rgob2", "up"]);
        let opts = UdpOptions {
            gro: false,
            ..UdpOptions::default()
        };
        let s = UdpSocket::bind("10.81.0.1:5001".parse().expect("addr"), &opts).expect("bind");
        let mut out = TunOutlet::new(coalesce_options(tun.offload(), true), true);
        let mut ob = Outbox::default();
        for i in 0..8u8 {
            crate::core::device::Io::tun_write(&mut ob, &udp4(5001, &[i; 1000]));
        }
        crate::core::device::Io::tun_write(&mut ob, &udp4(5001, &[8; 300]));
        ob.flush(&mut Outlets {
            tun: Some(TunOut {
                queue: tun.queue(0).expect("q"),
                out: &mut out,
            }),
            ..Outlets::default()
        });
        assert!(ob.is_empty());
        assert_eq!((ob.unroutable, out.write_errors), (0, 0));
        assert_eq!(
            out.coalesced(),
            u64::from(tun.offload().uso()),
            "one USO super-packet"
        );
        let got = recv_all(&s, 8_300);
        assert_eq!(got.len(), 9, "{got:?}");
        assert_eq!(got.iter().sum::<usize>(), 8_300);

        // Without vnet_hdr each packet is written as it is.
        let plain = Tun::create("rgob3", 1, false).expect("tun");
        ip(&["addr", "add", "10.81.1.1/24", "dev", "rgob3"]);
        ip(&["link", "set", "rgob3", "up"]);
        let mut out = TunOutlet::new(coalesce_options(plain.offload(), false), false);
        for i in 0..3u8 {
            crate::core::device::Io::tun_write(
                &mut ob,
                &udp4_from([10, 81, 1, 2], 5001, &[i; 100]),
            );
        }
        ob.flush(&mut Outlets {
            tun: Some(TunOut {
                queue: plain.queue(0).expect("q"),
                out: &mut out,
            }),
            ..Outlets::default()
        });
        assert_eq!((out.write_errors, out.coalesced()), (0, 0));
        assert_eq!(recv_all(&s, 300).len(), 3);
    });
}
