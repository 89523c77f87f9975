//! Runtime over file, the file's own versions, and one runtime state shared
//! by two coordinators on one Redis (compare-and-set, notices aside: the
//! test re-reads by hand).

use std::sync::Arc;

use tollgate_vocab::clock::{ManualClock, from_unix_ms};

use super::*;
use crate::store::{MemoryStore, RedisOptions, RedisStore, RedisTarget};
use tollgate_testkit::RedisServer;

const T0: i64 = 1_704_110_400_000;

fn policy_spec(ratio: f64) -> PolicySpec {
    PolicySpec {
        retry_ratio: Some(ratio),
        ..PolicySpec::default()
    }
}

async fn control(store: Arc<dyn Store>, file: Option<(&std::path::Path, &str)>) -> Control {
    let (doc, text) = match file {
        Some((path, text)) => {
            std::fs::write(path, text).expect("policy file");
            (PolicyDoc::from_toml(text).expect("valid"), Some(text))
        }
        None => (PolicyDoc::default(), None),
    };
    Control::start(
        doc.clone(),
        text,
        SharedPolicies::new(doc.build().expect("valid")),
        store,
        EventHub::default(),
        AuditLog::in_memory(),
        Arc::new(ManualClock::new(from_unix_ms(T0))),
        Paths {
            policy_file: file.map(|(p, _)| p.to_owned()),
            state_file: None,
        },
    )
    .await
    .expect("start")
}

fn set(route: &str, expected_version: u64, ratio: f64) -> SetRule {
    SetRule {
        caller_scope: "*".into(),
        route: route.into(),
        expected_version,
        spec: policy_spec(ratio),
        patch: true,
        reason: String::new(),
    }
}

fn ratio_of(doc: &PolicyDoc, route: &str) -> Option<f64> {
    doc.find("*", route)
        .and_then(|i| doc.rules[i].policy.retry_ratio)
}

fn version_of(doc: &PolicyDoc, route: &str) -> u64 {
    doc.find("*", route)
        .and_then(|i| doc.rules[i].policy.policy_version)
        .unwrap_or(0)
}

fn temp_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-admin-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir.join("policy.toml")
}

