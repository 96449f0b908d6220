//! `add client NAME`, `show client NAME`, `show clients`: a phone or laptop added from
//! the console. Everything here works on [`Config`] values and the uplink's addresses
//! handed in (the session asks [`super::system::Hooks::uplink`] for them), so it is
//! tested without a network.
//!
//! - [`allocate`] picks the next free tunnel address: host addresses of the `[Interface]
//!   Address` subnets (IPv4, and IPv6 too when there is an IPv6 Address), skipping the
//!   network and broadcast addresses (IPv6: the subnet-router anycast address), the
//!   gateway's own addresses, every address inside a peer's allowed IPs that lie
//!   within the subnet (a peer prefix covering the whole subnet or more, such as
//!   `0.0.0.0/0` of a site link, is a route, not an allocation), and the addresses the
//!   network uses ([`Uplink::in_use`]: routers, the appliance's addresses on every
//!   interface, the neighbour table's hosts), so a tunnel numbered from the LAN's own
//!   subnet never gives a client the router's address or a LAN host's.
//! - [`add`] generates the client's key pair and a preshared key, and adds the `[Peer]`
//!   (`Name`, public key, PSK, `AllowedIPs` = the /32 and /128) to the candidate.
//! - [`client_config`] writes the client's wg-quick configuration: `AllowedIPs` = the
//!   tunnel subnets and the LAN subnets (`LanAddress` networks with a LAN port, else the
//!   uplink's current subnets: the one-armed deployment), `Endpoint` = `PublicEndpoint`,
//!   else the uplink's current IPv4 address (IPv6 if it has none) and the `ListenPort`.
//! - Every client gets a `DNS` line: `ClientDns`, else the appliance's tunnel addresses (the
//!   resolver on the box, `driver::daemon::dns`, inside every client's `AllowedIPs`); only
//!   a full-tunnel client of a gateway without a tunnel address gets the lease's resolvers.
//! - A **full-tunnel** client (`add client NAME full-tunnel`) gets `AllowedIPs = 0.0.0.0/0,
//!   ::/0`:
//!   all its traffic goes through the gateway, which translates it to the uplink's address
//!   (the firewall's NAT). `::/0` is there even when the tunnel has no IPv6 subnet, so the
//!   client's IPv6 cannot leak around the tunnel: with an IPv6 subnet the client has an
//!   address from it and its IPv6 leaves translated (NAT66); without one, IPv6 is blocked
//!   inside the tunnel. The printed configuration says which in a comment. The gateway's
//!   `[Peer]` is the same as a split-tunnel client's (its /32 and /128 only), so which kind
//!   a client is lives only on the client: `show client NAME full-tunnel` prints it again.
//! - [`set_enabled`]: `disable client NAME` / `enable client NAME` (`Enabled = off/on`;
//!   the keys stay, a disabled client still holds its name, key and addresses).
//! - [`framed`] puts it between the marker lines (scripts and the image test cut it out of
//!   the serial output with them) and draws it as a QR code ([`super::qr`]).

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::core::access::AccessItem;
use crate::core::config::{valid_peer_name, Config, PeerConfig};
use crate::core::key::Key;
use crate::core::net::{ip_bits, ip_from_bits, Cidr};

use super::qr;
use super::system::Uplink;
use super::validate as v;

/// `PersistentKeepalive` of the client's configuration: a phone is usually behind NAT.
pub const KEEPALIVE: u16 = 25;

/// The `PrivateKey` line of a reprinted configuration whose key was not kept.
pub const NOT_STORED: &str = "(not stored: shown once by add client)";

/// The first marker line around a client configuration.
pub fn begin_marker(name: &str) -> String {
    format!("----- BEGIN WIREGUARD CONFIG {name} -----")
}

/// The last marker line around a client configuration.
pub fn end_marker(name: &str) -> String {
    format!("----- END WIREGUARD CONFIG {name} -----")
}

/// The first free host address of `subnet`. `taken`: prefixes already given to peers;
/// `reserved`: single addresses that are not free (the gateway's own). Each step passes
/// a reserved address or a whole taken prefix, so the search ends after at most
/// `reserved.len() + taken.len() + 1` steps, whatever the subnet's size.
pub fn first_free(subnet: &Cidr, taken: &[Cidr], reserved: &[IpAddr]) -> Option<IpAddr> {
    let v4 = subnet.addr.is_ipv4();
    let host_bits = subnet.max_prefix() - subnet.prefix;
    if host_bits == 0 {
        return None;
    }
    let (mut cur, mut last) = subnet.span();
    // The network address (IPv6: subnet-router anycast) and IPv4's broadcast are no
    // hosts, except on point-to-point /31 and /127 prefixes.
    if host_bits >= 2 {
        cur += 1;
        if v4 {
            last -= 1;
        }
    }
    // Only prefixes strictly inside the subnet are allocations.
    let inside: Vec<(u128, u128)> = taken
        .iter()
        .filter(|t| t.addr.is_ipv4() == v4 && t.prefix > subnet.prefix)
        .map(Cidr::span)
        .collect();
    let reserved: Vec<u128> = reserved
        .iter()
        .filter(|a| a.is_ipv4() == v4)
        .map(|a| ip_bits(*a))
        .collect();
    while cur <= last {
        if reserved.contains(&cur) {
            cur = cur.checked_add(1)?;
            continue;
        }
        if let Some(&(_, end)) = inside.iter().find(|(s, e)| *s <= cur && cur <= *e) {
            cur = end.checked_add(1)?;
            continue;
        }
        return Some(ip_from_bits(v4, cur));
    }
    None
}

