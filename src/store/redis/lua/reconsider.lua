-- Gives an intent a slot after the route's floor (SlotCursor::assign):
-- one slot per 1/wake_rate interval, jittered inside it; a slot that would
-- not fit the deadline is refused and takes nothing. The jitter is drawn by
-- the coordinator from its seedable RNG and passed in.
-- KEYS: route [, caller]. ARGV: caller cooldown, caller floor, now,
-- idle_ms, intent, floor, deadline, reserve, jitter ppm, wake rate.
local now, idle_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local intent = ARGV[5]
local ask_floor, deadline = tonumber(ARGV[6]), tonumber(ARGV[7])
local reserve, jitter, rate = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local ccd, cfloor = caller_floor()
local st = route_get(KEYS[1], now)
local cd = math.max(st.hints.cd, ccd)
local vfloor = math.max(hints_floor(st.hints), cfloor)

local function done(...)
  save(KEYS[1], st, live_until(st, now), now, idle_ms)
  return { ... }
end

if st.frozen then return done('ok', 'frozen', 0, cd, vfloor, st.frozen) end
local floor = math.max(ask_floor, vfloor, now)
local cur = st.slots
local pending = cur.pending[intent]
if pending then
  -- Still pending and after the floor: the same answer. A floor that moved
  -- past it (a newer cooldown) voids it.
  if pending > now and pending >= floor then
    return done('ok', 'slot', pending, cd, vfloor, false)
  end
  cur.pending[intent] = nil
end
local interval = math.ceil(1000000 / math.max(rate, 1))
local start = math.max(cur.next, floor * 1000)
local offset = idiv(interval * math.min(jitter, JITTER_SCALE - 1), JITTER_SCALE)
local slot = math.floor((start + offset) / 1000)
if slot + reserve > deadline then
  return done('ok', 'infeasible', slot, cd, vfloor, false)
end
if count(cur.pending) >= MAX_PENDING then
  for i, s in pairs(cur.pending) do
    if s <= now then cur.pending[i] = nil end
  end
  if count(cur.pending) >= MAX_PENDING then return { 'err', 'too_many_waiting' } end
end
cur.next = start + interval
cur.pending[intent] = slot
return done('ok', 'slot', slot, cd, vfloor, false)
