//! Every form with exact values (GitHub, Okta, Twitter/X, the draft with
//! several policies and a partition key, Envoy), every verdict's reasons,
//! and properties on arbitrary input.

use std::time::UNIX_EPOCH;

use proptest::prelude::*;

use super::*;

/// 2024-01-01T12:00:00Z, the receipt time of every response here.
const NOON: u64 = 1_704_110_400;

fn received() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOON)
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn read(headers: &[(&str, &str)]) -> RateLimitReading {
    read_with(headers, RateLimitRules::default())
}

fn read_with(headers: &[(&str, &str)], rules: RateLimitRules) -> RateLimitReading {
    read_rate_limit(headers.iter().copied(), received(), rules)
}

fn verdict(headers: &[(&str, &str)]) -> RateLimitVerdict {
    read(headers).verdict
}

fn usable(headers: &[(&str, &str)]) -> StatedLimits {
    match verdict(headers) {
        RateLimitVerdict::Usable(limits) => limits,
        other => panic!("expected a usable statement from {headers:?}, got {other:?}"),
    }
}

fn epoch_in(secs: u64) -> String {
    (NOON + secs).to_string()
}

fn unnamed(quota: u64, window: Option<u64>) -> QuotaPolicy {
    QuotaPolicy {
        name: None,
        quota,
        unit: QuotaUnit::Requests,
        window: window.map(s),
        partition_key: None,
    }
}

fn reset(secs: u64, form: ResetForm) -> Option<ResetIn> {
    Some(ResetIn {
        delay: s(secs),
        form,
    })
}

// --- Each form, exact values ----------------------------------------------

#[test]
fn github_states_an_epoch_reset() {
    let reset_at = epoch_in(1800);
    let headers = [
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-reset", reset_at.as_str()),
        ("x-ratelimit-resource", "core"),
    ];
    let reading = read(&headers);
    assert_eq!(reading.family, Some(RateLimitFamily::XRateLimit));
    assert_eq!(
        reading.raw,
        vec![
            RawField {
                name: "x-ratelimit-limit",
                value: "5000".into()
            },
            RawField {
                name: "x-ratelimit-remaining",
                value: "4999".into()
            },
            RawField {
                name: "x-ratelimit-reset",
                value: "1704112200".into()
            },
        ]
    );
    assert_eq!(
        reading.verdict,
        RateLimitVerdict::Usable(StatedLimits {
            policies: vec![unnamed(5000, None)],
            current: vec![CurrentLimit {
                policy: None,
                quota: Some(5000),
                window: None,
                remaining: 4999,
                reset: reset(1800, ResetForm::Epoch),
                partition_key: None,
            }],
        })
    );
}

#[test]
fn okta_states_an_epoch_reset_under_the_hyphenated_names() {
    let reset_at = epoch_in(60);
    let reading = read(&[
        ("X-Rate-Limit-Limit", "600"),
        ("X-Rate-Limit-Remaining", "0"),
        ("X-Rate-Limit-Reset", reset_at.as_str()),
    ]);
    assert_eq!(reading.family, Some(RateLimitFamily::XRateLimitHyphenated));
    assert_eq!(reading.raw[0].name, "x-rate-limit-limit");
    let limits = reading.verdict.usable().expect("usable").clone();
    assert_eq!(limits.policies, vec![unnamed(600, None)]);
    assert_eq!(
        limits.current,
        vec![CurrentLimit {
            policy: None,
            quota: Some(600),
            window: None,
            remaining: 0,
            reset: reset(60, ResetForm::Epoch),
            partition_key: None,
        }]
    );
}

#[test]
fn twitter_states_a_fifteen_minute_epoch_reset() {
    let reset_at = epoch_in(900);
    let limits = usable(&[
        ("x-rate-limit-limit", "900"),
        ("x-rate-limit-remaining", "899"),
        ("x-rate-limit-reset", reset_at.as_str()),
    ]);
    assert_eq!(limits.current[0].quota, Some(900));
    assert_eq!(limits.current[0].remaining, 899);
    assert_eq!(limits.current[0].reset, reset(900, ResetForm::Epoch));
}

