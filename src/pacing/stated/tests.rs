//! The weighing of stated limits on a virtual clock: corroboration, the
//! cap on one worker's claim, expiry, and the hook into the target.

use super::*;
use crate::pacing::{Mode, PacingPolicy, PacingState};

const T0: i64 = 1_700_000_000_000;

/// A usable statement by `worker` at `at`: `remaining` of `quota` per
/// second, resetting in `reset_ms`.
fn said(worker: &str, at: i64, quota: i64, remaining: i64, reset_ms: i64) -> Statement {
    Statement {
        worker: worker.to_owned(),
        received_ms: at,
        verdict: StatedVerdict::Usable,
        raw: format!("ratelimit: r={remaining}"),
        quota,
        window_ms: 1000,
        remaining,
        reset_ms,
        pace_m: Statement::pace_of(quota, 1000, remaining, reset_ms),
    }
}

fn weighing(needed: i64) -> Weighing {
    Weighing {
        needed,
        cap_ms: 10_000,
        min_owners: 1,
    }
}

/// One second of a route two workers state 1 000/s for, with nothing
/// spent: both statements at `at`, then a report of `first` first attempts
/// and `ok` successes.
fn stated_second(st: &mut PacingState, p: &PacingPolicy, at: i64, first: u32, ok: u32) {
    for w in ["a", "b"] {
        st.observe_statement(said(w, at, 1000, 1000, 1000), weighing(2), at, p);
    }
    st.observe(
        &crate::pacing::ReportSample {
            now_ms: at,
            first_attempts: first,
            successes: ok,
            ..crate::pacing::ReportSample::default()
        },
        p,
    );
}

#[test]
fn the_pace_spreads_what_remains_and_never_passes_the_rate() {
    // 10 000 a minute, 3 000 left, 31 s stated (30 to 31 s to go): 100/s.
    assert_eq!(
        Statement::pace_of(10_000, 60_000, 3_000, 31_000),
        Some(100_000)
    );
    // 9 000 left with 31 s stated would be 300/s: the rate caps it.
    assert_eq!(
        Statement::pace_of(10_000, 60_000, 9_000, 31_000),
        Some(166_666)
    );
    // A reset within the next second: the window's rate, unless nothing is
    // left.
    assert_eq!(Statement::pace_of(1000, 1000, 5, 1000), Some(1_000_000));
    assert_eq!(Statement::pace_of(1000, 1000, 0, 1000), Some(0));
    // Nothing says how fast.
    assert_eq!(Statement::pace_of(1000, 0, 100, 0), None);
    assert_eq!(Statement::pace_of(0, 0, 100, 1000), None);
}

#[test]
fn enough_workers_set_the_pace_less_the_margin() {
    let mut st = StatedState::default();
    for (i, w) in ["a", "b", "c"].iter().enumerate() {
        st.record(said(w, T0 + i as i64, 1000, 500, 1000), weighing(2), T0);
    }
    let (target, view) = st.target(50_000, 30, T0 + 10);
    assert_eq!(view.in_force, InForce::Corroborated);
    assert_eq!(
        target, 970_000,
        "the stated pace replaces a lower learned one"
    );
}

#[test]
fn one_liar_among_honest_workers_changes_nothing() {
    let honest = |st: &mut StatedState| {
        for w in ["a", "b", "c", "d"] {
            st.record(said(w, T0, 1000, 500, 1000), weighing(2), T0);
        }
    };
    let mut alone = StatedState::default();
    honest(&mut alone);
    let mut lied_low = alone.clone();
    lied_low.record(said("liar", T0, 1000, 1, 86_000_000), weighing(2), T0);
    let mut lied_high = alone.clone();
    lied_high.record(
        said("liar", T0, 1_000_000, 1_000_000, 1000),
        weighing(2),
        T0,
    );
    let expected = alone.target(800_000, 30, T0 + 1).0;
    assert_eq!(lied_low.target(800_000, 30, T0 + 1).0, expected);
    assert_eq!(lied_high.target(800_000, 30, T0 + 1).0, expected);
}

