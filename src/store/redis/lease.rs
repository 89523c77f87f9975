//! A Lease on Redis: every budget rule applied here, in Rust, by the
//! functions [`BudgetLedger::grant`](crate::budget::BudgetLedger::grant)
//! runs ([`crate::budget::ClassLimits`], [`fair_tokens`], [`decide`]);
//! `lua/lease.lua` only takes up to a count of tokens under limits passed
//! in, atomically, and records the lease.
//!
//! # Why the limits can be computed before the spend is read
//! A class's caps (its share and the shares below it, of the allowance)
//! depend on the window's first attempts alone, and the spend they bound
//! is a counter the script reads. So this replica computes the caps from
//! the first attempts it last read of the route ([`LastRead`]) and passes
//! them with that count; the script reads the count and the spend as they
//! are now and takes `min(want, fair tokens, ⌊(cap − spent) / cost⌋ for
//! each cap)`. Concurrent Leases through any replica each take against
//! the spend as it is, so the budget stays exact however they interleave.
//!
//! # Staleness is one-sided
//! | first attempts now vs. assumed | the caps are | the script              |
//! |--------------------------------|--------------|-------------------------|
//! | equal                          | exact        | takes                   |
//! | more (a report since)          | too low      | takes, unless a limit held the take back: then `stale` |
//! | fewer (the window slid)        | too high     | `stale`, takes nothing  |
//!
//! A `stale` answer carries what the script read, and the Lease is decided
//! again from it (at most [`MAX_ROUNDS`] times). So a grant is always what
//! the rules give for the counts at the instant of the take, and the
//! cache is only a guess at them: a wrong or missing entry costs a round
//! trip, never a token. A route this replica has not read is assumed to
//! have no first attempts (the lowest caps), which is exact whenever the
//! floor alone does not hold the take back.
//!
//! # Fairness
//! A worker asking within an equal share of the class among its workers
//! gets its demand in full ([`within_equal_share`]), whatever the others
//! ask: the common case needs only what the worker holds, which the script
//! reads. This replica passes the most it may hold for that for a few
//! worker counts from the one it last read, and for the most workers a
//! class tracks ([`COUNTS`]); the script takes the bound for the count it
//! finds, or the nearest conservative one ([`within_equal_share`] is
//! exact for any count no smaller than the fleet). Past it, the script
//! answers `fleet` with the
//! other workers' records instead of taking; the fair share is computed
//! here ([`fair_tokens`]) and passed as a token count, valid while the
//! worker holds what it held. That path costs a second round trip, and its
//! share is of the fleet as read one round trip before (the budget itself
//! is still taken against the spend at the instant).
//!
//! # Round trips
//! One in the common case (a demand within an equal share, first attempts
//! as last read or the floor not binding); two past an equal share or after
//! the window slid.

use std::sync::Mutex;

use redis::Value;
use tokio::sync::oneshot;

use crate::budget::{
    ClassLimits, FairAsk, Grant, GrantAsk, GrantLimit, MAX_WORKERS_PER_CLASS, allowance_of, decide,
    demand_of, fair_tokens, new_lease_id, within_equal_share,
};
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{LeaseOutcome, RouteView, StoreError};

use super::RedisStore;
use super::connection::run_on;
use super::decide::MAX_ROUNDS;
use super::queue::{LeaseQueue, Queued};
use super::reply::Reply;
use super::scripts::SCRIPTS;

/// Routes [`LastRead`] remembers at once: a direct-mapped table, so its
/// memory is fixed however many routes the fleet uses; a route that lost
/// its entry to another costs at most a round trip.
const REMEMBERED: usize = 4096;

/// What this replica last read of a route: the counts its next Lease's
/// limits are computed from.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The route key's hash with its low bit set (0: empty).
    tag: u64,
    /// First attempts in the window.
    first_attempts: u64,
    /// Workers each class tracks.
    tracked: [u32; 3],
}

/// The counts each route's limits were last computed from, by route key.
pub(super) struct LastRead(Box<[Mutex<Entry>]>);

impl Default for LastRead {
    fn default() -> Self {
        LastRead((0..REMEMBERED).map(|_| Mutex::default()).collect())
    }
}

