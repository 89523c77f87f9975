-- Shared by every Tollgate script: the state codec and the atomic
-- primitives on it (add to a window, take tokens under limits passed in,
-- refund, read a route). No script decides anything: the budget, the hints
-- and cooldowns, the slots and the pacing controller are decided in Rust,
-- by the code the memory store runs, and scripts only read and write what
-- Rust keeps or take under limits Rust computed.
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
-- ("leases"); a caller scope is a hash of what Rust decided about its
-- hints ("hints"). Numbers are packed as doubles (struct).

-- The bounds shared with the Rust modules (W, MAX_WORKERS, MAX_LEASES,
-- MAX_PENDING) are not written
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

-- How long a key must be kept: `idle_ms` past the last instant something
-- in it is live (idle keys vanish by themselves, never while a cooldown, a
-- mute or a lease holds), and never past MAX_TTL_MS (PX takes at most a
-- 64-bit integer).
local function keep_ms(live_until, now, idle_ms)
  return math.max(1, math.min(idle_ms + math.max(0, live_until - now), MAX_TTL_MS))
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
-- A level's hints (a route's, or a whole caller scope's for uncertain
-- evidence) are decided in Rust (HintState: cooldown merging,
-- corroboration, backoff, mutes) and kept as bytes only Rust reads, with a
-- version every write bumps: `h` and `hv` in the route's hash, or in the
-- caller scope's hash (`…:c`) beside what Rust decided from them — `cd`
-- the cooldown, `fl` the floor (cooldown or backoff), `hl` until when
-- something in them is live, `t` when last touched. hints_read.lua reads
-- them, hints_commit.lua writes what Rust decided if the version is the
-- one read.

-- The caller scope's (version, hints) at `key` (0, false: none).
local function caller_hints(key)
  local got = redis.call('HMGET', key, 'hv', 'h')
  return tonumber(got[1] or 0), got[2] or false
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
-- Pending slots by intent (score: the slot), intents told to ask again
-- (score: the deadline) and the instants they were told to ask again at
-- (score: the instant; only for call-backs, so trimmed once overdue).
local function slot_keys(route_key)
  local base = string.sub(route_key, 1, -2)
  return base .. 'p', base .. 'a', base .. 'q'
end

local function slots_forget(route_key)
  local sp, sa, sq = slot_keys(route_key)
  redis.call('DEL', sp, sa, sq)
end

-- Intents told to ask again whose deadline is after `now`, and pending
-- slots after `now`: who is waiting on the route.
local function slots_waiting(route_key, now)
  local sp, sa = slot_keys(route_key)
  local after = '(' .. now
  return redis.call('ZCOUNT', sa, after, '+inf'), redis.call('ZCOUNT', sp, after, '+inf')
end

-- Appends what Rust decides a route's hints and pacing from
-- (RouteRead): its freeze, the hints' version and bytes, the pacing's
-- version and bytes (false: none), and the intents asking.
local function route_state_out(out, st, now)
  out[#out + 1] = st.frozen or false
  out[#out + 1] = tonumber(st.raw.hv or 0)
  out[#out + 1] = st.raw.h or false
  out[#out + 1] = tonumber(st.raw.pv or 0)
  out[#out + 1] = st.raw.p or false
  out[#out + 1] = (slots_waiting(st.key, now))
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
--   h, hv      the hints (bytes only Rust reads, HintState::encode) and
--              their version; the core holds what they decided (cd, bo,
--              hl), so a Lease reads no hints (`hints` below)
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
  return {
    key = key, now = now, k = k, frozen = frozen, z0 = frozen, fresh = fresh,
    -- Raw fields read; series' packed pairs, decoded pairs and which
    -- changed; unpacked worker records, forgotten workers.
    raw = {}, raw_of = {}, pairs = {}, dirty = {}, w = {}, gone = {},
  }
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

-- Opens the route, creating it (with_route in the memory store) unless
-- `create` is false: then nil when there is none. A string `create`
-- names the caller token entry the new route is charged to (`o`, written
-- with it; '' or nil: nobody's). Rust charges a token's quota before it
-- lets a script create (`quota.rs`), so a call that would make a scope
-- first asks for it to exist, and only a refusal costs the charge.
local function route_get(key, now, extra, create)
  local st = route_open(key, now, extra)
  if not st then
    if create == false then return nil end
    st = route_new(key, now)
    if create and create ~= '' then st.o = create end
    return st
  end
  st.k.t = math.max(st.k.t, now)
  return st
end

-- route_get's `create` from a script's two arguments: '1' when the route
-- must exist already, and the owner a new one is charged to.
local function creation(must_exist, owner)
  if must_exist == '1' then return false end
  return owner or ''
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
  local expire
  if st.frozen then
    if k.er ~= -1 then expire, k.er = -1, -1 end
  else
    -- Bounded: an intent may name a deadline far off (it waits only as
    -- long as it keeps asking), and PX takes at most a 64-bit integer.
    local until_ms = now + keep_ms(route_live(st), now, idle_ms)
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
  if st.o then
    args[#args + 1] = 'o'
    args[#args + 1] = st.o
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
    local got = redis.call('HMGET', KEYS[2], 'cd', 'fl')
    return tonumber(got[1] or 0), tonumber(got[2] or 0)
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

---------------------------------------------------------------- tokens
-- Where several caller tokens share a caller scope, each one's own first
-- attempts and spend on a route are counted apart (the budget's "Counts
-- of several tokens"): series 0..3 of token NAME are the route hash's
-- fields 'u0' .. NAME (first attempts) and 'u1' .. NAME to 'u3' .. NAME
-- (each class's spend), packed pairs as the route's own series, trimmed
-- to the last W seconds when written. Rust computes the caps they bound
-- (lease.lua takes under them); a lease charged to them names its token
-- in its id (`own_tag`), so its Release refunds them too.

local function own_field(i, name) return 'u' .. i .. name end

-- Token `name`'s series i on route `st`, decoded (cached per call).
local function own_pairs(st, i, name)
  st.own = st.own or {}
  local f = st.own[i]
  if not f then
    f = doubles(route_raw(st, own_field(i, name)) or '')
    st.own[i] = f
  end
  return f
end

-- Adds `v` at second `sec` (the newest) to token `name`'s series i and
-- writes it back, trimmed to the window.
local function own_add(st, i, name, sec, v)
  local f = own_pairs(st, i, name)
  flat_trim(f, sec - W + 1)
  flat_add(f, sec, v)
  redis.call('HSET', st.key, own_field(i, name), doubles_pack(f))
end

-- A token's name as it goes into a lease id: hex, so no id character
-- (`.`, `/`) can come from it.
local function own_tag(name)
  return (string.gsub(name, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

local function own_untag(tag)
  return (string.gsub(tag, '%x%x', function(h) return string.char(tonumber(h, 16)) end))
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

-- Workers class p has seen in the window.
local function class_active(st, p, now, window_ms)
  local n = 0
  for wid in pairs(class_workers(st, p)) do
    if worker_seen(st, p, wid) > now - window_ms then n = n + 1 end
  end
  return n
end

-- Workers seen in the window over every class (BudgetLedger::active_workers).
local function active_workers(st, now, window_ms)
  return class_active(st, 1, now, window_ms) + class_active(st, 2, now, window_ms)
    + class_active(st, 3, now, window_ms)
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
