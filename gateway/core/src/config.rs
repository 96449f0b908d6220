//! The one configuration format: wg-quick-style INI (`[Interface]`, `[Peer]`) plus a
//! `[Gateway]` section for appliance settings. Read by `riceguard up --config`, written
//! by the console, kept on `perm`.
//!
//! This module owns the types and their validation; parsing and emitting live in
//! [`crate::ini`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::key::Key;
use crate::net::Cidr;

/// A whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub interface: InterfaceConfig,
    pub peers: Vec<PeerConfig>,
    pub gateway: GatewayConfig,
}

/// `[Interface]`
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceConfig {
    pub private_key: Option<Key>,
    /// UDP listen port; `None` means pick a free one (as `wg` does).
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    /// Addresses put on the tunnel interface (`Address = 10.0.0.1/24, fd00::1/64`).
    pub addresses: Vec<Cidr>,
    /// Tunnel MTU; `None` means 1420 (riceguard keeps it over its TCP fallback: frames
    /// in a byte stream do not fragment).
    pub mtu: Option<u16>,
}

/// `[Peer]`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    pub public_key: Key,
    pub preshared_key: Option<Key>,
    pub allowed_ips: Vec<Cidr>,
    /// `HOST:PORT`; host names are resolved when the config is loaded.
    pub endpoint: Option<Endpoint>,
    pub persistent_keepalive: Option<u16>,
    /// TCP port to use for this peer's fallback (`TcpPort =`); default is the endpoint's port.
    pub tcp_port: Option<u16>,
    /// `Name = phone`: the console's handle for a client (`add client NAME`); riceguard's
    /// extension, not sent over UAPI. 1-32 of `A-Za-z0-9._-`, unique among the peers.
    pub name: Option<String>,
    /// `[Peer] Masquerade = off`: traffic from this peer's allowed IPs leaves by the uplink
    /// with its own source address (a site whose router routes back to them). Default on:
    /// what `Masquerade =` in `[Gateway]` decides applies.
    pub masquerade: bool,
    /// `[Peer] Enabled = off`: kept in the file with its keys (`disable client NAME`), but
    /// not given to the data plane, routed, proxied or let through the firewall.
    pub enabled: bool,
    /// `[Peer] Access = lan, internet, ...` (schema 6): where this peer's traffic may go
    /// through the appliance (`core::access`). `None`: the default, every zone (less
    /// `clients` with `ClientIsolation = on`); `Some(empty)`: `none`.
    pub access: Option<Vec<crate::access::AccessItem>>,
}

impl PeerConfig {
    /// What this peer may reach under gateway settings `g`: its `Access`, else the
    /// default (every zone, less `clients` with `ClientIsolation = on`).
    pub fn access_under(&self, g: &GatewayConfig) -> Vec<crate::access::AccessItem> {
        match &self.access {
            Some(v) => v.clone(),
            None => crate::access::default_access(g.client_isolation),
        }
    }

    /// A peer with only its key: no allowed IPs, endpoint, keepalive or name.
    pub fn new(public_key: Key) -> PeerConfig {
        PeerConfig {
            public_key,
            preshared_key: None,
            allowed_ips: Vec::new(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        }
    }
}

/// Source NAT on the uplink (`Masquerade =` in `[Gateway]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MasqueradeMode {
    /// Translate what the uplink's network cannot route back: tunnel and LAN-port sources
    /// leaving by the uplink that are not inside one of the uplink's own subnets (those
    /// are answered for by proxy ARP/NDP), except peers with `Masquerade = off`.
    #[default]
    Auto,
    /// Translate everything from the tunnel and the LAN port leaving by the uplink.
    On,
    /// Translate nothing.
    Off,
}

impl MasqueradeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MasqueradeMode::Auto => "auto",
            MasqueradeMode::On => "on",
            MasqueradeMode::Off => "off",
        }
    }

    pub fn parse(v: &str) -> Option<MasqueradeMode> {
        match v.to_ascii_lowercase().as_str() {
            "auto" => Some(MasqueradeMode::Auto),
            "on" => Some(MasqueradeMode::On),
            "off" => Some(MasqueradeMode::Off),
            _ => None,
        }
    }
}

/// `UplinkOverlap =`: what an uplink lease or router advertisement may overlap of the
/// tunnel's routes (a peer's AllowedIPs, the tunnel's own subnets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverlapPolicy {
    /// Decline a lease or ignore an RA prefix that equals a tunnel route or lies inside
    /// one of /16 (IPv6: /48) or longer: the uplink and a remote site cannot be one
    /// network. A narrower part of a wide summary route (a hub's 10.0.0.0/8 over a 10.x
    /// uplink) is kept, and `show status` says which part of which peer it shadows.
    #[default]
    Auto,
    /// Decline every lease, ignore every RA prefix, that overlaps a tunnel route.
    Refuse,
}

