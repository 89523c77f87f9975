//! The clairvoyant bound: the most intents any scheduler could serve, given
//! the run's arrivals, deadlines and cancellations and the limiter in force
//! (same shape, burst or window, capacity over time, outage). Each intent
//! needs one admitted attempt, sent at or after its arrival, strictly before
//! its deadline and not after its cancellation; the scheduler knows the
//! future and is never refused, so no rejection costs anything.
//!
//! # Why not earliest-deadline-first as soon as the limiter allows
//! EDF with work conservation is optimal when service opportunities are
//! fixed points in time. A limiter's are not: capacity not used now is
//! *banked* (a bucket's tokens, a window's unused quota), and spending it
//! early on an intent that could have waited can starve one that arrives
//! later with less time. One token a second, bucket of one, full at 0:
//! A arrives at 0 (deadline 10 s), B at 0.5 s (deadline 0.9 s). Greedy
//! serves A at once and B finds no token before its deadline; holding A
//! serves B at 0.5 s and A at 1.5 s. (`tests.rs` has such a case with an
//! outage.) So the greedy schedule is only a lower bound, and the bound is
//! computed as a pair:
//!
//! - [`Bound::served`]: an **upper bound**, the exact optimum of a
//!   relaxation solved exactly. No scheduler serves more.
//! - [`Bound::witnessed`]: a **schedule the limiter admits**: replayed
//!   through the very [`Limiter`] the upstream runs, so no argument is
//!   needed for it. The optimum lies between the two; when they are equal
//!   the bound is exact, and the report prints both.
//!
//! # The relaxation, per shape: unit slots
//! Each shape is turned into integer *slots*, one admission each, such that
//! every intent may use a contiguous range of them; the most intents that
//! get distinct slots is then found exactly by Jackson's rule (sweep the
//! slots in order, give each to the waiting intent whose range ends first:
//! optimal for convex bipartite matching, Glover 1967).
//!
//! - **Token bucket.** Number the capacity ever earned as a line: the
//!   frontier `hi(t)` = initial bucket + capacity earned by `t`. A bucket
//!   spending its oldest fluid first holds the stretch `[lo, hi(t)]`, and
//!   `lo` can only be pushed up: by admissions (one unit each), by overflow
//!   (`lo ≥ hi(u) − size(u)` at every `u`), and by the outage's reset
//!   (`lo ≥ hi(outage start)` after it). Write `m(t)` for the last two. A
//!   schedule is admissible iff its admissions can take disjoint unit
//!   stretches `[x, x+1]` with `m(t) ≤ x ≤ hi(t) − 1` at each admission's
//!   time `t` (the bucket's `lo` after the k-th admission is
//!   `max(lo_{k−1} + 1, m(t_k))`, at most any such `x_k` by induction; `m`
//!   and `hi` are non-decreasing, so admissions can be taken in time
//!   order). An intent may then take any `x` in `[m(first open instant),
//!   hi(last open instant) − 1]`. Rounding every `x` down to an integer
//!   keeps distinct stretches distinct and each inside its intent's
//!   rounded range, so the integer problem serves at least as many: an
//!   upper bound, exact unless the real-valued offsets of the stretches
//!   matter (with a bucket of one token they can; with 100 they rarely do).
//! - **Fixed window.** A window's slots are its quota; the j-th admission in
//!   a window needs a quota in force of at least j at its instant. With the
//!   quota replaced by its running maximum since the window's start
//!   (which only relaxes it, and equals it unless the capacity drops inside
//!   a window), slot j of a window is usable from the first instant that
//!   maximum reaches j+1, and an intent's slots run from the first slot of
//!   its first open window to the last usable one at its last open instant.
//!   Exact when no window holds a drop in capacity.
//! - **Sliding window.** Any window of the fixed tiling holds at most the
//!   quota of a sliding one (an admission's trailing window contains its
//!   whole tile so far), at any offset of the tiling: the fixed-window
//!   bound at offsets 0, ¼, ½ and ¾ of the window, the least of them.
//!
//! # The witness
//! Two schedules are replayed through a [`Limiter`] with no rejection cost:
//! the greedy one (each intent ready at its arrival, served earliest
//! deadline first whenever the limiter admits), and the relaxation's own
//! (each intent ready when its slot is: for the bucket, the slots' integer
//! stretches moved up to real positions in slot order, skipping the one
//! the outage's reset makes unusable). The larger count is the witness.
//!
//! # Exactness of the arithmetic
//! Times are nanoseconds, as the tokio clock's; token instants are computed
//! in closed form (`frontier`, `time_of`), not by stepping. The relaxations'
//! integer ranges round values that are within 1e-12 (relative) of an
//! integer to that integer: at a run's magnitudes (≤ 10⁶ tokens) that is
//! under a nanosecond of capacity, a tie the clock could not order either.
//! The witness needs no such care: the limiter itself admitted it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use serde::Serialize;

