//! The slot cursor: spreading a waiting fleet over time. Pure.
//!
//! After a cooldown ends, every waiting intent wants to go at once. A slot
//! cursor per route hands out one slot per `1 / wake_rate` interval, each at
//! a uniformly jittered point in the first sixteenth of its interval, so
//! any one-second span holds at most `wake_rate + 1` slots however large
//! the fleet is, and no two slots come much closer than an interval (a
//! limiter with no burst refuses two requests closer than its own
//! interval: `slot_jitter_us` in `slot.rs`). The
//! cursor is kept in microseconds so the bound holds for rates that do not
//! divide a second evenly. The wake rate and whether a slot is given now or
//! the intent is told to ask again are pacing's decision ([`SlotDecision`]);
//! this module keeps the cursor and the intents waiting on it.
//!
//! A slot reserves nothing (no token, no capacity): it is a time to re-check.
//! A slot that would not leave the intent's attempt reserve before its
//! deadline is refused and does not advance the cursor, so infeasible intents
//! never push feasible ones later.
//!
//! While intents wait for a rate too low for all of them, slots go in
//! deadline order: the cursor counts the intents told to ask again by their
//! deadline, and an intent's place in the queue is the number of them whose
//! deadline comes first. With every intent the same size, serving the
//! earliest deadline that can still be met first is what loses the fewest;
//! handing slots to whoever asks first loses an intent that had a second
//! left to one that had twenty.

use std::collections::{BTreeMap, HashMap};

use crate::pacing::{Asker, PacingPolicy, PacingState, SlotDecision, WINDOW_MS, WakeAsk};
use crate::tenancy::Tenant;

/// Intents waiting per route; beyond it (after dropping those whose slot has
/// passed) a new intent is refused rather than growing memory.
pub const MAX_PENDING_PER_ROUTE: usize = 10_000;
/// Jitter is given as parts per million of one slot interval.
pub const JITTER_SCALE: u32 = 1_000_000;
/// Waiting intents are counted by deadline in buckets this wide: fine
/// enough to order a backlog, coarse enough to sum them on every ask.
pub const DEADLINE_BUCKET_MS: i64 = 250;

/// Why a slot could not be considered at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Too many intents are waiting on this route.
    #[error("too many intents waiting on this route (max {MAX_PENDING_PER_ROUTE})")]
    TooManyWaiting,
}

/// One intent asking when to reconsider.
#[derive(Debug, Clone, Copy)]
pub struct SlotAsk<'a> {
    /// Repeated asks while a slot is pending get the same slot.
    pub intent_id: &'a str,
    /// `max(now, cooldown, backoff, the worker's not_before)`; for a first
    /// attempt, the cooldown only as far as it closes the route
    /// ([`PacingState::floor_for`](crate::pacing::PacingState::floor_for)).
    pub floor_ms: i64,
    /// The intent's end-to-end deadline.
    pub deadline_ms: i64,
    /// Time the attempt needs after the slot.
    pub reserve_ms: i64,
    /// The coordinator's clock.
    pub now_ms: i64,
    /// Where inside the jittered part of its interval the slot falls,
    /// `0..JITTER_SCALE`; drawn by the caller from an injected RNG so runs
    /// can be replayed.
    pub jitter_ppm: u32,
    /// A retry, or a first attempt held for a slot.
    pub asker: Asker,
    /// The asking token, whose quota a new scope is charged to
    /// ([`Tenant::NONE`] in open dev mode).
    pub tenant: Tenant,
    /// Whether a call-back this ask finds ([`SlotPlan::call_back`]) would
    /// be published: false while one published lately still stands, and
    /// the store need not look for the intents it would reach.
    pub may_call_back: bool,
}

/// The answer to a [`SlotAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOutcome {
    /// Reconsider at this instant.
    Slot(i64),
    /// The earliest slot would end after the deadline; nothing was recorded.
    DeadlineInfeasible(i64),
    /// No slot yet: ask again at this instant (the rate may have risen by
    /// then).
    AskAgain(i64),
}

