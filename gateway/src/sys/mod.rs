//! The OS-facing layer: every `unsafe` block of the crate lives below this module,
//! each with a `// SAFETY:` line saying why it holds.
#![allow(unsafe_code)]

pub mod clock;
pub mod cmsg;
pub mod ethtool;
pub mod hugepage;
pub mod netlink;
pub mod nftables;
pub mod nic;
pub mod offload;
pub mod os;
pub mod probe;
pub mod process;
pub mod tcp;
pub mod tun;
pub mod udp;
pub mod uring;

/// `SO_MARK` on any socket, UDP or TCP (`None`: no mark). Setting a mark needs
/// `CAP_NET_ADMIN`; clearing one that was never set is skipped, so it needs nothing.
pub fn set_mark(fd: &impl std::os::fd::AsFd, mark: Option<u32>) -> std::io::Result<()> {
    use nix::sys::socket::{getsockopt, setsockopt, sockopt::Mark};
    let m = mark.unwrap_or(0);
    if m == 0 && getsockopt(fd, Mark)? == 0 {
        return Ok(());
    }
    Ok(setsockopt(fd, Mark, &m)?)
}
