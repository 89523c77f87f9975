-- Sets a route's pacing state as Rust left it after a report, if its
-- version is still the one read (report.lua's reply); otherwise answers
-- the state now there, for the report's counts to be taken in again.
-- KEYS: route. ARGV: pacing version read, pacing state.
-- Reply: 'ok', 'done' | 'gone' | 'moved', and for 'moved' the version
-- and state now there.
if redis.call('EXISTS', KEYS[1]) == 0 then return { 'ok', 'gone' } end
local got = redis.call('HMGET', KEYS[1], 'pv', 'p')
local pv = tonumber(got[1] or 0)
if pv ~= tonumber(ARGV[1]) then return { 'ok', 'moved', pv, got[2] or false } end
redis.call('HSET', KEYS[1], 'p', ARGV[2], 'pv', pv + 1)
return { 'ok', 'done' }
