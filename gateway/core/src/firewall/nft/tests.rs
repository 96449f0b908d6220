//! Byte for byte: what each expression, message and batch must be, as nft 1.0 sends them
//! (the layouts are written little-endian, both our targets), and the readers of the
//! kernel's answers. `sys::nftables` installs the same rules in a network namespace and
//! reads them back with Debian's `nft`.

use super::*;
use crate::firewall::rules::{AddrType, ChainKind, CtStates};
use crate::firewall::rules::{PRIO_FILTER, PRIO_RAW, PRIO_SRCNAT};
use crate::netlink::messages;
use crate::testutil::nft::*;
use Action::*;

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
    let data =
        format!("08000200 000000{base:02x} 08000300 000000{offset:02x} 08000400 000000{len:02x}");
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
const CT_STATE: &str = "20000180 07000100 63740000 14000280 08000100 00000001 08000200 00000000";
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
        rule_exprs(&mut m, &rule_(vec![], Some("spoof"), a.clone()), &[]);
        assert_eq!(m, hex(&(OBJREF_SPOOF.to_string() + &want)), "{a:?}");
    }
}

#[test]
fn masquerade_to_a_port_range() {
    let mut m = Vec::new();
    rule_exprs(
        &mut m,
        &rule_(vec![], None, MasqueradePorts(51821, 65535)),
        &[],
    );
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
    let m = first_message(|b| rule(b, "rg", "input", 1, &r, &[]));
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

fn malformed<T>(r: Result<T, Malformed>) -> bool {
    matches!(r, Err(Malformed))
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
        Err(Invalid(_))
    ));
    assert!(with(iif("fifteen-bytes-n", true)).is_ok());
    let net = Cidr {
        addr: "10.0.0.0".parse().unwrap(),
        prefix: 33,
    };
    assert!(matches!(
        with(Match::Saddr { net, eq: true }),
        Err(Invalid(_))
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
    assert!(matches!(check_table_name(""), Err(Invalid(_))));
    assert!(check_table_name("riceguard").is_ok());
}

#[test]
fn requests_outside_a_batch() {
    let want = "1c000000 010a 0500 01000000 00000000  01000000  07000100 72670000";
    assert_eq!(get_table("rg"), hex(want));
    // A dump of the counter objects (`NLM_F_DUMP`, no ack).
    let want = "24000000 130a 0103 01000000 00000000  01000000  07000100 72670000 \
                08000300 00000001";
    assert_eq!(get_counters("rg"), hex(want));
    let b = delete_batch("rg", 7);
    assert_eq!(
        (b.begin(), b.what()),
        (7, &["delete table inet rg".to_string()][..])
    );
    let kinds: Vec<_> = messages(b.bytes()).map(|m| m.unwrap().seq).collect();
    assert_eq!(kinds, [7, 8, 9]);
}

/// The metrics port's one-armed input rule, as nft 1.0 encodes `meta l4proto tcp tcp
/// dport 9586 ip saddr 192.168.1.0/24 accept`; two-armed there is no such rule.
#[test]
fn the_metrics_rule_encodes_as_nft_does() {
    use crate::config::Config;
    use crate::firewall::{ruleset, Ports};
    let mut cfg = Config::default();
    cfg.gateway.metrics = true;
    let p = Ports {
        tunnel: "wg0".into(),
        uplink_nets: vec![cidr("192.168.1.0/24")],
        uplink_addrs: vec![cidr("192.168.1.2/24")],
        ..Ports::default()
    };
    let metrics_rules = |cfg: &Config, p: &Ports| -> Vec<Rule> {
        let rs = ruleset(cfg, p);
        let input = rs.chains.iter().find(|c| c.name == "input").unwrap();
        input
            .rules
            .iter()
            .filter(|r| r.matches.contains(&Match::Dport(9586)))
            .cloned()
            .collect()
    };
    let rules = metrics_rules(&cfg, &p);
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].action, Accept);
    let (mut m, mut fam) = (Vec::new(), None);
    for x in &rules[0].matches {
        match_exprs(&mut m, x, &mut fam);
    }
    let want = [
        meta("10"),
        cmp(0, "06"),
        payload(2, 2, 2),
        cmp(0, "2572"),
        v4(),
        payload(1, 12, 3),
        cmp(0, "c0a801"),
    ]
    .concat();
    assert_eq!(m, hex(&want));
    let mut two = p.clone();
    two.lan = Some("eth1".into());
    assert!(metrics_rules(&cfg, &two).is_empty());
    cfg.gateway.metrics = false;
    assert!(metrics_rules(&cfg, &p).is_empty());
}

