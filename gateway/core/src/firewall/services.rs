//! The appliance's own services (the SSH console, the Prometheus metrics, the DNS forwarder): who may
//! reach them, defined once for the firewall's input rule and for each server's own check
//! of a peer address after `accept` (so `Firewall = off`, or a table another program
//! removed, does not open them to the uplink).
//!
//! The rule, after OpenWrt's LAN zone and dropbear on it:
//! - from the tunnel (its `Address` subnets and the enabled peers' allowed IPs) and from
//!   the LAN port's subnets: yes;
//! - one-armed (no LAN port: the uplink *is* the LAN): from the uplink's own subnets, but
//!   a subnet wider than /16 (IPv6 /48) counts only as the /16 (/48) around the
//!   appliance's address in it, so a lease of a /8 does not widen who may connect;
//! - two-armed, from the uplink: never;
//! - a peer's `0.0.0.0/0` or `::/0` (a hub's routes) says nothing about who is a client
//!   and is left out of the source check (the firewall still admits by interface).

use std::net::IpAddr;

use super::ports::Ports;
use crate::config::Config;
use crate::net::Cidr;

/// The widest uplink subnet whose hosts may reach the services, one-armed (IPv4, IPv6).
pub const WIDEST_UPLINK_V4: u8 = 16;
pub const WIDEST_UPLINK_V6: u8 = 48;

/// A TCP service of the appliance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    pub name: &'static str,
    pub port: u16,
}

/// The services `cfg` runs: SSH once a key is set, the metrics with `Metrics = on`.
pub fn services(cfg: &Config) -> Vec<Service> {
    let g = &cfg.gateway;
    let mut v = Vec::new();
    if !g.ssh_keys.is_empty() {
        v.push(Service {
            name: "ssh",
            port: g.ssh_port,
        });
    }
    if g.metrics {
        v.push(Service {
            name: "metrics",
            port: g.metrics_port,
        });
    }
    v
}

/// One-armed, the uplink subnets whose hosts may reach the services: each of the
/// uplink's own addresses' subnets, cut to /16 (/48) around that address when wider.
/// Two-armed: none.
pub fn uplink_service_nets(p: &Ports) -> Vec<Cidr> {
    if p.lan.is_some() {
        return Vec::new();
    }
    let mut v: Vec<Cidr> = p
        .uplink_addrs
        .iter()
        .filter(|a| !crate::net::is_link_local(a.addr))
        .filter_map(|a| {
            let widest = if a.addr.is_ipv4() {
                WIDEST_UPLINK_V4
            } else {
                WIDEST_UPLINK_V6
            };
            Cidr::new(a.addr, a.prefix.max(widest)).map(|c| c.network())
        })
        .collect();
    v.sort_by_key(Cidr::sort_key);
    v.dedup();
    v
}

/// Where a connection from `src` comes from, as the services judge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Tunnel,
    Lan,
    /// One-armed: a host on the uplink's own subnet (within /16, /48).
    UplinkLan,
    /// Anywhere else: refused.
    Outside,
}

impl Source {
    pub fn allowed(self) -> bool {
        self != Source::Outside
    }
}

/// Judge a peer address of an accepted connection (IPv4-mapped IPv6 addresses, as a
/// dual-stack socket reports IPv4 peers, are read as IPv4).
pub fn source(cfg: &Config, p: &Ports, src: IpAddr) -> Source {
    let src = src.to_canonical();
    let mut tunnel = cfg.interface.addresses.iter().chain(
        cfg.peers
            .iter()
            .filter(|p| p.enabled)
            .flat_map(|p| p.allowed_ips.iter()),
    );
    if tunnel.any(|c| c.prefix > 0 && c.network().contains(src)) {
        return Source::Tunnel;
    }
    if p.lan.is_some() && p.lan_nets.iter().any(|n| n.contains(src)) {
        return Source::Lan;
    }
    if uplink_service_nets(p).iter().any(|n| n.contains(src)) {
        return Source::UplinkLan;
    }
    Source::Outside
}

/// The port the DNS forwarder answers on (UDP and TCP).
pub const DNS_PORT: u16 = 53;

/// Who may ask the DNS forwarder: the tunnel and, two-armed, the LAN port. Never the
/// uplink, one-armed included (the LAN hosts there have their own resolver, and an
/// open resolver on a network we do not own is a reflector): so not [`Source::UplinkLan`].
pub fn dns_source_allowed(cfg: &Config, p: &Ports, src: IpAddr) -> bool {
    matches!(source(cfg, p, src), Source::Tunnel | Source::Lan)
}

