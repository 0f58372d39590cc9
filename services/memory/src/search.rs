//! Search over the message log: hybrid ranking of messages, the vector similarity of each
//! message to the query (under the current embedding model, through its partial IVFFlat index)
//! fused with the full-text rank (`messages.search`) by reciprocal rank fusion. The filters on
//! the person and the agent identity are in the predicate of both branches, so a search for one
//! person cannot rank another's message. Every answer says how far behind the vector index is.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments as _, PgPool};
use uuid::Uuid;

use crate::embed::{EmbedError, Embedder, pg_vector};
use crate::index::{IndexLag, LagScope, lag_excluding};

/// The most hits one search answers with.
pub const MAX_LIMIT: i64 = 100;
/// Hits when the query does not say.
pub const DEFAULT_LIMIT: i64 = 20;
/// The longest query text.
pub const MAX_QUERY_CHARS: usize = 1_000;
/// Reciprocal rank fusion's constant: a hit at rank r in a branch scores 1 / (K + r).
const RRF_K: f64 = 60.0;
/// Each branch ranks this many candidates per hit asked for (fusion needs more than the page).
const CANDIDATES_PER_HIT: i64 = 4;

/// What to search for, and in whose messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchQuery {
    pub text: String,
    pub person: Option<String>,
    /// The agent (engine variant) name, e.g. `reggie_oc`.
    pub agent: Option<String>,
    /// The agent identity, e.g. `reggie` (every engine variant of it).
    pub identity: Option<String>,
    pub channel: Option<String>,
    /// Messages at or after this time.
    pub from: Option<DateTime<Utc>>,
    /// Messages before this time.
    pub to: Option<DateTime<Utc>>,
    pub limit: i64,
    /// Messages never to return (recall leaves out what the agent's engine session already
    /// holds and the message being answered).
    pub exclude: Vec<Uuid>,
    /// Outbound rows of these kinds (`messages.metadata.kind`) are not returned (recall leaves
    /// out notices and what was never sent).
    pub exclude_kinds: Vec<String>,
    /// Only the person's messages that came before this one (recall: messages sent after the
    /// one being answered wait for turns of their own and are not memory yet).
    pub inbound_before: Option<Uuid>,
    /// Lists of the vector index read (pgvector's `ivfflat.probes`) when the search spans
    /// people (`[embedding] ivfflat_probes`); 0: the database's setting. A person's search is
    /// exact and reads no index.
    pub probes: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The query itself is wrong (empty text, a limit out of range, `from` after `to`).
    #[error("{0}")]
    Invalid(String),
    #[error("search: {0}")]
    Database(#[from] sqlx::Error),
}

impl SearchQuery {
    /// Whether the query can run: the reason it cannot, for the person who asked.
    pub fn check(&self) -> Result<(), SearchError> {
        let text = self.text.trim();
        if text.is_empty() {
            return Err(SearchError::Invalid(
                "q (what to search for) is empty".into(),
            ));
        }
        if text.chars().count() > MAX_QUERY_CHARS {
            return Err(SearchError::Invalid(format!(
                "q is longer than {MAX_QUERY_CHARS} characters"
            )));
        }
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(SearchError::Invalid(format!(
                "limit must be a whole number from 1 to {MAX_LIMIT}"
            )));
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && from >= to
        {
            return Err(SearchError::Invalid("from must be before to".into()));
        }
        Ok(())
    }
}

/// One message found.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SearchHit {
    pub message_id: Uuid,
    pub text: String,
    /// `inbound` (the person's) or `outbound` (the agent's).
    pub direction: String,
    pub session_id: Uuid,
    pub person_id: String,
    /// The agent (engine variant) and its identity.
    pub agent: String,
    pub agent_identity: String,
    pub channel: String,
    pub at: DateTime<Utc>,
    /// The exchange's label, once the categorisation worker has given it one.
    pub category: Option<String>,
    /// The fused rank score (higher is better): the sum over the branches that found the
    /// message of 1 / (60 + its rank there).
    pub score: f64,
    /// Whether the vector branch and the full-text branch found it.
    pub by_meaning: bool,
    pub by_words: bool,
}

