//! Helpers shared by the crate's unit tests: a one-peer device and an `Io` sink that
//! records what the device asked for.

use std::net::SocketAddr;

use crate::core::config::{Config, Endpoint, PeerConfig};
use crate::core::device::{Device, Io, PeerAddr};
use crate::core::key::Key;

/// Everything a device sent and wrote, in order.
#[derive(Default)]
pub struct Wire {
    pub sent: Vec<(PeerAddr, Vec<u8>)>,
    pub tun: Vec<Vec<u8>>,
}

impl Io for Wire {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.sent.push((to, d.to_vec()));
    }
    fn tun_write(&mut self, p: &[u8]) {
        self.tun.push(p.to_vec());
    }
}

/// A device with private key `own` and one peer `peer` (public key derived) that owns
/// `allowed` and sits at `ep`.
pub fn one_peer_device(
    own: Key,
    peer: Key,
    allowed: &str,
    ep: SocketAddr,
    keepalive: Option<u16>,
) -> Device {
    let mut c = Config::default();
    c.interface.private_key = Some(own);
    c.peers.push(PeerConfig {
        public_key: peer.public(),
        preshared_key: None,
        allowed_ips: vec![allowed.parse().expect("test CIDR literal")],
        endpoint: Some(Endpoint::Addr(ep)),
        persistent_keepalive: keepalive,
        tcp_port: None,
        name: None,
    });
    let d = Device::new();
    d.reconfigure(&c).expect("one-peer test config");
    d
}
