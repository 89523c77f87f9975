-- Shared by every Tollgate script: the state codec and the budget, hint and
-- slot math. This is a port of src/budget.rs, src/hints.rs and
-- src/slots.rs, line for line where possible: the Rust modules are the
-- reference and the store contract suite (run against both stores) is what
-- proves the two agree. Change one, change the other.
--
-- Numbers: Lua numbers are doubles, exact for integers below 2^53. Times are
-- Unix milliseconds (~2^41), the slot cursor is in microseconds (~2^51) and
-- budgets are milli-tokens, so every value stays exact; `idiv` corrects the
-- one rounding a double division could introduce.
--
-- Time is never read here (no TIME): `now` arrives as an argument from the
-- coordinator's injected clock, so tests control it and the script is a pure
-- function of its keys and arguments (safe to replicate as a script or as
-- its effects).
--
-- State: one MessagePack blob per route key and one per caller-scope key
-- (cmsgpack keeps integers as integers; cjson would print 14 digits and lose
-- the microsecond cursor).

-- The bounds shared with the Rust modules (W, MAX_WORKERS, MAX_LEASES,
-- MAX_PENDING, JITTER_SCALE, RECENT_HINTS, MAX_BACKOFF_STEP) are not written
-- here: RedisStore prepends them from the Rust constants when it loads the
-- scripts, so the two can never drift apart.

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

-- Intents told to ask again whose deadline has not passed (SlotCursor::asking):
-- one that stopped waiting tells nobody, so its deadline ends its count.
local function asking_count(slots, now)
  local n = 0
  for _, d in pairs(slots.asking or {}) do if d > now then n = n + 1 end end
  return n
end

