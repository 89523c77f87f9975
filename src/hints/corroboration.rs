//! Corroboration: how far one worker's hints may move the fleet. Pure.
//!
//! # Why
//! A scope's cooldown stops every worker's retries. If one report could set
//! it, one buggy or compromised worker (it only needs its tenant's token)
//! could stall its tenant for `max_hint`, fleet-wide, and again each time
//! the cooldown ends. So every worker's latest *claim* (the instant its
//! valid hints say the upstream is closed until) is kept per worker, and
//! the fleet-wide cooldown is what the claims support together:
//!
//! - **Uncorroborated**, a claim moves the fleet for at most
//!   `uncorroborated_cap` counted from the start of that worker's streak of
//!   claims (a streak ends when its claim expires), so reporting the same
//!   lie again and again buys nothing more; or for the route's typical
//!   recent hint when that is shorter, so a lie told where honest hints say
//!   a second costs the fleet a second. The worker itself already waits
//!   its own hint (the client honours what it received).
//! - **Corroborated**, the cooldown is the `needed`-th latest claim: the
//!   latest instant that `needed` distinct workers agree on. `needed` is
//!   `corroborate_workers`, or `corroborate_fraction` of the route's active
//!   workers when that is more, and never more than there are workers (one
//!   when the scope has one). Because it is an order statistic, one worker
//!   claiming 300 s while twenty claim 5 s gives 5 s; and because `needed`
//!   grows with the fleet, a few percent of a large fleet that lie
//!   identically do not corroborate each other.
//!
//! Every claim stays as evidence and is counted per worker: a claim that
//! ends more than the cap after the fleet's cooldown is an *outlier* when
//! enough workers reported to judge, or *uncorroborated* when not. A worker
//! whose claims keep disagreeing is flagged `noisy`; an operator can mute
//! its evidence (its hints are still recorded, never merged).

use std::collections::BTreeMap;

use crate::pacing::HINT_GRANULARITY_MS;
use crate::policy::Policy;

/// Workers whose evidence is kept per route or caller scope; the one heard
/// from longest ago is forgotten first. Pacing's stated limits keep as many
/// statements (and the budget as many workers), so every active worker of a
/// large fleet can be counted; the bound is pacing's, below this module.
pub const MAX_EVIDENCE_WORKERS: usize = crate::pacing::stated::MAX_STATEMENT_WORKERS;
/// Mutes kept per route or caller scope: an operator's list, not a fleet's.
pub const MAX_MUTES: usize = 64;
/// Disagreements a worker needs before it can be flagged noisy: one early
/// claim in a genuine incident is not a pattern.
pub const NOISY_MIN_DISAGREEMENTS: u32 = 5;

/// One worker's evidence on one route or caller scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerEvidence {
    /// The latest instant its valid hints claim the upstream is closed
    /// until; it only moves later within a streak.
    pub claim_until_ms: i64,
    /// Where its current streak of claims started (the first claim's
    /// anchor): the uncorroborated cap counts from here, not from each
    /// report, so repeating a claim does not extend its reach.
    pub since_ms: i64,
    /// Its last valid hint here, to forget the longest-silent worker first.
    pub last_ms: i64,
    /// Valid hints it reported.
    pub hints: u32,
    /// Hints whose claim outran the corroborated cooldown by more than the
    /// cap while enough workers had reported to judge.
    pub outliers: u32,
    /// Hints whose claim outran the cooldown while too few workers had
    /// reported to corroborate it.
    pub uncorroborated: u32,
}

impl WorkerEvidence {
    /// Whether its evidence keeps disagreeing with the fleet: at least
    /// [`NOISY_MIN_DISAGREEMENTS`] disagreeing hints, and more than half of
    /// all it reported.
    pub fn noisy(&self) -> bool {
        let disagreed = self.outliers.saturating_add(self.uncorroborated);
        disagreed >= NOISY_MIN_DISAGREEMENTS && disagreed > self.hints / 2
    }
}