#[test]
fn an_uncorroborated_statement_only_slows_and_only_for_the_cap() {
    let mut st = StatedState::default();
    // One worker of a fleet that needs two: its high pace does not raise
    // the learned target.
    st.record(said("a", T0, 5000, 5000, 1000), weighing(2), T0);
    let (target, view) = st.target(800_000, 30, T0 + 1);
    assert_eq!(view.in_force, InForce::Uncorroborated);
    assert_eq!(target, 800_000);
    // Its low pace does, for as long as the cap from its streak's start,
    // however often it repeats it.
    let mut liar = StatedState::default();
    for s in 0..20 {
        let at = T0 + s * 1000;
        liar.record(said("liar", at, 1000, 1, 2000), weighing(2), at);
        let (target, _) = liar.target(800_000, 0, at);
        if s * 1000 < 10_000 {
            assert_eq!(target, 1_000, "second {s}");
        } else {
            assert_eq!(target, 800_000, "second {s}: past the cap");
        }
    }
}

#[test]
fn a_statement_that_stops_arriving_expires() {
    let mut st = StatedState::default();
    for w in ["a", "b"] {
        st.record(said(w, T0, 1000, 500, 1000), weighing(2), T0);
    }
    assert_eq!(
        st.target(1, 0, T0 + STATED_HOLD_MS - 1).1.in_force,
        InForce::Corroborated
    );
    let (target, view) = st.target(123_000, 0, T0 + STATED_HOLD_MS);
    assert_eq!(view.in_force, InForce::Expired);
    assert_eq!(target, 123_000);
}

#[test]
fn a_bad_verdict_is_evidence_and_withdraws_the_claim() {
    let mut st = StatedState::default();
    st.record(said("a", T0, 1000, 500, 1000), weighing(1), T0);
    assert_eq!(st.target(1, 0, T0).1.in_force, InForce::Corroborated);
    let bad = Statement {
        worker: "a".to_owned(),
        received_ms: T0 + 100,
        verdict: StatedVerdict::Absurd,
        raw: "x-ratelimit-reset: 99999999999".to_owned(),
        ..Statement::default()
    };
    st.record(bad, weighing(1), T0 + 100);
    assert_eq!(st.target(7_000, 0, T0 + 200), (7_000, st.view(0, T0 + 200)));
    assert_eq!(st.view(0, T0 + 200).in_force, InForce::Expired);
    let kept: Vec<_> = st.recent().map(|s| s.verdict).collect();
    assert_eq!(kept, [StatedVerdict::Usable, StatedVerdict::Absurd]);
}

#[test]
fn a_corroborated_statement_paces_every_attempt_from_the_start() {
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    assert_eq!(st.wake_rate_m(), p.floor_m);
    for w in ["a", "b"] {
        st.observe_statement(said(w, T0, 1000, 1000, 1000), weighing(2), T0, &p);
    }
    assert_eq!(st.mode(), Mode::Stated);
    // No search: the whole fleet's rate is the stated one less the margin.
    assert_eq!(st.wake_rate_m(), 970_000);
    let view = st.view(0, T0);
    assert_eq!(view.stated.pace_m, 970_000);
    assert_eq!(view.stated.workers, 2);
    // First attempts take their part of it; once they alone reach it, every
    // attempt waits for a slot.
    // (The first-attempt rate is a moving average, a quarter a window.)
    for s in 0..16 {
        let at = T0 + s * 1000;
        stated_second(&mut st, &p, at, if s < 2 { 400 } else { 1000 }, 400);
        if s == 1 {
            st.advance(at + 999, &p);
            assert_eq!(
                st.wake_rate_m(),
                570_000,
                "the pace less 400/s of first attempts"
            );
            // What an operator reads: the stated pace is the capacity, and
            // the first attempts leave the rest of it spare.
            let view = st.view(0, at + 999);
            assert_eq!(view.capacity_m, 970_000, "the stated pace");
            assert_eq!(view.spare_m, 570_000);
        }
    }
    st.advance(T0 + 16_000, &p);
    assert_eq!(st.mode(), Mode::Saturated);
    assert!(crate::pacing::holds_first_attempts(
        true,
        st.mode(),
        false,
        0,
        0,
        T0
    ));
    assert_eq!(st.wake_rate_m(), 970_000, "every attempt at the pace");
    // It stops arriving: learned pacing again.
    let gone = T0 + 15_000 + STATED_HOLD_MS;
    // Read before anything settles the route (no report comes in an
    // outage): the expired statement no longer sets the capacity, which
    // read 0 when it still did.
    assert!(st.view(0, gone).capacity_m > 0);
    st.advance(gone, &p);
    assert_ne!(st.mode(), Mode::Stated);
    assert_eq!(st.view(0, gone).stated.in_force, InForce::Expired);
}

