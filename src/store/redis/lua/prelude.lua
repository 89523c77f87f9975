-- Shared by every Tollgate script: the state codec and the budget and hint
-- math. This is a port of src/budget.rs and src/hints.rs, line for line
-- where possible: the Rust modules are the reference and the store
-- contract suite (run against both stores) is what proves the two agree.
-- Change one, change the other. The slots and the pacing controller are
-- decided in Rust alone: scripts only read and write what they keep
-- (`slots` below), never deciding anything from it.
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
-- State: a route is one hash whose fields a call reads and writes only as
-- it needs them ("route" below); its leases are a sorted set beside it
-- ("leases"); a caller scope is one MessagePack blob. Numbers are packed
-- as doubles (struct) or kept by MessagePack (cmsgpack keeps integers as
-- integers; cjson would print 14 digits and lose the microsecond cursor).

-- The bounds shared with the Rust modules (W, MAX_WORKERS, MAX_LEASES,
-- MAX_PENDING, RECENT_HINTS, MAX_BACKOFF_STEP) are not written
-- here: RedisStore prepends them from the Rust constants when it loads the
-- scripts, so the two can never drift apart.

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
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

-- A caller scope's value.
local function load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

-- Writes a caller scope's value with an expiry: idle keys vanish by
-- themselves, but never while something in them is live (a cooldown, a
-- mute).
local function save(key, st, live_until, now, idle_ms)
  -- Bounded: PX takes at most a 64-bit integer.
  local ttl = math.min(idle_ms + math.max(0, live_until - now), MAX_TTL_MS)
  redis.call('SET', key, cmsgpack.pack(st), 'PX', math.max(1, ttl))
end

-- struct formats of n little-endian doubles, built once per n.
local DOUBLES = {}
local function doubles_fmt(n)
  local f = DOUBLES[n]
  if not f then
    f = '<' .. string.rep('d', n)
    DOUBLES[n] = f
  end
  return f
end

-- The doubles packed in string `v`, as a list (built at its size by the
-- table constructor: a list grown one element at a time costs Redis's Lua
-- far more).
local function doubles(v)
  local n = #v / 8
  local t = { struct.unpack(doubles_fmt(n), v) }
  -- The last value struct.unpack returns is the next position.
  t[n + 1] = nil
  return t
end

