//! `GET /ws/chat`: the admin chat and header widget socket.
//!
//! The token (`Authorization: Bearer` or `?token=`) is checked before the upgrade, so a bad one
//! gets a plain 401 with the reason. On the socket the client sends
//! `{"type":"message","id","agent","text","attachments"?}` (`attachments`: ids of files it
//! uploaded first, [`crate::uploads`]) and is told `accepted` once the message is stored
//! (a resend of the same `id` is the same message, answered once); replies arrive as `reply`
//! frames. A client that reconnects with `?since=<seq of the last reply it saw>` is sent every
//! reply after it; without `since`, every reply no socket was handed yet. A client's
//! `{"type":"ping","id"}` is answered `{"type":"pong","id"}`: a browser cannot see WebSocket
//! pings, so the widget checks a quiet connection with these.
//!
//! A socket lives no longer than its token: at the token's `exp` it is closed with code 4001
//! ("token expired"), and the client reconnects with a fresh token. Each socket holds one of
//! the gateway's connection slots (`gateway.max_connections`) while it is open, and one user
//! holds at most `chat.max_sockets_per_user` sockets at once.
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use switchboard_channels::chat::{self, ChatUser, ServerFrame};
use switchboard_channels::{ApiError, MailboxEntry, Received, client_message_key};
use switchboard_kit::http::ConnectionSlot;
use switchboard_kit::proto::Person;

use crate::{Accept, GatewayState, Published, Refused, check_agent, publish, refused_on};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/ws/chat", get(connect))
        .route("/ws/chat/{channel}", get(connect_on))
}

#[derive(Debug, Deserialize, Default)]
pub struct ConnectParams {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    channel: Option<String>,
    /// The `seq` of the last reply the client saw.
    #[serde(default)]
    since: Option<i64>,
}

/// The close code of a socket whose token expired (4000-4999: the application's own).
pub const TOKEN_EXPIRED: u16 = 4001;

async fn connect(
    state: State<GatewayState>,
    Query(params): Query<ConnectParams>,
    headers: HeaderMap,
    slot: Option<Extension<ConnectionSlot>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Refused> {
    let channel = params.channel.clone();
    open(state, params, channel, headers, slot, ws).await
}

async fn connect_on(
    state: State<GatewayState>,
    axum::extract::Path(channel): axum::extract::Path<String>,
    Query(params): Query<ConnectParams>,
    headers: HeaderMap,
    slot: Option<Extension<ConnectionSlot>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Refused> {
    open(state, params, Some(channel), headers, slot, ws).await
}

async fn open(
    State(state): State<GatewayState>,
    params: ConnectParams,
    channel: Option<String>,
    headers: HeaderMap,
    slot: Option<Extension<ConnectionSlot>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Refused> {
    let refuse = |e| refused_on("chat", chat::PROVIDER, e);
    let channel: &'static str = match channel.as_deref() {
        None | Some("") => chat::CHANNELS[0],
        Some(c) => chat::CHANNELS
            .into_iter()
            .find(|k| *k == c)
            .ok_or_else(|| {
                refuse(ApiError::bad_request(
                    "unknown_channel",
                    format!("channel must be one of {}", chat::CHANNELS.join(", ")),
                ))
            })?,
    };
    let user = crate::auth::chat_user(&state, &headers, params.token.as_deref())?;
    let ws = ws.map_err(|e| {
        refuse(ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_required",
            e.body_text(),
        ))
    })?;
    let max_sockets = state.config.chat.max_sockets_per_user.max(1);
    let counted = state
        .hub
        .claim_socket(&user.sub, max_sockets)
        .ok_or_else(|| {
            refuse(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_sockets",
                format!(
                    "this user already holds {max_sockets} sockets (chat.max_sockets_per_user); \
                     close one first"
                ),
            ))
        })?;
    let since = params.since;
    // A frame is bounded like a message: tungstenite's own frame limit (16 MiB) would let a
    // client make us buffer far more than any message may be.
    let max_message = state.config.gateway.max_body_bytes;
    Ok(ws
        .max_message_size(max_message)
        .max_frame_size(max_message)
        .on_upgrade(move |socket| async move {
            // Held until the socket ends: the connection slot and the user's count.
            let _held = (slot, counted);
            metrics::counter!("sb_gateway_chat_connections_total", "channel" => channel)
                .increment(1);
            if let Err(e) = serve(state, socket, channel, user, since).await {
                tracing::debug!(error = %e, "chat socket ended");
            }
        })
        .into_response())
}

