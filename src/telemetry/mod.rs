//! Traces and metrics of the coordinator, exported over OTLP/gRPC and (on
//! request) scraped from a Prometheus `/metrics` endpoint.
//!
//! # Off unless asked for
//! With no `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`) nothing is
//! exported and no exporter exists; with no `--metrics-listen` there is no
//! Prometheus endpoint. The rest of the standard variables —
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`
//! (+ `_ARG`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SDK_DISABLED` — are read by the
//! OpenTelemetry SDK itself.
//!
//! # Never on the request path
//! Spans go to the SDK's batch processor (its own thread, a bounded queue that
//! drops when full) and metrics to a periodic reader: a slow or dead
//! collector never blocks or fails an RPC, it costs the SDK's log line.
//!
//! # Layout
//! - this module: [`TelemetryConfig`], [`Telemetry`] (the providers and the
//!   flush-on-drop guard) and [`init`], which `tollgate serve` calls.
//! - [`propagation`]: the tower layer that makes each RPC's span a child of
//!   the caller's W3C trace context, and the scope attributes.
//! - [`rpc`]: the tower layer that records the standard
//!   `rpc.server.duration` for every call, whatever its status.
//! - [`metrics`]: the coordinator's own instruments (leases, tokens,
//!   budgets, hints, slots), [`freezes`]: the freeze gauges, and
//!   [`scopes`]: the scope table's occupancy, evictions and refusals.
//! - the Prometheus `/metrics` HTTP endpoint that renders this registry is
//!   a listener, [`crate::server::metrics_http`].
//! - `book` (private): the bounded books the gauges read, shared by
//!   [`metrics`] and [`pacing`].
//!
//! The span and attribute table is in `docs/telemetry.md`.

mod book;
pub mod freezes;
pub mod metrics;
pub mod pacing;
pub mod propagation;
pub mod rpc;
pub mod scopes;

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::Metadata;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing_subscriber::filter::{FilterExt as _, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::layer::{self, Filter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

pub use self::propagation::{TraceContextLayer, record_scope};
pub use self::rpc::RpcMetricsLayer;

/// The service name used when `OTEL_SERVICE_NAME` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "tollgate-coordinator";

/// The service name `tollgate proxy` uses when `OTEL_SERVICE_NAME` is not
/// set: its spans and metrics are a worker's, not the coordinator's, and a
/// trace joins the two by name.
pub const PROXY_SERVICE_NAME: &str = "tollgate-proxy";

/// What to export, and where.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// Overrides `OTEL_SERVICE_NAME` and the default.
    pub service_name: Option<String>,
    /// OTLP/gRPC endpoint for spans; `None` exports no spans.
    pub traces_endpoint: Option<String>,
    /// OTLP/gRPC endpoint for metrics; `None` exports no metrics over OTLP.
    pub metrics_endpoint: Option<String>,
    /// Whether to keep a Prometheus registry for a `/metrics` endpoint.
    pub prometheus: bool,
}

impl TelemetryConfig {
    /// The standard variables: `OTEL_EXPORTER_OTLP_{TRACES_,METRICS_,}ENDPOINT`,
    /// all off under `OTEL_SDK_DISABLED=true`, and `OTEL_SERVICE_NAME`, else
    /// `default_service_name`.
    pub fn from_env(prometheus: bool, default_service_name: &str) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim() == "true");
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let pick = |name: &str| {
            if disabled {
                None
            } else {
                var(name).or_else(|| base.clone())
            }
        };
        TelemetryConfig {
            // Set, the resource reads `OTEL_SERVICE_NAME` itself.
            service_name: (!service_name_in_env()).then(|| default_service_name.to_owned()),
            traces_endpoint: pick("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            metrics_endpoint: pick("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
            prometheus,
        }
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An OTLP exporter could not be built (a malformed endpoint).
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The Prometheus exporter could not be registered.
    #[error("prometheus exporter: {0}")]
    Prometheus(String),
    /// A global subscriber was already installed.
    #[error("tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// The tracer and meter providers; flushes and shuts them down on drop.
///
/// Build it inside a tokio runtime (the tonic exporter needs one), and drop
/// it while that runtime still runs so the last batch can be sent.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
    registry: Option<::prometheus::Registry>,
}

impl Telemetry {
    /// Builds the providers `config` asks for; installs nothing globally.
    pub fn new(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let resource = resource(config.service_name.as_deref());
        let tracer = match &config.traces_endpoint {
            Some(endpoint) => {
                let exporter = SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .build()?;
                Some(
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(resource.clone())
                        .build(),
                )
            }
            None => None,
        };
        let registry = config.prometheus.then(::prometheus::Registry::new);
        let meter = if config.metrics_endpoint.is_some() || registry.is_some() {
            let mut builder = SdkMeterProvider::builder().with_resource(resource);
            if let Some(endpoint) = &config.metrics_endpoint {
                let exporter = MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .build()?;
                builder = builder.with_periodic_exporter(exporter);
            }
            if let Some(registry) = &registry {
                let reader = opentelemetry_prometheus::exporter()
                    .with_registry(registry.clone())
                    .build()
                    .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
                builder = builder.with_reader(reader);
            }
            Some(builder.build())
        } else {
            None
        };
        Ok(Telemetry {
            tracer,
            meter,
            registry,
        })
    }

    /// The OpenTelemetry layer for a subscriber (`None` when spans are not
    /// exported), limited to Tollgate's own spans at INFO and above whatever
    /// `RUST_LOG` says for the logs.
    pub fn layer<S>(&self) -> Option<impl Layer<S> + Send + Sync + 'static>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        self.tracer().map(|tracer| {
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(span_filter())
        })
    }

    fn tracer(&self) -> Option<SdkTracer> {
        self.tracer
            .as_ref()
            .map(|provider| provider.tracer("tollgate"))
    }

    /// Makes this meter provider the global one, which the coordinator's and
    /// the client's instruments are made from. Call before the server starts.
    pub fn install_meter_provider(&self) {
        if let Some(meter) = &self.meter {
            opentelemetry::global::set_meter_provider(meter.clone());
        }
    }

    /// The Prometheus registry behind `/metrics`, if one was asked for.
    pub fn registry(&self) -> Option<&::prometheus::Registry> {
        self.registry.as_ref()
    }

    /// Whether spans are exported.
    pub fn exporting_traces(&self) -> bool {
        self.tracer.is_some()
    }

    /// Sends everything buffered now. Blocks: call it from
    /// `spawn_blocking` or a plain thread, not from an async task on a
    /// current-thread runtime.
    pub fn force_flush(&self) {
        if let Some(tracer) = &self.tracer
            && let Err(err) = tracer.force_flush()
        {
            tracing::warn!(cause = %err, "flushing spans failed");
        }
        if let Some(meter) = &self.meter
            && let Err(err) = meter.force_flush()
        {
            tracing::warn!(cause = %err, "flushing metrics failed");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(tracer) = self.tracer.take() {
            let _ = tracer.shutdown();
        }
        if let Some(meter) = self.meter.take() {
            let _ = meter.shutdown();
        }
    }
}

