-- Evicts one of a token's scopes to make room within its quota, as Rust
-- chose it from quota_peek.lua's answer: only if it is still as read (the
-- same last touch and hints' version) and still holds nothing a cooldown
-- does not explain. KEYS: a route or caller key. ARGV: now, 1 for a route,
-- the last touch and hints' version read.
-- Reply: 'ok', 1 if it went, 0 if it moved meanwhile.
local now = tonumber(ARGV[1])
local t, hv = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] == '1' then
  local st = route_open(KEYS[1], now, { 'hv' })
  if not st then return { 'ok', 0 } end
  if st.k.t ~= t or tonumber(st.raw.hv or 0) ~= hv or st.frozen then return { 'ok', 0 } end
  local asking, pending = slots_waiting(KEYS[1], now)
  if redis.call('ZCOUNT', lease_key(KEYS[1]), '(' .. now, '+inf') + asking + pending > 0 then
    return { 'ok', 0 }
  end
  redis.call('DEL', KEYS[1])
  leases_forget(KEYS[1])
  slots_forget(KEYS[1])
  return { 'ok', 1 }
end
local got = redis.call('HMGET', KEYS[1], 't', 'hv')
if not got[1] or tonumber(got[1]) ~= t or tonumber(got[2] or 0) ~= hv then return { 'ok', 0 } end
redis.call('DEL', KEYS[1])
return { 'ok', 1 }
