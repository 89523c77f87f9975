//! The retry budget of one route: a sliding window, priority shares, leases
//! and max-min fair shares. Pure: no I/O, time comes in as `now_ms`.
//!
//! The rules of a grant are functions of plain numbers (`grant`): this
//! module's [`BudgetLedger`] reads those numbers from its own window and
//! workers, the Redis store from a script's reply, and both apply the same
//! functions, so the rules exist once.
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
//! # Priority shares: borrowing down, never up
//! The allowance is split by share (default critical 0.2, normal 0.6, bulk
//! 0.2). A class spends its own share and whatever the classes *below* it
//! have left unspent, never what a class above it holds: critical may use
//! the whole allowance, normal everything but critical's share, bulk only
//! its own. Put as constraints, for every class `k` the spend of `k` and all
//! classes below it stays within the sum of their shares:
//!
//! ```text
//! available(c) = min over k ≤ c of  (Σ_{j ≥ k} share_j) × allowance − Σ_{j ≥ k} spent_j
//! ```
//!
//! so critical's share is a reserve no lower class can touch however greedy
//! or early it is, while a fleet that sends only normal work is not held to
//! 30 % of its budget (the strict partition this replaced): it gets 80 % at
//! the default shares. Borrowing up would make critical's reserve depend on
//! bulk's timing; borrowing down costs critical nothing, because what it
//! takes from below was unspent and the lower class is the one meant to
//! yield.
//!
//! # Leases, and the refund on success
//! A lease is charged to the window when it is granted; `Release` refunds its
//! unspent tokens and, like the AWS SDK's retry quota, the tokens of retries
//! that succeeded: the budget bounds *failing* retries, not recovery into
//! capacity the upstream has to spare. The refund goes back to the second
//! the lease was charged to, at the lease's cost per token, and never
//! exceeds what the lease spent, so a worker cannot mint budget by claiming
//! successes. A lease that expires unreported keeps its charge, i.e. its
//! tokens count as spent, so a worker that crashes holding tokens cannot make
//! the fleet exceed the formula.
//!
//! # Memory
//! A route's ledger is a few small vectors (see the `window` module for the series):
//! workers and leases are linear lists, bounded by
//! [`MAX_WORKERS_PER_CLASS`] and [`MAX_LEASES_PER_ROUTE`], because a grant
//! walks every worker of its class anyway (the fair share) and a hash map
//! costs hundreds of bytes before its first entry matters. A ledger with
//! nothing in its window ([`BudgetLedger::is_quiet`]) can be dropped by the
//! store and rebuilt on the next operation.
//!
//! # Counts of several tokens
//! First attempts are what a worker says it made; the coordinator cannot
//! see them. Where one caller token uses a scope, a worker that inflates
//! them inflates its own tenant's budget, which it could as well ignore.
//! Where several tokens may use a caller scope (the README's `shared-*`),
//! one token's report would grow the budget of the others' workers: a
//! million first attempts claimed by one token raised another's 80 tokens
//! to 160 000. So there each token's first attempts and spend are also
//! counted apart (the `tenant` of [`BudgetLedger::deposit`] and of
//! [`GrantAsk`]), and a grant to a token is bounded twice: by the scope's
//! budget, as always, and by the budget the token's own first attempts
//! would earn alone (the same formula, floor and ceiling, its own spend
//! against it). What one token may add to a window is therefore bounded,
//! for every other token, by nothing it says: another token's counts can
//! tighten a token's budget (the shared bound still holds the whole scope)
//! but never raise it past what its own traffic justifies. A tenant's
//! claims move only its own retries.
//!
//! # Fairness
//! Grants are capped at each worker's max-min fair share of its class's
//! allowance among the workers active in the class within the window (leased
//! or reported). A worker's demand is what it holds plus what it still wants;
//! a worker seen only through reports has an unknown demand and claims an
//! equal share, so one greedy worker cannot starve nine modest ones that
//! happen to ask later. A share is never less than one token for a worker
//! that holds less than one: with more workers than tokens every equal
//! share would round down to nothing, and a large fleet could never retry.

mod grant;
mod window;

pub use grant::{
    ClassLimits, Decided, FairAsk, allowance_of, available_of, decide, demand_of, fair_tokens,
    max_min_share, shares_from, tokens_of_share, within_equal_share,
};

use std::collections::HashMap;
use std::hash::BuildHasher as _;

use crate::policy::Policy;
use crate::scope::{Priority, RetryClass};
use crate::tenancy::{Owner, Tenant};

