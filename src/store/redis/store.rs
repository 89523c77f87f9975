//! [`RedisStore`]'s [`Store`] implementation: each operation one
//! call of a library function (on a cluster, plus a read or write of the
//! caller key, which lives in another slot); concurrent Leases on one node
//! share a call (`queue`).

use crate::budget::{BudgetError, BudgetSnapshot, GrantAsk, LeaseEnd};
use crate::hints::{HintState, Merge, Reporter};
use crate::pacing::cursor::SlotAsk;
use crate::policy::Policy;
use crate::scope::{RouteKey, ScopeKey};
use crate::store::{
    LeaseOutcome, OwnerCounts, ReportBatch, Reported, RouteView, ScopeDetail, ScopeFilter,
    ScopePage, ScopeSummary, Slotted, Store, StoreError, StoreFuture,
};
use crate::tenancy::Owner;

use super::RedisStore;
use super::decide::{Level, PacingInput, RouteRead, pacing_view, stored_hints, stored_pacing};
use super::reply::{Reply, count, summary_of, unsigned, view_at};
use super::scripts::SCRIPTS;

impl RedisStore {
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
            inv.arg(policy.window_secs);
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
            let summary = summary_of(&route, &reply, |name| self.quotas.owner_named(name))?;
            if (filter.frozen_only && summary.view.frozen.is_none())
                || filter.owner.is_some_and(|o| o != summary.owner)
            {
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
        let (_, stored) = self
            .read_caller(&self.caller_key(&route.caller_scope))
            .await?;
        let caller = stored_hints(stored.as_deref())?;
        let (ccd, cfloor) = (caller.cooldown_until_ms, caller.floor_ms());
        let keys = [self.route_key(route)];
        let Some(r) = self
            .detail_reply(&keys, (ccd, cfloor), Some(policy), now_ms)
            .await?
        else {
            return Ok(None);
        };
        let hints = stored_hints(r.bytes(19))?;
        let summary = summary_of(route, &r, |name| self.quotas.owner_named(name))?;
        let spent = [
            unsigned(r.int(10)?),
            unsigned(r.int(12)?),
            unsigned(r.int(14)?),
        ];
        let active = [count(r.int(11)?), count(r.int(13)?), count(r.int(15)?)];
        let budget = BudgetSnapshot::of(
            policy,
            unsigned(r.int(9)?),
            spent,
            active,
            (summary.leases_outstanding, unsigned(r.int(16)?)),
        );
        let stored = stored_pacing(r.bytes(18), now_ms, &policy.pacing)?;
        Ok(Some(ScopeDetail {
            summary,
            budget,
            route_cooldown_until_ms: hints.cooldown_until_ms,
            caller_cooldown_until_ms: ccd,
            backoff_step: hints.backoff_step,
            route_hints: hints.recent.iter().cloned().collect(),
            caller_hints: caller.recent.iter().cloned().collect(),
            route_evidence: hints.evidence(now_ms),
            caller_evidence: caller.evidence(now_ms),
            stated_recent: stored.stated_recent().cloned().collect(),
            pacing: pacing_view(stored, count(r.int(17)?), now_ms, &policy.pacing),
        }))
    }

