//! Repeated bad tokens: slowed down per peer, summarized in the log.
//!
//! A peer that keeps presenting missing or unknown tokens is either
//! misconfigured or guessing. Either way each further refusal is answered
//! later (doubling from [`FIRST_DELAY`] up to [`MAX_DELAY`]), which makes
//! guessing slow without costing a legitimate caller anything: its first
//! refusal is immediate, and a peer is forgotten after [`FORGET_AFTER`] of
//! quiet. The log gets at most one line per [`LOG_EVERY`] — never one per
//! attempt, which would let a guesser flood it — naming how many refusals
//! and peers there were and the loudest peer.
//!
//! Delaying holds a request slot, so at most [`MAX_DELAYED`] refusals wait
//! at once; past that they are answered at once. Time is tokio's (pausable).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The delay of a peer's second refusal in a row.
pub const FIRST_DELAY: Duration = Duration::from_millis(50);
/// The longest a refusal is held.
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// A peer quiet this long starts over.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);
/// At most one log line per this interval.
pub const LOG_EVERY: Duration = Duration::from_secs(60);
/// Refusals held at once; more are answered without delay.
pub const MAX_DELAYED: usize = 256;
/// Peers remembered; past this, unknown peers get [`MAX_DELAY`].
const MAX_PEERS: usize = 4096;

#[derive(Debug)]
struct Peer {
    failures: u32,
    last: Instant,
}

#[derive(Debug, Default)]
struct State {
    peers: HashMap<IpAddr, Peer>,
    last_log: Option<Instant>,
    /// Refusals since the last log line, and per peer for the loudest.
    unlogged: u64,
    unlogged_by_peer: HashMap<IpAddr, u64>,
}

/// The bad-token record of one server.
#[derive(Debug)]
pub struct BadTokens {
    state: Mutex<State>,
    delayed: tokio::sync::Semaphore,
}

impl Default for BadTokens {
    fn default() -> Self {
        BadTokens {
            state: Mutex::default(),
            delayed: tokio::sync::Semaphore::new(MAX_DELAYED),
        }
    }
}

impl BadTokens {
    /// Records a refusal from `peer` (`None`: a transport without
    /// addresses, counted under one key) and returns how long to hold it.
    pub fn record(&self, peer: Option<IpAddr>) -> Duration {
        let now = Instant::now();
        let key = peer.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.peers.len() >= MAX_PEERS && !state.peers.contains_key(&key) {
            state
                .peers
                .retain(|_, p| now.duration_since(p.last) < FORGET_AFTER);
        }
        let delay = if state.peers.len() >= MAX_PEERS && !state.peers.contains_key(&key) {
            MAX_DELAY
        } else {
            let peer = state.peers.entry(key).or_insert(Peer {
                failures: 0,
                last: now,
            });
            if now.duration_since(peer.last) >= FORGET_AFTER {
                peer.failures = 0;
            }
            peer.failures = peer.failures.saturating_add(1);
            peer.last = now;
            delay_after(peer.failures)
        };
        state.unlogged += 1;
        *state.unlogged_by_peer.entry(key).or_default() += 1;
        let due = state
            .last_log
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        if due && state.unlogged_by_peer.len() <= MAX_PEERS {
            let (loudest, from_loudest) = state
                .unlogged_by_peer
                .iter()
                .max_by_key(|(_, n)| **n)
                .map_or((key, 0), |(ip, n)| (*ip, *n));
            tracing::warn!(
                refused = state.unlogged,
                peers = state.unlogged_by_peer.len(),
                loudest = %loudest,
                from_loudest,
                "refused missing or unknown bearer tokens (one line per interval; repeats are slowed down)"
            );
            state.last_log = Some(now);
            state.unlogged = 0;
            state.unlogged_by_peer.clear();
        } else if state.unlogged_by_peer.len() > MAX_PEERS {
            // Counting more peers than this buys nothing but memory.
            state.unlogged_by_peer.clear();
        }
        delay
    }

    /// Records a refusal from `peer` and waits out its delay, unless
    /// [`MAX_DELAYED`] refusals are already waiting.
    pub async fn hold(&self, peer: Option<IpAddr>) {
        let delay = self.record(peer);
        if delay.is_zero() {
            return;
        }
        if let Ok(_permit) = self.delayed.try_acquire() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// The delay of a peer's `failures`-th refusal in a row: none for the
/// first, then doubling.
fn delay_after(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let doublings = (failures - 2).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn repeats_from_one_peer_slow_down_and_quiet_resets() {
        let bad = BadTokens::default();
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        let other = Some(IpAddr::from([10, 0, 0, 2]));
        assert_eq!(bad.record(peer), Duration::ZERO, "the first is free");
        assert_eq!(bad.record(peer), FIRST_DELAY);
        assert_eq!(bad.record(peer), FIRST_DELAY * 2);
        for _ in 0..20 {
            bad.record(peer);
        }
        assert_eq!(bad.record(peer), MAX_DELAY);
        assert_eq!(bad.record(other), Duration::ZERO, "per peer");
        tokio::time::advance(FORGET_AFTER).await;
        assert_eq!(bad.record(peer), Duration::ZERO, "forgotten after quiet");
        // The second and third refusals in a row wait 50 ms and 100 ms.
        let start = Instant::now();
        bad.hold(peer).await;
        bad.hold(peer).await;
        assert_eq!(start.elapsed(), FIRST_DELAY * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn logs_once_per_interval() {
        let bad = BadTokens::default();
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        bad.record(peer);
        let first = bad.state.lock().expect("lock").last_log;
        for _ in 0..100 {
            bad.record(peer);
        }
        let state = bad.state.lock().expect("lock");
        assert_eq!(state.last_log, first, "no second line within the interval");
        assert_eq!(state.unlogged, 100, "counted for the next line");
    }
}
