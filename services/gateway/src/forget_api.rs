//! Erasing a person (scope `people:forget`, which a key has only when an operator names it),
//! as a job (`switchboard_forget`):
//! - `DELETE /api/v1/people/{id}`: erase their rows now (one commit that also records the job
//!   and queues its stream sweep) and answer 202 with the job and where to poll it
//!   (`status_url`, also the `Location` header). A person erased before is that job: 202 while
//!   it is not finished (a failed one is queued again), 200 once it is done. 404 only for a
//!   person nothing names and no erasure ever named.
//! - `GET /api/v1/erasures/{job}`: the job's status (`erasing`, `sweeping`, `done`, `failed`),
//!   what was removed per kind, and the deletes that failed.
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_forget::{ErasureJob, ForgetError, JobStatus, forget, job};

use crate::auth::Key;
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/people/{id}", delete(forget_person))
        .route("/api/v1/erasures/{job}", get(erasure_status))
}

async fn forget_person(
    State(state): State<GatewayState>,
    Key(caller): Key,
    Path(id): Path<String>,
) -> Result<Response, Refused> {
    caller.require(Scope::PeopleForget).map_err(refuse)?;
    let rt = &state.runtime;
    let by = format!("api:{}", caller.owner);
    match forget(&state.db, &rt.js, &rt.topology, &id, &by).await {
        Ok(begun) => {
            if begun.started {
                tracing::info!(by = %caller.owner, job = %begun.job.job_id, "erasing a person through the API");
            }
            let mut body = serde_json::to_value(&begun).unwrap_or_default();
            body["status_url"] = begun.job.status_url().into();
            Ok(answer(&begun.job, body))
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

async fn erasure_status(
    State(state): State<GatewayState>,
    Key(caller): Key,
    Path(id): Path<String>,
) -> Result<Response, Refused> {
    caller.require(Scope::PeopleForget).map_err(refuse)?;
    let unknown = || {
        refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_erasure",
            "no erasure job has this id",
        ))
    };
    let id: uuid::Uuid = id.parse().map_err(|_| unknown())?;
    let Some(job) = job::load(&state.db, id).await.map_err(unavailable)? else {
        return Err(unknown());
    };
    let mut body = serde_json::to_value(&job).unwrap_or_default();
    body["status_url"] = job.status_url().into();
    Ok((StatusCode::OK, Json(body)).into_response())
}

/// 202 while the job goes on (with where to poll it), 200 once it is over.
fn answer(job: &ErasureJob, body: serde_json::Value) -> Response {
    let status = match job.status {
        JobStatus::Done => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    let mut response = (status, Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&job.status_url()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}
