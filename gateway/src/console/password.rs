//! The optional console password: a salted, iterated BLAKE2s hash in `DIR/console.passwd`.
//!
//! Strength, honestly: BLAKE2s is fast and not memory-hard, so this is a *work factor*,
//! not a modern password hash (Argon2/scrypt). With [`ITERATIONS`] rounds one guess costs
//! about 200k BLAKE2s compressions (roughly 20-50 ms on an appliance CPU), so an attacker
//! with the file and one GPU can still try on the order of 10^4-10^5 passwords a second.
//! The salt stops precomputed tables and makes equal passwords hash differently. Use a
//! long passphrase; the file is mode 0600 on `perm`, and whoever can read `perm` can also
//! read the private key, so the password mainly guards the serial line itself.
//!
//! Stored form: `blake2s-iter$ITERATIONS$SALT_B64$HASH_B64`.

use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use base64::Engine as _;
use blake2::{Blake2s256, Digest};

/// Rounds for new hashes (the stored line records its own count, so raising this later
/// keeps old hashes valid). Unit tests use fewer: unoptimised BLAKE2s is slow.
pub const ITERATIONS: u32 = if cfg!(test) { 1_000 } else { 100_000 };
const TAG: &str = "blake2s-iter";

fn derive(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut h: [u8; 32] = Blake2s256::new()
        .chain_update(salt)
        .chain_update(password.as_bytes())
        .finalize()
        .into();
    for _ in 1..iterations {
        // The password and salt go into every round so no round can be skipped.
        h = Blake2s256::new()
            .chain_update(h)
            .chain_update(salt)
            .chain_update(password.as_bytes())
            .finalize()
            .into();
    }
    h
}

/// Hash a new password with a random salt.
pub fn hash(password: &str) -> String {
    let mut salt = [0u8; 16];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut salt);
    hash_with(password, &salt, ITERATIONS)
}

fn hash_with(password: &str, salt: &[u8], iterations: u32) -> String {
    let h = derive(password, salt, iterations);
    format!("{TAG}${iterations}${}${}", B64.encode(salt), B64.encode(h))
}

/// Whether `password` matches a stored line. A malformed line matches nothing (the
/// console then says so and the fix is removing the file from `perm`).
pub fn verify(password: &str, stored: &str) -> bool {
    let mut parts = stored.trim().split('$');
    let (Some(TAG), Some(iter), Some(salt), Some(want), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Ok(iter), Ok(salt), Ok(want)) = (iter.parse::<u32>(), B64.decode(salt), B64.decode(want))
    else {
        return false;
    };
    if !(1..=10_000_000).contains(&iter) || want.len() != 32 {
        return false;
    }
    let got = derive(password, &salt, iter);
    // Constant-time comparison: no early exit on the first differing byte.
    got.iter().zip(&want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Whether a stored line is in a form [`verify`] understands.
pub fn well_formed(stored: &str) -> bool {
    stored.trim().starts_with(&format!("{TAG}$")) && stored.trim().split('$').count() == 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_roundtrip_and_salting() {
        let a = hash_with("correct horse", b"0123456789abcdef", 10);
        assert!(verify("correct horse", &a));
        assert!(!verify("correct hors", &a));
        let b = hash_with("correct horse", b"fedcba9876543210", 10);
        assert_ne!(a, b, "salt changes the hash");
        assert!(!verify("x", "garbage"));
        assert!(!verify("x", "blake2s-iter$0$AA$AA"));
        assert!(well_formed(&a) && !well_formed("garbage"));
    }

    #[test]
    fn real_hash_verifies() {
        let h = hash("pw");
        assert!(verify("pw", &h) && !verify("pW", &h));
    }
}
