//! Floods from one peer address against the real server on loopback, each
//! the attack it reproduces: calls that send their headers and never their
//! message, with no token or to the services that need none, and bad-token
//! guesses sent all at once. The flooding peer is `127.0.0.2`; the tenant
//! it must not deny works from `127.0.0.1` through a real tonic client.

mod support;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{Coordinator, PUSH_BOUND, TENANT_A_TOKEN, lease, scope, with_token};
use tokio::net::TcpSocket;
use tokio::task::JoinSet;
use tollgate_proto::v1::Priority;
use tonic::Code;

/// The flooding peer.
const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// A body that never sends anything and never ends.
type Stalled = StreamBody<tokio_stream::Pending<Result<Frame<Bytes>, Infallible>>>;

/// An HTTP/2 connection from `source` to `addr`, driven in the background.
async fn h2_from(source: IpAddr, addr: SocketAddr) -> SendRequest<Stalled> {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
        .expect("bind source");
    let stream = socket.connect(addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

/// A gRPC call to `path` whose message never comes, with `token` if any.
fn stalled_call(path: &str, token: Option<&str>) -> http::Request<Stalled> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://tollgate{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
        .body(StreamBody::new(tokio_stream::pending()))
        .expect("request")
}

/// The grpc-status of a response: from its headers (trailers-only) or its
/// trailers. `None`: the stream failed without one.
async fn grpc_status(response: http::Response<hyper::body::Incoming>) -> Option<Code> {
    let parse = |v: &http::HeaderValue| {
        v.to_str()
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
            .map(Code::from_i32)
    };
    if let Some(code) = response.headers().get("grpc-status").and_then(parse) {
        return Some(code);
    }
    let collected = response.into_body().collect().await.ok()?;
    collected.trailers()?.get("grpc-status").and_then(parse)
}

/// Sends `calls` stalled calls to `path` over `connections` connections
/// from [`ATTACKER`]; each task ends with the call's status.
async fn flood(
    addr: SocketAddr,
    path: &'static str,
    connections: usize,
    calls: usize,
) -> JoinSet<Option<Code>> {
    let mut set = JoinSet::new();
    for _ in 0..connections {
        let sender = h2_from(ATTACKER, addr).await;
        for _ in 0..calls {
            let mut sender = sender.clone();
            set.spawn(async move {
                sender.ready().await.ok()?;
                let response = sender.send_request(stalled_call(path, None)).await.ok()?;
                grpc_status(response).await
            });
        }
    }
    set
}

/// Twenty Leases of `tenant-a` with its token, from 127.0.0.1.
async fn tenant_leases(coordinator: &Coordinator) -> Vec<Result<(), Code>> {
    let mut client = coordinator.client().await;
    let mut results = Vec::new();
    for i in 0..20 {
        let request = with_token(
            lease(
                scope("tenant-a", "GET /users/{id}", Priority::Normal),
                &format!("w{i}"),
                1,
            ),
            TENANT_A_TOKEN,
        );
        results.push(
            client
                .lease(request)
                .await
                .map(|_| ())
                .map_err(|s| s.code()),
        );
    }
    results
}

/// A server with few request slots, so a flood that took slots would fill
/// them many times over, and a body timeout far below the request timeout.
fn small_server(body_timeout: &str) -> tollgate::config::Config {
    support::config(&format!(
        "[server]\nmax_concurrent_requests = 32\nrequest_timeout = \"60s\"\n\
         body_timeout = \"{body_timeout}\"\nmax_unauthenticated_calls_per_ip = 8\n\
         max_unauthenticated_calls_per_connection = 4\n{}",
        support::POLICY_WITH_TOKENS
    ))
}

#[tokio::test]
async fn a_slow_body_flood_from_one_peer_leaves_a_tenants_leases_served() {
    let coordinator = Coordinator::start(small_server("3s")).await;
    // 400 Leases without a token and 400 health checks, headers only: ten
    // times the server's request slots. Before the gate each held a slot
    // until the request timeout.
    let mut leases = flood(coordinator.addr, "/tollgate.v1.Budget/Lease", 10, 40).await;
    let mut health = flood(coordinator.addr, "/grpc.health.v1.Health/Check", 10, 40).await;
    // Wait until the flood is at the server: the health checks past the
    // peer's bound are refused at once.
    let mut refused_at_once = 0;
    while refused_at_once < 400 - 8 {
        let code = tokio::time::timeout(PUSH_BOUND, health.join_next())
            .await
            .expect("refusals come at once")
            .expect("a call")
            .expect("task");
        assert_eq!(code, Some(Code::ResourceExhausted));
        refused_at_once += 1;
    }
    // The eight health checks the peer may hold are still open, and the
    // Leases without a token are refused or held back; the tenant is served.
    let served = tenant_leases(&coordinator).await;
    assert_eq!(served, vec![Ok(()); 20], "the tenant's Leases are served");
    assert_eq!(health.len(), 8, "one peer holds 8 unauthenticated calls");
    // The held checks end at the body timeout, far before the request
    // timeout (60 s), and free their places.
    while let Some(code) = tokio::time::timeout(PUSH_BOUND, health.join_next())
        .await
        .expect("the body timeout ends them")
    {
        assert_eq!(code.expect("task"), Some(Code::DeadlineExceeded));
    }
    // Every Lease without a token is refused: UNAUTHENTICATED, or unread
    // once the peer has enough refusals waiting.
    while let Some(code) = leases.join_next().await {
        let code = code.expect("task");
        assert!(
            matches!(code, Some(Code::Unauthenticated | Code::ResourceExhausted)),
            "{code:?}"
        );
    }
    coordinator.stop().await;
}

#[tokio::test]
async fn a_tenants_stalled_message_ends_at_the_body_timeout() {
    let coordinator = Coordinator::start(small_server("200ms")).await;
    let mut sender = h2_from(IpAddr::from([127, 0, 0, 1]), coordinator.addr).await;
    sender.ready().await.expect("ready");
    let response = tokio::time::timeout(
        PUSH_BOUND,
        sender.send_request(stalled_call(
            "/tollgate.v1.Budget/Lease",
            Some(TENANT_A_TOKEN),
        )),
    )
    .await
    .expect("answered within the body timeout, not the 60 s request timeout")
    .expect("response");
    assert_eq!(grpc_status(response).await, Some(Code::DeadlineExceeded));
    // The slot is free again: the tenant is served.
    assert_eq!(tenant_leases(&coordinator).await, vec![Ok(()); 20]);
    coordinator.stop().await;
}

/// Two tenants sharing eight request slots (four each by default), whose
/// calls would wait a minute for a message that never comes.
const TWO_TENANTS: &str = r#"
[server]
max_concurrent_requests = 8
request_timeout = "60s"
body_timeout = "60s"

[[token]]
token = "token-of-tenant-a"
caller_scopes = ["tenant-a"]
name = "team-a"

[[token]]
token = "token-of-tenant-b"
caller_scopes = ["tenant-b"]
name = "team-b"
"#;

#[tokio::test]
async fn a_tenants_flood_at_its_own_limit_leaves_another_tenants_leases_served() {
    let coordinator = Coordinator::start(support::config(TWO_TENANTS)).await;
    // Tenant B floods from the same address as A: forty Leases with its
    // valid token, headers only. Before, eight of them held every slot of
    // the server for a minute and A's Leases were shed.
    let sender = h2_from(IpAddr::from([127, 0, 0, 1]), coordinator.addr).await;
    let mut flood = JoinSet::new();
    for _ in 0..40 {
        let mut sender = sender.clone();
        flood.spawn(async move {
            sender.ready().await.ok()?;
            let call = stalled_call("/tollgate.v1.Budget/Lease", Some("token-of-tenant-b"));
            let response = sender.send_request(call).await.ok()?;
            grpc_status(response).await
        });
    }
    // Those past B's four are refused at once, naming the limit.
    for _ in 0..32 {
        let refused = tokio::time::timeout(PUSH_BOUND, flood.join_next())
            .await
            .expect("refusals come at once")
            .expect("a call")
            .expect("task");
        assert_eq!(refused, Some(Code::ResourceExhausted));
    }
    let mut client = coordinator.client().await;
    for i in 0..20 {
        let request = with_token(
            lease(
                scope("tenant-a", "GET /x", Priority::Normal),
                &format!("w{i}"),
                1,
            ),
            "token-of-tenant-a",
        );
        client.lease(request).await.expect("tenant A is served");
    }
    // B's own fresh calls are what its limit refuses, with its name.
    let mut b = coordinator.client().await;
    let refused = b
        .lease(with_token(
            lease(scope("tenant-b", "GET /x", Priority::Normal), "w", 1),
            "token-of-tenant-b",
        ))
        .await
        .expect_err("b is at its limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("team-b")
            && refused.message().contains("max_concurrent_requests"),
        "{refused:?}"
    );
    flood.abort_all();
    coordinator.stop().await;
}

#[tokio::test]
async fn bad_token_guesses_from_one_peer_are_answered_at_a_bounded_rate() {
    let coordinator = Coordinator::start(small_server("1s")).await;
    // A thousand guesses at once from one peer: only the first few have
    // their token checked and answered UNAUTHENTICATED within a second;
    // the rest are refused unread. Before, 744 of them were answered
    // UNAUTHENTICATED at once.
    let channel = coordinator.channel_from(ATTACKER).await;
    let started = tokio::time::Instant::now();
    let mut guesses = JoinSet::new();
    for i in 0..1000 {
        let mut client = tollgate_proto::v1::budget_client::BudgetClient::new(channel.clone());
        guesses.spawn(async move {
            let request = with_token(
                lease(scope("tenant-a", "GET /x", Priority::Normal), "w", 1),
                &format!("guess-{i:08}"),
            );
            let status = client.lease(request).await.expect_err("a guess fails");
            (status.code(), started.elapsed())
        });
    }
    let mut checked_within_a_second = 0;
    let mut unread = 0;
    while let Some(result) = guesses.join_next().await {
        let (code, after) = result.expect("task");
        match code {
            Code::Unauthenticated if after < Duration::from_secs(1) => checked_within_a_second += 1,
            Code::Unauthenticated => {}
            Code::ResourceExhausted => unread += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // The first refusal is free and the next sixteen are held: a guesser
    // learns some seventeen answers in its first second, not thousands.
    assert!(
        checked_within_a_second <= 2 * tollgate::auth::throttle::MAX_HELD_PER_PEER,
        "{checked_within_a_second} guesses answered within a second"
    );
    assert!(unread > 900, "{unread} refused unread");
    // The tenant, from another address, is not slowed down.
    assert_eq!(tenant_leases(&coordinator).await, vec![Ok(()); 20]);
    coordinator.stop().await;
}

/// Probe listener limits low enough to fill from a test: 64 connections
/// per listener, 32 per peer address.
const PROBE_LIMITS: &str = "probe_max_connections = 64\nprobe_max_connections_per_ip = 32\n";

/// A coordinator with `/metrics` and the plaintext health listener on
/// loopback, `[server]` keys `server` added to the tenant policy.
async fn with_probe_listeners(server: &str) -> (Coordinator, SocketAddr, SocketAddr) {
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind metrics");
    let health = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind health");
    let (metrics_at, health_at) = (
        metrics.local_addr().expect("addr"),
        health.local_addr().expect("addr"),
    );
    let config = support::config(&format!(
        "[server]\n{server}\n{}",
        support::POLICY_WITH_TOKENS
    ));
    let mut setup = tollgate::server::Setup::new(config);
    setup.metrics = Some(tollgate::server::MetricsListener {
        listener: metrics,
        registry: prometheus::Registry::new(),
    });
    setup.health_listener = Some(health);
    let clock = std::sync::Arc::new(tollgate_client::clock::ManualClock::new(
        tollgate_client::clock::from_unix_ms(support::T0),
    ));
    let coordinator = Coordinator::start_setup(setup, clock).await;
    (coordinator, metrics_at, health_at)
}

/// Opens `n` connections from [`ATTACKER`] to `addr` and holds them; each
/// task ends when the server closes its connection.
async fn hold_connections(addr: SocketAddr, n: usize) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for _ in 0..n {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(ATTACKER, 0))
            .expect("bind source");
        let mut stream = socket.connect(addr).await.expect("connect");
        set.spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 256];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        });
    }
    set
}

