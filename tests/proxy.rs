//! `tollgate proxy` end to end, driven by clients that are not Rust: curl
//! and Python's standard library (urllib, http.client), through proxies
//! started as the shipped binary, against a real coordinator (`tollgate
//! serve`) and a real rate-limited HTTP upstream this test runs.
//!
//! Every server binds port 0 and the test reads the bound address from
//! its log. Each test has its own coordinator, upstream and proxies, so
//! none reads another's state. A missing curl or python3 fails the test
//! under CI (or with `TOLLGATE_REQUIRE_PROXY_CLIENTS=1`) and is a notice
//! elsewhere.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tollgate_proto::v1::{self, admin_client::AdminClient};

#[path = "support/process.rs"]
mod process;
#[path = "support/tls.rs"]
mod tls;

use process::{BIN, Launched, Served, launch, logged_address, refusing_address, temp_dir};
use tls::Ca;

/// The penalty the upstream's limiter imposes, and the `Retry-After` it
/// sends with it.
const PENALTY: Duration = Duration::from_secs(3);
/// How long anything pushed (a report, a Watch event) may take: far beyond
/// any latency, so only a missing mechanism fails.
const BOUND: Duration = Duration::from_secs(10);
/// How long the upstream's `/slow` takes to answer: longer than any
/// deadline the tests give it.
const SLOW: Duration = Duration::from_secs(2);

// ---- the upstream --------------------------------------------------------

/// One request the upstream saw.
#[derive(Debug, Clone)]
struct Hit {
    path: String,
    method: String,
    /// The `x-from` header: which client sent it.
    from: String,
    /// The HTTP version it came over.
    version: String,
    /// When its head arrived.
    at: Instant,
    /// When its body was read to the end, and its length.
    body_done: Option<(Instant, usize)>,
}

/// Fixed-window limiter with a penalty box: at most `limit` requests per
/// second on `/limited`; the one over it draws `429 Retry-After: 3` and
/// every request for the next 3 s is refused the same way.
#[derive(Debug)]
struct Limiter {
    limit: u32,
    window: Option<(Instant, u32)>,
    penalty_until: Option<Instant>,
}

#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    /// `https` when it serves TLS.
    scheme: &'static str,
    hits: Arc<Mutex<Vec<Hit>>>,
    limiter: Arc<Mutex<Limiter>>,
    /// When the limiter last started a penalty.
    tripped: Arc<Mutex<Option<Instant>>>,
}

impl Upstream {
    /// Serves plaintext on `127.0.0.1:0` until the test's runtime ends.
    async fn start(limit: u32) -> Upstream {
        Upstream::serve(limit, None).await
    }

    /// Serves TLS, with a certificate for `127.0.0.1` that `ca` signs and
    /// HTTP/2 offered by ALPN, as a public API does.
    async fn start_tls(limit: u32, ca: &Ca) -> Upstream {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = ca.leaf(&["127.0.0.1"]);
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate");
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Upstream::serve(
            limit,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    async fn serve(limit: u32, tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let upstream = Upstream {
            addr: listener.local_addr().expect("addr"),
            scheme: if tls.is_some() { "https" } else { "http" },
            hits: Arc::default(),
            limiter: Arc::new(Mutex::new(Limiter {
                limit,
                window: None,
                penalty_until: None,
            })),
            tripped: Arc::default(),
        };
        let serving = upstream.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let upstream = serving.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => upstream.connection(stream).await,
                        // A handshake the proxy refuses ends here: no
                        // request of it is ever a hit.
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                upstream.connection(stream).await;
                            }
                        }
                    }
                });
            }
        });
        upstream
    }

    async fn connection<IO>(self, io: IO)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |request| {
            let upstream = self.clone();
            async move { Ok::<_, Infallible>(upstream.answer(request).await) }
        });
        let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(TokioIo::new(io), service)
            .await;
    }

    fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().expect("hits").clone()
    }

    fn count(&self, path: &str) -> usize {
        self.hits().iter().filter(|h| h.path == path).count()
    }

    async fn answer(&self, request: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let at = Instant::now();
        let path = request.uri().path().to_owned();
        let index = {
            let mut hits = self.hits.lock().expect("hits");
            hits.push(Hit {
                path: path.clone(),
                method: request.method().to_string(),
                from: request
                    .headers()
                    .get("x-from")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
                version: format!("{:?}", request.version()),
                at,
                body_done: None,
            });
            hits.len() - 1
        };
        // The whole body first, as a real service reads its request.
        let length = match request.into_body().collect().await {
            Ok(body) => body.to_bytes().len(),
            Err(_) => 0,
        };
        self.hits.lock().expect("hits")[index].body_done = Some((Instant::now(), length));
        let reply = |status: u16, retry_after: Option<u64>| {
            let mut response = hyper::Response::new(Full::new(Bytes::from_static(b"upstream\n")));
            *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", hyper::header::HeaderValue::from(secs));
            }
            response
        };
        match path.as_str() {
            "/limited" => {
                let mut limiter = self.limiter.lock().expect("limiter");
                let now = Instant::now();
                if limiter.penalty_until.is_some_and(|until| now < until) {
                    return reply(429, Some(PENALTY.as_secs()));
                }
                let (start, count) = match limiter.window {
                    Some((start, count)) if now < start + Duration::from_secs(1) => {
                        (start, count + 1)
                    }
                    _ => (now, 1),
                };
                limiter.window = Some((start, count));
                if count > limiter.limit {
                    limiter.penalty_until = Some(now + PENALTY);
                    *self.tripped.lock().expect("tripped") = Some(now);
                    return reply(429, Some(PENALTY.as_secs()));
                }
                reply(200, None)
            }
            "/closed" | "/wrong" => reply(429, Some(2)),
            // A gRPC server out of capacity: a trailers-only UNAVAILABLE,
            // which an HTTP client would read as a 200.
            "/pkg.Svc/Get" => {
                let mut response = reply(200, None);
                let headers = response.headers_mut();
                headers.insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/grpc"),
                );
                headers.insert("grpc-status", hyper::header::HeaderValue::from_static("14"));
                response
            }
            "/unavailable" => reply(503, None),
            "/slow" => {
                tokio::time::sleep(SLOW).await;
                reply(200, None)
            }
            "/flaky" => {
                if self.count("/flaky") == 1 {
                    reply(503, None)
                } else {
                    reply(200, None)
                }
            }
            _ => reply(200, None),
        }
    }
}

