//! The controller on a virtual clock: one behaviour per test.

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
        &Observation {
            now_ms: at,
            first_attempts: first,
            successes: ok,
            rejections: rej,
            hint_until_ms: hints,
            cooldown_until_ms: cooldown,
            // As a store merges them: the hints raise the cooldown.
            cooldown_after_ms: hints.iter().copied().fold(cooldown, i64::max),
        },
        p,
    );
}

fn ask(now_ms: i64, cursor_us: i64) -> WakeAsk {
    WakeAsk {
        first_attempt: false,
        now_ms,
        floor_ms: now_ms,
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

/// A state that has learned capacity 1000/s with first attempts 800/s and
/// last drew rejections at 250/s, at the start of window `T0 + 20 s`.
fn learned() -> PacingState {
    at_window_20(1_000_000, 800_000, 200_000, 250_000)
}

/// A state with this capacity, first-attempt rate, wake rate and edge, at
/// the start of window `T0 + 20 s`.
fn at_window_20(cap_m: i64, lam_m: i64, rate_m: i64, rate_max_m: i64) -> PacingState {
    PacingState {
        cap_m,
        lam_m,
        rate_m,
        rate_max_m,
        ..PacingState::new(T0 + 20_000, &policy())
    }
}

#[test]
fn a_new_route_is_paced_at_the_floor() {
    let p = policy();
    let st = PacingState::new(T0, &p);
    assert_eq!(st.wake_rate_m(), p.floor_m);
    assert_eq!(st.mode(), Mode::Steady);
}

#[test]
fn the_spare_left_by_first_attempts_is_learned() {
    let p = policy();
    let mut st = PacingState::new(T0, &p);
    for s in 0..20 {
        report(&mut st, &p, T0 + s * 1000, (800, 800, 0), &[], 0);
    }
    // One saturated window measures the capacity; the next, unused, paces
    // at the spare it leaves.
    report(&mut st, &p, T0 + 20_000, (800, 1000, 40), &[], 0);
    report(&mut st, &p, T0 + 21_000, (800, 800, 0), &[], 0);
    st.advance(T0 + 22_000, &p);
    assert_eq!(st.capacity_m(), 1_000_000);
    assert!((st.spare_m() - 200_000).abs() < 5_000, "{}", st.spare_m());
    assert_eq!(st.wake_rate_m(), st.spare_m());
}

#[test]
fn a_burst_of_rejections_cuts_once_per_window() {
    let p = policy();
    let mut st = learned();
    let before = st.wake_rate_m();
    let at = T0 + 20_000;
    // Fifty reports, each with rejections, all in one window; the upstream
    // served no less than before, so only the halving bound applies.
    for i in 0..50 {
        report(&mut st, &p, at + i * 10, (16, 16, 5), &[at + 1000], 0);
    }
    st.advance(at + 1000, &p);
    assert_eq!(st.mode(), Mode::BackingOff);
    // Served 800, as many as the first attempts: the measured spare is
    // nothing, and one cut halves.
    assert_eq!(st.wake_rate_m(), before / 2);
}

#[test]
fn a_capacity_that_came_back_smaller_is_learned_from_one_saturated_window() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    // Serving 900/s while rejecting: capacity 900, spare ~100.
    report(&mut st, &p, at, (800, 900, 100), &[], 0);
    st.advance(at + 1000, &p);
    assert_eq!(st.capacity_m(), 900_000);
    assert!(
        (st.wake_rate_m() - 100_000).abs() < 2_000,
        "{}",
        st.wake_rate_m()
    );
}

/// First attempts are counted when reported, slots when granted: held first
/// attempts released near a window's end arrive in the next one looking
/// straight. With few real first attempts, a retry-rate probe's rejections
/// there are a probe's, not first attempts overflowing the upstream: the
/// rate is cut, never the whole fleet paced at a few successes' worth.
#[test]
fn first_attempts_released_by_slots_are_no_overflow() {
    let p = policy();
    let mut st = PacingState {
        cap_m: 650_000,
        lam_m: 25_000,
        rate_m: 664_000,
        rate_ok_m: 628_000,
        mode: Mode::Probing,
        ..PacingState::new(T0 + 20_000, &p)
    };
    let at = T0 + 20_000;
    report(&mut st, &p, at + 100, (10, 2, 5), &[], 0);
    assert_eq!(st.mode(), Mode::BackingOff, "a probe's rejections cut it");
    assert_eq!(st.wake_rate_m(), 628_000, "back to the last clean rate");
    report(&mut st, &p, at + 900, (227, 211, 33), &[], 0);
    st.advance(at + 1000, &p);
    assert_ne!(st.mode(), Mode::Saturated);
    assert!(st.wake_rate_m() >= 314_000, "{}", st.wake_rate_m());
}

#[test]
fn rejections_during_a_cooldown_do_not_collapse_the_estimate() {
    let p = policy();
    let mut st = learned();
    let before = (st.wake_rate_m(), st.capacity_m());
    let start = T0 + 20_000;
    let end = start + 10_000;
    // The outage: the first 429 carries a 10 s hint (closing, not overload),
    // the rest arrive under the cooldown it set. Nothing is served.
    report(&mut st, &p, start, (80, 0, 80), &[end], 0);
    for t in (start + 100..end).step_by(100) {
        report(&mut st, &p, t, (80, 0, 80), &[end], end);
    }
    st.advance(end, &p);
    assert_eq!((st.wake_rate_m(), st.capacity_m()), before);
}

/// Short hints drawn by the rate's own overshoot, back to back, keep a
/// cooldown in force in which every later rejection arrives. They are a
/// cut's stragglers for one window, not for ever: after that the rate steps
/// down each window (a Retry-After that kept extending the cooldown must
/// not freeze an overshooting rate).
#[test]
fn back_to_back_short_hints_do_not_freeze_an_overshooting_rate() {
    let p = policy();
    let mut st = learned();
    let start = T0 + 20_000;
    let mut cooldown = 0;
    let mut rates = Vec::new();
    for w in 0..6 {
        let at = start + w * 1000;
        for i in 0..10 {
            let now = at + i * 100;
            // Each rejection's 1 s hint, rounded up to the next second.
            let until = (now / 1000 + 2) * 1000;
            report(&mut st, &p, now, (80, 95, 10), &[until], cooldown);
            cooldown = cooldown.max(until);
        }
        st.advance(at + 1000, &p);
        rates.push(st.wake_rate_m());
    }
    // The first window answers its first rejection; the second is its
    // stragglers'; from the third on the rate steps down every window.
    for w in 2..6 {
        assert!(rates[w] < rates[w - 1], "{rates:?}");
    }
    assert!(
        st.capacity_m() <= st.lam_m + rates[4],
        "{}",
        st.capacity_m()
    );
}

/// A window that drew rejections measures the edge: the rate goes just
/// under it, climbs back to it, then past it by sixteenths. A clean window
/// that serves more than the edge (the limiter's burst, banked while the
/// cut held) does not carry the rate past it in one step.
#[test]
fn a_measured_edge_is_approached_by_sixteenths_not_by_a_burst() {
    let p = policy();
    let mut st = learned();
    let at = T0 + 20_000;
    // 200/s of retries on 800/s of first attempts; the upstream serves 1000.
    report(&mut st, &p, at, (800, 1000, 40), &[], 0);
    st.advance(at + 1000, &p);
    assert_eq!(st.mode(), Mode::BackingOff);
    assert_eq!(st.wake_rate_m(), just_under(200_000));
    // Clean, and 80 more served than the edge: back to the edge only.
    report(&mut st, &p, at + 1000, (800, 1080, 0), &[], 0);
    st.advance(at + 2000, &p);
    assert_eq!(st.wake_rate_m(), 200_000);
    // Clean again: a sixteenth past it.
    report(&mut st, &p, at + 2000, (800, 1000, 0), &[], 0);
    st.advance(at + 3000, &p);
    assert_eq!(st.wake_rate_m(), 212_500);
}

/// A saturated route whose first attempts fit again keeps the edge its
/// saturated windows measured: retries probe past what it leaves by
/// sixteenths, not with the doubling of a route that never found one.
#[test]
fn leaving_saturation_keeps_the_measured_edge() {
    let p = policy();
    let mut st = PacingState {
        cap_m: 600_000,
        lam_m: 200_000,
        rate_m: 550_000,
        rate_ok_m: 550_000,
        rate_max_m: 600_000,
        mode: Mode::Saturated,
        ..PacingState::new(T0 + 20_000, &p)
    };
    let at = T0 + 20_000;
    // Every intent that asked got a slot, nothing was refused.
    report(&mut st, &p, at, (200, 200, 0), &[], 0);
    st.advance(at + 1000, &p);
    assert_eq!(st.mode(), Mode::Steady);
    assert_eq!(st.wake_rate_m(), 400_000, "what first attempts leave");
    // Used, and clean: a sixteenth more.
    report(&mut st, &p, at + 1000, (200, 600, 0), &[], 0);
    st.advance(at + 2000, &p);
    assert_eq!(st.mode(), Mode::Probing);
    assert_eq!(st.wake_rate_m(), 425_000);
}

#[test]
fn the_rate_grows_only_when_it_was_used() {
    let p = policy();
    let mut st = learned();
    let before = st.wake_rate_m();
    // Five windows with no retries and no slots asked: nothing to learn.
    for s in 20..25 {
        report(&mut st, &p, T0 + s * 1000, (800, 800, 0), &[], 0);
    }
    st.advance(T0 + 25_000, &p);
    assert!(
        st.wake_rate_m() <= before,
        "{} > {before}",
        st.wake_rate_m()
    );
    assert_eq!(st.mode(), Mode::Steady);
    // Now used, and clean: it grows.
    let at = T0 + 25_000;
    use_slots(&mut st, &p, at, 400);
    report(&mut st, &p, at, (800, 1000, 0), &[], 0);
    st.advance(at + 1000, &p);
    assert_eq!(st.mode(), Mode::Probing);
    assert!(st.wake_rate_m() > before);
}

#[test]
fn first_attempts_running_hot_take_the_retries_slots() {
    let p = policy();
    let mid = T0 + 20_500;
    // Half a window in, first attempts at their average (800/s): a retry
    // asking now goes now.
    let mut calm = learned();
    report(&mut calm, &p, mid, (400, 400, 0), &[], 0);
    assert_eq!(
        calm.decide(&ask(mid, 0), &p),
        SlotDecision::Slot {
            at_ms: mid,
            cursor_us: mid * 1000 + 5_000
        }
    );
    // At 1 400/s instead: the 200 beyond the average's share and an eighth
    // of a window take the slots of the rest of the window (5 ms apart at
    // 200/s), so the retry is told to ask again rather than add to them.
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
    assert_eq!(
        (hot.w_short, hot.w_late),
        (1, 0),
        "demand the window had, not late for the rate"
    );
    // With no average yet (a restarted coordinator), nothing is hot.
    let mut fresh = PacingState::new(T0 + 20_000, &p);
    report(&mut fresh, &p, mid, (700, 700, 0), &[], 0);
    assert!(matches!(
        fresh.decide(&ask(mid, 0), &p),
        SlotDecision::Slot { .. }
    ));
    // Saturated, every attempt is paced already: nothing is taken twice.
    let mut paced = saturated(200_000, 250_000);
    report(&mut paced, &p, mid, (700, 700, 0), &[], 0);
    assert!(matches!(
        paced.decide(&ask(mid, 0), &p),
        SlotDecision::Slot { .. }
    ));
}

/// A coordinator restarted two seconds before an outage ends hears only
/// its last, short hints (none closes the route). The window in which the
/// upstream comes back mixes the outage's last rejections with its first
/// successes: that is not first attempts overflowing a tiny capacity, and
/// the route is not paced at a few successes' worth.
#[test]
fn a_coordinator_restarted_late_in_an_outage_takes_its_stragglers_for_no_overflow() {
    let p = policy();
    let mut st = PacingState::new(T0 + 6_000, &p);
    // Whole-second hints: each says a second more than the outage has left.
    report(&mut st, &p, T0 + 6_500, (80, 0, 80), &[T0 + 7_900], 0);
    report(
        &mut st,
        &p,
        T0 + 7_500,
        (160, 0, 160),
        &[T0 + 8_400],
        T0 + 7_900,
    );
    // The upstream is back at 8.5 s; the reports of the window carry the
    // outage's last rejections, then its first successes.
    let cooldown = T0 + 9_400;
    report(
        &mut st,
        &p,
        T0 + 8_400,
        (80, 0, 80),
        &[cooldown],
        T0 + 8_400,
    );
    report(&mut st, &p, T0 + 8_600, (30, 4, 26), &[cooldown], cooldown);
    report(&mut st, &p, T0 + 8_900, (50, 48, 2), &[cooldown], cooldown);
    st.advance(T0 + 9_000, &p);
    assert_ne!(st.mode(), Mode::Saturated, "at 9 s");
    // The first whole window back serves the fleet.
    report(&mut st, &p, T0 + 9_500, (160, 160, 0), &[], cooldown);
    st.advance(T0 + 10_000, &p);
    assert_ne!(st.mode(), Mode::Saturated, "at 10 s");
    assert!(st.capacity_m() >= 160_000, "{}", st.capacity_m());
}

/// A window that saturates the route may count more successes than the
/// upstream serves: requests queued while the coordinator was paused and
/// the counts its workers held meanwhile land in it together. The pace is
/// not set above the capacity known before that window.
#[test]
fn a_saturating_window_paces_no_faster_than_the_capacity_known_before_it() {
    let p = policy();
    let mut st = learned();
    report(&mut st, &p, T0 + 20_500, (1500, 1300, 200), &[], 0);
    st.advance(T0 + 21_000, &p);
    assert_eq!(st.mode(), Mode::Saturated);
    assert_eq!(st.capacity_m(), 1_000_000);
    assert!(st.wake_rate_m() < 1_000_000, "{}", st.wake_rate_m());
}

#[test]
fn never_below_the_floor_nor_above_the_ceiling() {
    let p = PacingPolicy {
        floor_m: 5_000,
        ceiling_m: 150_000,
        ..policy()
    };
    let mut st = PacingState::new(T0, &p);
    // Everything rejected for many windows: halving stops at the floor.
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
    assert_eq!(st.penalty_until, opens);
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
    let opens = st.penalty_until;
    assert!(matches!(
        st.decide(&ask(opens, 0), &p),
        SlotDecision::Slot { .. }
    ));
    report(&mut st, &p, opens + 100, (0, 0, 1), &[opens + 30_100], 0);
    assert_eq!(st.mode(), Mode::PenaltyExtending);
    assert_eq!(st.penalty_until, opens + 30_100);
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
    assert!(
        (st.wake_rate_m() - 2_000).abs() <= 20,
        "{}",
        st.wake_rate_m()
    );
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
        at_ms >= cooldown - p.horizon_ms && at_ms < now + 20_000,
        "{at_ms}"
    );
    // At the cooldown's end a slot is given at the rate in force then.
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
    // One horizon's worth at ~200/s.
    let per_horizon = 200 * p.horizon_ms / 1000;
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
}

