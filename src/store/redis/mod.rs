//! The shared store: scope state in Redis (or Redis Cluster), so coordinator
//! replicas are stateless and share one budget exactly.
//!
//! # One script per state change
//! Every [`Store`] operation is one server-side Lua script (EVALSHA, loaded
//! again on NOSCRIPT by [`redis::Script`]), so it is atomic without locks or
//! WATCH loops. The scripts (`lua/*.lua`, each prefixed by `lua/prelude.lua`)
//! are a port of the pure modules — [`crate::budget`], [`crate::evidence`]'s
//! `HintState`, [`crate::slots`] — because a script cannot call Rust. The two
//! are necessarily parallel; the store contract suite (`contract_tests!`),
//! run against this store and the in-memory one, is the proof they agree.
//!
//! # Keys
//! - `PREFIX:{CALLER|ROUTE}:r` — one MessagePack blob per route: the budget
//!   ledger, hints, slot cursor, freeze. The hash tag keeps a route in one
//!   Redis Cluster slot (it is a single key, so every route script touches
//!   one slot and routes spread over the cluster).
//! - `PREFIX:{CALLER}:c` — a caller scope's hints (uncertain evidence).
//!
//! `{`, `}`, `|` and `%` in names are percent-encoded so two scopes never
//! share a key or a hash tag by accident. Every write sets an expiry of the
//! idle TTL beyond the last live instant (cooldown, lease, waiting intent);
//! a frozen route never expires.
//!
//! On one node a route script also reads the caller key, atomically. On a
//! cluster the caller key is in another slot, so it is read by a small
//! script just before — the same window the memory store has between its
//! two maps (a caller-wide cooldown merged concurrently may miss that one
//! answer; the next call and Watch see it).
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
//! under it); any failure is [`StoreError::Unavailable`], which the service
//! answers as UNAVAILABLE so workers fall back to their local budget. The
//! connection reconnects by itself in the background.

mod clock;
mod relay;

use std::future::Future;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Script, ScriptInvocation, Value};

use tollgate_client::hint::HintForm;

use crate::budget::{BudgetError, BudgetSnapshot, ClassSnapshot, Grant, GrantAsk, GrantLimit};
use crate::evidence::{Assessment, HintRecord, Merge};
use crate::policy::Policy;
use crate::scope::{EvidenceLevel, Priority, RouteKey, ScopeKey};
use crate::slots::{SlotAsk, SlotError};

use super::{
    LeaseOutcome, Reconsidered, ScopeDetail, ScopeFilter, ScopePage, ScopeSummary, ScopeView,
    Store, StoreError, StoreFuture,
};

pub use clock::RedisClock;
pub use relay::EventRelay;

/// Why a Redis store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// The `--store` URL is not one this store understands.
    #[error("store URL: {0}")]
    Url(String),
    /// Redis refused the configuration or the first connection.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Where the Redis store lives, parsed from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://HOST:PORT[/DB]`: one server (or a primary behind a proxy).
    Single(String),
    /// `redis+cluster://HOST:PORT[,HOST:PORT…]`: seed nodes of a cluster.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses `redis://…`, `rediss://…` or `redis+cluster://h1:p1,h2:p2`.
    pub fn parse(url: &str) -> Result<RedisTarget, RedisSetupError> {
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(RedisSetupError::Url(
                    "redis+cluster:// needs at least one HOST:PORT".into(),
                ));
            }
            return Ok(RedisTarget::Cluster(nodes));
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(RedisTarget::Single(url.to_owned()));
        }
        Err(RedisSetupError::Url(
            "expected redis://HOST:PORT[/DB] or redis+cluster://HOST:PORT[,HOST:PORT…]".into(),
        ))
    }

    /// The node Watch pub/sub and the clock use: on a cluster any node
    /// carries PUBLISH to all of them.
    fn first_node(&self) -> &str {
        match self {
            RedisTarget::Single(url) => url,
            RedisTarget::Cluster(nodes) => nodes.first().map_or("", String::as_str),
        }
    }
}