// ---- Regular chains, verdict maps, MSS clamping: the bytes nft 1.0.6 sent (libnftnl
// 1.2.4, captured with `strace -e write=` on `nft -f`) for the same rules. ----

/// `immediate` loading `jump c1` into the verdict register.
const JUMP_C1: &str = "38000180 0e000100 696d6d65 64696174 65000000 24000280 08000100 00000000 \
                       18000280 14000280 08000100 fffffffd 07000200 63310000";
/// `tcp option maxseg size set rt mtu`: rt, byteorder, exthdr.
const CLAMP_MSS: &str = "20000180 07000100 72740000 14000280 08000200 00000003 08000100 00000001 \
     40000180 0e000100 62797465 6f726465 72000000 2c000280 08000100 00000001 08000200 00000001 \
     08000300 00000001 08000400 00000002 08000500 00000002 \
     3c000180 0b000100 65787468 64720000 2c000280 08000700 00000001 05000200 02000000 \
     08000300 00000002 08000400 00000002 08000600 00000001";
/// `lookup` of register 1 in set `name` (id `id`), the verdict into register 0.
fn lookup(name: &str, id: u8) -> String {
    let name: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!(
        "34000180 0b000100 6c6f6f6b 75700000 24000280 08000200 00000001 08000300 00000000 \
         07000100 {name}0000 08000400 000000{id:02x}"
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn map(name: &str, family: Family, elements: &[(&str, &str, &str)]) -> VerdictMap {
    use crate::firewall::rules::MapElement;
    let elements = elements
        .iter()
        .map(|(first, last, chain)| MapElement {
            first: ip(first),
            last: ip(last),
            chain: chain.to_string(),
        })
        .collect();
    VerdictMap {
        name: name.into(),
        family,
        elements,
    }
}

fn regular(name: &str, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.into(),
        base: None,
        rules,
    }
}

fn exprs(r: &Rule, maps: &[VerdictMap]) -> Vec<u8> {
    let mut m = Vec::new();
    rule_exprs(&mut m, r, maps);
    m
}

#[test]
fn jump_source_maps_mss_clamp_and_tcp_flags_encode_as_nft_does() {
    let maps = [map("m4", Family::V4, &[]), map("m6", Family::V6, &[])];
    assert_eq!(
        exprs(&rule_(vec![], None, Jump("c1".into())), &maps),
        hex(JUMP_C1)
    );
    // `ip saddr vmap @m4`: the family check nft adds, the source, the lookup.
    let want = v4() + &payload(1, 12, 4) + &lookup("m4", 1);
    assert_eq!(
        exprs(&rule_(vec![], None, SourceMap("m4".into())), &maps),
        hex(&want)
    );
    let want = v6() + &payload(1, 8, 16) + &lookup("m6", 2);
    assert_eq!(
        exprs(&rule_(vec![], None, SourceMap("m6".into())), &maps),
        hex(&want)
    );
    // A family the rule checked already is not checked again.
    let r = rule_(
        vec![Match::Family(Family::V6)],
        None,
        SourceMap("m6".into()),
    );
    assert_eq!(exprs(&r, &maps), hex(&want));
    assert_eq!(exprs(&rule_(vec![], None, ClampMss), &maps), hex(CLAMP_MSS));
    // `tcp flags & (syn|rst) == syn`: the flags byte, masked. (nft also sends the
    // bitwise's default operation, NFTA_BITWISE_OP 0, which our `bitwise` leaves out.)
    let flags = Match::TcpFlags {
        mask: 0x06,
        value: 0x02,
    };
    let mask = "0c000480 05000100 06000000 0c000580 05000100 00000000";
    let bw = format!(
        "44000180 0c000100 62697477 69736500 34000280 08000100 00000001 08000200 00000001 \
         08000300 00000001 {mask}"
    );
    check(
        &[l4(L4::Tcp), flags],
        &[
            &meta("10"),
            &cmp(0, "06"),
            &payload(2, 13, 1),
            &bw,
            &cmp(0, "02"),
        ],
    );
}

/// The NEWSET body nft sends for `map NAME { type T : verdict; flags interval; }`.
fn newset(name: &str, v6: bool, id: u8) -> String {
    let name: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let (ty, len) = if v6 { ("08", "10") } else { ("07", "04") };
    format!(
        "01000000 06000100 74000000 07000200 {name}0000 08000300 0000000c \
         08000400 000000{ty} 08000500 000000{len} 08000600 ffffff00 08000700 00000000 \
         08000a00 000000{id:02x} 16000d00 00040200 00000104 00000000 06040000 00000000"
    )
}

/// The messages of `rs`'s batch from its first map on, as (type, flags, payload).
fn map_messages(rs: &Ruleset) -> Vec<(u16, u16, Vec<u8>)> {
    let b = replace_batch(rs, &HashMap::new(), 1);
    let first = 3 + rs.counters.len() + rs.chains.len();
    messages(&b.buf)
        .skip(1 + first)
        .map(|m| m.unwrap())
        .map(|m| (m.kind, m.flags, m.payload.to_vec()))
        .collect()
}

#[test]
fn maps_and_their_interval_elements_are_sent_as_nft_sends_them() {
    let rs = Ruleset {
        table: "t".into(),
        counters: vec![],
        chains: vec![regular("c1", vec![]), regular("c2", vec![])],
        maps: vec![
            // nft: `10.0.0.2 : jump c1, 10.1.0.0-10.1.255.255 : jump c2`.
            map(
                "m4",
                Family::V4,
                &[
                    ("10.0.0.2", "10.0.0.2", "c1"),
                    ("10.1.0.0", "10.1.255.255", "c2"),
                ],
            ),
            // nft: `fd00::2 : jump c1, fd01::-fd01::ffff : jump c1`.
            map(
                "m6",
                Family::V6,
                &[("fd00::2", "fd00::2", "c1"), ("fd01::", "fd01::ffff", "c1")],
            ),
            // nft: `0.0.0.0-10.0.0.1 : jump c1, 10.1.0.0-255.255.255.255 : jump c1`.
            map(
                "e4",
                Family::V4,
                &[
                    ("0.0.0.0", "10.0.0.1", "c1"),
                    ("10.1.0.0", "255.255.255.255", "c1"),
                ],
            ),
            map("x4", Family::V4, &[]),
        ],
    };
    validate(&rs).unwrap();
    let got = map_messages(&rs);
    let (set, elem) = (nft_type(NFT_MSG_NEWSET), nft_type(NFT_MSG_NEWSETELEM));
    let acked = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    // A gap from 0.0.0.0 first (the first range starts later), then each range's start
    // and the gap after it.
    let m4 = "01000000 06000100 74000000 07000200 6d340000 08000400 00000001 9c000380 \
              18000180 08000300 00000001 0c000180 08000100 00000000 \
              28000280 0c000180 08000100 0a000002 18000280 14000280 08000100 fffffffd 07000200 63310000 \
              18000380 08000300 00000001 0c000180 08000100 0a000003 \
              28000480 0c000180 08000100 0a010000 18000280 14000280 08000100 fffffffd 07000200 63320000 \
              18000580 08000300 00000001 0c000180 08000100 0a020000";
    let m6 = "01000000 06000100 74000000 07000200 6d360000 08000400 00000002 d8000380 \
              24000180 08000300 00000001 18000180 14000100 00000000 00000000 00000000 00000000 \
              34000280 18000180 14000100 fd000000 00000000 00000000 00000002 \
                       18000280 14000280 08000100 fffffffd 07000200 63310000 \
              24000380 08000300 00000001 18000180 14000100 fd000000 00000000 00000000 00000003 \
              34000480 18000180 14000100 fd010000 00000000 00000000 00000000 \
                       18000280 14000280 08000100 fffffffd 07000200 63310000 \
              24000580 08000300 00000001 18000180 14000100 fd010000 00000000 00000000 00010000";
    // Starting at 0.0.0.0: no gap before it; running to 255.255.255.255: no end
    // element, and libnftnl's userdata saying the interval is open.
    let e4 = "01000000 06000100 74000000 07000200 65340000 08000400 00000003 78000380 \
              28000180 0c000180 08000100 00000000 18000280 14000280 08000100 fffffffd 07000200 63310000 \
              18000280 08000300 00000001 0c000180 08000100 0a000002 \
              34000380 0c000180 08000100 0a010000 18000280 14000280 08000100 fffffffd 07000200 63310000 \
                       0a000600 01040100 00000000";
    let want = vec![
        (set, acked | NLM_F_EXCL, hex(&newset("m4", false, 1))),
        (elem, acked, hex(m4)),
        (set, acked | NLM_F_EXCL, hex(&newset("m6", true, 2))),
        (elem, acked, hex(m6)),
        (set, acked | NLM_F_EXCL, hex(&newset("e4", false, 3))),
        (elem, acked, hex(e4)),
        // An empty map: the set alone, as nft sends it.
        (set, acked | NLM_F_EXCL, hex(&newset("x4", false, 4))),
    ];
    assert_eq!(got.len(), want.len() + 1); // then BATCH_END
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "message {i}");
    }
}