use window::{FIRST_ATTEMPTS, Window, spent_col};

/// The longest window, and so how long a second's counters are kept.
pub const MAX_WINDOW_SECS: usize = 60;
/// Workers tracked per class; beyond it the least recently seen is forgotten.
pub const MAX_WORKERS_PER_CLASS: usize = 1024;
/// Leases outstanding per route; beyond it (after pruning expired ones) a
/// lease is refused, so a misbehaving fleet cannot grow memory without bound.
pub const MAX_LEASES_PER_ROUTE: usize = 4096;

/// A new lease id: 128 random bits in hex. Unguessable, so a worker can
/// release only a lease it was told of (naming another worker's finds
/// nothing either way), and it says nothing of how many leases were
/// granted before it, to whom or how fast — a counter would tell every
/// tenant the others' lease rate. Unique across replicas and restarts
/// without coordinating.
pub fn new_lease_id() -> String {
    let mut id = String::with_capacity(32);
    for _ in 0..2 {
        let n: u64 = rand::random();
        for shift in (0..64).step_by(4).rev() {
            id.push(char::from(
                b"0123456789abcdef"[((n >> shift) & 0xf) as usize],
            ));
        }
    }
    id
}

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
    /// More retries succeeded than tokens were spent.
    #[error("retry_successes {successes} exceeds the {spent} tokens spent")]
    SuccessesExceedSpent {
        /// Retries the worker said succeeded.
        successes: u32,
        /// Tokens it said it spent.
        spent: u32,
    },
    /// Too many leases outstanding on this route.
    #[error("too many leases outstanding on this route (max {MAX_LEASES_PER_ROUTE})")]
    TooManyLeases,
}

/// What one worker has done in one class recently.
#[derive(Debug, Clone)]
struct WorkerUse {
    id: Box<str>,
    /// [`id_hash`] of `id`, compared before `id` when a class scans for a
    /// worker: each id is an allocation of its own, rarely in cache on a
    /// busy coordinator, and the scan then follows one pointer (the
    /// match's) instead of one per worker whose id has the same length.
    id_hash: u64,
    last_seen_ms: i64,
    /// Whether the worker leased within the window; if not, its demand is
    /// unknown and it claims an equal share.
    last_lease_ms: Option<i64>,
    /// Milli-tokens the worker asked for and did not get at its last lease.
    unmet_milli: u64,
    /// Milli-tokens charged to this worker, per second (merged per second,
    /// so at most [`MAX_WINDOW_SECS`] entries).
    held: Vec<(i64, u64)>,
}

impl WorkerUse {
    fn new(id: &str, now_ms: i64) -> Self {
        WorkerUse {
            id: id.into(),
            id_hash: id_hash(id),
            last_seen_ms: now_ms,
            last_lease_ms: None,
            unmet_milli: 0,
            held: Vec::new(),
        }
    }

    fn held(&mut self, now_sec: i64, window_secs: u32) -> u64 {
        let oldest = now_sec - i64::from(window_secs) + 1;
        let expired = self.held.partition_point(|&(sec, _)| sec < oldest);
        if expired > 0 {
            self.held.drain(..expired);
        }
        self.held
            .iter()
            .map(|&(_, m)| m)
            .fold(0, u64::saturating_add)
    }

    fn charge(&mut self, sec: i64, milli: u64) {
        match self.held.last_mut() {
            Some((last, m)) if *last == sec => *m = m.saturating_add(milli),
            _ => {
                if self.held.capacity() == 0 {
                    self.held.reserve_exact(1);
                }
                self.held.push((sec, milli));
            }
        }
    }

    fn refund(&mut self, sec: i64, milli: u64) {
        if let Some((_, m)) = self.held.iter_mut().find(|(s, _)| *s == sec) {
            *m = m.saturating_sub(milli);
        }
    }
}

/// A worker id's hash for [`ClassLedger`]'s scan. Only a filter in front
/// of comparing the ids, so unkeyed: ids chosen to collide cost their
/// sender what every scan cost before the filter.
fn id_hash(worker_id: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one(worker_id)
}

/// From this many workers a class finds one through its index: scanning a
/// few ids is cheaper than hashing one.
const INDEXED_FROM: usize = 32;

