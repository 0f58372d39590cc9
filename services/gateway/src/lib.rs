//! The gateway: authenticates channel requests, normalises them into `InboundMessage`s,
//! publishes them durably, and only then answers the channel.
//!
//! It knows no provider: every webhook of the app's `switchboard_channels::Channels` is mounted on its
//! route and handled the same way (see [`receive_webhook`]). Chat sockets ([`chat`]) and the
//! REST API ([`api`]) are the channels whose far end is a client of ours: their replies come
//! back through the mailbox, which [`hub`] follows.
pub mod analytics_api;
pub mod api;
pub mod chat;
pub mod console;
pub mod escalations_api;
pub mod exports_api;
pub mod forget_api;
pub mod hub;
pub mod identity_api;
pub mod memory_api;
pub mod outbound_api;
mod query_params;
pub mod search_api;
pub mod sessions_api;
pub mod uploads;
pub mod wakeups_api;
pub mod widget;

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchboard_channels::api::ApiKeys;
use switchboard_channels::chat::ChatTokens;
use switchboard_channels::{
    Channels, Mailbox, OutboundPart, Received, Senders, Webhook, WebhookRequest,
};
use switchboard_kit::arrival::{Admission, ArrivalCounter};
use switchboard_kit::config::Config;
use switchboard_kit::proto::{DeadLetter, InboundMessage, Person, Reply};
use switchboard_kit::runtime::{Output, Runtime};
use switchboard_kit::shutdown::Shutdown;
use switchboard_kit::startup::{App, Task};
use uuid::Uuid;

pub use switchboard_channels::ApiError;

#[derive(Clone)]
pub struct GatewayState {
    pub config: Arc<Config>,
    pub runtime: Runtime,
    /// Numbers each sender's messages in the order they were accepted.
    pub arrivals: ArrivalCounter,
    /// Chat token verification; `None` when chat is not configured.
    pub chat_tokens: Option<Arc<ChatTokens>>,
    pub api_keys: ApiKeys,
    pub mailbox: Mailbox,
    /// The sockets and waiting requests this replica holds.
    pub hub: Arc<hub::Hub>,
    pub db: sqlx::PgPool,
    pub shutdown: Shutdown,
    /// The channel adapters whose webhooks are mounted.
    pub channels: Channels,
    /// The providers' senders, for the one notice a rate-limited SMS sender gets.
    pub senders: Senders,
    /// Verifies the turn tokens agents call the API with.
    pub turn_tokens: switchboard_kit::turn_token::TurnTokenKeys,
    /// Verifies the links to the files agents leave for people (`/api/v1/exports/…`).
    pub export_links: switchboard_kit::exports::ExportLinkKeys,
    /// Set only on the ops console's copy of the state, when `console.jwt_roles` is: a JWT with
    /// one of these roles and the console's audience signs in as an operator ([`console`]);
    /// the public routes never take one.
    pub console_jwts: Option<Arc<console::ConsoleJwts>>,
}

impl GatewayState {
    /// The gateway's state from `app`; an invalid chat key configuration is an error here, at
    /// start, not a refusal of every socket later.
    pub fn new(app: &App) -> anyhow::Result<Self> {
        let runtime = app.runtime();
        let arrivals = ArrivalCounter::new(runtime.js.clone(), &runtime.topology);
        let chat_tokens = ChatTokens::from_config(&app.config.chat)?.map(Arc::new);
        let channels = Channels::of(app);
        Ok(Self {
            config: app.config.clone(),
            arrivals,
            chat_tokens,
            api_keys: ApiKeys::new(app.db.clone()),
            mailbox: Mailbox::new(
                switchboard_kit::db::connect_lazy(
                    &app.config.database_url,
                    app.config.gateway.mailbox_pool_size,
                )?,
                app.nats.clone(),
                app.topology.mailbox(),
            ),
            hub: Arc::default(),
            db: app.db.clone(),
            shutdown: app.shutdown.clone(),
            senders: channels.senders(&app.config),
            channels,
            turn_tokens: switchboard_kit::turn_token::TurnTokenKeys::new(
                app.db.clone(),
                app.config.gateway.turn_token_secret.clone(),
            ),
            export_links: switchboard_kit::exports::ExportLinkKeys::new(
                app.db.clone(),
                &app.config,
            ),
            console_jwts: None,
            runtime,
        })
    }