/// The earliest instant to ask again of an intent a call-back at `now_ms`
/// still counts as listening ([`SlotCursor::call_back_until`]): one told
/// to ask again more than a horizon before now and not back since is
/// taken as gone (cancelled, say: nobody hears of that). A horizon is the
/// most a live intent's ask is late by before it is not worth calling.
/// Both stores take this bound; neither decides it.
pub fn call_back_listening_since(now_ms: i64, policy: &PacingPolicy) -> i64 {
    now_ms.saturating_sub(policy.horizon_ms)
}

/// The deadline bucket of an instant.
fn bucket(ms: i64) -> i64 {
    ms.div_euclid(DEADLINE_BUCKET_MS)
}

/// The deadlines, `[from, to)` in ms, of the intents told to ask again that
/// are ahead of `ask` in deadline order: those in an earlier bucket than
/// its own that could still start in time now. `None` when none can be.
pub fn ahead_range(ask: &SlotAsk<'_>) -> Option<(i64, i64)> {
    let from = bucket(ask.now_ms.saturating_add(ask.reserve_ms));
    let to = bucket(ask.deadline_ms);
    (from < to).then(|| {
        (
            from.saturating_mul(DEADLINE_BUCKET_MS),
            to.saturating_mul(DEADLINE_BUCKET_MS),
        )
    })
}

/// What a route's slots hold for one ask, read before it is decided: all a
/// store must tell [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotBook {
    /// The intent's pending slot, if it holds one.
    pub pending_ms: Option<i64>,
    /// Intents told to ask again whose deadline lies in
    /// [`ahead_range`]: the queue ahead of this one.
    pub ahead: u32,
    /// The cursor: start of the next free interval, Unix µs.
    pub cursor_us: i64,
}

/// What a decision changes in a route's slots. Every change but `Keep`
/// voids the intent's pending slot first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotChange {
    /// Nothing: the intent's pending slot stands.
    Keep,
    /// The intent holds slot `at_ms` and stops asking; the cursor moves to
    /// `cursor_us`.
    Book {
        /// The slot.
        at_ms: i64,
        /// The cursor after it.
        cursor_us: i64,
    },
    /// The intent is told to ask again and waits with `deadline_ms`
    /// (unless the route's asking intents are at their bound and it was
    /// not among them: it is still told to ask again, just not counted).
    Ask {
        /// Its deadline, which orders the queue and ends its wait.
        deadline_ms: i64,
        /// The instant it was told to ask again at: one that has not
        /// asked a horizon after it is not called back
        /// ([`SlotCursor::call_back_until`]).
        again_ms: i64,
    },
    /// The intent stops waiting (no slot can fit its deadline).
    Forget,
}

/// A decided ask: the answer, what it changes, and the pacing mode before
/// the decision (deciding can close a window and change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPlan {
    /// The answer to the intent.
    pub outcome: SlotOutcome,
    /// What the route's slots must record.
    pub change: SlotChange,
    /// The pacing mode before the decision.
    pub pacing_was: crate::pacing::Mode,
    /// Intents told to ask again to call back now, earliest deadlines
    /// first ([`PacingState::call_back`]); 0 for none.
    pub call_back: u32,
}

