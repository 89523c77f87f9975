-- A caller scope's hints for the Admin API, read-only. KEYS: caller.
-- Returns cooldown, floor, then the recent hints (hints_out), then the
-- evidence (evidence_out).
local c = load(KEYS[1])
if not c then c = { hints = hints_new() } end
local out = { 'ok', c.hints.cd, hints_floor(c.hints) }
hints_out(out, c.hints)
evidence_out(out, c.hints)
return out
