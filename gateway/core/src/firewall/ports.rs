//! What the ruleset is computed over besides the configuration: the ports (interfaces)
//! and their subnets now. Its own file so that `services` and `mod.rs` both use it
//! without importing each other.

use crate::config::Config;
use crate::net::Cidr;

/// What the ruleset is computed over besides the configuration: the interfaces and the
/// subnets they have now (the uplink's come from DHCP and SLAAC and change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ports {
    /// The tunnel interface.
    pub tunnel: String,
    /// The LAN port when two-armed (`Lan =`).
    pub lan: Option<String>,
    /// The subnets (network form) of the uplink zone's interfaces.
    pub uplink_nets: Vec<Cidr>,
    /// The uplink zone's own addresses, with their prefixes (the services' one-armed
    /// source range is cut around them: [`super::services::uplink_service_nets`]).
    pub uplink_addrs: Vec<Cidr>,
    /// The LAN port's subnets.
    pub lan_nets: Vec<Cidr>,
    /// The UDP port WireGuard listens on (`None`: not known yet, nothing let in for it).
    pub listen_port: Option<u16>,
}

impl Ports {
    /// The ports for `cfg` with the interface names and the static subnets it gives
    /// (init at boot, before any address is on the uplink).
    pub fn from_config(cfg: &Config) -> Ports {
        Ports {
            tunnel: cfg.gateway.interface_name.clone(),
            lan: (!cfg.gateway.lan.is_empty()).then(|| cfg.gateway.lan.clone()),
            // A static uplink address is known before the link is up; DHCP's is not.
            uplink_nets: cfg
                .gateway
                .uplink_addresses
                .iter()
                .map(Cidr::network)
                .collect(),
            uplink_addrs: cfg.gateway.uplink_addresses.clone(),
            lan_nets: cfg
                .gateway
                .lan_addresses
                .iter()
                .map(Cidr::network)
                .collect(),
            listen_port: cfg.interface.listen_port,
        }
    }
}
