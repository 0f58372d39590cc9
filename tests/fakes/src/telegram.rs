//! Telegram's Bot API (<https://core.telegram.org/bots/api>): every method at
//! `/bot<token>/<method>`, by GET or POST, its parameters in the query string, a JSON body or a
//! form (Telegram takes all three, and a client may use any); every answer
//! `{"ok":true,"result":…}` or `{"ok":false,"error_code":…,"description":…}`. Throttling is
//! told in the body alone (`parameters.retry_after`, no `Retry-After` header), so a client that
//! only reads the header retries too soon. Files a person sent are fetched in two steps, as from
//! Telegram: `getFile` names a `file_path`, then `/file/bot<token>/<file_path>` serves the bytes.
//! The pure helpers at the end build the Updates Telegram POSTs to a bot's webhook.
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, body::Bytes};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::serve::{Failures, header, serve};
use crate::sms::{Platform, PostedObserver, SendObserver, SentMessage};

/// The header Telegram sends a webhook's `secret_token` in (set with `setWebhook`).
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// The bot's name, as `getMe` and every message it sent name it.
const BOT_FIRST_NAME: &str = "Switchboard test bot";
const BOT_USERNAME: &str = "switchboard_test_bot";

/// Telegram's limits, in UTF-16 code units (what Telegram counts, so an emoji is two).
const MAX_TEXT: usize = 4096;
const MAX_CAPTION: usize = 1024;

/// One message the bot sent that the fake accepted.
#[derive(Debug, Clone)]
pub struct TelegramSent {
    /// `sendMessage`, `sendPhoto` or `sendDocument` (canonical case; Telegram's method names
    /// are case-insensitive).
    pub method: String,
    /// The id the fake answered with.
    pub message_id: i64,
    /// The `chat_id` as the request named it (digits, `-` digits, or `@channelusername`).
    pub chat_id: String,
    /// The text, or the caption of a photo or document (`""` without one).
    pub text: String,
    /// The `photo` / `document` URL (or file_id) of a photo or document.
    pub media_url: Option<String>,
    /// When the fake took it (the message's `date`).
    pub created: DateTime<Utc>,
    /// The sender's `User-Agent`.
    pub user_agent: Option<String>,
    /// The file a `sendPhoto` / `sendDocument` uploaded (`multipart/form-data`), if it did.
    pub upload: Option<Upload>,
}

/// A file a bot uploaded with its message.
#[derive(Debug, Clone)]
pub struct Upload {
    pub file_name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// A bot's fake Telegram: the Bot API methods a gateway uses, with what they accepted recorded.
#[derive(Clone)]
pub struct FakeTelegram {
    /// The API base to configure (Telegram's is `https://api.telegram.org`); empty for a fake
    /// only mounted in another server's router ([`FakeTelegram::router`]).
    pub url: String,
    /// The token the fake answers to (`<bot id>:<secret>`).
    pub bot_token: String,
    /// Every method (not file downloads) answers the next `n` requests with this status, in
    /// Telegram's error body (a 429 carries `parameters.retry_after: 1`).
    pub failures: Failures,
    inner: Arc<Inner>,
}

struct Inner {
    /// The numeric part of the token, before `:` (0 when it is not a number).
    bot_id: i64,
    message_ids: AtomicI64,
    /// `send*` requests that reached the fake, whatever they were answered.
    requests: AtomicUsize,
    /// The next `n` `send*` requests answer 429 with `retry_after` seconds.
    throttle: Mutex<(usize, u64)>,
    sent: Mutex<Vec<TelegramSent>>,
    /// Files a person sent, by file_id.
    files: Mutex<HashMap<String, StoredFile>>,
    webhook: Mutex<Option<Webhook>>,
    /// Told of every message accepted (a load run's watch).
    observer: PostedObserver,
}

struct StoredFile {
    unique_id: String,
    path: String,
    content_type: String,
    bytes: Vec<u8>,
}

struct Webhook {
    url: String,
    secret_token: String,
    allowed_updates: Option<Value>,
}

/// A request's parameters, from its query string and its JSON or form body (the body wins).
type Params = HashMap<String, Value>;

/// Telegram's answer to a request it refused.
fn telegram_error(status: StatusCode, description: &str) -> Response {
    (
        status,
        Json(json!({"ok": false, "error_code": status.as_u16(), "description": description})),
    )
        .into_response()
}

/// Telegram's 400, with its `Bad Request: …` description.
fn bad_request(what: &str) -> Response {
    Refusal::bad_request(what).into_response()
}

/// A refusal not yet answered (a `Response` is too large an `Err` to pass around).
struct Refusal(StatusCode, String);

impl Refusal {
    fn bad_request(what: &str) -> Self {
        Self(StatusCode::BAD_REQUEST, format!("Bad Request: {what}"))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        telegram_error(self.0, &self.1)
    }
}

/// Telegram's 429: when to retry is in the body alone.
fn too_many_requests(retry_after: u64) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        Json(json!({"ok": false, "error_code": 429,
            "description": format!("Too Many Requests: retry after {retry_after}"),
            "parameters": {"retry_after": retry_after}})),
    )
        .into_response()
}

