//! The appliance's firewall and NAT policy (zones uplink, LAN port, tunnel), computed as
//! plain data ([`rules::Ruleset`]) from the configuration and the ports' subnets;
//! `sys::nftables` installs it.

pub mod rules;
