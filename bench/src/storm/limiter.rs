//! The upstream's limiter as a pure state machine over the time since the
//! run's start: one of three shapes ([`LimiterShape`]), scaled by the
//! capacity in force. `upstream.rs` documents what each shape does and asks
//! it about every attempt; the clairvoyant bound (`bound/`) replays its
//! schedules through the same code, so the bound and the benchmark cannot
//! disagree about what the upstream admits.
//!
//! Time is a `Duration` since the start (nanoseconds, like the tokio clock
//! that drives the upstream); nothing here reads a clock.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use super::StormConfig;
use super::stated::QuotaState;

/// Slack when a window's count is compared with its quota, both computed in
/// f64 from decimal flags: 300/s × 0.1 s must hold 30 requests, not 29.
pub(crate) const QUOTA_SLACK: f64 = 1e-9;

/// `--burst` when not given: a server can absorb a short burst, not a flood.
pub(crate) const DEFAULT_BURST_S: f64 = 0.1;

/// How far behind rejection work can put the upstream: at most this much of
/// its capacity C. Work beyond it is shed: a real server's queue is bounded,
/// and rejection work queued longer than this would be for callers that
/// have already given up.
const MAX_DEBT: Duration = Duration::from_secs(1);

/// The shape of the upstream's limiter, with its one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum LimiterShape {
    /// Refilled at the capacity in force, holding `burst_s` seconds of it.
    TokenBucket {
        /// Seconds of the capacity in force the bucket holds (at least one
        /// request's worth).
        burst_s: f64,
    },
    /// A quota of (capacity in force × `window_s`) per window, the windows
    /// aligned to the run's start, the count reset at each boundary.
    FixedWindow {
        /// The window's length, seconds.
        window_s: f64,
    },
    /// At most (capacity in force × `window_s`) in any trailing `window_s`.
    SlidingWindow {
        /// The window's length, seconds.
        window_s: f64,
    },
}

impl LimiterShape {
    /// Today's upstream: a token bucket holding 100 ms of capacity.
    pub const DEFAULT: LimiterShape = LimiterShape::TokenBucket {
        burst_s: DEFAULT_BURST_S,
    };

    /// A few words for the table's parameters line.
    pub fn describe(&self) -> String {
        match self {
            LimiterShape::TokenBucket { burst_s } => format!("token bucket, burst {burst_s} s"),
            LimiterShape::FixedWindow { window_s } => format!("fixed window of {window_s} s"),
            LimiterShape::SlidingWindow { window_s } => {
                format!("sliding window of {window_s} s")
            }
        }
    }
}

/// What the limiter said to one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Admitted: it used one request of capacity.
    Admit,
    /// Refused. `admitted_in` is how long until an attempt would be admitted
    /// if nothing else arrived, when the shape can say honestly (the
    /// windows); `None` for the token bucket, whose answer stays the
    /// ordinary 1 s.
    Refuse {
        /// The honest wait, when known.
        admitted_in: Option<Duration>,
    },
}

/// One limiter, from the run's start.
#[derive(Debug, Clone)]
pub(crate) struct Limiter {
    /// The capacity in force over time (`capacity_at`, `capacity_earned`,
    /// the outage's instants).
    config: StormConfig,
    /// What a refusal costs, as a fraction of a request: the run's
    /// `--reject-cost` for the upstream, 0 for the bound's scheduler.
    reject_cost: f64,
    /// [`MAX_DEBT`] in requests.
    max_debt: f64,
    /// The latest attempt offered: one arriving earlier (threads racing to
    /// the upstream's lock) is taken as arriving with it, so the state only
    /// moves forward.
    last: Duration,
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    Bucket(Bucket),
    Fixed(Fixed),
    Sliding(Sliding),
}

#[derive(Debug, Clone)]
struct Bucket {
    burst_s: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated: Duration,
}

#[derive(Debug, Clone)]
struct Fixed {
    window: Duration,
    /// The window `served` and `refused` count in.
    index: u64,
    served: u64,
    refused: u64,
}

#[derive(Debug, Clone)]
struct Sliding {
    window: Duration,
    /// Every admission and counted refusal still inside the window, oldest
    /// first. Each carries the running totals so far, so the weight left
    /// once any prefix has expired is one subtraction, and the honest wait
    /// one binary search.
    log: VecDeque<Entry>,
    served: u64,
    refused: u64,
    /// The running totals of the last entry that left the window.
    gone: (u64, u64),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: Duration,
    /// Admissions up to and including this entry.
    served: u64,
    /// Counted refusals up to and including this entry.
    refused: u64,
}

