//! The gate under the coordinator's learned pacing, against the real
//! coordinator on paused time (see `support::pipes`): intents told to ask
//! again, first attempts held inside a known cooldown, the rejection count
//! in reports, and the refund of retries that succeeded on a leased token.
//!
//! The worker's gate talks to the coordinator through a recording proxy
//! (a `Budget` service forwarding every call to the real one), so a test can
//! see what crossed the wire as well as what the coordinator made of it.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Upstream, http, serve_budget};
use support::pipes::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::clock::{Clock, TokioClock, to_unix_ms};
use tollgate_client::engine::IntentPolicy;
use tollgate_client::gate::{Gate, GateConfig, GateIntent, TokenSource};
use tollgate_client::lease::LeaseCache;
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::outcome::Outcome;
use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::budget_server::Budget;
use tollgate_proto::v1::{
    Evidence, GetScopeRequest, LeaseRequest, LeaseResponse, Priority, ReconsiderDecision,
    ReconsiderRequest, ReconsiderResponse, ReleaseRequest, ReleaseResponse, ReportRequest,
    ReportResponse, ScopeEvent, StatedField, StatedLimit, WatchRequest,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What crossed the wire between the worker and the coordinator.
#[derive(Default)]
struct Wire {
    /// Each `Report`: when it arrived (Unix ms) and what it said.
    reports: Vec<(i64, ReportRequest)>,
    releases: Vec<(ReleaseRequest, ReleaseResponse)>,
    /// Each `Reconsider`: when it arrived (Unix ms) and the answer.
    reconsiders: Vec<(i64, ReconsiderResponse)>,
    /// Each `Reconsider`'s kind: `(first_attempt, arriving)`.
    asks: Vec<(bool, bool)>,
    /// Each `Reconsider`'s `attempt_reserve_ms`.
    reserves: Vec<u64>,
}

/// Forwards every `Budget` call to the real coordinator and keeps a copy.
#[derive(Clone)]
struct Recorder {
    coordinator: BudgetClient<Channel>,
    clock: Arc<TokioClock>,
    wire: Arc<Mutex<Wire>>,
    /// Names every slot for a held first attempt a millisecond before the
    /// instant it asked from: a slot at that instant, as a Unix
    /// millisecond rounded down can name it.
    slots_before_asked: bool,
    /// How many more `Reconsider`s for a held first attempt are to fail
    /// (unavailable), each wait then decided alone.
    held_asks_to_fail: Arc<AtomicU32>,
    /// How long each `Lease` takes: a token's round trip.
    lease_delay: Duration,
}

#[tonic::async_trait]
impl Budget for Recorder {
    async fn lease(&self, r: Request<LeaseRequest>) -> Result<Response<LeaseResponse>, Status> {
        tokio::time::sleep(self.lease_delay).await;
        self.coordinator
            .clone()
            .lease(Request::new(r.into_inner()))
            .await
    }
    async fn release(
        &self,
        r: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let request = r.into_inner();
        let answer = self
            .coordinator
            .clone()
            .release(Request::new(request.clone()))
            .await?;
        let reply = *answer.get_ref();
        self.wire.lock().unwrap().releases.push((request, reply));
        Ok(answer)
    }
    async fn report(&self, r: Request<ReportRequest>) -> Result<Response<ReportResponse>, Status> {
        let request = r.into_inner();
        let at = to_unix_ms(self.clock.now());
        self.wire
            .lock()
            .unwrap()
            .reports
            .push((at, request.clone()));
        self.coordinator.clone().report(Request::new(request)).await
    }
    async fn reconsider(
        &self,
        r: Request<ReconsiderRequest>,
    ) -> Result<Response<ReconsiderResponse>, Status> {
        let asked_at = to_unix_ms(self.clock.now());
        let request = r.into_inner();
        let kind = (request.first_attempt, request.arriving);
        let reserve = request.attempt_reserve_ms;
        let not_before = request.not_before_unix_ms;
        if kind.0
            && self
                .held_asks_to_fail
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(Status::unavailable("a held ask scripted to fail"));
        }
        let mut answer = self
            .coordinator
            .clone()
            .reconsider(Request::new(request))
            .await?;
        if self.slots_before_asked
            && kind.0
            && answer.get_ref().decision() == ReconsiderDecision::Slot
        {
            answer.get_mut().slot_unix_ms = not_before - 1;
        }
        let reply = *answer.get_ref();
        let mut wire = self.wire.lock().unwrap();
        wire.reconsiders.push((asked_at, reply));
        wire.asks.push(kind);
        wire.reserves.push(reserve);
        Ok(answer)
    }
    type WatchStream = tonic::Streaming<ScopeEvent>;
    async fn watch(&self, r: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.coordinator
            .clone()
            .watch(Request::new(r.into_inner()))
            .await
    }
}

