-- Gives an intent a slot after the route's floor (SlotCursor::assign): at
-- the route's learned or pinned wake rate (pacing.lua's pace_decide), a
-- slot within the horizon, "ask again", or a refusal that takes nothing.
-- The jitter is drawn by the coordinator from its seedable RNG and passed
-- in.
-- KEYS: route [, caller]. ARGV: caller cooldown, caller floor, now,
-- idle_ms, intent, floor, deadline, reserve, jitter ppm, the five pacing
-- policy arguments (pace_policy), then 1 for a held first attempt (0: a
-- retry).
-- Reply: 'ok', kind, at, cooldown, floor, freeze, the pacing view, then the
-- pacing mode before this call.
local now, idle_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local intent = ARGV[5]
local ask_floor, deadline = tonumber(ARGV[6]), tonumber(ARGV[7])
local reserve, jitter = tonumber(ARGV[8]), tonumber(ARGV[9])
local P = pace_policy(10)
local first_attempt = tonumber(ARGV[15]) == 1
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = route_get(KEYS[1], now, { 'sl', 'p' })
-- The route's cooldown and floor from its core: its hints are not read.
local cd = math.max(st.k.cd, ccd)
local vfloor = math.max(st.k.cd, st.k.bo, cfloor)
local cur = st.slots
cur.asking = cur.asking or {}
-- Intents told to ask again, counted by deadline bucket (SlotCursor's
-- `deadlines`); rebuilt from `asking` where an older record has none.
local function dl_rebuild()
  cur.dl = {}
  for _, d in pairs(cur.asking) do
    local b = math.floor(d / DEADLINE_BUCKET)
    cur.dl[b] = (cur.dl[b] or 0) + 1
  end
end
local function forget(i)
  local d = cur.asking[i]
  if d == nil then return end
  cur.asking[i] = nil
  local b = math.floor(d / DEADLINE_BUCKET)
  local n = (cur.dl[b] or 1) - 1
  if n == 0 then cur.dl[b] = nil else cur.dl[b] = n end
end
if not cur.dl then dl_rebuild() end
local pace = pace_of(st, now, P)
local was = pace.mode

local function done(kind, at)
  route_save(st, idle_ms)
  local out = { 'ok', kind, at, cd, vfloor, st.frozen or false }
  pace_view_out(out, pace, asking_count(cur, now), now)
  out[#out + 1] = was
  return out
end

if st.frozen then
  pace_advance(pace, now, P)
  return done('frozen', 0)
end
local floor = math.max(ask_floor, pace_floor_for(pace, vfloor, first_attempt, now), now)
local pending = cur.pending[intent]
if pending then
  -- Still pending and after the floor: the same answer. A floor that moved
  -- past it (a newer cooldown) voids it.
  if pending > now and pending >= floor then
    pace_advance(pace, now, P)
    return done('slot', pending)
  end
  cur.pending[intent] = nil
end
-- Intents past their deadline stop counting as waiting, checked at most
-- once a window (it walks the whole table).
if now - (cur.pruned or 0) >= PACE_WINDOW or count(cur.asking) >= MAX_PENDING then
  for i, d in pairs(cur.asking) do
    if d <= now then cur.asking[i] = nil end
  end
  dl_rebuild()
  cur.pruned = now
end
local asked_before = cur.asking[intent] ~= nil
-- The queue ahead in deadline order: intents in earlier buckets that could
-- still start in time (SlotCursor::ahead_of).
local waiting = 0
local from = math.floor((now + reserve) / DEADLINE_BUCKET)
local to = math.floor(deadline / DEADLINE_BUCKET)
for b, n in pairs(cur.dl) do
  if b >= from and b < to then waiting = waiting + n end
end
local kind, at, cursor = pace_decide(pace, P, now, floor, deadline, reserve, jitter,
  waiting, cur.next, first_attempt)
if kind == 'slot' then
  if count(cur.pending) >= MAX_PENDING then
    for i, s in pairs(cur.pending) do
      if s <= now then cur.pending[i] = nil end
    end
    if count(cur.pending) >= MAX_PENDING then return { 'err', 'too_many_waiting' } end
  end
  forget(intent)
  cur.next = cursor
  cur.pending[intent] = at
  return done('slot', at)
elseif kind == 'again' then
  -- Past the bound: still ask again, not recorded (SlotCursor::assign).
  if asked_before or count(cur.asking) < MAX_PENDING then
    forget(intent)
    cur.asking[intent] = deadline
    local b = math.floor(deadline / DEADLINE_BUCKET)
    cur.dl[b] = (cur.dl[b] or 0) + 1
  end
  return done('again', at)
end
forget(intent)
return done('infeasible', at)
