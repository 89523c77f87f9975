//! Leases on one Redis node sent together: the Leases that arrive while
//! earlier ones are in flight go to Redis in one `FCALL`
//! (`lua/lease_batch.lua`), which runs each as `lease.lua` alone would, in
//! the order they came. Each stays one atomic state change; what a batch
//! saves is per call, on both sides: Redis reads, dispatches and answers
//! one command instead of many, and the coordinator sends, parses and
//! wakes on one, so concurrent Leases finish together (and their gRPC
//! answers leave together) instead of one by one.
//!
//! A Lease never waits for company: one that finds fewer than
//! [`IN_FLIGHT`] batches in flight leaves at once, alone if it is alone.
//! On a Redis Cluster each Lease goes alone (its keys' slot is its own).
//!
//! A Lease whose script answers that the counts moved (`lease`) comes
//! back through the queue like any other: a batch holds no state between
//! its Leases.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::store::StoreError;

use super::connection::{Conn, run_on};
use super::scripts::SCRIPTS;

/// Batches in flight at once: while one runs in Redis the next gathers
/// the Leases that arrive meanwhile.
const IN_FLIGHT: usize = 2;
/// Leases per batch at most (so one batch holds Redis for a bounded time).
const MAX_BATCH: usize = 64;

/// One Lease waiting to be sent: `lease.lua`'s keys and arguments.
pub(super) struct Queued {
    pub(super) keys: Vec<String>,
    pub(super) numbers: Vec<u8>,
    pub(super) worker: String,
    pub(super) id: String,
    /// The caller token entry a new route is charged to ('' for nobody).
    pub(super) owner: String,
    /// Where its reply goes: `lease.lua`'s, unparsed.
    pub(super) reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// The sending half; the task that drains it ends when it is dropped
/// (with its store).
pub(super) struct LeaseQueue {
    tx: mpsc::UnboundedSender<Queued>,
}

impl LeaseQueue {
    /// Starts the task that sends queued Leases on `conn`, each batch
    /// bounded by `op_timeout`.
    pub(super) fn start(conn: Conn, op_timeout: Duration) -> LeaseQueue {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drain(rx, conn, op_timeout));
        LeaseQueue { tx }
    }

    /// Sends `lease` with the next batch; its reply comes on the
    /// oneshot it carries.
    pub(super) fn push(&self, lease: Queued) -> Result<(), StoreError> {
        self.tx
            .send(lease)
            .map_err(|_| StoreError::Unavailable("redis lease queue stopped".into()))
    }
}

async fn drain(mut rx: mpsc::UnboundedReceiver<Queued>, conn: Conn, op_timeout: Duration) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Waiting for a batch to come back is when the next one gathers.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(lease) => batch.push(lease),
                Err(_) => break,
            }
        }
        let conn = conn.clone();
        tokio::spawn(async move {
            send(batch, &conn, op_timeout).await;
            drop(permit);
        });
    }
}

/// Sends one batch (a lone Lease as `lease.lua`) and hands each Lease its
/// reply.
async fn send(batch: Vec<Queued>, conn: &Conn, op_timeout: Duration) {
    let batch = match <[Queued; 1]>::try_from(batch) {
        Ok([one]) => {
            let mut call = SCRIPTS.lease.call(&one.keys);
            call.arg(&one.numbers[..])
                .arg(&one.worker)
                .arg(&one.id)
                .arg(&one.owner);
            // A caller that stopped waiting (its own bound) dropped it.
            let _ = one.reply.send(run_on(conn, &call, op_timeout).await);
            return;
        }
        Err(batch) => batch,
    };
    let keys: Vec<&str> = batch
        .iter()
        .flat_map(|l| l.keys.iter().map(String::as_str))
        .collect();
    let mut call = SCRIPTS.lease_batch.call(&keys);
    for lease in &batch {
        call.arg(lease.keys.len())
            .arg(&lease.numbers[..])
            .arg(&lease.worker)
            .arg(&lease.id)
            .arg(&lease.owner);
    }
    match run_on::<Vec<Value>>(conn, &call, op_timeout).await {
        Ok(replies) if replies.len() == batch.len() => {
            for (lease, reply) in batch.into_iter().zip(replies) {
                let _ = lease.reply.send(Ok(reply));
            }
        }
        Ok(_) => {
            for lease in batch {
                let _ = lease.reply.send(Err(StoreError::Unavailable(
                    "redis lease batch answered the wrong count".into(),
                )));
            }
        }
        Err(err) => {
            for lease in batch {
                let _ = lease.reply.send(Err(err.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::budget::{GrantAsk, LeaseEnd};
    use crate::policy::Policy;
    use crate::scope::{Priority, RetryClass, ScopeKey};
    use crate::store::redis::{RedisOptions, RedisStore, RedisTarget};
    use crate::store::{Store, StoreError, Tenant};
    use tollgate_testkit::RedisServer;

    const T0: i64 = 1_700_000_000_000;

    /// Leases sent at once go to Redis in few calls, and each is answered
    /// as if alone: granted, its own id, released once. One whose script
    /// fails (a route key holding something no version wrote) fails alone.
    #[tokio::test]
    async fn concurrent_leases_go_together_and_each_is_answered() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let store = Arc::new(
            RedisStore::connect(
                RedisTarget::parse(&server.url()).expect("url"),
                RedisOptions::default(),
            )
            .await
            .expect("connect"),
        );
        let mut conn = redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        // Claimed first, as `tollgate serve` does: a key written on an
        // unclaimed prefix would be taken for an older build's state.
        store.claim_format().await.expect("claimed");
        let broken = ScopeKey::new("c", "broken", Priority::Normal);
        let _: () = redis::cmd("SET")
            .arg(store.route_key(&broken.route))
            .arg("not a route")
            .query_async(&mut conn)
            .await
            .expect("set");
        let mut leases = tokio::task::JoinSet::new();
        for i in 0..48 {
            let store = Arc::clone(&store);
            let key = if i == 20 {
                broken.clone()
            } else {
                ScopeKey::new("c", &format!("r{}", i % 4), Priority::Normal)
            };
            leases.spawn(async move {
                let worker = format!("w{i}");
                let ask = GrantAsk {
                    worker_id: &worker,
                    priority: Priority::Normal,
                    retry_class: RetryClass::Transient,
                    want: 1,
                    now_ms: T0,
                    tenant: Tenant::NONE,
                };
                let out = store.lease(&key, ask, &Policy::default()).await;
                (key, worker, out)
            });
        }
        let (mut granted, mut failed) = (Vec::new(), Vec::new());
        while let Some(done) = leases.join_next().await {
            let (key, worker, out) = done.expect("task");
            match out {
                Ok(out) => granted.push((key, worker, out)),
                Err(err) => failed.push((key, err)),
            }
        }
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, broken);
        assert!(matches!(failed[0].1, StoreError::Unavailable(_)));
        assert_eq!(granted.len(), 47);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("info");
        let calls: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .expect("fcall stats");
        assert!(calls < 48, "{calls} calls for 48 leases");
        let mut ids = std::collections::BTreeSet::new();
        for (key, worker, out) in &granted {
            assert_eq!(out.grant.granted, 1);
            let id = out.lease_id.as_deref().expect("an id");
            assert!(ids.insert(id.to_owned()), "ids are unique");
            let end = LeaseEnd {
                worker_id: worker,
                lease_id: id,
                spent: 0,
                retry_successes: 0,
                now_ms: T0 + 1,
            };
            assert_eq!(store.release(key, end).await, Ok(1));
            assert!(store.release(key, end).await.is_err(), "once");
        }
    }
}
