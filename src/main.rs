//! The `tollgate` binary: parses the command line and hands off to the
//! library. Keep it thin — each subcommand lives in a library module; what
//! is here is the command tree itself (so completions and man pages are
//! generated from the same definition that parses).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};
use tollgate::ops::{self, Connect, Output};

/// Fleet-wide retry budgets.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about,
    after_help = "Examples:
  tollgate serve --config policy.toml
  tollgate -o json policy list
  tollgate scopes show tenant-a 'GET /users/{id}'
  tollgate simulate examples/scenarios/schedule-a.json

The connection and output flags (--server, --token, -o) go before or after
the subcommand. Exit codes: 0 done, 1 failure, 2 invalid input, 3 coordinator
unreachable, 4 not allowed, 5 no such rule, 6 conflict, 7 policy drift."
)]
struct Cli {
    #[command(flatten)]
    connect: Connect,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator (Budget API, health, reflection).
    #[command(after_help = "Examples:
  tollgate serve                                   # 127.0.0.1:50051, in memory, open dev mode
  tollgate serve --listen 0.0.0.0:50051 --config policy.toml
  TOLLGATE_STORE=redis://redis:6379 tollgate serve --config policy.toml")]
    Serve(tollgate::serve_command::ServeArgs),
    /// Run the sidecar proxy: a local listener per upstream, every request
    /// run through the gate (docs/proxy.md).
    #[command(after_help = "Examples:
  tollgate proxy --config proxy.toml
  tollgate proxy --config proxy.toml --check      # validate the file and exit")]
    Proxy(tollgate::proxy::ProxyArgs),
    /// Read and change policies at runtime (Admin API).
    #[command(after_help = "Examples:
  tollgate policy list
  tollgate policy set 'GET /users/*' retry_ratio=0.05 --reason INC-123
  tollgate policy diff")]
    Policy {
        #[command(subcommand)]
        command: ops::PolicyCommand,
    },
    /// List, inspect, freeze, unfreeze and reset scopes (Admin API).
    #[command(after_help = "Examples:
  tollgate scopes list --caller-scope 'tenant-a*'
  tollgate scopes freeze tenant-a 'GET /users/{id}' --reason 'upstream down' --for 15m")]
    Scopes {
        #[command(subcommand)]
        command: ops::ScopesCommand,
    },
    /// Show who changed what, newest first (Admin API).
    #[command(after_help = "Examples:
  tollgate audit --limit 20
  tollgate audit -o json")]
    Audit {
        /// Records to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Watch the hottest scopes live: rejections, cooldowns, budgets,
    /// backlog, freezes; freeze from the screen (Admin API).
    #[command(after_help = "Examples:
  tollgate top
  tollgate top --caller-scope 'tenant-a*' --interval 2s
  tollgate top --once --width 120 > frame.txt

Keys: q quit, j/k move, r/c/b/n sort by rejections/cooldown/backlog/name,
/ filter, f then y freeze the selected scope (asks for a reason).")]
    Top(ops::top::TopArgs),
    /// Run the retry decision engine on scenario files with a virtual clock.
    #[command(after_help = "Examples:
  tollgate simulate examples/scenarios/schedule-a.json
  tollgate simulate -o json examples/scenarios/*.json
  cat scenario.json | tollgate simulate -")]
    Simulate {
        /// Print one JSON result per line instead of a table (the same as
        /// `-o json`).
        #[arg(long)]
        json: bool,
        /// Scenario files (one object or an array each); `-` reads stdin.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
    /// Print a shell completion script to stdout.
    #[command(after_help = "Examples:
  tollgate completions bash > /etc/bash_completion.d/tollgate
  tollgate completions zsh > \"${fpath[1]}/_tollgate\"
  tollgate completions fish > ~/.config/fish/completions/tollgate.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write one man page per command (`tollgate.1`, `tollgate-policy-set.1`, …)
    /// into a directory.
    #[command(after_help = "Examples:
  tollgate man /usr/local/share/man/man1
  tollgate man target/man && man -l target/man/tollgate-scopes-freeze.1")]
    Man {
        /// The directory (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// An error and its causes as one line, `context: error: cause`, each
/// cause written once: an error whose message already quotes its source
/// (`parsing policy file: <the TOML error>`) is not followed by it again.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn main() -> anyhow::Result<ExitCode> {
    let Cli { connect, command } = Cli::parse();
    match command {
        Command::Serve(args) => match tollgate::serve_command::serve(args) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            // One line an operator reads in a pod's log, not a chain dump.
            Err(err) => {
                eprintln!("tollgate serve: {}", one_line(&err));
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Proxy(args) => match tollgate::proxy::proxy(args) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(err) => {
                eprintln!("tollgate proxy: {}", one_line(&err));
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Policy { command } => Ok(ops::run(&connect, ops::Command::Policy(command))),
        Command::Scopes { command } => Ok(ops::run(&connect, ops::Command::Scopes(command))),
        Command::Audit { limit } => Ok(ops::run(&connect, ops::Command::Audit { limit })),
        Command::Top(args) => Ok(ops::run(&connect, ops::Command::Top(args))),
        Command::Simulate { json, files } => {
            reader_left_is_done(simulate(json, connect.output, &files))
        }
        Command::Completions { shell } => {
            // Into memory first: clap_complete panics on a failed write.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut script);
            ops::out::write_all(&script);
            ops::out::finish()
                .map_err(std::io::Error::from)
                .context("writing the completion script")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // generate_to builds the tree itself with the `help` subcommand
            // disabled; building it here first would add a page per `help`.
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A command whose stdout's reader went away (`… | head`) has done what
/// was asked of it: it exits 0, quietly, like one that wrote everything.
fn reader_left_is_done(result: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    match result {
        Err(err) if ops::out::is_broken_pipe(err.as_ref()) => Ok(ExitCode::SUCCESS),
        other => other,
    }
}

/// `tollgate simulate`: JSON lines with `--json` or `-o json`, else a table.
fn simulate(json: bool, output: Output, files: &[String]) -> anyhow::Result<ExitCode> {
    if output == Output::Yaml {
        eprintln!("tollgate: simulate prints a table or JSON lines (-o json), not YAML");
        return Ok(ExitCode::from(ops::EXIT_INVALID));
    }
    let all_valid = tollgate::simulate::run(
        files,
        json || output == Output::Json,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .context("writing simulation results")?;
    // Invalid input exits 2, as for every other command.
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(ops::EXIT_INVALID)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Clap's own consistency checks (duplicate flags, a global flag
    /// clashing with a subcommand's, bad defaults) over the whole tree.
    #[test]
    fn the_command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// Every example in every `--help` parses as the command it is shown
    /// under.
    #[test]
    fn every_help_example_runs_the_command_it_is_shown_under() {
        tollgate_testkit::help::check_examples(super::Cli::command());
    }
}
