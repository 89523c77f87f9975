//! `tollgate-bench storm` with tiny parameters on a paused clock, so the
//! benchmark cannot rot: every strategy runs, the invariants that must hold
//! in any run hold, the files are written, and one property that a broken
//! strategy or upstream would fail holds too. No timing is asserted.

use std::path::{Path, PathBuf};

use clap::Parser;
use tollgate_bench::storm::{self, StormCommand, StormResults, StrategyKind};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    command: StormCommand,
}

/// A small fleet through a 3 s outage: a few hundred intents, seconds of
/// real time per strategy in a debug build (the coordinated ones dominate).
fn tiny(out: &Path, extra: &[&str]) -> StormCommand {
    let mut argv = vec![
        "storm",
        "--workers",
        "20",
        "--capacity",
        "100",
        "--outage-start-s",
        "2",
        "--outage-s",
        "3",
        "--duration-s",
        "6",
        "--deadline-s",
        "6",
        "--seed",
        "7",
        "--mode",
        "paused",
        "--out",
    ];
    argv.push(out.to_str().expect("temp paths are UTF-8 here"));
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).command
}

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tollgate-storm-{name}-{}", std::process::id()))
}

fn result(report: &StormResults, kind: StrategyKind) -> &storm::StrategyResult {
    report
        .results
        .iter()
        .find(|r| r.strategy == kind)
        .unwrap_or_else(|| panic!("no result for {kind:?}"))
}

