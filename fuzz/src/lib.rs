//! The checks behind the fuzz targets, shared by the libFuzzer binaries in
//! `fuzz_targets/` and by `cargo test` here, which runs them over the seed files in
//! `seeds/` and over seeded random mutations of them (the fallback where cargo-fuzz
//! cannot run: same checks, no coverage guidance, no sanitizers).
//!
//! Each check panics only when an invariant breaks; any input whatsoever is fine.

use std::collections::HashMap;
use std::io::Cursor;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use riceguard::core::allowed_ips::AllowedIps;
use riceguard::core::config::{Config, Endpoint, PeerConfig};
use riceguard::core::ini;
use riceguard::core::key::Key;
use riceguard::core::net::Cidr;
use riceguard::core::uapi::{self, Request, UapiError};

/// `ini::parse` never panics; what it accepts is emitted and read back unchanged, and
/// validation of it never panics. Its warnings name lines of the input, and a file the
/// appliance writes has none. The saved form (`emit_compat`, schema-2 settings on `#+`
/// lines) reads back unchanged too, and as firmware of schema 1 reads it, it is the
/// configuration without them (`schema1_view`). Reading as schema 1 never panics.
pub fn check_ini(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = ini::parse_as_schema1("fuzz.conf", &text);
    let Ok((cfg, warnings)) = ini::parse_with_warnings("fuzz.conf", &text) else {
        return;
    };
    assert_eq!(ini::parse("fuzz.conf", &text).as_ref(), Ok(&cfg));
    let lines = text.split('\n').count();
    for w in &warnings {
        assert!(w.line >= 1 && w.line <= lines, "warning off the file: {w}");
    }
    let _ = cfg.validate();
    let out = ini::emit(&cfg);
    match ini::parse_with_warnings("emitted.conf", &out) {
        Ok((back, w)) => {
            assert_eq!(
                back, cfg,
                "emit/parse round trip changed the config:\n{out}"
            );
            assert!(w.is_empty(), "the emitted file has warnings: {w:?}\n{out}");
        }
        Err(e) => panic!("emitted config does not parse: {e}\n{out}"),
    }
    assert_eq!(ini::emit(&cfg), out, "emit is not deterministic");
    let saved = ini::emit_compat(&cfg);
    match ini::parse("saved.conf", &saved) {
        Ok(back) => assert_eq!(back, cfg, "emit_compat/parse changed the config:\n{saved}"),
        Err(e) => panic!("the saved form does not parse: {e}\n{saved}"),
    }
    match ini::parse_as_schema1("saved.conf", &saved) {
        Ok(old) => assert_eq!(old, ini::schema1_view(&cfg), "schema 1 reads:\n{saved}"),
        Err(e) => panic!("schema-1 firmware would refuse the saved form: {e}\n{saved}"),
    }
}

fn key(b: u8) -> Key {
    Key([b; 32])
}

/// The fixed configuration requests are applied to.
pub fn uapi_base() -> Config {
    let mut c = Config::default();
    c.interface.private_key = Some(key(0x40));
    c.interface.listen_port = Some(51820);
    let peer = |k: u8, ips: &[&str], ep: Option<&str>| PeerConfig {
        public_key: key(k),
        preshared_key: None,
        allowed_ips: ips.iter().filter_map(|s| s.parse().ok()).collect(),
        endpoint: ep.and_then(|e| e.parse().ok()).map(Endpoint::Addr),
        persistent_keepalive: Some(25),
        tcp_port: None,
        name: None,
        masquerade: true,
        enabled: true,
        access: None,
    };
    c.peers = vec![
        peer(1, &["10.0.0.1/32", "fd00::1/128"], Some("192.0.2.1:51820")),
        peer(2, &["10.0.0.2/32", "10.2.0.0/16"], None),
        peer(3, &["0.0.0.0/0"], Some("[2001:db8::3]:443")),
    ];
    c
}

type VisiblePeer = (Key, Option<Key>, Option<Endpoint>, Option<u16>, Vec<Cidr>);

fn visible(c: &Config) -> (Option<Key>, Option<u16>, Option<u32>, Vec<VisiblePeer>) {
    let mut peers: Vec<VisiblePeer> = c
        .peers
        .iter()
        .map(|p| {
            (
                p.public_key,
                p.preshared_key,
                p.endpoint.clone(),
                p.persistent_keepalive,
                p.allowed_ips.clone(),
            )
        })
        .collect();
    peers.sort_by_key(|p| p.0 .0);
    (
        c.interface.private_key,
        c.interface.listen_port,
        c.interface.fwmark,
        peers,
    )
}

/// Requests read from arbitrary bytes never panic; a set request survives
/// emit/read; applying it to the base config never panics; whatever comes out can be
/// reached again from the base by `set_from_diff`, and its `get` answer reads back.
pub fn check_uapi(data: &[u8]) {
    let _ = uapi::parse_get_response(&String::from_utf8_lossy(data));
    let base = uapi_base();
    let mut cur = base.clone();
    let mut r = Cursor::new(data);
    for _ in 0..64 {
        let req = match uapi::read_request(&mut r) {
            Ok(Request::Set(req)) => req,
            Ok(Request::Get) => continue,
            // The driver answers these and goes on reading.
            Err(UapiError::Invalid(_) | UapiError::Protocol(_)) => continue,
            // The driver closes the connection on anything else.
            Err(_) => break,
        };
        let wire = uapi::emit_set(&req);
        match uapi::read_request(&mut Cursor::new(wire.as_bytes())) {
            Ok(Request::Set(back)) => {
                assert_eq!(back, req, "set request changed on the wire:\n{wire}")
            }
            other => panic!("emitted set request does not read back: {other:?}\n{wire}"),
        }
        let Ok(next) = uapi::apply_set(&cur, &req) else {
            continue;
        };
        // apply_set keeps the invariants the rest of the system relies on.
        if let Err(e) = next.validate_consistency() {
            panic!("apply_set produced an inconsistent config: {e}");
        }
        let diff = uapi::set_from_diff(&base, &next);
        let again = uapi::apply_set(&base, &diff).expect("diff applies");
        assert_eq!(
            visible(&again),
            visible(&next),
            "set_from_diff did not reach the target:\n{}",
            uapi::emit_set(&diff)
        );

        let status = uapi::DeviceStatus {
            private_key: next.interface.private_key,
            listen_port: next.interface.listen_port.unwrap_or(0),
            fwmark: next.interface.fwmark,
            peers: next
                .peers
                .iter()
                .map(|p| {
                    let mut s = uapi::PeerStatus::new(p.public_key);
                    s.preshared_key = p.preshared_key;
                    s.endpoint = match &p.endpoint {
                        Some(Endpoint::Addr(a)) => Some(*a),
                        _ => None,
                    };
                    s.persistent_keepalive = p.persistent_keepalive;
                    s.allowed_ips = p.allowed_ips.clone();
                    s
                })
                .collect(),
        };
        let got = uapi::emit_get(&status);
        assert_eq!(
            uapi::parse_get_response(&got),
            Ok(status),
            "get answer does not read back:\n{got}"
        );
        cur = next;
    }
}