/// The real coordinator (configured by `toml`) and a worker's gate that
/// reaches it through a [`Recorder`].
struct Recorded {
    h: Harness,
    gate: Gate,
    wire: Arc<Mutex<Wire>>,
}

fn recorded(toml: &str, gate_config: GateConfig) -> Recorded {
    recorded_with(toml, gate_config, 0, false, Duration::ZERO)
}

/// [`recorded`], with the [`Recorder`] failing the first
/// `held_asks_to_fail` asks for held first attempts, naming slots early if
/// `slots_before_asked`, and taking `lease_delay` over each `Lease`.
fn recorded_with(
    toml: &str,
    gate_config: GateConfig,
    held_asks_to_fail: u32,
    slots_before_asked: bool,
    lease_delay: Duration,
) -> Recorded {
    let held_asks_to_fail = Arc::new(AtomicU32::new(held_asks_to_fail));
    let h = harness_on(config(toml), gate_config.clone());
    let wire = Arc::new(Mutex::new(Wire::default()));
    let proxy = serve_budget(Recorder {
        coordinator: h.coordinator.client(),
        clock: h.clock.clone(),
        wire: wire.clone(),
        slots_before_asked,
        held_asks_to_fail,
        lease_delay,
    });
    let mut link = LinkConfig::new("http://coordinator.invalid", "worker-paced");
    link.rpc_timeout = RPC_TIMEOUT;
    let link = CoordinatorLink::with_channel(proxy, &link).unwrap();
    let gate = support::gate(link, h.clock.clone(), 13, gate_config);
    Recorded { h, gate, wire }
}

/// One worker's hint is enough for a fleet cooldown here, so a single gate
/// can start one.
const ONE_WORKER_COOLDOWNS: &str = r#"
[server]
rng_seed = 7

[defaults]
corroborate_workers = 1
"#;

fn intent(id: &str, policy: IntentPolicy) -> GateIntent {
    GateIntent::new(id, scope(), policy)
}

/// 60 s end to end, 3 attempts, 5 s each.
fn roomy() -> IntentPolicy {
    policy(secs(60), 3, secs(5), None)
}

#[tokio::test(start_paused = true)]
async fn told_to_ask_again_it_asks_at_that_instant_then_goes_at_its_slot() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    // Far beyond the coordinator's one-second horizon: no slot yet.
    let upstream = Upstream::new(vec![http(429, Some("20")), http(200, None)]);
    let result = r
        .gate
        .run(intent("i-ask", roomy()), upstream.attempt())
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    assert_eq!(upstream.calls(), 2, "no attempt at an ask-again instant");

    let wait = result.attempts[0].wait.clone().unwrap();
    assert!(!wait.degraded);
    assert_eq!(wait.reevaluations, 0, "asking again is not a policy change");
    let wire = r.wire.lock().unwrap();
    let asked = wire
        .reconsiders
        .iter()
        .filter(|(_, a)| a.decision() == ReconsiderDecision::AskAgain)
        .count();
    assert!(asked >= 1, "the coordinator said to ask again");
    assert_eq!(wait.asked_again as usize, asked, "each one is evidence");
    // The delay halves toward the wait: a handful of calls, not a poll.
    assert!(asked <= 10, "{asked} calls for a 20 s wait");
    // Each call after an ask-again came at the instant named, not before,
    // and not later than a scheduler tick after it.
    for pair in wire.reconsiders.windows(2) {
        let ((_, told), (next, _)) = (&pair[0], &pair[1]);
        if told.decision() == ReconsiderDecision::AskAgain {
            assert!(*next >= told.ask_again_unix_ms, "asked early: {pair:?}");
            assert!(*next <= told.ask_again_unix_ms + 20, "asked late: {pair:?}");
        }
    }
    let (_, last) = wire.reconsiders.last().unwrap();
    assert_eq!(last.decision(), ReconsiderDecision::Slot);

    // Then the retry goes at its slot: after the 20 s hint, at the slot.
    let slot = wait.slot.expect("a slot in the end");
    assert!(slot >= secs(20), "{slot:?}");
    let start = result.attempts[1].record.start;
    assert!(
        start >= slot && start <= slot + ms(20),
        "{start:?} vs {slot:?}"
    );
    assert!(matches!(
        result.attempts[1].token,
        TokenSource::Leased { .. }
    ));
}

