//! Pure syntax ([`parse_rate_limit`]): the rate-limit fields of one
//! response → a typed [`RateLimitStatement`], with no clock. A `Reset`
//! whose form (epoch or seconds left) cannot be told from its text alone
//! stays [`StatedReset::Undecided`] for
//! [`read_rate_limit`](super::read_rate_limit) to decide against the
//! receipt time.

use std::time::Duration;

use super::sf::{self, BareItem, Item, SfError};
use super::{
    InvalidStatement, MAX_FIELD_BYTES, MAX_NAME_BYTES, MAX_PARTITION_KEY_BYTES, MAX_POLICIES,
};
use crate::hint::{InvalidHint, MAX_RAW_HINT_BYTES, bounded_to, non_negative_integer};

/// The header families, in the order one is preferred when several are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitFamily {
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` (structured fields).
    Draft,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After` (GitHub,
    /// Envoy, Discord and many more).
    XRateLimit,
    /// `X-Rate-Limit-Limit`, `-Remaining`, `-Reset`, `-Reset-After` (Okta,
    /// Twitter/X).
    XRateLimitHyphenated,
}

impl RateLimitFamily {
    /// The lowercase name used in evidence and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimitFamily::Draft => "draft",
            RateLimitFamily::XRateLimit => "x-ratelimit",
            RateLimitFamily::XRateLimitHyphenated => "x-rate-limit",
        }
    }
}

/// `RateLimit-Policy`, as evidence and verdicts name it.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// `RateLimit`, as evidence and verdicts name it.
pub const RATELIMIT: &str = "ratelimit";

/// The four field names of one `X-…` family, lowercase.
struct XNames {
    limit: &'static str,
    remaining: &'static str,
    reset: &'static str,
    reset_after: &'static str,
}

const X_RATELIMIT: XNames = XNames {
    limit: "x-ratelimit-limit",
    remaining: "x-ratelimit-remaining",
    reset: "x-ratelimit-reset",
    reset_after: "x-ratelimit-reset-after",
};

const X_RATE_LIMIT: XNames = XNames {
    limit: "x-rate-limit-limit",
    remaining: "x-rate-limit-remaining",
    reset: "x-rate-limit-reset",
    reset_after: "x-rate-limit-reset-after",
};

/// Every field name read, in preference order: the draft's two, then each
/// `X-…` family's four. Its index is the field's slot while collecting.
pub(super) const FIELDS: [&str; 10] = [
    RATELIMIT_POLICY,
    RATELIMIT,
    X_RATELIMIT.limit,
    X_RATELIMIT.remaining,
    X_RATELIMIT.reset,
    X_RATELIMIT.reset_after,
    X_RATE_LIMIT.limit,
    X_RATE_LIMIT.remaining,
    X_RATE_LIMIT.reset,
    X_RATE_LIMIT.reset_after,
];

/// What the quota of a policy counts (the draft's `qu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaUnit {
    /// `requests`, the default.
    Requests,
    /// `content-bytes`.
    ContentBytes,
    /// `concurrent-requests`.
    ConcurrentRequests,
    /// A unit this version does not know; kept so a quota of bytes is
    /// never mistaken for a quota of requests.
    Other,
}

/// A quota policy: at most `quota` units per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaPolicy {
    /// The draft's policy identifier (Envoy's `name`), which a `RateLimit`
    /// item names to say which policy its state belongs to; `None` for the
    /// one limit an `X-…-Limit` states.
    pub name: Option<String>,
    /// Units allowed per window (`q`, or the `X-…-Limit` value).
    pub quota: u64,
    /// What a unit is.
    pub unit: QuotaUnit,
    /// The window (`w`); `None` when not stated, as with GitHub's hour.
    pub window: Option<Duration>,
    /// The draft's partition key (`pk`), the base64 text as sent: two
    /// responses about different partitions must not be merged, and the
    /// text is all that is needed to tell them apart.
    pub partition_key: Option<String>,
}

