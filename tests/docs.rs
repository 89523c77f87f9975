//! README.md's operating walk-through, run as written against a server
//! started as the walk-through starts it, on the README's own policy file:
//! the built `tollgate` binary is on `PATH`, each line runs in `bash`, and
//! only the port differs (a free one instead of 50051, which a developer's
//! own coordinator may hold).

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
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

/// One line of the walk-through, run as a shell would run it.
fn bash(line: &str, dir: &Path, env: &[(String, String)]) -> Command {
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("TOLLGATE_SERVER")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .envs(env.iter().map(|(k, v)| (k, v)));
    command
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_operating_walk_through_runs_on_the_readme_policy_file() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let policy = block_after(&readme, "The policy file", "toml");
    let walk = block_after(&readme, "## Operating Tollgate", "sh");
    let dir = temp_dir("readme-walk");
    std::fs::write(dir.join("policy.toml"), policy).expect("policy.toml");
    let addr = format!("127.0.0.1:{}", free_port());
    let walk = walk.replace("127.0.0.1:50051", &addr);

    let mut env: Vec<(String, String)> = Vec::new();
    let mut server = None;
    let mut ran = 0;
    for line in walk.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(vars) = line.strip_prefix("export ") {
            let vars = vars.split(" #").next().unwrap_or_default();
            for pair in vars.split_whitespace() {
                let (k, v) = pair.split_once('=').expect("export K=V");
                env.push((k.to_owned(), v.to_owned()));
            }
            continue;
        }
        if line.starts_with("tollgate serve") {
            let (serve, _) = line.split_once(" &").expect("serve runs in the background");
            let log = std::fs::File::create(dir.join("serve.log")).expect("log");
            let child = bash(&format!("exec {serve}"), &dir, &env)
                .env("TOLLGATE_LISTEN", &addr)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("serve");
            server = Some(Server(child));
            // A person types the next line after the start-up log line;
            // here, the first answer to a CLI call.
            let deadline = Instant::now() + Duration::from_secs(20);
            let probe = format!("tollgate --server {addr} policy list");
            while !bash(&probe, &dir, &env)
                .output()
                .expect("probe")
                .status
                .success()
            {
                let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
                assert!(Instant::now() < deadline, "serve did not answer: {log}");
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        let out = bash(line, &dir, &env).output().expect("run the line");
        assert!(out.status.success(), "{line}\n{}", text(&out));
        ran += 1;
    }
    assert!(server.is_some(), "the walk-through starts a server");
    assert!(ran >= 6, "ran {ran} commands of:\n{walk}");

    // Step 3 tightened the file's tenant-a rule, and made no other.
    let list = bash("tollgate -o json policy list", &dir, &env)
        .output()
        .expect("list");
    assert!(list.status.success(), "{}", text(&list));
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    let rules = list["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{list}");
    assert_eq!(rules[0]["caller_scope"], "tenant-a", "{list}");
    assert_eq!(rules[0]["fields"]["retry_ratio"], 0.05, "{list}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