/// A slot is fitted to the deadline by the reserve the worker asks with;
/// the worker checks the deadline again when its attempt really starts. A
/// start that came late (here, by a token's round trip) is asked for from
/// then on, so the coordinator gives no slot at an edge the worker could
/// not make.
#[tokio::test(start_paused = true)]
async fn a_start_that_came_late_after_its_slot_is_asked_for_with_the_next_slot() {
    let late = ms(30);
    let r = recorded_with(ONE_WORKER_COOLDOWNS, gate_config(), 0, false, late);
    for id in ["i-late-1", "i-late-2"] {
        let upstream = Upstream::new(vec![http(429, Some("1")), http(200, None)]);
        let result = r.gate.run(intent(id, roomy()), upstream.attempt()).await;
        assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
        if id == "i-late-1" {
            let slot = result.attempts[0].wait.clone().unwrap().slot.unwrap();
            let start = result.attempts[1].record.start;
            assert!(start >= slot + late, "{start:?} vs {slot:?}");
        }
    }
    let reserves = r.wire.lock().unwrap().reserves.clone();
    let cap = 5_000;
    assert_eq!(reserves.first(), Some(&cap), "nothing came late yet");
    let last = *reserves.last().unwrap();
    // The timer wheel's millisecond may add one, and the reserve is
    // rounded up.
    assert!(
        (cap + 30..=cap + 32).contains(&last),
        "asked with the lateness seen: {reserves:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelled_while_told_to_ask_again_it_ends_with_no_further_attempt() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    let upstream = Upstream::new(vec![http(429, Some("20")), http(200, None)]);
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(3)).await;
        canceller.cancel();
    });
    let began = Instant::now();
    let result = r
        .gate
        .run(
            intent("i-ask-cancel", roomy()).cancel_token(cancel),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Cancelled);
    assert_eq!(upstream.calls(), 1, "no attempt after cancellation");
    assert!(began.elapsed() < secs(4), "ended at the cancellation");
    let wait = result.attempts[0].wait.clone().unwrap();
    assert!(wait.asked_again >= 1, "{wait:?}");
    assert_eq!(wait.slot, None, "it never got as far as a slot");

    // Nothing asks on its behalf after it ended.
    let calls = r.wire.lock().unwrap().reconsiders.len();
    tokio::time::sleep(secs(30)).await;
    assert_eq!(r.wire.lock().unwrap().reconsiders.len(), calls);
}

