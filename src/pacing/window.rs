//! What the controller learns when a window closes: capacity, the
//! first-attempt rate and the next wake rate, for a route whose retries are
//! paced ([`PacingState::learn`]) and for one whose every attempt is
//! ([`Mode::Saturated`]).

use super::{MILLI, Mode, PROBE_HEADROOM, PacingPolicy, PacingState, WINDOW_MS, just_under};

impl PacingState {
    /// Learns from the window that just ended and sets the next rate.
    pub(super) fn close_window(&mut self, policy: &PacingPolicy) {
        // A ramp ends with its window: the rate it climbed to is in force.
        let ramped_from = std::mem::take(&mut self.ramp_from_m);
        // A window a closing hint covered, even in part, says nothing about
        // capacity or demand (workers may hold first attempts in it).
        // Rejections the controller must answer for are answered even in a
        // window a short cooldown also explained some of.
        let closed =
            self.win * WINDOW_MS < self.closed_until || self.mode() == Mode::PenaltyExtending;
        // Unless the hint ended in the window's first half and what came
        // after drew nothing: the fleet is coming back, and a rate held
        // for a whole window more is a window of the backlog's deadlines
        // lost. Half a window measures neither capacity nor demand, so
        // only the rate grows.
        if self.reopens_window() {
            if self.used() {
                self.probe_up(ramped_from, self.spare_m());
                self.clamp_rate(policy);
            }
        } else if closed {
            // Nothing to learn from. But an outage whose closing hint ended
            // in the window's second half, too late to reopen it, starts
            // slow start with the next window rather than at its end: the
            // backlog held through it would otherwise wait a whole window
            // at the rate in force before it, which says nothing of the
            // spare.
            if self.reopens_next_window() {
                self.probe_up(0, self.spare_m());
                self.clamp_rate(policy);
            }
        } else if self.mode() == Mode::Saturated {
            self.learn_saturated(policy);
        } else {
            // Rejections that all arrived inside a short cooldown were drawn
            // before the fleet heard of it: in the window after a cut they
            // are the cut overshoot's stragglers. Beyond that window they
            // still say the rate is over: short hints drawn by the rate's
            // own overshoot, back to back (whole-second dates re-arm one
            // every second), would otherwise explain every rejection and
            // freeze an overshooting rate. The window was paused, so what it
            // served measures nothing; but first attempts and the rate
            // together drew rejections, so the capacity is below their sum
            // (a limiter's burst can inflate the estimate), and the rate
            // steps down a sixteenth, not to be probed back past where it
            // drew them.
            if self.w_rej == 0 && self.w_refused > 0 && self.adaptive() {
                if self.mode() == Mode::BackingOff {
                    self.mode = Mode::Steady;
                } else {
                    let before = self.rate_m;
                    self.cap_m = self.cap_m.min(self.lam_m + before);
                    let down = just_under(before).min(self.spare_m().max(before / 2));
                    let edge = down + (before - down) / 2;
                    self.rate_max_m = if self.rate_max_m > 0 {
                        self.rate_max_m.min(edge)
                    } else {
                        edge
                    };
                    self.rate_m = down.max(policy.floor_m);
                }
            }
            let known_m = self.cap_m;
            if self.w_frozen == 0 || self.w_rej > 0 {
                self.learn(ramped_from, policy);
            }
            if self.adaptive() && (self.overflowed(17, 16) || self.crowded()) {
                // Paced at what the window served, but not above the
                // capacity known before it: successes reported in it can be
                // a backlog (requests queued while the coordinator was
                // paused, counts workers held meanwhile), and a pace over
                // the capacity is the next overload. The saturated climb
                // finds an upstream that grew.
                let served_m = self.w_ok * MILLI;
                let edge_m = if known_m > 0 {
                    served_m.min(known_m)
                } else {
                    served_m
                };
                self.saturate(edge_m, just_under(edge_m), policy);
                self.clear_window();
                // The next window mixes two regimes: workers start holding
                // their first attempts as they hear, and the rejections
                // the last one drew are still reported in it. What it
                // serves measures the switch, not the upstream.
                self.w_frozen = 1;
                return;
            }
        }
        // A window that refused attempts and served none saw the upstream
        // out, whatever its hints said (a coordinator restarted inside an
        // outage hears only the short hints of its last seconds). The next
        // window is at best the upstream's first back: as under a closing
        // hint, it learns nothing and judges no overflow (its rejections
        // are the outage's, its few successes the upstream returning, not
        // first attempts overflowing a tiny capacity). A saturated route
        // answers an outage itself: a window that served less than half
        // the rate that drew its rejections keeps no edge (see
        // `learn_saturated`).
        if self.adaptive() && self.w_ok == 0 && self.w_refused > 0 {
            self.closed_until = self.closed_until.max((self.win + 2) * WINDOW_MS);
        }
        self.clear_window();
    }