/// Decides `ask` on a route whose own floor (cooldown, backoff, mutes) is
/// `route_floor_ms`, from what its slots hold (`book`), at the rate
/// `pacing` has learned (or is pinned to). The one decision both stores
/// make: the memory store applies the change to its [`SlotCursor`], the
/// Redis store to its keys.
pub fn plan(
    book: &SlotBook,
    ask: &SlotAsk<'_>,
    route_floor_ms: i64,
    pacing: &mut PacingState,
    policy: &PacingPolicy,
) -> SlotPlan {
    let pacing_was = pacing.mode();
    let floor_ms = ask
        .floor_ms
        .max(pacing.floor_for(route_floor_ms, ask.asker.is_first_attempt(), ask.now_ms))
        .max(ask.now_ms);
    let held_floor_ms = pacing
        .floor_for(route_floor_ms, true, ask.now_ms)
        .max(ask.now_ms);
    if let Some(slot) = book.pending_ms {
        // Still pending and still after the floor: the same answer. A
        // floor that moved past it (a newer cooldown) voids it.
        if slot > ask.now_ms && slot >= floor_ms {
            return SlotPlan {
                outcome: SlotOutcome::Slot(slot),
                change: SlotChange::Keep,
                pacing_was,
                call_back: 0,
            };
        }
    }
    let wake = WakeAsk {
        now_ms: ask.now_ms,
        floor_ms,
        held_floor_ms,
        deadline_ms: ask.deadline_ms,
        reserve_ms: ask.reserve_ms,
        jitter_ppm: ask.jitter_ppm,
        waiting: i64::from(book.ahead),
        cursor_us: book.cursor_us,
        asker: ask.asker,
    };
    let mut call_back = 0;
    let (outcome, change) = match pacing.decide(&wake, policy) {
        SlotDecision::Slot { at_ms, cursor_us } => {
            if ask.may_call_back {
                call_back = pacing.call_back(&wake, route_floor_ms, policy);
            }
            (
                SlotOutcome::Slot(at_ms),
                SlotChange::Book { at_ms, cursor_us },
            )
        }
        // Past the bound the intent is still told to ask again, just not
        // recorded: the wait estimate saturates there anyway, and refusing
        // would send it to decide alone, all at once with every other
        // refused intent when the cooldown ends.
        SlotDecision::AskAgain { at_ms } => (
            SlotOutcome::AskAgain(at_ms),
            SlotChange::Ask {
                deadline_ms: ask.deadline_ms,
                again_ms: at_ms,
            },
        ),
        SlotDecision::Infeasible { at_ms } => {
            (SlotOutcome::DeadlineInfeasible(at_ms), SlotChange::Forget)
        }
    };
    SlotPlan {
        outcome,
        change,
        pacing_was,
        call_back,
    }
}

/// An intent told to ask again, as the memory store keeps it.
#[derive(Debug, Clone, Copy)]
struct Asking {
    deadline_ms: i64,
    again_ms: i64,
}

/// The slot cursor of one route and the intents waiting on it, as the
/// memory store keeps them.
#[derive(Debug, Clone, Default)]
pub struct SlotCursor {
    /// Start of the next free interval, in Unix microseconds.
    next_us: i64,
    /// Pending slots by intent, for idempotent asks.
    pending: HashMap<String, i64>,
    /// Intents told to ask again, by their deadline and the instant they
    /// were told to ask again at: the queue ahead of the next one asking,
    /// for the estimate of its wait, and who a call-back reaches.
    asking: HashMap<String, Asking>,
    /// How many of `asking` have their deadline in each bucket
    /// (`deadline / DEADLINE_BUCKET_MS`): an intent's place in the queue is
    /// the sum of the buckets before its own.
    deadlines: BTreeMap<i64, u32>,
    /// When `asking` was last cleared of intents past their deadline.
    pruned_ms: i64,
}

impl SlotCursor {
    /// Decides `ask` ([`plan`]) on a route whose own floor is
    /// `route_floor_ms` and records what it changes.
    pub fn assign(
        &mut self,
        ask: SlotAsk<'_>,
        route_floor_ms: i64,
        pacing: &mut PacingState,
        policy: &PacingPolicy,
    ) -> Result<SlotPlan, SlotError> {
        self.prune_asking(ask.now_ms);
        let book = SlotBook {
            pending_ms: self.pending.get(ask.intent_id).copied(),
            ahead: self.ahead_of(&ask),
            cursor_us: self.next_us,
        };
        let decided = plan(&book, &ask, route_floor_ms, pacing, policy);
        let intent = ask.intent_id;
        if decided.change != SlotChange::Keep {
            self.pending.remove(intent);
        }
        match decided.change {
            SlotChange::Keep => {}
            SlotChange::Book { at_ms, cursor_us } => {
                if self.pending.len() >= MAX_PENDING_PER_ROUTE {
                    self.pending.retain(|_, &mut s| s > ask.now_ms);
                    if self.pending.len() >= MAX_PENDING_PER_ROUTE {
                        return Err(SlotError::TooManyWaiting);
                    }
                }
                self.forget(intent);
                self.next_us = cursor_us;
                self.pending.insert(intent.to_owned(), at_ms);
            }
            SlotChange::Ask {
                deadline_ms,
                again_ms,
            } => {
                if self.asking.contains_key(intent) || self.asking.len() < MAX_PENDING_PER_ROUTE {
                    self.forget(intent);
                    let entry = Asking {
                        deadline_ms,
                        again_ms,
                    };
                    self.asking.insert(intent.to_owned(), entry);
                    *self.deadlines.entry(bucket(deadline_ms)).or_default() += 1;
                }
            }
            SlotChange::Forget => self.forget(intent),
        }
        Ok(decided)
    }

