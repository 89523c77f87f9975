//! Caller identity: bearer tokens mapped to the caller scopes they may use.
//!
//! With no tokens configured the coordinator runs in an open dev mode (any
//! caller, any caller scope) and says so at start. With tokens, a request
//! without a known token is unauthenticated, and a known token naming a
//! caller scope it was not given is denied. Tokens are compared in constant
//! time and never logged; only the index of the matching entry is kept.

use crate::policy::Pattern;

/// Why a caller was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer …` metadata, or a token no entry knows.
    #[error("missing or unknown bearer token")]
    Unauthenticated,
    /// The token may not use this caller scope.
    #[error("this token may not use caller_scope {caller_scope:?}")]
    Forbidden {
        /// The caller scope asked for.
        caller_scope: String,
    },
}

/// One token and the caller-scope patterns it may use.
#[derive(Debug, Clone)]
pub struct TokenEntry {
    token: Vec<u8>,
    caller_scopes: Vec<Pattern>,
}

impl TokenEntry {
    /// A token allowed the given caller-scope patterns (`exact`, `prefix*`, `*`).
    pub fn new(token: &str, caller_scopes: &[String]) -> Self {
        TokenEntry {
            token: token.as_bytes().to_vec(),
            caller_scopes: caller_scopes.iter().map(|p| Pattern::parse(p)).collect(),
        }
    }
}

/// Who is calling, once the token has been checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// Open dev mode: everything is allowed.
    Open,
    /// The index of the token entry that matched.
    Token(usize),
}

/// The token table.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    entries: Vec<TokenEntry>,
}

impl Authenticator {
    /// A table of `entries`; empty means open dev mode.
    pub fn new(entries: Vec<TokenEntry>) -> Self {
        Authenticator { entries }
    }

    /// Whether no tokens are configured.
    pub fn is_open(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks the `authorization` metadata value.
    pub fn identify(&self, authorization: Option<&str>) -> Result<Identity, AuthError> {
        if self.is_open() {
            return Ok(Identity::Open);
        }
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(AuthError::Unauthenticated)?;
        // Compare against every entry so timing does not tell which one
        // (or whether any) matched early.
        let mut found = None;
        for (i, entry) in self.entries.iter().enumerate() {
            if constant_time_eq(&entry.token, token.as_bytes()) && found.is_none() {
                found = Some(i);
            }
        }
        found.map(Identity::Token).ok_or(AuthError::Unauthenticated)
    }

    /// Whether `identity` may use `caller_scope`.
    pub fn check(&self, identity: Identity, caller_scope: &str) -> Result<(), AuthError> {
        let allowed = match identity {
            Identity::Open => true,
            Identity::Token(i) => self
                .entries
                .get(i)
                .is_some_and(|e| e.caller_scopes.iter().any(|p| p.matches(caller_scope))),
        };
        if allowed {
            Ok(())
        } else {
            Err(AuthError::Forbidden {
                caller_scope: caller_scope.to_owned(),
            })
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mode_allows_everything() {
        let auth = Authenticator::default();
        let id = auth.identify(None).expect("open");
        assert_eq!(auth.check(id, "anyone"), Ok(()));
    }

    #[test]
    fn a_token_may_use_only_its_caller_scopes() {
        let auth = Authenticator::new(vec![
            TokenEntry::new("secret-a", &["tenant-a".into(), "shared-*".into()]),
            TokenEntry::new("secret-b", &["tenant-b".into()]),
        ]);
        assert_eq!(auth.identify(None), Err(AuthError::Unauthenticated));
        assert_eq!(
            auth.identify(Some("Bearer nope")),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            auth.identify(Some("secret-a")),
            Err(AuthError::Unauthenticated)
        );
        let a = auth.identify(Some("Bearer secret-a")).expect("known");
        assert_eq!(auth.check(a, "tenant-a"), Ok(()));
        assert_eq!(auth.check(a, "shared-x"), Ok(()));
        assert!(matches!(
            auth.check(a, "tenant-b"),
            Err(AuthError::Forbidden { .. })
        ));
    }
}