use super::StormConfig;
use super::arrivals::Arrival;
use super::limiter::{Decision, Limiter, LimiterShape, QUOTA_SLACK, bucket_size, next_break};

const NANO: Duration = Duration::from_nanos(1);

/// One intent as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Job {
    /// No attempt before it.
    pub(crate) arrive: Duration,
    /// The last instant an attempt may be sent: a nanosecond before the
    /// deadline, or the cancellation instant if that is earlier (an attempt
    /// at the very instant of cancellation is a tie, as the upstream counts
    /// it).
    pub(crate) last: Duration,
}

impl Job {
    /// The intent of `arrival`, with the run's end-to-end `deadline`.
    pub(crate) fn new(arrival: &Arrival, deadline: Duration) -> Self {
        let due = arrival.at + deadline - NANO;
        Job {
            arrive: arrival.at,
            last: arrival
                .cancel_after
                .map_or(due, |after| due.min(arrival.at + after)),
        }
    }
}

/// What the most capable scheduler could serve in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bound {
    /// No scheduler serves more intents than this (an exactly solved
    /// relaxation; see the module doc).
    pub served: u64,
    /// A schedule the limiter admits serves this many: the optimum is at
    /// least this. Equal to `served` when the bound is exact.
    pub witnessed: u64,
}

/// The bound for `jobs` under `config`'s limiter and capacity.
pub(crate) fn bound(config: &StormConfig, jobs: &[Job]) -> Bound {
    let horizon = jobs.iter().map(|j| j.last).max().unwrap_or_default() + NANO;
    let (slots, plan) = match config.limiter {
        LimiterShape::TokenBucket { burst_s } => {
            let index = TokenIndex {
                config,
                burst_s,
                start: bucket_size(config, burst_s, Duration::ZERO),
            };
            let slots = jackson(&jobs.iter().map(|j| index.range(j)).collect::<Vec<_>>());
            let plan = index.plan(jobs, &slots);
            (slots, plan)
        }
        LimiterShape::FixedWindow { window_s } => {
            let tiles = Tiles::new(
                config,
                Duration::from_secs_f64(window_s),
                Duration::ZERO,
                horizon,
            );
            tiles.solve(jobs)
        }
        LimiterShape::SlidingWindow { window_s } => {
            let window = Duration::from_secs_f64(window_s);
            (0..4u32)
                .map(|k| Tiles::new(config, window, window * k / 4, horizon).solve(jobs))
                .min_by_key(|(slots, _)| served(slots))
                .unwrap_or_default()
        }
    };
    let arrivals: Vec<Duration> = jobs.iter().map(|j| j.arrive).collect();
    Bound {
        served: served(&slots),
        witnessed: replay(config, jobs, &arrivals).max(replay(config, jobs, &plan)),
    }
}

fn served(slots: &[Option<i64>]) -> u64 {
    slots.iter().flatten().count() as u64
}

/// Jackson's rule on unit slots: each job may take one slot of its range
/// `[lo, hi]`; sweeping the slots in order, each goes to the waiting job
/// whose range ends first. Returns each job's slot, if any; as many as
/// possible get one.
fn jackson(ranges: &[Option<(i64, i64)>]) -> Vec<Option<i64>> {
    let mut order: Vec<(i64, i64, usize)> = ranges
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.filter(|(lo, hi)| lo <= hi).map(|(lo, hi)| (lo, hi, i)))
        .collect();
    order.sort_unstable();
    let mut taken = vec![None; ranges.len()];
    let mut waiting = BinaryHeap::new();
    let mut next = 0;
    let mut slot = i64::MIN;
    loop {
        if waiting.is_empty() {
            match order.get(next) {
                Some(&(lo, _, _)) => slot = slot.max(lo),
                None => break,
            }
        }
        while let Some(&(lo, hi, i)) = order.get(next)
            && lo <= slot
        {
            waiting.push(Reverse((hi, i)));
            next += 1;
        }
        while waiting.peek().is_some_and(|&Reverse((hi, _))| hi < slot) {
            waiting.pop();
        }
        if let Some(Reverse((_, i))) = waiting.pop() {
            taken[i] = Some(slot);
            slot += 1;
        }
    }
    taken
}

