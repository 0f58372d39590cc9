//! Meta's WhatsApp Business Cloud API (<https://developers.facebook.com/docs/whatsapp/cloud-api>),
//! a Graph API: every call under a version segment (`/v21.0/…`, any `v<major>.<minor>`), the
//! system user's access token in `Authorization: Bearer …`. Messages are sent with
//! `POST /{version}/{phone_number_id}/messages` (JSON; a form whose values are JSON text is
//! taken too, as by Graph); every refusal is Graph's `{"error":{"message","type","code",
//! "error_data"?,"fbtrace_id"}}`, and throughput limits are told with HTTP 400 and code 130429,
//! not a 429. Outside the 24-hour customer service window a message other than a template is
//! still answered 200 with a wamid, and fails afterwards, in a `failed` status webhook
//! ([`FakeWhatsApp::status_webhooks`]). Media a person sent is fetched in two steps, as from
//! Meta: `GET /{version}/{media_id}` names a URL, which serves the bytes to the token alone.
//! The pure helpers at the end build what Meta POSTs to the app's webhook, sign it as Meta
//! does, and write the verification handshake's query.
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{OriginalUri, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header as names};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, body::Bytes};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64_URL};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value, json};

use crate::serve::{Failures, header, serve};
use crate::sms::{Platform, PostedObserver, SendObserver, SentMessage};
use crate::webhook::hmac_sha256;

/// The header Meta signs a webhook POST in (`sha256=<hex>`, see [`sign`]).
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// The WhatsApp Business Account every webhook envelope names (`entry[].id`).
pub const WABA_ID: &str = "102290129340398";
/// The business number's display form, as webhooks' `metadata` write it.
pub const DISPLAY_PHONE_NUMBER: &str = "15550001234";
/// The template every WhatsApp Business Account starts with.
pub const HELLO_WORLD: &str = "hello_world";

/// Graph's error code for the 24-hour customer service window, and its title.
pub const RE_ENGAGEMENT_CODE: u32 = 131_047;
/// Graph's error code for a throughput limit.
pub const RATE_LIMIT_CODE: u32 = 130_429;

/// Cloud API limits, in characters.
const MAX_TEXT: usize = 4096;
const MAX_CAPTION: usize = 1024;
/// How long a person's message keeps the customer service window open.
const SERVICE_WINDOW_HOURS: i64 = 24;
/// The profile name of a person whose webhook helper is not given one.
const DEFAULT_NAME: &str = "Ana";
/// The message types the fake sends (the Cloud API has more).
const TYPES: [&str; 4] = ["text", "template", "document", "image"];
const RE_ENGAGEMENT_TITLE: &str = "Re-engagement message";
const RE_ENGAGEMENT_DETAILS: &str = "Message failed to send because more than 24 hours have \
    passed since the customer last replied to this number.";
const ERROR_CODES_HREF: &str =
    "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/";

/// One message the business sent that the fake accepted (HTTP 200 with a wamid), delivered or
/// not.
#[derive(Debug, Clone)]
pub struct WhatsAppSent {
    /// `text`, `template`, `document` or `image`.
    pub kind: String,
    /// The message id the fake answered with (`wamid.…`).
    pub wamid: String,
    /// The `to` as the request named it (digits, maybe with a leading `+`).
    pub to: String,
    /// `to`'s digits: the person's WhatsApp id (`contacts[0].wa_id` of the answer).
    pub wa_id: String,
    /// The text's body, a document's or image's caption (`""` without one), or the template's
    /// name.
    pub text: String,
    /// A document's or image's `link`.
    pub link: Option<String>,
    /// A document's `filename`.
    pub filename: Option<String>,
    /// Whether it reached the person: false for a message other than a template outside the
    /// 24-hour customer service window (then [`Self::error_code`] is 131047 and
    /// [`FakeWhatsApp::status_webhooks`] lists its `failed` status).
    pub delivered: bool,
    /// Why it was not delivered.
    pub error_code: Option<u32>,
    /// When the fake took it.
    pub created: DateTime<Utc>,
    /// The sender's `User-Agent`.
    pub user_agent: Option<String>,
    /// The request's parameters as sent (`template.components`, `text.preview_url`,
    /// `context`, …).
    pub request: Value,
}

/// A business phone number's fake Cloud API: the Graph calls a gateway uses, with what they
/// accepted recorded, the 24-hour window of each person, and the media people sent.
#[derive(Clone)]
pub struct FakeWhatsApp {
    /// The Graph base to configure (Meta's is `https://graph.facebook.com`; the version comes
    /// after it); empty for a fake only mounted in another server's router
    /// ([`FakeWhatsApp::router`]), whose media URLs then name the address each request came to.
    pub url: String,
    /// The access token the fake answers to.
    pub access_token: String,
    /// The business phone number's id (the `/{phone_number_id}/messages` it answers).
    pub phone_number_id: String,
    /// The business number as webhooks' `metadata` write it ([`DISPLAY_PHONE_NUMBER`]). Set
    /// this and the fields above before [`Self::router`] to change them (the router keeps a
    /// copy).
    pub display_phone_number: String,
    /// Every Graph call (not media downloads) answers the next `n` requests with this status,
    /// in Graph's error body: code 131000 (`Something went wrong`), or for a 429 code 130429.
    pub failures: Failures,
    inner: Arc<Inner>,
}

struct Inner {
    /// The base [`FakeWhatsApp::start`] serves at (the router's copy of `url` is older).
    base: Mutex<String>,
    /// `POST …/messages` requests that reached the fake, whatever they were answered.
    requests: AtomicUsize,
    /// The next `n` sends answer Graph's throughput error.
    throttle: Mutex<usize>,
    sent: Mutex<Vec<WhatsAppSent>>,
    /// The `failed` status webhooks of messages not delivered, oldest first.
    statuses: Mutex<Vec<Value>>,
    /// The wamids marked read (`"status":"read"`).
    read: Mutex<Vec<String>>,
    templates: Mutex<BTreeSet<String>>,
    /// When each person (by wa_id) last wrote.
    last_wrote: Mutex<HashMap<String, DateTime<Utc>>>,
    /// Whether the 24-hour window is applied (the demo's number, which never sees people
    /// write, does not apply it).
    window: std::sync::atomic::AtomicBool,
    media: Mutex<HashMap<String, StoredMedia>>,
    /// Told of every message accepted (a load run's watch).
    observer: PostedObserver,
    next_media: AtomicU64,
}

struct StoredMedia {
    mime_type: String,
    sha256: String,
    bytes: Vec<u8>,
}

/// A Graph refusal not yet answered.
struct GraphError {
    status: StatusCode,
    code: u32,
    message: String,
    kind: &'static str,
    subcode: Option<u32>,
    /// `error_data.details`.
    details: Option<String>,
}