#[tokio::test]
async fn a_runtime_change_outlives_unrelated_file_edits_until_cleared_or_the_file_changes_it() {
    let path = temp_file("layers");
    let a = "[[rule]]\nroute = \"GET /a\"\nretry_ratio = 0.1\n";
    let c = control(Arc::new(MemoryStore::new(100)), Some((&path, a))).await;
    let v = version_of(&c.doc().await, "GET /a");
    c.set_rule("oncall", set("GET /a", v, 0.5))
        .await
        .expect("set");

    // An unrelated edit: one rule added. The SRE's change stays, as drift.
    let ab = format!("{a}[[rule]]\nroute = \"GET /b\"\nretry_ratio = 0.3\n");
    std::fs::write(&path, &ab).expect("edit");
    assert!(c.reload_file(false).await);
    let doc = c.doc().await;
    assert_eq!(ratio_of(&doc, "GET /a"), Some(0.5));
    assert_eq!(ratio_of(&doc, "GET /b"), Some(0.3));
    let drift = c.diff_file().await.expect("diff");
    assert_eq!(drift.len(), 1);
    assert_eq!(drift[0].target, "*|GET /a");

    // Cleared: the file's rule again, at a new version.
    let before = version_of(&doc, "GET /a");
    let (changes, version) = c.clear_rule("oncall", "*|GET /a", "").await.expect("clear");
    assert_eq!(changes.len(), 1);
    assert!(version > before);
    assert_eq!(ratio_of(&c.doc().await, "GET /a"), Some(0.1));
    assert!(c.diff_file().await.expect("diff").is_empty());
    assert!(matches!(
        c.clear_rule("oncall", "*|GET /a", "").await,
        Err(ControlError::NoRuntimeChange(_))
    ));

    // Changed at runtime again, then the file changes that same rule: the
    // file's author decided again, and the file wins.
    let v = version_of(&c.doc().await, "GET /a");
    c.set_rule("oncall", set("GET /a", v, 0.9))
        .await
        .expect("set");
    std::fs::write(&path, ab.replace("0.1", "0.2")).expect("edit");
    assert!(c.reload_file(false).await);
    assert_eq!(ratio_of(&c.doc().await, "GET /a"), Some(0.2));
    assert!(c.overrides().await.rules.is_empty());
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

#[tokio::test(start_paused = true)]
async fn a_file_read_while_it_is_being_written_is_applied_only_once_it_settles() {
    let path = temp_file("settle");
    let a = "[[rule]]\nroute = \"GET /a\"\nretry_ratio = 0.1\n";
    let c = control(Arc::new(MemoryStore::new(100)), Some((&path, a))).await;
    // A tool writing in place: the poll reads the truncated file, and the
    // tool finishes the write within the settle time.
    std::fs::write(&path, "").expect("truncate");
    let finish = {
        let (path, full) = (path.clone(), a.replace("0.1", "0.2"));
        tokio::spawn(async move {
            tokio::time::sleep(FILE_SETTLE / 2).await;
            std::fs::write(&path, full).expect("write");
        })
    };
    assert!(c.reload_file(false).await);
    finish.await.expect("writer");
    assert_eq!(
        ratio_of(&c.doc().await, "GET /a"),
        Some(0.1),
        "the old policy held"
    );
    // The next poll reads the finished file twice alike and applies it.
    assert!(c.reload_file(false).await);
    assert_eq!(ratio_of(&c.doc().await, "GET /a"), Some(0.2));
    assert!(!c.reload_file(false).await, "nothing new to read");
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

#[tokio::test]
async fn the_policy_files_version_is_the_version_served() {
    let path = temp_file("versions");
    let text = "[[rule]]\nroute = \"GET /a\"\npolicy_version = 3\nretry_ratio = 0.1\n";
    let c = control(Arc::new(MemoryStore::new(100)), Some((&path, text))).await;
    assert_eq!(version_of(&c.doc().await, "GET /a"), 3);
    // The author bumps the version with the change: served at exactly 7.
    std::fs::write(&path, text.replace("= 3", "= 7").replace("0.1", "0.2")).expect("edit");
    assert!(c.reload_file(false).await);
    assert_eq!(version_of(&c.doc().await, "GET /a"), 7);
    // Only the version: still the version served.
    std::fs::write(&path, text.replace("= 3", "= 9").replace("0.1", "0.2")).expect("edit");
    assert!(c.reload_file(false).await);
    assert_eq!(version_of(&c.doc().await, "GET /a"), 9);
    // A version at or below one already served cannot be honoured without
    // going back: the next version instead.
    std::fs::write(&path, text.replace("0.1", "0.4")).expect("edit");
    assert!(c.reload_file(false).await);
    assert_eq!(version_of(&c.doc().await, "GET /a"), 10);
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}

async fn redis_store(server: &RedisServer) -> Arc<dyn Store> {
    Arc::new(
        RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions::default(),
        )
        .await
        .expect("connect"),
    )
}

#[tokio::test]
async fn two_coordinators_on_one_redis_share_policies_freezes_and_audit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = control(redis_store(&server).await, None).await;
    let b = control(redis_store(&server).await, None).await;

    let rule = a
        .set_rule("alice", set("GET /x", 0, 0.4))
        .await
        .expect("set");
    let version = rule.policy.policy_version.expect("version");
    b.refresh_locked(&mut *b.state.lock().await)
        .await
        .expect("sync");
    assert_eq!(version_of(&b.doc().await, "GET /x"), version);
    let key = RouteKey {
        caller_scope: "*".into(),
        route: "GET /x".into(),
    };
    assert_eq!(
        b.policies.current().resolve(&key).policy_version,
        version,
        "in force, not only read"
    );

    // Both SREs read `version`; the one through B is first.
    b.set_rule("bob", set("GET /x", version, 0.3))
        .await
        .expect("bob wins");
    let stale = a.set_rule("alice", set("GET /x", version, 0.2)).await;
    assert!(
        matches!(stale, Err(ControlError::Stale { .. })),
        "{stale:?}"
    );

    let route = RouteKey {
        caller_scope: "tenant-a".into(),
        route: "GET /y".into(),
    };
    a.freeze("alice", &route, "INC-1", Some(T0 + 60_000))
        .await
        .expect("freeze");
    b.refresh_locked(&mut *b.state.lock().await)
        .await
        .expect("sync");
    assert_eq!(b.freeze_of(&route).await.expect("frozen").by, "alice");
    b.reset("bob", &route, "").await.expect("reset");

    let actions = |records: Vec<AuditRecord>| -> Vec<(u64, String, String)> {
        records
            .into_iter()
            .map(|r| (r.seq, r.action, r.who))
            .collect()
    };
    let from_a = actions(a.audit_page(0, 10).await.expect("audit"));
    let from_b = actions(b.audit_page(0, 10).await.expect("audit"));
    assert_eq!(from_a, from_b);
    assert_eq!(
        from_a,
        [
            (4, "scope.reset".into(), "bob".into()),
            (3, "scope.freeze".into(), "alice".into()),
            (2, "policy.patch".into(), "bob".into()),
            (1, "policy.patch".into(), "alice".into()),
        ]
    );
    assert_eq!(
        actions(b.audit_page(3, 1).await.expect("page")),
        [from_a[2].clone()]
    );

    // Redis loses everything: the first coordinator to notice writes back
    // the state it runs, so no SRE change is lost.
    server.flush();
    a.refresh_locked(&mut *a.state.lock().await)
        .await
        .expect("rewrite");
    let c = control(redis_store(&server).await, None).await;
    assert_eq!(ratio_of(&c.doc().await, "GET /x"), Some(0.3));
    assert!(c.freeze_of(&route).await.is_some());
    let view = c.store.view(&route, T0).await.expect("view");
    assert_eq!(
        view.frozen.as_deref(),
        Some("INC-1"),
        "the freeze is in force again"
    );
}

