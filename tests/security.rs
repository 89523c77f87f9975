//! TLS, mTLS, certificate and token reload, plaintext consent, reflection
//! (both versions, and a real grpcio client): real servers on loopback,
//! real tonic clients, certificates made at run time with rcgen.

mod support;
#[path = "support/tls.rs"]
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{PUSH_BOUND, TENANT_A_TOKEN, config, lease, poll, scope, with_token};
use tls::Ca;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::config::{Config, TlsFiles};
use tollgate::server::{self, ServeError};
use tollgate_client::link::{CoordinatorLink, LinkConfig, LinkConfigError, LinkTls};
use tollgate_proto::v1::{Priority, budget_client::BudgetClient};
use tonic::Code;
use tonic::transport::Channel;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-security-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        // A reader never sees half a certificate.
        support::replace_file(&path, text);
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Server {
    async fn start(config: Config) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::start_on(config, listener)
    }

    /// A server on `listener`, which may be a second handle on a socket
    /// the test holds (see [`held_listener`]).
    fn start_on(config: Config, listener: TcpListener) -> Server {
        let mut setup = server::Setup::new(config);
        // Reload tests wait for the follower: keep that short.
        setup.secrets_every = Duration::from_millis(50);
        Self::serve(listener, setup)
    }

    /// A server running `setup` as given, on a port of its own.
    async fn start_setup(setup: server::Setup) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, setup)
    }

    fn serve(listener: TcpListener, setup: server::Setup) -> Server {
        let addr = listener.local_addr().expect("addr");
        let (stop, task) = support::tcp::spawn_setup(listener, setup);
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// A plaintext channel to this server.
    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    /// A worker's link to this server; the certificate names `localhost`,
    /// the endpoint is the address (no resolver in the way).
    fn link(&self, tls: Option<LinkTls>) -> LinkConfig {
        let mut link = LinkConfig::new(format!("https://{}", self.addr), "w");
        link.rpc_timeout = Duration::from_secs(5);
        link.tls = tls.map(|mut tls| {
            tls.domain.get_or_insert_with(|| "localhost".into());
            tls
        });
        link
    }

    async fn connect(
        &self,
        tls: Option<LinkTls>,
    ) -> Result<BudgetClient<Channel>, tonic::transport::Error> {
        let endpoint = self.link(tls).endpoint().expect("a valid endpoint");
        let channel = endpoint.connect().await?;
        Ok(BudgetClient::new(channel))
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("stops")
            .expect("no panic")
            .expect("ran without error");
    }
}

fn ca_only(ca: &Ca) -> LinkTls {
    LinkTls {
        ca_pem: Some(ca.pem.clone().into_bytes()),
        ..LinkTls::default()
    }
}

fn tls_config(text: &str, cert: &Path, key: &Path, client_ca: Option<&Path>) -> Config {
    let mut config = config(text);
    config.transport.tls = Some(TlsFiles {
        cert: cert.to_owned(),
        key: key.to_owned(),
        client_ca: client_ca.map(Path::to_owned),
    });
    config
}

async fn a_lease(
    client: &mut BudgetClient<Channel>,
    token: Option<&str>,
) -> Result<(), tonic::Status> {
    let request = lease(scope("tenant-a", "GET /x", Priority::Normal), "w", 1);
    let result = match token {
        Some(t) => client.lease(with_token(request, t)).await,
        None => client.lease(request).await,
    };
    result.map(|_| ())
}

/// The TLS error in `err`'s chain of sources, as rustls words it: a
/// `rustls::Error`, or the `InvalidData` `io::Error` through which
/// rustls's reader reports an alert the server sent (its text is that
/// error's). An `io::Error`'s `source` skips the error it wraps, so each
/// one is opened too.
fn tls_error(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
            && let Some(inner) = io.get_ref()
        {
            return Some(match inner.downcast_ref::<rustls::Error>() {
                Some(tls) => tls.to_string(),
                None => inner.to_string(),
            });
        }
        next = err.source();
    }
    None
}

