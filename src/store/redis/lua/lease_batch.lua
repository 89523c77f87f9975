-- Several Leases sent together (RedisStore's lease queue): each runs as
-- lease.lua alone would, in the order sent, and one that fails fails
-- alone. KEYS: each lease's keys in turn. ARGV: per lease, how many keys
-- it has, then lease.lua's four arguments.
-- Reply: one lease.lua reply per lease ({'err', 'failed', message} for one
-- whose script failed).
local keys, args = KEYS, ARGV
local out = {}
local at = 1
for i = 1, #args, 5 do
  local n = tonumber(args[i])
  if n == 2 then KEYS = { keys[at], keys[at + 1] } else KEYS = { keys[at] } end
  ARGV = { args[i + 1], args[i + 2], args[i + 3], args[i + 4] }
  at = at + n
  local ok, r = pcall(BODY.lease)
  if not ok then
    if type(r) == 'table' then r = r.err end
    r = { 'err', 'failed', tostring(r) }
  end
  out[#out + 1] = r
end
return out