#[test]
fn the_draft_states_several_policies_with_a_partition_key() {
    let reading = read(&[
        (
            "RateLimit-Policy",
            r#""burst";q=100;w=60;pk=:cHsdsRa894==:, "daily";q=1000;w=86400;pk=:cHsdsRa894==:"#,
        ),
        (
            "RateLimit",
            r#""burst";r=0;t=30;pk=:cHsdsRa894==:, "daily";r=871;t=40000"#,
        ),
    ]);
    assert_eq!(reading.family, Some(RateLimitFamily::Draft));
    let key = Some("cHsdsRa894==".to_owned());
    let policy = |name: &str, quota, window| QuotaPolicy {
        name: Some(name.into()),
        quota,
        unit: QuotaUnit::Requests,
        window: Some(s(window)),
        partition_key: key.clone(),
    };
    assert_eq!(
        reading.verdict,
        RateLimitVerdict::Usable(StatedLimits {
            policies: vec![policy("burst", 100, 60), policy("daily", 1000, 86_400)],
            current: vec![
                CurrentLimit {
                    policy: Some("burst".into()),
                    quota: Some(100),
                    window: Some(s(60)),
                    remaining: 0,
                    reset: reset(30, ResetForm::Seconds),
                    partition_key: key.clone(),
                },
                CurrentLimit {
                    policy: Some("daily".into()),
                    quota: Some(1000),
                    window: Some(s(86_400)),
                    remaining: 871,
                    reset: reset(40_000, ResetForm::Seconds),
                    // Not sent on the state: its policy's.
                    partition_key: key.clone(),
                },
            ],
        })
    );
}

#[test]
fn the_draft_field_may_be_split_over_lines_and_carry_units_and_comments() {
    let limits = usable(&[
        ("ratelimit-policy", r#""permin";q=50;w=60"#),
        (
            "ratelimit-policy",
            r#""bytes";q=65535;qu="content-bytes";w=10;acme-burst=5"#,
        ),
        ("ratelimit", r#""permin";r=20"#),
    ]);
    assert_eq!(limits.policies.len(), 2);
    assert_eq!(limits.policies[1].unit, QuotaUnit::ContentBytes);
    assert_eq!(limits.current[0].reset, None, "t is optional");
    assert_eq!(limits.current[0].quota, Some(50));
}

#[test]
fn a_draft_state_without_its_policy_has_no_quota_to_check() {
    let limits = usable(&[("RateLimit", r#""default";r=50;t=30"#)]);
    assert_eq!(
        limits.current,
        vec![CurrentLimit {
            policy: Some("default".into()),
            quota: None,
            window: None,
            remaining: 50,
            reset: reset(30, ResetForm::Seconds),
            partition_key: None,
        }]
    );
    let policies = usable(&[("RateLimit-Policy", r#""default";q=100;w=60"#)]);
    assert!(policies.current.is_empty());
}

#[test]
fn envoy_states_its_policies_in_the_limit_field_and_seconds_left() {
    let limits = usable(&[
        ("x-ratelimit-limit", "10, 10;w=1"),
        ("x-ratelimit-remaining", "9"),
        ("x-ratelimit-reset", "1"),
    ]);
    assert_eq!(
        limits,
        StatedLimits {
            policies: vec![unnamed(10, Some(1))],
            current: vec![CurrentLimit {
                policy: None,
                quota: Some(10),
                window: Some(s(1)),
                remaining: 9,
                reset: reset(1, ResetForm::Seconds),
                partition_key: None,
            }],
        }
    );
}

#[test]
fn envoy_names_its_policies_and_the_bare_limit_picks_the_window() {
    let limits = usable(&[
        (
            "x-ratelimit-limit",
            r#"10, 10;w=1;name="per-ip", 1000;w=3600"#,
        ),
        ("x-ratelimit-remaining", "3"),
        ("x-ratelimit-reset", "1"),
    ]);
    assert_eq!(limits.policies[0].name.as_deref(), Some("per-ip"));
    assert_eq!(limits.policies[1], unnamed(1000, Some(3600)));
    assert_eq!(limits.current[0].window, Some(s(1)));
    // The reset is checked against that window.
    assert_eq!(
        verdict(&[
            ("x-ratelimit-limit", "10, 10;w=1, 1000;w=3600"),
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "2"),
        ]),
        RateLimitVerdict::Contradictory(Contradiction::ResetBeyondWindow {
            policy: None,
            reset: s(2),
            window: s(1),
        })
    );
}

#[test]
fn reset_after_is_seconds_and_agrees_with_an_epoch_reset() {
    let one_ahead = epoch_in(1);
    let limits = usable(&[
        ("x-ratelimit-limit", "5"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", one_ahead.as_str()),
        ("x-ratelimit-reset-after", "1"),
    ]);
    assert_eq!(limits.current[0].reset, reset(1, ResetForm::Epoch));
    let alone = usable(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset-after", "7"),
    ]);
    assert_eq!(alone.current[0].reset, reset(7, ResetForm::Seconds));
    assert_eq!(alone.current[0].quota, None);
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", one_ahead.as_str()),
            ("x-ratelimit-reset-after", "60"),
        ]),
        RateLimitVerdict::Contradictory(Contradiction::ResetsDisagree {
            reset: s(1),
            reset_after: s(60),
        })
    );
}

#[test]
fn the_epoch_line_is_ten_to_the_ninth() {
    // Just below: seconds left — 31 years, beyond the one-day cap.
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "999999999")
        ]),
        RateLimitVerdict::Absurd(Absurdity::ResetBeyondCap {
            policy: None,
            reset: s(999_999_999),
            cap: s(86_400),
        })
    );
    // At it: an epoch, 2001-09-09, long past.
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1000000000")
        ]),
        RateLimitVerdict::Absurd(Absurdity::ResetInPast {
            policy: None,
            by: s(NOON - 1_000_000_000),
        })
    );
}