/// When a service limit's quota comes back, as stated, not yet converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatedReset {
    /// Seconds from the response: the draft's `t`, `X-…-Reset-After`.
    After(u64),
    /// `X-…-Reset`: epoch seconds (GitHub, Okta, Twitter/X) or seconds left
    /// (Envoy), depending on the API; [`read_rate_limit`](super::read_rate_limit)
    /// tells them apart.
    Undecided(u64),
    /// Both `X-…-Reset` and `X-…-Reset-After` were sent.
    Both {
        /// `X-…-Reset`, undecided.
        reset: u64,
        /// `X-…-Reset-After`, seconds.
        after: u64,
    },
}

/// The current state of one quota: what is left and when more comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLimit {
    /// The policy this state belongs to (the `RateLimit` item's identifier).
    pub policy: Option<String>,
    /// The quota stated beside it (`X-…-Limit`); the draft states it in the
    /// named policy instead.
    pub quota: Option<u64>,
    /// Units left in the current window (`r`, `X-…-Remaining`).
    pub remaining: u64,
    /// When more quota comes back (`t`, `X-…-Reset`, `X-…-Reset-After`).
    pub reset: Option<StatedReset>,
    /// The draft's partition key (`pk`), as in [`QuotaPolicy`].
    pub partition_key: Option<String>,
}

/// What one response states about its upstream's limits, as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateLimitStatement {
    /// The quota policies (`RateLimit-Policy`, or `X-…-Limit`), at most
    /// [`MAX_POLICIES`].
    pub policies: Vec<QuotaPolicy>,
    /// The current state per policy (`RateLimit`, or `X-…-Remaining` and
    /// `-Reset`), at most [`MAX_POLICIES`].
    pub limits: Vec<ServiceLimit>,
}

/// Why no statement could be formed from the fields sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// A field is not in the syntax its form requires.
    Invalid {
        /// The field, lowercase.
        field: &'static str,
        /// Which rule it broke.
        why: InvalidStatement,
    },
    /// One field (or one policy, or one parameter) was given two different
    /// values; neither is picked, since picking is guessing.
    Conflicting {
        /// The field, lowercase.
        field: &'static str,
    },
    /// More than [`MAX_POLICIES`] policies or states in one field.
    TooMany {
        /// The field, lowercase.
        field: &'static str,
    },
}

/// One field as received, kept as evidence whatever the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawField {
    /// The field name, lowercase.
    pub name: &'static str,
    /// Its value (several lines joined with `", "`), cut to
    /// [`MAX_RAW_HINT_BYTES`].
    pub value: String,
}

/// [`parse_rate_limit`]'s result for one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRateLimit {
    /// The family read; the others sent beside it are ignored.
    pub family: RateLimitFamily,
    /// The family's fields as received, at most four.
    pub raw: Vec<RawField>,
    /// The statement, or why none could be formed.
    pub statement: Result<RateLimitStatement, Unreadable>,
}

/// One field's lines, joined as RFC 9110 §5.3 combines them.
#[derive(Default)]
struct Collected {
    value: String,
    too_long: bool,
}

/// Reads the rate-limit fields among `headers` (names compared
/// case-insensitively, repeated lines joined with `", "`), or `None` if
/// there are none.
///
/// The draft's fields win over `X-RateLimit-*`, which win over
/// `X-Rate-Limit-*`: only the first family present is read, even if it
/// turns out invalid, so a broken statement is never swapped for a more
/// permissive one sent beside it.
pub fn parse_rate_limit<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<ParsedRateLimit> {
    let mut slots: [Option<Collected>; FIELDS.len()] = Default::default();
    for (name, value) in headers {
        let Some(slot) = FIELDS.iter().position(|f| f.eq_ignore_ascii_case(name)) else {
            continue;
        };
        let field = slots[slot].get_or_insert_with(Collected::default);
        if field.too_long {
            continue;
        }
        if !field.value.is_empty() {
            field.value.push_str(", ");
        }
        if field.value.len() + value.len() <= MAX_FIELD_BYTES {
            field.value.push_str(value);
        } else {
            // Only the start is kept, as evidence; nothing larger than the
            // evidence bound is ever copied.
            field.too_long = true;
            field.value.push_str(&bounded_to(value, MAX_RAW_HINT_BYTES));
            field.value = bounded_to(&field.value, MAX_RAW_HINT_BYTES);
        }
    }
    let present = |range: std::ops::Range<usize>| range.clone().any(|i| slots[i].is_some());
    let (family, range) = if present(0..2) {
        (RateLimitFamily::Draft, 0..2)
    } else if present(2..6) {
        (RateLimitFamily::XRateLimit, 2..6)
    } else if present(6..10) {
        (RateLimitFamily::XRateLimitHyphenated, 6..10)
    } else {
        return None;
    };
    let raw = range
        .clone()
        .filter_map(|i| {
            slots[i].as_ref().map(|c| RawField {
                name: FIELDS[i],
                value: bounded_to(&c.value, MAX_RAW_HINT_BYTES),
            })
        })
        .collect();
    let mut fields = range.map(|i| {
        slots[i].take().map(|c| Field {
            name: FIELDS[i],
            value: c.value,
            too_long: c.too_long,
        })
    });
    let mut next = || fields.next().flatten();
    let statement = match family {
        RateLimitFamily::Draft => draft(next(), next()),
        RateLimitFamily::XRateLimit => x_family(&X_RATELIMIT, [next(), next(), next(), next()]),
        RateLimitFamily::XRateLimitHyphenated => {
            x_family(&X_RATE_LIMIT, [next(), next(), next(), next()])
        }
    };
    Some(ParsedRateLimit {
        family,
        raw,
        statement,
    })
}

