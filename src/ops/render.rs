//! One renderer for every operator command: each command builds its result
//! once as a JSON value (the fields scripts rely on) and, for people, a
//! table or a few aligned lines; `-o` picks which is printed.

use std::time::Duration;

use serde_json::Value;

use super::args::Output;

/// Prints `data()` as JSON or YAML, or calls `table` for `-o table`. The
/// data is built only when asked for, so the table path does no JSON work.
pub(super) fn emit(output: Output, data: impl FnOnce() -> Value, table: impl FnOnce()) {
    match output {
        Output::Table => table(),
        Output::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&data()).unwrap_or_default()
        ),
        // serde_norway ends its document with a newline of its own.
        Output::Yaml => out!("{}", serde_norway::to_string(&data()).unwrap_or_default()),
    }
}

/// Prints `rows` under `header` in columns as wide as their widest cell; the
/// last column is not padded, so lines carry no trailing blanks.
pub(super) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                let w = widths.get(i).copied().unwrap_or(0);
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(&header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    for row in rows {
        line(row);
    }
}

/// A Unix time in milliseconds as RFC 3339; `-` for "never" (zero).
pub(super) fn time(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".into();
    }
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// An empty cell reads as `-`, so columns never look shifted.
pub(super) fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// A proto enum's name without its type prefix, lower case
/// (`PRIORITY_CRITICAL` → `critical`).
pub(super) fn enum_name(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}