    /// The latest deadline among the `count` intents told to ask again
    /// whose deadlines come first (all of them, if fewer wait): a
    /// call-back reaching it wakes them. Only intents still listening
    /// count, those told to ask again at `since_ms` or later
    /// ([`call_back_listening_since`]): one gone would be called for
    /// nothing, and the intent behind it not at all. `None` when none
    /// waits, or `count` is 0.
    pub fn call_back_until(&self, count: u32, now_ms: i64, since_ms: i64) -> Option<i64> {
        if count == 0 {
            return None;
        }
        let mut live: Vec<i64> = self
            .asking
            .values()
            .filter(|a| a.deadline_ms > now_ms && a.again_ms >= since_ms)
            .map(|a| a.deadline_ms)
            .collect();
        let last = usize::try_from(count)
            .unwrap_or(usize::MAX)
            .min(live.len())
            .checked_sub(1)?;
        Some(*live.select_nth_unstable(last).1)
    }

    /// Intents told to ask again whose deadline lies in [`ahead_range`].
    fn ahead_of(&self, ask: &SlotAsk<'_>) -> u32 {
        ahead_range(ask).map_or(0, |(from, to)| {
            self.deadlines
                .range(bucket(from)..bucket(to))
                .map(|(_, &n)| n)
                .sum()
        })
    }

    /// Takes `intent` off the intents told to ask again.
    fn forget(&mut self, intent: &str) {
        if let Some(asking) = self.asking.remove(intent) {
            self.uncount(asking.deadline_ms);
        }
    }

