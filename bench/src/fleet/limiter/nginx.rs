//! nginx as the upstream: finding the binary, the two configurations it
//! switches between (the limiter and the outage) as text, and one running
//! master whose configuration is switched by a real reload (SIGHUP).
//!
//! Everything nginx writes lives in the run's own folder: its pid file,
//! error and access logs, client temp paths, the static file it serves.
//! It runs in the foreground (`daemon off`, a master and one worker
//! process) as the current user, on a loopback port, and is only taken for
//! ready once it answers a request on that port with this run's nonce and
//! the phase expected, so a stale nginx or another program on the port is
//! never mistaken for it. The same check after a reload says when the new
//! configuration is in force.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Where nginx is looked for when it is not on `PATH`: Debian's and
/// Ubuntu's package put it there, outside a normal user's `PATH`.
const SBIN_NGINX: &str = "/usr/sbin/nginx";

/// The path nginx answers readiness on; not rate-limited, not logged.
const READY_PATH: &str = "/__tollgate_ready";

/// The one limit_req zone. Declared in both configurations with the same
/// size, so nginx keeps its state across the reloads (as it keeps any
/// zone whose name and size are unchanged).
const ZONE: &str = "zone=tollgate:1m";

/// How long nginx may take to start or to put a reload in force.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Which configuration is in force. Each writes its name into every
/// access-log line, so a line says itself whether it fell in the outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// `limit_req` at R requests/s with burst B; `Retry-After: 1` on 429.
    Limit,
    /// Every request answered 429 with `Retry-After` the outage's length.
    Outage,
}

impl Phase {
    /// The word in the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Limit => "limit",
            Phase::Outage => "outage",
        }
    }

    /// The phase a log word names.
    pub fn from_log(word: &str) -> Option<Phase> {
        [Phase::Limit, Phase::Outage]
            .into_iter()
            .find(|phase| phase.as_str() == word)
    }
}

/// What can go wrong with nginx.
#[derive(Debug, Error)]
pub enum NginxError {
    /// No binary to run.
    #[error(
        "nginx not found on PATH or at {SBIN_NGINX}: install it (Debian/Ubuntu: \
         `apt-get install nginx-light`, or `nginx`), or pass --nginx PATH"
    )]
    NotFound,
    /// The run's folder cannot be written into an nginx configuration as is.
    #[error(
        "{0}: not a plain path for an nginx configuration (no quotes, `$`, `;`, braces, \
         backslashes or whitespace); set TMPDIR to one"
    )]
    Path(PathBuf),
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
/// `PATH`, else [`SBIN_NGINX`].
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, NginxError> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_owned())
        } else {
            Err(NginxError::NotFound)
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

/// The temp-path directives this nginx knows, from its `nginx -V` text: a
/// module built `--without-…` has no directive, and naming it would be a
/// configuration error. Each one not set would default to a system folder
/// (`/var/lib/nginx/…`) that nginx tries to create at start.
pub fn temp_paths(version_text: &str) -> Vec<&'static str> {
    [
        ("client_body_temp_path", None),
        ("proxy_temp_path", Some("--without-http_proxy_module")),
        ("fastcgi_temp_path", Some("--without-http_fastcgi_module")),
        ("uwsgi_temp_path", Some("--without-http_uwsgi_module")),
        ("scgi_temp_path", Some("--without-http_scgi_module")),
    ]
    .into_iter()
    .filter(|(_, without)| without.is_none_or(|flag| !version_text.contains(flag)))
    .map(|(directive, _)| directive)
    .collect()
}

/// Everything both configurations of one run share.
#[derive(Debug, Clone)]
pub struct Site {
    /// The run's folder: nginx's prefix, and where every file it writes is.
    pub dir: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
    /// R, requests/s: `limit_req_zone`'s `rate`, a whole number in nginx.
    pub rate: u32,
    /// B: `limit_req`'s `burst`.
    pub burst: u32,
    /// The outage's `Retry-After`, whole seconds.
    pub outage_retry_after_s: u64,
    /// Answered on [`READY_PATH`], so readiness is this run's nginx.
    pub nonce: u64,
    /// Whether nginx starts as root: then `user root;` keeps its workers
    /// the current user (nginx would switch them to `nobody`, who cannot
    /// write into the run's folder). As anyone else it cannot switch.
    pub as_root: bool,
    /// From [`temp_paths`].
    pub temp_paths: Vec<&'static str>,
}

