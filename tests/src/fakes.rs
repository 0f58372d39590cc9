//! Third parties as real HTTP servers speaking their real wire formats.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tokio::sync::Notify;

async fn serve(router: Router) -> String {
    let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Failures a fake answers on demand: the next `n` requests get HTTP `status`.
#[derive(Clone, Default)]
pub struct Failures {
    next: Arc<AtomicUsize>,
    status: Arc<Mutex<u16>>,
}

impl Failures {
    pub fn fail_next(&self, n: usize, status: u16) {
        *self.status.lock().unwrap() = status;
        self.next.store(n, Ordering::SeqCst);
    }

    /// The status to fail this request with, if one of the next `n` is due.
    fn take(&self) -> Option<StatusCode> {
        self.next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()?;
        StatusCode::from_u16(*self.status.lock().unwrap()).ok()
    }
}

/// One SMS a fake provider accepted.
#[derive(Debug, Clone)]
pub struct SentSms {
    pub sid: String,
    pub to: String,
    pub from: String,
    pub body: String,
    /// When the provider took it (its log's `date_created` / `messageTime`).
    pub created: DateTime<Utc>,
}

/// Twilio's Messages API: Basic auth, form `To`/`From`/`Body`, 201 with a `sid`; `GET` lists
/// what it accepted (`To`, `From`, `DateSent>` filters, most recent first, paged with
/// `next_page_uri`).
#[derive(Clone)]
pub struct FakeTwilio {
    pub url: String,
    pub account_sid: String,
    pub auth_token: String,
    sent: Arc<Mutex<Vec<SentSms>>>,
    failures: Failures,
    /// Failures of the message list alone (the send API keeps working).
    pub list_failures: Failures,
    /// MMS media by path, as Twilio serves it (Basic auth required).
    media: Arc<Mutex<HashMap<String, Media>>>,
}

/// A media file: its content type and bytes.
type Media = (String, Vec<u8>);

/// The query of Twilio's Messages list.
#[derive(Deserialize)]
struct TwilioListQuery {
    #[serde(rename = "To")]
    to: Option<String>,
    #[serde(rename = "From")]
    from: Option<String>,
    /// `DateSent>=YYYY-MM-DD`: the key is `DateSent>`.
    #[serde(rename = "DateSent>")]
    date_sent_after: Option<String>,
    #[serde(rename = "PageSize")]
    page_size: Option<usize>,
    #[serde(rename = "Page")]
    page: Option<usize>,
}

#[derive(Deserialize)]
struct TwilioForm {
    #[serde(rename = "To")]
    to: Option<String>,
    #[serde(rename = "From")]
    from: Option<String>,
    #[serde(rename = "MessagingServiceSid")]
    messaging_service_sid: Option<String>,
    #[serde(rename = "Body")]
    body: Option<String>,
}

impl FakeTwilio {
    pub async fn start(account_sid: &str, auth_token: &str) -> Self {
        let mut this = Self {
            url: String::new(),
            account_sid: account_sid.into(),
            auth_token: auth_token.into(),
            sent: Default::default(),
            failures: Default::default(),
            list_failures: Default::default(),
            media: Default::default(),
        };
        let router = Router::new()
            .route(
                "/2010-04-01/Accounts/{account}/Messages.json",
                post(Self::create_message).get(Self::list_messages),
            )
            .route(
                "/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}",
                axum::routing::get(Self::get_media),
            )
            .with_state(this.clone());
        this.url = serve(router).await;
        this
    }

    pub fn sent(&self) -> Vec<SentSms> {
        self.sent.lock().unwrap().clone()
    }

    /// Answer the next `n` requests with 500 (a Twilio outage).
    pub fn fail_next(&self, n: usize) {
        self.failures.fail_next(n, 500);
    }

    /// A picture a person sent by MMS: its `MediaUrl` (Twilio's media URL form).
    pub fn add_media(&self, content_type: &str, bytes: Vec<u8>) -> String {
        let path = format!(
            "/2010-04-01/Accounts/{}/Messages/MM{}/Media/ME{}",
            self.account_sid,
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.media
            .lock()
            .unwrap()
            .insert(path.clone(), (content_type.into(), bytes));
        format!("{}{path}", self.url)
    }

    async fn get_media(
        State(s): State<FakeTwilio>,
        Path((account, message, media)): Path<(String, String, String)>,
        headers: HeaderMap,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused.into_response();
        }
        let path = format!("/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}");
        match s.media.lock().unwrap().get(&path).cloned() {
            Some((content_type, bytes)) => {
                ([(axum::http::header::CONTENT_TYPE, content_type)], bytes).into_response()
            }
            None => StatusCode::NOT_FOUND.into_response(),
        }
    }

    /// Twilio's 401, unless the request carries this account's Basic credentials.
    fn authenticate(
        &self,
        account: &str,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", self.account_sid, self.auth_token))
        );
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if account != self.account_sid || auth != expected {
            return Err((
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"code": 20003, "message": "Authenticate", "status": 401})),
            ));
        }
        Ok(())
    }

    async fn list_messages(
        State(s): State<FakeTwilio>,
        Path(account): Path<String>,
        headers: HeaderMap,
        Query(q): Query<TwilioListQuery>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused;
        }
        if let Some(status) = s.list_failures.take() {
            return (
                status,
                Json(
                    serde_json::json!({"code": 20500, "message": "Internal Server Error", "status": status.as_u16()}),
                ),
            );
        }
        let after = match q
            .date_sent_after
            .as_deref()
            .map(|d| d.parse::<chrono::NaiveDate>())
        {
            None => None,
            Some(Ok(day)) => Some(day),
            Some(Err(_)) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(
                        serde_json::json!({"code": 20001, "message": "Invalid value for DateSent", "status": 400}),
                    ),
                );
            }
        };
        let mut listed: Vec<SentSms> = s
            .sent()
            .into_iter()
            .filter(|m| q.to.as_ref().is_none_or(|t| &m.to == t))
            .filter(|m| q.from.as_ref().is_none_or(|f| &m.from == f))
            .filter(|m| after.is_none_or(|d| m.created.date_naive() >= d))
            .collect();
        listed.reverse(); // most recent first
        let (page, page_size) = (
            q.page.unwrap_or(0),
            q.page_size.unwrap_or(50).clamp(1, 1000),
        );
        let rest = listed.split_off((page * page_size).min(listed.len()));
        let more = rest.len() > page_size;
        let on_page: Vec<_> = rest.into_iter().take(page_size).collect();
        let uri = |page: usize| {
            let mut query = form_urlencoded::Serializer::new(String::new());
            for (k, v) in [
                ("To", &q.to),
                ("From", &q.from),
                ("DateSent>", &q.date_sent_after),
            ] {
                if let Some(v) = v {
                    query.append_pair(k, v);
                }
            }
            query.append_pair("PageSize", &page_size.to_string());
            query.append_pair("Page", &page.to_string());
            format!(
                "/2010-04-01/Accounts/{account}/Messages.json?{}",
                query.finish()
            )
        };
        let rfc2822 = |t: DateTime<Utc>| t.format("%a, %d %b %Y %H:%M:%S %z").to_string();
        let messages: Vec<_> = on_page
            .iter()
            .map(|m| {
                serde_json::json!({
                    "sid": m.sid, "account_sid": account, "to": m.to, "from": m.from,
                    "body": m.body, "status": "sent", "direction": "outbound-api",
                    "num_segments": "1", "api_version": "2010-04-01",
                    "date_created": rfc2822(m.created), "date_updated": rfc2822(m.created),
                    "date_sent": rfc2822(m.created),
                    "uri": format!("/2010-04-01/Accounts/{account}/Messages/{}.json", m.sid),
                })
            })
            .collect();
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "messages": messages,
                "page": page,
                "page_size": page_size,
                "uri": uri(page),
                "first_page_uri": uri(0),
                "previous_page_uri": (page > 0).then(|| uri(page - 1)),
                "next_page_uri": more.then(|| uri(page + 1)),
                "start": page * page_size,
                "end": page * page_size + on_page.len().saturating_sub(1),
            })),
        )
    }

    async fn create_message(
        State(s): State<FakeTwilio>,
        Path(account): Path<String>,
        headers: HeaderMap,
        Form(f): Form<TwilioForm>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused;
        }
        if let Some(status) = s.failures.take() {
            return (
                status,
                Json(
                    serde_json::json!({"code": 20500, "message": "Internal Server Error", "status": status.as_u16()}),
                ),
            );
        }
        let (Some(to), Some(body)) = (f.to, f.body) else {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 21604, "message": "A 'To' phone number and a 'Body' are required.", "status": 400}),
                ),
            );
        };
        if f.from.is_none() && f.messaging_service_sid.is_none() {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 21603, "message": "A 'From' phone number is required.", "status": 400}),
                ),
            );
        }
        if body.chars().count() > 1600 {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 21617, "message": "The concatenated message body exceeds the 1600 character limit.", "status": 400}),
                ),
            );
        }
        let sms = SentSms {
            sid: format!("SM{}", uuid::Uuid::new_v4().simple()),
            to,
            from: f.from.unwrap_or_default(),
            body,
            created: Utc::now(),
        };
        s.sent.lock().unwrap().push(sms.clone());
        (
            StatusCode::CREATED,
            Json(
                serde_json::json!({"sid": sms.sid, "to": sms.to, "from": sms.from, "body": sms.body, "status": "queued"}),
            ),
        )
    }
}

