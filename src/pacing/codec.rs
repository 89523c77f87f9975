//! The controller's state as bytes ([`crate::codec`]), for a store that
//! keeps it outside the process (the Redis store): its window's counts, its
//! estimates, its rule, the limiter model, then the stated limits, in one
//! fixed order. A
//! change of the state's shape is a new [`FORMAT`] here.

use super::model::LimiterModel;
use super::stated::StatedState;
use super::{PacingPolicy, PacingState, Rule};
use crate::codec::{DecodeError, Reader, Writer};

/// The format [`PacingState::encode`] writes and [`PacingState::decode`]
/// reads.
const FORMAT: u8 = 9;
const WHAT: &str = "pacing state";

impl PacingState {
    /// Every number of the state outside its rule and model, in the
    /// encoding's order.
    fn numbers(&mut self) -> [&mut i64; 13] {
        [
            &mut self.win,
            &mut self.w_first,
            &mut self.w_ok,
            &mut self.w_refused,
            &mut self.w_granted,
            &mut self.w_held,
            &mut self.w_arrived,
            &mut self.w_short,
            &mut self.w_late,
            &mut self.rate_m,
            &mut self.lam_m,
            &mut self.hint_until,
            &mut self.streak,
        ]
    }

    /// The state as bytes: a format byte, its numbers, its rule, then the
    /// model.
    pub fn encode(&self) -> Vec<u8> {
        let mut copy = self.clone();
        let mut w = Writer::new(FORMAT);
        for n in copy.numbers() {
            w.int(*n);
        }
        w.int(self.closed_until).flag(self.saturated);
        match self.rule {
            Rule::Learned => w.int(0),
            Rule::Pinned { rate_m } => w.int(1).int(rate_m),
            Rule::Known { limit_m } => w.int(2).int(limit_m),
            Rule::Penalty {
                until_ms,
                probe_at_ms,
            } => w.int(3).int(until_ms).int(probe_at_ms),
        };
        self.model.write(&mut w);
        self.stated.write(&mut w);
        w.finish()
    }

    /// A state from [`encode`](Self::encode)'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes, WHAT, FORMAT)?;
        let mut st = Self::new(0, &PacingPolicy::default());
        for n in st.numbers() {
            *n = r.int()?;
        }
        st.closed_until = r.int()?;
        st.saturated = r.flag()?;
        st.rule = match r.int()? {
            0 => Rule::Learned,
            1 => Rule::Pinned { rate_m: r.int()? },
            2 => Rule::Known { limit_m: r.int()? },
            3 => Rule::Penalty {
                until_ms: r.int()?,
                probe_at_ms: r.int()?,
            },
            _ => return Err(DecodeError::Malformed { what: WHAT }),
        };
        st.model = LimiterModel::read(&mut r, WHAT)?;
        st.stated = StatedState::read(&mut r, WHAT)?;
        r.end()?;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacing::{MILLI, ReportSample, WINDOW_MS};
    use proptest::prelude::*;

    /// A route whose model has measured, kept a span and is mid-phase.
    fn learned() -> PacingState {
        let p = PacingPolicy::default();
        let mut st = PacingState::new(0, &p);
        for tick in 1..=40 {
            let now_ms = tick * WINDOW_MS / 10;
            st.observe(
                &ReportSample {
                    now_ms,
                    first_attempts: 50,
                    successes: 50,
                    rejections: u32::from(tick % 7 == 0) * 5,
                    ..ReportSample::default()
                },
                &p,
            );
        }
        assert!(st.model().rate_m().is_some(), "measured: {st:?}");
        st
    }

    #[test]
    fn a_state_round_trips() {
        let mut st = learned();
        st.saturated = true;
        st.rate_m = 1_234_567;
        st.closed_until = i64::MAX;
        st.rule = Rule::Penalty {
            until_ms: i64::MIN,
            probe_at_ms: 7,
        };
        assert_eq!(PacingState::decode(&st.encode()), Ok(st));
        let fresh = PacingState::new(1_700_000_000_000, &PacingPolicy::default());
        assert_eq!(PacingState::decode(&fresh.encode()), Ok(fresh));
    }

    #[test]
    fn another_format_is_named() {
        let mut bytes = PacingState::new(0, &PacingPolicy::default()).encode();
        bytes[0] = 0x82;
        assert_eq!(
            PacingState::decode(&bytes),
            Err(DecodeError::Format {
                what: WHAT,
                found: 0x82,
                expected: FORMAT
            })
        );
    }

    #[test]
    fn truncated_long_or_unknown_rule_is_malformed() {
        let bytes = learned().encode();
        let malformed = Err(DecodeError::Malformed { what: WHAT });
        assert_eq!(PacingState::decode(&bytes[..bytes.len() - 1]), malformed);
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(PacingState::decode(&long), malformed);
        let mut w = Writer::new(FORMAT);
        for _ in 0..13 {
            w.int(0);
        }
        w.flag(false).int(9);
        assert_eq!(PacingState::decode(&w.finish()), malformed);
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = PacingState::decode(&bytes);
        }

        #[test]
        fn any_numbers_round_trip(numbers in proptest::collection::vec(any::<i64>(), 12), rate in any::<i64>()) {
            let mut st = learned();
            st.rule = Rule::Pinned { rate_m: rate.max(MILLI) };
            for (slot, n) in st.numbers().into_iter().zip(numbers) {
                *slot = n;
            }
            prop_assert_eq!(PacingState::decode(&st.encode()), Ok(st));
        }
    }
}
