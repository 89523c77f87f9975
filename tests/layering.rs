//! The layering `docs/architecture.md` promises, checked against the code.
//!
//! The page's table "Layers, checked" lists, for each crate, its top-level
//! modules in layers, top first. This test reads every `.rs` file of the
//! coordinator (`src/`), the worker (`client/src/`) and the vocabulary
//! (`vocab/src/`) (and, for circles only, of the benchmarks and the test
//! kit), collects the `crate::…`, `super::…` and `self::…` paths
//! it uses (in `use` lines and inline), resolves each to the module file it
//! names, and fails on
//! - a module the table does not place (a new module must pick its layer);
//! - an import from a module into a layer above its own;
//! - a circle: modules that are siblings (two files of one folder, two
//!   top-level modules) importing each other, directly or round a loop.
//!
//! Reading the table from the page means the page and the test cannot
//! drift. Code under `#[cfg(test)]` is left out: a test may reach up to set
//! the scene, the product may not. Comments and string literals are
//! stripped first, so a doc link is not an import.
//!
//! An import allowed to break the rules would be in [`ALLOWED`], one edge
//! per entry with its reason (none is today); an entry that no longer
//! matches an import fails too, so the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PAGE: &str = "docs/architecture.md";

/// The crates checked, by source folder as the page's table names them.
const CRATES: [&str; 3] = ["src/", "client/src/", "vocab/src/"];

/// Crates that ship nothing (benchmarks, test kit): no layers to keep, but
/// no circle of files either.
const CIRCLES_ONLY: [&str; 2] = ["bench/src/", "testkit/src/"];

/// Imports that break the layering, as `(crate, from, to)` module paths
/// (`to` is the deepest module file the import names), each with its
/// reason: the test tolerates exactly these edges, so any new one fails.
/// None today; keep it that way by moving a type to the layer that owns
/// it rather than adding an entry.
const ALLOWED: &[(&str, &str, &str)] = &[];

// ---- reading the page ------------------------------------------------------

/// The layers of each crate, top first: module name → layer index.
fn layer_table() -> BTreeMap<&'static str, BTreeMap<String, usize>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join(PAGE)).expect("the page");
    let mut table: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut rows: BTreeMap<&str, usize> = BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let [krate, _name, modules] = cells[..] else {
            continue;
        };
        let Some(krate) = CRATES.iter().find(|c| krate.trim() == format!("`{c}`")) else {
            continue;
        };
        let row = rows.entry(krate).or_default();
        let layer = table.entry(krate).or_default();
        for module in modules.split('`').skip(1).step_by(2) {
            let previous = layer.insert(module.to_owned(), *row);
            assert!(
                previous.is_none(),
                "{PAGE}: `{module}` placed twice in {krate}"
            );
        }
        *row += 1;
    }
    table
}

// ---- reading the code ------------------------------------------------------

