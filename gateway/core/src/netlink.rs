//! The netlink wire format both of the appliance's netlink users share (rtnetlink in
//! `sys::netlink`, nf_tables in `firewall::nft`): message headers, attributes, and the
//! splitting of a received datagram into messages. Pure, so that messages are built and
//! answers read without a socket; the sockets are `riceguard-sys`'s.

// From <linux/netlink.h>.
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
/// A dump the kernel's answer was interrupted by a concurrent change (inconsistent).
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
pub const NLA_F_NESTED: u16 = 0x8000;
pub const NLMSG_HDRLEN: usize = 16;

/// What the kernel sent is not well-formed netlink (a bad length, a field missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("malformed netlink message")
    }
}

impl std::error::Error for Malformed {}

/// One attribute (length, type, data), padded to 4 bytes.
pub fn put_attr(m: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    m.extend_from_slice(&(len as u16).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(data);
    while !m.len().is_multiple_of(4) {
        m.push(0);
    }
}

/// A nested attribute (`NLA_F_NESTED`) holding what `body` writes.
pub fn nest(m: &mut Vec<u8>, kind: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = m.len();
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    body(m);
    let len = (m.len() - start) as u16;
    m[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// The attributes after a family header: (type, data); stops at the first bad length.
pub fn attrs(mut rest: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff; // without NLA_F_ flags
        if len < 4 || len > rest.len() {
            rest = &[];
            return None;
        }
        let data = &rest[4..len];
        let aligned = (len + 3) & !3;
        rest = if aligned >= rest.len() {
            &[]
        } else {
            &rest[aligned..]
        };
        Some((kind, data))
    })
}

/// One netlink message of a datagram: its header's fields and what follows the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// The netlink messages of one datagram; a bad length ends it with `Malformed`.
pub fn messages(mut rest: &[u8]) -> impl Iterator<Item = Result<Msg<'_>, Malformed>> {
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let r = rest;
        let len = match r.get(..4) {
            Some(l) if r.len() >= NLMSG_HDRLEN => u32::from_ne_bytes([l[0], l[1], l[2], l[3]]),
            _ => 0,
        } as usize;
        if len < NLMSG_HDRLEN || len > r.len() {
            rest = &[];
            return Some(Err(Malformed));
        }
        rest = r.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some(Ok(Msg {
            kind: u16::from_ne_bytes([r[4], r[5]]),
            flags: u16::from_ne_bytes([r[6], r[7]]),
            seq: u32::from_ne_bytes([r[8], r[9], r[10], r[11]]),
            payload: &r[NLMSG_HDRLEN..len],
        }))
    })
}

/// The (negative) errno of an `NLMSG_ERROR` or `NLMSG_DONE` payload; 0 is success.
pub fn error_code(p: &[u8]) -> Result<i32, Malformed> {
    match p.get(..4) {
        Some(c) => Ok(i32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
        None => Err(Malformed),
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    #[test]
    fn attributes_pad_nest_and_read_back() {
        let mut m = Vec::new();
        put_attr(&mut m, 3, b"ab");
        nest(&mut m, 4, |m| put_attr(m, 1, &[7; 4]));
        assert_eq!(
            m,
            [6, 0, 3, 0, b'a', b'b', 0, 0, 12, 0, 4, 0x80, 8, 0, 1, 0, 7, 7, 7, 7]
        );
        let got: Vec<_> = attrs(&m).collect();
        assert_eq!(got, [(3, &b"ab"[..]), (4, &m[12..])]);
        // A length past the end stops the walk.
        assert_eq!(attrs(&[9, 0, 1, 0, 0]).count(), 0);
    }

    #[test]
    fn messages_split_and_refuse_bad_lengths() {
        let mut d = vec![
            20, 0, 0, 0, 2, 0, 5, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff,
        ];
        let m: Vec<_> = messages(&d).collect();
        assert_eq!(m.len(), 1);
        let m = m[0].unwrap();
        assert_eq!((m.kind, m.flags, m.seq), (NLMSG_ERROR, 5, 9));
        assert_eq!(error_code(m.payload), Ok(-2));
        assert_eq!(error_code(&m.payload[..3]), Err(Malformed));
        d[0] = 21;
        assert_eq!(messages(&d).collect::<Vec<_>>(), [Err(Malformed)]);
        assert_eq!(messages(&d[..10]).collect::<Vec<_>>(), [Err(Malformed)]);
    }
}
