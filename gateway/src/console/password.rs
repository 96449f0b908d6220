//! The optional console password: its hash, and the failure delay every console shares.
//!
//! **Hash.** New hashes are Argon2id (RFC 9106, the RustCrypto `argon2` crate) as a PHC
//! string, `$argon2id$v=19$m=19456,t=2,p=1$SALT$HASH`, so the parameters travel with the
//! hash and raising [`COST`] later keeps every stored hash valid (and upgrades it at the
//! next good login, [`needs_upgrade`]). 19 MiB, 2 passes, 1 lane is OWASP's minimum for
//! Argon2id: memory-hard, so a GPU or ASIC guesses little faster than the appliance, and
//! a small ARM box with 1 GiB affords it at login (one login = one hash). Hashes of the
//! firmware before this one (`blake2s-iter$N$SALT$HASH`, [`legacy`]) still verify, and
//! are replaced by an Argon2id hash at the next good login.
//!
//! A stored string is input too: one asking for more than [`MAX_M_KIB`] of memory or
//! [`MAX_T`] passes is not well formed (the console says the file is damaged) rather
//! than a login that exhausts the appliance's memory or takes minutes.
//!
//! **Failure delay.** [`FailureLog`] keeps the count of wrong passwords since the last
//! good login and the time of the last one in a small file under `/run` (see
//! [`FAILURES`]), on the boot-time clock (`CLOCK_BOOTTIME`: it neither steps with NTP
//! nor stops in suspend), `flock`ed so consoles running at once (serial, a second one
//! later) and a console restarted by init all see the same count. After
//! [`FREE_TRIES`] wrong passwords each one makes the next try wait [`wait_after`]: 5 s,
//! doubling per failure, at most 5 min. A missing or damaged file means no delay: it
//! slows guessing, it must never lock the owner out.
//!
//! A login is one [`FailureLog::attempt`]: the wait check, the hash and the recording of
//! a failure (or the clearing after a good one) all under the one `flock`. Separate steps
//! would let N consoles pass the check together and get N guesses per wait; under the
//! lock the others block until the first has recorded its failure, then see the wait.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use nix::fcntl::{Flock, FlockArg};

/// Argon2id parameters: memory in KiB, passes, lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub m_kib: u32,
    pub t: u32,
    pub p: u32,
}

/// Parameters of new hashes (OWASP's Argon2id minimum). Unit tests use a small cost:
/// the unoptimised build is slow, and what is tested is that the stored string's own
/// parameters are used.
pub const COST: Cost = if cfg!(test) {
    Cost {
        m_kib: 64,
        t: 1,
        p: 1,
    }
} else {
    Cost {
        m_kib: 19 * 1024,
        t: 2,
        p: 1,
    }
};

/// The most a stored hash may ask for: 256 MiB (a quarter of a small appliance's RAM).
pub const MAX_M_KIB: u32 = 256 * 1024;
/// The most passes a stored hash may ask for.
pub const MAX_T: u32 = 16;
/// The most lanes a stored hash may ask for (computed one after the other here).
pub const MAX_P: u32 = 8;

const ARGON2ID_PREFIX: &str = "$argon2id$";

/// Hash a new password: Argon2id with [`COST`] and a random 16-byte salt.
pub fn hash(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut salt);
    hash_with(password, &salt, COST)
}

/// [`hash`] with a given salt and cost.
pub fn hash_with(password: &str, salt: &[u8], cost: Cost) -> Result<String, String> {
    let params = Params::new(cost.m_kib, cost.t, cost.p, None)
        .map_err(|e| format!("Argon2id parameters: {e}"))?;
    let salt = SaltString::encode_b64(salt).map_err(|e| format!("Argon2id salt: {e}"))?;
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("Argon2id: {e}"))
}

/// A stored Argon2id string, parsed and within our bounds.
fn parse_argon2id(stored: &str) -> Option<(PasswordHash<'_>, Params)> {
    let h = PasswordHash::new(stored).ok()?;
    if h.algorithm != argon2::ARGON2ID_IDENT
        || h.version != Some(Version::V0x13.into())
        || h.salt.is_none()
        || h.hash.is_none()
    {
        return None;
    }
    let params = Params::try_from(&h).ok()?;
    if params.m_cost() > MAX_M_KIB || params.t_cost() > MAX_T || params.p_cost() > MAX_P {
        return None;
    }
    Some((h, params))
}

