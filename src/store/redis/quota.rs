//! Each caller token's quota of scopes on Redis: the memory store's rule
//! (`store::memory`, "Quotas per token"), kept where every replica sees it.
//!
//! # Where the count lives
//! A token's scopes are the members of one sorted set,
//! `PREFIX:tenant:{NAME}`, of their keys scored by their last touch as
//! last seen, and a route or caller scope also names its token in its own
//! hash (`o`). The set is the count every replica charges against; the
//! field is what a scope *is*, read by listings and checked before a scope
//! goes. On a cluster the set is in its own slot, apart from the scopes'
//! (`{CALLER|ROUTE}`), so no script touches both: a charge is one script on
//! the set, made *before* the call that creates the scope.
//!
//! # Charged before creation
//! A call by a token with a quota asks the route script to act only on a
//! route that exists; an existing route (the common case: every call but
//! the first) costs nothing more. When it does not exist the script writes
//! nothing and says so, the scope is charged (`quota_charge.lua`, making
//! room first if the token holds its quota), and the call is made again,
//! allowed to create and naming the token as the owner. A caller scope is
//! charged when the report that makes it read none.
//!
//! # At the quota
//! As the memory store: the token's own scopes go, coldest first, in a
//! batch of [`ROOM_BATCH_PERMILLE`] of its quota (at most
//! [`MAX_READ`] ÷ [`READ_BATCHES`] a pass: each costs round trips while a
//! call waits), cooled-down ones
//! included, never one holding an unexpired lease, a waiting intent, a
//! freeze or a mute; another token's never (a member whose scope names
//! another owner, or none, is only dropped from the set). If none can go,
//! `ScopeQuota`, with no other pass for [`ROOM_RETRY_MS`]. The scores are
//! touches as last seen (a charge or a pass sets them, a Lease does not,
//! to keep the request path at one round trip): a pass reads the real
//! last touch of the lowest-scored members, rescores them, and evicts the
//! coldest among them. A score is never later than the scope's real last
//! touch, so a member left out of the pass was touched no earlier than
//! the highest score read.
//!
//! # Charges and creations in flight
//! Each step is atomic, a charge and the creation it admits are not. So a
//! pass keeps the place of a member charged within [`IN_FLIGHT_MS`] whose
//! scope is not there yet (its call may be about to make it), and drops a
//! member only if its score is still the one read (a member charged again
//! meanwhile is about to be made again): however charges and creations
//! interleave across replicas, one place admits one scope
//! (`concurrent_creations_through_two_replicas_never_exceed_the_quota`).
//! What is left over-shoots by the calls in flight at most, as the memory
//! store's count does: the same new scope created at once by two tokens is
//! charged to both (it names whichever wrote first; the other's set drops
//! it at its next pass), and a scope evicted between a report's budget
//! half and its hints half is made again uncharged by the hints half. A
//! scope that expired by itself keeps its place until a pass finds it gone
//! or the idle sweep prunes the set.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use crate::hints::HintState;
use crate::store::memory::{ROOM_BATCH_PERMILLE, ROOM_RETRY_MS};
use crate::store::{OwnerCounts, StoreError};
use crate::tenancy::{Owner, TenantLimits};

use super::RedisStore;
use super::decide::stored_hints;
use super::keys::escape;
use super::reply::Reply;
use super::scripts::SCRIPTS;

/// How many lowest-scored members a pass reads, in batches: enough that
/// stale scores (touches the set has not seen) rarely hide the coldest.
const READ_BATCHES: usize = 4;
/// The most members one pass reads (and so evicts). Each costs a round
/// trip, made while a call waits: the memory store's batch of a large
/// quota (1/64 of it) would hold that call for seconds, where this many
/// keep a pass within milliseconds and a run of new scopes at the quota
/// pays one pass per this many.
const MAX_READ: usize = 64;
/// How long after its charge a scope that is not there yet may still be
/// in the making (the call it admitted is bounded by the request
/// timeout): a pass keeps its place until then, or two calls in flight
/// could both be admitted to one place.
const IN_FLIGHT_MS: i64 = 5_000;