#[test]
fn the_state_round_trips_through_the_store_encoding() {
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    for w in ["a", "b", "c"] {
        st.observe_statement(said(w, T0, 1000, 400, 700), weighing(2), T0, &p);
    }
    assert_eq!(PacingState::decode(&st.encode()), Ok(st));
}

#[test]
fn where_tokens_share_the_scope_one_tokens_workers_cannot_set_the_pace_alone() {
    let weighing = |min_owners| Weighing {
        needed: 2,
        cap_ms: 1000,
        min_owners,
    };
    let record = |st: &mut StatedState, min_owners| {
        // One token's invented workers state one request left.
        for w in ["t1:a", "t1:b", "t1:c"] {
            st.record(said(w, T0, 1000, 1, 1000), weighing(min_owners), T0);
        }
    };
    let lie = Statement::pace_of(1000, 1000, 1, 1000).expect("a pace");

    // Inside one token, its workers corroborate each other.
    let mut alone = StatedState::default();
    record(&mut alone, 1);
    let (_, view) = alone.target(50_000, 0, T0 + 10);
    assert_eq!(view.in_force, InForce::Corroborated);
    assert_eq!(view.pace_m, lie);

    // Shared by tokens: uncorroborated, so the lie lowers the pace for the
    // cap at most, then changes nothing.
    let mut shared = StatedState::default();
    record(&mut shared, 2);
    let (target, view) = shared.target(50_000, 0, T0 + 10);
    assert_eq!(view.in_force, InForce::Uncorroborated);
    assert_eq!(target, lie.min(50_000));
    let (target, _) = shared.target(50_000, 0, T0 + 1500);
    assert_eq!(target, 50_000, "past the cap the learned target stands");

    // Another token's worker states what it sees: the lowest pace both
    // tokens allow is its own.
    shared.record(
        said("t2:d", T0 + 1500, 1000, 500, 1000),
        weighing(2),
        T0 + 1500,
    );
    let (_, view) = shared.target(50_000, 0, T0 + 1600);
    assert_eq!(view.in_force, InForce::Corroborated);
    assert_eq!(
        view.pace_m,
        Statement::pace_of(1000, 1000, 500, 1000).expect("a pace")
    );
}

#[test]
fn a_queue_told_nothing_is_left_is_not_sent_to_its_last_chance() {
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    // First attempts alone reach the stated pace: every attempt is paced.
    for s in 0..16 {
        stated_second(&mut st, &p, T0 + s * 1000, 1000, 970);
    }
    // An outage: the upstream states nothing is left. The target comes to
    // nothing, so the rate is the floor, and the route stays saturated.
    let now = T0 + 16_000;
    for w in ["a", "b"] {
        st.observe_statement(said(w, now, 1000, 0, 1000), weighing(2), now, &p);
    }
    assert_eq!(st.mode(), Mode::Saturated);
    assert_eq!(st.wake_rate_m(), p.floor_m);
    // An intent behind 4 000 others, its floor a 10 s cooldown away.
    let ask = crate::pacing::WakeAsk {
        asker: crate::pacing::Asker::Retry,
        now_ms: now,
        floor_ms: now + 10_000,
        held_floor_ms: now,
        deadline_ms: now + 30_000,
        reserve_ms: 100,
        jitter_ppm: 0,
        waiting: 4000,
        cursor_us: 0,
    };
    let crate::pacing::SlotDecision::AskAgain { at_ms } = st.decide(&ask, &p) else {
        panic!("no slot is given 10 s ahead");
    };
    // The floor is not the capacity that returns after the outage: the wait
    // is estimated as if the rate rose as fast as it can, so the intent asks
    // again soon after the cooldown. At the floor's 10/s, 4 000 ahead would
    // send it to its last chance (30 s less the reserve and the horizon),
    // behind every intent that asks after it.
    let last_chance = ask.deadline_ms - ask.reserve_ms - p.horizon_ms;
    assert!(
        at_ms >= ask.floor_ms - p.horizon_ms && at_ms < now + 20_000,
        "asked back at {} ms, last chance {} ms",
        at_ms - now,
        last_chance - now
    );
}