/// How well the evidence supports a level's cooldown, as of the last valid
/// hint merged there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Corroboration {
    /// The cooldown the live claims support; 0 when none.
    pub until_ms: i64,
    /// Whether `until_ms` rests on at least `needed` distinct workers.
    pub corroborated: bool,
    /// Distinct workers whose live claims reach `until_ms`.
    pub workers: u32,
    /// Distinct workers with a live claim.
    pub reporters: u32,
    /// Distinct workers needed to corroborate.
    pub needed: u32,
}

/// The corroboration keys of a policy, in the units the math uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Distinct workers needed at least.
    pub min_workers: u32,
    /// Of the active workers, the part needed, in permille.
    pub fraction_permille: u32,
    /// How far past its streak's start one worker's claim moves the fleet.
    pub cap_ms: i64,
    /// Distinct owners (caller tokens) whose workers must be among those
    /// that agree: two where several tokens may use the caller scope, so
    /// one token's workers, however many ids it invents, hold the other
    /// tokens' workers no longer than an uncorroborated claim may; one
    /// otherwise (inside one token, workers corroborate each other).
    pub min_owners: usize,
}

impl Rules {
    /// The rules of `policy`.
    pub fn of(policy: &Policy) -> Rules {
        Rules {
            min_workers: policy.corroborate_workers,
            fraction_permille: policy.corroborate_permille,
            cap_ms: i64::try_from(policy.uncorroborated_cap_ms).unwrap_or(i64::MAX),
            min_owners: 1,
        }
    }

    /// These rules for a caller scope `tokens` caller tokens may use.
    pub fn shared_by(self, tokens: usize) -> Rules {
        Rules {
            min_owners: tokens.clamp(1, 2),
            ..self
        }
    }

    /// These rules with the cap no longer than the typical hint the level
    /// received lately (the lower median of `lengths`, each a recent claim's
    /// end less when it was merged; one hint granularity at least): a lone
    /// worker's claim moves the fleet no further than its honest hints
    /// usually do. It only ever shortens the cap, so reporters that lie
    /// persistently cannot lengthen it; with no recent claims it is the
    /// policy's.
    pub fn within_typical(self, lengths: impl Iterator<Item = i64>) -> Rules {
        let mut lengths: Vec<i64> = lengths.collect();
        if lengths.is_empty() {
            return self;
        }
        lengths.sort_unstable();
        let typical = lengths[(lengths.len() - 1) / 2].max(HINT_GRANULARITY_MS);
        Rules {
            cap_ms: self.cap_ms.min(typical),
            ..self
        }
    }

    /// Distinct workers needed among `population` (active or reporting,
    /// whichever is more): `max(min_workers, ⌈fraction × population⌉)`, at
    /// most the population, at least one.
    pub fn needed(&self, population: usize) -> usize {
        let population = population.max(1);
        let by_fraction = (population * self.fraction_permille as usize).div_ceil(1000);
        (self.min_workers as usize)
            .max(by_fraction)
            .clamp(1, population)
    }
}

/// What the live claims support at `now_ms`, with `active` workers in the
/// route (the reporters count too when there are more of them).
pub fn evaluate(
    workers: &BTreeMap<String, WorkerEvidence>,
    rules: Rules,
    active: usize,
    now_ms: i64,
) -> Corroboration {
    let live: Vec<(&str, &WorkerEvidence)> = workers
        .iter()
        .filter(|(_, w)| w.claim_until_ms > now_ms)
        .map(|(id, w)| (crate::scope::owner_of(id), w))
        .collect();
    let mut claims: Vec<(i64, &str)> = live
        .iter()
        .map(|(owner, w)| (w.claim_until_ms, *owner))
        .collect();
    claims.sort_unstable_by(|a, b| b.cmp(a));
    let needed = rules.needed(active.max(claims.len()));
    // The latest instant that `needed` distinct workers, of at least
    // `min_owners` owners, agree on.
    let mut owners: Vec<&str> = Vec::new();
    let mut corroborated_until = 0;
    for (i, &(claim, who)) in claims.iter().enumerate() {
        if !owners.contains(&who) {
            owners.push(who);
        }
        if i + 1 >= needed && owners.len() >= rules.min_owners {
            corroborated_until = claim;
            break;
        }
    }
    let alone_until = live
        .iter()
        .map(|(_, w)| {
            w.claim_until_ms
                .min(w.since_ms.saturating_add(rules.cap_ms))
        })
        .max()
        .unwrap_or(0);
    let until_ms = corroborated_until.max(alone_until);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Corroboration {
        until_ms,
        // Hints are whole seconds, rounded up when read: claims for the same
        // instant differ by up to one, so the latest of them is agreed with
        // when enough reach within a second of it.
        corroborated: corroborated_until > 0
            && corroborated_until.saturating_add(HINT_GRANULARITY_MS) >= alone_until,
        workers: count(claims.iter().filter(|&&(c, _)| c >= until_ms).count()),
        reporters: count(claims.len()),
        needed: count(needed),
    }
}

