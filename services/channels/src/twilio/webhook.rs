//! Twilio's inbound SMS webhook: a signed form post.
use http::StatusCode;
use switchboard_kit::config::Config;

use crate::form::{self, MAX_FORM_FIELDS};
use crate::ingress::{
    self, Ack, Incoming, Receipt, ReceiptStatus, Received, Webhook, WebhookRequest,
};
use crate::{ApiError, twilio::signature::verify_twilio_signature};

/// What checking a Twilio webhook needs besides the request itself.
#[derive(Debug, Clone, Copy)]
pub struct TwilioCheck<'a> {
    pub auth_token: &'a str,
    /// The full URL Twilio posted to (public base URL + path and query): Twilio signs it.
    pub url: &'a str,
    pub max_text_chars: usize,
    /// Region for numbers written without a country code (ISO 3166, e.g. `US`).
    pub default_region: &'a str,
    /// What `From` and `To` start with on this route: `""` for SMS, `whatsapp:` for a
    /// WhatsApp sender. A message of another kind posted here is refused, not taken as this.
    pub address_prefix: &'a str,
}

/// A Twilio SMS webhook, authenticated and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSms {
    /// `MessageSid` (or `SmsSid`), header-safe as [`ingress::check_provider_id`] requires.
    pub message_sid: String,
    /// `From` less the route's address prefix, normalised to E.164.
    pub sender: String,
    /// `To` less the route's address prefix, as sent.
    pub recipient: String,
    /// `Body`, control characters removed, at most `max_text_chars` characters.
    pub text: String,
    /// `MediaUrl0` … `MediaUrl{NumMedia-1}` (MMS), at most 10 as Twilio sends.
    pub media_urls: Vec<String>,
}

/// Longest accepted `MessageSid` (Twilio's are 34 characters: `SM` or `MM` and 32 hex digits).
pub const MAX_SID_CHARS: usize = ingress::MAX_PROVIDER_ID_CHARS;

const FORM_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

/// What Twilio posted: a message, or a status callback about one we sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TwilioForm {
    Message(ParsedSms),
    /// A delivery receipt; `None` for a status that is none (`queued`, `sending`, …).
    Status(Option<Receipt>),
}

/// [`parse_twilio_form`] of a message: a status callback is refused (400 `not_a_message`).
pub fn parse_twilio_sms(
    body: &[u8],
    content_type: Option<&str>,
    signature: Option<&str>,
    check: &TwilioCheck<'_>,
) -> Result<ParsedSms, ApiError> {
    match parse_twilio_form(body, content_type, signature, check, chrono::Utc::now())? {
        TwilioForm::Message(sms) => Ok(sms),
        TwilioForm::Status(_) => Err(ApiError::bad_request(
            "not_a_message",
            "a status callback, not a message",
        )),
    }
}

/// Authenticate and validate a Twilio webhook: the pure part of `POST /webhooks/twilio/sms`
/// (and `/whatsapp`), shared by the webhook and the fuzz target `twilio_webhook`.
///
/// In order: the signature header is present (403), the content type is a UTF-8 form (415), the
/// body is a well-formed form of UTF-8 fields without NUL and at most [`MAX_FORM_FIELDS`] fields
/// (400), the signature matches (403), `MessageSid` is present and well-formed (400). A form
/// with a `MessageStatus` other than `received` is a status callback (a receipt at `now`);
/// else a message: `From` is present (400), `Body` is within `max_text_chars` (413), `From` is
/// a phone number with the route's prefix (400).
pub fn parse_twilio_form(
    body: &[u8],
    content_type: Option<&str>,
    signature: Option<&str>,
    check: &TwilioCheck<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<TwilioForm, ApiError> {
    let signature = signature.ok_or_else(|| {
        ApiError::forbidden("missing_signature", "X-Twilio-Signature is required")
    })?;
    let is_form = content_type.is_some_and(|ct| {
        ingress::media_type(ct) == FORM_CONTENT_TYPE && ingress::charset_is_utf8(ct)
    });
    if !is_form {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type must be {FORM_CONTENT_TYPE} (UTF-8)"),
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::bad_request("bad_encoding", "body is not UTF-8"));
    }
    let params = form::parse_form(body, MAX_FORM_FIELDS).map_err(form::FormError::rejection)?;
    if !verify_twilio_signature(check.auth_token, check.url, &params, signature) {
        return Err(ApiError::forbidden(
            "invalid_signature",
            "X-Twilio-Signature does not match",
        ));
    }

    let field = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let sid = field("MessageSid")
        .or_else(|| field("SmsSid"))
        .unwrap_or_default();
    ingress::check_provider_id("MessageSid", sid)?;
    if let Some(status) = field("MessageStatus").filter(|s| !matches!(*s, "received" | "receiving"))
    {
        return Ok(TwilioForm::Status(receipt(
            sid,
            status,
            field("ErrorCode").unwrap_or_default(),
            field("ErrorMessage").unwrap_or_default(),
            now,
        )));
    }
    let from = field("From").ok_or_else(|| ApiError::missing_field("From"))?;
    let from = from.strip_prefix(check.address_prefix).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_from",
            format!("From must be a {}<number> address", check.address_prefix),
        )
    })?;
    let to = field("To").unwrap_or_default();
    let to = to.strip_prefix(check.address_prefix).unwrap_or(to);
    let text = ingress::clean_text(
        "Body",
        field("Body").unwrap_or_default(),
        check.max_text_chars,
    )?;
    let sender = switchboard_kit::address::normalize_phone(from, check.default_region)
        .map_err(|e| ApiError::bad_request("invalid_from", e.to_string()))?;
    let num_media: usize = field("NumMedia").and_then(|n| n.parse().ok()).unwrap_or(0);
    let media_urls = (0..num_media.min(10))
        .filter_map(|i| field(&format!("MediaUrl{i}")).map(str::to_string))
        .collect();
    Ok(TwilioForm::Message(ParsedSms {
        message_sid: sid.to_string(),
        sender,
        recipient: to.to_string(),
        text,
        media_urls,
    }))
}

