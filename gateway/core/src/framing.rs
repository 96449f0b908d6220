//! TCP-fallback framing, sans-IO: each WireGuard message on a TCP stream is preceded by
//! its length as a u16 big-endian, nothing else — byte-compatible with Mullvad's
//! udp-over-tcp.
//!
//! This module owns the frame checks (a frame that cannot be a WireGuard message closes
//! its connection), the bounded [`FrameDecoder`], the frame layout for one `writev`
//! ([`encode_batch`], [`BatchIov`]) and the bounded per-connection send ring
//! ([`OutQueue`]) that drops whole packets rather than growing.
//!
//! Bounds: the smallest WireGuard message is an empty data message (keepalive): 16-byte
//! header + 16-byte tag = 32 bytes. The largest frame we accept is [`MAX_MESSAGE_LEN`]
//! = 65507 bytes, the largest UDP payload over IPv4: nothing a WireGuard peer sends over
//! UDP can be longer, so a longer frame is not a WireGuard message. Handshake messages
//! (types 1–3) have exact lengths and are checked for them.

use std::fmt;
use std::time::Duration;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 2;
/// Smallest WireGuard message: an empty data (keepalive) packet.
pub const MIN_MESSAGE_LEN: usize = 32;
/// Largest accepted frame payload: the largest UDP payload over IPv4.
pub const MAX_MESSAGE_LEN: usize = 65507;

const HANDSHAKE_INIT_LEN: usize = 148;
const HANDSHAKE_RESP_LEN: usize = 92;
const COOKIE_REPLY_LEN: usize = 64;

