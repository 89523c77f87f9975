//! The controller on a virtual clock: one behaviour per test.

use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::*;

const T0: i64 = 1_700_000_000_000;

fn policy() -> PacingPolicy {
    PacingPolicy::default()
}

/// One report at `at`: `first` first attempts, `ok` successes, `rej`
/// rejections with these hint ends, under `cooldown`.
fn report(
    st: &mut PacingState,
    p: &PacingPolicy,
    at: i64,
    (first, ok, rej): (u32, u32, u32),
    hints: &[i64],
    cooldown: i64,
) {
    st.observe(
        &ReportSample {
            now_ms: at,
            first_attempts: first,
            successes: ok,
            rejections: rej,
            hint_until_ms: hints,
            cooldown_until_ms: cooldown,
            // As a store merges them: the hints raise the cooldown.
            cooldown_after_ms: hints.iter().copied().fold(cooldown, i64::max),
            counts_age_ms: 0,
        },
        p,
    );
}

/// A retry asking at `now_ms` on a cursor at `cursor_us`, a minute to its
/// deadline.
pub(super) fn ask(now_ms: i64, cursor_us: i64) -> WakeAsk {
    WakeAsk {
        asker: Asker::Retry,
        now_ms,
        floor_ms: now_ms,
        held_floor_ms: now_ms,
        deadline_ms: now_ms + 60_000,
        reserve_ms: 100,
        jitter_ppm: 0,
        waiting: 0,
        cursor_us,
    }
}

/// Grants `n` slots in the window starting at `at`, so the rate counts as used.
fn use_slots(st: &mut PacingState, p: &PacingPolicy, at: i64, n: usize) {
    let mut cursor = 0;
    for _ in 0..n {
        if let SlotDecision::Slot { cursor_us, .. } = st.decide(&ask(at, cursor), p) {
            cursor = cursor_us;
        }
    }
}

/// A route whose first attempts run at `first`/s, sent straight, and whose
/// limiter was measured at `rate`/s, cruising at the start of window
/// `T0 + 20 s`: ten clean windows, then a refusal at `T0 + 10 s` and more
/// 500 ms later (the limiter kept empty) with `rate / 2` served in between.
fn measured(p: &PacingPolicy, rate: u32, first: u32) -> PacingState {
    let mut st = PacingState::new(T0, p);
    for s in 0..10 {
        report(&mut st, p, T0 + s * 1000, (first, first, 0), &[], 0);
    }
    report(&mut st, p, T0 + 10_000, (first / 2, first / 2, 5), &[], 0);
    report(
        &mut st,
        p,
        T0 + 10_500,
        (first / 2, rate / 2, rate / 20),
        &[],
        0,
    );
    for s in 11..20 {
        report(&mut st, p, T0 + s * 1000, (first, first, 0), &[], 0);
    }
    st.advance(T0 + 20_000, p);
    assert_eq!(st.model().rate_m(), Some(i64::from(rate) * MILLI));
    assert_eq!(st.mode(), Mode::Steady, "{st:?}");
    st
}

/// ρ̂ = 1000/s, first attempts 800/s.
fn learned() -> PacingState {
    measured(&policy(), 1000, 800)
}

#[test]
fn a_new_route_is_paced_at_the_floor() {
    let p = policy();
    let st = PacingState::new(T0, &p);
    assert_eq!(st.wake_rate_m(), p.floor_m);
    assert_eq!(st.mode(), Mode::Steady);
}

#[test]
fn until_a_refusal_the_target_is_what_was_served_and_climbs_only_while_work_waits() {
    let p = policy();
    let mut st = PacingState::new(T0, &p);
    // 80/s served, 50/s of them first attempts: the rest was retries, and
    // nothing says the upstream serves more.
    for s in 0..5 {
        report(&mut st, &p, T0 + s * 1000, (50, 80, 0), &[], 0);
    }
    st.advance(T0 + 5_000, &p);
    assert_eq!(st.wake_rate_m(), 30_000);
    assert_eq!(st.mode(), Mode::Steady);
    // Retries use every slot: the target climbs past what was served by
    // an eighth of it, then by twice the step each window work waits, each
    // step climbed across the window after the one that earned it, from
    // what was served: the top a window reached is not proven by it.
    let mut steps = Vec::new();
    for (s, served) in [(5, 80), (6, 85), (7, 95), (8, 90)] {
        let at = T0 + s * 1000;
        use_slots(&mut st, &p, at, 200);
        report(&mut st, &p, at, (50, served, 0), &[], 0);
        st.advance(at + 1000, &p);
        let model::Phase::Startup {
            target_m, step_m, ..
        } = st.model().phase()
        else {
            panic!("{st:?}");
        };
        steps.push((target_m, step_m));
        if s == 7 {
            assert_eq!(st.mode(), Mode::Probing);
            assert_eq!(st.wake_rate_m(), 95_000 - 50_000, "the climb begins");
            st.advance(T0 + 8_500, &p);
            assert_eq!(st.wake_rate_m(), 115_000 - 50_000, "halfway up");
        }
    }
    // The last window served less than its climb began from (90 of a ramp
    // from 95 to 135): the next climb starts from where the last one did,
    // not from its top.
    assert_eq!(
        steps,
        [
            (90_000, 10_000),
            (105_000, 20_000),
            (135_000, 40_000),
            (175_000, 80_000)
        ]
    );
}

