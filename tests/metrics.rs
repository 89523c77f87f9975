//! The Prometheus `/metrics` endpoint, scraped over HTTP and parsed: the
//! coordinator's and the client's metric names, a lease moving the lease
//! counter, help text on every metric, and the standard RPC server metric
//! with the status of each call — a success, an error from the handler and
//! a method that does not exist.
//!
//! Its own test binary: the meter provider is process-global.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use support::metrics::{MetricsEndpoint, scrape};
use support::{Coordinator, loopback_policy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tollgate_client::engine::Observation;
use tollgate_client::gate::{Attempt, GateIntent, Reply};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::{self, LeaseRequest, Priority, RetryClass};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Text format 0.0.4: `name{labels} value` → summed value per
/// `name{labels}`, and per bare name.
fn parse(body: &str) -> (HashMap<String, f64>, HashMap<String, f64>) {
    let mut series = HashMap::new();
    let mut names = HashMap::new();
    for line in body.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value.parse().expect("a number");
        let name = key.split('{').next().expect("a name").to_owned();
        series.insert(key.to_owned(), value);
        *names.entry(name).or_insert(0.0) += value;
    }
    (series, names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_over_http_and_a_lease_counts() {
    // Before the coordinator starts: its instruments come from this provider.
    let endpoint = MetricsEndpoint::start().await;
    let metrics_addr = endpoint.addr;

    // The coordinator runs on a manual clock this test moves only for the
    // freeze, while the worker's gate below waits in real time: a slot must
    // be given however far ahead it is (nothing would ever come nearer), so
    // the horizon covers the whole intent, as in tests/telemetry.rs.
    let coordinator = Coordinator::start(support::config(
        "[defaults]\nreconsider_horizon = \"10s\"\n",
    ))
    .await;
    let mut client = coordinator.client().await;
    let lease = |want| LeaseRequest {
        scope: support::scope("tenant-a", "GET /x", Priority::Normal),
        worker_id: "w1".into(),
        want,
        retry_class: RetryClass::Transient as i32,
    };
    client.lease(lease(2)).await.expect("lease");
    let (_, before) = parse(&scrape(metrics_addr).await);
    let leases_before = before.get("tollgate_leases_total").copied().unwrap_or(0.0);
    assert!(leases_before >= 1.0, "{before:?}");
    client.lease(lease(3)).await.expect("lease");
    let (series, after) = parse(&scrape(metrics_addr).await);
    assert_eq!(after["tollgate_leases_total"], leases_before + 1.0);
    assert!(
        series
            .keys()
            .any(|k| k.starts_with("tollgate_leases_total{")
                && k.contains("tollgate_decision=\"granted\"")
                && k.contains("tollgate_priority=\"normal\"")),
        "{series:?}"
    );
    assert!(after["tollgate_tokens_outstanding"] >= 5.0, "{after:?}");

    rpc_calls_are_recorded_with_their_status(&coordinator, metrics_addr).await;
    a_freeze_is_shown_until_it_is_lifted(&coordinator, metrics_addr).await;

    // A worker's storm: hints, a slot, retries per intent, retry delay.
    let gate = coordinator.worker_gate("worker-1");
    let policy = loopback_policy(ms(5_000), 3, ms(100));
    let intent = GateIntent::new("i-1", Scope::new("tenant-a", "GET /y"), policy);
    let result = gate
        .run(intent, |attempt: Attempt| async move {
            let status = if attempt.number == 1 { 429 } else { 200 };
            Reply::new(Observation::http(status, Some("0")), ())
        })
        .await;
    assert!(result.succeeded(), "{result:?}");
    gate.cache().flush().await;

    let body = scrape(metrics_addr).await;
    let (_, names) = parse(&body);
    for name in [
        "tollgate_leases_total",
        "tollgate_tokens_granted_total",
        "tollgate_tokens_outstanding",
        "tollgate_budget_remaining",
        "tollgate_budget_lowest",
        "tollgate_cooldowns_active",
        "tollgate_hints_total",
        "tollgate_slots_total",
        "tollgate_slot_delay_seconds_bucket",
        "tollgate_client_retries_bucket",
        "tollgate_client_retry_delay_seconds_bucket",
    ] {
        assert!(names.contains_key(name), "{name} missing from:\n{body}");
    }
    assert!(
        body.contains(
            "tollgate_hints_total{tollgate_hint_form=\"delay\",tollgate_hint_valid=\"true\""
        ),
        "{body}"
    );
    // One retry in one intent lands in the `le="1"` bucket.
    assert!(
        body.lines()
            .any(|l| l.starts_with("tollgate_client_retries_bucket{")
                && l.contains("le=\"1\"}")
                && l.ends_with(" 1")),
        "{body}"
    );

    // The rollout metrics, per route: what share of attempts got a 429, the
    // age at terminal disposition, intents inside the gate (none now), and
    // intents with no trace context to correlate them by (this test runs
    // none).
    let route = "tollgate_route=\"GET /y\"";
    for (series, value) in [
        (
            "tollgate_client_attempts_total{tollgate_response_class=\"throttled\"",
            1.0,
        ),
        (
            "tollgate_client_attempts_total{tollgate_response_class=\"success\"",
            1.0,
        ),
        (
            "tollgate_client_intent_age_seconds_count{tollgate_outcome=\"succeeded\"",
            1.0,
        ),
        ("tollgate_client_intents_running{", 0.0),
        ("tollgate_client_intents_uncorrelated_total{", 1.0),
    ] {
        let found: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with(series) && l.contains(route))
            .collect();
        assert_eq!(found.len(), 1, "{series} on {route}:\n{body}");
        let got: f64 = found[0]
            .rsplit_once(' ')
            .expect("a value")
            .1
            .parse()
            .expect("a number");
        assert_eq!(got, value, "{}", found[0]);
    }

    assert!(
        !body.contains("tollgate_client_intents_duplicate_total"),
        "{body}"
    );

    every_metric_has_help_text(&body);
    every_family_and_exporter_label_is_as_documented(&body);

    // The same operation delivered twice: the second success is counted.
    for _ in 0..2 {
        let intent = GateIntent::new("i-2", Scope::new("tenant-a", "GET /z"), policy);
        let again = gate
            .run(intent, |_: Attempt| async move {
                Reply::new(Observation::http(200, None), ())
            })
            .await;
        assert!(again.succeeded(), "{again:?}");
    }
    let body = scrape(metrics_addr).await;
    assert!(
        body.lines().any(
            |l| l.starts_with("tollgate_client_intents_duplicate_total{")
                && l.contains("tollgate_route=\"GET /z\"")
                && l.ends_with(" 1")
        ),
        "one duplicate delivery on GET /z:\n{body}"
    );

    // Anything but GET /metrics is a 404.
    let mut stream = TcpStream::connect(metrics_addr).await.expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");

    drop(gate);
    coordinator.stop().await;
    scopes_held_are_shown_per_tenant_by_name(metrics_addr, None).await;
    // The same on the Redis store, whose counts come from Redis.
    if let Some(redis) = tollgate_testkit::RedisServer::start() {
        scopes_held_are_shown_per_tenant_by_name(metrics_addr, Some(&redis.url())).await;
    }
    endpoint.stop().await;
}

/// With two named tokens, what each holds of the scope table and its quota
/// are labelled with the `[[token]]` name, never the token; on the Redis
/// store at `redis` when given.
async fn scopes_held_are_shown_per_tenant_by_name(metrics: SocketAddr, redis: Option<&str>) {
    let config = support::config(
        "[server]\nmax_scopes = 100\n\
         [[token]]\ntoken = \"secret-of-team-a\"\ncaller_scopes = [\"a\"]\nname = \"team-a\"\n\
         [[token]]\ntoken = \"secret-of-team-b\"\ncaller_scopes = [\"b\"]\nname = \"team-b\"\n",
    );
    let coordinator = match redis {
        Some(url) => Coordinator::start_on_redis(config, url).await,
        None => Coordinator::start(config).await,
    };
    let mut client = coordinator.client().await;
    for route in ["GET /1", "GET /2"] {
        client
            .lease(support::with_token(
                support::lease(support::scope("a", route, Priority::Normal), "w", 1),
                "secret-of-team-a",
            ))
            .await
            .expect("lease");
    }
    let body = scrape(metrics).await;
    let (series, _) = parse(&body);
    let value = |name: &str, tenant: &str| {
        series
            .iter()
            .find(|(k, _)| {
                k.starts_with(&format!("{name}{{"))
                    && k.contains(&format!("tollgate_tenant=\"{tenant}\""))
            })
            .map(|(_, v)| *v)
    };
    assert_eq!(value("tollgate_scopes_held", "team-a"), Some(2.0), "{body}");
    assert_eq!(value("tollgate_scopes_held", "team-b"), Some(0.0), "{body}");
    assert_eq!(
        value("tollgate_scopes_quota", "team-b"),
        Some(50.0),
        "{body}"
    );
    assert!(!body.contains("secret-of"), "no token in {body}");
    every_metric_has_help_text(&body);
    every_family_and_exporter_label_is_as_documented(&body);
    coordinator.stop().await;
}

/// `rpc_server_duration_milliseconds` series of `method` with `code`: their
/// count of calls.
fn rpc_calls(series: &HashMap<String, f64>, service: &str, method: &str, code: &str) -> f64 {
    series
        .iter()
        .filter(|(k, _)| {
            k.starts_with("rpc_server_duration_milliseconds_count{")
                && k.contains("rpc_system=\"grpc\"")
                && k.contains(&format!("rpc_service=\"{service}\""))
                && k.contains(&format!("rpc_method=\"{method}\""))
                && k.contains(&format!("rpc_grpc_status_code=\"{code}\""))
        })
        .map(|(_, v)| v)
        .sum()
}

async fn rpc_calls_are_recorded_with_their_status(coordinator: &Coordinator, metrics: SocketAddr) {
    let (series, _) = parse(&scrape(metrics).await);
    // The leases above, answered OK.
    assert!(
        rpc_calls(&series, "tollgate.v1.Budget", "Lease", "0") >= 2.0,
        "{series:?}"
    );
    let invalid_before = rpc_calls(&series, "tollgate.v1.Budget", "Lease", "3");
    let other_before = rpc_calls(&series, "_OTHER", "_OTHER", "12");

    // The handler refuses: INVALID_ARGUMENT, in the headers (trailers-only).
    let mut client = coordinator.client().await;
    let status = client
        .lease(LeaseRequest {
            scope: support::scope("tenant-a", "GET /x", Priority::Normal),
            worker_id: String::new(),
            want: 1,
            retry_class: RetryClass::Transient as i32,
        })
        .await
        .expect_err("no worker id");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    // A path nothing serves: UNIMPLEMENTED from the router, before any
    // handler, and its peer-chosen name never becomes a label.
    let mut grpc = tonic::client::Grpc::new(coordinator.channel().await);
    grpc.ready().await.expect("ready");
    let status = grpc
        .unary::<LeaseRequest, LeaseRequest, _>(
            tonic::Request::new(LeaseRequest::default()),
            http::uri::PathAndQuery::from_static("/tollgate.v1.Budget/NoSuchMethod"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), tonic::Code::Unimplemented);

    let (series, _) = parse(&scrape(metrics).await);
    assert_eq!(
        rpc_calls(&series, "tollgate.v1.Budget", "Lease", "3"),
        invalid_before + 1.0,
        "{series:?}"
    );
    assert_eq!(
        rpc_calls(&series, "_OTHER", "_OTHER", "12"),
        other_before + 1.0,
        "{series:?}"
    );
    assert!(
        !series.keys().any(|k| k.contains("NoSuchMethod")),
        "{series:?}"
    );
}

/// Every metric family has a `# HELP` line with words in it.
fn every_metric_has_help_text(body: &str) {
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("a name");
            let help = body
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
                .unwrap_or("");
            assert!(!help.trim().is_empty(), "{name} has no help text");
        }
    }
}