#[test]
fn first_attempts_that_crowd_out_waiting_deadlines_are_paced_with_them() {
    let p = policy();
    let at = T0 + 20_000;
    let window = |late: bool| {
        let mut st = learned();
        use_slots(&mut st, &p, at, 100);
        // An intent with 5 000 ahead of it in deadline order and 10 s left:
        // at 200/s its turn comes after its deadline.
        let queued = WakeAsk {
            waiting: 5000,
            deadline_ms: at + if late { 10_000 } else { 60_000 },
            ..ask(at, 1000 * (at + 1_000))
        };
        assert!(matches!(
            st.decide(&queued, &p),
            SlotDecision::AskAgain { .. }
        ));
        // At the edge: first attempts took most of what was served.
        report(&mut st, &p, at + 500, (800, 950, 60), &[], 0);
        st.advance(at + 1_000, &p);
        st
    };
    let crowded = window(true);
    assert_eq!(crowded.mode(), Mode::Saturated);
    assert_eq!(crowded.wake_rate_m(), just_under(950_000));
    assert!(holds_first_attempts(
        true,
        crowded.mode(),
        false,
        0,
        0,
        at + 1_000
    ));
    // The same window with every waiting intent able to wait its turn: a
    // retry rate that found the edge, first attempts still go straight.
    let roomy = window(false);
    assert_eq!(roomy.mode(), Mode::BackingOff);
}