// ---- the coordinator and the proxies --------------------------------------

/// The fleet's policy: the services behind these proxies trust each
/// other's hints on `GET /limited` (one worker's `Retry-After` is enough
/// to hold the others; the default asks several to agree).
const POLICY: &str = r#"
[[rule]]
route = "GET /limited"
corroborate_workers = 1
"#;

fn coordinator(dir: &Path) -> Served {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).expect("policy file");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&policy);
    Served::spawn(command, &dir.join("serve.log"))
}

/// A coordinator on its defaults: one worker's hint holds the others'
/// retries at once, their first attempts once another worker agrees.
fn coordinator_on_defaults(dir: &Path) -> Served {
    let mut command = Command::new(BIN);
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    Served::spawn(command, &dir.join("serve.log"))
}

/// The caller token of the fleet's scope, and the on-call admin token, in
/// [`coordinator_with_tokens`].
const FLEET_TOKEN: &str = "token-of-the-fleet";
const ADMIN_TOKEN: &str = "admin-of-the-test";
/// What a proxy's log says when the coordinator refused one of its
/// reports (the client's lease background task writes it).
const REPORT_REFUSED: &str = "report refused; dropping it";
/// What a proxy's log says when its link to the coordinator failed and
/// it uses its local fallback budget.
const FELL_BACK: &str = "coordinator unreachable; using the local fallback budget";

/// A coordinator that requires caller tokens: [`FLEET_TOKEN`] for the
/// `fleet` caller scope, [`ADMIN_TOKEN`] to read its scopes.
fn coordinator_with_tokens(dir: &Path) -> Served {
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[token]]\ntoken = \"{FLEET_TOKEN}\"\ncaller_scopes = [\"fleet\"]\n\n\
             [[admin_token]]\nname = \"oncall\"\ntoken = \"{ADMIN_TOKEN}\"\n"
        ),
    )
    .expect("policy");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&policy);
    Served::spawn(command, &dir.join("serve.log"))
}

/// What nearly every test starts from: a folder of its own, a coordinator
/// (`coordinator` starts it there) and a plaintext upstream allowing
/// `limit` requests a second.
struct World {
    dir: PathBuf,
    coordinator: Served,
    upstream: Upstream,
}

impl World {
    /// `None` when curl or python3 is missing and the test may skip (never
    /// under CI: see [`clients_present`]).
    async fn start(
        name: &str,
        limit: u32,
        coordinator: impl FnOnce(&Path) -> Served,
    ) -> Option<World> {
        if !clients_present() {
            return None;
        }
        let dir = dir(name);
        let coordinator = coordinator(&dir);
        let upstream = Upstream::start(limit).await;
        Some(World {
            dir,
            coordinator,
            upstream,
        })
    }

    /// A proxy named `name` in front of the upstream, talking to the
    /// coordinator; `[top, link, extra]` as [`Proxy::start_with`].
    fn proxy(&self, name: &str, parts: [&str; 3]) -> Proxy {
        let (coordinator, upstream) = (self.coordinator.url(), self.upstream.url());
        Proxy::start_with(&self.dir, name, &coordinator, &upstream, parts)
    }

    /// Two proxies, A and B, in front of `GET /limited`, both warmed (each
    /// knows the scope and watches it); then A bursts past the limit in a
    /// fresh window and its last request draws the penalty, which becomes
    /// the fleet's cooldown.
    async fn tripped_by_a(&self) -> Tripped {
        let routes = "[[listener.route]]\nroute = \"GET /limited\"\n";
        let a = self.proxy("a", ["", "", routes]);
        let b = self.proxy("b", ["", "", routes]);
        let warm_a = curl(&["-H", "x-from: a", &a.url("/limited")]).await;
        let (_, warm_b) = python_get(&b.url("/limited"), 10.0, &["x-from: b"]).await;
        assert_eq!(warm_a.status, 200, "{warm_a:?}");
        assert_eq!(warm_b.expect("python answered").status, 200);
        tokio::time::sleep(Duration::from_millis(1100)).await; // a fresh window

        let burst = tokio::spawn({
            let url = a.url("/limited");
            async move {
                let mut answers = Vec::new();
                for _ in 0..3 {
                    answers.push(curl(&["-H", "x-from: a", &url]).await);
                }
                answers
            }
        });
        let upstream = &self.upstream;
        eventually("the upstream's penalty", async || {
            upstream.tripped.lock().expect("tripped").is_some()
        })
        .await;
        let tripped = upstream.tripped.lock().expect("tripped").expect("tripped");
        eventually("the fleet's cooldown", async || {
            cooldown(&self.coordinator, "GET /limited").await > 0
        })
        .await;
        Tripped {
            a,
            b,
            tripped,
            burst,
        }
    }
}

