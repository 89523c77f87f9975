//! Draws a [`Model`] with ratatui: a title line, the scope table and a
//! line for the dialog or the keys. The same widget fills the terminal and,
//! for `--once`, a buffer printed as text.
//!
//! The table's columns are [`COLUMNS`]: one entry per column, so showing
//! another field of `GetScope` is one line there.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Row, Table, Widget};
use tollgate_proto::v1;

use super::model::{Mode, Model, ScopeRow};

/// One column: its title, its width, and how a row's cell reads.
pub struct Column {
    /// The header.
    pub title: &'static str,
    /// Width in cells; 0 takes what the others leave.
    pub width: u16,
    /// The cell for a row at the model's now (Unix ms), for countdowns.
    pub cell: fn(&ScopeRow, i64) -> String,
    /// Shown only when some row's cell says something (is not `-`): a
    /// field most scopes lack does not take the scope name's room.
    pub optional: bool,
}

/// The columns, left to right; one line each: a new `GetScope` field is one
/// more line.
pub const COLUMNS: &[Column] = &[
    col("SCOPE", 0, |r, _| r.name()),
    col("REJ/1m", 6, |r, _| r.rejections.to_string()),
    col("COOLDOWN", 8, |r, now| countdown(r.cooldown_left_ms(now))),
    col("BACKOFF", 10, backoff),
    col("LEFT C/N/B", 14, |r, _| budget_left(&r.state)),
    col("WAITING", 7, |r, _| r.state.slot_backlog.to_string()),
    col("WAKE/s", 12, |r, _| pacing(r, wake)),
    Column {
        optional: true,
        ..col("STATED LEFT/RESET", 21, |r, now| {
            pacing(r, |p| stated(p, now))
        })
    },
    col("LEASES", 6, |r, _| r.state.leases_outstanding.to_string()),
    col("FROZEN", 11, frozen),
    col("VER", 4, |r, _| r.state.policy_version.to_string()),
];

/// The learned pacing in a few cells: its state, shortened, and the rate
/// it wakes intents at.
fn wake(p: &v1::PacingState) -> String {
    let state = match p.state.as_str() {
        "backing_off" => "backoff",
        "penalty_extending" => "penalty",
        "known_limit" => "limit",
        "stated_limit" => "stated",
        "saturated" => "sat",
        other => other,
    };
    format!("{state} {:.0}", p.wake_rate)
}

/// The upstream's stated limit in a few cells: the remaining quota of the
/// binding limit, the time to its reset, and the pace it sets; `-` when
/// nothing is stated or it expired.
fn stated(p: &v1::PacingState, now: i64) -> String {
    match p.stated.as_ref() {
        Some(s) if matches!(s.state.as_str(), "corroborated" | "uncorroborated") => {
            let mark = if s.state == "corroborated" { "" } else { "?" };
            format!(
                "{}/{} {} {:.0}{mark}",
                s.remaining,
                s.limit,
                countdown((s.reset_unix_ms - now).max(0)),
                s.pace
            )
        }
        _ => "-".to_owned(),
    }
}

/// A pacing cell, `-` for a scope the coordinator holds nothing for.
fn pacing(r: &ScopeRow, cell: impl Fn(&v1::PacingState) -> String) -> String {
    r.state.pacing.as_ref().map_or_else(|| "-".to_owned(), cell)
}

/// A [`Column`], short enough that rustfmt keeps each on one line.
const fn col(title: &'static str, width: u16, cell: fn(&ScopeRow, i64) -> String) -> Column {
    Column {
        title,
        width,
        cell,
        optional: false,
    }
}

/// The whole screen, as a widget.
pub struct Screen<'a> {
    /// What to draw.
    pub model: &'a Model,
    /// The coordinator's address, for the title.
    pub server: &'a str,
}