    /// Whether a closing hint ended in the window's second half of a
    /// window the upstream served less than half its first-attempt rate
    /// in (an outage, not one worker's claim on a route that kept
    /// serving), on a route whose rate is learned and that knows no edge
    /// yet: the next window is the fleet's first one back. Rejections
    /// reported in this one were drawn by the outage, so unlike
    /// [`reopens_window`](Self::reopens_window) they do not stop it.
    fn reopens_next_window(&self) -> bool {
        let start = self.win * WINDOW_MS;
        self.adaptive()
            && self.rate_max_m == 0
            && 2 * self.w_ok * MILLI < self.lam_m
            && start + WINDOW_MS / 2 < self.closed_until
            && self.closed_until <= start + WINDOW_MS
    }

    /// Whether the window used the rate: half its slots were taken, or
    /// intents were turned away for lack of rate (they will ask again
    /// later, so the slots they would take are not taken now).
    pub(super) fn used(&self) -> bool {
        // Retries are the attempts beyond the first ones; when nothing was
        // rejected every attempt was a success, so this is exact then.
        let retries = (self.w_ok + self.w_rej - self.w_first).max(0);
        2 * self.w_granted.max(retries) * MILLI >= self.rate_m || self.w_short > 0
    }

    /// Raises the rate after a window that used it and drew nothing
    /// (`ramped_from`: where that window's ramp began, 0 for none), with
    /// `spare` what first attempts leave of the capacity.
    pub(super) fn probe_up(&mut self, ramped_from: i64, spare: i64) {
        // What the window proved clean: a ramp's attempts are reported
        // up to a report interval late and a limiter's burst hides an
        // overshoot for longer, so a ramp proves where it began, not its
        // end (a cut to its end, or to its midpoint, can still be over
        // the edge it crossed).
        self.rate_ok_m = if ramped_from > 0 && ramped_from < self.rate_m {
            ramped_from
        } else {
            self.rate_m
        };
        // Near an edge that rejections showed, the probe schedule alone
        // moves the rate: a clean window right after a pause serves the
        // limiter's refilled burst as well, and a spare read from it would
        // jump past the edge in one step. A spare of twice the edge says it
        // was no edge (stragglers of an outage, a brownout's end): the
        // spare leads again.
        let before = self.rate_m;
        let slow_start = self.rate_max_m == 0;
        let grown = self.grown(ramped_from);
        self.rate_m = if spare < 2 * self.rate_max_m {
            grown
        } else {
            spare.max(grown)
        };
        if self.rate_m >= 2 * self.rate_max_m {
            // An edge found at half the rate now served cleanly is no
            // longer the edge (the upstream grew, or the edge was found
            // during a brownout): search from scratch.
            self.rate_max_m = 0;
        }
        if slow_start {
            // No edge known: the step may be large, so it is climbed
            // across the next window, not jumped at its start (rate_at).
            self.ramp_from_m = before;
        }
        self.mode = Mode::Probing;
    }

    fn learn(&mut self, ramped_from: i64, policy: &PacingPolicy) {
        // First attempts arriving: a backlog held through a cooldown and
        // released by slots is not a rate first attempts keep up.
        let arrived_m = self.straight_first() * MILLI;
        if self.cap_m == 0 && self.lam_m == 0 {
            // The first window learned from: no average to move yet.
            self.lam_m = arrived_m;
        } else {
            self.lam_m += (arrived_m - self.lam_m).div_euclid(4);
        }
        let served_m = self.w_ok * MILLI;
        let used = self.used();
        if self.w_rej > 0 {
            // A saturated window measures what the upstream serves now.
            self.cap_m = served_m;
            let measured = (self.cap_m - self.lam_m).max(0);
            let before = self.rate_before_cut();
            // Back to the last rate that drew nothing, trusted once (a window
            // a short cooldown paused measures low); rejections again, and
            // the cut is multiplicative: never below half.
            let fallback = if self.rate_ok_m > 0 {
                self.rate_ok_m.min(before)
            } else {
                before / 2
            };
            let cut = before.min(just_under(measured).max(fallback));
            self.rate_ok_m = 0;
            // A cut the window measured went back just under the edge it
            // found (what it served includes whatever burst the limiter
            // had banked): the rate climbs back to that edge and past it by
            // sixteenths. A cut to a fallback knows no edge: recovery
            // heads halfway back to the rate that drew the rejections, not
            // all of it (that rate is known to be too much).
            self.rate_max_m = if measured.min(before) > fallback {
                measured.min(before)
            } else {
                cut + (before - cut) / 2
            };
            self.rate_m = cut;
            self.mode = Mode::BackingOff;
        } else {
            self.cap_m = self.cap_m.max(served_m);
            let spare = self.spare_m();
            if used {
                self.probe_up(ramped_from, spare);
            } else {
                // Not in use: follow the estimate, down as well as up.
                self.rate_m = spare;
                self.mode = Mode::Steady;
            }
        }
        self.clamp_rate(policy);
    }

