//! The in-process upstream: what the fleet is protecting.
//!
//! # The capacity in force
//! C requests/s before the outage, `--outage-capacity` × C during it (0, a
//! full outage, by default), `--capacity-after` × C after it
//! ([`StormConfig::capacity_at`]). Every limiter shape below scales with it:
//! the bucket's refill and size, the windows' quotas. While it is 0 every
//! attempt is refused and nothing is owed for the refusals.
//!
//! # The limiter (`--limiter`), decided at each attempt's arrival
//! - **Token bucket** (`token-bucket`, the default): refilled at the
//!   capacity in force, holding `--burst` seconds of it (0.1 s by default,
//!   at least one request: a server can absorb a short burst, not a flood).
//!   An attempt that finds a whole token is served and takes it. Whatever
//!   was banked before the outage is lost when it starts; in a full outage
//!   the bucket stays empty until its end; when the capacity changes the
//!   bucket takes the new size, spilling what no longer fits.
//! - **Fixed window** (`fixed-window`): a quota of capacity in force ×
//!   `--window` seconds per window (1 s by default), the windows aligned to
//!   the run's start, the count reset at each boundary. An attempt is
//!   served if the count plus one fits the quota in force at its arrival.
//!   This is the shape with the boundary burst the method document warns
//!   of: a full quota just before a boundary and another just after it,
//!   two windows' worth within moments.
//! - **Sliding window** (`sliding-window`): at most capacity in force ×
//!   `--window` seconds of requests in any trailing `--window` seconds (an
//!   entry leaves the window exactly `--window` after it arrived). No
//!   boundary burst.
//!
//! `--window` must hold at least one request at every capacity in force
//! above 0, or that capacity could never serve.
//!
//! # Rejections cost capacity, in every shape
//! A refused attempt is answered 429 and still uses `--reject-cost` of a
//! request's capacity (0.3 by default) — parsing, authenticating and
//! refusing is work — so rejections compete with service:
//! - in the token bucket it takes `reject_cost` of a token, which may leave
//!   the bucket in debt, down to minus 1 s of capacity C (beyond it,
//!   rejection work is shed). The next tokens earned repay the debt before
//!   anything is served. So while the offered load is above C / reject_cost
//!   (3.3 × C at the default cost) nothing is served at all, and between C
//!   and that, `served + reject_cost × rejected ≈ C`: a retry storm delays
//!   the upstream's own recovery, as real overloads do. (Without the debt,
//!   a paused clock's millisecond ticks would let the first attempt of
//!   every tick through, whatever the load; with too small a bound, a herd
//!   arriving in one tick, as HTTP-date hints make it, would cost almost
//!   nothing. 1 s makes delay and date hints agree to a few points.)
//! - in the windows it counts toward the window's count at `reject_cost`
//!   (a fixed window forgets it at the boundary; in a sliding window it
//!   leaves `--window` later, and a refusal arriving when the window
//!   already carries 1 s of capacity C above its quota is shed, not
//!   counted).
//!
//! # `Retry-After`
//! Every 429 carries one, rounded up to a whole second in either form, so
//! no hint is ever earlier than the upstream meant:
//! - during a full outage, the time left in it; during a brownout, 1 s (it
//!   is serving, just less). With `--penalty-extending`, a 429 during the
//!   outage (full or brownout) asks for the outage's whole length again,
//!   like limiters that restart their penalty window on every rejected
//!   attempt: its hints stop counting down, and one received late in the
//!   outage outlasts it;
//! - outside the outage, the token bucket answers 1 s (an ordinary rate
//!   limiter's answer); the windows answer honestly, the time until an
//!   attempt would be admitted if no other came first: the fixed window
//!   until its next boundary, the sliding window until enough of its oldest
//!   counted requests have left (the oldest alone, unless refusals weigh
//!   in) — the countdown the method document describes.
//!
//! # The honest observer
//! The upstream counts every attempt it is offered per 100 ms, and checks
//! each one against the intent's real deadline and cancellation time,
//! whatever the runner believed.
//!
//! The limiter itself is `limiter.rs`, a pure state machine the clairvoyant
//! bound replays too.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tollgate_client::clock::Clock as _;

use super::limiter::{Decision, Limiter};
use super::stated;
use super::wall::VirtualWall;
use super::{HintStyle, StormConfig};

/// The width of one load bucket.
pub(crate) const BUCKET: Duration = Duration::from_millis(100);

/// The token bucket's `Retry-After` outside an outage.
const OVERLOAD_HINT: Duration = Duration::from_secs(1);

/// How the upstream answered one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Served.
    Ok,
    /// Refused for capacity, with the raw `Retry-After` header value.
    TooManyRequests {
        /// The header value, exactly as sent.
        retry_after: String,
    },
}

/// What the upstream saw during one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Attempts offered per 100 ms bucket since the start.
    pub(crate) offered: Vec<u32>,
    /// Attempts served per 100 ms bucket.
    pub(crate) served: Vec<u32>,
    /// Attempts refused per 100 ms bucket.
    pub(crate) refused: Vec<u32>,
    /// 429s sent.
    pub(crate) rejected: u64,
    /// Attempts that arrived at or after their intent's deadline.
    pub(crate) after_deadline: u64,
    /// Attempts that arrived after their intent was cancelled.
    pub(crate) after_cancel: u64,
}

