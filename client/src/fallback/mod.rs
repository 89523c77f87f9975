//! The conservative local budget a worker falls back to when the coordinator
//! is unreachable or slow.
//!
//! Two mechanisms, both per process and both deliberately stricter than the
//! fleet budget they stand in for:
//! - [`LocalBudget`]: the Finagle / tower `TpsBudget` shape — retries in a
//!   sliding window ≤ `floor_per_sec × window + ratio × first_attempts` — so a
//!   worker cut off from the coordinator still cannot multiply its load.
//! - [`AdaptiveThrottle`]: client-side adaptive throttling from the Google SRE
//!   book ("Handling Overload"): once the upstream accepts fewer than `1/K` of
//!   requests, the worker rejects locally with probability
//!   `max(0, (requests − K·accepts) / (requests + 1))`, so an upstream that is
//!   refusing everything stops seeing retries at all.
//!
//! And one for when the retries go: [`LocalPacer`] paces the wake-ups a
//! worker decides alone after the upstream pushed back, as the coordinator's
//! slots would, so a backlog held through an outage is not one burst.
//!
//! Both take the current elapsed time as an argument (no clock inside) and the
//! throttle takes its random draw from the caller, so tests are exact.

use std::collections::VecDeque;
use std::time::Duration;

mod pacer;

pub use pacer::{ASK_AGAIN_WITHIN, LocalPacer, Pace};

/// Budget arithmetic is in milli-retries so a ratio of 0.2 is exact.
const MILLI: u64 = 1_000;

/// A sliding-window retry budget for one process.
#[derive(Debug, Clone)]
pub struct LocalBudget {
    window: Duration,
    /// Milli-retries earned per first attempt (ratio × 1000).
    ratio_milli: u64,
    /// Milli-retries the window always allows, whatever the traffic.
    floor_milli: u64,
    /// Per-bucket (first attempts, retries) counts, newest last; a bucket is a
    /// tenth of the window so old traffic ages out smoothly, not in one step.
    buckets: VecDeque<Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Which tenth-of-a-window this bucket counts, since elapsed zero.
    index: u64,
    first_attempts: u64,
    retries: u64,
}

const BUCKETS_PER_WINDOW: u32 = 10;

impl LocalBudget {
    /// A budget allowing `floor_per_sec` retries per second plus `ratio` of the
    /// first attempts seen in `window`.
    ///
    /// # Panics
    /// If `window` is zero or `ratio` is negative or not finite — a programmer
    /// error in a constant, not a peer's input.
    pub fn new(window: Duration, ratio: f64, floor_per_sec: f64) -> Self {
        assert!(!window.is_zero(), "LocalBudget window must be positive");
        assert!(
            ratio.is_finite() && ratio >= 0.0,
            "LocalBudget ratio must be >= 0"
        );
        assert!(
            floor_per_sec.is_finite() && floor_per_sec >= 0.0,
            "LocalBudget floor must be >= 0"
        );
        LocalBudget {
            window,
            ratio_milli: (ratio * MILLI as f64).round() as u64,
            floor_milli: (floor_per_sec * window.as_secs_f64() * MILLI as f64).round() as u64,
            buckets: VecDeque::new(),
        }
    }

    fn bucket_index(&self, now: Duration) -> u64 {
        let width = (self.window / BUCKETS_PER_WINDOW).as_nanos().max(1);
        (now.as_nanos() / width) as u64
    }

    /// Drops buckets older than the window and returns the current one.
    fn current(&mut self, now: Duration) -> &mut Bucket {
        let index = self.bucket_index(now);
        let oldest = index.saturating_sub(u64::from(BUCKETS_PER_WINDOW) - 1);
        while self.buckets.front().is_some_and(|b| b.index < oldest) {
            self.buckets.pop_front();
        }
        if self.buckets.back().is_none_or(|b| b.index != index) {
            self.buckets.push_back(Bucket {
                index,
                first_attempts: 0,
                retries: 0,
            });
        }
        self.buckets.back_mut().expect("a bucket was just ensured")
    }

    /// Records a first attempt, which earns `ratio` of a retry.
    pub fn deposit(&mut self, now: Duration) {
        self.current(now).first_attempts += 1;
    }

