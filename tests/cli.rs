//! The operator CLI end to end: the built `tollgate` binary, both as the
//! server (`tollgate serve` as a child process, so it can be SIGKILLed, on
//! the loopback port it binds itself and logs) and as the client. No sleeps of seconds: every wait
//! polls at short intervals under an overall bound.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tollgate_proto::v1::{self, admin_client::AdminClient, budget_client::BudgetClient};

#[path = "support/process.rs"]
mod process;
mod support;

use process::{BIN, Served};
use support::{replace_file, with_token};

const ADMIN: &str = support::ADMIN_TOKEN;
const CALLER: &str = support::TENANT_A_TOKEN;
const POLICY: &str = support::POLICY_WITH_TOKENS;

/// `tollgate serve` on the folder's `policy.toml`, started again by
/// [`Server::spawn`] after a kill: each run on the port it bound (the
/// CLI follows), each with its log (`server-N.log`).
struct Server {
    served: Option<Served>,
    /// Where the current run listens.
    addr: std::net::SocketAddr,
    runs: usize,
    dir: PathBuf,
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Polls `check` every 20 ms for at most 10 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

impl Server {
    fn start(dir: &Path) -> Server {
        let mut server = Server {
            served: None,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            runs: 0,
            dir: dir.to_owned(),
        };
        server.spawn();
        server
    }

    /// Starts the next run and waits until the CLI gets an answer from it.
    fn spawn(&mut self) {
        self.runs += 1;
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--config")
            .arg(self.dir.join("policy.toml"))
            .args(["--reload-interval", "50ms"])
            .env_remove("TOLLGATE_LISTEN")
            .env("RUST_LOG", "info");
        let log = self.dir.join(format!("server-{}.log", self.runs));
        let served = Served::spawn(command, &log);
        self.addr = served.addr;
        self.served = Some(served);
        eventually("the server to answer", || {
            self.cli(&["policy", "list"]).status.success()
        });
    }

    fn served(&self) -> &Served {
        self.served.as_ref().expect("running")
    }