#[test]
fn the_batch_sends_chains_then_maps_then_rules() {
    let mut rs = tiny();
    rs.chains
        .push(regular("c1", vec![rule_(vec![], None, Accept)]));
    rs.chains[0]
        .rules
        .insert(0, rule_(vec![], None, SourceMap("m".into())));
    rs.maps
        .push(map("m", Family::V4, &[("10.0.0.1", "10.0.0.1", "c1")]));
    validate(&rs).unwrap();
    let b = replace_batch(&rs, &HashMap::new(), 1);
    let kinds: Vec<_> = messages(&b.buf).map(|m| m.unwrap().kind).collect();
    let k = |x: &[u8]| x.iter().map(|&x| nft_type(x)).collect::<Vec<_>>();
    let mut want = vec![NFNL_MSG_BATCH_BEGIN];
    want.extend(k(&[
        NFT_MSG_NEWTABLE,
        NFT_MSG_DELTABLE,
        NFT_MSG_NEWTABLE,
        NFT_MSG_NEWOBJ,
    ]));
    want.extend(k(&[
        NFT_MSG_NEWCHAIN,
        NFT_MSG_NEWCHAIN,
        NFT_MSG_NEWSET,
        NFT_MSG_NEWSETELEM,
    ]));
    want.extend(k(&[NFT_MSG_NEWRULE, NFT_MSG_NEWRULE, NFT_MSG_NEWRULE]));
    want.push(NFNL_MSG_BATCH_END);
    assert_eq!(kinds, want);
    assert_eq!(
        &b.what()[5..8],
        [
            "add chain c1",
            "add map m",
            "add elements 0.0.0.0 to 10.0.0.2 of map m"
        ]
    );
    assert_eq!(b.what()[9], "add rule 2 of chain input (d)");
}

