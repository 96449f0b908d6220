//! RiceGuard: the WireGuard gateway appliance in one static binary.
//!
//! Layers (see ARCHITECTURE.md): `core` is the sans-IO protocol and format code,
//! `sys` (the crate `riceguard-sys`) is the only place `unsafe` lives (kernel
//! interfaces), `driver` runs the loops that join the two. `init`, `console` and `cli` are
//! the binary's other faces. This crate has no `unsafe`: `forbid`, which no module can lift.
#![forbid(unsafe_code)]

pub mod cli;
pub mod console;
pub use riceguard_core as core;
pub mod driver;
pub mod durable;
pub mod image_paths;
#[cfg(test)]
mod import_graph;
pub mod init;
pub mod logger;
pub mod perm;
pub mod run;
pub mod slots;
#[cfg(feature = "ssh")]
pub mod ssh;
pub use riceguard_sys as sys;
pub mod syslog;
#[cfg(test)]
pub(crate) mod testutil;
pub mod update;
pub mod usb_stick;