impl Limiter {
    /// The limiter `config` describes, at the run's start. Refusals cost
    /// `reject_cost` of a request.
    pub(crate) fn new(config: &StormConfig, reject_cost: f64) -> Self {
        let state = match config.limiter {
            LimiterShape::TokenBucket { burst_s } => State::Bucket(Bucket {
                burst_s,
                // Starts full: the upstream was idle before the run.
                tokens: bucket_size(config, burst_s, Duration::ZERO),
                updated: Duration::ZERO,
            }),
            LimiterShape::FixedWindow { window_s } => State::Fixed(Fixed {
                window: Duration::from_secs_f64(window_s),
                index: 0,
                served: 0,
                refused: 0,
            }),
            LimiterShape::SlidingWindow { window_s } => State::Sliding(Sliding {
                window: Duration::from_secs_f64(window_s),
                log: VecDeque::new(),
                served: 0,
                refused: 0,
                gone: (0, 0),
            }),
        };
        Limiter {
            config: config.clone(),
            reject_cost,
            max_debt: config.capacity * MAX_DEBT.as_secs_f64(),
            last: Duration::ZERO,
            state,
        }
    }

    /// Decides one attempt arriving `now` (since the start). Attempts are
    /// expected in time order; one earlier than the last is taken as
    /// arriving with it.
    pub(crate) fn offer(&mut self, now: Duration) -> Decision {
        let now = now.max(self.last);
        self.last = now;
        let cost = self.reject_cost;
        match &mut self.state {
            State::Bucket(b) => {
                b.tokens = bucket_at(&self.config, b, now);
                b.updated = now;
                if b.tokens >= 1.0 {
                    b.tokens -= 1.0;
                    return Decision::Admit;
                }
                b.tokens = (b.tokens - cost).max(-self.max_debt);
                Decision::Refuse { admitted_in: None }
            }
            State::Fixed(f) => {
                let index = window_index(now, f.window);
                if index != f.index {
                    *f = Fixed {
                        index,
                        served: 0,
                        refused: 0,
                        ..*f
                    };
                }
                let quota = quota(&self.config, f.window, now);
                let used = f.served as f64 + cost * f.refused as f64;
                if quota > 0.0 && used + 1.0 <= quota + QUOTA_SLACK {
                    f.served += 1;
                    return Decision::Admit;
                }
                // Nothing is owed in a full outage; the reset at the next
                // boundary forgets any other debt, so none is shed here.
                if quota > 0.0 {
                    f.refused += 1;
                }
                let boundary = window_start(index + 1, f.window);
                Decision::Refuse {
                    admitted_in: Some(boundary.saturating_sub(now)),
                }
            }
            State::Sliding(s) => {
                while let Some(first) = s.log.front().copied()
                    && first.at + s.window <= now
                {
                    s.gone = (first.served, first.refused);
                    s.log.pop_front();
                }
                let quota = quota(&self.config, s.window, now);
                let weight = s.weight_after(s.gone, cost);
                if quota > 0.0 && weight + 1.0 <= quota + QUOTA_SLACK {
                    s.served += 1;
                    s.push(now);
                    return Decision::Admit;
                }
                // Counted like an admission, at `cost`, unless the upstream
                // is fully down (nothing owed) or already carries
                // `MAX_DEBT` of rejection work above its quota (shed).
                if quota > 0.0 && cost > 0.0 && weight + cost <= quota + self.max_debt {
                    s.refused += 1;
                    s.push(now);
                }
                Decision::Refuse {
                    admitted_in: s
                        .free_at(quota - 1.0 + QUOTA_SLACK, cost)
                        .filter(|_| quota > 0.0)
                        .map(|at| at.saturating_sub(now)),
                }
            }
        }
    }

