//! What `tollgate top` shows, without a terminal: the scopes fetched from the
//! Admin API, the rejections counted from their evidence, the sort, the
//! filter, the selection and the freeze dialog. Keys come in as [`Key`]
//! (not crossterm's type) and changes for the coordinator go out as
//! [`Action`], so all of it is driven by tests with no terminal at all.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tollgate_proto::v1;
use tollgate_vocab::clock::{Clock, to_unix_ms};

/// Rejections are counted over this much of the coordinator's recent
/// evidence: long enough to rank a storm, short enough to drop a past one.
pub const REJECTION_WINDOW_MS: i64 = 60_000;

/// One scope on the screen.
#[derive(Debug, Clone)]
pub struct ScopeRow {
    /// GetScope's answer, whole: a new column reads a field of it.
    pub state: v1::ScopeState,
    /// Rejections (route-level evidence) received in the last
    /// [`REJECTION_WINDOW_MS`], as far as the polls saw them.
    pub rejections: usize,
}

impl ScopeRow {
    /// `caller_scope|route`, the name operators use in every command.
    pub fn name(&self) -> String {
        format!("{}|{}", self.state.caller_scope, self.state.route)
    }

    /// Milliseconds of cooldown left at `now_ms`; 0 when none.
    pub fn cooldown_left_ms(&self, now_ms: i64) -> i64 {
        (self.state.cooldown_until_unix_ms - now_ms).max(0)
    }

    /// Whether the scope is frozen.
    pub fn frozen(&self) -> bool {
        self.state.freeze.as_ref().is_some_and(|f| f.frozen)
    }
}

/// What the rows are ordered by; every order puts the worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Most rejections first: where the storm is.
    Rejections,
    /// Longest cooldown left first.
    Cooldown,
    /// Most waiting intents first.
    Backlog,
    /// By name, for finding one scope.
    Name,
}

impl SortKey {
    /// The label in the header.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Rejections => "rejections",
            SortKey::Cooldown => "cooldown",
            SortKey::Backlog => "backlog",
            SortKey::Name => "name",
        }
    }
}

/// A key press, as the model understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A printable character.
    Char(char),
    /// Enter.
    Enter,
    /// Escape.
    Esc,
    /// Backspace.
    Backspace,
    /// Arrow up.
    Up,
    /// Arrow down.
    Down,
}

/// A change the model asks the coordinator for, or the end of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Leave `top`.
    Quit,
    /// Freeze a scope until unfrozen.
    Freeze {
        /// The caller scope.
        caller_scope: String,
        /// The route.
        route: String,
        /// Why (the coordinator requires one; workers see it).
        reason: String,
    },
}

/// Which dialog, if any, owns the keyboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Keys sort, move and start dialogs.
    Browse,
    /// `/`: typing a filter (substring of `caller_scope|route`).
    Filter,
    /// `f`: "freeze this scope?" waiting for `y`.
    ConfirmFreeze {
        /// The scope's name, fixed when `f` was pressed.
        name: String,
    },
    /// `y`: typing the freeze reason.
    FreezeReason {
        /// The scope's name.
        name: String,
        /// The reason so far.
        reason: String,
    },
}

