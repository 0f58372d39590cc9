//! The Postgres pool and the embedded migrations (`migrations/`).
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("connecting to Postgres: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("applying migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(DbError::Connect)
}

/// Apply pending migrations; safe to run from several processes at once (sqlx takes a lock).
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}