impl OverlapPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Auto => "auto",
            OverlapPolicy::Refuse => "refuse",
        }
    }

    pub fn parse(v: &str) -> Option<OverlapPolicy> {
        match v.to_ascii_lowercase().as_str() {
            "auto" => Some(OverlapPolicy::Auto),
            "refuse" => Some(OverlapPolicy::Refuse),
            _ => None,
        }
    }
}

/// One `Ntp =` server: a host name or an IP address, and the port (123 unless given as
/// `HOST:PORT`, `[V6]:PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NtpServer {
    pub host: String,
    pub port: u16,
}

/// The NTP port.
pub const NTP_PORT: u16 = 123;

impl NtpServer {
    /// `pool.example.net`, `192.0.2.1`, `2001:db8::1`, `192.0.2.1:1123`,
    /// `[2001:db8::1]:1123`, `ntp.example.net:1123`.
    pub fn parse(v: &str) -> Result<NtpServer, String> {
        let bad = || {
            format!(
                "expected an NTP server (a host name or an IP address, optionally :PORT), got `{}`",
                v.chars().take(64).collect::<String>()
            )
        };
        let v = v.trim();
        if let Ok(ip) = v.parse::<IpAddr>() {
            return Ok(NtpServer {
                host: ip.to_string(),
                port: NTP_PORT,
            });
        }
        if v.contains(':') {
            // `HOST:PORT` and `[V6]:PORT`, by the endpoint grammar.
            return match v.parse::<Endpoint>().map_err(|_| bad())? {
                Endpoint::Addr(sa) => Ok(NtpServer {
                    host: sa.ip().to_string(),
                    port: sa.port(),
                }),
                Endpoint::Name { host, port } => Ok(NtpServer {
                    host: host.to_ascii_lowercase(),
                    port,
                }),
            };
        }
        if !valid_host_name(v) || v.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad());
        }
        Ok(NtpServer {
            host: v.to_ascii_lowercase(),
            port: NTP_PORT,
        })
    }
}

impl std::fmt::Display for NtpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.port, self.host.parse::<IpAddr>()) {
            (NTP_PORT, _) => f.write_str(&self.host),
            (p, Ok(IpAddr::V6(a))) => write!(f, "[{a}]:{p}"),
            (p, _) => write!(f, "{}:{p}", self.host),
        }
    }
}

impl Config {
    /// What the daemon runs: the peers with `Enabled = off` left out (kept in the file
    /// with their keys, but not given to the data plane, routed, proxied or let through
    /// the firewall).
    pub fn running(&self) -> Config {
        let mut c = self.clone();
        c.peers.retain(|p| p.enabled);
        c
    }
}

/// A peer endpoint as written: either an address or a name to resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Addr(SocketAddr),
    Name { host: String, port: u16 },
}

/// Which data-plane path to force (`Offload =`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OffloadMode {
    /// Hardware USO if the NIC can, else software GSO, else batched sendmmsg.
    #[default]
    Auto,
    /// Kernel software GSO (`UDP_SEGMENT`), never touching NIC features.
    Gso,
    /// Batched `sendmmsg`/`recvmmsg`, no segmentation offload.
    Mmsg,
    /// One datagram per syscall.
    Off,
}

/// How a data-plane worker waits for work (`Poll =` in `[Gateway]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// Sleep in the kernel as soon as there is nothing to do (the default: cores may be
    /// shared with other work, where spinning only steals their time).
    #[default]
    Sleep,
    /// Keep polling for a short, bounded time after traffic before sleeping: fewer
    /// wake-ups when data-plane cores are the workers' own.
    Adaptive,
    /// Never sleep: dedicated cores, lowest latency, one core busy per worker.
    Busy,
}

impl PollMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PollMode::Sleep => "sleep",
            PollMode::Adaptive => "adaptive",
            PollMode::Busy => "busy",
        }
    }

    pub fn parse(v: &str) -> Option<PollMode> {
        match v.to_ascii_lowercase().as_str() {
            "sleep" => Some(PollMode::Sleep),
            "adaptive" => Some(PollMode::Adaptive),
            "busy" => Some(PollMode::Busy),
            _ => None,
        }
    }
}

