//! One route's state in the memory store, kept small: a million routes must
//! fit in well under a gigabyte.
//!
//! # Why the odd shapes
//! The map entry (key and value inline, at hashbrown's load factor) is paid
//! by every route, so it holds only a compact key and four words: the time
//! it was last touched and three optional boxes. The budget ledger is boxed
//! and dropped while it is quiet (nothing in the longest window, no live
//! lease); the learned pacing is boxed and dropped with it; hints, the slot
//! cursor and a freeze are boxed together and dropped while inert. A route
//! with no activity in its window costs its key and the entry; one with a
//! lease and a report costs the ledger's few small vectors and the pacing
//! controller on top (`tollgate-bench memory` measures both).

use crate::budget::BudgetLedger;
use crate::hints::{HintRecord, HintState};
use crate::pacing::cursor::{
    SlotAsk, SlotCursor, SlotError, SlotOutcome, call_back_listening_since,
};
use crate::pacing::{Mode, PacingPolicy, PacingState, PacingView};
use crate::scope::RouteKey;
use crate::tenancy::Owner;

/// `n` in `radix` (10 or 16, lowercase), zero-padded to `width` (at most
/// 20), written at the end of `buf`; the digits are returned.
#[inline]
fn digits(buf: &mut [u8; 20], mut n: u64, radix: u64, width: usize) -> &[u8] {
    let mut at = buf.len();
    while n > 0 || at == buf.len() {
        at -= 1;
        buf[at] = b"0123456789abcdef"[(n % radix) as usize];
        n /= radix;
    }
    while buf.len() - at < width.min(buf.len()) {
        at -= 1;
        buf[at] = b'0';
    }
    &buf[at..]
}

/// Appends `n` in `radix` (10 or 16, lowercase), zero-padded to `width`.
#[inline]
pub(super) fn push_digits(out: &mut String, n: u64, radix: u64, width: usize) {
    let mut buf = [0; 20];
    // Only ASCII digits: the conversion cannot fail.
    out.push_str(std::str::from_utf8(digits(&mut buf, n, radix, width)).unwrap_or_default());
}

/// A [`RouteKey`] as one allocation: `"{caller_len}:{caller_scope}{route}"`.
/// The length prefix makes it injective for any two names (no separator
/// character a name could contain), and the ordering of routes is restored
/// by decoding, where it is needed (listing), not paid on every lookup.
/// Maps of names are searched by `&str` ([`RouteLookup`]): the derived
/// `Hash` and `Eq` are the `str`'s, as `Borrow` requires.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct RouteName(Box<str>);

impl std::borrow::Borrow<str> for RouteName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Names up to this long are built on the stack to be looked up: a
/// validated caller scope (128 bytes) and route (256) with their length
/// prefix fit.
const STACK_NAME: usize = 400;

/// A route as an operation looks it up: its key, and its name built once
/// (however often the operation finds the route: a Report does five
/// times), on the stack when it fits. A heap string per lookup cost more
/// than the map's probe.
pub(super) struct RouteLookup<'a> {
    key: &'a RouteKey,
    stack: [u8; STACK_NAME],
    len: usize,
    /// The name when it does not fit on the stack; empty otherwise.
    heap: String,
}

impl<'a> RouteLookup<'a> {
    pub(super) fn of(key: &'a RouteKey) -> Self {
        let mut buf = [0; 20];
        let prefix = digits(&mut buf, key.caller_scope.len() as u64, 10, 1);
        let parts = [
            prefix,
            b":",
            key.caller_scope.as_bytes(),
            key.route.as_bytes(),
        ];
        let mut lookup = RouteLookup {
            key,
            stack: [0; STACK_NAME],
            len: 0,
            heap: String::new(),
        };
        if parts.iter().map(|p| p.len()).sum::<usize>() <= STACK_NAME {
            for part in parts {
                lookup.stack[lookup.len..lookup.len + part.len()].copy_from_slice(part);
                lookup.len += part.len();
            }
        } else {
            push_digits(&mut lookup.heap, key.caller_scope.len() as u64, 10, 1);
            lookup.heap.push(':');
            lookup.heap.push_str(&key.caller_scope);
            lookup.heap.push_str(&key.route);
        }
        lookup
    }

    pub(super) fn key(&self) -> &'a RouteKey {
        self.key
    }

    /// The route's [`RouteName`], as the map is searched by.
    pub(super) fn name(&self) -> &str {
        if self.heap.is_empty() {
            // Whole `str`s and ASCII: the concatenation is UTF-8.
            std::str::from_utf8(&self.stack[..self.len]).unwrap_or_default()
        } else {
            &self.heap
        }
    }
}