/// An element's key and whether it is an interval's end.
type Key = (Vec<u8>, bool);

/// Each `NEWSETELEM` of `rs`'s batch: (its `what`, the keys of its elements, its
/// elements nest's length, the elements' nest numbers).
fn element_messages(rs: &Ruleset) -> Vec<(String, Vec<Key>, usize, Vec<u16>)> {
    let b = replace_batch(rs, &HashMap::new(), 1);
    let mut out = Vec::new();
    for (i, m) in messages(&b.buf).skip(1).enumerate() {
        let m = m.unwrap();
        if m.kind != nft_type(NFT_MSG_NEWSETELEM) {
            continue;
        }
        let (_, list) = attrs(&m.payload[4..])
            .find(|(k, _)| *k == NFTA_SET_ELEM_LIST_ELEMENTS)
            .unwrap();
        let mut keys = Vec::new();
        let mut numbers = Vec::new();
        let mut at = list;
        while at.len() >= 4 {
            numbers.push(u16::from_ne_bytes([at[2], at[3]]) & 0x3fff);
            at = &at[usize::from(u16::from_ne_bytes([at[0], at[1]])).next_multiple_of(4)..];
        }
        for (_, e) in attrs(list) {
            let mut key = None;
            let mut end = false;
            for (k, d) in attrs(e) {
                match k {
                    NFTA_SET_ELEM_KEY => key = attrs(d).next().map(|(_, v)| v.to_vec()),
                    NFTA_SET_ELEM_FLAGS => end = d == NFT_SET_ELEM_INTERVAL_END.to_be_bytes(),
                    _ => {}
                }
            }
            keys.push((key.unwrap(), end));
        }
        out.push((b.what()[i].clone(), keys, list.len() + 4, numbers));
    }
    out
}

