//! What each caller token may hold of the coordinator: its part of the
//! scope table and of the request slots.
//!
//! Every tenant's workers share one coordinator, whose bounds
//! (`max_scopes`, `max_concurrent_requests`) are pools. Without a part per
//! token, one tenant filling a pool denies every other tenant; so each
//! `[[token]]` entry gets a quota of each pool ([`TenantLimits`]), by
//! default its [`fair_share`], or what its entry says. Open dev mode has no
//! tokens and keeps the single pools.
//!
//! Who holds what is an [`Owner`]: the `[[token]]` entry, never the token's
//! value, named in metrics and the Admin API by the entry's `name`.

/// The caller token entry a scope is charged to: 1-based in file order,
/// as errors name entries; 0 is nobody's (open dev mode, or a scope an
/// operator made by freezing or muting it). Sixteen bits so the memory
/// store keeps it inside a word it already has (`store::memory::route`);
/// entries past the 65 535th share the last owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Owner(u16);

impl Owner {
    /// Nobody's: open dev mode, or an operator's.
    pub const NONE: Owner = Owner(0);

    /// The owner of caller token entry `index` (0-based).
    pub fn token(index: usize) -> Owner {
        Owner(u16::try_from(index.saturating_add(1)).unwrap_or(u16::MAX))
    }

    /// The owner with this raw value (what [`Owner::get`] gave).
    pub const fn from_raw(raw: u16) -> Owner {
        Owner(raw)
    }

    /// The raw value: 0 for [`Owner::NONE`], else the entry's 1-based place.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The 0-based token entry, if this is a token's.
    pub fn index(self) -> Option<usize> {
        usize::from(self.0).checked_sub(1)
    }
}

/// A caller token entry as tenancy sees it: its name and its own quotas,
/// if it sets any ([`crate::auth::Authenticator::tenants`] lists them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    /// The entry's `name`, or `token-<N>` (1-based, in file order).
    pub name: String,
    /// `max_scopes` of the entry.
    pub max_scopes: Option<usize>,
    /// `max_concurrent_requests` of the entry.
    pub max_concurrent_requests: Option<usize>,
}

/// Whom one Budget operation is made for: the owner new scopes are charged
/// to, and how many caller tokens may use the scope's caller scope (where
/// several may, one token's reported counts do not lift another's budget:
/// [`crate::budget`], "Counts of several tokens").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// The calling token's entry ([`Owner::NONE`] in open dev mode).
    pub owner: Owner,
    /// Caller tokens that may use the caller scope, at least 1.
    pub tokens: usize,
}

impl Tenant {
    /// Nobody in particular: open dev mode, tests, benchmarks.
    pub const NONE: Tenant = Tenant {
        owner: Owner::NONE,
        tokens: 1,
    };

    /// Whether several tokens share the caller scope, so that each one's
    /// counts are kept apart.
    pub fn shared(&self) -> bool {
        self.tokens > 1 && self.owner != Owner::NONE
    }
}

/// A token's default part of a pool of `total` shared by `tokens` caller
/// tokens: an equal split, rounded down, so the defaults never add up to
/// more than the pool and a full pool always means some tenant is at its
/// own quota (whose own scopes or slots are then the ones to go). It is
/// never below 1: a token with a part of 0 could never be served, and one
/// place each is the least that keeps every tenant working when there are
/// more tokens than places (the pool is then oversubscribed, which the
/// server warns about at start).
pub fn fair_share(total: usize, tokens: usize) -> usize {
    (total / tokens.max(1)).max(1)
}

/// Each token entry's name and quotas, fixed at start (a reload changes
/// token values, never the entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// By entry (0-based): the name metrics and the Admin API show.
    pub names: Vec<String>,
    /// By entry: scopes (routes plus caller scopes) it may hold in the
    /// embedded store.
    pub scopes: Vec<usize>,
    /// By entry: Budget calls it may have in flight.
    pub requests: Vec<usize>,
}

impl TenantLimits {
    /// The limits of the caller token entries `tenants` in pools of
    /// `max_scopes` scopes and `max_requests` request slots: each entry's
    /// own setting, else its [`fair_share`]. Empty in open dev mode (no
    /// entries).
    pub fn of(tenants: &[TenantSpec], max_scopes: usize, max_requests: usize) -> TenantLimits {
        let n = tenants.len();
        TenantLimits {
            names: tenants.iter().map(|t| t.name.clone()).collect(),
            scopes: tenants
                .iter()
                .map(|t| t.max_scopes.unwrap_or_else(|| fair_share(max_scopes, n)))
                .collect(),
            requests: tenants
                .iter()
                .map(|t| {
                    t.max_concurrent_requests
                        .unwrap_or_else(|| fair_share(max_requests, n))
                })
                .collect(),
        }
    }

    /// The configured name of `owner`'s entry; `None` for nobody's.
    pub fn name(&self, owner: Owner) -> Option<&str> {
        owner
            .index()
            .and_then(|i| self.names.get(i))
            .map(String::as_str)
    }

    /// The owner whose entry is named `name`.
    pub fn owner_named(&self, name: &str) -> Option<Owner> {
        self.names.iter().position(|n| n == name).map(Owner::token)
    }

    /// The scope quota of `owner`; `None` for nobody's (bounded by the
    /// table alone).
    pub fn scope_quota(&self, owner: Owner) -> Option<usize> {
        owner.index().and_then(|i| self.scopes.get(i)).copied()
    }

    /// Whether the quotas add up to more than the pools, so that a full
    /// pool may hold a tenant under its quota out (said once at start).
    pub fn oversubscribed(&self, max_scopes: usize, max_requests: usize) -> Option<&'static str> {
        let sum = |v: &[usize]| v.iter().fold(0usize, |a, &b| a.saturating_add(b));
        if sum(&self.scopes) > max_scopes {
            Some("max_scopes")
        } else if sum(&self.requests) > max_requests {
            Some("max_concurrent_requests")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_share_never_adds_up_past_the_pool_nor_falls_to_zero() {
        assert_eq!(fair_share(1_000_000, 3), 333_333);
        assert_eq!(fair_share(1024, 2), 512);
        assert_eq!(fair_share(10, 0), 10);
        assert_eq!(fair_share(3, 5), 1);
        for tokens in 1..50 {
            assert!(fair_share(1000, tokens) * tokens <= 1000);
        }
    }

    #[test]
    fn owners_are_entries_one_based() {
        assert_eq!(Owner::token(0).get(), 1);
        assert_eq!(Owner::token(0).index(), Some(0));
        assert_eq!(Owner::NONE.index(), None);
        assert_eq!(Owner::token(1 << 20), Owner::from_raw(u16::MAX));
    }
}
