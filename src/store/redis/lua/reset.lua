-- Forgets a route's budget window, leases, cooldown, backoff, recent hints
-- and slot cursor, keeping its freeze and its mutes (Store::reset_scope; the memory
-- store's reset). Caller-scope evidence is left alone: it covers other
-- routes too. KEYS: route. ARGV: now, idle_ms. Returns whether it existed.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local old = load(KEYS[1])
if not old then return { 'ok', 0 } end
local st = route_new(now)
st.frozen = old.frozen
st.hints.mutes = old.hints.mutes
st.touched = math.max(old.touched, now)
leases_forget(KEYS[1])
save(KEYS[1], st, live_until(st, now), now, idle_ms)
return { 'ok', 1 }
