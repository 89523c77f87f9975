//! The controller's state as bytes, for a store that keeps it outside the
//! process (the Redis store): a format byte, then every number as a zigzag
//! varint in one fixed order. The format is this module's alone: a store
//! keeps the bytes and never reads them, so no script can decide anything
//! from them, and a change of the state's shape is a new format byte here.

use super::{Mode, PacingPolicy, PacingState};

/// The format [`PacingState::encode`] writes and [`PacingState::decode`]
/// reads.
const FORMAT: u8 = 1;

/// Why stored bytes are not a pacing state this build reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Another build's format: the store was written by an older or newer
    /// Tollgate.
    #[error("pacing state in format {found}; this build reads format {FORMAT}")]
    Format {
        /// The format byte found.
        found: u8,
    },
    /// Truncated, too long, or a number out of range.
    #[error("pacing state is malformed")]
    Malformed,
}

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

    /// The state as bytes: a format byte, then its numbers.
    pub fn encode(&self) -> Vec<u8> {
        let mut copy = *self;
        let mut out = Vec::with_capacity(64);
        out.push(FORMAT);
        out.push(self.mode as u8);
        for n in copy.numbers() {
            put_varint(&mut out, *n);
        }
        out
    }

    /// A state from [`encode`](Self::encode)'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (&format, rest) = bytes.split_first().ok_or(DecodeError::Malformed)?;
        if format != FORMAT {
            return Err(DecodeError::Format { found: format });
        }
        let (&code, mut rest) = rest.split_first().ok_or(DecodeError::Malformed)?;
        let mode = Mode::from_code(i64::from(code));
        if mode as u8 != code {
            return Err(DecodeError::Malformed);
        }
        let mut st = Self::new(0, &PacingPolicy::default());
        st.mode = mode;
        for n in st.numbers() {
            *n = take_varint(&mut rest)?;
        }
        if !rest.is_empty() {
            return Err(DecodeError::Malformed);
        }
        Ok(st)
    }
}

/// `n` zigzagged, then seven bits a byte, low first.
fn put_varint(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Result<i64, DecodeError> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().ok_or(DecodeError::Malformed)?;
        *bytes = rest;
        let bits = u64::from(b & 0x7f);
        if shift == 63 && bits > 1 {
            return Err(DecodeError::Malformed);
        }
        z |= bits << shift;
        if b & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err(DecodeError::Malformed)
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
            Err(DecodeError::Format { found: 0x82 })
        );
    }

    #[test]
    fn truncated_long_or_unknown_mode_is_malformed() {
        let bytes = PacingState::new(0, &PacingPolicy::default()).encode();
        assert_eq!(
            PacingState::decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Malformed)
        );
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(PacingState::decode(&long), Err(DecodeError::Malformed));
        let mut mode = bytes;
        mode[1] = 200;
        assert_eq!(PacingState::decode(&mode), Err(DecodeError::Malformed));
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
