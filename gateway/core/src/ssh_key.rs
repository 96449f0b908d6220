//! SSH public keys as `authorized_keys` lines (`ssh-ed25519 AAAA... comment`): the keys
//! that may log in to `riceguard ssh`. Parsed and checked here, pure: the base64 blob is
//! decoded and its SSH wire form (RFC 4253 section 6.6, RFC 5656 section 3.1, RFC 8709)
//! read field by field, so a key that `ssh-keygen` would refuse is refused here with the
//! reason, before it is saved.
//!
//! Accepted: ed25519, ECDSA on nistp256/384/521, RSA of at least 3072 bits (OpenSSH's
//! own `ssh-keygen` default; 1024 and 2048 are refused as too weak for a box that holds
//! every key of a site). Not accepted: DSA, security-key (`sk-`) and certificate types.
//!
//! The fingerprint is what `ssh-keygen -lf` prints: `SHA256:` and the unpadded base64 of
//! the SHA-256 of the blob.

use base64::Engine;
use sha2::{Digest, Sha256};

/// The smallest RSA modulus accepted, in bits.
pub const RSA_MIN_BITS: usize = 3072;
/// The largest RSA modulus accepted, in bits (OpenSSH's limit).
pub const RSA_MAX_BITS: usize = 16384;
/// The longest comment kept (a comment is a label: `alice@laptop`).
pub const MAX_COMMENT: usize = 128;

/// A key's algorithm, as named on its line and inside its blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Ed25519,
    EcdsaP256,
    EcdsaP384,
    EcdsaP521,
    /// RSA, with the modulus' length in bits.
    Rsa(usize),
}

impl Algo {
    /// The name on an `authorized_keys` line.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ed25519 => "ssh-ed25519",
            Algo::EcdsaP256 => "ecdsa-sha2-nistp256",
            Algo::EcdsaP384 => "ecdsa-sha2-nistp384",
            Algo::EcdsaP521 => "ecdsa-sha2-nistp521",
            Algo::Rsa(_) => "ssh-rsa",
        }
    }

    /// As `ssh-keygen -l` says it: `ED25519`, `ECDSA`, `RSA`, with the bits.
    pub fn describe(self) -> String {
        match self {
            Algo::Ed25519 => "ED25519 (256 bits)".into(),
            Algo::EcdsaP256 => "ECDSA (256 bits)".into(),
            Algo::EcdsaP384 => "ECDSA (384 bits)".into(),
            Algo::EcdsaP521 => "ECDSA (521 bits)".into(),
            Algo::Rsa(b) => format!("RSA ({b} bits)"),
        }
    }
}

/// One public key: its algorithm, its blob (the SSH wire form, what a client offers)
/// and the comment after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    algo: Algo,
    blob: Vec<u8>,
    comment: String,
}

impl PublicKey {
    /// Parse `TYPE BASE64 [COMMENT...]` (spaces or tabs between; the comment is the rest
    /// of the line, its inner spacing kept). Options before the type (`from="..."`) are
    /// not accepted: the appliance has its own source rules.
    pub fn parse(line: &str) -> Result<PublicKey, String> {
        let line = line.trim();
        let (ty, rest) = split_word(line);
        if ty.is_empty() {
            return Err("expected an SSH public key: TYPE BASE64 [COMMENT], as in a .pub file (ssh-ed25519 AAAA... alice@laptop)".into());
        }
        let (b64, comment) = split_word(rest);
        let comment = comment.trim();
        let algo_named = match ty {
            "ssh-ed25519" | "ecdsa-sha2-nistp256" | "ecdsa-sha2-nistp384" | "ecdsa-sha2-nistp521" | "ssh-rsa" => ty,
            "ssh-dss" => return Err("DSA keys are refused (OpenSSH disabled them): use ssh-keygen -t ed25519".into()),
            t if t.starts_with("sk-") => {
                return Err(format!("{t}: security-key (FIDO) keys are not supported: use an ed25519, ECDSA or RSA key"))
            }
            t if t.contains("-cert-v01@openssh.com") => {
                return Err(format!("{t}: certificates are not supported: give the plain public key"))
            }
            t if t.contains('=') || t.contains('"') => {
                return Err("options before the key type (from=, command=, ...) are not accepted: give TYPE BASE64 [COMMENT]".into())
            }
            t => {
                return Err(format!(
                    "unknown key type {}: expected ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa",
                    shown(t)
                ))
            }
        };
        if b64.is_empty() {
            return Err(format!("{algo_named}: the key's base64 is missing"));
        }
        let blob = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("{algo_named}: the key is not base64 ({e})"))?;
        let algo = parse_blob(&blob)?;
        if algo.name() != algo_named {
            return Err(format!(
                "the line says {algo_named} but the key inside is {}",
                algo.name()
            ));
        }
        if comment.len() > MAX_COMMENT {
            return Err(format!("the comment is longer than {MAX_COMMENT} bytes"));
        }
        if comment.chars().any(char::is_control) {
            return Err("the comment has control characters".into());
        }
        Ok(PublicKey {
            algo,
            blob,
            comment: comment.to_string(),
        })
    }

    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// The SSH wire form (what a client sends in its public-key request).
    pub fn blob(&self) -> &[u8] {
        &self.blob
    }

    pub fn comment(&self) -> &str {
        &self.comment
    }

    /// `SHA256:...`, as `ssh-keygen -lf` prints it.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.blob)
    }
}