/// The cost a stored Argon2id string asks for (`None`: not one, or out of bounds).
pub fn stored_cost(stored: &str) -> Option<Cost> {
    let (_, p) = parse_argon2id(stored.trim())?;
    Some(Cost {
        m_kib: p.m_cost(),
        t: p.t_cost(),
        p: p.p_cost(),
    })
}

/// Whether `password` matches a stored line (Argon2id, or the previous firmware's
/// form). A malformed line matches nothing; it never panics.
pub fn verify(password: &str, stored: &str) -> bool {
    let stored = stored.trim();
    if stored.starts_with(ARGON2ID_PREFIX) {
        let Some((h, params)) = parse_argon2id(stored) else {
            return false;
        };
        // The parameters are the stored string's own (checked against our bounds above).
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    } else {
        legacy::verify(password, stored)
    }
}

/// Whether a stored line is in a form [`verify`] understands, within its bounds.
pub fn well_formed(stored: &str) -> bool {
    let stored = stored.trim();
    if stored.starts_with(ARGON2ID_PREFIX) {
        parse_argon2id(stored).is_some()
    } else {
        legacy::well_formed(stored)
    }
}

/// Whether a stored line should be re-hashed at a good login: the previous firmware's
/// form, or Argon2id cheaper than [`COST`] in memory or passes.
pub fn needs_upgrade(stored: &str) -> bool {
    match stored_cost(stored) {
        Some(c) => c.m_kib < COST.m_kib || c.t < COST.t,
        None => true,
    }
}

/// The firmware before Argon2id: a salted, iterated BLAKE2s hash,
/// `blake2s-iter$ITERATIONS$SALT_B64$HASH_B64`. Kept to verify (and then upgrade)
/// passwords set by it, and [`well_formed`] as its reader had it (the rollback tests).
///
/// Strength, honestly: BLAKE2s is fast and not memory-hard, so this is only a work
/// factor: with the file and one GPU, on the order of 10^4-10^5 guesses a second.
pub mod legacy {
    use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
    use base64::Engine as _;
    use blake2::{Blake2s256, Digest};

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

    /// A hash as the previous firmware wrote it (it used 100 000 iterations); only tests
    /// make these now.
    #[cfg(test)]
    pub fn hash_with(password: &str, salt: &[u8], iterations: u32) -> String {
        let h = derive(password, salt, iterations);
        format!("{TAG}${iterations}${}${}", B64.encode(salt), B64.encode(h))
    }

    /// Whether `password` matches a stored `blake2s-iter` line.
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
        let (Ok(iter), Ok(salt), Ok(want)) =
            (iter.parse::<u32>(), B64.decode(salt), B64.decode(want))
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

    /// The previous firmware's check, unchanged: what it accepts in `console.passwd`.
    pub fn well_formed(stored: &str) -> bool {
        stored.trim().starts_with(&format!("{TAG}$")) && stored.trim().split('$').count() == 4
    }
}

/// Where the consoles keep their shared failure count (tmpfs: a reboot clears it).
pub use crate::run::CONSOLE_FAILURES as FAILURES;

/// Wrong passwords that cost no wait.
pub const FREE_TRIES: u32 = 3;
/// The first wait, after the [`FREE_TRIES`]-th failure.
const FIRST_WAIT: Duration = Duration::from_secs(5);
/// The longest wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// How long the next try waits after `failures` wrong passwords in a row.
pub fn wait_after(failures: u32) -> Duration {
    if failures < FREE_TRIES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_TRIES).min(16);
    (FIRST_WAIT * (1u32 << doublings)).min(MAX_WAIT)
}

/// Now on the boot-time clock (`CLOCK_BOOTTIME`): what [`FailureLog`] times are on.
pub fn boot_time() -> Duration {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(t) => Duration::new(
            u64::try_from(t.tv_sec()).unwrap_or(0),
            u32::try_from(t.tv_nsec()).unwrap_or(0),
        ),
        // Not on Linux before 2.6.39; then no delay (zero is never after a failure).
        Err(_) => Duration::ZERO,
    }
}

/// The failures file's content: `COUNT LAST_MS\n`, the count of wrong passwords since
/// the last good login and the boot-time milliseconds of the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Failures {
    count: u32,
    last_ms: u64,
}

impl Failures {
    /// Anything but two numbers, or a time after `now` (not this boot's), is no failure.
    fn parse(text: &str, now: Duration) -> Failures {
        let mut it = text.split_ascii_whitespace();
        let (Some(c), Some(t), None) = (it.next(), it.next(), it.next()) else {
            return Failures::default();
        };
        match (c.parse::<u32>(), t.parse::<u64>()) {
            (Ok(count), Ok(last_ms)) if u128::from(last_ms) <= now.as_millis() => {
                Failures { count, last_ms }
            }
            _ => Failures::default(),
        }
    }

