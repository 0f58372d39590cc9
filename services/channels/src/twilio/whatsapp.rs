//! WhatsApp through a Twilio WhatsApp sender. Twilio posts the same signed form as for an SMS,
//! to the URL set on the sender (`POST /webhooks/twilio/whatsapp`), with `whatsapp:+<E.164>`
//! in `From` and `To`; replies go through the same Messages API with the same prefix, and the
//! same message list is asked before a part of unknown outcome is sent again.
//!
//! Its messages are channel `whatsapp` (its routing, limits and 24-hour window; the person is
//! `whatsapp:<E.164>`, one person with the same number on Meta's Cloud API) and provider
//! `twilio_whatsapp` (replies go back through Twilio).
//!
//! Settings: the account is `[twilio]`'s; the sender is `[providers.twilio_whatsapp]`
//! ([`TwilioWhatsAppSettings`]).
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use switchboard_kit::config::Config;

use super::TwilioMedia;
use super::send::{BodyMatch, MAX_BODY_CHARS, TwilioSender};
use super::webhook::{TwilioRoute, TwilioWebhook};
use crate::Adapter;
use crate::egress::{self, AttachmentStyle, Egress, OutboundPart, SendError};
use crate::whatsapp::send::{
    SESSION_WINDOW, WindowShape, template_parameter, window_open, window_shape,
};

/// The provider name messages and replies carry.
pub const PROVIDER: &str = "twilio_whatsapp";
/// How Twilio writes a WhatsApp address.
pub const ADDRESS_PREFIX: &str = "whatsapp:";

pub const ROUTE: TwilioRoute = TwilioRoute {
    route: "/webhooks/twilio/whatsapp",
    channel: crate::whatsapp::CHANNEL,
    provider: PROVIDER,
    address_prefix: ADDRESS_PREFIX,
};

pub const ADAPTER: Adapter = Adapter {
    provider: PROVIDER,
    webhook: Some(|config| Arc::new(TwilioWebhook::on(config, ROUTE))),
    egress: Some(|config| Arc::new(TwilioWhatsAppSender::new(config))),
    media: Some(|config| Arc::new(TwilioMedia::new(&config.twilio))),
};

/// Named in the reason a reply outside the window fails for without it.
const WINDOW_SETTING: &str = "providers.twilio_whatsapp.window_content_sid";

/// `[providers.twilio_whatsapp]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TwilioWhatsAppSettings {
    /// The WhatsApp sender's number (E.164, without `whatsapp:`): replies go from it. Empty:
    /// from the number the person wrote to.
    pub from_number: String,
    /// The approved Content template (`HX…`) sent in place of a reply when the 24-hour
    /// window is closed; its variable `{{1}}` is the reply's text. Empty: such a reply ends in
    /// `delivery.failed`, saying so.
    pub window_content_sid: String,
}

fn settings(config: &Config) -> Result<TwilioWhatsAppSettings, String> {
    config
        .provider_settings::<TwilioWhatsAppSettings>(PROVIDER)
        .map_err(|e| e.to_string())
}

/// Sends through the account's Messages API to `whatsapp:` addresses.
pub struct TwilioWhatsAppSender {
    twilio: TwilioSender,
    /// An unreadable section fails each send with its reason rather than the process.
    settings: Result<TwilioWhatsAppSettings, String>,
}

impl TwilioWhatsAppSender {
    pub fn new(config: &Config) -> Self {
        Self {
            twilio: TwilioSender::new(config.twilio.clone())
                .with_status_callback(&config.gateway.public_url, ROUTE.route),
            settings: settings(config),
        }
    }

    fn settings(&self) -> Result<&TwilioWhatsAppSettings, SendError> {
        self.settings
            .as_ref()
            .map_err(|e| SendError::Unavailable(e.clone()))
    }

    /// `whatsapp:<number>` of the configured sender, else of the number the person wrote to.
    fn from(&self, part: &OutboundPart<'_>) -> Result<String, SendError> {
        let settings = self.settings()?;
        let number = if settings.from_number.is_empty() {
            part.from()
        } else {
            &settings.from_number
        };
        if number.is_empty() {
            return Err(SendError::Unavailable(
                "providers.twilio_whatsapp.from_number is not set".into(),
            ));
        }
        Ok(address(number))
    }
}

/// `whatsapp:<number>`, however the number was written.
fn address(number: &str) -> String {
    format!(
        "{ADDRESS_PREFIX}{}",
        number.strip_prefix(ADDRESS_PREFIX).unwrap_or(number)
    )
}

