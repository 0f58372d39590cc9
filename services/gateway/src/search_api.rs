//! `GET /api/v1/search?q=…` (scope `search:read`): messages ranked by meaning and by words
//! together (see `switchboard_memory::search`), filtered by `person`, `agent` (engine variant),
//! `identity`, `channel`, `from`, `to` (RFC 3339 times or `YYYY-MM-DD` days, UTC), at most
//! `limit` (1 to 100, default 20). Every answer says how far behind the vector index is
//! (`index_lag_s`, `messages_waiting`) and, when it is behind, says so in `note`: an empty
//! answer from a lagging index is never silent.
//!
//! An agent's turn token (`sbt_…`, docs/agent-tools.md) searches its person + identity only:
//! `person` and `identity` are the token's, another person's is 403 `outside_turn`.
//!
//! Checked in this order: the key (401), its scope (403), the request (400).
use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use switchboard_channels::api::Scope;
use switchboard_memory::search::{DEFAULT_LIMIT, MAX_LIMIT, SearchError, SearchQuery, search};

use crate::auth::{KeyOrTurn, outside_turn};
use crate::query_params::{bad, given, query, query_limit, time};
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/search", get(search_messages))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchParams {
    q: Option<String>,
    person: Option<String>,
    agent: Option<String>,
    identity: Option<String>,
    channel: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
}

async fn search_messages(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    q: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SearchRead).map_err(refuse)?;
    let p = query(q)?;
    let (mut person, mut identity) = (given(p.person), given(p.identity));
    // An agent's turn searches its person's history with its identity, and nothing else.
    if let Some(turn) = &turn {
        if person.as_ref().is_some_and(|p| p != turn.person()) {
            return Err(outside_turn(
                "this turn's token searches only its own person's messages",
            ));
        }
        if identity.as_ref().is_some_and(|i| *i != turn.identity) {
            return Err(outside_turn(format!(
                "this turn's token searches only the identity {}",
                turn.identity
            )));
        }
        person = Some(turn.person().to_string());
        identity = Some(turn.identity.clone());
    }
    let search_query = SearchQuery {
        text: given(p.q)
            .ok_or_else(|| bad("invalid_query", "q (what to search for) is missing"))?,
        person,
        agent: given(p.agent),
        identity,
        channel: given(p.channel),
        from: time("from", p.from)?,
        to: time("to", p.to)?,
        limit: query_limit(p.limit, DEFAULT_LIMIT, MAX_LIMIT)?,
        exclude: Vec::new(),
        exclude_kinds: Vec::new(),
        inbound_before: None,
        probes: state.config.embedding.ivfflat_probes,
    };
    let embedding = &state.config.embedding;
    // Loaded once per process, not per search.
    let embedder = switchboard_memory::embed::shared(embedding).await;
    let results = search(
        &state.db,
        embedder.as_deref(),
        &embedding.model,
        &search_query,
    )
    .await
    .map_err(|e| match e {
        SearchError::Invalid(why) => bad("invalid_query", why),
        SearchError::Database(e) => unavailable(e),
    })?;
    if let Some(e) = &results.vector_error {
        tracing::warn!(error = %e, "search ranked by words only");
    }
    Ok(Json(serde_json::json!({
        "query": search_query.text,
        "hits": results.hits,
        "model": results.model,
        "index_lag_s": results.index_lag.seconds,
        "messages_waiting": results.index_lag.messages_waiting,
        "note": results.note(),
    }))
    .into_response())
}
