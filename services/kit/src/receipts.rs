//! Delivery receipts: what a provider reports, after it took a part of a reply, about what
//! became of it (WhatsApp's statuses, Twilio's status callbacks). The gateway stores them as
//! they come (`switchboard.delivery_receipts`), by the provider's message id, the id the
//! delivery ledger lists for the part; a reply's outcome reads them back
//! ([`ReceiptStore::outcome`]). A report may come before the ledger records the part's id, so
//! nothing joins them on the way in.
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// What a provider says became of a message, in the order it can happen.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, sqlx::Type, serde::Serialize,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum ReceiptStatus {
    /// Handed on by the provider (to the carrier, to WhatsApp's servers).
    Sent,
    /// On the person's device.
    Delivered,
    /// Read by the person (WhatsApp, with read receipts on).
    Read,
    /// Not delivered after all: the provider says why.
    Failed,
}

impl ReceiptStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptStatus::Sent => "sent",
            ReceiptStatus::Delivered => "delivered",
            ReceiptStatus::Read => "read",
            ReceiptStatus::Failed => "failed",
        }
    }
}

/// One report of a provider about one message it took from us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The provider's id of the message (a Twilio sid, a `wamid`), as its send answered it.
    pub provider_message_id: String,
    pub status: ReceiptStatus,
    /// Why it failed, as the provider says it (empty unless failed).
    pub error: String,
    /// When the provider says it happened (when it reported it, if it does not say).
    pub reported_at: DateTime<Utc>,
}

/// The longest provider message id kept (Twilio's are 34 characters, a `wamid` about 60).
pub const MAX_RECEIPT_ID_CHARS: usize = 256;

/// What the reports about a reply's parts say, taken together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptOutcome {
    /// No report yet.
    Unreported,
    /// The least far any part has gone (every part has been delivered: `Delivered`).
    Reached(ReceiptStatus),
    /// A part failed after the provider took it: the provider's reason.
    Failed(String),
}

/// The `delivery_receipts` table.
#[derive(Clone)]
pub struct ReceiptStore {
    db: PgPool,
}

impl ReceiptStore {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }

    /// Keep `receipts` of `provider`; a report already kept is kept once.
    pub async fn record(&self, provider: &str, receipts: &[Receipt]) -> Result<(), sqlx::Error> {
        if receipts.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = receipts
            .iter()
            .map(|r| r.provider_message_id.as_str())
            .collect();
        let statuses: Vec<&str> = receipts.iter().map(|r| r.status.as_str()).collect();
        let errors: Vec<Option<&str>> = receipts
            .iter()
            .map(|r| Some(r.error.as_str()).filter(|e| !e.is_empty()))
            .collect();
        let at: Vec<DateTime<Utc>> = receipts.iter().map(|r| r.reported_at).collect();
        sqlx::query(
            "INSERT INTO switchboard.delivery_receipts
                    (provider, provider_message_id, status, error, reported_at)
             SELECT $1, id, status, error, at
               FROM UNNEST($2::text[], $3::text[], $4::text[], $5::timestamptz[])
                    AS r(id, status, error, at)
             ON CONFLICT (provider, provider_message_id, status) DO NOTHING",
        )
        .bind(provider)
        .bind(&ids)
        .bind(&statuses)
        .bind(&errors)
        .bind(&at)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// What `provider` reported about the parts `ids` of one reply.
    pub async fn outcome(
        &self,
        provider: &str,
        ids: &[String],
    ) -> Result<ReceiptOutcome, sqlx::Error> {
        if ids.is_empty() {
            return Ok(ReceiptOutcome::Unreported);
        }
        let rows: Vec<(String, ReceiptStatus, Option<String>)> = sqlx::query_as(
            "SELECT provider_message_id, status, error FROM switchboard.delivery_receipts
              WHERE provider = $1 AND provider_message_id = ANY($2)",
        )
        .bind(provider)
        .bind(ids)
        .fetch_all(&self.db)
        .await?;
        Ok(outcome_of(ids, &rows))
    }
}

/// [`ReceiptStore::outcome`] of the reports `rows` (id, status, error) about the parts `ids`.
pub fn outcome_of(
    ids: &[String],
    rows: &[(String, ReceiptStatus, Option<String>)],
) -> ReceiptOutcome {
    if let Some((id, _, error)) = rows.iter().find(|(_, s, _)| *s == ReceiptStatus::Failed) {
        let part = ids.iter().position(|i| i == id).map_or(0, |p| p + 1);
        let why = error.as_deref().unwrap_or("no reason given");
        return ReceiptOutcome::Failed(if ids.len() > 1 {
            format!("part {part} of {} was not delivered: {why}", ids.len())
        } else {
            format!("not delivered: {why}")
        });
    }
    // How far each part has gone; the reply as far as its least part.
    let furthest = |id: &String| {
        rows.iter()
            .filter(|(i, _, _)| i == id)
            .map(|(_, s, _)| *s)
            .max()
    };
    let mut least: Option<ReceiptStatus> = None;
    for id in ids {
        let Some(status) = furthest(id) else {
            // A part nobody reported on yet (the rows are this reply's): no further than sent.
            return if rows.is_empty() {
                ReceiptOutcome::Unreported
            } else {
                ReceiptOutcome::Reached(ReceiptStatus::Sent)
            };
        };
        least = Some(least.map_or(status, |l| l.min(status)));
    }
    least.map_or(ReceiptOutcome::Unreported, ReceiptOutcome::Reached)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("SM{i}")).collect()
    }

    fn row(
        id: &str,
        status: ReceiptStatus,
        error: Option<&str>,
    ) -> (String, ReceiptStatus, Option<String>) {
        (id.into(), status, error.map(str::to_string))
    }

    #[test]
    fn a_reply_has_gone_as_far_as_its_least_part() {
        use ReceiptStatus::*;
        assert_eq!(outcome_of(&ids(2), &[]), ReceiptOutcome::Unreported);
        let rows = [
            row("SM1", Sent, None),
            row("SM1", Read, None),
            row("SM2", Delivered, None),
        ];
        assert_eq!(
            outcome_of(&ids(2), &rows),
            ReceiptOutcome::Reached(Delivered)
        );
        // A part nobody reported on yet holds the reply at "sent".
        let rows = [row("SM1", Read, None)];
        assert_eq!(outcome_of(&ids(2), &rows), ReceiptOutcome::Reached(Sent));
    }

    #[test]
    fn a_failed_part_fails_the_reply_with_the_providers_reason_and_which_part() {
        use ReceiptStatus::*;
        let rows = [
            row("SM1", Delivered, None),
            row("SM2", Sent, None),
            row(
                "SM2",
                Failed,
                Some("(30003) Unreachable destination handset"),
            ),
        ];
        assert_eq!(
            outcome_of(&ids(2), &rows),
            ReceiptOutcome::Failed(
                "part 2 of 2 was not delivered: (30003) Unreachable destination handset".into()
            )
        );
        let rows = [row("SM1", Failed, None)];
        assert_eq!(
            outcome_of(&ids(1), &rows),
            ReceiptOutcome::Failed("not delivered: no reason given".into())
        );
    }
}
