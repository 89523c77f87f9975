//! [`RedisStore`] and its [`Store`] implementation: each operation one
//! call of a library function (on a cluster, plus a read or write of the
//! caller key, which lives in another slot); concurrent Leases on one node
//! share a call (`queue`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::budget::{BudgetError, BudgetSnapshot, ClassSnapshot, GrantAsk, LeaseEnd};
use crate::hints::Merge;
use crate::pacing::Observation;
use crate::policy::Policy;
use crate::scope::{Priority, RouteKey, ScopeKey};
use crate::slots::SlotAsk;
use crate::store::{
    LeaseOutcome, ReportBatch, Reported, RouteView, ScopeDetail, ScopeFilter, ScopePage,
    ScopeSummary, Slotted, Store, StoreError, StoreFuture,
};

use super::connection::{Conn, RedisTarget, run_on};
use super::decide::{Turns, pacing_view, stored_pacing};
use super::queue::{LeaseQueue, Queued};
use super::reply::{
    MERGE_FIELDS, Reply, count, evidence_after, hints_at, lease_outcome, merges, summary_of,
    unsigned, view_at,
};
use super::scripts::{SCRIPTS, corroboration_args, hint_args};

/// The Redis [`Store`].
pub struct RedisStore {
    pub(super) conn: Conn,
    pub(super) target: RedisTarget,
    pub(super) prefix: String,
    pub(super) idle_ms: i64,
    pub(super) op_timeout: Duration,
    /// Lease ids are `nonce-counter`: unique across replicas (each draws
    /// its own nonce) and across restarts.
    pub(super) lease_nonce: u64,
    pub(super) next_lease: AtomicU64,
    /// Leases sent together (one node; on a cluster each goes alone),
    /// started by the first Lease, on the runtime that serves it.
    pub(super) queue: OnceLock<LeaseQueue>,
    /// A route's decisions in this process take turns (`decide`).
    pub(super) turns: Turns,
    /// Whether the prefix's store format was checked (`format`), and why
    /// it was refused if it was.
    pub(super) format_checked: AtomicBool,
    pub(super) refused: OnceLock<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target may carry a password: never printed.
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The keys of a route script and the caller floor to pass: on one node
    /// the script reads the caller key itself; on a cluster it is read
    /// first (another slot).
    pub(super) async fn route_keys(
        &self,
        route: &RouteKey,
    ) -> Result<(Vec<String>, i64, i64), StoreError> {
        let route_key = self.route_key(route);
        let caller_key = self.caller_key(&route.caller_scope);
        if !self.clustered() {
            return Ok((vec![route_key, caller_key], 0, 0));
        }
        let inv = SCRIPTS.caller.call(&[&caller_key]);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok((vec![route_key], reply.int(1)?, reply.int(2)?))
    }
    /// Runs `detail.lua`: the route's summary and, with a policy, its
    /// budget and hints; `None` when Redis holds nothing for the route.
    async fn detail_reply(
        &self,
        keys: &[String],
        caller: (i64, i64),
        policy: Option<&Policy>,
        now_ms: i64,
    ) -> Result<Option<Reply>, StoreError> {
        let mut inv = SCRIPTS.detail.call(keys);
        inv.arg(caller.0)
            .arg(caller.1)
            .arg(now_ms)
            .arg(u8::from(policy.is_some()));
        if let Some(policy) = policy {
            inv.arg(policy.window_secs)
                .arg(policy.floor_milli_per_sec)
                .arg(policy.ratio_milli)
                .arg(
                    policy
                        .ceiling_per_window
                        .map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX)),
                );
            for priority in Priority::ALL {
                inv.arg(policy.share(priority));
            }
        }
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok((reply.int(1)? == 1).then_some(reply))
    }

    /// Each route key is read by its own script after a SCAN (see
    /// [`Store::list_scopes`] on this store for what that guarantees).
    async fn list_now(
        &self,
        filter: &ScopeFilter,
        after: Option<&RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> Result<ScopePage, StoreError> {
        let pattern = format!("{}:{{*}}:r", self.prefix);
        let mut routes: Vec<RouteKey> = self
            .scan(&pattern)
            .await?
            .iter()
            .filter_map(|key| self.route_of(key))
            .filter(|k| {
                filter.caller_scope.matches(&k.caller_scope)
                    && filter.route.matches(&k.route)
                    && after.is_none_or(|a| k > a)
            })
            .collect();
        // SCAN may return a key more than once.
        routes.sort_unstable();
        routes.dedup();
        let mut scopes = Vec::new();
        let mut more = false;
        for route in routes {
            let (keys, ccd, cfloor) = self.route_keys(&route).await?;
            // Gone since the scan (expired or evicted): not listed.
            let Some(reply) = self
                .detail_reply(&keys, (ccd, cfloor), None, now_ms)
                .await?
            else {
                continue;
            };
            let summary = summary_of(&route, &reply)?;
            if filter.frozen_only && summary.view.frozen.is_none() {
                continue;
            }
            if scopes.len() == limit {
                more = true;
                break;
            }
            scopes.push(summary);
        }
        let next = if more {
            scopes.last().map(|s: &ScopeSummary| s.route.clone())
        } else {
            None
        };
        Ok(ScopePage { scopes, next })
    }

    async fn detail_now(
        &self,
        route: &RouteKey,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Option<ScopeDetail>, StoreError> {
        let inv = SCRIPTS
            .caller_detail
            .call(&[self.caller_key(&route.caller_scope)]);
        let caller = Reply::ok(self.run(&inv).await?)?;
        let (ccd, cfloor) = (caller.int(1)?, caller.int(2)?);
        let keys = [self.route_key(route)];
        let Some(r) = self
            .detail_reply(&keys, (ccd, cfloor), Some(policy), now_ms)
            .await?
        else {
            return Ok(None);
        };
        let summary = summary_of(route, &r)?;
        let class = |p: usize| -> Result<ClassSnapshot, StoreError> {
            let at = 10 + 4 * p;
            Ok(ClassSnapshot {
                allowance_milli: unsigned(r.int(at)?),
                spent_milli: unsigned(r.int(at + 1)?),
                available_milli: unsigned(r.int(at + 2)?),
                active_workers: count(r.int(at + 3)?),
            })
        };
        let budget = BudgetSnapshot {
            first_attempts: unsigned(r.int(8)?),
            allowance_milli: unsigned(r.int(9)?),
            classes: [class(0)?, class(1)?, class(2)?],
            leases_outstanding: summary.leases_outstanding,
            tokens_outstanding: unsigned(r.int(22)?),
        };
        Ok(Some(ScopeDetail {
            summary,
            budget,
            route_cooldown_until_ms: r.int(23)?,
            caller_cooldown_until_ms: ccd,
            backoff_step: u8::try_from(r.int(24)?).unwrap_or(u8::MAX),
            route_hints: hints_at(&r, 27)?,
            caller_hints: hints_at(&caller, 3)?,
            route_evidence: evidence_after(&r, 27, now_ms)?,
            caller_evidence: evidence_after(&caller, 3, now_ms)?,
            pacing: pacing_view(
                stored_pacing(r.bytes(26), now_ms, &policy.pacing)?,
                count(r.int(25)?),
                now_ms,
                &policy.pacing,
            ),
        }))
    }

    async fn reset_now(&self, route: &RouteKey, now_ms: i64) -> Result<bool, StoreError> {
        let mut inv = SCRIPTS.reset.call(&[self.route_key(route)]);
        inv.arg(now_ms).arg(self.idle_ms);
        Ok(Reply::ok(self.run(&inv).await?)?.int(1)? == 1)
    }

    async fn lease_now(
        &self,
        scope: &ScopeKey,
        ask: GrantAsk<'_>,
        policy: &Policy,
    ) -> Result<LeaseOutcome, StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(&scope.route).await?;
        let id = format!(
            "{:016x}-{:x}",
            self.lease_nonce,
            self.next_lease.fetch_add(1, Ordering::Relaxed)
        );
        // The numbers as one string of little-endian doubles, which the
        // script decodes in one step (lease.lua). Each is an integer: a
        // double holds it exactly below 2^53, and rounds a larger one (a
        // ceiling) as the script's `tonumber` of its decimal did.
        let ceiling = policy
            .ceiling_per_window
            .map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX));
        let numbers = [
            ccd as f64,
            cfloor as f64,
            ask.now_ms as f64,
            self.idle_ms as f64,
            (ask.priority.index() + 1) as f64,
            f64::from(ask.want),
            f64::from(policy.window_secs),
            policy.floor_milli_per_sec as f64,
            policy.ratio_milli as f64,
            ceiling as f64,
            policy.cost(ask.retry_class).max(1) as f64,
            policy.share(Priority::Critical) as f64,
            policy.share(Priority::Normal) as f64,
            policy.share(Priority::Bulk) as f64,
            policy.lease_ttl_ms as f64,
        ];
        let mut packed = [0u8; 8 * 15];
        for (at, n) in packed.chunks_exact_mut(8).zip(numbers) {
            at.copy_from_slice(&n.to_le_bytes());
        }
        let reply = if self.clustered() {
            let mut inv = SCRIPTS.lease.call(&keys);
            inv.arg(&packed[..]).arg(ask.worker_id).arg(&id);
            run_on(&self.conn, &inv, self.op_timeout).await?
        } else {
            let queue = self
                .queue
                .get_or_init(|| LeaseQueue::start(self.conn.clone(), self.op_timeout));
            let (reply, replied) = oneshot::channel();
            queue.push(Queued {
                keys,
                numbers: packed.to_vec(),
                worker: ask.worker_id.to_owned(),
                id,
                reply,
            })?;
            match tokio::time::timeout(self.op_timeout, replied).await {
                Ok(Ok(reply)) => reply?,
                Ok(Err(_)) => {
                    return Err(StoreError::Unavailable("redis lease queue stopped".into()));
                }
                Err(_) => {
                    return Err(StoreError::Unavailable(format!(
                        "redis did not answer within {:?}",
                        self.op_timeout
                    )));
                }
            }
        };
        lease_outcome(reply)
    }

    async fn release_now(&self, scope: &ScopeKey, end: LeaseEnd<'_>) -> Result<u32, StoreError> {
        let mut inv = SCRIPTS.release.call(&[self.route_key(&scope.route)]);
        inv.arg(end.now_ms)
            .arg(self.idle_ms)
            .arg(end.worker_id)
            .arg(end.lease_id)
            .arg(end.spent)
            .arg(end.retry_successes);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok(u32::try_from(reply.int(1)?).unwrap_or(0))
    }

    /// On one node, one script (`report.lua`) on the route and caller keys:
    /// the whole report is atomic. On a cluster the caller key lives in
    /// another slot, so its half (successes and uncertain hints) runs first
    /// in `report_caller.lua`, then the route's half with the caller's
    /// cooldown as it left it — each half atomic, the pair not (the same
    /// window the memory store has between its two maps).
    async fn report_now(
        &self,
        scope: &ScopeKey,
        report: ReportBatch<'_>,
        policy: &Policy,
    ) -> Result<Reported, StoreError> {
        let route_key = self.route_key(&scope.route);
        let caller_key = self.caller_key(&scope.route.caller_scope);
        let clustered = self.clustered();
        // Its pacing half is a decision on the route (`decide`).
        let _turn = self.turns.take(&route_key).await;
        // Which hints the route script merges; on a cluster the
        // caller-wide ones go to the caller's own script.
        let (caller_hints, route_hints): (Vec<usize>, Vec<usize>) =
            (0..report.hints.len()).partition(|&i| clustered && report.hints[i].caller_wide);
        let mut merged = vec![None; report.hints.len()];
        let (ccd, cfloor) = if !clustered {
            (0, 0)
        } else if report.successes > 0 || !caller_hints.is_empty() {
            // The route's active workers live in another slot: read them
            // first, so broadening is judged as on one node.
            let active = if caller_hints.is_empty() {
                0
            } else {
                let mut inv = SCRIPTS.active.call(&[&route_key]);
                inv.arg(report.now_ms)
                    .arg(policy.window_ms())
                    .arg(report.worker_id);
                Reply::ok(self.run(&inv).await?)?.int(1)?
            };
            let mut inv = SCRIPTS.report_caller.call(&[&caller_key]);
            inv.arg(report.now_ms)
                .arg(self.idle_ms)
                .arg(report.successes)
                .arg(policy.backoff_base_ms)
                .arg(policy.backoff_max_ms)
                .arg(caller_hints.len());
            for &i in &caller_hints {
                hint_args(&mut inv, &report.hints[i]);
            }
            inv.arg(report.worker_id).arg(active);
            corroboration_args(&mut inv, policy);
            let reply = Reply::ok(self.run(&inv).await?)?;
            for (&i, merge) in caller_hints.iter().zip(merges(&reply, caller_hints.len())?) {
                merged[i] = Some(merge);
            }
            let at = 1 + MERGE_FIELDS * caller_hints.len();
            (reply.int(at)?, reply.int(at + 1)?)
        } else {
            let (_, ccd, cfloor) = self.route_keys(&scope.route).await?;
            (ccd, cfloor)
        };
        let keys: &[&String] = if clustered {
            &[&route_key]
        } else {
            &[&route_key, &caller_key]
        };
        let mut inv = SCRIPTS.report.call(keys);
        inv.arg(ccd)
            .arg(cfloor)
            .arg(report.now_ms)
            .arg(self.idle_ms)
            .arg(report.worker_id)
            .arg(scope.priority.index() + 1)
            .arg(report.first_attempts)
            .arg(report.successes)
            .arg(policy.window_secs)
            .arg(policy.backoff_base_ms)
            .arg(policy.backoff_max_ms)
            .arg(route_hints.len());
        for &i in &route_hints {
            hint_args(&mut inv, &report.hints[i]);
        }
        corroboration_args(&mut inv, policy);
        let reply = Reply::ok(self.run(&inv).await?)?;
        for (&i, merge) in route_hints.iter().zip(merges(&reply, route_hints.len())?) {
            merged[i] = Some(merge);
        }
        let merges: Vec<Merge> = merged.into_iter().flatten().collect();
        let at = 1 + MERGE_FIELDS * route_hints.len();
        let view = view_at(&reply, at)?;
        let hint_ends = report.agreed_hint_ends(&merges);
        let counted = report.window_counts();
        let observation = Observation {
            now_ms: report.now_ms,
            first_attempts: counted.first_attempts,
            successes: counted.successes,
            rejections: counted.rejections,
            hint_until_ms: &hint_ends,
            cooldown_until_ms: reply.int(at + 4)?,
            cooldown_after_ms: view.cooldown_until_ms,
        };
        let (pacing, pacing_was) = self
            .observe_pacing(
                &route_key,
                &observation,
                reply.int(at + 5)?,
                reply.bytes(at + 6).map(<[u8]>::to_vec),
                count(reply.int(at + 7)?),
                &policy.pacing,
            )
            .await?;
        Ok(Reported {
            merges,
            view,
            pacing,
            pacing_was,
            cooldown_corroborated: reply.int(at + 3)? == 1,
        })
    }

    async fn view_now(&self, route: &RouteKey, now_ms: i64) -> Result<RouteView, StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(route).await?;
        let mut inv = SCRIPTS.view.call(&keys);
        inv.arg(ccd).arg(cfloor).arg(now_ms);
        let reply = Reply::ok(self.run(&inv).await?)?;
        view_at(&reply, 1)
    }

    async fn freeze_now(
        &self,
        route: &RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut inv = SCRIPTS.freeze.call(&[self.route_key(route)]);
        inv.arg(now_ms)
            .arg(self.idle_ms)
            .arg(u8::from(reason.is_some()))
            .arg(reason.unwrap_or_default());
        Reply::ok(self.run(&inv).await?).map(drop)
    }
}