fn ok(result: Value) -> Response {
    Json(json!({"ok": true, "result": result})).into_response()
}

/// A parameter as text: strings as they are, numbers and booleans written out, and objects or
/// arrays as JSON (a form carries `reply_parameters` as JSON text).
fn param(params: &Params, name: &str) -> Option<String> {
    match params.get(name)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Telegram's chat of a `chat_id`: an integer (positive a person, negative a group, `-100…` a
/// supergroup or channel) or `@channelusername`; anything else is a chat it does not know.
fn chat_of(chat_id: &Value) -> Result<(String, Value), Refusal> {
    let id = match chat_id {
        Value::Number(n) => n.as_i64(),
        Value::String(s) if s.starts_with('@') => {
            let name = &s[1..];
            if (5..=32).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Ok((
                    s.clone(),
                    json!({"id": -1_001_234_567_890_i64, "type": "channel",
                        "title": name, "username": name}),
                ));
            }
            None
        }
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let Some(id) = id.filter(|id| *id != 0) else {
        return Err(Refusal::bad_request("chat not found"));
    };
    let chat = if id > 0 {
        json!({"id": id, "type": "private", "first_name": "Ana"})
    } else if id <= -1_000_000_000_000 {
        json!({"id": id, "type": "supergroup", "title": "Support group"})
    } else {
        json!({"id": id, "type": "group", "title": "Support group"})
    };
    let as_given = match chat_id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Ok((as_given, chat))
}

/// A file's `file_unique_id`, the same for every file_id naming it (derived, so the Update
/// helpers and the fake agree without sharing state).
fn unique_id_of(file_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(file_id.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("AQAD{hex}")
}

/// The extension a file of `content_type` gets in its `file_path`.
fn extension_of(content_type: &str) -> &'static str {
    match content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "image/jpeg" | "image/jpg" => "jpg",
        "image/png" => "png",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "text/csv" => "csv",
        "audio/ogg" => "oga",
        "audio/mpeg" => "mp3",
        "video/mp4" => "mp4",
        "application/zip" => "zip",
        _ => "bin",
    }
}

impl FakeTelegram {
    /// The bot's fake, not yet listening: mount [`Self::router`] where it should answer.
    pub fn new(bot_token: &str) -> Self {
        let bot_id = bot_token
            .split(':')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or(0);
        Self {
            url: String::new(),
            bot_token: bot_token.into(),
            failures: Failures::default(),
            inner: Arc::new(Inner {
                bot_id,
                message_ids: AtomicI64::new(1000),
                requests: AtomicUsize::new(0),
                throttle: Mutex::new((0, 0)),
                sent: Mutex::default(),
                files: Mutex::default(),
                webhook: Mutex::default(),
                observer: PostedObserver::default(),
            }),
        }
    }

    /// The bot's fake on a port of its own.
    pub async fn start(bot_token: &str) -> Self {
        let mut this = Self::new(bot_token);
        this.url = serve(this.router()).await;
        this
    }

