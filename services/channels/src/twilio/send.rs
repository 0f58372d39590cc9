//! Twilio's Messages API: `POST {base}/2010-04-01/Accounts/{AccountSid}/Messages.json` sends,
//! `GET` on the same resource lists what the account sent (`To`, `From`, `DateSent>=` filters,
//! most recent first, `next_page_uri` to the next page).
use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;
use switchboard_kit::config::TwilioConfig;

use crate::egress::{self, AttachmentStyle, Egress, LogPage, Logged, OutboundPart, SendError};

/// Twilio's limit on one message body.
pub const MAX_BODY_CHARS: usize = 1600;

/// Twilio's limit on the media of one message.
pub const MAX_MEDIA: usize = 10;

#[derive(Clone)]
pub struct TwilioSender {
    http: reqwest::Client,
    config: TwilioConfig,
    /// Where Twilio posts what becomes of each message (`StatusCallback`): the webhook the
    /// messages come in on, which keeps them as delivery receipts. `None`: not asked for.
    status_callback: Option<String>,
}

#[derive(Deserialize)]
struct Created {
    sid: String,
}

/// One page of Twilio's Messages list.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagePage {
    messages: Vec<ListedMessage>,
    /// Relative to the API's base; absent or null on the last page.
    #[serde(default)]
    next_page_uri: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ListedMessage {
    sid: String,
    to: String,
    from: String,
    #[serde(default)]
    body: String,
    /// RFC 2822: `Mon, 23 Nov 2026 10:00:00 +0000`.
    date_created: String,
}

/// Which listed bodies are the part's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BodyMatch<'a> {
    /// The body sent as written.
    Is(&'a str),
    /// A template Twilio filled in: its body holds the text given as its variable.
    Holds(&'a str),
}

impl BodyMatch<'_> {
    fn matches(self, listed: &str) -> bool {
        match self {
            BodyMatch::Is(body) => listed == body,
            BodyMatch::Holds(text) => listed.contains(text),
        }
    }
}

impl MessagePage {
    /// The messages on this page to `to`, from `from` (any sender when Twilio picks it from a
    /// Messaging Service), whose body is the part's, created at or after `not_before`; and the
    /// next page.
    pub(crate) fn read(
        self,
        to: &str,
        from: Option<&str>,
        body: BodyMatch<'_>,
        not_before: DateTime<Utc>,
    ) -> Result<LogPage, SendError> {
        let mut matches = Vec::new();
        for m in self.messages {
            let created = DateTime::parse_from_rfc2822(&m.date_created)
                .map_err(|e| {
                    SendError::Unavailable(format!(
                        "Twilio listed {} with an unreadable date_created {:?}: {e}",
                        m.sid, m.date_created
                    ))
                })?
                .with_timezone(&Utc);
            if m.to == to
                && from.is_none_or(|f| m.from == f)
                && body.matches(&m.body)
                && created >= not_before
            {
                matches.push(Logged { id: m.sid, created });
            }
        }
        Ok(LogPage {
            matches,
            next: self.next_page_uri.filter(|u| !u.is_empty()),
        })
    }
}

impl TwilioSender {
    pub fn new(config: TwilioConfig) -> Self {
        Self {
            http: crate::http_client(),
            config,
            status_callback: None,
        }
    }

    /// The same sender, asking Twilio to post each message's status to `public_url` + `route`
    /// (none when no public URL is configured: Twilio could not reach it).
    pub fn with_status_callback(mut self, public_url: &str, route: &str) -> Self {
        let base = public_url.trim_end_matches('/');
        self.status_callback = (!base.is_empty()).then(|| format!("{base}{route}"));
        self
    }

    fn base(&self) -> &str {
        egress::api_base(&self.config.api_base, "https://api.twilio.com")
    }

    fn messages_url(&self) -> String {
        format!(
            "{}/2010-04-01/Accounts/{}/Messages.json",
            self.base(),
            self.config.account_sid
        )
    }

