//! What makes a box *this box*, as one text: the plaintext of `export configuration`
//! (which the console then encrypts to an `age` passphrase file) and what `import
//! configuration` reads back. Pure: the console gathers the parts from `perm/` and
//! installs them.
//!
//! ```text
//! riceguard-export 1
//! schema 4                      the configuration schema of the exporting firmware
//! firmware riceguard 0.1.0 ...  (said back on import; not checked)
//! board qemu-x86_64             (said back on import; not checked)
//! host-key ed25519 BASE64       the SSH host key's 32-byte secret (optional)
//! password $argon2id$v=19$...   the console password's hash line (optional)
//! client phone BASE64           a kept client private key (any number)
//! config 1234                   the saved configuration's length in bytes, then the bytes
//! [Interface]
//! ...
//! end
//! ```
//!
//! The reader refuses what it does not know (a later export format says so by its first
//! line, a later configuration schema by `schema`), every name and key is checked, and
//! nothing is allocated from a length before the bound is checked.

use std::fmt::Write as _;

use crate::config::valid_peer_name;
use crate::key::Key;

/// The first line; a later format changes the number.
pub const MAGIC: &str = "riceguard-export 1";
/// The largest export text read (the configuration is at most a few hundred peers).
pub const MAX_TEXT: usize = 1 << 20;
/// The longest console password hash line.
pub const MAX_PASSWORD_LINE: usize = 512;

/// The parts of a box's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The configuration schema of the firmware that exported it.
    pub schema: u8,
    pub firmware: String,
    pub board: String,
    /// The SSH host key's ed25519 secret (seed).
    pub host_key: Option<[u8; 32]>,
    /// The console password's hash line (`$argon2id$...`).
    pub password: Option<String>,
    /// Kept client private keys, by client name.
    pub clients: Vec<(String, Key)>,
    /// The saved configuration file, as saved.
    pub config: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// A one-line field: printable, no control characters, bounded.
fn one_line(what: &str, v: &str, max: usize) -> Result<(), String> {
    if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
        return Err(format!(
            "{what}: expected one line of 1-{max} printable characters"
        ));
    }
    Ok(())
}