#[test]
fn an_epoch_reset_within_the_skew_is_now_and_beyond_it_is_absurd() {
    let just_past = (NOON - 5).to_string();
    let limits = usable(&[
        ("x-ratelimit-remaining", "10"),
        ("x-ratelimit-reset", just_past.as_str()),
    ]);
    assert_eq!(limits.current[0].reset, reset(0, ResetForm::Epoch));
    let past = (NOON - 6).to_string();
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "10"),
            ("x-ratelimit-reset", past.as_str())
        ]),
        RateLimitVerdict::Absurd(Absurdity::ResetInPast {
            policy: None,
            by: s(6)
        })
    );
}

#[test]
fn a_millisecond_epoch_lands_millennia_out_and_exceeds_the_cap() {
    let millis = ((NOON + 30) * 1000).to_string();
    let v = verdict(&[
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", millis.as_str()),
    ]);
    assert!(
        matches!(
            v,
            RateLimitVerdict::Absurd(Absurdity::ResetBeyondCap { .. })
        ),
        "{v:?}"
    );
}

#[test]
fn an_untrusted_clock_refuses_an_epoch_but_not_seconds_left() {
    let rules = RateLimitRules {
        clock_trusted: false,
        ..RateLimitRules::default()
    };
    let at = epoch_in(30);
    let epoch = read_with(
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", at.as_str()),
        ],
        rules,
    );
    assert_eq!(epoch.verdict, RateLimitVerdict::ClockUntrusted);
    let seconds = read_with(
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")],
        rules,
    );
    assert_eq!(
        seconds.verdict.usable().expect("usable").current[0].reset,
        reset(30, ResetForm::Seconds)
    );
}

