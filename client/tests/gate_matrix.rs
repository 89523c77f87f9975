//! The gate against the failure-shaped test matrix, one named test per
//! client-side row, every row against the real coordinator: the real
//! `BudgetService` behind the real server setup, reached by real tonic
//! clients over in-memory pipes so the rows run on paused tokio time (see
//! `support::pipes`). The fleet's answers come from its policy file, from what
//! workers report and lease, and from what an SRE changes through the real
//! Admin API, never from a scripted fake.
//!
//! The rows are grouped by what they exercise, one module each, in
//! `gate_matrix/`.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "gate_matrix/at_wake.rs"]
mod at_wake;
#[path = "gate_matrix/cancellation.rs"]
mod cancellation;
#[path = "gate_matrix/coordinator_loss.rs"]
mod coordinator_loss;
#[path = "gate_matrix/hints.rs"]
mod hints;
#[path = "gate_matrix/repetition.rs"]
mod repetition;

use support::pipes::scope;
use tollgate_client::gate::GateIntent;

/// Intent `id` on the harness's scope, under `policy`: what every row runs.
fn intent(id: &str, policy: tollgate_client::engine::IntentPolicy) -> GateIntent {
    GateIntent::new(id, scope(), policy)
}
