//! How late this gate's attempts start after the instant they were due.
//!
//! # Why
//! A coordinator slot is fitted to the intent's deadline by the reserve the
//! worker asks with (`Reconsider.attempt_reserve_ms`): the slot plus the
//! reserve ends by the deadline. At the wake-up the engine checks the
//! deadline against the instant the attempt really starts, which comes after
//! the slot by the timer's and the scheduler's lateness and, for a retry, the
//! round trip a token may cost. Asked with the attempt cap alone, a slot at
//! the edge can never be taken: the intent ends `deadline_infeasible` at its
//! wake-up and its slot goes unused. That edge is no corner case: an intent
//! asking at its last chance (its deadline less its reserve and the
//! coordinator's horizon) is given the slot at the end of the horizon
//! whenever the cursor is booked that far, as it is whenever demand exceeds
//! the rate. Eight `tollgate-bench worker` processes against nginx's
//! `limit_req` with first attempts at twice its rate left a sixth of their
//! slots unused that way (`docs/benchmarks.md`).
//!
//! So the gate asks with its cap plus the lateness its own starts have
//! shown: the largest seen, decaying by [`DECAY`] at each start, so that one
//! stall does not shorten every later deadline for long. On a paused clock
//! nothing is late and the reserve is the cap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The share of the estimate each start lets go of before its own lateness
/// is taken: a sixteenth, so a stall's lateness is halved within a dozen
/// starts while the lateness starts keep showing holds.
const DECAY: u64 = 16;

/// The lateness estimate, in microseconds: what a start was late by at
/// most, lately.
#[derive(Debug, Default)]
pub(super) struct Lateness(AtomicU64);

impl Lateness {
    /// A start `late` after the instant it was due.
    pub(super) fn record(&self, late: Duration) {
        let late = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        // The closure never declines, so the update always lands.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(late.max(held - held / DECAY))
            });
    }

    /// The reserve to ask a slot with, for an attempt capped at `cap`: the
    /// cap, and the lateness a start may come with.
    pub(super) fn reserve(&self, cap: Duration) -> Duration {
        cap.saturating_add(Duration::from_micros(self.0.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(1);

    #[test]
    fn nothing_late_asks_with_the_cap() {
        let lateness = Lateness::default();
        assert_eq!(lateness.reserve(CAP), CAP);
        lateness.record(Duration::ZERO);
        assert_eq!(lateness.reserve(CAP), CAP);
    }

    #[test]
    fn the_largest_lateness_is_asked_for_and_lets_go_by_a_sixteenth_per_start() {
        let lateness = Lateness::default();
        lateness.record(Duration::from_micros(1_600));
        lateness.record(Duration::from_micros(300));
        assert_eq!(lateness.reserve(CAP), CAP + Duration::from_micros(1_500));
        lateness.record(Duration::from_micros(4_000));
        assert_eq!(lateness.reserve(CAP), CAP + Duration::from_micros(4_000));
    }

    #[test]
    fn a_stall_fades_once_starts_are_on_time_again() {
        let lateness = Lateness::default();
        lateness.record(Duration::from_secs(2));
        for _ in 0..100 {
            lateness.record(Duration::ZERO);
        }
        let left = lateness.reserve(CAP) - CAP;
        assert!(left < Duration::from_millis(5), "{left:?}");
        assert!(left > Duration::ZERO);
    }
}
