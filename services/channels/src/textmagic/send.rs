//! TextMagic's v2 Messages API: `POST {base}/api/v2/messages` with `X-TM-Username` and
//! `X-TM-Key`, a JSON body of `text`, `phones` (digits, no `+`) and `from`; 201 with the
//! message's `id`, 429 when we must slow down. `GET` on the same resource lists the account's
//! outbound messages, newest first, `page` by `page` (`limit` a page, `pageCount` pages).
//!
//! The send API also takes a `referenceId`, but TextMagic hands it back only on delivery
//! callbacks and sessions, not on the outbound message list, so it cannot make the look-up
//! exact: the list is matched by recipient, sender, text and time like Twilio's.
use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use switchboard_kit::config::TextMagicConfig;

use crate::egress::{self, Egress, LogPage, Logged, OutboundPart, SendError};

/// TextMagic sends one message as at most 6 SMS parts: 6 × 153 GSM characters.
pub const MAX_GSM_CHARS: usize = 918;
/// … or 6 × 67 characters when the text needs Unicode (UCS-2).
pub const MAX_UNICODE_CHARS: usize = 402;
/// GSM characters that take two of a part's places (the escape table).
const GSM_EXTENDED: &str = "^{}\\[~]|";

#[derive(Clone)]
pub struct TextMagicSender {
    http: reqwest::Client,
    config: TextMagicConfig,
}

#[derive(Serialize)]
struct NewMessage<'a> {
    text: &'a str,
    phones: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    from: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Created {
    id: Option<serde_json::Value>,
    message_id: Option<serde_json::Value>,
}

/// A number as TextMagic writes it: digits only, no `+` (`+44 7860-021130` → `447860021130`).
pub fn textmagic_number(number: &str) -> String {
    number.chars().filter(char::is_ascii_digit).collect()
}

/// One page of TextMagic's outbound message list.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MessagePage {
    page: u32,
    page_count: u32,
    resources: Vec<ListedMessage>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMessage {
    id: serde_json::Value,
    #[serde(default)]
    receiver: String,
    #[serde(default)]
    sender: String,
    #[serde(default)]
    text: String,
    /// `2015-06-19T09:48:24+0000`.
    message_time: String,
}

/// TextMagic's times: ISO 8601 with the offset written `+0000` (RFC 3339's `+00:00` accepted).
fn textmagic_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%z")
        .or_else(|_| DateTime::parse_from_rfc3339(s))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

impl MessagePage {
    /// The messages on this page to `to`, from `from` (any sender when none is set), with
    /// `text`, sent at or after `not_before`; and whether a next page can still hold newer
    /// ones (the list is newest first).
    pub(crate) fn read(
        self,
        to: &str,
        from: &str,
        text: &str,
        not_before: DateTime<Utc>,
    ) -> Result<LogPage, SendError> {
        let mut matches = Vec::new();
        let mut older_seen = false;
        for m in self.resources {
            let id = id_text(&m.id).ok_or_else(|| {
                SendError::Unavailable(format!(
                    "TextMagic listed a message without an id: {:?}",
                    m.id
                ))
            })?;
            let sent = textmagic_time(&m.message_time).ok_or_else(|| {
                SendError::Unavailable(format!(
                    "TextMagic listed {id} with an unreadable messageTime {:?}",
                    m.message_time
                ))
            })?;
            if sent < not_before {
                older_seen = true;
                continue;
            }
            if textmagic_number(&m.receiver) == to
                && (from.is_empty() || textmagic_number(&m.sender) == from)
                && m.text == text
            {
                matches.push(Logged { id, created: sent });
            }
        }
        let next =
            (!older_seen && self.page < self.page_count).then(|| (self.page + 1).to_string());
        Ok(LogPage { matches, next })
    }
}

fn id_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

impl TextMagicSender {
    pub fn new(config: TextMagicConfig) -> Self {
        Self {
            http: crate::http_client(),
            config,
        }
    }

    fn base(&self) -> &str {
        egress::api_base(&self.config.api_base, "https://rest.textmagic.com")
    }

    /// The `from` a send names, as TextMagic writes numbers: the configured number, else the
    /// number the person wrote to (empty: TextMagic's default sender).
    fn sender_number(&self, from: &str) -> String {
        if self.config.from_number.is_empty() {
            textmagic_number(from)
        } else {
            textmagic_number(&self.config.from_number)
        }
    }

    /// Send one message (at most 6 parts long). Returns TextMagic's message id.
    pub async fn send_text(&self, to: &str, from: &str, text: &str) -> Result<String, SendError> {
        let base = self.base();
        let from = self.sender_number(from);
        let phones = textmagic_number(to);
        let request = self
            .http
            .post(format!("{base}/api/v2/messages"))
            .header("X-TM-Username", &self.config.username)
            .header("X-TM-Key", self.config.api_key.expose())
            .json(&NewMessage {
                text,
                phones: &phones,
                from: &from,
            });
        // 400, 404, 422: validation failed (invalid number, text too long).
        let created: Created = egress::send_request(request, "TextMagic", &[400, 404, 422]).await?;
        created
            .message_id
            .as_ref()
            .and_then(id_text)
            .or_else(|| created.id.as_ref().and_then(id_text))
            .ok_or_else(|| SendError::Unavailable("TextMagic answered without a message id".into()))
    }

