//! Recall: what a turn's prompt carries of the person's earlier messages with this agent
//! identity. The top-k messages most relevant to what the person just said (the hybrid ranking
//! of [`crate::search`], always filtered to the turn's person and identity in the SQL itself),
//! leaving out what the agent's engine session already holds, plus the person's recent
//! category counts. Each turn's recall is recorded in the session's journal
//! ([`Recall::journal_detail`]) so "why did the agent know this" has an answer.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;
use switchboard_kit::db::answer_group;
use switchboard_kit::memory_config::RecallConfig;
use uuid::Uuid;

use crate::embed::{EmbedError, Embedder};
use crate::index::IndexLag;
use crate::search::{
    MAX_QUERY_CHARS, QueryVector, SearchError, SearchHit, SearchQuery, query_vector, search_by,
};

/// A recalled message is cut to this many characters in the prompt.
const MAX_HIT_CHARS: usize = 400;
/// The most labels the "recent topics" line names.
const MAX_TOPICS: i64 = 5;

/// Whose memory to recall from, and for what.
#[derive(Debug, Clone)]
pub struct RecallRequest<'a> {
    pub person_id: &'a str,
    pub agent_identity: &'a str,
    /// What the person just said (the turn's message, or the messages it joins).
    pub text: &'a str,
    /// The session whose engine session is resumed, with that engine session's id: the
    /// messages of its turns are in the agent's context already. `None`: a fresh engine
    /// session, which holds nothing.
    pub held_by: Option<(Uuid, &'a str)>,
    /// The messages this turn answers (never recalled to themselves).
    pub answering: Vec<Uuid>,
    /// The one message the turn answers and its text, when it answers one: if its words are
    /// the query's, its stored vector is the query's (one inference a message, both ways:
    /// [`crate::handoff`]).
    pub message: Option<(Uuid, &'a str)>,
}

/// One label and how often the person's exchanges got it lately.
#[derive(Debug, Clone, PartialEq)]
pub struct Topic {
    pub label: String,
    pub count: i64,
}

/// What a turn recalls.
#[derive(Debug, Clone)]
pub struct Recall {
    pub hits: Vec<SearchHit>,
    pub topics: Vec<Topic>,
    /// Over how many days the topics were counted.
    pub topic_days: u32,
    pub model: String,
    pub index_lag: IndexLag,
    /// Why meaning was not part of the ranking, when it was not.
    pub vector_error: Option<String>,
    /// The vector recall embedded for the one message it answers, its whole text: that
    /// message's own, for the embedding worker ([`crate::handoff`]). `None` when the vector was
    /// read (stored already), the query is not one message's text, or no embedding worker of the
    /// model has started here (nothing would take it).
    pub message_vector: Option<MessageVector>,
}

/// One message's vector under the recall's model.
#[derive(Debug, Clone)]
pub struct MessageVector {
    pub message_id: Uuid,
    /// `pg_vector` text.
    pub vector: String,
    pub dimensions: usize,
}

/// The message whose own vector the query's is: the one message the turn answers, when the
/// query (its text trimmed and cut, as [`recall_query`] makes it) is that message's whole text.
fn own_message(req: &RecallRequest<'_>) -> Option<Uuid> {
    let (id, said) = req.message?;
    let query: String = req.text.trim().chars().take(MAX_QUERY_CHARS).collect();
    (said == query && !said.is_empty()).then_some(id)
}

/// How long recall trusts what it last read of the embedding marks.
const MARKS_EVERY: Duration = Duration::from_secs(30);

/// The search a turn's recall runs: `None` when recall is off or there is no text to recall for
/// (a heartbeat's batch, an empty message).
async fn recall_query(
    db: &PgPool,
    reads: Option<&RecallReads>,
    config: &RecallConfig,
    req: &RecallRequest<'_>,
) -> Result<Option<SearchQuery>, SearchError> {
    let text: String = req.text.trim().chars().take(MAX_QUERY_CHARS).collect();
    if !config.enabled || config.top_k == 0 || text.is_empty() {
        return Ok(None);
    }
    let inbound_before = req.answering.iter().max().copied();
    let mut exclude = req.answering.clone();
    if let Some((session, engine_session)) = req.held_by {
        let held = match reads {
            Some(reads) => reads.held(session, engine_session).await?,
            None => held(db, session, engine_session).await?,
        };
        exclude.extend(held);
    }
    Ok(Some(SearchQuery {
        text,
        // Isolation where the data lives: both are in every branch's predicate.
        person: Some(req.person_id.to_string()),
        identity: Some(req.agent_identity.to_string()),
        limit: config.top_k.min(crate::search::MAX_LIMIT as usize) as i64,
        exclude,
        inbound_before,
        // The conversation only: not the notices Switchboard sent, not what was never sent.
        exclude_kinds: crate::NOT_CONVERSATION
            .iter()
            .chain(&["notice"])
            .map(|k| k.to_string())
            .collect(),
        ..Default::default()
    }))
}

/// The earlier messages of `req.person_id` with `req.agent_identity` most relevant to
/// `req.text`, and their recent topics. `None` when recall is off or there is no text to recall
/// for (a heartbeat's batch, an empty message).
pub async fn recall(
    db: &PgPool,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    config: &RecallConfig,
    req: &RecallRequest<'_>,
) -> Result<Option<Recall>, SearchError> {
    recall_reading(db, None, embedder, model, config, req).await
}

/// [`recall`] with its reads of the held turns and the topics asked together with the other
/// turns' recalls ([`RecallReads`]): the same answer, two statements a batch instead of two a
/// turn.
pub async fn recall_grouped(
    reads: &RecallReads,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    config: &RecallConfig,
    req: &RecallRequest<'_>,
) -> Result<Option<Recall>, SearchError> {
    recall_reading(reads.db(), Some(reads), embedder, model, config, req).await
}

async fn recall_reading(
    db: &PgPool,
    reads: Option<&RecallReads>,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    config: &RecallConfig,
    req: &RecallRequest<'_>,
) -> Result<Option<Recall>, SearchError> {
    // The answered message's own vector, when the embedding worker came first, read beside
    // the held turns; only when the query is that message's whole text, and (grouped, the
    // dispatcher's way) only once an embedding worker of the model has started here: without
    // one, neither the read nor a hand-off can find or feed anything.
    let own = match reads {
        Some(reads) if !reads.embedding_started(model).await => None,
        _ => own_message(req),
    };
    let stored = async {
        let Some(id) = own else {
            return Ok(None);
        };
        match reads {
            Some(reads) => reads.stored_vector(id, model).await,
            None => stored_vector(db, id, model).await,
        }
        .map_err(SearchError::from)
    };
    let (query, stored) = tokio::try_join!(recall_query(db, reads, config, req), stored)?;
    let Some(query) = query else {
        return Ok(None);
    };
    let topics = async {
        if config.category_days == 0 {
            return Ok(Vec::new());
        }
        let topics = match reads {
            Some(reads) => {
                reads
                    .topics(req.person_id, req.agent_identity, config.category_days)
                    .await
            }
            None => topics(db, req.person_id, req.agent_identity, config.category_days).await,
        };
        topics.map_err(SearchError::from)
    };
    query.check()?;
    let embedded_text = query.text.trim().to_string();
    let (vector, message_vector) = match stored {
        Some((vector, dimensions)) => {
            metrics::counter!("sb_recall_query_vectors_total", "source" => "stored").increment(1);
            let vector = QueryVector {
                vector: Some(vector),
                dimensions: dimensions as usize,
                error: None,
            };
            (vector, None)
        }
        None => {
            // One inference, kept: it may be the answered message's own (crate::handoff).
            metrics::counter!("sb_recall_query_vectors_total", "source" => "embedded").increment(1);
            let vector = query_vector(embedder, &embedded_text).await;
            let message_vector = match (own, &vector) {
                (
                    Some(message_id),
                    QueryVector {
                        vector: Some(v),
                        dimensions,
                        ..
                    },
                ) => Some(MessageVector {
                    message_id,
                    vector: v.clone(),
                    dimensions: *dimensions,
                }),
                _ => None,
            };
            (vector, message_vector)
        }
    };
    // A turn waits for its recall: the topics are read beside the search, not after it.
    let (results, topics) = tokio::try_join!(search_by(db, vector, model, &query), topics)?;
    Ok(Some(Recall {
        message_vector,
        hits: results.hits,
        topics,
        topic_days: config.category_days,
        model: results.model,
        index_lag: results.index_lag,
        vector_error: results.vector_error,
    }))
}

/// Message `id`'s vector under `model` (`pg_vector` text) and its length, if it has one.
async fn stored_vector(
    db: &PgPool,
    id: Uuid,
    model: &str,
) -> Result<Option<(String, i32)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT embedding::text, dimensions FROM switchboard.message_vectors
          WHERE message_id = $1 AND model = $2",
    )
    .bind(id)
    .bind(model)
    .fetch_optional(db)
    .await
}