mod coalesce;
mod datagram;
mod sys;

/// Byte reader for the op stream; reads zeros past the end.
pub(crate) struct Bytes<'a>(pub(crate) &'a [u8]);
impl<'a> Bytes<'a> {
    /// Up to `n` bytes (fewer at the end of the input).
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn addr(&mut self, v4: bool) -> IpAddr {
        // Few distinct high bytes, so prefixes nest and collide often.
        if v4 {
            let mut a = [0u8; 4];
            a[0] = self.u8() & 0x3;
            for b in &mut a[1..] {
                *b = self.u8();
            }
            IpAddr::V4(Ipv4Addr::from(a))
        } else {
            let mut a = [0u8; 16];
            a[0] = 0xfd;
            a[1] = self.u8() & 0x3;
            for b in &mut a[2..6] {
                *b = self.u8();
            }
            a[15] = self.u8();
            IpAddr::V6(Ipv6Addr::from(a))
        }
    }
}

/// A sequence of table operations decoded from the bytes gives the same results as a
/// brute-force reference.
pub fn check_allowed_ips(data: &[u8]) {
    let mut b = Bytes(data);
    let mut t: AllowedIps<u8> = AllowedIps::new();
    let mut r: HashMap<Cidr, u8> = HashMap::new();
    let mut ops = 0;
    while !b.0.is_empty() && ops < 4096 {
        ops += 1;
        let op = b.u8();
        let v4 = op & 0x80 == 0;
        let addr = b.addr(v4);
        let max = if v4 { 32 } else { 128 };
        let plen = b.u8() % (max + 1);
        // Cidr::new only fails for lengths over the maximum, excluded above.
        let cidr = Cidr::new(addr, plen).expect("length in range");
        let net = cidr.network();
        match op & 0x7 {
            0..=2 => {
                let v = b.u8();
                assert_eq!(t.insert(cidr, v), r.insert(net, v), "insert {cidr}");
            }
            3 | 4 => assert_eq!(t.remove(cidr), r.remove(&net), "remove {cidr}"),
            5 => assert_eq!(t.get(cidr).copied(), r.get(&net).copied(), "get {cidr}"),
            6 => {
                let m = b.u8() | 1;
                t.retain(|_, v| v % m != 0);
                r.retain(|_, v| *v % m != 0);
            }
            _ => {
                if b.u8() == 0xff {
                    t.clear();
                    r.clear();
                }
            }
        }
        assert_eq!(t.len(), r.len());
        let want = r
            .iter()
            .filter(|(c, _)| c.contains(addr))
            .max_by_key(|(c, _)| c.prefix)
            .map(|(_, v)| *v);
        assert_eq!(t.lookup(addr).copied(), want, "lookup {addr}");
    }
    let mut got: Vec<(String, u8)> = t.iter().map(|(c, v)| (c.to_string(), *v)).collect();
    let mut want: Vec<(String, u8)> = r.iter().map(|(c, v)| (c.to_string(), *v)).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

/// Console input (serial bytes) through the line editor, parser and candidate edits.
pub fn check_console_line(data: &[u8]) {
    riceguard::console::fuzz_check_input(data);
}

/// A scripted exchange between the gateway and a real in-memory peer, with replays,
/// mutations, forgeries and floods: nothing that does not authenticate moves a peer
/// (endpoint, rx counters, transport events) or reaches the TUN (see `datagram.rs`).
pub fn check_datagram(data: &[u8]) {
    datagram::check(data);
}

/// Decrypted packets into the GRO coalescer: the super-packets re-split to exactly the
/// packets merged (see `coalesce.rs`).
pub fn check_coalesce(data: &[u8]) {
    coalesce::check(data);
}

/// Received control messages and metadata (`sys::udp`), checked against a reference
/// cmsg walk (see `sys.rs`).
pub fn check_udp_cmsg(data: &[u8]) {
    sys::check_cmsg(data);
}

/// An io_uring multishot-recvmsg buffer (`sys::uring`) and the datagrams cut from it.
pub fn check_uring_recv(data: &[u8]) {
    sys::check_uring_recv(data);
}

/// The TCP-fallback stream decoder, fed in chunks whose sizes come from the input.
pub fn check_framing(data: &[u8]) {
    use riceguard::core::framing::{check_message, FrameDecoder, MAX_MESSAGE_LEN};
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
    for chunk in rest.chunks(step) {
        let r = dec.feed(chunk, |m| {
            assert!(
                check_message(m, MAX_MESSAGE_LEN).is_ok(),
                "decoder yielded an invalid message"
            );
        });
        if r.is_err() {
            break;
        }
    }
}

/// A TUN read with a `virtio_net_hdr`: split into segments, each a sane IP packet size.
pub fn check_gso_split(data: &[u8]) {
    use riceguard::core::gso::Splitter;
    let Ok(mut sp) = Splitter::new(data) else {
        return;
    };
    let mut out = vec![0u8; 65536];
    let mut n = 0;
    while let Some(r) = sp.next_into(&mut out) {
        match r {
            Ok(len) => assert!(len <= out.len()),
            Err(_) => break,
        }
        n += 1;
        assert!(n <= 65536, "splitter does not terminate");
    }
}

/// A DHCP reply as a server would send it (for bringing the client into a state).
fn dhcp_reply(xid: &[u8], kind: u8, lease: u32) -> Vec<u8> {
    let mut m = vec![0u8; 240];
    m[..4].copy_from_slice(&[2, 1, 6, 0]);
    m[4..8].copy_from_slice(xid);
    m[16..20].copy_from_slice(&[192, 168, 77, 2]);
    m[28..34].copy_from_slice(&DHCP_MAC);
    m[236..240].copy_from_slice(&[99, 130, 83, 99]);
    m.extend_from_slice(&[53, 1, kind, 54, 4, 192, 168, 77, 1, 1, 4, 255, 255, 255, 0]);
    m.extend_from_slice(&[51, 4]);
    m.extend_from_slice(&lease.to_be_bytes());
    m.extend_from_slice(&[3, 4, 192, 168, 77, 1, 6, 4, 192, 168, 77, 1]);
    m.extend_from_slice(&[42, 8, 192, 168, 77, 1, 224, 0, 1, 1, 255]);
    m
}

const DHCP_MAC: [u8; 6] = [2, 0, 0, 0, 0, 7];

/// The DHCP client fed arbitrary bytes as replies, in the state the first byte picks
/// (selecting, requesting, bound, renewing, rebinding, init-reboot); bit 7 patches our
/// xid and MAC in, so the fuzzer gets past the "not ours" checks. Whatever arrives, the
/// client never panics and never holds a lease with an impossible prefix or lease time,
/// or more than `MAX_NTP` NTP servers (option 42) or one that is not unicast; the rest also goes through `Lease::from_text`, whose accepted leases round-trip.
pub fn check_dhcp(data: &[u8]) {
    use riceguard::core::dhcp::{is_unicast, Client, Lease, MAX_NTP, MIN_LEASE};
    let ntp_ok = |l: &Lease| l.ntp.len() <= MAX_NTP && l.ntp.iter().all(|a| is_unicast(*a));
    use std::time::{Duration, Instant};
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    if let Ok(l) = Lease::from_text(&String::from_utf8_lossy(rest)) {
        assert_eq!(
            Lease::from_text(&l.to_text()),
            Ok(l.clone()),
            "lease text round trip"
        );
        assert!(ntp_ok(&l), "lease file ntp {:?}", l.ntp);
    }
    let mut now = Instant::now();
    let mut c = Client::new(DHCP_MAC, u64::from(sel) + 1, now);
    c.start(now);
    let mut xid = [0u8; 4];
    let send = |c: &mut Client, now: Instant, xid: &mut [u8; 4]| {
        c.handle_timeout(now);
        while let Some(t) = c.poll_transmit(now) {
            assert!(t.payload.len() >= 300);
            xid.copy_from_slice(&t.payload[4..8]);
        }
        while c.poll_event().is_some() {}
    };
    now += Duration::from_secs(2);
    send(&mut c, now, &mut xid);
    let steps = (sel & 0x7f) % 6;
    if steps >= 1 && steps != 5 {
        let _ = c.handle_reply(now, &dhcp_reply(&xid, 2, 120));
        send(&mut c, now, &mut xid);
    }
    if steps >= 2 && steps != 5 {
        let _ = c.handle_reply(now, &dhcp_reply(&xid, 5, 120));
        send(&mut c, now, &mut xid);
    }
    if steps == 3 || steps == 4 {
        now += Duration::from_secs(if steps == 3 { 61 } else { 106 });
        send(&mut c, now, &mut xid);
    }
    if steps == 5 {
        c.link_down(now);
        c.link_up(now);
        send(&mut c, now, &mut xid);
    }
    let mut msg = rest.to_vec();
    if sel & 0x80 != 0 && msg.len() >= 34 {
        msg[4..8].copy_from_slice(&xid);
        msg[28..34].copy_from_slice(&DHCP_MAC);
        msg[2] = 6;
    }
    let _ = c.handle_reply(now, &msg);
    for _ in 0..8 {
        while c.poll_event().is_some() {}
        if let Some(l) = c.lease() {
            assert!((1..=31).contains(&l.prefix), "held a /{} lease", l.prefix);
            assert!(u64::from(l.lease_secs) >= MIN_LEASE.as_secs());
            assert!(l.t1_secs < l.t2_secs || l.lease_secs == u32::MAX);
            assert!(ntp_ok(l), "held ntp {:?}", l.ntp);
        }
        match c.poll_timeout() {
            Some(t) => now = t.max(now),
            None => break,
        }
        send(&mut c, now, &mut xid);
    }
}

/// The USB stick's readers (`core::usb_stick`): a first sector through the FAT boot
/// sector check, and each line as a file name on the stick. Nothing panics; a sector taken
/// for FAT has the 0x55AA signature; an accepted plain name has no path in it; an export's
/// name carries back the time it was made for.
pub fn check_usb_stick(data: &[u8]) {
    use riceguard::core::usb_stick as u;
    if u::fat_kind(data).is_some() {
        assert_eq!(&data[510..512], &[0x55, 0xAA]);
    }
    let text = String::from_utf8_lossy(data);
    let mut entries = Vec::new();
    for (i, line) in text.lines().take(64).enumerate() {
        if let Ok(n) = u::plain_file_name(line) {
            assert!(!n.contains('/') && !n.contains('\\') && n != "..", "{n:?}");
        }
        if u::name_time(line).is_some() {
            assert!(line.to_ascii_lowercase().ends_with(".age"));
        }
        entries.push((line.to_string(), Some(i as i64)));
        let t = i64::from(u32::from_le_bytes(
            data.get(i * 4..i * 4 + 4)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 4]),
        ));
        let name = u::export_file_name(line, t);
        assert!(
            u::is_export_name(&name) && u::plain_file_name(&name).is_ok(),
            "{name}"
        );
        assert_eq!(u::name_time(&name), Some(t), "{name}");
    }
    if let Some(n) = u::newest_export(&entries) {
        assert!(u::is_export_name(n));
    }
}

