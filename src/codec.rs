//! The byte encoding the core's states are kept in outside the process
//! (the Redis store): a format byte, then fields in one fixed order —
//! integers as zigzag varints, strings and byte strings with their length
//! first. Each state names its format ([`Writer::new`]) and owns its field
//! order (`pacing`'s and `hints`' `codec` modules); a store keeps the
//! bytes and never reads them, so no script can decide anything from them.

/// Why stored bytes are not a state this build reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Another build's format: the store was written by an older or newer
    /// Tollgate.
    #[error("{what} in format {found}; this build reads format {expected}")]
    Format {
        /// Which state.
        what: &'static str,
        /// The format byte found.
        found: u8,
        /// The format this build reads.
        expected: u8,
    },
    /// Truncated, too long, or a field out of range.
    #[error("{what} is malformed")]
    Malformed {
        /// Which state.
        what: &'static str,
    },
}

/// Writes one state's fields after its format byte.
#[derive(Debug)]
pub struct Writer(Vec<u8>);

impl Writer {
    /// A writer for a state in `format`.
    pub fn new(format: u8) -> Self {
        let mut out = Vec::with_capacity(64);
        out.push(format);
        Writer(out)
    }

    /// An integer.
    pub fn int(&mut self, n: i64) -> &mut Self {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            self.0.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
        self.0.push(z as u8);
        self
    }

    /// An optional integer: a presence flag, then the integer.
    pub fn opt_int(&mut self, n: Option<i64>) -> &mut Self {
        match n {
            Some(n) => self.flag(true).int(n),
            None => self.flag(false),
        }
    }

    /// A flag.
    pub fn flag(&mut self, b: bool) -> &mut Self {
        self.0.push(u8::from(b));
        self
    }

    /// A string, its length first.
    pub fn text(&mut self, s: &str) -> &mut Self {
        self.int(i64::try_from(s.len()).unwrap_or(i64::MAX));
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

/// Reads one state's fields, in the order they were written.
#[derive(Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes` holding `what` in `format`.
    pub fn new(bytes: &'a [u8], what: &'static str, format: u8) -> Result<Self, DecodeError> {
        let (&found, rest) = bytes.split_first().ok_or(DecodeError::Malformed { what })?;
        if found != format {
            return Err(DecodeError::Format {
                what,
                found,
                expected: format,
            });
        }
        Ok(Reader { rest, what })
    }

    fn malformed(&self) -> DecodeError {
        DecodeError::Malformed { what: self.what }
    }

    /// An integer.
    pub fn int(&mut self) -> Result<i64, DecodeError> {
        let mut z: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.rest.split_first().ok_or(self.malformed())?;
            self.rest = rest;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.malformed());
            }
            z |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
        }
        Err(self.malformed())
    }

    /// An integer that must fit `T` (a count, a small code).
    pub fn small<T: TryFrom<i64>>(&mut self) -> Result<T, DecodeError> {
        let n = self.int()?;
        T::try_from(n).map_err(|_| self.malformed())
    }

    /// An optional integer.
    pub fn opt_int(&mut self) -> Result<Option<i64>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.int()?)
        } else {
            None
        })
    }

    /// A flag.
    pub fn flag(&mut self) -> Result<bool, DecodeError> {
        let (&b, rest) = self.rest.split_first().ok_or(self.malformed())?;
        self.rest = rest;
        match b {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.malformed()),
        }
    }

    /// A string.
    pub fn text(&mut self) -> Result<String, DecodeError> {
        let len: usize = self.small()?;
        if len > self.rest.len() {
            return Err(self.malformed());
        }
        let (s, rest) = self.rest.split_at(len);
        self.rest = rest;
        String::from_utf8(s.to_vec()).map_err(|_| self.malformed())
    }

    /// Ends the read: nothing may be left.
    pub fn end(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fields_round_trip_and_another_format_is_named() {
        let mut w = Writer::new(7);
        w.int(i64::MIN)
            .int(-1)
            .int(i64::MAX)
            .opt_int(None)
            .opt_int(Some(5))
            .flag(true)
            .text("wörker");
        let bytes = w.finish();
        let mut r = Reader::new(&bytes, "test", 7).expect("format");
        assert_eq!(r.int(), Ok(i64::MIN));
        assert_eq!(r.int(), Ok(-1));
        assert_eq!(r.int(), Ok(i64::MAX));
        assert_eq!(r.opt_int(), Ok(None));
        assert_eq!(r.opt_int(), Ok(Some(5)));
        assert_eq!(r.flag(), Ok(true));
        assert_eq!(r.text().as_deref(), Ok("wörker"));
        r.end().expect("nothing left");
        assert_eq!(
            Reader::new(&bytes, "test", 8).map(|_| ()),
            Err(DecodeError::Format {
                what: "test",
                found: 7,
                expected: 8
            })
        );
    }

    proptest! {
        #[test]
        fn any_bytes_read_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(mut r) = Reader::new(&bytes, "test", bytes.first().copied().unwrap_or(0)) {
                let _ = r.int();
                let _ = r.text();
                let _ = r.opt_int();
                let _ = r.flag();
                let _ = r.small::<u8>();
                let _ = r.end();
            }
        }
    }
}
