//! Tollgate: fleet-wide retry budgets.
//!
//! This crate is the `tollgate` binary's library: the coordinator (to come),
//! its stores and the operator CLI. The per-intent decision engine lives in
//! `tollgate-client`; this crate drives it, never reimplements it.
//!
//! # Layout
//! - [`bench`](mod@bench): `tollgate bench storm`, the fleet retry-storm benchmark.
//! - [`simulate`]: `tollgate simulate`, which runs the client's decision
//!   engine on scenario files with a virtual clock and a seeded RNG.
//!
//! `src/main.rs` is a thin clap front end: one enum of subcommands, each
//! handing off to a module here.

pub mod bench;
pub mod simulate;