impl RedisStore {
    /// One `mute.lua` per key (route, then caller scope): each key is its
    /// own slot on a cluster.
    async fn mute_now(
        &self,
        route: &RouteKey,
        worker_id: &str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut ok = true;
        for (kind, key) in [
            ("route", self.route_key(route)),
            ("caller", self.caller_key(&route.caller_scope)),
        ] {
            let mut inv = SCRIPTS.mute.call(&[key]);
            inv.arg(kind)
                .arg(now_ms)
                .arg(self.idle_ms)
                .arg(worker_id)
                .arg(until_ms.unwrap_or(-1));
            ok &= Reply::ok(self.run(&inv).await?)?.int(1)? == 1;
        }
        Ok(ok)
    }
}

impl Store for RedisStore {
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome> {
        Box::pin(self.lease_now(scope, ask, policy))
    }

    fn release<'a>(&'a self, scope: &'a ScopeKey, end: LeaseEnd<'a>) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            self.release_now(scope, end).await.map_err(|err| match err {
                // The script knows the grant; the caller knows `spent`.
                StoreError::Budget(BudgetError::SpentExceedsGrant { granted, .. }) => {
                    BudgetError::SpentExceedsGrant {
                        spent: end.spent,
                        granted,
                    }
                    .into()
                }
                StoreError::Budget(BudgetError::SuccessesExceedSpent { .. }) => {
                    BudgetError::SuccessesExceedSpent {
                        successes: end.retry_successes,
                        spent: end.spent,
                    }
                    .into()
                }
                other => other,
            })
        })
    }

    fn report<'a>(
        &'a self,
        scope: &'a ScopeKey,
        report: ReportBatch<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Reported> {
        Box::pin(self.report_now(scope, report, policy))
    }

    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Slotted> {
        Box::pin(self.reconsider_now(route, ask, policy))
    }

    fn view<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, RouteView> {
        Box::pin(self.view_now(route, now_ms))
    }

    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.freeze_now(route, reason, now_ms))
    }

    fn set_mute<'a>(
        &'a self,
        route: &'a RouteKey,
        worker_id: &'a str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> StoreFuture<'a, bool> {
        Box::pin(self.mute_now(route, worker_id, until_ms, now_ms))
    }

    /// SCANs the prefix's route keys (every primary of a cluster), keeps
    /// those the filter's names match after `after`, sorts them, and reads
    /// each in key order with one read-only script until `limit` (and one
    /// more, to know whether a next page exists) have matched.
    ///
    /// Consistency: each summary is atomic for its route (and, on one
    /// node, its caller scope's cooldown), but a page is not a snapshot:
    /// a route created during the SCAN may be missing, one that expired
    /// after it is skipped, and summaries are read at slightly different
    /// instants. Paging by key stays correct across pages (no route is
    /// listed twice). Every page SCANs the whole prefix: an operator's
    /// read, never on the request path.
    fn list_scopes<'a>(
        &'a self,
        filter: &'a ScopeFilter,
        after: Option<&'a RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> StoreFuture<'a, ScopePage> {
        Box::pin(self.list_now(filter, after, limit, now_ms))
    }

    /// Two read-only scripts: the caller scope's hints, then the route's
    /// state with its budget at `policy` (computed by the prelude's budget
    /// code on the decoded copy; nothing is written, so looking does not
    /// keep a route alive). Each is atomic; the pair is not — a caller-wide
    /// cooldown merged between them shows in one read and not the other.
    fn scope_detail<'a>(
        &'a self,
        route: &'a RouteKey,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<ScopeDetail>> {
        Box::pin(self.detail_now(route, policy, now_ms))
    }

    /// One script (`reset.lua`), atomic like every state change.
    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool> {
        Box::pin(self.reset_now(route, now_ms))
    }

    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(self.evict(now_ms, idle_ms))
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        // A store that could not be checked at start is checked once Redis
        // answers; one holding another build's state is never healthy.
        Box::pin(async move {
            self.ping().await?;
            self.claim_format().await
        })
    }

    fn admin_state(&self) -> Option<&dyn crate::store::AdminStateStore> {
        Some(self)
    }
}
