//! nf_tables over netlink (`NETLINK_NETFILTER`): installs the firewall — a [`Ruleset`]
//! computed as plain data in `core::firewall::rules` — as one batch transaction, deletes
//! it, and reads its named counters and its table's comment back.
//!
//! Hand-written because the static image carries neither the `nft` binary nor libnftnl:
//! the `nftnl` crate binds that C library and `rustables` is GPL-3.0 (we are
//! BSD-3-Clause). The messages are built and the answers read by the core
//! (`core::firewall::nft`, tested byte for byte there); this file owns the socket, the
//! sending, and what the kernel's acks and errors mean. The socket is `nix`'s safe
//! wrappers, so no `unsafe` here.

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeVal;

use riceguard_core::firewall::forwarding::Installed;
use riceguard_core::firewall::nft::{self, Batch, Invalid};
use riceguard_core::firewall::rules::Ruleset;
use riceguard_core::netlink::{error_code, messages, Malformed, Msg};
use riceguard_core::netlink::{NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP_INTR};

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

impl From<Invalid> for NftError {
    fn from(Invalid(why): Invalid) -> NftError {
        NftError::Invalid(why)
    }
}

impl From<Malformed> for NftError {
    fn from(_: Malformed) -> NftError {
        NftError::Malformed
    }
}