#[test]
fn a_refusal_holds_the_rate_that_drew_it_until_the_next_measures_the_limiter() {
    let p = policy();
    let mut st = PacingState::new(T0, &p);
    report(&mut st, &p, T0, (20, 60, 0), &[], 0);
    st.advance(T0 + 1_000, &p);
    let drew = st.wake_rate_m();
    assert_eq!(drew, 40_000);
    // The limiter is empty: the rate is held, not cut, so the next
    // refusal finds it empty again.
    report(&mut st, &p, T0 + 1_100, (2, 6, 1), &[], 0);
    assert_eq!(st.mode(), Mode::BackingOff);
    assert_eq!(st.wake_rate_m(), drew);
    // Within 300 ms of it another refusal proves nothing (the report
    // interval blurs both ends).
    report(&mut st, &p, T0 + 1_200, (2, 5, 1), &[], 0);
    assert_eq!(st.model().rate_m(), None);
    // 500 ms after the first, 25 served since it: 50/s.
    report(&mut st, &p, T0 + 1_600, (8, 20, 1), &[], 0);
    assert_eq!(st.model().rate_m(), Some(50_000));
    assert_eq!(st.wake_rate_m(), 50_000 * 15 / 16 - 20_000);
}

/// [`learned`], whose limiter then drops to 600/s under 800/s of first
/// attempts, measured by the window starting at `at` (returned): saturated.
fn saturated_at_600() -> (PacingState, i64) {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    report(&mut st, &p, at + 100, (80, 60, 20), &[], 0);
    assert!(!st.saturated);
    report(&mut st, &p, at + 600, (400, 300, 100), &[], 0);
    assert_eq!(st.model().rate_m(), Some(600_000));
    assert_eq!(st.mode(), Mode::Saturated);
    (st, at)
}

#[test]
fn first_attempts_that_reach_the_target_are_paced_with_everything_else() {
    let p = policy();
    let (mut st, at) = saturated_at_600();
    assert_eq!(st.wake_rate_m(), 600_000 * 15 / 16, "the whole target");
    assert!(holds_first_attempts(true, st.mode(), false, 0, 0, at + 600));
    // Held, first attempts wait for slots; while they ask for more than
    // the slots give, the route stays saturated.
    for s in 21..24 {
        let t = T0 + s * 1000;
        use_slots(&mut st, &p, t, 600);
        report(&mut st, &p, t, (560, 560, 0), &[], 0);
        st.advance(t + 1000, &p);
        assert_eq!(st.mode(), Mode::Saturated, "second {s}");
    }
    // First attempts fall to 300/s, asking for slots as they arrive: the
    // first window whose demand fits lets them go straight again.
    let mut s = 24;
    while st.mode() == Mode::Saturated && s < 40 {
        let t = T0 + s * 1000;
        let mut cursor = 0;
        for i in 0..300 {
            if let SlotDecision::Slot { cursor_us, .. } = st.decide(&ask(t + i * 3, cursor), &p) {
                cursor = cursor_us;
            }
        }
        report(&mut st, &p, t, (300, 300, 0), &[], 0);
        st.advance(t + 1000, &p);
        s += 1;
    }
    assert_eq!(s, 25, "released by the first window that fit");
    assert_eq!(st.wake_rate_m(), 562_500 - st.lam_m);
}

/// On a learned rate, a saturated route whose slots go unused calls nobody
/// back ([`PacingState::call_back`]): the rate is an estimate, and calling
/// the queue back to fill it turns a climb that overshoots into refusals
/// (docs/pacing.md, "Known limits").
#[test]
fn a_saturated_route_on_a_learned_rate_calls_nobody_back() {
    let p = policy();
    let (mut st, at) = saturated_at_600();
    let window = at + 1000;
    use_slots(&mut st, &p, window, 10);
    assert_eq!(st.mode(), Mode::Saturated);
    let mid = window + 500;
    assert_eq!(st.call_back(&ask(mid, mid * 1000), 0, &p), 0);
}

