-- Commits the runtime control state shared by replicas (policies,
-- freezes): compare-and-set on its revision, the change's audit records
-- appended in the same step, and a notice to the other replicas.
-- KEYS: state hash, audit list, audit sequence. ARGV: expected revision
-- ('' = append the records only), state JSON, notice channel, audit bound,
-- then one record each: a JSON object's members after `seq`.
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if ARGV[1] ~= '' then
  if tonumber(ARGV[1]) ~= rev then return { 0, rev } end
  rev = rev + 1
  redis.call('HSET', KEYS[1], 'rev', rev, 'state', ARGV[2])
end
local out = { 1, rev }
for i = 5, #ARGV do
  local seq = redis.call('INCR', KEYS[3])
  redis.call('LPUSH', KEYS[2], '{"seq":' .. seq .. ',' .. ARGV[i])
  out[#out + 1] = seq
end
if #ARGV >= 5 then redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1) end
if ARGV[1] ~= '' then redis.call('PUBLISH', ARGV[3], rev) end
return out
