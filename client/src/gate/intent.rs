//! What a caller hands the gate and what it gets back: the intent and its
//! repetition rule, the attempt it is asked to make, its reply, and the
//! result with one piece of evidence per attempt.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{IntentPolicy, Observation, RepetitionKind};
use crate::outcome::{AttemptRecord, Outcome, ResponseStatus};
use crate::owner::OwnerMark;
use crate::scope::{Priority, Scope};

/// A boxed future, as the reconcile hook returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Looks up whether an attempt whose effect is unknown took effect.
pub type ReconcileHook = Arc<dyn Fn(ReconcileQuery) -> BoxFuture<Reconciled> + Send + Sync>;

/// What the reconcile hook is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileQuery {
    /// The intent whose effect is in doubt.
    pub intent_id: Arc<str>,
    /// The attempt that may have taken effect.
    pub attempt_id: String,
    /// Its number.
    pub number: u32,
}

/// The answer of an authoritative lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The effect happened: the intent is done.
    Applied,
    /// The effect did not happen: another attempt is a first performance.
    Absent,
    /// The lookup could not tell (or did not answer within the attempt cap).
    Unknown,
}

/// Whether, and how, an intent may be sent more than once.
#[derive(Clone)]
pub enum Repetition {
    /// Repeating is harmless by nature.
    Safe,
    /// The upstream deduplicates by this key, sent with every attempt.
    IdempotencyKey(Arc<str>),
    /// Not safe to repeat blindly; the hook tells whether an attempt whose
    /// effect is unknown took effect.
    Reconcile(ReconcileHook),
    /// Neither safe to repeat nor checkable.
    NonRepeatable,
}

impl Repetition {
    /// A reconcile hook from an async closure.
    pub fn reconcile<F, Fut>(hook: F) -> Self
    where
        F: Fn(ReconcileQuery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reconciled> + Send + 'static,
    {
        Repetition::Reconcile(Arc::new(move |query| Box::pin(hook(query))))
    }

    /// The engine's view of it.
    pub fn kind(&self) -> RepetitionKind {
        match self {
            Repetition::Safe => RepetitionKind::Safe,
            Repetition::IdempotencyKey(_) => RepetitionKind::IdempotencyKey,
            Repetition::Reconcile(_) => RepetitionKind::Reconcilable,
            Repetition::NonRepeatable => RepetitionKind::NonRepeatable,
        }
    }
}

impl std::fmt::Debug for Repetition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key may be sensitive (it often embeds an order or account id).
        f.write_str(match self {
            Repetition::Safe => "Safe",
            Repetition::IdempotencyKey(_) => "IdempotencyKey(..)",
            Repetition::Reconcile(_) => "Reconcile(..)",
            Repetition::NonRepeatable => "NonRepeatable",
        })
    }
}

/// One semantic operation to get done, and the rules it runs under.
#[derive(Debug, Clone)]
pub struct GateIntent {
    pub(super) intent_id: Arc<str>,
    pub(super) scope: Scope,
    pub(super) policy: IntentPolicy,
    pub(super) repetition: Repetition,
    /// The mark of a layer above that owns retries, if any.
    pub(super) owned_by: Option<OwnerMark>,
    pub(super) cancel: CancellationToken,
}

impl GateIntent {
    /// An intent that is safe to repeat, owned here, never cancelled. The
    /// policy carries the end-to-end deadline (`total_budget`, from the first
    /// start), the attempt cap, the per-attempt reserve, the wait floor, the
    /// backoff and the longest hint honoured.
    pub fn new(intent_id: impl Into<Arc<str>>, scope: Scope, policy: IntentPolicy) -> Self {
        GateIntent {
            intent_id: intent_id.into(),
            scope,
            policy,
            repetition: Repetition::Safe,
            owned_by: None,
            cancel: CancellationToken::new(),
        }
    }

    /// Sets how the intent may be repeated.
    pub fn repetition(mut self, repetition: Repetition) -> Self {
        self.repetition = repetition;
        self
    }

    /// Sets the priority class (part of the scope).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.scope.priority = priority;
        self
    }

    /// Cancels the intent when `token` is cancelled: a pending wait ends at
    /// once and a reply arriving after it is discarded.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Declares that a layer above owns retries (its mark was found on the
    /// incoming request): this gate makes one attempt, forwards the mark, and
    /// ends `owner_elsewhere` instead of retrying.
    pub fn owned_by(mut self, mark: Option<OwnerMark>) -> Self {
        self.owned_by = mark;
        self
    }

    /// The intent's id.
    pub fn intent_id(&self) -> &str {
        &self.intent_id
    }
    /// Its scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// Its policy.
    pub fn policy(&self) -> &IntentPolicy {
        &self.policy
    }
}

