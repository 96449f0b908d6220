//! No remote lock-out: what an SSH session depends on, so a plain `commit` that could
//! cut it is refused ("use commit-confirm N", which rolls back by itself at its deadline
//! if the operator cannot reach the box again), and the edits that would lock every
//! remote operator out for good (the last SSH key, `factory-reset`) are refused over SSH
//! altogether: those belong to the serial console, where nothing is cut.

use std::net::IpAddr;

use crate::core::config::{Config, PeerConfig};

/// The SSH session a console serves: the key it logged in with and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    pub key_name: String,
    pub source: IpAddr,
}

impl Remote {
    /// The enabled peer of `cfg` whose allowed IPs hold this session's source: the
    /// session comes through the tunnel from it. A `/0` says nothing about who it is.
    pub fn peer<'a>(&self, cfg: &'a Config) -> Option<&'a PeerConfig> {
        let src = self.source.to_canonical();
        cfg.peers.iter().filter(|p| p.enabled).find(|p| {
            p.allowed_ips
                .iter()
                .any(|c| c.prefix > 0 && c.network().contains(src))
        })
    }
}

/// What `candidate` changes, against `running`, of what the session `r` depends on: a
/// phrase each (empty: a plain commit cannot cut it).
pub fn risks(running: &Config, candidate: &Config, r: &Remote) -> Vec<String> {
    let (g0, g1) = (&running.gateway, &candidate.gateway);
    let mut v = Vec::new();
    if g0.ssh_keys != g1.ssh_keys || g0.ssh_port != g1.ssh_port {
        v.push("the SSH keys or port".to_string());
    }
    if running.interface.private_key != candidate.interface.private_key
        || running.interface.addresses != candidate.interface.addresses
    {
        v.push("the interface's private key or Address".into());
    }
    if let Some(p) = r.peer(running) {
        let who = p.name.clone().unwrap_or_else(|| p.public_key.to_base64());
        match candidate
            .peers
            .iter()
            .find(|c| c.public_key == p.public_key)
        {
            None => v.push(format!("deletes this session's peer {who}")),
            Some(c) if !c.enabled => v.push(format!("disables this session's peer {who}")),
            Some(c) if c.allowed_ips != p.allowed_ips => {
                v.push(format!("the AllowedIPs of this session's peer {who}"))
            }
            // Its own Access, or ClientIsolation when it has none: what it may reach
            // (the appliance's SSH among it) changes.
            Some(c) if c.access_under(&candidate.gateway) != p.access_under(&running.gateway) => {
                v.push(format!("the Access of this session's peer {who}"))
            }
            Some(_) => {}
        }
    }
    if g0.uplink != g1.uplink
        || g0.uplink_addresses != g1.uplink_addresses
        || g0.uplink_gateway != g1.uplink_gateway
        || g0.lan != g1.lan
        || g0.lan_addresses != g1.lan_addresses
    {
        v.push("Uplink or Lan or their addresses".into());
    }
    if g0.firewall != g1.firewall {
        v.push("Firewall".into());
    }
    v
}

/// Why a commit of `candidate` is refused over SSH whatever the command: it leaves no
/// SSH key while keys are set now.
pub fn locks_out(running: &Config, candidate: &Config) -> Option<String> {
    (!running.gateway.ssh_keys.is_empty() && candidate.gateway.ssh_keys.is_empty()).then(|| {
        "it deletes the last SSH key: over SSH that would lock every remote operator out; delete it on the serial console".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::access;
    use crate::core::key::Key;

    fn cfg() -> Config {
        let mut c = Config::default();
        c.interface.private_key = Some(Key([7; 32]));
        c.interface.addresses = vec!["10.100.0.1/24".parse().unwrap()];
        let mut laptop = PeerConfig::new(Key([1; 32]));
        laptop.allowed_ips = vec!["10.100.0.2/32".parse().unwrap()];
        laptop.name = Some("laptop".into());
        let mut hub = PeerConfig::new(Key([2; 32]));
        hub.allowed_ips = vec!["0.0.0.0/0".parse().unwrap()];
        c.peers = vec![hub, laptop];
        c.gateway.ssh_keys = vec![crate::core::value::ssh_key(
            "alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC",
        )
        .unwrap()];
        c
    }

    fn from(src: &str) -> Remote {
        Remote {
            key_name: "alice".into(),
            source: src.parse().unwrap(),
        }
    }

    #[test]
    fn what_the_session_depends_on() {
        let run = cfg();
        let r = from("10.100.0.2");
        assert_eq!(r.peer(&run).unwrap().name.as_deref(), Some("laptop"));
        assert_eq!(from("::ffff:10.100.0.2").peer(&run), r.peer(&run));
        // From the LAN: no peer (the hub's /0 is not one).
        assert!(from("192.168.1.9").peer(&run).is_none());
        assert!(risks(&run, &run, &r).is_empty());
        let mut c = run.clone();
        c.gateway.client_dns = vec!["192.168.1.1".parse().unwrap()];
        assert!(
            risks(&run, &c, &r).is_empty(),
            "unrelated settings commit plainly"
        );
        type Edit = Box<dyn Fn(&mut Config)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|c| c.gateway.ssh_port = 2222),
                "the SSH keys or port",
            ),
            (
                Box::new(|c| c.interface.addresses = vec!["10.101.0.1/24".parse().unwrap()]),
                "private key or Address",
            ),
            (
                Box::new(|c| c.interface.private_key = Some(Key([8; 32]))),
                "private key",
            ),
            (
                Box::new(|c| c.peers.truncate(1)),
                "deletes this session's peer laptop",
            ),
            (
                Box::new(|c| c.peers[1].enabled = false),
                "disables this session's peer laptop",
            ),
            (
                Box::new(|c| c.peers[1].allowed_ips = vec!["10.100.0.3/32".parse().unwrap()]),
                "AllowedIPs of this session's peer laptop",
            ),
            (Box::new(|c| c.gateway.lan = "eth1".into()), "Uplink or Lan"),
            (
                Box::new(|c| c.gateway.uplink_gateway = Some("192.0.2.1".parse().unwrap())),
                "Uplink or Lan",
            ),
            (Box::new(|c| c.gateway.firewall = false), "Firewall"),
            (
                Box::new(|c| c.peers[1].access = Some(access::parse_list("lan").unwrap())),
                "the Access of this session's peer laptop",
            ),
            (
                Box::new(|c| c.gateway.client_isolation = true),
                "the Access of this session's peer laptop",
            ),
        ];
        for (edit, want) in cases {
            let mut c = run.clone();
            edit(&mut c);
            let v = risks(&run, &c, &r);
            assert!(v.iter().any(|s| s.contains(want)), "{want}: {v:?}");
        }
        // Another peer's change is not this session's business.
        let mut c = run.clone();
        c.peers[0].enabled = false;
        assert!(risks(&run, &c, &r).is_empty());
        // Writing out the default access changes nothing it may reach.
        let mut c = run.clone();
        c.peers[1].access = Some(access::default_access(false));
        assert!(risks(&run, &c, &r).is_empty());
    }

    #[test]
    fn the_last_key_is_the_serial_consoles_to_delete() {
        let run = cfg();
        let mut c = run.clone();
        assert!(locks_out(&run, &c).is_none());
        c.gateway.ssh_keys.clear();
        assert!(locks_out(&run, &c).unwrap().contains("last SSH key"));
        assert!(locks_out(&c, &c).is_none(), "none before, none after");
    }
}