/// The addresses the DNS forwarder listens on: the tunnel's (`Address`) and, two-armed,
/// the LAN port's (`LanAddress`); never a wildcard, so nothing listens on the uplink.
pub fn dns_listen_addrs(cfg: &Config) -> Vec<IpAddr> {
    let lan: &[Cidr] = if cfg.gateway.lan.is_empty() {
        &[]
    } else {
        &cfg.gateway.lan_addresses
    };
    let mut v: Vec<IpAddr> = cfg
        .interface
        .addresses
        .iter()
        .chain(lan)
        .map(|c| c.addr)
        .filter(|a| !a.is_unspecified() && !a.is_loopback())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PeerConfig;
    use crate::key::Key;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cfg() -> Config {
        let mut cfg = Config::default();
        cfg.interface.addresses = vec![c("10.100.0.1/24"), c("fd10::1/64")];
        let mut phone = PeerConfig::new(Key([1; 32]));
        phone.allowed_ips = vec![c("10.100.0.2/32")];
        let mut hub = PeerConfig::new(Key([2; 32]));
        hub.allowed_ips = vec![c("0.0.0.0/0"), c("172.16.5.0/24")];
        let mut off = PeerConfig::new(Key([3; 32]));
        off.allowed_ips = vec![c("10.200.0.9/32")];
        off.enabled = false;
        cfg.peers = vec![phone, hub, off];
        cfg
    }

    fn one_armed(addrs: &[&str]) -> Ports {
        Ports {
            tunnel: "wg0".into(),
            uplink_addrs: addrs.iter().map(|s| c(s)).collect(),
            uplink_nets: addrs.iter().map(|s| c(s).network()).collect(),
            ..Ports::default()
        }
    }

    #[test]
    fn tunnel_lan_and_the_one_armed_uplink_subnet() {
        let cfg = cfg();
        let p = one_armed(&["192.168.1.5/24", "2001:db8:1::5/64", "fe80::1/64"]);
        for (src, want) in [
            ("10.100.0.2", Source::Tunnel),
            ("10.100.0.77", Source::Tunnel),
            ("::ffff:10.100.0.2", Source::Tunnel),
            ("fd10::99", Source::Tunnel),
            ("172.16.5.4", Source::Tunnel),
            ("192.168.1.20", Source::UplinkLan),
            ("::ffff:192.168.1.20", Source::UplinkLan),
            ("2001:db8:1::20", Source::UplinkLan),
            // The hub's /0 and a disabled peer make no one a client; link-local is not
            // a subnet that says who is on the LAN.
            ("198.51.100.7", Source::Outside),
            ("10.200.0.9", Source::Outside),
            ("fe80::2", Source::Outside),
            ("192.168.2.1", Source::Outside),
        ] {
            assert_eq!(source(&cfg, &p, ip(src)), want, "{src}");
        }
    }

    /// A lease of a /8 (an IPv6 /32) admits only the /16 (/48) around our address.
    #[test]
    fn wide_uplink_subnets_are_cut_around_our_address() {
        let cfg = cfg();
        let p = one_armed(&["10.7.3.4/8", "2001:db8::5/32"]);
        assert_eq!(
            uplink_service_nets(&p),
            vec![c("10.7.0.0/16"), c("2001:db8::/48")]
        );
        assert_eq!(source(&cfg, &p, ip("10.7.200.1")), Source::UplinkLan);
        assert_eq!(source(&cfg, &p, ip("10.8.0.1")), Source::Outside);
        assert_eq!(source(&cfg, &p, ip("2001:db8:1::1")), Source::Outside);
    }

    /// Two-armed: the LAN port's subnets, never the uplink's.
    #[test]
    fn two_armed_never_from_the_uplink() {
        let cfg = cfg();
        let mut p = one_armed(&["192.0.2.2/24"]);
        p.lan = Some("eth1".into());
        p.lan_nets = vec![c("192.168.50.0/24")];
        assert!(uplink_service_nets(&p).is_empty());
        assert_eq!(source(&cfg, &p, ip("192.168.50.9")), Source::Lan);
        assert_eq!(source(&cfg, &p, ip("192.0.2.77")), Source::Outside);
        assert!(!Source::Outside.allowed() && Source::Lan.allowed());
    }

    #[test]
    fn ssh_is_a_service_once_a_key_is_set() {
        let mut cfg = cfg();
        assert!(services(&cfg).is_empty());
        cfg.gateway.ssh_keys = vec![crate::value::ssh_key(
            "alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC",
        )
        .unwrap()];
        cfg.gateway.ssh_port = 2222;
        assert_eq!(
            services(&cfg),
            vec![Service {
                name: "ssh",
                port: 2222
            }]
        );
        cfg.gateway.metrics = true;
        assert_eq!(
            services(&cfg)[1],
            Service {
                name: "metrics",
                port: crate::config::DEFAULT_METRICS_PORT
            }
        );
    }

    #[test]
    fn dns_from_the_tunnel_and_lan_port_only() {
        let mut cfg = cfg();
        // One-armed: the uplink's own subnet reaches SSH, never DNS.
        let p = one_armed(&["192.168.1.10/24"]);
        assert!(source(&cfg, &p, ip("192.168.1.50")).allowed());
        assert!(!dns_source_allowed(&cfg, &p, ip("192.168.1.50")));
        assert!(dns_source_allowed(&cfg, &p, ip("10.100.0.2")));
        assert!(dns_source_allowed(&cfg, &p, ip("::ffff:10.100.0.2")));
        assert!(!dns_source_allowed(&cfg, &p, ip("198.51.100.7")));
        assert_eq!(dns_listen_addrs(&cfg), [ip("10.100.0.1"), ip("fd10::1")]);
        // Two-armed: the LAN port's subnet and address too; LanAddress without a LAN
        // port is not listened on.
        cfg.gateway.lan_addresses = vec![c("192.168.88.1/24")];
        assert_eq!(dns_listen_addrs(&cfg).len(), 2);
        cfg.gateway.lan = "eth1".into();
        assert_eq!(
            dns_listen_addrs(&cfg),
            [ip("10.100.0.1"), ip("192.168.88.1"), ip("fd10::1")]
        );
        let mut p = one_armed(&["192.168.1.10/24"]);
        p.lan = Some("eth1".into());
        p.lan_nets = vec![c("192.168.88.0/24")];
        assert!(dns_source_allowed(&cfg, &p, ip("192.168.88.20")));
        assert!(!dns_source_allowed(&cfg, &p, ip("192.168.1.50")));
    }
}
