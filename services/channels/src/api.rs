//! The REST API channel: `POST /api/v1/messages` with an API key, replies by waiting or polling
//! (through the mailbox). This module holds the key store and the request body; the gateway
//! serves the routes.
use base64::Engine;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::ApiError;
use crate::ingress::{check_client_id, message_text};

/// The provider name API messages and their replies carry.
pub const PROVIDER: &str = "api";
/// The logical channel of API messages.
pub const CHANNEL: &str = "api";

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Send messages (`POST /api/v1/messages`) and read their replies.
    MessagesWrite,
    /// Read replies by correlation id only.
    MessagesRead,
    /// Read identity links and their audit trail.
    IdentityRead,
    /// Link, unlink and merge person ids (and read them).
    IdentityWrite,
    /// Send messages an agent starts to people (`POST /api/v1/outbound`).
    OutboundWrite,
    /// Read sessions, their conversations, journals and exports (`GET /api/v1/sessions…`).
    SessionsRead,
    /// Ask for a session's reset (`POST /api/v1/sessions/<id>/reset`); reads need
    /// `sessions:read` as well.
    SessionsWrite,
    /// Search every person's messages by meaning and words (`GET /api/v1/search`).
    SearchRead,
    /// Read category counts (`GET /api/v1/analytics/categories`).
    AnalyticsRead,
    /// Read a person's curated memory (`GET /api/v1/people/<id>/memory`).
    MemoryRead,
    /// Replace a person's curated memory (`PUT /api/v1/people/<id>/memory`).
    MemoryWrite,
    /// Erase everything stored about a person (`DELETE /api/v1/people/<id>`).
    PeopleForget,
    /// See how the product runs: per-stage lag, dead letters, runner outages (the ops
    /// console's status).
    OpsRead,
    /// Replay dead letters (the ops console); reads need `ops:read` as well.
    OpsWrite,
}

impl Scope {
    pub const ALL: [Scope; 14] = [
        Scope::MessagesWrite,
        Scope::MessagesRead,
        Scope::IdentityRead,
        Scope::IdentityWrite,
        Scope::OutboundWrite,
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::SearchRead,
        Scope::AnalyticsRead,
        Scope::MemoryRead,
        Scope::MemoryWrite,
        Scope::PeopleForget,
        Scope::OpsRead,
        Scope::OpsWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::MessagesWrite => "messages:write",
            Scope::MessagesRead => "messages:read",
            Scope::IdentityRead => "identity:read",
            Scope::IdentityWrite => "identity:write",
            Scope::OutboundWrite => "outbound:write",
            Scope::SessionsRead => "sessions:read",
            Scope::SessionsWrite => "sessions:write",
            Scope::SearchRead => "search:read",
            Scope::AnalyticsRead => "analytics:read",
            Scope::MemoryRead => "memory:read",
            Scope::MemoryWrite => "memory:write",
            Scope::PeopleForget => "people:forget",
            Scope::OpsRead => "ops:read",
            Scope::OpsWrite => "ops:write",
        }
    }

    /// Scopes a key gets when none are named. Not the identity scopes (moving whose messages
    /// go where), `outbound:write` (writing to anyone first), the sessions, search, analytics
    /// and memory scopes (every person's conversations) nor `people:forget`: granted only by
    /// name.
    pub const DEFAULT: [Scope; 2] = [Scope::MessagesWrite, Scope::MessagesRead];
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Scope::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown scope {s:?} (known: {})", known.join(", "))
            })
    }
}

/// A key as the store knows it (never the key itself).
#[derive(Debug, Clone, Serialize)]
pub struct ApiKeyInfo {
    pub id: Uuid,
    pub owner: String,
    pub key_prefix: String,
    pub scopes: Vec<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When a request last used the key, to the minute.
    pub last_used_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The caller a valid key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCaller {
    pub key_id: Uuid,
    pub owner: String,
    pub scopes: Vec<String>,
}

impl ApiCaller {
    /// 403 unless the key has `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        self.require_any(&[scope])
    }

