//! Telemetry for workers: W3C trace context on every coordinator RPC, the
//! caller-scope attribute (hashed on request), client metrics, and — with the
//! `otel` cargo feature — `init` (not a link: it exists only with the
//! feature), the one call a worker makes to export its spans and metrics
//! over OTLP.
//!
//! # Why behind a feature
//! Without `otel` every function here is a no-op and the client depends on
//! `tracing` only: spans still exist for logs, nothing is exported and no
//! `traceparent` is sent. With `otel`, [`CoordinatorLink`] injects the
//! current span's context into each request's metadata, so the coordinator's
//! span for that RPC is a child of the worker's `tollgate.intent` span.
//!
//! # Spans the gate opens
//! - `tollgate.intent`: one per [`Gate::run`](crate::gate::Gate::run).
//! - `tollgate.attempt`: one per attempt, a child of the intent, carrying the
//!   attempt number and how many came before (gRFC A45's
//!   `previous-rpc-attempts`), the wait that preceded it and what came back.
//!
//! Coordinator RPCs made while an intent runs (the first `Lease` of a scope,
//! `Reconsider`) carry the intent's context; a batched `Report` carries the
//! context of the newest intent whose evidence it holds. The full table is in
//! `docs/telemetry.md`.
//!
//! # Worker set-up (feature `otel`)
//! ```ignore
//! // Inside the worker's tokio runtime; keep the guard for the process's life.
//! let _telemetry = tollgate_client::telemetry::init("checkout-worker")?;
//! ```
//! `init` reads the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, …), installs the global
//! subscriber (stderr logs + the OpenTelemetry layer) and the global meter
//! provider, and exports nothing when no endpoint is set. Export runs on the
//! SDK's batch threads: it never blocks an attempt, and a dead collector costs
//! a log line.
//!
//! [`CoordinatorLink`]: crate::link::CoordinatorLink

pub use tollgate_vocab::telemetry::{
    HASH_CALLER_SCOPE_ENV, HASH_SALT_ENV, caller_scope_attr, set_hash_caller_scope,
};

/// The trace context an RPC made outside any intent (a batched report, a
/// background refill) should carry: captured where the work originated.
/// Zero-sized without the `otel` feature.
#[derive(Debug, Clone, Default)]
pub struct TraceOrigin {
    #[cfg(feature = "otel")]
    cx: Option<opentelemetry::Context>,
}

impl TraceOrigin {
    /// The current span's context.
    pub fn current() -> Self {
        #[cfg(feature = "otel")]
        {
            let cx = otel::current_context();
            use opentelemetry::trace::TraceContextExt as _;
            TraceOrigin {
                cx: cx.span().span_context().is_valid().then_some(cx),
            }
        }
        #[cfg(not(feature = "otel"))]
        TraceOrigin {}
    }

    /// Whether a context was captured.
    pub fn is_set(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.cx.is_some()
        }
        #[cfg(not(feature = "otel"))]
        false
    }

    /// Runs `future` with this context current, so RPCs it makes carry it.
    pub async fn scope<F: std::future::Future>(&self, future: F) -> F::Output {
        #[cfg(feature = "otel")]
        if let Some(cx) = &self.cx {
            use opentelemetry::context::FutureExt as _;
            return future.with_context(cx.clone()).await;
        }
        future.await
    }
}

/// Writes the current trace context (`traceparent`, `tracestate`) into
/// gRPC request metadata. A no-op without `otel` or outside any sampled span.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    #[cfg(feature = "otel")]
    otel::inject(metadata);
    #[cfg(not(feature = "otel"))]
    let _ = metadata;
}

/// One ended intent, in plain values (not the gate's types, so telemetry
/// sits below the gate and the link with no cycle).
#[derive(Debug, Clone, Copy)]
pub struct IntentEnd<'a> {
    /// The route template: the scope the rollout metrics are per.
    pub route: &'a str,
    /// The terminal outcome's name.
    pub outcome: &'a str,
    /// From the intent's arrival at the gate to its terminal disposition.
    pub age: std::time::Duration,
    /// Attempts started.
    pub attempts: usize,
}

/// Counts an ended intent: retries (attempts after the first, bucketed
/// 0–5), each wait before a retry, and its age at terminal disposition per
/// route and outcome (the rollout metric whose p95 says what retrying costs
/// callers).
pub fn record_intent(end: IntentEnd<'_>, waits: impl IntoIterator<Item = std::time::Duration>) {
    #[cfg(feature = "otel")]
    otel::record_intent(end, waits);
    #[cfg(not(feature = "otel"))]
    let _ = (end, waits);
}

/// Counts one attempt's answer per route by response class (`success`,
/// `throttled`, …; `none` when no answer came): the fraction of attempts
/// receiving 429 is `throttled` over the total.
pub fn record_attempt(route: &str, class: &str) {
    #[cfg(feature = "otel")]
    otel::record_attempt(route, class);
    #[cfg(not(feature = "otel"))]
    let _ = (route, class);
}