/// One class's workers.
#[derive(Debug, Clone, Default)]
struct ClassLedger {
    workers: Vec<WorkerUse>,
    /// Each worker's position in `workers`, kept from [`INDEXED_FROM`]
    /// workers on: every Lease and Report looks its worker up, and a scan
    /// is linear in the fleet (a thousand string compares on a busy route).
    /// SipHash, as the ids are peers' input.
    #[allow(clippy::box_collection)] // one pointer per quiet class, not a 48-byte map
    index: Option<Box<HashMap<Box<str>, usize>>>,
}

impl ClassLedger {
    fn position(&self, worker_id: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(worker_id).copied(),
            None => {
                let hash = id_hash(worker_id);
                self.workers
                    .iter()
                    .position(|w| w.id_hash == hash && &*w.id == worker_id)
            }
        }
    }

    /// Rebuilds the index after workers moved (or drops it below
    /// [`INDEXED_FROM`]).
    fn reindex(&mut self) {
        self.index = (self.workers.len() >= INDEXED_FROM).then(|| {
            Box::new(
                self.workers
                    .iter()
                    .enumerate()
                    .map(|(at, w)| (w.id.clone(), at))
                    .collect(),
            )
        });
    }

    /// Marks `worker_id` seen at `now_ms` (adding it if new); its index in
    /// `workers`, valid until the next `touch`.
    fn touch(&mut self, worker_id: &str, now_ms: i64, window_ms: i64) -> usize {
        let at = match self.position(worker_id) {
            Some(at) => at,
            None => {
                let before = self.workers.len();
                if self.workers.len() >= MAX_WORKERS_PER_CLASS {
                    self.workers.retain(|w| w.last_seen_ms > now_ms - window_ms);
                }
                if self.workers.len() >= MAX_WORKERS_PER_CLASS
                    && let Some(oldest) =
                        (0..self.workers.len()).min_by_key(|&i| self.workers[i].last_seen_ms)
                {
                    self.workers.swap_remove(oldest);
                }
                let moved = self.workers.len() < before;
                if self.workers.capacity() == 0 {
                    self.workers.reserve_exact(1);
                }
                self.workers.push(WorkerUse::new(worker_id, now_ms));
                let at = self.workers.len() - 1;
                match &mut self.index {
                    Some(index) if !moved => {
                        index.insert(worker_id.into(), at);
                    }
                    _ if moved || self.workers.len() >= INDEXED_FROM => self.reindex(),
                    _ => {}
                }
                at
            }
        };
        let worker = &mut self.workers[at];
        worker.last_seen_ms = worker.last_seen_ms.max(now_ms);
        at
    }

    fn get_mut(&mut self, worker_id: &str) -> Option<&mut WorkerUse> {
        let at = self.position(worker_id)?;
        self.workers.get_mut(at)
    }

    fn active(&self, now_ms: i64, window_ms: i64) -> usize {
        self.workers
            .iter()
            .filter(|w| w.last_seen_ms > now_ms - window_ms)
            .count()
    }
}

/// A granted lease, kept until it is released or expires.
#[derive(Debug, Clone)]
struct LeaseRecord {
    /// The lease id, then the worker id, in one allocation instead of two:
    /// every grant makes a record, on the Lease path.
    ids: Box<str>,
    /// Where the worker id starts in `ids`.
    worker_at: usize,
    priority: Priority,
    granted: u32,
    cost_milli: u64,
    /// The second the grant was charged to, where a refund goes back.
    charged_sec: i64,
    expires_at_ms: i64,
    /// The token whose own count was charged too, where several share the
    /// scope ([`Owner::NONE`]: none was).
    owner: Owner,
}

impl LeaseRecord {
    fn ids(lease_id: &str, worker_id: &str) -> (Box<str>, usize) {
        let mut ids = String::with_capacity(lease_id.len() + worker_id.len());
        ids.push_str(lease_id);
        ids.push_str(worker_id);
        (ids.into_boxed_str(), lease_id.len())
    }

    fn id(&self) -> &str {
        self.ids.get(..self.worker_at).unwrap_or_default()
    }

    fn worker_id(&self) -> &str {
        self.ids.get(self.worker_at..).unwrap_or_default()
    }
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
    /// The calling token: where several share the scope, its grant is
    /// also bounded by its own first attempts ("Counts of several
    /// tokens"); [`Tenant::NONE`] in open dev mode.
    pub tenant: Tenant,
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

/// What a worker says about a lease it ends.
#[derive(Debug, Clone, Copy)]
pub struct LeaseEnd<'a> {
    /// The worker the lease was granted to.
    pub worker_id: &'a str,
    /// The lease.
    pub lease_id: &'a str,
    /// Tokens spent on retries, `0..=granted`.
    pub spent: u32,
    /// Of those retries, how many succeeded, `0..=spent`: their tokens are
    /// credited back.
    pub retry_successes: u32,
    /// The coordinator's clock.
    pub now_ms: i64,
}

