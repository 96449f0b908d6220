//! Reading and writing the configuration file: wg-quick-style INI for [`Config`].
//!
//! Accepted, as wg-quick does:
//! - sections `[Interface]`, `[Peer]` (any number) and our `[Gateway]`, names and keys
//!   matched case-insensitively;
//! - comments from `#` or `;` to the end of the line, blank lines, whitespace around
//!   keys, values and list items;
//! - `Address`, `AllowedIPs`, `UplinkAddress`, `Cores` and `TcpListen` as comma lists,
//!   repeatable (they add up; [`emit`] splits long lists over several lines);
//! - wg-quick-only keys of `[Interface]` that the appliance does not honour load with a
//!   [`Warning`] each ([`parse_with_warnings`]) saying what it does instead: `DNS`,
//!   `PreUp`, `PostUp`, `PreDown`, `PostDown`, `SaveConfig`, and `Table` when it is `auto`,
//!   `main` or a number (the gateway's routes go to the main table). `Table = off` ("add
//!   no routes") is refused: the gateway routes its peers' allowed IPs itself.
//!
//! Refused with an error naming file, line and key and saying what is allowed: unknown
//! sections and keys, a single-valued key given twice in one section, `[Interface]` or
//! `[Gateway]` given twice, a `[Peer]` without `PublicKey`, files over 1 MiB and lines
//! over 4096 characters.
//!
//! **Schema 2 on `#+` lines.** Firmware of configuration schema 1 (`core::bundle::COMPAT`
//! 1, before `Firewall`, `Masquerade` and `Enabled` existed) refuses unknown keys, and
//! after a rollback to it the file on perm must still load, with its `[Gateway]` settings
//! (init reads the uplink, its address and the interface name from it). So the file the
//! console saves ([`emit_compat`]) puts every setting schema 1 does not know on a line
//! that starts with `#+`, and a disabled peer entirely so: schema-1 firmware reads those
//! lines as comments and runs the same configuration without them ([`schema1_view`]: no
//! firewall settings, disabled peers left out), this parser reads `#+ Key = Value` as
//! `Key = Value`. A `#+` line that is neither a `[Section]` header nor `Key = Value` is a
//! comment; a section whose header is on a `#+` line must have all its lines on `#+`
//! lines (else schema-1 firmware would read them into the section above).
//! [`parse_as_schema1`] reads a file as schema-1 firmware does, for tests and for saying
//! what a rollback would run.
//!
//! `AllowedIPs` are stored masked (`10.0.0.1/24` becomes `10.0.0.0/24`, as the kernel and
//! `wg showconf` have them); `Address`/`UplinkAddress` keep their host bits.
//!
//! [`emit`] writes the canonical form (`[Gateway]` keys only where they differ from the
//! defaults) which [`parse`] reads back to an equal `Config`; [`emit_compat`] the same
//! with the schema-2 settings on `#+` lines (identical to [`emit`] when there are none).
//!
//! Owns: the one reader, its two emitters and their round-trip tests. Invariant: what
//! either emitter writes, [`parse`] reads back to an equal `Config`.

use std::fmt::Write as _;

use crate::config::{Config, Endpoint, GatewayConfig, OffloadMode, PeerConfig};
use crate::key::Key;
use crate::net::Cidr;

/// Largest configuration file accepted.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Longest line accepted, in characters.
pub const MAX_LINE_CHARS: usize = 4096;
use crate::value::{self, BadValue};
/// The values' grammar is `crate::value`'s (shared with the console); `Cores` is also
/// the daemon's `--cores`.
pub use crate::value::{cores, MAX_CORE};

/// A config file error: which file, line and key, and what is allowed there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    pub key: String,
    pub msg: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}: {}", self.file, self.line, self.key, self.msg)
    }
}

impl std::error::Error for ConfigError {}

/// A line that loads but is not honoured (a wg-quick key the appliance has no use for):
/// which file, line and key, and what the appliance does instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub file: String,
    /// 1-based.
    pub line: usize,
    pub key: String,
    pub msg: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}: {}", self.file, self.line, self.key, self.msg)
    }
}

/// What a wg-quick-only `[Interface]` key does here: `Ok(Some(msg))` loads with a
/// warning, `Err(msg)` refuses the file; `None` when `lk` is not such a key.
fn wg_quick_only(lk: &str, v: &str) -> Option<Result<String, String>> {
    const SCRIPTS: &str = "ignored: the appliance runs no shell commands; its firewall and NAT are built in (`Firewall =`, `Masquerade =` in [Gateway])";
    Some(Ok(match lk {
        "dns" => "ignored on the appliance (its own resolver comes from the uplink's DHCP lease): set `ClientDns` in [Gateway] for the configurations `add client` prints".into(),
        "preup" | "postup" | "predown" | "postdown" => SCRIPTS.into(),
        "saveconfig" => "ignored: the console saves the configuration (`commit`)".into(),
        "table" => {
            let t = v.to_ascii_lowercase();
            if t == "off" {
                return Some(Err("`Table = off` (add no routes) is not supported: the gateway adds the routes to its peers' AllowedIPs itself, in the main table; remove the line (a prefix that must not be routed to a peer does not belong in its AllowedIPs)".into()));
            }
            if t != "auto" && t != "main" && number::<u32>(v, "").is_err() {
                return Some(Err(format!(
                    "expected auto, main, off or a routing table number, got {}",
                    shown(v)
                )));
            }
            format!(
                "`Table = {v}` ignored: the gateway adds the routes to its peers' AllowedIPs to the main table itself"
            )
        }
        _ => return None,
    }))
}

/// The configuration schema this firmware reads and writes (`core::bundle::COMPAT`).
pub const SCHEMA: u8 = 6;

/// The schema that added a key (lowercase), by section: 1 for the original keys. Older
/// firmware refuses a newer key, so [`emit_compat`] writes it on a line that firmware
/// reads as a comment ([`guard_prefix`]).
fn key_schema(section: Section, lk: &str) -> u8 {
    match (section, lk) {
        (Section::Gateway, "firewall" | "masquerade")
        | (Section::Peer, "masquerade" | "enabled") => 2,
        (Section::Gateway, "ntp" | "uplinkoverlap") => 3,
        (Section::Gateway, "sshkey" | "sshport") => 4,
        (Section::Gateway, "metrics" | "metricsport" | "syslog") => 5,
        (Section::Gateway, "clientisolation" | "dns" | "domain") | (Section::Peer, "access") => 6,
        _ => 1,
    }
}

/// The start of a line holding a setting of schema `n` (2: `#+ `, 3 and later: `#3+ `),
/// which firmware of a lower schema skips as a comment.
fn guard_prefix(n: u8) -> String {
    match n {
        0 | 1 => String::new(),
        2 => "#+ ".into(),
        n => format!("#{n}+ "),
    }
}

/// A guarded line's schema and the rest of it: `#+ X` is schema 2, `#3+ X` schema 3.
fn strip_guard(line: &str) -> Option<(u8, &str)> {
    let t = line.trim_start().strip_prefix('#')?;
    if let Some(rest) = t.strip_prefix('+') {
        return Some((2, rest));
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let rest = t[digits..].strip_prefix('+')?;
    let n: u8 = t[..digits].parse().ok().filter(|&n| n >= 3)?;
    Some((n, rest))
}

/// How a file is read: as firmware of this configuration schema does.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Reader(u8);

impl Reader {
    const CURRENT: Reader = Reader(SCHEMA);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    None,
    Interface,
    Peer,
    Gateway,
}

/// A `[Peer]` being read: its public key may come on any line of the section.
struct PeerDraft {
    line: usize,
    public_key: Option<Key>,
    preshared_key: Option<Key>,
    allowed_ips: Vec<Cidr>,
    endpoint: Option<Endpoint>,
    persistent_keepalive: Option<u16>,
    tcp_port: Option<u16>,
    name: Option<String>,
    masquerade: bool,
    enabled: bool,
    access: Option<Vec<crate::access::AccessItem>>,
}

const INTERFACE_KEYS: &str = "PrivateKey, ListenPort, FwMark, Address, MTU (and wg-quick's DNS, Table, PreUp, PostUp, PreDown, PostDown, SaveConfig, which are ignored with a warning)";
const PEER_KEYS: &str =
    "PublicKey, PresharedKey, AllowedIPs, Endpoint, PersistentKeepalive, TcpPort, Name, Masquerade, Enabled, Access";
const GATEWAY_KEYS: &str = "InterfaceName, Cores, IoUring, Poll, SqPoll, Offload, TunOffload, HugePages, Buffers, TcpListen, TcpFallback, BbrRttMs, Uplink, UplinkAddress, UplinkGateway, Lan, LanAddress, ProxyArp, PublicEndpoint, ClientDns, Firewall, Masquerade, Ntp, UplinkOverlap, SshKey, SshPort, Metrics, MetricsPort, Syslog, ClientIsolation, Dns, Domain";

/// Quote a user value for an error message, shortened so a huge line cannot flood a log.
fn shown(v: &str) -> String {
    let mut s: String = v.chars().take(64).collect();
    if v.chars().count() > 64 {
        s.push('…');
    }
    format!("`{s}`")
}

fn number<T: std::str::FromStr>(v: &str, what: &str) -> Result<T, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected {what}, got {}", shown(v)));
    }
    v.parse::<T>()
        .map_err(|_| format!("expected {what}, got {}", shown(v)))
}

/// Parse a configuration file. `file` is only used in error messages. Lines that load
/// but are not honoured are dropped: [`parse_with_warnings`] says which.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
    parse_with_warnings(file, text).map(|(c, _)| c)
}

