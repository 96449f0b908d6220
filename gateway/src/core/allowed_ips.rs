//! Allowed-IPs longest-prefix-match table. (Interim linear version; replaced by the
//! parsers work.)
use std::net::IpAddr;

use crate::core::net::Cidr;

pub struct AllowedIps<T> {
    entries: Vec<(Cidr, T)>,
}

impl<T> Default for AllowedIps<T> {
    fn default() -> Self {
        AllowedIps { entries: Vec::new() }
    }
}

impl<T> AllowedIps<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, c: Cidr, v: T) -> Option<T> {
        let c = c.network();
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == c) {
            return Some(std::mem::replace(&mut e.1, v));
        }
        self.entries.push((c, v));
        self.entries.sort_by(|a, b| b.0.prefix.cmp(&a.0.prefix));
        None
    }

    pub fn lookup(&self, ip: IpAddr) -> Option<&T> {
        self.entries.iter().find(|e| e.0.contains(ip)).map(|e| &e.1)
    }
}
