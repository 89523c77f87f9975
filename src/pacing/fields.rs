//! The controller's state as Redis hash fields: the memory store keeps a
//! [`PacingState`] as it is, the Redis store as one hash per route, and the
//! Lua port reads the same names.

use super::{PacingPolicy, PacingState};

impl PacingState {
    /// The fields, in a fixed order, for a Redis hash (`HSET key f v …`).
    pub fn to_fields(&self) -> [(&'static str, i64); 24] {
        [
            ("win", self.win),
            ("w_first", self.w_first),
            ("w_ok", self.w_ok),
            ("w_rej", self.w_rej),
            ("w_refused", self.w_refused),
            ("w_granted", self.w_granted),
            ("w_held", self.w_held),
            ("w_cut_from", self.w_cut_from),
            ("w_short", self.w_short),
            ("w_frozen", self.w_frozen),
            ("w_late", self.w_late),
            ("rate_m", self.rate_m),
            ("rate_max_m", self.rate_max_m),
            ("rate_ok_m", self.rate_ok_m),
            ("cap_m", self.cap_m),
            ("lam_m", self.lam_m),
            ("hint_until", self.hint_until),
            ("streak", self.streak),
            ("closed_until", self.closed_until),
            ("penalty_until", self.penalty_until),
            ("probe_at", self.probe_at),
            ("mode", self.mode),
            ("ramp_from_m", self.ramp_from_m),
            ("settle_win", self.settle_win),
        ]
    }

    /// Rebuilds a state from [`to_fields`](Self::to_fields) output; a
    /// missing field reads as 0, so an older record still loads.
    pub fn from_fields<'a>(fields: impl IntoIterator<Item = (&'a str, i64)>) -> Self {
        let mut st = Self::new(0, &PacingPolicy::default());
        for (name, v) in fields {
            let slot = match name {
                "win" => &mut st.win,
                "w_first" => &mut st.w_first,
                "w_ok" => &mut st.w_ok,
                "w_rej" => &mut st.w_rej,
                "w_refused" => &mut st.w_refused,
                "w_granted" => &mut st.w_granted,
                "w_held" => &mut st.w_held,
                "w_cut_from" => &mut st.w_cut_from,
                "w_short" => &mut st.w_short,
                "w_frozen" => &mut st.w_frozen,
                "w_late" => &mut st.w_late,
                "rate_m" => &mut st.rate_m,
                "rate_max_m" => &mut st.rate_max_m,
                "rate_ok_m" => &mut st.rate_ok_m,
                "cap_m" => &mut st.cap_m,
                "lam_m" => &mut st.lam_m,
                "hint_until" => &mut st.hint_until,
                "streak" => &mut st.streak,
                "closed_until" => &mut st.closed_until,
                "penalty_until" => &mut st.penalty_until,
                "probe_at" => &mut st.probe_at,
                "mode" => &mut st.mode,
                "ramp_from_m" => &mut st.ramp_from_m,
                "settle_win" => &mut st.settle_win,
                _ => continue,
            };
            *slot = v;
        }
        st
    }
}