/// One priority class's part of a [`BudgetSnapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassSnapshot {
    /// The most the class could spend in the window: its share plus the
    /// shares of the classes below it, milli-tokens.
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

impl BudgetSnapshot {
    /// The snapshot of a window with `first_attempts` first attempts,
    /// `spent` by each class, `active` workers in each, and `outstanding`
    /// leases holding that many tokens: every store reads these and leaves
    /// the arithmetic to this.
    pub fn of(
        policy: &Policy,
        first_attempts: u64,
        spent: [u64; 3],
        active: [usize; 3],
        outstanding: (usize, u64),
    ) -> Self {
        let allowance_milli = allowance_of(policy, first_attempts);
        let classes = [0, 1, 2].map(|c| {
            let limits = ClassLimits::of(policy, allowance_milli, c);
            ClassSnapshot {
                allowance_milli: limits.capacity,
                spent_milli: spent[c],
                available_milli: limits.available(&spent),
                active_workers: active[c],
            }
        });
        BudgetSnapshot {
            first_attempts,
            allowance_milli,
            classes,
            leases_outstanding: outstanding.0,
            tokens_outstanding: outstanding.1,
        }
    }
}

/// One token's own first attempts and spend in a scope several tokens
/// share ("Counts of several tokens").
#[derive(Debug, Clone)]
struct TokenUse {
    owner: Owner,
    window: Window,
}

/// The budget of one route: first attempts, and spend per priority class.
#[derive(Debug, Clone)]
pub struct BudgetLedger {
    window: Window,
    classes: [ClassLedger; 3],
    leases: Vec<LeaseRecord>,
    /// Each token's own counts, kept only where several tokens share the
    /// caller scope (empty, and allocation-free, otherwise).
    tokens: Vec<TokenUse>,
}

impl BudgetLedger {
    /// An empty ledger starting at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        BudgetLedger {
            window: Window::new(now_ms.div_euclid(1000)),
            classes: Default::default(),
            leases: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// The route's allowance for the window in milli-tokens, before shares.
    pub fn allowance_milli(&mut self, policy: &Policy, now_ms: i64) -> u64 {
        let first = self
            .window
            .sum(now_ms.div_euclid(1000), policy.window_secs, FIRST_ATTEMPTS);
        allowance_of(policy, first)
    }

    /// `owner`'s own counts, made if it has none.
    fn token_use(&mut self, owner: Owner, now_ms: i64) -> &mut Window {
        let at = match self.tokens.iter().position(|t| t.owner == owner) {
            Some(at) => at,
            None => {
                self.tokens.push(TokenUse {
                    owner,
                    window: Window::new(now_ms.div_euclid(1000)),
                });
                self.tokens.len() - 1
            }
        };
        &mut self.tokens[at].window
    }

    /// What `tenant`'s own first attempts earn `class` and what its own
    /// grants spent, where several tokens share the scope: the milli-tokens
    /// it may still take of its own; `None` where one token uses it.
    fn own_available(
        &mut self,
        policy: &Policy,
        tenant: Tenant,
        class: usize,
        now_ms: i64,
    ) -> Option<u64> {
        if !tenant.shared() {
            return None;
        }
        let now_sec = now_ms.div_euclid(1000);
        let own = self.token_use(tenant.owner, now_ms);
        let first = own.sum(now_sec, policy.window_secs, FIRST_ATTEMPTS);
        let spent = [0, 1, 2].map(|c| own.sum(now_sec, policy.window_secs, spent_col(c)));
        Some(available_of(
            policy,
            allowance_of(policy, first),
            &spent,
            class,
        ))
    }

    fn spent(&mut self, policy: &Policy, now_ms: i64) -> [u64; 3] {
        let sec = now_ms.div_euclid(1000);
        [0, 1, 2].map(|c| self.window.sum(sec, policy.window_secs, spent_col(c)))
    }

    /// Milli-tokens `priority` can still spend in the current window.
    pub fn available_milli(&mut self, policy: &Policy, priority: Priority, now_ms: i64) -> u64 {
        let allowance = self.allowance_milli(policy, now_ms);
        let spent = self.spent(policy, now_ms);
        available_of(policy, allowance, &spent, priority.index())
    }

