//! Chaos with every party a real process: an upstream stand-in
//! (`tollgate-bench upstream`), a fleet of worker processes (`tollgate-bench worker`,
//! each its own `TollgateLayer` and coordinator link) and `tollgate serve`.
//! The upstream goes fully out for a few seconds; during that storm the
//! coordinator is SIGKILLed and restarted (one run), or SIGSTOPped for 5 s
//! and SIGCONTed (another). What is checked is what the upstream saw: its
//! busiest second after the outage against its capacity, and no attempt
//! after its intent's deadline; and that every worker fell back to its
//! local budget within one RPC timeout and kept sending.
//!
//! The busiest second is counted as the storm benchmark counts it, in whole
//! seconds of the upstream's clock. The busiest 1 s sliding in 100 ms steps
//! is printed too: it reads 1.08–1.16 × C in the no-fault control as well as
//! under the faults (slow start's overshoot at C = 200, the coordinator's or
//! the workers' local pacer's, `docs/pacing.md`), so it measures the
//! pacing, not what a fault adds.

#[path = "../../tests/support/process.rs"]
mod process;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::time::Instant;

use process::{Front, Served};

/// The upstream and worker processes.
const BENCH: &str = env!("CARGO_BIN_EXE_tollgate-bench");

/// Upstream capacity C, requests/s.
const CAPACITY: f64 = 200.0;
/// Worker processes, each starting `RATE` intents/s: λ = 0.8 × C, the
/// storm benchmark's default load.
const WORKERS: usize = 8;
const RATE: f64 = 20.0;
/// The full outage, from the upstream's start.
const OUTAGE_START: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(4);
/// When the coordinator is hit: one second into the outage.
const FAULT_AT: Duration = Duration::from_secs(5);
/// How long intents keep starting, and each one's deadline.
const INTENTS_FOR: Duration = Duration::from_secs(14);
const DEADLINE: Duration = Duration::from_secs(6);
/// The workers' coordinator RPC timeout.
const RPC_TIMEOUT: Duration = Duration::from_millis(500);
/// The bound on the upstream's load in any whole second after the outage,
/// × C.
const PEAK_BOUND: f64 = 1.1;

/// A port for the upstream stand-in, bound and released: `tollgate-bench
/// upstream` (bench/src) does not log the port it binds, so it cannot be
/// given port 0 as `tollgate serve` is. Another process may take the port
/// in between; the upstream then fails to start and the test says so.
fn upstream_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A child process writing JSON lines to a file; killed if still running
/// when dropped (a failed assertion must not leave a fleet behind).
struct Lines {
    child: Child,
    out: PathBuf,
}

impl Lines {
    fn spawn(args: &[String], out: PathBuf) -> Lines {
        let file = std::fs::File::create(&out).expect("output file");
        let log = std::fs::File::create(out.with_extension("log")).expect("log file");
        let child = Command::new(BENCH)
            .args(args)
            .stdout(file)
            .stderr(log)
            .spawn()
            .expect("spawn tollgate-bench");
        Lines { child, out }
    }

