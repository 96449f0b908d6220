//! The OS-facing layer: every `unsafe` block of the crate lives below this module,
//! each with a `// SAFETY:` line saying why it holds.
#![allow(unsafe_code)]

pub mod cmsg;
pub mod ethtool;
pub mod hugepage;
pub mod netlink;
pub mod nic;
pub mod offload;
pub mod os;
pub mod process;
pub mod tcp;
pub mod tun;
pub mod udp;
pub mod uring;
