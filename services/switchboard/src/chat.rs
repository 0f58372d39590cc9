//! Trying the chat channel from the command line: a token signed with the configured HS256
//! secret, and a client that sends one message and waits for its reply.
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use switchboard_channels::chat::ServerFrame;
use switchboard_kit::Config;
use tokio_tungstenite::tungstenite::Message;

/// A token for `sub`, valid for `ttl_s` seconds, signed with `chat.jwt_secret`.
pub fn token(
    config: &Config,
    sub: &str,
    name: &str,
    role: &str,
    ttl_s: i64,
) -> anyhow::Result<String> {
    if config.chat.jwt_secret.is_empty() {
        bail!("chat.jwt_secret is not set: tokens for RS256 come from your own login");
    }
    let now = chrono::Utc::now().timestamp();
    let mut claims = serde_json::json!({"sub": sub, "iat": now, "exp": now + ttl_s});
    if !name.is_empty() {
        claims["name"] = name.into();
    }
    if !role.is_empty() {
        claims["role"] = role.into();
    }
    if !config.chat.jwt_issuer.is_empty() {
        claims["iss"] = config.chat.jwt_issuer.clone().into();
    }
    if !config.chat.jwt_audience.is_empty() {
        claims["aud"] = config.chat.jwt_audience.clone().into();
    }
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(config.chat.jwt_secret.expose().as_bytes()),
    )?)
}

/// A reply as the CLI prints it.
pub struct ChatReply {
    pub agent: String,
    pub text: String,
}

/// Connect to the gateway's socket, send `text`, and wait for the reply to it.
pub async fn send(
    config: &Config,
    token: &str,
    channel: &str,
    agent: &str,
    text: &str,
    wait: Duration,
) -> anyhow::Result<ChatReply> {
    let base = config
        .gateway
        .public_url
        .trim_end_matches('/')
        .replacen("http", "ws", 1);
    let url = format!("{base}/ws/chat?channel={channel}&token={token}");
    let (mut socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .with_context(|| format!("connecting to {base}/ws/chat"))?;
    let id = uuid::Uuid::now_v7().to_string();
    let frame = serde_json::json!({"type": "message", "id": id, "agent": agent, "text": text});
    socket.send(Message::text(frame.to_string())).await?;
    let reply = tokio::time::timeout(wait, async {
        while let Some(message) = socket.next().await {
            let Message::Text(text) = message? else {
                continue;
            };
            match serde_json::from_str::<ServerFrame>(text.as_str())? {
                ServerFrame::Reply {
                    in_reply_to,
                    agent,
                    text,
                    ..
                } if in_reply_to == id => return Ok(ChatReply { agent, text }),
                ServerFrame::Error { code, message, .. } => bail!("{code}: {message}"),
                _ => {}
            }
        }
        bail!("the gateway closed the socket")
    })
    .await
    .with_context(|| format!("no reply within {} s", wait.as_secs()))??;
    let _ = socket.close(None).await;
    Ok(reply)
}
