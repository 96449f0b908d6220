//! The fallback client ([`FallbackManager`]): moves peers with an `Endpoint` between UDP
//! and TCP as `core::fallback` decides, driven by the timer thread.
//!
//! The fallback machine is fed from the device's per-peer transport counters, sampled by
//! the timer thread (a few times a second), so the packet path does no extra work.
//!
//! Bounded under floods: nothing here keeps per-connection state for connections it did
//! not open. The fallback client learns what became of its own connection by asking the
//! transport ([`TcpHandle::is_connecting`]) on each tick, so the thousands of inbound
//! connections a flood opens and closes leave no trace, whether `TcpFallback` is on or
//! off.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

use crate::core::config::{Config, Endpoint};
use crate::core::device::ConnId;
use crate::core::device::{short, Device, PeerAddr, TransportEvents, SCRATCH_SIZE};
use crate::core::fallback::{Action, Fallback, FallbackConfig, Jitter, Transport};
use crate::core::key::Key;
use crate::driver::dataplane::outbox::{Outbox, Outlets};
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::tcp::link::DeviceSink;

/// One client peer's fallback state.
struct PeerFb {
    fb: Fallback,
    seen: TransportEvents,
    udp: SocketAddr,
    tcp_port: u16,
    conn: Option<OwnConn>,
    logged: Transport,
}

/// The fallback client's own TCP connection.
#[derive(Clone, Copy, Debug)]
struct OwnConn {
    id: ConnId,
    remote: SocketAddr,
    /// `tcp_connected` has been fed for it.
    reported: bool,
}

/// What polling the transport says about the fallback client's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkNews {
    Nothing,
    Connected,
    Failed,
}

/// `state` is [`TcpHandle::is_connecting`] for the connection: `Some(true)` still
/// connecting, `Some(false)` open, `None` gone (refused, failed, closed: ids are never
/// reused, so an id the transport no longer knows is gone for good).
fn link_news(c: &OwnConn, state: Option<bool>) -> LinkNews {
    match state {
        None => LinkNews::Failed,
        Some(false) if !c.reported => LinkNews::Connected,
        Some(_) => LinkNews::Nothing,
    }
}

/// Runs the fallback machines of all peers that have a configured endpoint.
pub struct FallbackManager {
    peers: HashMap<Key, PeerFb>,
    seed: u64,
}

impl Default for FallbackManager {
    fn default() -> Self {
        FallbackManager::new()
    }
}