/// A first intent meets a 429 with `Retry-After: retry_after` (one attempt
/// only, so it ends there); once its report is in, the worker knows the
/// scope's cooldown and that first attempts should wait it out. Returns the
/// instant the cooldown ends.
async fn cooldown_from_a_429(r: &Recorded, retry_after: &str) -> Instant {
    let result = r
        .gate
        .run(
            intent("i-first-429", policy(secs(60), 1, secs(5), None)),
            Upstream::new(vec![http(429, Some(retry_after))]).attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::AttemptCap);
    support::poll("the worker learns the cooldown", secs(5), || async {
        let view = r.gate.cache().view(&scope());
        view.cooldown_until.is_some() && view.hold_first_attempts
    })
    .await;
    let until = r.gate.cache().view(&scope()).cooldown_until.unwrap();
    Instant::now() + until.duration_since(r.h.clock.now()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_inside_a_known_cooldown_is_held_until_its_slot() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    let cooldown_ends = cooldown_from_a_429(&r, "10").await;

    let upstream = Upstream::new(vec![http(200, None)]);
    let began = Instant::now();
    let result = r
        .gate
        .run(intent("i-held", roomy()), upstream.attempt())
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    let starts = upstream.starts();
    assert_eq!(starts.len(), 1);
    assert!(
        starts[0] >= cooldown_ends,
        "the upstream saw no attempt during the cooldown"
    );
    let first = &result.attempts[0];
    assert_eq!(first.record.number, 1, "still the first attempt");
    assert_eq!(first.token, TokenSource::FirstAttempt, "no retry token");
    let held = result.held.clone().expect("the hold is evidence");
    assert_eq!(held.cooldown, Some(cooldown_ends - began));
    let slot = held.slot.expect("it went at the coordinator's slot");
    assert!(slot >= cooldown_ends - began);
    assert!(first.record.start >= slot && first.record.start <= slot + ms(20));
    assert!(!held.degraded);
    // Its first ask says it arrived, so the coordinator counts it once
    // among the first attempts arriving; any later ask does not.
    let asks = r.wire.lock().unwrap().asks.clone();
    assert_eq!(asks.first(), Some(&(true, true)), "{asks:?}");
    assert!(asks[1..].iter().all(|&a| a == (true, false)), "{asks:?}");

    // It still counts as a first attempt for the fleet's budget.
    r.gate.cache().flush().await;
    let firsts: u32 = r
        .wire
        .lock()
        .unwrap()
        .reports
        .iter()
        .map(|(_, report)| report.first_attempts)
        .sum();
    assert_eq!(firsts, 2);
}

/// A slot named just before the instant a held first attempt asked from
/// (the coordinator floors it there, and a Unix millisecond rounded down
/// names a moment before) does not start it earlier: the engine holds it
/// until that instant, and a start before it ended the intent
/// `indeterminate` ("woke at 3.318665943s, before next_start
/// 3.318829962s", in the chaos fleet's SIGKILL storm, where a worker
/// paced alone asked again as its coordinator came back).
#[tokio::test(start_paused = true)]
async fn a_slot_named_before_the_instant_asked_from_starts_at_that_instant() {
    let r = recorded_with(ONE_WORKER_COOLDOWNS, gate_config(), 2, true, Duration::ZERO);
    let cooldown_ends = cooldown_from_a_429(&r, "10").await;

    // Two intents held in the cooldown, their first asks failing: each
    // decides alone, and the worker's own pace lets only one go at the
    // cooldown's end. The other asks the coordinator from the instant its
    // pace names, still ahead, and is given a slot named a millisecond
    // before it.
    let upstream = Upstream::new(vec![http(200, None), http(200, None)]);
    let began = Instant::now();
    let (a, b) = tokio::join!(
        r.gate.run(intent("i-held-a", roomy()), upstream.attempt()),
        r.gate.run(intent("i-held-b", roomy()), upstream.attempt()),
    );
    for result in [&a, &b] {
        assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    }
    let paced = [&a, &b]
        .into_iter()
        .find(|result| {
            result
                .held
                .as_ref()
                .is_some_and(|held| held.paced_alone > 0)
        })
        .expect("one intent waited for the worker's own pace");
    let held = paced.held.clone().unwrap();
    let slot = held.slot.expect("then asked the coordinator");
    let start = paced.attempts[0].record.start;
    assert!(began + start >= cooldown_ends);
    assert!(start > slot, "{start:?} at the slot named early, {slot:?}");
}

/// `n` first attempts served, one every 50 ms: a worker's steady traffic.
async fn served_steadily(cache: &LeaseCache, n: u32) {
    for _ in 0..n {
        cache.record_first_attempt(&scope());
        cache.record_success(&scope());
        tokio::time::sleep(ms(50)).await;
    }
}

/// Counts alone change nothing before the coordinator's one-second pacing
/// window closes: a worker with steady traffic sends them about once a
/// second, each report spanning at most a window (so pacing takes it
/// whole), while a rejection goes at the next tick.
#[tokio::test(start_paused = true)]
async fn counts_alone_go_once_a_window_and_a_rejection_at_the_next_tick() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    let cache = r.gate.cache();
    // Ten seconds of a first attempt and its success every 50 ms.
    served_steadily(cache, 200).await;
    let quiet = r.wire.lock().unwrap().reports.clone();
    assert!(
        (9..=11).contains(&quiet.len()),
        "{} reports in 10 s of counts",
        quiet.len()
    );
    assert!(
        quiet
            .iter()
            .all(|(_, report)| report.counts_age_ms <= 1_000),
        "every report spans at most a window"
    );

    // A refusal with a hint: sent at the next tick, with the counts since.
    let refused = to_unix_ms(r.h.clock.now());
    cache.record_evidence(
        &scope(),
        Evidence {
            http_status: 429,
            has_retry_after: true,
            retry_after: "1".into(),
            receipt_unix_ms: refused,
            ..Evidence::default()
        },
    );
    support::poll("the rejection is reported", secs(1), || async {
        r.wire.lock().unwrap().reports.len() > quiet.len()
    })
    .await;
    let (at, report) = r.wire.lock().unwrap().reports.last().cloned().unwrap();
    assert!(
        at - refused <= 100,
        "sent {} ms after the refusal",
        at - refused
    );
    assert_eq!(report.rejections, 1);

    // Nothing counted is lost on the way.
    cache.flush().await;
    let wire = r.wire.lock().unwrap();
    let firsts: u32 = wire.reports.iter().map(|(_, r)| r.first_attempts).sum();
    assert_eq!(firsts, 200);
}

