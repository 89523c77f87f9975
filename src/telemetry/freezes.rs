//! Freeze gauges: when each frozen scope was frozen, and when its freeze
//! should lift, so an alert can tell a freeze that outlived its expiry (the
//! expiry did not lift it) from one nobody set an expiry on and forgot.
//!
//! # Why a process-wide book
//! The freezes are kept by the runtime control (`crate::control`), which
//! reports every change here with [`record_freezes`]; the gauges read the
//! book at collection. The meter provider these gauges feed is process-wide
//! too, and a process runs one coordinator, so one book per process is the
//! book of that coordinator — without threading a metrics handle through the
//! control's constructor.
//!
//! # Bounded cardinality
//! Freezes are labelled by scope because an alert has to name the scope an
//! operator froze. They are operator actions, a handful at a time; beyond
//! [`MAX_FREEZE_SERIES`] the rest are not shown.

use std::sync::Mutex;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use tollgate_vocab::telemetry::caller_scope_attr;

use crate::scope::RouteKey;

/// Frozen scopes shown by the freeze gauges, at most.
pub const MAX_FREEZE_SERIES: usize = 100;

/// One frozen scope, as the gauges show it.
struct Frozen {
    labels: [KeyValue; 2],
    since_ms: i64,
    expires_at_ms: Option<i64>,
}

static BOOK: Mutex<Vec<Frozen>> = Mutex::new(Vec::new());

fn book() -> std::sync::MutexGuard<'static, Vec<Frozen>> {
    // A plain list of numbers: still usable after a panic elsewhere.
    BOOK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the book with the freezes in force now, each as its scope,
/// when it began and when it lifts (Unix milliseconds). Called by the
/// runtime control after every change to its freezes (freeze, unfreeze,
/// expiry, restore at start); plain values, so telemetry needs nothing from
/// the layer above that keeps the freezes.
pub fn record_freezes<'a>(freezes: impl IntoIterator<Item = (&'a RouteKey, i64, Option<i64>)>) {
    let frozen = freezes
        .into_iter()
        .take(MAX_FREEZE_SERIES)
        .map(|(route, since_ms, expires_at_ms)| Frozen {
            labels: [
                KeyValue::new(
                    "tollgate.caller_scope",
                    caller_scope_attr(&route.caller_scope),
                ),
                KeyValue::new("tollgate.route", route.route.clone()),
            ],
            since_ms,
            expires_at_ms,
        })
        .collect();
    *book() = frozen;
}

fn unix_seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// Registers `tollgate.freeze.since` and `tollgate.freeze.expires` on `meter`.
pub(crate) fn register(meter: &Meter) {
    meter
        .f64_observable_gauge("tollgate.freeze.since")
        .with_description("When each frozen scope was frozen (Unix time)")
        .with_unit("s")
        .with_callback(|observer| {
            for frozen in book().iter() {
                observer.observe(unix_seconds(frozen.since_ms), &frozen.labels);
            }
        })
        .build();
    meter
        .f64_observable_gauge("tollgate.freeze.expires")
        .with_description(
            "When each frozen scope's freeze should lift (Unix time); absent for open-ended freezes",
        )
        .with_unit("s")
        .with_callback(|observer| {
            for frozen in book().iter() {
                if let Some(at) = frozen.expires_at_ms {
                    observer.observe(unix_seconds(at), &frozen.labels);
                }
            }
        })
        .build();
}