/// Saturated, a retry waiting out a cooldown that held first attempts need
/// not wait out is asked back at its end rather than booked there: booked,
/// it moved the route's one cursor past the intervals before the cooldown's
/// end, and every first attempt asking meanwhile was put after it.
#[test]
fn a_retrys_own_cooldown_leaves_the_intervals_before_it_to_first_attempts() {
    let p = policy();
    let (mut st, at) = saturated_at_600();
    let now = at + 700;
    let idle = now * 1000;
    let cooldown_end = now + 150;
    let retry = WakeAsk {
        floor_ms: cooldown_end,
        ..ask(now, idle)
    };
    let SlotDecision::AskAgain { at_ms } = st.decide(&retry, &p) else {
        panic!("a slot at the cooldown's end would take the intervals before it");
    };
    assert!(
        (cooldown_end..=cooldown_end + p.horizon_ms / 2).contains(&at_ms),
        "{at_ms}"
    );
    // Never past the last instant a slot still fits its deadline.
    let tight = WakeAsk {
        deadline_ms: cooldown_end + 100 + 10,
        jitter_ppm: cursor::JITTER_SCALE - 1,
        ..retry
    };
    assert_eq!(
        st.decide(&tight, &p),
        SlotDecision::AskAgain {
            at_ms: cooldown_end + 10
        }
    );
    // The cursor is untouched: a first attempt asking now goes now.
    let held = WakeAsk {
        asker: Asker::FirstAttempt { arriving: true },
        ..ask(now + 1, idle)
    };
    let SlotDecision::Slot { at_ms, .. } = st.decide(&held, &p) else {
        panic!("the first attempt is given the idle interval");
    };
    assert!(at_ms < cooldown_end, "{at_ms}");
    // A cooldown that closes the route holds first attempts as long: nobody
    // could use the intervals before its end, and the retry is booked there.
    let closing = WakeAsk {
        held_floor_ms: cooldown_end,
        ..retry
    };
    assert!(matches!(
        st.decide(&closing, &p),
        SlotDecision::Slot { at_ms, .. } if at_ms >= cooldown_end
    ));
    // Not saturated, first attempts do not ask for slots: booked there too.
    let mut calm = learned();
    assert!(matches!(
        calm.decide(&retry, &p),
        SlotDecision::Slot { at_ms, .. } if at_ms >= cooldown_end
    ));
}

/// Saturated, the first-attempt rate is what arrives, not what the slots
/// release: once arrivals stop, a backlog of held first attempts goes on
/// being released for as long as it lasts, and when it is gone the split
/// must wake retries at the target, not at the target less the backlog's
/// release rate (which left them at the floor).
#[test]
fn a_backlog_of_held_first_attempts_released_is_not_an_arrival_rate() {
    let p = policy();
    let (mut st, _) = saturated_at_600();
    // Nothing arrives any more; the slots release the first attempts held
    // before, as fast as they go, then the last few.
    for (s, released) in [(21, 560), (22, 560), (23, 560), (24, 100)] {
        let t = T0 + s * 1000;
        let mut cursor = 0;
        for i in 0..released {
            let held = WakeAsk {
                asker: Asker::FirstAttempt { arriving: false },
                ..ask(t + i, cursor)
            };
            if let SlotDecision::Slot { cursor_us, .. } = st.decide(&held, &p) {
                cursor = cursor_us;
            }
        }
        report(
            &mut st,
            &p,
            t,
            (released as u32, released as u32, 0),
            &[],
            0,
        );
        st.advance(t + 1000, &p);
    }
    assert_ne!(st.mode(), Mode::Saturated, "the backlog is gone");
    assert!(
        st.lam_m < 300_000,
        "first attempts stopped arriving four windows ago: {}",
        st.lam_m
    );
    assert!(
        st.wake_rate_m() > 562_500 / 2,
        "retries are woken at most of the target: {}",
        st.wake_rate_m()
    );
}

#[test]
fn waiting_intents_that_would_miss_their_deadline_put_first_attempts_in_line() {
    let p = policy();
    let at = T0 + 20_000;
    let window = |deadline_ms: i64| {
        let mut st = learned();
        use_slots(&mut st, &p, at, 200);
        // 5 000 ahead of it in deadline order: at the split rate (137/s)
        // its turn is about 36 s away.
        let queued = WakeAsk {
            waiting: 5000,
            deadline_ms,
            ..ask(at + 500, 1000 * (at + 1_000))
        };
        assert!(matches!(
            st.decide(&queued, &p),
            SlotDecision::AskAgain { .. }
        ));
        report(&mut st, &p, at + 500, (800, 937, 0), &[], 0);
        st.advance(at + 1_000, &p);
        st
    };
    assert_eq!(window(at + 10_000).mode(), Mode::Saturated);
    assert_ne!(window(at + 60_000).mode(), Mode::Saturated);
}

