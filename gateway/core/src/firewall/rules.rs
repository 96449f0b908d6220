//! The firewall as plain data: one nf_tables table of the `inet` family (IPv4 and IPv6
//! alike), its named counters, chains and rules, in a small vocabulary that
//! `sys::nftables` encodes into netlink messages. Nothing here knows netlink; nothing
//! there knows zones or policy.

use std::net::IpAddr;

use crate::net::Cidr;

/// A whole table, replaced as one transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ruleset {
    /// Table name (family `inet`).
    pub table: String,
    /// Named counters (nf_tables `counter` objects), referenced by rules; one per drop
    /// cause, read back for `riceguard status`.
    pub counters: Vec<String>,
    pub chains: Vec<Chain>,
    /// Verdict maps, looked up by [`Action::SourceMap`].
    pub maps: Vec<VerdictMap>,
}

/// A verdict map keyed by source address ranges (nft `map NAME { type ipv4_addr :
/// verdict; flags interval; elements = { 10.0.0.2 : jump c1, 10.1.0.0-10.1.255.255 : jump
/// c2 } }`): one lookup however many clients, where a rule per client would be walked in
/// turn.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VerdictMap {
    pub name: String,
    /// The family of every key (`ipv4_addr` or `ipv6_addr`).
    pub family: Family,
    pub elements: Vec<MapElement>,
}

/// Addresses `first..=last` (both of the map's family), sorted ascending and never
/// overlapping (`nft::validate` refuses otherwise), mapped to `jump CHAIN`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MapElement {
    pub first: IpAddr,
    pub last: IpAddr,
    /// A regular chain (`base: None`) of the table.
    pub chain: String,
}

/// A chain; base chains hook into the stack, regular chains are jumped to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub kind: ChainKind,
    pub hook: Hook,
    /// nf_tables priority (raw -300, filter 0, srcnat 100).
    pub priority: i32,
    /// Every base chain here has policy accept: our chains only ever drop what they mean
    /// to, so other tables (Docker's, a distribution's) decide the rest.
    pub policy_drop: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainKind {
    Filter,
    Nat,
}

impl ChainKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Nat => "nat",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// Priorities as nft names them.
pub const PRIO_RAW: i32 = -300;
pub const PRIO_FILTER: i32 = 0;
pub const PRIO_SRCNAT: i32 = 100;

/// One rule: every match must hold, then the counter (if any) counts and the action runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    /// A named counter of [`Ruleset::counters`].
    pub counter: Option<String>,
    pub action: Action,
    /// Why the rule is there (sent as nft's comment: `nft list` shows it).
    pub comment: &'static str,
}

impl Rule {
    /// A rule without a counter.
    pub fn new(matches: Vec<Match>, action: Action, comment: &'static str) -> Rule {
        Rule {
            matches,
            counter: None,
            action,
            comment,
        }
    }

    /// A rule whose matches count in the named counter.
    pub fn counted(
        matches: Vec<Match>,
        counter: &str,
        action: Action,
        comment: &'static str,
    ) -> Rule {
        Rule {
            counter: Some(counter.to_string()),
            ..Rule::new(matches, action, comment)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L4 {
    Tcp,
    Udp,
    Icmp,
    Icmpv6,
}

impl L4 {
    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4::Tcp => 6,
            L4::Udp => 17,
            L4::Icmp => 1,
            L4::Icmpv6 => 58,
        }
    }
}

/// Connection-tracking states (nf_conntrack's bits as nft's `ct state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtStates(pub u32);

impl CtStates {
    pub const INVALID: CtStates = CtStates(1);
    pub const ESTABLISHED: CtStates = CtStates(1 << 1);
    pub const RELATED: CtStates = CtStates(1 << 2);
    pub const NEW: CtStates = CtStates(1 << 3);
    pub const UNTRACKED: CtStates = CtStates(1 << 6);

    pub fn or(self, o: CtStates) -> CtStates {
        CtStates(self.0 | o.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    /// `meta iifname NAME` (`eq`) or `!= NAME`.
    Iif { name: String, eq: bool },
    /// `meta oifname NAME` (`eq`) or `!= NAME`.
    Oif { name: String, eq: bool },
    /// `meta nfproto ipv4|ipv6`.
    Family(Family),
    /// `meta l4proto P` (the family is implied by ICMP/ICMPv6 only).
    L4(L4),
    /// Source address inside (`eq`) or outside the prefix; implies the prefix's family.
    Saddr { net: Cidr, eq: bool },
    /// Destination address inside (`eq`) or outside the prefix; implies its family.
    Daddr { net: Cidr, eq: bool },
    /// TCP/UDP source port (with the `L4` match before it).
    Sport(u16),
    /// TCP/UDP destination port (with the `L4` match before it).
    Dport(u16),
    /// TCP/UDP source port in `lo..=hi` (with the `L4` match before it).
    SportIn(u16, u16),
    /// ICMP or ICMPv6 type (with the `L4` match before it).
    IcmpType(u8),
    /// What the destination address is to the appliance (nft `fib daddr type`): a
    /// route lookup, so only after cheaper matches.
    DaddrType(AddrType),
    /// An ICMP (`family` V4) or ICMPv6 error quoting a packet of protocol `l4` sent from
    /// our port `sport` (with the ICMP `L4` and type matches before it). The quoted
    /// header is read at fixed offsets: an IPv4 one without options (ours have none),
    /// an IPv6 one without extension headers.
    Quotes { family: Family, l4: L4, sport: u16 },
    /// `ct state` is one of these.
    Ct(CtStates),
    /// At most `per_second` packets a second, bursts of `burst` (beyond: no match).
    Limit { per_second: u64, burst: u32 },
    /// `tcp flags & mask == value` (with an `L4(Tcp)` match before it); e.g. SYN without
    /// RST: mask 0x06, value 0x02.
    TcpFlags { mask: u8, value: u8 },
}

/// Route types (`RTN_*`) of a destination, as `fib daddr type` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrType {
    /// One of the appliance's own addresses.
    Local,
    /// A broadcast address (255.255.255.255, a subnet's broadcast).
    Broadcast,
}

impl AddrType {
    /// The kernel's `RTN_*` number.
    pub fn rtn(self) -> u32 {
        match self {
            AddrType::Local => 2,
            AddrType::Broadcast => 3,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Accept,
    Drop,
    /// Leave this chain (a base chain: its policy, accept).
    Return,
    /// No connection tracking for this packet, then accept.
    Notrack,
    /// Source NAT to the outgoing interface's address.
    Masquerade,
    /// Source NAT to the outgoing interface's address and a source port in `lo..=hi`
    /// (kept when it is already inside and free; with a TCP/UDP `L4` match).
    MasqueradePorts(u16, u16),
    /// `jump CHAIN`: a regular chain (`base: None`) of the table; its `Return` (or its
    /// end) comes back to the rule after this one.
    Jump(String),
    /// `ip saddr vmap @NAME` (`ip6 saddr` for a V6 map): the verdict the map holds for
    /// the packet's source (a jump); a source it does not hold, or a packet of the other
    /// family: the rule does nothing and the next rule follows.
    SourceMap(String),
    /// `tcp option maxseg size set rt mtu`: the MSS option of a TCP packet lowered to fit
    /// the route's MTU (never raised). Not a verdict: the next rule follows.
    ClampMss,
}
