//! What a storm run measured, and two of its three renderings: a markdown
//! table and JSON with every series for anyone who wants to plot it
//! differently. The third, the SVG chart (one panel per strategy), is drawn
//! from the results by `chart.rs`, which reads this module and not the reverse.
//!
//! Definitions (also printed under the table):
//! - offered load: attempts reaching the upstream (served + refused), per
//!   100 ms and per 1 s;
//! - capacity in force: the upstream's capacity averaged over a 1 s window
//!   (C, the outage's fraction of it, or the fraction after it);
//! - peak/capacity: the highest offered load in any whole second (windows
//!   aligned to the start) over the capacity in force in that second;
//!   seconds with no capacity at all (a full outage) are left out, since any
//!   first attempt there is an infinite ratio;
//! - lost: intents that did not succeed by their deadline; "lost vs best
//!   (a–d)" divides a strategy's lost intents by the fewest any per-process
//!   baseline that ran lost;
//! - amplification: attempts ÷ intents;
//! - goodput: intents that succeeded by their deadline ÷ all intents
//!   (cancelled ones included: every strategy gets the same cancellations);
//! - p50/p99: completion time, arrival to success, of the intents that
//!   succeeded (nearest rank);
//! - after deadline / after cancel: attempts the upstream saw at or after
//!   their intent's deadline, or after its cancellation. Both must be 0.
//!
//! Against the clairvoyant bound (`bound/`), once per run:
//! - bound served / bound lost: the most intents any scheduler could serve
//!   on the same arrivals, deadlines, cancellations and limiter, never
//!   refused (an upper bound, solved exactly), and the intents it must lose
//!   even so; "witnessed": what a schedule the limiter really admits serves
//!   (the optimum lies between; equal means the bound is exact);
//!
//! and per strategy, in whole seconds aligned to the start:
//! - lost above bound: lost − bound lost (≥ 0); "vs best (a–d)" divides it
//!   by the least lost above bound of any per-process baseline that ran;
//! - waiting, at the start of a second: intents that have arrived and not
//!   ended, whose deadline has not passed and whose caller has not
//!   cancelled them;
//! - utilisation while work waits: served ÷ capacity in force, over the
//!   seconds with capacity in force above 0 in which at least one second's
//!   worth of it (capacity in force × 1 s) is waiting, leaving out every
//!   second that overlaps the first two seconds after a change of capacity
//!   in force (the fleet needs a moment to see it); the minimum and the
//!   mean over those seconds;
//! - steady rejections: 429s ÷ attempts, summed over the seconds with
//!   capacity in force above 0 that had the same capacity in force for the
//!   10 s before them and throughout (a long full outage refuses everything
//!   by definition, and is measured by the peak and the amplification);
//! - peak excluding the first second of a drop: the peak/capacity above,
//!   leaving out every second that overlaps the first second after the
//!   capacity in force drops (first attempts cannot know of the drop);
//! - checks, pass/fail, the criteria Tollgate is held to: peak excluding a
//!   drop's first second ≤ 1.1; minimum utilisation while work waits
//!   ≥ 0.9; steady rejections ≤ 0.01; lost above bound ≤ 0.25 × the best
//!   baseline's; amplification ≤ 1.3; no attempt after its deadline or
//!   cancellation. A check whose metric has no seconds (or no baseline) to
//!   be measured over is neither (`null`, "–").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use tollgate_client::outcome::Outcome;

use super::bound::Bound;
use super::limiter::LimiterShape;
use super::pipes::METHODS;
use super::runner::CoordinatorRecord;
use super::strategy::StrategyKind;
use super::upstream::Observed;
use super::{HintStyle, IntentRecord, Mode, StormArgs, StormConfig};

const BUCKETS_PER_SECOND: usize = 10;

/// Seconds left out of the utilisation after a change of capacity in
/// force: the fleet sees a change through its answers, and the first
/// seconds after it measure how fast it looks, which the peak and the lost
/// intents already judge.
const SETTLE_S: f64 = 2.0;
/// How long the capacity in force must have held for a second to count as
/// steady for the rejection rate.
const STEADY_S: f64 = 10.0;

