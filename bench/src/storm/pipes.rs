//! In-memory connections to the coordinator, and the RPC counter on them.
//!
//! Every connection is a pair of `tokio::io::duplex` pipes: tokio drives
//! them itself, so a paused clock only jumps when nothing can make progress
//! (loopback sockets would race it). The coordinator's end is a
//! [`LocalPipe`], which tells the server its peer is local, as a loopback
//! socket would: the Admin API answers local peers in open dev mode.
//!
//! Counting: a worker's connection does not reach the coordinator directly.
//! It ends at a small HTTP/2 server of our own ([`Counted`]) that reads each
//! request's path (`/tollgate.v1.Budget/Lease`, …), adds one to that
//! method's count for the current second, and forwards the request
//! unchanged over the worker's own connection to the coordinator. Counting
//! at the wire sees every RPC the workers send, shed or not, whatever the
//! client library does internally.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint};
use tower::{Service as _, ServiceExt as _};

/// Pipe buffer per direction of one connection.
const PIPE_BYTES: usize = 64 * 1024;

/// The coordinator's end of one in-memory connection.
#[derive(Debug)]
pub(super) struct LocalPipe(DuplexStream);

impl Connected for LocalPipe {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        // In-process: as local as a loopback socket, which is what the
        // server checks before answering Admin calls in open dev mode.
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        TcpConnectInfo {
            local_addr: Some(local),
            remote_addr: Some(local),
        }
    }
}

impl AsyncRead for LocalPipe {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for LocalPipe {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Hands the coordinator the server end of every new connection.
#[derive(Debug, Clone)]
pub(super) struct Pipes {
    connections: mpsc::Sender<LocalPipe>,
}

impl Pipes {
    /// The pipes and the stream of server ends the coordinator accepts.
    pub(super) fn new() -> (Self, mpsc::Receiver<LocalPipe>) {
        let (connections, incoming) = mpsc::channel(64);
        (Pipes { connections }, incoming)
    }

    /// A new pipe pair whose server end the coordinator accepts.
    async fn connect(&self) -> io::Result<DuplexStream> {
        let (client, server) = tokio::io::duplex(PIPE_BYTES);
        self.connections
            .send(LocalPipe(server))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::ConnectionRefused))?;
        Ok(client)
    }

    /// A channel straight to the coordinator, each connection a fresh pipe.
    pub(super) fn channel(&self, endpoint: &Endpoint) -> Channel {
        let pipes = self.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let pipes = pipes.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(pipes.connect().await?)) }
        }))
    }

    /// A channel to the coordinator whose every RPC `counts` records.
    pub(super) fn counted_channel(&self, endpoint: &Endpoint, counts: &Arc<RpcCounts>) -> Channel {
        let pipes = self.clone();
        let counts = counts.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let (pipes, counts) = (pipes.clone(), counts.clone());
            async move {
                let (client, counter) = tokio::io::duplex(PIPE_BYTES);
                // The counter's own connection onward, made on its first
                // request like the worker's would be.
                let onward = pipes.channel(&Endpoint::from_static("http://coordinator.invalid"));
                tokio::spawn(Counted { onward, counts }.serve(counter));
                Ok::<_, io::Error>(TokioIo::new(client))
            }
        }))
    }
}

/// The Budget methods a worker calls, in the order they are reported.
pub(super) const METHODS: [&str; 5] = ["Lease", "Release", "Report", "Reconsider", "Watch"];

/// RPCs by method and by second since the start of the run.
#[derive(Debug)]
pub(super) struct RpcCounts {
    start: Instant,
    per_second: Mutex<Vec<[u64; METHODS.len() + 1]>>,
}

/// What the counter saw: per second, one count per `METHODS` entry and a
/// last one for any other path.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RpcSeries {
    /// The method names, in the order of each second's counts.
    pub methods: Vec<&'static str>,
    /// Per second since the start: one count per method, then "other".
    pub per_second: Vec<Vec<u64>>,
}

impl RpcCounts {
    pub(super) fn new(start: Instant) -> Self {
        RpcCounts {
            start,
            per_second: Mutex::new(Vec::new()),
        }
    }

    fn count(&self, path: &str) {
        let method = path.rsplit('/').next().unwrap_or("");
        let column = METHODS
            .iter()
            .position(|&m| m == method)
            .unwrap_or(METHODS.len());
        let second = usize::try_from(self.start.elapsed().as_secs()).unwrap_or(usize::MAX);
        let mut per_second = self
            .per_second
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if per_second.len() <= second {
            per_second.resize(second + 1, [0; METHODS.len() + 1]);
        }
        per_second[second][column] += 1;
    }

    /// Everything counted so far.
    pub(super) fn series(&self) -> RpcSeries {
        let per_second = self
            .per_second
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut methods = METHODS.to_vec();
        methods.push("other");
        RpcSeries {
            methods,
            per_second: per_second.iter().map(|s| s.to_vec()).collect(),
        }
    }
}

/// The counting hop in front of the coordinator for one worker connection.
struct Counted {
    onward: Channel,
    counts: Arc<RpcCounts>,
}

impl Counted {
    async fn serve(self, from_worker: DuplexStream) {
        let Counted { onward, counts } = self;
        let service = hyper::service::service_fn(move |request: http::Request<_>| {
            counts.count(request.uri().path());
            let mut onward = onward.clone();
            async move {
                let onward = onward.ready().await?;
                onward.call(request.map(tonic::body::Body::new)).await
            }
        });
        // The connection ends when the worker's side closes; a broken
        // connection shows up at the worker as a failed RPC, which is what
        // the worker would see without the counter.
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(from_worker), service)
            .await;
    }
}
