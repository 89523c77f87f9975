//! Routes written by earlier versions are read the same: a store upgraded
//! in place keeps every budget window, lease, hint and slot it had. Each
//! test builds a route with this version, rewrites it in Redis the way an
//! earlier version kept it, and checks the next calls answer as on a twin
//! route that was never rewritten.

use crate::budget::{GrantAsk, LeaseEnd};
use crate::hints::{EvidenceInput, assess};
use crate::policy::Policy;
use crate::scope::{Priority, RetryClass, ScopeKey};
use crate::slots::SlotAsk;
use crate::store::{LevelHint, ReportBatch, Store};
use crate::testing::RedisServer;

use super::{RedisOptions, RedisStore, RedisTarget};

const T0: i64 = 1_700_000_000_000;

/// Rewrites route `KEYS[1]` as the version before routes became hashes
/// (90051f1) kept it: one MessagePack blob (`touched`, `lexp`, `fa`, `cls`
/// with each class's `spent` and packed worker records, `hints`, `slots`,
/// `pace`, `frozen`), its expiry kept; and its leases as that version kept
/// them: a hash of MessagePack records by lease id (`…:l`) and the ids by
/// expiry (`…:e`), each lease keeping the id its worker holds.
const AS_PREVIOUS: &str = r"
local key = KEYS[1]
local base = string.sub(key, 1, -2)
local function doubles(v)
  local n = #v / 8
  local t = { struct.unpack('<' .. string.rep('d', n), v) }
  t[n + 1] = nil
  return t
end
local kv = redis.call('HGETALL', key)
local f = {}
for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
local k = doubles(f.k)
-- The core: 5 numbers per series (its head first), 3 worker counts, then
-- touched and the latest lease expiry.
local function series(i, v)
  return { h = k[5 * i + 1], f = doubles(v) }
end
-- A worker's record: its first three numbers, then its pairs (after the
-- seven this version keeps).
local function record(v)
  local d = doubles(v)
  local out = { d[1], d[2], d[3] }
  for j = 8, #d do out[#out + 1] = d[j] end
  return struct.pack('<' .. string.rep('d', #out), unpack(out))
end
local st = {
  touched = k[24], lexp = k[25], fa = series(0, f.fa), cls = {},
  hints = f.h and cmsgpack.unpack(f.h) or { cd = 0, step = 0, bo = 0, recent = {} },
  slots = f.sl and cmsgpack.unpack(f.sl) or { next = 0, pending = {} },
}
if f.p then st.pace = cmsgpack.unpack(f.p) end
if f.z then st.frozen = f.z end
for c = 1, 3 do
  local workers = {}
  for name, v in pairs(f) do
    if string.sub(name, 1, 1) == tostring(c) then workers[string.sub(name, 2)] = record(v) end
  end
  st.cls[c] = { spent = series(c, f['s' .. c]), workers = workers }
end
local ttl = redis.call('PTTL', key)
redis.call('DEL', key)
redis.call('SET', key, cmsgpack.pack(st))
if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
local leases = redis.call('ZRANGE', base .. 'e', 0, -1, 'WITHSCORES')
local lease_ttl = redis.call('PTTL', base .. 'e')
redis.call('DEL', base .. 'e')
for i = 1, #leases, 2 do
  local id, wid = string.match(leases[i], '^([^/]*)/(.*)$')
  local p, g, c, sec = string.match(id, '%.(%d+)%.(%d+)%.(%d+)%.(%-?%d+)$')
  local exp = tonumber(leases[i + 1])
  local l = { w = wid, p = tonumber(p), g = tonumber(g), c = tonumber(c), sec = tonumber(sec), exp = exp }
  redis.call('HSET', base .. 'l', id, cmsgpack.pack(l))
  redis.call('ZADD', base .. 'e', exp, id)
end
if #leases > 0 then
  redis.call('PEXPIRE', base .. 'l', lease_ttl)
  redis.call('PEXPIRE', base .. 'e', lease_ttl)
end
return #leases / 2
";

/// A private Redis, a store on it, and a raw connection to rewrite keys
/// the way an earlier version wrote them.
async fn store_and_raw() -> Option<(RedisServer, RedisStore, redis::aio::MultiplexedConnection)> {
    let server = RedisServer::start()?;
    let store = RedisStore::connect(
        RedisTarget::parse(&server.url()).expect("url"),
        RedisOptions::default(),
    )
    .await
    .expect("connect");
    let conn = redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    Some((server, store, conn))
}

/// Runs `script` on route key `key`; its integer answer.
async fn rewrite(conn: &mut redis::aio::MultiplexedConnection, script: &str, key: &str) -> i64 {
    redis::Script::new(script)
        .key(key)
        .invoke_async(conn)
        .await
        .expect("rewritten")
}

/// Reports by one worker, one a second from `T0`: its first attempts (one
/// more each second), 40 successes and its rejections each, and the hints
/// given in the last.
struct History<'a> {
    worker: &'a str,
    first_attempts: u32,
    rejections: u32,
    seconds: u32,
}

impl History<'_> {
    async fn report(&self, store: &RedisStore, key: &ScopeKey, hints: &[LevelHint], p: &Policy) {
        for s in 0..self.seconds {
            let batch = ReportBatch {
                worker_id: self.worker,
                first_attempts: self.first_attempts + s,
                successes: 40,
                rejections: self.rejections,
                counts_age_ms: 0,
                hints: if s + 1 == self.seconds { hints } else { &[] },
                now_ms: T0 + i64::from(s) * 1000,
            };
            store.report(key, batch, p).await.expect("report");
        }
    }
}

