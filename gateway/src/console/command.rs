//! The console's command language: parsing a line into a [`Command`], the `help` texts,
//! and the `set`/`delete` edits, which work on a [`Config`] value and nothing else (so
//! they are tested without files, daemons or terminals).
//!
//! The word tables below drive parsing, `help` and the "expected one of" messages, so
//! the three cannot disagree.
//!
//! Owns: the word tables (every `set`/`delete`/`show` form and its help), the parser
//! and the edits. Invariant: each form is one table entry, read by all three.

use crate::core::config::{Config, GatewayConfig, OffloadMode, PeerConfig};
use crate::core::key::Key;

use super::validate as v;
use super::vpn_client::Tunnel;

/// The longest `commit-confirm` wait (a day).
pub const MAX_CONFIRM_MINUTES: u32 = 1440;

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help(Vec<String>),
    Show {
        what: Show,
        private: bool,
    },
    Set(Vec<String>),
    Delete(Vec<String>),
    /// `add client NAME [full-tunnel] [keep-key] [access LIST]` (the options in any
    /// order, `access` and its list last).
    AddClient {
        name: String,
        keep_key: bool,
        tunnel: Tunnel,
        access: Option<Vec<crate::core::access::AccessItem>>,
    },
    /// `show client NAME [full-tunnel]`.
    /// `show log [N] [peer NAME]`: the last N events of the event log on perm.
    ShowLog {
        n: usize,
        peer: Option<String>,
    },
    ShowClient {
        name: String,
        tunnel: Tunnel,
    },
    /// `disable client NAME` (`enabled` false) / `enable client NAME`.
    EnableClient {
        name: String,
        enabled: bool,
    },
    Compare,
    Commit,
    CommitConfirm(u32),
    Confirm,
    Discard,
    Rollback(usize),
    Save,
    Genkey,
    Pubkey,
    FactoryReset {
        erase_history: bool,
    },
    Reboot,
    /// Install a signed update bundle into the inactive slot (`riceguard update SOURCE`);
    /// `allow_downgrade`: also when its build is not newer than the running one.
    Update {
        source: String,
        allow_downgrade: bool,
    },
    /// Make the other slot the default boot entry again.
    RollbackSlot,
    /// `export configuration [to usb]`: the box's identity as a passphrase-encrypted age
    /// text, printed or written onto the one USB stick attached.
    Export {
        to_usb: bool,
    },
    /// `import configuration`: an export pasted back, as the candidate.
    Import,
    /// `import configuration from usb [FILE]`: the newest export (or FILE) on the USB
    /// stick, as the candidate.
    ImportUsb {
        file: Option<String>,
    },
    Exit {
        discard: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Running,
    Candidate,
    Peers,
    Status,
    History,
    Clients,
}

/// (name, arguments, one-line summary) of every command, in the order `help` lists them.
pub const COMMANDS: &[(&str, &str, &str)] = &[
    (
        "help",
        "[COMMAND]",
        "list commands, or explain one (e.g. `help set`)",
    ),
    (
        "show",
        "[WHAT] [private]",
        "the running configuration (keys hidden unless `private`), or WHAT: see `help show`",
    ),
    (
        "add",
        "client NAME [full-tunnel] [keep-key] [access LIST]",
        "add a client (phone, laptop): keys, address, its config and QR code",
    ),
    (
        "disable",
        "client NAME",
        "keep a client with its keys but let it no longer connect (`enable client NAME` undoes it)",
    ),
    (
        "enable",
        "client NAME",
        "let a disabled client connect again",
    ),
    (
        "set",
        "interface|peer|gateway|system ...",
        "change the candidate configuration (see `help set`)",
    ),
    (
        "delete",
        "interface|peer|client|gateway|system ...",
        "remove settings from the candidate (see `help delete`)",
    ),
    (
        "compare",
        "",
        "show what `commit` would change (- running, + candidate)",
    ),
    (
        "commit",
        "",
        "check the candidate, save it and apply it to the running gateway",
    ),
    (
        "commit-confirm",
        "MINUTES",
        "commit, then roll back by itself unless `confirm` is given in time",
    ),
    (
        "confirm",
        "",
        "keep the configuration of a pending `commit-confirm`",
    ),
    (
        "discard",
        "",
        "throw away uncommitted changes (candidate = running)",
    ),
    (
        "rollback",
        "N",
        "load saved version N (1 = before the last commit, up to 10) into the candidate",
    ),
    (
        "save",
        "",
        "nothing to do: `commit` already saves (kept for habit)",
    ),
    (
        "genkey",
        "",
        "put a new private key into the candidate and print its public key",
    ),
    (
        "pubkey",
        "",
        "print this gateway's public key (give it to the peers)",
    ),
    (
        "export",
        "configuration [to usb]",
        "print the configuration, kept client keys, console password and SSH host key as one passphrase-encrypted age text (a backup); `to usb`: write it as riceguard-BOARD-DATETIME.age onto the one USB stick attached (one FAT partition)",
    ),
    (
        "import",
        "configuration [from usb [FILE]]",
        "paste an export back (asks its passphrase): it becomes the candidate; `compare`, then `commit` applies it; `from usb`: read the newest riceguard-*.age (or FILE) from the USB stick instead",
    ),
    (
        "factory-reset",
        "[erase-history]",
        "replace everything with defaults and a new key (asks first)",
    ),
    ("reboot", "", "restart the appliance (asks first)"),
    (
        "update",
        "SOURCE [allow-downgrade]",
        "install a signed update bundle (http://HOST/FILE or a file path) into the other slot",
    ),
    (
        "rollback-slot",
        "",
        "boot the other (previous) slot next time",
    ),
    (
        "exit",
        "[discard]",
        "leave the console (`quit` too); refuses with uncommitted changes unless `discard`",
    ),
];

/// `set interface` / `delete interface` fields: (word, argument, meaning).
pub const INTERFACE_FIELDS: &[(&str, &str, &str)] = &[
    (
        "private-key",
        "KEY",
        "this gateway's private key, base64 (`genkey` makes one)",
    ),
    (
        "listen-port",
        "PORT",
        "UDP port peers connect to (unset: any free port)",
    ),
    (
        "address",
        "CIDR",
        "address of the tunnel interface, e.g. 10.0.0.1/24; `set` again adds another",
    ),
    ("mtu", "N", "tunnel MTU"),
    (
        "fwmark",
        "N",
        "firewall mark on outgoing packets, decimal or 0x hex",
    ),
];

/// `set peer PUBKEY` fields.
pub const PEER_FIELDS: &[(&str, &str, &str)] = &[
    (
        "allowed-ips",
        "CIDR[,CIDR...]",
        "addresses routed to this peer, e.g. 10.0.0.2/32; adds to the list",
    ),
    (
        "endpoint",
        "HOST:PORT",
        "where to reach the peer, e.g. 192.0.2.7:51820 (unset: it connects to us)",
    ),
    (
        "persistent-keepalive",
        "SECONDS",
        "send a keepalive this often (25 suits NAT)",
    ),
    (
        "preshared-key",
        "KEY",
        "optional extra symmetric key, base64",
    ),
    (
        "tcp-port",
        "PORT",
        "TCP port for this peer's TCP fallback (unset: the endpoint's port)",
    ),
    (
        "name",
        "NAME",
        "a name for the peer (1-32 of A-Z a-z 0-9 . _ -), as `add client` gives",
    ),
    (
        "masquerade",
        "on|off",
        "off: this peer's addresses leave by the uplink untranslated (a site whose router routes back to them)",
    ),
    (
        "enabled",
        "on|off",
        "off: the peer stays with its keys but cannot connect (as `disable client`)",
    ),
    (
        "access",
        "LIST",
        "where its traffic may go: lan, internet, clients, appliance, prefixes (`192.168.1.10/32 tcp 8096`), or none (unset: all; `delete` it for that)",
    ),
];

