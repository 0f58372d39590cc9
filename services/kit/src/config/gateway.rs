//! The gateway process: `[gateway]` (its HTTP front), `[api]` (the REST API it serves) and
//! `[rate_limit]` (per sender, across its replicas).
use serde::{Deserialize, Serialize};

use super::Secret;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct GatewayConfig {
    pub http_addr: String,
    /// The base URL providers call (scheme, host, optional path prefix). Twilio signs the full
    /// URL it called, so behind a proxy this must be the public one.
    pub public_url: String,
    pub max_body_bytes: usize,
    /// Longest accepted message text, in characters.
    pub max_text_chars: usize,
    /// A connection that has not sent a whole request head within this time is closed (slow
    /// or stalled clients cannot hold the gateway).
    pub header_timeout_ms: u64,
    /// A request not answered within this time (a body trickling in included) gets 408.
    pub request_timeout_ms: u64,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// Postgres connections of a gateway process (and of `switchboard up`), unless
    /// `runtime.db_pool_size` says otherwise. Accepting a message waits on commits, not on the
    /// CPU, and Postgres flushes the commits waiting together with one write of its log: more
    /// connections take more messages per flush (8 starved when the memory workers' index
    /// writes made each flush slower: the chaos run in the README).
    pub db_pool_size: u32,
    /// Postgres connections reading the mailbox for sockets and waiting API requests, apart
    /// from those accepting messages: thousands of sockets catching up (after a restart, say)
    /// wait for these, never in front of a message being accepted.
    pub mailbox_pool_size: u32,
    /// Signs the turn tokens agents call the API with (`turn_token`). Unset: a key generated
    /// once and kept in Postgres (`switchboard.turn_token_secret`), shared by every replica.
    pub turn_token_secret: Secret,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            http_addr: "127.0.0.1:8080".into(),
            public_url: "http://127.0.0.1:8080".into(),
            max_body_bytes: 64 * 1024,
            max_text_chars: 4096,
            header_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 4_096,
            db_pool_size: 32,
            mailbox_pool_size: 4,
            turn_token_secret: Secret::default(),
        }
    }
}

/// Per-sender rate limit, on every channel, across gateway replicas.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RateLimitConfig {
    /// Messages one sender (one address on one channel) may send in a minute; 0: no limit.
    /// Over it, a message is not answered: SMS senders are told once a minute (`notice`) and the
    /// message is dead-lettered (stage `gateway`, replayable); chat gets an error frame, the
    /// API 429 with `Retry-After`.
    pub per_sender_per_minute: u32,
    /// What an SMS sender over the limit is told, once a minute.
    pub notice: String,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_sender_per_minute: 0,
            notice: "You are sending messages faster than we can answer them. Messages sent in \
                     the next minute will not be answered; please wait a moment."
                .into(),
        }
    }
}

/// The REST API (`/api/v1/…`, API keys made by `switchboard api-keys create`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ApiConfig {
    /// Longest time `POST /api/v1/messages` with `"wait": true` holds the request for the reply
    /// before answering 202 (kept below `gateway.request_timeout_ms`).
    pub wait_max_ms: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            wait_max_ms: 20_000,
        }
    }
}
