//! The demo parts of `switchboard up` (`demo.enabled = true`): an agent runner that answers
//! without any engine, and an outbox that keeps sent SMS in memory, reached through Twilio's and
//! TextMagic's send APIs and listed through their message lists (which the deliverer asks
//! before sending again a part whose earlier attempt may have gone out), and a receiver of
//! signed generic webhook callbacks (`/demo/webhook/<source>`) that files them in the same
//! outbox. All speak the real wire formats, so the product path is the same as in production.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use switchboard_channels::generic;
use switchboard_channels::textmagic::textmagic_number;
use switchboard_kit::config::{Config, TextMagicConfig, TwilioConfig, WebhookSourceConfig};

#[derive(Clone, Serialize)]
pub struct OutboxMessage {
    /// Which send API took it: `twilio`, `textmagic` or `generic` (a webhook callback).
    pub provider: &'static str,
    pub sid: String,
    pub to: String,
    pub from: String,
    pub body: String,
    pub sent_at: String,
    #[serde(skip)]
    created: DateTime<Utc>,
}

#[derive(Clone)]
struct DemoState {
    twilio: TwilioConfig,
    textmagic: TextMagicConfig,
    webhooks: std::collections::BTreeMap<String, WebhookSourceConfig>,
    outbox: Arc<Mutex<Vec<OutboxMessage>>>,
    turns: Arc<Mutex<HashMap<String, u32>>>,
    /// The last prompt the demo engine was given, to show what an agent sees (memory, summary,
    /// recall around the person's message).
    last_prompt: Arc<Mutex<Option<String>>>,
}

pub fn router(config: &Config) -> Router {
    let state = DemoState {
        twilio: config.twilio.clone(),
        textmagic: config.textmagic.clone(),
        webhooks: config.webhooks.clone(),
        outbox: Default::default(),
        turns: Default::default(),
        last_prompt: Default::default(),
    };
    Router::new()
        .route("/demo/runner/run", post(run))
        .route("/demo/runner/last-prompt", get(last_prompt))
        .route(
            "/demo/twilio/2010-04-01/Accounts/{account}/Messages.json",
            post(send_sms).get(list_sms),
        )
        .route(
            "/demo/textmagic/api/v2/messages",
            post(send_textmagic).get(list_textmagic),
        )
        .route("/demo/webhook/{source}", post(receive_callback))
        .route("/demo/outbox", get(outbox))
        .with_state(state)
}

#[derive(Deserialize)]
struct RunRequest {
    agent: String,
    prompt: String,
    session_id: Option<String>,
}

async fn run(State(s): State<DemoState>, Json(req): Json<RunRequest>) -> impl IntoResponse {
    let session_id = req
        .session_id
        .unwrap_or_else(|| format!("demo-{}", uuid::Uuid::new_v4()));
    let turn = {
        let mut turns = s.turns.lock().expect("lock");
        let n = turns.entry(session_id.clone()).or_insert(0);
        *n += 1;
        *n
    };
    *s.last_prompt.lock().expect("lock") = Some(req.prompt.clone());
    let said = switchboard_dispatch::prompt::fenced_text(&req.prompt).unwrap_or("");
    let text = format!(
        "{} (demo engine): you said \"{said}\". Turn {turn} of engine session {session_id}.",
        req.agent
    );
    Json(serde_json::json!({
        "text": text,
        "session_id": session_id,
        "processing_ms": 1,
        "tool_calls_count": 0,
    }))
}

/// The whole prompt of the demo engine's last turn, as plain text (404 before the first).
async fn last_prompt(State(s): State<DemoState>) -> impl IntoResponse {
    match s.last_prompt.lock().expect("lock").clone() {
        Some(prompt) => (StatusCode::OK, prompt),
        None => (
            StatusCode::NOT_FOUND,
            "the demo engine has run no turn yet\n".into(),
        ),
    }
}

#[derive(Deserialize)]
struct SendForm {
    #[serde(rename = "To")]
    to: String,
    #[serde(rename = "From", default)]
    from: String,
    #[serde(rename = "Body")]
    body: String,
}

