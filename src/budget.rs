//! The retry budget of one route: a sliding window, priority shares, leases
//! and max-min fair shares. Pure: no I/O, time comes in as `now_ms`.
//!
//! # Why a window of first attempts and not a token bucket per worker?
//! Every retry library already budgets per process; a fleet of 500 workers
//! with 10% each still retries at 500 × 10%. Here the allowance is computed
//! from the *fleet's* first attempts, reported by every worker:
//!
//! ```text
//! allowance = min_retries_per_sec × window + retry_ratio × first_attempts_in_window
//! ```
//!
//! counted in milli-tokens (×1000) so `0.2 × 7` is exactly `1400`. The window
//! is kept as per-second buckets, which is also its resolution.
//!
//! # Priority shares
//! The allowance is split by share (default critical 0.5, normal 0.3, bulk
//! 0.2) and each class spends only its own part: exhausting bulk can never
//! take critical's tokens. Shares are a strict partition, not a floor that
//! lower classes may borrow from — borrowing would make critical's share
//! depend on bulk's timing.
//!
//! # Leases
//! A lease is charged to the window when it is granted; `Release` refunds its
//! unspent tokens. A lease that expires unreported keeps its charge, i.e. its
//! tokens count as spent, so a worker that crashes holding tokens cannot make
//! the fleet exceed the formula.
//!
//! # Fairness
//! Grants are capped at each worker's max-min fair share of its class's
//! allowance among the workers active in the class within the window (leased
//! or reported). A worker's demand is what it holds plus what it still wants;
//! a worker seen only through reports has an unknown demand and claims an
//! equal share, so one greedy worker cannot starve nine modest ones that
//! happen to ask later.

use std::collections::{HashMap, VecDeque};

use crate::policy::{MILLI, Policy};
use crate::scope::{Priority, RetryClass};

/// The longest window, and so the number of per-second buckets kept.
pub const MAX_WINDOW_SECS: usize = 60;
/// Workers tracked per class; beyond it the least recently seen is forgotten.
pub const MAX_WORKERS_PER_CLASS: usize = 1024;
/// Leases outstanding per route; beyond it (after pruning expired ones) a
/// lease is refused, so a misbehaving fleet cannot grow memory without bound.
pub const MAX_LEASES_PER_ROUTE: usize = 4096;

/// Why a budget operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The lease is unknown, belongs to another worker, or has expired.
    #[error("lease not found or expired")]
    LeaseNotFound,
    /// `spent` is more than the lease granted.
    #[error("spent {spent} exceeds the {granted} tokens granted")]
    SpentExceedsGrant {
        /// Tokens the worker said it spent.
        spent: u32,
        /// Tokens the lease granted.
        granted: u32,
    },
    /// Too many leases outstanding on this route.
    #[error("too many leases outstanding on this route (max {MAX_LEASES_PER_ROUTE})")]
    TooManyLeases,
}

/// A per-second series over the last [`MAX_WINDOW_SECS`] seconds.
#[derive(Debug, Clone)]
struct Series {
    /// The second the newest bucket holds; never moves backwards, so a wall
    /// clock stepping back cannot resurrect spent tokens.
    head_sec: i64,
    buckets: [u64; MAX_WINDOW_SECS],
}

impl Series {
    fn new(now_sec: i64) -> Self {
        Series {
            head_sec: now_sec,
            buckets: [0; MAX_WINDOW_SECS],
        }
    }

    fn slot(sec: i64) -> usize {
        // rem_euclid of a positive modulus is in 0..60.
        usize::try_from(sec.rem_euclid(MAX_WINDOW_SECS as i64)).unwrap_or(0)
    }

    fn advance(&mut self, now_sec: i64) {
        if now_sec <= self.head_sec {
            return;
        }
        let gap = now_sec - self.head_sec;
        if gap >= MAX_WINDOW_SECS as i64 {
            self.buckets = [0; MAX_WINDOW_SECS];
        } else {
            for sec in self.head_sec + 1..=now_sec {
                self.buckets[Self::slot(sec)] = 0;
            }
        }
        self.head_sec = now_sec;
    }