/// Each token's quota and this replica's view of what it holds.
#[derive(Debug, Default)]
pub(super) struct Quotas {
    /// By entry: the name (the set's key and the scopes' `o`) and quota.
    limits: TenantLimits,
    /// By entry: the count the set answered last (for the metrics).
    held: Vec<AtomicUsize>,
    /// By entry: new scopes this replica refused at the quota.
    refused: Vec<AtomicU64>,
    /// By entry: before this instant a pass that found nothing to evict
    /// is not made again ([`ROOM_RETRY_MS`]).
    retry_at_ms: Vec<AtomicI64>,
}

impl Quotas {
    pub(super) fn new(limits: TenantLimits) -> Self {
        let n = limits.names.len();
        Quotas {
            held: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            refused: (0..n).map(|_| AtomicU64::new(0)).collect(),
            retry_at_ms: (0..n).map(|_| AtomicI64::new(i64::MIN)).collect(),
            limits,
        }
    }

    /// `owner`'s entry and quota; `None` for nobody's or one without.
    fn of(&self, owner: Owner) -> Option<(usize, usize)> {
        let i = owner.index()?;
        Some((i, *self.limits.scopes.get(i)?))
    }

    /// The name scopes of `owner` carry (`None`: nobody's).
    pub(super) fn name(&self, owner: Owner) -> Option<&str> {
        self.limits.name(owner)
    }

    /// The owner a scope's `o` names.
    pub(super) fn owner_named(&self, name: &str) -> Owner {
        self.limits.owner_named(name).unwrap_or(Owner::NONE)
    }

    /// Whether `owner`'s calls must be charged before they create.
    pub(super) fn charges(&self, owner: Owner) -> bool {
        self.of(owner).is_some()
    }

