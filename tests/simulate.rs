//! `tollgate simulate` end to end: the shared worked examples reproduce their
//! expected results, through the library and through the built binary, and
//! inline scenarios cover each way an intent ends.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tollgate::simulate::{self, Report, SimulateError};

fn shared(path: &str) -> String {
    format!("{}/examples/scenarios/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Every field of `expected` equals the same field of `actual`.
fn assert_subset(expected: &Value, actual: &Value) {
    let Value::Object(fields) = expected else {
        panic!("expected results are objects, got {expected}");
    };
    for (key, want) in fields {
        assert_eq!(actual.get(key), Some(want), "field {key} of {actual}");
    }
}

fn run_text(text: &str) -> Result<Report, SimulateError> {
    let mut scenarios = simulate::load("inline", text)?;
    assert_eq!(scenarios.len(), 1);
    scenarios.remove(0).and_then(|s| simulate::simulate(&s))
}

/// The README's schedule-a, changed by `edit`, run to a JSON value.
fn run_edited(edit: impl FnOnce(&mut Value)) -> Value {
    let mut scenario: Value =
        serde_json::from_str(&read(&shared("schedule-a.json"))).expect("json");
    edit(&mut scenario);
    let report = run_text(&scenario.to_string()).expect("valid scenario");
    serde_json::to_value(report).expect("serialize")
}

const EXAMPLES: [&str; 2] = ["schedule-a", "missing-header"];

#[test]
fn the_worked_examples_reproduce_their_expected_results() {
    for name in EXAMPLES {
        let report = run_text(&read(&shared(&format!("{name}.json")))).expect(name);
        let expected: Value =
            serde_json::from_str(&read(&shared(&format!("expected/{name}.json")))).expect(name);
        assert_subset(
            &expected,
            &serde_json::to_value(&report).expect("serialize"),
        );
    }
}

#[test]
fn the_schedule_a_timeline_is_the_readmes() {
    let report = run_edited(|_| {});
    assert_eq!(
        report["timeline"],
        json!([
            {"attempt":1,"start_s":0,"receipt_s":2,"status":429,
             "hint":{"raw":"3","form":"delay","valid":true,"delay_s":3},
             "wait_s":3,"next_start_s":5,"remaining_s":18,"decision":"wait"},
            {"attempt":2,"start_s":5,"receipt_s":7,"status":429,
             "hint":{"raw":"4","form":"delay","valid":true,"delay_s":4},
             "wait_s":4,"next_start_s":11,"remaining_s":13,"decision":"wait"},
            {"attempt":3,"start_s":11,"receipt_s":14,"status":200,"decision":"succeeded"}
        ])
    );
    assert_eq!(
        report["message"],
        "Succeeded. Last response: 200. Attempts: 3 of 3. Elapsed: 14 s."
    );
}

#[test]
fn the_binary_prints_one_json_line_per_scenario_in_input_order() {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", "--json"])
        .args(EXAMPLES.map(|name| shared(&format!("{name}.json"))))
        .output()
        .expect("run tollgate");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2);
    for (line, name) in lines.iter().zip(EXAMPLES) {
        let actual: Value = serde_json::from_str(line).expect("a JSON object per line");
        let expected: Value =
            serde_json::from_str(&read(&shared(&format!("expected/{name}.json")))).expect(name);
        assert_subset(&expected, &actual);
    }
}

#[test]
fn the_binary_prints_a_table_without_json() {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", &shared("schedule-a.json")])
        .output()
        .expect("run tollgate");
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert!(
        stdout.starts_with("schedule-a: succeeded at 14 s"),
        "{stdout}"
    );
    assert!(stdout.contains("next start"), "{stdout}");
    assert!(stdout.contains("Attempts: 3 of 3."), "{stdout}");
}

#[test]
fn a_bad_scenario_exits_2_naming_scenario_and_field_and_the_rest_still_run() {
    let good: Value = serde_json::from_str(&read(&shared("missing-header.json"))).expect("json");
    let mut bad = good.clone();
    bad["name"] = json!("too-long-attempt");
    bad["responses"][1]["duration_s"] = json!(4.5);
    let mut unknown = good.clone();
    unknown["name"] = json!("typo");
    unknown["policy"]["min_wait"] = json!(1);
    let input = json!([bad, good, unknown]).to_string();

    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tollgate");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(2));
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let names: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json")["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("missing-header")],
        "only the valid scenario prints"
    );
    let stderr = String::from_utf8(output.stderr).expect("utf-8");
    assert!(
        stderr.contains("\"too-long-attempt\"") && stderr.contains("responses[1].duration_s"),
        "{stderr}"
    );
    assert!(
        stderr.contains("\"typo\"") && stderr.contains("policy.min_wait"),
        "{stderr}"
    );
}

