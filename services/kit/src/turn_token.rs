//! Turn tokens: the short-lived bearer token each runner call carries, so the agent's engine
//! can call Switchboard's API as a tool (search the person's history, read and write their
//! curated memory, send them a follow-up) for that turn's person, identity and session, and
//! for nobody else.
//!
//! Dispatch mints one per runner call (`turn_token` in the `/run` body); the gateway verifies
//! it where it accepts API keys and confines the caller to the token's person + identity.
//!
//! The format: `sbt_` and an HS256 JWT (audience `switchboard:turn`). The prefix tells a turn
//! token from an API key (`sb_…`) without a lookup, and secret scanners can name it. It lives
//! for the agent's `timeout_s` plus [`MARGIN_S`]: long enough for the whole call, short enough
//! that a leaked one is soon worthless.
//!
//! The signing key: `[gateway] turn_token_secret` when set; otherwise 32 random bytes
//! generated once and kept in Postgres (`switchboard.turn_token_secret`), so every gateway and
//! dispatcher replica agrees without configuration, and no key is derived from credentials
//! that are often weak or shared with other tools.
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::OnceCell;

use crate::config::Secret;

/// What a turn token starts with.
pub const PREFIX: &str = "sbt_";
/// Its audience: a chat token signed with the same secret is not a turn token.
const AUDIENCE: &str = "switchboard:turn";
/// How long past the agent's call timeout a token stays valid (the call's own retries, a
/// follow-up sent as the engine finishes).
pub const MARGIN_S: u64 = 120;
/// Clock difference tolerated between the replica that minted a token and the one checking it.
const LEEWAY_S: u64 = 30;

/// The scopes a turn's token carries: the person's history, memory, sessions, and a follow-up
/// to them. Everything else (analytics, forgetting, identity links, other people) is never
/// granted to a turn.
pub const TURN_SCOPES: [&str; 5] = [
    "search:read",
    "memory:read",
    "memory:write",
    "sessions:read",
    "outbound:write",
];

/// Who a turn token speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnClaims {
    /// The turn's person id.
    pub sub: String,
    /// The agent identity (whose memory of the person this is).
    pub identity: String,
    /// The agent (engine variant) the turn ran on: a follow-up comes from it.
    pub agent: String,
    /// The turn's session id.
    pub session: String,
    /// The turn's correlation id.
    pub turn: String,
    pub scopes: Vec<String>,
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
}

impl TurnClaims {
    /// Claims for a turn, valid from now for `timeout_s` (the agent's call timeout) plus
    /// [`MARGIN_S`].
    pub fn for_turn(
        person: &str,
        identity: &str,
        agent: &str,
        session: &str,
        turn: &str,
        timeout_s: u64,
    ) -> Self {
        let now = now_s();
        Self {
            sub: person.to_string(),
            identity: identity.to_string(),
            agent: agent.to_string(),
            session: session.to_string(),
            turn: turn.to_string(),
            scopes: TURN_SCOPES.iter().map(|s| s.to_string()).collect(),
            aud: AUDIENCE.to_string(),
            iat: now,
            exp: now + timeout_s.max(1) + MARGIN_S,
        }
    }