/// Tunables of the Redis store.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Key prefix, so several deployments can share one Redis.
    pub prefix: String,
    /// Keys idle this long (and holding nothing live) expire; the server's
    /// `scope_idle_ttl`.
    pub idle_ttl: Duration,
    /// The most one operation may take, connecting included; past it the
    /// store is [`StoreError::Unavailable`]. Keep it well under the
    /// request timeout so the answer is UNAVAILABLE, not DEADLINE_EXCEEDED.
    pub op_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "tollgate".into(),
            idle_ttl: Duration::from_secs(600),
            op_timeout: Duration::from_millis(500),
        }
    }
}

/// The scripts, compiled once; their SHA1 is computed here and each is sent
/// to Redis only when a node answers NOSCRIPT (after a restart or failover).
struct Scripts {
    lease: Script,
    release: Script,
    deposit: Script,
    decay_caller: Script,
    merge: Script,
    reconsider: Script,
    view: Script,
    caller: Script,
    freeze: Script,
    evict: Script,
    detail: Script,
    caller_detail: Script,
    reset: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let with_prelude =
        |body: &str| Script::new(&format!("{}\n{}", include_str!("lua/prelude.lua"), body));
    Scripts {
        lease: with_prelude(include_str!("lua/lease.lua")),
        release: with_prelude(include_str!("lua/release.lua")),
        deposit: with_prelude(include_str!("lua/deposit.lua")),
        decay_caller: with_prelude(include_str!("lua/decay_caller.lua")),
        merge: with_prelude(include_str!("lua/merge.lua")),
        reconsider: with_prelude(include_str!("lua/reconsider.lua")),
        view: with_prelude(include_str!("lua/view.lua")),
        caller: with_prelude(include_str!("lua/caller.lua")),
        freeze: with_prelude(include_str!("lua/freeze.lua")),
        evict: with_prelude(include_str!("lua/evict.lua")),
        detail: with_prelude(include_str!("lua/detail.lua")),
        caller_detail: with_prelude(include_str!("lua/caller_detail.lua")),
        reset: with_prelude(include_str!("lua/reset.lua")),
    }
});

