//! The shared store: scope state in Redis (or Redis Cluster), so coordinator
//! replicas are stateless and share one budget exactly.
//!
//! # One script per state change
//! Every [`Store`](crate::store::Store) operation is one server-side Lua script (EVALSHA, loaded
//! again on NOSCRIPT by [`redis::Script`]), so it is atomic without locks or
//! WATCH loops. The scripts (`lua/*.lua`, each prefixed by `lua/prelude.lua`)
//! are a port of the pure modules — [`crate::budget`], [`crate::hints`]'s
//! `HintState`, [`crate::slots`] — because a script cannot call Rust. The two
//! are necessarily parallel; the store contract suite (`contract_tests!`),
//! run against this store and the in-memory one, is the proof they agree.
//! The bounds both use (window, worker, lease and waiting limits, the hint
//! ring, the backoff cap) are written into the scripts from the Rust
//! constants, so those cannot drift.
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
//! - `scripts`: the Lua scripts, with the bounds they share with the Rust
//!   modules injected from the Rust constants.
//! - `reply`: decoding a script's reply into store types.
//! - `store`: [`RedisStore`] and its [`Store`](crate::store::Store) implementation, one script
//!   invocation per operation.
//! - `sentinel`: a primary behind Redis Sentinel, asked for again after a
//!   failure.
//! - `admin_state`: the replicas' shared runtime control state (policies,
//!   freezes, audit) with compare-and-set commits and change notices.

mod admin_state;
mod clock;
mod connection;
mod keys;
mod relay;
mod reply;
pub(crate) mod scripts;
mod sentinel;
mod store;

