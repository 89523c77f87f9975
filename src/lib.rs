//! Tollgate's coordinator: fleet-wide retry budgets, shared rate-limit
//! evidence and jittered reconsideration slots.
//!
//! # Layout
//! - [`scope`]: what shares state — `(caller_scope, route)` plus a priority.
//! - [`policy`]: validated policies and rules matched by specificity.
//! - [`budget`]: the sliding-window budget, priority shares, leases and
//!   max-min fair shares (pure).
//! - [`evidence`]: hints read with the client crate's one parser into
//!   cooldowns and the backoff step (pure).
//! - [`slots`]: the per-route slot cursor that spreads waiting intents (pure).
//! - [`store`]: the `Store` trait whose operations are the atomic state
//!   changes, and its in-memory backend.
pub mod budget;
pub mod evidence;
pub mod policy;
pub mod scope;
pub mod slots;
pub mod store;
