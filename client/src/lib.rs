//! The worker side of Tollgate.
//!
//! # Layout
//! - [`hint`]: the one `Retry-After` / `grpc-retry-pushback-ms` parser.
//! - [`clock`]: injected wall clocks.
//! - [`scope`]: the unit that shares a budget, as the worker names it.
//! - [`link`]: the bounded, health-tracking connection to the coordinator.
//! - [`lease`]: leased tokens (no RPC on the hot path), batched reports and
//!   the Watch view of scope state; falls back to [`fallback`] when the
//!   coordinator is unreachable.
//! - [`fallback`]: the conservative per-process budget and adaptive throttle.

pub mod clock;
pub mod fallback;
pub mod hint;
pub mod lease;
pub mod link;
pub mod scope;
