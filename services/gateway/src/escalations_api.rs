//! Escalations: exchanges the categoriser labelled with one of `[escalation] labels`
//! ([`switchboard_escalate`]), for whoever steps in.
//!
//! - `GET /api/v1/escalations?status=open|acknowledged|all&limit=`: open ones first, oldest
//!   first (who has waited longest), each with the person, the agent and their last messages
//!   in that session. Scope `ops:read`.
//! - `POST /api/v1/escalations/{id}/acknowledge`: 200 with it, acknowledged by the caller
//!   (the key's owner or the operator's login), journalled once; again: 200 with who did it
//!   first, unchanged; 404 `escalation_not_found`. Scope `ops:write`.
//!
//! The same routes serve the console on the admin address.
use axum::Json;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_escalate::store::{self, Acknowledged, Listed};
use uuid::Uuid;

use crate::auth::Key;
use crate::query_params::{bad, given, query, query_limit};
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/escalations", get(list))
        .route("/api/v1/escalations/{id}/acknowledge", post(acknowledge))
}

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 500;
/// The messages of the conversation shown beside each.
const RECENT_MESSAGES: i64 = 6;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    status: Option<String>,
    limit: Option<String>,
}

async fn list(
    State(state): State<GatewayState>,
    Key(caller): Key,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsRead).map_err(refuse)?;
    let p = query(params)?;
    let which = match given(p.status).as_deref() {
        None | Some("open") => Listed::Open,
        Some("acknowledged") => Listed::Acknowledged,
        Some("all") => Listed::All,
        Some(other) => {
            let shown: String = other.chars().filter(|c| !c.is_control()).take(40).collect();
            return Err(bad(
                "invalid_status",
                format!("status is open, acknowledged or all, not {shown:?}"),
            ));
        }
    };
    let limit = query_limit(p.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let escalations = store::list(&state.db, which, limit, RECENT_MESSAGES)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({ "escalations": escalations })).into_response())
}

async fn acknowledge(
    State(state): State<GatewayState>,
    Key(c): Key,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    c.require(Scope::OpsWrite).map_err(refuse)?;
    let not_found = |shown: &str| {
        refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "escalation_not_found",
            format!("no escalation {shown}"),
        ))
    };
    let Path(raw) = id.map_err(|_| not_found("with that id"))?;
    let id: Uuid = raw.parse().map_err(|_| not_found("with that id"))?;
    match store::acknowledge(&state.db, id, &c.owner)
        .await
        .map_err(unavailable)?
    {
        Acknowledged::Now(e) => {
            metrics::counter!("sb_escalations_acknowledged_total").increment(1);
            tracing::info!(escalation = %id, by = %c.owner, "escalation acknowledged");
            Ok(Json(e).into_response())
        }
        Acknowledged::Before(e) => Ok(Json(e).into_response()),
        Acknowledged::NotFound => Err(not_found(&id.to_string())),
    }
}
