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

// Paths other modules (cli.rs, init/, console/) use from before the split; to be retired
// once they name the new ones.
pub use appliance::{dhcp, firewall, ntp};
pub use daemon::process::main;
pub use daemon::status;
pub use daemon::status::status_main;
pub use dataplane::uring::engine as uring_worker;
pub use tcp::relay as udptcp;

#[cfg(test)]
mod import_graph;
