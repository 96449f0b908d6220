//! The daemon process, `riceguard [-f] IFNAME` and `riceguard up --config FILE`:
//! start-up and the signal loop (`process`), its arguments (`args`), configuration
//! changes applied whole (`runtime`), the timer thread (`timers`), the event log's batch
//! (`events`), the UAPI socket server (`uapi`), the status file with `riceguard status`
//! (`status`), the Prometheus endpoint (`metrics`) and the DNS forwarder (`dns`).

mod args;
pub mod dns;
pub mod events;
pub mod metrics;
pub mod process;
pub mod runtime;
pub mod status;
mod timers;
pub mod uapi;
