//! The checks behind Switchboard's fuzz targets, as plain functions of the fuzzer's bytes.
//!
//! Each `fuzz_targets/<name>.rs` calls the function of the same name. [`replay`] runs the
//! committed seeds (`seeds/<name>/`), any saved corpus (`corpus/<name>/`) and pseudo-random
//! mutations of them through the same functions without libFuzzer: `make test` does so through
//! `tests/tests/hostile_input.rs`, which includes this file as a module (see README.md). A check
//! fails by panicking, which libFuzzer reports as a crash.
use std::path::{Path, PathBuf};

use arbitrary::{Arbitrary, Unstructured};
use prost::Message;
use switchboard_channels::form::MAX_FORM_FIELDS;
use switchboard_channels::twilio::{
    MAX_SID_CHARS, TwilioCheck, TwilioForm, parse_twilio_form, twilio_signature as sign,
    verify_twilio_signature,
};
use switchboard_kit::address::normalize_phone;
use switchboard_kit::proto::{DeadLetter, IdentifiedMessage, InboundMessage, Reply, Turn};

pub const AUTH_TOKEN: &str = "fuzz-auth-token";
pub const URL: &str = "https://sb.example.com/webhooks/twilio/sms";

/// Every code `parse_twilio_form` may answer with, and its status.
const CODES: &[(&str, u16)] = &[
    ("missing_signature", 403),
    ("unsupported_media_type", 415),
    ("bad_encoding", 400),
    ("malformed_form", 400),
    ("too_many_fields", 400),
    ("invalid_signature", 403),
    ("missing_field", 400),
    ("invalid_field", 400),
    ("text_too_long", 413),
    ("invalid_from", 400),
];

const CONTENT_TYPES: [Option<&str>; 8] = [
    Some("application/x-www-form-urlencoded"),
    Some("application/x-www-form-urlencoded; charset=UTF-8"),
    Some("Application/X-WWW-Form-Urlencoded;charset=\"utf-8\""),
    Some("application/x-www-form-urlencoded; charset=ISO-8859-1"),
    Some("application/json"),
    Some("text/plain; charset=utf-8"),
    Some("multipart/form-data; boundary=x"),
    None,
];

const REGIONS: [&str; 8] = ["US", "GB", "DE", "IN", "BR", "", "ZZ", "us"];

