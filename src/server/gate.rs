//! Who may take a request slot, checked before it is taken: one tower layer
//! between the connection guard and the server-wide concurrency limit.
//!
//! Without it a call reached the server-wide limit (and held one of its
//! slots) before any handler looked at its token, so a peer with no token
//! at all could fill every slot with calls that send their headers and
//! never their message. Here each call is sorted by its path:
//!
//! - **Budget and Admin calls** have their bearer token checked at once,
//!   from the headers alone. An unknown or missing token is refused
//!   UNAUTHENTICATED without reaching a slot (and held back as
//!   [`BadTokens`] says, capped per peer); a known one goes on, its
//!   identity attached so the handler does not check it again.
//! - **Budget calls of a caller token** are counted per token while the
//!   handler runs, as the server-wide limit counts them; past the token's
//!   part of the slots ([`crate::tenancy::TenantLimits::requests`]) they
//!   are refused RESOURCE_EXHAUSTED naming the limit, before a server-wide
//!   slot is taken. One tenant saturating its part, with slow bodies or
//!   slow calls, leaves the other tenants theirs. A Watch stream counts
//!   until it is open, not while it streams (it has a quota of its own).
//! - **Calls that carry no token to check** (health, reflection, unknown
//!   methods, and everything in open dev mode's Admin API) are counted per
//!   connection and per peer address while they run; past either bound
//!   they are refused RESOURCE_EXHAUSTED. A flood from one address thus
//!   holds a bounded part of the server, whatever the other limits are.
//! - **Every call but a reflection stream** must deliver its request
//!   message within the body timeout; a body that stalls ends the call
//!   with DEADLINE_EXCEEDED and frees its slot, long before the request
//!   timeout would.
//!
//! An UNAUTHENTICATED answer from a handler (a token revoked in between)
//! is held back like the gate's own.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::transport::server::TcpConnectInfo;
use tower::{Layer, Service};

use super::listen::{Activity, ConnInfo};
use crate::auth::throttle::BadTokens;
use crate::auth::{AdminDenied, Authenticated, Authenticator, Identity};
use crate::config::Transport;
use crate::tenancy::TenantLimits;

/// The gRPC status code UNAUTHENTICATED as it appears in `grpc-status`.
const UNAUTHENTICATED: &[u8] = b"16";
/// Paths of the services whose calls carry a bearer token.
const BUDGET_PREFIX: &str = "/tollgate.v1.Budget/";
const ADMIN_PREFIX: &str = "/tollgate.v1.Admin/";
/// Reflection streams send requests as the client goes: no body deadline.
const REFLECTION_PREFIX: &str = "/grpc.reflection.";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct GateLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    auth: Authenticator,
    bad_tokens: BadTokens,
    body_timeout: Duration,
    per_connection: usize,
    per_ip: usize,
    /// Unauthenticated calls in flight by peer address.
    unauthenticated: Mutex<HashMap<IpAddr, usize>>,
    /// By token entry: its name and how many Budget calls it may have in
    /// flight.
    tenants: TenantLimits,
    /// By token entry: its Budget calls in flight.
    in_flight: Vec<AtomicUsize>,
}