impl LastRead {
    fn slot(&self, route_key: &str) -> (&Mutex<Entry>, u64) {
        use std::hash::BuildHasher as _;
        let hash = foldhash::fast::FixedState::default().hash_one(route_key);
        (&self.0[(hash % REMEMBERED as u64) as usize], hash | 1)
    }

    fn get(&self, route_key: &str) -> Option<Entry> {
        let (slot, tag) = self.slot(route_key);
        let entry = *slot.lock().unwrap_or_else(|e| e.into_inner());
        (entry.tag == tag).then_some(entry)
    }

    /// Remembers what a script read of a route: its first attempts and
    /// the workers each class tracks.
    pub(super) fn put(&self, route_key: &str, first_attempts: u64, tracked: [u32; 3]) {
        let (slot, tag) = self.slot(route_key);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Entry {
            tag,
            first_attempts,
            tracked,
        };
    }
}

/// Worker counts a Lease gives the script a bound on the worker's holding
/// for: the count last read and the next ones, then the most workers a
/// class tracks, whose bound the script takes for any larger count. A
/// bound for the exact count keeps the equal-share shortcut for a demand
/// near the equal share; the last one is valid for any count (the
/// smallest of them all), so a class that grew under the Lease (a fleet
/// starting up) never makes it a round of its own.
const COUNTS: usize = 8;

/// How the worker's fair share is passed to the script.
#[derive(Debug, Clone, Copy)]
enum Fairness {
    /// Within an equal share among the workers the class tracks, at least
    /// `tracked` of them: no limit beyond the demand, if the worker holds
    /// little enough.
    Within { tracked: usize },
    /// `tokens` at most, computed for a worker holding `held`.
    Tokens { tokens: u64, held: u64 },
}

/// What the script did.
const TAKEN: i64 = 0;
const STALE: i64 = 1;
const FLEET: i64 = 2;
const FROZEN: i64 = 3;
const ABSENT: i64 = 4;

/// `lease.lua`'s reply: what it did, and what it read.
struct Read {
    what: i64,
    granted: u32,
    expires_at_ms: i64,
    cooldown_until_ms: i64,
    floor_ms: i64,
    first_attempts: u64,
    spent: [u64; 3],
    own_held: u64,
    tracked: [u32; 3],
    /// The token's own first attempts and spend by class, where several
    /// tokens share the caller scope (0 otherwise).
    mine: u64,
    mine_spent: [u64; 3],
    /// The lease id, the freeze's reason, or the fleet's records.
    tail: Vec<u8>,
}

/// Numbers `lease.lua` reads before its tail.
const HEAD: usize = 17;

