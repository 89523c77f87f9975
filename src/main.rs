//! The `tollgate` binary: parses the command line and hands off to the
//! library. Keep it thin — each subcommand lives in a library module.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// Fleet-wide retry budgets.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator (Budget API, health, reflection).
    Serve(tollgate::cli::ServeArgs),
    /// Read and change policies at runtime (Admin API).
    Policy {
        #[command(flatten)]
        connect: tollgate::ops::Connect,
        #[command(subcommand)]
        command: tollgate::ops::PolicyCommand,
    },
    /// List, inspect, freeze, unfreeze and reset scopes (Admin API).
    Scopes {
        #[command(flatten)]
        connect: tollgate::ops::Connect,
        #[command(subcommand)]
        command: tollgate::ops::ScopesCommand,
    },
    /// Show who changed what, newest first (Admin API).
    Audit {
        #[command(flatten)]
        connect: tollgate::ops::Connect,
        /// Records to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Run the retry decision engine on scenario files with a virtual clock.
    Simulate {
        /// Print one JSON result per line instead of a table.
        #[arg(long)]
        json: bool,
        /// Scenario files (one object or an array each); `-` reads stdin.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
    /// Benchmarks: see docs/benchmarks.md.
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// A fleet against an in-process upstream through a rate-limit outage,
    /// one retry strategy at a time on the same arrivals.
    Storm(tollgate::bench::storm::StormArgs),
    /// Lease/Report/Reconsider throughput and latency against a coordinator,
    /// with the same server's health check as the ceiling.
    Rpc(tollgate::bench::rpc::RpcArgs),
    /// Resident memory of the in-memory store with N scopes (live and idle),
    /// or, with `--traffic`, what reaching `max_scopes` does to traffic.
    Memory(tollgate::bench::memory::MemoryArgs),
}

/// Exit status for invalid input, as the scenario README specifies.
const EXIT_INVALID: u8 = 2;

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Serve(args) => {
            tollgate::cli::serve(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { connect, command } => Ok(tollgate::ops::run(
            &connect,
            tollgate::ops::Command::Policy(command),
        )),
        Command::Scopes { connect, command } => Ok(tollgate::ops::run(
            &connect,
            tollgate::ops::Command::Scopes(command),
        )),
        Command::Audit { connect, limit } => Ok(tollgate::ops::run(
            &connect,
            tollgate::ops::Command::Audit { limit },
        )),
        Command::Simulate { json, files } => {
            let all_valid = tollgate::simulate::run(
                &files,
                json,
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            )
            .context("writing simulation results")?;
            Ok(if all_valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_INVALID)
            })
        }
        Command::Bench {
            bench: BenchCommand::Storm(args),
        } => {
            let (_, written) =
                tollgate::bench::storm::run_and_write(&args, &mut std::io::stdout().lock())?;
            for path in written {
                eprintln!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            bench: BenchCommand::Rpc(args),
        } => {
            tollgate::bench::rpc::run(&args, &mut std::io::stdout().lock())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            bench: BenchCommand::Memory(args),
        } => {
            let out = &mut std::io::stdout().lock();
            if args.traffic.is_some() {
                tollgate::bench::memory::run_traffic(&args, out)?;
            } else {
                tollgate::bench::memory::run(&args, out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