/// The freeze record is what replicas follow: one that recorded a freeze
/// (or its lifting) and died before the store had it leaves it to another.
#[tokio::test]
async fn a_freeze_left_half_done_by_a_dead_replica_is_finished_by_another() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = redis_store(&server).await;
    let a = control(Arc::clone(&store), None).await;
    let b = control(redis_store(&server).await, None).await;
    let route = RouteKey {
        caller_scope: "tenant-a".into(),
        route: "GET /z".into(),
    };
    let frozen = async || store.view(&route, T0).await.expect("view").frozen;

    a.freeze("alice", &route, "INC-2", None)
        .await
        .expect("freeze");
    // As if A died after recording it, before the store had it.
    store.set_freeze(&route, None, T0).await.expect("undo");
    assert_eq!(frozen().await, None);
    b.refresh_locked(&mut *b.state.lock().await)
        .await
        .expect("sync");
    assert_eq!(frozen().await.as_deref(), Some("INC-2"), "B applied it");

    a.unfreeze("alice", &route, "mitigated")
        .await
        .expect("unfreeze");
    store
        .set_freeze(&route, Some("INC-2".into()), T0)
        .await
        .expect("undo");
    b.refresh_locked(&mut *b.state.lock().await)
        .await
        .expect("sync");
    assert_eq!(frozen().await, None, "B lifted it");
    let actions: Vec<String> = b
        .audit_page(0, 10)
        .await
        .expect("audit")
        .into_iter()
        .map(|r| r.action)
        .collect();
    assert_eq!(actions, ["scope.unfreeze", "scope.freeze"]);
}
