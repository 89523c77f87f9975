-- Who a call-back reaches (slots::SlotCursor::call_back_until), read
-- only: the latest deadline among the first `n` intents told to ask
-- again, in deadline order, that still listen: their instant to ask
-- again, in the route's third slot set, is `since` or later
-- (slots::call_back_listening_since).
-- KEYS: route. ARGV: now, n, since.
-- Reply: 'ok', the deadline (0: none).
local _, sa, sq = slot_keys(KEYS[1])
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local since = tonumber(ARGV[3])
local reach, found, offset = 0, 0, 0
while found < n do
  local batch = redis.call('ZRANGEBYSCORE', sa, '(' .. now, '+inf', 'WITHSCORES',
    'LIMIT', offset, 256)
  if #batch == 0 then break end
  for i = 1, #batch, 2 do
    local again = found < n and redis.call('ZSCORE', sq, batch[i])
    if again and tonumber(again) >= since then
      found = found + 1
      reach = tonumber(batch[i + 1])
    end
  end
  offset = offset + 256
end
return { 'ok', reach }
