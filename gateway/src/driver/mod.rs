//! Drivers: the loops that move bytes between `sys` handles and the `core` state.

use std::process::ExitCode;

pub mod tcp;
pub mod udptcp;

/// `riceguard [-f] IFNAME` and `riceguard up --config FILE`.
pub fn main(_args: &[String]) -> ExitCode {
    eprintln!("driver: not built yet");
    ExitCode::from(1)
}