impl RouteName {
    pub(super) fn of(key: &RouteKey) -> Self {
        RouteName(RouteLookup::of(key).name().into())
    }

    pub(super) fn caller_scope(&self) -> &str {
        self.split().0
    }

    pub(super) fn route(&self) -> &str {
        self.split().1
    }

    fn split(&self) -> (&str, &str) {
        // Every name is built by `of`, so the prefix parses and the length
        // ends on a character boundary; degrade to an empty caller rather
        // than panic if that ever stops being true.
        let (len, rest) = self.0.split_once(':').unwrap_or(("0", &self.0));
        let len = len.parse::<usize>().unwrap_or(0);
        match (rest.get(..len), rest.get(len..)) {
            (Some(caller), Some(route)) => (caller, route),
            _ => ("", rest),
        }
    }

    pub(super) fn key(&self) -> RouteKey {
        RouteKey {
            caller_scope: self.caller_scope().to_owned(),
            route: self.route().to_owned(),
        }
    }
}

/// Hints, slots and a freeze: absent for most routes most of the time.
#[derive(Debug, Default)]
struct Extras {
    hints: HintState,
    slots: SlotCursor,
    frozen: Option<String>,
}

/// When a route was last touched (low 48 bits, two's complement: ±4 000
/// years of Unix milliseconds) and its [`Owner`] (high 16 bits), in the
/// one word the entry already had for the time: every route has an owner,
/// and a word more per route is 8 MB per million routes.
#[derive(Debug, Clone, Copy)]
struct Stamp(u64);

impl Stamp {
    const TIME_BITS: u32 = 48;
    const TIME_MASK: u64 = (1 << Self::TIME_BITS) - 1;
    const MAX_MS: i64 = (1 << (Self::TIME_BITS - 1)) - 1;

    fn new(now_ms: i64, owner: Owner) -> Self {
        let ms = now_ms.clamp(-Self::MAX_MS - 1, Self::MAX_MS);
        Stamp((u64::from(owner.get()) << Self::TIME_BITS) | (ms as u64 & Self::TIME_MASK))
    }

    fn ms(self) -> i64 {
        // Shifting the 48 bits to the top and back extends their sign.
        ((self.0 << (64 - Self::TIME_BITS)) as i64) >> (64 - Self::TIME_BITS)
    }

    fn owner(self) -> Owner {
        Owner::from_raw((self.0 >> Self::TIME_BITS) as u16)
    }
}

/// State of one `(caller_scope, route)`.
#[derive(Debug)]
pub(super) struct RouteState {
    /// For idle and pressure eviction (coldest first), and whose quota the
    /// route is charged to.
    stamp: Stamp,
    /// `None` while quiet: a quiet ledger equals a new one.
    budget: Option<Box<BudgetLedger>>,
    /// `None` while hints, slots and freeze are all in their initial state.
    extras: Option<Box<Extras>>,
    /// The learned pacing, kept apart from the extras so a route that only
    /// reports pays for the controller alone; `None` while quiet.
    pacing: Option<Box<PacingState>>,
}

/// The hint state of a route that never had any.
static NO_HINTS: HintState = HintState {
    cooldown_until_ms: 0,
    backoff_step: 0,
    backoff_until_ms: 0,
    recent: std::collections::VecDeque::new(),
    workers: std::collections::BTreeMap::new(),
    mutes: std::collections::BTreeMap::new(),
    corroboration: crate::hints::corroboration::Corroboration {
        until_ms: 0,
        corroborated: false,
        workers: 0,
        reporters: 0,
        needed: 0,
    },
};

impl RouteState {
    pub(super) fn new(now_ms: i64, owner: Owner) -> Self {
        RouteState {
            stamp: Stamp::new(now_ms, owner),
            budget: None,
            extras: None,
            pacing: None,
        }
    }

    /// When any operation last touched the route.
    pub(super) fn last_touched_ms(&self) -> i64 {
        self.stamp.ms()
    }

    /// Marks the route touched at `now_ms` (never moving back).
    pub(super) fn touch(&mut self, now_ms: i64) {
        if now_ms > self.stamp.ms() {
            self.stamp = Stamp::new(now_ms, self.stamp.owner());
        }
    }

    /// The token whose quota the route is charged to.
    pub(super) fn owner(&self) -> Owner {
        self.stamp.owner()
    }