/// What the closure gets for one attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The stable id every attempt is bound to.
    pub intent_id: Arc<str>,
    /// `{intent_id}#{number}`.
    pub attempt_id: String,
    /// Attach to the request (see [`OwnerMark::apply`]): it tells layers
    /// below that retries are owned. When a layer above owns them, this is
    /// that layer's mark, passed on.
    pub owner_mark: OwnerMark,
    /// Send with every attempt when the intent is deduplicated by key.
    pub idempotency_key: Option<Arc<str>>,
    /// The attempt is abandoned (as a timeout after send) at this instant.
    pub must_end_by: Instant,
}

/// What one attempt produced: the observation the gate decides on, and the
/// caller's value (a success value, or a response to hand back even when it
/// was a 429).
#[derive(Debug)]
pub struct Reply<T> {
    /// The status, its classification and the raw hint.
    pub observation: Observation,
    /// The caller's value, if the attempt produced one.
    pub value: Option<T>,
}

impl<T> Reply<T> {
    /// A reply with a value.
    pub fn new(observation: Observation, value: T) -> Self {
        Reply {
            observation,
            value: Some(value),
        }
    }

    /// A reply with no value (a transport failure, a refused request).
    pub fn failed(observation: Observation) -> Self {
        Reply {
            observation,
            value: None,
        }
    }
}

/// How an attempt came to be admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The first attempt needs no retry token.
    FirstAttempt,
    /// A token from a fleet lease.
    Leased {
        /// The lease it came from.
        lease_id: Arc<str>,
    },
    /// The coordinator was unreachable; the local fallback budget admitted it.
    Fallback,
}

/// What the gate learned while waiting after an attempt, or before the first
/// one when a cooldown held it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitEvidence {
    /// The engine's earliest reconsideration time (hint or backoff, floored).
    pub engine_next_start: Duration,
    /// The scope's cooldown, as elapsed time, when it was later.
    pub cooldown: Option<Duration>,
    /// The coordinator's slot, as elapsed time.
    pub slot: Option<Duration>,
    /// Local jitter added because no slot was available.
    pub local_spread: Option<Duration>,
    /// The start finally waited for.
    pub planned_start: Duration,
    /// The coordinator could not be asked; local rules decided.
    pub degraded: bool,
    /// The scope's policy version when the wait began.
    pub policy_version_at_wait: u64,
    /// The version the wake-up was evaluated under.
    pub policy_version_at_wake: u64,
    /// How often the wake-up was re-evaluated for a changed version.
    pub reevaluations: u32,
    /// How often the coordinator said "ask again" (no slot yet, call
    /// `Reconsider` again later) before this wait ended. Apart from
    /// `reevaluations`: asking again is the coordinator pacing the queue,
    /// not a policy change.
    pub asked_again: u32,
    /// How often, deciding alone, the worker's own pace for the scope
    /// ([`LocalPacer`](crate::fallback::LocalPacer)) said "not yet" at the
    /// wake-up before this wait ended.
    pub paced_alone: u32,
    /// Under a shadow policy, what enforcing would have done with this wait
    /// (a later start, or a refusal) that was let through instead.
    pub shadowed: Option<Shadowed>,
}

pub use tollgate_vocab::outcome::Shadowed;

/// The evidence of one attempt: the engine's record plus what only the gate
/// saw. Never a payload.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptEvidence {
    /// Status, hint (raw and read), times and decision.
    pub record: AttemptRecord,
    /// How the attempt was admitted.
    pub token: TokenSource,
    /// The scope's policy version at admission.
    pub policy_version: u64,
    /// The reconcile hook's answer, when the effect was in doubt.
    pub reconciled: Option<Reconciled>,
    /// The wait that followed this attempt's reply, if any.
    pub wait: Option<WaitEvidence>,
}

/// How an intent ended.
#[derive(Debug)]
pub struct IntentResult<T> {
    /// The terminal reason.
    pub outcome: Outcome,
    /// The value of the last reply kept (a reply arriving after cancellation
    /// is discarded, not kept).
    pub value: Option<T>,
    /// The last observation kept, reported apart from the outcome.
    pub last_response: Option<Observation>,
    /// One per attempt started, in order.
    pub attempts: Vec<AttemptEvidence>,
    /// The wait before the first attempt, when the scope's known cooldown
    /// held it (`cooldown` is its end, `slot` the coordinator's slot after
    /// it); also set when the intent ended while held, with no attempt.
    pub held: Option<WaitEvidence>,
    /// When the intent began: every elapsed time in the evidence (a slot,
    /// a planned start, an attempt's start) counts from this instant, so a
    /// caller can tell how far ahead of now the gate's next start was.
    pub began: Instant,
}

impl<T> IntentResult<T> {
    /// Whether the intent succeeded.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Succeeded
    }

    /// The status of the last reply kept.
    pub fn last_status(&self) -> Option<ResponseStatus> {
        self.last_response.as_ref().map(|o| o.status)
    }
}
