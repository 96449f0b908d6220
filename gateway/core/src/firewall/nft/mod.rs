//! The nf_tables netlink messages of the firewall, built and read without a socket: a
//! [`Ruleset`] (computed in [`super::rules`]) becomes one batch transaction that replaces
//! its table whole ([`replace_batch`]), and the kernel's answers about a table's comment
//! and its counters are read back ([`parse_table_comment`], [`parse_counter`]).
//! `sys::nftables` sends and receives them (socket, acks, errors).
//!
//! What we send is small: a table, counter objects, chains, verdict maps keyed by address
//! ranges (interval sets) and their elements, and rules built from fifteen expressions
//! (`meta`, `cmp`, `payload`, `bitwise`, `ct`, `limit`, `objref`, `immediate`, `notrack`,
//! `masq`, `fib`, `lookup`, `rt`, `byteorder`, `exthdr`), encoded as nft 1.0 encodes the
//! same rules so that `nft list` prints them as nft's own; tested byte for byte here.

use std::collections::HashMap;
use std::net::IpAddr;

use super::forwarding;
use super::rules::{Action, Chain, Family, Hook, Match, Rule, Ruleset, VerdictMap, L4};
use crate::net::Cidr;
use crate::netlink::{
    attrs, nest, put_attr as attr, Malformed, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_EXCL, NLM_F_REQUEST,
};

// From <linux/netfilter/nfnetlink.h> and <linux/netfilter/nf_tables.h>, spelled out so
// the encoding is testable without a kernel.
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
const NFT_MSG_NEWSET: u8 = 9;
const NFT_MSG_NEWSETELEM: u8 = 12;
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
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFT_SET_INTERVAL: u32 = 0x4;
const NFT_SET_MAP: u32 = 0x8;
/// The data type of a verdict map's values.
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// nft's datatypes `ipv4_addr` and `ipv6_addr` (a set's key type, which `nft list` prints).
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
/// libnftnl's set userdata TLVs (values host-endian u32): the key's byte order (nft's
/// `BYTEORDER_BIG_ENDIAN`), the data's (none: a verdict), whether the data is an interval.
const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
const NFTNL_UDATA_SET_DATA_INTERVAL: u8 = 6;
const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// libnftnl's element userdata TLV: the interval runs to the family's last address (so
/// has no end element), which nft needs to print `a-255.255.255.255` rather than `a`.
const NFTNL_UDATA_SET_ELEM_FLAGS: u8 = 1;
const NFTNL_SET_ELEM_F_INTERVAL_OPEN: u32 = 1;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
const NFTA_LOOKUP_SET_ID: u16 = 4;
const NFTA_RT_DREG: u16 = 1;
const NFTA_RT_KEY: u16 = 2;
/// The route's MTU minus the IP and TCP headers, host-endian u16 in a u32 register.
const NFT_RT_TCPMSS: u32 = 3;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFTA_EXTHDR_TYPE: u16 = 2;
const NFTA_EXTHDR_OFFSET: u16 = 3;
const NFTA_EXTHDR_LEN: u16 = 4;
const NFTA_EXTHDR_OP: u16 = 6;
const NFTA_EXTHDR_SREG: u16 = 7;
const NFT_EXTHDR_OP_TCPOPT: u32 = 1;
/// TCP option kind 2, maximum segment size: kind, length, then the MSS at offset 2.
const TCPOPT_MAXSEG: u8 = 2;
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
const NFT_JUMP: i32 = -3;
const NFT_RETURN: i32 = -5;
/// libnftnl's rule and table userdata TLVs holding `comment "..."`.
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
const NFTNL_UDATA_TABLE_COMMENT: u8 = 0;
const IFNAMSIZ: usize = 16;
const NFT_NAME_MAXLEN: usize = 256;
/// A `NEWSETELEM` message's elements nest is closed once it passes this many bytes (one
/// element is at most a few hundred). A nest's length is a u16, so 64 KiB is the hard
/// limit (nft fills its messages up to it); half of it also keeps the kernel's error
/// answer, which quotes the message, within `sys::nftables`' 64 KiB receive buffer.
const SETELEM_NEST_BUDGET: usize = 32 * 1024;

/// A ruleset or name the kernel would misread rather than refuse (a name too long or
/// holding a NUL, a bad prefix): why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "firewall ruleset cannot be encoded: {}", self.0)
    }
}