#[test]
fn invalid_fields_are_named() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 7] = [
        ("policy.max_attempts", |s| {
            s["policy"]["max_attempts"] = json!(-1)
        }),
        ("policy.total_budget_s", |s| {
            s["policy"]["total_budget_s"] = json!(-0.5)
        }),
        ("policy.attempt_cap_s", |s| {
            s["policy"]["attempt_cap_s"] = json!(30)
        }),
        ("cancel_at_s", |s| s["cancel_at_s"] = json!(1e12)),
        ("responses[0].status", |s| {
            s["responses"][0]["status"] = json!(42)
        }),
        ("responses", |s| {
            s["responses"].as_array_mut().expect("array").pop();
        }),
        ("clock.wall_at_start", |s| {
            s["clock"]["wall_at_start"] = json!("noon")
        }),
    ];
    for (field, edit) in cases {
        let mut scenario: Value =
            serde_json::from_str(&read(&shared("schedule-a.json"))).expect("json");
        edit(&mut scenario);
        match run_text(&scenario.to_string()) {
            Err(SimulateError::Scenario {
                scenario, field: f, ..
            }) => {
                assert_eq!(scenario, "schedule-a");
                assert_eq!(f, field);
            }
            other => panic!("{field}: expected a scenario error, got {other:?}"),
        }
    }
}

#[test]
fn a_valid_hint_that_cannot_fit_stops_at_receipt() {
    let r = run_edited(|s| s["responses"][0]["retry_after"] = json!("30"));
    assert_subset(
        &json!({"outcome":"deadline_infeasible","ended_at_s":2,"attempts":1,
                "request_s":2,"waited_s":0,"last_status":429}),
        &r,
    );
    assert_eq!(
        r["message"],
        "Stopped: retry budget cannot fit another request. Last response: 429. \
         Attempts: 1 of 3. Elapsed: 2 s. The service requested a 30 s delay. No retry was sent."
    );
    assert_eq!(r["timeline"][0]["next_start_s"], 32);
}

#[test]
fn cancel_while_waiting_and_while_in_flight() {
    let waiting = run_edited(|s| s["cancel_at_s"] = json!(4));
    assert_subset(
        &json!({"outcome":"cancelled","ended_at_s":4,"attempts":1,
                "request_s":2,"waited_s":2,"last_status":429}),
        &waiting,
    );
    let in_flight = run_edited(|s| s["cancel_at_s"] = json!(6));
    assert_subset(
        &json!({"outcome":"cancelled","ended_at_s":6,"attempts":2,
                "request_s":3,"waited_s":3,"last_status":429}),
        &in_flight,
    );
    assert_eq!(
        in_flight["timeline"][1],
        json!({"attempt":2,"start_s":5,"status":null,"decision":"cancelled",
               "response_discarded":true})
    );
    let before = run_edited(|s| s["cancel_at_s"] = json!(0));
    assert_subset(
        &json!({"outcome":"cancelled","attempts":0,"last_status":null}),
        &before,
    );
}

