//! Chat users: one WebSocket per person on `/ws/chat` with an HS256 JWT. A socket that drops
//! (a gateway SIGKILLed) is opened again with `?since=<last seq seen>`, and every message not
//! yet `accepted` is sent again with the same client id.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use switchboard_channels::chat::ServerFrame;
use switchboard_channels::client_message_key;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

use super::{CHAT_SECRET, Channel, ClientReply, Posted, client_name};
use crate::now_us;

/// The chat users of a run: one socket each, opened on their first message.
pub(super) struct ChatClients {
    ws_base: String,
    sessions: Mutex<HashMap<usize, mpsc::UnboundedSender<Outgoing>>>,
    received: Arc<Mutex<Vec<ClientReply>>>,
    stop: watch::Sender<bool>,
}

/// A message for a chat user's socket, and where to say what the gateway answered.
struct Outgoing {
    id: String,
    agent: String,
    text: String,
    answer: oneshot::Sender<Posted>,
}

/// How long a chat client waits for `accepted` before it counts the attempt as failed.
const CHAT_ACCEPT_WAIT: Duration = Duration::from_secs(20);

impl ChatClients {
    pub(super) fn new(http_base: &str) -> Self {
        Self {
            ws_base: http_base.replacen("http", "ws", 1),
            sessions: Default::default(),
            received: Default::default(),
            stop: watch::channel(false).0,
        }
    }

    pub(super) async fn post(&self, sender: usize, index: u32, agent: &str, text: &str) -> Posted {
        let sub = client_name(sender);
        let id = format!("m{index}");
        let (answer, answered) = oneshot::channel();
        let outgoing = Outgoing {
            id: id.clone(),
            agent: agent.to_string(),
            text: text.to_string(),
            answer,
        };
        {
            let mut sessions = self.sessions.lock().unwrap();
            let session = sessions.entry(sender).or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let user = ChatUser {
                    sender,
                    url: format!("{}/ws/chat?token={}", self.ws_base, chat_token(&sub)),
                    received: self.received.clone(),
                };
                tokio::spawn(user.run(rx, self.stop.subscribe()));
                tx
            });
            if session.send(outgoing).is_err() {
                return Posted::Failed;
            }
        }
        match tokio::time::timeout(CHAT_ACCEPT_WAIT, answered).await {
            Ok(Ok(Posted::Accepted { correlation_id, .. })) => Posted::Accepted {
                provider_id: client_message_key(&sub, &id),
                correlation_id,
            },
            Ok(Ok(other)) => other,
            _ => Posted::Failed,
        }
    }

    /// Every reply (and notice) the chat users were pushed so far.
    pub(super) fn received(&self) -> Vec<ClientReply> {
        self.received.lock().unwrap().clone()
    }

    pub(super) fn close(&self) {
        let _ = self.stop.send(true);
    }
}

/// A chat token for `sub`, valid for the longest run.
pub fn chat_token(sub: &str) -> String {
    let now = chrono::Utc::now().timestamp();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": sub, "iat": now, "exp": now + 6 * 3600}),
        &jsonwebtoken::EncodingKey::from_secret(CHAT_SECRET.as_bytes()),
    )
    .expect("sign a token")
}

/// One chat user's socket, kept open (and opened again) until the run closes it.
struct ChatUser {
    sender: usize,
    url: String,
    received: Arc<Mutex<Vec<ClientReply>>>,
}

/// Why a socket's session ended.
enum Ended {
    /// The socket dropped: open it again.
    Dropped,
    /// The run is over.
    Closed,
}

impl ChatUser {
    async fn run(
        self,
        mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
        stop: watch::Receiver<bool>,
    ) {
        // Messages sent and not yet answered, in the order they were first sent.
        let mut pending: Vec<Outgoing> = Vec::new();
        let mut last_seq = 0i64;
        let mut backoff = Duration::from_millis(100);
        loop {
            if *stop.borrow() {
                return;
            }
            let url = format!("{}&since={last_seq}", self.url);
            let socket = match tokio_tungstenite::connect_async(&url).await {
                Ok((socket, _)) => socket,
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            let ended = self
                .session(
                    socket,
                    &mut pending,
                    &mut last_seq,
                    &mut outgoing,
                    stop.clone(),
                )
                .await;
            if let Ended::Closed = ended {
                return;
            }
        }
    }

    /// One socket: send again what is pending, then send, read and record until it drops.
    async fn session(
        &self,
        mut socket: tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        pending: &mut Vec<Outgoing>,
        last_seq: &mut i64,
        outgoing: &mut mpsc::UnboundedReceiver<Outgoing>,
        mut stop: watch::Receiver<bool>,
    ) -> Ended {
        let frame = |m: &Outgoing| {
            let mut f = serde_json::json!({"type": "message", "id": m.id, "text": m.text});
            if !m.agent.is_empty() {
                f["agent"] = m.agent.clone().into();
            }
            Message::text(f.to_string())
        };
        for m in pending.iter() {
            if socket.send(frame(m)).await.is_err() {
                return Ended::Dropped;
            }
        }
        loop {
            tokio::select! {
                // Open as long as the run holds the sending side.
                next = outgoing.recv(), if !outgoing.is_closed() => {
                    let Some(m) = next else { continue };
                    let send = frame(&m);
                    // A retry of a message still pending replaces it (same id: one message).
                    pending.retain(|p| p.id != m.id);
                    pending.push(m);
                    if socket.send(send).await.is_err() {
                        return Ended::Dropped;
                    }
                }
                incoming = socket.next() => {
                    let text = match incoming {
                        Some(Ok(Message::Text(text))) => text,
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Ended::Dropped,
                        Some(Ok(_)) => continue,
                    };
                    match serde_json::from_str::<ServerFrame>(text.as_str()) {
                        Ok(ServerFrame::Accepted { id, correlation_id }) => {
                            answer(pending, &id, Posted::Accepted {
                                provider_id: String::new(),
                                correlation_id,
                            });
                        }
                        Ok(ServerFrame::Error { id: Some(id), code, .. }) => {
                            answer(pending, &id, Posted::Refused(format!("chat {code}")));
                        }
                        Ok(ServerFrame::Reply { seq, reply_id, text, .. }) => {
                            *last_seq = (*last_seq).max(seq);
                            self.received.lock().unwrap().push(ClientReply {
                                channel: Channel::Chat,
                                sender: self.sender,
                                seq,
                                reply_id,
                                text: text.strip_prefix("echo: ").unwrap_or(&text).into(),
                                at_us: now_us(),
                                ..Default::default()
                            });
                        }
                        // Told while the message waited (runner down): not the answer, but
                        // the verdict counts them (each person told once per outage).
                        Ok(ServerFrame::Notice { seq, reply_id, text, .. }) => {
                            *last_seq = (*last_seq).max(seq);
                            self.received.lock().unwrap().push(ClientReply {
                                channel: Channel::Chat,
                                sender: self.sender,
                                seq,
                                reply_id,
                                text,
                                at_us: now_us(),
                                notice: true,
                                ..Default::default()
                            });
                        }
                        // This client sends no pings.
                        Ok(ServerFrame::Error { id: None, .. } | ServerFrame::Pong { .. })
                        | Err(_) => {}
                    }
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        let _ = socket.close(None).await;
                        return Ended::Closed;
                    }
                }
            }
        }
    }
}

/// Tell whoever sent message `id` what the gateway answered.
fn answer(pending: &mut Vec<Outgoing>, id: &str, posted: Posted) {
    if let Some(i) = pending.iter().position(|p| p.id == id) {
        let _ = pending.remove(i).answer.send(posted);
    }
}