impl std::error::Error for Invalid {}

// ---- Checks: what the kernel would misread rather than refuse. ----

fn check_name(kind: &str, s: &str, max: usize) -> Result<(), Invalid> {
    if s.is_empty() || s.len() >= max || s.contains('\0') {
        return Err(Invalid(format!(
            "{kind} name {s:?} must be 1 to {} bytes without NUL",
            max - 1
        )));
    }
    Ok(())
}

/// A table name nf_tables takes as it is.
pub fn check_table_name(name: &str) -> Result<(), Invalid> {
    check_name("table", name, NFT_NAME_MAXLEN)
}

/// Every name and prefix of `rs` as the kernel would take it; [`replace_batch`] assumes
/// this held.
pub fn validate(rs: &Ruleset) -> Result<(), Invalid> {
    check_name("table", &rs.table, NFT_NAME_MAXLEN)?;
    for c in &rs.counters {
        check_name("counter", c, NFT_NAME_MAXLEN)?;
    }
    for map in &rs.maps {
        check_map(rs, map)?;
    }
    for c in &rs.chains {
        check_name("chain", &c.name, NFT_NAME_MAXLEN)?;
        for r in &c.rules {
            if let Some(n) = &r.counter {
                check_name("counter", n, NFT_NAME_MAXLEN)?;
            }
            match &r.action {
                Action::Jump(to) => regular(rs, to, || format!("a rule of chain {:?}", c.name))?,
                Action::SourceMap(m) if !rs.maps.iter().any(|x| &x.name == m) => {
                    return Err(Invalid(format!(
                        "a rule of chain {:?} looks up map {m:?}, which is not there",
                        c.name
                    )));
                }
                _ => {}
            }
            for x in &r.matches {
                match x {
                    Match::Iif { name, .. } | Match::Oif { name, .. } => {
                        check_name("interface", name, IFNAMSIZ)?
                    }
                    Match::Saddr { net, .. } | Match::Daddr { net, .. }
                        if net.prefix > net.max_prefix() =>
                    {
                        return Err(Invalid(format!(
                            "prefix length {} of {}",
                            net.prefix, net.addr
                        )));
                    }
                    _ => {}
                }
            }
        }
    }
    for c in &rs.chains {
        if let Some(base) = c.base {
            check_reach(rs, base.hook, &mut vec![c.name.as_str()])?;
        }
    }
    Ok(())
}

/// How deep jumps may nest below a base chain (the kernel's `NFT_JUMP_STACK_SIZE`).
pub const JUMP_STACK: usize = 16;

/// What a base chain of hook `hook` reaches through jumps and maps (`path`: the base
/// chain, then each chain jumped to): the kernel refuses the whole ruleset for a loop,
/// for jumps nested deeper than [`JUMP_STACK`], and for `rt mtu` (the MSS clamp) below
/// prerouting or input, where no route has been chosen yet. Checked here to say which
/// chain it is. `rs` has passed the name checks (every jump's chain is there).
fn check_reach<'a>(rs: &'a Ruleset, hook: Hook, path: &mut Vec<&'a str>) -> Result<(), Invalid> {
    let Some(here) = path
        .last()
        .and_then(|n| rs.chains.iter().find(|c| &c.name == n))
    else {
        return Ok(());
    };
    let route_known = matches!(hook, Hook::Forward | Hook::Output | Hook::Postrouting);
    for r in &here.rules {
        let mut to: Vec<&str> = match &r.action {
            Action::ClampMss if !route_known => {
                return Err(Invalid(format!(
                    "chain {:?} clamps the MSS (rt mtu), which the kernel allows only below \
                     forward, output and postrouting (reached by {})",
                    here.name,
                    path.join(" -> ")
                )));
            }
            Action::Jump(c) => vec![c.as_str()],
            Action::SourceMap(m) => rs
                .maps
                .iter()
                .filter(|x| &x.name == m)
                .flat_map(|x| x.elements.iter().map(|e| e.chain.as_str()))
                .collect(),
            _ => continue,
        };
        to.sort_unstable();
        to.dedup();
        for c in to {
            if path.contains(&c) {
                return Err(Invalid(format!("jump loop: {} -> {c}", path.join(" -> "))));
            }
            if path.len() >= JUMP_STACK {
                return Err(Invalid(format!(
                    "jumps nest deeper than the kernel's {JUMP_STACK}: {} -> {c}",
                    path.join(" -> ")
                )));
            }
            path.push(c);
            check_reach(rs, hook, path)?;
            path.pop();
        }
    }
    Ok(())
}

