-- Ends a lease, refunding granted - spent + retry_successes
-- (BudgetLedger::release). An expired lease is gone: its tokens stay spent.
-- Creates nothing.
-- KEYS: route. ARGV: now, idle_ms, worker, lease id, spent, retry successes.
local now, idle_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local wid, id, spent = ARGV[3], ARGV[4], tonumber(ARGV[5])
local successes = tonumber(ARGV[6]) or 0
local l = lease_find(KEYS[1], id, wid)
if not l then return { 'err', 'lease_not_found' } end
local st = route_open(KEYS[1], now, { SERIES_FIELD[l.p], CLASS_KEY[l.p] .. wid })
if not st then return { 'err', 'lease_not_found' } end
if l.exp <= now then
  -- (The core's count is an upper bound: it may stay as it was.)
  lease_drop(st, l)
  return { 'err', 'lease_not_found' }
end
if l.w ~= wid then return { 'err', 'lease_not_found' } end
if spent > l.g then return { 'err', 'spent_exceeds_grant', l.g } end
if successes > spent then return { 'err', 'successes_exceed_spent' } end
lease_drop(st, l)
-- A retry that succeeded earns its token back, like an unspent one.
local returned = l.g - spent + successes
local refund = returned * l.c
s_refund(st, l.p, l.sec, refund)
local w = worker(st, l.p, wid)
if w then record_refund(w, l.sec, refund) end
-- A lease charged to its token's own spend too gives it back there.
local tag = string.match(id, '_(%x+)%.%d+%.%d+%.%d+%.%-?%d+$')
if tag then
  local name = own_untag(tag)
  local f = own_pairs(st, l.p, name)
  flat_refund(f, l.sec, refund)
  redis.call('HSET', st.key, own_field(l.p, name), doubles_pack(f))
end
route_save(st, idle_ms)
return { 'ok', returned }