/// What [`World::tripped_by_a`] leaves: the two proxies, when the
/// upstream's penalty began, and A's burst (its answers once it ends).
struct Tripped {
    a: Proxy,
    b: Proxy,
    tripped: Instant,
    burst: tokio::task::JoinHandle<Vec<Answer>>,
}

/// A running `tollgate proxy` and the address of its one listener.
struct Proxy {
    run: Launched,
    addr: SocketAddr,
}

impl Proxy {
    /// Starts a proxy with one listener `api` in front of `upstream`,
    /// talking to `coordinator`; `extra` goes into the listener's table.
    fn start(dir: &Path, name: &str, coordinator: &str, upstream: &str, extra: &str) -> Proxy {
        Proxy::start_with(dir, name, coordinator, upstream, ["", "", extra])
    }

    /// As [`Proxy::start`], with `[top, link, extra]`: `top` at the top of
    /// the file (`drain`, an `[admin]` table), `link` in `[coordinator]`.
    fn start_with(
        dir: &Path,
        name: &str,
        coordinator: &str,
        upstream: &str,
        [top, link, extra]: [&str; 3],
    ) -> Proxy {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"
{top}
[coordinator]
endpoint = "{coordinator}"
worker_id = "{name}"
rpc_timeout = "500ms"
{link}

[[listener]]
name = "api"
listen = "127.0.0.1:0"
upstream = "{upstream}"
caller_scope = "fleet"
{extra}
"#
            ),
        )
        .expect("write the proxy's file");
        let mut command = Command::new(BIN);
        command
            .args(["proxy", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            // The shell's own would name the proxy's telemetry instead.
            .env_remove("OTEL_SERVICE_NAME");
        let mut run = launch(command, &dir.join(format!("{name}.log")));
        let give_up = Instant::now() + BOUND;
        loop {
            let log = std::fs::read_to_string(&run.log).unwrap_or_default();
            if let Some(addr) = logged_address(&log, tollgate::proxy::LISTENING) {
                return Proxy { run, addr };
            }
            if let Ok(Some(status)) = run.child.try_wait() {
                panic!("tollgate proxy exited ({status}):\n{}", run.whole_log());
            }
            assert!(
                Instant::now() < give_up,
                "proxy did not log its address:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The admin listener's address, from the log: it is logged after the
    /// listeners [`Proxy::start_with`] waits for, so it may come a moment
    /// later.
    fn admin_address(&mut self) -> SocketAddr {
        let give_up = Instant::now() + BOUND;
        loop {
            if let Some(addr) = logged_address(&self.log(), tollgate::proxy::ADMIN_LISTENING) {
                return addr;
            }
            assert!(
                Instant::now() < give_up,
                "proxy did not log its admin address:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&mut self) -> String {
        self.run.whole_log()
    }
}

// ---- the clients -----------------------------------------------------------

/// What a client got: the status, the headers (lower-case names) and
/// when its process ended, the answer read.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    at: Instant,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// Whether curl and python3 are here; required under CI.
fn clients_present() -> bool {
    for (tool, args) in [("curl", ["--version"]), ("python3", ["--version"])] {
        if !Command::new(tool)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            tollgate_testkit::missing_tool(
                tool,
                "TOLLGATE_REQUIRE_PROXY_CLIENTS",
                "apt-get install curl python3",
            );
            return false;
        }
    }
    true
}

/// `curl -i` with `args`: status line, headers, body.
async fn curl(args: &[&str]) -> Answer {
    let output = tokio::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "30"])
        .args(args)
        .output()
        .await
        .expect("run curl");
    let at = Instant::now();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_head(&text, at)
}

fn parse_head(text: &str, at: Instant) -> Answer {
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        at,
    }
}

/// Python's urllib: prints the status and headers as `curl -i` would.
const PY_GET: &str = r#"
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers=dict(h.split(':', 1) for h in sys.argv[3:]))
try:
    r = urllib.request.urlopen(req, timeout=float(sys.argv[2]))
    status, headers = r.status, r.headers
    r.read()
except urllib.error.HTTPError as e:
    status, headers = e.code, e.headers
print('HTTP/1.1 %d x' % status)
for k, v in headers.items():
    print('%s: %s' % (k, v))
"#;

async fn python_get(url: &str, timeout: f64, headers: &[&str]) -> (bool, Option<Answer>) {
    let output = tokio::process::Command::new("python3")
        .args(["-c", PY_GET, url, &timeout.to_string()])
        .args(headers)
        .output()
        .await
        .expect("run python3");
    let at = Instant::now();
    let ok = output.status.success();
    let answer = ok.then(|| parse_head(&String::from_utf8_lossy(&output.stdout), at));
    (ok, answer)
}

