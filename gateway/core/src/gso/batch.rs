//! GSO batch planning (UDP send side): which encrypted datagrams to one destination go
//! out as one `UDP_SEGMENT` send.

use std::net::SocketAddr;

/// One planned send: `size` bytes of the caller's buffer to `destination`, cut by the
/// kernel into `segment_size`-byte datagrams (the last may be shorter). A batch of one
/// datagram has `segment_size == size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedSend {
    pub destination: SocketAddr,
    pub size: usize,
    pub segment_size: usize,
}

impl PlannedSend {
    /// Datagrams in this send.
    pub fn segments(&self) -> usize {
        if self.segment_size == 0 {
            0
        } else {
            self.size.div_ceil(self.segment_size)
        }
    }
}

/// Largest UDP payload one send may carry: 65535 minus the IPv4 and UDP headers, or
/// minus the UDP header for IPv6 (whose payload length excludes its own header).
pub fn max_udp_payload(destination: &SocketAddr) -> usize {
    match destination {
        SocketAddr::V4(_) => 65535 - 20 - 8,
        SocketAddr::V6(_) => 65535 - 8,
    }
}

/// Plans one `UDP_SEGMENT` send to one destination, datagram by datagram: equal sizes,
/// the last may be shorter, at most `max_segments` and [`max_udp_payload`] bytes.
///
/// ```text
/// let mut b = GsoBatch::new(dst, sock.max_gso_segments_to(dst));
/// for each packet to dst {
///     let len = sealed length;
///     if !b.can_push(len) { send(b.finish()); }          // then this packet starts anew
///     encrypt into gso_buf[b.size()..b.size() + len]; b.push(len);
/// }
/// if let Some(t) = b.finish() { send(t) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GsoBatch {
    destination: SocketAddr,
    max_segments: usize,
    max_bytes: usize,
    segment_size: usize,
    size: usize,
    count: usize,
    /// A shorter datagram was added: nothing may follow.
    closed: bool,
}

impl GsoBatch {
    /// `max_segments` is what the socket allows now (1 without GSO: one datagram per send).
    pub fn new(destination: SocketAddr, max_segments: usize) -> Self {
        GsoBatch {
            destination,
            max_segments: max_segments.max(1),
            max_bytes: max_udp_payload(&destination),
            segment_size: 0,
            size: 0,
            count: 0,
            closed: false,
        }
    }

    /// Bytes planned so far (where the next datagram goes in the send buffer).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Datagrams planned so far.
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn destination(&self) -> SocketAddr {
        self.destination
    }

    /// Whether a datagram of `len` bytes may join this send. An empty batch takes any
    /// datagram up to the size limit.
    pub fn can_push(&self, len: usize) -> bool {
        if len == 0 || len > self.max_bytes {
            return false;
        }
        if self.count == 0 {
            return true;
        }
        !self.closed
            && self.count < self.max_segments
            && len <= self.segment_size
            && self.size + len <= self.max_bytes
    }

    /// Add a datagram; false (and nothing changes) when [`Self::can_push`] says no.
    pub fn push(&mut self, len: usize) -> bool {
        if !self.can_push(len) {
            return false;
        }
        if self.count == 0 {
            self.segment_size = len;
        } else if len < self.segment_size {
            self.closed = true;
        }
        self.size += len;
        self.count += 1;
        true
    }

    /// The planned send (if any), and reset for the next one.
    pub fn finish(&mut self) -> Option<PlannedSend> {
        if self.count == 0 {
            return None;
        }
        let t = PlannedSend {
            destination: self.destination,
            size: self.size,
            segment_size: self.segment_size,
        };
        *self = GsoBatch::new(self.destination, self.max_segments);
        Some(t)
    }
}
