//! One retry owner per request: the mark a gate puts on the requests it owns.
//!
//! Retries configured at several layers (a client library, a queue worker, a
//! transport) multiply: three layers of three attempts are 27 requests. So
//! exactly one layer repeats an intent. The gate that owns an intent sends
//! every attempt with the [`RETRY_OWNER_HEADER`] header (for gRPC, the same
//! key as metadata: gRPC metadata travels as HTTP/2 headers); a gate further
//! down that finds the mark on its request makes one attempt, does not retry,
//! ends with `owner_elsewhere`, and hands its evidence up.
//!
//! The value names the owning attempt (`{intent_id}#{number}`) so an
//! upstream's logs can tie a request to the layer that owns its retries; it
//! falls back to `tollgate` when the intent id cannot be sent as a header.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header (and gRPC metadata key) that marks a request whose retries are
/// owned by a gate above: `x-tollgate-retry-owner`.
pub const RETRY_OWNER_HEADER: &str = "x-tollgate-retry-owner";

/// The value sent when the owning attempt's id is not a valid header value.
const FALLBACK_VALUE: &str = "tollgate";

/// Ids longer than this are not sent: a header is not the place for them.
const MAX_VALUE_BYTES: usize = 256;

/// The mark of the layer that owns an intent's retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMark(HeaderValue);

impl OwnerMark {
    /// The mark a gate puts on the attempts it owns.
    pub fn for_attempt(attempt_id: &str) -> Self {
        let printable = attempt_id.len() <= MAX_VALUE_BYTES
            && !attempt_id.is_empty()
            && attempt_id.bytes().all(|b| b.is_ascii_graphic());
        let value = printable
            .then(|| HeaderValue::from_str(attempt_id).ok())
            .flatten()
            .unwrap_or_else(|| HeaderValue::from_static(FALLBACK_VALUE));
        OwnerMark(value)
    }

    /// The mark on an incoming or outgoing request, if a layer above owns it.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        headers.get(RETRY_OWNER_HEADER).cloned().map(OwnerMark)
    }

    /// The mark in gRPC request metadata (a server handler's view).
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<Self> {
        let value = metadata.get(RETRY_OWNER_HEADER)?;
        HeaderValue::from_bytes(value.as_encoded_bytes())
            .ok()
            .map(OwnerMark)
    }

    /// Puts the mark on a request's headers, replacing any other.
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(HeaderName::from_static(RETRY_OWNER_HEADER), self.0.clone());
    }

    /// Puts the mark on a tonic request's metadata.
    pub fn apply_metadata(&self, metadata: &mut tonic::metadata::MetadataMap) {
        if let Ok(value) = tonic::metadata::MetadataValue::try_from(self.0.as_bytes()) {
            metadata.insert(RETRY_OWNER_HEADER, value);
        }
    }

    /// The mark's value.
    pub fn as_str(&self) -> &str {
        // Built from visible ASCII or received as a header; a received value
        // that is not text is shown as the fallback rather than guessed.
        self.0.to_str().unwrap_or(FALLBACK_VALUE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_through_headers_and_metadata() {
        let mark = OwnerMark::for_attempt("order-7#2");
        let mut headers = HeaderMap::new();
        assert_eq!(OwnerMark::from_headers(&headers), None);
        mark.apply(&mut headers);
        assert_eq!(OwnerMark::from_headers(&headers), Some(mark.clone()));
        assert_eq!(mark.as_str(), "order-7#2");

        let mut metadata = tonic::metadata::MetadataMap::new();
        mark.apply_metadata(&mut metadata);
        assert_eq!(OwnerMark::from_metadata(&metadata), Some(mark));
    }

    #[test]
    fn ids_that_cannot_be_headers_fall_back() {
        for id in ["", "naïve#1", "a b#1", &"x".repeat(300)] {
            assert_eq!(OwnerMark::for_attempt(id).as_str(), FALLBACK_VALUE, "{id}");
        }
    }
}