    fn uncount(&mut self, deadline_ms: i64) {
        let key = bucket(deadline_ms);
        if let Some(n) = self.deadlines.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.deadlines.remove(&key);
            }
        }
    }

    /// Drops intents told to ask again whose deadline has passed, at most
    /// once a window (it walks the whole map).
    fn prune_asking(&mut self, now_ms: i64) {
        if now_ms - self.pruned_ms >= WINDOW_MS || self.asking.len() >= MAX_PENDING_PER_ROUTE {
            self.asking.retain(|_, a| a.deadline_ms > now_ms);
            self.deadlines.clear();
            for a in self.asking.values() {
                *self.deadlines.entry(bucket(a.deadline_ms)).or_default() += 1;
            }
            self.pruned_ms = now_ms;
        }
    }

    /// Intents told to ask again, not yet given a slot, whose deadline has
    /// not passed. An intent that stops waiting (cancelled by its caller,
    /// say) tells nobody, and the list is pruned only when someone asks, so
    /// the deadline is what ends its count: after a storm this falls to 0
    /// whether or not anyone asks again.
    pub fn asking(&self, now_ms: i64) -> usize {
        self.asking
            .values()
            .filter(|a| a.deadline_ms > now_ms)
            .count()
    }

    /// Intents whose slot is still ahead or who will ask again before
    /// their deadline, for idle eviction.
    pub fn waiting(&self, now_ms: i64) -> usize {
        self.pending.values().filter(|&&s| s > now_ms).count() + self.asking(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    const NOW: i64 = 1_700_000_000_000;

    /// A pinned rate: the fixed-rate cursor, slots at any distance.
    fn assign(
        cursor: &mut SlotCursor,
        ask: SlotAsk<'_>,
        rate: u32,
    ) -> Result<SlotOutcome, SlotError> {
        let policy = PacingPolicy {
            pinned_m: Some(i64::from(rate) * 1000),
            horizon_ms: crate::pacing::PINNED_HORIZON_MS,
            ..PacingPolicy::default()
        };
        let mut pacing = PacingState::new(ask.now_ms, &policy);
        cursor
            .assign(ask, 0, &mut pacing, &policy)
            .map(|p| p.outcome)
    }

    fn ask(intent: &str, floor_ms: i64, deadline_ms: i64, jitter_ppm: u32) -> SlotAsk<'_> {
        SlotAsk {
            intent_id: intent,
            floor_ms,
            deadline_ms,
            reserve_ms: 1000,
            now_ms: NOW,
            jitter_ppm,
            asker: Asker::Retry,
            tenant: Tenant::NONE,
            may_call_back: false,
        }
    }

    #[test]
    fn a_thousand_intents_are_spread_at_the_wake_rate() {
        for rate in [7, 50, 333, 1000] {
            let mut cursor = SlotCursor::default();
            let mut rng = StdRng::seed_from_u64(7);
            let cooldown = NOW + 30_000;
            let mut slots: Vec<i64> = (0..1000)
                .map(|i| {
                    let jitter = rng.random_range(0..JITTER_SCALE);
                    match assign(
                        &mut cursor,
                        ask(&format!("i{i}"), cooldown, i64::MAX, jitter),
                        rate,
                    ) {
                        Ok(SlotOutcome::Slot(slot)) => slot,
                        other => panic!("no deadline pressure here: {other:?}"),
                    }
                })
                .collect();
            assert!(slots.iter().all(|&s| s >= cooldown));
            slots.sort_unstable();
            // The busiest one-second span starting at any slot, not only
            // spans aligned to whole seconds.
            let busiest = slots
                .iter()
                .map(|&s| {
                    slots.partition_point(|&t| t < s + 1000) - slots.partition_point(|&t| t < s)
                })
                .max()
                .unwrap_or(0);
            assert!(
                busiest <= rate as usize + 1,
                "rate {rate}: busiest {busiest}"
            );
        }
    }

    #[test]
    fn asking_again_while_pending_returns_the_same_slot() {
        let mut cursor = SlotCursor::default();
        let first = assign(&mut cursor, ask("a", NOW + 5000, i64::MAX, 10), 10).expect("ok");
        let again = assign(&mut cursor, ask("a", NOW + 5000, i64::MAX, 999_999), 10).expect("ok");
        assert_eq!(first, again);
        let other = assign(&mut cursor, ask("b", NOW + 5000, i64::MAX, 10), 10).expect("ok");
        assert_ne!(first, other);
    }

    #[test]
    fn a_refused_slot_does_not_advance_the_cursor() {
        let mut cursor = SlotCursor::default();
        let deadline = NOW + 5_500;
        let refused = assign(&mut cursor, ask("late", NOW + 5000, deadline, 0), 1).expect("ok");
        assert_eq!(refused, SlotOutcome::DeadlineInfeasible(NOW + 5000));
        // Still the first interval: the refusal took nothing.
        let given = assign(&mut cursor, ask("ok", NOW + 5000, i64::MAX, 0), 1).expect("ok");
        assert_eq!(given, SlotOutcome::Slot(NOW + 5000));
        let next = assign(&mut cursor, ask("next", NOW + 5000, i64::MAX, 0), 1).expect("ok");
        assert_eq!(next, SlotOutcome::Slot(NOW + 6000));
    }

    #[test]
    fn a_later_floor_voids_a_pending_slot() {
        let mut cursor = SlotCursor::default();
        let first = assign(&mut cursor, ask("a", NOW + 1000, i64::MAX, 0), 10).expect("ok");
        assert_eq!(first, SlotOutcome::Slot(NOW + 1000));
        let moved = assign(&mut cursor, ask("a", NOW + 9000, i64::MAX, 0), 10).expect("ok");
        assert_eq!(moved, SlotOutcome::Slot(NOW + 9000));
    }

    #[test]
    fn the_earliest_deadline_takes_the_next_slot_unless_slots_go_unused() {
        // Learned pacing at its floor, one slot a second, a 250 ms horizon.
        let policy = PacingPolicy::default();
        let mut pacing = PacingState::new(NOW, &policy);
        let mut cursor = SlotCursor::default();
        let mut at = |intent: &str, now_ms: i64, deadline_ms: i64| {
            let ask = SlotAsk {
                now_ms,
                ..ask(intent, now_ms, deadline_ms, 0)
            };
            cursor
                .assign(ask, 0, &mut pacing, &policy)
                .expect("ok")
                .outcome
        };
        assert_eq!(at("first", NOW, NOW + 60_000), SlotOutcome::Slot(NOW));
        for (intent, deadline) in [("far", 60_000), ("farther", 50_000), ("near", 10_000)] {
            assert!(matches!(
                at(intent, NOW, NOW + deadline),
                SlotOutcome::AskAgain(_)
            ));
        }
        // The next slot is within the horizon, but two intents with earlier
        // deadlines wait: the one that asked first asks again.
        let next = NOW + 800;
        assert!(matches!(
            at("far", next, NOW + 60_000),
            SlotOutcome::AskAgain(_)
        ));
        assert_eq!(
            at("near", next, NOW + 10_000),
            SlotOutcome::Slot(NOW + 1000)
        );
        // Nobody asks for the slot after it: once the cursor has fallen an
        // interval behind, whoever asks takes one.
        let later = NOW + 3_500;
        assert_eq!(at("far", later, NOW + 60_000), SlotOutcome::Slot(later));
    }

    #[test]
    fn a_call_back_reaches_the_deadline_of_the_last_listening_intent_it_counts() {
        let mut cursor = SlotCursor::default();
        // Deadline and the instant each was told to ask again at.
        for (intent, deadline, again) in [
            ("d", 40_000, 5_000),
            ("a", 10_000, 1_000),
            ("c", 30_100, 2_000),
            ("b", 20_000, 9_000),
        ] {
            let asking = Asking {
                deadline_ms: NOW + deadline,
                again_ms: NOW + again,
            };
            cursor.asking.insert(intent.into(), asking);
        }
        // Listening: told to ask again at most `overdue` before now.
        let overdue = 250;
        assert_eq!(
            cursor.call_back_until(1, NOW, NOW - overdue),
            Some(NOW + 10_000)
        );
        assert_eq!(
            cursor.call_back_until(3, NOW, NOW - overdue),
            Some(NOW + 30_100)
        );
        assert_eq!(
            cursor.call_back_until(9, NOW, NOW - overdue),
            Some(NOW + 40_000),
            "fewer waiting: all of them"
        );
        assert_eq!(cursor.call_back_until(0, NOW, NOW - overdue), None);
        // "a" did not ask again by its instant and the overdue time after
        // it: taken as gone, the call-back reaches the next one instead.
        assert_eq!(
            cursor.call_back_until(1, NOW + 1_250, NOW + 1_250 - overdue),
            Some(NOW + 10_000)
        );
        assert_eq!(
            cursor.call_back_until(1, NOW + 1_251, NOW + 1_251 - overdue),
            Some(NOW + 20_000)
        );
        assert_eq!(
            cursor.call_back_until(2, NOW + 2_251, NOW + 2_251 - overdue),
            Some(NOW + 40_000)
        );
        assert_eq!(
            cursor.call_back_until(1, NOW + 9_251, NOW + 9_251 - overdue),
            None,
            "nobody listens"
        );
    }

    #[test]
    fn slots_are_never_before_now() {
        let mut cursor = SlotCursor::default();
        let out = assign(&mut cursor, ask("a", 0, i64::MAX, 0), 10).expect("ok");
        assert_eq!(out, SlotOutcome::Slot(NOW));
    }
}
