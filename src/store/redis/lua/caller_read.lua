-- A caller scope's hints, read-only. KEYS: caller.
-- Reply: 'ok', version, bytes (0, false: none).
local v, h = caller_hints(KEYS[1])
return { 'ok', v, h }