/// The answer of a search.
#[derive(Debug, Clone, Serialize)]
pub struct SearchResults {
    pub hits: Vec<SearchHit>,
    /// The embedding model the vector branch searched under.
    pub model: String,
    /// How far behind the vector index is for the messages searched.
    pub index_lag: IndexLag,
    /// Why meaning was not part of the ranking, when it was not (the embedder failed or is not
    /// usable): the hits then come from the words alone.
    pub vector_error: Option<String>,
}

impl SearchResults {
    /// What the person searching should know about the index: `None` when it is complete.
    pub fn note(&self) -> Option<String> {
        let mut notes = Vec::new();
        if self.index_lag.messages_waiting > 0 {
            notes.push(format!(
                "the search index is behind: {} message{} not searchable by meaning yet (the \
                 oldest waiting {:.0} s){}",
                self.index_lag.messages_waiting,
                if self.index_lag.messages_waiting == 1 {
                    " is"
                } else {
                    "s are"
                },
                self.index_lag.seconds,
                if self.hits.is_empty() {
                    ": no hit does not mean no such message"
                } else {
                    ""
                },
            ));
        }
        if let Some(e) = &self.vector_error {
            notes.push(format!("ranked by words only ({e})"));
        }
        (!notes.is_empty()).then(|| notes.join("; "))
    }
}

/// A model name as an SQL string literal (the partial vector index is chosen only when the
/// query's `model = '…'` is a literal equal to the index's predicate).
pub fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A query's vector under the embedder, as `pg_vector` text, or why there is none.
#[derive(Debug, Clone, Default)]
pub struct QueryVector {
    pub vector: Option<String>,
    /// Its length (0 when there is none).
    pub dimensions: usize,
    /// Why there is none, when the embedder failed or is not usable.
    pub error: Option<String>,
}

/// `text`'s vector under `embedder` (one inference), or why there is none.
pub async fn query_vector(embedder: Result<&dyn Embedder, &EmbedError>, text: &str) -> QueryVector {
    let failed = |error: String| QueryVector {
        error: Some(error),
        ..Default::default()
    };
    match embedder {
        Ok(e) => match e.embed(&[text.to_string()]).await {
            Ok(mut v) if v.len() == 1 => QueryVector {
                vector: Some(pg_vector(&v.remove(0))),
                dimensions: e.dimensions(),
                error: None,
            },
            Ok(_) => failed("the embedder answered no vector".into()),
            Err(err) => failed(err.to_string()),
        },
        Err(err) => failed(err.to_string()),
    }
}

/// The messages' filters `q` has, as SQL over `m` (parameters numbered as
/// [`ranking_arguments`] binds them; those of absent filters are bound and left unused). Only
/// the filters a query has are written: behind "`$n IS NULL OR …`" Postgres plans every call
/// afresh (the custom plan always looks cheaper than a generic one that must keep both arms),
/// and a cached generic plan could not use the person's index either. With the statement
/// written for its filters, recall's statement is the same text every turn and Postgres can
/// keep one plan for it (planning was ~1.7 ms of a heavy person's recall at 1M,
/// docs/bench-memory.md).
fn message_filters(q: &SearchQuery) -> String {
    let present = [
        (q.person.is_some(), "m.person_id = $2"),
        (q.identity.is_some(), "m.agent_identity = $3"),
        (q.agent.is_some(), "m.agent_name = $4"),
        (q.channel.is_some(), "m.channel = $5"),
        (q.from.is_some(), "m.created_at >= $6"),
        (q.to.is_some(), "m.created_at < $7"),
        (!q.exclude.is_empty(), "NOT (m.id = ANY($11::uuid[]))"),
        (
            !q.exclude_kinds.is_empty(),
            "NOT (coalesce(m.metadata->>'kind', '') = ANY($12::text[]))",
        ),
        (
            q.inbound_before.is_some(),
            "(m.direction <> 'inbound' OR m.id < $13)",
        ),
    ];
    let filters: Vec<&str> = present
        .iter()
        .filter_map(|&(has, sql)| has.then_some(sql))
        .collect();
    if filters.is_empty() {
        return "true".to_string();
    }
    filters.join("\n               AND ")
}