/// The criteria each strategy is checked against (`Checks`).
mod criteria {
    /// Peak offered load over the capacity in force, a drop's first second
    /// aside: some overshoot is how a limit is found, a multiple is a storm.
    pub(super) const PEAK: f64 = 1.1;
    /// Minimum utilisation while work waits: capacity left unused while
    /// intents wait is service a smarter fleet would have given.
    pub(super) const UTILISATION: f64 = 0.9;
    /// Steady rejections: at a steady capacity a paced fleet is rarely
    /// refused.
    pub(super) const STEADY_REJECTIONS: f64 = 0.01;
    /// Lost above the bound, as a fraction of the best baseline's.
    pub(super) const LOST_ABOVE_BOUND: f64 = 0.25;
    /// Attempts per intent.
    pub(super) const AMPLIFICATION: f64 = 1.3;
}

/// One strategy's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyResult {
    /// The strategy's key.
    pub strategy: StrategyKind,
    /// What it does, with its parameters.
    pub description: String,
    /// Intents offered (the same for every strategy).
    pub intents: u64,
    /// Attempts the upstream saw.
    pub attempts: u64,
    /// attempts ÷ intents.
    pub amplification: f64,
    /// Intents that succeeded by their deadline.
    pub succeeded_in_deadline: u64,
    /// succeeded_in_deadline ÷ intents.
    pub goodput: f64,
    /// Median completion time of successes, seconds.
    pub p50_s: Option<f64>,
    /// 99th percentile completion time of successes, seconds.
    pub p99_s: Option<f64>,
    /// 429s the upstream sent.
    pub rejected_429: u64,
    /// Intents that did not succeed by their deadline.
    pub lost: u64,
    /// `lost` over the fewest lost by a per-process baseline (a)–(d) in the
    /// same run; `None` when no baseline ran or the best lost none.
    pub lost_vs_best_baseline: Option<f64>,
    /// The highest offered load in any whole second over the capacity in
    /// force in that second (seconds with zero capacity left out).
    pub peak_over_capacity_in_force: f64,
    /// The second (from the start) where that peak was.
    pub peak_second: Option<usize>,
    /// Attempts at or after their intent's deadline (must be 0).
    pub attempts_after_deadline: u64,
    /// Attempts after their intent's cancellation (must be 0).
    pub attempts_after_cancel: u64,
    /// Intents that had not ended a grace period after their deadline.
    pub unfinished: u64,
    /// How intents ended, by outcome name.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Offered load per 100 ms bucket.
    pub offered_per_100ms: Vec<u32>,
    /// Offered load per second.
    pub offered_per_s: Vec<u32>,
    /// Served requests per second.
    pub served_per_s: Vec<u32>,
    /// Refused attempts (429s) per second.
    pub rejected_per_s: Vec<u32>,
    /// The upstream's capacity in force per second, requests/s.
    pub capacity_per_s: Vec<f64>,
    /// For (e) and (f): the coordinator's view of the storm scope and the
    /// workers' RPCs, per second.
    pub coordinator: Option<CoordinatorRecord>,
    /// For (e) and (f): the workers' RPCs to the coordinator, summed up.
    pub rpcs: Option<RpcSummary>,
    /// `lost` − the bound's lost: intents lost beyond what no scheduler
    /// could have served.
    pub lost_above_bound: i64,
    /// `lost_above_bound` over the least of any baseline (a)–(d) in the same
    /// run; `None` when no baseline ran or the best is not above 0.
    pub lost_above_bound_vs_best_baseline: Option<f64>,
    /// The least served ÷ capacity in force over the seconds where work
    /// waits (module doc); `None` when there is no such second.
    pub utilisation_while_waiting_min: Option<f64>,
    /// The mean of the same.
    pub utilisation_while_waiting_mean: Option<f64>,
    /// How many seconds those two are over.
    pub utilisation_while_waiting_seconds: usize,
    /// 429s ÷ attempts over the seconds of steady capacity in force; `None`
    /// when no attempt fell in one.
    pub steady_rejections: Option<f64>,
    /// The peak offered load over the capacity in force, leaving out the
    /// first second of every drop in capacity.
    pub peak_excl_drop_over_capacity_in_force: f64,
    /// The second where that peak was.
    pub peak_excl_drop_second: Option<usize>,
    /// The criteria, pass or fail.
    pub checks: Checks,
    /// Every intent, in arrival order: what `--intents-csv` writes.
    #[serde(skip)]
    pub(super) intent_records: Vec<IntentRecord>,
}

/// Pass (`true`) or fail of each criterion (module doc); `None` where the
/// metric had nothing to be measured over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Checks {
    /// Peak excluding a drop's first second ≤ 1.1.
    pub peak: Option<bool>,
    /// Minimum utilisation while work waits ≥ 0.9.
    pub utilisation: Option<bool>,
    /// Steady rejections ≤ 0.01.
    pub steady_rejections: Option<bool>,
    /// Lost above the bound ≤ 0.25 × the best baseline's.
    pub lost_above_bound: Option<bool>,
    /// Amplification ≤ 1.3.
    pub amplification: bool,
    /// No attempt at or after its deadline, none after its cancellation.
    pub no_late_attempts: bool,
}

