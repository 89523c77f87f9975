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
//! A delay alone does not bound how fast one peer learns the answers: a
//! peer sending a thousand guesses at once would get a thousand answers a
//! delay later. So each peer may have at most [`MAX_HELD_PER_PEER`]
//! refusals waiting, and while it has that many, its further calls are
//! answered RESOURCE_EXHAUSTED *without their token being looked at*
//! ([`BadTokens::admits`]): an answer that says nothing about the token
//! tells a guesser nothing, so one peer learns at most
//! [`MAX_HELD_PER_PEER`] answers per [`MAX_DELAY`] once it is slowed
//! down (8 a second). A held refusal is a timer and an HTTP/2 stream, not
//! a request slot (the server holds it before the server-wide limit), and
//! the number held is bounded by the peers remembered: past [`MAX_PEERS`]
//! busy peers, new ones share one entry and one cap. Time is tokio's
//! (pausable).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// Refusals of one peer held at once; while it has this many, its calls
/// are refused without their token being checked.
pub const MAX_HELD_PER_PEER: usize = 16;
/// Peers remembered; past this, unknown peers share one entry.
pub const MAX_PEERS: usize = 4096;
/// The one entry every peer shares once [`MAX_PEERS`] are remembered (and
/// the key of a transport without addresses): they are slowed down and
/// capped together, which only a crowd of addresses can cause.
const OVERFLOW: IpAddr = IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);

#[derive(Debug)]
struct Peer {
    failures: u32,
    last: Instant,
    /// Refusals of this peer being held right now.
    held: usize,
}

#[derive(Debug, Default)]
struct State {
    peers: HashMap<IpAddr, Peer>,
    /// Calls refused unread because their peer had too many held.
    crowded: u64,
    last_log: Option<Instant>,
    /// Refusals since the last log line, and per peer for the loudest.
    unlogged: u64,
    unlogged_by_peer: HashMap<IpAddr, u64>,
}

/// The bad-token record of one server.
#[derive(Debug, Default)]
pub struct BadTokens {
    state: Mutex<State>,
    /// Refusals held across all peers: while none are, [`Self::admits`]
    /// answers without taking the lock (the path of every good call).
    held: AtomicUsize,
}

impl State {
    /// The entry `peer` is counted under: its own, or [`OVERFLOW`] when
    /// [`MAX_PEERS`] busy peers are remembered already.
    fn key(&mut self, peer: Option<IpAddr>, now: Instant) -> IpAddr {
        let key = peer.unwrap_or(OVERFLOW);
        if self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&key) {
            self.peers
                .retain(|_, p| p.held > 0 || now.duration_since(p.last) < FORGET_AFTER);
        }
        if self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&key) {
            OVERFLOW
        } else {
            key
        }
    }
}

impl BadTokens {
    /// Whether a call from `peer` may have its token checked: false while
    /// the peer has [`MAX_HELD_PER_PEER`] refusals held (see the module
    /// documentation); such a call is to be refused unread.
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        if self.held.load(Ordering::Acquire) == 0 {
            return true;
        }
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let key = state.key(peer, now);
        let admitted = state
            .peers
            .get(&key)
            .is_none_or(|p| p.held < MAX_HELD_PER_PEER);
        if !admitted {
            state.crowded += 1;
        }
        admitted
    }

    /// Records a refusal from `peer` (`None`: a transport without
    /// addresses, counted under one key) and returns how long to hold it.
    pub fn record(&self, peer: Option<IpAddr>) -> Duration {
        self.record_keyed(peer).0
    }

    /// [`Self::record`], and the entry the refusal was counted under.
    fn record_keyed(&self, peer: Option<IpAddr>) -> (Duration, IpAddr) {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let key = state.key(peer, now);
        let delay = {
            let peer = state.peers.entry(key).or_insert(Peer {
                failures: 0,
                last: now,
                held: 0,
            });
            if now.duration_since(peer.last) >= FORGET_AFTER {
                peer.failures = 0;
            }
            peer.failures = peer.failures.saturating_add(1);
            peer.last = now;
            if key == OVERFLOW && peer.failures > 1 {
                MAX_DELAY
            } else {
                delay_after(peer.failures)
            }
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
                refused_unread = state.crowded,
                peers = state.unlogged_by_peer.len(),
                loudest = %loudest,
                from_loudest,
                "refused missing or unknown bearer tokens (one line per interval; repeats are slowed down)"
            );
            state.last_log = Some(now);
            state.unlogged = 0;
            state.crowded = 0;
            state.unlogged_by_peer.clear();
        } else if state.unlogged_by_peer.len() > MAX_PEERS {
            // Counting more peers than this buys nothing but memory.
            state.unlogged_by_peer.clear();
        }
        (delay, key)
    }

    /// Records a refusal from `peer` and waits out its delay, counted as
    /// held by the peer meanwhile (also when the caller gives up early).
    pub async fn hold(&self, peer: Option<IpAddr>) {
        let (delay, key) = self.record_keyed(peer);
        if delay.is_zero() {
            return;
        }
        let _held = Held::take(self, key);
        tokio::time::sleep(delay).await;
    }
}

/// One refusal being held, counted in its peer's entry until dropped.
struct Held<'a> {
    bad: &'a BadTokens,
    key: IpAddr,
}

impl<'a> Held<'a> {
    fn take(bad: &'a BadTokens, key: IpAddr) -> Held<'a> {
        let mut state = bad.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(peer) = state.peers.get_mut(&key) {
            peer.held += 1;
        }
        bad.held.fetch_add(1, Ordering::AcqRel);
        Held { bad, key }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut state = self.bad.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(peer) = state.peers.get_mut(&self.key) {
            peer.held = peer.held.saturating_sub(1);
        }
        self.bad.held.fetch_sub(1, Ordering::AcqRel);
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
    async fn a_peer_with_enough_refusals_held_is_refused_unread() {
        let bad = std::sync::Arc::new(BadTokens::default());
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        let other = Some(IpAddr::from([10, 0, 0, 2]));
        // Warm up: the first refusal is free, the next ones are held.
        bad.record(peer);
        let mut held = Vec::new();
        for _ in 0..MAX_HELD_PER_PEER {
            assert!(bad.admits(peer));
            let bad = std::sync::Arc::clone(&bad);
            held.push(tokio::spawn(async move { bad.hold(peer).await }));
        }
        tokio::task::yield_now().await;
        assert!(!bad.admits(peer), "the cap is reached");
        assert!(bad.admits(other), "another peer is not affected");
        for task in held {
            task.await.expect("held refusal");
        }
        assert!(bad.admits(peer), "answered refusals free the cap");
        assert_eq!(bad.state.lock().expect("lock").crowded, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_refusal_given_up_frees_its_place() {
        let bad = BadTokens::default();
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        bad.record(peer);
        let mut hold = Box::pin(bad.hold(peer));
        assert!(poll_once(hold.as_mut()).await.is_pending());
        assert_eq!(bad.held.load(Ordering::Acquire), 1);
        drop(hold);
        assert_eq!(bad.held.load(Ordering::Acquire), 0);
        let state = bad.state.lock().expect("lock");
        assert_eq!(state.peers.values().map(|p| p.held).sum::<usize>(), 0);
    }

    /// Polls `future` once.
    async fn poll_once<F: std::future::Future + Unpin>(
        mut future: F,
    ) -> std::task::Poll<F::Output> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx)))
            .await
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
