//! The state file on a disk that will not take it: a read-only directory
//! or file system, and a full one. An admin change must be refused with an
//! error that says why, and everything — the running policies, the freezes,
//! the file on disk — must stay as it was: an acknowledged change is a
//! durable one, so an undurable one is not made at all.
//!
//! A read-only directory stops every user but root; as root (CAP_DAC_OVERRIDE
//! writes through mode bits) the test mounts a small tmpfs instead and
//! remounts it read-only, and the full disk is always a tiny tmpfs. When
//! mounting is not allowed, those cases skip with a notice.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tollgate::server::Setup;
use tollgate_client::clock::{ManualClock, from_unix_ms};
use tollgate_proto::v1;
use tonic::Code;

use support::{ADMIN_TOKEN, Coordinator, POLICY_WITH_TOKENS, with_token};

/// A directory that is cleaned up (and unmounted, if mounted) on drop.
struct Dir {
    path: PathBuf,
    mounted: bool,
}

impl Dir {
    fn new(name: &str) -> Dir {
        let path =
            std::env::temp_dir().join(format!("tollgate-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create the state directory");
        Dir {
            path,
            mounted: false,
        }
    }

    /// Mounts a `size`-byte tmpfs here; false (with a notice) when not
    /// allowed.
    fn mount_tmpfs(&mut self, size: &str) -> bool {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&self.path)
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("SKIP: cannot mount a tmpfs here (root only)");
        }
        self.mounted = ok;
        ok
    }

    fn remount_read_only(&self) {
        let status = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount read-only");
    }

    fn state_file(&self) -> PathBuf {
        self.path.join("state.json")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.path).status();
        }
        let _ = make_writable(&self.path);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn make_writable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// Whether this process can create a file in `dir` despite its mode bits.
fn writes_through_mode_bits(dir: &Path) -> bool {
    let probe = dir.join(".probe");
    let wrote = std::fs::write(&probe, b"x").is_ok();
    let _ = std::fs::remove_file(&probe);
    wrote
}

async fn start(dir: &Dir) -> Coordinator {
    let mut setup = Setup::new(support::config(POLICY_WITH_TOKENS));
    setup.paths.state_file = Some(dir.state_file());
    let clock = Arc::new(ManualClock::new(from_unix_ms(support::T0)));
    let coordinator = Coordinator::start_setup(setup, clock).await;
    // A server that could not start (say, its state file unwritable at
    // start) ends its task; say why instead of failing to connect.
    tokio::task::yield_now().await;
    if coordinator.task.is_finished() {
        panic!(
            "the coordinator did not start: {:?}",
            coordinator.task.await
        );
    }
    coordinator
}

/// What an operator sees of the runtime state: the rules and the freeze
/// of one scope.
async fn observed(coordinator: &Coordinator) -> (Vec<v1::PolicyRule>, Option<v1::FreezeState>) {
    let mut admin = coordinator.admin().await;
    let rules = admin
        .list_policies(with_token(v1::ListPoliciesRequest {}, ADMIN_TOKEN))
        .await
        .expect("list policies")
        .into_inner()
        .rules;
    let freeze = admin
        .get_scope(with_token(
            v1::GetScopeRequest {
                caller_scope: "tenant-a".into(),
                route: "GET /users/1".into(),
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
async fn changes_are_refused(coordinator: &Coordinator, dir: &Dir, why: &str) {
    let before = observed(coordinator).await;
    let on_disk = std::fs::read(dir.state_file()).expect("the state file was written at start");
    let mut admin = coordinator.admin().await;

    let refused = admin
        .set_policy(with_token(
            v1::SetPolicyRequest {
                caller_scope: "tenant-a".into(),
                route: "POST /orders".into(),
                expected_version: 0,
                fields: Some(v1::PolicyFields {
                    retry_ratio: Some(0.25),
                    ..v1::PolicyFields::default()
                }),
                patch: false,
                reason: "the disk is the problem".into(),
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect_err("a change that cannot be saved is refused");
    assert_refused(&refused, dir, why);

    let refused = admin
        .freeze_scope(with_token(
            v1::FreezeScopeRequest {
                caller_scope: "tenant-a".into(),
                route: "GET /users/1".into(),
                reason: "incident".into(),
                duration_ms: 0,
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect_err("a freeze that cannot be saved is refused");
    assert_refused(&refused, dir, why);

    assert_eq!(
        observed(coordinator).await,
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
    let mut dir = Dir::new("read-only");
    let mode_bits_hold = {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        let hold = !writes_through_mode_bits(&dir.path);
        make_writable(&dir.path).expect("chmod back");
        hold
    };
    if !mode_bits_hold && !dir.mount_tmpfs("1m") {
        return;
    }
    let coordinator = start(&dir).await;
    let why = if mode_bits_hold {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        "Permission denied"
    } else {
        dir.remount_read_only();
        "Read-only file system"
    };
    changes_are_refused(&coordinator, &dir, why).await;
    coordinator.stop().await;
}

#[tokio::test]
async fn a_full_disk_refuses_changes_keeps_the_state_and_recovers() {
    let mut dir = Dir::new("full");
    if !dir.mount_tmpfs("64k") {
        return;
    }
    let coordinator = start(&dir).await;
    // Fill what is left; tmpfs counts whole pages, so write until refused.
    let filler = dir.path.join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).expect("create filler");
        let page = [0u8; 4096];
        while file.write_all(&page).is_ok() {}
        let _ = file.sync_all();
    }
    changes_are_refused(&coordinator, &dir, "No space left on device").await;

    // Space comes back: the same change is accepted and saved.
    std::fs::remove_file(&filler).expect("remove filler");
    let mut admin = coordinator.admin().await;
    admin
        .freeze_scope(with_token(
            v1::FreezeScopeRequest {
                caller_scope: "tenant-a".into(),
                route: "GET /users/1".into(),
                reason: "incident".into(),
                duration_ms: 0,
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("with space again, the freeze is saved");
    let saved = std::fs::read_to_string(dir.state_file()).expect("state file");
    assert!(saved.contains("incident"), "{saved}");
    coordinator.stop().await;
}
