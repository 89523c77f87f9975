//! nginx as the upstream: finding the binary, and one running master
//! whose configuration ([`config`](super::config)) is switched by a real
//! reload (SIGHUP).
//!
//! It runs in the foreground (`daemon off`, a master and one worker
//! process) as the current user, on a loopback port, every file it writes
//! in the run's folder, and is only taken for ready once it answers a
//! request on that port with this run's nonce and the phase expected, so a
//! stale nginx or another program on the port is never mistaken for it.
//! The same check after a reload says when the new configuration is in
//! force.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::config::{ConfigError, Phase, READY_PATH, Site};

/// Where nginx is looked for when it is not on `PATH`: Debian's and
/// Ubuntu's package put it there, outside a normal user's `PATH`.
const SBIN_NGINX: &str = "/usr/sbin/nginx";

/// How long nginx may take to start or to put a reload in force.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// What can go wrong with nginx.
#[derive(Debug, Error)]
pub enum NginxError {
    /// No binary to run.
    #[error(
        "nginx not found on PATH or at {SBIN_NGINX}: install it (Debian/Ubuntu: \
         `apt-get install nginx-light`, or `nginx`), or pass --nginx PATH"
    )]
    NotFound,
    /// `--nginx` names no file.
    #[error(
        "--nginx {0}: no such file; install nginx (Debian/Ubuntu: \
         `apt-get install nginx-light`, or `nginx`) or give its path"
    )]
    NotAt(PathBuf),
    /// A configuration that cannot be written.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Reading or writing the run's files, or starting a process.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// `nginx -t` refused a configuration.
    #[error("nginx -t refused {path}:\n{stderr}")]
    Refused {
        /// The configuration file.
        path: PathBuf,
        /// What nginx said.
        stderr: String,
    },
    /// nginx exited, or did not answer as expected in time.
    #[error("nginx is not serving the {phase} configuration on port {port}: {why}")]
    NotReady {
        /// The configuration expected.
        phase: &'static str,
        /// Where.
        port: u16,
        /// Its exit status or the error log's end.
        why: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NginxError {
    let what = what.into();
    move |source| NginxError::Io { what, source }
}

/// The nginx binary: `explicit` if given, else the first `nginx` on
/// `PATH`, else `/usr/sbin/nginx`.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, NginxError> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_owned())
        } else {
            Err(NginxError::NotAt(path.to_owned()))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("nginx"))
        .chain([PathBuf::from(SBIN_NGINX)])
        .find(|path| path.is_file())
        .ok_or(NginxError::NotFound)
}

/// A running nginx master; stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    site: Site,
}

