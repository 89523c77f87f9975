//! The `tollgate` command line: parses arguments and hands off to the library.

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
}

/// Exit status for invalid input, as the scenario README specifies.
const EXIT_INVALID: u8 = 2;

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
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
    }
}