/// [`stored_vector`] for each of `asked`, by its index.
async fn stored_vectors_all(
    db: &PgPool,
    asked: &[StoredAsk],
) -> Result<HashMap<usize, Option<(String, i32)>>, sqlx::Error> {
    let (ids, models): (Vec<Uuid>, Vec<&str>) =
        asked.iter().map(|(id, m)| (*id, m.as_str())).unzip();
    let rows: Vec<(i64, String, i32)> = sqlx::query_as(
        "SELECT a.n - 1, v.embedding::text, v.dimensions
           FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS a(id, model, n)
           CROSS JOIN LATERAL (
                SELECT v.embedding, v.dimensions FROM switchboard.message_vectors v
                 WHERE v.message_id = a.id AND v.model = a.model
                OFFSET 0) v",
    )
    .bind(&ids)
    .bind(&models)
    // By the primary key whatever the table held when the statement was first planned (the
    // lateral, kept apart by OFFSET 0, as the held turns').
    .persistent(false)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(n, v, d)| (n as usize, Some((v, d))))
        .collect())
}

/// The turns of `session` run in engine session `engine`: their messages (in and out) are in
/// the agent's context already.
async fn held(db: &PgPool, session: Uuid, engine: &str) -> Result<Vec<Uuid>, sqlx::Error> {
    let held: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(
        "SELECT inbound_id, reply_id FROM switchboard.turns
          WHERE session_id = $1 AND engine_session_id = $2",
    )
    .bind(session)
    .bind(engine)
    .fetch_all(db)
    .await?;
    Ok(held
        .into_iter()
        .flat_map(|(inbound, reply)| std::iter::once(inbound).chain(reply))
        .collect())
}

