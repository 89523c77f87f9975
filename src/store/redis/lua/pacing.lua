-- Learned pacing (src/pacing/mod.rs, window.rs and slot.rs), as functions a
-- script includes after the prelude: a line-for-line port on integers, so a
-- route paced by a Redis-backed coordinator and one paced in memory agree
-- exactly. The Rust module is the reference; change one, change the other.
--
-- Rates are milli-units per second. Every value is an integer below 2^53;
-- divisions are by positive divisors: `idiv` (prelude) for non-negative
-- numerators, math.floor for the one that can be negative (exact: a power
-- of two), and Rust's truncating `/` only appears where the operands are
-- non-negative or the result is clamped from below.
--
-- State: a table with the Rust field names (stored as hash fields or in the
-- route blob). Policy: { pinned_m = n or -1, known_m = n or -1, floor_m,
-- ceiling_m, horizon_ms }.

local PACE_WINDOW = 1000
local PACE_GRANULARITY = 1000
local PACE_EXTENSIONS = 2
local PACE_CATCH_UP = 16
local PACE_DRAIN_WINDOWS = 64
local PACE_HEADROOM = 8
local MILLI = 1000
local M_STEADY, M_PROBING, M_BACKING_OFF = 0, 1, 2
local M_PENALTY, M_PINNED, M_KNOWN, M_SATURATED = 3, 4, 5, 6
local PACE_FIELDS = {
  'win', 'w_first', 'w_ok', 'w_rej', 'w_refused', 'w_granted', 'w_held', 'w_cut_from', 'w_short', 'w_frozen',
  'w_late', 'rate_m',
  'rate_max_m', 'rate_ok_m', 'cap_m', 'lam_m', 'hint_until', 'streak', 'closed_until',
  'penalty_until', 'probe_at', 'mode', 'ramp_from_m', 'settle_win',
}

-- just_under: a sixteenth under a rate.
local function pace_just_under(rate) return rate - idiv(rate, 16) end

local function pace_clear_window(p)
  p.w_first, p.w_ok, p.w_rej, p.w_granted, p.w_short, p.w_frozen = 0, 0, 0, 0, 0, 0
  p.w_cut_from, p.w_refused, p.w_held, p.w_late = 0, 0, 0, 0
end

local function pace_apply_policy(p, P)
  if p.mode == M_PENALTY then return end
  local hi = math.max(P.ceiling_m, P.floor_m)
  if P.pinned_m >= 0 then
    p.rate_m = math.max(P.pinned_m, 1)
    p.mode = M_PINNED
  elseif P.known_m >= 0 then
    p.cap_m = P.known_m
    local room = math.min(math.max(math.max(P.known_m - p.lam_m, 0), P.floor_m), hi)
    if p.mode == M_BACKING_OFF then
      p.rate_m = math.min(p.rate_m, room)
    else
      p.rate_m = room
    end
    p.mode = M_KNOWN
  elseif p.mode == M_PINNED or p.mode == M_KNOWN then
    p.mode = M_STEADY
  end
end

local function pace_new(now, P)
  local p = { win = math.floor(now / PACE_WINDOW), rate_m = P.floor_m }
  for _, f in ipairs(PACE_FIELDS) do p[f] = p[f] or 0 end
  pace_apply_policy(p, P)
  return p
end

-- Reads the state from a flat HGETALL reply; missing fields read as 0.
local function pace_from_hash(flat, now, P)
  if not flat or #flat == 0 then return pace_new(now, P) end
  local p = {}
  for _, f in ipairs(PACE_FIELDS) do p[f] = 0 end
  for i = 1, #flat, 2 do p[flat[i]] = tonumber(flat[i + 1]) end
  return p
end

