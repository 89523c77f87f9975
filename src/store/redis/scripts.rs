//! The Lua scripts as one Redis Functions library, loaded once per node:
//! `lua/prelude.lua` (the state codec and its atomic primitives) behind a
//! header of the bounds it shares with the Rust modules — written here
//! from the Rust constants, so the two cannot drift — then each script's
//! body registered as a function. No script decides anything: the budget,
//! the hints, the slots and the pacing controller are decided in Rust, and
//! their scripts read, write, add or take under limits Rust computed.
//!
//! Why a library and not `EVALSHA`: a script runs its whole text on every
//! call, so each call re-created the prelude's hundred-odd functions before
//! doing any work (more Redis time than a Lease's own reads and writes). A
//! library's text runs once, at `FUNCTION LOAD`; each `FCALL` runs only
//! its function.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, ToRedisArgs};

use crate::budget::{MAX_LEASES_PER_ROUTE, MAX_WINDOW_SECS, MAX_WORKERS_PER_CLASS};
use crate::pacing::cursor::MAX_PENDING_PER_ROUTE;

/// One function of the library.
pub(super) struct Function {
    /// `tollgate_<script>_<hash>`: function names are global to a Redis
    /// node, and two coordinator versions sharing one (a rolling upgrade)
    /// must each find their own.
    name: String,
}

impl Function {
    /// A call of this function on `keys` (`FCALL name numkeys keys…`);
    /// its arguments follow with [`Call::arg`].
    pub(super) fn call<K: ToRedisArgs>(&self, keys: &[K]) -> Call {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.name).arg(keys.len()).arg(keys);
        Call(cmd)
    }
}

/// One `FCALL`, its arguments written straight into the command.
pub(super) struct Call(Cmd);

impl Call {
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.0.arg(arg);
        self
    }

    /// Sends the call on `conn`. A node without the library (a new node,
    /// one restarted without persistence, a replica promoted before it
    /// replicated `FUNCTION LOAD`) answers "Function not found": the
    /// library is loaded there (on a cluster, on every primary) and the
    /// call sent again, as `EVALSHA` does on `NOSCRIPT`.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> RedisResult<T> {
        match self.0.query_async(conn).await {
            Err(err)
                if err
                    .detail()
                    .is_some_and(|d| d.starts_with("Function not found")) =>
            {
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&SCRIPTS.library)
                    .query_async::<()>(conn)
                    .await?;
                self.0.query_async(conn).await
            }
            other => other,
        }
    }
}

/// The library's code and its functions.
pub(super) struct Scripts {
    /// What `FUNCTION LOAD` is given.
    pub(super) library: String,
    pub(super) lease: Function,
    pub(super) lease_batch: Function,
    pub(super) release: Function,
    pub(super) report: Function,
    pub(super) route_read: Function,
    pub(super) caller_read: Function,
    pub(super) hints_commit: Function,
    pub(super) slot_read: Function,
    pub(super) slot_commit: Function,
    pub(super) slot_call_back: Function,
    pub(super) pace_commit: Function,
    pub(super) view: Function,
    pub(super) caller: Function,
    pub(super) freeze: Function,
    pub(super) evict: Function,
    pub(super) detail: Function,
    pub(super) reset: Function,
    pub(super) quota_charge: Function,
    pub(super) quota_peek: Function,
    pub(super) quota_unseat: Function,
    pub(super) quota_drop: Function,
}

/// The Lua constants the prelude uses, from their Rust definitions.
fn shared_bounds() -> String {
    format!(
        "local W = {MAX_WINDOW_SECS}\n\
         local MAX_WORKERS = {MAX_WORKERS_PER_CLASS}\n\
         local MAX_LEASES = {MAX_LEASES_PER_ROUTE}\n\
         local MAX_PENDING = {MAX_PENDING_PER_ROUTE}\n"
    )
}

/// The shared bounds, then `lua/prelude.lua`: what the library starts with.
fn prelude() -> String {
    format!("{}{}", shared_bounds(), include_str!("lua/prelude.lua"))
}

