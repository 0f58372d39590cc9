//! The Web API out: `chat.postMessage` to the conversation a message came from (its channel,
//! and its thread), text escaped and split at 4,000 characters (Slack's advice; it cuts a
//! message at 40,000); each file the agent leaves a part of its own after the text's, uploaded
//! ([`super::upload`]). Slack answers errors with HTTP 200 and `"ok": false` and a reason, and
//! rate limits with 429 and `Retry-After`, which the deliver stage waits out.
//!
//! A part whose send may have reached Slack before its deliverer died is looked up in the
//! conversation's own history (`conversations.history`, or `conversations.replies` in a
//! thread): a message of this app's bot since the attempt with the same text is that part, and
//! one sharing a file of the part's file's name (with the part's text as its comment) is that
//! file's part.
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;

use super::SlackSettings;
use crate::egress::{self, AttachmentStyle, Egress, LogPage, Logged, OutboundPart, SendError};

/// Slack's advised longest message.
pub const MAX_TEXT_CHARS: usize = 4000;

pub struct SlackSender {
    pub(super) http: reqwest::Client,
    settings: Result<SlackSettings, String>,
    /// This app's bot user (`auth.test`), asked once: whose messages in a history are ours.
    bot: OnceCell<Bot>,
}

#[derive(Debug, Clone, Deserialize)]
struct Bot {
    user_id: String,
    #[serde(default)]
    bot_id: String,
}

/// Whether a Web API call went through, and if not, why.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    error: String,
}

/// `chat.postMessage`'s answer.
#[derive(Deserialize)]
struct Posted {
    ts: String,
}

#[derive(Deserialize)]
struct History {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    error: String,
    #[serde(default)]
    messages: Vec<Listed>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    response_metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    next_cursor: String,
}

#[derive(Deserialize)]
struct Listed {
    ts: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    bot_id: Option<String>,
    /// The files the message shares (an upload's message).
    #[serde(default)]
    files: Vec<ListedFile>,
}

#[derive(Deserialize)]
struct ListedFile {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    title: String,
}

/// What a look-up seeks in the history: a message of ours with this text (its ts is the
/// part's id), or one of ours sharing a file of this name (its file's id is), whose text is
/// the comment when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sought {
    Text(String),
    File { name: String, comment: String },
}

impl Sought {
    /// What `part` left in the history, as sent: its text escaped, or its one file.
    fn of(part: &OutboundPart<'_>) -> Option<Self> {
        let text = super::escape(part.text);
        match part.attachments {
            [] => Some(Self::Text(text)),
            [file] => Some(Self::File {
                name: file.name.clone(),
                comment: text,
            }),
            // [`SlackSender::send`] refuses such a part before any request.
            _ => None,
        }
    }

    /// The ids `listed` holds of what is sought (it is ours and new enough).
    fn ids_in(&self, listed: &Listed) -> Vec<String> {
        match self {
            // A text part is never a message that shares files.
            Self::Text(text) if listed.files.is_empty() && listed.text == *text => {
                vec![listed.ts.clone()]
            }
            Self::Text(_) => Vec::new(),
            Self::File { name, comment } if comment.is_empty() || listed.text == *comment => listed
                .files
                .iter()
                .filter(|f| f.name == *name || f.title == *name)
                .map(|f| f.id.clone())
                .collect(),
            Self::File { .. } => Vec::new(),
        }
    }
}

/// Errors that say the message (or file) cannot go to this conversation as it is.
const REJECTED: &[&str] = &[
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "msg_too_long",
    "no_text",
    "restricted_action",
    "cannot_reply_to_message",
    "thread_reply_not_found",
    "user_not_found",
    "invalid_channel",
    "posting_to_general_channel_denied",
    "file_uploads_disabled",
    "file_uploads_except_images_disabled",
    "file_upload_size_restricted",
    "file_type_not_allowed",
];

/// `chat.postMessage`'s answer: the message's ts.
fn read_answer(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
) -> Result<String, SendError> {
    read_ok::<Posted>(status, retry_after, body).map(|posted| posted.ts)
}

