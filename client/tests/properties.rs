//! Properties of the decision engine over random policies, responses, hints,
//! cancellations and late wakes, driven by the same scripted driver as
//! `tollgate simulate`.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tollgate::simulate::driver::{self, Script, ScriptError, ScriptedResponse};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::engine::{
    Intent, IntentPolicy, IntentSpec, Observation, RepetitionKind, RetryOwner,
};
use tollgate_client::hint::HintVerdict;
use tollgate_client::outcome::{Outcome, RecordDecision};

fn noon() -> SystemTime {
    httpdate::parse_http_date("Mon, 01 Jan 2024 12:00:00 GMT").expect("date")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, Clone)]
struct Case {
    policy: IntentPolicy,
    trusted: bool,
    repetition: RepetitionKind,
    script: Script,
    seed: u64,
}

fn hint() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        (0u64..40).prop_map(|n| Some(n.to_string())),
        (0u64..40).prop_map(|n| Some(format!(" {n}\t"))),
        prop_oneof![Just("+3"), Just("-1"), Just("1.5"), Just(""), Just("soon")]
            .prop_map(|s| Some(s.to_owned())),
        Just(Some("18446744073709551616".to_owned())),
        // Dates from a minute before to a minute after elapsed zero's wall time.
        (0u64..120).prop_map(|n| {
            Some(httpdate::fmt_http_date(
                noon() + Duration::from_secs(n) - Duration::from_secs(60),
            ))
        }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        1_000u64..60_000,                   // budget, ms
        1u32..6,                            // max attempts
        0u64..3_000,                        // min wait, ms
        0u64..2_000,                        // backoff base, ms
        0u64..20_000,                       // backoff cap, ms
        any::<bool>(),                      // jitter
        proptest::option::of(0u64..30_000), // max hint, ms
        any::<bool>(),                      // clock trusted
        any::<u64>(),                       // seed
    )
        .prop_flat_map(
            |(budget, attempts, min_wait, base, cap, jitter, max_hint, trusted, seed)| {
                let responses = proptest::collection::vec(
                    (
                        0u64..=1000,
                        prop_oneof![
                            Just(200u16),
                            Just(429),
                            Just(503),
                            Just(500),
                            Just(502),
                            Just(408),
                            Just(404)
                        ],
                        hint(),
                    ),
                    0..8,
                );
                (
                    1u64..=budget, // attempt cap, ms
                    responses,
                    proptest::option::of(0u64..70_000), // cancel at, ms
                    prop_oneof![Just(0u64), 0u64..5_000], // wake late, ms
                    prop_oneof![
                        Just(RepetitionKind::Safe),
                        Just(RepetitionKind::Reconcilable)
                    ],
                )
                    .prop_map(
                        move |(attempt_cap, responses, cancel_at, wake_late, repetition)| {
                            let backoff = Backoff {
                                base: ms(base),
                                cap: ms(cap),
                                jitter: if jitter { Jitter::Full } else { Jitter::None },
                            };
                            let policy = IntentPolicy::try_new(
                                ms(budget),
                                attempts,
                                ms(attempt_cap),
                                ms(min_wait),
                                backoff,
                                max_hint.map(ms),
                            )
                            .expect("generated policy is valid");
                            let responses = responses
                                .into_iter()
                                .map(|(permille, status, hint)| ScriptedResponse {
                                    // A fraction of the cap, so no attempt overruns it.
                                    duration: ms(attempt_cap * permille / 1000),
                                    observation: Observation::http(status, hint.as_deref()),
                                })
                                .collect();
                            Case {
                                policy,
                                trusted,
                                repetition,
                                script: Script {
                                    responses,
                                    cancel_at: cancel_at.map(ms),
                                    wake_late: ms(wake_late),
                                },
                                seed,
                            }
                        },
                    )
            },
        )
}

/// Runs a case to its end (or to the first attempt the script cannot answer).
fn run(case: &Case) -> Intent {
    let spec = IntentSpec {
        intent_id: "prop".to_owned(),
        repetition: case.repetition,
        retry_owner: RetryOwner::Here,
        wall_at_start: noon(),
        clock_trusted: case.trusted,
    };
    let mut intent = Intent::new(spec, case.policy);
    let mut rng = StdRng::seed_from_u64(case.seed);
    match driver::run(&mut intent, &case.script, &mut rng) {
        Ok(()) | Err(ScriptError::MissingResponse { .. }) => intent,
        Err(e) => panic!("engine misuse in a generated case: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_start_reserves_a_full_attempt_inside_the_budget(case in case()) {
        let intent = run(&case);
        for record in intent.records() {
            prop_assert!(record.start + case.policy.attempt_cap() <= case.policy.total_budget(),
                "attempt {} starts at {:?}", record.number, record.start);
        }
        prop_assert!(intent.attempts_started() <= case.policy.max_attempts());
    }

    #[test]
    fn no_wait_is_shorter_than_a_valid_hint_or_the_floor(case in case()) {
        let intent = run(&case);
        let records = intent.records();
        for (k, record) in records.iter().enumerate() {
            if record.decision != Some(RecordDecision::Wait) {
                continue;
            }
            let (Some(receipt), Some(wait), Some(next_start)) =
                (record.receipt, record.wait, record.next_start) else {
                return Err(TestCaseError::fail("a wait record lacks its times"));
            };
            prop_assert!(wait >= case.policy.min_wait());
            if let Some(HintVerdict::Valid { delay, .. }) = record.hint.as_ref().map(|h| h.verdict) {
                prop_assert!(wait >= delay, "waited {wait:?} for a {delay:?} hint");
            }
            prop_assert_eq!(next_start, receipt + wait);
            if let Some(next) = records.get(k + 1) {
                prop_assert!(next.start >= next_start);
            }
            if let Some(woke) = record.woke {
                prop_assert!(woke >= next_start);
            }
        }
    }

    #[test]
    fn nothing_starts_at_or_after_cancellation(case in case()) {
        let intent = run(&case);
        if let Some(cancel_at) = case.script.cancel_at {
            for record in intent.records() {
                prop_assert!(record.start < cancel_at,
                    "attempt {} started at {:?}, cancelled at {cancel_at:?}", record.number, record.start);
            }
            if let Some((outcome, at)) = intent.outcome()
                && at > cancel_at
            {
                prop_assert!(false, "ended as {outcome} at {at:?}, after cancellation at {cancel_at:?}");
            }
            if let Some((Outcome::Cancelled, at)) = intent.outcome() {
                prop_assert_eq!(at, cancel_at);
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule(case in case()) {
        let a = run(&case);
        let b = run(&case);
        prop_assert_eq!(a.records(), b.records());
        prop_assert_eq!(a.outcome(), b.outcome());
    }

    #[test]
    fn time_is_accounted_once(case in case()) {
        let intent = run(&case);
        if let Some((_, at)) = intent.outcome() {
            prop_assert_eq!(intent.request_time() + intent.waited_time(), at);
        }
    }
}
