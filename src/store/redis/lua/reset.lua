-- Forgets a route's budget window, leases, cooldown, backoff, recent hints,
-- slots and pacing, keeping its freeze and the hints Rust kept of it (its
-- mutes) (Store::reset_scope; the memory store's reset). Caller-scope
-- evidence is left alone: it covers other routes too. The versions go on
-- from where they were, so a decision read before the reset cannot be
-- written after it.
-- KEYS: route. ARGV: now, idle_ms, the hints to keep (bytes; '' for
-- none), until when they hold something live. Returns whether it existed.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local old = route_open(KEYS[1], now, { 'hv', 'pv', 'o' })
if not old then return { 'ok', 0 } end
local st = route_new(KEYS[1], now)
st.frozen = old.frozen
-- Still charged to the token that made it: a reset forgets state, not
-- whose quota holds the scope.
st.o = old.raw.o or nil
st.k.t = math.max(old.k.t, now)
st.k.hl = tonumber(ARGV[4])
redis.call('DEL', KEYS[1])
leases_forget(KEYS[1])
slots_forget(KEYS[1])
route_save(st, idle_ms)
local fields = { 'hv', tonumber(old.raw.hv or 0) + 1, 'pv', tonumber(old.raw.pv or 0) + 1 }
if ARGV[3] ~= '' then
  fields[#fields + 1] = 'h'
  fields[#fields + 1] = ARGV[3]
end
redis.call('HSET', KEYS[1], unpack(fields))
return { 'ok', 1 }