impl Read {
    fn of(reply: Value) -> Result<Read, StoreError> {
        let bytes = match reply {
            Value::BulkString(bytes) if bytes.len() >= 8 * HEAD => bytes,
            Value::Array(values) => {
                Reply::ok(values)?;
                return Err(StoreError::Unavailable(
                    "redis lease reply: a list where a string was due".into(),
                ));
            }
            _ => {
                return Err(StoreError::Unavailable(
                    "redis script gave an unexpected reply".into(),
                ));
            }
        };
        let n = |i: usize| number(&bytes, i);
        let u = |i: usize| u64::try_from(n(i)).unwrap_or(0);
        let c = |i: usize| u32::try_from(n(i)).unwrap_or(u32::MAX);
        Ok(Read {
            what: n(0),
            granted: c(1),
            expires_at_ms: n(2),
            cooldown_until_ms: n(3),
            floor_ms: n(4),
            first_attempts: u(5),
            spent: [u(6), u(7), u(8)],
            own_held: u(9),
            tracked: [c(10), c(11), c(12)],
            mine: u(13),
            mine_spent: [u(14), u(15), u(16)],
            tail: bytes[8 * HEAD..].to_vec(),
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.tail).into_owned()
    }

    /// The other workers' demands from a `fleet` reply's records.
    fn demands(&self, now_ms: i64, window_ms: i64) -> Vec<u64> {
        (0..self.tail.len() / 32)
            .filter_map(|w| {
                let at = |i: usize| number(&self.tail, 4 * w + i);
                demand_of(
                    now_ms,
                    window_ms,
                    at(0),
                    Some(at(1)).filter(|&lease| lease >= 0),
                    u64::try_from(at(2)).unwrap_or(0),
                    u64::try_from(at(3)).unwrap_or(0),
                )
            })
            .collect()
    }
}

/// The `i`th little-endian double of `bytes`. Every number is an integer
/// the script computed; `as` truncates as Redis does when it answers a
/// Lua number.
fn number(bytes: &[u8], i: usize) -> i64 {
    let mut at = [0u8; 8];
    at.copy_from_slice(&bytes[8 * i..8 * i + 8]);
    f64::from_le_bytes(at) as i64
}

impl RedisStore {
    pub(super) async fn lease_now(
        &self,
        scope: &ScopeKey,
        ask: GrantAsk<'_>,
        policy: &Policy,
    ) -> Result<LeaseOutcome, StoreError> {
        let tenant = ask.tenant;
        let owner = tenant.owner;
        let (keys, ccd, cfloor) = self.route_keys(&scope.route).await?;
        // A token with a quota takes only a route that exists, until a
        // refusal has it charged (`quota`).
        let mut must_exist = self.quotas.charges(owner);
        let owner_name = self.quotas.name(owner).unwrap_or_default();
        // Where several tokens share the caller scope, the token's own
        // first attempts bound its grants too ("Counts of several
        // tokens" in `crate::budget`): caps on its own spend, computed
        // from its own first attempts as this replica last read them.
        let own_key = (tenant.shared() && !owner_name.is_empty())
            .then(|| format!("{}\u{0}{owner_name}", keys[0]));
        let mut own_first = own_key
            .as_deref()
            .map(|k| self.last_read.get(k).map_or(0, |e| e.first_attempts));
        let id = new_lease_id();
        let class = ask.priority.index();
        let cost = policy.cost(ask.retry_class).max(1);
        let want_milli = u64::from(ask.want).saturating_mul(cost);
        let last = self.last_read.get(&keys[0]);
        let mut first_attempts = last.map_or(0, |e| e.first_attempts);
        // A route not read yet is guessed to be the worker's alone (the
        // class holds at least the asker); a larger fleet takes a bound
        // for a larger count ([`COUNTS`]).
        let mut fairness = Fairness::Within {
            tracked: last.map_or(1, |e| e.tracked[class].max(1) as usize),
        };
        for _ in 0..MAX_ROUNDS {
            let limits = ClassLimits::of(policy, allowance_of(policy, first_attempts), class);
            // The fair tokens, the least the worker may hold for them, the
            // first worker count a bound on its holding is given for, and
            // the bounds for that count and the next ones.
            let (fair, least, from_count, bounds) = match fairness {
                Fairness::Within { tracked } => (
                    u64::from(ask.want),
                    0,
                    tracked,
                    (tracked..tracked + COUNTS - 1)
                        .chain([MAX_WORKERS_PER_CLASS])
                        .map(|n| {
                            within_equal_share(limits.capacity, n, want_milli)
                                .map_or(-1.0, |most| most as f64)
                        })
                        .collect(),
                ),
                Fairness::Tokens { tokens, held } => {
                    (tokens, held, MAX_WORKERS_PER_CLASS, vec![held as f64])
                }
            };
            // The numbers as one string of little-endian doubles, which the
            // script decodes in one step. Each is an integer: a double
            // holds it exactly below 2^53.
            let mut numbers = vec![
                ccd as f64,
                cfloor as f64,
                ask.now_ms as f64,
                self.idle_ms as f64,
                (class + 1) as f64,
                f64::from(ask.want),
                f64::from(policy.window_secs),
                cost as f64,
                policy.lease_ttl_ms as f64,
                first_attempts as f64,
                fair as f64,
                least as f64,
                from_count as f64,
                bounds.len() as f64,
            ];
            numbers.extend(bounds);
            numbers.push(f64::from(u8::from(must_exist)));
            numbers.push(own_first.map_or(-1.0, |n| n as f64));
            for (cap, from) in limits.caps() {
                numbers.extend([cap as f64, (from + 1) as f64]);
            }
            if let Some(own_first) = own_first {
                let own = ClassLimits::of(policy, allowance_of(policy, own_first), class);
                for (cap, from) in own.caps() {
                    numbers.extend([cap as f64, (from + 4) as f64]);
                }
            }
            let packed: Vec<u8> = numbers.iter().flat_map(|n| n.to_le_bytes()).collect();
            let read = Read::of(
                self.take(&keys, packed, ask.worker_id, &id, owner_name)
                    .await?,
            )?;
            if read.what == ABSENT {
                self.charge(owner, &keys[0], ask.now_ms).await?;
                must_exist = false;
                continue;
            }
            self.last_read
                .put(&keys[0], read.first_attempts, read.tracked);
            let now_limits =
                ClassLimits::of(policy, allowance_of(policy, read.first_attempts), class);
            let mut available = now_limits.available(&read.spent);
            if let Some(own_key) = &own_key {
                self.last_read.put(own_key, read.mine, [0; 3]);
                let own = ClassLimits::of(policy, allowance_of(policy, read.mine), class);
                available = available.min(own.available(&read.mine_spent));
            }
            let view = |frozen| RouteView {
                cooldown_until_ms: read.cooldown_until_ms,
                floor_ms: read.floor_ms,
                frozen,
            };
            match read.what {
                TAKEN => {
                    let by_fairness = match fairness {
                        Fairness::Within { .. } => u64::from(ask.want),
                        Fairness::Tokens { tokens, .. } => tokens,
                    };
                    // What the rules give for the counts the script read,
                    // which it took.
                    let decided = decide(ask.want, by_fairness, available, cost);
                    debug_assert_eq!(decided.granted, read.granted, "{scope:?}");
                    let id = read.text();
                    return Ok(LeaseOutcome {
                        lease_id: Some(id).filter(|id| !id.is_empty()),
                        grant: Grant {
                            granted: read.granted,
                            limit: decided.limit,
                            remaining: decided.remaining,
                            expires_at_ms: read.expires_at_ms,
                        },
                        view: view(None),
                    });
                }
                FROZEN => {
                    return Ok(LeaseOutcome {
                        lease_id: None,
                        grant: Grant {
                            granted: 0,
                            limit: GrantLimit::Frozen,
                            remaining: available / cost,
                            expires_at_ms: ask.now_ms,
                        },
                        view: view(Some(read.text())),
                    });
                }
                FLEET => {
                    let demands = read.demands(ask.now_ms, policy.window_ms());
                    let fair = FairAsk {
                        capacity: now_limits.capacity,
                        tracked: read.tracked[class] as usize,
                        own_held: read.own_held,
                        want_milli,
                        cost,
                    };
                    fairness = Fairness::Tokens {
                        tokens: fair_tokens(fair, || demands),
                        held: read.own_held,
                    };
                }
                STALE => {
                    fairness = Fairness::Within {
                        tracked: read.tracked[class].max(1) as usize,
                    };
                }
                other => {
                    return Err(StoreError::Unavailable(format!(
                        "redis lease reply: unknown outcome {other}"
                    )));
                }
            }
            first_attempts = read.first_attempts;
            own_first = own_first.map(|_| read.mine);
        }
        Err(StoreError::Unavailable(format!(
            "redis: the route moved under {MAX_ROUNDS} Leases in a row"
        )))
    }

    /// One `lease.lua` call: on one node through the lease queue, which
    /// sends concurrent ones together; on a cluster alone.
    async fn take(
        &self,
        keys: &[String],
        numbers: Vec<u8>,
        worker: &str,
        id: &str,
        owner: &str,
    ) -> Result<Value, StoreError> {
        self.claimed().await?;
        if self.clustered() {
            let mut inv = SCRIPTS.lease.call(keys);
            inv.arg(&numbers[..]).arg(worker).arg(id).arg(owner);
            return run_on(&self.conn, &inv, self.op_timeout).await;
        }
        let queue = self
            .queue
            .get_or_init(|| LeaseQueue::start(self.conn.clone(), self.op_timeout));
        let (reply, replied) = oneshot::channel();
        queue.push(Queued {
            keys: keys.to_vec(),
            numbers,
            worker: worker.to_owned(),
            id: id.to_owned(),
            owner: owner.to_owned(),
            reply,
        })?;
        match tokio::time::timeout(self.op_timeout, replied).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(StoreError::Unavailable("redis lease queue stopped".into())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {:?}",
                self.op_timeout
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
