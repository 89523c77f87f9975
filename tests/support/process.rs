//! `tollgate serve` as a child process: the shipped binary exactly as an
//! operator (or a container) runs it, killed when the handle drops. Its
//! stderr is copied to a log file the test can read.
//!
//! Every listener is asked for as `127.0.0.1:0` and the port is read from
//! the child's own start-up log (`tollgate coordinator listening
//! address=…`, and one line each for `--health-listen` and
//! `--metrics-listen`): a port picked by binding and releasing it first can
//! be taken by anyone in between, and the test would then talk to a
//! stranger, or to nothing.
//!
//! Not a module of `support` itself: the client crate's tests share that
//! harness, and only this package's tests know where the binary is. A test
//! of this package includes it as `#[path = "support/process.rs"] mod
//! process;`, the benchmark crate's as `#[path =
//! "../../tests/support/process.rs"]`.

// Each test binary uses a different subset.
#![allow(dead_code)]

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

pub(crate) use tollgate_testkit::{COORDINATOR_LISTENING as GRPC_LISTENING, logged_address};
/// The same for `--health-listen`.
pub(crate) const HEALTH_LISTENING: &str = "serving grpc.health.v1 alone";
/// The same for `--metrics-listen`.
pub(crate) const METRICS_LISTENING: &str = "serving Prometheus metrics on /metrics";

/// How long a child gets to bind and log its address, or to answer: far
/// beyond any start-up, so only a child that never gets there fails.
const START_BOUND: Duration = Duration::from_secs(30);

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

/// A fresh folder under the system temp dir, named for the test.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A loopback address that certainly refuses connections for as long as
/// the returned socket lives: the socket holds the port bound but never
/// listens, so a connection to it is answered with a reset
/// (ECONNREFUSED) and no other socket can bind it meanwhile. (A port bound
/// and released is not that: anyone may listen on it next.)
pub(crate) fn refusing_address() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind a loopback port");
    let addr = socket.local_addr().expect("its address");
    (socket, addr)
}

/// Whether this process runs as root (`/proc/self` belongs to the
/// effective user).
pub(crate) fn running_as_root() -> bool {
    own_uid() == 0
}

fn own_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("/proc/self")
}

/// `nobody`: who a child runs as when this test runs as root.
pub(crate) const NOBODY: u32 = 65534;

/// `tollgate` as a user whom mode bits stop, and that user's id (to own
/// the folders the child may write). As root (whom a read-only folder does
/// not stop), `uid` with the same group and no supplementary groups:
/// std's `CommandExt::uid` drops them when root, so no helper (`setpriv`,
/// `sudo`) is needed. As any other user, that user: it cannot become
/// another, and mode bits already stop it.
pub(crate) fn as_non_root(uid: u32) -> (Command, u32) {
    use std::os::unix::process::CommandExt as _;
    if !running_as_root() {
        return (Command::new(BIN), own_uid());
    }
    let mut command = Command::new(binary_for_others());
    command.uid(uid).gid(uid);
    (command, uid)
}

/// [`BIN`], or a link to it (a copy across file systems) other users can
/// reach when a folder above it is closed to them (a 0700 home or target
/// folder): made once per test process in a 0755 folder under the temp
/// dir.
fn binary_for_others() -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let reachable = Path::new(BIN)
        .ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if reachable {
        return PathBuf::from(BIN);
    }
    COPY.get_or_init(|| {
        let dir = temp_dir("bin-for-others");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let copy = dir.join("tollgate");
        // A hard link costs nothing on the same file system; a copy
        // otherwise.
        std::fs::hard_link(BIN, &copy)
            .or_else(|_| std::fs::copy(BIN, &copy).map(drop))
            .expect("the binary where others can reach it");
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        copy
    })
    .clone()
}

/// A running `tollgate serve`, its gRPC listener bound.
pub(crate) struct Served {
    run: Launched,
    /// Where its gRPC listener is, as it logged it.
    pub(crate) addr: SocketAddr,
    /// Where [`Served::health`] asks: the gRPC listener, or the
    /// health-only one (see [`Served::probing_health_listener`]).
    probe: SocketAddr,
}

impl Served {
    /// Spawns `command` (already given its args and env, every listener
    /// on port 0), copying its stderr to `log`, and waits until it logs
    /// where its gRPC listener is bound; panics with its log when it exits
    /// first, never says, or exits right after.
    pub(crate) fn spawn(command: Command, log: &Path) -> Served {
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut served = Served {
            run: launch(command, log),
            addr: unbound,
            probe: unbound,
        };
        served.addr = served.address_of(GRPC_LISTENING);
        served.probe = served.addr;
        served
    }