    /// The quota as it stands at `now`, after the attempt offered then: what
    /// the upstream states with `--states-limit` (`stated.rs` says what each
    /// shape states).
    pub(crate) fn quota_state(&self, now: Duration) -> QuotaState {
        let config = &self.config;
        let now = now.max(self.last);
        let capacity = config.capacity_at(now);
        let whole = |w: Duration| {
            let s = w.as_secs_f64();
            (s.fract() == 0.0 && s >= 1.0).then_some(s as u64)
        };
        let ceil_s = |d: Duration| (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1);
        let floor = |x: f64| if x > 0.0 { x.floor() as u64 } else { 0 };
        match &self.state {
            State::Bucket(b) => {
                let quota = capacity.ceil() as u64;
                QuotaState {
                    quota,
                    window_s: Some(1),
                    remaining: floor(bucket_at(config, b, now) + capacity).min(quota),
                    reset_s: 1,
                }
            }
            State::Fixed(f) => {
                let q = quota(config, f.window, now);
                let index = window_index(now, f.window);
                let used = if index == f.index {
                    f.served as f64 + self.reject_cost * f.refused as f64
                } else {
                    0.0
                };
                QuotaState {
                    quota: floor(q + QUOTA_SLACK),
                    window_s: whole(f.window),
                    remaining: floor(q - used + QUOTA_SLACK).min(floor(q + QUOTA_SLACK)),
                    reset_s: ceil_s(window_start(index + 1, f.window).saturating_sub(now)),
                }
            }
            State::Sliding(s) => {
                let q = quota(config, s.window, now);
                let live = s.log.iter().skip_while(|e| e.at + s.window <= now);
                let oldest = live.clone().next().map(|e| e.at + s.window);
                let gone = s
                    .log
                    .iter()
                    .take_while(|e| e.at + s.window <= now)
                    .last()
                    .map_or(s.gone, |e| (e.served, e.refused));
                let weight = s.weight_after(gone, self.reject_cost);
                QuotaState {
                    quota: floor(q + QUOTA_SLACK),
                    window_s: whole(s.window),
                    remaining: floor(q - weight + QUOTA_SLACK).min(floor(q + QUOTA_SLACK)),
                    reset_s: oldest.map_or(1, |at| ceil_s(at.saturating_sub(now))),
                }
            }
        }
    }

    /// The earliest instant at or after `now` at which an attempt would be
    /// admitted if no other arrived first; `None` if never (the capacity
    /// in force is 0 from some point on and nothing is admitted before).
    pub(crate) fn next_admission(&self, now: Duration) -> Option<Duration> {
        let config = &self.config;
        let mut t = now.max(self.last);
        loop {
            let brk = next_break(config, t);
            if config.capacity_at(t) > 0.0 {
                let candidate = match &self.state {
                    State::Bucket(b) => {
                        let tokens = bucket_at(config, b, t);
                        if tokens >= 1.0 {
                            Some(t)
                        } else {
                            let wait = (1.0 - tokens) / config.capacity_at(t);
                            Some(t + Duration::from_secs_f64(wait))
                        }
                    }
                    State::Fixed(f) => {
                        let index = window_index(t, f.window);
                        let used = if index == f.index {
                            f.served as f64 + self.reject_cost * f.refused as f64
                        } else {
                            0.0
                        };
                        if used + 1.0 <= quota(config, f.window, t) + QUOTA_SLACK {
                            Some(t)
                        } else {
                            // The next window starts empty.
                            Some(window_start(index + 1, f.window))
                                .filter(|_| 1.0 <= quota(config, f.window, t) + QUOTA_SLACK)
                        }
                    }
                    State::Sliding(s) => s
                        .free_at(
                            quota(config, s.window, t) - 1.0 + QUOTA_SLACK,
                            self.reject_cost,
                        )
                        .map(|at| at.max(t)),
                };
                if let Some(at) = candidate
                    && brk.is_none_or(|b| at < b)
                {
                    if self.admits(at) {
                        return Some(at);
                    }
                    // An f64 rounding a hair short of a token: a nanosecond
                    // later, which the loop re-examines.
                    t = at + Duration::from_nanos(1);
                    continue;
                }
            }
            t = brk?;
        }
    }

    /// Whether an attempt at `at` (not before the last one offered, which
    /// the caller ensures) would be admitted: the test [`offer`](Self::offer) makes, without its
    /// effects.
    fn admits(&self, at: Duration) -> bool {
        let config = &self.config;
        match &self.state {
            State::Bucket(b) => bucket_at(config, b, at) >= 1.0,
            State::Fixed(f) => {
                let used = if window_index(at, f.window) == f.index {
                    f.served as f64 + self.reject_cost * f.refused as f64
                } else {
                    0.0
                };
                let quota = quota(config, f.window, at);
                quota > 0.0 && used + 1.0 <= quota + QUOTA_SLACK
            }
            State::Sliding(s) => {
                let left = s.log.partition_point(|e| e.at + s.window <= at);
                let gone = match left.checked_sub(1).and_then(|i| s.log.get(i)) {
                    Some(e) => (e.served, e.refused),
                    None => s.gone,
                };
                let quota = quota(config, s.window, at);
                quota > 0.0 && s.weight_after(gone, self.reject_cost) + 1.0 <= quota + QUOTA_SLACK
            }
        }
    }
}