/// An export text (`core::identity`, the plaintext of `export configuration`): nothing
/// panics, and an accepted one writes back to a text that reads the same.
pub fn check_identity(data: &[u8]) {
    use riceguard::core::identity::Identity;
    let text = String::from_utf8_lossy(data);
    if let Ok(i) = Identity::parse(&text, riceguard::core::ini::SCHEMA) {
        let again = i.to_text();
        assert_eq!(
            Identity::parse(&again, riceguard::core::ini::SCHEMA).as_ref(),
            Ok(&i)
        );
    }
}

/// An `authorized_keys` line through the SSH key parser (`core::ssh_key`) and the
/// `SshKey` value parser: nothing panics, and an accepted key prints back to a line that
/// parses to the same key, with a `SHA256:` fingerprint of 43 base64 characters.
pub fn check_ssh_key(data: &[u8]) {
    use riceguard::core::ssh_key::PublicKey;
    let text = String::from_utf8_lossy(data);
    if let Ok(k) = PublicKey::parse(&text) {
        let line = k.to_string();
        assert_eq!(PublicKey::parse(&line).as_ref(), Ok(&k), "{line}");
        let fp = k.fingerprint();
        assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 43, "{fp}");
    }
    if let Ok(sk) = riceguard::core::value::ssh_key(&text) {
        assert!(riceguard::core::config::valid_ssh_key_name(&sk.name));
    }
}

