-- Merges one assessed hint (HintState::merge): cooldown = max(current,
-- hint), a hintless rejection widens the backoff step, the evidence is kept
-- in a bounded ring either way. The same script serves a route key and a
-- caller-scope key (uncertain evidence): both hold `hints` and `touched`.
-- KEYS: route or caller. ARGV: now, idle_ms, is_route (1/0), cooldown until
-- (-1 for none), widen (1/0), anchor, backoff base, backoff max, then the
-- record: raw (or ''), has_raw, form, valid, capped, clock_skew.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local is_route = ARGV[3] == '1'
local until_ms, widen, anchor = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6])
local base, max = tonumber(ARGV[7]), tonumber(ARGV[8])
local st
if is_route then
  st = route_get(KEYS[1], now)
else
  st = load(KEYS[1]) or { hints = hints_new(), touched = now }
  st.touched = math.max(st.touched, now)
end
local h = st.hints
local before = h.cd
if until_ms >= 0 then h.cd = math.max(h.cd, until_ms) end
if widen then
  h.step = math.min(h.step + 1, MAX_BACKOFF_STEP)
  h.bo = math.max(h.bo, anchor + backoff_ms(h, base, max))
end
if #h.recent >= RECENT_HINTS then table.remove(h.recent, 1) end
h.recent[#h.recent + 1] = {
  at = now, raw = ARGV[9], has_raw = ARGV[10] == '1', form = ARGV[11],
  valid = ARGV[12] == '1', capped = ARGV[13] == '1', skew = ARGV[14] == '1',
}
-- The cooldown this hint asked for, so an operator can tell which hint a
-- scope's cooldown came from.
if until_ms >= 0 then h.recent[#h.recent].cd = until_ms end
if is_route then
  save(KEYS[1], st, live_until(st, now), now, idle_ms)
else
  save(KEYS[1], st, hints_floor(h), now, idle_ms)
end
local raised = 0
if h.cd > before and h.cd > now then raised = 1 end
return { 'ok', raised, h.cd, backoff_ms(h, base, max) }