/// `[Gateway]`: appliance settings that wg-quick does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Interface name of the tunnel (default `wg0`).
    pub interface_name: String,
    /// Cores for the data-plane workers; empty means all online cores.
    pub cores: Vec<usize>,
    pub io_uring: bool,
    /// How an idle worker waits (`Poll =`).
    pub poll: PollMode,
    /// `SqPoll = on`: each io_uring gets a kernel thread that polls its submission queue
    /// (no `io_uring_enter` to submit; for dedicated cores, costs a busy kernel thread).
    pub sqpoll: bool,
    pub offload: OffloadMode,
    pub tun_offload: bool,
    pub hugepages: bool,
    /// Buffers per worker pool.
    pub buffers: u32,
    /// TCP ports the gateway listens on for the fallback transport. Empty: none.
    pub tcp_listen: Vec<u16>,
    /// Act as a TCP-fallback client for peers with endpoints.
    pub tcp_fallback: bool,
    /// Smoothed RTT (ms) above which TCP connections switch to `bbr`.
    pub bbr_rtt_ms: u32,
    /// Egress NIC whose offloads are inspected and which init configures; empty: the
    /// one with the default route (on the appliance: the first Ethernet NIC).
    pub uplink: String,
    /// Static addresses for the uplink (`UplinkAddress = 192.0.2.2/24`); empty: leave as is.
    pub uplink_addresses: Vec<Cidr>,
    /// Default gateway for the uplink (`UplinkGateway = 192.0.2.1`). With no
    /// `UplinkAddress` the uplink is configured by DHCP (and SLAAC for IPv6).
    pub uplink_gateway: Option<std::net::IpAddr>,
    /// Two-armed deployment: the LAN port (`Lan = eth1`), routed to and from the tunnel.
    /// Empty: one-armed (the uplink is the LAN).
    pub lan: String,
    /// Addresses of the LAN port (`LanAddress = 192.168.50.1/24`).
    pub lan_addresses: Vec<Cidr>,
    /// `ProxyArp = on` (default): answer ARP/NDP on the uplink and LAN port for peer host
    /// addresses (`/32`, `/128` allowed IPs) inside those ports' subnets, so LAN hosts reach
    /// peers numbered from the LAN subnet without routes (the one-armed deployment).
    pub proxy_arp: bool,
    /// What `add client` prints as the client's `Endpoint` (`PublicEndpoint =
    /// vpn.example.net:51820`); unset: the uplink's address and the listen port.
    pub public_endpoint: Option<Endpoint>,
    /// `DNS =` line of the configurations `add client` prints (`ClientDns = 192.168.1.1`).
    pub client_dns: Vec<std::net::IpAddr>,
    /// `Firewall = on` (default): the appliance's nf_tables ruleset (zones uplink, LAN
    /// port, tunnel; see `core::firewall`). `off`: the table is removed, nothing filtered
    /// or translated by riceguard.
    pub firewall: bool,
    /// `Masquerade = auto | on | off` (needs `Firewall = on`).
    pub masquerade: MasqueradeMode,
    /// `Ntp = ...`: the SNTP servers, tried before the DHCP lease's (option 42). Empty:
    /// the lease's, else none (the clock stays at its floor; `show status` says so).
    pub ntp: Vec<NtpServer>,
    /// `UplinkOverlap = auto | refuse`: what the uplink's lease and RAs may overlap of
    /// the tunnel's routes.
    pub uplink_overlap: OverlapPolicy,
    /// `SshKey = NAME TYPE BASE64 [COMMENT]`: the keys that may log in to the console
    /// over SSH (`riceguard ssh`). Empty: nothing listens.
    pub ssh_keys: Vec<SshKey>,
    /// `SshPort`: the TCP port `riceguard ssh` listens on (default 22).
    pub ssh_port: u16,
    /// `Metrics = on|off`: the Prometheus endpoint on the tunnel and LAN sides (default
    /// off: it shows peers' names and keys to whoever reaches it).
    pub metrics: bool,
    /// `MetricsPort`: its TCP port (default 9586, the WireGuard exporter's).
    pub metrics_port: u16,
    /// `Syslog = host[:port][/tcp]`: the collector every service's log lines go to.
    pub syslog: Option<SyslogTarget>,
    /// `ClientIsolation = on` (schema 6): `clients` is not in the default `Access`, so
    /// tunnel peers without an `Access` of their own cannot start traffic to each other.
    pub client_isolation: bool,
    /// `Dns = ...` (schema 6): the upstream servers of the resolver on the box. Empty: the
    /// uplink lease's.
    pub dns: Vec<std::net::IpAddr>,
    /// `Domain = NAME` (schema 6): the resolver answers the clients' names under it
    /// (`phone.home.arpa`). Unset: [`DEFAULT_DOMAIN`].
    pub domain: Option<String>,
}

/// The resolver's domain when `Domain` is not set: RFC 8375's name for home networks,
/// which no public DNS answers and no future TLD can take (`lan` is neither reserved nor
/// special-use).
pub const DEFAULT_DOMAIN: &str = "home.arpa";

impl GatewayConfig {
    /// `Domain`, or [`DEFAULT_DOMAIN`].
    pub fn domain_name(&self) -> &str {
        self.domain.as_deref().unwrap_or(DEFAULT_DOMAIN)
    }
}

/// The metrics endpoint's port when `MetricsPort` is not set: the one the common
/// WireGuard exporter (prometheus_wireguard_exporter) uses, so scrape configs carry over.
pub const DEFAULT_METRICS_PORT: u16 = 9586;

/// The syslog port (RFC 5426 for UDP; RFC 6587's collectors listen on it for TCP too).
pub const SYSLOG_PORT: u16 = 514;

/// `Syslog =`: a host name or an IP address, a port (514 unless given) and the transport
/// (UDP unless `/tcp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyslogTarget {
    pub host: String,
    pub port: u16,
    pub tcp: bool,
}