#[test]
fn late_intents_do_not_put_first_attempts_in_line_at_a_rate_nothing_estimates() {
    // A coordinator restarted during an outage: the route is new to it,
    // its target the floor, a placeholder nothing was seen to serve.
    let p = policy();
    let at = T0 + 20_000;
    let mut st = PacingState::new(at, &p);
    let queued = WakeAsk {
        waiting: 5000,
        deadline_ms: at + 10_000,
        ..ask(at + 500, 1000 * (at + 1_000))
    };
    assert!(matches!(
        st.decide(&queued, &p),
        SlotDecision::AskAgain { .. }
    ));
    st.advance(at + 1_000, &p);
    // Held to the floor, every attempt would wait seconds for slots first
    // attempts sent straight would have been served in.
    assert_ne!(st.mode(), Mode::Saturated);
    assert!(!holds_first_attempts(
        true,
        st.mode(),
        false,
        0,
        0,
        at + 1_000
    ));
}

#[test]
fn an_outage_teaches_nothing_and_the_fleet_resumes_when_its_hint_passes() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    let wake = st.wake_rate_m();
    // Out for 5 s: everything refused with hints to its end.
    let end = at + 5_300;
    for i in 0..10 {
        let t = at + 100 + i * 500;
        report(&mut st, &p, t, (400, 0, 400), &[end], end);
    }
    st.advance(end - 1, &p);
    assert_eq!(st.model().rate_m(), Some(1_000_000), "nothing learned");
    assert_eq!(st.closed_until, end);
    // Past its end, mid-window: the backlog goes now, at what was known.
    st.advance(end, &p);
    assert_eq!(st.mode(), Mode::Steady);
    assert_eq!(st.wake_rate_m(), wake);
}

#[test]
fn rejections_drawn_inside_a_closure_and_reported_after_it_are_not_refusals() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    let end = at + 5_000;
    report(&mut st, &p, at, (100, 0, 100), &[end], end);
    // After it, short hints that end before it ended: drawn inside it.
    report(&mut st, &p, end + 100, (80, 80, 30), &[end - 500], end);
    assert_eq!(st.w_refused, 0);
    assert_eq!(st.mode(), Mode::Steady);
}

#[test]
fn refusals_with_nothing_served_between_them_measure_no_rate() {
    // An upstream out that answers with short hints: empty to empty with
    // nothing in between is an outage, not a rate of zero.
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    for i in 0..20 {
        let t = at + 100 + i * 200;
        report(&mut st, &p, t, (160, 0, 160), &[t + 1_000], t);
    }
    assert_eq!(st.model().rate_m(), Some(1_000_000));
    assert!(st.wake_rate_m() > p.floor_m);
}

#[test]
fn never_below_the_floor_nor_above_the_ceiling() {
    let p = PacingPolicy {
        floor_m: 5_000,
        ceiling_m: 150_000,
        ..policy()
    };
    let mut st = PacingState::new(T0, &p);
    // Everything rejected for many windows.
    for s in 0..30 {
        report(&mut st, &p, T0 + s * 1000, (100, 0, 100), &[], 0);
    }
    st.advance(T0 + 30_000, &p);
    assert_eq!(st.wake_rate_m(), 5_000);
    // Then a huge, idle upstream and a backlog that uses every slot.
    for s in 30..60 {
        let at = T0 + s * 1000;
        use_slots(&mut st, &p, at, 1000);
        report(&mut st, &p, at, (100, 10_000, 0), &[], 0);
    }
    st.advance(T0 + 60_000, &p);
    assert_eq!(st.wake_rate_m(), 150_000);
}

#[test]
fn first_attempts_running_hot_take_the_retries_slots() {
    let p = policy();
    let mid = T0 + 20_500;
    let interval_us = 1_000_000_000 / (937_500 - 800_000);
    // Half a window in, first attempts at their average (800/s): a retry
    // asking now goes now.
    let mut calm = learned();
    report(&mut calm, &p, mid, (400, 400, 0), &[], 0);
    assert_eq!(
        calm.decide(&ask(mid, 0), &p),
        SlotDecision::Slot {
            at_ms: mid,
            cursor_us: mid * 1000 + interval_us + 1
        }
    );
    // At 1 400/s instead: the excess over the average's share and an
    // eighth of a window take the slots of the rest of the window, so the
    // retry is told to ask again rather than add to them.
    let mut hot = learned();
    report(&mut hot, &p, mid, (700, 700, 0), &[], 0);
    let decision = hot.decide(&ask(mid, 0), &p);
    assert!(
        matches!(decision, SlotDecision::AskAgain { .. }),
        "{decision:?}"
    );
    assert_eq!(
        hot.wake_rate_m(),
        calm.wake_rate_m(),
        "the rate is unchanged"
    );
    assert_eq!((hot.w_short, hot.w_late), (1, 0), "demand, not late");
    // With no average yet (a restarted coordinator), nothing is hot.
    let mut fresh = PacingState::new(T0 + 20_000, &p);
    report(&mut fresh, &p, mid, (700, 700, 0), &[], 0);
    assert!(matches!(
        fresh.decide(&ask(mid, 0), &p),
        SlotDecision::Slot { .. }
    ));
}

