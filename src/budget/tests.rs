use super::*;
use crate::policy::PolicySpec;
use crate::tenancy::{Owner, Tenant};

const T0: i64 = 1_700_000_000_000;

fn policy(spec: PolicySpec) -> Policy {
    Policy::try_new(&spec).expect("valid policy")
}

fn end<'a>(worker: &'a str, lease: &'a str, spent: u32, now_ms: i64) -> LeaseEnd<'a> {
    LeaseEnd {
        worker_id: worker,
        lease_id: lease,
        spent,
        retry_successes: 0,
        now_ms,
    }
}

fn ask(worker: &str, want: u32, now_ms: i64) -> GrantAsk<'_> {
    GrantAsk {
        worker_id: worker,
        priority: Priority::Critical,
        retry_class: RetryClass::Transient,
        want,
        now_ms,
        tenant: Tenant::NONE,
    }
}

#[test]
fn the_allowance_is_the_formula_in_exact_milli_tokens() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    assert_eq!(ledger.allowance_milli(&p, T0), 10 * 10 * 1000);
    ledger.deposit(&p, "w", Priority::Normal, 7, T0, Tenant::NONE);
    assert_eq!(ledger.allowance_milli(&p, T0), 100_000 + 1400);
    // The first attempts slide out of the 10 s window.
    assert_eq!(ledger.allowance_milli(&p, T0 + 9_999), 101_400);
    assert_eq!(ledger.allowance_milli(&p, T0 + 10_000), 100_000);
}

#[test]
fn changing_the_ratio_rescales_the_balance_and_never_refills_it() {
    let loose = Policy::default(); // floor 10/s, ratio 0.2, window 10 s
    let mut ledger = BudgetLedger::new(T0);
    ledger.deposit(&loose, "w", Priority::Critical, 1000, T0, Tenant::NONE);
    let granted = ledger
        .grant(&loose, ask("w", 100, T0), "l1")
        .expect("grant");
    assert_eq!(granted.granted, 100);
    // Critical may reach the whole allowance, borrowing down.
    let before = ledger.snapshot(&loose, T0).classes[0];
    assert_eq!(before.allowance_milli, 300_000); // 100 + 0.2 × 1000
    assert_eq!(before.available_milli, 200_000);
    let tight = policy(PolicySpec {
        retry_ratio: Some(0.05),
        ..PolicySpec::default()
    });
    let after = ledger.snapshot(&tight, T0).classes[0];
    assert_eq!(after.spent_milli, 100_000, "spend carries over");
    assert_eq!(after.allowance_milli, 150_000); // 100 + 0.05 × 1000
    assert_eq!(after.available_milli, 50_000);
    let tighter = policy(PolicySpec {
        retry_ratio: Some(0.0),
        min_retries_per_sec: Some(5.0),
        ..PolicySpec::default()
    });
    let after = ledger.snapshot(&tighter, T0).classes[0];
    assert_eq!(after.allowance_milli, 50_000);
    assert_eq!(after.available_milli, 0, "tightened below what is spent");
    let looser = policy(PolicySpec {
        retry_ratio: Some(0.4),
        ..PolicySpec::default()
    });
    let after = ledger.snapshot(&looser, T0).classes[0];
    assert_eq!(
        after.available_milli,
        500_000 - 100_000,
        "not a full budget"
    );
}

#[test]
fn the_ceiling_caps_the_formula() {
    let p = policy(PolicySpec {
        max_retries_per_window: Some(5),
        ..PolicySpec::default()
    });
    let mut ledger = BudgetLedger::new(T0);
    assert_eq!(ledger.allowance_milli(&p, T0), 5000);
}

#[test]
fn grants_never_exceed_what_the_class_may_reach() {
    let p = Policy::default(); // 100 tokens; shares 0.2 / 0.6 / 0.2
    let mut ledger = BudgetLedger::new(T0);
    let mut total = [0; 3];
    for priority in [Priority::Bulk, Priority::Normal, Priority::Critical] {
        for i in 0..200 {
            let id = format!("w{}", i % 7);
            let ask = GrantAsk {
                priority,
                ..ask(&id, 3, T0)
            };
            total[priority.index()] += ledger
                .grant(&p, ask, &format!("{priority}{i}"))
                .expect("grant")
                .granted;
        }
    }
    // Bulk its own share, normal the rest of what is not critical's,
    // critical its reserve: the formula, never more.
    assert_eq!(total, [20, 60, 20]);
}

