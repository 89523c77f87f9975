//! A Prometheus `/metrics` endpoint for the coordinator's instruments in
//! this test process, and a scrape of it over real HTTP.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::server::metrics_http;
use tollgate::telemetry::{Telemetry, TelemetryConfig};

/// `/metrics` served from this process's meter provider, installed before
/// any coordinator starts (its instruments come from that provider).
pub(crate) struct MetricsEndpoint {
    pub(crate) addr: SocketAddr,
    /// Kept alive until [`MetricsEndpoint::stop`]: dropping it shuts the
    /// meter provider down.
    telemetry: Telemetry,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

impl MetricsEndpoint {
    pub(crate) async fn start() -> MetricsEndpoint {
        let telemetry = Telemetry::new(&TelemetryConfig {
            prometheus: true,
            ..TelemetryConfig::default()
        })
        .expect("telemetry");
        telemetry.install_meter_provider();
        let registry = telemetry.registry().expect("a registry").clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(metrics_http::serve(listener, registry, async {
            let _ = stopped.await;
        }));
        MetricsEndpoint {
            addr,
            telemetry,
            stop,
            server,
        }
    }

    /// Stops serving, checks the server ended cleanly, and shuts the meter
    /// provider down off the runtime (its shutdown blocks).
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.expect("join").expect("metrics server");
        let telemetry = self.telemetry;
        let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
    }
}

/// One scrape of `/metrics` at `addr`: a 200 in the text format; the body.
pub(crate) async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: tollgate\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain"), "{head}");
    body.to_owned()
}