impl GateLayer {
    /// A gate checking tokens against `auth` (shared with the services, so
    /// a token file reload is seen by both) with the bounds of `transport`
    /// and each token's part of the request slots in `tenants`.
    pub fn new(auth: Authenticator, transport: &Transport, tenants: TenantLimits) -> Self {
        GateLayer {
            shared: Arc::new(Shared {
                auth,
                bad_tokens: BadTokens::default(),
                body_timeout: transport.body_timeout,
                per_connection: transport.max_unauthenticated_calls_per_connection,
                per_ip: transport.max_unauthenticated_calls_per_ip,
                unauthenticated: Mutex::default(),
                in_flight: tenants
                    .requests
                    .iter()
                    .map(|_| AtomicUsize::new(0))
                    .collect(),
                tenants,
            }),
        }
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`GateLayer`] makes.
#[derive(Debug, Clone)]
pub struct Gate<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the gate decided about one call.
enum Verdict {
    /// Go on; with a permit when the call is counted as unauthenticated.
    Pass(Option<Unauthenticated>),
    /// Go on, counted among the Budget calls of token entry `.0`.
    Token(usize),
    /// Answer now with this status; `hold`: it is a bad token, held back.
    Refuse { status: Status, hold: bool },
}

impl Shared {
    fn verdict(&self, request: &mut http::Request<impl Sized>, peer: Option<IpAddr>) -> Verdict {
        let path = request.uri().path();
        let budget = path.starts_with(BUDGET_PREFIX);
        let admin = path.starts_with(ADMIN_PREFIX);
        let needs_token = (budget && !self.auth.is_open()) || (admin && !self.auth.admin_is_open());
        if !needs_token {
            if budget {
                return Verdict::Pass(None);
            }
            return match self.count_unauthenticated(request, peer) {
                Some(permit) => Verdict::Pass(Some(permit)),
                None => Verdict::Refuse {
                    status: Status::resource_exhausted(
                        "too many calls without a token from this address",
                    ),
                    hold: false,
                },
            };
        }
        // A peer with enough refusals waiting learns nothing more: its call
        // is refused before its token is read (see `BadTokens`).
        if !self.bad_tokens.admits(peer) {
            return Verdict::Refuse {
                status: Status::resource_exhausted(
                    "too many refused tokens from this address are waiting; retry later",
                ),
                hold: false,
            };
        }
        let header = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if budget {
            match self.auth.identify(header) {
                Ok(identity) => {
                    request.extensions_mut().insert(Authenticated(identity));
                    match identity {
                        Identity::Token(entry) => self.count_token(entry),
                        Identity::Open => Verdict::Pass(None),
                    }
                }
                Err(err) => Verdict::Refuse {
                    status: Status::unauthenticated(err.to_string()),
                    hold: true,
                },
            }
        } else {
            // A caller token goes on: the handler answers PERMISSION_DENIED,
            // and the peer is not guessing. The loopback exception is open
            // dev mode's, which does not reach here.
            match self.auth.identify_admin(header, false) {
                Ok(_) | Err(AdminDenied::Forbidden(_)) => Verdict::Pass(None),
                Err(AdminDenied::Unauthenticated(message)) => Verdict::Refuse {
                    status: Status::unauthenticated(message),
                    hold: true,
                },
            }
        }
    }

    /// A place among token entry `entry`'s Budget calls in flight, or a
    /// refusal naming its limit.
    fn count_token(&self, entry: usize) -> Verdict {
        let (Some(count), Some(&limit)) =
            (self.in_flight.get(entry), self.tenants.requests.get(entry))
        else {
            return Verdict::Pass(None);
        };
        let before = count.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            count.fetch_sub(1, Ordering::AcqRel);
            let name = self.tenants.names.get(entry).map_or("", String::as_str);
            return Verdict::Refuse {
                status: Status::resource_exhausted(format!(
                    "token {name:?} has {limit} calls in flight \
                     (max_concurrent_requests of its [[token]] entry)"
                )),
                hold: false,
            };
        }
        Verdict::Token(entry)
    }

    /// A place for an unauthenticated call from `peer` on the request's
    /// connection, or `None` past either bound.
    fn count_unauthenticated(
        self: &Shared,
        request: &http::Request<impl Sized>,
        peer: Option<IpAddr>,
    ) -> Option<Unauthenticated> {
        let connection = request
            .extensions()
            .get::<ConnInfo>()
            .map(|info| Arc::clone(&info.activity));
        if let Some(activity) = &connection {
            let before = activity.unauthenticated.fetch_add(1, Ordering::AcqRel);
            if before >= self.per_connection {
                activity.unauthenticated.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
        }
        let key = peer.unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
        let mut by_ip = self
            .unauthenticated
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mine = by_ip.entry(key).or_insert(0);
        if *mine >= self.per_ip {
            drop(by_ip);
            if let Some(activity) = &connection {
                activity.unauthenticated.fetch_sub(1, Ordering::AcqRel);
            }
            return None;
        }
        *mine += 1;
        Some(Unauthenticated {
            connection,
            ip: key,
        })
    }

    fn release(&self, ip: IpAddr) {
        let mut by_ip = self
            .unauthenticated
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&ip);
            }
        }
    }
}