    /// The `From` a send names: the configured number, else the number the person wrote to;
    /// none when a Messaging Service picks it.
    fn sender_number<'a>(&'a self, from: &'a str) -> Option<&'a str> {
        if !self.config.messaging_service_sid.is_empty() {
            None
        } else if !self.config.from_number.is_empty() {
            Some(&self.config.from_number)
        } else {
            Some(from)
        }
    }

    /// Send one body (≤ 1,600 characters). Returns Twilio's message sid.
    pub async fn send_body(&self, to: &str, from: &str, body: &str) -> Result<String, SendError> {
        self.send_message(to, from, body, &[]).await
    }

    /// Send one body with up to 10 media (`MediaUrl`, one field each: an MMS; Twilio fetches
    /// each URL itself, so it must be reachable from the internet). The body may be empty
    /// when there is media.
    pub async fn send_message(
        &self,
        to: &str,
        from: &str,
        body: &str,
        media: &[&str],
    ) -> Result<String, SendError> {
        let mut form: Vec<(&str, &str)> = vec![("To", to), ("Body", body)];
        form.extend(media.iter().take(MAX_MEDIA).map(|m| ("MediaUrl", *m)));
        match self.sender_number(from) {
            Some(from) => form.push(("From", from)),
            None => form.push(("MessagingServiceSid", &self.config.messaging_service_sid)),
        }
        self.create(&form).await
    }

    /// Create one message from the Messages API's form fields (`To`, `From`, `Body`,
    /// `MediaUrl`, `ContentSid`, …). Returns Twilio's message sid.
    pub(crate) async fn create(&self, form: &[(&str, &str)]) -> Result<String, SendError> {
        let mut form = form.to_vec();
        if let Some(url) = &self.status_callback {
            form.push(("StatusCallback", url));
        }
        let request = self
            .http
            .post(self.messages_url())
            .basic_auth(
                &self.config.account_sid,
                Some(self.config.auth_token.expose()),
            )
            .form(&form);
        // 400 and 422: the request is wrong for this recipient (invalid number, unsubscribed).
        let created: Created = egress::send_request(request, "Twilio", &[400, 422]).await?;
        Ok(created.sid)
    }

