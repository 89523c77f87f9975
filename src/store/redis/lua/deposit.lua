-- Deposits first attempts (they grow the allowance) and successes (each
-- narrows the backoff step of the route and, if it exists, of its caller
-- scope). KEYS: route [, caller]. ARGV: now, idle_ms, worker, class (1..3),
-- first attempts, successes, window seconds.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local wid, p = ARGV[3], tonumber(ARGV[4])
local first, successes, window = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if successes > 0 and KEYS[2] then
  local c = load(KEYS[2])
  if c then
    decay(c.hints)
    redis.call('SET', KEYS[2], cmsgpack.pack(c), 'KEEPTTL')
  end
end
local st = route_get(KEYS[1], now)
s_add(st.fa, sec_of(now), first)
touch(st.cls[p], wid, now, window * 1000)
if successes > 0 then decay(st.hints) end
save(KEYS[1], st, live_until(st, now), now, idle_ms)
return { 'ok' }