/// Polls `check` every 20 ms until it holds or [`BOUND`] passes.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let give_up = Instant::now() + BOUND;
    while !check().await {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The coordinator's cooldown for `(fleet, route)`, in Unix ms (0: none).
async fn cooldown(coordinator: &Served, route: &str) -> i64 {
    cooldown_as(coordinator, route, None).await
}

/// The same, asked with an admin token.
async fn cooldown_as(coordinator: &Served, route: &str, admin_token: Option<&str>) -> i64 {
    let endpoint = tonic::transport::Endpoint::from_shared(coordinator.url()).expect("endpoint");
    cooldown_at(endpoint, route, admin_token).await
}

/// The same, asked at `endpoint` (which may speak TLS).
async fn cooldown_at(
    endpoint: tonic::transport::Endpoint,
    route: &str,
    admin_token: Option<&str>,
) -> i64 {
    let Ok(channel) = endpoint.connect().await else {
        return 0;
    };
    let mut admin = AdminClient::new(channel);
    let mut request = tonic::Request::new(v1::GetScopeRequest {
        caller_scope: "fleet".into(),
        route: route.into(),
    });
    if let Some(token) = admin_token
        && let Ok(value) = format!("Bearer {token}").parse()
    {
        request.metadata_mut().insert("authorization", value);
    }
    admin
        .get_scope(request)
        .await
        .map_or(0, |r| r.into_inner().cooldown_until_unix_ms)
}

/// How distinct workers support the route's cooldown (`None`: the
/// coordinator did not answer).
async fn evidence(coordinator: &Served, route: &str) -> Option<v1::EvidenceState> {
    let endpoint = tonic::transport::Endpoint::from_shared(coordinator.url()).expect("endpoint");
    let channel = endpoint.connect().await.ok()?;
    let scope = AdminClient::new(channel)
        .get_scope(v1::GetScopeRequest {
            caller_scope: "fleet".into(),
            route: route.into(),
        })
        .await
        .ok()?;
    scope.into_inner().route_evidence
}

fn dir(name: &str) -> PathBuf {
    temp_dir(&format!("proxy-{name}"))
}

// ---- the tests -------------------------------------------------------------

/// Two services of one fleet, each behind its own proxy: the `Retry-After`
/// that service A's request draws becomes the fleet's cooldown, and
/// service B's requests wait it out in B's proxy instead of reaching the
/// upstream while it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_one_proxy_draws_holds_the_other_proxys_requests() {
    let Some(world) = World::start("hold", 2, coordinator).await else {
        return;
    };
    let dir = &world.dir;
    let upstream = &world.upstream;
    let Tripped {
        a,
        mut b,
        tripped,
        burst,
    } = world.tripped_by_a().await;
    // Watch pushes the cooldown to B's proxy well within this.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tripped.elapsed() < PENALTY - Duration::from_millis(500),
        "the machine is too slow for this test's timing: {:?}",
        tripped.elapsed()
    );

    // Service B, in Python, while the upstream refuses.
    let (ok, answer) = python_get(&b.url("/limited"), 20.0, &["x-from: b"]).await;
    let answer = answer.unwrap_or_else(|| panic!("python failed ({ok}):\n{}", b.log()));
    assert_eq!(answer.status, 200, "{answer:?}\n{}", b.log());
    let during: Vec<Hit> = upstream
        .hits()
        .into_iter()
        .filter(|h| h.from == "b" && h.at > tripped && h.at < tripped + PENALTY)
        .collect();
    assert!(
        during.is_empty(),
        "B's proxy sent {} request(s) into the penalty: {during:?}",
        during.len()
    );
    assert_eq!(answer.header("tollgate-outcome"), "succeeded");
    assert_eq!(answer.header("tollgate-attempts"), "1", "{answer:?}");
    let waited: u64 = answer.header("tollgate-waited-ms").parse().expect("waited");
    assert!(waited >= 1000, "B waited out the cooldown: {answer:?}");
    assert_eq!(answer.header("tollgate-coordinator"), "connected");

    let burst = burst.await.expect("burst");
    assert!(
        burst.iter().all(|a| a.status == 200),
        "A's requests end well: {burst:?}"
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(dir);
}

/// The same fleet on the coordinator's defaults, which ask distinct workers
/// to agree before one worker's hint holds everyone's first attempts: B's
/// first request during the penalty reaches the upstream once, and its 429
/// is the agreement — B's next request waits in B's proxy, and the first
/// one's retry waits out the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_defaults_the_other_proxy_sends_one_request_into_the_penalty_then_holds() {
    let Some(world) = World::start("hold-defaults", 2, coordinator_on_defaults).await else {
        return;
    };
    let dir = &world.dir;
    let coordinator = &world.coordinator;
    let upstream = &world.upstream;
    let Tripped {
        a,
        mut b,
        tripped,
        burst,
    } = world.tripped_by_a().await;

    // B's first request: one attempt into the penalty, whose 429 agrees
    // with A's.
    let first = tokio::spawn(python_get_owned(b.url("/limited"), "x-from: b1"));
    eventually("B's first attempt answered", async || {
        upstream.hits().iter().any(|h| h.from == "b1")
    })
    .await;
    eventually("the cooldown corroborated", async || {
        evidence(coordinator, "GET /limited")
            .await
            .is_some_and(|e| e.corroborated)
    })
    .await;
    // Watch pushes the hold to B's proxy well within this.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tripped.elapsed() < PENALTY - Duration::from_millis(500),
        "the machine is too slow for this test's timing: {:?}",
        tripped.elapsed()
    );
    let (ok, second) = python_get(&b.url("/limited"), 20.0, &["x-from: b2"]).await;
    let second = second.unwrap_or_else(|| panic!("python failed ({ok}):\n{}", b.log()));
    let (ok, first) = first.await.expect("join");
    let first = first.unwrap_or_else(|| panic!("python failed ({ok}):\n{}", b.log()));

    let during = |from: &str| {
        upstream
            .hits()
            .into_iter()
            .filter(|h| h.from == from && h.at > tripped && h.at < tripped + PENALTY)
            .count()
    };
    assert_eq!(
        during("b1"),
        1,
        "B's first request: one attempt into the penalty"
    );
    assert_eq!(
        during("b2"),
        0,
        "B's next request waits in its proxy\n{}",
        b.log()
    );
    for answer in [&first, &second] {
        assert_eq!(answer.status, 200, "{answer:?}\n{}", b.log());
        assert_eq!(answer.header("tollgate-outcome"), "succeeded");
    }
    // (After the penalty the waiting requests of both services meet the
    // upstream's 2/s again, so either may be refused once more.)
    let attempts: u32 = first.header("tollgate-attempts").parse().expect("attempts");
    assert!(
        attempts >= 2,
        "B's first request was refused once: {first:?}"
    );
    let burst = burst.await.expect("burst");
    assert!(
        burst.iter().all(|a| a.status == 200),
        "A's requests end well: {burst:?}"
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(dir);
}