    /// Telegram's routes: `/bot<token>/<method>` and `/file/bot<token>/<file_path>`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/{bot}/{method}", get(Self::method).post(Self::method))
            .route("/file/{bot}/{*path}", get(Self::download))
            .with_state(self.clone())
    }

    /// Every message the bot sent that the fake accepted, oldest first.
    pub fn sent(&self) -> Vec<TelegramSent> {
        self.inner.sent.lock().unwrap().clone()
    }

    /// Tell `observer` of every message accepted from now on, as it is recorded (one observer
    /// per fake).
    pub fn observe(&self, observer: Arc<dyn SendObserver>) {
        self.inner.observer.set(observer);
    }

    /// How many `send*` requests reached the fake, refused ones included (a throttled or failed
    /// send counts; [`Self::sent`] lists only the accepted).
    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// Answer the next `n` `send*` requests with Telegram's 429, `retry_after_s` in the body
    /// (`parameters.retry_after`) and no `Retry-After` header.
    pub fn throttle_next(&self, n: usize, retry_after_s: u64) {
        *self.inner.throttle.lock().unwrap() = (n, retry_after_s);
    }

    /// A file a person sent (a photo for an `image/*` type, else a document): its file_id, for
    /// an Update ([`photo_update`]) and for `getFile`.
    pub fn add_file(&self, bytes: Vec<u8>, content_type: &str) -> String {
        let mut files = self.inner.files.lock().unwrap();
        let n = files.len();
        let photo = content_type
            .trim()
            .to_ascii_lowercase()
            .starts_with("image/");
        let (prefix, folder) = if photo {
            ("AgACAgQAAxkBAAI", "photos")
        } else {
            ("BQACAgQAAxkBAAI", "documents")
        };
        let file_id = format!("{prefix}{}", uuid::Uuid::new_v4().simple());
        files.insert(
            file_id.clone(),
            StoredFile {
                unique_id: unique_id_of(&file_id),
                path: format!("{folder}/file_{n}.{}", extension_of(content_type)),
                content_type: content_type.into(),
                bytes,
            },
        );
        file_id
    }

    /// The webhook `setWebhook` set: its URL and `secret_token` (`""` without one).
    pub fn webhook(&self) -> Option<(String, String)> {
        self.inner
            .webhook
            .lock()
            .unwrap()
            .as_ref()
            .map(|w| (w.url.clone(), w.secret_token.clone()))
    }

    /// The bot as Telegram describes it (`getMe`, and `from` of what it sent).
    fn bot_user(&self) -> Value {
        json!({"id": self.inner.bot_id, "is_bot": true, "first_name": BOT_FIRST_NAME,
            "username": BOT_USERNAME})
    }

    /// Telegram's 401, unless the path's first segment is `bot` and this bot's token.
    fn authenticate(&self, bot: &str) -> Result<(), Refusal> {
        if bot.strip_prefix("bot") != Some(self.bot_token.as_str()) {
            return Err(Refusal(StatusCode::UNAUTHORIZED, "Unauthorized".into()));
        }
        Ok(())
    }

    /// The request's parameters: the query string, then a JSON or form body over it.
    fn params(query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Result<Params, Refusal> {
        let mut params = Params::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            params.insert(key.into_owned(), Value::String(value.into_owned()));
        }
        if body.is_empty() {
            return Ok(params);
        }
        let content_type = header(headers, "content-type").to_ascii_lowercase();
        if content_type.starts_with("application/json") {
            let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
                return Err(Refusal::bad_request("can't parse JSON object"));
            };
            params.extend(object);
        } else if content_type.starts_with("application/x-www-form-urlencoded") {
            for (key, value) in form_urlencoded::parse(body) {
                params.insert(key.into_owned(), Value::String(value.into_owned()));
            }
        } else if content_type.starts_with("multipart/form-data") {
            return Err(Refusal::bad_request(
                "multipart/form-data is read by multipart()",
            ));
        }
        Ok(params)
    }

    /// A `multipart/form-data` body: its text fields as parameters, and the file it uploads
    /// (Telegram takes one `photo` / `document` part with a file name as the upload).
    async fn multipart(
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<(Params, Option<(String, Upload)>), Refusal> {
        let mut params = Self::params(query, headers, &[])?;
        let boundary = multer::parse_boundary(header(headers, "content-type"))
            .map_err(|_| Refusal::bad_request("can't parse multipart/form-data"))?;
        let stream = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
        let mut form = multer::Multipart::new(stream, boundary);
        let mut upload = None;
        let unreadable = |_| Refusal::bad_request("can't parse multipart/form-data");
        while let Some(field) = form.next_field().await.map_err(unreadable)? {
            let name = field.name().unwrap_or_default().to_string();
            match field.file_name().map(str::to_string) {
                Some(file_name) => {
                    let content_type = field
                        .content_type()
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "application/octet-stream".into());
                    let bytes = field.bytes().await.map_err(unreadable)?.to_vec();
                    params.insert(name.clone(), Value::String(format!("attach://{file_name}")));
                    upload = Some((
                        name,
                        Upload {
                            file_name,
                            content_type,
                            bytes,
                        },
                    ));
                }
                None => {
                    let text = field.text().await.map_err(unreadable)?;
                    params.insert(name, Value::String(text));
                }
            }
        }
        Ok((params, upload))
    }

    async fn method(
        State(s): State<FakeTelegram>,
        Path((bot, method)): Path<(String, String)>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        // Telegram's method names are case-insensitive.
        let method = match method.to_ascii_lowercase().as_str() {
            "getme" => "getMe",
            "sendmessage" => "sendMessage",
            "sendphoto" => "sendPhoto",
            "senddocument" => "sendDocument",
            "getfile" => "getFile",
            "setwebhook" => "setWebhook",
            "deletewebhook" => "deleteWebhook",
            "getwebhookinfo" => "getWebhookInfo",
            _ => "",
        };
        let send = method.starts_with("send");
        if send {
            s.inner.requests.fetch_add(1, Ordering::SeqCst);
        }
        if let Err(refused) = s.authenticate(&bot) {
            return refused.into_response();
        }
        if method.is_empty() {
            return telegram_error(StatusCode::NOT_FOUND, "Not Found");
        }
        if let Some(status) = s.failures.take() {
            if status == StatusCode::TOO_MANY_REQUESTS {
                return too_many_requests(1);
            }
            return telegram_error(status, status.canonical_reason().unwrap_or("Error"));
        }
        if send {
            let mut throttle = s.inner.throttle.lock().unwrap();
            if throttle.0 > 0 {
                throttle.0 -= 1;
                return too_many_requests(throttle.1);
            }
        }
        let multipart = header(&headers, "content-type")
            .to_ascii_lowercase()
            .starts_with("multipart/form-data");
        let read = if multipart {
            Self::multipart(query.as_deref(), &headers, body).await
        } else {
            Self::params(query.as_deref(), &headers, &body).map(|p| (p, None))
        };
        let (params, upload) = match read {
            Ok(read) => read,
            Err(refused) => return refused.into_response(),
        };
        let user_agent = Some(header(&headers, "user-agent").to_string()).filter(|u| !u.is_empty());
        match method {
            "getMe" => {
                let mut me = s.bot_user();
                me["can_join_groups"] = json!(true);
                me["can_read_all_group_messages"] = json!(false);
                me["supports_inline_queries"] = json!(false);
                ok(me)
            }
            "sendMessage" | "sendPhoto" | "sendDocument" => {
                s.send(method, &params, upload, user_agent)
            }
            "getFile" => s.get_file(&params),
            "setWebhook" => s.set_webhook(&params),
            "deleteWebhook" => {
                let was = s.inner.webhook.lock().unwrap().take();
                Json(json!({"ok": true, "result": true, "description":
                    if was.is_some() { "Webhook was deleted" } else { "Webhook is already deleted" }}))
                .into_response()
            }
            _ => {
                let webhook = s.inner.webhook.lock().unwrap();
                let mut info = json!({
                    "url": webhook.as_ref().map(|w| w.url.as_str()).unwrap_or(""),
                    "has_custom_certificate": false, "pending_update_count": 0,
                });
                if let Some(allowed) = webhook.as_ref().and_then(|w| w.allowed_updates.clone()) {
                    info["allowed_updates"] = allowed;
                }
                ok(info)
            }
        }
    }

    /// `sendMessage`, `sendPhoto`, `sendDocument`: checked as Telegram checks them, recorded,
    /// and answered with the Message sent.
    fn send(
        &self,
        method: &str,
        params: &Params,
        upload: Option<(String, Upload)>,
        user_agent: Option<String>,
    ) -> Response {
        let Some(chat_id) = params
            .get("chat_id")
            .filter(|v| !v.is_null() && v.as_str() != Some(""))
        else {
            return bad_request("chat_id is empty");
        };
        let (chat_id, chat) = match chat_of(chat_id) {
            Ok(chat) => chat,
            Err(refused) => return refused.into_response(),
        };
        let (text, media_url) = if method == "sendMessage" {
            let text = param(params, "text").unwrap_or_default();
            if text.trim().is_empty() {
                return bad_request("message text is empty");
            }
            if text.encode_utf16().count() > MAX_TEXT {
                return bad_request("message is too long");
            }
            (text, None)
        } else {
            let field = if method == "sendPhoto" {
                "photo"
            } else {
                "document"
            };
            let Some(media) = param(params, field).filter(|m| !m.is_empty()) else {
                return bad_request(&format!("there is no {field} in the request"));
            };
            let uploaded = upload.as_ref().is_some_and(|(name, _)| name == field);
            if !(uploaded
                || media.starts_with("https://")
                || media.starts_with("http://")
                || self.inner.files.lock().unwrap().contains_key(&media))
            {
                return bad_request("wrong file identifier/HTTP URL specified");
            }
            let caption = param(params, "caption").unwrap_or_default();
            if caption.encode_utf16().count() > MAX_CAPTION {
                return bad_request("message caption is too long");
            }
            (caption, Some(media))
        };
        let created = Utc::now();
        let message_id = self.inner.message_ids.fetch_add(1, Ordering::SeqCst);
        let mut message = json!({
            "message_id": message_id, "from": self.bot_user(), "chat": chat,
            "date": created.timestamp(),
        });
        if let Some(media) = &media_url {
            let file_id = format!(
                "{}{}",
                if method == "sendPhoto" {
                    "AgACAgQAAxkDAAI"
                } else {
                    "BQACAgQAAxkDAAI"
                },
                uuid::Uuid::new_v4().simple()
            );
            let unique_id = unique_id_of(&file_id);
            if method == "sendPhoto" {
                message["photo"] = json!([
                    {"file_id": file_id, "file_unique_id": unique_id, "file_size": 1_254,
                        "width": 90, "height": 67},
                    {"file_id": file_id, "file_unique_id": unique_id, "file_size": 48_211,
                        "width": 800, "height": 600},
                ]);
            } else {
                let file_name = media
                    .rsplit('/')
                    .next()
                    .and_then(|name| name.split(['?', '#']).next())
                    .filter(|name| !name.is_empty())
                    .unwrap_or("file");
                message["document"] = json!({
                    "file_name": file_name, "mime_type": "application/octet-stream",
                    "file_id": file_id, "file_unique_id": unique_id, "file_size": 10_240,
                });
            }
            if !text.is_empty() {
                message["caption"] = json!(text);
            }
        } else {
            message["text"] = json!(text);
        }
        let posted = SentMessage {
            platform: Platform::Telegram,
            sid: message_id.to_string(),
            to: chat_id.clone(),
            body: text.clone(),
            created,
            user_agent: user_agent.clone(),
        };
        self.inner.sent.lock().unwrap().push(TelegramSent {
            method: method.into(),
            message_id,
            chat_id,
            text,
            media_url,
            created,
            user_agent,
            upload: upload.map(|(_, file)| file),
        });
        self.inner.observer.tell(posted);
        ok(message)
    }

    /// `getFile`: where a file a person sent can be downloaded.
    fn get_file(&self, params: &Params) -> Response {
        let Some(file_id) = param(params, "file_id").filter(|f| !f.is_empty()) else {
            return bad_request("file_id is empty");
        };
        match self.inner.files.lock().unwrap().get(&file_id) {
            Some(file) => ok(json!({
                "file_id": file_id, "file_unique_id": file.unique_id,
                "file_size": file.bytes.len(), "file_path": file.path,
            })),
            None => bad_request("invalid file_id"),
        }
    }

    /// `setWebhook`: an empty `url` removes the webhook, as on Telegram.
    fn set_webhook(&self, params: &Params) -> Response {
        let url = param(params, "url").unwrap_or_default();
        let secret_token = param(params, "secret_token").unwrap_or_default();
        if !secret_token.is_empty()
            && (secret_token.len() > 256
                || !secret_token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
        {
            return bad_request("secret token contains unallowed characters");
        }
        let allowed_updates = match params.get("allowed_updates") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(list @ Value::Array(_)) => Some(list),
                _ => return bad_request("can't parse allowed updates"),
            },
            Some(list @ Value::Array(_)) => Some(list.clone()),
            Some(_) => return bad_request("can't parse allowed updates"),
        };
        let mut webhook = self.inner.webhook.lock().unwrap();
        if url.is_empty() {
            let was = webhook.take();
            return Json(json!({"ok": true, "result": true, "description":
                if was.is_some() { "Webhook was deleted" } else { "Webhook is already deleted" }}))
            .into_response();
        }
        *webhook = Some(Webhook {
            url,
            secret_token,
            allowed_updates,
        });
        Json(json!({"ok": true, "result": true, "description": "Webhook was set"})).into_response()
    }

    /// `/file/bot<token>/<file_path>`: a file's bytes with its type.
    async fn download(
        State(s): State<FakeTelegram>,
        Path((bot, path)): Path<(String, String)>,
    ) -> Response {
        if let Err(refused) = s.authenticate(&bot) {
            return refused.into_response();
        }
        let files = s.inner.files.lock().unwrap();
        match files.values().find(|f| f.path == path) {
            Some(file) => (
                [(axum::http::header::CONTENT_TYPE, file.content_type.clone())],
                file.bytes.clone(),
            )
                .into_response(),
            None => telegram_error(StatusCode::NOT_FOUND, "Not Found"),
        }
    }
}

