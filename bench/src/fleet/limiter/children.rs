//! The benchmark's other processes: a real `tollgate serve` and the
//! `tollgate-bench worker` fleet, each killed if still running when its
//! handle drops, so a failed run leaves nothing behind. The `serve` side is
//! the `propagation` benchmark's too (its replicas on one Redis).

use std::ffi::OsStr;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use tokio::time::Instant;
use tollgate_testkit::{COORDINATOR_LISTENING, logged_address};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::fleet::{CALLER_SCOPE, ROUTE};

/// How long `tollgate serve` may take to report SERVING.
const SERVING_WITHIN: Duration = Duration::from_secs(30);

/// How often the coordinator's view of the fleet's scope is sampled.
const SCOPE_SAMPLE: Duration = Duration::from_secs(1);

/// The `tollgate` binary to start: `explicit` (a `--coordinator-bin`), or
/// the one beside this binary, as `cargo build` leaves them.
pub(crate) fn coordinator_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match explicit {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("finding this binary")?
            .with_file_name("tollgate"),
    };
    anyhow::ensure!(
        bin.is_file(),
        "{} not found: build it (cargo build --release --bin tollgate) or pass --coordinator-bin",
        bin.display()
    );
    Ok(bin)
}

/// A free loopback port (released at once; the child binds it next).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port")?
        .port())
}

/// A child process, killed and reaped when dropped.
#[derive(Debug)]
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `tollgate serve`.
#[derive(Debug)]
pub(crate) struct Coordinator {
    child: Killed,
    port: u16,
}