#[test]
fn a_re_arming_limiter_is_detected_and_released_with_one_probe() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    // Each rejected attempt, made while the previous 60 s window still
    // held, resets it to a full 60 s.
    for i in 0..3 {
        let t = at + i * 5_000;
        let cooldown = st.hint_until;
        report(&mut st, &p, t, (1, 0, 1), &[t + 60_000], cooldown);
    }
    assert_eq!(st.mode(), Mode::PenaltyExtending);
    assert_eq!(st.wake_rate_m(), 0);
    let opens = at + 10_000 + 60_000;
    assert_eq!(st.view(0, at).penalty_until_ms, opens);
    // Before it passes: ask again at the end, nothing granted.
    match st.decide(&ask(at + 20_000, 0), &p) {
        SlotDecision::AskAgain { at_ms } => assert_eq!(at_ms, opens),
        other => panic!("{other:?}"),
    }
    // After: exactly one probe, the others wait.
    assert!(matches!(
        st.decide(&ask(opens, 0), &p),
        SlotDecision::Slot { at_ms, .. } if at_ms == opens
    ));
    assert!(matches!(
        st.decide(&ask(opens + 10, 0), &p),
        SlotDecision::AskAgain { .. }
    ));
    // The probe succeeds: the route reopens at what was learned before.
    report(&mut st, &p, opens + 200, (0, 1, 0), &[], 0);
    assert_ne!(st.mode(), Mode::PenaltyExtending);
    assert!(st.wake_rate_m() > 0);
}

#[test]
fn a_rejected_probe_waits_for_the_new_end_and_probes_once_more() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    for i in 0..3 {
        let t = at + i * 2_000;
        let cooldown = st.hint_until;
        report(&mut st, &p, t, (1, 0, 1), &[t + 30_000], cooldown);
    }
    let opens = st.view(0, at).penalty_until_ms;
    assert!(matches!(
        st.decide(&ask(opens, 0), &p),
        SlotDecision::Slot { .. }
    ));
    report(&mut st, &p, opens + 100, (0, 0, 1), &[opens + 30_100], 0);
    assert_eq!(st.mode(), Mode::PenaltyExtending);
    assert_eq!(st.view(0, opens).penalty_until_ms, opens + 30_100);
    assert!(matches!(
        st.decide(&ask(opens + 30_100, 0), &p),
        SlotDecision::Slot { .. }
    ));
}

#[test]
fn hints_that_count_down_are_not_a_penalty() {
    let p = policy();
    let mut st = learned();
    let end = T0 + 40_000;
    // An honest outage: every hint names the same end (rounded up to whole
    // seconds, so they wobble by up to one second).
    for i in 0..50 {
        let t = T0 + 20_000 + i * 300;
        let wobble = (i % 2) * 900;
        report(&mut st, &p, t, (10, 0, 10), &[end + wobble], end);
    }
    assert_ne!(st.mode(), Mode::PenaltyExtending);
}

#[test]
fn a_pinned_number_is_obeyed() {
    let p = PacingPolicy {
        pinned_m: Some(50_000),
        ..policy()
    };
    let mut st = learned();
    st.advance(T0 + 21_000, &p);
    assert_eq!(st.wake_rate_m(), 50_000);
    assert_eq!(st.mode(), Mode::Pinned);
    for s in 21..30 {
        let at = T0 + s * 1000;
        use_slots(&mut st, &p, at, 100);
        report(
            &mut st,
            &p,
            at,
            (800, 850, if s % 2 == 0 { 30 } else { 0 }),
            &[],
            0,
        );
    }
    st.advance(T0 + 30_000, &p);
    assert_eq!(st.wake_rate_m(), 50_000);
}

#[test]
fn a_known_limit_paces_from_the_start() {
    // 600/min with the default share of a half: 5/s for the whole fleet.
    let p = PacingPolicy {
        known_limit_m: Some(5_000),
        ..policy()
    };
    let mut st = PacingState::new(T0, &p);
    assert_eq!(st.mode(), Mode::KnownLimit);
    assert_eq!(st.wake_rate_m(), 5_000);
    // First attempts take their share first.
    for s in 0..20 {
        report(&mut st, &p, T0 + s * 1000, (3, 3, 0), &[], 0);
    }
    st.advance(T0 + 20_000, &p);
    assert_eq!(st.wake_rate_m(), 2_000);
}