#[test]
fn a_reset_at_the_cap_is_usable_and_above_it_is_absurd() {
    let rules = RateLimitRules {
        max_reset: s(300),
        ..RateLimitRules::default()
    };
    let at_cap = read_with(&[("RateLimit", r#""d";r=0;t=300"#)], rules);
    assert!(at_cap.verdict.usable().is_some());
    let above = read_with(&[("RateLimit", r#""d";r=0;t=301"#)], rules);
    assert_eq!(
        above.verdict,
        RateLimitVerdict::Absurd(Absurdity::ResetBeyondCap {
            policy: Some("d".into()),
            reset: s(301),
            cap: s(300),
        })
    );
}

#[test]
fn x_numbers_saturate_instead_of_overflowing() {
    let limits = usable(&[
        ("x-ratelimit-limit", "99999999999999999999999"),
        ("x-ratelimit-remaining", "5"),
    ]);
    assert_eq!(limits.current[0].quota, Some(u64::MAX));
    let v = verdict(&[
        ("x-ratelimit-remaining", "5"),
        ("x-ratelimit-reset", "99999999999999999999999"),
    ]);
    assert!(
        matches!(
            v,
            RateLimitVerdict::Absurd(Absurdity::ResetBeyondCap { .. })
        ),
        "{v:?}"
    );
}

// --- Which family is read ------------------------------------------------

#[test]
fn the_draft_is_preferred_and_an_invalid_one_is_not_replaced() {
    let both = read(&[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("ratelimit", r#""default";r=1;t=5"#),
    ]);
    assert_eq!(both.family, Some(RateLimitFamily::Draft));
    assert_eq!(both.raw.len(), 1, "only the family read is kept");
    assert_eq!(
        both.verdict.usable().expect("usable").current[0].remaining,
        1
    );
    let broken = read(&[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("ratelimit", "default;r=1"),
    ]);
    assert_eq!(
        broken.verdict,
        RateLimitVerdict::Invalid {
            field: RATELIMIT,
            why: InvalidStatement::WrongType { parameter: "name" }
        }
    );
    let x_both = read(&[
        ("x-rate-limit-remaining", "1"),
        ("x-ratelimit-remaining", "2"),
    ]);
    assert_eq!(x_both.family, Some(RateLimitFamily::XRateLimit));
}

#[test]
fn no_rate_limit_field_is_absent() {
    assert_eq!(read(&[]), RateLimitReading::absent());
    assert_eq!(
        read(&[("retry-after", "30"), ("x-ratelimit-used", "1")]),
        RateLimitReading::absent()
    );
}

// --- Invalid ---------------------------------------------------------------

fn invalid(field: &'static str, why: InvalidStatement) -> RateLimitVerdict {
    RateLimitVerdict::Invalid { field, why }
}

#[test]
fn signs_fractions_and_garbage_are_invalid_in_x_fields() {
    for (raw, why) in [
        ("-1", InvalidStatement::NotAnInteger),
        ("+3", InvalidStatement::NotAnInteger),
        ("1.5", InvalidStatement::NotAnInteger),
        ("1e3", InvalidStatement::NotAnInteger),
        ("", InvalidStatement::Empty),
        ("  ", InvalidStatement::Empty),
        ("abc", InvalidStatement::Malformed),
        ("0x10", InvalidStatement::Malformed),
        ("5,", InvalidStatement::Empty),
    ] {
        for field in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            let mut headers = vec![
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "5"),
                ("x-ratelimit-reset", "30"),
            ];
            headers.retain(|(name, _)| *name != field);
            headers.push((field, raw));
            let reading = read(&headers);
            assert_eq!(reading.verdict, invalid(field, why), "{field}: {raw:?}");
            assert!(
                reading
                    .raw
                    .iter()
                    .any(|r| r.name == field && r.value == raw),
                "the bad value is kept as evidence"
            );
        }
    }
}

#[test]
fn discord_fractional_reset_after_is_invalid_evidence() {
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "1.234")
        ]),
        invalid("x-ratelimit-reset-after", InvalidStatement::NotAnInteger)
    );
}

#[test]
fn a_reset_without_a_remaining_count_is_invalid() {
    assert_eq!(
        verdict(&[("x-ratelimit-limit", "10"), ("x-ratelimit-reset", "30")]),
        invalid("x-ratelimit-remaining", InvalidStatement::MissingField)
    );
}

#[test]
fn draft_rules_are_enforced() {
    use InvalidStatement::*;
    for (policy, why) in [
        (r#""d";q=-1"#, NotAnInteger),
        (r#""d";q=1.5"#, NotAnInteger),
        (r#""d";q="5""#, WrongType { parameter: "q" }),
        (r#""d";q"#, WrongType { parameter: "q" }),
        (r#""d";w=60"#, MissingParameter { parameter: "q" }),
        (r#""d";q=5;w=0"#, ZeroWindow),
        (r#""d";q=5;w=-60"#, NotAnInteger),
        (r#"d;q=5"#, WrongType { parameter: "name" }),
        (r#"5;q=5"#, WrongType { parameter: "name" }),
        (r#""d";q=5;pk="key""#, WrongType { parameter: "pk" }),
        (r#""d";q=5;qu=requests"#, WrongType { parameter: "qu" }),
        (r#""d";q=1234567890123456"#, Malformed),
        (r#""d";q=5,"#, Malformed),
        (r#""d" ;q=5"#, Malformed),
        ("", Empty),
    ] {
        assert_eq!(
            verdict(&[("RateLimit-Policy", policy)]),
            invalid(RATELIMIT_POLICY, why),
            "{policy:?}"
        );
    }
    for (state, why) in [
        (r#""d";t=5"#, MissingParameter { parameter: "r" }),
        (r#""d";r=-1"#, NotAnInteger),
        (r#""d";r=-0"#, NotAnInteger),
        (r#""d";r=1;t=2.5"#, NotAnInteger),
        (r#""d";r=1;t=-2"#, NotAnInteger),
    ] {
        assert_eq!(
            verdict(&[("RateLimit", state)]),
            invalid(RATELIMIT, why),
            "{state:?}"
        );
    }
}

#[test]
fn names_keys_and_fields_beyond_their_bounds_are_invalid_not_cut() {
    let name = "n".repeat(MAX_NAME_BYTES + 1);
    let policy = format!("\"{name}\";q=5");
    assert_eq!(
        verdict(&[("RateLimit-Policy", policy.as_str())]),
        invalid(RATELIMIT_POLICY, InvalidStatement::TooLong)
    );
    let key = "A".repeat(MAX_PARTITION_KEY_BYTES + 1);
    let state = format!("\"d\";r=5;pk=:{key}:");
    assert_eq!(
        verdict(&[("RateLimit", state.as_str())]),
        invalid(RATELIMIT, InvalidStatement::TooLong)
    );
    let long = "5, ".repeat(MAX_FIELD_BYTES);
    let reading = read(&[("x-ratelimit-remaining", long.as_str())]);
    assert_eq!(
        reading.verdict,
        invalid("x-ratelimit-remaining", InvalidStatement::TooLong)
    );
    assert!(reading.raw[0].value.len() <= crate::hint::MAX_RAW_HINT_BYTES);
    // Many short lines add up the same way.
    let lines = vec![("x-ratelimit-remaining", "5"); MAX_FIELD_BYTES];
    let reading = read(&lines);
    assert_eq!(
        reading.verdict,
        invalid("x-ratelimit-remaining", InvalidStatement::TooLong)
    );
    assert!(reading.raw[0].value.len() <= crate::hint::MAX_RAW_HINT_BYTES);
    assert!(reading.raw[0].value.starts_with("5, 5, 5"));
}

// --- Contradictory ---------------------------------------------------------

#[test]
fn remaining_above_the_limit_is_contradictory() {
    assert_eq!(
        verdict(&[("x-ratelimit-limit", "10"), ("x-ratelimit-remaining", "11")]),
        RateLimitVerdict::Contradictory(Contradiction::RemainingAboveQuota {
            policy: None,
            remaining: 11,
            quota: 10,
        })
    );
}

#[test]
fn a_quota_of_zero_with_some_remaining_is_contradictory() {
    assert_eq!(
        verdict(&[
            ("RateLimit-Policy", r#""d";q=0;w=60"#),
            ("RateLimit", r#""d";r=1"#),
        ]),
        RateLimitVerdict::Contradictory(Contradiction::RemainingAboveQuota {
            policy: Some("d".into()),
            remaining: 1,
            quota: 0,
        })
    );
    // A quota of zero with nothing left is a closed door, stated plainly.
    let closed = usable(&[
        ("RateLimit-Policy", r#""d";q=0;w=60"#),
        ("RateLimit", r#""d";r=0;t=60"#),
    ]);
    assert_eq!(closed.current[0].quota, Some(0));
}

#[test]
fn a_reset_beyond_its_window_is_contradictory() {
    assert_eq!(
        verdict(&[
            ("RateLimit-Policy", r#""d";q=100;w=60"#),
            ("RateLimit", r#""d";r=5;t=61"#),
        ]),
        RateLimitVerdict::Contradictory(Contradiction::ResetBeyondWindow {
            policy: Some("d".into()),
            reset: s(61),
            window: s(60),
        })
    );
}

#[test]
fn conflicting_values_are_contradictory_and_repeats_are_not() {
    let conflicting =
        |field| RateLimitVerdict::Contradictory(Contradiction::ConflictingValues { field });
    assert_eq!(
        verdict(&[
            ("x-ratelimit-remaining", "5"),
            ("x-ratelimit-remaining", "6"),
        ]),
        conflicting("x-ratelimit-remaining")
    );
    assert_eq!(
        usable(&[
            ("x-ratelimit-remaining", "5"),
            ("X-RateLimit-Remaining", "5"),
        ])
        .current[0]
            .remaining,
        5
    );
    assert_eq!(
        verdict(&[("RateLimit-Policy", r#""d";q=1;q=2"#)]),
        conflicting(RATELIMIT_POLICY)
    );
    assert_eq!(
        verdict(&[("RateLimit-Policy", r#""d";q=1, "d";q=2"#)]),
        conflicting(RATELIMIT_POLICY)
    );
    assert_eq!(
        verdict(&[("RateLimit", r#""d";r=1, "d";r=2"#)]),
        conflicting(RATELIMIT)
    );
    assert_eq!(
        verdict(&[("x-ratelimit-limit", "10, 20, 10;w=1")]),
        conflicting("x-ratelimit-limit")
    );
    let repeated = usable(&[
        ("RateLimit-Policy", r#""d";q=1;w=1"#),
        ("RateLimit-Policy", r#""d";q=1;w=1"#),
    ]);
    assert_eq!(repeated.policies.len(), 1);
}

#[test]
fn a_state_keyed_apart_from_its_policy_is_contradictory() {
    assert_eq!(
        verdict(&[
            ("RateLimit-Policy", r#""d";q=10;pk=:YWFh:"#),
            ("RateLimit", r#""d";r=1;pk=:YmJi:"#),
        ]),
        RateLimitVerdict::Contradictory(Contradiction::PartitionKeyMismatch {
            policy: Some("d".into())
        })
    );
}

// --- Absurd ----------------------------------------------------------------

#[test]
fn more_policies_than_read_is_absurd() {
    let nine = (0..=MAX_POLICIES)
        .map(|i| format!("\"p{i}\";q=1"))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        verdict(&[("RateLimit-Policy", nine.as_str())]),
        RateLimitVerdict::Absurd(Absurdity::TooManyPolicies {
            field: RATELIMIT_POLICY
        })
    );
    let eight = (0..MAX_POLICIES)
        .map(|i| format!("\"p{i}\";q=1"))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        usable(&[("RateLimit-Policy", eight.as_str())])
            .policies
            .len(),
        8
    );
}

// --- Properties --------------------------------------------------------------

/// Names a response might carry, in any case, plus some it should ignore.
fn header_name() -> impl Strategy<Value = String> {
    let known = prop::sample::select(vec![
        "ratelimit-policy",
        "ratelimit",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
        "x-rate-limit-limit",
        "x-rate-limit-remaining",
        "x-rate-limit-reset",
        "x-rate-limit-reset-after",
        "retry-after",
    ]);
    (known, any::<u16>()).prop_map(|(name, mask)| {
        name.chars()
            .enumerate()
            .map(|(i, c)| {
                if mask >> (i % 16) & 1 == 1 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect()
    })
}

/// Values from pure noise to near-valid structured fields.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9]{0,25}",
        r#"[-+0-9.,;=:"a-z/ ]{0,60}"#,
        (
            "[a-z]{0,3}",
            0i64..2000,
            0i64..2000,
            0i64..100_000,
            "[A-Za-z0-9+/=]{0,8}"
        )
            .prop_map(|(n, q, r, t, pk)| format!(
                "\"{n}\";q={q};r={r};t={t};w={t};pk=:{pk}:, \"x\";q={r}"
            )),
        (0u64..3_000_000_000).prop_map(|n| n.to_string()),
        prop::collection::vec("[-0-9a-z;=\" ]{0,12}", 0..12).prop_map(|v| v.join(",")),
    ]
}

/// Statements of each family with numbers drawn around each other, so
/// that usable, contradictory and absurd readings all come up.
fn statement_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let x = (
        prop::sample::select(vec!["x-ratelimit-", "x-rate-limit-"]),
        0u64..200,
        0u64..200,
        prop_oneof![
            0u64..100_000,
            (NOON - 100..NOON + 100_000),
            (NOON * 1000..NOON * 1000 + 100_000)
        ],
        prop::option::of(0u64..100_000),
        prop::option::of(0u64..4),
    )
        .prop_map(|(prefix, limit, remaining, reset, after, window)| {
            let mut headers = vec![
                (
                    format!("{prefix}limit"),
                    match window {
                        Some(w) => format!("{limit}, {limit};w={w}"),
                        None => limit.to_string(),
                    },
                ),
                (format!("{prefix}remaining"), remaining.to_string()),
                (format!("{prefix}reset"), reset.to_string()),
            ];
            if let Some(after) = after {
                headers.push((format!("{prefix}reset-after"), after.to_string()));
            }
            headers
        });
    let draft = prop::collection::vec((0u64..4, 0u64..200, 0u64..100, 0u64..200, 0u64..120), 1..4)
        .prop_map(|policies| {
            let policy = policies
                .iter()
                .map(|(n, q, w, _, _)| format!("\"p{n}\";q={q};w={w}"))
                .collect::<Vec<_>>()
                .join(", ");
            let state = policies
                .iter()
                .map(|(n, _, _, r, t)| format!("\"p{n}\";r={r};t={t}"))
                .collect::<Vec<_>>()
                .join(", ");
            vec![
                ("RateLimit-Policy".to_owned(), policy),
                ("RateLimit".to_owned(), state),
            ]
        });
    prop_oneof![x, draft]
}

/// The invariants of every reading, whatever its input.
fn check_reading(reading: &RateLimitReading, rules: RateLimitRules) -> Result<(), TestCaseError> {
    prop_assert!(reading.raw.len() <= 4);
    for raw in &reading.raw {
        prop_assert!(raw.value.len() <= crate::hint::MAX_RAW_HINT_BYTES);
    }
    if reading.family.is_none() {
        prop_assert_eq!(&reading.verdict, &RateLimitVerdict::Absent);
    }
    if let Some(limits) = reading.verdict.usable() {
        prop_assert!(limits.policies.len() <= MAX_POLICIES);
        prop_assert!(limits.current.len() <= MAX_POLICIES);
        for p in &limits.policies {
            prop_assert!(p.name.as_ref().is_none_or(|n| n.len() <= MAX_NAME_BYTES));
            prop_assert!(p.window != Some(Duration::ZERO));
        }
        for c in &limits.current {
            if let Some(quota) = c.quota {
                prop_assert!(c.remaining <= quota, "{c:?}");
            }
            if let Some(reset) = c.reset {
                prop_assert!(reset.delay <= rules.max_reset, "{c:?}");
            }
            if let (Some(reset), Some(window)) = (c.reset, c.window) {
                prop_assert!(reset.delay <= window + rules.max_skew, "{c:?}");
            }
        }
    }
    Ok(())
}

/// Values that no count may take.
fn bad_count() -> impl Strategy<Value = String> {
    prop_oneof![
        "-[0-9]{1,6}",
        "\\+[0-9]{1,6}",
        "[0-9]{1,4}\\.[0-9]{1,3}",
        "[0-9]{1,3}e[0-9]",
        "[a-z]{1,6}",
        Just(String::new()),
        "[0-9]{1,3}, *[a-z]{1,3}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_headers_never_panic_and_keep_every_invariant(
        headers in prop_oneof![
            prop::collection::vec((header_name(), header_value()), 0..8),
            statement_headers(),
            (statement_headers(), prop::collection::vec((header_name(), header_value()), 0..3))
                .prop_map(|(mut headers, noise)| {
                    headers.extend(noise);
                    headers
                }),
        ],
        offset in 0u64..200_000,
        clock_trusted in any::<bool>(),
        max_reset in 0u64..200_000,
    ) {
        let rules = RateLimitRules {
            clock_trusted,
            max_skew: s(5),
            max_reset: s(max_reset),
        };
        let at = UNIX_EPOCH + s(NOON - 100_000 + offset);
        let reading = read_rate_limit(
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            at,
            rules,
        );
        check_reading(&reading, rules)?;
    }

    #[test]
    fn an_invalid_count_is_never_usable(
        bad in bad_count(),
        which in 0usize..4,
        hyphenated in any::<bool>(),
    ) {
        let prefix = if hyphenated { "x-rate-limit-" } else { "x-ratelimit-" };
        let names = ["limit", "remaining", "reset", "reset-after"].map(|n| format!("{prefix}{n}"));
        let good = ["100", "5", "30", "30"];
        let headers: Vec<(&str, &str)> = names
            .iter()
            .zip(good)
            .enumerate()
            .map(|(i, (n, v))| (n.as_str(), if i == which { bad.as_str() } else { v }))
            .collect();
        let reading = read(&headers);
        let is_invalid = matches!(reading.verdict, RateLimitVerdict::Invalid { .. });
        prop_assert!(is_invalid, "{headers:?} → {:?}", reading.verdict);
    }

    #[test]
    fn an_invalid_draft_parameter_is_never_usable(
        bad in prop_oneof![
            "-[0-9]{1,6}",
            "[0-9]{1,4}\\.[0-9]{1,3}",
            "\"[0-9]{1,3}\"",
            "[a-z]{1,6}",
            "[0-9]{16,20}",
        ],
        which in 0usize..4,
    ) {
        let mut params = ["100", "60", "5", "30"].map(str::to_owned);
        params[which] = bad.clone();
        let policy = format!("\"d\";q={};w={}", params[0], params[1]);
        let state = format!("\"d\";r={};t={}", params[2], params[3]);
        let reading = read(&[("RateLimit-Policy", &policy), ("RateLimit", &state)]);
        prop_assert!(reading.verdict.usable().is_none(), "{policy} / {state} → {:?}", reading.verdict);
    }

    #[test]
    fn remaining_above_the_quota_is_never_usable(quota in 0u64..10_000, over in 1u64..10_000) {
        let quota_text = quota.to_string();
        let remaining = (quota + over).to_string();
        let reading = read(&[
            ("x-ratelimit-limit", &quota_text),
            ("x-ratelimit-remaining", &remaining),
        ]);
        let contradictory = matches!(
            reading.verdict,
            RateLimitVerdict::Contradictory(Contradiction::RemainingAboveQuota { .. })
        );
        prop_assert!(contradictory, "{:?}", reading.verdict);
    }

    #[test]
    fn a_valid_draft_statement_reads_exactly(
        quota in 0u64..1_000_000,
        window in 1u64..86_400,
        left in 0u64..1_000_000,
        until in 0u64..86_400,
    ) {
        let remaining = left % (quota + 1);
        let until = until % (window + 1);
        let policy = format!("\"p\";q={quota};w={window}");
        let state = format!("\"p\";r={remaining};t={until}");
        let limits = usable(&[("RateLimit-Policy", &policy), ("RateLimit", &state)]);
        prop_assert_eq!(
            &limits.current,
            &vec![CurrentLimit {
                policy: Some("p".into()),
                quota: Some(quota),
                window: Some(s(window)),
                remaining,
                reset: reset(until, ResetForm::Seconds),
                partition_key: None,
            }]
        );
    }

    #[test]
    fn a_valid_epoch_reset_converts_exactly(ahead in 0u64..86_400, remaining in 0u64..5000) {
        let at = epoch_in(ahead);
        let remaining_text = remaining.to_string();
        let limits = usable(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", &remaining_text),
            ("x-ratelimit-reset", &at),
        ]);
        prop_assert_eq!(limits.current[0].reset, reset(ahead, ResetForm::Epoch));
    }
}

#[test]
fn stated_fields_are_collected_joined_and_a_long_one_reads_as_too_long() {
    let fields = stated_fields([
        ("RateLimit", "\"a\";r=1;t=1"),
        ("content-type", "text/plain"),
        ("ratelimit", "\"b\";r=2;t=1"),
        ("X-RateLimit-Remaining", "7"),
    ]);
    let names: Vec<_> = fields.iter().map(|f| (f.name, f.value.as_str())).collect();
    assert_eq!(
        names,
        [
            ("ratelimit", "\"a\";r=1;t=1, \"b\";r=2;t=1"),
            ("x-ratelimit-remaining", "7")
        ]
    );
    // Cut to the bound and flagged: read back, it is too long, never the
    // part kept (a cut `q=1000` would read as `q=10`).
    let long = format!("\"d\";r=1;t=1, {}", "\"x\";r=1".repeat(400));
    let fields = stated_fields([("ratelimit", long.as_str())]);
    assert!(fields[0].truncated);
    assert_eq!(fields[0].value.len(), MAX_FIELD_BYTES);
    let reading = read_stated_fields(&fields, SystemTime::UNIX_EPOCH, RateLimitRules::default());
    assert!(matches!(
        reading.verdict,
        RateLimitVerdict::Invalid {
            why: InvalidStatement::TooLong,
            ..
        }
    ));
}