/// Each script's body, by the name its function is registered under.
const BODIES: [(&str, &str); 21] = [
    ("lease", include_str!("lua/lease.lua")),
    ("lease_batch", include_str!("lua/lease_batch.lua")),
    ("release", include_str!("lua/release.lua")),
    ("report", include_str!("lua/report.lua")),
    ("route_read", include_str!("lua/route_read.lua")),
    ("caller_read", include_str!("lua/caller_read.lua")),
    ("hints_commit", include_str!("lua/hints_commit.lua")),
    ("slot_read", include_str!("lua/slot_read.lua")),
    ("slot_commit", include_str!("lua/slot_commit.lua")),
    ("slot_call_back", include_str!("lua/slot_call_back.lua")),
    ("pace_commit", include_str!("lua/pace_commit.lua")),
    ("view", include_str!("lua/view.lua")),
    ("caller", include_str!("lua/caller.lua")),
    ("freeze", include_str!("lua/freeze.lua")),
    ("evict", include_str!("lua/evict.lua")),
    ("detail", include_str!("lua/detail.lua")),
    ("reset", include_str!("lua/reset.lua")),
    ("quota_charge", include_str!("lua/quota_charge.lua")),
    ("quota_peek", include_str!("lua/quota_peek.lua")),
    ("quota_unseat", include_str!("lua/quota_unseat.lua")),
    ("quota_drop", include_str!("lua/quota_drop.lua")),
];

/// The library: the bounds, `KEYS` and `ARGV` as the library's own locals
/// (the prelude reads them; each function sets them from its arguments,
/// as a script finds them set), the prelude, each body as a function in
/// `BODY` (one local: Lua allows a chunk 200, and the prelude holds most
/// of them; lease_batch.lua runs `BODY.lease` once per lease), then one
/// registered function per body. Named by a hash of all of it.
fn library() -> Scripts {
    let mut code = format!("local KEYS, ARGV\n{}\nlocal BODY = {{}}\n", prelude());
    for (name, body) in BODIES {
        code.push_str(&format!("BODY.{name} = function()\n{body}\nend\n"));
    }
    for (name, _) in BODIES {
        code.push_str(&format!(
            "redis.register_function('tollgate_{name}_HASH', function(keys, args)\n\
             KEYS, ARGV = keys, args\nreturn BODY.{name}()\nend)\n"
        ));
    }
    let hash = redis::Script::new(&code).get_hash()[..16].to_owned();
    let function = |name: &str| Function {
        name: format!("tollgate_{name}_{hash}"),
    };
    Scripts {
        library: format!(
            "#!lua name=tollgate_{hash}\n{}",
            code.replace("_HASH'", &format!("_{hash}'"))
        ),
        lease: function("lease"),
        lease_batch: function("lease_batch"),
        release: function("release"),
        report: function("report"),
        route_read: function("route_read"),
        caller_read: function("caller_read"),
        hints_commit: function("hints_commit"),
        slot_read: function("slot_read"),
        slot_commit: function("slot_commit"),
        slot_call_back: function("slot_call_back"),
        pace_commit: function("pace_commit"),
        view: function("view"),
        caller: function("caller"),
        freeze: function("freeze"),
        evict: function("evict"),
        detail: function("detail"),
        reset: function("reset"),
        quota_charge: function("quota_charge"),
        quota_peek: function("quota_peek"),
        quota_unseat: function("quota_unseat"),
        quota_drop: function("quota_drop"),
    }
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(library);

#[cfg(test)]
mod tests {
    use super::*;

    /// The prelude defines none of the shared bounds itself: the header
    /// written from Rust is their only definition.
    #[test]
    fn shared_bounds_have_one_definition() {
        let prelude = include_str!("lua/prelude.lua");
        for name in ["W", "MAX_WORKERS", "MAX_LEASES", "MAX_PENDING"] {
            let definition = format!("local {name} =");
            assert!(
                !prelude.contains(&definition),
                "{name} is defined in prelude.lua"
            );
            assert!(
                shared_bounds().contains(&definition),
                "{name} is not injected"
            );
        }
        assert!(shared_bounds().contains("local W = 60\n"));
    }
}
