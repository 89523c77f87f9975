//! Caller identity: bearer tokens mapped to the caller scopes they may use.
//!
//! With no tokens configured the coordinator runs in an open dev mode (any
//! caller, any caller scope) and says so at start. With tokens, a request
//! without a known token is unauthenticated (UNAUTHENTICATED), and a known
//! token asking for something it was not given — another caller scope, or
//! the Admin API with a caller token — is denied (PERMISSION_DENIED); the
//! same two codes on every service. Tokens are kept and compared as
//! SHA-256 digests, in constant time whatever their lengths (the presented
//! token is hashed once; a digest comparison cannot stop early at a length
//! mismatch), and never logged; only the index of the matching entry is
//! kept.
//!
//! A table where two entries hold the same token, or an admin token is
//! also a caller token, is refused: at start by the policy file's parser,
//! and on every reload of token files by [`Authenticator::reload_files`],
//! which then keeps the table it had. Such a table would otherwise make
//! the second entry's scopes dead, name the wrong holder in the audit, or
//! make a caller an admin.
//!
//! A token may live in a file (a mounted Kubernetes Secret): the table is
//! shared by every clone of the [`Authenticator`], and
//! [`Authenticator::reload_files`] re-reads the files in place, so a
//! rotated token works and a removed one is refused from the next request
//! on. Repeated bad tokens are slowed down and summarized by [`throttle`].

pub mod throttle;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ring::digest::{SHA256, digest};

use crate::policy::Pattern;

/// Shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 8;

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

/// A token's SHA-256 digest: what the table keeps instead of the value.
type Digest = [u8; 32];

/// The digest of `token`.
fn digest_of(token: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, token).as_ref());
    out
}

/// A token's value and, for a file-backed one, where it is re-read from.
#[derive(Debug, Clone)]
struct Secret {
    /// The value's digest. `None`: the file is missing, unreadable or too
    /// short; the entry then matches nothing (an empty value must never
    /// match an empty header).
    value: Option<Digest>,
    file: Option<PathBuf>,
    /// Bumped whenever `value` changes, so a stream opened with the old
    /// value can tell it was revoked.
    generation: u64,
}

impl Secret {
    fn inline(token: &str) -> Secret {
        Secret {
            value: Some(digest_of(token.trim().as_bytes())),
            file: None,
            generation: 0,
        }
    }

    fn from_file(path: &Path) -> Result<Secret, String> {
        Ok(Secret {
            value: Some(digest_of(&read_token_file(path)?)),
            file: Some(path.to_owned()),
            generation: 0,
        })
    }

    /// Whether this secret's value has `presented` as its digest.
    fn matches(&self, presented: &Digest) -> bool {
        self.value
            .as_ref()
            .is_some_and(|v| constant_time_eq(v, presented))
    }

    /// Re-reads a file-backed secret; whether its value changed.
    fn reload(&mut self) -> bool {
        let Some(path) = &self.file else {
            return false;
        };
        let fresh = match read_token_file(path) {
            Ok(value) => Some(digest_of(&value)),
            Err(reason) => {
                if self.value.is_some() {
                    tracing::warn!(file = %path.display(), %reason, "token file unusable: its token is refused until it is fixed");
                }
                None
            }
        };
        let changed = fresh != self.value;
        if changed {
            self.generation += 1;
        }
        self.value = fresh;
        changed
    }
}

/// The token in `path`, trimmed (a Secret mount often ends in a newline).
/// The error never contains the file's content.
pub fn read_token_file(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading token file: {e}"))?;
    let token = text.trim();
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!("token must be at least {MIN_TOKEN_LEN} characters"));
    }
    Ok(token.as_bytes().to_vec())
}

/// One token and the caller-scope patterns it may use.
#[derive(Debug, Clone)]
pub struct TokenEntry {
    secret: Secret,
    caller_scopes: Vec<Pattern>,
    /// What the entry is called where its holdings are shown (metrics,
    /// `tollgate scopes`): never the token. `None`: `token-<N>`.
    name: Option<String>,
    /// Its own scope quota, instead of its fair share.
    max_scopes: Option<usize>,
    /// Its own bound on Budget calls in flight, instead of its fair share.
    max_concurrent_requests: Option<usize>,
}

