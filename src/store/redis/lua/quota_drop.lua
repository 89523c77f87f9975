-- Drops members from a caller token's set of scopes, each only if its
-- score is still the one Rust read: a member charged again meanwhile (a
-- call about to re-create its scope) keeps its place.
-- KEYS: the token's set. ARGV: member, score pairs.
-- Reply: 'ok', how many were dropped, the count after.
local dropped = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    dropped = dropped + 1
  end
end
return { 'ok', dropped, redis.call('ZCARD', KEYS[1]) }
