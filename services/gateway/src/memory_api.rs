//! The curated memory API: what a person + agent identity keeps in `memory.md`, read and
//! replaced by operators. Behind API keys with the scopes `memory:read` and `memory:write`.
//!
//! - `GET /api/v1/people/{id}/memory?identity=reggie`: that identity's memory of the person
//!   (404 when there is none); without `identity`, every identity's.
//! - `PUT /api/v1/people/{id}/memory?identity=reggie` with `{"body": "…"}`: replaces it
//!   (capped at `[memory] max_chars`, with a visible marker; `cut` says whether it was).
//!
//! An agent's turn token (`sbt_…`, docs/agent-tools.md) reads and replaces its person's memory
//! with its identity only (the identity defaults to the token's); anyone else's is 403.
//!
//! Checked in this order: the key (401), its scope (403), the request (400), the person (404).
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_memory::curated::{CUT_MARKER, CuratedMemory, MemoryStore};

use crate::auth::{KeyOrTurn, outside_turn};
use crate::query_params::{bad, query};
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused, read_body};
use switchboard_kit::turn_token::TurnClaims;

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/people/{id}/memory", get(show).put(replace))
}

#[derive(Deserialize)]
struct Which {
    identity: Option<String>,
}

#[derive(Deserialize)]
struct NewMemory {
    body: String,
}

fn store(state: &GatewayState) -> MemoryStore {
    MemoryStore::new(state.db.clone(), state.config.memory.max_chars)
}

/// The identity named, which must be one of the configured agents' identities.
fn identity(state: &GatewayState, which: Option<String>) -> Result<Option<String>, Refused> {
    let Some(identity) = which.filter(|i| !i.is_empty()) else {
        return Ok(None);
    };
    let known: Vec<&str> = state
        .config
        .agents
        .iter()
        .map(|a| a.identity.as_str())
        .collect();
    if !known.contains(&identity.as_str()) {
        return Err(bad(
            "unknown_identity",
            format!(
                "no agent has the identity {identity:?} (known: {})",
                known.join(", ")
            ),
        ));
    }
    Ok(Some(identity))
}

/// A turn's request: its own person, its own identity (the default), or 403.
fn confine(
    turn: Option<&TurnClaims>,
    person: &str,
    which: Option<String>,
) -> Result<Option<String>, Refused> {
    let Some(turn) = turn else {
        return Ok(which);
    };
    if person != turn.person() {
        return Err(outside_turn(
            "this turn's token reads and writes only its own person's memory",
        ));
    }
    match which.filter(|i| !i.is_empty()) {
        Some(other) if other != turn.identity => Err(outside_turn(format!(
            "this turn's token reaches only the memory of the identity {}",
            turn.identity
        ))),
        _ => Ok(Some(turn.identity.clone())),
    }
}

fn shown(m: &CuratedMemory) -> serde_json::Value {
    serde_json::json!({
        "person_id": m.person_id,
        "identity": m.agent_identity,
        "body": m.body,
        "version": m.version,
        "updated_by": m.updated_by,
        "updated_at": m.updated_at,
        "cut": m.body.contains(CUT_MARKER),
    })
}

async fn show(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    Path(person): Path<String>,
    which: Result<Query<Which>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::MemoryRead).map_err(refuse)?;
    let which = query(which)?;
    let which = confine(turn.as_ref(), &person, which.identity)?;
    let store = store(&state);
    match identity(&state, which)? {
        Some(identity) => match store.get(&person, &identity).await.map_err(unavailable)? {
            Some(memory) => Ok(Json(shown(&memory)).into_response()),
            None => Err(refuse(ApiError::new(
                StatusCode::NOT_FOUND,
                "memory_not_found",
                format!("{identity} keeps no memory of {person}"),
            ))),
        },
        None => {
            let all = store.of_person(&person).await.map_err(unavailable)?;
            let memories: Vec<_> = all.iter().map(shown).collect();
            Ok(
                Json(serde_json::json!({"person_id": person, "memories": memories}))
                    .into_response(),
            )
        }
    }
}

async fn replace(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    headers: HeaderMap,
    Path(person): Path<String>,
    which: Result<Query<Which>, QueryRejection>,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::MemoryWrite).map_err(refuse)?;
    let which = query(which)?;
    let which = confine(turn.as_ref(), &person, which.identity)?;
    let Some(identity) = identity(&state, which)? else {
        return Err(bad(
            "identity_required",
            "name the agent identity whose memory this is: ?identity=<identity>",
        ));
    };
    let bytes = read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let new: NewMemory = serde_json::from_slice(&bytes)
        .map_err(|e| bad("invalid_body", format!("expected {{\"body\": \"…\"}}: {e}")))?;
    // Only a person the directory or a conversation knows: a typo must not create a memory
    // nobody will ever read.
    let known = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM switchboard.people WHERE person_id = $1)
               OR EXISTS (SELECT 1 FROM switchboard.sessions WHERE person_id = $1) AS "known!""#,
        person,
    )
    .fetch_one(&state.db)
    .await
    .map_err(unavailable)?;
    if !known {
        return Err(refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "person_not_found",
            format!("no person {person} is known"),
        )));
    }
    let (memory, _) = store(&state)
        .replace(
            &person,
            &identity,
            &new.body,
            // The agent's own edit, like one it makes to memory.md in its workspace.
            &match &turn {
                Some(turn) => format!("agent:{}", turn.agent),
                None => format!("api:{}", caller.owner),
            },
        )
        .await
        .map_err(unavailable)?;
    Ok(Json(shown(&memory)).into_response())
}
