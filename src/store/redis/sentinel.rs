//! A primary behind Redis Sentinel (`redis+sentinel://…/SERVICE`): the
//! connection asks the Sentinels which node is the primary, uses it until
//! a call fails, then asks again — so a failover costs the calls that fail
//! while it happens (answered UNAVAILABLE, within the operation bound) and
//! never a restart.
//!
//! A failed call drops the connection whatever the failure: a dead primary
//! refuses connections, but a demoted one still answers, with READONLY
//! errors, and both mean "ask the Sentinels again".

use std::sync::Arc;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Where the Sentinels are and which primary they watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The Sentinels, as `redis://HOST:PORT`.
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary under.
    pub service: String,
}

impl SentinelTarget {
    /// A client for the node the Sentinels name as the primary now.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        SentinelClient::build(
            self.sentinels.clone(),
            self.service.clone(),
            None,
            SentinelServerType::Master,
        )?
        .async_get_client()
        .await
    }
}

/// A connection to the current primary, found again after a failure.
#[derive(Clone)]
pub(super) struct SentinelConn {
    target: SentinelTarget,
    config: AsyncConnectionConfig,
    /// The connection in use; `None` after a failure, until the next call
    /// asks the Sentinels again. Shared by every clone, like a
    /// `ConnectionManager`'s.
    current: Arc<tokio::sync::Mutex<Option<MultiplexedConnection>>>,
}

impl SentinelConn {
    /// A lazy connection: the first call finds the primary.
    pub(super) fn new(target: SentinelTarget, config: AsyncConnectionConfig) -> Self {
        SentinelConn {
            target,
            config,
            current: Arc::default(),
        }
    }

    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let mut current = self.current.lock().await;
        if let Some(conn) = &*current {
            return Ok(conn.clone());
        }
        let conn = self
            .target
            .primary()
            .await?
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *current = Some(conn.clone());
        Ok(conn)
    }

    async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let answer = self.connection().await?.req_packed_command(cmd).await;
            if answer.is_err() {
                self.forget().await;
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let answer = self
                .connection()
                .await?
                .req_packed_commands(pipeline, offset, count)
                .await;
            if answer.is_err() {
                self.forget().await;
            }
            answer
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
