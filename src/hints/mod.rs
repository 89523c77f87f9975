//! Hints → cooldowns: reading one response's wait hints into a cooldown, and the
//! per-scope hint state (cooldown, backoff step, recent hints). Pure.
//!
//! Hints are read with the client crate's parser
//! ([`tollgate_vocab::hint`]), the one parser of the project, so a worker
//! and the coordinator never disagree on what a header meant.
//!
//! # Placing a hint on the coordinator's clock
//! A hint is a delay from the moment the worker received the response. When
//! the worker's receipt time agrees with the coordinator's clock (within the
//! policy's skew tolerance) the cooldown is `receipt + delay`. When it does
//! not, the disagreement is recorded as `clock_skew` and the delay is placed
//! from the coordinator's own `now` instead — later than the true receipt, so
//! never shorter than the server asked. An HTTP-date is always converted to a
//! delay against the worker's own receipt time: the worker saw the response,
//! and its clock is the one the date was meant to be read against.
//!
//! # One worker does not speak for the fleet
//! A valid hint is kept as its worker's claim; the fleet-wide cooldown is
//! what the claims of distinct workers support together ([`corroboration`]).
//!
//! # What never happens
//! An invalid, absent, past or do-not-retry hint never shortens a cooldown or
//! becomes permission: it is kept as evidence and widens the scope's backoff
//! step, which decays only on reported successes.

mod codec;
pub mod corroboration;
pub mod stated;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tollgate_vocab::classify::{GrpcCode, Sent, classify_grpc, classify_http};
use tollgate_vocab::clock::from_unix_ms;
use tollgate_vocab::hint::{
    HintForm, HintReading, HintRules, HintVerdict, read_pushback_ms, read_retry_after,
};

use crate::pacing::HINT_GRANULARITY_MS;
use crate::policy::Policy;
pub use corroboration::{Corroboration, EvidenceDetail, WorkerEvidence};

/// Recent hints kept per scope as evidence (a ring: the oldest falls out).
pub const RECENT_HINTS: usize = 16;
/// The backoff step stops widening here (`base × 2^19` exceeds any max).
pub const MAX_BACKOFF_STEP: u8 = 20;

/// One response as a worker reported it.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvidenceInput<'a> {
    /// HTTP status, or 0 for a gRPC response.
    pub http_status: u32,
    /// gRPC status code when `http_status` is 0.
    pub grpc_code: u32,
    /// The raw `Retry-After` text, when the header was present.
    pub retry_after: Option<&'a str>,
    /// The raw `grpc-retry-pushback-ms` text, when present.
    pub pushback_ms: Option<&'a str>,
    /// The worker's wall clock at receipt; 0 when unknown.
    pub receipt_ms: i64,
}

impl EvidenceInput<'_> {
    /// Whether the response says "not now" rather than "no": one the
    /// client's classification table calls retryable (429, 503, 408, 502,
    /// 504, 500; gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE`,
    /// `DEADLINE_EXCEEDED`, `INTERNAL`, `UNKNOWN`). The worker and the
    /// coordinator read a status through that one table, so a response the
    /// worker retries is the one that widens the scope's backoff. Other
    /// statuses are kept as evidence but move no cooldown or backoff.
    pub fn is_rejection(&self) -> bool {
        let classification = match self.http_status {
            // The report was already sent, so a deadline means the effect
            // is unknown; whether it is a rejection does not depend on it.
            0 => classify_grpc(
                GrpcCode::from_i32(i32::try_from(self.grpc_code).unwrap_or(-1)),
                Sent::After,
            ),
            status => match u16::try_from(status) {
                Ok(status) => classify_http(status),
                Err(_) => return false,
            },
        };
        classification.class.is_retryable()
    }
}