/// [`parse`], and a [`Warning`] for each line that loaded but is not honoured (wg-quick's
/// `DNS`, `Table`, `PreUp`/`PostUp`/`PreDown`/`PostDown`, `SaveConfig`). The daemon logs
/// them at start and reload, the console shows them in `show` and at `commit` (which
/// writes the file without them).
pub fn parse_with_warnings(file: &str, text: &str) -> Result<(Config, Vec<Warning>), ConfigError> {
    read(file, text, Reader::CURRENT)
}

/// Read a file as firmware of configuration schema 1 (before `Firewall`, `Masquerade`
/// and `Enabled`) does: `#+` lines are comments, the keys schema 2 added are unknown
/// keys, wg-quick-only keys are dropped without a word. What a rollback to that firmware
/// would run; for the file [`emit_compat`] writes that is [`schema1_view`].
pub fn parse_as_schema1(file: &str, text: &str) -> Result<Config, ConfigError> {
    parse_as_schema(1, file, text)
}

/// Whether firmware of an earlier schema would refuse `text` (a key of a later schema
/// written on a plain line, by hand): the latest schema `n` whose firmware's predecessor
/// cannot load it, with its error ("firmware before schema `n`"), checked from the newest
/// earlier schema down.
pub fn earlier_refusal(file: &str, text: &str) -> Option<(u8, ConfigError)> {
    (1..SCHEMA)
        .rev()
        .find_map(|n| parse_as_schema(n, file, text).err().map(|e| (n + 1, e)))
}

/// Read a file as firmware of configuration schema `n` (1 to [`SCHEMA`]) does: lines
/// guarded for a later schema are comments, keys of a later schema unknown.
pub fn parse_as_schema(n: u8, file: &str, text: &str) -> Result<Config, ConfigError> {
    read(file, text, Reader(n.clamp(1, SCHEMA))).map(|(c, _)| c)
}

fn read(file: &str, text: &str, reader: Reader) -> Result<(Config, Vec<Warning>), ConfigError> {
    let err = |line: usize, key: &str, msg: String| ConfigError {
        file: file.to_string(),
        line,
        key: key.to_string(),
        msg,
    };
    // A section that may appear once: note its first line, refuse a second.
    let once = |seen: &mut Option<usize>, ln: usize, name: &str| match *seen {
        Some(first) => Err(err(
            ln,
            name,
            format!("appears twice (first on line {first}); merge them"),
        )),
        None => {
            *seen = Some(ln);
            Ok(())
        }
    };
    if text.len() > MAX_FILE_BYTES {
        return Err(err(
            0,
            "file",
            format!(
                "is {} bytes; at most {MAX_FILE_BYTES} are accepted",
                text.len()
            ),
        ));
    }

    let mut cfg = Config::default();
    let mut section = Section::None;
    let mut seen_interface: Option<usize> = None;
    let mut seen_gateway: Option<usize> = None;
    // Single-valued keys seen in the current section, with their line.
    let mut seen: Vec<(&'static str, usize)> = Vec::new();
    let mut peer: Option<PeerDraft> = None;
    // The current section's header is on a `#+` line: so must all its lines be.
    let mut guarded_section = false;
    let mut warnings: Vec<Warning> = Vec::new();

    let finish_peer = |d: PeerDraft, cfg: &mut Config| -> Result<(), ConfigError> {
        let public_key = d.public_key.ok_or_else(|| {
            err(
                d.line,
                "[Peer]",
                "has no PublicKey; every [Peer] needs `PublicKey = ...`".into(),
            )
        })?;
        cfg.peers.push(PeerConfig {
            public_key,
            preshared_key: d.preshared_key,
            allowed_ips: d.allowed_ips,
            endpoint: d.endpoint,
            persistent_keepalive: d.persistent_keepalive,
            tcp_port: d.tcp_port,
            name: d.name,
            masquerade: d.masquerade,
            enabled: d.enabled,
            access: d.access,
        });
        Ok(())
    };

    for (i, raw) in text.split('\n').enumerate() {
        let ln = i + 1;
        if raw.len() > MAX_LINE_CHARS && raw.chars().count() > MAX_LINE_CHARS {
            return Err(err(
                ln,
                "line",
                format!("is longer than {MAX_LINE_CHARS} characters"),
            ));
        }
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        // `#+ Key = Value` (`#3+ ...`): a line of schema 2 (3) that firmware of an earlier
        // schema skips as a comment.
        let (line, guarded) = match strip_guard(line) {
            Some((n, rest)) if Reader(n) <= reader => (rest, true),
            _ => (line, false),
        };
        let line = match line.find(['#', ';']) {
            Some(p) => &line[..p],
            None => line,
        };
        let line = line.trim();
        if line.is_empty() || (guarded && !line.starts_with('[') && !line.contains('=')) {
            continue;
        }

        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.strip_suffix(']').ok_or_else(|| {
                err(
                    ln,
                    line,
                    "a section header must look like `[Interface]`, `[Peer]` or `[Gateway]`".into(),
                )
            })?;
            if let Some(d) = peer.take() {
                finish_peer(d, &mut cfg)?;
            }
            seen.clear();
            guarded_section = guarded;
            section = match name.trim().to_ascii_lowercase().as_str() {
                "interface" => {
                    once(&mut seen_interface, ln, "[Interface]")?;
                    Section::Interface
                }
                "gateway" => {
                    once(&mut seen_gateway, ln, "[Gateway]")?;
                    Section::Gateway
                }
                "peer" => {
                    peer = Some(PeerDraft {
                        line: ln,
                        public_key: None,
                        preshared_key: None,
                        allowed_ips: Vec::new(),
                        endpoint: None,
                        persistent_keepalive: None,
                        tcp_port: None,
                        name: None,
                        masquerade: true,
                        enabled: true,
                        access: None,
                    });
                    Section::Peer
                }
                _ => {
                    return Err(err(
                        ln,
                        &format!("[{}]", name.trim()),
                        "unknown section; allowed are [Interface], [Peer] and [Gateway]".into(),
                    ))
                }
            };
            continue;
        }

        let (k, v) = line.split_once('=').ok_or_else(|| {
            err(
                ln,
                &shown(line),
                "expected `Key = Value` or a `[Section]` header".into(),
            )
        })?;
        let k = k.trim();
        let v = v.trim();
        let lk = k.to_ascii_lowercase();
        let e = |msg: String| err(ln, k, msg);
        let bad = |b: BadValue| err(ln, k, b.to_string());
        if guarded_section && !guarded {
            return Err(e(
                "is on a plain line in a section whose header is on a `#+` line: firmware before schema 2 would read it into the section above; start it with `#+` too".into(),
            ));
        }
        if Reader(key_schema(section, &lk)) > reader {
            return Err(e(format!(
                "unknown key (this firmware reads configuration schema {})",
                reader.0
            )));
        }

        // Keys that may be given once per section, by canonical name; list keys and the
        // ignored wg-quick keys are not in here.
        let single: Option<&'static str> = match (section, lk.as_str()) {
            (Section::Interface, "privatekey") => Some("PrivateKey"),
            (Section::Interface, "listenport") => Some("ListenPort"),
            (Section::Interface, "fwmark") => Some("FwMark"),
            (Section::Interface, "mtu") => Some("MTU"),
            (Section::Peer, "publickey") => Some("PublicKey"),
            (Section::Peer, "presharedkey") => Some("PresharedKey"),
            (Section::Peer, "endpoint") => Some("Endpoint"),
            (Section::Peer, "persistentkeepalive") => Some("PersistentKeepalive"),
            (Section::Peer, "tcpport") => Some("TcpPort"),
            (Section::Peer, "name") => Some("Name"),
            (Section::Peer, "masquerade") => Some("Masquerade"),
            (Section::Peer, "enabled") => Some("Enabled"),
            (Section::Peer, "access") => Some("Access"),
            (Section::Gateway, "clientisolation") => Some("ClientIsolation"),
            (Section::Gateway, "domain") => Some("Domain"),
            (Section::Gateway, "firewall") => Some("Firewall"),
            (Section::Gateway, "masquerade") => Some("Masquerade"),
            (Section::Gateway, "uplinkoverlap") => Some("UplinkOverlap"),
            (Section::Gateway, "interfacename") => Some("InterfaceName"),
            (Section::Gateway, "iouring") => Some("IoUring"),
            (Section::Gateway, "poll") => Some("Poll"),
            (Section::Gateway, "sqpoll") => Some("SqPoll"),
            (Section::Gateway, "offload") => Some("Offload"),
            (Section::Gateway, "tunoffload") => Some("TunOffload"),
            (Section::Gateway, "hugepages") => Some("HugePages"),
            (Section::Gateway, "buffers") => Some("Buffers"),
            (Section::Gateway, "tcpfallback") => Some("TcpFallback"),
            (Section::Gateway, "bbrrttms") => Some("BbrRttMs"),
            (Section::Gateway, "uplink") => Some("Uplink"),
            (Section::Gateway, "uplinkgateway") => Some("UplinkGateway"),
            (Section::Gateway, "lan") => Some("Lan"),
            (Section::Gateway, "proxyarp") => Some("ProxyArp"),
            (Section::Gateway, "publicendpoint") => Some("PublicEndpoint"),
            _ => None,
        };
        if let Some(name) = single {
            if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
                return Err(e(format!(
                    "is given twice in this section (first on line {first})"
                )));
            }
            seen.push((name, ln));
        }

        match section {
            Section::None => {
                return Err(e(
                    "comes before any section; put it under [Interface], [Peer] or [Gateway]"
                        .into(),
                ))
            }
            Section::Interface => {
                let ic = &mut cfg.interface;
                match lk.as_str() {
                    "privatekey" => ic.private_key = Some(value::key(v).map_err(bad)?),
                    "listenport" => ic.listen_port = Some(value::port(v).map_err(bad)?),
                    "fwmark" => ic.fwmark = value::fwmark(v).map_err(bad)?,
                    "address" => ic.addresses.extend(value::cidrs(v).map_err(bad)?),
                    "mtu" => ic.mtu = Some(value::mtu(v).map_err(bad)?),
                    // wg-quick-only: see the module comment.
                    other => match wg_quick_only(other, v) {
                        // Schema-1 firmware dropped them without a word, `Table = off` too.
                        Some(_) if reader == Reader(1) => {}
                        Some(Ok(msg)) => warnings.push(Warning {
                            file: file.to_string(),
                            line: ln,
                            key: k.to_string(),
                            msg,
                        }),
                        Some(Err(msg)) => return Err(e(msg)),
                        None => {
                            return Err(e(format!(
                                "unknown key in [Interface]; allowed are {INTERFACE_KEYS}"
                            )))
                        }
                    },
                }
            }
            Section::Peer => {
                // A `[Peer]` header always creates the draft before this arm is reachable.
                let Some(d) = peer.as_mut() else {
                    return Err(e("internal: [Peer] state missing".into()));
                };
                match lk.as_str() {
                    "publickey" => d.public_key = Some(value::key(v).map_err(bad)?),
                    "presharedkey" => d.preshared_key = value::preshared_key(v).map_err(bad)?,
                    "allowedips" => d.allowed_ips.extend(value::prefixes(v).map_err(bad)?),
                    "endpoint" => d.endpoint = Some(value::endpoint(v).map_err(bad)?),
                    "persistentkeepalive" => {
                        d.persistent_keepalive = value::keepalive(v).map_err(bad)?
                    }
                    "tcpport" => d.tcp_port = Some(value::port(v).map_err(bad)?),
                    "name" => d.name = Some(value::peer_name(v).map_err(bad)?),
                    "masquerade" => d.masquerade = value::boolean(v).map_err(bad)?,
                    "enabled" => d.enabled = value::boolean(v).map_err(bad)?,
                    "access" => d.access = Some(value::access(v).map_err(bad)?),
                    _ => return Err(e(format!("unknown key in [Peer]; allowed are {PEER_KEYS}"))),
                }
            }
            Section::Gateway => {
                let g = &mut cfg.gateway;
                match lk.as_str() {
                    "interfacename" => g.interface_name = value::ifname(v).map_err(bad)?,
                    "cores" => extend_once(&mut g.cores, value::cores(v).map_err(bad)?, "core ")
                        .map_err(e)?,
                    "iouring" => g.io_uring = value::boolean(v).map_err(bad)?,
                    "sqpoll" => g.sqpoll = value::boolean(v).map_err(bad)?,
                    "poll" => g.poll = value::poll(v).map_err(bad)?,
                    "offload" => g.offload = value::offload(v).map_err(bad)?,
                    "tunoffload" => g.tun_offload = value::boolean(v).map_err(bad)?,
                    "hugepages" => g.hugepages = value::boolean(v).map_err(bad)?,
                    "buffers" => g.buffers = value::buffers(v).map_err(bad)?,
                    "tcplisten" => {
                        let ports = value::tcp_listen(v).map_err(bad)?;
                        extend_once(&mut g.tcp_listen, ports, "port ").map_err(e)?
                    }
                    "tcpfallback" => g.tcp_fallback = value::boolean(v).map_err(bad)?,
                    "bbrrttms" => g.bbr_rtt_ms = value::bbr_rtt_ms(v).map_err(bad)?,
                    "uplink" => {
                        g.uplink = if v.is_empty() {
                            String::new()
                        } else {
                            value::ifname(v).map_err(bad)?
                        }
                    }
                    "uplinkaddress" => g.uplink_addresses.extend(value::cidrs(v).map_err(bad)?),
                    "uplinkgateway" => {
                        g.uplink_gateway = if v.is_empty() {
                            None
                        } else {
                            Some(value::ip(v).map_err(bad)?)
                        }
                    }
                    "lan" => {
                        g.lan = if v.is_empty() {
                            String::new()
                        } else {
                            value::ifname(v).map_err(bad)?
                        }
                    }
                    "lanaddress" => g.lan_addresses.extend(value::cidrs(v).map_err(bad)?),
                    "proxyarp" => g.proxy_arp = value::boolean(v).map_err(bad)?,
                    "firewall" => g.firewall = value::boolean(v).map_err(bad)?,
                    "masquerade" => g.masquerade = value::masquerade(v).map_err(bad)?,
                    "publicendpoint" => {
                        g.public_endpoint = if v.is_empty() {
                            None
                        } else {
                            Some(value::endpoint(v).map_err(bad)?)
                        }
                    }
                    "clientdns" => extend_once(&mut g.client_dns, value::ips(v).map_err(bad)?, "")
                        .map_err(e)?,
                    "ntp" => {
                        let servers = value::ntp_servers(v).map_err(bad)?;
                        extend_once(&mut g.ntp, servers, "").map_err(e)?
                    }
                    "uplinkoverlap" => g.uplink_overlap = value::uplink_overlap(v).map_err(bad)?,
                    "sshkey" => {
                        let k = value::ssh_key(v).map_err(bad)?;
                        if g.ssh_keys.iter().any(|o| o.name == k.name) {
                            return Err(e(format!("SSH key {} is given twice", k.name)));
                        }
                        if let Some(o) = g.ssh_keys.iter().find(|o| o.key.blob() == k.key.blob()) {
                            return Err(e(format!(
                                "SSH key {} is the same key as {} (one key, one name: sessions are told apart by it)",
                                k.name, o.name
                            )));
                        }
                        g.ssh_keys.push(k)
                    }
                    "sshport" => g.ssh_port = value::port(v).map_err(bad)?,
                    "metrics" => g.metrics = value::boolean(v).map_err(bad)?,
                    "metricsport" => g.metrics_port = value::port(v).map_err(bad)?,
                    "syslog" => {
                        g.syslog = if v.is_empty() {
                            None
                        } else {
                            Some(value::syslog(v).map_err(bad)?)
                        }
                    }
                    "clientisolation" => g.client_isolation = value::boolean(v).map_err(bad)?,
                    "dns" => extend_once(&mut g.dns, value::ips(v).map_err(bad)?, "").map_err(e)?,
                    "domain" => {
                        g.domain = if v.is_empty() {
                            None
                        } else {
                            Some(value::domain(v).map_err(bad)?)
                        }
                    }
                    _ => {
                        return Err(e(format!(
                            "unknown key in [Gateway]; allowed are {GATEWAY_KEYS}"
                        )))
                    }
                }
            }
        }
    }
    if let Some(d) = peer.take() {
        finish_peer(d, &mut cfg)?;
    }
    Ok((cfg, warnings))
}