pub use clock::RedisClock;
pub use connection::{RedisOptions, RedisSetupError, RedisTarget};
pub use relay::EventRelay;
pub use sentinel::SentinelTarget;
pub use store::RedisStore;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::contract::Fixture;
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

    crate::store::contract::contract_tests!(make);

    /// A private Redis, a store on it, and a raw connection to rewrite keys
    /// the way an earlier version wrote them.
    async fn store_and_raw() -> Option<(RedisServer, RedisStore, redis::aio::MultiplexedConnection)>
    {
        let server = RedisServer::start()?;
        let store = RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions::default(),
        )
        .await
        .expect("connect");
        let conn = redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        Some((server, store, conn))
    }

    /// A route whose series earlier versions wrote as W-bucket rings (`b`)
    /// or as {second, value} pairs (`e`, and a worker's charges in `held`)
    /// is read as the same counts: a store upgraded in place keeps every
    /// budget window it had.
    #[tokio::test]
    async fn series_written_by_earlier_versions_read_the_same() {
        use crate::budget::GrantAsk;
        use crate::policy::Policy;
        use crate::scope::{Priority, RetryClass, ScopeKey};
        use crate::store::{ReportBatch, Store};

        let Some((_server, store, mut conn)) = store_and_raw().await else {
            return;
        };
        const T0: i64 = 1_700_000_000_000;
        let p = Policy::default();
        let ask = |now_ms| GrantAsk {
            worker_id: "w",
            priority: Priority::Normal,
            retry_class: RetryClass::Transient,
            want: 7,
            now_ms,
        };
        let (kept, rings, pairs) = (
            ScopeKey::new("c", "kept", Priority::Normal),
            ScopeKey::new("c", "rings", Priority::Normal),
            ScopeKey::new("c", "pairs", Priority::Normal),
        );
        // The same history on all three: first attempts over several
        // seconds and a lease.
        for key in [&kept, &rings, &pairs] {
            for s in 0..5 {
                let batch = ReportBatch {
                    worker_id: "w",
                    first_attempts: 40 + s,
                    successes: 40,
                    rejections: 0,
                    counts_age_ms: 0,
                    hints: &[],
                    now_ms: T0 + i64::from(s) * 1000,
                };
                store.report(key, batch, &p).await.expect("report");
            }
            store.lease(key, ask(T0 + 5_000), &p).await.expect("lease");
        }
        let ring = redis::Script::new(
            "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
             local function ring(s)
               local b = {}
               for i = 1, 60 do b[i] = 0 end
               for i = 1, #s.f, 2 do b[(s.f[i] % 60) + 1] = s.f[i + 1] end
               s.b, s.f = b, nil
             end
             ring(st.fa)
             for c = 1, 3 do ring(st.cls[c].spent) end
             redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
             return 1",
        );
        let pairs_form = redis::Script::new(
            "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
             local function pairs_of(f)
               local e = {}
               for i = 1, #f, 2 do e[#e + 1] = { f[i], f[i + 1] } end
               return e
             end
             st.fa.e, st.fa.f = pairs_of(st.fa.f), nil
             local charged = 0
             for c = 1, 3 do
               local cls = st.cls[c]
               cls.spent.e, cls.spent.f = pairs_of(cls.spent.f), nil
               for id, packed in pairs(cls.workers) do
                 local v = { struct.unpack('<' .. string.rep('d', #packed / 8), packed) }
                 local f = {}
                 for i = 4, #v - 1 do f[#f + 1] = v[i] end
                 charged = charged + #f
                 local lease = v[3]
                 if lease < 0 then lease = nil end
                 cls.workers[id] = { seen = v[1], unmet = v[2], lease = lease, held = pairs_of(f) }
               end
             end
             redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
             return charged",
        );
        let _: i64 = ring
            .key(store.route_key(&rings.route))
            .invoke_async(&mut conn)
            .await
            .expect("rewritten as rings");
        let charged: i64 = pairs_form
            .key(store.route_key(&pairs.route))
            .invoke_async(&mut conn)
            .await
            .expect("rewritten as pairs");
        assert!(charged > 0, "the lease charged its worker");
        let a = store
            .lease(&kept, ask(T0 + 6_000), &p)
            .await
            .expect("lease");
        let b = store
            .lease(&rings, ask(T0 + 6_000), &p)
            .await
            .expect("lease on the ring form");
        let c = store
            .lease(&pairs, ask(T0 + 6_000), &p)
            .await
            .expect("lease on the pairs form");
        assert_eq!(a.grant, c.grant);
        // The workers' charges too (what fairness weighs).
        let charges = redis::Script::new(
            "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
             local total = 0
             for c = 1, 3 do
               for _, packed in pairs(st.cls[c].workers) do
                 local v = { struct.unpack('<' .. string.rep('d', #packed / 8), packed) }
                 for i = 5, #v - 1, 2 do total = total + v[i] end
               end
             end
             return total",
        );
        let mut charged = Vec::new();
        for key in [&kept, &pairs] {
            let milli: i64 = charges
                .key(store.route_key(&key.route))
                .invoke_async(&mut conn)
                .await
                .expect("charges");
            charged.push(milli);
        }
        assert!(charged[0] > 0);
        assert_eq!(charged[0], charged[1], "charges read from pairs");
        assert_eq!(a.grant, b.grant);
        assert!(
            a.grant.granted > 0 && a.grant.remaining > 0,
            "{:?}",
            a.grant
        );
    }

    /// A Lease writes its record beside the route's value, so the value
    /// stays the same size however many leases are out; and leases an
    /// earlier version kept inside the value are released as before.
    #[tokio::test]
    async fn leases_live_beside_the_route_and_old_ones_move_out() {
        use crate::budget::{GrantAsk, LeaseEnd};
        use crate::policy::Policy;
        use crate::scope::{Priority, RetryClass, ScopeKey};
        use crate::store::Store;

        let Some((_server, store, mut conn)) = store_and_raw().await else {
            return;
        };
        const T0: i64 = 1_700_000_000_000;
        let p = Policy::default(); // 100 tokens a window: enough for 50
        let key = ScopeKey::new("c", "r", Priority::Normal);
        let route_key = store.route_key(&key.route);
        let lease = async |i: i64| {
            let ask = GrantAsk {
                worker_id: "w",
                priority: Priority::Normal,
                retry_class: RetryClass::Transient,
                want: 1,
                now_ms: T0 + i,
            };
            store.lease(&key, ask, &p).await.expect("lease")
        };
        let first = lease(0).await;
        let size = async |conn: &mut redis::aio::MultiplexedConnection| {
            redis::cmd("STRLEN")
                .arg(&route_key)
                .query_async::<i64>(conn)
                .await
                .expect("strlen")
        };
        let one = size(&mut conn).await;
        let mut last = first.clone();
        for i in 1..50 {
            last = lease(i).await;
        }
        assert_eq!(size(&mut conn).await, one, "50 leases out, the same value");
        assert!(last.lease_id.is_some());

        // The last lease as an earlier version kept it: inside the value.
        let id = last.lease_id.clone().expect("granted");
        let inline = redis::Script::new(
            "local base = string.sub(KEYS[1], 1, -2)
             local raw = redis.call('HGET', base .. 'l', ARGV[1])
             redis.call('HDEL', base .. 'l', ARGV[1])
             redis.call('ZREM', base .. 'e', ARGV[1])
             local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
             st.leases = { [ARGV[1]] = cmsgpack.unpack(raw) }
             st.lexp = nil
             redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
             return 1",
        );
        let _: i64 = inline
            .key(&route_key)
            .arg(&id)
            .invoke_async(&mut conn)
            .await
            .expect("written the old way");
        let end = |lease_id| LeaseEnd {
            worker_id: "w",
            lease_id,
            spent: 0,
            retry_successes: 0,
            now_ms: T0 + 100,
        };
        assert_eq!(store.release(&key, end(&id)).await, Ok(1), "moved out");
        assert!(store.release(&key, end(&id)).await.is_err(), "once");
        let first_id = first.lease_id.expect("granted");
        assert_eq!(store.release(&key, end(&first_id)).await, Ok(1));
    }

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

        crate::store::contract::contract_tests!(one_fixture make);
    }
}