/// The Twilio webhook's pure path: strict form parsing, content type, signature, field checks.
///
/// Input: one flag byte, then the body. Flag bit 0: sign the body correctly (over its lenient
/// parse, as an attacker holding the token would), so the fuzzer gets past the signature check;
/// bits 1-3: the content type; bit 4: a 16-character text limit instead of 4096; bit 5: no
/// signature header at all.
pub fn twilio_webhook(data: &[u8]) {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(flags >> 1) & 7];
    let max_text_chars = if flags & 16 != 0 { 16 } else { 4096 };
    let lenient: Vec<(String, String)> = form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let strict = switchboard_channels::form::parse_form(body, MAX_FORM_FIELDS);
    if let Ok(fields) = &strict {
        // A body the strict parser accepts means the same as it does to everyone else.
        assert_eq!(fields, &lenient, "strict and WHATWG parsing disagree");
    }
    let signature = if flags & 1 != 0 {
        sign(AUTH_TOKEN, URL, &lenient)
    } else {
        String::from_utf8_lossy(&body[..body.len().min(28)]).into_owned()
    };
    let check = TwilioCheck {
        auth_token: AUTH_TOKEN,
        url: URL,
        max_text_chars,
        default_region: "US",
        // The same parser reads a WhatsApp sender's posts, whose addresses carry a prefix.
        address_prefix: if flags & 64 != 0 { "whatsapp:" } else { "" },
    };
    let header = (flags & 32 == 0).then_some(signature.as_str());
    match parse_twilio_form(body, content_type, header, &check, chrono::Utc::now()) {
        Ok(TwilioForm::Status(receipt)) => {
            let fields = strict.expect("accepted only a well-formed form");
            assert!(verify_twilio_signature(
                AUTH_TOKEN, URL, &fields, &signature
            ));
            let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
            let status = field("MessageStatus").expect("a status callback names its status");
            assert!(
                status != "received" && status != "receiving",
                "a message taken as a status"
            );
            if let Some(receipt) = receipt {
                assert!(!receipt.provider_message_id.is_empty());
                assert!(receipt.provider_message_id.len() <= MAX_SID_CHARS);
                assert!(
                    !receipt.error.chars().any(char::is_control),
                    "control characters kept"
                );
            }
        }
        Ok(TwilioForm::Message(sms)) => {
            let fields = strict.expect("accepted only a well-formed form");
            assert!(
                std::str::from_utf8(body).is_ok(),
                "accepted a body that is not UTF-8"
            );
            assert!(header.is_some());
            assert!(verify_twilio_signature(
                AUTH_TOKEN, URL, &fields, &signature
            ));
            assert!(!sms.message_sid.is_empty() && sms.message_sid.len() <= MAX_SID_CHARS);
            assert!(
                sms.message_sid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "sid {:?} is not header-safe",
                sms.message_sid
            );
            assert_e164(&sms.sender);
            assert!(
                field_starts_with(&fields, "From", check.address_prefix),
                "a From without the route's prefix was taken"
            );
            assert!(sms.text.chars().count() <= max_text_chars);
            for s in [&sms.text, &sms.recipient]
                .into_iter()
                .chain(&sms.media_urls)
            {
                assert!(!s.contains('\0'), "NUL reaches the pipeline");
            }
            assert!(sms.media_urls.len() <= 10);
            let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
            // The text is the Body, minus control characters (tab and line feed kept).
            let body: String = field("Body")
                .map_or("", |v| v.as_str())
                .chars()
                .filter(|&c| c == '\n' || c == '\t' || !c.is_control())
                .collect();
            assert_eq!(body, sms.text);
        }
        Err(e) => {
            let status = e.status().as_u16();
            assert!(
                CODES.contains(&(e.code(), status)),
                "unexpected rejection {} {status}",
                e.code()
            );
            if header.is_none() {
                assert_eq!(e.code(), "missing_signature");
            }
            if flags & 1 != 0 && strict.is_ok() {
                assert_ne!(
                    e.code(),
                    "invalid_signature",
                    "a correct signature was refused"
                );
            }
        }
    }
}

/// Every code `parse_textmagic_sms` may answer with, and its status.
const TEXTMAGIC_CODES: &[(&str, u16)] = &[
    ("unsupported_media_type", 415),
    ("malformed_json", 400),
    ("malformed_form", 400),
    ("malformed_multipart", 400),
    ("bad_encoding", 400),
    ("too_many_fields", 400),
    ("missing_field", 400),
    ("invalid_field", 400),
    ("text_too_long", 413),
    ("invalid_sender", 400),
];

const TEXTMAGIC_CONTENT_TYPES: [Option<&str>; 8] = [
    Some("application/json"),
    Some("application/x-www-form-urlencoded"),
    Some("multipart/form-data; boundary=x"),
    Some("application/json; charset=utf-8"),
    Some("multipart/form-data"),
    Some("application/json; charset=ISO-8859-1"),
    Some("text/plain"),
    None,
];