async fn python_get_owned(url: String, header: &'static str) -> (bool, Option<Answer>) {
    python_get(&url, 20.0, &[header]).await
}

/// A request's deadline bounds the gate: a hint longer than what is left
/// ends it with the upstream's response at once, and an attempt is never
/// given more than fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_deadline_is_honoured() {
    let Some(world) = World::start("deadline", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let proxy = world.proxy("p", ["", "", ""]);

    // `Retry-After: 2` cannot be waited out in one second: the service gets
    // the 429 now, not a retry after its deadline.
    let answer = curl(&["-H", "request-timeout: 1", &proxy.url("/closed")]).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.header("tollgate-outcome"), "deadline_infeasible");
    assert_eq!(answer.header("retry-after"), "2");
    // The gate's own account: it did not wait, not for the hint and not
    // for the deadline (waiting to either would be a second or more).
    let waited: u64 = answer.header("tollgate-waited-ms").parse().expect("waited");
    assert!(waited < 1000, "{answer:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        upstream.count("/closed"),
        1,
        "no attempt after the deadline"
    );

    // An upstream slower than the deadline: every attempt ends in time and
    // the service hears 504 within its deadline.
    let answer = python_get(&proxy.url("/slow"), 10.0, &["request-timeout: 0.9"])
        .await
        .1
        .expect("python answered");
    assert_eq!(answer.status, 504, "{answer:?}");
    let slow: Vec<Hit> = upstream
        .hits()
        .into_iter()
        .filter(|h| h.path == "/slow")
        .collect();
    let first = slow.first().expect("one attempt").at;
    // The deadline cut the attempt: the service had its answer before the
    // upstream would have sent its own.
    assert!(answer.at < first + SLOW, "{answer:?}\n{slow:?}");
    for hit in &slow {
        // Each attempt's reserve (a third of 0.9 s) fits before the deadline.
        assert!(
            hit.at.duration_since(first) + Duration::from_millis(300) <= Duration::from_millis(950),
            "an attempt started too late to finish: {slow:?}"
        );
    }
}

/// A service that gives up mid-wait leaves nothing behind: the retry the
/// gate was waiting to make is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_leaves_no_attempt_behind() {
    let Some(world) = World::start("disconnect", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let proxy = world.proxy("p", ["", "", ""]);

    // Python waits half a second, then closes its connection; the gate was
    // to retry after the upstream's `Retry-After: 2`.
    let (ok, _) = python_get(&proxy.url("/closed"), 0.5, &[]).await;
    assert!(!ok, "the client timed out");
    assert_eq!(upstream.count("/closed"), 1);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        upstream.count("/closed"),
        1,
        "a retry went out after the client left"
    );

    // With curl, over HTTP/2 (the stream is reset, not the connection).
    let answer = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--http2-prior-knowledge",
            "--max-time",
            "0.5",
            &proxy.url("/closed"),
        ])
        .output()
        .await
        .expect("curl");
    assert!(!answer.status.success(), "curl timed out");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        upstream.count("/closed"),
        2,
        "a retry went out after curl left"
    );
}

/// A `POST` with no idempotency key is sent once, whatever the answer; the
/// same request with a key is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_an_idempotency_key_is_sent_once() {
    let Some(world) = World::start("post", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let proxy = world.proxy("p", ["", "", ""]);

    let answer = curl(&["-d", "order=1", &proxy.url("/unavailable")]).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.header("tollgate-attempts"), "1");
    // Not `succeeded`; the engine says whether the effect is known.
    assert!(
        ["indeterminate", "non_retryable"].contains(&answer.header("tollgate-outcome")),
        "{answer:?}"
    );
    assert_eq!(upstream.count("/unavailable"), 1);

    let keyed = curl(&[
        "-d",
        "order=1",
        "-H",
        "idempotency-key: order-1",
        "-H",
        "request-timeout: 5",
        &proxy.url("/unavailable"),
    ])
    .await;
    assert_eq!(keyed.status, 503, "{keyed:?}");
    assert!(
        upstream.count("/unavailable") >= 3,
        "the keyed POST was retried: {keyed:?}"
    );
}

/// Python's chunked upload: 32 KiB, a 1.5 s pause, 8 KiB more.
const PY_UPLOAD: &str = r#"
import sys, time, http.client
def body():
    yield b'a' * 32768
    time.sleep(1.5)
    yield b'b' * 8192
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=30)
conn.request('PUT', '/unavailable', body=body(), encode_chunked=True)
r = conn.getresponse()
print('HTTP/1.1 %d x' % r.status)
for k, v in r.getheaders():
    print('%s: %s' % (k, v))
"#;

