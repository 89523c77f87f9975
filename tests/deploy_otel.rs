//! deploy/otel's compose stack cannot run here (no collector, Tempo or
//! Grafana): its files are parsed and checked against each other. The
//! dashboard's and the alert rules' queries run on a real Prometheus in
//! tests/dashboards.rs.

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

/// The compose file is read, not run: its services, the coordinator's
/// /metrics flags, its mounts' sources and Prometheus's scrape target.
#[test]
fn compose_names_the_stack_mounts_files_that_exist_and_is_scraped_where_it_serves() {
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
    assert!(
        command.iter().any(|a| a == "--allow-plaintext-metrics"),
        "/metrics in plaintext off loopback needs the flag, or the coordinator refuses to start"
    );
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

/// The dashboard's shape. That its queries name metrics and labels the code
/// really exports is proven on a real Prometheus by tests/dashboards.rs,
/// which evaluates every one of them.
#[test]
fn the_dashboard_has_metric_panels_and_a_trace_panel() {
    let text = std::fs::read_to_string(dir().join("grafana/tollgate.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(dashboard["uid"], "tollgate");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut traces = false;
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str();
            let query = target["query"].as_str();
            assert!(
                expr.is_some() || query.is_some(),
                "{} has a target without a query",
                panel["title"]
            );
            traces |= query.is_some_and(|q| q.contains("tollgate.intent"));
        }
    }
    assert!(traces, "a panel lists tollgate.intent traces");
}