#[test]
fn a_slot_beyond_the_horizon_is_ask_again_and_a_risen_rate_applies_at_once() {
    let p = policy();
    let mut st = learned();
    let now = T0 + 20_000;
    let cooldown = now + 10_000;
    // The hint that closed the route.
    report(&mut st, &p, now, (10, 0, 10), &[cooldown], 0);
    let waiting = WakeAsk {
        floor_ms: cooldown,
        waiting: 4000,
        ..ask(now, 0)
    };
    let SlotDecision::AskAgain { at_ms } = st.decide(&waiting, &p) else {
        panic!("a slot 10 s ahead is not given");
    };
    // Most of the way to the estimated wait (10 s + 4000 ahead), and
    // never before the cooldown is within the horizon.
    assert!(
        at_ms >= cooldown - p.horizon_ms && at_ms < now + 40_000,
        "{at_ms}"
    );
    // At the cooldown's end a slot is given at the rate in force then.
    st.advance(cooldown, &p);
    let rate = st.wake_rate_m();
    let mut cursor = 0;
    let mut given = 0;
    while let SlotDecision::Slot { cursor_us, .. } = st.decide(
        &WakeAsk {
            floor_ms: cooldown,
            ..ask(cooldown, cursor)
        },
        &p,
    ) {
        cursor = cursor_us;
        given += 1;
    }
    // One horizon's worth at the rate in force.
    let per_horizon = rate * p.horizon_ms / 1000 / MILLI;
    assert!(
        (per_horizon - 3..=per_horizon + 2).contains(&given),
        "{given} of {per_horizon}"
    );
}

#[test]
fn a_deadline_no_rate_can_meet_is_refused_and_takes_nothing() {
    let p = policy();
    let mut st = learned();
    let now = T0 + 20_000;
    let ask = WakeAsk {
        floor_ms: now + 10_000,
        deadline_ms: now + 9_000,
        ..ask(now, 0)
    };
    assert_eq!(
        st.decide(&ask, &p),
        SlotDecision::Infeasible {
            at_ms: now + 10_000
        }
    );
    assert_eq!(st.w_granted, 0);
}

#[test]
fn extreme_inputs_from_a_peer_do_not_panic() {
    let p = policy();
    let mut st = learned();
    let now = T0 + 20_000;
    for hint in [i64::MIN, -1, i64::MAX] {
        report(
            &mut st,
            &p,
            now,
            (u32::MAX, u32::MAX, u32::MAX),
            &[hint],
            i64::MAX,
        );
        report(&mut st, &p, now, (0, 0, 1), &[hint, hint], 0);
    }
    for (floor, deadline, reserve, waiting) in [
        (i64::MAX, i64::MIN, i64::MAX, i64::MAX),
        (i64::MIN, i64::MAX, 0, -5),
        (now, i64::MAX, i64::MAX, i64::MAX),
    ] {
        let ask = WakeAsk {
            floor_ms: floor,
            deadline_ms: deadline,
            reserve_ms: reserve,
            waiting,
            ..ask(now, i64::MAX)
        };
        let _ = st.decide(&ask, &p);
    }
    st.advance(now + 100_000, &p);
}

#[test]
fn counts_may_wait_a_window_only_while_the_route_is_calm() {
    let now = T0;
    let told = |agreed| StatedView {
        in_force: InForce::Corroborated,
        agreed,
        ..StatedView::default()
    };
    assert_eq!(
        counts_hold_ms(Mode::Steady, &StatedView::default(), 0, false, now),
        WINDOW_MS
    );
    assert_eq!(
        counts_hold_ms(Mode::Pinned, &StatedView::default(), now, false, now),
        WINDOW_MS,
        "a cooldown that just passed"
    );
    assert_eq!(
        counts_hold_ms(Mode::Stated, &told(true), 0, false, now),
        WINDOW_MS,
        "paced by a stated limit"
    );
    // Saturated under a corroborated statement the workers agree on, first
    // attempts held: the pace is the statement's, and what the slots
    // release is counted by the coordinator as it grants them, so counts
    // need not come each tick.
    assert_eq!(
        counts_hold_ms(Mode::Saturated, &told(true), 0, true, now),
        WINDOW_MS,
        "saturated at a stated pace"
    );
    assert_eq!(
        counts_hold_ms(Mode::Saturated, &told(true), now + 1, true, now),
        0,
        "saturated at a stated pace, in a cooldown"
    );
    assert_eq!(
        counts_hold_ms(Mode::Saturated, &told(false), 0, true, now),
        0,
        "saturated at a stated pace the workers disagree on"
    );
    for weak in [InForce::Uncorroborated, InForce::Expired, InForce::None] {
        let stated = StatedView {
            in_force: weak,
            ..StatedView::default()
        };
        assert_eq!(
            counts_hold_ms(Mode::Saturated, &stated, 0, true, now),
            0,
            "saturated, learning: {weak:?}"
        );
    }
    assert_eq!(
        counts_hold_ms(Mode::Steady, &StatedView::default(), now + 1, false, now),
        0,
        "a cooldown in force"
    );
    assert_eq!(
        counts_hold_ms(Mode::Steady, &StatedView::default(), 0, true, now),
        0,
        "first attempts held"
    );
    for learning in [
        Mode::Probing,
        Mode::BackingOff,
        Mode::PenaltyExtending,
        Mode::Saturated,
        Mode::KnownLimit,
    ] {
        assert_eq!(
            counts_hold_ms(learning, &StatedView::default(), 0, false, now),
            0,
            "{learning:?}"
        );
    }
}