/// A body over the listener's buffer bound is streamed to the upstream
/// once, as it arrives, never held whole; one under it is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_sent_once_and_never_buffered_past_the_bound() {
    let Some(world) = World::start("oversized", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let proxy = world.proxy("p", ["", "", "buffer_limit = 16384\ndeadline = \"5s\""]);

    let output = tokio::process::Command::new("python3")
        .args([
            "-c",
            PY_UPLOAD,
            &proxy.addr.ip().to_string(),
            &proxy.addr.port().to_string(),
        ])
        .output()
        .await
        .expect("python3");
    let answer = parse_head(&String::from_utf8_lossy(&output.stdout), Instant::now());
    assert_eq!(
        answer.status,
        503,
        "{answer:?} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(answer.header("tollgate-attempts"), "1", "{answer:?}");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "sent once: {hits:?}");
    let (done, length) = hits[0].body_done.expect("read to the end");
    assert_eq!(length, 32768 + 8192, "the whole body arrived");
    assert!(
        done.duration_since(hits[0].at) >= Duration::from_millis(1000),
        "the upstream had the request before the service finished sending it: {hits:?}"
    );

    // Under the bound, the same PUT is buffered and retried.
    let small = curl(&["-X", "PUT", "-d", "small", &proxy.url("/unavailable")]).await;
    assert_eq!(small.status, 503);
    assert!(upstream.count("/unavailable") >= 3, "{small:?}");
    assert!(
        upstream
            .hits()
            .iter()
            .skip(1)
            .all(|h| h.method == "PUT" && h.body_done.is_some_and(|(_, n)| n == 5)),
        "every replay carried the whole body"
    );
}

/// With the coordinator unreachable the proxy still serves, on the local
/// fallback budget, and says so on every response it touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_coordinator_falls_back_visibly() {
    if !clients_present() {
        return;
    }
    let dir = dir("fallback");
    let (_held, refusing) = refusing_address();
    let upstream = Upstream::start(100).await;
    let mut proxy = Proxy::start(
        &dir,
        "p",
        &format!("http://{refusing}"),
        &upstream.url(),
        "",
    );
    let answer = curl(&[&proxy.url("/flaky")]).await;
    assert_eq!(answer.status, 200, "{answer:?}\n{}", proxy.log());
    assert_eq!(answer.header("tollgate-attempts"), "2", "{answer:?}");
    assert_eq!(
        answer.header("tollgate-coordinator"),
        "unreachable",
        "{answer:?}"
    );
    assert_eq!(upstream.count("/flaky"), 2);
}

/// The sidecar's life: health and metrics on the admin port, and on
/// SIGTERM a drain that lets a request in flight finish before exiting 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_health_and_metrics_and_drains_on_sigterm() {
    let Some(world) = World::start("drain", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let mut proxy = world.proxy(
        "p",
        ["drain = \"5s\"\n[admin]\nlisten = \"127.0.0.1:0\"", "", ""],
    );
    let admin = proxy.admin_address();
    let health = curl(&[&format!("http://{admin}/healthz")]).await;
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(curl(&[&proxy.url("/ok")]).await.status, 200);
    let metrics = tokio::process::Command::new("curl")
        .args(["-sS", &format!("http://{admin}/metrics")])
        .output()
        .await
        .expect("curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(metrics.contains("tollgate_client_attempts"), "{metrics}");
    // A worker's metrics, not the coordinator's.
    assert!(
        metrics.contains("service_name=\"tollgate-proxy\""),
        "{metrics}"
    );

    // An operator's reload signal, with no token file to read, is logged
    // and changes nothing (its default action would end the process).
    let status = Command::new("kill")
        .args(["-HUP", &proxy.run.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    eventually("the SIGHUP logged", async || {
        proxy.log().contains(tollgate::proxy::NOTHING_TO_RELOAD)
    })
    .await;
    assert_eq!(curl(&[&proxy.url("/ok")]).await.status, 200);

    // A request in flight when SIGTERM comes still gets its answer.
    let slow = tokio::spawn(curl_owned(proxy.url("/slow")));
    eventually("the slow request upstream", async || {
        upstream.count("/slow") == 1
    })
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &proxy.run.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let ready = curl(&[&format!("http://{admin}/readyz")]).await;
    assert_eq!(ready.status, 503, "draining: {ready:?}");
    let slow = slow.await.expect("join");
    assert_eq!(slow.status, 200, "{slow:?}");
    let (status, log) = proxy.run.exit().await;
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("drained"), "{log}");
}

async fn curl_owned(url: String) -> Answer {
    curl(&[&url]).await
}

/// HTTP/2 on both sides (a client with prior knowledge, an upstream told
/// to expect it), and a gRPC request classified by its `grpc-status`, not
/// its HTTP 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_on_both_sides_and_grpc_statuses_are_read() {
    let Some(world) = World::start("h2", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let proxy = world.proxy("p", ["", "", "upstream_http2 = true\ndeadline = \"5s\""]);
    let answer = curl(&["--http2-prior-knowledge", &proxy.url("/ok")]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("tollgate-outcome"), "succeeded");
    assert_eq!(upstream.hits()[0].version, "HTTP/2.0");

    let grpc = |key: &'static str| {
        let url = proxy.url("/pkg.Svc/Get");
        async move {
            let mut args = vec![
                "--http2-prior-knowledge".to_owned(),
                "-H".to_owned(),
                "content-type: application/grpc".to_owned(),
                "--data-binary".to_owned(),
                "\\x00\\x00\\x00\\x00\\x00".to_owned(),
            ];
            if !key.is_empty() {
                args.extend(["-H".to_owned(), format!("idempotency-key: {key}")]);
            }
            args.push(url);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            curl(&refs).await
        }
    };
    // No key: one attempt, as for any gRPC call the proxy cannot know to
    // be idempotent; the UNAVAILABLE is the outcome, not a success.
    let once = grpc("").await;
    assert_eq!(once.header("grpc-status"), "14", "{once:?}");
    assert_eq!(once.header("tollgate-attempts"), "1", "{once:?}");
    assert_ne!(once.header("tollgate-outcome"), "succeeded", "{once:?}");
    // With a key: UNAVAILABLE is retried.
    let keyed = grpc("call-1").await;
    assert_eq!(keyed.header("grpc-status"), "14", "{keyed:?}");
    assert_ne!(keyed.header("tollgate-attempts"), "1", "{keyed:?}");
    assert_eq!(
        upstream.count("/pkg.Svc/Get"),
        1 + keyed
            .header("tollgate-attempts")
            .parse::<usize>()
            .expect("attempts")
    );
}

/// With caller tokens on, the proxy authenticates with the token in its
/// `token_file`: its reports reach the coordinator (the 429 it saw is
/// the scope's cooldown); a proxy holding a wrong token reports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_link_uses_the_token_file() {
    let Some(world) = World::start("token", 100, coordinator_with_tokens).await else {
        return;
    };
    let dir = &world.dir;
    let coordinator = &world.coordinator;
    for (name, token, route) in [
        ("wrong", "not-the-token", "GET /wrong"),
        ("right", FLEET_TOKEN, "GET /closed"),
    ] {
        let file = dir.join(format!("{name}.token"));
        std::fs::write(&file, format!("{token}\n")).expect("token file");
        let mut proxy = world.proxy(
            name,
            [
                "",
                &format!("token_file = \"{}\"", file.display()),
                &format!("[[listener.route]]\nroute = \"{route}\"\n"),
            ],
        );
        let path = route.trim_start_matches("GET ");
        let answer = curl(&["-H", "request-timeout: 1", &proxy.url(path)]).await;
        assert_eq!(answer.status, 429, "{answer:?}\n{}", proxy.log());
        if name == "right" {
            eventually("the proxy's report", async || {
                cooldown_as(coordinator, route, Some(ADMIN_TOKEN)).await > 0
            })
            .await;
        } else {
            // The report was made and refused, not merely not made yet.
            eventually("the proxy's report refused", async || {
                proxy.log().contains(REPORT_REFUSED)
            })
            .await;
            assert_eq!(
                cooldown_as(coordinator, route, Some(ADMIN_TOKEN)).await,
                0,
                "a report with a wrong token was taken"
            );
        }
        drop(proxy);
    }
}

