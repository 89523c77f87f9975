//! Wall clocks, injected so that decision logic never reads `SystemTime::now()`
//! itself and every test can run on a virtual clock.
//!
//! Elapsed (monotonic) time is `tokio::time` in async code and plain
//! [`Duration`]s in the pure engine; this module is only for wall time, which
//! is what HTTP-dates and the coordinator's cooldowns are expressed in.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall time.
    fn now(&self) -> SystemTime;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to, for tests and the simulator.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Sets the clock to `to`, which may be earlier (a clock step).
    pub fn set(&self, to: SystemTime) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A wall clock that moves with tokio's clock: a fixed `start` plus the
/// tokio time elapsed since the clock was made.
///
/// Under paused tokio time (`#[tokio::test(start_paused = true)]`) wall time
/// then advances exactly as far as `tokio::time` does, so a coordinator and a
/// gate sharing one clock agree on every instant, and a `Retry-After` date or
/// a cooldown falls due when the sleeps say it does. A [`ManualClock`] would
/// stand still while tokio auto-advances; [`SystemClock`] would not move at
/// all under paused time.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: SystemTime,
    /// Read from tokio's clock, so pausing and advancing it moves this one.
    epoch: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `start` now and following tokio's clock from here.
    /// Make it inside the runtime whose (possibly paused) time it follows.
    pub fn new(start: SystemTime) -> Self {
        TokioClock {
            start,
            epoch: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.start + self.epoch.elapsed()
    }
}

/// Wall time as Unix milliseconds, the wire form of every `*_unix_ms` field.
/// Instants before the epoch are negative; out-of-range values saturate.
pub fn to_unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The inverse of [`to_unix_ms`].
pub fn from_unix_ms(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_ms_round_trips_on_both_sides_of_the_epoch() {
        for ms in [0, 1, -1, 1_704_110_400_000, -86_400_000] {
            assert_eq!(to_unix_ms(from_unix_ms(ms)), ms);
        }
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(from_unix_ms(1_000));
        assert_eq!(to_unix_ms(clock.now()), 1_000);
        clock.advance(Duration::from_millis(500));
        assert_eq!(to_unix_ms(clock.now()), 1_500);
        clock.set(from_unix_ms(200));
        assert_eq!(to_unix_ms(clock.now()), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_tokio_time() {
        let clock = TokioClock::new(from_unix_ms(1_000));
        assert_eq!(to_unix_ms(clock.now()), 1_000, "stands still while paused");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(to_unix_ms(clock.now()), 2_500);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(to_unix_ms(clock.now()), 62_500);
    }
}
