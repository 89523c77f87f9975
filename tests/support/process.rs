//! `tollgate serve` as a child process: the shipped binary exactly as an
//! operator (or a container) runs it, on a free loopback port, killed when
//! the handle drops. Its stderr goes to a log file the test can read.
//!
//! Not a module of `support` itself: the client crate's tests share that
//! harness, and only this package's tests know where the binary is. A test
//! of this package includes it as `#[path = "support/process.rs"] mod
//! process;`, the benchmark crate's as `#[path =
//! "../../tests/support/process.rs"]`.

// Each test binary uses a different subset.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The binary under test. Cargo names it for this package's tests; the
/// benchmark crate's tests (which include this file too) find it with
/// [`coordinator_bin`].
pub(crate) const BIN: &str = match option_env!("CARGO_BIN_EXE_tollgate") {
    Some(bin) => bin,
    None => "",
};

/// The `tollgate` binary for a test of another package of the workspace:
/// beside that test's own binary `beside` (both in the target folder).
/// `cargo test --workspace` builds it; a test run alone fails here saying
/// how to build it, rather than running an old one unknowingly absent.
pub(crate) fn coordinator_bin(beside: &str) -> PathBuf {
    let bin = Path::new(beside).with_file_name("tollgate");
    assert!(
        bin.is_file(),
        "{} not built: cargo build --bin tollgate (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// A free loopback port (released at once; the child binds it next).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A fresh folder under the system temp dir, named for the test.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A running `tollgate serve`.
pub(crate) struct Served {
    child: Child,
    /// Where it listens.
    pub(crate) port: u16,
    log: PathBuf,
}

impl Served {
    /// Spawns `command` (already given its args and env), logging to `log`.
    pub(crate) fn spawn(mut command: Command, port: u16, log: &Path) -> Served {
        let file = std::fs::File::create(log).expect("log file");
        let child = command
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn tollgate serve");
        Served {
            child,
            port,
            log: log.to_owned(),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends the child a signal by name (`STOP`, `CONT`), as `kill -NAME`
    /// does: std's `Child` can only SIGKILL.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name}");
    }

    /// SIGKILLs the child and reaps it: a crash, not a drain.
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// Whether it has exited, and how.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// The Budget service's health now (`None`: no answer).
    pub(crate) async fn health(&self) -> Option<ServingStatus> {
        let channel = tonic::transport::Endpoint::from_shared(self.url())
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut client = HealthClient::new(channel);
        let reply = client
            .check(HealthCheckRequest {
                service: "tollgate.v1.Budget".into(),
            })
            .await
            .ok()?;
        ServingStatus::try_from(reply.into_inner().status).ok()
    }

    /// Waits (generously) until the Budget service is SERVING; panics with
    /// the child's log when it exits first or never gets there.
    pub(crate) async fn until_serving(&mut self) {
        let bound = Duration::from_secs(30);
        let give_up = tokio::time::Instant::now() + bound;
        loop {
            if let Some(status) = self.exited() {
                panic!("tollgate serve exited ({status}):\n{}", self.log());
            }
            if self.health().await == Some(ServingStatus::Serving) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "not SERVING within {bound:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (generously) until the health check says `want`.
    pub(crate) async fn until_health(&self, want: ServingStatus) {
        let bound = Duration::from_secs(10);
        let give_up = tokio::time::Instant::now() + bound;
        while self.health().await != Some(want) {
            assert!(
                tokio::time::Instant::now() < give_up,
                "health not {want:?} within {bound:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
