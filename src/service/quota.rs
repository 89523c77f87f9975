//! How many Watch streams may be open: in total and per caller token.
//!
//! A Watch stream costs a task, a buffer and a hub subscription for as long
//! as the client keeps it, so a caller that opens them in a loop would
//! otherwise grow the coordinator without bound. A stream over the limit is
//! refused with RESOURCE_EXHAUSTED (the client falls back to polling);
//! its permit is released when the stream ends, however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tonic::Status;

use crate::auth::Identity;

/// The limits and the streams open now.
#[derive(Debug)]
pub struct WatchQuota {
    total: usize,
    per_token: usize,
    open: Mutex<HashMap<Identity, usize>>,
}

/// One open Watch stream; dropping it closes its place.
#[derive(Debug)]
pub struct WatchPermit {
    quota: Arc<WatchQuota>,
    identity: Identity,
}

impl WatchQuota {
    /// At most `total` streams, and `per_token` per caller token (open dev
    /// mode has no tokens: only `total` applies).
    pub fn new(total: usize, per_token: usize) -> Arc<WatchQuota> {
        Arc::new(WatchQuota {
            total,
            per_token,
            open: Mutex::default(),
        })
    }

    /// A place for one more stream of `identity`, or RESOURCE_EXHAUSTED
    /// naming the limit.
    pub fn acquire(self: &Arc<Self>, identity: Identity) -> Result<WatchPermit, Status> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.values().sum::<usize>() >= self.total {
            return Err(Status::resource_exhausted(format!(
                "the coordinator has {} Watch streams open (max_watch_streams)",
                self.total
            )));
        }
        let mine = open.entry(identity).or_default();
        if matches!(identity, Identity::Token(_)) && *mine >= self.per_token {
            return Err(Status::resource_exhausted(format!(
                "this token has {} Watch streams open (max_watch_streams_per_token)",
                self.per_token
            )));
        }
        *mine += 1;
        Ok(WatchPermit {
            quota: Arc::clone(self),
            identity,
        })
    }
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut open = self.quota.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_token_and_total_limits_release_on_drop() {
        let quota = WatchQuota::new(3, 2);
        let a = Identity::Token(0);
        let first = quota.acquire(a).expect("1");
        let _second = quota.acquire(a).expect("2");
        let refused = quota.acquire(a).expect_err("per token");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("max_watch_streams_per_token"));
        let _other = quota.acquire(Identity::Token(1)).expect("another token");
        let full = quota.acquire(Identity::Token(2)).expect_err("total");
        assert!(full.message().contains("max_watch_streams"));
        drop(first);
        quota.acquire(a).expect("released");
    }
}
