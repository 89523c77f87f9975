//! The worker side of Tollgate.
//!
//! # Layout
//! - [`hint`]: the one `Retry-After` / `grpc-retry-pushback-ms` parser.
//! - [`clock`]: injected wall clocks.

pub mod clock;
pub mod hint;
