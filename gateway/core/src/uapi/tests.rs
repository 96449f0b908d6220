use super::*;
use crate::config::{Config, Endpoint, PeerConfig};
use crate::ini::tests::{random_config, Rng};
use std::io::Cursor;

fn k(b: u8) -> Key {
    Key([b; 32])
}

fn c(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn read(s: &str) -> Result<Request, UapiError> {
    read_request(&mut Cursor::new(s.as_bytes()))
}

fn set(s: &str) -> SetRequest {
    match read(s) {
        Ok(Request::Set(r)) => r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_get_and_set() {
    assert_eq!(read("get=1\n\n"), Ok(Request::Get));
    assert_eq!(read(""), Err(UapiError::Closed));
    assert!(matches!(read("get=1\nx\n"), Err(UapiError::Invalid(_))));
    let e = read("hello\n").unwrap_err();
    assert!(matches!(e, UapiError::UnknownOperation(_)) && !e.answers());
    let r = set(&format!(
        "set=1\nprivate_key={}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\
         public_key={}\nprotocol_version=1\npreshared_key={}\nendpoint=[::1]:5\n\
         persistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.7/24\n\
         allowed_ip=fd00::/64\npublic_key={}\nremove=true\n\n",
        k(1).to_hex(),
        k(2).to_hex(),
        k(3).to_hex(),
        k(4).to_hex()
    ));
    assert_eq!(r.private_key, Some(k(1)));
    assert_eq!(r.listen_port, Some(51820));
    assert_eq!(r.fwmark, Some(0));
    assert!(r.replace_peers);
    assert_eq!(r.peers.len(), 2);
    let p = &r.peers[0];
    assert_eq!(p.public_key, k(2));
    assert_eq!(p.preshared_key, Some(k(3)));
    assert_eq!(p.endpoint, Some("[::1]:5".parse().unwrap()));
    assert_eq!(p.persistent_keepalive, Some(25));
    assert!(p.replace_allowed_ips);
    assert_eq!(p.allowed_ips, vec![c("10.0.0.0/24"), c("fd00::/64")]);
    assert_eq!(p.protocol_version, Some(1));
    assert!(r.peers[1].remove);
    // The emitted form reads back to the same request.
    assert_eq!(set(&emit_set(&r)), r);
    // End of input after whole lines ends a set, as in wireguard-go; inside a line
    // (a client gone mid-request) it refuses the whole set.
    assert_eq!(set("set=1\nlisten_port=4000\n").listen_port, Some(4000));
    let e = read("set=1\nlisten_port=4").unwrap_err();
    assert_eq!(e.errno(), -EIO, "{e}");
}

#[test]
fn set_errors_have_wireguard_go_errnos() {
    let pk = k(9).to_hex();
    let cases: &[(&str, i32)] = &[
        ("set=1\nbogus=1\n\n", -EINVAL),
        ("set=1\nlisten_port=65536\n\n", -EINVAL),
        ("set=1\nlisten_port=+1\n\n", -EINVAL),
        ("set=1\nfwmark=-1\n\n", -EINVAL),
        ("set=1\nreplace_peers=yes\n\n", -EINVAL),
        ("set=1\nprivate_key=abc\n\n", -EINVAL),
        ("set=1\nnoequals\n\n", -EPROTO),
        ("set=1\nendpoint=1.2.3.4:5\n\n", -EINVAL), // peer key before any public_key
        ("set=1\nallowed_ip=10.0.0.0/8\n\n", -EINVAL),
    ];
    for (text, errno) in cases {
        let e = read(text).unwrap_err();
        assert_eq!(e.errno(), *errno, "{text:?}: {e}");
        assert!(e.answers());
    }
    for bad in [
        "protocol_version=2",
        "allowed_ip=10.0.0.1",
        "allowed_ip=10.0.0.0/33",
        "endpoint=1.2.3.4",
        "endpoint=1.2.3.4:0",
        "endpoint=fd00::1:5",
        "persistent_keepalive_interval=65536",
        "remove=false",
        "update_only=1",
        "replace_allowed_ips=false",
        "preshared_key=00",
        "listen_port=1",
    ] {
        let e = read(&format!("set=1\npublic_key={pk}\n{bad}\n\n")).unwrap_err();
        assert_eq!(e.errno(), -EINVAL, "{bad}: {e}");
    }
    // After an error the rest of the request is consumed: the next one reads fine.
    let mut cur = Cursor::new(b"set=1\nbogus=1\nlisten_port=5\n\nget=1\n\n".to_vec());
    assert!(read_request(&mut cur).is_err());
    assert_eq!(read_request(&mut cur), Ok(Request::Get));
}

#[test]
fn limits() {
    let long = format!("set=1\nlisten_port={}\n\n", "1".repeat(MAX_LINE_BYTES));
    assert_eq!(read(&long).unwrap_err().errno(), -EIO);
    let mut big = String::from("set=1\n");
    while big.len() <= MAX_REQUEST_BYTES {
        big.push_str("listen_port=1\n");
    }
    assert_eq!(read(&big).unwrap_err().errno(), -EIO);
    // End of input after a whole line ends a set as wireguard-go's scanner does;
    // inside a line it does not (see `reads_get_and_set`).
    assert_eq!(
        set("set=1\nlisten_port=7\n"),
        SetRequest {
            listen_port: Some(7),
            ..Default::default()
        }
    );
}

fn base() -> Config {
    let mut cfg = Config::default();
    cfg.interface.private_key = Some(k(50));
    cfg.interface.listen_port = Some(51820);
    cfg.peers = vec![
        PeerConfig {
            public_key: k(1),
            preshared_key: Some(k(11)),
            allowed_ips: vec![c("10.0.0.1/32"), c("10.1.0.0/16")],
            endpoint: Some(Endpoint::Addr("192.0.2.1:51820".parse().unwrap())),
            persistent_keepalive: Some(25),
            tcp_port: Some(443),
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        },
        PeerConfig {
            public_key: k(2),
            preshared_key: None,
            allowed_ips: vec![c("10.0.0.2/32")],
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        },
    ];
    cfg
}

#[test]
fn apply_moves_allowed_ips_and_follows_flags() {
    let b = base();
    let r = set(&format!(
        "set=1\nlisten_port=0\nfwmark=7\npublic_key={}\nallowed_ip=10.1.0.0/16\npersistent_keepalive_interval=0\n\
         public_key={}\nupdate_only=true\nallowed_ip=10.9.0.0/16\n\
         public_key={}\npreshared_key={}\nendpoint=1.2.3.4:9\n\n",
        k(2).to_hex(),
        k(3).to_hex(),
        k(1).to_hex(),
        Key::default().to_hex()
    ));
    let n = apply_set(&b, &r).unwrap();
    assert_eq!(n.interface.listen_port, None);
    assert_eq!(n.interface.fwmark, Some(7));
    assert_eq!(n.peers.len(), 2, "update_only must not create peer 3");
    assert_eq!(n.peers[0].allowed_ips, vec![c("10.0.0.1/32")]);
    assert_eq!(n.peers[0].preshared_key, None);
    assert_eq!(
        n.peers[0].endpoint,
        Some(Endpoint::Addr("1.2.3.4:9".parse().unwrap()))
    );
    assert_eq!(n.peers[0].tcp_port, Some(443), "non-UAPI settings are kept");
    assert_eq!(
        n.peers[1].allowed_ips,
        vec![c("10.0.0.2/32"), c("10.1.0.0/16")]
    );
    assert_eq!(n.peers[1].persistent_keepalive, None);

    // replace_allowed_ips + remove + replace_peers + new peers.
    let r = set(&format!(
        "set=1\npublic_key={}\nreplace_allowed_ips=true\nallowed_ip=10.7.0.0/16\n\
         public_key={}\nremove=true\npublic_key={}\nallowed_ip=10.0.0.2/32\n\n",
        k(1).to_hex(),
        k(2).to_hex(),
        k(3).to_hex()
    ));
    let n = apply_set(&b, &r).unwrap();
    let keys: Vec<Key> = n.peers.iter().map(|p| p.public_key).collect();
    assert_eq!(keys, vec![k(1), k(3)]);
    assert_eq!(n.peers[0].allowed_ips, vec![c("10.7.0.0/16")]);
    assert_eq!(n.peers[1].allowed_ips, vec![c("10.0.0.2/32")]);
    n.validate().unwrap();

    let r = set("set=1\nreplace_peers=true\n\n");
    assert!(apply_set(&b, &r).unwrap().peers.is_empty());

    // Our own public key as a peer is ignored; a new private key drops a peer that
    // has its public key.
    let r = set(&format!(
        "set=1\npublic_key={}\nallowed_ip=10.5.0.0/16\n\n",
        k(50).public().to_hex()
    ));
    assert_eq!(apply_set(&b, &r).unwrap(), b);
    let mut with_self = b.clone();
    with_self.peers[1].public_key = k(60).public();
    let r = set(&format!("set=1\nprivate_key={}\n\n", k(60).to_hex()));
    let n = apply_set(&with_self, &r).unwrap();
    assert_eq!(n.peers.len(), 1);
    assert_eq!(n.interface.private_key, Some(k(60)));
    let r = set(&format!(
        "set=1\nprivate_key={}\n\n",
        Key::default().to_hex()
    ));
    assert_eq!(apply_set(&b, &r).unwrap().interface.private_key, None);

    // A prefix that moves away and back ends up last in its list, once.
    let r = set(&format!(
        "set=1\npublic_key={}\nallowed_ip=10.0.0.1/32\npublic_key={}\nallowed_ip=10.0.0.1/32\n\n",
        k(2).to_hex(),
        k(1).to_hex()
    ));
    let n = apply_set(&b, &r).unwrap();
    assert_eq!(
        n.peers[0].allowed_ips,
        vec![c("10.1.0.0/16"), c("10.0.0.1/32")]
    );
    assert_eq!(n.peers[1].allowed_ips, vec![c("10.0.0.2/32")]);

    // allowed_ip then remove: the prefix is taken from its owner and then dropped.
    let r = set(&format!(
        "set=1\npublic_key={}\nallowed_ip=10.0.0.1/32\nremove=true\nallowed_ip=10.1.0.0/16\n\n",
        k(2).to_hex()
    ));
    let n = apply_set(&b, &r).unwrap();
    assert_eq!(n.peers.len(), 1);
    assert_eq!(n.peers[0].allowed_ips, vec![c("10.1.0.0/16")]);
}

#[test]
fn get_output_matches_wireguard_go() {
    let mut p = PeerStatus::new(k(2));
    p.endpoint = Some("[fd00::1]:51820".parse().unwrap());
    p.last_handshake = Some((1_700_000_000, 42));
    p.rx_bytes = 10;
    p.tx_bytes = 20;
    p.persistent_keepalive = Some(25);
    p.allowed_ips = vec![c("10.0.0.2/32"), c("fd00::2/128")];
    let q = PeerStatus::new(k(3));
    let st = DeviceStatus {
        private_key: Some(k(1)),
        listen_port: 51820,
        fwmark: None,
        peers: vec![p, q],
    };
    let want = format!(
        "private_key={}\nlisten_port=51820\n\
         public_key={}\npreshared_key={}\nprotocol_version=1\nendpoint=[fd00::1]:51820\n\
         last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=42\ntx_bytes=20\nrx_bytes=10\n\
         persistent_keepalive_interval=25\nallowed_ip=10.0.0.2/32\nallowed_ip=fd00::2/128\n\
         public_key={}\npreshared_key={}\nprotocol_version=1\n\
         last_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n\
         persistent_keepalive_interval=0\nerrno=0\n\n",
        k(1).to_hex(),
        k(2).to_hex(),
        Key::default().to_hex(),
        k(3).to_hex(),
        Key::default().to_hex()
    );
    let got = emit_get(&st);
    assert_eq!(got, want);
    assert_eq!(parse_get_response(&got).unwrap(), st);
    assert_eq!(
        read_get_response(&mut Cursor::new(got.as_bytes())).unwrap(),
        st
    );
    assert_eq!(
        parse_get_response("errno=-22\n\n"),
        Err(UapiError::Remote(-22))
    );
    assert!(parse_get_response("listen_port=1\n").is_err());
    assert_eq!(emit_errno(-EINVAL), "errno=-22\n\n");
    assert_eq!(
        read_set_response(&mut Cursor::new(b"errno=0\n\n".to_vec())),
        Ok(())
    );
    assert_eq!(
        read_set_response(&mut Cursor::new(b"errno=-98\n\n".to_vec())),
        Err(UapiError::Remote(-98))
    );
    // Unknown keys are skipped.
    assert!(parse_get_response("jc=4\nerrno=0\n\n").is_ok());
}

/// What `wg setconf` (wireguard-tools) writes to the socket, captured with a fake
/// listener; keys replaced by fixed bytes.
const WG_SETCONF: &str = "set=1\nprivate_key=2121212121212121212121212121212121212121212121212121212121212121\nlisten_port=51820\nfwmark=32\nreplace_peers=true\n\
    public_key=2222222222222222222222222222222222222222222222222222222222222222\nendpoint=192.0.2.1:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
    allowed_ip=10.0.0.2/32\nallowed_ip=fd00::2/128\npublic_key=2323232323232323232323232323232323232323232323232323232323232323\nreplace_allowed_ips=true\n\
    allowed_ip=10.0.0.3/32\n\n";

#[test]
fn real_wg_setconf_request_applies_like_the_config_file() {
    let Ok(Request::Set(req)) = read(WG_SETCONF) else {
        panic!("not a set")
    };
    let got = apply_set(&base(), &req).unwrap();
    let conf = format!(
        "[Interface]\nPrivateKey = {}\nListenPort = 51820\nFwMark = 0x20\n\
         [Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.2/32, fd00::2/128\nEndpoint = 192.0.2.1:51820\nPersistentKeepalive = 25\n\
         [Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.3/32\n",
        k(0x21).to_base64(),
        k(0x22).to_base64(),
        k(0x23).to_base64()
    );
    assert_eq!(got, crate::ini::parse("wg.conf", &conf).unwrap());
}

/// A `get=1` answer captured from Debian's wireguard-go (keys replaced by fixed
/// bytes) after `wg set ... fwmark 0x20 peer A preshared-key ... endpoint
/// [2001:db8::1]:51820 persistent-keepalive 25 allowed-ips 10.9.0.1/24,fd00::9/128
/// peer B allowed-ips 10.9.1.0/24 endpoint 192.0.2.7:1234`.
const WIREGUARD_GO_GET: &str = "private_key=1111111111111111111111111111111111111111111111111111111111111111\nlisten_port=51999\nfwmark=32\npublic_key=1212121212121212121212121212121212121212121212121212121212121212\npreshared_key=1313131313131313131313131313131313131313131313131313131313131313\nprotocol_version=1\nendpoint=[2001:db8::1]:51820\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=25\nallowed_ip=10.9.0.0/24\nallowed_ip=fd00::9/128\npublic_key=1414141414141414141414141414141414141414141414141414141414141414\npreshared_key=0000000000000000000000000000000000000000000000000000000000000000\nprotocol_version=1\nendpoint=192.0.2.7:1234\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=0\nallowed_ip=10.9.1.0/24\nerrno=0\n\n";

#[test]
fn real_wireguard_go_answer_parses_and_reemits_identically() {
    let st = parse_get_response(WIREGUARD_GO_GET).unwrap();
    assert_eq!(st.listen_port, 51999);
    assert_eq!(st.fwmark, Some(32));
    assert_eq!(st.peers.len(), 2);
    assert_eq!(st.peers[0].persistent_keepalive, Some(25));
    assert_eq!(st.peers[1].preshared_key, None);
    assert_eq!(st.peers[0].last_handshake, None);
    assert_eq!(emit_get(&st), WIREGUARD_GO_GET);
}

/// The UAPI-visible parts of a config, peers sorted by key.
type VisiblePeer = (Key, Option<Key>, Option<Endpoint>, Option<u16>, Vec<Cidr>);
type Visible = (Option<Key>, Option<u16>, Option<u32>, Vec<VisiblePeer>);

fn visible(c: &Config) -> Visible {
    let mut peers: Vec<_> = c
        .peers
        .iter()
        .map(|p| {
            let ep = match &p.endpoint {
                Some(Endpoint::Addr(a)) => Some(Endpoint::Addr(*a)),
                _ => None,
            };
            (
                p.public_key,
                p.preshared_key,
                ep,
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

fn only_addr_endpoints(c: &mut Config) {
    for p in &mut c.peers {
        if matches!(p.endpoint, Some(Endpoint::Name { .. })) {
            p.endpoint = None;
        }
    }
}

#[test]
fn diff_then_apply_reaches_new() {
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut old = random_config(&mut rng);
        let mut new = if rng.chance(3) {
            random_config(&mut rng)
        } else {
            old.clone()
        };
        // Share some peers between old and new, then mutate a few fields.
        for p in old.peers.iter().take(2) {
            if !new.peers.iter().any(|q| q.public_key == p.public_key) && rng.chance(2) {
                let mut q = p.clone();
                q.allowed_ips
                    .retain(|c| !new.peers.iter().any(|r| r.allowed_ips.contains(c)));
                new.peers.push(q);
            }
        }
        for q in &mut new.peers {
            match rng.below(6) {
                0 => q.persistent_keepalive = None,
                1 => q.preshared_key = Some(rng.key()),
                2 => q.endpoint = None,
                3 => q.allowed_ips.clear(),
                _ => {}
            }
        }
        only_addr_endpoints(&mut old);
        only_addr_endpoints(&mut new);
        let d = set_from_diff(&old, &new);
        // The request survives the wire.
        assert_eq!(set(&emit_set(&d)), d, "seed {seed}");
        let got = apply_set(&old, &d).unwrap();
        assert_eq!(
            visible(&got),
            visible(&new),
            "seed {seed}\n{}",
            emit_set(&d)
        );
        // Unchanged peers are not mentioned.
        for p in &new.peers {
            if old.peers.contains(p) {
                assert!(
                    !d.peers.iter().any(|s| s.public_key == p.public_key),
                    "seed {seed}"
                );
            }
        }
    }
    let c = base();
    assert_eq!(set_from_diff(&c, &c), SetRequest::default());
}
