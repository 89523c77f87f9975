//! deploy/otel cannot run here (no collector, Tempo, Prometheus or Grafana):
//! its files are parsed and checked against each other and against the
//! metric names the code exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_norway::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/otel")
}

fn yaml(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect(name);
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_mapping()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every metric the coordinator and the client export, as Prometheus names
/// (tests/metrics.rs scrapes these).
const METRICS: &[&str] = &[
    "tollgate_leases_total",
    "tollgate_tokens_granted_total",
    "tollgate_tokens_returned_total",
    "tollgate_tokens_outstanding",
    "tollgate_budget_remaining",
    "tollgate_budget_lowest",
    "tollgate_cooldowns_active",
    "tollgate_hints_total",
    "tollgate_slots_total",
    "tollgate_slot_delay_seconds_bucket",
    "tollgate_client_retries_bucket",
    "tollgate_client_retry_delay_seconds_bucket",
    "tollgate_client_fallback",
];

#[test]
fn the_collector_pipelines_use_only_defined_components() {
    let config = yaml("otel-collector.yaml");
    let receivers = keys(&config["receivers"]);
    let processors = keys(&config["processors"]);
    let exporters = keys(&config["exporters"]);
    assert!(receivers.contains("otlp"));
    let grpc = &config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"];
    assert_eq!(grpc.as_str(), Some("0.0.0.0:4317"));
    let pipelines = &config["service"]["pipelines"];
    assert_eq!(
        keys(pipelines),
        ["metrics", "traces"].map(String::from).into()
    );
    for (name, pipeline) in pipelines.as_mapping().expect("pipelines") {
        for (kind, defined) in [
            ("receivers", &receivers),
            ("processors", &processors),
            ("exporters", &exporters),
        ] {
            for component in strings(&pipeline[kind]) {
                assert!(
                    defined.contains(&component),
                    "{name:?} uses undefined {kind} {component}"
                );
            }
        }
    }
}

#[test]
fn compose_brings_up_the_stack_with_existing_files() {
    let compose = yaml("compose.yaml");
    let services = keys(&compose["services"]);
    for service in [
        "coordinator",
        "otel-collector",
        "tempo",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains(service), "no {service} service");
    }
    let coordinator = &compose["services"]["coordinator"];
    let command = strings(&coordinator["command"]);
    let metrics_at = command
        .iter()
        .position(|a| a == "--metrics-listen")
        .expect("the coordinator serves /metrics");
    assert_eq!(command[metrics_at + 1], "0.0.0.0:9464");
    let env = keys(&coordinator["environment"]);
    assert!(env.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"));
    assert!(env.contains("OTEL_SERVICE_NAME"));
    // Mounted files exist.
    for (_, service) in compose["services"].as_mapping().expect("services") {
        for volume in strings(&service["volumes"]) {
            let source = volume.split(':').next().expect("a source");
            if source.starts_with("./") {
                assert!(
                    dir().join(source).exists(),
                    "{source} is mounted but missing"
                );
            }
        }
    }
    // Prometheus scrapes the coordinator where compose serves it.
    let prometheus = yaml("prometheus.yaml");
    let targets: Vec<String> = prometheus["scrape_configs"]
        .as_sequence()
        .expect("scrape configs")
        .iter()
        .flat_map(|job| strings(&job["static_configs"][0]["targets"]))
        .collect();
    assert!(
        targets.contains(&"coordinator:9464".to_owned()),
        "{targets:?}"
    );
    yaml("tempo.yaml");
    yaml("grafana/datasources.yaml");
    yaml("grafana/dashboards.yaml");
}

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let text = std::fs::read_to_string(dir().join("grafana/tollgate.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(dashboard["uid"], "tollgate");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut used = BTreeSet::new();
    let mut traces = false;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            if let Some(expr) = target["expr"].as_str() {
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("tollgate_") && !word.starts_with("tollgate_hint_") {
                        used.insert(word.to_owned());
                    }
                }
            }
            if let Some(query) = target["query"].as_str() {
                traces |= query.contains("tollgate.intent");
            }
        }
    }
    let labels = [
        "tollgate_decision",
        "tollgate_reason",
        "tollgate_priority",
        "tollgate_caller_scope",
        "tollgate_route",
    ];
    for name in &used {
        assert!(
            METRICS.contains(&name.as_str()) || labels.contains(&name.as_str()),
            "the dashboard queries {name}, which nothing exports"
        );
    }
    for metric in METRICS {
        if *metric != "tollgate_tokens_returned_total" && *metric != "tollgate_tokens_granted_total"
        {
            assert!(used.contains(*metric), "no panel shows {metric}");
        }
    }
    assert!(traces, "a panel lists tollgate.intent traces");
}
