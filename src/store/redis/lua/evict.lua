-- Deletes one key if it is idle at `now` (the memory store's evict_idle
-- rule, in the coordinator's time): untouched for idle_ms and holding
-- nothing live (a mute in force counts). Expiry (PEXPIRE) does the same in
-- Redis's own time; this lets the sweeper apply the rule in the injected
-- clock's time too.
-- KEYS: one route or caller key. ARGV: now, idle_ms, is_route (1/0).
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = load(KEYS[1])
if not st then return 0 end
if st.touched > now - idle_ms or hints_live(st.hints) > now then return 0 end
if ARGV[3] == '1' then
  if st.frozen or (st.lexp or 0) > now then return 0 end
  for _, l in pairs(st.leases or {}) do if l.exp > now then return 0 end end
  for _, s in pairs(st.slots.pending) do if s > now then return 0 end end
  for _, d in pairs(st.slots.asking or {}) do if d > now then return 0 end end
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then leases_forget(KEYS[1]) end
return 1
