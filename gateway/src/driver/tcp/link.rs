//! Joins the TCP transport (`driver::tcp`) to the WireGuard device: messages arriving on
//! TCP connections go into the device as `PeerAddr::Tcp`, the device's sends to a TCP
//! endpoint go out on that connection, and the fallback client (`core::fallback`) moves
//! peers with an `Endpoint` between UDP and TCP.
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
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use crate::core::config::{Config, Endpoint};
use crate::core::device::ConnId;
use crate::core::device::{short, Device, Io, PeerAddr, TableCache, TransportEvents, SCRATCH_SIZE};
use crate::core::fallback::{Action, Fallback, FallbackConfig, Jitter, Transport};
use crate::core::key::Key;
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::dataplane::tun_batch::write_plain;
use crate::driver::tcp::transport::{TcpConfig, TcpHandle, TcpSink, TcpTransport};
use crate::sys::cmsg::canonical;
use crate::sys::tun::TunQueue;

/// The current TCP transport's handle, replaceable when the listen port changes.
#[derive(Default)]
pub struct TcpSlot {
    handle: RwLock<Option<TcpHandle>>,
}

impl TcpSlot {
    pub fn set(&self, h: Option<TcpHandle>) {
        *self.handle.write().unwrap_or_else(|p| p.into_inner()) = h;
    }

    pub fn get(&self) -> Option<TcpHandle> {
        self.handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl TcpOut for TcpSlot {
    fn send(&self, conn: u64, msg: &[u8]) {
        if let Some(h) = self
            .handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            // A full queue drops the whole packet: the inner TCP recovers.
            let _ = h.send(conn, msg);
        }
    }
}

/// The device's side of the TCP transport.
pub struct DeviceSink {
    device: Arc<Device>,
    sockets: Arc<SocketSet>,
    slot: Arc<TcpSlot>,
    tun: TunQueue,
    vnet_hdr: bool,
    /// The receiving side's working state. Only the transport's one epoll thread calls
    /// `on_message`, so this lock is never contended; it exists because the sink is
    /// shared (`Arc<dyn TcpSink>`), not to serialise threads.
    rx: Mutex<SinkRx>,
}

/// What a worker keeps per thread, for the TCP transport's thread: the table cached per
/// generation (one atomic load per message, as in the UDP workers), the device's
/// scratch, the TUN write buffer, and the deferred sends.
struct SinkRx {
    cache: TableCache,
    scratch: Vec<u8>,
    tunbuf: Vec<u8>,
    deferred: Deferred,
}

impl DeviceSink {
    pub fn new(
        device: Arc<Device>,
        sockets: Arc<SocketSet>,
        slot: Arc<TcpSlot>,
        tun: TunQueue,
        vnet_hdr: bool,
    ) -> DeviceSink {
        let cache = device.cache();
        DeviceSink {
            device,
            sockets,
            slot,
            tun,
            vnet_hdr,
            rx: Mutex::new(SinkRx {
                cache,
                scratch: vec![0u8; SCRATCH_SIZE],
                tunbuf: vec![0u8; SCRATCH_SIZE],
                deferred: Deferred::default(),
            }),
        }
    }
}

/// The device's sink outside the workers (TCP-carried messages, fallback probes): it
/// only records, and [`Deferred::run`] does the sends and TUN writes once the device
/// has returned, so no syscall happens under a peer lock.
#[derive(Default)]
struct Deferred {
    bytes: Vec<u8>,
    sends: Vec<(PeerAddr, usize, usize)>,
    writes: Vec<(usize, usize)>,
}

impl Io for Deferred {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.sends.push((to, self.bytes.len(), d.len()));
        self.bytes.extend_from_slice(d);
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.writes.push((self.bytes.len(), p.len()));
        self.bytes.extend_from_slice(p);
    }
}

/// Where a [`Deferred`]'s sends and writes go.
struct Outlets<'a> {
    sockets: &'a SocketSet,
    slot: &'a TcpSlot,
    tun: &'a TunQueue,
    vnet_hdr: bool,
}

impl Deferred {
    fn run(&mut self, out: &Outlets<'_>, tunbuf: &mut [u8]) {
        for &(to, at, len) in &self.sends {
            let d = &self.bytes[at..at + len];
            match to {
                PeerAddr::Tcp { conn, .. } => out.slot.send(conn, d),
                PeerAddr::Udp(a) => out.sockets.send_sticky(d, a),
            }
        }
        for &(at, len) in &self.writes {
            let p = &self.bytes[at..at + len];
            let _ = write_plain(out.tun, out.vnet_hdr, p, tunbuf);
        }
        self.bytes.clear();
        self.sends.clear();
        self.writes.clear();
    }
}

impl DeviceSink {
    fn outlets(&self) -> Outlets<'_> {
        Outlets {
            sockets: &self.sockets,
            slot: &self.slot,
            tun: &self.tun,
            vnet_hdr: self.vnet_hdr,
        }
    }
}

impl TcpSink for DeviceSink {
    /// The device decides (one place, `Device::handle_datagram`) whether the message
    /// proved a peer's keys; the transport lets only such messages keep the connection.
    fn on_message(&self, conn: ConnId, remote: SocketAddr, msg: &[u8]) -> bool {
        let mut g = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let SinkRx {
            cache,
            scratch,
            tunbuf,
            deferred,
        } = &mut *g;
        let table = cache.get(&self.device);
        let from = PeerAddr::Tcp {
            conn,
            remote: canonical(remote),
        };
        let authenticated = self
            .device
            .handle_datagram(table, from, msg, scratch, deferred);
        deferred.run(&self.outlets(), tunbuf);
        authenticated
    }

    // Deliberately records nothing: the fallback client polls its own connection (see
    // the module doc), so closes of inbound connections cannot pile up here.
    fn on_closed(&self, _conn: ConnId) {}
}

/// Start a transport listening on `ports` (`[::]:port`, IPv4 too).
pub fn start_transport(
    cfg: &Config,
    ports: &[u16],
    sink: Arc<DeviceSink>,
) -> std::io::Result<TcpTransport> {
    TcpTransport::start(transport_config(cfg, ports), sink)
}

/// The transport's settings for `cfg` listening on `ports`: the `[Gateway]` ones, and
/// the interface's fwmark on every socket, as the UDP sockets have it (else, under
/// wg-quick's `not fwmark` rule, the fallback's own packets would be routed into the
/// tunnel they carry).
pub fn transport_config(cfg: &Config, ports: &[u16]) -> TcpConfig {
    let mut g = cfg.gateway.clone();
    g.tcp_listen = ports.to_vec();
    let mut t = TcpConfig::from_gateway(&g);
    t.tuning.fwmark = cfg.interface.fwmark;
    t
}

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
        let mut tunbuf = [0u8; 0];
        let mut io = Deferred::default();
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
        let out = Outlets {
            sockets,
            slot: &sink.slot,
            tun: &sink.tun,
            vnet_hdr: false,
        };
        io.run(&out, &mut tunbuf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::tcp::transport::TcpConfig;
    use std::time::Duration;

    #[test]
    fn transport_config_takes_the_interface_fwmark() {
        let mut cfg = Config::default();
        cfg.gateway.bbr_rtt_ms = 40;
        let t = transport_config(&cfg, &[443]);
        assert_eq!(t.tuning.fwmark, None);
        assert_eq!(t.listen, vec!["[::]:443".parse().unwrap()]);
        cfg.interface.fwmark = Some(51820);
        let t = transport_config(&cfg, &[]);
        assert_eq!(t.tuning.fwmark, Some(51820));
        assert!(t.listen.is_empty());
    }

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
