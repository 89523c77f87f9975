//! The per-request side of the connection limits, as one tower layer over
//! every service: it counts the call as in flight on its connection (for
//! the idle timeout) until the response body ends, and makes the peer
//! address visible to `Request::remote_addr` on every transport (and to
//! the [`gate`](super::gate) behind it).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::Body;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::listen::{ActiveCall, ConnInfo};

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct ConnLayer;

impl<S> Layer<S> for ConnLayer {
    type Service = ConnGuard<S>;

    fn layer(&self, inner: S) -> ConnGuard<S> {
        ConnGuard { inner }
    }
}

/// The service [`ConnLayer`] makes.
#[derive(Debug, Clone)]
pub struct ConnGuard<S> {
    inner: S,
}

impl<S, B, ResBody> Service<http::Request<B>> for ConnGuard<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<GuardedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let call = request.extensions().get::<ConnInfo>().cloned().map(|info| {
            request.extensions_mut().insert(info.tcp.clone());
            info.activity.start()
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| GuardedBody { inner, _call: call }))
        })
    }
}

pin_project! {
    /// A response body that keeps its call counted as in flight until it
    /// is finished or dropped (a Watch stream is in flight while it lasts).
    pub struct GuardedBody<B> {
        #[pin]
        inner: B,
        _call: Option<ActiveCall>,
    }
}

impl<B: Body> Body for GuardedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