/// An unauthenticated call's place, given back when its response ends
/// (a health Watch holds it while it streams).
struct Unauthenticated {
    connection: Option<Arc<Activity>>,
    ip: IpAddr,
}

/// An unauthenticated call's place, with the gate it gives it back to.
pub struct Permit {
    place: Unauthenticated,
    shared: Arc<Shared>,
}

/// A token's Budget call in flight, given back when the handler is done
/// (or the call is dropped).
struct TokenPermit {
    entry: usize,
    shared: Arc<Shared>,
}

impl Drop for TokenPermit {
    fn drop(&mut self) {
        if let Some(count) = self.shared.in_flight.get(self.entry) {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(activity) = &self.place.connection {
            activity.unauthenticated.fetch_sub(1, Ordering::AcqRel);
        }
        self.shared.release(self.place.ip);
    }
}

impl<S, B, ResBody> Service<http::Request<B>> for Gate<S>
where
    S: Service<http::Request<DeadlineBody<B>>, Response = http::Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = http::Response<GateBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let peer: Option<IpAddr> = request
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
            .map(|a| a.ip());
        let shared = Arc::clone(&self.shared);
        let mut token_permit = None;
        let permit = match shared.verdict(&mut request, peer) {
            Verdict::Pass(place) => place.map(|place| Permit {
                place,
                shared: Arc::clone(&shared),
            }),
            Verdict::Token(entry) => {
                token_permit = Some(TokenPermit {
                    entry,
                    shared: Arc::clone(&shared),
                });
                None
            }
            Verdict::Refuse { status, hold } => {
                return Box::pin(async move {
                    if hold {
                        shared.bad_tokens.hold(peer).await;
                    }
                    Ok(refusal(status))
                });
            }
        };
        let deadline = (!request.uri().path().starts_with(REFLECTION_PREFIX))
            .then(|| Instant::now() + shared.body_timeout);
        let request = request.map(|inner| DeadlineBody {
            inner,
            deadline,
            timer: None,
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            // The handler is done (as the server-wide limit counts it).
            drop(token_permit);
            let response = response?;
            if response.headers().get("grpc-status").map(|v| v.as_bytes()) == Some(UNAUTHENTICATED)
            {
                shared.bad_tokens.hold(peer).await;
            }
            Ok(response.map(|inner| GateBody::Served {
                inner,
                _permit: permit,
            }))
        })
    }
}

/// A trailers-only gRPC response carrying `status`.
fn refusal<B>(status: Status) -> http::Response<GateBody<B>> {
    let (parts, ()) = status.into_http::<()>().into_parts();
    http::Response::from_parts(parts, GateBody::Refused)
}

pin_project! {
    /// The response body of a call through the gate: the service's, keeping
    /// the call's unauthenticated place until it ends, or nothing for a
    /// refusal (its status is in the headers).
    // pin_project_lite takes no docs on enum fields: `inner` is the
    // service's body, `_permit` is given back when it ends or is dropped.
    #[allow(missing_docs)]
    #[project = GateBodyProj]
    pub enum GateBody<B> {
        /// The service answered.
        Served {
            #[pin]
            inner: B,
            _permit: Option<Permit>,
        },
        /// The gate answered.
        Refused,
    }
}

impl<B: Body> Body for GateBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project() {
            GateBodyProj::Served { inner, .. } => inner.poll_frame(cx),
            GateBodyProj::Refused => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GateBody::Served { inner, .. } => inner.is_end_stream(),
            GateBody::Refused => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GateBody::Served { inner, .. } => inner.size_hint(),
            GateBody::Refused => SizeHint::with_exact(0),
        }
    }
}

pin_project! {
    /// A request body that must end by its deadline (`None`: no deadline).
    /// The timer is made only if the body is not all there at once, which
    /// is rare: a request message usually arrives with its headers.
    pub struct DeadlineBody<B> {
        #[pin]
        inner: B,
        deadline: Option<Instant>,
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            if frame.is_none() {
                *this.deadline = None;
                *this.timer = None;
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(deadline) = *this.deadline else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(timer.as_mut().poll(cx));
        *this.deadline = None;
        *this.timer = None;
        // tonic finds a Status in a body error and answers with it.
        Poll::Ready(Some(Err(Box::new(Status::deadline_exceeded(
            "the request message did not arrive within the body timeout",
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
