//! Curated memory: the `memory.md` of one person + agent identity. The agent writes it through
//! its workspace (read back after each turn), the person adds to it with `/remember <text>`,
//! operators read and replace it through `GET`/`PUT /api/v1/people/<id>/memory`. It goes into
//! every prompt of that person + identity above recall, as the memory to prefer.
//!
//! Keyed by person and identity, never by a session scope: a session an agent shares with
//! everyone (`scope = "main"`) never shares anyone's memory. Capped at `[memory] max_chars`:
//! what is over the cap is cut at the end, with a marker saying how much.
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::status::SessionEventKind;
use uuid::Uuid;

/// The marker's start, so readers can tell a cut memory.
pub const CUT_MARKER: &str = "[… memory cut here:";

/// One person + identity's memory.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CuratedMemory {
    pub person_id: String,
    pub agent_identity: String,
    pub body: String,
    /// Advances with every write; the agent's write is a compare-and-set on it.
    pub version: i64,
    /// `agent`, `person` (/remember) or `api:<key owner>`.
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
}

/// What became of the agent's edit of memory.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentWrite {
    /// Stored as the new version.
    Stored { version: i64 },
    /// The file was not changed by the turn.
    Unchanged,
    /// Someone else wrote the memory while the turn ran (a sibling's turn, `/remember`, an
    /// operator): the agent's edit was made on an older version and is not stored over theirs.
    Conflict,
}

/// What `/remember` did with the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remembered {
    Kept,
    /// Kept up to the cap: the end of the line (or of the memory) was not kept, and the
    /// memory carries the cut marker.
    Cut,
    /// The memory was already full (it carries the cut marker): nothing of the line was kept.
    Full,
}

