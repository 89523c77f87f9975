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
