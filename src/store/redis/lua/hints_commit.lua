-- Writes a level's hints as Rust decided them, if their version is still
-- the one read; otherwise nothing, and Rust decides again.
-- KEYS: route or caller. ARGV: 'route' or 'caller', now, idle_ms, the
-- version read, the hints (bytes), the cooldown, the backoff (route) or
-- floor (caller), until when they hold something live, and for a caller
-- 1 if the change touches it (a hint or a mute; a success narrowing its
-- backoff does not) and the caller token entry a new one is charged to.
-- Reply: 'ok', 'done' or 'moved'.
local kind, now, idle_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local v, h = tonumber(ARGV[4]), ARGV[5]
local cd, fl, live = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if kind == 'route' then
  local st = route_get(KEYS[1], now, { 'hv' })
  if tonumber(st.raw.hv or 0) ~= v then return { 'ok', 'moved' } end
  st.k.cd, st.k.bo, st.k.hl = cd, fl, live
  route_save(st, idle_ms)
  redis.call('HSET', KEYS[1], 'h', h, 'hv', v + 1)
  return { 'ok', 'done' }
end
local got = redis.call('HMGET', KEYS[1], 'hv', 't')
if tonumber(got[1] or 0) ~= v then return { 'ok', 'moved' } end
if ARGV[9] == '1' or not got[2] then
  local t = math.max(tonumber(got[2] or 0), now)
  redis.call('HSET', KEYS[1], 'h', h, 'hv', v + 1, 'cd', cd, 'fl', fl, 'hl', live, 't', t)
  if not got[2] and ARGV[10] and ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'o', ARGV[10]) end
  redis.call('PEXPIRE', KEYS[1], keep_ms(live, now, idle_ms))
else
  -- Narrowed only: its expiry stays as the last touch set it.
  redis.call('HSET', KEYS[1], 'h', h, 'hv', v + 1, 'cd', cd, 'fl', fl, 'hl', live)
end
return { 'ok', 'done' }