impl SyslogTarget {
    /// `192.0.2.1`, `logs.example.net:1514`, `[2001:db8::1]:514/tcp`, `2001:db8::1`.
    pub fn parse(v: &str) -> Result<SyslogTarget, String> {
        let bad = || {
            format!(
                "expected a syslog collector: HOST[:PORT][/tcp] (a host name or an IP address), got `{}`",
                v.chars().take(64).collect::<String>()
            )
        };
        let v = v.trim();
        let (hostport, tcp) = match v.rsplit_once('/') {
            Some((h, t)) if t.eq_ignore_ascii_case("tcp") => (h, true),
            Some((h, t)) if t.eq_ignore_ascii_case("udp") => (h, false),
            Some(_) => return Err(bad()),
            None => (v, false),
        };
        // The host and port grammar is NTP's (`HOST`, `IP`, `HOST:PORT`, `[V6]:PORT`).
        let n = NtpServer::parse(hostport).map_err(|_| bad())?;
        // A bare address or name (an IPv6 literal has colons but no port) takes 514.
        let port_given = hostport.parse::<IpAddr>().is_err() && hostport.contains(':');
        let port = if port_given { n.port } else { SYSLOG_PORT };
        Ok(SyslogTarget {
            host: n.host,
            port,
            tcp,
        })
    }
}

impl std::fmt::Display for SyslogTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.port, self.host.parse::<IpAddr>()) {
            (SYSLOG_PORT, _) => f.write_str(&self.host)?,
            (p, Ok(IpAddr::V6(a))) => write!(f, "[{a}]:{p}")?,
            (p, _) => write!(f, "{}:{p}", self.host)?,
        }
        if self.tcp {
            f.write_str("/tcp")?;
        }
        Ok(())
    }
}

/// The SSH server's port when `SshPort` is not set.
pub const DEFAULT_SSH_PORT: u16 = 22;

/// One key that may log in over SSH, with the name its sessions go by (`ssh-17:alice`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshKey {
    pub name: String,
    pub key: crate::ssh_key::PublicKey,
}

/// An SSH key's name: 1-16 of `A-Z a-z 0-9 . _ -`, not starting with `-` or `.` (so a
/// session name `ssh-N:NAME` stays within the console's 32 characters).
pub fn valid_ssh_key_name(s: &str) -> bool {
    (1..=16).contains(&s.len())
        && !s.starts_with(['-', '.'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            interface_name: "wg0".into(),
            cores: Vec::new(),
            io_uring: true,
            poll: PollMode::Sleep,
            sqpoll: false,
            offload: OffloadMode::Auto,
            tun_offload: true,
            hugepages: true,
            buffers: 1024,
            tcp_listen: Vec::new(),
            tcp_fallback: true,
            bbr_rtt_ms: 40,
            uplink: String::new(),
            uplink_addresses: Vec::new(),
            uplink_gateway: None,
            lan: String::new(),
            lan_addresses: Vec::new(),
            proxy_arp: true,
            public_endpoint: None,
            client_dns: Vec::new(),
            firewall: true,
            masquerade: MasqueradeMode::Auto,
            ntp: Vec::new(),
            uplink_overlap: OverlapPolicy::Auto,
            ssh_keys: Vec::new(),
            ssh_port: DEFAULT_SSH_PORT,
            metrics: false,
            metrics_port: DEFAULT_METRICS_PORT,
            syslog: None,
            client_isolation: false,
            dns: Vec::new(),
            domain: None,
        }
    }
}

/// Default tunnel MTU over UDP (as wg-quick picks for a 1500-byte path).
pub const DEFAULT_MTU: u16 = 1420;

/// Why a host name or `HOST:PORT` endpoint was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointError(pub String);

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an endpoint (expected IPv4:PORT, [IPv6]:PORT or HOSTNAME:PORT with a port 1-65535)",
            self.0
        )
    }
}

impl std::error::Error for EndpointError {}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Addr(a) => write!(f, "{a}"),
            Endpoint::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// A DNS name as an endpoint host: letters, digits, `-`, `_` and dots, at most 253
/// characters. Anything else (spaces, `:` of an unbracketed IPv6 address) is refused.
fn valid_host_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && !h.starts_with('.')
        && !h.starts_with('-')
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    /// `1.2.3.4:51820`, `[fd00::1]:51820` or `vpn.example.com:51820`. A port of 0 is
    /// refused: nothing can be sent there.
    fn from_str(s: &str) -> Result<Endpoint, EndpointError> {
        let t = s.trim();
        let err = || EndpointError(t.chars().take(80).collect());
        let (host, port) = t.rsplit_once(':').ok_or_else(err)?;
        if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let port: u16 = port.parse().map_err(|_| err())?;
        if port == 0 {
            return Err(err());
        }
        if let Some(inner) = host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or_else(err)?;
            let a: Ipv6Addr = inner.parse().map_err(|_| err())?;
            return Ok(Endpoint::Addr(SocketAddr::new(IpAddr::V6(a), port)));
        }
        if let Ok(a) = host.parse::<Ipv4Addr>() {
            return Ok(Endpoint::Addr(SocketAddr::new(IpAddr::V4(a), port)));
        }
        // All-digit-and-dot hosts that are not IPv4 addresses (`1.2.3`, `300.1.1.1`) are
        // typos, not names.
        if !valid_host_name(host) || host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(err());
        }
        Ok(Endpoint::Name {
            host: host.to_string(),
            port,
        })
    }
}

