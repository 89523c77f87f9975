//! A grant decided from plain numbers: the rule both stores run.
//!
//! [`BudgetLedger::grant`](super::BudgetLedger::grant) reads these
//! numbers from its window and workers; the Redis store reads them from a
//! script's reply and has the script take what they allow, atomically
//! (`store::redis::lease`). Each step is a function of its inputs alone, so
//! the two stores cannot disagree on a rule, only on what they read:
//!
//! 1. [`ClassLimits`]: from the window's first attempts, what the class's
//!    fair shares split and the "never up" caps on each class's spend.
//!    They depend on the first attempts only, never on spend, which is why
//!    a store may compute them ahead of reading the spend.
//! 2. [`fair_tokens`]: the worker's max-min fair share as whole tokens,
//!    with the equal-share shortcut ([`within_equal_share`]) and the "at
//!    least one token" rule.
//! 3. [`decide`]: the grant, which limit applied, what is left.

use crate::policy::{MILLI, Policy};
use crate::scope::Priority;

use super::GrantLimit;

/// The allowance, in milli-tokens before shares, of a window with `first`
/// first attempts: `min_retries_per_sec × window + retry_ratio × first`,
/// at most the ceiling.
pub fn allowance_of(policy: &Policy, first: u64) -> u64 {
    let formula = policy
        .floor_milli_per_sec
        .saturating_mul(u64::from(policy.window_secs))
        .saturating_add(policy.ratio_milli.saturating_mul(first));
    match policy.ceiling_per_window {
        Some(ceiling) => formula.min(ceiling.saturating_mul(MILLI)),
        None => formula,
    }
}

/// The share, in permille, of `class` and every class below it: the most
/// they may spend together.
pub fn shares_from(policy: &Policy, class: usize) -> u64 {
    Priority::ALL[class..]
        .iter()
        .map(|&p| policy.share(p))
        .sum()
}

/// `allowance × permille / 1000`, saturating.
pub(super) fn part(allowance: u64, permille: u64) -> u64 {
    // allowance ≤ ~1e17 (validated inputs), × 1000 stays inside u64 for
    // any realistic count; saturate rather than wrap for the rest.
    allowance.saturating_mul(permille) / 1000
}

/// What one class may spend, from an allowance: the caps of borrowing
/// down, never up (the module docs of [`crate::budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassLimits {
    /// What the class could reach, borrowing included: what fair shares
    /// split among its workers.
    pub capacity: u64,
    /// `caps[k]`, for every class `k` from critical down to this one: the
    /// most classes `k` and below may have spent together.
    caps: [u64; 3],
    class: usize,
}

impl ClassLimits {
    /// The limits of `class` under `allowance` milli-tokens.
    pub fn of(policy: &Policy, allowance: u64, class: usize) -> Self {
        let mut caps = [0; 3];
        for (k, cap) in caps.iter_mut().enumerate().take(class + 1) {
            *cap = part(allowance, shares_from(policy, k));
        }
        ClassLimits {
            capacity: caps[class],
            caps,
            class,
        }
    }

    /// Each cap with the class it counts from: classes `from` and below
    /// may have spent at most `cap` together.
    pub fn caps(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.caps[..=self.class].iter().copied().zip(0..)
    }

    /// What the class may still spend given each class's spend: the
    /// tightest cap.
    pub fn available(&self, spent: &[u64; 3]) -> u64 {
        self.caps()
            .map(|(cap, from)| {
                let used = spent[from..]
                    .iter()
                    .fold(0, |a: u64, &s| a.saturating_add(s));
                cap.saturating_sub(used)
            })
            .min()
            .unwrap_or(0)
    }
}

/// What `class` may still spend given each class's spend: the tightest of
/// the "never up" bounds of the class and every class above it.
pub fn available_of(policy: &Policy, allowance: u64, spent: &[u64; 3], class: usize) -> u64 {
    ClassLimits::of(policy, allowance, class).available(spent)
}

/// The most a worker may already hold for a demand of `want_milli` more to
/// be met in full without weighing the others: an equal share of
/// `capacity` among `tracked` workers, less the demand (`None`: no holding
/// is). The water-filling meets every demand within an equal share in full
/// (what is left per worker never falls below it), and any count of at
/// least the active workers gives the same answer, so a store may pass a
/// count it knows to be no smaller.
pub fn within_equal_share(capacity: u64, tracked: usize, want_milli: u64) -> Option<u64> {
    (capacity / tracked.max(1) as u64).checked_sub(want_milli)
}