    /// Records first attempts (they grow the allowance) and marks the worker
    /// active in its class. Where several tokens share the scope, `tenant`'s
    /// first attempts are also counted as its own ("Counts of several
    /// tokens"); [`Tenant::NONE`] where none is known.
    pub fn deposit(
        &mut self,
        policy: &Policy,
        worker_id: &str,
        priority: Priority,
        first_attempts: u32,
        now_ms: i64,
        tenant: Tenant,
    ) {
        if first_attempts > 0 {
            let now_sec = now_ms.div_euclid(1000);
            self.window
                .add(now_sec, FIRST_ATTEMPTS, u64::from(first_attempts));
            if tenant.shared() {
                self.token_use(tenant.owner, now_ms).add(
                    now_sec,
                    FIRST_ATTEMPTS,
                    u64::from(first_attempts),
                );
            }
        }
        self.classes[priority.index()].touch(worker_id, now_ms, policy.window_ms());
    }

    /// Grants up to `ask.want` retries, charging them to the window, and
    /// records a lease under `lease_id` when anything was granted. Where
    /// several tokens share the scope, the grant to `ask.tenant` is also
    /// held within what its own first attempts earn ("Counts of several
    /// tokens").
    pub fn grant(
        &mut self,
        policy: &Policy,
        ask: GrantAsk<'_>,
        lease_id: &str,
    ) -> Result<Grant, BudgetError> {
        let tenant = ask.tenant;
        let now_sec = ask.now_ms.div_euclid(1000);
        let cost = policy.cost(ask.retry_class).max(1);
        let expires_at_ms = ask
            .now_ms
            .saturating_add(i64::try_from(policy.lease_ttl_ms).unwrap_or(i64::MAX));
        // Leases are kept in grant order (release removes in place), so the
        // expired ones are at the front unless the lease TTL changed; a
        // full sweep before refusing catches those.
        let expired = self
            .leases
            .iter()
            .take_while(|l| l.expires_at_ms <= ask.now_ms)
            .count();
        self.leases.drain(..expired);
        if self.leases.len() >= MAX_LEASES_PER_ROUTE {
            self.leases.retain(|l| l.expires_at_ms > ask.now_ms);
        }
        if self.leases.len() >= MAX_LEASES_PER_ROUTE {
            return Err(BudgetError::TooManyLeases);
        }

        let class_index = ask.priority.index();
        let allowance = self.allowance_milli(policy, ask.now_ms);
        let limits = ClassLimits::of(policy, allowance, class_index);
        let shared = limits.available(&self.spent(policy, ask.now_ms));
        let own = self.own_available(policy, tenant, class_index, ask.now_ms);
        let available = own.map_or(shared, |own| own.min(shared));
        let window_ms = policy.window_ms();
        let class = &mut self.classes[class_index];
        let me = class.touch(ask.worker_id, ask.now_ms, window_ms);

        let want_milli = u64::from(ask.want).saturating_mul(cost);
        let own_held = class.workers[me].held(now_sec, policy.window_secs);
        let fair = FairAsk {
            capacity: limits.capacity,
            tracked: class.workers.len(),
            own_held,
            want_milli,
            cost,
        };
        // Everyone else's demand, weighed only past an equal share.
        let by_fairness = fair_tokens(fair, || {
            let mut demands = Vec::with_capacity(class.workers.len());
            for (i, worker) in class.workers.iter_mut().enumerate() {
                if i == me {
                    continue;
                }
                let held = worker.held(now_sec, policy.window_secs);
                demands.extend(demand_of(
                    ask.now_ms,
                    window_ms,
                    worker.last_seen_ms,
                    worker.last_lease_ms,
                    held,
                    worker.unmet_milli,
                ));
            }
            demands
        });
        let Decided {
            granted,
            limit,
            remaining,
        } = decide(ask.want, by_fairness, available, cost);

        let charge = u64::from(granted) * cost;
        let worker = &mut class.workers[me];
        worker.last_lease_ms = Some(ask.now_ms);
        worker.unmet_milli = want_milli - charge;
        if granted > 0 {
            let charged_sec = self.window.add(now_sec, spent_col(class_index), charge);
            self.classes[class_index].workers[me].charge(charged_sec, charge);
            if own.is_some() {
                self.token_use(tenant.owner, ask.now_ms).add(
                    now_sec,
                    spent_col(class_index),
                    charge,
                );
            }
            if self.leases.capacity() == 0 {
                self.leases.reserve_exact(1);
            }
            let (ids, worker_at) = LeaseRecord::ids(lease_id, ask.worker_id);
            self.leases.push(LeaseRecord {
                ids,
                worker_at,
                priority: ask.priority,
                granted,
                cost_milli: cost,
                charged_sec,
                expires_at_ms,
                owner: if own.is_some() {
                    tenant.owner
                } else {
                    Owner::NONE
                },
            });
        }
        Ok(Grant {
            granted,
            limit,
            remaining,
            expires_at_ms,
        })
    }