/// `set gateway` fields: every [`GatewayConfig`] field in kebab-case.
pub const GATEWAY_FIELDS: &[(&str, &str, &str)] = &[
    (
        "interface-name",
        "NAME",
        "name of the tunnel interface (default wg0)",
    ),
    (
        "cores",
        "LIST",
        "CPU cores for data-plane workers, e.g. 0-3 or 1,2 (unset: all)",
    ),
    ("io-uring", "on|off", "use io_uring (off: classic syscalls)"),
    (
        "offload",
        "auto|gso|mmsg|off",
        "transmit path: auto picks the fastest that works",
    ),
    (
        "tun-offload",
        "on|off",
        "segmentation offload on the tunnel device",
    ),
    (
        "hugepages",
        "on|off",
        "packet buffers in hugepages when reserved",
    ),
    (
        "buffers",
        "N",
        "packet buffers per worker",
    ),
    (
        "tcp-listen",
        "PORT[,PORT...]",
        "TCP ports to accept the TCP fallback on (unset: none)",
    ),
    (
        "tcp-fallback",
        "on|off",
        "fall back to TCP towards peers whose UDP gets no answer",
    ),
    (
        "bbr-rtt-ms",
        "N",
        "RTT in ms above which TCP connections use bbr",
    ),
    (
        "uplink",
        "NAME",
        "the network interface facing the internet (unset: the default route's)",
    ),
    (
        "uplink-address",
        "CIDR[,CIDR...]",
        "static address(es) for the uplink; adds to the list",
    ),
    ("uplink-gateway", "IP", "default gateway on the uplink"),
    (
        "lan",
        "NAME",
        "LAN port of a two-armed gateway, routed to the tunnel (unset: one-armed)",
    ),
    (
        "lan-address",
        "CIDR[,CIDR...]",
        "address(es) of the LAN port, e.g. 192.168.50.1/24; adds to the list",
    ),
    (
        "proxy-arp",
        "on|off",
        "answer ARP/NDP for peers numbered from the uplink/LAN subnet (default on)",
    ),
    (
        "public-endpoint",
        "HOST:PORT",
        "what `add client` gives clients as Endpoint (unset: the uplink's address)",
    ),
    (
        "client-dns",
        "IP[,IP...]",
        "DNS server(s) `add client` gives clients; replaces the list",
    ),
    (
        "firewall",
        "on|off",
        "the built-in firewall and NAT (default on; off: nothing filtered or translated)",
    ),
    (
        "masquerade",
        "auto|on|off",
        "translate tunnel and LAN sources leaving by the uplink (auto: those its network cannot route back)",
    ),
    (
        "ntp",
        "SERVER[,SERVER...]",
        "SNTP servers (host names or addresses, :PORT optional), tried before the DHCP lease's; replaces the list",
    ),
    (
        "uplink-overlap",
        "auto|refuse",
        "refuse: decline any uplink lease or RA prefix overlapping a tunnel route (auto: only equal ones and those inside a /16-or-longer route)",
    ),
    (
        "ssh-port",
        "PORT",
        "TCP port of the console over SSH (default 22; SSH listens only once a key is set)",
    ),
    (
        "metrics",
        "on|off",
        "Prometheus metrics on the tunnel and LAN sides (default off: they name every peer and its key)",
    ),
    (
        "metrics-port",
        "PORT",
        "TCP port of the metrics endpoint /metrics (default 9586)",
    ),
    (
        "client-isolation",
        "on|off",
        "on: clients without an Access of their own cannot reach each other (default off)",
    ),
    (
        "dns",
        "IP[,IP...]",
        "upstream servers of the resolver on the box (unset: the uplink lease's)",
    ),
    (
        "domain",
        "NAME",
        "the resolver answers clients' names under it, e.g. phone.home.arpa (default home.arpa)",
    ),
    (
        "syslog",
        "HOST[:PORT][/tcp]",
        "send every service's log lines to this syslog collector (RFC 5424, UDP unless /tcp, port 514 unless given; in clear)",
    ),
];

/// `set system` / `delete system` fields: the console password (applies at once, not in
/// riceguard.conf) and the SSH keys (saved in riceguard.conf: through `commit`).
pub const SYSTEM_FIELDS: &[(&str, &str, &str)] = &[
    (
        "console-password",
        "",
        "ask for a password on the console (prompts for the new one)",
    ),
    (
        "ssh-key",
        "NAME TYPE BASE64 [COMMENT]",
        "a public key that may log in over SSH as admin (a .pub file's line); delete system ssh-key NAME; both through commit",
    ),
];

/// `set system ssh-key NAME TYPE BASE64 [COMMENT]`: add a key, or replace the key of
/// that name. On error `cfg` is unchanged.
pub fn set_ssh_key(cfg: &mut Config, args: &[String]) -> EditResult {
    let line = args.join(" ");
    let k = crate::core::value::ssh_key(&line).map_err(|e| format!("set system ssh-key: {e}"))?;
    let keys = &mut cfg.gateway.ssh_keys;
    if let Some(o) = keys
        .iter()
        .find(|o| o.key.blob() == k.key.blob() && o.name != k.name)
    {
        return Err(format!(
            "that key is already set as {}: one key, one name (sessions are told apart by it)",
            o.name
        ));
    }
    let fp = k.key.fingerprint();
    let algo = k.key.algo().describe();
    let first = keys.is_empty();
    let said = match keys.iter_mut().find(|o| o.name == k.name) {
        Some(o) => {
            *o = k;
            "replaced"
        }
        None => {
            keys.push(k);
            "added"
        }
    };
    let mut msg = format!(
        "SSH key {} {said}: {fp} ({algo}); `commit` to apply",
        args[0]
    );
    if first {
        msg.push_str(
            "\nthe first key: once committed, SSH listens (tunnel and LAN side); `show status` gives the host key's fingerprint to check on the first login",
        );
    }
    Ok(msg)
}

/// `delete system ssh-key NAME`.
pub fn delete_ssh_key(cfg: &mut Config, name: &str) -> EditResult {
    let keys = &mut cfg.gateway.ssh_keys;
    let Some(i) = keys.iter().position(|k| k.name == name) else {
        let have: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        return Err(if have.is_empty() {
            format!("no SSH key named {}: none is set", v::short(name))
        } else {
            format!(
                "no SSH key named {}: set are {}",
                v::short(name),
                have.join(", ")
            )
        });
    };
    keys.remove(i);
    Ok(if keys.is_empty() {
        format!("SSH key {name} deleted: it was the last, SSH stops listening once committed")
    } else {
        format!("SSH key {name} deleted")
    })
}

const SECTIONS: &[&str] = &["interface", "peer", "gateway", "system"];
/// `delete` also takes `client NAME`.
const DELETE_SECTIONS: &str = "interface, peer, client, gateway, system";

fn words(t: &[(&str, &str, &str)]) -> String {
    t.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
}

fn unknown(word: &str, after: &str, valid: &str) -> String {
    format!(
        "unknown word `{}` after `{after}`: expected one of {valid}",
        v::short(word)
    )
}

fn missing(after: &str, valid: &str) -> String {
    format!("`{after}` needs more: expected one of {valid}")
}

/// Parse one command line. Errors say what was expected.
pub fn parse(line: &str) -> Result<Command, String> {
    let toks: Vec<&str> = line.split_whitespace().collect();
    let Some((&first, rest)) = toks.split_first() else {
        return Err("empty line".into());
    };
    let owned = || rest.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let no_args = |c: Command| {
        if rest.is_empty() {
            Ok(c)
        } else {
            Err(format!(
                "`{first}` takes no arguments (got `{}`)",
                v::short(&rest.join(" "))
            ))
        }
    };
    match first.to_ascii_lowercase().as_str() {
        "help" | "?" => Ok(Command::Help(owned())),
        "show" => parse_show(rest),
        "set" => Ok(Command::Set(owned())),
        "add" => match rest {
            ["client", name, opts @ ..] => {
                let mut keep_key = false;
                let mut tunnel = Tunnel::Split;
                // `access LIST` comes last: its list has spaces (`10.0.0.0/8 tcp 22`).
                let (opts, access) = match opts.iter().position(|w| *w == "access") {
                    Some(i) if i + 1 == opts.len() => {
                        return Err("`access` needs a list: lan, internet, clients, appliance, prefixes (`192.168.1.10/32 tcp 8096`), or none".into())
                    }
                    Some(i) => (&opts[..i], Some(v::access(&opts[i + 1..].join(" "))?)),
                    None => (opts, None),
                };
                for (i, w) in opts.iter().enumerate() {
                    if opts[..i].contains(w) {
                        return Err(format!("`{w}` is given twice"));
                    }
                    match *w {
                        "keep-key" => keep_key = true,
                        "full-tunnel" => tunnel = Tunnel::Full,
                        _ => {
                            return Err(unknown(
                                w,
                                "add client NAME",
                                "full-tunnel, keep-key, access LIST",
                            ))
                        }
                    }
                }
                Ok(Command::AddClient {
                    name: (*name).to_string(),
                    keep_key,
                    tunnel,
                    access,
                })
            }
            ["client"] | [] => Err(
                "usage: add client NAME [full-tunnel] [keep-key] [access LIST] (NAME: e.g. phone)"
                    .into(),
            ),
            [w, ..] => Err(unknown(w, "add", "client")),
        },
        "disable" | "enable" => {
            let enabled = first.eq_ignore_ascii_case("enable");
            match rest {
                ["client", name] => Ok(Command::EnableClient {
                    name: (*name).to_string(),
                    enabled,
                }),
                ["client", _, w, ..] => Err(format!(
                    "`{first} client NAME` takes nothing more; unexpected `{}`",
                    v::short(w)
                )),
                ["client"] | [] => Err(format!(
                    "usage: {first} client NAME (`show clients` lists them)"
                )),
                [w, ..] => Err(unknown(w, first, "client")),
            }
        }
        "delete" => Ok(Command::Delete(owned())),
        "compare" => no_args(Command::Compare),
        "commit" => no_args(Command::Commit),
        "commit-confirm" => match rest {
            [m] => Ok(Command::CommitConfirm(v::number(
                m,
                "number of minutes",
                1,
                1440,
            )?)),
            _ => Err("usage: commit-confirm MINUTES (1 to 1440)".into()),
        },
        "confirm" => no_args(Command::Confirm),
        "discard" => no_args(Command::Discard),
        "rollback" => match rest {
            [n] => Ok(Command::Rollback(v::number(
                n,
                "version",
                0,
                super::store::KEEP,
            )?)),
            _ => Err(format!(
                "usage: rollback N (1 to {}; see `show history`)",
                super::store::KEEP
            )),
        },
        "save" => no_args(Command::Save),
        "genkey" => no_args(Command::Genkey),
        "pubkey" => no_args(Command::Pubkey),
        "export" | "import" => match rest {
            ["configuration"] if first.eq_ignore_ascii_case("export") => {
                Ok(Command::Export { to_usb: false })
            }
            ["configuration", to, usb]
                if first.eq_ignore_ascii_case("export")
                    && to.eq_ignore_ascii_case("to")
                    && usb.eq_ignore_ascii_case("usb") =>
            {
                Ok(Command::Export { to_usb: true })
            }
            ["configuration"] => Ok(Command::Import),
            ["configuration", from, usb, file @ ..]
                if first.eq_ignore_ascii_case("import")
                    && from.eq_ignore_ascii_case("from")
                    && usb.eq_ignore_ascii_case("usb") =>
            {
                match file {
                    [] => Ok(Command::ImportUsb { file: None }),
                    [f] => Ok(Command::ImportUsb {
                        file: Some((*f).to_string()),
                    }),
                    _ => Err("usage: import configuration from usb [FILE] (one plain file name)".into()),
                }
            }
            ["configuration", ..] if first.eq_ignore_ascii_case("export") => {
                Err("usage: export configuration [to usb]".into())
            }
            ["configuration", ..] => {
                Err("usage: import configuration [from usb [FILE]]".into())
            }
            [] => Err(format!("`{first}` needs what: {first} configuration")),
            [w, ..] => Err(unknown(w, first, "configuration")),
        },
        "factory-reset" => match rest {
            [] => Ok(Command::FactoryReset {
                erase_history: false,
            }),
            ["erase-history"] => Ok(Command::FactoryReset {
                erase_history: true,
            }),
            [w, ..] => Err(unknown(w, "factory-reset", "erase-history")),
        },
        "reboot" => no_args(Command::Reboot),
        "rollback-slot" => no_args(Command::RollbackSlot),
        // A source is never taken for an option of `riceguard update`.
        "update" if rest.iter().any(|w| w.starts_with('-')) => Err(
            "usage: update SOURCE [allow-downgrade] (a SOURCE does not start with `-`)".into(),
        ),
        "update" => match rest {
            [src] if *src != "allow-downgrade" => Ok(Command::Update {
                source: (*src).to_string(),
                allow_downgrade: false,
            }),
            [src, "allow-downgrade"] | ["allow-downgrade", src] if *src != "allow-downgrade" => {
                Ok(Command::Update {
                    source: (*src).to_string(),
                    allow_downgrade: true,
                })
            }
            _ => Err("usage: update SOURCE [allow-downgrade] (SOURCE: http://HOST[:PORT]/PATH or a bundle file path)".into()),
        },
        "exit" | "quit" => match rest {
            [] => Ok(Command::Exit { discard: false }),
            ["discard"] => Ok(Command::Exit { discard: true }),
            [w, ..] => Err(unknown(w, first, "discard")),
        },
        _ => Err(format!(
            "unknown command `{}`: expected one of {} (`help` explains them)",
            v::short(first),
            words(COMMANDS)
        )),
    }
}