    /// The sids of the messages Twilio's log holds to `to` from our number with `body`,
    /// created at or after `since` (less the clock skew), oldest first. Twilio filters by the
    /// day a message was sent (UTC), so the query asks from the day the skewed start falls on.
    pub async fn find_body(
        &self,
        to: &str,
        from: &str,
        body: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, SendError> {
        self.find_listed(to, self.sender_number(from), BodyMatch::Is(body), since)
            .await
    }

    /// [`Self::find_body`] from exactly `from` (none: any of a Messaging Service's senders),
    /// matching bodies by `body`.
    pub(crate) async fn find_listed(
        &self,
        to: &str,
        from: Option<&str>,
        body: BodyMatch<'_>,
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, SendError> {
        let not_before = egress::not_before(since);
        let mut query = vec![
            ("To", to.to_string()),
            ("DateSent>", not_before.format("%Y-%m-%d").to_string()),
            ("PageSize", "100".to_string()),
        ];
        if let Some(from) = from {
            query.push(("From", from.to_string()));
        }
        let first = reqwest::Url::parse_with_params(&self.messages_url(), &query)
            .map_err(|e| SendError::Unavailable(format!("Twilio list URL: {e}")))?;
        egress::search_log(
            "Twilio",
            first.to_string(),
            egress::MAX_LOG_PAGES,
            |url| async move {
                // `next_page_uri` is relative to the API's base.
                let url = if url.starts_with('/') {
                    format!("{}{url}", self.base())
                } else {
                    url
                };
                let request = self.http.get(url).basic_auth(
                    &self.config.account_sid,
                    Some(self.config.auth_token.expose()),
                );
                let page: MessagePage = egress::read_log(request, "Twilio").await?;
                page.read(to, from, body, not_before)
            },
        )
        .await
    }
}

impl Egress for TwilioSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, MAX_BODY_CHARS)
    }

    /// MMS: the files go as media of the first part.
    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::Media
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            let media: Vec<&str> = part.attachments.iter().map(|a| a.url.as_str()).collect();
            self.send_message(part.to(), part.from(), part.text, &media)
                .await
        }
        .boxed()
    }

    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        self.find_body(part.to(), part.from(), part.text, since)
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// A page as Twilio lists it, most recent first.
    fn page(next: Option<&str>) -> MessagePage {
        serde_json::from_value(serde_json::json!({
            "first_page_uri": "/2010-04-01/Accounts/AC1/Messages.json?To=%2B14155550100&PageSize=100&Page=0",
            "page": 0,
            "page_size": 100,
            "next_page_uri": next,
            "messages": [
                {"sid": "SMlater", "to": "+14155550100", "from": "+15555550199",
                 "body": "hello", "status": "delivered", "direction": "outbound-api",
                 "date_created": "Mon, 23 Nov 2026 10:00:09 +0000",
                 "date_sent": "Mon, 23 Nov 2026 10:00:10 +0000"},
                {"sid": "SMqueued", "to": "+14155550100", "from": "+15555550199",
                 "body": "hello", "status": "queued", "direction": "outbound-api",
                 "date_created": "Mon, 23 Nov 2026 10:00:01 +0000", "date_sent": null},
                {"sid": "SMother", "to": "+14155550100", "from": "+15555550199",
                 "body": "hello again", "status": "sent",
                 "date_created": "Mon, 23 Nov 2026 10:00:05 +0000"},
                {"sid": "SMelsewhere", "to": "+14155550101", "from": "+15555550199",
                 "body": "hello", "status": "sent",
                 "date_created": "Mon, 23 Nov 2026 10:00:05 +0000"},
                {"sid": "SMotherline", "to": "+14155550100", "from": "+15555550000",
                 "body": "hello", "status": "sent",
                 "date_created": "Mon, 23 Nov 2026 10:00:05 +0000"},
                {"sid": "SMbefore", "to": "+14155550100", "from": "+15555550199",
                 "body": "hello", "status": "delivered",
                 "date_created": "Mon, 23 Nov 2026 09:59:54 +0000"}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn a_listed_message_matches_only_with_the_same_to_from_body_and_a_time_after_the_attempt() {
        // The attempt started at 10:00:00.4; Twilio writes whole seconds, so 10:00:00 is
        // still "after" within the allowed skew, and 09:59:54 is not.
        let since = at("2026-11-23T10:00:00.400Z");
        let read = page(None)
            .read(
                "+14155550100",
                Some("+15555550199"),
                BodyMatch::Is("hello"),
                egress::not_before(since),
            )
            .unwrap();
        let ids: Vec<_> = read.matches.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["SMlater", "SMqueued"]);
        assert!(read.next.is_none(), "a null next_page_uri is the last page");
    }

    #[test]
    fn with_a_messaging_service_any_of_our_senders_matches() {
        let since = at("2026-11-23T10:00:00Z");
        let read = page(Some(
            "/2010-04-01/Accounts/AC1/Messages.json?Page=1&PageToken=PA1",
        ))
        .read(
            "+14155550100",
            None,
            BodyMatch::Is("hello"),
            egress::not_before(since),
        )
        .unwrap();
        assert_eq!(read.matches.len(), 3, "{:?}", read.matches);
        assert_eq!(
            read.next.as_deref(),
            Some("/2010-04-01/Accounts/AC1/Messages.json?Page=1&PageToken=PA1")
        );
    }

    #[test]
    fn an_unreadable_date_is_an_error_not_a_miss() {
        let page: MessagePage = serde_json::from_value(serde_json::json!({
            "messages": [{"sid": "SM1", "to": "+1", "from": "+2", "body": "x",
                          "date_created": "yesterday"}],
            "next_page_uri": null
        }))
        .unwrap();
        let read = page.read("+1", Some("+2"), BodyMatch::Is("x"), Utc::now());
        assert!(matches!(read, Err(SendError::Unavailable(e)) if e.contains("yesterday")));
    }
}
