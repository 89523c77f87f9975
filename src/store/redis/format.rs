//! Which layout the keys under a prefix are in, so a build never reads
//! state another build wrote in another layout.
//!
//! The prefix's `PREFIX:format` key names the layout. A build claims an
//! empty prefix by writing its own; a prefix whose keys carry another
//! layout's name, or no name at all (written before the name existed), is
//! refused with a message saying to delete those keys: the state is a
//! short window of budgets, hints and slots, and converting old layouts is
//! code that outlives its use.

use std::sync::atomic::Ordering;

use super::RedisStore;
use crate::store::StoreError;

/// The layout this build reads and writes. Bump it with any change to what
/// a key holds or how it is named.
pub const STORE_FORMAT: u32 = 10;

impl RedisStore {
    fn format_key(&self) -> String {
        format!("{}:format", self.prefix)
    }

    /// Checks the prefix's layout, claiming an empty prefix for this
    /// build. `Err` with a one-line reason when another layout's state is
    /// there; [`StoreError::Unavailable`] when Redis cannot be asked. Once
    /// refused, every operation of this store answers the same reason.
    pub async fn claim_format(&self) -> Result<(), StoreError> {
        if self.format_checked.load(Ordering::Acquire) {
            return self.refused.get().map_or(Ok(()), |r| Err(refusal(r)));
        }
        let refusal_reason = match self.read_format().await? {
            Some(found) if found == STORE_FORMAT.to_string() => None,
            Some(found) => Some(format!(
                "redis keys under prefix {:?} are in store format {found:?}; this build uses format {STORE_FORMAT}",
                self.prefix
            )),
            None if self.holds_any_state().await? => Some(format!(
                "redis keys under prefix {:?} were written by an older Tollgate; this build uses store format {STORE_FORMAT}",
                self.prefix
            )),
            None => {
                self.write_format().await?;
                // Another build may have claimed it in between.
                match self.read_format().await? {
                    Some(found) if found == STORE_FORMAT.to_string() => None,
                    found => Some(format!(
                        "redis keys under prefix {:?} are in store format {found:?}; this build uses format {STORE_FORMAT}",
                        self.prefix
                    )),
                }
            }
        };
        if let Some(reason) = refusal_reason {
            let reason = format!(
                "{reason}: delete the prefix's keys (they hold only short-lived scope state) or use another --redis-prefix"
            );
            let _ = self.refused.set(reason);
        }
        self.format_checked.store(true, Ordering::Release);
        self.refused.get().map_or(Ok(()), |r| Err(refusal(r)))
    }

    /// Why the prefix was refused, once [`claim_format`](Self::claim_format)
    /// refused it.
    pub fn refusal(&self) -> Option<&str> {
        self.refused.get().map(String::as_str)
    }

    async fn read_format(&self) -> Result<Option<String>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.format_key());
        self.query(&cmd).await
    }

    pub(super) async fn write_format(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.format_key()).arg(STORE_FORMAT).arg("NX");
        self.query::<Option<String>>(&cmd).await.map(drop)
    }

    /// Whether any scope key (a route, its leases or slots, a caller
    /// scope) is under the prefix. The shared control state (policies,
    /// freezes, audit) is not scope state and keeps its own versions.
    async fn holds_any_state(&self) -> Result<bool, StoreError> {
        Ok(!self.scan(&format!("{}:{{*", self.prefix)).await?.is_empty())
    }
}

