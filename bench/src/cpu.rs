//! CPU time a process's threads have used, from `/proc` (Linux): what a
//! call costs the server, which a shared, noisy machine moves far less than
//! it moves requests per second.

use std::time::Duration;

/// Clock ticks per second in `/proc/*/stat` (`USER_HZ`): fixed at 100 by
/// Linux's userspace ABI on every architecture it exports `/proc` for.
const USER_HZ: u64 = 100;

/// Whose CPU time to read.
#[derive(Debug, Clone)]
pub enum Threads {
    /// This process's threads whose name starts with the prefix (an
    /// in-process server on a runtime of its own).
    OwnNamed(&'static str),
    /// Every thread of another process.
    Process(u32),
}

impl Threads {
    /// User + system time used so far; `None` where `/proc` cannot tell.
    /// A thread that ended takes its time with it, so read threads that
    /// live through the measurement (a runtime's workers).
    pub fn cpu(&self) -> Option<Duration> {
        let (pid, prefix) = match self {
            Threads::OwnNamed(prefix) => ("self".to_owned(), Some(*prefix)),
            Threads::Process(pid) => (pid.to_string(), None),
        };
        let mut ticks = 0u64;
        for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let dir = entry.ok()?.path();
            if let Some(prefix) = prefix {
                let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
                if !comm.starts_with(prefix) {
                    continue;
                }
            }
            // A thread may end between the listing and the read.
            if let Ok(stat) = std::fs::read_to_string(dir.join("stat")) {
                ticks += stat_ticks(&stat)?;
            }
        }
        Some(Duration::from_millis(ticks * 1000 / USER_HZ))
    }
}

/// `utime + stime` of one `/proc/*/stat` line. The name (field 2) is in
/// parentheses and may hold spaces or parentheses itself, so the fields are
/// counted from the last `)`: utime and stime are fields 14 and 15.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_times_are_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194368 \
                    120 0 0 0 37 5 0 0 20 0 3 0 100 0 0";
        assert_eq!(stat_ticks(stat), Some(42));
        assert_eq!(stat_ticks("4242 (short) S 1"), None);
    }

    #[test]
    fn work_shows_in_this_process_and_not_in_threads_of_another_name() {
        let me = Threads::Process(std::process::id());
        let before = me.cpu().expect("/proc");
        // Spin until a tick is counted (a bound, not a timing).
        let mut x = 0u64;
        let mut rounds = 0u64;
        while me.cpu().expect("/proc") == before {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
            rounds += 1;
            assert!(rounds < 1_000_000, "no CPU time ever counted");
        }
        assert_eq!(
            Threads::OwnNamed("no-thread-is-named-this").cpu(),
            Some(Duration::ZERO)
        );
    }
}
