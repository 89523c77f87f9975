//! The shipped Grafana dashboard and Prometheus alert rules, proven on real
//! parts: a real Prometheus (the `prometheus` binary, temp config and
//! storage, free port) scrapes a real `tollgate serve` (`--metrics-listen`)
//! and a worker's `/metrics` while a small storm runs (leases until the
//! budget is spent, reports with 429 + `Retry-After`, slots, two freezes,
//! a worker on its fallback budget, a flood of scopes past the scope
//! limit); then every PromQL expression of the dashboard, and every alert
//! rule's query without its threshold, must return at least one series.
//!
//! Worker metrics reach Prometheus the way a test can make real: this
//! process is the worker, with the client's instruments on a Prometheus
//! registry served by the coordinator's own `/metrics` server, scraped under
//! the job name the shipped config gives the OpenTelemetry Collector (which
//! in deployment turns the workers' OTLP metrics into the same names).
//!
//! Without a `prometheus` binary the storm test prints a notice and passes,
//! unless `TOLLGATE_REQUIRE_PROMETHEUS=1` or CI (`CI` set) makes it fail.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_norway::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tollgate::server::metrics_http;
use tollgate::telemetry::{Telemetry, TelemetryConfig};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::{Clock, SystemClock};
use tollgate_client::engine::{IntentPolicy, Observation};
use tollgate_client::gate::{Attempt, Gate, GateConfig, GateIntent, Reply};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::{
    self, Evidence, FreezeScopeRequest, LeaseLimit, LeaseRequest, Priority, ReconsiderRequest,
    ReleaseRequest, ReportRequest, RetryClass, ScopeCertainty,
};
use tonic::transport::Channel;

#[path = "support/process.rs"]
mod process;

use process::{BIN, Served};
/// How long Prometheus gets to scrape and answer every expression.
const SERIES_DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/otel")
}

fn yaml(name: &str) -> Value {
    let text = std::fs::read_to_string(deploy().join(name)).expect(name);
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every alert rule of `alerts.yaml`: (name, expr).
fn alert_rules() -> Vec<(String, String)> {
    let alerts = yaml("alerts.yaml");
    let mut rules = Vec::new();
    for group in alerts["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name").to_owned();
            let expr = rule["expr"].as_str().expect("an expr").to_owned();
            rules.push((name, expr));
        }
    }
    rules
}

/// `query op number` → `query`: the rule's query without its threshold.
/// `None` when the expression does not end in a comparison with a number.
fn without_threshold(expr: &str) -> Option<&str> {
    let expr = expr.trim();
    let (rest, number) = expr.rsplit_once(char::is_whitespace)?;
    number.parse::<f64>().ok()?;
    let rest = rest.trim_end();
    ["==", "!=", ">=", "<=", ">", "<"]
        .iter()
        .find_map(|op| rest.strip_suffix(op))
        .map(str::trim_end)
}

/// Every PromQL expression of the dashboard: (panel title, expr).
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join("grafana/tollgate.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            if let Some(expr) = target["expr"].as_str() {
                let title = panel["title"].as_str().unwrap_or("?").to_owned();
                exprs.push((title, expr.to_owned()));
            }
        }
    }
    exprs
}

#[test]
fn every_alert_rule_is_a_query_compared_with_a_threshold() {
    let rules = alert_rules();
    assert!(rules.len() >= 8, "{rules:?}");
    for (name, expr) in &rules {
        let query = without_threshold(expr)
            .unwrap_or_else(|| panic!("{name}: `{expr}` does not end in `op number`"));
        assert!(!query.is_empty(), "{name}");
    }
    // Wired into the shipped Prometheus config where compose mounts it.
    let prometheus = yaml("prometheus.yaml");
    let rule_files = prometheus["rule_files"].as_sequence().expect("rule_files");
    assert_eq!(
        rule_files[0].as_str(),
        Some("/etc/prometheus/alerts.yaml"),
        "{rule_files:?}"
    );
    let compose = yaml("compose.yaml");
    let volumes = compose["services"]["prometheus"]["volumes"]
        .as_sequence()
        .expect("volumes");
    assert!(
        volumes
            .iter()
            .any(|v| v.as_str() == Some("./alerts.yaml:/etc/prometheus/alerts.yaml:ro")),
        "{volumes:?}"
    );
}

