//! The part of Structured Field Values (RFC 9651) that `RateLimit` and
//! `RateLimit-Policy` are written in: a List of Items with Parameters.
//!
//! Only what those fields need is read; anything else (an Inner List, a
//! Date, a Display String) fails the whole field, as RFC 9651 §4.2 says a
//! parse failure must, and the draft says a malformed field is ignored.
//! Decimals are read only to be told apart from garbage: no limit is
//! fractional, but the evidence should say "not an integer", not
//! "malformed".
//!
//! The parser is bounded by its input (one pass, no backtracking), by a
//! member count and by a parameter count per member, so a hostile field
//! cannot make it allocate more than a few small strings.

/// A bare item (RFC 9651 §3.3), as far as the rate-limit fields use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BareItem {
    /// A non-negative Integer: at most 15 digits, so it always fits.
    Integer(u64),
    /// A well-formed Decimal; its value is never needed.
    Decimal,
    /// A well-formed number with a minus sign. No count in these fields is
    /// negative, so its value is never needed either; `-0` lands here too,
    /// refused as `Retry-After` refuses it: a sign where a count belongs
    /// says the sender computed something other than a count.
    Negative,
    String(String),
    Token(String),
    /// The base64 text between the colons, not decoded: the partition key
    /// is only ever compared, and its text is the evidence.
    ByteSequence(String),
    Boolean(bool),
}

/// One list member: a bare item and its parameters, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Item {
    pub(super) value: BareItem,
    /// Repeated keys are all kept: RFC 9651 lets the last one win, but two
    /// different values for one key is a statement contradicting itself,
    /// which the reader above refuses instead of picking one.
    pub(super) params: Vec<(String, BareItem)>,
}

/// Why a field is not a List of Items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SfError {
    Malformed,
    TooManyMembers,
    TooManyParameters,
}

/// Parameters read per item; the draft defines four, and the rest are
/// comments that nothing reads.
const MAX_PARAMETERS: usize = 16;

