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

/// One admin token and the name the audit log records for it.
#[derive(Debug, Clone)]
pub struct AdminEntry {
    name: String,
    token: Vec<u8>,
}

impl AdminEntry {
    /// An admin token recorded in the audit log as `name`.
    pub fn new(name: &str, token: &str) -> Self {
        AdminEntry {
            name: name.to_owned(),
            token: token.as_bytes().to_vec(),
        }
    }
}

/// Why an Admin call was refused. One variant: every refusal is
/// PERMISSION_DENIED, and the message says which case it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AdminDenied(pub &'static str);

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
    admins: Vec<AdminEntry>,
}

/// The admin name recorded when open dev mode lets a loopback peer in.
pub const DEV_ADMIN: &str = "dev-loopback";

impl Authenticator {
    /// A table of caller `entries` and no admin; empty means open dev mode.
    pub fn new(entries: Vec<TokenEntry>) -> Self {
        Authenticator::with_admins(entries, Vec::new())
    }

    /// Caller `entries` and `admins`.
    pub fn with_admins(entries: Vec<TokenEntry>, admins: Vec<AdminEntry>) -> Self {
        Authenticator { entries, admins }
    }

    /// Whether no caller tokens are configured.
    pub fn is_open(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether no tokens of either kind are configured (Admin then answers
    /// loopback peers only).
    pub fn admin_is_open(&self) -> bool {
        self.entries.is_empty() && self.admins.is_empty()
    }

    /// Whether any admin token is configured.
    pub fn has_admins(&self) -> bool {
        !self.admins.is_empty()
    }

    /// The admin's name for the audit log, or why the call is refused.
    /// `peer_is_loopback` matters only in open dev mode.
    pub fn identify_admin(
        &self,
        authorization: Option<&str>,
        peer_is_loopback: bool,
    ) -> Result<String, AdminDenied> {
        if self.admin_is_open() {
            return if peer_is_loopback {
                Ok(DEV_ADMIN.to_owned())
            } else {
                Err(AdminDenied(
                    "open dev mode: the Admin API answers loopback peers only",
                ))
            };
        }
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(AdminDenied("the Admin API needs an admin bearer token"))?;
        let mut found = None;
        for entry in &self.admins {
            if constant_time_eq(&entry.token, token.as_bytes()) && found.is_none() {
                found = Some(entry.name.clone());
            }
        }
        if let Some(name) = found {
            return Ok(name);
        }
        let caller = self.entries.iter().fold(false, |hit, e| {
            constant_time_eq(&e.token, token.as_bytes()) | hit
        });
        Err(if caller {
            AdminDenied("a caller token may not use the Admin API")
        } else {
            AdminDenied("unknown admin token")
        })
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

    #[test]
    fn only_admin_tokens_open_the_admin_api() {
        let auth = Authenticator::with_admins(
            vec![TokenEntry::new("secret-a", &["tenant-a".into()])],
            vec![AdminEntry::new("oncall", "admin-secret")],
        );
        assert_eq!(
            auth.identify_admin(Some("Bearer admin-secret"), false),
            Ok("oncall".into())
        );
        let caller = auth.identify_admin(Some("Bearer secret-a"), true);
        assert_eq!(
            caller,
            Err(AdminDenied("a caller token may not use the Admin API"))
        );
        assert!(auth.identify_admin(None, true).is_err());
        // Admin tokens are not caller tokens either.
        assert_eq!(
            auth.identify(Some("Bearer admin-secret")),
            Err(AuthError::Unauthenticated)
        );
    }

    #[test]
    fn open_dev_mode_admits_loopback_only() {
        let auth = Authenticator::default();
        assert_eq!(auth.identify_admin(None, true), Ok(DEV_ADMIN.into()));
        assert!(auth.identify_admin(None, false).is_err());
        let no_admins = Authenticator::new(vec![TokenEntry::new("secret-a", &["a".into()])]);
        assert!(no_admins.identify_admin(None, true).is_err());
    }
}