/// TextMagic's v2 Messages API: `X-TM-Username`/`X-TM-Key`, a JSON body of `text`, `phones`
/// (digits without `+`, comma separated) and `from`; 201 with the message's ids. `GET` lists
/// what it accepted, newest first, by `page` and `limit`.
#[derive(Clone)]
pub struct FakeTextMagic {
    pub url: String,
    pub username: String,
    pub api_key: String,
    sent: Arc<Mutex<Vec<SentSms>>>,
    /// 429 (slow down) or 5xx (an outage) on demand.
    pub failures: Failures,
    /// Failures of the message list alone (the send API keeps working).
    pub list_failures: Failures,
    ids: Arc<AtomicUsize>,
}

/// The query of TextMagic's outbound message list.
#[derive(Deserialize)]
struct TextMagicListQuery {
    page: Option<usize>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct TextMagicMessage {
    text: Option<String>,
    phones: Option<String>,
    from: Option<String>,
}

impl FakeTextMagic {
    pub async fn start(username: &str, api_key: &str) -> Self {
        let mut this = Self {
            url: String::new(),
            username: username.into(),
            api_key: api_key.into(),
            sent: Default::default(),
            failures: Default::default(),
            list_failures: Default::default(),
            ids: Arc::new(AtomicUsize::new(49_575_710)),
        };
        let router = Router::new()
            .route("/api/v2/messages", post(Self::send).get(Self::list))
            .with_state(this.clone());
        this.url = serve(router).await;
        this
    }

