//! Who is calling, in one place: an API key (`Authorization: Bearer sb_…`), an operator's
//! console JWT (`console.jwt_roles`), an agent's turn token (`sbt_…`), or a chat user's JWT
//! (the socket and uploads). Every route asks here; none reads a credential itself.
use axum::http::{HeaderMap, StatusCode, header};
use switchboard_channels::ApiError;
use switchboard_channels::api::ApiCaller;
use switchboard_channels::chat::{self, ChatUser};
use switchboard_kit::turn_token::{self, TurnClaims};
use uuid::Uuid;

use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused, refused_on};

/// The credential of `Authorization: Bearer <credential>` (API keys, chat tokens).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The caller an API key names. An agent's turn token is refused here (after it is checked):
/// only the routes that confine a turn to its person ask for [`key_or_turn`] instead, so a
/// route nobody thought about stays closed to agents.
pub(crate) async fn caller(
    state: &GatewayState,
    headers: &HeaderMap,
) -> Result<ApiCaller, Refused> {
    match key_or_turn(state, headers).await? {
        (caller, None) => Ok(caller),
        (_, Some(_)) => Err(refuse(ApiError::forbidden(
            "turn_token_not_allowed",
            "a turn token reaches only its person's search, memory, sessions, outbound \
             messages and wake-ups (docs/agent-tools.md), not this route",
        ))),
    }
}

/// The caller behind an API key, or an agent's turn token (`sbt_…`): then a caller with the
/// token's scopes and the token's claims, which the route must confine the request to. An
/// expired or altered token is 401 with the reason.
pub(crate) async fn key_or_turn(
    state: &GatewayState,
    headers: &HeaderMap,
) -> Result<(ApiCaller, Option<TurnClaims>), Refused> {
    let credential = bearer(headers).map(str::trim);
    if let Some(console) = &state.console_jwts
        && let Some(jwt) =
            credential.filter(|c| !c.starts_with(turn_token::PREFIX) && c.matches('.').count() == 2)
    {
        return console.operator(jwt).map(|caller| (caller, None));
    }
    let Some(token) = credential.filter(|c| c.starts_with(turn_token::PREFIX)) else {
        let caller = state
            .api_keys
            .authenticate(credential)
            .await
            .map_err(refuse)?;
        return Ok((caller, None));
    };
    let tokens = state.turn_tokens.get().await.map_err(unavailable)?;
    let claims = tokens.verify(token).map_err(|e| {
        refuse(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_turn_token",
            e.to_string(),
        ))
    })?;
    let caller = ApiCaller {
        key_id: Uuid::nil(),
        // Its own owner per agent and person: its Idempotency-Keys and messages are its own.
        owner: format!("turn.{}.{}", claims.agent, claims.sub),
        scopes: claims.scopes.clone(),
    };
    Ok((caller, Some(claims)))
}

/// 403 for a turn's request about someone or something outside its turn.
pub(crate) fn outside_turn(message: impl Into<String>) -> Refused {
    refuse(ApiError::forbidden("outside_turn", message))
}

/// The chat user a request's token names (`Authorization: Bearer` or `?token=`), checked
/// before anything else is done for it (the socket and uploads alike); refusals are counted.
pub(crate) fn chat_user(
    state: &GatewayState,
    headers: &HeaderMap,
    query_token: Option<&str>,
) -> Result<ChatUser, Refused> {
    let refuse = |e| refused_on("chat", chat::PROVIDER, e);
    let Some(tokens) = state.chat_tokens.clone() else {
        return Err(refuse(ApiError::forbidden(
            "not_configured",
            "chat is not configured (chat.jwt_secret or chat.jwt_public_key)",
        )));
    };
    let token = bearer(headers).or(query_token).ok_or_else(|| {
        refuse(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "a token is required: Authorization: Bearer <jwt> or ?token=<jwt>",
        ))
    })?;
    tokens.verify(token.trim()).map_err(refuse)
}

/// A handler's caller by API key (or an operator's console JWT); a turn token is refused
/// ([`caller`]). Taking it as an argument is the whole of a route's authentication.
pub(crate) struct Key(pub ApiCaller);

impl axum::extract::FromRequestParts<GatewayState> for Key {
    type Rejection = Refused;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &GatewayState,
    ) -> Result<Self, Refused> {
        caller(state, &parts.headers).await.map(Key)
    }
}

/// A handler's caller by API key or by an agent's turn token ([`key_or_turn`]): a route
/// that takes it must confine a turn to its own person (`turn` is `Some` then).
pub(crate) struct KeyOrTurn {
    pub caller: ApiCaller,
    pub turn: Option<TurnClaims>,
}

impl axum::extract::FromRequestParts<GatewayState> for KeyOrTurn {
    type Rejection = Refused;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &GatewayState,
    ) -> Result<Self, Refused> {
        let (caller, turn) = key_or_turn(state, &parts.headers).await?;
        Ok(KeyOrTurn { caller, turn })
    }
}
