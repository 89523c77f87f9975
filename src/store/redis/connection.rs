//! Where the Redis store lives and how it is reached: the target parsed
//! from `--store`, the connection that reconnects by itself, the bound on
//! every operation, and the walks over every primary of a cluster (SCAN,
//! eviction) that a single connection cannot do.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Value};

use crate::store::StoreError;

use super::RedisStore;
use super::scripts::{Call, SCRIPTS};
use super::sentinel::{SentinelConn, SentinelTarget};

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
    /// `redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE`: a primary that
    /// Sentinels fail over; the primary is asked for again after a failure.
    Sentinel(SentinelTarget),
}

impl RedisTarget {
    /// Parses `redis://…`, `rediss://…`, `redis+cluster://h1:p1,h2:p2` or
    /// `redis+sentinel://h1:p1,h2:p2/SERVICE`.
    pub fn parse(url: &str) -> Result<RedisTarget, RedisSetupError> {
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (nodes, service) = rest.rsplit_once('/').unwrap_or((rest, ""));
            let sentinels: Vec<String> = nodes
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if sentinels.is_empty() || service.is_empty() {
                return Err(RedisSetupError::Url(
                    "redis+sentinel:// needs HOST:PORT[,HOST:PORT…]/SERVICE".into(),
                ));
            }
            return Ok(RedisTarget::Sentinel(SentinelTarget {
                sentinels,
                service: service.to_owned(),
            }));
        }
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
            "expected redis://HOST:PORT[/DB], redis+cluster://HOST:PORT[,HOST:PORT…] or redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE".into(),
        ))
    }

    /// The seed node a cluster's walks fall back to.
    pub(super) fn first_node(&self) -> &str {
        match self {
            RedisTarget::Single(url) => url,
            RedisTarget::Cluster(nodes) => nodes.first().map_or("", String::as_str),
            RedisTarget::Sentinel(t) => t.sentinels.first().map_or("", String::as_str),
        }
    }

    /// A client for the node Watch pub/sub, admin notices and the clock
    /// use: the server; a cluster's first seed node (any node carries
    /// PUBLISH to all of them); the primary the Sentinels name now (asked
    /// again on each reconnect, so pub/sub follows a failover).
    pub async fn primary_client(&self) -> Result<redis::Client, redis::RedisError> {
        match self {
            RedisTarget::Sentinel(t) => t.primary().await,
            other => redis::Client::open(other.first_node()),
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
    /// Each caller token entry's name and scope quota: what a token may
    /// hold of the scopes every replica shares (empty: no quotas, as in
    /// open dev mode).
    pub tenants: crate::tenancy::TenantLimits,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "tollgate".into(),
            idle_ttl: Duration::from_secs(600),
            op_timeout: Duration::from_millis(500),
            tenants: crate::tenancy::TenantLimits::default(),
        }
    }
}