/// The hybrid ranking statement: `model`'s vectors of `dimensions` (no vector branch when the
/// query has no vector). `for_person`: one person's messages are ranked by their exact distance
/// (the btree on person, then a sort), never through the approximate index: a person's vectors
/// are few, and a filtered approximate scan can miss one of them entirely among near-identical
/// vectors of other people (seen: recall's fifty-people test, a person's own message not
/// recalled now and then). The exact distance is the stored vectors' own (`vector`, f32): no
/// cast to the index's `halfvec` per row (the cast was most of a heavy person's recall: 18 of
/// 32 ms for 1,745 vectors at 1M), and no rounding either.
///
/// Built at run time, so checked when it runs, not by `sqlx::query!`: its text depends on the
/// model (the partial vector index's predicate), the dimensions (the `halfvec(n)` cast the index
/// is matched by) and which branches the query has; a compile-time statement would need one
/// literal per model and size.
fn ranking_sql(model: &str, dimensions: usize, with_vector: bool, q: &SearchQuery) -> String {
    let for_person = q.person.is_some();
    let filters = message_filters(q);
    // The person and identity are checked on the vector rows themselves too (isolation where
    // the data lives).
    let identity = if q.identity.is_some() {
        "\n                                AND mv.agent_identity = $3"
    } else {
        ""
    };
    let vector_branch = if with_vector && for_person {
        let n = dimensions;
        let model = sql_literal(model);
        // The query vector comes as text: cast once, in an InitPlan, not per row (a cached
        // generic plan parsed the text again for each of a heavy person's 1,627 vectors: 26 ms
        // against 4, docs/bench-memory.md).
        // The person's vectors are read once, each distance computed as it is read, and sorted
        // as (id, distance) pairs; the messages' filters are then checked row by row in that
        // order (a subquery per row, which Postgres does not turn into a join) until `$8` pass:
        // a heavy person's 1,745 vectors at 1M were hashed with their 1.5 kB each and joined
        // with all 1,745 of their messages before (docs/bench-memory.md).
        format!(
            "SELECT v.message_id AS id,
                    row_number() OVER (ORDER BY v.distance, v.message_id) AS r
               FROM (SELECT d.message_id, d.distance
                       FROM (SELECT mv.message_id, mv.embedding <=> (SELECT $1::halfvec({n})) AS distance
                               FROM switchboard.message_vectors mv
                              WHERE mv.model = {model}
                                AND mv.person_id = $2{identity}
                              ORDER BY 2, 1
                             OFFSET 0) d
                      WHERE coalesce((SELECT true FROM switchboard.messages m
                                       WHERE m.id = d.message_id AND {filters}), false)
                      ORDER BY d.distance, d.message_id
                      LIMIT $8) v"
        )
    } else if with_vector {
        let n = dimensions;
        // The vector index serves exactly this expression (an InitPlan's value is a constant to
        // it, as `$1` is).
        let distance = format!("mv.embedding::halfvec({n}) <=> (SELECT $1::halfvec({n}))");
        let model = sql_literal(model);
        format!(
            "SELECT v.message_id AS id,
                    row_number() OVER (ORDER BY v.distance, v.message_id) AS r
               FROM (SELECT mv.message_id, {distance} AS distance
                       FROM switchboard.message_vectors mv
                       JOIN switchboard.messages m ON m.id = mv.message_id
                      WHERE mv.model = {model}{identity}
                        AND {filters}
                      ORDER BY {distance}
                      LIMIT $8) v"
        )
    } else {
        // No query vector: an empty branch of the same shape ($1 is NULL).
        "SELECT NULL::uuid AS id, 0::bigint AS r WHERE $1::text IS NOT NULL".to_string()
    };
    format!(
        "WITH vec AS ({vector_branch}),
              txt AS (
                SELECT t.id, row_number() OVER (ORDER BY t.rank DESC, t.id DESC) AS r
                  FROM (SELECT m.id, ts_rank_cd(m.search, query) AS rank
                          FROM switchboard.messages m,
                               websearch_to_tsquery('simple', $9) AS query
                         WHERE m.search @@ query AND {filters}
                         ORDER BY rank DESC, m.id DESC
                         LIMIT $8) t),
              fused AS (
                SELECT id, sum(1.0 / ({RRF_K} + r))::float8 AS score,
                       bool_or(branch = 'vec') AS by_meaning,
                       bool_or(branch = 'txt') AS by_words
                  FROM (SELECT id, r, 'vec' AS branch FROM vec
                        UNION ALL SELECT id, r, 'txt' FROM txt) b
                 WHERE id IS NOT NULL
                 GROUP BY id)
         SELECT m.id AS message_id, m.message AS text, m.direction, m.session_id, m.person_id,
                m.agent_name AS agent, m.agent_identity, m.channel, m.created_at AS at,
                m.category, f.score, f.by_meaning, f.by_words
           FROM fused f JOIN switchboard.messages m ON m.id = f.id
          WHERE {filters}
          ORDER BY f.score DESC, m.id DESC
          LIMIT $10"
    )
}

