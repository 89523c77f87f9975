//! The run's wall clock, read by the upstream (HTTP-date hints) and by
//! every runner (to read those hints back): a leaf, so both can use it.

use std::time::SystemTime;

use tokio::time::Instant;
use tollgate_client::clock::Clock;

/// A wall clock derived from `tokio::time`: `wall_at_start` plus the tokio
/// time elapsed since the run started. Under a paused runtime it moves only
/// with virtual time, so HTTP-date hints are exact and reproducible; no
/// logic here ever reads `SystemTime::now()`.
#[derive(Debug, Clone)]
pub struct VirtualWall {
    wall_at_start: SystemTime,
    start: Instant,
}

impl VirtualWall {
    /// A clock reading `wall_at_start` at the tokio instant `start`.
    pub fn new(wall_at_start: SystemTime, start: Instant) -> Self {
        VirtualWall {
            wall_at_start,
            start,
        }
    }
}

impl Clock for VirtualWall {
    fn now(&self) -> SystemTime {
        self.wall_at_start + self.start.elapsed()
    }
}