    /// The task that hands the mailbox's announcements to this replica's sockets and waiters,
    /// and deletes chat uploads and exported files past their retention.
    pub fn follower(&self) -> Task {
        let follow = hub::follow(
            self.hub.clone(),
            self.mailbox.nats().clone(),
            self.mailbox.announcements(),
            self.shutdown.clone(),
        );
        let uploads = uploads::prune_expired(
            uploads::UploadStore::new(self.db.clone()),
            std::time::Duration::from_secs(self.config.chat.upload_retention_s),
            self.shutdown.clone(),
        );
        let exports = exports_api::prune_expired(
            self.db.clone(),
            std::time::Duration::from_secs(self.config.workspace.export_ttl_s),
            self.shutdown.clone(),
        );
        let prune = async move {
            tokio::join!(uploads, exports);
        };
        Box::pin(async move {
            // Pruning ends only at shutdown; following ends then too, or with its error.
            tokio::pin!(follow);
            tokio::select! {
                followed = &mut follow => followed,
                () = prune => follow.await,
            }
        })
    }
}

/// A refused request, answered as `{"error": {"code", "message"}}` with its status.
#[derive(Debug)]
pub struct Refused(pub ApiError);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0.status(), axum::Json(self.0.body())).into_response()
    }
}

/// Count and log a refusal by channel, provider and reason.
fn refused(hook: &dyn Webhook, e: ApiError) -> Refused {
    refused_on(hook.channel(), hook.provider(), e)
}

/// Count and log a refusal on `channel` through `provider`.
pub fn refused_on(channel: &'static str, provider: &'static str, e: ApiError) -> Refused {
    metrics::counter!(
        "sb_gateway_rejected_total",
        "channel" => channel,
        "reason" => e.code(),
        "provider" => provider
    )
    .increment(1);
    tracing::info!(
        channel,
        provider,
        code = e.code(),
        status = e.status().as_u16(),
        "request rejected"
    );
    Refused(e)
}

pub fn router(state: GatewayState) -> Router {
    let mut router = Router::new();
    for hook in state.channels.webhooks(&state.config) {
        let route = hook.route();
        router = router.route(
            route,
            post(
                move |state: State<GatewayState>,
                      uri: OriginalUri,
                      headers: HeaderMap,
                      body: Body| {
                    receive_webhook(state, hook.clone(), uri, headers, body)
                },
            ),
        );
    }
    router
        .route("/webhooks/{*rest}", axum::routing::any(unknown_webhook))
        .merge(chat::routes())
        .merge(uploads::routes())
        .merge(widget::routes())
        .merge(api::routes())
        .merge(identity_api::routes())
        .merge(outbound_api::routes())
        .merge(sessions_api::routes())
        .merge(memory_api::routes())
        .merge(search_api::routes())
        .merge(analytics_api::routes())
        .merge(forget_api::routes())
        .merge(wakeups_api::routes())
        .merge(exports_api::routes())
        .merge(escalations_api::routes())
        // A server span per request, the root of a turn's trace (a caller's traceparent is
        // linked, not continued: this is the public edge), which the published message
        // carries on.
        .route_layer(axum::middleware::from_fn(switchboard_kit::trace::edge_span))
        .with_state(state)
}

/// A webhook path no adapter serves: 400 naming the unknown channel, or 404 when the channel is
/// known but the path is not one of its routes (a provider configured with a wrong URL).
async fn unknown_webhook(
    State(state): State<GatewayState>,
    OriginalUri(uri): OriginalUri,
) -> Refused {
    let first = uri
        .path()
        .trim_start_matches("/webhooks/")
        .split('/')
        .next()
        .unwrap_or("");
    let known: Vec<&str> = state
        .channels
        .adapters()
        .iter()
        .filter(|a| a.webhook.is_some())
        .map(|a| a.provider)
        .collect();
    let e = if known.contains(&first) {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{first} posts to another path; see the channel's documentation"),
        )
    } else {
        let shown: String = first.chars().filter(|c| !c.is_control()).take(40).collect();
        ApiError::bad_request(
            "unknown_channel",
            format!("no channel {shown:?}; webhooks: {}", known.join(", ")),
        )
    };
    refused_on("unknown", "unknown", e)
}

/// Any channel's webhook: read and authenticate it (the adapter), number the sender's message,
/// publish it durably, then acknowledge. A failure to store answers 503, so the provider
/// retries; its retry carries the same provider message id and becomes the same turn.
async fn receive_webhook(
    State(state): State<GatewayState>,
    hook: Arc<dyn Webhook>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    let cfg = &state.config;
    let body = read_body(&headers, body, cfg.gateway.max_body_bytes)
        .await
        .map_err(|e| refused(hook.as_ref(), e))?;
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!(
        "{}{}",
        cfg.gateway.public_url.trim_end_matches('/'),
        path_and_query
    );
    let request = WebhookRequest {
        url: &url,
        path: uri.path(),
        headers: &headers,
        body: &body,
        now: chrono::Utc::now(),
    };
    let received = hook
        .receive(&request)
        .map_err(|e| refused(hook.as_ref(), e))?;
    let message = Accept::new(hook.channel(), hook.provider(), received);
    if let Published::Limited(limited) = publish(&state, message).await? {
        // The provider is answered as usual (it must not retry); the message is kept as a dead
        // letter and the sender told, once a minute.
        rate_limited(&state, limited).await?;
    }
    let ack = hook.ack();
    Ok(([(header::CONTENT_TYPE, ack.content_type)], ack.body).into_response())
}

