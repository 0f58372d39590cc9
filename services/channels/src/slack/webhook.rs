//! `POST /webhooks/slack/events`: one Events API request.
//!
//! In order: the adapter is configured (a signing secret, else 403 `not_configured`); both
//! signature headers are there (401 `missing_signature`); the signature is Slack's v0 HMAC of
//! this timestamp and body (401 `invalid_signature`); the timestamp is unix seconds (401
//! `invalid_timestamp`) within the window of our clock (401 `stale_timestamp`); only then is the
//! body read (415, 400 `malformed_json`, `missing_field`/`invalid_field`, 413).
//!
//! A `url_verification` request is answered with its challenge. Of the `event_callback`s, a
//! direct message to the app (`message`, `channel_type: im`) and a mention of it in a channel
//! (`app_mention`, answered in the thread under it) are messages; everything else (edits,
//! deletions, messages from bots, the app's own replies coming back, channel chatter) is
//! acknowledged and counted by reason, so Slack does not send it again.
//!
//! A message is known by `<team>-<event_id>`: Slack sends an event again (with
//! `X-Slack-Retry-Num`) when it was not answered within three seconds, with the same event id,
//! so a retry is the same turn and is answered once.
use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use switchboard_kit::config::Config;

use super::{CHANNEL, PROVIDER, SIGNATURE_HEADER, SlackSettings, TIMESTAMP_HEADER};
use crate::ApiError;
use crate::ingress::{self, Ack, Answer, Incoming, Received, Webhook, WebhookRequest};

pub struct SlackWebhook {
    settings: Result<SlackSettings, String>,
    max_text_chars: usize,
}

impl SlackWebhook {
    pub fn new(config: &Config) -> Self {
        Self {
            settings: super::settings(config),
            max_text_chars: config.gateway.max_text_chars,
        }
    }
}

/// What an authenticated request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlackEvent {
    /// `url_verification`: the challenge to give back.
    Challenge(String),
    Message {
        /// `<team>-<event_id>`.
        id: String,
        /// `<team>:<user>`: the person.
        sender: String,
        /// `<channel>` or `<channel>:<thread ts>`: where the reply goes.
        place: String,
        text: String,
        /// The files' `url_private_download`.
        files: Vec<String>,
    },
    Ignored(&'static str),
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    bot_id: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    channel_type: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    thread_ts: Option<String>,
    #[serde(default)]
    files: Vec<File>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    url_private_download: Option<String>,
    #[serde(default)]
    url_private: Option<String>,
}

/// Longest challenge echoed back (Slack's are about 50 characters).
const MAX_CHALLENGE_CHARS: usize = 256;
/// Longest file URL taken.
const MAX_URL_CHARS: usize = 2048;

fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
}

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::bad_request("invalid_field", format!("{field} {why}"))
}

/// A Slack id (team, user, channel, event): letters and digits.
fn slack_id<'a>(field: &str, value: Option<&'a str>) -> Result<&'a str, ApiError> {
    let value = value.ok_or_else(|| ApiError::missing_field(field))?;
    if value.is_empty() || value.len() > 40 || !value.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(invalid(field, "must be letters and digits"));
    }
    Ok(value)
}

/// A message timestamp (`1355517523.000005`).
fn slack_ts<'a>(field: &str, value: Option<&'a str>) -> Result<&'a str, ApiError> {
    let value = value.ok_or_else(|| ApiError::missing_field(field))?;
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let well_formed = value.len() <= 24
        && value
            .split_once('.')
            .is_some_and(|(secs, fraction)| digits(secs) && digits(fraction));
    if !well_formed {
        return Err(invalid(field, "must be a Slack timestamp"));
    }
    Ok(value)
}

/// Check the request's signature headers against `secret` at `now`: the signature first (a
/// forged request learns nothing about our clock), then the window.
pub fn check_signature(
    secret: &[u8],
    window_s: u64,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(unauthorized(
            "missing_signature",
            "X-Slack-Request-Timestamp and X-Slack-Signature are required",
        ));
    };
    if !super::verify(secret, timestamp, body, signature) {
        return Err(unauthorized(
            "invalid_signature",
            "X-Slack-Signature is not v0=<hex HMAC-SHA256 of v0:timestamp:body> with the app's \
             signing secret",
        ));
    }
    ingress::check_timestamp("X-Slack-Request-Timestamp", timestamp, window_s, now)
}

