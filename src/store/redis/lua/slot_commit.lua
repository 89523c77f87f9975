-- Applies a Reconsider decided in Rust (slots::SlotChange) and the pacing
-- state it left, if the route still holds what slot_read.lua read: the
-- same pacing version, cursor, cooldown, backoff floor and freeze.
-- Otherwise nothing is written and the decision is made again.
-- KEYS: route. ARGV: now, idle_ms, then what was read (pacing version,
-- cursor, cooldown, backoff floor, 1 if frozen), the pacing state ('' when
-- unchanged), the change ('keep', 'book', 'ask', 'forget'), intent, the
-- slot (book) or deadline (ask), the cursor after it (book), 1 if the
-- route must exist already (its owner's quota is not charged yet), the
-- caller token entry a new route is charged to, the instant to ask again
-- (ask), and the earliest instant to ask again of an intent still
-- listening (slots::call_back_listening_since: earlier ones are dropped,
-- slot_call_back.lua).
-- Reply: 'ok', 'done', 'moved' or 'absent' (the route must exist and
-- does not), then the intents asking.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = route_get(KEYS[1], now, { 'pv', 'cu' }, creation(ARGV[13], ARGV[14]))
if not st then return { 'ok', 'absent', 0 } end
local pv = tonumber(st.raw.pv or 0)
if pv ~= tonumber(ARGV[3]) or tonumber(st.raw.cu or 0) ~= tonumber(ARGV[4])
  or st.k.cd ~= tonumber(ARGV[5]) or st.k.bo ~= tonumber(ARGV[6])
  or (st.frozen and 1 or 0) ~= tonumber(ARGV[7]) then
  return { 'ok', 'moved', 0 }
end
local kind, intent, at = ARGV[9], ARGV[10], tonumber(ARGV[11])
local sp, sa, sq = slot_keys(KEYS[1])
-- Intents past their deadline stop waiting; those no longer listening
-- are not called back.
redis.call('ZREMRANGEBYSCORE', sa, '-inf', now)
redis.call('ZREMRANGEBYSCORE', sq, '-inf', '(' .. ARGV[16])
if kind ~= 'keep' then redis.call('ZREM', sp, intent) end
local fields = {}
if kind == 'book' then
  if redis.call('ZCARD', sp) >= MAX_PENDING then
    redis.call('ZREMRANGEBYSCORE', sp, '-inf', now)
    if redis.call('ZCARD', sp) >= MAX_PENDING then return { 'err', 'too_many_waiting' } end
  end
  redis.call('ZREM', sa, intent)
  redis.call('ZREM', sq, intent)
  redis.call('ZADD', sp, at, intent)
  fields = { 'cu', ARGV[12] }
elseif kind == 'ask' then
  -- Past the bound the intent is still told to ask again, just not counted.
  if redis.call('ZSCORE', sa, intent) or redis.call('ZCARD', sa) < MAX_PENDING then
    redis.call('ZADD', sa, at, intent)
    redis.call('ZADD', sq, tonumber(ARGV[15]), intent)
  end
elseif kind == 'forget' then
  redis.call('ZREM', sa, intent)
  redis.call('ZREM', sq, intent)
end
if ARGV[8] ~= '' then
  fields[#fields + 1] = 'p'
  fields[#fields + 1] = ARGV[8]
end
if #fields > 0 then
  fields[#fields + 1] = 'pv'
  fields[#fields + 1] = pv + 1
  redis.call('HSET', KEYS[1], unpack(fields))
end
-- The route lives as long as its latest slot or deadline, and the sets
-- as long as the route.
local live = 0
for _, key in ipairs({ sp, sa }) do
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then live = math.max(live, tonumber(top[2])) end
end
st.k.sl = live
route_save(st, idle_ms)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', sp, ttl)
  redis.call('PEXPIRE', sa, ttl)
  redis.call('PEXPIRE', sq, ttl)
end
local asking = slots_waiting(KEYS[1], now)
return { 'ok', 'done', asking }