/// Twilio's 401 unless the request carries the configured account's Basic credentials.
fn twilio_auth(
    s: &DemoState,
    account: &str,
    headers: &HeaderMap,
) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            s.twilio.account_sid,
            s.twilio.auth_token.expose()
        ))
    );
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if account != s.twilio.account_sid || auth != expected {
        return Err((
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({"code": 20003, "message": "Authenticate", "status": 401})),
        ));
    }
    Ok(())
}

async fn send_sms(
    State(s): State<DemoState>,
    Path(account): Path<String>,
    headers: HeaderMap,
    Form(form): Form<SendForm>,
) -> impl IntoResponse {
    if let Err(refused) = twilio_auth(&s, &account, &headers) {
        return refused;
    }
    let created = Utc::now();
    let msg = OutboxMessage {
        provider: "twilio",
        sid: format!("SM{}", uuid::Uuid::new_v4().simple()),
        to: form.to,
        from: form.from,
        body: form.body,
        sent_at: created.to_rfc3339(),
        created,
    };
    tracing::info!(to = %msg.to, chars = msg.body.chars().count(), "demo outbox: SMS sent");
    s.outbox.lock().expect("lock").push(msg.clone());
    (
        StatusCode::CREATED,
        Json(
            serde_json::json!({"sid": msg.sid, "to": msg.to, "from": msg.from, "body": msg.body, "status": "queued"}),
        ),
    )
}

#[derive(Deserialize)]
struct TwilioListQuery {
    #[serde(rename = "To")]
    to: Option<String>,
    #[serde(rename = "From")]
    from: Option<String>,
    #[serde(rename = "DateSent>")]
    date_sent_after: Option<chrono::NaiveDate>,
}

/// Twilio's Messages list: what the outbox took through Twilio, most recent first, filtered by
/// `To`, `From` and `DateSent>=`; one page (a demo outbox stays small).
async fn list_sms(
    State(s): State<DemoState>,
    Path(account): Path<String>,
    headers: HeaderMap,
    Query(q): Query<TwilioListQuery>,
) -> impl IntoResponse {
    if let Err(refused) = twilio_auth(&s, &account, &headers) {
        return refused;
    }
    let rfc2822 = |t: DateTime<Utc>| t.format("%a, %d %b %Y %H:%M:%S %z").to_string();
    let messages: Vec<_> = s
        .outbox
        .lock()
        .expect("lock")
        .iter()
        .rev()
        .filter(|m| m.provider == "twilio")
        .filter(|m| q.to.as_ref().is_none_or(|t| &m.to == t))
        .filter(|m| q.from.as_ref().is_none_or(|f| &m.from == f))
        .filter(|m| {
            q.date_sent_after
                .is_none_or(|d| m.created.date_naive() >= d)
        })
        .map(|m| {
            serde_json::json!({
                "sid": m.sid, "account_sid": account, "to": m.to, "from": m.from, "body": m.body,
                "status": "sent", "direction": "outbound-api",
                "date_created": rfc2822(m.created), "date_sent": rfc2822(m.created),
            })
        })
        .collect();
    (
        StatusCode::OK,
        Json(serde_json::json!({"messages": messages, "page": 0, "next_page_uri": null})),
    )
}

#[derive(Deserialize)]
struct TextMagicMessage {
    text: String,
    phones: String,
    #[serde(default)]
    from: String,
}

/// TextMagic's `POST /api/v2/messages`: `X-TM-Username`/`X-TM-Key`, JSON, 201 with ids.
/// TextMagic's 401 unless the request carries the configured username and key.
fn textmagic_auth(
    s: &DemoState,
    headers: &HeaderMap,
) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    if header("x-tm-username") != s.textmagic.username
        || header("x-tm-key") != s.textmagic.api_key.expose()
    {
        return Err((
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({"code": 401, "message": "Unauthorized"})),
        ));
    }
    Ok(())
}