/// How the coordinator read one piece of evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// The raw hint text that was read (bounded by the parser).
    pub raw: Option<String>,
    /// Which form the hint took.
    pub form: HintForm,
    /// Whether it could be used for a cooldown.
    pub valid: bool,
    /// The server's delay in milliseconds (saturating), when valid.
    pub delay_ms: u64,
    /// The delay exceeded the policy's max hint and was capped there.
    pub capped: bool,
    /// The worker's receipt time disagreed with the coordinator's clock.
    pub clock_skew: bool,
    /// Why the hint was not used; empty when it was.
    pub reason: &'static str,
    /// The cooldown the hint asks for, on the coordinator's clock.
    pub cooldown_until_ms: Option<i64>,
    /// A rejection without a usable wait: widen the scope's backoff.
    pub widen_backoff: bool,
    /// Where the backoff is measured from (receipt or coordinator now).
    pub anchor_ms: i64,
}

/// Reads one response's hints under `policy` at coordinator time `now_ms`.
pub fn assess(input: &EvidenceInput<'_>, policy: &Policy, now_ms: i64) -> Assessment {
    let known = input.receipt_ms != 0;
    let clock_skew = known && input.receipt_ms.abs_diff(now_ms) > policy.skew_tolerance_ms;
    let anchor_ms = if known && !clock_skew {
        input.receipt_ms
    } else {
        now_ms
    };
    let receipt = from_unix_ms(if known { input.receipt_ms } else { now_ms });
    let rules = HintRules {
        clock_trusted: true,
        max_hint: Some(Duration::from_millis(policy.max_hint_ms)),
    };
    let reading = pick(
        read_retry_after(input.retry_after, receipt, rules),
        read_pushback_ms(input.pushback_ms, rules),
    );
    let rejection = input.is_rejection();
    let mut out = Assessment {
        raw: reading.raw,
        form: reading.form,
        valid: false,
        delay_ms: 0,
        capped: false,
        clock_skew,
        reason: "",
        cooldown_until_ms: None,
        widen_backoff: rejection,
        anchor_ms,
    };
    let wait = match reading.verdict {
        HintVerdict::Valid { delay, past } => {
            out.valid = true;
            out.delay_ms = millis(delay);
            if past {
                out.reason = "date already past at receipt";
            }
            Some(out.delay_ms)
        }
        HintVerdict::ExceedsCap { delay, cap } => {
            out.valid = true;
            out.capped = true;
            out.delay_ms = millis(delay);
            out.reason = "hint exceeds max_hint; cooldown capped";
            Some(millis(cap))
        }
        HintVerdict::Absent => {
            out.reason = "no hint";
            None
        }
        HintVerdict::Invalid(why) => {
            out.reason = why.describe();
            None
        }
        HintVerdict::DoNotRetry => {
            out.reason = "pushback asks not to retry";
            None
        }
        // Unreachable with a trusted clock; kept as invalid, never as zero.
        HintVerdict::ClockUntrusted => {
            out.reason = "clock untrusted";
            None
        }
    };
    match wait {
        Some(wait) if wait > 0 && rejection => {
            out.widen_backoff = false;
            out.cooldown_until_ms =
                Some(anchor_ms.saturating_add(i64::try_from(wait).unwrap_or(i64::MAX)));
        }
        Some(_) if !rejection => out.reason = "status is not a rejection; kept as evidence",
        _ => {}
    }
    out
}

