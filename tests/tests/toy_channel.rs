//! A channel added the way `docs/adding-a-channel.md` says, one module and one line, carries a
//! person's conversation like the product's own channels: the gateway mounts its webhook and
//! refuses what it does not authenticate, the message becomes a turn of the person's session
//! (the same session as their texts through Twilio: the conversation belongs to the person,
//! not the provider), the agent's reply goes back through its egress to the person, and its
//! settings come from its own `[providers.toy]` section. Nothing outside the module names it.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchboard_e2e::{AppOptions, spawn_app_with};

/// The module a new channel is: its settings, its webhook, its egress, its registration.
/// "Toy SMS" posts `{"id", "from", "to", "text"}` as JSON with `Authorization: Bearer
/// <webhook_token>`, and sends with `POST {api_base}/messages`.
mod toy {
    use std::sync::Arc;

    use chrono::{DateTime, Utc};
    use futures::FutureExt as _;
    use futures::future::BoxFuture;
    use serde::{Deserialize, Serialize};
    use switchboard_channels::ingress::{self, Ack, Incoming, Received, Webhook, WebhookRequest};
    use switchboard_channels::{Adapter, ApiError, Egress, OutboundPart, SendError};
    use switchboard_kit::config::Config;

    pub const PROVIDER: &str = "toy";

    /// `[providers.toy]`.
    #[derive(Debug, Clone, Default, Deserialize, Serialize)]
    #[serde(default)]
    pub struct Settings {
        pub api_base: String,
        pub api_token: String,
        pub from_number: String,
        pub webhook_token: String,
    }

    /// The settings, or why they cannot be read: a channel configured wrong refuses every
    /// request saying why, as an unconfigured one does.
    fn settings(config: &Config) -> Result<Settings, String> {
        config
            .provider_settings::<Settings>(PROVIDER)
            .map_err(|e| e.to_string())
    }

    pub struct ToyWebhook {
        settings: Result<Settings, String>,
        max_text_chars: usize,
        region: String,
    }

    #[derive(Deserialize)]
    struct Posted {
        id: String,
        from: String,
        to: String,
        text: String,
    }

    impl Webhook for ToyWebhook {
        fn route(&self) -> &'static str {
            "/webhooks/toy/sms"
        }

        fn channel(&self) -> &'static str {
            "sms"
        }

        fn provider(&self) -> &'static str {
            PROVIDER
        }

        fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
            let settings = self
                .settings
                .as_ref()
                .map_err(|e| ApiError::forbidden("not_configured", e.clone()))?;
            let given = request
                .header("authorization")
                .and_then(|h| h.strip_prefix("Bearer "))
                .unwrap_or("");
            // First, before reading anything the sender controls.
            if !ingress::secret_matches(given, &settings.webhook_token) {
                return Err(ApiError::forbidden(
                    "invalid_token",
                    "the bearer token is not the configured one",
                ));
            }
            let posted: Posted = serde_json::from_slice(request.body)
                .map_err(|e| ApiError::bad_request("invalid_body", e.to_string()))?;
            ingress::check_provider_id("id", &posted.id)?;
            let sender = switchboard_kit::address::normalize_phone(&posted.from, &self.region)
                .map_err(|e| ApiError::bad_request("invalid_from", e.to_string()))?;
            Ok(Received {
                provider_message_id: posted.id,
                sender,
                recipient: posted.to,
                text: ingress::message_text("text", &posted.text, self.max_text_chars)?,
                media_urls: Vec::new(),
                agent: String::new(),
            }
            .into())
        }

        fn ack(&self) -> Ack {
            Ack {
                content_type: "application/json",
                body: "{}",
            }
        }
    }

    pub struct ToyEgress {
        settings: Result<Settings, String>,
        http: reqwest::Client,
    }

    #[derive(Deserialize)]
    struct Logged {
        id: String,
        text: String,
        created: DateTime<Utc>,
    }

    impl ToyEgress {
        fn settings(&self) -> Result<&Settings, SendError> {
            self.settings
                .as_ref()
                .map_err(|e| SendError::Unavailable(e.clone()))
        }
    }

    impl Egress for ToyEgress {
        fn split(&self, text: &str) -> Vec<String> {
            switchboard_channels::split_message(text, 1_000)
        }

        fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
            async move {
                let s = self.settings()?;
                let resp = self
                    .http
                    .post(format!("{}/messages", s.api_base))
                    .bearer_auth(&s.api_token)
                    .json(&serde_json::json!({
                        "to": part.to(),
                        "from": s.from_number,
                        "text": part.text,
                    }))
                    .send()
                    .await
                    .map_err(|e| SendError::Unavailable(e.to_string()))?;
                let status = resp.status();
                if status.is_success() {
                    let body: serde_json::Value = resp
                        .json()
                        .await
                        .map_err(|e| SendError::Unavailable(e.to_string()))?;
                    body["id"]
                        .as_str()
                        .map(String::from)
                        .ok_or_else(|| SendError::Unavailable("an answer without id".into()))
                } else if status.is_client_error() && status.as_u16() != 429 {
                    Err(SendError::Rejected(format!("toy answered {status}")))
                } else {
                    Err(SendError::Unavailable(format!("toy answered {status}")))
                }
            }
            .boxed()
        }

        fn find_sent<'a>(
            &'a self,
            part: OutboundPart<'a>,
            since: DateTime<Utc>,
        ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
            async move {
                let s = self.settings()?;
                let unavailable = |e: reqwest::Error| SendError::Unavailable(e.to_string());
                let logged: Vec<Logged> = self
                    .http
                    .get(format!("{}/messages", s.api_base))
                    .bearer_auth(&s.api_token)
                    .query(&[("to", part.to())])
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(unavailable)?
                    .json()
                    .await
                    .map_err(unavailable)?;
                let earliest = switchboard_channels::egress::not_before(since);
                Ok(logged
                    .into_iter()
                    .filter(|m| m.text == part.text && m.created >= earliest)
                    .map(|m| m.id)
                    .collect())
            }
            .boxed()
        }
    }

    /// The channel as the product lists it.
    pub const ADAPTER: Adapter = Adapter {
        provider: PROVIDER,
        webhook: Some(|config| {
            Arc::new(ToyWebhook {
                settings: settings(config),
                max_text_chars: config.gateway.max_text_chars,
                region: config.identity.default_region.clone(),
            })
        }),
        egress: Some(|config| {
            Arc::new(ToyEgress {
                settings: settings(config),
                http: reqwest::Client::new(),
            })
        }),
        media: None,
    };
}

