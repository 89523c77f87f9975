//! `docs/architecture.md` is the map a newcomer reads first, so every path
//! it names must exist: each `code span` that is a path (it has a `/`, or
//! ends in a file extension) is read from the repository's root, and each
//! link to another page from `docs/`. A rename that forgets the map fails
//! here instead of misleading the next reader.

use std::path::Path;

const PAGE: &str = "docs/architecture.md";

/// Whether a code span names a file or folder rather than a type, a call
/// or a command: one word of path characters with a `/` in it or a file
/// extension at its end.
fn is_path(span: &str) -> bool {
    let chars_ok = span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '.'));
    let extension = [".rs", ".md", ".lua", ".toml", ".yaml", ".proto", ".json"]
        .iter()
        .any(|e| span.ends_with(e));
    chars_ok && !span.is_empty() && (span.contains('/') || extension)
}

/// The code spans of `text`, outside fenced blocks.
fn code_spans(text: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
            spans.push(span);
        }
    }
    spans
}

/// The targets of `[text](target)` links in `text` that are neither
/// addresses nor anchors, without their `#fragment`.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or_default();
            (!target.is_empty() && !target.contains("://")).then_some(target)
        })
        .collect()
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(PAGE)).expect("the page");
    let mut missing: Vec<String> = code_spans(&text)
        .into_iter()
        .filter(|span| is_path(span))
        .filter(|span| !root.join(span).exists())
        .map(|span| format!("`{span}`"))
        .collect();
    missing.extend(
        link_targets(&text)
            .into_iter()
            .filter(|target| !root.join("docs").join(target).exists())
            .map(|target| format!("({target})")),
    );
    assert!(
        missing.is_empty(),
        "{PAGE} names paths that do not exist (code spans from the repository's root, links from docs/): {missing:?}"
    );
}

#[test]
fn the_path_rule_reads_spans_as_a_reader_does() {
    assert!(is_path("src/budget/"));
    assert!(is_path("src/store/contract.rs"));
    assert!(is_path("tests/README.md"));
    assert!(!is_path("tollgate-bench storm"));
    assert!(!is_path("Tollgate::connect(url, worker_id).build()"));
    assert!(!is_path("slots::plan"));
    assert!(!is_path("LeaseCache"));
    assert_eq!(
        code_spans("a `src/` b `c d`\n```text\n`inside`\n```\n`e.rs`"),
        ["src/", "c d", "e.rs"]
    );
    assert_eq!(
        link_targets("[p](pacing.md#the-model) [x](https://x.org) [a](#here)"),
        ["pacing.md"]
    );
}