/// The ranking statement's parameters, in order.
fn ranking_arguments(
    vector: Option<String>,
    text: &str,
    q: &SearchQuery,
) -> Result<PgArguments, SearchError> {
    let mut a = PgArguments::default();
    let encode = |e| SearchError::Database(sqlx::Error::Encode(e));
    a.add(vector).map_err(encode)?;
    a.add(&q.person).map_err(encode)?;
    a.add(&q.identity).map_err(encode)?;
    a.add(&q.agent).map_err(encode)?;
    a.add(&q.channel).map_err(encode)?;
    a.add(q.from).map_err(encode)?;
    a.add(q.to).map_err(encode)?;
    a.add(q.limit * CANDIDATES_PER_HIT).map_err(encode)?;
    a.add(text).map_err(encode)?;
    a.add(q.limit).map_err(encode)?;
    a.add(&q.exclude).map_err(encode)?;
    a.add(&q.exclude_kinds).map_err(encode)?;
    a.add(q.inbound_before).map_err(encode)?;
    Ok(a)
}

/// The settings the ranking statement runs under, in its transaction.
async fn ranking_settings(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    probes: u32,
) -> Result<(), SearchError> {
    // With filters, an index scan that stops after its probes can return fewer rows than
    // asked for (or none); the iterative scan reads more lists until enough pass.
    sqlx::query("SET LOCAL ivfflat.iterative_scan = relaxed_order")
        .execute(&mut **tx)
        .await?;
    if probes > 0 {
        // SET takes no parameter; a number is safe to write in.
        sqlx::query(&format!("SET LOCAL ivfflat.probes = {probes}"))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Search the messages. `embedder` is the configured one (`Err`: why it is not usable; the
/// search then ranks by words alone and says so); `model` is the model whose vectors are
/// searched and whose lag is reported.
pub async fn search(
    db: &PgPool,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    q: &SearchQuery,
) -> Result<SearchResults, SearchError> {
    q.check()?;
    let vector = query_vector(embedder, q.text.trim()).await;
    search_by(db, vector, model, q).await
}

/// [`search`] with the query's vector already had (recall embeds once and keeps the vector).
pub async fn search_by(
    db: &PgPool,
    vector: QueryVector,
    model: &str,
    q: &SearchQuery,
) -> Result<SearchResults, SearchError> {
    let scope = match &q.person {
        Some(person_id) => LagScope::Person {
            person_id,
            agent_identity: q.identity.as_deref(),
        },
        None => LagScope::Everyone,
    };
    // Side by side, on two connections: the answer waits for the slower, not for both.
    let ((hits, vector_error), index_lag) =
        tokio::try_join!(rank_by(db, vector, model, q), async {
            lag_excluding(db, model, scope, &q.exclude)
                .await
                .map_err(SearchError::from)
        })?;
    Ok(SearchResults {
        hits,
        model: model.to_string(),
        index_lag,
        vector_error,
    })
}

/// [`search`]'s ranking alone, without the index lag: the hits, and why meaning was not part
/// of the ranking when it was not. (The memory bench times the two parts apart.)
pub async fn rank(
    db: &PgPool,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    q: &SearchQuery,
) -> Result<(Vec<SearchHit>, Option<String>), SearchError> {
    q.check()?;
    let vector = query_vector(embedder, q.text.trim()).await;
    rank_by(db, vector, model, q).await
}

async fn rank_by(
    db: &PgPool,
    vector: QueryVector,
    model: &str,
    q: &SearchQuery,
) -> Result<(Vec<SearchHit>, Option<String>), SearchError> {
    q.check()?;
    let text = q.text.trim().to_string();
    let QueryVector {
        vector,
        dimensions,
        error: vector_error,
    } = vector;
    let with_vector = vector.is_some();
    let for_person = q.person.is_some();
    let sql = ranking_sql(model, dimensions, with_vector, q);
    let arguments = ranking_arguments(vector, &text, q)?;
    if for_person || !with_vector {
        // No approximate index read: none of its settings, so no transaction to hold them
        // (three round trips fewer for every turn's recall).
        let hits = sqlx::query_as_with(&sql, arguments).fetch_all(db).await?;
        return Ok((hits, vector_error));
    }
    let mut tx = db.begin().await?;
    ranking_settings(&mut tx, q.probes).await?;
    let hits: Vec<SearchHit> = sqlx::query_as_with(&sql, arguments)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((hits, vector_error))
}

/// The plan of [`search`]'s ranking statement for `q`, as run (`EXPLAIN (ANALYZE, BUFFERS)` of
/// the same statement with the same parameters and settings): what the memory bench records
/// beside its figures, so they are read with the plan that produced them.
pub async fn explain(
    db: &PgPool,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    q: &SearchQuery,
) -> Result<String, SearchError> {
    q.check()?;
    let text = q.text.trim().to_string();
    let QueryVector {
        vector, dimensions, ..
    } = query_vector(embedder, &text).await;
    let with_vector = vector.is_some();
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS) {}",
        ranking_sql(model, dimensions, with_vector, q)
    );
    let mut tx = db.begin().await?;
    if with_vector && q.person.is_none() {
        ranking_settings(&mut tx, q.probes).await?;
    }
    let lines: Vec<String> = sqlx::query_scalar_with(&sql, ranking_arguments(vector, &text, q)?)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> SearchQuery {
        SearchQuery {
            text: "next shift".into(),
            limit: DEFAULT_LIMIT,
            ..Default::default()
        }
    }

    #[test]
    fn a_query_without_text_or_with_a_limit_out_of_range_is_refused_saying_why() {
        assert!(query().check().is_ok());
        let empty = SearchQuery {
            text: "  ".into(),
            ..query()
        };
        assert!(empty.check().unwrap_err().to_string().contains("empty"));
        for limit in [0, 101] {
            let q = SearchQuery { limit, ..query() };
            assert!(q.check().unwrap_err().to_string().contains("limit"));
        }
        let t = Utc::now();
        let backwards = SearchQuery {
            from: Some(t),
            to: Some(t - chrono::Duration::hours(1)),
            ..query()
        };
        assert!(backwards.check().unwrap_err().to_string().contains("from"));
    }

    #[test]
    fn a_model_name_is_quoted_as_a_literal() {
        assert_eq!(sql_literal("all-MiniLM-L6-v2"), "'all-MiniLM-L6-v2'");
        assert_eq!(sql_literal("it's"), "'it''s'");
    }

    #[test]
    fn a_lagging_index_is_never_silent() {
        let results = |waiting| SearchResults {
            hits: Vec::new(),
            model: "m".into(),
            index_lag: IndexLag {
                seconds: 42.0,
                messages_waiting: waiting,
            },
            vector_error: None,
        };
        assert_eq!(results(0).note(), None);
        let note = results(3).note().unwrap();
        assert!(
            note.contains("behind") && note.contains("3 messages") && note.contains("42 s"),
            "{note}"
        );
    }
}