#[test]
fn thresholds_are_split_off_only_at_the_end() {
    assert_eq!(without_threshold("up == 0"), Some("up"));
    assert_eq!(
        without_threshold("time() - max(x{a=\"1\"}) > 60"),
        Some("time() - max(x{a=\"1\"})")
    );
    assert_eq!(without_threshold("avg(x) > 0.5"), Some("avg(x)"));
    assert_eq!(without_threshold("rate(x[5m])"), None);
}

fn prometheus_available() -> bool {
    Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-dashboards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The policy: a budget small enough to run out (1 retry/s over 10 s), and
/// a scope limit small enough for a flood to reach.
const POLICY: &str = r#"
[server]
max_scopes = 12

[defaults]
window = "10s"
min_retries_per_sec = 1
retry_ratio = 0.1
"#;

/// `tollgate serve` with `/metrics`, both listeners on port 0: where they
/// are bound is read from its log.
fn start_coordinator(dir: &Path) -> Served {
    std::fs::write(dir.join("policy.toml"), POLICY).expect("policy file");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(dir.join("policy.toml"))
        .env("RUST_LOG", "info")
        .env_remove("TOLLGATE_LISTEN")
        .env_remove("TOLLGATE_METRICS_LISTEN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    Served::spawn(command, &dir.join("coordinator.log"))
}

/// The shipped `prometheus.yaml` with this run's targets, a 1 s scrape and
/// evaluation interval and the alert rules at their path in the repository;
/// its web listener on port 0, and where it is bound (read from its log).
fn start_prometheus(
    dir: &Path,
    coordinator: SocketAddr,
    worker: SocketAddr,
) -> (process::Launched, SocketAddr) {
    let mut config = yaml("prometheus.yaml");
    config["global"]["scrape_interval"] = Value::from("1s");
    config["global"]["evaluation_interval"] = Value::from("1s");
    let alerts = deploy().join("alerts.yaml");
    config["rule_files"] =
        Value::Sequence(vec![Value::from(alerts.to_str().expect("a UTF-8 path"))]);
    for job in config["scrape_configs"]
        .as_sequence_mut()
        .expect("scrape configs")
    {
        let target = match job["job_name"].as_str() {
            Some("tollgate-coordinator") => coordinator,
            Some("otel-collector") => worker,
            other => panic!("unexpected job {other:?}"),
        };
        job["static_configs"][0]["targets"] =
            Value::Sequence(vec![Value::from(target.to_string())]);
    }
    let path = dir.join("prometheus.yaml");
    std::fs::write(&path, serde_norway::to_string(&config).expect("yaml")).expect("config");
    let mut command = Command::new("prometheus");
    command
        .arg(format!("--config.file={}", path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg("--web.listen-address=127.0.0.1:0")
        // INFO: the line that says where the web listener is bound.
        .arg("--log.level=info");
    let mut prometheus = process::launch(command, &dir.join("prometheus.log"));
    let give_up = std::time::Instant::now() + SERIES_DEADLINE;
    let web = loop {
        if let Some(status) = prometheus.child.try_wait().expect("try_wait") {
            panic!("prometheus exited ({status}):\n{}", prometheus.whole_log());
        }
        let log = std::fs::read_to_string(&prometheus.log).unwrap_or_default();
        if let Some(web) = process::logged_address(&log, "msg=\"Listening on\"") {
            break web;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "prometheus did not say where it listens:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (prometheus, web)
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` on Prometheus's HTTP API; the JSON body, or `None` while it
/// is not up. HTTP/1.0, so the body is neither chunked nor kept alive.
async fn api(web: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let mut stream = TcpStream::connect(web).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// How many series `expr` returns now (an error counts as none).
async fn series(web: SocketAddr, expr: &str) -> (usize, serde_json::Value) {
    let path = format!("/api/v1/query?query={}", percent_encode(expr));
    let answer = api(web, &path).await.unwrap_or_default();
    let count = answer["data"]["result"].as_array().map_or(0, Vec::len);
    (count, answer)
}

/// A channel to the coordinator, whose listener is bound by now.
async fn connect(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("tollgate serve does not answer on {addr}: {e}"))
}

fn scope(caller: &str, route: &str) -> Option<v1::Scope> {
    Some(v1::Scope {
        caller_scope: caller.into(),
        route: route.into(),
        priority: Priority::Normal.into(),
    })
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}

/// Leases until the budget is spent, reports a 429 with `Retry-After`,
/// asks for a slot, releases, freezes two scopes (one with an expiry, one
/// open-ended).
async fn storm(channel: Channel) {
    let mut budget = BudgetClient::new(channel.clone());
    let lease = |want| LeaseRequest {
        scope: scope("tenant-a", "POST /orders"),
        worker_id: "w1".into(),
        want,
        retry_class: RetryClass::Transient.into(),
    };
    let mut exhausted = false;
    let mut granted = None;
    for _ in 0..50 {
        let reply = budget.lease(lease(4)).await.expect("lease").into_inner();
        if reply.granted > 0 {
            granted.get_or_insert(reply.lease_id.clone());
        }
        if reply.granted == 0 && reply.limit() == LeaseLimit::BudgetExhausted {
            exhausted = true;
            break;
        }
    }
    assert!(exhausted, "the budget never ran out");
    let receipt = now_ms();
    budget
        .report(ReportRequest {
            scope: scope("tenant-a", "POST /orders"),
            worker_id: "w1".into(),
            first_attempts: 20,
            successes: 5,
            rejections: 1,
            counts_age_ms: 0,
            evidence: vec![Evidence {
                http_status: 429,
                has_retry_after: true,
                retry_after: "2".into(),
                receipt_unix_ms: receipt,
                sent_unix_ms: receipt - 5,
                certainty: ScopeCertainty::Known.into(),
                intent_id: "i-1".into(),
                ..Evidence::default()
            }],
            stated_limit: None,
        })
        .await
        .expect("report");
    budget
        .reconsider(ReconsiderRequest {
            scope: scope("tenant-a", "POST /orders"),
            worker_id: "w1".into(),
            intent_id: "i-1".into(),
            not_before_unix_ms: receipt,
            deadline_unix_ms: receipt + 60_000,
            attempt_reserve_ms: 100,
            first_attempt: false,
            arriving: false,
        })
        .await
        .expect("reconsider");
    if let Some(lease_id) = granted {
        budget
            .release(ReleaseRequest {
                scope: scope("tenant-a", "POST /orders"),
                worker_id: "w1".into(),
                lease_id,
                spent: 1,
                retry_successes: 0,
            })
            .await
            .expect("release");
    }
    let mut admin = AdminClient::new(channel);
    for (route, duration_ms) in [("GET /users/{id}", 3_600_000), ("GET /search", 0)] {
        admin
            .freeze_scope(FreezeScopeRequest {
                caller_scope: "tenant-a".into(),
                route: route.into(),
                reason: "upstream incident".into(),
                duration_ms,
            })
            .await
            .expect("freeze");
    }
}

/// Leases on more routes than the scope limit allows; at least one is
/// refused with RESOURCE_EXHAUSTED.
async fn flood(channel: Channel) {
    let mut budget = BudgetClient::new(channel);
    let mut refused = 0;
    for i in 0..30 {
        let reply = budget
            .lease(LeaseRequest {
                scope: scope(&format!("tenant-{i}"), "GET /flood"),
                worker_id: "w1".into(),
                want: 1,
                retry_class: RetryClass::Transient.into(),
            })
            .await;
        if let Err(status) = reply {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            refused += 1;
        }
    }
    assert!(refused > 0, "the scope limit was never reached");
}

/// One intent through the client gate, twice under the same id (a
/// duplicate delivery): each a 429 with `Retry-After: 0`, then a success,
/// against `coordinator` (a dead address leaves the worker on its fallback
/// budget).
async fn worker_intent(coordinator: SocketAddr, worker_id: &str) {
    let ms = Duration::from_millis;
    let mut link_config = LinkConfig::new(format!("http://{coordinator}"), worker_id);
    link_config.rpc_timeout = Duration::from_secs(2);
    let link = CoordinatorLink::new(&link_config).expect("link");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let cache = LeaseCache::start(link, LeaseCacheConfig::default(), clock.clone());
    let gate = Gate::new(cache, clock, GateConfig::default());
    let backoff = Backoff {
        base: ms(20),
        cap: ms(100),
        jitter: Jitter::None,
    };
    let policy =
        IntentPolicy::try_new(ms(5_000), 3, ms(500), ms(10), backoff, None).expect("policy");
    for _ in 0..2 {
        let intent = GateIntent::new(
            format!("{worker_id}-intent"),
            Scope::new("tenant-w", "GET /y"),
            policy,
        );
        let run = gate.run(intent, |attempt: Attempt| async move {
            let status = if attempt.number == 1 { 429 } else { 200 };
            Reply::new(Observation::http(status, Some("0")), ())
        });
        // The outcome is the gate's business (tests/gate.rs); here only the
        // metrics it leaves behind matter.
        let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    }
    gate.cache().flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_alert_rule_returns_series_from_a_real_prometheus() {
    if !prometheus_available() {
        tollgate_testkit::missing_tool(
            "the `prometheus` binary",
            "TOLLGATE_REQUIRE_PROMETHEUS",
            "apt-get install prometheus",
        );
        return;
    }
    let dir = temp_dir();

    // This process is the worker: its instruments on a registry of its own,
    // served on /metrics like the coordinator's.
    let telemetry = Telemetry::new(&TelemetryConfig {
        prometheus: true,
        ..TelemetryConfig::default()
    })
    .expect("telemetry");
    telemetry.install_meter_provider();
    let registry = telemetry.registry().expect("a registry").clone();
    let worker_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let worker_metrics = worker_listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker_server = tokio::spawn(metrics_http::serve(worker_listener, registry, async {
        let _ = stopped.await;
    }));

    let mut coordinator = start_coordinator(&dir);
    let (grpc, metrics) = (coordinator.addr, coordinator.metrics_addr());
    let (_prometheus, web) = start_prometheus(&dir, metrics, worker_metrics);
    let channel = connect(grpc).await;

    storm(channel.clone()).await;
    worker_intent(grpc, "worker-1").await;
    // A worker whose coordinator refuses every connection, for as long as
    // `_held` keeps the port.
    let (_held, refusing) = process::refusing_address();
    worker_intent(refusing, "worker-cut-off").await;
    flood(channel).await;

    // Every rule file loaded, every target scraped.
    let mut exprs: Vec<(String, String)> = dashboard_exprs()
        .into_iter()
        .map(|(title, expr)| (format!("panel {title:?}"), expr))
        .collect();
    for (name, expr) in alert_rules() {
        let query = without_threshold(&expr).expect("checked above").to_owned();
        exprs.push((format!("alert {name}"), query));
    }
    let deadline = tokio::time::Instant::now() + SERIES_DEADLINE;
    let mut pending = exprs;
    loop {
        let mut still = Vec::new();
        for (what, expr) in pending {
            let (count, answer) = series(web, &expr).await;
            if count == 0 {
                still.push((what, expr, answer));
            }
        }
        if still.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
            panic!("no series for:\n{still:#?}\nprometheus log:\n{log}");
        }
        pending = still.into_iter().map(|(w, e, _)| (w, e)).collect();
        tokio::time::sleep(POLL).await;
    }
    let rules = api(web, "/api/v1/rules").await.expect("rules");
    let loaded: usize = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["rules"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(loaded, alert_rules().len(), "{rules}");
    let (up, answer) = series(web, "up == 1").await;
    assert_eq!(up, 2, "both targets scraped: {answer}");

    let _ = stop.send(());
    worker_server.await.expect("join").expect("worker metrics");
    let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
    let _ = std::fs::remove_dir_all(&dir);
}
