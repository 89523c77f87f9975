//! Test support shared by the unit tests and the `tests/` binaries: a
//! private `redis-server` per test, and [`help::check_examples`] for the
//! binaries' help pages. Not part of the API.
//!
//! Each test gets its own server on a free loopback port, with nothing
//! saved to disk, killed when the handle drops — no test depends on (or
//! disturbs) a Redis the machine happens to run. redis-server cannot pick
//! its own port, so the port is taken from the kernel and released first;
//! a server is only used once the one answering on it reports this child's
//! process id, and a child that could not bind it is started again on
//! another port. A server that died during its test fails that test when
//! dropped. Without `redis-server` on
//! `PATH` the Redis tests print a notice and skip, unless
//! `TOLLGATE_REQUIRE_REDIS=1` or CI (see [`missing_tool`]) makes that a
//! failure.

pub mod help;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Turns a missing `redis-server` into a test failure.
pub const REQUIRE_ENV: &str = "TOLLGATE_REQUIRE_REDIS";

/// Whether this is a CI run: `CI` set (as CI services and `.ci/run` set it)
/// to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// What a test does when the tool it drives is not installed: a failure
/// naming `tool` and how to `install` it under CI ([`in_ci`]) or when
/// `require_env` is `1`, so a skip can never pass as a pass there;
/// elsewhere (a developer's machine without it) a notice, after which the
/// caller returns early.
///
/// # Panics
/// When the tool is required, as above.
#[track_caller]
pub fn missing_tool(tool: &str, require_env: &str, install: &str) {
    let required = std::env::var(require_env).is_ok_and(|v| v == "1");
    assert!(
        !required && !in_ci(),
        "{tool} is missing and this run requires it ({}): {install}",
        if required {
            format!("{require_env}=1")
        } else {
            "CI is set".to_owned()
        }
    );
    eprintln!("notice: {tool} is missing; skipping this test ({install})");
}

/// Ports tried before a start gives up.
const START_TRIES: usize = 5;