impl std::fmt::Display for PublicKey {
    /// The `authorized_keys` line: `TYPE BASE64[ COMMENT]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.blob);
        write!(f, "{} {b64}", self.algo.name())?;
        if !self.comment.is_empty() {
            write!(f, " {}", self.comment)?;
        }
        Ok(())
    }
}

/// The fingerprint of a key blob: `SHA256:` and the unpadded base64 of its SHA-256.
pub fn fingerprint(blob: &[u8]) -> String {
    let d = Sha256::digest(blob);
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d)
    )
}

/// The ed25519 public key blob of a 32-byte key (for the host key's fingerprint).
pub fn ed25519_blob(key: &[u8; 32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(51);
    put_string(&mut b, b"ssh-ed25519");
    put_string(&mut b, key);
    b
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start_matches([' ', '\t']);
    match s.find([' ', '\t']) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// A value for an error message: printable ASCII as is, else escaped, and cut.
fn shown(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    format!("{t:?}")
}

/// Reads SSH wire fields off a blob.
struct Wire<'a>(&'a [u8]);

impl<'a> Wire<'a> {
    fn string(&mut self, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < 4 {
            return Err(format!("the key is cut short (at its {what})"));
        }
        let n = u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]) as usize;
        let rest = &self.0[4..];
        if n > rest.len() {
            return Err(format!("the key is cut short (its {what} says {n} bytes)"));
        }
        let (v, r) = rest.split_at(n);
        self.0 = r;
        Ok(v)
    }

    /// An mpint that must be positive: its length in bits.
    fn positive_mpint(&mut self, what: &str) -> Result<usize, String> {
        let v = self.string(what)?;
        if v.first().is_some_and(|&b| b & 0x80 != 0) {
            return Err(format!("the key's {what} is negative"));
        }
        if v.len() > 1 && v[0] == 0 && v[1] & 0x80 == 0 {
            return Err(format!("the key's {what} has a needless leading zero"));
        }
        let v = match v.iter().position(|&b| b != 0) {
            Some(i) => &v[i..],
            None => return Err(format!("the key's {what} is zero")),
        };
        Ok(v.len() * 8 - v[0].leading_zeros() as usize)
    }

    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("the key has {} bytes too many", self.0.len()))
        }
    }
}

