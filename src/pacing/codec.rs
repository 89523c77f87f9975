//! The controller's state as bytes ([`crate::codec`]), for a store that
//! keeps it outside the process (the Redis store): its mode, then every
//! number in one fixed order. A change of the state's shape is a new
//! [`FORMAT`] here.

use super::{Mode, PacingPolicy, PacingState};
use crate::codec::{DecodeError, Reader, Writer};

/// The format [`PacingState::encode`] writes and [`PacingState::decode`]
/// reads.
const FORMAT: u8 = 1;
const WHAT: &str = "pacing state";

impl PacingState {
    /// Every number of the state but the mode, in the encoding's order.
    fn numbers(&mut self) -> [&mut i64; 23] {
        [
            &mut self.win,
            &mut self.w_first,
            &mut self.w_ok,
            &mut self.w_rej,
            &mut self.w_refused,
            &mut self.w_granted,
            &mut self.w_held,
            &mut self.w_cut_from,
            &mut self.w_short,
            &mut self.w_frozen,
            &mut self.w_late,
            &mut self.rate_m,
            &mut self.rate_max_m,
            &mut self.rate_ok_m,
            &mut self.cap_m,
            &mut self.lam_m,
            &mut self.hint_until,
            &mut self.streak,
            &mut self.closed_until,
            &mut self.penalty_until,
            &mut self.probe_at,
            &mut self.ramp_from_m,
            &mut self.settle_win,
        ]
    }

    /// The state as bytes: a format byte, its mode, then its numbers.
    pub fn encode(&self) -> Vec<u8> {
        let mut copy = *self;
        let mut w = Writer::new(FORMAT);
        w.int(i64::from(self.mode as u8));
        for n in copy.numbers() {
            w.int(*n);
        }
        w.finish()
    }

    /// A state from [`encode`](Self::encode)'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes, WHAT, FORMAT)?;
        let code = r.int()?;
        let mode = Mode::from_code(code);
        if i64::from(mode as u8) != code {
            return Err(DecodeError::Malformed { what: WHAT });
        }
        let mut st = Self::new(0, &PacingPolicy::default());
        st.mode = mode;
        for n in st.numbers() {
            *n = r.int()?;
        }
        r.end()?;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_state_round_trips() {
        let mut st = PacingState::new(1_700_000_000_000, &PacingPolicy::default());
        st.mode = Mode::Saturated;
        st.rate_m = 1_234_567;
        st.w_cut_from = -1;
        st.closed_until = i64::MAX;
        st.settle_win = i64::MIN;
        assert_eq!(PacingState::decode(&st.encode()), Ok(st));
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
    fn truncated_long_or_unknown_mode_is_malformed() {
        let bytes = PacingState::new(0, &PacingPolicy::default()).encode();
        assert_eq!(
            PacingState::decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Malformed { what: WHAT })
        );
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            PacingState::decode(&long),
            Err(DecodeError::Malformed { what: WHAT })
        );
        let mut mode = bytes;
        mode[1] = 200;
        assert_eq!(
            PacingState::decode(&mode),
            Err(DecodeError::Malformed { what: WHAT })
        );
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = PacingState::decode(&bytes);
        }

        #[test]
        fn any_numbers_round_trip(numbers in proptest::collection::vec(any::<i64>(), 23), mode in 0u8..7) {
            let mut st = PacingState::new(0, &PacingPolicy::default());
            st.mode = Mode::from_code(i64::from(mode));
            for (slot, n) in st.numbers().into_iter().zip(numbers) {
                *slot = n;
            }
            prop_assert_eq!(PacingState::decode(&st.encode()), Ok(st));
        }
    }
}
