//! The chat channel (admin chat and the header widget): a WebSocket whose user is named by a JWT
//! that the operator's own login issued. This module holds what is not the socket itself: the
//! token check and the JSON frames both sides send. The gateway serves the socket; replies go
//! through the mailbox ([`crate::mailbox`]).
use http::StatusCode;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use switchboard_kit::config::ChatConfig;

use crate::ApiError;
use crate::ingress::{check_client_id, clean_text, message_text};

/// The provider name chat messages and their replies carry.
pub const PROVIDER: &str = "chat";

/// The logical channels a chat socket can be (`?channel=`; the first is the default).
pub const CHANNELS: [&str; 2] = ["admin_chat", "header_widget"];

/// Longest accepted `sub`.
const MAX_SUBJECT_CHARS: usize = 200;

/// Seconds of clock difference tolerated on `exp` and `nbf`.
const CLOCK_LEEWAY_S: u64 = 30;

/// The person a valid token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatUser {
    pub sub: String,
    pub name: String,
    pub role: String,
    pub email: String,
    /// The token's `exp` (Unix seconds): a socket opened with it is closed then.
    pub expires_at: i64,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// Required by the validation (a missing one is refused with that reason, not here).
    #[serde(default)]
    exp: i64,
    #[serde(default)]
    name: Option<String>,
    /// The name in two parts, when there is no `name` (the seed's dashboard tokens carry
    /// `first_name` / `last_name`; OpenID Connect's carry `given_name` / `family_name`).
    #[serde(default)]
    first_name: Option<String>,
    #[serde(default)]
    last_name: Option<String>,
    #[serde(default)]
    given_name: Option<String>,
    #[serde(default)]
    family_name: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    email: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatConfigError {
    #[error("chat.jwt_secret and chat.jwt_public_key are both set: set one (HS256 or RS256)")]
    BothKeys,
    #[error("reading chat.jwt_public_key {path}: {source}")]
    ReadKey {
        path: String,
        source: std::io::Error,
    },
    #[error("chat.jwt_public_key {path} is not an RSA public key in PEM: {source}")]
    BadKey {
        path: String,
        source: jsonwebtoken::errors::Error,
    },
}

/// Verifies chat tokens: one algorithm, fixed by the configuration (so a token cannot choose
/// its own: `alg: none`, or an HS256 token "signed" with the RS256 public key, are refused).
pub struct ChatTokens {
    key: DecodingKey,
    validation: Validation,
}

impl ChatTokens {
    /// `None` when chat is not configured (no secret, no key): every socket is refused.
    pub fn from_config(config: &ChatConfig) -> Result<Option<Self>, ChatConfigError> {
        let (key, algorithm) = match (
            config.jwt_secret.is_empty(),
            config.jwt_public_key.is_empty(),
        ) {
            (true, true) => return Ok(None),
            (false, false) => return Err(ChatConfigError::BothKeys),
            (false, true) => (
                DecodingKey::from_secret(config.jwt_secret.expose().as_bytes()),
                Algorithm::HS256,
            ),
            (true, false) => {
                let path = config.jwt_public_key.clone();
                let pem = std::fs::read(&path).map_err(|source| ChatConfigError::ReadKey {
                    path: path.clone(),
                    source,
                })?;
                let key = DecodingKey::from_rsa_pem(&pem)
                    .map_err(|source| ChatConfigError::BadKey { path, source })?;
                (key, Algorithm::RS256)
            }
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = CLOCK_LEEWAY_S;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if !config.jwt_issuer.is_empty() {
            validation.set_issuer(&[&config.jwt_issuer]);
            required.push("iss");
        }
        if config.jwt_audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[&config.jwt_audience]);
            // jsonwebtoken checks `aud` only when present: a token without one would pass.
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Ok(Some(Self { key, validation }))
    }

    /// The user a token names, or 401 with the reason.
    pub fn verify(&self, token: &str) -> Result<ChatUser, ApiError> {
        use jsonwebtoken::errors::ErrorKind;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| {
                let reason = match e.kind() {
                    ErrorKind::ExpiredSignature => "the token has expired",
                    ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
                    ErrorKind::InvalidSignature => "the token's signature does not verify",
                    ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                        "the token's algorithm is not the one configured"
                    }
                    ErrorKind::InvalidIssuer => "the token's issuer is not the one configured",
                    ErrorKind::InvalidAudience => "the token's audience is not the one configured",
                    ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim",
                    _ => "the token is malformed",
                };
                unauthorized(reason)
            })?;
        let claims = data.claims;
        if claims.sub.is_empty()
            || claims.sub.chars().count() > MAX_SUBJECT_CHARS
            || claims.sub.chars().any(char::is_control)
        {
            return Err(unauthorized(
                "the token's sub must be 1 to 200 characters without control characters",
            ));
        }
        let claim = |c: Option<String>| {
            c.map(|v| v.chars().filter(|c| !c.is_control()).take(200).collect())
                .unwrap_or_default()
        };
        let name = full_name(&[
            &[claims.name],
            &[claims.first_name, claims.last_name],
            &[claims.given_name, claims.family_name],
        ]);
        Ok(ChatUser {
            sub: claims.sub,
            name: claim(name),
            role: claim(claims.role),
            email: claim(claims.email),
            expires_at: claims.exp,
        })
    }
}