/// What a worker's demand is for the fair share, seen at `seen_ms`, its
/// last lease at `last_lease_ms`, holding `held` and having gone without
/// `unmet` at that lease: `None` for a worker not seen within the window
/// (it takes no part); `u64::MAX` for one seen only through reports, whose
/// demand is unknown (it claims an equal share).
pub fn demand_of(
    now_ms: i64,
    window_ms: i64,
    seen_ms: i64,
    last_lease_ms: Option<i64>,
    held: u64,
    unmet: u64,
) -> Option<u64> {
    if seen_ms <= now_ms - window_ms {
        return None;
    }
    Some(match last_lease_ms {
        Some(at) if at > now_ms - window_ms => held.saturating_add(unmet),
        _ => u64::MAX,
    })
}

/// A worker's ask, for its fair share.
#[derive(Debug, Clone, Copy)]
pub struct FairAsk {
    /// What fair shares split (`ClassLimits::capacity`).
    pub capacity: u64,
    /// Workers the class tracks, the asking one included (or any larger
    /// count: [`within_equal_share`]).
    pub tracked: usize,
    /// Milli-tokens the worker holds in the window.
    pub own_held: u64,
    /// Milli-tokens it asks for.
    pub want_milli: u64,
    /// Milli-tokens per token.
    pub cost: u64,
}

/// The whole tokens a worker may take by its max-min fair share; `others`
/// gives the other workers' demands ([`demand_of`]), asked only when the
/// demand exceeds an equal share.
pub fn fair_tokens(ask: FairAsk, others: impl FnOnce() -> Vec<u64>) -> u64 {
    let own_demand = ask.own_held.saturating_add(ask.want_milli);
    let fair = if within_equal_share(ask.capacity, ask.tracked, ask.want_milli)
        .is_some_and(|most| ask.own_held <= most)
    {
        own_demand
    } else {
        max_min_share(ask.capacity, own_demand, &mut others())
    };
    tokens_of_share(fair, ask.own_held, ask.cost)
}

/// The whole tokens a fair share of `fair` milli-tokens leaves a worker
/// holding `own_held`. A fleet with more workers than the class has tokens
/// would round every equal share down to nothing, and no worker could
/// retry at all: a worker holding less than one token's cost may take one,
/// within the budget.
pub fn tokens_of_share(fair: u64, own_held: u64, cost: u64) -> u64 {
    let room = fair.saturating_sub(own_held);
    if room < cost && own_held < cost {
        1
    } else {
        room / cost
    }
}

/// The max-min fair allocation of `capacity` to the requester, whose demand
/// is `own`, among `others` (water-filling: the smallest demands are met in
/// full and what is left is split evenly among the rest).
pub fn max_min_share(capacity: u64, own: u64, others: &mut [u64]) -> u64 {
    // Only the demands below the requester's are met before its turn, in
    // ascending order: sort those alone (a fleet's unknown demands, which
    // claim everything, never are).
    let mut smaller = 0;
    for i in 0..others.len() {
        if others[i] < own {
            others.swap(i, smaller);
            smaller += 1;
        }
    }
    let mut n = others.len() as u64 + 1;
    let below = &mut others[..smaller];
    below.sort_unstable();
    let mut left = capacity;
    for &demand in &*below {
        left -= demand.min(left / n);
        n -= 1;
    }
    // Everyone left wants at least as much as the requester, so the
    // requester gets its demand or an even split of what is left.
    own.min(left / n)
}

/// A grant as [`decide`] makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// Whole retries granted.
    pub granted: u32,
    /// Why fewer than wanted, if so.
    pub limit: GrantLimit,
    /// Whole retries the class could still grant after this one.
    pub remaining: u64,
}

/// The grant of `want` tokens at `cost` milli-tokens each to a worker
/// whose fair share allows `by_fairness` tokens, from a class that may
/// still spend `available` milli-tokens.
pub fn decide(want: u32, by_fairness: u64, available: u64, cost: u64) -> Decided {
    let cost = cost.max(1);
    let by_budget = available / cost;
    let granted = u32::try_from(u64::from(want).min(by_fairness).min(by_budget)).unwrap_or(want);
    let limit = if granted == want {
        GrantLimit::None
    } else if by_budget <= by_fairness {
        GrantLimit::BudgetExhausted
    } else {
        GrantLimit::FairShare
    };
    Decided {
        granted,
        limit,
        remaining: (available - u64::from(granted) * cost) / cost,
    }
}
