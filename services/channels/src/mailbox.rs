//! Replies for channels whose far end is a client of ours (chat sockets, API callers) rather
//! than a provider's API.
//!
//! Sending is writing the reply into `switchboard.mailbox` (once: a part written twice is the
//! same row) and announcing it on `{p}.mailbox.<channel>` with core NATS. Every gateway replica
//! listens there and hands the entry to the sockets or waiting requests it holds for that
//! address; the table is what makes it durable: a client that was away reads what it missed.
//! The announcement may be lost (no gateway listening, a reconnect): nothing depends on it but
//! speed.
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use switchboard_kit::exports::ExportLink;
use uuid::Uuid;

use crate::egress::{Egress, OutboundPart, SendError};

/// One reply (part) in a mailbox, as stored, announced and pushed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxEntry {
    /// Ascending per database: a client that saw entry `seq` asks for what came after it.
    pub seq: i64,
    pub reply_id: Uuid,
    pub part: i32,
    pub channel: String,
    /// The sender address the reply goes back to (chat: the token's `sub`; API: the key owner).
    pub address: String,
    pub agent: String,
    pub correlation_id: String,
    /// The client's own id of the message answered.
    pub in_reply_to: String,
    pub text: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// `reply` (the turn's answer) or `notice` (told while the turn waits).
    #[serde(default = "reply_kind")]
    pub kind: String,
    /// The files the agent left for the person (name, type, size, a signed expiring link).
    #[serde(default, skip_serializing_if = "no_attachments")]
    pub attachments: Attachments,
}

/// The `attachments` column (serialised as the list itself).
pub type Attachments = sqlx::types::Json<Vec<ExportLink>>;

fn no_attachments(a: &Attachments) -> bool {
    a.0.is_empty()
}

fn reply_kind() -> String {
    "reply".into()
}

