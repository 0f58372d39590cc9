//! A channel's way out: send one part of a reply, read the provider's answer, and ask the
//! provider's own message log whether a part already went out.
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use switchboard_kit::exports::ExportLink;
use switchboard_kit::proto::Reply;

/// One part of a reply, ready to send.
#[derive(Debug, Clone, Copy)]
pub struct OutboundPart<'a> {
    /// The reply this part belongs to (its agent, session, the message it answers).
    pub reply: &'a Reply,
    /// Which part (0-based).
    pub index: usize,
    pub text: &'a str,
    /// The files the agent left for the person, with their links: on the first part, for a
    /// channel that takes them as media or a list ([`AttachmentStyle`]); else empty.
    pub attachments: &'a [ExportLink],
    /// When the person last wrote on this channel, for a channel that answers freely only for a
    /// while after that ([`Egress::session_window`]); `None`: never, unknown, or not asked.
    pub last_inbound: Option<DateTime<Utc>>,
}

impl<'a> OutboundPart<'a> {
    pub fn new(reply: &'a Reply, index: usize, text: &'a str) -> Self {
        Self {
            reply,
            index,
            text,
            attachments: &[],
            last_inbound: None,
        }
    }

    /// The same part, knowing when the person last wrote on its channel.
    pub fn with_last_inbound(self, last_inbound: Option<DateTime<Utc>>) -> Self {
        Self {
            last_inbound,
            ..self
        }
    }

    /// The same part carrying `attachments`.
    pub fn with_attachments(self, attachments: &'a [ExportLink]) -> Self {
        Self {
            attachments,
            ..self
        }
    }

    /// The person's address (the inbound message's sender).
    pub fn to(&self) -> &'a str {
        &self.reply.recipient
    }

    /// The address the person wrote to (our number), for providers with several.
    pub fn from(&self) -> &'a str {
        &self.reply.reply_from
    }
}

/// How a send went wrong, as the provider's answer says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The provider is down, overloaded or unreachable, or refused our credentials (which an
    /// operator can fix): retry with backoff, then dead-letter (replayable once fixed).
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    /// The provider asked us to slow down (HTTP 429): retry no sooner than `retry_after`.
    #[error("provider is throttling us (retry after {retry_after:?}): {detail}")]
    Throttled {
        retry_after: Option<Duration>,
        detail: String,
    },
    /// The message itself is wrong for this recipient (invalid number, opted out, too long):
    /// sending it again cannot help.
    #[error("provider rejected the message: {0}")]
    Rejected(String),
}

/// How a channel carries the files the agent left for the person (`exports/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentStyle {
    /// As the provider's media, with the first part (Twilio MMS: `MediaUrl`, fetched by the
    /// provider from the link).
    Media,
    /// As a list with the first part (name, type, size, link): clients of ours and callback
    /// receivers read it as data.
    Listed,
    /// The provider takes text only: a line per file (its name and link) ends the reply.
    LinksInText,
    /// Each file as a part of its own after the text's (Telegram: one `sendDocument` a file),
    /// so that each send is still one part the ledger records.
    PartEach,
}

/// The reply's text with a line per file (its name and link), for a text-only channel.
pub fn with_links(text: &str, links: &[ExportLink]) -> String {
    let lines: Vec<String> = links
        .iter()
        .map(|l| format!("{}: {}", l.name, l.url))
        .collect();
    match (text.trim().is_empty(), lines.is_empty()) {
        (_, true) => text.to_string(),
        (true, false) => lines.join("\n"),
        (false, false) => format!("{text}\n\n{}", lines.join("\n")),
    }
}

/// A channel's egress.
pub trait Egress: Send + Sync + 'static {
    /// Split a reply into the parts this provider takes, in order.
    fn split(&self, text: &str) -> Vec<String>;
    /// How it carries files: a line with a link in the text, unless it says otherwise.
    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::LinksInText
    }
    /// How long a deliverer holds a reply to this channel while it sends it (renewed after
    /// each part): longer than one send can take, so that only a dead deliverer's hold ends
    /// early. A reply whose deliverer died waits this long before another takes it.
    fn lease(&self) -> Duration {
        SEND_LEASE
    }
    /// How long after the person last wrote the provider lets a business answer freely
    /// (WhatsApp: 24 hours; after it, only a template). `Some`: the deliver stage finds when
    /// the person last wrote and hands it to each part ([`OutboundPart::last_inbound`]).
    fn session_window(&self) -> Option<Duration> {
        None
    }
    /// Send one part; the provider's id for it on success.
    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>>;
    /// The provider's ids of the messages its own log holds that match `part` (same recipient,
    /// our sender, same text) and were created at or after `since` (less [`LOG_CLOCK_SKEW`]),
    /// oldest first. Asked before sending again a part whose earlier attempt may or may not
    /// have reached the provider; an error means the log could not be read, and then the part
    /// must not be sent blind, and the attempt is retried; `Rejected` means the provider keeps
    /// no log a business can read, so it can never say, and the reply ends failed at once
    /// (never sent again). Every channel answers it its own way (a provider's message list,
    /// the mailbox table, a receiver that dedupes by delivery id): there is no default, so a new
    /// channel has to decide.
    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>>;
}