/// Counts a worker holds for a calm route's window go at its next tick once
/// the route stops being calm: another worker's refusal begins a
/// measurement a few ticks long, which must count what this worker served
/// too, not find its counts a window later.
#[tokio::test(start_paused = true)]
async fn held_counts_go_at_the_next_tick_when_another_workers_refusal_ends_the_calm() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    let cache = r.gate.cache();
    // A calm second: one report (the first goes at once), then counts wait,
    // and the Watch stream opens on the scope.
    served_steadily(cache, 20).await;
    support::poll("the route is calm", secs(2), || async {
        !r.gate.cache().view(&scope()).counts_hold.is_zero()
    })
    .await;
    // Into a window, so its last tick is far off, with counts held.
    let window_ms = 1_000;
    let into = to_unix_ms(r.h.clock.now()).rem_euclid(window_ms);
    tokio::time::sleep(ms(u64::try_from(window_ms - into).unwrap() + 100)).await;
    for _ in 0..3 {
        cache.record_first_attempt(&scope());
        cache.record_success(&scope());
    }
    let before = r.wire.lock().unwrap().reports.len();
    // Another worker is refused without a hint: pacing leaves steady.
    let refused = to_unix_ms(r.h.clock.now());
    let mut coordinator = r.h.coordinator.client();
    coordinator
        .report(ReportRequest {
            scope: Some(scope().to_wire()),
            worker_id: "worker-refused".into(),
            first_attempts: 10,
            successes: 5,
            rejections: 5,
            ..ReportRequest::default()
        })
        .await
        .unwrap();
    support::poll("the held counts are sent", secs(2), || async {
        r.wire.lock().unwrap().reports.len() > before
    })
    .await;
    let (at, report) = r.wire.lock().unwrap().reports[before].clone();
    assert_eq!(report.successes, 3, "{report:?}");
    assert!(
        at - refused <= 250,
        "sent {} ms after the route stopped being calm; its window ends {} ms after it",
        at - refused,
        window_ms - (refused.rem_euclid(window_ms))
    );
}

/// One intent served at once: the worker has a view of the scope, and
/// watches it.
async fn warmed(r: &Recorded) {
    let warm = r
        .gate
        .run(
            intent("i-warm", roomy()),
            Upstream::new(vec![http(200, None)]).attempt(),
        )
        .await;
    assert_eq!(warm.outcome, Outcome::Succeeded);
}

