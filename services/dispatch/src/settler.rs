//! The group commit of runner answers: every call that finished while the previous commit was
//! in flight is settled by one statement (cursor compare-and-set, the turns' replies, the
//! journal), one round trip and one commit for all of them.
//!
//! Each answer keeps the one-call guarantees: a session moves only if its cursor is still at
//! the call's `after`, the call still holds its slot, and the turn is not done already; an
//! answer that loses any of these is refused alone (`false`), the others commit. A session
//! twice in one batch (a lapsed lease's call and its successor's) is settled on its own,
//! after; a batch whose statement fails is settled answer by answer, so one bad answer fails
//! only itself ([`answer_group`]; an outage fails them all at once).
use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;
use switchboard_kit::db::answer_group;
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus, TurnStatus};
use uuid::Uuid;

use crate::DispatchError;
use crate::turn_store::Settlement;
use crate::wakers::Wakers;

/// Answers settled by one statement at most (the batch's arrays stay small).
const MAX_BATCH: usize = 128;
/// Group commits in flight at once: one being written while the next gathers.
const LANES: usize = 2;

/// One call's answer, to commit against the lease it holds.
pub(crate) struct Commit {
    pub session: Uuid,
    pub seq: i64,
    /// The cursor value the turn commits against.
    pub after: i64,
    /// The call holding the session's slot.
    pub call: Uuid,
    pub settlement: Settlement,
}

pub(crate) struct Settler {
    group: Coalescer<Commit, Result<bool, DispatchError>>,
}

impl Settler {
    pub fn new(db: PgPool, wakers: Wakers) -> Self {
        let group = Coalescer::new(MAX_BATCH, LANES, move |batch: Vec<Commit>| {
            let (db, wakers) = (db.clone(), wakers.clone());
            async move { settle_batch(&db, &wakers, batch).await }
        });
        Self { group }
    }

    /// Commit `commit`'s answer with whatever else finished meanwhile. False: its session
    /// moved on, another call holds it, or the turn is done already (nothing was written).
    pub async fn commit(&self, commit: Commit) -> Result<bool, DispatchError> {
        self.group.call(commit).await?
    }
}

async fn settle_batch(
    db: &PgPool,
    wakers: &Wakers,
    batch: Vec<Commit>,
) -> Vec<Result<bool, DispatchError>> {
    // A session's first answer in the batch goes in the group; a repeat of it (a lapsed
    // lease's call and its successor's) is settled alone, after.
    let mut sessions = HashSet::new();
    let (firsts, repeats): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| sessions.insert(batch[i].session));
    let group: Vec<&Commit> = firsts.iter().map(|&i| &batch[i]).collect();
    let together = commit_all(db, &group).await.map(|moved| {
        metrics::histogram!("sb_dispatch_settle_batch_size").record(group.len() as f64);
        group.iter().map(|c| moved.contains(&c.session)).collect()
    });
    let mut answers: Vec<Option<Result<bool, DispatchError>>> =
        (0..batch.len()).map(|_| None).collect();
    let grouped = answer_group(&group, together, |k| commit_one(db, group[k])).await;
    for (&i, answer) in firsts.iter().zip(grouped) {
        answers[i] = Some(answer.map_err(DispatchError::from));
    }
    for i in repeats {
        answers[i] = Some(commit_one(db, &batch[i]).await.map_err(DispatchError::from));
    }
    for (commit, answer) in batch.iter().zip(&answers) {
        if matches!(answer, Some(Ok(true))) {
            wakers.wake(commit.session);
        }
    }
    answers
        .into_iter()
        .map(|a| a.expect("every answer settled"))
        .collect()
}

/// Commit one answer on its own; whether its session moved.
async fn commit_one(db: &PgPool, commit: &Commit) -> Result<bool, sqlx::Error> {
    Ok(commit_all(db, &[commit]).await?.contains(&commit.session))
}

/// One journal entry of a commit; a reset's entry carries the engine session it replaced,
/// which only the statement reads.
struct Entry {
    session: Uuid,
    key: String,
    kind: SessionEventKind,
    seq: i64,
    detail: serde_json::Value,
    with_previous: bool,
}

