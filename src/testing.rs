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
}

impl RedisServer {
    /// Starts a server on a free port, or `None` (after a notice) when
    /// `redis-server` is not installed and [`REQUIRE_ENV`] is not set.
    ///
    /// # Panics
    /// When the server is required but missing, or does not start.
    pub fn start() -> Option<RedisServer> {
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
        let mut server = RedisServer {
            binary,
            port,
            child: None,
        };
        server.restart();
        Some(server)
    }

    /// The URL of this server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
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
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
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
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
