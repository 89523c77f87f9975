//! The completion registry: [`Gate::complete`] reaches a running intent
//! through the token registered here, shared by every run of one intent id
//! and removed when the last of them ends.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Gate;

/// Completion evidence delivered by [`Gate::complete`], per running intent.
pub(super) struct Completion {
    pub(super) token: CancellationToken,
    runs: usize,
}

impl Gate {
    pub(super) fn register(&self, intent_id: &Arc<str>) -> CompletionGuard {
        let mut entry = self
            .inner
            .completions
            .entry(intent_id.clone())
            .or_insert_with(|| Completion {
                token: CancellationToken::new(),
                runs: 0,
            });
        entry.runs += 1;
        CompletionGuard {
            gate: self.clone(),
            intent_id: intent_id.clone(),
            token: entry.token.clone(),
        }
    }
}

/// Keeps an intent reachable by [`Gate::complete`] while it runs.
pub(super) struct CompletionGuard {
    gate: Gate,
    intent_id: Arc<str>,
    pub(super) token: CancellationToken,
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        self.gate
            .inner
            .completions
            .remove_if_mut(&self.intent_id, |_, completion| {
                completion.runs -= 1;
                completion.runs == 0
            });
    }
}