#[test]
fn counts_may_wait_a_window_only_while_the_route_is_calm() {
    let now = T0;
    assert_eq!(counts_hold_ms(Mode::Steady, 0, false, now), WINDOW_MS);
    assert_eq!(
        counts_hold_ms(Mode::Pinned, now, false, now),
        WINDOW_MS,
        "a cooldown that just passed"
    );
    assert_eq!(
        counts_hold_ms(Mode::Steady, now + 1, false, now),
        0,
        "a cooldown in force"
    );
    assert_eq!(
        counts_hold_ms(Mode::Steady, 0, true, now),
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
        assert_eq!(counts_hold_ms(learning, 0, false, now), 0, "{learning:?}");
    }
}

/// A route that served 216/s of first attempts and nothing else: its spare
/// above that is unknown. At the start of window `T0 + 20 s`.
fn unprobed() -> PacingState {
    at_window_20(216_000, 200_000, 18_000, 0)
}

/// [`unprobed`] after one clean window that used its rate: slow start's
/// first step, being climbed in window `T0 + 21 s`.
fn one_step_in(p: &PacingPolicy) -> PacingState {
    let mut st = unprobed();
    let w = T0 + 20_000;
    use_slots(&mut st, p, w, 20);
    report(&mut st, p, w + 500, (200, 218, 0), &[], 0);
    st.advance(w + 1000, p);
    st
}

