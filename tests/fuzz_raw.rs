//! Arbitrary bytes as the request body of every Budget and Admin method,
//! through the real HTTP/2 server on loopback: a well-framed gRPC message of
//! random bytes (what the protobuf decoder sees), a frame whose declared
//! length or compression flag lies, or no framing at all. Every call is
//! answered with a gRPC status, and a canary scope owned by another caller
//! token keeps its exact state. The harness is `tests/support/fuzz.rs`;
//! 64 cases by default, `TOLLGATE_FUZZ_CASES=N` for N.

mod support;

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt as _;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tonic::Code;
use tower::Service as _;

use support::Coordinator;
use support::fuzz::*;

const METHODS: &[&str] = &[
    "/tollgate.v1.Budget/Lease",
    "/tollgate.v1.Budget/Release",
    "/tollgate.v1.Budget/Report",
    "/tollgate.v1.Budget/Reconsider",
    "/tollgate.v1.Budget/Watch",
    "/tollgate.v1.Admin/ListPolicies",
    "/tollgate.v1.Admin/GetPolicy",
    "/tollgate.v1.Admin/SetPolicy",
    "/tollgate.v1.Admin/DeletePolicy",
    "/tollgate.v1.Admin/ApplyPolicies",
    "/tollgate.v1.Admin/DiffPolicies",
    "/tollgate.v1.Admin/ListScopes",
    "/tollgate.v1.Admin/GetScope",
    "/tollgate.v1.Admin/FreezeScope",
    "/tollgate.v1.Admin/UnfreezeScope",
    "/tollgate.v1.Admin/ResetScope",
    "/tollgate.v1.Admin/ListAudit",
];

/// A request body: one well-framed message of arbitrary bytes (what a
/// protobuf decoder sees), a frame whose declared length or compression
/// flag lies, or bytes with no framing at all.
fn raw_body() -> impl Strategy<Value = Bytes> {
    let payload = prop::collection::vec(any::<u8>(), 0..2048);
    prop_oneof![
        3 => payload.clone().prop_map(|p| frame(0, p.len() as u32, &p)),
        1 => (any::<u8>(), any::<u32>(), payload.clone()).prop_map(|(flag, len, p)| frame(flag, len, &p)),
        1 => payload.prop_map(Bytes::from),
    ]
}

fn frame(flag: u8, declared_len: u32, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + payload.len());
    buf.put_u8(flag);
    buf.put_u32(declared_len);
    buf.put_slice(payload);
    buf.freeze()
}

/// One raw HTTP/2 gRPC call; the gRPC status it was answered with, or
/// `None` when a Watch stream stayed open (an answer too).
async fn raw_call(
    channel: &mut tonic::transport::Channel,
    path: &str,
    body: Bytes,
) -> Result<Option<Code>, TestCaseError> {
    let token = if path.contains("Admin") {
        ADMIN_TOKEN
    } else {
        FUZZ_TOKEN
    };
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://tollgate{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(tonic::body::Body::new(http_body_util::Full::new(body)))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| TestCaseError::fail(format!("{path}: channel: {e}")))?;
    let response = channel
        .call(request)
        .await
        .map_err(|e| TestCaseError::fail(format!("{path}: no response: {e}")))?;
    prop_assert_eq!(response.status(), http::StatusCode::OK, "{}", path);
    let (parts, body) = response.into_parts();
    if let Some(code) = parts.headers.get("grpc-status") {
        // Trailers-only: the status came with the headers.
        return Ok(Some(parse_code(path, code)?));
    }
    match tokio::time::timeout(Duration::from_secs(2), body.collect()).await {
        Err(_) if path.ends_with("/Watch") => Ok(None),
        Err(_) => Err(TestCaseError::fail(format!("{path}: no status"))),
        Ok(Err(e)) => Err(TestCaseError::fail(format!("{path}: body failed: {e}"))),
        Ok(Ok(collected)) => {
            let trailers = collected
                .trailers()
                .cloned()
                .ok_or_else(|| TestCaseError::fail(format!("{path}: no trailers")))?;
            let code = trailers
                .get("grpc-status")
                .ok_or_else(|| TestCaseError::fail(format!("{path}: no grpc-status")))?;
            Ok(Some(parse_code(path, code)?))
        }
    }
}

fn parse_code(path: &str, value: &http::HeaderValue) -> Result<Code, TestCaseError> {
    let n: i32 = value
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TestCaseError::fail(format!("{path}: grpc-status {value:?}")))?;
    let code = Code::from_i32(n);
    // tonic answers a malformed frame or message itself (INTERNAL for a
    // body it cannot decode, UNIMPLEMENTED for compression it does not
    // speak); a handler never does, so anything else is a handler's answer.
    prop_assert!(
        code != Code::Unknown && code != Code::Unavailable,
        "{}: {:?}",
        path,
        code
    );
    Ok(code)
}

/// Arbitrary bytes as the body of every method, through the real HTTP/2
/// server: every call is answered with a gRPC status, and the canary's
/// state is exactly as it was.
#[test]
fn raw_bytes_to_every_method_are_answered_and_keep_the_canary() {
    let rt = runtime();
    let (coordinator, canary) = rt.block_on(async {
        let coordinator = Coordinator::start(support::config(POLICY)).await;
        let canary = plant_canary(&coordinator).await;
        (coordinator, scope_state_only(canary))
    });
    let channel = rt.block_on(coordinator.channel());
    let calls = prop::collection::vec((prop::sample::select(METHODS), raw_body()), 1..6);
    runner()
        .run(&calls, |calls| {
            let mut channel = channel.clone();
            rt.block_on(async {
                for (path, body) in calls {
                    raw_call(&mut channel, path, body).await?;
                }
                let now = scope_state_only(canary_state(&coordinator).await);
                prop_assert_eq!(&now, &canary);
                Ok(())
            })
        })
        .expect("the property holds");
    rt.block_on(coordinator.stop());
}