/// Counts a hold or refusal a shadow policy let through (`decision`:
/// `would_refuse`, `would_delay`), by the gate or the coordinator.
pub fn record_shadow(route: &str, decision: &str) {
    #[cfg(feature = "otel")]
    otel::record_shadow(route, decision);
    #[cfg(not(feature = "otel"))]
    let _ = (route, decision);
}

/// Counts an intent that succeeded again under an id that had already
/// succeeded lately: a duplicate delivery of the same operation.
pub fn record_duplicate(route: &str) {
    #[cfg(feature = "otel")]
    otel::record_duplicate(route);
    #[cfg(not(feature = "otel"))]
    let _ = route;
}

/// Counts an intent entering the gate on a route, and one whose caller's
/// context carries no trace to correlate its attempts and the
/// coordinator's decisions by (call it before the intent's own span).
pub fn record_started(route: &str) {
    #[cfg(feature = "otel")]
    otel::record_started(route, TraceOrigin::current().is_set());
    #[cfg(not(feature = "otel"))]
    let _ = route;
}

/// Counts an intent leaving the gate on a route, however it ended.
pub fn record_ended(route: &str) {
    #[cfg(feature = "otel")]
    otel::record_ended(route);
    #[cfg(not(feature = "otel"))]
    let _ = route;
}

/// Records the link's state: 1 while degraded (local fallback budget), 0
/// while connected.
pub fn record_fallback(degraded: bool) {
    #[cfg(feature = "otel")]
    otel::record_fallback(degraded);
    #[cfg(not(feature = "otel"))]
    let _ = degraded;
}

#[cfg(feature = "otel")]
pub use otel::{InitError, WorkerTelemetry, init};

