//! nf_tables over netlink (`NETLINK_NETFILTER`): installs the firewall — a [`Ruleset`]
//! computed as plain data in `core::firewall::rules` — as one batch transaction, deletes
//! it, and reads its named counters back.
//!
//! Hand-written because the static image carries neither the `nft` binary nor libnftnl:
//! the `nftnl` crate binds that C library and `rustables` is GPL-3.0 (we are
//! BSD-3-Clause), while what we send is small: a table, counter objects, chains, and
//! rules built from ten expressions (`meta`, `cmp`, `payload`, `bitwise`, `ct`, `limit`,
//! `objref`, `immediate`, `notrack`, `masq`), encoded as nft 1.0 encodes the same rules
//! so that `nft list` prints them as nft's own. Messages are built by pure functions,
//! tested byte for byte; the socket is `nix`'s safe wrappers, so no `unsafe` here.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeVal;

use riceguard_core::netlink::{attrs, put_attr as attr};
use riceguard_core::firewall::forwarding::{self, Installed};
use riceguard_core::firewall::rules::{Action, Chain, Family, Hook, Match, Rule, Ruleset, L4};
use riceguard_core::net::Cidr;

// <linux/netlink.h>, <linux/netfilter/nfnetlink.h>, <linux/netfilter/nf_tables.h>: spelled
// out so the encoding is testable without a kernel.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_GETTABLE: u8 = 1;
const NFT_MSG_DELTABLE: u8 = 2;
const NFT_MSG_NEWCHAIN: u8 = 3;
const NFT_MSG_NEWRULE: u8 = 6;
const NFT_MSG_NEWOBJ: u8 = 18;
const NFT_MSG_GETOBJ: u8 = 19;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_LIMIT_RATE: u16 = 1;
const NFTA_LIMIT_UNIT: u16 = 2;
const NFTA_LIMIT_BURST: u16 = 3;
const NFTA_LIMIT_TYPE: u16 = 4;
const NFTA_FIB_DREG: u16 = 1;
const NFTA_FIB_RESULT: u16 = 2;
const NFTA_FIB_FLAGS: u16 = 3;
const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
const NFTA_FIB_F_DADDR: u32 = 2;
const NFTA_MASQ_FLAGS: u16 = 1;
const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
const NFTA_MASQ_REG_PROTO_MAX: u16 = 3;
const NFT_REG_2: u32 = 2;
/// The port range is to be used (without it masq ignores the registers).
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NFT_CMP_GTE: u32 = 5;
const NFT_CMP_LTE: u32 = 3;
const NFTA_OBJREF_IMM_TYPE: u16 = 1;
const NFTA_OBJREF_IMM_NAME: u16 = 2;

const NFT_OBJECT_COUNTER: u32 = 1;
/// Every expression loads into and compares from the one 128-bit register 1, as nft does.
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CT_STATE: u32 = 0;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_LIMIT_PKTS: u32 = 0;
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_RETURN: i32 = -5;
/// libnftnl's rule and table userdata TLVs holding `comment "..."`.
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
const NFTNL_UDATA_TABLE_COMMENT: u8 = 0;
const IFNAMSIZ: usize = 16;
const NFT_NAME_MAXLEN: usize = 256;
/// Every wait for the kernel is bounded by this (it answers a batch before `send` returns).
const TIMEOUT_S: i64 = 5;

/// Why an nf_tables request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum NftError {
    /// This kernel has no nf_tables (or no netfilter netlink at all).
    Unavailable(Errno),
    /// The socket could not be opened, bound, written or read.
    Socket(Errno),
    /// The ruleset cannot be encoded (a name too long or holding a NUL, a bad prefix).
    Invalid(String),
    /// The kernel refused `what` (one message of a batch, or the transaction as a whole).
    Kernel { what: String, errno: Errno },
    /// No answer to `what` within the timeout.
    NoAnswer(String),
    /// The kernel's answer was not well-formed netlink.
    Malformed,
}

impl fmt::Display for NftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftError::Unavailable(e) => write!(
                f,
                "nf_tables not available ({e}): is the nf_tables module loaded?"
            ),
            NftError::Socket(e) => write!(f, "netfilter netlink socket: {e}"),
            NftError::Invalid(why) => write!(f, "firewall ruleset cannot be encoded: {why}"),
            NftError::Kernel { what, errno } => {
                let hint = match *errno {
                    Errno::EPERM => " (needs CAP_NET_ADMIN)",
                    Errno::ENOENT => {
                        " (a counter it names is missing, or the nf_tables module of a chain \
                         type or expression is not loaded)"
                    }
                    Errno::EOPNOTSUPP => " (not allowed in this chain: masquerade outside nat?)",
                    _ => "",
                };
                write!(f, "nf_tables: {what}: the kernel said {errno}{hint}")
            }
            NftError::NoAnswer(what) => {
                write!(f, "nf_tables: no answer to {what} within {TIMEOUT_S} s")
            }
            NftError::Malformed => {
                f.write_str("malformed netfilter netlink answer from the kernel")
            }
        }
    }
}

impl std::error::Error for NftError {}

