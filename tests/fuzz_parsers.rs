//! Property-based fuzzing of the parsers that read a peer's or an
//! operator's text: the one `Retry-After` / pushback parser (worker and
//! coordinator), the policy file, and the state file loader. Each returns a
//! verdict or a typed error on any input; none panics, and what they accept
//! keeps its invariants.
//!
//! 64 cases per property by default; `TOLLGATE_FUZZ_CASES=N` runs N.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use tollgate::config::{Config, PolicyDoc};
use tollgate::control::persist::{self, StateFile};
use tollgate::hints::{EvidenceInput, assess};
use tollgate::policy::Policy;
use tollgate_client::hint::{HintRules, HintVerdict, read_pushback_ms, read_retry_after};

fn runner() -> TestRunner {
    let cases = std::env::var("TOLLGATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

/// Text shaped like a hint (digits, signs, exponents, dates, whitespace)
/// more often than not, and any Unicode otherwise.
fn hint_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ \t]{0,2}[-+]?[0-9]{0,25}(\\.[0-9]{0,3})?([eE][-+]?[0-9]{1,4})?[ \t]{0,2}",
        "(Mon|Tue|Sun|mon), [0-9]{1,2} (Jan|Feb|Dec|jan) [0-9]{1,5} [0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2} (GMT|UTC|gmt)",
        "[A-Za-z]{6,9}, [0-9]{2}-[A-Za-z]{3}-[0-9]{2} [0-9:]{8} GMT",
        "[A-Za-z]{3} [A-Za-z]{3} [ 0-9]{2} [0-9:]{8} [0-9]{4}",
        prop::collection::vec(any::<char>(), 0..300).prop_map(String::from_iter),
    ]
}

fn rules() -> impl Strategy<Value = HintRules> {
    (
        any::<bool>(),
        prop::option::of(any::<u64>().prop_map(Duration::from_millis)),
    )
        .prop_map(|(clock_trusted, max_hint)| HintRules {
            clock_trusted,
            max_hint,
        })
}

/// The hint readers classify every text, and a verdict they call valid
/// respects the cap; the coordinator's assessment of the same text never
/// panics, whatever the receipt and coordinator clocks say.
#[test]
fn hint_parsers_read_any_text() {
    let input = (
        hint_text(),
        rules(),
        any::<u32>(),
        any::<i64>(),
        any::<i64>(),
    );
    runner()
        .run(&input, |(text, rules, receipt_s, receipt_ms, now_ms)| {
            let receipt = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(receipt_s));
            for reading in [
                read_retry_after(Some(&text), receipt, rules),
                read_pushback_ms(Some(&text), rules),
            ] {
                if let (HintVerdict::Valid { delay, .. }, Some(cap)) =
                    (reading.verdict, rules.max_hint)
                {
                    prop_assert!(delay <= cap, "{text:?}: {delay:?} above the cap {cap:?}");
                }
            }
            let policy = Policy::default();
            for (retry_after, pushback_ms) in
                [(Some(text.as_str()), None), (None, Some(text.as_str()))]
            {
                let a = assess(
                    &EvidenceInput {
                        http_status: 429,
                        grpc_code: 0,
                        retry_after,
                        pushback_ms,
                        receipt_ms,
                    },
                    &policy,
                    now_ms,
                );
                // A hint that is not valid never becomes a cooldown.
                prop_assert!(a.valid || a.cooldown_until_ms.is_none(), "{text:?}: {a:?}");
            }
            Ok(())
        })
        .expect("the property holds");
}

/// Policy-file text: well-formed TOML with arbitrary values under the real
/// keys, a valid file with bytes flipped, or any text.
fn policy_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        "-?[0-9]{1,22}(\\.[0-9]{1,3})?",
        "\"[ -~]{0,20}\"",
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("true".to_owned()),
    ];
    let key = prop::sample::select(vec![
        "window",
        "min_retries_per_sec",
        "retry_ratio",
        "max_retries_per_window",
        "cost_transient",
        "cost_throttled",
        "lease_ttl",
        "max_hint",
        "clock_skew_tolerance",
        "backoff_base",
        "backoff_max",
        "wake_rate",
        "caller_scope",
        "route",
        "policy_version",
        "max_scopes",
        "token",
        "caller_scopes",
        "name",
    ]);
    let table = prop::sample::select(vec![
        "[defaults]",
        "[[rule]]",
        "[server]",
        "[[token]]",
        "[[admin_token]]",
        "[defaults.shares]",
    ]);
    let structured =
        prop::collection::vec((table, prop::collection::vec((key, value), 0..6)), 0..6).prop_map(
            |tables| {
                let mut text = String::new();
                for (table, entries) in tables {
                    text.push_str(table);
                    text.push('\n');
                    for (key, value) in entries {
                        text.push_str(&format!("{key} = {value}\n"));
                    }
                }
                text
            },
        );
    prop_oneof![
        3 => structured,
        1 => prop::collection::vec(any::<char>(), 0..500).prop_map(String::from_iter),
    ]
}

/// The policy-file parser returns a config or an error for any text, and a
/// config it accepts builds its policies again (what a reload and the
/// state file rely on).
#[test]
fn policy_file_parser_reads_any_text() {
    runner()
        .run(&policy_text(), |text| {
            if let Ok(config) = Config::from_toml(&text, |_| Some("env-secret-value".into())) {
                prop_assert!(config.doc.build().is_ok(), "{text:?}");
            }
            if let Ok(doc) = PolicyDoc::from_toml(&text) {
                let _ = doc.build();
            }
            Ok(())
        })
        .expect("the property holds");
}

/// The state file loader returns a state, "none", or an error naming the
/// file for any bytes: a valid file with bytes flipped, truncated, or
/// arbitrary. A state it accepts has policies that build.
#[test]
fn state_file_loader_reads_any_bytes() {
    let dir = tempdir("fuzz-state-file");
    let path = dir.join("state.json");
    let valid = serde_json::to_vec_pretty(&StateFile {
        format: persist::FORMAT,
        file_digest: 7,
        doc: PolicyDoc::from_toml("[[rule]]\nroute = \"GET /x\"\nretry_ratio = 0.5\n")
            .expect("valid doc"),
        freezes: Vec::new(),
        file_doc: None,
        overrides: Default::default(),
        mutes: Vec::new(),
    })
    .expect("serializable");
    let len = valid.len();
    let mutated = (prop::collection::vec((0..len, any::<u8>()), 0..8), 0..=len).prop_map(
        move |(flips, keep)| {
            let mut bytes = valid.clone();
            for (at, byte) in flips {
                bytes[at] = byte;
            }
            bytes.truncate(keep);
            bytes
        },
    );
    let input = prop_oneof![3 => mutated, 1 => prop::collection::vec(any::<u8>(), 0..600)];
    runner()
        .run(&input, |bytes| {
            std::fs::write(&path, &bytes).expect("write the case");
            match persist::load(&path) {
                Ok(Some(state)) => prop_assert!(state.doc.build().is_ok()),
                Ok(None) => prop_assert!(false, "an existing file read as none"),
                Err(e) => prop_assert!(e.to_string().contains("state.json"), "{e}"),
            }
            Ok(())
        })
        .expect("the property holds");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system temp dir, unique to this process.
fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}