/// Of two readings, the usable one with the longer wait; else the first
/// present one (so an invalid hint is still recorded); else absent.
fn pick(retry_after: HintReading, pushback: HintReading) -> HintReading {
    let wait = |r: &HintReading| match r.verdict {
        HintVerdict::Valid { delay, .. } | HintVerdict::ExceedsCap { delay, .. } => Some(delay),
        _ => None,
    };
    match (wait(&retry_after), wait(&pushback)) {
        (Some(a), Some(b)) if b > a => pushback,
        (Some(_), _) => retry_after,
        (None, Some(_)) => pushback,
        (None, None) if retry_after.form != HintForm::Absent => retry_after,
        (None, None) => pushback,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One hint kept as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintRecord {
    /// Coordinator time the evidence was merged.
    pub at_ms: i64,
    /// The raw text, if a hint was sent.
    pub raw: Option<String>,
    /// Its form.
    pub form: HintForm,
    /// Whether it was usable.
    pub valid: bool,
    /// Whether it was capped.
    pub capped: bool,
    /// Whether the worker's clock disagreed.
    pub clock_skew: bool,
    /// The cooldown this hint asked for, so an operator can see which hint
    /// a scope's cooldown came from.
    pub cooldown_until_ms: Option<i64>,
}

/// What merging one assessment changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merge {
    /// The cooldown moved later (a cooldown started or was extended).
    pub raised: bool,
    /// The cooldown in force kept its end, but whether distinct workers
    /// corroborate it changed: what first attempts do may change with it.
    pub support_moved: bool,
    /// The cooldown after the merge; 0 when none was ever set.
    pub cooldown_until_ms: i64,
    /// The current backoff for hintless rejections.
    pub backoff_ms: u64,
    /// Whether the level's cooldown rests on enough distinct workers (as of
    /// its last valid hint).
    pub corroborated: bool,
    /// Distinct workers whose claims reach it.
    pub workers: u32,
    /// How this hint's claim stood against the fleet.
    pub claim: corroboration::Claim,
    /// The reporter's evidence now keeps disagreeing with the fleet.
    pub noisy: bool,
}

/// Who sent the evidence being merged, and how many workers the route has:
/// what corroboration is judged against.
#[derive(Debug, Clone, Copy)]
pub struct Reporter<'a> {
    /// The reporting worker.
    pub worker_id: &'a str,
    /// Workers active in the route's budget window (the reporter included).
    pub active: usize,
    /// How many caller tokens may use the caller scope: where several may,
    /// one token's workers alone corroborate nothing for the others.
    pub tokens: usize,
}

/// Of a route's cooldown and its caller scope's, each `(until_ms, what)`
/// where the level has state, the `what` of the one in force: the
/// route's, unless the caller scope's ends later. Which level's
/// corroboration a cooldown rests on is decided here, for every store.
pub fn in_force<T>(route: Option<(i64, T)>, caller: Option<(i64, T)>) -> Option<T> {
    match (route, caller) {
        (Some((own, r)), Some((by_caller, c))) => Some(if by_caller > own { c } else { r }),
        (route, caller) => route.or(caller).map(|(_, what)| what),
    }
}

/// Hint-derived state of one route or of a whole caller scope.
#[derive(Debug, Clone, Default)]
pub struct HintState {
    /// The earliest reconsideration instant from valid hints; only moves later.
    pub cooldown_until_ms: i64,
    /// Widened by hintless rejections, narrowed by successes.
    pub backoff_step: u8,
    /// The earliest reconsideration instant from the backoff; only moves later.
    pub backoff_until_ms: i64,
    /// Recent hints, newest last, for operators (bounded by [`RECENT_HINTS`]).
    pub recent: VecDeque<HintRecord>,
    /// Each worker's latest claim and its record of agreeing with the
    /// fleet (bounded by [`corroboration::MAX_EVIDENCE_WORKERS`]).
    pub workers: BTreeMap<String, WorkerEvidence>,
    /// Workers whose evidence an operator muted, until when (bounded by
    /// [`corroboration::MAX_MUTES`]).
    pub mutes: BTreeMap<String, i64>,
    /// How the claims supported the cooldown at the last valid hint.
    pub corroboration: Corroboration,
}

impl HintState {
    /// The backoff a hintless rejection now imposes.
    pub fn backoff_ms(&self, policy: &Policy) -> u64 {
        match self.backoff_step {
            0 => 0,
            step => policy
                .backoff_base_ms
                .saturating_mul(1u64 << (step - 1).min(40))
                .min(policy.backoff_max_ms),
        }
    }

    /// The earliest instant anything may be reconsidered here.
    pub fn floor_ms(&self) -> i64 {
        self.cooldown_until_ms.max(self.backoff_until_ms)
    }

