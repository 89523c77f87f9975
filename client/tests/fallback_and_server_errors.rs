//! Two behaviours users depend on, end to end through `Tollgate::connect`
//! and a real `Gate`, on paused tokio time:
//!
//! - a non-repeatable operation that gets a 5xx (503 included: a gateway's
//!   503 can follow an upstream that acted) is not sent again;
//! - with the coordinator unreachable, a fresh worker's first retry is
//!   admitted by the local fallback budget, not refused by an adaptive
//!   throttle that has seen one refusal and nothing else;
//! - with the coordinator unreachable, a backlog held through a cooldown is
//!   let go at the worker's own pace after it, not all in its first second;
//! - a degraded worker calls the coordinator once per probe interval (a
//!   lease), not at every report tick, and holds its pending report.
//!
//! The coordinator is a connector that refuses every connection, driven by
//! tokio itself, so paused time only jumps when nothing can make progress.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tollgate_client::{
    Backoff, GateConfig, GateIntent, IntentPolicy, Jitter, LeaseCacheConfig, LinkState,
    Observation, Outcome, Repetition, Reply, Scope, TokenSource, TokioClock, Tollgate,
};
use tonic::transport::Endpoint;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn policy() -> IntentPolicy {
    let backoff = Backoff {
        base: ms(100),
        cap: ms(1_000),
        jitter: Jitter::None,
    };
    IntentPolicy::try_new(ms(10_000), 3, ms(500), ms(10), backoff, None).expect("policy")
}

/// A worker whose coordinator refuses every connection; `seed` fixes its
/// fallback draws, so each worker in a fleet draws differently.
fn unreachable_worker(seed: u64) -> Tollgate {
    unreachable_worker_with(seed, LeaseCacheConfig::default())
}

fn unreachable_worker_with(seed: u64, lease: LeaseCacheConfig) -> Tollgate {
    counted_unreachable_worker(seed, lease, Arc::new(AtomicU32::new(0)))
}

/// As [`unreachable_worker_with`], counting every connection attempt (each
/// RPC on the refused channel makes one) in `dials`.
fn counted_unreachable_worker(
    seed: u64,
    lease: LeaseCacheConfig,
    dials: Arc<AtomicU32>,
) -> Tollgate {
    let channel = Endpoint::from_static("http://coordinator.invalid").connect_with_connector_lazy(
        tower::service_fn(move |_| {
            dials.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<TokioIo<DuplexStream>, _>(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                ))
            }
        }),
    );
    Tollgate::connect("http://coordinator.invalid", format!("worker-{seed}"))
        .channel(channel)
        .clock(Arc::new(TokioClock::new(SystemTime::UNIX_EPOCH)))
        .lease_config(LeaseCacheConfig {
            seed: Some(seed),
            ..lease
        })
        .gate_config(GateConfig {
            seed: Some(seed),
            ..GateConfig::default()
        })
        .build()
        .expect("worker")
}

/// Runs one intent against replies given by status, counting attempts.
async fn run_statuses(
    tollgate: &Tollgate,
    repetition: Repetition,
    statuses: &[u16],
) -> (Outcome, u32, Vec<TokenSource>) {
    let calls = Arc::new(AtomicU32::new(0));
    let intent = GateIntent::new("intent-1", Scope::new("tenant-a", "POST /orders"), policy())
        .repetition(repetition);
    let result = tollgate
        .gate()
        .run(intent, |attempt| {
            let calls = calls.clone();
            let status = statuses[(attempt.number as usize - 1).min(statuses.len() - 1)];
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Reply::new(Observation::http(status, None), status)
            }
        })
        .await;
    let tokens = result.attempts.iter().map(|a| a.token.clone()).collect();
    (result.outcome, calls.load(Ordering::SeqCst), tokens)
}

#[tokio::test(start_paused = true)]
async fn a_non_repeatable_intent_is_not_resent_after_a_5xx() {
    let tollgate = unreachable_worker(1);
    for status in [500, 502, 503, 504] {
        let (outcome, calls, _) =
            run_statuses(&tollgate, Repetition::NonRepeatable, &[status, 200]).await;
        assert_eq!(outcome, Outcome::Indeterminate, "{status}");
        assert_eq!(calls, 1, "{status}: sent once");
    }
}

#[tokio::test(start_paused = true)]
async fn a_repeat_safe_intent_is_retried_after_a_503() {
    let tollgate = unreachable_worker(2);
    let (outcome, calls, _) = run_statuses(&tollgate, Repetition::Safe, &[503, 200]).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(calls, 2);
}

#[tokio::test(start_paused = true)]
async fn fresh_workers_first_retries_are_not_throttled_without_a_coordinator() {
    // Each worker is fresh: one 429 is all its throttle has seen. The
    // fallback floor allows one retry per second per scope, so every
    // first retry must be admitted; with the throttle deciding on a single
    // sample, about half of them were refused.
    for seed in 0..40 {
        let tollgate = unreachable_worker(seed);
        let (outcome, calls, tokens) = run_statuses(&tollgate, Repetition::Safe, &[429, 200]).await;
        assert_eq!(outcome, Outcome::Succeeded, "worker {seed}");
        assert_eq!(calls, 2, "worker {seed}");
        assert_eq!(
            tokens,
            [TokenSource::FirstAttempt, TokenSource::Fallback],
            "worker {seed}"
        );
        assert_eq!(tollgate.link_state(), LinkState::Degraded);
    }
}