impl Sliding {
    fn push(&mut self, at: Duration) {
        self.log.push_back(Entry {
            at,
            served: self.served,
            refused: self.refused,
        });
    }

    /// The weight still counted once every entry up to the one whose
    /// running totals are `gone` has left.
    fn weight_after(&self, gone: (u64, u64), cost: f64) -> f64 {
        (self.served - gone.0) as f64 + cost * (self.refused - gone.1) as f64
    }

    /// The earliest instant at which the counted weight is at most `room`,
    /// if nothing more is counted: now (`Duration::ZERO`, to be maxed with
    /// the caller's instant) if it already is, else when the oldest entries
    /// have left. `None` if even an empty window is too much.
    fn free_at(&self, room: f64, cost: f64) -> Option<Duration> {
        if room < 0.0 {
            return None;
        }
        if self.weight_after(self.gone, cost) <= room {
            return Some(Duration::ZERO);
        }
        let first_enough = self
            .log
            .partition_point(|e| self.weight_after((e.served, e.refused), cost) > room);
        self.log.get(first_enough).map(|e| e.at + self.window)
    }
}

/// The capacity's change points (the outage's start and end), the next one
/// strictly after `t`.
pub(crate) fn next_break(config: &StormConfig, t: Duration) -> Option<Duration> {
    [config.outage_start, config.outage_end]
        .into_iter()
        .find(|&p| p > t)
}

/// A window's quota at `t`: the capacity in force over the window's length.
fn quota(config: &StormConfig, window: Duration, t: Duration) -> f64 {
    config.capacity_at(t) * window.as_secs_f64()
}

fn window_index(t: Duration, window: Duration) -> u64 {
    u64::try_from(t.as_nanos() / window.as_nanos().max(1)).unwrap_or(u64::MAX)
}