/// What Slack's answer to a Web API call means: the answer as `T` when it is `ok`, else the
/// error it says (`ok` false with HTTP 200 is an error too).
pub(super) fn read_ok<T: DeserializeOwned>(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
) -> Result<T, SendError> {
    let answer: Option<Answer> = serde_json::from_str(body).ok();
    let clip: String = body.chars().take(300).collect();
    match (status, answer) {
        (429, answer) => Err(SendError::Throttled {
            retry_after,
            detail: format!(
                "Slack HTTP 429: {}",
                answer.map(|a| a.error).unwrap_or(clip)
            ),
        }),
        (200..=299, Some(Answer { ok: true, .. })) => serde_json::from_str(body)
            .map_err(|e| SendError::Unavailable(format!("Slack: unreadable answer {clip}: {e}"))),
        (
            200..=299,
            Some(Answer {
                ok: false, error, ..
            }),
        ) if REJECTED.contains(&error.as_str()) => {
            Err(SendError::Rejected(format!("Slack: {error}")))
        }
        (
            200..=299,
            Some(Answer {
                ok: false, error, ..
            }),
        ) if error == "ratelimited" => Err(SendError::Throttled {
            retry_after,
            detail: "Slack: ratelimited".into(),
        }),
        // invalid_auth, token_revoked (an operator fixes them), internal_error, fatal_error…
        (200..=299, Some(Answer { error, .. })) => {
            Err(SendError::Unavailable(format!("Slack: {error}")))
        }
        (status, _) => Err(SendError::Unavailable(format!(
            "Slack HTTP {status}: {clip}"
        ))),
    }
}

/// Where a reply goes: the channel, and the thread if it was written in one
/// (`<channel>[:<thread ts>]`, the message's recipient); else the person's direct messages
/// (`<team>:<user>` → the user id, which `chat.postMessage` takes as the app's DM with them).
pub(super) fn place<'a>(part: &OutboundPart<'a>) -> (&'a str, Option<&'a str>) {
    let from = part.from();
    if !from.is_empty() {
        return match from.split_once(':') {
            Some((channel, thread)) => (channel, Some(thread)),
            None => (from, None),
        };
    }
    (part.to().rsplit(':').next().unwrap_or_default(), None)
}

/// Slack's `ts` as a time (seconds and microseconds).
fn ts_time(ts: &str) -> Option<DateTime<Utc>> {
    let (secs, micros) = ts.split_once('.')?;
    DateTime::from_timestamp(
        secs.parse().ok()?,
        micros.parse::<u32>().ok()?.saturating_mul(1000),
    )
}

impl SlackSender {
    pub fn new(settings: Result<SlackSettings, String>) -> Self {
        Self {
            http: crate::http_client(),
            settings,
            bot: OnceCell::new(),
        }
    }

    pub(super) fn settings(&self) -> Result<&SlackSettings, SendError> {
        let settings = self
            .settings
            .as_ref()
            .map_err(|e| SendError::Unavailable(format!("providers.slack: {e}")))?;
        if settings.bot_token.is_empty() {
            return Err(SendError::Unavailable(
                "providers.slack.bot_token is not set".into(),
            ));
        }
        Ok(settings)
    }

    pub(super) async fn call(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, Option<Duration>, String), SendError> {
        let resp = request
            .send()
            .await
            .map_err(|e| SendError::Unavailable(format!("Slack: {e}")))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
            .map(Duration::from_secs);
        Ok((status, retry_after, resp.text().await.unwrap_or_default()))
    }

    /// This app's bot user, asked of `auth.test` once.
    async fn bot(&self) -> Result<&Bot, SendError> {
        let settings = self.settings()?;
        self.bot
            .get_or_try_init(|| async {
                let (status, _, body) = self
                    .call(
                        self.http
                            .post(settings.method_url("auth.test"))
                            .bearer_auth(settings.bot_token.expose()),
                    )
                    .await?;
                #[derive(Deserialize)]
                struct AuthTest {
                    #[serde(default)]
                    ok: bool,
                    #[serde(default)]
                    error: String,
                    #[serde(flatten)]
                    bot: Option<Bot>,
                }
                match serde_json::from_str::<AuthTest>(&body) {
                    Ok(AuthTest {
                        ok: true,
                        bot: Some(bot),
                        ..
                    }) if status == 200 => Ok(bot),
                    Ok(AuthTest { error, .. }) => Err(SendError::Unavailable(format!(
                        "Slack auth.test: HTTP {status} {error}"
                    ))),
                    Err(e) => Err(SendError::Unavailable(format!(
                        "Slack auth.test: unreadable answer: {e}"
                    ))),
                }
            })
            .await
    }