/// A peer's console name: 1-32 of `A-Za-z0-9._-`, not starting with `-` or `.`.
pub fn valid_peer_name(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && !s.starts_with(['-', '.'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A DNS label (RFC 1123): 1 to 63 letters, digits and hyphens, not starting or ending
/// with a hyphen. A client whose name is not one (`x.y`, `a_b`) is not published by the
/// resolver.
pub fn valid_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A DNS name of [`valid_dns_label`] labels separated by dots (no trailing dot).
pub fn valid_dns_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(valid_dns_label)
}

/// A Linux interface name: 1-15 bytes, no `/`, `:`, whitespace or control characters,
/// not `.` or `..`.
pub fn valid_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':' && b != b'#' && b != b';')
}

/// Lowest MTU a tunnel may have: IPv4's minimum datagram size.
pub const MIN_MTU: u16 = 576;
/// Lowest MTU for a link carrying IPv6 (RFC 8200); Linux turns IPv6 off below it.
pub const MIN_MTU_IPV6: u16 = 1280;

/// A configuration that parses but cannot be run, with what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidationError {
    /// Two `[Peer]` sections share a public key.
    DuplicatePeer { public_key: Key },
    /// A peer's public key is our own (derived from `PrivateKey`).
    PeerIsSelf { public_key: Key },
    /// One allowed-IP prefix on two peers. WireGuard would silently move it to the later
    /// peer; in a configuration file that is almost always a mistake, so it is refused.
    DuplicateAllowedIp { cidr: Cidr, first: Key, second: Key },
    /// `MTU` outside 576..=65535.
    MtuOutOfRange { mtu: u16 },
    /// `MTU` below 1280 while the tunnel carries IPv6 (`what` names the v6 prefix).
    MtuTooSmallForIpv6 { mtu: u16, what: Cidr },
    /// No `PrivateKey` in `[Interface]`: the tunnel cannot be brought up.
    MissingPrivateKey,
    /// `[Gateway] InterfaceName`, `Uplink` or `Lan` is not a valid Linux interface name.
    InvalidInterfaceName { name: String },
    /// `Lan` names the uplink itself (one-armed is `Lan` unset).
    LanIsUplink { name: String },
    /// A peer `Name` outside 1-32 of `A-Za-z0-9._-`.
    InvalidPeerName { name: String },
    /// A list holds the same value twice (`what` names the setting).
    DuplicateValue { what: &'static str, value: String },
    /// Two peers have the same `Name`.
    DuplicatePeerName { name: String },
    /// A peer's public key is all zeros.
    ZeroPublicKey,
    /// The private key is all zeros.
    ZeroPrivateKey,
    /// `Buffers = 0`.
    NoBuffers,
    /// `SshPort` is a port another setting uses (`by` names it).
    SshPortTaken { port: u16, by: &'static str },
    /// `MetricsPort` is a TCP port another setting uses (`by` names it).
    MetricsPortTaken { port: u16, by: &'static str },
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValidationError::DuplicatePeer { public_key } => write!(
                f,
                "peer {} appears twice: merge its two [Peer] sections into one",
                public_key.to_base64()
            ),
            ValidationError::PeerIsSelf { public_key } => write!(
                f,
                "peer {} is this gateway's own public key (from its private key): remove that peer",
                public_key.to_base64()
            ),
            ValidationError::DuplicateAllowedIp { cidr, first, second } => write!(
                f,
                "allowed IP {} is on two peers ({} and {}): a prefix routes to only one peer, remove it from one",
                cidr,
                first.to_base64(),
                second.to_base64()
            ),
            ValidationError::MtuOutOfRange { mtu } => {
                write!(f, "MTU {mtu} is out of range; allowed is {MIN_MTU}-65535")
            }
            ValidationError::MtuTooSmallForIpv6 { mtu, what } => write!(
                f,
                "MTU {mtu} is below {MIN_MTU_IPV6}, the minimum for IPv6, but the tunnel carries IPv6 ({what}); raise MTU to at least {MIN_MTU_IPV6} or remove the IPv6 prefixes"
            ),
            ValidationError::MissingPrivateKey => f.write_str(
                "[Interface] has no PrivateKey; generate one with `riceguard genkey` and add `PrivateKey = ...`",
            ),
            ValidationError::InvalidInterfaceName { name } => write!(
                f,
                "`{name}` is not a valid interface name (1-15 characters, no spaces, `/` or `:`)"
            ),
            ValidationError::LanIsUplink { name } => write!(
                f,
                "the LAN port {name} is the uplink too: for a one-armed gateway leave Lan (`gateway lan`) unset"
            ),
            ValidationError::InvalidPeerName { name } => write!(
                f,
                "peer name `{}` is not valid (1-32 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`)",
                name.escape_debug()
            ),
            ValidationError::DuplicateValue { what, value } => {
                write!(f, "{what} lists {value} twice")
            }
            ValidationError::MetricsPortTaken { port, by } => write!(
                f,
                "MetricsPort {port} is the {by} port: give the metrics a port of their own (set gateway metrics-port N)"
            ),
            ValidationError::SshPortTaken { port, by } => write!(
                f,
                "SshPort {port} is the {by} port: give SSH a port of its own (set gateway ssh-port N)"
            ),
            ValidationError::DuplicatePeerName { name } => write!(
                f,
                "two peers are named {}: peer names must differ",
                name.escape_debug()
            ),
            ValidationError::ZeroPublicKey => f.write_str("a peer's public key is all zeros"),
            ValidationError::ZeroPrivateKey => f.write_str(
                "the private key is all zeros: generate one (`genkey` on the console, `riceguard genkey`)",
            ),
            ValidationError::NoBuffers => f.write_str("Buffers (`gateway buffers`) must be at least 1"),
        }
    }
}