    /// Spends one retry if the window still allows it.
    pub fn withdraw(&mut self, now: Duration) -> bool {
        if self.available_milli(now) < MILLI {
            return false;
        }
        self.current(now).retries += 1;
        true
    }

    /// Whole retries the window allows right now.
    pub fn available(&mut self, now: Duration) -> u64 {
        self.available_milli(now) / MILLI
    }

    fn available_milli(&mut self, now: Duration) -> u64 {
        self.current(now);
        let (firsts, retries) = self.buckets.iter().fold((0u64, 0u64), |(f, r), b| {
            (f + b.first_attempts, r + b.retries)
        });
        let earned = self
            .floor_milli
            .saturating_add(firsts.saturating_mul(self.ratio_milli));
        earned.saturating_sub(retries.saturating_mul(MILLI))
    }
}

/// Client-side adaptive throttling (Google SRE book, K = 2 by default).
///
/// The book's formula estimates the upstream's acceptance rate from a window
/// of traffic. Below [`AdaptiveThrottle::MIN_SAMPLES`] answers in the window
/// it is not an estimate: a fresh or idle worker whose one request was
/// refused would reject its first retry half the time (`(1 - 0) / (1 + 1)`),
/// so the throttle admits everything until the window holds enough answers.
/// The local budget's floor still bounds those retries.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    k: f64,
    window: Duration,
    min_samples: usize,
    /// (elapsed time, accepted?) for each request in the window, oldest first.
    history: VecDeque<(Duration, bool)>,
}

impl AdaptiveThrottle {
    /// The multiplier the SRE book recommends.
    pub const DEFAULT_K: f64 = 2.0;
    /// Answers the window must hold before the throttle rejects anything:
    /// with K = 2 and all ten refused, the first rejection probability is
    /// 10 / 11, so the throttle still bites hard once it has evidence.
    pub const MIN_SAMPLES: usize = 10;

    /// A throttle over `window` with multiplier `k`.
    ///
    /// # Panics
    /// If `k < 1` or not finite: below 1 it would reject traffic the upstream
    /// accepts.
    pub fn new(k: f64, window: Duration) -> Self {
        assert!(k.is_finite() && k >= 1.0, "AdaptiveThrottle K must be >= 1");
        AdaptiveThrottle {
            k,
            window,
            min_samples: Self::MIN_SAMPLES,
            history: VecDeque::new(),
        }
    }

