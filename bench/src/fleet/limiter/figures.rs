//! What a run comes to, from nginx's access log and the workers'
//! summaries, and the two runs side by side as markdown.
//!
//! Definitions (also in `docs/benchmarks.md`):
//! - **lost**: intents that did not succeed by their deadline (every
//!   outcome but `succeeded`, and intents a worker gave up on);
//! - **served ÷ R while work waits**: 200s over R × seconds, over the whole
//!   seconds in which intents still arrive at demand × R (so work is always
//!   waiting), second 0 (start-up) and every second touching the outage
//!   left out;
//! - **peak offered ÷ R**: the busiest whole second of requests nginx saw;
//! - **429s ÷ attempts outside the outage**: over the lines the limiter's
//!   configuration answered (the outage's own refusals are not the
//!   fleet's doing);
//! - **attempts after deadline**: lines whose arrival is at or after the
//!   deadline the worker sent with them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::access_log::{Logged, Second};
use super::children::WorkerSummary;
use super::config::Phase;

/// The shape of a run that its figures are judged against.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Window {
    /// R, requests/s.
    pub limit: u32,
    /// How long intents arrive.
    #[serde(serialize_with = "seconds")]
    pub intents_for: Duration,
    /// When the outage starts, from the run's start.
    #[serde(serialize_with = "seconds")]
    pub outage_start: Duration,
    /// How long it lasts.
    #[serde(serialize_with = "seconds")]
    pub outage: Duration,
}

pub(crate) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Window {
    /// Whether whole second `i` overlaps the outage.
    fn touches_outage(&self, i: usize) -> bool {
        let (from, to) = (i as f64, i as f64 + 1.0);
        let start = self.outage_start.as_secs_f64();
        let end = start + self.outage.as_secs_f64();
        self.outage > Duration::ZERO && from < end && to > start
    }

    /// The seconds in which work waits: intents still arriving, past
    /// start-up, clear of the outage.
    fn waiting_seconds(&self) -> impl Iterator<Item = usize> + '_ {
        let arriving = self.intents_for.as_secs() as usize;
        (1..arriving).filter(|&i| !self.touches_outage(i))
    }
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// `coordinated` or `alone`.
    pub decided: &'static str,
    /// Intents the workers started.
    pub intents: u64,
    /// Intents that succeeded by their deadline.
    pub succeeded: u64,
    /// `intents − succeeded`.
    pub lost: u64,
    /// Each worker's share of its intents that succeeded, in the order the
    /// workers were started: the same load through the same coordinator
    /// should be served alike, whichever process it arrives at.
    pub succeeded_share_per_worker: Vec<f64>,
    /// Outcome name → intents, the whole fleet.
    pub outcomes: BTreeMap<String, u64>,
    /// Intents that ended with neither a response nor a gate report.
    pub errors: u64,
    /// Intents a worker abandoned well after their deadline.
    pub unfinished: u64,
    /// Requests nginx logged: every attempt of every intent.
    pub attempts: u64,
    /// Of those, 200.
    pub served: u64,
    /// Of those, 429.
    pub refused: u64,
    /// See the module docs; `None` when no second qualifies.
    pub served_per_limit_while_work_waits: Option<f64>,
    /// How many seconds that is over.
    pub work_waiting_seconds: usize,
    /// The busiest whole second's requests ÷ R.
    pub peak_offered_per_limit: f64,
    /// Which second that was.
    pub peak_second: usize,
    /// 429s ÷ requests, over the limiter configuration's lines.
    pub rejections_per_attempt_outside_outage: Option<f64>,
    /// Requests that arrived at or after their intent's deadline.
    pub attempts_after_deadline: u64,
    /// Attempts by what released them (the workers' `attempts_per_s`),
    /// per second of the workers' clocks, the whole fleet.
    pub released_per_s: BTreeMap<String, Vec<u64>>,
    /// How long each reload took to be in force (outage on, outage off), ms.
    pub reloads_ms: Vec<u64>,
    /// What nginx answered, per second from the run's start.
    pub per_second: Vec<Second>,
}