impl std::error::Error for ValidationError {}

impl Config {
    /// Everything [`Config::validate_consistency`] checks, plus that a private key is
    /// present: what `up` needs.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.validate_consistency()?;
        if self.interface.private_key.is_none() {
            return Err(ValidationError::MissingPrivateKey);
        }
        Ok(())
    }

    /// Checks that hold for any configuration we accept, with or without a private key
    /// (the UAPI face starts keyless and gets its key from `wg set`): the first of
    /// [`Config::problems`].
    pub fn validate_consistency(&self) -> Result<(), ValidationError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every consistency problem of this configuration, in file order (the console shows
    /// them all; a file load and `up` refuse on the first). The one set of rules: the
    /// console, the daemon and boot-time loading all check through it.
    pub fn problems(&self) -> Vec<ValidationError> {
        let mut errs = Vec::new();
        let own = self.interface.private_key.map(|k| k.public());
        let mut seen_keys: HashSet<Key> = HashSet::with_capacity(self.peers.len());
        let mut owner: HashMap<Cidr, Key> = HashMap::new();
        for p in &self.peers {
            if p.public_key.is_zero() {
                errs.push(ValidationError::ZeroPublicKey);
            }
            if !seen_keys.insert(p.public_key) {
                errs.push(ValidationError::DuplicatePeer {
                    public_key: p.public_key,
                });
            }
            if own == Some(p.public_key) {
                errs.push(ValidationError::PeerIsSelf {
                    public_key: p.public_key,
                });
            }
            for c in &p.allowed_ips {
                let n = c.network();
                match owner.get(&n) {
                    Some(first) if *first == p.public_key => {
                        errs.push(ValidationError::DuplicateValue {
                            what: "AllowedIPs",
                            value: n.to_string(),
                        })
                    }
                    Some(first) => errs.push(ValidationError::DuplicateAllowedIp {
                        cidr: n,
                        first: *first,
                        second: p.public_key,
                    }),
                    None => {
                        owner.insert(n, p.public_key);
                    }
                }
            }
        }
        if let Some(mtu) = self.interface.mtu {
            if mtu < MIN_MTU {
                errs.push(ValidationError::MtuOutOfRange { mtu });
            }
            if mtu < MIN_MTU_IPV6 {
                let v6 = self
                    .interface
                    .addresses
                    .iter()
                    .chain(self.peers.iter().flat_map(|p| p.allowed_ips.iter()))
                    .find(|c| c.addr.is_ipv6());
                if let Some(what) = v6 {
                    errs.push(ValidationError::MtuTooSmallForIpv6 { mtu, what: *what });
                }
            }
        }
        let g = &self.gateway;
        if !valid_ifname(&g.interface_name) {
            errs.push(ValidationError::InvalidInterfaceName {
                name: g.interface_name.clone(),
            });
        }
        for n in [&g.uplink, &g.lan] {
            if !n.is_empty() && !valid_ifname(n) {
                errs.push(ValidationError::InvalidInterfaceName { name: n.clone() });
            }
        }
        if !g.lan.is_empty() && g.lan == g.uplink {
            errs.push(ValidationError::LanIsUplink {
                name: g.lan.clone(),
            });
        }
        let mut names: Vec<&str> = Vec::new();
        for p in &self.peers {
            if let Some(n) = &p.name {
                if !valid_peer_name(n) {
                    errs.push(ValidationError::InvalidPeerName { name: n.clone() });
                }
                if names.contains(&n.as_str()) {
                    errs.push(ValidationError::DuplicatePeerName { name: n.clone() });
                }
                names.push(n);
            }
        }
        if let Some(d) = first_duplicate(&g.cores) {
            errs.push(ValidationError::DuplicateValue {
                what: "Cores",
                value: d.to_string(),
            });
        }
        if let Some(d) = first_duplicate(&g.tcp_listen) {
            errs.push(ValidationError::DuplicateValue {
                what: "TcpListen",
                value: d.to_string(),
            });
        }
        if g.buffers == 0 {
            errs.push(ValidationError::NoBuffers);
        }
        // Only once SSH listens (a key is set): a file with `ListenPort = 22` and no key
        // loads as before.
        let ssh_on = !g.ssh_keys.is_empty();
        if ssh_on && self.interface.listen_port == Some(g.ssh_port) {
            errs.push(ValidationError::SshPortTaken {
                port: g.ssh_port,
                by: "ListenPort",
            });
        }
        if ssh_on && g.tcp_listen.contains(&g.ssh_port) {
            errs.push(ValidationError::SshPortTaken {
                port: g.ssh_port,
                by: "TcpListen",
            });
        }
        // Likewise only once the metrics are served: TCP ports, so the UDP ListenPort may
        // be the same number.
        if g.metrics && ssh_on && g.metrics_port == g.ssh_port {
            errs.push(ValidationError::MetricsPortTaken {
                port: g.metrics_port,
                by: "SshPort",
            });
        }
        if g.metrics && g.tcp_listen.contains(&g.metrics_port) {
            errs.push(ValidationError::MetricsPortTaken {
                port: g.metrics_port,
                by: "TcpListen",
            });
        }
        errs
    }

    /// [`Config::problems`] plus what running needs: a private key that is not all
    /// zeros. The gate before a configuration is committed, loaded at boot or run.
    pub fn all_problems(&self) -> Vec<ValidationError> {
        let mut errs = self.problems();
        match self.interface.private_key {
            None => errs.push(ValidationError::MissingPrivateKey),
            Some(k) if k.is_zero() => errs.push(ValidationError::ZeroPrivateKey),
            Some(_) => {}
        }
        errs
    }
}