/// Which spans are exported: Tollgate's (coordinator and client), INFO and up.
pub fn span_filter() -> Targets {
    Targets::new()
        .with_target("tollgate", LevelFilter::INFO)
        .with_target("tollgate_client", LevelFilter::INFO)
}

/// Whether `OTEL_SERVICE_NAME` names a service: set and not blank. Blank
/// is taken as unset, here and by [`TelemetryConfig::from_env`], so the
/// default name applies rather than an empty one.
fn service_name_in_env() -> bool {
    std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
}

fn resource(service_name: Option<&str>) -> Resource {
    let builder = Resource::builder();
    match service_name {
        Some(name) => builder.with_service_name(name.to_owned()).build(),
        None if service_name_in_env() => builder.build(),
        None => builder.with_service_name(DEFAULT_SERVICE_NAME).build(),
    }
}

/// The span of a Budget `Lease` call.
pub const LEASE_SPAN: &str = "tollgate.lease";
/// The span of a Budget `Release` call.
pub const RELEASE_SPAN: &str = "tollgate.release";
/// The span of a Budget `Report` call.
pub const REPORT_SPAN: &str = "tollgate.report";
/// The span of a Budget `Reconsider` call.
pub const RECONSIDER_SPAN: &str = "tollgate.reconsider";
/// The span of a Budget `Watch` stream.
pub const WATCH_SPAN: &str = "tollgate.watch";

/// The spans the Budget service opens, one per call: they exist for the
/// trace exporter. The fmt layer formats every field of a span it sees into
/// a string as the field is recorded, whether a line is ever logged or not,
/// which cost a Lease about a sixth of the server's instructions; and the
/// log lines written inside these spans name their scope in their own
/// fields.
pub const RPC_SPANS: [&str; 5] = [
    LEASE_SPAN,
    RELEASE_SPAN,
    REPORT_SPAN,
    RECONSIDER_SPAN,
    WATCH_SPAN,
];

