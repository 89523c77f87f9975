-- Ends a lease, refunding granted - spent + retry_successes
-- (BudgetLedger::release). An expired lease is gone: its tokens stay spent.
-- Creates nothing.
-- KEYS: route. ARGV: now, idle_ms, worker, lease id, spent, retry successes.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local wid, id, spent = ARGV[3], ARGV[4], tonumber(ARGV[5])
local successes = tonumber(ARGV[6]) or 0
local st = load(KEYS[1])
if not st then return { 'err', 'lease_not_found' } end
st = route_upgrade(KEYS[1], st, now)
local l = lease_get(KEYS[1], id)
if not l then return { 'err', 'lease_not_found' } end
if l.exp <= now then
  lease_drop(KEYS[1], id)
  return { 'err', 'lease_not_found' }
end
if l.w ~= wid then return { 'err', 'lease_not_found' } end
if spent > l.g then return { 'err', 'spent_exceeds_grant', l.g } end
if successes > spent then return { 'err', 'successes_exceed_spent' } end
lease_drop(KEYS[1], id)
-- A retry that succeeded earns its token back, like an unspent one.
local returned = l.g - spent + successes
local refund = returned * l.c
local cls = st.cls[l.p]
s_refund(cls.spent, l.sec, refund)
local w = worker(cls, wid)
if w then flat_refund(w.f, l.sec, refund) end
save(KEYS[1], st, live_until(st, now), now, idle_ms)
return { 'ok', returned }