    fn wait_left(&self, now: Duration) -> Option<Duration> {
        let until = Duration::from_millis(self.last_ms) + wait_after(self.count);
        let left = until.checked_sub(now)?;
        (!left.is_zero()).then_some(left)
    }
}

/// What became of one login try ([`FailureLog::attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Not checked, not counted: wrong passwords before make this one wait so long.
    Wait(Duration),
    /// The password is right; the count is cleared.
    Good,
    /// A wrong password, counted; the next try waits this long (`None`: not at all).
    Wrong(Option<Duration>),
}

/// The failure count shared by every console process through one locked file.
#[derive(Debug, Clone)]
pub struct FailureLog {
    path: PathBuf,
}

impl FailureLog {
    pub fn new(path: impl Into<PathBuf>) -> FailureLog {
        FailureLog { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` on the file's content under an exclusive `flock`, writing back what it
    /// returns (`None`: leave the file as it is). No file (and no way to make one) is an
    /// empty log.
    fn with_locked<T>(
        &self,
        now: Duration,
        f: impl FnOnce(Failures) -> (Option<Failures>, T),
    ) -> T {
        let Some(mut lock) = self.open_locked() else {
            return f(Failures::default()).1;
        };
        let mut text = String::new();
        // Not text: damaged, so no failures.
        let _ = lock.read_to_string(&mut text);
        let (new, out) = f(Failures::parse(&text, now));
        if let Some(n) = new {
            let line = format!("{} {}\n", n.count, n.last_ms);
            let _ = lock
                .seek(SeekFrom::Start(0))
                .and_then(|_| lock.set_len(0))
                .and_then(|_| lock.write_all(line.as_bytes()));
        }
        out
    }

    fn open_locked(&self) -> Option<Flock<File>> {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)
            .ok()?;
        Flock::lock(f, FlockArg::LockExclusive).ok()
    }

    /// How long before the next password may be checked (`None`: now).
    pub fn wait_left(&self, now: Duration) -> Option<Duration> {
        self.with_locked(now, |f| (None, f.wait_left(now)))
    }

    /// Count a wrong password at `now`; returns the wait it imposes on the next try.
    pub fn record_failure(&self, now: Duration) -> Option<Duration> {
        self.with_locked(now, |f| {
            let n = Failures {
                count: f.count.saturating_add(1),
                last_ms: u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
            };
            (Some(n), n.wait_left(now))
        })
    }

    /// One login try, all under the lock: the wait (as at `now()`), then `check` (the
    /// hash), then the failure counted at `now()` after it, or the count cleared. Every
    /// other console's try waits for the lock meanwhile, so it sees this failure's wait:
    /// one guess per wait, however many consoles try at once.
    pub fn attempt(&self, now: impl Fn() -> Duration, check: impl FnOnce() -> bool) -> Attempt {
        let before = now();
        self.with_locked(before, |f| {
            if let Some(w) = f.wait_left(before) {
                return (None, Attempt::Wait(w));
            }
            if check() {
                return (Some(Failures::default()), Attempt::Good);
            }
            // The hash took a while: the wait runs from when the answer is known.
            let at = now().max(before);
            let n = Failures {
                count: f.count.saturating_add(1),
                last_ms: u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
            };
            (Some(n), Attempt::Wrong(n.wait_left(at)))
        })
    }

    /// A good login: no failures (cleared under the lock, not unlinked, so a console
    /// waiting for the lock counts into the same file).
    pub fn reset(&self) {
        self.with_locked(Duration::ZERO, |_| (Some(Failures::default()), ()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    const SALT: &[u8] = b"0123456789abcdef";

    #[test]
    fn argon2id_roundtrip_salting_and_stored_parameters() {
        let a = hash_with("correct horse", SALT, COST).unwrap();
        assert!(a.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{a}");
        assert!(verify("correct horse", &a) && well_formed(&a));
        assert!(!verify("correct hors", &a));
        let b = hash_with("correct horse", b"fedcba9876543210", COST).unwrap();
        assert_ne!(a, b, "salt changes the hash");
        // Parameters come from the stored string, not from COST.
        let other = Cost {
            m_kib: 128,
            t: 3,
            p: 2,
        };
        let c = hash_with("pw", SALT, other).unwrap();
        assert_eq!(stored_cost(&c), Some(other));
        assert!(verify("pw", &c) && !verify("pW", &c));
        assert!(!needs_upgrade(&c) && !needs_upgrade(&a));
        // Edit the parameters of a good hash: it no longer verifies (they are used).
        let edited = c.replace("t=3", "t=2");
        assert!(well_formed(&edited) && !verify("pw", &edited));
        // A real hash with a random salt.
        let h = hash("pw").unwrap();
        assert!(verify("pw", &h) && !verify("pW", &h));
    }

    #[test]
    fn production_cost_is_owasp_minimum() {
        // The figure the module documents (tests hash with a small COST).
        let prod = Cost {
            m_kib: 19 * 1024,
            t: 2,
            p: 1,
        };
        let h = hash_with("pw", SALT, prod).unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify("pw", &h));
        assert!(!needs_upgrade(&h), "stronger than the test COST");
    }

    #[test]
    fn legacy_hashes_verify_and_need_upgrade() {
        let old = legacy::hash_with("correct horse", SALT, 10);
        assert!(verify("correct horse", &old) && !verify("correct hors", &old));
        assert!(well_formed(&old) && legacy::well_formed(&old));
        assert!(needs_upgrade(&old));
        // A weaker Argon2id than COST is upgraded too.
        let weak = hash_with(
            "pw",
            SALT,
            Cost {
                m_kib: 32,
                t: 1,
                p: 1,
            },
        )
        .unwrap();
        assert!(verify("pw", &weak) && needs_upgrade(&weak));
        // What today's firmware makes of an Argon2id line in its file: damaged.
        assert!(!legacy::well_formed(&hash("pw").unwrap()));
    }

    /// Damaged or hostile lines never panic, never match, and ones out of bounds are
    /// not well formed (the console says damaged instead of trying them).
    #[test]
    fn bad_lines_never_panic_or_match() {
        let good = hash_with("pw", SALT, COST).unwrap();
        let mut lines = vec![
            String::new(),
            "garbage".into(),
            "$argon2id$".into(),
            "$argon2id$v=19$m=64,t=1,p=1$".into(),
            "$argon2id$v=19$m=64,t=1,p=1$c2FsdHNhbHQ".into(),
            "$argon2id$v=16$m=64,t=1,p=1$c2FsdHNhbHRzYWx0$AAAA".into(),
            "$argon2i$v=19$m=64,t=1,p=1$c2FsdHNhbHRzYWx0$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "$argon2id$v=19$m=4294967295,t=1,p=1$c2FsdHNhbHRzYWx0$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "$argon2id$v=19$m=64,t=100000,p=1$c2FsdHNhbHRzYWx0$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "$argon2id$v=19$m=64,t=1,p=100$c2FsdHNhbHRzYWx0$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "$argon2id$v=19$m=1,t=0,p=0$c2FsdHNhbHRzYWx0$AAAA".into(),
            "$argon2id$v=19$x=1$c2FsdHNhbHRzYWx0$AAAA".into(),
            "blake2s-iter$0$AA$AA".into(),
            "blake2s-iter$99999999999$AA$AA".into(),
            format!("{good}$extra"),
            good.replace('$', "$$"),
        ];
        // Every truncation of a good line.
        lines.extend((0..good.len()).map(|n| good[..n].to_string()));
        for l in &lines {
            assert!(!verify("pw", l), "{l}");
            let _ = well_formed(l);
            let _ = needs_upgrade(l);
        }
        for l in &lines[7..10] {
            assert!(!well_formed(l), "out of bounds: {l}");
        }
    }

    #[test]
    fn wait_policy() {
        let w: Vec<u64> = (0..12).map(|n| wait_after(n).as_secs()).collect();
        assert_eq!(w, [0, 0, 0, 5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(wait_after(u32::MAX), MAX_WAIT);
    }

    /// Two consoles (two handles on one file), a restart (a new handle), a good login,
    /// a damaged or missing file. Time is passed in: nothing here waits or reads a clock.
    #[test]
    fn failure_log_shared_restart_reset_damaged() {
        let d = TempDir::new("failures");
        let path = d.0.join("run/riceguard/console-failures");
        let serial = FailureLog::new(&path);
        let second = FailureLog::new(&path);
        let t = |s: u64| Duration::from_secs(1000 + s);
        assert_eq!(serial.wait_left(t(0)), None, "no file: no delay");
        assert_eq!(serial.record_failure(t(0)), None);
        assert_eq!(second.record_failure(t(1)), None);
        // The third failure, counted by the other console, starts the delay for both.
        let w = serial.record_failure(t(2)).expect("third failure waits");
        assert_eq!(w, wait_after(3));
        assert_eq!(second.wait_left(t(2)), Some(w));
        assert_eq!(second.wait_left(t(4)), Some(w - Duration::from_secs(2)));
        // A restarted console (a new handle, the same /run file) still waits.
        let restarted = FailureLog::new(&path);
        assert!(restarted.wait_left(t(3)).is_some());
        assert_eq!(restarted.wait_left(t(2) + w), None, "wait over");
        // Doubling.
        assert_eq!(restarted.record_failure(t(20)), Some(wait_after(4)));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("4 {}\n", t(20).as_millis())
        );
        // A good login on either console clears it for all.
        second.reset();
        assert_eq!(serial.wait_left(t(21)), None);
        assert_eq!(serial.record_failure(t(21)), None, "counting starts over");
        // Damaged content means no delay, and counting restarts from it.
        for bad in [
            &b"garbage"[..],
            b"",
            b"\xff\xfe",
            b"5",
            b"5 1 2",
            b"-1 5",
            b"99 999999999999999",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(serial.wait_left(t(30)), None, "{bad:?}");
            assert_eq!(serial.record_failure(t(30)), None, "{bad:?}");
        }
        // A file that cannot be opened (a directory in its place): no delay, no panic.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(serial.record_failure(t(40)), None);
        assert_eq!(serial.wait_left(t(40)), None);
        std::fs::remove_dir(&path).unwrap();
        // The mode: only root reads it.
        use std::os::unix::fs::PermissionsExt;
        serial.record_failure(t(50));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// Two processes' worth of concurrent failures (threads, each with its own handle
    /// and file descriptor): the lock makes every failure count.
    #[test]
    fn failure_log_concurrent_counts_all() {
        let d = TempDir::new("failures-race");
        let path = d.0.join("console-failures");
        let now = Duration::from_secs(5000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || {
                    let log = FailureLog::new(p);
                    for _ in 0..25 {
                        log.record_failure(now);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("100 "), "{text}");
    }

    /// N consoles trying wrong passwords at once get one guess per wait: the first try
    /// is checked and counted under the lock, the others then see its wait and are not
    /// checked. Each check waits (up to 10 s) until every console has started its try,
    /// so if the checks were not under the lock all N would be checked every round.
    #[test]
    fn concurrent_wrong_tries_get_one_guess_per_wait() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        use std::sync::Arc;
        const N: usize = 4;
        let d = TempDir::new("failures-guesses");
        let path = d.0.join("console-failures");
        let log = FailureLog::new(&path);
        let mut now = Duration::from_secs(5000);
        // The free tries used up: the next wrong one starts the wait.
        for _ in 0..FREE_TRIES - 1 {
            assert_eq!(log.record_failure(now), None);
        }
        for round in 0..3u32 {
            let started = Arc::new(AtomicUsize::new(0));
            let checked = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..N)
                .map(|_| {
                    let (p, started, checked) = (path.clone(), started.clone(), checked.clone());
                    std::thread::spawn(move || {
                        let console = FailureLog::new(p);
                        started.fetch_add(1, SeqCst);
                        console.attempt(
                            || now,
                            || {
                                checked.fetch_add(1, SeqCst);
                                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                                while started.load(SeqCst) < N
                                    && std::time::Instant::now() < deadline
                                {
                                    std::thread::yield_now();
                                }
                                false
                            },
                        )
                    })
                })
                .collect();
            let results: Vec<Attempt> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let wait = wait_after(FREE_TRIES + round);
            assert_eq!(checked.load(SeqCst), 1, "round {round}: {results:?}");
            assert_eq!(
                results
                    .iter()
                    .filter(|a| **a == Attempt::Wrong(Some(wait)))
                    .count(),
                1,
                "{results:?}"
            );
            assert_eq!(
                results
                    .iter()
                    .filter(|a| **a == Attempt::Wait(wait))
                    .count(),
                N - 1,
                "{results:?}"
            );
            // The next round comes when the wait is over.
            now += wait;
        }
        // A good password, after the wait, clears the count for every console.
        assert_eq!(log.attempt(|| now, || true), Attempt::Good);
        assert_eq!(FailureLog::new(&path).wait_left(now), None);
        assert_eq!(log.attempt(|| now, || false), Attempt::Wrong(None));
    }

    #[test]
    fn boot_time_moves_forward() {
        let a = boot_time();
        let b = boot_time();
        assert!(b >= a && !a.is_zero());
    }
}