/// The first of `spellings` (a name whole, or in parts) with any part that is not blank: its
/// parts joined by a space.
fn full_name(spellings: &[&[Option<String>]]) -> Option<String> {
    spellings.iter().find_map(|parts| {
        let parts: Vec<&str> = parts
            .iter()
            .flatten()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .collect();
        (!parts.is_empty()).then(|| parts.join(" "))
    })
}

fn unauthorized(reason: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "invalid_token", reason)
}

/// What a client sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    /// A message to an agent. `id` is the client's: sending it again (after a reconnect, say)
    /// is the same message, answered once.
    Message {
        id: String,
        #[serde(default)]
        agent: String,
        /// May be empty when the message carries attachments.
        #[serde(default)]
        text: String,
        /// Upload ids (`POST /chat/uploads`) of files sent with the message.
        #[serde(default)]
        attachments: Vec<String>,
    },
}

/// A client's message, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub id: String,
    pub agent: String,
    pub text: String,
    /// Upload ids, in the order given, each once.
    pub attachments: Vec<uuid::Uuid>,
}

#[derive(Deserialize)]
struct PingFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: String,
}

/// The id of a client's `{"type":"ping","id"?}` (at most 64 characters kept), if `frame` is
/// one; the gateway answers it with `pong`.
pub fn ping_id(frame: &str) -> Option<String> {
    let ping: PingFrame = serde_json::from_str(frame).ok()?;
    (ping.kind == "ping").then(|| ping.id.chars().take(64).collect())
}

/// Read one text frame from a client into a message, or the error to send back. A message
/// names at most `max_attachments` uploads; one with attachments may have no text.
pub fn read_frame(
    frame: &str,
    max_chars: usize,
    max_attachments: usize,
) -> Result<ChatMessage, ApiError> {
    let frame: ClientFrame = serde_json::from_str(frame).map_err(|e| {
        ApiError::bad_request(
            "invalid_frame",
            format!("expected {{\"type\":\"message\",\"id\",\"text\",\"attachments\"?}}: {e}"),
        )
    })?;
    let ClientFrame::Message {
        id,
        agent,
        text,
        attachments,
    } = frame;
    check_client_id("id", &id)?;
    // (The list itself is bounded by the frame's size.)
    let mut ids: Vec<uuid::Uuid> = Vec::new();
    for a in &attachments {
        let id = a.trim().parse().map_err(|_| {
            ApiError::bad_request(
                "invalid_field",
                "attachments must be upload ids as POST /chat/uploads answered them",
            )
        })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
        if ids.len() > max_attachments {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_many_attachments",
                format!("a message names at most {max_attachments} uploads"),
            ));
        }
    }
    let text = if ids.is_empty() {
        message_text("text", &text, max_chars)?
    } else {
        clean_text("text", &text, max_chars)?
    };
    Ok(ChatMessage {
        id,
        agent: agent.trim().to_string(),
        text,
        attachments: ids,
    })
}

/// What the server sends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// The message `id` is stored and will be answered (resending it is harmless).
    Accepted { id: String, correlation_id: String },
    /// An agent's reply. `seq` orders replies; a client reconnecting with `?since=<seq>` gets
    /// every reply after it.
    Reply {
        seq: i64,
        reply_id: String,
        in_reply_to: String,
        agent: String,
        text: String,
        sent_at: String,
        /// Files the agent left for the person: name, content type, size, a signed link
        /// that works until `expires_at`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<switchboard_kit::exports::ExportLink>,
    },
    /// Switchboard telling the person something while their message waits (the agent's host
    /// is down: it will be answered shortly). Not the answer: a `reply` follows.
    Notice {
        seq: i64,
        reply_id: String,
        in_reply_to: String,
        agent: String,
        text: String,
        sent_at: String,
    },
    /// The answer to a client's `ping`: the connection works end to end (a browser cannot see
    /// WebSocket pings, so a page checks with these).
    Pong { id: String },
    /// Something the client sent was refused (`id` names the message, when known).
    Error {
        code: String,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        id: Option<String>,
    },
}