/// The person every Update comes from.
fn person(from_id: i64) -> Value {
    json!({"id": from_id, "is_bot": false, "first_name": "Ana", "language_code": "en"})
}

/// The chat of an Update: a person's own (`private`), else a group of theirs.
fn update_chat(chat_id: i64, chat_type: &str) -> Value {
    match chat_type {
        "private" => json!({"id": chat_id, "type": "private", "first_name": "Ana"}),
        other => json!({"id": chat_id, "type": other, "title": "Support group"}),
    }
}

/// The Update Telegram POSTs to a bot's webhook for a text message (`message_id` is
/// `update_id`). `chat_type` is `private`, `group` or `supergroup` (a group's chat_id is
/// negative), or `channel` (a `channel_post`, from the channel itself). A text starting with
/// `/` carries its `bot_command` entity, as Telegram marks it.
pub fn text_update(
    update_id: i64,
    from_id: i64,
    chat_id: i64,
    chat_type: &str,
    text: &str,
) -> Value {
    let chat = update_chat(chat_id, chat_type);
    let mut message = json!({
        "message_id": update_id, "chat": chat, "date": Utc::now().timestamp(), "text": text,
    });
    if text.starts_with('/') {
        let command = text.split_whitespace().next().unwrap_or(text);
        message["entities"] = json!([
            {"offset": 0, "length": command.encode_utf16().count(), "type": "bot_command"}
        ]);
    }
    if chat_type == "channel" {
        message["sender_chat"] = message["chat"].clone();
        return json!({"update_id": update_id, "channel_post": message});
    }
    message["from"] = person(from_id);
    json!({"update_id": update_id, "message": message})
}