impl GraphError {
    /// An `OAuthException` with `(#code) title` and its details, as the Cloud API writes it.
    fn cloud(status: StatusCode, code: u32, title: &str, details: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: format!("(#{code}) {title}"),
            kind: "OAuthException",
            subcode: None,
            details: Some(details.into()),
        }
    }

    /// Code 100 `Invalid parameter`, what was wrong in the details.
    fn invalid(details: impl Into<String>) -> Self {
        Self::cloud(StatusCode::BAD_REQUEST, 100, "Invalid parameter", details)
    }

    /// Code 131009 `Parameter value is not valid`.
    fn not_valid(details: impl Into<String>) -> Self {
        Self::cloud(
            StatusCode::BAD_REQUEST,
            131_009,
            "Parameter value is not valid",
            details,
        )
    }

    /// Graph's 401 for a missing or wrong token.
    fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: 190,
            message: "Invalid OAuth access token - Cannot parse access token".into(),
            kind: "OAuthException",
            subcode: None,
            details: None,
        }
    }

    /// Graph's answer about an object it does not have (or this token cannot see).
    fn no_object(verb: &str, id: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 100,
            message: format!(
                "Unsupported {verb} request. Object with ID '{id}' does not exist, cannot be \
                 loaded due to missing permissions, or does not support this operation. Please \
                 read the Graph API documentation at https://developers.facebook.com/docs/graph-api"
            ),
            kind: "GraphMethodException",
            subcode: Some(33),
            details: None,
        }
    }

    /// Graph's answer to a path it does not know (a version segment that is not one).
    fn unknown_path(rest: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 2500,
            message: format!("Unknown path components: {rest}"),
            kind: "OAuthException",
            subcode: None,
            details: None,
        }
    }

    /// A throughput limit: HTTP 400 (or `status`) and code 130429.
    fn rate_limited(status: StatusCode) -> Self {
        Self::cloud(
            status,
            RATE_LIMIT_CODE,
            "Rate limit hit",
            "Cloud API message throughput has been reached.",
        )
    }

    /// A failure answered on demand.
    fn failure(status: StatusCode) -> Self {
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Self::rate_limited(status);
        }
        Self::cloud(
            status,
            131_000,
            "Something went wrong",
            "Something went wrong",
        )
    }
}

impl IntoResponse for GraphError {
    fn into_response(self) -> Response {
        let mut error = json!({"message": self.message, "type": self.kind, "code": self.code});
        if let Some(subcode) = self.subcode {
            error["error_subcode"] = json!(subcode);
        }
        if let Some(details) = self.details {
            error["error_data"] = json!({"messaging_product": "whatsapp", "details": details});
        }
        error["fbtrace_id"] = json!(fbtrace_id());
        let mut response = (self.status, Json(json!({"error": error}))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                names::WWW_AUTHENTICATE,
                HeaderValue::from_static(
                    "OAuth \"Facebook Platform\" \"invalid_token\" \"Invalid OAuth access token \
                     - Cannot parse access token\"",
                ),
            );
        }
        response
    }
}

/// A trace id as Graph writes one in every error (`A` and 22 URL-safe base64 characters).
fn fbtrace_id() -> String {
    format!("A{}", BASE64_URL.encode(uuid::Uuid::new_v4().as_bytes()))
        .chars()
        .take(23)
        .collect()
}

/// Whether a path's first segment is a Graph version (`v<digits>.<digits>`).
fn is_version(segment: &str) -> bool {
    let Some((major, minor)) = segment
        .strip_prefix('v')
        .and_then(|rest| rest.split_once('.'))
    else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(major) && digits(minor)
}

/// The bearer token of `Authorization` (`""` without one or with another scheme).
fn bearer(headers: &HeaderMap) -> &str {
    match header(headers, "authorization").trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => "",
    }
}

/// The WhatsApp id of a `to`: its digits (a leading `+` dropped), 1 to 15 of them.
fn wa_id_of(to: &str) -> Option<String> {
    let digits = to.strip_prefix('+').unwrap_or(to);
    (!digits.is_empty() && digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.to_string())
}

/// A new message id for a message to or from `wa_id`, in Meta's shape: `wamid.` and the
/// base64 of a small record holding the number and 18 random hex digits.
pub fn new_wamid(wa_id: &str) -> String {
    let number = wa_id.strip_prefix('+').unwrap_or(wa_id);
    let number = &number.as_bytes()[..number.len().min(32)];
    let hex = uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .to_ascii_uppercase();
    let mut raw = vec![0x1c, 0x18, u8::try_from(number.len()).unwrap_or(0)];
    raw.extend_from_slice(number);
    raw.extend_from_slice(&[0x15, 0x02, 0x00, 0x11, 0x18, 0x12]);
    raw.extend_from_slice(&hex.as_bytes()[..18]);
    raw.push(0);
    format!("wamid.{}", BASE64.encode(raw))
}

/// Lowercase hex of SHA-256.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A parameter's text, when it is a string.
fn text_of<'a>(object: &'a Value, name: &str) -> Option<&'a str> {
    object.get(name).and_then(Value::as_str)
}

/// A request's parameters: a JSON object, or a form whose values are taken as JSON when they
/// are a JSON object or array (Graph takes both); empty for anything else.
fn params_of(headers: &HeaderMap, body: &[u8]) -> Result<Value, GraphError> {
    let content_type = header(headers, "content-type").to_ascii_lowercase();
    if content_type.starts_with("application/json") {
        return match serde_json::from_slice::<Value>(body) {
            Ok(object @ Value::Object(_)) => Ok(object),
            _ => Err(GraphError::invalid(
                "The request body is not a JSON object.",
            )),
        };
    }
    let mut params = Map::new();
    if content_type.starts_with("application/x-www-form-urlencoded") {
        for (key, value) in form_urlencoded::parse(body) {
            let parsed = match serde_json::from_str::<Value>(&value) {
                Ok(structured @ (Value::Object(_) | Value::Array(_))) => structured,
                _ => Value::String(value.into_owned()),
            };
            params.insert(key.into_owned(), parsed);
        }
    }
    Ok(Value::Object(params))
}

/// What a send carries, once checked.
struct Message {
    kind: &'static str,
    text: String,
    link: Option<String>,
    filename: Option<String>,
}

impl FakeWhatsApp {
    /// The number's fake, not yet listening: mount [`Self::router`] where it should answer.
    pub fn new(access_token: &str, phone_number_id: &str) -> Self {
        Self {
            url: String::new(),
            access_token: access_token.into(),
            phone_number_id: phone_number_id.into(),
            display_phone_number: DISPLAY_PHONE_NUMBER.into(),
            failures: Failures::default(),
            inner: Arc::new(Inner {
                base: Mutex::default(),
                requests: AtomicUsize::new(0),
                throttle: Mutex::new(0),
                sent: Mutex::default(),
                statuses: Mutex::default(),
                read: Mutex::default(),
                templates: Mutex::new(BTreeSet::from([HELLO_WORLD.to_string()])),
                last_wrote: Mutex::default(),
                window: std::sync::atomic::AtomicBool::new(true),
                media: Mutex::default(),
                next_media: AtomicU64::new(1_180_000_000_000_001),
                observer: PostedObserver::default(),
            }),
        }
    }

    /// The number's fake on a port of its own.
    pub async fn start(access_token: &str, phone_number_id: &str) -> Self {
        let mut this = Self::new(access_token, phone_number_id);
        this.url = serve(this.router()).await;
        *this.inner.base.lock().unwrap() = this.url.clone();
        this
    }

    /// The Cloud API's routes: `POST /{version}/{phone_number_id}/messages`,
    /// `GET /{version}/{media_id}` (and the phone number's own id) and the media download
    /// `GET /whatsapp_business/attachments/?mid=…`.
    pub fn router(&self) -> Router {
        Router::new()
            .route(
                "/{version}/{phone_number_id}/messages",
                post(Self::messages),
            )
            .route("/{version}/{id}", get(Self::object))
            .route("/whatsapp_business/attachments/", get(Self::attachment))
            .route("/whatsapp_business/attachments", get(Self::attachment))
            .with_state(self.clone())
    }