/// What Redis holds at `key`: "string", "hash", …
async fn key_type(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("type")
}

fn ask(worker: &str, priority: Priority, want: u32, now_ms: i64) -> GrantAsk<'_> {
    GrantAsk {
        worker_id: worker,
        priority,
        retry_class: RetryClass::Transient,
        want,
        now_ms,
    }
}

fn end<'a>(worker: &'a str, lease_id: &'a str, spent: u32, now_ms: i64) -> LeaseEnd<'a> {
    LeaseEnd {
        worker_id: worker,
        lease_id,
        spent,
        retry_successes: 0,
        now_ms,
    }
}

/// A route the previous version wrote — budget window, workers of two
/// classes, leases out, a cooldown from a hint, a pending slot, pacing —
/// reads as its twin that this version wrote: the same detail, the same
/// grants, and its leases (ids as that version gave them) release the
/// same. It is a hash once touched.
#[tokio::test]
async fn a_route_the_previous_version_wrote_is_read_the_same() {
    let Some((_server, store, mut conn)) = store_and_raw().await else {
        return;
    };
    let p = Policy::default();
    let (kept, old) = (
        ScopeKey::new("c", "kept", Priority::Normal),
        ScopeKey::new("c", "old", Priority::Normal),
    );
    let input = EvidenceInput {
        http_status: 429,
        retry_after: Some("3"),
        receipt_ms: T0 + 2_000,
        ..EvidenceInput::default()
    };
    let hints = [LevelHint {
        caller_wide: false,
        assessment: assess(&input, &p, T0 + 2_000),
    }];
    let mut leases = Vec::new();
    for key in [&kept, &old] {
        let history = History {
            worker: "w1",
            first_attempts: 50,
            rejections: 2,
            seconds: 3,
        };
        history.report(&store, key, &hints, &p).await;
        let mut ids = Vec::new();
        for (i, (worker, priority)) in [
            ("w1", Priority::Normal),
            ("w2", Priority::Normal),
            ("w3", Priority::Bulk),
        ]
        .into_iter()
        .enumerate()
        {
            let now = T0 + 2_100 + i as i64;
            let out = store
                .lease(key, ask(worker, priority, 3, now), &p)
                .await
                .expect("lease");
            ids.push(out.lease_id.expect("granted"));
        }
        let slot = SlotAsk {
            intent_id: "i1",
            floor_ms: 0,
            deadline_ms: T0 + 60_000,
            reserve_ms: 0,
            now_ms: T0 + 2_200,
            jitter_ppm: 0,
            first_attempt: false,
        };
        store
            .reconsider(&key.route, slot, &p)
            .await
            .expect("reconsider");
        leases.push(ids);
    }
    let old_key = store.route_key(&old.route);
    assert_eq!(rewrite(&mut conn, AS_PREVIOUS, &old_key).await, 3);
    assert_eq!(
        key_type(&mut conn, &old_key).await,
        "string",
        "rewritten as one blob"
    );

    let now = T0 + 2_500;
    let detail = async |key: &ScopeKey| {
        store
            .scope_detail(&key.route, &p, now)
            .await
            .expect("detail")
            .expect("a route")
    };
    let (a, b) = (detail(&kept).await, detail(&old).await);
    assert_eq!(a.summary.view, b.summary.view);
    assert_eq!(a.budget, b.budget);
    assert_eq!(a.pacing, b.pacing);
    assert_eq!(a.route_hints, b.route_hints);
    assert_eq!(a.summary.leases_outstanding, 3);
    assert_eq!(a.summary.waiting, b.summary.waiting);
    assert_eq!(a.summary.last_touched_ms, b.summary.last_touched_ms);
    assert_eq!(
        key_type(&mut conn, &old_key).await,
        "hash",
        "converted on first touch"
    );

    // A lease the previous version granted is released by its id, once.
    let mut returned = Vec::new();
    for (key, ids) in [&kept, &old].into_iter().zip(&leases) {
        returned.push(store.release(key, end("w2", &ids[1], 1, now)).await);
        assert!(
            store
                .release(key, end("w2", &ids[1], 0, now))
                .await
                .is_err()
        );
        assert!(
            store
                .release(key, end("w1", &ids[2], 0, now))
                .await
                .is_err(),
            "another worker's lease"
        );
    }
    assert_eq!(returned[0], returned[1]);
    assert_eq!(returned[0], Ok(2), "3 granted, 1 spent");
    for key in [&kept, &old] {
        for (worker, priority) in [("w1", Priority::Normal), ("w4", Priority::Critical)] {
            store
                .lease(key, ask(worker, priority, 5, now + 10), &p)
                .await
                .expect("lease");
        }
    }
    let (a, b) = (detail(&kept).await, detail(&old).await);
    assert_eq!(a.budget, b.budget);
    assert_eq!(a.budget.leases_outstanding, 4);
    let grant = async |key: &ScopeKey| {
        store
            .lease(key, ask("w2", Priority::Normal, 40, now + 20), &p)
            .await
            .expect("lease")
            .grant
    };
    assert_eq!(grant(&kept).await, grant(&old).await);
}

