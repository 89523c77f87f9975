//! `Report`: a worker's first attempts, successes, rate-limit evidence and
//! stated limit,
//! assessed here and applied as **one** store operation
//! ([`crate::store::Store::report`]), after which the core publishes every
//! cooldown the report raised.

use crate::hints::stated::{StatedInput, read_statement};
use crate::hints::{Assessment, EvidenceInput, Merge, assess};
use crate::pacing::{Mode, PacingView, counts_hold_ms, holds_first_attempts};
use crate::scope::{EvidenceLevel, RouteKey, ScopeKey};
use crate::store::{LevelHint, ReportBatch, RouteView, StoreError};
use crate::tenancy::{Owner, Tenant};

use super::Coordinator;
use crate::events::{CooldownSupport, StateChange};

/// One response a worker reports, validated.
#[derive(Debug, Clone, Copy)]
pub struct ReportedResponse<'a> {
    /// The response and its hints as received.
    pub input: EvidenceInput<'a>,
    /// The worker could not tell which scope the response spoke for: the
    /// evidence then covers the whole caller scope.
    pub uncertain: bool,
}

/// A worker's report, validated (the `Report` request without wire types).
#[derive(Debug, Clone)]
pub struct ReportIn<'a> {
    /// The reporting worker.
    pub worker_id: &'a str,
    /// First attempts since its last report.
    pub first_attempts: u32,
    /// Successes since its last report.
    pub successes: u32,
    /// Attempts refused for capacity since its last report.
    pub rejections: u32,
    /// How long ago the oldest count was made (0: within the window).
    pub counts_age_ms: i64,
    /// The rate-limit evidence, in the order the worker saw it.
    pub responses: Vec<ReportedResponse<'a>>,
    /// How many caller tokens may use the scope's caller scope (1 in open
    /// dev mode): where several may, corroboration needs workers of two.
    pub tokens: usize,
    /// The reporting token: a new scope is charged to it, and where
    /// several tokens share the caller scope its counts are kept apart.
    pub owner: Owner,
    /// The limit the upstream last stated to the worker, if any.
    pub stated: Option<StatedInput<'a>>,
}

/// What a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOut {
    /// How each response's hint was read, in the order reported.
    pub assessments: Vec<Assessment>,
    /// Each cooldown the report started or extended (already published).
    pub raised: Vec<(EvidenceLevel, i64)>,
    /// The backoff hintless rejections have widened to; 0 when the report
    /// held none.
    pub backoff_ms: u64,
    /// One per response, in order: what merging its hint did, with how its
    /// claim stood against the fleet (corroboration, outlier, muted).
    pub merges: Vec<Merge>,
    /// The route's state after the report.
    pub view: RouteView,
    /// The route's pacing after the report.
    pub pacing: PacingView,
    /// Whether first attempts wait out the scope's cooldown.
    pub hold_first_attempts: bool,
    /// How long the worker may hold a report of counts alone.
    pub counts_hold_ms: i64,
    /// The scope's policy is in shadow mode (the worker's gate shadows its
    /// own holds too).
    pub shadow: bool,
    /// The scope's policy version.
    pub policy_version: u64,
    /// The coordinator's clock at the report.
    pub now_ms: i64,
}

impl Coordinator {
    /// Publishes a change of `route`'s pacing into or out of a mode that
    /// changes what workers do: a penalty holds the route closed,
    /// saturation holds first attempts for slots, and a route that stops
    /// being calm (`counts_hold_ms`) needs every worker's counts at once.
    /// Workers hear of that last one otherwise only in the answer to their
    /// next report, up to a window later: a refusal starts a measurement
    /// of a few report ticks, and it read what the refusing worker served,
    /// not the fleet (four long-lived `tollgate proxy` processes in front
    /// of nginx's `limit_req` of 50 requests/s, the coordinator restarted
    /// under them, read 3 to 33/s in three of seven starts, and 53 to 73/s
    /// in seven of seven once told).
    /// A window closes on whichever call comes first after it ends, Report
    /// or Reconsider, so both announce.
    pub(super) fn announce_pacing(&self, route: &RouteKey, was: Mode, now: &PacingView) {
        let announced = |mode| {
            matches!(
                mode,
                Mode::PenaltyExtending | Mode::Saturated | Mode::Stated
            )
        };
        if was == now.mode
            || !(announced(was) || announced(now.mode) || was.is_calm() != now.mode.is_calm())
        {
            return;
        }
        tracing::info!(route = %route, pacing_state = now.mode.as_str(),
            pacing_state_was = was.as_str(),
            penalty_until_unix_ms = now.penalty_until_ms,
            "pacing: route {} {}",
            if announced(now.mode) { "entered" } else { "left" },
            if announced(now.mode) { now.mode.as_str() } else { was.as_str() });
        self.hub.publish(StateChange::Pacing {
            route: route.clone(),
            mode: now.mode,
        });
    }

