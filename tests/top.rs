//! `tollgate top` against a real coordinator during a small storm: the
//! model fetched over the Admin API, drawn with ratatui's `TestBackend`,
//! and a freeze typed into the model reaching the coordinator.

mod support;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tollgate::ops::top::{Key, Model, Source, view};
use tollgate_proto::v1;

use support::{Coordinator, rate_limited, scope, secs};

const HOT: (&str, &str) = ("tenant-b", "GET /orders");

/// Rejections with `Retry-After` on three routes; `HOT` gets the most and
/// the longest hint.
async fn storm(coordinator: &Coordinator) {
    let mut client = coordinator.client().await;
    let routes = [
        (HOT, 5, "30"),
        (("tenant-a", "GET /users/{id}"), 2, "5"),
        (("tenant-a", "POST /pay"), 1, "3"),
    ];
    for ((caller, route), count, retry_after) in routes {
        for i in 0..count {
            client
                .report(rate_limited(
                    scope(caller, route, v1::Priority::Normal),
                    &format!("worker-{i}"),
                    retry_after,
                    v1::ScopeCertainty::Known,
                ))
                .await
                .expect("report");
        }
    }
}

fn draw(model: &Model, addr: &str) -> Vec<String> {
    let mut terminal = Terminal::new(TestBackend::new(130, 8)).expect("test terminal");
    terminal
        .draw(|f| {
            f.render_widget(
                view::Screen {
                    model,
                    server: addr,
                },
                f.area(),
            )
        })
        .expect("draw");
    let text = view::buffer_text(terminal.backend().buffer());
    println!("{text}");
    text.lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn the_hottest_scope_is_first_with_its_countdown_and_a_freeze_reaches_the_coordinator() {
    let coordinator = Coordinator::open().await;
    storm(&coordinator).await;
    let addr = coordinator.addr.to_string();
    let source = Source::new(coordinator.channel().await, None, 100).expect("source");
    let mut model = Model::new(coordinator.clock.clone());
    model.update(source.fetch().await.expect("poll"));

    let lines = draw(&model, &addr);
    assert!(lines[1].starts_with("SCOPE"), "header: {lines:?}");
    let hottest = &lines[2];
    assert!(hottest.starts_with("tenant-b|GET /orders"), "{lines:?}");
    assert!(
        hottest.contains(" 5 ") && hottest.contains("30.0s"),
        "{hottest}"
    );
    assert!(
        lines[3].starts_with("tenant-a|GET /users/{id}"),
        "{lines:?}"
    );
    assert!(lines[4].starts_with("tenant-a|POST /pay"), "{lines:?}");

    // The countdown follows the coordinator's clock.
    coordinator.advance(secs(12));
    model.update(source.fetch().await.expect("poll"));
    let lines = draw(&model, &addr);
    assert!(lines[2].contains("18.0s"), "{lines:?}");
    assert!(
        !lines[3].contains("5.0s"),
        "an over cooldown shows no countdown"
    );

    // f, y, a reason, Enter: the selected (hottest) scope is frozen.
    let mut action = None;
    for key in [Key::Char('f'), Key::Char('y')]
        .into_iter()
        .chain("INC-7".chars().map(Key::Char))
        .chain([Key::Enter])
    {
        action = model.on_key(key);
    }
    let action = action.expect("Enter gives the freeze");
    source.apply(&action).await.expect("freeze");
    let state = coordinator.scope_state(HOT.0, HOT.1).await;
    let freeze = state.freeze.expect("frozen");
    assert!(freeze.frozen);
    assert_eq!(freeze.reason, "INC-7");

    model.update(source.fetch().await.expect("poll"));
    let lines = draw(&model, &addr);
    assert!(lines[2].contains("  yes  "), "the freeze shows: {lines:?}");
    coordinator.stop().await;
}

/// `--once` with a `tenant-a`/`*` filter: one frame listing exactly the
/// storm's scopes the filter matches (the hottest scope is another
/// tenant's and is left out).
#[tokio::test]
async fn once_prints_a_frame_with_every_scope_the_filter_matches() {
    let coordinator = Coordinator::open().await;
    storm(&coordinator).await;
    let source = Source::new(coordinator.channel().await, None, 100)
        .expect("source")
        .matching("tenant-a".into(), "*".into());
    let mut model = Model::new(coordinator.clock.clone());
    let text = source
        .frame_text(&mut model, "127.0.0.1", 120)
        .await
        .expect("frame");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "title, header, two scopes, footer: {text}");
    assert!(lines[1].starts_with("SCOPE"), "{text}");
    let scopes: Vec<&str> = lines[2..4]
        .iter()
        .map(|l| l.split("  ").next().unwrap_or_default())
        .collect();
    // The busier first, as the full view orders them.
    assert_eq!(
        scopes,
        ["tenant-a|GET /users/{id}", "tenant-a|POST /pay"],
        "{text}"
    );
    assert!(!text.contains("tenant-b"), "{text}");
    coordinator.stop().await;
}

/// The view watches its top scope; a freeze of it nudges a poll, and that
/// poll shows the freeze.
#[tokio::test]
async fn watch_nudges_a_poll_when_a_watched_scope_is_frozen() {
    let coordinator = Coordinator::open().await;
    storm(&coordinator).await;
    let source = Source::new(coordinator.channel().await, None, 100).expect("source");
    let mut model = Model::new(coordinator.clock.clone());
    model.update(source.fetch().await.expect("poll"));
    let watched = model.watch_scopes(1);
    let scopes: Vec<(&str, &str)> = watched
        .iter()
        .map(|s| (s.caller_scope.as_str(), s.route.as_str()))
        .collect();
    assert_eq!(scopes, [HOT], "the hottest scope is watched");
    let (nudge, mut nudged) = tokio::sync::mpsc::channel(4);
    let watcher = {
        let source = source.clone();
        tokio::spawn(async move { source.watch(watched, nudge).await })
    };
    next(&mut nudged, "the snapshot").await;
    // Nothing else is pending: the next nudge is the freeze's.
    assert!(nudged.try_recv().is_err(), "a nudge before the freeze");
    let freeze = tollgate::ops::top::Action::Freeze {
        caller_scope: HOT.0.into(),
        route: HOT.1.into(),
        reason: "INC-8".into(),
    };
    source.apply(&freeze).await.expect("freeze");
    next(&mut nudged, "the freeze").await;
    // The poll the nudge asks for shows the scope frozen.
    model.update(source.fetch().await.expect("poll"));
    let lines = draw(&model, &coordinator.addr.to_string());
    assert!(
        lines[2].starts_with("tenant-b|GET /orders") && lines[2].contains("  yes  "),
        "the freeze shows after the nudge: {lines:?}"
    );
    watcher.abort();
    coordinator.stop().await;
}

/// The next nudge, waiting at most the suite's push bound.
async fn next(nudged: &mut tokio::sync::mpsc::Receiver<()>, what: &str) {
    tokio::time::timeout(support::PUSH_BOUND, nudged.recv())
        .await
        .unwrap_or_else(|_| panic!("no nudge for {what}"))
        .expect("the watcher is alive");
}
