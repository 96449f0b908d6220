//! Curve25519 keys as `wg` spells them: 32 bytes, base64 in configs and on the
//! command line, lowercase hex on the UAPI socket.

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use boringtun::x25519;

/// A 32-byte key (private, public or preshared). `Debug` never prints the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key(pub [u8; 32]);

/// Why a key string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// Not 44 characters of base64 decoding to 32 bytes.
    Base64,
    /// Not 64 hex digits.
    Hex,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Base64 => f.write_str(
                "a key is 44 characters of base64 encoding 32 bytes (as `wg genkey` prints)",
            ),
            KeyError::Hex => f.write_str("a key is 64 hexadecimal digits"),
        }
    }
}

impl std::error::Error for KeyError {}

impl Key {
    /// Parse the base64 form used by `wg` and wg-quick configs.
    pub fn from_base64(s: &str) -> Result<Key, KeyError> {
        let s = s.trim();
        if s.len() != 44 {
            return Err(KeyError::Base64);
        }
        let mut out = [0u8; 33];
        match B64.decode_slice(s, &mut out) {
            Ok(32) => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&out[..32]);
                Ok(Key(k))
            }
            _ => Err(KeyError::Base64),
        }
    }

    /// Parse the lowercase (or uppercase) hex form used on the UAPI socket.
    pub fn from_hex(s: &str) -> Result<Key, KeyError> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(KeyError::Hex);
        }
        let mut k = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(KeyError::Hex)?;
            let lo = hex_val(pair[1]).ok_or(KeyError::Hex)?;
            k[i] = (hi << 4) | lo;
        }
        Ok(Key(k))
    }

    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }

    pub fn to_hex(&self) -> String {
        const H: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(H[(b >> 4) as usize] as char);
            s.push(H[(b & 15) as usize] as char);
        }
        s
    }

    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// A new private key from `rng` (the caller's: the gateway passes the OS random
    /// source), clamped like `wg genkey`.
    pub fn generate_private(rng: &mut impl rand_core::CryptoRngCore) -> Key {
        let secret = x25519::StaticSecret::random_from_rng(rng);
        let mut k = secret.to_bytes();
        clamp(&mut k);
        Key(k)
    }

    /// A new preshared key: 32 random bytes from `rng`, as `wg genpsk`.
    pub fn generate_preshared(rng: &mut impl rand_core::CryptoRngCore) -> Key {
        let mut k = [0u8; 32];
        rng.fill_bytes(&mut k);
        Key(k)
    }

    /// The public key of this private key.
    pub fn public(&self) -> Key {
        let secret = x25519::StaticSecret::from(self.0);
        Key(x25519::PublicKey::from(&secret).to_bytes())
    }
}

/// Curve25519 clamping as `wg genkey` applies it.
fn clamp(k: &mut [u8; 32]) {
    k[0] &= 248;
    k[31] = (k[31] & 127) | 64;
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Show a short prefix of the base64 so logs can tell keys apart without leaking them.
        let b = self.to_base64();
        write!(f, "Key({}…)", &b[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_roundtrip_and_hex() {
        let k = Key::generate_private(&mut crate::testutil::Rng(7));
        assert_eq!(Key::from_base64(&k.to_base64()).unwrap(), k);
        assert_eq!(Key::from_hex(&k.to_hex()).unwrap(), k);
        assert_eq!(k.0[0] & 7, 0);
        assert_eq!(k.0[31] & 0xc0, 0x40);
    }

    #[test]
    fn preshared_keys_are_random() {
        let mut rng = crate::testutil::Rng(11);
        let (a, b) = (
            Key::generate_preshared(&mut rng),
            Key::generate_preshared(&mut rng),
        );
        assert_ne!(a, b);
        assert!(!a.is_zero());
    }

    #[test]
    fn rejects_bad_keys() {
        assert_eq!(Key::from_base64("abc"), Err(KeyError::Base64));
        assert_eq!(Key::from_base64(&"A".repeat(44)), Err(KeyError::Base64));
        assert_eq!(Key::from_hex(&"g".repeat(64)), Err(KeyError::Hex));
        assert_eq!(Key::from_hex("00"), Err(KeyError::Hex));
    }

    #[test]
    fn known_public_key() {
        // RFC 7748 section 6.1 test vector (Alice).
        let private =
            Key::from_hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .unwrap();
        assert_eq!(
            private.public().to_hex(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }
}
