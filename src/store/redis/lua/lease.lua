-- Grants up to `want` tokens of one class (BudgetLedger::grant) and records
-- the lease (lease_put: beside the route). KEYS: route [, caller]. ARGV:
-- the numbers packed as doubles (one string to decode instead of fifteen
-- to parse: caller cooldown, caller floor, now, idle_ms, class (1..3),
-- want, then the policy, policy_of), the worker, the lease id's prefix.
-- Reply: one string (RedisStore::lease_now reads it without a list of
-- values to parse): granted, limit, remaining, expiry, cooldown and floor
-- as doubles, then the lease id, or for a frozen route (limit 3) the
-- freeze's reason; or {'err', reason}.
local a = doubles(ARGV[1])
local now, idle_ms, p, want = a[3], a[4], a[5], a[6]
local P = policy_of(a, 7)
local wid, prefix = ARGV[2], ARGV[3]
local ccd, cfloor = caller_floor(a[1], a[2])
-- The core holds the window sums; the class's spend is read to add to
-- it, the worker's record to charge it: one HMGET.
local st = route_get(KEYS[1], now, { SERIES_FIELD[p], CLASS_KEY[p] .. wid })
local k = st.k
local cd = math.max(k.cd, ccd)
local floor = math.max(k.cd, k.bo, cfloor)

-- What class p could reach in the window, borrowing included (the fair
-- shares split it), and what it may still spend.
local total = allowance(st, P, now)
local capacity = idiv(total * shares_from(P, p), 1000)
local avail = available_of(P, total, class_spent(st, P, now), p)

if st.frozen then
  -- A frozen route grants nothing but still says what is left.
  route_save(st, idle_ms)
  return struct.pack('<dddddd', 0, 3, idiv(avail, P.cost), now, cd, floor) .. st.frozen
end

local sec = sec_of(now)
local window_ms = P.window * 1000
local expires = now + P.ttl
if leases_live(st, now) >= MAX_LEASES then return { 'err', 'too_many_leases' } end

local me = touch(st, p, wid, now, window_ms)

local want_milli = want * P.cost
local own_held = held(me, sec, P.window)
local own_demand = own_held + want_milli
-- A demand within an equal share among every worker the class tracks is
-- met in full by the water-filling: granted without reading (and
-- unpacking) the rest of the fleet (BudgetLedger::grant).
local fair
if own_demand <= idiv(capacity, k[20 + p]) then
  fair = own_demand
else
  -- Everyone else's demand.
  local demands = {}
  for other in pairs(class_workers(st, p)) do
    if other ~= wid and worker_seen(st, p, other) > now - window_ms then
      local w = worker(st, p, other)
      local h = held(w, sec, P.window)
      -- (A worker that never leased holds -1.)
      if w.lease > now - window_ms then
        demands[#demands + 1] = h + w.unmet
      else
        -- Seen only through reports: unknown demand, claims an equal share.
        demands[#demands + 1] = math.huge
      end
    end
  end
  fair = max_min_share(capacity, own_demand, demands)
end
local fair_room = math.max(0, fair - own_held)
local by_fairness = idiv(fair_room, P.cost)
-- A fleet with more workers than tokens rounds every share to nothing: a
-- worker holding less than one token's cost may take one (BudgetLedger::grant).
if by_fairness == 0 and own_held < P.cost then by_fairness = 1 end
local by_budget = idiv(avail, P.cost)
local granted = math.min(want, by_fairness, by_budget)
local limit = 0
if granted ~= want then
  if by_budget <= by_fairness then limit = 1 else limit = 2 end
end

local cost = granted * P.cost
me.lease = now
me.unmet = want_milli - cost
local id = ''
if granted > 0 then
  local charged = s_add(st, p, sec, cost)
  charge(me, charged, cost)
  id = lease_id(prefix, p, granted, P.cost, charged)
  lease_put(st, id, wid, expires, now)
  if expires > k.x then k.x = expires end
end
route_save(st, idle_ms)
return struct.pack('<dddddd', granted, limit, idiv(avail - cost, P.cost), expires, cd, floor) .. id
