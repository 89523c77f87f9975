//! The Lua scripts, compiled once. Each is `lua/prelude.lua` (the state
//! codec and the budget, hint and slot math) plus its own body, behind a
//! header of the bounds it shares with the Rust modules — written here from
//! the Rust constants, so the port cannot drift from them.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

use crate::budget::{MAX_LEASES_PER_ROUTE, MAX_WINDOW_SECS, MAX_WORKERS_PER_CLASS};
use crate::hints::corroboration::{MAX_EVIDENCE_WORKERS, MAX_MUTES, NOISY_MIN_DISAGREEMENTS};
use crate::hints::{MAX_BACKOFF_STEP, RECENT_HINTS};
use crate::pacing::{HINT_GRANULARITY_MS, PacingPolicy};
use crate::policy::Policy;
use crate::slots::{DEADLINE_BUCKET_MS, JITTER_SCALE, MAX_PENDING_PER_ROUTE};
use crate::store::LevelHint;

/// The scripts, compiled once; their SHA1 is computed here and each is sent
/// to Redis only when a node answers NOSCRIPT (after a restart or failover).
pub(super) struct Scripts {
    pub(super) lease: Script,
    pub(super) release: Script,
    pub(super) report: Script,
    pub(super) report_caller: Script,
    pub(super) reconsider: Script,
    pub(super) view: Script,
    pub(super) caller: Script,
    pub(super) freeze: Script,
    pub(super) evict: Script,
    pub(super) detail: Script,
    pub(super) caller_detail: Script,
    pub(super) reset: Script,
    pub(super) mute: Script,
    pub(super) active: Script,
}

/// The Lua constants the prelude uses, from their Rust definitions.
fn shared_bounds() -> String {
    format!(
        "local W = {MAX_WINDOW_SECS}\n\
         local MAX_WORKERS = {MAX_WORKERS_PER_CLASS}\n\
         local MAX_LEASES = {MAX_LEASES_PER_ROUTE}\n\
         local MAX_PENDING = {MAX_PENDING_PER_ROUTE}\n\
         local DEADLINE_BUCKET = {DEADLINE_BUCKET_MS}\n\
         local JITTER_SCALE = {JITTER_SCALE}\n\
         local RECENT_HINTS = {RECENT_HINTS}\n\
         local MAX_BACKOFF_STEP = {MAX_BACKOFF_STEP}\n\
         local MAX_EVIDENCE_WORKERS = {MAX_EVIDENCE_WORKERS}\n\
         local MAX_MUTES = {MAX_MUTES}\n\
         local NOISY_MIN_DISAGREEMENTS = {NOISY_MIN_DISAGREEMENTS}\n\
         local HINT_GRANULARITY = {HINT_GRANULARITY_MS}\n"
    )
}

/// The prelude every script starts with: the shared bounds, then
/// `lua/prelude.lua`. Also what the pacing port's agreement test loads.
pub(crate) fn prelude() -> String {
    format!("{}{}", shared_bounds(), include_str!("lua/prelude.lua"))
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let prelude = prelude();
    let with_prelude = |body: &str| Script::new(&format!("{prelude}\n{body}"));
    // The scripts that pace include the controller's port after the prelude.
    let pacing = include_str!("lua/pacing.lua");
    let paced = |body: &str| Script::new(&format!("{prelude}\n{pacing}\n{body}"));
    Scripts {
        lease: with_prelude(include_str!("lua/lease.lua")),
        release: with_prelude(include_str!("lua/release.lua")),
        report: paced(include_str!("lua/report.lua")),
        report_caller: with_prelude(include_str!("lua/report_caller.lua")),
        reconsider: paced(include_str!("lua/reconsider.lua")),
        view: with_prelude(include_str!("lua/view.lua")),
        caller: with_prelude(include_str!("lua/caller.lua")),
        freeze: with_prelude(include_str!("lua/freeze.lua")),
        evict: with_prelude(include_str!("lua/evict.lua")),
        detail: paced(include_str!("lua/detail.lua")),
        caller_detail: with_prelude(include_str!("lua/caller_detail.lua")),
        reset: with_prelude(include_str!("lua/reset.lua")),
        mute: with_prelude(include_str!("lua/mute.lua")),
        active: with_prelude(include_str!("lua/active.lua")),
    }
});

/// Appends one hint's `HINT_FIELDS` arguments, in the order the prelude's
/// `hint_at` reads them.
pub(super) fn hint_args(inv: &mut ScriptInvocation<'_>, hint: &LevelHint) {
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

/// Appends the five pacing policy arguments, in the order `pacing.lua`'s
/// `pace_policy` reads them (-1 for a key not set).
pub(super) fn pacing_args(inv: &mut ScriptInvocation<'_>, pacing: &PacingPolicy) {
    inv.arg(pacing.pinned_m.unwrap_or(-1))
        .arg(pacing.known_limit_m.unwrap_or(-1))
        .arg(pacing.floor_m)
        .arg(pacing.ceiling_m)
        .arg(pacing.horizon_ms);
}

/// Appends the policy's corroboration keys, in the order the prelude's
/// `corr_rules` reads them (after a report's hints).
pub(super) fn corroboration_args(inv: &mut ScriptInvocation<'_>, policy: &Policy) {
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
            "DEADLINE_BUCKET",
            "JITTER_SCALE",
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