/// An HTTPS upstream is reached through a listener given the CA its
/// certificate chains to (HTTP/2 negotiated by ALPN); the same upstream
/// behind a listener trusting another CA is never sent a request: the
/// service gets a `502` saying why, and the proxy logs the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_with_its_ca_and_refused_with_another() {
    if !clients_present() {
        return;
    }
    let dir = dir("upstream-tls");
    let coordinator = coordinator(&dir);
    let ca = Ca::new("upstream CA");
    let upstream = Upstream::start_tls(100, &ca).await;
    let trusted = dir.join("upstream-ca.pem");
    std::fs::write(&trusted, &ca.pem).expect("CA file");
    let stranger = dir.join("stranger-ca.pem");
    std::fs::write(&stranger, Ca::new("someone else").pem).expect("CA file");
    let ca_file = |path: &Path| format!("upstream_ca_file = \"{}\"", path.display());

    let mut proxy = Proxy::start(
        &dir,
        "trusting",
        &coordinator.url(),
        &upstream.url(),
        &ca_file(&trusted),
    );
    let answer = curl(&[&proxy.url("/ok")]).await;
    assert_eq!(answer.status, 200, "{answer:?}\n{}", proxy.log());
    assert_eq!(answer.header("tollgate-outcome"), "succeeded");
    assert_eq!(upstream.hits()[0].version, "HTTP/2.0", "h2 by ALPN");

    let mut wrong = Proxy::start(
        &dir,
        "stranger",
        &coordinator.url(),
        &upstream.url(),
        &ca_file(&stranger),
    );
    let refused = curl(&["-H", "request-timeout: 3", &wrong.url("/ok")]).await;
    let log = wrong.log();
    assert_eq!(refused.status, 502, "{refused:?}\n{log}");
    assert_eq!(
        upstream.count("/ok"),
        1,
        "no request crossed a refused handshake"
    );
    let cause =
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer).to_string();
    let line = log
        .lines()
        .find(|l| l.contains("upstream unreachable"))
        .unwrap_or_else(|| panic!("no log line for the 502:\n{log}"));
    assert!(
        line.contains(&cause),
        "the line names the cause ({cause}): {line}"
    );
    assert!(line.contains("listener=api"), "{line}");
}