    /// Ends a lease: credits back `granted − spent + retry_successes`
    /// tokens and returns that count. An expired lease is gone (its tokens
    /// stay spent) and is [`BudgetError::LeaseNotFound`].
    pub fn release(&mut self, end: LeaseEnd<'_>) -> Result<u32, BudgetError> {
        let Some(at) = self.leases.iter().position(|l| l.id() == end.lease_id) else {
            return Err(BudgetError::LeaseNotFound);
        };
        let lease = &self.leases[at];
        if lease.expires_at_ms <= end.now_ms {
            self.leases.remove(at);
            return Err(BudgetError::LeaseNotFound);
        }
        if lease.worker_id() != end.worker_id {
            return Err(BudgetError::LeaseNotFound);
        }
        if end.spent > lease.granted {
            return Err(BudgetError::SpentExceedsGrant {
                spent: end.spent,
                granted: lease.granted,
            });
        }
        if end.retry_successes > end.spent {
            return Err(BudgetError::SuccessesExceedSpent {
                successes: end.retry_successes,
                spent: end.spent,
            });
        }
        let lease = self.leases.remove(at);
        let returned = lease.granted - end.spent + end.retry_successes;
        let refund = u64::from(returned) * lease.cost_milli;
        let class = lease.priority.index();
        self.window
            .refund(lease.charged_sec, spent_col(class), refund);
        if let Some(own) = self.tokens.iter_mut().find(|t| t.owner == lease.owner) {
            own.window
                .refund(lease.charged_sec, spent_col(class), refund);
        }
        if let Some(worker) = self.classes[class].get_mut(end.worker_id) {
            worker.refund(lease.charged_sec, refund);
        }
        Ok(returned)
    }

    /// The ledger as an operator sees it, at `policy` (a ratio changed a
    /// moment ago shows here at once: the allowance is recomputed from the
    /// same first attempts and spend, never refilled).
    pub fn snapshot(&mut self, policy: &Policy, now_ms: i64) -> BudgetSnapshot {
        let now_sec = now_ms.div_euclid(1000);
        let first_attempts = self.window.sum(now_sec, policy.window_secs, FIRST_ATTEMPTS);
        let spent = self.spent(policy, now_ms);
        let window_ms = policy.window_ms();
        let active = [0, 1, 2].map(|c| self.classes[c].active(now_ms, window_ms));
        let live = self.leases.iter().filter(|l| l.expires_at_ms > now_ms);
        let (leases, tokens) = live.fold((0, 0u64), |(n, t), l| (n + 1, t + u64::from(l.granted)));
        BudgetSnapshot::of(policy, first_attempts, spent, active, (leases, tokens))
    }

    /// Workers seen in the window, over every class: how many must agree
    /// before one worker's hint holds them all (`hints::corroboration`).
    pub fn active_workers(&self, now_ms: i64, window_ms: i64) -> usize {
        self.classes
            .iter()
            .map(|c| {
                c.workers
                    .iter()
                    .filter(|w| w.last_seen_ms > now_ms - window_ms)
                    .count()
            })
            .sum()
    }

    /// Leases not yet expired, for idle eviction.
    pub fn live_leases(&self, now_ms: i64) -> usize {
        self.leases
            .iter()
            .filter(|l| l.expires_at_ms > now_ms)
            .count()
    }

    /// Whether nothing in the ledger can matter at `now_ms` or later under
    /// any policy: no counts within the longest window, no unexpired lease,
    /// no worker seen within it. A quiet ledger equals a new one, so a store
    /// may drop it and build a new one on the next operation.
    pub fn is_quiet(&mut self, now_ms: i64) -> bool {
        let longest_ms = MAX_WINDOW_SECS as i64 * 1000;
        let now_sec = now_ms.div_euclid(1000);
        self.tokens.retain_mut(|t| !t.window.is_empty(now_sec));
        self.window.is_empty(now_sec)
            && self.live_leases(now_ms) == 0
            && self
                .classes
                .iter()
                .all(|c| c.active(now_ms, longest_ms) == 0)
    }
}

#[cfg(test)]
mod tests;
