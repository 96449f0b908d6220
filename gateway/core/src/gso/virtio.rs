//! The `virtio_net_hdr` a TUN with `IFF_VNET_HDR` puts in front of each packet: its
//! wire layout, a checked view and the parsed representation.

use super::{GsoError, VIRTIO_NET_HDR_LEN};
use std::ops::Range;

pub(super) mod field {
    use std::ops::Range;
    pub const FLAGS: usize = 0;
    pub const GSO_TYPE: usize = 1;
    pub const HDR_LEN: Range<usize> = 2..4;
    pub const GSO_SIZE: Range<usize> = 4..6;
    pub const CSUM_START: Range<usize> = 6..8;
    pub const CSUM_OFFSET: Range<usize> = 8..10;
}

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum is partial (pseudo-header only).
pub const FLAG_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was already verified.
pub const FLAG_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_ECN`: the TCP super-packet had CWR set (ECN).
pub const GSO_ECN: u8 = 0x80;

/// `gso_type` without the ECN bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GsoType {
    /// Not a super-packet.
    None,
    /// TCP over IPv4 (TSO).
    TcpV4,
    /// TCP over IPv6 (TSO).
    TcpV6,
    /// UDP over either IP version (USO, `VIRTIO_NET_HDR_GSO_UDP_L4`).
    UdpL4,
}

impl GsoType {
    fn from_raw(v: u8) -> Result<Self, GsoError> {
        match v & !GSO_ECN {
            0 => Ok(Self::None),
            1 => Ok(Self::TcpV4),
            4 => Ok(Self::TcpV6),
            5 => Ok(Self::UdpL4),
            _ => Err(GsoError::UnknownGsoType(v)),
        }
    }

    fn raw(self) -> u8 {
        match self {
            Self::None => 0,
            Self::TcpV4 => 1,
            Self::TcpV6 => 4,
            Self::UdpL4 => 5,
        }
    }
}

/// A `virtio_net_hdr` over a byte buffer. Fields are in host byte order, which is what
/// a TUN uses unless told otherwise (`TUNSETVNETLE`/`BE`).
#[derive(Debug, Clone)]
pub struct VirtioNetHdr<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VirtioNetHdr<T> {
    /// Wrap without checking the length; accessors may panic on a short buffer.
    pub fn new_unchecked(buffer: T) -> Self {
        VirtioNetHdr { buffer }
    }

    /// Wrap untrusted bytes: at least [`VIRTIO_NET_HDR_LEN`] long.
    pub fn new_checked(buffer: T) -> Result<Self, GsoError> {
        if buffer.as_ref().len() < VIRTIO_NET_HDR_LEN {
            return Err(GsoError::Truncated);
        }
        Ok(VirtioNetHdr { buffer })
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: Range<usize>) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_ne_bytes([b[r.start], b[r.start + 1]])
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Raw `gso_type`, including the ECN bit.
    pub fn gso_type_raw(&self) -> u8 {
        self.buffer.as_ref()[field::GSO_TYPE]
    }
    pub fn hdr_len(&self) -> u16 {
        self.u16_at(field::HDR_LEN)
    }
    pub fn gso_size(&self) -> u16 {
        self.u16_at(field::GSO_SIZE)
    }
    pub fn csum_start(&self) -> u16 {
        self.u16_at(field::CSUM_START)
    }
    pub fn csum_offset(&self) -> u16 {
        self.u16_at(field::CSUM_OFFSET)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VirtioNetHdr<T> {
    fn set_u16(&mut self, r: Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_ne_bytes());
    }
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    pub fn set_gso_type_raw(&mut self, v: u8) {
        self.buffer.as_mut()[field::GSO_TYPE] = v;
    }
    pub fn set_hdr_len(&mut self, v: u16) {
        self.set_u16(field::HDR_LEN, v);
    }
    pub fn set_gso_size(&mut self, v: u16) {
        self.set_u16(field::GSO_SIZE, v);
    }
    pub fn set_csum_start(&mut self, v: u16) {
        self.set_u16(field::CSUM_START, v);
    }
    pub fn set_csum_offset(&mut self, v: u16) {
        self.set_u16(field::CSUM_OFFSET, v);
    }
}

/// The parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioNetHdrRepr {
    pub flags: u8,
    pub gso_type: GsoType,
    /// The ECN bit of `gso_type`.
    pub ecn: bool,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VirtioNetHdrRepr {
    /// All zero: a plain packet with a valid checksum (what pass-through writes use).
    pub const NONE: Self = VirtioNetHdrRepr {
        flags: 0,
        gso_type: GsoType::None,
        ecn: false,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };

    /// Parse; rejects unknown GSO types.
    pub fn parse<T: AsRef<[u8]>>(h: &VirtioNetHdr<T>) -> Result<Self, GsoError> {
        let raw = h.gso_type_raw();
        Ok(VirtioNetHdrRepr {
            flags: h.flags(),
            gso_type: GsoType::from_raw(raw)?,
            ecn: raw & GSO_ECN != 0,
            hdr_len: h.hdr_len(),
            gso_size: h.gso_size(),
            csum_start: h.csum_start(),
            csum_offset: h.csum_offset(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        VIRTIO_NET_HDR_LEN
    }

    pub fn needs_csum(&self) -> bool {
        self.flags & FLAG_NEEDS_CSUM != 0
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut VirtioNetHdr<T>) {
        h.set_flags(self.flags);
        h.set_gso_type_raw(self.gso_type.raw() | if self.ecn { GSO_ECN } else { 0 });
        h.set_hdr_len(self.hdr_len);
        h.set_gso_size(self.gso_size);
        h.set_csum_start(self.csum_start);
        h.set_csum_offset(self.csum_offset);
    }

    /// Emit into the first [`VIRTIO_NET_HDR_LEN`] bytes of `buf`.
    pub fn emit_into(&self, buf: &mut [u8]) -> Result<(), GsoError> {
        let have = buf.len();
        let h = buf
            .get_mut(..VIRTIO_NET_HDR_LEN)
            .ok_or(GsoError::BufferTooSmall {
                need: VIRTIO_NET_HDR_LEN,
                have,
            })?;
        self.emit(&mut VirtioNetHdr::new_unchecked(h));
        Ok(())
    }
}
