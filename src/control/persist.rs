//! The state file: runtime changes that must outlive the process.
//!
//! With the in-memory store nothing else remembers an SRE's change, so the
//! running policy document, the freezes and the mutes are written here on every change,
//! *before* the change is put in force (an acknowledged change is a durable
//! one). The write is atomic: a temporary file in the same directory, fsync,
//! rename over the old file, fsync of the directory — so a kill at any
//! instant leaves either the old or the new file, never a torn one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::config::PolicyDoc;

use super::overrides::Overrides;

/// The state file's format version; a newer one is refused, not misread.
pub const FORMAT: u32 = 1;

/// A freeze, as persisted and as shown to operators.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FreezeRecord {
    /// The caller scope.
    pub caller_scope: String,
    /// The route.
    pub route: String,
    /// Why.
    pub reason: String,
    /// Who (the admin token's name).
    pub by: String,
    /// When it started.
    pub since_ms: i64,
    /// When it lifts by itself.
    pub expires_at_ms: Option<i64>,
}

/// A muted worker's evidence on one scope, as persisted and as shown to
/// operators.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MuteRecord {
    /// The caller scope.
    pub caller_scope: String,
    /// The route.
    pub route: String,
    /// The worker whose hints no longer move cooldowns there.
    pub worker_id: String,
    /// Why.
    pub reason: String,
    /// Who (the admin token's name).
    pub by: String,
    /// When it started.
    pub since_ms: i64,
    /// When it lifts by itself.
    pub expires_at_ms: Option<i64>,
}

/// Everything the state file holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateFile {
    /// [`FORMAT`].
    pub format: u32,
    /// Digest of the policy-file text the document was last reconciled
    /// with; when the file differs at start, the file is applied on top
    /// (it changed while the coordinator was down, and the file wins, as it
    /// does on a live reload).
    pub file_digest: u64,
    /// The running policy document, with every version explicit.
    pub doc: PolicyDoc,
    /// Freezes in force.
    pub freezes: Vec<FreezeRecord>,
    /// The policy file's layer under the runtime changes (absent in a
    /// file written before the layers: then `doc` is taken as the file's).
    #[serde(default)]
    pub file_doc: Option<PolicyDoc>,
    /// The runtime changes laid over the file's layer.
    #[serde(default)]
    pub overrides: Overrides,
    /// Mutes in force; absent in files written before mutes existed.
    #[serde(default)]
    pub mutes: Vec<MuteRecord>,
}

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading or writing failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not a state file this version understands.
    #[error("state file {path}: {reason} (move it aside to start from the policy file alone)")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Reads the state file; `None` when there is none yet.
pub fn load(path: &Path) -> Result<Option<StateFile>, PersistError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let invalid = |reason: String| PersistError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let state: StateFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if state.format != FORMAT {
        return Err(invalid(format!("format {} is not {FORMAT}", state.format)));
    }
    state
        .doc
        .build()
        .map_err(|e| invalid(format!("policy: {e}")))?;
    Ok(Some(state))
}

/// Writes `state` to `path` atomically (temp file, fsync, rename, fsync dir).
pub fn save(path: &Path, state: &StateFile) -> Result<(), PersistError> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| PersistError::Invalid {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    write_atomic(path, &bytes).map_err(|source| PersistError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Replaces `path` with `bytes` so that a crash leaves the old or the new
/// content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("state path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    // Owner only: the state holds the runtime policy and who changed it.
    // A temp file left by a crash may have other modes: start afresh.
    let _ = fs::remove_file(&tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    // The rename itself is durable only once the directory is.
    File::open(&dir)?.sync_all()
}

/// FNV-1a of the policy-file text: stable across Rust versions (unlike
/// `DefaultHasher`), and a change detector, not a defence.
pub fn digest(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