/// The error every operation answers once the prefix was refused.
pub(super) fn refusal(reason: &str) -> StoreError {
    StoreError::Unavailable(reason.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::RouteKey;
    use crate::store::redis::{RedisOptions, RedisTarget};
    use crate::store::{Store, StoreError};
    use tollgate_testkit::RedisServer;

    async fn store_on(server: &RedisServer) -> RedisStore {
        RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions::default(),
        )
        .await
        .expect("connect")
    }

    async fn raw(server: &RedisServer, args: &[&str]) -> redis::Value {
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("conn");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await.expect("raw command")
    }

    fn route() -> RouteKey {
        RouteKey {
            caller_scope: "tenant-a".into(),
            route: "GET /users/{id}".into(),
        }
    }

    #[tokio::test]
    async fn an_empty_prefix_is_claimed_and_served() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let store = store_on(&server).await;
        store.claim_format().await.expect("claimed");
        assert_eq!(
            raw(&server, &["GET", "tollgate:format"]).await,
            redis::Value::BulkString(STORE_FORMAT.to_string().into_bytes())
        );
        // A second replica finds its own format and serves too.
        let other = store_on(&server).await;
        other.claim_format().await.expect("same format");
        other.health().await.expect("healthy");
        assert!(other.view(&route(), 0).await.is_ok());
    }

    /// Redis did not answer at start, so nothing claimed the prefix: the
    /// first call claims it before writing, and the keys it writes are
    /// then this build's, not state a later health check refuses.
    #[tokio::test]
    async fn a_store_that_never_claimed_claims_before_its_first_write() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let store = store_on(&server).await;
        store
            .set_freeze(&route(), Some("incident".into()), 0)
            .await
            .expect("freeze");
        assert_eq!(
            raw(&server, &["GET", "tollgate:format"]).await,
            redis::Value::BulkString(STORE_FORMAT.to_string().into_bytes())
        );
        store.health().await.expect("its own keys");

        // Under an older build's keys the same first call is refused.
        let server = RedisServer::start().expect("a second redis");
        raw(&server, &["HSET", "tollgate:{tenant-a|GET /x}:r", "k", "x"]).await;
        let store = store_on(&server).await;
        let refused = store.set_freeze(&route(), Some("incident".into()), 0).await;
        assert!(
            matches!(&refused, Err(StoreError::Unavailable(r)) if r.contains("older Tollgate")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn state_an_older_build_wrote_is_refused_with_what_to_do() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        // An older build wrote routes and never named a format.
        raw(&server, &["HSET", "tollgate:{tenant-a|GET /x}:r", "k", "x"]).await;
        let store = store_on(&server).await;
        let Err(StoreError::Unavailable(reason)) = store.claim_format().await else {
            panic!("an unmarked prefix with state must be refused");
        };
        assert!(reason.contains("older Tollgate"), "{reason}");
        assert!(reason.contains("delete the prefix's keys"), "{reason}");
        assert!(!reason.contains('\n'), "one line: {reason}");
        assert_eq!(store.refusal(), Some(reason.as_str()));
        // Nothing is read or written on it, and health says so.
        assert_eq!(
            store.view(&route(), 0).await,
            Err(StoreError::Unavailable(reason.clone()))
        );
        // A lease too, which goes through the lease queue, not one call.
        let key = crate::scope::ScopeKey::new("tenant-a", "GET /x", crate::scope::Priority::Normal);
        let ask = crate::budget::GrantAsk {
            worker_id: "w",
            priority: crate::scope::Priority::Normal,
            retry_class: crate::scope::RetryClass::Transient,
            want: 1,
            now_ms: 0,
            tenant: crate::store::Tenant::NONE,
        };
        let leased = store
            .lease(&key, ask, &crate::policy::Policy::default())
            .await;
        assert_eq!(
            leased.map(drop),
            Err(StoreError::Unavailable(reason.clone()))
        );
        assert_eq!(store.health().await, Err(StoreError::Unavailable(reason)));
        assert_eq!(
            raw(&server, &["EXISTS", "tollgate:format"]).await,
            redis::Value::Int(0),
            "a refused prefix is not claimed"
        );
    }

    #[tokio::test]
    async fn another_format_is_refused_and_another_prefix_is_not() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        raw(&server, &["SET", "tollgate:format", "1"]).await;
        let store = store_on(&server).await;
        let Err(StoreError::Unavailable(reason)) = store.claim_format().await else {
            panic!("another format must be refused");
        };
        assert!(reason.contains("format \"1\""), "{reason}");
        let other = RedisStore::connect(
            RedisTarget::parse(&server.url()).expect("url"),
            RedisOptions {
                prefix: "fresh".into(),
                ..RedisOptions::default()
            },
        )
        .await
        .expect("connect");
        other.claim_format().await.expect("a prefix of its own");
    }
}
