//! The ops console: `/console` on the gateway's admin address (`switchboard up`,
//! `switchboard gateway`), for support staff and operators. A single page (plain modules
//! beside this file, carried in the binary: no build step) over JSON the same process serves:
//!
//! - the sessions, search and analytics APIs (`/api/v1/sessions…`, `/api/v1/search`,
//!   `/api/v1/analytics/categories`), the very handlers of the public address;
//! - `GET /console/api/me`: who signed in and what they may do;
//! - `GET /console/api/status` (`ops:read`): per-stage lag and dead letters, streams, live
//!   dispatchers, sessions waiting out a runner's outage (its breaker open), as
//!   `switchboard status --json`;
//! - `GET /console/api/dead-letters?stage=&limit=` (`ops:read`) and
//!   `POST /console/api/dead-letters/{seq}/replay` (`ops:write`).
//!
//! Signing in takes an API key with those scopes. With `console.jwt_roles` set, a JWT signed
//! with the chat key whose `role` is one of them and whose `aud` is `console.jwt_audience`
//! (an operator your own login signed in) gets the console's scopes too. A chat token does not:
//! by default no JWT signs in, and the console's audience is required to differ from the chat's.
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::{ApiCaller, Scope};
use switchboard_channels::chat::ChatTokens;
use switchboard_kit::Registration;
use switchboard_kit::dlq::{self, DeadLetterView, DlqError, DlqFilter};
use uuid::Uuid;

use crate::auth::Key;
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused};

/// What an operator signed in with a JWT may do: the console's reads and dead-letter replay.
pub const OPERATOR_SCOPES: [Scope; 5] = [
    Scope::SessionsRead,
    Scope::SearchRead,
    Scope::AnalyticsRead,
    Scope::OpsRead,
    Scope::OpsWrite,
];

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

/// The console's routes, for the admin address; `stages` are the product's (their consumers
/// and dead letters are what the status shows).
pub fn router(mut state: GatewayState, stages: &'static [Registration]) -> Router {
    state.console_jwts = ConsoleJwts::of(&state.config).map(Arc::new);
    Router::new()
        .route(
            "/console",
            get(|| async { page("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/console/console.js",
            get(|| async { page("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route(
            "/console/console.css",
            get(|| async { page("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
        .route("/console/api/me", get(me))
        .route(
            "/console/api/status",
            get(move |s: State<GatewayState>, k: Key| status(s, k, stages)),
        )
        .route("/console/api/dead-letters", get(dead_letters))
        .route("/console/api/dead-letters/{seq}/replay", post(replay))
        .merge(crate::sessions_api::routes())
        .merge(crate::search_api::routes())
        .merge(crate::analytics_api::routes())
        .merge(crate::escalations_api::routes())
        .merge(crate::takeover_api::routes())
        .with_state(state)
}

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

/// How an operator's JWT is checked: the chat key, the console's own audience, one of the
/// console's roles.
pub struct ConsoleJwts {
    roles: Vec<String>,
    /// `None` when the chat key or the console audience is missing: every JWT is refused.
    tokens: Option<ChatTokens>,
}

impl ConsoleJwts {
    /// `None` when `console.jwt_roles` is empty: API keys only (a JWT is then read as a key,
    /// and refused as one).
    pub fn of(config: &switchboard_kit::Config) -> Option<Self> {
        let console = &config.console;
        if console.jwt_roles.is_empty() {
            return None;
        }
        let audience = console.jwt_audience.trim();
        // Configuration validation refuses these; a configuration built in code may not
        // have been validated, so fail closed here too.
        let tokens = if audience.is_empty() || audience == config.chat.jwt_audience.trim() {
            tracing::error!(
                "console.jwt_roles is set without a console.jwt_audience of its own: no JWT \
                 signs in to the console"
            );
            None
        } else {
            let mut chat = config.chat.clone();
            chat.jwt_audience = audience.to_string();
            match ChatTokens::from_config(&chat) {
                Ok(tokens) => tokens,
                Err(e) => {
                    tracing::error!(error = %e, "console JWTs cannot be checked");
                    None
                }
            }
        };
        Some(Self {
            roles: console.jwt_roles.clone(),
            tokens,
        })
    }

    /// The operator a console JWT names: its `aud` must be the console's, its role one of
    /// the console's roles.
    pub(crate) fn operator(&self, jwt: &str) -> Result<ApiCaller, Refused> {
        let tokens = self.tokens.as_ref().ok_or_else(|| {
            refuse(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "jwt_not_configured",
                "console JWTs need the chat key (chat.jwt_secret or chat.jwt_public_key) and \
                 console.jwt_audience: sign in with an API key",
            ))
        })?;
        let user = tokens.verify(jwt).map_err(refuse)?;
        if !self.roles.contains(&user.role) {
            return Err(refuse(ApiError::forbidden(
                "not_an_operator",
                format!(
                    "the token's role '{}' is not one of console.jwt_roles",
                    user.role
                ),
            )));
        }
        Ok(ApiCaller {
            key_id: Uuid::nil(),
            owner: format!("operator.{}", user.sub),
            scopes: OPERATOR_SCOPES
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
        })
    }
}

async fn me(Key(c): Key) -> Result<Response, Refused> {
    Ok(Json(serde_json::json!({"owner": c.owner, "scopes": c.scopes})).into_response())
}

async fn status(
    State(state): State<GatewayState>,
    Key(caller): Key,
    stages: &'static [Registration],
) -> Result<Response, Refused> {
    caller.require(Scope::OpsRead).map_err(refuse)?;
    let rt = &state.runtime;
    let s = switchboard_kit::ops_status::status(
        &rt.js,
        &state.db,
        &rt.topology,
        &state.config.runtime,
        stages,
    )
    .await
    .map_err(unavailable)?;
    Ok(Json(s).into_response())
}

#[derive(Debug, Deserialize)]
struct LetterParams {
    stage: Option<String>,
    limit: Option<usize>,
}

fn dlq_refusal(e: DlqError) -> Refused {
    match e {
        DlqError::NotFound(seq) => refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "dead_letter_not_found",
            format!("no dead letter {seq} (replayed already, or expired)"),
        )),
        other => unavailable(other),
    }
}

async fn dead_letters(
    State(state): State<GatewayState>,
    Key(caller): Key,
    Query(p): Query<LetterParams>,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsRead).map_err(refuse)?;
    let filter = DlqFilter::stage(p.stage.as_deref().filter(|s| !s.is_empty()));
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    let rt = &state.runtime;
    let letters = dlq::list_matching(&rt.js, &rt.topology, &filter, limit)
        .await
        .map_err(dlq_refusal)?;
    let views: Vec<DeadLetterView> = letters.iter().map(DeadLetterView::from).collect();
    Ok(Json(views).into_response())
}

async fn replay(
    State(state): State<GatewayState>,
    Key(c): Key,
    Path(seq): Path<u64>,
) -> Result<Response, Refused> {
    c.require(Scope::OpsWrite).map_err(refuse)?;
    let rt = &state.runtime;
    let letter = dlq::replay(&rt.js, &rt.topology, seq)
        .await
        .map_err(dlq_refusal)?;
    tracing::info!(seq, stage = %letter.stage, by = %c.owner, "dead letter replayed from the console");
    Ok(Json(serde_json::json!({
        "seq": seq, "stage": letter.stage, "subject": letter.subject, "replayed": true,
    }))
    .into_response())
}
