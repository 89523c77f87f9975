-- A route's effective state, merged with its caller scope's. Creates
-- nothing. KEYS: route [, caller]. ARGV: caller cooldown, caller floor,
-- now.
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = route_open(KEYS[1], tonumber(ARGV[3]), {})
if not st then return { 'ok', ccd, cfloor, false } end
return { 'ok', math.max(st.k.cd, ccd), math.max(st.k.cd, st.k.bo, cfloor), st.frozen or false }