/// Replays a schedule through the limiter, with no rejection cost: each job
/// becomes ready at `ready[i]` (never before its arrival) and, whenever the
/// limiter would admit an attempt, the ready job with the earliest last
/// instant is sent. Returns how many were admitted in time.
fn replay(config: &StormConfig, jobs: &[Job], ready: &[Duration]) -> u64 {
    let mut limiter = Limiter::new(config, 0.0);
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (ready[i], i));
    let mut waiting = BinaryHeap::new();
    let (mut next, mut served, mut t) = (0, 0, Duration::ZERO);
    loop {
        while let Some(&i) = order.get(next)
            && ready[i] <= t
        {
            waiting.push(Reverse((jobs[i].last, i)));
            next += 1;
        }
        while waiting.peek().is_some_and(|&Reverse((last, _))| last < t) {
            waiting.pop();
        }
        if waiting.is_empty() {
            match order.get(next) {
                Some(&i) => t = t.max(ready[i]),
                None => break,
            }
            continue;
        }
        match limiter.next_admission(t) {
            None => break,
            Some(at) if at > t => t = at,
            Some(_) => {
                if limiter.offer(t) == Decision::Admit {
                    waiting.pop();
                    served += 1;
                } else {
                    // Cannot happen (both ask the same question); never loop.
                    t += NANO;
                }
            }
        }
    }
    served
}

/// ⌊x⌋, taking an x within 1e-12 (relative) of an integer as that integer.
fn floor_snap(x: f64) -> i64 {
    let r = x.round();
    if (x - r).abs() <= 1e-12 * x.abs().max(1.0) {
        r as i64
    } else {
        x.floor() as i64
    }
}

/// The first instant in `[from, to]` with capacity in force.
fn first_open(config: &StormConfig, from: Duration, to: Duration) -> Option<Duration> {
    let mut t = from;
    while config.capacity_at(t) == 0.0 {
        t = next_break(config, t)?;
    }
    (t <= to).then_some(t)
}

/// The last instant in `[from, to]` with capacity in force.
fn last_open(config: &StormConfig, from: Duration, to: Duration) -> Option<Duration> {
    let mut t = to;
    while config.capacity_at(t) == 0.0 {
        // The stretch at 0 began at the latest change point at or before t.
        let began = [config.outage_end, config.outage_start]
            .into_iter()
            .find(|&p| p <= t)?;
        t = began.checked_sub(NANO)?;
    }
    (t >= from).then_some(t)
}

/// The token bucket's capacity numbered as a line (module doc).
struct TokenIndex<'a> {
    config: &'a StormConfig,
    burst_s: f64,
    /// The bucket at the start, full.
    start: f64,
}

impl TokenIndex<'_> {
    /// `hi(t)`: the index up to which capacity has been earned by `t`.
    fn frontier(&self, t: Duration) -> f64 {
        self.start + self.config.capacity_earned(Duration::ZERO, t)
    }

    /// `m(t)`: the lowest index overflow and the outage's reset leave in the
    /// bucket at `t`, whatever was taken.
    fn floor(&self, t: Duration) -> f64 {
        let config = self.config;
        let (mut m, mut from) = (0.0_f64, Duration::ZERO);
        loop {
            let brk = next_break(config, from).filter(|&p| p <= t);
            let size = bucket_size(config, self.burst_s, from);
            m = m.max(self.frontier(brk.unwrap_or(t)) - size);
            let Some(p) = brk else {
                return m;
            };
            if p == config.outage_start {
                m = m.max(self.frontier(p));
            }
            from = p;
        }
    }

    /// The earliest instant at which the frontier reaches `y`.
    fn time_of(&self, y: f64) -> Duration {
        let mut from = Duration::ZERO;
        loop {
            let have = self.frontier(from);
            if have >= y {
                return from;
            }
            let rate = self.config.capacity_at(from);
            let brk = next_break(self.config, from);
            if rate > 0.0 {
                let mut at = from + Duration::from_secs_f64((y - have) / rate);
                if brk.is_none_or(|b| at < b) {
                    while self.frontier(at) < y {
                        at += NANO;
                    }
                    return at;
                }
            }
            match brk {
                Some(b) => from = b,
                None => return Duration::MAX,
            }
        }
    }

    /// The job's open instants, and its integer range of stretches.
    fn open(&self, job: &Job) -> Option<(Duration, Duration)> {
        let first = first_open(self.config, job.arrive, job.last)?;
        Some((first, last_open(self.config, first, job.last)?))
    }

    fn range(&self, job: &Job) -> Option<(i64, i64)> {
        let (first, last) = self.open(job)?;
        Some((
            floor_snap(self.floor(first)),
            floor_snap(self.frontier(last) - 1.0),
        ))
    }

    /// Each job's ready instant for the witness: the stretches of the
    /// relaxation's slots, in slot order, moved up to the lowest real
    /// positions one apart (a job that no longer fits keeps its arrival).
    fn plan(&self, jobs: &[Job], slots: &[Option<i64>]) -> Vec<Duration> {
        let mut ready: Vec<Duration> = jobs.iter().map(|j| j.arrive).collect();
        let mut order: Vec<(i64, usize)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (s, i)))
            .collect();
        order.sort_unstable();
        // The reset at the outage's start empties the bucket: a stretch
        // straddling the frontier there is never whole.
        let reset = self.frontier(self.config.outage_start);
        let mut previous = f64::NEG_INFINITY;
        for (_, i) in order {
            let Some((first, last)) = self.open(&jobs[i]) else {
                continue;
            };
            let mut x = self.floor(first).max(previous + 1.0);
            if x > reset - 1.0 && x < reset {
                x = reset;
            }
            if x > self.frontier(last) - 1.0 {
                continue;
            }
            previous = x;
            ready[i] = first.max(self.time_of(x + 1.0));
        }
        ready
    }
}

