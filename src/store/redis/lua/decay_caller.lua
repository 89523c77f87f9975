-- Redis Cluster only: a success narrows the caller scope's backoff step
-- (the caller key lives in another slot than the route's). KEYS: caller.
local c = load(KEYS[1])
if c then
  decay(c.hints)
  redis.call('SET', KEYS[1], cmsgpack.pack(c), 'KEEPTTL')
end
return { 'ok' }
