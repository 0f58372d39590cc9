//! WhatsApp through Meta's Cloud API: the app's webhook in (`GET /webhooks/whatsapp` answers
//! the subscription handshake with the verify token; `POST` carries messages, several at once,
//! signed `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, body)>`), the Graph API's
//! `/{phone number id}/messages` out, media by id.
//!
//! A person is `whatsapp:<E.164>` (their WhatsApp id is their number): linked or proved to be
//! the same as their SMS number like any two contact points, never assumed.
//!
//! Settings: `[providers.whatsapp]` ([`WhatsAppSettings`]); the agent is `[channels.whatsapp]`'s.
pub mod media;
pub mod send;
pub mod webhook;

use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use switchboard_kit::config::{Config, Secret};

pub use media::WhatsAppMedia;
pub use send::WhatsAppSender;
pub use webhook::{WhatsAppWebhook, parse_notification};

use crate::Adapter;

/// The provider name messages and replies carry.
pub const PROVIDER: &str = "whatsapp";
/// The logical channel (`[channels.whatsapp]`, contact kind `whatsapp`).
pub const CHANNEL: &str = "whatsapp";
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// How a message names a media item it carries (`whatsapp-media:<media id>`): the Graph API
/// gives a short-lived download URL for the id when the turn runs ([`WhatsAppMedia`]).
pub const MEDIA_SCHEME: &str = "whatsapp-media:";

pub const ADAPTER: Adapter = Adapter {
    provider: PROVIDER,
    webhook: Some(|config| Arc::new(WhatsAppWebhook::new(config))),
    egress: Some(|config| Arc::new(WhatsAppSender::new(settings(config)))),
    media: Some(|config| Arc::new(WhatsAppMedia::new(settings(config)))),
};

/// `[providers.whatsapp]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct WhatsAppSettings {
    /// The system user's access token: sends and reads media.
    pub access_token: Secret,
    /// The app secret: every notification is signed with it.
    pub app_secret: Secret,
    /// What the webhook's subscription handshake must present (`hub.verify_token`), chosen by
    /// the operator when setting the callback URL.
    pub verify_token: Secret,
    /// The business phone number's id: replies go out from it unless the message names another.
    pub phone_number_id: String,
    /// The approved template sent in place of a reply when the 24-hour customer-service window
    /// is closed (the person last wrote more than 24 hours ago, or never): its body's one
    /// parameter is the reply's text. Empty: such a reply ends in `delivery.failed`, saying so.
    pub window_template: String,
    /// The template's language code.
    pub window_template_language: String,
    /// The Graph API version (`v21.0`).
    pub api_version: String,
    /// The Graph API's base (`https://graph.facebook.com`); tests and the demo name a fake.
    pub api_base: String,
}

impl Default for WhatsAppSettings {
    fn default() -> Self {
        Self {
            access_token: Secret::default(),
            app_secret: Secret::default(),
            verify_token: Secret::default(),
            phone_number_id: String::new(),
            window_template: String::new(),
            window_template_language: "en_US".into(),
            api_version: "v21.0".into(),
            api_base: String::new(),
        }
    }
}

pub(crate) fn settings(config: &Config) -> Result<WhatsAppSettings, String> {
    config
        .provider_settings::<WhatsAppSettings>(PROVIDER)
        .map_err(|e| e.to_string())
}

impl WhatsAppSettings {
    /// The Graph API's base, without a trailing `/`.
    pub fn base(&self) -> &str {
        crate::egress::api_base(&self.api_base, "https://graph.facebook.com")
    }

    /// `{base}/{version}/{path}`.
    pub(crate) fn graph_url(&self, path: &str) -> String {
        format!("{}/{}/{path}", self.base(), self.api_version)
    }
}

/// `sha256=<lowercase hex HMAC-SHA256(app secret, body)>`: Meta's payload signature.
pub fn sign(app_secret: &[u8], body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(mac(app_secret, body).finalize().into_bytes())
    )
}

/// Whether `signature` is Meta's signature of `body`, compared in constant time.
pub fn verify(app_secret: &[u8], body: &[u8], signature: &str) -> bool {
    let Some(given) = signature.trim().strip_prefix("sha256=") else {
        return false;
    };
    let Ok(given) = hex::decode(given) else {
        return false;
    };
    let expected = mac(app_secret, body).finalize().into_bytes();
    given.len() == expected.len() && bool::from(given.as_slice().ct_eq(expected.as_slice()))
}

fn mac(secret: &[u8], body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configuration_names_only_whatsapp_settings() {
        let read: WhatsAppSettings = crate::example_settings("whatsapp");
        assert!(!read.app_secret.is_empty() && !read.phone_number_id.is_empty());
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_body() {
        // Python: hmac.new(b"app-secret", b'{"a":1}', hashlib.sha256).hexdigest()
        let known = "sha256=a2ac6607a24977f9757e6d78319ae1660ad42ffeee0ee3f0dff30a92bcf85448";
        assert_eq!(sign(b"app-secret", br#"{"a":1}"#), known);
        assert!(verify(b"app-secret", br#"{"a":1}"#, known));
        assert!(!verify(b"app-secret", br#"{"a":2}"#, known));
        assert!(!verify(b"other", br#"{"a":1}"#, known));
        for malformed in ["", "sha256=", "sha1=a2ac", &known[7..]] {
            assert!(!verify(b"app-secret", br#"{"a":1}"#, malformed));
        }
    }
}