fn first_duplicate<T: Copy + Eq + std::hash::Hash>(v: &[T]) -> Option<T> {
    let mut seen = HashSet::with_capacity(v.len());
    v.iter().copied().find(|x| !seen.insert(*x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key([b; 32])
    }

    fn peer(k: u8, ips: &[&str]) -> PeerConfig {
        PeerConfig {
            public_key: key(k),
            preshared_key: None,
            allowed_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        }
    }

    fn base() -> Config {
        let mut c = Config::default();
        c.interface.private_key = Some(key(7));
        c.peers = vec![
            peer(1, &["10.0.0.2/32"]),
            peer(2, &["10.0.0.3/32", "fd00::3/128"]),
        ];
        c
    }

    #[test]
    fn problems_lists_every_one_it_finds() {
        let mut c = base();
        c.peers.push(peer(1, &["10.0.0.9/32"])); // the first peer again
        c.peers[2].name = Some("x".into());
        c.peers[1].name = Some("x".into());
        c.peers.push(peer(0, &["10.0.0.3/32"])); // zero key, and peer 2's prefix
        c.gateway.lan = "eth0".into();
        c.gateway.uplink = "eth0".into();
        c.gateway.buffers = 0;
        let p = c.problems();
        let has = |f: fn(&ValidationError) -> bool| p.iter().any(f);
        assert!(
            has(|e| matches!(e, ValidationError::DuplicatePeer { .. })),
            "{p:?}"
        );
        assert!(
            has(|e| matches!(e, ValidationError::DuplicatePeerName { .. })),
            "{p:?}"
        );
        assert!(
            has(|e| matches!(e, ValidationError::ZeroPublicKey)),
            "{p:?}"
        );
        assert!(
            has(|e| matches!(e, ValidationError::DuplicateAllowedIp { .. })),
            "{p:?}"
        );
        assert!(
            has(|e| matches!(e, ValidationError::LanIsUplink { .. })),
            "{p:?}"
        );
        assert!(has(|e| matches!(e, ValidationError::NoBuffers)), "{p:?}");
        assert_eq!(
            c.validate_consistency(),
            Err(p[0].clone()),
            "the first is the file's refusal"
        );
        c.interface.private_key = Some(Key([0; 32]));
        assert!(c.all_problems().contains(&ValidationError::ZeroPrivateKey));
        assert!(base().problems().is_empty() && base().all_problems().is_empty());
    }

    #[test]
    fn endpoint_parse_and_display() {
        for s in [
            "1.2.3.4:51820",
            "[fd00::1]:443",
            "vpn.example.com:51820",
            "host_1:1",
        ] {
            assert_eq!(s.parse::<Endpoint>().unwrap().to_string(), s);
        }
        assert!(matches!(
            "1.2.3.4:5".parse::<Endpoint>(),
            Ok(Endpoint::Addr(_))
        ));
        assert!(matches!(
            "[::1]:5".parse::<Endpoint>(),
            Ok(Endpoint::Addr(_))
        ));
        assert!(matches!(
            "a.b:5".parse::<Endpoint>(),
            Ok(Endpoint::Name { .. })
        ));
        for bad in [
            "1.2.3.4",
            "1.2.3.4:0",
            "1.2.3.4:65536",
            "fd00::1:51820",
            "[fd00::1:51820",
            ":80",
            "a b:80",
            "300.1.1.1:80",
            "1.2.3:80",
            "[1.2.3.4]:80",
            "host:+1",
            "",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
        let e = "nope".parse::<Endpoint>().unwrap_err().to_string();
        assert!(e.contains("[IPv6]:PORT"), "{e}");
    }

    #[test]
    fn valid_config_passes() {
        base().validate().unwrap();
        let mut c = base();
        c.interface.private_key = None;
        assert_eq!(c.validate(), Err(ValidationError::MissingPrivateKey));
        c.validate_consistency().unwrap();
    }

    #[test]
    fn rejects_duplicates_and_self() {
        let mut c = base();
        c.peers.push(peer(1, &[]));
        assert_eq!(
            c.validate(),
            Err(ValidationError::DuplicatePeer { public_key: key(1) })
        );

        let mut c = base();
        let own = key(7).public();
        let mut p = peer(9, &[]);
        p.public_key = own;
        c.peers.push(p);
        assert_eq!(
            c.validate(),
            Err(ValidationError::PeerIsSelf { public_key: own })
        );

        let mut c = base();
        // Host bits do not make a prefix different.
        c.peers.push(peer(3, &["10.0.0.2/32", "10.0.0.99/32"]));
        c.peers[2].allowed_ips[0] = "10.0.0.2/32".parse().unwrap();
        let e = c.validate().unwrap_err();
        assert_eq!(
            e,
            ValidationError::DuplicateAllowedIp {
                cidr: "10.0.0.2/32".parse().unwrap(),
                first: key(1),
                second: key(3)
            }
        );
        assert!(e.to_string().contains("two peers"));

        let mut c = base();
        c.peers[0].allowed_ips = vec![
            "10.9.0.1/16".parse().unwrap(),
            "10.9.7.7/16".parse().unwrap(),
        ];
        assert!(matches!(
            c.validate(),
            Err(ValidationError::DuplicateValue { .. })
        ));
    }

    #[test]
    fn mtu_rules() {
        let mut c = base();
        c.interface.mtu = Some(575);
        assert_eq!(
            c.validate(),
            Err(ValidationError::MtuOutOfRange { mtu: 575 })
        );
        c.interface.mtu = Some(1000);
        let e = c.validate().unwrap_err();
        assert!(matches!(
            e,
            ValidationError::MtuTooSmallForIpv6 { mtu: 1000, .. }
        ));
        assert!(e.to_string().contains("1280"), "{e}");
        c.peers[1].allowed_ips.truncate(1);
        c.validate().unwrap();
        c.interface.addresses.push("fd00::1/64".parse().unwrap());
        assert!(c.validate().is_err());
        c.interface.mtu = Some(1280);
        c.validate().unwrap();
        c.interface.mtu = Some(65535);
        c.validate().unwrap();
    }

    #[test]
    fn gateway_checks() {
        let mut c = base();
        c.gateway.interface_name = "this-name-is-too-long".into();
        assert!(matches!(
            c.validate(),
            Err(ValidationError::InvalidInterfaceName { .. })
        ));
        let mut c = base();
        c.gateway.tcp_listen = vec![443, 8443, 443];
        assert!(matches!(
            c.validate(),
            Err(ValidationError::DuplicateValue {
                what: "TcpListen",
                ..
            })
        ));
    }

    /// SSH's port is its own: not the WireGuard port, not a TCP-fallback port (once a key
    /// is set; without one nothing listens and a `ListenPort = 22` stays valid).
    #[test]
    fn ssh_port_collisions() {
        let mut c = base();
        c.interface.listen_port = Some(22);
        c.validate().unwrap();
        let ed = "alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC";
        c.gateway.ssh_keys = vec![crate::value::ssh_key(ed).unwrap()];
        assert_eq!(
            c.validate(),
            Err(ValidationError::SshPortTaken {
                port: 22,
                by: "ListenPort"
            })
        );
        c.gateway.ssh_port = 2222;
        c.validate().unwrap();
        c.gateway.tcp_listen = vec![443, 2222];
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "SshPort 2222 is the TcpListen port: give SSH a port of its own (set gateway ssh-port N)"
        );
    }

    /// The metrics' port is a TCP port of its own once they are served: not SSH's, not a
    /// TCP-fallback port; the UDP ListenPort may share its number.
    #[test]
    fn metrics_port_collisions() {
        let mut c = base();
        c.gateway.tcp_listen = vec![9586];
        c.validate().unwrap();
        c.gateway.metrics = true;
        assert_eq!(
            c.validate(),
            Err(ValidationError::MetricsPortTaken {
                port: 9586,
                by: "TcpListen"
            })
        );
        c.gateway.tcp_listen.clear();
        c.interface.listen_port = Some(9586);
        c.validate().unwrap();
        let ed = "alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC";
        c.gateway.ssh_keys = vec![crate::value::ssh_key(ed).unwrap()];
        c.gateway.ssh_port = 9586;
        c.interface.listen_port = Some(51820);
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "MetricsPort 9586 is the SshPort port: give the metrics a port of their own (set gateway metrics-port N)"
        );
    }
}
