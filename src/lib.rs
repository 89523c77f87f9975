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
//! - [`hints`]: wait hints read with the client crate's one parser into
//!   cooldowns and the backoff step, statuses read with its one
//!   classification table (pure).
//! - [`pacing`]: the learned wake rate per route — capacity, spare capacity,
//!   probing and back-off, penalty-extending limiters — the slot decision
//!   at wake time, and the per-route slot cursor that spreads waiting
//!   intents ([`pacing::cursor`]) (pure).
//! - [`store`]: the `Store` trait whose operations are the atomic state
//!   changes (a whole worker report is one), its in-memory backend, the
//!   Redis backend (one Lua script per operation, a clock that follows
//!   Redis's `TIME`, the replicas' shared runtime control state), and the
//!   contract suite both must pass.
//! - [`events`]: `StateChange`, scope snapshots and the `EventHub` every
//!   change is published on.
//! - [`control`]: runtime control — policy changes with optimistic versions,
//!   laid over the policy file, freezes, resets, the audit log, kept in the
//!   state file (one coordinator) or shared through the store (replicas),
//!   and live reload.
//! - [`coordinator`]: the core — `Coordinator` owns the store, policies,
//!   event hub, clock, RNG and the runtime control; lease, release, report,
//!   reconsider, watch and the admin changes, each one store operation plus
//!   the events it publishes. No gRPC.
//! - [`config`]: the TOML policy file (server limits, defaults, rules, tokens).
//! - [`auth`]: bearer tokens → the caller scopes they may use; admin tokens;
//!   token files re-read in place; repeated bad tokens slowed down.
//! - [`tenancy`]: each caller token's part of the pools (scopes, request
//!   slots): who owns a scope, the fair share, the per-token quotas.
//! - [`service`]: the `tollgate.v1.Budget` and `tollgate.v1.Admin` gRPC
//!   services — validation, identity, one call into the core, the wire
//!   translation, Watch streams — and the one error → `Status` mapping.
//! - [`server`]: `run(incoming, shutdown, Setup)`: the core, the services,
//!   health and both reflection versions behind tower layers, background
//!   tasks, a graceful drain; `run_tcp` adds TLS with certificate reload,
//!   the connection limits and the idle timeout (docs/security.md).
//! - [`signal`], [`serve_command`]: SIGINT/SIGTERM/SIGHUP, and the `serve`
//!   subcommand: its flags read into a store, telemetry and a [`server`]
//!   `Setup` (the server itself knows no flags).
//! - [`policy_wire`]: a policy's fields to and from the Admin API's
//!   message, shared by the Admin service and the operator CLI.
//! - [`ops`]: the operator commands (`policy`, `scopes`, `audit`), thin
//!   Admin API clients with one renderer (table, JSON, YAML) and documented
//!   exit codes, and `top`, the live terminal view of the hottest scopes.
//! - [`telemetry`]: OTLP traces and metrics (the coordinator's instruments in
//!   [`telemetry::metrics`], the standard RPC server metrics, freeze gauges),
//!   W3C trace context from the caller, the Prometheus `/metrics` endpoint
//!   (docs/telemetry.md).
//! - [`proxy`]: `tollgate proxy`, the sidecar that runs any service's HTTP
//!   and gRPC requests through the client crate's gate (docs/proxy.md).
//! - [`simulate`]: `tollgate simulate`, which runs the client's decision
//!   engine on scenario files with a virtual clock and a seeded RNG.
//!
//! A request flows `server` → `service` (validate, authorize) →
//! `coordinator` (resolve the policy, read the clock, assess hints) →
//! `store` (one atomic operation applying the pure `budget` / `hints` /
//! `pacing` math) → `coordinator` (publish on the `events` hub) → `service`
//! (reply). Only `service` and `server` know gRPC types; nothing below
//! `service` imports from it.
//!
//! `src/main.rs` is a thin clap front end: one enum of subcommands, each
//! handing off to a module here. The benchmarks are the `tollgate-bench`
//! crate (`bench/`) and the tests' Redis fixtures `tollgate-testkit`
//! (`testkit/`): neither is part of this library or its binary.

pub mod auth;
pub mod budget;
pub mod codec;
pub mod config;
pub mod control;
pub mod coordinator;
pub mod events;
pub mod hints;
pub mod ops;
pub mod pacing;
pub mod policy;
pub mod policy_wire;
pub mod proxy;
pub mod scope;
pub mod serve_command;
pub mod server;
pub mod service;
pub mod signal;
pub mod simulate;
pub mod store;
pub mod telemetry;
pub mod tenancy;
// The instruments moved under `telemetry`; the old path stays for callers.
pub use telemetry::metrics;