/// Note in the `/remember`'s journal entry what was kept, for a redelivery's answer.
async fn outcome(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    message_id: &str,
    done: Remembered,
) -> Result<(), sqlx::Error> {
    let kept = match done {
        Remembered::Kept => "kept",
        Remembered::Cut => "cut",
        Remembered::Full => "full",
    };
    // The entry's key as `remember` made it: its kind, then the message.
    sqlx::query!(
        "UPDATE switchboard.session_events SET detail = detail || jsonb_build_object('kept', $2::text)
          WHERE key = $3::text || ':remember:' || $1",
        message_id,
        kept,
        SessionEventKind::MemoryWritten as SessionEventKind,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Remembered {
    /// What the person is told instead of "Noted", when not all of it was kept.
    pub fn shortfall(self, max_chars: usize) -> Option<String> {
        match self {
            Remembered::Kept => None,
            Remembered::Cut => Some(format!(
                "Noted, but your memory here is full ({max_chars} characters): the end of it was \
                 not kept. Ask to tidy it up, or an operator can edit it."
            )),
            Remembered::Full => Some(format!(
                "Not kept: your memory here is full ({max_chars} characters). Ask to tidy it up, \
                 or an operator can edit it."
            )),
        }
    }
}

/// `body` within `max` characters: the beginning kept, and a marker line saying how many
/// characters were not kept.
pub fn capped(body: &str, max: usize) -> (String, bool) {
    match body.char_indices().nth(max) {
        None => (body.to_string(), false),
        Some((end, _)) => {
            let over = body[end..].chars().count();
            (
                format!(
                    "{}\n{CUT_MARKER} {over} more characters were not kept (limit {max})]",
                    &body[..end]
                ),
                true,
            )
        }
    }
}

#[derive(Clone)]
pub struct MemoryStore {
    db: PgPool,
    max_chars: usize,
}

impl MemoryStore {
    pub fn new(db: PgPool, max_chars: usize) -> Self {
        Self { db, max_chars }
    }

    /// `[memory] max_chars`: the cap of every write.
    pub fn max_chars(&self) -> usize {
        self.max_chars
    }

    pub async fn get(
        &self,
        person_id: &str,
        agent_identity: &str,
    ) -> Result<Option<CuratedMemory>, sqlx::Error> {
        sqlx::query_as!(
            CuratedMemory,
            "SELECT person_id, agent_identity, body, version, updated_by, updated_at
               FROM switchboard.memories WHERE person_id = $1 AND agent_identity = $2",
            person_id,
            agent_identity,
        )
        .fetch_optional(&self.db)
        .await
    }

    /// Every identity's memory of a person.
    pub async fn of_person(&self, person_id: &str) -> Result<Vec<CuratedMemory>, sqlx::Error> {
        sqlx::query_as!(
            CuratedMemory,
            "SELECT person_id, agent_identity, body, version, updated_by, updated_at
               FROM switchboard.memories WHERE person_id = $1 ORDER BY agent_identity",
            person_id,
        )
        .fetch_all(&self.db)
        .await
    }

    /// Replace the memory (an operator's `PUT`), capped; whether it was cut.
    pub async fn replace(
        &self,
        person_id: &str,
        agent_identity: &str,
        body: &str,
        by: &str,
    ) -> Result<(CuratedMemory, bool), sqlx::Error> {
        let (body, cut) = capped(body, self.max_chars);
        let memory = sqlx::query_as!(
            CuratedMemory,
            "INSERT INTO switchboard.memories (person_id, agent_identity, body, updated_by)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (person_id, agent_identity) DO UPDATE
                SET body = EXCLUDED.body, updated_by = EXCLUDED.updated_by,
                    version = switchboard.memories.version + 1, updated_at = now()
             RETURNING person_id, agent_identity, body, version, updated_by, updated_at",
            person_id,
            agent_identity,
            body,
            by,
        )
        .fetch_one(&self.db)
        .await?;
        Ok((memory, cut))
    }

    /// Add a line the person asked to be remembered (`/remember`), once per message however
    /// often it is redelivered: the journal entry keyed by the message gates the write, in the
    /// same transaction. Capped by the same rule as every other write ([`capped`]).
    pub async fn remember(
        &self,
        session_id: Uuid,
        message_id: &str,
        person_id: &str,
        agent_identity: &str,
        text: &str,
    ) -> Result<Remembered, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let first = sqlx::query_scalar!(
            r#"INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
               VALUES ($1, $2, $4::text || ':remember:' || $3, $4,
                       jsonb_build_object('by', 'person', 'message_id', $3::text))
               ON CONFLICT (key) DO NOTHING
               RETURNING 1 AS "first!""#,
            Uuid::now_v7(),
            session_id,
            message_id,
            SessionEventKind::MemoryWritten as SessionEventKind,
        )
        .fetch_optional(&mut *tx)
        .await?;
        if first.is_none() {
            // Redelivered: what the first delivery did, so the answer is the same.
            let was: Option<String> = sqlx::query_scalar!(
                r#"SELECT detail->>'kept' AS "kept?" FROM switchboard.session_events
                    WHERE key = $2::text || ':remember:' || $1"#,
                message_id,
                SessionEventKind::MemoryWritten as SessionEventKind,
            )
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
            return Ok(match was.as_deref() {
                Some("cut") => Remembered::Cut,
                Some("full") => Remembered::Full,
                _ => Remembered::Kept,
            });
        }
        // Locked: two `/remember`s of one person in two sessions of the identity append both.
        let current = sqlx::query_scalar!(
            "SELECT body FROM switchboard.memories
              WHERE person_id = $1 AND agent_identity = $2 FOR UPDATE",
            person_id,
            agent_identity,
        )
        .fetch_optional(&mut *tx)
        .await?;
        let line = format!("- {}", text.trim());
        let (body, cut) = match current.as_deref() {
            // Already cut: the line would land after the marker; nothing of it would be kept.
            Some(body) if body.contains(CUT_MARKER) => {
                outcome(&mut tx, message_id, Remembered::Full).await?;
                tx.commit().await?;
                return Ok(Remembered::Full);
            }
            Some(body) if !body.is_empty() => capped(&format!("{body}\n{line}"), self.max_chars),
            _ => capped(&line, self.max_chars),
        };
        sqlx::query!(
            "INSERT INTO switchboard.memories (person_id, agent_identity, body, updated_by)
             VALUES ($1, $2, $3, 'person')
             ON CONFLICT (person_id, agent_identity) DO UPDATE
                SET body = EXCLUDED.body, updated_by = 'person',
                    version = switchboard.memories.version + 1, updated_at = now()",
            person_id,
            agent_identity,
            body,
        )
        .execute(&mut *tx)
        .await?;
        let done = if cut {
            Remembered::Cut
        } else {
            Remembered::Kept
        };
        outcome(&mut tx, message_id, done).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// Store what the agent left in memory.md after a turn (`call` names the runner call, so a
    /// retried store writes once), if it changed and nobody wrote the memory since `base`
    /// (the version the turn started from; `None`: there was none).
    pub async fn agent_wrote(
        &self,
        session_id: Uuid,
        call: Uuid,
        person_id: &str,
        agent_identity: &str,
        base: Option<&CuratedMemory>,
        body: &str,
    ) -> Result<AgentWrite, sqlx::Error> {
        let (body, cut) = capped(body, self.max_chars);
        if base.is_some_and(|b| b.body == body) || (base.is_none() && body.trim().is_empty()) {
            return Ok(AgentWrite::Unchanged);
        }
        let mut tx = self.db.begin().await?;
        let version: Option<i64> = match base {
            Some(b) => {
                sqlx::query_scalar!(
                    "UPDATE switchboard.memories
                        SET body = $3, version = version + 1, updated_by = 'agent', updated_at = now()
                      WHERE person_id = $1 AND agent_identity = $2 AND version = $4
                      RETURNING version",
                    person_id,
                    agent_identity,
                    body,
                    b.version,
                )
                .fetch_optional(&mut *tx)
                .await?
            }
            None => {
                sqlx::query_scalar!(
                    "INSERT INTO switchboard.memories (person_id, agent_identity, body, updated_by)
                     VALUES ($1, $2, $3, 'agent')
                     ON CONFLICT (person_id, agent_identity) DO NOTHING
                     RETURNING version",
                    person_id,
                    agent_identity,
                    body,
                )
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let Some(version) = version else {
            metrics::counter!("sb_memory_conflicts_total").increment(1);
            return Ok(AgentWrite::Conflict);
        };
        sqlx::query!(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
             VALUES ($1, $2, $6::text || ':agent:' || $3::uuid::text, $6,
                     jsonb_build_object('by', 'agent', 'version', $4::bigint, 'cut', $5::boolean))
             ON CONFLICT (key) DO NOTHING",
            Uuid::now_v7(),
            session_id,
            call,
            version,
            cut,
            SessionEventKind::MemoryWritten as SessionEventKind,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(AgentWrite::Stored { version })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_over_the_cap_keeps_its_beginning_and_says_how_much_was_cut() {
        assert_eq!(capped("short", 10), ("short".to_string(), false));
        let (body, cut) = capped("abcdefghij", 4);
        assert!(cut);
        assert_eq!(
            body,
            "abcd\n[… memory cut here: 6 more characters were not kept (limit 4)]"
        );
        assert!(body.contains(CUT_MARKER));
    }
}