    pub fn sent(&self) -> Vec<SentSms> {
        self.sent.lock().unwrap().clone()
    }

    /// TextMagic's 401, unless the request carries this account's username and key.
    fn authenticate(
        &self,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        if header("x-tm-username") != self.username || header("x-tm-key") != self.api_key {
            return Err((
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"code": 401, "message": "Unauthorized"})),
            ));
        }
        Ok(())
    }

    async fn list(
        State(s): State<FakeTextMagic>,
        headers: HeaderMap,
        Query(q): Query<TextMagicListQuery>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&headers) {
            return refused;
        }
        if let Some(status) = s.list_failures.take() {
            return (
                status,
                Json(
                    serde_json::json!({"code": status.as_u16(), "message": status.canonical_reason()}),
                ),
            );
        }
        let (page, limit) = (
            q.page.unwrap_or(1).max(1),
            q.limit.unwrap_or(10).clamp(1, 1000),
        );
        let mut all = s.sent();
        all.reverse(); // newest first
        let page_count = all.len().div_ceil(limit).max(1);
        let resources: Vec<_> = all
            .iter()
            .skip((page - 1) * limit)
            .take(limit)
            .map(|m| {
                serde_json::json!({
                    "id": m.sid.parse::<u64>().unwrap_or_default(), "contactId": 0,
                    "sessionId": m.sid.parse::<u64>().unwrap_or_default(),
                    "receiver": m.to, "sender": m.from,
                    "messageTime": m.created.format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                    "status": "d", "text": m.body, "charset": "ISO-8859-1",
                    "firstName": "", "lastName": "", "country": "GB", "phone": m.to,
                    "price": 0.049, "partsCount": 1, "deleted": false,
                })
            })
            .collect();
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "page": page, "limit": limit, "pageCount": page_count, "resources": resources,
            })),
        )
    }

    async fn send(
        State(s): State<FakeTextMagic>,
        headers: HeaderMap,
        Json(m): Json<TextMagicMessage>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&headers) {
            return refused;
        }
        if let Some(status) = s.failures.take() {
            return (
                status,
                Json(
                    serde_json::json!({"code": status.as_u16(), "message": status.canonical_reason()}),
                ),
            );
        }
        let (Some(text), Some(phones)) = (m.text, m.phones) else {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 400, "message": "Validation Failed",
                    "errors": {"fields": {"text": ["This value should not be blank."]}}}),
                ),
            );
        };
        if phones.is_empty()
            || !phones
                .split(',')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 400, "message": "Validation Failed",
                    "errors": {"fields": {"phones": ["Invalid phone number format."]}}}),
                ),
            );
        }
        let id = s.ids.fetch_add(1, Ordering::SeqCst);
        s.sent.lock().unwrap().push(SentSms {
            sid: id.to_string(),
            to: phones,
            from: m.from.unwrap_or_default(),
            body: text,
            created: Utc::now(),
        });
        (
            StatusCode::CREATED,
            Json(
                serde_json::json!({"id": id, "href": format!("/api/v2/sessions/{id}"),
                "type": "message", "sessionId": id, "bulkId": null, "messageId": id,
                "scheduleId": null}),
            ),
        )
    }
}