    /// Every message the fake accepted (answered 200 with a wamid), delivered or not, oldest
    /// first.
    pub fn sent(&self) -> Vec<WhatsAppSent> {
        self.inner.sent.lock().unwrap().clone()
    }

    /// Tell `observer` of every message accepted from now on (delivered or not), as it is
    /// recorded (one observer per fake).
    pub fn observe(&self, observer: Arc<dyn SendObserver>) {
        self.inner.observer.set(observer);
    }

    /// How many `POST …/messages` requests reached the fake, refused ones included (a
    /// throttled or failed one counts; [`Self::sent`] lists only the accepted).
    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// The `failed` status webhook Meta would POST for each message not delivered (outside
    /// the 24-hour window: code 131047), oldest first; see [`status_update`].
    pub fn status_webhooks(&self) -> Vec<Value> {
        self.inner.statuses.lock().unwrap().clone()
    }

    /// The wamids the business marked read (`{"status":"read","message_id":…}`), in order.
    pub fn marked_read(&self) -> Vec<String> {
        self.inner.read.lock().unwrap().clone()
    }

    /// Answer the next `n` sends with Graph's throughput error: HTTP 400, code 130429.
    pub fn throttle_next(&self, n: usize) {
        *self.inner.throttle.lock().unwrap() = n;
    }

    /// A template the business has (approved, in every language); `hello_world` is there from
    /// the start.
    pub fn add_template(&self, name: &str) {
        self.inner.templates.lock().unwrap().insert(name.into());
    }

    /// The person `wa_id` wrote just now: the 24-hour customer service window is open.
    pub fn person_wrote(&self, wa_id: &str) {
        self.person_wrote_at(wa_id, Utc::now());
    }

    /// The person `wa_id` last wrote at `at` (the window is open until 24 hours later).
    pub fn person_wrote_at(&self, wa_id: &str, at: DateTime<Utc>) {
        let wa_id = wa_id.strip_prefix('+').unwrap_or(wa_id);
        self.inner
            .last_wrote
            .lock()
            .unwrap()
            .insert(wa_id.into(), at);
    }

    /// Media a person sent: its media id, for a webhook ([`image_message`]) and for
    /// `GET /{version}/{media_id}`.
    pub fn add_media(&self, bytes: Vec<u8>, mime_type: &str) -> String {
        let id = self
            .inner
            .next_media
            .fetch_add(1, Ordering::SeqCst)
            .to_string();
        self.inner.media.lock().unwrap().insert(
            id.clone(),
            StoredMedia {
                mime_type: mime_type.into(),
                sha256: sha256_hex(&bytes),
                bytes,
            },
        );
        id
    }

    /// Graph's 401 unless the request carries this token.
    fn authenticate(&self, headers: &HeaderMap) -> Result<(), GraphError> {
        if bearer(headers) != self.access_token {
            return Err(GraphError::unauthorized());
        }
        Ok(())
    }

    /// Deliver free-form messages whenever the person last wrote: for the demo's number, whose
    /// people write to the gateway, never to this fake (Switchboard's own window still applies).
    pub fn without_window(&self) {
        self.inner.window.store(false, Ordering::SeqCst);
    }

    /// Whether the person last wrote within 24 hours.
    fn window_open(&self, wa_id: &str, now: DateTime<Utc>) -> bool {
        if !self.inner.window.load(Ordering::SeqCst) {
            return true;
        }
        self.inner
            .last_wrote
            .lock()
            .unwrap()
            .get(wa_id)
            .is_some_and(|at| now - *at <= Duration::hours(SERVICE_WINDOW_HOURS))
    }

    async fn messages(
        State(s): State<FakeWhatsApp>,
        Path((version, phone_number_id)): Path<(String, String)>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        s.inner.requests.fetch_add(1, Ordering::SeqCst);
        match s.send(&version, &phone_number_id, &headers, &body) {
            Ok(answer) => Json(answer).into_response(),
            Err(refused) => refused.into_response(),
        }
    }

    /// `POST /{version}/{phone_number_id}/messages`: checked as the Cloud API checks it,
    /// recorded, and answered with the wamid.
    fn send(
        &self,
        version: &str,
        phone_number_id: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Value, GraphError> {
        self.authenticate(headers)?;
        if !is_version(version) {
            return Err(GraphError::unknown_path(&format!(
                "/{phone_number_id}/messages"
            )));
        }
        if phone_number_id != self.phone_number_id {
            return Err(GraphError::no_object("post", phone_number_id));
        }
        if let Some(status) = self.failures.take() {
            return Err(GraphError::failure(status));
        }
        {
            let mut throttle = self.inner.throttle.lock().unwrap();
            if *throttle > 0 {
                *throttle -= 1;
                return Err(GraphError::rate_limited(StatusCode::BAD_REQUEST));
            }
        }
        let params = params_of(headers, body)?;
        match params.get("messaging_product") {
            Some(Value::String(product)) if product == "whatsapp" => {}
            None | Some(Value::Null) => {
                return Err(GraphError::invalid(
                    "The parameter messaging_product is required.",
                ));
            }
            Some(other) => {
                return Err(GraphError::invalid(format!(
                    "Param messaging_product must be one of {{WHATSAPP}} - got {other}."
                )));
            }
        }
        if text_of(&params, "status") == Some("read") {
            let Some(wamid) = text_of(&params, "message_id").filter(|id| !id.is_empty()) else {
                return Err(GraphError::invalid("The parameter message_id is required."));
            };
            self.inner.read.lock().unwrap().push(wamid.into());
            return Ok(json!({"success": true}));
        }
        let to = match params.get("to") {
            Some(Value::String(to)) => to.clone(),
            Some(Value::Number(to)) => to.to_string(),
            _ => return Err(GraphError::not_valid("The parameter to is required.")),
        };
        let Some(wa_id) = wa_id_of(&to) else {
            return Err(GraphError::not_valid(format!(
                "Recipient phone number not valid: {to}"
            )));
        };
        let kind = match params.get("type") {
            // The Cloud API's `type` is optional: a text by default.
            None | Some(Value::Null) => "text",
            Some(Value::String(kind)) => match TYPES.iter().find(|t| **t == kind) {
                Some(known) => *known,
                None => {
                    return Err(GraphError::invalid(format!(
                        "Param type must be one of {{{}}} in this fake - got \"{kind}\".",
                        TYPES.join(", ")
                    )));
                }
            },
            Some(other) => {
                return Err(GraphError::invalid(format!(
                    "Param type must be a string - got {other}."
                )));
            }
        };
        let message = match kind {
            "text" => Self::text(&params)?,
            "template" => self.template(&params)?,
            media => Self::media(&params, media)?,
        };
        let created = Utc::now();
        let wamid = new_wamid(&wa_id);
        // Templates open a conversation; anything else needs the person's last 24 hours.
        let delivered = kind == "template" || self.window_open(&wa_id, created);
        if !delivered {
            self.inner.statuses.lock().unwrap().push(status_update(
                &self.phone_number_id,
                &self.display_phone_number,
                &wamid,
                &wa_id,
                "failed",
            ));
        }
        let user_agent = Some(header(headers, "user-agent").to_string()).filter(|u| !u.is_empty());
        let posted = SentMessage {
            platform: Platform::WhatsApp,
            sid: wamid.clone(),
            to: wa_id.clone(),
            body: message.text.clone(),
            created,
            user_agent: user_agent.clone(),
        };
        self.inner.sent.lock().unwrap().push(WhatsAppSent {
            kind: kind.into(),
            wamid: wamid.clone(),
            to: to.clone(),
            wa_id: wa_id.clone(),
            text: message.text,
            link: message.link,
            filename: message.filename,
            delivered,
            error_code: (!delivered).then_some(RE_ENGAGEMENT_CODE),
            created,
            user_agent,
            request: params,
        });
        self.inner.observer.tell(posted);
        let mut sent = json!({"id": wamid});
        if message.kind == "template" {
            sent["message_status"] = json!("accepted");
        }
        Ok(json!({
            "messaging_product": "whatsapp",
            "contacts": [{"input": to, "wa_id": wa_id}],
            "messages": [sent],
        }))
    }

    /// A `text` message: `text.body`, 1 to 4096 characters, and `text.preview_url`, a boolean.
    fn text(params: &Value) -> Result<Message, GraphError> {
        let text = params.get("text").unwrap_or(&Value::Null);
        let body = match text.get("body") {
            Some(Value::String(body)) if !body.is_empty() => body.clone(),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                return Err(GraphError::invalid(
                    "The parameter text['body'] is required.",
                ));
            }
            Some(_) => {
                return Err(GraphError::invalid("Param text['body'] must be a string."));
            }
        };
        if body.chars().count() > MAX_TEXT {
            return Err(GraphError::cloud(
                StatusCode::BAD_REQUEST,
                100,
                &format!("Param text['body'] must be at most {MAX_TEXT} characters long"),
                format!("Param text['body'] must be at most {MAX_TEXT} characters long."),
            ));
        }
        match text.get("preview_url") {
            None | Some(Value::Null | Value::Bool(_)) => {}
            Some(Value::String(flag)) if flag == "true" || flag == "false" => {}
            Some(_) => {
                return Err(GraphError::invalid(
                    "Param text['preview_url'] must be a boolean.",
                ));
            }
        }
        Ok(Message {
            kind: "text",
            text: body,
            link: None,
            filename: None,
        })
    }