/// The Update Telegram POSTs to a bot's webhook for a photo (`message_id` is `update_id`): two
/// sizes of `file_id`, and the caption when there is one. A negative `chat_id` is a group.
pub fn photo_update(
    update_id: i64,
    from_id: i64,
    chat_id: i64,
    file_id: &str,
    caption: &str,
) -> Value {
    let chat_type = if chat_id < 0 { "group" } else { "private" };
    let unique_id = unique_id_of(file_id);
    let mut message = json!({
        "message_id": update_id, "from": person(from_id),
        "chat": update_chat(chat_id, chat_type), "date": Utc::now().timestamp(),
        "photo": [
            {"file_id": file_id, "file_unique_id": unique_id, "file_size": 1_254,
                "width": 90, "height": 67},
            {"file_id": file_id, "file_unique_id": unique_id, "file_size": 48_211,
                "width": 800, "height": 600},
        ],
    });
    if !caption.is_empty() {
        message["caption"] = json!(caption);
    }
    json!({"update_id": update_id, "message": message})
}

#[cfg(test)]
mod tests {
    //! Driven over real HTTP with the crate's test client ([`crate::test_client`]).
    use super::*;
    use crate::test_client::{Answer, form, http};

    const TOKEN: &str = "123456789:AAHfakeTokenForTests_0123456789abcdef";

