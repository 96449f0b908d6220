//! The daemon process, `riceguard [-f] IFNAME` and `riceguard up --config FILE`:
//! start-up and the signal loop (`process`), its arguments (`args`), configuration
//! changes applied whole (`runtime`), the UAPI socket server (`uapi`), and the status
//! file with `riceguard status` (`status`).

mod args;
pub mod process;
pub mod runtime;
pub mod status;
pub mod uapi;