/// `Access =` (the configuration file and the console's `set client NAME access`): any
/// text either refused or read into items that write back to the same list; the owner
/// partition of the prefixes in it never overlaps and gives each address the owner of
/// its longest prefix.
pub fn check_access_list(data: &[u8]) {
    use riceguard_core::access::{self, AccessItem};
    let text = String::from_utf8_lossy(data);
    let Ok(v) = access::parse_list(&text) else {
        return;
    };
    let back = access::list_text(&v);
    assert_eq!(access::parse_list(&back).as_ref(), Ok(&v), "{back}");
    let prefixes: Vec<(usize, riceguard_core::net::Cidr)> = v
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            AccessItem::Prefix { net, .. } => Some((i, *net)),
            _ => None,
        })
        .collect();
    let o = access::owners(&prefixes);
    for (k, (_, a)) in o.iter().enumerate() {
        for (_, b) in &o[k + 1..] {
            assert!(!a.overlaps(b), "{a} {b}");
        }
    }
    for (i, c) in &prefixes {
        // A prefix's own address belongs to the owner of the longest prefix covering it.
        let best = prefixes
            .iter()
            .filter(|(_, p)| p.contains(c.addr))
            .map(|(_, p)| p.prefix)
            .max();
        let got: Vec<&(usize, riceguard_core::net::Cidr)> =
            o.iter().filter(|(_, p)| p.contains(c.addr)).collect();
        assert_eq!(got.len(), 1, "{c}");
        let owner = got[0].0;
        assert!(
            prefixes
                .iter()
                .any(|(j, p)| *j == owner && p.contains(c.addr) && Some(p.prefix) == best),
            "{c} of {i} owned by {owner}"
        );
    }
}

/// An event log file's bytes (`core::event`, what `show log` reads from perm after a
/// power cut): nothing panics, every record read writes back to the same line, and a
/// file cut anywhere loses at most the record it cut.
pub fn check_event_log(data: &[u8]) {
    use riceguard_core::event::{parse_all, Event};
    let (events, skipped) = parse_all(data);
    assert!(events.len() + skipped <= data.iter().filter(|&&b| b == b'\n').count() + 1);
    let mut again = String::new();
    for e in &events {
        let r = e.record();
        assert_eq!(
            Event::parse(r.trim_end_matches('\n')).as_ref(),
            Some(e),
            "{r}"
        );
        again.push_str(&r);
    }
    let (back, s) = parse_all(again.as_bytes());
    assert_eq!((back.as_slice(), s), (events.as_slice(), 0));
    // Cut anywhere: the whole records before the cut survive.
    let cut = data.len() / 2;
    let (before, _) = parse_all(&again.as_bytes()[..cut.min(again.len())]);
    assert!(events.starts_with(&before));
    // Any text makes a record that reads back.
    let text = String::from_utf8_lossy(data);
    let e = Event::new(data.len() as u64, &text, &text);
    assert_eq!(Event::parse(e.record().trim_end_matches('\n')), Some(e));
}

/// The age passphrase the `age_armor` seeds were written with.
pub const AGE_FUZZ_PASSPHRASE: &str = "fuzz passphrase";
/// The work factor cap of the `age_armor` check: scrypt at 2^4 keeps it fast.
pub const AGE_FUZZ_MAX_LOG_N: u8 = 4;

/// An age file (`core::age`, the export/import format) as armoured text and as the binary
/// form, opened with the seeds' passphrase: nothing panics, and whatever opens encrypts
/// again and opens back to the same bytes (armoured and binary).
pub fn check_age(data: &[u8]) {
    use riceguard_core::age;
    let mut opened = Vec::new();
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = age::decrypt(text, AGE_FUZZ_PASSPHRASE, AGE_FUZZ_MAX_LOG_N) {
            opened.push(p);
        }
    }
    if let Ok(p) = age::decrypt_binary(data, AGE_FUZZ_PASSPHRASE, AGE_FUZZ_MAX_LOG_N) {
        opened.push(p);
    }
    for p in opened {
        let mut rng = riceguard_core::testutil::Rng(data.len() as u64 | 1);
        let text = age::encrypt(&p, "another passphrase", 1, &mut rng).expect("re-encrypt");
        assert_eq!(
            age::decrypt(&text, "another passphrase", 1).as_ref(),
            Ok(&p)
        );
        let bin = age::encrypt_binary(&p, "another passphrase", 1, &mut rng).expect("binary");
        assert_eq!(
            age::decrypt_binary(&bin, "another passphrase", 1).as_ref(),
            Ok(&p)
        );
    }
}

