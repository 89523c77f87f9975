//! Reconsider, and the pacing half of Report, on Redis: read what the
//! decision needs, decide in Rust ([`crate::slots::plan`],
//! [`PacingState::observe`]), write the outcome only if nothing read has
//! moved meanwhile, and decide again if it has. The scripts involved
//! (`slot_read`, `slot_commit`, `pace_commit`) hold no policy: the memory
//! store and this one make the same decision with the same code.
//!
//! Within one coordinator the decisions on a route take turns
//! ([`Turns`]), so its concurrent calls do not race each other into
//! retries; only another replica's write between a read and its commit
//! costs one more round.

use tokio::sync::{Mutex, MutexGuard};

use crate::pacing::{Observation, PacingPolicy, PacingState};
use crate::policy::Policy;
use crate::scope::RouteKey;
use crate::slots::{SlotAsk, SlotBook, SlotChange, ahead_range, plan};
use crate::store::{Reconsidered, RouteView, Slotted, StoreError};

use super::reply::{Reply, count};
use super::scripts::SCRIPTS;
use super::store::RedisStore;

/// How many times a decision is made again after another replica moved
/// the route under it, before the call gives up as unavailable. Each
/// round is won by some replica, so this many losses in a row means a
/// route contended far past what any fleet sends.
const MAX_ROUNDS: usize = 32;

/// One lock per stripe of routes: a route's decisions in this process
/// take turns, without a map of locks that grows with the routes.
pub(super) struct Turns([Mutex<()>; 256]);

