//! The decisions the Redis store makes in Rust: a Reconsider's slot
//! ([`crate::pacing::cursor::plan`]), a Report's pacing ([`PacingState::observe`])
//! and every change to a level's hints (merging, corroboration, backoff,
//! mutes: [`HintState`]). Each reads what the decision needs, decides,
//! writes the outcome only if nothing read has moved meanwhile, and decides
//! again if it has. The scripts involved (`slot_read`, `slot_commit`,
//! `pace_commit`, `route_read`, `caller_read`, `hints_commit`) hold no
//! policy: the memory store and this one make the same decisions with the
//! same code.
//!
//! Within one coordinator the decisions on a route take turns
//! ([`Turns`]), so its concurrent calls do not race each other into
//! retries; only another replica's write between a read and its commit
//! costs one more round.

use tokio::sync::{Mutex, MutexGuard};

use crate::hints::HintState;
use crate::pacing::cursor::{
    SlotAsk, SlotBook, SlotChange, ahead_range, call_back_listening_since, plan,
};
use crate::pacing::stated::{Statement, Weighing};
use crate::pacing::{PacingPolicy, PacingState, ReportSample};
use crate::policy::Policy;
use crate::scope::RouteKey;
use crate::store::{Reconsidered, RouteView, Slotted, StoreError};
use crate::tenancy::Owner;

use super::RedisStore;
use super::reply::{Reply, count};
use super::scripts::SCRIPTS;

/// How many times a decision is made again after another replica moved
/// the route under it, before the call gives up as unavailable. Each
/// round is won by some replica, so this many losses in a row means a
/// route contended far past what any fleet sends.
pub(super) const MAX_ROUNDS: usize = 32;

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

/// What one report gives a route's pacing: its counts, and the worker's
/// statement of the upstream's limit with how it is weighed.
pub(super) struct PacingInput<'a> {
    pub(super) observation: &'a ReportSample<'a>,
    pub(super) stated: Option<(&'a Statement, Weighing)>,
}