impl Coordinator {
    /// Starts `bin serve --store STORE` (with `--config CONFIG` when given)
    /// on a loopback port it binds itself (port 0) and names in its log
    /// `log`, and waits until its Budget service is SERVING. A port picked
    /// here and released for the child could be taken by another process
    /// first, and the health check would then ask a stranger.
    pub(crate) async fn start(
        bin: &Path,
        store: &str,
        config: Option<&Path>,
        log: &Path,
    ) -> anyhow::Result<Coordinator> {
        let stderr =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new(bin);
        command.args(["serve", "--store", store, "--listen", "127.0.0.1:0"]);
        if let Some(config) = config {
            command.args([OsStr::new("--config"), config.as_os_str()]);
        }
        let child = command
            // Only what the command line says: not an operator's settings.
            .env_remove("TOLLGATE_STORE")
            .env_remove("TOLLGATE_LISTEN")
            .env_remove("TOLLGATE_METRICS_LISTEN")
            .env_remove("TOLLGATE_HEALTH_LISTEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {} serve", bin.display()))?;
        let mut coordinator = Coordinator {
            child: Killed(child),
            port: 0,
        };
        let give_up = Instant::now() + SERVING_WITHIN;
        loop {
            if let Some(status) = coordinator.child.0.try_wait()? {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                anyhow::bail!("tollgate serve exited ({status}):\n{log}");
            }
            if coordinator.port == 0 {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                if let Some(address) = logged_address(&text, COORDINATOR_LISTENING) {
                    coordinator.port = address.port();
                }
            }
            if coordinator.port != 0 && coordinator.health().await == Some(ServingStatus::Serving) {
                return Ok(coordinator);
            }
            if Instant::now() >= give_up {
                anyhow::bail!(
                    "tollgate serve not SERVING within {SERVING_WITHIN:?} (log: {})",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Samples the coordinator's view of the fleet's scope every second
    /// (`tollgate scopes show … -o json`, the operator's own command) into
    /// `out` as JSON lines `{"second":s,"scope":{..}}`, seconds from
    /// `started`: the pacing state behind what nginx saw. Stops when
    /// dropped.
    pub(crate) fn sample_scope(&self, bin: &Path, out: PathBuf, started: Instant) -> ScopeSamples {
        let (bin, url) = (bin.to_owned(), self.url());
        let task = tokio::spawn(async move {
            let mut lines = String::new();
            let mut tick = tokio::time::interval(SCOPE_SAMPLE);
            loop {
                tick.tick().await;
                let second = started.elapsed().as_secs_f64();
                let shown = tokio::process::Command::new(&bin)
                    .args([
                        "scopes",
                        "show",
                        CALLER_SCOPE,
                        ROUTE,
                        "-o",
                        "json",
                        "--server",
                    ])
                    .arg(&url)
                    .env_remove("TOLLGATE_ADMIN_TOKEN")
                    .kill_on_drop(true)
                    .output()
                    .await;
                let scope = shown
                    .ok()
                    .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
                    .unwrap_or(serde_json::Value::Null);
                lines += &serde_json::json!({"second": second, "scope": scope}).to_string();
                lines.push('\n');
                // Rewritten whole each time: a few kB a second, and the
                // file is complete whenever the task is stopped.
                let _ = std::fs::write(&out, &lines);
            }
        });
        ScopeSamples(task)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn health(&self) -> Option<ServingStatus> {
        let channel = tonic::transport::Endpoint::from_shared(self.url())
            .ok()?
            .connect()
            .await
            .ok()?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "tollgate.v1.Budget".into(),
            })
            .await
            .ok()?;
        ServingStatus::try_from(reply.into_inner().status).ok()
    }
}

/// The scope sampler's task, stopped when dropped.
#[derive(Debug)]
pub(crate) struct ScopeSamples(tokio::task::JoinHandle<()>);

impl Drop for ScopeSamples {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a worker process printed last: its intents and their outcomes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkerSummary {
    /// Intents started.
    pub intents: u64,
    /// Outcome name → intents that ended so.
    pub outcomes: std::collections::BTreeMap<String, u64>,
    /// Ended with neither a response nor a gate report.
    pub errors: u64,
    /// Still running well after their deadline.
    pub unfinished: u64,
    /// Attempts started per second of the worker, by what released them
    /// (`first`, `held_coordinator`, `alone`, …: see `fleet::worker`).
    #[serde(default)]
    pub attempts_per_s: std::collections::BTreeMap<String, Vec<u64>>,
}

impl WorkerSummary {
    /// The summary line among a worker's output lines (the others are its
    /// link's state changes).
    pub fn from_output(text: &str) -> Option<WorkerSummary> {
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line.get("outcomes").is_some())
            .and_then(|line| serde_json::from_value(line).ok())
    }
}

/// A running `tollgate-bench worker` writing its lines to a file.
#[derive(Debug)]
pub(crate) struct Worker {
    child: Killed,
    out: PathBuf,
}

impl Worker {
    /// Starts `bin worker ARGS`, its stdout to `out`, stderr beside it.
    pub(crate) fn spawn(bin: &Path, args: &[String], out: PathBuf) -> anyhow::Result<Worker> {
        let stdout =
            std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
        let stderr = std::fs::File::create(out.with_extension("log"))
            .with_context(|| format!("creating {}", out.with_extension("log").display()))?;
        let child = Command::new(bin)
            .arg("worker")
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {} worker", bin.display()))?;
        Ok(Worker {
            child: Killed(child),
            out,
        })
    }

    /// Waits (until `give_up`) for the worker to exit on its own; its
    /// summary.
    pub(crate) async fn finish(mut self, give_up: Instant) -> anyhow::Result<WorkerSummary> {
        loop {
            if let Some(status) = self.child.0.try_wait()? {
                let text = std::fs::read_to_string(&self.out)
                    .with_context(|| format!("reading {}", self.out.display()))?;
                return WorkerSummary::from_output(&text).with_context(|| {
                    format!(
                        "worker exited ({status}) without a summary; see {}",
                        self.out.with_extension("log").display()
                    )
                });
            }
            if Instant::now() >= give_up {
                anyhow::bail!("worker {} still running", self.out.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_found_among_the_link_lines() {
        let text = r#"{"link":"connected","at_unix_ms":1}
{"link":"degraded","at_unix_ms":2}
{"worker":"w","intents":30,"outcomes":{"succeeded":28,"deadline_infeasible":2},"errors":0,"unfinished":1,"attempts_per_s":{"first":[30]}}
"#;
        let summary = WorkerSummary::from_output(text).expect("a summary");
        assert_eq!(summary.intents, 30);
        assert_eq!(summary.outcomes["succeeded"], 28);
        assert_eq!(summary.unfinished, 1);
        assert_eq!(summary.attempts_per_s["first"], vec![30]);
        assert!(WorkerSummary::from_output("{\"link\":\"connected\"}\n").is_none());
    }
}