/// The log layer's filter: `env` (from `RUST_LOG`) for events and every
/// other span, and never the [`RPC_SPANS`]. The exporter's layer has its
/// own filter ([`span_filter`]), so the spans still reach it; with no
/// exporter, no layer wants them and they are never built.
fn log_filter<S>(env: EnvFilter) -> impl Filter<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    env.and(NotRpcSpans)
}

/// Disables the [`RPC_SPANS`] at their callsite, so the decision is made
/// once per callsite, not per call.
struct NotRpcSpans;

impl NotRpcSpans {
    fn wanted(meta: &Metadata<'_>) -> bool {
        !(meta.is_span() && RPC_SPANS.contains(&meta.name()))
    }
}

impl<S> Filter<S> for NotRpcSpans {
    fn enabled(&self, meta: &Metadata<'_>, _: &layer::Context<'_, S>) -> bool {
        Self::wanted(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if Self::wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    // Without a hint the combined filter has none either, and the global
    // level falls to TRACE: every dependency's trace span is then built
    // and offered to the registry (h2 opens dozens per call).
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

/// What `tollgate serve` runs at start: logs to stderr (filtered by
/// `RUST_LOG`, default `info`), spans and metrics as [`TelemetryConfig`]
/// says, the global subscriber and meter provider installed. Call it inside
/// the tokio runtime; keep the returned guard until the server has stopped.
pub fn init(config: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let telemetry = Telemetry::new(config)?;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(log_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        ));
    let logged = tracing_subscriber::registry().with(logs);
    // Not `.with(telemetry.layer())`: an absent `Option` layer counts as
    // one that wants every span, so the RPC spans the log filter leaves out
    // would still be built.
    match telemetry.layer() {
        Some(export) => logged.with(export).try_init()?,
        None => logged.try_init()?,
    }
    telemetry.install_meter_provider();
    // The endpoint itself is not logged: it may carry credentials.
    if config.traces_endpoint.is_some() {
        tracing::info!("exporting spans over OTLP");
    }
    Ok(telemetry)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::Context;

    use super::*;

    /// What a layer was shown: the names of the spans it saw open, and
    /// the targets of the events.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Seen {
        fn names(&self) -> Vec<String> {
            self.0.lock().expect("seen").clone()
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::Id,
            _: Context<'_, S>,
        ) {
            let name = attrs.metadata().name();
            self.0.lock().expect("seen").push(format!("span {name}"));
        }

        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let line = event.metadata().line().unwrap_or_default();
            self.0.lock().expect("seen").push(format!("event {line}"));
        }
    }

    fn logs() -> EnvFilter {
        EnvFilter::new("info")
    }

    // One test, two subscribers in turn: a callsite's interest is
    // process-wide, so a second test's exporter layer alive at the same
    // time would make the first one's RPC span wanted.
    #[test]
    fn logs_skip_the_rpc_spans_that_the_exporter_still_sees() {
        let logged = Seen::default();
        let subscriber =
            tracing_subscriber::registry().with(logged.clone().with_filter(log_filter(logs())));
        let lines = tracing::subscriber::with_default(subscriber, || {
            let rpc = tracing::info_span!(LEASE_SPAN, tollgate.route = "GET /x");
            // No layer wants it: never built, its fields never formatted.
            assert!(rpc.is_disabled());
            let inside_rpc = line!() + 1;
            rpc.in_scope(|| tracing::info!("inside the rpc"));
            let admin = tracing::info_span!("set_policy", who = "ops");
            assert!(!admin.is_disabled());
            let inside_admin = line!() + 1;
            admin.in_scope(|| tracing::info!("inside admin"));
            [inside_rpc, inside_admin]
        });
        assert_eq!(
            logged.names(),
            [
                format!("event {}", lines[0]),
                "span set_policy".to_owned(),
                format!("event {}", lines[1]),
            ]
        );

        let (logged, exported) = (Seen::default(), Seen::default());
        let subscriber = tracing_subscriber::registry()
            .with(logged.clone().with_filter(log_filter(logs())))
            .with(exported.clone().with_filter(span_filter()));
        tracing::subscriber::with_default(subscriber, || {
            let rpc = tracing::info_span!(target: "tollgate::service", REPORT_SPAN);
            assert!(!rpc.is_disabled());
        });
        assert_eq!(exported.names(), [format!("span {REPORT_SPAN}")]);
        assert!(logged.names().is_empty());
    }
}
