//! The Postgres pool and the embedded migrations (`migrations/`).
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database_url is not set: set it in the configuration file or as SB_DATABASE_URL")]
    NoUrl,
    /// `url` is redacted ([`crate::endpoint::redact_url`]): the error may reach a terminal.
    #[error("connecting to Postgres at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("applying migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// A pool for `url`. Errors name the URL without its password, whoever calls (the CLI's
/// commands call this directly, not through `App::connect`).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    if url.trim().is_empty() {
        return Err(DbError::NoUrl);
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|source| DbError::Connect {
            url: crate::endpoint::redact_url(url),
            source,
        })
}

/// Apply pending migrations; safe to run from several processes at once (sqlx takes a lock).
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_empty_url_names_the_setting() {
        for url in ["", "  "] {
            let e = connect(url, 1).await.unwrap_err();
            assert!(matches!(e, DbError::NoUrl), "{e:?}");
            let shown = e.to_string();
            assert!(
                shown.contains("database_url") && shown.contains("SB_DATABASE_URL"),
                "{shown}"
            );
        }
    }

    #[tokio::test]
    async fn a_failed_connection_names_the_url_without_its_password() {
        // A server that hangs up at once (a refused connection would be retried for the whole
        // acquire timeout).
        let listener = crate::net::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                drop(socket);
            }
        });
        let hangs_up = format!("postgres://switchboard:s3cr3tPa55@127.0.0.1:{port}/switchboard");
        let shown = format!("postgres://switchboard:***@127.0.0.1:{port}/switchboard");
        for (url, shown_as) in [
            (hangs_up.as_str(), shown.as_str()),
            // Not even a URL: not shown at all.
            (
                "postgres://switchboard:s3cr3tPa55@127.0.0.1:notaport/switchboard",
                "<not a URL>",
            ),
        ] {
            let e = connect(url, 1).await.unwrap_err();
            let DbError::Connect { url: redacted, .. } = &e else {
                panic!("{e:?}");
            };
            assert_eq!(redacted, shown_as);
            // Every way it is shown, the causes included.
            let debug = format!("{e:?}");
            let chain = format!("{:#} {debug}", anyhow::Error::from(e));
            assert!(chain.contains(shown_as), "{chain}");
            assert!(!chain.contains("s3cr3tPa55"), "{chain}");
        }
    }
}