#[test]
fn slow_start_doubles_its_step_and_climbs_it_across_the_window() {
    let p = policy();
    let mut st = one_step_in(&p);
    let w = T0 + 20_000;
    assert_eq!(st.mode(), Mode::Probing);
    let step = st.wake_rate_m() - 18_000;
    assert_eq!(
        step,
        st.capacity_m() / PROBE_HEADROOM,
        "an eighth of what was served"
    );
    // Climbed across the window, not jumped at its start.
    assert_eq!(st.rate_at(w + 1000), 18_000);
    assert_eq!(st.rate_at(w + 1500), 18_000 + step / 2);
    assert_eq!(st.rate_at(w + 2000), st.wake_rate_m());
    assert_eq!(st.view(0, w + 1500).wake_rate_m, 18_000 + step / 2);
    // Clean and used again: the step doubles.
    let before = st.wake_rate_m();
    use_slots(&mut st, &p, w + 1000, 40);
    report(&mut st, &p, w + 1500, (200, 245, 0), &[], 0);
    st.advance(w + 2000, &p);
    assert_eq!(st.wake_rate_m() - before, 2 * step);
}

#[test]
fn a_rejection_during_a_ramp_goes_back_to_a_rate_proven_clean() {
    let p = policy();
    let mut st = one_step_in(&p);
    let w = T0 + 20_000;
    let drew = st.rate_at(w + 1300);
    assert!(drew > 18_000);
    // Rejected part way up: back to where the climb began, once.
    report(&mut st, &p, w + 1300, (60, 70, 5), &[w + 2300], 0);
    assert_eq!(st.mode(), Mode::BackingOff);
    assert_eq!(st.wake_rate_m(), 18_000);
    assert_eq!(st.rate_at(w + 1900), 18_000, "the ramp is over");
    assert_eq!(st.w_cut_from, drew, "the rate that drew the rejection");
}

