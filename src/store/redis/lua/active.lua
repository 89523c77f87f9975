-- Redis Cluster only: a route's active workers (read-only), for the caller
-- half of a report, which runs in another slot before the route's half
-- deposits: the reporter counts as active, as it will be once it has.
-- KEYS: route. ARGV: now, window_ms, worker. Reply: 'ok', active workers.
local now, window_ms, wid = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local st = route_open(KEYS[1], now, {})
if not st then return { 'ok', 1 } end
local n = active_workers(st, now, window_ms)
for p = 1, 3 do
  if class_workers(st, p)[wid] and worker_seen(st, p, wid) > now - window_ms then return { 'ok', n } end
end
return { 'ok', n + 1 }
