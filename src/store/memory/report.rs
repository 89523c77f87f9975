//! The Report path: one worker's report (its counts and every hint, route
//! level then caller level) merged under the route's entry lock, and the
//! route's view as Report answers it.

use std::sync::atomic::Ordering;

use crate::hints::{Assessment, Merge, Reporter};
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{ReportBatch, Reported, RouteView, StoreError};
use crate::tenancy::Owner;

use super::MemoryStore;
use super::route::RouteLookup;

impl MemoryStore {
    /// The route's deposit and route-level hints under the route's entry
    /// lock, then the caller-level hints under the caller's: never both
    /// locks at once (see the module doc for what that costs).
    pub(super) fn report_now(
        &self,
        scope: &ScopeKey,
        report: ReportBatch<'_>,
        policy: &Policy,
    ) -> Result<Reported, StoreError> {
        let now_ms = report.now_ms;
        let tenant = report.tenant;
        let route = RouteLookup::of(&scope.route);
        if report.successes > 0
            && self.callers_used.load(Ordering::Acquire)
            && let Some(mut caller) = self.callers.get_mut(&scope.route.caller_scope)
        {
            caller.hints.decay();
        }
        let mut merges: Vec<Option<Merge>> = vec![None; report.hints.len()];
        // Rejections that arrive while a cooldown already held are explained
        // by it: pacing is told the cooldown as it was before this report.
        let cooldown_before = self.view_now(&route).cooldown_until_ms;
        let active = self.with_route(&route, tenant.owner, now_ms, |state| {
            state.budget(now_ms).deposit(
                policy,
                report.worker_id,
                scope.priority,
                report.first_attempts,
                now_ms,
                tenant,
            );
            if report.successes > 0 && state.hints().backoff_step > 0 {
                state.hints_mut().decay();
            }
            let reporter = Reporter {
                worker_id: report.worker_id,
                active: state
                    .budget(now_ms)
                    .active_workers(now_ms, policy.window_ms()),
                tokens: tenant.tokens,
            };
            for (merge, hint) in merges.iter_mut().zip(report.hints) {
                if !hint.caller_wide {
                    *merge = Some(state.hints_mut().merge(
                        &hint.assessment,
                        reporter,
                        policy,
                        now_ms,
                    ));
                }
            }
            reporter.active
        })?;
        // Broadening to the caller scope is judged against the reporting
        // route's workers: the ones whose retries it would hold back first.
        let reporter = Reporter {
            worker_id: report.worker_id,
            active,
            tokens: tenant.tokens,
        };
        for (merge, hint) in merges.iter_mut().zip(report.hints) {
            if hint.caller_wide {
                let caller = &scope.route.caller_scope;
                *merge = Some(self.merge_caller(
                    caller,
                    tenant.owner,
                    &hint.assessment,
                    reporter,
                    policy,
                    now_ms,
                )?);
            }
        }
        let merges: Vec<Merge> = merges.into_iter().flatten().collect();
        let view = self.view_now(&route);
        let hint_ends = report.agreed_hint_ends(&merges);
        let observation = report.observation(&hint_ends, cooldown_before, view.cooldown_until_ms);
        let (pacing, pacing_was) = self.with_route(&route, tenant.owner, now_ms, |state| {
            let pacing = state.pacing_mut(now_ms, &policy.pacing);
            let was = pacing.mode();
            if let Some(statement) = report.stated {
                let weighing = crate::hints::stated::weighing(policy, active, tenant.tokens);
                pacing.observe_statement(statement.clone(), weighing, now_ms, &policy.pacing);
            }
            pacing.observe(&observation, &policy.pacing);
            (state.pacing_view(now_ms, &policy.pacing), was)
        })?;
        Ok(Reported {
            merges,
            view,
            pacing,
            pacing_was,
            cooldown_corroborated: self.cooldown_corroborated(&route),
        })
    }

    /// Whether the level whose cooldown is the route's effective one has it
    /// corroborated.
    pub(super) fn cooldown_corroborated(&self, route: &RouteLookup<'_>) -> bool {
        let caller = self.read_caller(&route.key().caller_scope, |c| {
            (
                c.hints.cooldown_until_ms,
                c.hints.corroboration.corroborated,
            )
        });
        let own = self.routes.get(route.name()).map(|s| {
            (
                s.hints().cooldown_until_ms,
                s.hints().corroboration.corroborated,
            )
        });
        crate::hints::in_force(own, caller).unwrap_or(false)
    }

    /// A route's effective state; an unknown route has its caller scope's.
    pub(super) fn view_now(&self, route: &RouteLookup<'_>) -> RouteView {
        let caller = self.caller_floor(&route.key().caller_scope);
        match self.routes.get(route.name()) {
            Some(state) => Self::view_of(&state, caller),
            None => RouteView {
                cooldown_until_ms: caller.0,
                floor_ms: caller.1,
                frozen: None,
            },
        }
    }

    /// Merges one hint into a caller scope's state, creating it for
    /// `owner` if there is room.
    pub(super) fn merge_caller(
        &self,
        caller: &str,
        owner: Owner,
        assessment: &Assessment,
        reporter: Reporter<'_>,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Merge, StoreError> {
        if !self.callers.contains_key(caller) {
            self.ensure_room(owner, now_ms)?;
        }
        let mut state = self.caller_entry(caller, owner);
        state.last_touched_ms = state.last_touched_ms.max(now_ms);
        Ok(state.hints.merge(assessment, reporter, policy, now_ms))
    }
}
