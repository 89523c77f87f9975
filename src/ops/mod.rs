//! The operator commands: `tollgate policy …`, `tollgate scopes …`,
//! `tollgate audit`, thin clients of the Admin API.
//!
//! Output is a readable table by default, `-o json` or `-o yaml` for scripts.
//! Errors are one line on stderr naming the problem. Exit codes (stable, for
//! scripts):
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | done |
//! | 1 | any other failure |
//! | 2 | invalid input: arguments, a policy file, INVALID_ARGUMENT |
//! | 3 | coordinator unreachable or unavailable |
//! | 4 | not allowed: PERMISSION_DENIED / UNAUTHENTICATED |
//! | 5 | no such rule (NOT_FOUND) |
//! | 6 | conflict: the rule changed since it was read (FAILED_PRECONDITION) |
//! | 7 | `policy diff`: the running policy differs from the file |
//!
//! # Layout
//! - `args`: the clap types — global flags ([`Connect`]), [`PolicyCommand`],
//!   [`ScopesCommand`] — each with an `Examples:` section in its help.
//! - `policy`, `scopes`, `audit`: one handler per command group; each makes
//!   its Admin calls and hands its result to the renderer.
//! - `evidence`: `scopes mute|unmute` and the corroboration lines of
//!   `scopes show`.
//! - [`top`]: `tollgate top`, the live terminal view of the hottest scopes.
//! - `render`: the one renderer (table, JSON, YAML) and its cell helpers.
//! - [`out`]: stdout, written so that a reader going away (`| head`) ends
//!   the output quietly.

/// `out!` to stdout that stops quietly when the reader has gone
/// ([`out`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::ops::out::write(format_args!($($arg)*))
    };
}

/// `outln!` to stdout that stops quietly when the reader has gone
/// ([`out`]).
macro_rules! outln {
    () => {
        $crate::ops::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {{
        $crate::ops::out::write(format_args!($($arg)*));
        $crate::ops::out::write(format_args!("\n"));
    }};
}

mod args;
mod audit;
mod evidence;
pub mod out;
mod policy;
mod render;
mod scopes;
mod stated;
pub mod top;

use std::process::ExitCode;
use std::time::Duration;

use tollgate_proto::v1::admin_client::AdminClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

pub use args::{Connect, Output, PolicyCommand, RuleRef, ScopeRef, ScopesCommand};

/// Exit: done.
pub const EXIT_OK: u8 = 0;
/// Exit: any other failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit: invalid input.
pub const EXIT_INVALID: u8 = 2;
/// Exit: coordinator unreachable.
pub const EXIT_UNAVAILABLE: u8 = 3;
/// Exit: not allowed.
pub const EXIT_DENIED: u8 = 4;
/// Exit: no such rule.
pub const EXIT_NOT_FOUND: u8 = 5;
/// Exit: stale version.
pub const EXIT_CONFLICT: u8 = 6;
/// Exit: drift found by `policy diff`.
pub const EXIT_DRIFT: u8 = 7;

/// The operator commands.
#[derive(Debug)]
pub enum Command {
    /// `policy …`
    Policy(PolicyCommand),
    /// `scopes …`
    Scopes(ScopesCommand),
    /// `audit`
    Audit {
        /// Records to show, newest first.
        limit: u32,
    },
    /// `top`
    Top(top::TopArgs),
}

/// A failure, with its exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_INVALID,
            message: message.into(),
        }
    }

    fn status(what: &str, status: &Status) -> Failure {
        let code = match status.code() {
            Code::InvalidArgument => EXIT_INVALID,
            Code::Unavailable | Code::DeadlineExceeded => EXIT_UNAVAILABLE,
            Code::PermissionDenied | Code::Unauthenticated => EXIT_DENIED,
            Code::NotFound => EXIT_NOT_FOUND,
            Code::FailedPrecondition => EXIT_CONFLICT,
            _ => EXIT_FAILURE,
        };
        Failure {
            code,
            message: format!("{what}: {}", status.message()),
        }
    }
}

type Outcome = Result<u8, Failure>;

/// Runs one operator command; prints results to stdout, one-line errors to
/// stderr, and returns the exit code.
pub fn run(connect: &Connect, command: Command) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(err) => {
            eprintln!("tollgate: starting the runtime: {err}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let code = match runtime.block_on(dispatch(connect, command)) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("tollgate: {}", failure.message);
            failure.code
        }
    };
    match out::finish() {
        Ok(()) => ExitCode::from(code),
        Err(kind) => {
            eprintln!("tollgate: writing to stdout: {kind}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// An Admin API client with the caller's token and output format.
struct Client {
    inner: AdminClient<Channel>,
    /// The same connection, for commands that need more than Admin
    /// (`top` also opens a Watch).
    channel: Channel,
    token: Option<String>,
    output: Output,
}

impl Client {
    fn request<T>(&self, message: T) -> Result<Request<T>, Failure> {
        let mut request = Request::new(message);
        request.set_timeout(Duration::from_secs(10));
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| Failure::invalid("--token: not a valid header value"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

async fn connect(c: &Connect) -> Result<Client, Failure> {
    let tls = c.ca.is_some() || c.cert.is_some();
    let uri = if c.server.contains("://") {
        c.server.clone()
    } else if tls {
        format!("https://{}", c.server)
    } else {
        format!("http://{}", c.server)
    };
    let mut endpoint = Channel::from_shared(uri.clone())
        .map_err(|e| Failure::invalid(format!("--server {uri}: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    if tls || uri.starts_with("https://") {
        // The worker's TLS options, so the CLI and the client agree.
        let options = tollgate_client::link::LinkTls::from_files(
            c.ca.as_deref(),
            c.cert.as_deref(),
            c.key.as_deref(),
        )
        .map_err(|e| Failure::invalid(e.to_string()))?;
        endpoint = endpoint
            .tls_config(options.client_config())
            .map_err(|e| Failure::invalid(format!("--ca/--cert: {e}")))?;
    }
    let channel = endpoint.connect().await.map_err(|e| Failure {
        code: EXIT_UNAVAILABLE,
        message: format!("cannot reach the coordinator at {uri}: {e}"),
    })?;
    Ok(Client {
        inner: AdminClient::new(channel.clone()),
        channel,
        token: c.token.clone(),
        output: c.output,
    })
}

async fn dispatch(c: &Connect, command: Command) -> Outcome {
    // Check local input before dialling, so a bad file fails fast and offline.
    let local_doc = match &command {
        Command::Policy(p) => policy::local_file(p)?,
        _ => None,
    };
    let mut client = connect(c).await?;
    match command {
        Command::Policy(p) => policy::run(&mut client, p, local_doc).await,
        Command::Scopes(s) => scopes::run(&mut client, s).await,
        Command::Audit { limit } => audit::run(&mut client, limit).await,
        Command::Top(args) => top::run(&client, &c.server, args).await,
    }
}