/// The fleet's first attempts alone overflow the upstream: the coordinator
/// paces them with everything else, and a worker told so holds a first
/// attempt for a slot with no cooldown in force.
#[tokio::test(start_paused = true)]
async fn a_first_attempt_is_held_for_a_slot_while_the_route_is_saturated() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    warmed(&r).await;
    // The rest of the fleet: 100 first attempts a second, all served;
    // then the upstream refuses, and refuses again 400 ms later having
    // served 20 in between: it serves 50/s, half what first attempts ask.
    let fleet = |first_attempts, successes, rejections| ReportRequest {
        scope: Some(scope().to_wire()),
        worker_id: "worker-fleet".into(),
        first_attempts,
        successes,
        rejections,
        ..ReportRequest::default()
    };
    let mut coordinator = r.h.coordinator.client();
    coordinator.report(fleet(100, 100, 0)).await.unwrap();
    tokio::time::sleep(secs(1)).await;
    coordinator.report(fleet(50, 50, 10)).await.unwrap();
    tokio::time::sleep(ms(400)).await;
    coordinator.report(fleet(40, 20, 30)).await.unwrap();
    support::poll(
        "the worker is told to hold first attempts",
        secs(5),
        || async {
            let view = r.gate.cache().view(&scope());
            view.hold_first_attempts && view.cooldown_until.is_none()
        },
    )
    .await;
    // The worker's own report answered "calm" before (counts may wait a
    // window); the hold came by Watch, which says nothing of counts: they
    // go at once until an answer says they may wait under it.
    assert!(
        r.gate.cache().view(&scope()).counts_hold.is_zero(),
        "a hold heard of from Watch lets no count wait"
    );

    let upstream = Upstream::new(vec![http(200, None)]);
    let result = r
        .gate
        .run(intent("i-paced", roomy()), upstream.attempt())
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    let first = &result.attempts[0];
    assert_eq!(first.record.number, 1, "still the first attempt");
    assert_eq!(first.token, TokenSource::FirstAttempt, "no retry token");
    let held = result.held.clone().expect("the hold is evidence");
    assert_eq!(held.cooldown, None, "held with no cooldown in force");
    let slot = held.slot.expect("it went at the coordinator's slot");
    assert!(first.record.start >= slot && first.record.start <= slot + ms(20));
    assert_eq!(r.wire.lock().unwrap().reconsiders.len(), 1, "one ask");
    assert_eq!(
        r.wire.lock().unwrap().asks,
        [(true, true)],
        "a first attempt's first ask, as it arrived"
    );
}

/// `worker`'s report of one second: `first` first attempts, all served,
/// each answer stating 100 requests a second, all left.
fn stating(worker: &str, first: u32, now_ms: i64) -> ReportRequest {
    let field = |name: &str, value: &str| StatedField {
        name: name.into(),
        value: value.into(),
        truncated: false,
    };
    ReportRequest {
        scope: Some(scope().to_wire()),
        worker_id: worker.into(),
        first_attempts: first,
        successes: first,
        stated_limit: Some(StatedLimit {
            fields: vec![
                field("x-ratelimit-limit", "100, 100;w=1"),
                field("x-ratelimit-remaining", "100"),
                field("x-ratelimit-reset", "1"),
            ],
            receipt_unix_ms: now_ms,
            http_status: 200,
        }),
        ..ReportRequest::default()
    }
}

