//! A reset or a switch of engine variant first summarises: when a turn starts a fresh engine
//! session (a reset) or opens the first session of another engine variant of the identity,
//! and the memory key has messages its summary does not cover, the session stage also asks
//! the summary worker for a summary (`{p}.events.summary.due`), so what the old engine session knew
//! reaches the shared summary without waiting for the conversation to go quiet.
use sqlx::PgPool;
use switchboard_kit::proto::{Person, SummaryDue};
use switchboard_kit::{Output, Topology};
use uuid::Uuid;

use crate::OpenedTurn;

/// The summary item `opened` calls for, if any.
pub(crate) async fn summary_due(
    db: &PgPool,
    topology: &Topology,
    opened: &OpenedTurn,
    person: &Person,
    agent_identity: &str,
) -> Result<Option<Output>, sqlx::Error> {
    let (reason, other_sessions_only) = if opened.reset.is_some() {
        ("reset", false)
    } else if opened.seq == 1 {
        // Maybe the first turn of another engine variant: only its siblings' messages count.
        ("engine_switch", true)
    } else {
        return Ok(None);
    };
    // Unsummarised by the mark each summary version sets on what it merged (not by id after
    // the summary's last: a message logged late has an older id). From the key's sessions to
    // each one's newest unsummarised message (its partial index): ordered by message id over
    // the whole log, a key with nothing unsummarised (every new person's first turn) read the
    // log backwards to its start. Planned each time, so a plan cached on an empty log does not
    // read it whole either.
    let newest: Option<(Uuid, i64)> = sqlx::query_as(
        "SELECT k.message_id, coalesce(y.version, 0)
           FROM switchboard.sessions s
           CROSS JOIN LATERAL (
                SELECT k.message_id FROM switchboard.message_marks k
                 WHERE k.session_id = s.id AND k.summary_version IS NULL
                 ORDER BY k.message_id DESC LIMIT 1) k
           LEFT JOIN switchboard.summaries y ON y.memory_key = s.memory_key
          WHERE s.memory_key = $1 AND NOT ($2 AND s.id = $3)
          ORDER BY k.message_id DESC LIMIT 1",
    )
    .bind(&opened.memory_key)
    .bind(other_sessions_only)
    .bind(opened.session_id)
    .persistent(false)
    .fetch_optional(db)
    .await?;
    let Some(newest) = newest else {
        return Ok(None);
    };
    let (newest, version) = newest;
    let due = SummaryDue {
        memory_key: opened.memory_key.clone(),
        person_id: person.person_id.clone(),
        agent_identity: agent_identity.to_string(),
        reason: reason.into(),
    };
    // The summary worker's sweeper names the same item the same way.
    let id = SummaryDue::dedupe_id(&opened.memory_key, &newest, version);
    Ok(Some(Output::new(topology.summary_due(), id, &due)))
}