/// Why a frame was refused. Every variant means the stream is not (or no longer) a
/// WireGuard-over-TCP stream: the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is below the smallest WireGuard message.
    TooShort { len: usize },
    /// The length prefix is above the largest accepted message.
    TooLong { len: usize, max: usize },
    /// The message type byte is not 1–4.
    BadType { ty: u8 },
    /// The three bytes after the type are not zero.
    BadReserved,
    /// A handshake or cookie message whose length is not the one its type has.
    WrongLength { ty: u8, len: usize, expected: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooShort { len } => write!(
                f,
                "frame of {len} bytes is shorter than any WireGuard message ({MIN_MESSAGE_LEN}); \
                 the peer is not speaking WireGuard over TCP (u16 big-endian framing)"
            ),
            FrameError::TooLong { len, max } => write!(
                f,
                "frame of {len} bytes is longer than the {max}-byte limit; the peer is not \
                 speaking WireGuard over TCP (u16 big-endian framing)"
            ),
            FrameError::BadType { ty } => write!(
                f,
                "message type {ty} is not a WireGuard message type (1-4); wrong protocol or \
                 framing on this TCP connection"
            ),
            FrameError::BadReserved => f.write_str(
                "WireGuard message has non-zero reserved bytes; wrong protocol or framing on \
                 this TCP connection",
            ),
            FrameError::WrongLength { ty, len, expected } => write!(
                f,
                "WireGuard message type {ty} must be {expected} bytes, frame says {len}"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Check what is known of a frame: `head` is its first bytes (length prefix and, once
/// they have arrived, up to four message bytes). Refuses as early as possible so that
/// garbage (e.g. u32 little-endian framing) is dropped after at most six bytes.
pub fn check_head(head: &[u8], max: usize) -> Result<(), FrameError> {
    if head.len() < HEADER_LEN {
        return Ok(());
    }
    let len = usize::from(u16::from_be_bytes([head[0], head[1]]));
    if len < MIN_MESSAGE_LEN {
        return Err(FrameError::TooShort { len });
    }
    if len > max {
        return Err(FrameError::TooLong { len, max });
    }
    let body = &head[HEADER_LEN..];
    if let Some(&ty) = body.first() {
        let expected = match ty {
            1 => Some(HANDSHAKE_INIT_LEN),
            2 => Some(HANDSHAKE_RESP_LEN),
            3 => Some(COOKIE_REPLY_LEN),
            4 => None,
            _ => return Err(FrameError::BadType { ty }),
        };
        if let Some(expected) = expected {
            if len != expected {
                return Err(FrameError::WrongLength { ty, len, expected });
            }
        }
    }
    if body.iter().skip(1).take(3).any(|&b| b != 0) {
        return Err(FrameError::BadReserved);
    }
    Ok(())
}

/// Check a whole WireGuard message before framing it (used on the send side and in
/// tests); the same rules as for received frames.
pub fn check_message(msg: &[u8], max: usize) -> Result<(), FrameError> {
    let Ok(len) = u16::try_from(msg.len()) else {
        return Err(FrameError::TooLong {
            len: msg.len(),
            max,
        });
    };
    let mut head = [0u8; HEADER_LEN + 4];
    head[..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    let n = msg.len().min(4);
    head[HEADER_LEN..HEADER_LEN + n].copy_from_slice(&msg[..n]);
    check_head(&head[..HEADER_LEN + n], max)
}

/// Reassembles frames from a byte stream split anywhere. Complete frames found in the
/// fed bytes are handed out without copying; only a frame cut by a read boundary is
/// kept, in a buffer that never exceeds `HEADER_LEN + max` bytes (reserved exactly once
/// the length is known, and given back by [`FrameDecoder::release_idle`]).
#[derive(Debug)]
pub struct FrameDecoder {
    partial: Vec<u8>,
    max: usize,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder accepting messages up to `max` bytes (clamped to [`MAX_MESSAGE_LEN`]).
    pub fn new(max: usize) -> Self {
        let max = max.clamp(MIN_MESSAGE_LEN, MAX_MESSAGE_LEN);
        FrameDecoder {
            partial: Vec::new(),
            max,
            failed: None,
        }
    }

    /// Bytes of an incomplete frame held back; non-zero means "mid-frame" (used for
    /// slowloris detection).
    pub fn buffered(&self) -> usize {
        self.partial.len()
    }

    /// Heap bytes held for partial frames (capacity, not content).
    pub fn held(&self) -> usize {
        self.partial.capacity()
    }

    /// Give the partial-frame buffer back when no frame is in progress and it grew past
    /// a small size (a large frame was cut by a read boundary once): a connection that
    /// sent one big frame does not keep 64 KiB for the rest of its life. Meant for a
    /// periodic timer, not the packet path.
    pub fn release_idle(&mut self) {
        const KEEP: usize = 4096;
        if self.partial.is_empty() && self.partial.capacity() > KEEP {
            self.partial = Vec::new();
        }
    }

    /// Feed bytes read from the stream; `on_msg` gets each complete, checked message in
    /// order. Returns how many messages were handed out. After an error the decoder
    /// stays failed (the connection must close) and hands out nothing more.
    pub fn feed<F: FnMut(&[u8])>(
        &mut self,
        mut data: &[u8],
        mut on_msg: F,
    ) -> Result<usize, FrameError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut count = 0;
        // First finish a frame held back from an earlier read.
        if !self.partial.is_empty() {
            let take = self.fill_partial(data)?;
            data = &data[take..];
            match self.partial_complete() {
                Some(total) => {
                    on_msg(&self.partial[HEADER_LEN..total]);
                    count += 1;
                    self.partial.clear();
                }
                None => return Ok(count),
            }
        }
        // Then frames wholly inside `data`, without copying.
        loop {
            if let Err(e) = check_head(&data[..data.len().min(HEADER_LEN + 4)], self.max) {
                self.failed = Some(e);
                return Err(e);
            }
            if data.len() < HEADER_LEN {
                break;
            }
            let total = HEADER_LEN + usize::from(u16::from_be_bytes([data[0], data[1]]));
            if data.len() < total {
                break;
            }
            on_msg(&data[HEADER_LEN..total]);
            count += 1;
            data = &data[total..];
        }
        if !data.is_empty() {
            // The head of the cut frame was checked above; reserve the whole frame
            // once it is known so the buffer never over-allocates.
            let want = if data.len() >= HEADER_LEN {
                HEADER_LEN + usize::from(u16::from_be_bytes([data[0], data[1]]))
            } else {
                HEADER_LEN + 4
            };
            self.partial.reserve_exact(want);
            self.partial.extend_from_slice(data);
        }
        Ok(count)
    }

    /// Append as much of `data` to the partial frame as that frame needs; returns the
    /// number of bytes taken. Checks the head as it grows.
    fn fill_partial(&mut self, data: &[u8]) -> Result<usize, FrameError> {
        let mut taken = 0;
        // Grow the head byte-wise up to 6 bytes so the checks run before the body
        // (a frame is at least 34 bytes, so the head never completes one).
        while self.partial.len() < HEADER_LEN + 4 && taken < data.len() {
            self.partial.push(data[taken]);
            taken += 1;
            if let Err(e) = check_head(&self.partial, self.max) {
                self.failed = Some(e);
                return Err(e);
            }
        }
        if self.partial.len() >= HEADER_LEN + 4 {
            let total =
                HEADER_LEN + usize::from(u16::from_be_bytes([self.partial[0], self.partial[1]]));
            let need = total.saturating_sub(self.partial.len());
            let n = need.min(data.len() - taken);
            // Exactly the frame: no doubling past HEADER_LEN + max.
            self.partial.reserve_exact(n);
            self.partial.extend_from_slice(&data[taken..taken + n]);
            taken += n;
        }
        Ok(taken)
    }

    fn partial_complete(&self) -> Option<usize> {
        if self.partial.len() < HEADER_LEN {
            return None;
        }
        let total =
            HEADER_LEN + usize::from(u16::from_be_bytes([self.partial[0], self.partial[1]]));
        (self.partial.len() >= total).then_some(total)
    }
}

/// What [`encode_batch`] laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Encoded {
    /// Messages consumed from the front of the input.
    pub messages: usize,
    /// Bytes written to the output.
    pub bytes: usize,
}

/// Lay out `[len][msg][len][msg]...` into `out`, taking messages from the front of
/// `msgs` while the total stays within `budget` bytes (and `out`). A message that
/// fails [`check_message`] is skipped (counted as consumed, nothing written): it
/// could only make the peer close the connection. Stops at the first message that
/// does not fit, so order is kept; the caller sends the rest in the next batch.
pub fn encode_batch(msgs: &[&[u8]], out: &mut [u8], budget: usize) -> Encoded {
    let limit = budget.min(out.len());
    let mut enc = Encoded::default();
    for msg in msgs {
        if check_message(msg, MAX_MESSAGE_LEN).is_err() {
            enc.messages += 1;
            continue;
        }
        let end = enc.bytes + HEADER_LEN + msg.len();
        if end > limit {
            break;
        }
        // Cannot truncate: check_message bounded the length to u16.
        let len = msg.len() as u16;
        out[enc.bytes..enc.bytes + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        out[enc.bytes + HEADER_LEN..end].copy_from_slice(msg);
        enc.bytes = end;
        enc.messages += 1;
    }
    enc
}

/// Length prefixes for a zero-copy `writev`: header `i` goes in iovec `2*i`, message
/// `i` in `2*i+1`, so header and message always leave in the same syscall.
#[derive(Debug)]
pub struct BatchIov<const N: usize> {
    headers: [[u8; HEADER_LEN]; N],
    count: usize,
    bytes: usize,
}

impl<const N: usize> Default for BatchIov<N> {
    fn default() -> Self {
        BatchIov {
            headers: [[0; HEADER_LEN]; N],
            count: 0,
            bytes: 0,
        }
    }
}

impl<const N: usize> BatchIov<N> {
    /// Plan headers for the messages at the front of `msgs` within `budget` bytes (at
    /// most `N` messages); returns how many were planned. Invalid messages end the
    /// plan (the caller drops them), so a plan is always a run of valid messages.
    pub fn plan(&mut self, msgs: &[&[u8]], budget: usize) -> usize {
        self.count = 0;
        self.bytes = 0;
        for msg in msgs.iter().take(N) {
            if check_message(msg, MAX_MESSAGE_LEN).is_err() {
                break;
            }
            let add = HEADER_LEN + msg.len();
            if self.bytes + add > budget {
                break;
            }
            self.headers[self.count] = (msg.len() as u16).to_be_bytes();
            self.count += 1;
            self.bytes += add;
        }
        self.count
    }

    /// Header of planned message `i`.
    pub fn header(&self, i: usize) -> &[u8] {
        &self.headers[i]
    }

    /// Total bytes of the plan (headers + messages).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A message could not be queued: the connection's send buffer is full. The whole
/// WireGuard packet is dropped (as a full UDP socket would); nothing partial is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

/// Per-connection send ring of framed bytes with a fixed capacity. Frames go in whole
/// or not at all; bytes go out in any split (the kernel may take part of a frame), and
/// [`OutQueue::slices`] gives at most `budget` bytes as two slices for one `writev`.
///
/// Memory follows use: the ring starts empty and doubles (at most `capacity`) only when
/// a frame does not fit, so a connection that only ever carries handshakes holds a few
/// KiB, not the full capacity. Growth happens a handful of times per connection, never
/// shrinks, and so adds no allocation per packet once a connection has warmed up.
#[derive(Debug)]
pub struct OutQueue {
    buf: Vec<u8>,
    max: usize,
    head: usize,
    len: usize,
    /// Bytes of the newest frame (0 when unknown or partly written).
    last_frame: usize,
}

/// The first allocation of a ring: room for a few handshake messages.
const OUT_QUEUE_MIN: usize = 4096;

impl OutQueue {
    /// A ring of up to `capacity` bytes (at least one frame of the largest message).
    pub fn new(capacity: usize) -> Self {
        OutQueue {
            buf: Vec::new(),
            max: capacity.max(HEADER_LEN + MAX_MESSAGE_LEN),
            head: 0,
            len: 0,
            last_frame: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most bytes the ring will ever hold.
    pub fn capacity(&self) -> usize {
        self.max
    }

    /// Bytes allocated now (grows towards [`OutQueue::capacity`] with use).
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Make room for `need` more bytes if the limit allows: a new ring of twice the
    /// size (at least what is needed, at most the limit), contents moved to its front.
    fn grow(&mut self, need: usize) {
        let want = self.len + need;
        if want <= self.buf.len() || want > self.max {
            return;
        }
        let size = (self.buf.len() * 2)
            .max(want)
            .max(OUT_QUEUE_MIN)
            .min(self.max);
        let mut buf = vec![0; size];
        let (a, b) = self.slices(self.len);
        buf[..a.len()].copy_from_slice(a);
        buf[a.len()..a.len() + b.len()].copy_from_slice(b);
        self.buf = buf;
        self.head = 0;
    }

    /// Append one framed message, or refuse it whole. Invalid messages are refused as
    /// [`FrameError`]s by the caller's check; here only room is considered.
    pub fn push(&mut self, msg: &[u8]) -> Result<(), QueueFull> {
        let Ok(len) = u16::try_from(msg.len()) else {
            return Err(QueueFull);
        };
        self.grow(HEADER_LEN + msg.len());
        if self.len + HEADER_LEN + msg.len() > self.buf.len() {
            return Err(QueueFull);
        }
        self.put(&len.to_be_bytes());
        self.put(msg);
        self.last_frame = HEADER_LEN + msg.len();
        Ok(())
    }

    fn put(&mut self, data: &[u8]) {
        let cap = self.buf.len();
        let tail = (self.head + self.len) % cap;
        let first = data.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&data[..first]);
        self.buf[..data.len() - first].copy_from_slice(&data[first..]);
        self.len += data.len();
    }

    /// Bytes of the newest queued frame, if it is wholly queued.
    pub fn last_frame(&self) -> usize {
        self.last_frame
    }

    /// Up to `budget` queued bytes, in order, as (first, second) slices.
    pub fn slices(&self, budget: usize) -> (&[u8], &[u8]) {
        let n = self.len.min(budget);
        let cap = self.buf.len();
        if cap == 0 {
            return (&[], &[]);
        }
        let first = n.min(cap - self.head);
        (
            &self.buf[self.head..self.head + first],
            &self.buf[..n - first],
        )
    }

    /// Drop `n` bytes from the front (they were written).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        self.last_frame = self.last_frame.min(self.len);
        if self.len == 0 {
            self.head = 0;
        }
    }
}

/// Where to split one write of `total` bytes whose last frame is `last_frame` bytes so
/// that TCP does not cut off a tail smaller than any WireGuard message: a write pushed
/// onto an idle connection leaves as `total / mss` full segments plus `total % mss`
/// bytes. When that remainder is tiny (1..32 bytes) and sending the last frame as a
/// second write avoids it, returns the length of the first write.
pub fn tail_split(total: usize, last_frame: usize, mss: usize) -> Option<usize> {
    let tiny = |n: usize| mss > 0 && (1..MIN_MESSAGE_LEN).contains(&(n % mss));
    (total > mss && tiny(total) && last_frame > 0 && last_frame < total)
        .then(|| total - last_frame)
        .filter(|first| !tiny(*first) && !tiny(last_frame))
}

/// When to write what has been queued. Interactive traffic (a packet arriving with
/// nothing queued, `interactive_gap` or more after the previous write) goes out at
/// once; packets that follow closely are bulk: they gather and are written once per
/// batch, or as soon as a full write budget (a multiple of the MSS) has gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalescePolicy {
    /// Bytes per write syscall: `mss_multiple` segments' worth, at most `max_write`.
    pub mss_multiple: usize,
    pub max_write: usize,
    /// A packet this long after the previous write, with nothing queued, is
    /// interactive.
    pub interactive_gap: Duration,
}

impl Default for CoalescePolicy {
    fn default() -> Self {
        CoalescePolicy {
            mss_multiple: 44,
            max_write: 64 * 1024,
            interactive_gap: Duration::from_micros(500),
        }
    }
}

impl CoalescePolicy {
    /// Bytes to hand the kernel in one write for a connection with this MSS: whole
    /// segments, so bulk leaves as full segments.
    pub fn write_budget(&self, mss: usize) -> usize {
        let mss = mss.clamp(536, 9000);
        (mss * self.mss_multiple)
            .min(self.max_write / mss * mss)
            .max(mss)
    }

    /// Whether queued bytes should be written now while a batch is still being queued
    /// (`batch_done` false) or at its end.
    pub fn flush_now(&self, queued: usize, batch_done: bool, mss: usize) -> bool {
        batch_done || queued >= self.write_budget(mss)
    }

    /// For a single packet sent without batch boundaries: write it at once
    /// (interactive) or let it gather behind a deferred flush (bulk)?
    /// `queued_before`: bytes already waiting; `since_write`: time since the last
    /// write (`None`: never written).
    pub fn is_interactive(&self, queued_before: usize, since_write: Option<Duration>) -> bool {
        queued_before == 0 && since_write.is_none_or(|d| d >= self.interactive_gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_msg(len: usize, fill: u8) -> Vec<u8> {
        let mut m = vec![fill; len];
        m[..4].copy_from_slice(&[4, 0, 0, 0]);
        m
    }

    fn frame(msg: &[u8]) -> Vec<u8> {
        let mut v = (msg.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    fn decode_all(dec: &mut FrameDecoder, chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut out = Vec::new();
        for c in chunks {
            dec.feed(c, |m| out.push(m.to_vec()))?;
        }
        Ok(out)
    }

    #[test]
    fn split_at_every_position() {
        let msgs = [data_msg(32, 1), vec![1; 148], data_msg(1000, 3)];
        let mut msgs = msgs.to_vec();
        msgs[1][1..4].fill(0);
        let stream: Vec<u8> = msgs.iter().flat_map(|m| frame(m)).collect();
        for cut1 in 0..stream.len() {
            for cut2 in [
                cut1,
                (cut1 + 1).min(stream.len()),
                (cut1 + 7).min(stream.len()),
            ] {
                let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
                let got = decode_all(
                    &mut dec,
                    &[&stream[..cut1], &stream[cut1..cut2], &stream[cut2..]],
                )
                .unwrap();
                assert_eq!(got, msgs, "cuts at {cut1}/{cut2}");
                assert_eq!(dec.buffered(), 0);
            }
        }
    }

    #[test]
    fn byte_by_byte_and_many_per_read() {
        let msgs: Vec<Vec<u8>> = (0..50).map(|i| data_msg(32 + i * 7, i as u8)).collect();
        let stream: Vec<u8> = msgs.iter().flat_map(|m| frame(m)).collect();
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        let mut got = Vec::new();
        assert_eq!(dec.feed(&stream, |m| got.push(m.to_vec())), Ok(50));
        assert_eq!(got, msgs);
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        let singles: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decode_all(&mut dec, &singles).unwrap(), msgs);
    }

    #[test]
    fn length_boundaries() {
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        assert_eq!(dec.feed(&frame(&data_msg(32, 0)), |_| {}), Ok(1));
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        assert_eq!(
            dec.feed(&[0, 31], |_| {}),
            Err(FrameError::TooShort { len: 31 })
        );
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        assert_eq!(
            dec.feed(&frame(&data_msg(MAX_MESSAGE_LEN, 9)), |_| {}),
            Ok(1)
        );
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        let too_long = ((MAX_MESSAGE_LEN + 1) as u16).to_be_bytes();
        assert_eq!(
            dec.feed(&too_long, |_| {}),
            Err(FrameError::TooLong {
                len: MAX_MESSAGE_LEN + 1,
                max: MAX_MESSAGE_LEN
            })
        );
        // A smaller configured maximum (MTU-bound) is honoured.
        let mut dec = FrameDecoder::new(1452);
        assert_eq!(dec.feed(&frame(&data_msg(1452, 0)), |_| {}), Ok(1));
        assert!(dec.feed(&frame(&data_msg(1453, 0)), |_| {}).is_err());
    }

    #[test]
    fn bad_types_and_reserved_and_lengths() {
        for ty in [0u8, 5, 255] {
            let mut m = data_msg(64, 0);
            m[0] = ty;
            let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
            assert_eq!(
                dec.feed(&frame(&m), |_| {}),
                Err(FrameError::BadType { ty })
            );
        }
        let mut m = data_msg(64, 0);
        m[2] = 1;
        assert_eq!(
            FrameDecoder::new(MAX_MESSAGE_LEN).feed(&frame(&m), |_| {}),
            Err(FrameError::BadReserved)
        );
        let mut m = vec![0u8; 100];
        m[0] = 1;
        assert_eq!(
            FrameDecoder::new(MAX_MESSAGE_LEN).feed(&frame(&m), |_| {}),
            Err(FrameError::WrongLength {
                ty: 1,
                len: 100,
                expected: 148
            })
        );
        // Failed stays failed, even for good bytes afterwards.
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        assert!(dec.feed(&[0, 1], |_| {}).is_err());
        assert!(dec.feed(&frame(&data_msg(40, 0)), |_| {}).is_err());
    }

    #[test]
    fn message_after_good_frame_is_still_checked() {
        let mut stream = frame(&data_msg(40, 0));
        stream.extend_from_slice(&[0, 40, 9, 0, 0, 0]);
        let mut n = 0;
        assert_eq!(
            FrameDecoder::new(MAX_MESSAGE_LEN).feed(&stream, |_| n += 1),
            Err(FrameError::BadType { ty: 9 })
        );
        assert_eq!(n, 1);
    }

    #[test]
    fn u32_le_framing_rejected_within_six_bytes() {
        // crates.io `udp-over-tcp`: u32 little-endian length then the datagram.
        for (len, ty) in [(148u32, 1u8), (92, 2), (32, 4), (1452, 4), (64, 3)] {
            let mut msg = vec![0u8; len as usize];
            msg[0] = ty;
            let mut stream = len.to_le_bytes().to_vec();
            stream.extend_from_slice(&msg);
            // Fed byte by byte, the error must come by the sixth byte.
            let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
            let pos = stream.iter().position(|b| dec.feed(&[*b], |_| {}).is_err());
            assert!(
                matches!(pos, Some(p) if p < 6),
                "len {len}: rejected at {pos:?}"
            );
            // And in one read.
            assert!(FrameDecoder::new(MAX_MESSAGE_LEN)
                .feed(&stream, |_| {})
                .is_err());
        }
    }

    #[test]
    fn partial_buffer_bounded() {
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        let f = frame(&data_msg(MAX_MESSAGE_LEN, 1));
        assert_eq!(dec.feed(&f[..f.len() - 1], |_| {}), Ok(0));
        assert!(dec.buffered() <= HEADER_LEN + MAX_MESSAGE_LEN);
        assert_eq!(dec.feed(&f[f.len() - 1..], |_| {}), Ok(1));
        assert_eq!(dec.buffered(), 0);
    }

    /// Seeded random streams (garbage, and valid streams with random corruption)
    /// never panic, never hand out an invalid message, and keep the buffer bounded.
    #[test]
    fn random_input_is_safe() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..2000 {
            let mut stream: Vec<u8> = Vec::new();
            if round % 2 == 0 {
                stream.extend((0..(rnd() % 4096)).map(|_| rnd() as u8));
            } else {
                for _ in 0..(rnd() % 20) {
                    stream.extend(frame(&data_msg(32 + (rnd() % 3000) as usize, 1)));
                }
                if !stream.is_empty() {
                    let i = (rnd() as usize) % stream.len();
                    stream[i] = rnd() as u8;
                }
            }
            let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
            let mut pos = 0;
            while pos < stream.len() {
                let n = 1 + (rnd() as usize) % 1500;
                let end = (pos + n).min(stream.len());
                let r = dec.feed(&stream[pos..end], |m| {
                    assert!(check_message(m, MAX_MESSAGE_LEN).is_ok());
                });
                assert!(dec.buffered() <= HEADER_LEN + MAX_MESSAGE_LEN);
                if r.is_err() {
                    break;
                }
                pos = end;
            }
        }
    }

    #[test]
    fn encode_batch_budget_and_roundtrip() {
        let msgs: Vec<Vec<u8>> = (0..10).map(|i| data_msg(100 + i, i as u8)).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        let mut out = vec![0u8; 65536];
        let enc = encode_batch(&refs, &mut out, 350);
        assert_eq!(
            enc,
            Encoded {
                messages: 3,
                bytes: 102 + 103 + 104
            }
        );
        let all = encode_batch(&refs, &mut out, usize::MAX);
        assert_eq!(all.messages, 10);
        let mut got = Vec::new();
        FrameDecoder::new(MAX_MESSAGE_LEN)
            .feed(&out[..all.bytes], |m| got.push(m.to_vec()))
            .unwrap();
        assert_eq!(got, msgs);
        // Invalid messages are skipped, never framed.
        let bad = [0u8; 10];
        let enc = encode_batch(&[&bad, &msgs[0]], &mut out, usize::MAX);
        assert_eq!(
            enc,
            Encoded {
                messages: 2,
                bytes: 102
            }
        );
    }

    #[test]
    fn batch_iov_plan() {
        let msgs: Vec<Vec<u8>> = (0..5).map(|_| data_msg(200, 0)).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        let mut iov = BatchIov::<4>::default();
        assert_eq!(iov.plan(&refs, usize::MAX), 4);
        assert_eq!(iov.header(0), &[0, 200]);
        assert_eq!(iov.bytes(), 4 * 202);
        assert_eq!(iov.plan(&refs, 500), 2);
    }

    #[test]
    fn out_queue_whole_frames_and_wrap() {
        let mut q = OutQueue::new(0);
        let cap = q.capacity();
        let big = data_msg(40000, 7);
        assert_eq!(q.push(&big), Ok(()));
        assert_eq!(
            q.push(&big),
            Err(QueueFull),
            "refused whole, not partially queued"
        );
        assert_eq!(q.len(), 40002);
        q.consume(40001);
        assert_eq!(q.push(&big), Ok(()));
        assert_eq!(q.push(&data_msg(cap - 40003 - 2 + 1, 0)), Err(QueueFull));
        let mut stream = Vec::new();
        let (a, b) = q.slices(usize::MAX);
        stream.extend_from_slice(a);
        stream.extend_from_slice(b);
        assert_eq!(stream.len(), 40003);
        // Last byte of the first frame, then the whole second frame.
        assert_eq!(stream[0], 7);
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        assert_eq!(dec.feed(&stream[1..], |m| assert_eq!(m, &big[..])), Ok(1));
        let (a, b) = q.slices(10);
        assert_eq!(a.len() + b.len(), 10);
        q.consume(40003);
        assert!(q.is_empty());
    }

    #[test]
    fn out_queue_memory_follows_use_and_wraps() {
        let mut q = OutQueue::new(128 * 1024);
        assert_eq!(q.allocated(), 0, "nothing until the first frame");
        q.push(&[1u8; 92]).unwrap();
        assert_eq!(q.allocated(), OUT_QUEUE_MIN, "a handshake needs a few KiB");
        // Fill, drain part, refill across the end of the ring, then grow while wrapped:
        // order and content survive.
        let mut sent = [(92u16).to_be_bytes().to_vec(), vec![1u8; 92]].concat();
        let mut got = Vec::new();
        for i in 0..200u8 {
            let m = data_msg(100 + usize::from(i) * 7, i);
            if q.push(&m).is_ok() {
                sent.extend_from_slice(&(m.len() as u16).to_be_bytes());
                sent.extend_from_slice(&m);
            }
            if i % 3 == 0 {
                let (a, b) = q.slices(500);
                let n = a.len() + b.len();
                got.extend_from_slice(a);
                got.extend_from_slice(b);
                q.consume(n);
            }
        }
        let (a, b) = q.slices(usize::MAX);
        got.extend_from_slice(a);
        got.extend_from_slice(b);
        assert_eq!(got, sent);
        assert!(q.allocated() <= q.capacity());
        assert_eq!(q.capacity(), 128 * 1024);
    }

    #[test]
    fn decoder_gives_back_big_buffers() {
        let mut dec = FrameDecoder::new(MAX_MESSAGE_LEN);
        let f = frame(&data_msg(60000, 1));
        assert_eq!(dec.feed(&f[..30000], |_| {}), Ok(0));
        assert!(dec.held() >= 30000 && dec.held() <= HEADER_LEN + MAX_MESSAGE_LEN);
        dec.release_idle();
        assert_eq!(dec.buffered(), 30000, "never drops a frame in progress");
        assert_eq!(dec.feed(&f[30000..], |_| {}), Ok(1));
        dec.release_idle();
        assert_eq!(dec.held(), 0);
    }

    #[test]
    fn tail_split_avoids_tiny_tails() {
        // 22 frames of 98 bytes = 2156 = 1448 + 708: fine as it is.
        assert_eq!(tail_split(2156, 98, 1448), None);
        // 1450 = 1448 + 2: a 2-byte tail; sending the last 98-byte frame apart fixes it.
        assert_eq!(tail_split(1450, 98, 1448), Some(1352));
        // A single frame cannot be split; a small write has no tail.
        assert_eq!(tail_split(1450, 1450, 1448), None);
        assert_eq!(tail_split(100, 50, 1448), None);
        // Never trade one tiny tail for another.
        assert_eq!(tail_split(2 * 1448 + 5, 1448 + 10, 1448), None);
        let mut q = OutQueue::new(0);
        q.push(&data_msg(96, 0)).unwrap();
        q.push(&data_msg(40, 0)).unwrap();
        assert_eq!(q.last_frame(), 42);
        q.consume(120);
        assert_eq!(q.last_frame(), 20, "partly written: only what is left");
    }

    #[test]
    fn coalesce_policy() {
        let p = CoalescePolicy::default();
        assert_eq!(p.write_budget(1448), 1448 * 44);
        assert_eq!(p.write_budget(1448) % 1448, 0);
        assert!(p.write_budget(1448) <= 64 * 1024);
        assert!(p.flush_now(10, true, 1448));
        assert!(!p.flush_now(10, false, 1448));
        assert!(p.flush_now(p.write_budget(1448), false, 1448));
        // A lone packet after a pause goes at once; one right behind another gathers.
        assert!(p.is_interactive(0, None));
        assert!(p.is_interactive(0, Some(Duration::from_millis(20))));
        assert!(!p.is_interactive(0, Some(Duration::from_micros(50))));
        assert!(!p.is_interactive(1400, Some(Duration::from_secs(1))));
    }
}
