//! `tollgate bench storm` with tiny parameters on a paused clock, so the
//! benchmark cannot rot: every strategy runs, the invariants that must hold
//! in any run hold, the files are written, and one property that a broken
//! strategy or upstream would fail holds too. No timing is asserted.

use std::path::{Path, PathBuf};

use clap::Parser;
use tollgate::bench::storm::{self, StormArgs, StormReport, StrategyKind};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: StormArgs,
}

/// A small fleet through a 3 s outage: a few hundred intents, well under a
/// second of real time in a debug build.
fn tiny(out: &Path, extra: &[&str]) -> StormArgs {
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
    Cli::parse_from(argv).args
}

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tollgate-storm-{name}-{}", std::process::id()))
}

fn result(report: &StormReport, kind: StrategyKind) -> &storm::StrategyResult {
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

    assert_eq!(report.results.len(), 5, "(a)–(e) by default");
    for r in &report.results {
        let key = r.strategy.key();
        assert!(r.intents > 100, "{key}: {} intents", r.intents);
        assert_eq!(
            r.attempts_after_deadline, 0,
            "{key}: attempts after deadline"
        );
        assert_eq!(r.attempts_after_cancel, 0, "{key}: attempts after cancel");
        assert_eq!(r.unfinished, 0, "{key}: unfinished intents");
        assert!(
            r.attempts >= r.intents,
            "{key}: fewer attempts than intents"
        );
        // (a) is over in tens of milliseconds, before most cancellations;
        // the patient strategies wait seconds, so some land mid-intent.
        if r.strategy != StrategyKind::A {
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
    let naive = result(&report, StrategyKind::A);
    let budget = result(&report, StrategyKind::D);
    assert!(
        naive.amplification > budget.amplification,
        "naive {} vs local budget {}",
        naive.amplification,
        budget.amplification
    );
    assert!(naive.rejected_429 > 0, "the outage refused something");
    // (e) runs every retry through the real gate and coordinator: it must
    // serve, and retry less than the naive loop.
    let tollgate = result(&report, StrategyKind::E);
    assert!(tollgate.succeeded_in_deadline > 0, "(e) served nothing");
    assert!(
        naive.amplification > tollgate.amplification,
        "naive {} vs tollgate {}",
        naive.amplification,
        tollgate.amplification
    );

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