    /// One page of the conversation's history (or its thread's replies) from `cursor`: the ids
    /// of what is `sought` in this bot's messages at or after `not_before`.
    async fn history_page(
        &self,
        channel: &str,
        thread: Option<&str>,
        sought: &Sought,
        not_before: DateTime<Utc>,
        cursor: String,
    ) -> Result<LogPage, SendError> {
        let settings = self.settings()?;
        let bot = self.bot().await?;
        let oldest = format!(
            "{}.{:06}",
            not_before.timestamp(),
            not_before.timestamp_subsec_micros()
        );
        let mut query = vec![
            ("channel", channel.to_string()),
            ("oldest", oldest),
            ("inclusive", "true".into()),
            ("limit", "200".into()),
        ];
        let method = match thread {
            Some(thread) => {
                query.push(("ts", thread.to_string()));
                "conversations.replies"
            }
            None => "conversations.history",
        };
        if !cursor.is_empty() {
            query.push(("cursor", cursor));
        }
        let (status, _, body) = self
            .call(
                self.http
                    .get(settings.method_url(method))
                    .bearer_auth(settings.bot_token.expose())
                    .query(&query),
            )
            .await?;
        let page: History = serde_json::from_str(&body).map_err(|e| {
            SendError::Unavailable(format!("Slack {method}: HTTP {status}, unreadable: {e}"))
        })?;
        if status != 200 || !page.ok {
            return Err(SendError::Unavailable(format!(
                "Slack {method}: HTTP {status} {}",
                page.error
            )));
        }
        let mut matches = Vec::new();
        for m in page.messages {
            let ours = m.user.as_deref() == Some(bot.user_id.as_str())
                || (!bot.bot_id.is_empty() && m.bot_id.as_deref() == Some(bot.bot_id.as_str()));
            let created = ts_time(&m.ts).ok_or_else(|| {
                SendError::Unavailable(format!("Slack {method} listed an unreadable ts {:?}", m.ts))
            })?;
            if ours && created >= not_before {
                let ids = sought.ids_in(&m);
                matches.extend(ids.into_iter().map(|id| Logged { id, created }));
            }
        }
        let next = page
            .response_metadata
            .map(|m| m.next_cursor)
            .filter(|c| page.has_more && !c.is_empty());
        Ok(LogPage { matches, next })
    }
}

impl SlackSender {
    /// `text` as one message (`chat.postMessage`); its ts.
    async fn send_text(
        &self,
        channel: &str,
        thread: Option<&str>,
        text: &str,
    ) -> Result<String, SendError> {
        let settings = self.settings()?;
        let mut body = serde_json::json!({
            "channel": channel,
            "text": super::escape(text),
        });
        if let Some(thread) = thread {
            body["thread_ts"] = thread.into();
        }
        let (status, retry_after, answer) = self
            .call(
                self.http
                    .post(settings.method_url("chat.postMessage"))
                    .bearer_auth(settings.bot_token.expose())
                    .json(&body),
            )
            .await?;
        read_answer(status, retry_after, &answer)
    }
}