impl Checks {
    fn new(r: &StrategyResult, best_lost_above_bound: Option<i64>) -> Self {
        Checks {
            peak: r
                .peak_excl_drop_second
                .map(|_| r.peak_excl_drop_over_capacity_in_force <= criteria::PEAK),
            utilisation: r
                .utilisation_while_waiting_min
                .map(|u| u >= criteria::UTILISATION),
            steady_rejections: r
                .steady_rejections
                .map(|x| x <= criteria::STEADY_REJECTIONS),
            lost_above_bound: best_lost_above_bound.map(|best| {
                r.lost_above_bound as f64 <= criteria::LOST_ABOVE_BOUND * best.max(0) as f64
            }),
            amplification: r.amplification <= criteria::AMPLIFICATION,
            no_late_attempts: r.attempts_after_deadline == 0 && r.attempts_after_cancel == 0,
        }
    }

    /// The checks in table order, with a short name each.
    fn named(&self) -> [(&'static str, Option<bool>); 6] {
        [
            ("peak", self.peak),
            ("util", self.utilisation),
            ("rej", self.steady_rejections),
            ("lost", self.lost_above_bound),
            ("amp", Some(self.amplification)),
            ("late", Some(self.no_late_attempts)),
        ]
    }
}

/// The workers' RPCs to the coordinator during one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcSummary {
    /// All of them.
    pub total: u64,
    /// By method (Lease, Release, Report, Reconsider, Watch, other).
    pub by_method: BTreeMap<&'static str, u64>,
    /// Per worker per second before the outage (whole seconds).
    pub steady_per_worker_per_s: f64,
    /// Per worker per second in the storm: from the outage's start until
    /// every intent that arrived during the outage has met its deadline.
    pub storm_per_worker_per_s: f64,
}

impl RpcSummary {
    fn new(record: &CoordinatorRecord, config: &StormConfig) -> Self {
        let per_second: Vec<u64> = record
            .rpcs
            .per_second
            .iter()
            .map(|s| s.iter().sum())
            .collect();
        let mut by_method = BTreeMap::new();
        for second in &record.rpcs.per_second {
            for (name, n) in record.rpcs.methods.iter().zip(second) {
                *by_method.entry(*name).or_insert(0) += n;
            }
        }
        let whole = |d: Duration| usize::try_from(d.as_secs()).unwrap_or(usize::MAX);
        let storm_end =
            whole(config.outage_end + config.deadline).max(whole(config.outage_start) + 1);
        let rate = |from: usize, to: usize| {
            let to = to.min(per_second.len());
            if to <= from {
                return 0.0;
            }
            let sum: u64 = per_second[from..to].iter().sum();
            sum as f64 / (to - from) as f64 / config.workers as f64
        };
        RpcSummary {
            total: per_second.iter().sum(),
            by_method,
            steady_per_worker_per_s: rate(0, whole(config.outage_start)),
            storm_per_worker_per_s: rate(whole(config.outage_start), storm_end),
        }
    }
}

/// What the harness gathered while one strategy ran.
pub(super) struct Measured<'a> {
    /// Intents offered.
    pub(super) intents: u64,
    /// Every intent that ended, with its outcome.
    pub(super) records: &'a [IntentRecord],
    /// Intents that had not ended a grace period after their deadline.
    pub(super) unfinished: u64,
    /// What the upstream saw.
    pub(super) observed: Observed,
    /// What the coordinator was seen doing, for (e) and (f).
    pub(super) coordinator: Option<CoordinatorRecord>,
}