/// How a client with `tls` is refused: the TLS error it sees on
/// connecting or, when its side of the handshake completed, on its first
/// call (in TLS 1.3 a client learns that the server refused its
/// certificate only from the server's next flight). Panics when the call
/// is answered, or fails for a reason that is not TLS.
async fn tls_refusal(server: &Server, tls: LinkTls) -> String {
    match server.connect(Some(tls)).await {
        Err(err) => {
            tls_error(&err).unwrap_or_else(|| panic!("connecting failed, but not in TLS: {err:?}"))
        }
        Ok(mut client) => {
            let status = a_lease(&mut client, Some(TENANT_A_TOKEN))
                .await
                .expect_err("a call over a refused handshake");
            tls_error(&status)
                .unwrap_or_else(|| panic!("the call failed, but not in TLS: {status:?}"))
        }
    }
}

/// A server certificate no root of the client's vouches for.
fn unknown_issuer() -> String {
    rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer).to_string()
}

/// The server's TLS alert `alert`, as its client reports it.
fn alert(alert: rustls::AlertDescription) -> String {
    rustls::Error::AlertReceived(alert).to_string()
}

#[tokio::test]
async fn tls_needs_the_ca_and_plaintext_clients_are_not_served() {
    let dir = TempDir::new("tls");
    let ca = Ca::new("server CA");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"]);
    let (cert, key) = (dir.write("tls.crt", &cert), dir.write("tls.key", &key));
    let server = Server::start(tls_config("", &cert, &key, None)).await;

    let mut client = server
        .connect(Some(ca_only(&ca)))
        .await
        .expect("TLS with the CA");
    a_lease(&mut client, None)
        .await
        .expect("open dev mode over TLS");

    // The system roots do not know the test CA.
    assert_eq!(
        tls_refusal(&server, LinkTls::default()).await,
        unknown_issuer(),
        "a client without the CA"
    );
    let other = Ca::new("someone else");
    assert_eq!(
        tls_refusal(&server, ca_only(&other)).await,
        unknown_issuer(),
        "a client trusting a different CA"
    );

    // Plaintext HTTP/2 on the TLS port: the server answers the client's
    // connection preface with a fatal TLS alert (decode_error: what it read
    // is no TLS record) and closes, never with an HTTP/2 frame.
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut raw = tokio::net::TcpStream::connect(server.addr)
            .await
            .expect("connect");
        raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("the preface");
        let mut answer = Vec::new();
        tokio::time::timeout(PUSH_BOUND, raw.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .expect("read");
        // Record type 21 (alert), TLS 1.2 framing, 2 bytes: fatal (2),
        // decode_error (50).
        assert_eq!(answer, [21, 3, 3, 0, 2, 2, 50], "{answer:?}");
    }
    // A gRPC client's call there fails in transport: no status came back.
    let plaintext = Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect_lazy();
    let refused = a_lease(&mut BudgetClient::new(plaintext), None)
        .await
        .expect_err("plaintext HTTP/2 on a TLS port is not served");
    assert_eq!(refused.code(), Code::Unknown, "{refused:?}");
    assert!(
        std::error::Error::source(&refused)
            .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some()),
        "a transport error, not an answer: {refused:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_and_tokens_still_apply() {
    let dir = TempDir::new("mtls");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (cert, key) = server_ca.leaf(&["localhost"]);
    let (cert, key) = (dir.write("tls.crt", &cert), dir.write("tls.key", &key));
    let ca_file = dir.write("client-ca.crt", &client_ca.pem);
    let server = Server::start(tls_config(
        support::TENANT_A_TOKEN_TOML,
        &cert,
        &key,
        Some(&ca_file),
    ))
    .await;

    // Without a client certificate the server ends the handshake.
    assert_eq!(
        tls_refusal(&server, ca_only(&server_ca)).await,
        alert(rustls::AlertDescription::CertificateRequired),
        "mTLS without a client certificate"
    );
    // A certificate from another CA is refused too.
    let stranger = Ca::new("stranger");
    let (c, k) = stranger.leaf(&["worker"]);
    let wrong = LinkTls {
        identity_pem: Some((c.into_bytes(), k.into_bytes())),
        ..ca_only(&server_ca)
    };
    assert_eq!(
        tls_refusal(&server, wrong).await,
        alert(rustls::AlertDescription::UnknownCA),
        "a client certificate from another CA"
    );

    let (c, k) = client_ca.leaf(&["worker"]);
    let dir_files = (dir.write("w.crt", &c), dir.write("w.key", &k));
    let ca_file_server = dir.write("server-ca.crt", &server_ca.pem);
    // The files path, as the CLI and workers load it.
    let tls = LinkTls::from_files(
        Some(&ca_file_server),
        Some(&dir_files.0),
        Some(&dir_files.1),
    )
    .expect("readable");
    let mut client = server.connect(Some(tls)).await.expect("mTLS");
    let status = a_lease(&mut client, None).await.expect_err("no token");
    assert_eq!(
        status.code(),
        Code::Unauthenticated,
        "tokens apply on top of mTLS"
    );
    a_lease(&mut client, Some(TENANT_A_TOKEN))
        .await
        .expect("certificate and token");
    server.stop().await;
}

