//! Tollgate: fleet-wide retry budgets, shared rate-limit evidence and
//! jittered reconsideration slots — the coordinator, its stores and the CLI.
//!
//! The per-intent decision engine lives in `tollgate-client`; this crate
//! drives it (in `simulate`), never reimplements it.
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
//!   changes; its in-memory backend, and the Redis backend (one Lua script
//!   per operation, pub/sub for Watch across replicas, a clock that follows
//!   Redis's `TIME`) that makes replicas stateless.
//! - [`config`]: the TOML policy file (server limits, defaults, rules, tokens).
//! - [`auth`]: bearer tokens → the caller scopes they may use; admin tokens.
//! - [`admin`]: runtime control — policy changes with optimistic versions,
//!   freezes, resets, the audit log, the state file and live reload (no gRPC).
//! - [`service`]: the `tollgate.v1.Budget` and `tollgate.v1.Admin` gRPC services — validation,
//!   identity, the wire ↔ core translation, Watch streams — and the one
//!   error → `Status` mapping.
//! - [`server`]: `run(listener, shutdown, config, clock)`: Budget + health +
//!   reflection behind tower layers, with a graceful drain.
//! - [`signal`], [`serve`]: SIGINT/SIGTERM/SIGHUP and the `serve` subcommand.
//! - [`ops`]: the operator commands (`policy`, `scopes`, `audit`), thin
//!   Admin API clients with one renderer (table, JSON, YAML) and documented
//!   exit codes.
//! - [`telemetry`], [`metrics`]: OTLP traces and metrics, W3C trace context
//!   from the caller, the Prometheus `/metrics` endpoint (docs/telemetry.md).
//! - [`bench`](mod@bench): `tollgate bench storm`, the fleet retry-storm benchmark;
//!   `bench rpc` (coordinator RPC throughput against the same server's health
//!   check) and `bench memory` (resident bytes per scope in the in-memory store).
//! - [`simulate`]: `tollgate simulate`, which runs the client's decision
//!   engine on scenario files with a virtual clock and a seeded RNG.
//!
//! A request flows `server` → `service` (validate, authorize, resolve the
//! policy, read the clock) → `store` (one atomic operation applying the pure
//! `budget` / `evidence` / `slots` math) → back to `service` (reply, publish
//! Watch events). Only `service` and `server` know gRPC types.
//!
//! `src/main.rs` is a thin clap front end: one enum of subcommands, each
//! handing off to a module here.

pub mod admin;
pub mod auth;
pub mod bench;
pub mod budget;
pub mod config;
pub mod evidence;
pub mod metrics;
pub mod ops;
pub mod policy;
pub mod scope;
pub mod serve;
pub mod server;
pub mod service;
pub mod signal;
pub mod simulate;
pub mod slots;
pub mod store;
pub mod telemetry;
#[doc(hidden)]
pub mod testing;
