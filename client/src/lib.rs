#![doc = include_str!("../README.md")]
//!
//! # Layout
//! The types a worker needs are re-exported at the crate root; the modules
//! hold the rest.
//!
//! The vocabulary shared with the coordinator, re-exported from
//! `tollgate-vocab` (pure, no I/O):
//! - [`classify`]: what a response or transport failure means for retrying
//!   (retryable or not; the effect known absent or unknown).
//! - [`hint`]: the one `Retry-After` / `grpc-retry-pushback-ms` parser.
//! - [`ratelimit`]: the one parser of stated limits (`RateLimit-Policy`,
//!   `RateLimit`, `X-RateLimit-*`), in the same two steps as [`hint`].
//! - [`outcome`]: the outcome vocabulary and one record per attempt.
//! - [`clock`]: injected wall clocks.
//! - [`scope`]: the unit that shares a budget, as the worker names it.
//!
//! Pure decision logic, no I/O:
//! - [`backoff`]: the local exponential backoff with optional full jitter.
//! - [`engine`]: the decision engine, a sans-IO state machine per intent,
//!   and the [`IntentPolicy`] it runs under (built from a deadline, with
//!   named defaults for the rest).
//! - [`fallback`]: the conservative per-process budget and adaptive throttle.
//!
//! Running intents (async):
//! - [`setup`]: [`Tollgate::connect`], the one-line setup, and the one-line
//!   layers [`Tollgate::http_layer`] and [`Tollgate::grpc_layer`].
//! - [`gate`]: `Gate::run` drives the engine on tokio time, in the decision
//!   order, against the lease cache and a local capacity semaphore (intent
//!   types, the driver, the completion registry and spans in submodules).
//! - [`owner`]: the `x-tollgate-retry-owner` mark that keeps one retry owner.
//! - [`layer`]: `TollgateLayer` for `Service<http::Request<B>>` clients and
//!   tonic channels.
//!
//! Talking to the coordinator:
//! - [`link`]: the bounded, health-tracking connection to the coordinator.
//! - [`lease`]: leased tokens (no RPC on the hot path), batched reports and
//!   the Watch view of scope state; falls back to [`fallback`] when the
//!   coordinator is unreachable (its RPCs run in a background task, in a
//!   submodule).
//! - `wire` (private): every message sent to the coordinator is built there.
//!
//! Observing it:
//! - [`telemetry`]: W3C trace context on coordinator RPCs, client metrics,
//!   and (feature `otel`) OTLP export for workers; the caller-scope attribute
//!   is the vocabulary crate's, re-exported. It takes plain values, so it
//!   depends on nothing above it.
//!
//! # How data flows
//! ```text
//! driver ── start_attempt(now) ──▶ engine
//! driver ── on_response(now, Observation) ──▶ engine
//!             Observation = status + classify::* + raw hint
//!             engine reads the hint (hint::read_*) against the receipt wall time,
//!             falls back to backoff::Backoff, floors, checks the deadline
//!        ◀── Decision::Wait { next_start } | Decision::Stop(Outcome)
//! driver sleeps (virtual or tokio time), may defer to a coordinator slot,
//!        may refuse (no token / capacity / owner)
//! driver ── on_wake(now, WakeCheck) ──▶ engine re-checks cancel + deadline at now
//!        ◀── WakeDecision::Start | WakeDecision::Stop(Outcome)
//! engine keeps an outcome::AttemptRecord per attempt for logs and reports
//! ```
//! Time in the engine is elapsed [`std::time::Duration`] since the first
//! start; the RNG is passed in, so a seed fixes the schedule.

pub mod backoff;
pub mod engine;
pub mod fallback;
pub mod gate;
pub mod layer;
pub mod lease;
pub mod link;
pub mod owner;
pub mod setup;
pub mod telemetry;
mod wire;

// The vocabulary the worker shares with the coordinator lives in
// `tollgate-vocab`; re-exported under the same module names, so a worker
// needs one dependency and the paths it has always used.
pub use tollgate_vocab::{classify, clock, hint, outcome, ratelimit, scope};

/// Locks `mutex`, also after a panic elsewhere poisoned it: what these
/// locks guard (counters, an RNG, a channel handle, file stamps) is valid
/// at every step, so a panic cannot leave it broken.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use backoff::{Backoff, Jitter};
pub use classify::{Classification, Effect, GrpcCode, ResponseClass, Sent, TransportFailure};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use engine::{IntentPolicy, Observation, PolicyError};
pub use gate::{
    Attempt, AttemptEvidence, Gate, GateConfig, GateIntent, IntentResult, ReconcileQuery,
    Reconciled, Repetition, Reply, Shadowed, TokenSource, WaitEvidence,
};
pub use layer::{GateError, GateReport, LayerConfig, TollgateLayer, TollgateService};
pub use lease::LeaseCacheConfig;
pub use link::{LinkConfig, LinkState, LinkTls};
pub use outcome::{Outcome, ResponseStatus};
pub use owner::OwnerMark;
pub use scope::{Priority, Scope};
pub use setup::{SetupError, Tollgate, TollgateBuilder};