#[test]
fn a_late_wake_is_re_checked_against_the_current_time() {
    let r = run_edited(|s| s["wake_late_s"] = json!(3));
    // Woke at 8 (fits), then at 17: 17 + 4 > 20.
    assert_subset(
        &json!({"outcome":"deadline_infeasible","ended_at_s":17,"attempts":2,
                "request_s":4,"waited_s":13}),
        &r,
    );
    assert_eq!(r["timeline"][1]["woke_s"], 17);
}

#[test]
fn an_invalid_hint_falls_back_to_the_local_backoff() {
    let r = run_edited(|s| s["responses"][0]["retry_after"] = json!("1.5"));
    let first = &r["timeline"][0];
    assert_eq!(first["hint"]["form"], "invalid");
    assert_eq!(first["hint"]["valid"], false);
    assert_eq!(first["hint"]["raw"], "1.5");
    assert_eq!(first["wait_s"], 2);
    assert_eq!(r["outcome"], "succeeded");
}

#[test]
fn dates_need_a_trusted_clock() {
    let date = "Mon, 01 Jan 2024 12:00:05 GMT"; // 3 s after the 12:00:02 receipt
    let trusted = run_edited(|s| s["responses"][0]["retry_after"] = json!(date));
    assert_eq!(trusted["timeline"][0]["hint"]["delay_s"], 3);
    assert_eq!(trusted["timeline"][0]["wait_s"], 3);
    let untrusted = run_edited(|s| {
        s["responses"][0]["retry_after"] = json!(date);
        s["clock"]["trusted"] = json!(false);
    });
    assert_subset(
        &json!({"outcome":"clock_untrusted","ended_at_s":2,"attempts":1}),
        &untrusted,
    );
}

#[test]
fn a_hint_above_max_hint_is_not_shortened() {
    let r = run_edited(|s| {
        s["policy"]["max_hint_s"] = json!(10);
        s["responses"][0]["retry_after"] = json!("11");
    });
    assert_subset(&json!({"outcome":"hint_exceeds_cap","ended_at_s":2}), &r);
    assert_eq!(
        r["timeline"][0]["hint"],
        json!({"raw":"11","form":"delay","valid":true,"delay_s":11,"cap_s":10})
    );
}

#[test]
fn statuses_outside_the_list_stop_and_the_cap_ends_repeats() {
    let r = run_edited(|s| s["responses"][0]["status"] = json!(404));
    assert_subset(&json!({"outcome":"non_retryable","last_status":404}), &r);
    let r = run_edited(|s| {
        s["responses"][2] = json!({"duration_s": 1, "status": 429, "retry_after": "1"});
    });
    assert_subset(&json!({"outcome":"attempt_cap","attempts":3}), &r);
}

#[test]
fn full_jitter_is_reproducible_with_its_seed_and_floored() {
    let jittered = |seed: u64| {
        run_edited(|s| {
            s["policy"]["jitter"] = json!({"kind": "full", "seed": seed});
            s["policy"]["total_budget_s"] = json!(100);
            s["policy"]["max_attempts"] = json!(5);
            s["responses"] = json!([
                {"duration_s": 1, "status": 503},
                {"duration_s": 1, "status": 503},
                {"duration_s": 1, "status": 503},
                {"duration_s": 1, "status": 200}
            ]);
            s["policy"]["retry_statuses"] = json!([503]);
        })
    };
    let a = jittered(7);
    assert_eq!(a, jittered(7));
    assert_eq!(a["outcome"], "succeeded");
    for entry in a["timeline"].as_array().expect("timeline").iter().take(3) {
        let wait = entry["wait_s"].as_f64().expect("a wait");
        assert!(wait >= 1.0, "floored by min_wait_s: {entry}");
    }
}

#[test]
fn fractional_seconds_stay_decimal() {
    let r = run_edited(|s| {
        s["responses"][0]["duration_s"] = json!(0.1);
        s["responses"][1]["duration_s"] = json!(0.2);
        s["responses"][2]["duration_s"] = json!(0.5);
    });
    assert_eq!(r["request_s"], json!(0.8));
    assert_eq!(r["ended_at_s"], json!(7.8));
}