/// A jump's target, and a map element's, must be a regular chain of `rs`: the kernel
/// refuses a jump to a base chain, and to a chain that is not there.
fn regular(rs: &Ruleset, name: &str, what: impl Fn() -> String) -> Result<(), Invalid> {
    match rs.chains.iter().find(|c| c.name == name) {
        Some(c) if c.base.is_none() => Ok(()),
        Some(_) => Err(Invalid(format!(
            "{}: chain {name:?} is a base chain",
            what()
        ))),
        None => Err(Invalid(format!("{}: no chain {name:?}", what()))),
    }
}

/// A map's name, and its elements: of its family, each `first <= last`, ascending and
/// apart, each naming a regular chain of `rs`.
fn check_map(rs: &Ruleset, map: &VerdictMap) -> Result<(), Invalid> {
    check_name("map", &map.name, NFT_NAME_MAXLEN)?;
    let mut after: Option<u128> = None;
    for e in &map.elements {
        let what = || format!("map {:?} element {}-{}", map.name, e.first, e.last);
        let (first, last) = match (key_of(map.family, e.first), key_of(map.family, e.last)) {
            (Some(f), Some(l)) => (f, l),
            _ => return Err(Invalid(format!("{}: not of the map's family", what()))),
        };
        if first > last {
            return Err(Invalid(format!("{}: first after last", what())));
        }
        if after.is_some_and(|a| first <= a) {
            return Err(Invalid(format!(
                "{}: overlaps or comes before the element before it",
                what()
            )));
        }
        after = Some(last);
        regular(rs, &e.chain, what)?;
    }
    Ok(())
}

/// An address of family `f` as a number (IPv4 in the low 32 bits); `None` for the other
/// family.
fn key_of(f: Family, a: IpAddr) -> Option<u128> {
    match (f, a) {
        (Family::V4, IpAddr::V4(a)) => Some(u32::from(a).into()),
        (Family::V6, IpAddr::V6(a)) => Some(u128::from(a)),
        _ => None,
    }
}

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

const fn nft_type(kind: u8) -> u16 {
    NFNL_SUBSYS_NFTABLES << 8 | kind as u16
}

/// The netlink message type of the kernel's answer describing a table.
pub const NEWTABLE: u16 = nft_type(NFT_MSG_NEWTABLE);
/// The netlink message type of the kernel's answer describing an object (a counter).
pub const NEWOBJ: u16 = nft_type(NFT_MSG_NEWOBJ);

/// `GETTABLE` for table `name` (family inet), asking for an ack: answered with a
/// [`NEWTABLE`] message, or an error (`ENOENT`: no such table).
pub fn get_table(name: &str) -> Vec<u8> {
    request(NFT_MSG_GETTABLE, NLM_F_ACK, |m| {
        attr_str(m, NFTA_TABLE_NAME, name)
    })
}