#[test]
fn a_large_map_is_split_into_messages_each_nest_well_within_its_u16_length() {
    let chains = vec![regular("client-with-a-long-name", vec![])];
    for (family, n) in [(Family::V6, 2000), (Family::V4, 500)] {
        // Ranges two addresses long with a gap of two after each.
        let addr = |i: u128| match family {
            Family::V4 => IpAddr::from(std::net::Ipv4Addr::from((10u32 << 24) + i as u32)),
            Family::V6 => IpAddr::from(std::net::Ipv6Addr::from((0xfd00u128 << 112) + i)),
        };
        let elements = (0..n as u128)
            .map(|i| crate::firewall::rules::MapElement {
                first: addr(4 * i),
                last: addr(4 * i + 1),
                chain: chains[0].name.clone(),
            })
            .collect();
        let rs = Ruleset {
            table: "t".into(),
            counters: vec![],
            chains: chains.clone(),
            maps: vec![VerdictMap {
                name: "clients".into(),
                family,
                elements,
            }],
        };
        validate(&rs).unwrap();
        let msgs = element_messages(&rs);
        if family == Family::V6 {
            assert!(msgs.len() > 3, "{}", msgs.len());
        }
        let key = |a: IpAddr| match a {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let mut keys = Vec::new();
        for (what, k, nest_len, numbers) in &msgs {
            assert!(*nest_len <= SETELEM_NEST_BUDGET + 512, "{nest_len}");
            assert_eq!(*numbers, (1..=k.len() as u16).collect::<Vec<_>>());
            let (first, last) = (&k[0].0, &k[k.len() - 1].0);
            let (first, last) = match family {
                Family::V4 => (
                    IpAddr::from(<[u8; 4]>::try_from(&first[..]).unwrap()),
                    IpAddr::from(<[u8; 4]>::try_from(&last[..]).unwrap()),
                ),
                Family::V6 => (
                    IpAddr::from(<[u8; 16]>::try_from(&first[..]).unwrap()),
                    IpAddr::from(<[u8; 16]>::try_from(&last[..]).unwrap()),
                ),
            };
            assert_eq!(
                *what,
                format!("add elements {first} to {last} of map clients")
            );
            keys.extend(k.iter().cloned());
        }
        // All of them, in order: the gap from 0 (the first range starts later), then
        // each range's start and the gap after it.
        let mut want = vec![(vec![0; key(addr(0)).len()], true)];
        for i in 0..n as u128 {
            want.push((key(addr(4 * i)), false));
            want.push((key(addr(4 * i + 2)), true));
        }
        assert_eq!(keys, want);
    }
}

#[test]
fn maps_jumps_and_lookups_the_kernel_would_refuse_are_refused() {
    let base = || {
        let mut rs = tiny();
        rs.chains.push(regular("c1", vec![]));
        rs.maps
            .push(map("m", Family::V4, &[("10.0.0.1", "10.0.0.1", "c1")]));
        rs
    };
    let refused = |rs: &Ruleset, why: &str| {
        let e = validate(rs).unwrap_err().to_string();
        assert!(e.contains(why), "{e} (wanted {why:?})");
    };
    assert!(validate(&base()).is_ok());
    let with_elements = |els: &[(&str, &str, &str)]| {
        let mut rs = base();
        rs.maps[0] = map("m", Family::V4, els);
        rs
    };
    refused(
        &with_elements(&[("10.0.0.2", "10.0.0.1", "c1")]),
        "first after last",
    );
    let touching = [
        ("10.0.0.0", "10.0.0.1", "c1"),
        ("10.0.0.2", "10.0.0.3", "c1"),
    ];
    assert!(validate(&with_elements(&touching)).is_ok());
    let overlap = [
        ("10.0.0.0", "10.0.0.2", "c1"),
        ("10.0.0.2", "10.0.0.3", "c1"),
    ];
    refused(&with_elements(&overlap), "overlaps");
    let unsorted = [
        ("10.0.0.4", "10.0.0.5", "c1"),
        ("10.0.0.0", "10.0.0.1", "c1"),
    ];
    refused(&with_elements(&unsorted), "overlaps or comes before");
    refused(
        &with_elements(&[("fd00::1", "fd00::1", "c1")]),
        "not of the map's family",
    );
    refused(
        &with_elements(&[("10.0.0.1", "fd00::1", "c1")]),
        "not of the map's family",
    );
    refused(
        &with_elements(&[("10.0.0.1", "10.0.0.1", "c9")]),
        "no chain \"c9\"",
    );
    refused(
        &with_elements(&[("10.0.0.1", "10.0.0.1", "input")]),
        "is a base chain",
    );
    let mut rs = base();
    rs.maps[0].name = "m\0".into();
    refused(&rs, "map name");
    let with_action = |a: Action| {
        let mut rs = base();
        rs.chains[0].rules[0].action = a;
        rs
    };
    assert!(validate(&with_action(Jump("c1".into()))).is_ok());
    assert!(validate(&with_action(SourceMap("m".into()))).is_ok());
    refused(&with_action(Jump("nope".into())), "no chain \"nope\"");
    refused(&with_action(Jump("input".into())), "is a base chain");
    refused(
        &with_action(SourceMap("nope".into())),
        "looks up map \"nope\"",
    );
}

#[test]
fn loops_deep_jumps_and_a_clamp_before_routing_are_refused() {
    let mut rs = tiny();
    rs.chains
        .push(regular("a", vec![rule_(vec![], None, Jump("b".into()))]));
    rs.chains
        .push(regular("b", vec![rule_(vec![], None, ClampMss)]));
    rs.maps
        .push(map("m", Family::V4, &[("10.0.0.1", "10.0.0.1", "a")]));
    // Not reached from a base chain: the kernel takes it, and so do we.
    assert!(validate(&rs).is_ok());
    // Reached from input (through the map, then a jump): no route yet for `rt mtu`.
    rs.chains[0].rules[0].action = SourceMap("m".into());
    let e = validate(&rs).unwrap_err().to_string();
    assert!(
        e.contains("chain \"b\" clamps the MSS") && e.contains("input -> a -> b"),
        "{e}"
    );
    let forward = filter(
        "fwd",
        Hook::Forward,
        PRIO_FILTER,
        vec![rule_(vec![], None, Jump("a".into()))],
    );
    rs.chains[0] = forward;
    assert!(validate(&rs).is_ok());
    // A loop.
    rs.chains[2]
        .rules
        .push(rule_(vec![], None, Jump("a".into())));
    let e = validate(&rs).unwrap_err().to_string();
    assert!(e.contains("jump loop: fwd -> a -> b -> a"), "{e}");
    // Sixteen jumps deep is one too many.
    let mut rs = tiny();
    rs.chains[0].rules[0].action = Jump("c1".into());
    for i in 1..=JUMP_STACK {
        let next = vec![rule_(vec![], None, Jump(format!("c{}", i + 1)))];
        let rules = if i < JUMP_STACK - 1 { next } else { vec![] };
        rs.chains.push(regular(&format!("c{i}"), rules));
    }
    assert!(validate(&rs).is_ok(), "{:?}", validate(&rs));
    let last = rs.chains.len() - 1;
    rs.chains[last - 1].rules = vec![rule_(vec![], None, Jump(format!("c{JUMP_STACK}")))];
    let e = validate(&rs).unwrap_err().to_string();
    assert!(e.contains("jumps nest deeper than the kernel's 16"), "{e}");
}