/// One collected field, handed to the family's parser.
struct Field {
    name: &'static str,
    value: String,
    too_long: bool,
}

impl Field {
    fn invalid(&self, why: InvalidStatement) -> Unreadable {
        Unreadable::Invalid {
            field: self.name,
            why,
        }
    }

    /// The field as a structured-field List, bounded.
    fn list(&self) -> Result<Vec<Item>, Unreadable> {
        if self.too_long {
            return Err(self.invalid(InvalidStatement::TooLong));
        }
        match sf::parse_list(&self.value, MAX_POLICIES) {
            Ok(items) if items.is_empty() => Err(self.invalid(InvalidStatement::Empty)),
            Ok(items) => Ok(items),
            Err(SfError::Malformed) => Err(self.invalid(InvalidStatement::Malformed)),
            Err(SfError::TooManyParameters) => Err(self.invalid(InvalidStatement::TooLong)),
            Err(SfError::TooManyMembers) => Err(Unreadable::TooMany { field: self.name }),
        }
    }
}

/// The draft's `RateLimit-Policy` and `RateLimit`, either of which may be
/// absent.
fn draft(
    policy_field: Option<Field>,
    limit_field: Option<Field>,
) -> Result<RateLimitStatement, Unreadable> {
    let mut statement = RateLimitStatement::default();
    if let Some(field) = policy_field {
        for item in field.list()? {
            let mut params = Params::new(&field, &item)?;
            let policy = QuotaPolicy {
                name: params.name.take(),
                quota: params.non_negative("q")?.ok_or_else(|| {
                    field.invalid(InvalidStatement::MissingParameter { parameter: "q" })
                })?,
                unit: params.unit()?,
                window: params.window("w")?,
                partition_key: params.partition_key()?,
            };
            push_unique(&field, &mut statement.policies, policy, |p| &p.name)?;
        }
    }
    if let Some(field) = limit_field {
        for item in field.list()? {
            let mut params = Params::new(&field, &item)?;
            let limit = ServiceLimit {
                policy: params.name.take(),
                quota: None,
                remaining: params.non_negative("r")?.ok_or_else(|| {
                    field.invalid(InvalidStatement::MissingParameter { parameter: "r" })
                })?,
                reset: params.non_negative("t")?.map(StatedReset::After),
                partition_key: params.partition_key()?,
            };
            push_unique(&field, &mut statement.limits, limit, |l| &l.policy)?;
        }
    }
    Ok(statement)
}

/// Adds `entry` unless one with its name is there: the same entry twice
/// (a proxy repeating a line) is one, two different ones conflict.
fn push_unique<T: PartialEq>(
    field: &Field,
    into: &mut Vec<T>,
    entry: T,
    name: impl Fn(&T) -> &Option<String>,
) -> Result<(), Unreadable> {
    match into.iter().find(|e| name(e) == name(&entry)) {
        Some(same) if *same == entry => Ok(()),
        Some(_) => Err(Unreadable::Conflicting { field: field.name }),
        None => {
            into.push(entry);
            Ok(())
        }
    }
}