impl NftError {
    /// The errno the kernel refused a message with, if that is what happened.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NftError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Replace table `rs.table` (family inet) whole in ONE netlink batch transaction
/// ([`nft::replace_batch`]: its counters start at `initial`'s `(packets, bytes)`, by
/// name; absent = 0). Either all of it applies or nothing changes. The new table's
/// comment is `rs`'s [`forwarding::tag`](riceguard_core::firewall::forwarding::tag),
/// which [`installed`] reads back: whoever finds the table can tell which ruleset it is.
pub fn replace(rs: &Ruleset, initial: &HashMap<String, (u64, u64)>) -> Result<(), NftError> {
    nft::validate(rs)?;
    Socket::open()?.transact(&nft::replace_batch(rs, initial, 1))
}

/// Whether the kernel would take `rs` as [`replace`] sends it, without changing
/// anything (a batch without its end: the kernel checks and validates each message, then
/// aborts). What `commit` asks before it saves a configuration.
pub fn check(rs: &Ruleset) -> Result<(), NftError> {
    nft::validate(rs)?;
    Socket::open()?.transact(&nft::check_batch(rs, 1))
}

/// Delete table `name` (family inet) if it exists. `Ok(true)` if it was there.
pub fn remove(name: &str) -> Result<bool, NftError> {
    nft::check_table_name(name)?;
    match Socket::open()?.transact(&nft::delete_batch(name, 1)) {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether table `name` (family inet) exists.
pub fn exists(name: &str) -> Result<bool, NftError> {
    nft::check_table_name(name)?;
    let m = nft::get_table(name);
    match Socket::open()?.query(&m, "get table", |_| Ok(())) {
        Ok(_) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(unavailable(e)),
    }
}

/// Table `name` (family inet) as the kernel has it: absent, or there with its comment
/// (the `forwarding::tag` of the ruleset [`replace`] installed), or unreadable.
pub fn installed(name: &str) -> Installed {
    match table_comment(name) {
        Ok(None) => Installed::Absent,
        Ok(Some(comment)) => Installed::Present { comment },
        Err(e) => Installed::Unreadable(e.to_string()),
    }
}

/// `None`: no table `name`; `Some(comment)` otherwise.
fn table_comment(name: &str) -> Result<Option<Option<String>>, NftError> {
    nft::check_table_name(name)?;
    let m = nft::get_table(name);
    let mut comment = None;
    let r = Socket::open()?.query(&m, "get table", |msg| {
        if msg.kind == nft::NEWTABLE {
            comment = nft::parse_table_comment(msg.payload)?;
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
    nft::check_table_name(name)?;
    let m = nft::get_counters(name);
    let mut s = Socket::open()?;
    // A dump that a concurrent change interrupted is inconsistent: ask again.
    for _ in 0..3 {
        let mut out = Vec::new();
        let r = s.query(&m, "list counters", |msg| {
            if msg.kind == nft::NEWOBJ {
                out.extend(nft::parse_counter(msg.payload, name)?);
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
            answered: vec![false; b.what().len()],
            pending: b.what().len(),
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
            let mut at = msg.seq.wrapping_sub(b.begin()) as usize;
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
            if code != 0 && self.failed.is_none_or(|(j, _)| at < j) {
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
                    b.what().get(i).cloned().unwrap_or_default(),
                ))
            }
            Some((0, e @ (Errno::EOPNOTSUPP | Errno::EPROTONOSUPPORT))) => {
                Err(NftError::Unavailable(e))
            }
            Some((at, errno)) => Err(NftError::Kernel {
                what: match at {
                    0 => format!("the transaction ({} messages)", b.what().len()),
                    _ => b.what()[at - 1].clone(),
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
        self.send(b.bytes())?;
        let mut acks = Acks::new(b);
        while acks.pending > 0 {
            match self.recv(acks.failed.is_some())? {
                Some(n) => acks.absorb(b, &self.buf[..n])?,
                None => break,
            }
        }
        acks.result(b)
    }

    /// Send one request ([`nft::get_table`], [`nft::get_counters`]) and hand each answer to `f` until the kernel ends it with an
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

// Byte layouts are written little-endian (both our targets).
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use riceguard_core::firewall::forwarding;
    use riceguard_core::firewall::rules::{Action, Chain, Family, Hook, Match, Rule, L4};
    use riceguard_core::firewall::rules::{AddrType, ChainKind, CtStates};
    use riceguard_core::firewall::rules::{MapElement, VerdictMap};
    use riceguard_core::firewall::rules::{PRIO_FILTER, PRIO_RAW, PRIO_SRCNAT};

    use riceguard_core::testutil::nft::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    use Action::*;

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
        let b = nft::replace_batch(&tiny(), &HashMap::new(), 1);
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
    fn a_name_the_kernel_would_misread_is_refused_before_the_socket() {
        assert!(matches!(remove(""), Err(NftError::Invalid(_))));
        let mut rs = tiny();
        rs.table = "x".repeat(256);
        assert!(matches!(
            replace(&rs, &HashMap::new()),
            Err(NftError::Invalid(_))
        ));
    }

    /// The lab's ruleset: every match kind and action at least once.
    #[rustfmt::skip] // one rule a line
    fn realistic(table: &str) -> Ruleset {
        let est = || Match::Ct(CtStates::ESTABLISHED.or(CtStates::RELATED));
        let (tun4, tun6) = ("10.100.0.0/24", "fd00:100::/64");
        let counters = ["spoof", "spoof6", "fwd_drop", "never", "udp9", "ssh_limited", "via_map"];
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
        let syn = Match::TcpFlags { mask: 0x06, value: 0x02 };
        let forward = vec![
            rule_(vec![l4(L4::Tcp), syn], None, ClampMss),
            rule_(vec![est()], None, Accept),
            rule_(vec![iif("rgx0", true)], None, SourceMap("clients4".into())),
            rule_(vec![iif("rgx0", true)], None, SourceMap("clients6".into())),
            rule_(vec![iif("rgx0", true)], None, SourceMap("nobody".into())),
            rule_(vec![iif("rgx1", true)], None, Jump("client_a".into())),
            noted(TUNNEL_ONLY, fwd),
        ];
        let output = vec![
            rule_(vec![l4(L4::Udp), Match::Sport(51820)], None, Notrack),
            rule_(vec![sa("0.0.0.0/0", false)], Some("never"), Accept),
            // Loopback's source goes through a map: jump, and back for port 9.
            rule_(vec![], None, SourceMap("local4".into())),
            rule_(vec![l4(L4::Udp), Match::Dport(9)], Some("udp9"), Accept),
        ];
        let client_a = vec![
            rule_(vec![l4(L4::Tcp), Match::Dport(22)], None, Drop),
            rule_(vec![sa("10.100.0.2/32", true)], None, Return),
            rule_(vec![], None, Accept),
        ];
        let client_b = vec![rule_(vec![l4(L4::Udp)], None, Drop)];
        let loopback = vec![rule_(vec![l4(L4::Udp), Match::Dport(10)], Some("via_map"), Accept)];
        let high = vec![oif("uplink0", true), l4(L4::Udp), Match::SportIn(51820, 65535)];
        let postrouting = vec![
            rule_(high, None, MasqueradePorts(51821, 65535)),
            rule_(vec![oif("uplink0", true), sa(tun4, true)], None, Masquerade),
            rule_(vec![oif("uplink0", true), sa(tun6, true)], None, Masquerade),
        ];
        let chains = vec![
            regular("client_a", client_a),
            regular("client_b", client_b),
            regular("loopback", loopback),
            filter("prerouting", Hook::Prerouting, PRIO_RAW, prerouting),
            filter("input", Hook::Input, PRIO_FILTER, input),
            filter("forward", Hook::Forward, PRIO_FILTER, forward),
            filter("output", Hook::Output, PRIO_RAW, output),
            base("postrouting", ChainKind::Nat, Hook::Postrouting, PRIO_SRCNAT, postrouting),
        ];
        let maps = vec![
            map("clients4", Family::V4, &[
                ("10.100.0.2", "10.100.0.2", "client_a"),
                ("10.100.0.16", "10.100.0.31", "client_b"),
                ("10.100.0.40", "10.100.0.77", "client_b"),
                ("10.200.0.0", "255.255.255.255", "client_a"),
            ]),
            map("clients6", Family::V6, &[
                ("fd00:100::2", "fd00:100::2", "client_a"),
                // Touching: the end of the one before and this start share a key.
                ("fd00:100::3", "fd00:100::7", "client_b"),
            ]),
            map("nobody", Family::V4, &[]),
            map("local4", Family::V4, &[("0.0.0.0", "127.0.0.1", "loopback")]),
        ];
        Ruleset { table: table.into(), counters: counters.map(String::from).into(), chains, maps }
    }

    fn regular(name: &str, rules: Vec<Rule>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
            rules,
        }
    }

    fn map(name: &str, family: Family, elements: &[(&str, &str, &str)]) -> VerdictMap {
        let elements = elements
            .iter()
            .map(|(first, last, chain)| MapElement {
                first: first.parse().unwrap(),
                last: last.parse().unwrap(),
                chain: chain.to_string(),
            })
            .collect();
        VerdictMap {
            name: name.into(),
            family,
            elements,
        }
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
        "tcp flags syn / syn,rst tcp option maxseg size set rt mtu",
        "iifname \"rgx0\" ip saddr vmap @clients4",
        "iifname \"rgx0\" ip6 saddr vmap @clients6",
        "iifname \"rgx0\" ip saddr vmap @nobody",
        "iifname \"rgx1\" jump client_a",
        "iifname \"rgx0\" oifname != \"uplink0\" counter name \"fwd_drop\" drop comment \"tunnel only to the uplink\"",
        "type filter hook output priority raw; policy accept;",
        "udp sport 51820 notrack accept",
        "ip saddr != 0.0.0.0/0 counter name \"never\" accept",
        "ip saddr vmap @local4",
        "udp dport 9 counter name \"udp9\" accept",
        "chain client_a {",
        "tcp dport 22 drop",
        "ip saddr 10.100.0.2 return",
        "accept",
        "chain client_b {",
        "meta l4proto udp drop",
        "chain loopback {",
        "udp dport 10 counter name \"via_map\" accept",
        "map clients4 {",
        "type ipv4_addr : verdict",
        "flags interval",
        "elements = { 10.100.0.2 : jump client_a, 10.100.0.16/28 : jump client_b,",
        "10.100.0.40-10.100.0.77 : jump client_b, 10.200.0.0-255.255.255.255 : jump client_a }",
        "map clients6 {",
        "type ipv6_addr : verdict",
        "elements = { fd00:100::2 : jump client_a,",
        "fd00:100::3-fd00:100::7 : jump client_b }",
        "map nobody {",
        "elements = { 0.0.0.0-127.0.0.1 : jump loopback }",
        "type nat hook postrouting priority srcnat; policy accept;",
        "oifname \"uplink0\" udp sport 51820-65535 masquerade to :51821-65535",
        "oifname \"uplink0\" ip saddr 10.100.0.0/24 masquerade",
        "oifname \"uplink0\" ip6 saddr fd00:100::/64 masquerade",
    ];

    /// `nft ARGS` in this thread's network namespace (a child inherits it), at most 10 s.
    /// Its output is read while it runs: a listing longer than the pipe's buffer would
    /// otherwise stop it.
    fn nft(args: &[&str]) -> (bool, String) {
        use std::io::Read;
        let (o, e) = (Stdio::piped(), Stdio::piped());
        let mut c = Command::new("nft")
            .args(args)
            .stdout(o)
            .stderr(e)
            .spawn()
            .expect("run nft");
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                v
            })
        };
        let out = drain(Box::new(c.stdout.take().unwrap()));
        let err = drain(Box::new(c.stderr.take().unwrap()));
        let t = Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(10) {
                let _ = c.kill();
                panic!("nft {args:?} did not finish in 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let text = [out.join().unwrap(), err.join().unwrap()].concat();
        (
            status.success(),
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
            // Through map local4 into chain loopback, which accepts port 10 and returns
            // the rest (port 9) to output.
            s.send_to(b"x", "127.0.0.1:10").unwrap();
            let c = counters("rgtest").unwrap();
            assert_eq!(c.len(), rs.counters.len(), "{c:?}");
            assert_eq!(count(&c, "spoof"), (3, 300));
            assert_eq!(count(&c, "udp9"), (1, 29)); // IPv4 and UDP headers, 1 byte
            assert_eq!(count(&c, "via_map"), (1, 29));
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
            bad.chains.retain(|c| c.name != "postrouting");
            let e = replace(&bad, &HashMap::new()).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::ENOENT), "{e}");
            assert!(
                e.to_string().contains(": add rule 4 of chain output: "),
                "{e}"
            );
            assert_eq!(list().1, before);
            assert_eq!(counters("rgtest").unwrap(), c);
            other_intact();

            // A map of 2000 IPv6 ranges goes in several messages, all taken.
            let mut big = realistic("rgtest");
            let net = |i: u128| std::net::Ipv6Addr::from((0xfd00_0200u128 << 96) + i).into();
            big.maps[1].elements = (0..2000u128)
                .map(|i| MapElement {
                    first: net(4 * i),
                    last: net(4 * i + 1),
                    chain: "client_b".into(),
                })
                .collect();
            let b = nft::replace_batch(&big, &HashMap::new(), 1);
            let parts = b
                .what()
                .iter()
                .filter(|w| w.contains("of map clients6"))
                .count();
            assert!(parts > 2, "{:?}", b.what());
            replace(&big, &HashMap::new()).unwrap();
            let (ok, text) = nft(&["list", "map", "inet", "rgtest", "clients6"]);
            assert!(ok, "{text}");
            for want in [
                "fd00:200::/127 : jump client_b",
                "fd00:200::1f3c/127 : jump client_b",
            ] {
                assert!(text.contains(want), "no {want:?} in:\n{text}");
            }
            assert_eq!(text.matches(": jump client_b").count(), 2000);

            assert!(remove("rgtest").unwrap());
            assert!(!exists("rgtest").unwrap());
            assert!(!remove("rgtest").unwrap());
            assert!(counters("rgtest").unwrap().is_empty());
            assert!(!list().0);
            other_intact();
        });
    }

    /// The appliance's own policy with per-client access for 500 clients (two families,
    /// isolation, a hub's /0 around them) goes into a real kernel in one transaction, and
    /// nft reads the maps and a client's chain back.
    #[test]
    fn per_client_access_for_500_clients_installs_in_private_netns() {
        use riceguard_core::config::{Config, PeerConfig};
        use riceguard_core::firewall::{clients, ruleset, Ports};
        use riceguard_core::key::Key;
        in_netns(|| {
            if Command::new("nft").arg("--version").output().is_err() {
                return crate::testutil::not_run("nft (Debian's nftables) is not installed");
            }
            if let Err(NftError::Unavailable(e)) = exists("riceguard") {
                return crate::testutil::not_run(&e.to_string());
            }
            let mut cfg = Config::default();
            cfg.interface.listen_port = Some(51820);
            cfg.interface.addresses = vec!["10.100.0.1/22".parse().unwrap()];
            cfg.gateway.lan = "eth1".into();
            cfg.gateway.client_isolation = true;
            let access =
                riceguard_core::access::parse_list("lan, 192.168.88.10/32 tcp 8096").unwrap();
            for i in 0..500u32 {
                let a = std::net::Ipv4Addr::from(0x0a64_0002 + i);
                let mut k = [0u8; 32];
                k[..4].copy_from_slice(&i.to_be_bytes());
                k[31] = 9;
                let mut pc = PeerConfig::new(Key(k));
                pc.allowed_ips = vec![
                    format!("{a}/32").parse().unwrap(),
                    format!("fd00:100::{:x}/128", i + 2).parse().unwrap(),
                ];
                if i % 2 == 0 {
                    pc.access = Some(access.clone());
                }
                cfg.peers.push(pc);
            }
            let mut hub = PeerConfig::new(Key([0xee; 32]));
            hub.allowed_ips = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
            hub.access = Some(riceguard_core::access::parse_list("lan").unwrap());
            cfg.peers.push(hub);
            let mut p = Ports::from_config(&cfg);
            p.uplink_nets = vec!["192.0.2.0/24".parse().unwrap()];
            let rs = ruleset(&cfg, &p);
            replace(&rs, &HashMap::new()).unwrap();
            let (ok, text) = nft(&["list", "map", "inet", "riceguard", clients::MAP_FORWARD_V4]);
            assert!(ok, "{text}");
            assert!(text.contains("type ipv4_addr : verdict"), "{text}");
            assert!(text.contains("10.100.0.2 : jump fwd-"), "{text}");
            let first = clients::key_tag(&cfg.peers[0].public_key);
            let (ok, text) = nft(&[
                "list",
                "chain",
                "inet",
                "riceguard",
                &format!("fwd-{first}"),
            ]);
            assert!(ok, "{text}");
            assert!(
                text.contains("ip daddr 192.168.88.10 tcp dport 8096 accept"),
                "{text}"
            );
            assert!(
                text.contains("oifname \"wg0\" counter name \"access-"),
                "{text}"
            );
            let (ok, text) = nft(&["list", "chain", "inet", "riceguard", "forward"]);
            assert!(ok, "{text}");
            assert!(text.contains("ip saddr vmap @client-fwd4"), "{text}");
            assert!(text.contains("tcp option maxseg size set rt mtu"), "{text}");
            let c = counters("riceguard").unwrap();
            assert_eq!(
                c.iter()
                    .filter(|(n, _, _)| n.starts_with("access-"))
                    .count(),
                501
            );
            assert!(remove("riceguard").unwrap());
        });
    }

    /// The dry run `commit` asks for: a good table is taken and nothing changes (no table
    /// appears, one in place keeps its tag); one the kernel refuses as a whole (the
    /// forward hook already holds its limit of base chains) is refused with the kernel's
    /// reason, and nothing changes either.
    #[test]
    fn check_changes_nothing_and_reports_what_the_kernel_refuses() {
        in_netns(|| {
            if Command::new("nft").arg("--version").output().is_err() {
                return crate::testutil::not_run("nft (Debian's nftables) is not installed");
            }
            if let Err(NftError::Unavailable(e)) = exists("rgcheck") {
                return crate::testutil::not_run(&e.to_string());
            }
            let rs = realistic("rgcheck");
            check(&rs).unwrap();
            assert!(!exists("rgcheck").unwrap(), "a dry run installed the table");
            replace(&rs, &HashMap::new()).unwrap();
            let tag = forwarding::tag(&rs);
            let mut other = rs.clone();
            other.counters.push("extra".into());
            check(&other).unwrap();
            assert_eq!(
                installed("rgcheck"),
                Installed::Present { comment: Some(tag) },
                "a dry run replaced the table"
            );
            assert!(remove("rgcheck").unwrap());
            // Fill the forward hook (1024 base chains, the kernel's limit per hook).
            let mut script = String::from("table inet rgfill {\n");
            for i in 0..1024 {
                script += &format!("chain c{i} {{ type filter hook forward priority 0; }}\n");
            }
            script += "}\n";
            let path = std::env::temp_dir().join(format!("rgfill-{}.nft", std::process::id()));
            std::fs::write(&path, script).unwrap();
            let (ok, out) = nft(&["-f", path.to_str().unwrap()]);
            let _ = std::fs::remove_file(&path);
            assert!(ok, "{out}");
            let e = check(&rs).unwrap_err();
            assert!(e.to_string().contains("chain"), "{e}");
            assert!(!exists("rgcheck").unwrap());
            let (ok, out) = nft(&["delete", "table", "inet", "rgfill"]);
            assert!(ok, "{out}");
        });
    }
}