/// TextMagic's callback body, after the URL token: JSON, form or multipart, all read alike.
///
/// Input: one flag byte, then the body. Flag bits 0-2: the content type; bit 3: a 16-character
/// text limit instead of 4096.
pub fn textmagic_webhook(data: &[u8]) {
    use switchboard_channels::textmagic::parse_textmagic_sms;
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let content_type = TEXTMAGIC_CONTENT_TYPES[usize::from(flags) & 7];
    let max_text_chars = if flags & 8 != 0 { 16 } else { 4096 };
    match parse_textmagic_sms(body, content_type, max_text_chars, "US") {
        Ok(sms) => {
            assert!(
                matches!(usize::from(flags) & 7, 0..=3),
                "accepted content type {content_type:?}"
            );
            assert!(!sms.id.is_empty() && sms.id.len() <= 64);
            assert!(
                sms.id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "id {:?} is not header-safe",
                sms.id
            );
            assert_e164(&sms.sender);
            assert!(sms.text.chars().count() <= max_text_chars);
            assert!(
                sms.text
                    .chars()
                    .all(|c| c == '\n' || c == '\t' || !c.is_control()),
                "a control character reaches the pipeline"
            );
            assert!(!sms.receiver.contains('\0'), "NUL reaches the pipeline");
        }
        Err(e) => {
            let status = e.status().as_u16();
            assert!(
                TEXTMAGIC_CODES.contains(&(e.code(), status)),
                "unexpected rejection {} {status}",
                e.code()
            );
        }
    }
}

/// The bot the `telegram_update` check reads updates for, and the group chat configured as a
/// conversation.
pub const TELEGRAM_BOT_ID: &str = "7000000001";
pub const TELEGRAM_GROUP: i64 = -1001;

/// Every code `telegram::parse_update` may answer with, and its status.
const TELEGRAM_CODES: &[(&str, u16)] = &[
    ("unsupported_media_type", 415),
    ("malformed_json", 400),
    ("missing_field", 400),
    ("invalid_field", 400),
    ("text_too_long", 413),
];

/// Every reason `telegram::parse_update` may give for an update that carries no message for us.
const TELEGRAM_IGNORED: &[&str] = &[
    "edited_message",
    "channel_post",
    "callback_query",
    "membership",
    "other_update",
    "group_not_configured",
    "unsupported_message",
];

const TELEGRAM_CONTENT_TYPES: [Option<&str>; 8] = [
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("Application/JSON;charset=\"UTF8\""),
    Some("application/json; charset=ISO-8859-1"),
    Some("text/plain"),
    Some("application/x-www-form-urlencoded"),
    Some("multipart/form-data; boundary=x"),
    None,
];

/// A Telegram bot's update, once its secret token matched: JSON only, one message or a reason
/// it carries none for us.
///
/// Input: one flag byte, then the body. Flag bits 0-2: the content type; bit 3: a 16-character
/// text limit instead of 4096; bit 4: no group chat configured (else [`TELEGRAM_GROUP`]).
pub fn telegram_update(data: &[u8]) {
    use switchboard_channels::ingress::check_provider_id;
    use switchboard_channels::telegram::parse_update;
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let content_type = TELEGRAM_CONTENT_TYPES[usize::from(flags) & 7];
    let json = matches!(usize::from(flags) & 7, 0..=2);
    let max_text_chars = if flags & 8 != 0 { 16 } else { 4096 };
    let groups: &[i64] = if flags & 16 != 0 {
        &[]
    } else {
        &[TELEGRAM_GROUP]
    };
    match parse_update(body, content_type, TELEGRAM_BOT_ID, groups, max_text_chars) {
        Ok(Ok(m)) => {
            assert!(json, "accepted content type {content_type:?}");
            assert!(
                check_provider_id("id", &m.id).is_ok(),
                "id {:?} is not a provider id",
                m.id
            );
            // `<bot id>_<chat id>_<message id>`, the chat id being the one given.
            let (chat, message) =
                m.id.strip_prefix(TELEGRAM_BOT_ID)
                    .and_then(|rest| rest.strip_prefix('_'))
                    .and_then(|rest| rest.rsplit_once('_'))
                    .unwrap_or_else(|| panic!("id {:?} is not <bot>_<chat>_<message>", m.id));
            assert_eq!(chat, m.chat_id, "the id names another chat");
            let chat_id: i64 = m
                .chat_id
                .parse()
                .unwrap_or_else(|_| panic!("chat id {:?} is not an i64", m.chat_id));
            assert_eq!(chat_id.to_string(), m.chat_id, "chat id not canonical");
            let message_id: i64 = message
                .parse()
                .unwrap_or_else(|_| panic!("message id {message:?} is not an i64"));
            assert_eq!(message_id.to_string(), message, "message id not canonical");
            assert!(
                m.text.chars().count() <= max_text_chars,
                "text over the limit"
            );
            assert!(
                m.text
                    .chars()
                    .all(|c| c == '\n' || c == '\t' || !c.is_control()),
                "a control character reaches the pipeline"
            );
            assert!(
                !m.text.trim().is_empty() || !m.files.is_empty(),
                "a message with nothing in it accepted"
            );
            for file in &m.files {
                let id = file
                    .strip_prefix("telegram-file:")
                    .unwrap_or_else(|| panic!("file {file:?} is not telegram-file:"));
                assert!(
                    !id.is_empty()
                        && id
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "file {file:?} is not header-safe"
                );
            }
            for s in [&m.id, &m.chat_id, &m.text].into_iter().chain(&m.files) {
                assert!(!s.contains('\0'), "NUL reaches the pipeline");
            }
        }
        Ok(Err(reason)) => {
            assert!(json, "read an update sent as {content_type:?}");
            assert!(
                TELEGRAM_IGNORED.contains(&reason),
                "unexpected reason {reason:?}"
            );
        }
        Err(e) => {
            let status = e.status().as_u16();
            assert!(
                TELEGRAM_CODES.contains(&(e.code(), status)),
                "unexpected rejection {} {status}",
                e.code()
            );
            if !json {
                assert_eq!(e.code(), "unsupported_media_type");
            }
        }
    }
}