    /// Keeps the route's mutes (an operator's decision, like the freeze)
    /// and has `reset.lua` forget the rest.
    async fn reset_now(&self, route: &RouteKey, now_ms: i64) -> Result<bool, StoreError> {
        let route_key = self.route_key(route);
        let _turn = self.turns.take(&route_key).await;
        let Some(read) = self.read_route(&route_key).await? else {
            return Ok(false);
        };
        let kept = HintState {
            mutes: stored_hints(read.hints.as_deref())?.mutes,
            ..HintState::default()
        };
        let bytes = if kept.mutes.is_empty() {
            Vec::new()
        } else {
            kept.encode()
        };
        let mut inv = SCRIPTS.reset.call(&[&route_key]);
        inv.arg(now_ms)
            .arg(self.idle_ms)
            .arg(&bytes[..])
            .arg(kept.live_until_ms());
        Ok(Reply::ok(self.run(&inv).await?)?.int(1)? == 1)
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

    /// `report.lua` deposits the first attempts and reads the route's
    /// (and, on one node, the caller scope's) hints and pacing; then, as
    /// the memory store does, the route's hints take the report's successes
    /// and route-level hints, the caller scope's its successes and
    /// uncertain hints, and the pacing its counts — each decided in Rust
    /// and written by compare-and-set (`decide`). Each change is atomic,
    /// the report as a whole not (the memory store's two maps have the
    /// same window).
    async fn report_now(
        &self,
        scope: &ScopeKey,
        report: ReportBatch<'_>,
        policy: &Policy,
    ) -> Result<Reported, StoreError> {
        let tenant = report.tenant;
        let owner = tenant.owner;
        let now = report.now_ms;
        let route_key = self.route_key(&scope.route);
        let caller_key = self.caller_key(&scope.route.caller_scope);
        let clustered = self.clustered();
        let _turn = self.turns.take(&route_key).await;
        let keys: &[&String] = if clustered {
            &[&route_key]
        } else {
            &[&route_key, &caller_key]
        };
        // A token with a quota adds to a route that exists, until a
        // refusal has it charged (`quota`).
        let mut must_exist = self.quotas.charges(owner);
        let owner_name = self.quotas.name(owner).unwrap_or_default();
        let reply = loop {
            let mut inv = SCRIPTS.report.call(keys);
            inv.arg(now)
                .arg(self.idle_ms)
                .arg(report.worker_id)
                .arg(scope.priority.index() + 1)
                .arg(report.first_attempts)
                .arg(policy.window_secs)
                // Hints and statements are weighed against the active workers.
                .arg(u8::from(
                    !report.hints.is_empty() || report.stated.is_some(),
                ))
                .arg(u8::from(must_exist))
                .arg(owner_name)
                // Kept apart as the token's own too (`crate::budget`,
                // "Counts of several tokens").
                .arg(u8::from(tenant.shared() && !owner_name.is_empty()));
            let reply = Reply::ok(self.run(&inv).await?)?;
            if must_exist && reply.text(1).as_deref() == Some("absent") {
                self.charge(owner, &route_key, now).await?;
                must_exist = false;
                continue;
            }
            break reply;
        };
        let tracked = |i| {
            u32::try_from(reply.int(i)?).map_err(|_| {
                StoreError::Unavailable("redis report reply: a worker count out of range".into())
            })
        };
        self.last_read.put(
            &route_key,
            unsigned(reply.int(10)?),
            [tracked(11)?, tracked(12)?, tracked(13)?],
        );
        let reporter = Reporter {
            worker_id: report.worker_id,
            active: count(reply.int(1)?),
            tokens: tenant.tokens,
        };
        let route = RouteRead::at(&reply, 2)?;
        let (caller_version, caller_stored) = if clustered {
            self.read_caller(&caller_key).await?
        } else {
            (reply.int(8)?, reply.bytes(9).map(<[u8]>::to_vec))
        };
        // Rejections that arrive while a cooldown already held are
        // explained by it: pacing is told the cooldown as it was before.
        let caller_before = caller_stored
            .as_deref()
            .map(|b| stored_hints(Some(b)))
            .transpose()?;
        let cooldown_before = stored_hints(route.hints.as_deref())?
            .cooldown_until_ms
            .max(caller_before.as_ref().map_or(0, |c| c.cooldown_until_ms));
        let mut merged: Vec<Option<Merge>> = vec![None; report.hints.len()];
        let narrows = report.successes > 0;
        // The hints of one level merged in order, each with its index.
        let merge_level = |h: &mut HintState, caller_wide: bool| {
            report
                .hints
                .iter()
                .enumerate()
                .filter(|(_, hint)| hint.caller_wide == caller_wide)
                .map(|(i, hint)| (i, h.merge(&hint.assessment, reporter, policy, now)))
                .collect::<Vec<_>>()
        };
        let (route_merges, route_hints) = self
            .change_hints(
                &route_key,
                Level::Route,
                now,
                route.hints_version,
                route.hints.clone(),
                |h| {
                    if narrows && h.backoff_step > 0 {
                        h.decay();
                    }
                    merge_level(h, false)
                },
            )
            .await?;
        for (i, merge) in route_merges {
            merged[i] = Some(merge);
        }
        let uncertain = report.hints.iter().any(|h| h.caller_wide);
        // A caller scope is made by uncertain evidence, and narrowed by
        // successes only once it exists.
        let caller_hints = if uncertain || (narrows && caller_before.is_some()) {
            // Uncertain evidence makes the caller scope: charged first.
            if caller_stored.is_none() {
                self.charge(owner, &caller_key, now).await?;
            }
            let (caller_merges, hints) = self
                .change_hints(
                    &caller_key,
                    Level::Caller {
                        touch: uncertain,
                        owner,
                    },
                    now,
                    caller_version,
                    caller_stored,
                    |h| {
                        if narrows {
                            h.decay();
                        }
                        merge_level(h, true)
                    },
                )
                .await?;
            for (i, merge) in caller_merges {
                merged[i] = Some(merge);
            }
            Some(hints)
        } else {
            caller_before
        };
        let merges: Vec<Merge> = merged.into_iter().flatten().collect();
        let view = RouteView {
            cooldown_until_ms: route_hints
                .cooldown_until_ms
                .max(caller_hints.as_ref().map_or(0, |c| c.cooldown_until_ms)),
            floor_ms: route_hints
                .floor_ms()
                .max(caller_hints.as_ref().map_or(0, HintState::floor_ms)),
            frozen: route.frozen.clone(),
        };
        // The level whose cooldown is the effective one says whether it
        // is corroborated (the route's when no earlier than the caller's).
        let cooldown_corroborated = crate::hints::in_force(
            Some((
                route_hints.cooldown_until_ms,
                route_hints.corroboration.corroborated,
            )),
            caller_hints
                .as_ref()
                .map(|c| (c.cooldown_until_ms, c.corroboration.corroborated)),
        )
        .unwrap_or(false);
        let hint_ends = report.agreed_hint_ends(&merges);
        let observation = report.observation(&hint_ends, cooldown_before, view.cooldown_until_ms);
        let (pacing, pacing_was) = self
            .observe_pacing(
                &route_key,
                PacingInput {
                    observation: &observation,
                    stated: report.stated.map(|s| {
                        let weighing = crate::hints::stated::weighing(
                            policy,
                            reporter.active,
                            reporter.tokens,
                        );
                        (s, weighing)
                    }),
                },
                route.pacing_version,
                route.pacing,
                route.asking,
                &policy.pacing,
            )
            .await?;
        Ok(Reported {
            merges,
            view,
            pacing,
            pacing_was,
            cooldown_corroborated,
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
    /// Mutes or unmutes `worker_id` on the route's hints, then on its
    /// caller scope's: each a change decided in Rust (`decide`).
    async fn mute_now(
        &self,
        route: &RouteKey,
        worker_id: &str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        use crate::hints::corroboration::set_mute;
        let route_key = self.route_key(route);
        let caller_key = self.caller_key(&route.caller_scope);
        let _turn = self.turns.take(&route_key).await;
        let read = self.read_route(&route_key).await?.unwrap_or_default();
        let (on_route, _) = self
            .change_hints(
                &route_key,
                Level::Route,
                now_ms,
                read.hints_version,
                read.hints,
                |h| set_mute(&mut h.mutes, worker_id, until_ms, now_ms),
            )
            .await?;
        let (version, stored) = self.read_caller(&caller_key).await?;
        let (on_caller, _) = self
            .change_hints(
                &caller_key,
                Level::Caller {
                    touch: true,
                    owner: Owner::NONE,
                },
                now_ms,
                version,
                stored,
                |h| set_mute(&mut h.mutes, worker_id, until_ms, now_ms),
            )
            .await?;
        Ok(on_route & on_caller)
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
    /// state with its window's counts, from which the budget at `policy`
    /// is computed here ([`BudgetSnapshot::of`]; nothing is written, so
    /// looking does not keep a route alive). Each is atomic; the pair is not — a caller-wide
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

    /// Also drops from each token's set the scopes no longer there, so
    /// expired scopes stop counting against a quota.
    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let evicted = self.evict(now_ms, idle_ms).await?;
            self.prune_quotas(now_ms).await?;
            Ok(evicted)
        })
    }

    /// As this replica last saw each token's set: the count a charge or
    /// the idle sweep read, and the refusals made here.
    fn owner_counts(&self) -> Vec<OwnerCounts> {
        self.quotas.counts()
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        // A store that could not be checked at start is checked once Redis
        // answers; one holding another build's state is never healthy.
        Box::pin(async move {
            self.ping().await?;
            self.claim_format().await
        })
    }

    fn control_state(&self) -> Option<&dyn crate::store::ControlStateStore> {
        Some(self)
    }
}
