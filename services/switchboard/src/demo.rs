//! The demo parts of `switchboard up` (`demo.enabled = true`): the shared fakes of
//! `switchboard-fakes` mounted in the product's own server — an agent runner that answers
//! without any engine (`/demo/runner`), Twilio's and TextMagic's send APIs and message lists
//! (`/demo/twilio`, `/demo/textmagic`; the deliverer asks the lists before sending again a part
//! whose earlier attempt may have gone out) and a generic webhook source's callback receiver
//! (`/demo/webhook/<source>`, checking each source's signature and window). What they took is
//! listed at `/demo/outbox`. All speak
//! the real wire formats, so the product path is the same as in production.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use switchboard_channels::slack::SlackSettings;
use switchboard_channels::telegram::TelegramSettings;
use switchboard_channels::textmagic::textmagic_number;
use switchboard_channels::whatsapp::WhatsAppSettings;
use switchboard_fakes::{
    CallbackRequest, FakeCallbackReceiver, FakeRunner, FakeSlack, FakeTelegram, FakeTextMagic,
    FakeTwilio, FakeWhatsApp, Provider, SendObserver, SentSms, SlackPosted, SlackUploaded,
    TelegramSent, WhatsAppSent,
};

/// The demo Slack workspace's id (what `switchboard send --channel slack` writes from).
pub const DEMO_SLACK_TEAM: &str = "T0DEMO001";
use switchboard_kit::config::Config;

#[derive(Clone, Serialize)]
pub struct OutboxMessage {
    /// Which send API took it: `twilio`, `textmagic`, `telegram`, `slack`, `whatsapp` or
    /// `generic` (a webhook callback).
    pub provider: &'static str,
    pub sid: String,
    pub to: String,
    pub from: String,
    pub body: String,
    pub sent_at: String,
    #[serde(skip)]
    created: DateTime<Utc>,
}

impl OutboxMessage {
    fn of_sms(sms: SentSms) -> Self {
        Self {
            provider: match sms.provider {
                Provider::Twilio => "twilio",
                Provider::TextMagic => "textmagic",
            },
            sid: sms.sid,
            to: sms.to,
            from: sms.from,
            body: sms.body,
            sent_at: sms.created.to_rfc3339(),
            created: sms.created,
        }
    }
}

impl OutboxMessage {
    fn of_whatsapp(m: WhatsAppSent) -> Self {
        Self {
            provider: "whatsapp",
            sid: m.wamid,
            to: m.wa_id,
            from: "business".into(),
            body: match &m.filename {
                Some(name) if m.text.is_empty() => format!("[{name}]"),
                _ => m.text,
            },
            sent_at: m.created.to_rfc3339(),
            created: m.created,
        }
    }

    fn of_slack(m: SlackPosted) -> Self {
        Self {
            provider: "slack",
            sid: m.ts,
            to: m.channel,
            from: "app".into(),
            body: m.text,
            sent_at: m.created.to_rfc3339(),
            created: m.created,
        }
    }

    /// A file the app shared (Slack's upload flow): the message that shares it.
    fn of_slack_upload(m: SlackUploaded) -> Self {
        Self {
            provider: "slack",
            sid: m.id,
            to: m.channel,
            from: "app".into(),
            body: if m.comment.is_empty() {
                format!("[{}]", m.name)
            } else {
                format!("{} [{}]", m.comment, m.name)
            },
            sent_at: m.created.to_rfc3339(),
            created: m.created,
        }
    }

    fn of_telegram(m: TelegramSent) -> Self {
        let body = match &m.upload {
            Some(file) if m.text.is_empty() => format!("[{}]", file.file_name),
            Some(file) => format!("{} [{}]", m.text, file.file_name),
            None => m.text,
        };
        Self {
            provider: "telegram",
            sid: m.message_id.to_string(),
            to: m.chat_id,
            from: "bot".into(),
            body,
            sent_at: m.created.to_rfc3339(),
            created: m.created,
        }
    }
}

#[derive(Clone)]
struct DemoState {
    twilio: FakeTwilio,
    textmagic: FakeTextMagic,
    telegram: FakeTelegram,
    slack: FakeSlack,
    whatsapp: FakeWhatsApp,
    callbacks: FakeCallbackReceiver,
    /// The last prompt the demo engine was given, to show what an agent sees (memory, summary,
    /// recall around the person's message).
    last_prompt: Arc<Mutex<Option<String>>>,
}

/// Logs each SMS the demo's providers take, as a provider's dashboard would show it.
struct LogSends;