    /// 403 unless the key has one of `scopes`.
    pub fn require_any(&self, scopes: &[Scope]) -> Result<(), ApiError> {
        if scopes
            .iter()
            .any(|scope| self.scopes.iter().any(|s| s == scope.as_str()))
        {
            return Ok(());
        }
        let names: Vec<_> = scopes.iter().map(|s| s.as_str()).collect();
        Err(ApiError::forbidden(
            "missing_scope",
            format!("this API key lacks the {} scope", names.join(" or ")),
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("owner must be 1 to 100 letters, digits, '-', '_', '.' or '@'")]
    BadOwner,
    #[error("no API key {0}")]
    NotFound(Uuid),
    #[error("API keys: {0}")]
    Database(#[from] sqlx::Error),
}

/// `sb_` and 43 characters of base64url: 256 random bits.
const KEY_PREFIX: &str = "sb_";

fn hash(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// API keys, stored hashed.
#[derive(Clone)]
pub struct ApiKeys {
    db: PgPool,
}

impl ApiKeys {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }

    /// Make a key for `owner`; the key itself is returned once and stored only as a hash.
    pub async fn create(
        &self,
        owner: &str,
        scopes: &[Scope],
    ) -> Result<(String, ApiKeyInfo), ApiKeyError> {
        let owner_ok = !owner.is_empty()
            && owner.len() <= 100
            && owner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
        if !owner_ok {
            return Err(ApiKeyError::BadOwner);
        }
        let random: [u8; 32] = rand::random();
        let key = format!(
            "{KEY_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
        );
        let mut scopes: Vec<String> = scopes.iter().map(|s| s.as_str().to_string()).collect();
        scopes.sort();
        scopes.dedup();
        let info = sqlx::query_as!(
            ApiKeyInfo,
            "INSERT INTO switchboard.api_keys (id, owner, key_hash, key_prefix, scopes)
             VALUES ($1, $2, $3, $4, $5)
             RETURNING id, owner, key_prefix, scopes, created_at, last_used_at, revoked_at",
            Uuid::now_v7(),
            owner,
            hash(&key),
            &key[..KEY_PREFIX.len() + 6],
            &scopes,
        )
        .fetch_one(&self.db)
        .await?;
        Ok((key, info))
    }

    pub async fn list(&self) -> Result<Vec<ApiKeyInfo>, ApiKeyError> {
        Ok(sqlx::query_as!(
            ApiKeyInfo,
            "SELECT id, owner, key_prefix, scopes, created_at, last_used_at, revoked_at
               FROM switchboard.api_keys ORDER BY created_at",
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// Revoke a key: it stops working at once, on every gateway.
    pub async fn revoke(&self, id: Uuid) -> Result<ApiKeyInfo, ApiKeyError> {
        sqlx::query_as!(
            ApiKeyInfo,
            "UPDATE switchboard.api_keys SET revoked_at = COALESCE(revoked_at, now())
              WHERE id = $1
             RETURNING id, owner, key_prefix, scopes, created_at, last_used_at, revoked_at",
            id,
        )
        .fetch_optional(&self.db)
        .await?
        .ok_or(ApiKeyError::NotFound(id))
    }

    /// The caller a key names: 401 for a missing, unknown or revoked key. The lookup is by the
    /// key's hash, so nothing about a stored key leaks through timing.
    pub async fn authenticate(&self, key: Option<&str>) -> Result<ApiCaller, ApiError> {
        let unauthorized =
            |reason: &str| ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", reason);
        let Some(key) = key.map(str::trim).filter(|k| !k.is_empty()) else {
            return Err(unauthorized(
                "an API key is required: Authorization: Bearer <key>",
            ));
        };
        // `last_used_at` is kept to the minute: a lookup that writes nothing commits without
        // waiting for Postgres's log to reach the disk, and a key's every request would
        // otherwise be a flushed commit before its message is even stored.
        let row = sqlx::query!(
            r#"WITH k AS (SELECT id, owner, scopes, last_used_at FROM switchboard.api_keys
                         WHERE key_hash = $1 AND revoked_at IS NULL),
                  touched AS (UPDATE switchboard.api_keys a SET last_used_at = now()
                                FROM k
                               WHERE a.id = k.id AND a.revoked_at IS NULL
                                 AND (k.last_used_at IS NULL
                                      OR k.last_used_at < now() - interval '1 minute'))
             SELECT id AS "id!", owner AS "owner!", scopes AS "scopes!" FROM k"#,
            hash(key),
        )
        .fetch_optional(&self.db)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "API key lookup failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the key could not be checked; retry",
            )
        })?;
        let row = row.ok_or_else(|| unauthorized("the API key is unknown or revoked"))?;
        let (key_id, owner, scopes) = (row.id, row.owner, row.scopes);
        Ok(ApiCaller {
            key_id,
            owner,
            scopes,
        })
    }
}

/// `POST /api/v1/messages`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    #[serde(default)]
    pub agent: String,
    pub text: String,
    /// Hold the request until the reply is there (at most `api.wait_max_ms`).
    #[serde(default)]
    pub wait: bool,
}

/// A checked API message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiMessage {
    pub agent: String,
    pub text: String,
    pub wait: bool,
    /// The caller's `Idempotency-Key`: the same key again is the same message.
    pub idempotency_key: Option<String>,
}