/// The request body, at most `limit` bytes. A request that declares a longer body is refused
/// before any of it is read; one that sends more than it may (chunked, or lying) is cut off at
/// the limit. Either way 413, answered as JSON and counted like any refusal.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let length_limit = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if length_limit {
            too_large()
        } else {
            ApiError::bad_request("bad_request", format!("reading the body: {e}"))
        }
    })
}

/// A message a channel authenticated and read, ready to be numbered and published.
pub(crate) struct Accept {
    pub channel: Cow<'static, str>,
    pub provider: Cow<'static, str>,
    pub received: Received,
    /// Who the channel authenticated the sender as (chat, API).
    pub asserted: Option<Person>,
    /// The message's id and correlation id (else a new one): an API request retried with its
    /// Idempotency-Key keeps the id it was first given.
    pub id: Option<Uuid>,
    /// Set for a message the agent starts (`POST /api/v1/outbound`): its text, sent as the
    /// turn's reply. Such a message is not the person's, so it is not numbered among theirs
    /// (it holds no one's order) nor counted against their rate limit.
    pub outbound_text: String,
    /// Upload ids the message names (chat), checked to be the sender's.
    pub uploads: Vec<String>,
}

impl Accept {
    pub fn new(
        channel: impl Into<Cow<'static, str>>,
        provider: impl Into<Cow<'static, str>>,
        received: Received,
    ) -> Self {
        Self {
            channel: channel.into(),
            provider: provider.into(),
            received,
            asserted: None,
            id: None,
            outbound_text: String::new(),
            uploads: Vec::new(),
        }
    }
}

/// What became of an accepted message.
pub(crate) enum Published {
    /// Stored; its correlation id.
    Stored(Uuid),
    /// Over the sender's rate limit: not stored for answering.
    Limited(Box<Limited>),
}

pub(crate) struct Limited {
    pub inbound: InboundMessage,
    /// The one limited message per sender and minute whose sender is told.
    pub first: bool,
    pub retry_after: std::time::Duration,
}

impl Limited {
    /// What chat and API callers are told (429).
    pub fn error(&self, per_minute: u32) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {per_minute} messages in a minute from this sender; this one was not \
                 taken: send it again in {} s",
                self.retry_after.as_secs().max(1)
            ),
        )
    }
}

/// 503: the message could not be stored. Providers retry on it; a retry of the same message id
/// gets the same number and is deduplicated downstream.
fn not_stored(
    channel: Cow<'static, str>,
    provider: &str,
    what: &str,
    e: &dyn std::fmt::Display,
) -> Refused {
    tracing::error!(error = %e, provider, "could not {what}");
    metrics::counter!("sb_gateway_unavailable_total", "channel" => channel).increment(1);
    Refused(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "message could not be stored; retry",
    ))
}