impl RunFigures {
    /// Computes a run's figures; `start_unix_ms` is second 0.
    pub fn new(
        decided: &'static str,
        window: &Window,
        lines: &[Logged],
        start_unix_ms: i64,
        workers: &[WorkerSummary],
        reloads: &[Duration],
    ) -> RunFigures {
        let mut outcomes = BTreeMap::<String, u64>::new();
        let mut released_per_s = BTreeMap::<String, Vec<u64>>::new();
        for worker in workers {
            for (outcome, n) in &worker.outcomes {
                *outcomes.entry(outcome.clone()).or_default() += n;
            }
            for (by, counts) in &worker.attempts_per_s {
                let sum = released_per_s.entry(by.clone()).or_default();
                if sum.len() < counts.len() {
                    sum.resize(counts.len(), 0);
                }
                for (total, n) in sum.iter_mut().zip(counts) {
                    *total += n;
                }
            }
        }
        let intents = workers.iter().map(|w| w.intents).sum::<u64>();
        let succeeded = outcomes.get("succeeded").copied().unwrap_or(0);
        let per_second = super::access_log::per_second(
            lines,
            start_unix_ms,
            window.intents_for.as_secs() as usize,
        );
        let limit = f64::from(window.limit);
        let waiting: Vec<usize> = window
            .waiting_seconds()
            .filter(|&i| i < per_second.len())
            .collect();
        let served_while_waiting = waiting.iter().map(|&i| per_second[i].served).sum::<u64>();
        let (peak_second, peak) = per_second
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.offered))
            .fold((0, 0), |best, s| if s.1 > best.1 { s } else { best });
        let outside: Vec<&Logged> = lines.iter().filter(|l| l.phase == Phase::Limit).collect();
        let refused_outside = outside.iter().filter(|l| l.status == 429).count();
        let succeeded_share_per_worker = workers
            .iter()
            .map(|w| {
                let ok = w.outcomes.get("succeeded").copied().unwrap_or(0);
                ok as f64 / w.intents.max(1) as f64
            })
            .collect();
        RunFigures {
            decided,
            intents,
            succeeded,
            lost: intents.saturating_sub(succeeded),
            succeeded_share_per_worker,
            outcomes,
            errors: workers.iter().map(|w| w.errors).sum(),
            unfinished: workers.iter().map(|w| w.unfinished).sum(),
            attempts: lines.len() as u64,
            served: lines.iter().filter(|l| l.status == 200).count() as u64,
            refused: lines.iter().filter(|l| l.status == 429).count() as u64,
            served_per_limit_while_work_waits: (!waiting.is_empty())
                .then(|| served_while_waiting as f64 / (limit * waiting.len() as f64)),
            work_waiting_seconds: waiting.len(),
            peak_offered_per_limit: peak as f64 / limit,
            peak_second,
            rejections_per_attempt_outside_outage: (!outside.is_empty())
                .then(|| refused_outside as f64 / outside.len() as f64),
            attempts_after_deadline: lines.iter().filter(|l| l.after_deadline()).count() as u64,
            released_per_s,
            reloads_ms: reloads.iter().map(|d| d.as_millis() as u64).collect(),
            per_second,
        }
    }
}

/// Both runs and how their losses compare.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// What ran: the limiter's directive and the fleet, in a line.
    pub setup: String,
    /// The run's shape.
    pub window: Window,
    /// With `tollgate serve`, then deciding alone.
    pub runs: Vec<RunFigures>,
    /// Coordinated lost ÷ alone lost; `None` when alone lost nothing.
    pub coordinated_lost_per_alone_lost: Option<f64>,
}

impl Comparison {
    /// `runs` in order: coordinated, then alone.
    pub fn new(
        setup: String,
        window: Window,
        coordinated: RunFigures,
        alone: RunFigures,
    ) -> Comparison {
        let ratio = (alone.lost > 0).then(|| coordinated.lost as f64 / alone.lost as f64);
        Comparison {
            setup,
            window,
            runs: vec![coordinated, alone],
            coordinated_lost_per_alone_lost: ratio,
        }
    }

