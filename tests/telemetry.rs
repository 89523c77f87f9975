//! The real OTLP export, received in-process: one storm's trace joins the
//! worker's intent to the coordinator's decisions, every attribute lives
//! under `tollgate.`, and the run's bearer token appears nowhere.
//!
//! Its own test binary, with one test: the subscriber and the tracer provider
//! are process-global, and the tonic exporter lives on this test's runtime.

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::{Coordinator, loopback_policy, ms};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate::telemetry::{Telemetry, TelemetryConfig};
use tollgate_client::engine::Observation;
use tollgate_client::gate::{Attempt, GateConfig, GateIntent, Reply};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::outcome::Outcome;
use tollgate_client::scope::Scope;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

const TOKEN: &str = "tg-secret-7f3a9c1e-bearer";

/// Every span the receiver was sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("receiver lock");
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Log lines, captured for the token check.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn attrs(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Prints the trace as an indented tree (the example in docs/telemetry.md).
fn print_tree(spans: &[Span], parent: &[u8], depth: usize) {
    let mut children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent)
        .collect();
    children.sort_by_key(|s| s.start_time_unix_nano);
    for span in children {
        let mut a: Vec<_> = attrs(span)
            .into_iter()
            .filter(|(k, _)| k.starts_with("tollgate."))
            .collect();
        a.sort();
        let a: Vec<String> = a.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let dur = (span.end_time_unix_nano - span.start_time_unix_nano) / 1_000_000;
        eprintln!(
            "{}{} [{}] {dur}ms  {}",
            "  ".repeat(depth),
            span.name,
            &hex(&span.span_id)[..8],
            a.join(" ")
        );
        print_tree(spans, &span.span_id, depth + 1);
    }
}

