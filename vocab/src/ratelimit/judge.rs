//! The judgement [`read_rate_limit`](super::read_rate_limit) makes after
//! parsing: a readable statement → a verdict, converted once against the
//! receipt wall time. Every check is here; nothing after it re-reads a
//! reset against a newer clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{
    Absurdity, Contradiction, CurrentLimit, EPOCH_THRESHOLD_SECS, RateLimitRules,
    RateLimitStatement, RateLimitVerdict, ResetForm, ResetIn, StatedLimits, StatedReset,
};

/// The verdict on a readable statement: resolves each state against its
/// policy, converts its reset, and checks it: partition key, remaining
/// against quota, the reset's conversion, the reset against the window,
/// then against the cap.
pub(super) fn judge(
    statement: RateLimitStatement,
    received: SystemTime,
    rules: RateLimitRules,
) -> Result<StatedLimits, RateLimitVerdict> {
    let contradictory = |c| RateLimitVerdict::Contradictory(c);
    let mut current = Vec::with_capacity(statement.limits.len());
    for limit in statement.limits {
        let named = limit.policy.as_ref().and_then(|name| {
            statement
                .policies
                .iter()
                .find(|p| p.name.as_ref() == Some(name))
        });
        let quota = limit.quota.or(named.map(|p| p.quota));
        // A named policy gives its window; an `X-…-Limit` value is the quota
        // of the policies stated with it (Envoy's form), the longest of whose
        // windows bounds the reset.
        let window = match named {
            Some(p) => p.window,
            None => limit.quota.and_then(|q| {
                statement
                    .policies
                    .iter()
                    .filter(|p| p.quota == q)
                    .filter_map(|p| p.window)
                    .max()
            }),
        };
        let policy_key = named.and_then(|p| p.partition_key.clone());
        if let (Some(own), Some(policy_key)) = (&limit.partition_key, &policy_key)
            && own != policy_key
        {
            return Err(contradictory(Contradiction::PartitionKeyMismatch {
                policy: limit.policy,
            }));
        }
        if let Some(quota) = quota
            && limit.remaining > quota
        {
            return Err(contradictory(Contradiction::RemainingAboveQuota {
                policy: limit.policy,
                remaining: limit.remaining,
                quota,
            }));
        }
        let reset = match limit.reset {
            None => None,
            Some(stated) => Some(
                convert(stated, received, rules)
                    .map_err(|verdict| verdict.about(limit.policy.clone()))?,
            ),
        };
        if let (Some(reset), Some(window)) = (reset, window) {
            let slack = match reset.form {
                ResetForm::Seconds => Duration::ZERO,
                ResetForm::Epoch => rules.max_skew,
            };
            if reset.delay > window.saturating_add(slack) {
                return Err(contradictory(Contradiction::ResetBeyondWindow {
                    policy: limit.policy,
                    reset: reset.delay,
                    window,
                }));
            }
        }
        if let Some(reset) = reset
            && reset.delay > rules.max_reset
        {
            return Err(RateLimitVerdict::Absurd(Absurdity::ResetBeyondCap {
                policy: limit.policy,
                reset: reset.delay,
                cap: rules.max_reset,
            }));
        }
        current.push(CurrentLimit {
            policy: limit.policy,
            quota,
            window,
            remaining: limit.remaining,
            reset,
            partition_key: limit.partition_key.or(policy_key),
        });
    }
    Ok(StatedLimits {
        policies: statement.policies,
        current,
    })
}

/// Why a reset could not be converted, before the policy is named.
enum ResetProblem {
    ClockUntrusted,
    InPast(Duration),
    Disagree(Duration, Duration),
}

impl ResetProblem {
    fn about(self, policy: Option<String>) -> RateLimitVerdict {
        match self {
            ResetProblem::ClockUntrusted => RateLimitVerdict::ClockUntrusted,
            ResetProblem::InPast(by) => {
                RateLimitVerdict::Absurd(Absurdity::ResetInPast { policy, by })
            }
            ResetProblem::Disagree(reset, reset_after) => {
                RateLimitVerdict::Contradictory(Contradiction::ResetsDisagree {
                    reset,
                    reset_after,
                })
            }
        }
    }
}

/// Converts a stated reset to a delay from `received`, once.
fn convert(
    stated: StatedReset,
    received: SystemTime,
    rules: RateLimitRules,
) -> Result<ResetIn, ResetProblem> {
    let seconds = |secs| ResetIn {
        delay: Duration::from_secs(secs),
        form: ResetForm::Seconds,
    };
    match stated {
        StatedReset::After(secs) => Ok(seconds(secs)),
        StatedReset::Undecided(secs) if secs < EPOCH_THRESHOLD_SECS => Ok(seconds(secs)),
        StatedReset::Undecided(epoch) => {
            if !rules.clock_trusted {
                return Err(ResetProblem::ClockUntrusted);
            }
            // In seconds since the epoch, so no `SystemTime` arithmetic can
            // overflow; a receipt time before 1970 is a broken clock whose
            // every epoch lies ahead.
            let now = received.duration_since(UNIX_EPOCH).unwrap_or_default();
            let at = Duration::from_secs(epoch);
            match at.checked_sub(now) {
                Some(delay) => Ok(ResetIn {
                    delay,
                    form: ResetForm::Epoch,
                }),
                None if now - at <= rules.max_skew => Ok(ResetIn {
                    delay: Duration::ZERO,
                    form: ResetForm::Epoch,
                }),
                None => Err(ResetProblem::InPast(now - at)),
            }
        }
        StatedReset::Both { reset, after } => {
            let reset = convert(StatedReset::Undecided(reset), received, rules)?;
            let after = seconds(after);
            let apart = reset.delay.abs_diff(after.delay);
            if apart > rules.max_skew.saturating_add(Duration::from_secs(1)) {
                return Err(ResetProblem::Disagree(reset.delay, after.delay));
            }
            // The later of two agreeing statements: never the earlier guess.
            Ok(if reset.delay >= after.delay {
                reset
            } else {
                after
            })
        }
    }
}
