-- Deletes one key if it is idle at `now` (the memory store's evict_idle
-- rule, in the coordinator's time): untouched for idle_ms and holding
-- nothing live (a mute in force counts). Expiry (PEXPIRE) does the same in
-- Redis's own time; this lets the sweeper apply the rule in the injected
-- clock's time too.
-- KEYS: one route or caller key. ARGV: now, idle_ms, is_route (1/0).
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
if ARGV[3] == '1' then
  local st = route_open(KEYS[1], now, {})
  if not st then return 0 end
  -- route_live: hints and mutes, leases, pending slots and asking intents.
  if st.k.t > now - idle_ms or st.frozen or route_live(st) > now then return 0 end
  redis.call('DEL', KEYS[1])
  leases_forget(KEYS[1])
  slots_forget(KEYS[1])
  return 1
end
local got = redis.call('HMGET', KEYS[1], 't', 'hl')
if not got[1] then return 0 end
if tonumber(got[1]) > now - idle_ms or tonumber(got[2] or 0) > now then return 0 end
redis.call('DEL', KEYS[1])
return 1
