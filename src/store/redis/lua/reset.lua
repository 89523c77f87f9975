-- Forgets a route's budget window, leases, cooldown, backoff, recent hints
-- and slot cursor, keeping its freeze and its mutes (Store::reset_scope; the memory
-- store's reset). Caller-scope evidence is left alone: it covers other
-- routes too. KEYS: route. ARGV: now, idle_ms. Returns whether it existed.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local old = route_open(KEYS[1], now, { 'h' })
if not old then return { 'ok', 0 } end
local st = route_new(KEYS[1], now)
st.frozen = old.frozen
st.hints.mutes = old.hints.mutes
st.k.t = math.max(old.k.t, now)
redis.call('DEL', KEYS[1])
leases_forget(KEYS[1])
slots_forget(KEYS[1])
route_save(st, idle_ms)
return { 'ok', 1 }