#[test]
fn the_never_up_bounds_hold_for_every_class() {
    let p = Policy::default();
    // allowance 1000, spent critical 100, normal 500, bulk 150
    let spent = [100, 500, 150];
    assert_eq!(available_of(&p, 1000, &spent, 0), 250);
    assert_eq!(available_of(&p, 1000, &spent, 1), 150); // 800 − 650
    assert_eq!(available_of(&p, 1000, &spent, 2), 50); // 200 − 150
    assert_eq!(shares_from(&p, 1), 800);
}

#[test]
fn a_retry_that_succeeded_is_refunded_to_its_second() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    let g = ledger
        .grant(
            &p,
            GrantAsk {
                retry_class: RetryClass::Throttled,
                ..ask("w", 10, T0)
            },
            "a",
        )
        .expect("grant");
    assert_eq!(g.granted, 10);
    let back = LeaseEnd {
        retry_successes: 3,
        ..end("w", "a", 5, T0 + 1_500)
    };
    // 5 unspent + 3 succeeded, at the lease's cost of 2 each.
    assert_eq!(ledger.release(back), Ok(8));
    let snap = ledger.snapshot(&p, T0 + 1_500);
    assert_eq!(snap.classes[0].spent_milli, 2 * 2_000);
    // The refund went back to the second charged: it slides out with it.
    assert_eq!(ledger.snapshot(&p, T0 + 10_000).classes[0].spent_milli, 0);
}

#[test]
fn throttled_retries_cost_double() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    let g = ledger
        .grant(
            &p,
            GrantAsk {
                retry_class: RetryClass::Throttled,
                ..ask("w", 100, T0)
            },
            "l",
        )
        .expect("grant");
    assert_eq!(g.granted, 50);
    assert_eq!(g.limit, GrantLimit::BudgetExhausted);
}

#[test]
fn release_refunds_unspent_and_expiry_keeps_the_charge() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    let g = ledger.grant(&p, ask("w", 100, T0), "a").expect("grant");
    assert_eq!(g.granted, 100);
    assert_eq!(
        ledger.grant(&p, ask("w", 1, T0), "b").expect("g").granted,
        0
    );
    assert_eq!(ledger.release(end("w", "a", 70, T0 + 1)), Ok(30));
    assert_eq!(
        ledger.release(end("w", "a", 0, T0 + 1)),
        Err(BudgetError::LeaseNotFound)
    );
    let g = ledger.grant(&p, ask("w", 30, T0 + 2), "c").expect("grant");
    assert_eq!(g.granted, 30);
    // `c` expires unreported: its tokens stay spent.
    let after = T0 + 2 + 10_000;
    assert_eq!(
        ledger.release(end("w", "c", 0, after)),
        Err(BudgetError::LeaseNotFound)
    );
    assert_eq!(
        ledger.available_milli(&p, Priority::Critical, T0 + 9_000),
        0
    );
}

#[test]
fn another_workers_lease_cannot_be_released() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    ledger.grant(&p, ask("a", 5, T0), "l").expect("grant");
    assert_eq!(
        ledger.release(end("b", "l", 0, T0)),
        Err(BudgetError::LeaseNotFound)
    );
    assert!(matches!(
        ledger.release(end("a", "l", 6, T0)),
        Err(BudgetError::SpentExceedsGrant { .. })
    ));
}

#[test]
fn a_greedy_worker_cannot_starve_modest_ones() {
    let p = Policy::default(); // 100 tokens critical may reach
    let mut ledger = BudgetLedger::new(T0);
    // Nine modest workers have been reporting: they are active.
    for i in 0..9 {
        ledger.deposit(
            &p,
            &format!("m{i}"),
            Priority::Critical,
            0,
            T0,
            Tenant::NONE,
        );
    }
    let greedy = ledger
        .grant(&p, ask("greedy", 1000, T0), "g")
        .expect("grant");
    assert_eq!(greedy.granted, 10, "an equal share of 100 among 10");
    assert_eq!(greedy.limit, GrantLimit::FairShare);
    for i in 0..9 {
        let g = ledger
            .grant(&p, ask(&format!("m{i}"), 8, T0), &format!("m{i}"))
            .expect("grant");
        assert_eq!(g.granted, 8);
    }
    // What the modest ones left over goes to the greedy one.
    let more = ledger
        .grant(&p, ask("greedy", 1000, T0), "g2")
        .expect("grant");
    assert_eq!(more.granted, 100 - 10 - 72);
}

#[test]
fn water_filling_meets_small_demands_first() {
    assert_eq!(max_min_share(100, 1000, &mut [10, 10, 1000]), 40);
    assert_eq!(max_min_share(100, 5, &mut [1000, 1000]), 5);
    assert_eq!(max_min_share(90, 1000, &mut [u64::MAX, u64::MAX]), 30);
    assert_eq!(max_min_share(100, 1000, &mut []), 100);
}

