//! A chat client as a browser widget would be: a WebSocket to `/ws/chat` with a JWT, JSON frames.
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The HS256 secret `spawn_app` configures for chat.
pub const CHAT_SECRET: &str = "chat-secret-for-tests-3b9d";

/// A token for `sub` with `claims` added (name, role, email, or overrides of exp/nbf).
pub fn chat_token(sub: &str, claims: Value) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut all = json!({"sub": sub, "iat": now, "exp": now + 600});
    if let (Some(all), Some(extra)) = (all.as_object_mut(), claims.as_object()) {
        for (k, v) in extra {
            all.insert(k.clone(), v.clone());
        }
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &all,
        &jsonwebtoken::EncodingKey::from_secret(CHAT_SECRET.as_bytes()),
    )
    .expect("sign a token")
}

pub struct ChatClient {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What the gateway answered a connection it refused.
#[derive(Debug)]
pub struct Refusal {
    pub status: u16,
    pub body: String,
}

impl ChatClient {
    /// Connect to `gateway_url`'s socket with `?<query>` (token, channel, since).
    pub async fn connect(gateway_url: &str, query: &str) -> Result<Self, Refusal> {
        let url = format!("{}/ws/chat?{query}", gateway_url.replacen("http", "ws", 1));
        match tokio_tungstenite::connect_async(&url).await {
            Ok((socket, _)) => Ok(Self { socket }),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(Refusal {
                status: response.status().as_u16(),
                body: response
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
            }),
            Err(e) => panic!("connecting to {url}: {e}"),
        }
    }

    /// Connect as `sub` on the default channel (admin chat).
    pub async fn as_user(gateway_url: &str, sub: &str) -> Self {
        Self::connect(
            gateway_url,
            &format!("token={}", chat_token(sub, json!({}))),
        )
        .await
        .expect("the gateway accepts a valid token")
    }

    pub async fn send_frame(&mut self, frame: Value) {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .expect("send a frame");
    }

    /// Send a message with the client's own `id`.
    pub async fn say(&mut self, id: &str, text: &str) {
        self.send_frame(json!({"type": "message", "id": id, "text": text}))
            .await;
    }

    /// Send a message naming files uploaded before (their upload ids).
    pub async fn say_with_files(&mut self, id: &str, text: &str, uploads: &[&str]) {
        self.send_frame(json!({"type": "message", "id": id, "text": text, "attachments": uploads}))
            .await;
    }

    /// The next JSON frame within `timeout` (pings skipped); `None` if none came.
    pub async fn next_frame(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let message = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()??;
            match message.ok()? {
                Message::Text(text) => {
                    return Some(serde_json::from_str(text.as_str()).expect("JSON frame"));
                }
                Message::Close(_) => return None,
                _ => continue,
            }
        }
    }

    /// Frames until one of `kind` comes (the others are returned too, in order).
    pub async fn until(&mut self, kind: &str, timeout: Duration) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(frame) = self.next_frame(timeout).await {
            let done = frame["type"] == kind;
            seen.push(frame);
            if done {
                return seen;
            }
        }
        panic!("no {kind} frame within {timeout:?}; got {seen:?}");
    }

    /// The first frame of one of `kinds` (others skipped).
    pub async fn until_any(&mut self, kinds: &[&str], timeout: Duration) -> Value {
        while let Some(frame) = self.next_frame(timeout).await {
            if kinds.iter().any(|k| frame["type"] == *k) {
                return frame;
            }
        }
        panic!("no {kinds:?} frame within {timeout:?}");
    }

    /// The next `reply` frame.
    pub async fn reply(&mut self, timeout: Duration) -> Value {
        self.until("reply", timeout)
            .await
            .pop()
            .expect("a reply frame")
    }

    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// What the gateway answered an upload: its status and JSON body (the upload, or the error).
#[derive(Debug)]
pub struct UploadAnswer {
    pub status: u16,
    pub body: Value,
}

impl UploadAnswer {
    /// The upload id a message names (panics with the answer when there is none).
    pub fn id(&self) -> String {
        self.body["upload_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no upload id in {self:?}"))
            .to_string()
    }
}

/// Upload `data` as a chat widget does before naming it in a message: `POST /chat/uploads`
/// with the user's token, the file as the body, its type and name.
pub async fn upload(
    gateway_url: &str,
    token: &str,
    name: &str,
    content_type: &str,
    data: Vec<u8>,
) -> UploadAnswer {
    let response = reqwest::Client::new()
        .post(format!("{gateway_url}/chat/uploads"))
        .query(&[("name", name)])
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(data)
        .send()
        .await
        .expect("the gateway answers an upload");
    UploadAnswer {
        status: response.status().as_u16(),
        body: response.json().await.unwrap_or_default(),
    }
}