/// The labels the person's exchanges with the identity got most in the last `days` days.
async fn topics(
    db: &PgPool,
    person_id: &str,
    identity: &str,
    days: u32,
) -> Result<Vec<Topic>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT label, count(*) FROM switchboard.exchange_categories
          WHERE person_id = $1 AND agent_identity = $2
            AND created_at >= now() - $3 * interval '1 day'
          GROUP BY label ORDER BY count(*) DESC, label LIMIT $4",
    )
    .bind(person_id)
    .bind(identity)
    .bind(days as f64)
    .bind(MAX_TOPICS)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(label, count)| Topic { label, count })
        .collect())
}

type HeldAsk = (Uuid, String);
type TopicsAsk = (String, String, u32);
type StoredAsk = (Uuid, String);

/// Recall's reads of its own (the held turns, the topics, the answered message's vector), asked
/// by many turns at once
/// and answered by one statement each per batch; a failed batch is asked again turn by turn.
pub struct RecallReads {
    db: PgPool,
    held: Coalescer<HeldAsk, sqlx::Result<Vec<Uuid>>>,
    topics: Coalescer<TopicsAsk, sqlx::Result<Vec<Topic>>>,
    stored: Coalescer<StoredAsk, sqlx::Result<Option<(String, i32)>>>,
    /// The embedding marks' model as last read, and when.
    marks: std::sync::Mutex<Option<(Instant, Option<String>)>>,
}

