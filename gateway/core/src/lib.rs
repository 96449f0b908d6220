//! The sans-IO core: protocol state, wire formats and file formats. Nothing here
//! does I/O or reads a clock of its own (boringtun's `Tunn` is the one exception,
//! see `device`), and nothing here uses `unsafe`.
#![forbid(unsafe_code)]

pub mod access;
pub mod age;
pub mod allowed_ips;
pub mod bundle;
pub mod clock;
pub mod config;
pub mod congestion;
pub mod device;
pub mod dhcp;
pub mod dns;
pub mod event;
pub mod fallback;
pub mod firewall;
pub mod framing;
pub mod gso;
pub mod gso_rest;
pub mod identity;
pub mod ini;
pub mod key;
pub mod lane;
pub mod metrics;
pub mod net;
pub mod netlink;
pub mod netplan;
pub mod offload;
pub mod slots;
pub mod ssh_key;
pub mod syslog;
pub mod tcp_admission;
pub mod uapi;
pub mod uplink_overlap;
pub mod usb_stick;
pub mod value;

#[cfg(test)]
mod sim_tests;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