/// Every code `slack::parse_event` may answer with, and its status.
const SLACK_CODES: &[(&str, u16)] = &[
    ("unsupported_media_type", 415),
    ("malformed_json", 400),
    ("missing_field", 400),
    ("invalid_field", 400),
    ("text_too_long", 413),
];

/// Every reason `slack::parse_event` may give for an event that carries no message for us.
const SLACK_IGNORED: &[&str] = &[
    "other_callback",
    "other_event",
    "from_a_bot",
    "message_subtype",
    "channel_message",
    "empty_message",
];

/// The same choice as Telegram's: JSON in UTF-8 (0-2) or not (3-7).
const SLACK_CONTENT_TYPES: [Option<&str>; 8] = TELEGRAM_CONTENT_TYPES;

/// A Slack id as the adapter takes it (team, user, channel, event): ASCII letters and digits.
fn is_slack_id(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A Slack message timestamp: digits, one dot, digits (`1355517523.000005`).
fn is_slack_ts(s: &str) -> bool {
    s.split_once('.').is_some_and(|(secs, frac)| {
        [secs, frac]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// A Slack app's Events API request, once its signature and timestamp were checked: JSON only,
/// a challenge to answer, one message, or a reason it carries none for us.
///
/// Input: one flag byte, then the body. Flag bits 0-2: the content type; bit 3: a 16-character
/// text limit instead of 4096.
pub fn slack_event(data: &[u8]) {
    use switchboard_channels::ingress::check_provider_id;
    use switchboard_channels::slack::{SlackEvent, parse_event};
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let content_type = SLACK_CONTENT_TYPES[usize::from(flags) & 7];
    let json = matches!(usize::from(flags) & 7, 0..=2);
    let max_text_chars = if flags & 8 != 0 { 16 } else { 4096 };
    match parse_event(body, content_type, max_text_chars) {
        Ok(SlackEvent::Challenge(challenge)) => {
            assert!(json, "read a request sent as {content_type:?}");
            assert!(
                !challenge.is_empty()
                    && challenge.chars().count() <= 256
                    && !challenge.chars().any(char::is_control),
                "challenge {challenge:?} echoed back"
            );
        }
        Ok(SlackEvent::Message {
            id,
            sender,
            place,
            text,
            files,
        }) => {
            assert!(json, "accepted content type {content_type:?}");
            assert!(
                check_provider_id("id", &id).is_ok(),
                "id {id:?} is not a provider id"
            );
            // `<team>-<event id>`, and the sender `<team>:<user>` of the same team.
            let (team, _) = id
                .split_once('-')
                .filter(|(team, event_id)| is_slack_id(team) && is_slack_id(event_id))
                .unwrap_or_else(|| panic!("id {id:?} is not <team>-<event id>"));
            assert!(
                sender
                    .split_once(':')
                    .is_some_and(|(t, user)| t == team && is_slack_id(user)),
                "sender {sender:?} is not {team}:<user>"
            );
            // `<channel>` or `<channel>:<thread ts>`.
            let (channel, thread) = match place.split_once(':') {
                Some((channel, ts)) => (channel, Some(ts)),
                None => (place.as_str(), None),
            };
            assert!(is_slack_id(channel), "place {place:?}: channel");
            if let Some(ts) = thread {
                assert!(is_slack_ts(ts), "place {place:?}: thread ts");
            }
            assert!(
                text.chars().count() <= max_text_chars,
                "text over the limit"
            );
            assert!(
                text.chars()
                    .all(|c| c == '\n' || c == '\t' || !c.is_control()),
                "a control character reaches the pipeline"
            );
            assert!(
                !text.trim().is_empty() || !files.is_empty(),
                "a message with nothing in it accepted"
            );
            for file in &files {
                assert!(url::Url::parse(file).is_ok(), "file {file:?} is not a URL");
            }
            for s in [&id, &sender, &place, &text].into_iter().chain(&files) {
                assert!(!s.contains('\0'), "NUL reaches the pipeline");
            }
        }
        Ok(SlackEvent::Ignored(reason)) => {
            assert!(json, "read a request sent as {content_type:?}");
            assert!(
                SLACK_IGNORED.contains(&reason),
                "unexpected reason {reason:?}"
            );
        }
        Err(e) => {
            let status = e.status().as_u16();
            assert!(
                SLACK_CODES.contains(&(e.code(), status)),
                "unexpected rejection {} {status}",
                e.code()
            );
            if !json {
                assert_eq!(e.code(), "unsupported_media_type");
            }
        }
    }
}

fn assert_e164(s: &str) {
    let digits = s
        .strip_prefix('+')
        .unwrap_or_else(|| panic!("{s:?} lacks +"));
    assert!(
        (2..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
        "{s:?} is not E.164"
    );
}

#[derive(Debug, Arbitrary)]
struct SignatureInput {
    token: String,
    url: String,
    params: Vec<(String, String)>,
    claimed: String,
    swap: usize,
}

/// `X-Twilio-Signature`: a signature made for (token, URL, params) verifies, also with the
/// parameters in another order or surrounded by whitespace; any other claimed signature is
/// accepted only if it is the expected one.
pub fn twilio_signature(data: &[u8]) {
    let Ok(input) = SignatureInput::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let SignatureInput {
        token,
        url,
        mut params,
        claimed,
        swap,
    } = input;
    let expected = sign(&token, &url, &params);
    assert_eq!(expected.len(), 28, "base64 of a 20-byte HMAC-SHA1");
    assert!(verify_twilio_signature(&token, &url, &params, &expected));
    assert!(verify_twilio_signature(
        &token,
        &url,
        &params,
        &format!(" {expected}\n")
    ));
    assert_eq!(
        verify_twilio_signature(&token, &url, &params, &claimed),
        claimed.trim() == expected
    );
    if !params.is_empty() {
        let n = params.len();
        params.swap(0, swap % n);
        params.reverse();
        assert_eq!(sign(&token, &url, &params), expected, "order matters");
        params.push(params[0].clone());
        assert_eq!(sign(&token, &url, &params), expected, "a repeat matters");
    }
}

/// Phone normalisation: never panics; a result is E.164 (at most 15 digits), and normalising it
/// again, in any region, gives it back. So the directory (what an operator typed) and the
/// gateway (the E.164 `From` Twilio sends) agree on every number, and a reply goes back to the
/// number that wrote.
pub fn phone_normalize(data: &[u8]) {
    let Some((&r, raw)) = data.split_first() else {
        return;
    };
    let Ok(raw) = std::str::from_utf8(raw) else {
        return;
    };
    let region = REGIONS[usize::from(r) & 7];
    if let Ok(e164) = normalize_phone(raw, region) {
        assert_e164(&e164);
        for again in REGIONS {
            assert_eq!(
                normalize_phone(&e164, again).ok().as_deref(),
                Some(e164.as_str()),
                "{raw:?} normalised to {e164:?} in {region:?}, but that is not itself in {again:?}"
            );
        }
    }
}

/// Decode, re-encode, decode again: the same message, and the same bytes the second time.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) -> Option<M> {
    let m = M::decode(data).ok()?;
    let bytes = m.encode_to_vec();
    assert_eq!(bytes.len(), m.encoded_len());
    let again = M::decode(bytes.as_slice()).expect("re-encoded message decodes");
    assert_eq!(m, again);
    assert_eq!(again.encode_to_vec(), bytes, "encoding is not stable");
    Some(m)
}

/// Every work subject's payload type, as the runtime decodes it (`Message::decode` of the raw
/// payload): never panics, and round-trips. A decodable `Turn` also goes through the
/// dispatcher's prompt builder, whose fence must give back exactly the person's text.
pub fn work_payloads(data: &[u8]) {
    round_trip::<InboundMessage>(data);
    round_trip::<IdentifiedMessage>(data);
    round_trip::<Reply>(data);
    round_trip::<DeadLetter>(data);
    if let Some(turn) = round_trip::<Turn>(data) {
        use switchboard_dispatch::prompt::{PromptContext, build_prompt, person_text};
        let config = switchboard_kit::config::PromptConfig::default();
        let now = chrono::DateTime::from_timestamp_millis(1_795_000_000_000).unwrap();
        let ctx = PromptContext {
            config: &config,
            memory: None,
            summary: None,
            recall: None,
            reset: None,
            now,
            stale: false,
            attachments: &[],
            shared: false,
            daily_notes: None,
            exports: None,
            handover: None,
        };
        let prompt = build_prompt(&turn, &ctx);
        let msg = turn.message.clone().unwrap_or_default();
        let inbound = msg.inbound.unwrap_or_default();
        let person = msg.person.unwrap_or_default();
        // Header fields come from configuration and the directory, not from the person; only
        // the text is theirs. With a header free of fence-like text, the fence is exact.
        let header = [
            &turn.agent_name,
            &turn.agent_identity,
            &person.person_id,
            &person.person_type,
            &person.name,
            &person.role,
            &inbound.channel,
            &inbound.provider,
        ];
        let hex = inbound.id.chars().filter(char::is_ascii_hexdigit).count();
        if hex >= 16 && header.iter().all(|f| !f.contains('<') && !f.contains('\n')) {
            let fenced =
                switchboard_dispatch::prompt::fenced_text(&prompt).expect("the prompt has a fence");
            let compact: String = inbound.id.chars().filter(char::is_ascii_hexdigit).collect();
            let marker = format!("MSG-{}", &compact[compact.len() - 16..]);
            // Inside the fence: exactly the person's text (less a `/new` the turn applied, cut
            // at the cap), a guessed marker neutralised.
            let expected = person_text(&turn, &config).replace(&marker, "MSG-REDACTED");
            assert_eq!(fenced, expected);
            if turn.reset.is_empty() && inbound.text.chars().count() <= config.max_message_chars {
                assert_eq!(fenced, inbound.text.replace(&marker, "MSG-REDACTED"));
            }
            // A summary written from the person's words cannot move the fence either.
            let with_summary = build_prompt(
                &turn,
                &PromptContext {
                    summary: Some((&inbound.text, now)),
                    ..ctx.clone()
                },
            );
            assert_eq!(
                switchboard_dispatch::prompt::fenced_text(&with_summary),
                Some(expected.as_str()),
                "the summary moved the fence"
            );
            // Before it: nothing the text can change.
            let head = |p: &str| p[..p.find("<<<MSG-").unwrap()].to_string();
            let mut silent = turn.clone();
            if let Some(i) = silent.message.as_mut().and_then(|m| m.inbound.as_mut()) {
                i.text.clear();
            }
            let silent_prompt = build_prompt(&silent, &ctx);
            assert_eq!(
                head(&prompt),
                head(&silent_prompt),
                "the text changed the header"
            );
            assert!(head(&prompt).contains(&format!("| id {} |", person.person_id)));
        }
    }
}

/// A fuzz target's check.
pub type Check = fn(&[u8]);

/// The fuzz targets by name, for the seed replay.
pub const TARGETS: [(&str, Check); 8] = [
    ("twilio_webhook", twilio_webhook),
    ("textmagic_webhook", textmagic_webhook),
    ("telegram_update", telegram_update),
    ("slack_event", slack_event),
    ("twilio_signature", twilio_signature),
    ("phone_normalize", phone_normalize),
    ("work_payloads", work_payloads),
    ("client_input", client_input),
];

/// The refusals the client-facing parsers may give, with their statuses.
const CLIENT_CODES: &[(&str, u16)] = &[
    ("invalid_frame", 400),
    ("invalid_body", 400),
    ("invalid_field", 400),
    ("missing_field", 400),
    ("malformed_json", 400),
    ("text_too_long", 413),
    ("too_many_attachments", 413),
];

/// Text that may reach the pipeline: within the limit, no control characters but tab and LF.
fn assert_clean_text(text: &str, max_chars: usize) {
    assert!(text.chars().count() <= max_chars, "text over the limit");
    assert!(
        text.chars()
            .all(|c| c == '\n' || c == '\t' || !c.is_control()),
        "a control character reaches the pipeline"
    );
    assert!(
        !text.trim().is_empty() || text.is_empty(),
        "blank text accepted"
    );
}

fn assert_client_id(id: &str) {
    assert!(!id.is_empty() && id.len() <= 40, "id {id:?} length");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "id {id:?} is not header-safe"
    );
}

fn assert_client_refusal(e: &switchboard_channels::ApiError) {
    let status = e.status().as_u16();
    assert!(
        CLIENT_CODES.contains(&(e.code(), status)),
        "unexpected rejection {} {status}",
        e.code()
    );
}

/// What clients of ours send, before anything is stored: a chat frame, a REST API message body
/// with its Idempotency-Key, a signed generic webhook's event (after its signature).
///
/// Input: one flag byte, then the body. Bits 0-1: which parser (0 chat, 1 API, else webhook);
/// bit 2: a 16-character text limit instead of 4096. For the API, the body is split at its
/// first NUL: before it the Idempotency-Key, after it the JSON.
/// What identify reads in a chat message as a request to link a phone or as a code is a number
/// to normalise (no blanks) or exactly six ASCII digits.
fn assert_link_proof_reading(text: &str) {
    use switchboard_identify::proof::{Ask, CODE_DIGITS, parse};
    match parse(text) {
        Some(Ask::LinkPhone(number)) => {
            assert!(!number.is_empty() && !number.contains(char::is_whitespace));
        }
        Some(Ask::Code(code)) => {
            assert!(code.len() == CODE_DIGITS && code.bytes().all(|b| b.is_ascii_digit()));
        }
        None => {}
    }
}

pub fn client_input(data: &[u8]) {
    use switchboard_channels::{api, chat, generic};
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let max = if flags & 4 != 0 { 16 } else { 4096 };
    match flags & 3 {
        0 => {
            let Ok(frame) = std::str::from_utf8(body) else {
                return;
            };
            match chat::read_frame(frame, max, 2) {
                Ok(m) => {
                    assert_client_id(&m.id);
                    assert_clean_text(&m.text, max);
                    // Text may be blank only when files come with it.
                    assert!(!m.text.trim().is_empty() || !m.attachments.is_empty());
                    assert!(m.attachments.len() <= 2);
                    assert_link_proof_reading(&m.text);
                }
                Err(e) => assert_client_refusal(&e),
            }
        }
        1 => {
            let (key, json) = match body.iter().position(|&b| b == 0) {
                Some(at) => (std::str::from_utf8(&body[..at]).ok(), &body[at + 1..]),
                None => (None, body),
            };
            match api::read_message(json, key, max) {
                Ok(m) => {
                    assert_clean_text(&m.text, max);
                    assert!(!m.text.trim().is_empty());
                    if let Some(k) = &m.idempotency_key {
                        assert_client_id(k);
                    }
                }
                Err(e) => assert_client_refusal(&e),
            }
        }
        _ => {
            let source = switchboard_kit::config::WebhookSourceConfig {
                sender_field: "user.id".into(),
                ..Default::default()
            };
            let parsed =
                generic::webhook::parse_generic_event(body, Some("application/json"), &source, max);
            match parsed {
                Ok(event) => {
                    assert_client_id(&event.id);
                    assert_clean_text(&event.text, max);
                    assert!(!event.sender.is_empty() && event.sender == event.sender.trim());
                    assert!(!event.sender.chars().any(char::is_control));
                }
                Err(e) => assert_client_refusal(&e),
            }
        }
    }
}

fn inputs(fuzz_dir: &Path, target: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for kind in ["seeds", "corpus"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir.join(kind).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        out.extend(paths.iter().map(|p| std::fs::read(p).unwrap()));
    }
    out
}

/// xorshift64*: deterministic, so a failure replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A small libFuzzer-like mutation: flip or set bytes, insert a token or random bytes, delete a
/// run, or splice in part of another input.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    const TOKENS: &[&[u8]] = &[
        b"%",
        b"%zz",
        b"%FF",
        b"%00",
        b"%0D%0A",
        b"&",
        b"=",
        b"+",
        b"\xff",
        b"\0",
        b"\r\n",
        b"MessageSid=",
        b"From=",
        b"Body=",
        b"NumMedia=9",
        b"%2B1",
        b"%2B44",
        b"\x08",
        b"\x12",
        b"\x1a",
        b"\x80\x80\x80\x80\x80\x80",
    ];
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            3 if at < out.len() => {
                let end = (at + 1 + rng.below(8)).min(out.len());
                out.drain(at..end);
            }
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(32)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
            _ => {
                let n = rng.below(16);
                out.splice(at..at, (0..n).map(|_| rng.next() as u8));
            }
        }
    }
    out
}

