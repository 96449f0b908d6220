//! Helpers for tests of the core and of the crates built on it (feature `testutil`): a
//! one-peer device, an `Io` sink that records what the device asked for, a seeded RNG
//! (also the injected randomness a device's index allocation takes in tests), and a
//! checksummed IPv4/UDP packet builder.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::net::Cidr;

use crate::config::{Config, Endpoint, PeerConfig};
use crate::device::{Device, Io, PeerAddr};
use crate::key::Key;

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
        access: None,
    });
    let d = Device::new(Box::new(Rng(0x5eed)));
    d.reconfigure(&c).expect("one-peer test config");
    d
}

/// xorshift64*: a tiny seeded generator so failures replay.
#[derive(Clone)]
pub struct Rng(pub u64);

// Test randomness only: the seeded generator stands in for the OS source that the
// gateway hands the core (`CryptoRng` is a promise this generator does not keep).
impl rand_core::RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        (Rng::next(self) >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        Rng::next(self)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for c in dest.chunks_mut(8) {
            let b = Rng::next(self).to_le_bytes();
            c.copy_from_slice(&b[..c.len()]);
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}
impl rand_core::CryptoRng for Rng {}
impl Rng {
    // An inherent `next` (not `Iterator`): the tests read `rng.next()` as a draw.
    #[allow(clippy::should_implement_trait)]
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

/// An IPv4/UDP packet `src:sport -> dst:dport` with valid IP and UDP checksums (DF set).
pub fn ipv4_udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    use crate::gso::checksum;
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

/// A fresh private key for a test: distinct on every call in the process (a counter
/// seeds the generator), the same sequence on every run.
pub fn private_key() -> Key {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0x6b65_7973);
    Key::generate_private(&mut Rng(NEXT.fetch_add(0x9e37_79b9, Ordering::Relaxed)))
}

/// Signed update bundles for tests (the format `crate::bundle` reads).
pub mod bundle {
    use crate::bundle::{hex, MAGIC};
    use ed25519_dalek::{Signer, SigningKey};
    use sha2::{Digest, Sha256};

    pub fn test_key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    /// The UKI of a slot in test bundles: `uki` with the slot letter appended.
    pub fn slot_uki(uki: &[u8], slot: u8) -> Vec<u8> {
        let mut v = uki.to_vec();
        v.push(slot);
        v
    }

    pub fn manifest_for(board: &str, root: &[u8], uki: &[u8], extra: &str) -> String {
        let mut m = format!(
            "format 1\nboard {board}\narch x86_64\nversion v2\nbuild 2\ncompat 1\nmin-compat 1\n{extra}part root {} {}\n",
            root.len(),
            hex(&Sha256::digest(root)),
        );
        for s in *b"ab" {
            let u = slot_uki(uki, s);
            m += &format!(
                "part uki-{} {} {}\n",
                s as char,
                u.len(),
                hex(&Sha256::digest(&u))
            );
        }
        m
    }

    /// A whole bundle: header, manifest, parts (root, uki-a, uki-b).
    pub fn make_bundle(key: &SigningKey, manifest: &str, root: &[u8], uki: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
        b.extend_from_slice(&key.sign(manifest.as_bytes()).to_bytes());
        b.extend_from_slice(manifest.as_bytes());
        b.extend_from_slice(root);
        b.extend_from_slice(&slot_uki(uki, b'a'));
        b.extend_from_slice(&slot_uki(uki, b'b'));
        b
    }
}

/// 16 GPT-order bytes of a GUID text (the inverse of `slots::guid_text`).
pub fn guid_bytes(t: &str) -> [u8; 16] {
    let h: Vec<u8> = t
        .replace('-', "")
        .as_bytes()
        .chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap())
        .collect();
    let mut b: [u8; 16] = h.try_into().unwrap();
    b[..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    b
}

/// A disk's first bytes with a GPT: partition `n` has unique GUID `g`.
pub fn gpt_disk(sector: usize, parts: &[(u32, &str)]) -> Vec<u8> {
    let mut d = vec![0u8; sector * 2 + 128 * 128];
    d[sector..sector + 8].copy_from_slice(b"EFI PART");
    d[sector + 72..sector + 80].copy_from_slice(&2u64.to_le_bytes());
    d[sector + 80..sector + 84].copy_from_slice(&128u32.to_le_bytes());
    d[sector + 84..sector + 88].copy_from_slice(&128u32.to_le_bytes());
    for (n, g) in parts {
        let o = sector * 2 + (*n as usize - 1) * 128;
        d[o..o + 16].copy_from_slice(&[0xAA; 16]);
        d[o + 16..o + 32].copy_from_slice(&guid_bytes(g));
    }
    d
}

/// An efivarfs file holding `g` as systemd writes it (attributes, UTF-16LE, NUL).
pub fn efivar_bytes(g: &str) -> Vec<u8> {
    let mut v = vec![6, 0, 0, 0];
    for u in g.encode_utf16().chain([0]) {
        v.extend(u.to_le_bytes());
    }
    v
}

/// A partition GUID for disk `tag`, partition `n`.
pub fn part_guid(tag: u8, n: u32) -> String {
    format!("{tag:02X}{n:06X}-1111-4222-8333-444455556666")
}

/// Builders of firewall rulesets and byte strings, for the nf_tables tests here
/// (`firewall::nft`) and in riceguard-sys (installing them in the kernel).
pub mod nft {
    use crate::firewall::rules::{
        Action, BaseChain, Chain, ChainKind, Hook, Match, Rule, Ruleset, L4, PRIO_FILTER,
    };
    use crate::net::Cidr;

    pub fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }
    pub fn iif(n: &str, eq: bool) -> Match {
        Match::Iif { name: n.into(), eq }
    }
    pub fn oif(n: &str, eq: bool) -> Match {
        Match::Oif { name: n.into(), eq }
    }
    pub fn sa(net: &str, eq: bool) -> Match {
        Match::Saddr { net: cidr(net), eq }
    }
    pub fn da(net: &str, eq: bool) -> Match {
        Match::Daddr { net: cidr(net), eq }
    }
    pub fn l4(p: L4) -> Match {
        Match::L4(p)
    }
    pub fn rule_(matches: Vec<Match>, counter: Option<&str>, action: Action) -> Rule {
        let counter = counter.map(String::from);
        Rule {
            matches,
            counter,
            action,
            comment: "",
        }
    }
    pub fn noted(comment: &'static str, r: Rule) -> Rule {
        Rule { comment, ..r }
    }
    pub fn base(name: &str, kind: ChainKind, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
        let base = Some(BaseChain {
            kind,
            hook,
            priority,
            policy_drop: false,
        });
        Chain {
            name: name.into(),
            base,
            rules,
        }
    }
    pub fn filter(name: &str, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
        base(name, ChainKind::Filter, hook, priority, rules)
    }

    /// Bytes from hex with spaces.
    pub fn hex(s: &str) -> Vec<u8> {
        let h: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
        let byte = |p: &[u8]| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap();
        h.chunks(2).map(byte).collect()
    }

    pub fn tiny() -> Ruleset {
        let r = noted("d", rule_(vec![], Some("c"), Action::Drop));
        let chains = vec![filter("input", Hook::Input, PRIO_FILTER, vec![r])];
        Ruleset {
            table: "rg".into(),
            counters: vec!["c".into()],
            chains,
            maps: Vec::new(),
        }
    }
}