/// Waits until `count` of `held` have been closed by the server.
async fn closed(held: &mut JoinSet<()>, count: usize, what: &str) {
    for _ in 0..count {
        tokio::time::timeout(PUSH_BOUND, held.join_next())
            .await
            .unwrap_or_else(|_| panic!("{what}: the server closes what is past the cap"))
            .expect("a connection")
            .expect("task");
    }
}

/// `GET /metrics` from 127.0.0.1: the status code.
async fn scrape(addr: SocketAddr) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: tollgate\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("response");
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn held_connections_to_the_probe_listeners_leave_the_grpc_port_serving() {
    let (coordinator, metrics, health) = with_probe_listeners(PROBE_LIMITS).await;
    // 300 connections held on each probe listener from one peer: all but
    // the 32 a peer may hold are closed at once. Before, every one stayed
    // open, and 20 000 of them ran the process out of file descriptors.
    let mut on_metrics = hold_connections(metrics, 300).await;
    let mut on_health = hold_connections(health, 300).await;
    closed(&mut on_metrics, 300 - 32, "metrics").await;
    closed(&mut on_health, 300 - 32, "health").await;
    assert_eq!((on_metrics.len(), on_health.len()), (32, 32));
    // The gRPC port serves the tenant; the probes still answer others.
    assert_eq!(tenant_leases(&coordinator).await, vec![Ok(()); 20]);
    assert_eq!(scrape(metrics).await, 200);
    let channel = tonic::transport::Channel::from_shared(format!("http://{health}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect to the health listener");
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health answers");
    coordinator.stop().await;
}

#[tokio::test]
async fn a_probe_connection_that_never_finishes_its_headers_is_closed() {
    let (coordinator, metrics, health) = with_probe_listeners(&format!(
        "{PROBE_LIMITS}probe_header_timeout = \"200ms\"\nprobe_idle_timeout = \"1h\""
    ))
    .await;
    use tokio::io::AsyncWriteExt;
    let mut on_metrics = hold_connections(metrics, 1).await;
    let mut on_health = hold_connections(health, 1).await;
    // Half a request line on one, nothing at all on the other: both are
    // closed at the header timeout although the idle timeout is an hour.
    let mut partial = tokio::net::TcpStream::connect(metrics)
        .await
        .expect("connect");
    partial.write_all(b"GET /metr").await.expect("write");
    closed(&mut on_metrics, 1, "metrics, nothing sent").await;
    closed(&mut on_health, 1, "health, nothing sent").await;
    let mut rest = Vec::new();
    // Closed or reset, either way ended (hyper may first answer 408).
    let _ = tokio::time::timeout(PUSH_BOUND, async {
        use tokio::io::AsyncReadExt;
        partial.read_to_end(&mut rest).await
    })
    .await
    .expect("half a request is closed at the header timeout");
    coordinator.stop().await;
}

#[tokio::test]
async fn metrics_off_loopback_need_tls_or_consent() {
    let config = |extra: &str| {
        support::config(&format!(
            "[server]\n{extra}\n{}",
            support::POLICY_WITH_TOKENS
        ))
    };
    let setup = |config| async {
        let mut setup = tollgate::server::Setup::new(config);
        setup.metrics = Some(tollgate::server::MetricsListener {
            listener: tokio::net::TcpListener::bind("0.0.0.0:0")
                .await
                .expect("bind metrics"),
            registry: prometheus::Registry::new(),
        });
        setup
    };
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let refused = tollgate::server::run_tcp(grpc, std::future::pending(), setup(config("")).await)
        .await
        .expect_err("plaintext /metrics off loopback is refused");
    assert!(
        matches!(refused, tollgate::server::ServeError::PlaintextMetrics(_)),
        "{refused}"
    );
    // With consent it serves (scraped here through loopback).
    let mut consented = setup(config("allow_plaintext_metrics = true")).await;
    let port = consented
        .metrics
        .as_ref()
        .expect("metrics")
        .listener
        .local_addr()
        .expect("addr")
        .port();
    consented = consented.clock(std::sync::Arc::new(
        tollgate_client::clock::ManualClock::new(tollgate_client::clock::from_unix_ms(support::T0)),
    ));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (stop, task) = support::tcp::spawn_setup(grpc, consented);
    let metrics = SocketAddr::from(([127, 0, 0, 1], port));
    support::poll("the consented /metrics answers", PUSH_BOUND, || async {
        tokio::time::timeout(Duration::from_secs(1), scrape(metrics))
            .await
            .is_ok_and(|code| code == 200)
    })
    .await;
    let _ = stop.send(());
    task.await.expect("join").expect("served");
}
