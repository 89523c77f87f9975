//! The state file on a disk that will not take it: a directory the
//! coordinator may not write, and a file that may not grow (what a full
//! disk does to the one file that matters). An admin change must be
//! refused with an error that says why, and everything — the running
//! policies, the freezes, the file on disk — must stay as it was: an
//! acknowledged change is a durable one, so an undurable one is not made
//! at all.
//!
//! Both run the shipped binary (`tollgate serve --state`) with the fault
//! injected without privileges or mounts, so neither ever skips:
//! - the read-only directory is mode 0555, which stops any user but root;
//!   as root the child runs as `nobody` (root writes through mode bits);
//! - the file that may not grow is RLIMIT_FSIZE, set for the child by
//!   `/bin/sh`'s `ulimit -f` before it execs the binary (the workspace
//!   forbids `unsafe`, so no `pre_exec` here), with SIGXFSZ ignored so
//!   that a write past the limit fails with EFBIG instead of killing the
//!   process. The limit binds root too.

#[path = "support/process.rs"]
mod process;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use process::Served;
use tollgate_proto::v1::{self, admin_client::AdminClient};
use tonic::Code;
use tonic::transport::Channel;

use support::{ADMIN_TOKEN, POLICY_WITH_TOKENS, with_token};

/// A test's folder: the policy file, and `state/` with the state file and
/// the audit log; removed (made writable first) on drop.
struct Dir {
    path: PathBuf,
}

impl Dir {
    fn new(name: &str) -> Dir {
        let path = process::temp_dir(&format!("state-{name}"));
        std::fs::write(path.join("policy.toml"), POLICY_WITH_TOKENS).expect("policy file");
        std::fs::create_dir(path.join("state")).expect("the state directory");
        Dir { path }
    }

    fn state_dir(&self) -> PathBuf {
        self.path.join("state")
    }

    fn state_file(&self) -> PathBuf {
        self.state_dir().join("state.json")
    }

