//! Slack's Web API (<https://api.slack.com/web>): every method at `/api/<method>`, by POST with
//! a JSON body (`application/json; charset=utf-8`) or a form, or by GET with a query string;
//! the bot token in `Authorization: Bearer …` (a form or query may carry `token=` instead).
//! Slack answers every refusal with HTTP 200 and `{"ok":false,"error":…}`; only throttling has
//! a status of its own (429 with `Retry-After`). Files a person shared are served at their
//! `url_private` to the bot's token alone (anyone else is sent to the login page, a 302); files
//! the bot uploads take Slack's three steps (`files.getUploadURLExternal`, the bytes to the
//! upload URL it answers, `files.completeUploadExternal`) and are shared as a bot's message.
//! The pure helpers at the end build what Slack POSTs to an app's Events API request URL
//! (<https://api.slack.com/apis/events-api>) and sign it as Slack does.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header as names};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router, body::Bytes};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::serve::{Failures, header, serve};
use crate::sms::{Platform, PostedObserver, SendObserver, SentMessage};
use crate::webhook::hmac_sha256;

/// The header Slack signs a request to the request URL in (`v0=<hex>`, see [`sign`]).
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The header carrying the unix seconds a request was signed at.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// The header Slack numbers a redelivery in (1, 2, 3; absent on the first delivery).
pub const RETRY_NUM_HEADER: &str = "x-slack-retry-num";
/// Why Slack redelivers (`http_timeout`, `http_error`, …).
pub const RETRY_REASON_HEADER: &str = "x-slack-retry-reason";

/// The app's bot user, bot and app, as the fake and the event helpers name them.
pub const BOT_USER_ID: &str = "U0BOT0001";
pub const BOT_ID: &str = "B0BOT0001";
pub const APP_ID: &str = "A0APP0001";
/// The (deprecated) verification token every event envelope carries.
pub const VERIFICATION_TOKEN: &str = "Jhj5dZrVaK7ZwHHjRyZWjbDl";

/// The workspace's address (`auth.test`'s `url`, and the login page a file redirects to).
const WORKSPACE_URL: &str = "https://fake.slack.com/";
/// The bot's name (`auth.test`'s `user`).
const BOT_NAME: &str = "switchboard";
/// Slack's limit on a message's `text`, in characters.
const MAX_TEXT: usize = 40_000;
/// `conversations.history` / `conversations.replies`: the default and largest `limit`.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// One message the bot posted that the fake accepted (`chat.postMessage`).
#[derive(Debug, Clone)]
pub struct SlackPosted {
    /// The channel as answered: the DM's `D…` id when the request named a user.
    pub channel: String,
    /// The `channel` as the request named it (`C…`, `G…`, `D…` or a user's `U…`).
    pub requested_channel: String,
    /// The message's ts the fake answered with.
    pub ts: String,
    /// The thread it replied in, as the request named it.
    pub thread_ts: Option<String>,
    pub text: String,
    /// When the fake took it.
    pub created: DateTime<Utc>,
    /// The sender's `User-Agent`.
    pub user_agent: Option<String>,
}

/// A workspace's fake Slack, as its bot sees it: the Web API methods a gateway uses, with what
/// they accepted recorded, and the files people shared.
#[derive(Clone)]
pub struct FakeSlack {
    /// The base to configure (Slack's is `https://slack.com`; methods are under `/api/`);
    /// empty for a fake only mounted in another server's router ([`FakeSlack::router`]), whose
    /// caller sets it before [`FakeSlack::add_file`] so files point at the right place.
    pub url: String,
    /// The bot token the fake answers to (`xoxb-…`).
    pub bot_token: String,
    /// The workspace (`T…`).
    pub team_id: String,
    /// The bot's user (`U0BOT0001`), bot (`B0BOT0001`) and app (`A0APP0001`) ids. Set them
    /// before [`Self::router`] / [`Self::start`] to change them (the router keeps a copy).
    pub bot_user_id: String,
    pub bot_id: String,
    pub app_id: String,
    /// Every Web API method (not file downloads) answers the next `n` requests with this
    /// status (a 429 in Slack's own way: `ratelimited`, `Retry-After: 1`).
    pub failures: Failures,
    /// `conversations.history` and `conversations.replies` alone answer the next `n` requests
    /// with this status.
    pub history_failures: Failures,
    inner: Arc<Inner>,
}

struct Inner {
    /// `chat.postMessage` requests that reached the fake, whatever they were answered.
    post_requests: AtomicUsize,
    /// `conversations.history` / `conversations.replies` requests, whatever they were answered.
    history_lookups: AtomicUsize,
    /// The next `n` `chat.postMessage` requests answer 429 with `Retry-After: s`.
    throttle: Mutex<(usize, u64)>,
    /// The last ts handed out, in microseconds (every next one is later).
    last_ts: Mutex<i64>,
    /// Every message in every channel, the bot's and those added for people, in ts order.
    messages: Mutex<Vec<Message>>,
    posted: Mutex<Vec<SlackPosted>>,
    /// Files people shared, by `<team>-<id>` (their `url_private`'s first segment).
    files: Mutex<HashMap<String, StoredFile>>,
    /// Files `files.getUploadURLExternal` announced and not yet shared, by id.
    uploads: Mutex<HashMap<String, PendingUpload>>,
    /// Files the bot uploaded and shared, in ts order.
    uploaded: Mutex<Vec<SlackUploaded>>,
    /// Told of every `chat.postMessage` accepted (a load run's watch).
    observer: PostedObserver,
}

/// A message the fake holds.
struct Message {
    channel: String,
    ts: String,
    /// `ts` in microseconds.
    at: i64,
    thread_ts: Option<String>,
    /// `thread_ts` in microseconds, when it is a ts.
    thread_at: Option<i64>,
    text: String,
    user: String,
    from_bot: bool,
    blocks: Option<Value>,
    attachments: Option<Value>,
    /// The files a message shares (`files.completeUploadExternal`'s), as Slack lists them.
    files: Option<Value>,
}

impl Message {
    /// Whether `conversations.history` lists it (not a reply in a thread).
    fn top_level(&self) -> bool {
        self.thread_at.is_none_or(|root| root == self.at)
    }

    /// Whether it replies in the thread of the message at `root`.
    fn replies_to(&self, root: i64) -> bool {
        self.thread_at == Some(root) && self.at != root
    }
}

struct StoredFile {
    name: String,
    mimetype: String,
    bytes: Vec<u8>,
}

/// A file the bot uploaded and shared (`files.getUploadURLExternal`, its bytes to the upload
/// URL, then `files.completeUploadExternal`), as the fake took it.
#[derive(Debug, Clone)]
pub struct SlackUploaded {
    /// The file's id (`F…`), as `files.getUploadURLExternal` answered it.
    pub id: String,
    /// Its `filename`, as `files.getUploadURLExternal` was told it.
    pub name: String,
    /// Its title, as `files.completeUploadExternal` was told it (else its name).
    pub title: String,
    pub bytes: Vec<u8>,
    /// The conversation it was shared in (a user's DM when `channels` named the user).
    pub channel: String,
    /// The thread it was shared in, as the request named it.
    pub thread_ts: Option<String>,
    /// `initial_comment`: the text of the message that shares it.
    pub comment: String,
    /// The ts of that message.
    pub ts: String,
    /// When the fake shared it.
    pub created: DateTime<Utc>,
}

/// A file `files.getUploadURLExternal` announced: its name and length, and its bytes once
/// they were posted to its upload URL.
struct PendingUpload {
    name: String,
    length: usize,
    bytes: Option<Vec<u8>>,
}

/// A request's parameters, from its query string and its JSON or form body (the body wins).
type Params = HashMap<String, Value>;

/// Slack's refusal: HTTP 200, `ok: false`.
fn slack_error(error: &str) -> Value {
    json!({"ok": false, "error": error})
}

/// Slack's 429.
fn rate_limited(retry_after: u64) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(names::RETRY_AFTER, retry_after.to_string())],
        Json(slack_error("ratelimited")),
    )
        .into_response()
}

/// A failure answered on demand: Slack's 429, or the status with an error body.
fn failure(status: StatusCode) -> Response {
    if status == StatusCode::TOO_MANY_REQUESTS {
        return rate_limited(1);
    }
    let error = match status {
        StatusCode::INTERNAL_SERVER_ERROR => "internal_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
        _ => "fatal_error",
    };
    (status, Json(slack_error(error))).into_response()
}

/// A parameter as text: strings as they are, numbers and booleans written out, and objects or
/// arrays as JSON.
fn param(params: &Params, name: &str) -> Option<String> {
    match params.get(name)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `blocks` / `attachments`: a JSON array, or JSON text of one (a form carries it as text).
/// `Ok(None)` when absent or empty, `Err` when it is not an array.
fn structured(params: &Params, name: &str) -> Result<Option<Value>, ()> {
    let value = match params.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => return Ok(None),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|_| ())?,
        Some(other) => other.clone(),
    };
    match value {
        Value::Array(items) if items.is_empty() => Ok(None),
        list @ Value::Array(_) => Ok(Some(list)),
        _ => Err(()),
    }
}

