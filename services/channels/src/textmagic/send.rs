//! TextMagic's v2 Messages API: `POST {base}/api/v2/messages` with `X-TM-Username` and
//! `X-TM-Key`, a JSON body of `text`, `phones` (digits, no `+`) and `from`; 201 with the
//! message's `id`, 429 when we must slow down. `GET` on the same resource lists the account's
//! outbound messages, newest first, `page` by `page` (`limit` a page, `pageCount` pages).
//!
//! The send API also takes a `referenceId`, but TextMagic hands it back only on delivery
//! callbacks and sessions, not on the outbound message list, so it cannot make the look-up
//! exact: the list is matched by recipient, sender, text and time like Twilio's.
//!
//! Unlike Twilio's, the list has no filter: it holds every message of the account, newest
//! first. At a high send rate the attempt a look-up asks about lies many pages back (at 80
//! messages a second, a minute is 48 pages of 100), so the look-up first skips the pages that
//! are wholly newer than the attempt could have reached TextMagic ([`egress::not_after`]), by a
//! galloping search over page numbers, and then reads only the pages of the attempt's window.
use std::future::Future;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Either};
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

/// At most this many pages of TextMagic's list are read from the first page of an attempt's
/// window on (the window spans [`crate::REQUEST_TIMEOUT`] and twice the clock skew, 40 s: 100
/// pages of 100 hold 250 messages a second); beyond that the part is not sent blind.
pub const MAX_WINDOW_PAGES: usize = 100;

/// At most this many pages are probed to find the window's first page (a galloping search
/// takes about 2 log2(pages): 40 probes reach a million pages back).
const MAX_SEEK_PROBES: usize = 40;