    /// Merges one assessment from `reporter`: its claim joins the others
    /// and the cooldown becomes `max(current, what the claims support)`
    /// (unless the reporter is muted); a hintless rejection widens the
    /// backoff; the evidence is kept either way.
    pub fn merge(
        &mut self,
        a: &Assessment,
        reporter: Reporter<'_>,
        policy: &Policy,
        now_ms: i64,
    ) -> Merge {
        let before = self.cooldown_until_ms;
        let corroborated_before = self.corroboration.corroborated;
        let id = reporter.worker_id;
        let mut claim = corroboration::Claim::None;
        let muted = corroboration::is_muted(&self.mutes, id, now_ms);
        if let Some(until) = a.cooldown_until_ms {
            if muted {
                claim = corroboration::Claim::Muted;
            } else {
                let rules = self.rules(policy, reporter);
                corroboration::claim(&mut self.workers, id, until, a.anchor_ms, now_ms);
                self.reassess(rules, reporter.active, now_ms);
                claim = corroboration::judge(
                    &mut self.workers,
                    id,
                    &self.corroboration,
                    self.cooldown_until_ms,
                    rules,
                );
            }
        } else if a.widen_backoff && !muted && self.cooldown_until_ms > now_ms {
            // Refused without a hint while a cooldown holds: the upstream's
            // own behaviour supports the cooldown, to now + cap at most.
            let rules = self.rules(policy, reporter);
            let reach = now_ms.saturating_add(rules.cap_ms);
            corroboration::support(&mut self.workers, id, reach, now_ms);
            self.reassess(rules, reporter.active, now_ms);
        }
        if a.widen_backoff {
            // A step per round, not per rejection: one received while the
            // backoff held was drawn by an attempt sent before the fleet
            // knew of it (first attempts go straight, and each worker hears
            // of a backoff one refusal late), so the backoff in force
            // explains it, as a cooldown explains the refusals under it.
            // Counted per rejection, ten workers refused at once widened
            // the scope's backoff ten steps, to `backoff_max` (30 s by
            // default) after seven, and every retry with a shorter deadline
            // was refused as infeasible. Such a rejection still moves the
            // floor to a backoff after it.
            if a.anchor_ms >= self.backoff_until_ms {
                self.backoff_step = (self.backoff_step + 1).min(MAX_BACKOFF_STEP);
            }
            let wait = i64::try_from(self.backoff_ms(policy)).unwrap_or(i64::MAX);
            self.backoff_until_ms = self.backoff_until_ms.max(a.anchor_ms.saturating_add(wait));
        }
        if self.recent.len() >= RECENT_HINTS {
            self.recent.pop_front();
        }
        self.recent.push_back(HintRecord {
            at_ms: now_ms,
            raw: a.raw.clone(),
            form: a.form,
            valid: a.valid,
            capped: a.capped,
            clock_skew: a.clock_skew,
            cooldown_until_ms: a.cooldown_until_ms,
        });
        let raised = self.cooldown_until_ms > before && self.cooldown_until_ms > now_ms;
        Merge {
            raised,
            support_moved: !raised
                && self.cooldown_until_ms > now_ms
                && self.corroboration.corroborated != corroborated_before,
            cooldown_until_ms: self.cooldown_until_ms,
            backoff_ms: self.backoff_ms(policy),
            corroborated: self.corroboration.corroborated,
            workers: self.corroboration.workers,
            claim,
            noisy: self.workers.get(id).is_some_and(WorkerEvidence::noisy),
        }
    }

    /// The policy's corroboration rules, the cap no longer than the typical
    /// recent hint, for a caller scope `reporter.tokens` tokens may use.
    fn rules(&self, policy: &Policy, reporter: Reporter<'_>) -> corroboration::Rules {
        corroboration::Rules::of(policy)
            .shared_by(reporter.tokens)
            .within_typical(self.recent.iter().filter_map(|r| {
                r.cooldown_until_ms
                    .map(|until| until.saturating_sub(r.at_ms))
            }))
    }

    /// Sets the cooldown to `max(current, what the claims support)` and
    /// records how well they support it.
    fn reassess(&mut self, rules: corroboration::Rules, active: usize, now_ms: i64) {
        let mut verdict = corroboration::evaluate(&self.workers, rules, active, now_ms);
        self.cooldown_until_ms = self.cooldown_until_ms.max(verdict.until_ms);
        // A cooldown an earlier claim set may outlast what the claims
        // support now (a lone claim's reach shrinks with the typical hint):
        // then the cooldown in force is not corroborated, and must not hold
        // the fleet's first attempts as if it were.
        verdict.corroborated &=
            verdict.until_ms.saturating_add(HINT_GRANULARITY_MS) >= self.cooldown_until_ms;
        self.corroboration = verdict;
    }

