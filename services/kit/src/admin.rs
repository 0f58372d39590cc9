//! `/healthz` (the process is up), `/readyz` (it can reach NATS and Postgres) and `/metrics`.
//!
//! The gateway's public port, where providers post webhooks, serves only the health checks
//! (load balancers need them); `/metrics` is on the admin address.
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

/// `/healthz` and `/readyz`.
pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(readiness)
}

/// The admin address: the health checks and `/metrics`.
pub fn router(readiness: Readiness) -> Router {
    health_router(readiness).route(
        "/metrics",
        get(|| async { crate::telemetry::metrics().render() }),
    )
}

async fn ready(State(r): State<Readiness>) -> (StatusCode, String) {
    if r.nats.connection_state() != async_nats::connection::State::Connected {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "nats: not connected".into(),
        );
    }
    if let Err(e) = sqlx::query_scalar!("SELECT 1 AS one")
        .fetch_one(&r.db)
        .await
    {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("postgres: {e}"));
    }
    (StatusCode::OK, "ready".into())
}
