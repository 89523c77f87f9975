-- Redis Cluster only: the caller scope's (cooldown, floor), read before a
-- route script that cannot touch this key's slot. KEYS: caller.
local got = redis.call('HMGET', KEYS[1], 'cd', 'fl')
return { 'ok', tonumber(got[1] or 0), tonumber(got[2] or 0) }