/// A dump of table `name`'s counter objects: a [`NEWOBJ`] message per counter.
pub fn get_counters(name: &str) -> Vec<u8> {
    request(NFT_MSG_GETOBJ, NLM_F_DUMP, |m| {
        attr_str(m, NFTA_OBJ_TABLE, name);
        attr_u32(m, NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
    })
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

/// A batch transaction: `BATCH_BEGIN`, messages that each ask for an ack, `BATCH_END`.
/// The kernel answers each message under its sequence number, and the transaction as a
/// whole under the begin's.
#[derive(Debug)]
pub struct Batch {
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

    /// The bytes to send.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The sequence number of `BATCH_BEGIN`.
    pub fn begin(&self) -> u32 {
        self.begin
    }

    /// What each message does, for errors: message `i` has sequence number
    /// `begin() + 1 + i` (`BATCH_END` follows the last).
    pub fn what(&self) -> &[String] {
        &self.what
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

/// Replace table `rs.table` (family inet) whole, in one transaction: create-if-absent the
/// table, delete it, create it again with its counters (initial `(packets, bytes)` from
/// `initial`, by name; absent = 0), chains (regular ones too), maps with their elements
/// (the chains they jump to exist by then), and rules. The new table's comment is `rs`'s
/// [`forwarding::tag`]. `rs` must have passed [`validate`].
pub fn replace_batch(rs: &Ruleset, initial: &HashMap<String, (u64, u64)>, seq: u32) -> Batch {
    let mut b = replace_messages(rs, initial, seq);
    b.end();
    b
}

/// [`replace_batch`] as a dry run (`nft --check`): the same messages without
/// `BATCH_END`, so the kernel checks each one, then validates the whole table as a
/// commit would (jump loops, hooks, limits) and aborts it: every error is answered, and
/// nothing changes.
pub fn check_batch(rs: &Ruleset, seq: u32) -> Batch {
    replace_messages(rs, &HashMap::new(), seq)
}

fn replace_messages(rs: &Ruleset, initial: &HashMap<String, (u64, u64)>, seq: u32) -> Batch {
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
    for (i, map) in rs.maps.iter().enumerate() {
        verdict_map(&mut b, t, map, set_id(i));
    }
    for c in &rs.chains {
        for (i, r) in c.rules.iter().enumerate() {
            rule(&mut b, t, &c.name, i + 1, r, &rs.maps);
        }
    }
    b
}

/// Delete table `name` (family inet), one transaction (`ENOENT` if it is not there).
pub fn delete_batch(name: &str, seq: u32) -> Batch {
    let mut b = Batch::new(seq);
    table(&mut b, NFT_MSG_DELTABLE, 0, name);
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

/// The batch-local id of `maps[i]` (nft's `NFTA_SET_ID`): the map's lookups and elements
/// name it besides its name, as nft does.
fn set_id(i: usize) -> u32 {
    i as u32 + 1
}

/// A verdict map (`NEWSET`: an interval map of addresses to verdicts, as nft sends `map
/// NAME { type ipv4_addr : verdict; flags interval; }`), then its elements. `EXCL`, so a
/// name listed twice is refused, not merged.
fn verdict_map(b: &mut Batch, table: &str, map: &VerdictMap, id: u32) {
    let (key_type, key_len) = match map.family {
        Family::V4 => (TYPE_IPADDR, 4),
        Family::V6 => (TYPE_IP6ADDR, 16),
    };
    let f = NLM_F_CREATE | NLM_F_EXCL;
    b.add(NFT_MSG_NEWSET, f, format!("add map {}", map.name), |m| {
        attr_str(m, NFTA_SET_TABLE, table);
        attr_str(m, NFTA_SET_NAME, &map.name);
        attr_u32(m, NFTA_SET_FLAGS, NFT_SET_MAP | NFT_SET_INTERVAL);
        attr_u32(m, NFTA_SET_KEY_TYPE, key_type);
        attr_u32(m, NFTA_SET_KEY_LEN, key_len);
        attr_u32(m, NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
        attr_u32(m, NFTA_SET_DATA_LEN, 0);
        attr_u32(m, NFTA_SET_ID, id);
        let mut u = Vec::with_capacity(18);
        for (kind, v) in [
            (NFTNL_UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN),
            (NFTNL_UDATA_SET_DATABYTEORDER, 0),
            (NFTNL_UDATA_SET_DATA_INTERVAL, 0),
        ] {
            u.extend([kind, 4]);
            u.extend(v.to_ne_bytes());
        }
        attr(m, NFTA_SET_USERDATA, &u);
    });
    // Chunks of elements, each a complete nest (`NFTA_LIST_ELEM`-like, numbered from 1
    // in each message as libnftnl numbers them; the kernel ignores the number).
    let mut chunk = Vec::new();
    let mut span: Option<(IpAddr, IpAddr)> = None;
    let mut count = 0u16;
    for e in interval_elements(map) {
        if let Some(s) = span.filter(|_| chunk.len() > SETELEM_NEST_BUDGET) {
            set_elems(b, table, map, id, s, &chunk);
            (span, count) = (None, 0);
            chunk.clear();
        }
        count += 1;
        nest(&mut chunk, count, |m| e.encode(m));
        let a = e.addr();
        span = Some((span.map_or(a, |s| s.0), a));
    }
    // None: an empty map, the set alone (as nft sends it).
    if let Some(s) = span {
        set_elems(b, table, map, id, s, &chunk);
    }
}

/// One `NEWSETELEM` message, its interval elements from `span.0` to `span.1` (named so,
/// should the kernel refuse it).
fn set_elems(
    b: &mut Batch,
    table: &str,
    map: &VerdictMap,
    id: u32,
    (first, last): (IpAddr, IpAddr),
    elems: &[u8],
) {
    let what = format!("add elements {first} to {last} of map {}", map.name);
    b.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, what, |m| {
        attr_str(m, NFTA_SET_ELEM_LIST_TABLE, table);
        attr_str(m, NFTA_SET_ELEM_LIST_SET, &map.name);
        attr_u32(m, NFTA_SET_ELEM_LIST_SET_ID, id);
        nest(m, NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
            m.extend_from_slice(elems)
        });
    });
}

/// One element of an interval set as the kernel holds it: where a range starts (with
/// its verdict) or where the gap after it starts (`INTERVAL_END`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IntervalElement<'a> {
    key: u128,
    family: Family,
    /// `Some(chain)`: a range starts here, mapped to `jump chain`; `None`: a gap does.
    jump: Option<&'a str>,
    /// The range runs to the family's last address (no end element follows).
    open: bool,
}

impl IntervalElement<'_> {
    fn addr(&self) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::from((self.key as u32).to_be_bytes()),
            Family::V6 => IpAddr::from(self.key.to_be_bytes()),
        }
    }

    fn encode(&self, m: &mut Vec<u8>) {
        let key = match self.family {
            Family::V4 => (self.key as u32).to_be_bytes().to_vec(),
            Family::V6 => self.key.to_be_bytes().to_vec(),
        };
        let key = |m: &mut Vec<u8>| nest(m, NFTA_SET_ELEM_KEY, |m| attr(m, NFTA_DATA_VALUE, &key));
        match self.jump {
            None => {
                attr_u32(m, NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
                key(m);
            }
            Some(chain) => {
                key(m);
                nest(m, NFTA_SET_ELEM_DATA, |m| jump_data(m, chain));
                if self.open {
                    let mut u = vec![NFTNL_UDATA_SET_ELEM_FLAGS, 4];
                    u.extend(NFTNL_SET_ELEM_F_INTERVAL_OPEN.to_ne_bytes());
                    attr(m, NFTA_SET_ELEM_USERDATA, &u);
                }
            }
        }
    }
}

/// What nft sends for a map's ranges, in order: a gap from the family's first address
/// when the first range starts later, then per range its start and, unless it runs to
/// the last address, the start of the gap after it (the same key as the next range's
/// start when they touch). `map` must have passed [`validate`].
fn interval_elements(map: &VerdictMap) -> Vec<IntervalElement<'_>> {
    let max = match map.family {
        Family::V4 => u128::from(u32::MAX),
        Family::V6 => u128::MAX,
    };
    let at = |key, jump, open| IntervalElement {
        key,
        family: map.family,
        jump,
        open,
    };
    let mut out = Vec::with_capacity(2 * map.elements.len() + 1);
    for (i, e) in map.elements.iter().enumerate() {
        let (Some(first), Some(last)) = (key_of(map.family, e.first), key_of(map.family, e.last))
        else {
            continue; // refused by `validate`
        };
        if i == 0 && first != 0 {
            out.push(at(0, None, false));
        }
        out.push(at(first, Some(e.chain.as_str()), last == max));
        if last != max {
            out.push(at(last + 1, None, false));
        }
    }
    out
}