#[test]
fn workers_agree_once_all_but_fewer_than_needed_state_the_pace_in_force() {
    let agreed = |paces: &[(&str, i64)]| {
        let mut st = StatedState::default();
        for &(w, quota) in paces {
            st.record(said(w, T0, quota, quota, 1000), weighing(2), T0);
        }
        st.view(30, T0 + 10).agreed
    };
    assert!(agreed(&[("a", 1000), ("b", 1000), ("c", 1000)]));
    // One of three (fewer than the two needed) states more or less: the
    // pace holds, and so does the agreement.
    assert!(agreed(&[("a", 1000), ("b", 1000), ("c", 5000)]));
    assert!(agreed(&[("a", 1), ("b", 1000), ("c", 1000)]));
    // A quota changing, heard by some workers and not yet by others: the
    // next statements move the pace.
    assert!(!agreed(&[("a", 400), ("b", 400), ("c", 1000), ("d", 1000)]));
    // Too few to corroborate: nothing to agree on.
    assert!(!agreed(&[("a", 1000)]));
}

/// Saturated at a stated pace, every intent waits its turn in deadline
/// order, asked back at the instant its turn was estimated at. When the
/// asks thin out (arrivals stop) the window gives out less than the pace
/// with nothing booked ahead: the quota goes unused, and the route calls
/// back the intents half a horizon's slots serve. Not while enough is
/// booked ahead or given out, nor under a cooldown.
#[test]
fn a_stated_pace_whose_slots_go_unused_calls_back_half_a_horizon_of_intents() {
    use crate::pacing::SlotDecision;
    use crate::pacing::tests::ask;
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    for s in 0..16 {
        stated_second(
            &mut st,
            &p,
            T0 + s * 1000,
            if s < 2 { 400 } else { 1000 },
            400,
        );
    }
    // Slots at the start of the window, a horizon's worth at a time.
    let window = T0 + 16_000;
    let grant = |st: &mut PacingState, n: usize| {
        let mut cursor = 0;
        for _ in 0..n {
            let decided = st.decide(&ask(window, cursor), &p);
            let SlotDecision::Slot { cursor_us, .. } = decided else {
                panic!("within the horizon: {decided:?}");
            };
            cursor = cursor_us;
        }
    };
    grant(&mut st, 10);
    assert_eq!(st.mode(), Mode::Saturated);
    let mid = window + 500;
    let idle = ask(mid, mid * 1000);
    // 970 slots a second (the stated 1 000 less the margin) for 125 ms.
    assert_eq!(st.wake_rate_m(), 970_000);
    assert_eq!(st.call_back(&idle, 0, &p), 121);
    let booked = ask(mid, (mid + p.horizon_ms / 2 + 1) * 1000);
    assert_eq!(st.call_back(&booked, 0, &p), 0, "slots booked ahead");
    assert_eq!(st.call_back(&idle, mid + 1, &p), 0, "a cooldown holds them");
    // The window's first half gives out its share, 7/8 of 485.
    for n in [200, 200, 14] {
        grant(&mut st, n);
    }
    assert_eq!(st.call_back(&idle, 0, &p), 121, "one short of the share");
    grant(&mut st, 1);
    assert_eq!(st.call_back(&idle, 0, &p), 0, "the share given out");
}

/// A quota stated anew (back after a brownout) binds within a window once
/// 2 × needed − 1 workers state it, while the older claims of workers that
/// sent nothing since still live; fewer recent claims than that, or fewer
/// than `needed` liars among them, do not move the pace.
#[test]
fn a_new_quota_binds_once_enough_workers_state_it_within_a_window() {
    let pace = |st: &mut StatedState, now: i64| st.target(50_000, 30, now).1.pace_m;
    let brownout = || {
        let mut st = StatedState::default();
        for w in ["a", "b", "c", "d", "e"] {
            st.record(said(w, T0, 400, 400, 1000), weighing(2), T0);
        }
        st
    };
    let mut st = brownout();
    assert_eq!(pace(&mut st, T0 + 10), 388_000, "400/s less the margin");
    let back = T0 + 1_500;
    for w in ["a", "b"] {
        st.record(said(w, back, 1000, 1000, 1000), weighing(2), back);
    }
    assert_eq!(pace(&mut st, back + 10), 388_000, "two of three needed");
    st.record(said("c", back, 1000, 1000, 1000), weighing(2), back);
    assert_eq!(pace(&mut st, back + 10), 970_000, "three within the window");
    // One liar among three recent claims cannot raise it.
    let mut st = brownout();
    for w in ["a", "b"] {
        st.record(said(w, back, 400, 400, 1000), weighing(2), back);
    }
    st.record(said("liar", back, 5000, 5000, 1000), weighing(2), back);
    assert_eq!(pace(&mut st, back + 10), 388_000);
}