/// A `redis-server` child process on `127.0.0.1:port`.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    child: Option<Child>,
    /// A one-node Redis Cluster owning every slot, so the cluster code path
    /// (hash tags, the caller key read apart) runs against a real cluster.
    cluster: Option<PathBuf>,
    /// More arguments: a replica's `--replicaof`.
    extra: Vec<String>,
    /// A Sentinel's config file (Sentinels rewrite theirs, so it is a file
    /// of its own, not arguments).
    sentinel: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a server on a free port, or `None` (after a notice) when
    /// `redis-server` is not installed, [`REQUIRE_ENV`] is not set and this
    /// is not CI.
    ///
    /// # Panics
    /// When the server is required but missing, or does not start.
    pub fn start() -> Option<RedisServer> {
        Self::start_as(false)
    }

    /// [`RedisServer::start`] as a one-node Redis Cluster owning all slots.
    ///
    /// # Panics
    /// As [`RedisServer::start`], or when the cluster does not form.
    pub fn start_cluster() -> Option<RedisServer> {
        Self::start_as(true)
    }

    fn start_as(cluster: bool) -> Option<RedisServer> {
        let Some(binary) = find_on_path("redis-server") else {
            missing_tool("redis-server", REQUIRE_ENV, "apt-get install redis-server");
            return None;
        };
        // redis-server has no `--port 0`: take a free port from the kernel
        // and release it. Another process can bind it in between; then
        // this child exits (or a stranger answers), and another port is
        // tried.
        let mut last = String::new();
        for _ in 0..START_TRIES {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free loopback port");
            // A cluster node writes its nodes.conf; give it a private folder.
            let cluster = cluster.then(|| {
                let dir = std::env::temp_dir().join(format!("tollgate-redis-{port}"));
                std::fs::create_dir_all(&dir).expect("a folder for nodes.conf");
                dir
            });
            let mut server = RedisServer {
                binary: binary.clone(),
                port,
                child: None,
                cluster,
                extra: Vec::new(),
                sentinel: None,
            };
            match server.spawn() {
                Ok(deadline) => {
                    server.form_cluster_if_asked(deadline);
                    return Some(server);
                }
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start in {START_TRIES} tries: {last}");
    }

    /// A replica of `primary` on a free port (it may still be syncing when
    /// this returns).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_replica_of(primary: &RedisServer) -> Option<RedisServer> {
        let mut server = Self::start()?;
        server.extra = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ];
        server.restart();
        Some(server)
    }

    /// A Sentinel on a free port watching `primary` as `service`, quorum 1,
    /// quick to call the primary down (300 ms) and to fail over, so a test
    /// sees a failover in seconds.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_sentinel(primary: &RedisServer, service: &str) -> Option<RedisServer> {
        let mut server = Self::start()?;
        server.kill();
        let dir = std::env::temp_dir().join(format!("tollgate-sentinel-{}", server.port));
        std::fs::create_dir_all(&dir).expect("a folder for the sentinel config");
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {service} 127.0.0.1 {primary} 1\n\
             sentinel down-after-milliseconds {service} 300\n\
             sentinel failover-timeout {service} 2000\n\
             sentinel parallel-syncs {service} 1\n",
            port = server.port,
            dir = dir.display(),
            primary = primary.port,
        );
        std::fs::write(&conf, text).expect("sentinel config");
        server.sentinel = Some(conf);
        server.restart();
        Some(server)
    }

    /// The URL of this server (`redis+cluster://` for a cluster node).
    pub fn url(&self) -> String {
        match self.cluster {
            Some(_) => format!("redis+cluster://127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Deletes every key (FLUSHALL), for tests sharing one server.
    ///
    /// # Panics
    /// When the server does not answer.
    pub fn flush(&self) {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).expect("client");
        let mut conn = client.get_connection().expect("connect");
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).expect("flushall");
    }

    /// Kills the server (its data is gone: nothing is saved).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty; waits until it
    /// answers PING as this child.
    ///
    /// # Panics
    /// When it does not answer within 10 s, or the port is another
    /// process's now.
    pub fn restart(&mut self) {
        match self.spawn() {
            Ok(deadline) => self.form_cluster_if_asked(deadline),
            Err(why) => panic!("redis-server did not restart: {why}"),
        }
    }

    /// Whether the child still runs (false once killed).
    pub fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Spawns the child on `self.port` and waits until the server
    /// answering there is it; the instant it gives up by. `Err` when the
    /// child exits first (the port was taken) or another process answers.
    fn spawn(&mut self) -> Result<Instant, String> {
        self.kill();
        let mut command = Command::new(&self.binary);
        if let Some(dir) = &self.cluster {
            let _ = std::fs::remove_file(dir.join("nodes.conf"));
            command
                .args(["--cluster-enabled", "yes"])
                .arg("--dir")
                .arg(dir);
        }
        if let Some(conf) = &self.sentinel {
            command.arg(conf).arg("--sentinel");
        } else {
            command
                .args(["--save", "", "--appendonly", "no"])
                .args(&self.extra);
        }
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if !self.is_alive() {
                self.kill();
                return Err(format!("it exited (port {} taken?)", self.port));
            }
            if self.answers_ping() {
                return match self.process_id() {
                    Some(found) if found == pid => Ok(deadline),
                    found => {
                        self.kill();
                        Err(format!(
                            "port {} is answered by process {found:?}, not the child {pid}",
                            self.port
                        ))
                    }
                };
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("no answer on port {} within 10 s", self.port));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The process id the server on `self.port` reports (`INFO server`).
    fn process_id(&self) -> Option<u32> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut conn = client.get_connection().ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    fn form_cluster_if_asked(&self, deadline: Instant) {
        if self.cluster.is_some() {
            self.form_cluster(deadline);
        }
    }

    /// Gives the one node every slot and waits for `cluster_state:ok`.
    fn form_cluster(&self, deadline: Instant) {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).expect("client");
        let mut conn = client
            .get_connection()
            .expect("connect to the cluster node");
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query(&mut conn)
            .expect("assign every slot");
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .expect("cluster info");
            if info.contains("cluster_state:ok") {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not form");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn answers_ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A server its test did not kill must have lived through it: a
        // test against a dead one proved nothing it claimed.
        let died = self.child.is_some() && !self.is_alive();
        self.kill();
        if died && !std::thread::panicking() {
            panic!("redis-server on port {} died during the test", self.port);
        }
        if let Some(dir) = &self.cluster {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(dir) = self.sentinel.as_deref().and_then(|c| c.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What `tollgate serve` logs once its gRPC listener is bound, followed by
/// `address=IP:PORT`: a server started on port 0 says here which port it
/// got, so no caller picks a port and hopes it is still free.
pub const COORDINATOR_LISTENING: &str = "tollgate coordinator listening";

/// The `address=` of the first line of `text` (a child's log) that carries
/// `message`.
pub fn logged_address(text: &str, message: &str) -> Option<std::net::SocketAddr> {
    text.lines()
        .filter(|line| line.contains(message))
        .find_map(|line| {
            let (_, rest) = line.split_once(" address=")?;
            rest.split_whitespace().next()?.parse().ok()
        })
}

/// Where the program `name` is on `PATH`, if it is: for a test that runs a
/// binary which starts its own server, to skip as [`missing_tool`] says.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that cannot bind its port (another server holds it) is not
    /// taken for that server: the start fails instead of testing it.
    #[test]
    fn a_port_another_server_holds_is_refused_not_used() {
        let Some(mut held) = RedisServer::start() else {
            return;
        };
        let mut second = RedisServer {
            binary: held.binary.clone(),
            port: held.port,
            child: None,
            cluster: None,
            extra: Vec::new(),
            sentinel: None,
        };
        let why = second.spawn().expect_err("the port is held");
        assert!(
            why.contains("exited") || why.contains("answered by process"),
            "{why}"
        );
        assert!(
            held.is_alive() && held.answers_ping(),
            "the holder is untouched"
        );
    }

    /// A server that died during its test fails the test when dropped.
    #[test]
    fn a_server_that_died_fails_its_test() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let pid = server.child.as_ref().map(Child::id).expect("a child");
        let status = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let mut server = server;
        let give_up = Instant::now() + Duration::from_secs(10);
        while server.is_alive() {
            assert!(Instant::now() < give_up, "SIGKILL did not end it");
            std::thread::sleep(Duration::from_millis(1));
        }
        let dropped = std::panic::catch_unwind(move || drop(server));
        assert!(
            dropped.is_err(),
            "dropping a dead server must fail its test"
        );
    }
}
