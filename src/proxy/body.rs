//! The request body a proxied request carries to the upstream: the
//! service's own stream, the bytes the layer buffered for replay, or those
//! bytes followed by the rest of a stream too long to buffer (sent once).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tollgate_client::layer::{BoxError, ReplayBody};

/// See the module docs.
#[derive(Debug)]
pub enum ProxyBody {
    /// The service's body, as it arrives (a request sent once).
    Stream(Incoming),
    /// Buffered bytes, one frame (a replay, or a short first attempt).
    Bytes(Option<Bytes>),
    /// What the layer read before the body outgrew its buffer, then the
    /// rest as it arrives.
    Rejoined {
        /// Sent first, once.
        prefix: Option<Bytes>,
        /// Then this.
        rest: Incoming,
    },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every variant is Unpin (Incoming is), so no projection is needed.
        let this = self.get_mut();
        match this {
            ProxyBody::Stream(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            ProxyBody::Bytes(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Rejoined { prefix, rest } => match prefix.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Pin::new(rest)
                    .poll_frame(cx)
                    .map(|f| f.map(|r| r.map_err(Into::into))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Stream(incoming) => incoming.is_end_stream(),
            ProxyBody::Bytes(bytes) => bytes.is_none(),
            ProxyBody::Rejoined { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Stream(incoming) => incoming.size_hint(),
            ProxyBody::Bytes(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ProxyBody::Rejoined { prefix, rest } => {
                let ahead = prefix.as_ref().map_or(0, |b| b.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(ahead));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(ahead));
                }
                hint
            }
        }
    }
}

impl ReplayBody for ProxyBody {
    // A stream is replayable once buffered, which the layer does (up to the
    // listener's bound) only for a request that may be repeated.
    const BUFFERABLE: bool = true;

    fn try_clone(&self) -> Option<Self> {
        match self {
            ProxyBody::Bytes(bytes) => Some(ProxyBody::Bytes(bytes.clone())),
            ProxyBody::Stream(_) | ProxyBody::Rejoined { .. } => None,
        }
    }

    fn from_buffer(bytes: Bytes) -> Option<Self> {
        // An empty body ends at once, so a GET goes out without one.
        Some(ProxyBody::Bytes((!bytes.is_empty()).then_some(bytes)))
    }

    fn rejoin(prefix: Bytes, rest: Self) -> Option<Self> {
        match rest {
            ProxyBody::Stream(rest) => Some(ProxyBody::Rejoined {
                prefix: Some(prefix),
                rest,
            }),
            ProxyBody::Bytes(_) | ProxyBody::Rejoined { .. } => None,
        }
    }
}
