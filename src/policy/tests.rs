use super::*;

fn rule(caller: &str, route: &str, version: u64) -> PolicyRule {
    PolicyRule {
        caller_scope: Pattern::parse(caller),
        route: Pattern::parse(route),
        policy: Arc::new(
            Policy::try_new(&PolicySpec {
                policy_version: Some(version),
                ..PolicySpec::default()
            })
            .expect("valid"),
        ),
    }
}

fn key(caller: &str, route: &str) -> RouteKey {
    RouteKey {
        caller_scope: caller.into(),
        route: route.into(),
    }
}

#[test]
fn defaults_are_the_documented_numbers() {
    let p = Policy::default();
    assert_eq!(p.window_secs, 10);
    assert_eq!(p.floor_milli_per_sec, 10_000);
    assert_eq!(p.ratio_milli, 200);
    assert_eq!(p.cost_milli, [1000, 2000]);
    assert_eq!(p.shares_permille, [200, 600, 200]);
    assert_eq!(p.max_hint_ms, 300_000);
    // Learned, between a floor of min_retries_per_sec and the ceiling.
    let learned = crate::pacing::PacingPolicy {
        floor_m: 10_000,
        ..crate::pacing::PacingPolicy::default()
    };
    assert_eq!(p.pacing, learned);
    assert!(p.hold_first_attempts);
    assert_eq!(p.policy_version, 1);
}

#[test]
fn out_of_range_fields_are_named() {
    let cases: [(PolicySpec, &str); 6] = [
        (
            PolicySpec {
                window: Some("61s".into()),
                ..PolicySpec::default()
            },
            "window",
        ),
        (
            PolicySpec {
                window: Some("1500ms".into()),
                ..PolicySpec::default()
            },
            "window",
        ),
        (
            PolicySpec {
                retry_ratio: Some(0.0001),
                ..PolicySpec::default()
            },
            "retry_ratio",
        ),
        (
            PolicySpec {
                shares: Some(Shares {
                    critical: 0.5,
                    normal: 0.5,
                    bulk: 0.5,
                }),
                ..PolicySpec::default()
            },
            "shares",
        ),
        (
            PolicySpec {
                max_hint: Some("soon".into()),
                ..PolicySpec::default()
            },
            "max_hint",
        ),
        (
            PolicySpec {
                stated_margin: Some(0.95),
                ..PolicySpec::default()
            },
            "stated_margin",
        ),
    ];
    for (spec, field) in cases {
        let err = Policy::try_new(&spec).expect_err(field);
        assert!(err.to_string().starts_with(field), "{err}");
    }
}

#[test]
fn exact_beats_prefix_beats_wildcard() {
    let set = PolicySet::try_new(
        Policy::default(),
        vec![
            rule("*", "*", 2),
            rule("*", "GET /users*", 3),
            rule("*", "GET /users/{id}", 4),
            rule("*", "GET /u*", 5),
            rule("tenant-a", "GET /users*", 6),
        ],
    )
    .expect("valid set");
    assert_eq!(set.resolve(&key("t", "GET /users/{id}")).policy_version, 4);
    assert_eq!(set.resolve(&key("t", "GET /users")).policy_version, 3);
    assert_eq!(
        set.resolve(&key("tenant-a", "GET /users")).policy_version,
        6
    );
    assert_eq!(set.resolve(&key("t", "GET /up")).policy_version, 5);
    assert_eq!(set.resolve(&key("t", "POST /x")).policy_version, 2);
    let bare = PolicySet::try_new(Policy::default(), vec![]).expect("empty");
    assert_eq!(bare.resolve(&key("t", "POST /x")).policy_version, 1);
}

#[test]
fn duplicate_patterns_are_refused() {
    let err = PolicySet::try_new(
        Policy::default(),
        vec![rule("*", "a*", 1), rule("*", "a*", 2)],
    )
    .expect_err("duplicate");
    assert!(matches!(
        err,
        PolicyError::DuplicateRule {
            first: 0,
            second: 1,
            ..
        }
    ));
}