/// The toy provider's API: what it was asked to send.
#[derive(Clone, Default)]
struct ToyProvider {
    sent: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl ToyProvider {
    async fn start(self) -> String {
        use axum::routing::post;
        let app = axum::Router::new()
            .route(
                "/messages",
                post(
                    |axum::extract::State(p): axum::extract::State<ToyProvider>,
                     axum::Json(mut body): axum::Json<serde_json::Value>| async move {
                        let mut sent = p.sent.lock().unwrap();
                        let id = format!("toy-out-{}", sent.len());
                        body["id"] = id.clone().into();
                        body["created"] = chrono::Utc::now().to_rfc3339().into();
                        sent.push(body);
                        axum::Json(serde_json::json!({ "id": id }))
                    },
                )
                .get(
                    |axum::extract::State(p): axum::extract::State<ToyProvider>| async move {
                        axum::Json(serde_json::Value::from(p.sent.lock().unwrap().clone()))
                    },
                ),
            )
            .with_state(self);
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn sent_to(&self, to: &str) -> Vec<serde_json::Value> {
        let sent = self.sent.lock().unwrap();
        sent.iter().filter(|m| m["to"] == to).cloned().collect()
    }
}

#[tokio::test]
async fn a_channel_added_by_one_module_and_one_line_carries_a_persons_conversation() {
    let provider = ToyProvider::default();
    let api_base = provider.clone().start().await;
    let settings = toy::Settings {
        api_base,
        api_token: "toy-api-token".into(),
        from_number: "+15555550142".into(),
        webhook_token: "toy-webhook-secret".into(),
    };
    // The one line: the product's channels and this one.
    let app = spawn_app_with(AppOptions::default().with_channel(toy::ADAPTER).configured(
        move |c| {
            c.set_provider_settings(toy::PROVIDER, &settings)
                .expect("toy settings")
        },
    ))
    .await;
    let person = "+14155550188";
    let post = |token: &'static str, id: &'static str, text: &'static str| {
        let url = format!("{}/webhooks/toy/sms", app.gateway_url);
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&serde_json::json!({
                    "id": id, "from": person, "to": "+15555550142", "text": text,
                }))
                .send()
                .await
                .expect("gateway reachable")
        }
    };

    // Refused unless authenticated, saying why; nothing reaches the pipeline.
    let refused = post("not-the-token", "toy-in-0", "let me in").await;
    assert_eq!(refused.status(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_token", "{body}");

    let accepted = post("toy-webhook-secret", "toy-in-1", "hello through the toy").await;
    assert_eq!(accepted.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    while provider.sent_to(person).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replies = provider.sent_to(person);
    assert_eq!(
        replies.len(),
        1,
        "the agent's reply went back through the toy's egress, once: {replies:?}"
    );
    assert_eq!(replies[0]["from"], "+15555550142", "from the toy's number");
    assert!(
        !replies[0]["text"].as_str().unwrap_or("").is_empty(),
        "{replies:?}"
    );

    // The same person texting through Twilio continues the same session.
    assert_eq!(
        app.send_sms(person, "and now by Twilio").await.status(),
        200
    );
    let sms = app.wait_for_sms(1, Duration::from_secs(30)).await;
    assert_eq!(sms[0].to, person, "Twilio's reply went to the person");
    app.settle().await;
    let rows = app.log_rows().await;
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r.person_id == format!("phone:{person}"))
        .collect();
    assert_eq!(
        mine.len(),
        4,
        "both messages and both replies are logged as the person's: {mine:?}"
    );
    let sessions: std::collections::BTreeSet<_> = mine.iter().map(|r| r.session_id).collect();
    assert_eq!(
        sessions.len(),
        1,
        "a person writing through the toy and through Twilio is one session"
    );
    assert_eq!(
        provider.sent_to(person).len(),
        1,
        "the Twilio reply did not go out through the toy"
    );
    for stage in ["identify", "session", "dispatch", "deliver"] {
        assert!(
            app.dead_letters(stage).await.is_empty(),
            "{stage} dead letters"
        );
    }
}