/// Saturated at a stated pace, an intent far back in the queue is told to
/// ask again at the instant its turn was estimated at. When the intents
/// ahead of it go (here, their deadlines pass) the quota's slots go unused:
/// the next slot given at the idle cursor calls back the earliest deadlines
/// still waiting, by a Watch event, and the worker's intent asks at once,
/// not at its instant.
#[tokio::test(start_paused = true)]
async fn told_to_ask_again_it_is_called_back_when_a_stated_quota_goes_unused() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    warmed(&r).await;
    // Three other workers send 102 first attempts a second to an upstream
    // that states 100, and keep doing so: every attempt waits for a slot.
    let coordinator = r.h.coordinator.client();
    let clock = r.h.clock.clone();
    let fleet = {
        let mut coordinator = coordinator.clone();
        tokio::spawn(async move {
            loop {
                let now = to_unix_ms(clock.now());
                for w in ["worker-1", "worker-2", "worker-3"] {
                    coordinator.report(stating(w, 34, now)).await.unwrap();
                }
                tokio::time::sleep(secs(1)).await;
            }
        })
    };
    support::poll(
        "the route is saturated at the stated pace",
        secs(30),
        || async { r.gate.cache().view(&scope()).hold_first_attempts },
    )
    .await;
    // On a whole second (the fleet's reports come on them), other intents
    // book the horizon, then 300 more with deadlines 1.5 s away queue
    // ahead of this worker's.
    let whole = 1000 - to_unix_ms(r.h.clock.now()).rem_euclid(1000);
    tokio::time::sleep(ms(u64::try_from(whole).unwrap() + 10)).await;
    let start = to_unix_ms(r.h.clock.now());
    let other = |id: String, deadline_unix_ms| ReconsiderRequest {
        scope: Some(scope().to_wire()),
        worker_id: "worker-1".into(),
        intent_id: id,
        deadline_unix_ms,
        attempt_reserve_ms: 100,
        ..ReconsiderRequest::default()
    };
    let mut direct = coordinator.clone();
    let mut filled = 0;
    while direct
        .reconsider(other(format!("fill-{filled}"), start + 60_000))
        .await
        .unwrap()
        .get_ref()
        .decision()
        == ReconsiderDecision::Slot
    {
        filled += 1;
    }
    for i in 0..300 {
        let told = direct
            .reconsider(other(format!("ahead-{i}"), start + 1_500))
            .await;
        assert_eq!(
            told.unwrap().get_ref().decision(),
            ReconsiderDecision::AskAgain
        );
    }
    // A held first attempt with a 200 ms attempt cap: the 300 are ahead.
    let upstream = Upstream::new(vec![http(200, None)]);
    let gate = r.gate.clone();
    let quick = policy(secs(60), 3, ms(200), None);
    let run = tokio::spawn(async move {
        gate.run(intent("i-called", quick), upstream.attempt())
            .await
    });
    support::poll("the intent is told to ask again", secs(5), || async {
        r.wire
            .lock()
            .unwrap()
            .reconsiders
            .iter()
            .any(|(_, a)| a.decision() == ReconsiderDecision::AskAgain)
    })
    .await;
    let (told_at, told) = *r
        .wire
        .lock()
        .unwrap()
        .reconsiders
        .iter()
        .find(|(_, a)| a.decision() == ReconsiderDecision::AskAgain)
        .unwrap();
    assert!(
        told.ask_again_unix_ms > start + 2_000,
        "far back in the queue: {told:?}"
    );
    // Their deadlines pass; half a second into the next window another
    // intent asks at the idle cursor and is given a slot.
    let called_at = start + 1_500;
    tokio::time::sleep(ms(
        u64::try_from(called_at - to_unix_ms(r.h.clock.now())).unwrap()
    ))
    .await;
    let late = direct
        .reconsider(other("late".into(), start + 60_000))
        .await;
    assert_eq!(late.unwrap().get_ref().decision(), ReconsiderDecision::Slot);
    let result = run.await.unwrap();
    fleet.abort();
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    let wire = r.wire.lock().unwrap();
    let (asked, answer) = *wire
        .reconsiders
        .iter()
        .find(|(at, _)| *at > told_at)
        .unwrap();
    assert!(
        asked >= called_at && asked < called_at + 50,
        "asked when called back ({called_at}), not at {}: {asked}",
        told.ask_again_unix_ms
    );
    assert_eq!(answer.decision(), ReconsiderDecision::Slot, "{answer:?}");
    let held = result.held.clone().expect("held");
    assert_eq!(held.slot.map(|_| ()), Some(()), "it went at its slot");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_before_the_cooldown_ends_is_infeasible_with_no_attempt() {
    let r = recorded(ONE_WORKER_COOLDOWNS, gate_config());
    cooldown_from_a_429(&r, "10").await;

    let upstream = Upstream::new(vec![http(200, None)]);
    let began = Instant::now();
    let result = r
        .gate
        .run(
            intent("i-too-short", policy(secs(5), 3, secs(1), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::DeadlineInfeasible);
    assert_eq!(upstream.calls(), 0, "no attempt at all");
    assert!(result.attempts.is_empty());
    assert!(result.held.is_some(), "the hold is evidence");
    assert!(began.elapsed() < secs(1), "decided now, not after a wait");
}

#[tokio::test(start_paused = true)]
async fn rejections_are_counted_in_the_report_past_the_evidence_limit() {
    let r = recorded(
        ONE_WORKER_COOLDOWNS,
        GateConfig {
            max_in_flight: 256,
            ..gate_config()
        },
    );
    // A hundred intents refused for capacity together, one attempt each:
    // more than the 64 evidence items a report carries.
    let upstream = Upstream::new(vec![http(429, None)]);
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (gate, upstream) = (r.gate.clone(), upstream.clone());
        runs.spawn(async move {
            let policy = policy(secs(60), 1, secs(5), None);
            gate.run(
                intent(&format!("i-refused-{i}"), policy),
                upstream.attempt(),
            )
            .await
        });
    }
    while let Some(result) = runs.join_next().await {
        assert_eq!(result.unwrap().outcome, Outcome::AttemptCap);
    }
    r.gate.cache().flush().await;

    let wire = r.wire.lock().unwrap();
    let rejections: u32 = wire.reports.iter().map(|(_, r)| r.rejections).sum();
    assert_eq!(rejections, 100, "every refusal is counted");
    assert!(wire.reports.iter().all(|(_, r)| r.evidence.len() <= 64));
    assert!(
        wire.reports
            .iter()
            .any(|(_, r)| r.rejections as usize > r.evidence.len()),
        "the count went past the evidence kept"
    );
}

/// A budget of one retry token a window, all for normal work, on leases
/// that expire after two seconds.
const ONE_TOKEN: &str = r#"
[server]
rng_seed = 7

[defaults]
max_retries_per_window = 1
shares = { critical = 0.0, normal = 1.0, bulk = 0.0 }
lease_ttl = "2s"

[[admin_token]]
name = "oncall"
token = "sre-token-for-tests"
"#;

#[tokio::test(start_paused = true)]
async fn a_retry_that_succeeded_on_a_leased_token_is_refunded_at_release() {
    let r = recorded(ONE_TOKEN, gate_config());
    // A 502 then a success: the retry spends the lease's only token.
    let upstream = Upstream::new(vec![http(502, None), http(200, None)]);
    let result = r
        .gate
        .run(intent("i-refund", roomy()), upstream.attempt())
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    let TokenSource::Leased { lease_id } = result.attempts[1].token.clone() else {
        panic!("the retry spent a leased token: {result:?}");
    };
    // The lease is released before it expires, claiming the refund.
    support::poll("the spent lease is released", secs(5), || async {
        !r.wire.lock().unwrap().releases.is_empty()
    })
    .await;
    let (release, reply) = r.wire.lock().unwrap().releases[0].clone();
    assert_eq!(release.lease_id, *lease_id);
    // One token granted, one spent: the lease was fully spent, and is
    // released all the same.
    assert_eq!(release.spent, 1);
    assert_eq!(release.retry_successes, 1);
    assert_eq!(reply.returned, 1, "granted − spent + retry_successes");

    // The coordinator credited the token back to the scope's budget.
    let state =
        r.h.coordinator
            .admin()
            .get_scope(with_token(
                GetScopeRequest {
                    caller_scope: "tenant-a".into(),
                    route: "POST /orders".into(),
                },
                "sre-token-for-tests",
            ))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(state.leases_outstanding, 0);
    let normal = state
        .classes
        .iter()
        .find(|c| c.priority() == Priority::Normal)
        .unwrap();
    assert!(normal.spent.abs() < 1e-9, "{normal:?}");
}
