//! The audit log: who changed what, when, before → after.
//!
//! Records are kept in memory (the newest [`MEMORY_RECORDS`], for
//! `ListAudit`) and, when a file is configured, appended to it as JSON lines
//! with an fsync per record, because an SRE's change that is acknowledged but
//! missing from the audit after a crash is worse than a slow change. The file
//! is bounded by rotation: past [`ROTATE_BYTES`] it becomes `<file>.1` (the
//! previous `.1` is dropped) and a new file starts. At start the tail of both
//! is read back, so `tollgate audit` survives restarts and sequence numbers
//! keep increasing. A line torn by a kill mid-write is skipped, never fatal.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Records kept in memory: the store layer owns the number, since a shared
/// store keeps the same count for every replica.
pub use crate::store::MEMORY_RECORDS;
/// Size at which the audit file is rotated.
pub const ROTATE_BYTES: u64 = 4 * 1024 * 1024;
/// Longest `before` / `after` text kept; a bigger state is truncated.
pub const MAX_STATE_TEXT: usize = 4096;

/// One change, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditRecord {
    /// Increases by one per record, across restarts.
    pub seq: u64,
    /// When, on the coordinator's clock.
    pub at_ms: i64,
    /// The admin token's name (never the token), `policy-file` or `expiry`.
    pub who: String,
    /// `policy.set`, `scope.freeze`, …
    pub action: String,
    /// The rule or scope changed.
    pub target: String,
    /// JSON of the state before (bounded).
    pub before: String,
    /// JSON of the state after (bounded).
    pub after: String,
    /// The policy version the change produced, or the scope's.
    pub policy_version: u64,
    /// The reason given, if any.
    pub reason: String,
}

#[derive(Debug)]
struct Inner {
    records: VecDeque<AuditRecord>,
    next_seq: u64,
    file: Option<(PathBuf, File, u64)>,
}

/// The audit log; shared, appends are serialized.
#[derive(Debug)]
pub struct AuditLog {
    inner: Mutex<Inner>,
}

impl AuditLog {
    /// A log kept in memory only.
    pub fn in_memory() -> Self {
        AuditLog {
            inner: Mutex::new(Inner {
                records: VecDeque::new(),
                next_seq: 1,
                file: None,
            }),
        }
    }

    /// A log appended to `path`, starting from what it and its rotated
    /// predecessor hold.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut records = VecDeque::new();
        for p in [rotated(path), path.to_owned()] {
            match File::open(&p) {
                Ok(f) => {
                    for line in BufReader::new(f).lines() {
                        // A torn or foreign line is not a reason to refuse to start.
                        if let Ok(r) = serde_json::from_str::<AuditRecord>(&line?) {
                            if records.len() >= MEMORY_RECORDS {
                                records.pop_front();
                            }
                            records.push_back(r);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let next_seq = records.back().map_or(1, |r: &AuditRecord| r.seq + 1);
        let mut file = open_append(path)?;
        let bytes = file.metadata()?.len();
        // After a kill mid-line, start on a fresh line so the next record
        // is not glued to the torn one.
        if bytes > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            file.seek(SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
            }
        }
        Ok(AuditLog {
            inner: Mutex::new(Inner {
                records,
                next_seq,
                file: Some((path.to_owned(), file, bytes)),
            }),
        })
    }

    /// Appends `record` (its `seq` is assigned here) and returns it.
    pub fn append(&self, mut record: AuditRecord) -> AuditRecord {
        {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            record.seq = inner.next_seq;
            inner.next_seq += 1;
        }
        self.keep(&mut record);
        record
    }

    /// Bounds `record`'s texts, logs it and keeps a copy (in memory and in
    /// the file, if any) with the sequence number it already has: with
    /// replicas the shared log in the store assigns it.
    pub fn keep(&self, record: &mut AuditRecord) {
        bound(&mut record.before);
        bound(&mut record.after);
        tracing::info!(target: "tollgate::audit", seq = record.seq, who = %record.who,
            action = %record.action, target_name = %record.target, before = %record.before,
            after = %record.after, policy_version = record.policy_version,
            reason = %record.reason, "admin change");
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.next_seq = inner.next_seq.max(record.seq + 1);
        if let Some((path, file, bytes)) = &mut inner.file
            && let Err(err) = write_line(path, file, bytes, record)
        {
            tracing::error!(cause = %err, path = %path.display(),
                "writing the audit file failed; the record is kept in memory only");
        }
        if inner.records.len() >= MEMORY_RECORDS {
            inner.records.pop_front();
        }
        inner.records.push_back(record.clone());
    }

    /// Up to `limit` records older than `before_seq` (0: the newest), newest first.
    pub fn list(&self, before_seq: u64, limit: usize) -> Vec<AuditRecord> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .records
            .iter()
            .rev()
            .filter(|r| before_seq == 0 || r.seq < before_seq)
            .take(limit)
            .cloned()
            .collect()
    }
}

/// `record` as JSON without its `seq` member: what the shared log in the
/// store stores after the sequence number it assigns (see
/// `Control`'s commit), bounded like every kept record.
pub fn body(record: &AuditRecord) -> String {
    let mut record = record.clone();
    record.seq = 0;
    bound(&mut record.before);
    bound(&mut record.after);
    let json = serde_json::to_string(&record).unwrap_or_default();
    // `seq` is the struct's first field, so its member leads the object.
    json.strip_prefix("{\"seq\":0,").unwrap_or(&json).to_owned()
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Opens the audit file for appending, creating it readable and writable
/// by its owner only: it says who changed what and when.
fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true).read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

fn write_line(
    path: &Path,
    file: &mut File,
    bytes: &mut u64,
    record: &AuditRecord,
) -> io::Result<()> {
    if *bytes >= ROTATE_BYTES {
        std::fs::rename(path, rotated(path))?;
        *file = open_append(path)?;
        *bytes = 0;
    }
    let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
    line.push(b'\n');
    file.write_all(&line)?;
    file.sync_data()?;
    *bytes += line.len() as u64;
    Ok(())
}

fn bound(text: &mut String) {
    if text.len() > MAX_STATE_TEXT {
        let mut cut = MAX_STATE_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(action: &str) -> AuditRecord {
        AuditRecord {
            seq: 0,
            at_ms: 1,
            who: "oncall".into(),
            action: action.into(),
            target: "c|r".into(),
            before: String::new(),
            after: "x".repeat(MAX_STATE_TEXT + 10),
            policy_version: 2,
            reason: String::new(),
        }
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_line() {
        let dir = std::env::temp_dir().join(format!("tollgate-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.jsonl");
        let _ = std::fs::remove_file(&path);
        let log = AuditLog::open(&path).expect("open");
        assert_eq!(log.append(record("a")).seq, 1);
        assert_eq!(log.append(record("b")).seq, 2);
        drop(log);
        // A kill in the middle of a write.
        let mut f = OpenOptions::new().append(true).open(&path).expect("reopen");
        f.write_all(b"{\"seq\":3,\"at").expect("torn");
        drop(f);
        let log = AuditLog::open(&path).expect("open again");
        let third = log.append(record("c"));
        assert_eq!(third.seq, 3);
        assert!(third.after.len() <= MAX_STATE_TEXT + '…'.len_utf8());
        let listed = log.list(0, 10);
        assert_eq!(
            listed.iter().map(|r| r.action.as_str()).collect::<Vec<_>>(),
            ["c", "b", "a"]
        );
        assert_eq!(log.list(3, 1)[0].action, "b");
        drop(log);
        let log = AuditLog::open(&path).expect("third open");
        assert_eq!(log.list(0, 10).len(), 3, "the torn line is skipped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