impl RecallReads {
    pub fn new(db: PgPool) -> Self {
        let held_db = db.clone();
        let held_group = Coalescer::new(256, 2, move |asked: Vec<HeldAsk>| {
            let db = held_db.clone();
            async move {
                let together = held_all(&db, &asked)
                    .await
                    .map(|found| in_order(found, asked.len()));
                answer_group(&asked, together, |i| held(&db, asked[i].0, &asked[i].1)).await
            }
        });
        let topics_db = db.clone();
        let topics_group = Coalescer::new(256, 2, move |asked: Vec<TopicsAsk>| {
            let db = topics_db.clone();
            async move {
                let together = topics_all(&db, &asked)
                    .await
                    .map(|found| in_order(found, asked.len()));
                answer_group(&asked, together, |i| {
                    let (person, identity, days) = &asked[i];
                    topics(&db, person, identity, *days)
                })
                .await
            }
        });
        let stored_db = db.clone();
        let stored_group = Coalescer::new(256, 2, move |asked: Vec<StoredAsk>| {
            let db = stored_db.clone();
            async move {
                let together = stored_vectors_all(&db, &asked)
                    .await
                    .map(|found| in_order(found, asked.len()));
                answer_group(&asked, together, |i| {
                    let (id, model) = &asked[i];
                    stored_vector(&db, *id, model)
                })
                .await
            }
        });
        Self {
            db,
            held: held_group,
            topics: topics_group,
            stored: stored_group,
            marks: std::sync::Mutex::new(None),
        }
    }

    fn db(&self) -> &PgPool {
        &self.db
    }

    async fn held(&self, session: Uuid, engine: &str) -> Result<Vec<Uuid>, sqlx::Error> {
        self.held
            .call((session, engine.to_string()))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }

    /// Whether an embedding worker of `model` has started on this database (its marks), read
    /// at most every [`MARKS_EVERY`]; a failed read counts as not started.
    async fn embedding_started(&self, model: &str) -> bool {
        let cached = self.marks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let marked = match cached {
            Some((at, marked)) if at.elapsed() < MARKS_EVERY => marked,
            _ => {
                let marked = crate::index::marked_model(&self.db).await.ok().flatten();
                *self.marks.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((Instant::now(), marked.clone()));
                marked
            }
        };
        marked.as_deref() == Some(model)
    }

    async fn stored_vector(
        &self,
        id: Uuid,
        model: &str,
    ) -> Result<Option<(String, i32)>, sqlx::Error> {
        self.stored
            .call((id, model.to_string()))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }

    async fn topics(
        &self,
        person_id: &str,
        identity: &str,
        days: u32,
    ) -> Result<Vec<Topic>, sqlx::Error> {
        self.topics
            .call((person_id.to_string(), identity.to_string(), days))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

/// The answers found by index, in order; an index with none found answers empty.
fn in_order<A: Default>(mut found: HashMap<usize, A>, n: usize) -> Vec<A> {
    (0..n)
        .map(|i| found.remove(&i).unwrap_or_default())
        .collect()
}

/// [`held`] for each of `asked`, by its index.
async fn held_all(
    db: &PgPool,
    asked: &[HeldAsk],
) -> Result<HashMap<usize, Vec<Uuid>>, sqlx::Error> {
    let (sessions, engines): (Vec<Uuid>, Vec<&str>) =
        asked.iter().map(|(s, e)| (*s, e.as_str())).unzip();
    let rows: Vec<(i64, Uuid, Option<Uuid>)> = sqlx::query_as(
        "SELECT a.n - 1, t.inbound_id, t.reply_id
           FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS a(session_id, engine, n)
           CROSS JOIN LATERAL (
                SELECT t.inbound_id, t.reply_id FROM switchboard.turns t
                 WHERE t.session_id = a.session_id AND t.engine_session_id = a.engine
                OFFSET 0) t",
    )
    .bind(&sessions)
    .bind(&engines)
    // Each asked session's turns by the primary key: before Postgres first analyzes `turns`
    // (a fresh database's first minute) a plain join was planned as a scan of every turn;
    // the lateral (kept apart by OFFSET 0) leaves the planner only a lookup per session.
    .persistent(false)
    .fetch_all(db)
    .await?;
    let mut by_ask: HashMap<usize, Vec<Uuid>> = HashMap::new();
    for (n, inbound, reply) in rows {
        let ids = by_ask.entry(n as usize).or_default();
        ids.push(inbound);
        ids.extend(reply);
    }
    Ok(by_ask)
}

/// [`topics`] for each of `asked`, by its index (in each, the most frequent first).
async fn topics_all(
    db: &PgPool,
    asked: &[TopicsAsk],
) -> Result<HashMap<usize, Vec<Topic>>, sqlx::Error> {
    let mut people = Vec::with_capacity(asked.len());
    let mut identities = Vec::with_capacity(asked.len());
    let mut days = Vec::with_capacity(asked.len());
    for (p, i, d) in asked {
        people.push(p.as_str());
        identities.push(i.as_str());
        days.push(*d as f64);
    }
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT a.n - 1, x.label, x.count
           FROM unnest($1::text[], $2::text[], $3::float8[])
                WITH ORDINALITY AS a(person_id, identity, days, n)
           CROSS JOIN LATERAL (
             SELECT label, count(*) AS count FROM switchboard.exchange_categories
              WHERE person_id = a.person_id AND agent_identity = a.identity
                AND created_at >= now() - a.days * interval '1 day'
              GROUP BY label ORDER BY count(*) DESC, label LIMIT $4) x
          ORDER BY a.n, x.count DESC, x.label",
    )
    .bind(&people)
    .bind(&identities)
    .bind(&days)
    .bind(MAX_TOPICS)
    .persistent(false)
    .fetch_all(db)
    .await?;
    let mut by_ask: HashMap<usize, Vec<Topic>> = HashMap::new();
    for (n, label, count) in rows {
        by_ask
            .entry(n as usize)
            .or_default()
            .push(Topic { label, count });
    }
    Ok(by_ask)
}

/// The plan of the ranking statement [`recall`] runs for `req` ([`crate::search::explain`]).
pub async fn explain(
    db: &PgPool,
    embedder: Result<&dyn Embedder, &EmbedError>,
    model: &str,
    config: &RecallConfig,
    req: &RecallRequest<'_>,
) -> Result<Option<String>, SearchError> {
    match recall_query(db, None, config, req).await? {
        Some(query) => Ok(Some(
            crate::search::explain(db, embedder, model, &query).await?,
        )),
        None => Ok(None),
    }
}

fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((end, _)) => format!("{} […]", &text[..end]),
    }
}