    /// SIGKILL: no drain, no chance to flush anything.
    fn kill(&mut self) {
        if let Some(mut served) = self.served.take() {
            served.kill();
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        self.cli_as(ADMIN, args)
    }

    fn cli_as(&self, token: &str, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("TOLLGATE_SERVER", self.addr.to_string())
            .env("TOLLGATE_ADMIN_TOKEN", token)
            .output()
            .expect("run the cli")
    }

    /// Every run's log, oldest first.
    fn log(&self) -> String {
        (1..=self.runs)
            .map(|run| {
                std::fs::read_to_string(self.dir.join(format!("server-{run}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "cli failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("json output")
}

/// The `action` of every record of `tollgate audit -o json`, newest first.
fn actions(audit: &serde_json::Value) -> Vec<&str> {
    audit
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["action"].as_str().expect("action"))
        .collect()
}

fn setup(name: &str) -> Server {
    let dir = temp_dir(name);
    std::fs::write(dir.join("policy.toml"), POLICY).expect("policy file");
    Server::start(&dir)
}

#[test]
fn a_cli_change_survives_sigkill_and_restart() {
    let mut server = setup("restart");
    let set = server.cli(&[
        "policy",
        "set",
        "GET /users/*",
        "retry_ratio=0.05",
        "--reason",
        "storm",
    ]);
    assert!(set.status.success(), "{}", stderr(&set));
    let frozen = server.cli(&[
        "scopes",
        "freeze",
        "tenant-a",
        "GET /users/{id}",
        "--reason",
        "incident",
    ]);
    assert!(frozen.status.success(), "{}", stderr(&frozen));
    let before = json(&server.cli(&["policy", "-o", "json", "get", "GET /users/*"]));
    server.kill();
    server.spawn();
    let after = json(&server.cli(&["policy", "-o", "json", "get", "GET /users/*"]));
    assert_eq!(after["fields"]["retry_ratio"], 0.05);
    assert_eq!(after["policy_version"], before["policy_version"]);
    let scope = json(&server.cli(&[
        "scopes",
        "-o",
        "json",
        "show",
        "tenant-a",
        "GET /users/{id}",
    ]));
    assert_eq!(scope["freeze"]["frozen"], true);
    assert_eq!(scope["freeze"]["by"], "oncall");
    let audit = json(&server.cli(&["audit", "-o", "json"]));
    let actions = actions(&audit);
    assert_eq!(actions, ["scope.freeze", "policy.patch"]);
    let record = &audit[1];
    assert_eq!(record["who"], "oncall");
    assert_eq!(record["reason"], "storm");
    assert!(record["before"].as_str().expect("before").contains("0.5"));
    assert!(record["after"].as_str().expect("after").contains("0.05"));
    assert!(!server.log().contains(ADMIN), "the token is never logged");
    // The table output is for people, but it must name what it shows.
    let table = stdout(&server.cli(&["audit"]));
    assert!(
        table.contains("policy.patch") && table.contains("oncall"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_during_a_burst_of_changes_leaves_a_loadable_state_file() {
    let mut server = setup("burst");
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut admin = AdminClient::new(channel);
    let burst = tokio::spawn(async move {
        // Route → (wake_rate, policy_version) of every acknowledged change,
        // and the route of the change the kill cut short, if any.
        let mut acked = std::collections::BTreeMap::new();
        let mut cut_short = None;
        for i in 0..10_000u32 {
            let route = format!("route-{}", i % 50);
            let req = v1::SetPolicyRequest {
                caller_scope: "*".into(),
                route: route.clone(),
                expected_version: 0,
                fields: Some(v1::PolicyFields {
                    wake_rate: Some(1 + i),
                    ..v1::PolicyFields::default()
                }),
                patch: false,
                reason: String::new(),
            };
            let req = with_token(req, ADMIN);
            // Each route is created once (expected_version 0); every later
            // write to it is refused as stale, so refusals and writes
            // interleave and each acknowledged value is the only one.
            match admin.set_policy(req).await {
                Ok(r) => {
                    acked.insert(route, (1 + i, r.into_inner().policy_version));
                }
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {}
                Err(_) => {
                    // The server is gone: this change may or may not have
                    // been made durable before it died.
                    cut_short = Some(route);
                    break;
                }
            }
        }
        (acked, cut_short)
    });
    // Let some changes land, then kill in the middle of the burst.
    eventually("some acknowledged changes", || {
        server.log().matches("admin change").count() >= 20
    });
    server.kill();
    let (acked, cut_short) = burst.await.expect("burst task");
    // The client sends a change only once the previous one is answered:
    // with 20 logged, at least 19 answers came back.
    assert!(acked.len() >= 19, "{acked:?}");
    let state = server.dir.join("policy.toml.state.json");
    let saved = tollgate::control::persist::load(&state)
        .expect("the state file loads")
        .expect("and exists");
    // Route → (wake_rate, policy_version) of every runtime rule saved (the
    // file's own rule is not one).
    let kept: std::collections::BTreeMap<String, (u32, u64)> = saved
        .doc
        .rules
        .iter()
        .filter(|rule| rule.route != "GET /users/*")
        .map(|rule| {
            let wake_rate = match rule.policy.wake_rate {
                Some(tollgate::policy::WakeRate::Pinned(rate)) => rate,
                other => panic!("{}: wake_rate {other:?}", rule.route),
            };
            (
                rule.route.clone(),
                (wake_rate, rule.policy.policy_version.expect("a version")),
            )
        })
        .collect();
    // Every acknowledged change is in the file, exactly as acknowledged;
    // the file holds nothing else but, at most, the change cut short.
    for (route, change) in &acked {
        assert_eq!(
            kept.get(route),
            Some(change),
            "{route}: acknowledged but not saved as acknowledged ({} acked, {} saved)",
            acked.len(),
            kept.len()
        );
    }
    let unacked: Vec<&String> = kept.keys().filter(|r| !acked.contains_key(*r)).collect();
    assert!(
        unacked.is_empty() || unacked == [cut_short.as_ref().expect("a change cut short")],
        "saved but never acknowledged: {unacked:?} (cut short: {cut_short:?})"
    );
    server.spawn();
    let listed = json(&server.cli(&["policy", "-o", "json", "list"]));
    assert_eq!(
        listed["rules"].as_array().expect("rules").len(),
        saved.doc.rules.len()
    );
}

#[test]
fn errors_are_one_line_with_meaningful_exit_codes() {
    let server = setup("errors");
    // A caller token on Admin.
    let denied = server.cli_as(CALLER, &["policy", "list"]);
    assert_eq!(denied.status.code(), Some(4), "{}", stderr(&denied));
    assert!(stderr(&denied).contains("caller token may not use the Admin API"));
    assert_eq!(stderr(&denied).trim().lines().count(), 1);
    // A stale version.
    let stale = server.cli(&[
        "policy",
        "set",
        "GET /users/*",
        "--version",
        "999",
        "retry_ratio=0.1",
    ]);
    assert_eq!(stale.status.code(), Some(6), "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("FAILED_PRECONDITION") || stderr(&stale).contains("read it again")
    );
    // A bad key and an invalid file, refused before anything is sent.
    let typo = server.cli(&["policy", "set", "GET /users/*", "retry_ration=0.1"]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(stderr(&typo).contains("retry_ration"), "{}", stderr(&typo));
    let bad = server.dir.join("bad.toml");
    std::fs::write(&bad, "[[rule]]\nroute = \"*\"\nwindow = \"90s\"\n").expect("write");
    let apply = server.cli(&["policy", "apply", "-f", bad.to_str().expect("utf8")]);
    assert_eq!(apply.status.code(), Some(2));
    assert!(stderr(&apply).contains("line 3"), "{}", stderr(&apply));
    // Missing rule, unreachable server.
    let missing = server.cli(&["policy", "get", "nope"]);
    assert_eq!(missing.status.code(), Some(5));
    // An address that refuses every connection while `_held` keeps it.
    let (_held, refusing) = process::refusing_address();
    let away = Command::new(BIN)
        .args(["policy", "list", "--server", &refusing.to_string()])
        .output()
        .expect("run");
    assert_eq!(away.status.code(), Some(3), "{}", stderr(&away));
}

#[test]
fn an_invalid_file_keeps_the_old_policy_and_diff_shows_drift() {
    let server = setup("reload");
    let file = server.dir.join("policy.toml");
    let ratio = |s: &Server| {
        json(&s.cli(&["policy", "-o", "json", "get", "GET /users/*"]))["fields"]["retry_ratio"]
            .clone()
    };
    assert_eq!(ratio(&server), 0.5);
    // In sync with the file.
    assert_eq!(server.cli(&["policy", "diff"]).status.code(), Some(0));
    // An invalid file: logged, rejected, the running policy kept.
    replace_file(
        &file,
        &POLICY.replace("retry_ratio = 0.5", "retry_ratio = 500.0"),
    );
    server.served().signal("HUP");
    eventually("the rejection in the log", || {
        server.log().contains("policy file rejected")
    });
    assert_eq!(ratio(&server), 0.5);
    // A valid change is picked up by the poll.
    replace_file(
        &file,
        &POLICY.replace("retry_ratio = 0.5", "retry_ratio = 0.25"),
    );
    eventually("the reload", || ratio(&server) == 0.25);
    // A runtime change is drift from the file.
    let set = server.cli(&["policy", "set", "GET /users/*", "retry_ratio=0.1"]);
    assert!(set.status.success(), "{}", stderr(&set));
    let diff = server.cli(&["policy", "diff"]);
    assert_eq!(diff.status.code(), Some(7), "{}", stdout(&diff));
    assert!(stdout(&diff).contains("retry_ratio"), "{}", stdout(&diff));
    // apply -f of the file removes the drift; dry run first changes nothing.
    let path = file.to_str().expect("utf8");
    let dry = server.cli(&["policy", "apply", "-f", path, "--dry-run"]);
    assert!(
        stdout(&dry).contains("0.1") && stdout(&dry).contains("0.25"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(ratio(&server), 0.1);
    assert!(
        server
            .cli(&["policy", "apply", "-f", path])
            .status
            .success()
    );
    assert_eq!(ratio(&server), 0.25);
    assert_eq!(server.cli(&["policy", "diff"]).status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cli_freeze_stops_a_watching_workers_leases() {
    fn with<T>(m: T) -> tonic::Request<T> {
        with_token(m, CALLER)
    }
    let server = setup("freeze");
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut worker = BudgetClient::new(channel);
    let scope = v1::Scope {
        caller_scope: "tenant-a".into(),
        route: "GET /users/{id}".into(),
        priority: v1::Priority::Normal.into(),
    };
    let mut events = worker
        .watch(with(v1::WatchRequest {
            worker_id: "w".into(),
            scopes: vec![scope.clone()],
        }))
        .await
        .expect("watch")
        .into_inner();
    events.message().await.expect("ok").expect("snapshot");
    let freeze = server.cli(&[
        "scopes",
        "freeze",
        "tenant-a",
        "GET /users/{id}",
        "--reason",
        "incident",
        "--for",
        "10m",
    ]);
    assert!(freeze.status.success(), "{}", stderr(&freeze));
    let event = support::next_event(&mut events, "the freeze").await;
    assert_eq!(event.kind(), v1::ScopeEventKind::Frozen);
    let lease = worker
        .lease(with(v1::LeaseRequest {
            scope: Some(scope),
            worker_id: "w".into(),
            want: 3,
            retry_class: v1::RetryClass::Transient.into(),
        }))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(lease.granted, 0);
    assert_eq!(lease.limit(), v1::LeaseLimit::Frozen);
    let listed = stdout(&server.cli(&["scopes", "list", "--frozen"]));
    assert!(
        listed.contains("FROZEN") && listed.contains("tenant-a"),
        "{listed}"
    );
    // `top --once` takes the same global flags and shows the freeze's time left.
    let frame = server.cli(&["top", "--once", "--width", "120"]);
    assert!(frame.status.success(), "{}", stderr(&frame));
    let frame = stdout(&frame);
    let row = frame
        .lines()
        .find(|l| l.starts_with("tenant-a|GET /users/{id}"))
        .unwrap_or_else(|| panic!("no row for the scope: {frame}"));
    assert!(row.contains("yes, "), "{frame}");
}

/// Runs the binary with no coordinator around (completions, man pages,
/// help, simulate), from the repository root as a fresh clone would.
fn offline(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TOLLGATE_SERVER")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .expect("run the cli")
}

#[test]
fn global_flags_work_before_and_after_the_subcommand_and_yaml_matches_json() {
    let server = setup("global");
    let before = json(&server.cli(&["-o", "json", "policy", "list"]));
    let after = json(&server.cli(&["policy", "list", "-o", "json"]));
    assert_eq!(before, after);
    assert_eq!(before["rules"][0]["route"], "GET /users/*");

    // --server before the subcommand wins over TOLLGATE_SERVER.
    let elsewhere = Command::new(BIN)
        .args(["--server", &server.addr.to_string()])
        .args(["--output", "json", "policy", "list"])
        .env("TOLLGATE_SERVER", "127.0.0.1:1")
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN)
        .output()
        .expect("run the cli");
    assert_eq!(json(&elsewhere), before);

    let yaml = server.cli(&["policy", "list", "-o", "yaml"]);
    assert!(yaml.status.success(), "{}", stderr(&yaml));
    let parsed: serde_json::Value =
        serde_norway::from_slice(&yaml.stdout).expect("the yaml output parses");
    assert_eq!(parsed, before, "yaml carries the same fields as json");

    let audit = server.cli(&["-o", "yaml", "audit"]);
    let records: serde_json::Value =
        serde_norway::from_slice(&audit.stdout).expect("the audit yaml parses");
    assert!(records.is_array(), "{}", stdout(&audit));
}

#[test]
fn completions_for_each_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = offline(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(!script.trim().is_empty(), "{shell}: empty script");
        for name in ["serve", "policy", "scopes", "audit", "simulate", "freeze"] {
            assert!(script.contains(name), "{shell} completions lack {name}");
        }
    }
    let bad = offline(&["completions", "cmd.exe"]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown shell is invalid input"
    );
}

#[test]
fn man_writes_one_page_per_command() {
    let dir = temp_dir("man");
    let out = offline(&["man", dir.to_str().expect("utf-8 temp path")]);
    assert!(out.status.success(), "{}", stderr(&out));
    for page in [
        "tollgate.1",
        "tollgate-serve.1",
        "tollgate-policy-set.1",
        "tollgate-scopes-freeze.1",
        "tollgate-simulate.1",
    ] {
        let text =
            std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page} is not a man page");
    }
    // The benchmarks are not the operator's: `tollgate-bench` has them.
    assert!(
        !std::fs::read_dir(&dir).expect("man dir").any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .contains("bench")),
        "no benchmark page in the coordinator's manual"
    );
    let set = std::fs::read_to_string(dir.join("tollgate-policy-set.1")).expect("policy set page");
    assert!(
        set.contains("retry_ratio=0.05"),
        "the page carries the examples"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_command_help_has_examples() {
    let commands: &[&[&str]] = &[
        &[],
        &["serve"],
        &["policy"],
        &["policy", "list"],
        &["policy", "get"],
        &["policy", "set"],
        &["policy", "apply"],
        &["policy", "delete"],
        &["policy", "diff"],
        &["scopes"],
        &["scopes", "list"],
        &["scopes", "show"],
        &["scopes", "freeze"],
        &["scopes", "unfreeze"],
        &["scopes", "reset"],
        &["audit"],
        &["top"],
        &["simulate"],
        &["completions"],
        &["man"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = offline(&args);
        assert!(out.status.success(), "{command:?}: {}", stderr(&out));
        let help = stdout(&out);
        assert!(
            help.contains("Examples:\n  tollgate"),
            "{command:?} --help has no Examples section:\n{help}"
        );
    }
}

/// Every scenario shipped in `examples/scenarios/` reproduces the result in
/// `examples/scenarios/expected/`, run by relative path from the repository
/// root as the README shows.
#[test]
fn every_shipped_scenario_reproduces_its_expected_result() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples/scenarios"))
        .expect("examples/scenarios")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".json"))
        .collect();
    names.sort();
    assert!(names.len() >= 2, "scenarios found: {names:?}");
    for name in &names {
        let path = format!("examples/scenarios/{name}");
        let table = offline(&["simulate", &path]);
        assert!(table.status.success(), "{path}: {}", stderr(&table));
        let out = offline(&["-o", "json", "simulate", &path]);
        let actual = json(&out);
        let expected: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("examples/scenarios/expected").join(name))
                .unwrap_or_else(|e| panic!("expected/{name}: {e}")),
        )
        .expect("expected result is JSON");
        let fields = expected.as_object().expect("expected results are objects");
        for (field, value) in fields {
            assert_eq!(&actual[field], value, "{name}: {field}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cli_mute_silences_a_worker_is_audited_and_survives_restart() {
    let mut server = setup("mute");
    let muted = server.cli(&[
        "scopes",
        "mute",
        "tenant-a",
        "GET /users/{id}",
        "--worker",
        "worker-7",
        "--reason",
        "sends 300 s on every 429",
        "--for",
        "1h",
    ]);
    assert!(muted.status.success(), "{}", stderr(&muted));
    assert!(
        stdout(&muted).contains("muted worker-7"),
        "{}",
        stdout(&muted)
    );
    server.kill();
    server.spawn();

    // The restarted coordinator still ignores the worker's hints.
    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut worker = BudgetClient::new(channel);
    let s = support::scope("tenant-a", "GET /users/{id}", v1::Priority::Normal);
    let report = worker
        .report(with_token(
            support::rate_limited(s, "worker-7", "60", v1::ScopeCertainty::Known),
            CALLER,
        ))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(
        report.cooldown_until_unix_ms, 0,
        "a muted worker moves nothing"
    );

    let scope = json(&server.cli(&[
        "scopes",
        "-o",
        "json",
        "show",
        "tenant-a",
        "GET /users/{id}",
    ]));
    let mute = &scope["route_evidence"]["mutes"][0];
    assert_eq!(mute["worker_id"], "worker-7");
    assert_eq!(mute["by"], "oncall");
    assert_eq!(mute["reason"], "sends 300 s on every 429");
    let table = stdout(&server.cli(&["scopes", "show", "tenant-a", "GET /users/{id}"]));
    assert!(table.contains("muted worker-7"), "{table}");
    // The evidence line names its level with no stray padding, and with
    // only a mute weighed nothing: no verdict on nobody.
    assert!(
        table.lines().any(|l| l.starts_with("evidence (route) ")),
        "{table}"
    );
    assert!(
        table.contains("evidence (route) no hints counted"),
        "{table}"
    );
    assert!(!table.contains("by 0 of 0"), "{table}");

    let unmuted = server.cli(&[
        "scopes",
        "unmute",
        "tenant-a",
        "GET /users/{id}",
        "--worker",
        "worker-7",
        "--reason",
        "fixed",
    ]);
    assert!(unmuted.status.success(), "{}", stderr(&unmuted));
    let audit = json(&server.cli(&["audit", "-o", "json"]));
    let actions = actions(&audit);
    assert_eq!(actions, ["scope.unmute", "scope.mute"]);
    assert!(!server.log().contains(CALLER), "no token in the log");
}

/// Runs the CLI with stdout a pipe whose reader is already gone, as
/// `tollgate … | head -1` is once `head` has read its line.
fn cli_into_closed_pipe(server: &Server, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(BIN)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TOLLGATE_SERVER", server.addr.to_string())
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN)
        .stdout(writer)
        .output()
        .expect("run the cli")
}

#[test]
fn every_command_ends_quietly_when_its_reader_goes_away() {
    let server = setup("closed-pipe");
    let freeze = server.cli(&[
        "scopes",
        "freeze",
        "tenant-a",
        "GET /users/{id}",
        "--reason",
        "a scope with state to show",
    ]);
    assert!(freeze.status.success(), "{}", stderr(&freeze));
    let commands: &[&[&str]] = &[
        &["completions", "bash"],
        &["policy", "list"],
        &["policy", "get", "GET /users/*"],
        &["-o", "json", "policy", "list"],
        &["-o", "yaml", "policy", "list"],
        &["scopes", "list"],
        &["scopes", "show", "tenant-a", "GET /users/{id}"],
        &["audit"],
        &["top", "--once"],
        &["simulate", "examples/scenarios/schedule-a.json"],
    ];
    for args in commands {
        let out = cli_into_closed_pipe(&server, args);
        assert_eq!(
            (out.status.code(), stderr(&out).as_str()),
            (Some(0), ""),
            "tollgate {}",
            args.join(" ")
        );
    }
    // A command that fails still says so: the exit code is its own.
    let missing = cli_into_closed_pipe(&server, &["policy", "get", "GET /nowhere"]);
    assert_eq!(missing.status.code(), Some(5), "{}", stderr(&missing));
}

#[test]
fn defaults_are_set_shown_diffed_and_cleared_by_name() {
    let server = setup("defaults");
    // The in-memory store's bound is in the start-up log (a Redis store's
    // is not: tests/replicas_binary.rs).
    assert!(
        server
            .log()
            .lines()
            .any(|l| l.contains("scope state in memory") && l.contains("max_scopes=1000000")),
        "{}",
        server.log()
    );
    let set = server.cli(&["policy", "set", "[defaults]", "retry_ratio=0.3"]);
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(
        stdout(&set).starts_with("rule            [defaults]\n"),
        "{}",
        stdout(&set)
    );

    // The running `[defaults]` changed, and no rule was made.
    let list = json(&server.cli(&["-o", "json", "policy", "list"]));
    assert_eq!(list["defaults"]["fields"]["retry_ratio"], 0.3, "{list}");
    let routes: Vec<&str> = list["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["route"].as_str().expect("route"))
        .collect();
    assert_eq!(routes, ["GET /users/*"], "{list}");
    let shown = json(&server.cli(&["-o", "json", "policy", "get", "[defaults]"]));
    assert_eq!(shown["effective"]["retry_ratio"], 0.3, "{shown}");
    assert_eq!(shown["policy_version"], list["defaults"]["policy_version"]);

    // A runtime change over the file: diff shows it, clear drops it.
    let diff = server.cli(&["-o", "json", "policy", "diff"]);
    assert_eq!(diff.status.code(), Some(7), "{}", stderr(&diff));
    let drift: serde_json::Value = serde_json::from_slice(&diff.stdout).expect("json");
    assert_eq!(drift["changes"][0]["target"], "[defaults]", "{drift}");
    let clear = server.cli(&["policy", "clear", "[defaults]"]);
    assert!(clear.status.success(), "{}", stderr(&clear));
    assert!(
        stdout(&clear).starts_with("[defaults] follows the policy file again"),
        "{}",
        stdout(&clear)
    );
    let list = json(&server.cli(&["-o", "json", "policy", "list"]));
    assert!(
        list["defaults"]["fields"]["retry_ratio"].is_null(),
        "{list}"
    );
    let diff = server.cli(&["policy", "diff"]);
    assert_eq!(diff.status.code(), Some(0), "{}", stdout(&diff));

    // `[defaults]` covers every caller scope and cannot be deleted: both
    // refused in one line, as invalid input.
    for args in [
        &[
            "policy",
            "set",
            "[defaults]",
            "--caller-scope",
            "tenant-a",
            "retry_ratio=0.3",
        ][..],
        &["policy", "delete", "[defaults]"][..],
    ] {
        let refused = server.cli(args);
        assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
        assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    }
}

#[test]
fn diff_lists_what_a_runtime_only_rule_sets_not_every_default() {
    let server = setup("diff-runtime-only");
    let set = server.cli(&["policy", "set", "GET /only", "retry_ratio=0.1"]);
    assert!(set.status.success(), "{}", stderr(&set));
    let diff = server.cli(&["-o", "json", "policy", "diff"]);
    assert_eq!(diff.status.code(), Some(7), "{}", stderr(&diff));
    let drift: serde_json::Value = serde_json::from_slice(&diff.stdout).expect("json");
    assert_eq!(
        drift["changes"],
        serde_json::json!([{
            "target": "*|GET /only",
            "kind": "removed",
            "fields": [{"field": "retry_ratio", "before": "0.1", "after": ""}],
        }]),
        "{drift}"
    );
}

#[test]
fn serve_says_a_policy_files_toml_error_once_on_one_line_of_context() {
    let path = temp_dir("bad-toml").join("policy.toml");
    std::fs::write(&path, "retry_ratio = \n").expect("write");
    let path = path.to_str().expect("utf-8 path");
    let out = offline(&["serve", "--listen", "127.0.0.1:0", "--config", path]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!(
            "tollgate serve: policy file {path}: parsing policy file: TOML parse error at line 1"
        )),
        "{err}"
    );
    assert_eq!(err.matches("TOML parse error").count(), 1, "{err}");
}