/// The whole state of the view.
pub struct Model {
    rows: Vec<ScopeRow>,
    /// route-level hint instants seen per scope within the window; a poll
    /// shows at most the latest 16 per level, so instants are remembered
    /// across polls to keep counting past that bound.
    seen: HashMap<(String, String), VecDeque<i64>>,
    /// The coordinator's clock as far as this process can tell: injected,
    /// so tests render countdowns against the coordinator's manual clock.
    clock: Arc<dyn Clock>,
    /// The sort order.
    pub sort: SortKey,
    /// The filter (empty: every scope).
    pub filter: String,
    /// The selected row's name: kept by name so a re-sort does not move the
    /// selection to another scope under the operator's finger.
    pub selected: Option<String>,
    /// The dialog in progress.
    pub mode: Mode,
    /// The last fetch's or action's result, for the status line.
    pub status: String,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("rows", &self.rows.len())
            .field("sort", &self.sort)
            .field("filter", &self.filter)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// An empty view reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Model {
        Model {
            rows: Vec::new(),
            seen: HashMap::new(),
            clock,
            sort: SortKey::Rejections,
            filter: String::new(),
            selected: None,
            mode: Mode::Browse,
            status: String::new(),
        }
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        to_unix_ms(self.clock.now())
    }

    /// Replaces the rows with a fresh fetch, counting rejections.
    pub fn update(&mut self, states: Vec<v1::ScopeState>) {
        let since = self.now_ms() - REJECTION_WINDOW_MS;
        let mut seen = HashMap::with_capacity(states.len());
        let rows = states
            .into_iter()
            .map(|state| {
                let key = (state.caller_scope.clone(), state.route.clone());
                let mut instants = self.seen.remove(&key).unwrap_or_default();
                let newest = instants.back().copied().unwrap_or(i64::MIN);
                instants.extend(
                    state
                        .recent_hints
                        .iter()
                        .filter(|h| h.level == "route" && h.at_unix_ms > newest)
                        .map(|h| h.at_unix_ms),
                );
                while instants.front().is_some_and(|at| *at <= since) {
                    instants.pop_front();
                }
                let rejections = instants.len();
                seen.insert(key, instants);
                ScopeRow { state, rejections }
            })
            .collect();
        self.seen = seen;
        self.rows = rows;
    }

    /// The rows to show: filtered, then sorted worst first (ties by name).
    pub fn visible(&self) -> Vec<&ScopeRow> {
        let now = self.now_ms();
        let mut rows: Vec<&ScopeRow> = self
            .rows
            .iter()
            .filter(|r| self.filter.is_empty() || r.name().contains(&self.filter))
            .collect();
        rows.sort_by(|a, b| {
            let worst = match self.sort {
                SortKey::Rejections => b.rejections.cmp(&a.rejections),
                SortKey::Cooldown => b.cooldown_left_ms(now).cmp(&a.cooldown_left_ms(now)),
                SortKey::Backlog => b.state.slot_backlog.cmp(&a.state.slot_backlog),
                SortKey::Name => std::cmp::Ordering::Equal,
            };
            worst.then_with(|| a.name().cmp(&b.name()))
        });
        rows
    }

    /// The selected row, or the first visible one.
    pub fn selection(&self) -> Option<&ScopeRow> {
        let rows = self.visible();
        let chosen = self
            .selected
            .as_ref()
            .and_then(|name| rows.iter().find(|r| &r.name() == name));
        chosen.or(rows.first()).copied()
    }

    /// The first `n` visible scopes, to Watch: state is per route, so the
    /// priority named is only the one Watch requires.
    pub fn watch_scopes(&self, n: usize) -> Vec<v1::Scope> {
        self.visible()
            .iter()
            .take(n)
            .map(|r| v1::Scope {
                caller_scope: r.state.caller_scope.clone(),
                route: r.state.route.clone(),
                priority: v1::Priority::Normal.into(),
            })
            .collect()
    }

    /// Feeds one key press; returns what the coordinator should do, if
    /// anything.
    pub fn on_key(&mut self, key: Key) -> Option<Action> {
        match std::mem::replace(&mut self.mode, Mode::Browse) {
            Mode::Browse => return self.browse(key),
            Mode::Filter => match key {
                Key::Enter => {}
                Key::Esc => self.filter.clear(),
                Key::Backspace => {
                    self.filter.pop();
                    self.mode = Mode::Filter;
                }
                Key::Char(c) => {
                    self.filter.push(c);
                    self.mode = Mode::Filter;
                }
                Key::Up | Key::Down => self.mode = Mode::Filter,
            },
            Mode::ConfirmFreeze { name } => {
                if key == Key::Char('y') {
                    self.mode = Mode::FreezeReason {
                        name,
                        reason: String::new(),
                    };
                } else {
                    self.status = "freeze cancelled".into();
                }
            }
            Mode::FreezeReason { name, mut reason } => match key {
                Key::Esc => self.status = "freeze cancelled".into(),
                Key::Enter if reason.trim().is_empty() => {
                    self.status = "a freeze needs a reason".into();
                    self.mode = Mode::FreezeReason { name, reason };
                }
                Key::Enter => return self.freeze_action(&name, reason),
                Key::Backspace => {
                    reason.pop();
                    self.mode = Mode::FreezeReason { name, reason };
                }
                Key::Char(c) => {
                    reason.push(c);
                    self.mode = Mode::FreezeReason { name, reason };
                }
                Key::Up | Key::Down => self.mode = Mode::FreezeReason { name, reason },
            },
        }
        None
    }

    fn browse(&mut self, key: Key) -> Option<Action> {
        match key {
            Key::Char('q') | Key::Esc => return Some(Action::Quit),
            Key::Char('r') => self.sort = SortKey::Rejections,
            Key::Char('c') => self.sort = SortKey::Cooldown,
            Key::Char('b') => self.sort = SortKey::Backlog,
            Key::Char('n') => self.sort = SortKey::Name,
            Key::Char('/') => self.mode = Mode::Filter,
            Key::Char('f') => match self.selection() {
                Some(row) => self.mode = Mode::ConfirmFreeze { name: row.name() },
                None => self.status = "no scope to freeze".into(),
            },
            Key::Up | Key::Char('k') => self.move_selection(-1),
            Key::Down | Key::Char('j') => self.move_selection(1),
            _ => {}
        }
        None
    }

    fn move_selection(&mut self, by: isize) {
        let rows = self.visible();
        let at = self
            .selection()
            .and_then(|s| rows.iter().position(|r| r.name() == s.name()))
            .unwrap_or(0);
        let next = at
            .saturating_add_signed(by)
            .min(rows.len().saturating_sub(1));
        self.selected = rows.get(next).map(|r| r.name());
    }

    fn freeze_action(&mut self, name: &str, reason: String) -> Option<Action> {
        // The name was taken from a row; find the row again rather than
        // splitting on `|`, which a route may contain.
        let Some(row) = self.rows.iter().find(|r| r.name() == name) else {
            self.status = format!("{name} is no longer listed");
            return None;
        };
        Some(Action::Freeze {
            caller_scope: row.state.caller_scope.clone(),
            route: row.state.route.clone(),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use tollgate_vocab::clock::{ManualClock, from_unix_ms};

    use super::*;

    const NOW: i64 = 1_704_110_400_000;

    fn state(
        caller: &str,
        route: &str,
        hints: usize,
        cooldown_ms: i64,
        backlog: u32,
    ) -> v1::ScopeState {
        v1::ScopeState {
            caller_scope: caller.into(),
            route: route.into(),
            known: true,
            cooldown_until_unix_ms: if cooldown_ms > 0 {
                NOW + cooldown_ms
            } else {
                0
            },
            slot_backlog: backlog,
            recent_hints: (0..hints)
                .map(|i| v1::HintRecord {
                    at_unix_ms: NOW - 1_000 + i as i64,
                    level: "route".into(),
                    ..v1::HintRecord::default()
                })
                .collect(),
            ..v1::ScopeState::default()
        }
    }

    fn model() -> (Model, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(from_unix_ms(NOW)));
        let mut m = Model::new(clock.clone());
        m.update(vec![
            state("a", "GET /x", 1, 30_000, 0),
            state("a", "GET /y", 5, 1_000, 2),
            state("b", "GET /x", 0, 0, 9),
        ]);
        (m, clock)
    }

    fn names(m: &Model) -> Vec<String> {
        m.visible().iter().map(|r| r.name()).collect()
    }

    #[test]
    fn every_sort_puts_the_worst_first() {
        let (mut m, _) = model();
        assert_eq!(names(&m), ["a|GET /y", "a|GET /x", "b|GET /x"]);
        m.on_key(Key::Char('c'));
        assert_eq!(names(&m), ["a|GET /x", "a|GET /y", "b|GET /x"]);
        m.on_key(Key::Char('b'));
        assert_eq!(names(&m), ["b|GET /x", "a|GET /y", "a|GET /x"]);
        m.on_key(Key::Char('n'));
        assert_eq!(names(&m), ["a|GET /x", "a|GET /y", "b|GET /x"]);
    }

    #[test]
    fn the_filter_is_typed_after_a_slash_and_escape_clears_it() {
        let (mut m, _) = model();
        for k in [Key::Char('/'), Key::Char('b'), Key::Char('|'), Key::Enter] {
            assert_eq!(m.on_key(k), None);
        }
        assert_eq!(names(&m), ["b|GET /x"]);
        m.on_key(Key::Char('/'));
        m.on_key(Key::Esc);
        assert_eq!(names(&m).len(), 3);
    }

    #[test]
    fn rejections_are_remembered_across_polls_and_age_out() {
        let (mut m, clock) = model();
        // The next poll shows the same five hints and one newer one.
        let mut next = state("a", "GET /y", 5, 0, 0);
        next.recent_hints.push(v1::HintRecord {
            at_unix_ms: NOW + 10,
            level: "route".into(),
            ..v1::HintRecord::default()
        });
        next.recent_hints.remove(0);
        m.update(vec![next.clone()]);
        assert_eq!(m.visible()[0].rejections, 6);
        clock.advance(std::time::Duration::from_millis(REJECTION_WINDOW_MS as u64));
        m.update(vec![next]);
        assert_eq!(
            m.visible()[0].rejections,
            1,
            "only the newest is in the window"
        );
    }

    #[test]
    fn a_freeze_needs_f_then_y_then_a_reason() {
        let (mut m, _) = model();
        m.on_key(Key::Down);
        assert_eq!(m.on_key(Key::Char('f')), None);
        assert_eq!(m.on_key(Key::Char('n')), None, "anything but y cancels");
        assert_eq!(m.mode, Mode::Browse);
        m.on_key(Key::Char('f'));
        m.on_key(Key::Char('y'));
        assert_eq!(m.on_key(Key::Enter), None, "an empty reason is refused");
        for c in "INC-1".chars() {
            m.on_key(Key::Char(c));
        }
        assert_eq!(
            m.on_key(Key::Enter),
            Some(Action::Freeze {
                caller_scope: "a".into(),
                route: "GET /x".into(),
                reason: "INC-1".into(),
            })
        );
        assert_eq!(m.on_key(Key::Char('q')), Some(Action::Quit));
    }
}