impl FallbackManager {
    pub fn new() -> FallbackManager {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id());
        FallbackManager {
            peers: HashMap::new(),
            seed,
        }
    }

    /// Keep the set of managed peers in step with the configuration.
    fn sync(&mut self, cfg: &Config) {
        let mut keep = Vec::new();
        for p in &cfg.peers {
            let Some(Endpoint::Addr(ep)) = p.endpoint else {
                continue;
            };
            keep.push(p.public_key);
            let tcp_port = p.tcp_port.unwrap_or(ep.port());
            let e = self.peers.entry(p.public_key).or_insert_with(|| {
                self.seed = self
                    .seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                PeerFb {
                    fb: Fallback::new(FallbackConfig::default(), Jitter::new(self.seed)),
                    seen: TransportEvents::default(),
                    udp: ep,
                    tcp_port,
                    conn: None,
                    logged: Transport::Udp,
                }
            });
            e.udp = ep;
            e.tcp_port = tcp_port;
        }
        self.peers.retain(|k, _| keep.contains(k));
    }

    /// One step: feed new events to each machine and carry out its actions.
    pub fn tick(&mut self, now: Instant, device: &Device, sink: &DeviceSink, sockets: &SocketSet) {
        let Some(handle) = sink.slot.get() else {
            return;
        };
        let cfg = device.config();
        if !cfg.gateway.tcp_fallback {
            return;
        }
        self.sync(&cfg);
        let mut scratch = vec![0u8; SCRATCH_SIZE];
        let mut io = Outbox::default();
        for (key, pf) in self.peers.iter_mut() {
            let Some((cur, _endpoint)) = device.peer_events(key) else {
                continue;
            };
            for (i, t) in [Transport::Udp, Transport::Tcp].into_iter().enumerate() {
                for _ in pf.seen.handshakes_sent[i]..cur.handshakes_sent[i] {
                    pf.fb.handshake_sent(now, t);
                }
                if cur.handshakes_answered[i] > pf.seen.handshakes_answered[i] {
                    pf.fb.handshake_answered(now, t);
                }
                if cur.authenticated_rx[i] > pf.seen.authenticated_rx[i] {
                    pf.fb.authenticated_rx(now, t);
                }
            }
            pf.seen = cur;
            if let Some(c) = pf.conn.as_mut() {
                match link_news(c, handle.is_connecting(c.id)) {
                    LinkNews::Nothing => {}
                    LinkNews::Connected => {
                        c.reported = true;
                        pf.fb.tcp_connected(now);
                    }
                    LinkNews::Failed => {
                        pf.conn = None;
                        pf.fb.tcp_failed(now);
                    }
                }
            }
            while let Some(action) = pf.fb.poll(now) {
                match action {
                    Action::ConnectTcp => {
                        let remote = SocketAddr::new(pf.udp.ip(), pf.tcp_port);
                        match handle.connect(remote) {
                            Ok(id) => {
                                log::info!("peer {}: UDP handshakes unanswered, connecting over TCP to {remote}", short(key));
                                pf.conn = Some(OwnConn {
                                    id,
                                    remote,
                                    reported: false,
                                });
                            }
                            Err(e) => {
                                log::warn!("peer {}: TCP connect to {remote}: {e}", short(key));
                                pf.fb.tcp_failed(now);
                            }
                        }
                    }
                    // Handled below with the silent Connecting -> Tcp transition.
                    Action::SwitchToTcp => pf.logged = Transport::Udp,
                    Action::ProbeUdp => {
                        log::debug!("peer {}: probing UDP {}", short(key), pf.udp);
                        device.force_handshake(key, PeerAddr::Udp(pf.udp), &mut scratch, &mut io);
                    }
                    Action::SwitchToUdp => device.set_endpoint(key, PeerAddr::Udp(pf.udp)),
                    Action::CloseTcp => {
                        if let Some(c) = pf.conn.take() {
                            handle.close(c.id);
                        }
                    }
                }
            }
            let t = pf.fb.transport();
            if t != pf.logged {
                pf.logged = t;
                if t == Transport::Tcp {
                    if let Some(c) = pf.conn {
                        // Move the peer onto the connection and handshake over it; the
                        // answer arriving on TCP confirms the endpoint (roaming).
                        let to = PeerAddr::Tcp {
                            conn: c.id,
                            remote: c.remote,
                        };
                        device.set_endpoint(key, to);
                        device.force_handshake(key, to, &mut scratch, &mut io);
                    }
                } else {
                    device.set_endpoint(key, PeerAddr::Udp(pf.udp));
                }
                log::info!(
                    "peer {}: transport now {}",
                    short(key),
                    if t == Transport::Tcp {
                        "TCP (UDP blocked?)"
                    } else {
                        "UDP"
                    }
                );
            }
        }
        // Handshakes only: nothing here writes to the TUN.
        io.flush(&mut Outlets {
            udp: Some(sockets),
            tcp: Some(&*sink.slot),
            tun: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::tcp::transport::{TcpConfig, TcpSink, TcpTransport};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn link_news_from_polling() {
        let mut c = OwnConn {
            id: 7,
            remote: "192.0.2.1:443".parse().unwrap(),
            reported: false,
        };
        assert_eq!(link_news(&c, Some(true)), LinkNews::Nothing, "connecting");
        assert_eq!(link_news(&c, Some(false)), LinkNews::Connected);
        c.reported = true;
        assert_eq!(link_news(&c, Some(false)), LinkNews::Nothing, "told once");
        assert_eq!(link_news(&c, None), LinkNews::Failed, "gone");
    }

    /// A sink that, like `DeviceSink`, keeps nothing per connection.
    struct Nothing;

    impl TcpSink for Nothing {
        fn on_message(&self, _: ConnId, _: SocketAddr, _: &[u8]) -> bool {
            false
        }
        fn on_closed(&self, _: ConnId) {}
    }

    /// What the fallback client polls: its own connection goes connecting -> open ->
    /// gone, while inbound connections come and go without anything being recorded
    /// for them (the unbounded event lists this replaced grew by one per close).
    #[test]
    fn own_connection_polled_inbound_churn_leaves_nothing() {
        let server = TcpTransport::start(
            TcpConfig {
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                ..TcpConfig::default()
            },
            Arc::new(Nothing),
        )
        .unwrap();
        let addr = server.local_addrs()[0];
        let client = TcpTransport::start(TcpConfig::default(), Arc::new(Nothing)).unwrap();
        let h = client.handle();
        let mut own = OwnConn {
            id: h.connect(addr).unwrap(),
            remote: addr,
            reported: false,
        };
        let mut news = Vec::new();
        for _ in 0..100 {
            match link_news(&own, h.is_connecting(own.id)) {
                LinkNews::Nothing => {}
                LinkNews::Connected => {
                    own.reported = true;
                    news.push(LinkNews::Connected);
                    break;
                }
                LinkNews::Failed => panic!("connection to a listener failed"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(news, [LinkNews::Connected]);
        // Inbound churn on the server: 300 connections open and close.
        for _ in 0..300 {
            // A refused one (a full backlog under load) is churn too.
            let _ = std::net::TcpStream::connect(addr);
        }
        h.close(own.id);
        let mut gone = false;
        for _ in 0..100 {
            if link_news(&own, h.is_connecting(own.id)) == LinkNews::Failed {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone, "a closed connection reads as gone");
        // A refused connect is gone too (nothing listens on the port any more).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let refused = OwnConn {
            id: h.connect(port).unwrap(),
            remote: port,
            reported: false,
        };
        let mut failed = false;
        for _ in 0..100 {
            if link_news(&refused, h.is_connecting(refused.id)) == LinkNews::Failed {
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(failed);
        server.shutdown();
        client.shutdown();
    }
}
