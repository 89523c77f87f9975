-- Grants up to `want` tokens of one class (BudgetLedger::grant) and records
-- the lease (lease_put: beside the route's value). KEYS: route [, caller]. ARGV: caller cooldown, caller floor,
-- now, idle_ms, worker, class (1..3), want, lease id, then the policy
-- (policy_at).
local now, idle_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local wid, p, want, id = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local P = policy_at(9)
local ccd, cfloor = caller_floor()
local st = route_get(KEYS[1], now)
local cd = math.max(st.hints.cd, ccd)
local floor = math.max(hints_floor(st.hints), cfloor)

if st.frozen then
  -- A frozen route grants nothing but still says what is left.
  local remaining = idiv(available(st, P, p, now), P.cost)
  save(KEYS[1], st, live_until(st, now), now, idle_ms)
  return { 'ok', 0, 3, remaining, now, '', cd, floor, st.frozen }
end

local sec = sec_of(now)
local window_ms = P.window * 1000
local expires = now + P.ttl
if leases_live(KEYS[1], now) >= MAX_LEASES then return { 'err', 'too_many_leases' } end

local capacity = class_allowance(st, P, p, now)
local avail = available(st, P, p, now)
local cls = st.cls[p]
local me = touch(cls, wid, now, window_ms)

local want_milli = want * P.cost
local own_held = held(me, sec, P.window)
local own_demand = own_held + want_milli
-- A demand within an equal share among every worker the class tracks is
-- met in full by the water-filling: granted without weighing (and
-- unpacking) the rest of the fleet (BudgetLedger::grant).
local fair
if own_demand <= idiv(capacity, count(cls.workers)) then
  fair = own_demand
else
  -- Everyone else's demand.
  local demands = {}
  for other in pairs(cls.workers) do
    if other ~= wid and worker_seen(cls, other) > now - window_ms then
      local w = worker(cls, other)
      local h = held(w, sec, P.window)
      if w.lease and w.lease > now - window_ms then
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
local lease_id = ''
if granted > 0 then
  local charged = s_add(cls.spent, sec, cost)
  charge(me, charged, cost)
  lease_put(KEYS[1], id, { w = wid, p = p, g = granted, c = P.cost, sec = charged, exp = expires }, now)
  st.lexp = math.max(st.lexp or 0, expires)
  lease_id = id
end
save(KEYS[1], st, live_until(st, now), now, idle_ms)
return { 'ok', granted, limit, idiv(avail - cost, P.cost), expires, lease_id, cd, floor, false }