/// The text of a mention without the leading mentions of the app (`<@U0BOT> hello` → `hello`).
fn without_leading_mentions(text: &str) -> &str {
    let mut rest = text.trim_start();
    while let Some(after) = rest.strip_prefix("<@") {
        match after.split_once('>') {
            Some((_, tail)) => rest = tail.trim_start(),
            None => break,
        }
    }
    rest
}

/// Read an authenticated request's body (the pure part of the webhook, also the fuzz target's).
pub fn parse_event(
    body: &[u8],
    content_type: Option<&str>,
    max_text_chars: usize,
) -> Result<SlackEvent, ApiError> {
    let value: Value = ingress::json_body(body, content_type)?;
    let Some(envelope) = value.as_object() else {
        return Err(ApiError::bad_request(
            "malformed_json",
            "a request is a JSON object",
        ));
    };
    match envelope.get("type").and_then(Value::as_str) {
        Some("url_verification") => {
            let challenge = envelope
                .get("challenge")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| ApiError::missing_field("challenge"))?;
            if challenge.chars().count() > MAX_CHALLENGE_CHARS
                || challenge.chars().any(char::is_control)
            {
                return Err(invalid("challenge", "is not a Slack challenge"));
            }
            return Ok(SlackEvent::Challenge(challenge.to_string()));
        }
        Some("event_callback") => {}
        Some(_) => return Ok(SlackEvent::Ignored("other_callback")),
        None => return Err(ApiError::missing_field("type")),
    }
    let team = slack_id("team_id", envelope.get("team_id").and_then(Value::as_str))?;
    let event_id = slack_id("event_id", envelope.get("event_id").and_then(Value::as_str))?;
    let event = envelope
        .get("event")
        .ok_or_else(|| ApiError::missing_field("event"))?;
    let event = Event::deserialize(event)
        .map_err(|e| ApiError::bad_request("invalid_field", format!("event: {e}")))?;
    let mention = match event.kind.as_str() {
        "app_mention" => true,
        "message" => false,
        _ => return Ok(SlackEvent::Ignored("other_event")),
    };
    if event.bot_id.is_some() {
        // Another bot, or this app's own reply coming back: never a turn.
        return Ok(SlackEvent::Ignored("from_a_bot"));
    }
    match event.subtype.as_deref() {
        None | Some("file_share") => {}
        Some(_) => return Ok(SlackEvent::Ignored("message_subtype")),
    }
    if !mention && event.channel_type.as_deref() != Some("im") {
        // Channel messages reach the app as `app_mention`s when they are for it.
        return Ok(SlackEvent::Ignored("channel_message"));
    }
    let user = slack_id("event.user", event.user.as_deref())?;
    let channel = slack_id("event.channel", event.channel.as_deref())?;
    let ts = slack_ts("event.ts", event.ts.as_deref())?;
    let thread = match event.thread_ts.as_deref() {
        Some(thread) => Some(slack_ts("event.thread_ts", Some(thread))?),
        // A mention starts a thread under it; a direct message stays in the conversation.
        None if mention => Some(ts),
        None => None,
    };
    let raw = event.text.as_deref().unwrap_or_default();
    let raw = if mention {
        without_leading_mentions(raw)
    } else {
        raw
    };
    let text = ingress::clean_text("event.text", &super::unescape(raw), max_text_chars)?;
    let files: Vec<String> = event
        .files
        .iter()
        .filter_map(|f| f.url_private_download.as_ref().or(f.url_private.as_ref()))
        .map(|url| {
            // The URL as sent, never as a parser would clean it: control characters (a NUL
            // Postgres cannot store, a CR/LF) and spaces are refused, not silently dropped.
            let clean = !url.chars().any(|c| c.is_control() || c.is_whitespace());
            if url.len() > MAX_URL_CHARS || !clean || url::Url::parse(url).is_err() {
                Err(invalid("event.files", "must be URLs"))
            } else {
                Ok(url.clone())
            }
        })
        .collect::<Result<_, _>>()?;
    if text.trim().is_empty() && files.is_empty() {
        return Ok(SlackEvent::Ignored("empty_message"));
    }
    let id = format!("{team}-{event_id}");
    ingress::check_provider_id("event_id", &id)?;
    Ok(SlackEvent::Message {
        id,
        sender: format!("{team}:{user}"),
        place: match thread {
            Some(thread) => format!("{channel}:{thread}"),
            None => channel.to_string(),
        },
        text,
        files,
    })
}

