//! Where the coordinator's runtime control state lives when the store is
//! shared by several replicas: the running policy document with its
//! versions, the freezes with their expiry, and the audit log.
//!
//! With one coordinator that state is the process's own (the state file and
//! the audit file in [`crate::control`]). With replicas on one Redis, an SRE's
//! change through any replica must be in force on all of them and survive
//! any of them dying, so the state is one document in the store, changed
//! only by compare-and-set on its revision (two SREs on two replicas: one
//! wins, the other re-reads and is told its version is stale), with the
//! change's audit records appended in the same atomic step. Every commit
//! also sends a notice so the other replicas re-read at once; they re-check
//! the revision periodically as well, because a notice can be missed.
//!
//! The document is opaque here (JSON written and read by
//! [`crate::control`]): the store keeps it, it does not interpret it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Notify;

use super::StoreFuture;

/// Audit records kept: in memory by one coordinator, in the shared list by a
/// store replicas share, so `ListAudit` answers the same on both.
pub const MEMORY_RECORDS: usize = 1000;

/// The shared runtime state as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSnapshot {
    /// Increases by one per committed change; 0 before the first.
    pub rev: u64,
    /// The state document (JSON).
    pub state: String,
}

/// A commit that took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The revision the commit produced (unchanged for an audit-only one).
    pub rev: u64,
    /// The sequence numbers given to the audit records, in order.
    pub seqs: Vec<u64>,
}

/// Runtime control state shared by replicas (see the module doc).
pub trait ControlStateStore: Send + Sync {
    /// The current revision (0: none written yet); the cheap check the
    /// periodic reconcile makes.
    fn revision(&self) -> StoreFuture<'_, u64>;

    /// The revision and the document; `None` when none is written yet.
    fn load(&self) -> StoreFuture<'_, Option<ControlSnapshot>>;

    /// Writes `state` if the revision is still `expected_rev` and appends
    /// `audit` (each a JSON object's members after its `seq`, which the
    /// store assigns) in the same atomic step; `None` when another replica
    /// committed first. With `expected_rev` `None` only the records are
    /// appended (a change that leaves the document alone, like a reset).
    fn commit<'a>(
        &'a self,
        expected_rev: Option<u64>,
        state: &'a str,
        audit: &'a [String],
    ) -> StoreFuture<'a, Option<Committed>>;

    /// Up to `limit` audit records (JSON) older than `before_seq` (0: the
    /// newest), newest first.
    fn audit(&self, before_seq: u64, limit: usize) -> StoreFuture<'_, Vec<String>>;

    /// Signals `notify` each time another replica commits; runs (and
    /// resubscribes after a loss) for as long as it is polled.
    fn notices(&self, notify: Arc<Notify>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}
