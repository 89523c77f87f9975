//! The exhaustion limits, each against the real server on loopback:
//! connections per peer, HTTP/2 streams and header list, message size per
//! service, the idle timeout, Watch streams per token, repeated bad tokens.

mod support;

use support::{Coordinator, PUSH_BOUND, TENANT_A_TOKEN, config, lease, poll, scope, with_token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_proto::v1::{self, Priority};
use tonic::Code;
use tonic::transport::Channel;

fn with_server_keys(keys: &str, rest: &str) -> tollgate::config::Config {
    config(&format!("[server]\n{keys}\n{rest}"))
}

async fn health(channel: Channel) -> Result<(), tonic::Status> {
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .map(|_| ())
}

#[tokio::test]
async fn connections_per_peer_are_capped_and_freed_on_close() {
    let coordinator = Coordinator::start(with_server_keys("max_connections_per_ip = 2", "")).await;
    let first = coordinator.channel().await;
    let second = coordinator.channel().await;
    health(first.clone()).await.expect("first");
    health(second.clone()).await.expect("second");
    // The third connection from 127.0.0.1 is closed on accept: its
    // HTTP/2 preface gets not one byte back (no SETTINGS), only the close
    // (a reset, when the preface arrived before the close).
    let mut third = TcpStream::connect(coordinator.addr).await.expect("connect");
    let _ = third
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(PUSH_BOUND, third.read_to_end(&mut answer))
        .await
        .expect("the third connection is closed");
    match read {
        Ok(0) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a third connection is refused: {other:?} {answer:?}"),
    }
    drop(third);
    drop(first);
    poll(
        "a freed connection slot is reusable",
        PUSH_BOUND,
        || async {
            match Channel::from_shared(format!("http://{}", coordinator.addr))
                .expect("uri")
                .connect()
                .await
            {
                Ok(channel) => health(channel).await.is_ok(),
                Err(_) => false,
            }
        },
    )
    .await;
    coordinator.stop().await;
}

/// The server's first SETTINGS frame, as (identifier, value) pairs.
async fn server_settings(stream: &mut TcpStream) -> Vec<(u16, u32)> {
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("preface");
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.expect("frame header");
    assert_eq!(header[3], 0x4, "the server speaks first with SETTINGS");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.expect("payload");
    payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

#[tokio::test]
async fn streams_and_header_lists_are_bounded_per_connection() {
    let coordinator = Coordinator::start(with_server_keys(
        "max_concurrent_streams = 7\nmax_header_list_size = \"8KiB\"",
        "",
    ))
    .await;
    let mut raw = TcpStream::connect(coordinator.addr).await.expect("connect");
    let settings = server_settings(&mut raw).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS (3) and SETTINGS_MAX_HEADER_LIST_SIZE (6).
    assert!(settings.contains(&(0x3, 7)), "{settings:?}");
    assert!(settings.contains(&(0x6, 8192)), "{settings:?}");
    // A peer that never answers GOAWAY would hold the drain for its grace
    // period.
    drop(raw);

    let mut client = coordinator.client().await;
    let mut request = tonic::Request::new(lease(scope("a", "GET /x", Priority::Normal), "w", 1));
    let big = "x".repeat(16 * 1024);
    request
        .metadata_mut()
        .insert("x-padding", big.parse().expect("ascii"));
    // Refused by the server's HTTP/2 layer before any handler: HTTP 431
    // (Request Header Fields Too Large), no gRPC status.
    let refused = client
        .lease(request)
        .await
        .expect_err("an oversized header list is refused");
    assert_eq!(refused.code(), Code::Unknown, "{refused:?}");
    assert!(
        refused.message().contains("HTTP status code 431"),
        "{refused:?}"
    );
    let mut client = coordinator.client().await;
    client
        .lease(lease(scope("a", "GET /x", Priority::Normal), "w", 1))
        .await
        .expect("the server still serves");
    coordinator.stop().await;
}

#[tokio::test]
async fn message_size_is_capped_per_service() {
    let coordinator =
        Coordinator::start(with_server_keys("max_budget_message = \"4KiB\"", "")).await;
    let mut client = coordinator.client().await;
    let mut big = lease(scope("a", "GET /x", Priority::Normal), "w", 1);
    big.worker_id = "w".repeat(8 * 1024);
    let status = client.lease(big).await.expect_err("too large");
    // tonic's decoder refuses a message over the service's limit before
    // the handler sees it, naming the limit.
    assert_eq!(status.code(), Code::OutOfRange, "{status}");
    assert!(
        status.message().contains("the limit is: 4096 bytes"),
        "{status}"
    );
    // Admin has its own, larger limit: a policy file of 8 KiB is read (and
    // judged on its content, not refused for its size).
    let mut admin = coordinator.admin().await;
    let toml = format!(
        "# {}\n[defaults]\nretry_ratio = 0.1\n",
        "p".repeat(8 * 1024)
    );
    let apply = v1::ApplyPoliciesRequest {
        toml,
        dry_run: true,
        ..Default::default()
    };
    let answer = admin
        .apply_policies(apply)
        .await
        .expect("an 8 KiB policy file is read")
        .into_inner();
    // Judged on its content: the dry run shows the one change it makes.
    assert!(!answer.applied, "{answer:?}");
    assert_eq!(
        answer.changes,
        [v1::PolicyChange {
            target: "[defaults]".into(),
            kind: v1::PolicyChangeKind::Changed.into(),
            fields: vec![v1::FieldChange {
                field: "retry_ratio".into(),
                before: "0.2".into(),
                after: "0.1".into(),
            }],
        }],
        "{answer:?}"
    );
    coordinator.stop().await;
}

/// Waits (under the suite's push bound) until the server closes `raw`,
/// reading whatever it sends first; panics if it never does.
async fn until_closed(raw: &mut TcpStream, what: &str) {
    let closed = tokio::time::timeout(PUSH_BOUND, async {
        let mut buf = [0u8; 256];
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{what}");
}

#[tokio::test]
async fn idle_connections_are_closed_but_a_watch_keeps_its_connection() {
    let coordinator = Coordinator::start(with_server_keys("idle_timeout = \"300ms\"", "")).await;
    let mut raw = TcpStream::connect(coordinator.addr).await.expect("connect");
    server_settings(&mut raw).await;
    until_closed(&mut raw, "an idle connection is closed").await;

    // A Watch stream is a call in flight: its connection outlives the
    // timeout and still delivers events. An idle connection opened after
    // the Watch's is the clock: once the server has closed it, the Watch's
    // connection has gone without a request for longer than the timeout.
    let mut client = coordinator.client().await;
    let watched = scope("a", "GET /x", Priority::Normal);
    let (mut stream, _) = support::watch(&mut client, &watched, "w").await;
    let mut younger = TcpStream::connect(coordinator.addr).await.expect("connect");
    server_settings(&mut younger).await;
    until_closed(
        &mut younger,
        "a connection opened after the Watch's is closed",
    )
    .await;
    let mut other = coordinator.client().await;
    other
        .report(support::rate_limited(
            watched,
            "w2",
            "30",
            v1::ScopeCertainty::Known,
        ))
        .await
        .expect("report");
    support::next_event(&mut stream, "the cooldown, past the idle timeout").await;
    coordinator.stop().await;
}

#[tokio::test]
async fn watch_streams_are_capped_per_token() {
    let coordinator = Coordinator::start(with_server_keys(
        "max_watch_streams_per_token = 2",
        support::TENANT_A_TOKEN_TOML,
    ))
    .await;
    let mut client = coordinator.client().await;
    let request = || v1::WatchRequest {
        scopes: vec![scope("tenant-a", "GET /x", Priority::Normal).expect("scope")],
        worker_id: "w".into(),
    };
    let first = client
        .watch(with_token(request(), TENANT_A_TOKEN))
        .await
        .expect("1");
    let _second = client
        .watch(with_token(request(), TENANT_A_TOKEN))
        .await
        .expect("2");
    let refused = client
        .watch(with_token(request(), TENANT_A_TOKEN))
        .await
        .expect_err("over the cap");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_watch_streams_per_token"),
        "{refused}"
    );
    drop(first);
    poll("a closed stream frees its place", PUSH_BOUND, || {
        let mut client = client.clone();
        async move {
            client
                .watch(with_token(request(), TENANT_A_TOKEN))
                .await
                .is_ok()
        }
    })
    .await;
    coordinator.stop().await;
}

#[tokio::test]
async fn repeated_bad_tokens_stay_unauthenticated_on_every_service() {
    let coordinator = Coordinator::start(config(support::POLICY_WITH_TOKENS)).await;
    let mut budget = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    for _ in 0..3 {
        let status = budget
            .lease(with_token(
                lease(scope("tenant-a", "GET /x", Priority::Normal), "w", 1),
                "not-a-token",
            ))
            .await
            .expect_err("unknown token");
        assert_eq!(status.code(), Code::Unauthenticated);
        let status = admin
            .list_policies(v1::ListPoliciesRequest {})
            .await
            .expect_err("no token");
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    coordinator.stop().await;
}
