-- Redis Cluster only: the caller scope's (cooldown, floor), read before a
-- route script that cannot touch this key's slot. KEYS: caller.
local c = load(KEYS[1])
if not c then return { 'ok', 0, 0 } end
return { 'ok', c.hints.cd, hints_floor(c.hints) }