impl Widget for Screen<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let [title, table, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(1),
            Constraint::Length(1),
        ])
        .areas(area);
        let m = self.model;
        let rows = m.visible();
        let filter = if m.filter.is_empty() {
            String::new()
        } else {
            format!("  filter: {}", m.filter)
        };
        Line::from(format!(
            "tollgate top  {}  {} scopes  sort: {}{filter}  {}",
            self.server,
            rows.len(),
            m.sort.label(),
            super::super::render::time(m.now_ms()),
        ))
        .style(Style::new().add_modifier(Modifier::BOLD))
        .render(title, buf);

        let now = m.now_ms();
        let selected = m.selection().map(|r| r.name());
        let columns: Vec<&Column> = COLUMNS
            .iter()
            .filter(|c| !c.optional || rows.iter().any(|r| (c.cell)(r, now) != "-"))
            .collect();
        let body = rows.iter().map(|r| {
            let row = Row::new(columns.iter().map(|c| Cell::from((c.cell)(r, now))));
            if selected.as_ref() == Some(&r.name()) {
                row.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                row
            }
        });
        let widths = columns.iter().map(|c| match c.width {
            0 => Constraint::Min(20),
            w => Constraint::Length(w),
        });
        Table::new(body, widths)
            .header(
                Row::new(columns.iter().map(|c| c.title))
                    .style(Style::new().add_modifier(Modifier::UNDERLINED)),
            )
            .column_spacing(2)
            .render(table, buf);

        Line::from(footer_text(m)).render(footer, buf);
    }
}

fn footer_text(m: &Model) -> String {
    match &m.mode {
        Mode::Browse if !m.status.is_empty() => format!("{}   (q quits)", m.status),
        Mode::Browse => {
            "q quit  j/k move  sort: r rejections  c cooldown  b backlog  n name  / filter  f freeze"
                .into()
        }
        Mode::Filter => format!("filter: {}_   (Enter keeps, Esc clears)", m.filter),
        Mode::ConfirmFreeze { name } => format!("freeze {name}? y to continue, any key cancels"),
        Mode::FreezeReason { name, reason } => {
            format!("freeze {name}: reason: {reason}_   (Enter freezes, Esc cancels)")
        }
    }
}

/// The buffer's text, one line per row without trailing blanks: what
/// `--once` prints and what tests read.
pub fn buffer_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A duration left, short: `-` for none, `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn countdown(ms: i64) -> String {
    match ms {
        ..=0 => "-".into(),
        1..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// Hintless rejections' backoff: its step and, when it holds the scope
/// past the cooldown, how long.
fn backoff(r: &ScopeRow, now: i64) -> String {
    let s = &r.state;
    if s.backoff_step == 0 {
        return "-".into();
    }
    let held = s.floor_unix_ms.max(now) - s.cooldown_until_unix_ms.max(now);
    if held > 0 {
        format!("#{} {}", s.backoff_step, countdown(held))
    } else {
        format!("#{}", s.backoff_step)
    }
}

/// Tokens each priority class can still lease, critical/normal/bulk.
fn budget_left(s: &v1::ScopeState) -> String {
    let of = |p: v1::Priority| {
        s.classes
            .iter()
            .find(|c| c.priority() == p)
            .map_or("-".into(), |c| format!("{:.0}", c.available.floor()))
    };
    if s.classes.is_empty() {
        return "-".into();
    }
    format!(
        "{}/{}/{}",
        of(v1::Priority::Critical),
        of(v1::Priority::Normal),
        of(v1::Priority::Bulk)
    )
}

/// `-`, or `yes` with how long is left (who and why: `scopes show`).
fn frozen(r: &ScopeRow, now: i64) -> String {
    match r.state.freeze.as_ref().filter(|f| f.frozen) {
        None => "-".into(),
        Some(f) if f.expires_at_unix_ms > 0 => {
            format!("yes, {}", countdown(f.expires_at_unix_ms - now))
        }
        Some(_) => "yes".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn countdowns_are_short_and_never_negative() {
        assert_eq!(countdown(-5), "-");
        assert_eq!(countdown(850), "850ms");
        assert_eq!(countdown(12_340), "12.3s");
        assert_eq!(countdown(245_000), "4m05s");
        assert_eq!(countdown(7_380_000), "2h03m");
    }
}
