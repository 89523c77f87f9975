//! Scope names: what shares a budget, a cooldown and a slot cursor.
//!
//! A scope is `(caller_scope, route)` plus a priority class (DESIGN.md). The
//! coordinator keeps state at two levels of that name:
//! - [`RouteKey`] `(caller_scope, route)`: the upstream sees one route of one
//!   caller, so cooldowns, the backoff step, the slot cursor and the budget's
//!   first-attempt count live here, shared by every priority class;
//! - the whole caller scope, where evidence from an *uncertain* scope lands,
//!   because the limit may cover more than the route it was seen on.
//!
//! Priority classes only split the budget (each has its own share and spend).

use std::fmt;

/// A priority class. Shares of a scope's budget are per class, so bulk work
/// cannot spend the tokens reserved for critical work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Work whose failure a user sees now.
    Critical,
    /// The default class.
    Normal,
    /// Deferrable work: batch jobs, backfills.
    Bulk,
}

impl Priority {
    /// Every class, in the order of [`Priority::index`].
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Normal, Priority::Bulk];

    /// A dense index for per-class arrays.
    pub fn index(self) -> usize {
        match self {
            Priority::Critical => 0,
            Priority::Normal => 1,
            Priority::Bulk => 2,
        }
    }

    /// The lowercase name used in config files and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Bulk => "bulk",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of failure a retry answers; each class has its own token cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// The upstream did not refuse us (408, 502, 504, connect refused).
    Transient,
    /// The upstream said it is at capacity (429, 503, RESOURCE_EXHAUSTED).
    Throttled,
}

/// `(caller_scope, route)`: the level at which hints, cooldowns, the backoff
/// step and slots are shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    /// The credential, tenant or account.
    pub caller_scope: String,
    /// The method + route template or operation class.
    pub route: String,
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}", self.caller_scope, self.route)
    }
}

/// A full scope: a route of a caller, in one priority class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScopeKey {
    /// Which route of which caller.
    pub route: RouteKey,
    /// Which share of the budget.
    pub priority: Priority,
}

impl ScopeKey {
    /// Builds a key from its three parts.
    pub fn new(caller_scope: &str, route: &str, priority: Priority) -> Self {
        ScopeKey {
            route: RouteKey {
                caller_scope: caller_scope.to_owned(),
                route: route.to_owned(),
            },
            priority,
        }
    }
}

impl fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}", self.route, self.priority)
    }
}

/// Where a piece of rate-limit evidence is applied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EvidenceLevel {
    /// The worker knew which route the limit covered.
    Route(RouteKey),
    /// The scope was uncertain: the whole caller scope waits, because
    /// narrowing a guess would keep hitting a possibly shared exhausted quota.
    Caller(String),
}

impl fmt::Display for EvidenceLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvidenceLevel::Route(route) => route.fmt(f),
            EvidenceLevel::Caller(caller) => write!(f, "{caller}|*"),
        }
    }
}

/// The id a worker or an intent has in the stores when caller token entry
/// `entry` (1-based, in file order) sent `id`: `t<entry>:<id>`. A token
/// owns the ids it sends, so the same id from another token is another
/// worker or intent; the form is printable, so the Admin API shows ids as
/// they are kept ([`crate::auth::Identity::own`]).
pub fn owned_id(entry: usize, id: &str) -> String {
    format!("t{entry}:{id}")
}

/// Who owns a worker or intent id: the `t<entry>:` prefix of an
/// [`owned_id`] (one per caller token), or `""` for an id kept as sent.
pub fn owner_of(id: &str) -> &str {
    let sent = sent_id(id);
    &id[..id.len() - sent.len()]
}

/// The id as its worker sent it: [`owned_id`]'s prefix taken off, or the
/// id itself when it has none (open dev mode keeps ids as sent).
pub fn sent_id(id: &str) -> &str {
    let Some(rest) = id.strip_prefix('t') else {
        return id;
    };
    match rest.split_once(':') {
        Some((entry, sent)) if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) => {
            sent
        }
        _ => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_id_gives_back_the_id_as_sent() {
        assert_eq!(owned_id(2, "worker-17"), "t2:worker-17");
        assert_eq!(sent_id("t2:worker-17"), "worker-17");
        // Whatever the worker chose, the prefix is the owner's alone.
        assert_eq!(sent_id(&owned_id(1, "t3:x")), "t3:x");
        // Ids that are not owned are as sent.
        for id in ["worker-17", "t:x", "tx:y", "t12", "team:a"] {
            assert_eq!(sent_id(id), id);
        }
    }
}