    /// The ids of the messages TextMagic's outbound list holds to `to` from our number with
    /// `text`, sent at or after `since` (less the clock skew), oldest first. The list has no
    /// filters, so it is read newest first until a page reaches back before that time.
    pub async fn find_text(
        &self,
        to: &str,
        from: &str,
        text: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, SendError> {
        let not_before = egress::not_before(since);
        let (to, from) = (textmagic_number(to), self.sender_number(from));
        let url = format!("{}/api/v2/messages", self.base());
        egress::search_log("TextMagic", "1".into(), |page| {
            let request = self
                .http
                .get(&url)
                .query(&[("page", page.as_str()), ("limit", "100")])
                .header("X-TM-Username", &self.config.username)
                .header("X-TM-Key", self.config.api_key.expose());
            let (to, from) = (&to, &from);
            async move {
                let page: MessagePage = egress::read_log(request, "TextMagic").await?;
                page.read(to, from, text, not_before)
            }
        })
        .await
    }
}

/// The longest part TextMagic takes for `text`: GSM text fits more than Unicode text.
pub fn max_part_chars(text: &str) -> usize {
    if text.is_ascii() {
        if text.chars().any(|c| GSM_EXTENDED.contains(c)) {
            MAX_GSM_CHARS / 2
        } else {
            MAX_GSM_CHARS
        }
    } else {
        MAX_UNICODE_CHARS
    }
}

impl Egress for TextMagicSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, max_part_chars(text))
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        self.send_text(part.to(), part.from(), part.text).boxed()
    }

    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        self.find_text(part.to(), part.from(), part.text, since)
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_fit_six_sms() {
        assert_eq!(max_part_chars("hello"), 918);
        assert_eq!(max_part_chars("a [link]"), 459);
        assert_eq!(max_part_chars("héllo"), 402);
        assert_eq!(textmagic_number("+44 7860-021130"), "447860021130");
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// A page of TextMagic's outbound list, newest first.
    fn page(page: u32, page_count: u32, times: &[(&str, &str, &str)]) -> MessagePage {
        let resources: Vec<_> = times
            .iter()
            .enumerate()
            .map(|(i, (time, receiver, text))| {
                serde_json::json!({
                    "id": 49_575_800 - i as i64, "receiver": receiver, "sender": "447624800500",
                    "messageTime": time, "status": "d", "text": text, "charset": "ISO-8859-1",
                    "firstName": "", "lastName": "", "country": "GB", "partsCount": 1,
                    "contactId": 0, "sessionId": 34_436_950 - i as i64, "deleted": false,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "page": page, "limit": 100, "pageCount": page_count, "resources": resources,
        }))
        .unwrap()
    }

    #[test]
    fn a_listed_message_matches_with_the_same_receiver_sender_text_after_the_attempt() {
        let since = at("2026-11-23T10:00:00Z");
        let read = page(
            1,
            3,
            &[
                ("2026-11-23T10:00:03+0000", "447860021130", "hello"),
                ("2026-11-23T10:00:02+0000", "447860021130", "hello again"),
                ("2026-11-23T11:00:01+01:00", "447860021131", "hello"),
                ("2026-11-23T09:59:58+0000", "447860021130", "hello"),
            ],
        )
        .read(
            "447860021130",
            "447624800500",
            "hello",
            egress::not_before(since),
        )
        .unwrap();
        let ids: Vec<_> = read.matches.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["49575800", "49575797"], "09:59:58 is within the skew");
        assert_eq!(
            read.next.as_deref(),
            Some("2"),
            "every message so far is new enough"
        );
    }

    #[test]
    fn reading_stops_at_the_first_message_older_than_the_attempt_or_the_last_page() {
        let not_before = egress::not_before(at("2026-11-23T10:00:00Z"));
        let older = page(
            1,
            3,
            &[
                ("2026-11-23T10:00:03+0000", "447860021130", "x"),
                ("2026-11-23T09:58:00+0000", "447860021130", "hello"),
            ],
        )
        .read("447860021130", "", "hello", not_before)
        .unwrap();
        assert!(older.matches.is_empty());
        assert!(older.next.is_none());
        let last = page(3, 3, &[("2026-11-23T10:00:03+0000", "447860021130", "x")])
            .read("447860021130", "", "hello", not_before)
            .unwrap();
        assert!(last.next.is_none());
    }

    #[test]
    fn another_sender_of_ours_does_not_match_when_we_name_one() {
        let not_before = egress::not_before(at("2026-11-23T10:00:00Z"));
        let p = || {
            page(
                1,
                1,
                &[("2026-11-23T10:00:03+0000", "447860021130", "hello")],
            )
        };
        let other = p()
            .read("447860021130", "447624800501", "hello", not_before)
            .unwrap();
        assert!(other.matches.is_empty());
        let ours = p()
            .read("447860021130", "447624800500", "hello", not_before)
            .unwrap();
        assert_eq!(ours.matches.len(), 1);
    }
}