impl MailboxEntry {
    /// Something Switchboard told the person while their turn waited, not the answer.
    pub fn is_notice(&self) -> bool {
        self.kind == "notice"
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    #[error("mailbox: {0}")]
    Database(#[from] sqlx::Error),
}

/// The mailbox table and its announcement subject.
#[derive(Clone)]
pub struct Mailbox {
    db: PgPool,
    nats: async_nats::Client,
    /// `{p}.mailbox`; entries are announced on `{p}.mailbox.<channel>`.
    subject: String,
}

impl Mailbox {
    pub fn new(db: PgPool, nats: async_nats::Client, subject: String) -> Self {
        Self { db, nats, subject }
    }

    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    /// The subject every entry is announced under (`{p}.mailbox.>`), for gateways to follow.
    pub fn announcements(&self) -> String {
        format!("{}.>", self.subject)
    }

    /// Store a part (idempotent) and announce it. A redelivered reply finds its row and
    /// announces it again: sockets skip what they already pushed.
    pub async fn put(
        &self,
        part: &OutboundPart<'_>,
        in_reply_to: &str,
    ) -> Result<MailboxEntry, MailboxError> {
        let reply = part.reply;
        let reply_id: Uuid = reply.id.parse().unwrap_or_default();
        let session: Option<Uuid> = reply.session_id.parse().ok();
        // `seq` is drawn when the row is inserted, not when it commits: two writers for one
        // address could commit seq n+1 before n, and a client that saw n+1 (and resumes with
        // `since` = n+1) would never be sent n. Writes for one address take turns, so each
        // commits before the next draws its `seq`: for every address, what a reader sees is all
        // of its entries up to some `seq`.
        let mut tx = self.db.begin().await?;
        sqlx::query!(
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
            reply.channel,
            part.to(),
        )
        .execute(&mut *tx)
        .await?;
        let kind = if reply.kind == "notice" {
            "notice"
        } else {
            "reply"
        };
        // The entry's columns are named for the first SELECT of the union; none is NULL.
        let entry = sqlx::query_as!(
            MailboxEntry,
            r#"WITH new AS (
                INSERT INTO switchboard.mailbox
                    (reply_id, part, channel, address, agent, session_id, correlation_id,
                     in_reply_to, text, kind, attachments)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                ON CONFLICT (reply_id, part) DO NOTHING
                RETURNING seq, reply_id, part, channel, address, agent, correlation_id,
                          in_reply_to, text, created_at, kind, attachments)
             SELECT seq AS "seq!", reply_id AS "reply_id!", part AS "part!",
                    channel AS "channel!", address AS "address!", agent AS "agent!",
                    correlation_id AS "correlation_id!", in_reply_to AS "in_reply_to!",
                    text AS "text!", created_at AS "created_at!", kind AS "kind!",
                    attachments AS "attachments!: Attachments"
               FROM new
             UNION ALL
             SELECT seq, reply_id, part, channel, address, agent, correlation_id, in_reply_to,
                    text, created_at, kind, attachments
               FROM switchboard.mailbox WHERE reply_id = $1 AND part = $2
             LIMIT 1"#,
            reply_id,
            part.index as i32,
            reply.channel,
            part.to(),
            reply.agent_name,
            session,
            reply.correlation_id,
            in_reply_to,
            part.text,
            kind,
            sqlx::types::Json(part.attachments) as _,
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let subject = format!("{}.{}", self.subject, entry.channel);
        match serde_json::to_vec(&entry) {
            Ok(body) => {
                if let Err(e) = self.nats.publish(subject, body.into()).await {
                    // Stored is delivered: clients read the table when the push does not come.
                    tracing::warn!(error = %e, seq = entry.seq, "announcing a mailbox entry failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "mailbox entry as JSON"),
        }
        Ok(entry)
    }

    /// Entries for `address` on `channel` after `seq`, oldest first, at most `limit`. As
    /// [`Mailbox::put`] commits one address's entries in `seq` order, these are all of them
    /// after `seq` so far: once one is seen, none before it can still appear.
    pub async fn after(
        &self,
        channel: &str,
        address: &str,
        seq: i64,
        limit: i64,
    ) -> Result<Vec<MailboxEntry>, MailboxError> {
        Ok(sqlx::query_as!(
            MailboxEntry,
            r#"SELECT seq, reply_id, part, channel, address, agent, correlation_id, in_reply_to,
                    text, created_at, kind, attachments AS "attachments!: Attachments"
               FROM switchboard.mailbox
              WHERE channel = $1 AND address = $2 AND seq > $3
              ORDER BY seq LIMIT $4"#,
            channel,
            address,
            seq,
            limit,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The `seq` of the newest entry for `address` on `channel` (0 if none).
    pub async fn newest(&self, channel: &str, address: &str) -> Result<i64, MailboxError> {
        Ok(sqlx::query_scalar!(
            "SELECT max(seq) FROM switchboard.mailbox WHERE channel = $1 AND address = $2",
            channel,
            address,
        )
        .fetch_one(&self.db)
        .await?
        .unwrap_or(0))
    }

    /// Entries for `address` on `channel` up to `seq` that no socket was handed yet, oldest
    /// first, at most `limit`.
    pub async fn not_pushed(
        &self,
        channel: &str,
        address: &str,
        seq: i64,
        limit: i64,
    ) -> Result<Vec<MailboxEntry>, MailboxError> {
        Ok(sqlx::query_as!(
            MailboxEntry,
            r#"SELECT seq, reply_id, part, channel, address, agent, correlation_id, in_reply_to,
                    text, created_at, kind, attachments AS "attachments!: Attachments"
               FROM switchboard.mailbox
              WHERE channel = $1 AND address = $2 AND seq <= $3 AND pushed_at IS NULL
              ORDER BY seq LIMIT $4"#,
            channel,
            address,
            seq,
            limit,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The replies to one accepted message, in order.
    pub async fn for_correlation(
        &self,
        correlation_id: &str,
    ) -> Result<Vec<MailboxEntry>, MailboxError> {
        Ok(sqlx::query_as!(
            MailboxEntry,
            r#"SELECT seq, reply_id, part, channel, address, agent, correlation_id, in_reply_to,
                    text, created_at, kind, attachments AS "attachments!: Attachments"
               FROM switchboard.mailbox WHERE correlation_id = $1
              ORDER BY seq"#,
            correlation_id,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The parts of one reply, in order.
    pub async fn for_reply(&self, reply_id: Uuid) -> Result<Vec<MailboxEntry>, MailboxError> {
        Ok(sqlx::query_as!(
            MailboxEntry,
            r#"SELECT seq, reply_id, part, channel, address, agent, correlation_id, in_reply_to,
                    text, created_at, kind, attachments AS "attachments!: Attachments"
               FROM switchboard.mailbox WHERE reply_id = $1 ORDER BY seq"#,
            reply_id,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The entry a reply's part was stored as, if it was.
    pub async fn find(&self, reply_id: Uuid, part: i32) -> Result<Option<i64>, MailboxError> {
        Ok(sqlx::query_scalar!(
            "SELECT seq FROM switchboard.mailbox WHERE reply_id = $1 AND part = $2",
            reply_id,
            part,
        )
        .fetch_optional(&self.db)
        .await?)
    }

    /// Note that an entry reached a socket (first time only), so a client connecting later
    /// without saying what it saw is not sent it again.
    /// One statement for all the entries a socket was just handed.
    pub async fn mark_pushed(&self, seqs: &[i64]) -> Result<(), MailboxError> {
        if seqs.is_empty() {
            return Ok(());
        }
        sqlx::query!(
            "UPDATE switchboard.mailbox SET pushed_at = now()
              WHERE seq = ANY($1) AND pushed_at IS NULL",
            seqs,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }
}

/// The egress of chat and API replies: the whole reply is one part, put in the mailbox.
pub struct MailboxEgress(pub Mailbox);

/// [`Egress::lease`] of the mailbox: a write is one statement on a pool that gives up
/// acquiring a connection after 10 s, and one taken over early is harmless (an entry is written
/// once per reply and part). So a chat or API reply whose deliverer died waits 10 s, not the
/// 45 s a provider's send needs.
pub const MAILBOX_LEASE: std::time::Duration = std::time::Duration::from_secs(10);
const _: () = assert!(MAILBOX_LEASE.as_secs() < crate::SEND_LEASE.as_secs());

impl Egress for MailboxEgress {
    fn split(&self, text: &str) -> Vec<String> {
        crate::egress::whole_message(text)
    }

    /// The entry lists them (chat frames and API answers carry the list).
    fn attachments(&self) -> crate::egress::AttachmentStyle {
        crate::egress::AttachmentStyle::Listed
    }

    fn lease(&self) -> std::time::Duration {
        MAILBOX_LEASE
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            let in_reply_to = crate::ingress::client_id(part.to(), &part.reply.provider_message_id);
            let entry = self
                .0
                .put(&part, in_reply_to)
                .await
                .map_err(|e| SendError::Unavailable(e.to_string()))?;
            Ok(format!("mailbox:{}", entry.seq))
        }
        .boxed()
    }

    /// The mailbox is its own log: a part is there or it is not (and storing it again would
    /// find the same row anyway).
    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        _since: chrono::DateTime<chrono::Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        async move {
            let reply_id: Uuid = part.reply.id.parse().unwrap_or_default();
            let found = self
                .0
                .find(reply_id, part.index as i32)
                .await
                .map_err(|e| SendError::Unavailable(e.to_string()))?;
            Ok(found
                .map(|seq| format!("mailbox:{seq}"))
                .into_iter()
                .collect())
        }
        .boxed()
    }
}
