//! The states rows move through, as the database stores them (`TEXT` columns with a `CHECK`),
//! so that handlers match on enums instead of comparing strings.

/// A turn (`switchboard.turns.status`): `open` until the dispatcher stores its reply (`done`) or
/// gives up on it (`failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum TurnStatus {
    Open,
    Done,
    Failed,
}

/// A reply in the delivery ledger (`switchboard.deliveries.status`): `pending → sent | failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Sent,
    Failed,
}

impl DeliveryStatus {
    /// Sent or failed for good: nothing more will happen to the reply.
    pub fn is_settled(self) -> bool {
        matches!(self, DeliveryStatus::Sent | DeliveryStatus::Failed)
    }
}
