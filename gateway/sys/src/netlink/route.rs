//! `RTM_NEWROUTE`/`RTM_DELROUTE`/`RTM_GETROUTE`: routes — init's and the DHCP client's
//! (added, replaced, deleted), the tunnel routes the daemon owns (tagged with our
//! protocol number, never replacing anyone's), the kernel's on-link prefix routes the
//! uplink guard removes, and the dump of every route.

use super::{
    attrs, deleted, family, finish, ip_bytes, ip_from, put_attr, put_hdr, u32_from, Netlink,
    NetlinkError, AF_INET, AF_INET6, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use std::net::IpAddr;

use riceguard_core::net::Cidr;
use riceguard_core::netplan::KernelRoute;

const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_KERNEL: u8 = 2;
const RTPROT_BOOT: u8 = 3;
pub(super) const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RT_SCOPE_NOWHERE: u8 = 255;
const RTN_UNICAST: u8 = 1;
const RTM_F_CLONED: u32 = 0x200;

/// The routing protocol number riceguard tags its tunnel routes and proxy entries
/// with (`ip route show proto 91`, `ip neigh show proxy`: `proto 91`). What carries
/// it is ours to delete; nothing else is. 91 is unassigned in iproute2's `rt_protos`.
pub const RTPROT_RICEGUARD: u8 = 91;

/// The metric of our IPv6 tunnel routes: below the 256 the kernel gives a router
/// advertisement's prefix route (and the 1024 of a route without one), so an RA
/// prefix equal to a tunnel route never takes its traffic, not even for the moment
/// before the watch removes it. (IPv4 has no such race: an equal connected route
/// refuses ours outright, which the watch shows and retries.) A delete names no
/// metric and so matches ours whatever it is.
pub const TUNNEL_METRIC6: u32 = 128;

/// A route to add: `dst` via an optional gateway, out of an optional device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: Cidr,
    pub gateway: Option<IpAddr>,
    pub ifindex: Option<u32>,
}

impl Netlink {
    /// Add (or replace) a route in the main table.
    pub fn add_route(&mut self, r: Route) -> Result<(), NetlinkError> {
        let mut m = Vec::with_capacity(80);
        route_msg(&mut m, self.next_seq(), r);
        let via = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        self.request(
            &m,
            &format!("add route {}/{}{via}", r.dst.addr, r.dst.prefix),
        )
    }

    /// Remove a route from the main table; one that is already gone is not an error.
    pub fn delete_route(&mut self, r: Route) -> Result<(), NetlinkError> {
        let mut m = Vec::with_capacity(80);
        route_msg(&mut m, self.next_seq(), r);
        // Same layout as the add, as a delete without create/replace flags.
        m[4..6].copy_from_slice(&RTM_DELROUTE.to_ne_bytes());
        m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        let via = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        deleted(self.request(
            &m,
            &format!("delete route {}/{}{via}", r.dst.addr, r.dst.prefix),
        ))
        .map(|_| ())
    }

    /// Every route of both families, all tables (cloned cache entries left out).
    pub fn routes(&mut self) -> Result<Vec<KernelRoute>, NetlinkError> {
        let mut out = Vec::new();
        self.dump_each(RTM_GETROUTE, &[0u8; 12], "list routes", |kind, p| {
            if kind == RTM_NEWROUTE {
                if let Some(r) = parse_route(p) {
                    out.push(r);
                }
            }
        })?;
        Ok(out)
    }

    /// Add a device route to `dst` out of `ifindex` in the main table, tagged
    /// [`RTPROT_RICEGUARD`]. An existing route to the same prefix (ours, or another
    /// interface's) is refused with `EEXIST`, never replaced.
    pub fn add_owned_route(&mut self, dst: Cidr, ifindex: u32) -> Result<(), NetlinkError> {
        let mut m = Vec::with_capacity(80);
        owned_route_msg(
            &mut m,
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_EXCL,
            self.next_seq(),
            dst,
            ifindex,
        );
        self.request(&m, &format!("add route {}", dst.network()))
    }

