//! The async gate: runs one intent's attempts on tokio time, driving the
//! decision [`engine`](crate::engine) and asking the fleet for what only the
//! fleet knows.
//!
//! # Why a gate and not a retry loop
//! A retry loop sleeps and sends again. The gate treats a failed attempt as
//! one input to an admission decision that is taken again, in full, before
//! every later attempt: the intent may have been cancelled or completed
//! meanwhile, its deadline may no longer fit, the scope's policy may have
//! changed, the fleet may have no retry token left, and this process may have
//! no capacity. A timer that elapsed proves none of that.
//!
//! # The decision order, per response
//! 1. **classify** the reply ([`Observation`](crate::engine::Observation)); report it to the fleet
//!    (first attempts, successes, throttling evidence with its raw hint and
//!    wall times).
//! 2. **effect known?** an unknown effect on a [`Repetition::Reconcile`]
//!    intent runs the reconcile hook *before* any replay: applied ends the
//!    intent `succeeded`, absent makes a replay a first performance.
//! 3. **repetition**, 4. **owner**, 6. **hint**, 7. **earliest time**: the
//!    engine ([`Intent::on_response`](crate::engine::Intent::on_response)).
//! 5. **scope**: the scope's cooldown, freeze and policy version from the
//!    lease cache's Watch-fed [`ScopeView`](crate::lease::ScopeView).
//! 8. **`Reconsider`**: the coordinator's slot may only move the start later
//!    ([`Intent::defer`](crate::engine::Intent::defer)). A slot further ahead than the coordinator's
//!    horizon comes as "ask again at": the gate waits until then (cancellable,
//!    as any wait) and asks again, never attempting at that instant
//!    ([`WaitEvidence::asked_again`] counts them). With the coordinator
//!    unreachable there is no slot, so the gate spreads the wait with local
//!    jitter instead.
//! 9. **wait** on tokio time; cancellation and completion evidence end the
//!    wait at once.
//! 10. **re-check** cancellation, the deadline at the *current* time and the
//!     scope's policy version (a changed version re-runs scope, `Reconsider` and wait).
//! 11. **admit**: a local capacity permit, then a leased token
//!     ([`LeaseCache::take`](crate::lease::LeaseCache::take)), then exactly one attempt under
//!     `tokio::time::timeout` of its reserved cap. The permit comes first
//!     because it can be given back; a token cannot.
//!
//! Before the first attempt, a scope whose known cooldown the coordinator
//! says first attempts should wait out (`ScopeView::hold_first_attempts`)
//! holds it the same way: `Reconsider` from the cooldown's end, then the first
//! attempt at its slot, or `deadline_infeasible` with no attempt when that
//! cannot fit ([`IntentResult::held`]).
//!
//! The result is the outcome, the last reply kept separately, and one
//! [`AttemptEvidence`] per attempt (never a payload).

//! # Layout
//! - `intent`: what a caller hands in and gets back ([`GateIntent`],
//!   [`Repetition`], [`Attempt`], [`Reply`], [`IntentResult`] and the
//!   per-attempt [`AttemptEvidence`]).
//! - `run`: the driver, one `Run` per call to [`Gate::run`], in the decision
//!   order above; `run::hold` holds a first attempt inside a cooldown,
//!   `run::wait` is the wait between attempts.
//! - `completion`: the registry [`Gate::complete`] delivers evidence through.
//! - `spans`: the `tollgate.intent` and `tollgate.attempt` spans.
//!
//! The messages sent to the coordinator are built in the crate's private
//! `wire` module.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::clock::Clock;
use crate::lease::LeaseCache;
use crate::link::LinkState;
use crate::outcome::Outcome;
use crate::telemetry;

mod completion;
mod intent;
mod lateness;
mod run;
mod spans;

use completion::Completion;
pub use intent::{
    Attempt, AttemptEvidence, BoxFuture, GateIntent, IntentResult, ReconcileHook, ReconcileQuery,
    Reconciled, Repetition, Reply, Shadowed, TokenSource, WaitEvidence,
};

/// Tuning for a [`Gate`].
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// Attempts in flight through this gate at once, first attempts
    /// included. A full gate refuses (`capacity_unavailable`) instead of
    /// queueing: a hidden queue would spend deadlines invisibly.
    pub max_in_flight: usize,
    /// Every wait is at least this long, whatever the policy floor and a
    /// jitter draw say, so the gate never retries immediately.
    pub min_wait: Duration,
    /// With the coordinator unreachable there is no slot to spread the fleet,
    /// so each wait gets up to this much extra local jitter (bounded by the
    /// wait itself and by the deadline).
    pub local_spread: Duration,
    /// Whether this host's wall clock may convert an HTTP-date hint.
    pub clock_trusted: bool,
    /// Seed for jitter draws; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            max_in_flight: 1024,
            min_wait: Duration::from_millis(10),
            local_spread: Duration::from_secs(1),
            clock_trusted: true,
            seed: None,
        }
    }
}

