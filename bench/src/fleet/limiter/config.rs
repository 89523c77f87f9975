//! nginx's two configurations for a run, as text: the limiter
//! (`limit_req` at R requests/s with burst B, `nodelay`, 429 with
//! `Retry-After: 1`) and the outage (429 to everything with `Retry-After`
//! the outage's length), both with every file nginx writes inside the
//! run's folder and an access log that names the configuration which
//! answered each request. Pure text: tested without nginx.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

/// The path nginx answers readiness on; not rate-limited, not logged.
pub(super) const READY_PATH: &str = "/__tollgate_ready";

/// The one limit_req zone. Declared in both configurations with the same
/// size, so nginx keeps its state across the reloads (as it keeps any
/// zone whose name and size are unchanged).
const ZONE: &str = "zone=tollgate:1m";

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

/// A configuration that cannot be written.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The run's folder cannot be written into an nginx configuration as is.
    #[error(
        "{0}: not a plain path for an nginx configuration (no quotes, `$`, `;`, braces, \
         backslashes or whitespace); set TMPDIR to one"
    )]
    Path(PathBuf),
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
    /// B: `limit_req`'s `burst` (0: none, nginx's default).
    pub burst: u32,
    /// Requests within the burst are delayed to 1/R apart (no `nodelay`).
    pub delay: bool,
    /// The outage's `Retry-After`, whole seconds.
    pub outage_retry_after_s: u64,
    /// Answered on the readiness path, so readiness is this run's nginx.
    pub nonce: u64,
    /// Whether nginx starts as root: then `user root;` keeps its workers
    /// the current user (nginx would switch them to `nobody`, who cannot
    /// write into the run's folder). As anyone else it cannot switch.
    pub as_root: bool,
    /// From [`temp_paths`].
    pub temp_paths: Vec<&'static str>,
}

/// The `limit_req` directive for burst `burst`, without its `;`. nginx
/// refuses `burst=0`: no burst is the parameter left out (its default), and
/// `nodelay` means nothing without one.
pub fn limit_req(burst: u32, delay: bool) -> String {
    let mut directive = "limit_req zone=tollgate".to_owned();
    if burst > 0 {
        directive.push_str(&format!(" burst={burst}"));
        if !delay {
            directive.push_str(" nodelay");
        }
    }
    directive
}

impl Site {
    /// The configuration for `phase`, as nginx reads it.
    pub fn config(&self, phase: Phase) -> Result<String, ConfigError> {
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
                    "            {};",
                    limit_req(self.burst, self.delay)
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

    pub(super) fn conf(&self, phase: Phase) -> PathBuf {
        self.dir.join(format!("{}.conf", phase.as_str()))
    }

    pub(super) fn live_conf(&self) -> PathBuf {
        self.dir.join("nginx.conf")
    }
}

/// A path nginx reads as one literal token: UTF-8 without the characters
/// its parser or its variable interpolation would treat specially.
fn plain(path: &Path) -> Result<&str, ConfigError> {
    let text = path.to_str().unwrap_or("\"");
    let special = |c: char| c.is_whitespace() || "\"'$;{}\\#".contains(c);
    if text.is_empty() || text.contains(special) {
        return Err(ConfigError::Path(path.to_owned()));
    }
    Ok(text.trim_end_matches('/'))
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
            delay: false,
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
    fn no_burst_is_the_parameter_left_out() {
        let site = Site { burst: 0, ..site() };
        let text = site.config(Phase::Limit).expect("config");
        assert!(text.contains("limit_req zone=tollgate;\n"), "{text}");
        assert!(!text.contains("burst="), "nginx refuses burst=0:\n{text}");
    }

    #[test]
    fn a_delayed_burst_leaves_nodelay_out() {
        let site = Site {
            delay: true,
            ..site()
        };
        let text = site.config(Phase::Limit).expect("config");
        assert!(
            text.contains("limit_req zone=tollgate burst=20;\n"),
            "{text}"
        );
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
                matches!(site.config(Phase::Limit), Err(ConfigError::Path(_))),
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
}
