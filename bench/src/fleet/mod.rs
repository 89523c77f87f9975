//! The storm as separate processes: an upstream stand-in and worker
//! processes, so a real `tollgate serve` can be killed and stopped under a
//! fleet in a storm (`bench/tests/chaos_fleet.rs`, `docs/operating.md`).
//!
//! - [`upstream`]: `tollgate-bench upstream`, the storm benchmark's
//!   upstream model (`bench::storm`'s token bucket, outage and hints)
//!   served over HTTP/1, printing what it was offered, served and refused
//!   per second as JSON lines.
//! - [`worker`]: `tollgate-bench worker`, one worker process sending
//!   intents at a steady rate through `TollgateLayer` to that upstream,
//!   printing its link's state changes and its outcome counts; with
//!   `--alone`, the same worker deciding without a coordinator.
//! - [`limiter`]: `tollgate-bench limiter`, those workers against nginx's
//!   `limit_req` (a limiter nobody here wrote) through an outage made by a
//!   configuration reload, with a real `tollgate serve` and then alone.
//!
//! `upstream` and `worker` are hidden subcommands of the shipped binary rather than examples:
//! a test finds the binary through `CARGO_BIN_EXE_tollgate`, while Cargo
//! offers no path to an example's executable and builds none for
//! `cargo test --test NAME`.

pub mod limiter;
pub mod upstream;
pub mod worker;

/// The request header carrying the intent's deadline (Unix milliseconds):
/// the upstream counts attempts that arrive after it, whatever the worker
/// believed, as the in-process storm's upstream does.
pub const DEADLINE_HEADER: &str = "x-tollgate-deadline-unix-ms";

/// The one caller scope every fleet worker names, and the one route its
/// requests fall under (it sends only GETs, to `/work/{n}`): what the
/// harnesses ask the coordinator about.
pub const CALLER_SCOPE: &str = "fleet";
/// See [`CALLER_SCOPE`].
pub const ROUTE: &str = "GET /work/{id}";
