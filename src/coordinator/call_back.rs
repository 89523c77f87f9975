//! Calling back intents told to ask again, when a saturated route's slots
//! go unused ([`crate::pacing::PacingState::call_back`]).
//!
//! Every slot given at an idle cursor while the window runs under its rate
//! finds the route calling back, so one gap in the asks would publish a
//! call-back per slot, and the store would look for the intents it reaches
//! each time. One per half a horizon (the time the intents called back
//! take to ask) is enough: until then, the store is not asked to look.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::scope::RouteKey;

/// Routes whose last call-back is remembered; past it the oldest are
/// forgotten (which can only publish a call-back early).
const MAX_ROUTES: usize = 10_000;

/// When each route's last call-back was published.
#[derive(Debug, Default)]
pub(super) struct CallBacks {
    sent: Mutex<HashMap<RouteKey, i64>>,
}

impl CallBacks {
    /// Whether a call-back on `route` may be published at `now_ms`: none
    /// was within `quiet_ms` before it.
    pub(super) fn due(&self, route: &RouteKey, now_ms: i64, quiet_ms: i64) -> bool {
        self.sent()
            .get(route)
            .is_none_or(|&at| now_ms >= at.saturating_add(quiet_ms))
    }

    /// Remembers that a call-back on `route` was published at `now_ms`.
    pub(super) fn sent_at(&self, route: &RouteKey, now_ms: i64, quiet_ms: i64) {
        let mut sent = self.sent();
        if sent.len() >= MAX_ROUTES && !sent.contains_key(route) {
            let cutoff = now_ms.saturating_sub(quiet_ms);
            sent.retain(|_, &mut at| at >= cutoff);
            if sent.len() >= MAX_ROUTES {
                sent.clear();
            }
        }
        sent.insert(route.clone(), now_ms);
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, HashMap<RouteKey, i64>> {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str) -> RouteKey {
        RouteKey {
            caller_scope: "c".into(),
            route: name.into(),
        }
    }

    #[test]
    fn a_route_calls_back_once_per_quiet_time() {
        let calls = CallBacks::default();
        assert!(calls.due(&route("a"), 1_000, 125));
        calls.sent_at(&route("a"), 1_000, 125);
        assert!(!calls.due(&route("a"), 1_124, 125));
        assert!(calls.due(&route("a"), 1_125, 125));
        assert!(calls.due(&route("b"), 1_050, 125), "routes are apart");
    }
}
