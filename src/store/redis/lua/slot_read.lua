-- What a Reconsider's decision needs from the route (slots::SlotBook, the
-- pacing state and the floors), read-only: the decision is made in Rust
-- and applied by slot_commit.lua only if none of it moved meanwhile.
-- KEYS: route [, caller]. ARGV: caller cooldown, caller floor, now,
-- intent, then the deadlines ahead of it (slots::ahead_range: from, to;
-- -1 for none).
-- Reply: 'ok', route cooldown, route backoff floor, caller cooldown,
-- caller floor, freeze, pacing version, pacing state (false: none),
-- cursor, the intent's pending slot (-1: none), intents ahead, intents
-- asking.
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
local now, intent = tonumber(ARGV[3]), ARGV[4]
local st = route_open(KEYS[1], now, { 'pv', 'p', 'cu' })
if not st then return { 'ok', 0, 0, ccd, cfloor, false, 0, false, 0, -1, 0, 0 } end
local sp, sa = slot_keys(KEYS[1])
local pending = tonumber(redis.call('ZSCORE', sp, intent) or -1)
-- Intents past their deadline are not ahead of anyone.
local ahead = 0
if ARGV[5] ~= '-1' then
  local from = math.max(tonumber(ARGV[5]), now + 1)
  ahead = redis.call('ZCOUNT', sa, from, '(' .. ARGV[6])
end
local asking = slots_waiting(KEYS[1], now)
return {
  'ok', st.k.cd, st.k.bo, ccd, cfloor, st.frozen or false,
  tonumber(st.raw.pv or 0), st.raw.p or false, tonumber(st.raw.cu or 0),
  pending, ahead, asking,
}
