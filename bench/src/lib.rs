//! `tollgate-bench`: benchmarks anyone can re-run to check Tollgate's claims.
//!
//! - [`storm`]: a fleet of workers against an in-process upstream through a
//!   rate-limit outage, one retry strategy at a time on the same arrivals.
//! - [`rpc`]: Lease/Report/Reconsider throughput and latency against a
//!   coordinator, with `grpc.health.v1.Health/Check` on the same server as
//!   the ceiling, in one run.
//! - [`proxy`]: the latency and CPU `tollgate proxy` adds to a request,
//!   against a direct call to the same upstream in the same run.
//! - [`memory`]: resident memory of the in-memory store per scope.
//! - [`soak`]: a long open-loop run with scope churn; RSS, open file
//!   descriptors and p99 must stay flat.
//! - [`propagation`]: how long an admin change made through one
//!   `tollgate serve` replica on Redis takes to be in force on the others.
//!
//! The client's hot-path micro-benchmarks are criterion benches in
//! `client/benches/hot_path.rs`; `docs/benchmarks.md` has the commands and
//! the latest results.

pub mod cpu;
pub mod fleet;
pub mod memory;
pub mod propagation;
pub mod proxy;
pub mod rpc;
pub mod soak;
pub mod storm;