impl StrategyResult {
    pub(super) fn new(
        strategy: StrategyKind,
        description: String,
        config: &StormConfig,
        measured: Measured<'_>,
    ) -> Self {
        let Measured {
            intents,
            records,
            unfinished,
            observed,
            coordinator,
        } = measured;
        let mut outcomes = BTreeMap::new();
        let mut completion = Vec::new();
        for r in records {
            *outcomes.entry(r.outcome.as_str()).or_insert(0) += 1;
            let took = r.ended - r.arrived;
            if r.outcome == Outcome::Succeeded && took <= config.deadline {
                completion.push(took);
            }
        }
        completion.sort_unstable();
        let attempts: u64 = observed.offered.iter().map(|&n| u64::from(n)).sum();
        let ratio = |n: u64| {
            if intents == 0 {
                0.0
            } else {
                n as f64 / intents as f64
            }
        };
        let offered_per_s = per_second(&observed.offered);
        let capacity_per_s: Vec<f64> = (0..offered_per_s.len())
            .map(|i| {
                let from = Duration::from_secs(i as u64);
                config.capacity_earned(from, from + Duration::from_secs(1))
            })
            .collect();
        let (peak, peak_second) = peak_over_capacity(&offered_per_s, &capacity_per_s);
        let seconds = Seconds::new(config);
        let drop_free: Vec<f64> = capacity_per_s
            .iter()
            .enumerate()
            .map(|(s, &c)| if seconds.in_drop(s) { 0.0 } else { c })
            .collect();
        let (peak_excl, peak_excl_second) = peak_over_capacity(&offered_per_s, &drop_free);
        let served_per_s = per_second(&observed.served);
        let rejected_per_s = per_second(&observed.refused);
        let utilisation = seconds.utilisation(&waiting_per_s(records, config), &served_per_s);
        let steady_rejections = seconds.steady_rejections(&offered_per_s, &rejected_per_s);
        let succeeded = completion.len() as u64;
        StrategyResult {
            strategy,
            description,
            intents,
            attempts,
            amplification: ratio(attempts),
            succeeded_in_deadline: succeeded,
            goodput: ratio(succeeded),
            lost: intents.saturating_sub(succeeded),
            lost_vs_best_baseline: None,
            peak_over_capacity_in_force: peak,
            peak_second,
            p50_s: percentile(&completion, 0.50),
            p99_s: percentile(&completion, 0.99),
            rejected_429: observed.rejected,
            attempts_after_deadline: observed.after_deadline,
            attempts_after_cancel: observed.after_cancel,
            unfinished,
            outcomes,
            offered_per_s,
            served_per_s,
            rejected_per_s,
            capacity_per_s,
            offered_per_100ms: observed.offered,
            rpcs: coordinator.as_ref().map(|c| RpcSummary::new(c, config)),
            coordinator,
            // Against the bound and the baselines: filled in by the results.
            lost_above_bound: 0,
            lost_above_bound_vs_best_baseline: None,
            utilisation_while_waiting_min: utilisation.iter().copied().min_by(f64::total_cmp),
            utilisation_while_waiting_mean: (!utilisation.is_empty())
                .then(|| utilisation.iter().sum::<f64>() / utilisation.len() as f64),
            utilisation_while_waiting_seconds: utilisation.len(),
            steady_rejections,
            peak_excl_drop_over_capacity_in_force: peak_excl,
            peak_excl_drop_second: peak_excl_second,
            checks: Checks::default(),
            intent_records: in_arrival_order(records),
        }
    }

    /// One line per intent (`--intents-csv`): when it arrived and ended,
    /// in seconds of the run, how it ended, when its caller withdrew it
    /// (empty if it did not), and the worker it arrived at. Which intents a
    /// strategy lost, and when, is what the per-second series cannot show.
    pub fn intents_csv(&self) -> String {
        let mut csv = String::from("arrived_s,ended_s,outcome,cancel_at_s,worker\n");
        for r in &self.intent_records {
            let cancel = r
                .cancel_at
                .map_or(String::new(), |at| format!("{:.3}", at.as_secs_f64()));
            let _ = writeln!(
                csv,
                "{:.3},{:.3},{},{cancel},{}",
                r.arrived.as_secs_f64(),
                r.ended.as_secs_f64(),
                r.outcome.as_str(),
                r.worker
            );
        }
        csv
    }
}

/// `records` sorted by arrival (then end, outcome and cancellation, so two
/// runs that finished their workers in another order compare equal).
fn in_arrival_order(records: &[IntentRecord]) -> Vec<IntentRecord> {
    let mut sorted = records.to_vec();
    sorted.sort_by_key(|r| {
        (
            r.arrived,
            r.ended,
            r.outcome.as_str(),
            r.cancel_at,
            r.worker,
        )
    });
    sorted
}