    /// Adds to the newest bucket (a clock behind `head_sec` counts as now).
    fn add(&mut self, now_sec: i64, value: u64) -> i64 {
        self.advance(now_sec);
        let b = &mut self.buckets[Self::slot(self.head_sec)];
        *b = b.saturating_add(value);
        self.head_sec
    }

    /// Takes back from the bucket of `sec` if it is still kept.
    fn refund(&mut self, sec: i64, value: u64) {
        if sec <= self.head_sec && self.head_sec - sec < MAX_WINDOW_SECS as i64 {
            let b = &mut self.buckets[Self::slot(sec)];
            *b = b.saturating_sub(value);
        }
    }

    fn sum(&mut self, now_sec: i64, window_secs: u32) -> u64 {
        self.advance(now_sec);
        let window = i64::from(window_secs).min(MAX_WINDOW_SECS as i64);
        (0..window)
            .map(|back| self.buckets[Self::slot(self.head_sec - back)])
            .fold(0, u64::saturating_add)
    }
}

/// What one worker has done in one class recently.
#[derive(Debug, Clone)]
struct WorkerUse {
    last_seen_ms: i64,
    /// Whether the worker leased within the window; if not, its demand is
    /// unknown and it claims an equal share.
    last_lease_ms: Option<i64>,
    /// Milli-tokens the worker asked for and did not get at its last lease.
    unmet_milli: u64,
    /// Milli-tokens charged to this worker, per second (merged per second,
    /// so at most [`MAX_WINDOW_SECS`] entries).
    held: VecDeque<(i64, u64)>,
}

impl WorkerUse {
    fn new(now_ms: i64) -> Self {
        WorkerUse {
            last_seen_ms: now_ms,
            last_lease_ms: None,
            unmet_milli: 0,
            held: VecDeque::new(),
        }
    }

    fn held(&mut self, now_sec: i64, window_secs: u32) -> u64 {
        let oldest = now_sec - i64::from(window_secs) + 1;
        while self.held.front().is_some_and(|&(sec, _)| sec < oldest) {
            self.held.pop_front();
        }
        self.held
            .iter()
            .map(|&(_, m)| m)
            .fold(0, u64::saturating_add)
    }

    fn charge(&mut self, sec: i64, milli: u64) {
        match self.held.back_mut() {
            Some((last, m)) if *last == sec => *m = m.saturating_add(milli),
            _ => self.held.push_back((sec, milli)),
        }
    }

    fn refund(&mut self, sec: i64, milli: u64) {
        if let Some((_, m)) = self.held.iter_mut().find(|(s, _)| *s == sec) {
            *m = m.saturating_sub(milli);
        }
    }
}

/// One class's spend and workers.
#[derive(Debug, Clone)]
struct ClassLedger {
    spent: Series,
    workers: HashMap<String, WorkerUse>,
}

impl ClassLedger {
    fn touch(&mut self, worker_id: &str, now_ms: i64, window_ms: i64) -> &mut WorkerUse {
        if !self.workers.contains_key(worker_id) && self.workers.len() >= MAX_WORKERS_PER_CLASS {
            self.workers
                .retain(|_, w| w.last_seen_ms > now_ms - window_ms);
            if self.workers.len() >= MAX_WORKERS_PER_CLASS {
                let oldest = self
                    .workers
                    .iter()
                    .min_by_key(|(_, w)| w.last_seen_ms)
                    .map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    self.workers.remove(&oldest);
                }
            }
        }
        let worker = self
            .workers
            .entry(worker_id.to_owned())
            .or_insert_with(|| WorkerUse::new(now_ms));
        worker.last_seen_ms = worker.last_seen_ms.max(now_ms);
        worker
    }
}

