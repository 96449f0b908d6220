//! Helpers shared by the crate's unit tests: a one-peer device, an `Io` sink that
//! records what the device asked for, a seeded RNG, and [`not_run`] for a test whose
//! kernel feature is missing here.

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
        masquerade: true,
        enabled: true,
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

/// A test cannot run here because the kernel lacks a feature (UDP GSO, io_uring, hugetlb,
/// IPv6...). It says so; with `RG_TEST_STRICT` set (`ci/test.sh unit` sets it: the CI
/// kernel has every feature) it fails instead, so a pass count in CI means the test ran.
/// Tests that need root are `#[ignore]`d with the reason instead.
pub fn not_run(why: &str) {
    if std::env::var_os("RG_TEST_STRICT").is_some() {
        panic!("not run: {why} (RG_TEST_STRICT is set: this machine must run it)");
    }
    eprintln!("not run: {why}");
}

/// An IPv4/UDP packet `src:sport -> dst:dport` with valid IP and UDP checksums (DF set).
pub fn ipv4_udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    use crate::core::gso::checksum;
    let total = 28 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let c = !checksum::fold(checksum::sum(&p[..20], 0));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    let ph = checksum::pseudo_header(&p[12..16], &p[16..20], 17, total - 20);
    let c = !checksum::fold(checksum::sum(&p[20..], ph));
    p[26..28].copy_from_slice(&c.to_be_bytes());
    p
}