/// How many events `show log` lists without a number, and at most.
pub const LOG_DEFAULT: usize = 20;
pub const LOG_MAX: usize = 5000;

fn parse_log(rest: &[&str]) -> Result<Command, String> {
    let usage =
        || format!("usage: show log [N] [peer NAME] (N: 1 to {LOG_MAX}, default {LOG_DEFAULT})");
    let (n, rest) = match rest.first().map(|w| w.parse::<usize>()) {
        Some(Ok(n)) if (1..=LOG_MAX).contains(&n) => (n, &rest[1..]),
        Some(Ok(_)) => return Err(usage()),
        _ => (LOG_DEFAULT, rest),
    };
    let peer = match rest {
        [] => None,
        ["peer", name] => Some(v::peer_name(name).map_err(|e| e.to_string())?),
        _ => return Err(usage()),
    };
    Ok(Command::ShowLog { n, peer })
}

fn parse_show(rest: &[&str]) -> Result<Command, String> {
    match rest {
        ["log", more @ ..] => return parse_log(more),
        ["client", name, opts @ ..] => {
            let tunnel = match opts {
                [] => Tunnel::Split,
                ["full-tunnel"] => Tunnel::Full,
                ["full-tunnel", w, ..] => {
                    return Err(format!(
                        "`show client NAME full-tunnel` takes nothing more; unexpected `{}`",
                        v::short(w)
                    ))
                }
                [w, ..] => return Err(unknown(w, "show client NAME", "full-tunnel")),
            };
            return Ok(Command::ShowClient {
                name: (*name).to_string(),
                tunnel,
            });
        }
        ["client"] => {
            return Err("usage: show client NAME [full-tunnel] (`show clients` lists them)".into())
        }
        _ => {}
    }
    let mut what = Show::Running;
    let mut private = false;
    for (i, w) in rest.iter().enumerate() {
        match (*w, i) {
            ("private", _) => private = true,
            ("running" | "configuration", 0) => what = Show::Running,
            ("candidate", 0) => what = Show::Candidate,
            ("peers", 0) => what = Show::Peers,
            ("status", 0) => what = Show::Status,
            ("history", 0) => what = Show::History,
            ("clients", 0) => what = Show::Clients,
            _ => {
                return Err(unknown(
                    w,
                    "show",
                    "candidate, peers, status, history, log, clients, client NAME, private",
                ))
            }
        }
    }
    Ok(Command::Show { what, private })
}

fn field_list(t: &[(&str, &str, &str)]) -> String {
    let w = t
        .iter()
        .map(|f| f.0.len() + f.1.len() + 1)
        .max()
        .unwrap_or(0);
    t.iter()
        .map(|(n, a, d)| {
            let g = grammar(n).map(|g| format!(", {g}")).unwrap_or_default();
            format!("    {:<w$}  {d}{g}\n", format!("{n} {a}").trim_end())
        })
        .collect()
}

/// What `help` says of a numeric field's values: the range its parser
/// (`core::value`) accepts and the default the configuration has, read from them.
fn grammar(field: &str) -> Option<String> {
    use crate::core::config::DEFAULT_MTU;
    use crate::core::value::{self, range_text};
    let g = GatewayConfig::default();
    Some(match field {
        "listen-port" | "tcp-port" => range_text(value::PORT_RANGE),
        "ssh-port" => format!("{} (default {})", range_text(value::PORT_RANGE), g.ssh_port),
        "metrics-port" => format!(
            "{} (default {})",
            range_text(value::PORT_RANGE),
            g.metrics_port
        ),
        "mtu" => format!("{} (unset: {DEFAULT_MTU})", range_text(value::MTU_RANGE)),
        "persistent-keepalive" => format!(
            "{} seconds, 0 or off: none",
            range_text(value::KEEPALIVE_RANGE)
        ),
        "buffers" => format!(
            "{} (default {})",
            range_text(value::BUFFERS_RANGE),
            g.buffers
        ),
        "bbr-rtt-ms" => format!(
            "{} (default {})",
            range_text(value::BBR_RTT_MS_RANGE),
            g.bbr_rtt_ms
        ),
        _ => return None,
    })
}