/// The coordinator link over TLS, verified against `ca_file`: the proxy's
/// report reaches a coordinator whose certificate that CA signed (the 429
/// it saw becomes the scope's cooldown); a proxy given another CA reaches
/// nothing, serves on its local budget and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_link_verifies_tls_with_its_ca_file() {
    if !clients_present() {
        return;
    }
    let dir = dir("link-tls");
    let ca = Ca::new("coordinator CA");
    let (cert, key) = ca.leaf(&["127.0.0.1"]);
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert).expect("certificate");
    std::fs::write(&key_file, key).expect("key");
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert_file)
        .arg("--tls-key")
        .arg(&key_file);
    let coordinator = Served::spawn(command, &dir.join("serve.log"));
    let endpoint = format!("https://{}", coordinator.addr);
    let admin = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .expect("endpoint")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        )
        .expect("TLS config");
    let upstream = Upstream::start(100).await;
    let trusted = dir.join("coordinator-ca.pem");
    std::fs::write(&trusted, &ca.pem).expect("CA file");
    let stranger = dir.join("stranger-ca.pem");
    std::fs::write(&stranger, Ca::new("someone else").pem).expect("CA file");

    for (name, ca_file, route) in [
        ("stranger", &stranger, "GET /wrong"),
        ("trusting", &trusted, "GET /closed"),
    ] {
        let mut proxy = Proxy::start_with(
            &dir,
            name,
            &endpoint,
            &upstream.url(),
            [
                "",
                &format!("ca_file = \"{}\"", ca_file.display()),
                &format!("[[listener.route]]\nroute = \"{route}\"\n"),
            ],
        );
        let path = route.trim_start_matches("GET ");
        let answer = curl(&["-H", "request-timeout: 1", &proxy.url(path)]).await;
        assert_eq!(answer.status, 429, "{answer:?}\n{}", proxy.log());
        if name == "trusting" {
            eventually("the proxy's report over TLS", async || {
                cooldown_at(admin.clone(), route, None).await > 0
            })
            .await;
            assert_eq!(answer.header("tollgate-coordinator"), "connected");
        } else {
            // Its first call failed on the certificate and it fell back
            // (a fallen-back proxy holds its reports until the
            // coordinator answers, which this one never does).
            eventually("the proxy's fallback", async || {
                proxy.log().contains(FELL_BACK)
            })
            .await;
            let log = proxy.log();
            assert!(log.contains("UnknownIssuer"), "{log}");
            assert_eq!(
                cooldown_at(admin.clone(), route, None).await,
                0,
                "a proxy that cannot verify the coordinator reported to it"
            );
            let again = curl(&["-H", "request-timeout: 1", &proxy.url(path)]).await;
            assert_eq!(
                again.header("tollgate-coordinator"),
                "unreachable",
                "{again:?}"
            );
        }
    }
}

/// A service that leaves while the gate waits to retry ends its intent
/// `cancelled`, and the proxy's metrics say so: the gate's own
/// cancellation path ran, not a future dropped mid-flight (which records
/// no outcome at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_is_recorded_as_cancelled() {
    let Some(world) = World::start("cancelled", 100, coordinator).await else {
        return;
    };
    let upstream = &world.upstream;
    let mut proxy = world.proxy("p", ["[admin]\nlisten = \"127.0.0.1:0\"", "", ""]);
    let admin = proxy.admin_address();
    let cancelled = async || {
        let output = tokio::process::Command::new("curl")
            .args(["-sS", &format!("http://{admin}/metrics")])
            .output()
            .await
            .expect("curl");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| l.starts_with("tollgate_client_"))
            .any(|l| l.contains("tollgate_outcome=\"cancelled\""))
    };
    assert!(!cancelled().await, "nothing cancelled yet");

    // The upstream's `Retry-After: 2` holds the retry; Python leaves
    // after half a second.
    let (ok, _) = python_get(&proxy.url("/closed"), 0.5, &[]).await;
    assert!(!ok, "the client timed out");
    eventually("a cancelled intent in the metrics", cancelled).await;
    assert_eq!(upstream.count("/closed"), 1, "no attempt after it left");
}

/// A token file rewritten under a running proxy (a rotated Secret) is read
/// again, as `tollgate serve` reads its own, here on SIGHUP: reports that
/// the old token could not make reach the coordinator with the new one,
/// with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_token_file_is_used_without_a_restart() {
    let Some(world) = World::start("token-rotation", 100, coordinator_with_tokens).await else {
        return;
    };
    let dir = &world.dir;
    let coordinator = &world.coordinator;
    let file = dir.join("proxy.token");
    std::fs::write(&file, "not-the-token\n").expect("token file");
    let mut proxy = world.proxy(
        "p",
        [
            "",
            &format!("token_file = \"{}\"", file.display()),
            "[[listener.route]]\nroute = \"GET /wrong\"\n\
             [[listener.route]]\nroute = \"GET /closed\"\n",
        ],
    );
    let answer = curl(&["-H", "request-timeout: 1", &proxy.url("/wrong")]).await;
    assert_eq!(answer.status, 429, "{answer:?}\n{}", proxy.log());
    eventually("the report with the old token refused", async || {
        proxy.log().contains(REPORT_REFUSED)
    })
    .await;
    assert_eq!(
        cooldown_as(coordinator, "GET /wrong", Some(ADMIN_TOKEN)).await,
        0,
        "the old token is refused"
    );

    // Rotated as a Secret mount does it: a whole new file renamed into
    // place, then SIGHUP to have it read at once.
    let next = dir.join("proxy.token.next");
    std::fs::write(&next, format!("{FLEET_TOKEN}\n")).expect("token file");
    std::fs::rename(&next, &file).expect("rename into place");
    let status = Command::new("kill")
        .args(["-HUP", &proxy.run.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    eventually("the proxy to read its token again", async || {
        proxy.log().contains("coordinator token file reloaded")
    })
    .await;
    let log = proxy.log();
    assert!(!log.contains(FLEET_TOKEN), "the token is never logged");

    let answer = curl(&["-H", "request-timeout: 1", &proxy.url("/closed")]).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    eventually("the proxy's report with the new token", async || {
        cooldown_as(coordinator, "GET /closed", Some(ADMIN_TOKEN)).await > 0
    })
    .await;
    assert!(
        proxy.run.child.try_wait().expect("wait").is_none(),
        "SIGHUP did not stop it"
    );
}