impl Egress for SlackSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, MAX_TEXT_CHARS)
    }

    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::PartEach
    }

    /// A file's part makes four requests (its bytes from its link, then the three of the
    /// upload), each bounded by the request timeout.
    fn lease(&self) -> Duration {
        egress::SEND_LEASE + 3 * crate::REQUEST_TIMEOUT
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            let (channel, thread) = place(&part);
            match part.attachments {
                [] => self.send_text(channel, thread, part.text).await,
                [file] => self.send_file(channel, thread, part.text, file).await,
                more => Err(SendError::Rejected(format!(
                    "a Slack part carries one file, not {}",
                    more.len()
                ))),
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
            let (channel, thread) = place(&part);
            if channel.starts_with('U') {
                // A DM addressed by user id: its channel id is not known here.
                return Err(SendError::Unavailable(
                    "the conversation's id is not known: its history cannot be read".into(),
                ));
            }
            let Some(sought) = Sought::of(&part) else {
                // Refused by `send` before any request: it never went out.
                return Ok(Vec::new());
            };
            let not_before = egress::not_before(since);
            egress::search_log("Slack", String::new(), egress::MAX_LOG_PAGES, |cursor| {
                self.history_page(channel, thread, &sought, not_before, cursor)
            })
            .await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slacks_answer_says_whether_to_retry_and_when() {
        assert_eq!(
            read_answer(
                200,
                None,
                r#"{"ok":true,"channel":"D1","ts":"1700000000.000200"}"#
            ),
            Ok("1700000000.000200".into())
        );
        assert!(matches!(
            read_answer(200, None, r#"{"ok":false,"error":"channel_not_found"}"#),
            Err(SendError::Rejected(e)) if e.contains("channel_not_found")
        ));
        for retried in ["invalid_auth", "token_revoked", "internal_error"] {
            assert!(matches!(
                read_answer(200, None, &format!(r#"{{"ok":false,"error":"{retried}"}}"#)),
                Err(SendError::Unavailable(_))
            ));
        }
        assert_eq!(
            read_answer(
                429,
                Some(Duration::from_secs(30)),
                r#"{"ok":false,"error":"ratelimited"}"#
            ),
            Err(SendError::Throttled {
                retry_after: Some(Duration::from_secs(30)),
                detail: "Slack HTTP 429: ratelimited".into()
            })
        );
        assert!(matches!(
            read_answer(503, None, "down"),
            Err(SendError::Unavailable(_))
        ));
    }

    fn listed(message: serde_json::Value) -> Listed {
        serde_json::from_value(message).expect("a listed message")
    }

    #[test]
    fn a_file_part_is_found_as_the_message_sharing_a_file_of_its_name_a_text_part_by_its_text() {
        let reply = switchboard_kit::proto::Reply::default();
        let report = [switchboard_kit::exports::ExportLink {
            name: "visits.csv".into(),
            content_type: "text/csv".into(),
            size_bytes: 10,
            url: "http://gateway.test/api/v1/exports/x".into(),
            expires_at: Utc::now(),
        }];
        let file_part = OutboundPart::new(&reply, 1, "").with_attachments(&report);
        let file = Sought::of(&file_part).expect("one file");
        assert_eq!(
            file,
            Sought::File {
                name: "visits.csv".into(),
                comment: String::new()
            }
        );
        let text = Sought::of(&OutboundPart::new(&reply, 0, "echo: a < b")).expect("text");
        assert_eq!(text, Sought::Text("echo: a &lt; b".into()));

        let shared = listed(serde_json::json!({"ts": "1.1", "text": "", "files": [
            {"id": "F01", "name": "visits.csv", "title": "visits.csv"},
            {"id": "F02", "name": "other.csv", "title": "other.csv"}]}));
        assert_eq!(file.ids_in(&shared), ["F01"]);
        let retitled = listed(serde_json::json!({"ts": "1.2",
            "files": [{"id": "F03", "name": "visits-1.csv", "title": "visits.csv"}]}));
        assert_eq!(file.ids_in(&retitled), ["F03"], "by its title too");
        let deleted = listed(serde_json::json!({"ts": "1.3",
            "files": [{"id": "F04", "mode": "tombstone"}]}));
        assert!(file.ids_in(&deleted).is_empty());

        // With a comment, the message's text is the comment.
        let commented = Sought::File {
            name: "visits.csv".into(),
            comment: "here &amp; now".into(),
        };
        let with_comment = listed(serde_json::json!({"ts": "1.4", "text": "here &amp; now",
            "files": [{"id": "F05", "name": "visits.csv"}]}));
        assert_eq!(commented.ids_in(&with_comment), ["F05"]);
        assert!(commented.ids_in(&shared).is_empty(), "another comment");

        // A text part is a message's ts, never a message sharing files; and the other way round.
        let posted = listed(serde_json::json!({"ts": "1.5", "text": "echo: a &lt; b"}));
        assert_eq!(text.ids_in(&posted), ["1.5"]);
        assert!(file.ids_in(&posted).is_empty());
        let file_with_that_text = listed(serde_json::json!({"ts": "1.6",
            "text": "echo: a &lt; b", "files": [{"id": "F06", "name": "visits.csv"}]}));
        assert!(text.ids_in(&file_with_that_text).is_empty());

        let two = [report[0].clone(), report[0].clone()];
        assert_eq!(
            Sought::of(&OutboundPart::new(&reply, 1, "").with_attachments(&two)),
            None,
            "never sent"
        );
    }

    #[test]
    fn a_ts_is_a_time_to_the_microsecond() {
        let t = ts_time("1700000000.000250").unwrap();
        assert_eq!(t.timestamp(), 1_700_000_000);
        assert_eq!(t.timestamp_subsec_micros(), 250);
        assert!(ts_time("nope").is_none());
    }
}
