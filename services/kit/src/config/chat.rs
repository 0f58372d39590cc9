//! `[chat]`: the chat WebSocket and its uploads.
use serde::{Deserialize, Serialize};

use super::Secret;

/// The chat WebSocket (`GET /ws/chat`): who may connect is said by a JWT the operator's own
/// login issues.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ChatConfig {
    /// HS256 shared secret. Exactly one of this and `jwt_public_key` is set to enable chat.
    pub jwt_secret: Secret,
    /// Path to an RS256 public key (PEM).
    pub jwt_public_key: String,
    /// When set, tokens must carry this `iss`.
    pub jwt_issuer: String,
    /// When set, tokens must carry this `aud`.
    pub jwt_audience: String,
    /// Replies a reconnecting client is sent at most, oldest first.
    pub replay_limit: i64,
    /// A socket that has not been heard from (messages or pongs) within this time is closed.
    pub idle_timeout_ms: u64,
    /// How often a socket reads the mailbox itself, for replies whose announcement it missed.
    pub catch_up_ms: u64,
    /// Uploads (`POST /chat/uploads`) are kept this long for a message to name them; older
    /// ones are deleted (a turn that runs later says the file is gone).
    pub upload_retention_s: u64,
    /// Most uploads one message may name.
    pub max_uploads_per_message: usize,
    /// Most bytes of uploads one person may have stored at once (within the retention).
    pub upload_quota_bytes: u64,
    /// Most sockets one user (a token's `sub`) may hold open on a gateway replica at once; one
    /// more is refused with 429. Each socket also holds one of `gateway.max_connections`.
    pub max_sockets_per_user: usize,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            jwt_secret: Secret::default(),
            jwt_public_key: String::new(),
            jwt_issuer: String::new(),
            jwt_audience: String::new(),
            replay_limit: 200,
            idle_timeout_ms: 120_000,
            catch_up_ms: 5_000,
            upload_retention_s: 86_400,
            max_uploads_per_message: 10,
            upload_quota_bytes: 100 * 1024 * 1024,
            max_sockets_per_user: 8,
        }
    }
}