impl Egress for TwilioWhatsAppSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, MAX_BODY_CHARS)
    }

    /// WhatsApp carries one file a message: each its own part, the link fetched by Twilio.
    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::PartEach
    }

    fn session_window(&self) -> Option<std::time::Duration> {
        Some(SESSION_WINDOW)
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            let settings = self.settings()?;
            let to = address(part.to());
            let from = self.from(&part)?;
            let mut form: Vec<(&str, &str)> = vec![("To", &to), ("From", &from)];
            let variables;
            match window_shape(
                &part,
                &settings.window_content_sid,
                WINDOW_SETTING,
                Utc::now(),
            )? {
                WindowShape::Free { file } => {
                    form.push(("Body", part.text));
                    form.extend(file.map(|f| ("MediaUrl", f.url.as_str())));
                }
                WindowShape::Template { name, parameter } => {
                    variables = serde_json::json!({ "1": parameter }).to_string();
                    form.push(("ContentSid", name));
                    form.push(("ContentVariables", &variables));
                }
            }
            self.twilio.create(&form).await
        }
        .boxed()
    }

    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        async move {
            let to = address(part.to());
            let from = self.from(&part)?;
            // The attempt judged the window between `since` and now: if it may have been
            // closed, the part may have gone as the template, whose listed body holds the text
            // (and so does the free body).
            let free =
                window_open(part.last_inbound, since) && window_open(part.last_inbound, Utc::now());
            let parameter = template_parameter(part.text);
            let body = if free || !part.attachments.is_empty() {
                BodyMatch::Is(part.text)
            } else {
                BodyMatch::Holds(&parameter)
            };
            self.twilio.find_listed(&to, Some(&from), body, since).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::exports::ExportLink;

    fn reply() -> switchboard_kit::proto::Reply {
        switchboard_kit::proto::Reply {
            recipient: "+14155550100".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_address_gets_one_prefix() {
        assert_eq!(address("+14155550100"), "whatsapp:+14155550100");
        assert_eq!(address("whatsapp:+14155550100"), "whatsapp:+14155550100");
    }

    fn shape<'a>(
        part: &OutboundPart<'a>,
        content_sid: &'a str,
        now: DateTime<Utc>,
    ) -> Result<WindowShape<'a>, SendError> {
        window_shape(part, content_sid, WINDOW_SETTING, now)
    }

    #[test]
    fn within_the_window_the_text_goes_free_and_after_it_as_the_template() {
        let reply = reply();
        let now = Utc::now();
        let fresh = OutboundPart::new(&reply, 0, "hello")
            .with_last_inbound(Some(now - chrono::Duration::hours(2)));
        let stale = OutboundPart::new(&reply, 0, "hello")
            .with_last_inbound(Some(now - chrono::Duration::hours(25)));
        assert!(matches!(
            shape(&fresh, "HXabc", now),
            Ok(WindowShape::Free { file: None })
        ));
        assert!(matches!(
            shape(&stale, "HXabc", now),
            Ok(WindowShape::Template { name: "HXabc", ref parameter }) if parameter == "hello"
        ));
        let never = OutboundPart::new(&reply, 0, "hello");
        assert!(matches!(
            shape(&never, "HXabc", now),
            Ok(WindowShape::Template { .. })
        ));
        assert!(matches!(
            shape(&stale, "", now),
            Err(SendError::Rejected(why)) if why.contains("window_content_sid")
        ));
    }

    #[test]
    fn a_file_goes_only_inside_the_window_and_one_a_part() {
        let reply = reply();
        let now = Utc::now();
        let link = |name: &str| ExportLink {
            name: name.into(),
            content_type: "text/plain".into(),
            size_bytes: 3,
            url: format!("https://example.test/{name}"),
            expires_at: now,
        };
        let one = [link("a.txt")];
        let part = OutboundPart::new(&reply, 1, "")
            .with_attachments(&one)
            .with_last_inbound(Some(now));
        assert!(matches!(
            shape(&part, "", now),
            Ok(WindowShape::Free { file: Some(f) }) if f.name == "a.txt"
        ));
        let closed = OutboundPart::new(&reply, 1, "")
            .with_attachments(&one)
            .with_last_inbound(Some(now - chrono::Duration::days(2)));
        assert!(matches!(
            shape(&closed, "HXabc", now),
            Err(SendError::Rejected(why)) if why.contains("file")
        ));
        let two = [link("a.txt"), link("b.txt")];
        let part = OutboundPart::new(&reply, 1, "")
            .with_attachments(&two)
            .with_last_inbound(Some(now));
        assert!(matches!(shape(&part, "", now), Err(SendError::Rejected(_))));
    }

    #[test]
    fn the_example_configuration_names_only_twilio_whatsapp_settings() {
        let _: TwilioWhatsAppSettings = crate::example_settings("twilio_whatsapp");
    }
}
