//! The caller-scope attribute, as worker and coordinator metrics both show
//! it: the dashboards join the two sides' series on it, so one function
//! makes it for both (raw, or hashed on request).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that turns caller-scope hashing on (`1`/`true`).
pub const HASH_CALLER_SCOPE_ENV: &str = "TOLLGATE_HASH_CALLER_SCOPE";
/// An optional salt mixed into the caller-scope hash, so the hashes of
/// guessable tenant names cannot be looked up in a table built elsewhere.
pub const HASH_SALT_ENV: &str = "TOLLGATE_TELEMETRY_SALT";

/// 0 = not decided yet (read the environment), 1 = raw, 2 = hashed.
static HASHING: AtomicU8 = AtomicU8::new(0);
static SALT: OnceLock<String> = OnceLock::new();

/// Forces caller-scope hashing on or off (overrides the environment).
pub fn set_hash_caller_scope(on: bool) {
    HASHING.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

fn hashing() -> bool {
    match HASHING.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var(HASH_CALLER_SCOPE_ENV)
                .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"));
            set_hash_caller_scope(on);
            on
        }
        mode => mode == 2,
    }
}

/// The caller scope as telemetry shows it: raw, or `h:` and 16 hex digits
/// of a salted FNV-1a hash when hashing is on. FNV is not a cryptographic
/// hash: it hides names from casual readers of a dashboard and keeps them
/// joinable across services, nothing more; set a salt if names are guessable.
pub fn caller_scope_attr(caller_scope: &str) -> String {
    let salt =
        hashing().then(|| SALT.get_or_init(|| std::env::var(HASH_SALT_ENV).unwrap_or_default()));
    scope_attr(caller_scope, salt.map(String::as_str))
}

/// [`caller_scope_attr`] once the environment is read: raw without a salt
/// (hashing off), hashed with one (possibly empty).
fn scope_attr(caller_scope: &str, salt: Option<&str>) -> String {
    match salt {
        None => caller_scope.to_owned(),
        Some(salt) => format!("h:{:016x}", fnv1a(salt.as_bytes(), caller_scope.as_bytes())),
    }
}

fn fnv1a(salt: &[u8], data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in salt.iter().chain([0u8].iter()).chain(data) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_off_shows_the_scope_as_is() {
        assert_eq!(scope_attr("tenant-a", None), "tenant-a");
    }

    #[test]
    fn the_hashed_attribute_hides_the_scope() {
        let hashed = scope_attr("tenant-a", Some(""));
        assert_ne!(hashed, "tenant-a");
        assert!(!hashed.contains("tenant"), "{hashed}");
        let hex = hashed.strip_prefix("h:").expect("h: prefix");
        assert_eq!(hex.len(), 16);
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{hashed}");
        assert_ne!(
            hashed,
            scope_attr("tenant-b", Some("")),
            "scopes stay apart"
        );
    }

    #[test]
    fn the_hash_is_stable_for_a_salt_and_changes_with_it() {
        let salted = scope_attr("tenant-a", Some("salt-1"));
        assert_eq!(salted, scope_attr("tenant-a", Some("salt-1")));
        assert_ne!(salted, scope_attr("tenant-a", Some("salt-2")));
        assert_ne!(salted, scope_attr("tenant-a", Some("")));
    }

    #[test]
    fn the_switch_routes_the_attribute_through_the_hash() {
        // Process-wide switch: no other unit test reads the attribute.
        set_hash_caller_scope(true);
        let hashed = caller_scope_attr("tenant-a");
        set_hash_caller_scope(false);
        let raw = caller_scope_attr("tenant-a");
        assert!(hashed.starts_with("h:"), "{hashed}");
        assert_ne!(hashed, raw);
        assert_eq!(raw, "tenant-a");
    }
}