/// SNTP answers: the first 8 bytes are our clock (unix ns, the era pivot), bit 0 of the
/// ninth picks whether the cookie is patched into the originate so the fuzzer gets past
/// it; the rest is the datagram. It goes through `Reply::parse`, the poller (as the answer
/// to an open query) and the policy, and as text through the state and floor readers.
/// Nothing panics; an accepted answer never makes a backward step, a step beyond the
/// single-server bound, or a backward slew over a second.
pub fn check_sntp(data: &[u8]) {
    use riceguard::core::clock::*;
    use std::net::SocketAddr;
    use std::time::Duration;
    if data.len() < 9 {
        return;
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&data[..8]);
    let wall = UnixTime::from_nanos(i64::from_le_bytes(w) >> 2);
    let patch = data[8] & 1 != 0;
    let mut msg = data[9..].to_vec();
    let text = String::from_utf8_lossy(&msg).into_owned();
    let _ = NtpState::from_text(&text);
    let _ = BootRecord::from_text(&text);
    let _ = parse_time_text(&text);
    let _ = Stamps::from_text(&text);
    if let Some(sv) = SavedTime::from_text(&text) {
        // An agreed line never lies above the floor it came with.
        if let Some((w, a)) = sv.agreed {
            assert!(a >= 0 && w.saturating_add(a / 1_000_000_000) <= sv.floor);
        }
    }
    let cookie: u64 = 0x0123_4567_89ab_cdef;
    if patch && msg.len() >= 32 {
        msg[24..32].copy_from_slice(&cookie.to_be_bytes());
    }
    if let Ok(r) = Reply::parse(&msg, cookie) {
        let s = Sample::new(wall, Duration::from_millis(7), &r);
        assert!(s.delay >= 0);
    }
    let at: SocketAddr = ([192, 0, 2, 1], PORT).into();
    let mut p = Poller::default();
    let now = Duration::from_secs(1);
    p.set_servers(
        now,
        vec![ServerId {
            name: "fuzz".into(),
            addr: at,
            origin: match data[8] >> 1 & 3 {
                0 => Origin::Address,
                1 => Origin::Name,
                _ => Origin::Dhcp,
            },
        }],
    );
    let Some((_, _q)) = p.poll_transmit(now, wall, cookie) else {
        panic!("a new server is due at once");
    };
    let mut policy = Policy::new(wall, now);
    if let Some(Event::Sample { sample, server }) =
        p.handle_reply(now + Duration::from_millis(7), at, &msg)
    {
        match policy.decide(at, server.origin, wall, now, &sample) {
            Decision::Step { by, agreed } => {
                assert!(by >= 0, "backward step");
                assert!(!agreed, "one server agreed with itself");
                assert!(by <= MAX_SINGLE_AHEAD, "far step from one server");
                assert!(
                    wall.add_nanos(by) <= UnixTime::from_secs(LATEST_NTP),
                    "a step past 2200"
                );
            }
            Decision::Slew { by } => {
                assert!(by >= -MAX_BACKWARD, "big backward slew");
                assert!(
                    wall.add_nanos(by) <= UnixTime::from_secs(LATEST_NTP),
                    "a slew past 2200"
                );
            }
            Decision::Refused(r) => {
                let _ = r.to_string();
            }
        }
    }
    let _ = p.report();
    let _ = p.poll_timeout();
    let _ = wall.to_string();
}

/// The ESP's boot entries as the U-Boot boot script reads them (`slots::uboot_plan`):
/// records split by 0xFF, each a file name, a newline, then its contents; also the
/// `RiceGuardBoot` variable. Nothing panics; a plan boots a slot whose entry the script
/// can see, never a used-up one over a usable other slot, and none only when neither
/// slot has an entry; a counted name stays findable.
pub fn check_uboot_entries(data: &[u8]) {
    use riceguard_core::slots::*;
    let _ = parse_boot_var(data);
    let _ = sort_key_digit(data);
    let entries: Vec<(String, Vec<u8>)> = data
        .split(|&b| b == 0xff)
        .map(|r| {
            let (name, text) = match r.iter().position(|&b| b == b'\n') {
                Some(i) => (&r[..i], &r[i + 1..]),
                None => (r, &r[r.len()..]),
            };
            (String::from_utf8_lossy(name).into_owned(), text.to_vec())
        })
        .collect();
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let (va, vb) = (uboot_entry_name(&names, 'a'), uboot_entry_name(&names, 'b'));
    let Some(p) = uboot_plan(&entries) else {
        assert!(
            va.is_none() && vb.is_none(),
            "no plan with an entry: {names:?}"
        );
        return;
    };
    let (mine, other) = if p.slot == 'a' { (va, vb) } else { (vb, va) };
    assert_eq!(Some(p.entry.as_str()), mine);
    if p.exhausted {
        if let Some(o) = other {
            assert!(matches!(entry_tries(o), Some((0, _))), "{names:?} -> {p:?}");
        }
    }
    if let Some(to) = &p.count_to {
        assert!(is_slot_entry(to, p.slot), "{to}");
        let mut after: Vec<&str> = names.iter().copied().filter(|n| *n != p.entry).collect();
        after.push(to);
        assert!(uboot_entry_name(&after, p.slot).is_some(), "{to}");
    }
}

/// The files the appliance's processes share (`riceguard::run`, and the commit-confirm
/// records of `riceguard::perm`), read as text: the status file's `heartbeat:` and
/// `reload:` lines, a lease file, the commit-confirm records. Nothing panics; what a parser accepts, its writer writes back the same.
pub fn check_run_files(data: &[u8]) {
    use riceguard::perm::confirm;
    use riceguard::run::{lease::LeaseFile, status};
    let text = String::from_utf8_lossy(data);
    if let Some(b) = status::parse_heartbeats(&text) {
        assert_eq!(
            status::parse_heartbeats(&status::heartbeat_line(&b)),
            Some(b)
        );
    }
    if let Some(r) = status::parse_reload(&text) {
        let back = status::parse_reload(&r.line()).expect("reload line reads back");
        assert_eq!(back.generation, r.generation);
        // A reason's line breaks become spaces; a `\r` would end the line for `lines()`.
        if r.result.as_ref().err().is_none_or(|e| !e.contains('\r')) {
            assert_eq!(back, r, "reload line round trip");
        }
    }
    if let Ok(f) = LeaseFile::from_text(&text) {
        let again = LeaseFile::from_text(&f.to_text()).expect("lease file reads back");
        assert_eq!(again.lease, f.lease, "lease file round trip");
    }
    if let Some(t) = confirm::parse_marker(&text) {
        assert_eq!(confirm::parse_marker(&confirm::marker_text(t)), Some(t));
    }
    if let Some(b) = confirm::ConfirmBoot::parse(&text) {
        if !b.boot_id.contains(char::is_whitespace) {
            assert_eq!(confirm::ConfirmBoot::parse(&b.to_text()), Some(b));
        }
    }
    // The daemon's peer health file (`show peers`): what reads back is what was written.
    let peers = riceguard::run::peers::parse(&text);
    assert_eq!(
        riceguard::run::peers::parse(&riceguard::run::peers::text(&peers)),
        peers,
        "peer health file round trip"
    );
    // /proc/net/tcp as init reads it for the SSH server's listening socket.
    let ports = riceguard::core::net::tcp_listen_ports(&text);
    assert!(ports.windows(2).all(|w| w[0] < w[1]));
}

