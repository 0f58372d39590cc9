//! Identity links over the REST API (scopes `identity:read` and `identity:write`, which a key
//! has only when an operator names them):
//! - `POST /api/v1/identity/links` `{"from","to","reason"}`: link (201; 200 when already so),
//! - `DELETE /api/v1/identity/links/{from}/{to}?reason=…`: unlink (200; 404 when not linked),
//! - `POST /api/v1/identity/merges` `{"from","to","reason"}`: merge (201; 200 when already so),
//! - `GET /api/v1/identity/links?person=…`: the links in force and the audit trail.
//!
//! Every action is recorded as done by `api:<key owner>`.
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use serde::{Deserialize, Serialize};
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_identify::links::{
    AuditEntry, IdentityLinks, Link, LinkAction, LinkError, Outcome, Request,
};

use crate::auth::Key;
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/identity/links", post(link).get(list))
        .route("/api/v1/identity/links/{from}/{to}", delete(unlink))
        .route("/api/v1/identity/merges", post(merge))
}

/// The body of a link or a merge.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkBody {
    from: String,
    to: String,
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
struct ReasonQuery {
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    person: Option<String>,
    #[serde(default = "default_limit")]
    limit: i64,
}

fn default_limit() -> i64 {
    100
}

#[derive(Debug, Serialize)]
struct Listing {
    links: Vec<Link>,
    /// Newest first.
    audit: Vec<AuditEntry>,
}

fn store(state: &GatewayState) -> IdentityLinks {
    IdentityLinks::new(state.db.clone(), state.config.identity.clone())
}

fn refused(e: LinkError) -> Refused {
    let bad = |code| refuse(ApiError::bad_request(code, e.to_string()));
    match &e {
        LinkError::SelfLink(_) => bad("self_link"),
        LinkError::Cycle { .. } => bad("cycle"),
        LinkError::ChainTooLong { .. } => bad("chain_too_long"),
        LinkError::UnknownPerson(_) => bad("unknown_person"),
        LinkError::NoReason => refuse(ApiError::missing_field("reason")),
        LinkError::NoActor => bad("missing_actor"),
        LinkError::InvalidId(_) => bad("invalid_person_id"),
        LinkError::AlreadyLinked { .. } => refuse(ApiError::new(
            StatusCode::CONFLICT,
            "already_linked",
            e.to_string(),
        )),
        LinkError::NotLinked { .. } => refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_linked",
            e.to_string(),
        )),
        LinkError::Database(_) => unavailable(&e),
    }
}

/// `recorded` with the audit entry when something changed (201 for a link or merge made; 200
/// for an unlink, which creates nothing), else 200 `unchanged`.
fn answer(action: LinkAction, outcome: Outcome) -> Response {
    match outcome {
        Outcome::Recorded(entry) => {
            let status = match action {
                LinkAction::Unlink => StatusCode::OK,
                LinkAction::Link | LinkAction::Merge => StatusCode::CREATED,
            };
            let body = serde_json::json!({"status": "recorded", "audit": entry});
            (status, Json(body)).into_response()
        }
        Outcome::Unchanged => Json(serde_json::json!({"status": "unchanged"})).into_response(),
    }
}

async fn read_link_body(
    state: &GatewayState,
    headers: &HeaderMap,
    body: Body,
) -> Result<LinkBody, Refused> {
    let body = read_body(headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    serde_json::from_slice(&body).map_err(|e| {
        refuse(ApiError::bad_request(
            "invalid_body",
            format!("expected JSON {{\"from\", \"to\", \"reason\"}}: {e}"),
        ))
    })
}

async fn act(
    state: GatewayState,
    Key(caller): Key,
    headers: HeaderMap,
    body: Body,
    action: LinkAction,
) -> Result<Response, Refused> {
    caller.require(Scope::IdentityWrite).map_err(refuse)?;
    let body = read_link_body(&state, &headers, body).await?;
    let actor = format!("api:{}", caller.owner);
    let request = Request {
        from: &body.from,
        to: &body.to,
        actor: &actor,
        reason: &body.reason,
    };
    let outcome = store(&state).apply(action, request).await;
    Ok(answer(action, outcome.map_err(refused)?))
}

async fn link(
    State(state): State<GatewayState>,
    key: Key,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    act(state, key, headers, body, LinkAction::Link).await
}

async fn merge(
    State(state): State<GatewayState>,
    key: Key,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    act(state, key, headers, body, LinkAction::Merge).await
}

async fn unlink(
    State(state): State<GatewayState>,
    Key(caller): Key,
    Path((from, to)): Path<(String, String)>,
    Query(query): Query<ReasonQuery>,
) -> Result<Response, Refused> {
    caller.require(Scope::IdentityWrite).map_err(refuse)?;
    let actor = format!("api:{}", caller.owner);
    let request = Request {
        from: &from,
        to: &to,
        actor: &actor,
        reason: &query.reason,
    };
    let outcome = store(&state).apply(LinkAction::Unlink, request).await;
    Ok(answer(LinkAction::Unlink, outcome.map_err(refused)?))
}

async fn list(
    State(state): State<GatewayState>,
    Key(caller): Key,
    Query(query): Query<ListQuery>,
) -> Result<Response, Refused> {
    caller
        .require_any(&[Scope::IdentityRead, Scope::IdentityWrite])
        .map_err(refuse)?;
    let store = store(&state);
    let person = query.person.as_deref().filter(|p| !p.is_empty());
    let links = store.links(person).await.map_err(refused)?;
    let audit = store
        .audit(person, query.limit.clamp(1, 1000))
        .await
        .map_err(refused)?;
    Ok(Json(Listing { links, audit }).into_response())
}
