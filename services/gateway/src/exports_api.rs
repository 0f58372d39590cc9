//! `GET /api/v1/exports/<id>/<name>?exp=…&sig=…`: a file the agent left for a person
//! (`exports/`), by the signed link their reply carried ([`switchboard_kit::exports`]).
//!
//! The link is the only credential: Twilio fetches MMS media without ours, and a person
//! opens the link from a text. So the signature is checked before anything is read (403 for
//! a forged or altered link, 410 for an expired one, 404 for a file erased or never sent),
//! and what is served cannot act on the gateway's origin: its type from a short list of
//! types that run nothing (else a download), `nosniff`, and a sandboxing CSP.
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::Utc;
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_kit::exports::{self, LinkRefused};
use uuid::Uuid;

use crate::{GatewayState, Refused};

pub fn routes() -> Router<GatewayState> {
    // The links kit::exports makes (`ROUTE_PREFIX`); written out so the reference finds it.
    Router::new().route("/api/v1/exports/{id}/{name}", get(download))
}

#[derive(Debug, Deserialize)]
pub struct LinkParams {
    exp: Option<i64>,
    sig: Option<String>,
}

/// A file kept for the person, as served.
struct Served {
    name: String,
    content_type: String,
    data: Vec<u8>,
}

async fn download(
    State(state): State<GatewayState>,
    Path((id, _name)): Path<(String, String)>,
    Query(params): Query<LinkParams>,
) -> Result<Response, Refused> {
    let not_found = || {
        Refused(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such file (it was erased, or never sent)",
        ))
    };
    let (Some(exp), Some(sig)) = (params.exp, params.sig) else {
        return Err(Refused(ApiError::forbidden(
            "unsigned",
            "a file is served only by the signed link its reply carried (exp and sig)",
        )));
    };
    let id: Uuid = id.parse().map_err(|_| not_found())?;
    let links = state
        .export_links
        .get()
        .await
        .map_err(crate::refusal::unavailable)?;
    match links.verify(id, exp, &sig, Utc::now()) {
        Ok(()) => {}
        Err(LinkRefused::Forged) => {
            metrics::counter!("sb_gateway_export_links_refused_total", "reason" => "forged")
                .increment(1);
            return Err(Refused(ApiError::forbidden(
                "bad_signature",
                LinkRefused::Forged.to_string(),
            )));
        }
        Err(LinkRefused::Expired) => {
            return Err(Refused(ApiError::new(
                StatusCode::GONE,
                "expired",
                "this link has expired; ask for the file again",
            )));
        }
    }
    // Only a committed file's bytes, before its expiry: a staged row of a call whose answer
    // did not stand is nobody's.
    let served = sqlx::query_as!(
        Served,
        r#"SELECT name, content_type, data AS "data!"
             FROM switchboard.exports
            WHERE id = $1 AND committed AND data IS NOT NULL AND expires_at > now()"#,
        id,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(crate::refusal::unavailable)?
    .ok_or_else(not_found)?;
    metrics::counter!("sb_gateway_exports_served_total").increment(1);
    let disposition = if exports::shown_inline(&served.content_type) {
        "inline"
    } else {
        "attachment"
    };
    Ok((
        [
            (header::CONTENT_TYPE, served.content_type),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "{disposition}; filename=\"{}\"",
                    exports::display_name(&served.name)
                ),
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".into()),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; sandbox".into(),
            ),
            (header::CACHE_CONTROL, "private, no-store".into()),
            (header::REFERRER_POLICY, "no-referrer".into()),
        ],
        served.data,
    )
        .into_response())
}

/// Clear the bytes of files past their expiry (what was sent is remembered: the row stays
/// until its person is forgotten) and delete staged files no answer took; how many.
pub async fn prune(db: &sqlx::PgPool) -> Result<u64, sqlx::Error> {
    let cleared = sqlx::query!(
        "UPDATE switchboard.exports SET data = NULL
          WHERE expires_at <= now() AND committed AND data IS NOT NULL"
    )
    .execute(db)
    .await?
    .rows_affected();
    let dropped =
        sqlx::query!("DELETE FROM switchboard.exports WHERE expires_at <= now() AND NOT committed")
            .execute(db)
            .await?
            .rows_affected();
    Ok(cleared + dropped)
}

/// [`prune`] now and then (at least every hour, and every `ttl` when that is shorter), until
/// shutdown.
pub async fn prune_expired(
    db: sqlx::PgPool,
    ttl: std::time::Duration,
    shutdown: switchboard_kit::shutdown::Shutdown,
) {
    let every = ttl.clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3_600),
    );
    loop {
        match prune(&db).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(files = n, "expired exported files cleared"),
            Err(e) => tracing::warn!(error = %e, "could not clear expired exported files"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait() => return,
        }
    }
}
