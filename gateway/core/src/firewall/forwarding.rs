//! Whether the appliance may forward: only while the kernel's table `inet riceguard` is
//! the one computed for the running configuration and ports, or the firewall is off by
//! choice (fail closed).
//!
//! A table merely named `riceguard` proves nothing: after a restart with another
//! `InterfaceName` or `Lan`, or a reload with new peers, a table left by the run before
//! judges the old interfaces and prefixes, and would let the new ones through. So every
//! table we install carries, as its comment (nft's `comment "..."`), a fingerprint of
//! the [`Ruleset`] it was made from ([`tag`]); [`forwarding`] compares what the kernel
//! holds with the fingerprint of what the configuration asks for now.

use std::fmt;
use std::hash::{Hash, Hasher};

use super::Ruleset;

/// What every tag starts with (so `nft list` says whose comment it is).
pub const TAG_PREFIX: &str = "riceguard ruleset ";

/// The table comment naming `rs`: [`TAG_PREFIX`] and 16 hex digits of a 64-bit FNV-1a
/// hash over the whole ruleset (table, counters, chains, rules and their comments, maps
/// and their elements). Two rulesets with the same tag are taken to be the same table.
/// The hash is fed by the derived `Hash` of the rule types, so another build may tag the
/// same ruleset differently: that only costs a reinstall (and, if that fails, forwarding
/// stays off).
pub fn tag(rs: &Ruleset) -> String {
    let mut h = Fnv1a64::default();
    rs.hash(&mut h);
    format!("{TAG_PREFIX}{:016x}", h.finish())
}

/// FNV-1a, 64 bits: small, no key, the same output for the same bytes on every run
/// (std's `DefaultHasher` promises that only within one process).
struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a64 {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The table `inet riceguard` as the kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Installed {
    /// No such table.
    Absent,
    /// The table is there, with this comment (`None`: none, e.g. made by an older
    /// version or by hand).
    Present { comment: Option<String> },
    /// It could not be read (the error, as said to the user).
    Unreadable(String),
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// Forwarding may be on.
    On,
    /// Forwarding must be off, for this reason.
    Off(NotForwarding),
}

/// Why forwarding is off.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotForwarding {
    /// No table of ours is in place.
    NoTable,
    /// A table named `riceguard` is there but was made for another configuration or
    /// other ports (a run before this one, an earlier reload): its tag, if any.
    Stale { found: Option<String> },
    /// The kernel's table could not be read.
    Unreadable(String),
}

impl fmt::Display for NotForwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotForwarding::NoTable => write!(f, "no table inet {} in place", super::TABLE),
            NotForwarding::Stale { found: Some(t) } => write!(
                f,
                "table inet {} in place is not the one for this configuration \
                 (it is \"{t}\", left by an earlier run or configuration)",
                super::TABLE
            ),
            NotForwarding::Stale { found: None } => write!(
                f,
                "table inet {} in place is not the one for this configuration \
                 (it carries no riceguard tag)",
                super::TABLE
            ),
            NotForwarding::Unreadable(e) => {
                write!(f, "table inet {} cannot be read ({e})", super::TABLE)
            }
        }
    }
}

