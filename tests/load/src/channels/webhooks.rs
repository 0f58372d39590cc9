//! The load clients that post a provider's webhook as the provider does (Twilio's signed form
//! is [`GatewayClient`](crate::pipeline::GatewayClient)'s):
//!
//! - TextMagic: its inbound-message callback, JSON, numbers as digits, to the URL with the
//!   callback's secret.
//! - Telegram: the bot's `Update`, JSON with `X-Telegram-Bot-Api-Secret-Token`; each message
//!   an `update_id` (and `message_id`) of its own.
//! - Slack: a direct message's `event_callback`, signed v0 with the app's signing secret at
//!   the moment it is sent; a retry carries `X-Slack-Retry-Num`.
//! - WhatsApp: Meta's notification of one text, signed with the app secret
//!   (`X-Hub-Signature-256`).
//!
//! A retry is the same delivery again, byte for byte (Slack signs it anew): the body of each
//! message's first attempt is kept until the gateway accepts it, so a retry repeats its
//! `update_id`, `event_id` or `wamid`. Each body's provider id (what `turns.provider_message_id`
//! holds) is read by the product's own parser of that webhook, once.
use std::collections::HashMap;
use std::sync::Mutex;

use switchboard_channels::ingress::Incoming;
use switchboard_channels::slack::SlackEvent;
use switchboard_channels::textmagic::textmagic_number;
use switchboard_fakes::{slack, telegram, whatsapp};

use super::{Posted, client_name, slack_channel, slack_user, telegram_chat, whatsapp_id};
use crate::sender_phone;

/// The longest text the gateway takes (the product's default; the load's texts are short).
const MAX_TEXT_CHARS: usize = 4096;

/// Posts TextMagic's inbound-message callback: JSON, numbers as digits.
pub(super) struct TextMagicClient {
    pub(super) http: reqwest::Client,
    pub(super) url: String,
}

impl TextMagicClient {
    pub(super) async fn post(
        &self,
        sender: usize,
        receiver: &str,
        text: &str,
        id: u64,
    ) -> Result<reqwest::StatusCode, reqwest::Error> {
        let resp = self
            .http
            .post(&self.url)
            .json(&serde_json::json!({
                "id": id,
                "sender": textmagic_number(&sender_phone(sender)),
                "receiver": receiver,
                "messageTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                "text": text,
            }))
            .send()
            .await?;
        let status = resp.status();
        let _ = resp.bytes().await;
        Ok(status)
    }
}

/// A message's webhook body as first sent, its provider id, and how often it was sent.
struct Delivery {
    body: String,
    provider_id: String,
    attempts: u32,
}

/// The deliveries not yet accepted, by (sender, index): what a retry sends again.
#[derive(Default)]
struct Unaccepted(Mutex<HashMap<(usize, u32), Delivery>>);

impl Unaccepted {
    /// The body, provider id and retry number (0: the first delivery) of this attempt at
    /// message `key`; `first` builds the body and reads its id on the first attempt.
    fn attempt(
        &self,
        key: (usize, u32),
        first: impl FnOnce() -> (String, String),
    ) -> (String, String, u32) {
        let mut pending = self.0.lock().unwrap();
        let d = pending.entry(key).or_insert_with(|| {
            let (body, provider_id) = first();
            Delivery {
                body,
                provider_id,
                attempts: 0,
            }
        });
        d.attempts += 1;
        (d.body.clone(), d.provider_id.clone(), d.attempts - 1)
    }

    /// What the gateway answered `key`'s attempt; an accepted message is not sent again.
    async fn answered(
        &self,
        key: (usize, u32),
        provider_id: String,
        sent: Result<reqwest::Response, reqwest::Error>,
    ) -> Posted {
        let Ok(resp) = sent else {
            return Posted::Failed;
        };
        let status = resp.status();
        // Read the body so the connection goes back to the pool.
        let _ = resp.bytes().await;
        if !status.is_success() {
            return Posted::Refused(status.as_u16().to_string());
        }
        self.0.lock().unwrap().remove(&key);
        Posted::Accepted {
            provider_id,
            correlation_id: String::new(),
        }
    }
}

/// A parser's answer for a body the load built itself: it must be a message.
fn read_back<T, E: std::fmt::Debug>(what: &str, parsed: Result<T, E>) -> T {
    parsed.unwrap_or_else(|e| panic!("the product refuses the load's own {what}: {e:?}"))
}

