-- Charges a scope to a caller token's quota: a sorted set per token of
-- the keys of the scopes charged to it, scored by their last touch as
-- last seen. Decides nothing: the quota comes from Rust, and at the
-- quota Rust picks what goes (`quota.rs`).
-- KEYS: the token's set. ARGV: the scope's key, now, the quota, how many
-- of the lowest-scored members to answer with when it is full.
-- Reply: 'ok', 'held' (already charged; touched) or 'charged', the count
-- after; or 'ok', 'full', the count, then member, score pairs, lowest first.
local member, now, quota = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], member) then
  redis.call('ZADD', KEYS[1], now, member)
  return { 'ok', 'held', redis.call('ZCARD', KEYS[1]) }
end
local n = redis.call('ZCARD', KEYS[1])
if n < quota then
  redis.call('ZADD', KEYS[1], now, member)
  -- A token dropped from the configuration leaves its set behind: gone
  -- once no charge has touched it for longer than any scope is kept.
  redis.call('PEXPIRE', KEYS[1], MAX_TTL_MS)
  return { 'ok', 'charged', n + 1 }
end
local out = { 'ok', 'full', n }
local lowest = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1, 'WITHSCORES')
for i = 1, #lowest do out[#out + 1] = lowest[i] end
return out