    /// The person id.
    pub fn person(&self) -> &str {
        &self.sub
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why a turn token was not accepted (each a 401 at the gateway, with this reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnTokenError {
    #[error("the turn token has expired (it lives for the turn's call only)")]
    Expired,
    #[error("the turn token's signature does not verify (altered, or signed with another key)")]
    BadSignature,
    #[error("the turn token is malformed: {0}")]
    Malformed(String),
}

/// Mints and verifies turn tokens with one key.
pub struct TurnTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl TurnTokens {
    pub fn from_secret(secret: &[u8]) -> Self {
        // One algorithm, fixed here: a token cannot choose its own (`alg: none`).
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_S;
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "sub", "aud"]);
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// The configured secret, else the one kept in Postgres (made now if there is none yet;
    /// two replicas racing both read the one that was stored first).
    pub async fn load(db: &PgPool, configured: &Secret) -> Result<Self, sqlx::Error> {
        Ok(Self::from_secret(&shared_secret(db, configured).await?))
    }

    /// The token for `claims`.
    pub fn mint(&self, claims: &TurnClaims) -> String {
        let jwt = jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            // Only a key or claims that cannot be serialised fail; ours always can.
            .expect("HS256 signing of plain claims");
        format!("{PREFIX}{jwt}")
    }

    /// The claims of a valid, unexpired token.
    pub fn verify(&self, token: &str) -> Result<TurnClaims, TurnTokenError> {
        use jsonwebtoken::errors::ErrorKind;
        let jwt = token
            .strip_prefix(PREFIX)
            .ok_or_else(|| TurnTokenError::Malformed(format!("it does not start with {PREFIX}")))?;
        let data = jsonwebtoken::decode::<TurnClaims>(jwt, &self.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => TurnTokenError::Expired,
                ErrorKind::InvalidSignature => TurnTokenError::BadSignature,
                ErrorKind::InvalidAudience => {
                    TurnTokenError::Malformed("it is not a turn token (audience)".into())
                }
                ErrorKind::MissingRequiredClaim(c) => {
                    TurnTokenError::Malformed(format!("it lacks the {c} claim"))
                }
                // A changed character in the header or claims: it no longer decodes, or no
                // longer matches its signature.
                _ => TurnTokenError::Malformed(e.to_string()),
            })?;
        let claims = data.claims;
        if claims.sub.is_empty() || claims.identity.is_empty() || claims.agent.is_empty() {
            return Err(TurnTokenError::Malformed(
                "it names no person, identity or agent".into(),
            ));
        }
        Ok(claims)
    }
}

/// The key every replica signs with: the configured secret, else the one kept in Postgres
/// (made now if there is none yet; two replicas racing both read the one stored first). Turn
/// tokens use it as it is; other signatures derive their own key from it
/// ([`crate::exports::ExportLinks`]).
pub async fn shared_secret(db: &PgPool, configured: &Secret) -> Result<Vec<u8>, sqlx::Error> {
    if !configured.is_empty() {
        return Ok(configured.expose().as_bytes().to_vec());
    }
    let fresh: [u8; 32] = rand::random();
    sqlx::query!(
        "INSERT INTO switchboard.turn_token_secret (id, secret) VALUES (1, $1)
         ON CONFLICT (id) DO NOTHING",
        &fresh[..],
    )
    .execute(db)
    .await?;
    sqlx::query_scalar!("SELECT secret FROM switchboard.turn_token_secret WHERE id = 1")
        .fetch_one(db)
        .await
}

/// [`TurnTokens`] loaded on first use (the key may live in Postgres), shared by clones.
#[derive(Clone)]
pub struct TurnTokenKeys {
    db: PgPool,
    configured: Secret,
    loaded: Arc<OnceCell<TurnTokens>>,
}

impl TurnTokenKeys {
    pub fn new(db: PgPool, configured: Secret) -> Self {
        Self {
            db,
            configured,
            loaded: Arc::default(),
        }
    }

    pub async fn get(&self) -> Result<&TurnTokens, sqlx::Error> {
        self.loaded
            .get_or_try_init(|| TurnTokens::load(&self.db, &self.configured))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> TurnClaims {
        TurnClaims::for_turn("p-1", "reggie", "reggie_oc", "s-1", "c-1", 60)
    }

    #[test]
    fn a_minted_token_verifies_to_its_claims_and_only_with_its_key() {
        let tokens = TurnTokens::from_secret(b"a secret of thirty-two bytes....");
        let token = tokens.mint(&claims());
        assert!(token.starts_with(PREFIX));
        assert_eq!(tokens.verify(&token), Ok(claims()));
        let other = TurnTokens::from_secret(b"another secret of 32 bytes......");
        assert_eq!(other.verify(&token), Err(TurnTokenError::BadSignature));
        assert!(matches!(
            tokens.verify(token.trim_start_matches(PREFIX)),
            Err(TurnTokenError::Malformed(_))
        ));
    }

    #[test]
    fn an_expired_token_is_refused_as_expired() {
        let tokens = TurnTokens::from_secret(b"a secret of thirty-two bytes....");
        let mut old = claims();
        old.exp = now_s() - LEEWAY_S - 60;
        assert_eq!(
            tokens.verify(&tokens.mint(&old)),
            Err(TurnTokenError::Expired)
        );
    }
}
