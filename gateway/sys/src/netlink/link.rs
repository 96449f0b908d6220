//! `RTM_NEWLINK`: a link's administrative state and its MTU.

use super::{finish, put_attr, put_hdr, Netlink, NetlinkError, NLM_F_ACK, NLM_F_REQUEST};

const RTM_NEWLINK: u16 = 16;
const IFLA_MTU: u16 = 4;
const IFF_UP: u32 = 0x1;

impl Netlink {
    /// Set the administrative state of a link.
    pub fn set_link_up(&mut self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let idx = Self::ifindex(name)?;
        let mut m = Vec::with_capacity(64);
        link_msg(&mut m, self.next_seq(), idx, up, None);
        self.request(
            &m,
            &format!("set {name} {}", if up { "up" } else { "down" }),
        )
    }

    pub fn set_mtu(&mut self, name: &str, mtu: u32) -> Result<(), NetlinkError> {
        let idx = Self::ifindex(name)?;
        let mut m = Vec::with_capacity(64);
        link_msg(&mut m, self.next_seq(), idx, false, Some(mtu));
        self.request(&m, &format!("set {name} mtu {mtu}"))
    }
}

/// RTM_NEWLINK: `up` sets IFF_UP (with `mtu == None`); with an MTU, flags are left alone.
fn link_msg(m: &mut Vec<u8>, seq: u32, ifindex: u32, up: bool, mtu: Option<u32>) {
    put_hdr(m, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq);
    // struct ifinfomsg { u8 family, u8 pad, u16 type, i32 index, u32 flags, u32 change }
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&ifindex.to_ne_bytes());
    let (flags, change) = match mtu {
        Some(_) => (0u32, 0u32),
        None => (if up { IFF_UP } else { 0 }, IFF_UP),
    };
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&change.to_ne_bytes());
    if let Some(mtu) = mtu {
        put_attr(m, IFLA_MTU, &mtu.to_ne_bytes());
    }
    finish(m);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_up_message_layout() {
        let mut m = Vec::new();
        link_msg(&mut m, 7, 3, true, None);
        assert_eq!(m.len(), 32);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 32);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), RTM_NEWLINK);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(m[24..28].try_into().unwrap()), IFF_UP);
        assert_eq!(u32::from_ne_bytes(m[28..32].try_into().unwrap()), IFF_UP);
    }
}