/// A tiling of time into windows of one length from an offset (the first
/// tile `[0, offset)` when the offset is not 0), each with the slots of the
/// fixed-window relaxation (module doc).
struct Tiles<'a> {
    config: &'a StormConfig,
    window: Duration,
    offset: Duration,
    /// The first slot of each tile; one more entry, the total.
    base: Vec<i64>,
}

impl<'a> Tiles<'a> {
    fn new(config: &'a StormConfig, window: Duration, offset: Duration, horizon: Duration) -> Self {
        let mut tiles = Tiles {
            config,
            window,
            offset,
            base: Vec::new(),
        };
        let count = tiles.tile_of(horizon) + 1;
        let mut total = 0;
        tiles.base.reserve(count + 1);
        for i in 0..count {
            tiles.base.push(total);
            total += tiles.usable(i, tiles.start(i + 1) - NANO);
        }
        tiles.base.push(total);
        tiles
    }

    fn tile_of(&self, t: Duration) -> usize {
        let (t, o, w) = (t.as_nanos(), self.offset.as_nanos(), self.window.as_nanos());
        let i = match (o, t) {
            (0, t) => t / w,
            (o, t) if t < o => 0,
            (o, t) => 1 + (t - o) / w,
        };
        usize::try_from(i).unwrap_or(usize::MAX)
    }

    fn start(&self, i: usize) -> Duration {
        let whole = |n: usize| self.window * u32::try_from(n).unwrap_or(u32::MAX);
        match (self.offset.is_zero(), i) {
            (true, i) => whole(i),
            (false, 0) => Duration::ZERO,
            (false, i) => self.offset + whole(i - 1),
        }
    }

    /// Slots of tile `i` an admission at `t` (in the tile) may use: the
    /// largest quota in force at an open instant of the tile up to `t`.
    fn usable(&self, i: usize, t: Duration) -> i64 {
        let config = self.config;
        let mut best = 0.0_f64;
        let mut u = self.start(i);
        while u <= t {
            best = best.max(config.capacity_at(u) * self.window.as_secs_f64());
            match next_break(config, u) {
                Some(p) => u = p,
                None => break,
            }
        }
        (best + QUOTA_SLACK).floor() as i64
    }

    /// The relaxation's optimum: each job's slot, and ready instants for
    /// the witness (each assigned job at the first instant its slot is
    /// usable).
    fn solve(&self, jobs: &[Job]) -> (Vec<Option<i64>>, Vec<Duration>) {
        let open: Vec<_> = jobs
            .iter()
            .map(|j| {
                let first = first_open(self.config, j.arrive, j.last)?;
                Some((first, last_open(self.config, first, j.last)?))
            })
            .collect();
        let ranges: Vec<_> = open
            .iter()
            .map(|o| {
                let (first, last) = (*o)?;
                let end = self.tile_of(last);
                Some((
                    self.base[self.tile_of(first)],
                    self.base[end] + self.usable(end, last) - 1,
                ))
            })
            .collect();
        let slots = jackson(&ranges);
        let mut ready: Vec<Duration> = jobs.iter().map(|j| j.arrive).collect();
        for ((slot, open), ready) in slots.iter().zip(&open).zip(&mut ready) {
            let (Some(slot), Some((first, last))) = (*slot, *open) else {
                continue;
            };
            let tile = self.base.partition_point(|&b| b <= slot) - 1;
            let index = slot - self.base[tile];
            let until = last.min(self.start(tile + 1) - NANO);
            let mut t = first.max(self.start(tile));
            while t <= until {
                if self.config.capacity_at(t) > 0.0 && self.usable(tile, t) > index {
                    *ready = t;
                    break;
                }
                match next_break(self.config, t) {
                    Some(p) => t = p,
                    None => break,
                }
            }
        }
        (slots, ready)
    }
}

#[cfg(test)]
mod tests;