/// The facts about an attempt's intent the upstream checks it against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Truth {
    pub(crate) deadline: Instant,
    pub(crate) cancel_at: Option<Instant>,
    /// Whether the token was already cancelled when the attempt was sent.
    pub(crate) token_cancelled: bool,
}

#[derive(Debug)]
struct State {
    limiter: Limiter,
    observed: Observed,
}

/// The upstream of one run.
#[derive(Debug)]
pub(crate) struct Upstream {
    config: StormConfig,
    start: Instant,
    wall: Arc<VirtualWall>,
    state: Mutex<State>,
}

impl Upstream {
    /// The upstream `config` describes (its limiter shape included), its
    /// time counted from `start`.
    pub(crate) fn new(config: &StormConfig, start: Instant, wall: Arc<VirtualWall>) -> Self {
        Upstream {
            config: config.clone(),
            start,
            wall,
            state: Mutex::new(State {
                limiter: Limiter::new(config, config.reject_cost),
                observed: Observed::default(),
            }),
        }
    }

    /// Handles one attempt: decides at arrival, answers after the service
    /// time. Dropping the future after its first poll (a cancelled caller)
    /// does not undo the attempt: the upstream already has it.
    pub(crate) async fn call(&self, truth: Truth) -> Answer {
        self.call_stated(truth).await.0
    }