#[tokio::test]
async fn a_rewritten_certificate_serves_new_connections_without_a_restart() {
    let dir = TempDir::new("reload");
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let (cert, key) = old_ca.leaf(&["localhost"]);
    let (cert_file, key_file) = (dir.write("tls.crt", &cert), dir.write("tls.key", &key));
    let server = Server::start(tls_config("", &cert_file, &key_file, None)).await;
    let mut before = server
        .connect(Some(ca_only(&old_ca)))
        .await
        .expect("old cert");
    assert_eq!(
        tls_refusal(&server, ca_only(&new_ca)).await,
        unknown_issuer(),
        "the new certificate is not served yet"
    );

    let (cert, key) = new_ca.leaf(&["localhost"]);
    // Key first, then certificate: in between the pair does not match and
    // the server keeps the old one rather than serve a broken pair.
    dir.write("tls.key", &key);
    dir.write("tls.crt", &cert);
    poll(
        "new connections get the new certificate",
        PUSH_BOUND,
        || async { server.connect(Some(ca_only(&new_ca))).await.is_ok() },
    )
    .await;
    assert_eq!(
        tls_refusal(&server, ca_only(&old_ca)).await,
        unknown_issuer(),
        "the old certificate is no longer served"
    );
    a_lease(&mut before, None)
        .await
        .expect("an open connection keeps working");
    server.stop().await;
}

/// A worker whose CA file is rewritten (its coordinator now serves a
/// certificate from a new CA) follows it without a restart; a file caught
/// half-written leaves the last settings in force.
#[tokio::test]
async fn a_worker_follows_its_rewritten_ca_file_without_a_restart() {
    let dir = TempDir::new("client-reload");
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let serving = |ca: &Ca, name: &str| {
        let (cert, key) = ca.leaf(&["localhost"]);
        let files = (
            dir.write(&format!("{name}.crt"), &cert),
            dir.write(&format!("{name}.key"), &key),
        );
        tls_config("", &files.0, &files.1, None)
    };
    // The address stays this test's across the restart below: each server
    // gets a handle of its own on one socket the test holds, so the port
    // is never released for another process to take.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    held.set_nonblocking(true).expect("non-blocking");
    let handle = || TcpListener::from_std(held.try_clone().expect("dup")).expect("listener");
    let server = Server::start_on(serving(&old_ca, "old"), handle());
    let ca_file = dir.write("ca.crt", &old_ca.pem);
    let tls = LinkTls::from_files(Some(&ca_file), None, None).expect("readable");
    let link = CoordinatorLink::new(&server.link(Some(tls))).expect("link");
    let a_lease = async |link: &CoordinatorLink| {
        link.lease(lease(scope("tenant-a", "GET /x", Priority::Normal), "w", 1))
            .await
    };
    a_lease(&link).await.expect("the old CA");
    assert!(!link.reload_tls().expect("readable"), "nothing changed");

    // The coordinator comes back on the same address with a certificate
    // from the new CA: the old connection is gone, a new one needs the
    // new CA.
    server.stop().await;
    let server = Server::start_on(serving(&new_ca, "new"), handle());
    let refused = a_lease(&link).await.expect_err("the old CA is refused");
    assert_eq!(tls_error(&refused), Some(unknown_issuer()), "{refused:?}");

    dir.write("ca.crt", &new_ca.pem);
    assert!(link.reload_tls().expect("readable"), "the rewrite is seen");
    a_lease(&link).await.expect("the new CA, no restart");

    dir.write("ca.crt", &new_ca.pem[..40]);
    let half = link.reload_tls().expect_err("half a certificate");
    assert!(matches!(half, LinkConfigError::Tls(_)), "{half:?}");
    a_lease(&link).await.expect("the last settings stay");
    server.stop().await;
}

