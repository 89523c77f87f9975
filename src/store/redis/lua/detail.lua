-- One route's state for the Admin API (ScopeSummary, and with the budget
-- ScopeDetail), read-only: creates nothing and saves nothing (the series
-- advance in the decoded copy only), so looking never keeps a scope alive.
-- KEYS: route [, caller]. ARGV: caller cooldown, caller floor, now,
-- with_budget (1/0), then window, floor, ratio, ceiling, share 1..3.
-- With the budget, the reply goes on with the intents asking, then the
-- pacing state and the hints (false: none; Rust reads both).
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
local now = tonumber(ARGV[3])
local st = route_open(KEYS[1], now, { 'h', 'p' })
if not st then return { 'ok', 0 } end
local leases, tokens = leases_held(KEYS[1], now)
local asking, pending = slots_waiting(KEYS[1], now)
local waiting = asking + pending
local out = {
  'ok', 1, math.max(st.k.cd, ccd), math.max(st.k.cd, st.k.bo, cfloor),
  st.frozen or false, leases, waiting, st.k.t,
}
if ARGV[4] ~= '1' then return out end

local P = {
  window = tonumber(ARGV[5]), floor = tonumber(ARGV[6]),
  ratio = tonumber(ARGV[7]), ceiling = tonumber(ARGV[8]),
  shares = { tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]) },
}
local sec = sec_of(now)
local window_ms = P.window * 1000
out[#out + 1] = s_sum(st, 0, sec, P.window)
local total = allowance(st, P, now)
out[#out + 1] = total
local spent_by = class_spent(st, P, now)
for p = 1, 3 do
  local a = idiv(total * shares_from(P, p), 1000)
  local spent = spent_by[p]
  local active = 0
  for wid in pairs(class_workers(st, p)) do
    if worker_seen(st, p, wid) > now - window_ms then active = active + 1 end
  end
  out[#out + 1] = a
  out[#out + 1] = spent
  out[#out + 1] = available_of(P, total, spent_by, p)
  out[#out + 1] = active
end
out[#out + 1] = tokens
out[#out + 1] = asking
out[#out + 1] = st.raw.p or false
out[#out + 1] = st.raw.h or false
return out
