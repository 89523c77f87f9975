#![doc = include_str!("../README.md")]
//!
//! # Layout
//! Every module is pure (no I/O, no task) and depends only on the modules
//! listed before it, so either side can take one without the rest:
//! - [`clock`]: wall time, injected; nothing here reads `SystemTime::now()`
//!   except [`SystemClock`](clock::SystemClock) itself.
//! - [`scope`]: [`Scope`](scope::Scope) and its wire form.
//! - [`telemetry`]: the caller-scope attribute
//!   ([`caller_scope_attr`](telemetry::caller_scope_attr)).
//! - [`hint`]: raw hint text → a [`HintReading`](hint::HintReading) against
//!   the receipt wall time.
//! - [`ratelimit`]: raw `RateLimit*` fields → a reading, in the same two steps
//!   as [`hint`] (whose size bounds it shares).
//! - [`classify`]: status or transport failure → a
//!   [`Classification`](classify::Classification).
//! - [`outcome`]: the words an intent ends with and the
//!   [`AttemptRecord`](outcome::AttemptRecord) that carries the classification
//!   and hint reading of each attempt as evidence.
//!
//! # Why a crate of its own
//! The worker (`tollgate-client`) decides with these words and the
//! coordinator (`tollgate`) judges the evidence workers send in the same
//! words. Kept here, the coordinator does not depend on the worker's gate,
//! lease cache and tower layer to read a `Retry-After`, and the worker's
//! crate exposes nothing only the coordinator needs.

pub mod classify;
pub mod clock;
pub mod hint;
pub mod outcome;
pub mod ratelimit;
pub mod scope;
pub mod telemetry;