impl Recall {
    /// The recall block's body for the prompt (the prompt builder fences it), at most
    /// `max_chars` characters: whole lines only, the most relevant first, and a line saying
    /// what was left out. `None` when there is nothing to say at all.
    pub fn render(&self, max_chars: usize) -> Option<String> {
        let mut lines = Vec::new();
        for h in &self.hits {
            let who = if h.direction == "inbound" {
                "they wrote"
            } else {
                "you answered"
            };
            lines.push(format!(
                "- {} via {} ({}), {who}: {}",
                at(h.at),
                h.channel,
                h.agent,
                cut(&h.text.replace('\n', " "), MAX_HIT_CHARS)
            ));
        }
        if !self.topics.is_empty() {
            let topics: Vec<String> = self
                .topics
                .iter()
                .map(|t| {
                    format!(
                        "{} ({} time{})",
                        t.label,
                        t.count,
                        if t.count == 1 { "" } else { "s" }
                    )
                })
                .collect();
            lines.push(format!(
                "Their topics over the last {} days: {}.",
                self.topic_days,
                topics.join(", ")
            ));
        }
        let mut notes = Vec::new();
        if self.index_lag.messages_waiting > 0 {
            notes.push(format!(
                "the index is behind by {} message{} (oldest {:.0} s): the latest may be missing",
                self.index_lag.messages_waiting,
                if self.index_lag.messages_waiting == 1 {
                    ""
                } else {
                    "s"
                },
                self.index_lag.seconds
            ));
        }
        if let Some(e) = &self.vector_error {
            notes.push(format!("found by words only ({e})"));
        }
        if lines.is_empty() && notes.is_empty() {
            return None;
        }
        let mut out = String::new();
        let mut left_out = 0;
        for line in &lines {
            if out.chars().count() + line.chars().count() + 1 > max_chars {
                left_out += 1;
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        if left_out > 0 {
            notes.push(format!(
                "{left_out} more line{} left out (recall is capped at {max_chars} characters)",
                if left_out == 1 { "" } else { "s" }
            ));
        }
        if lines.is_empty() || left_out == lines.len() {
            out.push_str("(nothing relevant recalled)\n");
        }
        for n in notes {
            out.push_str(&format!("Note: {n}.\n"));
        }
        Some(out)
    }

    /// The journal entry's detail: which messages, with which scores, how far behind the
    /// index was.
    pub fn journal_detail(&self) -> serde_json::Value {
        serde_json::json!({
            "messages": self.hits.iter().map(|h| serde_json::json!({
                "message_id": h.message_id,
                "score": h.score,
                "by_meaning": h.by_meaning,
                "by_words": h.by_words,
            })).collect::<Vec<_>>(),
            "topics": self.topics.iter().map(|t| serde_json::json!({
                "label": t.label,
                "count": t.count,
            })).collect::<Vec<_>>(),
            "model": self.model,
            "index_lag_s": self.index_lag.seconds,
            "messages_waiting": self.index_lag.messages_waiting,
            "vector_error": self.vector_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(text: &str, direction: &str) -> SearchHit {
        SearchHit {
            message_id: Uuid::now_v7(),
            text: text.into(),
            direction: direction.into(),
            session_id: Uuid::now_v7(),
            person_id: "phone:+1".into(),
            agent: "reggie_oc".into(),
            agent_identity: "reggie".into(),
            channel: "sms".into(),
            at: DateTime::from_timestamp(1_790_000_000, 0).unwrap(),
            category: None,
            score: 0.03,
            by_meaning: true,
            by_words: false,
        }
    }

    #[test]
    fn only_a_query_of_one_messages_whole_text_is_that_messages_vector() {
        let id = Uuid::now_v7();
        let own = |text: &str, message: Option<&str>| {
            own_message(&RecallRequest {
                person_id: "p",
                agent_identity: "reggie",
                text,
                held_by: None,
                answering: vec![id],
                message: message.map(|m| (id, m)),
            })
        };
        assert_eq!(own("when do I work\n", Some("when do I work")), Some(id));
        assert_eq!(
            own("  when do I work \n", Some("  when do I work ")),
            None,
            "trimmed"
        );
        assert_eq!(own("one\ntwo\n", Some("one")), None, "joined");
        assert_eq!(own("x\n", None), None, "several messages");
        assert_eq!(own("\n", Some("")), None, "empty");
        let long = "a".repeat(MAX_QUERY_CHARS + 1);
        assert_eq!(own(&long, Some(&long)), None, "cut");
    }

    fn recall(hits: Vec<SearchHit>, waiting: i64) -> Recall {
        Recall {
            hits,
            topics: vec![Topic {
                label: "roster_query".into(),
                count: 3,
            }],
            topic_days: 7,
            model: "m".into(),
            index_lag: IndexLag {
                seconds: 12.0,
                messages_waiting: waiting,
            },
            vector_error: None,
            message_vector: None,
        }
    }

    #[test]
    fn the_block_names_who_said_what_when_and_the_topics() {
        let r = recall(
            vec![
                hit("my Friday shift", "inbound"),
                hit("Friday 9-5", "outbound"),
            ],
            0,
        );
        let text = r.render(2_000).unwrap();
        assert!(text.contains("they wrote: my Friday shift"), "{text}");
        assert!(text.contains("you answered: Friday 9-5"), "{text}");
        assert!(text.contains("roster_query (3 times)"), "{text}");
        assert!(!text.contains("behind"), "{text}");
    }

    #[test]
    fn a_lagging_index_is_said_and_a_capped_block_says_what_it_left_out() {
        let long = "x".repeat(300);
        let r = recall(vec![hit(&long, "inbound"), hit(&long, "inbound")], 4);
        let text = r.render(400).unwrap();
        assert!(text.contains("behind by 4 messages"), "{text}");
        // The second message and the topics line did not fit.
        assert!(text.contains("2 more lines left out"), "{text}");
        assert_eq!(text.matches("they wrote").count(), 1, "{text}");
    }

    #[test]
    fn nothing_to_recall_and_an_index_in_step_is_no_block() {
        let mut r = recall(Vec::new(), 0);
        r.topics.clear();
        assert_eq!(r.render(2_000), None);
    }
}