#[tokio::test]
async fn the_cli_connects_with_a_ca_and_a_client_certificate() {
    let dir = TempDir::new("cli");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (cert, key) = server_ca.leaf(&["localhost", "127.0.0.1"]);
    let (cert, key) = (dir.write("tls.crt", &cert), dir.write("tls.key", &key));
    let client_ca_file = dir.write("client-ca.crt", &client_ca.pem);
    let server = Server::start(tls_config(
        support::POLICY_WITH_TOKENS,
        &cert,
        &key,
        Some(&client_ca_file),
    ))
    .await;
    let (c, k) = client_ca.leaf(&["operator"]);
    let ca = dir.write("ca.crt", &server_ca.pem);
    let (c, k) = (dir.write("op.crt", &c), dir.write("op.key", &k));
    let path = |p: &Path| p.display().to_string();
    let base = [
        "--server".to_owned(),
        server.addr.to_string(),
        "--ca".to_owned(),
        path(&ca),
    ];
    let run = |extra: Vec<String>| {
        let args: Vec<String> = base.iter().cloned().chain(extra).collect();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(&args)
                .args(["policy", "list"])
                .env("TOLLGATE_ADMIN_TOKEN", support::ADMIN_TOKEN)
                .output()
                .expect("run the CLI")
        })
    };
    let with_cert = run(vec!["--cert".into(), path(&c), "--key".into(), path(&k)])
        .await
        .expect("joined");
    assert!(
        with_cert.status.success(),
        "{}",
        String::from_utf8_lossy(&with_cert.stderr)
    );
    // Refused in the handshake (the server's alert is checked in
    // `mtls_refuses_clients_without_a_certificate_and_tokens_still_apply`):
    // the CLI's one line says the call failed (exit 1), not that the
    // server was unreachable (3) or refused the token (4). It does not name
    // the alert: its text is tonic's, "transport error" or "operation was
    // canceled" depending on when the alert arrives.
    let without = run(Vec::new()).await.expect("joined");
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert_eq!(
        without.status.code(),
        Some(1),
        "mTLS refuses the CLI without a certificate: {stderr}"
    );
    assert!(
        stderr.starts_with("tollgate: listing policies: ") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    server.stop().await;
}

#[tokio::test]
async fn plaintext_on_a_non_loopback_address_needs_consent() {
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let result = server::run_tcp(listener, async {}, server::Setup::default()).await;
    assert!(
        matches!(result, Err(ServeError::Plaintext(_))),
        "{result:?}"
    );

    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let mut config = Config::default();
    config.transport.allow_plaintext = true;
    let result = server::run_tcp(listener, async {}, server::Setup::new(config)).await;
    assert!(
        result.is_ok(),
        "served (and stopped at once) with consent: {result:?}"
    );
}