/// Append a list key's values to what earlier lines of the key gave (the list keys add
/// up); a value already there is refused, as `core::value` refuses it within one line.
fn extend_once<T: PartialEq + std::fmt::Display>(
    list: &mut Vec<T>,
    items: Vec<T>,
    what: &str,
) -> Result<(), String> {
    for x in items {
        if list.contains(&x) {
            return Err(format!("{what}{x} is listed twice"));
        }
        list.push(x);
    }
    Ok(())
}

/// Write `Key = a, b, ...` lines for a list, starting a new line (the list keys add up)
/// before one grows past about 1000 characters, well inside [`MAX_LINE_CHARS`].
fn list_lines<T: std::fmt::Display>(out: &mut String, key: &str, v: &[T]) {
    let mut line = String::new();
    for x in v {
        let item = x.to_string();
        if !line.is_empty() && line.len() + item.len() > 1000 {
            let _ = writeln!(out, "{key} = {line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push_str(", ");
        }
        line.push_str(&item);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{key} = {line}");
    }
}

fn on_off_str(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Write the canonical file for `cfg`: every key in plain form. What the console shows.
pub fn emit(cfg: &Config) -> String {
    emit_with(cfg, false)
}

/// The first lines of a file [`emit_compat`] writes with `#+` lines in it.
pub const COMPAT_NOTE: &str = "# Lines starting with #+ hold settings of configuration schema 2 (Firewall, Masquerade, Enabled),\n\
# lines starting with #3+ those of schema 3 (Ntp, UplinkOverlap), #4+ those of schema 4 (SshKey,\n\
# SshPort), #5+ those of schema 5 (Metrics, MetricsPort, Syslog), #6+ those of schema 6\n\
# (ClientIsolation, Dns, Domain, and a peer with an Access of its own, whole): older firmware reads\n\
# them as comments, so after a rollback it runs this file without them.\n";

/// The file the console saves: [`emit`], with every setting schema-1 firmware does not
/// know on a `#+` line and a disabled peer's whole section on `#+` lines (see the module
/// comment). Byte for byte [`emit`] when `cfg` uses none of them.
pub fn emit_compat(cfg: &Config) -> String {
    emit_with(cfg, true)
}

/// What schema-1 firmware runs from the file [`emit_compat`] writes for `cfg`: disabled
/// peers left out, the schema-2 settings at their defaults (and without effect there:
/// that firmware has no firewall and no NAT).
pub fn schema1_view(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    c.peers.retain(|p| p.enabled);
    for p in &mut c.peers {
        p.masquerade = true;
    }
    let d = GatewayConfig::default();
    c.gateway.firewall = d.firewall;
    c.gateway.masquerade = d.masquerade;
    schema2_view(&c)
}

/// What schema-2 firmware runs from the file [`emit_compat`] writes for `cfg`: the
/// schema-3 settings at their defaults (that firmware sets no clock and checks no lease
/// against the tunnel's routes).
pub fn schema2_view(cfg: &Config) -> Config {
    let mut c = schema3_view(cfg);
    let d = GatewayConfig::default();
    c.gateway.ntp = d.ntp;
    c.gateway.uplink_overlap = d.uplink_overlap;
    c
}

/// What schema-3 firmware runs from the file [`emit_compat`] writes for `cfg`: no SSH
/// keys and the default port (that firmware has no SSH server: nothing listens).
pub fn schema3_view(cfg: &Config) -> Config {
    let mut c = schema4_view(cfg);
    let d = GatewayConfig::default();
    c.gateway.ssh_keys = d.ssh_keys;
    c.gateway.ssh_port = d.ssh_port;
    c
}

/// What schema-4 firmware runs from the file [`emit_compat`] writes for `cfg`: no metrics
/// endpoint and no remote syslog (that firmware has neither: less is reported, nothing is
/// opened — a rollback never serves more than the file asks for).
pub fn schema4_view(cfg: &Config) -> Config {
    let mut c = schema5_view(cfg);
    let d = GatewayConfig::default();
    c.gateway.metrics = d.metrics;
    c.gateway.metrics_port = d.metrics_port;
    c.gateway.syslog = d.syslog;
    c
}

/// What schema-5 firmware runs from the file [`emit_compat`] writes for `cfg`: no peer
/// with an `Access` of its own (its whole section is on `#6+` lines: that firmware would
/// run it unrestricted, so it does not run it at all), no client isolation (its clients
/// reach each other: the one protection a rollback loses, README), no resolver settings
/// (that firmware has no resolver).
pub fn schema5_view(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    c.peers.retain(|p| p.access.is_none());
    let d = GatewayConfig::default();
    c.gateway.client_isolation = d.client_isolation;
    c.gateway.dns = d.dns;
    c.gateway.domain = d.domain;
    c
}

/// The settings of schema 2 and later in `cfg`, which schema-1 firmware would not run,
/// for the user (`Firewall = off`, `client laptop disabled (left out)`, `Ntp = ...`);
/// empty when there are none.
pub fn schema2_settings(cfg: &Config) -> Vec<String> {
    let d = GatewayConfig::default();
    let mut out = Vec::new();
    if cfg.gateway.firewall != d.firewall {
        out.push(format!("Firewall = {}", on_off_str(cfg.gateway.firewall)));
    }
    if cfg.gateway.masquerade != d.masquerade {
        out.push(format!("Masquerade = {}", cfg.gateway.masquerade.as_str()));
    }
    if !cfg.gateway.ntp.is_empty() {
        let l: Vec<String> = cfg.gateway.ntp.iter().map(ToString::to_string).collect();
        out.push(format!("Ntp = {}", l.join(", ")));
    }
    if cfg.gateway.uplink_overlap != d.uplink_overlap {
        out.push(format!(
            "UplinkOverlap = {}",
            cfg.gateway.uplink_overlap.as_str()
        ));
    }
    for k in &cfg.gateway.ssh_keys {
        out.push(format!("SshKey {} (no SSH server there)", k.name));
    }
    if cfg.gateway.ssh_port != d.ssh_port {
        out.push(format!("SshPort = {}", cfg.gateway.ssh_port));
    }
    if cfg.gateway.metrics {
        out.push("Metrics = on (no metrics endpoint there)".into());
    }
    if cfg.gateway.metrics_port != d.metrics_port {
        out.push(format!("MetricsPort = {}", cfg.gateway.metrics_port));
    }
    if let Some(t) = &cfg.gateway.syslog {
        out.push(format!("Syslog = {t} (no remote syslog there)"));
    }
    if cfg.gateway.client_isolation {
        out.push("ClientIsolation = on (clients reach each other there)".into());
    }
    if !cfg.gateway.dns.is_empty() || cfg.gateway.domain.is_some() {
        out.push("Dns, Domain (no resolver on the box there)".into());
    }
    for p in &cfg.peers {
        let who = match &p.name {
            Some(n) => format!("peer {n}"),
            None => format!("peer {}", p.public_key.to_base64()),
        };
        if p.access.is_some() {
            out.push(format!(
                "{who} with Access (left out: it would run unrestricted there)"
            ));
        } else if !p.enabled {
            out.push(format!("{who} disabled (left out)"));
        } else if !p.masquerade {
            out.push(format!("{who} Masquerade = off"));
        }
    }
    out
}

/// [`emit`] (`guard` false) or [`emit_compat`] (`guard` true).
fn emit_with(cfg: &Config, guard: bool) -> String {
    let mut s = String::new();
    // Whether a `#+` line was written (then the file starts with COMPAT_NOTE).
    let mut guarded = false;
    let ic = &cfg.interface;
    s.push_str("[Interface]\n");
    if let Some(k) = &ic.private_key {
        let _ = writeln!(s, "PrivateKey = {}", k.to_base64());
    }
    if let Some(p) = ic.listen_port {
        let _ = writeln!(s, "ListenPort = {p}");
    }
    if let Some(m) = ic.fwmark {
        let _ = writeln!(s, "FwMark = {m:#x}");
    }
    list_lines(&mut s, "Address", &ic.addresses);
    if let Some(m) = ic.mtu {
        let _ = writeln!(s, "MTU = {m}");
    }
    // The prefix of a schema-2 key's line outside a hidden section.
    let new = if guard { "#+ " } else { "" };
    for p in &cfg.peers {
        // A disabled peer: the whole section on `#+` lines, so schema 1 leaves it out; a
        // peer with an `Access` of its own on `#6+` lines, so no firmware before schema 6
        // runs it (unrestricted).
        let hide_as = match (&p.access, p.enabled) {
            (Some(_), _) => Some(6),
            (None, false) => Some(2),
            (None, true) => None,
        };
        let hide = guard && hide_as.is_some();
        let mut ps = String::new();
        let _ = writeln!(ps, "[Peer]\nPublicKey = {}", p.public_key.to_base64());
        if let Some(k) = &p.preshared_key {
            let _ = writeln!(ps, "PresharedKey = {}", k.to_base64());
        }
        list_lines(&mut ps, "AllowedIPs", &p.allowed_ips);
        if let Some(e) = &p.endpoint {
            let _ = writeln!(ps, "Endpoint = {e}");
        }
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(ps, "PersistentKeepalive = {k}");
        }
        if let Some(t) = p.tcp_port {
            let _ = writeln!(ps, "TcpPort = {t}");
        }
        if let Some(n) = &p.name {
            let _ = writeln!(ps, "Name = {n}");
        }
        if !p.masquerade {
            let _ = writeln!(ps, "{}Masquerade = off", if hide { "" } else { new });
            guarded |= guard;
        }
        if !p.enabled {
            // With `guard`, only inside a hidden section.
            ps.push_str("Enabled = off\n");
        }
        if let Some(a) = &p.access {
            // With `guard`, only inside a hidden section.
            let _ = writeln!(ps, "Access = {}", crate::access::list_text(a));
        }
        s.push('\n');
        if hide {
            guarded = true;
            let prefix = guard_prefix(hide_as.unwrap_or(2));
            for l in ps.lines() {
                let _ = writeln!(s, "{prefix}{l}");
            }
        } else {
            s.push_str(&ps);
        }
    }
    let g = &cfg.gateway;
    let d = GatewayConfig::default();
    let mut gs = String::new();
    if g.interface_name != d.interface_name {
        let _ = writeln!(gs, "InterfaceName = {}", g.interface_name);
    }
    list_lines(&mut gs, "Cores", &g.cores);
    if g.io_uring != d.io_uring {
        let _ = writeln!(gs, "IoUring = {}", on_off_str(g.io_uring));
    }
    if g.sqpoll != d.sqpoll {
        let _ = writeln!(gs, "SqPoll = {}", on_off_str(g.sqpoll));
    }
    if g.poll != d.poll {
        let _ = writeln!(gs, "Poll = {}", g.poll.as_str());
    }
    if g.offload != d.offload {
        let o = match g.offload {
            OffloadMode::Auto => "auto",
            OffloadMode::Gso => "gso",
            OffloadMode::Mmsg => "mmsg",
            OffloadMode::Off => "off",
        };
        let _ = writeln!(gs, "Offload = {o}");
    }
    if g.tun_offload != d.tun_offload {
        let _ = writeln!(gs, "TunOffload = {}", on_off_str(g.tun_offload));
    }
    if g.hugepages != d.hugepages {
        let _ = writeln!(gs, "HugePages = {}", on_off_str(g.hugepages));
    }
    if g.buffers != d.buffers {
        let _ = writeln!(gs, "Buffers = {}", g.buffers);
    }
    list_lines(&mut gs, "TcpListen", &g.tcp_listen);
    if g.tcp_fallback != d.tcp_fallback {
        let _ = writeln!(gs, "TcpFallback = {}", on_off_str(g.tcp_fallback));
    }
    if g.bbr_rtt_ms != d.bbr_rtt_ms {
        let _ = writeln!(gs, "BbrRttMs = {}", g.bbr_rtt_ms);
    }
    if g.uplink != d.uplink {
        let _ = writeln!(gs, "Uplink = {}", g.uplink);
    }
    list_lines(&mut gs, "UplinkAddress", &g.uplink_addresses);
    if let Some(gw) = g.uplink_gateway {
        let _ = writeln!(gs, "UplinkGateway = {gw}");
    }
    if g.lan != d.lan {
        let _ = writeln!(gs, "Lan = {}", g.lan);
    }
    list_lines(&mut gs, "LanAddress", &g.lan_addresses);
    if g.proxy_arp != d.proxy_arp {
        let _ = writeln!(gs, "ProxyArp = {}", on_off_str(g.proxy_arp));
    }
    if let Some(e) = &g.public_endpoint {
        let _ = writeln!(gs, "PublicEndpoint = {e}");
    }
    list_lines(&mut gs, "ClientDns", &g.client_dns);
    if g.firewall != d.firewall {
        let _ = writeln!(gs, "{new}Firewall = {}", on_off_str(g.firewall));
        guarded |= guard;
    }
    if g.masquerade != d.masquerade {
        let _ = writeln!(gs, "{new}Masquerade = {}", g.masquerade.as_str());
        guarded |= guard;
    }
    // Schema 3.
    let new3 = if guard {
        guard_prefix(3)
    } else {
        String::new()
    };
    let mut s3 = String::new();
    list_lines(&mut s3, "Ntp", &g.ntp);
    if g.uplink_overlap != d.uplink_overlap {
        let _ = writeln!(s3, "UplinkOverlap = {}", g.uplink_overlap.as_str());
    }
    for l in s3.lines() {
        let _ = writeln!(gs, "{new3}{l}");
        guarded |= guard;
    }
    // Schema 4.
    let new4 = if guard {
        guard_prefix(4)
    } else {
        String::new()
    };
    let mut s4 = String::new();
    for k in &g.ssh_keys {
        let _ = writeln!(s4, "SshKey = {} {}", k.name, k.key);
    }
    if g.ssh_port != d.ssh_port {
        let _ = writeln!(s4, "SshPort = {}", g.ssh_port);
    }
    for l in s4.lines() {
        let _ = writeln!(gs, "{new4}{l}");
        guarded |= guard;
    }
    // Schema 5.
    let new5 = if guard {
        guard_prefix(5)
    } else {
        String::new()
    };
    let mut s5 = String::new();
    if g.metrics != d.metrics {
        let _ = writeln!(s5, "Metrics = {}", on_off_str(g.metrics));
    }
    if g.metrics_port != d.metrics_port {
        let _ = writeln!(s5, "MetricsPort = {}", g.metrics_port);
    }
    if let Some(t) = &g.syslog {
        let _ = writeln!(s5, "Syslog = {t}");
    }
    for l in s5.lines() {
        let _ = writeln!(gs, "{new5}{l}");
        guarded |= guard;
    }
    // Schema 6.
    let new6 = if guard {
        guard_prefix(6)
    } else {
        String::new()
    };
    let mut s6 = String::new();
    if g.client_isolation != d.client_isolation {
        let _ = writeln!(s6, "ClientIsolation = {}", on_off_str(g.client_isolation));
    }
    list_lines(&mut s6, "Dns", &g.dns);
    if let Some(dom) = &g.domain {
        let _ = writeln!(s6, "Domain = {dom}");
    }
    for l in s6.lines() {
        let _ = writeln!(gs, "{new6}{l}");
        guarded |= guard;
    }
    if !gs.is_empty() {
        s.push_str("\n[Gateway]\n");
        s.push_str(&gs);
    }
    if guarded {
        s.insert_str(0, COMPAT_NOTE);
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::{IpAddr, SocketAddr};

    pub(crate) use crate::testutil::Rng;

    /// A random valid configuration (every value in the canonical form `parse` yields).
    pub(crate) fn random_config(rng: &mut Rng) -> Config {
        let mut c = Config::default();
        if !rng.chance(4) {
            c.interface.private_key = Some(rng.key());
        }
        if rng.chance(2) {
            c.interface.listen_port = Some(rng.port());
        }
        if rng.chance(3) {
            c.interface.fwmark = Some(1 + rng.below(u64::from(u32::MAX)) as u32);
        }
        for _ in 0..rng.below(3) {
            c.interface.addresses.push(rng.cidr(false));
        }
        if rng.chance(3) {
            c.interface.mtu = Some(1280 + rng.below(60000) as u16);
        }
        for _ in 0..rng.below(5) {
            let mut p = PeerConfig::new(rng.key());
            p.masquerade = !rng.chance(4);
            p.enabled = !rng.chance(4);
            match rng.below(4) {
                0 => p.access = Some(Vec::new()),
                1 => {
                    p.access = Some(
                        crate::access::parse_list("lan, 192.168.1.10/32 tcp 8096, fd00::/64 icmp")
                            .unwrap(),
                    )
                }
                _ => {}
            }
            if rng.chance(2) {
                p.preshared_key = Some(rng.key());
            }
            for _ in 0..rng.below(4) {
                let ip = rng.cidr(true);
                if !c.peers.iter().any(|q| q.allowed_ips.contains(&ip))
                    && !p.allowed_ips.contains(&ip)
                {
                    p.allowed_ips.push(ip);
                }
            }
            p.endpoint = match rng.below(4) {
                0 => Some(Endpoint::Addr(SocketAddr::new(
                    rng.cidr(false).addr,
                    rng.port(),
                ))),
                1 => Some(Endpoint::Name {
                    host: format!("h{}.example.net", rng.below(1000)),
                    port: rng.port(),
                }),
                _ => None,
            };
            if rng.chance(2) {
                p.persistent_keepalive = Some(1 + rng.below(65535) as u16);
            }
            if rng.chance(4) {
                p.tcp_port = Some(rng.port());
            }
            if rng.chance(2) {
                p.name = Some(format!("client-{}", c.peers.len()));
            }
            c.peers.push(p);
        }
        let g = &mut c.gateway;
        if rng.chance(3) {
            g.interface_name = format!("rg{}", rng.below(1000));
        }
        if rng.chance(3) {
            let n = rng.below(5);
            g.cores = (0..n as usize).map(|i| i * 2 + 1).collect();
        }
        g.io_uring = !rng.chance(3);
        g.sqpoll = rng.chance(4);
        g.poll = [
            crate::config::PollMode::Sleep,
            crate::config::PollMode::Adaptive,
            crate::config::PollMode::Busy,
        ][rng.below(3) as usize];
        g.offload = [
            OffloadMode::Auto,
            OffloadMode::Gso,
            OffloadMode::Mmsg,
            OffloadMode::Off,
        ][rng.below(4) as usize];
        g.tun_offload = !rng.chance(3);
        g.hugepages = !rng.chance(3);
        if rng.chance(3) {
            g.lan = "eth1".into();
            g.lan_addresses.push(rng.cidr(false));
        }
        g.proxy_arp = !rng.chance(3);
        g.firewall = !rng.chance(4);
        g.masquerade = [
            crate::config::MasqueradeMode::Auto,
            crate::config::MasqueradeMode::On,
            crate::config::MasqueradeMode::Off,
        ][rng.below(3) as usize];
        if rng.chance(3) {
            g.public_endpoint = Some(Endpoint::Name {
                host: format!("vpn{}.example.net", rng.below(1000)),
                port: rng.port(),
            });
        }
        if rng.chance(3) {
            g.client_dns.push(rng.cidr(false).addr);
        }
        for i in 0..rng.below(3) {
            let host = match rng.below(3) {
                0 => format!("ntp{i}.example.net"),
                1 => rng.cidr(false).addr.to_string(),
                _ => format!("10.9.9.{i}"),
            };
            let port = if rng.chance(3) { rng.port() } else { 123 };
            let n = crate::config::NtpServer { host, port };
            if !g.ntp.contains(&n) {
                g.ntp.push(n);
            }
        }
        if rng.chance(4) {
            g.uplink_overlap = crate::config::OverlapPolicy::Refuse;
        }
        for i in 0..rng.below(3) {
            // An ed25519 blob of this test's bytes (the parser checks structure only).
            let mut raw = [0u8; 32];
            raw[0] = i as u8;
            raw[1..9].copy_from_slice(&rng.next().to_le_bytes());
            let b64 = base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                crate::ssh_key::ed25519_blob(&raw),
            );
            let key = crate::ssh_key::PublicKey::parse(&format!("ssh-ed25519 {b64} user{i}@host"))
                .expect("a well-formed key");
            g.ssh_keys.push(crate::config::SshKey {
                name: format!("key-{i}"),
                key,
            });
        }
        if rng.chance(4) {
            g.ssh_port = rng.port();
        }
        if rng.chance(3) {
            g.metrics = true;
        }
        if rng.chance(3) {
            g.client_isolation = true;
        }
        if rng.chance(3) {
            g.dns = vec![
                "192.0.2.53".parse().unwrap(),
                "2001:db8::53".parse().unwrap(),
            ];
        }
        if rng.chance(3) {
            g.domain = Some("office.example".into());
        }
        if rng.chance(4) {
            g.metrics_port = rng.port();
        }
        match rng.below(4) {
            0 => g.syslog = Some(crate::config::SyslogTarget::parse("192.0.2.7").unwrap()),
            1 => {
                g.syslog =
                    Some(crate::config::SyslogTarget::parse("[2001:db8::7]:1514/tcp").unwrap())
            }
            2 => {
                g.syslog =
                    Some(crate::config::SyslogTarget::parse("logs.example.net:6514").unwrap())
            }
            _ => {}
        }
        if rng.chance(3) {
            g.buffers = 1 + rng.below(1 << 20) as u32;
        }
        if rng.chance(2) {
            g.tcp_listen = vec![443];
            if rng.chance(2) {
                g.tcp_listen.push(8443);
            }
        }
        g.tcp_fallback = !rng.chance(3);
        if rng.chance(3) {
            g.bbr_rtt_ms = rng.next() as u32;
        }
        if rng.chance(3) {
            g.uplink = "eth0".into();
        }
        for _ in 0..rng.below(3) {
            g.uplink_addresses.push(rng.cidr(false));
        }
        if rng.chance(3) {
            g.uplink_gateway = Some(rng.cidr(false).addr);
        }
        c
    }

    const PRIV: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PUB: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

    #[test]
    fn parses_a_wg_quick_file() {
        let text = format!(
            "# a comment\n\
             [interface]\r\n\
             PrivateKey = {PRIV}\n\
             listenport=51820 ; inline comment\n\
             Address = 10.0.0.1/24, fd00::1/64\n\
             Address = 10.0.1.1/24\n\
             FwMark = 0x10\n\
             MTU = 1380\n\
             DNS = 1.1.1.1\n\
             PostUp = iptables -A FORWARD -i %i -j ACCEPT; echo hi\n\
             SaveConfig = true\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             AllowedIPs = 10.0.0.2/24 ,fd00::2/128\n\
             AllowedIPs = 192.168.0.0/16\n\
             Endpoint = [2001:db8::1]:51820\n\
             PersistentKeepalive = 25\n\
             TcpPort = 443\n\
             [PEER]\n\
             PublicKey = {PRIV}\n\
             Endpoint = vpn.example.com:51820\n\
             PersistentKeepalive = off\n\
             [Gateway]\n\
             InterfaceName = wg7\n\
             Cores = 0-2, 5\n\
             IoUring = off\n\
             Offload = GSO\n\
             TcpListen = 443, 8443\n\
             UplinkAddress = 192.0.2.2/24\n\
             UplinkGateway = 192.0.2.1\n"
        );
        let c = parse("t.conf", &text).unwrap();
        assert_eq!(c.interface.private_key.unwrap().to_base64(), PRIV);
        assert_eq!(c.interface.listen_port, Some(51820));
        assert_eq!(c.interface.fwmark, Some(16));
        assert_eq!(c.interface.addresses.len(), 3);
        assert_eq!(c.interface.addresses[0].to_string(), "10.0.0.1/24");
        assert_eq!(c.interface.mtu, Some(1380));
        assert_eq!(c.peers.len(), 2);
        let p = &c.peers[0];
        assert_eq!(p.public_key.to_base64(), PUB);
        let ips: Vec<String> = p.allowed_ips.iter().map(|c| c.to_string()).collect();
        assert_eq!(ips, ["10.0.0.0/24", "fd00::2/128", "192.168.0.0/16"]);
        assert_eq!(
            p.endpoint.as_ref().unwrap().to_string(),
            "[2001:db8::1]:51820"
        );
        assert_eq!(p.persistent_keepalive, Some(25));
        assert_eq!(p.tcp_port, Some(443));
        assert_eq!(
            c.peers[1].endpoint,
            Some(Endpoint::Name {
                host: "vpn.example.com".into(),
                port: 51820
            })
        );
        assert_eq!(c.peers[1].persistent_keepalive, None);
        assert_eq!(c.gateway.interface_name, "wg7");
        assert_eq!(c.gateway.cores, vec![0, 1, 2, 5]);
        assert!(!c.gateway.io_uring);
        assert_eq!(c.gateway.offload, OffloadMode::Gso);
        assert_eq!(c.gateway.tcp_listen, vec![443, 8443]);
        assert_eq!(c.gateway.uplink_gateway, Some("192.0.2.1".parse().unwrap()));
        // And it survives a round trip.
        assert_eq!(parse("again", &emit(&c)).unwrap(), c);
    }

    fn err_of(text: &str) -> ConfigError {
        parse("f.conf", text).unwrap_err()
    }

    #[test]
    fn errors_name_line_key_and_what_is_allowed() {
        let e = err_of("[Interface]\nListenPort = x\n");
        assert_eq!((e.line, e.key.as_str()), (2, "ListenPort"));
        assert_eq!(
            e.to_string(),
            "f.conf:2: ListenPort: expected a port number 1-65535, got `x`"
        );
        let e = err_of("[Interface]\nListenPort = 0\n");
        assert!(e.msg.contains("1-65535"));
        let e = err_of("[Interface]\nBogus = 1\n");
        assert!(
            e.msg.contains("unknown key") && e.msg.contains("PrivateKey"),
            "{e}"
        );
        let e = err_of("\n[Nope]\n");
        assert_eq!((e.line, e.key.as_str()), (2, "[Nope]"));
        let e = err_of("ListenPort = 1\n");
        assert!(e.msg.contains("before any section"));
        let e = err_of("[Peer]\nAllowedIPs = 10.0.0.0/8\n");
        assert_eq!((e.line, e.key.as_str()), (1, "[Peer]"));
        let e = err_of(&format!("[Peer]\nPublicKey = {PUB}\nPublicKey = {PUB}\n"));
        assert!(e.msg.contains("twice") && e.line == 3, "{e}");
        let e = err_of("[Interface]\n[Interface]\n");
        assert!(e.msg.contains("twice"));
        let e = err_of("[Interface]\nMTU = 500\n");
        assert!(e.msg.contains("576-65535"));
        let e = err_of("[Interface]\nPrivateKey = abc\n");
        assert!(e.msg.contains("base64"), "{e}");
        let e = err_of(&format!(
            "[Peer]\nPublicKey = {PUB}\nEndpoint = fd00::1:51820\n"
        ));
        assert!(e.msg.contains("[IPv6]:PORT"), "{e}");
        let e = err_of(&format!(
            "[Peer]\nPublicKey = {PUB}\nPersistentKeepalive = 70000\n"
        ));
        assert!(e.msg.contains("0-65535 or off"), "{e}");
        let e = err_of("[Gateway]\nCores = 3-1\n");
        assert!(e.msg.contains("0-3"), "{e}");
        let e = err_of("[Gateway]\nCores = 0-100000000\n");
        assert_eq!(e.key, "Cores");
        let e = err_of("[Gateway]\nOffload = fast\n");
        assert!(e.msg.contains("auto, gso, mmsg or off"));
        let e = err_of("[Gateway]\nIoUring = maybe\n");
        assert!(e.msg.contains("on or off"));
        let e = err_of("[Gateway]\nTcpListen = 443, 443\n");
        assert!(e.msg.contains("twice"));
        let e = err_of("[Gateway]\nInterfaceName = a/b\n");
        assert!(e.msg.contains("interface name"));
        let e = err_of("[Interface]\njust words\n");
        assert!(e.msg.contains("Key = Value"));
        let e = err_of("[Interface\n");
        assert!(e.msg.contains("section header"));
    }

    #[test]
    fn size_limits() {
        let long = format!("[Interface]\n# {}\n", "x".repeat(MAX_LINE_CHARS));
        let e = err_of(&long);
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("4096"));
        let big = "#\n".repeat(MAX_FILE_BYTES / 2 + 1);
        let e = err_of(&big);
        assert_eq!(e.line, 0);
        assert!(e.msg.contains("at most"));
    }

    #[test]
    fn empty_and_off_values() {
        let c = parse(
            "f",
            "[Interface]\nFwMark = off\n[Peer]\nPublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\nAllowedIPs =\nPresharedKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n[Gateway]\nTcpListen = off\nCores = all\nUplinkGateway =\n",
        )
        .unwrap();
        assert_eq!(c.interface.fwmark, None);
        assert!(c.peers[0].allowed_ips.is_empty());
        assert_eq!(c.peers[0].preshared_key, None);
        assert!(c.gateway.tcp_listen.is_empty() && c.gateway.cores.is_empty());
        assert_eq!(parse("e", "").unwrap(), Config::default());
        assert_eq!(emit(&Config::default()), "[Interface]\n");
    }

    #[test]
    fn long_lists_round_trip_within_the_line_limit() {
        let mut c = Config::default();
        c.gateway.cores = (1..=3090).collect();
        c.gateway.tcp_listen = (1..=2000).collect();
        c.peers.push(PeerConfig {
            public_key: Key([1; 32]),
            preshared_key: None,
            allowed_ips: (0..3000u32)
                .map(|i| Cidr::new(IpAddr::V4(i.into()), 32).unwrap())
                .collect(),
            endpoint: None,
            persistent_keepalive: None,
            tcp_port: None,
            name: None,
            masquerade: true,
            enabled: true,
            access: None,
        });
        let text = emit(&c);
        assert!(text.lines().all(|l| l.len() < 1100));
        assert_eq!(parse("long", &text).unwrap(), c);
        let e = err_of("[Gateway]\nCores = 1\nCores = 1\n");
        assert_eq!((e.line, e.key.as_str()), (3, "Cores"));
    }

    #[test]
    fn round_trip_generated_configs() {
        for seed in 1..=500u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let c = random_config(&mut rng);
            let text = emit(&c);
            let back = parse("gen", &text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
            assert_eq!(back, c, "seed {seed}\n{text}");
        }
    }

    #[test]
    fn wg_quick_keys_warn_and_table_off_is_refused() {
        let text = format!(
            "[Interface]\nPrivateKey = {PRIV}\nDNS = 1.1.1.1\nTable = auto\n\
             PostUp = iptables -t nat -A POSTROUTING -o eth0 -j MASQUERADE\nPostDown = x\n\
             PreUp = y\npredown = z\nSaveConfig = true\ntable = 1234\nTable = main\n"
        );
        let (c, w) = parse_with_warnings("w.conf", &text).unwrap();
        assert_eq!(c, parse("w.conf", &text).unwrap());
        assert_eq!(c.interface.private_key.unwrap().to_base64(), PRIV);
        let lk: Vec<(usize, &str)> = w.iter().map(|w| (w.line, w.key.as_str())).collect();
        assert_eq!(
            lk,
            [
                (3, "DNS"),
                (4, "Table"),
                (5, "PostUp"),
                (6, "PostDown"),
                (7, "PreUp"),
                (8, "predown"),
                (9, "SaveConfig"),
                (10, "table"),
                (11, "Table")
            ]
        );
        assert!(w[0].msg.contains("ClientDns"), "{}", w[0]);
        assert!(w[1].msg.contains("main table"), "{}", w[1]);
        assert!(
            w[2].msg.contains("no shell commands") && w[2].msg.contains("Masquerade ="),
            "{}",
            w[2]
        );
        assert!(w[6].msg.contains("console saves"), "{}", w[6]);
        assert!(w[7].msg.contains("Table = 1234"), "{}", w[7]);
        assert_eq!(w[2].to_string(), format!("w.conf:5: PostUp: {}", w[2].msg));
        // Nothing to warn about in a file the appliance wrote.
        assert!(parse_with_warnings("e", &emit(&c)).unwrap().1.is_empty());
        let e = err_of("[Interface]\nTable = off\n");
        assert_eq!((e.line, e.key.as_str()), (2, "Table"));
        assert!(
            e.msg.contains("not supported") && e.msg.contains("main table"),
            "{e}"
        );
        assert!(err_of("[Interface]\nTable = Off\n")
            .msg
            .contains("not supported"));
        let e = err_of("[Interface]\nTable = sometimes\n");
        assert!(
            e.msg.contains("auto, main, off or a routing table number"),
            "{e}"
        );
        // Only [Interface] has them.
        assert!(err_of("[Gateway]\nPostUp = x\n")
            .msg
            .contains("unknown key"));
        // Firmware of schema 1 dropped them without a word, `Table = off` too.
        assert!(parse_as_schema1("s1", "[Interface]\nTable = off\nPostUp = x\n").is_ok());
    }

    /// Schema 4: `SshKey` and `SshPort` on `#4+` lines, which schema-3 firmware (it reads
    /// `#+` and `#3+` lines) skips: after a rollback it runs the file without SSH, as a
    /// firmware that has no SSH server.
    #[test]
    fn schema4_keys_on_their_own_guarded_lines() {
        const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC alice@laptop";
        let mut c = Config::default();
        c.gateway.ssh_keys = vec![crate::value::ssh_key(&format!("alice {ED}")).unwrap()];
        c.gateway.ssh_port = 2222;
        c.gateway.ntp = vec![crate::config::NtpServer::parse("192.0.2.1").unwrap()];
        let text = emit_compat(&c);
        assert!(
            text.contains(&format!("\n#4+ SshKey = alice {ED}\n")),
            "{text}"
        );
        assert!(text.contains("\n#4+ SshPort = 2222\n"), "{text}");
        assert!(text.starts_with(COMPAT_NOTE));
        assert_eq!(parse("f", &text).unwrap(), c);
        let three = parse_as_schema(3, "f", &text).unwrap();
        assert_eq!(three, schema3_view(&c));
        assert!(three.gateway.ssh_keys.is_empty());
        assert_eq!(
            three.gateway.ntp, c.gateway.ntp,
            "schema 3 keeps its own settings"
        );
        assert_eq!(parse_as_schema(2, "f", &text).unwrap(), schema2_view(&c));
        assert_eq!(parse_as_schema1("f", &text).unwrap(), schema1_view(&c));
        // Plain, by hand: schema 3 refuses it as a later schema's key.
        let plain = format!("[Gateway]\nSshKey = alice {ED}\n");
        let e = parse_as_schema(3, "f", &plain).unwrap_err();
        assert!(e.to_string().contains("schema 3"), "{e}");
        assert_eq!(earlier_refusal("f", &plain).unwrap().0, 4);
        assert!(schema2_settings(&c)
            .iter()
            .any(|s| s.starts_with("SshKey alice")));
        for bad in [
            format!("SshKey = {ED}"),
            format!("SshKey = -alice {ED}"),
            format!("SshKey = a-name-longer-than-16 {ED}"),
            "SshKey = alice ssh-rsa AAAA".to_string(),
            "SshKey = alice".to_string(),
            format!("SshKey = alice {ED}\nSshKey = alice {ED}"),
            format!("SshKey = alice {ED}\nSshKey = bob {ED}"),
            "SshPort = 0".to_string(),
            "SshPort = 65536".to_string(),
        ] {
            assert!(parse("f", &format!("[Gateway]\n{bad}\n")).is_err(), "{bad}");
        }
    }

    /// Schema 5: `Metrics`, `MetricsPort` and `Syslog` on `#5+` lines, which schema-4
    /// firmware skips: after a rollback nothing serves metrics and nothing is sent to a
    /// collector (less reported, nothing opened); the schema-4 settings stay.
    #[test]
    fn schema6_keys_and_restricted_peers_on_their_own_guarded_lines() {
        let mut c = Config::default();
        c.interface.addresses = vec!["10.100.0.1/24".parse().unwrap()];
        let mut open = PeerConfig::new(crate::key::Key([1; 32]));
        open.allowed_ips = vec!["10.100.0.2/32".parse().unwrap()];
        open.name = Some("phone".into());
        let mut kiosk = PeerConfig::new(crate::key::Key([2; 32]));
        kiosk.allowed_ips = vec!["10.100.0.3/32".parse().unwrap()];
        kiosk.name = Some("kiosk".into());
        kiosk.masquerade = false;
        kiosk.access = Some(crate::access::parse_list("lan, 192.168.1.10/32 tcp 8096").unwrap());
        let mut off = kiosk.clone();
        off.public_key = crate::key::Key([3; 32]);
        off.name = Some("tv".into());
        off.allowed_ips = vec!["10.100.0.4/32".parse().unwrap()];
        off.enabled = false;
        off.access = Some(Vec::new());
        c.peers = vec![open, kiosk, off];
        c.gateway.client_isolation = true;
        c.gateway.dns = vec!["192.0.2.53".parse().unwrap()];
        c.gateway.domain = Some("office.example".into());
        let text = emit_compat(&c);
        for l in [
            "\n#6+ ClientIsolation = on\n",
            "\n#6+ Dns = 192.0.2.53\n",
            "\n#6+ Domain = office.example\n",
            "\n#6+ [Peer]\n#6+ PublicKey = ",
            "\n#6+ Masquerade = off\n#6+ Access = lan, 192.168.1.10/32 tcp 8096\n",
            "\n#6+ Enabled = off\n#6+ Access = none\n",
        ] {
            assert!(text.contains(l), "{l} in {text}");
        }
        assert!(text.starts_with(COMPAT_NOTE));
        assert_eq!(parse("f", &text).unwrap(), c);
        assert_eq!(parse("f", &emit(&c)).unwrap(), c);
        // Schema 5 firmware runs neither restricted peer (it would run them unrestricted)
        // and has no isolation and no resolver: what README's rollback section says.
        let five = parse_as_schema(5, "f", &text).unwrap();
        assert_eq!(five, schema5_view(&c));
        assert_eq!(five.peers.len(), 1);
        assert_eq!(five.peers[0].name.as_deref(), Some("phone"));
        assert!(!five.gateway.client_isolation && five.gateway.dns.is_empty());
        for n in 1..=4 {
            let v = parse_as_schema(n, "f", &text).unwrap();
            assert!(v.peers.iter().all(|p| p.access.is_none()), "schema {n}");
            assert_eq!(v.peers.len(), 1, "schema {n}");
        }
        assert_eq!(parse_as_schema1("f", &text).unwrap(), schema1_view(&c));
        let plain = "[Gateway]\nClientIsolation = on\n";
        assert_eq!(earlier_refusal("f", plain).unwrap().0, 6);
        let settings = schema2_settings(&c);
        assert!(
            settings
                .iter()
                .any(|s| s.contains("peer kiosk with Access")),
            "{settings:?}"
        );
        assert!(settings
            .iter()
            .any(|s| s.starts_with("ClientIsolation = on")));
        for bad in [
            "[Gateway]\nClientIsolation = maybe\n",
            "[Gateway]\nDns = 1.2.3\n",
            "[Gateway]\nDomain = a..b\n",
            "[Gateway]\nDomain = -x.lan\n",
            "[Gateway]\nDomain = a_b.lan\n",
            "[Gateway]\nDomain = home.arpa\nDomain = lan\n",
            "[Peer]\nPublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\nAccess = lan, wan\n",
            "[Peer]\nPublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\nAccess = lan\nAccess = internet\n",
        ] {
            assert!(parse("f", bad).is_err(), "{bad}");
        }
        let e = parse(
            "f",
            "[Peer]\nPublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\nAccess = 10.0.0.0/8 icmp 3\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("icmp takes no port"), "{e}");
        assert_eq!(
            parse("f", "[Gateway]\nDomain = Office.Example.\n")
                .unwrap()
                .gateway
                .domain_name(),
            "office.example"
        );
        assert_eq!(Config::default().gateway.domain_name(), "home.arpa");
    }

    #[test]
    fn schema5_keys_on_their_own_guarded_lines() {
        const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC alice@laptop";
        let mut c = Config::default();
        c.gateway.ssh_keys = vec![crate::value::ssh_key(&format!("alice {ED}")).unwrap()];
        c.gateway.metrics = true;
        c.gateway.metrics_port = 9100;
        c.gateway.syslog = Some(crate::config::SyslogTarget::parse("192.0.2.9:1514/tcp").unwrap());
        let text = emit_compat(&c);
        for l in [
            "\n#5+ Metrics = on\n",
            "\n#5+ MetricsPort = 9100\n",
            "\n#5+ Syslog = 192.0.2.9:1514/tcp\n",
        ] {
            assert!(text.contains(l), "{l} in {text}");
        }
        assert!(text.starts_with(COMPAT_NOTE));
        assert_eq!(parse("f", &text).unwrap(), c);
        let four = parse_as_schema(4, "f", &text).unwrap();
        assert_eq!(four, schema4_view(&c));
        assert!(!four.gateway.metrics && four.gateway.syslog.is_none());
        assert_eq!(
            four.gateway.ssh_keys, c.gateway.ssh_keys,
            "schema 4 keeps its own"
        );
        assert_eq!(parse_as_schema(3, "f", &text).unwrap(), schema3_view(&c));
        assert_eq!(parse_as_schema1("f", &text).unwrap(), schema1_view(&c));
        let plain = "[Gateway]\nMetrics = on\n";
        let e = parse_as_schema(4, "f", plain).unwrap_err();
        assert!(e.to_string().contains("schema 4"), "{e}");
        assert_eq!(earlier_refusal("f", plain).unwrap().0, 5);
        assert!(schema2_settings(&c)
            .iter()
            .any(|s| s.starts_with("Metrics = on")));
        for (v, want) in [
            ("192.0.2.9", "192.0.2.9"),
            ("192.0.2.9:514", "192.0.2.9"),
            ("192.0.2.9/udp", "192.0.2.9"),
            ("2001:db8::123", "2001:db8::123"),
            ("[2001:db8::1]:1514/TCP", "[2001:db8::1]:1514/tcp"),
            ("Logs.Example.net:6514/tcp", "logs.example.net:6514/tcp"),
        ] {
            let t = crate::config::SyslogTarget::parse(v).unwrap();
            assert_eq!(t.to_string(), want, "{v}");
            assert_eq!(crate::config::SyslogTarget::parse(want).unwrap(), t);
        }
        assert_eq!(
            crate::config::SyslogTarget::parse("2001:db8::123")
                .unwrap()
                .port,
            crate::config::SYSLOG_PORT
        );
        for bad in [
            "Metrics = maybe",
            "MetricsPort = 0",
            "Syslog = 192.0.2.9/sctp",
            "Syslog = 192.0.2.9:0",
            "Syslog = -bad-",
            "Syslog = a b",
            "Syslog = 300.1.1.1",
        ] {
            assert!(parse("f", &format!("[Gateway]\n{bad}\n")).is_err(), "{bad}");
        }
    }

    /// Schema 3: `Ntp` and `UplinkOverlap` on `#3+` lines, which schema-2 firmware (it reads
    /// `#+` lines as settings) and schema-1 firmware both skip.
    #[test]
    fn schema3_keys_on_their_own_guarded_lines() {
        use crate::config::{NtpServer, OverlapPolicy};
        let mut c = Config::default();
        c.gateway.ntp = vec![
            NtpServer::parse("192.168.1.1").unwrap(),
            NtpServer::parse("Ntp.Example.net:1123").unwrap(),
            NtpServer::parse("[2001:db8::1]:1123").unwrap(),
        ];
        c.gateway.uplink_overlap = OverlapPolicy::Refuse;
        c.gateway.firewall = false;
        let text = emit_compat(&c);
        assert!(
            text.contains("\n#3+ Ntp = 192.168.1.1, ntp.example.net:1123, [2001:db8::1]:1123\n"),
            "{text}"
        );
        assert!(text.contains("\n#3+ UplinkOverlap = refuse\n"), "{text}");
        assert!(text.contains("\n#+ Firewall = off\n"), "{text}");
        assert_eq!(parse("f", &text).unwrap(), c);
        assert_eq!(parse_as_schema(2, "f", &text).unwrap(), schema2_view(&c));
        assert!(!parse_as_schema(2, "f", &text).unwrap().gateway.firewall);
        assert_eq!(parse_as_schema1("f", &text).unwrap(), schema1_view(&c));
        // Plain, by hand: schema 2 refuses it, and says it is of a later schema.
        let plain = "[Gateway]\nNtp = 192.0.2.1\n";
        let e = parse_as_schema(2, "f", plain).unwrap_err();
        assert!(e.to_string().contains("schema 2"), "{e}");
        let (n, e) = earlier_refusal("f", plain).unwrap();
        assert_eq!((n, e.line), (3, 2));
        let (n, _) = earlier_refusal("f", "[Gateway]\nFirewall = off\n").unwrap();
        assert_eq!(n, 2);
        assert!(earlier_refusal("f", &text).is_none());
        // A `#7+` line is a comment to this firmware (a later schema's setting).
        assert_eq!(
            parse("f", "[Gateway]\n#7+ Future = x\n").unwrap(),
            Config::default()
        );
        for bad in [
            "Ntp = -bad-.example",
            "Ntp = 1.2.3",
            "Ntp = a:0",
            "Ntp = x, x",
            "UplinkOverlap = sometimes",
        ] {
            assert!(parse("f", &format!("[Gateway]\n{bad}\n")).is_err(), "{bad}");
        }
    }

    /// The saved form: schema-2 settings on `#+` lines that schema-1 firmware skips, so it
    /// reads the same configuration without them; this firmware reads it whole.
    #[test]
    fn compat_form_reads_as_schema1_without_the_new_settings() {
        let mut seen_hidden = 0;
        for seed in 1..=500u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let c = random_config(&mut rng);
            let text = emit_compat(&c);
            let back =
                parse("compat", &text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
            assert_eq!(back, c, "seed {seed}\n{text}");
            let old = parse_as_schema1("old", &text)
                .unwrap_or_else(|e| panic!("seed {seed}: schema 1 refuses it: {e}\n{text}"));
            assert_eq!(old, schema1_view(&c), "seed {seed}\n{text}");
            let two = parse_as_schema(2, "two", &text)
                .unwrap_or_else(|e| panic!("seed {seed}: schema 2 refuses it: {e}\n{text}"));
            assert_eq!(two, schema2_view(&c), "seed {seed}\n{text}");
            if schema2_view(&c) != c {
                assert!(
                    parse_as_schema(2, "plain", &emit(&c)).is_err(),
                    "seed {seed}"
                );
            }
            assert_eq!(emit_compat(&c), text, "deterministic");
            if schema1_view(&c) == c {
                assert_eq!(text, emit(&c), "seed {seed}: unchanged when nothing is new");
                assert!(schema2_settings(&c).is_empty());
                assert!(!text.contains("#+"));
            } else {
                assert!(text.starts_with(COMPAT_NOTE), "{text}");
                assert!(!schema2_settings(&c).is_empty());
                // The plain form is what schema 1 refuses.
                assert!(parse_as_schema1("plain", &emit(&c)).is_err(), "seed {seed}");
            }
            if c.validate_consistency().is_ok() {
                assert!(schema1_view(&c).validate_consistency().is_ok());
            }
            seen_hidden += usize::from(c.peers.iter().any(|p| !p.enabled));
        }
        assert!(
            seen_hidden > 50,
            "the generator disables peers: {seen_hidden}"
        );
    }

    #[test]
    fn compat_form_as_written() {
        let mut c = Config::default();
        c.interface.private_key = Some(Key::from_base64(PRIV).unwrap());
        let mut on = PeerConfig::new(Key::from_base64(PUB).unwrap());
        on.allowed_ips = vec!["10.0.0.2/32".parse().unwrap()];
        on.masquerade = false;
        let mut off = PeerConfig::new(Key([9; 32]));
        off.allowed_ips = vec!["10.0.0.3/32".parse().unwrap()];
        off.name = Some("laptop".into());
        off.enabled = false;
        c.peers = vec![off.clone(), on.clone()];
        c.gateway.firewall = false;
        let t = emit_compat(&c);
        let want = format!(
            "{COMPAT_NOTE}[Interface]\nPrivateKey = {PRIV}\n\n\
             #+ [Peer]\n#+ PublicKey = {}\n#+ AllowedIPs = 10.0.0.3/32\n#+ Name = laptop\n#+ Enabled = off\n\n\
             [Peer]\nPublicKey = {PUB}\nAllowedIPs = 10.0.0.2/32\n#+ Masquerade = off\n\n\
             [Gateway]\n#+ Firewall = off\n",
            off.public_key.to_base64()
        );
        assert_eq!(t, want);
        let old = parse_as_schema1("old", &t).unwrap();
        assert_eq!(old.peers.len(), 1);
        assert!(old.gateway.firewall && old.peers[0].masquerade);
        // Plain and `#+` forms may be mixed by hand; `#+` without a setting is a comment.
        let c2 = parse(
            "mixed",
            &format!(
                "[Gateway]\n#+----------+\n#+ just a note\n  #+Firewall = off # why\nMasquerade = on\n\
                 #+ [Peer]\n#+ PublicKey = {PUB}\n#+Enabled=no\n"
            ),
        )
        .unwrap();
        assert!(!c2.gateway.firewall && !c2.peers[0].enabled);
        assert_eq!(c2.gateway.masquerade, crate::config::MasqueradeMode::On);
        // A plain line inside a hidden section would land in the section above.
        let e = err_of(&format!(
            "[Peer]\nPublicKey = {PRIV}\n#+ [Peer]\n#+ PublicKey = {PUB}\nAllowedIPs = 10.0.0.9/32\n"
        ));
        assert_eq!((e.line, e.key.as_str()), (5, "AllowedIPs"));
        assert!(e.msg.contains("start it with `#+`"), "{e}");
        // Schema 1 refuses the plain schema-2 keys, as that firmware does.
        for (text, key) in [
            ("[Gateway]\nFirewall = off\n", "Firewall"),
            ("[Gateway]\nMasquerade = on\n", "Masquerade"),
            (
                &*format!("[Peer]\nPublicKey = {PUB}\nEnabled = off\n"),
                "Enabled",
            ),
            (
                &*format!("[Peer]\nPublicKey = {PUB}\nMasquerade = off\n"),
                "Masquerade",
            ),
        ] {
            let e = parse_as_schema1("old", text).unwrap_err();
            assert_eq!(e.key, key, "{e}");
            assert!(e.msg.contains("unknown key"), "{e}");
        }
    }
}
