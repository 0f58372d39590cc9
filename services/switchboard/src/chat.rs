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
#[derive(Debug, serde::Serialize)]
pub struct ChatReply {
    pub agent: String,
    pub text: String,
}

/// A media type for a file, by its extension (the gateway stores what it is told).
fn content_type_of(path: &std::path::Path) -> &'static str {
    switchboard_kit::exports::content_type_for(&path.to_string_lossy())
}

/// Upload `path` (`POST /chat/uploads` with the token); its upload id.
pub async fn upload(
    config: &Config,
    token: &str,
    path: &std::path::Path,
) -> anyhow::Result<String> {
    let data = tokio::fs::read(path)
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let url = format!(
        "{}/chat/uploads",
        config.gateway.public_url.trim_end_matches('/')
    );
    let response = reqwest::Client::new()
        .post(&url)
        .query(&[("name", name.as_str())])
        .bearer_auth(token)
        .header("content-type", content_type_of(path))
        .body(data)
        .send()
        .await
        .with_context(|| format!("uploading to {url}"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    match body["upload_id"].as_str() {
        Some(id) if status.is_success() => Ok(id.to_string()),
        _ => bail!(
            "{} refused ({status}): {}",
            path.display(),
            body["error"]["message"]
                .as_str()
                .unwrap_or("no reason given")
        ),
    }
}

/// Connect to the gateway's socket, send `text` (with the files uploaded as `uploads`), and
/// wait for the reply to it.
pub async fn send(
    config: &Config,
    token: &str,
    channel: &str,
    agent: &str,
    text: &str,
    uploads: &[String],
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
    let frame = serde_json::json!({
        "type": "message", "id": id, "agent": agent, "text": text, "attachments": uploads
    });
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
