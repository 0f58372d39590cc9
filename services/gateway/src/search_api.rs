//! `GET /api/v1/search?q=…` (scope `search:read`): messages ranked by meaning and by words
//! together (see `switchboard_memory::search`), filtered by `person`, `agent` (engine variant),
//! `identity`, `channel`, `from`, `to` (RFC 3339 times or `YYYY-MM-DD` days, UTC), at most
//! `limit` (1 to 100, default 20). Every answer says how far behind the vector index is
//! (`index_lag_s`, `messages_waiting`) and, when it is behind, says so in `note`: an empty
//! answer from a lagging index is never silent.
//!
//! Checked in this order: the key (401), its scope (403), the request (400).
use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_memory::search::{DEFAULT_LIMIT, MAX_LIMIT, SearchError, SearchQuery, search};

use crate::api::{caller, refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/search", get(search_messages))
}

pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Refused {
    refuse(ApiError::bad_request(code, message))
}

/// The query string, or 400 `invalid_query` (an unknown parameter, a repeated one).
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Refused> {
    query
        .map(|Query(q)| q)
        .map_err(|e| bad("invalid_query", e.body_text()))
}

/// A query parameter's value; an empty one is the same as none.
pub(crate) fn given(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `from` / `to`: an RFC 3339 time, or a day (`2026-11-30`, its midnight UTC).
pub(crate) fn time(name: &str, value: Option<String>) -> Result<Option<DateTime<Utc>>, Refused> {
    let Some(v) = given(value) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(&v) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    if let Ok(day) = NaiveDate::parse_from_str(&v, "%Y-%m-%d") {
        return Ok(Some(day.and_time(chrono::NaiveTime::MIN).and_utc()));
    }
    let shown: String = v.chars().filter(|c| !c.is_control()).take(60).collect();
    Err(bad(
        "invalid_time",
        format!("{name} must be an RFC 3339 time or a YYYY-MM-DD day, not {shown:?}"),
    ))
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

fn limit(value: Option<String>) -> Result<i64, Refused> {
    let Some(value) = given(value) else {
        return Ok(DEFAULT_LIMIT);
    };
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| {
            bad(
                "invalid_limit",
                format!("limit must be a whole number from 1 to {MAX_LIMIT}"),
            )
        })
}

async fn search_messages(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    q: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Response, Refused> {
    caller(&state, &headers)
        .await?
        .require(Scope::SearchRead)
        .map_err(refuse)?;
    let p = query(q)?;
    let search_query = SearchQuery {
        text: given(p.q)
            .ok_or_else(|| bad("invalid_query", "q (what to search for) is missing"))?,
        person: given(p.person),
        agent: given(p.agent),
        identity: given(p.identity),
        channel: given(p.channel),
        from: time("from", p.from)?,
        to: time("to", p.to)?,
        limit: limit(p.limit)?,
        exclude: Vec::new(),
        exclude_kinds: Vec::new(),
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
