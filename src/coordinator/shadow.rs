//! Shadow leases: the lease id of a grant a shadow policy let through.
//!
//! Under `mode = "shadow"` a Lease that enforcing would cut short gets all
//! it asked for, but the store holds only what enforcing granted (perhaps
//! nothing, and then no lease at all). The worker still needs an id to name
//! in `Release`, and `Release` must check `spent` against the grant the
//! worker was told about, not the store's part of it.
//!
//! The id carries that grant itself — `shadow~{granted}~{expires}~{store id}`
//! — rather than a table in the coordinator: replicas on one Redis store
//! share no memory, and a Release may reach any of them. What the id says
//! decides only the answer's arithmetic; the budget is refunded by the store,
//! from the store's own lease, so an id a worker made up cannot buy tokens:
//! the store's part is checked (worker, expiry, spend) as for any lease.
//! An id without a store part holds no tokens, so its Release changes
//! nothing in the store and is not remembered; releasing it twice answers
//! twice.

/// Starts every shadow lease id. No store's ids start so: they start with
/// hex digits ([`crate::budget::new_lease_id`]).
const PREFIX: &str = "shadow~";

/// A shadow lease as its id describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShadowLease<'a> {
    /// Tokens the Lease answer granted (what the worker may spend).
    pub(super) granted: u32,
    /// The Lease answer's expiry: after it the lease is gone, as any.
    pub(super) expires_at_ms: i64,
    /// The store's lease inside it: the part enforcing granted.
    pub(super) store_id: Option<&'a str>,
}

impl<'a> ShadowLease<'a> {
    /// The id a worker names in `Release`.
    pub(super) fn id(&self) -> String {
        format!(
            "{PREFIX}{}~{}~{}",
            self.granted,
            self.expires_at_ms,
            self.store_id.unwrap_or_default()
        )
    }

    /// The shadow lease `id` names; `None` for a store's lease id (or an
    /// id that only looks like a shadow lease's).
    pub(super) fn parse(id: &'a str) -> Option<Self> {
        let mut parts = id.strip_prefix(PREFIX)?.splitn(3, '~');
        let granted = parts.next()?.parse().ok()?;
        let expires_at_ms = parts.next()?.parse().ok()?;
        let store_id = parts.next()?;
        Some(ShadowLease {
            granted,
            expires_at_ms,
            store_id: (!store_id.is_empty()).then_some(store_id),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_gives_back_the_lease_it_was_made_from() {
        for store_id in [None, Some("0000002a-7"), Some("ab12-3.1.2.1000.17")] {
            let lease = ShadowLease {
                granted: 50,
                expires_at_ms: 1_704_110_410_000,
                store_id,
            };
            assert_eq!(ShadowLease::parse(&lease.id()), Some(lease));
        }
    }

    #[test]
    fn store_ids_and_malformed_ids_are_not_shadow_leases() {
        for id in [
            "0000002a-7",
            "00000000000000ff-1c.1.2.1000.17",
            "shadow~",
            "shadow~x~1~",
            "shadow~5~",
            "shadow~-1~1~",
        ] {
            assert_eq!(ShadowLease::parse(id), None, "{id}");
        }
    }

    #[test]
    fn the_longest_shadow_id_on_a_redis_lease_fits_a_release() {
        let lease = ShadowLease {
            granted: u32::MAX,
            expires_at_ms: i64::MIN,
            // The Redis store's longest: the id, class, grant, cost,
            // second, each at its widest.
            store_id: Some(
                "ffffffffffffffffffffffffffffffff.2.4294967295.18446744073709551615.-9223372036854775808",
            ),
        };
        assert!(
            lease.id().len() <= crate::service::validate::MAX_ID,
            "{}",
            lease.id()
        );
    }
}
