//! The unit that shares a retry budget, as the worker names it.

use std::fmt;

pub use tollgate_proto::v1::Priority;
use tollgate_proto::v1::Scope as WireScope;

/// `(caller_scope, route)` plus a priority class: the unit that shares a
/// retry budget across the fleet.
///
/// `route` is a method plus route template or an operation class
/// (`GET /users/{id}`), never a raw URL with ids in it: ids would make every
/// request its own scope and no budget would ever be shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    /// The credential, tenant or account the budget belongs to.
    pub caller_scope: String,
    /// The route template or operation class.
    pub route: String,
    /// The priority class; critical work keeps its share when bulk is spent.
    pub priority: Priority,
}

impl Scope {
    /// A scope of normal priority.
    pub fn new(caller_scope: impl Into<String>, route: impl Into<String>) -> Self {
        Scope {
            caller_scope: caller_scope.into(),
            route: route.into(),
            priority: Priority::Normal,
        }
    }

    /// The same scope in another priority class.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The wire form.
    pub fn to_wire(&self) -> WireScope {
        WireScope {
            caller_scope: self.caller_scope.clone(),
            route: self.route.clone(),
            priority: self.priority as i32,
        }
    }

    /// From the wire form; an unknown priority is read as normal, as the
    /// proto documents for UNSPECIFIED.
    pub fn from_wire(scope: &WireScope) -> Self {
        let priority = match Priority::try_from(scope.priority) {
            Ok(Priority::Unspecified) | Err(_) => Priority::Normal,
            Ok(p) => p,
        };
        Scope {
            caller_scope: scope.caller_scope.clone(),
            route: scope.route.clone(),
            priority,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} [{}]",
            self.caller_scope,
            self.route,
            self.priority.as_str_name()
        )
    }
}
