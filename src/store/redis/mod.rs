//! The shared store: scope state in Redis (or Redis Cluster), so coordinator
//! replicas are stateless and share one budget exactly.
//!
//! # Scripts, and decisions made in Rust
//! Every decision exists once, in Rust, made by the code the memory store
//! runs; the scripts (`lua/*.lua`, after `lua/prelude.lua`, one Redis
//! Functions library loaded on a node the first time a call finds it
//! missing: `scripts`) keep the state and do only what must be atomic.
//! The bounds both use are written into the scripts from the Rust
//! constants, so those cannot drift.
//!
//! - The budget ([`crate::budget`]): a Lease computes its class's caps and
//!   the worker's fair share from the counts this replica last read, and
//!   `lease.lua` takes up to that many tokens against the spend as it is
//!   now, or answers that the counts moved and the Lease is decided again
//!   (`lease`). Release refunds, a Report adds first attempts: counters.
//! - The hints ([`crate::hints`]: cooldowns, corroboration, backoff,
//!   mutes), the slots and the pacing controller: a call reads what the
//!   decision needs, decides, and writes the outcome with a compare-and-set
//!   that fails if anything read moved meanwhile (`decide`).
//!
//! The store contract suite (`contract_tests!`), run against this store
//! and the in-memory one, checks that the two answer alike.
//!
//! # Keys
//! - `PREFIX:{CALLER|ROUTE}:r` — a route, as one hash: a small core
//!   (touched, cooldown and floor, what is live until when, worker counts),
//!   the freeze, each per-second series, the hints, the slot cursor, the
//!   pacing state ([`PacingState::encode`](crate::pacing::PacingState::encode))
//!   and their version, and one field per worker and class. A call reads
//!   and writes only the fields it needs (`lua/prelude.lua`, "route").
//! - `PREFIX:{CALLER|ROUTE}:e` — the route's leases, a sorted set by
//!   expiry whose members carry what a Release needs.
//! - `PREFIX:{CALLER|ROUTE}:p` and `…:a` — the intents holding a slot, by
//!   slot, and those told to ask again, by deadline (sorted sets).
//! - `PREFIX:{CALLER}:c` — a caller scope's hints (uncertain evidence),
//!   as a hash: the encoded [`HintState`](crate::hints::HintState), its
//!   version, and the cooldown, floor and live-until decided from it.
//! - `PREFIX:format` — the layout of all of the above (`format`): a build
//!   refuses a prefix another layout wrote.
//!
//! The hash tag keeps a route's keys in one Redis Cluster slot, so every
//! route script touches one slot and routes spread over the cluster. `{`,
//! `}`, `|` and `%` in names are percent-encoded so two scopes never share
//! a key or a hash tag by accident. Keys expire by themselves an idle TTL
//! past their last live instant (cooldown, lease, waiting intent), pushed
//! out by the writes that need it; a frozen route never expires.
//!
//! On one node a route script also reads the caller key, atomically. On a
//! cluster the caller key is in another slot, so it is read by a small
//! script just before — the same window the memory store has between its
//! two maps (a caller-wide cooldown merged concurrently may miss that one
//! answer; the next call and Watch see it). For the same reason a report's
//! caller-scope half (its successes and uncertain hints) runs in its own
//! script on the caller key just before the route's half.
//!
//! # Time
//! Scripts never read `TIME`: `now_ms` comes from the coordinator's
//! injected clock, as for the memory store, so tests control time and a
//! script's effect depends only on its arguments. For replicas to agree,
//! they must share one clock: `tollgate serve --store redis://…` uses
//! [`RedisClock`] by default, the local clock corrected by the offset to the
//! Redis server's `TIME`, so replicas with skewed clocks still agree (to
//! within a round trip).
//!
//! # Faults
//! Each operation is bounded by `op_timeout` (connect and response timeouts
//! under it); any failure is [`StoreError::Unavailable`](crate::store::StoreError::Unavailable), which the service
//! answers as UNAVAILABLE so workers fall back to their local budget. The
//! connection reconnects by itself in the background.