/// Check a blob's structure; its algorithm.
fn parse_blob(blob: &[u8]) -> Result<Algo, String> {
    let mut w = Wire(blob);
    let name = w.string("type")?;
    let algo = match name {
        b"ssh-ed25519" => {
            let k = w.string("point")?;
            if k.len() != 32 {
                return Err(format!("an ed25519 key is 32 bytes, this one {}", k.len()));
            }
            Algo::Ed25519
        }
        b"ecdsa-sha2-nistp256" | b"ecdsa-sha2-nistp384" | b"ecdsa-sha2-nistp521" => {
            let (curve, algo, coord): (&[u8], Algo, usize) = match name {
                b"ecdsa-sha2-nistp256" => (b"nistp256", Algo::EcdsaP256, 32),
                b"ecdsa-sha2-nistp384" => (b"nistp384", Algo::EcdsaP384, 48),
                _ => (b"nistp521", Algo::EcdsaP521, 66),
            };
            if w.string("curve")? != curve {
                return Err("the ECDSA key's curve does not match its type".into());
            }
            let q = w.string("point")?;
            if q.len() != 1 + 2 * coord || q[0] != 4 {
                return Err(
                    "the ECDSA key's point is not an uncompressed point of its curve".into(),
                );
            }
            algo
        }
        b"ssh-rsa" => {
            let e = w.positive_mpint("exponent")?;
            if e < 2 {
                return Err("the RSA key's exponent is 1".into());
            }
            let bits = w.positive_mpint("modulus")?;
            if bits < RSA_MIN_BITS {
                return Err(format!(
                    "RSA keys of {bits} bits are refused: at least {RSA_MIN_BITS} (ssh-keygen -t rsa -b 3072), or better ed25519"
                ));
            }
            if bits > RSA_MAX_BITS {
                return Err(format!("RSA keys above {RSA_MAX_BITS} bits are refused"));
            }
            Algo::Rsa(bits)
        }
        other => {
            return Err(format!(
                "the key inside is of an unsupported type {}",
                shown(&String::from_utf8_lossy(other))
            ))
        }
    };
    w.end()?;
    Ok(algo)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made with ssh-keygen (OpenSSH 9.2): `ssh-keygen -t ed25519`, `-t ecdsa`,
    // `-t rsa -b 3072`, `-t rsa -b 2048`; fingerprints from `ssh-keygen -lf`.
    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPavZxWFF13He3xGOowIOEKEd/GA/+uWdLinbR8OSHMC alice@laptop";
    const ED_FP: &str = "SHA256:PE4HyEn8ydoD8aTPUT2oLz0Bb9xqXZkJGkFKW+UiJps";
    const EC: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEPNlTvSudaY3I+JsbwoZfFiv4888n3N4W0FpSX7CcmemGDzrbziAhjbnThIF8F6FH624cfWA9WIAV2mGUGqo8Y= bob";
    const EC_FP: &str = "SHA256:pxqenritIhuX/RIB5UvrzGeWLurT+utdMbwDQ5+q8M4";
    const RSA: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQCdy2CDQcxAaU8SaopbR2KjO3x+1g8z6iylFAVwch1AQXpehB8CiTPp/lqEsj7/vs/nnkyt00RIWuhmyYUOZ7OVPjiQIRQpHG4rYTWhfLS8mWpI6yB08I0rbJ5xN8FTVtCeOU12PEFXk0zf3L0X5uqYA8Zq7h9ANch1XCLh9HGm6P0HZDgIN80sxhk/7TmObQyV5oadCp8o+2PLzsZDJLy6BN+mZuVRQtaV8tUxVLLKOsrCcR+oKuUtgkEQzz3c8uZeQj5WAVsznooaIKA73S9twOQ8GdO2gWNtsjlnC159l0CHmFW9fjjmCsh8P+t6d2jou/k3lgFleTzQRb0CW0b2Ku09g1WHHznl+o5eK3CDK/RZxBa5JlAiq41y3ALwN6U4i/X0JSHy8rzSqXQW0+TSsbRRpM7kPEQJ+WVVcDYKqplPMfGOpSKbwZIz0C0ACLq9MLkVXitEPHxUWkKiQasAhKg0BuM07mpr5MaqUar4ePgAnhD7D4wldUYIJlCBYjU= carol";
    const RSA_FP: &str = "SHA256:K0pPwNcoGoHEzCnJVpRvjQKlLErrUpjNNInn2V8SP+M";

    #[test]
    fn ed25519_parses_and_prints_back() {
        let k = PublicKey::parse(ED).unwrap();
        assert_eq!(k.algo(), Algo::Ed25519);
        assert_eq!(k.comment(), "alice@laptop");
        assert_eq!(k.to_string(), ED);
        assert_eq!(k.blob().len(), 51);
        assert_eq!(k.fingerprint(), ED_FP);
    }

    /// Keys made by ssh-keygen, with the fingerprints it printed.
    #[test]
    fn ssh_keygen_keys_and_fingerprints() {
        for (line, algo, fp) in [(EC, Algo::EcdsaP256, EC_FP), (RSA, Algo::Rsa(3072), RSA_FP)] {
            let k = PublicKey::parse(line).unwrap();
            assert_eq!(k.algo(), algo);
            assert_eq!(k.fingerprint(), fp);
            assert_eq!(k.to_string(), line);
        }
    }

    #[test]
    fn ed25519_blob_matches_a_parsed_key() {
        let k = PublicKey::parse(ED).unwrap();
        let raw: [u8; 32] = k.blob()[19..].try_into().unwrap();
        assert_eq!(ed25519_blob(&raw), k.blob());
    }

    #[test]
    fn tabs_and_no_comment() {
        let k = PublicKey::parse(&ED.replacen(' ', "\t", 1).replace(" alice@laptop", "")).unwrap();
        assert_eq!(k.comment(), "");
        let k = PublicKey::parse(&format!("{ED}  and more   words")).unwrap();
        assert_eq!(k.comment(), "alice@laptop  and more   words");
    }

    fn blob_line(ty: &str, fields: &[&[u8]]) -> String {
        let mut b = Vec::new();
        put_string(&mut b, ty.as_bytes());
        for f in fields {
            put_string(&mut b, f);
        }
        format!(
            "{ty} {}",
            base64::engine::general_purpose::STANDARD.encode(b)
        )
    }

    fn rsa_line(bits: usize) -> String {
        let mut n = vec![0u8; bits / 8];
        n[0] = 0x80;
        *n.last_mut().unwrap() = 1;
        let mut n2 = vec![0u8];
        n2.extend_from_slice(&n);
        blob_line("ssh-rsa", &[&[1, 0, 1], &n2])
    }

    #[test]
    fn rsa_by_size() {
        let k = PublicKey::parse(&rsa_line(3072)).unwrap();
        assert_eq!(k.algo(), Algo::Rsa(3072));
        assert_eq!(k.algo().describe(), "RSA (3072 bits)");
        let e = PublicKey::parse(&rsa_line(2048)).unwrap_err();
        assert!(e.contains("2048 bits are refused"), "{e}");
        assert!(PublicKey::parse(&rsa_line(4096)).is_ok());
        // A 4096-bit key and a comment fit the console's 1024-byte line.
        assert!(
            rsa_line(4096).len() + " alice@laptop".len() < 1024 - "set system ssh-key alice ".len()
        );
    }

    #[test]
    fn ecdsa_checks_curve_and_point() {
        let mut p = vec![4u8];
        p.extend_from_slice(&[7u8; 64]);
        let k = PublicKey::parse(&blob_line("ecdsa-sha2-nistp256", &[b"nistp256", &p])).unwrap();
        assert_eq!(k.algo(), Algo::EcdsaP256);
        assert!(PublicKey::parse(&blob_line("ecdsa-sha2-nistp256", &[b"nistp384", &p])).is_err());
        assert!(
            PublicKey::parse(&blob_line("ecdsa-sha2-nistp256", &[b"nistp256", &p[..33]])).is_err()
        );
    }

    #[test]
    fn refusals_say_why() {
        for (line, want) in [
            ("", "expected an SSH public key"),
            ("ssh-dss AAAA", "DSA keys are refused"),
            ("sk-ssh-ed25519@openssh.com AAAA", "security-key"),
            ("ssh-ed25519-cert-v01@openssh.com AAAA", "certificates"),
            ("from=\"10.0.0.1\" ssh-ed25519 AAAA", "options before"),
            ("ssh-foo AAAA", "unknown key type"),
            ("ssh-ed25519", "base64 is missing"),
            ("ssh-ed25519 !!!!", "not base64"),
            ("ssh-ed25519 AAAA", "cut short"),
        ] {
            let e = PublicKey::parse(line).unwrap_err();
            assert!(e.contains(want), "{line:?}: {e}");
        }
        // The type on the line and the one in the blob differ.
        let ed_blob = ED.split(' ').nth(1).unwrap();
        let e = PublicKey::parse(&format!("ssh-rsa {ed_blob}")).unwrap_err();
        assert!(e.contains("the line says ssh-rsa"), "{e}");
        // Trailing bytes, a short point.
        assert!(
            PublicKey::parse(&blob_line("ssh-ed25519", &[&[1; 32], b"x"]))
                .unwrap_err()
                .contains("too many")
        );
        assert!(PublicKey::parse(&blob_line("ssh-ed25519", &[&[1; 31]]))
            .unwrap_err()
            .contains("32 bytes"));
        // A control character in the comment.
        assert!(PublicKey::parse(&format!("{ED}\u{7}"))
            .unwrap_err()
            .contains("control"));
    }
}