/// The water level of max-min fairness found from its definition, not by
/// the steps [`max_min_share`] takes: the largest whole level `l` at which
/// giving every demand `min(demand, l)` fits `capacity`, and whether that
/// fills it exactly; `None` when every demand fits in full.
fn water_level(capacity: u64, demands: &[u64]) -> Option<(u64, bool)> {
    let given = |level: u64| -> u128 { demands.iter().map(|&d| u128::from(d.min(level))).sum() };
    let capacity = u128::from(capacity);
    if demands.iter().map(|&d| u128::from(d)).sum::<u128>() <= capacity {
        return None;
    }
    // given(lo) fits and given(hi) does not: at the largest demand every
    // demand is met, which was just found not to fit.
    let (mut lo, mut hi) = (0, demands.iter().copied().max().unwrap_or(0));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if given(mid) <= capacity {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some((lo, given(lo) == capacity))
}

proptest::proptest! {
    #[test]
    fn the_share_is_water_filling_over_everyone(
        capacity in 0u64..1_000_000_000,
        own in proptest::prop_oneof![0u64..3_000_000, proptest::strategy::Just(u64::MAX)],
        others in proptest::collection::vec(
            proptest::prop_oneof![0u64..3_000_000, proptest::strategy::Just(u64::MAX)],
            0..64,
        ),
    ) {
        let mut everyone = others;
        everyone.push(own);
        let level = water_level(capacity, &everyone);
        let mut given = 0u128;
        // Each demand in turn as the one asking, the rest as the others.
        for asking in 0..everyone.len() {
            let demand = everyone[asking];
            let mut rest = everyone.clone();
            rest.remove(asking);
            let share = max_min_share(capacity, demand, &mut rest);
            given += u128::from(share);
            match level {
                // Every demand fits, or this one is below the level: met in full.
                None => proptest::prop_assert_eq!(share, demand),
                Some((level, _)) if demand <= level => proptest::prop_assert_eq!(share, demand),
                // Capped at a whole level: exactly it.
                Some((level, true)) => proptest::prop_assert_eq!(share, level),
                // A level between two whole numbers: a capped demand gets
                // the whole level or one more (the sum below keeps the
                // "one more" to what the remainder pays for).
                Some((level, false)) => proptest::prop_assert!(
                    share == level || share == level + 1,
                    "share {} at a level between {} and {}", share, level, level + 1
                ),
            }
        }
        // What everyone is told they may take fits the capacity together.
        proptest::prop_assert!(given <= u128::from(capacity), "{} given of {}", given, capacity);
    }

    /// What `BudgetLedger::grant` relies on to skip weighing the fleet: a
    /// demand within an equal share of the capacity among everyone is met
    /// in full, whatever the others ask (integer division included).
    #[test]
    fn a_demand_within_an_equal_share_is_met_in_full(
        capacity in 0u64..1_000_000_000,
        others in proptest::collection::vec(
            proptest::prop_oneof![0u64..2_000_000, proptest::strategy::Just(u64::MAX)],
            0..64,
        ),
        fraction in 0u64..=1000,
    ) {
        let mut others = others;
        let equal = capacity / (others.len() as u64 + 1);
        let own = equal * fraction / 1000;
        proptest::prop_assert_eq!(max_min_share(capacity, own, &mut others), own);
    }

    /// What the Redis store relies on to pass a worker count it last read
    /// rather than the class's own: for any count no smaller than the
    /// active workers, the equal-share shortcut gives what weighing the
    /// whole fleet gives.
    #[test]
    fn any_count_of_at_least_the_fleet_gives_the_fair_share(
        capacity in 0u64..1_000_000_000,
        others in proptest::collection::vec(
            proptest::prop_oneof![0u64..2_000_000, proptest::strategy::Just(u64::MAX)],
            0..64,
        ),
        extra in 0usize..2000,
        own_held in 0u64..2_000_000,
        want in 0u64..2000,
        cost in 1u64..5000,
    ) {
        let ask = FairAsk {
            capacity,
            tracked: others.len() + 1 + extra,
            own_held,
            want_milli: want * cost,
            cost,
        };
        let weighed = tokens_of_share(
            max_min_share(capacity, own_held + want * cost, &mut others.clone()),
            own_held,
            cost,
        );
        proptest::prop_assert_eq!(fair_tokens(ask, || others), weighed);
    }
}

#[test]
fn a_clock_stepping_back_does_not_resurrect_spent_tokens() {
    let p = Policy::default();
    let mut ledger = BudgetLedger::new(T0);
    assert_eq!(
        ledger.grant(&p, ask("w", 100, T0), "a").expect("g").granted,
        100
    );
    assert_eq!(
        ledger
            .grant(&p, ask("w", 1, T0 - 60_000), "b")
            .expect("g")
            .granted,
        0
    );
}

/// The worker index stays true through growth past [`INDEXED_FROM`], the
/// eviction of idle workers and of the least recently seen at the cap, and
/// a fleet shrinking back under it.
#[test]
fn a_class_finds_each_worker_as_it_grows_and_evicts() {
    let window_ms = 10_000;
    let mut class = ClassLedger::default();
    let check = |class: &ClassLedger| {
        if let Some(index) = &class.index {
            assert_eq!(index.len(), class.workers.len());
            for (at, w) in class.workers.iter().enumerate() {
                assert_eq!(index.get(&w.id), Some(&at), "{}", w.id);
            }
        } else {
            assert!(class.workers.len() < INDEXED_FROM);
        }
    };
    // Past the cap, one new worker a millisecond, every third one seen again.
    for i in 0..MAX_WORKERS_PER_CLASS + 300 {
        let id = format!("worker-{i}");
        let now = T0 + i as i64;
        let at = class.touch(&id, now, window_ms);
        assert_eq!(&*class.workers[at].id, id);
        if i % 3 == 0 {
            let old = format!("worker-{}", i / 3);
            let at = class.touch(&old, now, window_ms);
            assert_eq!(&*class.workers[at].id, old);
        }
        check(&class);
    }
    assert_eq!(class.workers.len(), MAX_WORKERS_PER_CLASS);
    assert!(class.index.is_some());
    // Much later every worker is idle: the next new one sweeps them out.
    let later = T0 + 10 * window_ms;
    let at = class.touch("newcomer", later, window_ms);
    assert_eq!(class.workers.len(), 1);
    assert_eq!(&*class.workers[at].id, "newcomer");
    check(&class);
    assert!(class.get_mut("worker-1").is_none());
    assert!(class.get_mut("newcomer").is_some());
}

#[test]
fn another_tokens_counts_never_raise_a_tokens_budget_in_a_shared_scope() {
    let p = Policy::default(); // floor 10/s × 10 s = 100, ratio 0.2
    let one = Tenant {
        owner: Owner::token(0),
        tokens: 2,
    };
    let two = Tenant {
        owner: Owner::token(1),
        tokens: 2,
    };
    let mut ledger = BudgetLedger::new(T0);
    ledger.deposit(&p, "t1:w", Priority::Critical, 100, T0, one);
    // Token two claims a million first attempts.
    ledger.deposit(&p, "t2:w", Priority::Critical, 1_000_000, T0, two);
    // Token one's budget is what its own hundred earn: 100 + 0.2 × 100.
    let granted = ledger
        .grant(
            &p,
            GrantAsk {
                tenant: one,
                ..ask("t1:w", 10_000, T0)
            },
            "l1",
        )
        .expect("grant");
    assert_eq!(granted.granted, 120);
    assert_eq!(granted.remaining, 0);
    // Token two's claim moves its own budget only.
    let theirs = ledger
        .grant(
            &p,
            GrantAsk {
                tenant: two,
                ..ask("t2:w", 10_000, T0)
            },
            "l2",
        )
        .expect("grant");
    assert_eq!(theirs.granted, 10_000);
    // A release gives back to the token's own count too.
    assert_eq!(ledger.release(end("t1:w", "l1", 20, T0)), Ok(100));
    let again = ledger
        .grant(
            &p,
            GrantAsk {
                tenant: one,
                ..ask("t1:w", 10_000, T0)
            },
            "l3",
        )
        .expect("grant");
    assert_eq!(again.granted, 100);
    // Where one token uses the scope, nothing is kept apart.
    let alone = Tenant {
        owner: Owner::token(0),
        tokens: 1,
    };
    let mut ledger = BudgetLedger::new(T0);
    ledger.deposit(&p, "t1:w", Priority::Critical, 1000, T0, alone);
    let granted = ledger
        .grant(
            &p,
            GrantAsk {
                tenant: alone,
                ..ask("t1:w", 10_000, T0)
            },
            "l1",
        )
        .expect("grant");
    assert_eq!(granted.granted, 300);
    assert!(ledger.tokens.is_empty());
}

/// What a grant limited by the budget or by fairness says, and what is
/// left, are the rules' answer too (not only the count).
#[test]
fn limits_are_named_by_the_shared_rule() {
    let d = decide(10, 4, 20_000, 1000);
    assert_eq!(
        (d.granted, d.limit, d.remaining),
        (4, GrantLimit::FairShare, 16)
    );
    let d = decide(10, 40, 3_500, 1000);
    assert_eq!(
        (d.granted, d.limit, d.remaining),
        (3, GrantLimit::BudgetExhausted, 0)
    );
}