/// docs/telemetry.md names every metric family served under its
/// Prometheus name, and every `otel_scope_*` label it says the exporter adds
/// is served.
fn every_family_and_exporter_label_is_as_documented(body: &str) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/telemetry.md"))
        .expect("docs/telemetry.md");
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("a name");
            assert!(
                doc.contains(&format!("`{name}`")),
                "docs/telemetry.md does not name {name}"
            );
        }
    }
    let labels: Vec<&str> = doc
        .split('`')
        .filter(|w| w.starts_with("otel_scope_"))
        .collect();
    assert!(
        !labels.is_empty(),
        "docs/telemetry.md names the exporter's labels"
    );
    for label in labels {
        assert!(
            body.contains(&format!("{label}=")),
            "docs/telemetry.md names {label}, which is not served"
        );
    }
}

/// The freeze gauges name a frozen scope, with its expiry when it has one,
/// and drop it when the freeze is lifted.
async fn a_freeze_is_shown_until_it_is_lifted(coordinator: &Coordinator, metrics: SocketAddr) {
    let frozen = |body: &str, name: &str| {
        body.lines().any(|l| {
            l.starts_with(&format!("{name}{{"))
                && l.contains("tollgate_caller_scope=\"tenant-f\"")
                && l.contains("tollgate_route=\"GET /frozen\"")
        })
    };
    let mut admin = coordinator.admin().await;
    admin
        .freeze_scope(v1::FreezeScopeRequest {
            caller_scope: "tenant-f".into(),
            route: "GET /frozen".into(),
            reason: "incident".into(),
            duration_ms: 600_000,
        })
        .await
        .expect("freeze");
    let body = scrape(metrics).await;
    assert!(frozen(&body, "tollgate_freeze_since_seconds"), "{body}");
    assert!(frozen(&body, "tollgate_freeze_expires_seconds"), "{body}");
    admin
        .unfreeze_scope(v1::UnfreezeScopeRequest {
            caller_scope: "tenant-f".into(),
            route: "GET /frozen".into(),
            reason: "over".into(),
        })
        .await
        .expect("unfreeze");
    let body = scrape(metrics).await;
    assert!(!frozen(&body, "tollgate_freeze_since_seconds"), "{body}");
    assert!(!frozen(&body, "tollgate_freeze_expires_seconds"), "{body}");
}