    /// `tollgate serve` on this folder's files, `command` being the binary
    /// (or what execs it); SERVING when this returns.
    async fn serve(&self, mut command: Command, run: &str) -> Served {
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(self.path.join("policy.toml"))
            .arg("--state")
            .arg(self.state_file())
            .arg("--audit-log")
            .arg(self.state_dir().join("audit.jsonl"))
            .env_remove("TOLLGATE_LISTEN")
            .env_remove("TOLLGATE_STORE");
        let mut served = Served::spawn(command, &self.path.join(format!("{run}.log")));
        served.until_serving().await;
        served
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = set_mode(&self.state_dir(), 0o755);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

async fn admin(served: &Served) -> AdminClient<Channel> {
    AdminClient::connect(served.url()).await.expect("connect")
}

/// The two changes tried: a new rule and a freeze.
struct Changes {
    route: String,
    frozen: (String, String),
    reason: String,
}

impl Changes {
    fn set_policy(&self) -> v1::SetPolicyRequest {
        v1::SetPolicyRequest {
            caller_scope: "tenant-a".into(),
            route: self.route.clone(),
            expected_version: 0,
            fields: Some(v1::PolicyFields {
                retry_ratio: Some(0.25),
                ..v1::PolicyFields::default()
            }),
            patch: false,
            reason: self.reason.clone(),
        }
    }

    fn freeze(&self) -> v1::FreezeScopeRequest {
        v1::FreezeScopeRequest {
            caller_scope: self.frozen.0.clone(),
            route: self.frozen.1.clone(),
            reason: self.reason.clone(),
            duration_ms: 0,
        }
    }
}

/// What an operator sees of the runtime state: the rules, and the freeze
/// of the scope `changes` freezes.
async fn observed(
    served: &Served,
    changes: &Changes,
) -> (Vec<v1::PolicyRule>, Option<v1::FreezeState>) {
    let mut admin = admin(served).await;
    let rules = admin
        .list_policies(with_token(v1::ListPoliciesRequest {}, ADMIN_TOKEN))
        .await
        .expect("list policies")
        .into_inner()
        .rules;
    let freeze = admin
        .get_scope(with_token(
            v1::GetScopeRequest {
                caller_scope: changes.frozen.0.clone(),
                route: changes.frozen.1.clone(),
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("get scope")
        .into_inner()
        .freeze;
    (rules, freeze)
}

/// Tries a policy change and a freeze; both must be refused naming the
/// state file and `why`, and nothing may change, in memory or on disk.
async fn changes_are_refused(served: &Served, dir: &Dir, why: &str, changes: &Changes) {
    let before = observed(served, changes).await;
    let on_disk = std::fs::read(dir.state_file()).expect("the state file was written at start");
    let mut admin = admin(served).await;

    let refused = admin
        .set_policy(with_token(changes.set_policy(), ADMIN_TOKEN))
        .await
        .expect_err("a change that cannot be saved is refused");
    assert_refused(&refused, dir, why);

    let refused = admin
        .freeze_scope(with_token(changes.freeze(), ADMIN_TOKEN))
        .await
        .expect_err("a freeze that cannot be saved is refused");
    assert_refused(&refused, dir, why);

    assert_eq!(
        observed(served, changes).await,
        before,
        "the running state is unchanged"
    );
    assert_eq!(
        std::fs::read(dir.state_file()).expect("the state file is still there"),
        on_disk,
        "the state file is unchanged"
    );
}

fn assert_refused(status: &tonic::Status, dir: &Dir, why: &str) {
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let message = status.message();
    assert!(
        message.contains("state file") && message.contains(&*dir.state_file().to_string_lossy()),
        "the error names the state file: {message}"
    );
    assert!(
        message.contains(why),
        "the error says why ({why}): {message}"
    );
}

#[tokio::test]
async fn a_read_only_state_directory_refuses_changes_and_keeps_the_state() {
    let dir = Dir::new("read-only");
    // Someone whom a read-only directory stops, owning the directory.
    let (command, uid) = process::as_non_root(process::NOBODY);
    std::os::unix::fs::chown(dir.state_dir(), Some(uid), None).expect("chown");
    let served = dir.serve(command, "serve").await;
    set_mode(&dir.state_dir(), 0o555).expect("chmod");
    let changes = Changes {
        route: "POST /orders".into(),
        frozen: ("tenant-a".into(), "GET /users/1".into()),
        reason: "the disk is the problem".into(),
    };
    changes_are_refused(&served, &dir, "Permission denied", &changes).await;
}

/// 512: the unit of `ulimit -f` in a POSIX shell.
const BLOCK: u64 = 512;

/// The limits of a running process, as `/proc/PID/limits` shows them: the
/// soft file-size limit in bytes.
fn file_size_limit(pid: u32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    limits
        .lines()
        .find(|l| l.starts_with("Max file size"))
        .and_then(|l| l.split_whitespace().nth(3))
        .expect("a file-size line")
        .to_owned()
}

#[tokio::test]
async fn a_state_file_that_cannot_grow_refuses_changes_keeps_the_state_and_recovers() {
    let dir = Dir::new("file-size");
    // Names as long as the API takes, so each change below grows the file
    // by more than the limit's slack (under one block).
    let big = |prefix: &str, fill: char, len: usize| {
        format!("{prefix}{}", fill.to_string().repeat(len - prefix.len()))
    };
    let room_maker = big("GET /room/", 'r', 256);
    let changes = Changes {
        route: big("POST /orders/", 'o', 256),
        frozen: (big("tenant-", 'f', 128), big("GET /frozen/", 'f', 256)),
        reason: big("incident ", 'i', 256),
    };

    // A first run without a limit makes a large runtime rule, and is
    // killed: its state file is where the limited run starts.
    let mut first = dir.serve(Command::new(process::BIN), "first").await;
    let made = admin(&first)
        .await
        .set_policy(with_token(
            v1::SetPolicyRequest {
                caller_scope: "*".into(),
                route: room_maker.clone(),
                expected_version: 0,
                fields: Some(v1::PolicyFields {
                    retry_ratio: Some(0.2),
                    ..v1::PolicyFields::default()
                }),
                patch: false,
                reason: String::new(),
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("the room-maker rule")
        .into_inner();
    first.kill();

    // The same coordinator again, its files limited to the blocks the
    // state file already fills: any change that grows it fails.
    let size = std::fs::metadata(dir.state_file())
        .expect("state file")
        .len();
    let blocks = size.div_ceil(BLOCK);
    let mut limited = Command::new("/bin/sh");
    limited.args([
        "-c",
        "trap '' XFSZ; ulimit -f \"$1\" || exit 101; shift; exec \"$@\"",
        "sh",
        &blocks.to_string(),
        process::BIN,
    ]);
    let served = dir.serve(limited, "limited").await;
    assert_eq!(
        file_size_limit(served.pid()),
        (blocks * BLOCK).to_string(),
        "the coordinator runs under the limit"
    );
    assert!(
        std::fs::metadata(dir.state_file())
            .expect("state file")
            .len()
            <= blocks * BLOCK,
        "the state file fits at start"
    );
    changes_are_refused(&served, &dir, "File too large", &changes).await;

    // Room comes back (the large rule goes, a change that shrinks the
    // file): the same freeze is accepted and saved.
    let mut admin = admin(&served).await;
    admin
        .delete_policy(with_token(
            v1::DeletePolicyRequest {
                caller_scope: "*".into(),
                route: room_maker,
                expected_version: made.policy_version,
                reason: "make room".into(),
                ..v1::DeletePolicyRequest::default()
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("a change that shrinks the file is saved");
    admin
        .freeze_scope(with_token(changes.freeze(), ADMIN_TOKEN))
        .await
        .expect("with room again, the freeze is saved");
    let (_, freeze) = observed(&served, &changes).await;
    assert!(freeze.is_some_and(|f| f.frozen), "the freeze is in force");
    let saved = std::fs::read_to_string(dir.state_file()).expect("state file");
    assert!(saved.contains(&changes.reason), "{saved}");
}