/// A connection that reconnects by itself; cheap to clone per call.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis [`Store`].
pub struct RedisStore {
    conn: Conn,
    target: RedisTarget,
    prefix: String,
    idle_ms: i64,
    op_timeout: Duration,
    /// Lease ids are `nonce-counter`: unique across replicas (each draws
    /// its own nonce) and across restarts.
    lease_nonce: u64,
    next_lease: AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target may carry a password: never printed.
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `target`. A single server is connected lazily (the first
    /// operation connects, and a server that is down now is simply
    /// unavailable until it is back); a cluster's topology is read now.
    pub async fn connect(
        target: RedisTarget,
        options: RedisOptions,
    ) -> Result<RedisStore, RedisSetupError> {
        // Connect and response timeouts below the operation bound, so a dead
        // server fails the call instead of the outer timeout cutting it.
        let io_timeout = options.op_timeout.mul_f32(0.8);
        let conn = match &target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(io_timeout))
                    .set_response_timeout(Some(io_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500));
                Conn::Single(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            RedisTarget::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(io_timeout)
                    .response_timeout(io_timeout)
                    .retries(1)
                    .build()?;
                Conn::Cluster(client.get_async_connection().await?)
            }
        };
        Ok(RedisStore {
            conn,
            target,
            prefix: options.prefix,
            idle_ms: i64::try_from(options.idle_ttl.as_millis()).unwrap_or(i64::MAX),
            op_timeout: options.op_timeout,
            lease_nonce: rand::random(),
            next_lease: AtomicU64::new(1),
        })
    }

    /// Where this store lives (for the Watch relay and the clock).
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// A client for the node whose `TIME` the replicas' [`RedisClock`]
    /// follows (on a cluster, the first seed node).
    pub fn clock_client(&self) -> Result<redis::Client, RedisSetupError> {
        Ok(redis::Client::open(self.target.first_node())?)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn route_key(&self, route: &RouteKey) -> String {
        format!(
            "{}:{{{}|{}}}:r",
            self.prefix,
            escape(&route.caller_scope),
            escape(&route.route)
        )
    }

    fn caller_key(&self, caller: &str) -> String {
        format!("{}:{{{}}}:c", self.prefix, escape(caller))
    }

    fn clustered(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs a script invocation within the operation bound.
    async fn run(&self, inv: &ScriptInvocation<'_>) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conn.clone();
        let call = async {
            match &mut conn {
                Conn::Single(c) => inv.invoke_async::<Vec<Value>>(c).await,
                Conn::Cluster(c) => inv.invoke_async::<Vec<Value>>(c).await,
            }
        };
        self.bounded(call).await
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.op_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            // The error names the failure kind, never the URL (it may hold
            // a password).
            Ok(Err(err)) => Err(StoreError::Unavailable(format!("redis: {err}"))),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {:?}",
                self.op_timeout
            ))),
        }
    }

    /// The keys of a route script and the caller floor to pass: on one node
    /// the script reads the caller key itself; on a cluster it is read
    /// first (another slot).
    async fn route_keys(&self, route: &RouteKey) -> Result<(Vec<String>, i64, i64), StoreError> {
        let route_key = self.route_key(route);
        let caller_key = self.caller_key(&route.caller_scope);
        if !self.clustered() {
            return Ok((vec![route_key, caller_key], 0, 0));
        }
        let mut inv = SCRIPTS.caller.prepare_invoke();
        inv.key(&caller_key);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok((vec![route_key], reply.int(1)?, reply.int(2)?))
    }

    /// Whether Redis answers PING now.
    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let call = async {
            match &mut conn {
                Conn::Single(c) => redis::cmd("PING").query_async::<String>(c).await,
                Conn::Cluster(c) => redis::cmd("PING").query_async::<String>(c).await,
            }
        };
        self.bounded(call).await.map(drop)
    }

    /// Applies the idle rule to every key under the prefix, on every
    /// primary of a cluster (key expiry does the same in Redis's own time;
    /// this sweep applies it in the coordinator's).
    async fn evict(&self, now_ms: i64, idle_ms: i64) -> Result<usize, StoreError> {
        match &self.conn {
            Conn::Single(conn) => self.evict_on(conn.clone(), now_ms, idle_ms).await,
            Conn::Cluster(_) => {
                let mut evicted = 0;
                for node in self.primary_nodes().await? {
                    evicted += self.evict_on(node, now_ms, idle_ms).await?;
                }
                Ok(evicted)
            }
        }
    }

    /// A connection to every healthy primary of a cluster (none for a
    /// single server): SCAN sees one node's keys only.
    async fn primary_nodes(&self) -> Result<Vec<redis::aio::MultiplexedConnection>, StoreError> {
        let Conn::Cluster(conn) = &self.conn else {
            return Ok(Vec::new());
        };
        let mut conn = conn.clone();
        let nodes: String = self
            .bounded(redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn))
            .await?;
        let mut out = Vec::new();
        for addr in primaries(&nodes) {
            // A node that never learned its own address lists it as
            // `:port`; that is the node that answered, the seed.
            let url = if addr.starts_with(':') {
                self.target.first_node().to_owned()
            } else {
                format!("redis://{addr}")
            };
            let client = redis::Client::open(url)
                .map_err(|err| StoreError::Unavailable(format!("redis: {err}")))?;
            out.push(
                self.bounded(client.get_multiplexed_async_connection())
                    .await?,
            );
        }
        Ok(out)
    }

    /// Every key matching `pattern`, on every primary.
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        match &self.conn {
            Conn::Single(conn) => self.scan_on(conn.clone(), pattern).await,
            Conn::Cluster(_) => {
                let mut keys = Vec::new();
                for node in self.primary_nodes().await? {
                    keys.extend(self.scan_on(node, pattern).await?);
                }
                Ok(keys)
            }
        }
    }

    async fn scan_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike + Send,
        pattern: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut cursor = 0u64;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .bounded(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query_async(&mut conn),
                )
                .await?;
            out.extend(keys);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// The route a route key names (the inverse of `route_key`); `None`
    /// for a key that is not one.
    fn route_of(&self, key: &str) -> Option<RouteKey> {
        let inner = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix("}:r")?;
        let (caller, route) = inner.split_once('|')?;
        Some(RouteKey {
            caller_scope: unescape(caller)?,
            route: unescape(route)?,
        })
    }

    /// Runs `detail.lua`: the route's summary and, with a policy, its
    /// budget and hints; `None` when Redis holds nothing for the route.
    async fn detail_reply(
        &self,
        keys: &[String],
        caller: (i64, i64),
        policy: Option<&Policy>,
        now_ms: i64,
    ) -> Result<Option<Reply>, StoreError> {
        let mut inv = SCRIPTS.detail.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        inv.arg(caller.0)
            .arg(caller.1)
            .arg(now_ms)
            .arg(u8::from(policy.is_some()));
        if let Some(policy) = policy {
            inv.arg(policy.window_secs)
                .arg(policy.floor_milli_per_sec)
                .arg(policy.ratio_milli)
                .arg(
                    policy
                        .ceiling_per_window
                        .map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX)),
                );
            for priority in Priority::ALL {
                inv.arg(policy.share(priority));
            }
        }
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok((reply.int(1)? == 1).then_some(reply))
    }

    /// Each route key is read by its own script after a SCAN (see
    /// [`Store::list_scopes`] on this store for what that guarantees).
    async fn list_now(
        &self,
        filter: &ScopeFilter,
        after: Option<&RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> Result<ScopePage, StoreError> {
        let pattern = format!("{}:{{*}}:r", self.prefix);
        let mut routes: Vec<RouteKey> = self
            .scan(&pattern)
            .await?
            .iter()
            .filter_map(|key| self.route_of(key))
            .filter(|k| {
                filter.caller_scope.matches(&k.caller_scope)
                    && filter.route.matches(&k.route)
                    && after.is_none_or(|a| k > a)
            })
            .collect();
        // SCAN may return a key more than once.
        routes.sort_unstable();
        routes.dedup();
        let mut scopes = Vec::new();
        let mut more = false;
        for route in routes {
            let (keys, ccd, cfloor) = self.route_keys(&route).await?;
            // Gone since the scan (expired or evicted): not listed.
            let Some(reply) = self
                .detail_reply(&keys, (ccd, cfloor), None, now_ms)
                .await?
            else {
                continue;
            };
            let summary = summary_of(&route, &reply)?;
            if filter.frozen_only && summary.view.frozen.is_none() {
                continue;
            }
            if scopes.len() == limit {
                more = true;
                break;
            }
            scopes.push(summary);
        }
        let next = if more {
            scopes.last().map(|s: &ScopeSummary| s.route.clone())
        } else {
            None
        };
        Ok(ScopePage { scopes, next })
    }

    async fn detail_now(
        &self,
        route: &RouteKey,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Option<ScopeDetail>, StoreError> {
        let mut inv = SCRIPTS.caller_detail.prepare_invoke();
        inv.key(self.caller_key(&route.caller_scope));
        let caller = Reply::ok(self.run(&inv).await?)?;
        let (ccd, cfloor) = (caller.int(1)?, caller.int(2)?);
        let keys = [self.route_key(route)];
        let Some(r) = self
            .detail_reply(&keys, (ccd, cfloor), Some(policy), now_ms)
            .await?
        else {
            return Ok(None);
        };
        let summary = summary_of(route, &r)?;
        let class = |p: usize| -> Result<ClassSnapshot, StoreError> {
            let at = 10 + 4 * p;
            Ok(ClassSnapshot {
                allowance_milli: unsigned(r.int(at)?),
                spent_milli: unsigned(r.int(at + 1)?),
                available_milli: unsigned(r.int(at + 2)?),
                active_workers: count(r.int(at + 3)?),
            })
        };
        let budget = BudgetSnapshot {
            first_attempts: unsigned(r.int(8)?),
            allowance_milli: unsigned(r.int(9)?),
            classes: [class(0)?, class(1)?, class(2)?],
            leases_outstanding: summary.leases_outstanding,
            tokens_outstanding: unsigned(r.int(22)?),
        };
        Ok(Some(ScopeDetail {
            summary,
            budget,
            route_cooldown_until_ms: r.int(23)?,
            caller_cooldown_until_ms: ccd,
            backoff_step: u8::try_from(r.int(24)?).unwrap_or(u8::MAX),
            route_hints: hints_at(&r, 25)?,
            caller_hints: hints_at(&caller, 3)?,
        }))
    }

    async fn reset_now(&self, route: &RouteKey, now_ms: i64) -> Result<bool, StoreError> {
        let mut inv = SCRIPTS.reset.prepare_invoke();
        inv.key(self.route_key(route)).arg(now_ms).arg(self.idle_ms);
        Ok(Reply::ok(self.run(&inv).await?)?.int(1)? == 1)
    }

    async fn evict_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike + Send,
        now_ms: i64,
        idle_ms: i64,
    ) -> Result<usize, StoreError> {
        let pattern = format!("{}:{{*", self.prefix);
        let mut cursor = 0u64;
        let mut evicted = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .bounded(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query_async(&mut conn),
                )
                .await?;
            for key in keys {
                let mut inv = SCRIPTS.evict.prepare_invoke();
                inv.key(&key)
                    .arg(now_ms)
                    .arg(idle_ms)
                    .arg(u8::from(key.ends_with(":r")));
                let gone: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
                evicted += usize::from(gone == 1);
            }
            if next == 0 {
                return Ok(evicted);
            }
            cursor = next;
        }
    }

    async fn lease_now(
        &self,
        scope: &ScopeKey,
        ask: GrantAsk<'_>,
        policy: &Policy,
    ) -> Result<LeaseOutcome, StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(&scope.route).await?;
        let id = format!(
            "{:016x}-{:x}",
            self.lease_nonce,
            self.next_lease.fetch_add(1, Ordering::Relaxed)
        );
        let mut inv = SCRIPTS.lease.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(ccd)
            .arg(cfloor)
            .arg(ask.now_ms)
            .arg(self.idle_ms)
            .arg(ask.worker_id)
            .arg(ask.priority.index() + 1)
            .arg(ask.want)
            .arg(&id)
            .arg(policy.window_secs)
            .arg(policy.floor_milli_per_sec)
            .arg(policy.ratio_milli)
            .arg(
                policy
                    .ceiling_per_window
                    .map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX)),
            )
            .arg(policy.cost(ask.retry_class).max(1))
            .arg(policy.share(ask.priority))
            .arg(policy.lease_ttl_ms);
        let reply = Reply::ok(self.run(&inv).await?)?;
        let granted = u32::try_from(reply.int(1)?).unwrap_or(0);
        let limit = match reply.int(2)? {
            0 => GrantLimit::None,
            1 => GrantLimit::BudgetExhausted,
            2 => GrantLimit::FairShare,
            _ => GrantLimit::Frozen,
        };
        let lease_id = reply.text(5).filter(|id| !id.is_empty());
        Ok(LeaseOutcome {
            lease_id,
            grant: Grant {
                granted,
                limit,
                remaining: u64::try_from(reply.int(3)?).unwrap_or(0),
                expires_at_ms: reply.int(4)?,
            },
            view: ScopeView {
                cooldown_until_ms: reply.int(6)?,
                floor_ms: reply.int(7)?,
                frozen: reply.text(8),
            },
        })
    }

    async fn release_now(
        &self,
        scope: &ScopeKey,
        worker_id: &str,
        lease_id: &str,
        spent: u32,
        now_ms: i64,
    ) -> Result<u32, StoreError> {
        let mut inv = SCRIPTS.release.prepare_invoke();
        inv.key(self.route_key(&scope.route))
            .arg(now_ms)
            .arg(self.idle_ms)
            .arg(worker_id)
            .arg(lease_id)
            .arg(spent);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok(u32::try_from(reply.int(1)?).unwrap_or(0))
    }

    async fn deposit_now(
        &self,
        scope: &ScopeKey,
        worker_id: &str,
        first_attempts: u32,
        successes: u32,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let caller_key = self.caller_key(&scope.route.caller_scope);
        if successes > 0 && self.clustered() {
            let mut inv = SCRIPTS.decay_caller.prepare_invoke();
            inv.key(&caller_key);
            Reply::ok(self.run(&inv).await?)?;
        }
        let mut inv = SCRIPTS.deposit.prepare_invoke();
        inv.key(self.route_key(&scope.route));
        if !self.clustered() {
            inv.key(&caller_key);
        }
        inv.arg(now_ms)
            .arg(self.idle_ms)
            .arg(worker_id)
            .arg(scope.priority.index() + 1)
            .arg(first_attempts)
            .arg(successes)
            .arg(policy.window_secs);
        Reply::ok(self.run(&inv).await?).map(drop)
    }

    async fn merge_now(
        &self,
        level: &EvidenceLevel,
        a: &Assessment,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Merge, StoreError> {
        let (key, is_route) = match level {
            EvidenceLevel::Route(route) => (self.route_key(route), 1),
            EvidenceLevel::Caller(caller) => (self.caller_key(caller), 0),
        };
        let mut inv = SCRIPTS.merge.prepare_invoke();
        inv.key(key)
            .arg(now_ms)
            .arg(self.idle_ms)
            .arg(is_route)
            .arg(a.cooldown_until_ms.unwrap_or(-1))
            .arg(u8::from(a.widen_backoff))
            .arg(a.anchor_ms)
            .arg(policy.backoff_base_ms)
            .arg(policy.backoff_max_ms)
            .arg(a.raw.as_deref().unwrap_or(""))
            .arg(u8::from(a.raw.is_some()))
            .arg(a.form.as_str())
            .arg(u8::from(a.valid))
            .arg(u8::from(a.capped))
            .arg(u8::from(a.clock_skew));
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok(Merge {
            raised: reply.int(1)? == 1,
            cooldown_until_ms: reply.int(2)?,
            backoff_ms: u64::try_from(reply.int(3)?).unwrap_or(0),
        })
    }

    async fn reconsider_now(
        &self,
        route: &RouteKey,
        ask: SlotAsk<'_>,
        policy: &Policy,
    ) -> Result<(Reconsidered, ScopeView), StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(route).await?;
        let mut inv = SCRIPTS.reconsider.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(ccd)
            .arg(cfloor)
            .arg(ask.now_ms)
            .arg(self.idle_ms)
            .arg(ask.intent_id)
            .arg(ask.floor_ms)
            .arg(ask.deadline_ms)
            .arg(ask.reserve_ms)
            .arg(ask.jitter_ppm)
            .arg(policy.wake_rate_per_sec);
        let reply = Reply::ok(self.run(&inv).await?)?;
        let at = reply.int(2)?;
        let decided = match reply.text(1).as_deref() {
            Some("slot") => Reconsidered::Slot(at),
            Some("infeasible") => Reconsidered::DeadlineInfeasible(at),
            _ => Reconsidered::Frozen,
        };
        Ok((
            decided,
            ScopeView {
                cooldown_until_ms: reply.int(3)?,
                floor_ms: reply.int(4)?,
                frozen: reply.text(5),
            },
        ))
    }

    async fn view_now(&self, route: &RouteKey) -> Result<ScopeView, StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(route).await?;
        let mut inv = SCRIPTS.view.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(ccd).arg(cfloor);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok(ScopeView {
            cooldown_until_ms: reply.int(1)?,
            floor_ms: reply.int(2)?,
            frozen: reply.text(3),
        })
    }

    async fn freeze_now(
        &self,
        route: &RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut inv = SCRIPTS.freeze.prepare_invoke();
        inv.key(self.route_key(route))
            .arg(now_ms)
            .arg(self.idle_ms)
            .arg(u8::from(reason.is_some()))
            .arg(reason.unwrap_or_default());
        Reply::ok(self.run(&inv).await?).map(drop)
    }
}

