//! The documentation's commands are tests: the ` ```console ` blocks of
//! README.md, docs/operating.md, docs/evidence.md, docs/security.md,
//! docs/telemetry.md, docs/deploying.md and docs/proxy.md run with `trycmd` against the
//! built `tollgate`, each `$ …` line a command, an optional `? CODE` line its exit
//! code, and the lines under it its expected output (`[..]` and `...` stand
//! for what varies; `TRYCMD=overwrite cargo test --test docs` rewrites the
//! outputs after an intended change). A block that cannot run here is
//! marked ` ```console,ignore `, or is a ` ```sh ` block, which trycmd does
//! not run; an untagged fence would be run, so output shown for reading
//! only is ` ```text `.
//!
//! Each page's console blocks need the coordinator the README's operating
//! walk-through starts in its ` ```sh ` block: that block's `export` and
//! `tollgate serve` lines are done here as written, on the README's own
//! policy file, except for the port: the coordinator binds port 0 (a
//! developer's own coordinator may hold 50051) and the block's
//! `127.0.0.1:50051` becomes the address it logs. Every page gets a
//! coordinator of its own, so its blocks read the state they made alone.

use std::path::Path;
use std::process::Command;

#[path = "support/process.rs"]
mod process;

use process::{BIN, Served, temp_dir};

/// The README's address, replaced by the one the coordinator binds.
const README_ADDR: &str = "127.0.0.1:50051";

/// The text of the first fenced `lang` block after `marker` in `text`,
/// the page `name`.
fn block_after<'a>(name: &str, text: &'a str, marker: &str, lang: &str) -> &'a str {
    let from = text
        .find(marker)
        .unwrap_or_else(|| panic!("{name} has {marker:?}"));
    let fence = format!("```{lang}\n");
    let start = from + text[from..].find(&fence).expect("a fenced block") + fence.len();
    let len = text[start..].find("```").expect("the block's end");
    &text[start..start + len]
}

/// The walk-through's set-up block: its exported variables (the README's
/// address in them replaced by the coordinator's), and the coordinator
/// its `tollgate serve … &` line starts, answering the CLI by the time
/// this returns.
fn start_as_written(setup: &str, dir: &Path) -> (Vec<(String, String)>, Served) {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut server: Option<Served> = None;
    for line in setup.lines().filter(|l| !l.trim().is_empty()) {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if let Some(vars) = line.strip_prefix("export ") {
            for pair in vars.split_whitespace() {
                let (k, v) = pair.split_once('=').expect("export K=V");
                let v = match &server {
                    Some(served) => v.replace(README_ADDR, &served.addr.to_string()),
                    None => v.to_owned(),
                };
                env.push((k.to_owned(), v));
            }
        } else if let Some(serve) = line.strip_suffix(" &") {
            let args: Vec<&str> = serve.split_whitespace().collect();
            assert_eq!(args[..2], ["tollgate", "serve"], "{line}");
            assert!(
                !env.iter().any(|(_, v)| v.contains(README_ADDR)),
                "an export before `tollgate serve` names its address: {env:?}"
            );
            let mut command = Command::new(BIN);
            command
                .args(&args[1..])
                .current_dir(dir)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("TOLLGATE_LISTEN", "127.0.0.1:0");
            server = Some(Served::spawn(command, &dir.join("serve.log")));
        } else {
            panic!("the set-up block has a line this test does not know: {line}");
        }
    }
    let server = server.expect("the set-up block starts a coordinator");
    // A person types the next line after the start-up log; here, the
    // first answer to a CLI call.
    let addr = server.addr.to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !Command::new(BIN)
        .args(["--server", &addr, "policy", "list"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("probe")
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not answer: {}",
            server.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (env, server)
}

/// Runs the console blocks of `page` (a path from the crate root) against
/// a coordinator of its own, started as the README's walk-through says.
fn console_blocks_run_as_shown(page: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let stem = Path::new(page)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a page name");
    let dir = temp_dir(&format!("docs-{stem}"));
    let policy = block_after("README.md", &readme, "The policy file", "toml");
    std::fs::write(dir.join("policy.toml"), policy).expect("policy.toml");
    let setup = block_after("README.md", &readme, "## Operating Tollgate", "sh");
    let (env, server) = start_as_written(setup, &dir);

    let cases = trycmd::TestCases::new();
    cases.register_bin("tollgate", Path::new(BIN));
    // Some blocks show `tollgate serve` refusing to start: one that
    // started serving instead fails here rather than hanging the test.
    cases.timeout(std::time::Duration::from_secs(60));
    for (k, v) in &env {
        cases.env(k.as_str(), v.as_str());
    }
    cases.case(page);
    cases.run();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("README.md");
}

#[test]
fn operating_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/operating.md");
}

#[test]
fn evidence_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/evidence.md");
}

#[test]
fn security_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/security.md");
}

#[test]
fn telemetry_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/telemetry.md");
}

#[test]
fn deploying_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/deploying.md");
}

#[test]
fn proxy_console_blocks_run_as_shown() {
    console_blocks_run_as_shown("docs/proxy.md");
}