/// [`Egress::lease`] of a provider reached over HTTP: above one send's HTTP timeout (30 s).
pub const SEND_LEASE: Duration = Duration::from_secs(45);
// A live deliverer's send must end within its lease, or another could send the part again.
const _: () = assert!(SEND_LEASE.as_secs() > crate::REQUEST_TIMEOUT.as_secs());

/// How far a provider's clock may be behind the ledger's when comparing a message's creation
/// time with the start of an attempt (providers also round their times down to the second).
pub const LOG_CLOCK_SKEW: Duration = Duration::from_secs(5);

/// At most this many pages of a log filtered by recipient (Twilio's) are read for one look-up:
/// a log that long for one recipient in minutes means something is wrong, and the part is not
/// sent blind.
pub const MAX_LOG_PAGES: usize = 20;

/// The earliest creation time a message of the attempt started at `since` can carry: what
/// an [`Egress::find_sent`] compares the provider's creation times with.
pub fn not_before(since: DateTime<Utc>) -> DateTime<Utc> {
    since - chrono::Duration::from_std(LOG_CLOCK_SKEW).expect("a small duration")
}

/// The latest creation time a message of the attempt started at `since` can carry: the
/// request ended (or was cut off) within [`crate::REQUEST_TIMEOUT`], plus the clock skew.
pub(crate) fn not_after(since: DateTime<Utc>) -> DateTime<Utc> {
    since + chrono::Duration::from_std(crate::REQUEST_TIMEOUT + LOG_CLOCK_SKEW).expect("small")
}

/// One page of a provider's log, read: the matching messages on it, and whether to read on.
pub(crate) struct LogPage {
    pub matches: Vec<Logged>,
    /// The next page, if there is one and it can still hold messages new enough.
    pub next: Option<String>,
}

/// A matching message in a provider's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Logged {
    pub id: String,
    pub created: DateTime<Utc>,
}

/// Read a provider's log from `first` page on, `fetch` reading one page, until a page says
/// there is no more to read; the matches oldest first. More than `max_pages` pages is an
/// error, since an unread page could hold the part.
pub(crate) async fn search_log<F, Fut>(
    provider: &str,
    first: String,
    max_pages: usize,
    mut fetch: F,
) -> Result<Vec<String>, SendError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<LogPage, SendError>>,
{
    let mut found = Vec::new();
    let mut next = Some(first);
    let mut pages = 0;
    while let Some(page) = next {
        if pages == max_pages {
            return Err(SendError::Unavailable(format!(
                "{provider}'s message log has more than {max_pages} pages to search"
            )));
        }
        pages += 1;
        let read = fetch(page).await?;
        found.extend(read.matches);
        next = read.next;
    }
    found.sort_by_key(|m| m.created);
    found.dedup_by(|a, b| a.id == b.id);
    Ok(found.into_iter().map(|m| m.id).collect())
}

/// Read a provider's log page: the 2xx body as `T`, else the [`SendError`] its status means
/// (nothing is "rejected" here: a refused look-up is retried like an outage).
pub(crate) async fn read_log<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    provider: &str,
) -> Result<T, SendError> {
    send_request(request, provider, &[]).await
}

/// A reply as one part (channels with no length limit of their own); none when it is blank.
pub fn whole_message(text: &str) -> Vec<String> {
    if text.trim().is_empty() {
        Vec::new()
    } else {
        vec![text.to_string()]
    }
}

/// Split a reply into bodies of at most `max` characters, preferring to break at whitespace.
pub fn split_message(text: &str, max: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    while start < chars.len() {
        let mut end = (start + max).min(chars.len());
        if end < chars.len()
            && let Some(ws) = chars[start..end].iter().rposition(|c| c.is_whitespace())
            && ws > max / 2
        {
            end = start + ws + 1;
        }
        let part: String = chars[start..end].iter().collect();
        let trimmed = part.trim_end();
        if !trimmed.is_empty() {
            parts.push(trimmed.to_string());
        }
        start = end;
    }
    parts
}

/// `configured`, without a trailing `/`, or the provider's own address when it is not set.
pub(crate) fn api_base<'a>(configured: &'a str, default: &'a str) -> &'a str {
    if configured.is_empty() {
        default
    } else {
        configured.trim_end_matches('/')
    }
}

