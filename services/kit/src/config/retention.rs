//! `[retention]`: how long rows nothing waits for any more are kept ([`crate::retention`]).
//! A value of 0 keeps those rows forever.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RetentionConfig {
    /// How often each identify worker sweeps (every replica does; the sweeps do not collide).
    pub sweep_every_s: u64,
    /// Rows one statement deletes at most: a sweep never holds long locks or a huge
    /// transaction, whatever the backlog.
    pub batch: u32,
    /// API requests (what lets a caller poll `/api/v1/messages/<id>`) once their message has
    /// no open turn.
    pub api_requests_days: u32,
    /// An API request with no turn this long after it was accepted (its message never went in:
    /// refused by the rate limit, or lost) is marked expired. 0: never.
    pub api_pending_expiry_s: u64,
    /// Mailbox entries (chat and API replies) a gateway pushed to a socket.
    pub mailbox_days: u32,
    /// Mailbox entries never pushed (the person was away; API replies are polled): kept
    /// longer so a client that comes back can still catch up.
    pub mailbox_unpushed_days: u32,
    /// Link claims that are settled or expired, and the proof answers of their messages.
    pub link_claims_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            sweep_every_s: 600,
            batch: 1000,
            api_requests_days: 7,
            api_pending_expiry_s: 3600,
            mailbox_days: 7,
            mailbox_unpushed_days: 30,
            link_claims_days: 30,
        }
    }
}
