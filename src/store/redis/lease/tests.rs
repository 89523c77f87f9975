//! A Lease on Redis against the memory store, the oracle: stale counts,
//! fair shares, and the round trips each takes.

use crate::budget::GrantAsk;
use crate::policy::Policy;
use crate::scope::{Priority, RetryClass, ScopeKey};
use crate::store::redis::{RedisOptions, RedisStore, RedisTarget};
use crate::store::{MemoryStore, ReportBatch, Store, Tenant};
use tollgate_testkit::RedisServer;

const T0: i64 = 1_700_000_000_000;

/// One step of a scenario, through replica `via` (the memory store,
/// the oracle, has one).
enum Step {
    Lease {
        via: usize,
        worker: &'static str,
        priority: Priority,
        want: u32,
        at: i64,
        /// `lease.lua` calls the Lease may take at most.
        calls: u64,
    },
    Report {
        via: usize,
        worker: &'static str,
        priority: Priority,
        first_attempts: u32,
        at: i64,
    },
}

async fn fcalls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Runs `steps` on the memory store and on two Redis replicas of one
/// server; every Lease must answer alike on both, within its calls.
async fn alike(route: &str, steps: &[Step]) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(
            RedisStore::connect(
                RedisTarget::parse(&server.url()).expect("url"),
                RedisOptions::default(),
            )
            .await
            .expect("connect"),
        );
    }
    let mut conn = redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let memory = MemoryStore::new(1000);
    let policy = Policy::default();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Report {
                via,
                worker,
                priority,
                first_attempts,
                at,
            } => {
                let key = ScopeKey::new("c", route, priority);
                let batch = ReportBatch {
                    first_attempts,
                    ..ReportBatch::empty(worker, at)
                };
                memory.report(&key, batch, &policy).await.expect("report");
                replicas[via]
                    .report(&key, batch, &policy)
                    .await
                    .expect("report");
            }
            Step::Lease {
                via,
                worker,
                priority,
                want,
                at,
                calls,
            } => {
                let key = ScopeKey::new("c", route, priority);
                let ask = GrantAsk {
                    worker_id: worker,
                    priority,
                    retry_class: RetryClass::Transient,
                    want,
                    now_ms: at,
                    tenant: Tenant::NONE,
                };
                let expected = memory.lease(&key, ask, &policy).await.expect("lease");
                let before = fcalls(&mut conn).await;
                let got = replicas[via]
                    .lease(&key, ask, &policy)
                    .await
                    .expect("lease");
                let made = fcalls(&mut conn).await - before;
                assert_eq!(got.grant, expected.grant, "step {i}");
                assert!(made <= calls, "step {i}: {made} calls");
            }
        }
    }
}

/// A report through another replica raised the first attempts since
/// this one last read them: its limits are too low, and the take they
/// held back is decided again, once, with the count as it is.
#[tokio::test]
async fn more_first_attempts_than_last_read_still_grant_exactly() {
    alike(
        "more",
        &[
            // Replica 0 reads the route: no first attempts, worker "c".
            Step::Report {
                via: 0,
                worker: "c",
                priority: Priority::Critical,
                first_attempts: 0,
                at: T0,
            },
            // Normal reaches its 80 % of the floor's 100 tokens.
            Step::Lease {
                via: 0,
                worker: "n",
                priority: Priority::Normal,
                want: 80,
                at: T0,
                calls: 1,
            },
            // 500 first attempts double the allowance: replica 0 does
            // not know.
            Step::Report {
                via: 1,
                worker: "x",
                priority: Priority::Normal,
                first_attempts: 500,
                at: T0,
            },
            // Critical's 100 with the floor alone would leave 20.
            Step::Lease {
                via: 0,
                worker: "c",
                priority: Priority::Critical,
                want: 100,
                at: T0,
                calls: 2,
            },
            // Now replica 0 knows: the common case, one call.
            Step::Lease {
                via: 0,
                worker: "c",
                priority: Priority::Critical,
                want: 1,
                at: T0,
                calls: 1,
            },
        ],
    )
    .await;
}

/// The first attempts this replica last read slid out of the window:
/// its limits are too high, and the script refuses them rather than
/// grant past the formula.
#[tokio::test]
async fn first_attempts_that_slid_out_are_not_granted_on() {
    alike(
        "slid",
        &[
            Step::Report {
                via: 0,
                worker: "w",
                priority: Priority::Critical,
                first_attempts: 500,
                at: T0,
            },
            Step::Lease {
                via: 0,
                worker: "w",
                priority: Priority::Critical,
                want: 150,
                at: T0,
                calls: 1,
            },
            // Past the 10 s window only the floor's 100 tokens remain,
            // and the 150 leased at T0 slid out with them.
            Step::Lease {
                via: 0,
                worker: "w",
                priority: Priority::Critical,
                want: 150,
                at: T0 + 11_000,
                calls: 3,
            },
            Step::Lease {
                via: 1,
                worker: "v",
                priority: Priority::Critical,
                want: 5,
                at: T0 + 11_000,
                calls: 1,
            },
        ],
    )
    .await;
}

/// A grant past an equal share weighs the fleet as the memory store
/// does, whichever replica each worker asks through.
#[tokio::test]
async fn fair_shares_past_an_equal_share_match_the_memory_store() {
    let mut steps = Vec::new();
    for (i, worker) in ["a", "b", "c"].into_iter().enumerate() {
        steps.push(Step::Report {
            via: i % 2,
            worker,
            priority: Priority::Normal,
            first_attempts: 100,
            at: T0,
        });
    }
    for (i, (worker, want)) in [
        ("a", 10),
        ("b", 40),
        ("a", 30),
        ("c", 5),
        ("b", 40),
        ("c", 50),
    ]
    .into_iter()
    .enumerate()
    {
        steps.push(Step::Lease {
            via: i % 2,
            worker,
            priority: Priority::Normal,
            want,
            at: T0 + 10,
            calls: 4,
        });
    }
    alike("fair", &steps).await;
}
