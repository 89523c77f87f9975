//! A Redis primary behind Sentinel fails over while a coordinator serves
//! on it (`redis+sentinel://…/SERVICE`): calls during the switch are
//! answered UNAVAILABLE within their deadline (workers fall back to their
//! local budget), and once the Sentinel has promoted the replica the same
//! coordinator serves again — no restart, and the runtime policy an SRE set
//! before is still in force. Real `redis-server` processes (a primary, a
//! replica, a Sentinel) started by the test; every wait is a poll under a
//! generous bound.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Coordinator, lease, poll, scope};
use tollgate::config::Config;
use tollgate::store::redis::{RedisClock, RedisOptions, RedisStore, RedisTarget};
use tollgate_proto::v1::{self, Priority};
use tollgate_testkit::RedisServer;
use tonic::Code;

const SERVICE: &str = "tollgate-main";

fn query<T: redis::FromRedisValue>(port: u16, cmd: &mut redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    cmd.query(&mut conn).ok()
}

/// The port the Sentinel names as the primary now.
fn primary_port(sentinel: &RedisServer) -> Option<u16> {
    let (_, port): (String, String) = query(
        sentinel.port(),
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(SERVICE),
    )?;
    port.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_survived_without_a_restart() {
    let Some(mut primary) = RedisServer::start() else {
        return;
    };
    let replica = RedisServer::start_replica_of(&primary).expect("replica");
    let sentinel = RedisServer::start_sentinel(&primary, SERVICE).expect("sentinel");
    poll("the replica in sync", Duration::from_secs(15), || async {
        query::<String>(replica.port(), redis::cmd("INFO").arg("replication"))
            .is_some_and(|info| info.contains("master_link_status:up"))
    })
    .await;
    // The Sentinel learns of replicas from the primary's INFO.
    poll(
        "the Sentinel knows the replica",
        Duration::from_secs(30),
        || async {
            query::<Vec<redis::Value>>(
                sentinel.port(),
                redis::cmd("SENTINEL").arg("replicas").arg(SERVICE),
            )
            .is_some_and(|r| !r.is_empty())
        },
    )
    .await;

    let target = RedisTarget::parse(&format!(
        "redis+sentinel://127.0.0.1:{}/{SERVICE}",
        sentinel.port()
    ))
    .expect("sentinel url");
    let store = RedisStore::connect(target.clone(), RedisOptions::default())
        .await
        .expect("connect");
    // The replicas' clock follows the primary's TIME, through the target.
    let clock = RedisClock::default();
    clock
        .calibrate_primary(&target)
        .await
        .expect("the first primary's TIME");
    let first_primary = target.primary_client().await.expect("the first primary");
    let coordinator = Coordinator::start_with_store(Config::default(), Arc::new(store)).await;
    let mut client = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    let set = admin
        .set_policy(v1::SetPolicyRequest {
            caller_scope: "*".into(),
            route: "GET /x".into(),
            expected_version: 0,
            fields: Some(v1::PolicyFields {
                retry_ratio: Some(0.4),
                ..v1::PolicyFields::default()
            }),
            patch: true,
            reason: "before the failover".into(),
        })
        .await
        .expect("set a runtime policy")
        .into_inner();
    let s = scope("tenant-a", "GET /x", Priority::Normal);
    let before = client
        .lease(lease(s.clone(), "w", 1))
        .await
        .expect("lease on the first primary")
        .into_inner();
    assert_eq!(before.policy_version, set.policy_version);
    // What the SRE set reached the replica before the primary dies.
    poll("the write replicated", Duration::from_secs(10), || async {
        query::<i64>(primary.port(), redis::cmd("WAIT").arg(1).arg(100)).is_some_and(|n| n >= 1)
    })
    .await;

    primary.kill();
    // Until the Sentinel promotes the replica: UNAVAILABLE, inside the
    // deadline (a hang would be DEADLINE_EXCEEDED), then grants again.
    let mut refused = 0;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    let after = loop {
        let mut request = tonic::Request::new(lease(s.clone(), "w", 1));
        request.set_timeout(Duration::from_secs(3));
        match client.lease(request).await {
            Ok(answer) => break answer.into_inner(),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                refused += 1;
            }
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "no failover within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(primary_port(&sentinel), Some(replica.port()), "promoted");
    assert!(refused > 0, "the switch was noticed");
    assert_eq!(
        after.policy_version, set.policy_version,
        "the runtime policy survived the failover"
    );
    // The clock measures the promoted primary now; a client resolved before
    // the failover would only find the dead one.
    assert!(
        clock.calibrate(&first_primary).await.is_err(),
        "the old primary is gone"
    );
    clock
        .calibrate_primary(&target)
        .await
        .expect("the promoted primary's TIME");
    coordinator.stop().await;
}
