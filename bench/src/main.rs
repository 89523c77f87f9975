//! The `tollgate-bench` binary: the benchmarks that check Tollgate's claims
//! (`docs/benchmarks.md`), and the upstream and worker processes of the
//! chaos fleet test. Not shipped with the coordinator: an operator's
//! `tollgate` holds only what an operator runs.

use clap::{Parser, Subcommand};

/// Benchmarks anyone can re-run to check Tollgate's claims.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate-bench",
    version,
    about,
    after_help = "Examples:
  tollgate-bench storm --workers 500 --out results
  tollgate-bench rpc --duration 10s
  tollgate-bench memory --scopes 100000
  tollgate-bench proxy --duration 5s
  tollgate-bench limiter --limit 200 --burst 20
  tollgate-bench propagation --changes 50"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A fleet against an in-process upstream through a rate-limit outage,
    /// one retry strategy at a time on the same arrivals.
    #[command(after_help = "Examples:
  tollgate-bench storm
  tollgate-bench storm --workers 200 --hint date --strategies a,e --out results
  tollgate-bench storm --limiter sliding-window --window 10 --arrival-rate 1300")]
    Storm(tollgate_bench::storm::StormCommand),
    /// Lease/Report/Reconsider throughput and latency against a coordinator,
    /// with the same server's health check as the ceiling.
    #[command(after_help = "Examples:
  tollgate-bench rpc                               # an in-process coordinator
  tollgate-bench rpc --addr 127.0.0.1:50051 --concurrency 64 --duration 30s")]
    Rpc(tollgate_bench::rpc::RpcArgs),
    /// The latency and CPU `tollgate proxy` adds per request, against a
    /// direct call to the same upstream in the same run.
    #[command(after_help = "Examples:
  tollgate-bench proxy                             # 3 s per phase, 16 tasks, proxy on 1 thread
  tollgate-bench proxy --duration 10s --concurrency 32 --proxy-threads 2")]
    Proxy(tollgate_bench::proxy::ProxyBenchArgs),
    /// Resident memory of the in-memory store with N scopes (live and idle),
    /// or, with `--traffic`, what reaching `max_scopes` does to traffic.
    #[command(after_help = "Examples:
  tollgate-bench memory --scopes 100000
  tollgate-bench memory --traffic 60s --scopes 200000 --max-scopes 50000")]
    Memory(tollgate_bench::memory::MemoryArgs),
    /// A long open-loop run with scope churn: RSS, open file descriptors and
    /// p99 sampled and judged flat (PASS/FAIL; exit status 1 on FAIL).
    #[command(after_help = "Examples:
  tollgate-bench soak                              # 10 minutes at half the measured max
  tollgate-bench soak --duration 3m --rate 2000 --json soak.json")]
    Soak(tollgate_bench::soak::SoakArgs),
    /// The worker fleet against nginx's limit_req through an outage made by
    /// a config reload: with `tollgate serve`, then the same workers alone.
    #[command(after_help = "Examples:
  tollgate-bench limiter                           # R=200/s, B=20, 8 workers, 1.2 × R, outage 10–13 s
  tollgate-bench limiter --limit 500 --burst 50 --workers 16 --out results

Needs nginx (apt-get install nginx-light) and `tollgate` beside this binary
(cargo build --release --bin tollgate).")]
    Limiter(tollgate_bench::fleet::limiter::LimiterArgs),
    /// How long an admin change made through one `tollgate serve` replica
    /// on Redis takes to be in force on the others.
    #[command(after_help = "Examples:
  tollgate-bench propagation                       # 3 replicas, 50 changes, polled every 5 ms
  tollgate-bench propagation --changes 200 --json propagation.json --max-ms 1000

Needs redis-server on PATH and `tollgate` beside this binary
(cargo build --release --bin tollgate).")]
    Propagation(tollgate_bench::propagation::PropagationArgs),
    /// An HTTP/1 upstream stand-in with the storm's capacity model and an
    /// outage, printing its load per second (for bench/tests/chaos_fleet.rs).
    #[command(hide = true)]
    Upstream(tollgate_bench::fleet::upstream::UpstreamArgs),
    /// One worker process sending intents through the gate to an upstream
    /// (for bench/tests/chaos_fleet.rs).
    #[command(hide = true)]
    Worker(tollgate_bench::fleet::worker::WorkerArgs),
}

fn main() -> anyhow::Result<()> {
    let Cli { command } = Cli::parse();
    let stdout = &mut std::io::stdout().lock();
    match command {
        Command::Storm(args) => {
            let (_, written) = tollgate_bench::storm::run_and_write(&args, stdout)?;
            for path in written {
                eprintln!("wrote {}", path.display());
            }
        }
        // The reports are for the smoke tests; the command prints them.
        Command::Rpc(args) => {
            tollgate_bench::rpc::run(&args, stdout)?;
        }
        Command::Proxy(args) => {
            tollgate_bench::proxy::run(&args, stdout)?;
        }
        Command::Memory(args) if args.traffic.is_some() => {
            tollgate_bench::memory::run_traffic(&args, stdout)?;
        }
        Command::Memory(args) => {
            tollgate_bench::memory::run(&args, stdout)?;
        }
        Command::Soak(args) => {
            if !tollgate_bench::soak::run(&args, stdout)?.pass {
                anyhow::bail!("soak: FAIL (see the verdicts above)");
            }
        }
        Command::Limiter(args) => {
            let progress = &mut std::io::stderr();
            let (_, written) = tollgate_bench::fleet::limiter::run(&args, stdout, progress)?;
            for path in written {
                eprintln!("wrote {}", path.display());
            }
        }
        Command::Propagation(args) => {
            let report = tollgate_bench::propagation::run(&args, stdout)?;
            if let Some(max) = args.max_ms
                && report.all.max_ms > max
            {
                anyhow::bail!(
                    "propagation: a change took {:.1} ms to reach a replica, over --max-ms {max}",
                    report.all.max_ms
                );
            }
        }
        Command::Upstream(args) => tollgate_bench::fleet::upstream::run(&args, stdout)?,
        Command::Worker(args) => tollgate_bench::fleet::worker::run(&args, stdout)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Clap's own consistency checks over the whole tree.
    #[test]
    fn the_command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// Every example in every `--help` parses as the benchmark it is shown
    /// under.
    #[test]
    fn every_help_example_runs_the_command_it_is_shown_under() {
        tollgate_testkit::help::check_examples(super::Cli::command());
    }

    /// Every benchmark a reader runs shows how, in its help.
    #[test]
    fn every_benchmark_help_has_examples() {
        let cli = super::Cli::command();
        for name in [
            "storm",
            "rpc",
            "memory",
            "soak",
            "limiter",
            "proxy",
            "propagation",
        ] {
            let command = cli.find_subcommand(name).expect(name);
            let after = command.get_after_help().map(ToString::to_string);
            assert!(
                after
                    .as_deref()
                    .is_some_and(|h| h.contains("Examples:\n  tollgate-bench")),
                "{name} has no examples: {after:?}"
            );
        }
    }
}