    /// Until when this state must be kept: its floor, and any mute in
    /// force (an operator's mute outlives idleness, like a freeze).
    pub fn live_until_ms(&self) -> i64 {
        self.mutes.values().copied().fold(self.floor_ms(), i64::max)
    }

    /// The evidence as an operator sees it at `now_ms`.
    pub fn evidence(&self, now_ms: i64) -> corroboration::EvidenceDetail {
        corroboration::EvidenceDetail::of(self.corroboration, &self.workers, &self.mutes, now_ms)
    }

    /// A reported success narrows the backoff step by one; what was already
    /// imposed stays (never shortening a wait in flight).
    pub fn decay(&mut self) {
        self.backoff_step = self.backoff_step.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;

    const NOW: i64 = 1_704_110_400_000; // Mon, 01 Jan 2024 12:00:00 GMT

    /// A lone worker: its evidence corroborates itself.
    const ME: Reporter<'static> = Reporter {
        worker_id: "w",
        active: 1,
        tokens: 1,
    };

    fn input(status: u32, retry_after: Option<&str>, receipt_ms: i64) -> EvidenceInput<'_> {
        EvidenceInput {
            http_status: status,
            retry_after,
            receipt_ms,
            ..EvidenceInput::default()
        }
    }

    #[test]
    fn the_cooldown_in_force_is_the_routes_unless_the_caller_scopes_ends_later() {
        assert_eq!(
            in_force(Some((5, "route")), Some((5, "caller"))),
            Some("route")
        );
        assert_eq!(
            in_force(Some((5, "route")), Some((6, "caller"))),
            Some("caller")
        );
        assert_eq!(
            in_force(Some((6, "route")), Some((5, "caller"))),
            Some("route")
        );
        assert_eq!(in_force(None, Some((0, "caller"))), Some("caller"));
        assert_eq!(in_force(Some((0, "route")), None), Some("route"));
        assert_eq!(in_force::<&str>(None, None), None);
    }

    #[test]
    fn a_delay_hint_becomes_a_cooldown_from_receipt() {
        let a = assess(&input(429, Some("30"), NOW - 200), &Policy::default(), NOW);
        assert!(a.valid && !a.capped && !a.clock_skew);
        assert_eq!(a.cooldown_until_ms, Some(NOW - 200 + 30_000));
        assert!(!a.widen_backoff);
    }

    #[test]
    fn a_date_hint_is_converted_against_the_workers_receipt() {
        let a = assess(
            &input(429, Some("Mon, 01 Jan 2024 12:00:30 GMT"), NOW),
            &Policy::default(),
            NOW,
        );
        assert_eq!(a.form, HintForm::Date);
        assert_eq!(a.cooldown_until_ms, Some(NOW + 30_000));
    }

    #[test]
    fn a_skewed_worker_clock_is_recorded_and_the_delay_placed_from_now() {
        // The worker's clock is an hour ahead; the date is 30 s after its receipt.
        let worker_receipt = NOW + 3_600_000;
        let a = assess(
            &input(429, Some("Mon, 01 Jan 2024 13:00:30 GMT"), worker_receipt),
            &Policy::default(),
            NOW,
        );
        assert!(a.clock_skew);
        assert_eq!(a.delay_ms, 30_000);
        assert_eq!(a.cooldown_until_ms, Some(NOW + 30_000));
    }

    #[test]
    fn an_enormous_hint_is_capped_visibly() {
        let a = assess(&input(503, Some("99999999"), NOW), &Policy::default(), NOW);
        assert!(a.valid && a.capped);
        assert_eq!(a.cooldown_until_ms, Some(NOW + 300_000));
    }

    #[test]
    fn invalid_absent_and_past_hints_widen_the_backoff_not_the_cooldown() {
        let p = Policy::default();
        for raw in [
            Some("-1"),
            Some("1.5"),
            Some("soon"),
            None,
            Some("Mon, 01 Jan 2024 11:00:00 GMT"),
        ] {
            let a = assess(&input(429, raw, NOW), &p, NOW);
            assert_eq!(a.cooldown_until_ms, None, "{raw:?}");
            assert!(a.widen_backoff, "{raw:?}");
        }
    }

    #[test]
    fn pushback_is_read_and_the_longer_wait_wins() {
        let p = Policy::default();
        let grpc = EvidenceInput {
            grpc_code: 8,
            pushback_ms: Some("2500"),
            retry_after: Some("1"),
            receipt_ms: NOW,
            ..EvidenceInput::default()
        };
        let a = assess(&grpc, &p, NOW);
        assert_eq!(a.form, HintForm::Pushback);
        assert_eq!(a.cooldown_until_ms, Some(NOW + 2500));
        let refuse = EvidenceInput {
            pushback_ms: Some("-1"),
            ..grpc
        };
        let refuse = EvidenceInput {
            retry_after: None,
            ..refuse
        };
        let a = assess(&refuse, &p, NOW);
        assert!(!a.valid && a.widen_backoff);
    }

    #[test]
    fn a_non_rejection_moves_nothing() {
        let a = assess(&input(301, Some("30"), NOW), &Policy::default(), NOW);
        assert_eq!(a.cooldown_until_ms, None);
        assert!(!a.widen_backoff);
    }

    #[test]
    fn merging_never_shortens_and_the_backoff_decays_on_success() {
        let p = Policy::try_new(&PolicySpec {
            backoff_base: Some("1s".into()),
            backoff_max: Some("4s".into()),
            ..PolicySpec::default()
        })
        .expect("valid");
        let mut state = HintState::default();
        let long = assess(&input(429, Some("60"), NOW), &p, NOW);
        assert!(state.merge(&long, ME, &p, NOW).raised);
        let short = assess(&input(429, Some("5"), NOW), &p, NOW);
        let m = state.merge(&short, ME, &p, NOW);
        assert!(!m.raised);
        assert_eq!(m.cooldown_until_ms, NOW + 60_000);

        // Each refused after the backoff the one before set has passed.
        let steps: Vec<u64> = [0, 1_000, 3_000, 7_000]
            .into_iter()
            .map(|after| {
                let bad = assess(&input(429, Some("junk"), NOW + after), &p, NOW + after);
                state.merge(&bad, ME, &p, NOW + after).backoff_ms
            })
            .collect();
        assert_eq!(steps, [1000, 2000, 4000, 4000]);
        assert_eq!(
            state.cooldown_until_ms,
            NOW + 60_000,
            "bad hints never shorten"
        );
        state.decay();
        assert_eq!(state.backoff_ms(&p), 4000);
        state.decay();
        state.decay();
        assert_eq!(state.backoff_ms(&p), 1000);
        assert_eq!(state.recent.len(), 6);
    }

    #[test]
    fn a_fleet_refused_at_once_widens_the_backoff_one_step() {
        let p = Policy::default();
        let mut state = HintState::default();
        // Fifty workers refused without a hint within the same 100 ms.
        for i in 0..50 {
            let at = NOW + i * 2;
            let bad = assess(&input(429, None, at), &p, at);
            state.merge(&bad, ME, &p, at);
        }
        assert_eq!(state.backoff_step, 1);
        assert_eq!(
            state.floor_ms(),
            NOW + 98 + p.backoff_base_ms as i64,
            "the floor is a step after the latest refusal"
        );
        // Refused again once that has passed: the next round, one step more.
        let at = state.floor_ms();
        let again = assess(&input(429, None, at), &p, at);
        assert_eq!(
            state.merge(&again, ME, &p, at).backoff_ms,
            2 * p.backoff_base_ms
        );
    }

    #[test]
    fn the_evidence_ring_is_bounded() {
        let p = Policy::default();
        let mut state = HintState::default();
        let a = assess(&input(429, Some("x"), NOW), &p, NOW);
        for _ in 0..100 {
            state.merge(&a, ME, &p, NOW);
        }
        assert_eq!(state.recent.len(), RECENT_HINTS);
    }
}