/// Intents waiting at the start of each second (module doc), from the
/// first second to the one after the last deadline.
fn waiting_per_s(records: &[IntentRecord], config: &StormConfig) -> Vec<u32> {
    let ceil = |d: Duration| d.as_secs() as usize + usize::from(d.subsec_nanos() > 0);
    let mut steps = Vec::new();
    for r in records {
        let gone = r
            .ended
            .min(r.arrived + config.deadline)
            .min(r.cancel_at.unwrap_or(Duration::MAX));
        // Seconds s with arrived ≤ s < gone.
        let (from, to) = (ceil(r.arrived), ceil(gone));
        if from < to {
            if steps.len() <= to {
                steps.resize(to + 1, 0i64);
            }
            steps[from] += 1;
            steps[to] -= 1;
        }
    }
    steps
        .iter()
        .scan(0i64, |n, step| {
            *n += step;
            Some(u32::try_from(*n).unwrap_or(0))
        })
        .collect()
}

/// Which whole seconds each metric counts, from the capacity's changes.
struct Seconds {
    /// Every change of capacity in force: instant (s), before, after.
    steps: Vec<(f64, f64, f64)>,
    capacity: Vec<f64>,
}

impl Seconds {
    fn new(config: &StormConfig) -> Self {
        let steps: Vec<_> = config
            .capacity_steps()
            .into_iter()
            .map(|(at, before, after)| (at.as_secs_f64(), before, after))
            .collect();
        // Far enough for every intent: the last arrival's deadline, plus
        // the settling time.
        let end = (config.duration + config.deadline).as_secs() as usize + 2;
        let capacity = (0..end)
            .map(|i| {
                let from = Duration::from_secs(i as u64);
                config.capacity_earned(from, from + Duration::from_secs(1))
            })
            .collect();
        Seconds { steps, capacity }
    }

    /// Whether second `s` overlaps `[p, p + span)` for a change at `p`
    /// that `which` picks.
    fn near(&self, s: usize, span: f64, which: impl Fn(f64, f64) -> bool) -> bool {
        let s = s as f64;
        self.steps
            .iter()
            .any(|&(p, before, after)| which(before, after) && s + 1.0 > p && s < p + span)
    }

    /// In the first second after a drop of capacity in force.
    fn in_drop(&self, s: usize) -> bool {
        self.near(s, 1.0, |before, after| after < before)
    }

    /// Served ÷ capacity in force over the seconds where work waits.
    fn utilisation(&self, waiting: &[u32], served: &[u32]) -> Vec<f64> {
        (0..self.capacity.len())
            .filter_map(|s| {
                let capacity = self.capacity[s];
                let waits = f64::from(waiting.get(s).copied().unwrap_or(0)) >= capacity;
                let settled = !self.near(s, SETTLE_S, |_, _| true);
                (capacity > 0.0 && waits && settled)
                    .then(|| f64::from(served.get(s).copied().unwrap_or(0)) / capacity)
            })
            .collect()
    }

    /// 429s ÷ attempts over the seconds of steady capacity in force.
    fn steady_rejections(&self, offered: &[u32], rejected: &[u32]) -> Option<f64> {
        let (mut attempts, mut refused) = (0u64, 0u64);
        for (s, (&n, &r)) in offered.iter().zip(rejected).enumerate() {
            let steady = self.capacity.get(s).is_some_and(|&c| c > 0.0)
                && !self.steps.iter().any(|&(p, _, _)| {
                    let s = s as f64;
                    p > s - STEADY_S && p < s + 1.0
                });
            if steady {
                attempts += u64::from(n);
                refused += u64::from(r);
            }
        }
        (attempts > 0).then(|| refused as f64 / attempts as f64)
    }
}

/// Nearest-rank percentile of sorted durations, in seconds.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1)).map(|d| d.as_secs_f64())
}

/// The highest `offered[i] / capacity[i]` over seconds with capacity, and
/// its second.
fn peak_over_capacity(offered: &[u32], capacity: &[f64]) -> (f64, Option<usize>) {
    offered
        .iter()
        .zip(capacity)
        .enumerate()
        .filter(|(_, (_, c))| **c > 0.0)
        .map(|(i, (&n, &c))| (f64::from(n) / c, Some(i)))
        .fold(
            (0.0, None),
            |best, next| if next.0 > best.0 { next } else { best },
        )
}

fn per_second(buckets: &[u32]) -> Vec<u32> {
    buckets
        .chunks(BUCKETS_PER_SECOND)
        .map(|c| c.iter().sum())
        .collect()
}

/// Every strategy's results, with the arguments that produced them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StormResults {
    /// The command's arguments.
    pub args: StormArgs,
    /// The arrival rate actually used (λ).
    pub arrival_rate: f64,
    /// One per strategy, in the order run.
    pub results: Vec<StrategyResult>,
    /// The upstream's limiter.
    pub limiter: LimiterShape,
    /// The clairvoyant bound: no scheduler serves more intents.
    pub bound_served: u64,
    /// Intents the clairvoyant bound loses: intents − `bound_served`.
    pub bound_lost: u64,
    /// Intents a schedule the limiter admits serves: the optimum is at
    /// least this (equal to `bound_served` when the bound is exact).
    pub bound_witnessed: u64,
}

