//! `tollgate bench`: benchmarks anyone can re-run to check Tollgate's claims.
//!
//! - [`storm`]: a fleet of workers against an in-process upstream through a
//!   rate-limit outage, one retry strategy at a time on the same arrivals.
//!
//! The client's hot-path micro-benchmarks are criterion benches in
//! `client/benches/hot_path.rs`; `docs/benchmarks.md` has the commands and
//! the latest results.

pub mod storm;