struct Inner {
    cache: LeaseCache,
    clock: Arc<dyn Clock>,
    capacity: Arc<Semaphore>,
    config: GateConfig,
    rng: Mutex<StdRng>,
    completions: DashMap<Arc<str>, Completion>,
    succeeded: Mutex<RecentIds>,
    /// How late attempts start after their slot: asked for on top of the
    /// attempt cap, so the slots given are ones an intent can take.
    lateness: lateness::Lateness,
}

/// Intent ids that ended `succeeded` lately, to count one that succeeds
/// again (a duplicate delivery: the caller ran the operation twice).
/// Bounded: the oldest is forgotten first.
#[derive(Default)]
struct RecentIds {
    order: std::collections::VecDeque<Arc<str>>,
    set: std::collections::HashSet<Arc<str>>,
}

/// Succeeded intent ids a gate remembers.
const RECENT_SUCCESSES: usize = 4096;

impl RecentIds {
    /// Records `id`; false when it was already there.
    fn insert(&mut self, id: &Arc<str>) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() >= RECENT_SUCCESSES
            && let Some(oldest) = self.order.pop_front()
        {
            self.set.remove(&oldest);
        }
        self.order.push_back(id.clone());
        self.set.insert(id.clone());
        true
    }
}

/// Runs intents under the fleet's budget and this process's limits. Cheap to
/// clone; clones share capacity, leases and the completion registry.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("cache", &self.inner.cache)
            .field("available", &self.inner.capacity.available_permits())
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate over `cache` (tokens, reports, scope views) with its own local
    /// capacity.
    pub fn new(cache: LeaseCache, clock: Arc<dyn Clock>, config: GateConfig) -> Self {
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        Gate {
            inner: Arc::new(Inner {
                cache,
                clock,
                capacity: Arc::new(Semaphore::new(config.max_in_flight)),
                config,
                rng: Mutex::new(rng),
                succeeded: Mutex::default(),
                completions: DashMap::new(),
                lateness: lateness::Lateness::default(),
            }),
        }
    }

    /// The lease cache the gate takes tokens from.
    pub fn cache(&self) -> &LeaseCache {
        &self.inner.cache
    }

    /// Whether the coordinator is usable right now.
    pub fn link_state(&self) -> LinkState {
        self.inner.cache.link().state()
    }

    /// Attempts that could start now without exceeding `max_in_flight`.
    pub fn available_capacity(&self) -> usize {
        self.inner.capacity.available_permits()
    }

    /// Delivers authoritative completion evidence for `intent_id`: a retry it
    /// is waiting for is dropped and the intent ends `succeeded`. Returns
    /// whether such an intent is running.
    pub fn complete(&self, intent_id: &str) -> bool {
        match self.inner.completions.get(intent_id) {
            Some(entry) => {
                entry.token.cancel();
                true
            }
            None => false,
        }
    }

    /// Runs `intent` to its end: the first attempt now, later ones only as
    /// the decision order admits them.
    pub async fn run<T, F, Fut>(&self, intent: GateIntent, attempt: F) -> IntentResult<T>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Reply<T>>,
    {
        let running = Running::start(&intent.scope().route);
        let intent_id = intent.intent_id.clone();
        let arrived = self.inner.clock.now();
        // The span model and its attributes: `telemetry` and docs/telemetry.md.
        let span = spans::intent_span(&intent);
        let result = run::Run::new(self, intent)
            .drive(attempt)
            .instrument(span.clone())
            .await;
        let outcome = result.outcome.as_str();
        spans::record_end(&span, outcome, result.attempts.len(), result.held.is_some());
        for a in &result.attempts {
            let class = a.record.classification.map_or("none", |c| c.class.as_str());
            telemetry::record_attempt(&running.route, class);
        }
        if result.outcome == Outcome::Succeeded {
            let first = self
                .inner
                .succeeded
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(&intent_id);
            if !first {
                telemetry::record_duplicate(&running.route);
            }
        }
        telemetry::record_intent(
            telemetry::IntentEnd {
                route: &running.route,
                outcome,
                age: self
                    .inner
                    .clock
                    .now()
                    .duration_since(arrived)
                    .unwrap_or_default(),
                attempts: result.attempts.len(),
            },
            result.attempts.iter().filter_map(|a| a.record.wait),
        );
        result
    }
}

/// Counts an intent as running while it is inside the gate, also when the
/// caller drops it midway.
struct Running {
    route: String,
}

impl Running {
    fn start(route: &str) -> Self {
        // Before the intent's own span: correlated means the caller's
        // context carries a trace.
        telemetry::record_started(route);
        Running {
            route: route.to_owned(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        telemetry::record_ended(&self.route);
    }
}