/// The host prefixes (`/32`, and `/128` when the tunnel has IPv6) for a new client.
/// `reserved`: addresses besides the `[Interface]` ones that are not free, in case the
/// tunnel shares a LAN's subnet: the uplink's and LAN port's addresses, the routers,
/// the neighbour table's hosts ([`Uplink::in_use`]; the console gathers them, this stays
/// pure).
pub fn allocate(cfg: &Config, reserved: &[IpAddr]) -> Result<Vec<Cidr>, String> {
    let ifaddrs = &cfg.interface.addresses;
    if ifaddrs.is_empty() {
        return Err("the tunnel interface has no address, so there is no subnet to give the client an address from: \
                    `set interface address 10.100.0.1/24` first"
            .into());
    }
    let taken: Vec<Cidr> = cfg
        .peers
        .iter()
        .flat_map(|p| p.allowed_ips.iter().copied())
        .collect();
    let mut own: Vec<IpAddr> = ifaddrs.iter().map(|c| c.addr).collect();
    own.extend(cfg.gateway.lan_addresses.iter().map(|c| c.addr));
    own.extend(cfg.gateway.uplink_addresses.iter().map(|c| c.addr));
    own.extend_from_slice(reserved);
    let mut out = Vec::new();
    for v4 in [true, false] {
        let subnets: Vec<&Cidr> = ifaddrs.iter().filter(|c| c.addr.is_ipv4() == v4).collect();
        if subnets.is_empty() {
            continue;
        }
        match subnets.iter().find_map(|s| first_free(s, &taken, &own)) {
            Some(a) => out.push(Cidr {
                addr: a,
                prefix: if v4 { 32 } else { 128 },
            }),
            None => {
                let list: Vec<String> = subnets.iter().map(|s| s.network().to_string()).collect();
                return Err(format!(
                    "no free address left in {} (the gateway's own, network and broadcast addresses and the \
                     peers' allowed IPs are taken): remove a client, or set a wider interface address",
                    list.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn usable_uplink_address(a: &IpAddr) -> bool {
    !a.is_loopback() && !a.is_unspecified() && !crate::core::net::is_link_local(*a)
}

fn private_v4(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(x) => x.is_private() || (x.octets()[0] == 100 && (x.octets()[1] & 0xc0) == 64),
        IpAddr::V6(_) => false,
    }
}

/// A client's wg-quick configuration (the text between the markers) and notes for the
/// user (things to check, said outside the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientText {
    pub config: String,
    pub notes: Vec<String>,
}

/// What the client routes into the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tunnel {
    /// The tunnel and LAN subnets only (the client's internet stays its own).
    #[default]
    Split,
    /// Everything (`0.0.0.0/0, ::/0`), with a `DNS` line.
    Full,
}

/// The comment a full-tunnel configuration carries: where its IPv6 goes.
pub fn full_tunnel_comment(tunnel_has_ipv6: bool) -> &'static str {
    if tunnel_has_ipv6 {
        "# full tunnel: all IPv4 and IPv6 traffic goes through the gateway"
    } else {
        "# full tunnel: all traffic goes through the gateway; ::/0 keeps IPv6 from leaking around it (the tunnel has no IPv6 subnet: IPv6 is blocked)"
    }
}

/// The wg-quick configuration of client `peer` of gateway `cfg`. `private`: the client's
/// private key, `None` when it was not kept (the line then says so). `uplink`: the
/// uplink's current addresses (and lease DNS), or why they are not known.
pub fn client_config(
    cfg: &Config,
    peer: &PeerConfig,
    private: Option<&Key>,
    uplink: &Result<Uplink, String>,
    tunnel: Tunnel,
) -> Result<ClientText, String> {
    let mut notes = Vec::new();
    let gw_key = cfg
        .interface
        .private_key
        .filter(|k| !k.is_zero())
        .ok_or("the gateway has no private key yet: run `genkey` first")?;
    let endpoint = match (&cfg.gateway.public_endpoint, uplink) {
        (Some(e), _) => e.to_string(),
        (None, up) => {
            let port = cfg.interface.listen_port.ok_or(
                "the interface has no listen port, so there is no port for the client to reach: \
                 `set interface listen-port 51820` first",
            )?;
            let up = up.as_ref().map_err(|e| {
                format!(
                    "no endpoint for the client: no `gateway public-endpoint` is set and the uplink's address \
                     is not known ({e}); `set gateway public-endpoint HOST:PORT` (your public address or name \
                     and the port forwarded to this gateway)"
                )
            })?;
            let addrs: Vec<IpAddr> = up
                .addresses
                .iter()
                .map(|c| c.addr)
                .filter(usable_uplink_address)
                .collect();
            let pick = addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or_else(|| addrs.first())
                .ok_or_else(|| {
                    format!(
                        "no endpoint for the client: no `gateway public-endpoint` is set and the uplink {} has no \
                         address yet; `set gateway public-endpoint HOST:PORT` (your public address or name and the \
                         port forwarded to this gateway)",
                        up.name
                    )
                })?;
            if private_v4(pick) {
                notes.push(format!(
                    "the endpoint {pick} is the uplink's private address: it works inside this network; for \
                     phones outside it, forward UDP port {port} on your router and `set gateway public-endpoint \
                     PUBLIC-ADDRESS-OR-NAME:PORT`, then `show client {}`",
                    peer.name.as_deref().unwrap_or("NAME")
                ));
            }
            std::net::SocketAddr::new(*pick, port).to_string()
        }
    };
    let mut allowed: Vec<Cidr> = Vec::new();
    let mut push = |c: Cidr| {
        let n = c.network();
        if !allowed.contains(&n) {
            allowed.push(n);
        }
    };
    let has_v6 = cfg.interface.addresses.iter().any(|a| a.addr.is_ipv6());
    // The printed AllowedIPs follow the client's Access (the gateway enforces it
    // whatever the client routes): a client that may not reach the internet is not
    // printed as full-tunnel, one that may not reach other clients gets the appliance's
    // tunnel address (its resolver, ping) rather than the tunnel's subnet.
    let access = peer.access_under(&cfg.gateway);
    let may = |z: AccessItem| access.contains(&z);
    let tunnel = if tunnel == Tunnel::Full && !may(AccessItem::Internet) {
        notes.push(format!(
            "printed as split tunnel: this client's access ({}) does not include the internet",
            crate::core::access::list_text(&access)
        ));
        Tunnel::Split
    } else {
        tunnel
    };
    if tunnel == Tunnel::Full {
        push(Cidr {
            addr: IpAddr::from([0u8; 4]),
            prefix: 0,
        });
        push(Cidr {
            addr: IpAddr::from([0u16; 8]),
            prefix: 0,
        });
    } else if may(AccessItem::Clients) {
        for a in &cfg.interface.addresses {
            push(*a);
        }
    } else {
        for a in &cfg.interface.addresses {
            push(Cidr {
                addr: a.addr,
                prefix: if a.addr.is_ipv4() { 32 } else { 128 },
            });
        }
    }
    for item in &access {
        if let AccessItem::Prefix { net, .. } = item {
            if tunnel != Tunnel::Full {
                push(*net);
            }
        }
    }
    if tunnel == Tunnel::Full || !may(AccessItem::Lan) {
        // The LAN and uplink subnets are inside 0.0.0.0/0; or not the client's to reach.
    } else if !cfg.gateway.lan.is_empty() {
        if cfg.gateway.lan_addresses.is_empty() {
            notes.push(format!(
                "the LAN port {} has no `gateway lan-address`: the client reaches only the tunnel subnet",
                cfg.gateway.lan
            ));
        }
        for a in &cfg.gateway.lan_addresses {
            push(*a);
        }
    } else {
        match uplink {
            Ok(up) => {
                for a in up
                    .addresses
                    .iter()
                    .filter(|c| usable_uplink_address(&c.addr))
                {
                    push(*a);
                }
            }
            Err(e) => notes.push(format!(
                "the uplink's subnet is not known ({e}): the client reaches only the tunnel subnet"
            )),
        }
    }
    let addresses: Vec<Cidr> = peer.allowed_ips.clone();
    let mut t = String::new();
    t.push_str("[Interface]\n");
    match private {
        Some(k) => {
            let _ = writeln!(t, "PrivateKey = {}", k.to_base64());
        }
        None => {
            let _ = writeln!(t, "PrivateKey = {NOT_STORED}");
        }
    }
    let _ = writeln!(t, "Address = {}", join(&addresses));
    // The resolver on the box (its tunnel addresses) unless `ClientDns` names others; the
    // lease's resolvers only for a full-tunnel client of a gateway without a tunnel
    // address (nothing of ours to point at).
    let own_dns: Vec<IpAddr> = cfg.interface.addresses.iter().map(|a| a.addr).collect();
    let lease_dns: &[IpAddr] = match (tunnel, uplink) {
        (Tunnel::Full, Ok(up)) => &up.dns,
        _ => &[],
    };
    if !cfg.gateway.client_dns.is_empty() {
        let _ = writeln!(t, "DNS = {}", join(&cfg.gateway.client_dns));
    } else if !own_dns.is_empty() {
        let _ = writeln!(t, "DNS = {}", join(&own_dns));
        // The client must route its queries into the tunnel (split tunnel: the tunnel
        // subnet or the appliance's /32 already is; said here so it stays so).
        for a in &own_dns {
            if !allowed.iter().any(|n| n.contains(*a)) {
                allowed.push(Cidr {
                    addr: *a,
                    prefix: if a.is_ipv4() { 32 } else { 128 },
                });
            }
        }
    } else if !lease_dns.is_empty() {
        let _ = writeln!(t, "DNS = {}", join(lease_dns));
    } else if tunnel == Tunnel::Full {
        notes.push(
            "no DNS server for the client: no `gateway client-dns` is set, the tunnel has no address of the \
             appliance's and the uplink has no DHCP lease naming one; the client keeps its own resolver, \
             which may not answer through the full tunnel: `set gateway client-dns IP`"
                .into(),
        );
    }
    t.push_str("[Peer]\n");
    let _ = writeln!(t, "PublicKey = {}", gw_key.public().to_base64());
    if let Some(psk) = &peer.preshared_key {
        let _ = writeln!(t, "PresharedKey = {}", psk.to_base64());
    }
    if tunnel == Tunnel::Full {
        let _ = writeln!(t, "{}", full_tunnel_comment(has_v6));
    }
    let _ = writeln!(t, "AllowedIPs = {}", join(&allowed));
    let _ = writeln!(t, "Endpoint = {endpoint}");
    let _ = writeln!(t, "PersistentKeepalive = {KEEPALIVE}");
    Ok(ClientText { config: t, notes })
}

/// `access: ...` as `show client` and `add client` say it: the list, whether it is the
/// default, and what each zone means on this box.
pub fn describe_access(cfg: &Config, peer: &PeerConfig) -> String {
    let a = peer.access_under(&cfg.gateway);
    let whose = match (&peer.access, cfg.gateway.client_isolation) {
        (Some(_), _) => "its own",
        (None, true) => "the default, less clients: ClientIsolation = on",
        (None, false) => "the default",
    };
    let parts: Vec<String> = a
        .iter()
        .map(|z| match z {
            AccessItem::Lan if cfg.gateway.lan.is_empty() => {
                "lan (the uplink's own subnets)".to_string()
            }
            AccessItem::Lan => format!("lan (the LAN port {})", cfg.gateway.lan),
            AccessItem::Internet => "internet (out of the uplink beyond the LAN)".into(),
            AccessItem::Clients => "clients (other tunnel peers)".into(),
            AccessItem::Appliance => "appliance (SSH, metrics)".into(),
            other => other.to_string(),
        })
        .collect();
    if parts.is_empty() {
        return format!("access: none ({whose}): nothing but ping to the box");
    }
    let dns = if a.iter().any(|i| i.grants_dns()) {
        "; the resolver on the box and ping to it"
    } else {
        "; ping to the box"
    };
    format!("access: {} ({whose}){dns}", parts.join(", "))
}

/// The configuration between its marker lines, then the same as a QR code.
pub fn framed(name: &str, config: &str) -> Result<String, String> {
    let code = qr::render(config)?;
    Ok(format!(
        "{}\n{config}{}\n{code}",
        begin_marker(name),
        end_marker(name)
    ))
}

/// The peer named `name`, if any.
pub fn find<'a>(cfg: &'a Config, name: &str) -> Option<&'a PeerConfig> {
    cfg.peers.iter().find(|p| p.name.as_deref() == Some(name))
}

