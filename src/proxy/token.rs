//! The proxy's caller token for the coordinator: read from
//! `coordinator.token_file` at start, then followed the way `tollgate
//! serve` follows its own token files — the same reading rules
//! ([`read_token_file`](crate::auth::read_token_file)), re-read every
//! [`SECRETS_EVERY`](crate::server::SECRETS_EVERY) and on SIGHUP — so a
//! rotated Secret reaches the coordinator link without a restart.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tollgate_client::link::CoordinatorLink;

/// Why the token file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("coordinator.token_file {path}: {reason}")]
pub struct TokenFileError {
    /// The file.
    pub path: String,
    /// What was wrong (never the token).
    pub reason: String,
}

/// Reads the token in `path` (trimmed, at least
/// [`MIN_TOKEN_LEN`](crate::auth::MIN_TOKEN_LEN) characters: what the
/// coordinator would accept at all).
pub fn read(path: &Path) -> Result<String, TokenFileError> {
    let error = |reason: String| TokenFileError {
        path: path.display().to_string(),
        reason,
    };
    let bytes = crate::auth::read_token_file(path).map_err(error)?;
    String::from_utf8(bytes).map_err(|_| error("not UTF-8".into()))
}

/// Follows `path` for `link`, which was built with `current`; runs as long
/// as it is polled. A file that is gone, unreadable or half-written keeps
/// the token in use (logged once per change of cause): unlike a server,
/// which revokes a deleted token, a client with no token would only be
/// refused.
pub(super) async fn follow(path: PathBuf, link: CoordinatorLink, current: String) {
    let state = Mutex::new((current, None::<TokenFileError>));
    crate::signal::follow_files(crate::server::SECRETS_EVERY, || {
        let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (current, refused) = &mut *state;
        match read(&path) {
            Ok(token) if token == *current => *refused = None,
            Ok(token) => match link.set_bearer_token(Some(&token)) {
                Ok(()) => {
                    *current = token;
                    *refused = None;
                    tracing::info!(path = %path.display(), "coordinator token file reloaded");
                }
                Err(err) => {
                    tracing::error!(cause = %err, "coordinator token file unusable; keeping the token in use");
                }
            },
            Err(err) => {
                if refused.as_ref() != Some(&err) {
                    tracing::warn!(cause = %err, "keeping the coordinator token in use");
                }
                *refused = Some(err);
            }
        }
    })
    .await;
}