/// The text of `help` (no words) or `help WORD...`.
pub fn help(topic: &[String]) -> Result<String, String> {
    let Some(word) = topic.first() else {
        let w = COMMANDS
            .iter()
            .map(|c| c.0.len() + c.1.len() + 1)
            .max()
            .unwrap_or(0);
        let mut s = String::from("Commands (`help COMMAND` for details):\n");
        for (n, a, d) in COMMANDS {
            s.push_str(&format!("  {:<w$}  {d}\n", format!("{n} {a}").trim_end()));
        }
        s.push_str(
            "\nChanges go to a candidate configuration; `commit` checks, saves and applies it.\n\
             To set up a tunnel: genkey, set interface listen-port 51820,\n\
             set interface address 10.0.0.1/24, set peer PUBKEY allowed-ips 10.0.0.2/32,\n\
             compare, commit; give `pubkey`'s output to the peer.\n\
             For a phone or laptop: add client NAME, then commit (`help add`).\n",
        );
        return Ok(s);
    };
    let w = word.to_ascii_lowercase();
    Ok(match w.as_str() {
        "set" | "delete" => {
            let verb = w.as_str();
            let mut s = format!("{verb} changes the candidate; `commit` applies it.\n\n");
            s.push_str(&format!("  {verb} interface FIELD{}\n", if verb == "set" { " VALUE" } else { " [VALUE]" }));
            s.push_str(&field_list(INTERFACE_FIELDS));
            if verb == "set" {
                s.push_str("  set peer PUBKEY FIELD VALUE   (PUBKEY: the peer's public key, base64; a new key adds a peer)\n");
            } else {
                s.push_str("  delete client NAME            remove the peer named NAME (and its kept key, at commit)\n");
                s.push_str("  delete peer PUBKEY            remove the whole peer\n");
                s.push_str("  delete peer PUBKEY FIELD [VALUE]   remove one setting (allowed-ips CIDR removes one prefix)\n");
            }
            s.push_str(&field_list(PEER_FIELDS));
            s.push_str(&format!("  {verb} gateway FIELD{}   (appliance settings, [Gateway] section)\n", if verb == "set" { " VALUE" } else { "" }));
            s.push_str(&field_list(GATEWAY_FIELDS));
            s.push_str(&format!("  {verb} system FIELD   (takes effect at once, not through commit)\n"));
            s.push_str(&field_list(SYSTEM_FIELDS));
            if verb == "delete" {
                s.push_str("\n`delete interface FIELD` / `delete gateway FIELD` go back to the default.\n");
            }
            s
        }
        "interface" => format!("set interface FIELD VALUE:\n{}", field_list(INTERFACE_FIELDS)),
        "peer" => format!("set peer PUBKEY FIELD VALUE:\n{}", field_list(PEER_FIELDS)),
        "gateway" => format!("set gateway FIELD VALUE:\n{}", field_list(GATEWAY_FIELDS)),
        "system" => format!("set system FIELD / delete system FIELD:\n{}", field_list(SYSTEM_FIELDS)),
        "show" => "show                  running configuration as saved in riceguard.conf (keys hidden)\n\
                   show private          the same with private and preshared keys\n\
                   show candidate [private]  the configuration being edited\n\
                   show peers            live peer state from the running daemon (handshakes, traffic)\n\
                   show status           boot slot, version, uptime, data-plane state\n\
                   show history          the saved versions `rollback N` can load\n\
                   show log [N] [peer NAME]  the last N (20) events kept on perm across reboots:\n\
                   \x20                     commits (which console, which keys), rollbacks, boots, updates\n\
                   show clients          the clients (named peers): address, whether the key was kept,\n\
                   \x20                     disabled ones\n\
                   show client NAME [full-tunnel]  a client's configuration and QR code again (its\n\
                   \x20                     private key only if it was added with keep-key); full-tunnel\n\
                   \x20                     prints it routing everything, as `add client NAME full-tunnel`\n\
                   Lines of riceguard.conf the appliance ignores (wg-quick's PostUp, DNS, ...) are listed\n\
                   at the top of `show` as `# warning:` lines; `commit` writes the file without them.\n"
            .to_string(),
        "add" | "client" | "disable" | "enable" => "add client NAME [full-tunnel] [keep-key] adds a client (a phone, a laptop) to the candidate:\n\
             - the next free address of the tunnel subnet(s) (`set interface address`), IPv4 and IPv6\n\
             - a key pair and a preshared key made here\n\
             - a peer with Name = NAME, AllowedIPs = that address\n\
             and prints the client's wg-quick configuration between BEGIN/END lines, then the same\n\
             as a QR code: scan it with the WireGuard app (\"+\", \"scan from QR code\"). `commit` makes the\n\
             client work. Endpoint is `gateway public-endpoint`, else the uplink's address and the\n\
             listen port; AllowedIPs are the tunnel and LAN subnets; DNS is `gateway client-dns`.\n\
             full-tunnel: AllowedIPs = 0.0.0.0/0, ::/0, so all the client's traffic goes through the\n\
             gateway and out of its uplink, translated; DNS is `gateway client-dns`, else the resolver\n\
             of the uplink's DHCP lease. ::/0 is there even when the tunnel has no IPv6 subnet, so the\n\
             client's IPv6 cannot leak around the tunnel (then IPv6 is blocked inside it; with an\n\
             IPv6 subnet the client gets an address from it and its IPv6 leaves translated too).\n\
             The private key is printed once and not stored, unless keep-key: then it is kept (mode\n\
             0600, in clients/NAME.key on perm) from `commit` on, for `show client NAME`, until the\n\
             client is deleted (`delete client NAME`, `commit`).\n\
             disable client NAME / enable client NAME: the client stays (keys, address, kept key) but\n\
             cannot connect while disabled (`Enabled = off` on its peer); `commit` applies it.\n"
            .to_string(),
        "commit-confirm" | "confirm" => "commit-confirm MINUTES commits like `commit`, then waits. Unless `confirm` (or another\n\
             `commit`) comes within MINUTES, the previous configuration is restored and applied by\n\
             itself: a change that cuts you off undoes itself. A console restarted meanwhile keeps\n\
             the deadline.\n"
            .to_string(),
        "rollback" => "rollback N loads saved version N into the candidate (1 = the configuration before the\n\
             last commit, up to 10; `rollback 0` = the running one). Review with `compare`, apply with\n\
             `commit`.\n"
            .to_string(),
        "save" => "`commit` writes DIR/riceguard.conf itself (atomically, keeping 10 previous versions), so\n\
             `save` has nothing to do; it only says whether uncommitted changes exist.\n"
            .to_string(),
        "update" => "update SOURCE installs a signed update bundle (http://HOST[:PORT]/PATH, a file, or a block\n\
             device) into the slot that is not running; `reboot` then starts it on trial (3 boots to\n\
             become healthy, else the current slot comes back). The whole bundle is checked before\n\
             anything is written: signature, board, arch, configuration schema, sizes, hashes, and\n\
             its build number, which must be newer than the running slot's.\n\
             update SOURCE allow-downgrade installs an older (or the same) build on purpose, e.g. to\n\
             go back to a known release; without it such a bundle is refused, since an old bundle\n\
             is still signed and anyone on a plain-HTTP path could offer one.\n\
             The update runs in the background (stopped after 30 min at most): the console stays\n\
             usable meanwhile (a pending commit-confirm still rolls back on time), `show status`\n\
             shows it, and its report is printed when it ends. `rollback-slot` runs the same way.\n"
            .to_string(),
        "factory-reset" => "factory-reset replaces the configuration with defaults and a freshly generated private\n\
             key, applies it, and removes the console password. The old configuration stays in the\n\
             history (`rollback 1` brings it back). `factory-reset erase-history` deletes the history\n\
             too (for handing the box on). Asks for `yes` first.\n"
            .to_string(),
        _ => match COMMANDS.iter().find(|c| c.0 == w || (w == "quit" && c.0 == "exit")) {
            Some((n, a, d)) => format!("{} — {d}\n", format!("{n} {a}").trim_end()),
            None => return Err(format!("no help for `{}`: expected one of {}", v::short(word), words(COMMANDS))),
        },
    })
}

/// What an edit did, for the user.
pub type EditResult = Result<String, String>;

fn find_peer<'a>(cfg: &'a mut Config, key: &Key) -> Option<&'a mut PeerConfig> {
    cfg.peers.iter_mut().find(|p| p.public_key == *key)
}

fn one_value<'a>(args: &[&'a str], path: &str, expect: &str) -> Result<&'a str, String> {
    match args {
        [v] => Ok(v),
        [] => Err(format!("`{path}` needs a value: {expect}")),
        [_, extra, ..] => Err(format!(
            "`{path}` takes one value; unexpected `{}`",
            v::short(extra)
        )),
    }
}

fn field_arg(t: &[(&str, &str, &str)], name: &str) -> String {
    t.iter()
        .find(|f| f.0 == name)
        .map(|f| f.1.to_string())
        .unwrap_or_default()
}

/// The client named `name` (a peer's `Name`).
fn client_mut<'a>(cfg: &'a mut Config, name: &str) -> Result<&'a mut PeerConfig, String> {
    cfg.peers
        .iter_mut()
        .find(|p| p.name.as_deref() == Some(name))
        .ok_or_else(|| {
            format!(
                "there is no client named {} (see `show clients`)",
                v::short(name)
            )
        })
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, items: Vec<T>) {
    for i in items {
        if !list.contains(&i) {
            list.push(i);
        }
    }
}

