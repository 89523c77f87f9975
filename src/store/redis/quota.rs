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
//! batch of [`ROOM_BATCH_PERMILLE`] of its quota, cooled-down ones
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
//! # What is not exact
//! Each step is atomic, a charge and the creation it admits are not: the
//! same new scope created at once by two tokens is charged to both (the
//! owner it names is whichever wrote first; the other's set drops it at
//! its next pass), and a scope evicted between a report's budget half and
//! its hints half is re-created uncharged by the hints half. Both bound the
//! over-shoot by the calls in flight, as the memory store's count is. A
//! scope that expired by itself stays in its set until a pass finds it
//! gone (or the idle sweep prunes the set), which frees its place then.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use crate::hints::HintState;
use crate::store::memory::{ROOM_BATCH_PERMILLE, ROOM_RETRY_MS};
use crate::store::{OwnerCounts, StoreError};
use crate::tenancy::{Owner, TenantLimits};

use super::decide::stored_hints;
use super::keys::escape;
use super::reply::Reply;
use super::scripts::SCRIPTS;
use super::store::RedisStore;

/// How many lowest-scored members a pass reads, in batches: enough that
/// stale scores (touches the set has not seen) rarely hide the coldest.
const READ_BATCHES: usize = 4;

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
        let batch = (quota * ROOM_BATCH_PERMILLE / 1000).max(1);
        // Each pass frees at least one place or refuses; another replica
        // may take the place first, so a few passes, then a refusal.
        for _ in 0..4 {
            let mut inv = SCRIPTS.quota_charge.call(&[&set]);
            inv.arg(key)
                .arg(now_ms)
                .arg(quota)
                .arg(batch * READ_BATCHES);
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
                lowest.push(member);
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

    /// One pass over the lowest-scored members of `name`'s set: drops
    /// those gone or not its own, rescores the rest with their real last
    /// touch, and evicts up to `batch` of the coldest that hold nothing
    /// live; returns how many places that freed.
    async fn make_room(
        &self,
        name: &str,
        set: &str,
        lowest: Vec<String>,
        batch: usize,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let mut freed = Vec::new();
        let mut seats = Vec::new();
        for member in lowest {
            match self.peek(&member, name, now_ms).await? {
                Some(seat) => seats.push(seat),
                // Expired, evicted, or another's: its place was never used.
                None => freed.push(member),
            }
        }
        for seat in &seats {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(set).arg("XX").arg(seat.touched).arg(&seat.member);
            self.query::<i64>(&zadd).await?;
        }
        seats.retain(|s| !s.busy);
        seats.sort_by_key(|s| s.touched);
        for seat in seats.into_iter().take(batch) {
            let mut inv = SCRIPTS.quota_unseat.call(&[&seat.member]);
            inv.arg(now_ms)
                .arg(u8::from(is_route(&seat.member)))
                .arg(seat.touched)
                .arg(seat.hints_version);
            if Reply::ok(self.run(&inv).await?)?.int(1)? == 1 {
                freed.push(seat.member);
            }
        }
        if !freed.is_empty() {
            let mut zrem = redis::cmd("ZREM");
            zrem.arg(set).arg(&freed);
            self.query::<i64>(&zrem).await?;
        }
        Ok(freed.len())
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
            zrange.arg(&set).arg(0).arg(-1);
            let members: Vec<String> = self.query(&zrange).await?;
            let mut gone = Vec::new();
            for member in &members {
                if self.peek(member, name, now_ms).await?.is_none() {
                    gone.push(member.clone());
                }
            }
            if !gone.is_empty() {
                let mut zrem = redis::cmd("ZREM");
                zrem.arg(&set).arg(&gone);
                self.query::<i64>(&zrem).await?;
            }
            self.quotas.held[i].store(members.len() - gone.len(), Ordering::Relaxed);
        }
        Ok(())
    }
}

fn is_route(key: &str) -> bool {
    key.ends_with(":r")
}
