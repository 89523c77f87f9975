//! Learned pacing in metrics, with bounded cardinality: how many routes are
//! in each pacing state, and the wake rate, capacity estimate and spare
//! capacity of the [`BUSIEST`] routes with the most intents waiting — the
//! ones an SRE watching a storm needs, whatever the number of routes.

use std::sync::{Arc, Mutex};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use tollgate_vocab::clock::{Clock, to_unix_ms};
use tollgate_vocab::telemetry::caller_scope_attr;

use crate::pacing::{Mode, PacingView};
use crate::scope::RouteKey;

use super::book::{Book, lock};

/// Routes whose rates are exported, most intents waiting first.
pub const BUSIEST: usize = 5;
/// Routes tracked at once; beyond it new ones are not (the gauges
/// undercount rather than grow memory).
const MAX_ROUTES: usize = 100_000;
/// A route not seen by a Report or Reconsider for this long is dropped.
const SEEN_TTL_MS: i64 = 60_000;

/// The latest pacing seen per route.
#[derive(Default)]
pub struct PacingBook {
    routes: Mutex<Book<RouteKey, (PacingView, i64)>>,
}

const MODES: [Mode; 7] = [
    Mode::Steady,
    Mode::Probing,
    Mode::BackingOff,
    Mode::PenaltyExtending,
    Mode::Pinned,
    Mode::KnownLimit,
    Mode::Saturated,
];

impl PacingBook {
    /// Records what a Report or Reconsider left of `route`'s pacing.
    pub fn record(&self, route: &RouteKey, view: &PacingView, now_ms: i64) {
        lock(&self.routes).set(route, || route.clone(), (*view, now_ms), MAX_ROUTES);
    }

    /// Registers the gauges on `meter`, read from `book` at collection.
    pub fn register(book: &Arc<PacingBook>, meter: &Meter, clock: &Arc<dyn Clock>) {
        {
            let (book, clock) = (Arc::clone(book), Arc::clone(clock));
            meter
                .u64_observable_gauge("tollgate.pacing.routes")
                .with_description("Routes by learned pacing state (seen in the last minute)")
                .with_callback(move |observer| {
                    let now = to_unix_ms(clock.now());
                    let mut routes = lock(&book.routes);
                    routes.retain(|_, (_, at)| now - *at < SEEN_TTL_MS);
                    let mut counts = [0u64; MODES.len()];
                    for (_, (view, _)) in routes.iter() {
                        counts[view.mode as usize] += 1;
                    }
                    for mode in MODES {
                        observer.observe(
                            counts[mode as usize],
                            &[KeyValue::new("tollgate.pacing.state", mode.as_str())],
                        );
                    }
                })
                .build();
        }
        type Read = fn(&PacingView) -> i64;
        let rates: [(&str, &str, Read); 3] = [
            (
                "tollgate.pacing.wake_rate",
                "Slots per second in force on the busiest routes",
                |v| v.wake_rate_m,
            ),
            (
                "tollgate.pacing.capacity",
                "Attempts per second the upstream is believed to serve, busiest routes",
                |v| v.capacity_m,
            ),
            (
                "tollgate.pacing.spare",
                "Capacity left by first attempts, busiest routes",
                |v| v.spare_m,
            ),
        ];
        for (name, description, read) in rates {
            let book = Arc::clone(book);
            meter
                .f64_observable_gauge(name)
                .with_description(description)
                .with_unit("{attempt}/s")
                .with_callback(move |observer| {
                    for (route, view) in book.busiest() {
                        observer.observe(
                            PacingView::per_sec(read(&view)),
                            &[
                                KeyValue::new(
                                    "tollgate.caller_scope",
                                    caller_scope_attr(&route.caller_scope),
                                ),
                                KeyValue::new("tollgate.route", route.route.clone()),
                                KeyValue::new("tollgate.pacing.state", view.mode.as_str()),
                            ],
                        );
                    }
                })
                .build();
        }
    }

    /// The [`BUSIEST`] routes, most intents waiting first (then by key, so
    /// the set is stable between collections).
    fn busiest(&self) -> Vec<(RouteKey, PacingView)> {
        let routes = lock(&self.routes);
        let mut all: Vec<_> = routes.iter().collect();
        all.sort_by(|(a, (va, _)), (b, (vb, _))| vb.asking.cmp(&va.asking).then(a.cmp(b)));
        all.into_iter()
            .take(BUSIEST)
            .map(|(k, (v, _))| (k.clone(), *v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_routes_are_the_ones_with_the_most_waiting() {
        let book = PacingBook::default();
        for i in 0..20usize {
            let route = RouteKey {
                caller_scope: "c".into(),
                route: format!("r{i:02}"),
            };
            let view = PacingView {
                asking: i,
                ..PacingView::default()
            };
            book.record(&route, &view, 0);
        }
        let busiest: Vec<String> = book.busiest().into_iter().map(|(k, _)| k.route).collect();
        assert_eq!(busiest, ["r19", "r18", "r17", "r16", "r15"]);
    }
}
