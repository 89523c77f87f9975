//! What a storm run measured, and its three renderings: a markdown table, an
//! SVG chart of the upstream's offered load over time, and JSON with every
//! series for anyone who wants to plot it differently.
//!
//! Definitions (also printed under the table):
//! - offered load: attempts reaching the upstream, per 100 ms and per 1 s;
//! - peak/C: the highest load in any 1 s window (sliding in 100 ms steps)
//!   that starts at or after the outage's end, over capacity;
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

use plotters::prelude::*;
use serde::Serialize;
use tollgate_client::outcome::Outcome;

use super::strategy::StrategyKind;
use super::upstream::{BUCKET, Observed};
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
    /// Peak 1 s offered load after the outage, over capacity.
    pub recovery_peak_over_capacity: f64,
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
}

impl StrategyResult {
    pub(super) fn new(
        strategy: StrategyKind,
        description: String,
        config: &StormConfig,
        intents: u64,
        records: &[IntentRecord],
        unfinished: u64,
        observed: Observed,
    ) -> Self {
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
        let recovery_from =
            usize::try_from(config.outage_end.as_nanos().div_ceil(BUCKET.as_nanos()))
                .unwrap_or(usize::MAX);
        StrategyResult {
            strategy,
            description,
            intents,
            attempts,
            amplification: ratio(attempts),
            succeeded_in_deadline: completion.len() as u64,
            goodput: ratio(completion.len() as u64),
            p50_s: percentile(&completion, 0.50),
            p99_s: percentile(&completion, 0.99),
            rejected_429: observed.rejected,
            recovery_peak_over_capacity: peak_window(&observed.offered, recovery_from) as f64
                / config.capacity,
            attempts_after_deadline: observed.after_deadline,
            attempts_after_cancel: observed.after_cancel,
            unfinished,
            outcomes,
            offered_per_s: per_second(&observed.offered),
            served_per_s: per_second(&observed.served),
            offered_per_100ms: observed.offered,
        }
    }
}

/// Nearest-rank percentile of sorted durations, in seconds.
fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1)).map(|d| d.as_secs_f64())
}

/// The largest sum of 10 consecutive 100 ms buckets starting at or after
/// `from`; a window running past the end counts what there is.
fn peak_window(buckets: &[u32], from: usize) -> u64 {
    (from..buckets.len())
        .map(|i| {
            buckets[i..buckets.len().min(i + BUCKETS_PER_SECOND)]
                .iter()
                .map(|&n| u64::from(n))
                .sum()
        })
        .max()
        .unwrap_or(0)
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
}

impl StormReport {
    pub(super) fn new(args: StormArgs, config: &StormConfig, results: Vec<StrategyResult>) -> Self {
        StormReport {
            args,
            arrival_rate: config.arrival_rate,
            results,
        }
    }

    /// The parameters, the table and the definitions, as markdown.
    pub fn markdown(&self) -> String {
        let a = &self.args;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Storm: W={} workers, C={} req/s, λ={} intents/s, outage {}–{} s, \
             deadline {} s, 429 cost {}, Retry-After as {}, arrivals for {} s, \
             cancel fraction {}, seed {}, {} clock.\n",
            a.workers,
            a.capacity,
            self.arrival_rate,
            a.outage_start_s,
            a.outage_start_s + a.outage_s,
            a.deadline_s,
            a.reject_cost,
            match a.hint {
                HintStyle::Delay => "delay-seconds",
                HintStyle::Date => "HTTP-date",
            },
            a.duration_s,
            a.cancel_fraction,
            a.seed,
            match a.mode {
                Mode::Paused => "paused (virtual)",
                Mode::Realtime => "real-time",
            },
        );
        out.push_str(
            "| strategy | intents | attempts | amplification | goodput | p50 s | p99 s \
             | 429s | peak/C after outage (1 s) | attempts after deadline | attempts after cancel |\n",
        );
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        let secs = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |s| format!("{s:.2}"));
        for r in &self.results {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.1}% | {} | {} | {} | {:.2} | {} | {} |",
                r.strategy.key(),
                r.intents,
                r.attempts,
                r.amplification,
                r.goodput * 100.0,
                secs(r.p50_s),
                secs(r.p99_s),
                r.rejected_429,
                r.recovery_peak_over_capacity,
                r.attempts_after_deadline,
                r.attempts_after_cancel,
            );
        }
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
             deadline ÷ all intents. p50/p99: arrival to success, successes only. \
             Peak/C: the busiest 1 s window (100 ms steps) starting after the outage, \
             over capacity. Attempts after deadline/cancel are counted by the upstream \
             against each intent's real deadline and cancellation time.\n",
        );
        out
    }

    /// Everything, as pretty JSON.
    pub fn json(&self) -> String {
        // Plain data only (numbers, strings, maps with string keys): this
        // cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The offered load per 100 ms of every strategy over time, with the
    /// upstream's capacity, as an SVG document.
    pub fn svg(&self) -> Result<String, StormError> {
        let chart_err = |e: &dyn std::fmt::Display| StormError::Chart(e.to_string());
        let rate = |n: u32| f64::from(n) * BUCKETS_PER_SECOND as f64;
        let buckets = self
            .results
            .iter()
            .map(|r| r.offered_per_100ms.len())
            .max()
            .unwrap_or(0);
        let x_max = (buckets as f64 * BUCKET.as_secs_f64()).max(1.0);
        let y_max = self
            .results
            .iter()
            .flat_map(|r| r.offered_per_100ms.iter().map(|&n| rate(n)))
            .fold(self.args.capacity, f64::max)
            * 1.05;
        let outage = (
            self.args.outage_start_s,
            self.args.outage_start_s + self.args.outage_s,
        );
        let capacity = self.args.capacity;

        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1100, 560)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| chart_err(&e))?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!(
                        "Upstream offered load (100 ms bins), W={} C={}/s λ={}/s, outage {}–{} s",
                        self.args.workers, capacity, self.arrival_rate, outage.0, outage.1
                    ),
                    ("sans-serif", 18),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(|e| chart_err(&e))?;
            chart
                .configure_mesh()
                .x_desc("time since start (s)")
                .y_desc("attempts per second")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(|e| chart_err(&e))?;
            // Capacity: C, zero during the outage.
            let capacity_line = vec![
                (0.0, capacity),
                (outage.0, capacity),
                (outage.0, 0.0),
                (outage.1, 0.0),
                (outage.1, capacity),
                (x_max, capacity),
            ];
            chart
                .draw_series(LineSeries::new(capacity_line, BLACK.stroke_width(2)))
                .map_err(|e| chart_err(&e))?
                .label("capacity C")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
            for (k, r) in self.results.iter().enumerate() {
                let colour = Palette99::pick(k).to_rgba();
                let points = r
                    .offered_per_100ms
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| (i as f64 * BUCKET.as_secs_f64(), rate(n)));
                chart
                    .draw_series(LineSeries::new(points, colour.stroke_width(1)))
                    .map_err(|e| chart_err(&e))?
                    .label(format!("({}) {}", r.strategy.key(), r.strategy.label()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| chart_err(&e))?;
            root.present().map_err(|e| chart_err(&e))?;
        }
        Ok(svg)
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
    fn peak_window_starts_at_the_given_bucket() {
        let mut buckets = vec![100; 10];
        buckets.extend([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(
            peak_window(&buckets, 10),
            2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11
        );
        assert_eq!(peak_window(&buckets, 0), 1000);
        assert_eq!(peak_window(&buckets, 99), 0);
    }
}