/// Send a provider's API request and read its answer: a 2xx body as `T`, else the
/// [`SendError`] the status means. `rejected` lists the statuses that say the message itself
/// is wrong (sending it again cannot help); 429 is [`SendError::Throttled`]; everything else
/// (5xx, credentials an operator can fix, an unreadable answer, no connection) is
/// [`SendError::Unavailable`]: retried, then dead-lettered, replayable once fixed.
pub(crate) async fn send_request<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    provider: &str,
    rejected: &[u16],
) -> Result<T, SendError> {
    let body = send_for_status(request, provider, rejected).await?;
    serde_json::from_str(&body)
        .map_err(|e| SendError::Unavailable(format!("unreadable {provider} answer: {e}")))
}

/// [`send_request`] for a far end whose 2xx body means nothing (a callback receiver may answer
/// with an empty body): the body as text.
pub(crate) async fn send_for_status(
    request: reqwest::RequestBuilder,
    provider: &str,
    rejected: &[u16],
) -> Result<String, SendError> {
    let resp = request
        .send()
        .await
        .map_err(|e| SendError::Unavailable(e.to_string()))?;
    let status = resp.status().as_u16();
    let retry_after = retry_after(resp.headers());
    let body = resp.text().await.unwrap_or_default();
    classify(provider, status, retry_after, &body, rejected)?;
    Ok(body)
}

/// The body of a 2xx answer, or the error its status means (see [`send_request`]).
fn classify<'a>(
    provider: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &'a str,
    rejected: &[u16],
) -> Result<&'a str, SendError> {
    let detail = || format!("{provider} HTTP {status}: {}", clip(body));
    match status {
        200..=299 => Ok(body),
        429 => Err(SendError::Throttled {
            retry_after,
            detail: detail(),
        }),
        s if rejected.contains(&s) => Err(SendError::Rejected(detail())),
        _ => Err(SendError::Unavailable(detail())),
    }
}

/// `Retry-After` in seconds, if the provider sent one.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// At most 300 characters of a provider's answer, for errors and dead letters.
fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_replies_are_split_at_whitespace_within_the_limit() {
        let text = "word ".repeat(700); // 3,500 chars
        let parts = split_message(&text, 1600);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.chars().count() <= 1600));
        assert_eq!(parts.join(" "), text.trim_end());
    }

    #[test]
    fn a_providers_status_says_whether_to_retry() {
        let classify = |status, retry| classify("Acme", status, retry, "{\"why\":1}", &[400, 422]);
        assert_eq!(classify(201, None), Ok("{\"why\":1}"));
        assert_eq!(
            classify(429, Some(Duration::from_secs(3))),
            Err(SendError::Throttled {
                retry_after: Some(Duration::from_secs(3)),
                detail: "Acme HTTP 429: {\"why\":1}".into()
            })
        );
        assert!(
            matches!(classify(400, None), Err(SendError::Rejected(d)) if d.contains("HTTP 400"))
        );
        assert!(matches!(classify(422, None), Err(SendError::Rejected(_))));
        for retried in [401, 403, 404, 500, 503] {
            assert!(
                matches!(classify(retried, None), Err(SendError::Unavailable(_))),
                "{retried}"
            );
        }
    }

    fn logged(id: &str, secs: i64) -> Logged {
        Logged {
            id: id.into(),
            created: DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_log_is_read_page_by_page_and_its_matches_come_back_oldest_first() {
        let mut asked = Vec::new();
        let found = search_log("Acme", "p1".into(), MAX_LOG_PAGES, |page| {
            asked.push(page.clone());
            async move {
                Ok(match page.as_str() {
                    "p1" => LogPage {
                        matches: vec![logged("new", 9)],
                        next: Some("p2".into()),
                    },
                    _ => LogPage {
                        matches: vec![logged("old", 1), logged("new", 9)],
                        next: None,
                    },
                })
            }
        })
        .await;
        assert_eq!(found, Ok(vec!["old".to_string(), "new".to_string()]));
        assert_eq!(asked, ["p1", "p2"]);
    }

    #[tokio::test]
    async fn a_log_too_long_to_read_or_unreadable_is_an_error_never_an_empty_answer() {
        let endless = search_log("Acme", "0".into(), MAX_LOG_PAGES, |page| async move {
            Ok(LogPage {
                matches: vec![],
                next: Some(format!("{page}+")),
            })
        })
        .await;
        assert!(
            matches!(endless, Err(SendError::Unavailable(e)) if e.contains("more than 20 pages"))
        );
        let down = search_log("Acme", "0".into(), MAX_LOG_PAGES, |_| async {
            Err::<LogPage, _>(SendError::Unavailable("Acme HTTP 503".into()))
        })
        .await;
        assert_eq!(down, Err(SendError::Unavailable("Acme HTTP 503".into())));
    }

    #[test]
    fn a_short_reply_is_one_part_and_multibyte_text_counts_characters() {
        assert_eq!(split_message("hi", 1600), vec!["hi"]);
        let emoji = "é".repeat(1600);
        assert_eq!(split_message(&emoji, 1600).len(), 1);
        assert!(split_message("", 1600).is_empty());
    }
}
