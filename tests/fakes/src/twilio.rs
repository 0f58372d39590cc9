//! Twilio's Messages API: Basic auth, form `To`/`From`/`Body`, 201 with a `sid`; `GET` lists
//! what it accepted (`To`, `From`, `DateSent>` filters, most recent first, paged with
//! `next_page_uri`); MMS media served as Twilio serves it (Basic auth required). WhatsApp
//! senders too: `whatsapp:` addresses on both ends (error 21910 when only one has it), and
//! Content templates (`ContentSid` + `ContentVariables`) filled in as Twilio lists them.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use crate::serve::{Failures, header, serve};
use crate::sms::{Outbox, Provider, SendObserver, SentSms};

#[derive(Clone)]
pub struct FakeTwilio {
    /// The API base to configure (`twilio.api_base`); empty for a fake only mounted in another
    /// server's router ([`FakeTwilio::router`]).
    pub url: String,
    pub account_sid: String,
    pub auth_token: String,
    /// Failures of the message list alone (the send API keeps working).
    pub list_failures: Failures,
    inner: Arc<Inner>,
}

struct Inner {
    expected_auth: String,
    outbox: Outbox,
    failures: Failures,
    /// MMS media by path: content type and bytes.
    media: Mutex<HashMap<String, (String, Vec<u8>)>>,
    /// Approved Content templates by sid: their body, `{{1}}` … where the variables go.
    templates: Mutex<HashMap<String, String>>,
    /// The `StatusCallback` each message asked for, by its sid: where Twilio would post what
    /// became of it.
    status_callbacks: Mutex<HashMap<String, String>>,
}

/// The query of Twilio's Messages list.
#[derive(Deserialize)]
struct ListQuery {
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

/// The send form. Parsed by hand: `MediaUrl` repeats (one field a picture, up to ten), which
/// serde's form decoding cannot collect.
#[derive(Default)]
struct SendForm {
    to: Option<String>,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    body: Option<String>,
    media_urls: Vec<String>,
    content_sid: Option<String>,
    content_variables: Option<String>,
    status_callback: Option<String>,
}

impl SendForm {
    fn parse(raw: &[u8]) -> Self {
        let mut form = Self::default();
        for (key, value) in form_urlencoded::parse(raw) {
            let value = value.into_owned();
            match key.as_ref() {
                "To" => form.to = Some(value),
                "From" => form.from = Some(value),
                "MessagingServiceSid" => form.messaging_service_sid = Some(value),
                "Body" => form.body = Some(value),
                "MediaUrl" => form.media_urls.push(value),
                "ContentSid" => form.content_sid = Some(value),
                "ContentVariables" => form.content_variables = Some(value),
                "StatusCallback" => form.status_callback = Some(value),
                _ => {}
            }
        }
        form
    }
}

fn twilio_error(
    status: StatusCode,
    code: u32,
    message: &str,
) -> (StatusCode, Json<serde_json::Value>) {
    (
        status,
        Json(json!({"code": code, "message": message, "status": status.as_u16()})),
    )
}

impl FakeTwilio {
    /// The account's fake, not yet listening: mount [`Self::router`] where it should answer.
    pub fn new(account_sid: &str, auth_token: &str) -> Self {
        let expected_auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{account_sid}:{auth_token}"))
        );
        Self {
            url: String::new(),
            account_sid: account_sid.into(),
            auth_token: auth_token.into(),
            list_failures: Failures::default(),
            inner: Arc::new(Inner {
                expected_auth,
                outbox: Outbox::default(),
                failures: Failures::default(),
                media: Mutex::default(),
                templates: Mutex::default(),
                status_callbacks: Mutex::default(),
            }),
        }
    }

    /// The account's fake on a port of its own.
    pub async fn start(account_sid: &str, auth_token: &str) -> Self {
        let mut this = Self::new(account_sid, auth_token);
        this.url = serve(this.router()).await;
        this
    }

    /// Twilio's routes, from `/2010-04-01`.
    pub fn router(&self) -> Router {
        Router::new()
            .route(
                "/2010-04-01/Accounts/{account}/Messages.json",
                post(Self::create_message).get(Self::list_messages),
            )
            .route(
                "/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}",
                get(Self::get_media),
            )
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

    /// How many times the Messages list was asked for.
    pub fn lookups(&self) -> u64 {
        self.inner.outbox.lookups()
    }

    /// The `StatusCallback` URL the send of message `sid` asked for.
    pub fn status_callback_of(&self, sid: &str) -> Option<String> {
        self.inner
            .status_callbacks
            .lock()
            .unwrap()
            .get(sid)
            .cloned()
    }

    /// An approved Content template `sid` whose body is `body` (variables written `{{1}}`).
    pub fn add_content_template(&self, sid: &str, body: &str) {
        self.inner
            .templates
            .lock()
            .unwrap()
            .insert(sid.into(), body.into());
    }

    /// The body Twilio makes of template `sid` and the JSON object `variables`.
    fn fill_template(&self, sid: &str, variables: Option<&str>) -> Result<String, &'static str> {
        let Some(mut body) = self.inner.templates.lock().unwrap().get(sid).cloned() else {
            return Err("The Content SID is invalid.");
        };
        let variables: serde_json::Map<String, serde_json::Value> = match variables {
            Some(v) => {
                serde_json::from_str(v).map_err(|_| "ContentVariables is not a JSON object.")?
            }
            None => Default::default(),
        };
        for (key, value) in variables {
            let Some(value) = value.as_str() else {
                return Err("A ContentVariables value is not a string.");
            };
            body = body.replace(&format!("{{{{{key}}}}}"), value);
        }
        Ok(body)
    }