async fn send_textmagic(
    State(s): State<DemoState>,
    headers: HeaderMap,
    Json(m): Json<TextMagicMessage>,
) -> impl IntoResponse {
    if let Err(refused) = textmagic_auth(&s, &headers) {
        return refused;
    }
    let mut outbox = s.outbox.lock().expect("lock");
    let created = Utc::now();
    let id = 49_575_710 + outbox.len();
    let msg = OutboxMessage {
        provider: "textmagic",
        sid: id.to_string(),
        to: m.phones,
        from: m.from,
        body: m.text,
        sent_at: created.to_rfc3339(),
        created,
    };
    tracing::info!(to = %msg.to, chars = msg.body.chars().count(), "demo outbox: TextMagic SMS sent");
    outbox.push(msg);
    (
        StatusCode::CREATED,
        Json(
            serde_json::json!({"id": id, "href": format!("/api/v2/sessions/{id}"),
            "type": "message", "sessionId": id, "messageId": id}),
        ),
    )
}

#[derive(Deserialize)]
struct TextMagicListQuery {
    page: Option<usize>,
    limit: Option<usize>,
}

/// TextMagic's outbound message list: what the outbox took through TextMagic, newest first,
/// by `page` and `limit`.
async fn list_textmagic(
    State(s): State<DemoState>,
    headers: HeaderMap,
    Query(q): Query<TextMagicListQuery>,
) -> impl IntoResponse {
    if let Err(refused) = textmagic_auth(&s, &headers) {
        return refused;
    }
    let (page, limit) = (
        q.page.unwrap_or(1).max(1),
        q.limit.unwrap_or(10).clamp(1, 1000),
    );
    let sent: Vec<OutboxMessage> = s
        .outbox
        .lock()
        .expect("lock")
        .iter()
        .rev()
        .filter(|m| m.provider == "textmagic")
        .cloned()
        .collect();
    let resources: Vec<_> = sent
        .iter()
        .skip((page - 1) * limit)
        .take(limit)
        .map(|m| {
            serde_json::json!({
                "id": m.sid.parse::<u64>().unwrap_or_default(), "receiver": m.to,
                "sender": m.from, "text": m.body, "status": "d",
                "messageTime": m.created.format("%Y-%m-%dT%H:%M:%S%z").to_string(),
            })
        })
        .collect();
    (
        StatusCode::OK,
        Json(serde_json::json!({
            "page": page, "limit": limit, "pageCount": sent.len().div_ceil(limit).max(1),
            "resources": resources,
        })),
    )
}

#[derive(Deserialize)]
struct Callback {
    to: String,
    text: String,
}

/// A generic webhook source's callback receiver, as a source would write one: checks the
/// signature with the source's secret and the timestamp window, drops a delivery it already
/// took (`X-Switchboard-Delivery`), and files the reply in the outbox.
async fn receive_callback(
    State(s): State<DemoState>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some((config, key)) = s
        .webhooks
        .get(&source)
        .and_then(|c| Some((c, c.signing_key()?)))
    else {
        return (StatusCode::NOT_FOUND, "no such source with a secret");
    };
    if let Err(e) = generic::webhook::check_signature(
        key,
        config.timestamp_window_s,
        header(generic::TIMESTAMP_HEADER),
        header(generic::SIGNATURE_HEADER),
        &body,
        Utc::now(),
    ) {
        return (StatusCode::UNAUTHORIZED, e.code());
    }
    let Ok(callback) = serde_json::from_slice::<Callback>(&body) else {
        return (StatusCode::BAD_REQUEST, "not a reply callback");
    };
    let delivery = header(generic::DELIVERY_HEADER).unwrap_or_default();
    let mut outbox = s.outbox.lock().expect("lock");
    if outbox
        .iter()
        .any(|m| m.provider == "generic" && m.sid == delivery)
    {
        return (StatusCode::OK, "already taken");
    }
    let created = Utc::now();
    tracing::info!(%source, chars = callback.text.chars().count(), "demo outbox: webhook callback received");
    outbox.push(OutboxMessage {
        provider: "generic",
        sid: delivery.to_string(),
        to: callback.to,
        from: source,
        body: callback.text,
        sent_at: created.to_rfc3339(),
        created,
    });
    (StatusCode::OK, "ok")
}

#[derive(Deserialize)]
struct OutboxQuery {
    to: Option<String>,
}