/// Records `worker`'s claim `until_ms` (anchored at `anchor_ms`) at
/// `now_ms`, keeping the map within [`MAX_EVIDENCE_WORKERS`].
pub fn claim(
    workers: &mut BTreeMap<String, WorkerEvidence>,
    worker: &str,
    until_ms: i64,
    anchor_ms: i64,
    now_ms: i64,
) {
    let w = record(workers, worker, until_ms, anchor_ms, now_ms);
    w.hints = w.hints.saturating_add(1);
}

/// Records the upstream's behaviour as `worker`'s claim: it refused the
/// worker without a hint at `now_ms`, while a cooldown held. That supports
/// the cooldown only as far as `until_ms` (the caller's `now + cap`), a
/// streak like any claim: enough distinct workers refused keep it rolling
/// while the upstream keeps refusing, and a lone claim, however long, gets
/// no further than that. Not a hint: nothing is judged or counted.
pub fn support(
    workers: &mut BTreeMap<String, WorkerEvidence>,
    worker: &str,
    until_ms: i64,
    now_ms: i64,
) {
    record(workers, worker, until_ms, now_ms, now_ms);
}

fn record<'a>(
    workers: &'a mut BTreeMap<String, WorkerEvidence>,
    worker: &str,
    until_ms: i64,
    anchor_ms: i64,
    now_ms: i64,
) -> &'a mut WorkerEvidence {
    if !workers.contains_key(worker) && workers.len() >= MAX_EVIDENCE_WORKERS {
        let oldest = workers
            .iter()
            .min_by_key(|(_, w)| w.last_ms)
            .map(|(id, _)| id.clone());
        if let Some(oldest) = oldest {
            workers.remove(&oldest);
        }
    }
    let w = workers.entry(worker.to_owned()).or_default();
    if w.claim_until_ms <= now_ms {
        // The last streak is over: this claim starts a new one.
        w.since_ms = anchor_ms;
        w.claim_until_ms = until_ms;
    } else {
        w.claim_until_ms = w.claim_until_ms.max(until_ms);
    }
    w.last_ms = w.last_ms.max(now_ms);
    w
}

/// How one valid hint's claim stood against the fleet when it was merged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Claim {
    /// No valid hint: nothing was claimed.
    #[default]
    None,
    /// Within the cap of the fleet's cooldown.
    Agreed,
    /// Beyond it, with enough reporters to judge.
    Outlier,
    /// Beyond it, with too few reporters to corroborate.
    Uncorroborated,
    /// The worker is muted here: kept as evidence only.
    Muted,
}

impl Claim {
    /// The metric label and the Lua code's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Claim::None => "none",
            Claim::Agreed => "agreed",
            Claim::Outlier => "outlier",
            Claim::Uncorroborated => "uncorroborated",
            Claim::Muted => "muted",
        }
    }
}

/// Counts `worker`'s latest claim against the fleet's cooldown after it was
/// merged: beyond the cap past `cooldown_until_ms`, it disagreed.
pub fn judge(
    workers: &mut BTreeMap<String, WorkerEvidence>,
    worker: &str,
    verdict: &Corroboration,
    cooldown_until_ms: i64,
    rules: Rules,
) -> Claim {
    let Some(w) = workers.get_mut(worker) else {
        return Claim::None;
    };
    if w.claim_until_ms <= cooldown_until_ms.saturating_add(rules.cap_ms) {
        return Claim::Agreed;
    }
    if verdict.reporters >= verdict.needed {
        w.outliers = w.outliers.saturating_add(1);
        Claim::Outlier
    } else {
        w.uncorroborated = w.uncorroborated.saturating_add(1);
        Claim::Uncorroborated
    }
}