    /// Learns from a window in which every attempt was paced.
    fn learn_saturated(&mut self, policy: &PacingPolicy) {
        self.lam_m += (self.w_first * MILLI - self.lam_m).div_euclid(4);
        let served_m = self.w_ok * MILLI;
        if self.w_frozen == 1 {
            // It became saturated in this window (or a closing hint covered
            // part of it): what it served mixes two regimes.
        } else if self.w_refused > 0 {
            // Over the edge: just under what the window served (a
            // saturated window measures the upstream), never below half
            // the rate that drew the rejections. A window that served less
            // than that measured an outage, not an edge (a limiter down,
            // answering with short hints): no edge is known, and once
            // windows come back clean the climb is slow start.
            let before = self.rate_before_cut();
            self.cap_m = served_m;
            self.rate_m = just_under(served_m).max(before / 2);
            self.rate_ok_m = self.rate_m;
            self.rate_max_m = if self.rate_m < served_m { served_m } else { 0 };
            self.settle_win = self.win + 1;
        } else if self.w_short > 0 {
            // Clean, and demand went short. Only from a rate the window used
            // (slots nobody asked for in time prove nothing).
            self.cap_m = self.cap_m.max(served_m);
            if 8 * self.w_granted * MILLI >= 7 * self.rate_m {
                self.climb_saturated();
            }
        } else if self.hint_until <= self.win * WINDOW_MS {
            // The rate met every intent that asked, and no cooldown paused
            // the window: first attempts fit again and go straight.
            self.cap_m = self.cap_m.max(served_m);
            self.rate_m = self.spare_m();
            self.rate_ok_m = 0;
            // The capacity was measured at its edge: retries probe past
            // what it leaves by sixteenths, not by the growth of a route
            // that never found one.
            self.rate_max_m = self.rate_m.max(MILLI);
            self.mode = Mode::Steady;
        }
        self.clamp_rate(policy);
    }

    /// Raises a saturated rate after a clean window that used it and whose
    /// demand went short. Well under the edge a saturated window measured
    /// (where an entry inside a window halved the rate, or a cut left it),
    /// halfway to it: the upstream served that much, and every window spent
    /// below it is the backlog's. From near the edge on, a limiter's banked
    /// burst serves an overshoot for a while before it rejects, so a rate is
    /// held for one more clean window before it steps: steps taken
    /// meanwhile would pile their overshoots up before the first rejection
    /// comes back. The step is a sixteenth up to the edge (a thirty-second
    /// in the first eighth past it) and to a quarter past it. Past that, or
    /// with no edge known (the window that cut the rate measured an
    /// outage), what a burst can hide is spent and the upstream has grown:
    /// slow start, each step doubling the distance from the edge up to the
    /// rate itself, still held a window first. The step is taken at the
    /// window's start, not ramped across it as a retry rate's slow start
    /// is ([`rate_at`](Self::rate_at)): made to ramp, the storm's 40 %
    /// brownout peaked at 1.35 × the capacity and its deep brownouts lost
    /// about twice as many intents. (Steps of an eighth at most took a minute
    /// to climb from a deep brownout's edge to the recovered upstream.)
    fn climb_saturated(&mut self) {
        let r = self.rate_m;
        let edge = self.rate_max_m;
        let near = r >= edge - edge / 16;
        if near && edge > 0 && self.rate_ok_m != r {
            self.rate_ok_m = r;
            return;
        }
        self.rate_ok_m = r;
        let step = if !near {
            (r / 16).max((edge - r) / 2)
        } else if r < edge {
            r / 16
        } else if r < edge + edge / 8 {
            r / 32
        } else if r < edge + edge / 4 {
            r / 16
        } else {
            (2 * (r - edge)).clamp(r / 16, r)
        };
        self.rate_m = r + step.max(MILLI);
    }

    /// The rate that drew the window's rejections: the one before the cut
    /// at its first rejection, if there was one.
    fn rate_before_cut(&self) -> i64 {
        if self.w_cut_from > 0 {
            self.w_cut_from
        } else {
            self.rate_m
        }
    }

    /// The next rate after a window that used this one and drew nothing.
    fn grown(&self, ramped_from: i64) -> i64 {
        let r = self.rate_m;
        if self.rate_max_m == 0 {
            // Nothing has pushed back yet: slow start. The first step is an
            // eighth of the most the upstream has served, and each clean
            // window doubles the step it climbed: the spare above what
            // first attempts drew is unknown, and may be a tenth of it or
            // ten times. The fleet's total stays within twice what was
            // served, and the step is ramped across the window, so the
            // first rejection stops it near the edge.
            let climbed = if ramped_from > 0 { r - ramped_from } else { 0 };
            let step = (self.cap_m / PROBE_HEADROOM).max(2 * climbed).max(MILLI);
            let bound = 2 * self.cap_m - self.lam_m;
            (r + step).min(bound.max(r))
        } else if r < self.rate_max_m {
            // Straight to the midpoint between the rate the cut went back
            // to and the one that drew rejections (`rate_max_m`): the edge
            // is bisected, and a probe that finds it oversteps by half the
            // gap at most.
            self.rate_max_m.max(r + MILLI)
        } else {
            // Beyond it: a sixteenth of the rate at a time. Windows that a
            // short cooldown paused look clean, so the rate is sometimes
            // re-proven above the edge; small steps keep that overshoot
            // small.
            r + (r / 16).max(MILLI)
        }
    }
}
