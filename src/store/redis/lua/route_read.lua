-- What Rust decides a route's hints and pacing from, read-only (a
-- decision made again after another replica moved them, a mute, a reset).
-- KEYS: route. ARGV: now.
-- Reply: 'ok', 1 (0: no such route, and nothing more), route_state_out.
local now = tonumber(ARGV[1])
local st = route_open(KEYS[1], now, { 'h', 'hv', 'p', 'pv' })
if not st then return { 'ok', 0 } end
local out = { 'ok', 1 }
route_state_out(out, st, now)
return out
