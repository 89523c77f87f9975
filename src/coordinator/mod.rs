//! The coordinator core: every operation of the coordinator, free of gRPC.
//!
//! A [`Coordinator`] owns what the operations share — the store, the
//! running policies, the [`EventHub`], the clock, the slot-jitter RNG and
//! the runtime [`Control`] (policy changes, freezes, resets, the audit log).
//! Each Budget operation here is: resolve the scope's policy, read the clock,
//! run **one** store operation, and publish what changed. The gRPC services
//! in [`crate::service`] only validate, authenticate, call one method here
//! and map the answer (limitador's core/server split); nothing here knows a
//! wire type, so adaptive pacing, hint corroboration or shared admin state
//! are added here, behind the same methods, and tested without sockets.
//!
//! # Events
//! Every state change is published by the core: cooldowns raised by a
//! report (here), freezes, policy changes and resets (in [`Control`], which
//! publishes on the same hub). Watch streams subscribe with
//! [`Coordinator::watch`], which subscribes *before* reading snapshots so no
//! change falls in between.

mod call_back;
mod report;
mod shadow;

use std::sync::{Arc, Mutex};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::broadcast;
use tollgate_vocab::clock::{Clock, to_unix_ms};

use crate::budget::{BudgetError, GrantAsk, GrantLimit, LeaseEnd};
use crate::control::Control;
use crate::events::{CooldownSupport, EventHub, ScopeSnapshot, StateChange};
use crate::pacing::cursor::{JITTER_SCALE, SlotAsk};
use crate::pacing::{Asker, PacingView};
use crate::policy::SharedPolicies;
use crate::scope::{RetryClass, RouteKey, ScopeKey};
use crate::store::{
    LeaseOutcome, Reconsidered, RouteView, ScopeDetail, ScopeFilter, ScopePage, Slotted, Store,
    StoreError,
};
use crate::tenancy::Tenant;

pub use report::{ReportIn, ReportOut, ReportedResponse};
use shadow::ShadowLease;

/// What a [`Coordinator`] is built from. The store, hub and control are
/// made by the caller (the server) because they outlive or feed other
/// parts: the relay shares the hub, the health check and the sweeper the
/// store.
pub struct CoreParts {
    /// Scope state; shared with the server's sweeper and health check.
    pub store: Arc<dyn Store>,
    /// The running policies; [`Control`] swaps in changed ones.
    pub policies: SharedPolicies,
    /// Where every change is published (and, with a relay, shared with
    /// the other replicas).
    pub hub: EventHub,
    /// The coordinator's clock: the authority for cooldowns and slots.
    pub clock: Arc<dyn Clock>,
    /// Seeds slot jitter so a run can be replayed; `None`: from the OS.
    pub rng_seed: Option<u64>,
    /// Runtime control over the same store, policies and hub.
    pub control: Control,
}

/// The coordinator core. Shared (`Arc`) by the Budget and Admin services
/// and the server's background tasks.
pub struct Coordinator {
    store: Arc<dyn Store>,
    policies: SharedPolicies,
    hub: EventHub,
    clock: Arc<dyn Clock>,
    /// Slot jitter. A mutex, not a per-call RNG: one seeded sequence makes
    /// a whole run replayable; the lock is held for one draw.
    rng: Mutex<StdRng>,
    control: Control,
    call_backs: call_back::CallBacks,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").finish_non_exhaustive()
    }
}

/// A lease as decided, with the policy version it was decided under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// What the store granted (under a shadow policy: what is let through).
    pub outcome: LeaseOutcome,
    /// Under a shadow policy, what enforcing would have done instead.
    pub shadowed: Option<Shadowed>,
    /// The scope's policy version at the grant.
    pub policy_version: u64,
    /// The coordinator's clock at the grant.
    pub now_ms: i64,
}

/// What a shadow policy let through: what enforcing would have done. The
/// worker's gate records the same, so both sides use one type.
pub use tollgate_vocab::outcome::Shadowed;

/// What `Reconsider` decided, with the state it was decided in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconsideration {
    /// A slot, a refusal, or frozen (under a shadow policy: what is let
    /// through).
    pub decided: Reconsidered,
    /// Under a shadow policy, what enforcing would have done instead.
    pub shadowed: Option<Shadowed>,
    /// The route's state at the decision.
    pub view: RouteView,
    /// The route's pacing at the decision.
    pub pacing: PacingView,
    /// The scope's policy version.
    pub policy_version: u64,
    /// The coordinator's clock at the decision.
    pub now_ms: i64,
}