#[test]
fn refusals_that_did_not_keep_the_limiter_empty_measure_nothing() {
    // A herd woken in one instant by a whole-second hint draws a refusal
    // or two against a bucket its outage left empty; the fleet then sends
    // less than the limiter serves. Read as empty to empty, the few served
    // between would be its rate.
    let p = policy();
    let mut st = PacingState::new(T0, &p);
    for s in 0..5 {
        report(&mut st, &p, T0 + s * 1000, (800, 800, 0), &[], 0);
    }
    st.advance(T0 + 5_000, &p);
    let before = st.wake_rate_m();
    report(&mut st, &p, T0 + 5_100, (80, 80, 1), &[], 0);
    assert_eq!(st.mode(), Mode::BackingOff);
    report(&mut st, &p, T0 + 5_500, (320, 320, 1), &[], 0);
    assert_eq!(st.model().rate_m(), None, "nothing measured");
    assert_eq!(st.mode(), Mode::Steady);
    assert_eq!(st.wake_rate_m(), before);
}

#[test]
fn a_measurement_begins_when_serving_does() {
    // Out, answering with 1 s hints: refused with nothing served, then a
    // second of silence while the fleet waits them out. When it serves
    // again, 1 000/s in reports of 100 ms each, the reading starts there:
    // over the outage's tail it would read a third of that.
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    for i in 0..5 {
        let t = at + 100 + i * 100;
        report(&mut st, &p, t, (80, 0, 80), &[t + 1_000], t);
    }
    for i in 0..12 {
        st.observe(
            &ReportSample {
                now_ms: at + 2_000 + i * 100,
                first_attempts: 80,
                successes: 100,
                rejections: 2,
                counts_age_ms: 100,
                ..ReportSample::default()
            },
            &p,
        );
    }
    let rate = st.model().rate_m().expect("measured");
    assert!((900_000..=1_100_000).contains(&rate), "ρ̂ {rate}");
}

#[test]
fn counts_held_for_seconds_are_not_read_as_a_measurement() {
    // A measurement under way (the limiter refused at T0 + 1 100 and
    // serves 50/s): a report of counts held for two seconds arrives 200 ms
    // into it, with 100 served. Only those made since a report tick
    // before the measurement began, 15, count: read whole, the
    // measurement read 250/s.
    let p = policy();
    let mut st = PacingState::new(T0, &p);
    report(&mut st, &p, T0, (20, 60, 0), &[], 0);
    st.advance(T0 + 1_000, &p);
    report(&mut st, &p, T0 + 1_100, (2, 6, 1), &[], 0);
    report(&mut st, &p, T0 + 1_200, (2, 5, 1), &[], 0);
    st.observe(
        &ReportSample {
            now_ms: T0 + 1_300,
            first_attempts: 100,
            successes: 100,
            counts_age_ms: 2_000,
            ..ReportSample::default()
        },
        &p,
    );
    report(&mut st, &p, T0 + 1_600, (8, 20, 1), &[], 0);
    assert_eq!(st.model().rate_m(), Some(80_000));
}

#[test]
fn a_queue_waiting_out_a_starved_limiters_debt_is_asked_back_at_the_rate_it_returns_to() {
    let p = policy();
    // A probe from a proof starved the limiter: ρ̂ is back at 1 000/s and
    // the fleet sends the floor until the limiter has repaid its debt.
    let (model, at) = super::model_sim::starved_by_a_probe_from_a_proof();
    let mut st = PacingState::new(at, &p);
    st.model = model;
    // First attempts arrive at 800/s: more than the floor, every attempt
    // is paced.
    st.lam_m = 800 * MILLI;
    st.advance(at, &p);
    assert!(matches!(st.model().phase(), model::Phase::Recover { .. }));
    assert_eq!(st.mode(), Mode::Saturated);
    assert_eq!(st.wake_rate_m(), p.floor_m);
    // An intent behind 4 000 others, 30 s from its deadline, the slots
    // booked a second ahead.
    let queued = WakeAsk {
        waiting: 4000,
        deadline_ms: at + 30_000,
        ..ask(at, 1000 * (at + 1_000))
    };
    let SlotDecision::AskAgain { at_ms } = st.decide(&queued, &p) else {
        panic!("no slot is given 4 000 intents ahead at the floor");
    };
    // Its turn at ρ̂ is five windows away (the second booked, then four
    // at 1 000/s); at the floor's 1/s it would be past its deadline, and
    // it would be asked back at its last chance.
    let last_chance = queued.deadline_ms - queued.reserve_ms - p.horizon_ms;
    assert!(
        at_ms > at && at_ms <= at + 5 * WINDOW_MS,
        "asked back at {} ms, last chance {} ms",
        at_ms - at,
        last_chance - at
    );
}