    /// Answer the next `n` sends with 500 (a Twilio outage).
    pub fn fail_next(&self, n: usize) {
        self.inner.failures.fail_next(n, 500);
    }

    /// A picture a person sent by MMS: its `MediaUrl` (Twilio's media URL form).
    pub fn add_media(&self, content_type: &str, bytes: Vec<u8>) -> String {
        let path = format!(
            "/2010-04-01/Accounts/{}/Messages/MM{}/Media/ME{}",
            self.account_sid,
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.inner
            .media
            .lock()
            .unwrap()
            .insert(path.clone(), (content_type.into(), bytes));
        format!("{}{path}", self.url)
    }

    /// Twilio's 401, unless the request carries this account's Basic credentials.
    fn authenticate(
        &self,
        account: &str,
        headers: &HeaderMap,
    ) -> Result<(), (StatusCode, Json<serde_json::Value>)> {
        if account != self.account_sid
            || header(headers, "authorization") != self.inner.expected_auth
        {
            return Err(twilio_error(
                StatusCode::UNAUTHORIZED,
                20003,
                "Authenticate",
            ));
        }
        Ok(())
    }

    async fn get_media(
        State(s): State<FakeTwilio>,
        Path((account, message, media)): Path<(String, String, String)>,
        headers: HeaderMap,
    ) -> Response {
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused.into_response();
        }
        let path = format!("/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}");
        match s.inner.media.lock().unwrap().get(&path).cloned() {
            Some((content_type, bytes)) => {
                ([(axum::http::header::CONTENT_TYPE, content_type)], bytes).into_response()
            }
            None => StatusCode::NOT_FOUND.into_response(),
        }
    }

    async fn list_messages(
        State(s): State<FakeTwilio>,
        Path(account): Path<String>,
        headers: HeaderMap,
        Query(q): Query<ListQuery>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused;
        }
        s.inner.outbox.looked_up();
        if let Some(status) = s.list_failures.take() {
            return twilio_error(status, 20500, "Internal Server Error");
        }
        let after = match q
            .date_sent_after
            .as_deref()
            .map(|d| d.parse::<chrono::NaiveDate>())
        {
            None => None,
            Some(Ok(day)) => Some(day),
            Some(Err(_)) => {
                return twilio_error(StatusCode::BAD_REQUEST, 20001, "Invalid value for DateSent");
            }
        };
        let candidates = match &q.to {
            Some(to) => s.inner.outbox.to(to),
            None => s.inner.outbox.all(),
        };
        let mut listed: Vec<SentSms> = candidates
            .into_iter()
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
                json!({
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
            Json(json!({
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
        raw: axum::body::Bytes,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let f = SendForm::parse(&raw);
        if let Err(refused) = s.authenticate(&account, &headers) {
            return refused;
        }
        if let Some(status) = s.inner.failures.take() {
            return twilio_error(status, 20500, "Internal Server Error");
        }
        let whatsapp =
            |a: &Option<String>| a.as_deref().is_some_and(|a| a.starts_with("whatsapp:"));
        if f.from.is_some() && whatsapp(&f.to) != whatsapp(&f.from) {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21910,
                "Invalid From and To pair. From and To should be of the same channel",
            );
        }
        // Twilio takes a message with media and no body (an MMS of pictures alone), and a
        // template's body is its own.
        let body = match (&f.content_sid, f.body, f.media_urls.is_empty()) {
            (Some(sid), _, _) => match s.fill_template(sid, f.content_variables.as_deref()) {
                Ok(body) => Some(body),
                Err(why) => return twilio_error(StatusCode::BAD_REQUEST, 21655, why),
            },
            (None, Some(body), _) => Some(body),
            (None, None, false) => Some(String::new()),
            (None, None, true) => None,
        };
        let (Some(to), Some(body)) = (f.to, body) else {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21604,
                "A 'To' phone number and a 'Body' are required.",
            );
        };
        if f.media_urls.len() > 10 {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21623,
                "Number of media files exceeds allowed limit of 10.",
            );
        }
        if let Some(bad) = f
            .media_urls
            .iter()
            .find(|u| !(u.starts_with("https://") || u.starts_with("http://")))
        {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21620,
                &format!("Invalid media URL(s): {bad}"),
            );
        }
        if f.from.is_none() && f.messaging_service_sid.is_none() {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21603,
                "A 'From' phone number is required.",
            );
        }
        if body.chars().count() > 1600 {
            return twilio_error(
                StatusCode::BAD_REQUEST,
                21617,
                "The concatenated message body exceeds the 1600 character limit.",
            );
        }
        let sms = SentSms {
            provider: Provider::Twilio,
            sid: format!("SM{}", uuid::Uuid::new_v4().simple()),
            to,
            from: f.from.unwrap_or_default(),
            body,
            media_urls: f.media_urls,
            created: Utc::now(),
            user_agent: Some(header(&headers, "user-agent").to_string()).filter(|u| !u.is_empty()),
        };
        let answer = json!({"sid": sms.sid, "to": sms.to, "from": sms.from, "body": sms.body, "status": "queued",
            "num_media": sms.media_urls.len().to_string()});
        if let Some(url) = f.status_callback {
            s.inner
                .status_callbacks
                .lock()
                .unwrap()
                .insert(sms.sid.clone(), url);
        }
        s.inner.outbox.take(sms);
        (StatusCode::CREATED, Json(answer))
    }
}