/// The pacing state stored as `bytes` (none yet: a new one at `now_ms`).
pub(super) fn stored_pacing(
    bytes: Option<&[u8]>,
    now_ms: i64,
    policy: &PacingPolicy,
) -> Result<PacingState, StoreError> {
    match bytes {
        None => Ok(PacingState::new(now_ms, policy)),
        Some(bytes) => PacingState::decode(bytes).map_err(unreadable),
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
        let owner = ask.tenant.owner;
        let (keys, ccd, cfloor) = self.route_keys(route).await?;
        let _turn = self.turns.take(&keys[0]).await;
        let now = ask.now_ms;
        let (from, to) = ahead_range(&ask).unwrap_or((-1, -1));
        // A token with a quota books on a route that exists, until a
        // refusal has it charged (`quota`).
        let mut must_exist = self.quotas.charges(owner);
        let owner_name = self.quotas.name(owner).unwrap_or_default();
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
                    call_back_until_ms: None,
                });
            }
            let decided = plan(&book, &ask, view.floor_ms, &mut pacing, &policy.pacing);
            let encoded = pacing.encode();
            let moved_pacing = stored != Some(&encoded[..]);
            let slotted = |asking, call_back_until_ms| Slotted {
                decided: decided.outcome.into(),
                view: view.clone(),
                pacing: pacing.view(asking, now),
                pacing_was: decided.pacing_was,
                call_back_until_ms,
            };
            if decided.change == SlotChange::Keep && !moved_pacing {
                return Ok(slotted(asking, None));
            }
            let (kind, at, cursor, again) = match decided.change {
                SlotChange::Keep => ("keep", 0, book.cursor_us, 0),
                SlotChange::Book { at_ms, cursor_us } => ("book", at_ms, cursor_us, 0),
                SlotChange::Ask {
                    deadline_ms,
                    again_ms,
                } => ("ask", deadline_ms, book.cursor_us, again_ms),
                SlotChange::Forget => ("forget", 0, book.cursor_us, 0),
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
                .arg(cursor)
                .arg(u8::from(must_exist))
                .arg(owner_name)
                .arg(again)
                .arg(call_back_listening_since(now, &policy.pacing));
            let r = Reply::ok(self.run(&inv).await?)?;
            match r.text(1).as_deref() {
                Some("done") => {
                    let until = self
                        .call_back_until(&keys[0], decided.call_back, now, policy)
                        .await?;
                    return Ok(slotted(count(r.int(2)?), until));
                }
                Some("absent") if must_exist => {
                    self.charge(owner, &keys[0], now).await?;
                    must_exist = false;
                }
                _ => {}
            }
        }
        Err(contended())
    }

    /// Who a call-back of `count` intents reaches on the route at `now`
    /// (`slot_call_back`, a second round trip only when the route calls
    /// back: at most once a half horizon); `None` for no call-back, or
    /// nobody listening.
    async fn call_back_until(
        &self,
        route_key: &str,
        count: u32,
        now: i64,
        policy: &Policy,
    ) -> Result<Option<i64>, StoreError> {
        if count == 0 {
            return Ok(None);
        }
        let mut inv = SCRIPTS.slot_call_back.call(&[route_key]);
        inv.arg(now)
            .arg(count)
            .arg(call_back_listening_since(now, &policy.pacing));
        let r = Reply::ok(self.run(&inv).await?)?;
        Ok(Some(r.int(1)?).filter(|&at| at > 0))
    }

    /// Takes a report's statement (weighed) and counts into the route's
    /// pacing, from the state `report.lua` read (`version`, `stored`), and
    /// has `pace_commit` write the result. Returns the view after it and
    /// the mode before.
    pub(super) async fn observe_pacing(
        &self,
        route_key: &str,
        input: PacingInput<'_>,
        mut version: i64,
        mut stored: Option<Vec<u8>>,
        asking: usize,
        policy: &PacingPolicy,
    ) -> Result<(crate::pacing::PacingView, crate::pacing::Mode), StoreError> {
        let PacingInput {
            observation,
            stated,
        } = input;
        let now = observation.now_ms;
        for _ in 0..MAX_ROUNDS {
            let mut pacing = stored_pacing(stored.as_deref(), now, policy)?;
            let was = pacing.mode();
            if let Some((statement, weighing)) = stated {
                pacing.observe_statement(statement.clone(), weighing, now, policy);
            }
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

/// What `report.lua` and `route_read.lua` answer about a route
/// (`route_state_out`): what its hints and pacing are decided from.
#[derive(Debug, Clone, Default)]
pub(super) struct RouteRead {
    pub(super) frozen: Option<String>,
    pub(super) hints_version: i64,
    pub(super) hints: Option<Vec<u8>>,
    pub(super) pacing_version: i64,
    pub(super) pacing: Option<Vec<u8>>,
    pub(super) asking: usize,
}

impl RouteRead {
    /// The six fields from field `at`.
    pub(super) fn at(r: &Reply, at: usize) -> Result<Self, StoreError> {
        Ok(RouteRead {
            frozen: r.text(at),
            hints_version: r.int(at + 1)?,
            hints: r.bytes(at + 2).map(<[u8]>::to_vec),
            pacing_version: r.int(at + 3)?,
            pacing: r.bytes(at + 4).map(<[u8]>::to_vec),
            asking: count(r.int(at + 5)?),
        })
    }
}

/// The hints stored as `bytes` (none yet: the empty state).
pub(super) fn stored_hints(bytes: Option<&[u8]>) -> Result<HintState, StoreError> {
    bytes.map_or(Ok(HintState::default()), |bytes| {
        HintState::decode(bytes).map_err(unreadable)
    })
}

fn unreadable(e: crate::codec::DecodeError) -> StoreError {
    StoreError::Unavailable(format!(
        "redis holds state this build cannot read ({e}); flush the store"
    ))
}

/// Which level's hints a change is made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    /// A route's own.
    Route,
    /// A caller scope's (uncertain evidence); `touch`: the change is a
    /// hint or a mute, which keeps the scope alive (a success narrowing
    /// its backoff does not); `owner`: the token a caller scope the
    /// change makes is charged to (already charged: `quota`).
    Caller { touch: bool, owner: Owner },
}

impl RedisStore {
    /// `route_read.lua`: the route's hints and pacing as stored; `None`
    /// when there is no such route.
    pub(super) async fn read_route(
        &self,
        route_key: &str,
    ) -> Result<Option<RouteRead>, StoreError> {
        let mut inv = SCRIPTS.route_read.call(&[route_key]);
        inv.arg(0);
        let r = Reply::ok(self.run(&inv).await?)?;
        if r.int(1)? == 0 {
            return Ok(None);
        }
        RouteRead::at(&r, 2).map(Some)
    }

    /// `caller_read.lua`: a caller scope's hints version and bytes.
    pub(super) async fn read_caller(
        &self,
        caller_key: &str,
    ) -> Result<(i64, Option<Vec<u8>>), StoreError> {
        let inv = SCRIPTS.caller_read.call(&[caller_key]);
        let r = Reply::ok(self.run(&inv).await?)?;
        Ok((r.int(1)?, r.bytes(2).map(<[u8]>::to_vec)))
    }

    /// Makes `change` to the hints of `level` at `key`, starting from the
    /// `version` and `stored` bytes already read, and writes the result
    /// with `hints_commit.lua` unless nothing changed; decides again on
    /// what is there if another replica wrote in between. Returns what the
    /// change answered and the state after it.
    pub(super) async fn change_hints<T>(
        &self,
        key: &str,
        level: Level,
        now_ms: i64,
        mut version: i64,
        mut stored: Option<Vec<u8>>,
        mut change: impl FnMut(&mut HintState) -> T,
    ) -> Result<(T, HintState), StoreError> {
        for _ in 0..MAX_ROUNDS {
            let mut hints = stored_hints(stored.as_deref())?;
            let before = stored.take().unwrap_or_else(|| hints.encode());
            let answer = change(&mut hints);
            let after = hints.encode();
            if after == before {
                return Ok((answer, hints));
            }
            let (kind, floor, touch, owner) = match level {
                Level::Route => ("route", hints.backoff_until_ms, false, Owner::NONE),
                Level::Caller { touch, owner } => ("caller", hints.floor_ms(), touch, owner),
            };
            let mut inv = SCRIPTS.hints_commit.call(&[key]);
            inv.arg(kind)
                .arg(now_ms)
                .arg(self.idle_ms)
                .arg(version)
                .arg(&after[..])
                .arg(hints.cooldown_until_ms)
                .arg(floor)
                .arg(hints.live_until_ms())
                .arg(u8::from(touch))
                .arg(self.quotas.name(owner).unwrap_or_default());
            let r = Reply::ok(self.run(&inv).await?)?;
            if r.text(1).as_deref() == Some("done") {
                return Ok((answer, hints));
            }
            (version, stored) = match level {
                Level::Route => self
                    .read_route(key)
                    .await?
                    .map_or((0, None), |read| (read.hints_version, read.hints)),
                Level::Caller { .. } => self.read_caller(key).await?,
            };
        }
        Err(contended())
    }
}