/// A status callback's receipt: Twilio's statuses as far as a person is concerned
/// (`undelivered` and `failed` alike: not delivered); `None` for the steps before `sent`.
fn receipt(
    sid: &str,
    status: &str,
    error_code: &str,
    error_message: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Receipt> {
    let status = match status {
        "sent" => ReceiptStatus::Sent,
        "delivered" => ReceiptStatus::Delivered,
        "read" => ReceiptStatus::Read,
        "undelivered" | "failed" => ReceiptStatus::Failed,
        _ => return None,
    };
    let error = match (error_code.trim(), error_message.trim()) {
        ("", "") => String::new(),
        (code, "") => format!("({code})"),
        ("", message) => message.to_string(),
        (code, message) => format!("({code}) {message}"),
    };
    Some(Receipt {
        provider_message_id: sid.to_string(),
        status,
        error: error
            .chars()
            .filter(|c| !c.is_control())
            .take(500)
            .collect(),
        reported_at: now,
    })
}

/// Where a Twilio sender posts, and what its messages are.
#[derive(Debug, Clone, Copy)]
pub struct TwilioRoute {
    pub route: &'static str,
    pub channel: &'static str,
    pub provider: &'static str,
    /// See [`TwilioCheck::address_prefix`].
    pub address_prefix: &'static str,
}

/// A phone number's SMS and MMS.
pub const SMS_ROUTE: TwilioRoute = TwilioRoute {
    route: "/webhooks/twilio/sms",
    channel: "sms",
    provider: "twilio",
    address_prefix: "",
};

/// `POST /webhooks/twilio/sms`, and the same form for a WhatsApp sender
/// ([`crate::twilio::whatsapp`]).
pub struct TwilioWebhook {
    auth_token: switchboard_kit::config::Secret,
    max_text_chars: usize,
    default_region: String,
    route: TwilioRoute,
}

impl TwilioWebhook {
    /// The SMS webhook.
    pub fn new(config: &Config) -> Self {
        Self::on(config, SMS_ROUTE)
    }

    pub fn on(config: &Config, route: TwilioRoute) -> Self {
        Self {
            auth_token: config.twilio.auth_token.clone(),
            max_text_chars: config.gateway.max_text_chars,
            default_region: config.identity.default_region.clone(),
            route,
        }
    }
}

impl Webhook for TwilioWebhook {
    fn route(&self) -> &'static str {
        self.route.route
    }

    fn channel(&self) -> &'static str {
        self.route.channel
    }

    fn provider(&self) -> &'static str {
        self.route.provider
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        if self.auth_token.expose().is_empty() {
            return Err(ApiError::forbidden(
                "not_configured",
                "twilio.auth_token is not set: Twilio webhooks cannot be verified",
            ));
        }
        let check = TwilioCheck {
            auth_token: self.auth_token.expose(),
            url: request.url,
            max_text_chars: self.max_text_chars,
            default_region: &self.default_region,
            address_prefix: self.route.address_prefix,
        };
        let form = parse_twilio_form(
            request.body,
            request.content_type(),
            request.header("x-twilio-signature"),
            &check,
            request.now,
        )?;
        let sms = match form {
            TwilioForm::Message(sms) => sms,
            TwilioForm::Status(Some(receipt)) => {
                return Ok(Incoming::Receipts {
                    receipts: vec![receipt],
                    messages: Vec::new(),
                });
            }
            TwilioForm::Status(None) => return Ok(Incoming::Ignored("status")),
        };
        Ok(Received {
            provider_message_id: sms.message_sid,
            sender: sms.sender,
            recipient: sms.recipient,
            text: sms.text,
            media_urls: sms.media_urls,
            agent: String::new(),
        }
        .into())
    }

    /// Empty TwiML: the reply goes out later through the Messages API.
    fn ack(&self) -> Ack {
        Ack {
            content_type: "text/xml",
            body: "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response></Response>",
        }
    }
}