/// A connection that reconnects by itself; cheap to clone per call.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
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
            RedisTarget::Sentinel(t) => Conn::Sentinel(SentinelConn::new(
                t.clone(),
                AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(io_timeout))
                    .set_response_timeout(Some(io_timeout)),
            )),
        };
        Ok(RedisStore {
            conn,
            target,
            prefix: options.prefix,
            idle_ms: i64::try_from(options.idle_ttl.as_millis()).unwrap_or(i64::MAX),
            op_timeout: options.op_timeout,
            queue: OnceLock::new(),
            turns: Default::default(),
            last_read: Default::default(),
            format_checked: AtomicBool::new(false),
            refused: OnceLock::new(),
            quotas: super::quota::Quotas::new(options.tenants),
        })
    }

    /// Where this store lives (for the Watch relay and the clock).
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    pub(super) fn clustered(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs a library function's call within the operation bound.
    pub(super) async fn run(&self, inv: &Call) -> Result<Vec<Value>, StoreError> {
        self.claimed().await?;
        run_on(&self.conn, inv, self.op_timeout).await
    }

    /// What every call to a library function asks first: the prefix is
    /// this build's. A store whose format was not claimed yet (Redis did
    /// not answer at start) claims it now, before the call writes scope
    /// keys: a claim made after them would find state with no format
    /// named and refuse this store's own keys as another build's. Once
    /// refused, the refusal.
    pub(super) async fn claimed(&self) -> Result<(), StoreError> {
        if !self.format_checked.load(Ordering::Acquire) {
            self.claim_format().await?;
        }
        match self.refused.get() {
            Some(reason) => Err(super::format::refusal(reason)),
            None => Ok(()),
        }
    }

    pub(super) async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        bounded(self.op_timeout, call).await
    }

    /// Whether Redis answers PING now.
    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        self.query::<String>(&redis::cmd("PING")).await.map(drop)
    }

    /// One plain command, within the operation bound.
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let call = async {
            match &mut conn {
                Conn::Single(c) => cmd.query_async::<T>(c).await,
                Conn::Cluster(c) => cmd.query_async::<T>(c).await,
                Conn::Sentinel(c) => cmd.query_async::<T>(c).await,
            }
        };
        self.bounded(call).await
    }

    /// Applies the idle rule to every key under the prefix, on every
    /// primary of a cluster (key expiry does the same in Redis's own time;
    /// this sweep applies it in the coordinator's).
    pub(super) async fn evict(&self, now_ms: i64, idle_ms: i64) -> Result<usize, StoreError> {
        match &self.conn {
            Conn::Single(conn) => self.evict_on(conn.clone(), now_ms, idle_ms).await,
            Conn::Sentinel(conn) => self.evict_on(conn.clone(), now_ms, idle_ms).await,
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
    pub(super) async fn primary_nodes(
        &self,
    ) -> Result<Vec<redis::aio::MultiplexedConnection>, StoreError> {
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
    pub(super) async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        match &self.conn {
            Conn::Single(conn) => self.scan_on(conn.clone(), pattern).await,
            Conn::Sentinel(conn) => self.scan_on(conn.clone(), pattern).await,
            Conn::Cluster(_) => {
                let mut keys = Vec::new();
                for node in self.primary_nodes().await? {
                    keys.extend(self.scan_on(node, pattern).await?);
                }
                Ok(keys)
            }
        }
    }

    pub(super) async fn scan_on(
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

    pub(super) async fn evict_on(
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
                // Route (`:r`) and caller (`:c`) values; a route's lease
                // keys go with it (and expire with their last lease).
                let is_route = key.ends_with(":r");
                if !is_route && !key.ends_with(":c") {
                    continue;
                }
                let mut inv = SCRIPTS.evict.call(&[&key]);
                inv.arg(now_ms).arg(idle_ms).arg(u8::from(is_route));
                let gone: i64 = self.bounded(inv.query(&mut conn)).await?;
                evicted += usize::from(gone == 1);
            }
            if next == 0 {
                return Ok(evicted);
            }
            cursor = next;
        }
    }
}

/// Runs `inv` on `conn` within `op_timeout`.
pub(super) async fn run_on<T: FromRedisValue>(
    conn: &Conn,
    inv: &Call,
    op_timeout: Duration,
) -> Result<T, StoreError> {
    let mut conn = conn.clone();
    let call = async {
        match &mut conn {
            Conn::Single(c) => inv.query::<T>(c).await,
            Conn::Cluster(c) => inv.query::<T>(c).await,
            Conn::Sentinel(c) => inv.query::<T>(c).await,
        }
    };
    bounded(op_timeout, call).await
}

/// `call` within `op_timeout`; any failure is [`StoreError::Unavailable`].
pub(super) async fn bounded<T>(
    op_timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(op_timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        // The error names the failure kind, never the URL (it may hold
        // a password).
        Ok(Err(err)) => Err(StoreError::Unavailable(format!("redis: {err}"))),
        Err(_) => Err(StoreError::Unavailable(format!(
            "redis did not answer within {op_timeout:?}"
        ))),
    }
}

/// The `host:port` of every healthy primary in a `CLUSTER NODES` reply.
pub(super) fn primaries(nodes: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_single_and_cluster_urls() {
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:1, b:2").expect("cluster"),
            RedisTarget::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert!(RedisTarget::parse("http://x").is_err());
        assert_eq!(
            RedisTarget::parse("redis+sentinel://a:1,b:2/main").expect("sentinel"),
            RedisTarget::Sentinel(SentinelTarget {
                sentinels: vec!["redis://a:1".into(), "redis://b:2".into()],
                service: "main".into(),
            })
        );
        assert!(RedisTarget::parse("redis+sentinel://a:1").is_err());
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
