//! Segmentation offload formats, sans-IO: the `virtio_net_hdr` wire type a TUN with
//! `IFF_VNET_HDR` puts in front of each packet, the [`Splitter`] that cuts the kernel's
//! TSO/USO super-packets into wire-sized segments, the [`Coalescer`] that merges decrypted
//! TCP/UDP segments back into one super-packet per flow for the TUN write side (GRO), and
//! the [`GsoBatch`] planner that groups encrypted datagrams into one `UDP_SEGMENT` send.
//!
//! Everything works on caller-owned buffers with fixed-capacity tables: no allocation per
//! packet. Malformed input is an error, never a panic.
//!
//! One concept a file: `checksum.rs`, `virtio.rs` (the header), `split.rs`,
//! `coalesce.rs`, `batch.rs` (the GSO batch planner), `tests.rs`; the byte helpers,
//! protocol constants and [`GsoError`] they share are here.

use std::fmt;

/// Bytes of the legacy `struct virtio_net_hdr` (without `num_buffers`).
pub const VIRTIO_NET_HDR_LEN: usize = 10;
/// Largest IP packet we build or accept (the IPv4 total-length field's limit).
pub const MAX_IP_PACKET: usize = 65535;
/// Most packets one [`Coalescer::plan`] call looks at.
pub const MAX_BATCH: usize = 128;

pub(super) const PROTO_TCP: u8 = 6;
pub(super) const PROTO_UDP: u8 = 17;
pub(super) const TCP_FIN: u8 = 0x01;
pub(super) const TCP_PSH: u8 = 0x08;
pub(super) const TCP_ACK: u8 = 0x10;
pub(super) const TCP_CWR: u8 = 0x80;
/// Offset of the checksum field inside the TCP / UDP header.
pub(super) const TCP_CSUM_OFFSET: usize = 16;
pub(super) const UDP_CSUM_OFFSET: usize = 6;

/// Why a packet could not be split, coalesced or described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GsoError {
    /// Shorter than the headers it claims to carry.
    Truncated,
    /// Longer than an IP packet can be (65535 bytes).
    TooLong,
    /// A `gso_type` we do not know (after masking the ECN bit).
    UnknownGsoType(u8),
    /// IP version missing or not matching the GSO type.
    IpVersion,
    /// The L4 protocol in the IP header does not match the GSO type.
    Protocol,
    /// `csum_start`/`csum_offset` point outside the packet or at the wrong field.
    ChecksumOffsets { start: u16, offset: u16 },
    /// TCP data offset outside 20..=60.
    TcpHeaderLen,
    /// GSO with `gso_size` 0.
    ZeroGsoSize,
    /// A GSO packet without payload.
    EmptyPayload,
    /// The output buffer cannot hold the segment.
    BufferTooSmall { need: usize, have: usize },
}

impl fmt::Display for GsoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("packet shorter than its headers"),
            Self::TooLong => f.write_str("packet longer than 65535 bytes"),
            Self::UnknownGsoType(t) => write!(f, "unknown virtio GSO type {t}"),
            Self::IpVersion => f.write_str("IP version missing or not matching the GSO type"),
            Self::Protocol => f.write_str("IP protocol not matching the GSO type"),
            Self::ChecksumOffsets { start, offset } => write!(
                f,
                "checksum start {start} / offset {offset} outside the packet or not at the L4 checksum"
            ),
            Self::TcpHeaderLen => f.write_str("TCP header length outside 20..=60"),
            Self::ZeroGsoSize => f.write_str("GSO packet with segment size 0"),
            Self::EmptyPayload => f.write_str("GSO packet without payload"),
            Self::BufferTooSmall { need, have } => {
                write!(f, "output buffer too small: need {need} bytes, have {have}")
            }
        }
    }
}

impl std::error::Error for GsoError {}

mod batch;
pub mod checksum;
mod coalesce;
mod split;
#[cfg(test)]
mod tests;
mod virtio;

pub use batch::*;
pub use coalesce::*;
pub use split::*;
pub use virtio::*;