/// Whether to forward. `want`: the [`tag`] of the ruleset the running configuration
/// asks for over the ports as they are now, `None` when `Firewall = off` (forwarding is
/// on, nothing filtered, whatever table may still be there). `kernel`: what is
/// installed. Forwarding is on only while the kernel's table carries exactly `want`.
pub fn forwarding(want: Option<&str>, kernel: &Installed) -> Forwarding {
    let Some(want) = want else {
        return Forwarding::On;
    };
    match kernel {
        Installed::Present { comment } if comment.as_deref() == Some(want) => Forwarding::On,
        Installed::Present { comment } => Forwarding::Off(NotForwarding::Stale {
            found: comment.clone(),
        }),
        Installed::Absent => Forwarding::Off(NotForwarding::NoTable),
        Installed::Unreadable(e) => Forwarding::Off(NotForwarding::Unreadable(e.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, PeerConfig};
    use crate::firewall::{ruleset, Ports};
    use crate::key::Key;

    fn cfg() -> Config {
        let mut cfg = Config::default();
        cfg.interface.listen_port = Some(51820);
        cfg.interface.addresses = vec!["10.100.0.1/24".parse().unwrap()];
        cfg.peers = vec![PeerConfig {
            allowed_ips: vec!["10.100.0.2/32".parse().unwrap()],
            ..PeerConfig::new(Key([1; 32]))
        }];
        cfg
    }

    fn ports(tunnel: &str, lan: Option<&str>) -> Ports {
        Ports {
            tunnel: tunnel.into(),
            lan: lan.map(String::from),
            uplink_nets: vec!["192.168.1.0/24".parse().unwrap()],
            uplink_addrs: Vec::new(),
            lan_nets: Vec::new(),
            listen_port: Some(51820),
        }
    }

    fn present(t: &str) -> Installed {
        Installed::Present {
            comment: Some(t.into()),
        }
    }

    #[test]
    fn the_tag_is_stable_and_follows_what_the_table_judges() {
        let a = tag(&ruleset(&cfg(), &ports("wga", None)));
        assert!(
            a.starts_with(TAG_PREFIX) && a.len() == TAG_PREFIX.len() + 16,
            "{a}"
        );
        // The same configuration and ports: the same tag, on every computation.
        assert_eq!(a, tag(&ruleset(&cfg(), &ports("wga", None))));
        // Another tunnel name, a LAN port, another uplink subnet, another peer: another tag.
        let others = [
            tag(&ruleset(&cfg(), &ports("wgb", None))),
            tag(&ruleset(&cfg(), &ports("wga", Some("lanp")))),
            tag(&ruleset(&cfg(), &{
                let mut p = ports("wga", None);
                p.uplink_nets = vec!["192.168.2.0/24".parse().unwrap()];
                p
            })),
            tag(&ruleset(
                &{
                    let mut c = cfg();
                    c.peers.push(PeerConfig {
                        allowed_ips: vec!["10.66.0.0/24".parse().unwrap()],
                        ..PeerConfig::new(Key([2; 32]))
                    });
                    c
                },
                &ports("wga", None),
            )),
        ];
        for o in &others {
            assert_ne!(&a, o);
        }
        // Fits libnftnl's table comment (128 bytes with the NUL).
        assert!(a.len() < 128);
    }

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        let h = |s: &[u8]| {
            let mut f = Fnv1a64::default();
            f.write(s);
            f.finish()
        };
        assert_eq!(h(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn forwarding_only_while_the_matching_table_is_in_place() {
        let a = tag(&ruleset(&cfg(), &ports("wga", None)));
        let b = tag(&ruleset(&cfg(), &ports("wgb", None)));
        // The table for the running configuration: on.
        assert_eq!(forwarding(Some(&b), &present(&b)), Forwarding::On);
        // The case: restarted as wgb, the install failed, wga's table stayed.
        let f = forwarding(Some(&b), &present(&a));
        assert_eq!(
            f,
            Forwarding::Off(NotForwarding::Stale {
                found: Some(a.clone())
            })
        );
        let Forwarding::Off(why) = f else {
            unreachable!()
        };
        let said = why.to_string();
        assert!(
            said.contains("not the one for this configuration"),
            "{said}"
        );
        assert!(said.contains(&a), "{said}");
        // A table without our tag (an older version's, or made by hand): off.
        assert_eq!(
            forwarding(Some(&b), &Installed::Present { comment: None }),
            Forwarding::Off(NotForwarding::Stale { found: None })
        );
        assert_eq!(
            forwarding(Some(&b), &present("a comment of someone else")),
            Forwarding::Off(NotForwarding::Stale {
                found: Some("a comment of someone else".into())
            })
        );
        // No table, or one that cannot be read: off.
        assert_eq!(
            forwarding(Some(&b), &Installed::Absent),
            Forwarding::Off(NotForwarding::NoTable)
        );
        assert_eq!(
            forwarding(Some(&b), &Installed::Unreadable("EPERM".into())),
            Forwarding::Off(NotForwarding::Unreadable("EPERM".into()))
        );
        // Firewall = off: forwarding on whatever is there.
        for k in [
            Installed::Absent,
            present(&a),
            Installed::Unreadable("x".into()),
        ] {
            assert_eq!(forwarding(None, &k), Forwarding::On);
        }
    }
}