/// A granted lease, kept until it is released or expires.
#[derive(Debug, Clone)]
struct LeaseRecord {
    worker_id: String,
    priority: Priority,
    granted: u32,
    cost_milli: u64,
    /// The bucket the grant was charged to, where a refund goes back.
    charged_sec: i64,
    expires_at_ms: i64,
}

/// Why a grant was smaller than the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantLimit {
    /// Everything wanted was granted.
    None,
    /// The class's budget for the window is spent.
    BudgetExhausted,
    /// The worker's fair share is smaller than what it wanted.
    FairShare,
    /// The scope is frozen (decided by the caller of [`BudgetLedger::grant`]).
    Frozen,
}

/// A request for tokens.
#[derive(Debug, Clone, Copy)]
pub struct GrantAsk<'a> {
    /// Who asks; fair shares are per worker.
    pub worker_id: &'a str,
    /// Which share to spend.
    pub priority: Priority,
    /// Which cost applies.
    pub retry_class: RetryClass,
    /// Whole retries wanted.
    pub want: u32,
    /// The coordinator's clock.
    pub now_ms: i64,
}

/// The result of a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Whole retries granted, `0..=want`.
    pub granted: u32,
    /// Why fewer than wanted, if so.
    pub limit: GrantLimit,
    /// Whole retries of this class the class could still grant.
    pub remaining: u64,
    /// When the lease's unreported tokens start counting as spent.
    pub expires_at_ms: i64,
}

/// One priority class's part of a [`BudgetSnapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassSnapshot {
    /// The class's share of the window's allowance, milli-tokens.
    pub allowance_milli: u64,
    /// Charged to the class in the window (outstanding leases included).
    pub spent_milli: u64,
    /// What the class can still lease: the balance an operator watches.
    pub available_milli: u64,
    /// Workers seen in the class within the window.
    pub active_workers: usize,
}

/// A route's budget at one instant, for the Admin API.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BudgetSnapshot {
    /// First attempts reported in the window.
    pub first_attempts: u64,
    /// The route's allowance for the window before shares, milli-tokens.
    pub allowance_milli: u64,
    /// By priority class, in [`Priority::index`] order.
    pub classes: [ClassSnapshot; 3],
    /// Leases granted and neither released nor expired.
    pub leases_outstanding: usize,
    /// Tokens those leases hold.
    pub tokens_outstanding: u64,
}

/// The budget of one route: first attempts, and spend per priority class.
#[derive(Debug, Clone)]
pub struct BudgetLedger {
    first_attempts: Series,
    classes: [ClassLedger; 3],
    leases: HashMap<String, LeaseRecord>,
}

