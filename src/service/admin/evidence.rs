//! The Admin service's evidence half: the corroboration of a scope's
//! cooldowns in GetScope, and muting a worker's evidence.

use tollgate_proto::v1;
use tonic::{Request, Response, Status};

use crate::control::persist::MuteRecord;
use crate::hints::EvidenceDetail;

use super::super::error::ServiceError;
use super::super::validate;
use super::{AdminService, MAX_FREEZE_MS, MAX_REASON, reason, route_key};

/// A level's evidence on the wire; `recorded` adds who muted and why.
pub(super) fn evidence_of(d: &EvidenceDetail, recorded: &[MuteRecord]) -> v1::EvidenceState {
    let c = d.corroboration;
    v1::EvidenceState {
        supported_until_unix_ms: c.until_ms,
        corroborated: c.corroborated,
        workers: c.workers,
        reporters: c.reporters,
        needed: c.needed,
        disagreeing: d
            .workers
            .iter()
            .map(|(id, w)| v1::WorkerEvidence {
                worker_id: id.clone(),
                claim_until_unix_ms: w.claim_until_ms,
                hints: w.hints,
                outliers: w.outliers,
                uncorroborated: w.uncorroborated,
                noisy: w.noisy(),
            })
            .collect(),
        noisy_workers: d.noisy,
        mutes: d
            .mutes
            .iter()
            .map(|(id, until)| {
                let record = recorded.iter().find(|m| &m.worker_id == id);
                v1::MuteState {
                    muted: true,
                    worker_id: id.clone(),
                    reason: record.map(|m| m.reason.clone()).unwrap_or_default(),
                    by: record.map(|m| m.by.clone()).unwrap_or_default(),
                    expires_at_unix_ms: if *until >= crate::control::MUTE_FOREVER_MS {
                        0
                    } else {
                        *until
                    },
                }
            })
            .collect(),
    }
}

fn mute_of(m: &MuteRecord) -> v1::MuteState {
    v1::MuteState {
        muted: true,
        worker_id: m.worker_id.clone(),
        reason: m.reason.clone(),
        by: m.by.clone(),
        expires_at_unix_ms: m.expires_at_ms.unwrap_or(0),
    }
}

impl AdminService {
    pub(super) async fn mute(
        &self,
        request: Request<v1::MuteWorkerRequest>,
    ) -> Result<Response<v1::MuteState>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        validate::worker_id(&req.worker_id)?;
        validate::name("reason", &req.reason, MAX_REASON)?;
        if req.duration_ms > MAX_FREEZE_MS {
            return Err(ServiceError::invalid(
                "duration_ms",
                format!("must be at most {MAX_FREEZE_MS} (7 days)"),
            )
            .into());
        }
        let expires = (req.duration_ms > 0)
            .then(|| self.core.now_ms() + i64::try_from(req.duration_ms).unwrap_or(i64::MAX));
        let record = self
            .control()
            .mute(&who, &key, &req.worker_id, &req.reason, expires)
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(mute_of(&record)))
    }

    pub(super) async fn unmute(
        &self,
        request: Request<v1::UnmuteWorkerRequest>,
    ) -> Result<Response<v1::MuteState>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        validate::worker_id(&req.worker_id)?;
        reason(&req.reason)?;
        self.control()
            .unmute(&who, &key, &req.worker_id, &req.reason)
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(v1::MuteState {
            worker_id: req.worker_id,
            ..v1::MuteState::default()
        }))
    }
}
