//! A [`HintState`] as bytes ([`crate::codec`]), for a store that keeps it
//! outside the process (the Redis store). A change of the state's shape is
//! a new [`FORMAT`] here.

use tollgate_vocab::hint::HintForm;

use super::{Corroboration, HintRecord, HintState, WorkerEvidence};
use crate::codec::{DecodeError, Reader, Writer};

/// The format [`HintState::encode`] writes and [`HintState::decode`] reads.
const FORMAT: u8 = 1;
const WHAT: &str = "hint state";

/// Every form, in the order of their codes.
const FORMS: [HintForm; 5] = [
    HintForm::Delay,
    HintForm::Date,
    HintForm::Pushback,
    HintForm::Absent,
    HintForm::Invalid,
];

impl HintState {
    /// The state as bytes: a format byte, then its fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(FORMAT);
        w.int(self.cooldown_until_ms)
            .int(i64::from(self.backoff_step))
            .int(self.backoff_until_ms);
        w.int(self.recent.len() as i64);
        for r in &self.recent {
            let form = FORMS.iter().position(|&f| f == r.form).unwrap_or(4);
            w.int(r.at_ms)
                .flag(r.raw.is_some())
                .text(r.raw.as_deref().unwrap_or(""))
                .int(form as i64)
                .flag(r.valid)
                .flag(r.capped)
                .flag(r.clock_skew)
                .opt_int(r.cooldown_until_ms);
        }
        w.int(self.workers.len() as i64);
        for (id, e) in &self.workers {
            w.text(id)
                .int(e.claim_until_ms)
                .int(e.since_ms)
                .int(e.last_ms)
                .int(i64::from(e.hints))
                .int(i64::from(e.outliers))
                .int(i64::from(e.uncorroborated));
        }
        w.int(self.mutes.len() as i64);
        for (id, &until) in &self.mutes {
            w.text(id).int(until);
        }
        let c = &self.corroboration;
        w.int(c.until_ms)
            .flag(c.corroborated)
            .int(i64::from(c.workers))
            .int(i64::from(c.reporters))
            .int(i64::from(c.needed));
        w.finish()
    }

    /// A state from [`encode`](Self::encode)'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes, WHAT, FORMAT)?;
        let mut st = HintState {
            cooldown_until_ms: r.int()?,
            backoff_step: r.small()?,
            backoff_until_ms: r.int()?,
            ..HintState::default()
        };
        for _ in 0..r.small::<usize>()? {
            let at_ms = r.int()?;
            let has_raw = r.flag()?;
            let raw = r.text()?;
            let form = *FORMS
                .get(r.small::<usize>()?)
                .ok_or(DecodeError::Malformed { what: WHAT })?;
            st.recent.push_back(HintRecord {
                at_ms,
                raw: has_raw.then_some(raw),
                form,
                valid: r.flag()?,
                capped: r.flag()?,
                clock_skew: r.flag()?,
                cooldown_until_ms: r.opt_int()?,
            });
        }
        for _ in 0..r.small::<usize>()? {
            let id = r.text()?;
            let evidence = WorkerEvidence {
                claim_until_ms: r.int()?,
                since_ms: r.int()?,
                last_ms: r.int()?,
                hints: r.small()?,
                outliers: r.small()?,
                uncorroborated: r.small()?,
            };
            st.workers.insert(id, evidence);
        }
        for _ in 0..r.small::<usize>()? {
            let id = r.text()?;
            st.mutes.insert(id, r.int()?);
        }
        st.corroboration = Corroboration {
            until_ms: r.int()?,
            corroborated: r.flag()?,
            workers: r.small()?,
            reporters: r.small()?,
            needed: r.small()?,
        };
        r.end()?;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rich() -> HintState {
        let mut st = HintState {
            cooldown_until_ms: 1_700_000_030_000,
            backoff_step: 3,
            backoff_until_ms: 1_700_000_001_000,
            ..HintState::default()
        };
        for (i, form) in FORMS.into_iter().enumerate() {
            st.recent.push_back(HintRecord {
                at_ms: 1_700_000_000_000 + i as i64,
                raw: (i % 2 == 0).then(|| format!("{i}0")),
                form,
                valid: i != 4,
                capped: i == 1,
                clock_skew: i == 2,
                cooldown_until_ms: (i < 3).then_some(-5),
            });
        }
        st.workers.insert(
            "w-1".into(),
            WorkerEvidence {
                claim_until_ms: 9,
                since_ms: 8,
                last_ms: 7,
                hints: 6,
                outliers: 5,
                uncorroborated: u32::MAX,
            },
        );
        st.mutes.insert("liar".into(), i64::MAX);
        st.corroboration = Corroboration {
            until_ms: 1,
            corroborated: true,
            workers: 2,
            reporters: 3,
            needed: 4,
        };
        st
    }

    #[test]
    fn a_state_round_trips() {
        let st = rich();
        let back = HintState::decode(&st.encode()).expect("decodes");
        assert_eq!(back.encode(), st.encode());
        assert_eq!(back.recent, st.recent);
        assert_eq!(back.workers, st.workers);
        assert_eq!(back.mutes, st.mutes);
        assert_eq!(back.corroboration, st.corroboration);
        assert_eq!(back.backoff_step, 3);
    }

    #[test]
    fn truncated_or_long_is_malformed() {
        let bytes = rich().encode();
        let malformed = Err(DecodeError::Malformed { what: WHAT });
        assert_eq!(
            HintState::decode(&bytes[..bytes.len() - 1]).map(|_| ()),
            malformed
        );
        let mut long = bytes;
        long.push(0);
        assert_eq!(HintState::decode(&long).map(|_| ()), malformed);
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = HintState::decode(&bytes);
        }
    }
}