pub use crate::tenancy::TenantSpec;

impl TokenEntry {
    /// A token allowed the given caller-scope patterns (`exact`, `prefix*`, `*`).
    pub fn new(token: &str, caller_scopes: &[String]) -> Self {
        TokenEntry {
            secret: Secret::inline(token),
            caller_scopes: caller_scopes.iter().map(|p| Pattern::parse(p)).collect(),
            name: None,
            max_scopes: None,
            max_concurrent_requests: None,
        }
    }

    /// A token read from `path` (and re-read by
    /// [`Authenticator::reload_files`]); the error says why the file is
    /// unusable, never what it holds.
    pub fn from_file(path: &Path, caller_scopes: &[String]) -> Result<Self, String> {
        Ok(TokenEntry {
            secret: Secret::from_file(path)?,
            ..TokenEntry::new("", caller_scopes)
        })
    }

    /// The entry named `name` where its holdings are shown.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// The entry with its own quotas (`None`: its fair share).
    pub fn with_quotas(
        mut self,
        max_scopes: Option<usize>,
        max_concurrent_requests: Option<usize>,
    ) -> Self {
        self.max_scopes = max_scopes;
        self.max_concurrent_requests = max_concurrent_requests;
        self
    }
}

/// One admin token and the name the audit log records for it.
#[derive(Debug, Clone)]
pub struct AdminEntry {
    name: String,
    secret: Secret,
}

impl AdminEntry {
    /// An admin token recorded in the audit log as `name`.
    pub fn new(name: &str, token: &str) -> Self {
        AdminEntry {
            name: name.to_owned(),
            secret: Secret::inline(token),
        }
    }

    /// An admin token read from `path`, re-read on reload.
    pub fn from_file(name: &str, path: &Path) -> Result<Self, String> {
        Ok(AdminEntry {
            name: name.to_owned(),
            secret: Secret::from_file(path)?,
        })
    }
}

/// Why an Admin call was refused; the message says which case it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminDenied {
    /// No admin bearer token, or one no entry knows (UNAUTHENTICATED, as
    /// on the Budget service).
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A known credential without the admin right, or a non-loopback peer
    /// in open dev mode (PERMISSION_DENIED).
    #[error("{0}")]
    Forbidden(&'static str),
}

/// Who is calling, once the token has been checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Open dev mode: everything is allowed.
    Open,
    /// The index of the token entry that matched. Stable across reloads:
    /// a reload changes values, never the list of entries.
    Token(usize),
}

impl Identity {
    /// The id a worker or an intent a caller names has in the stores: a
    /// token owns the workers and intents it names, so another token that
    /// shares its caller scope and sends the same id (guessed, or read off
    /// a trace) names a different worker: it cannot release that worker's
    /// leases, take its intent's slot or add its claims to that worker's.
    /// A token's ids are [`owned_id`](crate::scope::owned_id)s of its
    /// `[[token]]` entry (1-based in file order, as errors name entries).
    /// Open dev mode has one owner and keeps ids as sent.
    pub fn own<'a>(&self, id: &'a str) -> std::borrow::Cow<'a, str> {
        match self {
            Identity::Open => std::borrow::Cow::Borrowed(id),
            Identity::Token(index) => {
                std::borrow::Cow::Owned(crate::scope::owned_id(index + 1, id))
            }
        }
    }

    /// Whom the scopes this caller creates are charged to.
    pub fn owner(&self) -> crate::tenancy::Owner {
        match self {
            Identity::Open => crate::tenancy::Owner::NONE,
            Identity::Token(index) => crate::tenancy::Owner::token(*index),
        }
    }
}

/// A request extension: the identity the server's gate found for the
/// request's token before it took a request slot, so the handler need not
/// check the token again. Only the server inserts extensions; a peer
/// cannot send one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authenticated(pub Identity);

#[derive(Debug, Default)]
struct Table {
    entries: Vec<TokenEntry>,
    admins: Vec<AdminEntry>,
}