async fn outbox(State(s): State<DemoState>, Query(q): Query<OutboxQuery>) -> impl IntoResponse {
    let all = s.outbox.lock().expect("lock").clone();
    let filtered: Vec<OutboxMessage> = all
        .into_iter()
        // TextMagic writes numbers without `+`: compare digits.
        .filter(|m| {
            q.to.as_ref()
                .is_none_or(|t| textmagic_number(&m.to) == textmagic_number(t))
        })
        .collect();
    Json(filtered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_channels::textmagic::TextMagicSender;
    use switchboard_channels::twilio::TwilioSender;
    use switchboard_kit::config::Secret;

    #[tokio::test]
    async fn the_outbox_lists_what_it_took_as_each_provider_lists_its_messages() {
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let mut config = Config::default();
        config.twilio.account_sid = "ACdemo".into();
        config.twilio.auth_token = Secret::new("demo-token");
        config.twilio.from_number = "+15555550199".into();
        config.twilio.api_base = format!("{base}/demo/twilio");
        config.textmagic.username = "demo".into();
        config.textmagic.api_key = Secret::new("demo-key");
        config.textmagic.from_number = "447624800500".into();
        config.textmagic.api_base = format!("{base}/demo/textmagic");
        let app = router(&config);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let since = Utc::now();

        // What the deliverer asks before sending again a part of unknown outcome.
        let twilio = TwilioSender::new(config.twilio.clone());
        let sid = twilio.send_body("+14155550100", "", "hi").await.unwrap();
        let found = twilio.find_body("+14155550100", "", "hi", since).await;
        assert_eq!(found, Ok(vec![sid]));
        let other = twilio.find_body("+14155550100", "", "bye", since).await;
        assert_eq!(other, Ok(vec![]));

        let textmagic = TextMagicSender::new(config.textmagic.clone());
        let id = textmagic
            .send_text("+447860021130", "", "hi")
            .await
            .unwrap();
        let found = textmagic.find_text("+447860021130", "", "hi", since).await;
        assert_eq!(found, Ok(vec![id]));
        let other = textmagic.find_text("+447860021131", "", "hi", since).await;
        assert_eq!(other, Ok(vec![]));
    }

    #[tokio::test]
    async fn the_demo_receiver_takes_a_signed_callback_once_and_refuses_a_forged_one() {
        use switchboard_channels::generic::GenericWebhookSender;
        use switchboard_channels::{Egress, OutboundPart, SendError};
        use switchboard_kit::config::WebhookSourceConfig;
        use switchboard_kit::proto::Reply;

        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let source = |secret: &str| WebhookSourceConfig {
            secret: Secret::new(secret),
            sender_field: "user.id".into(),
            callback_url: format!("{base}/demo/webhook/demo"),
            ..Default::default()
        };
        let mut config = Config::default();
        config.webhooks.insert("demo".into(), source("demo-secret"));
        let app = router(&config);
        tokio::spawn(async move { axum::serve(listener, app).await });

        let reply = Reply {
            id: "0193-reply".into(),
            provider_message_id: switchboard_channels::client_message_key("demo:u-1", "evt-1"),
            recipient: "demo:u-1".into(),
            reply_from: "demo".into(),
            ..Default::default()
        };
        let part = OutboundPart::new(&reply, 0, "hello back");
        let sender = GenericWebhookSender::new(config.webhooks.clone());
        assert_eq!(sender.send(part).await, Ok("0193-reply:0".to_string()));
        assert_eq!(sender.send(part).await, Ok("0193-reply:0".to_string()));
        let mut forged = config.webhooks.clone();
        forged.insert("demo".into(), source("not-the-secret"));
        let refused = GenericWebhookSender::new(forged).send(part).await;
        assert!(matches!(refused, Err(SendError::Unavailable(e)) if e.contains("401")));

        let outbox: Vec<serde_json::Value> = reqwest::get(format!("{base}/demo/outbox"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(outbox.len(), 1, "the redelivery was dropped: {outbox:?}");
        assert_eq!(outbox[0]["provider"], "generic");
        assert_eq!(outbox[0]["to"], "u-1");
        assert_eq!(outbox[0]["body"], "hello back");
    }
}
