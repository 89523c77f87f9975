//! `--states-limit`: the upstream states its limit on every answer, in one
//! of the two header styles upstreams use, so the coordinated strategy can
//! pace at the quota it is told instead of finding it by being refused.
//!
//! What each limiter shape states (`QuotaState`, from `limiter.rs`):
//! - **token bucket**: a quota of the capacity in force per second
//!   (its sustained rate), what its tokens and the next second's refill
//!   leave of it, resetting in a second;
//! - **fixed window**: its quota per window, what is left of it, and the
//!   time to the next boundary;
//! - **sliding window**: its quota per window, what the trailing window
//!   leaves, and the time until its oldest counted request leaves.
//!
//! Resets are whole seconds rounded up, as the headers carry them; a window
//! is stated only when it is whole seconds (the draft's `w` is an integer).

use serde::Serialize;

/// `--states-limit`: which header style the upstream states its limit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StatedStyle {
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`.
    Draft,
    /// `X-RateLimit-Limit` (Envoy's form, with the window), `-Remaining`,
    /// `-Reset` (seconds left).
    XRatelimit,
}

/// A limiter's quota as it stands at one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaState {
    /// Requests per window.
    pub(crate) quota: u64,
    /// The window, whole seconds; `None` when it is not whole seconds.
    pub(crate) window_s: Option<u64>,
    /// What is left of the quota (never above it).
    pub(crate) remaining: u64,
    /// Seconds until more comes back, rounded up, at least one.
    pub(crate) reset_s: u64,
}

/// The header fields stating `q` in `style`.
pub(crate) fn headers(style: StatedStyle, q: &QuotaState) -> Vec<(&'static str, String)> {
    let remaining = q.remaining.min(q.quota);
    match style {
        StatedStyle::Draft => {
            let window = q.window_s.map_or(String::new(), |w| format!(";w={w}"));
            vec![
                (
                    "ratelimit-policy",
                    format!("\"storm\";q={}{window}", q.quota),
                ),
                (
                    "ratelimit",
                    format!("\"storm\";r={remaining};t={}", q.reset_s),
                ),
            ]
        }
        StatedStyle::XRatelimit => {
            let limit = match q.window_s {
                Some(w) => format!("{}, {};w={w}", q.quota, q.quota),
                None => q.quota.to_string(),
            };
            vec![
                ("x-ratelimit-limit", limit),
                ("x-ratelimit-remaining", remaining.to_string()),
                ("x-ratelimit-reset", q.reset_s.to_string()),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use tollgate_client::ratelimit::{RateLimitRules, read_rate_limit};

    use super::*;

    #[test]
    fn both_styles_read_as_usable_with_the_same_numbers() {
        let q = QuotaState {
            quota: 1000,
            window_s: Some(1),
            remaining: 420,
            reset_s: 1,
        };
        for style in [StatedStyle::Draft, StatedStyle::XRatelimit] {
            let fields = headers(style, &q);
            let reading = read_rate_limit(
                fields.iter().map(|(n, v)| (*n, v.as_str())),
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                RateLimitRules::default(),
            );
            let limits = reading.verdict.usable().expect("usable");
            let current = &limits.current[0];
            assert_eq!(current.quota, Some(1000), "{style:?}");
            assert_eq!(current.window, Some(Duration::from_secs(1)), "{style:?}");
            assert_eq!(current.remaining, 420, "{style:?}");
        }
    }
}