#[cfg(feature = "otel")]
mod otel {
    use std::sync::OnceLock;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, UpDownCounter};
    use opentelemetry::propagation::{Injector, TextMapPropagator};
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use opentelemetry_otlp::{MetricExporter, SpanExporter};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::metrics::SdkMeterProvider;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    pub(super) fn current_context() -> opentelemetry::Context {
        let cx = tracing::Span::current().context();
        if cx.span().span_context().is_valid() {
            cx
        } else {
            // Outside any tracing span (a background task running under a
            // captured origin): the attached OpenTelemetry context.
            opentelemetry::Context::current()
        }
    }

    struct Metadata<'a>(&'a mut tonic::metadata::MetadataMap);

    impl Injector for Metadata<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(key), Ok(value)) = (
                tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
                value.parse(),
            ) {
                self.0.insert(key, value);
            }
        }
    }

    pub(super) fn inject(metadata: &mut tonic::metadata::MetadataMap) {
        let cx = current_context();
        if cx.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(&cx, &mut Metadata(metadata));
        }
    }

    struct ClientMetrics {
        retries: Histogram<u64>,
        retry_delay: Histogram<f64>,
        fallback: Gauge<u64>,
        age: Histogram<f64>,
        attempts: Counter<u64>,
        running: UpDownCounter<i64>,
        uncorrelated: Counter<u64>,
        duplicates: Counter<u64>,
        shadow: Counter<u64>,
    }

    /// Instruments are made on first use from the global meter provider, so
    /// [`init`] (or the application's own provider) must run first.
    fn metrics() -> &'static ClientMetrics {
        static METRICS: OnceLock<ClientMetrics> = OnceLock::new();
        METRICS.get_or_init(|| {
            let meter: Meter = opentelemetry::global::meter("tollgate-client");
            ClientMetrics {
                retries: meter
                    .u64_histogram("tollgate.client.retries")
                    .with_description("Retries per intent (attempts after the first)")
                    .with_unit("{retry}")
                    .with_boundaries(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
                    .build(),
                retry_delay: meter
                    .f64_histogram("tollgate.client.retry.delay")
                    .with_description("Wait before a retry, as planned by the gate")
                    .with_unit("s")
                    .with_boundaries(vec![
                        0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    ])
                    .build(),
                fallback: meter
                    .u64_gauge("tollgate.client.fallback")
                    .with_description(
                        "1 while the coordinator is unreachable and the local budget applies",
                    )
                    .build(),
                age: meter
                    .f64_histogram("tollgate.client.intent.age")
                    .with_description(
                        "From an intent's arrival at the gate to its terminal disposition",
                    )
                    .with_unit("s")
                    .with_boundaries(vec![
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    ])
                    .build(),
                attempts: meter
                    .u64_counter("tollgate.client.attempts")
                    .with_description("Attempts by the class of their answer")
                    .with_unit("{attempt}")
                    .build(),
                running: meter
                    .i64_up_down_counter("tollgate.client.intents.running")
                    .with_description("Intents inside the gate: attempting or waiting")
                    .with_unit("{intent}")
                    .build(),
                duplicates: meter
                    .u64_counter("tollgate.client.intents.duplicate")
                    .with_description(
                        "Intents that succeeded under an id that had already succeeded lately",
                    )
                    .with_unit("{intent}")
                    .build(),
                shadow: meter
                    .u64_counter("tollgate.client.shadow")
                    .with_description(
                        "Holds and refusals a shadow policy let through, by what enforcing would have done",
                    )
                    .with_unit("{decision}")
                    .build(),
                uncorrelated: meter
                    .u64_counter("tollgate.client.intents.uncorrelated")
                    .with_description(
                        "Intents started with no trace context to correlate their attempts by",
                    )
                    .with_unit("{intent}")
                    .build(),
            }
        })
    }

    pub(super) fn record_intent(
        end: super::IntentEnd<'_>,
        waits: impl IntoIterator<Item = std::time::Duration>,
    ) {
        let m = metrics();
        let retries = u64::try_from(end.attempts.saturating_sub(1)).unwrap_or(u64::MAX);
        let outcome = KeyValue::new("tollgate.outcome", end.outcome.to_owned());
        m.retries.record(retries, std::slice::from_ref(&outcome));
        for wait in waits {
            m.retry_delay.record(wait.as_secs_f64(), &[]);
        }
        m.age.record(
            end.age.as_secs_f64(),
            &[
                outcome,
                KeyValue::new("tollgate.route", end.route.to_owned()),
            ],
        );
    }

    pub(super) fn record_shadow(route: &str, decision: &str) {
        metrics().shadow.add(
            1,
            &[
                KeyValue::new("tollgate.route", route.to_owned()),
                KeyValue::new("tollgate.decision", decision.to_owned()),
            ],
        );
    }

    pub(super) fn record_attempt(route: &str, class: &str) {
        metrics().attempts.add(
            1,
            &[
                KeyValue::new("tollgate.route", route.to_owned()),
                KeyValue::new("tollgate.response.class", class.to_owned()),
            ],
        );
    }

    pub(super) fn record_duplicate(route: &str) {
        metrics()
            .duplicates
            .add(1, &[KeyValue::new("tollgate.route", route.to_owned())]);
    }

    pub(super) fn record_started(route: &str, correlated: bool) {
        let m = metrics();
        let route = [KeyValue::new("tollgate.route", route.to_owned())];
        m.running.add(1, &route);
        if !correlated {
            m.uncorrelated.add(1, &route);
        }
    }

    pub(super) fn record_ended(route: &str) {
        metrics()
            .running
            .add(-1, &[KeyValue::new("tollgate.route", route.to_owned())]);
    }

    pub(super) fn record_fallback(degraded: bool) {
        metrics().fallback.record(u64::from(degraded), &[]);
    }

    /// Why worker telemetry could not start.
    #[derive(Debug, thiserror::Error)]
    pub enum InitError {
        /// An OTLP exporter could not be built (a malformed endpoint).
        #[error("building the OTLP exporter: {0}")]
        Exporter(String),
        /// A global subscriber was already installed.
        #[error("installing the tracing subscriber: {0}")]
        Subscriber(String),
    }

    /// Keeps export running; flushes and shuts down on drop.
    #[derive(Debug)]
    pub struct WorkerTelemetry {
        tracer: Option<SdkTracerProvider>,
        meter: Option<SdkMeterProvider>,
    }

    impl WorkerTelemetry {
        /// Whether spans are exported.
        pub fn exporting(&self) -> bool {
            self.tracer.is_some()
        }
    }

    impl Drop for WorkerTelemetry {
        fn drop(&mut self) {
            // Shutdown flushes; run it off the async threads (it blocks).
            if let Some(tracer) = self.tracer.take() {
                let _ = tracer.shutdown();
            }
            if let Some(meter) = self.meter.take() {
                let _ = meter.shutdown();
            }
        }
    }

    fn endpoint_set() -> bool {
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
        !disabled
            && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    }

    /// Starts worker telemetry from the standard `OTEL_*` variables (call it
    /// inside the tokio runtime): logs to stderr filtered by `RUST_LOG`, and,
    /// when an OTLP endpoint is set, spans and metrics to it.
    /// `default_service_name` applies when `OTEL_SERVICE_NAME` is unset.
    pub fn init(default_service_name: &str) -> Result<WorkerTelemetry, InitError> {
        let (tracer, meter) = if endpoint_set() {
            let resource = resource(default_service_name);
            let spans = SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|e| InitError::Exporter(e.to_string()))?;
            let tracer = SdkTracerProvider::builder()
                .with_batch_exporter(spans)
                .with_resource(resource.clone())
                .build();
            let metrics = MetricExporter::builder()
                .with_tonic()
                .build()
                .map_err(|e| InitError::Exporter(e.to_string()))?;
            let meter = SdkMeterProvider::builder()
                .with_periodic_exporter(metrics)
                .with_resource(resource)
                .build();
            opentelemetry::global::set_meter_provider(meter.clone());
            (Some(tracer), Some(meter))
        } else {
            (None, None)
        };
        let otel = tracer.as_ref().map(|provider| {
            tracing_opentelemetry::layer().with_tracer(provider.tracer("tollgate-client"))
        });
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(otel)
            .try_init()
            .map_err(|e| InitError::Subscriber(e.to_string()))?;
        Ok(WorkerTelemetry { tracer, meter })
    }

    fn resource(default_service_name: &str) -> Resource {
        let builder = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_ok() {
            builder.build()
        } else {
            builder
                .with_service_name(default_service_name.to_owned())
                .build()
        }
    }
}