impl SendObserver for LogSends {
    fn accepted(&self, sms: &SentSms) {
        tracing::info!(provider = ?sms.provider, to = %sms.to, chars = sms.body.chars().count(), "demo outbox: SMS sent");
    }
}

/// The demo engine: names the agent, repeats what the person said, and counts the engine
/// session's turns.
fn demo_runner(last_prompt: Arc<Mutex<Option<String>>>) -> FakeRunner {
    let runner = FakeRunner::unrecorded();
    runner.name_sessions_with(|| format!("demo-{}", uuid::Uuid::new_v4()));
    let turns: Mutex<HashMap<String, u32>> = Mutex::default();
    runner.answer_with(move |call, session_id| {
        let turn = {
            let mut turns = turns.lock().expect("lock");
            let n = turns.entry(session_id.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        *last_prompt.lock().expect("lock") = Some(call.prompt.clone());
        format!(
            "{} (demo engine): you said \"{}\". Turn {turn} of engine session {session_id}.",
            call.agent,
            FakeRunner::said(&call.prompt)
        )
    });
    runner
}

pub fn router(config: &Config) -> Router {
    let twilio = FakeTwilio::new(
        &config.twilio.account_sid,
        config.twilio.auth_token.expose(),
    );
    let textmagic = FakeTextMagic::new(
        &config.textmagic.username,
        config.textmagic.api_key.expose(),
    );
    // The demo bot answers to the configured token (an unset one: the demo's own).
    let telegram = FakeTelegram::new(
        config
            .provider_settings::<TelegramSettings>(switchboard_channels::telegram::PROVIDER)
            .ok()
            .filter(|s| s.bot_id().is_some())
            .map(|s| s.bot_token.expose().to_string())
            .as_deref()
            .unwrap_or("7000000001:demo-bot-token"),
    );
    // The demo workspace answers to the configured bot token (an unset one: the demo's own).
    let slack = FakeSlack::new(
        config
            .provider_settings::<SlackSettings>(switchboard_channels::slack::PROVIDER)
            .ok()
            .filter(|s| !s.bot_token.is_empty())
            .map(|s| s.bot_token.expose().to_string())
            .as_deref()
            .unwrap_or("xoxb-demo-bot-token"),
        DEMO_SLACK_TEAM,
    );
    let whatsapp_settings = config
        .provider_settings::<WhatsAppSettings>(switchboard_channels::whatsapp::PROVIDER)
        .unwrap_or_default();
    let whatsapp = FakeWhatsApp::new(
        Some(whatsapp_settings.access_token.expose())
            .filter(|t| !t.is_empty())
            .unwrap_or("demo-whatsapp-token"),
        Some(whatsapp_settings.phone_number_id.as_str())
            .filter(|id| !id.is_empty())
            .unwrap_or("106540352242922"),
    );
    whatsapp.without_window();
    twilio.observe(Arc::new(LogSends));
    textmagic.observe(Arc::new(LogSends));
    let last_prompt: Arc<Mutex<Option<String>>> = Arc::default();
    let runner = demo_runner(last_prompt.clone());
    // Each generic source with a secret, at /demo/webhook/<source>, within its window.
    let callbacks =
        FakeCallbackReceiver::of_sources(config.webhooks.iter().filter_map(|(name, source)| {
            source.signing_key().map(|_| {
                (
                    name.clone(),
                    source.secret.expose().to_string(),
                    Some(source.timestamp_window_s),
                )
            })
        }));
    let state = DemoState {
        twilio: twilio.clone(),
        textmagic: textmagic.clone(),
        telegram: telegram.clone(),
        slack: slack.clone(),
        whatsapp: whatsapp.clone(),
        callbacks: callbacks.clone(),
        last_prompt,
    };
    Router::new()
        .nest("/demo/runner", runner.router())
        .nest("/demo/twilio", twilio.router())
        .nest("/demo/textmagic", textmagic.router())
        .nest("/demo/telegram", telegram.router())
        .nest("/demo/slack", slack.router())
        .nest("/demo/whatsapp", whatsapp.router())
        .nest("/demo/webhook", callbacks.router())
        .merge(
            Router::new()
                .route("/demo/runner/last-prompt", get(show_last_prompt))
                .route("/demo/outbox", get(outbox))
                .with_state(state),
        )
        .merge(widget_page(config))
}

/// The whole prompt of the demo engine's last turn, as plain text (404 before the first).
async fn show_last_prompt(State(s): State<DemoState>) -> impl IntoResponse {
    match s.last_prompt.lock().expect("lock").clone() {
        Some(prompt) => (StatusCode::OK, prompt),
        None => (
            StatusCode::NOT_FOUND,
            "the demo engine has run no turn yet\n".into(),
        ),
    }
}

impl OutboxMessage {
    /// A reply callback a generic source took, each delivery once (a redelivery is taken and
    /// answered again but is the same reply).
    fn of_callbacks(taken: Vec<CallbackRequest>) -> Vec<Self> {
        let mut seen = std::collections::HashSet::new();
        taken
            .into_iter()
            .filter(|c| seen.insert((c.source.clone(), c.delivery.clone())))
            .map(|c| Self {
                provider: "generic",
                sid: c.delivery,
                to: c.body["to"].as_str().unwrap_or_default().to_string(),
                from: c.source,
                body: c.body["text"].as_str().unwrap_or_default().to_string(),
                sent_at: c.received.to_rfc3339(),
                created: c.received,
            })
            .collect()
    }
}

#[derive(Deserialize)]
struct OutboxQuery {
    to: Option<String>,
}

async fn outbox(State(s): State<DemoState>, Query(q): Query<OutboxQuery>) -> impl IntoResponse {
    let mut all: Vec<OutboxMessage> = s
        .twilio
        .sent()
        .into_iter()
        .chain(s.textmagic.sent())
        .map(OutboxMessage::of_sms)
        .chain(OutboxMessage::of_callbacks(s.callbacks.accepted()))
        .chain(
            s.telegram
                .sent()
                .into_iter()
                .map(OutboxMessage::of_telegram),
        )
        .chain(s.slack.posted().into_iter().map(OutboxMessage::of_slack))
        .chain(
            s.slack
                .uploaded_files()
                .into_iter()
                .map(OutboxMessage::of_slack_upload),
        )
        .chain(
            s.whatsapp
                .sent()
                .into_iter()
                .map(OutboxMessage::of_whatsapp),
        )
        .collect();
    all.sort_by_key(|m| m.created);
    let filtered: Vec<OutboxMessage> = all
        .into_iter()
        // TextMagic writes numbers without `+`: SMS compare by digits; chats and channels
        // by their ids.
        .filter(|m| {
            q.to.as_ref().is_none_or(|t| match m.provider {
                "twilio" | "textmagic" => textmagic_number(&m.to) == textmagic_number(t),
                _ => &m.to == t,
            })
        })
        .collect();
    Json(filtered)
}

#[derive(Deserialize)]
struct WidgetPageParams {
    /// Who the page's visitor is (the token's `sub`; a reload keeps the conversation).
    #[serde(default)]
    visitor: Option<String>,
    #[serde(default)]
    agent: Option<String>,
}

/// `/demo/widget`: a page with the chat widget on it, as a site that embeds it would serve it,
/// the visitor's token signed with `chat.jwt_secret` (a real site's login makes its own).
fn widget_page(config: &Config) -> Router {
    let config = config.clone();
    Router::new().route(
        "/demo/widget",
        get(move |Query(p): Query<WidgetPageParams>| {
            let config = config.clone();
            async move {
                let visitor = p.visitor.unwrap_or_else(|| "demo-visitor".into());
                let agent = p
                    .agent
                    .or_else(|| config.agents.first().map(|a| a.name.clone()))
                    .unwrap_or_default();
                match crate::chat::token(&config, &format!("web:{visitor}"), &visitor, "", 3600) {
                    Ok(token) => axum::response::Html(widget_html(&agent, &token)).into_response(),
                    Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
                }
            }
        }),
    )
}

/// The demo page: escaped attribute values only (the visitor and agent come from the query).
fn widget_html(agent: &str, token: &str) -> String {
    let attr = |s: &str| {
        s.replace('&', "&amp;")
            .replace('"', "&quot;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    format!(
        r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Switchboard widget demo</title></head>
<body style="font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem">
<h1>A page with the Switchboard chat widget</h1>
<p>The chat panel in the corner is one script tag, served by the gateway:</p>
<pre style="white-space:pre-wrap;background:#f3f4f7;padding:.75rem">&lt;script src="/widget.js" data-agent="{agent}" data-token="&lt;your page's chat JWT&gt;"&gt;&lt;/script&gt;</pre>
<p>Replies come from the demo runner. Reload the page: the conversation stays.
<code>?visitor=name</code> chats as someone else.</p>
<script src="/widget.js" data-agent="{agent}" data-token="{token}" data-title="Chat with {agent}" data-open="true"></script>
</body>
</html>
"#,
        agent = attr(agent),
        token = attr(token),
    )
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