    pub(super) fn counts(&self) -> Vec<OwnerCounts> {
        self.limits
            .scopes
            .iter()
            .enumerate()
            .map(|(i, &quota)| OwnerCounts {
                owner: Owner::token(i),
                held: self.held[i].load(Ordering::Relaxed),
                quota,
                refused: self.refused[i].load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// A member of a token's set, as a pass reads it.
struct Seat {
    member: String,
    touched: i64,
    hints_version: i64,
    busy: bool,
}

impl RedisStore {
    /// The sorted set of `name`'s scopes.
    fn tenant_key(&self, name: &str) -> String {
        format!("{}:tenant:{{{}}}", self.prefix, escape(name))
    }

    /// Charges the scope at `key` to `owner`'s quota before a call creates
    /// it, making room among `owner`'s own scopes if it holds its quota;
    /// `ScopeQuota` when none can go. Nothing for an owner without a quota.
    pub(super) async fn charge(
        &self,
        owner: Owner,
        key: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let Some((i, quota)) = self.quotas.of(owner) else {
            return Ok(());
        };
        let name = &self.quotas.limits.names[i];
        let set = self.tenant_key(name);
        let read = ((quota * ROOM_BATCH_PERMILLE / 1000).max(1) * READ_BATCHES).min(MAX_READ);
        let batch = (read / READ_BATCHES).max(1);
        // Each pass frees at least one place or refuses; another replica
        // may take the place first, so a few passes, then a refusal.
        for _ in 0..4 {
            let mut inv = SCRIPTS.quota_charge.call(&[&set]);
            inv.arg(key).arg(now_ms).arg(quota).arg(read);
            let r = Reply::ok(self.run(&inv).await?)?;
            let held = usize::try_from(r.int(2)?).unwrap_or(0);
            self.quotas.held[i].store(held, Ordering::Relaxed);
            if r.text(1).as_deref() != Some("full") {
                return Ok(());
            }
            let retry_at = &self.quotas.retry_at_ms[i];
            if now_ms < retry_at.load(Ordering::Relaxed) {
                break;
            }
            let mut lowest = Vec::new();
            let mut at = 3;
            while let Some(member) = r.text(at) {
                let score = r.text(at + 1).and_then(|s| s.parse::<f64>().ok());
                lowest.push((member, score.map_or(i64::MAX, |s| s as i64)));
                at += 2;
            }
            if self.make_room(name, &set, lowest, batch, now_ms).await? == 0 {
                retry_at.store(now_ms.saturating_add(ROOM_RETRY_MS), Ordering::Relaxed);
                break;
            }
        }
        self.quotas.refused[i].fetch_add(1, Ordering::Relaxed);
        Err(StoreError::ScopeQuota { quota })
    }

    /// One pass over the lowest-scored members of `name`'s set (with
    /// their scores): drops those gone or not its own, rescores the rest
    /// with their real last touch, and evicts up to `batch` of the coldest
    /// that hold nothing live; returns how many places that freed.
    async fn make_room(
        &self,
        name: &str,
        set: &str,
        lowest: Vec<(String, i64)>,
        batch: usize,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let mut gone = Vec::new();
        let mut seats = Vec::new();
        for (member, score) in lowest {
            match self.peek(&member, name, now_ms).await? {
                Some(seat) => seats.push((seat, score)),
                // Charged so lately that the call it admitted may not have
                // made it yet: its place is taken.
                None if score > now_ms.saturating_sub(IN_FLIGHT_MS) => {}
                // Expired, evicted, or another's: its place was never used.
                None => gone.push((member, score)),
            }
        }
        if !seats.is_empty() {
            // Only ever raised: a charge racing this pass set a later one.
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(set).arg("XX").arg("GT");
            for (seat, _) in &seats {
                zadd.arg(seat.touched).arg(&seat.member);
            }
            self.query::<i64>(&zadd).await?;
        }
        seats.retain(|(s, _)| !s.busy);
        seats.sort_by_key(|(s, _)| s.touched);
        for (seat, score) in seats.into_iter().take(batch) {
            let mut inv = SCRIPTS.quota_unseat.call(&[&seat.member]);
            inv.arg(now_ms)
                .arg(u8::from(is_route(&seat.member)))
                .arg(seat.touched)
                .arg(seat.hints_version);
            if Reply::ok(self.run(&inv).await?)?.int(1)? == 1 {
                gone.push((seat.member, score.max(seat.touched)));
            }
        }
        self.drop_members(set, &gone).await
    }

    /// Drops `members` from `set`, each only if its score is still the
    /// one given (one charged again meanwhile is about to be made again,
    /// and keeps its place); returns how many went.
    async fn drop_members(
        &self,
        set: &str,
        members: &[(String, i64)],
    ) -> Result<usize, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let mut inv = SCRIPTS.quota_drop.call(&[set]);
        for (member, score) in members {
            inv.arg(member).arg(*score);
        }
        Ok(usize::try_from(Reply::ok(self.run(&inv).await?)?.int(1)?).unwrap_or(0))
    }

    /// The scope at `key` if it is still `name`'s, with what decides
    /// whether it may go; `None` when it is gone or not `name`'s.
    async fn peek(&self, key: &str, name: &str, now_ms: i64) -> Result<Option<Seat>, StoreError> {
        let mut inv = SCRIPTS.quota_peek.call(&[key]);
        inv.arg(now_ms).arg(u8::from(is_route(key)));
        let r = Reply::ok(self.run(&inv).await?)?;
        if r.int(1)? == 0 || r.text(2).as_deref() != Some(name) {
            return Ok(None);
        }
        // A mute is an operator's decision that holds the scope; a
        // cooldown is the token's own evidence, which must not pin it.
        let hints: HintState = stored_hints(r.bytes(6))?;
        let muted = hints.mutes.values().any(|&until| until > now_ms);
        Ok(Some(Seat {
            member: key.to_owned(),
            touched: r.int(3)?,
            hints_version: r.int(5)?,
            busy: r.int(4)? == 1 || muted,
        }))
    }

    /// Drops from every token's set the scopes that are gone (expired by
    /// themselves) or not its own, and refreshes the counts: the idle
    /// sweep's part, so a quota is not held by scopes no longer there.
    pub(super) async fn prune_quotas(&self, now_ms: i64) -> Result<(), StoreError> {
        for (i, name) in self.quotas.limits.names.iter().enumerate() {
            if self.quotas.of(Owner::token(i)).is_none() {
                continue;
            }
            let set = self.tenant_key(name);
            let mut zrange = redis::cmd("ZRANGE");
            zrange.arg(&set).arg(0).arg(-1).arg("WITHSCORES");
            let members: Vec<(String, f64)> = self.query(&zrange).await?;
            let mut gone = Vec::new();
            for (member, score) in members.iter().cloned() {
                let score = score as i64;
                if score <= now_ms.saturating_sub(IN_FLIGHT_MS)
                    && self.peek(&member, name, now_ms).await?.is_none()
                {
                    gone.push((member, score));
                }
            }
            let dropped = self.drop_members(&set, &gone).await?;
            self.quotas.held[i].store(members.len() - dropped, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn is_route(key: &str) -> bool {
    key.ends_with(":r")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::budget::GrantAsk;
    use crate::policy::Policy;
    use crate::scope::{Priority, RetryClass, ScopeKey};
    use crate::store::redis::{RedisOptions, RedisTarget};
    use crate::store::{ScopeFilter, Store, StoreError, Tenant};
    use tollgate_testkit::RedisServer;

    use super::*;

    const T0: i64 = 1_700_000_000_000;

    /// Two replicas' stores on one Redis, one token of quota `quota`.
    async fn replicas(server: &RedisServer, quota: usize) -> [Arc<RedisStore>; 2] {
        let store = || async {
            let options = RedisOptions {
                idle_ttl: Duration::from_secs(60),
                tenants: TenantLimits {
                    names: vec!["a".into()],
                    scopes: vec![quota],
                    requests: vec![64],
                },
                ..RedisOptions::default()
            };
            let target = RedisTarget::parse(&server.url()).expect("url");
            Arc::new(RedisStore::connect(target, options).await.expect("connect"))
        };
        [store().await, store().await]
    }

    /// Many new scopes at once through two replicas, the token at its
    /// quota: each place is given once, however the charges and the
    /// creations they admit interleave, and every refusal is the quota's.
    #[tokio::test]
    async fn concurrent_creations_through_two_replicas_never_exceed_the_quota() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let quota = 3;
        let stores = replicas(&server, quota).await;
        let tenant = Tenant {
            owner: Owner::token(0),
            tokens: 1,
        };
        let calls = (0..24).map(|i| {
            let store = Arc::clone(&stores[i % 2]);
            tokio::spawn(async move {
                let key = ScopeKey::new("a", &format!("r{i}"), Priority::Critical);
                let ask = GrantAsk {
                    worker_id: "w",
                    priority: Priority::Critical,
                    retry_class: RetryClass::Transient,
                    want: 1,
                    now_ms: T0 + i as i64,
                    tenant,
                };
                store.lease(&key, ask, &Policy::default()).await
            })
        });
        let mut granted = 0;
        for call in calls.collect::<Vec<_>>() {
            match call.await.expect("joined") {
                Ok(_) => granted += 1,
                Err(err) => assert_eq!(err, StoreError::ScopeQuota { quota }),
            }
        }
        // Every place held by a live lease: exactly the quota was made.
        let mine = ScopeFilter {
            owner: Some(Owner::token(0)),
            ..ScopeFilter::default()
        };
        let page = stores[0]
            .list_scopes(&mine, None, 100, T0 + 100)
            .await
            .expect("list");
        assert_eq!((granted, page.scopes.len()), (quota, quota));
        let refused: u64 = stores.iter().map(|s| s.owner_counts()[0].refused).sum();
        assert_eq!(refused, 24 - quota as u64);
    }
}