impl Webhook for SlackWebhook {
    fn route(&self) -> &'static str {
        "/webhooks/slack/events"
    }

    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        let settings = self
            .settings
            .as_ref()
            .map_err(|e| ApiError::forbidden("not_configured", format!("providers.slack: {e}")))?;
        if settings.signing_secret.is_empty() {
            return Err(ApiError::forbidden(
                "not_configured",
                "providers.slack.signing_secret is not set: events cannot be verified",
            ));
        }
        check_signature(
            settings.signing_secret.expose().as_bytes(),
            settings.timestamp_window_s,
            request.header(TIMESTAMP_HEADER),
            request.header(SIGNATURE_HEADER),
            request.body,
            request.now,
        )?;
        Ok(
            match parse_event(request.body, request.content_type(), self.max_text_chars)? {
                SlackEvent::Challenge(challenge) => Incoming::Answer(Answer {
                    content_type: "application/json",
                    body: serde_json::json!({ "challenge": challenge }).to_string(),
                }),
                SlackEvent::Ignored(reason) => Incoming::Ignored(reason),
                SlackEvent::Message {
                    id,
                    sender,
                    place,
                    text,
                    files,
                } => Received {
                    provider_message_id: id,
                    sender,
                    recipient: place,
                    text,
                    media_urls: files,
                    agent: String::new(),
                }
                .into(),
            },
        )
    }

    fn ack(&self) -> Ack {
        Ack {
            content_type: "application/json",
            body: "{}",
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use switchboard_kit::config::Secret;

    use super::*;

    fn parse(body: &str) -> Result<SlackEvent, ApiError> {
        parse_event(body.as_bytes(), Some("application/json"), 4000)
    }

    fn callback(event: &str) -> String {
        format!(
            r#"{{"token":"x","team_id":"T0TEAM","api_app_id":"A0APP","type":"event_callback","event_id":"Ev0001","event_time":1,"event":{event}}}"#
        )
    }

    #[test]
    fn a_direct_message_is_the_users_and_answered_where_it_was_written() {
        let m = parse(&callback(
            r#"{"type":"message","channel":"D024BE91L","user":"U2147483697","text":"Hello &amp; &lt;hi&gt;","ts":"1355517523.000005","channel_type":"im"}"#,
        ))
        .unwrap();
        assert_eq!(
            m,
            SlackEvent::Message {
                id: "T0TEAM-Ev0001".into(),
                sender: "T0TEAM:U2147483697".into(),
                place: "D024BE91L".into(),
                text: "Hello & <hi>".into(),
                files: vec![],
            }
        );
    }

    #[test]
    fn a_mention_is_answered_in_the_thread_under_it_without_the_mention() {
        let SlackEvent::Message { place, text, .. } = parse(&callback(
            r#"{"type":"app_mention","channel":"C0CHAN","user":"U1","text":"<@U0BOT> can you help?","ts":"1700000000.000100"}"#,
        ))
        .unwrap() else {
            panic!("a message")
        };
        assert_eq!(place, "C0CHAN:1700000000.000100");
        assert_eq!(text, "can you help?");
        let SlackEvent::Message { place, .. } = parse(&callback(
            r#"{"type":"app_mention","channel":"C0CHAN","user":"U1","text":"<@U0BOT> more","ts":"1700000009.000100","thread_ts":"1700000000.000100"}"#,
        ))
        .unwrap() else {
            panic!("a message")
        };
        assert_eq!(
            place, "C0CHAN:1700000000.000100",
            "the thread it was written in"
        );
    }

    #[test]
    fn what_is_no_message_for_us_is_acknowledged_with_its_reason() {
        let cases = [
            (
                r#"{"type":"message","subtype":"bot_message","bot_id":"B1","channel":"D1","text":"hi","ts":"1.1","channel_type":"im"}"#,
                "from_a_bot",
            ),
            (
                r#"{"type":"message","bot_id":"B1","user":"U0BOT","channel":"D1","text":"our reply","ts":"1.1","channel_type":"im"}"#,
                "from_a_bot",
            ),
            (
                r#"{"type":"message","subtype":"message_changed","channel":"D1","ts":"1.1","channel_type":"im"}"#,
                "message_subtype",
            ),
            (
                r#"{"type":"message","channel":"C1","user":"U1","text":"chatter","ts":"1.1","channel_type":"channel"}"#,
                "channel_message",
            ),
            (r#"{"type":"reaction_added","user":"U1"}"#, "other_event"),
            (
                r#"{"type":"message","channel":"D1","user":"U1","text":"  ","ts":"1.1","channel_type":"im"}"#,
                "empty_message",
            ),
        ];
        for (event, reason) in cases {
            assert_eq!(
                parse(&callback(event)).unwrap(),
                SlackEvent::Ignored(reason),
                "{event}"
            );
        }
        assert_eq!(
            parse(r#"{"type":"app_rate_limited","team_id":"T1"}"#).unwrap(),
            SlackEvent::Ignored("other_callback")
        );
        assert_eq!(
            parse(r#"{"type":"url_verification","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","token":"x"}"#).unwrap(),
            SlackEvent::Challenge("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into())
        );
    }

    #[test]
    fn bad_bodies_get_their_code() {
        let code = |body: &str| parse(body).unwrap_err().code();
        assert_eq!(code("nope"), "malformed_json");
        assert_eq!(code("{}"), "missing_field");
        assert_eq!(code(r#"{"type":"url_verification"}"#), "missing_field");
        assert_eq!(
            code(&callback(
                r#"{"type":"message","channel":"D1","user":"U 1","text":"hi","ts":"1.1","channel_type":"im"}"#
            )),
            "invalid_field"
        );
        for ts in ["now", "1.2.3", "1..2", ".1", "1."] {
            assert_eq!(
                code(&callback(&format!(
                    r#"{{"type":"message","channel":"D1","user":"U1","text":"hi","ts":"{ts}","channel_type":"im"}}"#
                ))),
                "invalid_field",
                "{ts}"
            );
        }
        // Found by the fuzz check: a parser cleans these URLs; they are refused instead.
        for url in [
            r"https://f.example/a\u0000b",
            r"\u0000 https://f.example/a\r\n",
        ] {
            assert_eq!(
                code(&callback(&format!(
                    r#"{{"type":"message","subtype":"file_share","channel":"D1","user":"U1","text":"hi","ts":"1.1","channel_type":"im","files":[{{"url_private_download":"{url}"}}]}}"#
                ))),
                "invalid_field",
                "{url}"
            );
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    fn hook(secret: &str) -> SlackWebhook {
        SlackWebhook {
            settings: Ok(SlackSettings {
                signing_secret: Secret::new(secret),
                ..Default::default()
            }),
            max_text_chars: 4000,
        }
    }

    fn post(
        hook: &SlackWebhook,
        secret: &str,
        signed_at: i64,
        now: i64,
        body: &str,
    ) -> Result<Incoming, ApiError> {
        let timestamp = signed_at.to_string();
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers.insert(
            SIGNATURE_HEADER,
            super::super::sign(secret.as_bytes(), &timestamp, body.as_bytes())
                .parse()
                .unwrap(),
        );
        hook.receive(&WebhookRequest {
            url: "/webhooks/slack/events",
            path: "/webhooks/slack/events",
            headers: &headers,
            body: body.as_bytes(),
            now: at(now),
        })
    }

    #[test]
    fn only_a_fresh_request_signed_with_the_apps_secret_is_read() {
        const T0: i64 = 1_800_000_000;
        let hook = hook("s3cret");
        let body = r#"{"type":"url_verification","challenge":"abc"}"#;
        let answer = post(&hook, "s3cret", T0, T0 + 299, body).unwrap();
        assert_eq!(
            answer,
            Incoming::Answer(Answer {
                content_type: "application/json",
                body: r#"{"challenge":"abc"}"#.into()
            })
        );
        let code = |r: Result<Incoming, ApiError>| r.unwrap_err().code();
        assert_eq!(
            code(post(&hook, "wrong", T0, T0, body)),
            "invalid_signature"
        );
        assert_eq!(
            code(post(&hook, "s3cret", T0, T0 + 301, body)),
            "stale_timestamp"
        );
        assert_eq!(
            code(post(&hook, "s3cret", T0 + 301, T0, body)),
            "stale_timestamp"
        );
        let unset = SlackWebhook {
            settings: Ok(SlackSettings::default()),
            max_text_chars: 10,
        };
        assert_eq!(code(post(&unset, "", T0, T0, body)), "not_configured");
    }
}