impl MessagePage {
    /// Whether every message on this page was created after `not_after` (the list is newest
    /// first, so its last message is its oldest). An empty page holds nothing newer.
    fn wholly_after(&self, not_after: DateTime<Utc>) -> Result<bool, SendError> {
        let Some(oldest) = self.resources.last() else {
            return Ok(false);
        };
        let sent = textmagic_time(&oldest.message_time).ok_or_else(|| {
            SendError::Unavailable(format!(
                "TextMagic listed a message with an unreadable messageTime {:?}",
                oldest.message_time
            ))
        })?;
        Ok(sent > not_after)
    }

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
    /// `text`, sent at or after `since` (less the clock skew), oldest first ([`find_in_list`]).
    pub async fn find_text(
        &self,
        to: &str,
        from: &str,
        text: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, SendError> {
        let (to, from) = (textmagic_number(to), self.sender_number(from));
        let url = format!("{}/api/v2/messages", self.base());
        find_in_list(&to, &from, text, since, |page| {
            let request = self
                .http
                .get(&url)
                .query(&[("page", page.to_string()), ("limit", "100".into())])
                .header("X-TM-Username", &self.config.username)
                .header("X-TM-Key", self.config.api_key.expose());
            egress::read_log::<MessagePage>(request, "TextMagic")
        })
        .await
    }
}

/// The look-up over TextMagic's list, `fetch` reading one page: the pages newer than the
/// attempt's window are skipped ([`first_window_page`]), then the list is read until a page
/// reaches back before the attempt.
async fn find_in_list<F, Fut>(
    to: &str,
    from: &str,
    text: &str,
    since: DateTime<Utc>,
    mut fetch: F,
) -> Result<Vec<String>, SendError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<MessagePage, SendError>>,
{
    let not_before = egress::not_before(since);
    let Some((first, read_first)) = first_window_page(egress::not_after(since), &mut fetch).await?
    else {
        return Ok(Vec::new());
    };
    // The search found the first page by reading it: its first read is that one.
    let mut read_first = Some(read_first);
    egress::search_log("TextMagic", first.to_string(), MAX_WINDOW_PAGES, |page| {
        let read = match read_first.take() {
            Some(read) => Ok(Either::Left(std::future::ready(Ok(read)))),
            None => page.parse::<u32>().map(|page| Either::Right(fetch(page))),
        };
        async move {
            let read = read.map_err(|e| SendError::Unavailable(format!("page {e}")))?;
            read.await?.read(to, from, text, not_before)
        }
    })
    .await
}

/// The first page of TextMagic's list (newest first) that can hold a message created at or
/// before `not_after`, or none when every listed message is newer. Page 1 when it already
/// reaches back that far (a look-up soon after its attempt); else a galloping search over page
/// numbers: pages 2, 3, 5, 9, … until one is not wholly newer, then halving between the last
/// wholly newer page and it. The list grows while it is searched, which only moves messages to
/// later pages, so starting at the page found never skips one of the window.
async fn first_window_page<F, Fut>(
    not_after: DateTime<Utc>,
    mut fetch: F,
) -> Result<Option<(u32, MessagePage)>, SendError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<MessagePage, SendError>>,
{
    let mut probes = 0;
    let mut probe = |page: u32| {
        probes += 1;
        let read = (probes <= MAX_SEEK_PROBES).then(|| fetch(page));
        async move {
            match read {
                Some(read) => read.await,
                None => Err(SendError::Unavailable(format!(
                    "TextMagic's message list: no page before the attempt found in \
                     {MAX_SEEK_PROBES} probes"
                ))),
            }
        }
    };
    let first = probe(1).await?;
    if !first.wholly_after(not_after)? {
        return Ok(Some((1, first)));
    }
    // `newer` is wholly newer than the window; `step` doubles until a page is not.
    let (mut newer, mut step, mut last) = (1u32, 1u32, first.page_count.max(1));
    let (mut older, mut older_read) = loop {
        let page = newer.saturating_add(step).min(last);
        let read = probe(page).await?;
        last = last.max(read.page_count);
        if !read.wholly_after(not_after)? {
            break (page, read);
        }
        if page >= read.page_count {
            // The last page is newer than the window too: nothing was sent in it.
            return Ok(None);
        }
        (newer, step) = (page, step.saturating_mul(2));
    };
    while older - newer > 1 {
        let mid = newer + (older - newer) / 2;
        let read = probe(mid).await?;
        if read.wholly_after(not_after)? {
            newer = mid;
        } else {
            (older, older_read) = (mid, read);
        }
    }
    Ok(Some((older, older_read)))
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

#[cfg(test)]
mod window_tests {
    use std::cell::RefCell;

    use super::*;

    const PERSON: &str = "447860021130";
    const OURS: &str = "447624800500";

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    /// An account's outbound list, newest first, served 100 a page as TextMagic serves it;
    /// `grow` new messages (to others) land on top before every page is read.
    struct Account {
        newest_first: RefCell<Vec<serde_json::Value>>,
        next_id: RefCell<i64>,
        asked: RefCell<Vec<u32>>,
        grow: usize,
    }

    impl Account {
        /// `oldest_first`: (seconds after the epoch of the test, receiver, text).
        fn new(oldest_first: &[(i64, &str, &str)], grow: usize) -> Self {
            let account = Self {
                newest_first: RefCell::new(Vec::new()),
                next_id: RefCell::new(49_000_000),
                asked: RefCell::new(Vec::new()),
                grow,
            };
            for (secs, receiver, text) in oldest_first {
                account.push(*secs, receiver, text);
            }
            account
        }

        fn push(&self, secs: i64, receiver: &str, text: &str) {
            let mut id = self.next_id.borrow_mut();
            *id += 1;
            self.newest_first.borrow_mut().insert(
                0,
                serde_json::json!({
                    "id": *id, "receiver": receiver, "sender": OURS, "text": text,
                    "messageTime": at(secs).format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                    "status": "d", "partsCount": 1,
                }),
            );
        }

        fn page(&self, page: u32) -> MessagePage {
            self.asked.borrow_mut().push(page);
            for _ in 0..self.grow {
                self.push(10_000, "447000000000", "someone else's reply");
            }
            let all = self.newest_first.borrow();
            let resources: Vec<_> = all
                .iter()
                .skip((page as usize - 1) * 100)
                .take(100)
                .cloned()
                .collect();
            serde_json::from_value(serde_json::json!({
                "page": page, "limit": 100, "pageCount": all.len().div_ceil(100).max(1),
                "resources": resources,
            }))
            .unwrap()
        }

        async fn find(&self, text: &str, since_secs: i64) -> Result<Vec<String>, SendError> {
            find_in_list(PERSON, OURS, text, at(since_secs), |page| {
                let read = self.page(page);
                async move { Ok(read) }
            })
            .await
        }

        fn id_of(&self, text: &str) -> String {
            let all = self.newest_first.borrow();
            let m = all.iter().find(|m| m["text"] == text).unwrap();
            m["id"].to_string()
        }
    }

    /// `n` messages to other people, one every `every` ms from `from_secs` on.
    fn others(n: usize, from_secs: i64, every_ms: i64) -> Vec<(i64, &'static str, &'static str)> {
        (0..n as i64)
            .map(|i| {
                (
                    from_secs + i * every_ms / 1000,
                    "447000000001",
                    "another reply",
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_part_far_back_in_a_busy_account_is_found_reading_little_more_than_its_window() {
        // The attempt started at 0 and reached TextMagic at 1; the look-up comes minutes later,
        // after 15,000 more messages (150 pages) to other people: more than a reader from the
        // newest page on may read.
        let mut list = others(300, -300, 1_000);
        list.push((1, PERSON, "hello"));
        list.extend(others(200, 1, 100));
        list.extend(others(15_000, 120, 10));
        let account = Account::new(&list, 0);
        let found = account.find("hello", 0).await;
        assert_eq!(found, Ok(vec![account.id_of("hello")]));
        let asked = account.asked.borrow().len();
        assert!(
            asked <= 25,
            "{asked} pages read: {:?}",
            account.asked.borrow()
        );
    }

    #[tokio::test]
    async fn a_part_never_sent_is_not_found_and_the_search_ends() {
        let mut list = others(300, -300, 1_000);
        list.extend(others(15_000, 120, 10));
        let account = Account::new(&list, 0);
        assert_eq!(account.find("hello", 0).await, Ok(vec![]));
        // Every listed message newer than the attempt's window: nothing of it can be listed.
        let newer_only = Account::new(&others(5_000, 600, 10), 0);
        assert_eq!(newer_only.find("hello", 0).await, Ok(vec![]));
        assert!(newer_only.asked.borrow().len() <= 8);
    }

    #[tokio::test]
    async fn a_list_growing_while_it_is_searched_still_yields_the_part() {
        let mut list = others(100, -100, 1_000);
        list.push((2, PERSON, "hello"));
        list.extend(others(3_000, 3, 10));
        list.extend(others(8_000, 200, 10));
        // 20 new messages land on top before every page read: pages shift under the search.
        let account = Account::new(&list, 20);
        assert_eq!(
            account.find("hello", 0).await,
            Ok(vec![account.id_of("hello")])
        );
    }

    #[tokio::test]
    async fn a_look_up_soon_after_its_attempt_starts_at_the_newest_page() {
        let mut list = others(50, -50, 1_000);
        list.push((1, PERSON, "hello"));
        list.push((2, PERSON, "hello"));
        let account = Account::new(&list, 0);
        let found = account.find("hello", 0).await.unwrap();
        assert_eq!(found.len(), 2, "both sends are listed, oldest first");
        assert_eq!(*account.asked.borrow(), [1], "one page read");
    }
}
