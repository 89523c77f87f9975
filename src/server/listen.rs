//! Accepting connections: per-peer and total connection limits, the TLS
//! handshake (off the accept loop, bounded in time), and the idle timeout.
//!
//! The limits are checked before a handshake so a peer opening sockets in
//! a loop costs an accept and a close, not a key exchange. Each accepted
//! connection is a [`Conn`] whose [`ConnInfo`] carries its peer address and
//! an [`Activity`] count of calls in flight, which the server's
//! [`ConnLayer`](super::guard::ConnLayer) keeps; a connection with no call
//! in flight for the idle timeout reads as closed, and hyper lets it go.
//! The same code accepts for the gRPC port and for the probe listeners
//! (`/metrics`, plaintext health), each with its own [`ConnLimits`]; the
//! probe listeners also close a connection that has not finished its first
//! request within a header timeout.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::tls::ServerTls;
use crate::config::Transport;

/// Connections accepted but not yet handed to the server.
const BACKLOG: usize = 64;

/// The numbers one listener accepts connections with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_connections_per_ip: usize,
    /// A TLS handshake not done by then is dropped.
    pub handshake_timeout: Duration,
    /// A connection with no call in flight this long is closed.
    pub idle_timeout: Duration,
    /// A connection whose first request has not arrived whole this long
    /// after it opened is closed (`None`: only the idle timeout applies).
    pub header_timeout: Option<Duration>,
}

impl ConnLimits {
    /// The gRPC port's: `[server]` `max_connections`, … `idle_timeout`.
    pub fn grpc(transport: &Transport) -> ConnLimits {
        ConnLimits {
            max_connections: transport.max_connections,
            max_connections_per_ip: transport.max_connections_per_ip,
            handshake_timeout: transport.handshake_timeout,
            idle_timeout: transport.idle_timeout,
            header_timeout: None,
        }
    }

    /// The probe listeners' (`/metrics`, plaintext health): `[server]`
    /// `probe_*`. A scraper or a probe needs a connection or two; these
    /// listeners are for nobody else.
    pub fn probes(transport: &Transport) -> ConnLimits {
        ConnLimits {
            max_connections: transport.probe_max_connections,
            max_connections_per_ip: transport.probe_max_connections_per_ip,
            handshake_timeout: transport.handshake_timeout,
            idle_timeout: transport.probe_idle_timeout,
            header_timeout: Some(transport.probe_header_timeout),
        }
    }
}

/// How many connections each peer address holds, and all of them.
#[derive(Debug, Default)]
struct Slots {
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    total: AtomicUsize,
}

/// One connection's place in [`Slots`], given back when it closes.
#[derive(Debug)]
struct Slot {
    slots: Arc<Slots>,
    ip: IpAddr,
}

impl Slots {
    fn take(self: &Arc<Self>, ip: IpAddr, limits: &ConnLimits) -> Option<Slot> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let mine = per_ip.get(&ip).copied().unwrap_or(0);
        if mine >= limits.max_connections_per_ip
            || self.total.load(Ordering::Relaxed) >= limits.max_connections
        {
            return None;
        }
        per_ip.insert(ip, mine + 1);
        self.total.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            slots: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self.slots.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
        self.slots.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Calls in flight on one connection, and since when there were none.
#[derive(Debug)]
pub struct Activity {
    active: AtomicUsize,
    /// Whether any call has started: until one has, the header timeout
    /// applies.
    started: AtomicBool,
    idle_since: Mutex<Instant>,
    /// Calls in flight without a token to check, bounded per connection
    /// by the [`gate`](super::gate).
    pub(super) unauthenticated: AtomicUsize,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            active: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            unauthenticated: AtomicUsize::new(0),
        })
    }

    /// Counts a call in flight until the guard is dropped.
    pub fn start(self: &Arc<Self>) -> ActiveCall {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.started.store(true, Ordering::Relaxed);
        ActiveCall(Arc::clone(self))
    }

    /// When the connection becomes idle for `timeout`; `None` while a call
    /// is in flight.
    fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) + timeout)
    }
}

/// A call in flight (see [`Activity::start`]).
#[derive(Debug)]
pub struct ActiveCall(Arc<Activity>);

