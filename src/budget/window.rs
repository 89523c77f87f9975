//! The budget's sliding window: sparse per-second rows of first attempts and
//! spend per priority class.
//!
//! # Why sparse rows and not a ring of buckets per counter?
//! A fixed ring of [`MAX_WINDOW_SECS`] buckets per counter costs ~2 KiB per
//! route whether or not anything happened, and most routes of a large fleet
//! see a request every few seconds at most. A row exists only for a second
//! in which something was counted, and holds every counter of that second,
//! so a route with one lease and one report in its window keeps one 40-byte
//! row; a route with none keeps nothing.

use super::MAX_WINDOW_SECS;

/// Columns of a [`Row`].
pub(super) const FIRST_ATTEMPTS: usize = 0;

/// The column of a priority class's spend (milli-tokens).
pub(super) const fn spent_col(class: usize) -> usize {
    1 + class
}

/// One second's counters: first attempts, then spend per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    sec: i64,
    cols: [u64; 4],
}

/// The counters of the last [`MAX_WINDOW_SECS`] seconds.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    /// The newest second seen; never moves backwards, so a wall clock
    /// stepping back cannot resurrect spent tokens.
    head_sec: i64,
    /// Seconds with activity, oldest first, all within the window of
    /// `head_sec`.
    rows: Vec<Row>,
}

impl Window {
    pub(super) fn new(now_sec: i64) -> Self {
        Window {
            head_sec: now_sec,
            rows: Vec::new(),
        }
    }

    fn advance(&mut self, now_sec: i64) {
        if now_sec <= self.head_sec {
            return;
        }
        self.head_sec = now_sec;
        let oldest_kept = now_sec - MAX_WINDOW_SECS as i64;
        let expired = self.rows.partition_point(|r| r.sec <= oldest_kept);
        if expired > 0 {
            self.rows.drain(..expired);
        }
    }

    /// Adds to the newest second (a clock behind `head_sec` counts as now);
    /// returns the second charged, where a refund goes back.
    pub(super) fn add(&mut self, now_sec: i64, col: usize, value: u64) -> i64 {
        self.advance(now_sec);
        let head = self.head_sec;
        match self.rows.last_mut() {
            Some(row) if row.sec == head => row.cols[col] = row.cols[col].saturating_add(value),
            _ => {
                if self.rows.capacity() == 0 {
                    // Most routes only ever hold one row: no spare slots.
                    self.rows.reserve_exact(1);
                }
                let mut cols = [0; 4];
                cols[col] = value;
                self.rows.push(Row { sec: head, cols });
            }
        }
        head
    }

    /// Takes back from the second `sec` if it is still kept.
    pub(super) fn refund(&mut self, sec: i64, col: usize, value: u64) {
        if let Ok(i) = self.rows.binary_search_by_key(&sec, |r| r.sec) {
            let c = &mut self.rows[i].cols[col];
            *c = c.saturating_sub(value);
        }
    }

    /// The column's total over the last `window_secs` seconds.
    pub(super) fn sum(&mut self, now_sec: i64, window_secs: u32, col: usize) -> u64 {
        self.advance(now_sec);
        let window = i64::from(window_secs).min(MAX_WINDOW_SECS as i64);
        let oldest = self.head_sec - window;
        self.rows
            .iter()
            .filter(|r| r.sec > oldest)
            .map(|r| r.cols[col])
            .fold(0, u64::saturating_add)
    }

    /// Whether nothing is counted within the longest window at `now_sec`.
    pub(super) fn is_empty(&mut self, now_sec: i64) -> bool {
        self.advance(now_sec);
        self.rows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_slide_out_and_refunds_find_their_second() {
        let mut w = Window::new(100);
        assert_eq!(w.add(100, FIRST_ATTEMPTS, 7), 100);
        assert_eq!(w.add(105, spent_col(1), 3000), 105);
        assert_eq!(w.sum(105, 10, FIRST_ATTEMPTS), 7);
        assert_eq!(
            w.sum(110, 10, FIRST_ATTEMPTS),
            0,
            "second 100 left the 10 s window"
        );
        w.refund(105, spent_col(1), 1000);
        assert_eq!(w.sum(110, 10, spent_col(1)), 2000);
        // A clock behind the head counts as the head.
        assert_eq!(w.add(90, spent_col(1), 1), 110);
        assert!(!w.is_empty(110));
        assert!(w.is_empty(110 + MAX_WINDOW_SECS as i64));
    }
}