-- Floor division of non-negative integers, exact even where a/b rounds up.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- Euclidean seconds of a millisecond instant (Rust's div_euclid(1000)).
local function sec_of(ms) return math.floor(ms / 1000) end

-- The longest any key is kept without being touched: past every hint
-- (max_hint is at most a day), lease and slot.
local MAX_TTL_MS = 30 * 86400000

local function load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

-- A worker's record (last seen, unmet demand, last lease, charges) is one
-- packed string in the route's value: doubles, last seen, unmet, last lease
-- (-1: none), then its charges as second, milli pairs. Redis's cmsgpack
-- pays per element, and a route shared by a fleet holds a record per
-- worker, so a call unpacks only the records it reads (`worker`, kept in
-- OPEN for the call) and `save` packs them back.
local OPEN = {}

-- {second, value} pairs, as an earlier version wrote them, as a flat list.
local function flatten(pairs_list)
  local f = {}
  for _, pair in ipairs(pairs_list) do
    f[#f + 1] = pair[1]
    f[#f + 1] = pair[2]
  end
  return f
end

local function worker_pack(w)
  return struct.pack('<ddd' .. string.rep('d', #w.f), w.seen, w.unmet, w.lease or -1, unpack(w.f))
end

local function worker_unpack(v)
  if type(v) == 'table' then
    -- As an earlier version wrote it: a map, charges as {second, milli}
    -- pairs in `held`.
    return { seen = v.seen, unmet = v.unmet or 0, lease = v.lease, f = flatten(v.held or {}) }
  end
  local vals = { struct.unpack('<' .. string.rep('d', #v / 8), v) }
  local f = {}
  -- The last value struct.unpack returns is the next position.
  for i = 4, #vals - 1 do f[#f + 1] = vals[i] end
  local lease = vals[3]
  if lease < 0 then lease = nil end
  return { seen = vals[1], unmet = vals[2], lease = lease, f = f }
end

-- Worker `wid`'s record in class `cls`, unpacked once per call (nil: none).
local function worker(cls, wid)
  local open = OPEN[cls]
  if not open then
    open = {}
    OPEN[cls] = open
  end
  local w = open[wid]
  if w == nil and cls.workers[wid] ~= nil then
    w = worker_unpack(cls.workers[wid])
    open[wid] = w
  end
  return w
end

-- When worker `wid` of `cls` was last seen, unpacking nothing else.
local function worker_seen(cls, wid)
  local open = OPEN[cls]
  if open and open[wid] then return open[wid].seen end
  local v = cls.workers[wid]
  if type(v) == 'table' then return v.seen end
  return (struct.unpack('<d', v))
end

local function worker_forget(cls, wid)
  cls.workers[wid] = nil
  if OPEN[cls] then OPEN[cls][wid] = nil end
end

-- Writes `st` with an expiry: idle keys vanish by themselves, but never
-- while something in them is live (a cooldown, a lease, a waiting intent)
-- and never while frozen (an operator's freeze outlives idleness).
local function save(key, st, live_until, now, idle_ms)
  -- A route's value (a caller's holds no workers).
  for _, cls in ipairs(st.cls or {}) do
    for wid, w in pairs(OPEN[cls] or {}) do cls.workers[wid] = worker_pack(w) end
  end
  local blob = cmsgpack.pack(st)
  if st.frozen then
    redis.call('SET', key, blob)
  else
    -- Bounded: an intent may name a deadline far off (it waits only as
    -- long as it keeps asking), and PX takes at most a 64-bit integer.
    local ttl = math.min(idle_ms + math.max(0, live_until - now), MAX_TTL_MS)
    redis.call('SET', key, blob, 'PX', math.max(1, ttl))
  end
end

---------------------------------------------------------------- series
-- A per-second series over the last W seconds: the head second `h` and the
-- seconds in the window that hold something, as one flat list `f` of
-- second, value, second, value, ... oldest first. Every call decodes and
-- re-encodes the route's value, and the codec pays per table: a few numbers
-- in one list, not a ring of W numbers nor a table per pair, keeps it cheap.
-- A worker's charges are such a list too, inside its packed record.

local function series_new(sec) return { h = sec, f = {} } end

-- A series an earlier version wrote as a W-bucket ring (`b`) or as
-- {second, value} pairs (`e`): read once into the flat list.
local function sparse(s)
  if s.b then
    local f = {}
    for back = W - 1, 0, -1 do
      local t = s.h - back
      local v = s.b[(t % W) + 1]
      if v and v ~= 0 then
        f[#f + 1] = t
        f[#f + 1] = v
      end
    end
    s.f, s.b = f, nil
  elseif s.e then
    s.f, s.e = flatten(s.e), nil
  end
end

-- Flat list `f` without its entries older than second `oldest` (entries
-- are appended in order, so only the front can be older).
local function flat_trim(f, oldest)
  if not f[1] or f[1] >= oldest then return f end
  local kept = {}
  for i = 1, #f, 2 do
    if f[i] >= oldest then
      kept[#kept + 1] = f[i]
      kept[#kept + 1] = f[i + 1]
    end
  end
  return kept
end

local function flat_sum(f, oldest)
  local total = 0
  for i = 1, #f, 2 do
    if f[i] >= oldest then total = total + f[i + 1] end
  end
  return total
end

-- Adds `v` at second `sec`, the newest.
local function flat_add(f, sec, v)
  local n = #f
  if n > 0 and f[n - 1] == sec then
    f[n] = f[n] + v
  else
    f[n + 1] = sec
    f[n + 2] = v
  end
end

-- Takes `v` back from second `sec`, never below zero.
local function flat_refund(f, sec, v)
  for i = 1, #f, 2 do
    if f[i] == sec then
      f[i + 1] = math.max(0, f[i + 1] - v)
      return
    end
  end
end

-- The head never moves backwards, so a clock stepping back cannot
-- resurrect spent tokens.
local function advance(s, sec)
  sparse(s)
  if sec <= s.h then return end
  s.h = sec
  s.f = flat_trim(s.f, sec - W + 1)
end

local function s_add(s, sec, v)
  advance(s, sec)
  flat_add(s.f, s.h, v)
  return s.h
end

local function s_refund(s, sec, v)
  sparse(s)
  if sec <= s.h and s.h - sec < W then flat_refund(s.f, sec, v) end
end

local function s_sum(s, sec, window)
  advance(s, sec)
  return flat_sum(s.f, s.h - math.min(window, W) + 1)
end

---------------------------------------------------------------- hints
local function hints_new() return { cd = 0, step = 0, bo = 0, recent = {} } end

local function hints_floor(h) return math.max(h.cd, h.bo) end

-- Until when the state must be kept: its floor, and any mute in force (an
-- operator's mute outlives idleness, like a freeze).
local function hints_live(h)
  local t = hints_floor(h)
  for _, m in pairs(h.mutes or {}) do t = math.max(t, m) end
  return t
end

local function backoff_ms(h, base, max)
  if h.step == 0 then return 0 end
  return math.min(base * 2 ^ math.min(h.step - 1, 40), max)
end

-- A reported success narrows the step; what was imposed stays.
local function decay(h) h.step = math.max(0, h.step - 1) end

-- Fields per hint in a report's ARGV (RedisStore::hint_args): level (1
-- route / 0 caller scope), cooldown until (-1 for none), widen (1/0),
-- anchor, raw (or ''), has_raw, form, valid, capped, clock_skew.
local HINT_FIELDS = 10

local function hint_at(i)
  return {
    route = ARGV[i] == '1', until_ms = tonumber(ARGV[i + 1]),
    widen = ARGV[i + 2] == '1', anchor = tonumber(ARGV[i + 3]),
    raw = ARGV[i + 4], has_raw = ARGV[i + 5] == '1', form = ARGV[i + 6],
    valid = ARGV[i + 7] == '1', capped = ARGV[i + 8] == '1',
    skew = ARGV[i + 9] == '1',
  }
end

---------------------------------------------------------------- corroboration
-- A port of src/hints/corroboration.rs. Per worker: c = claim until, s =
-- streak start, l = last hint, h = hints, o = outliers, u = uncorroborated.
-- R (corr_rules): m = min workers, p = fraction permille, cap = cap ms.

-- The corroboration keys of a report, appended after its hints at `i`.
local function corr_rules(i)
  return { m = tonumber(ARGV[i]), p = tonumber(ARGV[i + 1]), cap = tonumber(ARGV[i + 2]) }
end

local function corr_needed(R, population)
  population = math.max(population, 1)
  local by_fraction = idiv(population * R.p + 999, 1000)
  return math.max(1, math.min(population, math.max(R.m, by_fraction)))
end

-- Rules::needed and evaluate: what the live claims support at `now`.
local function corr_evaluate(workers, R, active, now)
  local claims, alone = {}, 0
  for _, w in pairs(workers) do
    if w.c > now then
      claims[#claims + 1] = w.c
      alone = math.max(alone, math.min(w.c, w.s + R.cap))
    end
  end
  table.sort(claims, function(x, y) return x > y end)
  local needed = corr_needed(R, math.max(active, #claims))
  local corroborated = claims[needed] or 0
  local until_ms = math.max(corroborated, alone)
  local supporting = 0
  for _, c in ipairs(claims) do if c >= until_ms then supporting = supporting + 1 end end
  return {
    u = until_ms, c = (corroborated > 0 and corroborated + HINT_GRANULARITY >= alone) and 1 or 0,
    w = supporting, r = #claims, n = needed,
  }
end

-- Rules::within_typical: the cap no longer than the lower median of the
-- recent claims' lengths (one granularity at least).
local function corr_within_typical(R, recent)
  local lengths = {}
  for _, r in ipairs(recent) do
    if r.cd then lengths[#lengths + 1] = r.cd - r.at end
  end
  if #lengths == 0 then return R end
  table.sort(lengths)
  local typical = math.max(lengths[idiv(#lengths - 1, 2) + 1], HINT_GRANULARITY)
  return { m = R.m, p = R.p, cap = math.min(R.cap, typical) }
end

-- record: a worker's claim, forgetting the longest-silent worker (the
-- smallest id among ties, as a BTreeMap's min_by_key) when full.
local function corr_record(workers, wid, until_ms, anchor, now)
  if not workers[wid] and count(workers) >= MAX_EVIDENCE_WORKERS then
    local oldest, at
    for id, w in pairs(workers) do
      if not at or w.l < at or (w.l == at and id < oldest) then oldest, at = id, w.l end
    end
    if oldest then workers[oldest] = nil end
  end
  local w = workers[wid]
  if not w then
    w = { c = 0, s = 0, l = 0, h = 0, o = 0, u = 0 }
    workers[wid] = w
  end
  if w.c <= now then
    w.s, w.c = anchor, until_ms
  else
    w.c = math.max(w.c, until_ms)
  end
  w.l = math.max(w.l, now)
  return w
end

-- claim: a hint's claim, counted.
local function corr_claim(workers, wid, until_ms, anchor, now)
  local w = corr_record(workers, wid, until_ms, anchor, now)
  w.h = w.h + 1
end

-- judge: counts a claim that outran the cooldown by more than the cap.
-- Returns the claim code (Claim::from_code): 0 none, 1 agreed, 2 outlier,
-- 3 uncorroborated, 4 muted.
local function corr_judge(workers, wid, v, cd, R)
  local w = workers[wid]
  if not w then return 0 end
  if w.c <= cd + R.cap then return 1 end
  if v.r >= v.n then
    w.o = w.o + 1
    return 2
  end
  w.u = w.u + 1
  return 3
end

-- WorkerEvidence::noisy.
local function corr_noisy(w)
  if not w then return false end
  local disagreed = w.o + w.u
  return disagreed >= NOISY_MIN_DISAGREEMENTS and disagreed > math.floor(w.h / 2)
end

local function corr_muted(h, wid, now)
  local m = h.mutes and h.mutes[wid]
  return m ~= nil and m > now
end

-- HintState::reassess: the cooldown = max(current, what the claims
-- support); a cooldown an earlier claim set may outlast that support, and
-- is then not corroborated.
local function corr_reassess(h, R, active, now)
  local v = corr_evaluate(h.workers, R, active, now)
  h.cd = math.max(h.cd, v.u)
  if v.u + HINT_GRANULARITY < h.cd then v.c = 0 end
  h.corr = v
end

-- Merges one assessed hint from worker `wid` (with `active` workers in the
-- route) into `h` (HintState::merge): the claim joins the others and the
-- cooldown = max(current, what the claims support) unless the worker is
-- muted, a hintless rejection widens the backoff step, the evidence is kept
-- in a bounded ring either way. Appends the merge (MERGE_FIELDS: raised
-- 1/0, cooldown, backoff, corroborated 1/0, workers, claim code, noisy 1/0,
-- support moved 1/0) to `out`.
local function merge_hint(out, h, a, now, base, max, wid, active, R)
  local before = h.cd
  local corr_before = (h.corr or { c = 0 }).c
  local claim = 0
  h.workers = h.workers or {}
  local muted = corr_muted(h, wid, now)
  if a.until_ms >= 0 and muted then
    claim = 4
  elseif a.until_ms >= 0 then
    R = corr_within_typical(R, h.recent)
    corr_claim(h.workers, wid, a.until_ms, a.anchor, now)
    corr_reassess(h, R, active, now)
    claim = corr_judge(h.workers, wid, h.corr, h.cd, R)
  elseif a.widen and not muted and h.cd > now then
    -- Refused without a hint while a cooldown holds: the upstream's own
    -- behaviour supports it, to now + cap at most (corroboration::support).
    R = corr_within_typical(R, h.recent)
    corr_record(h.workers, wid, now + R.cap, now, now)
    corr_reassess(h, R, active, now)
  end
  if a.widen then
    h.step = math.min(h.step + 1, MAX_BACKOFF_STEP)
    h.bo = math.max(h.bo, a.anchor + backoff_ms(h, base, max))
  end
  if #h.recent >= RECENT_HINTS then table.remove(h.recent, 1) end
  local rec = {
    at = now, raw = a.raw, has_raw = a.has_raw, form = a.form,
    valid = a.valid, capped = a.capped, skew = a.skew,
  }
  -- The cooldown this hint asked for, so an operator can tell which hint a
  -- scope's cooldown came from.
  if a.until_ms >= 0 then rec.cd = a.until_ms end
  h.recent[#h.recent + 1] = rec
  local raised = 0
  if h.cd > before and h.cd > now then raised = 1 end
  out[#out + 1] = raised
  out[#out + 1] = h.cd
  out[#out + 1] = backoff_ms(h, base, max)
  local v = h.corr or { c = 0, w = 0 }
  out[#out + 1] = v.c
  out[#out + 1] = v.w
  out[#out + 1] = claim
  out[#out + 1] = corr_noisy(h.workers[wid]) and 1 or 0
  -- The cooldown kept its end but its corroboration changed.
  if raised == 0 and h.cd > now and v.c ~= corr_before then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end

-- A caller scope's state about to take a hint: created when absent.
local function caller_for_hint(c, now)
  c = c or { hints = hints_new(), touched = now }
  c.touched = math.max(c.touched, now)
  return c
end

-- Writes a caller scope's state after a report: with a fresh expiry when a
-- hint landed on it, keeping its expiry when only a success narrowed it.
local function caller_save(key, c, merged, now, idle_ms)
  if merged then
    save(key, c, hints_live(c.hints), now, idle_ms)
  else
    redis.call('SET', key, cmsgpack.pack(c), 'KEEPTTL')
  end
end

---------------------------------------------------------------- leases
-- A route's leases live beside its value under the same hash tag: a hash
-- (lease id -> record) and a sorted set (lease id by expiry). A Lease
-- writes its one record instead of decoding and re-encoding every
-- outstanding lease with the route's value.
local LEASE_PURGE = 256

local function lease_keys(route_key)
  local base = string.sub(route_key, 1, -2)
  return base .. 'l', base .. 'e'
end

-- Forgets up to LEASE_PURGE leases expired at `now`; returns how many are
-- live (expiring after now).
local function leases_live(route_key, now)
  local lh, le = lease_keys(route_key)
  local gone = redis.call('ZRANGEBYSCORE', le, '-inf', now, 'LIMIT', 0, LEASE_PURGE)
  if #gone > 0 then
    redis.call('HDEL', lh, unpack(gone))
    redis.call('ZREM', le, unpack(gone))
  end
  return redis.call('ZCOUNT', le, '(' .. now, '+inf')
end

-- Lets `key` expire no sooner than `ms` from now.
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- Records lease `l` (its expiry `l.exp`); the pair of keys lives as long
-- as its longest lease.
local function lease_put(route_key, id, l, now)
  local lh, le = lease_keys(route_key)
  redis.call('HSET', lh, id, cmsgpack.pack(l))
  redis.call('ZADD', le, l.exp, id)
  local ttl = math.max(1, l.exp - now)
  keep_for(lh, ttl)
  keep_for(le, ttl)
end

local function lease_get(route_key, id)
  local lh = lease_keys(route_key)
  local raw = redis.call('HGET', lh, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function lease_drop(route_key, id)
  local lh, le = lease_keys(route_key)
  redis.call('HDEL', lh, id)
  redis.call('ZREM', le, id)
end

-- The live leases' (count, tokens granted), read-only.
local function leases_held(route_key, now)
  local lh, le = lease_keys(route_key)
  local ids = redis.call('ZRANGEBYSCORE', le, '(' .. now, '+inf')
  local tokens = 0
  if #ids > 0 then
    for _, raw in ipairs(redis.call('HMGET', lh, unpack(ids))) do
      if raw then tokens = tokens + cmsgpack.unpack(raw).g end
    end
  end
  return #ids, tokens
end

local function leases_forget(route_key)
  local lh, le = lease_keys(route_key)
  redis.call('DEL', lh, le)
end

---------------------------------------------------------------- route
local function route_new(now)
  local sec = sec_of(now)
  local cls = {}
  for p = 1, 3 do cls[p] = { spent = series_new(sec), workers = {} } end
  return {
    touched = now, fa = series_new(sec), cls = cls, lexp = 0,
    hints = hints_new(), slots = { next = 0, pending = {} },
  }
end

-- Loads the route, creating it (with_route in the memory store).
-- A value written before leases had keys of their own carries them in
-- `st.leases`: the live ones move out.
local function route_upgrade(key, st, now)
  if st.leases then
    st.lexp = 0
    for id, l in pairs(st.leases) do
      if l.exp > now then
        lease_put(key, id, l, now)
        st.lexp = math.max(st.lexp, l.exp)
      end
    end
    st.leases = nil
  end
  return st
end

local function route_get(key, now)
  local st = load(key)
  if not st then return route_new(now) end
  st.touched = math.max(st.touched, now)
  return route_upgrade(key, st, now)
end

-- The instant until which something in the route is live.
local function live_until(st, now)
  -- `lexp`: the latest expiry of any lease granted (a release leaves it).
  local t = math.max(hints_live(st.hints), st.lexp or 0)
  for _, l in pairs(st.leases or {}) do t = math.max(t, l.exp) end
  for _, s in pairs(st.slots.pending) do t = math.max(t, s) end
  for _, d in pairs(st.slots.asking or {}) do t = math.max(t, d) end
  return t
end

-- The caller scope's (cooldown, floor): from its key when the script was
-- given it (one node: read atomically), else from ARGV[1..2] (Redis
-- Cluster: the caller key lives in another slot and was read just before,
-- the same window the memory store has between its two maps).
local function caller_floor()
  if KEYS[2] then
    local c = load(KEYS[2])
    if not c then return 0, 0 end
    return c.hints.cd, hints_floor(c.hints)
  end
  return tonumber(ARGV[1]), tonumber(ARGV[2])
end

---------------------------------------------------------------- budget
-- Policy numbers, in the order RedisStore passes them: window, floor,
-- ratio, ceiling, cost, the three classes' shares, lease ttl.
local function policy_at(i)
  return {
    window = tonumber(ARGV[i]), floor = tonumber(ARGV[i + 1]),
    ratio = tonumber(ARGV[i + 2]), ceiling = tonumber(ARGV[i + 3]),
    cost = math.max(1, tonumber(ARGV[i + 4])),
    shares = { tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7]) },
    ttl = tonumber(ARGV[i + 8]),
  }
end

local function allowance(st, P, now)
  local first = s_sum(st.fa, sec_of(now), P.window)
  local formula = P.floor * P.window + P.ratio * first
  if P.ceiling >= 0 then formula = math.min(formula, P.ceiling * 1000) end
  return formula
end

-- The shares (permille) of class p and every class below it: the most
-- they may spend together (budget::shares_from).
local function shares_from(P, p)
  local s = 0
  for j = p, 3 do s = s + P.shares[j] end
  return s
end

-- Borrowing down, never up (budget::available_of): class p may spend what
-- the tightest "class k and below stay within their shares" bound, for k
-- from critical down to p, leaves.
local function available_of(P, total, spent, p)
  local best = math.huge
  for k = 1, p do
    local used = 0
    for j = k, 3 do used = used + spent[j] end
    best = math.min(best, math.max(0, idiv(total * shares_from(P, k), 1000) - used))
  end
  return best
end

local function class_spent(st, P, now)
  local spent = {}
  for j = 1, 3 do spent[j] = s_sum(st.cls[j].spent, sec_of(now), P.window) end
  return spent
end

-- What class p could reach in the window, borrowing included.
local function class_allowance(st, P, p, now)
  return idiv(allowance(st, P, now) * shares_from(P, p), 1000)
end

local function available(st, P, p, now)
  return available_of(P, allowance(st, P, now), class_spent(st, P, now), p)
end

-- Workers seen in the window over every class (BudgetLedger::active_workers).
local function active_workers(st, now, window_ms)
  local n = 0
  for p = 1, 3 do
    for wid in pairs(st.cls[p].workers) do
      if worker_seen(st.cls[p], wid) > now - window_ms then n = n + 1 end
    end
  end
  return n
end

-- Marks a worker active in a class; beyond MAX_WORKERS the least recently
-- seen is forgotten.
local function touch(cls, wid, now, window_ms)
  if not cls.workers[wid] and count(cls.workers) >= MAX_WORKERS then
    for id in pairs(cls.workers) do
      if worker_seen(cls, id) <= now - window_ms then worker_forget(cls, id) end
    end
    if count(cls.workers) >= MAX_WORKERS then
      local oldest, at
      for id in pairs(cls.workers) do
        local seen = worker_seen(cls, id)
        if not at or seen < at then oldest, at = id, seen end
      end
      if oldest then worker_forget(cls, oldest) end
    end
  end
  local w = worker(cls, wid)
  if not w then
    w = { seen = now, unmet = 0, f = {} }
    cls.workers[wid] = worker_pack(w)
    OPEN[cls][wid] = w
  end
  w.seen = math.max(w.seen, now)
  return w
end

-- Milli-tokens charged to worker record `w` within the window (prunes
-- older ones).
local function held(w, sec, window)
  local oldest = sec - window + 1
  w.f = flat_trim(w.f, oldest)
  return flat_sum(w.f, oldest)
end

local function charge(w, sec, milli)
  flat_add(w.f, sec, milli)
end

-- Water-filling: the smallest demands are met in full and what is left is
-- split evenly among the rest (budget::max_min_share). An unknown demand is
-- math.huge.
local function max_min_share(capacity, own, others)
  table.sort(others)
  local left, n = capacity, #others + 1
  for _, d in ipairs(others) do
    if own <= d then return math.min(own, idiv(left, n)) end
    left = left - math.min(d, idiv(left, n))
    n = n - 1
  end
  return math.min(own, idiv(left, n))
end

-- Appends a level's evidence (EvidenceDetail's input): the corroboration
-- (until, corroborated, workers, reporters, needed), the count of workers
-- that disagreed (a noisy worker always did) then per worker id, claim, since, last, hints, outliers,
-- uncorroborated; then the count of mutes then per mute id, until. Rust
-- picks what to show, so the selection is written once.
local function evidence_out(out, h)
  local v = h.corr or { u = 0, c = 0, w = 0, r = 0, n = 0 }
  out[#out + 1] = v.u
  out[#out + 1] = v.c
  out[#out + 1] = v.w
  out[#out + 1] = v.r
  out[#out + 1] = v.n
  local ids = {}
  for id, w in pairs(h.workers or {}) do
    if w.o + w.u > 0 then ids[#ids + 1] = id end
  end
  table.sort(ids)
  out[#out + 1] = #ids
  for _, id in ipairs(ids) do
    local w = h.workers[id]
    out[#out + 1] = id
    out[#out + 1] = w.c
    out[#out + 1] = w.s
    out[#out + 1] = w.l
    out[#out + 1] = w.h
    out[#out + 1] = w.o
    out[#out + 1] = w.u
  end
  local mutes = {}
  for id, _ in pairs(h.mutes or {}) do mutes[#mutes + 1] = id end
  table.sort(mutes)
  out[#out + 1] = #mutes
  for _, id in ipairs(mutes) do
    out[#out + 1] = id
    out[#out + 1] = h.mutes[id]
  end
end

-- Appends a hint ring to a reply (the Admin API's HintRecord list): the
-- count, then per record at, raw (false when none), form, valid, capped,
-- clock_skew (1/0) and the cooldown it asked for (-1 for none).
local function hints_out(out, h)
  out[#out + 1] = #h.recent
  for _, r in ipairs(h.recent) do
    local raw = false
    if r.has_raw then raw = r.raw end
    out[#out + 1] = r.at
    out[#out + 1] = raw
    out[#out + 1] = r.form
    out[#out + 1] = r.valid and 1 or 0
    out[#out + 1] = r.capped and 1 or 0
    out[#out + 1] = r.skew and 1 or 0
    out[#out + 1] = r.cd or -1
  end
end