/// A client name, checked as the configuration file checks it.
pub fn name(s: &str) -> Result<&str, String> {
    if valid_peer_name(s) {
        Ok(s)
    } else {
        Err(format!(
            "`{}` is not a valid client name: expected 1 to 32 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`",
            v::short(s)
        ))
    }
}

/// A client just added: its private key (printed once) and what to print.
#[derive(Debug, Clone)]
pub struct Added {
    pub private_key: Key,
    pub peer: PeerConfig,
    pub text: ClientText,
}

/// Add client `name` to `cfg`: a new key pair and preshared key, the next free
/// address(es), a `[Peer]` with `Name = name` (the same for either [`Tunnel`]). On error
/// `cfg` is unchanged.
pub fn add(
    cfg: &mut Config,
    client: &str,
    uplink: &Result<Uplink, String>,
    tunnel: Tunnel,
    access: Option<Vec<AccessItem>>,
) -> Result<Added, String> {
    let client = name(client)?;
    if find(cfg, client).is_some() {
        return Err(format!(
            "there is already a client (peer) named {client}: `show client {client}` reprints it, \
             `delete client {client}` removes it"
        ));
    }
    if cfg.interface.private_key.filter(|k| !k.is_zero()).is_none() {
        return Err("the gateway has no private key yet: run `genkey` first".into());
    }
    let reserved: Vec<IpAddr> = uplink
        .as_ref()
        .map(|u| {
            u.addresses
                .iter()
                .map(|c| c.addr)
                .chain(u.in_use.iter().copied())
                .collect()
        })
        .unwrap_or_default();
    let addresses = allocate(cfg, &reserved)?;
    let private_key = Key::generate_private(&mut rand_core::OsRng);
    let peer = PeerConfig {
        preshared_key: Some(Key::generate_preshared(&mut rand_core::OsRng)),
        allowed_ips: addresses,
        name: Some(client.to_string()),
        access,
        ..PeerConfig::new(private_key.public())
    };
    let text = client_config(cfg, &peer, Some(&private_key), uplink, tunnel)?;
    cfg.peers.push(peer.clone());
    Ok(Added {
        private_key,
        peer,
        text,
    })
}

