//! `GET /api/v1/analytics/categories` (scope `analytics:read`): what the categorisation
//! worker's labels add up to over `from`..`to` (RFC 3339 times or `YYYY-MM-DD` days, UTC),
//! optionally for one `agent` (engine variant) or `person`: exchanges per label per day, each
//! person's top labels, and exchanges per channel (see `switchboard_memory::analytics`).
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
use switchboard_memory::analytics::{AnalyticsError, AnalyticsQuery, categories};

use crate::auth::Key;
use crate::query_params::{bad, given, query, time};
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/analytics/categories", get(category_counts))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    from: Option<String>,
    to: Option<String>,
    agent: Option<String>,
    person: Option<String>,
}

async fn category_counts(
    State(state): State<GatewayState>,
    Key(caller): Key,
    q: Result<Query<Params>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::AnalyticsRead).map_err(refuse)?;
    let p = query(q)?;
    let q = AnalyticsQuery {
        from: time("from", p.from)?,
        to: time("to", p.to)?,
        agent: given(p.agent),
        person: given(p.person),
    };
    let counts = categories(&state.db, &q).await.map_err(|e| match e {
        AnalyticsError::Invalid(why) => bad("invalid_query", why),
        AnalyticsError::Database(e) => unavailable(e),
    })?;
    Ok(Json(counts).into_response())
}
