//! The worker side of Tollgate.
//!
//! # Layout
//! Pure decision logic, no I/O:
//! - [`classify`]: what a response or transport failure means for retrying
//!   (retryable or not; the effect known absent or unknown).
//! - [`hint`]: the one `Retry-After` / `grpc-retry-pushback-ms` parser.
//! - [`backoff`]: the local exponential backoff with optional full jitter.
//! - [`engine`]: the decision engine, a sans-IO state machine per intent.
//! - [`evidence`]: the outcome vocabulary and one record per attempt.
//! - [`script`]: a driver that runs the engine on scripted responses and a
//!   virtual clock (`tollgate simulate`, property tests).
//! - [`clock`]: injected wall clocks.
//! - [`fallback`]: the conservative per-process budget and adaptive throttle.
//!
//! Talking to the coordinator:
//! - [`scope`]: the unit that shares a budget, as the worker names it.
//! - [`link`]: the bounded, health-tracking connection to the coordinator.
//! - [`lease`]: leased tokens (no RPC on the hot path), batched reports and
//!   the Watch view of scope state; falls back to [`fallback`] when the
//!   coordinator is unreachable.
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
//! engine keeps an evidence::AttemptRecord per attempt for logs and reports
//! ```
//! Time in the engine is elapsed [`std::time::Duration`] since the first
//! start; the RNG is passed in, so a seed fixes the schedule.

pub mod backoff;
pub mod classify;
pub mod clock;
pub mod engine;
pub mod evidence;
pub mod fallback;
pub mod hint;
pub mod lease;
pub mod link;
pub mod scope;
pub mod script;