    /// The setup, the summary table, the ratio, and the per-second table.
    pub fn markdown(&self) -> String {
        let ratio = |r: Option<f64>| r.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"));
        let mut md = String::new();
        // Writing into a String cannot fail.
        let mut line = |s: String| {
            let _ = writeln!(md, "{s}");
        };
        line(self.setup.clone());
        line(String::new());
        line(
            "| decided | intents | lost | served ÷ R while work waits | peak offered ÷ R (second) \
             | 429s ÷ attempts outside the outage | attempts after deadline | attempts | 200s | 429s \
             | reloads in force (ms) |"
                .into(),
        );
        line("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|".into());
        for run in &self.runs {
            line(format!(
                "| {} | {} | {} ({:.1}%) | {} | {:.2} ({}) | {} | {} | {} | {} | {} | {} |",
                run.decided,
                run.intents,
                run.lost,
                100.0 * run.lost as f64 / run.intents.max(1) as f64,
                ratio(run.served_per_limit_while_work_waits),
                run.peak_offered_per_limit,
                run.peak_second,
                ratio(run.rejections_per_attempt_outside_outage),
                run.attempts_after_deadline,
                run.attempts,
                run.served,
                run.refused,
                run.reloads_ms
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        line(String::new());
        line(format!(
            "coordinated lost ÷ alone lost: {}",
            ratio(self.coordinated_lost_per_alone_lost)
        ));
        line(String::new());
        for run in &self.runs {
            let outcomes: Vec<String> = run
                .outcomes
                .iter()
                .map(|(outcome, n)| format!("{outcome} {n}"))
                .collect();
            let released: Vec<String> = run
                .released_per_s
                .iter()
                .map(|(by, counts)| format!("{by} {}", counts.iter().sum::<u64>()))
                .collect();
            let shares: Vec<String> = run
                .succeeded_share_per_worker
                .iter()
                .map(|share| format!("{share:.2}"))
                .collect();
            line(format!(
                "- {} outcomes: {}; errors {}, unfinished {}; attempts by what released them: {}; succeeded per worker: {}",
                run.decided,
                outcomes.join(", "),
                run.errors,
                run.unfinished,
                released.join(", "),
                shares.join(", "),
            ));
        }
        line(String::new());
        let names: Vec<&str> = self.runs.iter().map(|r| r.decided).collect();
        let mut head = String::from("| second |");
        for name in &names {
            let _ = write!(head, " {name} offered | served | refused |");
        }
        line(head);
        line(format!("|--:|{}", "--:|--:|--:|".repeat(names.len())));
        let seconds = self
            .runs
            .iter()
            .map(|r| r.per_second.len())
            .max()
            .unwrap_or(0);
        for i in 0..seconds {
            let mark = if self.window.touches_outage(i) {
                " (outage)"
            } else {
                ""
            };
            let mut row = format!("| {i}{mark} |");
            for run in &self.runs {
                let s = run.per_second.get(i).copied().unwrap_or_default();
                let _ = write!(row, " {} | {} | {} |", s.offered, s.served, s.refused);
            }
            line(row);
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window {
            limit: 10,
            intents_for: Duration::from_secs(6),
            outage_start: Duration::from_millis(2500),
            outage: Duration::from_secs(1),
        }
    }

    fn logged(at_ms: i64, status: u16, phase: Phase, deadline: Option<i64>) -> Logged {
        Logged {
            arrived_unix_ms: at_ms,
            status,
            phase,
            deadline_unix_ms: deadline,
        }
    }

    fn worker(intents: u64, succeeded: u64, timed_out: u64) -> WorkerSummary {
        WorkerSummary {
            intents,
            outcomes: [
                ("succeeded".to_owned(), succeeded),
                ("deadline_infeasible".to_owned(), timed_out),
            ]
            .into(),
            errors: 0,
            unfinished: 0,
            attempts_per_s: [
                ("first".to_owned(), vec![intents, 0]),
                ("alone".to_owned(), vec![1]),
            ]
            .into(),
        }
    }

    #[test]
    fn the_waiting_seconds_skip_start_up_and_the_outage() {
        // The outage is 2.5–3.5 s: seconds 2 and 3 touch it.
        assert_eq!(
            window().waiting_seconds().collect::<Vec<_>>(),
            vec![1, 4, 5]
        );
        let none = Window {
            outage: Duration::ZERO,
            ..window()
        };
        assert_eq!(none.waiting_seconds().count(), 5);
    }

    #[test]
    fn figures_from_a_small_log() {
        let mut lines = Vec::new();
        // Second 1: 12 offered, 10 served, 2 refused by the limiter.
        for i in 0..12 {
            let status = if i < 10 { 200 } else { 429 };
            lines.push(logged(1000 + i * 10, status, Phase::Limit, Some(9_000)));
        }
        // Second 3: the outage refuses 30.
        for i in 0..30 {
            lines.push(logged(3000 + i, 429, Phase::Outage, None));
        }
        // Second 4: 5 served, one of them after its deadline.
        for i in 0..5 {
            lines.push(logged(4000 + i, 200, Phase::Limit, Some(4002)));
        }
        let run = RunFigures::new(
            "alone",
            &window(),
            &lines,
            0,
            &[worker(20, 15, 5), worker(10, 10, 0)],
            &[Duration::from_millis(12)],
        );
        assert_eq!((run.intents, run.succeeded, run.lost), (30, 25, 5));
        assert_eq!(run.succeeded_share_per_worker, vec![0.75, 1.0]);
        assert_eq!((run.attempts, run.served, run.refused), (47, 15, 32));
        // Seconds 1, 4, 5 serve 10 + 5 + 0 of 3 × 10.
        assert_eq!(run.work_waiting_seconds, 3);
        assert_eq!(run.served_per_limit_while_work_waits, Some(0.5));
        assert_eq!((run.peak_offered_per_limit, run.peak_second), (3.0, 3));
        assert_eq!(run.rejections_per_attempt_outside_outage, Some(2.0 / 17.0));
        // Arrived at 4002, 4003, 4004 against a deadline of 4002.
        assert_eq!(run.attempts_after_deadline, 3);
        assert_eq!(run.reloads_ms, vec![12]);
        assert_eq!(run.released_per_s["first"], vec![30, 0]);
        assert_eq!(run.released_per_s["alone"], vec![2]);
        assert_eq!(run.per_second.len(), 6);
    }

    #[test]
    fn the_comparison_divides_the_losses_and_prints_both_runs() {
        let run = |decided, lost| {
            RunFigures::new(
                decided,
                &window(),
                &[logged(1000, 200, Phase::Limit, None)],
                0,
                &[worker(10, 10 - lost, lost)],
                &[],
            )
        };
        let both = Comparison::new(
            "the setup".into(),
            window(),
            run("coordinated", 1),
            run("alone", 4),
        );
        assert_eq!(both.coordinated_lost_per_alone_lost, Some(0.25));
        let md = both.markdown();
        assert!(md.starts_with("the setup\n\n| decided |"), "{md}");
        assert!(md.contains("| coordinated | 10 | 1 (10.0%) |"), "{md}");
        assert!(md.contains("| alone | 10 | 4 (40.0%) |"), "{md}");
        assert!(md.contains("coordinated lost ÷ alone lost: 0.25"), "{md}");
        assert!(
            md.contains("released them: alone 1, first 10; succeeded per worker: 0.90"),
            "{md}"
        );
        assert!(md.contains("| 1 | 1 | 1 | 0 | 1 | 1 | 0 |"), "{md}");
        assert!(md.contains("| 2 (outage) |"), "{md}");
        let nothing_lost = Comparison::new(
            String::new(),
            window(),
            run("coordinated", 0),
            run("alone", 0),
        );
        assert_eq!(nothing_lost.coordinated_lost_per_alone_lost, None);
        let json = serde_json::to_value(&both).expect("serializes");
        assert_eq!(json["window"]["outage_start"], 2.5);
        assert_eq!(json["setup"], "the setup");
        assert_eq!(json["runs"][1]["decided"], "alone");
    }
}