/// How long after `now` an intent far back in the queue (5 000 ahead of
/// it, the slots booked a second ahead), whose deadline is `deadline_in`
/// ms away, is asked back, with `jitter_ppm` as the ask's draw.
fn behind_the_queue_asked_back_in(deadline_in: i64, jitter_ppm: u32) -> i64 {
    let p = policy();
    let mut st = measured(&p, 100, 0);
    let now = T0 + 20_000;
    let behind = WakeAsk {
        waiting: 5_000,
        deadline_ms: now + deadline_in,
        jitter_ppm,
        ..ask(now, 1000 * (now + 1_000))
    };
    match st.decide(&behind, &p) {
        SlotDecision::AskAgain { at_ms } => at_ms - now,
        other => panic!("{other:?}"),
    }
}

/// An intent whose turn lies past its last chance is asked back at its
/// last chance, less a draw over half the horizon: intents arriving at a
/// fixed rate would otherwise come back at that rate's phase, and a
/// fleet's workers would be served by their phases, not their deadlines.
#[test]
fn intents_asked_back_at_their_last_chance_come_back_spread_over_half_the_horizon() {
    let horizon = policy().horizon_ms;
    // A few seconds from its deadline; `ask`'s reserve is 100 ms.
    let asked_back = |jitter_ppm| behind_the_queue_asked_back_in(3_000, jitter_ppm);
    let last_chance = 3_000 - 100 - horizon;
    assert_eq!(asked_back(0), last_chance);
    let half = asked_back(cursor::JITTER_SCALE / 2);
    assert_eq!(half, last_chance - horizon / 4);
    let most = asked_back(cursor::JITTER_SCALE - 1);
    assert!(most < half && most > last_chance - horizon / 2, "{most}");
}

/// Past its last chance an intent still behind the queue polls for a slot
/// that frees within the horizon, every eighth of the horizon at most
/// rather than at every ask's floor.
#[test]
fn past_its_last_chance_an_intent_polls_every_eighth_of_the_horizon_at_most() {
    let horizon = policy().horizon_ms;
    // A slot at the horizon's end would still fit.
    let asked_back = |jitter_ppm| behind_the_queue_asked_back_in(100 + horizon, jitter_ppm);
    assert_eq!(asked_back(0), 1);
    assert_eq!(asked_back(cursor::JITTER_SCALE / 2), 1 + horizon / 16);
    assert!(asked_back(cursor::JITTER_SCALE - 1) <= 1 + horizon / 8);
}

/// nginx's `limit_req` without `burst` refuses a request that comes less
/// than 1/ρ after the last one it admitted. A fleet cruising at ρ̂ = ρ
/// sends it nothing it refuses, whatever the slots' draws: each slot is
/// jittered inside the part of its interval that cruise leaves unused.
/// Jittered over the whole interval, two slots came closer than 1/ρ at any
/// rate, and each refusal read as the limiter empty.
#[test]
fn a_limiter_with_no_burst_refuses_no_slot_of_a_cruise_at_its_rate() {
    let p = policy();
    let rate = 100;
    let mut st = measured(&p, rate, 0);
    let spacing_ms = 1000 / i64::from(rate);
    let (mut cursor, mut rng) = (0, StdRng::seed_from_u64(7));
    let (mut last, mut admitted, mut refused) = (None::<i64>, 0, 0);
    // Two seconds of a backlog asking every 50 ms, as many as get a slot.
    for now in (T0 + 20_000..T0 + 22_000).step_by(50) {
        loop {
            let jitter_ppm = rng.random_range(0..cursor::JITTER_SCALE);
            let SlotDecision::Slot { at_ms, cursor_us } = st.decide(
                &WakeAsk {
                    jitter_ppm,
                    ..ask(now, cursor)
                },
                &p,
            ) else {
                break;
            };
            cursor = cursor_us;
            // Slots come in the order given: the cursor only moves on.
            if last.is_some_and(|last| at_ms - last < spacing_ms) {
                refused += 1;
            } else {
                admitted += 1;
                last = Some(at_ms);
            }
        }
    }
    assert_eq!(refused, 0, "{admitted} admitted");
    // At cruise, from the first ask to the horizon of the last: the slots
    // were given, not refused.
    let cruise = model::CRUISE_GAIN.of((1_950 + p.horizon_ms) * i64::from(rate)) / 1000;
    assert!(
        (admitted - cruise).abs() <= 2,
        "{admitted} admitted, {cruise} at cruise"
    );
}