    /// The ledger, built on first use.
    pub(super) fn budget(&mut self, now_ms: i64) -> &mut BudgetLedger {
        self.budget
            .get_or_insert_with(|| Box::new(BudgetLedger::new(now_ms)))
    }

    /// The ledger if one is kept; a quiet route has none.
    pub(super) fn budget_if_any(&self) -> Option<&BudgetLedger> {
        self.budget.as_deref()
    }

    fn extras(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    pub(super) fn hints(&self) -> &HintState {
        self.extras.as_ref().map_or(&NO_HINTS, |e| &e.hints)
    }

    pub(super) fn hints_mut(&mut self) -> &mut HintState {
        &mut self.extras().hints
    }

    /// The route's pacing, started at `now_ms` under `policy` if new.
    pub(super) fn pacing_mut(&mut self, now_ms: i64, policy: &PacingPolicy) -> &mut PacingState {
        self.pacing
            .get_or_insert_with(|| Box::new(PacingState::new(now_ms, policy)))
    }

    /// The route's pacing state, if it has one.
    pub(super) fn pacing(&self) -> Option<&PacingState> {
        self.pacing.as_deref()
    }

    /// What an operator sees of the route's pacing at `now_ms`, read from a
    /// copy so looking changes nothing.
    pub(super) fn pacing_view(&self, now_ms: i64, policy: &PacingPolicy) -> PacingView {
        let mut pacing = self
            .pacing
            .as_deref()
            .cloned()
            .unwrap_or_else(|| PacingState::new(now_ms, policy));
        pacing.advance(now_ms, policy);
        pacing.view(
            self.extras.as_deref().map_or(0, |e| e.slots.asking(now_ms)),
            now_ms,
        )
    }

    /// A slot, ask again, or a refusal for `ask` at the route's wake rate,
    /// after the route's floor (`route_floor_ms`: its cooldown, backoff and
    /// mutes); also the pacing mode before it, and the latest deadline it
    /// calls back.
    pub(super) fn assign_slot(
        &mut self,
        ask: SlotAsk<'_>,
        route_floor_ms: i64,
        policy: &PacingPolicy,
    ) -> Result<(SlotOutcome, PacingView, Mode, Option<i64>), SlotError> {
        let pacing = self
            .pacing
            .get_or_insert_with(|| Box::new(PacingState::new(ask.now_ms, policy)));
        let extras = self.extras.get_or_insert_with(Box::default);
        let plan = extras.slots.assign(ask, route_floor_ms, pacing, policy)?;
        let since_ms = call_back_listening_since(ask.now_ms, policy);
        let call_back = extras
            .slots
            .call_back_until(plan.call_back, ask.now_ms, since_ms);
        Ok((
            plan.outcome,
            pacing.view(extras.slots.asking(ask.now_ms), ask.now_ms),
            plan.pacing_was,
            call_back,
        ))
    }

    pub(super) fn frozen(&self) -> Option<&String> {
        self.extras.as_ref().and_then(|e| e.frozen.as_ref())
    }

    pub(super) fn set_frozen(&mut self, reason: Option<String>) {
        if reason.is_some() || self.extras.is_some() {
            self.extras().frozen = reason;
        }
    }

    pub(super) fn recent_hints(&self) -> Vec<HintRecord> {
        self.hints().recent.iter().cloned().collect()
    }

    pub(super) fn live_leases(&self, now_ms: i64) -> usize {
        self.budget_if_any().map_or(0, |b| b.live_leases(now_ms))
    }

    pub(super) fn waiting(&self, now_ms: i64) -> usize {
        self.extras.as_ref().map_or(0, |e| e.slots.waiting(now_ms))
    }

    /// Forgets the budget, hints and slot cursor; keeps the freeze.
    pub(super) fn reset(&mut self, now_ms: i64) {
        self.budget = None;
        self.pacing = None;
        // Mutes are an operator's decision, like the freeze.
        let (frozen, mutes) = self
            .extras
            .take()
            .map(|e| (e.frozen, e.hints.mutes))
            .unwrap_or_default();
        self.set_frozen(frozen);
        if !mutes.is_empty() {
            self.hints_mut().mutes = mutes;
        }
        self.touch(now_ms);
    }

    /// Whether evicting the route would lose something live: a freeze, a
    /// cooldown or backoff ahead, an unexpired lease, a waiting intent.
    pub(super) fn pinned(&self, now_ms: i64) -> bool {
        self.busy(now_ms) || self.hints().live_until_ms() > now_ms
    }

    /// Whether the route is in use beyond its evidence: a freeze or a
    /// mute (an operator's), an unexpired lease, a waiting intent. Its
    /// owner at its quota may evict a route that is not, cooldown or not:
    /// a tenant must not keep scopes by cooling them down itself.
    pub(super) fn busy(&self, now_ms: i64) -> bool {
        self.frozen().is_some()
            || self.hints().mutes.values().any(|&until| until > now_ms)
            || self.live_leases(now_ms) > 0
            || self.waiting(now_ms) > 0
    }

    /// Drops the parts that are back in their initial state: a quiet
    /// ledger, and hints, slots and freeze when all are inert (no freeze, no
    /// hint on record, no backoff step, nothing waiting). Only for a route
    /// untouched for the longest window, so nothing a live scope relies on
    /// (the slot cursor's spacing) is forgotten.
    pub(super) fn compact(&mut self, now_ms: i64) {
        if self.budget.as_mut().is_some_and(|b| b.is_quiet(now_ms)) {
            self.budget = None;
        }
        // Nothing reported for a window: the learned pacing is stale (its
        // windows would close as empty) and is learned again from traffic.
        self.pacing = None;
        let inert = self.extras.as_ref().is_some_and(|e| {
            e.frozen.is_none()
                && e.hints.recent.is_empty()
                && e.hints.workers.is_empty()
                && e.hints.mutes.is_empty()
                && e.hints.backoff_step == 0
                && e.hints.live_until_ms() <= now_ms
                && e.slots.waiting(now_ms) == 0
        });
        if inert {
            self.extras = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_written_as_format_would() {
        let digits = |n: u64, radix: u64, width: usize| {
            let mut s = String::new();
            push_digits(&mut s, n, radix, width);
            s
        };
        for n in [0, 7, 10, 255, 4096, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(digits(n, 10, 1), format!("{n}"));
            assert_eq!(digits(n, 16, 1), format!("{n:x}"));
            assert_eq!(digits(n, 16, 8), format!("{n:08x}"));
        }
        let long = "c".repeat(12_345);
        let key = RouteKey {
            caller_scope: long.clone(),
            route: "r".into(),
        };
        assert_eq!(&*RouteName::of(&key).0, format!("12345:{long}r"));
        assert_eq!(RouteLookup::of(&key).name(), format!("12345:{long}r"));
        let short = RouteKey {
            caller_scope: "tenant".into(),
            route: "GET /x".into(),
        };
        assert_eq!(RouteLookup::of(&short).name(), "6:tenantGET /x");
        let widest = RouteKey {
            caller_scope: "c".repeat(128),
            route: "r".repeat(256),
        };
        let lookup = RouteLookup::of(&widest);
        assert!(lookup.heap.is_empty(), "validated names fit on the stack");
        assert_eq!(lookup.name(), &*RouteName::of(&widest).0);
    }

    #[test]
    fn names_round_trip_and_never_collide() {
        let a = RouteKey {
            caller_scope: "ab".into(),
            route: "c".into(),
        };
        let b = RouteKey {
            caller_scope: "a".into(),
            route: "bc".into(),
        };
        assert_ne!(RouteName::of(&a), RouteName::of(&b));
        assert_eq!(RouteName::of(&a).key(), a);
        let odd = RouteKey {
            caller_scope: "1:x:".into(),
            route: ":2".into(),
        };
        assert_eq!(RouteName::of(&odd).key(), odd);
    }

    #[test]
    fn the_stamp_keeps_time_and_owner_apart() {
        for ms in [
            0,
            1,
            -1,
            1_704_110_400_000,
            Stamp::MAX_MS,
            -Stamp::MAX_MS - 1,
        ] {
            for owner in [Owner::NONE, Owner::token(0), Owner::from_raw(u16::MAX)] {
                let stamp = Stamp::new(ms, owner);
                assert_eq!((stamp.ms(), stamp.owner()), (ms, owner));
            }
        }
        assert_eq!(Stamp::new(i64::MAX, Owner::NONE).ms(), Stamp::MAX_MS);
        let mut route = RouteState::new(10, Owner::token(2));
        route.touch(5);
        route.touch(20);
        assert_eq!(
            (route.last_touched_ms(), route.owner()),
            (20, Owner::token(2))
        );
    }

    #[test]
    fn the_entry_stays_four_words() {
        assert_eq!(std::mem::size_of::<RouteState>(), 32);
        assert_eq!(std::mem::size_of::<RouteName>(), 16);
    }
}