/// Apply `set ARGS...` to `cfg`; on error `cfg` is unchanged.
pub fn apply_set(cfg: &mut Config, args: &[String]) -> EditResult {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        [] => Err(missing("set", &SECTIONS.join(", "))),
        ["interface"] => Err(missing("set interface", &words(INTERFACE_FIELDS))),
        ["interface", field, rest @ ..] => {
            let path = format!("set interface {field}");
            let val = || one_value(rest, &path, &field_arg(INTERFACE_FIELDS, field));
            let i = &mut cfg.interface;
            match *field {
                "private-key" => {
                    let k = v::key(val()?, "private key")?;
                    i.private_key = Some(k);
                    return Ok(format!("public key is now {}", k.public().to_base64()));
                }
                "listen-port" => i.listen_port = Some(v::port(val()?, "listen port")?),
                "address" => push_unique(&mut i.addresses, v::cidr_list(val()?)?),
                "mtu" => i.mtu = Some(v::mtu(val()?)?),
                "fwmark" => i.fwmark = v::fwmark(val()?)?,
                w => return Err(unknown(w, "set interface", &words(INTERFACE_FIELDS))),
            }
            Ok(String::new())
        }
        ["peer"] => {
            Err("`set peer` needs the peer's public key: set peer PUBKEY FIELD VALUE".into())
        }
        ["peer", key, rest @ ..] => {
            let k = v::key(key, "peer public key")?;
            let Some((field, rest)) = rest.split_first() else {
                return Err(missing(&format!("set peer {key}"), &words(PEER_FIELDS)));
            };
            let path = format!("set peer ... {field}");
            let joined = rest.join(" ");
            let val = if *field == "access" && !rest.is_empty() {
                Ok(joined.as_str())
            } else {
                one_value(rest, &path, &field_arg(PEER_FIELDS, field))
            };
            let new = find_peer(cfg, &k).is_none();
            if !PEER_FIELDS.iter().any(|f| f.0 == *field) {
                return Err(unknown(field, "set peer PUBKEY", &words(PEER_FIELDS)));
            }
            let val = val?;
            let mut p = find_peer(cfg, &k)
                .cloned()
                .unwrap_or_else(|| PeerConfig::new(k));
            match *field {
                // Stored masked (10.0.0.1/24 -> 10.0.0.0/24), as the kernel, `wg` and the
                // INI reader keep allowed IPs.
                "allowed-ips" => push_unique(&mut p.allowed_ips, v::prefix_list(val)?),
                "endpoint" => p.endpoint = Some(v::endpoint(val)?),
                "persistent-keepalive" => p.persistent_keepalive = v::keepalive(val)?,
                "preshared-key" => p.preshared_key = v::preshared_key(val)?,
                "tcp-port" => p.tcp_port = Some(v::port(val, "TCP port")?),
                "name" => p.name = Some(v::peer_name(val)?),
                "masquerade" => p.masquerade = v::boolean(val, "peer masquerade")?,
                "enabled" => p.enabled = v::boolean(val, "peer enabled")?,
                "access" => p.access = Some(v::access(val)?),
                w => return Err(unknown(w, "set peer PUBKEY", &words(PEER_FIELDS))),
            }
            match find_peer(cfg, &k) {
                Some(slot) => *slot = p,
                None => cfg.peers.push(p),
            }
            Ok(if new {
                "new peer added".into()
            } else {
                String::new()
            })
        }
        ["client"] | ["client", _] => {
            Err("usage: set client NAME access LIST (`show clients` lists them)".into())
        }
        ["client", name, field, rest @ ..] => {
            if *field != "access" {
                return Err(unknown(field, "set client NAME", "access"));
            }
            if rest.is_empty() {
                return Err(format!("`set client {name} access` needs a list: lan, internet, clients, appliance, prefixes (`192.168.1.10/32 tcp 8096`), or none"));
            }
            let a = v::access(&rest.join(" "))?;
            let p = client_mut(cfg, name)?;
            p.access = Some(a);
            Ok(String::new())
        }
        ["gateway"] => Err(missing("set gateway", &words(GATEWAY_FIELDS))),
        ["gateway", field, rest @ ..] => {
            let path = format!("set gateway {field}");
            let val = || one_value(rest, &path, &field_arg(GATEWAY_FIELDS, field));
            let g = &mut cfg.gateway;
            let what = format!("gateway {field}");
            match *field {
                "interface-name" => g.interface_name = v::ifname(val()?, &what)?,
                "cores" => g.cores = v::core_list(val()?)?,
                "io-uring" => g.io_uring = v::boolean(val()?, &what)?,
                "offload" => g.offload = v::offload(val()?)?,
                "tun-offload" => g.tun_offload = v::boolean(val()?, &what)?,
                "hugepages" => g.hugepages = v::boolean(val()?, &what)?,
                "buffers" => g.buffers = v::buffers(val()?)?,
                "tcp-listen" => g.tcp_listen = v::tcp_listen(val()?)?,
                "tcp-fallback" => g.tcp_fallback = v::boolean(val()?, &what)?,
                "bbr-rtt-ms" => g.bbr_rtt_ms = v::bbr_rtt_ms(val()?)?,
                "uplink" => g.uplink = v::ifname(val()?, "uplink interface name")?,
                "uplink-address" => push_unique(&mut g.uplink_addresses, v::cidr_list(val()?)?),
                "uplink-gateway" => g.uplink_gateway = Some(v::ip(val()?, "uplink gateway")?),
                "lan" => g.lan = v::ifname(val()?, "LAN interface name")?,
                "lan-address" => push_unique(&mut g.lan_addresses, v::cidr_list(val()?)?),
                "proxy-arp" => g.proxy_arp = v::boolean(val()?, &what)?,
                "public-endpoint" => g.public_endpoint = Some(v::endpoint(val()?)?),
                "client-dns" => g.client_dns = v::ip_list(val()?, "client DNS server list")?,
                "firewall" => g.firewall = v::boolean(val()?, &what)?,
                "masquerade" => {
                    g.masquerade = v::masquerade(val()?)?;
                    if !g.firewall {
                        return Ok(
                            "note: masquerade takes effect only with `gateway firewall on`".into(),
                        );
                    }
                }
                "ntp" => g.ntp = v::ntp_servers(val()?)?,
                "uplink-overlap" => g.uplink_overlap = v::uplink_overlap(val()?)?,
                "ssh-port" => g.ssh_port = v::port(val()?, "SSH port")?,
                "metrics" => g.metrics = v::boolean(val()?, &what)?,
                "metrics-port" => g.metrics_port = v::port(val()?, "metrics port")?,
                "syslog" => g.syslog = Some(v::syslog(val()?)?),
                "client-isolation" => g.client_isolation = v::boolean(val()?, &what)?,
                "dns" => g.dns = v::ip_list(val()?, "DNS upstream list")?,
                "domain" => g.domain = Some(v::domain(val()?)?),
                w => return Err(unknown(w, "set gateway", &words(GATEWAY_FIELDS))),
            }
            Ok(String::new())
        }
        ["system", ..] => Err("internal: `set system` is handled by the session".into()),
        [w, ..] => Err(unknown(w, "set", &SECTIONS.join(", "))),
    }
}