/// Where window `index` starts.
fn window_start(index: u64, window: Duration) -> Duration {
    let nanos = window.as_nanos().saturating_mul(u128::from(index));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The bucket's size at `t`: `burst_s` of the capacity in force, at least
/// one request (or no bucket could ever serve), none in a full outage.
pub(crate) fn bucket_size(config: &StormConfig, burst_s: f64, t: Duration) -> f64 {
    let capacity = config.capacity_at(t);
    if capacity == 0.0 {
        0.0
    } else {
        (burst_s * capacity).max(1.0)
    }
}

/// The bucket's tokens at `to`, from its state: refilled piece by piece
/// between the capacity's change points, capped at each piece's size, the
/// bank lost at the outage's start, nothing owed or banked while the
/// capacity in force is 0. Piecewise, so the answer does not depend on
/// when attempts happened to look at the bucket.
fn bucket_at(config: &StormConfig, bucket: &Bucket, to: Duration) -> f64 {
    let mut tokens = bucket.tokens;
    let mut from = bucket.updated;
    loop {
        let brk = next_break(config, from).filter(|&p| p <= to);
        let until = brk.unwrap_or(to.max(from));
        tokens = if config.capacity_at(from) == 0.0 {
            0.0
        } else {
            let earned = config.capacity_earned(from, until);
            (tokens + earned).min(bucket_size(config, bucket.burst_s, from))
        };
        let Some(p) = brk else {
            return tokens;
        };
        if p == config.outage_start {
            tokens = 0.0;
        }
        from = p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::test_config;

    fn at(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn limiter(words: &[&str], reject_cost: f64) -> Limiter {
        Limiter::new(&test_config(words), reject_cost)
    }

    fn admitted(limiter: &mut Limiter, t: Duration, n: usize) -> usize {
        (0..n)
            .filter(|_| limiter.offer(t) == Decision::Admit)
            .count()
    }

    #[test]
    fn a_fixed_window_resets_at_its_boundary_and_says_when() {
        let mut l = limiter(&["--capacity", "10", "--limiter", "fixed-window"], 0.3);
        assert_eq!(admitted(&mut l, at(0.1), 10), 10, "a quota of 10 × 1 s");
        assert_eq!(
            l.offer(at(0.1)),
            Decision::Refuse {
                admitted_in: Some(at(0.9))
            }
        );
        assert_eq!(l.next_admission(at(0.2)), Some(at(1.0)));
        assert_eq!(admitted(&mut l, at(0.999), 1), 0);
        assert_eq!(admitted(&mut l, at(1.0), 11), 10, "the boundary burst");
    }

    #[test]
    fn a_fixed_windows_refusals_count_toward_its_quota() {
        // A quota of 5 in [0, 0.5) (the brownout), 10 after, in one 1 s window.
        let words = [
            "--capacity",
            "10",
            "--limiter",
            "fixed-window",
            "--outage-start-s",
            "0",
            "--outage-s",
            "0.5",
            "--outage-capacity",
            "0.5",
        ];
        let mut l = limiter(&words, 0.3);
        assert_eq!(admitted(&mut l, at(0.1), 10), 5, "5 served, 5 refused");
        // Count 5 + 5 × 0.3 = 6.5: three more fit 10, not five.
        assert_eq!(admitted(&mut l, at(0.6), 10), 3);
        let mut free = limiter(&words, 0.0);
        admitted(&mut free, at(0.1), 10);
        assert_eq!(admitted(&mut free, at(0.6), 10), 5);
    }

    #[test]
    fn a_sliding_window_frees_as_its_oldest_leave() {
        let words = ["--capacity", "10", "--limiter", "sliding-window"];
        let mut l = limiter(&words, 0.0);
        for i in 0..10 {
            assert_eq!(l.offer(at(0.1 * f64::from(i))), Decision::Admit);
        }
        // Full: the one sent at 0 leaves at 1 s.
        let Decision::Refuse {
            admitted_in: Some(wait),
        } = l.offer(at(0.95))
        else {
            panic!("the window is full");
        };
        assert_eq!(wait, at(0.05));
        assert_eq!(l.next_admission(at(0.95)), Some(at(1.0)));
        assert_eq!(admitted(&mut l, at(1.0), 2), 1, "one left, one place");

        // A refusal weighs 0.3 and stays a whole window too: one sent at 0,
        // nine at 0.5 s. Without it, the one of 0 s leaving frees a place
        // (at 1 s); with it, 9.3 would still be counted then, so the nine
        // must leave too (at 1.5 s).
        for (cost, expected) in [(0.0, 0.3), (0.3, 0.8)] {
            let mut l = limiter(&words, cost);
            admitted(&mut l, at(0.0), 1);
            admitted(&mut l, at(0.5), 9);
            let Decision::Refuse {
                admitted_in: Some(wait),
            } = l.offer(at(0.7))
            else {
                panic!("the window is full");
            };
            assert_eq!(wait, at(expected), "reject cost {cost}");
        }
    }

    #[test]
    fn the_bucket_refills_at_the_capacity_in_force() {
        // C = 10/s, 0.1 s burst: a bucket of one, a token every 100 ms.
        let mut l = limiter(&["--capacity", "10"], 0.3);
        assert_eq!(l.offer(at(0.0)), Decision::Admit);
        assert_eq!(l.next_admission(at(0.0)), Some(at(0.1)));
        assert_eq!(l.offer(at(0.05)), Decision::Refuse { admitted_in: None });
        // 0.5 earned, 0.3 owed: 0.8 more needed at 10/s.
        assert_eq!(l.next_admission(at(0.05)), Some(at(0.13)));
        // A brownout at 0.5 × C from 1 s: 2 s of burst is 10 tokens there.
        let words = [
            "--capacity",
            "10",
            "--burst",
            "2",
            "--outage-start-s",
            "1",
            "--outage-s",
            "5",
            "--outage-capacity",
            "0.5",
        ];
        let mut l = limiter(&words, 0.3);
        assert_eq!(admitted(&mut l, at(0.5), 25), 20, "a bucket of 2 s × 10/s");
        // The bank is lost at 1 s; by 4 s, 3 s × 5/s = 15, capped at 10.
        assert_eq!(admitted(&mut l, at(4.0), 25), 10);
    }

    #[test]
    fn a_full_outage_refuses_every_shape_and_owes_nothing() {
        for shape in [
            &["--burst", "10"][..],
            &["--limiter", "fixed-window", "--window", "10"],
            &["--limiter", "sliding-window", "--window", "10"],
        ] {
            let words = [
                &[
                    "--capacity",
                    "10",
                    "--outage-start-s",
                    "5",
                    "--outage-s",
                    "3",
                ][..],
                shape,
            ]
            .concat();
            let mut l = limiter(&words, 0.3);
            assert_eq!(admitted(&mut l, at(1.0), 10), 10, "{shape:?}");
            assert_eq!(admitted(&mut l, at(6.0), 1000), 0, "{shape:?}");
            // The 1000 refusals in the outage cost nothing afterwards.
            let next = l.next_admission(at(6.0));
            let expected = match shape[0] {
                // The bank is lost at 5 s; a token at 8.1 s.
                "--burst" => at(8.1),
                // The window of [0, 10) still holds 10 of its 100.
                _ => at(8.0),
            };
            assert_eq!(next, Some(expected), "{shape:?}");
        }
    }
}
