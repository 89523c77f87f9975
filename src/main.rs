//! The `tollgate` binary: parses the command line and hands off to
//! [`tollgate::cli`]. Keep it thin — each subcommand lives in the library.

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => tollgate::cli::serve(args),
    }
}