/// Parses `input` as a List of Items with at most `max_members` members.
pub(super) fn parse_list(input: &str, max_members: usize) -> Result<Vec<Item>, SfError> {
    let mut cursor = Cursor {
        bytes: input.trim_matches([' ', '\t']).as_bytes(),
        at: 0,
    };
    let mut members = Vec::new();
    while !cursor.done() {
        if members.len() == max_members {
            return Err(SfError::TooManyMembers);
        }
        members.push(cursor.item()?);
        cursor.skip_ows();
        if cursor.done() {
            break;
        }
        cursor.expect(b',')?;
        cursor.skip_ows();
        if cursor.done() {
            // A trailing comma.
            return Err(SfError::Malformed);
        }
    }
    Ok(members)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, want: u8) -> Result<(), SfError> {
        match self.next() {
            Some(b) if b == want => Ok(()),
            _ => Err(SfError::Malformed),
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// Takes bytes while `keep` holds; they are ASCII by construction of
    /// every caller's predicate.
    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> String {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.at += 1;
        }
        self.bytes[start..self.at]
            .iter()
            .map(|&b| b as char)
            .collect()
    }

    fn item(&mut self) -> Result<Item, SfError> {
        let value = self.bare_item()?;
        let mut params = Vec::new();
        while self.peek() == Some(b';') {
            self.at += 1;
            while self.peek() == Some(b' ') {
                self.at += 1;
            }
            if params.len() == MAX_PARAMETERS {
                return Err(SfError::TooManyParameters);
            }
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.at += 1;
                self.bare_item()?
            } else {
                BareItem::Boolean(true)
            };
            params.push((key, value));
        }
        Ok(Item { value, params })
    }

    /// `key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`
    fn key(&mut self) -> Result<String, SfError> {
        match self.peek() {
            Some(b) if b.is_ascii_lowercase() || b == b'*' => {}
            _ => return Err(SfError::Malformed),
        }
        Ok(self.take_while(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.' | b'*')
        }))
    }

    fn bare_item(&mut self) -> Result<BareItem, SfError> {
        match self.peek() {
            Some(b) if b == b'-' || b.is_ascii_digit() => self.number(),
            Some(b'"') => self.string(),
            Some(b) if b.is_ascii_alphabetic() || b == b'*' => Ok(BareItem::Token(
                self.take_while(|b| is_tchar(b) || b == b':' || b == b'/'),
            )),
            Some(b':') => self.byte_sequence(),
            Some(b'?') => {
                self.at += 1;
                match self.next() {
                    Some(b'1') => Ok(BareItem::Boolean(true)),
                    Some(b'0') => Ok(BareItem::Boolean(false)),
                    _ => Err(SfError::Malformed),
                }
            }
            _ => Err(SfError::Malformed),
        }
    }

    /// RFC 9651 §4.2.4: an Integer has at most 15 digits; a Decimal at most
    /// 12 before the point and 1 to 3 after it.
    fn number(&mut self) -> Result<BareItem, SfError> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let int = self.take_while(|b| b.is_ascii_digit());
        if int.is_empty() {
            return Err(SfError::Malformed);
        }
        if self.peek() != Some(b'.') {
            if int.len() > 15 {
                return Err(SfError::Malformed);
            }
            if negative {
                return Ok(BareItem::Negative);
            }
            let value = int.parse().map_err(|_| SfError::Malformed)?;
            return Ok(BareItem::Integer(value));
        }
        self.at += 1;
        let frac = self.take_while(|b| b.is_ascii_digit());
        if int.len() > 12 || frac.is_empty() || frac.len() > 3 {
            return Err(SfError::Malformed);
        }
        Ok(if negative {
            BareItem::Negative
        } else {
            BareItem::Decimal
        })
    }

    /// `DQUOTE *( unescaped / "%" / escaped ) DQUOTE`, printable ASCII only.
    fn string(&mut self) -> Result<BareItem, SfError> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            match self.next() {
                None => return Err(SfError::Malformed),
                Some(b'"') => return Ok(BareItem::String(out)),
                Some(b'\\') => match self.next() {
                    Some(c @ (b'"' | b'\\')) => out.push(c as char),
                    _ => return Err(SfError::Malformed),
                },
                Some(c @ 0x20..=0x7e) => out.push(c as char),
                Some(_) => return Err(SfError::Malformed),
            }
        }
    }

    fn byte_sequence(&mut self) -> Result<BareItem, SfError> {
        self.expect(b':')?;
        let text =
            self.take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
        self.expect(b':')?;
        Ok(BareItem::ByteSequence(text))
    }
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(value: BareItem, params: &[(&str, BareItem)]) -> Item {
        Item {
            value,
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn a_list_of_items_with_parameters() {
        let list =
            parse_list(r#""burst";q=100;w=60,"daily";q=1000;w=86400"#, 8).expect("well-formed");
        assert_eq!(
            list,
            vec![
                item(
                    BareItem::String("burst".into()),
                    &[("q", BareItem::Integer(100)), ("w", BareItem::Integer(60))]
                ),
                item(
                    BareItem::String("daily".into()),
                    &[
                        ("q", BareItem::Integer(1000)),
                        ("w", BareItem::Integer(86400))
                    ]
                ),
            ]
        );
    }

    #[test]
    fn every_bare_item_the_fields_use() {
        let list = parse_list(
            r#"tok/en:1;i=-3;z=-0;d=1.5;s="a\"b";b=:cHsdsRa894==:;t;f=?0"#,
            8,
        )
        .expect("well-formed");
        assert_eq!(
            list,
            vec![item(
                BareItem::Token("tok/en:1".into()),
                &[
                    ("i", BareItem::Negative),
                    ("z", BareItem::Negative),
                    ("d", BareItem::Decimal),
                    ("s", BareItem::String("a\"b".into())),
                    ("b", BareItem::ByteSequence("cHsdsRa894==".into())),
                    ("t", BareItem::Boolean(true)),
                    ("f", BareItem::Boolean(false)),
                ]
            )]
        );
    }

    #[test]
    fn whitespace_is_allowed_around_commas_and_after_semicolons() {
        let list = parse_list(" 1 ,\t2; w=3 ", 8).expect("well-formed");
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].params, vec![("w".into(), BareItem::Integer(3))]);
    }

    #[test]
    fn syntax_errors_fail_the_whole_field() {
        for raw in [
            "1,",               // trailing comma
            ",1",               // leading comma
            "1 2",              // no comma
            "(1 2)",            // an inner list
            "\"open",           // unterminated string
            "\"a\\x\"",         // bad escape
            "\"é\"",            // not ASCII
            ":abc",             // unterminated byte sequence
            "1;Q=2",            // uppercase key
            "1;=2",             // empty key
            "1234567890123456", // 16-digit integer
            "1.",               // decimal without fraction
            "1.2345",           // four fraction digits
            "1234567890123.5",  // 13 integer digits in a decimal
            "-",                // sign alone
            "?2",               // not a boolean
            "@1700000000",      // a Date is not used here
        ] {
            assert_eq!(parse_list(raw, 8), Err(SfError::Malformed), "{raw:?}");
        }
    }

    #[test]
    fn members_and_parameters_are_bounded() {
        assert_eq!(parse_list("1,2,3", 2), Err(SfError::TooManyMembers));
        let many = format!("1{}", ";a".repeat(MAX_PARAMETERS + 1));
        assert_eq!(parse_list(&many, 8), Err(SfError::TooManyParameters));
        assert_eq!(parse_list("", 8), Ok(vec![]));
    }
}
