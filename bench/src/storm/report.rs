//! What a storm run measured, and its three renderings: a markdown table, an
//! SVG chart (`chart.rs`: one panel per strategy) and JSON with every series
//! for anyone who wants to plot it differently.
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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use tollgate_client::outcome::Outcome;

use super::limiter::LimiterShape;
use super::pipes::METHODS;
use super::runner::CoordinatorRecord;
use super::strategy::StrategyKind;
use super::upstream::Observed;
use super::{HintStyle, IntentRecord, Mode, StormArgs, StormConfig, StormError};

const BUCKETS_PER_SECOND: usize = 10;

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
            served_per_s: per_second(&observed.served),
            rejected_per_s: per_second(&observed.refused),
            capacity_per_s,
            offered_per_100ms: observed.offered,
            rpcs: coordinator.as_ref().map(|c| RpcSummary::new(c, config)),
            coordinator,
        }
    }
}

/// Nearest-rank percentile of sorted durations, in seconds.
fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
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
pub struct StormReport {
    /// The command's arguments.
    pub args: StormArgs,
    /// The arrival rate actually used (λ).
    pub arrival_rate: f64,
    /// One per strategy, in the order run.
    pub results: Vec<StrategyResult>,
    /// The upstream's limiter.
    pub limiter: LimiterShape,
}

impl StormReport {
    pub(super) fn new(
        args: StormArgs,
        config: &StormConfig,
        mut results: Vec<StrategyResult>,
    ) -> Self {
        let best = results
            .iter()
            .filter(|r| r.strategy.is_baseline())
            .map(|r| r.lost)
            .min();
        for r in &mut results {
            r.lost_vs_best_baseline = best.filter(|&b| b > 0).map(|b| r.lost as f64 / b as f64);
        }
        StormReport {
            args,
            arrival_rate: config.arrival_rate,
            results,
            limiter: config.limiter,
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
             arrived in it has met its deadline.\n",
        );
        out
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

    /// One panel per strategy on a shared time axis, as an SVG document.
    pub fn svg(&self) -> Result<String, StormError> {
        super::chart::svg(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