    async fn post_json(base: &str, path: &str, body: Value) -> Answer {
        http(
            base,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
        .await
    }

    #[tokio::test]
    async fn telegram_send_message_by_json_form_and_query_is_recorded() {
        let tg = FakeTelegram::start(TOKEN).await;
        let path = format!("/bot{TOKEN}/sendMessage");
        let a = post_json(&tg.url, &path, json!({"chat_id": 42, "text": "hello"})).await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["ok"], true);
        assert_eq!(v["result"]["message_id"], 1000);
        assert_eq!(v["result"]["chat"]["id"], 42);
        assert_eq!(v["result"]["chat"]["type"], "private");
        assert_eq!(v["result"]["from"]["id"], 123_456_789);
        assert_eq!(v["result"]["from"]["is_bot"], true);
        assert_eq!(v["result"]["text"], "hello");
        assert!(v["result"]["date"].as_i64().is_some());

        let body = form(&[("chat_id", "42"), ("text", "hi there & more")]);
        let a = http(
            &tg.url,
            "POST",
            &path,
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["result"]["message_id"], 1001);
        assert_eq!(a.json()["result"]["text"], "hi there & more");

        let query = form(&[("chat_id", "-1001234"), ("text", "by query")]);
        let a = http(
            &tg.url,
            "GET",
            &format!("/bot{TOKEN}/sendmessage?{query}"),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["result"]["chat"]["type"], "group");

        let sent = tg.sent();
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[0].method, "sendMessage");
        assert_eq!(sent[0].chat_id, "42");
        assert_eq!(sent[0].text, "hello");
        assert_eq!(sent[0].message_id, 1000);
        assert_eq!(sent[0].media_url, None);
        assert_eq!(sent[0].user_agent.as_deref(), Some("switchboard-test/1"));
        assert_eq!(sent[1].text, "hi there & more");
        assert_eq!(sent[2].chat_id, "-1001234");
        assert_eq!(tg.requests(), 3);