    /// Waits (generously) for the line `message` with its bound address;
    /// the child must be running before and after.
    fn address_of(&mut self, message: &str) -> SocketAddr {
        let give_up = Instant::now() + START_BOUND;
        loop {
            if let Some(status) = self.exited() {
                panic!(
                    "tollgate serve exited ({status}) before logging `{message}`:\n{}",
                    self.run.whole_log()
                );
            }
            if let Some(addr) = logged_address(&self.log(), message) {
                if let Some(status) = self.exited() {
                    panic!(
                        "tollgate serve exited ({status}) once bound:\n{}",
                        self.run.whole_log()
                    );
                }
                return addr;
            }
            assert!(
                Instant::now() < give_up,
                "tollgate serve did not log `{message} address=…` within {START_BOUND:?} \
                 (a RUST_LOG that hides INFO hides it too):\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Where `--health-listen` is bound, once logged.
    pub(crate) fn health_addr(&mut self) -> SocketAddr {
        self.address_of(HEALTH_LISTENING)
    }

    /// Where `--metrics-listen` is bound, once logged.
    pub(crate) fn metrics_addr(&mut self) -> SocketAddr {
        self.address_of(METRICS_LISTENING)
    }

    /// Asks health on the health-only listener from now on (for a gRPC
    /// port that serves TLS, as Kubernetes' probes do).
    pub(crate) fn probing_health_listener(mut self) -> Served {
        self.probe = self.health_addr();
        self
    }

    /// `http://127.0.0.1:PORT` of the gRPC listener.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.run.child.id()
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.run.log).unwrap_or_default()
    }

    /// Sends the child a signal by name (`STOP`, `CONT`, `HUP`), as `kill
    /// -NAME` does: std's `Child` can only SIGKILL.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.run.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name}");
    }

    /// SIGKILLs the child and reaps it: a crash, not a drain.
    pub(crate) fn kill(&mut self) {
        self.run.child.kill().expect("SIGKILL");
        let _ = self.run.child.wait();
    }

    /// Whether it has exited, and how.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.run.child.try_wait().expect("try_wait")
    }

    /// The Budget service's health now (`None`: no answer).
    pub(crate) async fn health(&self) -> Option<ServingStatus> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.probe))
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
        let give_up = tokio::time::Instant::now() + START_BOUND;
        loop {
            if let Some(status) = self.exited() {
                panic!(
                    "tollgate serve exited ({status}):\n{}",
                    self.run.whole_log()
                );
            }
            if self.health().await == Some(ServingStatus::Serving) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "not SERVING within {START_BOUND:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (generously) until the health check says `want`.
    pub(crate) async fn until_health(&self, want: ServingStatus) {
        let give_up = tokio::time::Instant::now() + START_BOUND;
        while self.health().await != Some(want) {
            assert!(
                tokio::time::Instant::now() < give_up,
                "health not {want:?} within {START_BOUND:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child whose stderr goes to a log file; killed when dropped.
pub(crate) struct Launched {
    pub(crate) child: Child,
    /// The log file.
    pub(crate) log: PathBuf,
    /// The thread copying stderr into the log, until the child closes it.
    copier: Option<std::thread::JoinHandle<()>>,
}

impl Launched {
    /// The log, whole once the child has exited: waits for the copy to
    /// reach the end of its stderr.
    pub(crate) fn whole_log(&mut self) -> String {
        if matches!(self.child.try_wait(), Ok(Some(_)))
            && let Some(copier) = self.copier.take()
        {
            let _ = copier.join();
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (generously) until the child exits: how, and its whole log.
    /// Panics with the log when it is still running after the bound.
    pub(crate) async fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let give_up = tokio::time::Instant::now() + START_BOUND;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status, self.whole_log());
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "still running after {START_BOUND:?}:\n{}",
                self.whole_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Spawns `command` with stdout discarded and stderr copied into a fresh
/// file `log` by a thread of this process: the child never writes the log
/// itself, so neither a file-size limit nor the user it runs as touches
/// it. For a child expected to exit rather than serve; [`Served::spawn`]
/// otherwise.
pub(crate) fn launch(mut command: Command, log: &Path) -> Launched {
    let mut file = std::fs::File::create(log).expect("log file");
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate serve");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let copier = std::thread::spawn(move || {
        // Chunk by chunk, so the file follows the child line by line.
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf) {
            if std::io::Write::write_all(&mut file, &buf[..n]).is_err() {
                break;
            }
        }
    });
    Launched {
        child,
        log: log.to_owned(),
        copier: Some(copier),
    }
}

/// A fixed loopback address in front of a coordinator that comes back on
/// another port, as a Kubernetes Service stands in front of its pods:
/// workers keep one address across a restart. Its listener is held for the
/// test's whole life (the address cannot change hands); each connection is
/// piped to where [`Front::point_at`] last said, and closed when that end
/// refuses or closes. Stops with the handle.
pub(crate) struct Front {
    /// The address workers use.
    pub(crate) addr: SocketAddr,
    to: Arc<Mutex<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl Front {
    /// A front piping to `to`.
    pub(crate) async fn to(to: SocketAddr) -> Front {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the front");
        let addr = listener.local_addr().expect("its address");
        let target = Arc::new(Mutex::new(to));
        let task = tokio::spawn({
            let target = Arc::clone(&target);
            async move {
                // Dropped with the task: every pipe ends with the front.
                let mut pipes = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((mut inbound, _)) = accepted else { continue };
                            let to = *target.lock().unwrap_or_else(|e| e.into_inner());
                            pipes.spawn(async move {
                                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                        .await;
                                }
                            });
                        }
                        Some(_) = pipes.join_next(), if !pipes.is_empty() => {}
                    }
                }
            }
        });
        Front {
            addr,
            to: target,
            task,
        }
    }

    /// New connections go to `to` from now on.
    pub(crate) fn point_at(&self, to: SocketAddr) {
        *self.to.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }

    /// `http://127.0.0.1:PORT` of the front.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}
