//! TextMagic's v2 Messages API: `X-TM-Username`/`X-TM-Key`, a JSON body of `text`, `phones`
//! (digits without `+`, comma separated) and `from`; 201 with the message's ids. `GET` lists
//! the account's outbound messages, newest first, by `page` and `limit` (at most 100), with no
//! filter by recipient: a deliverer pages back until it passes its attempt.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use chrono::Utc;
use serde::Deserialize;
use serde_json::json;

use crate::serve::{Failures, header, serve};
use crate::sms::{Outbox, Provider, SendObserver, SentSms};

#[derive(Clone)]
pub struct FakeTextMagic {
    /// The API base to configure (`textmagic.api_base`); empty for a fake only mounted in
    /// another server's router ([`FakeTextMagic::router`]).
    pub url: String,
    pub username: String,
    pub api_key: String,
    /// 429 (slow down) or 5xx (an outage) on demand.
    pub failures: Failures,
    /// Failures of the message list alone (the send API keeps working).
    pub list_failures: Failures,
    inner: Arc<Inner>,
}

struct Inner {
    outbox: Outbox,
    ids: AtomicU64,
}

/// The query of TextMagic's outbound message list.
#[derive(Deserialize)]
struct ListQuery {
    page: Option<usize>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct SendBody {
    text: Option<String>,
    phones: Option<String>,
    from: Option<String>,
}

fn textmagic_error(status: StatusCode) -> (StatusCode, Json<serde_json::Value>) {
    (
        status,
        Json(json!({"code": status.as_u16(), "message": status.canonical_reason()})),
    )
}

fn validation_failed(field: &str, message: &str) -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"code": 400, "message": "Validation Failed",
            "errors": {"fields": {field: [message]}}})),
    )
}

impl FakeTextMagic {
    /// The account's fake, not yet listening: mount [`Self::router`] where it should answer.
    pub fn new(username: &str, api_key: &str) -> Self {
        Self {
            url: String::new(),
            username: username.into(),
            api_key: api_key.into(),
            failures: Failures::default(),
            list_failures: Failures::default(),
            inner: Arc::new(Inner {
                outbox: Outbox::default(),
                ids: AtomicU64::new(49_575_710),
            }),
        }
    }

    /// The account's fake on a port of its own.
    pub async fn start(username: &str, api_key: &str) -> Self {
        let mut this = Self::new(username, api_key);
        this.url = serve(this.router()).await;
        this
    }

    /// TextMagic's routes, from `/api/v2`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/v2/messages", post(Self::send).get(Self::list))
            .with_state(self.clone())
    }

    /// Tell `observer` of every message taken from now on (one observer a fake).
    pub fn observe(&self, observer: Arc<dyn SendObserver>) {
        self.inner.outbox.observe(observer);
    }

    /// Every message taken, oldest first.
    pub fn sent(&self) -> Vec<SentSms> {
        self.inner.outbox.all()
    }

    /// How many times the outbound list was asked for.
    pub fn lookups(&self) -> u64 {
        self.inner.outbox.lookups()
    }

    /// TextMagic's 401, unless the request carries this account's username and key.
    fn authenticate(
        &self,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
        if header(headers, "x-tm-username") != self.username
            || header(headers, "x-tm-key") != self.api_key
        {
            return Err(textmagic_error(StatusCode::UNAUTHORIZED));
        }
        Ok(())
    }

    async fn list(
        State(s): State<FakeTextMagic>,
        headers: HeaderMap,
        Query(q): Query<ListQuery>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&headers) {
            return refused;
        }
        s.inner.outbox.looked_up();
        if let Some(status) = s.list_failures.take() {
            return textmagic_error(status);
        }
        let (page, limit) = (
            q.page.unwrap_or(1).max(1),
            q.limit.unwrap_or(10).clamp(1, 100),
        );
        let (resources, total) = s.inner.outbox.newest((page - 1) * limit, limit, |m| {
            let id = m.sid.parse::<u64>().unwrap_or_default();
            json!({
                "id": id, "contactId": 0, "sessionId": id,
                "receiver": m.to, "sender": m.from,
                "messageTime": m.created.format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                "status": "d", "text": m.body, "charset": "ISO-8859-1",
                "firstName": "", "lastName": "", "country": "GB", "phone": m.to,
                "price": 0.049, "partsCount": 1, "deleted": false,
            })
        });
        (
            StatusCode::OK,
            Json(json!({
                "page": page, "limit": limit, "pageCount": total.div_ceil(limit).max(1),
                "resources": resources,
            })),
        )
    }

    async fn send(
        State(s): State<FakeTextMagic>,
        headers: HeaderMap,
        Json(m): Json<SendBody>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&headers) {
            return refused;
        }
        if let Some(status) = s.failures.take() {
            return textmagic_error(status);
        }
        let (Some(text), Some(phones)) = (m.text, m.phones) else {
            return validation_failed("text", "This value should not be blank.");
        };
        if phones.is_empty()
            || !phones
                .split(',')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return validation_failed("phones", "Invalid phone number format.");
        }
        let id = s.inner.ids.fetch_add(1, Ordering::SeqCst);
        s.inner.outbox.take(SentSms {
            provider: Provider::TextMagic,
            sid: id.to_string(),
            to: phones,
            from: m.from.unwrap_or_default(),
            body: text,
            media_urls: Vec::new(),
            created: Utc::now(),
            user_agent: Some(header(&headers, "user-agent").to_string()).filter(|u| !u.is_empty()),
        });
        (
            StatusCode::CREATED,
            Json(json!({"id": id, "href": format!("/api/v2/messages/{id}"),
                "type": "message", "sessionId": id, "bulkId": null, "messageId": id,
                "scheduleId": null})),
        )
    }
}