    fn expire(&mut self, now: Duration) {
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > self.window)
        {
            self.history.pop_front();
        }
    }

    /// Sets the number of answers the window must hold before the throttle
    /// rejects anything (default [`Self::MIN_SAMPLES`]; 0 is the book's
    /// formula as written).
    pub fn with_min_samples(mut self, min_samples: usize) -> Self {
        self.min_samples = min_samples;
        self
    }

    /// The probability that the next request is rejected locally: zero
    /// until the window holds the minimum number of answers.
    pub fn reject_probability(&mut self, now: Duration) -> f64 {
        self.expire(now);
        if self.history.len() < self.min_samples {
            return 0.0;
        }
        let requests = self.history.len() as f64;
        let accepts = self.history.iter().filter(|(_, ok)| *ok).count() as f64;
        ((requests - self.k * accepts) / (requests + 1.0)).max(0.0)
    }

    /// Whether to send a request now, given a uniform draw in `[0, 1)`.
    pub fn admit(&mut self, now: Duration, draw: f64) -> bool {
        draw >= self.reject_probability(now)
    }

    /// Records a request the upstream answered: `accepted` is false for
    /// throttling and overload answers (429, 503, RESOURCE_EXHAUSTED).
    pub fn record(&mut self, now: Duration, accepted: bool) {
        self.expire(now);
        // Bounded by the window's traffic; the cap keeps a flood from growing
        // memory without bound while still giving a sharp estimate.
        if self.history.len() >= 100_000 {
            self.history.pop_front();
        }
        self.history.push_back((now, accepted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn floor_allows_retries_with_no_traffic() {
        let mut budget = LocalBudget::new(10 * SEC, 0.2, 1.0);
        assert_eq!(budget.available(Duration::ZERO), 10);
        for _ in 0..10 {
            assert!(budget.withdraw(Duration::ZERO));
        }
        assert!(!budget.withdraw(Duration::ZERO), "the floor is spent");
    }

    #[test]
    fn first_attempts_earn_the_ratio_exactly() {
        let mut budget = LocalBudget::new(10 * SEC, 0.2, 0.0);
        for _ in 0..4 {
            budget.deposit(Duration::ZERO);
        }
        assert_eq!(budget.available(Duration::ZERO), 0, "4 × 0.2 = 0.8 retries");
        budget.deposit(Duration::ZERO);
        assert_eq!(budget.available(Duration::ZERO), 1, "5 × 0.2 = 1 retry");
        assert!(budget.withdraw(Duration::ZERO));
        assert!(!budget.withdraw(Duration::ZERO));
    }

    #[test]
    fn spent_retries_age_out_of_the_window() {
        let mut budget = LocalBudget::new(10 * SEC, 0.0, 0.5);
        for _ in 0..5 {
            assert!(budget.withdraw(Duration::ZERO));
        }
        assert!(!budget.withdraw(5 * SEC));
        assert!(
            budget.withdraw(11 * SEC),
            "the first second left the window"
        );
    }

    #[test]
    fn throttle_admits_everything_while_the_upstream_accepts() {
        let mut throttle = AdaptiveThrottle::new(2.0, 120 * SEC);
        for i in 0..100 {
            throttle.record(i * SEC / 10, true);
        }
        assert_eq!(throttle.reject_probability(10 * SEC), 0.0);
        assert!(throttle.admit(10 * SEC, 0.0));
    }

    #[test]
    fn throttle_rejects_in_proportion_when_the_upstream_refuses() {
        let mut throttle = AdaptiveThrottle::new(2.0, 120 * SEC);
        // 100 requests, 10 accepted: p = (100 - 20) / 101.
        for i in 0..100 {
            throttle.record(Duration::from_millis(i), i < 10);
        }
        let p = throttle.reject_probability(SEC);
        assert!((p - 80.0 / 101.0).abs() < 1e-9, "{p}");
        assert!(!throttle.admit(SEC, 0.5));
        assert!(throttle.admit(SEC, 0.9));
    }

    #[test]
    fn throttle_needs_a_window_of_answers_before_it_rejects() {
        let mut throttle = AdaptiveThrottle::new(2.0, 120 * SEC);
        // A fresh worker whose first request was refused: no estimate yet.
        throttle.record(Duration::ZERO, false);
        assert_eq!(throttle.reject_probability(SEC), 0.0);
        assert!(throttle.admit(SEC, 0.0));
        for i in 1..AdaptiveThrottle::MIN_SAMPLES {
            assert_eq!(throttle.reject_probability(SEC), 0.0, "{i} answers");
            throttle.record(SEC, false);
        }
        let p = throttle.reject_probability(SEC);
        assert!((p - 10.0 / 11.0).abs() < 1e-9, "{p}");
        // The book's formula as written rejects the fresh worker half the time.
        let mut raw = AdaptiveThrottle::new(2.0, 120 * SEC).with_min_samples(0);
        raw.record(Duration::ZERO, false);
        assert!((raw.reject_probability(SEC) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn an_idle_worker_starts_over_once_its_window_empties() {
        let mut throttle = AdaptiveThrottle::new(2.0, 10 * SEC);
        for _ in 0..50 {
            throttle.record(Duration::ZERO, false);
        }
        assert!(throttle.reject_probability(SEC) > 0.9);
        // Idle past the window, then one refusal: too little to reject on.
        throttle.record(60 * SEC, false);
        assert_eq!(throttle.reject_probability(60 * SEC), 0.0);
    }

    #[test]
    fn throttle_forgets_outside_its_window() {
        let mut throttle = AdaptiveThrottle::new(2.0, 10 * SEC);
        for _ in 0..50 {
            throttle.record(Duration::ZERO, false);
        }
        assert!(throttle.reject_probability(SEC) > 0.9);
        assert_eq!(throttle.reject_probability(11 * SEC), 0.0);
    }
}