    /// A `template` message: a template the business has, a language, components if any.
    fn template(&self, params: &Value) -> Result<Message, GraphError> {
        let template = params.get("template").unwrap_or(&Value::Null);
        let Some(name) = text_of(template, "name").filter(|n| !n.is_empty()) else {
            return Err(GraphError::invalid(
                "The parameter template['name'] is required.",
            ));
        };
        let Some(code) = template
            .get("language")
            .and_then(|language| text_of(language, "code"))
            .filter(|c| !c.is_empty())
        else {
            return Err(GraphError::invalid(
                "The parameter template['language']['code'] is required.",
            ));
        };
        if !matches!(
            template.get("components"),
            None | Some(Value::Null | Value::Array(_))
        ) {
            return Err(GraphError::invalid(
                "Param template['components'] must be an array.",
            ));
        }
        if !self.inner.templates.lock().unwrap().contains(name) {
            return Err(GraphError::cloud(
                StatusCode::BAD_REQUEST,
                132_001,
                "Template name does not exist in the translation",
                format!("template name ({name}) does not exist in {code}"),
            ));
        }
        Ok(Message {
            kind: "template",
            text: name.into(),
            link: None,
            filename: None,
        })
    }

    /// A `document` or `image` message: by an `http(s)` link (a media id is not taken by the
    /// fake), a caption of at most 1024 characters, a document's filename.
    fn media(params: &Value, kind: &'static str) -> Result<Message, GraphError> {
        let Some(media) = params.get(kind).filter(|m| m.is_object()) else {
            return Err(GraphError::invalid(format!(
                "The parameter {kind} is required."
            )));
        };
        if media.get("id").is_some_and(|id| !id.is_null()) {
            return Err(GraphError::invalid(format!(
                "Param {kind}['id']: media ids are not supported by this fake, send a link."
            )));
        }
        let Some(link) = text_of(media, "link").filter(|l| !l.is_empty()) else {
            return Err(GraphError::invalid(format!(
                "Param {kind} must have either link or id."
            )));
        };
        let lower = link.to_ascii_lowercase();
        let host = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"));
        if host.is_none_or(|rest| rest.is_empty() || rest.starts_with('/')) {
            return Err(GraphError::invalid(format!(
                "Param {kind}['link'] is not a valid URI."
            )));
        }
        let caption = match media.get("caption") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(caption)) => caption.clone(),
            Some(_) => {
                return Err(GraphError::invalid(format!(
                    "Param {kind}['caption'] must be a string."
                )));
            }
        };
        if caption.chars().count() > MAX_CAPTION {
            return Err(GraphError::cloud(
                StatusCode::BAD_REQUEST,
                100,
                &format!("Param {kind}['caption'] must be at most {MAX_CAPTION} characters long"),
                format!("Param {kind}['caption'] must be at most {MAX_CAPTION} characters long."),
            ));
        }
        let filename = if kind == "document" {
            text_of(media, "filename")
                .filter(|f| !f.is_empty())
                .map(str::to_string)
        } else {
            None
        };
        Ok(Message {
            kind,
            text: caption,
            link: Some(link.into()),
            filename,
        })
    }

    /// `GET /{version}/{id}`: a media id's URL and facts, or the phone number itself.
    async fn object(
        State(s): State<FakeWhatsApp>,
        Path((version, id)): Path<(String, String)>,
        OriginalUri(original): OriginalUri,
        uri: Uri,
        headers: HeaderMap,
    ) -> Response {
        if let Err(refused) = s.authenticate(&headers) {
            return refused.into_response();
        }
        if !is_version(&version) {
            return GraphError::unknown_path(&format!("/{id}")).into_response();
        }
        if let Some(status) = s.failures.take() {
            return GraphError::failure(status).into_response();
        }
        if id == s.phone_number_id {
            return Json(json!({
                "verified_name": "Switchboard", "code_verification_status": "NOT_VERIFIED",
                "display_phone_number": s.display_phone_number, "quality_rating": "GREEN",
                "platform_type": "CLOUD_API", "throughput": {"level": "STANDARD"}, "id": id,
            }))
            .into_response();
        }
        let media = s.inner.media.lock().unwrap();
        let Some(file) = media.get(&id) else {
            return GraphError::no_object("get", &id).into_response();
        };
        let base = s.base(&original, &uri, &headers);
        let expires = Utc::now().timestamp() + 300;
        let hash = &sha256_hex(format!("{id}:{}", file.sha256).as_bytes())[..24];
        Json(json!({
            "messaging_product": "whatsapp",
            "url": format!(
                "{base}/whatsapp_business/attachments/?mid={id}&ext={expires}&hash=AT{hash}"
            ),
            "mime_type": file.mime_type, "sha256": file.sha256, "file_size": file.bytes.len(),
            "id": id,
        }))
        .into_response()
    }

    /// Where the fake answers: its own port, else the `url` set before [`Self::router`], else
    /// the address and mount point of this request.
    fn base(&self, original: &Uri, uri: &Uri, headers: &HeaderMap) -> String {
        let started = self.inner.base.lock().unwrap().clone();
        if !started.is_empty() {
            return started;
        }
        if !self.url.is_empty() {
            return self.url.clone();
        }
        let prefix = original
            .path()
            .strip_suffix(uri.path())
            .unwrap_or("")
            .trim_end_matches('/');
        format!("http://{}{prefix}", header(headers, "host"))
    }

    /// `GET /whatsapp_business/attachments/?mid=…`: a media's bytes with its type, to the
    /// token alone.
    async fn attachment(
        State(s): State<FakeWhatsApp>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
    ) -> Response {
        let page = |status: StatusCode, what: &str| {
            (
                status,
                [(names::CONTENT_TYPE, "text/html; charset=utf-8")],
                format!(
                    "<!DOCTYPE html><html><head><title>{what}</title></head>\
                     <body>{what}</body></html>"
                ),
            )
                .into_response()
        };
        if bearer(&headers) != s.access_token {
            return page(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        let mid = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .find(|(key, _)| key == "mid")
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        let media = s.inner.media.lock().unwrap();
        let Some(file) = media.get(&mid) else {
            return page(StatusCode::NOT_FOUND, "Not Found");
        };
        let content_type = HeaderValue::from_str(&file.mime_type)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
        ([(names::CONTENT_TYPE, content_type)], file.bytes.clone()).into_response()
    }
}

/// `X-Hub-Signature-256` for a webhook `body` with the app's secret: `sha256=` and the
/// lowercase hex HMAC-SHA256 of the body.
pub fn sign(app_secret: &str, body: &[u8]) -> String {
    let hex: String = hmac_sha256(app_secret.as_bytes(), body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// The query of Meta's verification GET to the webhook URL (the app answers the challenge when
/// the verify token is its own).
pub fn verification_query(verify_token: &str, challenge: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("hub.mode", "subscribe")
        .append_pair("hub.challenge", challenge)
        .append_pair("hub.verify_token", verify_token)
        .finish()
}

/// Unix seconds now, as webhooks write them (text).
fn now_seconds() -> String {
    Utc::now().timestamp().to_string()
}

/// The envelope of one `messages` change of the business number, `value` beside its
/// `messaging_product` and `metadata`.
fn envelope(phone_number_id: &str, display_phone: &str, value: Value) -> Value {
    let mut full = json!({
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": display_phone, "phone_number_id": phone_number_id},
    });
    if let (Some(full), Value::Object(value)) = (full.as_object_mut(), value) {
        full.extend(value);
    }
    json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": WABA_ID, "changes": [{"value": full, "field": "messages"}]}],
    })
}

fn contact(wa_id: &str, name: &str) -> Value {
    json!({"profile": {"name": name}, "wa_id": wa_id})
}

/// The webhook Meta POSTs when `from_wa_id` (named `name`) writes `text` to the business.
pub fn text_message(
    phone_number_id: &str,
    display_phone: &str,
    from_wa_id: &str,
    name: &str,
    wamid: &str,
    text: &str,
) -> Value {
    envelope(
        phone_number_id,
        display_phone,
        json!({
            "contacts": [contact(from_wa_id, name)],
            "messages": [{"from": from_wa_id, "id": wamid, "timestamp": now_seconds(),
                "text": {"body": text}, "type": "text"}],
        }),
    )
}

/// One webhook carrying several people's texts, as Meta batches them: `(wa_id, wamid, text)`
/// each, every sender once in `contacts` (named `Ana`).
pub fn text_messages(
    phone_number_id: &str,
    display_phone: &str,
    items: &[(&str, &str, &str)],
) -> Value {
    batch(
        items
            .iter()
            .map(|(wa_id, wamid, text)| {
                text_message(
                    phone_number_id,
                    display_phone,
                    wa_id,
                    DEFAULT_NAME,
                    wamid,
                    text,
                )
            })
            .collect(),
    )
}

/// Several webhooks ([`text_message`], [`image_message`], [`status_update`]) as the one Meta
/// would POST: the first's envelope, its change carrying every `contacts` (each wa_id once),
/// `messages` and `statuses` of all of them in order.
pub fn batch(payloads: Vec<Value>) -> Value {
    let mut payloads = payloads.into_iter();
    let Some(mut first) = payloads.next() else {
        return json!({"object": "whatsapp_business_account", "entry": []});
    };
    let Some(Value::Object(value)) = first.pointer_mut("/entry/0/changes/0/value") else {
        return first;
    };
    for payload in payloads {
        let Some(Value::Object(more)) = payload.pointer("/entry/0/changes/0/value") else {
            continue;
        };
        for key in ["contacts", "messages", "statuses"] {
            let Some(Value::Array(items)) = more.get(key) else {
                continue;
            };
            let list = value.entry(key).or_insert_with(|| json!([]));
            let Value::Array(list) = list else {
                continue;
            };
            for item in items {
                if key == "contacts" && list.iter().any(|c| c["wa_id"] == item["wa_id"]) {
                    continue;
                }
                list.push(item.clone());
            }
        }
    }
    first
}

/// The webhook Meta POSTs when `from_wa_id` sends an image (`media_id` from
/// [`FakeWhatsApp::add_media`]), with its caption when not empty. Its `sha256` stands in for
/// the file's (base64, as webhooks write it, of the id's SHA-256: the helper does not see the
/// bytes; `GET /{version}/{media_id}` answers the file's own, in hex).
pub fn image_message(
    phone_number_id: &str,
    display_phone: &str,
    from_wa_id: &str,
    wamid: &str,
    media_id: &str,
    caption: &str,
) -> Value {
    use sha2::{Digest, Sha256};
    let stand_in = BASE64.encode(Sha256::digest(media_id.as_bytes()));
    let mut image = json!({"mime_type": "image/jpeg", "sha256": stand_in, "id": media_id});
    if !caption.is_empty() {
        image["caption"] = json!(caption);
    }
    envelope(
        phone_number_id,
        display_phone,
        json!({
            "contacts": [contact(from_wa_id, DEFAULT_NAME)],
            "messages": [{"from": from_wa_id, "id": wamid, "timestamp": now_seconds(),
                "type": "image", "image": image}],
        }),
    )
}

/// The status webhook Meta POSTs about a message the business sent: `sent` and `delivered`
/// with the service conversation and its pricing, `read` without, `failed` with the 24-hour
/// window's error (131047).
pub fn status_update(
    phone_number_id: &str,
    display_phone: &str,
    wamid: &str,
    recipient_wa_id: &str,
    status: &str,
) -> Value {
    let now = Utc::now().timestamp();
    let mut update = json!({"id": wamid, "status": status, "timestamp": now.to_string(),
        "recipient_id": recipient_wa_id});
    let conversation_id = sha256_hex(format!("conversation:{recipient_wa_id}").as_bytes());
    let pricing = json!({"billable": true, "pricing_model": "CBP", "category": "service"});
    match status {
        "sent" => {
            update["conversation"] = json!({"id": conversation_id[..32],
                "expiration_timestamp": (now + SERVICE_WINDOW_HOURS * 3600).to_string(),
                "origin": {"type": "service"}});
            update["pricing"] = pricing;
        }
        "delivered" => {
            update["conversation"] =
                json!({"id": conversation_id[..32], "origin": {"type": "service"}});
            update["pricing"] = pricing;
        }
        "failed" => {
            update["errors"] = json!([{
                "code": RE_ENGAGEMENT_CODE, "title": RE_ENGAGEMENT_TITLE,
                "message": RE_ENGAGEMENT_TITLE,
                "error_data": {"details": RE_ENGAGEMENT_DETAILS}, "href": ERROR_CODES_HREF,
            }]);
        }
        _ => {}
    }
    envelope(
        phone_number_id,
        display_phone,
        json!({"statuses": [update]}),
    )
}

#[cfg(test)]
mod tests {
    //! Driven over real HTTP with the crate's test client ([`crate::test_client`]).
    use super::*;
    use crate::test_client::{Answer, http};

    const TOKEN: &str = "EAAGfakeAccessTokenForTests0123456789";
    const PHONE_ID: &str = "106540352242922";
    const PERSON: &str = "16315551181";

    /// A `POST …/messages` with `token`, by JSON.
    async fn send_with(base: &str, token: &str, body: Value) -> Answer {
        let auth = format!("Bearer {token}");
        http(
            base,
            "POST",
            &format!("/v21.0/{PHONE_ID}/messages"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body.to_string().as_bytes(),
        )
        .await
    }

    async fn send(base: &str, body: Value) -> Answer {
        send_with(base, TOKEN, body).await
    }

    fn text(to: &str, body: &str) -> Value {
        json!({"messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
            "type": "text", "text": {"preview_url": false, "body": body}})
    }

    /// `GET path` with the token (or none).
    async fn get_with(base: &str, path: &str, token: Option<&str>) -> Answer {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        http(base, "GET", path, &headers, b"").await
    }

    #[tokio::test]
    async fn whatsapp_send_text_is_answered_with_a_wamid_and_recorded() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        wa.person_wrote(PERSON);
        let a = send(&wa.url, text(&format!("+{PERSON}"), "hello")).await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["messaging_product"], "whatsapp");
        assert_eq!(
            v["contacts"],
            json!([{"input": format!("+{PERSON}"), "wa_id": PERSON}])
        );
        let wamid = v["messages"][0]["id"].as_str().expect("a wamid");
        assert!(wamid.starts_with("wamid.HBg"), "{wamid}");
        assert!(v["messages"][0].get("message_status").is_none());
        let raw = BASE64
            .decode(&wamid["wamid.".len()..])
            .expect("base64 after wamid.");
        assert!(raw.windows(PERSON.len()).any(|w| w == PERSON.as_bytes()));

        let a = send(&wa.url, text(PERSON, "again")).await;
        let second = a.json()["messages"][0]["id"].as_str().map(str::to_string);
        assert_ne!(second.as_deref(), Some(wamid));

        let sent = wa.sent();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].kind, "text");
        assert_eq!(sent[0].wamid, wamid);
        assert_eq!(sent[0].to, format!("+{PERSON}"));
        assert_eq!(sent[0].wa_id, PERSON);
        assert_eq!(sent[0].text, "hello");
        assert!(sent[0].delivered);
        assert_eq!(sent[0].error_code, None);
        assert_eq!(sent[0].link, None);
        assert_eq!(sent[0].user_agent.as_deref(), Some("switchboard-test/1"));
        assert_eq!(sent[0].request["text"]["preview_url"], false);
        assert_eq!(sent[1].to, PERSON);
        assert_eq!(wa.requests(), 2);
        assert!(wa.status_webhooks().is_empty());
    }

    #[tokio::test]
    async fn whatsapp_refuses_a_missing_or_wrong_token_with_401_code_190() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        wa.person_wrote(PERSON);
        for token in ["wrong", ""] {
            let a = send_with(&wa.url, token, text(PERSON, "hi")).await;
            assert_eq!(a.status, 401);
            let mut v = a.json();
            assert!(
                v["error"]["fbtrace_id"]
                    .as_str()
                    .is_some_and(|t| t.len() == 23)
            );
            v["error"]["fbtrace_id"] = json!("A1b2C3");
            assert_eq!(
                v,
                json!({"error": {"message": "Invalid OAuth access token - Cannot parse access token",
                    "type": "OAuthException", "code": 190, "fbtrace_id": "A1b2C3"}})
            );
            assert!(a.header("www-authenticate").is_some());
        }
        let a = get_with(&wa.url, &format!("/v21.0/{PHONE_ID}"), None).await;
        assert_eq!(a.status, 401);
        assert_eq!(a.json()["error"]["code"], 190);
        assert!(wa.sent().is_empty());
        assert_eq!(wa.requests(), 2);

        let a = get_with(&wa.url, &format!("/v21.0/{PHONE_ID}"), Some(TOKEN)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["display_phone_number"], "15550001234");
        let a = get_with(&wa.url, &format!("/latest/{PHONE_ID}"), Some(TOKEN)).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 2500);
    }

    #[tokio::test]
    async fn whatsapp_checks_product_recipient_type_and_text_length() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        wa.person_wrote(PERSON);
        let mut no_product = text(PERSON, "hi");
        no_product
            .as_object_mut()
            .map(|o| o.remove("messaging_product"));
        let a = send(&wa.url, no_product).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        assert_eq!(a.json()["error"]["message"], "(#100) Invalid parameter");
        assert_eq!(a.json()["error"]["type"], "OAuthException");

        for to in ["ana", "+", "", "1555-123", "1234567890123456"] {
            let a = send(&wa.url, text(to, "hi")).await;
            assert_eq!(a.status, 400, "{to}");
            assert_eq!(a.json()["error"]["code"], 131_009, "{to}");
            assert_eq!(
                a.json()["error"]["message"],
                "(#131009) Parameter value is not valid"
            );
        }

        let too_long = "é".repeat(4097);
        let a = send(&wa.url, text(PERSON, &too_long)).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        let message = a.json()["error"]["message"].as_str().map(str::to_string);
        assert!(
            message.as_deref().is_some_and(
                |m| m.contains("Param text['body'] must be at most 4096 characters long")
            ),
            "{message:?}"
        );
        let a = send(&wa.url, text(PERSON, "")).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        let fits = "é".repeat(4096);
        let a = send(&wa.url, text(PERSON, &fits)).await;
        assert_eq!(a.status, 200);

        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "sticker",
                "sticker": {"link": "https://example.com/s.webp"}}),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        // No `type`: a text, as on the Cloud API.
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "text": {"body": "untyped"}}),
        )
        .await;
        assert_eq!(a.status, 200);
        let a = http(
            &wa.url,
            "POST",
            &format!("/v21.0/{PHONE_ID}/messages"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &format!("Bearer {TOKEN}")),
            ],
            b"{",
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        let a = http(
            &wa.url,
            "POST",
            "/v21.0/999/messages",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &format!("Bearer {TOKEN}")),
            ],
            text(PERSON, "hi").to_string().as_bytes(),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["type"], "GraphMethodException");

        let sent = wa.sent();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].text, fits);
        assert_eq!(sent[1].text, "untyped");
        assert_eq!(wa.requests(), 13);
    }

    #[tokio::test]
    async fn whatsapp_refuses_an_unknown_template_and_takes_hello_world() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        let template = |name: &str| {
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "template",
                "template": {"name": name, "language": {"code": "en_US"},
                    "components": [{"type": "body",
                        "parameters": [{"type": "text", "text": "Ana"}]}]}})
        };
        let a = send(&wa.url, template("order_update")).await;
        assert_eq!(a.status, 400);
        let v = a.json();
        assert_eq!(v["error"]["code"], 132_001);
        assert_eq!(
            v["error"]["message"],
            "(#132001) Template name does not exist in the translation"
        );
        assert_eq!(
            v["error"]["error_data"]["details"],
            "template name (order_update) does not exist in en_US"
        );

        // Never wrote: a template is delivered all the same.
        let a = send(&wa.url, template("hello_world")).await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["messages"][0]["message_status"], "accepted");
        assert_eq!(v["contacts"][0]["wa_id"], PERSON);

        wa.add_template("order_update");
        let a = send(&wa.url, template("order_update")).await;
        assert_eq!(a.status, 200);
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "template",
                "template": {"name": "hello_world"}}),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);

        let sent = wa.sent();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].kind, "template");
        assert_eq!(sent[0].text, "hello_world");
        assert!(sent[0].delivered);
        assert_eq!(
            sent[1].request["template"]["components"][0]["parameters"][0]["text"],
            "Ana"
        );
        assert!(wa.status_webhooks().is_empty());
    }

    #[tokio::test]
    async fn whatsapp_outside_the_24_hour_window_answers_200_but_fails_in_a_status_webhook() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        let a = send(&wa.url, text(PERSON, "are you there?")).await;
        assert_eq!(a.status, 200);
        let wamid = a.json()["messages"][0]["id"]
            .as_str()
            .expect("a wamid")
            .to_string();
        let sent = wa.sent();
        assert_eq!(sent.len(), 1);
        assert!(!sent[0].delivered);
        assert_eq!(sent[0].error_code, Some(131_047));
        let statuses = wa.status_webhooks();
        assert_eq!(statuses.len(), 1);
        let v = &statuses[0];
        assert_eq!(v["object"], "whatsapp_business_account");
        assert_eq!(v["entry"][0]["id"], WABA_ID);
        let value = &v["entry"][0]["changes"][0]["value"];
        assert_eq!(v["entry"][0]["changes"][0]["field"], "messages");
        assert_eq!(
            value["metadata"],
            json!({"display_phone_number": "15550001234", "phone_number_id": PHONE_ID})
        );
        let status = &value["statuses"][0];
        assert_eq!(status["id"], wamid.as_str());
        assert_eq!(status["status"], "failed");
        assert_eq!(status["recipient_id"], PERSON);
        assert_eq!(status["errors"][0]["code"], 131_047);
        assert_eq!(status["errors"][0]["title"], "Re-engagement message");
        assert_eq!(
            status["errors"][0]["error_data"]["details"],
            "Message failed to send because more than 24 hours have passed since the customer \
             last replied to this number."
        );

        wa.person_wrote_at(PERSON, Utc::now() - Duration::hours(25));
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "image",
                "image": {"link": "https://example.com/a.jpg"}}),
        )
        .await;
        assert_eq!(a.status, 200);
        assert!(!wa.sent()[1].delivered);
        assert_eq!(wa.status_webhooks().len(), 2);

        wa.person_wrote(&format!("+{PERSON}"));
        let a = send(&wa.url, text(PERSON, "now you are")).await;
        assert_eq!(a.status, 200);
        let sent = wa.sent();
        assert!(sent[2].delivered);
        assert_eq!(sent[2].error_code, None);
        assert_eq!(wa.status_webhooks().len(), 2);
        wa.person_wrote_at(PERSON, Utc::now() - Duration::hours(23));
        send(&wa.url, text(PERSON, "still")).await;
        assert!(wa.sent()[3].delivered);
    }

    #[tokio::test]
    async fn whatsapp_sends_documents_and_images_by_link_only() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        wa.person_wrote(PERSON);
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "document",
                "document": {"link": "https://example.com/r.pdf", "filename": "report.pdf",
                    "caption": "your report"}}),
        )
        .await;
        assert_eq!(a.status, 200);
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "image",
                "image": {"id": "1180000000000001"}}),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["code"], 100);
        for link in ["ftp://example.com/a.jpg", "https://", "example.com/a.jpg"] {
            let a = send(
                &wa.url,
                json!({"messaging_product": "whatsapp", "to": PERSON, "type": "image",
                    "image": {"link": link}}),
            )
            .await;
            assert_eq!(a.status, 400, "{link}");
        }
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "image",
                "image": {"link": "http://example.com/a.jpg", "caption": "x".repeat(1025)}}),
        )
        .await;
        assert_eq!(a.status, 400);
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "to": PERSON, "type": "image",
                "image": {"link": "http://example.com/a.jpg"}}),
        )
        .await;
        assert_eq!(a.status, 200);
        let sent = wa.sent();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].kind, "document");
        assert_eq!(sent[0].text, "your report");
        assert_eq!(sent[0].link.as_deref(), Some("https://example.com/r.pdf"));
        assert_eq!(sent[0].filename.as_deref(), Some("report.pdf"));
        assert_eq!(sent[1].kind, "image");
        assert_eq!(sent[1].text, "");
        assert_eq!(sent[1].filename, None);

        // Marking a person's message read.
        let a = send(
            &wa.url,
            json!({"messaging_product": "whatsapp", "status": "read",
                "message_id": "wamid.HBgLread"}),
        )
        .await;
        assert_eq!(a.json(), json!({"success": true}));
        assert_eq!(wa.marked_read(), vec!["wamid.HBgLread".to_string()]);
        assert_eq!(wa.sent().len(), 2);
    }

    #[tokio::test]
    async fn whatsapp_throttles_with_400_code_130429_and_fails_on_demand() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        wa.person_wrote(PERSON);
        wa.throttle_next(2);
        for _ in 0..2 {
            let a = send(&wa.url, text(PERSON, "hi")).await;
            assert_eq!(a.status, 400);
            let mut v = a.json();
            v["error"]["fbtrace_id"] = json!("x");
            assert_eq!(
                v,
                json!({"error": {"message": "(#130429) Rate limit hit", "type": "OAuthException",
                    "code": 130_429, "error_data": {"messaging_product": "whatsapp",
                        "details": "Cloud API message throughput has been reached."},
                    "fbtrace_id": "x"}})
            );
            assert_eq!(a.header("retry-after"), None);
        }
        assert!(wa.sent().is_empty());
        let a = send(&wa.url, text(PERSON, "hi")).await;
        assert_eq!(a.status, 200);

        wa.failures.fail_next(1, 503);
        let a = send(&wa.url, text(PERSON, "hi")).await;
        assert_eq!(a.status, 503);
        assert_eq!(a.json()["error"]["code"], 131_000);
        assert_eq!(
            a.json()["error"]["message"],
            "(#131000) Something went wrong"
        );
        wa.failures.fail_next(1, 429);
        let a = send(&wa.url, text(PERSON, "hi")).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.json()["error"]["code"], 130_429);
        assert_eq!(wa.requests(), 5);
        assert_eq!(wa.sent().len(), 1);
    }

    #[tokio::test]
    async fn whatsapp_serves_media_by_id_then_url_to_the_token_alone() {
        let wa = FakeWhatsApp::start(TOKEN, PHONE_ID).await;
        let bytes = vec![0xff, 0xd8, 0xff, 0xe0, 1, 2, 3];
        let id = wa.add_media(bytes.clone(), "image/jpeg");
        let a = get_with(&wa.url, &format!("/v22.0/{id}"), Some(TOKEN)).await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["messaging_product"], "whatsapp");
        assert_eq!(v["id"], id.as_str());
        assert_eq!(v["mime_type"], "image/jpeg");
        assert_eq!(v["file_size"], bytes.len());
        assert_eq!(v["sha256"], sha256_hex(&bytes).as_str());
        let url = v["url"].as_str().expect("a url").to_string();
        let prefix = format!("{}/whatsapp_business/attachments/?mid={id}&ext=", wa.url);
        assert!(url.starts_with(&prefix), "{url}");
        let path = &url[wa.url.len()..];

        let a = get_with(&wa.url, path, Some(TOKEN)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("image/jpeg"));
        assert_eq!(a.body, bytes);
        let a = get_with(&wa.url, path, None).await;
        assert_eq!(a.status, 401);
        assert!(String::from_utf8_lossy(&a.body).contains("Unauthorized"));
        let a = get_with(&wa.url, path, Some("wrong")).await;
        assert_eq!(a.status, 401);
        let a = get_with(
            &wa.url,
            "/whatsapp_business/attachments/?mid=404",
            Some(TOKEN),
        )
        .await;
        assert_eq!(a.status, 404);

        let a = get_with(&wa.url, "/v22.0/123", Some(TOKEN)).await;
        assert_eq!(a.status, 400);
        let v = a.json();
        assert_eq!(v["error"]["code"], 100);
        assert!(v["error"]["message"].as_str().is_some_and(|m| {
            m.starts_with("Unsupported get request. Object with ID '123' does not exist")
        }));
        let a = get_with(&wa.url, &format!("/v22.0/{id}"), None).await;
        assert_eq!(a.status, 401);
    }

    #[tokio::test]
    async fn whatsapp_answers_mounted_in_another_router() {
        let wa = FakeWhatsApp::new(TOKEN, PHONE_ID);
        assert!(wa.url.is_empty());
        let base = serve(Router::new().nest("/demo/whatsapp", wa.router())).await;
        wa.person_wrote(PERSON);
        let a = http(
            &base,
            "POST",
            &format!("/demo/whatsapp/v21.0/{PHONE_ID}/messages"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &format!("Bearer {TOKEN}")),
            ],
            text(PERSON, "mounted").to_string().as_bytes(),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(wa.sent()[0].text, "mounted");
        let id = wa.add_media(b"%PDF".to_vec(), "application/pdf");
        let a = get_with(&base, &format!("/demo/whatsapp/v21.0/{id}"), Some(TOKEN)).await;
        let url = a.json()["url"].as_str().expect("a url").to_string();
        let prefix = format!("{base}/demo/whatsapp/whatsapp_business/attachments/?mid={id}");
        assert!(url.starts_with(&prefix), "{url}");
        let a = get_with(&base, &url[base.len()..], Some(TOKEN)).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body, b"%PDF");
    }

    #[test]
    fn whatsapp_sign_matches_pythons_hmac() {
        // python3 -c 'import hmac,hashlib;print(hmac.new(b"app-secret",b"{\"a\":1}",hashlib.sha256).hexdigest())'
        assert_eq!(
            sign("app-secret", br#"{"a":1}"#),
            "sha256=a2ac6607a24977f9757e6d78319ae1660ad42ffeee0ee3f0dff30a92bcf85448"
        );
        assert_eq!(SIGNATURE_HEADER, "x-hub-signature-256");
    }

    #[test]
    fn whatsapp_webhooks_have_metas_shape() {
        let m = text_message(
            PHONE_ID,
            "15550001234",
            PERSON,
            "Ana",
            "wamid.A",
            "hi there",
        );
        assert_eq!(m["object"], "whatsapp_business_account");
        assert_eq!(m["entry"][0]["id"], WABA_ID);
        let change = &m["entry"][0]["changes"][0];
        assert_eq!(change["field"], "messages");
        assert_eq!(change["value"]["messaging_product"], "whatsapp");
        assert_eq!(
            change["value"]["metadata"],
            json!({"display_phone_number": "15550001234", "phone_number_id": PHONE_ID})
        );
        assert_eq!(
            change["value"]["contacts"],
            json!([{"profile": {"name": "Ana"}, "wa_id": PERSON}])
        );
        let message = &change["value"]["messages"][0];
        assert_eq!(message["from"], PERSON);
        assert_eq!(message["id"], "wamid.A");
        assert_eq!(message["type"], "text");
        assert_eq!(message["text"], json!({"body": "hi there"}));
        assert!(
            message["timestamp"]
                .as_str()
                .is_some_and(|t| t.parse::<i64>().is_ok())
        );

        let b = text_messages(
            PHONE_ID,
            "15550001234",
            &[
                (PERSON, "wamid.1", "one"),
                ("447700900123", "wamid.2", "two"),
                (PERSON, "wamid.3", "three"),
            ],
        );
        let value = &b["entry"][0]["changes"][0]["value"];
        assert_eq!(value["messages"].as_array().map(Vec::len), Some(3));
        assert_eq!(value["messages"][2]["text"]["body"], "three");
        assert_eq!(value["contacts"].as_array().map(Vec::len), Some(2));
        assert_eq!(b["entry"].as_array().map(Vec::len), Some(1));

        let i = image_message(PHONE_ID, "15550001234", PERSON, "wamid.I", "1180", "a cat");
        let image = &i["entry"][0]["changes"][0]["value"]["messages"][0];
        assert_eq!(image["type"], "image");
        assert_eq!(image["image"]["id"], "1180");
        assert_eq!(image["image"]["caption"], "a cat");
        assert_eq!(image["image"]["mime_type"], "image/jpeg");
        assert!(image["image"]["sha256"].as_str().is_some());
        let mixed = batch(vec![m.clone(), i]);
        let value = &mixed["entry"][0]["changes"][0]["value"];
        assert_eq!(value["messages"][1]["type"], "image");
        assert_eq!(value["contacts"].as_array().map(Vec::len), Some(1));

        let s = status_update(PHONE_ID, "15550001234", "wamid.S", PERSON, "sent");
        let status = &s["entry"][0]["changes"][0]["value"]["statuses"][0];
        assert_eq!(status["status"], "sent");
        assert_eq!(status["recipient_id"], PERSON);
        assert_eq!(status["pricing"]["category"], "service");
        assert!(status["conversation"]["expiration_timestamp"].is_string());
        assert!(status.get("errors").is_none());
        let d = status_update(PHONE_ID, "15550001234", "wamid.S", PERSON, "delivered");
        let delivered = &d["entry"][0]["changes"][0]["value"]["statuses"][0];
        assert_eq!(
            delivered["conversation"]["id"],
            status["conversation"]["id"]
        );
        let r = status_update(PHONE_ID, "15550001234", "wamid.S", PERSON, "read");
        assert!(
            r["entry"][0]["changes"][0]["value"]["statuses"][0]
                .get("conversation")
                .is_none()
        );

        assert_eq!(
            verification_query("my verify token", "1158201444"),
            "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=my+verify+token"
        );
        let wamid = new_wamid("+447700900123");
        let raw = BASE64.decode(&wamid[6..]).expect("base64");
        assert_eq!(&raw[..3], &[0x1c, 0x18, 12]);
        assert_eq!(&raw[3..15], b"447700900123");
    }
}
