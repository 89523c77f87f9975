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

use tollgate_client::clock::{Clock, from_unix_ms, to_unix_ms};
use tracing::{info, warn};

/// The local clock plus the last measured offset to Redis's `TIME`.
#[derive(Debug, Clone, Default)]
pub struct RedisClock {
    /// Redis time minus local time, in ms; 0 until first measured.
    offset_ms: Arc<AtomicI64>,
}

impl Clock for RedisClock {
    fn now(&self) -> SystemTime {
        let local = to_unix_ms(SystemTime::now());
        from_unix_ms(local.saturating_add(self.offset_ms.load(Ordering::Relaxed)))
    }
}

impl RedisClock {
    /// The current offset (Redis minus local), in ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Measures the offset once.
    pub async fn calibrate(&self, client: &redis::Client) -> redis::RedisResult<i64> {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let before = to_unix_ms(SystemTime::now());
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let after = to_unix_ms(SystemTime::now());
        let redis_ms = secs * 1000 + micros / 1000;
        let offset = redis_ms - (before + after) / 2;
        self.offset_ms.store(offset, Ordering::Relaxed);
        Ok(offset)
    }

    /// Re-measures every `every` for as long as it is polled; a failure
    /// keeps the last offset (the store is down then anyway).
    pub async fn keep_calibrated(self, client: redis::Client, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            tick.tick().await;
            let call = tokio::time::timeout(Duration::from_secs(2), self.calibrate(&client));
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
    use crate::testing::RedisServer;

    #[tokio::test]
    async fn follows_the_redis_servers_clock() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let client = redis::Client::open(server.url()).expect("client");
        let clock = RedisClock::default();
        let offset = clock.calibrate(&client).await.expect("TIME");
        // Same host, same clock: the offset is the measurement's error only.
        assert!(offset.abs() < 1_000, "offset {offset} ms");
        assert_eq!(clock.offset_ms(), offset);
        let drift = to_unix_ms(clock.now()) - to_unix_ms(SystemTime::now());
        assert!((drift - offset).abs() < 1_000);
    }
}
