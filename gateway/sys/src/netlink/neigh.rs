//! `RTM_NEWNEIGH`/`RTM_DELNEIGH`/`RTM_GETNEIGH`: the proxy table (proxy ARP / NDP
//! entries we add, tagged with our protocol number, and delete) and the neighbour table
//! (which addresses a host on a port has).

use super::route::RTPROT_RICEGUARD;
use super::{
    attrs, deleted, family, finish, ip_bytes, ip_from, put_attr, put_hdr, Netlink, NetlinkError,
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use std::net::IpAddr;

const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NDA_PROTOCOL: u16 = 12;
const NTF_PROXY: u8 = 0x08;
const NUD_PERMANENT: u16 = 0x80;
// NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT: a host answered
// (or was set by hand); INCOMPLETE and FAILED are addresses no one has.
const NUD_IN_USE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x80;

/// A proxy neighbour entry as the kernel lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyNeighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    /// `NDA_PROTOCOL`, 0 when the entry has none.
    pub protocol: u8,
}

/// A neighbour table entry (not the proxy table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub lladdr: Option<[u8; 6]>,
    /// `ndm_state` (NUD_*).
    pub state: u16,
}

impl Neighbour {
    /// A host has (or recently had) this address on the link: it answered with a
    /// link-layer address, or the entry was set by hand.
    pub fn in_use(&self) -> bool {
        self.lladdr.is_some() && self.state & NUD_IN_USE != 0
    }
}

impl Netlink {
    /// Every proxy neighbour entry (both families, every interface).
    pub fn proxy_neighbours(&mut self) -> Result<Vec<ProxyNeighbour>, NetlinkError> {
        let mut hdr = [0u8; 12];
        hdr[10] = NTF_PROXY; // ndm_flags: the kernel dumps the proxy table
        self.dump_neigh(&hdr, "list proxy neighbours", parse_proxy_neigh)
    }

