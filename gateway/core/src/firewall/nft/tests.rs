//! Byte for byte: what each expression, message and batch must be, as nft 1.0 sends them
//! (the layouts are written little-endian, both our targets), and the readers of the
//! kernel's answers. `sys::nftables` installs the same rules in a network namespace and
//! reads them back with Debian's `nft`.

use super::*;
use crate::firewall::rules::{AddrType, ChainKind, CtStates};
use crate::firewall::rules::{PRIO_RAW, PRIO_SRCNAT};
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
