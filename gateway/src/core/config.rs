//! The one configuration format: wg-quick-style INI (`[Interface]`, `[Peer]`) plus a
//! `[Gateway]` section for appliance settings. Read by `riceguard up --config`, written
//! by the console, kept on `perm`.
//!
//! This module owns the types and their validation; parsing and emitting live in
//! [`crate::core::ini`].

use std::net::SocketAddr;

use crate::core::key::Key;
use crate::core::net::Cidr;

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
    /// Tunnel MTU; `None` means 1420 (1366 when the path is TCP).
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

/// `[Gateway]`: appliance settings that wg-quick does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Interface name of the tunnel (default `wg0`).
    pub interface_name: String,
    /// Cores for the data-plane workers; empty means all online cores.
    pub cores: Vec<usize>,
    pub io_uring: bool,
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
    /// Default gateway for the uplink (`UplinkGateway = 192.0.2.1`).
    pub uplink_gateway: Option<std::net::IpAddr>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            interface_name: "wg0".into(),
            cores: Vec::new(),
            io_uring: true,
            offload: OffloadMode::Auto,
            tun_offload: true,
            hugepages: true,
            buffers: 4096,
            tcp_listen: Vec::new(),
            tcp_fallback: true,
            bbr_rtt_ms: 40,
            uplink: String::new(),
            uplink_addresses: Vec::new(),
            uplink_gateway: None,
        }
    }
}

/// Default tunnel MTU over UDP (as wg-quick picks for a 1500-byte path).
pub const DEFAULT_MTU: u16 = 1420;
/// Tunnel MTU when the outer transport is TCP: 20 bytes more TCP header than UDP's 8,
/// the 2-byte frame length, and room for TCP options (timestamps, SACK) — 54 bytes.
pub const DEFAULT_TCP_MTU: u16 = DEFAULT_MTU - 54;
