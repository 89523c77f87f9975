//! Test support shared by the unit tests and the `tests/` binaries: a
//! private `redis-server` per test. Not part of the API.
//!
//! Each test gets its own server on a free loopback port, with nothing
//! saved to disk, killed when the handle drops — no test depends on (or
//! disturbs) a Redis the machine happens to run. Without `redis-server` on
//! `PATH` the Redis tests print a notice and skip, unless
//! `TOLLGATE_REQUIRE_REDIS=1` (CI) makes that a failure.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Turns a missing `redis-server` into a test failure.
pub const REQUIRE_ENV: &str = "TOLLGATE_REQUIRE_REDIS";

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
    /// `redis-server` is not installed and [`REQUIRE_ENV`] is not set.
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
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE_ENV}=1 but redis-server is not on PATH");
            }
            eprintln!("notice: redis-server is not on PATH; skipping this Redis test");
            return None;
        };
        // redis-server has no `--port 0`: take a free port from the kernel
        // and release it. Another process could grab it in between; the
        // start check below then fails loudly rather than testing a
        // stranger's server.
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
            binary,
            port,
            child: None,
            cluster,
            extra: Vec::new(),
            sentinel: None,
        };
        server.restart();
        Some(server)
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
    /// answers PING.
    ///
    /// # Panics
    /// When it does not answer within 10 s.
    pub fn restart(&mut self) {
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
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers_ping() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
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
        self.kill();
        if let Some(dir) = &self.cluster {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(dir) = self.sentinel.as_deref().and_then(|c| c.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