/// HMAC-SHA256 written out from its definition (RFC 2104) over SHA-256, independent of the
/// product's `hmac` crate use, so a test that signs with it checks the product's signing
/// against a second implementation.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(block.map(|b| b ^ 0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(block.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// `X-Switchboard-Signature` for `body` at `timestamp`, as a source computes it.
pub fn webhook_signature(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let message = [timestamp.as_bytes(), b".", body].concat();
    let hex: String = hmac_sha256(secret.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// One request a callback receiver got.
#[derive(Debug, Clone)]
pub struct CallbackRequest {
    pub body: serde_json::Value,
    /// `X-Switchboard-Delivery`.
    pub delivery: String,
    /// `X-Switchboard-Timestamp`, as unix seconds.
    pub timestamp: i64,
    /// Whether the signature was right for this secret, timestamp and body.
    pub signed: bool,
    /// What the receiver answered.
    pub status: u16,
}

/// A generic webhook source's callback receiver, as a source would write one: a real HTTP
/// server at `url` that checks each request's signature with its own HMAC code (401 when it is
/// wrong), answers failures on demand, and records every request it got.
#[derive(Clone)]
pub struct FakeCallbackReceiver {
    pub url: String,
    secret: String,
    requests: Arc<Mutex<Vec<CallbackRequest>>>,
    pub failures: Failures,
}

impl FakeCallbackReceiver {
    pub async fn start(secret: &str) -> Self {
        let mut this = Self {
            url: String::new(),
            secret: secret.into(),
            requests: Default::default(),
            failures: Default::default(),
        };
        let router = Router::new()
            .route("/callback", post(Self::receive))
            .with_state(this.clone());
        this.url = format!("{}/callback", serve(router).await);
        this
    }

    /// Every request, in the order they came.
    pub fn requests(&self) -> Vec<CallbackRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests it took (answered 2xx).
    pub fn accepted(&self) -> Vec<CallbackRequest> {
        self.requests()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect()
    }

    /// Wait until it has taken at least `n` callbacks.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<CallbackRequest> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let accepted = self.accepted();
            if accepted.len() >= n {
                return accepted;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "expected {n} callbacks within {timeout:?}, got {:?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn receive(
        State(s): State<FakeCallbackReceiver>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let timestamp = header("x-switchboard-timestamp");
        let signed = header("x-switchboard-signature")
            == webhook_signature(&s.secret, &timestamp, &body)
            && header("content-type") == "application/json";
        let status = if !signed {
            StatusCode::UNAUTHORIZED
        } else {
            s.failures.take().unwrap_or(StatusCode::OK)
        };
        s.requests.lock().unwrap().push(CallbackRequest {
            body: serde_json::from_slice(&body).unwrap_or_default(),
            delivery: header("x-switchboard-delivery"),
            timestamp: timestamp.parse().unwrap_or_default(),
            signed,
            status: status.as_u16(),
        });
        status
    }
}

/// The resolved person id in a prompt's header (`| id <person_id> |`).
pub fn person_of(prompt: &str) -> String {
    prompt
        .split("| id ")
        .nth(1)
        .and_then(|r| r.split(" |").next())
        .unwrap_or("")
        .to_string()
}

/// One call the fake runner received.
#[derive(Debug, Clone)]
pub struct RunnerCall {
    pub agent: String,
    pub prompt: String,
    pub session_id: Option<String>,
    pub idempotency_key: String,
    pub authorization: Option<String>,
    /// The session's folder, when workspaces are on.
    pub workspace: Option<String>,
    /// The turn's token for the API (`sbt_…`) and the API's URL, as the body carried them.
    pub turn_token: Option<String>,
    pub api_url: Option<String>,
}

#[derive(Deserialize)]
struct RunBody {
    agent: String,
    prompt: String,
    session_id: Option<String>,
    #[allow(dead_code)]
    correlation_id: String,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    turn_token: Option<String>,
    #[serde(default)]
    api_url: Option<String>,
}

/// An agent host's runner: `POST /run`, answers `{"text","session_id",...}`. Like a real runner
/// it answers a repeated `Idempotency-Key` from its cache.
#[derive(Clone)]
pub struct FakeRunner {
    pub url: String,
    calls: Arc<Mutex<Vec<RunnerCall>>>,
    cache: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    delay: Arc<Mutex<Duration>>,
    /// When set, each call waits for `release` (after announcing itself on `received`).
    hold: Arc<Mutex<bool>>,
    pub received: Arc<Notify>,
    pub release: Arc<Notify>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    /// A broken or overloaded agent host, on demand.
    failures: Failures,
    /// Highest number of calls for one person seen at the same time.
    pub max_overlap: Arc<AtomicUsize>,
    sessions: Arc<AtomicUsize>,
    /// The agent host is down: every call gets 503 (counted in `refused`, not in `calls`).
    down: Arc<std::sync::atomic::AtomicBool>,
    pub refused: Arc<AtomicUsize>,
    /// Calls in progress by Idempotency-Key, for `DELETE /run/<key>`.
    running: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// Keys whose call was cancelled (a later POST with one answers `cancelled`).
    pub cancelled: Arc<Mutex<Vec<String>>>,
    /// Fixed answers by what the prompt contains (the first that matches), instead of the echo.
    answers: Arc<Mutex<Vec<(String, String)>>>,
}

impl FakeRunner {
    pub async fn start() -> Self {
        let mut this = Self {
            url: String::new(),
            calls: Default::default(),
            cache: Default::default(),
            delay: Default::default(),
            hold: Default::default(),
            received: Default::default(),
            release: Default::default(),
            in_flight: Default::default(),
            failures: Default::default(),
            max_overlap: Default::default(),
            sessions: Default::default(),
            down: Default::default(),
            refused: Default::default(),
            running: Default::default(),
            cancelled: Default::default(),
            answers: Default::default(),
        };
        let router = Router::new()
            .route("/run", post(Self::run))
            .route("/run/{key}", axum::routing::delete(Self::cancel))
            .with_state(this.clone());
        this.url = serve(router).await;
        this
    }

    pub fn calls(&self) -> Vec<RunnerCall> {
        self.calls.lock().unwrap().clone()
    }

    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }

    /// Answer the next `n` calls with HTTP `status`.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.failures.fail_next(n, status);
    }

    /// Take the agent host down (every call 503) or bring it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Answer a call whose prompt contains `needle` with `text` (as an agent that decided
    /// what to say), not with the echo.
    pub fn answer_when(&self, needle: &str, text: &str) {
        self.answers
            .lock()
            .unwrap()
            .push((needle.to_string(), text.to_string()));
    }

    pub fn set_hold(&self, hold: bool) {
        *self.hold.lock().unwrap() = hold;
    }

    /// `DELETE /run/<key>`: cancel the call running under that key, as a runner kills the
    /// engine's process group.
    async fn cancel(State(s): State<FakeRunner>, Path(key): Path<String>) -> StatusCode {
        let running = s.running.lock().unwrap().get(&key).cloned();
        match running {
            Some(call) => {
                s.cancelled.lock().unwrap().push(key);
                call.notify_one();
                StatusCode::ACCEPTED
            }
            None => StatusCode::NOT_FOUND,
        }
    }

    /// The person's text inside a prompt's fence.
    pub fn said(prompt: &str) -> String {
        switchboard_dispatch::prompt::fenced_text(prompt)
            .unwrap_or("")
            .to_string()
    }

    async fn run(
        State(s): State<FakeRunner>,
        headers: HeaderMap,
        Json(body): Json<RunBody>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if s.down.load(Ordering::SeqCst) {
            s.refused.fetch_add(1, Ordering::SeqCst);
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": "agent host is down"})),
            );
        }
        s.calls.lock().unwrap().push(RunnerCall {
            agent: body.agent.clone(),
            prompt: body.prompt.clone(),
            session_id: body.session_id.clone(),
            idempotency_key: key.clone(),
            authorization: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            workspace: body.workspace.clone(),
            turn_token: body.turn_token.clone(),
            api_url: body.api_url.clone(),
        });
        if let Some(status) = s.failures.take() {
            return (
                status,
                Json(serde_json::json!({"error": "agent host says no"})),
            );
        }
        let person = person_of(&body.prompt);
        {
            let mut f = s.in_flight.lock().unwrap();
            let n = f.entry(person.clone()).or_insert(0);
            *n += 1;
            s.max_overlap.fetch_max(*n, Ordering::SeqCst);
        }
        let cancelled = || {
            (
                StatusCode::CONFLICT,
                Json(serde_json::json!({"error": {"code": "cancelled", "message": "cancelled"}})),
            )
        };
        if s.cancelled.lock().unwrap().contains(&key) {
            *s.in_flight.lock().unwrap().get_mut(&person).unwrap() -= 1;
            return cancelled();
        }
        let cancel = Arc::new(Notify::new());
        s.running
            .lock()
            .unwrap()
            .insert(key.clone(), cancel.clone());
        s.received.notify_one();
        let hold = *s.hold.lock().unwrap();
        if hold {
            tokio::select! {
                _ = s.release.notified() => {}
                _ = cancel.notified() => {
                    s.running.lock().unwrap().remove(&key);
                    *s.in_flight.lock().unwrap().get_mut(&person).unwrap() -= 1;
                    return cancelled();
                }
            }
        }
        s.running.lock().unwrap().remove(&key);
        let delay = *s.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        *s.in_flight.lock().unwrap().get_mut(&person).unwrap() -= 1;
        if let Some(cached) = s.cache.lock().unwrap().get(&key) {
            return (StatusCode::OK, Json(cached.clone()));
        }
        let session_id = body
            .session_id
            .clone()
            .unwrap_or_else(|| format!("eng-{}", s.sessions.fetch_add(1, Ordering::SeqCst) + 1));
        let text = s
            .answers
            .lock()
            .unwrap()
            .iter()
            .find(|(needle, _)| body.prompt.contains(needle.as_str()))
            .map(|(_, text)| text.clone())
            .unwrap_or_else(|| format!("echo: {}", Self::said(&body.prompt)));
        let answer = serde_json::json!({
            "text": text,
            "session_id": session_id,
            "processing_ms": 7,
            "tool_calls_count": 2,
        });
        s.cache.lock().unwrap().insert(key, answer.clone());
        (StatusCode::OK, Json(answer))
    }
}
