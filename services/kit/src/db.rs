//! The Postgres pool and the embedded migrations (`migrations/`).
use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

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
    connect_named(url, max_connections, None).await
}

/// [`connect`], the connections named `application_name` (unless the URL or `PGAPPNAME` names
/// them): `pg_stat_activity` and the server's log (`%a`) then tell which worker asked.
pub async fn connect_as(
    url: &str,
    max_connections: u32,
    application_name: &str,
) -> Result<PgPool, DbError> {
    connect_named(url, max_connections, Some(application_name)).await
}

async fn connect_named(
    url: &str,
    max_connections: u32,
    application_name: Option<&str>,
) -> Result<PgPool, DbError> {
    if url.trim().is_empty() {
        return Err(DbError::NoUrl);
    }
    let mut options =
        PgConnectOptions::from_str(url).map_err(|source| connect_error(url, source))?;
    if let Some(name) = application_name.filter(|_| options.get_application_name().is_none()) {
        options = options.application_name(name);
    }
    pool_options(max_connections)
        .connect_with(options)
        .await
        .map_err(|source| connect_error(url, source))
}

fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
}

fn connect_error(url: &str, source: sqlx::Error) -> DbError {
    DbError::Connect {
        url: crate::endpoint::redact_url(url),
        source,
    }
}

/// A pool for `url` that connects when first used (a second pool of a process whose first,
/// [`connect`]ed, showed the database is there).
pub fn connect_lazy(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    pool_options(max_connections)
        .connect_lazy(url)
        .map_err(|source| connect_error(url, source))
}

/// The schema the migrations put the product's tables in.
pub const SCHEMA: &str = "switchboard";

/// Apply pending migrations; safe to run from several processes at once (sqlx takes a lock).
///
/// sqlx keeps its ledger (`_sqlx_migrations`) in the first schema of the search path that
/// exists. Postgres's default path is `"$user", public`: for a role named `switchboard`, as
/// deployments name it, that is `public` on the first start and the product's own schema on
/// every start after the first migration made it, where sqlx finds no ledger and runs
/// migration 1 again, which fails (sqlx#3523). So the migrations run on a connection whose path
/// leaves out the product's schema when it comes first; the pool's other connections keep the
/// operator's path (every query names its schema).
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    let mut conn = pool.acquire().await.map_err(migrate_error)?;
    let path = sqlx::query_scalar!(r#"SELECT unnest(current_schemas(false))::text AS "schema!""#)
        .fetch_all(&mut *conn)
        .await
        .map_err(migrate_error)?;
    // An install whose schema existed before its first start keeps its ledger there: sqlx
    // finds it on the operator's path, as it always did.
    let ledger_in_schema = sqlx::query_scalar!(
        r#"SELECT to_regclass($1) IS NOT NULL AS "exists!""#,
        format!("{}._sqlx_migrations", quote_ident(SCHEMA)),
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(migrate_error)?;
    if path.first().map(String::as_str) != Some(SCHEMA) || ledger_in_schema {
        MIGRATOR.run(&mut *conn).await?;
        return Ok(());
    }
    let rest: Vec<String> = path[1..].iter().map(|s| quote_ident(s)).collect();
    let rest = if rest.is_empty() {
        "public".to_string()
    } else {
        rest.join(", ")
    };
    // The schemas are names, not values: SET takes no parameters, so this one is built here.
    sqlx::query(&format!("SET search_path TO {rest}"))
        .execute(&mut *conn)
        .await
        .map_err(migrate_error)?;
    let ran = MIGRATOR.run(&mut *conn).await;
    // The connection goes back to the pool: with the operator's path again, or not at all.
    if sqlx::query!("RESET search_path")
        .execute(&mut *conn)
        .await
        .is_err()
    {
        conn.detach();
    }
    ran?;
    Ok(())
}

fn migrate_error(e: sqlx::Error) -> DbError {
    DbError::Migrate(sqlx::migrate::MigrateError::Execute(e))
}

/// `name` as a Postgres identifier, quoted.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
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

/// Whether `e` says the database could not be reached, or dropped or refused the connection
/// (starting up, shutting down): the statement's own content is not at fault. A group of
/// requests that failed so is answered with the outage at once, not asked again one by one:
/// each would wait out the same outage in turn (a pool's acquire timeout a request).
pub fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 08: connection exceptions; 57P0x: the server shutting down or starting up.
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// The answers of a group of requests, one per member in order. `together` is what one
/// statement for all of them gave (its answers in the members' order); when it failed on an
/// outage every member is told so at once, otherwise each is asked `alone` (by its index), so
/// one bad member fails only itself.
pub async fn answer_group<Q, A, Fut>(
    asked: &[Q],
    together: sqlx::Result<Vec<A>>,
    alone: impl Fn(usize) -> Fut,
) -> Vec<sqlx::Result<A>>
where
    Fut: std::future::Future<Output = sqlx::Result<A>>,
{
    match together {
        Ok(answers) => answers.into_iter().map(Ok).collect(),
        Err(e) if is_outage(&e) => asked.iter().map(|_| Err(outage_for_each(&e))).collect(),
        Err(e) => {
            tracing::warn!(error = %e, members = asked.len(),
                "a group's statement failed; asking each member alone");
            let mut answers = Vec::with_capacity(asked.len());
            for i in 0..asked.len() {
                answers.push(alone(i).await);
            }
            answers
        }
    }
}

/// The outage `e` ([`is_outage`]) as each member of a failed group is told it (sqlx's errors
/// are not `Clone`): an I/O error carrying the original's text.
pub fn outage_for_each(e: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        e.to_string(),
    ))
}

#[cfg(test)]
mod outage_tests {
    use super::*;

    #[test]
    fn an_unreachable_database_is_an_outage_and_a_bad_statement_is_not() {
        assert!(is_outage(&sqlx::Error::PoolTimedOut));
        assert!(is_outage(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_outage(&sqlx::Error::RowNotFound));
        assert!(!is_outage(&sqlx::Error::ColumnNotFound("x".into())));
        let told = outage_for_each(&sqlx::Error::PoolTimedOut);
        assert!(is_outage(&told));
        assert!(told.to_string().contains("timed out"), "{told}");
    }

    #[tokio::test]
    async fn a_group_failing_on_an_outage_tells_every_member_at_once_and_asks_none_alone() {
        let asked = [1, 2, 3];
        let alone = std::sync::atomic::AtomicUsize::new(0);
        let ask_alone = |i: usize| {
            alone.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { Ok(asked[i] * 10) }
        };
        let told = answer_group(&asked, Err(sqlx::Error::PoolTimedOut), ask_alone).await;
        assert!(told.iter().all(|a| a.as_ref().is_err_and(is_outage)));
        assert_eq!(alone.load(std::sync::atomic::Ordering::SeqCst), 0);

        // Any other failure: each member alone, in order, with its own answer.
        let each = answer_group(&asked, Err(sqlx::Error::RowNotFound), ask_alone).await;
        let each: Vec<i32> = each.into_iter().map(Result::unwrap).collect();
        assert_eq!(each, [10, 20, 30]);
        assert_eq!(alone.load(std::sync::atomic::Ordering::SeqCst), 3);

        let together = answer_group(&asked, Ok(vec![7, 8, 9]), ask_alone).await;
        let together: Vec<i32> = together.into_iter().map(Result::unwrap).collect();
        assert_eq!(together, [7, 8, 9]);
        assert_eq!(alone.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