impl Default for Turns {
    fn default() -> Self {
        Turns(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl Turns {
    /// Waits for `route_key`'s turn.
    pub(super) async fn take(&self, route_key: &str) -> MutexGuard<'_, ()> {
        use std::hash::BuildHasher as _;
        let hash = foldhash::fast::FixedState::default().hash_one(route_key);
        self.0[(hash % 256) as usize].lock().await
    }
}

/// The pacing state stored as `bytes` (none yet: a new one at `now_ms`).
pub(super) fn stored_pacing(
    bytes: Option<&[u8]>,
    now_ms: i64,
    policy: &PacingPolicy,
) -> Result<PacingState, StoreError> {
    match bytes {
        None => Ok(PacingState::new(now_ms, policy)),
        Some(bytes) => PacingState::decode(bytes).map_err(|e| {
            StoreError::Unavailable(format!(
                "redis holds state this build cannot read ({e}); flush the store"
            ))
        }),
    }
}

/// What an operator sees of a stored pacing state at `now_ms`, with
/// `asking` intents waiting: a copy brought to now, so looking changes
/// nothing.
pub(super) fn pacing_view(
    mut pacing: PacingState,
    asking: usize,
    now_ms: i64,
    policy: &PacingPolicy,
) -> crate::pacing::PacingView {
    pacing.advance(now_ms, policy);
    pacing.view(asking, now_ms)
}

impl RedisStore {
    /// Decides a Reconsider ([`plan`]) on what `slot_read` found, and has
    /// `slot_commit` record it.
    pub(super) async fn reconsider_now(
        &self,
        route: &RouteKey,
        ask: SlotAsk<'_>,
        policy: &Policy,
    ) -> Result<Slotted, StoreError> {
        let (keys, ccd, cfloor) = self.route_keys(route).await?;
        let _turn = self.turns.take(&keys[0]).await;
        let now = ask.now_ms;
        let (from, to) = ahead_range(&ask).unwrap_or((-1, -1));
        for _ in 0..MAX_ROUNDS {
            let mut inv = SCRIPTS.slot_read.call(&keys);
            inv.arg(ccd)
                .arg(cfloor)
                .arg(now)
                .arg(ask.intent_id)
                .arg(from)
                .arg(to);
            let r = Reply::ok(self.run(&inv).await?)?;
            let (cooldown, backoff) = (r.int(1)?, r.int(2)?);
            let view = RouteView {
                cooldown_until_ms: cooldown.max(r.int(3)?),
                floor_ms: cooldown.max(backoff).max(r.int(4)?),
                frozen: r.text(5),
            };
            let version = r.int(6)?;
            let stored = r.bytes(7);
            let mut pacing = stored_pacing(stored, now, &policy.pacing)?;
            let book = SlotBook {
                cursor_us: r.int(8)?,
                pending_ms: Some(r.int(9)?).filter(|&at| at >= 0),
                ahead: u32::try_from(r.int(10)?).unwrap_or(u32::MAX),
            };
            let asking = count(r.int(11)?);
            if view.frozen.is_some() {
                let pacing = pacing_view(pacing, asking, now, &policy.pacing);
                return Ok(Slotted {
                    decided: Reconsidered::Frozen,
                    view,
                    pacing,
                    pacing_was: pacing.mode,
                });
            }
            let decided = plan(&book, &ask, view.floor_ms, &mut pacing, &policy.pacing);
            let encoded = pacing.encode();
            let moved_pacing = stored != Some(&encoded[..]);
            let slotted = |asking| Slotted {
                decided: decided.outcome.into(),
                view: view.clone(),
                pacing: pacing.view(asking, now),
                pacing_was: decided.pacing_was,
            };
            if decided.change == SlotChange::Keep && !moved_pacing {
                return Ok(slotted(asking));
            }
            let (kind, at, cursor) = match decided.change {
                SlotChange::Keep => ("keep", 0, book.cursor_us),
                SlotChange::Book { at_ms, cursor_us } => ("book", at_ms, cursor_us),
                SlotChange::Ask { deadline_ms } => ("ask", deadline_ms, book.cursor_us),
                SlotChange::Forget => ("forget", 0, book.cursor_us),
            };
            let mut inv = SCRIPTS.slot_commit.call(&keys[..1]);
            inv.arg(now)
                .arg(self.idle_ms)
                .arg(version)
                .arg(book.cursor_us)
                .arg(cooldown)
                .arg(backoff)
                .arg(0)
                .arg(if moved_pacing { &encoded[..] } else { &[][..] })
                .arg(kind)
                .arg(ask.intent_id)
                .arg(at)
                .arg(cursor);
            let r = Reply::ok(self.run(&inv).await?)?;
            if r.text(1).as_deref() == Some("done") {
                return Ok(slotted(count(r.int(2)?)));
            }
        }
        Err(contended())
    }

    /// Takes a report's counts into the route's pacing, from the state
    /// `report.lua` read (`version`, `stored`), and has `pace_commit`
    /// write the result. Returns the view after it and the mode before.
    pub(super) async fn observe_pacing(
        &self,
        route_key: &str,
        observation: &Observation<'_>,
        mut version: i64,
        mut stored: Option<Vec<u8>>,
        asking: usize,
        policy: &PacingPolicy,
    ) -> Result<(crate::pacing::PacingView, crate::pacing::Mode), StoreError> {
        let now = observation.now_ms;
        for _ in 0..MAX_ROUNDS {
            let mut pacing = stored_pacing(stored.as_deref(), now, policy)?;
            let was = pacing.mode();
            pacing.observe(observation, policy);
            let encoded = pacing.encode();
            let seen = (pacing_view(pacing, asking, now, policy), was);
            if stored.as_deref() == Some(&encoded[..]) {
                return Ok(seen);
            }
            let mut inv = SCRIPTS.pace_commit.call(&[route_key]);
            inv.arg(version).arg(&encoded[..]);
            let r = Reply::ok(self.run(&inv).await?)?;
            if r.text(1).as_deref() != Some("moved") {
                // Written, or the route was reset or evicted meanwhile.
                return Ok(seen);
            }
            version = r.int(2)?;
            stored = r.bytes(3).map(<[u8]>::to_vec);
        }
        Err(contended())
    }
}

fn contended() -> StoreError {
    StoreError::Unavailable(format!(
        "route changed under {MAX_ROUNDS} decisions in a row; try again"
    ))
}