local function pace_to_hash(p)
  local out = {}
  for _, f in ipairs(PACE_FIELDS) do
    out[#out + 1] = f
    out[#out + 1] = p[f]
  end
  return out
end

-- PacingState::floor_for: a held first attempt waits out a cooldown only
-- as far as it closes the route.
local function pace_floor_for(p, route_floor, first_attempt, now)
  if first_attempt then return math.min(route_floor, math.max(p.closed_until, now)) end
  return route_floor
end

local function pace_spare(p) return math.max(p.cap_m - p.lam_m, 0) end

-- PacingState::straight_first: first attempts the window sent straight.
local function pace_straight_first(p)
  return math.max(p.w_first - p.w_held, 0)
end

-- PacingState::adaptive: the rate is learned as a retry rate.
local function pace_adaptive(p)
  return p.mode == M_STEADY or p.mode == M_PROBING or p.mode == M_BACKING_OFF
end

-- PacingState::rate_at: while slow start ramps, the straight line from the
-- rate the window began at to rate_m at its end.
local function pace_rate_at(p, now)
  local from = p.ramp_from_m
  if from <= 0 or from >= p.rate_m or not pace_adaptive(p) then return p.rate_m end
  local into = math.min(math.max(now - p.win * PACE_WINDOW, 0), PACE_WINDOW)
  return from + idiv((p.rate_m - from) * into, PACE_WINDOW)
end

local function pace_wake_rate(p, now)
  if p.mode == M_PENALTY then return 0 end
  return pace_rate_at(p, now)
end

local function pace_grown(p, ramped_from)
  local r = p.rate_m
  if p.rate_max_m == 0 then
    local climbed = 0
    if ramped_from > 0 then climbed = r - ramped_from end
    local step = math.max(math.max(idiv(p.cap_m, PACE_HEADROOM), 2 * climbed), MILLI)
    local bound = 2 * p.cap_m - p.lam_m
    return math.min(r + step, math.max(bound, r))
  elseif r < p.rate_max_m then
    return math.max(p.rate_max_m, r + MILLI)
  end
  return r + math.max(idiv(r, 16), MILLI)
end

-- PacingState::rate_before_cut: the rate that drew the window's rejections.
local function pace_before_cut(p)
  if p.w_cut_from > 0 then return p.w_cut_from end
  return p.rate_m
end

-- PacingState::used: the window used the rate.
local function pace_used(p)
  local retries = math.max(p.w_ok + p.w_rej - p.w_first, 0)
  return 2 * math.max(p.w_granted, retries) * MILLI >= p.rate_m or p.w_short > 0
end

-- PacingState::probe_up: raises the rate after a window that used it and
-- drew nothing; a ramp proves where it began.
local function pace_probe_up(p, ramped_from, spare)
  p.rate_ok_m = p.rate_m
  if ramped_from > 0 and ramped_from < p.rate_m then p.rate_ok_m = ramped_from end
  local before = p.rate_m
  local slow_start = p.rate_max_m == 0
  local grown = pace_grown(p, ramped_from)
  if spare < 2 * p.rate_max_m then p.rate_m = grown else p.rate_m = math.max(spare, grown) end
  if p.rate_m >= 2 * p.rate_max_m then p.rate_max_m = 0 end
  if slow_start then p.ramp_from_m = before end
  p.mode = M_PROBING
end

local function pace_learn(p, P, ramped_from)
  local arrived = pace_straight_first(p) * MILLI
  if p.cap_m == 0 and p.lam_m == 0 then
    p.lam_m = arrived
  else
    p.lam_m = p.lam_m + math.floor((arrived - p.lam_m) / 4)
  end
  local served = p.w_ok * MILLI
  local used = pace_used(p)
  if p.w_rej > 0 then
    p.cap_m = served
    local measured = math.max(p.cap_m - p.lam_m, 0)
    local before = pace_before_cut(p)
    local fallback = idiv(before, 2)
    if p.rate_ok_m > 0 then fallback = math.min(p.rate_ok_m, before) end
    local cut = math.min(before, math.max(pace_just_under(measured), fallback))
    p.rate_ok_m = 0
    if math.min(measured, before) > fallback then
      p.rate_max_m = math.min(measured, before)
    else
      p.rate_max_m = cut + idiv(before - cut, 2)
    end
    p.rate_m = cut
    p.mode = M_BACKING_OFF
  else
    p.cap_m = math.max(p.cap_m, served)
    local spare = pace_spare(p)
    if used then
      pace_probe_up(p, ramped_from, spare)
    else
      p.rate_m = spare
      p.mode = M_STEADY
    end
  end
  p.rate_m = math.min(math.max(p.rate_m, P.floor_m), math.max(P.ceiling_m, P.floor_m))
end

local function pace_overflowed(p, over, under)
  local straight = pace_straight_first(p)
  return p.w_refused > 0 and p.w_ok > 0 and under * straight > over * p.w_ok
    and 2 * p.lam_m >= p.cap_m and straight * MILLI <= 2 * p.lam_m
end

-- PacingState::crowded: first attempts sent straight crowd out intents
-- that wait.
local function pace_crowded(p)
  local straight = pace_straight_first(p)
  return p.w_late > 0 and p.w_refused > 0 and p.w_ok > 0 and 2 * straight >= p.w_ok
end

local function pace_clamp(p, P)
  p.rate_m = math.min(math.max(p.rate_m, P.floor_m), math.max(P.ceiling_m, P.floor_m))
end

local function pace_overflowing(p, now)
  return pace_adaptive(p) and p.lam_m > 0 and now >= p.closed_until + idiv(PACE_WINDOW, 4)
    and 4 * p.w_first * MILLI >= p.lam_m and 4 * p.w_refused >= pace_straight_first(p)
    and pace_overflowed(p, 5, 4)
end

local function pace_saturate(p, P, edge, rate)
  p.cap_m = edge
  p.rate_m = rate
  pace_clamp(p, P)
  p.rate_ok_m = p.rate_m
  p.rate_max_m = edge
  p.ramp_from_m = 0
  p.w_cut_from = 0
  p.mode = M_SATURATED
end

-- PacingState::climb_saturated: halfway to a measured edge well under it;
-- from near it on, a rate is held one more clean window before each step;
-- past a quarter beyond it, or with none known, slow start.
local function pace_climb_saturated(p)
  local r, edge = p.rate_m, p.rate_max_m
  local near = r >= edge - idiv(edge, 16)
  if near and edge > 0 and p.rate_ok_m ~= r then
    p.rate_ok_m = r
    return
  end
  p.rate_ok_m = r
  local step
  if not near then
    step = math.max(idiv(r, 16), idiv(edge - r, 2))
  elseif r < edge then
    step = idiv(r, 16)
  elseif r < edge + idiv(edge, 8) then
    -- Just past the edge a limiter's burst hides the overshoot: half steps.
    step = idiv(r, 32)
  elseif r < edge + idiv(edge, 4) then
    step = idiv(r, 16)
  else
    -- The upstream has grown (or no edge is known): slow start, taken at
    -- the window's start (rate_at ramps only a retry rate).
    step = math.min(math.max(2 * (r - edge), idiv(r, 16)), r)
  end
  p.rate_m = r + math.max(step, MILLI)
end

local function pace_learn_saturated(p, P)
  p.lam_m = p.lam_m + math.floor((p.w_first * MILLI - p.lam_m) / 4)
  local served = p.w_ok * MILLI
  if p.w_frozen == 1 then
    -- Became saturated in this window: nothing to learn.
  elseif p.w_refused > 0 then
    local before = pace_before_cut(p)
    p.cap_m = served
    p.rate_m = math.max(pace_just_under(served), idiv(before, 2))
    p.rate_ok_m = p.rate_m
    if p.rate_m < served then p.rate_max_m = served else p.rate_max_m = 0 end
    p.settle_win = p.win + 1
  elseif p.w_short > 0 then
    p.cap_m = math.max(p.cap_m, served)
    if 8 * p.w_granted * MILLI >= 7 * p.rate_m then pace_climb_saturated(p) end
  elseif p.hint_until <= p.win * PACE_WINDOW then
    p.cap_m = math.max(p.cap_m, served)
    p.rate_m = pace_spare(p)
    p.rate_ok_m, p.rate_max_m = 0, math.max(p.rate_m, MILLI)
    p.mode = M_STEADY
  end
  pace_clamp(p, P)
end

-- PacingState::reopens_window: a closing hint covered the window's start
-- but ended in its first half, and nothing was refused since.
local function pace_reopens_window(p)
  local start = p.win * PACE_WINDOW
  return pace_adaptive(p) and start < p.closed_until
    and p.closed_until <= start + idiv(PACE_WINDOW, 2) and p.w_refused == 0
end

-- PacingState::reopens_next_window: an outage (the window served under
-- half the first-attempt rate) whose closing hint ended in the window's
-- second half, on a route that knows no edge yet.
local function pace_reopens_next_window(p)
  local start = p.win * PACE_WINDOW
  return pace_adaptive(p) and p.rate_max_m == 0 and 2 * p.w_ok * MILLI < p.lam_m
    and start + idiv(PACE_WINDOW, 2) < p.closed_until
    and p.closed_until <= start + PACE_WINDOW
end

local function pace_close_window(p, P)
  local ramped_from = p.ramp_from_m
  p.ramp_from_m = 0
  local closed = p.win * PACE_WINDOW < p.closed_until or p.mode == M_PENALTY
  -- Only the rate grows (PacingState::close_window).
  if pace_reopens_window(p) then
    if pace_used(p) then
      pace_probe_up(p, ramped_from, pace_spare(p))
      pace_clamp(p, P)
    end
  elseif closed then
    -- Nothing to learn from; an outage whose closing hint ended in the
    -- window's second half starts slow start with the next window.
    if pace_reopens_next_window(p) then
      pace_probe_up(p, 0, pace_spare(p))
      pace_clamp(p, P)
    end
  elseif p.mode == M_SATURATED then
    pace_learn_saturated(p, P)
  else
    -- Rejections a short cooldown explained: a cut's stragglers in the
    -- window after it; beyond, the rate steps down a sixteenth.
    if p.w_rej == 0 and p.w_refused > 0 and pace_adaptive(p) then
      if p.mode == M_BACKING_OFF then
        p.mode = M_STEADY
      else
        local before = p.rate_m
        p.cap_m = math.min(p.cap_m, p.lam_m + before)
        local down = math.min(pace_just_under(before), math.max(pace_spare(p), idiv(before, 2)))
        local edge = down + idiv(before - down, 2)
        if p.rate_max_m > 0 then p.rate_max_m = math.min(p.rate_max_m, edge) else p.rate_max_m = edge end
        p.rate_m = math.max(down, P.floor_m)
      end
    end
    local known = p.cap_m
    if p.w_frozen == 0 or p.w_rej > 0 then pace_learn(p, P, ramped_from) end
    if pace_adaptive(p) and (pace_overflowed(p, 17, 16) or pace_crowded(p)) then
      -- What it served, not above the capacity known before it.
      local edge = p.w_ok * MILLI
      if known > 0 then edge = math.min(edge, known) end
      pace_saturate(p, P, edge, pace_just_under(edge))
      -- The next window mixes two regimes: nothing is learned from it.
      pace_clear_window(p)
      p.w_frozen = 1
      return
    end
  end
  -- Refused attempts and served none: the upstream was out, whatever its
  -- hints said; the next window is at best its first back, as under a
  -- closing hint (PacingState::close_window).
  if pace_adaptive(p) and p.w_ok == 0 and p.w_refused > 0 then
    p.closed_until = math.max(p.closed_until, (p.win + 2) * PACE_WINDOW)
  end
  pace_clear_window(p)
end

-- PacingState::reopen: slow start begins as soon as a closing hint that
-- ended in the window's first half has passed; once per window.
local function pace_reopen(p, now, P)
  if pace_reopens_window(p) and p.closed_until <= now and p.rate_max_m == 0
      and p.ramp_from_m == 0 then
    pace_probe_up(p, 0, pace_spare(p))
    pace_clamp(p, P)
  end
end

local function pace_advance(p, now, P)
  local now_win = math.floor(now / PACE_WINDOW)
  local steps = 0
  while p.win < now_win and steps < PACE_CATCH_UP do
    pace_close_window(p, P)
    p.win = p.win + 1
    steps = steps + 1
  end
  p.win = math.max(p.win, now_win)
  pace_apply_policy(p, P)
  pace_reopen(p, now, P)
end

local function pace_track_hint(p, now, untl)
  if untl > p.hint_until + PACE_GRANULARITY then
    if now < p.hint_until then p.streak = p.streak + 1 else p.streak = 0 end
    p.hint_until = untl
  else
    p.hint_until = math.max(p.hint_until, untl)
  end
  if p.mode == M_PENALTY then
    p.penalty_until = math.max(p.penalty_until, p.hint_until)
    p.probe_at = 0
  elseif p.streak >= PACE_EXTENSIONS then
    p.mode = M_PENALTY
    p.penalty_until = p.hint_until
    p.probe_at = 0
  end
end

local function pace_leave_penalty(p, P)
  p.mode = M_STEADY
  p.streak, p.penalty_until, p.probe_at = 0, 0, 0
  pace_clear_window(p)
  pace_apply_policy(p, P)
end

-- One report: first attempts, successes, rejections (>= #hints), the end
-- instant of each valid hint, and the cooldown before this report merged.
local function pace_observe(p, P, now, first, ok, rejections, hints, cooldown, cooldown_after)
  pace_advance(p, now, P)
  p.w_first = p.w_first + first
  p.w_ok = p.w_ok + ok
  rejections = math.max(rejections, #hints)
  if cooldown_after - now > 2 * PACE_WINDOW then
    p.closed_until = math.max(p.closed_until, cooldown_after)
  end
  for _, u in ipairs(hints) do pace_track_hint(p, now, u) end
  if p.mode == M_PENALTY then
    if ok > 0 and now >= p.penalty_until then pace_leave_penalty(p, P) end
    return
  end
  if ok > 0 and now >= p.hint_until then p.streak = 0 end
  local closing, inside = 0, 0
  for _, u in ipairs(hints) do
    if u - now > 2 * PACE_WINDOW then
      closing = closing + 1
    elseif u <= p.closed_until then
      -- Drawn inside the latest closure and reported after it.
      inside = inside + 1
    end
  end
  local explained = 0
  if #hints > 0 then explained = idiv(rejections * (closing + inside), #hints) end
  if p.mode == M_SATURATED and p.win == p.settle_win and now < cooldown then
    -- The stragglers of the cut at the last window's end.
    return
  end
  p.w_refused = p.w_refused + rejections - explained
  if pace_overflowing(p, now) then
    local edge = idiv(p.lam_m * p.w_ok, math.max(p.w_first, 1))
    pace_saturate(p, P, edge, idiv(edge, 2))
    p.w_frozen = 1
  end
  local saturated = p.mode == M_SATURATED
  if now < cooldown and not saturated then
    if rejections > 0 then p.w_frozen = 1 end
    return
  end
  for _, u in ipairs(hints) do
    if u - now > 2 * PACE_WINDOW then p.closed_until = math.max(p.closed_until, u) end
  end
  if closing > 0 then p.w_frozen = 1 end
  p.w_rej = p.w_rej + rejections - explained
  local answered = p.w_rej
  if saturated then answered = p.w_refused end
  local learning = pace_adaptive(p) or saturated
  local switching = saturated and p.w_frozen == 1
  if answered > 0 and p.w_cut_from == 0 and learning and not switching then
    local drew = pace_rate_at(p, now)
    p.w_cut_from = drew
    local back = idiv(p.rate_m, 2)
    if saturated then
      back = pace_just_under(p.rate_ok_m)
    elseif p.rate_ok_m > 0 then
      back = p.rate_ok_m
    end
    p.rate_m = math.max(math.min(drew, back), P.floor_m)
    p.ramp_from_m = 0
    if not saturated then p.mode = M_BACKING_OFF end
  end
end

-- drain_ms in slot.rs: the wait of `waiting` intents if the rate doubled
-- every window up to the ceiling.
local function pace_drain_ms(waiting, rate, ceiling, saturated)
  local left = math.min(math.max(waiting, 0), MAX_PENDING) * MILLI
  rate = math.max(rate, 1)
  local windows = 0
  while left > 0 and windows < PACE_DRAIN_WINDOWS do
    left = left - rate
    if not saturated then rate = math.min(2 * rate, math.max(ceiling, rate)) end
    windows = windows + 1
  end
  return windows * PACE_WINDOW
end

-- PacingState::after_hot_first_attempts_us: while first attempts run faster
-- than their average, the window's next retry starts after the slots granted
-- in it and one interval per first attempt beyond the average's share, within
-- the window.
local function pace_after_hot_first(p, now, interval)
  if not pace_adaptive(p) or p.lam_m <= 0 then return 0 end
  local start = p.win * PACE_WINDOW
  local into = math.min(math.max(now - start, 0), PACE_WINDOW)
  local expected = idiv(p.lam_m * into, PACE_WINDOW) + idiv(p.lam_m, 8)
  local straight = pace_straight_first(p) * MILLI
  local excess = idiv(math.max(straight - expected, 0), MILLI)
  if excess == 0 then return 0 end
  local taken = math.min(math.max(p.w_granted + excess, 0), MAX_PENDING)
  return start * 1000 + math.min(taken * interval, PACE_WINDOW * 1000)
end

-- The slot decision at wake time. Returns one of
--   'slot', at_ms, cursor_us | 'again', at_ms | 'infeasible', at_ms
local function pace_decide(p, P, now, ask_floor, deadline, reserve, jitter, waiting, cursor,
                           first_attempt)
  local held = first_attempt and 1 or 0
  pace_advance(p, now, P)
  local floor = math.max(ask_floor, now)
  jitter = math.min(jitter, JITTER_SCALE - 1)
  local function spread(span) return idiv(span * jitter, JITTER_SCALE) end
  if p.mode == M_PENALTY then
    local opens = math.max(floor, p.penalty_until)
    if opens + reserve > deadline then return 'infeasible', opens end
    if now < opens then return 'again', opens + spread(PACE_WINDOW) end
    if p.probe_at == 0 or now - p.probe_at > 2 * PACE_WINDOW then
      p.probe_at = now
      p.w_granted = p.w_granted + 1
      p.w_held = p.w_held + held
      return 'slot', now, math.max(cursor, now * 1000)
    end
    return 'again', now + PACE_WINDOW + spread(PACE_WINDOW)
  end
  local rate = pace_rate_at(p, now)
  local interval = idiv(1000 * MILLI * MILLI + rate - 1, math.max(rate, 1))
  local booked = math.max(cursor, floor * 1000)
  local hot = pace_after_hot_first(p, now, interval)
  local start = math.max(booked, hot)
  local slot = idiv(start + spread(interval), 1000)
  local horizon = math.max(P.horizon_ms, 1)
  -- Earlier deadlines go first, unless little is booked ahead
  -- (PacingState::decide).
  local queued = 0
  if cursor > (now + idiv(horizon, 2)) * 1000 then
    queued = math.min(math.min(math.max(waiting, 0), MAX_PENDING) * interval, 1e15)
  end
  if math.floor((start + queued) / 1000) <= now + horizon then
    if slot + reserve > deadline then return 'infeasible', slot end
    p.w_granted = p.w_granted + 1
    p.w_held = p.w_held + held
    return 'slot', slot, start + interval
  end
  if floor + reserve > deadline then return 'infeasible', floor end
  -- Only first attempts running hot put it past the horizon: demand the
  -- window had, not late; ask again when the window's share frees
  -- (PacingState::decide).
  local last_chance = math.max(deadline - reserve - horizon, now + 1)
  if math.floor((booked + queued) / 1000) <= now + horizon then
    p.w_short = p.w_short + 1
    local freed = math.floor(hot / 1000) - idiv(horizon, 2) + spread(idiv(horizon, 2))
    return 'again', math.min(math.max(freed, now + 1), last_chance)
  end
  local short = floor <= now + horizon
  if short then
    p.w_short = p.w_short + 1
    -- Its turn in deadline order, at the rate in force (PacingState::decide).
    local turn = start + math.min(math.min(math.max(waiting, 0), MAX_PENDING) * interval, 1e15)
    if math.floor(turn / 1000) + reserve > deadline then p.w_late = p.w_late + 1 end
  end
  local estimate = slot + pace_drain_ms(waiting, rate, P.ceiling_m, p.mode == M_SATURATED)
  local gap = estimate - now - horizon
  -- Rust truncates toward zero; a negative gap is replaced below either way.
  local part = gap >= 0 and idiv(gap * 7, 8) or -idiv(-gap * 7, 8)
  local toward = now + math.max(part, idiv(horizon, 2))
  local span = idiv(horizon, 2)
  if short then
    local quarter = gap >= 0 and idiv(gap, 4) or -idiv(-gap, 4)
    span = math.max(quarter, span)
  end
  local again = math.max(toward, floor - horizon) + spread(span)
  return 'again', math.min(again, last_chance)
end

-- The pacing policy from five arguments starting at ARGV[i] (pinned, known
-- limit, floor, ceiling, horizon; -1 for none), as scripts.rs pacing_args
-- writes them.
local function pace_policy(i)
  return {
    pinned_m = tonumber(ARGV[i]), known_m = tonumber(ARGV[i + 1]),
    floor_m = tonumber(ARGV[i + 2]), ceiling_m = tonumber(ARGV[i + 3]),
    horizon_ms = tonumber(ARGV[i + 4]),
  }
end

-- The route's pacing, started under P if it has none (stored in the route
-- blob as `st.pace`).
local function pace_of(st, now, P)
  if not st.pace then st.pace = pace_new(now, P) end
  return st.pace
end

-- Appends what an operator sees (PacingState::view, PACING_VIEW_FIELDS in
-- reply.rs): mode, wake rate, capacity, first-attempt rate, spare, penalty
-- end, intents asking, the end of the latest closing hint.
local function pace_view_out(out, p, asking, now)
  out[#out + 1] = p.mode
  out[#out + 1] = pace_wake_rate(p, now)
  out[#out + 1] = p.cap_m
  out[#out + 1] = p.lam_m
  out[#out + 1] = pace_spare(p)
  out[#out + 1] = p.mode == M_PENALTY and p.penalty_until or 0
  out[#out + 1] = asking
  out[#out + 1] = p.closed_until
end