/// Whether `worker`'s evidence is muted at `now_ms`. A mute names a
/// worker as the Admin API shows it (`t2:worker-17`: one token's) or as the
/// worker calls itself (`worker-17`: whichever token sends it), since the
/// operator reading a worker's own logs knows it by that name.
pub fn is_muted(mutes: &BTreeMap<String, i64>, worker: &str, now_ms: i64) -> bool {
    let live = |id: &str| mutes.get(id).is_some_and(|&until| until > now_ms);
    live(worker) || live(crate::scope::sent_id(worker))
}

/// Mutes `worker` until `until_ms` (`None`: lifts the mute), dropping
/// lapsed mutes first. Returns false when the list is full.
pub fn set_mute(
    mutes: &mut BTreeMap<String, i64>,
    worker: &str,
    until_ms: Option<i64>,
    now_ms: i64,
) -> bool {
    mutes.retain(|_, until| *until > now_ms);
    match until_ms {
        None => {
            mutes.remove(worker);
            true
        }
        Some(until) => {
            if !mutes.contains_key(worker) && mutes.len() >= MAX_MUTES {
                return false;
            }
            mutes.insert(worker.to_owned(), until);
            true
        }
    }
}

/// Disagreeing workers an operator is shown per level, most disagreeing
/// first: enough to find the culprit, bounded for the reply.
pub const SHOWN_WORKERS: usize = 16;

/// A level's evidence as an operator sees it (`GetScope`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvidenceDetail {
    /// How the claims supported the cooldown at the last valid hint.
    pub corroboration: Corroboration,
    /// Workers whose evidence disagreed with the fleet, most disagreements
    /// first (at most [`SHOWN_WORKERS`]).
    pub workers: Vec<(String, WorkerEvidence)>,
    /// Workers flagged noisy, shown or not.
    pub noisy: u32,
    /// Mutes in force: worker and until when.
    pub mutes: Vec<(String, i64)>,
}

