-- One worker report as one state change (Store::report): deposits the
-- first attempts, narrows the backoff of the route and of its caller scope
-- on successes, merges every hint in order, and answers the route's state
-- afterwards. KEYS: route [, caller] (one node). On a cluster the caller key
-- lives in another slot: its half of the report ran in report_caller.lua
-- just before, every hint here is the route's, and the caller's cooldown and
-- floor arrive as ARGV[1..2].
-- ARGV: caller cooldown, caller floor, now, idle_ms, worker, class (1..3),
-- first attempts, successes, window seconds, backoff base, backoff max,
-- hint count, then HINT_FIELDS per hint, then the corroboration keys
-- (corr_rules).
-- Reply: 'ok', MERGE_FIELDS per hint (merge_hint), then cooldown, floor,
-- freeze of the route's view, whether the cooldown is corroborated, the
-- cooldown before the report, the pacing version and state (false: none)
-- and the intents asking: what pacing, in Rust, takes the report's counts
-- in with (pace_commit.lua writes what it decides).
local now, idle_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local wid, p = ARGV[5], tonumber(ARGV[6])
local first, successes, window = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local base, max, n = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local c, c_merged = nil, false
if KEYS[2] then c = load(KEYS[2]) end
if successes > 0 and c then decay(c.hints) end
local st = route_get(KEYS[1], now, { 'h', 'p', 'pv', 'fa', CLASS_KEY[p] .. wid })
-- Rejections that arrive while a cooldown already held are explained by it:
-- pacing is told the cooldown as it was before this report.
local cd_before = math.max(st.hints.cd, c and c.hints.cd or tonumber(ARGV[1]))
s_add(st, 0, sec_of(now), first)
touch(st, p, wid, now, window * 1000)
if successes > 0 then decay(st.hints) end
local R = corr_rules(13 + n * HINT_FIELDS)
-- The active workers (the whole fleet read) matter only to a hint.
local active = 0
if n > 0 then active = active_workers(st, now, window * 1000) end
local out = { 'ok' }
for i = 1, n do
  local a = hint_at(13 + (i - 1) * HINT_FIELDS)
  if a.route then
    merge_hint(out, st.hints, a, now, base, max, wid, active, R)
  else
    if not KEYS[2] then return { 'err', 'caller_hint_needs_caller_key' } end
    c = caller_for_hint(c, now)
    c_merged = true
    merge_hint(out, c.hints, a, now, base, max, wid, active, R)
  end
end
local ccd, cfloor = caller_floor(tonumber(ARGV[1]), tonumber(ARGV[2]))
if c then ccd, cfloor = c.hints.cd, hints_floor(c.hints) end
local cd_after = math.max(st.hints.cd, ccd)
route_save(st, idle_ms)
if c and (c_merged or successes > 0) then caller_save(KEYS[2], c, c_merged, now, idle_ms) end
out[#out + 1] = cd_after
out[#out + 1] = math.max(hints_floor(st.hints), cfloor)
out[#out + 1] = st.frozen or false
-- Whether the effective cooldown's level has it corroborated (on a cluster
-- the caller's is not known here: not corroborated).
local function corroborated(h) return h.corr ~= nil and h.corr.c == 1 end
local corr = corroborated(st.hints)
if ccd > st.hints.cd then corr = c ~= nil and corroborated(c.hints) end
out[#out + 1] = corr and 1 or 0
out[#out + 1] = cd_before
out[#out + 1] = tonumber(st.raw.pv or 0)
out[#out + 1] = st.raw.p or false
out[#out + 1] = slots_waiting(KEYS[1], now)
return out