#[tokio::test]
async fn a_token_file_is_followed_and_a_removed_token_stops_working() {
    let dir = TempDir::new("tokens");
    let token = dir.write("tenant-a", "file-token-one\n");
    let text = format!(
        "[[token]]\ntoken_file = {:?}\ncaller_scopes = [\"tenant-a\"]\n",
        token.display().to_string()
    );
    let server = Server::start(config(&text)).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = BudgetClient::new(channel);
    a_lease(&mut client, Some("file-token-one"))
        .await
        .expect("the file's token");

    let watch = tollgate_proto::v1::WatchRequest {
        scopes: vec![scope("tenant-a", "GET /x", Priority::Normal).expect("scope")],
        worker_id: "w".into(),
    };
    let mut stream = client
        .watch(with_token(watch, "file-token-one"))
        .await
        .expect("watch")
        .into_inner();
    stream.message().await.expect("snapshot").expect("open");

    dir.write("tenant-a", "file-token-two\n");
    poll("the rotated token works", PUSH_BOUND, || {
        let mut client = client.clone();
        async move { a_lease(&mut client, Some("file-token-two")).await.is_ok() }
    })
    .await;
    let old = a_lease(&mut client, Some("file-token-one"))
        .await
        .expect_err("rotated out");
    assert_eq!(old.code(), Code::Unauthenticated);
    // The stream opened with the old token ends too.
    let ended = tokio::time::timeout(PUSH_BOUND, stream.message())
        .await
        .expect("the stream ends");
    assert!(
        matches!(&ended, Err(s) if s.code() == Code::Unauthenticated),
        "{ended:?}"
    );

    std::fs::remove_file(&token).expect("remove");
    poll("the removed token is refused", PUSH_BOUND, || {
        let mut client = client.clone();
        async move {
            a_lease(&mut client, Some("file-token-two"))
                .await
                .is_err_and(|s| s.code() == Code::Unauthenticated)
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn reflection_answers_in_both_versions() {
    use tonic_reflection::pb::{v1, v1alpha};
    let server = Server::start(Config::default()).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("one");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("not a service list: {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.iter().any(|n| n == "tollgate.v1.Budget"), "{names:?}");

    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("one");
    assert!(
        matches!(
            reply.message_response,
            Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(_))
        ),
        "{reply:?}"
    );
    server.stop().await;
}

/// Whether python3 with grpcio and grpcio-reflection is here; required
/// (a failure, not a skip) when `TOLLGATE_REQUIRE_PYTHON=1` and under CI.
fn python_with_grpcio() -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_reflection, google.protobuf"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        tollgate_testkit::missing_tool(
            "python3 with grpcio and grpcio-reflection",
            "TOLLGATE_REQUIRE_PYTHON",
            "pip install grpcio grpcio-reflection protobuf",
        );
    }
    found
}

fn run_python(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/reflect_budget.py");
    let output = std::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        output.status.success()
            && String::from_utf8_lossy(&output.stdout).contains("ok: every Budget method"),
        "{} {args:?} failed:\nstdout:\n{}\nstderr:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn python_grpcio_reflects_and_calls_every_budget_method() {
    if !python_with_grpcio() {
        return;
    }
    let plain = Server::start(config(support::TENANT_A_TOKEN_TOML)).await;
    let target = plain.addr.to_string();
    // The script blocks; the servers run on this test's runtime meanwhile.
    tokio::task::spawn_blocking(move || {
        run_python(&["--target", &target, "--token", TENANT_A_TOKEN]);
    })
    .await
    .expect("plaintext run");
    plain.stop().await;

    let dir = TempDir::new("python");
    let ca = Ca::new("python CA");
    let (cert, key) = ca.leaf(&["localhost"]);
    let (cert, key) = (dir.write("tls.crt", &cert), dir.write("tls.key", &key));
    let ca_file = dir.write("ca.crt", &ca.pem);
    let tls = Server::start(tls_config(support::TENANT_A_TOKEN_TOML, &cert, &key, None)).await;
    let target = tls.addr.to_string();
    let ca_arg = ca_file.display().to_string();
    tokio::task::spawn_blocking(move || {
        run_python(&[
            "--target",
            &target,
            "--token",
            TENANT_A_TOKEN,
            "--ca",
            &ca_arg,
            "--server-name",
            "localhost",
        ]);
    })
    .await
    .expect("TLS run");
    tls.stop().await;
}

#[tokio::test]
async fn a_token_file_reload_that_crosses_or_repeats_tokens_is_refused_and_the_old_tokens_kept() {
    let dir = TempDir::new("crossed");
    let tenant_a = dir.write("tenant-a", "tenant-a-token-1\n");
    let tenant_b = dir.write("tenant-b", "tenant-b-token-1\n");
    let admin = dir.write("admin", "admin-token-one\n");
    let text = format!(
        "[[token]]\ntoken_file = {:?}\ncaller_scopes = [\"tenant-a\"]\n\
         [[token]]\ntoken_file = {:?}\ncaller_scopes = [\"tenant-b\"]\n\
         [[admin_token]]\nname = \"oncall\"\ntoken_file = {:?}\n",
        tenant_a.display().to_string(),
        tenant_b.display().to_string(),
        admin.display().to_string(),
    );
    let config = config(&text);
    // Clones share the table: the test sees the server's reloads.
    let auth = config.auth.clone();
    let mut setup = server::Setup::new(config);
    setup.secrets_every = Duration::from_millis(20);
    let server = Server::start_setup(setup).await;
    let channel = server.channel().await;
    let mut client = BudgetClient::new(channel.clone());
    let mut admin_client = tollgate_proto::v1::admin_client::AdminClient::new(channel);
    a_lease(&mut client, Some("tenant-a-token-1"))
        .await
        .expect("tenant-a's token");

    // The caller file rotated to the admin token, then to tenant-b's: a
    // caller must not become an admin, nor two entries share a token. Each
    // reload is refused whole; the tokens in use stay as they were.
    for bad in ["admin-token-one\n", "tenant-b-token-1\n"] {
        let before = auth.refused_reloads();
        dir.write("tenant-a", bad);
        poll("the reload is refused", PUSH_BOUND, || {
            let auth = auth.clone();
            async move { auth.refused_reloads() > before }
        })
        .await;
        a_lease(&mut client, Some("tenant-a-token-1"))
            .await
            .expect("the old tenant-a token still works");
        let as_caller = a_lease(&mut client, Some(bad.trim())).await;
        if bad.starts_with("admin") {
            assert_eq!(
                as_caller.expect_err("not a caller token").code(),
                Code::Unauthenticated
            );
        }
        admin_client
            .list_policies(with_token(
                tollgate_proto::v1::ListPoliciesRequest {},
                "admin-token-one",
            ))
            .await
            .expect("the admin token is still the admin's");
    }
    // A good rotation is applied again.
    dir.write("tenant-a", "tenant-a-token-2\n");
    poll("the fixed rotation is applied", PUSH_BOUND, || {
        let mut client = client.clone();
        async move { a_lease(&mut client, Some("tenant-a-token-2")).await.is_ok() }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn the_audit_and_state_files_are_created_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = TempDir::new("modes");
    let mut setup = server::Setup::new(config(support::POLICY_WITH_TOKENS));
    setup.audit_file = Some(dir.0.join("audit.jsonl"));
    setup.paths.state_file = Some(dir.0.join("state.json"));
    let server = Server::start_setup(setup).await;
    // Started: it answers, and has written both files.
    let mut admin = tollgate_proto::v1::admin_client::AdminClient::new(server.channel().await);
    admin
        .list_policies(with_token(
            tollgate_proto::v1::ListPoliciesRequest {},
            support::ADMIN_TOKEN,
        ))
        .await
        .expect("admin");
    for name in ["audit.jsonl", "state.json"] {
        let mode = std::fs::metadata(dir.0.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} is {:o}", mode & 0o777);
    }
    server.stop().await;
}