/// One item's identifier and parameters, read by name.
struct Params<'f> {
    field: &'f Field,
    name: Option<String>,
    params: &'f [(String, BareItem)],
}

impl<'f> Params<'f> {
    /// The draft requires the item to be a String naming the policy.
    fn new(field: &'f Field, item: &'f Item) -> Result<Self, Unreadable> {
        let BareItem::String(name) = &item.value else {
            return Err(field.invalid(InvalidStatement::WrongType { parameter: "name" }));
        };
        Ok(Params {
            field,
            name: Some(bounded_name(field, name, MAX_NAME_BYTES)?),
            params: &item.params,
        })
    }

    /// The one value of `key`, if sent: a key sent twice with two values
    /// conflicts.
    fn get(&self, key: &str) -> Result<Option<&'f BareItem>, Unreadable> {
        let mut values = self.params.iter().filter(|(k, _)| k == key).map(|(_, v)| v);
        let first = values.next();
        if let Some(first) = first
            && values.any(|v| v != first)
        {
            return Err(Unreadable::Conflicting {
                field: self.field.name,
            });
        }
        Ok(first)
    }

    fn non_negative(&self, key: &'static str) -> Result<Option<u64>, Unreadable> {
        match self.get(key)? {
            None => Ok(None),
            Some(value) => sf_non_negative(self.field, key, value).map(Some),
        }
    }

    fn window(&self, key: &'static str) -> Result<Option<Duration>, Unreadable> {
        match self.non_negative(key)? {
            Some(0) => Err(self.field.invalid(InvalidStatement::ZeroWindow)),
            other => Ok(other.map(Duration::from_secs)),
        }
    }

    fn unit(&self) -> Result<QuotaUnit, Unreadable> {
        Ok(match self.get("qu")? {
            None => QuotaUnit::Requests,
            Some(BareItem::String(unit)) => match unit.as_str() {
                "requests" => QuotaUnit::Requests,
                "content-bytes" => QuotaUnit::ContentBytes,
                "concurrent-requests" => QuotaUnit::ConcurrentRequests,
                _ => QuotaUnit::Other,
            },
            Some(_) => {
                return Err(self
                    .field
                    .invalid(InvalidStatement::WrongType { parameter: "qu" }));
            }
        })
    }

    fn partition_key(&self) -> Result<Option<String>, Unreadable> {
        match self.get("pk")? {
            None => Ok(None),
            Some(BareItem::ByteSequence(key)) => {
                bounded_name(self.field, key, MAX_PARTITION_KEY_BYTES).map(Some)
            }
            Some(_) => Err(self
                .field
                .invalid(InvalidStatement::WrongType { parameter: "pk" })),
        }
    }
}

/// A name or key longer than `max` is refused, not cut: two names that
/// differ only past the cut would otherwise merge.
fn bounded_name(field: &Field, name: &str, max: usize) -> Result<String, Unreadable> {
    if name.len() > max {
        return Err(field.invalid(InvalidStatement::TooLong));
    }
    Ok(name.to_owned())
}

/// A structured-field Integer that must be `>= 0`.
fn sf_non_negative(field: &Field, key: &'static str, value: &BareItem) -> Result<u64, Unreadable> {
    match value {
        BareItem::Integer(n) => Ok(*n),
        BareItem::Decimal | BareItem::Negative => {
            Err(field.invalid(InvalidStatement::NotAnInteger))
        }
        _ => Err(field.invalid(InvalidStatement::WrongType { parameter: key })),
    }
}

