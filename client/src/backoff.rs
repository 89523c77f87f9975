//! Local backoff: the wait when the server gave no usable hint.
//!
//! `min(cap, base · 2^n)`, where `n` is the number of attempts completed,
//! optionally with *full jitter* (a uniform draw in `[0, that]`), which
//! spreads a population of clients that failed together better than equal or
//! decorrelated jitter and is the simplest to reason about.
//!
//! The randomness is injected (`&mut impl Rng`), so a seeded RNG gives the
//! same schedule every run. The local floor (`min_wait`) is not applied here
//! because it bounds *every* wait, hinted or not; the engine applies it once,
//! after choosing between a hint and this backoff.

use std::time::Duration;

use rand::{Rng, RngExt};

/// Whether the backoff is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The exact exponential ceiling: reproducible without an RNG, but a fleet
    /// that failed together retries together.
    None,
    /// A uniform draw in `[0, ceiling]`.
    Full,
}

/// Exponential backoff with an optional full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first completed attempt is `2 · base`: the README's
    /// "2 s after the first attempt" with a 1 s base.
    pub base: Duration,
    /// The ceiling that keeps a long sequence of failures from waiting
    /// unboundedly (and keeps the arithmetic from overflowing).
    pub cap: Duration,
    /// Whether the ceiling is randomised.
    pub jitter: Jitter,
}

impl Backoff {
    /// `min(cap, base · 2^completed)`, saturating at `cap` for any
    /// `completed`, however large.
    pub fn ceiling(&self, completed: u32) -> Duration {
        2u32.checked_pow(completed)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The backoff after `completed` attempts, drawing from `rng` only when
    /// jitter is on (so turning jitter off does not shift other draws).
    pub fn delay<R: Rng + ?Sized>(&self, completed: u32, rng: &mut R) -> Duration {
        self.delay_at_least(completed, Duration::ZERO, rng)
    }

    /// [`Backoff::delay`], never below `floor`. The floor is applied to the
    /// range *before* the draw (uniform in `[floor, max(floor, ceiling)]`):
    /// raising a drawn value to the floor afterwards would put every client
    /// whose draw fell below it on the same instant, re-synchronising the
    /// fleet jitter was meant to spread.
    pub fn delay_at_least<R: Rng + ?Sized>(
        &self,
        completed: u32,
        floor: Duration,
        rng: &mut R,
    ) -> Duration {
        let ceiling = self.ceiling(completed).max(floor);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => floor.saturating_add(from_nanos(
                rng.random_range(0..=(ceiling - floor).as_nanos()),
            )),
        }
    }
}

/// `Duration::from_nanos` for a `u128`, saturating (the value never exceeds a
/// `Duration` it came from, so saturation is only a guard).
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it always fits.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, sub)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn backoff(jitter: Jitter) -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter,
        }
    }

    #[test]
    fn doubles_per_completed_attempt_up_to_the_cap() {
        let b = backoff(Jitter::None);
        let secs: Vec<u64> = (0..8).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn large_exponents_saturate_at_the_cap_instead_of_overflowing() {
        let b = Backoff {
            base: Duration::MAX,
            ..backoff(Jitter::None)
        };
        assert_eq!(b.ceiling(1), Duration::from_secs(60));
        let b = backoff(Jitter::None);
        for n in [31, 32, 33, 64, u32::MAX] {
            assert_eq!(b.ceiling(n), Duration::from_secs(60), "{n}");
        }
    }

    #[test]
    fn full_jitter_stays_in_range_and_repeats_with_the_seed() {
        let b = backoff(Jitter::Full);
        let draws = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..50)
                .map(|n| b.delay(n % 8, &mut rng))
                .collect::<Vec<_>>()
        };
        let first = draws(7);
        assert_eq!(first, draws(7));
        assert_ne!(first, draws(8));
        for (n, d) in first.iter().enumerate() {
            let n = u32::try_from(n).expect("small") % 8;
            assert!(*d <= b.ceiling(n), "{d:?} above ceiling at {n}");
        }
    }

    #[test]
    fn a_floor_bounds_the_range_before_the_draw_and_never_piles_draws_on_it() {
        let b = Backoff {
            base: Duration::from_millis(50),
            ..backoff(Jitter::Full)
        };
        let floor = Duration::from_millis(60);
        let mut rng = StdRng::seed_from_u64(3);
        // Ceiling 100 ms after one attempt: draws spread over [60, 100] ms.
        let draws: Vec<Duration> = (0..1000)
            .map(|_| b.delay_at_least(1, floor, &mut rng))
            .collect();
        assert!(draws.iter().all(|d| *d >= floor && *d <= b.ceiling(1)));
        let on_floor = draws.iter().filter(|d| **d == floor).count();
        assert!(on_floor <= 1, "{on_floor} draws collapsed onto the floor");
        // A floor above the ceiling is the wait itself.
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(
            b.delay_at_least(0, Duration::from_secs(90), &mut rng),
            Duration::from_secs(90)
        );
    }

    #[test]
    fn no_jitter_draws_nothing() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut untouched = StdRng::seed_from_u64(1);
        assert_eq!(
            backoff(Jitter::None).delay(3, &mut rng),
            Duration::from_secs(8)
        );
        assert_eq!(
            rng.random::<u64>(),
            untouched.random::<u64>(),
            "the RNG must not advance"
        );
    }

    #[test]
    fn nanos_conversion_is_exact() {
        let d = Duration::new(12_345, 678_901_234);
        assert_eq!(from_nanos(d.as_nanos()), d);
        assert_eq!(from_nanos(u128::MAX).as_secs(), u64::MAX);
    }
}