    /// [`call`](Self::call), with the limit the upstream states on the
    /// answer (`--states-limit`; empty when it states none).
    pub(crate) async fn call_stated(&self, truth: Truth) -> (Answer, Vec<(&'static str, String)>) {
        let answer = self.offer(Instant::now(), truth);
        let stated = self.config.states_limit.map_or_else(Vec::new, |style| {
            let now = Instant::now() - self.start;
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            stated::headers(style, &state.limiter.quota_state(now))
        });
        tokio::time::sleep(self.config.service_time).await;
        (answer, stated)
    }

    fn offer(&self, at: Instant, truth: Truth) -> Answer {
        let now = at - self.start;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State { limiter, observed } = &mut *state;
        let index = usize::try_from(now.as_millis() / BUCKET.as_millis()).unwrap_or(usize::MAX);
        if observed.offered.len() <= index {
            observed.offered.resize(index + 1, 0);
            observed.served.resize(index + 1, 0);
            observed.refused.resize(index + 1, 0);
        }
        observed.offered[index] += 1;
        if at >= truth.deadline {
            observed.after_deadline += 1;
        }
        // Strictly after: a caller cancelling at the very instant an attempt
        // goes out is a tie, not a violation; a token already cancelled is.
        if truth.token_cancelled || truth.cancel_at.is_some_and(|c| at > c) {
            observed.after_cancel += 1;
        }
        match limiter.offer(now) {
            Decision::Admit => {
                observed.served[index] += 1;
                Answer::Ok
            }
            Decision::Refuse { admitted_in } => {
                observed.rejected += 1;
                observed.refused[index] += 1;
                Answer::TooManyRequests {
                    retry_after: self.retry_after(now, admitted_in),
                }
            }
        }
    }

    /// The `Retry-After` for a 429 at `now`; `admitted_in` is the
    /// limiter's honest wait, when its shape gives one.
    fn retry_after(&self, now: Duration, admitted_in: Option<Duration>) -> String {
        let config = &self.config;
        let delay = if (config.outage_start..config.outage_end).contains(&now) {
            let left = config.outage_end - now;
            if config.penalty_extending {
                config.outage_end - config.outage_start
            } else if config.outage_capacity == 0.0 {
                left
            } else {
                OVERLOAD_HINT
            }
        } else {
            // Never "0": a refused attempt is not admitted now.
            admitted_in.map_or(OVERLOAD_HINT, |d| d.max(Duration::from_nanos(1)))
        };
        match config.hint {
            HintStyle::Delay => {
                let whole = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
                whole.to_string()
            }
            HintStyle::Date => httpdate::fmt_http_date(ceil_to_second(self.wall.now() + delay)),
        }
    }

    /// What was seen so far.
    pub(crate) fn observed(&self) -> Observed {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observed
            .clone()
    }
}

/// The next whole second at or after `t`: an HTTP-date has no fraction, and
/// truncating would ask for a retry before the upstream meant.
fn ceil_to_second(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() > 0 => UNIX_EPOCH + Duration::from_secs(d.as_secs() + 1),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::test_config;

    fn config(extra: &[&str]) -> StormConfig {
        let mut words = vec![
            "--capacity",
            "10",
            "--outage-start-s",
            "5",
            "--outage-s",
            "3",
        ];
        words.extend_from_slice(extra);
        test_config(&words)
    }

    fn truth() -> Truth {
        Truth {
            deadline: Instant::now() + Duration::from_secs(3600),
            cancel_at: None,
            token_cancelled: false,
        }
    }

    fn upstream(config: &StormConfig) -> Upstream {
        let start = Instant::now();
        let wall = Arc::new(VirtualWall::new(config.wall_at_start, start));
        Upstream::new(config, start, wall)
    }

    #[tokio::test(start_paused = true)]
    async fn serves_its_burst_then_refuses_and_rejections_eat_capacity() {
        let up = upstream(&config(&[]));
        let now = Instant::now();
        let refused = |answer| matches!(answer, Answer::TooManyRequests { .. });
        // Burst: 100 ms of 10/s is one request; the 429 after it costs 0.3.
        assert_eq!(up.offer(now, truth()), Answer::Ok);
        assert!(refused(up.offer(now, truth())));
        // 100 ms later one token was earned, but 0.3 of it repays the
        // rejection: not a whole token, so refused (costing 0.3 more).
        let t = now + Duration::from_millis(100);
        assert!(refused(up.offer(t, truth())));
        // 60 ms more earns the 0.6 missing.
        let t = t + Duration::from_millis(60);
        assert_eq!(up.offer(t, truth()), Answer::Ok);
        let observed = up.observed();
        assert_eq!(observed.served.iter().sum::<u32>(), 2);
        assert_eq!(observed.offered.iter().sum::<u32>(), 4);
        assert_eq!(observed.rejected, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_outage_empties_the_bank_and_refills_only_after_its_end() {
        let up = upstream(&config(&[]));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        assert!(matches!(
            up.offer(at(5_500), truth()),
            Answer::TooManyRequests { .. }
        ));
        // 100 ms after the end (8 s) the bucket holds one token again.
        assert!(matches!(
            up.offer(at(8_050), truth()),
            Answer::TooManyRequests { .. }
        ));
        assert_eq!(up.offer(at(8_150), truth()), Answer::Ok);
    }

    #[tokio::test(start_paused = true)]
    async fn hints_are_whole_seconds_never_earlier_than_the_outage_end() {
        let up = upstream(&config(&[]));
        let t = Instant::now() + Duration::from_millis(6_300);
        let Answer::TooManyRequests { retry_after } = up.offer(t, truth()) else {
            panic!("capacity is zero in the outage");
        };
        assert_eq!(retry_after, "2", "1.7 s left rounds up");

        let up = upstream(&config(&["--hint", "date"]));
        tokio::time::sleep(Duration::from_millis(6_300)).await;
        let Answer::TooManyRequests { retry_after } = up.offer(Instant::now(), truth()) else {
            panic!("capacity is zero in the outage");
        };
        // The outage ends 8 s after 2026-01-01T00:00:00Z.
        assert_eq!(retry_after, "Thu, 01 Jan 2026 00:00:08 GMT");
    }

    #[tokio::test(start_paused = true)]
    async fn window_hints_say_when_an_attempt_would_be_admitted() {
        // 10 s windows of 100 at C = 10/s (no outage in sight): 50 sent at
        // 1 s, 50 at 3 s, then refused at 4 s and at 6 s. A fixed window
        // frees at its boundary (10 s); a sliding one when the 50 of 1 s
        // leave (11 s), the 429s' own weight notwithstanding.
        for (shape, hints) in [("fixed-window", ["6", "4"]), ("sliding-window", ["7", "5"])] {
            for style in ["delay", "date"] {
                let config = test_config(&[
                    "--capacity",
                    "10",
                    "--limiter",
                    shape,
                    "--window",
                    "10",
                    "--outage-start-s",
                    "100",
                    "--hint",
                    style,
                ]);
                let up = upstream(&config);
                let start = Instant::now();
                let send = |s: u64, n: usize| {
                    (0..n)
                        .map(|_| up.offer(start + Duration::from_secs(s), truth()))
                        .filter(|a| *a == Answer::Ok)
                        .count()
                };
                assert_eq!(send(1, 50) + send(3, 50), 100, "{shape}");
                for (s, hint) in [4, 6].into_iter().zip(hints) {
                    tokio::time::sleep_until(start + Duration::from_secs(s)).await;
                    let Answer::TooManyRequests { retry_after } = up.offer(Instant::now(), truth())
                    else {
                        panic!("{shape}: the window is full");
                    };
                    let expected = match style {
                        "delay" => hint.to_owned(),
                        // 2026-01-01T00:00:00Z plus the second it was sent
                        // plus the hint.
                        _ => format!(
                            "Thu, 01 Jan 2026 00:00:{:02} GMT",
                            s + hint.parse::<u64>().expect("a number")
                        ),
                    };
                    assert_eq!(retry_after, expected, "{shape} at {s} s");
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn counts_attempts_after_the_deadline_and_after_cancellation() {
        let up = upstream(&config(&[]));
        let now = Instant::now();
        let late = Truth {
            deadline: now,
            cancel_at: Some(now),
            token_cancelled: false,
        };
        up.offer(now, late);
        let observed = up.observed();
        assert_eq!(observed.after_deadline, 1, "at the deadline is too late");
        assert_eq!(observed.after_cancel, 0, "at the cancel instant is a tie");
        up.offer(now + Duration::from_millis(1), late);
        assert_eq!(up.observed().after_cancel, 1);
    }
}