impl ServerFrame {
    pub fn error(e: &ApiError, id: Option<String>) -> Self {
        Self::Error {
            code: e.code().into(),
            message: e.message().into(),
            id,
        }
    }

    pub fn reply(entry: &crate::MailboxEntry) -> Self {
        if entry.is_notice() {
            return Self::Notice {
                seq: entry.seq,
                reply_id: entry.reply_id.to_string(),
                in_reply_to: entry.in_reply_to.clone(),
                agent: entry.agent.clone(),
                text: entry.text.clone(),
                sent_at: entry.created_at.to_rfc3339(),
            };
        }
        Self::Reply {
            seq: entry.seq,
            reply_id: entry.reply_id.to_string(),
            in_reply_to: entry.in_reply_to.clone(),
            agent: entry.agent.clone(),
            text: entry.text.clone(),
            sent_at: entry.created_at.to_rfc3339(),
            attachments: entry.attachments.0.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use switchboard_kit::config::Secret;

    const SECRET: &str = "chat-secret-for-tests";

    fn tokens(tweak: impl FnOnce(&mut ChatConfig)) -> ChatTokens {
        let mut config = ChatConfig {
            jwt_secret: Secret::new(SECRET),
            ..Default::default()
        };
        tweak(&mut config);
        ChatTokens::from_config(&config).unwrap().unwrap()
    }

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    fn hs256(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn reason(e: ApiError) -> String {
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        e.message().to_string()
    }

    #[test]
    fn a_valid_token_names_its_user_with_their_claims() {
        let exp = now() + 60;
        let token = hs256(serde_json::json!({
            "sub": "u-17", "exp": exp, "name": "Ana", "role": "admin",
            "email": "ana@example.com"
        }));
        let user = tokens(|_| {}).verify(&token).unwrap();
        assert_eq!(
            user,
            ChatUser {
                sub: "u-17".into(),
                name: "Ana".into(),
                role: "admin".into(),
                email: "ana@example.com".into(),
                expires_at: exp,
            }
        );
    }

    #[test]
    fn a_token_without_a_name_names_its_user_by_their_first_and_last_name() {
        let t = tokens(|_| {});
        let name_of = |claims: serde_json::Value| {
            let mut all = serde_json::json!({"sub": "u-18", "exp": now() + 60});
            all.as_object_mut()
                .unwrap()
                .extend(claims.as_object().unwrap().clone());
            t.verify(&hs256(all)).unwrap().name
        };
        use serde_json::json;
        // The seed's dashboard tokens.
        assert_eq!(
            name_of(json!({"first_name": "Ana", "last_name": "Ortiz"})),
            "Ana Ortiz"
        );
        assert_eq!(name_of(json!({"first_name": "Ana"})), "Ana");
        assert_eq!(name_of(json!({"last_name": " Ortiz "})), "Ortiz");
        // OpenID Connect's.
        assert_eq!(
            name_of(json!({"given_name": "Ben", "family_name": "Li"})),
            "Ben Li"
        );
        // `name` when it says something; the parts otherwise.
        let both = json!({"name": "Ana O.", "first_name": "Ana", "last_name": "Ortiz"});
        assert_eq!(name_of(both), "Ana O.");
        let blank = json!({"name": "  ", "first_name": "Ana", "last_name": "Ortiz"});
        assert_eq!(name_of(blank), "Ana Ortiz");
        assert_eq!(name_of(json!({"first_name": "", "last_name": ""})), "");
        assert_eq!(name_of(json!({})), "");
        // The parts are claims like any other: no control characters, 200 characters at most.
        let long = json!({"first_name": "A\u{7}na", "last_name": "x".repeat(300)});
        let name = name_of(long);
        assert!(name.starts_with("Ana xxx"), "{name}");
        assert_eq!(name.chars().count(), 200);
    }

    #[test]
    fn expired_early_unsigned_and_forged_tokens_are_refused_with_the_reason() {
        let t = tokens(|_| {});
        let expired = hs256(serde_json::json!({"sub": "u", "exp": now() - 120}));
        assert!(reason(t.verify(&expired).unwrap_err()).contains("expired"));
        let early = hs256(serde_json::json!({"sub": "u", "exp": now() + 600, "nbf": now() + 300}));
        assert!(reason(t.verify(&early).unwrap_err()).contains("not valid yet"));
        let no_exp = hs256(serde_json::json!({"sub": "u"}));
        assert!(reason(t.verify(&no_exp).unwrap_err()).contains("required claim"));

        // alg "none": header and claims, no signature.
        use base64::Engine;
        let b64 = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let none = format!(
            "{}.{}.",
            b64(serde_json::json!({"alg": "none", "typ": "JWT"})),
            b64(serde_json::json!({"sub": "admin", "exp": now() + 60}))
        );
        assert!(t.verify(&none).is_err());

        let other_secret = encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "u", "exp": now() + 60}),
            &EncodingKey::from_secret(b"guessed"),
        )
        .unwrap();
        assert!(reason(t.verify(&other_secret).unwrap_err()).contains("signature"));

        let hs512 = encode(
            &Header::new(Algorithm::HS512),
            &serde_json::json!({"sub": "u", "exp": now() + 60}),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        assert!(reason(t.verify(&hs512).unwrap_err()).contains("algorithm"));
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let t = tokens(|c| {
            c.jwt_issuer = "https://login.example.com".into();
            c.jwt_audience = "switchboard".into();
        });
        let good = hs256(serde_json::json!({
            "sub": "u", "exp": now() + 60, "iss": "https://login.example.com", "aud": "switchboard"
        }));
        assert!(t.verify(&good).is_ok());
        let wrong_iss = hs256(serde_json::json!({
            "sub": "u", "exp": now() + 60, "iss": "https://evil.example", "aud": "switchboard"
        }));
        assert!(reason(t.verify(&wrong_iss).unwrap_err()).contains("issuer"));
        let wrong_aud = hs256(serde_json::json!({
            "sub": "u", "exp": now() + 60, "iss": "https://login.example.com", "aud": "other"
        }));
        assert!(reason(t.verify(&wrong_aud).unwrap_err()).contains("audience"));
        let no_aud = hs256(serde_json::json!({
            "sub": "u", "exp": now() + 60, "iss": "https://login.example.com"
        }));
        assert!(
            t.verify(&no_aud).is_err(),
            "an audience configured is required"
        );
        // Without an audience configured, a token that carries one is still accepted.
        let any_aud = hs256(serde_json::json!({"sub": "u", "exp": now() + 60, "aud": "x"}));
        assert!(tokens(|_| {}).verify(&any_aud).is_ok());
    }

    #[test]
    fn frames_are_checked_before_anything_is_stored() {
        let ok = read_frame(
            r#"{"type":"message","id":"c-1","text":" hi\u0007 "}"#,
            10,
            2,
        )
        .unwrap();
        assert_eq!(ok.text, " hi ");
        assert_eq!(ok.agent, "");
        assert!(ok.attachments.is_empty());
        let code = |f: &str| read_frame(f, 10, 2).unwrap_err().code();
        assert_eq!(code("not json"), "invalid_frame");
        assert_eq!(
            code(r#"{"type":"shout","id":"1","text":"x"}"#),
            "invalid_frame"
        );
        assert_eq!(
            code(r#"{"type":"message","id":"a b","text":"x"}"#),
            "invalid_field"
        );
        assert_eq!(
            code(r#"{"type":"message","id":"1","text":"   "}"#),
            "missing_field"
        );
        assert_eq!(
            code(r#"{"type":"message","id":"1","text":"12345678901"}"#),
            "text_too_long"
        );
    }

    #[test]
    fn a_message_names_a_few_uploads_by_id_and_then_needs_no_text() {
        let a = uuid::Uuid::now_v7();
        let b = uuid::Uuid::now_v7();
        let frame = |ids: &[String], text: &str| {
            serde_json::json!({"type": "message", "id": "c-1", "text": text, "attachments": ids})
                .to_string()
        };
        let ok = read_frame(
            &frame(&[a.to_string(), b.to_string(), a.to_string()], ""),
            10,
            2,
        )
        .unwrap();
        assert_eq!(ok.attachments, [a, b], "in order, each once");
        assert_eq!(ok.text, "");
        let code = |f: &str| read_frame(f, 10, 2).unwrap_err().code();
        let three: Vec<String> = (0..3).map(|_| uuid::Uuid::now_v7().to_string()).collect();
        assert_eq!(code(&frame(&three, "x")), "too_many_attachments");
        assert_eq!(
            code(&frame(&["../etc/passwd".into()], "x")),
            "invalid_field"
        );
        assert_eq!(code(&frame(&[], " ")), "missing_field");
    }

    #[test]
    fn a_ping_is_told_apart_from_a_message_and_keeps_a_short_id() {
        assert_eq!(ping_id(r#"{"type":"ping","id":"7"}"#), Some("7".into()));
        assert_eq!(ping_id(r#"{"type":"ping"}"#), Some(String::new()));
        assert_eq!(
            ping_id(&format!(r#"{{"type":"ping","id":"{}"}}"#, "x".repeat(100))).map(|i| i.len()),
            Some(64)
        );
        assert_eq!(ping_id(r#"{"type":"message","id":"1","text":"hi"}"#), None);
        assert_eq!(ping_id("not json"), None);
    }
}