        let me = http(&tg.url, "GET", &format!("/bot{TOKEN}/getMe"), &[], b"").await;
        assert_eq!(me.status, 200);
        assert_eq!(me.json()["result"]["id"], 123_456_789);
        assert_eq!(me.json()["result"]["username"], "switchboard_test_bot");
    }

    #[tokio::test]
    async fn telegram_refuses_a_wrong_token_an_unknown_method_and_an_unknown_chat() {
        let tg = FakeTelegram::start(TOKEN).await;
        let a = post_json(
            &tg.url,
            "/bot123456789:wrong/sendMessage",
            json!({"chat_id": 42, "text": "hello"}),
        )
        .await;
        assert_eq!(a.status, 401);
        assert_eq!(
            a.json(),
            json!({"ok": false, "error_code": 401, "description": "Unauthorized"})
        );
        let a = http(&tg.url, "GET", &format!("/bot{TOKEN}/sendPigeon"), &[], b"").await;
        assert_eq!(a.status, 404);
        assert_eq!(
            a.json(),
            json!({"ok": false, "error_code": 404, "description": "Not Found"})
        );
        let path = format!("/bot{TOKEN}/sendMessage");
        let a = post_json(&tg.url, &path, json!({"chat_id": "ana", "text": "x"})).await;
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["description"], "Bad Request: chat not found");
        let a = post_json(
            &tg.url,
            &path,
            json!({"chat_id": "@support_channel", "text": "x"}),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["result"]["chat"]["type"], "channel");
        let a = post_json(&tg.url, &path, json!({"chat_id": 42, "text": "{"})).await;
        assert_eq!(a.status, 200);
        let a = http(
            &tg.url,
            "POST",
            &path,
            &[("Content-Type", "application/json")],
            b"{",
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(tg.sent().len(), 2);
    }

    #[tokio::test]
    async fn telegram_counts_text_length_in_utf16_units() {
        let tg = FakeTelegram::start(TOKEN).await;
        let path = format!("/bot{TOKEN}/sendMessage");
        let fits = "😀".repeat(2048); // 4096 UTF-16 units, 2048 characters
        let too_long = format!("{fits}a");
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": too_long})).await;
        assert_eq!(a.status, 400);
        assert_eq!(
            a.json(),
            json!({"ok": false, "error_code": 400, "description": "Bad Request: message is too long"})
        );
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": fits})).await;
        assert_eq!(a.status, 200);
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": ""})).await;
        assert_eq!(a.status, 400);
        assert_eq!(
            a.json()["description"],
            "Bad Request: message text is empty"
        );
        assert_eq!(tg.sent().len(), 1);
        assert_eq!(tg.sent()[0].text, fits);
        assert_eq!(tg.requests(), 3);
    }

    #[tokio::test]
    async fn telegram_throttles_in_the_body_alone_then_takes_the_next() {
        let tg = FakeTelegram::start(TOKEN).await;
        let path = format!("/bot{TOKEN}/sendMessage");
        tg.throttle_next(1, 7);
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": "hi"})).await;
        assert_eq!(a.status, 429);
        assert_eq!(
            a.json(),
            json!({"ok": false, "error_code": 429,
                "description": "Too Many Requests: retry after 7",
                "parameters": {"retry_after": 7}})
        );
        assert_eq!(a.header("retry-after"), None);
        assert_eq!(tg.requests(), 1);
        assert!(tg.sent().is_empty());
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": "hi"})).await;
        assert_eq!(a.status, 200);
        assert_eq!(tg.requests(), 2);
        assert_eq!(tg.sent().len(), 1);

        tg.failures.fail_next(1, 502);
        let a = post_json(&tg.url, &path, json!({"chat_id": 7, "text": "hi"})).await;
        assert_eq!(a.status, 502);
        assert_eq!(a.json()["description"], "Bad Gateway");
        tg.failures.fail_next(1, 429);
        let a = http(&tg.url, "GET", &format!("/bot{TOKEN}/getMe"), &[], b"").await;
        assert_eq!(a.status, 429);
        assert_eq!(a.json()["parameters"]["retry_after"], 1);
        assert_eq!(a.header("retry-after"), None);
        assert_eq!(tg.requests(), 3);
    }

    #[tokio::test]
    async fn telegram_serves_an_added_file_through_get_file() {
        let tg = FakeTelegram::start(TOKEN).await;
        let bytes = vec![0xff, 0xd8, 0xff, 0xe0, 1, 2, 3];
        let file_id = tg.add_file(bytes.clone(), "image/jpeg");
        let query = form(&[("file_id", &file_id)]);
        let a = http(
            &tg.url,
            "GET",
            &format!("/bot{TOKEN}/getFile?{query}"),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["result"]["file_id"], file_id.as_str());
        assert_eq!(v["result"]["file_size"], bytes.len());
        let file_path = v["result"]["file_path"].as_str().expect("a file_path");
        assert_eq!(file_path, "photos/file_0.jpg");
        assert_eq!(
            v["result"]["file_unique_id"],
            photo_update(1, 2, 2, &file_id, "")["message"]["photo"][0]["file_unique_id"]
        );

        let a = http(
            &tg.url,
            "GET",
            &format!("/file/bot{TOKEN}/{file_path}"),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("content-type"), Some("image/jpeg"));
        assert_eq!(a.body, bytes);

        let a = http(
            &tg.url,
            "GET",
            &format!("/file/botWRONG/{file_path}"),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.status, 401);
        let a = http(
            &tg.url,
            "GET",
            &format!("/file/bot{TOKEN}/photos/nope.jpg"),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.status, 404);
        let a = post_json(
            &tg.url,
            &format!("/bot{TOKEN}/getFile"),
            json!({"file_id": "nope"}),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(
            a.json(),
            json!({"ok": false, "error_code": 400, "description": "Bad Request: invalid file_id"})
        );
        let doc = tg.add_file(b"%PDF".to_vec(), "application/pdf");
        let a = post_json(
            &tg.url,
            &format!("/bot{TOKEN}/getFile"),
            json!({"file_id": doc}),
        )
        .await;
        assert_eq!(a.json()["result"]["file_path"], "documents/file_1.pdf");
    }

    #[tokio::test]
    async fn telegram_sends_media_by_url_and_sets_its_webhook() {
        let tg = FakeTelegram::start(TOKEN).await;
        let a = post_json(
            &tg.url,
            &format!("/bot{TOKEN}/sendPhoto"),
            json!({"chat_id": 42, "photo": "https://example.com/a.jpg", "caption": "look"}),
        )
        .await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["result"]["caption"], "look");
        assert_eq!(v["result"]["photo"].as_array().map(Vec::len), Some(2));
        let a = post_json(
            &tg.url,
            &format!("/bot{TOKEN}/sendDocument"),
            json!({"chat_id": 42, "caption": "x"}),
        )
        .await;
        assert_eq!(a.status, 400);
        assert_eq!(
            a.json()["description"],
            "Bad Request: there is no document in the request"
        );
        let a = post_json(
            &tg.url,
            &format!("/bot{TOKEN}/sendDocument"),
            json!({"chat_id": 42, "document": "https://example.com/r.pdf",
                "caption": "x".repeat(1025)}),
        )
        .await;
        assert_eq!(
            a.json()["description"],
            "Bad Request: message caption is too long"
        );
        let sent = tg.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].method, "sendPhoto");
        assert_eq!(sent[0].text, "look");
        assert_eq!(
            sent[0].media_url.as_deref(),
            Some("https://example.com/a.jpg")
        );

        assert_eq!(tg.webhook(), None);
        let body = form(&[
            ("url", "http://127.0.0.1:9/telegram"),
            ("secret_token", "s3cret-token_1"),
            ("allowed_updates", r#"["message"]"#),
        ]);
        let a = http(
            &tg.url,
            "POST",
            &format!("/bot{TOKEN}/setWebhook"),
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        )
        .await;
        assert_eq!(
            a.json(),
            json!({"ok": true, "result": true, "description": "Webhook was set"})
        );
        assert_eq!(
            tg.webhook(),
            Some((
                "http://127.0.0.1:9/telegram".to_string(),
                "s3cret-token_1".to_string()
            ))
        );
        let a = http(
            &tg.url,
            "GET",
            &format!("/bot{TOKEN}/getWebhookInfo"),
            &[],
            b"",
        )
        .await;
        assert_eq!(
            a.json()["result"],
            json!({"url": "http://127.0.0.1:9/telegram", "has_custom_certificate": false,
                "pending_update_count": 0, "allowed_updates": ["message"]})
        );
    }

    #[tokio::test]
    async fn telegram_answers_mounted_in_another_router() {
        let tg = FakeTelegram::new(TOKEN);
        assert!(tg.url.is_empty());
        let base = serve(Router::new().nest("/demo/telegram", tg.router())).await;
        let a = post_json(
            &base,
            &format!("/demo/telegram/bot{TOKEN}/sendMessage"),
            json!({"chat_id": 5, "text": "mounted"}),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(tg.sent()[0].text, "mounted");
    }

    #[test]
    fn telegram_updates_have_telegrams_shape() {
        let u = text_update(10, 111, 111, "private", "/start now");
        assert_eq!(u["update_id"], 10);
        assert_eq!(
            u["message"]["from"],
            json!({"id": 111, "is_bot": false, "first_name": "Ana", "language_code": "en"})
        );
        assert_eq!(
            u["message"]["chat"],
            json!({"id": 111, "type": "private", "first_name": "Ana"})
        );
        assert_eq!(u["message"]["text"], "/start now");
        assert_eq!(u["message"]["entities"][0]["length"], 6);
        let g = text_update(11, 111, -42, "group", "hi");
        assert_eq!(
            g["message"]["chat"],
            json!({"id": -42, "type": "group", "title": "Support group"})
        );
        assert!(g["message"].get("entities").is_none());
        let p = photo_update(12, 111, 111, "AgACfile", "a cat");
        assert_eq!(p["message"]["photo"][0]["width"], 90);
        assert_eq!(p["message"]["photo"][0]["file_id"], "AgACfile");
        assert_eq!(p["message"]["caption"], "a cat");
        assert!(p["message"].get("text").is_none());
    }
}