/// Whether `id` looks like a conversation (`C…`, `G…`, `D…`) or, with `user`, a user (`U…`).
fn is_id(id: &str, user: bool) -> bool {
    let mut chars = id.chars();
    let kind = chars.next();
    let kinds: &[char] = if user {
        &['C', 'D', 'G', 'U']
    } else {
        &['C', 'D', 'G']
    };
    kind.is_some_and(|k| kinds.contains(&k))
        && id.len() >= 3
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// The channel `chat.postMessage` posts in: the id itself, or a user's DM with the app.
fn channel_of(requested: &str) -> Option<String> {
    if !is_id(requested, true) {
        return None;
    }
    Some(match requested.strip_prefix('U') {
        Some(rest) => format!("D{rest}"),
        None => requested.to_string(),
    })
}

/// A ts (`<unix seconds>.<micros>`, or fewer fraction digits, or none) in microseconds.
fn parse_ts(ts: &str) -> Option<i64> {
    let (seconds, fraction) = ts.trim().split_once('.').unwrap_or((ts.trim(), ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if seconds.is_empty() || seconds.len() > 12 || !digits(seconds) {
        return None;
    }
    if fraction.len() > 6 || !digits(fraction) {
        return None;
    }
    let micros = format!("{fraction:0<6}").parse::<i64>().ok()?;
    Some(seconds.parse::<i64>().ok()? * 1_000_000 + micros)
}

/// A ts as Slack writes it: seconds, a dot, six digits.
fn format_ts(at: i64) -> String {
    format!("{}.{:06}", at / 1_000_000, at % 1_000_000)
}

/// The cursor of the page starting at the message at `at` (Slack's own shape: base64 of
/// `next_ts:<ts without its dot>`).
fn cursor_of(at: i64) -> String {
    BASE64.encode(format!("next_ts:{at}"))
}

fn at_of_cursor(cursor: &str) -> Option<i64> {
    let raw = BASE64.decode(cursor.trim()).ok()?;
    String::from_utf8(raw)
        .ok()?
        .strip_prefix("next_ts:")?
        .parse()
        .ok()
}

/// A path segment percent-encoded (all but RFC 3986's unreserved characters).
fn encode_segment(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A file's `filetype` and `pretty_type`, from its type (else its name's extension).
fn filetype_of(mimetype: &str, name: &str) -> (&'static str, &'static str) {
    let mimetype = mimetype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let extension = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match (mimetype.as_str(), extension.as_str()) {
        ("image/png", _) | (_, "png") => ("png", "PNG"),
        ("image/jpeg" | "image/jpg", _) | (_, "jpg" | "jpeg") => ("jpg", "JPEG"),
        ("image/gif", _) | (_, "gif") => ("gif", "GIF"),
        ("image/webp", _) | (_, "webp") => ("webp", "WebP"),
        ("application/pdf", _) | (_, "pdf") => ("pdf", "PDF"),
        ("text/csv", _) | (_, "csv") => ("csv", "CSV"),
        ("text/plain", _) | (_, "txt") => ("text", "Plain Text"),
        ("application/json", _) | (_, "json") => ("json", "JSON"),
        ("application/zip", _) | (_, "zip") => ("zip", "Zip"),
        ("audio/mpeg", _) | (_, "mp3") => ("mp3", "MP3"),
        ("audio/ogg", _) | (_, "ogg") => ("ogg", "Ogg Vorbis"),
        ("video/mp4", _) | (_, "mp4") => ("mp4", "MPEG 4 Video"),
        _ => ("binary", "Binary"),
    }
}

/// The bearer token of `Authorization`: `None` without the header, `Some("")` for another
/// scheme or an empty token.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let authorization = header(headers, "authorization").trim();
    if authorization.is_empty() {
        return None;
    }
    Some(match authorization.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim().into(),
        _ => String::new(),
    })
}

/// Which messages of a channel or thread a listing holds: `oldest` / `latest`, both
/// exclusive unless `inclusive`.
struct Window {
    oldest: Option<i64>,
    latest: Option<i64>,
    inclusive: bool,
}

impl Window {
    fn of(params: &Params) -> Result<Self, &'static str> {
        let bound = |name: &str, error| match param(params, name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(ts) => parse_ts(&ts).map(Some).ok_or(error),
        };
        Ok(Self {
            oldest: bound("oldest", "invalid_ts_oldest")?,
            latest: bound("latest", "invalid_ts_latest")?,
            inclusive: matches!(param(params, "inclusive").as_deref(), Some("true" | "1")),
        })
    }

    fn holds(&self, at: i64) -> bool {
        let after = self
            .oldest
            .is_none_or(|o| if self.inclusive { at >= o } else { at > o });
        let before = self
            .latest
            .is_none_or(|l| if self.inclusive { at <= l } else { at < l });
        after && before
    }
}

impl FakeSlack {
    /// The workspace's fake, not yet listening: mount [`Self::router`] where it should answer.
    pub fn new(bot_token: &str, team_id: &str) -> Self {
        Self {
            url: String::new(),
            bot_token: bot_token.into(),
            team_id: team_id.into(),
            bot_user_id: BOT_USER_ID.into(),
            bot_id: BOT_ID.into(),
            app_id: APP_ID.into(),
            failures: Failures::default(),
            history_failures: Failures::default(),
            inner: Arc::new(Inner {
                post_requests: AtomicUsize::new(0),
                history_lookups: AtomicUsize::new(0),
                throttle: Mutex::new((0, 0)),
                last_ts: Mutex::new(0),
                messages: Mutex::default(),
                posted: Mutex::default(),
                files: Mutex::default(),
                uploads: Mutex::default(),
                uploaded: Mutex::default(),
                observer: PostedObserver::default(),
            }),
        }
    }

    /// The workspace's fake on a port of its own.
    pub async fn start(bot_token: &str, team_id: &str) -> Self {
        let mut this = Self::new(bot_token, team_id);
        this.url = serve(this.router()).await;
        this
    }