impl NftError {
    /// The errno the kernel refused a message with, if that is what happened.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NftError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Replace table `rs.table` (family inet) whole in ONE netlink batch transaction:
/// create-if-absent the table, delete it, create it again with its counters (initial
/// `(packets, bytes)` from `initial`, by name; absent = 0), chains and rules. Either all
/// of it applies or nothing changes. The new table's comment is `rs`'s
/// [`forwarding::tag`], which [`installed`] reads back: whoever finds the table can tell
/// which ruleset it is.
pub fn replace(rs: &Ruleset, initial: &HashMap<String, (u64, u64)>) -> Result<(), NftError> {
    validate(rs)?;
    Socket::open()?.transact(&replace_batch(rs, initial, 1))
}

/// Delete table `name` (family inet) if it exists. `Ok(true)` if it was there.
pub fn remove(name: &str) -> Result<bool, NftError> {
    check_name("table", name, NFT_NAME_MAXLEN)?;
    let mut b = Batch::new(1);
    table(&mut b, NFT_MSG_DELTABLE, 0, name);
    b.end();
    match Socket::open()?.transact(&b) {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether table `name` (family inet) exists.
pub fn exists(name: &str) -> Result<bool, NftError> {
    check_name("table", name, NFT_NAME_MAXLEN)?;
    let m = request(NFT_MSG_GETTABLE, NLM_F_ACK, |m| {
        attr_str(m, NFTA_TABLE_NAME, name)
    });
    match Socket::open()?.query(&m, "get table", |_| Ok(())) {
        Ok(_) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(unavailable(e)),
    }
}

/// Table `name` (family inet) as the kernel has it: absent, or there with its comment
/// (the [`forwarding::tag`] of the ruleset [`replace`] installed), or unreadable.
pub fn installed(name: &str) -> Installed {
    match table_comment(name) {
        Ok(None) => Installed::Absent,
        Ok(Some(comment)) => Installed::Present { comment },
        Err(e) => Installed::Unreadable(e.to_string()),
    }
}

/// `None`: no table `name`; `Some(comment)` otherwise.
fn table_comment(name: &str) -> Result<Option<Option<String>>, NftError> {
    check_name("table", name, NFT_NAME_MAXLEN)?;
    let m = request(NFT_MSG_GETTABLE, NLM_F_ACK, |m| {
        attr_str(m, NFTA_TABLE_NAME, name)
    });
    let mut comment = None;
    let r = Socket::open()?.query(&m, "get table", |msg| {
        if msg.kind == nft_type(NFT_MSG_NEWTABLE) {
            comment = parse_table_comment(msg.payload)?;
        }
        Ok(())
    });
    match r {
        Ok(_) => Ok(Some(comment)),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(None),
        Err(e) => Err(unavailable(e)),
    }
}

/// The named counters of table `name`: (name, packets, bytes), via an `NFT_MSG_GETOBJ`
/// dump. Empty when the table does not exist.
pub fn counters(name: &str) -> Result<Vec<(String, u64, u64)>, NftError> {
    check_name("table", name, NFT_NAME_MAXLEN)?;
    let m = request(NFT_MSG_GETOBJ, NLM_F_DUMP, |m| {
        attr_str(m, NFTA_OBJ_TABLE, name);
        attr_u32(m, NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
    });
    let mut s = Socket::open()?;
    // A dump that a concurrent change interrupted is inconsistent: ask again.
    for _ in 0..3 {
        let mut out = Vec::new();
        let r = s.query(&m, "list counters", |msg| {
            if msg.kind == nft_type(NFT_MSG_NEWOBJ) {
                out.extend(parse_counter(msg.payload, name)?);
            }
            Ok(())
        });
        match r {
            Ok(true) => return Ok(out),
            Ok(false) => continue,
            Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(unavailable(e)),
        }
    }
    Err(kernel("list counters", -(Errno::EINTR as i32)))
}

/// Outside a batch, nfnetlink answers a message for a subsystem it does not have with
/// `EINVAL` (a batch gets `EOPNOTSUPP`); our two queries are well-formed otherwise.
fn unavailable(e: NftError) -> NftError {
    match e.errno() {
        Some(errno @ (Errno::EINVAL | Errno::EOPNOTSUPP)) => NftError::Unavailable(errno),
        _ => e,
    }
}

// ---- Checks: what the kernel would misread rather than refuse. ----

fn check_name(kind: &str, s: &str, max: usize) -> Result<(), NftError> {
    if s.is_empty() || s.len() >= max || s.contains('\0') {
        return Err(NftError::Invalid(format!(
            "{kind} name {s:?} must be 1 to {} bytes without NUL",
            max - 1
        )));
    }
    Ok(())
}

fn validate(rs: &Ruleset) -> Result<(), NftError> {
    check_name("table", &rs.table, NFT_NAME_MAXLEN)?;
    for c in &rs.counters {
        check_name("counter", c, NFT_NAME_MAXLEN)?;
    }
    for c in &rs.chains {
        check_name("chain", &c.name, NFT_NAME_MAXLEN)?;
        for r in &c.rules {
            if let Some(n) = &r.counter {
                check_name("counter", n, NFT_NAME_MAXLEN)?;
            }
            for x in &r.matches {
                match x {
                    Match::Iif { name, .. } | Match::Oif { name, .. } => {
                        check_name("interface", name, IFNAMSIZ)?
                    }
                    Match::Saddr { net, .. } | Match::Daddr { net, .. }
                        if net.prefix > net.max_prefix() =>
                    {
                        return Err(NftError::Invalid(format!(
                            "prefix length {} of {}",
                            net.prefix, net.addr
                        )));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

// ---- Message building: pure, into caller-owned buffers. ----

/// Appends one message: netlink header (type, flags, sequence number), `nfgenmsg`
/// (family, version 0, resource id big-endian), then what `body` writes.
fn message(m: &mut Vec<u8>, hdr: (u16, u16, u32), nfgen: [u8; 4], body: impl FnOnce(&mut Vec<u8>)) {
    let start = m.len();
    m.extend_from_slice(&0u32.to_ne_bytes()); // length, patched below
    m.extend_from_slice(&hdr.0.to_ne_bytes());
    m.extend_from_slice(&hdr.1.to_ne_bytes());
    m.extend_from_slice(&hdr.2.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    m.extend_from_slice(&nfgen);
    body(m);
    let len = (m.len() - start) as u32;
    m[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

const INET: [u8; 4] = [NFPROTO_INET, 0, 0, 0];
/// Batch begin and end: AF_UNSPEC, resource id NFNL_SUBSYS_NFTABLES.
const BATCH: [u8; 4] = [NFPROTO_UNSPEC, 0, 0, NFNL_SUBSYS_NFTABLES as u8];

fn nft_type(kind: u8) -> u16 {
    NFNL_SUBSYS_NFTABLES << 8 | u16::from(kind)
}

/// A request outside a batch (sequence number 1, on a socket of its own).
fn request(kind: u8, flags: u16, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    message(
        &mut m,
        (nft_type(kind), NLM_F_REQUEST | flags, 1),
        INET,
        body,
    );
    m
}

/// A NUL-terminated string, as libnftnl sends names.
fn attr_str(m: &mut Vec<u8>, kind: u16, s: &str) {
    attr(m, kind, &[s.as_bytes(), &[0]].concat());
}

fn attr_u32(m: &mut Vec<u8>, kind: u16, v: u32) {
    attr(m, kind, &v.to_be_bytes());
}

fn attr_u64(m: &mut Vec<u8>, kind: u16, v: u64) {
    attr(m, kind, &v.to_be_bytes());
}

fn nest(m: &mut Vec<u8>, kind: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = m.len();
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    body(m);
    let len = (m.len() - start) as u16;
    m[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// A batch transaction: `BATCH_BEGIN`, messages that each ask for an ack, `BATCH_END`.
struct Batch {
    buf: Vec<u8>,
    begin: u32,
    /// What each message does (message `i` has sequence number `begin + 1 + i`).
    what: Vec<String>,
}

impl Batch {
    fn new(seq: u32) -> Batch {
        let mut buf = Vec::with_capacity(4096);
        message(
            &mut buf,
            (NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq),
            BATCH,
            |_| {},
        );
        let what = Vec::new();
        Batch {
            buf,
            begin: seq,
            what,
        }
    }

    /// The sequence number of message `i`.
    fn seq(&self, i: usize) -> u32 {
        self.begin.wrapping_add(1).wrapping_add(i as u32)
    }

    fn add(&mut self, kind: u8, flags: u16, what: String, body: impl FnOnce(&mut Vec<u8>)) {
        let hdr = (
            nft_type(kind),
            NLM_F_REQUEST | NLM_F_ACK | flags,
            self.seq(self.what.len()),
        );
        message(&mut self.buf, hdr, INET, body);
        self.what.push(what);
    }

    fn end(&mut self) {
        let hdr = (NFNL_MSG_BATCH_END, NLM_F_REQUEST, self.seq(self.what.len()));
        message(&mut self.buf, hdr, BATCH, |_| {});
    }
}

fn replace_batch(rs: &Ruleset, initial: &HashMap<String, (u64, u64)>, seq: u32) -> Batch {
    let t = rs.table.as_str();
    let mut b = Batch::new(seq);
    // Created first so the delete cannot fail with ENOENT; the second create starts empty.
    table(&mut b, NFT_MSG_NEWTABLE, NLM_F_CREATE, t);
    table(&mut b, NFT_MSG_DELTABLE, 0, t);
    let tag = forwarding::tag(rs);
    b.add(
        NFT_MSG_NEWTABLE,
        NLM_F_CREATE,
        format!("add table inet {t}"),
        |m| {
            attr_str(m, NFTA_TABLE_NAME, t);
            attr(
                m,
                NFTA_TABLE_USERDATA,
                &comment_udata(NFTNL_UDATA_TABLE_COMMENT, &tag),
            );
        },
    );
    for c in &rs.counters {
        counter(&mut b, t, c, initial.get(c).copied().unwrap_or((0, 0)));
    }
    for c in &rs.chains {
        chain(&mut b, t, c);
    }
    for c in &rs.chains {
        for (i, r) in c.rules.iter().enumerate() {
            rule(&mut b, t, &c.name, i + 1, r);
        }
    }
    b.end();
    b
}

fn table(b: &mut Batch, kind: u8, flags: u16, name: &str) {
    let verb = if kind == NFT_MSG_DELTABLE {
        "delete"
    } else {
        "add"
    };
    b.add(kind, flags, format!("{verb} table inet {name}"), |m| {
        attr_str(m, NFTA_TABLE_NAME, name)
    });
}

/// A counter object; `EXCL`, so a name listed twice is refused, not merged.
fn counter(b: &mut Batch, table: &str, name: &str, (packets, bytes): (u64, u64)) {
    let f = NLM_F_CREATE | NLM_F_EXCL;
    b.add(NFT_MSG_NEWOBJ, f, format!("add counter {name}"), |m| {
        attr_str(m, NFTA_OBJ_TABLE, table);
        attr_str(m, NFTA_OBJ_NAME, name);
        attr_u32(m, NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
        nest(m, NFTA_OBJ_DATA, |m| {
            attr_u64(m, NFTA_COUNTER_BYTES, bytes);
            attr_u64(m, NFTA_COUNTER_PACKETS, packets);
        });
    });
}

fn chain(b: &mut Batch, table: &str, c: &Chain) {
    let f = NLM_F_CREATE | NLM_F_EXCL;
    b.add(NFT_MSG_NEWCHAIN, f, format!("add chain {}", c.name), |m| {
        attr_str(m, NFTA_CHAIN_TABLE, table);
        attr_str(m, NFTA_CHAIN_NAME, &c.name);
        if let Some(base) = c.base {
            let hook = match base.hook {
                Hook::Prerouting => 0,
                Hook::Input => 1,
                Hook::Forward => 2,
                Hook::Output => 3,
                Hook::Postrouting => 4,
            };
            nest(m, NFTA_CHAIN_HOOK, |m| {
                attr_u32(m, NFTA_HOOK_HOOKNUM, hook);
                attr(m, NFTA_HOOK_PRIORITY, &base.priority.to_be_bytes());
            });
            let policy = if base.policy_drop { NF_DROP } else { NF_ACCEPT };
            attr(m, NFTA_CHAIN_POLICY, &policy.to_be_bytes());
            attr_str(m, NFTA_CHAIN_TYPE, base.kind.as_str());
        }
    });
}

/// A rule appended to its chain (without `APPEND` the kernel would insert it first).
fn rule(b: &mut Batch, table: &str, chain: &str, index: usize, r: &Rule) {
    let mut what = format!("add rule {index} of chain {chain}");
    if !r.comment.is_empty() {
        what += &format!(" ({})", r.comment);
    }
    b.add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, what, |m| {
        attr_str(m, NFTA_RULE_TABLE, table);
        attr_str(m, NFTA_RULE_CHAIN, chain);
        nest(m, NFTA_RULE_EXPRESSIONS, |m| rule_exprs(m, r));
        if !r.comment.is_empty() {
            attr(
                m,
                NFTA_RULE_USERDATA,
                &comment_udata(NFTNL_UDATA_RULE_COMMENT, r.comment),
            );
        }
    });
}

/// nft's `comment "..."`: one userdata TLV of type `kind`, NUL-terminated, at most 255
/// bytes with it.
fn comment_udata(kind: u8, c: &str) -> Vec<u8> {
    let mut end = c.len().min(254);
    while !c.is_char_boundary(end) {
        end -= 1;
    }
    let mut u = vec![kind, (end + 1) as u8];
    u.extend_from_slice(&c.as_bytes()[..end]);
    u.push(0);
    u
}

fn rule_exprs(m: &mut Vec<u8>, r: &Rule) {
    // The family this rule has already checked, so an implied check is not repeated.
    let mut fam = None;
    for x in &r.matches {
        match_exprs(m, x, &mut fam);
    }
    if let Some(c) = &r.counter {
        expr(m, "objref", |m| {
            attr_u32(m, NFTA_OBJREF_IMM_TYPE, NFT_OBJECT_COUNTER);
            attr_str(m, NFTA_OBJREF_IMM_NAME, c);
        });
    }
    match r.action {
        Action::Accept => verdict(m, NF_ACCEPT),
        Action::Drop => verdict(m, NF_DROP),
        Action::Return => verdict(m, NFT_RETURN),
        Action::Notrack => {
            expr_bare(m, "notrack");
            verdict(m, NF_ACCEPT);
        }
        // masq sets the verdict itself.
        Action::Masquerade => expr_bare(m, "masq"),
        Action::MasqueradePorts(lo, hi) => {
            // As nft's `masquerade to :LO-HI`: the ports (big-endian) in registers 1
            // and 2, which masq reads.
            load(m, NFT_REG_1, &lo.to_be_bytes());
            load(m, NFT_REG_2, &hi.to_be_bytes());
            expr(m, "masq", |m| {
                attr_u32(m, NFTA_MASQ_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
                attr_u32(m, NFTA_MASQ_REG_PROTO_MIN, NFT_REG_1);
                attr_u32(m, NFTA_MASQ_REG_PROTO_MAX, NFT_REG_2);
            });
        }
    }
}

fn match_exprs(m: &mut Vec<u8>, x: &Match, fam: &mut Option<Family>) {
    match x {
        Match::Iif { name, eq } => ifname(m, NFT_META_IIFNAME, name, *eq),
        Match::Oif { name, eq } => ifname(m, NFT_META_OIFNAME, name, *eq),
        Match::Family(f) => family(m, *f, fam),
        Match::L4(p) => {
            // An ICMP type means nothing in the other family's packet.
            match p {
                L4::Icmp => family(m, Family::V4, fam),
                L4::Icmpv6 => family(m, Family::V6, fam),
                L4::Tcp | L4::Udp => {}
            }
            meta(m, NFT_META_L4PROTO);
            cmp(m, NFT_CMP_EQ, &[p.number()]);
        }
        Match::Saddr { net, eq } => address(m, net, true, *eq, fam),
        Match::Daddr { net, eq } => address(m, net, false, *eq, fam),
        Match::Sport(p) => {
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2);
            cmp(m, NFT_CMP_EQ, &p.to_be_bytes());
        }
        Match::Dport(p) => {
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
            cmp(m, NFT_CMP_EQ, &p.to_be_bytes());
        }
        Match::SportIn(lo, hi) => {
            // As nft: big-endian bytes compare in port order.
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2);
            cmp(m, NFT_CMP_GTE, &lo.to_be_bytes());
            cmp(m, NFT_CMP_LTE, &hi.to_be_bytes());
        }
        Match::IcmpType(t) => {
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 1);
            cmp(m, NFT_CMP_EQ, &[*t]);
        }
        Match::DaddrType(t) => {
            // `fib daddr type T`: the route type of the destination, host-endian.
            expr(m, "fib", |m| {
                attr_u32(m, NFTA_FIB_DREG, NFT_REG_1);
                attr_u32(m, NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
                attr_u32(m, NFTA_FIB_FLAGS, NFTA_FIB_F_DADDR);
            });
            cmp(m, NFT_CMP_EQ, &t.rtn().to_ne_bytes());
        }
        Match::Quotes {
            family: f,
            l4,
            sport,
        } => {
            // The quoted header starts 8 bytes into the ICMP message. IPv4: version 4
            // and a 20-byte header (so the offsets hold), protocol at 9, the transport
            // header at 20; IPv6: next header at 6, the transport header at 40.
            family(m, *f, fam);
            let (proto_at, sport_at) = match f {
                Family::V4 => {
                    payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 8, 1);
                    cmp(m, NFT_CMP_EQ, &[0x45]);
                    (8 + 9, 8 + 20)
                }
                Family::V6 => (8 + 6, 8 + 40),
            };
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, proto_at, 1);
            cmp(m, NFT_CMP_EQ, &[l4.number()]);
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, sport_at, 2);
            cmp(m, NFT_CMP_EQ, &sport.to_be_bytes());
        }
        Match::Ct(states) => {
            expr(m, "ct", |m| {
                attr_u32(m, NFTA_CT_DREG, NFT_REG_1);
                attr_u32(m, NFTA_CT_KEY, NFT_CT_STATE);
            });
            // ct state is a host-endian bit set: any of these bits.
            bitwise(m, &states.0.to_ne_bytes());
            cmp(m, NFT_CMP_NEQ, &[0; 4]);
        }
        Match::Limit { per_second, burst } => expr(m, "limit", |m| {
            attr_u64(m, NFTA_LIMIT_RATE, *per_second);
            attr_u64(m, NFTA_LIMIT_UNIT, 1);
            attr_u32(m, NFTA_LIMIT_BURST, *burst);
            attr_u32(m, NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS);
        }),
    }
}

fn op(eq: bool) -> u32 {
    if eq {
        NFT_CMP_EQ
    } else {
        NFT_CMP_NEQ
    }
}

/// The name padded with NULs to IFNAMSIZ, as the kernel stores it (what nft does for
/// `iifname "x"`; a prefix match would need a shorter comparison).
fn ifname(m: &mut Vec<u8>, key: u32, name: &str, eq: bool) {
    let mut n = [0u8; IFNAMSIZ];
    let len = name.len().min(IFNAMSIZ - 1);
    n[..len].copy_from_slice(&name.as_bytes()[..len]);
    meta(m, key);
    cmp(m, op(eq), &n);
}

fn family(m: &mut Vec<u8>, f: Family, known: &mut Option<Family>) {
    if *known == Some(f) {
        return;
    }
    meta(m, NFT_META_NFPROTO);
    cmp(m, NFT_CMP_EQ, &[nfproto(f)]);
    *known = Some(f);
}

fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// Source or destination inside (or outside) a prefix, of the prefix's family only. As
/// nft: a byte-aligned prefix compares only its bytes; another is masked (`bitwise`)
/// first. `/0`: every address of the family, so only the family check; `!= /0` is masked
/// to zero and compared `!= 0`, which never holds (and nft prints `ip saddr != 0.0.0.0/0`).
fn address(m: &mut Vec<u8>, net: &Cidr, src: bool, eq: bool, fam: &mut Option<Family>) {
    let net = Cidr {
        addr: net.addr,
        prefix: net.prefix.min(net.max_prefix()),
    }
    .network();
    let p = u32::from(net.prefix);
    let mut addr = [0u8; 16];
    let mut mask = [0u8; 16];
    let (f, offset, full) = match net.addr {
        IpAddr::V4(a) => {
            addr[..4].copy_from_slice(&a.octets());
            let bits = u32::MAX.checked_shl(32 - p).unwrap_or(0);
            mask[..4].copy_from_slice(&bits.to_be_bytes());
            (Family::V4, if src { 12 } else { 16 }, 4)
        }
        IpAddr::V6(a) => {
            addr = a.octets();
            mask = u128::MAX.checked_shl(128 - p).unwrap_or(0).to_be_bytes();
            (Family::V6, if src { 8 } else { 24 }, 16)
        }
    };
    family(m, f, fam);
    if p == 0 && eq {
        return;
    }
    let aligned = p % 8 == 0 && p > 0;
    let len = if aligned { (p / 8) as usize } else { full };
    payload(m, NFT_PAYLOAD_NETWORK_HEADER, offset, len as u32);
    if !aligned {
        bitwise(m, &mask[..len]);
    }
    cmp(m, op(eq), &addr[..len]);
}

/// One `NFTA_LIST_ELEM` of a rule's expressions.
fn expr(m: &mut Vec<u8>, name: &str, data: impl FnOnce(&mut Vec<u8>)) {
    nest(m, NFTA_LIST_ELEM, |m| {
        attr_str(m, NFTA_EXPR_NAME, name);
        nest(m, NFTA_EXPR_DATA, data);
    });
}

/// An expression without attributes (`notrack`, `masq`).
fn expr_bare(m: &mut Vec<u8>, name: &str) {
    nest(m, NFTA_LIST_ELEM, |m| attr_str(m, NFTA_EXPR_NAME, name));
}

fn meta(m: &mut Vec<u8>, key: u32) {
    expr(m, "meta", |m| {
        attr_u32(m, NFTA_META_DREG, NFT_REG_1);
        attr_u32(m, NFTA_META_KEY, key);
    });
}

fn cmp(m: &mut Vec<u8>, op: u32, data: &[u8]) {
    expr(m, "cmp", |m| {
        attr_u32(m, NFTA_CMP_SREG, NFT_REG_1);
        attr_u32(m, NFTA_CMP_OP, op);
        nest(m, NFTA_CMP_DATA, |m| attr(m, NFTA_DATA_VALUE, data));
    });
}

fn payload(m: &mut Vec<u8>, base: u32, offset: u32, len: u32) {
    expr(m, "payload", |m| {
        attr_u32(m, NFTA_PAYLOAD_DREG, NFT_REG_1);
        attr_u32(m, NFTA_PAYLOAD_BASE, base);
        attr_u32(m, NFTA_PAYLOAD_OFFSET, offset);
        attr_u32(m, NFTA_PAYLOAD_LEN, len);
    });
}

/// `reg1 = (reg1 & mask) ^ 0`.
fn bitwise(m: &mut Vec<u8>, mask: &[u8]) {
    expr(m, "bitwise", |m| {
        attr_u32(m, NFTA_BITWISE_SREG, NFT_REG_1);
        attr_u32(m, NFTA_BITWISE_DREG, NFT_REG_1);
        attr_u32(m, NFTA_BITWISE_LEN, mask.len() as u32);
        nest(m, NFTA_BITWISE_MASK, |m| attr(m, NFTA_DATA_VALUE, mask));
        let zeros = [0u8; 16];
        let xor = &zeros[..mask.len().min(16)];
        nest(m, NFTA_BITWISE_XOR, |m| attr(m, NFTA_DATA_VALUE, xor));
    });
}

/// `immediate`: `data` into register `reg`.
fn load(m: &mut Vec<u8>, reg: u32, data: &[u8]) {
    expr(m, "immediate", |m| {
        attr_u32(m, NFTA_IMMEDIATE_DREG, reg);
        nest(m, NFTA_IMMEDIATE_DATA, |m| attr(m, NFTA_DATA_VALUE, data));
    });
}

fn verdict(m: &mut Vec<u8>, code: i32) {
    expr(m, "immediate", |m| {
        attr_u32(m, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
        nest(m, NFTA_IMMEDIATE_DATA, |m| {
            nest(m, NFTA_DATA_VERDICT, |m| {
                attr(m, NFTA_VERDICT_CODE, &code.to_be_bytes())
            })
        });
    });
}

// ---- Answers: parsed defensively, nothing the kernel sends can panic. ----

struct Msg<'a> {
    kind: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

/// The netlink messages of one datagram; a bad length ends it with `Malformed`.
fn messages(mut rest: &[u8]) -> impl Iterator<Item = Result<Msg<'_>, NftError>> {
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
            return Some(Err(NftError::Malformed));
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
fn error_code(p: &[u8]) -> Result<i32, NftError> {
    match p.get(..4) {
        Some(c) => Ok(i32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
        None => Err(NftError::Malformed),
    }
}

fn kernel(what: &str, code: i32) -> NftError {
    NftError::Kernel {
        what: what.into(),
        errno: Errno::from_raw(code.wrapping_neg()),
    }
}

/// The answers to a batch: an ack or an error per message, or one error for the whole
/// transaction under the sequence number of its begin (no permission, no nf_tables, a
/// failed commit).
struct Acks {
    answered: Vec<bool>,
    pending: usize,
    /// (0 = the transaction, `1 + i` = message `i`, errno) of the first failure.
    failed: Option<(usize, Errno)>,
}

impl Acks {
    fn new(b: &Batch) -> Acks {
        Acks {
            answered: vec![false; b.what.len()],
            pending: b.what.len(),
            failed: None,
        }
    }

    fn absorb(&mut self, b: &Batch, datagram: &[u8]) -> Result<(), NftError> {
        for msg in messages(datagram) {
            let msg = msg?;
            if msg.kind != NLMSG_ERROR {
                continue;
            }
            let code = error_code(msg.payload)?;
            let mut at = msg.seq.wrapping_sub(b.begin) as usize;
            if at > self.answered.len() + 1 {
                continue; // not this batch's
            }
            if at > self.answered.len() {
                at = 0; // the end marker: the transaction
            }
            if at > 0 && !self.answered[at - 1] {
                self.answered[at - 1] = true;
                self.pending -= 1;
            }
            if code != 0 && self.failed.map_or(true, |(j, _)| at < j) {
                self.failed = Some((at, Errno::from_raw(code.wrapping_neg())));
            }
        }
        Ok(())
    }

    fn result(&self, b: &Batch) -> Result<(), NftError> {
        match self.failed {
            None if self.pending == 0 => Ok(()),
            None => {
                let i = self.answered.iter().position(|a| !a).unwrap_or(0);
                Err(NftError::NoAnswer(
                    b.what.get(i).cloned().unwrap_or_default(),
                ))
            }
            Some((0, e @ (Errno::EOPNOTSUPP | Errno::EPROTONOSUPPORT))) => {
                Err(NftError::Unavailable(e))
            }
            Some((at, errno)) => Err(NftError::Kernel {
                what: match at {
                    0 => format!("the transaction ({} messages)", b.what.len()),
                    _ => b.what[at - 1].clone(),
                },
                errno,
            }),
        }
    }
}

/// A bound `NETLINK_NETFILTER` socket, one per call.
struct Socket {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Socket {
    fn open() -> Result<Socket, NftError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| match e {
            Errno::EPROTONOSUPPORT | Errno::EAFNOSUPPORT => NftError::Unavailable(e),
            e => NftError::Socket(e),
        })?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(NftError::Socket)?;
        let t = TimeVal::new(TIMEOUT_S, 0);
        setsockopt(&fd, sockopt::ReceiveTimeout, &t).map_err(NftError::Socket)?;
        // Room for a big batch and one ack per message; forcing needs CAP_NET_ADMIN,
        // which nf_tables needs anyway, and the plain size is capped by rmem_max.
        let size = 4 << 20;
        if setsockopt(&fd, sockopt::RcvBufForce, &size).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &size);
        }
        if setsockopt(&fd, sockopt::SndBufForce, &size).is_err() {
            let _ = setsockopt(&fd, sockopt::SndBuf, &size);
        }
        Ok(Socket {
            fd,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn send(&self, m: &[u8]) -> Result<(), NftError> {
        match send(self.fd.as_raw_fd(), m, MsgFlags::empty()) {
            Ok(n) if n == m.len() => Ok(()),
            Ok(_) => Err(NftError::Socket(Errno::EMSGSIZE)),
            Err(e) => Err(NftError::Socket(e)),
        }
    }

    /// One datagram; `None` when nothing came within the timeout (or, with `dontwait`,
    /// when nothing is queued).
    fn recv(&mut self, dontwait: bool) -> Result<Option<usize>, NftError> {
        let mut flags = MsgFlags::MSG_TRUNC;
        if dontwait {
            flags |= MsgFlags::MSG_DONTWAIT;
        }
        loop {
            match recv(self.fd.as_raw_fd(), &mut self.buf, flags) {
                Ok(n) if n > self.buf.len() => return Err(NftError::Malformed),
                Ok(n) => return Ok(Some(n)),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(None),
                Err(e) => return Err(NftError::Socket(e)),
            }
        }
    }

    /// Send a batch and collect an answer per message. The kernel processes the batch
    /// inside `send`, so after an error whatever else it says is already queued.
    fn transact(&mut self, b: &Batch) -> Result<(), NftError> {
        self.send(&b.buf)?;
        let mut acks = Acks::new(b);
        while acks.pending > 0 {
            match self.recv(acks.failed.is_some())? {
                Some(n) => acks.absorb(b, &self.buf[..n])?,
                None => break,
            }
        }
        acks.result(b)
    }

    /// Send one [`request`] and hand each answer to `f` until the kernel ends it with an
    /// ack, an error or the end of a dump. `Ok(false)`: a concurrent change interrupted
    /// the dump.
    fn query(
        &mut self,
        m: &[u8],
        what: &str,
        mut f: impl FnMut(&Msg) -> Result<(), NftError>,
    ) -> Result<bool, NftError> {
        self.send(m)?;
        let mut intact = true;
        loop {
            let n = self
                .recv(false)?
                .ok_or_else(|| NftError::NoAnswer(what.into()))?;
            for msg in messages(&self.buf[..n]) {
                let msg = msg?;
                if msg.seq != 1 {
                    continue;
                }
                intact &= msg.flags & NLM_F_DUMP_INTR == 0;
                match msg.kind {
                    NLMSG_ERROR | NLMSG_DONE => {
                        let code = error_code(msg.payload)?;
                        return if code == 0 {
                            Ok(intact)
                        } else {
                            Err(kernel(what, code))
                        };
                    }
                    _ => f(&msg)?,
                }
            }
        }
    }
}

fn cstr(d: &[u8]) -> &[u8] {
    d.split(|&c| c == 0).next().unwrap_or(d)
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.try_into().ok()?))
}

fn be64(d: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(d.try_into().ok()?))
}

/// An `NFT_MSG_NEWOBJ` payload: `Some((name, packets, bytes))` for a counter of `table`,
/// `None` for another object; a counter without its name or values is `Malformed`.
fn parse_counter(p: &[u8], table: &str) -> Result<Option<(String, u64, u64)>, NftError> {
    let body = p.get(4..).ok_or(NftError::Malformed)?; // after nfgenmsg
    let (mut t, mut name, mut kind, mut packets, mut bytes) = (None, None, None, None, None);
    for (k, d) in attrs(body) {
        match k {
            NFTA_OBJ_TABLE => t = Some(cstr(d)),
            NFTA_OBJ_NAME => name = Some(cstr(d)),
            NFTA_OBJ_TYPE => kind = be32(d),
            NFTA_OBJ_DATA => {
                for (k, d) in attrs(d) {
                    match k {
                        NFTA_COUNTER_BYTES => bytes = be64(d),
                        NFTA_COUNTER_PACKETS => packets = be64(d),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if t != Some(table.as_bytes()) || kind != Some(NFT_OBJECT_COUNTER) {
        return Ok(None);
    }
    match (name, packets, bytes) {
        (Some(n), Some(p), Some(b)) => Ok(Some((String::from_utf8_lossy(n).into_owned(), p, b))),
        _ => Err(NftError::Malformed),
    }
}

/// An `NFT_MSG_NEWTABLE` payload: the table's comment (libnftnl's userdata TLVs), `None`
/// when it has none.
fn parse_table_comment(p: &[u8]) -> Result<Option<String>, NftError> {
    let body = p.get(4..).ok_or(NftError::Malformed)?; // after nfgenmsg
    for (k, mut u) in attrs(body) {
        if k != NFTA_TABLE_USERDATA {
            continue;
        }
        // TLVs: type (u8), length (u8), value.
        while let [kind, len, rest @ ..] = u {
            let v = rest.get(..usize::from(*len)).ok_or(NftError::Malformed)?;
            if *kind == NFTNL_UDATA_TABLE_COMMENT {
                return Ok(Some(String::from_utf8_lossy(cstr(v)).into_owned()));
            }
            u = &rest[v.len()..];
        }
    }
    Ok(None)
}

// Byte layouts are written little-endian (both our targets).
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use riceguard_core::firewall::rules::{AddrType, BaseChain, ChainKind, CtStates};
    use riceguard_core::firewall::rules::{PRIO_FILTER, PRIO_RAW, PRIO_SRCNAT};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    use Action::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }
    fn iif(n: &str, eq: bool) -> Match {
        Match::Iif { name: n.into(), eq }
    }
    fn oif(n: &str, eq: bool) -> Match {
        Match::Oif { name: n.into(), eq }
    }
    fn sa(net: &str, eq: bool) -> Match {
        Match::Saddr { net: cidr(net), eq }
    }
    fn da(net: &str, eq: bool) -> Match {
        Match::Daddr { net: cidr(net), eq }
    }
    fn l4(p: L4) -> Match {
        Match::L4(p)
    }
    fn rule_(matches: Vec<Match>, counter: Option<&str>, action: Action) -> Rule {
        let counter = counter.map(String::from);
        Rule {
            matches,
            counter,
            action,
            comment: "",
        }
    }
    fn noted(comment: &'static str, r: Rule) -> Rule {
        Rule { comment, ..r }
    }
    fn base(name: &str, kind: ChainKind, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
        let base = Some(BaseChain {
            kind,
            hook,
            priority,
            policy_drop: false,
        });
        Chain {
            name: name.into(),
            base,
            rules,
        }
    }
    fn filter(name: &str, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
        base(name, ChainKind::Filter, hook, priority, rules)
    }

    /// Bytes from hex with spaces.
    fn hex(s: &str) -> Vec<u8> {
        let h: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
        let byte = |p: &[u8]| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap();
        h.chunks(2).map(byte).collect()
    }

    // One expression each, lengths spelled out: LIST_ELEM { NAME, DATA { ... } }.
    fn meta(key: &str) -> String {
        let data = format!("14000280 08000100 00000001 08000200 000000{key}");
        format!("24000180 09000100 6d657461 00000000 {data}")
    }
    fn cmp(op: u8, data: &str) -> String {
        let n = data.len() / 2;
        let (elem, dat, nest) = match n {
            1..=4 => ("2c", "20", "0c"),
            8 => ("30", "24", "10"),
            _ => ("38", "2c", "18"), // 16
        };
        let value = format!(
            "{nest}000380 {:02x}000100 {data}{}",
            4 + n,
            "00".repeat(3 - (n + 3) % 4)
        );
        let regs = format!("08000100 00000001 08000200 000000{op:02x}");
        format!("{elem}000180 08000100 636d7000 {dat}000280 {regs} {value}")
    }
    fn payload(base: u8, offset: u8, len: u8) -> String {
        let data = format!(
            "08000200 000000{base:02x} 08000300 000000{offset:02x} 08000400 000000{len:02x}"
        );
        format!("34000180 0c000100 7061796c 6f616400 24000280 08000100 00000001 {data}")
    }
    fn bitwise4(mask: &str) -> String {
        let regs = "08000100 00000001 08000200 00000001 08000300 00000004";
        let name = "44000180 0c000100 62697477 69736500 34000280";
        format!("{name} {regs} 0c000480 08000100 {mask} 0c000580 08000100 00000000")
    }
    fn bitwise16(mask: &str) -> String {
        let regs = "08000100 00000001 08000200 00000001 08000300 00000010";
        let name = "5c000180 0c000100 62697477 69736500 4c000280";
        format!(
            "{name} {regs} 18000480 14000100 {mask} 18000580 14000100 {}",
            "00".repeat(16)
        )
    }
    fn imm(code: &str) -> String {
        let name = "30000180 0e000100 696d6d65 64696174 65000000";
        format!("{name} 1c000280 08000100 00000000 10000280 0c000280 08000100 {code}")
    }
    const CT_STATE: &str =
        "20000180 07000100 63740000 14000280 08000100 00000001 08000200 00000000";
    const LIMIT: &str = "3c000180 0a000100 6c696d69 74000000 2c000280 0c000100 00000000 00000005 \
                         0c000200 00000000 00000001 08000300 00000007 08000400 00000000";
    const OBJREF_SPOOF: &str = "28000180 0b000100 6f626a72 65660000 18000280 08000100 00000001 \
                                0a000200 73706f6f 66000000";
    const FIB_DADDR_TYPE: &str = "28000180 08000100 66696200 1c000280 08000100 00000001 \
                                  08000200 00000003 08000300 00000002";
    const NOTRACK: &str = "10000180 0c000100 6e6f7472 61636b00";
    const MASQ: &str = "10000180 09000100 6d617371 00000000";

    fn v4() -> String {
        meta("0f") + &cmp(0, "02")
    }
    fn v6() -> String {
        meta("0f") + &cmp(0, "0a")
    }
    fn zeros(n: usize) -> String {
        "00".repeat(n)
    }

    fn check(ms: &[Match], want: &[&str]) {
        let (mut m, mut fam) = (Vec::new(), None);
        for x in ms {
            match_exprs(&mut m, x, &mut fam);
        }
        assert_eq!(m, hex(&want.concat()), "{ms:?}");
    }

    #[test]
    #[rustfmt::skip] // one case a line
    fn each_match_kind_encodes_as_nft_does() {
        check(&[iif("rgx0", false)], &[&meta("06"), &cmp(1, &format!("72677830{}", zeros(12)))]);
        let uplink = format!("75706c696e6b30{}", zeros(9));
        check(&[oif("uplink0", true)], &[&meta("07"), &cmp(0, &uplink)]);
        check(&[Match::Family(Family::V6)], &[&v6()]);
        check(&[l4(L4::Udp)], &[&meta("10"), &cmp(0, "11")]);
        check(&[l4(L4::Icmp)], &[&v4(), &meta("10"), &cmp(0, "01")]);
        check(&[l4(L4::Icmpv6)], &[&v6(), &meta("10"), &cmp(0, "3a")]);
        // Byte-aligned prefixes compare their bytes only (host bits dropped); others are
        // masked first.
        check(&[sa("10.100.0.7/24", true)], &[&v4(), &payload(1, 12, 3), &cmp(0, "0a6400")]);
        check(&[da("10.100.0.5/32", true)], &[&v4(), &payload(1, 16, 4), &cmp(0, "0a640005")]);
        let tun6 = [&v6(), &payload(1, 8, 8), &cmp(0, "fd00010000000000")];
        check(&[sa("fd00:100::/64", true)], &tun6.map(String::as_str));
        let mask = bitwise4("fff00000");
        check(&[da("10.96.0.0/12", false)], &[&v4(), &payload(1, 16, 4), &mask, &cmp(1, "0a600000")]);
        let m16 = bitwise16(&format!("fe{}", zeros(15)));
        let a16 = cmp(0, &format!("fc{}", zeros(15)));
        check(&[da("fc00::/7", true)], &[&v6(), &payload(1, 24, 16), &m16, &a16]);
        // /0: the family only; != /0 never holds (masked to 0, compared != 0).
        check(&[sa("0.0.0.0/0", true)], &[&v4()]);
        let never = [v4(), payload(1, 12, 4), bitwise4("00000000"), cmp(1, "00000000")];
        check(&[sa("0.0.0.0/0", false)], &never.each_ref().map(String::as_str));
        check(&[Match::Sport(67)], &[&payload(2, 0, 2), &cmp(0, "0043")]);
        check(&[Match::Dport(51820)], &[&payload(2, 2, 2), &cmp(0, "ca6c")]);
        check(&[Match::IcmpType(3)], &[&payload(2, 0, 1), &cmp(0, "03")]);
        let est = Match::Ct(CtStates::ESTABLISHED.or(CtStates::RELATED));
        check(&[est], &[CT_STATE, &bitwise4("06000000"), &cmp(1, "00000000")]);
        check(&[Match::Limit { per_second: 5, burst: 7 }], &[LIMIT]);
        let rtn = |t: AddrType| t.rtn().to_ne_bytes().iter().map(|b| format!("{b:02x}")).collect::<String>();
        check(&[Match::DaddrType(AddrType::Local)], &[FIB_DADDR_TYPE, &cmp(0, &rtn(AddrType::Local))]);
        check(&[Match::DaddrType(AddrType::Broadcast)], &[FIB_DADDR_TYPE, &cmp(0, &rtn(AddrType::Broadcast))]);
        // The quoted IPv4 header: 0x45 (no options), protocol, then the source port.
        let q4 = Match::Quotes { family: Family::V4, l4: L4::Udp, sport: 51820 };
        let ihl = payload(2, 8, 1) + &cmp(0, "45");
        check(&[q4], &[&v4(), &ihl, &payload(2, 17, 1), &cmp(0, "11"), &payload(2, 28, 2), &cmp(0, "ca6c")]);
        check(&[Match::SportIn(51820, 65535)], &[&payload(2, 0, 2), &cmp(5, "ca6c"), &cmp(3, "ffff")]);
        let q6 = Match::Quotes { family: Family::V6, l4: L4::Tcp, sport: 443 };
        check(&[q6], &[&v6(), &payload(2, 14, 1), &cmp(0, "06"), &payload(2, 48, 2), &cmp(0, "01bb")]);
    }

    #[test]
    fn a_family_is_checked_once_per_rule() {
        let x = [
            Match::Family(Family::V4),
            l4(L4::Icmp),
            sa("10.0.0.0/8", true),
        ];
        let icmp = meta("10") + &cmp(0, "01");
        check(&x, &[&v4(), &icmp, &payload(1, 12, 1), &cmp(0, "0a")]);
        // A v6 prefix after a v4 check adds its own check: the rule never matches.
        let x = [Match::Family(Family::V4), sa("::/0", true)];
        check(&x, &[&v4(), &v6()]);
    }

    #[test]
    fn each_action_and_the_counter() {
        let notrack = NOTRACK.to_string() + &imm("00000001");
        let (accept, drop, ret) = (imm("00000001"), imm("00000000"), imm("fffffffb"));
        let cases = [
            (Accept, accept),
            (Drop, drop),
            (Return, ret),
            (Notrack, notrack),
        ];
        for (a, want) in cases.into_iter().chain([(Masquerade, MASQ.into())]) {
            let mut m = Vec::new();
            rule_exprs(&mut m, &rule_(vec![], Some("spoof"), a));
            assert_eq!(m, hex(&(OBJREF_SPOOF.to_string() + &want)), "{a:?}");
        }
    }

    #[test]
    fn masquerade_to_a_port_range() {
        let mut m = Vec::new();
        rule_exprs(&mut m, &rule_(vec![], None, MasqueradePorts(51821, 65535)));
        let name = "2c000180 0e000100 696d6d65 64696174 65000000";
        let lo = format!("{name} 18000280 08000100 00000001 0c000280 06000100 ca6d0000");
        let hi = format!("{name} 18000280 08000100 00000002 0c000280 06000100 ffff0000");
        // Flags: NF_NAT_RANGE_PROTO_SPECIFIED, as nft sets it (the kernel ignores the
        // registers without it).
        let masq = "2c000180 09000100 6d617371 00000000 1c000280 08000100 00000002 \
                    08000200 00000001 08000300 00000002";
        assert_eq!(m, hex(&(lo + &hi + masq)));
    }

    /// The message after the batch's begin (20 bytes).
    fn first_message(f: impl FnOnce(&mut Batch)) -> Vec<u8> {
        let mut b = Batch::new(1);
        f(&mut b);
        b.buf[20..].to_vec()
    }

    #[test]
    fn table_counter_and_chain_messages() {
        let m = first_message(|b| table(b, NFT_MSG_NEWTABLE, NLM_F_CREATE, "rg"));
        let want = "1c000000 000a 0504 02000000 00000000  01000000  07000100 72670000";
        assert_eq!(m, hex(want));

        let m = first_message(|b| counter(b, "rg", "spoof", (3, 300)));
        let want = "4c000000 120a 0506 02000000 00000000  01000000 \
                    07000100 72670000  0a000200 73706f6f 66000000  08000300 00000001 \
                    1c000480 0c000100 00000000 0000012c 0c000200 00000000 00000003";
        assert_eq!(m, hex(want));

        let mut c = filter("pre", Hook::Prerouting, PRIO_RAW, vec![]);
        c.base.as_mut().unwrap().policy_drop = true;
        let want = "4c000000 030a 0506 02000000 00000000  01000000  07000100 72670000 \
                    08000300 70726500  14000480 08000100 00000000 08000200 fffffed4 \
                    08000500 00000000  0b000700 66696c74 65720000";
        assert_eq!(first_message(|b| chain(b, "rg", &c)), hex(want));
        let c = base(
            "post",
            ChainKind::Nat,
            Hook::Postrouting,
            PRIO_SRCNAT,
            vec![],
        );
        let m = first_message(|b| chain(b, "rg", &c));
        let want = "14000480 08000100 00000004 08000200 00000064 \
                    08000500 00000001  08000700 6e617400";
        assert_eq!(m[40..], hex(want));
        let mut plain = c;
        (plain.name, plain.base) = ("sub".into(), None);
        let want = "24000000 030a 0506 02000000 00000000  01000000 \
                    07000100 72670000  08000300 73756200";
        assert_eq!(first_message(|b| chain(b, "rg", &plain)), hex(want));
    }

    #[test]
    fn rule_message_with_counter_and_comment() {
        let r = noted("x", rule_(vec![iif("rgx0", false)], Some("spoof"), Drop));
        let m = first_message(|b| rule(b, "rg", "input", 1, &r));
        let name = format!("72677830{}", zeros(12));
        let exprs = meta("06") + &cmp(1, &name) + OBJREF_SPOOF + &imm("00000000");
        let want = format!(
            "e8000000 060a 050c 02000000 00000000  01000000 \
             07000100 72670000  0a000200 696e7075 74000000  b8000480 {exprs}  08000700 00027800"
        );
        assert_eq!(m, hex(&want));
        // A long comment is cut at a character boundary, within one TLV.
        let u = comment_udata(NFTNL_UDATA_RULE_COMMENT, &"é".repeat(200));
        assert_eq!((u[1], u.len(), u[256]), (255, 257, 0));
    }

    fn tiny() -> Ruleset {
        let r = noted("d", rule_(vec![], Some("c"), Drop));
        let chains = vec![filter("input", Hook::Input, PRIO_FILTER, vec![r])];
        Ruleset {
            table: "rg".into(),
            counters: vec!["c".into()],
            chains,
        }
    }

    #[test]
    fn batch_framing_sequence_numbers_and_flags() {
        let b = replace_batch(&tiny(), &HashMap::new(), 41);
        let got: Vec<_> = messages(&b.buf)
            .map(|m| m.map(|m| (m.kind, m.flags, m.seq)))
            .collect();
        let (req, acked) = (NLM_F_REQUEST, NLM_F_REQUEST | NLM_F_ACK);
        let (create, excl) = (acked | NLM_F_CREATE, acked | NLM_F_CREATE | NLM_F_EXCL);
        let kinds = [
            NFT_MSG_NEWTABLE,
            NFT_MSG_DELTABLE,
            NFT_MSG_NEWTABLE,
            NFT_MSG_NEWOBJ,
        ];
        let kinds = [&kinds[..], &[NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE]].concat();
        let flags = [create, acked, create, excl, excl, create | NLM_F_APPEND];
        let mut want = vec![(NFNL_MSG_BATCH_BEGIN, req, 41)];
        want.extend((0..6).map(|i| (nft_type(kinds[i]), flags[i], 42 + i as u32)));
        want.push((NFNL_MSG_BATCH_END, req, 48));
        assert_eq!(
            got.into_iter().collect::<Result<Vec<_>, _>>().unwrap(),
            want
        );
        assert_eq!(
            b.buf[..20],
            hex("14000000 1000 0100 29000000 00000000 0000000a")
        );
        let end = hex("14000000 1100 0100 30000000 00000000 0000000a");
        assert_eq!(b.buf[b.buf.len() - 20..], end);
        assert_eq!(b.what[1], "delete table inet rg");
        assert_eq!(b.what[5], "add rule 1 of chain input (d)");
    }

    #[test]
    fn the_new_table_carries_the_rulesets_tag_and_it_reads_back() {
        let rs = tiny();
        let b = replace_batch(&rs, &HashMap::new(), 1);
        let msgs: Vec<_> = messages(&b.buf).map(Result::unwrap).collect();
        let tag = forwarding::tag(&rs);
        // Only the table that stays (the second create) carries it.
        assert_eq!(parse_table_comment(msgs[1].payload).unwrap(), None);
        assert_eq!(
            parse_table_comment(msgs[3].payload).unwrap(),
            Some(tag.clone())
        );
        // libnftnl's layout: name, then userdata = TLV 0 (comment), NUL-terminated.
        let mut want = hex("07000100 72670000");
        let len = 4 + 2 + tag.len() + 1;
        want.extend((len as u16).to_ne_bytes());
        want.extend(NFTA_TABLE_USERDATA.to_ne_bytes());
        want.extend([0, tag.len() as u8 + 1]);
        want.extend(tag.as_bytes());
        want.push(0);
        want.resize(want.len().next_multiple_of(4), 0);
        assert_eq!(msgs[3].payload[4..], want[..]);
        // Another TLV before the comment is skipped; a TLV running past its attribute,
        // or a payload shorter than nfgenmsg, is malformed.
        let mut p = hex("02000000 07000100 72670000");
        attr(&mut p, NFTA_TABLE_USERDATA, &[7, 1, 9, 0, 3, b'a', b'b', 0]);
        assert_eq!(parse_table_comment(&p).unwrap(), Some("ab".into()));
        let mut p = hex("02000000");
        attr(&mut p, NFTA_TABLE_USERDATA, &[0, 9, b'a']);
        assert!(malformed(parse_table_comment(&p)));
        assert!(malformed(parse_table_comment(&[2, 0])));
    }

    /// An `NLMSG_ERROR` answer: header, errno, the request's header (zeros).
    fn answer(seq: u32, code: i32) -> Vec<u8> {
        let mut m = hex("24000000 0200 0001");
        m.extend(seq.to_ne_bytes().into_iter().chain([0; 4]));
        m.extend(code.to_ne_bytes().into_iter().chain([0; 16]));
        m
    }

    fn malformed<T>(r: Result<T, NftError>) -> bool {
        matches!(r, Err(NftError::Malformed))
    }

    #[test]
    fn acks_name_the_first_failing_message() {
        let b = replace_batch(&tiny(), &HashMap::new(), 1);
        let absorbed = |answers: &[(u32, i32)]| {
            let mut a = Acks::new(&b);
            for &(s, c) in answers {
                a.absorb(&b, &answer(s, c)).unwrap();
            }
            a.result(&b)
        };
        assert!(absorbed(&[(2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0)]).is_ok());
        // The chain and the rule fail (the rule because of the chain): the chain is named.
        let e = absorbed(&[(2, 0), (3, 0), (4, 0), (5, 0), (7, -2), (6, -17)]).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EEXIST));
        assert!(
            e.to_string().starts_with("nf_tables: add chain input: "),
            "{e}"
        );
        // The transaction as a whole answers under its begin's sequence number.
        let want = "nf_tables: the transaction (6 messages): the kernel said EPERM: Operation not \
                    permitted (needs CAP_NET_ADMIN)";
        assert_eq!(absorbed(&[(1, -1)]).unwrap_err().to_string(), want);
        let e = absorbed(&[(1, -95)]).unwrap_err();
        assert!(matches!(e, NftError::Unavailable(Errno::EOPNOTSUPP)), "{e}");
        assert!(e.to_string().contains("is the nf_tables module loaded?"));
        // Other batches' answers are ignored; silence names the first unanswered message.
        let e = absorbed(&[(2, 0), (99, -2), (0, -2)]).unwrap_err();
        assert!(matches!(e, NftError::NoAnswer(w) if w == "delete table inet rg"));
        assert!(absorbed(&[(3, i32::MIN)]).is_err());

        // Malformed datagrams are errors, never panics.
        let mut a = Acks::new(&b);
        assert!(malformed(a.absorb(&b, &answer(2, 0)[..30])));
        assert!(malformed(a.absorb(&b, &[1, 2, 3])));
        let short = [&[17, 0, 0, 0][..], &answer(2, 0)[4..17]].concat();
        assert!(malformed(a.absorb(&b, &short)));
    }

    #[test]
    fn counter_answers_parse_defensively() {
        // The kernel answers with the layout we send (table, name, type, data).
        let m = first_message(|b| counter(b, "rg", "spoof", (3, 300)));
        let p = &m[16..];
        let spoof = Some(("spoof".to_string(), 3, 300));
        assert_eq!(parse_counter(p, "rg").unwrap(), spoof);
        assert_eq!(parse_counter(p, "other").unwrap(), None);
        assert!(malformed(parse_counter(&p[..2], "rg")));
        // Cut after the type, or a bad length inside: the values are missing.
        assert!(malformed(parse_counter(&p[..32], "rg")));
        let mut bad = p.to_vec();
        bad[32] = 0xff;
        assert!(malformed(parse_counter(&bad, "rg")));
    }

    #[test]
    fn what_the_kernel_would_misread_is_refused() {
        let with = |x: Match| {
            let mut rs = tiny();
            rs.chains[0].rules[0].matches = vec![x];
            validate(&rs)
        };
        assert!(matches!(
            with(iif("a-sixteen-bytes!", true)),
            Err(NftError::Invalid(_))
        ));
        assert!(with(iif("fifteen-bytes-n", true)).is_ok());
        let net = Cidr {
            addr: "10.0.0.0".parse().unwrap(),
            prefix: 33,
        };
        assert!(matches!(
            with(Match::Saddr { net, eq: true }),
            Err(NftError::Invalid(_))
        ));
        let mut rs = tiny();
        rs.counters.push("a\0b".into());
        assert!(validate(&rs)
            .unwrap_err()
            .to_string()
            .contains("counter name"));
        rs.counters.pop();
        rs.table = "x".repeat(256);
        assert!(validate(&rs).is_err());
        assert!(matches!(remove(""), Err(NftError::Invalid(_))));
    }

    /// The lab's ruleset: every match kind and action at least once.
    #[rustfmt::skip] // one rule a line
    fn realistic(table: &str) -> Ruleset {
        let est = || Match::Ct(CtStates::ESTABLISHED.or(CtStates::RELATED));
        let (tun4, tun6) = ("10.100.0.0/24", "fd00:100::/64");
        let counters = ["spoof", "spoof6", "fwd_drop", "never", "udp9", "ssh_limited"];
        let ssh = vec![l4(L4::Tcp), Match::Dport(22), Match::Limit { per_second: 5, burst: 5 }];
        let dhcp = vec![Match::Family(Family::V4), l4(L4::Udp), Match::Sport(67)];
        let local = Match::DaddrType(AddrType::Local);
        let wg = rule_(vec![l4(L4::Udp), Match::Dport(51820), local], None, Notrack);
        let bcast = vec![l4(L4::Udp), Match::Dport(68), Match::DaddrType(AddrType::Broadcast)];
        let prerouting = vec![noted("wireguard", wg), rule_(bcast, None, Return)];
        let q4 = Match::Quotes { family: Family::V4, l4: L4::Udp, sport: 51820 };
        let q6 = Match::Quotes { family: Family::V6, l4: L4::Tcp, sport: 443 };
        let input = vec![
            rule_(vec![est()], None, Accept),
            rule_(vec![iif("lo", true)], None, Return),
            rule_(vec![iif("rgx0", false), sa(tun4, true)], Some("spoof"), Drop),
            rule_(vec![iif("rgx0", false), sa(tun6, true)], Some("spoof6"), Drop),
            rule_(vec![l4(L4::Icmp), Match::IcmpType(3)], None, Accept),
            rule_(vec![l4(L4::Icmpv6), Match::IcmpType(2)], None, Accept),
            rule_(vec![l4(L4::Icmp), Match::IcmpType(3), q4], None, Accept),
            rule_(vec![l4(L4::Icmpv6), Match::IcmpType(2), q6], None, Accept),
            rule_(ssh, Some("ssh_limited"), Accept),
            noted("dhcp", rule_(dhcp, None, Accept)),
            rule_(vec![da("10.96.0.0/12", false), da("fe80::/10", true)], None, Drop),
        ];
        let fwd = rule_(vec![iif("rgx0", true), oif("uplink0", false)], Some("fwd_drop"), Drop);
        let forward = vec![rule_(vec![est()], None, Accept), noted(TUNNEL_ONLY, fwd)];
        let output = vec![
            rule_(vec![l4(L4::Udp), Match::Sport(51820)], None, Notrack),
            rule_(vec![sa("0.0.0.0/0", false)], Some("never"), Accept),
            rule_(vec![l4(L4::Udp), Match::Dport(9)], Some("udp9"), Accept),
        ];
        let high = vec![oif("uplink0", true), l4(L4::Udp), Match::SportIn(51820, 65535)];
        let postrouting = vec![
            rule_(high, None, MasqueradePorts(51821, 65535)),
            rule_(vec![oif("uplink0", true), sa(tun4, true)], None, Masquerade),
            rule_(vec![oif("uplink0", true), sa(tun6, true)], None, Masquerade),
        ];
        let chains = vec![
            filter("prerouting", Hook::Prerouting, PRIO_RAW, prerouting),
            filter("input", Hook::Input, PRIO_FILTER, input),
            filter("forward", Hook::Forward, PRIO_FILTER, forward),
            filter("output", Hook::Output, PRIO_RAW, output),
            base("postrouting", ChainKind::Nat, Hook::Postrouting, PRIO_SRCNAT, postrouting),
        ];
        Ruleset { table: table.into(), counters: counters.map(String::from).into(), chains }
    }

    const TUNNEL_ONLY: &str = "tunnel only to the uplink";

    /// Each chain and rule of [`realistic`] as `nft list` (nftables 1.0.6) prints it.
    const LISTED: &[&str] = &[
        "counter spoof {",
        "packets 3 bytes 300",
        "type filter hook prerouting priority raw; policy accept;",
        "udp dport 51820 fib daddr type local notrack accept comment \"wireguard\"",
        "udp dport 68 fib daddr type broadcast return",
        "type filter hook input priority filter; policy accept;",
        "ct state established,related accept",
        "iifname \"lo\" return",
        "iifname != \"rgx0\" ip saddr 10.100.0.0/24 counter name \"spoof\" drop",
        "iifname != \"rgx0\" ip6 saddr fd00:100::/64 counter name \"spoof6\" drop",
        "icmp type destination-unreachable accept",
        "icmpv6 type packet-too-big accept",
        "icmp type destination-unreachable @th,64,8 0x45 @th,136,8 0x11 @th,224,16 0xca6c accept",
        "icmpv6 type packet-too-big @th,112,8 0x6 @th,384,16 0x1bb accept",
        "tcp dport 22 limit rate 5/second counter name \"ssh_limited\" accept",
        "meta nfproto ipv4 udp sport 67 accept comment \"dhcp\"",
        "ip daddr != 10.96.0.0/12 ip6 daddr fe80::/10 drop",
        "type filter hook forward priority filter; policy accept;",
        "iifname \"rgx0\" oifname != \"uplink0\" counter name \"fwd_drop\" drop comment \"tunnel only to the uplink\"",
        "type filter hook output priority raw; policy accept;",
        "udp sport 51820 notrack accept",
        "ip saddr != 0.0.0.0/0 counter name \"never\" accept",
        "udp dport 9 counter name \"udp9\" accept",
        "type nat hook postrouting priority srcnat; policy accept;",
        "oifname \"uplink0\" udp sport 51820-65535 masquerade to :51821-65535",
        "oifname \"uplink0\" ip saddr 10.100.0.0/24 masquerade",
        "oifname \"uplink0\" ip6 saddr fd00:100::/64 masquerade",
    ];

    /// `nft ARGS` in this thread's network namespace (a child inherits it), at most 10 s.
    fn nft(args: &[&str]) -> (bool, String) {
        let (o, e) = (Stdio::piped(), Stdio::piped());
        let mut c = Command::new("nft")
            .args(args)
            .stdout(o)
            .stderr(e)
            .spawn()
            .expect("run nft");
        let t = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(10) {
                let _ = c.kill();
                panic!("nft {args:?} did not finish in 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let o = c.wait_with_output().unwrap();
        let text = [o.stdout, o.stderr].concat();
        (
            o.status.success(),
            String::from_utf8_lossy(&text).into_owned(),
        )
    }

    /// Runs `f` in a thread of its own inside a fresh network namespace, which goes with
    /// the thread; at most 60 s.
    fn in_netns(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let new = nix::sched::CloneFlags::CLONE_NEWNET;
            nix::sched::unshare(new).expect("unshare a network namespace (needs root)");
            f();
            let _ = tx.send(());
        });
        let timeout = std::sync::mpsc::RecvTimeoutError::Timeout;
        assert_ne!(
            rx.recv_timeout(Duration::from_secs(60)),
            Err(timeout),
            "no end in 60 s"
        );
        if let Err(p) = h.join() {
            std::panic::resume_unwind(p);
        }
    }

    fn count(c: &[(String, u64, u64)], name: &str) -> (u64, u64) {
        let hit = c.iter().find(|(n, _, _)| n == name);
        hit.map(|(_, p, b)| (*p, *b))
            .unwrap_or_else(|| panic!("no counter {name}: {c:?}"))
    }

    /// Against the real kernel and Debian's nft, in a private network namespace.
    #[test]
    #[ignore = "needs root: network namespace"]
    fn replace_list_count_and_remove_in_private_netns() {
        in_netns(|| {
            if Command::new("nft").arg("--version").output().is_err() {
                return crate::testutil::not_run("nft (Debian's nftables) is not installed");
            }
            match exists("rgtest") {
                Err(NftError::Unavailable(e)) => return crate::testutil::not_run(&e.to_string()),
                r => assert!(!r.unwrap()),
            }
            let list = || nft(&["list", "table", "inet", "rgtest"]);
            let other_intact = || {
                let (ok, other) = nft(&["list", "table", "inet", "other"]);
                assert!(ok && other.contains("chain c"), "{other}");
            };
            assert!(nft(&["add", "table", "inet", "other"]).0);
            assert!(nft(&["add", "chain", "inet", "other", "c"]).0);
            assert!(counters("rgtest").unwrap().is_empty());
            assert!(!remove("rgtest").unwrap());

            assert_eq!(installed("rgtest"), Installed::Absent);
            let rs = realistic("rgtest");
            replace(&rs, &HashMap::from([("spoof".to_string(), (3, 300))])).unwrap();
            assert!(exists("rgtest").unwrap());
            let tag = forwarding::tag(&rs);
            assert_eq!(
                installed("rgtest"),
                Installed::Present {
                    comment: Some(tag.clone())
                }
            );
            let (ok, text) = list();
            assert!(ok, "{text}");
            assert!(text.contains(&format!("comment \"{tag}\"")), "{text}");
            // A table made by hand has no tag.
            assert_eq!(installed("other"), Installed::Present { comment: None });
            for want in LISTED {
                assert!(
                    text.lines().any(|l| l.trim() == *want),
                    "no {want:?} in:\n{text}"
                );
            }
            other_intact();

            // Counters count; the rule that never holds does not.
            crate::netlink::Netlink::open()
                .unwrap()
                .set_link_up("lo", true)
                .unwrap();
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.send_to(b"x", "127.0.0.1:9").unwrap();
            let c = counters("rgtest").unwrap();
            assert_eq!(c.len(), rs.counters.len(), "{c:?}");
            assert_eq!(count(&c, "spoof"), (3, 300));
            assert_eq!(count(&c, "udp9"), (1, 29)); // IPv4 and UDP headers, 1 byte
            assert_eq!(count(&c, "never"), (0, 0));

            // A replace keeps the counts passed back in, sets others, zeroes the rest.
            let mut init: HashMap<_, _> = c.iter().map(|(n, p, b)| (n.clone(), (*p, *b))).collect();
            init.insert("fwd_drop".into(), (7, 700));
            init.remove("spoof");
            replace(&rs, &init).unwrap();
            let c = counters("rgtest").unwrap();
            assert_eq!(count(&c, "udp9"), (1, 29));
            assert_eq!(count(&c, "fwd_drop"), (7, 700));
            assert_eq!(count(&c, "spoof"), (0, 0));

            // Refused by the kernel (a rule names a counter that is not there; a chain less):
            // nothing changes, and the error names the message.
            let before = list().1;
            let mut bad = realistic("rgtest");
            bad.counters.retain(|c| c != "udp9");
            bad.chains.truncate(4);
            let e = replace(&bad, &HashMap::new()).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::ENOENT), "{e}");
            assert!(
                e.to_string().contains(": add rule 3 of chain output: "),
                "{e}"
            );
            assert_eq!(list().1, before);
            assert_eq!(counters("rgtest").unwrap(), c);
            other_intact();

            assert!(remove("rgtest").unwrap());
            assert!(!exists("rgtest").unwrap());
            assert!(!remove("rgtest").unwrap());
            assert!(counters("rgtest").unwrap().is_empty());
            assert!(!list().0);
            other_intact();
        });
    }
}
