-- Freezes (ARGV reason) or unfreezes (no reason) a route. A frozen key has
-- no expiry. KEYS: route. ARGV: now, idle_ms, has_reason (1/0), reason.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = route_get(KEYS[1], now, {})
if ARGV[3] == '1' then st.frozen = ARGV[4] else st.frozen = nil end
route_save(st, idle_ms)
return { 'ok' }
