//! The documentation's commands are tests: README.md's ` ```console ` blocks
//! run with `trycmd` against the built `tollgate`, each `$ …` line a command
//! and the lines under it its expected output (`[..]` and `...` stand for
//! what varies; `TRYCMD=overwrite cargo test --test docs` rewrites the
//! outputs after an intended change). A block that cannot run here is
//! marked ` ```console,ignore `, or is a ` ```sh ` block, which trycmd does
//! not run.
//!
//! The operating walk-through's console blocks need the coordinator its
//! ` ```sh ` block starts: that block's `export` and `tollgate serve` lines
//! are done here as written, on the README's own policy file, except for
//! the port (a free one: a developer's own coordinator may hold 50051).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/process.rs"]
mod process;

use process::{BIN, free_port, temp_dir};

/// The text of the first fenced `lang` block after `marker`.
fn block_after<'a>(text: &'a str, marker: &str, lang: &str) -> &'a str {
    let from = text
        .find(marker)
        .unwrap_or_else(|| panic!("README has {marker:?}"));
    let fence = format!("```{lang}\n");
    let start = from + text[from..].find(&fence).expect("a fenced block") + fence.len();
    let len = text[start..].find("```").expect("the block's end");
    &text[start..start + len]
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The walk-through's set-up block: its exported variables, and the
/// coordinator its `tollgate serve … &` line starts, serving by the time
/// this returns.
fn start_as_written(setup: &str, dir: &Path, addr: &str) -> (Vec<(String, String)>, Server) {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut server = None;
    for line in setup.lines().filter(|l| !l.trim().is_empty()) {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if let Some(vars) = line.strip_prefix("export ") {
            for pair in vars.split_whitespace() {
                let (k, v) = pair.split_once('=').expect("export K=V");
                env.push((k.to_owned(), v.to_owned()));
            }
        } else if let Some(serve) = line.strip_suffix(" &") {
            let args: Vec<&str> = serve.split_whitespace().collect();
            assert_eq!(args[..2], ["tollgate", "serve"], "{line}");
            let log = std::fs::File::create(dir.join("serve.log")).expect("log");
            let child = Command::new(BIN)
                .args(&args[1..])
                .current_dir(dir)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("TOLLGATE_LISTEN", addr)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("tollgate serve");
            server = Some(Server(child));
        } else {
            panic!("the set-up block has a line this test does not know: {line}");
        }
    }
    let server = server.expect("the set-up block starts a coordinator");
    // A person types the next line after the start-up log; here, the
    // first answer to a CLI call.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Command::new(BIN)
        .args(["--server", addr, "policy", "list"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("probe")
        .status
        .success()
    {
        let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "serve did not answer: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (env, server)
}

#[test]
fn readme_console_blocks_run_as_shown() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let dir = temp_dir("docs-readme");
    let policy = block_after(&readme, "The policy file", "toml");
    std::fs::write(dir.join("policy.toml"), policy).expect("policy.toml");
    let setup = block_after(&readme, "## Operating Tollgate", "sh");
    let addr = format!("127.0.0.1:{}", free_port());
    let setup = setup.replace("127.0.0.1:50051", &addr);
    let (env, server) = start_as_written(&setup, &dir, &addr);

    let cases = trycmd::TestCases::new();
    cases.register_bin("tollgate", Path::new(BIN));
    for (k, v) in &env {
        cases.env(k.as_str(), v.as_str());
    }
    cases.case("README.md");
    cases.run();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