impl Identity {
    /// The text (the inverse of [`Identity::parse`]).
    pub fn to_text(&self) -> String {
        use base64::Engine;
        let mut s = String::new();
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "schema {}", self.schema);
        let _ = writeln!(s, "firmware {}", self.firmware);
        let _ = writeln!(s, "board {}", self.board);
        if let Some(k) = &self.host_key {
            let _ = writeln!(s, "host-key ed25519 {}", b64().encode(k));
        }
        if let Some(p) = &self.password {
            let _ = writeln!(s, "password {p}");
        }
        for (name, key) in &self.clients {
            let _ = writeln!(s, "client {name} {}", key.to_base64());
        }
        let _ = writeln!(s, "config {}", self.config.len());
        s.push_str(&self.config);
        s.push_str("\nend\n");
        s
    }

    /// Read an export text; `max_schema`: the newest configuration schema this firmware
    /// reads (a later one is refused, with both numbers).
    pub fn parse(text: &str, max_schema: u8) -> Result<Identity, String> {
        use base64::Engine;
        if text.len() > MAX_TEXT {
            return Err(format!("the export is larger than {MAX_TEXT} bytes"));
        }
        let mut rest = text;
        let line = |rest: &mut &str| -> Option<String> {
            let (l, r) = rest.split_once('\n')?;
            *rest = r;
            Some(l.strip_suffix('\r').unwrap_or(l).to_string())
        };
        match line(&mut rest) {
            Some(l) if l == MAGIC => {}
            Some(l) if l.starts_with("riceguard-export ") => {
                return Err(format!(
                    "this export is of a later format ({}): import it on the firmware that made it, or a later one",
                    l.chars().take(40).collect::<String>()
                ))
            }
            _ => return Err("not a RiceGuard export (the first line is not `riceguard-export 1`)".into()),
        }
        let mut schema = None;
        let mut firmware = None;
        let mut board = None;
        let mut host_key = None;
        let mut password = None;
        let mut clients: Vec<(String, Key)> = Vec::new();
        let config = loop {
            let Some(l) = line(&mut rest) else {
                return Err("the export ends before its configuration (cut short?)".into());
            };
            let (k, v) = l.split_once(' ').unwrap_or((l.as_str(), ""));
            let once = |seen: bool| {
                if seen {
                    Err(format!("`{k}` is given twice"))
                } else {
                    Ok(())
                }
            };
            match k {
                "schema" => {
                    once(schema.is_some())?;
                    let n: u8 = v.parse().map_err(|_| {
                        format!(
                            "schema: expected a number, got {:?}",
                            v.chars().take(20).collect::<String>()
                        )
                    })?;
                    if n == 0 {
                        return Err("schema: 0 is not a configuration schema".into());
                    }
                    if n > max_schema {
                        return Err(format!(
                            "this export was made by firmware of configuration schema {n}, later than this firmware's {max_schema}: update this box first, then import"
                        ));
                    }
                    schema = Some(n);
                }
                "firmware" => {
                    once(firmware.is_some())?;
                    one_line("firmware", v, 128)?;
                    firmware = Some(v.to_string());
                }
                "board" => {
                    once(board.is_some())?;
                    one_line("board", v, 64)?;
                    board = Some(v.to_string());
                }
                "host-key" => {
                    once(host_key.is_some())?;
                    let b = v
                        .strip_prefix("ed25519 ")
                        .ok_or("host-key: expected `ed25519 BASE64`")?;
                    let raw = b64()
                        .decode(b)
                        .map_err(|e| format!("host-key: not base64 ({e})"))?;
                    let k: [u8; 32] = raw
                        .try_into()
                        .map_err(|_| "host-key: an ed25519 key is 32 bytes")?;
                    host_key = Some(k);
                }
                "password" => {
                    once(password.is_some())?;
                    one_line("password", v, MAX_PASSWORD_LINE)?;
                    if !v.starts_with("$argon2id$") {
                        return Err(
                            "password: expected an Argon2id hash line ($argon2id$...)".into()
                        );
                    }
                    password = Some(v.to_string());
                }
                "client" => {
                    let (name, key) = v
                        .split_once(' ')
                        .ok_or("client: expected `client NAME KEY`")?;
                    if !valid_peer_name(name) {
                        return Err(format!(
                            "client {:?}: not a client name",
                            name.chars().take(40).collect::<String>()
                        ));
                    }
                    if clients.iter().any(|(n, _)| n == name) {
                        return Err(format!("client {name} is given twice"));
                    }
                    let key =
                        Key::from_base64(key).map_err(|_| format!("client {name}: not a key"))?;
                    clients.push((name.to_string(), key));
                }
                "config" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| "config: expected the configuration's length in bytes")?;
                    if n > rest.len() {
                        return Err(format!(
                            "the configuration is cut short ({} of {n} bytes)",
                            rest.len()
                        ));
                    }
                    if !rest.is_char_boundary(n) {
                        return Err("config: the length does not end on a character".into());
                    }
                    let (c, r) = rest.split_at(n);
                    rest = r;
                    break c.to_string();
                }
                _ => {
                    return Err(format!(
                        "unknown line `{}` in the export",
                        l.chars().take(40).collect::<String>()
                    ))
                }
            }
        };
        if rest != "\nend\n" && rest != "\r\nend\r\n" && rest != "\nend" {
            return Err(
                "the export does not end with `end` after its configuration (cut short or altered)"
                    .into(),
            );
        }
        Ok(Identity {
            schema: schema.ok_or("the export says no `schema`")?,
            firmware: firmware.ok_or("the export says no `firmware`")?,
            board: board.ok_or("the export says no `board`")?,
            host_key,
            password,
            clients,
            config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Identity {
        Identity {
            schema: 4,
            firmware: "riceguard 0.1.0 (c31cd24)".into(),
            board: "qemu-x86_64".into(),
            host_key: Some([5; 32]),
            password: Some(
                "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA".into(),
            ),
            clients: vec![
                ("phone".into(), Key([1; 32])),
                ("laptop".into(), Key([2; 32])),
            ],
            config: "[Interface]\nPrivateKey = x\n\n[Gateway]\nSshPort = 22\n".into(),
        }
    }

    #[test]
    fn round_trip() {
        let i = sample();
        let t = i.to_text();
        assert!(t.starts_with("riceguard-export 1\nschema 4\n"), "{t}");
        assert_eq!(Identity::parse(&t, 4).unwrap(), i);
        let bare = Identity {
            host_key: None,
            password: None,
            clients: Vec::new(),
            config: String::new(),
            ..sample()
        };
        assert_eq!(Identity::parse(&bare.to_text(), 4).unwrap(), bare);
    }

    #[test]
    fn refusals() {
        let t = sample().to_text();
        let e = Identity::parse(&t, 3).unwrap_err();
        assert!(e.contains("schema 4, later than this firmware's 3"), "{e}");
        for (bad, want) in [
            ("hello\n".to_string(), "not a RiceGuard export"),
            ("riceguard-export 2\n".to_string(), "later format"),
            (t.replace("\nend\n", "\n"), "does not end with `end`"),
            (t[..t.len() - 20].to_string(), "cut short"),
            (
                t.replace("client phone", "client ../x"),
                "not a client name",
            ),
            (t.replace("client laptop", "client phone"), "given twice"),
            (t.replace("board ", "bored "), "unknown line"),
            (t.replace("host-key ed25519 ", "host-key rsa "), "host-key"),
            (t.replace("$argon2id$", "$argon2i$"), "password"),
            (t.replace("schema 4\n", ""), "no `schema`"),
            (t.replace("config ", "config 9"), "cut short"),
        ] {
            let e = Identity::parse(&bad, 4).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        // Every cut of the text is refused, never taken for a smaller export.
        for n in 0..t.len() {
            if t.is_char_boundary(n) && n != t.len() - 1 {
                assert!(Identity::parse(&t[..n], 4).is_err(), "cut at {n}");
            }
        }
    }
}