impl Site {
    /// The configuration for `phase`, as nginx reads it.
    pub fn config(&self, phase: Phase) -> Result<String, NginxError> {
        let dir = plain(&self.dir)?;
        let mut text = String::new();
        // Writing into a String cannot fail.
        let mut line = |s: &str| {
            let _ = writeln!(text, "{s}");
        };
        line(&format!(
            "# tollgate-bench limiter: the {} configuration.",
            phase.as_str()
        ));
        if self.as_root {
            line("user root;");
        }
        line("daemon off;");
        line("master_process on;");
        line("worker_processes 1;");
        line(&format!("pid {dir}/nginx.pid;"));
        line(&format!("error_log {dir}/error.log notice;"));
        line("events {\n    worker_connections 4096;\n}");
        line("http {");
        for directive in &self.temp_paths {
            let name = directive.trim_end_matches("_temp_path");
            line(&format!("    {directive} {dir}/temp/{name};"));
        }
        // The phase is a literal in the format: each configuration stamps
        // its own lines.
        line(&format!(
            "    log_format tollgate '$msec $request_time $status {} \
             $http_x_tollgate_deadline_unix_ms';",
            phase.as_str()
        ));
        line(&format!("    access_log {dir}/access.log tollgate;"));
        line("    keepalive_timeout 65s;");
        line("    keepalive_requests 1000000;");
        // One bucket for every client: the key is the same for all.
        line(&format!(
            "    limit_req_zone $server_name {ZONE} rate={}r/s;",
            self.rate
        ));
        line("    server {");
        line(&format!("        listen 127.0.0.1:{};", self.port));
        line("        server_name tollgate-limiter;");
        line(&format!("        root {dir}/html;"));
        // `return` runs before limit_req: readiness is never limited.
        line(&format!(
            "        location = {READY_PATH} {{\n            access_log off;\n            \
             return 200 \"{} {}\\n\";\n        }}",
            self.nonce,
            phase.as_str()
        ));
        match phase {
            Phase::Limit => {
                // try_files runs after limit_req, so the file is limited;
                // nginx sends no Retry-After of its own, hence the named
                // location.
                line("        location / {");
                line(&format!(
                    "            limit_req zone=tollgate burst={} nodelay;",
                    self.burst
                ));
                line("            limit_req_status 429;");
                line("            error_page 429 @limited;");
                line("            try_files /ok.txt =404;");
                line("        }");
                line("        location @limited {");
                line("            add_header Retry-After 1 always;");
                line("            return 429;");
                line("        }");
            }
            Phase::Outage => {
                line("        location / {");
                line(&format!(
                    "            add_header Retry-After {} always;",
                    self.outage_retry_after_s
                ));
                line("            return 429;");
                line("        }");
            }
        }
        line("    }");
        line("}");
        Ok(text)
    }

    fn conf(&self, phase: Phase) -> PathBuf {
        self.dir.join(format!("{}.conf", phase.as_str()))
    }

    fn live_conf(&self) -> PathBuf {
        self.dir.join("nginx.conf")
    }
}

