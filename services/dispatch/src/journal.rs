//! A session's journal (`switchboard.session_events`): each entry is written in the
//! transaction of the change it records, and its key makes it once-only.
use switchboard_kit::status::SessionEventKind;
use uuid::Uuid;

pub(crate) struct Journal {
    pub session: Uuid,
    pub key: String,
    pub kind: SessionEventKind,
    pub seq: i64,
    pub detail: serde_json::Value,
}

impl Journal {
    /// The entry of `kind` about turn `seq`, once per `key`.
    pub fn new(
        session: Uuid,
        key: String,
        kind: SessionEventKind,
        seq: i64,
        detail: serde_json::Value,
    ) -> Self {
        Self {
            session,
            key,
            kind,
            seq,
            detail,
        }
    }

    /// Write `entries` in `tx`, in one statement; an entry whose key is there already is
    /// left as it was. How many were new.
    pub async fn write(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        entries: &[Journal],
    ) -> Result<u64, sqlx::Error> {
        let ids: Vec<Uuid> = entries.iter().map(|_| Uuid::now_v7()).collect();
        let sessions: Vec<Uuid> = entries.iter().map(|e| e.session).collect();
        let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
        let kinds: Vec<SessionEventKind> = entries.iter().map(|e| e.kind).collect();
        let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
        let details: Vec<&serde_json::Value> = entries.iter().map(|e| &e.detail).collect();
        let written = sqlx::query!(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::bigint[],
                                  $6::jsonb[])
             ON CONFLICT (key) DO NOTHING",
            &ids,
            &sessions,
            keys as Vec<&str>,
            kinds as Vec<SessionEventKind>,
            &seqs,
            details as Vec<&serde_json::Value>,
        )
        .execute(&mut **tx)
        .await?
        .rows_affected();
        Ok(written)
    }
}
