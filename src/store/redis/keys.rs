//! The key layout: one key per route, one per caller scope, names
//! percent-encoded so two scopes never share a key or a hash tag; and the
//! keys a route script is called with.

use crate::scope::RouteKey;
use crate::store::StoreError;

use super::RedisStore;
use super::reply::Reply;
use super::scripts::SCRIPTS;

impl RedisStore {
    /// The keys of a route script and the caller floor to pass: on one node
    /// the script reads the caller key itself; on a cluster it is read
    /// first (another slot).
    pub(super) async fn route_keys(
        &self,
        route: &RouteKey,
    ) -> Result<(Vec<String>, i64, i64), StoreError> {
        let route_key = self.route_key(route);
        let caller_key = self.caller_key(&route.caller_scope);
        if !self.clustered() {
            return Ok((vec![route_key, caller_key], 0, 0));
        }
        let inv = SCRIPTS.caller.call(&[&caller_key]);
        let reply = Reply::ok(self.run(&inv).await?)?;
        Ok((vec![route_key], reply.int(1)?, reply.int(2)?))
    }

    pub(super) fn route_key(&self, route: &RouteKey) -> String {
        format!(
            "{}:{{{}|{}}}:r",
            self.prefix,
            escape(&route.caller_scope),
            escape(&route.route)
        )
    }

    pub(super) fn caller_key(&self, caller: &str) -> String {
        format!("{}:{{{}}}:c", self.prefix, escape(caller))
    }

    /// The route a route key names (the inverse of `route_key`); `None`
    /// for a key that is not one.
    pub(super) fn route_of(&self, key: &str) -> Option<RouteKey> {
        let inner = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix("}:r")?;
        let (caller, route) = inner.split_once('|')?;
        Some(RouteKey {
            caller_scope: unescape(caller)?,
            route: unescape(route)?,
        })
    }
}

/// Percent-encodes the characters that delimit a key's parts or its hash
/// tag, so names are kept apart exactly.
pub(super) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' | '{' | '}' | '|' | ':' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`]; `None` for a malformed name.
pub(super) fn unescape(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::{RedisOptions, RedisTarget};

    #[tokio::test]
    async fn route_keys_decode_back_to_their_routes() {
        let store = RedisStore::connect(
            RedisTarget::parse("redis://127.0.0.1:1").expect("url"),
            RedisOptions::default(),
        )
        .await
        .expect("a lazy connection");
        for (caller, route) in [("c", "GET /a"), ("{x}|%", "a:b|c}"), ("ü", "")] {
            let key = RouteKey {
                caller_scope: caller.into(),
                route: route.into(),
            };
            assert_eq!(store.route_of(&store.route_key(&key)), Some(key));
        }
        assert_eq!(store.route_of("tollgate:{c}:c"), None);
        assert_eq!(store.route_of("other:{c|r}:r"), None);
        assert_eq!(unescape("%ZZ"), None);
    }

    #[test]
    fn names_cannot_collide_or_break_the_hash_tag() {
        assert_eq!(escape("a|b"), "a%7Cb");
        assert_eq!(escape("{x}:%"), "%7Bx%7D%3A%25");
    }
}