/// The `host:port` of every healthy primary in a `CLUSTER NODES` reply.
fn primaries(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = fields.nth(1)?;
            let flags = fields.next()?;
            let primary = flags.split(',').any(|f| f == "master")
                && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
            primary.then(|| addr.split('@').next().unwrap_or(addr).to_owned())
        })
        .collect()
}

/// Percent-encodes the characters that delimit a key's parts or its hash
/// tag, so names are kept apart exactly.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' | '{' | '}' | '|' | ':' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`]; `None` for a malformed name.
fn unescape(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// The summary fields every `detail.lua` reply opens with.
fn summary_of(route: &RouteKey, r: &Reply) -> Result<ScopeSummary, StoreError> {
    Ok(ScopeSummary {
        route: route.clone(),
        view: ScopeView {
            cooldown_until_ms: r.int(2)?,
            floor_ms: r.int(3)?,
            frozen: r.text(4),
        },
        leases_outstanding: count(r.int(5)?),
        waiting: count(r.int(6)?),
        last_touched_ms: r.int(7)?,
    })
}

/// A hint ring written by the prelude's `hints_out` from field `at`.
fn hints_at(r: &Reply, at: usize) -> Result<Vec<HintRecord>, StoreError> {
    (0..count(r.int(at)?))
        .map(|i| {
            let f = at + 1 + 7 * i;
            let form = match r.text(f + 2).as_deref() {
                Some("delay") => HintForm::Delay,
                Some("date") => HintForm::Date,
                Some("pushback") => HintForm::Pushback,
                Some("absent") => HintForm::Absent,
                _ => HintForm::Invalid,
            };
            Ok(HintRecord {
                at_ms: r.int(f)?,
                raw: r.text(f + 1),
                form,
                valid: r.int(f + 3)? == 1,
                capped: r.int(f + 4)? == 1,
                clock_skew: r.int(f + 5)? == 1,
                cooldown_until_ms: Some(r.int(f + 6)?).filter(|&cd| cd >= 0),
            })
        })
        .collect()
}

/// A script's reply: `{'ok', …}` or `{'err', reason, …}`.
struct Reply(Vec<Value>);

impl Reply {
    /// Turns an `err` reply into the refusal it names.
    fn ok(values: Vec<Value>) -> Result<Reply, StoreError> {
        let reply = Reply(values);
        match reply.text(0).as_deref() {
            Some("ok") => Ok(reply),
            Some("err") => Err(match reply.text(1).as_deref() {
                Some("lease_not_found") => BudgetError::LeaseNotFound.into(),
                Some("spent_exceeds_grant") => BudgetError::SpentExceedsGrant {
                    spent: 0,
                    granted: u32::try_from(reply.int(2).unwrap_or(0)).unwrap_or(0),
                }
                .into(),
                Some("too_many_leases") => BudgetError::TooManyLeases.into(),
                Some("too_many_waiting") => SlotError::TooManyWaiting.into(),
                other => StoreError::Unavailable(format!("redis script refused: {other:?}")),
            }),
            _ => Err(StoreError::Unavailable(
                "redis script gave an unexpected reply".into(),
            )),
        }
    }

    fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.0.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(Value::Nil) => Ok(0),
            _ => Err(StoreError::Unavailable(format!(
                "redis script reply: field {i} is not an integer"
            ))),
        }
    }

    /// A string field; `None` for Lua `false` (a nil reply).
    fn text(&self, i: usize) -> Option<String> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        }
    }
}