/// Telegram's bot: updates posted with the webhook's secret token.
pub(super) struct TelegramClient {
    http: reqwest::Client,
    url: String,
    bot_id: String,
    secret: String,
    pending: Unaccepted,
}

impl TelegramClient {
    pub(super) fn new(http: reqwest::Client, base: &str, bot_id: &str, secret: &str) -> Self {
        Self {
            http,
            url: format!("{base}/webhooks/telegram"),
            bot_id: bot_id.into(),
            secret: secret.into(),
            pending: Unaccepted::default(),
        }
    }

    /// The update of message `index` of `sender`, and the id the product keeps for it.
    fn first_delivery(&self, sender: usize, index: u32, text: &str) -> (String, String) {
        // Telegram numbers updates one by one; a private chat's id is its user's.
        let update_id = 1_000_000 + sender as i64 * 1_000 + i64::from(index);
        let chat = telegram_chat(sender);
        let body = telegram::text_update(update_id, chat, chat, "private", text).to_string();
        let parsed = switchboard_channels::telegram::parse_update(
            body.as_bytes(),
            Some("application/json"),
            &self.bot_id,
            &[],
            MAX_TEXT_CHARS,
        );
        let id = read_back("Telegram update", read_back("Telegram update", parsed)).id;
        (body, id)
    }

    pub(super) async fn post(&self, sender: usize, index: u32, text: &str) -> Posted {
        let key = (sender, index);
        let (body, provider_id, _) = self
            .pending
            .attempt(key, || self.first_delivery(sender, index, text));
        let sent = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header(telegram::SECRET_HEADER, &self.secret)
            .body(body)
            .send()
            .await;
        self.pending.answered(key, provider_id, sent).await
    }
}

/// Slack's Events API: each person's direct message to the app, signed as Slack signs it.
pub(super) struct SlackClient {
    http: reqwest::Client,
    url: String,
    team: String,
    signing_secret: String,
    /// Makes event ids this run's own.
    tag: String,
    pending: Unaccepted,
}

impl SlackClient {
    pub(super) fn new(
        http: reqwest::Client,
        base: &str,
        team: &str,
        signing_secret: &str,
        tag: &str,
    ) -> Self {
        Self {
            http,
            url: format!("{base}/webhooks/slack/events"),
            team: team.into(),
            signing_secret: signing_secret.into(),
            tag: tag.into(),
            pending: Unaccepted::default(),
        }
    }

    /// The event of message `index` of `sender` (its `ts` now), and the id the product keeps
    /// for it.
    fn first_delivery(&self, sender: usize, index: u32, text: &str) -> (String, String) {
        let event_id = format!("Ev0L{}{sender:06}x{index:05}", self.tag);
        let now = chrono::Utc::now();
        let ts = format!("{}.{:06}", now.timestamp(), now.timestamp_subsec_micros());
        let event = slack::dm_event(
            &self.team,
            &event_id,
            &slack_user(sender),
            &slack_channel(sender),
            text,
            &ts,
        );
        let body = event.to_string();
        let parsed = switchboard_channels::slack::parse_event(
            body.as_bytes(),
            Some("application/json"),
            MAX_TEXT_CHARS,
        );
        match read_back("Slack event", parsed) {
            SlackEvent::Message { id, .. } => (body, id),
            other => panic!("the product does not take the load's Slack DM: {other:?}"),
        }
    }

    pub(super) async fn post(&self, sender: usize, index: u32, text: &str) -> Posted {
        let key = (sender, index);
        let (body, provider_id, retry) = self
            .pending
            .attempt(key, || self.first_delivery(sender, index, text));
        let timestamp = chrono::Utc::now().timestamp();
        let signature = slack::sign(&self.signing_secret, timestamp, body.as_bytes());
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header(slack::TIMESTAMP_HEADER, timestamp.to_string())
            .header(slack::SIGNATURE_HEADER, signature);
        if retry > 0 {
            request = request
                .header(slack::RETRY_NUM_HEADER, retry.to_string())
                .header(slack::RETRY_REASON_HEADER, "http_error");
        }
        let sent = request.body(body).send().await;
        self.pending.answered(key, provider_id, sent).await
    }
}

