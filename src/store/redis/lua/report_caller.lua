-- Redis Cluster only: the caller-scope half of a report, because the caller
-- key lives in another slot than the route's. Narrows the caller scope's
-- backoff on successes and merges its hints (uncertain evidence), in order.
-- KEYS: caller. ARGV: now, idle_ms, successes, backoff base, backoff max,
-- hint count, then HINT_FIELDS per hint (all caller-level), then the
-- worker, the active workers to judge against, and the corroboration keys.
-- Reply: 'ok', MERGE_FIELDS per hint (merge_hint), then the caller
-- scope's cooldown and floor.
local now, idle_ms, successes = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local base, max, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local c = load(KEYS[1])
if successes > 0 and c then decay(c.hints) end
local extra = 7 + n * HINT_FIELDS
local wid, active, R = ARGV[extra], tonumber(ARGV[extra + 1]), corr_rules(extra + 2)
local out = { 'ok' }
for i = 1, n do
  c = caller_for_hint(c, now)
  merge_hint(out, c.hints, hint_at(7 + (i - 1) * HINT_FIELDS), now, base, max, wid, active, R)
end
if not c then
  out[#out + 1] = 0
  out[#out + 1] = 0
  return out
end
if n > 0 or successes > 0 then caller_save(KEYS[1], c, n > 0, now, idle_ms) end
out[#out + 1] = c.hints.cd
out[#out + 1] = hints_floor(c.hints)
return out
