-- One route's state for the Admin API (ScopeSummary, and with the budget
-- ScopeDetail), read-only: creates nothing and saves nothing (the series
-- advance in the decoded copy only), so looking never keeps a scope alive.
-- KEYS: route [, caller]. ARGV: caller cooldown, caller floor, now,
-- with_budget (1/0), then the window's seconds.
-- The summary ends with the caller token entry the route is charged to
-- (false: nobody's).
-- With the budget, the reply goes on with the window's first attempts,
-- each class's spend and active workers, the tokens leases hold, the
-- intents asking, then the pacing state and the hints (false: none; Rust
-- reads both, and computes the budget from the counts: budget::BudgetSnapshot).
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
local now = tonumber(ARGV[3])
local st = route_open(KEYS[1], now, { 'h', 'p', 'o' })
if not st then return { 'ok', 0 } end
local leases, tokens = leases_held(KEYS[1], now)
local asking, pending = slots_waiting(KEYS[1], now)
local waiting = asking + pending
local out = {
  'ok', 1, math.max(st.k.cd, ccd), math.max(st.k.cd, st.k.bo, cfloor),
  st.frozen or false, leases, waiting, st.k.t, st.raw.o or false,
}
if ARGV[4] ~= '1' then return out end

local sec = sec_of(now)
local window = tonumber(ARGV[5])
out[#out + 1] = s_sum(st, 0, sec, window)
for p = 1, 3 do
  out[#out + 1] = s_sum(st, p, sec, window)
  out[#out + 1] = class_active(st, p, now, window * 1000)
end
out[#out + 1] = tokens
out[#out + 1] = asking
out[#out + 1] = st.raw.p or false
out[#out + 1] = st.raw.h or false
return out
