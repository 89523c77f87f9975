//! nginx's access log, read back: one [`Logged`] per line of the
//! `tollgate` log format that [`config`](super::config) asks nginx for, and the
//! per-second counts of a run.
//!
//! The format is `$msec $request_time $status PHASE
//! $http_x_tollgate_deadline_unix_ms`: when nginx logged the request (Unix
//! seconds with milliseconds), how long it took, its status, the
//! configuration that answered it (a literal in each configuration's
//! `log_format`, so a line says itself whether it fell in the outage), and
//! the intent's deadline as the worker sent it (`-` when absent). Times are
//! parsed as integers: a float would turn `.001` into an off-by-one.

use serde::Serialize;
use thiserror::Error;

use super::config::Phase;

/// One request as nginx logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// When the request arrived (`$msec − $request_time`), Unix ms: the
    /// instant the deadline is judged against, as the upstream stand-in
    /// judges it.
    pub arrived_unix_ms: i64,
    /// The status sent: 200 served, 429 refused.
    pub status: u16,
    /// The configuration in force when nginx answered.
    pub phase: Phase,
    /// The intent's deadline, Unix ms; `None` for a request without one.
    pub deadline_unix_ms: Option<i64>,
}

impl Logged {
    /// Whether the attempt arrived at or after its intent's deadline.
    pub fn after_deadline(&self) -> bool {
        self.deadline_unix_ms
            .is_some_and(|deadline| self.arrived_unix_ms >= deadline)
    }
}

/// A line that is not in the `tollgate` format.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("access log line {line}: {problem}: {text:?}")]
pub struct LogLineError {
    /// 1-based, as an editor shows it.
    pub line: usize,
    /// What is wrong with it.
    pub problem: &'static str,
    /// The line itself (a few dozen bytes of numbers, no payload).
    pub text: String,
}

/// Parses one line (`number` is its 1-based position, for the error).
pub fn parse_line(number: usize, text: &str) -> Result<Logged, LogLineError> {
    let error = |problem| LogLineError {
        line: number,
        problem,
        text: text.to_owned(),
    };
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    let [msec, request_time, status, phase, deadline] = fields[..] else {
        return Err(error("not five fields"));
    };
    let logged_ms = millis(msec).ok_or_else(|| error("$msec is not seconds.millis"))?;
    let took_ms =
        millis(request_time).ok_or_else(|| error("$request_time is not seconds.millis"))?;
    let status = status
        .parse()
        .map_err(|_| error("$status is not a number"))?;
    let phase = Phase::from_log(phase).ok_or_else(|| error("unknown phase"))?;
    let deadline_unix_ms = match deadline {
        "-" => None,
        deadline => Some(
            deadline
                .parse()
                .map_err(|_| error("the deadline is not Unix ms"))?,
        ),
    };
    Ok(Logged {
        arrived_unix_ms: logged_ms - took_ms,
        status,
        phase,
        deadline_unix_ms,
    })
}

/// Parses a whole log; the first bad line is the error (a benchmark that
/// cannot read its upstream's log has nothing to report).
pub fn parse(text: &str) -> Result<Vec<Logged>, LogLineError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| parse_line(i + 1, line))
        .collect()
}

/// `S.mmm` (nginx's `$msec` and `$request_time`) as milliseconds.
fn millis(text: &str) -> Option<i64> {
    let (seconds, fraction) = text.split_once('.')?;
    if fraction.len() != 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds: i64 = seconds.parse().ok().filter(|&s| s >= 0)?;
    let fraction: i64 = fraction.parse().ok()?;
    seconds.checked_mul(1000)?.checked_add(fraction)
}

/// What nginx answered in one second of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Second {
    /// Requests that arrived in it.
    pub offered: u64,
    /// Of those, answered 200.
    pub served: u64,
    /// Of those, answered 429.
    pub refused: u64,
}

/// Counts per whole second from `start_unix_ms` (second 0 is the first),
/// at least `seconds` of them and more if the log goes on; a line before
/// the start is counted in second 0.
pub fn per_second(lines: &[Logged], start_unix_ms: i64, seconds: usize) -> Vec<Second> {
    let mut counts = vec![Second::default(); seconds];
    for line in lines {
        let i = usize::try_from((line.arrived_unix_ms - start_unix_ms).max(0) / 1000)
            .unwrap_or(usize::MAX);
        if i >= counts.len() {
            counts.resize(i + 1, Second::default());
        }
        let second = &mut counts[i];
        second.offered += 1;
        match line.status {
            200 => second.served += 1,
            429 => second.refused += 1,
            _ => {}
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_line_with_a_deadline() {
        let line = parse_line(1, "1767225600.123 0.002 200 limit 1767225610000").expect("parses");
        assert_eq!(
            line,
            Logged {
                arrived_unix_ms: 1_767_225_600_121,
                status: 200,
                phase: Phase::Limit,
                deadline_unix_ms: Some(1_767_225_610_000),
            }
        );
        assert!(!line.after_deadline());
    }

    #[test]
    fn an_outage_refusal_without_a_deadline() {
        let line = parse_line(7, "1767225600.000 0.000 429 outage -").expect("parses");
        assert_eq!(line.status, 429);
        assert_eq!(line.phase, Phase::Outage);
        assert_eq!(line.deadline_unix_ms, None);
        assert!(!line.after_deadline());
    }

    #[test]
    fn an_attempt_at_or_after_its_deadline_is_late() {
        let at = parse_line(1, "100.000 0.000 429 limit 100000").expect("parses");
        let after = parse_line(1, "100.001 0.000 429 limit 100000").expect("parses");
        let before = parse_line(1, "100.005 0.006 429 limit 100000").expect("parses");
        assert!(at.after_deadline());
        assert!(after.after_deadline());
        assert!(
            !before.after_deadline(),
            "judged at arrival, not at logging"
        );
    }

    #[test]
    fn malformed_lines_name_their_line_and_problem() {
        let cases = [
            ("1.000 0.000 200 limit", "not five fields"),
            ("1.000 0.000 200 limit - extra", "not five fields"),
            ("1.0 0.000 200 limit -", "$msec is not seconds.millis"),
            ("1 0.000 200 limit -", "$msec is not seconds.millis"),
            ("-1.000 0.000 200 limit -", "$msec is not seconds.millis"),
            ("1.000 x 200 limit -", "$request_time is not seconds.millis"),
            ("1.000 0.000 OK limit -", "$status is not a number"),
            ("1.000 0.000 200 maintenance -", "unknown phase"),
            ("1.000 0.000 200 limit soon", "the deadline is not Unix ms"),
        ];
        for (text, problem) in cases {
            let err = parse_line(3, text).expect_err(text);
            assert_eq!((err.line, err.problem), (3, problem), "{text}");
        }
        let err = parse("1.000 0.000 200 limit -\n\nbroken\n").expect_err("line 3");
        assert_eq!(err.line, 3);
    }

    #[test]
    fn seconds_count_offered_served_and_refused_from_the_start() {
        let log = "\
1000.100 0.000 200 limit -
1000.999 0.000 429 limit -
1001.000 0.000 200 limit -
1003.500 0.000 429 outage -
1003.600 0.000 503 outage -
999.900 0.000 200 limit -
";
        let lines = parse(log).expect("parses");
        let seconds = per_second(&lines, 1_000_000, 2);
        let s = |offered, served, refused| Second {
            offered,
            served,
            refused,
        };
        assert_eq!(
            seconds,
            vec![s(3, 2, 1), s(1, 1, 0), s(0, 0, 0), s(2, 0, 1)],
            "grown to the last line; other statuses are offered only"
        );
    }
}