/// Read a request body (JSON) and its `Idempotency-Key` into a message, or say why not.
pub fn read_message(
    body: &[u8],
    idempotency_key: Option<&str>,
    max_chars: usize,
) -> Result<ApiMessage, ApiError> {
    let request: MessageRequest = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("expected JSON {{\"agent\", \"text\", \"wait\"}}: {e}"),
        )
    })?;
    let text = message_text("text", &request.text, max_chars)?;
    Ok(ApiMessage {
        agent: request.agent.trim().to_string(),
        text,
        wait: request.wait,
        idempotency_key: checked_idempotency_key(idempotency_key)?,
    })
}

/// An `Idempotency-Key` header's value, checked like a client message id (the same key again
/// is the same message).
pub fn checked_idempotency_key(value: Option<&str>) -> Result<Option<String>, ApiError> {
    value
        .map(|key| check_client_id("Idempotency-Key", key).map(|()| key.to_string()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_read_and_print_by_their_names() {
        for scope in Scope::ALL {
            assert_eq!(scope.as_str().parse::<Scope>(), Ok(scope));
        }
        // Every person's conversations: never a key's without an operator naming them.
        assert!(!Scope::DEFAULT.contains(&Scope::SessionsRead));
        assert!(!Scope::DEFAULT.contains(&Scope::SessionsWrite));
        assert!(
            "admin"
                .parse::<Scope>()
                .unwrap_err()
                .contains("messages:write")
        );
    }

    #[test]
    fn a_message_body_is_checked_before_anything_is_stored() {
        let ok = read_message(
            br#"{"agent":"reggie_oc","text":"hi","wait":true}"#,
            None,
            10,
        );
        assert_eq!(
            ok.unwrap(),
            ApiMessage {
                agent: "reggie_oc".into(),
                text: "hi".into(),
                wait: true,
                idempotency_key: None
            }
        );
        let code = |body: &[u8], key| read_message(body, key, 10).unwrap_err().code();
        assert_eq!(code(b"{", None), "invalid_body");
        assert_eq!(code(br#"{"text":"hi","colour":1}"#, None), "invalid_body");
        assert_eq!(code(br#"{"text":" "}"#, None), "missing_field");
        assert_eq!(code(br#"{"text":"12345678901"}"#, None), "text_too_long");
        assert_eq!(code(br#"{"text":"hi"}"#, Some("a b")), "invalid_field");
    }

    #[test]
    fn a_caller_without_the_scope_is_refused() {
        let caller = ApiCaller {
            key_id: Uuid::nil(),
            owner: "crm".into(),
            scopes: vec!["messages:read".into()],
        };
        assert!(caller.require(Scope::MessagesRead).is_ok());
        let e = caller.require(Scope::MessagesWrite).unwrap_err();
        assert_eq!(
            (e.status(), e.code()),
            (StatusCode::FORBIDDEN, "missing_scope")
        );
    }
}