impl Store for RedisStore {
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome> {
        Box::pin(self.lease_now(scope, ask, policy))
    }

    fn release<'a>(
        &'a self,
        scope: &'a ScopeKey,
        worker_id: &'a str,
        lease_id: &'a str,
        spent: u32,
        now_ms: i64,
    ) -> StoreFuture<'a, u32> {
        Box::pin(async move {
            self.release_now(scope, worker_id, lease_id, spent, now_ms)
                .await
                .map_err(|err| match err {
                    // The script knows the grant; the service knows `spent`.
                    StoreError::Budget(BudgetError::SpentExceedsGrant { granted, .. }) => {
                        BudgetError::SpentExceedsGrant { spent, granted }.into()
                    }
                    other => other,
                })
        })
    }

    fn deposit<'a>(
        &'a self,
        scope: &'a ScopeKey,
        worker_id: &'a str,
        first_attempts: u32,
        successes: u32,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.deposit_now(scope, worker_id, first_attempts, successes, policy, now_ms))
    }

    fn merge_evidence<'a>(
        &'a self,
        level: &'a EvidenceLevel,
        assessment: &'a Assessment,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Merge> {
        Box::pin(self.merge_now(level, assessment, policy, now_ms))
    }

    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, (Reconsidered, ScopeView)> {
        Box::pin(self.reconsider_now(route, ask, policy))
    }

    fn view<'a>(&'a self, route: &'a RouteKey, _now_ms: i64) -> StoreFuture<'a, ScopeView> {
        Box::pin(self.view_now(route))
    }

    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.freeze_now(route, reason, now_ms))
    }

    /// SCANs the prefix's route keys (every primary of a cluster), keeps
    /// those the filter's names match after `after`, sorts them, and reads
    /// each in key order with one read-only script until `limit` (and one
    /// more, to know whether a next page exists) have matched.
    ///
    /// Consistency: each summary is atomic for its route (and, on one
    /// node, its caller scope's cooldown), but a page is not a snapshot:
    /// a route created during the SCAN may be missing, one that expired
    /// after it is skipped, and summaries are read at slightly different
    /// instants. Paging by key stays correct across pages (no route is
    /// listed twice). Every page SCANs the whole prefix: an operator's
    /// read, never on the request path.
    fn list_scopes<'a>(
        &'a self,
        filter: &'a ScopeFilter,
        after: Option<&'a RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> StoreFuture<'a, ScopePage> {
        Box::pin(self.list_now(filter, after, limit, now_ms))
    }

    /// Two read-only scripts: the caller scope's hints, then the route's
    /// state with its budget at `policy` (computed by the prelude's budget
    /// code on the decoded copy; nothing is written, so looking does not
    /// keep a route alive). Each is atomic; the pair is not — a caller-wide
    /// cooldown merged between them shows in one read and not the other.
    fn scope_detail<'a>(
        &'a self,
        route: &'a RouteKey,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<ScopeDetail>> {
        Box::pin(self.detail_now(route, policy, now_ms))
    }

    /// One script (`reset.lua`), atomic like every state change.
    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool> {
        Box::pin(self.reset_now(route, now_ms))
    }

    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        Box::pin(self.evict(now_ms, idle_ms))
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.ping())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Fixture;
    use crate::testing::RedisServer;

    async fn make() -> Option<Fixture> {
        let server = RedisServer::start()?;
        let store = RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions {
                idle_ttl: Duration::from_secs(60),
                ..RedisOptions::default()
            },
        )
        .await
        .expect("connect");
        Some(Fixture::new(store, server))
    }

    crate::store::contract_tests!(make);

    /// The same contract on a (one-node) Redis Cluster, where the caller
    /// key is read apart from the route's. One server for every case: a
    /// cluster node takes ~2 s to start serving.
    mod cluster {
        use super::*;
        use std::sync::Arc;

        async fn make() -> Option<Fixture> {
            let server = RedisServer::start_cluster()?;
            let store = RedisStore::connect(
                RedisTarget::parse(&server.url()).expect("url"),
                RedisOptions {
                    idle_ttl: Duration::from_secs(60),
                    ..RedisOptions::default()
                },
            )
            .await
            .expect("connect");
            assert!(store.clustered());
            let server = Arc::new(server);
            let flush = Arc::clone(&server);
            Some(Fixture::new(store, server).with_reset(move || flush.flush()))
        }

        crate::store::contract_tests!(one_fixture make);
    }

    /// `list_scopes` reads routes back from their keys.
    #[tokio::test]
    async fn route_keys_decode_back_to_their_routes() {
        let store = RedisStore::connect(
            RedisTarget::parse("redis://127.0.0.1:1").expect("url"),
            RedisOptions::default(),
        )
        .await
        .expect("a lazy connection");
        for (caller, route) in [("c", "GET /a"), ("{x}|%", "a:b|c}"), ("ü", "")] {
            let key = RouteKey {
                caller_scope: caller.into(),
                route: route.into(),
            };
            assert_eq!(store.route_of(&store.route_key(&key)), Some(key));
        }
        assert_eq!(store.route_of("tollgate:{c}:c"), None);
        assert_eq!(store.route_of("other:{c|r}:r"), None);
        assert_eq!(unescape("%ZZ"), None);
    }

    #[test]
    fn names_cannot_collide_or_break_the_hash_tag() {
        assert_eq!(escape("a|b"), "a%7Cb");
        assert_eq!(escape("{x}:%"), "%7Bx%7D%3A%25");
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:1, b:2").expect("cluster"),
            RedisTarget::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert!(RedisTarget::parse("http://x").is_err());
    }

    #[test]
    fn only_healthy_primaries_are_swept() {
        let nodes = "a 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b 10.0.0.2:7001@17001 slave a 0 0 1 connected\n\
                     c 10.0.0.3:7002@17002 master,fail - 0 0 2 connected\n\
                     d :7003@17003 master - 0 0 3 connected 5461-16383\n";
        assert_eq!(primaries(nodes), ["10.0.0.1:7000", ":7003"]);
    }
}