/// Why a token table was refused; the message names entries by their
/// place (1-based, in file order), never by value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Two `[[token]]` entries hold the same token.
    #[error("token #{second} holds the same token as token #{first}")]
    DuplicateToken {
        /// The first entry.
        first: usize,
        /// The entry repeating it.
        second: usize,
    },
    /// Two `[[admin_token]]` entries hold the same token.
    #[error("admin_token #{second} holds the same token as admin_token #{first}")]
    DuplicateAdmin {
        /// The first entry.
        first: usize,
        /// The entry repeating it.
        second: usize,
    },
    /// An admin token is also a caller token: a leaked caller token must
    /// never be an admin credential.
    #[error("admin_token #{admin} holds the same token as token #{caller}")]
    AdminIsCaller {
        /// The admin entry.
        admin: usize,
        /// The caller entry.
        caller: usize,
    },
}

impl Table {
    /// The first mistake in the table, if any. Entries whose file is
    /// unusable hold no value and clash with nothing.
    fn check(&self) -> Result<(), TableError> {
        let callers: Vec<Option<&Digest>> = self
            .entries
            .iter()
            .map(|e| e.secret.value.as_ref())
            .collect();
        let admins: Vec<Option<&Digest>> = self
            .admins
            .iter()
            .map(|a| a.secret.value.as_ref())
            .collect();
        if let Some((first, second)) = first_repeat(&callers, &callers) {
            return Err(TableError::DuplicateToken { first, second });
        }
        if let Some((first, second)) = first_repeat(&admins, &admins) {
            return Err(TableError::DuplicateAdmin { first, second });
        }
        if let Some((caller, admin)) = first_repeat(&callers, &admins) {
            return Err(TableError::AdminIsCaller { admin, caller });
        }
        Ok(())
    }
}

/// The first pair (1-based) of an item of `a` and a later item of `b`
/// (any item of `b` when the two lists differ) holding the same digest.
fn first_repeat(a: &[Option<&Digest>], b: &[Option<&Digest>]) -> Option<(usize, usize)> {
    let same_list = std::ptr::eq(a, b);
    for (j, y) in b.iter().enumerate() {
        let Some(y) = y else { continue };
        let before = if same_list { &a[..j] } else { a };
        if let Some(i) = before.iter().position(|x| x.is_some_and(|x| x == *y)) {
            return Some((i + 1, j + 1));
        }
    }
    None
}

/// The token table. Clones share it, so a reload through any clone (the
/// server's file follower) is seen by every service at once.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    table: Arc<RwLock<Arc<Table>>>,
    /// Signalled after each reload that changed something.
    reloads: Arc<tokio::sync::watch::Sender<()>>,
    /// The last refused reload, so a wrong file is logged once, not at
    /// every poll.
    refused: Arc<Mutex<Option<TableError>>>,
    /// Reloads refused so far ([`Self::refused_reloads`]).
    refusals: Arc<std::sync::atomic::AtomicU64>,
}

/// The admin name recorded when open dev mode lets a loopback peer in.
pub const DEV_ADMIN: &str = "dev-loopback";

impl Authenticator {
    /// A table of caller `entries` and no admin; empty means open dev mode.
    pub fn new(entries: Vec<TokenEntry>) -> Self {
        Authenticator::with_admins(entries, Vec::new())
    }

    /// Caller `entries` and `admins`, whatever they hold (tests build
    /// tables freely; the policy file goes through [`Self::try_new`]).
    pub fn with_admins(entries: Vec<TokenEntry>, admins: Vec<AdminEntry>) -> Self {
        Authenticator {
            table: Arc::new(RwLock::new(Arc::new(Table { entries, admins }))),
            reloads: Arc::default(),
            refused: Arc::default(),
            refusals: Arc::default(),
        }
    }

    /// Caller `entries` and `admins`, refused if two entries hold the same
    /// token or an admin token is a caller token.
    pub fn try_new(entries: Vec<TokenEntry>, admins: Vec<AdminEntry>) -> Result<Self, TableError> {
        let auth = Authenticator::with_admins(entries, admins);
        auth.table().check()?;
        Ok(auth)
    }