impl StormResults {
    pub(super) fn new(
        args: StormArgs,
        config: &StormConfig,
        mut results: Vec<StrategyResult>,
        bound: Bound,
    ) -> Self {
        let intents = results.first().map_or(0, |r| r.intents);
        let bound_lost = intents.saturating_sub(bound.served);
        let best = results
            .iter()
            .filter(|r| r.strategy.is_baseline())
            .map(|r| r.lost)
            .min();
        for r in &mut results {
            r.lost_vs_best_baseline = best.filter(|&b| b > 0).map(|b| r.lost as f64 / b as f64);
            r.lost_above_bound = r.lost as i64 - bound_lost as i64;
        }
        let best_above = results
            .iter()
            .filter(|r| r.strategy.is_baseline())
            .map(|r| r.lost_above_bound)
            .min();
        for r in &mut results {
            r.lost_above_bound_vs_best_baseline = best_above
                .filter(|&b| b > 0)
                .map(|b| r.lost_above_bound as f64 / b as f64);
            r.checks = Checks::new(r, best_above);
        }
        StormResults {
            args,
            arrival_rate: config.arrival_rate,
            results,
            limiter: config.limiter,
            bound_served: bound.served,
            bound_lost,
            bound_witnessed: bound.witnessed,
        }
    }