local function doubles_pack(t)
  return struct.pack(doubles_fmt(#t), unpack(t))
end

---------------------------------------------------------------- series
-- Second, value pairs in one flat list, oldest first (a per-second series
-- over the last W seconds; a worker's charges). Stored packed as doubles
-- (`doubles`); a call decodes them only when it must (`series_pairs`,
-- `record_pairs`).

-- Drops the pairs older than second `oldest`, in place (pairs are
-- appended in order, so only the front can be older).
local function flat_trim(f, oldest)
  if not f[1] or f[1] >= oldest then return end
  local n, j = #f, 1
  for i = 1, n, 2 do
    if f[i] >= oldest then
      f[j], f[j + 1] = f[i], f[i + 1]
      j = j + 2
    end
  end
  for i = j, n do f[i] = nil end
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

-- Takes `v` back from second `sec`, never below zero; what it took.
local function flat_refund(f, sec, v)
  for i = 1, #f, 2 do
    if f[i] == sec then
      local taken = math.min(v, f[i + 1])
      f[i + 1] = f[i + 1] - taken
      return taken
    end
  end
  return 0
end

-- Packed pairs `raw` with `v` added at second `sec`, the newest, whose
-- last pair is (`last`, `last_v`): the last pair's value rewritten, or a
-- pair appended, without decoding the rest.
local function packed_add(raw, last, last_v, sec, v)
  if last == sec then return string.sub(raw, 1, -9) .. struct.pack('<d', last_v + v) end
  return raw .. struct.pack('<dd', sec, v)
end

---------------------------------------------------------------- records
-- A worker's record: last seen, unmet demand, last lease (-1: none), then
-- its charges' total, first second, last second (-1: none) and last
-- value (RECORD_HEAD, what most calls need), then the charges' pairs. A
-- call unpacks the head only, and the pairs when it must trim or refund.

local RECORD_HEAD = '<ddddddd'

local function record_unpack(raw)
  local seen, unmet, lease, t, first, last, last_v = struct.unpack(RECORD_HEAD, raw)
  return {
    seen = seen, unmet = unmet, lease = lease, t = t, first = first, last = last,
    last_v = last_v, raw = raw,
  }
end

-- The charges' pairs, decoded once per call.
local function record_pairs(w)
  if not w.f then w.f = doubles(string.sub(w.raw, 57)) end
  return w.f
end

local function record_pack(w)
  local tail
  if w.f then
    local f, t = w.f, 0
    for i = 2, #f, 2 do t = t + f[i] end
    local n = #f
    w.t = t
    if n > 0 then w.first, w.last, w.last_v = f[1], f[n - 1], f[n] else w.first, w.last, w.last_v = -1, -1, 0 end
    tail = doubles_pack(f)
  else
    tail = w.tail or string.sub(w.raw, 57)
  end
  return struct.pack(RECORD_HEAD, w.seen, w.unmet, w.lease, w.t, w.first, w.last, w.last_v) .. tail
end

local function record_new(now)
  return { seen = now, unmet = 0, lease = -1, t = 0, first = -1, last = -1, last_v = 0, raw = '', tail = '' }
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
-- A route's leases live beside it under the same hash tag: a sorted set
-- (`…:e`) of leases by expiry. Each member is the lease id its worker
-- holds, `/`, and that worker's id; the id ends in what a Release needs
-- (`.class.granted.cost.second`, the second charged). So a grant is one
-- ZADD, a Release one ZSCORE, and only a member Redis holds counts: an id
-- that was never granted, or is named by another worker, finds nothing.
--
-- The route's core counts the members (`lc`, expired ones included until
-- purged) and says until when the set's expiry is set (`ez`), so a grant
-- is one ZADD: the set is purged (and counted exactly) every
-- LEASE_PURGE_MS, or whenever the count reaches MAX_LEASES, where the bound
-- is decided on the exact count; its expiry is pushed out only when a
-- lease outlives it.

-- How often a route's set drops its expired leases (it holds at most that
-- long's worth more than its live ones), and how far past its longest
-- lease the set's expiry is set (so most grants leave it be).
local LEASE_PURGE_MS = 250
local LEASE_SLACK_MS = 1000

local function lease_key(route_key)
  return string.sub(route_key, 1, -2) .. 'e'
end

-- The id of a lease of `granted` tokens of class `p` at `cost` each,
-- charged to second `sec`, from the coordinator's unique `prefix`.
local function lease_id(prefix, p, granted, cost, sec)
  return string.format('%s.%d.%d.%d.%d', prefix, p, granted, cost, sec)
end

-- Lease `id` as worker `wid` names it: { w, p, g, c, sec, exp, member }
-- or nil.
local function lease_find(route_key, id, wid)
  -- A `/` would let an id and a worker id name another pair's member.
  if string.find(id, '/', 1, true) then return nil end
  local member = id .. '/' .. wid
  local exp = redis.call('ZSCORE', lease_key(route_key), member)
  if not exp then return nil end
  local p, g, c, sec = string.match(id, '%.(%d+)%.(%d+)%.(%d+)%.(%-?%d+)$')
  if not sec then return nil end
  return {
    w = wid, p = tonumber(p), g = tonumber(g), c = tonumber(c), sec = tonumber(sec),
    exp = tonumber(exp), member = member,
  }
end

-- The live leases' (count, tokens granted), read-only.
local function leases_held(route_key, now)
  local members = redis.call('ZRANGEBYSCORE', lease_key(route_key), '(' .. now, '+inf')
  local tokens = 0
  for _, m in ipairs(members) do
    local g = string.match(m, '^[^/]*%.%d+%.(%d+)%.%d+%.%-?%d+/')
    if g then tokens = tokens + tonumber(g) end
  end
  return #members, tokens
end

local function leases_forget(route_key)
  redis.call('DEL', lease_key(route_key))
end

---------------------------------------------------------------- slots
-- A route's slots live beside it under the same hash tag: its pending
-- slots (`…:p`, intents scored by their slot) and the intents told to ask
-- again (`…:a`, scored by their deadline), both sorted sets, and its
-- cursor in the route's hash (`cu`). Which slot an intent gets is decided
-- in Rust (slots::plan, with the pacing controller): slot_read.lua reads
-- what the decision needs, slot_commit.lua applies what it decided if
-- nothing it read has moved since. No script decides anything here.
local function slot_keys(route_key)
  local base = string.sub(route_key, 1, -2)
  return base .. 'p', base .. 'a'
end

local function slots_forget(route_key)
  local sp, sa = slot_keys(route_key)
  redis.call('DEL', sp, sa)
end

-- Intents told to ask again whose deadline is after `now`, and pending
-- slots after `now`: who is waiting on the route.
local function slots_waiting(route_key, now)
  local sp, sa = slot_keys(route_key)
  local after = '(' .. now
  return redis.call('ZCOUNT', sa, after, '+inf'), redis.call('ZCOUNT', sp, after, '+inf')
end

-- Lets `key` expire no sooner than `ms` from now.
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

---------------------------------------------------------------- route
-- A route is one hash (its `…:r` key), so a call reads and writes only the
-- fields it needs, not a blob of the whole route:
--   k          the core (`core_pack`): last touched, the latest lease
--              expiry, the cooldown and the backoff floor, until when the
--              hints and the slot cursor hold something live, how many
--              workers each class tracks, the lease set's count, next
--              purge and expiry, and the expiry set on this key — what a
--              Lease needs from the parts below without decoding them
--   z          the freeze reason (absent: not frozen)
--   fa         first attempts, a series; s1, s2, s3 each class's spend
--   h          the hints (MessagePack), read the first time a script
--              touches st.hints (Report and an operator's calls)
--   cu, p, pv  the slot cursor (Unix µs), the pacing state (bytes only
--              Rust reads, PacingState::encode) and its version, which
--              every write of either bumps (`slots` below)
--   1<id>, 2<id>, 3<id>   worker <id>'s record in class 1, 2 or 3
-- A call names the fields it reads when it opens the route (one HMGET);
-- `route_save` writes back the core, the series that changed, the parts
-- and worker records the call read, and pushes the key's expiry out when
-- it must.

-- How far past what it needs a key's expiry is set, so most writes leave
-- it be.
local EXPIRY_SLACK_MS = 1000

-- The core: series numbers (5 per series, k[1..20]), the workers each
-- class tracks (k[20 + p]), then the route's own numbers, by name. One
-- table, read and written by one struct.unpack and struct.pack.
local CORE = '<' .. 'ddddddddddddddddddddddddddddddddd'

local function core_unpack(raw)
  local s0h, s0l, s0v, s0w, s0s, s1h, s1l, s1v, s1w, s1s, s2h, s2l, s2v, s2w, s2s,
    s3h, s3l, s3v, s3w, s3s, n1, n2, n3, t, x, cd, bo, hl, sl, lc, lp, ez, er =
    struct.unpack(CORE, raw)
  return {
    s0h, s0l, s0v, s0w, s0s, s1h, s1l, s1v, s1w, s1s, s2h, s2l, s2v, s2w, s2s,
    s3h, s3l, s3v, s3w, s3s, n1, n2, n3,
    t = t, x = x, cd = cd, bo = bo, hl = hl, sl = sl, lc = lc, lp = lp, ez = ez, er = er,
  }
end

local function core_pack(k)
  return struct.pack(CORE, k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10],
    k[11], k[12], k[13], k[14], k[15], k[16], k[17], k[18], k[19], k[20], k[21], k[22], k[23],
    k.t, k.x, k.cd, k.bo, k.hl, k.sl, k.lc, k.lp, k.ez, k.er)
end

-- A core for a route created at `now`: its series start at now's second.
local function core_new(now)
  local sec = sec_of(now)
  return {
    sec, -1, 0, -1, 0, sec, -1, 0, -1, 0, sec, -1, 0, -1, 0, sec, -1, 0, -1, 0, 0, 0, 0,
    t = now, x = 0, cd = 0, bo = 0, hl = 0, sl = 0, lc = 0, lp = 0, ez = 0, er = 0,
  }
end

-- The MessagePack parts read on first touch: their field and what an
-- absent one reads as.
local PARTS = {
  hints = { f = 'h', new = hints_new },
}

-- The raw field `f` of route `st`: read by the opening HMGET, else now
-- (false: absent).
local function route_raw(st, f)
  local raw = st.raw[f]
  if raw == nil then
    if st.fresh then raw = false else raw = redis.call('HGET', st.key, f) end
    st.raw[f] = raw
  end
  return raw
end

local ROUTE = {
  __index = function(st, name)
    local part = PARTS[name]
    if not part then return nil end
    local raw = route_raw(st, part.f)
    local v
    if raw then v = cmsgpack.unpack(raw) else v = part.new() end
    if v ~= nil then rawset(st, name, v) end
    return v
  end,
}

-- Series 0 is the first attempts, 1..3 each class's spend.
local SERIES_FIELD = { [0] = 'fa', 's1', 's2', 's3' }

-- Series i's packed pairs, read from the route's hash when a call first
-- needs them.
local function series_raw(st, i)
  local raw = st.raw_of[i]
  if not raw then
    raw = route_raw(st, SERIES_FIELD[i]) or ''
    st.raw_of[i] = raw
  end
  return raw
end

-- Series i's pairs, decoded once per call.
local function series_pairs(st, i)
  local f = st.pairs[i]
  if not f then
    f = doubles(series_raw(st, i))
    st.pairs[i] = f
  end
  return f
end

-- A per-second series lives in two places: its numbers in the route's
-- core (`core_pack`; series i at k[5i+1..5i+5]: its head second, its last
-- pair's second (-1: none) and value, and the window sum it was last
-- asked for — over k[5i+4] seconds (-1: none), k[5i+5]) and its pairs in a
-- field of the route's hash (SERIES_FIELD). A call in the same second with
-- the same window reads the sum without decoding anything; the pairs are
-- decoded (`series_pairs`) only to move the head or to recount.

-- The head never moves backwards, so a clock stepping back cannot
-- resurrect spent tokens.
local function advance(st, i, sec)
  local k, b = st.k, 5 * i
  if sec <= k[b + 1] then return end
  flat_trim(series_pairs(st, i), sec - W + 1)
  k[b + 1], k[b + 4] = sec, -1
  st.dirty[i] = true
end

local function s_sum(st, i, sec, window)
  advance(st, i, sec)
  local k, b = st.k, 5 * i
  if k[b + 4] ~= window then
    k[b + 5] = flat_sum(series_pairs(st, i), k[b + 1] - math.min(window, W) + 1)
    k[b + 4] = window
  end
  return k[b + 5]
end

-- Adds `v` at the head second (after `sec`); the second it landed in.
local function s_add(st, i, sec, v)
  advance(st, i, sec)
  local k, b = st.k, 5 * i
  local h = k[b + 1]
  local f = st.pairs[i]
  if f then
    flat_add(f, h, v)
  else
    st.raw_of[i] = packed_add(series_raw(st, i), k[b + 2], k[b + 3], h, v)
    if k[b + 2] == h then k[b + 3] = k[b + 3] + v else k[b + 2], k[b + 3] = h, v end
  end
  -- The head second is inside every window.
  if k[b + 4] >= 0 then k[b + 5] = k[b + 5] + v end
  st.dirty[i] = true
  return h
end

local function s_refund(st, i, sec, v)
  local k, b = st.k, 5 * i
  if sec <= k[b + 1] and k[b + 1] - sec < W then
    local taken = flat_refund(series_pairs(st, i), sec, v)
    if k[b + 4] >= 0 and sec >= k[b + 1] - math.min(k[b + 4], W) + 1 then
      k[b + 5] = k[b + 5] - taken
    end
    st.dirty[i] = true
  end
end

-- Series i's pairs, packed, its last pair into the core.
local function series_flush(st, i)
  local f = st.pairs[i]
  if not f then return series_raw(st, i) end
  local k, b, n = st.k, 5 * i, #f
  if n > 0 then k[b + 2], k[b + 3] = f[n - 1], f[n] else k[b + 2], k[b + 3] = -1, 0 end
  return doubles_pack(f)
end

local function route_of(key, now, k, frozen, fresh)
  return setmetatable({
    key = key, now = now, k = k, frozen = frozen, z0 = frozen, fresh = fresh,
    -- Raw fields read; series' packed pairs, decoded pairs and which
    -- changed; unpacked worker records, forgotten workers.
    raw = {}, raw_of = {}, pairs = {}, dirty = {}, w = {}, gone = {},
  }, ROUTE)
end

-- A new route (with_route in the memory store): its series start at now
-- and are written with it.
local function route_new(key, now)
  local st = route_of(key, now, core_new(now), false, true)
  for i = 0, 3 do
    st.raw_of[i] = ''
    st.dirty[i] = true
  end
  return st
end

-- HSETs `args` (field, value, ...) on `key`, a bounded number at a time
-- (unpack has a bounded stack).
local function hset(key, args)
  local n = #args
  for i = 1, n, 400 do
    redis.call('HSET', key, unpack(args, i, math.min(i + 399, n)))
  end
end

-- The field of worker `wid` in class p is CLASS_KEY[p] .. wid.
local CLASS_KEY = { '1', '2', '3' }
local CLASS_OF = { ['1'] = 1, ['2'] = 2, ['3'] = 3 }

-- Route `key` with its core, its freeze and the fields named in `extra`
-- read in one HMGET; nil when there is none.
local function route_open(key, now, extra)
  local got = redis.call('HMGET', key, 'k', 'z', unpack(extra))
  if not got[1] then return nil end
  local st = route_of(key, now, core_unpack(got[1]), got[2], false)
  for i = 1, #extra do st.raw[extra[i]] = got[i + 2] end
  return st
end

-- Opens the route, creating it (with_route in the memory store).
local function route_get(key, now, extra)
  local st = route_open(key, now, extra)
  if not st then return route_new(key, now) end
  st.k.t = math.max(st.k.t, now)
  return st
end

-- The instant until which something in the route is live (a cooldown or
-- backoff, a mute, a lease, a pending slot, an intent asking).
local function route_live(st)
  local k = st.k
  return math.max(k.hl, k.sl, k.x)
end

-- Writes back what the call read or changed (the core always), and keeps
-- the key at least until `idle_ms` past the last instant something in it
-- is live (idle keys vanish by themselves), never expiring while frozen
-- (an operator's freeze outlives idleness). The expiry is only ever pushed
-- out, EXPIRY_SLACK_MS past what is needed, so most writes leave it be.
local function route_save(st, idle_ms)
  local k, now = st.k, st.now
  local hints = rawget(st, 'hints')
  if hints then k.cd, k.bo, k.hl = hints.cd, hints.bo, hints_live(hints) end
  local expire
  if st.frozen then
    if k.er ~= -1 then expire, k.er = -1, -1 end
  else
    -- Bounded: an intent may name a deadline far off (it waits only as
    -- long as it keeps asking), and PX takes at most a 64-bit integer.
    local until_ms = now + math.max(1, math.min(idle_ms + math.max(0, route_live(st) - now), MAX_TTL_MS))
    if k.er == -1 or until_ms > k.er then
      k.er = until_ms + EXPIRY_SLACK_MS
      expire = k.er - now
    end
  end
  local args = {}
  for i in pairs(st.dirty) do
    args[#args + 1] = SERIES_FIELD[i]
    args[#args + 1] = series_flush(st, i)
  end
  args[#args + 1] = 'k'
  args[#args + 1] = core_pack(k)
  -- A part is in `st` once read (or set, like a new pacing state).
  for name, part in pairs(PARTS) do
    local v = rawget(st, name)
    if v ~= nil then
      args[#args + 1] = part.f
      args[#args + 1] = cmsgpack.pack(v)
    end
  end
  for f, w in pairs(st.w) do
    args[#args + 1] = f
    args[#args + 1] = record_pack(w)
  end
  local gone = {}
  for f in pairs(st.gone) do gone[#gone + 1] = f end
  if (st.frozen or false) ~= (st.z0 or false) then
    if st.frozen then
      args[#args + 1] = 'z'
      args[#args + 1] = st.frozen
    else
      gone[#gone + 1] = 'z'
    end
  end
  hset(st.key, args)
  for i = 1, #gone, 400 do
    redis.call('HDEL', st.key, unpack(gone, i, math.min(i + 399, #gone)))
  end
  if expire == -1 then
    redis.call('PERSIST', st.key)
  elseif expire then
    redis.call('PEXPIRE', st.key, expire)
  end
end

-- The caller scope's (cooldown, floor): from its key when the script was
-- given it (one node: read atomically), else the values given (Redis
-- Cluster: the caller key lives in another slot and was read just before,
-- the same window the memory store has between its two maps).
local function caller_floor(ccd, cfloor)
  if KEYS[2] then
    local c = load(KEYS[2])
    if not c then return 0, 0 end
    return c.hints.cd, hints_floor(c.hints)
  end
  return ccd, cfloor
end

-- Live leases in the route's set: its count, exact when it was just
-- purged (a purge is due, or the count reached the bound).
local function leases_live(st, now)
  local k = st.k
  if k.lc < MAX_LEASES and now < k.lp then return k.lc end
  local le = lease_key(st.key)
  redis.call('ZREMRANGEBYSCORE', le, '-inf', now)
  k.lc = redis.call('ZCARD', le)
  k.lp = now + LEASE_PURGE_MS
  -- A set re-created since its expiry was set (evicted, say) has none.
  if k.lc > 0 and k.ez > now then redis.call('PEXPIRE', le, k.ez - now) end
  return k.lc
end

-- Records lease `id` of worker `wid`, expiring at `exp`: the set lives
-- at least as long as its longest lease.
local function lease_put(st, id, wid, exp, now)
  local k = st.k
  local le = lease_key(st.key)
  redis.call('ZADD', le, exp, id .. '/' .. wid)
  k.lc = k.lc + 1
  -- A set that had no member is new and has no expiry yet.
  if k.lc == 1 or exp > k.ez then
    k.ez = exp + LEASE_SLACK_MS
    redis.call('PEXPIRE', le, k.ez - now)
  end
end

-- Ends lease `l` (lease_find's).
local function lease_drop(st, l)
  local le = lease_key(st.key)
  redis.call('ZREM', le, l.member)
  -- The last member gone takes the set (and its expiry) with it.
  st.k.lc = redis.call('ZCARD', le)
end

---------------------------------------------------------------- workers
-- Worker `wid`'s record in class p (field `p .. wid` in the route's hash),
-- unpacked once per call and written back by route_save (nil: none).
local function worker(st, p, wid)
  local f = CLASS_KEY[p] .. wid
  local w = st.w[f]
  if w or st.gone[f] then return w end
  local raw = route_raw(st, f)
  if not raw then return nil end
  w = record_unpack(raw)
  st.w[f] = w
  return w
end

-- Every worker class p tracks (a set of ids). The first call reads the
-- whole hash: only the water-filling, a full class, active-worker counts
-- and an operator's reads need the fleet. It recounts each class too.
local function class_workers(st, p)
  if not st.ids then
    local ids = { {}, {}, {} }
    st.ids = ids
    if not st.fresh then
      local kv = redis.call('HGETALL', st.key)
      for i = 1, #kv, 2 do
        local f = kv[i]
        local c = CLASS_OF[string.sub(f, 1, 1)]
        if c then
          if st.raw[f] == nil then st.raw[f] = kv[i + 1] end
          ids[c][string.sub(f, 2)] = true
        end
      end
    end
    for f in pairs(st.w) do ids[CLASS_OF[string.sub(f, 1, 1)]][string.sub(f, 2)] = true end
    for f in pairs(st.gone) do ids[CLASS_OF[string.sub(f, 1, 1)]][string.sub(f, 2)] = nil end
    for c = 1, 3 do st.k[20 + c] = count(ids[c]) end
  end
  return st.ids[p]
end

-- When worker `wid` of class p was last seen (after class_workers), unpacking
-- nothing else.
local function worker_seen(st, p, wid)
  local f = CLASS_KEY[p] .. wid
  local w = st.w[f]
  if w then return w.seen end
  return (struct.unpack('<d', st.raw[f]))
end

local function worker_forget(st, p, wid)
  local f = CLASS_KEY[p] .. wid
  st.w[f] = nil
  st.gone[f] = true
  if st.ids then st.ids[p][wid] = nil end
  st.k[20 + p] = st.k[20 + p] - 1
end

-- Workers seen in the window over every class (BudgetLedger::active_workers).
local function active_workers(st, now, window_ms)
  local n = 0
  for p = 1, 3 do
    for wid in pairs(class_workers(st, p)) do
      if worker_seen(st, p, wid) > now - window_ms then n = n + 1 end
    end
  end
  return n
end

-- Marks a worker active in class p; beyond MAX_WORKERS the least recently
-- seen is forgotten.
local function touch(st, p, wid, now, window_ms)
  local w = worker(st, p, wid)
  if not w and st.k[20 + p] >= MAX_WORKERS then
    local ids = class_workers(st, p)
    for id in pairs(ids) do
      if worker_seen(st, p, id) <= now - window_ms then worker_forget(st, p, id) end
    end
    if st.k[20 + p] >= MAX_WORKERS then
      local oldest, at
      for id in pairs(ids) do
        local seen = worker_seen(st, p, id)
        if not at or seen < at then oldest, at = id, seen end
      end
      if oldest then worker_forget(st, p, oldest) end
    end
  end
  if not w then
    local f = CLASS_KEY[p] .. wid
    w = record_new(now)
    st.w[f] = w
    st.gone[f] = nil
    if st.ids then st.ids[p][wid] = true end
    st.k[20 + p] = st.k[20 + p] + 1
  end
  if now > w.seen then w.seen = now end
  return w
end

-- Milli-tokens charged to worker record `w` within the window (prunes
-- older ones): the total, unless some charge is older.
local function held(w, sec, window)
  local oldest = sec - window + 1
  if w.first < 0 or w.first >= oldest then return w.t end
  local f = record_pairs(w)
  flat_trim(f, oldest)
  w.t, w.first = flat_sum(f, oldest), f[1] or -1
  return w.t
end

-- Charges `milli` at second `sec`, the newest.
local function charge(w, sec, milli)
  if w.f then
    flat_add(w.f, sec, milli)
  else
    w.tail = packed_add(w.tail or string.sub(w.raw, 57), w.last, w.last_v, sec, milli)
    if w.last == sec then w.last_v = w.last_v + milli else w.last, w.last_v = sec, milli end
    if w.first < 0 then w.first = sec end
  end
  w.t = w.t + milli
end

-- Takes `milli` back from second `sec`.
local function record_refund(w, sec, milli)
  w.t = w.t - flat_refund(record_pairs(w), sec, milli)
end

---------------------------------------------------------------- budget
-- The policy from a Lease's numbers `a` at `i`, in the order RedisStore
-- packs them: window, floor, ratio, ceiling, cost, the three classes'
-- shares, lease ttl.
local function policy_of(a, i)
  return {
    window = a[i], floor = a[i + 1], ratio = a[i + 2], ceiling = a[i + 3],
    cost = math.max(1, a[i + 4]), shares = { a[i + 5], a[i + 6], a[i + 7] }, ttl = a[i + 8],
  }
end

local function allowance(st, P, now)
  local first = s_sum(st, 0, sec_of(now), P.window)
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
  local sec = sec_of(now)
  return { s_sum(st, 1, sec, P.window), s_sum(st, 2, sec, P.window), s_sum(st, 3, sec, P.window) }
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
