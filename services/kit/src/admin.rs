//! `/healthz` (the process is up), `/readyz` (it can reach NATS and Postgres) and `/metrics`.
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

pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route(
            "/metrics",
            get(|| async { crate::telemetry::metrics().render() }),
        )
        .with_state(readiness)
}

async fn ready(State(r): State<Readiness>) -> (StatusCode, String) {
    if r.nats.connection_state() != async_nats::connection::State::Connected {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "nats: not connected".into(),
        );
    }
    if let Err(e) = sqlx::query("SELECT 1").execute(&r.db).await {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("postgres: {e}"));
    }
    (StatusCode::OK, "ready".into())
}
