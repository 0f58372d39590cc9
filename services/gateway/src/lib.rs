//! The gateway: authenticates channel requests, normalises them into `InboundMessage`s,
//! publishes them durably, and only then answers the channel.
//!
//! It knows no provider: every webhook of the app's `switchboard_channels::Channels` is mounted on its
//! route and handled the same way (see [`receive_webhook`]). Chat sockets ([`chat`]) and the
//! REST API ([`api`]) are the channels whose far end is a client of ours: their replies come
//! back through the mailbox, which [`hub`] follows.
pub mod analytics_api;
pub mod api;
pub mod auth;
pub mod chat;
pub mod console;
pub mod escalations_api;
pub mod exports_api;
pub mod forget_api;
pub mod hub;
pub mod identity_api;
mod ingest;
pub mod memory_api;
pub mod outbound_api;
mod query_params;
pub mod refusal;
pub mod search_api;
pub mod sessions_api;
pub mod takeover_api;
pub mod uploads;
pub mod wakeups_api;
pub mod widget;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchboard_channels::api::ApiKeys;
use switchboard_channels::chat::ChatTokens;
use switchboard_channels::{Channels, Incoming, Mailbox, Senders, Webhook, WebhookRequest};
use switchboard_kit::arrival::ArrivalCounter;
use switchboard_kit::config::Config;
use switchboard_kit::runtime::Runtime;
use switchboard_kit::shutdown::Shutdown;
use switchboard_kit::startup::{App, Task};

use ingest::rate_limited;
pub(crate) use ingest::{Accept, Published, check_agent, publish, read_body};
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
        let handbacks =
            takeover_api::publish_stranded_handbacks(self.clone(), self.shutdown.clone());
        let prune = async move {
            tokio::join!(uploads, exports, handbacks);
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
        let asked = hook.clone();
        router = router.route(
            route,
            post(
                move |state: State<GatewayState>,
                      uri: OriginalUri,
                      headers: HeaderMap,
                      body: Body| {
                    receive_webhook(state, hook.clone(), uri, headers, body)
                },
            )
            .get(
                move |state: State<GatewayState>, uri: OriginalUri, headers: HeaderMap| {
                    webhook_handshake(state, asked.clone(), uri, headers)
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
        .merge(takeover_api::routes())
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

/// A provider's `GET` to a webhook route: its subscription handshake, answered by the adapter
/// (405 for one that makes none). Nothing is published.
async fn webhook_handshake(
    State(state): State<GatewayState>,
    hook: Arc<dyn Webhook>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Response, Refused> {
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!(
        "{}{}",
        state.config.gateway.public_url.trim_end_matches('/'),
        path_and_query
    );
    let request = WebhookRequest {
        url: &url,
        path: uri.path(),
        headers: &headers,
        body: &[],
        now: chrono::Utc::now(),
    };
    match hook.handshake(&request) {
        Some(Ok(answer)) => {
            Ok(([(header::CONTENT_TYPE, answer.content_type)], answer.body).into_response())
        }
        Some(Err(e)) => Err(refused(hook.as_ref(), e)),
        None => Err(refused(
            hook.as_ref(),
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this webhook takes POST",
            ),
        )),
    }
}

/// Keep a provider's delivery receipts before it is answered: a failure answers 503, and the
/// provider sends them again (a receipt kept twice is one row).
async fn keep_receipts(
    state: &GatewayState,
    hook: &dyn Webhook,
    receipts: &[switchboard_channels::Receipt],
) -> Result<(), Refused> {
    switchboard_kit::receipts::ReceiptStore::new(state.db.clone())
        .record(hook.provider(), receipts)
        .await
        .map_err(|e| {
            ingest::not_stored(
                hook.channel().into(),
                hook.provider(),
                "keep delivery receipts",
                &e,
            )
        })?;
    for receipt in receipts {
        metrics::counter!(
            "sb_delivery_receipts_total",
            "provider" => hook.provider(),
            "status" => receipt.status.as_str()
        )
        .increment(1);
        if receipt.status == switchboard_channels::ReceiptStatus::Failed {
            tracing::warn!(
                provider = hook.provider(),
                provider_message_id = %receipt.provider_message_id,
                error = %receipt.error,
                "the provider reports a message it took was not delivered"
            );
        }
    }
    Ok(())
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
    let messages = match hook
        .receive(&request)
        .map_err(|e| refused(hook.as_ref(), e))?
    {
        Incoming::Messages(messages) => messages,
        Incoming::Receipts { receipts, messages } => {
            keep_receipts(&state, hook.as_ref(), &receipts).await?;
            messages
        }
        Incoming::Answer(answer) => {
            return Ok(([(header::CONTENT_TYPE, answer.content_type)], answer.body).into_response());
        }
        Incoming::Ignored(reason) => {
            metrics::counter!(
                "sb_gateway_ignored_total",
                "channel" => hook.channel(),
                "provider" => hook.provider(),
                "reason" => reason
            )
            .increment(1);
            tracing::info!(
                channel = hook.channel(),
                provider = hook.provider(),
                reason,
                "webhook event acknowledged without a message"
            );
            Vec::new()
        }
    };
    // In the provider's order; a failure answers 503 and the provider sends the whole request
    // again: the messages already stored are known by their ids and become no second turn.
    for received in messages {
        let message = Accept::new(hook.channel(), hook.provider(), received);
        if let Published::Limited(limited) = publish(&state, message).await? {
            // The provider is answered as usual (it must not retry); the message is kept as a
            // dead letter and the sender told, once a minute.
            rate_limited(&state, limited).await?;
        }
    }
    let ack = hook.ack();
    Ok(([(header::CONTENT_TYPE, ack.content_type)], ack.body).into_response())
}