    /// Slack's routes: `/api/<method>`, an upload's URL (`/upload/<file id>`) and
    /// `/files-pri/<team>-<file id>/[download/]<name>`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/{method}", get(Self::method).post(Self::method))
            .route(
                "/api/files.getUploadURLExternal",
                get(Self::get_upload_url).post(Self::get_upload_url),
            )
            .route(
                "/api/files.completeUploadExternal",
                axum::routing::post(Self::complete_upload),
            )
            .route("/upload/{file_id}", axum::routing::post(Self::upload))
            .route("/files-pri/{*rest}", get(Self::download))
            .with_state(self.clone())
    }

    /// Every message the bot posted that the fake accepted, oldest first.
    pub fn posted(&self) -> Vec<SlackPosted> {
        self.inner.posted.lock().unwrap().clone()
    }

    /// Tell `observer` of every `chat.postMessage` accepted from now on, in ts order (one
    /// observer per fake).
    pub fn observe(&self, observer: Arc<dyn SendObserver>) {
        self.inner.observer.set(observer);
    }

    /// How many `chat.postMessage` requests reached the fake, refused ones included (a
    /// throttled or failed one counts; [`Self::posted`] lists only the accepted).
    pub fn post_requests(&self) -> usize {
        self.inner.post_requests.load(Ordering::SeqCst)
    }

    /// How many `conversations.history` / `conversations.replies` requests reached the fake,
    /// refused ones included.
    pub fn history_lookups(&self) -> usize {
        self.inner.history_lookups.load(Ordering::SeqCst)
    }

    /// Answer the next `n` `chat.postMessage` requests with Slack's 429: `Retry-After:
    /// <retry_after_s>`, body `{"ok":false,"error":"ratelimited"}`.
    pub fn throttle_next(&self, n: usize, retry_after_s: u64) {
        *self.inner.throttle.lock().unwrap() = (n, retry_after_s);
    }

    /// A message a person wrote in `channel` (in the thread of `thread_ts`, when given), so
    /// `conversations.history` / `conversations.replies` list it as Slack would; its ts, later
    /// than every ts the fake handed out before (for the event that tells of it).
    pub fn add_message(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> String {
        let mut messages = self.inner.messages.lock().unwrap();
        let (ts, at) = self.next_ts();
        messages.push(Message {
            channel: channel.into(),
            ts: ts.clone(),
            at,
            thread_ts: thread_ts.map(str::to_string),
            thread_at: thread_ts.and_then(parse_ts),
            text: text.into(),
            user: user.into(),
            from_bot: false,
            blocks: None,
            attachments: None,
            files: None,
        });
        ts
    }

    /// A file a person shared: Slack's file object for a message event ([`dm_file_event`]),
    /// its `url_private` / `url_private_download` under this fake's [`Self::url`] as it is now.
    pub fn add_file(&self, bytes: Vec<u8>, mimetype: &str, name: &str) -> Value {
        let simple = uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .to_ascii_uppercase();
        let id = format!("F0{}", &simple[..9]);
        let key = format!("{}-{id}", self.team_id);
        let encoded = encode_segment(name);
        let (filetype, pretty_type) = filetype_of(mimetype, name);
        let now = Utc::now().timestamp();
        let file = json!({
            "id": id, "created": now, "timestamp": now, "name": name, "title": name,
            "mimetype": mimetype, "filetype": filetype, "pretty_type": pretty_type,
            "editable": false, "size": bytes.len(), "mode": "hosted", "is_external": false,
            "external_type": "", "is_public": false, "public_url_shared": false,
            "display_as_bot": false, "username": "",
            "url_private": format!("{}/files-pri/{key}/{encoded}", self.url),
            "url_private_download": format!("{}/files-pri/{key}/download/{encoded}", self.url),
        });
        self.inner.files.lock().unwrap().insert(
            key,
            StoredFile {
                name: name.into(),
                mimetype: mimetype.into(),
                bytes,
            },
        );
        file
    }

    /// A new ts, later than every one before: now, or a microsecond after the last.
    fn next_ts(&self) -> (String, i64) {
        let mut last = self.inner.last_ts.lock().unwrap();
        let at = Utc::now().timestamp_micros().max(*last + 1);
        *last = at;
        (format_ts(at), at)
    }

    /// The request's parameters (the query string, then a JSON or form body over it), and
    /// whether Slack would warn `missing_charset` (JSON without `charset=utf-8`).
    fn params(
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(Params, bool), &'static str> {
        let mut params = Params::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            params.insert(key.into_owned(), Value::String(value.into_owned()));
        }
        if body.is_empty() {
            return Ok((params, false));
        }
        let content_type = header(headers, "content-type").to_ascii_lowercase();
        if content_type.starts_with("application/json") {
            let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
                return Err("invalid_json");
            };
            // Slack takes the token of a JSON request from its header alone.
            object.remove("token");
            params.extend(object);
            let charset = content_type.replace(' ', "").contains("charset=utf-8");
            return Ok((params, !charset));
        }
        if content_type.is_empty() || content_type.starts_with("application/x-www-form-urlencoded")
        {
            for (key, value) in form_urlencoded::parse(body) {
                params.insert(key.into_owned(), Value::String(value.into_owned()));
            }
            return Ok((params, false));
        }
        Err("invalid_post_type")
    }

    /// Slack's `not_authed` (no token) or `invalid_auth` (another one).
    fn authenticate(&self, headers: &HeaderMap, params: &Params) -> Result<(), &'static str> {
        let token = bearer(headers).unwrap_or_else(|| param(params, "token").unwrap_or_default());
        if token.is_empty() {
            Err("not_authed")
        } else if token != self.bot_token {
            Err("invalid_auth")
        } else {
            Ok(())
        }
    }

    async fn method(
        State(s): State<FakeSlack>,
        Path(method): Path<String>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let post = method == "chat.postMessage";
        let history = matches!(
            method.as_str(),
            "conversations.history" | "conversations.replies"
        );
        if post {
            s.inner.post_requests.fetch_add(1, Ordering::SeqCst);
        }
        if history {
            s.inner.history_lookups.fetch_add(1, Ordering::SeqCst);
        }
        if !post && !history && method != "auth.test" {
            return Json(json!({"ok": false, "error": "unknown_method", "req_method": method}))
                .into_response();
        }
        let (params, warn) = match Self::params(query.as_deref(), &headers, &body) {
            Ok(read) => read,
            Err(error) => return Json(slack_error(error)).into_response(),
        };
        let answer = |mut body: Value| {
            if warn {
                body["warning"] = json!("missing_charset");
                body["response_metadata"]["warnings"] = json!(["missing_charset"]);
            }
            Json(body).into_response()
        };
        if let Err(error) = s.authenticate(&headers, &params) {
            return answer(slack_error(error));
        }
        if let Some(status) = s.failures.take() {
            return failure(status);
        }
        if history && let Some(status) = s.history_failures.take() {
            return failure(status);
        }
        if post {
            let mut throttle = s.inner.throttle.lock().unwrap();
            if throttle.0 > 0 {
                throttle.0 -= 1;
                return rate_limited(throttle.1);
            }
        }
        let user_agent = Some(header(&headers, "user-agent").to_string()).filter(|u| !u.is_empty());
        answer(match method.as_str() {
            "auth.test" => json!({
                "ok": true, "url": WORKSPACE_URL, "team": "Fake", "user": BOT_NAME,
                "team_id": s.team_id, "user_id": s.bot_user_id, "bot_id": s.bot_id,
                "is_enterprise_install": false,
            }),
            "chat.postMessage" => s.post_message(&params, user_agent),
            "conversations.history" => s.history(&params),
            _ => s.replies(&params),
        })
    }

    /// `chat.postMessage`: checked as Slack checks it, recorded, and answered with the message.
    fn post_message(&self, params: &Params, user_agent: Option<String>) -> Value {
        let requested = param(params, "channel").unwrap_or_default();
        let Some(channel) = channel_of(&requested) else {
            return slack_error("channel_not_found");
        };
        let Ok(blocks) = structured(params, "blocks") else {
            return slack_error("invalid_blocks");
        };
        let Ok(attachments) = structured(params, "attachments") else {
            return slack_error("invalid_attachments");
        };
        let text = param(params, "text").unwrap_or_default();
        if text.trim().is_empty() && blocks.is_none() && attachments.is_none() {
            return slack_error("no_text");
        }
        if text.chars().count() > MAX_TEXT {
            return slack_error("msg_too_long");
        }
        let thread_ts = param(params, "thread_ts").filter(|t| !t.trim().is_empty());
        let created = Utc::now();
        // Held until it is recorded, so messages and what was posted stay in ts order.
        let mut messages = self.inner.messages.lock().unwrap();
        let (ts, at) = self.next_ts();
        messages.push(Message {
            channel: channel.clone(),
            ts: ts.clone(),
            at,
            thread_at: thread_ts.as_deref().and_then(parse_ts),
            thread_ts: thread_ts.clone(),
            text: text.clone(),
            user: self.bot_user_id.clone(),
            from_bot: true,
            blocks,
            attachments,
            files: None,
        });
        let message = messages
            .last()
            .map(|m| self.message_json(&messages, m, false))
            .unwrap_or_default();
        self.inner.observer.tell(SentMessage {
            platform: Platform::Slack,
            sid: ts.clone(),
            to: match &thread_ts {
                Some(thread) => format!("{channel}:{thread}"),
                None => channel.clone(),
            },
            body: text.clone(),
            created,
            user_agent: user_agent.clone(),
        });
        self.inner.posted.lock().unwrap().push(SlackPosted {
            channel: channel.clone(),
            requested_channel: requested,
            ts: ts.clone(),
            thread_ts,
            text,
            created,
            user_agent,
        });
        json!({"ok": true, "channel": channel, "ts": ts, "message": message})
    }

    /// A message in Slack's shape; with `thread`, a thread's root carries its replies' count.
    fn message_json(&self, messages: &[Message], m: &Message, thread: bool) -> Value {
        let mut v = json!({
            "type": "message", "text": m.text, "user": m.user, "ts": m.ts, "team": self.team_id,
        });
        if m.from_bot {
            v["bot_id"] = json!(self.bot_id);
            v["app_id"] = json!(self.app_id);
            v["bot_profile"] = json!({"id": self.bot_id, "app_id": self.app_id,
                "name": BOT_NAME, "deleted": false, "team_id": self.team_id});
        }
        if let Some(blocks) = &m.blocks {
            v["blocks"] = blocks.clone();
        }
        if let Some(attachments) = &m.attachments {
            v["attachments"] = attachments.clone();
        }
        if let Some(files) = &m.files {
            v["files"] = files.clone();
        }
        if let Some(thread_ts) = &m.thread_ts {
            v["thread_ts"] = json!(thread_ts);
            let root = messages
                .iter()
                .find(|r| r.channel == m.channel && Some(r.at) == m.thread_at && r.at != m.at);
            if let Some(root) = root {
                v["parent_user_id"] = json!(root.user);
            }
        }
        if thread {
            let replies: Vec<&Message> = messages
                .iter()
                .filter(|r| r.channel == m.channel && r.replies_to(m.at))
                .collect();
            if let Some(latest) = replies.iter().max_by_key(|r| r.at) {
                let mut users: Vec<&str> = Vec::new();
                for r in &replies {
                    if !users.contains(&r.user.as_str()) {
                        users.push(&r.user);
                    }
                }
                v["thread_ts"] = json!(m.ts);
                v["reply_count"] = json!(replies.len());
                v["reply_users_count"] = json!(users.len());
                v["reply_users"] = json!(users);
                v["latest_reply"] = json!(latest.ts);
            }
        }
        v
    }

    /// `limit`: 100 when absent (or 0), at most 1000.
    fn limit(params: &Params) -> Result<usize, &'static str> {
        match param(params, "limit").filter(|l| !l.trim().is_empty()) {
            None => Ok(DEFAULT_LIMIT),
            Some(l) => match l.trim().parse::<usize>() {
                Ok(0) => Ok(DEFAULT_LIMIT),
                Ok(n) => Ok(n.min(MAX_LIMIT)),
                Err(_) => Err("invalid_limit"),
            },
        }
    }

    /// One page of `listed` (in the listing's order: newest first or oldest first) from the
    /// cursor's message on, with `has_more` and the next page's cursor.
    fn page(
        &self,
        messages: &[Message],
        listed: Vec<&Message>,
        params: &Params,
        newest_first: bool,
    ) -> Value {
        let limit = match Self::limit(params) {
            Ok(limit) => limit,
            Err(error) => return slack_error(error),
        };
        let from = match param(params, "cursor").filter(|c| !c.trim().is_empty()) {
            None => None,
            Some(cursor) => match at_of_cursor(&cursor) {
                Some(at) => Some(at),
                None => return slack_error("invalid_cursor"),
            },
        };
        let mut rest = listed.into_iter().filter(|m| match from {
            None => true,
            Some(from) if newest_first => m.at <= from,
            Some(from) => m.at >= from,
        });
        let page: Vec<Value> = rest
            .by_ref()
            .take(limit)
            .map(|m| self.message_json(messages, m, true))
            .collect();
        let next = rest.next();
        json!({
            "ok": true, "messages": page, "has_more": next.is_some(),
            "response_metadata": {"next_cursor": next.map(|m| cursor_of(m.at)).unwrap_or_default()},
        })
    }

    /// `conversations.history`: a channel's top-level messages, newest first.
    fn history(&self, params: &Params) -> Value {
        let channel = param(params, "channel").unwrap_or_default();
        if !is_id(&channel, false) {
            return slack_error("channel_not_found");
        }
        let window = match Window::of(params) {
            Ok(window) => window,
            Err(error) => return slack_error(error),
        };
        let messages = self.inner.messages.lock().unwrap();
        let mut listed: Vec<&Message> = messages
            .iter()
            .filter(|m| m.channel == channel && m.top_level() && window.holds(m.at))
            .collect();
        listed.sort_by_key(|m| std::cmp::Reverse(m.at));
        self.page(&messages, listed, params, true)
    }

    /// `conversations.replies`: a thread, its root first (always, as Slack sends it, when the
    /// fake has it), then its replies oldest first. A thread the fake holds nothing of lists
    /// no messages (Slack would list the root it knows and the fake does not).
    fn replies(&self, params: &Params) -> Value {
        let channel = param(params, "channel").unwrap_or_default();
        if !is_id(&channel, false) {
            return slack_error("channel_not_found");
        }
        let Some(ts) = param(params, "ts").filter(|t| !t.trim().is_empty()) else {
            return slack_error("invalid_arguments");
        };
        let Some(root) = parse_ts(&ts) else {
            return slack_error("thread_not_found");
        };
        let window = match Window::of(params) {
            Ok(window) => window,
            Err(error) => return slack_error(error),
        };
        let messages = self.inner.messages.lock().unwrap();
        let mut listed: Vec<&Message> = messages
            .iter()
            .filter(|m| {
                m.channel == channel && (m.at == root || (m.replies_to(root) && window.holds(m.at)))
            })
            .collect();
        listed.sort_by_key(|m| m.at);
        self.page(&messages, listed, params, false)
    }

    /// `/files-pri/<team>-<id>/<name>` (and `…/download/<name>`): a file's bytes with its type,
    /// to the bot's token alone; anyone else is redirected to the login page, as by Slack.
    async fn download(
        State(s): State<FakeSlack>,
        Path(rest): Path<String>,
        headers: HeaderMap,
    ) -> Response {
        if bearer(&headers).as_deref() != Some(s.bot_token.as_str()) {
            let path: String = format!("/files-pri/{rest}");
            let location = format!("{WORKSPACE_URL}?redir={}", encode_segment(&path));
            let location = HeaderValue::from_str(&location)
                .unwrap_or_else(|_| HeaderValue::from_static(WORKSPACE_URL));
            return (StatusCode::FOUND, [(names::LOCATION, location)]).into_response();
        }
        let Some((key, tail)) = rest.split_once('/') else {
            return StatusCode::NOT_FOUND.into_response();
        };
        let (attachment, name) = match tail.strip_prefix("download/") {
            Some(name) => (true, name),
            None => (false, tail),
        };
        let files = s.inner.files.lock().unwrap();
        let Some(file) = files.get(key).filter(|f| f.name == name) else {
            return StatusCode::NOT_FOUND.into_response();
        };
        let content_type = HeaderValue::from_str(&file.mimetype)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
        let mut response =
            ([(names::CONTENT_TYPE, content_type)], file.bytes.clone()).into_response();
        if attachment {
            let disposition = format!("attachment; filename=\"{}\"", encode_segment(&file.name));
            if let Ok(value) = HeaderValue::from_str(&disposition) {
                response
                    .headers_mut()
                    .insert(names::CONTENT_DISPOSITION, value);
            }
        }
        response
    }
}