    /// The parameters, the tables and the definitions, as markdown.
    pub fn markdown(&self) -> String {
        let mut out = self.parameters();
        out.push_str(
            "| strategy | intents | attempts | amplification | goodput | lost | lost vs best (a–d) \
             | p50 s | p99 s | 429s | peak/capacity in force (1 s) | attempts after deadline \
             | attempts after cancel |\n",
        );
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        let secs = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |s| format!("{s:.2}"));
        for r in &self.results {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.1}% | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.strategy.key(),
                r.intents,
                r.attempts,
                r.amplification,
                r.goodput * 100.0,
                r.lost,
                r.lost_vs_best_baseline
                    .map_or_else(|| "–".to_owned(), |x| format!("{x:.2}×")),
                secs(r.p50_s),
                secs(r.p99_s),
                r.rejected_429,
                match r.peak_second {
                    Some(at) => format!("{:.2} (s {at})", r.peak_over_capacity_in_force),
                    None => "–".to_owned(),
                },
                r.attempts_after_deadline,
                r.attempts_after_cancel,
            );
        }
        self.bound_table(&mut out);
        self.rpc_table(&mut out);
        out.push('\n');
        for r in &self.results {
            let outcomes: Vec<String> =
                r.outcomes.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                out,
                "- **{}**: {}. Outcomes: {}.{}",
                r.strategy.key(),
                r.description,
                outcomes.join(", "),
                if r.unfinished > 0 {
                    format!(" **{} intents unfinished.**", r.unfinished)
                } else {
                    String::new()
                }
            );
        }
        out.push_str(
            "\nAmplification = attempts ÷ intents. Goodput = intents succeeded by their \
             deadline ÷ all intents. Lost = intents not succeeded by their deadline; lost vs \
             best (a–d) = lost ÷ the fewest lost by a per-process baseline in this run. \
             p50/p99: arrival to success, successes only. Peak/capacity in force: the busiest \
             whole second's attempts (served + refused) over the capacity in force in that \
             second; seconds with no capacity (a full outage) are left out. Attempts after \
             deadline/cancel are counted by the upstream against each intent's real deadline \
             and cancellation time. RPCs are counted on the wire in front of the coordinator, \
             per method; the storm runs from the outage's start until the last intent that \
             arrived in it has met its deadline.\n\
             \nBound: the most intents any scheduler could serve on these arrivals, deadlines, \
             cancellations and limiter, never refused (an upper bound, solved exactly); \
             witnessed: what a schedule the limiter really admits serves (the optimum lies \
             between). Lost above bound = lost − the bound's lost; vs best (a–d) = over the \
             least of a per-process baseline. Waiting = arrived, not ended, deadline not \
             passed, not cancelled, at a second's start. Utilisation while waiting = served ÷ \
             capacity in force over the seconds with capacity in force in which at least one \
             second of it is waiting, leaving out the first two seconds after a change of \
             capacity: min / mean. Steady rejections = 429s ÷ attempts over the seconds whose \
             capacity in force (above 0) held for the 10 s before. Peak excl. drop = peak/capacity \
             in force leaving out the first second after a drop in capacity. Checks: peak excl. \
             drop ≤ 1.1, util (min) ≥ 0.9, rej (steady) ≤ 0.01, lost above bound ≤ 0.25 × the \
             best baseline's, amp ≤ 1.3, late = no attempt after deadline or cancel; – where \
             there was nothing to measure.\n",
        );
        out
    }

    /// Each strategy against the clairvoyant bound and the criteria.
    fn bound_table(&self, out: &mut String) {
        let exact = if self.bound_witnessed == self.bound_served {
            "exact".to_owned()
        } else {
            format!(
                "a schedule the limiter admits serves {}",
                self.bound_witnessed
            )
        };
        let _ = write!(
            out,
            "\nAgainst the clairvoyant bound: at most {} intents served, at least {} lost ({exact}).\n\n\
             | strategy | lost | lost above bound | vs best (a–d) | utilisation while waiting \
             min / mean (s) | steady rejections | peak excl. drop (1 s) | checks |\n\
             |---|--:|--:|--:|--:|--:|--:|---|\n",
            self.bound_served, self.bound_lost,
        );
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "–".to_owned());
        for r in &self.results {
            let checks: Vec<String> = r
                .checks
                .named()
                .iter()
                .map(|(name, pass)| {
                    let mark = match pass {
                        Some(true) => "✓",
                        Some(false) => "✗",
                        None => "–",
                    };
                    format!("{name} {mark}")
                })
                .collect();
            let _ =
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.strategy.key(),
                    r.lost,
                    r.lost_above_bound,
                    or_dash(
                        r.lost_above_bound_vs_best_baseline
                            .map(|x| format!("{x:.2}×"))
                    ),
                    or_dash(
                        r.utilisation_while_waiting_min
                            .zip(r.utilisation_while_waiting_mean)
                            .map(|(min, mean)| format!(
                                "{min:.2} / {mean:.2} ({})",
                                r.utilisation_while_waiting_seconds
                            ))
                    ),
                    or_dash(r.steady_rejections.map(|x| format!("{:.2}%", x * 100.0))),
                    or_dash(r.peak_excl_drop_second.map(|at| format!(
                        "{:.2} (s {at})",
                        r.peak_excl_drop_over_capacity_in_force
                    ))),
                    checks.join(", "),
                );
        }
    }

    fn parameters(&self) -> String {
        let a = &self.args;
        let mut out = String::new();
        let _ = write!(
            out,
            "Storm: W={} workers, C={} req/s ({}), λ={} intents/s, outage {}–{} s at {}×C, \
             {}×C after, deadline {} s, 429 cost {}, Retry-After as {}{}, arrivals for {} s, \
             cancel fraction {}",
            a.workers,
            a.capacity,
            self.limiter.describe(),
            self.arrival_rate,
            a.outage_start_s,
            a.outage_start_s + a.outage_s,
            a.outage_capacity,
            a.capacity_after,
            a.deadline_s,
            a.reject_cost,
            match a.hint {
                HintStyle::Delay => "delay-seconds",
                HintStyle::Date => "HTTP-date",
            },
            if a.penalty_extending {
                ", penalty restarted by every 429 in the outage"
            } else {
                ""
            },
            a.duration_s,
            a.cancel_fraction,
        );
        if a.liar_fraction > 0.0 {
            let _ = write!(
                out,
                ", {} of (e)/(f) workers report a 300 s hint on every 429",
                a.liar_fraction
            );
        }
        let _ = writeln!(
            out,
            ", seed {}, {} clock.\n",
            a.seed,
            match a.mode {
                Mode::Paused => "paused (virtual)",
                Mode::Realtime => "real-time",
            },
        );
        out
    }

    /// The coordinated strategies' RPCs, when any ran.
    fn rpc_table(&self, out: &mut String) {
        let rows: Vec<_> = self
            .results
            .iter()
            .filter_map(|r| Some((r.strategy, r.rpcs.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        out.push_str("\nCoordinator RPCs made by the workers:\n\n| strategy | total |");
        for m in METHODS {
            let _ = write!(out, " {m} |");
        }
        out.push_str(" per worker per s, steady | per worker per s, storm |\n|---|--:|");
        out.push_str(&"--:|".repeat(METHODS.len() + 2));
        out.push('\n');
        for (kind, rpcs) in rows {
            let _ = write!(out, "| {} | {} |", kind.key(), rpcs.total);
            for m in METHODS {
                let _ = write!(out, " {} |", rpcs.by_method.get(m).copied().unwrap_or(0));
            }
            let _ = writeln!(
                out,
                " {:.3} | {:.3} |",
                rpcs.steady_per_worker_per_s, rpcs.storm_per_worker_per_s
            );
        }
    }

    /// Everything, as pretty JSON.
    pub fn json(&self) -> String {
        // Plain data only (numbers, strings, maps with string keys): this
        // cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::test_config;

    fn record(arrived: f64, ended: f64, cancel_at: Option<f64>) -> IntentRecord {
        IntentRecord {
            arrived: Duration::from_secs_f64(arrived),
            ended: Duration::from_secs_f64(ended),
            outcome: Outcome::Succeeded,
            cancel_at: cancel_at.map(Duration::from_secs_f64),
            worker: 0,
        }
    }

    #[test]
    fn waiting_counts_at_each_seconds_start_until_the_end_the_deadline_or_the_cancel() {
        let config = test_config(&["--deadline-s", "5"]);
        let records = [
            // Waiting at 1, 2 and 3 s.
            record(0.5, 3.2, None),
            // At 1 s only: cancelled at 2 s is not waiting at 2 s.
            record(1.0, 2.0, Some(2.0)),
            // At 3 to 7 s: its deadline (7.5 s) ends the wait, not its end.
            record(2.5, 9.0, None),
        ];
        assert_eq!(
            waiting_per_s(&records, &config),
            [0, 2, 1, 2, 1, 1, 1, 1, 0]
        );
    }

    /// C = 100, a full outage over 10–20 s, intents for 20 s with 10 s
    /// deadlines: seconds 0 to 31 measured.
    fn outage_seconds() -> Seconds {
        Seconds::new(&test_config(&[
            "--capacity",
            "100",
            "--outage-start-s",
            "10",
            "--outage-s",
            "10",
            "--duration-s",
            "20",
            "--deadline-s",
            "10",
        ]))
    }

    #[test]
    fn only_a_drops_first_second_is_left_out_of_the_peak() {
        let seconds = outage_seconds();
        let dropped: Vec<usize> = (0..40).filter(|&s| seconds.in_drop(s)).collect();
        assert_eq!(dropped, [10], "the capacity comes back at 20 s, not a drop");
    }

    #[test]
    fn utilisation_counts_seconds_where_a_seconds_capacity_waits_after_settling() {
        let seconds = outage_seconds();
        let mut waiting = vec![500; 40];
        waiting[3] = 99;
        let mut served = vec![90; 40];
        served[25] = 50;
        let u = seconds.utilisation(&waiting, &served);
        // 0–2 and 4–9 (3 has less than a second's worth waiting), none in
        // the outage, 20 and 21 settling, 22–31.
        assert_eq!(u.len(), 19);
        assert_eq!(u.iter().copied().fold(f64::INFINITY, f64::min), 0.5);
        let mean = u.iter().sum::<f64>() / u.len() as f64;
        assert!((mean - (18.0 * 0.9 + 0.5) / 19.0).abs() < 1e-12, "{mean}");
    }

    #[test]
    fn steady_rejections_skip_ten_seconds_after_a_change() {
        let seconds = outage_seconds();
        let offered = vec![100; 40];
        let mut rejected = vec![1; 40];
        rejected[5] = 10;
        rejected[25] = 50;
        rejected[30] = 7;
        // Steady: 0–9 and 30–31 (the capacity came back at 20 s): 1200
        // attempts, 9 + 10 + 7 + 1 refused.
        assert_eq!(
            seconds.steady_rejections(&offered, &rejected),
            Some(27.0 / 1200.0)
        );
    }

    #[test]
    fn nearest_rank_percentiles() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(percentile(&d, 0.5), Some(50.0));
        assert_eq!(percentile(&d, 0.99), Some(99.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn the_peak_is_against_the_capacity_in_force_and_skips_zero_capacity() {
        let offered = [900, 5000, 300, 700];
        let capacity = [1000.0, 0.0, 400.0, 1000.0];
        assert_eq!(peak_over_capacity(&offered, &capacity), (0.9, Some(0)));
        let offered = [900, 5000, 500, 700];
        assert_eq!(peak_over_capacity(&offered, &capacity), (1.25, Some(2)));
        assert_eq!(peak_over_capacity(&[], &[]), (0.0, None));
    }
}
