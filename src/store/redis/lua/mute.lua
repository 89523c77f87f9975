-- Mutes (until >= 0) or unmutes (until -1) one worker's evidence on a route
-- or a caller scope (Store::set_mute runs it once for each, so each key is
-- its own slot on a cluster). A mute keeps its key alive until it lapses.
-- KEYS: route or caller. ARGV: kind ('route' / 'caller'), now, idle_ms,
-- worker, until. Reply: 'ok', 1 (or 0 when the mute list is full).
local kind, now, idle_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local wid, until_ms = ARGV[4], tonumber(ARGV[5])
local st
if kind == 'route' then st = route_get(KEYS[1], now, { 'h' }) else st = caller_for_hint(load(KEYS[1]), now) end
local h = st.hints
h.mutes = h.mutes or {}
local n = 0
for id, t in pairs(h.mutes) do
  if t <= now then h.mutes[id] = nil else n = n + 1 end
end
local ok = 1
if until_ms < 0 then
  h.mutes[wid] = nil
elseif h.mutes[wid] or n < MAX_MUTES then
  h.mutes[wid] = until_ms
else
  ok = 0
end
if kind == 'route' then
  route_save(st, idle_ms)
else
  save(KEYS[1], st, hints_live(h), now, idle_ms)
end
return { 'ok', ok }