    /// Applies a worker's report to `scope` in one store operation and
    /// publishes the cooldowns it raised.
    pub async fn report(
        &self,
        scope: &ScopeKey,
        report: ReportIn<'_>,
    ) -> Result<ReportOut, StoreError> {
        let policy = self.policies.current().resolve(&scope.route);
        let now_ms = self.now_ms();
        let hints: Vec<LevelHint> = report
            .responses
            .iter()
            .map(|r| LevelHint {
                caller_wide: r.uncertain,
                assessment: assess(&r.input, &policy, now_ms),
            })
            .collect();
        for (response, hint) in report.responses.iter().zip(&hints) {
            if hint.assessment.clock_skew {
                tracing::warn!(scope = %scope, worker_id = %report.worker_id,
                    receipt_unix_ms = response.input.receipt_ms, now_unix_ms = now_ms,
                    "clock_skew: worker receipt time disagrees with the coordinator clock");
            }
        }
        let statement = report
            .stated
            .map(|input| read_statement(&input, report.worker_id, &policy, now_ms));
        if let Some(s) = statement.as_ref().filter(|s| s.pace_m.is_none()) {
            tracing::info!(scope = %scope, worker_id = %report.worker_id,
                verdict = s.verdict.as_str(),
                "stated limit kept as evidence only: it paces nothing");
        }
        let batch = ReportBatch {
            worker_id: report.worker_id,
            first_attempts: report.first_attempts,
            successes: report.successes,
            rejections: report.rejections,
            counts_age_ms: report.counts_age_ms,
            hints: &hints,
            now_ms,
            tenant: Tenant {
                owner: report.owner,
                tokens: report.tokens,
            },
            stated: statement.as_ref(),
        };
        let reported = self.store.report(scope, batch, &policy).await?;
        self.announce_pacing(&scope.route, reported.pacing_was, &reported.pacing);
        let mut raised = Vec::new();
        let mut backoff_ms = 0;
        for (hint, merge) in hints.iter().zip(&reported.merges) {
            if merge.raised || merge.support_moved {
                let level = hint.level(&scope.route);
                let what = if merge.raised {
                    "cooldown started"
                } else {
                    "cooldown support changed"
                };
                tracing::info!(level = %level, cooldown_until_unix_ms = merge.cooldown_until_ms,
                    form = hint.assessment.form.as_str(), capped = hint.assessment.capped,
                    corroborated = merge.corroborated, workers = merge.workers, "{what}");
                self.hub.publish(StateChange::Cooldown {
                    level: level.clone(),
                    cooldown_until_ms: merge.cooldown_until_ms,
                    support: CooldownSupport {
                        corroborated: merge.corroborated,
                        workers: merge.workers,
                        closed_until_ms: reported.pacing.closed_until_ms,
                    },
                });
                if merge.raised {
                    raised.push((level, merge.cooldown_until_ms));
                }
            }
            if hint.assessment.widen_backoff {
                backoff_ms = backoff_ms.max(merge.backoff_ms);
            }
        }
        let cooldown_until_ms = reported.view.cooldown_until_ms;
        let hold_first_attempts = holds_first_attempts(
            policy.hold_first_attempts,
            reported.pacing.mode,
            reported.cooldown_corroborated,
            cooldown_until_ms,
            reported.pacing.closed_until_ms,
            now_ms,
        );
        Ok(ReportOut {
            assessments: hints.into_iter().map(|h| h.assessment).collect(),
            raised,
            backoff_ms,
            merges: reported.merges,
            view: reported.view,
            pacing: reported.pacing,
            hold_first_attempts,
            counts_hold_ms: counts_hold_ms(
                reported.pacing.mode,
                &reported.pacing.stated,
                cooldown_until_ms,
                hold_first_attempts,
                now_ms,
            ),
            policy_version: policy.policy_version,
            shadow: policy.shadow,
            now_ms,
        })
    }
}