/// A new file id, as Slack writes them (`F0` and nine more).
fn new_file_id() -> String {
    let simple = uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .to_ascii_uppercase();
    format!("F0{}", &simple[..9])
}

/// Uploads (<https://api.slack.com/messaging/files#uploading_files>):
/// `files.getUploadURLExternal` announces a file and answers where its bytes go (on this fake),
/// the bytes are posted there, and `files.completeUploadExternal` shares the file in a
/// conversation, as a message of the bot's carrying it.
impl FakeSlack {
    /// Every file the bot uploaded and shared in a conversation, oldest first.
    pub fn uploaded_files(&self) -> Vec<SlackUploaded> {
        self.inner.uploaded.lock().unwrap().clone()
    }

    /// What a Web API method checks first (the body's encoding, the token, a failure asked
    /// for): the parameters and whether Slack would warn `missing_charset`, else the answer.
    fn checked(
        &self,
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(Params, bool), Box<Response>> {
        let refused = |error| Box::new(Json(slack_error(error)).into_response());
        let (params, warn) = Self::params(query, headers, body).map_err(refused)?;
        self.authenticate(headers, &params).map_err(refused)?;
        if let Some(status) = self.failures.take() {
            return Err(Box::new(failure(status)));
        }
        Ok((params, warn))
    }

    /// `body` as Slack answers it, with its `missing_charset` warning if `warn`.
    fn answered(mut body: Value, warn: bool) -> Response {
        if warn {
            body["warning"] = json!("missing_charset");
            body["response_metadata"]["warnings"] = json!(["missing_charset"]);
        }
        Json(body).into_response()
    }

    /// Where this fake answers: the `url` set before [`Self::router`], else this request's
    /// host and the point the router is mounted at.
    fn base_of(
        &self,
        original: &axum::http::Uri,
        uri: &axum::http::Uri,
        headers: &HeaderMap,
    ) -> String {
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

    /// `files.getUploadURLExternal`: a new file id for `filename` of `length` bytes, and the
    /// URL its bytes go to.
    async fn get_upload_url(
        State(s): State<FakeSlack>,
        axum::extract::OriginalUri(original): axum::extract::OriginalUri,
        uri: axum::http::Uri,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let (params, warn) = match s.checked(query.as_deref(), &headers, &body) {
            Ok(checked) => checked,
            Err(answer) => return *answer,
        };
        let Some(name) = param(&params, "filename").filter(|n| !n.trim().is_empty()) else {
            return Self::answered(slack_error("invalid_arguments"), warn);
        };
        let length = match param(&params, "length").map(|l| l.trim().parse::<usize>()) {
            // Slack's own word for a length of 0.
            Some(Ok(0)) => return Self::answered(slack_error("missing_argument"), warn),
            Some(Ok(length)) => length,
            _ => return Self::answered(slack_error("invalid_arguments"), warn),
        };
        let id = new_file_id();
        s.inner.uploads.lock().unwrap().insert(
            id.clone(),
            PendingUpload {
                name,
                length,
                bytes: None,
            },
        );
        let base = s.base_of(&original, &uri, &headers);
        Self::answered(
            json!({"ok": true, "upload_url": format!("{base}/upload/{id}"), "file_id": id}),
            warn,
        )
    }

    /// `POST /upload/<file id>`: the file's bytes, raw or as the file of a
    /// `multipart/form-data` body; `200 OK - <length>` when they are as long as announced.
    async fn upload(
        State(s): State<FakeSlack>,
        Path(id): Path<String>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let content_type = header(&headers, "content-type").to_ascii_lowercase();
        let bytes = if content_type.starts_with("multipart/form-data") {
            match Self::file_part(&headers, body).await {
                Some(bytes) => bytes,
                None => {
                    return (StatusCode::BAD_REQUEST, "no file in the multipart body")
                        .into_response();
                }
            }
        } else {
            body.to_vec()
        };
        let mut uploads = s.inner.uploads.lock().unwrap();
        let Some(pending) = uploads.get_mut(&id) else {
            return (StatusCode::NOT_FOUND, "no such upload").into_response();
        };
        if bytes.len() != pending.length {
            let why = format!("{} bytes announced, {} sent", pending.length, bytes.len());
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
        let answer = format!("OK - {}", bytes.len());
        pending.bytes = Some(bytes);
        (StatusCode::OK, answer).into_response()
    }

    /// The bytes of a `multipart/form-data` body's file (its first field with a file name).
    async fn file_part(headers: &HeaderMap, body: Bytes) -> Option<Vec<u8>> {
        let boundary = multer::parse_boundary(header(headers, "content-type")).ok()?;
        let stream = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
        let mut form = multer::Multipart::new(stream, boundary);
        while let Some(field) = form.next_field().await.ok()? {
            if field.file_name().is_some() {
                return Some(field.bytes().await.ok()?.to_vec());
            }
        }
        None
    }

    /// `files.completeUploadExternal`.
    async fn complete_upload(
        State(s): State<FakeSlack>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        match s.checked(query.as_deref(), &headers, &body) {
            Ok((params, warn)) => Self::answered(s.share(&params), warn),
            Err(answer) => *answer,
        }
    }

    /// The uploaded `files` (`[{"id", "title"}]`, JSON or JSON text) shared in `channel_id`
    /// (or each of `channels`, which may name users), in the thread of `thread_ts`, by a
    /// message of the bot's whose text is `initial_comment`. Without a conversation they stay
    /// private (and are not listed by [`Self::uploaded_files`]). A file is shared once.
    fn share(&self, params: &Params) -> Value {
        let listed = match params.get("files") {
            Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok(),
            other => other.cloned(),
        };
        let listed = match listed {
            Some(Value::Array(listed)) if !listed.is_empty() => listed,
            _ => return slack_error("invalid_arguments"),
        };
        let mut channels = Vec::new();
        if let Some(id) = param(params, "channel_id").filter(|c| !c.trim().is_empty()) {
            if !is_id(&id, false) {
                return slack_error("invalid_channel");
            }
            channels.push(id);
        }
        if let Some(list) = param(params, "channels").filter(|c| !c.trim().is_empty()) {
            for id in list.split(',') {
                let Some(channel) = channel_of(id.trim()) else {
                    return slack_error("invalid_channel");
                };
                channels.push(channel);
            }
        }
        let thread_ts = param(params, "thread_ts").filter(|t| !t.trim().is_empty());
        if thread_ts.is_some() && channels.len() > 1 {
            // A thread is in one conversation.
            return slack_error("invalid_arguments");
        }
        let comment = param(params, "initial_comment").unwrap_or_default();
        // (id, name, title, bytes) of each file, all uploaded.
        let mut files = Vec::new();
        let mut uploads = self.inner.uploads.lock().unwrap();
        for file in &listed {
            let Some(id) = file["id"].as_str() else {
                return slack_error("invalid_arguments");
            };
            let Some(PendingUpload {
                name,
                bytes: Some(bytes),
                ..
            }) = uploads.get(id)
            else {
                return slack_error("file_not_found");
            };
            let title = file["title"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
                .unwrap_or(name);
            files.push((
                id.to_string(),
                name.clone(),
                title.to_string(),
                bytes.clone(),
            ));
        }
        for (id, ..) in &files {
            uploads.remove(id);
        }
        drop(uploads);
        let created = Utc::now();
        let objects: Vec<Value> = files
            .iter()
            .map(|(id, name, title, bytes)| {
                let (filetype, pretty_type) = filetype_of("", name);
                json!({
                    "id": id, "created": created.timestamp(), "timestamp": created.timestamp(),
                    "name": name, "title": title, "filetype": filetype,
                    "pretty_type": pretty_type, "user": self.bot_user_id, "size": bytes.len(),
                    "mode": "hosted", "is_external": false, "is_public": false,
                    "display_as_bot": false,
                })
            })
            .collect();
        // Held until recorded, so messages and what was uploaded stay in ts order.
        let mut messages = self.inner.messages.lock().unwrap();
        let mut uploaded = self.inner.uploaded.lock().unwrap();
        for channel in channels {
            let (ts, at) = self.next_ts();
            messages.push(Message {
                channel: channel.clone(),
                ts: ts.clone(),
                at,
                thread_ts: thread_ts.clone(),
                thread_at: thread_ts.as_deref().and_then(parse_ts),
                text: comment.clone(),
                user: self.bot_user_id.clone(),
                from_bot: true,
                blocks: None,
                attachments: None,
                files: Some(Value::Array(objects.clone())),
            });
            for (id, name, title, bytes) in &files {
                uploaded.push(SlackUploaded {
                    id: id.clone(),
                    name: name.clone(),
                    title: title.clone(),
                    bytes: bytes.clone(),
                    channel: channel.clone(),
                    thread_ts: thread_ts.clone(),
                    comment: comment.clone(),
                    ts: ts.clone(),
                    created,
                });
            }
        }
        let shared: Vec<Value> = files
            .iter()
            .map(|(id, _, title, _)| json!({"id": id, "title": title}))
            .collect();
        json!({"ok": true, "files": shared})
    }
}

/// `X-Slack-Signature` for `body` sent at `timestamp` (unix seconds) with the app's signing
/// secret: `v0=` and the lowercase hex HMAC-SHA256 of `v0:<timestamp>:<body>`.
pub fn sign(signing_secret: &str, timestamp: i64, body: &[u8]) -> String {
    let message = [format!("v0:{timestamp}:").as_bytes(), body].concat();
    let hex: String = hmac_sha256(signing_secret.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("v0={hex}")
}

/// What Slack POSTs to check a request URL (the app answers the `challenge`).
pub fn url_verification(challenge: &str) -> Value {
    json!({"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"})
}

/// The unix seconds of a ts (now when it is not one).
fn seconds_of(ts: &str) -> i64 {
    parse_ts(ts)
        .map(|at| at / 1_000_000)
        .unwrap_or_else(|| Utc::now().timestamp())
}

/// A short block id, as Slack makes up.
fn block_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..5].to_string()
}

/// The `rich_text` block Slack adds to a message a person typed: its text, with `<@U…>`
/// mentions as `user` elements.
fn rich_text(text: &str) -> Value {
    let mut elements = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<@") {
        let Some(len) = rest[start..].find('>') else {
            break;
        };
        if start > 0 {
            elements.push(json!({"type": "text", "text": &rest[..start]}));
        }
        let user = &rest[start + 2..start + len];
        elements.push(json!({"type": "user", "user_id": user.split('|').next().unwrap_or(user)}));
        rest = &rest[start + len + 1..];
    }
    if !rest.is_empty() {
        elements.push(json!({"type": "text", "text": rest}));
    }
    json!([{"type": "rich_text", "block_id": block_id(),
        "elements": [{"type": "rich_text_section", "elements": elements}]}])
}

/// The `event_callback` envelope around `event`, for the app installed in `team`.
fn envelope(team: &str, event_id: &str, event: Value) -> Value {
    let event_time = seconds_of(event["event_ts"].as_str().unwrap_or(""));
    let context = json!({"et": event["type"], "tid": team, "aid": APP_ID, "cid": event["channel"]});
    json!({
        "token": VERIFICATION_TOKEN, "team_id": team, "context_team_id": team,
        "context_enterprise_id": null, "api_app_id": APP_ID, "event": event,
        "type": "event_callback", "event_id": event_id, "event_time": event_time,
        "authorizations": [{"enterprise_id": null, "team_id": team, "user_id": BOT_USER_ID,
            "is_bot": true, "is_enterprise_install": false}],
        "is_ext_shared_channel": false,
        "event_context": format!("4-{}", BASE64.encode(context.to_string())),
    })
}

/// A person's direct message to the app (`message.im`): `user` wrote `text` in their DM
/// `dm_channel` (`D…`) at `ts`.
pub fn dm_event(
    team: &str,
    event_id: &str,
    user: &str,
    dm_channel: &str,
    text: &str,
    ts: &str,
) -> Value {
    envelope(
        team,
        event_id,
        json!({
            "type": "message", "channel": dm_channel, "user": user, "text": text, "ts": ts,
            "event_ts": ts, "channel_type": "im", "team": team,
            "client_msg_id": uuid::Uuid::new_v4().to_string(), "blocks": rich_text(text),
        }),
    )
}

/// A person mentioning the bot in a channel (`app_mention`): the text starts with
/// `<@U0BOT0001> ` (added unless `text` already does), in the thread of `thread_ts` if given.
pub fn mention_event(
    team: &str,
    event_id: &str,
    user: &str,
    channel: &str,
    text: &str,
    ts: &str,
    thread_ts: Option<&str>,
) -> Value {
    let mention = format!("<@{BOT_USER_ID}>");
    let text = if text.starts_with(&mention) {
        text.to_string()
    } else {
        format!("{mention} {text}")
    };
    let mut event = json!({
        "type": "app_mention", "user": user, "text": text, "ts": ts, "channel": channel,
        "event_ts": ts, "team": team, "client_msg_id": uuid::Uuid::new_v4().to_string(),
        "blocks": rich_text(&text),
    });
    if let Some(thread_ts) = thread_ts {
        event["thread_ts"] = json!(thread_ts);
    }
    envelope(team, event_id, event)
}

/// A message from another bot (or an integration) in a DM: `subtype: bot_message`, a
/// `bot_id` and no `user`.
pub fn bot_message_event(
    team: &str,
    event_id: &str,
    bot_id: &str,
    dm_channel: &str,
    text: &str,
    ts: &str,
) -> Value {
    envelope(
        team,
        event_id,
        json!({
            "type": "message", "subtype": "bot_message", "text": text, "ts": ts,
            "username": "Other bot", "bot_id": bot_id, "channel": dm_channel, "event_ts": ts,
            "channel_type": "im",
        }),
    )
}

/// A person editing their DM message of `ts` from `previous_text` to `text`
/// (`subtype: message_changed`); the event's own ts is now (later than `ts`).
pub fn edited_event(
    team: &str,
    event_id: &str,
    user: &str,
    dm_channel: &str,
    ts: &str,
    previous_text: &str,
    text: &str,
) -> Value {
    let now = Utc::now().timestamp_micros();
    let edit_ts = format_ts(parse_ts(ts).map_or(now, |at| now.max(at + 1)));
    let client_msg_id = uuid::Uuid::new_v4().to_string();
    envelope(
        team,
        event_id,
        json!({
            "type": "message", "subtype": "message_changed",
            "message": {
                "type": "message", "user": user, "text": text, "ts": ts, "team": team,
                "client_msg_id": client_msg_id, "blocks": rich_text(text),
                "edited": {"user": user, "ts": edit_ts},
                "source_team": team, "user_team": team,
            },
            "previous_message": {
                "type": "message", "user": user, "text": previous_text, "ts": ts, "team": team,
                "client_msg_id": client_msg_id, "blocks": rich_text(previous_text),
            },
            "channel": dm_channel, "hidden": true, "ts": edit_ts, "event_ts": edit_ts,
            "channel_type": "im",
        }),
    )
}

/// A person sharing a file in their DM (`subtype: file_share`), `file` from
/// [`FakeSlack::add_file`], with `text` as its message (may be empty).
pub fn dm_file_event(
    team: &str,
    event_id: &str,
    user: &str,
    dm_channel: &str,
    text: &str,
    ts: &str,
    file: Value,
) -> Value {
    let mut event = json!({
        "type": "message", "subtype": "file_share", "text": text, "files": [file],
        "upload": false, "user": user, "display_as_bot": false, "ts": ts,
        "channel": dm_channel, "event_ts": ts, "channel_type": "im", "team": team,
    });
    if !text.is_empty() {
        event["blocks"] = rich_text(text);
    }
    envelope(team, event_id, event)
}

#[cfg(test)]
mod tests {
    //! Driven over real HTTP with the crate's test client ([`crate::test_client`]).
    use super::*;
    use crate::test_client::{Answer, form, http};

    const TOKEN: &str = "xoxb-1111-2222-fakeTokenForTests";
    const TEAM: &str = "T0TEAM001";
    const JSON: &str = "application/json; charset=utf-8";

    /// A Web API call with the bot's token, by JSON.
    async fn call(base: &str, method: &str, body: Value) -> Answer {
        let auth = format!("Bearer {TOKEN}");
        http(
            base,
            "POST",
            &format!("/api/{method}"),
            &[("Content-Type", JSON), ("Authorization", &auth)],
            body.to_string().as_bytes(),
        )
        .await
    }

    fn texts(v: &Value) -> Vec<&str> {
        v["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["text"].as_str().expect("a text"))
            .collect()
    }

    #[tokio::test]
    async fn slack_auth_test_answers_the_bot_and_refuses_with_http_200() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let a = call(&slack.url, "auth.test", json!({})).await;
        assert_eq!(a.status, 200);
        assert_eq!(
            a.json(),
            json!({"ok": true, "url": "https://fake.slack.com/", "team": "Fake",
                "user": "switchboard", "team_id": TEAM, "user_id": "U0BOT0001",
                "bot_id": "B0BOT0001", "is_enterprise_install": false})
        );

        let a = http(&slack.url, "POST", "/api/auth.test", &[], b"").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json(), json!({"ok": false, "error": "not_authed"}));
        let a = http(
            &slack.url,
            "GET",
            "/api/auth.test",
            &[("Authorization", "Bearer xoxb-wrong")],
            b"",
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json(), json!({"ok": false, "error": "invalid_auth"}));

        // A form or a query may carry the token instead of the header.
        let body = form(&[("token", TOKEN)]);
        let a = http(
            &slack.url,
            "POST",
            "/api/auth.test",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        )
        .await;
        assert_eq!(a.json()["ok"], true);
        let a = http(
            &slack.url,
            "GET",
            &format!("/api/auth.test?{}", form(&[("token", "nope")])),
            &[],
            b"",
        )
        .await;
        assert_eq!(a.json()["error"], "invalid_auth");
        // JSON without its charset is taken, with Slack's warning.
        let auth = format!("Bearer {TOKEN}");
        let a = http(
            &slack.url,
            "POST",
            "/api/auth.test",
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            b"{}",
        )
        .await;
        assert_eq!(a.json()["ok"], true);
        assert_eq!(a.json()["warning"], "missing_charset");
        let a = call(&slack.url, "chat.postPigeon", json!({})).await;
        assert_eq!(
            a.json(),
            json!({"ok": false, "error": "unknown_method", "req_method": "chat.postPigeon"})
        );
    }

    #[tokio::test]
    async fn slack_post_message_to_a_user_answers_their_dm_and_is_recorded() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "U0PERSON1", "text": "hello"}),
        )
        .await;
        assert_eq!(a.status, 200);
        let v = a.json();
        assert_eq!(v["ok"], true);
        assert_eq!(v["channel"], "D0PERSON1");
        let ts = v["ts"].as_str().expect("a ts").to_string();
        let (seconds, micros) = ts.split_once('.').expect("seconds.micros");
        assert!(seconds.parse::<i64>().is_ok());
        assert_eq!(micros.len(), 6);
        assert_eq!(v["message"]["type"], "message");
        assert_eq!(v["message"]["text"], "hello");
        assert_eq!(v["message"]["user"], "U0BOT0001");
        assert_eq!(v["message"]["bot_id"], "B0BOT0001");
        assert_eq!(v["message"]["app_id"], "A0APP0001");
        assert_eq!(v["message"]["ts"], ts.as_str());
        assert!(v["message"].get("subtype").is_none());
        assert!(v["message"].get("thread_ts").is_none());

        let body = form(&[
            ("channel", "C0CHANNEL1"),
            ("text", "in a thread & more"),
            ("thread_ts", &ts),
        ]);
        let auth = format!("Bearer {TOKEN}");
        let a = http(
            &slack.url,
            "POST",
            "/api/chat.postMessage",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Authorization", &auth),
            ],
            body.as_bytes(),
        )
        .await;
        let v = a.json();
        assert_eq!(v["channel"], "C0CHANNEL1");
        assert_eq!(v["message"]["thread_ts"], ts.as_str());
        let second = v["ts"].as_str().expect("a ts").to_string();
        assert!(parse_ts(&second) > parse_ts(&ts), "{second} after {ts}");

        let posted = slack.posted();
        assert_eq!(posted.len(), 2);
        assert_eq!(posted[0].channel, "D0PERSON1");
        assert_eq!(posted[0].requested_channel, "U0PERSON1");
        assert_eq!(posted[0].ts, ts);
        assert_eq!(posted[0].thread_ts, None);
        assert_eq!(posted[0].text, "hello");
        assert_eq!(posted[0].user_agent.as_deref(), Some("switchboard-test/1"));
        assert_eq!(posted[1].thread_ts.as_deref(), Some(ts.as_str()));
        assert_eq!(posted[1].text, "in a thread & more");
        assert_eq!(slack.post_requests(), 2);
    }

    #[tokio::test]
    async fn slack_refuses_an_unknown_channel_a_missing_text_and_a_long_one() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "nonsense", "text": "x"}),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json(), json!({"ok": false, "error": "channel_not_found"}));
        let a = call(&slack.url, "chat.postMessage", json!({"text": "x"})).await;
        assert_eq!(a.json()["error"], "channel_not_found");
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "D0PERSON1", "text": ""}),
        )
        .await;
        assert_eq!(a.json(), json!({"ok": false, "error": "no_text"}));
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "D0PERSON1", "text": "x".repeat(40_001)}),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json(), json!({"ok": false, "error": "msg_too_long"}));
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "D0PERSON1", "text": "é".repeat(40_000)}),
        )
        .await;
        assert_eq!(a.json()["ok"], true);
        let blocks = json!([{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}]);
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "C0CHANNEL1", "blocks": blocks}),
        )
        .await;
        assert_eq!(a.json()["ok"], true);
        assert_eq!(a.json()["message"]["blocks"], blocks);
        let a = http(
            &slack.url,
            "POST",
            "/api/chat.postMessage",
            &[("Content-Type", JSON), ("Authorization", "Bearer x")],
            b"{",
        )
        .await;
        assert_eq!(a.json()["error"], "invalid_json");
        assert_eq!(slack.posted().len(), 2);
        assert_eq!(slack.post_requests(), 7);
    }

    #[tokio::test]
    async fn slack_throttles_with_retry_after_then_takes_the_next() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        slack.throttle_next(1, 7);
        let hi = json!({"channel": "D0PERSON1", "text": "hi"});
        let a = call(&slack.url, "chat.postMessage", hi.clone()).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("7"));
        assert_eq!(a.json(), json!({"ok": false, "error": "ratelimited"}));
        assert!(slack.posted().is_empty());
        let a = call(&slack.url, "auth.test", json!({})).await;
        assert_eq!(a.status, 200, "throttling is chat.postMessage's alone");
        let a = call(&slack.url, "chat.postMessage", hi.clone()).await;
        assert_eq!(a.status, 200);
        assert_eq!(slack.posted().len(), 1);
        assert_eq!(slack.post_requests(), 2);

        slack.failures.fail_next(1, 429);
        let a = call(&slack.url, "auth.test", json!({})).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("1"));
        assert_eq!(a.json()["error"], "ratelimited");
        slack.failures.fail_next(1, 503);
        let a = call(&slack.url, "chat.postMessage", hi).await;
        assert_eq!(a.status, 503);
        assert_eq!(a.json()["ok"], false);
        assert_eq!(slack.post_requests(), 3);
        assert_eq!(slack.posted().len(), 1);
    }

    #[tokio::test]
    async fn slack_history_lists_newest_first_after_oldest_and_pages_by_cursor() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let mut ts = Vec::new();
        for text in ["one", "two", "three"] {
            let a = call(
                &slack.url,
                "chat.postMessage",
                json!({"channel": "D0PERSON1", "text": text}),
            )
            .await;
            ts.push(a.json()["ts"].as_str().expect("a ts").to_string());
        }
        // A reply is not top-level, and another channel is not this one.
        call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "D0PERSON1", "text": "reply", "thread_ts": ts[0]}),
        )
        .await;
        call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "C0OTHER01", "text": "elsewhere"}),
        )
        .await;

        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1", "limit": 2}),
        )
        .await;
        let v = a.json();
        assert_eq!(v["ok"], true);
        assert_eq!(texts(&v), ["three", "two"]);
        assert_eq!(v["has_more"], true);
        assert_eq!(v["messages"][0]["ts"], ts[2].as_str());
        assert_eq!(v["messages"][0]["user"], "U0BOT0001");
        assert_eq!(v["messages"][0]["bot_id"], "B0BOT0001");
        let cursor = v["response_metadata"]["next_cursor"]
            .as_str()
            .expect("a cursor")
            .to_string();
        assert!(!cursor.is_empty());
        let query = form(&[
            ("channel", "D0PERSON1"),
            ("limit", "2"),
            ("cursor", &cursor),
        ]);
        let auth = format!("Bearer {TOKEN}");
        let a = http(
            &slack.url,
            "GET",
            &format!("/api/conversations.history?{query}"),
            &[("Authorization", &auth)],
            b"",
        )
        .await;
        let v = a.json();
        assert_eq!(texts(&v), ["one"]);
        assert_eq!(v["has_more"], false);
        assert_eq!(v["response_metadata"]["next_cursor"], "");
        assert_eq!(v["messages"][0]["reply_count"], 1);
        assert_eq!(v["messages"][0]["thread_ts"], ts[0].as_str());

        // `oldest` is exclusive, unless `inclusive`.
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1", "oldest": ts[0]}),
        )
        .await;
        assert_eq!(texts(&a.json()), ["three", "two"]);
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1", "oldest": ts[0], "inclusive": true}),
        )
        .await;
        assert_eq!(texts(&a.json()), ["three", "two", "one"]);
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1", "oldest": ts[1], "latest": ts[2]}),
        )
        .await;
        assert_eq!(texts(&a.json()), Vec::<&str>::new());

        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "nonsense"}),
        )
        .await;
        assert_eq!(a.json(), json!({"ok": false, "error": "channel_not_found"}));
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1", "cursor": "!!"}),
        )
        .await;
        assert_eq!(a.json()["error"], "invalid_cursor");
        slack.history_failures.fail_next(1, 500);
        let a = call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "D0PERSON1", "text": "x"}),
        )
        .await;
        assert_eq!(a.status, 200, "history_failures are history's alone");
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "D0PERSON1"}),
        )
        .await;
        assert_eq!(a.status, 500);
        assert_eq!(slack.history_lookups(), 8);
    }

    #[tokio::test]
    async fn slack_replies_list_a_thread_root_first_then_oldest_first() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let root = slack.add_message("C0CHANNEL1", "U0PERSON1", "question?", None);
        let mut replies = Vec::new();
        for text in ["first", "second", "third"] {
            let a = call(
                &slack.url,
                "chat.postMessage",
                json!({"channel": "C0CHANNEL1", "text": text, "thread_ts": root}),
            )
            .await;
            assert_eq!(a.json()["message"]["parent_user_id"], "U0PERSON1");
            replies.push(a.json()["ts"].as_str().expect("a ts").to_string());
        }
        call(
            &slack.url,
            "chat.postMessage",
            json!({"channel": "C0CHANNEL1", "text": "top level"}),
        )
        .await;

        let a = call(
            &slack.url,
            "conversations.replies",
            json!({"channel": "C0CHANNEL1", "ts": root}),
        )
        .await;
        let v = a.json();
        assert_eq!(v["ok"], true);
        assert_eq!(texts(&v), ["question?", "first", "second", "third"]);
        assert_eq!(v["messages"][0]["user"], "U0PERSON1");
        assert_eq!(v["messages"][0]["reply_count"], 3);
        assert_eq!(v["messages"][0]["latest_reply"], replies[2].as_str());
        assert_eq!(v["messages"][1]["thread_ts"], root.as_str());
        assert_eq!(v["has_more"], false);

        let a = call(
            &slack.url,
            "conversations.replies",
            json!({"channel": "C0CHANNEL1", "ts": root, "limit": 2}),
        )
        .await;
        let v = a.json();
        assert_eq!(texts(&v), ["question?", "first"]);
        assert_eq!(v["has_more"], true);
        let cursor = v["response_metadata"]["next_cursor"].clone();
        let a = call(
            &slack.url,
            "conversations.replies",
            json!({"channel": "C0CHANNEL1", "ts": root, "limit": 2, "cursor": cursor}),
        )
        .await;
        assert_eq!(texts(&a.json()), ["second", "third"]);
        assert_eq!(a.json()["has_more"], false);

        // The root comes whatever `oldest` says, as from Slack.
        let a = call(
            &slack.url,
            "conversations.replies",
            json!({"channel": "C0CHANNEL1", "ts": root, "oldest": replies[1]}),
        )
        .await;
        assert_eq!(texts(&a.json()), ["question?", "third"]);
        // The thread's replies are not in the channel's history.
        let a = call(
            &slack.url,
            "conversations.history",
            json!({"channel": "C0CHANNEL1"}),
        )
        .await;
        assert_eq!(texts(&a.json()), ["top level", "question?"]);
        assert_eq!(slack.history_lookups(), 5);
    }

    #[tokio::test]
    async fn slack_serves_a_shared_file_to_the_bot_token_alone() {
        let mut slack = FakeSlack::start(TOKEN, TEAM).await;
        let bytes = vec![0x89, b'P', b'N', b'G', 1, 2, 3];
        let file = slack.add_file(bytes.clone(), "image/png", "cat photo.png");
        let id = file["id"].as_str().expect("an id");
        assert!(id.starts_with("F0"));
        assert_eq!(file["name"], "cat photo.png");
        assert_eq!(file["title"], "cat photo.png");
        assert_eq!(file["mimetype"], "image/png");
        assert_eq!(file["filetype"], "png");
        assert_eq!(file["size"], bytes.len());
        assert_eq!(file["mode"], "hosted");
        let private = file["url_private"].as_str().expect("a url");
        assert_eq!(
            private,
            format!("{}/files-pri/{TEAM}-{id}/cat%20photo.png", slack.url)
        );
        let download = file["url_private_download"].as_str().expect("a url");
        assert_eq!(
            download,
            format!(
                "{}/files-pri/{TEAM}-{id}/download/cat%20photo.png",
                slack.url
            )
        );

        let auth = format!("Bearer {TOKEN}");
        for url in [private, download] {
            let path = url.strip_prefix(slack.url.as_str()).expect("on the fake");
            let a = http(&slack.url, "GET", path, &[("Authorization", &auth)], b"").await;
            assert_eq!(a.status, 200);
            assert_eq!(a.header("content-type"), Some("image/png"));
            assert_eq!(a.body, bytes);
            let a = http(&slack.url, "GET", path, &[], b"").await;
            assert_eq!(a.status, 302);
            assert!(
                a.header("location")
                    .is_some_and(|l| l.starts_with("https://fake.slack.com/?redir=")),
                "{:?}",
                a.header("location")
            );
            assert_ne!(a.body, bytes);
            let a = http(
                &slack.url,
                "GET",
                path,
                &[("Authorization", "Bearer xoxb-wrong")],
                b"",
            )
            .await;
            assert_eq!(a.status, 302);
        }
        let a = http(
            &slack.url,
            "GET",
            &format!("/files-pri/{TEAM}-F0NOPE/x.png"),
            &[("Authorization", &auth)],
            b"",
        )
        .await;
        assert_eq!(a.status, 404);

        // Built from `url` at call time, for a fake mounted elsewhere.
        slack.url = "http://gateway.test/demo/slack".into();
        let file = slack.add_file(b"%PDF".to_vec(), "application/pdf", "r.pdf");
        assert!(
            file["url_private"]
                .as_str()
                .is_some_and(|u| u.starts_with("http://gateway.test/demo/slack/files-pri/"))
        );
        assert_eq!(file["filetype"], "pdf");
    }

    #[tokio::test]
    async fn slack_answers_mounted_in_another_router() {
        let slack = FakeSlack::new(TOKEN, TEAM);
        assert!(slack.url.is_empty());
        let base = serve(Router::new().nest("/demo/slack", slack.router())).await;
        let auth = format!("Bearer {TOKEN}");
        let a = http(
            &base,
            "POST",
            "/demo/slack/api/chat.postMessage",
            &[("Content-Type", JSON), ("Authorization", &auth)],
            json!({"channel": "C0CHANNEL1", "text": "mounted"})
                .to_string()
                .as_bytes(),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(
            slack.posted().last().map(|p| p.text.as_str()),
            Some("mounted")
        );
    }

    #[test]
    fn slack_sign_matches_slacks_documented_example() {
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&\
                    channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&\
                    user_name=roadrunner&command=%2Fwebhook-collect&text=&\
                    response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F\
                    397700885554%2F96rGlfmibIGlgcZRskXaIFfN&\
                    trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            sign(
                "8f742231b10e8888abcd99yyyzzz85a5",
                1_531_420_618,
                body.as_bytes()
            ),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
    }

    #[test]
    fn slack_events_have_slacks_shape() {
        let v = url_verification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
        assert_eq!(
            v,
            json!({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
                "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                "type": "url_verification"})
        );

        let d = dm_event(
            TEAM,
            "Ev0001",
            "U0PERSON1",
            "D0PERSON1",
            "hi",
            "1700000000.000100",
        );
        assert_eq!(d["type"], "event_callback");
        assert_eq!(d["team_id"], TEAM);
        assert_eq!(d["api_app_id"], "A0APP0001");
        assert_eq!(d["event_id"], "Ev0001");
        assert_eq!(d["event_time"], 1_700_000_000);
        assert_eq!(d["authorizations"][0]["user_id"], "U0BOT0001");
        let e = &d["event"];
        assert_eq!(e["type"], "message");
        assert_eq!(e["channel"], "D0PERSON1");
        assert_eq!(e["user"], "U0PERSON1");
        assert_eq!(e["text"], "hi");
        assert_eq!(e["ts"], "1700000000.000100");
        assert_eq!(e["event_ts"], "1700000000.000100");
        assert_eq!(e["channel_type"], "im");
        assert_eq!(e["team"], TEAM);
        assert!(
            e["client_msg_id"]
                .as_str()
                .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok())
        );

        let m = mention_event(
            TEAM,
            "Ev0002",
            "U0PERSON1",
            "C0CHANNEL1",
            "help",
            "1700000001.000200",
            Some("1700000000.000100"),
        );
        assert_eq!(m["event"]["type"], "app_mention");
        assert_eq!(m["event"]["text"], "<@U0BOT0001> help");
        assert_eq!(m["event"]["thread_ts"], "1700000000.000100");
        assert_eq!(
            m["event"]["blocks"][0]["elements"][0]["elements"][0]["user_id"],
            "U0BOT0001"
        );
        let m = mention_event(
            TEAM,
            "Ev3",
            "U0PERSON1",
            "C0CHANNEL1",
            "<@U0BOT0001> x",
            "1.2",
            None,
        );
        assert_eq!(m["event"]["text"], "<@U0BOT0001> x");
        assert!(m["event"].get("thread_ts").is_none());

        let b = bot_message_event(
            TEAM,
            "Ev4",
            "B0OTHER01",
            "D0PERSON1",
            "beep",
            "1700000002.0",
        );
        assert_eq!(b["event"]["subtype"], "bot_message");
        assert_eq!(b["event"]["bot_id"], "B0OTHER01");
        assert!(b["event"].get("user").is_none());
        assert_eq!(b["event"]["channel_type"], "im");

        let ed = edited_event(
            TEAM,
            "Ev5",
            "U0PERSON1",
            "D0PERSON1",
            "1700000000.000100",
            "helo",
            "hello",
        );
        let e = &ed["event"];
        assert_eq!(e["subtype"], "message_changed");
        assert_eq!(e["channel_type"], "im");
        assert_eq!(e["message"]["text"], "hello");
        assert_eq!(e["message"]["ts"], "1700000000.000100");
        assert_eq!(e["previous_message"]["text"], "helo");
        assert!(parse_ts(e["ts"].as_str().expect("a ts")) > parse_ts("1700000000.000100"));

        let slack = FakeSlack::new(TOKEN, TEAM);
        let file = slack.add_file(b"hi".to_vec(), "text/plain", "a.txt");
        let f = dm_file_event(
            TEAM,
            "Ev6",
            "U0PERSON1",
            "D0PERSON1",
            "",
            "1700000003.0",
            file.clone(),
        );
        assert_eq!(f["event"]["subtype"], "file_share");
        assert_eq!(f["event"]["files"], json!([file]));
        assert_eq!(f["event"]["upload"], false);
        assert_eq!(f["event"]["channel_type"], "im");
        assert_eq!(f["event"]["user"], "U0PERSON1");
    }

    /// A `multipart/form-data` body with one file field: its content type and bytes.
    fn multipart(field: &str, file_name: &str, bytes: &[u8]) -> (String, Vec<u8>) {
        let boundary = "sbBoundary7MA4YWxk";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; \
             filename=\"{file_name}\"\r\nContent-Type: text/csv\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        (format!("multipart/form-data; boundary={boundary}"), body)
    }

    #[tokio::test]
    async fn slack_takes_a_file_in_three_steps_and_shares_it_in_the_thread_once() {
        let slack = FakeSlack::start(TOKEN, TEAM).await;
        let root = slack.add_message("C0CHANNEL1", "U0PERSON1", "the report?", None);
        let report = b"date,visits\n2026-12-01,14\n".to_vec();
        let auth = format!("Bearer {TOKEN}");
        let length = report.len().to_string();
        let body = form(&[("filename", "visits.csv"), ("length", &length)]);
        let a = http(
            &slack.url,
            "POST",
            "/api/files.getUploadURLExternal",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Authorization", &auth),
            ],
            body.as_bytes(),
        )
        .await;
        let v = a.json();
        assert_eq!(v["ok"], true, "{v}");
        let id = v["file_id"].as_str().expect("a file id").to_string();
        assert!(id.starts_with("F0"), "{id}");
        let upload_url = v["upload_url"].as_str().expect("an upload URL");
        assert_eq!(upload_url, format!("{}/upload/{id}", slack.url));
        let upload_path = upload_url
            .strip_prefix(slack.url.as_str())
            .expect("on the fake")
            .to_string();

        let share = json!({"files": [{"id": id, "title": "Visits"}], "channel_id": "C0CHANNEL1",
            "thread_ts": root, "initial_comment": "here &amp; now"});
        let a = call(&slack.url, "files.completeUploadExternal", share.clone()).await;
        assert_eq!(
            a.json(),
            json!({"ok": false, "error": "file_not_found"}),
            "its bytes are not there yet"
        );
        let a = http(&slack.url, "POST", &upload_path, &[], b"too short").await;
        assert_eq!(a.status, 400, "not the length announced");
        let (content_type, body) = multipart("file", "visits.csv", &report);
        let a = http(
            &slack.url,
            "POST",
            &upload_path,
            &[("Content-Type", &content_type)],
            &body,
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body, format!("OK - {}", report.len()).into_bytes());

        let a = call(&slack.url, "files.completeUploadExternal", share.clone()).await;
        assert_eq!(
            a.json(),
            json!({"ok": true, "files": [{"id": id, "title": "Visits"}]})
        );
        let uploaded = slack.uploaded_files();
        assert_eq!(uploaded.len(), 1);
        let u = &uploaded[0];
        assert_eq!(
            (u.id.as_str(), u.name.as_str(), u.title.as_str()),
            (id.as_str(), "visits.csv", "Visits")
        );
        assert_eq!(u.bytes, report);
        assert_eq!(u.channel, "C0CHANNEL1");
        assert_eq!(u.thread_ts.as_deref(), Some(root.as_str()));
        assert_eq!(u.comment, "here &amp; now");
        assert!(slack.posted().is_empty(), "no chat.postMessage");

        // The thread lists it as a message of the bot's carrying the file.
        let a = call(
            &slack.url,
            "conversations.replies",
            json!({"channel": "C0CHANNEL1", "ts": root}),
        )
        .await;
        let v = a.json();
        assert_eq!(texts(&v), ["the report?", "here &amp; now"]);
        let shared = &v["messages"][1];
        assert_eq!(shared["ts"], u.ts.as_str());
        assert_eq!(shared["user"], "U0BOT0001");
        assert_eq!(shared["bot_id"], "B0BOT0001");
        assert_eq!(shared["files"][0]["id"], id.as_str());
        assert_eq!(shared["files"][0]["name"], "visits.csv");
        assert_eq!(shared["files"][0]["title"], "Visits");
        assert_eq!(shared["files"][0]["size"], report.len());

        // A file is shared once; a raw body and a user's DM do as well.
        let a = call(&slack.url, "files.completeUploadExternal", share).await;
        assert_eq!(a.json()["error"], "file_not_found");
        let a = call(
            &slack.url,
            "files.getUploadURLExternal",
            json!({"filename": "a.txt", "length": 2}),
        )
        .await;
        let second = a.json()["file_id"].as_str().expect("an id").to_string();
        let path = format!("/upload/{second}");
        assert_eq!(
            http(&slack.url, "POST", &path, &[], b"hi").await.status,
            200
        );
        let files = json!([{"id": second}]).to_string();
        let a = call(
            &slack.url,
            "files.completeUploadExternal",
            json!({"files": files, "channels": "U0PERSON1"}),
        )
        .await;
        assert_eq!(a.json()["ok"], true);
        let dm = &slack.uploaded_files()[1];
        assert_eq!(
            (dm.channel.as_str(), dm.title.as_str(), dm.comment.as_str()),
            ("D0PERSON1", "a.txt", "")
        );

        for (args, error) in [
            (json!({"length": 2}), "invalid_arguments"),
            (json!({"filename": "a.txt"}), "invalid_arguments"),
            (
                json!({"filename": "a.txt", "length": 0}),
                "missing_argument",
            ),
        ] {
            let a = call(&slack.url, "files.getUploadURLExternal", args).await;
            assert_eq!(a.json(), json!({"ok": false, "error": error}));
        }
        let a = http(
            &slack.url,
            "POST",
            "/api/files.getUploadURLExternal",
            &[("Authorization", "Bearer xoxb-wrong")],
            b"",
        )
        .await;
        assert_eq!(a.json()["error"], "invalid_auth");
        slack.failures.fail_next(1, 429);
        let a = call(
            &slack.url,
            "files.completeUploadExternal",
            json!({"files": [{"id": "F0NOPE"}], "channel_id": "C0CHANNEL1"}),
        )
        .await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("1"));
        let a = http(&slack.url, "POST", "/upload/F0NOPE", &[], b"x").await;
        assert_eq!(a.status, 404);

        // Mounted in another router, the upload URL is under its mount point.
        let mounted = FakeSlack::new(TOKEN, TEAM);
        let base = serve(Router::new().nest("/demo/slack", mounted.router())).await;
        let a = http(
            &base,
            "POST",
            "/demo/slack/api/files.getUploadURLExternal",
            &[("Content-Type", JSON), ("Authorization", &auth)],
            json!({"filename": "b.bin", "length": 1})
                .to_string()
                .as_bytes(),
        )
        .await;
        let url = a.json()["upload_url"].as_str().expect("a URL").to_string();
        assert!(
            url.starts_with(&format!("{base}/demo/slack/upload/F0")),
            "{url}"
        );
    }
}
