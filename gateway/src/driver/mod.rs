//! Drivers: the threads and processes that move bytes between `sys` handles and the
//! `core` device, by subsystem — `dataplane` (the per-core workers), `tcp` (the
//! WireGuard-over-TCP transport and relays), `daemon` (the process: arguments, start-up,
//! configuration changes, UAPI, status) and `appliance` (the appliance's network,
//! firewall, DHCP and NTP). Imports point one way: `daemon` uses the other three, `tcp`
//! uses `dataplane`, and `dataplane` and `appliance` use nothing else of `driver`
//! (`import_graph` checks that no circle forms).

pub mod appliance;
pub mod daemon;
pub mod dataplane;
pub mod tcp;