impl BudgetLedger {
    /// An empty ledger starting at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        let sec = now_ms.div_euclid(1000);
        let class = || ClassLedger {
            spent: Series::new(sec),
            workers: HashMap::new(),
        };
        BudgetLedger {
            first_attempts: Series::new(sec),
            classes: [class(), class(), class()],
            leases: HashMap::new(),
        }
    }

    /// The route's allowance for the window in milli-tokens, before shares.
    pub fn allowance_milli(&mut self, policy: &Policy, now_ms: i64) -> u64 {
        let first = self
            .first_attempts
            .sum(now_ms.div_euclid(1000), policy.window_secs);
        let formula = policy
            .floor_milli_per_sec
            .saturating_mul(u64::from(policy.window_secs))
            .saturating_add(policy.ratio_milli.saturating_mul(first));
        match policy.ceiling_per_window {
            Some(ceiling) => formula.min(ceiling.saturating_mul(MILLI)),
            None => formula,
        }
    }

    fn class_allowance(&mut self, policy: &Policy, priority: Priority, now_ms: i64) -> u64 {
        // allowance ≤ ~1e17 (validated inputs), × 1000 stays inside u64 for
        // any realistic count; saturate rather than wrap for the rest.
        self.allowance_milli(policy, now_ms)
            .saturating_mul(policy.share(priority))
            / 1000
    }

    /// Milli-tokens `priority` can still spend in the current window.
    pub fn available_milli(&mut self, policy: &Policy, priority: Priority, now_ms: i64) -> u64 {
        let allowance = self.class_allowance(policy, priority, now_ms);
        let spent = self.classes[priority.index()]
            .spent
            .sum(now_ms.div_euclid(1000), policy.window_secs);
        allowance.saturating_sub(spent)
    }

    /// Records first attempts (they grow the allowance) and marks the worker
    /// active in its class.
    pub fn deposit(
        &mut self,
        policy: &Policy,
        worker_id: &str,
        priority: Priority,
        first_attempts: u32,
        now_ms: i64,
    ) {
        self.first_attempts
            .add(now_ms.div_euclid(1000), u64::from(first_attempts));
        self.classes[priority.index()].touch(worker_id, now_ms, policy.window_ms());
    }

    /// Grants up to `ask.want` retries, charging them to the window, and
    /// records a lease under `lease_id` when anything was granted.
    pub fn grant(
        &mut self,
        policy: &Policy,
        ask: GrantAsk<'_>,
        lease_id: &str,
    ) -> Result<Grant, BudgetError> {
        let now_sec = ask.now_ms.div_euclid(1000);
        let cost = policy.cost(ask.retry_class).max(1);
        let expires_at_ms = ask
            .now_ms
            .saturating_add(i64::try_from(policy.lease_ttl_ms).unwrap_or(i64::MAX));
        self.leases.retain(|_, l| l.expires_at_ms > ask.now_ms);
        if self.leases.len() >= MAX_LEASES_PER_ROUTE {
            return Err(BudgetError::TooManyLeases);
        }

        let capacity = self.class_allowance(policy, ask.priority, ask.now_ms);
        let available = self.available_milli(policy, ask.priority, ask.now_ms);
        let window_ms = policy.window_ms();
        let class = &mut self.classes[ask.priority.index()];
        class.touch(ask.worker_id, ask.now_ms, window_ms);

        // Everyone's demand, for the water-filling below.
        let mut demands = Vec::with_capacity(class.workers.len());
        let mut own_held = 0;
        let want_milli = u64::from(ask.want).saturating_mul(cost);
        for (id, worker) in &mut class.workers {
            if worker.last_seen_ms <= ask.now_ms - window_ms {
                continue;
            }
            let held = worker.held(now_sec, policy.window_secs);
            if id == ask.worker_id {
                own_held = held;
                continue;
            }
            demands.push(match worker.last_lease_ms {
                Some(at) if at > ask.now_ms - window_ms => held.saturating_add(worker.unmet_milli),
                _ => u64::MAX,
            });
        }
        let own_demand = own_held.saturating_add(want_milli);
        let fair = max_min_share(capacity, own_demand, &mut demands);
        let fair_room = fair.saturating_sub(own_held);

        let by_fairness = fair_room / cost;
        let by_budget = available / cost;
        let granted_u64 = u64::from(ask.want).min(by_fairness).min(by_budget);
        let granted = u32::try_from(granted_u64).unwrap_or(ask.want);
        let limit = if granted == ask.want {
            GrantLimit::None
        } else if by_budget <= by_fairness {
            GrantLimit::BudgetExhausted
        } else {
            GrantLimit::FairShare
        };

        let charge = u64::from(granted) * cost;
        let worker = class.touch(ask.worker_id, ask.now_ms, window_ms);
        worker.last_lease_ms = Some(ask.now_ms);
        worker.unmet_milli = want_milli - charge;
        if granted > 0 {
            let charged_sec = class.spent.add(now_sec, charge);
            let worker = class.touch(ask.worker_id, ask.now_ms, window_ms);
            worker.charge(charged_sec, charge);
            self.leases.insert(
                lease_id.to_owned(),
                LeaseRecord {
                    worker_id: ask.worker_id.to_owned(),
                    priority: ask.priority,
                    granted,
                    cost_milli: cost,
                    charged_sec,
                    expires_at_ms,
                },
            );
        }
        Ok(Grant {
            granted,
            limit,
            remaining: (available - charge) / cost,
            expires_at_ms,
        })
    }

    /// Ends a lease: refunds `granted − spent` tokens. An expired lease is
    /// gone (its tokens stay spent) and is [`BudgetError::LeaseNotFound`].
    pub fn release(
        &mut self,
        worker_id: &str,
        lease_id: &str,
        spent: u32,
        now_ms: i64,
    ) -> Result<u32, BudgetError> {
        let lease = match self.leases.get(lease_id) {
            Some(l) if l.worker_id == worker_id && l.expires_at_ms > now_ms => l,
            Some(l) if l.expires_at_ms <= now_ms => {
                self.leases.remove(lease_id);
                return Err(BudgetError::LeaseNotFound);
            }
            _ => return Err(BudgetError::LeaseNotFound),
        };
        if spent > lease.granted {
            return Err(BudgetError::SpentExceedsGrant {
                spent,
                granted: lease.granted,
            });
        }
        let lease = self
            .leases
            .remove(lease_id)
            .ok_or(BudgetError::LeaseNotFound)?;
        let returned = lease.granted - spent;
        let refund = u64::from(returned) * lease.cost_milli;
        let class = &mut self.classes[lease.priority.index()];
        class.spent.refund(lease.charged_sec, refund);
        if let Some(worker) = class.workers.get_mut(worker_id) {
            worker.refund(lease.charged_sec, refund);
        }
        Ok(returned)
    }

    /// The ledger as an operator sees it, at `policy` (a ratio changed a
    /// moment ago shows here at once: the allowance is recomputed from the
    /// same first attempts and spend, never refilled).
    pub fn snapshot(&mut self, policy: &Policy, now_ms: i64) -> BudgetSnapshot {
        let now_sec = now_ms.div_euclid(1000);
        let first_attempts = self.first_attempts.sum(now_sec, policy.window_secs);
        let allowance_milli = self.allowance_milli(policy, now_ms);
        let window_ms = policy.window_ms();
        let classes = Priority::ALL.map(|priority| {
            let allowance = self.class_allowance(policy, priority, now_ms);
            let class = &mut self.classes[priority.index()];
            let spent = class.spent.sum(now_sec, policy.window_secs);
            ClassSnapshot {
                allowance_milli: allowance,
                spent_milli: spent,
                available_milli: allowance.saturating_sub(spent),
                active_workers: class
                    .workers
                    .values()
                    .filter(|w| w.last_seen_ms > now_ms - window_ms)
                    .count(),
            }
        });
        let live = self.leases.values().filter(|l| l.expires_at_ms > now_ms);
        let (leases, tokens) = live.fold((0, 0u64), |(n, t), l| (n + 1, t + u64::from(l.granted)));
        BudgetSnapshot {
            first_attempts,
            allowance_milli,
            classes,
            leases_outstanding: leases,
            tokens_outstanding: tokens,
        }
    }

    /// Workers seen in the window, over every class: how many must agree
    /// before one worker's hint holds them all (`hints::corroboration`).
    pub fn active_workers(&self, now_ms: i64, window_ms: i64) -> usize {
        self.classes
            .iter()
            .map(|c| {
                c.workers
                    .values()
                    .filter(|w| w.last_seen_ms > now_ms - window_ms)
                    .count()
            })
            .sum()
    }

    /// Leases not yet expired, for idle eviction.
    pub fn live_leases(&self, now_ms: i64) -> usize {
        self.leases
            .values()
            .filter(|l| l.expires_at_ms > now_ms)
            .count()
    }
}