/// Flushes `telemetry` to `receiver` until `done` holds for what arrived
/// (or a generous bound passes; the caller's asserts then say what is
/// missing), and returns both.
async fn export_until(
    mut telemetry: Telemetry,
    receiver: &Receiver,
    done: impl Fn(&[Span]) -> bool,
) -> (Telemetry, Vec<Span>) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        telemetry = tokio::task::spawn_blocking(move || {
            telemetry.force_flush();
            telemetry
        })
        .await
        .expect("flush");
        let spans = receiver.spans.lock().expect("spans").clone();
        if done(&spans) || tokio::time::Instant::now() >= give_up {
            return (telemetry, spans);
        }
        tokio::time::sleep(ms(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_trace_joins_the_intent_to_the_coordinator_and_leaks_no_token() {
    // The in-process OTLP receiver.
    let receiver = Receiver::default();
    let otlp = TcpListener::bind("127.0.0.1:0").await.expect("bind otlp");
    let otlp_addr = otlp.local_addr().expect("otlp addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(TcpListenerStream::new(otlp)),
    );

    // One process plays worker and coordinator: one provider, both layers.
    let telemetry = Telemetry::new(&TelemetryConfig {
        service_name: Some("tollgate-test".into()),
        traces_endpoint: Some(format!("http://{otlp_addr}")),
        metrics_endpoint: None,
        prometheus: false,
    })
    .expect("telemetry");
    let logs = Logs::default();
    let log_writer = logs.clone();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || log_writer.clone())
                .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
        )
        .with(telemetry.layer())
        .try_init()
        .expect("the only subscriber in this binary");

    // A coordinator that requires the token, and a worker that sends it.
    // Its clock is a manual one that this test never moves, so a slot must
    // be given however far ahead it is (nothing would ever come nearer):
    // the horizon covers the whole intent.
    let config = support::config(&format!(
        "[defaults]\nreconsider_horizon = \"10s\"\n\
         [[token]]\ntoken = \"{TOKEN}\"\ncaller_scopes = [\"tenant-a\"]\n"
    ));
    let coordinator = Coordinator::start(config).await;
    let mut link = LinkConfig::new(format!("http://{}", coordinator.addr), "worker-1");
    link.bearer_token = Some(TOKEN.into());
    link.rpc_timeout = ms(500);
    let link = CoordinatorLink::new(&link).expect("link");
    let gate = support::gate(
        link,
        coordinator.clock.clone(),
        1,
        GateConfig {
            seed: Some(2),
            ..GateConfig::default()
        },
    );

    // The storm, as one worker sees it: 429 with Retry-After: 0, a 503,
    // then success.
    let policy = loopback_policy(ms(5_000), 4, ms(200));
    let intent = GateIntent::new("order-42", Scope::new("tenant-a", "POST /orders"), policy);
    let result = gate
        .run(intent, |attempt: Attempt| async move {
            let observation = match attempt.number {
                1 => Observation::http(429, Some("0")),
                2 => Observation::http(503, None),
                _ => Observation::http(200, None),
            };
            Reply::new(observation, attempt.number)
        })
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    assert_eq!(result.attempts.len(), 3);
    gate.cache().flush().await;
    drop(gate);
    // The report carrying the hint may still be on its way (the cache's
    // background flush may have been the one to send it): export until its
    // span has arrived rather than guess how long that takes.
    let (telemetry, spans) = export_until(telemetry, &receiver, |spans| {
        spans
            .iter()
            .any(|s| s.name == "tollgate.report" && attrs(s).contains_key("tollgate.hint.form"))
    })
    .await;

    // The intent and its attempts.
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let intents = named("tollgate.intent");
    assert_eq!(intents.len(), 1, "one intent span");
    let intent = intents[0];
    let trace = &intent.trace_id;
    print_tree(
        &spans
            .iter()
            .filter(|s| &s.trace_id == trace)
            .cloned()
            .collect::<Vec<_>>(),
        &[],
        0,
    );
    let attempts = named("tollgate.attempt");
    assert_eq!(attempts.len(), 3);
    for attempt in &attempts {
        assert_eq!(&attempt.trace_id, trace);
        assert_eq!(attempt.parent_span_id, intent.span_id);
    }
    let mut numbers: Vec<(String, String)> = attempts
        .iter()
        .map(|a| {
            let a = attrs(a);
            (
                a["tollgate.attempt"].clone(),
                a["tollgate.previous_attempts"].clone(),
            )
        })
        .collect();
    numbers.sort();
    assert_eq!(
        numbers,
        vec![
            ("1".into(), "0".into()),
            ("2".into(), "1".into()),
            ("3".into(), "2".into())
        ]
    );

    // The coordinator's spans are children of the intent, across the hop.
    for name in ["tollgate.lease", "tollgate.reconsider", "tollgate.report"] {
        let under_intent = named(name)
            .into_iter()
            .filter(|s| &s.trace_id == trace && s.parent_span_id == intent.span_id)
            .count();
        assert!(
            under_intent > 0,
            "a {name} span under the intent; spans: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
    }

    // Attribute names.
    let intent_attrs = attrs(intent);
    for key in [
        "tollgate.caller_scope",
        "tollgate.route",
        "tollgate.priority",
        "tollgate.outcome",
        "tollgate.attempts",
    ] {
        assert!(intent_attrs.contains_key(key), "intent lacks {key}");
    }
    assert_eq!(intent_attrs["tollgate.outcome"], "succeeded");
    let first = attempts
        .iter()
        .map(|a| attrs(a))
        .find(|a| a["tollgate.attempt"] == "1")
        .expect("attempt 1");
    for key in [
        "tollgate.token",
        "tollgate.status",
        "tollgate.hint.form",
        "tollgate.hint.valid",
        "tollgate.decision",
    ] {
        assert!(first.contains_key(key), "attempt 1 lacks {key}: {first:?}");
    }
    let third = attempts
        .iter()
        .map(|a| attrs(a))
        .find(|a| a["tollgate.attempt"] == "3")
        .expect("attempt 3");
    assert!(third.contains_key("tollgate.wait_ms"), "{third:?}");
    let lease = attrs(named("tollgate.lease")[0]);
    for key in [
        "tollgate.caller_scope",
        "tollgate.route",
        "tollgate.priority",
        "tollgate.decision",
        "tollgate.reason",
        "tollgate.tokens.granted",
        "tollgate.tokens.remaining",
        "tollgate.policy_version",
    ] {
        assert!(lease.contains_key(key), "lease lacks {key}: {lease:?}");
    }
    let reconsider = attrs(named("tollgate.reconsider")[0]);
    for key in ["tollgate.decision", "tollgate.slot.delay_ms"] {
        assert!(reconsider.contains_key(key), "reconsider lacks {key}");
    }
    // The 429's `Retry-After: 0`: a report span shows its newest valid hint,
    // whether the 503 after it (no hint) was flushed with it or apart.
    let report = named("tollgate.report")
        .into_iter()
        .map(attrs)
        .find(|a| a.get("tollgate.hint.form").map(String::as_str) == Some("delay"))
        .expect("a report with the delay hint");
    assert_eq!(report["tollgate.hint.valid"], "true");
    for span in &spans {
        for key in attrs(span).keys() {
            let allowed = key.starts_with("tollgate.")
                || key.starts_with("code.")
                || key.starts_with("thread.")
                || key == "target"
                || key == "level"
                || key == "busy_ns"
                || key == "idle_ns";
            assert!(allowed, "{key} on {} is outside tollgate.", span.name);
        }
    }

    // The token is in no span, attribute, event or log line.
    let exported = format!("{spans:?}");
    assert!(!exported.contains(TOKEN), "token in an exported span");
    assert!(!exported.contains("authorization"));
    let logs = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("utf-8 logs");
    assert!(logs.contains("tollgate"), "logs were captured: {logs}");
    assert!(!logs.contains(TOKEN), "token in a log line");

    coordinator.stop().await;
    drop(telemetry);
}
