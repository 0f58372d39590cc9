//! `/healthz` (the process is up), `/readyz` (it can reach NATS and Postgres) and `/metrics`.
//!
//! The gateway's public port, where providers post webhooks, serves only the health checks
//! (load balancers need them), and its `/readyz` says only `ready` or `not ready`: why (a
//! Postgres error names hosts, users and databases) is logged and told on the admin address,
//! with `/metrics`.
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use sqlx::PgPool;

#[derive(Clone)]
pub struct Readiness {
    pub nats: async_nats::Client,
    pub db: PgPool,
}

/// `/healthz` and `/readyz` for a public port: no reason given when not ready.
pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_public))
        .with_state(readiness)
}

/// The admin address: the health checks (`/readyz` with its reason) and `/metrics`.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(readiness)
        .route(
            "/metrics",
            get(|| async { crate::telemetry::metrics().render() }),
        )
}

async fn ready_public(State(r): State<Readiness>) -> (StatusCode, &'static str) {
    match unready(&r).await {
        None => (StatusCode::OK, "ready"),
        Some(why) => {
            tracing::warn!(reason = %why, "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, "not ready")
        }
    }
}

async fn ready(State(r): State<Readiness>) -> (StatusCode, String) {
    match unready(&r).await {
        None => (StatusCode::OK, "ready".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// Why the process is not ready, or `None` when it is.
async fn unready(r: &Readiness) -> Option<String> {
    if r.nats.connection_state() != async_nats::connection::State::Connected {
        return Some("nats: not connected".into());
    }
    if let Err(e) = sqlx::query_scalar!("SELECT 1 AS one")
        .fetch_one(&r.db)
        .await
    {
        return Some(format!("postgres: {e}"));
    }
    None
}
