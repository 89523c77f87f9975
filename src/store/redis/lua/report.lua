-- A worker report's budget half (Store::report): deposits the first
-- attempts and marks the worker active, then answers what Rust decides
-- the rest from — the hints and the pacing (hints_commit.lua and
-- pace_commit.lua write what it decides).
-- KEYS: route [, caller] (one node: the caller scope's hints are read in
-- the same call). ARGV: now, idle_ms, worker, class (1..3), first
-- attempts, window seconds, 1 to count the route's active workers (a hint
-- or a stated limit is judged against them), 1 if the route must exist
-- already (its owner's quota is not charged yet), the caller token entry
-- a new route is charged to, 1 if several tokens share the caller scope
-- (the entry's first attempts are then also counted as its own).
-- Reply: 'ok', 'absent' when the route must exist and does not (nothing
-- written); else 'ok', active workers, then route_state_out, then the caller
-- scope's hints version and bytes (0, false: none or not given), then the
-- window's first attempts and the workers each class tracks (what a
-- Lease's limits are computed from).
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local wid, p = ARGV[3], tonumber(ARGV[4])
local first, window = tonumber(ARGV[5]), tonumber(ARGV[6])
local st = route_get(KEYS[1], now, { 'h', 'hv', 'p', 'pv', 'fa', CLASS_KEY[p] .. wid },
  creation(ARGV[8], ARGV[9]))
if not st then return { 'ok', 'absent' } end
s_add(st, 0, sec_of(now), first)
if ARGV[10] == '1' and first > 0 then own_add(st, 0, ARGV[9], sec_of(now), first) end
touch(st, p, wid, now, window * 1000)
local active = 0
if ARGV[7] == '1' then active = active_workers(st, now, window * 1000) end
route_save(st, idle_ms)
local out = { 'ok', active }
route_state_out(out, st, now)
if KEYS[2] then
  local cv, ch = caller_hints(KEYS[2])
  out[#out + 1] = cv
  out[#out + 1] = ch
else
  out[#out + 1] = 0
  out[#out + 1] = false
end
out[#out + 1] = s_sum(st, 0, sec_of(now), window)
for c = 1, 3 do out[#out + 1] = st.k[20 + c] end
return out
