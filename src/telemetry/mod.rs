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
//! - [`metrics_http`]: the Prometheus `/metrics` HTTP endpoint (hyper).
//!
//! The span and attribute table is in `docs/telemetry.md`.

pub mod freezes;
pub mod metrics;
pub mod metrics_http;
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
use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

pub use self::propagation::{TraceContextLayer, record_scope};
pub use self::rpc::RpcMetricsLayer;

/// The service name used when `OTEL_SERVICE_NAME` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "tollgate-coordinator";

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
    /// all off under `OTEL_SDK_DISABLED=true`.
    pub fn from_env(prometheus: bool) -> Self {
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
            service_name: None,
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

fn resource(service_name: Option<&str>) -> Resource {
    let builder = Resource::builder();
    match service_name {
        Some(name) => builder.with_service_name(name.to_owned()).build(),
        None if std::env::var("OTEL_SERVICE_NAME").is_ok() => builder.build(),
        None => builder.with_service_name(DEFAULT_SERVICE_NAME).build(),
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
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        );
    tracing_subscriber::registry()
        .with(logs)
        .with(telemetry.layer())
        .try_init()?;
    telemetry.install_meter_provider();
    // The endpoint itself is not logged: it may carry credentials.
    if config.traces_endpoint.is_some() {
        tracing::info!("exporting spans over OTLP");
    }
    Ok(telemetry)
}
