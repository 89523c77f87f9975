-- A page of the shared audit log, newest first. Records are pushed at the
-- head one sequence number at a time, so the record with sequence s sits
-- at index (newest - s) until it is trimmed off the tail.
-- KEYS: audit list, audit sequence. ARGV: before_seq (0: the newest), limit.
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
local before = tonumber(ARGV[1])
local start = 0
if before > 0 then start = math.max(newest - before + 1, 0) end
return redis.call('LRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