#[test]
fn every_strategy_runs_and_keeps_the_invariants() {
    let out = out_dir("smoke");
    let args = tiny(&out, &[]);
    let mut stdout = Vec::new();
    let (report, written) = storm::run_and_write(&args, &mut stdout).expect("the storm runs");
    let table = String::from_utf8(stdout).expect("UTF-8 table");

    assert_eq!(report.results.len(), 6, "(a)–(f) by default");
    for r in &report.results {
        let key = r.strategy.key();
        assert!(r.intents > 100, "{key}: {} intents", r.intents);
        assert_eq!(
            r.attempts_after_deadline, 0,
            "{key}: attempts after deadline"
        );
        assert_eq!(r.attempts_after_cancel, 0, "{key}: attempts after cancel");
        assert_eq!(r.unfinished, 0, "{key}: unfinished intents");
        // Every intent makes a first attempt, except one the coordinated
        // gate held inside a known cooldown that then ran out of time or
        // was cancelled before its slot.
        let unattempted = match r.strategy {
            StrategyKind::Tollgate | StrategyKind::TollgateTold => {
                ["deadline_infeasible", "cancelled"]
                    .iter()
                    .map(|o| r.outcomes.get(o).copied().unwrap_or(0))
                    .sum()
            }
            _ => 0,
        };
        assert!(
            r.attempts + unattempted >= r.intents,
            "{key}: fewer attempts than intents that could have made one"
        );
        // (a) is over in tens of milliseconds, before most cancellations;
        // the patient strategies wait seconds, so some land mid-intent.
        if r.strategy != StrategyKind::Naive {
            assert!(
                r.outcomes.get("cancelled").copied().unwrap_or(0) > 0,
                "{key}: cancellation was exercised"
            );
        }
        let row = format!("| {key} | {} | {} |", r.intents, r.attempts);
        assert!(table.contains(&row), "{key}: no row {row:?} in\n{table}");
    }

    // The sanity property: retrying at once ignores the outage, a local
    // budget caps retries at a fraction of first attempts (plus a floor),
    // so the budget amplifies less. A strategy that stopped retrying, or
    // an upstream that stopped refusing, would fail this.
    let naive = result(&report, StrategyKind::Naive);
    let budget = result(&report, StrategyKind::LocalBudget);
    assert!(
        naive.amplification > budget.amplification,
        "naive {} vs local budget {}",
        naive.amplification,
        budget.amplification
    );
    assert!(naive.rejected_429 > 0, "the outage refused something");
    // (e) and (f) run every retry through the real gate and coordinator:
    // they must serve, retry less than the naive loop, and their workers'
    // RPCs and the coordinator's view of the scope must have been recorded.
    for kind in [StrategyKind::Tollgate, StrategyKind::TollgateTold] {
        let tollgate = result(&report, kind);
        assert!(
            tollgate.succeeded_in_deadline > 0,
            "{kind:?} served nothing"
        );
        assert!(
            naive.amplification > tollgate.amplification,
            "naive {} vs {kind:?} {}",
            naive.amplification,
            tollgate.amplification
        );
        let rpcs = tollgate.rpcs.as_ref().expect("coordinated RPCs counted");
        // Not Lease: a fleet that held its first attempts through the
        // outage may need no retry token at all.
        for method in ["Report", "Reconsider", "Watch"] {
            assert!(rpcs.by_method[method] > 0, "{kind:?}: no {method} counted");
        }
        assert!(rpcs.steady_per_worker_per_s > 0.0, "{kind:?}: {rpcs:?}");
        let scope = &tollgate.coordinator.as_ref().expect("sampled").scope_per_s;
        let seconds = scope["slot_backlog"].len();
        assert!(seconds >= 6, "{kind:?}: {seconds} samples");
        assert!(
            scope["cooldown_left_s"].iter().flatten().any(|&c| c > 0.0),
            "{kind:?}: the outage's hints set a cooldown"
        );
    }
    // (e) runs the shipped defaults: the wake rate is learned (it moves,
    // never below the floor of min_retries_per_sec, 10/s) and a capacity
    // estimate is sampled.
    let scope = &result(&report, StrategyKind::Tollgate)
        .coordinator
        .as_ref()
        .expect("sampled")
        .scope_per_s;
    let wake: Vec<f64> = scope["wake_rate_per_s"].iter().flatten().copied().collect();
    assert!(wake.iter().all(|&w| w >= 10.0), "{wake:?}");
    assert!(
        wake.iter().any(|&w| w != wake[0]),
        "learned, so it moves: {wake:?}"
    );
    assert!(
        scope["capacity_per_s"].iter().flatten().any(|&c| c > 0.0),
        "{:?}",
        scope["capacity_per_s"]
    );
    // (f) is told C − λ = 100 − 80.
    let scope = &result(&report, StrategyKind::TollgateTold)
        .coordinator
        .as_ref()
        .expect("sampled")
        .scope_per_s;
    let wake: Vec<f64> = scope["wake_rate_per_s"].iter().flatten().copied().collect();
    assert!(
        !wake.is_empty() && wake.iter().all(|&w| w == 20.0),
        "{wake:?}"
    );
    // Baselines have no coordinator; the lost ratio is against the best of them.
    let best = report
        .results
        .iter()
        .filter(|r| r.strategy.is_baseline())
        .map(|r| r.lost)
        .min()
        .expect("baselines ran");
    for r in &report.results {
        assert_eq!(r.coordinator.is_some(), r.strategy.is_coordinated());
        if best > 0 {
            let expected = r.lost as f64 / best as f64;
            assert_eq!(r.lost_vs_best_baseline, Some(expected), "{:?}", r.strategy);
        }
    }

    let names: Vec<_> = written
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["storm.md", "storm.svg", "storm.json"]);
    let svg = std::fs::read_to_string(out.join("storm.svg")).expect("the chart was written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    let md = std::fs::read_to_string(out.join("storm.md")).expect("the table was written");
    assert_eq!(md, table);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_paused_run_repeats_exactly_and_date_hints_work() {
    let out = out_dir("repeat");
    let args = tiny(&out, &["--hint", "date", "--strategies", "b,c,e"]);
    let first = storm::run(&args).expect("the storm runs");
    let second = storm::run(&args).expect("the storm runs");
    assert_eq!(
        first, second,
        "same seed, same paused run, the coordinator's (e) included"
    );
    for r in &first.results {
        assert_eq!(r.attempts_after_deadline, 0);
        assert_eq!(r.attempts_after_cancel, 0);
        assert!(
            r.succeeded_in_deadline > 0,
            "{:?} served nothing",
            r.strategy
        );
    }
}

/// Every upstream and reporter variation in one run: a brownout at 0.4 × C
/// that restarts its penalty on every 429, 0.6 × C after it, a quarter of
/// the coordinated workers lying, and (e) under an explicit policy file.
#[test]
fn brownout_penalty_liars_and_an_explicit_policy() {
    let out = out_dir("variations");
    std::fs::create_dir_all(&out).expect("temp dir");
    let policy = out.join("e-policy.toml");
    std::fs::write(&policy, "[defaults]\nwake_rate = 7\n").expect("policy written");
    let args = tiny(
        &out,
        &[
            "--outage-capacity",
            "0.4",
            "--capacity-after",
            "0.6",
            "--penalty-extending",
            "--liar-fraction",
            "0.25",
            "--e-policy",
            policy.to_str().expect("UTF-8 path"),
            "--strategies",
            "a,b,e",
        ],
    );
    let report = storm::run(&args).expect("the storm runs");
    for r in &report.results {
        let key = r.strategy.key();
        assert_eq!(r.attempts_after_deadline, 0, "{key}: after deadline");
        assert_eq!(r.attempts_after_cancel, 0, "{key}: after cancel");
        assert_eq!(r.unfinished, 0, "{key}: unfinished");
        // Capacity in force: C, then 0.4 × C in the brownout (2–5 s), then
        // 0.6 × C.
        assert_eq!(r.capacity_per_s[1], 100.0, "{key}");
        assert_eq!(r.capacity_per_s[3], 40.0, "{key}");
        assert_eq!(r.capacity_per_s[5], 60.0, "{key}");
        // A brownout serves, unless a flood's rejection work eats it all,
        // which is what (a)'s does, or the strategy honours a penalty that
        // every attempt would extend: (e) holds first attempts and retries
        // alike while the fleet's cooldown says the route is closed.
        match r.strategy {
            StrategyKind::Naive => {}
            StrategyKind::Tollgate => assert_eq!(
                r.offered_per_s[3..5].iter().sum::<u32>(),
                0,
                "{key}: attempts inside the penalty {:?}",
                r.offered_per_s
            ),
            _ => assert!(
                r.served_per_s[3] > 0,
                "{key}: nothing served in the brownout"
            ),
        }
    }
    // (b) sleeps exactly the hint. A restarted penalty asks for the time
    // left plus a whole outage, so every retry after a 429 in the brownout
    // lands after it (at 8 s or later): in its last two seconds (b) offers
    // only first attempts, fewer than when the brownout answers 1 s hints.
    let brownout_load = |extra: &[&str]| {
        let mut argv = vec!["--outage-capacity", "0.4", "--strategies", "b"];
        argv.extend_from_slice(extra);
        let report = storm::run(&tiny(&out, &argv)).expect("the storm runs");
        report.results[0].offered_per_s[3..5].iter().sum::<u32>()
    };
    let (restarted, plain) = (brownout_load(&["--penalty-extending"]), brownout_load(&[]));
    assert!(
        restarted < plain,
        "penalty restarted {restarted} vs not {plain}"
    );
    let tollgate = result(&report, StrategyKind::Tollgate);
    assert!(
        tollgate
            .description
            .contains("5 workers report a 300 s hint"),
        "{}",
        tollgate.description
    );
    let scope = &tollgate.coordinator.as_ref().expect("sampled").scope_per_s;
    assert!(
        scope["wake_rate_per_s"].iter().flatten().all(|&w| w == 7.0),
        "--e-policy read: {:?}",
        scope["wake_rate_per_s"]
    );
    // The liars' 300 s hints reach the coordinator: no true hint asks for
    // more than 6 s. Above, (e) holds every attempt inside the outage's
    // cooldown, so the liars see few 429s to lie about; with first attempts
    // let through they see many.
    let sending = out.join("e-sending.toml");
    std::fs::write(&sending, "[defaults]\nhold_first_attempts = false\n").expect("written");
    let argv = [
        "--outage-capacity",
        "0.4",
        "--liar-fraction",
        "0.25",
        "--e-policy",
        sending.to_str().expect("UTF-8 path"),
        "--strategies",
        "e",
    ];
    let liars = storm::run(&tiny(&out, &argv)).expect("the storm runs");
    let scope = &liars.results[0]
        .coordinator
        .as_ref()
        .expect("sampled")
        .scope_per_s;
    assert!(
        scope["cooldown_left_s"].iter().flatten().any(|&c| c > 60.0),
        "{:?}",
        scope["cooldown_left_s"]
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// What must hold in any run, whatever its shape: no late attempt, every
/// intent ended, and the bound's columns add up.
fn keeps_the_invariants_and_the_bound(report: &StormResults) {
    assert!(report.bound_witnessed <= report.bound_served);
    for r in &report.results {
        let key = r.strategy.key();
        assert_eq!(r.attempts_after_deadline, 0, "{key}: after deadline");
        assert_eq!(r.attempts_after_cancel, 0, "{key}: after cancel");
        assert_eq!(r.unfinished, 0, "{key}: unfinished");
        assert_eq!(report.bound_served + report.bound_lost, r.intents, "{key}");
        assert_eq!(
            r.lost_above_bound,
            r.lost as i64 - report.bound_lost as i64,
            "{key}"
        );
        // No strategy serves more than the most any scheduler could.
        assert!(r.lost_above_bound >= 0, "{key}: {}", r.lost_above_bound);
        assert!(r.checks.no_late_attempts, "{key}");
        assert_eq!(r.checks.amplification, r.amplification <= 1.3, "{key}");
    }
}

/// Demand above capacity for the whole run (λ = 1.3 × C): accepted, and
/// first attempts alone overflow the upstream, before the outage as after.
#[test]
fn demand_above_capacity_for_the_whole_run() {
    let out = out_dir("overload");
    let args = tiny(&out, &["--arrival-rate", "130", "--strategies", "a,c,e,f"]);
    let report = storm::run(&args).expect("λ above C is a run, not an error");
    assert_eq!(report.arrival_rate, 130.0);
    keeps_the_invariants_and_the_bound(&report);
    for r in &report.results {
        let key = r.strategy.key();
        assert!(r.succeeded_in_deadline > 0, "{key} served nothing");
        if r.strategy.is_baseline() {
            // At λ = 0.8 × C nothing is refused before the outage (the
            // upstream's 100 ms burst absorbs Poisson clumps); here first
            // attempts alone are refused from the start.
            assert!(r.rejected_per_s[..2].iter().sum::<u32>() > 0, "{key}");
            assert!(r.steady_rejections.is_some_and(|x| x > 0.0), "{key}");
        }
    }
    // (f) is told C − λ, below 0 here: its wake rate floors at 1 slot/s.
    let told = result(&report, StrategyKind::TollgateTold);
    assert!(
        told.description.contains("wake rate: 1 slots/s"),
        "{}",
        told.description
    );
}

#[test]
fn every_limiter_shape_runs_and_bad_shapes_are_refused() {
    let out = out_dir("shapes");
    for (words, shape) in [
        (
            &["--limiter", "fixed-window", "--window", "1"][..],
            "fixed window of 1 s",
        ),
        (
            &["--limiter", "sliding-window", "--window", "2"],
            "sliding window of 2 s",
        ),
        (&["--burst", "1"], "token bucket, burst 1 s"),
    ] {
        let args = tiny(&out, &[words, &["--strategies", "b,d"]].concat());
        let report = storm::run(&args).expect("the storm runs");
        assert!(report.markdown().contains(shape), "{shape}");
        keeps_the_invariants_and_the_bound(&report);
        for r in &report.results {
            assert!(r.succeeded_in_deadline > 0, "{shape}: {:?}", r.strategy);
        }
    }
    let refused = |extra: &[&str]| match storm::run(&tiny(&out, extra)) {
        Err(err) => err.to_string(),
        Ok(_) => panic!("{extra:?} was accepted"),
    };
    assert_eq!(
        refused(&["--limiter", "fixed-window", "--burst", "1"]),
        "--burst: applies to the token bucket"
    );
    assert_eq!(
        refused(&["--window", "1"]),
        "--window: applies to the window limiters"
    );
    // 100/s over 5 ms is half a request.
    assert_eq!(
        refused(&["--limiter", "sliding-window", "--window", "0.005"]),
        "--window: must hold at least one request at every capacity in force above 0"
    );
}

#[test]
fn intents_csv_holds_every_intent_of_every_strategy() {
    let out = out_dir("intents");
    let args = tiny(&out, &["--strategies", "b,e", "--intents-csv"]);
    let mut table = Vec::new();
    let (report, written) = storm::run_and_write(&args, &mut table).expect("the storm runs");
    let names: Vec<_> = written
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        [
            "storm.md",
            "storm.svg",
            "storm.json",
            "intents-b.csv",
            "intents-e.csv"
        ]
    );
    for r in &report.results {
        let path = out.join(format!("intents-{}.csv", r.strategy.key()));
        let csv = std::fs::read_to_string(&path).expect("the intents were written");
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("arrived_s,ended_s,outcome,cancel_at_s,worker")
        );
        // Every finished intent once, its outcome as the table counts it,
        // in arrival order, never ending before it arrived, at one of the
        // 20 workers (and at more than one).
        let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
        let mut last_arrival = 0.0;
        let mut rows = 0;
        let mut workers = std::collections::BTreeSet::new();
        for line in lines {
            let fields: Vec<&str> = line.split(',').collect();
            assert_eq!(fields.len(), 5, "{line}");
            let worker: usize = fields[4].parse().expect("worker");
            assert!(worker < 20, "{line}");
            workers.insert(worker);
            let arrived: f64 = fields[0].parse().expect("arrival");
            let ended: f64 = fields[1].parse().expect("end");
            assert!(arrived >= last_arrival && ended >= arrived, "{line}");
            last_arrival = arrived;
            *outcomes.entry(fields[2].to_owned()).or_default() += 1;
            rows += 1;
        }
        assert_eq!(rows, r.intents - r.unfinished, "{:?}", r.strategy);
        assert!(workers.len() > 1, "{workers:?}");
        let counted: std::collections::BTreeMap<String, u64> = r
            .outcomes
            .iter()
            .map(|(k, n)| ((*k).to_owned(), *n))
            .collect();
        assert_eq!(outcomes, counted, "{:?}", r.strategy);
    }
    let _ = std::fs::remove_dir_all(&out);
}