    /// An `RTM_GETNEIGH` dump with the `ndmsg` header `hdr`, each entry read by `parse`
    /// (`None`: not one of those asked for).
    fn dump_neigh<T>(
        &mut self,
        hdr: &[u8; 12],
        what: &str,
        parse: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<Vec<T>, NetlinkError> {
        let mut out = Vec::new();
        self.dump_each(RTM_GETNEIGH, hdr, what, |kind, p| {
            if kind == RTM_NEWNEIGH {
                out.extend(parse(p));
            }
        })?;
        Ok(out)
    }

    /// Answer ARP (IPv4) or NDP (IPv6) for `addr` on `ifindex`, tagged
    /// [`RTPROT_RICEGUARD`] (`ip neigh add proxy ADDR dev IF`).
    pub fn add_proxy_neighbour(&mut self, ifindex: u32, addr: IpAddr) -> Result<(), NetlinkError> {
        let mut m = Vec::with_capacity(48);
        neigh_msg(
            &mut m,
            RTM_NEWNEIGH,
            NLM_F_CREATE | NLM_F_EXCL,
            self.next_seq(),
            ifindex,
            addr,
        );
        self.request(
            &m,
            &format!("add proxy neighbour {addr} on interface {ifindex}"),
        )
    }

    /// Remove a proxy entry. `Ok(false)`: there was none.
    pub fn delete_proxy_neighbour(
        &mut self,
        ifindex: u32,
        addr: IpAddr,
    ) -> Result<bool, NetlinkError> {
        let mut m = Vec::with_capacity(48);
        neigh_msg(&mut m, RTM_DELNEIGH, 0, self.next_seq(), ifindex, addr);
        deleted(self.request(
            &m,
            &format!("delete proxy neighbour {addr} on interface {ifindex}"),
        ))
    }

    /// Every neighbour table entry of both families (`ip neigh show`).
    pub fn neighbours(&mut self) -> Result<Vec<Neighbour>, NetlinkError> {
        self.dump_neigh(&[0u8; 12], "list neighbours", parse_neigh)
    }
}

/// RTM_NEWNEIGH / RTM_DELNEIGH for a proxy entry.
fn neigh_msg(m: &mut Vec<u8>, kind: u16, extra: u16, seq: u32, ifindex: u32, addr: IpAddr) {
    put_hdr(m, kind, NLM_F_REQUEST | NLM_F_ACK | extra, seq);
    // struct ndmsg { u8 family, u8 pad, u16 pad, i32 ifindex, u16 state, u8 flags, u8 type }
    m.extend_from_slice(&[family(&addr), 0, 0, 0]);
    m.extend_from_slice(&ifindex.to_ne_bytes());
    m.extend_from_slice(&NUD_PERMANENT.to_ne_bytes());
    m.extend_from_slice(&[NTF_PROXY, 0]);
    put_attr(m, NDA_DST, &ip_bytes(&addr));
    if kind == RTM_NEWNEIGH {
        put_attr(m, NDA_PROTOCOL, &[RTPROT_RICEGUARD]);
    }
    finish(m);
}

/// An `RTM_NEWNEIGH` payload of the proxy table; `None` for a normal neighbour.
fn parse_proxy_neigh(p: &[u8]) -> Option<ProxyNeighbour> {
    if p.len() < 12 || p[10] & NTF_PROXY == 0 {
        return None;
    }
    let family = p[0];
    let ifindex = u32::from_ne_bytes([p[4], p[5], p[6], p[7]]);
    let mut addr = None;
    let mut protocol = 0;
    for (k, d) in attrs(&p[12..]) {
        match k {
            NDA_DST => addr = ip_from(family, d),
            NDA_PROTOCOL if d.len() == 1 => protocol = d[0],
            _ => {}
        }
    }
    Some(ProxyNeighbour {
        ifindex,
        addr: addr?,
        protocol,
    })
}

/// An `RTM_NEWNEIGH` payload of the neighbour table; `None` for a proxy entry or what
/// does not read.
fn parse_neigh(p: &[u8]) -> Option<Neighbour> {
    if p.len() < 12 || p[10] & NTF_PROXY != 0 {
        return None;
    }
    let family = p[0];
    let ifindex = u32::from_ne_bytes([p[4], p[5], p[6], p[7]]);
    let state = u16::from_ne_bytes([p[8], p[9]]);
    let mut addr = None;
    let mut lladdr = None;
    for (k, d) in attrs(&p[12..]) {
        match k {
            NDA_DST => addr = ip_from(family, d),
            NDA_LLADDR => lladdr = <[u8; 6]>::try_from(d).ok(),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex,
        addr: addr?,
        lladdr,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{AF_INET, AF_INET6};

    fn neigh(family: u8, state: u16, flags: u8, dst: &[u8], ll: Option<&[u8]>) -> Vec<u8> {
        let mut m = vec![family, 0, 0, 0];
        m.extend_from_slice(&3u32.to_ne_bytes());
        m.extend_from_slice(&state.to_ne_bytes());
        m.extend_from_slice(&[flags, 1]);
        put_attr(&mut m, NDA_DST, dst);
        if let Some(l) = ll {
            put_attr(&mut m, NDA_LLADDR, l);
        }
        m
    }

    #[test]
    fn proxy_neigh_round_trips_through_the_parser() {
        let mut m = Vec::new();
        neigh_msg(
            &mut m,
            RTM_NEWNEIGH,
            NLM_F_CREATE,
            1,
            5,
            "192.168.77.202".parse().unwrap(),
        );
        assert_eq!(m.len(), 16 + 12 + 8 + 8);
        let n = parse_proxy_neigh(&m[16..]).unwrap();
        assert_eq!(n.ifindex, 5);
        assert_eq!(n.addr, "192.168.77.202".parse::<IpAddr>().unwrap());
        assert_eq!(n.protocol, RTPROT_RICEGUARD);
        neigh_msg(&mut m, RTM_DELNEIGH, 0, 2, 5, "fd77::202".parse().unwrap());
        let n = parse_proxy_neigh(&m[16..]).unwrap();
        assert_eq!((n.addr.is_ipv6(), n.protocol), (true, 0));
    }

    #[test]
    fn neighbours_parse_and_say_in_use() {
        let mac = [0xaa, 0xbb, 0xcc, 1, 2, 3];
        let n = parse_neigh(&neigh(AF_INET, 0x02, 0, &[192, 168, 1, 1], Some(&mac))).unwrap();
        assert_eq!(n.ifindex, 3);
        assert_eq!(n.addr, IpAddr::from([192, 168, 1, 1]));
        assert_eq!(n.lladdr, Some(mac));
        assert!(n.in_use());
        // STALE counts; FAILED (0x20) and INCOMPLETE (0x01) with no lladdr do not.
        assert!(
            parse_neigh(&neigh(AF_INET, 0x04, 0, &[10, 0, 0, 1], Some(&mac)))
                .unwrap()
                .in_use()
        );
        assert!(!parse_neigh(&neigh(AF_INET, 0x20, 0, &[10, 0, 0, 1], None))
            .unwrap()
            .in_use());
        assert!(!parse_neigh(&neigh(AF_INET, 0x01, 0, &[10, 0, 0, 1], None))
            .unwrap()
            .in_use());
        let v6 = parse_neigh(&neigh(AF_INET6, 0x02, 0, &[0xfd; 16], Some(&mac))).unwrap();
        assert!(v6.addr.is_ipv6() && v6.in_use());
        // A proxy entry, a short header, a bad address: none.
        assert_eq!(
            parse_neigh(&neigh(AF_INET, 0x80, NTF_PROXY, &[1, 2, 3, 4], None)),
            None
        );
        assert_eq!(parse_neigh(&[2; 11]), None);
        assert_eq!(parse_neigh(&neigh(AF_INET, 2, 0, &[1, 2, 3], None)), None);
    }

    #[test]
    fn garbage_neighbours_are_skipped_not_a_panic() {
        assert_eq!(parse_proxy_neigh(&[2; 11]), None);
        // A normal (not proxy) neighbour, and a proxy entry with a bad attribute length.
        let mut n = vec![2, 0, 0, 0, 1, 0, 0, 0, 0x80, 0, 0, 0];
        assert_eq!(parse_proxy_neigh(&n), None);
        n[10] = NTF_PROXY;
        n.extend_from_slice(&[200, 0, 1, 0, 10, 0, 0, 1]);
        assert_eq!(parse_proxy_neigh(&n), None);
    }
}
