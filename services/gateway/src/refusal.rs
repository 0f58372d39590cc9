//! The API's refusals: a reason the caller can act on, counted against the API channel, or
//! 503 with the cause in the log only.
use axum::http::StatusCode;
use switchboard_channels::ApiError;
use switchboard_channels::api;

use crate::{Refused, refused_on};

/// `e`, as the API refuses a request.
pub(crate) fn refuse(e: ApiError) -> Refused {
    refused_on(api::CHANNEL, api::PROVIDER, e)
}

/// 503: what failed (a database, NATS) goes to the log, never to the caller.
pub(crate) fn unavailable(e: impl std::fmt::Display) -> Refused {
    tracing::error!(error = %e, "API request could not be served");
    Refused(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "try again",
    ))
}