fn entries(c: &Commit) -> Vec<Entry> {
    let (session, seq, s) = (c.session, c.seq, &c.settlement);
    let reply = &s.reply;
    let entry = |key: String, kind, detail, with_previous| Entry {
        session,
        key,
        kind,
        seq,
        detail,
        with_previous,
    };
    // What the call recalled comes before its reply in the story.
    let mut out: Vec<Entry> = s
        .recall
        .iter()
        .map(|r| {
            entry(
                format!("recall:{session}:{seq}"),
                SessionEventKind::Recall,
                r.clone(),
                false,
            )
        })
        .collect();
    out.push(entry(
        format!("reply:{session}:{seq}"),
        SessionEventKind::Reply,
        serde_json::json!({
            "reply_id": reply.reply_id,
            "engine_session_id": reply.engine_session_id,
            "processing_ms": reply.processing_ms,
            "tool_calls_count": reply.tool_calls_count,
            "joined": (s.first..=seq).collect::<Vec<i64>>(),
        }),
        false,
    ));
    if let Some(reason) = reply.reset {
        out.push(entry(
            format!("reset:{session}:{seq}"),
            SessionEventKind::Reset,
            serde_json::json!({ "reason": reason.as_str() }),
            true,
        ));
    }
    out
}

/// Commit `commits` (no session twice) in one statement; the sessions that moved.
async fn commit_all(db: &PgPool, commits: &[&Commit]) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut commits = commits.to_vec();
    // Rows are locked in one order by every group commit: two in flight never deadlock.
    commits.sort_unstable_by_key(|c| c.session);
    let col = |f: fn(&Commit) -> i64| commits.iter().map(|c| f(c)).collect::<Vec<i64>>();
    let sessions: Vec<Uuid> = commits.iter().map(|c| c.session).collect();
    let calls: Vec<Uuid> = commits.iter().map(|c| c.call).collect();
    let reply_ids: Vec<Uuid> = commits
        .iter()
        .map(|c| c.settlement.reply.reply_id)
        .collect();
    let texts: Vec<&str> = commits
        .iter()
        .map(|c| c.settlement.reply.text.as_str())
        .collect();
    let engines: Vec<&str> = commits
        .iter()
        .map(|c| c.settlement.reply.engine_session_id.as_str())
        .collect();
    let nexts: Vec<&str> = commits.iter().map(|c| c.settlement.next.as_str()).collect();
    let resets: Vec<Option<ResetReason>> =
        commits.iter().map(|c| c.settlement.reply.reset).collect();
    let consumed: Vec<bool> = commits
        .iter()
        .map(|c| c.settlement.consumed.is_some())
        .collect();
    let consumed_at: Vec<Option<DateTime<Utc>>> = commits
        .iter()
        .map(|c| c.settlement.consumed.flatten())
        .collect();
    let journal: Vec<Entry> = commits.iter().flat_map(|c| entries(c)).collect();
    let moved: Vec<Uuid> = sqlx::query_scalar(
        r#"WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::uuid[],
                                  $5::bigint[], $6::uuid[], $7::text[], $8::text[],
                                  $9::bigint[], $10::bigint[], $11::text[], $12::text[],
                                  $13::bool[], $14::timestamptz[], $24::jsonb[], $25::jsonb[],
                                  $26::timestamptz[])
               AS i(session_id, seq, after, call, first, reply_id, reply_text, engine,
                    processing_ms, tool_calls, reset, next, consumed, consumed_at,
                    tool_names, exports, briefed_through)),
           -- The answered turns not done yet (a replayed failed turn can be run by two
           -- copies: a done turn keeps its first reply).
           open AS (
             SELECT t.session_id FROM switchboard.turns t
               JOIN input i ON t.session_id = i.session_id AND t.seq = i.seq
              WHERE t.status <> $15
              ORDER BY t.session_id FOR UPDATE OF t),
           -- Only the call holding the session's slot may commit, from the cursor it leased
           -- at: a call whose lease lapsed and was taken over is not committed.
           before AS (
             SELECT s.id, s.engine_session_id FROM switchboard.sessions s
               JOIN input i ON s.id = i.session_id
              WHERE s.last_seq = i.after AND s.running_call = i.call
                AND s.id IN (SELECT session_id FROM open)
              ORDER BY s.id FOR UPDATE OF s),
           moved AS (
             UPDATE switchboard.sessions s
                SET last_seq = i.seq, updated_at = now(), status = $16,
                    engine_session_id = CASE i.next WHEN 'keep' THEN s.engine_session_id
                                                    WHEN 'cleared' THEN NULL ELSE i.engine END,
                    resets = s.resets + (i.reset IS NOT NULL)::int,
                    pending_reset = CASE WHEN i.consumed
                                          AND s.pending_reset_at IS NOT DISTINCT FROM i.consumed_at
                                         THEN NULL ELSE s.pending_reset END,
                    pending_reset_at = CASE WHEN i.consumed
                                             AND s.pending_reset_at IS NOT DISTINCT FROM i.consumed_at
                                            THEN NULL ELSE s.pending_reset_at END,
                    waiting_since = NULL, waiting_notice = NULL,
                    running_call = NULL, running_by = NULL, running_until = NULL
               FROM input i JOIN before b ON b.id = i.session_id
              WHERE s.id = i.session_id
             RETURNING s.id, b.engine_session_id AS previous),
           -- The turns a joined call answered before its last: done, joined into it.
           joined AS (
             UPDATE switchboard.turns t
                SET status = $15, error = NULL, joined_into = i.seq, completed_at = now()
               FROM input i JOIN moved m ON m.id = i.session_id
              WHERE t.session_id = i.session_id AND t.seq >= i.first AND t.seq < i.seq
                AND t.status <> $15),
           stored AS (
             UPDATE switchboard.turns t
                SET status = $15, error = NULL, reply_id = i.reply_id, reply_text = i.reply_text,
                    engine_session_id = i.engine, processing_ms = i.processing_ms,
                    tool_calls_count = i.tool_calls, completed_at = now(), reset = i.reset,
                    tool_names = ARRAY(SELECT jsonb_array_elements_text(i.tool_names)),
                    exports = i.exports
               FROM input i JOIN moved m ON m.id = i.session_id
              WHERE t.session_id = i.session_id AND t.seq = i.seq),
           -- The files the call kept for the person stand with its answer (a call whose
           -- answer is not committed leaves its rows uncommitted: never served).
           sent AS (
             UPDATE switchboard.exports x SET committed = true
               FROM input i JOIN moved m ON m.id = i.session_id
              WHERE x.reply_id = i.reply_id),
           -- The takeovers the call's prompt retold are told (once).
           briefed AS (
             UPDATE switchboard.takeovers t SET briefed_at = now()
               FROM input i JOIN moved m ON m.id = i.session_id
              WHERE i.briefed_through IS NOT NULL AND t.session_id = i.session_id
                AND t.briefed_at IS NULL AND t.ended_at <= i.briefed_through),
           journal AS (
             INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT e.id, e.session_id, e.key, e.kind, e.seq,
                    CASE WHEN e.with_previous
                         THEN e.detail || jsonb_build_object('previous_engine_session_id',
                                                             m.previous)
                         ELSE e.detail END
               FROM unnest($17::uuid[], $18::uuid[], $19::text[], $20::text[], $21::bigint[],
                           $22::jsonb[], $23::bool[])
                    AS e(id, session_id, key, kind, seq, detail, with_previous)
               JOIN moved m ON m.id = e.session_id
             ON CONFLICT (key) DO NOTHING)
         SELECT id FROM moved"#,
    )
    .bind(&sessions)
    .bind(col(|c| c.seq))
    .bind(col(|c| c.after))
    .bind(&calls)
    .bind(col(|c| c.settlement.first))
    .bind(&reply_ids)
    .bind(&texts)
    .bind(&engines)
    .bind(col(|c| c.settlement.reply.processing_ms))
    .bind(col(|c| c.settlement.reply.tool_calls_count))
    .bind(&resets)
    .bind(&nexts)
    .bind(&consumed)
    .bind(&consumed_at)
    .bind(TurnStatus::Done)
    .bind(SessionStatus::Idle)
    .bind(journal.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| e.session).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| e.key.as_str()).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| e.kind).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| e.seq).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| &e.detail).collect::<Vec<_>>())
    .bind(journal.iter().map(|e| e.with_previous).collect::<Vec<_>>())
    .bind(
        commits
            .iter()
            .map(|c| serde_json::json!(c.settlement.reply.tool_names))
            .collect::<Vec<_>>(),
    )
    .bind(
        commits
            .iter()
            .map(|c| {
                let e = &c.settlement.reply.exports;
                (!e.is_empty()).then(|| serde_json::json!(e))
            })
            .collect::<Vec<_>>(),
    )
    .bind(
        commits
            .iter()
            .map(|c| c.settlement.briefed_through)
            .collect::<Vec<_>>(),
    )
    // Planned for each batch's own arrays (a plan cached while `turns` was nearly empty
    // would scan every turn for good).
    .persistent(false)
    .fetch_all(db)
    .await?;
    Ok(moved.into_iter().collect())
}
