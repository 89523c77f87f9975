-- What Rust needs to decide whether a token's scope may go to make room
-- within its quota, read-only. KEYS: a route or caller key. ARGV: now,
-- 1 for a route.
-- Reply: 'ok', 0 (gone); or 'ok', 1, the token it is charged to (false:
-- nobody's), last touch, 1 if it holds something a cooldown does not
-- explain (a live lease, a waiting intent, a freeze), the hints' version
-- and bytes (false: none; Rust reads the mutes from them).
local now = tonumber(ARGV[1])
if ARGV[2] == '1' then
  local st = route_open(KEYS[1], now, { 'o', 'h', 'hv' })
  if not st then return { 'ok', 0 } end
  local leases = redis.call('ZCOUNT', lease_key(KEYS[1]), '(' .. now, '+inf')
  local asking, pending = slots_waiting(KEYS[1], now)
  local held = (leases + asking + pending > 0 or st.frozen) and 1 or 0
  return { 'ok', 1, st.raw.o or false, st.k.t, held, tonumber(st.raw.hv or 0), st.raw.h or false }
end
local got = redis.call('HMGET', KEYS[1], 't', 'o', 'hv', 'h')
if not got[1] then return { 'ok', 0 } end
return { 'ok', 1, got[2] or false, tonumber(got[1]), 0, tonumber(got[3] or 0), got[4] or false }
