-- Takes up to `want` tokens of class p under limits the caller computed,
-- and records the lease (lease_put: beside the route). Decides nothing:
-- RedisStore (`lease`) computes every limit with the budget's rules
-- (budget::grant) from counters it read before; this reads them now and
-- takes only if what the limits assumed still holds.
-- KEYS: route [, caller]. ARGV: the numbers packed as doubles — caller
-- cooldown, caller floor, now, idle_ms, class (1..3), want, window, cost,
-- lease ttl; the first attempts the limits assumed; the most tokens the
-- worker's fair share allows, if what it holds is at least `lo` and at
-- most the bound given for the count of workers the class tracks: `n`
-- bounds, for counts c .. c + n - 1 (a smaller count takes the first, a
-- larger one the last); 1 if the route must exist already (its owner's
-- quota is not charged yet); the token's own first attempts the limits
-- assumed, where several tokens share the caller scope (-1: one does);
-- then (cap, from) pairs: classes `from` (1..3) and below may have spent
-- at most `cap` together, and with `from` 4..6 the same of the token's
-- own spend (classes from - 3 and below) — then the worker, the lease
-- id's prefix, the caller token entry (a new route is charged to it, and
-- its own counts are the ones kept apart).
-- Reply: one string of doubles: what happened (0 taken; 1 stale: the
-- first attempts are fewer than assumed, or more and a limit held the
-- take back; 2 fleet: what the worker holds is outside its bounds; 3 frozen;
-- 4 absent: the route must exist and does not, nothing else follows),
-- granted, expiry, cooldown, floor, what was read (first attempts,
-- classes 1..3's spend, what the worker holds, workers classes 1..3
-- track, the token's own first attempts and classes 1..3's own spend,
-- all 0 where one token uses the scope), then the lease id (0), the freeze's reason (3), or each other
-- worker's seen, last lease, holding and unmet demand (2); or
-- {'err', reason}.
local a = doubles(ARGV[1])
local now, idle_ms, p, want = a[3], a[4], a[5], a[6]
local window, cost, ttl, first0 = a[7], a[8], a[9], a[10]
local wid, prefix = ARGV[2], ARGV[3]
local ccd, cfloor = caller_floor(a[1], a[2])
-- The core holds the window sums; the class's spend is read to add to
-- it, the worker's record to charge it: one HMGET.
local own_first0, name = a[16 + a[14]], ARGV[4]
local shared = own_first0 >= 0
local extra = { SERIES_FIELD[p], CLASS_KEY[p] .. wid }
if shared then
  for i = 0, 3 do extra[#extra + 1] = own_field(i, name) end
end
local st = route_get(KEYS[1], now, extra, creation(a[15 + a[14]] == 1 and '1' or '0', name))
if not st then
  return struct.pack('<ddddddddddddddddd', 4, 0, now, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
end
local k = st.k
local sec = sec_of(now)
local first = s_sum(st, 0, sec, window)
local spent = { s_sum(st, 1, sec, window), s_sum(st, 2, sec, window), s_sum(st, 3, sec, window) }
local own = 0
-- The token's own counts in the window, where they are kept apart.
local mine, mine_spent = 0, { 0, 0, 0 }
if shared then
  local oldest = sec - window + 1
  mine = flat_sum(own_pairs(st, 0, name), oldest)
  for c = 1, 3 do mine_spent[c] = flat_sum(own_pairs(st, c, name), oldest) end
end

local function reply(what, granted, expires, tail)
  return struct.pack('<ddddddddddddddddd', what, granted, expires, math.max(k.cd, ccd),
    math.max(k.cd, k.bo, cfloor), first, spent[1], spent[2], spent[3], own,
    k[21], k[22], k[23], mine, mine_spent[1], mine_spent[2], mine_spent[3]) .. tail
end

if st.frozen then
  route_save(st, idle_ms)
  return reply(3, 0, now, st.frozen)
end
if first < first0 or (shared and mine < own_first0) then return reply(1, 0, now, '') end
if leases_live(st, now) >= MAX_LEASES then return { 'err', 'too_many_leases' } end
local me = touch(st, p, wid, now, window * 1000)
own = held(me, sec, window)
local bound = a[15 + math.min(math.max(0, k[20 + p] - a[13]), a[14] - 1)]
if own < a[12] or own > bound then
  local fleet = {}
  for other in pairs(class_workers(st, p)) do
    if other ~= wid then
      local w = worker(st, p, other)
      fleet[#fleet + 1] = struct.pack('<dddd', w.seen, w.lease, held(w, sec, window), w.unmet)
    end
  end
  return reply(2, 0, now, table.concat(fleet))
end

local room = math.huge
for i = 17 + a[14], #a - 1, 2 do
  local used = 0
  if a[i + 1] <= 3 then
    for j = a[i + 1], 3 do used = used + spent[j] end
  else
    for j = a[i + 1] - 3, 3 do used = used + mine_spent[j] end
  end
  room = math.min(room, math.max(0, a[i] - used))
end
local granted = math.min(want, a[11], idiv(room, cost))
-- Limits from fewer first attempts than there are now are safe but may
-- be short: only a take they did not hold back is the rules' answer.
if (first > first0 or (shared and mine > own_first0)) and granted < want then
  return reply(1, 0, now, '')
end

local expires = now + ttl
local taken = granted * cost
me.lease = now
me.unmet = want * cost - taken
local id = ''
if granted > 0 then
  local charged = s_add(st, p, sec, taken)
  charge(me, charged, taken)
  if shared then
    own_add(st, p, name, charged, taken)
    prefix = prefix .. '_' .. own_tag(name)
  end
  id = lease_id(prefix, p, granted, cost, charged)
  lease_put(st, id, wid, expires, now)
  if expires > k.x then k.x = expires end
end
route_save(st, idle_ms)
return reply(0, granted, expires, id)
