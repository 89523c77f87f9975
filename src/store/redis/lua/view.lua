-- A route's effective state, merged with its caller scope's. Creates
-- nothing. KEYS: route [, caller]. ARGV: caller cooldown, caller floor.
local ccd, cfloor = caller_floor()
local st = load(KEYS[1])
if not st then return { 'ok', ccd, cfloor, false } end
return { 'ok', math.max(st.hints.cd, ccd), math.max(hints_floor(st.hints), cfloor), st.frozen or false }
