//! Twilio SMS and MMS: `POST /webhooks/twilio/sms` in (signed with `X-Twilio-Signature`),
//! the Messages API out, MMS media fetched from the Twilio API's origin. A WhatsApp sender on the
//! same account is an adapter of its own ([`whatsapp`]).
pub mod media;
pub mod send;
pub mod signature;
pub mod webhook;
pub mod whatsapp;

use std::sync::Arc;

pub use media::TwilioMedia;
pub use send::{MAX_BODY_CHARS, TwilioSender};
pub use signature::{twilio_signature, verify_twilio_signature};
pub use webhook::{
    MAX_SID_CHARS, ParsedSms, SMS_ROUTE, TwilioCheck, TwilioForm, TwilioRoute, TwilioWebhook,
    parse_twilio_form, parse_twilio_sms,
};

use crate::Adapter;

pub const ADAPTER: Adapter = Adapter {
    provider: "twilio",
    webhook: Some(|config| Arc::new(TwilioWebhook::new(config))),
    egress: Some(|config| {
        Arc::new(
            TwilioSender::new(config.twilio.clone())
                .with_status_callback(&config.gateway.public_url, SMS_ROUTE.route),
        )
    }),
    media: Some(|config| Arc::new(TwilioMedia::new(&config.twilio))),
};