/// A rule appended to its chain (without `APPEND` the kernel would insert it first).
fn rule(b: &mut Batch, table: &str, chain: &str, index: usize, r: &Rule, maps: &[VerdictMap]) {
    let mut what = format!("add rule {index} of chain {chain}");
    if !r.comment.is_empty() {
        what += &format!(" ({})", r.comment);
    }
    b.add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, what, |m| {
        attr_str(m, NFTA_RULE_TABLE, table);
        attr_str(m, NFTA_RULE_CHAIN, chain);
        nest(m, NFTA_RULE_EXPRESSIONS, |m| rule_exprs(m, r, maps));
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

/// A rule's expressions; `maps` are the ruleset's (a `SourceMap` names one).
fn rule_exprs(m: &mut Vec<u8>, r: &Rule, maps: &[VerdictMap]) {
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
    match &r.action {
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
        Action::Jump(chain) => expr(m, "immediate", |m| {
            attr_u32(m, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            nest(m, NFTA_IMMEDIATE_DATA, |m| jump_data(m, chain));
        }),
        Action::SourceMap(name) => {
            // As nft's `ip saddr vmap @NAME` in an inet table: the family check, the
            // source address, then a lookup whose result is the verdict. A map that is
            // not there (`validate` refuses it) is looked up as V4 without an id: the
            // kernel refuses the rule.
            let (i, f) = maps
                .iter()
                .position(|x| &x.name == name)
                .map_or((None, Family::V4), |i| (Some(i), maps[i].family));
            family(m, f, &mut fam);
            let (offset, len) = match f {
                Family::V4 => (12, 4),
                Family::V6 => (8, 16),
            };
            payload(m, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            expr(m, "lookup", |m| {
                attr_u32(m, NFTA_LOOKUP_SREG, NFT_REG_1);
                attr_u32(m, NFTA_LOOKUP_DREG, NFT_REG_VERDICT);
                attr_str(m, NFTA_LOOKUP_SET, name);
                if let Some(i) = i {
                    attr_u32(m, NFTA_LOOKUP_SET_ID, set_id(i));
                }
            });
        }
        Action::ClampMss => {
            // As nft's `tcp option maxseg size set rt mtu`: the route's MSS (host-endian)
            // into register 1, to network order, written over the MSS option's value. The
            // kernel only ever lowers it, and leaves packets without the option (or not
            // TCP) as they are; nft adds no `meta l4proto tcp` for it.
            expr(m, "rt", |m| {
                attr_u32(m, NFTA_RT_KEY, NFT_RT_TCPMSS);
                attr_u32(m, NFTA_RT_DREG, NFT_REG_1);
            });
            expr(m, "byteorder", |m| {
                attr_u32(m, NFTA_BYTEORDER_SREG, NFT_REG_1);
                attr_u32(m, NFTA_BYTEORDER_DREG, NFT_REG_1);
                attr_u32(m, NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON);
                attr_u32(m, NFTA_BYTEORDER_LEN, 2);
                attr_u32(m, NFTA_BYTEORDER_SIZE, 2);
            });
            expr(m, "exthdr", |m| {
                attr_u32(m, NFTA_EXTHDR_SREG, NFT_REG_1);
                attr(m, NFTA_EXTHDR_TYPE, &[TCPOPT_MAXSEG]);
                attr_u32(m, NFTA_EXTHDR_OFFSET, 2);
                attr_u32(m, NFTA_EXTHDR_LEN, 2);
                attr_u32(m, NFTA_EXTHDR_OP, NFT_EXTHDR_OP_TCPOPT);
            });
        }
    }
}

/// A verdict `jump chain` (`NFTA_DATA_VERDICT`), in an immediate or a map element.
fn jump_data(m: &mut Vec<u8>, chain: &str) {
    nest(m, NFTA_DATA_VERDICT, |m| {
        attr(m, NFTA_VERDICT_CODE, &NFT_JUMP.to_be_bytes());
        attr_str(m, NFTA_VERDICT_CHAIN, chain);
    });
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
        Match::TcpFlags { mask, value } => {
            // The flags byte of the TCP header (offset 13), masked, as nft's `tcp flags &
            // (syn|rst) == syn`.
            payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 13, 1);
            bitwise(m, &[*mask]);
            cmp(m, NFT_CMP_EQ, &[*value]);
        }
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
pub fn parse_counter(p: &[u8], table: &str) -> Result<Option<(String, u64, u64)>, Malformed> {
    let body = p.get(4..).ok_or(Malformed)?; // after nfgenmsg
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
        _ => Err(Malformed),
    }
}

/// An `NFT_MSG_NEWTABLE` payload: the table's comment (libnftnl's userdata TLVs), `None`
/// when it has none.
pub fn parse_table_comment(p: &[u8]) -> Result<Option<String>, Malformed> {
    let body = p.get(4..).ok_or(Malformed)?; // after nfgenmsg
    for (k, mut u) in attrs(body) {
        if k != NFTA_TABLE_USERDATA {
            continue;
        }
        // TLVs: type (u8), length (u8), value.
        while let [kind, len, rest @ ..] = u {
            let v = rest.get(..usize::from(*len)).ok_or(Malformed)?;
            if *kind == NFTNL_UDATA_TABLE_COMMENT {
                return Ok(Some(String::from_utf8_lossy(cstr(v)).into_owned()));
            }
            u = &rest[v.len()..];
        }
    }
    Ok(None)
}

#[cfg(all(test, target_endian = "little"))]
mod tests;