impl Nginx {
    /// Writes the run's files, has `nginx -t` check both configurations,
    /// starts nginx on the limiter's and waits until it answers.
    pub async fn start(bin: &Path, site: Site) -> Result<Nginx, NginxError> {
        let dir = &site.dir;
        std::fs::create_dir_all(dir.join("html"))
            .map_err(io(format!("creating {}", dir.display())))?;
        std::fs::create_dir_all(dir.join("temp")).map_err(io("creating the temp folder"))?;
        std::fs::write(dir.join("html/ok.txt"), "ok\n").map_err(io("writing ok.txt"))?;
        for phase in [Phase::Limit, Phase::Outage] {
            let path = site.conf(phase);
            std::fs::write(&path, site.config(phase)?)
                .map_err(io(format!("writing {}", path.display())))?;
            test(bin, &site, &path)?;
        }
        std::fs::copy(site.conf(Phase::Limit), site.live_conf())
            .map_err(io("writing nginx.conf"))?;
        let stderr =
            std::fs::File::create(dir.join("nginx.stderr")).map_err(io("creating nginx.stderr"))?;
        let child = Command::new(bin)
            .args(prefix_args(&site, &site.live_conf()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(io(format!("starting {}", bin.display())))?;
        let mut nginx = Nginx { child, site };
        nginx.until_serving(Phase::Limit).await?;
        Ok(nginx)
    }

    /// Where it listens.
    pub fn port(&self) -> u16 {
        self.site.port
    }

    /// The access log it writes.
    pub fn access_log(&self) -> PathBuf {
        self.site.dir.join("access.log")
    }

    /// Puts `phase`'s configuration in force with a real reload: the file
    /// replaced (a rename, so nginx never reads half of it) and SIGHUP to
    /// the master. Returns how long until a new connection was answered by
    /// the new configuration.
    pub async fn switch(&mut self, phase: Phase) -> Result<Duration, NginxError> {
        let started = Instant::now();
        let next = self.site.dir.join("nginx.conf.next");
        std::fs::copy(self.site.conf(phase), &next).map_err(io("writing nginx.conf.next"))?;
        std::fs::rename(&next, self.site.live_conf()).map_err(io("replacing nginx.conf"))?;
        signal(&self.child, "HUP")?;
        self.until_serving(phase).await?;
        Ok(started.elapsed())
    }

    /// Stops nginx: SIGTERM (workers end at once, logs flushed), then
    /// SIGKILL if the master is still there after a few seconds.
    pub async fn stop(mut self) {
        self.shut_down().await;
    }

    async fn shut_down(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = signal(&self.child, "TERM");
            let give_up = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < give_up {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until a new connection is answered by `phase`'s configuration
    /// with this run's nonce.
    async fn until_serving(&mut self, phase: Phase) -> Result<(), NginxError> {
        let expected = format!("{} {}", self.site.nonce, phase.as_str());
        let give_up = Instant::now() + READY_WITHIN;
        let not_ready = |why: String| NginxError::NotReady {
            phase: phase.as_str(),
            port: self.site.port,
            why,
        };
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(not_ready(format!(
                    "exited ({status}): {}",
                    self.error_log_tail()
                )));
            }
            if probe(self.site.port)
                .await
                .is_some_and(|body| body.trim_end() == expected)
            {
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(not_ready(format!(
                    "no answer within {READY_WITHIN:?}: {}",
                    self.error_log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn error_log_tail(&self) -> String {
        let mut text = std::fs::read_to_string(self.site.dir.join("error.log")).unwrap_or_default();
        text += &std::fs::read_to_string(self.site.dir.join("nginx.stderr")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The async stop was not called (an error on the way): do the same
        // synchronously, briefly, so no nginx outlives the benchmark.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = signal(&self.child, "TERM");
            for _ in 0..250 {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `-p DIR/ -c CONF -e DIR/error.log`: the prefix and both logs in the
/// run's folder from the first instant (`-e` before the configuration is
/// read, so even a start-up error lands there).
fn prefix_args(site: &Site, conf: &Path) -> Vec<String> {
    let dir = site.dir.display();
    vec![
        "-p".into(),
        format!("{dir}/"),
        "-c".into(),
        conf.display().to_string(),
        "-e".into(),
        format!("{dir}/error.log"),
    ]
}

/// `nginx -t` on one configuration.
fn test(bin: &Path, site: &Site, conf: &Path) -> Result<(), NginxError> {
    let output = Command::new(bin)
        .arg("-t")
        .args(prefix_args(site, conf))
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running {} -t", bin.display())))?;
    if output.status.success() {
        return Ok(());
    }
    Err(NginxError::Refused {
        path: conf.to_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned()
            + &std::fs::read_to_string(site.dir.join("error.log")).unwrap_or_default(),
    })
}

/// `nginx -V`'s text (it prints to stderr), for [`temp_paths`](super::config::temp_paths).
pub fn version_text(bin: &Path) -> Result<String, NginxError> {
    let output = Command::new(bin)
        .arg("-V")
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running {} -V", bin.display())))?;
    Ok(String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout))
}

/// Sends the master a signal by name, as `kill -NAME` does (std's `Child`
/// can only SIGKILL).
fn signal(child: &Child, name: &str) -> Result<(), NginxError> {
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .map_err(io(format!("kill -{name}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(NginxError::Io {
            what: format!("kill -{name} {}", child.id()),
            source: std::io::Error::other(status.to_string()),
        })
    }
}

/// One `GET READY_PATH` on a new connection; the body, if one came.
async fn probe(port: u16) -> Option<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let request = format!("GET {READY_PATH} HTTP/1.0\r\nHost: tollgate-limiter\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_says_how_to_install_one() {
        let err = find(Some(Path::new("/nonexistent/nginx")))
            .expect_err("absent")
            .to_string();
        assert!(err.contains("apt-get install nginx-light"), "{err}");
        assert!(err.contains("/nonexistent/nginx"), "{err}");
        let none = NginxError::NotFound.to_string();
        assert!(none.contains("apt-get install nginx-light"), "{none}");
        assert!(none.contains("/usr/sbin/nginx"), "{none}");
    }
}