/// Remote syslog (`core::syslog`): any console or logger line is taken apart without
/// panicking, into parts of the line; the RFC 5424 message made from it has a header of
/// printable ASCII fields within RFC 5424's lengths, one line of UTF-8 text within
/// `MAX_MESSAGE`, an octet count that matches, a UDP datagram within `MAX_UDP` that is
/// still UTF-8; a backlog fed these messages stays within its budget and loses none
/// uncounted.
pub fn check_syslog_line(data: &[u8]) {
    use riceguard_core::clock::UnixTime;
    use riceguard_core::syslog::{self, Backlog, Origin};
    let text = String::from_utf8_lossy(data);
    let within = |part: &str| part.is_empty() || text.contains(part);
    let (sev, msg) = syslog::parse_logger_line(&text);
    assert!(within(msg), "{msg:?} not from the line");
    let l = syslog::parse_console_line(&text);
    assert!(l.app == "init" || within(l.app));
    assert!(within(l.msg));
    let host = text.split(' ').next().unwrap_or("");
    let o = Origin::new(host);
    let t = UnixTime::from_nanos(i64::from_le_bytes(
        data.get(..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([7; 8]),
    ));
    let procid = data.first().map(|&b| u32::from(b) * 1000);
    for (app, severity, m) in [
        (l.app, l.severity, l.msg),
        ("gateway", sev, msg),
        (&*text, sev, &*text),
    ] {
        let out = o.message(t, app, procid, severity, m);
        assert!(out.len() <= syslog::MAX_MESSAGE);
        let s = std::str::from_utf8(&out).expect("a message is UTF-8");
        assert!(!s.chars().any(char::is_control), "{s:?}");
        let f: Vec<&str> = s.splitn(8, ' ').collect();
        assert!(f.len() >= 7, "{s:?}");
        assert!(f[0].starts_with('<') && f[0].ends_with(">1"));
        for (field, max) in [
            (f[1], 32),
            (f[2], syslog::MAX_HOSTNAME),
            (f[3], syslog::MAX_APP_NAME),
            (f[4], syslog::MAX_PROCID),
            (f[5], 32),
            (f[6], 1),
        ] {
            assert!(!field.is_empty() && field.len() <= max, "{field:?}");
            assert!(field.bytes().all(|b| (33..=126).contains(&b)), "{field:?}");
        }
        let framed = syslog::frame_tcp(&out);
        let (n, rest) = framed.split_at(framed.iter().position(|&b| b == b' ').unwrap());
        assert_eq!(
            std::str::from_utf8(n).unwrap().parse::<usize>().unwrap(),
            rest.len() - 1
        );
        let d = syslog::datagram(&out);
        assert!(d.len() <= syslog::MAX_UDP && out.starts_with(d));
        assert!(std::str::from_utf8(d).is_ok());
    }
    let budget = usize::from(data.last().copied().unwrap_or(0)) * 8;
    let mut b = Backlog::new(budget);
    let mut pushed = 0u64;
    for chunk in data.chunks(7) {
        b.push(chunk.to_vec());
        pushed += 1;
        assert!(b.bytes() <= budget);
    }
    let (mut taken, mut said) = (0u64, 0u64);
    while let Some(m) = b.take(&o, t, None) {
        let s = String::from_utf8_lossy(m.bytes());
        match s.strip_suffix(" dropped while the collector was unreachable") {
            Some(head) => {
                said += head
                    .rsplit(' ')
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("a count")
            }
            None => taken += 1,
        }
    }
    assert_eq!(taken + said, pushed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Seed files for `target`: `seeds/<target>/` (committed) and `corpus/<target>/`
    /// (what cargo-fuzz found locally, if anything).
    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        for dir in ["seeds", "corpus"] {
            let Ok(rd) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                if let Ok(d) = std::fs::read(&p) {
                    out.push(d);
                }
            }
        }
        assert!(!out.is_empty(), "no seeds for {target}");
        out
    }

    /// libFuzzer-style mutations: flip, insert, delete, duplicate a span, splice in a
    /// piece of another seed.
    fn mutate(rng: &mut Rng, d: &mut Vec<u8>, other: &[u8]) {
        for _ in 0..1 + rng.below(4) {
            let n = d.len();
            match rng.below(6) {
                0 if n > 0 => {
                    let i = rng.below(n);
                    d[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(n + 1);
                    let c = *b"=\n[]#;,:/.-0123456789abcdefx "
                        .get(rng.below(29))
                        .unwrap_or(&b'=');
                    d.insert(i, c);
                }
                2 if n > 0 => {
                    let i = rng.below(n);
                    let len = 1 + rng.below((n - i).min(16));
                    d.drain(i..i + len);
                }
                3 if n > 0 => {
                    let i = rng.below(n);
                    let len = 1 + rng.below((n - i).min(64));
                    let span: Vec<u8> = d[i..i + len].to_vec();
                    let at = rng.below(n + 1);
                    d.splice(at..at, span);
                }
                4 if !other.is_empty() => {
                    let i = rng.below(other.len());
                    let len = 1 + rng.below((other.len() - i).min(64));
                    let at = rng.below(n + 1);
                    d.splice(at..at, other[i..i + len].iter().copied());
                }
                _ => {
                    let i = rng.below(n + 1);
                    d.insert(i, rng.next() as u8);
                }
            }
        }
    }

    fn run(target: &str, check: fn(&[u8]), iterations: usize) {
        let seeds = seeds(target);
        for s in &seeds {
            check(s);
        }
        let mut rng = Rng(0x5eed_0000 ^ target.len() as u64 | 1);
        for _ in 0..iterations {
            let mut d = seeds[rng.below(seeds.len())].clone();
            let other = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, &mut d, other);
            check(&d);
        }
        // Pure random bytes too.
        for _ in 0..iterations / 10 {
            let d: Vec<u8> = (0..rng.below(512)).map(|_| rng.next() as u8).collect();
            check(&d);
        }
    }

    #[test]
    fn ini_seeded() {
        run("ini", check_ini, 20_000);
    }

    #[test]
    fn uapi_seeded() {
        run("uapi", check_uapi, 5_000);
    }

    #[test]
    fn console_line_seeded() {
        run("console_line", check_console_line, 3_000);
    }

    #[test]
    fn datagram_seeded() {
        run("datagram", check_datagram, 5_000);
    }

    #[test]
    fn framing_seeded() {
        run("framing", check_framing, 5_000);
    }

    #[test]
    fn gso_split_seeded() {
        run("gso_split", check_gso_split, 5_000);
    }

    #[test]
    fn coalesce_seeded() {
        run("coalesce", check_coalesce, 5_000);
    }

    #[test]
    fn udp_cmsg_seeded() {
        run("udp_cmsg", check_udp_cmsg, 20_000);
    }

    #[test]
    fn uring_recv_seeded() {
        run("uring_recv", check_uring_recv, 20_000);
    }

    #[test]
    fn usb_stick_seeded() {
        run("usb_stick", check_usb_stick, 20_000);
    }

    #[test]
    fn identity_seeded() {
        run("identity", check_identity, 20_000);
    }

    #[test]
    fn syslog_line_seeded() {
        run("syslog_line", check_syslog_line, 20_000);
    }

    #[test]
    fn event_log_seeded() {
        run("event_log", check_event_log, 20_000);
    }

    #[test]
    fn ssh_key_seeded() {
        run("ssh_key", check_ssh_key, 20_000);
    }

    #[test]
    fn access_list_seeded() {
        run("access_list", check_access_list, 20_000);
    }

    #[test]
    fn age_armor_seeded() {
        run("age_armor", check_age, 5_000);
        // The seeds reach the payload: eight of them open with the fuzz passphrase.
        use riceguard_core::age;
        let opened = seeds("age_armor")
            .iter()
            .filter(|s| {
                std::str::from_utf8(s)
                    .is_ok_and(|t| age::decrypt(t, AGE_FUZZ_PASSPHRASE, AGE_FUZZ_MAX_LOG_N).is_ok())
                    || age::decrypt_binary(s, AGE_FUZZ_PASSPHRASE, AGE_FUZZ_MAX_LOG_N).is_ok()
            })
            .count();
        assert_eq!(opened, 8);
    }

    /// Writes the `age_armor` seeds (armoured and binary files of a few sizes at work
    /// factors 2^1..2^4, a two-stanza header, a wrong work factor). Run it by hand when
    /// the format changes: cargo test --lib write_age_seeds -- --ignored
    #[test]
    #[ignore = "writes seeds/age_armor/: run by hand"]
    fn write_age_seeds() {
        use riceguard_core::age;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/age_armor");
        std::fs::create_dir_all(&dir).unwrap();
        let mut rng = riceguard_core::testutil::Rng(0xa9e);
        let pass = AGE_FUZZ_PASSPHRASE;
        for (log_n, len) in [(1u8, 0usize), (2, 1), (3, 100), (4, 70_000)] {
            let p: Vec<u8> = (0..len)
                .map(|i| b"[Interface]\nkey = v\n"[i % 20])
                .collect();
            let text = age::encrypt(&p, pass, log_n, &mut rng).unwrap();
            std::fs::write(dir.join(format!("armoured-{len}-n{log_n}")), &text).unwrap();
            let bin = age::encrypt_binary(&p, pass, log_n, &mut rng).unwrap();
            std::fs::write(dir.join(format!("binary-{len}-n{log_n}")), &bin).unwrap();
        }
        let bin = age::encrypt_binary(b"two stanzas", pass, 1, &mut rng).unwrap();
        let text = String::from_utf8_lossy(&bin).into_owned();
        let mut lines: Vec<&str> = text.split('\n').collect();
        let (a, b) = (lines[1], lines[2]);
        lines.splice(3..3, [a, b]);
        std::fs::write(dir.join("two-stanzas"), lines.join("\n").into_bytes()).unwrap();
        let wrong = age::encrypt(b"other passphrase", "not the fuzz one", 1, &mut rng).unwrap();
        std::fs::write(dir.join("other-passphrase"), wrong).unwrap();
    }

    #[test]
    fn sntp_seeded() {
        run("sntp", check_sntp, 20_000);
    }

    #[test]
    fn run_files_seeded() {
        run("run_files", check_run_files, 20_000);
    }

    #[test]
    fn uboot_entries_seeded() {
        run("uboot_entries", check_uboot_entries, 20_000);
    }

    #[test]
    fn nft_reply_seeded() {
        run("nft_reply", check_nft_reply, 20_000);
        // The seeds read back as what they are.
        use riceguard::core::firewall::nft::{parse_counter, parse_table_comment};
        use riceguard::core::netlink::messages;
        let seeds = seeds("nft_reply");
        let got: Vec<_> = seeds
            .iter()
            .flat_map(|s| {
                messages(s)
                    .filter_map(Result::ok)
                    .map(|m| m.payload.to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(got
            .iter()
            .any(|p| parse_counter(p, "riceguard") == Ok(Some(("spoof".into(), 7, 1234)))));
        assert!(got.iter().any(
            |p| parse_table_comment(p) == Ok(Some("riceguard ruleset 0123456789abcdef".into()))
        ));
    }

    #[test]
    fn dhcp_seeded() {
        run("dhcp", check_dhcp, 20_000);
    }

    #[test]
    fn allowed_ips_seeded() {
        run("allowed_ips", check_allowed_ips, 5_000);
    }

    #[test]
    fn metrics_http_seeded() {
        run("metrics_http", check_metrics_http, 20_000);
    }

    #[test]
    fn dns_message_seeded() {
        run("dns_message", check_dns_message, 20_000);
    }
}

/// What the kernel sends back for nf_tables queries (`core::firewall::nft`'s readers) and
/// netlink's datagram splitter: a datagram split into messages, each read as a counter
/// reply and as a table reply. Nothing panics; a counter read names the table asked for.
pub fn check_nft_reply(data: &[u8]) {
    use riceguard::core::firewall::nft::{parse_counter, parse_table_comment};
    use riceguard::core::netlink::messages;
    for m in messages(data).take(64) {
        let Ok(m) = m else { break };
        if let Ok(Some((name, _packets, _bytes))) = parse_counter(m.payload, "riceguard") {
            assert!(name.len() <= data.len(), "a name longer than the datagram");
        }
        let _ = parse_table_comment(m.payload);
    }
    // The payload alone, as if the header had been taken off already.
    let _ = parse_counter(data, "riceguard");
    let _ = parse_table_comment(data);
}

/// The DNS forwarder (`core::dns`): the input as a client's query, over UDP and TCP (and
/// with its QR bit cleared), and when it is forwarded, the input again as the upstream's
/// answer (QR set, the forward's ID, from the upstream). Nothing panics; what the
/// resolver sends parses, is a response with the client's ID within the size limit, and
/// an answer passed on names no protected (tunnel) address.
pub fn check_dns_message(data: &[u8]) {
    use hickory_proto::op::{Message, MessageType};
    use riceguard::core::dns::{
        protected_nets, Outcome, Resolver, Settings, Zone, TCP_MAX, UDP_MAX,
    };
    use riceguard::core::net::Cidr;
    use riceguard_core::testutil::Rng;
    use std::net::{IpAddr, SocketAddr};
    let c = |s: &str| s.parse::<Cidr>().expect("a literal");
    let tunnel = [c("10.100.0.1/24"), c("fd10::1/64")];
    let phone = [c("10.100.0.2/32"), c("192.168.50.0/24")];
    let upstream: SocketAddr = "192.0.2.53:53".parse().expect("a literal");
    let settings = Settings {
        zone: Zone::new(
            "home.arpa",
            &[tunnel[0].addr, tunnel[1].addr],
            &tunnel,
            [("phone", &phone[..])],
        ),
        upstreams: vec![upstream],
        protected: protected_nets(&tunnel, &phone),
    };
    let protected = settings.protected.clone();
    let mut r = Resolver::new(settings);
    let mut rng = Rng(1);
    let src: IpAddr = "10.100.0.2".parse().expect("a literal");
    let check_reply = |b: &[u8], id: Option<[u8; 2]>, max: usize| {
        assert!(b.len() <= max, "{} bytes", b.len());
        let m = Message::from_vec(b).expect("what the resolver sends parses");
        assert_eq!(m.metadata.message_type, MessageType::Response);
        if let Some(id) = id {
            assert_eq!(m.metadata.id.to_be_bytes(), id, "the client's ID");
        }
        for rec in m.answers.iter().chain(&m.additionals).chain(&m.authorities) {
            if let Some(a) = rec.data.ip_addr() {
                assert!(
                    !protected.iter().any(|n| n.contains(a))
                        || a == tunnel[0].addr
                        || a == tunnel[1].addr
                        || a == phone[0].addr,
                    "{a} passed"
                );
            }
        }
    };
    let id = (data.len() >= 2).then(|| [data[0], data[1]]);
    // The input as it is, and as a query (QR clear) answered by itself as a response (QR
    // set): an answer section in the input reaches the rebinding filter.
    let mut as_query = data.to_vec();
    let mut as_answer = data.to_vec();
    if data.len() > 2 {
        as_query[2] &= 0x7f;
        as_answer[2] |= 0x80;
    }
    for (tcp, input) in [(false, data), (true, data), (false, &as_query[..])] {
        let max = if tcp { TCP_MAX } else { UDP_MAX };
        match r.query(src, input, tcp, 0, &mut rng) {
            Outcome::Answer(b) => check_reply(&b, id, max),
            Outcome::Forward {
                token,
                upstream: to,
                bytes,
            } => {
                assert_eq!(to, upstream);
                let q = Message::from_vec(&bytes).expect("a forward parses");
                assert_eq!(q.queries.len(), 1);
                let mut ans = as_answer.clone();
                ans[..2].copy_from_slice(&bytes[..2]);
                if let Some(b) = r.upstream_answer(token, upstream, &ans, 0) {
                    let m = Message::from_vec(&b).expect("parses");
                    // Upstream answers name no tunnel address at all.
                    for rec in m.answers.iter().chain(&m.additionals).chain(&m.authorities) {
                        if let Some(a) = rec.data.ip_addr() {
                            assert!(!protected.iter().any(|n| n.contains(a)), "{a} passed");
                        }
                    }
                    check_reply(&b, id, max);
                }
                // Not twice.
                assert!(r.upstream_answer(token, upstream, &ans, 0).is_none());
            }
            Outcome::Drop(_) => {}
        }
    }
    let _ = r.expire(u64::MAX);
}

/// The metrics endpoint's request head (`core::metrics::parse_request`, `head_end`) and
/// its label escaping: nothing panics; a head is accepted only whole (its empty line last,
/// within `MAX_HEAD`) and only for GET; any text as a label value stays on its one sample
/// line and unescapes back to itself.
pub fn check_metrics_http(data: &[u8]) {
    use riceguard::core::metrics::{head_end, parse_request, HttpError, Value, Writer, MAX_HEAD};
    let r = parse_request(data);
    if let Some(end) = head_end(data) {
        assert!(end <= data.len());
        let _ = parse_request(&data[..end]);
    }
    match r {
        Ok(_) => {
            assert!(data.starts_with(b"GET /"), "accepted: {data:?}");
            assert_eq!(head_end(data), Some(data.len()));
            assert!(data.len() <= MAX_HEAD);
        }
        Err(HttpError::TooLarge) => assert!(data.len() > MAX_HEAD),
        Err(e) => {
            let (code, _) = e.status();
            assert!((400..500).contains(&code));
        }
    }
    let text = String::from_utf8_lossy(data);
    let mut w = Writer::new(Vec::new());
    w.sample("m", &[("name", &text)], Value::U(1))
        .expect("writing into a Vec");
    let out = String::from_utf8(w.into_inner()).expect("the writer writes UTF-8");
    assert_eq!(out.matches('\n').count(), 1, "{out:?}");
    let quoted = out
        .strip_prefix("m{name=\"")
        .and_then(|s| s.strip_suffix("\"} 1\n"))
        .expect("one label");
    let mut back = String::new();
    let mut it = quoted.chars();
    while let Some(c) = it.next() {
        if c == '"' {
            panic!("an unescaped quote in {quoted:?}");
        }
        if c != '\\' {
            back.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => back.push('\\'),
            Some('"') => back.push('"'),
            Some('n') => back.push('\n'),
            other => panic!("bad escape {other:?} in {quoted:?}"),
        }
    }
    assert_eq!(back, text);
}