/// Apply `delete ARGS...` to `cfg`; on error `cfg` is unchanged.
pub fn apply_delete(cfg: &mut Config, args: &[String]) -> EditResult {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let not_set = |what: &str| Err(format!("{what} is not set"));
    match a.as_slice() {
        [] => Err(missing("delete", DELETE_SECTIONS)),
        ["client"] => Err("usage: delete client NAME (`show clients` lists them)".into()),
        ["client", name] => {
            let before = cfg.peers.len();
            cfg.peers.retain(|p| p.name.as_deref() != Some(*name));
            if cfg.peers.len() == before {
                return Err(format!(
                    "there is no client named {} (see `show clients`)",
                    v::short(name)
                ));
            }
            Ok("client removed; `commit` to apply".into())
        }
        ["client", name, "access"] => {
            let p = client_mut(cfg, name)?;
            if p.access.take().is_none() {
                return not_set(&format!("client {name}'s access"));
            }
            Ok("back to the default access".into())
        }
        ["client", _, extra, ..] => Err(format!(
            "`delete client NAME` takes nothing more but `access`; unexpected `{}`",
            v::short(extra)
        )),
        ["interface"] => Err(missing("delete interface", &words(INTERFACE_FIELDS))),
        ["interface", "address"] => {
            cfg.interface.addresses.clear();
            Ok("all interface addresses removed".into())
        }
        ["interface", "address", c] => {
            let c = v::cidr(c)?;
            let before = cfg.interface.addresses.len();
            cfg.interface.addresses.retain(|x| *x != c);
            if cfg.interface.addresses.len() == before {
                return not_set(&format!("interface address {c}"));
            }
            Ok(String::new())
        }
        ["interface", field] => {
            let i = &mut cfg.interface;
            let was_set = match *field {
                "private-key" => i.private_key.take().is_some(),
                "listen-port" => i.listen_port.take().is_some(),
                "mtu" => i.mtu.take().is_some(),
                "fwmark" => i.fwmark.take().is_some(),
                w => return Err(unknown(w, "delete interface", &words(INTERFACE_FIELDS))),
            };
            if was_set {
                Ok(String::new())
            } else {
                not_set(&format!("interface {field}"))
            }
        }
        ["peer"] => {
            Err("`delete peer` needs the peer's public key: delete peer PUBKEY [FIELD]".into())
        }
        ["peer", key, rest @ ..] => {
            let k = v::key(key, "peer public key")?;
            if find_peer(cfg, &k).is_none() {
                return Err(format!(
                    "there is no peer {} (see `show candidate`)",
                    k.to_base64()
                ));
            }
            let Some(p) = find_peer(cfg, &k) else {
                return Err("internal: peer vanished".into());
            };
            let was_set = match rest {
                [] => {
                    cfg.peers.retain(|p| p.public_key != k);
                    return Ok("peer removed".into());
                }
                ["allowed-ips"] => !std::mem::take(&mut p.allowed_ips).is_empty(),
                ["allowed-ips", list] => {
                    let del = v::prefix_list(list)?;
                    for c in &del {
                        if !p.allowed_ips.contains(c) {
                            return not_set(&format!("allowed IP {c} of this peer"));
                        }
                    }
                    p.allowed_ips.retain(|c| !del.contains(c));
                    true
                }
                ["endpoint"] => p.endpoint.take().is_some(),
                ["persistent-keepalive"] => p.persistent_keepalive.take().is_some(),
                ["preshared-key"] => p.preshared_key.take().is_some(),
                ["tcp-port"] => p.tcp_port.take().is_some(),
                ["name"] => p.name.take().is_some(),
                ["masquerade"] => !std::mem::replace(&mut p.masquerade, true),
                ["enabled"] => !std::mem::replace(&mut p.enabled, true),
                ["access"] => p.access.take().is_some(),
                [w, ..] if PEER_FIELDS.iter().any(|f| f.0 == *w) => {
                    return Err(format!(
                        "`delete peer PUBKEY {w}` takes no value (only allowed-ips does)"
                    ))
                }
                [w, ..] => return Err(unknown(w, "delete peer PUBKEY", &words(PEER_FIELDS))),
            };
            if was_set {
                Ok(String::new())
            } else {
                not_set(&format!("peer {}", rest.join(" ")))
            }
        }
        ["gateway"] => Err(missing("delete gateway", &words(GATEWAY_FIELDS))),
        ["gateway", field] => {
            let d = GatewayConfig::default();
            let g = &mut cfg.gateway;
            match *field {
                "interface-name" => g.interface_name = d.interface_name,
                "cores" => g.cores = d.cores,
                "io-uring" => g.io_uring = d.io_uring,
                "offload" => g.offload = OffloadMode::default(),
                "tun-offload" => g.tun_offload = d.tun_offload,
                "hugepages" => g.hugepages = d.hugepages,
                "buffers" => g.buffers = d.buffers,
                "tcp-listen" => g.tcp_listen = d.tcp_listen,
                "tcp-fallback" => g.tcp_fallback = d.tcp_fallback,
                "bbr-rtt-ms" => g.bbr_rtt_ms = d.bbr_rtt_ms,
                "uplink" => g.uplink = d.uplink,
                "uplink-address" => g.uplink_addresses = d.uplink_addresses,
                "uplink-gateway" => g.uplink_gateway = d.uplink_gateway,
                "lan" => g.lan = d.lan,
                "lan-address" => g.lan_addresses = d.lan_addresses,
                "proxy-arp" => g.proxy_arp = d.proxy_arp,
                "public-endpoint" => g.public_endpoint = d.public_endpoint,
                "client-dns" => g.client_dns = d.client_dns,
                "firewall" => g.firewall = d.firewall,
                "masquerade" => g.masquerade = d.masquerade,
                "ntp" => g.ntp = d.ntp,
                "uplink-overlap" => g.uplink_overlap = d.uplink_overlap,
                "ssh-port" => g.ssh_port = d.ssh_port,
                "metrics" => g.metrics = d.metrics,
                "metrics-port" => g.metrics_port = d.metrics_port,
                "syslog" => g.syslog = d.syslog,
                "client-isolation" => g.client_isolation = d.client_isolation,
                "dns" => g.dns = d.dns,
                "domain" => g.domain = d.domain,
                w => return Err(unknown(w, "delete gateway", &words(GATEWAY_FIELDS))),
            }
            Ok("back to the default".into())
        }
        ["gateway", field, extra, ..] => Err(format!(
            "`delete gateway {field}` takes no value; unexpected `{}`",
            v::short(extra)
        )),
        ["interface", field, extra, ..] => Err(format!(
            "`delete interface {field}` takes no value; unexpected `{}`",
            v::short(extra)
        )),
        ["system", ..] => Err("internal: `delete system` is handled by the session".into()),
        [w, ..] => Err(unknown(w, "delete", DELETE_SECTIONS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::MasqueradeMode;

    fn s(words: &str) -> Vec<String> {
        words.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_commands() {
        assert_eq!(parse("commit"), Ok(Command::Commit));
        assert_eq!(parse("  commit-confirm 5 "), Ok(Command::CommitConfirm(5)));
        assert!(parse("commit-confirm 0").is_err());
        assert_eq!(
            parse("show candidate private"),
            Ok(Command::Show {
                what: Show::Candidate,
                private: true
            })
        );
        assert_eq!(
            parse("show private"),
            Ok(Command::Show {
                what: Show::Running,
                private: true
            })
        );
        assert_eq!(parse("rollback 3"), Ok(Command::Rollback(3)));
        assert!(parse("rollback 11").unwrap_err().contains("from 0 to 10"));
        assert_eq!(parse("quit"), Ok(Command::Exit { discard: false }));
        let e = parse("comit").unwrap_err();
        assert!(
            e.contains("commit-confirm") && e.contains("factory-reset"),
            "{e}"
        );
        assert!(parse("show foo").unwrap_err().contains("candidate, peers"));
        assert!(parse("commit now").is_err());
        assert_eq!(
            parse("update http://192.0.2.1/a.bundle"),
            Ok(Command::Update {
                source: "http://192.0.2.1/a.bundle".into(),
                allow_downgrade: false
            })
        );
        for l in [
            "update /dev/vdb allow-downgrade",
            "update allow-downgrade /dev/vdb",
        ] {
            assert_eq!(
                parse(l),
                Ok(Command::Update {
                    source: "/dev/vdb".into(),
                    allow_downgrade: true
                }),
                "{l}"
            );
        }
        for l in [
            "update",
            "update allow-downgrade",
            "update a b",
            "update a allow-downgrade x",
            "update --reboot",
        ] {
            assert!(parse(l).unwrap_err().contains("allow-downgrade"), "{l}");
        }
        assert!(help(&s("update")).unwrap().contains("allow-downgrade"));
    }

    #[test]
    fn help_covers_every_command_and_field() {
        let all = help(&[]).unwrap();
        for (c, _, _) in COMMANDS {
            assert!(all.contains(c), "{c}");
            assert!(help(&[c.to_string()]).is_ok(), "{c}");
        }
        let set = help(&s("set")).unwrap();
        for t in [INTERFACE_FIELDS, PEER_FIELDS, GATEWAY_FIELDS, SYSTEM_FIELDS] {
            for (f, _, _) in t {
                assert!(set.contains(f), "{f}");
            }
        }
        assert!(help(&s("bogus")).is_err());
    }

    #[test]
    fn set_and_delete_edit_the_config() {
        let mut c = Config::default();
        let pk = Key::generate_private(&mut rand_core::OsRng)
            .public()
            .to_base64();
        apply_set(&mut c, &s("interface listen-port 51820")).unwrap();
        apply_set(&mut c, &s("interface address 10.0.0.1/24")).unwrap();
        apply_set(&mut c, &s("interface address 10.0.0.1/24,fd00::1/64")).unwrap();
        assert_eq!(c.interface.addresses.len(), 2);
        assert_eq!(
            apply_set(&mut c, &s(&format!("peer {pk} allowed-ips 10.0.0.2/32"))).unwrap(),
            "new peer added"
        );
        apply_set(&mut c, &s(&format!("peer {pk} endpoint 192.0.2.7:51820"))).unwrap();
        apply_set(&mut c, &s(&format!("peer {pk} persistent-keepalive 25"))).unwrap();
        assert_eq!(c.peers.len(), 1);
        apply_set(&mut c, &s("gateway offload gso")).unwrap();
        apply_set(&mut c, &s("gateway cores 0-1")).unwrap();
        apply_set(&mut c, &s("gateway uplink-gateway 192.0.2.1")).unwrap();
        assert_eq!(c.gateway.offload, OffloadMode::Gso);
        apply_delete(&mut c, &s("gateway offload")).unwrap();
        assert_eq!(c.gateway.offload, OffloadMode::Auto);
        apply_delete(&mut c, &s("interface address 10.0.0.1/24")).unwrap();
        assert_eq!(c.interface.addresses.len(), 1);
        assert!(apply_delete(&mut c, &s("interface address 10.0.0.1/24"))
            .unwrap_err()
            .contains("not set"));
        apply_delete(&mut c, &s(&format!("peer {pk} endpoint"))).unwrap();
        assert!(c.peers[0].endpoint.is_none());
        apply_set(&mut c, &s(&format!("peer {pk} allowed-ips 10.1.2.3/16"))).unwrap();
        assert_eq!(
            c.peers[0].allowed_ips[1].to_string(),
            "10.1.0.0/16",
            "allowed IPs are stored masked"
        );
        apply_delete(
            &mut c,
            &s(&format!("peer {pk} allowed-ips 10.0.0.2/32,10.1.9.9/16")),
        )
        .unwrap();
        assert!(c.peers[0].allowed_ips.is_empty());
        apply_delete(&mut c, &s(&format!("peer {pk}"))).unwrap();
        assert!(c.peers.is_empty());
    }

    #[test]
    fn bad_input_says_what_is_expected() {
        let mut c = Config::default();
        let e = apply_set(&mut c, &s("interface listen-port 70000")).unwrap_err();
        assert!(e.contains("1-65535"), "{e}");
        let e = apply_set(&mut c, &s("interface colour blue")).unwrap_err();
        assert!(
            e.contains("private-key, listen-port, address, mtu, fwmark"),
            "{e}"
        );
        let e = apply_set(&mut c, &s("peer notakey allowed-ips 10.0.0.2/32")).unwrap_err();
        assert!(e.contains("44 characters"), "{e}");
        let pk = Key::generate_private(&mut rand_core::OsRng)
            .public()
            .to_base64();
        let e = apply_set(&mut c, &s(&format!("peer {pk} allowed-ips 10.0.0.300/32"))).unwrap_err();
        assert!(
            e.contains("expected an address with its prefix, e.g."),
            "{e}"
        );
        let e = apply_set(&mut c, &s(&format!("peer {pk} colour"))).unwrap_err();
        assert!(e.contains("allowed-ips, endpoint"), "{e}");
        assert!(apply_set(&mut c, &s("interface mtu"))
            .unwrap_err()
            .contains("needs a value"));
        assert!(apply_set(&mut c, &s("gateway io-uring maybe"))
            .unwrap_err()
            .contains("on or off"));
        assert!(apply_set(&mut c, &s("wibble"))
            .unwrap_err()
            .contains("interface, peer, gateway, system"));
        assert!(apply_delete(&mut c, &s(&format!("peer {pk}")))
            .unwrap_err()
            .contains("no peer"));
    }

    #[test]
    fn client_commands() {
        let add = |n: &str, keep_key, tunnel| {
            Ok(Command::AddClient {
                name: n.into(),
                keep_key,
                tunnel,
                access: None,
            })
        };
        assert_eq!(
            parse("add client phone"),
            add("phone", false, Tunnel::Split)
        );
        assert_eq!(
            parse("add client phone keep-key"),
            add("phone", true, Tunnel::Split)
        );
        assert_eq!(
            parse("add client phone full-tunnel"),
            add("phone", false, Tunnel::Full)
        );
        for l in [
            "add client phone full-tunnel keep-key",
            "add client phone keep-key full-tunnel",
        ] {
            assert_eq!(parse(l), add("phone", true, Tunnel::Full), "{l}");
        }
        let e = parse("add client phone keep-key keep-key").unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let lan = crate::core::access::parse_list("lan, 192.168.1.10/32 tcp 8096").unwrap();
        assert_eq!(
            parse("add client kiosk keep-key access lan, 192.168.1.10/32 tcp 8096"),
            Ok(Command::AddClient {
                name: "kiosk".into(),
                keep_key: true,
                tunnel: Tunnel::Split,
                access: Some(lan.clone()),
            })
        );
        assert!(parse("add client kiosk access")
            .unwrap_err()
            .contains("needs a list"));
        let e = parse("add client kiosk access lan, wan").unwrap_err();
        assert!(e.contains("wan"), "{e}");
        let mut cfg = Config::default();
        let mut kiosk = PeerConfig::new(Key([5; 32]));
        kiosk.name = Some("kiosk".into());
        cfg.peers.push(kiosk);
        let set = |cfg: &mut Config, l: &str| {
            apply_set(
                cfg,
                &l.split_whitespace().map(String::from).collect::<Vec<_>>(),
            )
        };
        set(
            &mut cfg,
            "client kiosk access lan, 192.168.1.10/32 tcp 8096",
        )
        .unwrap();
        assert_eq!(cfg.peers[0].access.as_ref(), Some(&lan));
        let before = cfg.clone();
        assert!(set(&mut cfg, "client kiosk access lan, 10.0.0.0/8 tcp").is_ok());
        cfg = before.clone();
        for bad in [
            "client kiosk access",
            "client kiosk access lan,,internet",
            "client kiosk access 10.0.0.0/8 icmp 3",
            "client nobody access lan",
            "client kiosk name x",
        ] {
            assert!(set(&mut cfg, bad).is_err(), "{bad}");
            assert_eq!(cfg, before, "`set {bad}` changed the configuration");
        }
        set(&mut cfg, "client kiosk access none").unwrap();
        assert_eq!(cfg.peers[0].access, Some(Vec::new()));
        let del = |cfg: &mut Config, l: &str| {
            apply_delete(
                cfg,
                &l.split_whitespace().map(String::from).collect::<Vec<_>>(),
            )
        };
        del(&mut cfg, "client kiosk access").unwrap();
        assert_eq!(cfg.peers[0].access, None);
        assert!(del(&mut cfg, "client kiosk access").is_err(), "not set");
        set(&mut cfg, "gateway client-isolation on").unwrap();
        set(&mut cfg, "gateway dns 192.0.2.53,2001:db8::53").unwrap();
        set(&mut cfg, "gateway domain Office.Example").unwrap();
        assert!(cfg.gateway.client_isolation);
        assert_eq!(cfg.gateway.dns.len(), 2);
        assert_eq!(cfg.gateway.domain_name(), "office.example");
        assert!(set(&mut cfg, "gateway domain a_b").is_err());
        for f in ["client-isolation", "dns", "domain"] {
            del(&mut cfg, &format!("gateway {f}")).unwrap();
        }
        assert_eq!(cfg.gateway, GatewayConfig::default());
        let e = parse("add client phone fulltunnel").unwrap_err();
        assert!(e.contains("full-tunnel, keep-key"), "{e}");
        assert!(parse("add client").unwrap_err().contains("full-tunnel"));
        assert_eq!(
            parse("show client phone full-tunnel"),
            Ok(Command::ShowClient {
                name: "phone".into(),
                tunnel: Tunnel::Full
            })
        );
        assert_eq!(
            parse("show client phone"),
            Ok(Command::ShowClient {
                name: "phone".into(),
                tunnel: Tunnel::Split
            })
        );
        assert!(parse("show client phone split")
            .unwrap_err()
            .contains("full-tunnel"));
        assert!(parse("show client phone full-tunnel x")
            .unwrap_err()
            .contains("nothing more"));
        assert_eq!(
            parse("disable client phone"),
            Ok(Command::EnableClient {
                name: "phone".into(),
                enabled: false
            })
        );
        assert_eq!(
            parse("enable client phone"),
            Ok(Command::EnableClient {
                name: "phone".into(),
                enabled: true
            })
        );
        assert!(parse("disable client").unwrap_err().contains("usage"));
        assert!(parse("enable client a b")
            .unwrap_err()
            .contains("nothing more"));
        assert!(parse("disable peer x").unwrap_err().contains("client"));
        assert!(help(&s("disable")).unwrap().contains("disable client NAME"));
        assert!(help(&s("add")).unwrap().contains("full-tunnel"));
    }

    #[test]
    fn firewall_and_peer_fields() {
        let mut c = Config::default();
        apply_set(&mut c, &s("gateway firewall off")).unwrap();
        assert!(!c.gateway.firewall);
        let note = apply_set(&mut c, &s("gateway masquerade on")).unwrap();
        assert!(note.contains("firewall on"), "{note}");
        assert_eq!(c.gateway.masquerade, MasqueradeMode::On);
        let before = c.clone();
        let e = apply_set(&mut c, &s("gateway masquerade sometimes")).unwrap_err();
        assert!(e.contains("auto, on or off"), "{e}");
        assert!(apply_set(&mut c, &s("gateway firewall maybe")).is_err());
        assert_eq!(c, before, "refused edits change nothing");
        apply_delete(&mut c, &s("gateway firewall")).unwrap();
        apply_delete(&mut c, &s("gateway masquerade")).unwrap();
        assert_eq!(c.gateway, GatewayConfig::default());
        let pk = Key::generate_private(&mut rand_core::OsRng)
            .public()
            .to_base64();
        apply_set(&mut c, &s(&format!("peer {pk} masquerade off"))).unwrap();
        apply_set(&mut c, &s(&format!("peer {pk} enabled off"))).unwrap();
        assert!(!c.peers[0].masquerade && !c.peers[0].enabled);
        apply_delete(&mut c, &s(&format!("peer {pk} enabled"))).unwrap();
        assert!(c.peers[0].enabled);
        assert!(apply_delete(&mut c, &s(&format!("peer {pk} enabled")))
            .unwrap_err()
            .contains("not set"));
        apply_delete(&mut c, &s(&format!("peer {pk} masquerade"))).unwrap();
        assert!(c.peers[0].masquerade);
        assert!(
            apply_delete(&mut c, &s(&format!("peer {pk} masquerade off")))
                .unwrap_err()
                .contains("takes no value")
        );
    }

    /// One grammar: every setting the console can `set` is fed the same table of good and
    /// bad values through `set` and through a configuration file line; both faces accept
    /// exactly the same values, and what they accept gives the same configuration.
    #[test]
    fn console_and_file_accept_the_same_values() {
        use crate::core::ini;
        const PRIV: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        const PEER: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";
        const PSK: &str = "FpCyhws9cxwWoV4xELtfJvjJN+zQVRPISllRWgeopVE=";
        // (section, console field, file key, value, accepted)
        let table: &[(&str, &str, &str, &str, bool)] = &[
            ("interface", "private-key", "PrivateKey", PEER, true),
            ("interface", "private-key", "PrivateKey", "abc", false),
            ("interface", "listen-port", "ListenPort", "51820", true),
            ("interface", "listen-port", "ListenPort", "0", false),
            ("interface", "listen-port", "ListenPort", "65536", false),
            ("interface", "listen-port", "ListenPort", "+1", false),
            (
                "interface",
                "address",
                "Address",
                "10.0.0.1/24,fd00::1/64",
                true,
            ),
            ("interface", "address", "Address", "10.0.0.1/24,", true),
            ("interface", "address", "Address", "10.0.0.300/24", false),
            ("interface", "mtu", "MTU", "1420", true),
            ("interface", "mtu", "MTU", "9601", true),
            ("interface", "mtu", "MTU", "575", false),
            ("interface", "mtu", "MTU", "65536", false),
            ("interface", "fwmark", "FwMark", "0x10", true),
            ("interface", "fwmark", "FwMark", "0", true),
            ("interface", "fwmark", "FwMark", "off", true),
            ("interface", "fwmark", "FwMark", "0x", false),
            ("interface", "fwmark", "FwMark", "-1", false),
            (
                "peer",
                "allowed-ips",
                "AllowedIPs",
                "10.0.1.7/24,fd01::/64",
                true,
            ),
            ("peer", "allowed-ips", "AllowedIPs", "10.0.1.0/33", false),
            ("peer", "endpoint", "Endpoint", "192.0.2.7:51820", true),
            ("peer", "endpoint", "Endpoint", "[2001:db8::7]:51820", true),
            (
                "peer",
                "endpoint",
                "Endpoint",
                "vpn.example.com:51820",
                true,
            ),
            ("peer", "endpoint", "Endpoint", "host:0", false),
            ("peer", "endpoint", "Endpoint", "192.0.2.7", false),
            (
                "peer",
                "persistent-keepalive",
                "PersistentKeepalive",
                "25",
                true,
            ),
            (
                "peer",
                "persistent-keepalive",
                "PersistentKeepalive",
                "0",
                true,
            ),
            (
                "peer",
                "persistent-keepalive",
                "PersistentKeepalive",
                "off",
                true,
            ),
            (
                "peer",
                "persistent-keepalive",
                "PersistentKeepalive",
                "70000",
                false,
            ),
            ("peer", "preshared-key", "PresharedKey", PSK, true),
            ("peer", "preshared-key", "PresharedKey", "abc", false),
            ("peer", "tcp-port", "TcpPort", "443", true),
            ("peer", "tcp-port", "TcpPort", "0", false),
            ("peer", "name", "Name", "phone", true),
            ("peer", "name", "Name", ".hidden", false),
            ("peer", "masquerade", "Masquerade", "off", true),
            ("peer", "masquerade", "Masquerade", "yes", true),
            ("peer", "masquerade", "Masquerade", "enable", false),
            ("peer", "enabled", "Enabled", "off", true),
            ("peer", "enabled", "Enabled", "1", false),
            ("gateway", "interface-name", "InterfaceName", "wg1", true),
            ("gateway", "interface-name", "InterfaceName", "a/b", false),
            ("gateway", "cores", "Cores", "1,0", true),
            ("gateway", "cores", "Cores", "0-2", true),
            ("gateway", "cores", "Cores", "all", true),
            ("gateway", "cores", "Cores", "0-2,1", false),
            ("gateway", "cores", "Cores", "3-1", false),
            ("gateway", "cores", "Cores", "4096", false),
            ("gateway", "io-uring", "IoUring", "off", true),
            ("gateway", "io-uring", "IoUring", "maybe", false),
            ("gateway", "offload", "Offload", "gso", true),
            ("gateway", "offload", "Offload", "fast", false),
            ("gateway", "tun-offload", "TunOffload", "off", true),
            ("gateway", "hugepages", "HugePages", "no", true),
            ("gateway", "hugepages", "HugePages", "0", false),
            ("gateway", "buffers", "Buffers", "32", true),
            ("gateway", "buffers", "Buffers", "0", false),
            ("gateway", "buffers", "Buffers", "2000000", false),
            ("gateway", "tcp-listen", "TcpListen", "443,8443", true),
            ("gateway", "tcp-listen", "TcpListen", "off", true),
            ("gateway", "tcp-listen", "TcpListen", "443,443", false),
            ("gateway", "tcp-fallback", "TcpFallback", "on", true),
            ("gateway", "bbr-rtt-ms", "BbrRttMs", "0", true),
            ("gateway", "bbr-rtt-ms", "BbrRttMs", "100000", true),
            ("gateway", "bbr-rtt-ms", "BbrRttMs", "-5", false),
            ("gateway", "uplink", "Uplink", "eth0", true),
            ("gateway", "uplink", "Uplink", "eth/0", false),
            (
                "gateway",
                "uplink-address",
                "UplinkAddress",
                "192.0.2.2/24",
                true,
            ),
            (
                "gateway",
                "uplink-address",
                "UplinkAddress",
                "192.0.2.2",
                true,
            ),
            (
                "gateway",
                "uplink-address",
                "UplinkAddress",
                "192.0.2.2/40",
                false,
            ),
            (
                "gateway",
                "uplink-gateway",
                "UplinkGateway",
                "192.0.2.1",
                true,
            ),
            ("gateway", "uplink-gateway", "UplinkGateway", "x", false),
            ("gateway", "lan", "Lan", "eth1", true),
            (
                "gateway",
                "lan-address",
                "LanAddress",
                "192.168.50.1/24",
                true,
            ),
            (
                "gateway",
                "lan-address",
                "LanAddress",
                "192.168.50.300/24",
                false,
            ),
            ("gateway", "proxy-arp", "ProxyArp", "off", true),
            (
                "gateway",
                "public-endpoint",
                "PublicEndpoint",
                "203.0.113.1:51820",
                true,
            ),
            (
                "gateway",
                "public-endpoint",
                "PublicEndpoint",
                "203.0.113.1:0",
                false,
            ),
            (
                "gateway",
                "client-dns",
                "ClientDns",
                "192.168.1.1,fd00::1",
                true,
            ),
            (
                "gateway",
                "client-dns",
                "ClientDns",
                "1.1.1.1,1.1.1.1",
                false,
            ),
            ("gateway", "client-dns", "ClientDns", "nine", false),
            ("gateway", "firewall", "Firewall", "off", true),
            ("gateway", "firewall", "Firewall", "enable", false),
            ("gateway", "masquerade", "Masquerade", "auto", true),
            ("gateway", "masquerade", "Masquerade", "sometimes", false),
            (
                "gateway",
                "ntp",
                "Ntp",
                "192.0.2.1,pool.example.net:1123",
                true,
            ),
            ("gateway", "ntp", "Ntp", "192.0.2.1,192.0.2.1", false),
            ("gateway", "uplink-overlap", "UplinkOverlap", "refuse", true),
            ("gateway", "uplink-overlap", "UplinkOverlap", "never", false),
            ("gateway", "ssh-port", "SshPort", "2222", true),
            ("gateway", "ssh-port", "SshPort", "0", false),
            ("gateway", "ssh-port", "SshPort", "ssh", false),
            ("gateway", "metrics", "Metrics", "on", true),
            ("gateway", "metrics", "Metrics", "sometimes", false),
            ("gateway", "metrics-port", "MetricsPort", "9100", true),
            ("gateway", "metrics-port", "MetricsPort", "70000", false),
            ("gateway", "syslog", "Syslog", "192.0.2.9:1514/tcp", true),
            ("gateway", "syslog", "Syslog", "logs.example.net", true),
            ("gateway", "syslog", "Syslog", "192.0.2.9/sctp", false),
            ("peer", "access", "Access", "lan,192.168.1.10/32", true),
            ("peer", "access", "Access", "none", true),
            ("peer", "access", "Access", "lan,wan", false),
            ("gateway", "client-isolation", "ClientIsolation", "on", true),
            (
                "gateway",
                "client-isolation",
                "ClientIsolation",
                "maybe",
                false,
            ),
            ("gateway", "dns", "Dns", "192.0.2.53,2001:db8::53", true),
            ("gateway", "dns", "Dns", "192.0.2.53,192.0.2.53", false),
            ("gateway", "domain", "Domain", "office.example", true),
            ("gateway", "domain", "Domain", "a_b.example", false),
        ];
        // Every field the console can set is in the table.
        for (section, fields) in [
            ("interface", INTERFACE_FIELDS),
            ("peer", PEER_FIELDS),
            ("gateway", GATEWAY_FIELDS),
        ] {
            for f in fields {
                assert!(
                    table.iter().any(|r| r.0 == section && r.1 == f.0),
                    "set {section} {} is not in the table",
                    f.0
                );
            }
        }
        let file = |iface: &str, peer: &str, gw: &str| {
            format!(
                "[Interface]\nPrivateKey = {PRIV}\n{iface}[Peer]\nPublicKey = {PEER}\nAllowedIPs = 10.9.0.2/32\n{peer}[Gateway]\n{gw}"
            )
        };
        let base = ini::parse("base.conf", &file("", "", "")).expect("base file");
        for &(section, field, key, value, good) in table {
            let line = format!("{key} = {value}\n");
            let text = match section {
                // A key given once per section takes the base's place.
                "interface" if key == "PrivateKey" => {
                    file("", "", "").replace(&format!("PrivateKey = {PRIV}\n"), &line)
                }
                "interface" => file(&line, "", ""),
                "peer" => file("", &line, ""),
                _ => file("", "", &line),
            };
            let from_file = ini::parse("t.conf", &text);
            let mut c = base.clone();
            let words = match section {
                "peer" => format!("peer {PEER} {field} {value}"),
                _ => format!("{section} {field} {value}"),
            };
            let from_console = apply_set(&mut c, &s(&words)).map(|_| c);
            match (&from_file, &from_console) {
                (Ok(f), Ok(c)) => {
                    assert!(
                        good,
                        "`{key} = {value}` and `set {words}` both accepted a bad value"
                    );
                    assert_eq!(
                        f, c,
                        "`{key} = {value}` and `set {words}` disagree on the result"
                    );
                }
                (Err(_), Err(_)) => assert!(!good, "`{key} = {value}` refused by both faces"),
                (f, c) => panic!(
                    "`{key} = {value}`: the file says {:?}, `set {words}` says {:?}",
                    f.as_ref().err().map(ToString::to_string),
                    c.as_ref().err()
                ),
            }
        }
    }
}

/// `help set` says what the parsers accept (issue 30: it said MTU 576-9600 and buffers
/// 64-1048576, default 4096, while the grammar took 576-65535 and 1-1048576, default
/// 1024): for each numeric field, the range in the help is the one whose ends `set`
/// takes and past whose ends `set` refuses, naming that same range.
#[cfg(test)]
mod help_from_grammar {
    use super::*;
    use crate::core::config::PeerConfig;

    fn s(words: &str) -> Vec<String> {
        words.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn help_ranges_are_the_parsers() {
        let key = Key([7; 32]).to_base64();
        let mut base = Config::default();
        base.peers
            .push(PeerConfig::new(Key::from_base64(&key).unwrap()));
        let cases: [(&str, &str, u64, u64); 6] = [
            ("interface", "listen-port", 1, 65535),
            ("interface", "mtu", 576, 65535),
            ("peer", "persistent-keepalive", 0, 65535),
            ("peer", "tcp-port", 1, 65535),
            ("gateway", "buffers", 1, 1048576),
            ("gateway", "bbr-rtt-ms", 0, 4294967295),
        ];
        for (section, field, lo, hi) in cases {
            let help_text = help(&s(&format!("set {section}"))).unwrap();
            let line = help_text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{field} ")))
                .unwrap_or_else(|| panic!("no help line for {field}"));
            let range = format!("{lo}-{hi}");
            assert!(line.contains(&range), "{line}");
            let set = |v: u64| {
                let target = if section == "peer" {
                    format!("peer {key}")
                } else {
                    section.to_string()
                };
                let mut c = base.clone();
                apply_set(&mut c, &s(&format!("{target} {field} {v}")))
            };
            assert!(set(lo).is_ok() && set(hi).is_ok(), "{field} {lo} {hi}");
            let e = set(hi + 1).unwrap_err();
            assert!(e.contains(&range), "{field}: {e}");
            if lo > 0 {
                assert!(set(lo - 1).unwrap_err().contains(&range), "{field}");
            }
        }
        let g = help(&s("set gateway")).unwrap();
        assert!(g.contains("1-1048576 (default 1024)"), "{g}");
        assert!(help(&s("set interface"))
            .unwrap()
            .contains("576-65535 (unset: 1420)"));
    }
}