/// The max-min fair allocation of `capacity` to the requester, whose demand
/// is `own`, among `others` (water-filling: the smallest demands are met in
/// full and what is left is split evenly among the rest).
pub fn max_min_share(capacity: u64, own: u64, others: &mut [u64]) -> u64 {
    others.sort_unstable();
    let mut left = capacity;
    let mut n = others.len() as u64 + 1;
    for &demand in others.iter() {
        // Everyone from here on wants at least as much as the requester, so
        // the requester gets its demand or an even split of what is left.
        if own <= demand {
            return own.min(left / n);
        }
        left -= demand.min(left / n);
        n -= 1;
    }
    own.min(left / n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;

    const T0: i64 = 1_700_000_000_000;

    fn policy(spec: PolicySpec) -> Policy {
        Policy::try_new(&spec).expect("valid policy")
    }

    fn ask(worker: &str, want: u32, now_ms: i64) -> GrantAsk<'_> {
        GrantAsk {
            worker_id: worker,
            priority: Priority::Critical,
            retry_class: RetryClass::Transient,
            want,
            now_ms,
        }
    }

    #[test]
    fn the_allowance_is_the_formula_in_exact_milli_tokens() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(T0);
        assert_eq!(ledger.allowance_milli(&p, T0), 10 * 10 * 1000);
        ledger.deposit(&p, "w", Priority::Normal, 7, T0);
        assert_eq!(ledger.allowance_milli(&p, T0), 100_000 + 1400);
        // The first attempts slide out of the 10 s window.
        assert_eq!(ledger.allowance_milli(&p, T0 + 9_999), 101_400);
        assert_eq!(ledger.allowance_milli(&p, T0 + 10_000), 100_000);
    }

    #[test]
    fn changing_the_ratio_rescales_the_balance_and_never_refills_it() {
        let loose = Policy::default(); // floor 10/s, ratio 0.2, window 10 s
        let mut ledger = BudgetLedger::new(T0);
        ledger.deposit(&loose, "w", Priority::Critical, 1000, T0);
        let granted = ledger
            .grant(&loose, ask("w", 100, T0), "l1")
            .expect("grant");
        assert_eq!(granted.granted, 100);
        let before = ledger.snapshot(&loose, T0).classes[0];
        assert_eq!(before.allowance_milli, 150_000); // (100 + 200) × 0.5
        assert_eq!(before.available_milli, 50_000);
        let tight = policy(PolicySpec {
            retry_ratio: Some(0.05),
            ..PolicySpec::default()
        });
        let after = ledger.snapshot(&tight, T0).classes[0];
        assert_eq!(after.spent_milli, 100_000, "spend carries over");
        assert_eq!(after.allowance_milli, 75_000); // (100 + 50) × 0.5
        assert_eq!(after.available_milli, 0, "tightened below what is spent");
        let looser = policy(PolicySpec {
            retry_ratio: Some(0.4),
            ..PolicySpec::default()
        });
        let after = ledger.snapshot(&looser, T0).classes[0];
        assert_eq!(
            after.available_milli,
            250_000 - 100_000,
            "not a full budget"
        );
    }

    #[test]
    fn the_ceiling_caps_the_formula() {
        let p = policy(PolicySpec {
            max_retries_per_window: Some(5),
            ..PolicySpec::default()
        });
        let mut ledger = BudgetLedger::new(T0);
        assert_eq!(ledger.allowance_milli(&p, T0), 5000);
    }

    #[test]
    fn grants_never_exceed_the_class_share() {
        let p = Policy::default(); // critical: 0.5 × 100 tokens
        let mut ledger = BudgetLedger::new(T0);
        let mut total = 0;
        for i in 0..200 {
            let id = format!("w{}", i % 7);
            total += ledger
                .grant(&p, ask(&id, 3, T0), &format!("l{i}"))
                .expect("grant")
                .granted;
        }
        assert_eq!(total, 50);
    }

    #[test]
    fn throttled_retries_cost_double() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(T0);
        let g = ledger
            .grant(
                &p,
                GrantAsk {
                    retry_class: RetryClass::Throttled,
                    ..ask("w", 100, T0)
                },
                "l",
            )
            .expect("grant");
        assert_eq!(g.granted, 25);
        assert_eq!(g.limit, GrantLimit::BudgetExhausted);
    }

    #[test]
    fn release_refunds_unspent_and_expiry_keeps_the_charge() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(T0);
        let g = ledger.grant(&p, ask("w", 50, T0), "a").expect("grant");
        assert_eq!(g.granted, 50);
        assert_eq!(
            ledger.grant(&p, ask("w", 1, T0), "b").expect("g").granted,
            0
        );
        assert_eq!(ledger.release("w", "a", 20, T0 + 1), Ok(30));
        assert_eq!(
            ledger.release("w", "a", 0, T0 + 1),
            Err(BudgetError::LeaseNotFound)
        );
        let g = ledger.grant(&p, ask("w", 30, T0 + 2), "c").expect("grant");
        assert_eq!(g.granted, 30);
        // `c` expires unreported: its tokens stay spent.
        let after = T0 + 2 + 10_000;
        assert_eq!(
            ledger.release("w", "c", 0, after),
            Err(BudgetError::LeaseNotFound)
        );
        assert_eq!(
            ledger.available_milli(&p, Priority::Critical, T0 + 9_000),
            0
        );
    }

    #[test]
    fn another_workers_lease_cannot_be_released() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(T0);
        ledger.grant(&p, ask("a", 5, T0), "l").expect("grant");
        assert_eq!(
            ledger.release("b", "l", 0, T0),
            Err(BudgetError::LeaseNotFound)
        );
        assert!(matches!(
            ledger.release("a", "l", 6, T0),
            Err(BudgetError::SpentExceedsGrant { .. })
        ));
    }

    #[test]
    fn a_greedy_worker_cannot_starve_modest_ones() {
        let p = Policy::default(); // 50 critical tokens
        let mut ledger = BudgetLedger::new(T0);
        // Nine modest workers have been reporting: they are active.
        for i in 0..9 {
            ledger.deposit(&p, &format!("m{i}"), Priority::Critical, 0, T0);
        }
        let greedy = ledger
            .grant(&p, ask("greedy", 1000, T0), "g")
            .expect("grant");
        assert_eq!(greedy.granted, 5, "an equal share of 50 among 10");
        assert_eq!(greedy.limit, GrantLimit::FairShare);
        for i in 0..9 {
            let g = ledger
                .grant(&p, ask(&format!("m{i}"), 4, T0), &format!("m{i}"))
                .expect("grant");
            assert_eq!(g.granted, 4);
        }
        // What the modest ones left over goes to the greedy one.
        let more = ledger
            .grant(&p, ask("greedy", 1000, T0), "g2")
            .expect("grant");
        assert_eq!(more.granted, 50 - 5 - 36);
    }

    #[test]
    fn water_filling_meets_small_demands_first() {
        assert_eq!(max_min_share(100, 1000, &mut [10, 10, 1000]), 40);
        assert_eq!(max_min_share(100, 5, &mut [1000, 1000]), 5);
        assert_eq!(max_min_share(90, 1000, &mut [u64::MAX, u64::MAX]), 30);
        assert_eq!(max_min_share(100, 1000, &mut []), 100);
    }

    #[test]
    fn a_clock_stepping_back_does_not_resurrect_spent_tokens() {
        let p = Policy::default();
        let mut ledger = BudgetLedger::new(T0);
        assert_eq!(
            ledger.grant(&p, ask("w", 50, T0), "a").expect("g").granted,
            50
        );
        assert_eq!(
            ledger
                .grant(&p, ask("w", 1, T0 - 60_000), "b")
                .expect("g")
                .granted,
            0
        );
    }
}