    /// Delete our route to `dst` out of `ifindex` (only one tagged with our protocol
    /// matches). `Ok(false)`: there was none.
    pub fn delete_owned_route(&mut self, dst: Cidr, ifindex: u32) -> Result<bool, NetlinkError> {
        let mut m = Vec::with_capacity(80);
        owned_route_msg(&mut m, RTM_DELROUTE, 0, self.next_seq(), dst, ifindex);
        deleted(self.request(&m, &format!("delete route {}", dst.network())))
    }

    /// Delete the kernel's on-link prefix route (`proto kernel`: made for an address
    /// or a router advertisement's prefix) to `dst` on `ifindex`; no other route
    /// matches. `Ok(false)`: there was none.
    pub fn delete_kernel_route(&mut self, dst: Cidr, ifindex: u32) -> Result<bool, NetlinkError> {
        let mut m = Vec::with_capacity(80);
        kernel_route_del_msg(&mut m, self.next_seq(), dst, ifindex);
        deleted(self.request(&m, &format!("delete route {}", dst.network())))
    }
}

fn route_msg(m: &mut Vec<u8>, seq: u32, r: Route) {
    put_hdr(
        m,
        RTM_NEWROUTE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        seq,
    );
    let scope = if r.gateway.is_some() {
        RT_SCOPE_UNIVERSE
    } else {
        RT_SCOPE_LINK
    };
    // struct rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type, u32 flags }
    m.extend_from_slice(&[
        family(&r.dst.addr),
        r.dst.prefix,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_BOOT,
        scope,
        RTN_UNICAST,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    if r.dst.prefix > 0 {
        put_attr(m, RTA_DST, &ip_bytes(&r.dst.network().addr));
    }
    if let Some(g) = r.gateway {
        put_attr(m, RTA_GATEWAY, &ip_bytes(&g));
    }
    if let Some(i) = r.ifindex {
        put_attr(m, RTA_OIF, &i.to_ne_bytes());
    }
    finish(m);
}

/// RTM_NEWROUTE / RTM_DELROUTE for a device route of ours in the main table.
fn owned_route_msg(m: &mut Vec<u8>, kind: u16, extra: u16, seq: u32, dst: Cidr, ifindex: u32) {
    put_hdr(m, kind, NLM_F_REQUEST | NLM_F_ACK | extra, seq);
    let v4 = dst.addr.is_ipv4();
    let scope = match (kind, v4) {
        (RTM_DELROUTE, _) => RT_SCOPE_NOWHERE, // any scope: match on the rest
        (_, true) => RT_SCOPE_LINK,
        (_, false) => RT_SCOPE_UNIVERSE, // as iproute2 does for IPv6
    };
    // struct rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type, u32 flags }
    m.extend_from_slice(&[
        family(&dst.addr),
        dst.prefix,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_RICEGUARD,
        scope,
        RTN_UNICAST,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    if dst.prefix > 0 {
        put_attr(m, RTA_DST, &ip_bytes(&dst.network().addr));
    }
    put_attr(m, RTA_OIF, &ifindex.to_ne_bytes());
    if kind == RTM_NEWROUTE && !v4 {
        put_attr(m, RTA_PRIORITY, &TUNNEL_METRIC6.to_ne_bytes());
    }
    finish(m);
}

/// RTM_DELROUTE for a main-table route of protocol `kernel` to `dst` out of `ifindex`.
fn kernel_route_del_msg(m: &mut Vec<u8>, seq: u32, dst: Cidr, ifindex: u32) {
    put_hdr(m, RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK, seq);
    m.extend_from_slice(&[
        family(&dst.addr),
        dst.prefix,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_KERNEL,
        RT_SCOPE_NOWHERE, // any scope
        RTN_UNICAST,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(m, RTA_DST, &ip_bytes(&dst.network().addr));
    put_attr(m, RTA_OIF, &ifindex.to_ne_bytes());
    finish(m);
}

/// An `RTM_NEWROUTE` payload; `None` for what we cannot read (another family, a
/// cloned cache entry, a bad length).
pub(super) fn parse_route(p: &[u8]) -> Option<KernelRoute> {
    if p.len() < 12 {
        return None;
    }
    let (family, dst_len, table8, protocol, kind) = (p[0], p[1], p[4], p[5], p[7]);
    let flags = u32::from_ne_bytes([p[8], p[9], p[10], p[11]]);
    if flags & RTM_F_CLONED != 0 || (family != AF_INET && family != AF_INET6) {
        return None;
    }
    let mut dst = None;
    let mut oif = None;
    let mut table = u32::from(table8);
    let mut priority = 0;
    let mut gateway = None;
    for (k, d) in attrs(&p[12..]) {
        match k {
            RTA_DST => dst = ip_from(family, d),
            RTA_GATEWAY => gateway = ip_from(family, d),
            RTA_OIF => oif = u32_from(d),
            RTA_TABLE => table = u32_from(d).unwrap_or(table),
            RTA_PRIORITY => priority = u32_from(d).unwrap_or(0),
            _ => {}
        }
    }
    let any = if family == AF_INET {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u8; 16])
    };
    let dst = Cidr::new(dst.unwrap_or(any), dst_len)?;
    Some(KernelRoute {
        dst,
        oif,
        table,
        protocol,
        priority,
        unicast: kind == RTN_UNICAST,
        gateway,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn v6_route_via_gateway() {
        let mut m = Vec::new();
        let r = Route {
            dst: cidr("::/0"),
            gateway: Some("fd00::1".parse().unwrap()),
            ifindex: Some(4),
        };
        route_msg(&mut m, 1, r);
        // Default route: no RTA_DST; gateway (4+16) and oif (4+4).
        assert_eq!(m.len(), 16 + 12 + 20 + 8);
        assert_eq!(m[16], AF_INET6);
        assert_eq!(m[22], RT_SCOPE_UNIVERSE);
    }

    #[test]
    fn device_route_is_link_scope_and_masked() {
        let mut m = Vec::new();
        route_msg(
            &mut m,
            1,
            Route {
                dst: cidr("10.1.2.3/16"),
                gateway: None,
                ifindex: Some(1),
            },
        );
        assert_eq!(m[22], RT_SCOPE_LINK);
        assert_eq!(&m[28..32], &[8, 0, RTA_DST as u8, 0]);
        assert_eq!(&m[32..36], &[10, 1, 0, 0]);
    }

    #[test]
    fn owned_route_round_trips_through_the_parser() {
        let mut m = Vec::new();
        owned_route_msg(
            &mut m,
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_EXCL,
            3,
            cidr("10.66.2.9/24"),
            7,
        );
        let flags = u16::from_ne_bytes([m[6], m[7]]);
        assert_eq!(flags & NLM_F_EXCL, NLM_F_EXCL);
        assert_eq!(
            flags & NLM_F_REPLACE,
            0,
            "never replace someone else's route"
        );
        let r = parse_route(&m[16..]).unwrap();
        assert_eq!(r.dst, cidr("10.66.2.0/24"));
        assert_eq!(
            (r.oif, r.table, r.protocol, r.unicast),
            (Some(7), 254, RTPROT_RICEGUARD, true)
        );
        owned_route_msg(&mut m, RTM_DELROUTE, 0, 4, cidr("fd77::203/128"), 7);
        assert_eq!(m[16 + 6], RT_SCOPE_NOWHERE);
        assert_eq!(parse_route(&m[16..]).unwrap().dst, cidr("fd77::203/128"));
    }

    #[test]
    fn kernel_route_delete_names_protocol_kernel() {
        let mut m = Vec::new();
        kernel_route_del_msg(&mut m, 1, "fd00:251::9/64".parse().unwrap(), 4);
        let r = parse_route(&m[16..]).unwrap();
        assert_eq!(r.dst, "fd00:251::/64".parse().unwrap());
        assert_eq!((r.protocol, r.oif, r.table), (2, Some(4), 254));
    }

    #[test]
    fn garbage_routes_are_refused_not_a_panic() {
        assert_eq!(parse_route(&[2, 24, 0]), None);
        // Every prefix of a valid route message parses or is refused, never panics.
        let mut m = Vec::new();
        owned_route_msg(&mut m, RTM_NEWROUTE, 0, 1, cidr("fd00::/64"), 3);
        for i in 0..m.len() - 16 {
            let _ = parse_route(&m[16..16 + i]);
        }
        // A route with a dst_len past the family's maximum is refused.
        let mut bad = m[16..].to_vec();
        bad[1] = 129;
        assert_eq!(parse_route(&bad), None);
    }
}