/// A frozen route the previous version wrote stays frozen and keeps no
/// expiry.
#[tokio::test]
async fn a_frozen_route_the_previous_version_wrote_stays_frozen() {
    let Some((_server, store, mut conn)) = store_and_raw().await else {
        return;
    };
    let key = ScopeKey::new("c", "frozen", Priority::Normal);
    store
        .set_freeze(&key.route, Some("incident".into()), T0)
        .await
        .expect("freeze");
    let route_key = store.route_key(&key.route);
    rewrite(&mut conn, AS_PREVIOUS, &route_key).await;
    let view = store.view(&key.route, T0 + 1).await.expect("view");
    assert_eq!(view.frozen.as_deref(), Some("incident"));
    let out = store
        .lease(
            &key,
            ask("w", Priority::Normal, 1, T0 + 2),
            &Policy::default(),
        )
        .await
        .expect("lease");
    assert_eq!(out.grant.granted, 0);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&route_key)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert_eq!(ttl, -1, "a frozen route never expires");
}

/// A route whose series earlier versions wrote as W-bucket rings (`b`)
/// or as {second, value} pairs (`e`, and a worker's charges in `held`)
/// is read as the same counts.
#[tokio::test]
async fn series_written_by_earlier_versions_read_the_same() {
    let Some((_server, store, mut conn)) = store_and_raw().await else {
        return;
    };
    let p = Policy::default();
    let (kept, rings, pairs) = (
        ScopeKey::new("c", "kept", Priority::Normal),
        ScopeKey::new("c", "rings", Priority::Normal),
        ScopeKey::new("c", "pairs", Priority::Normal),
    );
    // The same history on all three: first attempts over several
    // seconds and a lease.
    for key in [&kept, &rings, &pairs] {
        let history = History {
            worker: "w",
            first_attempts: 40,
            rejections: 0,
            seconds: 5,
        };
        history.report(&store, key, &[], &p).await;
        store
            .lease(key, ask("w", Priority::Normal, 7, T0 + 5_000), &p)
            .await
            .expect("lease");
        let route_key = store.route_key(&key.route);
        if key != &kept {
            rewrite(&mut conn, AS_PREVIOUS, &route_key).await;
        }
    }
    let ring = "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
         local function ring(s)
           local b = {}
           for i = 1, 60 do b[i] = 0 end
           for i = 1, #s.f, 2 do b[(s.f[i] % 60) + 1] = s.f[i + 1] end
           s.b, s.f = b, nil
         end
         ring(st.fa)
         for c = 1, 3 do ring(st.cls[c].spent) end
         redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
         return 1";
    let pairs_form = "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
         local function pairs_of(f)
           local e = {}
           for i = 1, #f, 2 do e[#e + 1] = { f[i], f[i + 1] } end
           return e
         end
         st.fa.e, st.fa.f = pairs_of(st.fa.f), nil
         local charged = 0
         for c = 1, 3 do
           local cls = st.cls[c]
           cls.spent.e, cls.spent.f = pairs_of(cls.spent.f), nil
           for id, packed in pairs(cls.workers) do
             local v = { struct.unpack('<' .. string.rep('d', #packed / 8), packed) }
             local f = {}
             for i = 4, #v - 1 do f[#f + 1] = v[i] end
             charged = charged + #f
             local lease = v[3]
             if lease < 0 then lease = nil end
             cls.workers[id] = { seen = v[1], unmet = v[2], lease = lease, held = pairs_of(f) }
           end
         end
         redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
         return charged";
    rewrite(&mut conn, ring, &store.route_key(&rings.route)).await;
    let charged = rewrite(&mut conn, pairs_form, &store.route_key(&pairs.route)).await;
    assert!(charged > 0, "the lease charged its worker");
    let mut grants = Vec::new();
    for key in [&kept, &rings, &pairs] {
        let out = store
            .lease(key, ask("w", Priority::Normal, 7, T0 + 6_000), &p)
            .await
            .expect("lease");
        grants.push(out.grant);
    }
    assert_eq!(grants[0], grants[1], "read from rings");
    assert_eq!(grants[0], grants[2], "read from pairs");
    assert!(
        grants[0].granted > 0 && grants[0].remaining > 0,
        "{:?}",
        grants[0]
    );
    // The workers' charges too (what fairness weighs).
    let charges = "local kv = redis.call('HGETALL', KEYS[1])
         local total = 0
         for i = 1, #kv, 2 do
           if string.find(string.sub(kv[i], 1, 1), '%d') then
             local packed = kv[i + 1]
             local v = { struct.unpack('<' .. string.rep('d', #packed / 8), packed) }
             -- Seven numbers, then second, milli pairs.
             for j = 9, #v - 1, 2 do total = total + v[j] end
           end
         end
         return total";
    let mut charged = Vec::new();
    for key in [&kept, &rings, &pairs] {
        charged.push(rewrite(&mut conn, charges, &store.route_key(&key.route)).await);
    }
    assert!(charged[0] > 0);
    assert_eq!(charged, [charged[0]; 3], "charges read from every form");
}

/// A Lease adds one member to the route's lease set and leaves the
/// route's hash the same size however many leases are out; and leases an
/// earlier version kept inside the route's value are released as before.
#[tokio::test]
async fn leases_live_beside_the_route_and_old_ones_move_out() {
    let Some((_server, store, mut conn)) = store_and_raw().await else {
        return;
    };
    let p = Policy::default(); // 100 tokens a window: enough for 50
    let key = ScopeKey::new("c", "r", Priority::Normal);
    let route_key = store.route_key(&key.route);
    let lease = async |i: i64| {
        store
            .lease(&key, ask("w", Priority::Normal, 1, T0 + i), &p)
            .await
            .expect("lease")
    };
    let size = "local kv = redis.call('HGETALL', KEYS[1])
         local n = 0
         for i = 1, #kv, 2 do n = n + #kv[i] + #kv[i + 1] end
         return n";
    let first = lease(0).await;
    let one = rewrite(&mut conn, size, &route_key).await;
    let mut last = first.clone();
    for i in 1..50 {
        last = lease(i).await;
    }
    assert_eq!(
        rewrite(&mut conn, size, &route_key).await,
        one,
        "50 leases out, the same route"
    );
    let members: i64 = redis::cmd("ZCARD")
        .arg(format!("{}e", &route_key[..route_key.len() - 1]))
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(members, 50);

    // The last lease as the version before the lease keys kept it: inside
    // the route's value.
    let id = last.lease_id.clone().expect("granted");
    rewrite(&mut conn, AS_PREVIOUS, &route_key).await;
    let inline = redis::Script::new(
        "local base = string.sub(KEYS[1], 1, -2)
         local raw = redis.call('HGET', base .. 'l', ARGV[1])
         redis.call('HDEL', base .. 'l', ARGV[1])
         redis.call('ZREM', base .. 'e', ARGV[1])
         local st = cmsgpack.unpack(redis.call('GET', KEYS[1]))
         st.leases = { [ARGV[1]] = cmsgpack.unpack(raw) }
         st.lexp = nil
         redis.call('SET', KEYS[1], cmsgpack.pack(st), 'KEEPTTL')
         return 1",
    );
    let _: i64 = inline
        .key(&route_key)
        .arg(&id)
        .invoke_async(&mut conn)
        .await
        .expect("written the old way");
    assert_eq!(store.release(&key, end("w", &id, 0, T0 + 100)).await, Ok(1));
    assert!(
        store
            .release(&key, end("w", &id, 0, T0 + 100))
            .await
            .is_err(),
        "once"
    );
    let first_id = first.lease_id.expect("granted");
    assert_eq!(
        store.release(&key, end("w", &first_id, 0, T0 + 100)).await,
        Ok(1)
    );
}