/// Every target's check over its seeds and saved corpus under `fuzz_dir`, then over `rounds`
/// mutations of them. A failing input is written to the temporary directory before the panic
/// is passed on. Returns (target, inputs checked) per target.
pub fn replay(fuzz_dir: &Path, rounds: usize) -> Vec<(&'static str, usize)> {
    let mut done = Vec::new();
    for (name, check) in TARGETS {
        let seeds = inputs(fuzz_dir, name);
        assert!(
            !seeds.is_empty(),
            "no seeds for {name} under {}",
            fuzz_dir.display()
        );
        let mut rng = Rng(0x5eed_0000 ^ name.len() as u64);
        let mutations = (0..rounds).map(|_| {
            let a = &seeds[rng.below(seeds.len())];
            let b = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, a, b)
        });
        let all: Vec<Vec<u8>> = seeds.iter().cloned().chain(mutations).collect();
        for input in &all {
            if let Err(e) = std::panic::catch_unwind(|| check(input)) {
                let path = std::env::temp_dir().join(format!("sb-fuzz-{name}-failure"));
                std::fs::write(&path, input).unwrap();
                eprintln!("{name} failed on the input saved to {}", path.display());
                std::panic::resume_unwind(e);
            }
        }
        done.push((name, all.len()));
    }
    done
}

/// Whether the form's first `name` field starts with `prefix`.
fn field_starts_with(fields: &[(String, String)], name: &str, prefix: &str) -> bool {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .is_some_and(|(_, v)| v.starts_with(prefix))
}