/// `X-…-Limit`, `-Remaining`, `-Reset`, `-Reset-After`, any of which may be
/// absent.
fn x_family(
    names: &XNames,
    [limit, remaining, reset, reset_after]: [Option<Field>; 4],
) -> Result<RateLimitStatement, Unreadable> {
    let (quota, policies) = match &limit {
        None => (None, Vec::new()),
        Some(field) if field.value.contains(';') => {
            let (quota, policies) = envoy_limit(field)?;
            (Some(quota), policies)
        }
        Some(field) => {
            let quota = plain_count(field)?;
            let policy = QuotaPolicy {
                name: None,
                quota,
                unit: QuotaUnit::Requests,
                window: None,
                partition_key: None,
            };
            (Some(quota), vec![policy])
        }
    };
    let remaining = remaining.as_ref().map(plain_count).transpose()?;
    let reset = reset.as_ref().map(plain_count).transpose()?;
    let after = reset_after.as_ref().map(plain_count).transpose()?;
    let reset = match (reset, after) {
        (None, None) => None,
        (Some(reset), None) => Some(StatedReset::Undecided(reset)),
        (None, Some(after)) => Some(StatedReset::After(after)),
        (Some(reset), Some(after)) => Some(StatedReset::Both { reset, after }),
    };
    let limits = match (remaining, reset) {
        (Some(remaining), reset) => vec![ServiceLimit {
            policy: None,
            quota,
            remaining,
            reset,
            partition_key: None,
        }],
        (None, None) => Vec::new(),
        // A reset with no count left is the reset of nothing stated.
        (None, Some(_)) => {
            return Err(Unreadable::Invalid {
                field: names.remaining,
                why: InvalidStatement::MissingField,
            });
        }
    };
    Ok(RateLimitStatement { policies, limits })
}

/// A plain `X-…` value: `1*DIGIT`, saturating (the rule `Retry-After` uses).
/// Repeated lines, joined by commas, must all say the same.
fn plain_count(field: &Field) -> Result<u64, Unreadable> {
    if field.too_long {
        return Err(field.invalid(InvalidStatement::TooLong));
    }
    let mut agreed = None;
    for part in field.value.split(',') {
        let n = non_negative_integer(part).map_err(|why| field.invalid(why.into()))?;
        match agreed {
            Some(a) if a != n => return Err(Unreadable::Conflicting { field: field.name }),
            _ => agreed = Some(n),
        }
    }
    // `split` yields at least one part, so `agreed` is set; an empty value
    // was refused as `Empty` above.
    agreed.ok_or_else(|| field.invalid(InvalidStatement::Empty))
}

/// Envoy's form, from an early draft: `X-RateLimit-Limit: 10, 10;w=1,
/// 1000;w=3600;name="hourly"`. The bare first member is the limit that
/// `Remaining` and `Reset` describe (the policy closest to running out);
/// each member with parameters is a policy and needs a window.
fn envoy_limit(field: &Field) -> Result<(u64, Vec<QuotaPolicy>), Unreadable> {
    let items = field.list()?;
    let mut limit = None;
    let mut policies = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let quota = sf_non_negative(field, "limit", &item.value)?;
        if item.params.is_empty() {
            match limit {
                None if i == 0 => limit = Some(quota),
                Some(l) if l == quota => {}
                Some(_) => return Err(Unreadable::Conflicting { field: field.name }),
                None => return Err(field.invalid(InvalidStatement::Malformed)),
            }
            continue;
        }
        let params = Params {
            field,
            name: None,
            params: &item.params,
        };
        let name = match params.get("name")? {
            None => None,
            Some(BareItem::String(name)) => Some(bounded_name(field, name, MAX_NAME_BYTES)?),
            Some(_) => {
                return Err(field.invalid(InvalidStatement::WrongType { parameter: "name" }));
            }
        };
        let window = params
            .window("w")?
            .ok_or_else(|| field.invalid(InvalidStatement::MissingParameter { parameter: "w" }))?;
        let policy = QuotaPolicy {
            name,
            quota,
            unit: QuotaUnit::Requests,
            window: Some(window),
            partition_key: None,
        };
        if !policies.contains(&policy) {
            policies.push(policy);
        }
    }
    // The first member was bare, or the loop returned.
    let limit = limit.ok_or_else(|| field.invalid(InvalidStatement::Malformed))?;
    Ok((limit, policies))
}

impl From<InvalidHint> for InvalidStatement {
    fn from(why: InvalidHint) -> Self {
        match why {
            InvalidHint::Empty => InvalidStatement::Empty,
            InvalidHint::NotAnInteger => InvalidStatement::NotAnInteger,
            InvalidHint::Malformed => InvalidStatement::Malformed,
        }
    }
}