/// Number the message among its sender's and publish it; its correlation id once stored.
pub(crate) async fn publish(state: &GatewayState, message: Accept) -> Result<Published, Refused> {
    let Accept {
        channel,
        provider,
        received,
        asserted,
        id,
        outbound_text,
        uploads,
    } = message;
    let unavailable =
        |what: &str, e: &dyn std::fmt::Display| not_stored(channel.clone(), &provider, what, e);
    let message_id = received.provider_message_id;
    // Unnumbered (0) for an agent-started or a rate-limited message (whose replayed dead letter
    // is answered without holding anyone's order).
    let unnumbered = switchboard_kit::arrival::Arrival { epoch: 0, seq: 0 };
    let (arrival, limited) = if !outbound_text.is_empty() {
        (unnumbered, None)
    } else {
        match state
            .arrivals
            .admit(
                &channel,
                &received.sender,
                &message_id,
                state.config.rate_limit.per_sender_per_minute,
            )
            .await
            .map_err(|e| unavailable("number the inbound message", &e))?
        {
            Admission::Accepted(arrival) => (arrival, None),
            Admission::Limited { first, retry_after } => (unnumbered, Some((first, retry_after))),
        }
    };
    let id = id.unwrap_or_else(Uuid::now_v7);
    switchboard_kit::trace::record("correlation_id", id);
    let inbound = InboundMessage {
        id: id.to_string(),
        channel: channel.to_string(),
        provider: provider.to_string(),
        sender: received.sender,
        recipient: received.recipient,
        text: received.text,
        provider_message_id: message_id.clone(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id.to_string(),
        agent: received.agent,
        media_urls: received.media_urls,
        arrival_seq: arrival.seq,
        arrival_epoch: arrival.epoch,
        asserted,
        outbound_text,
        // The gateway takes what people send; schedules are fired by dispatch.
        scheduled: String::new(),
        uploads,
        heartbeat: false,
        wakeup: None,
    };
    if let Some((first, retry_after)) = limited {
        metrics::counter!("sb_gateway_rate_limited_total", "channel" => channel.clone())
            .increment(1);
        tracing::info!(correlation_id = %id, %provider, first, "sender over the rate limit");
        return Ok(Published::Limited(Box::new(Limited {
            inbound,
            first,
            retry_after,
        })));
    }
    // The arrival number is part of the dedupe id: a retry that got the same number is dropped
    // by JetStream, one that got a new number (another message came in between) must reach the
    // session stage, which maps it to the original turn and moves the sender's cursor past it.
    // A message without a provider id (an agent-started one) is known by its own id.
    let key = if message_id.is_empty() {
        &inbound.id
    } else {
        &message_id
    };
    let out = Output::new(
        state
            .runtime
            .topology
            .inbound_from(&channel, &inbound.sender),
        format!("{provider}:{key}:{}.{}", arrival.epoch, arrival.seq),
        &inbound,
    )
    .correlated(inbound.correlation_id.clone());
    state
        .runtime
        .publish("gateway", &out)
        .await
        .map_err(|e| unavailable("store the inbound message", &e))?;
    metrics::counter!(
        "sb_gateway_accepted_total",
        "channel" => channel,
        "provider" => provider.clone()
    )
    .increment(1);
    tracing::info!(correlation_id = %id, %provider, "accepted");
    Ok(Published::Stored(id))
}

/// A rate-limited message acknowledged to its provider: kept as a dead letter (replayable by an
/// operator, with the reason), and, for the first such message of the minute, the sender told
/// through the provider's send API. A failure to store the dead letter answers 503, so the
/// provider retries and nothing acknowledged is lost.
async fn rate_limited(state: &GatewayState, limited: Box<Limited>) -> Result<(), Refused> {
    let inbound = &limited.inbound;
    let letter = DeadLetter {
        stage: "gateway".into(),
        subject: state.runtime.topology.inbound(&inbound.channel),
        error: format!(
            "rate limited: more than {} messages in a minute from this sender (rate_limit.per_sender_per_minute); replay to answer it",
            state.config.rate_limit.per_sender_per_minute
        ),
        delivery_count: 0,
        payload: prost::Message::encode_to_vec(inbound),
        message_type: <InboundMessage as prost::Name>::full_name(),
        correlation_id: inbound.correlation_id.clone(),
        failed_at_ms: switchboard_kit::now_ms(),
        stream_sequence: 0,
    };
    let out = Output::new(
        state.runtime.topology.dead_letter("gateway"),
        format!(
            "limited:{}:{}",
            inbound.provider, inbound.provider_message_id
        ),
        &letter,
    )
    .correlated(inbound.correlation_id.clone());
    state.runtime.publish("gateway", &out).await.map_err(|e| {
        not_stored(
            inbound.channel.clone().into(),
            &inbound.provider,
            "store a rate-limited message",
            &e,
        )
    })?;
    if limited.first
        && let Some(sender) = state.senders.get(&inbound.provider).cloned()
    {
        let notice = Reply {
            id: Uuid::now_v7().to_string(),
            channel: inbound.channel.clone(),
            provider: inbound.provider.clone(),
            recipient: inbound.sender.clone(),
            reply_from: inbound.recipient.clone(),
            text: state.config.rate_limit.notice.clone(),
            correlation_id: inbound.correlation_id.clone(),
            ..Default::default()
        };
        // Told in the background: the provider's answer does not wait for our send.
        tokio::spawn(async move {
            let part = OutboundPart::new(&notice, 0, &notice.text);
            if let Err(e) = sender.send(part).await {
                tracing::warn!(error = %e, "could not tell a sender they are rate-limited");
            }
        });
    }
    Ok(())
}

/// 400 unless `agent` is empty (the channel's default) or a configured agent.
pub(crate) fn check_agent(config: &Config, agent: &str) -> Result<(), ApiError> {
    if agent.is_empty() || config.agents.iter().any(|a| a.name == agent) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "unknown_agent",
            format!("no agent is named {agent:?}"),
        ))
    }
}
