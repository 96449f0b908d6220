//! Helpers shared by the crate's unit tests: a one-peer device and an `Io` sink that
//! records what the device asked for.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::core::net::Cidr;

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

/// xorshift64*: a tiny seeded generator so failures replay.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    pub fn key(&mut self) -> Key {
        let mut k = [0u8; 32];
        for c in k.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        k[0] |= 1; // never the all-zero key
        Key(k)
    }
    pub fn cidr(&mut self, masked: bool) -> Cidr {
        let c = if self.chance(2) {
            let a = Ipv4Addr::from(self.next() as u32);
            Cidr::new(IpAddr::V4(a), self.below(33) as u8)
        } else {
            let a = Ipv6Addr::from(u128::from(self.next()) << 64 | u128::from(self.next()));
            Cidr::new(IpAddr::V6(a), self.below(129) as u8)
        };
        // Cidr::new only fails for prefixes over the maximum, which below() excludes.
        let c = c.unwrap();
        if masked {
            c.network()
        } else {
            c
        }
    }
    pub fn port(&mut self) -> u16 {
        1 + self.below(65535) as u16
    }
}