#[test]
fn slow_start_begins_when_a_closing_hint_passes_mid_window() {
    let p = policy();
    let w = T0 + 30_000;
    let mut st = PacingState {
        closed_until: w + 170,
        ..unprobed()
    };
    st.advance(w + 100, &p);
    assert_eq!(st.wake_rate_m(), 18_000, "still closed");
    st.advance(w + 200, &p);
    assert_eq!(st.mode(), Mode::Probing, "reopened at once");
    assert!(st.wake_rate_m() > 18_000);
    assert!(st.rate_at(w + 200) < st.rate_at(w + 900));
    // A hint that closes the window for most of it waits for its end.
    let mut late = PacingState {
        closed_until: w + 700,
        ..unprobed()
    };
    late.advance(w + 800, &p);
    assert_eq!(late.wake_rate_m(), 18_000);
    assert_eq!(late.mode(), Mode::Steady);
}

#[test]
fn slow_start_begins_with_the_window_after_an_outage_that_ended_late_in_one() {
    let p = policy();
    let w = T0 + 30_000;
    let closed = |ok| {
        let mut st = PacingState {
            closed_until: w + 700,
            ..unprobed()
        };
        // What the window served while the hint held it closed, and a
        // straggler rejected before the upstream came back.
        report(&mut st, &p, w + 600, (20, ok, 1), &[w + 1200], w + 700);
        st.advance(w + 1000, &p);
        st
    };
    // The upstream was out: the next window is the fleet's first one back,
    // and it climbs from the start rather than a window later.
    let out = closed(2);
    assert_eq!(out.mode(), Mode::Probing);
    assert_eq!(out.rate_at(w + 1000), 18_000, "from the rate in force");
    assert!(out.rate_at(w + 1500) > 18_000, "climbed across the window");
    // It kept serving (one worker's claim closed the route): nothing
    // changes until a window measures the route again.
    let serving = closed(150);
    assert_eq!(serving.mode(), Mode::Steady);
    assert_eq!(serving.rate_at(w + 1500), 18_000);
}