/// A path nginx reads as one literal token: UTF-8 without the characters
/// its parser or its variable interpolation would treat specially.
fn plain(path: &Path) -> Result<&str, NginxError> {
    let text = path.to_str().unwrap_or("\"");
    let special = |c: char| c.is_whitespace() || "\"'$;{}\\#".contains(c);
    if text.is_empty() || text.contains(special) {
        return Err(NginxError::Path(path.to_owned()));
    }
    Ok(text.trim_end_matches('/'))
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

/// `nginx -V`'s text (it prints to stderr), for [`temp_paths`].
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

    fn site() -> Site {
        Site {
            dir: PathBuf::from("/tmp/tollgate-limiter-1/coordinated"),
            port: 18080,
            rate: 200,
            burst: 20,
            outage_retry_after_s: 3,
            nonce: 42,
            as_root: false,
            temp_paths: temp_paths(""),
        }
    }

    #[test]
    fn the_limiter_is_limit_req_with_a_retry_after_on_429() {
        let text = site().config(Phase::Limit).expect("config");
        for expected in [
            "daemon off;",
            "pid /tmp/tollgate-limiter-1/coordinated/nginx.pid;",
            "error_log /tmp/tollgate-limiter-1/coordinated/error.log notice;",
            "client_body_temp_path /tmp/tollgate-limiter-1/coordinated/temp/client_body;",
            "scgi_temp_path /tmp/tollgate-limiter-1/coordinated/temp/scgi;",
            "log_format tollgate '$msec $request_time $status limit $http_x_tollgate_deadline_unix_ms';",
            "access_log /tmp/tollgate-limiter-1/coordinated/access.log tollgate;",
            "limit_req_zone $server_name zone=tollgate:1m rate=200r/s;",
            "listen 127.0.0.1:18080;",
            "limit_req zone=tollgate burst=20 nodelay;",
            "limit_req_status 429;",
            "error_page 429 @limited;",
            "try_files /ok.txt =404;",
            "add_header Retry-After 1 always;",
            "return 200 \"42 limit\\n\";",
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
        assert!(!text.contains("user "), "not root: no user directive");
        let open = text.matches('{').count();
        assert_eq!(open, text.matches('}').count(), "balanced:\n{text}");
    }

    #[test]
    fn the_outage_refuses_everything_with_its_length_and_keeps_the_zone() {
        let text = site().config(Phase::Outage).expect("config");
        assert!(text.contains("add_header Retry-After 3 always;\n            return 429;"));
        assert!(text.contains("$status outage $http_x_tollgate_deadline_unix_ms"));
        assert!(text.contains("return 200 \"42 outage\\n\";"));
        assert!(
            text.contains("limit_req_zone $server_name zone=tollgate:1m rate=200r/s;"),
            "the zone outlives the outage"
        );
        assert!(
            !text.contains("limit_req zone="),
            "nothing is limited, all refused"
        );
    }

    #[test]
    fn as_root_the_workers_stay_root() {
        let mut site = site();
        site.as_root = true;
        let text = site.config(Phase::Limit).expect("config");
        assert!(text.contains("\nuser root;\n"), "{text}");
    }

    #[test]
    fn modules_built_without_get_no_temp_path() {
        let version = "configure arguments: --without-http_uwsgi_module --without-http_scgi_module";
        assert_eq!(
            temp_paths(version),
            vec![
                "client_body_temp_path",
                "proxy_temp_path",
                "fastcgi_temp_path"
            ]
        );
        let mut site = site();
        site.temp_paths = temp_paths(version);
        let text = site.config(Phase::Limit).expect("config");
        assert!(!text.contains("uwsgi"), "{text}");
    }

    #[test]
    fn a_folder_nginx_would_misread_is_refused() {
        for dir in [
            "/tmp/a b",
            "/tmp/$x",
            "/tmp/a;b",
            "/tmp/\"q\"",
            "/tmp/{x}",
            "",
        ] {
            let mut site = site();
            site.dir = PathBuf::from(dir);
            assert!(
                matches!(site.config(Phase::Limit), Err(NginxError::Path(_))),
                "{dir:?}"
            );
        }
    }

    #[test]
    fn phases_read_back_from_the_log() {
        for phase in [Phase::Limit, Phase::Outage] {
            assert_eq!(Phase::from_log(phase.as_str()), Some(phase));
        }
        assert_eq!(Phase::from_log("maintenance"), None);
    }

    #[test]
    fn a_missing_explicit_binary_says_how_to_install_one() {
        let err = find(Some(Path::new("/nonexistent/nginx"))).expect_err("absent");
        assert!(
            err.to_string().contains("apt-get install nginx-light"),
            "{err}"
        );
    }
}