/// An intent asking when to try again (the validated `Reconsider` request).
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    /// The waiting intent: asking again returns its slot.
    pub intent_id: &'a str,
    /// The worker's own not-before.
    pub not_before_ms: i64,
    /// The intent's deadline.
    pub deadline_ms: i64,
    /// Time the intent needs after its slot for one attempt.
    pub reserve_ms: i64,
    /// A retry, or a first attempt held for a slot.
    pub asker: Asker,
    /// Whom a new scope is charged to.
    pub tenant: Tenant,
}

impl Coordinator {
    /// A core from its parts.
    pub fn new(parts: CoreParts) -> Self {
        let rng = match parts.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng::<StdRng>(),
        };
        Coordinator {
            store: parts.store,
            policies: parts.policies,
            hub: parts.hub,
            clock: parts.clock,
            rng: Mutex::new(rng),
            control: parts.control,
            call_backs: call_back::CallBacks::default(),
        }
    }

    /// The runtime controls: policy set/delete/apply, freeze, unfreeze,
    /// reset, reload, the audit log. Each publishes its change on this
    /// core's hub.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Where every change is published.
    pub fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// The running policies.
    pub fn policies(&self) -> &SharedPolicies {
        &self.policies
    }

    /// The store, for what reads it apart from the operations (the
    /// scope-table metrics).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The coordinator's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The coordinator's clock, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        to_unix_ms(self.clock.now())
    }

    fn jitter(&self) -> u32 {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_range(0..JITTER_SCALE)
    }

    /// Grants up to `want` retry tokens of `scope` to `worker_id` of
    /// `tenant` (whose quota a new scope is charged to).
    pub async fn lease(
        &self,
        tenant: Tenant,
        scope: &ScopeKey,
        worker_id: &str,
        want: u32,
        retry_class: RetryClass,
    ) -> Result<Leased, StoreError> {
        let policy = self.policies.current().resolve(&scope.route);
        let now_ms = self.now_ms();
        let ask = GrantAsk {
            worker_id,
            priority: scope.priority,
            retry_class,
            want,
            now_ms,
            tenant,
        };
        let mut outcome = self.store.lease(scope, ask, &policy).await?;
        // A freeze is an operator's brake, not the policy being rolled out:
        // shadow mode never lifts it.
        let shadowed = (policy.shadow
            && outcome.grant.granted < want
            && outcome.grant.limit != GrantLimit::Frozen)
            .then(|| {
                let grant = &mut outcome.grant;
                grant.granted = want;
                grant.limit = GrantLimit::None;
                // A store that granted nothing may answer with no lifetime.
                if grant.expires_at_ms <= now_ms {
                    let ttl = i64::try_from(policy.lease_ttl_ms).unwrap_or(i64::MAX);
                    grant.expires_at_ms = now_ms.saturating_add(ttl);
                }
                let id = ShadowLease {
                    granted: want,
                    expires_at_ms: grant.expires_at_ms,
                    store_id: outcome.lease_id.as_deref(),
                }
                .id();
                outcome.lease_id = Some(id);
                Shadowed::WouldRefuse
            });
        Ok(Leased {
            outcome,
            shadowed,
            policy_version: policy.policy_version,
            now_ms,
        })
    }

    /// Ends a lease; returns the tokens refunded: the unspent ones and
    /// those of retries that succeeded.
    ///
    /// A shadow lease (a grant a shadow policy let through) is checked
    /// against the grant its Lease answered and answers `granted − spent +
    /// retry_successes` of that grant, as any lease; the store's part of
    /// it, if any, is released with the spend it can hold (the spend
    /// beyond it was let through and counted as shadowed).
    pub async fn release(
        &self,
        scope: &ScopeKey,
        worker_id: &str,
        lease_id: &str,
        spent: u32,
        retry_successes: u32,
    ) -> Result<u32, StoreError> {
        let now_ms = self.now_ms();
        let end = LeaseEnd {
            worker_id,
            lease_id,
            spent,
            retry_successes,
            now_ms,
        };
        let Some(lease) = ShadowLease::parse(lease_id) else {
            return self.store.release(scope, end).await;
        };
        if lease.expires_at_ms <= now_ms {
            return Err(BudgetError::LeaseNotFound.into());
        }
        if spent > lease.granted {
            return Err(BudgetError::SpentExceedsGrant {
                spent,
                granted: lease.granted,
            }
            .into());
        }
        if retry_successes > spent {
            return Err(BudgetError::SuccessesExceedSpent {
                successes: retry_successes,
                spent,
            }
            .into());
        }
        if let Some(store_id) = lease.store_id {
            let end = LeaseEnd {
                lease_id: store_id,
                ..end
            };
            match self.store.release(scope, end).await {
                Err(StoreError::Budget(BudgetError::SpentExceedsGrant { granted, .. })) => {
                    let end = LeaseEnd {
                        spent: granted,
                        retry_successes: retry_successes.min(granted),
                        ..end
                    };
                    self.store.release(scope, end).await?;
                }
                other => {
                    other?;
                }
            }
        }
        Ok(lease.granted - spent + retry_successes)
    }

    /// Gives a waiting intent a jittered slot on `route`'s cursor.
    pub async fn reconsider(
        &self,
        route: &RouteKey,
        request: SlotRequest<'_>,
    ) -> Result<Reconsideration, StoreError> {
        let policy = self.policies.current().resolve(route);
        let now_ms = self.now_ms();
        // Half a horizon: the time the intents a call-back reaches take to
        // ask (see `call_back`).
        let quiet_ms = policy.pacing.horizon_ms / 2;
        let ask = SlotAsk {
            intent_id: request.intent_id,
            floor_ms: request.not_before_ms,
            deadline_ms: request.deadline_ms,
            reserve_ms: request.reserve_ms,
            now_ms,
            jitter_ppm: self.jitter(),
            asker: request.asker,
            tenant: request.tenant,
            may_call_back: self.call_backs.due(route, now_ms, quiet_ms),
        };
        let Slotted {
            decided,
            view,
            pacing,
            pacing_was,
            call_back_until_ms,
        } = self.store.reconsider(route, ask, &policy).await?;
        self.announce_pacing(route, pacing_was, &pacing);
        if let Some(deadline_ms) = call_back_until_ms {
            self.call_backs.sent_at(route, now_ms, quiet_ms);
            self.hub.publish(StateChange::CallBack {
                route: route.clone(),
                deadline_ms,
            });
        }
        // Shadow: the cursor moved as enforcing would move it; the intent
        // goes as soon as it asked to (a freeze still holds it).
        let through = now_ms.max(request.not_before_ms);
        let (decided, shadowed) = match decided {
            _ if !policy.shadow => (decided, None),
            Reconsidered::Slot(at) | Reconsidered::AskAgain(at) if at > through => {
                (Reconsidered::Slot(through), Some(Shadowed::WouldDelay))
            }
            Reconsidered::DeadlineInfeasible(_) => {
                (Reconsidered::Slot(through), Some(Shadowed::WouldRefuse))
            }
            other => (other, None),
        };
        Ok(Reconsideration {
            decided,
            shadowed,
            view,
            pacing,
            policy_version: policy.policy_version,
            now_ms,
        })
    }

    /// Opens a watch on `scopes`: a receiver of every change published from
    /// now on, and each scope's state now. The receiver is taken first, so
    /// a change made while the snapshots are read is seen in both (harmless:
    /// applying a change twice is a no-op) rather than in neither.
    pub async fn watch(
        &self,
        scopes: &[ScopeKey],
    ) -> Result<(broadcast::Receiver<StateChange>, Vec<ScopeSnapshot>), StoreError> {
        let changes = self.hub.subscribe();
        let now_ms = self.now_ms();
        let policies = self.policies.current();
        let mut snapshots = Vec::with_capacity(scopes.len());
        for key in scopes {
            let view = self.store.view(&key.route, now_ms).await?;
            let policy = policies.resolve(&key.route);
            // A route already saturated, or under a corroborated cooldown
            // that closes it, holds first attempts: a watcher that knew only
            // the changes after it opened was told at once, and again with
            // every cooldown, that they need not wait.
            let detail = self.store.scope_detail(&key.route, &policy, now_ms).await?;
            let support = detail.as_ref().map_or_else(CooldownSupport::default, |d| {
                let evidence = d.evidence_in_force();
                CooldownSupport {
                    corroborated: evidence.corroboration.corroborated,
                    workers: evidence.corroboration.workers,
                    closed_until_ms: d.pacing.closed_until_ms,
                }
            });
            snapshots.push(ScopeSnapshot {
                key: key.clone(),
                cooldown_until_ms: view.cooldown_until_ms,
                policy_version: policy.policy_version,
                hold_first_attempts: policy.hold_first_attempts,
                frozen: view.frozen,
                pacing: detail.map(|d| d.pacing.mode),
                support,
            });
        }
        Ok((changes, snapshots))
    }

    /// Routes matching `filter`, a page at a time (Admin `ListScopes`).
    pub async fn list_scopes(
        &self,
        filter: &ScopeFilter,
        after: Option<&RouteKey>,
        limit: usize,
    ) -> Result<ScopePage, StoreError> {
        self.store
            .list_scopes(filter, after, limit, self.now_ms())
            .await
    }

    /// One route's live state with its budget at its current policy
    /// (Admin `GetScope`); `None` when the store holds nothing for it.
    pub async fn scope_detail(&self, route: &RouteKey) -> Result<Option<ScopeDetail>, StoreError> {
        let policy = self.policies.current().resolve(route);
        self.store.scope_detail(route, &policy, self.now_ms()).await
    }
}
