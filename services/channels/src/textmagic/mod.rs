//! TextMagic SMS: `POST /webhooks/textmagic/sms/<token>` in (TextMagic signs nothing: the
//! secret token in the URL is the credential), the v2 Messages API out.
pub mod send;
pub mod webhook;

use std::sync::Arc;

pub use send::{TextMagicSender, textmagic_number};
pub use webhook::{TextMagicSms, TextMagicWebhook, parse_textmagic_sms};

use crate::Adapter;

pub const ADAPTER: Adapter = Adapter {
    provider: "textmagic",
    webhook: Some(|config| Arc::new(TextMagicWebhook::new(config))),
    egress: Some(|config| Arc::new(TextMagicSender::new(config.textmagic.clone()))),
    media: None,
};