#[tokio::test(start_paused = true)]
async fn idle_workers_first_retries_are_not_throttled_either() {
    let workers: Vec<Tollgate> = (100..120).map(unreachable_worker).collect();
    // A burst of refusals on each: more than enough answers for the
    // throttle to judge by (its window fills; some retries may be refused).
    for tollgate in &workers {
        for _ in 0..5 {
            run_statuses(tollgate, Repetition::Safe, &[429, 429, 429]).await;
        }
    }
    // Idle past the throttle's window: the burst has aged out, and the next
    // refusal alone is not a window of traffic.
    tokio::time::advance(Duration::from_secs(600)).await;
    for (n, tollgate) in workers.iter().enumerate() {
        let (outcome, calls, tokens) = run_statuses(tollgate, Repetition::Safe, &[429, 200]).await;
        assert_eq!(outcome, Outcome::Succeeded, "worker {n}");
        assert_eq!(calls, 2, "worker {n}");
        assert_eq!(tokens, [TokenSource::FirstAttempt, TokenSource::Fallback]);
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_coordinator_a_backlog_held_through_a_cooldown_is_paced_after_it() {
    // A local budget that admits every retry here, so what spreads the
    // backlog is the pace alone.
    let tollgate = unreachable_worker_with(
        7,
        LeaseCacheConfig {
            fallback_ratio: 10.0,
            ..LeaseCacheConfig::default()
        },
    );
    let scope = Scope::new("tenant-a", "GET /items");
    let start = tokio::time::Instant::now();
    // The upstream serves this worker 80 first attempts in its first second.
    for n in 0..80 {
        let intent = GateIntent::new(format!("served-{n}"), scope.clone(), policy());
        let result = tollgate
            .gate()
            .run(intent, |_| async {
                Reply::new(Observation::http(200, None), ())
            })
            .await;
        assert_eq!(result.outcome, Outcome::Succeeded);
    }
    tokio::time::sleep_until(start + ms(1_100)).await;
    // Then it refuses 60 with `Retry-After: 2`; the worker holds all of
    // them, and every retry after the cooldown succeeds.
    const BACKLOG: usize = 60;
    let retried_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..BACKLOG)
        .map(|n| {
            let gate = tollgate.gate().clone();
            let intent = GateIntent::new(format!("held-{n}"), scope.clone(), policy());
            let retried_at = retried_at.clone();
            tokio::spawn(async move {
                gate.run(intent, |attempt| {
                    let retried_at = retried_at.clone();
                    async move {
                        if attempt.number == 1 {
                            return Reply::new(Observation::http(429, Some("2")), ());
                        }
                        retried_at
                            .lock()
                            .expect("times")
                            .push(tokio::time::Instant::now());
                        Reply::new(Observation::http(200, None), ())
                    }
                })
                .await
            })
        })
        .collect();
    for task in tasks {
        let result = task.await.expect("intent task");
        assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    }
    let cooldown_end = start + ms(3_100);
    let retried_at = retried_at.lock().expect("times").clone();
    assert_eq!(retried_at.len(), BACKLOG);
    assert!(
        retried_at.iter().all(|at| *at >= cooldown_end),
        "none before the hint"
    );
    // Unpaced, the local spread (1 s) would send all 60 in the first second.
    // Paced, the first second climbs from the floor by an eighth of the 80
    // served: about 7 go, then about 21, then the rest.
    let in_first_second = retried_at
        .iter()
        .filter(|at| **at < cooldown_end + ms(1_000))
        .count();
    assert!(
        (3..=12).contains(&in_first_second),
        "{in_first_second} of {BACKLOG} retried in the cooldown's first second"
    );
    let last = retried_at
        .iter()
        .max()
        .expect("retried")
        .duration_since(cooldown_end);
    assert!(
        last < ms(4_000),
        "the backlog drained {last:?} after the cooldown"
    );
}

#[tokio::test(start_paused = true)]
async fn a_degraded_worker_calls_once_per_probe_interval() {
    let dials = Arc::new(AtomicU32::new(0));
    let tollgate = counted_unreachable_worker(3, LeaseCacheConfig::default(), dials.clone());
    // One intent leaves a report pending (a first attempt, a 429 and its
    // evidence) and takes the link to degraded.
    let (outcome, _, _) = run_statuses(&tollgate, Repetition::Safe, &[429, 200]).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(tollgate.link_state(), LinkState::Degraded);
    let before = dials.load(Ordering::SeqCst);
    // Ten seconds of report ticks (100 ms): at every tick that would be a
    // hundred reports; the probe's lease once per interval (1 s) is ten.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = dials.load(Ordering::SeqCst) - before;
    assert!(
        (5..=15).contains(&calls),
        "{calls} coordinator calls in 10 s degraded"
    );
}
