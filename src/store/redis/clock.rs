//! One clock for every replica: the local clock corrected by its offset to
//! the Redis server's `TIME`.
//!
//! Store scripts take `now_ms` as an argument (tests control it); replicas
//! agree on budgets, cooldowns and slots only if they pass the same `now`.
//! Rather than trust every host's NTP, each replica measures the offset of
//! Redis's clock to its own (the midpoint of a `TIME` round trip) and reads
//! `local + offset`, so skewed replicas agree to within a round trip.
//! Between measurements the local clock's rate is trusted, which is what it
//! is good at.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use tollgate_vocab::clock::{Clock, SystemClock, from_unix_ms, to_unix_ms};
use tracing::{info, warn};

use super::RedisTarget;

/// The local clock plus the last measured offset to Redis's `TIME`.
#[derive(Clone)]
pub struct RedisClock {
    /// Redis time minus local time, in ms; 0 until first measured.
    offset_ms: Arc<AtomicI64>,
    /// The clock the offset corrects: the system's, or (in tests) one set
    /// far from Redis's so that an offset left unapplied shows.
    local: Arc<dyn Clock>,
}

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock::over(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for RedisClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClock")
            .field("offset_ms", &self.offset_ms())
            .finish_non_exhaustive()
    }
}

impl Clock for RedisClock {
    fn now(&self) -> SystemTime {
        let local = to_unix_ms(self.local.now());
        from_unix_ms(local.saturating_add(self.offset_ms.load(Ordering::Relaxed)))
    }
}

impl RedisClock {
    /// A clock correcting `local` (the system clock by [`Default`]).
    pub fn over(local: Arc<dyn Clock>) -> Self {
        RedisClock {
            offset_ms: Arc::new(AtomicI64::new(0)),
            local,
        }
    }

    /// The current offset (Redis minus local), in ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Measures the offset once.
    pub async fn calibrate(&self, client: &redis::Client) -> redis::RedisResult<i64> {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let before = to_unix_ms(self.local.now());
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let after = to_unix_ms(self.local.now());
        let redis_ms = secs * 1000 + micros / 1000;
        let offset = redis_ms - (before + after) / 2;
        self.offset_ms.store(offset, Ordering::Relaxed);
        Ok(offset)
    }

    /// Measures the offset once against the primary `target` names now:
    /// after a Sentinel failover, the promoted replica, whose host clock is
    /// another one (a client resolved once would keep asking the old
    /// primary, fail, and keep the old offset).
    pub async fn calibrate_primary(&self, target: &RedisTarget) -> redis::RedisResult<i64> {
        let client = target.primary_client().await?;
        self.calibrate(&client).await
    }

    /// Re-measures every `every` against the current primary for as long as
    /// it is polled; a failure keeps the last offset (the store is down then
    /// anyway).
    pub async fn keep_calibrated(self, target: RedisTarget, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            tick.tick().await;
            let call =
                tokio::time::timeout(Duration::from_secs(2), self.calibrate_primary(&target));
            match call.await {
                Ok(Ok(offset)) if first => {
                    first = false;
                    info!(offset_ms = offset, "clock follows the Redis server's TIME");
                }
                Ok(Ok(_)) => {}
                Ok(Err(err)) => warn!(cause = %err, "measuring the Redis clock offset failed"),
                Err(_) => warn!("measuring the Redis clock offset timed out"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_testkit::RedisServer;
    use tollgate_vocab::clock::ManualClock;

    /// The local clock is set a day behind Redis's (same host, so Redis's
    /// `TIME` is the system's): only an applied offset brings `now` back to
    /// Redis's time.
    #[tokio::test]
    async fn follows_the_redis_servers_clock() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let client = redis::Client::open(server.url()).expect("client");
        const DAY_MS: i64 = 86_400_000;
        let behind = from_unix_ms(to_unix_ms(SystemTime::now()) - DAY_MS);
        let local = Arc::new(ManualClock::new(behind));
        let clock = RedisClock::over(local.clone());
        let offset = clock.calibrate(&client).await.expect("TIME");
        assert!((offset - DAY_MS).abs() < 1_000, "offset {offset} ms");
        assert_eq!(clock.offset_ms(), offset);
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .expect("TIME");
        let redis_ms = secs * 1000 + micros / 1000;
        let error = to_unix_ms(clock.now()) - redis_ms;
        assert!(error.abs() < 1_000, "{error} ms from Redis's TIME");
        // The local clock moves, the offset stays: `now` moves with it.
        local.advance(Duration::from_secs(5));
        assert_eq!(to_unix_ms(clock.now()), to_unix_ms(local.now()) + offset);
    }
}
