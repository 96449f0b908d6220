//! The allowed-IPs table: which peer owns a tunnel destination, by longest-prefix
//! match, for IPv4 and IPv6.
//!
//! Design: one path-compressed binary trie per address family (the shape WireGuard's
//! own tables use), its nodes kept in a `Vec` arena addressed by `u32` indices with a
//! free list. Addresses are held left-aligned in a `u128` (an IPv4 address sits in the
//! top 32 bits), so one code path serves both families.
//!
//! Why a compressed trie rather than one hash map per prefix length: a lookup visits at
//! most one node per *distinct* prefix length on the path (usually a handful), touching
//! no hash function, and never allocates; a hash-map-per-length lookup hashes up to 33
//! or 129 times for a miss. Without path compression a /128 would cost 128 nodes; with
//! it, the table holds at most `2 * len()` nodes.
//!
//! Invariants (checked by the tests against a brute-force reference):
//! - a node's key has no bits set beyond its prefix length;
//! - a child's prefix extends its parent's, and the first bit past the parent's
//!   length selects which child slot it sits in;
//! - a node without a value has exactly two children (intermediate node).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::net::Cidr;

const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node<T> {
    /// Left-aligned prefix bits, masked to `len`.
    key: u128,
    len: u8,
    value: Option<T>,
    child: [u32; 2],
}

/// A longest-prefix-match table from IP prefixes to `T`.
#[derive(Clone, Debug)]
pub struct AllowedIps<T> {
    nodes: Vec<Node<T>>,
    free: Vec<u32>,
    root4: u32,
    root6: u32,
    len: usize,
}

impl<T> Default for AllowedIps<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a node index is stored: a family's root or a child slot of a node.
#[derive(Clone, Copy)]
enum Slot {
    Root4,
    Root6,
    Child(u32, usize),
}