//!
//! # Files
//! - `connection`: where Redis is ([`RedisTarget`], [`RedisOptions`]), the
//!   reconnecting connection, the operation bound, SCAN over every primary.
//! - `keys`: the key layout and its percent-encoding.
//! - `scripts`: the Lua scripts as one Functions library, with the bounds
//!   they share with the Rust modules injected from the Rust constants.
//! - `lease`: a Lease decided in Rust and taken by `lua/lease.lua` under
//!   the limits it computed.
//! - `decide`: Reconsider and a Report's pacing, decided in Rust and
//!   written by compare-and-set.
//! - `format`: the prefix's layout, claimed or refused at start.
//! - `reply`: decoding a script's reply into store types.
//! - `store`: [`RedisStore`]'s [`Store`](crate::store::Store) implementation,
//!   one function call per operation ([`RedisStore`] itself is here).
//! - `quota`: each caller token's quota of scopes, in a sorted set per
//!   token, charged before a call creates a scope.
//! - `queue`: concurrent Leases on one node sent to Redis together, each
//!   still its own atomic state change.
//! - `sentinel`: a primary behind Redis Sentinel, asked for again after a
//!   failure.
//! - `control_state`: the replicas' shared runtime control state (policies,
//!   freezes, audit) with compare-and-set commits and change notices.

mod clock;
mod connection;
mod control_state;
mod decide;
mod format;
mod keys;
mod lease;
mod queue;
mod quota;
mod reply;
pub(crate) mod scripts;
mod sentinel;
mod store;

pub use clock::RedisClock;
pub use connection::{RedisOptions, RedisSetupError, RedisTarget};
pub use format::STORE_FORMAT;
pub use sentinel::SentinelTarget;

use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use connection::Conn;
use decide::Turns;
use lease::LastRead;
use queue::LeaseQueue;

/// The Redis [`Store`](crate::store::Store). Defined here, its methods in
/// the files beside this one (one concern each) and its `Store`
/// implementation in `store`, so those files build on this module, not on
/// one another.
pub struct RedisStore {
    conn: Conn,
    target: RedisTarget,
    prefix: String,
    idle_ms: i64,
    op_timeout: Duration,
    /// Leases sent together (one node; on a cluster each goes alone),
    /// started by the first Lease, on the runtime that serves it.
    queue: OnceLock<LeaseQueue>,
    /// A route's decisions in this process take turns (`decide`).
    turns: Turns,
    /// The counts each route's Lease limits are computed from (`lease`).
    last_read: LastRead,
    /// Whether the prefix's store format was checked (`format`), and why
    /// it was refused if it was.
    format_checked: AtomicBool,
    refused: OnceLock<String>,
    /// Each caller token's quota of scopes (`quota`).
    quotas: quota::Quotas,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target may carry a password: never printed.
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::contract::Fixture;
    use crate::tenancy::TenantLimits;
    use tollgate_testkit::RedisServer;

    /// A store on `server` as the contract runs it (a minute's idle TTL),
    /// with these quotas.
    async fn store_on(server: &RedisServer, tenants: TenantLimits) -> RedisStore {
        RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions {
                idle_ttl: Duration::from_secs(60),
                tenants,
                ..RedisOptions::default()
            },
        )
        .await
        .expect("connect")
    }

    async fn make() -> Option<Fixture> {
        let server = RedisServer::start()?;
        let store = store_on(&server, TenantLimits::default()).await;
        Some(Fixture::new(store, server))
    }

    crate::store::contract::contract_tests!(make);

    /// The quota cases: each token's scopes counted in Redis.
    mod quotas {
        use super::*;

        async fn make() -> Option<Fixture> {
            let server = RedisServer::start()?;
            let store = store_on(&server, crate::store::contract::quotas::limits()).await;
            Some(Fixture::new(store, server))
        }

        crate::store::contract::quotas::quota_tests!(make);
    }

    /// The same contract on a (one-node) Redis Cluster, where the caller
    /// key is read apart from the route's. One server for every case: a
    /// cluster node takes ~2 s to start serving.
    mod cluster {
        use super::*;
        use std::sync::Arc;

        async fn make() -> Option<Fixture> {
            let server = RedisServer::start_cluster()?;
            let store = store_on(&server, TenantLimits::default()).await;
            assert!(store.clustered());
            let server = Arc::new(server);
            let flush = Arc::clone(&server);
            Some(Fixture::new(store, server).with_reset(move || flush.flush()))
        }

        crate::store::contract::contract_tests!(one_fixture make);

        /// The quota cases on a cluster, where each token's set is in a
        /// slot of its own, apart from its scopes'. A store per case (its
        /// refusal counts are its own), on a cluster of its own.
        mod quotas {
            use super::*;

            async fn make() -> Option<Fixture> {
                let server = RedisServer::start_cluster()?;
                let store = store_on(&server, crate::store::contract::quotas::limits()).await;
                assert!(store.clustered());
                Some(Fixture::new(store, server))
            }

            crate::store::contract::quotas::quota_tests!(make);
        }
    }
}