#[test]
fn rejections_drawn_inside_a_closure_and_reported_after_it_are_not_answered() {
    let p = policy();
    let w = T0 + 30_000;
    let mut st = PacingState {
        closed_until: w + 170,
        ..unprobed()
    };
    // Drawn while the route was closed (the hint ends with the closure).
    report(&mut st, &p, w + 300, (40, 40, 6), &[w + 170; 6], 0);
    assert_ne!(st.mode(), Mode::BackingOff);
    assert_eq!(st.w_refused, 0);
    // Drawn now (a fresh one-second hint): answered with a cut.
    report(&mut st, &p, w + 400, (40, 40, 6), &[w + 1400; 6], 0);
    assert_eq!(st.mode(), Mode::BackingOff);
}

/// A saturated route at the start of window `T0 + 20 s`, with 800/s of
/// first attempts asking: every attempt paced at `rate_m`, under a
/// capacity and an edge of `rate_max_m`.
fn saturated(rate_m: i64, rate_max_m: i64) -> PacingState {
    PacingState {
        rate_ok_m: rate_m,
        mode: Mode::Saturated,
        ..at_window_20(rate_max_m, 800_000, rate_m, rate_max_m)
    }
}

/// Rejections reported in the window after a saturated cut, while the
/// cooldown its own rejections set still holds, are that cut's stragglers:
/// drawn before it. They neither cut again nor lower the edge; beyond that
/// window, rejections under a cooldown still say the rate is over.
#[test]
fn a_saturated_cut_is_not_cut_again_by_its_own_stragglers() {
    let p = policy();
    let mut st = saturated(640_000, 600_000);
    let at = T0 + 20_000;
    report(&mut st, &p, at + 300, (0, 580, 40), &[at + 1300], 0);
    st.advance(at + 1000, &p);
    let cut = just_under(580_000);
    assert_eq!(st.wake_rate_m(), cut);
    // The stragglers, inside the cut's cooldown.
    report(&mut st, &p, at + 1100, (0, 500, 5), &[at + 2100], at + 1300);
    st.advance(at + 2000, &p);
    assert_eq!(st.wake_rate_m(), cut);
    assert_eq!(st.capacity_m(), 580_000);
    // A window later the same is a rate still over the edge.
    report(&mut st, &p, at + 2100, (0, 500, 5), &[at + 3100], at + 2500);
    st.advance(at + 3000, &p);
    assert_eq!(st.wake_rate_m(), just_under(500_000));
}

/// A window of demand the rate falls short of: an intent asks every
/// millisecond across the window starting at `at`, and the upstream serves
/// every slot.
fn demand_window(st: &mut PacingState, p: &PacingPolicy, at: i64) {
    let mut cursor = 0;
    let mut granted = 0;
    for t in 0..1000 {
        if let SlotDecision::Slot { cursor_us, .. } = st.decide(&ask(at + t, cursor), p) {
            cursor = cursor_us;
            granted += 1;
        }
    }
    report(st, p, at + 999, (0, granted, 0), &[], 0);
    st.advance(at + 1000, p);
}

/// A saturated rate well under the edge a saturated window measured climbs
/// halfway to it each clean window (an entry inside a window, or a cut,
/// left it there; every window spent below it is the backlog's). From near
/// the edge on, a step is held a window before the next, so a limiter's
/// banked burst cannot hide the overshoots of several steps at once.
#[test]
fn a_saturated_rate_climbs_halfway_to_its_edge_then_holds_each_step() {
    let p = policy();
    let mut st = saturated(300_000, 600_000);
    let mut rates = Vec::new();
    for w in 0..8 {
        demand_window(&mut st, &p, T0 + 20_000 + w * 1000);
        assert_eq!(st.mode(), Mode::Saturated);
        rates.push(st.wake_rate_m());
    }
    let near = 562_500;
    let under = near + near / 16;
    let past = under + under / 16;
    assert_eq!(
        rates,
        [450_000, 525_000, near, near, under, under, past, past]
    );
}