impl Drop for ActiveCall {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        }
    }
}

/// What every request on a [`Conn`] carries in its extensions.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The addresses, re-inserted as tonic's own type so
    /// `Request::remote_addr` works on TLS and plaintext alike.
    pub tcp: TcpConnectInfo,
    /// Calls in flight on the connection.
    pub activity: Arc<Activity>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection, plaintext or TLS, closed when idle.
pub struct Conn {
    io: Io,
    info: ConnInfo,
    idle_timeout: Duration,
    /// When the first request must have arrived by, if there is a bound.
    first_request_by: Option<Instant>,
    idle: Pin<Box<Sleep>>,
    _slot: Slot,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper always has a read pending, so the idle timer is polled here
        // and its wake-up lands in hyper's connection task.
        while this.idle.as_mut().poll(cx).is_ready() {
            let idle = this.info.activity.idle_deadline(this.idle_timeout);
            let idle = match (idle, this.first_request_by) {
                (Some(idle), Some(by)) if !this.info.activity.started.load(Ordering::Relaxed) => {
                    Some(idle.min(by))
                }
                (idle, _) => idle,
            };
            match idle {
                // End of stream: hyper closes the connection.
                Some(deadline) if deadline <= Instant::now() => return Poll::Ready(Ok(())),
                Some(deadline) => this.idle.as_mut().reset(deadline),
                None => this.idle.as_mut().reset(Instant::now() + this.idle_timeout),
            }
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The connections of `listener`, limited and (with `tls`) handshaken, as
/// the stream [`super::run`] serves. The accept loop runs until the stream
/// is dropped (the server stops accepting when it drains).
pub fn incoming(
    listener: TcpListener,
    limits: ConnLimits,
    tls: Option<Arc<ServerTls>>,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    tokio::spawn(accept_loop(listener, limits, tls, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    limits: ConnLimits,
    tls: Option<Arc<ServerTls>>,
    tx: mpsc::Sender<io::Result<Conn>>,
) {
    let slots = Arc::<Slots>::default();
    let mut refused = Refusals::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, mostly: back off instead of
                    // spinning on the error.
                    tracing::warn!(cause = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = slots.take(peer.ip(), &limits) else {
            refused.note(peer.ip());
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let info = ConnInfo {
            tcp: TcpConnectInfo {
                local_addr: stream.local_addr().ok(),
                remote_addr: Some(peer),
            },
            activity: Activity::new(),
        };
        let idle_timeout = limits.idle_timeout;
        let first_request_by = limits.header_timeout.map(|t| Instant::now() + t);
        let conn = move |io| Conn {
            io,
            info,
            idle_timeout,
            first_request_by,
            idle: Box::pin(tokio::time::sleep_until(
                first_request_by.map_or(Instant::now() + idle_timeout, |by| {
                    by.min(Instant::now() + idle_timeout)
                }),
            )),
            _slot: slot,
        };
        match &tls {
            None => {
                if tx.send(Ok(conn(Io::Plain(stream)))).await.is_err() {
                    return;
                }
            }
            // The handshake runs beside the loop, so one slow peer delays
            // nobody; it ends by itself within the handshake timeout.
            Some(tls) => {
                let (acceptor, tx) = (tls.acceptor().clone(), tx.clone());
                let timeout = limits.handshake_timeout;
                tokio::spawn(async move {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(conn(Io::Tls(Box::new(stream))))).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, cause = %err, "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Connections refused for a limit, logged at most once a minute (a peer
/// reconnecting in a loop must not write a line per attempt).
#[derive(Debug, Default)]
struct Refusals {
    unlogged: u64,
    last_log: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, ip: IpAddr) {
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60))
        {
            tracing::warn!(
                refused = self.unlogged,
                last_peer = %ip,
                "connections refused: a connection limit is reached (one line per minute)"
            );
            self.unlogged = 0;
            self.last_log = Some(now);
        }
    }
}

/// Whether serving `address` in plaintext needs `allow_plaintext`: any
/// address a remote peer could reach.
pub fn needs_plaintext_consent(address: SocketAddr) -> bool {
    !address.ip().is_loopback()
}