fn mask(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

/// The bit at position `i` (0 = most significant) of a left-aligned key.
fn bit(key: u128, i: u8) -> usize {
    ((key >> (127 - u32::from(i))) & 1) as usize
}

/// `(is_v4, left-aligned masked key, prefix length)` of a CIDR.
fn split(c: Cidr) -> (bool, u128, u8) {
    match c.addr {
        IpAddr::V4(a) => {
            let len = c.prefix.min(32);
            (true, (u128::from(u32::from(a)) << 96) & mask(len), len)
        }
        IpAddr::V6(a) => {
            let len = c.prefix.min(128);
            (false, u128::from(a) & mask(len), len)
        }
    }
}

fn join(v4: bool, key: u128, len: u8) -> Cidr {
    let addr = if v4 {
        // The key of a v4 node only has bits in the top 32.
        IpAddr::V4(Ipv4Addr::from((key >> 96) as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(key))
    };
    Cidr { addr, prefix: len }
}

impl<T> AllowedIps<T> {
    pub fn new() -> Self {
        AllowedIps {
            nodes: Vec::new(),
            free: Vec::new(),
            root4: NONE,
            root6: NONE,
            len: 0,
        }
    }

    /// Number of prefixes in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free.clear();
        self.root4 = NONE;
        self.root6 = NONE;
        self.len = 0;
    }

    fn get_slot(&self, s: Slot) -> u32 {
        match s {
            Slot::Root4 => self.root4,
            Slot::Root6 => self.root6,
            Slot::Child(n, b) => self.nodes[n as usize].child[b],
        }
    }

    fn set_slot(&mut self, s: Slot, v: u32) {
        match s {
            Slot::Root4 => self.root4 = v,
            Slot::Root6 => self.root6 = v,
            Slot::Child(n, b) => self.nodes[n as usize].child[b] = v,
        }
    }

    fn alloc(&mut self, node: Node<T>) -> u32 {
        if let Some(i) = self.free.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            // The table holds at most 2 * len nodes, far below u32::MAX in practice;
            // saturating keeps this total even so.
            u32::try_from(self.nodes.len() - 1).unwrap_or(NONE - 1)
        }
    }

    fn release(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        n.value = None;
        n.child = [NONE, NONE];
        self.free.push(i);
    }

    /// Insert `cidr` (host bits are masked off). Replaces the value of the same prefix
    /// and returns the old one.
    pub fn insert(&mut self, cidr: Cidr, value: T) -> Option<T> {
        let (v4, key, len) = split(cidr);
        let mut slot = if v4 { Slot::Root4 } else { Slot::Root6 };
        loop {
            let cur = self.get_slot(slot);
            if cur == NONE {
                let n = self.alloc(Node {
                    key,
                    len,
                    value: Some(value),
                    child: [NONE, NONE],
                });
                self.set_slot(slot, n);
                self.len += 1;
                return None;
            }
            let (nkey, nlen) = {
                let n = &self.nodes[cur as usize];
                (n.key, n.len)
            };
            let common = ((nkey ^ key).leading_zeros().min(128) as u8)
                .min(nlen)
                .min(len);
            if common == nlen && nlen == len {
                let old = self.nodes[cur as usize].value.replace(value);
                if old.is_none() {
                    self.len += 1;
                }
                return old;
            }
            if common == nlen {
                // The node is a strict prefix of the new key: descend.
                slot = Slot::Child(cur, bit(key, nlen));
                continue;
            }
            if common == len {
                // The new key is a strict prefix of this node: it becomes its parent.
                let mut child = [NONE, NONE];
                child[bit(nkey, len)] = cur;
                let n = self.alloc(Node {
                    key,
                    len,
                    value: Some(value),
                    child,
                });
                self.set_slot(slot, n);
                self.len += 1;
                return None;
            }
            // They diverge below both lengths: a valueless fork holds both.
            let leaf = self.alloc(Node {
                key,
                len,
                value: Some(value),
                child: [NONE, NONE],
            });
            let mut child = [NONE, NONE];
            child[bit(key, common)] = leaf;
            child[bit(nkey, common)] = cur;
            let fork = self.alloc(Node {
                key: key & mask(common),
                len: common,
                value: None,
                child,
            });
            self.set_slot(slot, fork);
            self.len += 1;
            return None;
        }
    }

    /// Exact-prefix lookup (host bits masked).
    pub fn get(&self, cidr: Cidr) -> Option<&T> {
        let (v4, key, len) = split(cidr);
        let mut cur = if v4 { self.root4 } else { self.root6 };
        while cur != NONE {
            let n = &self.nodes[cur as usize];
            if n.len > len || (n.key ^ key) & mask(n.len) != 0 {
                return None;
            }
            if n.len == len {
                return n.value.as_ref();
            }
            cur = n.child[bit(key, n.len)];
        }
        None
    }

    /// Remove an exact prefix (host bits masked); returns its value.
    pub fn remove(&mut self, cidr: Cidr) -> Option<T> {
        let (v4, key, len) = split(cidr);
        let mut parent_slot: Option<Slot> = None;
        let mut slot = if v4 { Slot::Root4 } else { Slot::Root6 };
        let cur = loop {
            let cur = self.get_slot(slot);
            if cur == NONE {
                return None;
            }
            let n = &self.nodes[cur as usize];
            if n.len > len || (n.key ^ key) & mask(n.len) != 0 {
                return None;
            }
            if n.len == len {
                break cur;
            }
            parent_slot = Some(slot);
            slot = Slot::Child(cur, bit(key, n.len));
        };
        let old = self.nodes[cur as usize].value.take()?;
        self.len -= 1;
        let child = self.nodes[cur as usize].child;
        match (child[0] != NONE, child[1] != NONE) {
            (true, true) => {} // stays as a fork
            (true, false) | (false, true) => {
                let only = if child[0] != NONE { child[0] } else { child[1] };
                self.set_slot(slot, only);
                self.release(cur);
            }
            (false, false) => {
                self.set_slot(slot, NONE);
                self.release(cur);
                // A valueless parent left with one child is no longer needed.
                if let (Some(ps), Slot::Child(p, _)) = (parent_slot, slot) {
                    let pn = &self.nodes[p as usize];
                    if pn.value.is_none() {
                        let other = if pn.child[0] != NONE {
                            pn.child[0]
                        } else {
                            pn.child[1]
                        };
                        self.set_slot(ps, other);
                        self.release(p);
                    }
                }
            }
        }
        Some(old)
    }

    /// Longest-prefix match. Allocation-free; visits at most one node per prefix length
    /// present on the path.
    pub fn lookup(&self, ip: IpAddr) -> Option<&T> {
        let (mut cur, key) = match ip {
            IpAddr::V4(a) => (self.root4, u128::from(u32::from(a)) << 96),
            IpAddr::V6(a) => (self.root6, u128::from(a)),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let mut best = None;
        while cur != NONE {
            let n = &self.nodes[cur as usize];
            if (n.key ^ key) & mask(n.len) != 0 {
                break;
            }
            if let Some(v) = n.value.as_ref() {
                best = Some(v);
            }
            if n.len >= max {
                break;
            }
            cur = n.child[bit(key, n.len)];
        }
        best
    }

    /// All entries as `(masked prefix, value)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Cidr, &T)> + '_ {
        let mut stack: Vec<(u32, bool)> = Vec::new();
        if self.root4 != NONE {
            stack.push((self.root4, true));
        }
        if self.root6 != NONE {
            stack.push((self.root6, false));
        }
        std::iter::from_fn(move || {
            while let Some((i, v4)) = stack.pop() {
                let n = &self.nodes[i as usize];
                for c in n.child {
                    if c != NONE {
                        stack.push((c, v4));
                    }
                }
                if let Some(v) = n.value.as_ref() {
                    return Some((join(v4, n.key, n.len), v));
                }
            }
            None
        })
    }

    /// Keep only the entries for which `f` returns true.
    pub fn retain(&mut self, mut f: impl FnMut(Cidr, &T) -> bool) {
        let drop: Vec<Cidr> = self
            .iter()
            .filter(|(c, v)| !f(*c, v))
            .map(|(c, _)| c)
            .collect();
        for c in drop {
            self.remove(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use crate::testutil::Rng;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn basic_longest_prefix() {
        let mut t = AllowedIps::new();
        assert_eq!(t.insert(c("10.0.0.0/8"), 1), None);
        assert_eq!(t.insert(c("10.1.0.0/16"), 2), None);
        assert_eq!(t.insert(c("10.1.2.3/32"), 3), None);
        assert_eq!(t.insert(c("0.0.0.0/0"), 0), None);
        assert_eq!(t.insert(c("::/0"), 6), None);
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(&3));
        assert_eq!(t.lookup(ip("10.1.2.4")), Some(&2));
        assert_eq!(t.lookup(ip("10.2.0.1")), Some(&1));
        assert_eq!(t.lookup(ip("11.0.0.1")), Some(&0));
        assert_eq!(t.lookup(ip("fd00::1")), Some(&6));
        assert_eq!(t.len(), 5);
        // Host bits are masked, so this replaces 10.1.0.0/16.
        assert_eq!(t.insert(c("10.1.9.9/16"), 7), Some(2));
        assert_eq!(t.get(c("10.1.0.0/16")), Some(&7));
        assert_eq!(t.remove(c("10.0.0.0/8")), Some(1));
        assert_eq!(t.remove(c("10.0.0.0/8")), None);
        assert_eq!(t.lookup(ip("10.2.0.1")), Some(&0));
        assert_eq!(t.len(), 4);
        t.retain(|c, _| c.addr.is_ipv6());
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(ip("10.1.2.3")), None);
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.lookup(ip("fd00::1")), None);
    }

    #[test]
    fn families_do_not_mix() {
        let mut t = AllowedIps::new();
        t.insert(c("::/0"), 1);
        assert_eq!(t.lookup(ip("1.2.3.4")), None);
        t.insert(c("0.0.0.0/0"), 2);
        assert_eq!(t.lookup(ip("::ffff:1.2.3.4")), Some(&1));
        let mut all: Vec<_> = t.iter().map(|(c, v)| (c.to_string(), *v)).collect();
        all.sort();
        assert_eq!(
            all,
            vec![("0.0.0.0/0".to_string(), 2), ("::/0".to_string(), 1)]
        );
    }

    /// Reference: a list of masked prefixes, scanned in full for the longest match.
    fn reference_lookup(r: &HashMap<Cidr, u32>, a: IpAddr) -> Option<u32> {
        r.iter()
            .filter(|(c, _)| c.contains(a))
            .max_by_key(|(c, _)| c.prefix)
            .map(|(_, v)| *v)
    }

    fn random_addr(rng: &mut Rng, v4: bool, near: &[Cidr]) -> IpAddr {
        // Bias towards addresses inside existing prefixes so long matches get tested.
        let base = if !near.is_empty() && rng.below(4) != 0 {
            let n = near[rng.below(near.len() as u64) as usize];
            match n.addr {
                IpAddr::V4(a) if v4 => u128::from(u32::from(a)) << 96,
                IpAddr::V6(a) if !v4 => u128::from(a),
                _ => 0,
            }
        } else {
            0
        };
        let noise =
            (u128::from(rng.next()) << 64 | u128::from(rng.next())) >> rng.below(129).min(127);
        let k = base ^ (noise >> rng.below(64));
        if v4 {
            IpAddr::V4(Ipv4Addr::from((k >> 96) as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(k))
        }
    }

    #[test]
    fn matches_brute_force_reference() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut t = AllowedIps::new();
            let mut r: HashMap<Cidr, u32> = HashMap::new();
            let mut known: Vec<Cidr> = Vec::new();
            for step in 0..600u32 {
                let v4 = rng.below(2) == 0;
                let a = random_addr(&mut rng, v4, &known);
                let max = if v4 { 32 } else { 128 };
                // Cluster prefix lengths so that equal-length siblings and nesting occur.
                let plen = match rng.below(4) {
                    0 => rng.below(max + 1) as u8,
                    1 => max as u8,
                    _ => [0u8, 8, 16, 24, 31, 32, 48, 64, 96, 127, 128][rng.below(11) as usize]
                        .min(max as u8),
                };
                let cidr = Cidr::new(a, plen).unwrap().network();
                match rng.below(10) {
                    0..=5 => {
                        assert_eq!(t.insert(cidr, step), r.insert(cidr, step), "insert {cidr}");
                        known.push(cidr);
                    }
                    6..=7 => {
                        let target = if !known.is_empty() && rng.below(2) == 0 {
                            known[rng.below(known.len() as u64) as usize]
                        } else {
                            cidr
                        };
                        assert_eq!(t.remove(target), r.remove(&target), "remove {target}");
                    }
                    8 => {
                        let m = rng.below(7) as u32;
                        t.retain(|_, v| v % 7 != m);
                        r.retain(|_, v| *v % 7 != m);
                    }
                    _ => assert_eq!(t.get(cidr).copied(), r.get(&cidr).copied()),
                }
                assert_eq!(t.len(), r.len());
                for _ in 0..8 {
                    let fam = rng.below(2) == 0;
                    let q = random_addr(&mut rng, fam, &known);
                    assert_eq!(
                        t.lookup(q).copied(),
                        reference_lookup(&r, q),
                        "lookup {q} seed {seed}"
                    );
                }
            }
            let mut got: Vec<(Cidr, u32)> = t.iter().map(|(c, v)| (c, *v)).collect();
            let mut want: Vec<(Cidr, u32)> = r.iter().map(|(c, v)| (*c, *v)).collect();
            got.sort_by_key(|(c, v)| (c.to_string(), *v));
            want.sort_by_key(|(c, v)| (c.to_string(), *v));
            assert_eq!(got, want);
            // Node count stays bounded by 2 * len (forks are cleaned up on removal).
            let live = t.nodes.len() - t.free.len();
            assert!(
                live <= 2 * t.len().max(1),
                "{live} nodes for {} entries",
                t.len()
            );
        }
    }
}
