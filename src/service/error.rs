//! The Budget service's errors and the one place they become gRPC statuses.

use tonic::Status;

use crate::auth::{AdminDenied, AuthError};
use crate::budget::BudgetError;
use crate::control::ControlError;
use crate::store::StoreError;

/// Why a Budget call failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A field of the request is missing, malformed or out of bounds.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field's path in the request (`scope.route`, `evidence[2].retry_after`).
        field: String,
        /// What the bound is.
        reason: String,
    },
    /// The bearer token is missing, unknown, or may not use the scope.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An Admin call without an admin token.
    #[error("admin: {0}")]
    AdminDenied(#[from] AdminDenied),
    /// An Admin operation was refused.
    #[error(transparent)]
    Control(#[from] ControlError),
}

impl ServiceError {
    /// An [`ServiceError::InvalidArgument`] for `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ServiceError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Longest status message sent, in bytes. A message can quote the peer's
/// input (a TOML parse error shows the offending line and a caret under
/// it); unbounded, it became a `grpc-message` header past the client's
/// header-list limit, and the caller saw an HTTP/2 protocol error instead of
/// INVALID_ARGUMENT.
pub const MAX_STATUS_MESSAGE: usize = 1024;

/// `message` cut to [`MAX_STATUS_MESSAGE`] bytes on a character boundary.
fn bounded(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" …");
    }
    message
}

impl From<ServiceError> for Status {
    fn from(err: ServiceError) -> Status {
        let message = bounded(err.to_string());
        match err {
            // The message names the field, so the caller can fix its request.
            ServiceError::InvalidArgument { .. } => Status::invalid_argument(message),
            ServiceError::Auth(AuthError::Unauthenticated) => Status::unauthenticated(message),
            // The token is fine but not for this scope: retrying will not help.
            ServiceError::Auth(AuthError::Forbidden { .. }) => Status::permission_denied(message),
            // The lease expired (its tokens count as spent) or never existed.
            ServiceError::Store(StoreError::Budget(BudgetError::LeaseNotFound)) => {
                Status::not_found(message)
            }
            ServiceError::Store(StoreError::Budget(BudgetError::SpentExceedsGrant { .. })) => {
                Status::invalid_argument(format!("spent: {message}"))
            }
            ServiceError::Store(StoreError::Budget(BudgetError::SuccessesExceedSpent {
                ..
            })) => Status::invalid_argument(format!("retry_successes: {message}")),
            // A bound that protects the coordinator's memory: the worker
            // should back off and use its local fallback budget.
            ServiceError::Store(
                StoreError::ScopeLimit { .. }
                | StoreError::ScopeQuota { .. }
                | StoreError::Budget(BudgetError::TooManyLeases)
                | StoreError::Slots(_),
            ) => Status::resource_exhausted(message),
            // A store outage is transient: UNAVAILABLE is what gRPC clients
            // treat as "try again, or fall back".
            ServiceError::Store(StoreError::Unavailable(_)) => Status::unavailable(message),
            // No token or an unknown one: the same code as on Budget, so a
            // client tells "fix your credential" from "ask for the right".
            ServiceError::AdminDenied(AdminDenied::Unauthenticated(_)) => {
                Status::unauthenticated(message)
            }
            // A known credential (a caller token) without the admin right.
            ServiceError::AdminDenied(AdminDenied::Forbidden(_)) => {
                Status::permission_denied(message)
            }
            // The rule changed since it was read: re-read, then decide again.
            ServiceError::Control(ControlError::Stale { .. }) => {
                Status::failed_precondition(message)
            }
            ServiceError::Control(ControlError::NotFound(_) | ControlError::NoRuntimeChange(_)) => {
                Status::not_found(message)
            }
            // The policy (or file) is invalid; the message names the place.
            ServiceError::Control(ControlError::Invalid(_)) => Status::invalid_argument(message),
            // Nothing changed because it could not be made durable.
            ServiceError::Control(ControlError::Persist(_)) => Status::internal(message),
            ServiceError::Control(ControlError::NoPolicyFile) => {
                Status::failed_precondition(message)
            }
            ServiceError::Control(ControlError::Store(err)) => ServiceError::Store(err).into(),
        }
    }
}
