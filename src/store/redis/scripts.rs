//! The Lua scripts as one Redis Functions library, loaded once per node:
//! `lua/prelude.lua` (the state codec and the budget and hint math) behind
//! a header of the bounds it shares with the Rust modules — written here
//! from the Rust constants, so the port cannot drift from them — then each
//! script's body registered as a function. The slots and the pacing
//! controller have no Lua at all: `slot_read`, `slot_commit` and
//! `pace_commit` read and write what Rust decides.
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
use crate::hints::corroboration::{MAX_EVIDENCE_WORKERS, MAX_MUTES, NOISY_MIN_DISAGREEMENTS};
use crate::hints::{MAX_BACKOFF_STEP, RECENT_HINTS};
use crate::pacing::HINT_GRANULARITY_MS;
use crate::policy::Policy;
use crate::slots::MAX_PENDING_PER_ROUTE;
use crate::store::LevelHint;

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
    pub(super) report_caller: Function,
    pub(super) slot_read: Function,
    pub(super) slot_commit: Function,
    pub(super) pace_commit: Function,
    pub(super) view: Function,
    pub(super) caller: Function,
    pub(super) freeze: Function,
    pub(super) evict: Function,
    pub(super) detail: Function,
    pub(super) caller_detail: Function,
    pub(super) reset: Function,
    pub(super) mute: Function,
    pub(super) active: Function,
}

/// The Lua constants the prelude uses, from their Rust definitions.
fn shared_bounds() -> String {
    format!(
        "local W = {MAX_WINDOW_SECS}\n\
         local MAX_WORKERS = {MAX_WORKERS_PER_CLASS}\n\
         local MAX_LEASES = {MAX_LEASES_PER_ROUTE}\n\
         local MAX_PENDING = {MAX_PENDING_PER_ROUTE}\n\
         local RECENT_HINTS = {RECENT_HINTS}\n\
         local MAX_BACKOFF_STEP = {MAX_BACKOFF_STEP}\n\
         local MAX_EVIDENCE_WORKERS = {MAX_EVIDENCE_WORKERS}\n\
         local MAX_MUTES = {MAX_MUTES}\n\
         local NOISY_MIN_DISAGREEMENTS = {NOISY_MIN_DISAGREEMENTS}\n\
         local HINT_GRANULARITY = {HINT_GRANULARITY_MS}\n"
    )
}

/// The shared bounds, then `lua/prelude.lua`: what the library starts with.
fn prelude() -> String {
    format!("{}{}", shared_bounds(), include_str!("lua/prelude.lua"))
}

/// Each script's body, by the name its function is registered under.
const BODIES: [(&str, &str); 17] = [
    ("lease", include_str!("lua/lease.lua")),
    ("lease_batch", include_str!("lua/lease_batch.lua")),
    ("release", include_str!("lua/release.lua")),
    ("report", include_str!("lua/report.lua")),
    ("report_caller", include_str!("lua/report_caller.lua")),
    ("slot_read", include_str!("lua/slot_read.lua")),
    ("slot_commit", include_str!("lua/slot_commit.lua")),
    ("pace_commit", include_str!("lua/pace_commit.lua")),
    ("view", include_str!("lua/view.lua")),
    ("caller", include_str!("lua/caller.lua")),
    ("freeze", include_str!("lua/freeze.lua")),
    ("evict", include_str!("lua/evict.lua")),
    ("detail", include_str!("lua/detail.lua")),
    ("caller_detail", include_str!("lua/caller_detail.lua")),
    ("reset", include_str!("lua/reset.lua")),
    ("mute", include_str!("lua/mute.lua")),
    ("active", include_str!("lua/active.lua")),
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
        report_caller: function("report_caller"),
        slot_read: function("slot_read"),
        slot_commit: function("slot_commit"),
        pace_commit: function("pace_commit"),
        view: function("view"),
        caller: function("caller"),
        freeze: function("freeze"),
        evict: function("evict"),
        detail: function("detail"),
        caller_detail: function("caller_detail"),
        reset: function("reset"),
        mute: function("mute"),
        active: function("active"),
    }
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(library);

/// Appends one hint's `HINT_FIELDS` arguments, in the order the prelude's
/// `hint_at` reads them.
pub(super) fn hint_args(inv: &mut Call, hint: &LevelHint) {
    let a = &hint.assessment;
    inv.arg(u8::from(!hint.caller_wide))
        .arg(a.cooldown_until_ms.unwrap_or(-1))
        .arg(u8::from(a.widen_backoff))
        .arg(a.anchor_ms)
        .arg(a.raw.as_deref().unwrap_or(""))
        .arg(u8::from(a.raw.is_some()))
        .arg(a.form.as_str())
        .arg(u8::from(a.valid))
        .arg(u8::from(a.capped))
        .arg(u8::from(a.clock_skew));
}

/// Appends the policy's corroboration keys, in the order the prelude's
/// `corr_rules` reads them (after a report's hints).
pub(super) fn corroboration_args(inv: &mut Call, policy: &Policy) {
    inv.arg(policy.corroborate_workers)
        .arg(policy.corroborate_permille)
        .arg(policy.uncorroborated_cap_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prelude defines none of the shared bounds itself: the header
    /// written from Rust is their only definition.
    #[test]
    fn shared_bounds_have_one_definition() {
        let prelude = include_str!("lua/prelude.lua");
        for name in [
            "W",
            "MAX_WORKERS",
            "MAX_LEASES",
            "MAX_PENDING",
            "RECENT_HINTS",
            "MAX_BACKOFF_STEP",
            "HINT_GRANULARITY",
        ] {
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
