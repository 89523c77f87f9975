//! The replicas' shared runtime control state in Redis
//! ([`ControlStateStore`]): one hash with the revision and the state
//! document, the audit list (newest first, bounded) and its sequence, all
//! under one hash tag so a commit is one script on one cluster slot, and a
//! notice channel.
//!
//! # Keys
//! - `PREFIX:admin:{PREFIX}:state` — hash: `rev`, `state` (JSON).
//! - `PREFIX:admin:{PREFIX}:audit` — list of audit records (JSON), newest
//!   first, trimmed to [`MEMORY_RECORDS`].
//! - `PREFIX:admin:{PREFIX}:seq` — the last audit sequence number.
//! - channel `PREFIX:admin` — the new revision after each commit.
//!
//! The keys do not start with `PREFIX:{`, so the sweeper's SCAN for scope
//! keys never meets them, and they have no expiry: an SRE's change lasts
//! until it is changed back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{FromRedisValue, Script, ScriptInvocation};
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tracing::{debug, warn};

use crate::store::{
    Committed, ControlSnapshot, ControlStateStore, MEMORY_RECORDS, StoreError, StoreFuture,
};

use super::RedisStore;
use super::connection::Conn;

struct AdminScripts {
    commit: Script,
    audit: Script,
}

static SCRIPTS: LazyLock<AdminScripts> = LazyLock::new(|| AdminScripts {
    commit: Script::new(include_str!("lua/admin_commit.lua")),
    audit: Script::new(include_str!("lua/admin_audit.lua")),
});

impl RedisStore {
    fn admin_key(&self, part: &str) -> String {
        format!("{p}:admin:{{{p}}}:{part}", p = self.prefix)
    }

    fn admin_channel(&self) -> String {
        format!("{}:admin", self.prefix)
    }

    async fn invoke<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let call = async {
            match &mut conn {
                Conn::Single(c) => inv.invoke_async::<T>(c).await,
                Conn::Cluster(c) => inv.invoke_async::<T>(c).await,
                Conn::Sentinel(c) => inv.invoke_async::<T>(c).await,
            }
        };
        self.bounded(call).await
    }

    async fn hmget(&self) -> Result<(Option<u64>, Option<String>), StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.admin_key("state")).arg("rev").arg("state");
        let call = async {
            match &mut conn {
                Conn::Single(c) => cmd.query_async(c).await,
                Conn::Cluster(c) => cmd.query_async(c).await,
                Conn::Sentinel(c) => cmd.query_async(c).await,
            }
        };
        self.bounded(call).await
    }

    async fn commit_now(
        &self,
        expected_rev: Option<u64>,
        state: &str,
        audit: &[String],
    ) -> Result<Option<Committed>, StoreError> {
        let mut inv = SCRIPTS.commit.prepare_invoke();
        inv.key(self.admin_key("state"))
            .key(self.admin_key("audit"))
            .key(self.admin_key("seq"))
            .arg(expected_rev.map(|r| r.to_string()).unwrap_or_default())
            .arg(state)
            .arg(self.admin_channel())
            .arg(MEMORY_RECORDS);
        for record in audit {
            inv.arg(record);
        }
        let reply: Vec<u64> = self.invoke(&inv).await?;
        if expected_rev == Some(0) && reply.first() == Some(&1) {
            // Shared state made from nothing: the first replica, or a Redis
            // that lost its data, format key included. Name the format
            // again before this replica's writes fill the prefix, or the
            // next replica to start would take them for an older build's.
            self.write_format().await?;
        }
        match reply.as_slice() {
            [1, rev, seqs @ ..] => Ok(Some(Committed {
                rev: *rev,
                seqs: seqs.to_vec(),
            })),
            [0, ..] => Ok(None),
            other => Err(StoreError::Unavailable(format!(
                "redis: unexpected admin commit reply {other:?}"
            ))),
        }
    }

    async fn subscribe_notices(&self, notify: Arc<Notify>) {
        let channel = self.admin_channel();
        let mut wait = Duration::from_millis(50);
        loop {
            let subscribed = async {
                let client = self.target.primary_client().await?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match subscribed.await {
                Ok(mut pubsub) => {
                    wait = Duration::from_millis(50);
                    // A (re)subscription may have missed notices: re-read.
                    notify.notify_one();
                    let mut messages = pubsub.on_message();
                    while messages.next().await.is_some() {
                        notify.notify_one();
                    }
                    warn!("admin state notices lost; resubscribing");
                }
                Err(err) => debug!(cause = %err, "admin state notices: redis unreachable"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }
}

impl ControlStateStore for RedisStore {
    fn revision(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move { Ok(self.hmget().await?.0.unwrap_or(0)) })
    }

    fn load(&self) -> StoreFuture<'_, Option<ControlSnapshot>> {
        Box::pin(async move {
            Ok(match self.hmget().await? {
                (Some(rev), Some(state)) => Some(ControlSnapshot { rev, state }),
                _ => None,
            })
        })
    }

    fn commit<'a>(
        &'a self,
        expected_rev: Option<u64>,
        state: &'a str,
        audit: &'a [String],
    ) -> StoreFuture<'a, Option<Committed>> {
        Box::pin(self.commit_now(expected_rev, state, audit))
    }

    fn audit(&self, before_seq: u64, limit: usize) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            let mut inv = SCRIPTS.audit.prepare_invoke();
            inv.key(self.admin_key("audit"))
                .key(self.admin_key("seq"))
                .arg(before_seq)
                .arg(limit);
            self.invoke(&inv).await
        })
    }

    fn notices(&self, notify: Arc<Notify>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.subscribe_notices(notify))
    }
}