/// Meta's webhook of a WhatsApp business number: one person's text per notification.
pub(super) struct WhatsAppClient {
    http: reqwest::Client,
    url: String,
    app_secret: String,
    phone_number_id: String,
    /// Makes wamids this run's own.
    tag: String,
    pending: Unaccepted,
}

impl WhatsAppClient {
    pub(super) fn new(
        http: reqwest::Client,
        base: &str,
        app_secret: &str,
        phone_number_id: &str,
        tag: &str,
    ) -> Self {
        Self {
            http,
            url: format!("{base}/webhooks/whatsapp"),
            app_secret: app_secret.into(),
            phone_number_id: phone_number_id.into(),
            tag: tag.into(),
            pending: Unaccepted::default(),
        }
    }

    /// The notification of message `index` of `sender`, and the id the product keeps for it.
    fn first_delivery(&self, sender: usize, index: u32, text: &str) -> (String, String) {
        let wamid = format!("wamid.LOAD{}{sender:06}x{index:05}", self.tag);
        let body = whatsapp::text_message(
            &self.phone_number_id,
            whatsapp::DISPLAY_PHONE_NUMBER,
            &whatsapp_id(sender),
            &client_name(sender),
            &wamid,
            text,
        )
        .to_string();
        let parsed = switchboard_channels::whatsapp::parse_notification(
            body.as_bytes(),
            Some("application/json"),
            "US",
            MAX_TEXT_CHARS,
        );
        match read_back("WhatsApp notification", parsed) {
            Incoming::Messages(m) if m.len() == 1 => (body, m[0].provider_message_id.clone()),
            _ => panic!("the product does not take the load's WhatsApp text as one message"),
        }
    }

    pub(super) async fn post(&self, sender: usize, index: u32, text: &str) -> Posted {
        let key = (sender, index);
        let (body, provider_id, _) = self
            .pending
            .attempt(key, || self.first_delivery(sender, index, text));
        let signature = whatsapp::sign(&self.app_secret, body.as_bytes());
        let sent = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header(whatsapp::SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await;
        self.pending.answered(key, provider_id, sent).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_sends_the_first_attempts_body_again_and_counts_itself() {
        let pending = Unaccepted::default();
        let mut built = 0;
        let mut attempt = || {
            pending.attempt((3, 1), || {
                built += 1;
                (format!("body {built}"), "id-3-1".to_string())
            })
        };
        assert_eq!(attempt(), ("body 1".into(), "id-3-1".into(), 0));
        assert_eq!(attempt(), ("body 1".into(), "id-3-1".into(), 1));
        assert_eq!(built, 1, "built once, on the first attempt");
    }

    #[test]
    fn each_platforms_message_has_its_own_id_and_its_sender_in_the_product() {
        let http = reqwest::Client::new();
        let base = "http://gateway";
        let telegram = TelegramClient::new(http.clone(), base, "7000000001", "secret");
        let (_, id) = telegram.first_delivery(3, 1, "s3#1");
        assert_eq!(id, "7000000001_900000003_1003001");
        let slack = SlackClient::new(http.clone(), base, "T0TEST001", "secret", "ab12");
        let (body, id) = slack.first_delivery(3, 1, "s3#1");
        assert_eq!(id, "T0TEST001-Ev0Lab12000003x00001");
        let event = switchboard_channels::slack::parse_event(
            body.as_bytes(),
            Some("application/json"),
            4096,
        );
        let Ok(SlackEvent::Message { sender, place, .. }) = event else {
            panic!("{event:?}")
        };
        assert_eq!(
            (sender.as_str(), place.as_str()),
            ("T0TEST001:U0L0000003", "D0L0000003")
        );
        let whatsapp = WhatsAppClient::new(http, base, "secret", "106540352242922", "ab12");
        let (body, id) = whatsapp.first_delivery(3, 1, "s3#1");
        let (_, other) = whatsapp.first_delivery(3, 2, "s3#2");
        assert!(id.starts_with("wa-") && id != other, "{id} {other}");
        let parsed = switchboard_channels::whatsapp::parse_notification(
            body.as_bytes(),
            Some("application/json"),
            "US",
            4096,
        );
        let Ok(Incoming::Messages(m)) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            (m[0].sender.as_str(), m[0].recipient.as_str()),
            ("+14152000003", "106540352242922")
        );
    }
}
