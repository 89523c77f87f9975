//! The worker side of Tollgate: the async gate that runs each intent's
//! attempts under its deadline, cancellation, attempt cap, repetition policy
//! and one retry owner, with retry tokens and slots from the coordinator.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use tollgate_client::backoff::{Backoff, Jitter};
//! use tollgate_client::clock::SystemClock;
//! use tollgate_client::engine::{Observation, Policy};
//! use tollgate_client::gate::{Gate, GateConfig, GateIntent, Reply};
//! use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
//! use tollgate_client::link::{CoordinatorLink, LinkConfig};
//! use tollgate_client::scope::Scope;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // Connecting is lazy: a worker starts even when the coordinator is down
//! // (it then runs on a conservative local budget, visibly).
//! let link = CoordinatorLink::new(&LinkConfig::new("http://127.0.0.1:50051", "worker-1"))?;
//! let clock = Arc::new(SystemClock);
//! let cache = LeaseCache::start(link, LeaseCacheConfig::default(), clock.clone());
//! let gate = Gate::new(cache, clock, GateConfig::default());
//!
//! let policy = Policy::try_new(
//!     Duration::from_secs(30),   // end-to-end deadline
//!     4,                         // attempts in all
//!     Duration::from_secs(5),    // reserved per attempt
//!     Duration::from_millis(100),
//!     Backoff { base: Duration::from_millis(250), cap: Duration::from_secs(4), jitter: Jitter::Full },
//!     Some(Duration::from_secs(60)),
//! )?;
//! let intent = GateIntent::new("order-42", Scope::new("tenant-a", "POST /orders"), policy);
//! let result = gate
//!     .run(intent, |attempt| async move {
//!         // Send the request with attempt.owner_mark (and the idempotency
//!         // key, if any) attached; classify what came back.
//!         let status = 200; // send(&attempt).await
//!         Reply::new(Observation::http(status, None), attempt.number)
//!     })
//!     .await;
//! println!("{} after {} attempt(s)", result.outcome, result.attempts.len());
//! # Ok(())
//! # }
//! ```
//!
//! HTTP and tonic clients get the same by wrapping their service in
//! [`layer::TollgateLayer`].
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
//! Running intents (async):
//! - [`gate`]: `Gate::run` drives the engine on tokio time, in the issue's
//!   decision order, against the lease cache and a local capacity semaphore.
//! - [`owner`]: the `x-tollgate-retry-owner` mark that keeps one retry owner.
//! - [`layer`]: `TollgateLayer` for `Service<http::Request<B>>` clients and
//!   tonic channels.
//!
//! Talking to the coordinator:
//! - [`scope`]: the unit that shares a budget, as the worker names it.
//! - [`link`]: the bounded, health-tracking connection to the coordinator.
//! - [`lease`]: leased tokens (no RPC on the hot path), batched reports and
//!   the Watch view of scope state; falls back to [`fallback`] when the
//!   coordinator is unreachable.
//!
//! Observing it:
//! - [`telemetry`]: W3C trace context on coordinator RPCs, the span model,
//!   client metrics, and (feature `otel`) OTLP export for workers.
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
pub mod gate;
pub mod hint;
pub mod layer;
pub mod lease;
pub mod link;
pub mod owner;
pub mod scope;
pub mod script;
pub mod telemetry;
