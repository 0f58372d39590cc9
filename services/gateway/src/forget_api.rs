//! `DELETE /api/v1/people/{id}` (scope `people:forget`, which a key has only when an operator
//! names it): erase the person completely (`switchboard_memory::forget`). 200 with what was
//! removed per kind; 404 for a person nothing names (never seen, or already forgotten).
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::delete;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_memory::forget::{ForgetError, forget};

use crate::api::{caller, refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/people/{id}", delete(forget_person))
}

async fn forget_person(
    State(state): State<GatewayState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refused> {
    let caller = caller(&state, &headers).await?;
    caller.require(Scope::PeopleForget).map_err(refuse)?;
    let rt = &state.runtime;
    match forget(&state.db, &rt.js, &rt.topology, &id).await {
        Ok(forgotten) => {
            tracing::info!(by = %caller.owner, "forgot a person through the API");
            let body = serde_json::json!({
                "person_id": forgotten.person_id,
                "forgotten_at": forgotten.forgotten_at,
                "removed": forgotten.removed,
                "total": forgotten.total(),
            });
            Ok((StatusCode::OK, Json(body)).into_response())
        }
        Err(e @ ForgetError::Unknown(_)) => Err(refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_person",
            e.to_string(),
        ))),
        Err(e @ ForgetError::NoPerson) => Err(refuse(ApiError::bad_request(
            "invalid_person_id",
            e.to_string(),
        ))),
        Err(e) => Err(unavailable(e)),
    }
}