/// `src` without comments, and with string and char literals emptied.
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let at = |s: &str| s.chars().enumerate().all(|(k, x)| c.get(i + k) == Some(&x));
        let after_ident = i > 0 && ident(c[i - 1]);
        if at("//") {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at("/*") {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if !after_ident && (at("r\"") || at("r#") || at("br\"") || at("br#")) {
            // A raw string: `r`, hashes, a quote, up to a quote and as many hashes.
            i += if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            if c.get(i) != Some(&'"') {
                continue; // `r#ident`, a raw identifier
            }
            i += 1;
            while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')))
            {
                i += 1;
            }
            i += 1 + hashes;
            out.push_str("\"\"");
        } else if c[i] == '"' || (!after_ident && at("b\"")) {
            i += if c[i] == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The end of the item starting at `from`: its `;`, or its closing brace.
fn item_end(s: &[u8], from: usize) -> usize {
    let is_use = {
        let words: Vec<&str> = std::str::from_utf8(&s[from..])
            .unwrap_or_default()
            .split_whitespace()
            .take(2)
            .collect();
        words.first() == Some(&"use") || words.get(1) == Some(&"use")
    };
    let mut depth = 0usize;
    for (k, &b) in s.iter().enumerate().skip(from) {
        match b {
            b';' if depth == 0 || is_use => return k + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && !is_use {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// `s` without the items under `#[cfg(test)]`, and the names of the module
/// files declared under it (`#[cfg(test)] mod tests;`).
fn drop_test_items(s: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let bytes = s.as_bytes();
    let mut out = String::new();
    let mut test_modules = Vec::new();
    let mut i = 0;
    while let Some(found) = s[i..].find(MARK) {
        out.push_str(&s[i..i + found]);
        let mut j = i + found + MARK.len();
        // Further attributes on the same item.
        loop {
            let rest = &s[j..];
            let trimmed = rest.trim_start();
            if !trimmed.starts_with("#[") {
                break;
            }
            j += rest.len() - trimmed.len();
            j += trimmed.find(']').map_or(trimmed.len(), |k| k + 1);
        }
        let end = item_end(bytes, j);
        let item: Vec<&str> = s[j..end].split_whitespace().collect();
        if let Some(at) = item.iter().position(|w| *w == "mod")
            && let Some(name) = item.get(at + 1).and_then(|n| n.strip_suffix(';'))
        {
            test_modules.push(name.to_owned());
        }
        i = end;
    }
    out.push_str(&s[i..]);
    (out, test_modules)
}

/// The leaves of a use tree: `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e`.
fn use_leaves(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![
            tree.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned(),
        ];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(use_leaves)
        .map(|leaf| format!("{prefix}{leaf}"))
        .collect()
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// Every path a file uses that starts with `crate`, `super` or `self`.
fn paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("use ") {
        let at = from + k;
        from = at + 4;
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let end = code[from..].find(';').map_or(code.len(), |e| from + e);
        found.extend(use_leaves(&code[from..end].replace(['\n', '\r'], " ")));
    }
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|ch| is_ident(ch) || ch == ':' || ch == '$')
            {
                continue;
            }
            let len = code[at..]
                .find(|ch: char| !(is_ident(ch) || ch == ':'))
                .unwrap_or(code.len() - at);
            found.push(code[at..at + len].to_owned());
        }
    }
    found
}

/// The module a file defines, as path segments (`store/redis/mod.rs` →
/// `store::redis`; the crate root is empty).
fn module_of(relative: &str) -> Vec<String> {
    let mut segments: Vec<String> = relative
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
        segments.pop();
    }
    segments
}

/// `path` as seen from `module`, as absolute segments.
fn absolute(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut base: Vec<String> = match *segments.peek()? {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "super" | "self" => module.to_vec(),
        _ => return None,
    };
    while let Some(&s) = segments.peek() {
        match s {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    base.extend(
        segments
            .filter(|s| *s != "*" && *s != "self")
            .map(str::to_owned),
    );
    Some(base)
}

/// One crate's imports between its module files: `(from, to)` module paths.
type Edges = BTreeSet<(Vec<String>, Vec<String>)>;

/// The module files of the crate in `dir` and the imports between them
/// (the product's: test items and test-only modules left out).
fn crate_edges(dir: &str) -> (BTreeSet<Vec<String>>, Edges) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut modules = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for file in files {
        let relative = file
            .strip_prefix(&root)
            .expect("under the crate")
            .to_string_lossy()
            .replace('\\', "/");
        // The binary is a crate of its own, importing the library by name.
        if relative == "main.rs" {
            continue;
        }
        let module = module_of(&relative);
        let text = std::fs::read_to_string(&file).expect("a source file");
        let (code, tests) = drop_test_items(&strip(&text));
        for name in tests {
            let mut child = module.clone();
            child.push(name);
            test_only.insert(child);
        }
        modules.insert(module, code);
    }
    let is_test = |m: &[String]| (1..=m.len()).any(|k| test_only.contains(&m[..k]));
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut edges = Edges::new();
    for (module, code) in &modules {
        if is_test(module) {
            continue;
        }
        for path in paths(code) {
            let Some(mut target) = absolute(module, &path) else {
                continue;
            };
            while !target.is_empty() && !known.contains(&target) {
                target.pop();
            }
            if !target.is_empty() && &target != module {
                edges.insert((module.clone(), target));
            }
        }
    }
    (known, edges)
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "(root)".to_owned()
    } else {
        module.join("::")
    }
}

fn allowed(krate: &str, from: &[String], to: &[String]) -> bool {
    ALLOWED
        .iter()
        .any(|(c, f, t)| *c == krate && *f == name(from) && *t == name(to))
}

// ---- the rules ---------------------------------------------------------------

#[test]
fn the_layer_table_places_every_top_level_module() {
    let table = layer_table();
    for krate in CRATES {
        let (modules, _) = crate_edges(krate);
        let top: BTreeSet<&String> = modules.iter().filter_map(|m| m.first()).collect();
        let placed: BTreeSet<&String> = table
            .get(krate)
            .into_iter()
            .flatten()
            .map(|(m, _)| m)
            .collect();
        assert_eq!(
            top, placed,
            "{PAGE}'s table \"Layers, checked\" must place every top-level module of `{krate}` once (left: the code, right: the page)"
        );
    }
}

#[test]
fn no_import_runs_up_a_layer() {
    let table = layer_table();
    let mut up = Vec::new();
    for krate in CRATES {
        let layers = &table[krate];
        for (from, to) in crate_edges(krate).1 {
            let (Some(a), Some(b)) = (layers.get(&from[0]), layers.get(&to[0])) else {
                continue;
            };
            if b < a && !allowed(krate, &from, &to) {
                up.push(format!("{krate}: {} -> {}", name(&from), name(&to)));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports from a module into a layer above it ({PAGE}, \"Layers, checked\"): {up:#?}\n\
         move the type down to the layer that owns it"
    );
}

/// Where an import meets the folder tree: the folder both modules are in
/// and the two entries of it they are, or inside; `None` for a module and
/// its own parent or child.
fn siblings(from: &[String], to: &[String]) -> Option<(Vec<String>, String, String)> {
    let shared = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if shared == from.len() || shared == to.len() {
        return None;
    }
    Some((
        from[..shared].to_vec(),
        from[shared].clone(),
        to[shared].clone(),
    ))
}

/// The circles of one crate: for every folder, its entries (files and
/// subfolders; the top-level modules for the crate root) as nodes, an edge
/// where one imports from the other or from inside it. Returns each set of
/// two or more that reach one another, with the folder it is in.
fn circles(krate: &str, edges: &Edges) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut graph: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, to) in edges {
        if allowed(krate, from, to) {
            continue;
        }
        if let Some((folder, a, b)) = siblings(from, to) {
            graph
                .entry(folder)
                .or_default()
                .entry(a)
                .or_default()
                .insert(b);
        }
    }
    let mut found = Vec::new();
    for (folder, adjacency) in graph {
        let reach = |start: &String| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![start.clone()];
            while let Some(node) = stack.pop() {
                for next in adjacency.get(&node).into_iter().flatten() {
                    if seen.insert(next.clone()) {
                        stack.push(next.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&String, BTreeSet<String>> =
            adjacency.keys().map(|n| (n, reach(n))).collect();
        let mut done = BTreeSet::new();
        for (node, reached) in &reaches {
            if done.contains(*node) || !reached.contains(*node) {
                continue;
            }
            let circle: BTreeSet<String> = reached
                .iter()
                .filter(|other| reaches.get(other).is_some_and(|r| r.contains(*node)))
                .cloned()
                .collect();
            done.extend(circle.iter().cloned());
            found.push((folder.clone(), circle));
        }
    }
    found
}

#[test]
fn no_circle_of_modules() {
    let mut all = Vec::new();
    for krate in CRATES.into_iter().chain(CIRCLES_ONLY) {
        let (_, edges) = crate_edges(krate);
        for (folder, circle) in circles(krate, &edges) {
            let through: Vec<String> = edges
                .iter()
                .filter(|(f, t)| !allowed(krate, f, t))
                .filter(|(f, t)| {
                    siblings(f, t).is_some_and(|(d, a, b)| {
                        d == folder && circle.contains(&a) && circle.contains(&b)
                    })
                })
                .map(|(f, t)| format!("{} -> {}", name(f), name(t)))
                .collect();
            all.push(format!(
                "{krate} {}: {circle:?} through {through:#?}",
                name(&folder)
            ));
        }
    }
    assert!(
        all.is_empty(),
        "modules importing each other, directly or round a loop: {all:#?}"
    );
}

#[test]
fn every_allowed_edge_is_still_an_import() {
    let mut stale = Vec::new();
    for krate in CRATES {
        let (_, edges) = crate_edges(krate);
        for (c, from, to) in ALLOWED.iter().filter(|(c, ..)| *c == krate) {
            if !edges
                .iter()
                .any(|(f, t)| name(f) == *from && name(t) == *to)
            {
                stale.push(format!("{c}: {from} -> {to}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "ALLOWED lists imports that are gone; remove them so the list only shrinks: {stale:#?}"
    );
}

#[test]
fn the_reader_sees_what_the_compiler_sees() {
    let code = strip(
        "use crate::a::{b::{C, d as e}, f};\n// use crate::g;\nlet s = \"crate::h\"; let c = '{';\n\
         /* crate::i */ super::j::K::new(); r#\"crate::l\"#; fn x<'a>(y: &'a str) {}",
    );
    assert!(!code.contains("crate::g") && !code.contains("crate::h"));
    assert!(!code.contains("crate::i") && !code.contains("crate::l"));
    let found = paths(&code);
    for expected in [
        "crate::a::b::C",
        "crate::a::b::d",
        "crate::a::f",
        "super::j::K::new",
    ] {
        assert!(
            found.iter().any(|p| p == expected),
            "{expected} in {found:?}"
        );
    }
    let (kept, tests) = drop_test_items(
        "use crate::a;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline { use crate::b; }\nfn f() {}",
    );
    assert_eq!(tests, ["tests"]);
    assert!(kept.contains("crate::a") && !kept.contains("crate::b") && kept.contains("fn f"));
    let module = module_of("store/redis/queue.rs");
    assert_eq!(
        absolute(&module, "super::connection::Conn"),
        Some(vec![
            "store".into(),
            "redis".into(),
            "connection".into(),
            "Conn".into()
        ])
    );
    assert_eq!(module_of("store/redis/mod.rs"), ["store", "redis"]);
}