/// One socket, from the upgrade until either side closes it.
///
/// Entries go out in `seq` order with none skipped, read from the table: the client's `since`
/// is the last `seq` it saw, so a reply sent after a later one would be lost to a client that
/// reconnects in between. An announcement only says that something is new.
async fn serve(
    state: GatewayState,
    mut socket: WebSocket,
    channel: &'static str,
    user: ChatUser,
    since: Option<i64>,
) -> anyhow::Result<()> {
    // Registered before the backlog is read, so a reply stored in between is not missed.
    let (_registration, mut live) = state.hub.socket(channel, &user.sub);
    let mut sent = Sent {
        channel,
        address: &user.sub,
        limit: state.config.chat.replay_limit,
        seq: 0,
    };
    sent.seq = match since {
        Some(since) => since,
        None => {
            // What no socket was handed yet, then whatever comes after the newest entry now.
            let newest = state.mailbox.newest(channel, &user.sub).await?;
            let backlog = state
                .mailbox
                .not_pushed(channel, &user.sub, newest, sent.limit)
                .await?;
            push(&state, &mut socket, &backlog).await?;
            newest
        }
    };
    sent.catch_up(&state, &mut socket).await?;

    let idle = Duration::from_millis(state.config.chat.idle_timeout_ms);
    let mut ping = tokio::time::interval(idle / 3);
    ping.reset();
    let mut catch_up = tokio::time::interval(Duration::from_millis(
        state.config.chat.catch_up_ms.max(100),
    ));
    catch_up.reset();
    let mut last_heard = tokio::time::Instant::now();
    let lifetime_ms = (user.expires_at * 1000 - switchboard_kit::now_ms()).max(0);
    let expiry = tokio::time::sleep(Duration::from_millis(lifetime_ms as u64));
    tokio::pin!(expiry);
    loop {
        tokio::select! {
            () = &mut expiry => {
                // The client reconnects with a fresh token (the widget fetches one).
                let frame = axum::extract::ws::CloseFrame {
                    code: TOKEN_EXPIRED,
                    reason: "token expired".into(),
                };
                let _ = socket.send(Message::Close(Some(frame))).await;
                return Ok(());
            }
            incoming = socket.recv() => {
                let Some(incoming) = incoming else { return Ok(()) };
                last_heard = tokio::time::Instant::now();
                match incoming? {
                    Message::Text(text) => {
                        let answer = receive(&state, channel, &user, text.as_str()).await;
                        send(&mut socket, &answer).await?;
                    }
                    Message::Binary(_) => {
                        let e = ApiError::bad_request("invalid_frame", "frames are JSON text");
                        send(&mut socket, &ServerFrame::error(&e, None)).await?;
                    }
                    Message::Close(_) => return Ok(()),
                    Message::Ping(_) | Message::Pong(_) => {}
                }
            }
            Some(entry) = live.recv() => {
                // One read of the table answers every announcement already queued.
                let mut newest = entry.seq;
                while let Ok(entry) = live.try_recv() {
                    newest = newest.max(entry.seq);
                }
                if newest > sent.seq {
                    sent.catch_up(&state, &mut socket).await?;
                }
            }
            _ = catch_up.tick() => {
                sent.catch_up(&state, &mut socket).await?;
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > idle {
                    let _ = socket.send(Message::Close(None)).await;
                    return Ok(());
                }
                socket.send(Message::Ping(Default::default())).await?;
            }
            _ = state.shutdown.wait() => {
                // 1001 "going away": the client reconnects (to another replica) with `since`.
                let frame = axum::extract::ws::CloseFrame {
                    code: 1001,
                    reason: "server shutting down".into(),
                };
                let _ = socket.send(Message::Close(Some(frame))).await;
                return Ok(());
            }
        }
    }
}

/// How far a socket got in its person's mailbox.
struct Sent<'a> {
    channel: &'static str,
    address: &'a str,
    limit: i64,
    /// Every entry up to this `seq` was sent (or was before the client's `since`).
    seq: i64,
}

