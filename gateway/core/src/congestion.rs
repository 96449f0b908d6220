//! Per-connection TCP congestion-control policy for the fallback transport (pure): the
//! policy a sock_ops program would apply, chosen by us at connect/accept and checked
//! once more when the smoothed RTT is known.
//!
//! Rule: smoothed RTT above the threshold (default 40 ms, `BbrRttMs =` in `[Gateway]`)
//! -> `bbr` (long, lossy paths), otherwise `cubic`. Before any RTT is known: `cubic`.
//! A missing algorithm falls back along bbr -> cubic -> reno.

use std::fmt;
use std::time::Duration;

/// The algorithms the policy chooses between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Bbr,
    Cubic,
    Reno,
}

impl Algo {
    /// The kernel's name, as `TCP_CONGESTION` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Bbr => "bbr",
            Algo::Cubic => "cubic",
            Algo::Reno => "reno",
        }
    }

    /// Parse a kernel name; unknown names give `None`.
    pub fn from_name(s: &str) -> Option<Algo> {
        match s.trim_end_matches('\0').trim() {
            "bbr" => Some(Algo::Bbr),
            "cubic" => Some(Algo::Cubic),
            "reno" => Some(Algo::Reno),
            _ => None,
        }
    }

    /// The next algorithm to try when this one is unavailable (reno is always built in).
    pub fn fallback(self) -> Option<Algo> {
        match self {
            Algo::Bbr => Some(Algo::Cubic),
            Algo::Cubic => Some(Algo::Reno),
            Algo::Reno => None,
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The RTT -> algorithm policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcPolicy {
    /// Smoothed RTT above which `high` is used.
    pub threshold: Duration,
    /// For long paths.
    pub high: Algo,
    /// For short paths and before the RTT is known.
    pub low: Algo,
}

impl Default for CcPolicy {
    fn default() -> Self {
        CcPolicy {
            threshold: Duration::from_millis(40),
            high: Algo::Bbr,
            low: Algo::Cubic,
        }
    }
}

impl CcPolicy {
    /// The policy with the threshold from the configuration (`bbr_rtt_ms`).
    pub fn with_threshold_ms(ms: u32) -> Self {
        CcPolicy {
            threshold: Duration::from_millis(u64::from(ms)),
            ..CcPolicy::default()
        }
    }

    /// The algorithm for a connection whose smoothed RTT is `srtt` (`None`: unknown).
    pub fn choose(&self, srtt: Option<Duration>) -> Algo {
        match srtt {
            Some(rtt) if rtt > self.threshold => self.high,
            _ => self.low,
        }
    }

    /// Decide the re-check: `Some(algo)` when the connection should change from
    /// `current` now that `srtt` is known; `None` to keep it. A zero RTT is "not known
    /// yet" (the kernel reports 0 before the first sample).
    pub fn recheck(&self, current: Algo, srtt: Duration) -> Option<Algo> {
        if srtt.is_zero() {
            return None;
        }
        let want = self.choose(Some(srtt));
        (want != current).then_some(want)
    }
}

/// Walk the fallback chain from `want` until `try_set` accepts one; returns the one set
/// and whether it differs from `want` (the caller logs that once). `None`: none worked.
pub fn apply_with_fallback<E>(
    want: Algo,
    mut try_set: impl FnMut(Algo) -> Result<(), E>,
) -> Option<(Algo, bool)> {
    let mut algo = Some(want);
    while let Some(a) = algo {
        if try_set(a).is_ok() {
            return Some((a, a != want));
        }
        algo = a.fallback();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_rule() {
        let p = CcPolicy::default();
        assert_eq!(p.choose(None), Algo::Cubic);
        assert_eq!(p.choose(Some(Duration::from_millis(5))), Algo::Cubic);
        assert_eq!(p.choose(Some(Duration::from_millis(40))), Algo::Cubic);
        assert_eq!(p.choose(Some(Duration::from_micros(40_001))), Algo::Bbr);
        assert_eq!(p.choose(Some(Duration::from_millis(300))), Algo::Bbr);
        let p = CcPolicy::with_threshold_ms(100);
        assert_eq!(p.choose(Some(Duration::from_millis(60))), Algo::Cubic);
        assert_eq!(p.choose(Some(Duration::from_millis(101))), Algo::Bbr);
    }

    #[test]
    fn recheck_changes_only_when_needed() {
        let p = CcPolicy::default();
        assert_eq!(p.recheck(Algo::Cubic, Duration::ZERO), None);
        assert_eq!(p.recheck(Algo::Cubic, Duration::from_millis(10)), None);
        assert_eq!(
            p.recheck(Algo::Cubic, Duration::from_millis(80)),
            Some(Algo::Bbr)
        );
        assert_eq!(p.recheck(Algo::Bbr, Duration::from_millis(80)), None);
        assert_eq!(
            p.recheck(Algo::Bbr, Duration::from_millis(1)),
            Some(Algo::Cubic)
        );
    }

    #[test]
    fn fallback_chain() {
        // bbr missing: cubic, flagged as a fallback.
        let got = apply_with_fallback(Algo::Bbr, |a| if a == Algo::Bbr { Err(()) } else { Ok(()) });
        assert_eq!(got, Some((Algo::Cubic, true)));
        assert_eq!(
            apply_with_fallback(Algo::Bbr, |_| Ok::<(), ()>(())),
            Some((Algo::Bbr, false))
        );
        let only_reno =
            apply_with_fallback(
                Algo::Bbr,
                |a| if a == Algo::Reno { Ok(()) } else { Err(()) },
            );
        assert_eq!(only_reno, Some((Algo::Reno, true)));
        assert_eq!(
            apply_with_fallback(Algo::Cubic, |_| Err::<(), ()>(())),
            None
        );
    }

    #[test]
    fn names() {
        for a in [Algo::Bbr, Algo::Cubic, Algo::Reno] {
            assert_eq!(Algo::from_name(a.name()), Some(a));
        }
        assert_eq!(Algo::from_name("cubic\0\0"), Some(Algo::Cubic));
        assert_eq!(Algo::from_name("vegas"), None);
    }
}