    /// Waits (bounded) for the process to exit on its own; its lines.
    async fn finish(mut self, bound: Duration) -> Vec<Value> {
        let give_up = Instant::now() + bound;
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(
                Instant::now() < give_up,
                "{} still running",
                self.out.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        read_lines(&self.out)
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// One storm: the upstream and the fleet started; `fault` is run against
/// the coordinator at `FAULT_AT` and says when it struck (Unix ms).
struct Storm {
    upstream: Lines,
    workers: Vec<Lines>,
    started: Instant,
}

impl Storm {
    async fn start(dir: &Path, name: &str, coordinator: &str) -> Storm {
        let port = upstream_port();
        let upstream_for = INTENTS_FOR + DEADLINE + Duration::from_secs(2);
        let upstream = Lines::spawn(
            &[
                "upstream".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--capacity".into(),
                CAPACITY.to_string(),
                "--outage-start-s".into(),
                OUTAGE_START.as_secs_f64().to_string(),
                "--outage-s".into(),
                OUTAGE.as_secs_f64().to_string(),
                "--duration".into(),
                format!("{}ms", upstream_for.as_millis()),
            ],
            dir.join(format!("{name}-upstream.jsonl")),
        );
        let bound = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < bound, "the upstream never listened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The upstream's clock started a few ms before it listened: close
        // enough for faults scheduled in whole seconds.
        let started = Instant::now();
        let workers = (0..WORKERS)
            .map(|i| {
                Lines::spawn(
                    &[
                        "worker".into(),
                        "--coordinator".into(),
                        coordinator.into(),
                        "--upstream".into(),
                        format!("127.0.0.1:{port}"),
                        "--worker-id".into(),
                        format!("{name}-worker-{i}"),
                        "--rate".into(),
                        RATE.to_string(),
                        "--duration".into(),
                        format!("{}ms", INTENTS_FOR.as_millis()),
                        "--deadline".into(),
                        format!("{}ms", DEADLINE.as_millis()),
                        "--rpc-timeout".into(),
                        format!("{}ms", RPC_TIMEOUT.as_millis()),
                    ],
                    dir.join(format!("{name}-worker-{i}.jsonl")),
                )
            })
            .collect();
        Storm {
            upstream,
            workers,
            started,
        }
    }

    async fn at(&self, offset: Duration) {
        tokio::time::sleep_until(self.started + offset).await;
    }

    async fn finish(self) -> Measured {
        let mut workers = Vec::new();
        for worker in self.workers {
            workers.push(worker.finish(DEADLINE * 4).await);
        }
        let upstream = self.upstream.finish(Duration::from_secs(30)).await;
        Measured { upstream, workers }
    }
}

struct Measured {
    upstream: Vec<Value>,
    workers: Vec<Vec<Value>>,
}

impl Measured {
    fn seconds(&self) -> Vec<&Value> {
        self.upstream
            .iter()
            .filter(|l| l.get("second").is_some())
            .collect()
    }

    fn summary(&self) -> &Value {
        self.upstream
            .iter()
            .find(|l| l.get("summary").is_some())
            .expect("the upstream's summary")
    }

    /// The busiest 1 s after the outage over C: windows aligned to the
    /// upstream's seconds (the storm benchmark's definition, checked against
    /// the bound), and sliding in 100 ms steps (printed). Each with where it
    /// starts, in seconds.
    fn peaks_after_outage(&self) -> ((f64, f64), (f64, f64)) {
        let from = OUTAGE_START + OUTAGE;
        let buckets: Vec<u64> = self
            .seconds()
            .iter()
            .flat_map(|s| {
                s["offered_per_100ms"]
                    .as_array()
                    .expect("buckets")
                    .iter()
                    .map(|n| n.as_u64().expect("a count"))
                    .collect::<Vec<_>>()
            })
            .collect();
        let first = (from.as_millis() / 100) as usize;
        let best = |step: usize| {
            (first..buckets.len().saturating_sub(9))
                .step_by(step)
                .map(|i| {
                    (
                        buckets[i..i + 10].iter().sum::<u64>() as f64 / CAPACITY,
                        i as f64 / 10.0,
                    )
                })
                .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
        };
        (best(10), best(1))
    }

    fn per_second(&self, field: &str) -> Vec<u64> {
        self.seconds()
            .iter()
            .map(|s| s[field].as_u64().expect("a count"))
            .collect()
    }

    /// Per worker, how long after `fault` its link first went degraded.
    fn fallback_after(&self, fault: i64) -> Vec<Option<i64>> {
        self.link_changes("degraded", fault)
    }

    /// Per worker, how long after `back` its link first was connected again.
    fn reconnected_after(&self, back: i64) -> Vec<Option<i64>> {
        self.link_changes("connected", back)
    }

    fn link_changes(&self, to: &str, after: i64) -> Vec<Option<i64>> {
        self.workers
            .iter()
            .map(|lines| {
                lines
                    .iter()
                    .filter(|l| l["link"] == to)
                    .map(|l| l["at_unix_ms"].as_i64().expect("at") - after)
                    .find(|&d| d >= 0)
            })
            .collect()
    }

    fn done(&self) -> Vec<&Value> {
        self.workers
            .iter()
            .map(|lines| {
                lines
                    .iter()
                    .find(|l| l.get("outcomes").is_some())
                    .expect("every worker prints its outcomes")
            })
            .collect()
    }

    /// Prints the figures and checks the bounds; returns the failures
    /// rather than stopping at the first, so one run shows them all.
    /// `fault` and `back`: when the coordinator was hit and when it
    /// returned (Unix ms); `None` for the run without a fault.
    fn check(&self, name: &str, fault: Option<(i64, i64)>) -> Vec<String> {
        let mut failures = Vec::new();
        let ((aligned, aligned_at), (sliding, sliding_at)) = self.peaks_after_outage();
        eprintln!(
            "[{name}] upstream offered/s: {:?}",
            self.per_second("offered")
        );
        eprintln!(
            "[{name}] upstream served/s:  {:?}",
            self.per_second("served")
        );
        eprintln!(
            "[{name}] upstream refused/s: {:?}",
            self.per_second("refused")
        );
        eprintln!(
            "[{name}] peak after the outage (1 s, × C): aligned {aligned:.2} at {aligned_at} s, \
             sliding {sliding:.2} at {sliding_at} s"
        );
        let summary = self.summary();
        eprintln!("[{name}] upstream summary: {summary}");
        let fallback = match fault {
            Some((fault, back)) => {
                eprintln!(
                    "[{name}] time to reconnect after the coordinator returned (ms): {:?}",
                    self.reconnected_after(back)
                );
                self.fallback_after(fault)
            }
            None => Vec::new(),
        };
        eprintln!("[{name}] time to fallback per worker (ms): {fallback:?}");
        let mut totals = std::collections::BTreeMap::<String, u64>::new();
        for done in self.done() {
            for (outcome, n) in done["outcomes"].as_object().expect("outcomes") {
                *totals.entry(outcome.clone()).or_default() += n.as_u64().expect("n");
            }
            for field in ["errors", "unfinished"] {
                if done[field] != 0 {
                    failures.push(format!("[{name}] {field} in {done}"));
                }
            }
            let floor = (RATE * INTENTS_FOR.as_secs_f64() * 0.9) as u64;
            if done["intents"].as_u64().expect("intents") < floor {
                failures.push(format!("[{name}] a worker fell behind its rate: {done}"));
            }
        }
        eprintln!("[{name}] outcomes, whole fleet: {totals:?}");
        let mut released = std::collections::BTreeMap::<String, Vec<u64>>::new();
        for done in self.done() {
            for (by, counts) in done["attempts_per_s"].as_object().expect("attempts_per_s") {
                let sum = released.entry(by.clone()).or_default();
                for (second, n) in counts.as_array().expect("counts").iter().enumerate() {
                    if sum.len() <= second {
                        sum.resize(second + 1, 0);
                    }
                    sum[second] += n.as_u64().expect("n");
                }
            }
        }
        for (by, counts) in &released {
            eprintln!("[{name}] attempts/s released by {by}, whole fleet: {counts:?}");
        }
        // GETs are safe to repeat: `indeterminate` here only ever means the
        // gate misdrove its engine (it logs why to the worker's .log).
        if totals.contains_key("indeterminate") {
            failures.push(format!("[{name}] intents ended indeterminate: {totals:?}"));
        }

        if summary["after_deadline"] != 0 {
            failures.push(format!("[{name}] attempts after their deadline: {summary}"));
        }
        for t in &fallback {
            match t {
                Some(ms) if *ms <= (RPC_TIMEOUT + Duration::from_millis(250)).as_millis() as i64 => {}
                other => failures.push(format!(
                    "[{name}] a worker fell back {other:?} ms after the fault (bound: one RPC timeout)"
                )),
            }
        }
        if aligned > PEAK_BOUND {
            failures.push(format!(
                "[{name}] upstream peak after the outage {aligned:.2} × C at {aligned_at} s \
                 (sliding {sliding:.2}) > {PEAK_BOUND} × C"
            ));
        }
        failures
    }
}

/// First the storm with no fault (the control); then a SIGKILL one second into the outage and a restart a second later (the
/// coordinator comes back without its memory, into the storm); then a
/// fresh storm with a SIGSTOP one second into the outage, held 5 s, so the
/// coordinator returns to a fleet recovering on its local budgets.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "real processes and about a minute of real time: cargo test -p tollgate-bench --test chaos_fleet -- --ignored"]
async fn chaos_fleet_upstream_peak_stays_near_capacity_across_kill_and_stop() {
    let dir = process::temp_dir("chaos-fleet");
    let serve = |log: &str| {
        let mut command = Command::new(process::coordinator_bin(BENCH));
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("TOLLGATE_STORE")
            .env_remove("TOLLGATE_LISTEN");
        Served::spawn(command, &dir.join(log))
    };
    let mut served = serve("serve-1.log");
    served.until_serving().await;
    // The workers' one address across the restart, as a Service's.
    let front = Front::to(served.addr).await;
    let coordinator = front.url();
    let mut failures = Vec::new();

    // The same storm with the coordinator untouched: what the faults below
    // are measured against.
    let storm = Storm::start(&dir, "none", &coordinator).await;
    failures.extend(storm.finish().await.check("none", None));

    // SIGKILL: connections reset; the next RPC of each worker fails.
    let storm = Storm::start(&dir, "kill", &coordinator).await;
    storm.at(FAULT_AT).await;
    served.kill();
    let fault = unix_ms(SystemTime::now());
    storm.at(FAULT_AT + Duration::from_secs(1)).await;
    let mut served = serve("serve-2.log");
    served.until_serving().await;
    front.point_at(served.addr);
    let back = unix_ms(SystemTime::now());
    let measured = storm.finish().await;
    failures.extend(measured.check("kill", Some((fault, back))));

    // SIGSTOP: RPCs hang until the link's timeout.
    let storm = Storm::start(&dir, "stop", &coordinator).await;
    storm.at(FAULT_AT).await;
    served.signal("STOP");
    let fault = unix_ms(SystemTime::now());
    storm.at(FAULT_AT + Duration::from_secs(5)).await;
    served.signal("CONT");
    let back = unix_ms(SystemTime::now());
    let measured = storm.finish().await;
    failures.extend(measured.check("stop", Some((fault, back))));

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