    fn table(&self) -> Arc<Table> {
        // A poisoned lock only means a reload panicked; the table it holds
        // is still a whole one.
        Arc::clone(&self.table.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether any token is read from a file (and so worth re-reading).
    pub fn has_files(&self) -> bool {
        let table = self.table();
        table.entries.iter().any(|e| e.secret.file.is_some())
            || table.admins.iter().any(|a| a.secret.file.is_some())
    }

    /// Re-reads every file-backed token; returns how many changed. A file
    /// that is gone, unreadable or too short disables its token (logged
    /// once, when that happens), so deleting a Secret key revokes it. A
    /// reload that would make two entries hold the same token, or an
    /// admin token a caller token, is refused whole (logged once, naming
    /// the entries, never the values): the table stays as it was and 0 is
    /// returned.
    pub fn reload_files(&self) -> usize {
        let mut next = Table {
            entries: self.table().entries.clone(),
            admins: self.table().admins.clone(),
        };
        let changed = next
            .entries
            .iter_mut()
            .map(|e| &mut e.secret)
            .chain(next.admins.iter_mut().map(|a| &mut a.secret))
            .map(Secret::reload)
            .filter(|&changed| changed)
            .count();
        if changed > 0 {
            let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(err) = next.check() {
                if refused.as_ref() != Some(&err) {
                    tracing::error!(cause = %err, "token files rejected; keeping the tokens in use");
                }
                *refused = Some(err);
                self.refusals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return 0;
            }
            *refused = None;
            drop(refused);
            *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
            self.reloads.send_replace(());
            tracing::info!(changed, "token files reloaded");
        }
        changed
    }

    /// The generation of caller entry `i`'s current value; `None` while
    /// the entry is disabled.
    fn generation(&self, i: usize) -> Option<u64> {
        self.table()
            .entries
            .get(i)
            .filter(|e| e.secret.value.is_some())
            .map(|e| e.secret.generation)
    }

    /// Completes when the token `identity` holds now is rotated away or
    /// removed (never for open dev mode): a long-lived stream opened with
    /// it ends then instead of outliving the revocation.
    pub fn revoked(&self, identity: Identity) -> impl Future<Output = ()> + Send + 'static {
        let watched = match identity {
            Identity::Token(i) => Some((i, self.generation(i))),
            Identity::Open => None,
        };
        let auth = self.clone();
        let mut reloads = self.reloads.subscribe();
        async move {
            let Some((i, start)) = watched else {
                return std::future::pending().await;
            };
            while auth.generation(i) == start && start.is_some() {
                if reloads.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// How many reloads were refused whole (files that would cross or
    /// repeat tokens), counted at every poll that found them so: a file
    /// left wrong keeps counting.
    pub fn refused_reloads(&self) -> u64 {
        self.refusals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every caller entry's name and own quotas, in file order (the
    /// entries never change after start; a reload changes values only).
    pub fn tenants(&self) -> Vec<TenantSpec> {
        self.table()
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| TenantSpec {
                name: e.name.clone().unwrap_or_else(|| format!("token-{}", i + 1)),
                max_scopes: e.max_scopes,
                max_concurrent_requests: e.max_concurrent_requests,
            })
            .collect()
    }

    /// Whether no caller tokens are configured.
    pub fn is_open(&self) -> bool {
        self.table().entries.is_empty()
    }

    /// Whether no tokens of either kind are configured (Admin then answers
    /// loopback peers only).
    pub fn admin_is_open(&self) -> bool {
        let table = self.table();
        table.entries.is_empty() && table.admins.is_empty()
    }

    /// Whether any admin token is configured.
    pub fn has_admins(&self) -> bool {
        !self.table().admins.is_empty()
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
                Err(AdminDenied::Forbidden(
                    "open dev mode: the Admin API answers loopback peers only",
                ))
            };
        }
        let token = bearer(authorization).ok_or(AdminDenied::Unauthenticated(
            "the Admin API needs an admin bearer token",
        ))?;
        let token = &digest_of(token);
        let table = self.table();
        let mut found = None;
        for entry in &table.admins {
            if entry.secret.matches(token) && found.is_none() {
                found = Some(entry.name.clone());
            }
        }
        if let Some(name) = found {
            return Ok(name);
        }
        let caller = table
            .entries
            .iter()
            .fold(false, |hit, e| e.secret.matches(token) | hit);
        Err(if caller {
            AdminDenied::Forbidden("a caller token may not use the Admin API")
        } else {
            AdminDenied::Unauthenticated("unknown admin token")
        })
    }

    /// Checks the `authorization` metadata value.
    pub fn identify(&self, authorization: Option<&str>) -> Result<Identity, AuthError> {
        let table = self.table();
        if table.entries.is_empty() {
            return Ok(Identity::Open);
        }
        let token = &digest_of(bearer(authorization).ok_or(AuthError::Unauthenticated)?);
        // Compare against every entry so timing does not tell which one
        // (or whether any) matched early.
        let mut found = None;
        for (i, entry) in table.entries.iter().enumerate() {
            if entry.secret.matches(token) && found.is_none() {
                found = Some(i);
            }
        }
        found.map(Identity::Token).ok_or(AuthError::Unauthenticated)
    }

    /// How many caller tokens may use `caller_scope` (1 in open dev mode):
    /// where several may, one token's workers alone do not corroborate a
    /// cooldown that holds the others' ([`crate::hints::corroboration`]).
    pub fn tokens_for(&self, caller_scope: &str) -> usize {
        self.table()
            .entries
            .iter()
            .filter(|e| {
                e.secret.value.is_some() && e.caller_scopes.iter().any(|p| p.matches(caller_scope))
            })
            .count()
            .max(1)
    }

    /// Whether `identity` may use `caller_scope`.
    pub fn check(&self, identity: Identity, caller_scope: &str) -> Result<(), AuthError> {
        let allowed = match identity {
            Identity::Open => true,
            Identity::Token(i) => self.table().entries.get(i).is_some_and(|e| {
                e.secret.value.is_some() && e.caller_scopes.iter().any(|p| p.matches(caller_scope))
            }),
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

/// The token of an `authorization: Bearer …` value; an empty one is none.
fn bearer(authorization: Option<&str>) -> Option<&[u8]> {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::as_bytes)
}

/// Digests are of one length, so every byte is compared whatever the
/// tokens' lengths were.
fn constant_time_eq(a: &Digest, b: &Digest) -> bool {
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
            Err(AdminDenied::Forbidden(
                "a caller token may not use the Admin API"
            ))
        );
        assert!(matches!(
            auth.identify_admin(None, true),
            Err(AdminDenied::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.identify_admin(Some("Bearer unknown-token"), true),
            Err(AdminDenied::Unauthenticated(_))
        ));
        // Admin tokens are not caller tokens either.
        assert_eq!(
            auth.identify(Some("Bearer admin-secret")),
            Err(AuthError::Unauthenticated)
        );
    }

    #[test]
    fn tokens_of_any_length_are_compared_whole() {
        let auth = Authenticator::new(vec![TokenEntry::new("secret-a-123", &["a".into()])]);
        for presented in [
            "s",
            "secret-a-12",
            "secret-a-1234",
            "secret-a-123x",
            "x".repeat(4096).as_str(),
        ] {
            assert_eq!(
                auth.identify(Some(&format!("Bearer {presented}"))),
                Err(AuthError::Unauthenticated),
                "{presented}"
            );
        }
        assert_eq!(
            auth.identify(Some("Bearer secret-a-123")),
            Ok(Identity::Token(0))
        );
    }

    #[test]
    fn a_table_with_repeated_or_crossed_tokens_is_refused() {
        let caller = |t: &str| TokenEntry::new(t, &["a".into()]);
        assert_eq!(
            Authenticator::try_new(
                vec![
                    caller("token-one"),
                    caller("token-two"),
                    caller("token-one")
                ],
                vec![]
            )
            .err(),
            Some(TableError::DuplicateToken {
                first: 1,
                second: 3
            })
        );
        assert_eq!(
            Authenticator::try_new(
                vec![],
                vec![
                    AdminEntry::new("a", "admin-one"),
                    AdminEntry::new("b", "admin-one")
                ]
            )
            .err(),
            Some(TableError::DuplicateAdmin {
                first: 1,
                second: 2
            })
        );
        assert_eq!(
            Authenticator::try_new(
                vec![caller("token-one"), caller("token-two")],
                vec![
                    AdminEntry::new("a", "admin-one"),
                    AdminEntry::new("b", "token-two")
                ]
            )
            .err(),
            Some(TableError::AdminIsCaller {
                admin: 2,
                caller: 2
            })
        );
        assert!(
            Authenticator::try_new(
                vec![caller("token-one")],
                vec![AdminEntry::new("a", "admin-one")]
            )
            .is_ok()
        );
    }

    #[test]
    fn a_reload_that_repeats_or_crosses_tokens_keeps_the_old_table() {
        let dir = std::env::temp_dir().join(format!("tollgate-auth-cross-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (a, b, admin) = (dir.join("a"), dir.join("b"), dir.join("admin"));
        std::fs::write(&a, "token-of-a-1").expect("write");
        std::fs::write(&b, "token-of-b-1").expect("write");
        std::fs::write(&admin, "admin-token-1").expect("write");
        let auth = Authenticator::try_new(
            vec![
                TokenEntry::from_file(&a, &["a".into()]).expect("a"),
                TokenEntry::from_file(&b, &["b".into()]).expect("b"),
            ],
            vec![AdminEntry::from_file("oncall", &admin).expect("admin")],
        )
        .expect("distinct tokens");
        // A caller file rotated to the admin token: refused, all kept.
        std::fs::write(&a, "admin-token-1").expect("cross");
        assert_eq!(auth.reload_files(), 0);
        assert_eq!(
            auth.identify(Some("Bearer token-of-a-1")),
            Ok(Identity::Token(0))
        );
        assert_eq!(
            auth.identify(Some("Bearer admin-token-1")),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            auth.identify_admin(Some("Bearer admin-token-1"), false),
            Ok("oncall".into())
        );
        // Two caller files holding one token: refused too.
        std::fs::write(&a, "token-of-b-1").expect("repeat");
        assert_eq!(auth.reload_files(), 0);
        assert_eq!(
            auth.identify(Some("Bearer token-of-a-1")),
            Ok(Identity::Token(0))
        );
        assert_eq!(
            auth.identify(Some("Bearer token-of-b-1")),
            Ok(Identity::Token(1))
        );
        // Fixed: applied.
        std::fs::write(&a, "token-of-a-2").expect("fix");
        assert_eq!(auth.reload_files(), 1);
        assert_eq!(
            auth.identify(Some("Bearer token-of-a-2")),
            Ok(Identity::Token(0))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn open_dev_mode_admits_loopback_only() {
        let auth = Authenticator::default();
        assert_eq!(auth.identify_admin(None, true), Ok(DEV_ADMIN.into()));
        assert!(auth.identify_admin(None, false).is_err());
        let no_admins = Authenticator::new(vec![TokenEntry::new("secret-a", &["a".into()])]);
        assert!(no_admins.identify_admin(None, true).is_err());
    }

    #[test]
    fn a_token_file_is_reread_and_removing_it_revokes_the_token() {
        let dir = std::env::temp_dir().join(format!("tollgate-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("token");
        std::fs::write(&file, "first-token-1\n").expect("write");
        let auth = Authenticator::new(vec![
            TokenEntry::from_file(&file, &["a".into()]).expect("readable"),
        ]);
        let shared = auth.clone();
        assert!(auth.has_files());
        assert_eq!(
            auth.identify(Some("Bearer first-token-1")),
            Ok(Identity::Token(0))
        );
        std::fs::write(&file, "second-token-2").expect("rotate");
        assert_eq!(shared.reload_files(), 1);
        assert_eq!(
            auth.identify(Some("Bearer first-token-1")),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            auth.identify(Some("Bearer second-token-2")),
            Ok(Identity::Token(0))
        );
        std::fs::remove_file(&file).expect("remove");
        assert_eq!(shared.reload_files(), 1);
        assert_eq!(
            auth.identify(Some("Bearer second-token-2")),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(
            auth.identify(Some("Bearer ")),
            Err(AuthError::Unauthenticated)
        );
        assert!(
            auth.check(Identity::Token(0), "a").is_err(),
            "a revoked entry grants nothing"
        );
        assert!(TokenEntry::from_file(&file, &["a".into()]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
