//! The memory workers' marks (which model embedded a message, which summary version merged it)
//! live beside the log in `message_marks`, not on its rows (issue 42: marking a wide row twice a
//! message rewrote it and every index of the log). Every logged message has its marks row from
//! the statement that logs it, whoever logs it; it goes when the message is erased; a database
//! upgraded with a log keeps the marks it had; and a worker of the previous version, still
//! marking the log's own columns during a rolling upgrade, is not done again.
use std::borrow::Cow;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use switchboard_e2e::fresh_database;
use switchboard_kit::db::MIGRATOR;
use uuid::Uuid;

/// The migration that moved the marks.
const MARKS_MOVED: i64 = 20261213000001;

async fn database() -> PgPool {
    let url = fresh_database(&std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL")).await;
    PgPool::connect(&url).await.unwrap()
}

/// The product's migrations before `version`, as the previous version's database had them.
fn migrations_before(version: i64) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            MIGRATOR
                .iter()
                .filter(|m| m.version < version)
                .cloned()
                .collect(),
        ),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    }
}

async fn a_session(db: &PgPool, person: &str) -> Uuid {
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO switchboard.sessions (id, person_type, person_id, agent_identity,
                agent_name, engine_type, channel, scope_key, memory_key)
         VALUES ($1, 'phone', $2, 'reggie_oc', 'reggie', 'openclaw', 'sms', 'reggie:' || $2,
                 'reggie:' || $2)",
    )
    .bind(id)
    .bind(person)
    .execute(db)
    .await
    .unwrap();
    id
}

/// A message to log, with the marks a database from before the move may carry on its row.
struct Logged<'a> {
    text: &'a str,
    kind: Option<&'a str>,
    model: Option<&'a str>,
    version: Option<i64>,
}

/// A message to log with no marks.
fn said<'a>(text: &'a str, kind: Option<&'a str>) -> Logged<'a> {
    Logged {
        text,
        kind,
        model: None,
        version: None,
    }
}

/// Log `texts` of `person` in one statement (as the log stage writes a batch); their ids, in
/// order.
async fn log(db: &PgPool, session: Uuid, person: &str, texts: &[Logged<'_>]) -> Vec<Uuid> {
    let ids: Vec<Uuid> = texts.iter().map(|_| Uuid::now_v7()).collect();
    let words: Vec<&str> = texts.iter().map(|t| t.text).collect();
    let kinds: Vec<Option<&str>> = texts.iter().map(|t| t.kind).collect();
    let models: Vec<Option<&str>> = texts.iter().map(|t| t.model).collect();
    let versions: Vec<Option<i64>> = texts.iter().map(|t| t.version).collect();
    let columns = if models.iter().any(Option::is_some) || versions.iter().any(Option::is_some) {
        // Only a database from before the move has these columns to write.
        ", embedded_model, summary_version"
    } else {
        ""
    };
    let values = if columns.is_empty() {
        ""
    } else {
        ", m.model, m.version"
    };
    sqlx::query(&format!(
        "INSERT INTO switchboard.messages
                (id, session_id, person_id, agent_name, agent_identity, direction, channel,
                 message, correlation_id, metadata{columns})
         SELECT m.id, $1, $2, 'reggie', 'reggie_oc', 'inbound', 'sms', m.text, 'c-' || m.id,
                CASE WHEN m.kind IS NULL THEN '{{}}'::jsonb
                     ELSE jsonb_build_object('kind', m.kind) END{values}
           FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[], $7::int8[])
                AS m(id, text, kind, model, version)"
    ))
    .bind(session)
    .bind(person)
    .bind(&ids)
    .bind(&words)
    .bind(&kinds)
    .bind(&models)
    .bind(&versions)
    .execute(db)
    .await
    .unwrap();
    ids
}

/// Each message's marks row, in id order: (id, conversation, model, version).
async fn marks(db: &PgPool) -> Vec<(Uuid, bool, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT message_id, conversation, embedded_model, summary_version
           FROM switchboard.message_marks ORDER BY message_id",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_logged_message_has_its_marks_from_the_statement_that_logs_it_and_they_go_with_it() {
    let db = database().await;
    MIGRATOR.run(&db).await.unwrap();
    let session = a_session(&db, "phone:+14155550101").await;
    let ids = log(
        &db,
        session,
        "phone:+14155550101",
        &[
            said("when is my next shift", None),
            said("NO_REPLY", Some("heartbeat_ok")),
            said("and the one after", None),
        ],
    )
    .await;
    assert_eq!(
        marks(&db).await,
        vec![
            (ids[0], true, None, None),
            (ids[1], false, None, None),
            (ids[2], true, None, None),
        ],
        "one row a message, nothing marked yet, the heartbeat's answer not conversation"
    );
    let (person, agent, session_of, logged_at): (String, String, Uuid, bool) = sqlx::query_as(
        "SELECT k.person_id, k.agent_identity, k.session_id, k.created_at = m.created_at
           FROM switchboard.message_marks k JOIN switchboard.messages m ON m.id = k.message_id
          WHERE k.message_id = $1",
    )
    .bind(ids[0])
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(
        (person.as_str(), agent.as_str(), session_of, logged_at),
        ("phone:+14155550101", "reggie_oc", session, true)
    );

    // Erased (as the forget worker deletes a person's messages): the marks go in the statement.
    sqlx::query("DELETE FROM switchboard.messages WHERE id = ANY($1)")
        .bind(&ids[..2])
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(marks(&db).await, vec![(ids[2], true, None, None)]);
}

#[tokio::test]
async fn a_database_upgraded_with_its_log_keeps_the_marks_it_had() {
    let db = database().await;
    migrations_before(MARKS_MOVED).run(&db).await.unwrap();
    let session = a_session(&db, "phone:+14155550102").await;
    let ids = log(
        &db,
        session,
        "phone:+14155550102",
        &[
            Logged {
                model: Some("fake-embed"),
                version: Some(1),
                ..said("embedded and summarised", None)
            },
            Logged {
                model: Some("fake-embed"),
                ..said("embedded only", None)
            },
            said("waiting for both", None),
        ],
    )
    .await;

    MIGRATOR.run(&db).await.unwrap();
    let model = || Some("fake-embed".to_string());
    assert_eq!(
        marks(&db).await,
        vec![
            (ids[0], true, model(), Some(1)),
            (ids[1], true, model(), None),
            (ids[2], true, None, None),
        ]
    );

    // A worker of the previous version, still running while this one migrated, marks the
    // log's own columns: its marks reach the table the workers of this version read.
    sqlx::query(
        "UPDATE switchboard.messages SET embedded_model = 'fake-embed', summary_version = 2
          WHERE id = $1",
    )
    .bind(ids[2])
    .execute(&db)
    .await
    .unwrap();
    assert_eq!(marks(&db).await[2], (ids[2], true, model(), Some(2)));
}
