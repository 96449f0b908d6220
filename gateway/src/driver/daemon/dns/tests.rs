use super::*;
use crate::core::config::PeerConfig;
use crate::core::key::Key;
use crate::core::net::Cidr;
use crate::testutil::{in_new_netns, ip};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

fn c(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn config() -> Config {
    let mut cfg = Config::default();
    cfg.gateway.interface_name = "dnst0".into();
    cfg.interface.addresses = vec![c("10.100.0.1/24")];
    let mut phone = PeerConfig::new(Key([1; 32]));
    phone.name = Some("phone".into());
    phone.allowed_ips = vec![c("10.100.0.2/32")];
    cfg.peers = vec![phone];
    cfg
}

fn query(id: u16, name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

/// Ask `server` over UDP from `from`; `None`: no answer within 1 s.
fn ask_udp(from: &str, server: &str, q: &[u8]) -> Option<Message> {
    let s = UdpSocket::bind(format!("{from}:0")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.send_to(q, server).unwrap();
    let mut b = [0u8; 1500];
    let n = s.recv(&mut b).ok()?;
    Some(Message::from_vec(&b[..n]).unwrap())
}

fn ask_tcp(server: &str, q: &[u8]) -> Message {
    let mut s = TcpStream::connect(server).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut b = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut b).unwrap();
    Message::from_vec(&b).unwrap()
}

/// In a namespace of its own: the forwarder binds the tunnel's address (the interface
/// comes after the start: it binds again), answers the zone over UDP and TCP, refuses
/// a source outside the tunnel, gives SERVFAIL without an upstream, stops on `stop`.
#[test]
fn answers_on_the_tunnel_address_only() {
    in_new_netns(|| {
        ip(&["link", "set", "lo", "up"]);
        let dns = Dns::new(vec![]);
        dns.follow(&config());
        ip(&[
            "link", "add", "dnst0", "type", "veth", "peer", "name", "dnst1",
        ]);
        ip(&["link", "set", "dnst0", "up"]);
        ip(&["addr", "add", "10.100.0.1/24", "dev", "dnst0"]);
        ip(&["addr", "add", "10.100.0.2/32", "dev", "dnst0"]);
        ip(&["addr", "add", "198.51.100.9/32", "dev", "dnst0"]);
        let server = "10.100.0.1:53";
        let q = query(77, "phone.home.arpa.", RecordType::A);
        let deadline = Instant::now() + Duration::from_secs(5);
        let m = loop {
            if let Some(m) = ask_udp("10.100.0.2", server, &q) {
                break m;
            }
            assert!(Instant::now() < deadline, "no answer on the tunnel address");
        };
        assert_eq!(m.metadata.id, 77);
        let a: Vec<IpAddr> = m.answers.iter().filter_map(|r| r.data.ip_addr()).collect();
        assert_eq!(a, [IpAddr::from([10, 100, 0, 2])]);
        // TCP, a reverse lookup.
        let m = ask_tcp(
            server,
            &query(78, "2.0.100.10.in-addr.arpa.", RecordType::PTR),
        );
        assert_eq!((m.metadata.id, m.answers.len()), (78, 1));
        // Outside the tunnel: no answer at all.
        assert!(ask_udp("198.51.100.9", server, &q).is_none());
        // No upstream (no lease, none configured): SERVFAIL.
        let m = ask_udp(
            "10.100.0.2",
            server,
            &query(79, "example.com.", RecordType::A),
        )
        .unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        // Nothing on other addresses of the box.
        assert!(ask_udp("10.100.0.2", "198.51.100.9:53", &q).is_none());
        assert!(dns.stats().local >= 2);
        dns.stop();
        assert!(ask_udp("10.100.0.2", server, &q).is_none());
    });
}

/// `[Gateway] Dns`: a query forwarded from a fresh port with a fresh ID; a forged answer
/// (wrong ID) first is ignored, the real one passed without its record naming a tunnel
/// address, then answered from the cache; TCP forwards too.
#[test]
fn forwards_to_the_configured_upstream() {
    in_new_netns(|| {
        ip(&["link", "set", "lo", "up"]);
        ip(&[
            "link", "add", "dnst0", "type", "veth", "peer", "name", "dnst1",
        ]);
        ip(&["link", "set", "dnst0", "up"]);
        for a in ["10.100.0.1/24", "10.100.0.2/32", "192.0.2.53/32"] {
            ip(&["addr", "add", a, "dev", "dnst0"]);
        }
        let up = UdpSocket::bind("192.0.2.53:53").unwrap();
        up.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let fake = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut b = [0u8; 1500];
            for _ in 0..2 {
                let (n, from) = up.recv_from(&mut b).unwrap();
                let q = Message::from_vec(&b[..n]).unwrap();
                seen.push((from.port(), q.metadata.id));
                let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
                r.add_query(q.queries[0].clone());
                let name = q.queries[0].name.clone();
                for a in ["198.51.100.7", "10.100.0.2"] {
                    let data = hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A(
                        a.parse().unwrap(),
                    ));
                    r.add_answer(hickory_proto::rr::Record::from_rdata(
                        name.clone(),
                        300,
                        data,
                    ));
                }
                let mut forged = r.clone();
                forged.metadata.id ^= 0x5a5a;
                forged.answers.truncate(0);
                up.send_to(&forged.to_vec().unwrap(), from).unwrap();
                up.send_to(&r.to_vec().unwrap(), from).unwrap();
            }
            seen
        });
        let mut cfg = config();
        cfg.gateway.dns = vec!["192.0.2.53".parse().unwrap()];
        let dns = Dns::new(vec![]);
        dns.follow(&cfg);
        let server = "10.100.0.1:53";
        let q = query(4242, "up.example.", RecordType::A);
        let deadline = Instant::now() + Duration::from_secs(5);
        let m = loop {
            if let Some(m) = ask_udp("10.100.0.2", server, &q) {
                break m;
            }
            assert!(Instant::now() < deadline, "no answer");
        };
        assert_eq!(
            (m.metadata.id, m.metadata.response_code),
            (4242, ResponseCode::NoError)
        );
        let a: Vec<IpAddr> = m.answers.iter().filter_map(|r| r.data.ip_addr()).collect();
        assert_eq!(
            a,
            [IpAddr::from([198, 51, 100, 7])],
            "forged first answer ignored, tunnel address dropped"
        );
        let m = ask_tcp(server, &query(5, "other.example.", RecordType::A));
        assert_eq!(m.answers.len(), 1);
        let seen = fake.join().unwrap();
        assert_ne!(seen[0].0, seen[1].0, "a fresh source port per forward");
        assert!(
            seen.iter().all(|(_, id)| *id != 4242 && *id != 5),
            "fresh IDs"
        );
        // From the cache now: the upstream is gone.
        let m = ask_udp("10.100.0.2", server, &q).unwrap();
        assert_eq!(m.answers.len(), 1);
        let st = dns.stats();
        assert_eq!(
            (st.forwarded, st.cache_hits, st.rebinding_dropped),
            (2, 1, 2)
        );
        assert!(st.mismatched >= 2, "{st:?}");
        dns.stop();
    });
}