impl EvidenceDetail {
    /// The detail of one level's state at `now_ms`.
    pub fn of(
        corroboration: Corroboration,
        workers: &BTreeMap<String, WorkerEvidence>,
        mutes: &BTreeMap<String, i64>,
        now_ms: i64,
    ) -> EvidenceDetail {
        let disagreed = |w: &WorkerEvidence| w.outliers.saturating_add(w.uncorroborated);
        let mut shown: Vec<(String, WorkerEvidence)> = workers
            .iter()
            .filter(|(_, w)| disagreed(w) > 0)
            .map(|(id, w)| (id.clone(), w.clone()))
            .collect();
        shown.sort_by(|a, b| disagreed(&b.1).cmp(&disagreed(&a.1)).then(a.0.cmp(&b.0)));
        shown.truncate(SHOWN_WORKERS);
        EvidenceDetail {
            corroboration,
            workers: shown,
            noisy: u32::try_from(workers.values().filter(|w| w.noisy()).count())
                .unwrap_or(u32::MAX),
            mutes: mutes
                .iter()
                .filter(|&(_, &until)| until > now_ms)
                .map(|(id, &until)| (id.clone(), until))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;
    const RULES: Rules = Rules {
        min_workers: 3,
        fraction_permille: 100,
        cap_ms: 5_000,
        min_owners: 1,
    };

    fn fleet(claims: &[(usize, i64)]) -> BTreeMap<String, WorkerEvidence> {
        let mut m = BTreeMap::new();
        for &(w, secs) in claims {
            claim(&mut m, &format!("w{w}"), NOW + secs * 1000, NOW, NOW);
        }
        m
    }

    #[test]
    fn needed_grows_with_the_fleet_and_is_one_for_a_lone_worker() {
        assert_eq!(RULES.needed(1), 1);
        assert_eq!(RULES.needed(2), 2);
        assert_eq!(RULES.needed(11), 3);
        assert_eq!(RULES.needed(500), 50);
    }

    #[test]
    fn one_enormous_claim_among_quiet_workers_reaches_only_the_cap() {
        let m = fleet(&[(0, 300)]);
        let v = evaluate(&m, RULES, 11, NOW);
        assert_eq!(v.until_ms, NOW + 5_000);
        assert!(!v.corroborated);
        assert_eq!((v.workers, v.reporters, v.needed), (1, 1, 3));
    }

    #[test]
    fn the_cap_shortens_to_the_typical_recent_hint_and_never_grows() {
        let typical = RULES.within_typical([3_000, 1_000, 2_000, 300_000].into_iter());
        assert_eq!(typical.cap_ms, 2_000, "the lower median");
        let liars = RULES.within_typical([300_000, 300_000, 1_000].into_iter());
        assert_eq!(liars.cap_ms, 5_000, "never past the policy's cap");
        let past = RULES.within_typical([-4_000, 0].into_iter());
        assert_eq!(past.cap_ms, HINT_GRANULARITY_MS, "one granularity at least");
        assert_eq!(RULES.within_typical(std::iter::empty()), RULES);
    }

    #[test]
    fn three_agreeing_workers_corroborate_the_full_cooldown() {
        let m = fleet(&[(0, 60), (1, 60), (2, 59)]);
        let v = evaluate(&m, RULES, 11, NOW);
        assert_eq!(v.until_ms, NOW + 59_000);
        assert!(v.corroborated);
        assert_eq!(v.workers, 3);
    }

    /// Whole-second hints read at different instants of an outage name
    /// ends up to a second apart; under the cap, the latest of them is
    /// still the fleet's agreed end.
    #[test]
    fn hints_a_second_apart_under_the_cap_corroborate() {
        let m = fleet(&[(0, 4), (1, 4), (2, 4), (3, 5)]);
        let v = evaluate(&m, RULES, 11, NOW);
        assert_eq!(v.until_ms, NOW + 5_000);
        assert!(v.corroborated);
        let lone = fleet(&[(0, 3), (1, 3), (2, 3), (3, 5)]);
        assert!(!evaluate(&lone, RULES, 11, NOW).corroborated);
    }

    #[test]
    fn one_outlier_among_twenty_does_not_set_the_cooldown() {
        let mut claims: Vec<(usize, i64)> = (1..=20).map(|w| (w, 5)).collect();
        claims.push((0, 300));
        let mut m = fleet(&claims);
        let v = evaluate(&m, RULES, 21, NOW);
        assert_eq!(v.until_ms, NOW + 5_000);
        assert!(v.corroborated);
        assert_eq!(v.workers, 21);
        judge(&mut m, "w0", &v, v.until_ms, RULES);
        assert_eq!(m["w0"].outliers, 1);
        judge(&mut m, "w1", &v, v.until_ms, RULES);
        assert_eq!(m["w1"].outliers, 0);
    }

    #[test]
    fn a_few_percent_lying_identically_do_not_corroborate_each_other() {
        // 25 of 500 claim 300 s; 100 honest workers claim 10 s.
        let mut claims: Vec<(usize, i64)> = (0..25).map(|w| (w, 300)).collect();
        claims.extend((25..125).map(|w| (w, 10)));
        let v = evaluate(&fleet(&claims), RULES, 500, NOW);
        assert_eq!(v.until_ms, NOW + 10_000);
        // After the outage only the liars' claims are live.
        let liars = fleet(&claims[..25]);
        let v = evaluate(&liars, RULES, 500, NOW + 11_000);
        assert!(!v.corroborated);
        assert!(
            v.until_ms <= NOW + 11_000,
            "the cap ran out with the streak"
        );
    }

    #[test]
    fn repeating_a_claim_does_not_extend_its_reach() {
        let mut m = fleet(&[(0, 300)]);
        for s in 1..100 {
            let t = NOW + s * 1000;
            claim(&mut m, "w0", t + 300_000, t, t);
        }
        let v = evaluate(&m, RULES, 11, NOW + 100_000);
        assert_eq!(v.until_ms, NOW + 5_000);
        assert_eq!(m["w0"].hints, 100);
    }

    #[test]
    fn a_lone_worker_corroborates_itself() {
        let m = fleet(&[(0, 30)]);
        let v = evaluate(&m, RULES, 1, NOW);
        assert_eq!(v.until_ms, NOW + 30_000);
        assert!(v.corroborated);
    }

    #[test]
    fn a_worker_that_keeps_disagreeing_is_noisy() {
        let mut m = fleet(&[(0, 300)]);
        let v = evaluate(&m, RULES, 11, NOW);
        for _ in 0..5 {
            judge(&mut m, "w0", &v, v.until_ms, RULES);
        }
        assert!(m["w0"].noisy());
        let honest = WorkerEvidence {
            hints: 20,
            uncorroborated: 5,
            ..WorkerEvidence::default()
        };
        assert!(!honest.noisy());
    }

    #[test]
    fn the_evidence_map_and_the_mutes_are_bounded() {
        let mut m = BTreeMap::new();
        for i in 0..(MAX_EVIDENCE_WORKERS + 10) {
            let t = NOW + i as i64;
            claim(&mut m, &format!("w{i}"), t + 1000, t, t);
        }
        assert_eq!(m.len(), MAX_EVIDENCE_WORKERS);
        assert!(
            !m.contains_key("w0"),
            "the longest-silent worker goes first"
        );
        let mut mutes = BTreeMap::new();
        for i in 0..MAX_MUTES {
            assert!(set_mute(&mut mutes, &format!("w{i}"), Some(NOW + 10), NOW));
        }
        assert!(!set_mute(&mut mutes, "one-more", Some(NOW + 10), NOW));
        assert!(set_mute(&mut mutes, "one-more", Some(NOW + 10), NOW + 20));
        assert!(is_muted(&mutes, "one-more", NOW + 5));
        assert!(!is_muted(&mutes, "one-more", NOW + 10));
    }

    #[test]
    fn where_tokens_share_a_caller_scope_one_tokens_workers_alone_corroborate_nothing() {
        // Token one invents five workers that all claim 300 s.
        let mut m = BTreeMap::new();
        for w in 0..5 {
            claim(&mut m, &format!("t1:w{w}"), NOW + 300_000, NOW, NOW);
        }
        let alone = evaluate(&m, RULES, 5, NOW);
        assert!(alone.corroborated, "inside one token, workers corroborate");
        assert_eq!(alone.until_ms, NOW + 300_000);
        let shared = evaluate(&m, RULES.shared_by(2), 5, NOW);
        assert!(!shared.corroborated);
        assert_eq!(
            shared.until_ms,
            NOW + RULES.cap_ms,
            "no further than an uncorroborated claim"
        );
        // A worker of token two agreeing makes it corroborated, as far as
        // both agree.
        claim(&mut m, "t2:x", NOW + 60_000, NOW, NOW);
        let both = evaluate(&m, RULES.shared_by(2), 6, NOW);
        assert!(both.corroborated);
        assert_eq!(both.until_ms, NOW + 60_000);
    }

    #[test]
    fn a_mute_names_one_tokens_worker_or_the_worker_as_it_calls_itself() {
        let mut mutes = BTreeMap::new();
        set_mute(&mut mutes, "worker-7", Some(NOW + 10), NOW);
        set_mute(&mut mutes, "t2:worker-9", Some(NOW + 10), NOW);
        // As the worker calls itself: whichever token sends it.
        assert!(is_muted(&mutes, "worker-7", NOW));
        assert!(is_muted(&mutes, "t1:worker-7", NOW));
        assert!(is_muted(&mutes, "t3:worker-7", NOW));
        // As the Admin API shows it: that token's worker only.
        assert!(is_muted(&mutes, "t2:worker-9", NOW));
        assert!(!is_muted(&mutes, "t1:worker-9", NOW));
        assert!(!is_muted(&mutes, "worker-9", NOW));
    }
}