/// `disable client NAME` (`enabled` false) / `enable client NAME`: `Enabled = off/on` on
/// the peer named `name`, nothing else (its keys, addresses and a kept key file stay).
/// On error `cfg` is unchanged.
pub fn set_enabled(cfg: &mut Config, client: &str, enabled: bool) -> Result<String, String> {
    let client = name(client)?;
    let Some(p) = cfg
        .peers
        .iter_mut()
        .find(|p| p.name.as_deref() == Some(client))
    else {
        return Err(format!(
            "there is no client named {client} (`show clients` lists them)"
        ));
    };
    let verb = if enabled { "enabled" } else { "disabled" };
    if p.enabled == enabled {
        return Ok(format!(
            "client {client} is already {verb}: nothing changed"
        ));
    }
    p.enabled = enabled;
    Ok(if enabled {
        format!("client {client} enabled in the candidate; `commit` to apply: it can connect again after that")
    } else {
        format!(
            "client {client} disabled in the candidate (its keys and address are kept; `enable client {client}` \
             undoes it); `commit` to apply: it cannot connect after that"
        )
    })
}

/// `show clients`: one line per named peer of `cfg`. `kept(peer)`: whether its private
/// key is kept; `committed(peer)`: whether the running configuration has it.
pub fn list(
    cfg: &Config,
    kept: impl Fn(&PeerConfig) -> bool,
    committed: impl Fn(&PeerConfig) -> bool,
) -> String {
    let named: Vec<&PeerConfig> = cfg.peers.iter().filter(|p| p.name.is_some()).collect();
    if named.is_empty() {
        return "no clients yet (`add client NAME` adds one)".into();
    }
    let w = named
        .iter()
        .filter_map(|p| p.name.as_ref().map(String::len))
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!("{:<w$}  {:<30}  key\n", "name", "address");
    for p in named {
        let _ = writeln!(
            s,
            "{:<w$}  {:<30}  {}{}{}",
            p.name.as_deref().unwrap_or(""),
            join(&p.allowed_ips),
            if kept(p) { "kept" } else { "not kept" },
            if p.enabled { "" } else { "  disabled" },
            if committed(p) {
                ""
            } else {
                "  (not committed yet)"
            }
        );
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Endpoint;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn gateway(addrs: &[&str]) -> Config {
        let mut cfg = Config::default();
        cfg.interface.private_key = Some(Key::generate_private(&mut rand_core::OsRng));
        cfg.interface.listen_port = Some(51820);
        cfg.interface.addresses = addrs.iter().map(|a| c(a)).collect();
        cfg
    }

    fn peer(ips: &[&str]) -> PeerConfig {
        PeerConfig {
            public_key: Key::generate_private(&mut rand_core::OsRng).public(),
            preshared_key: None,
            allowed_ips: ips.iter().map(|a| c(a).network()).collect(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        }
    }

    fn uplink(addrs: &[&str]) -> Result<Uplink, String> {
        Ok(Uplink {
            name: "eth0".into(),
            addresses: addrs.iter().map(|a| c(a)).collect(),
            dns: Vec::new(),
            in_use: Vec::new(),
        })
    }

    fn add_split(cfg: &mut Config, n: &str, up: &Result<Uplink, String>) -> Result<Added, String> {
        add(cfg, n, up, Tunnel::Split, None)
    }

    #[test]
    fn first_free_skips_network_own_taken_and_broadcast() {
        let s = c("10.0.0.1/29"); // hosts .1 to .6
        assert_eq!(first_free(&s, &[], &[ip("10.0.0.1")]), Some(ip("10.0.0.2")));
        // A peer's /31 inside takes .2 and .3; a single address .4.
        let taken = [c("10.0.0.2/31"), c("10.0.0.4/32")];
        assert_eq!(
            first_free(&s, &taken, &[ip("10.0.0.1")]),
            Some(ip("10.0.0.5"))
        );
        // .6 is the last host: .7 (broadcast) is never given.
        let taken = [c("10.0.0.2/31"), c("10.0.0.4/31")];
        assert_eq!(
            first_free(&s, &taken, &[ip("10.0.0.1")]),
            Some(ip("10.0.0.6"))
        );
        let taken = [c("10.0.0.2/31"), c("10.0.0.4/31"), c("10.0.0.6/32")];
        assert_eq!(first_free(&s, &taken, &[ip("10.0.0.1")]), None);
        // Routes covering the whole subnet (a site link's 0.0.0.0/0, the subnet itself)
        // are not allocations.
        let taken = [c("0.0.0.0/0"), c("10.0.0.0/29"), c("10.0.0.0/8")];
        assert_eq!(
            first_free(&s, &taken, &[ip("10.0.0.1")]),
            Some(ip("10.0.0.2"))
        );
        // /31: both addresses are hosts; /32: none.
        assert_eq!(
            first_free(&c("10.0.0.0/31"), &[], &[ip("10.0.0.0")]),
            Some(ip("10.0.0.1"))
        );
        assert_eq!(first_free(&c("10.0.0.1/32"), &[], &[]), None);
        // IPv6: ::0 of the subnet (subnet-router anycast) is skipped, no broadcast.
        assert_eq!(
            first_free(&c("fd00::1/64"), &[c("fd00::2/128")], &[ip("fd00::1")]),
            Some(ip("fd00::3"))
        );
        assert_eq!(
            first_free(&c("fd00::/126"), &[], &[ip("fd00::1"), ip("fd00::2")]),
            Some(ip("fd00::3"))
        );
    }

    /// A huge prefix inside a huge subnet is passed in one step, not address by address.
    #[test]
    fn first_free_is_bounded_by_the_taken_list() {
        let s = c("10.0.0.0/8");
        let taken = [c("10.0.0.0/9"), c("10.128.0.0/10")];
        assert_eq!(first_free(&s, &taken, &[]), Some(ip("10.192.0.0")));
        let s6 = c("fd00::/8");
        let all = [c("fd00::/9"), c("fd80::/9")];
        assert_eq!(first_free(&s6, &all, &[]), None);
        // The last possible address of the IPv6 space does not overflow.
        let top = c("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
        assert_eq!(
            first_free(
                &top,
                &[c("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128")],
                &[]
            ),
            Some(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
        );
        let both = [
            c("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128"),
            c("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
        ];
        assert_eq!(first_free(&top, &both, &[]), None);
    }

    #[test]
    fn allocate_both_families_and_reserved() {
        let mut cfg = gateway(&["10.100.0.1/24", "fd10::1/64"]);
        cfg.peers.push(peer(&["10.100.0.2/32", "fd10::2/128"]));
        cfg.peers.push(peer(&["10.100.0.3/32"]));
        let a = allocate(&cfg, &[ip("10.100.0.4")]).unwrap();
        assert_eq!(a, vec![c("10.100.0.5/32"), c("fd10::3/128")]);
        // IPv4 only.
        let cfg = gateway(&["10.100.0.1/24"]);
        assert_eq!(allocate(&cfg, &[]).unwrap(), vec![c("10.100.0.2/32")]);
        // The first subnet full: the next one of the same family.
        let mut cfg = gateway(&["10.1.0.1/30", "10.2.0.1/24"]);
        cfg.peers.push(peer(&["10.1.0.2/32"]));
        assert_eq!(allocate(&cfg, &[]).unwrap(), vec![c("10.2.0.2/32")]);
        // LAN and uplink addresses of the gateway are its own too.
        let mut cfg = gateway(&["192.168.1.1/24"]);
        cfg.gateway.uplink_addresses = vec![c("192.168.1.2/24")];
        cfg.gateway.lan_addresses = vec![c("192.168.1.3/24")];
        assert_eq!(allocate(&cfg, &[]).unwrap(), vec![c("192.168.1.4/32")]);
    }

    /// The case: `Address = 192.168.1.250/24` on a 192.168.1.0/24 LAN whose router
    /// is 192.168.1.1: the first clients never get the router's address, the uplink's own,
    /// or a LAN host's from the neighbour table.
    #[test]
    fn add_skips_router_own_addresses_and_neighbours() {
        let mut cfg = gateway(&["192.168.1.250/24"]);
        let mut up = uplink(&["192.168.1.20/24"]);
        if let Ok(u) = up.as_mut() {
            // The router (default route, lease), a LAN host seen in the neighbour table,
            // the appliance's address on another interface.
            u.in_use = vec![
                ip("192.168.1.1"),
                ip("192.168.1.2"),
                ip("192.168.1.4"),
                ip("10.0.0.9"),
            ];
        }
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        assert_eq!(a.peer.allowed_ips, vec![c("192.168.1.3/32")]);
        let b = add_split(&mut cfg, "laptop", &up).unwrap();
        assert_eq!(b.peer.allowed_ips, vec![c("192.168.1.5/32")]);
        // The pure allocator alone: the excluded set is its input.
        let cfg = gateway(&["192.168.1.250/24"]);
        let ex = [ip("192.168.1.1"), ip("192.168.1.2"), ip("192.168.1.3")];
        assert_eq!(allocate(&cfg, &ex).unwrap(), vec![c("192.168.1.4/32")]);
        // IPv6 too: a neighbour's address in the tunnel's /64 is skipped.
        let cfg = gateway(&["10.100.0.1/24", "fd10::1/64"]);
        let a = allocate(&cfg, &[ip("fd10::2"), ip("10.100.0.2")]).unwrap();
        assert_eq!(a, vec![c("10.100.0.3/32"), c("fd10::3/128")]);
        // The factory tunnel is untouched by a LAN's router and hosts.
        let mut cfg = gateway(&["10.100.0.1/24"]);
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        assert_eq!(a.peer.allowed_ips, vec![c("10.100.0.2/32")]);
    }

    #[test]
    fn allocate_errors() {
        let e = allocate(&gateway(&[]), &[]).unwrap_err();
        assert!(e.contains("set interface address"), "{e}");
        let mut cfg = gateway(&["10.0.0.1/30"]);
        cfg.peers.push(peer(&["10.0.0.2/32"]));
        let e = allocate(&cfg, &[]).unwrap_err();
        assert!(e.contains("no free address left in 10.0.0.0/30"), "{e}");
        // IPv4 free but IPv6 full: an error, not a half client.
        let mut cfg = gateway(&["10.0.0.1/24", "fd00::1/127"]);
        cfg.peers.push(peer(&["fd00::/128"]));
        assert!(allocate(&cfg, &[])
            .unwrap_err()
            .contains("no free address left in fd00::/127"));
    }

    #[test]
    fn add_builds_peer_and_a_config_that_parses() {
        let mut cfg = gateway(&["10.100.0.1/24", "fd10::1/64"]);
        cfg.gateway.client_dns = vec![ip("192.168.1.1"), ip("fd10::1")];
        let up = uplink(&["192.168.1.20/24", "fe80::1/64", "2001:db8:1::20/64"]);
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        assert_eq!(cfg.peers.len(), 1);
        let p = &cfg.peers[0];
        assert_eq!(p.name.as_deref(), Some("phone"));
        assert_eq!(p.public_key, a.private_key.public());
        assert!(p.preshared_key.is_some());
        assert_eq!(p.allowed_ips, vec![c("10.100.0.2/32"), c("fd10::2/128")]);
        let text = &a.text.config;
        // The printed configuration reads back with the INI reader, as the client's.
        let back = crate::core::ini::parse("client", text).unwrap();
        assert_eq!(back.interface.private_key, Some(a.private_key));
        assert_eq!(back.interface.addresses, p.allowed_ips);
        assert_eq!(back.peers.len(), 1);
        let gp = &back.peers[0];
        assert_eq!(gp.public_key, cfg.interface.private_key.unwrap().public());
        assert_eq!(gp.preshared_key, p.preshared_key);
        assert_eq!(
            gp.allowed_ips,
            vec![
                c("10.100.0.0/24"),
                c("fd10::/64"),
                c("192.168.1.0/24"),
                c("2001:db8:1::/64")
            ],
            "tunnel subnets, then the uplink's (no link-local)"
        );
        assert_eq!(
            gp.endpoint,
            Some(Endpoint::Addr("192.168.1.20:51820".parse().unwrap()))
        );
        assert_eq!(gp.persistent_keepalive, Some(KEEPALIVE));
        assert!(text.contains("\nDNS = 192.168.1.1, fd10::1\n"), "{text}");
        assert!(
            a.text.notes.iter().any(|n| n.contains("private address")),
            "{:?}",
            a.text.notes
        );
        // The next client gets the next address; the name must be new.
        let b = add_split(&mut cfg, "laptop", &up).unwrap();
        assert_eq!(
            b.peer.allowed_ips,
            vec![c("10.100.0.3/32"), c("fd10::3/128")]
        );
        let before = cfg.clone();
        assert!(add_split(&mut cfg, "phone", &up)
            .unwrap_err()
            .contains("already"));
        assert!(add_split(&mut cfg, "-x", &up)
            .unwrap_err()
            .contains("not a valid client name"));
        assert!(add_split(&mut cfg, &"x".repeat(33), &up).is_err());
        assert_eq!(cfg, before);
    }

    #[test]
    fn two_armed_public_endpoint_and_the_resolver_on_the_box() {
        let mut cfg = gateway(&["10.100.0.1/24"]);
        cfg.gateway.lan = "eth1".into();
        cfg.gateway.lan_addresses = vec![c("192.168.50.1/24")];
        cfg.gateway.public_endpoint = Some("vpn.example.net:443".parse().unwrap());
        let a = add_split(&mut cfg, "phone", &Err("no uplink".into())).unwrap();
        let t = &a.text.config;
        // A split-tunnel client asks the appliance too (inside its AllowedIPs).
        assert!(t.contains("\nDNS = 10.100.0.1\n"), "{t}");
        assert!(
            t.contains("AllowedIPs = 10.100.0.0/24, 192.168.50.0/24\n"),
            "{t}"
        );
        assert!(t.contains("Endpoint = vpn.example.net:443\n"), "{t}");
        assert!(a.text.notes.is_empty(), "{:?}", a.text.notes);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "[Interface]");
        assert_eq!(lines[4], "[Peer]");
        assert_eq!(lines.len(), 10, "{t}");
    }

    #[test]
    fn add_errors_change_nothing() {
        let up = uplink(&["192.0.2.10/24"]);
        // No private key.
        let mut cfg = gateway(&["10.0.0.1/24"]);
        cfg.interface.private_key = None;
        assert!(add_split(&mut cfg, "a", &up)
            .unwrap_err()
            .contains("genkey"));
        // No usable endpoint: no public endpoint and the uplink unknown or without address.
        let mut cfg = gateway(&["10.0.0.1/24"]);
        let before = cfg.clone();
        let e = add_split(&mut cfg, "a", &Err("no uplink found".into())).unwrap_err();
        assert!(
            e.contains("no uplink found") && e.contains("public-endpoint"),
            "{e}"
        );
        let e = add_split(&mut cfg, "a", &uplink(&["fe80::1/64"])).unwrap_err();
        assert!(e.contains("has no address yet"), "{e}");
        // No listen port and no public endpoint.
        cfg.interface.listen_port = None;
        assert!(add_split(&mut cfg, "a", &up)
            .unwrap_err()
            .contains("listen-port"));
        cfg.interface.listen_port = Some(51820);
        assert_eq!(cfg, before);
        // An IPv6-only uplink: its global address.
        let a = add_split(&mut cfg, "a", &uplink(&["fe80::1/64", "2001:db8::5/64"])).unwrap();
        assert!(a.text.config.contains("Endpoint = [2001:db8::5]:51820\n"));
    }

    #[test]
    fn reprint_without_key_and_list() {
        let mut cfg = gateway(&["10.100.0.1/24"]);
        let up = uplink(&["203.0.113.7/24"]);
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        let again = client_config(&cfg, &a.peer, None, &up, Tunnel::Split).unwrap();
        assert!(again
            .config
            .contains(&format!("PrivateKey = {NOT_STORED}\n")));
        assert!(
            again.notes.is_empty(),
            "a public uplink address needs no note"
        );
        assert_eq!(
            again.config.replace(NOT_STORED, &a.private_key.to_base64()),
            a.text.config
        );
        let f = framed("phone", &a.text.config).unwrap();
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(lines[0], "----- BEGIN WIREGUARD CONFIG phone -----");
        let end = lines
            .iter()
            .position(|l| *l == "----- END WIREGUARD CONFIG phone -----")
            .unwrap();
        assert_eq!(lines[1..end].join("\n") + "\n", a.text.config);
        assert!(lines[end + 1].chars().all(|ch| ch == qr::FULL));
        let l = list(&cfg, |_| true, |_| false);
        assert!(
            l.contains("phone")
                && l.contains("10.100.0.2/32")
                && l.contains("kept")
                && l.contains("not committed"),
            "{l}"
        );
        assert!(list(&gateway(&[]), |_| true, |_| true).contains("no clients"));
    }

    #[test]
    fn full_tunnel_routes_everything_and_names_a_resolver() {
        // Factory tunnel (IPv4 only), one-armed, DHCP uplink with a resolver.
        let mut cfg = gateway(&["10.100.0.1/24"]);
        let mut up = uplink(&["192.168.1.20/24"]);
        if let Ok(u) = up.as_mut() {
            u.dns = vec![ip("192.168.1.1")];
        }
        let a = add(&mut cfg, "phone", &up, Tunnel::Full, None).unwrap();
        // The gateway's side is the same as for a split-tunnel client.
        assert_eq!(a.peer.allowed_ips, vec![c("10.100.0.2/32")]);
        assert!(a.peer.enabled && a.peer.masquerade);
        let t = &a.text.config;
        assert!(t.contains("\nAllowedIPs = 0.0.0.0/0, ::/0\n"), "{t}");
        assert!(
            t.contains("\nDNS = 10.100.0.1\n"),
            "the resolver on the box: {t}"
        );
        assert!(
            t.contains(&format!("\n{}\n", full_tunnel_comment(false))),
            "{t}"
        );
        assert!(full_tunnel_comment(false).contains("IPv6 is blocked"));
        let back = crate::core::ini::parse("phone", t).unwrap();
        assert_eq!(back.peers[0].allowed_ips, vec![c("0.0.0.0/0"), c("::/0")]);
        assert_eq!(back.interface.addresses, vec![c("10.100.0.2/32")]);
        // ClientDns wins over the lease; with an IPv6 tunnel subnet the client gets an
        // address from it and the comment says its IPv6 goes through too.
        let mut cfg = gateway(&["10.100.0.1/24", "fd10::1/64"]);
        cfg.gateway.client_dns = vec![ip("10.100.0.1")];
        let a = add(&mut cfg, "tab", &up, Tunnel::Full, None).unwrap();
        let t = &a.text.config;
        assert!(
            t.contains("\nAddress = 10.100.0.2/32, fd10::2/128\n"),
            "{t}"
        );
        assert!(t.contains("\nDNS = 10.100.0.1\n"), "{t}");
        assert!(t.contains(full_tunnel_comment(true)), "{t}");
        assert!(
            a.text.notes.iter().all(|n| !n.contains("DNS")),
            "{:?}",
            a.text.notes
        );
        // Without a tunnel address of its own the lease's resolver is named (full
        // tunnel only), and with none known a note says how to give one.
        let mut cfg = gateway(&[]);
        cfg.gateway.public_endpoint = Some("vpn.example.net:51820".parse().unwrap());
        let mut p = peer(&["10.100.0.2/32"]);
        p.name = Some("old".into());
        let t = client_config(&cfg, &p, None, &up, Tunnel::Full)
            .unwrap()
            .config;
        assert!(t.contains("\nDNS = 192.168.1.1\n"), "lease resolver: {t}");
        let t = client_config(&cfg, &p, None, &up, Tunnel::Split)
            .unwrap()
            .config;
        assert!(!t.contains("DNS"), "{t}");
        let a = client_config(&cfg, &p, None, &Err("no uplink".into()), Tunnel::Full).unwrap();
        assert!(!a.config.contains("DNS"), "{}", a.config);
        assert!(
            a.notes.iter().any(|n| n.contains("set gateway client-dns")),
            "{:?}",
            a.notes
        );
        // Split tunnel: the resolver on the box, never the lease's.
        let mut cfg = gateway(&["10.100.0.1/24", "fd10::1/64"]);
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        let t = &a.text.config;
        assert!(
            t.contains("\nDNS = 10.100.0.1, fd10::1\n") && !t.contains('#'),
            "{t}"
        );
        assert!(!t.contains("192.168.1.1\n"), "{t}");
        // Reprinted as full tunnel, it is the same client with the other routes.
        let again = client_config(&cfg, &a.peer, Some(&a.private_key), &up, Tunnel::Full).unwrap();
        assert!(again.config.contains("AllowedIPs = 0.0.0.0/0, ::/0"));
        assert!(again
            .config
            .contains(&format!("PrivateKey = {}", a.private_key.to_base64())));
    }

    #[test]
    fn disable_and_enable_keep_the_client() {
        let mut cfg = gateway(&["10.100.0.1/29"]);
        let up = uplink(&["203.0.113.7/24"]);
        let a = add_split(&mut cfg, "phone", &up).unwrap();
        let before = cfg.clone();
        assert!(set_enabled(&mut cfg, "phone", false)
            .unwrap()
            .contains("disabled"));
        assert!(!cfg.peers[0].enabled);
        let mut want = before.clone();
        want.peers[0].enabled = false;
        assert_eq!(cfg, want, "only Enabled changes");
        assert!(set_enabled(&mut cfg, "phone", false)
            .unwrap()
            .contains("already"));
        let l = list(&cfg, |_| false, |_| true);
        assert!(l.contains("phone") && l.contains("disabled"), "{l}");
        // A disabled client keeps its address: a new one does not get it, nor its name.
        let b = add_split(&mut cfg, "laptop", &up).unwrap();
        assert_eq!(b.peer.allowed_ips, vec![c("10.100.0.3/32")]);
        assert_ne!(b.peer.allowed_ips, a.peer.allowed_ips);
        assert!(add_split(&mut cfg, "phone", &up)
            .unwrap_err()
            .contains("already"));
        assert!(set_enabled(&mut cfg, "phone", true)
            .unwrap()
            .contains("enabled"));
        assert!(cfg.peers[0].enabled);
        let before = cfg.clone();
        assert!(set_enabled(&mut cfg, "nobody", false)
            .unwrap_err()
            .contains("no client named"));
        assert!(set_enabled(&mut cfg, "-x", false)
            .unwrap_err()
            .contains("not a valid"));
        assert_eq!(cfg, before);
    }

    #[test]
    fn printed_allowed_ips_follow_the_access() {
        let mut cfg = gateway(&["10.100.0.1/24"]);
        cfg.gateway.lan = "eth1".into();
        cfg.gateway.lan_addresses = vec![c("192.168.50.1/24")];
        cfg.gateway.public_endpoint = Some("vpn.example.net:443".parse().unwrap());
        let up: Result<Uplink, String> = Err("no uplink".into());
        let lan = crate::core::access::parse_list("lan").unwrap();
        let a = add(&mut cfg, "tv", &up, Tunnel::Full, Some(lan)).unwrap();
        let t = &a.text.config;
        // No internet: not full tunnel; no clients: the appliance's address, not the subnet.
        assert!(
            t.contains("AllowedIPs = 10.100.0.1/32, 192.168.50.0/24\n"),
            "{t}"
        );
        assert!(
            a.text
                .notes
                .iter()
                .any(|n| n.contains("printed as split tunnel")),
            "{:?}",
            a.text.notes
        );
        let one = crate::core::access::parse_list("192.168.50.10/32 tcp 8096").unwrap();
        let b = add(&mut cfg, "kiosk", &up, Tunnel::Split, Some(one)).unwrap();
        assert!(
            b.text
                .config
                .contains("AllowedIPs = 10.100.0.1/32, 192.168.50.10/32\n"),
            "{}",
            b.text.config
        );
        // Isolation: a default client gets the LAN but not the other clients' subnet.
        cfg.gateway.client_isolation = true;
        let c2 = add(&mut cfg, "phone", &up, Tunnel::Full, None).unwrap();
        assert!(c2.text.config.contains("AllowedIPs = 0.0.0.0/0, ::/0\n"));
        let d = add(&mut cfg, "laptop", &up, Tunnel::Split, None).unwrap();
        assert!(
            d.text
                .config
                .contains("AllowedIPs = 10.100.0.1/32, 192.168.50.0/24\n"),
            "{}",
            d.text.config
        );
        assert_eq!(cfg.peers.len(), 4);
        assert!(cfg.peers[0].access.is_some() && cfg.peers[3].access.is_none());
    }
}