impl Sent<'_> {
    /// Send the entries after the last one sent, in order, at most `limit` at a time (a client
    /// far behind gets the rest on the next catch-ups). A table that cannot be read now is read
    /// again on the next announcement or catch-up; only a socket that fails ends it.
    async fn catch_up(
        &mut self,
        state: &GatewayState,
        socket: &mut WebSocket,
    ) -> anyhow::Result<()> {
        let entries = match state
            .mailbox
            .after(self.channel, self.address, self.seq, self.limit)
            .await
        {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the mailbox for a socket");
                return Ok(());
            }
        };
        push(state, socket, &entries).await?;
        if let Some(last) = entries.last() {
            self.seq = last.seq;
        }
        Ok(())
    }
}

/// Send `entries` in order, then mark them pushed in one statement.
async fn push(
    state: &GatewayState,
    socket: &mut WebSocket,
    entries: &[MailboxEntry],
) -> anyhow::Result<()> {
    let mut sent = Vec::with_capacity(entries.len());
    let mut result = Ok(());
    for entry in entries {
        if let Err(e) = send(socket, &ServerFrame::reply(entry)).await {
            result = Err(e);
            break;
        }
        metrics::counter!("sb_gateway_chat_replies_pushed_total", "channel" => entry.channel.clone())
            .increment(1);
        sent.push(entry.seq);
    }
    // What was sent before a socket failed was handed over all the same.
    if let Err(e) = state.mailbox.mark_pushed(&sent).await {
        // Only the "not yet pushed" replay for a client without `since` depends on it.
        tracing::warn!(error = %e, entries = sent.len(), "could not mark replies pushed");
    }
    result
}

async fn send(socket: &mut WebSocket, frame: &ServerFrame) -> anyhow::Result<()> {
    let text = serde_json::to_string(frame)?;
    socket.send(Message::Text(text.into())).await?;
    Ok(())
}

/// A client's frame: stored and `accepted`, or the error it gets.
async fn receive(
    state: &GatewayState,
    channel: &'static str,
    user: &ChatUser,
    frame: &str,
) -> ServerFrame {
    if let Some(id) = chat::ping_id(frame) {
        return ServerFrame::Pong { id };
    }
    let refuse = |e: ApiError, id: Option<String>| {
        let Refused(e) = refused_on(channel, chat::PROVIDER, e);
        ServerFrame::error(&e, id)
    };
    let message = match chat::read_frame(
        frame,
        state.config.gateway.max_text_chars,
        state.config.chat.max_uploads_per_message,
    ) {
        Ok(m) => m,
        Err(e) => return refuse(e, None),
    };
    if let Err(e) = check_agent(&state.config, &message.agent) {
        return refuse(e, Some(message.id));
    }
    if !message.attachments.is_empty() {
        // Only the sender's own uploads: an id someone else was given names nothing here.
        let store = crate::uploads::UploadStore::new(state.db.clone());
        match store.not_owned(&user.sub, &message.attachments).await {
            Ok(missing) if missing.is_empty() => {}
            Ok(missing) => {
                let e = ApiError::bad_request(
                    "unknown_upload",
                    format!(
                        "no upload {} of yours: name the ids POST /chat/uploads answered you \
                         (uploads are kept {} s)",
                        missing[0], state.config.chat.upload_retention_s
                    ),
                );
                return refuse(e, Some(message.id));
            }
            Err(e) => {
                tracing::error!(error = %e, "could not look uploads up");
                let e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the message could not be taken; send it again",
                );
                return ServerFrame::error(&e, Some(message.id));
            }
        }
    }
    let received = Received {
        provider_message_id: client_message_key(&user.sub, &message.id),
        sender: user.sub.clone(),
        recipient: channel.to_string(),
        text: message.text,
        media_urls: Vec::new(),
        agent: message.agent,
    };
    let mut accept = Accept::new(channel, chat::PROVIDER, received);
    accept.uploads = message
        .attachments
        .iter()
        .map(ToString::to_string)
        .collect();
    accept.asserted = Some(Person {
        person_id: format!("user:{}", user.sub),
        person_type: "user".into(),
        name: user.name.clone(),
        role: user.role.clone(),
        email: user.email.clone(),
    });
    match publish(state, accept).await {
        Ok(Published::Stored(correlation_id)) => ServerFrame::Accepted {
            id: message.id,
            correlation_id: correlation_id.to_string(),
        },
        // The client is told each time: this message was not taken, it may send it again.
        Ok(Published::Limited(limited)) => ServerFrame::error(
            &limited.error(state.config.rate_limit.per_sender_per_minute),
            Some(message.id),
        ),
        Err(Refused(e)) => ServerFrame::error(&e, Some(message.id)),
    }
}
